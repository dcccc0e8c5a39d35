"""numpyro_gmm._kernels.prng against jax.random (the independent reference): the same bits,
under jit and vmap, in the pass's float dtype; other keys are handed to jax.random."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_gmm._kernels import prng

from conftest import X64

FLOAT = jnp.float64 if X64 else jnp.float32
SEEDS = [0, 1, 12345, 2**31 + 7, 2**32 - 1]


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("seed", SEEDS)
def test_split_and_fold_in_are_jax_random_bit_for_bit(seed):
    key = jax.random.PRNGKey(seed)
    for num in (1, 2, 3, 7, 200):
        _same(prng.split(key, num), jax.random.split(key, num))
    _same(prng.split(key), jax.random.split(key))
    for data in (0, 1, 5, 2**31, 2**32 - 1):
        _same(prng.fold_in(key, data), jax.random.fold_in(key, data))


@pytest.mark.parametrize("shape", [(), (1,), (5,), (3, 4), (2, 3, 5), (0, 3)])
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_uniform_and_normal_are_jax_random_bit_for_bit(seed, shape):
    key = jax.random.PRNGKey(seed)
    _same(prng.uniform(key, shape, FLOAT), jax.random.uniform(key, shape, FLOAT))
    _same(prng.uniform(key, shape, FLOAT, -2.0, 2.0), jax.random.uniform(key, shape, FLOAT, -2.0, 2.0))
    _same(prng.normal(key, shape, FLOAT), jax.random.normal(key, shape, FLOAT))
    # the default dtype is JAX's default float, as in jax.random
    _same(prng.normal(key, shape), jax.random.normal(key, shape))


def test_same_bits_under_jit_and_vmap():
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(6))

    def draws(r):
        def one(key):
            a, b, c = r.split(key, 3)
            return r.normal(r.fold_in(a, 1), (4, 3), FLOAT), r.uniform(b, (5,), FLOAT, -2.0, 2.0), c
        return jax.jit(jax.vmap(one))(keys)

    for ours, theirs in zip(draws(prng), draws(jax.random)):
        _same(ours, theirs)


def test_normal_draws_are_standard_normal():
    # 200,000 draws: mean 0 and variance 1 within 5 standard errors, tails as N(0, 1)
    z = np.asarray(prng.normal(jax.random.PRNGKey(3), (200_000,), FLOAT), np.float64)
    assert abs(z.mean()) < 5 / np.sqrt(z.size)
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / z.size)
    assert abs(np.mean(np.abs(z) > 1.96) - 0.05) < 5 * np.sqrt(0.05 * 0.95 / z.size)


def test_other_keys_go_to_jax_random():
    typed = jax.random.key(4)
    _same(jax.random.key_data(prng.split(typed, 3)), jax.random.key_data(jax.random.split(typed, 3)))
    _same(prng.normal(typed, (3,), FLOAT), jax.random.normal(typed, (3,), FLOAT))
    rbg = jax.random.key(4, impl="rbg")
    _same(prng.uniform(rbg, (3,), FLOAT), jax.random.uniform(rbg, (3,), FLOAT))
