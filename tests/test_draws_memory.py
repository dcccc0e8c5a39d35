"""``GaussianMixture.sample`` and ``log_prob`` on many draws: bounded memory, and the chunked
programs give the draws and densities of the whole one.

Before, ``sample`` drew from every component and kept one (``K d`` floats per draw) and
``log_prob`` evaluated every component at every value (``2 K d``), all at once: ``10^5``
draws of ``K = 256`` low-rank components in ``d = 1000`` needed 103 GB and 205 GB of XLA's
buffers. References: XLA's own ``memory_analysis`` of the compiled programs; SciPy's
``multivariate_normal`` densities in float64; closed-form mixture moments in NumPy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from conftest import X64, ftype
from numpyro_gmm import GaussianMixture
from numpyro_gmm import distribution as distribution_module


def _mixture(kind, K, d, r=2, batch=(), seed=0, dtype=None):
    """A mixture of ``kind`` with random parameters (``validate_args=False``: the inputs are
    valid by construction), and its float64 ``(weights, means, covariances)``."""
    rng = np.random.default_rng(seed)
    f = dtype or ftype()
    loc = rng.normal(size=batch + (K, d)) * 2.0
    logits = rng.normal(size=batch + (K,))
    if kind == "diag":
        sd = rng.uniform(0.3, 1.2, size=batch + (K, d))
        covs = sd[..., :, None] ** 2 * np.eye(d)
        kwargs = dict(scale=jnp.asarray(sd, f))
    elif kind == "full":
        tril = np.tril(rng.normal(size=batch + (K, d, d)) * 0.4, -1) + rng.uniform(0.3, 1.2, size=batch + (K, d))[..., None] * np.eye(d)
        covs = tril @ np.swapaxes(tril, -1, -2)
        kwargs = dict(scale_tril=jnp.asarray(tril, f))
    else:
        w = rng.normal(size=batch + (K, d, r)) * 0.6
        diag = rng.uniform(0.1, 0.8, size=batch + (K, d))
        covs = w @ np.swapaxes(w, -1, -2) + diag[..., :, None] * np.eye(d)
        kwargs = dict(cov_factor=jnp.asarray(w, f), cov_diag=jnp.asarray(diag, f))
    gm = GaussianMixture(jnp.asarray(loc, f), logits=jnp.asarray(logits, f), validate_args=False, **kwargs)
    weights = np.exp(logits - logsumexp(logits, -1, keepdims=True))
    return gm, (weights, loc, covs)


# (kind, K, d, r): every way a draw is made (distribution._one_draw): gathered parameters
# (diagonal; full with K > d; low rank with K > r + 2) or every component's draw (full with
# K <= d; low rank with K <= r + 2)
DRAW_PATHS = [("diag", 3, 2, 0), ("full", 2, 3, 0), ("full", 5, 2, 0), ("lowrank", 3, 3, 2), ("lowrank", 6, 3, 1)]


@pytest.fixture
def four_rows_per_chunk(monkeypatch):
    """Fresh programs of ``sample`` and ``log_prob`` that process 4 rows of draws (values) at a
    time (``lax.map`` over chunks, then a remainder)."""
    monkeypatch.setattr(distribution_module, "_rows_per_chunk", lambda rows, floats, itemsize: min(rows, 4))
    sample = jax.jit(distribution_module._mixture_sample.__wrapped__, static_argnums=2)
    log_prob = jax.jit(distribution_module._mixture_log_prob.__wrapped__)
    return sample, log_prob


@pytest.mark.parametrize("kind, K, d, r", DRAW_PATHS)
def test_chunked_draws_and_densities_are_the_whole_programs(kind, K, d, r, four_rows_per_chunk):
    """With 4 rows per chunk (35 rows: 8 chunks and a remainder of 3), the same draws and
    component indices as one program, and log densities equal to SciPy's (float64, component
    by component) on values that broadcast against the batch."""
    sample, log_prob = four_rows_per_chunk
    gm, (weights, loc, covs) = _mixture(kind, K, d, r, batch=(3,))
    key = jax.random.PRNGKey(1)
    x, (index,) = sample(gm, key, (5, 7))
    x_whole, index_whole = gm.sample_with_intermediates(key, (5, 7))
    assert x.shape == (5, 7, 3, d) and index.shape == (5, 7, 3)
    np.testing.assert_array_equal(index, index_whole[0])
    np.testing.assert_allclose(x, x_whole, rtol=1e-6 if not X64 else 1e-14, atol=1e-6 if not X64 else 1e-14)
    values = np.asarray(x[:, :, :1], np.float64)  # (5, 7, 1, d): broadcast against the batch (3,)
    lp = log_prob(gm, jnp.asarray(values, ftype()))
    assert lp.shape == (5, 7, 3)
    expected = np.empty((5, 7, 3))
    for i, j, b in np.ndindex(5, 7, 3):
        comp = [stats.multivariate_normal(loc[b, k], covs[b, k]).logpdf(values[i, j, 0]) for k in range(K)]
        expected[i, j, b] = logsumexp(np.log(weights[b]) + np.array(comp))
    t = 2e-5 if not X64 else 1e-10
    np.testing.assert_allclose(lp, expected, rtol=t, atol=t)
    np.testing.assert_allclose(gm.log_prob(jnp.asarray(values, ftype())), lp, rtol=t, atol=t)


@pytest.mark.parametrize("kind, K, d, r", DRAW_PATHS)
def test_chunked_draws_have_the_mixture_moments(kind, K, d, r, four_rows_per_chunk):
    """20,000 draws per mixture (two mixtures), 4 rows at a time: the sample mean and
    covariance within 5 standard errors of the closed-form mixture moments (NumPy)."""
    sample, _ = four_rows_per_chunk
    gm, (weights, loc, covs) = _mixture(kind, K, d, r, batch=(2,), seed=3)
    n = 20_000
    x = np.asarray(sample(gm, jax.random.PRNGKey(4), (n,))[0], np.float64)  # (n, 2, d)
    mean = np.einsum("bk,bkd->bd", weights, loc)
    dev = loc - mean[:, None]
    cov = np.einsum("bk,bkij->bij", weights, covs) + np.einsum("bk,bki,bkj->bij", weights, dev, dev)
    assert np.all(np.abs(x.mean(0) - mean) < 5 * np.sqrt(np.diagonal(cov, axis1=-2, axis2=-1) / n))
    c = x - mean
    prod = c[..., :, None] * c[..., None, :]
    assert np.all(np.abs(prod.mean(0) - cov) < 5 * prod.std(0) / np.sqrt(n) + 1e-6)


# Sizes whose XLA buffers were 7.7-205 GB before (one program over all draws and components).
LARGE = [("diag", 256, 1000, 0), ("full", 64, 300, 0), ("lowrank", 256, 1000, 4)]


@pytest.mark.parametrize("kind, K, d, r", LARGE)
def test_many_draws_of_many_components_in_bounded_memory(kind, K, d, r):
    """``10^5`` draws: XLA's buffers of the compiled ``sample`` and ``log_prob`` (inputs and
    outputs excluded) within 3 GiB, against 103 / 205 GB (low rank), 7.7 / 15.4 GB (full)
    before; nothing is run."""
    gm = GaussianMixture(jnp.zeros((K, d)), logits=jnp.zeros(K), validate_args=False, **{
        "diag": lambda: dict(scale=jnp.ones((K, d))),
        "full": lambda: dict(scale_tril=jnp.broadcast_to(jnp.eye(d), (K, d, d))),
        "lowrank": lambda: dict(cov_factor=jnp.full((K, d, r), 0.1), cov_diag=jnp.ones((K, d))),
    }[kind]())
    n = 100_000
    sample = distribution_module._mixture_sample.lower(gm, jax.random.PRNGKey(0), (n,)).compile()
    values = jax.ShapeDtypeStruct((n, d), gm.loc.dtype)
    log_prob = distribution_module._mixture_log_prob.lower(gm, values).compile()
    limit = 3 << 30
    for program in (sample, log_prob):
        analysis = program.memory_analysis()
        if analysis is None:
            pytest.skip("this backend reports no memory analysis")
        assert analysis.temp_size_in_bytes < limit, (kind, analysis.temp_size_in_bytes / 2**30)


@pytest.mark.parametrize("kind", ["diag", "full", "lowrank"])
def test_no_draws_and_no_values(kind):
    """A sample shape or a set of values with no element: empty results of the right shapes
    (before, ``log_prob`` of ``(0, d)`` values raised ``ZeroDivisionError`` inside NumPyro's
    ``sum_rightmost``)."""
    gm, _ = _mixture(kind, 3, 2, 1, batch=(4,))
    assert gm.sample(jax.random.PRNGKey(0), (0,)).shape == (0, 4, 2)
    assert gm.sample(jax.random.PRNGKey(0), (3, 0)).shape == (3, 0, 4, 2)
    assert gm.log_prob(jnp.zeros((0, 4, 2), ftype())).shape == (0, 4)
    assert gm.log_prob(jnp.zeros((0, 1, 2), ftype())).shape == (0, 4)
    one, _ = _mixture(kind, 3, 2, 1)
    assert one.log_prob(jnp.zeros((0, 2), ftype())).shape == (0,)
    assert one.log_prob(jnp.zeros((5, 0, 2), ftype())).shape == (5, 0)
