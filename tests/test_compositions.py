import math

import numpy as np
import pytest

from numpyro_gmm.compositions import compositions_up_to, num_compositions, pair_schedule, weak_compositions
from reference import compositions as itertools_compositions


@pytest.mark.parametrize("K", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 7])
def test_weak_compositions_match_itertools(n, K):
    table = weak_compositions(n, K)
    assert table.shape == (math.comb(n + K - 1, K - 1), K) == (num_compositions(n, K), K)
    expected = itertools_compositions(n, K)  # stars and bars, independent
    assert sorted(map(tuple, table.tolist())) == sorted(map(tuple, expected.tolist()))


def test_tables_are_cached_and_read_only():
    assert weak_compositions(4, 3) is weak_compositions(4, 3)
    with pytest.raises(ValueError):
        weak_compositions(4, 3)[0, 0] = 1


def test_compositions_up_to_offsets():
    table, offsets = compositions_up_to(6, 4)
    sums = table.astype(int).sum(1)
    for s in range(7):
        block = table[offsets[s] : offsets[s + 1]]
        assert (block.astype(int).sum(1) == s).all()
        assert len(block) == math.comb(s + 3, 3)
    assert (np.diff(sums) >= 0).all()


@pytest.mark.parametrize("K,n_max,block", [(1, 5, 4), (2, 4, 3), (3, 6, 8), (5, 5, 16), (7, 4, 1024), (16, 4, 4096)])
def test_pair_schedule_visits_every_composition_once(K, n_max, block):
    """Decode every tile as the kernel does and compare with the itertools enumeration."""
    s = pair_schedule(2, n_max, K, block)
    assert s.block_size <= block and s.tile_short * s.tile_long * s.tiles_per_block == s.block_size
    joint = s.joint.astype(int)
    seen = []
    for t in range(s.num_blocks * s.tiles_per_block):
        if t >= s.num_tiles:
            continue
        c = np.searchsorted(s.cell_first_tile[1:], t, side="right")
        i, j = divmod(t - s.cell_first_tile[c], s.cell_tiles_long[c])
        short = i * s.tile_short + np.arange(s.tile_short)
        long = j * s.tile_long + np.arange(s.tile_long)
        short = s.cell_start_short[c] + short[short < s.cell_count_short[c]]
        long = s.cell_start_long[c] + long[long < s.cell_count_long[c]]
        comps = (joint[short][:, None, :] + joint[long][None, :, :]).reshape(-1, K)
        assert (comps.sum(1) == s.cell_n[c]).all()
        seen.extend(map(tuple, comps.tolist()))
    expected = [tuple(m) for n in range(2, n_max + 1) for m in itertools_compositions(n, K).tolist()]
    assert sorted(seen) == sorted(expected)
    assert s.num_compositions == sum(math.comb(n + K - 1, K - 1) for n in range(2, n_max + 1))


def test_pair_schedule_refuses_int32_overflow():
    with pytest.raises(ValueError, match="int32"):
        pair_schedule(2, 40, 40, 4096)
