"""``numpyro_gmm._kernels.prng``: the unrolled threefry hash gives ``jax.random``'s numbers bit
for bit (the reference is ``jax.random`` itself), compiles without a loop, and hands keys it
does not reproduce to ``jax.random``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import X64
from numpyro_gmm._kernels import prng

DTYPES = [np.float32] + ([np.float64] if X64 else [])
KEYS = {"typed": lambda s: jax.random.key(s), "raw": lambda s: jax.random.PRNGKey(s)}


def _data(keys):
    return np.asarray(jax.random.key_data(keys) if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) else keys)


@pytest.mark.parametrize("kind", sorted(KEYS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (16, 50), (3, 4, 5)])
def test_draws_equal_jax_random(kind, dtype, shape):
    key = KEYS[kind](11)
    pairs = [
        (jax.random.normal(key, shape, dtype), prng.normal(key, shape, dtype)),
        (jax.random.uniform(key, shape, dtype), prng.uniform(key, shape, dtype)),
        (jax.random.uniform(key, shape, dtype, -2.0, 3.5), prng.uniform(key, shape, dtype, -2.0, 3.5)),
        (jax.jit(lambda k: jax.random.normal(k, shape, dtype))(key), jax.jit(lambda k: prng.normal(k, shape, dtype))(key)),
    ]
    for ref, ours in pairs:
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(ref))


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_split_and_fold_in_equal_jax_random(kind):
    key = KEYS[kind](5)
    for n in (1, 2, 4, 33):
        ref, ours = jax.random.split(key, n), prng.split(key, n)
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        np.testing.assert_array_equal(_data(ours), _data(ref))
    for m in (0, 1, 7, 2**31 + 5):
        ref, ours = jax.random.fold_in(key, m), prng.fold_in(key, m)
        assert ours.dtype == ref.dtype
        np.testing.assert_array_equal(_data(ours), _data(ref))
    # under vmap over keys, as the autoguide's programs run
    keys = jax.random.split(key, 6)
    ref = jax.vmap(lambda k: jax.random.normal(jax.random.split(k, 3)[2], (4, 9)))(keys)
    ours = jax.vmap(lambda k: prng.normal(prng.split(k, 3)[2], (4, 9)))(keys)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(ref))


def test_the_hash_compiles_without_a_loop():
    """The point of the module: JAX's CPU lowering of the hash is a rolled ``while`` loop;
    this one is straight-line code."""
    key = jax.random.key(0)
    ours = jax.jit(lambda k: prng.normal(k, (16, 50))).lower(key).as_text()
    ref = jax.jit(lambda k: jax.random.normal(k, (16, 50))).lower(key).as_text()
    assert "while" not in ours
    if jax.default_backend() == "cpu":
        assert "while" in ref  # the rolled loop this module avoids


def test_other_generators_are_handed_to_jax_random():
    key = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(np.asarray(prng.normal(key, (5,))), np.asarray(jax.random.normal(key, (5,))))
    np.testing.assert_array_equal(_data(prng.split(key, 3)), _data(jax.random.split(key, 3)))
    np.testing.assert_array_equal(_data(prng.fold_in(key, 2)), _data(jax.random.fold_in(key, 2)))
