"""``numpyro_gmm._kernels.prng``: the unrolled threefry hash gives ``jax.random``'s numbers bit
for bit (the reference is ``jax.random`` itself), compiles without a loop, and hands keys it
does not reproduce to ``jax.random``; and ``GaussianMixture``'s sampler built on it draws
each component with its weight and, given the component, from that component (checked
against the weights and the components' closed-form moments)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import X64, ftype
from numpyro_gmm import GaussianMixture
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


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the conditional is used on the CPU only")
def test_a_draw_is_hashed_once_however_many_kernels_read_it():
    """A normal draw read by two fused kernels (two Adam-like updates of a ``(K, d, r)``
    product, as a low-rank factor's gradient): the hash is compiled once. Counted by its key
    schedule's parity constant 0x1BD11BDA in the compiled program; the draw without
    ``computed_once`` has one copy per kernel."""

    def updates(draw):
        def f(key, m, v, y):
            g = jnp.einsum("kd,kr->kdr", draw(key), y)
            return 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        return f

    args = (jax.random.key(0), jnp.zeros((4, 1000, 4)), jnp.zeros((4, 1000, 4)), jnp.ones((4, 4)))
    ours = updates(lambda k: prng.normal(k, (4, 1000), jnp.float32))
    plain = updates(lambda k: prng._normal(jax.random.key_data(k), (4, 1000), jnp.dtype(jnp.float32)))
    count = lambda f: jax.jit(f).lower(*args).compile().as_text().count("constant(466688986)")  # noqa: E731
    assert count(ours) == 1
    assert count(plain) >= 2  # the copies this avoids


def test_other_generators_are_handed_to_jax_random():
    key = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(np.asarray(prng.normal(key, (5,))), np.asarray(jax.random.normal(key, (5,))))
    np.testing.assert_array_equal(_data(prng.split(key, 3)), _data(jax.random.split(key, 3)))
    np.testing.assert_array_equal(_data(prng.fold_in(key, 2)), _data(jax.random.fold_in(key, 2)))


def _mixture(kind, probs, batch=()):
    dt = ftype()
    loc = np.array([[0.0, 0.0], [5.0, 1.0], [-4.0, 3.0]], dt)
    loc = np.broadcast_to(loc, batch + loc.shape)
    probs = np.broadcast_to(np.asarray(probs, dt), batch + (3,))
    if kind == "diag":
        scale = np.array([[1.0, 0.5], [0.3, 2.0], [1.0, 1.0]], dt)
        return GaussianMixture(loc, scale=np.broadcast_to(scale, batch + scale.shape), probs=probs)
    if kind == "full":
        tril = np.array([[[1.0, 0.0], [0.5, 0.5]], [[0.3, 0.0], [1.0, 2.0]], [[1.0, 0.0], [-0.8, 0.6]]], dt)
        return GaussianMixture(loc, scale_tril=np.broadcast_to(tril, batch + tril.shape), probs=probs)
    w = np.array([[[0.5], [0.4]], [[1.0], [-0.2]], [[0.0], [0.7]]], dt)
    D = np.array([[0.3, 0.2], [0.1, 0.5], [0.4, 0.4]], dt)
    return GaussianMixture(loc, cov_factor=np.broadcast_to(w, batch + w.shape),
                           cov_diag=np.broadcast_to(D, batch + D.shape), probs=probs)


@pytest.mark.parametrize("kind", ["diag", "full", "lowrank"])
def test_sampler_draws_each_component_from_itself_with_its_weight(kind):
    n = 60_000
    probs = [0.2, 0.5, 0.3]
    gm = _mixture(kind, probs, batch=(2,))
    x, (index,) = jax.jit(lambda g, k: g.sample_with_intermediates(k, (n,)))(gm, jax.random.key(4))
    assert x.shape == (n, 2, 2) and index.shape == (n, 2) and x.dtype == ftype()
    x, index = np.asarray(x, np.float64).reshape(2 * n, 2), np.asarray(index).reshape(2 * n)
    counts = np.bincount(index, minlength=3)
    # weights: each count within 5 binomial standard deviations
    p = np.asarray(probs)
    assert np.all(np.abs(counts - 2 * n * p) <= 5 * np.sqrt(2 * n * p * (1 - p))), counts
    # given the component: its closed-form mean and covariance (5 standard errors)
    covs = np.asarray(gm.component_covariance_matrix, np.float64)[0]
    for k in range(3):
        xk = x[index == k]
        m = len(xk)
        mean = np.asarray(gm.loc, np.float64)[0, k]
        sd = np.sqrt(np.diagonal(covs[k]))
        assert np.all(np.abs(xk.mean(0) - mean) <= 5 * sd / np.sqrt(m))
        emp = np.cov(xk.T)
        # var(s_ij) = (S_ii S_jj + S_ij^2) / m for Gaussian draws
        se = np.sqrt((np.outer(sd**2, sd**2) + covs[k] ** 2) / m)
        assert np.all(np.abs(emp - covs[k]) <= 5 * se), (k, emp, covs[k])


def test_sampler_never_draws_a_component_of_weight_zero():
    for probs in ([0.0, 0.5, 0.5], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.0, 1.0]):
        gm = _mixture("diag", probs)
        _, (index,) = gm.sample_with_intermediates(jax.random.key(1), (50_000,))
        counts = np.bincount(np.asarray(index), minlength=3)
        assert np.all(counts[np.asarray(probs) == 0] == 0), (probs, counts)
        assert np.all(counts[np.asarray(probs) > 0] > 0)


def test_sampler_is_differentiable_in_the_parameters():
    """The reparameterised draw: d x / d loc is the indicator of the chosen component."""
    gm = _mixture("full", [0.2, 0.5, 0.3])
    key = jax.random.key(2)

    def first_draw(loc):
        g = GaussianMixture(loc, scale_tril=gm.scale_tril, probs=gm.probs)
        return g.sample(key, (1,))[0, 0]

    _, (index,) = gm.sample_with_intermediates(key, (1,))
    grad = np.asarray(jax.grad(first_draw)(gm.loc))
    expected = np.zeros((3, 2))
    expected[int(index[0]), 0] = 1.0
    np.testing.assert_allclose(grad, expected, atol=1e-6)
