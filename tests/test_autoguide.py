"""Tests of AutoGaussianMixture.

References are independent of numpyro_gmm: SciPy root finding on the mixture CDF built from
``scipy.stats.norm``, NumPy moments, and hand-applied constraining transforms (``exp``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.infer import SVI, Predictive
from numpyro.infer.initialization import init_to_value
from scipy import optimize, stats

from conftest import X64, guide_locs, guide_params
from numpyro_gmm import AutoGaussianMixture, GaussianMixture, TraceEntropy_ELBO


def fdtype():
    return np.float64 if X64 else np.float32


def model():
    """Latent vector: a (2,) real, then log(s) (s positive); alphabetical ravel order."""
    numpyro.sample("a", dist.Normal(jnp.array([0.5, -1.0]), 1.0).to_event(1))
    numpyro.sample("s", dist.LogNormal(0.3, 0.5))


def make_guide(**kwargs):
    init = init_to_value(values={"a": jnp.array([0.5, -1.0]), "s": jnp.exp(0.3)})
    guide = AutoGaussianMixture(model, init_loc_fn=init, **kwargs)
    with handlers.seed(rng_seed=0):
        guide()
    return guide


def init_params(guide):
    with handlers.seed(rng_seed=0), handlers.trace() as tr:
        guide()
    return {name: site["value"] for name, site in tr.items() if site["type"] == "param"}


def fixed_params(covariance):
    """Parameters of a 3-component mixture over (a0, a1, log s)."""
    dt = fdtype()
    locs = np.array([[-1.0, 0.5, 0.2], [1.5, -0.5, -0.3], [0.0, 2.0, 1.0]])
    scales = np.array([[0.5, 0.3, 0.4], [0.2, 0.8, 0.3], [1.0, 0.4, 0.6]])
    params = guide_params(jnp.asarray(locs, dt), auto_logits=jnp.asarray([0.2, 0.9, -0.5], dt))
    if covariance == "diag":
        params["auto_scale"] = jnp.asarray(scales, dt)
    else:
        tril = np.zeros((3, 3, 3))
        for k in range(3):
            tril[k] = np.diag(scales[k])
            tril[k, 2, 0] = 0.3 * (k + 1) * scales[k, 2]  # correlations; row norms change
            tril[k, 1, 0] = -0.2 * scales[k, 1]
        params["auto_scale_tril"] = jnp.asarray(tril, dt)
    return params, locs, scales


def marginal_sd(params, covariance):
    if covariance == "diag":
        return np.asarray(params["auto_scale"], np.float64)
    tril = np.asarray(params["auto_scale_tril"], np.float64)
    return np.sqrt(np.einsum("kij,kij->ki", tril, tril))


@pytest.mark.parametrize("covariance", ["full", "diag"])
@pytest.mark.parametrize("K", [1, 3])
def test_initial_parameters(covariance, K):
    guide = make_guide(num_components=K, covariance=covariance, init_scale=0.2, init_method="spread")
    params = init_params(guide)
    factor = "auto_scale_tril" if covariance == "full" else "auto_scale"
    assert set(params) == {"auto_logits", "auto_locs_origin", "auto_locs_unit", "auto_locs_gauge", "auto_locs_offset",
                           factor}
    # "spread": unit steps and a zero offset, the origin the initial means; the gauge ones
    np.testing.assert_array_equal(params["auto_locs_unit"], np.ones((K, 3)))
    np.testing.assert_array_equal(params["auto_locs_gauge"], np.ones((K, 3)))
    np.testing.assert_array_equal(params["auto_locs_offset"], np.zeros((K, 3)))
    assert guide.latent_dim == 3
    np.testing.assert_array_equal(params["auto_logits"], np.zeros(K))
    locs = guide_locs(params)
    assert locs.shape == (K, 3)
    # init_to_value: a = (0.5, -1), s = exp(0.3) -> unconstrained log s = 0.3
    init = np.array([0.5, -1.0, 0.3])
    np.testing.assert_allclose(locs.mean(0), init, atol=1e-5)  # offsets are centred
    if K == 1:
        np.testing.assert_allclose(locs[0], init, atol=1e-6)
    else:
        # root-mean-square distance init_spread = 3 * init_scale = 0.6 from the initial location
        rms = np.sqrt(np.mean(np.sum((locs - init) ** 2, axis=-1)))
        np.testing.assert_allclose(rms, 0.6, rtol=1e-5)
        dist_kl = np.linalg.norm(locs[:, None] - locs[None], axis=-1)[np.triu_indices(K, 1)]
        assert np.all(dist_kl > 2 * 0.2)  # components do not coincide
    if covariance == "full":
        np.testing.assert_allclose(params[factor], np.broadcast_to(0.2 * np.eye(3), (K, 3, 3)), rtol=1e-5)
    else:
        np.testing.assert_allclose(params[factor], np.full((K, 3), 0.2), rtol=1e-5)
    post = guide.get_posterior(params)
    assert isinstance(post, GaussianMixture)
    assert post.event_shape == (3,) and post.batch_shape == () and post.num_components == K
    assert post.is_diagonal == (covariance == "diag")


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_median_is_mean_of_heaviest_component(covariance):
    guide = make_guide(num_components=3, covariance=covariance)
    params, locs, _ = fixed_params(covariance)
    med = guide.median(params)
    k = 1  # largest logit
    np.testing.assert_allclose(med["a"], locs[k, :2], rtol=1e-6)
    np.testing.assert_allclose(med["s"], np.exp(locs[k, 2]), rtol=1e-5)


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_quantiles_match_scipy_root_of_mixture_cdf(covariance):
    guide = make_guide(num_components=3, covariance=covariance)
    params, locs, _ = fixed_params(covariance)
    sd = marginal_sd(params, covariance)
    logits = np.asarray(params["auto_logits"], np.float64)
    w = np.exp(logits) / np.exp(logits).sum()
    levels = [0.025, 0.3, 0.5, 0.9]
    q = guide.quantiles(params, levels)
    assert q["a"].shape == (4, 2) and q["s"].shape == (4,)
    expected = np.empty((4, 3))
    for j in range(3):
        for i, level in enumerate(levels):
            cdf = lambda x: np.sum(w * stats.norm.cdf(x, locs[:, j], sd[:, j])) - level  # noqa: E731
            expected[i, j] = optimize.brentq(cdf, -20, 20, xtol=1e-12)
    tol = 1e-9 if X64 else 2e-5
    np.testing.assert_allclose(q["a"], expected[:, :2], atol=tol * 10)
    np.testing.assert_allclose(q["s"], np.exp(expected[:, 2]), rtol=tol * 10)


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_sample_posterior_moments_and_support(covariance):
    guide = make_guide(num_components=3, covariance=covariance)
    params, locs, _ = fixed_params(covariance)
    n = 4000
    samples = guide.sample_posterior(jax.random.PRNGKey(0), params, sample_shape=(n,))
    assert samples["a"].shape == (n, 2) and samples["s"].shape == (n,)
    assert np.all(np.asarray(samples["s"]) > 0)
    unconstrained = np.column_stack([np.asarray(samples["a"], np.float64), np.log(np.asarray(samples["s"], np.float64))])
    logits = np.asarray(params["auto_logits"], np.float64)
    w = np.exp(logits) / np.exp(logits).sum()
    sd = marginal_sd(params, covariance)
    mean = w @ locs
    var = w @ (sd**2 + locs**2) - mean**2  # law of total variance, per coordinate
    np.testing.assert_array_less(np.abs(unconstrained.mean(0) - mean), 4 * np.sqrt(var / n))


def test_entropy_options_from_guide_and_elbo():
    # The guide's entropy_order reaches the mixture, and TraceEntropy_ELBO's
    # entropy_options override it: with the same key, the loss changes by exactly the
    # difference of the two entropy estimates.
    def data_model(y):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y)

    y = jnp.asarray(0.3, fdtype())
    guides = {}
    for order in (4, 8):
        g = AutoGaussianMixture(
            data_model, num_components=2, covariance="diag", entropy_method="legendre", entropy_order=order
        )
        with handlers.seed(rng_seed=0):
            g(y)
        guides[order] = g
    params = guide_params(
        jnp.asarray([[-0.6], [0.7]], fdtype()),
        auto_logits=jnp.asarray([0.1, -0.4], fdtype()),
        auto_scale=jnp.asarray([[0.5], [0.8]], fdtype()),
    )
    assert guides[4].get_posterior(params).entropy_order == 4
    key = jax.random.PRNGKey(0)

    @jax.jit
    def losses(params):
        l4 = TraceEntropy_ELBO().loss(key, params, data_model, guides[4], y)
        l8 = TraceEntropy_ELBO().loss(key, params, data_model, guides[8], y)
        l8_as_4 = TraceEntropy_ELBO(entropy_options={"order": 4}).loss(key, params, data_model, guides[8], y)
        post = guides[8].get_posterior(params)
        return l4, l8, l8_as_4, post.entropy(order=4), post.entropy(order=8)

    l4, l8, l8_as_4, h4, h8 = losses(params)
    np.testing.assert_allclose(l8_as_4, l4, rtol=1e-6)
    np.testing.assert_allclose(l4 - l8, h8 - h4, atol=1e-5)
    assert abs(float(h8 - h4)) > 1e-4  # the two orders differ, so the check can fail


@pytest.mark.float32_pass
def test_get_base_dist_and_transform_raise():
    guide = make_guide(num_components=2)
    with pytest.raises(NotImplementedError, match="get_posterior"):
        guide.get_base_dist()
    with pytest.raises(NotImplementedError, match="get_posterior"):
        guide.get_transform(init_params(guide))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_components": 0}, "num_components"),
        ({"num_components": 1.5}, "num_components"),
        ({"covariance": "banded"}, "covariance"),
        ({"init_scale": 0.0}, "init_scale"),
        ({"init_spread": -1.0}, "init_spread"),
        ({"entropy_order": 0}, "entropy_order"),
        ({"entropy_method": 3}, "entropy_method"),
        ({"tril_step_scale": 0.0}, "tril_step_scale"),
        ({"tril_step_scale": -1.0}, "tril_step_scale"),
        ({"cov_factor_step_scale": 0.0}, "cov_factor_step_scale"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AutoGaussianMixture(model, **kwargs)


def test_full_covariance_beyond_its_memory_limit_raises_before_allocating(monkeypatch):
    # The estimate FULL_MEMORY_FACTOR * K d^2 floats against FULL_COVARIANCE_MAX_BYTES: with
    # the limit set to exactly the estimate at K = 2, d = 100, that size sets up and d = 101
    # raises, naming the sizes and the alternatives; the low-rank guide at d = 101 sets up.
    import numpyro_gmm.autoguide as ag

    itemsize = np.dtype(fdtype()).itemsize
    monkeypatch.setattr(ag, "FULL_COVARIANCE_MAX_BYTES", ag.FULL_MEMORY_FACTOR * 2 * 100**2 * itemsize)

    def setup(d, **kwargs):
        def wide():
            numpyro.sample("z", dist.Normal(0.0, 1.0).expand([d]).to_event(1))

        guide = AutoGaussianMixture(wide, num_components=2, init_method="spread", **kwargs)
        with handlers.seed(rng_seed=0):
            guide._setup_prototype()
        return guide

    assert setup(100).latent_dim == 100
    with pytest.raises(ValueError, match=r"num_components=2 at latent_dim=101.*K d\^2 = 2.04e\+04.*covariance='lowrank'"):
        setup(101)
    assert setup(101, covariance="lowrank", rank=2).latent_dim == 101


def test_full_covariance_at_twenty_thousand_dimensions_raises_at_svi_init():
    # The default covariance at d = 20,000 (K = 4: 1.6e9 factor entries, about 60 GiB in
    # float32) refuses at SVI.init instead of allocating the Hessians and factors.
    def wide():
        numpyro.sample("z", dist.Normal(0.0, 1.0).expand([20_000]).to_event(1))

    svi = SVI(wide, AutoGaussianMixture(wide, num_components=4), numpyro.optim.Adam(0.01), TraceEntropy_ELBO())
    with pytest.raises(ValueError, match="FULL_COVARIANCE_MAX_BYTES"):
        svi.init(jax.random.PRNGKey(0))


@pytest.mark.float32_pass
def test_bad_quantiles_raise():
    guide = make_guide(num_components=2)
    with pytest.raises(ValueError, match="quantiles"):
        guide.quantiles(init_params(guide), [[0.1, 0.5]])


def test_step_scaled_cholesky_transform_round_trip_support_and_jacobian():
    """The ``scale_tril`` parameter's transform (``tril_step_scale``) of a real matrix ``U``:
    NumPyro's ``ScaledUnitLowerCholeskyTransform`` of the packed vector ``(scale *
    U_offdiag, diag(U))`` (applied by hand). The upper triangle of ``U`` is not read (no
    gradient reaches it) and the inverse leaves zeros there; the log-Jacobian against
    ``jax.jacobian`` of the map between the lower triangles' entries."""
    from numpyro.distributions.transforms import ScaledUnitLowerCholeskyTransform, biject_to

    from numpyro_gmm.autoguide import _StepScaledUnitLowerCholesky

    n, scale = 3, 0.25
    constraint = _StepScaledUnitLowerCholesky(scale)
    t = biject_to(constraint)
    rng = np.random.default_rng(0)
    u = jnp.asarray(np.tril(rng.standard_normal((n, n))), fdtype())
    y = t(u)
    off, rows, cols = np.tril_indices(n, -1), *np.tril_indices(n)
    packed = jnp.concatenate([scale * u[off], jnp.diagonal(u)])  # NumPyro's order: strict lower, then diagonal
    np.testing.assert_allclose(y, ScaledUnitLowerCholeskyTransform()(packed), rtol=1e-6)
    assert bool(constraint(y)) and bool(constraints.scaled_unit_lower_cholesky(y))
    np.testing.assert_allclose(t.inv(y), u, rtol=1e-5, atol=1e-6)
    garbage = jnp.asarray(np.triu(rng.standard_normal((n, n)), 1), fdtype())
    np.testing.assert_array_equal(t(u + garbage), y)
    grad = jax.grad(lambda v: jnp.sum(jnp.sin(t(v))))(u + garbage)
    assert np.all(np.asarray(grad)[np.triu_indices(n, 1)] == 0.0)
    jac = jax.jacobian(lambda v: t(jnp.zeros((n, n), v.dtype).at[rows, cols].set(v))[rows, cols])(u[rows, cols])
    np.testing.assert_allclose(t.log_abs_det_jacobian(u, y), np.linalg.slogdet(np.asarray(jac, np.float64))[1],
                               rtol=1e-5)
    assert t.codomain == constraint and biject_to(_StepScaledUnitLowerCholesky(0.5)) != t


def _gaussian_kl(mu, tril, mean, cov):
    """KL(N(mu, tril tril^T) || N(mean, cov)) in closed form (NumPy, float64)."""
    mu, tril = np.asarray(mu, np.float64), np.asarray(tril, np.float64)
    s, prec, dm = tril @ tril.T, np.linalg.inv(cov), mu - mean
    return 0.5 * (np.trace(prec @ s) + dm @ prec @ dm - len(mean) + np.linalg.slogdet(cov)[1] - np.linalg.slogdet(s)[1])


@pytest.mark.slow
def test_full_covariance_stays_near_an_exact_start_under_adam():
    """A correlated 30-D Gaussian target: the default initialisation starts the one full
    component at the exact posterior (the Laplace covariance; KL ~ 0), and 300 steps of
    ``Adam(0.02)`` must keep it there, KL(q || p) < 2 nats (closed form, NumPy). Adam moves
    every entry of the Cholesky factor about ``lr`` per step whatever its gradient's size,
    and near the optimum the one-particle gradient of the off-diagonal block is noise of
    rank one (``eps eps^T``): unscaled (``tril_step_scale=1``, the previous parameterisation)
    the 435 off-diagonal entries drifted to KL 4.3 (at d = 3000 the factor's inverse reached
    1e20 in three steps and the loss became NaN); with the default ``d ** -0.75`` 0.75."""
    d = 30
    rng = np.random.default_rng(1)
    a = rng.standard_normal((d, d)) / np.sqrt(d)
    cov = a @ a.T + 0.05 * np.eye(d)
    cov = cov / np.mean(np.diag(cov))
    mean = np.ones(d)

    def gaussian_model():
        numpyro.sample("z", dist.MultivariateNormal(jnp.asarray(mean, fdtype()), jnp.asarray(cov, fdtype())))

    guide = AutoGaussianMixture(gaussian_model, num_components=1)
    svi = SVI(gaussian_model, guide, numpyro.optim.Adam(0.02), TraceEntropy_ELBO())
    state = svi.init(jax.random.PRNGKey(0))
    start = svi.get_params(state)
    assert _gaussian_kl(guide_locs(start)[0], start["auto_scale_tril"][0], mean, cov) < 0.05
    state = jax.jit(lambda s: jax.lax.fori_loop(0, 300, lambda i, s: svi.update(s)[0], s))(state)
    end = svi.get_params(state)
    assert _gaussian_kl(guide_locs(end)[0], end["auto_scale_tril"][0], mean, cov) < 2.0


def poisson_regression(x, N, batch_size=None):
    """NumPyro's ``test/test_pickle.py`` model: a global rate under a subsampling plate."""
    rate = numpyro.sample("param", dist.Gamma(1.0, 1.0))
    batch_size = len(x) if x is not None else None
    with numpyro.plate("batch", N, batch_size):
        numpyro.sample("x", dist.Poisson(rate), obs=x)


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_guide_pickles_before_and_after_fitting(covariance):
    """As NumPyro's ``test_pickle_autoguide`` (its model, three SVI steps, ``Predictive`` with
    the unpickled guide), and more: the unpickled guide draws what the original draws, and a
    new ``SVI.init`` with it (the initial fits run the model again, from its stored
    arguments) gives the original's initial parameters; pickled before its first call, it
    fits as the original does. Before, the guide kept its compiled initialisation and a
    closure over the model's arguments, and ``pickle.dumps`` raised after the first call."""
    import pickle

    x = np.random.default_rng(0).poisson(1.0, size=(100,))
    options = dict(num_components=2, covariance=covariance, num_init_fits=8, init_fit_steps=20)

    def run(guide):
        svi = SVI(poisson_regression, guide, numpyro.optim.Adam(1e-2), TraceEntropy_ELBO())
        return svi, svi.run(jax.random.PRNGKey(1), 3, x, len(x), progress_bar=False)

    unfitted = pickle.loads(pickle.dumps(AutoGaussianMixture(poisson_regression, **options)))
    guide = AutoGaussianMixture(poisson_regression, **options)
    svi, result = run(guide)
    _, result_unfitted = run(unfitted)
    for name, value in result.params.items():
        np.testing.assert_array_equal(result_unfitted.params[name], value)

    pickled = pickle.loads(pickle.dumps(guide))
    predictive = Predictive(poisson_regression, guide=pickled, params=result.params, num_samples=3,
                            return_sites=["param", "x"])
    samples = predictive(jax.random.PRNGKey(2), None, 1)
    assert set(samples) == {"param", "x"}
    original = Predictive(poisson_regression, guide=guide, params=result.params, num_samples=3,
                          return_sites=["param"])(jax.random.PRNGKey(2), None, 1)
    np.testing.assert_array_equal(samples["param"], original["param"])

    key = jax.random.PRNGKey(5)
    state = SVI(poisson_regression, pickled, numpyro.optim.Adam(1e-2), TraceEntropy_ELBO()).init(key, x, len(x))
    expected = svi.get_params(svi.init(key, x, len(x)))
    for name, value in expected.items():
        np.testing.assert_array_equal(svi.get_params(state)[name], value)


def test_locations_keep_a_badly_scaled_posterior():
    """Posterior standard deviations 3e-5 and 0.03 (a linear Gaussian model: the exact
    posterior in closed form, NumPy float64). The initialisation finds it (Laplace); then
    Adam moves the offsets, in units of the refined fits' standard deviations, a fraction of
    a standard deviation per step (after 2000 steps mean and standard deviations within
    0.001 standard deviations and 0.1%). Before, the locations themselves took steps of about
    ``lr`` = 0.01 (300 of ``a``'s standard deviations): after 2000 steps ``a``'s mean was 1.6
    (float32) / 4.8 (float64) standard deviations off, its standard deviation 1.36 / 10.5
    times the exact one."""
    rng = np.random.default_rng(1)
    n, s1, s2 = 10, 1e-4, 100.0
    x = rng.normal(size=n)
    y1, y2 = 0.3 + s1 * rng.normal(size=n), 500.0 + s2 * rng.normal(size=n)
    dt = fdtype()

    def model():
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1000.0))
        numpyro.sample("y1", dist.Normal(a + 1e-3 * b * jnp.asarray(x, dt), s1), obs=jnp.asarray(y1, dt))
        numpyro.sample("y2", dist.Normal(b, s2), obs=jnp.asarray(y2, dt))

    design = np.zeros((2 * n, 2))
    design[:n, 0], design[:n, 1], design[n:, 1] = 1.0, 1e-3 * x, 1.0
    noise = np.array([s1] * n + [s2] * n)
    precision = np.diag([1.0, 1e-6]) + design.T @ (design / noise[:, None] ** 2)
    cov = np.linalg.inv(precision)
    mean = cov @ design.T @ (np.concatenate([y1, y2]) / noise**2)
    sd = np.sqrt(np.diag(cov))

    guide = AutoGaussianMixture(model, num_components=2)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), TraceEntropy_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 2000, progress_bar=False).params
    q = guide.get_posterior(params)
    np.testing.assert_array_less(np.abs(np.asarray(q.mean, np.float64) - mean) / sd, 0.25)
    np.testing.assert_allclose(np.sqrt(np.asarray(q.variance, np.float64)), sd, rtol=0.15)


def _adam_with_weight_decay(decay: float, *, decoupled: bool):
    """Adam (``jax.example_libraries.optimizers.adam``'s update, lr 0.01) with weight decay,
    as optax builds it: ``decoupled=False`` adds ``decay * x`` to the gradient before Adam
    (``optax.chain(optax.add_decayed_weights(decay), optax.adam(lr))``), ``decoupled=True``
    subtracts ``lr * decay * x`` beside Adam's step (``optax.adamw``)."""
    from jax.example_libraries import optimizers

    @optimizers.optimizer
    def adam_wd(step_size, b1=0.9, b2=0.999, eps=1e-8):
        def init(x):
            return x, jnp.zeros_like(x), jnp.zeros_like(x)

        def update(i, g, state):
            x, m, v = state
            if not decoupled:
                g = g + decay * x
            m = (1 - b1) * g + b1 * m
            v = (1 - b2) * jnp.square(g) + b2 * v
            step = (m / (1 - b1 ** (i + 1))) / (jnp.sqrt(v / (1 - b2 ** (i + 1))) + eps)
            x = x - step_size * (step + decay * x) if decoupled else x - step_size * step
            return x, m, v

        return init, update, lambda state: state[0]

    return numpyro.optim._NumPyroOptim(adam_wd, 0.01)


@pytest.mark.slow
@pytest.mark.parametrize("decoupled, decay", [(False, 1e-6), (True, 1e-2)])
def test_location_parameters_held_fixed_under_weight_decay(decoupled, decay):
    """Weight decay moves parameters that have no gradient: the locations' origin and unit.
    Before they were held by their constraint (``FROZEN_STEP_SCALE``) and divided by the
    gauge: a decay in the gradient before Adam moved each of their entries by about ``lr``
    per step whatever ``decay`` (with ``decay = 1e-6`` the unit reached 0 within a few steps,
    after which the means were the origin, which fell to 80.8 after 2000 steps: 470 posterior
    standard deviations below the mean of 100); a decay of the parameters (AdamW) shrank them
    by ``(1 - lr decay)`` per step (origin 100 -> 81.9, means 420 standard deviations off:
    the offsets, in units of the posterior's standard deviation 0.04, could not follow). Now
    the means are within 0.5 posterior standard deviations of the exact posterior mean
    (conjugate normal model, closed form) after 2000 steps, as with Adam alone (0.02-0.2 over
    four keys: Adam's steps of about ``lr`` standard deviations; 0.02-0.26 with either
    decay)."""
    y = 100.0 + 0.1 * np.random.default_rng(0).normal(size=6)
    noise_sd, prior_sd = 0.1, 1000.0

    def model():
        m = numpyro.sample("m", dist.Normal(0.0, prior_sd))
        numpyro.sample("y", dist.Normal(m, noise_sd), obs=jnp.asarray(y, fdtype()))

    precision = 1 / prior_sd**2 + len(y) / noise_sd**2
    mean, sd = y.sum() / noise_sd**2 / precision, precision**-0.5
    guide = AutoGaussianMixture(model, num_components=2)
    svi = SVI(model, guide, _adam_with_weight_decay(decay, decoupled=decoupled), TraceEntropy_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 2000, progress_bar=False).params
    locs = np.asarray(guide.get_posterior(params).loc, np.float64)[:, 0]
    np.testing.assert_array_less(np.abs(locs - mean) / sd, 0.5)
