"""The initialisation's working memory: the estimate (``_kernels/memory.py``), the chunked
evaluations giving the same values as one ``vmap``, and the guide's initialisation staying
within its budget on a model whose log density is large (XLA's own buffer assignment)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import X64, regression_data, subsampled_regression

import numpyro_gmm.autoguide as autoguide_module
from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO
from numpyro_gmm._kernels.init_fits import (
    curvature_cov_factors,
    fit_diagonal_gaussians,
    hessian_preconditioner,
    laplace_scale_tril,
    newton_refine,
)
from numpyro_gmm._kernels.memory import UNBOUNDED, MemoryBudget, map_batched, peak_bytes


def test_peak_bytes_counts_what_is_alive_at_once():
    """By hand, for x of 1000 float32 (4000 bytes): sin(x) and cos(x) alive when their
    product is made (3 x 4000), then only the product and the sum: peak 12000 bytes. Inside a
    jit (a sub-program) the call adds its 4-byte result: 12004. The input is not counted."""
    x = jnp.ones(1000, jnp.float32)

    def f(x):
        return jnp.sum(jnp.sin(x) * jnp.cos(x))

    assert peak_bytes(jax.make_jaxpr(f)(x)) == 12000
    assert peak_bytes(jax.make_jaxpr(jax.jit(f))(x)) == 12004
    # a value used by a later equation stays alive across the ones between
    def g(x):
        a = jnp.sin(x)
        b = jnp.sum(jnp.cos(x))  # cos (4000) and its sum while a (4000) is alive
        return jnp.sum(a * b)  # a, the product (4000)

    assert peak_bytes(jax.make_jaxpr(g)(x)) == 8004


def test_peak_bytes_with_random_keys():
    """Values of JAX's key dtypes (a subsampling plate draws its indices with one) count by
    their itemsize; before, NumPy could not interpret ``key<fry>`` and the guide's
    initialisation raised ``TypeError`` on any model with a subsampling plate."""

    def f(x):
        key = jax.random.fold_in(jax.random.key(0), 3)
        return jnp.sum(x * jax.random.normal(key, x.shape, x.dtype))

    x = jnp.ones(1000, jnp.float32)
    assert peak_bytes(jax.make_jaxpr(f)(x)) >= 8000  # the draws and the product, 4000 bytes each


@pytest.mark.slow  # 7-10 CPU-s of compilation (CI's slow tier runs it)
def test_initialisation_with_a_subsampling_plate():
    """The default initialisation on a model with a subsampling plate (its potential draws
    the subsample with a PRNG key): it runs, and the components start near the least-squares
    solution (NumPy; 50 of 400 rows per evaluation, so within a few standard errors)."""
    X, y = regression_data()
    guide = AutoGaussianMixture(subsampled_regression, num_components=2, num_init_fits=8, init_fit_steps=50)
    svi = numpyro.infer.SVI(subsampled_regression, guide, numpyro.optim.Adam(0.01), TraceEntropy_ELBO())
    state = svi.init(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y), 50)
    locs = np.asarray(guide.get_posterior(svi.get_params(state)).loc)
    least_squares = np.linalg.lstsq(X, y, rcond=None)[0]
    assert np.all(np.abs(locs - least_squares) < 0.5), (locs, least_squares)


def test_memory_budget_batch_is_clipped_to_one_and_all():
    budget = MemoryBudget(evaluation=10, limit=100)
    assert budget.batch(2, 7) == 5  # 100 // 20
    assert budget.batch(50, 7) == 1  # one item over the limit: still one at a time
    assert MemoryBudget(evaluation=1, limit=10**9).batch(2, 7) == 7
    assert UNBOUNDED.batch(10**6, 7) == 7  # no estimate: every item at once


@pytest.mark.parametrize("batch_size", [1, 3, 7, 9])
def test_map_batched_equals_vmap(batch_size):
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(7, 4)))
    b = (jnp.asarray(rng.normal(size=(7,))), jnp.asarray(rng.normal(size=(7, 2, 4))))

    def fn(x, pair):
        return jnp.sin(x) * pair[0] + pair[1].sum(0), jnp.sum(x**2)

    expected = jax.vmap(fn)(a, b)
    got = map_batched(fn, batch_size, a, b)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-6)
    # fewer than all items at once: a loop over the chunks, no loop otherwise
    looped = "scan" in str(jax.make_jaxpr(lambda a, b: map_batched(fn, batch_size, a, b))(a, b))
    assert looped == (batch_size < 7)


def potential(z):
    """Rosenbrock in (z0, z1) plus a double well in z2: non-convex, with a saddle."""
    return (1 - z[0]) ** 2 + 10.0 * (z[1] - z[0] ** 2) ** 2 + (z[2] ** 2 - 1.0) ** 2


@pytest.mark.slow  # 7-10 CPU-s of compilation (CI's slow tier runs it)
def test_kernels_in_chunks_give_the_values_of_one_vmap():
    """A budget of one item at a time (one fit, one Hessian column, one scoring point) gives
    the fits, the Newton refinement and the Laplace factors of the unchunked kernels (the same
    per-item computations in another order of evaluation)."""
    rng = np.random.default_rng(1)
    starts = jnp.asarray(rng.uniform(-2, 2, size=(6, 3)))
    tight = MemoryBudget(evaluation=1, limit=1)
    rtol = 1e-9 if X64 else 2e-4

    def fits(budget):
        return fit_diagonal_gaussians(potential, starts, jnp.zeros(()), jax.random.PRNGKey(0), num_steps=20,
                                      learning_rate=0.05, num_particles=2, budget=budget)

    def refine(budget, locs, scales):
        return newton_refine(potential, locs, scales, num_steps=4, num_draws=16, budget=budget)

    free, chunked = fits(UNBOUNDED), fits(tight)
    for e, g in zip(free, chunked):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=rtol, atol=rtol)
    locs, scales = free[0], free[1]
    free, chunked = refine(UNBOUNDED, locs, scales), refine(tight, locs, scales)
    for e, g in zip(free, chunked):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=rtol, atol=rtol)
    # the Laplace factors at the refined means (NaN where not PD: compared as such)
    locs, scales = free[0], free[1]
    free = laplace_scale_tril(potential, locs, scales)
    chunked = laplace_scale_tril(potential, locs, scales, tight)
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(free), rtol=rtol, atol=rtol)
    # the low-rank factors from conjugate-gradient products (one solve, one component at a time)

    def factors(budget):
        preconditioner = hessian_preconditioner(potential, locs[0], scales[0], budget=budget)
        return curvature_cov_factors(potential, locs, scales, 2, jnp.ones(6, bool), jnp.zeros((6, 3, 2)),
                                     preconditioner, budget=budget)

    np.testing.assert_allclose(np.asarray(jax.jit(lambda: factors(tight))()),
                               np.asarray(jax.jit(lambda: factors(UNBOUNDED))()), rtol=rtol, atol=rtol)


def logistic_model(X, y):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    numpyro.sample("y", dist.Bernoulli(logits=X @ b), obs=y)


@pytest.mark.slow
def test_initialisation_within_its_memory_budget(monkeypatch):
    """Logistic regression on 20,000 rows (d = 20): XLA's buffers for the initialisation
    program (its own buffer assignment, ``memory_analysis`` of the compiled program; nothing
    is run) stay within a 4 MB budget; without the chunks they are over 100 MB (the 32
    refinements' Hessians, the fits' particles and the scores' points all at once)."""
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(20_000, 20)))
    y = jnp.asarray(rng.random(20_000) < 0.5, X.dtype)

    def temp_bytes(limit):
        monkeypatch.setattr(autoguide_module, "INIT_MEMORY_BYTES", limit)
        guide = AutoGaussianMixture(logistic_model, num_components=2)
        with numpyro.handlers.seed(rng_seed=0):
            guide(X, y)
        compiled = jax.jit(guide.initial_components).lower(jax.random.PRNGKey(0)).compile()
        analysis = compiled.memory_analysis()
        if analysis is None:
            pytest.skip("this backend gives no memory analysis")
        return analysis.temp_size_in_bytes

    limit = 4 << 20
    assert temp_bytes(limit) <= limit
    assert temp_bytes(1 << 40) > 100 << 20


@pytest.mark.slow  # 7-10 CPU-s of compilation (CI's slow tier runs it)
def test_initialisation_runs_without_the_bound_where_the_estimate_fails(monkeypatch):
    """A jaxpr the estimate cannot walk (simulated) costs the bound, not the fit: a
    ``RuntimeWarning`` naming the failure, and the initial components of the unbounded
    kernels (the same as with the estimate, for this cheap model)."""

    def model():
        numpyro.sample("a", dist.Normal(0.0, 1.0).expand([2]).to_event(1))

    options = dict(num_components=2, num_init_fits=8, init_fit_steps=20)

    def initial(guide):
        with numpyro.handlers.seed(rng_seed=0):
            guide()
        return guide.initial_components(jax.random.PRNGKey(0))

    expected = initial(AutoGaussianMixture(model, **options))

    def broken(jaxpr):
        raise TypeError("unknown construct")

    monkeypatch.setattr(autoguide_module, "peak_bytes", broken)
    with pytest.warns(RuntimeWarning, match="memory estimate failed.*unknown construct"):
        got = initial(AutoGaussianMixture(model, **options))
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
