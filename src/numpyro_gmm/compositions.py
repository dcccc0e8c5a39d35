"""Weak compositions as data (NumPy, built once, cached).

A *weak composition* of ``n`` into ``K`` parts is a vector ``m`` of ``K`` non-negative
integers with ``sum(m) == n``; there are ``C(n + K - 1, K - 1)`` of them. The power
integrals ``integral p(x)^n dx`` of a ``K``-component mixture expand over exactly these
vectors (see :mod:`numpyro_gmm._kernels.power_integrals`).

Nothing here is traced. Every table is built with vectorised NumPy (one loop over the
parts, never one per composition), cached per argument tuple, and returned read-only so
that a cached table cannot be corrupted by a caller.

The engine never materialises all compositions of a large problem. It splits the ``K``
components into two halves ``A`` (the first ``ceil(K/2)``) and ``B`` (the rest): every
composition of ``n`` is exactly one pair ``(m_A, m_B)`` with ``|m_A| = s`` and
``|m_B| = n - s``. The half tables (all compositions of totals ``0..n_max`` into
``K/2`` parts) are small -- ``C(n_max + K/2, K/2)`` rows -- and the pairs are enumerated
on the device from a short list of *cells* ``(n, s)`` (:func:`pair_schedule`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

__all__ = [
    "num_compositions",
    "weak_compositions",
    "compositions_up_to",
    "PairSchedule",
    "pair_schedule",
    "unrank_table",
    "unrank_tables",
]

_INT32_MAX = np.iinfo(np.int32).max


def num_compositions(n: int, K: int) -> int:
    """Number of weak compositions of ``n`` into ``K`` parts, ``C(n + K - 1, K - 1)``."""
    if n < 0 or K < 0:
        return 0
    if K == 0:
        return 1 if n == 0 else 0
    return math.comb(n + K - 1, K - 1)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@lru_cache(maxsize=64)
def compositions_up_to(n_max: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """All weak compositions of every total ``0..n_max`` into ``K`` parts.

    Returns ``(table, offsets)``: ``table`` is an ``int8`` array of shape
    ``(C(n_max + K, K), K)`` whose rows are sorted by total and, within one total,
    lexicographically; rows of total ``s`` are ``table[offsets[s]:offsets[s + 1]]``.
    ``K == 0`` gives the single empty composition (of total 0).
    """
    if n_max < 0 or K < 0:
        raise ValueError(f"n_max and K must be >= 0, got n_max={n_max}, K={K}")
    if n_max > 127:
        raise ValueError(f"n_max={n_max} does not fit the int8 table (max 127)")
    rows = np.zeros((1, 0), dtype=np.int8)
    totals = np.zeros(1, dtype=np.int64)
    # Append one part at a time: a row of total t gets every value v in 0..n_max - t.
    # Parents stay in order and values ascend, so the rows stay lexicographically sorted.
    for _ in range(K):
        reps = n_max - totals + 1
        parent = np.repeat(np.arange(len(rows)), reps)
        start = np.cumsum(reps) - reps
        value = np.arange(len(parent)) - np.repeat(start, reps)
        rows = np.concatenate([rows[parent], value[:, None].astype(np.int8)], axis=1)
        totals = totals[parent] + value
    # A stable sort by total keeps the lexicographic order within each total.
    order = np.argsort(totals, kind="stable")
    rows, totals = rows[order], totals[order]
    offsets = np.searchsorted(totals, np.arange(n_max + 2)).astype(np.int64)
    return _readonly(np.ascontiguousarray(rows)), _readonly(offsets)


@lru_cache(maxsize=128)
def weak_compositions(n: int, K: int) -> np.ndarray:
    """All weak compositions of ``n`` into ``K`` parts, ``int8`` array ``(C(n+K-1, K-1), K)``.

    Rows are in lexicographic order. Cached per ``(n, K)``.
    """
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    # The compositions of n into K parts are those of totals <= n into K - 1 parts,
    # completed by the slack n - total as the last part.
    head, _ = compositions_up_to(n, K - 1)
    last = n - head.astype(np.int64).sum(axis=1)
    table = np.concatenate([head, last[:, None].astype(np.int8)], axis=1)
    order = np.lexsort([table[:, k] for k in range(K - 1, -1, -1)])
    return _readonly(np.ascontiguousarray(table[order]))


class PairSchedule(NamedTuple):
    """How the compositions of ``n = n_min..n_max`` into ``K`` parts are walked in tiles.

    ``K`` components are split into halves of ``K_a = ceil(K/2)`` and ``K_b = K - K_a``
    parts. A *cell* ``(n, s)`` holds the ``count_a[s] * count_b[n - s]`` compositions whose
    first half sums to ``s``: every row of total ``s`` of the first half table paired with
    every row of total ``n - s`` of the second. The evaluation is symmetric in the two
    halves, so each cell is described by its *short* side (the half with fewer rows) and its
    *long* side, as row ranges of the *joint* table (``half_a`` rows, then ``half_b`` rows).

    A cell is cut into dense *tiles* of ``tile_short x tile_long`` pairs (padded at its
    edges), tile ``(i, j)`` pairing short rows ``i tile_short ..`` with long rows
    ``j tile_long ..``; a tile lies in one cell and hence has one total ``n``. A block is
    ``tiles_per_block`` consecutive tiles (``block_size`` pair slots). A tile costs
    ``tile_short + tile_long`` row gathers for ``tile_short * tile_long`` pairs.

    All arrays are small (one entry per cell, at most ``(n_max + 1)^2 / 2`` of them). The
    half tables themselves are not built here (the engine unranks them on the device,
    :func:`unrank_table`); :attr:`half_a` and :attr:`half_b` build them in NumPy on demand.
    """

    K: int
    n_max: int
    K_a: int
    K_b: int
    rows_a: int  # C(n_max + K_a, K_a): rows of the first half table (totals 0..n_max)
    rows_b: int
    cell_n: np.ndarray  # (cells,) int32: the total n of each cell
    cell_s: np.ndarray  # (cells,) int32: the first half's total s of each cell
    cell_start_short: np.ndarray  # (cells,) int32: first joint-table row of the short side
    cell_start_long: np.ndarray  # (cells,) int32: first joint-table row of the long side
    cell_count_short: np.ndarray  # (cells,) int32: rows of the short side
    cell_count_long: np.ndarray  # (cells,) int32: rows of the long side
    cell_tiles_long: np.ndarray  # (cells,) int32: tiles along the long side
    cell_first_tile: np.ndarray  # (cells + 1,) int32: cumulative tile counts
    tile_short: int
    tile_long: int
    tiles_per_block: int
    block_size: int  # tiles_per_block * tile_short * tile_long pair slots
    num_tiles: int
    num_blocks: int
    num_compositions: int

    @property
    def half_a(self) -> np.ndarray:
        """``(rows_a, K_a)`` int8: compositions of totals ``0..n_max`` into ``K_a`` parts."""
        return compositions_up_to(self.n_max, self.K_a)[0]

    @property
    def half_b(self) -> np.ndarray:
        """``(rows_b, K_b)`` int8: compositions of totals ``0..n_max`` into ``K_b`` parts."""
        return compositions_up_to(self.n_max, self.K_b)[0]

    @property
    def joint(self) -> np.ndarray:
        """``(rows_a + rows_b, K)`` int8: ``half_a`` rows padded with ``K_b`` zero parts on the
        right, then ``half_b`` rows padded with ``K_a`` zeros on the left; a pair's
        composition is the sum of its two joint rows."""
        a, b = self.half_a, self.half_b
        return np.concatenate(
            [np.pad(a, ((0, 0), (0, self.K_b))), np.pad(b, ((0, 0), (self.K_a, 0)))]
        )


def _offsets(n_max: int, K: int) -> np.ndarray:
    """``offsets[s]``: first row of total ``s`` in ``compositions_up_to(n_max, K)`` (closed form)."""
    counts = [num_compositions(s, K) for s in range(n_max + 1)]
    return np.concatenate([[0], np.cumsum(np.array(counts, dtype=np.int64))])


@lru_cache(maxsize=64)
def unrank_tables(n_max: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Small tables from which any row of ``compositions_up_to(n_max, K)`` is computed.

    Returns ``(offsets, prefix)``: ``offsets`` ``(n_max + 2,)`` as in
    :func:`compositions_up_to`, and ``prefix`` ``(K, n_max + 1, n_max + 2)`` int64 with
    ``prefix[j, s, v]`` the number of compositions of ``s`` into ``K - j`` parts whose first
    part is ``< v`` (for ``v <= s``; larger ``v`` hold a sentinel above every rank). In
    lexicographic order, the first part of the composition of rank ``q`` among those of
    total ``s`` is the largest ``v`` with ``prefix[j, s, v] <= q``.
    """
    big = np.iinfo(np.int64).max // 4
    prefix = np.full((max(K, 0), n_max + 1, n_max + 2), big, dtype=np.int64)
    for j in range(K):
        parts = K - j
        for s in range(n_max + 1):
            counts = [num_compositions(s - u, parts - 1) for u in range(s + 1)]
            prefix[j, s, : s + 1] = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return _readonly(_offsets(n_max, K)), _readonly(prefix)


def unrank_table(n_max: int, K: int) -> np.ndarray:
    """``compositions_up_to(n_max, K)[0]`` rebuilt row by row from :func:`unrank_tables`.

    NumPy mirror of the engine's device unranking (used by the tests).
    """
    offsets, prefix = unrank_tables(n_max, K)
    rows = np.arange(offsets[-1])
    total = np.searchsorted(offsets[1:], rows, side="right")
    rank = rows - offsets[total]
    out = np.zeros((len(rows), K), dtype=np.int8)
    for j in range(K):
        table = prefix[j, total]  # (C, n_max + 2)
        v = np.sum(table <= rank[:, None], axis=1) - 1
        rank = rank - table[np.arange(len(rows)), v]
        total = total - v
        out[:, j] = v
    return out


# Candidate tile shapes and the cost model that picks one: a tile of S x L pairs costs its
# S * L pair slots (padding included) plus S + L row gathers, each measured at about 0.6
# of a pair's arithmetic on the CPU (d = 1, float32).
_TILE_SHORT = (1, 2, 4, 8, 16)
_TILE_LONG = tuple(2**k for k in range(13))
_GATHER_COST = 0.6


def _tile_cost(short: np.ndarray, long: np.ndarray, ts: int, tl: int) -> float:
    tiles = (-(-short // ts)) * (-(-long // tl))
    return float(np.sum(tiles * (ts * tl + _GATHER_COST * (ts + tl))))


@lru_cache(maxsize=64)
def pair_schedule(n_min: int, n_max: int, K: int, block_size: int) -> PairSchedule:
    """The cell list and tile layout for all compositions of ``n_min..n_max`` into ``K`` parts.

    The tile shape is the candidate (short side 1..16, long side 1..4096, powers of two, at
    most ``block_size`` pairs) of least modelled cost over the cells; a block holds as many
    tiles as fit in ``block_size`` pair slots, and no more than there are tiles, so small
    problems are not padded to a large block.

    Raises ``ValueError`` when the half tables hold more rows than an ``int32`` can index
    (about 2.1e9: a problem far too large to evaluate anyway).
    """
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if not 0 <= n_min <= n_max:
        raise ValueError(f"need 0 <= n_min <= n_max, got {n_min}, {n_max}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    K_a = (K + 1) // 2
    K_b = K - K_a
    # Sizes first (closed forms), so that an impossible request fails before allocating.
    rows_a, rows_b = num_compositions(n_max, K_a + 1), num_compositions(n_max, K_b + 1)
    if rows_a + rows_b + block_size > _INT32_MAX:
        total = sum(num_compositions(n, K) for n in range(n_min, n_max + 1))
        raise ValueError(
            f"K={K} with powers up to {n_max} has half tables of {rows_a + rows_b:.3g} rows "
            f"({total:.3g} compositions in all), more than int32 can index; lower the order"
        )
    off_a, off_b = _offsets(n_max, K_a), _offsets(n_max, K_b)
    cells = [(n, s) for n in range(n_min, n_max + 1) for s in range(n + 1) if off_b[n - s + 1] > off_b[n - s]]
    n_arr = np.array([c[0] for c in cells], dtype=np.int64)
    s_arr = np.array([c[1] for c in cells], dtype=np.int64)
    count_a, count_b = np.diff(off_a)[s_arr], np.diff(off_b)[n_arr - s_arr]
    start_a, start_b = off_a[s_arr], rows_a + off_b[n_arr - s_arr]
    a_short = count_a <= count_b
    short, long = np.where(a_short, count_a, count_b), np.where(a_short, count_b, count_a)
    shapes = [(ts, tl) for ts in _TILE_SHORT for tl in _TILE_LONG if ts <= tl and ts * tl <= block_size] or [(1, 1)]
    ts, tl = min(shapes, key=lambda st: (_tile_cost(short, long, *st), -st[0] * st[1]))
    tiles_long = -(-long // tl)
    first_tile = np.concatenate([[0], np.cumsum(-(-short // ts) * tiles_long)])
    num_tiles = int(first_tile[-1])
    per_block = max(1, min(block_size // (ts * tl), num_tiles))
    num_blocks = -(-num_tiles // per_block)
    if num_blocks * per_block > _INT32_MAX:
        raise ValueError(f"too many tiles ({num_tiles}) for int32; raise block_size")
    i32 = lambda a: _readonly(np.asarray(a, dtype=np.int32))  # noqa: E731
    return PairSchedule(
        K=K,
        n_max=n_max,
        K_a=K_a,
        K_b=K_b,
        rows_a=rows_a,
        rows_b=rows_b,
        cell_n=i32(n_arr),
        cell_s=i32(s_arr),
        cell_start_short=i32(np.where(a_short, start_a, start_b)),
        cell_start_long=i32(np.where(a_short, start_b, start_a)),
        cell_count_short=i32(short),
        cell_count_long=i32(long),
        cell_tiles_long=i32(tiles_long),
        cell_first_tile=i32(first_tile),
        tile_short=ts,
        tile_long=tl,
        tiles_per_block=per_block,
        block_size=per_block * ts * tl,
        num_tiles=num_tiles,
        num_blocks=num_blocks,
        num_compositions=int(np.sum(count_a * count_b)),
    )
