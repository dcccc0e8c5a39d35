"""AutoGaussianMixture in the scenarios of NumPyro's own autoguide tests.

NumPyro's ``test/infer/test_autoguide.py`` checks its ``AutoContinuous`` guides
(AutoMultivariateNormal, AutoLowRankMultivariateNormal, ...) on models with ``param`` sites,
reparameterised sites whose support depends on other latents, improper priors, ``stax``
modules, deterministic sites, ``contrib.control_flow.scan``, sites NumPyro cannot handle, and
``sample_posterior`` over sample and site shapes. That file is not in numpyro's sdist on PyPI
(only ``test/*.py`` is; ``tests/upstream/run_numpyro_suite.py`` runs
``test/test_distributions.py`` from it), so CI cannot run it; these tests are the same
scenarios, written here for this guide and its ELBO, with what NumPyro asserts of its own
guides. References: the Beta posterior of Beta-Bernoulli data in closed form; the guide's
density at a given point from its parameters with SciPy (``reference.mixture_logpdf``:
``scipy.stats.multivariate_normal``, ``logsumexp``); the Gaussian posterior of a location
under a flat prior; NumPyro's own messages for what it does not handle. (Discrete latent sites need ``funsor`` in NumPyro,
which this project does not install; NumPyro's guides raise the same ``ImportError`` there.)
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import lax, random
from numpyro import handlers, optim
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints, transforms
from numpyro.infer import SVI, Predictive, Trace_ELBO
from numpyro.infer.initialization import init_to_feasible, init_to_median, init_to_sample, init_to_uniform, init_to_value
from numpyro.infer.reparam import TransformReparam
from numpyro.util import fori_loop
from scipy import stats
from scipy.special import logsumexp

import reference
from conftest import guide_locs
from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO


@pytest.mark.slow
@pytest.mark.parametrize("covariance", ["full", "diag", "lowrank"])
def test_beta_bernoulli_posterior_mean_quantiles_and_predictive(covariance):
    """NumPyro's ``test_beta_bernoulli``: 3000 steps of ``Adam(0.001)`` in a ``fori_loop`` from
    ``init_to_median(num_samples=2)``; the posterior means within 0.03 of the Beta posterior's
    (closed form: ``(successes + 1) / (n + 2)``), quantiles of shape ``(3, 2)``, and Predictive
    from posterior samples and from the guide."""
    data = jnp.array([[1.0] * 8 + [0.0] * 2, [1.0] * 4 + [0.0] * 6]).T
    n = len(data)

    def model(data):
        f = numpyro.sample("beta", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event())
        with numpyro.plate("N", n):
            numpyro.sample("obs", dist.Bernoulli(f).to_event(1), obs=data)

    guide = AutoGaussianMixture(model, init_loc_fn=init_to_median(num_samples=2), covariance=covariance)
    svi = SVI(model, guide, optim.Adam(0.001), TraceEntropy_ELBO())
    state = svi.init(random.PRNGKey(1), data)
    state = fori_loop(0, 3000, lambda i, s: svi.update(s, data)[0], state)
    params = svi.get_params(state)

    samples = guide.sample_posterior(random.PRNGKey(1), params, sample_shape=(1000,))
    expected = (np.sum(np.asarray(data), 0) + 1) / (n + 2)
    np.testing.assert_allclose(np.mean(np.asarray(samples["beta"], np.float64), 0), expected, atol=0.03)
    assert guide.quantiles(params, [0.2, 0.5, 0.8])["beta"].shape == (3, 2)
    assert Predictive(model, posterior_samples=samples)(random.PRNGKey(1), None)["obs"].shape == (1000, n, 2)
    predictive = Predictive(model, guide=guide, params=params, num_samples=11)
    assert predictive(random.PRNGKey(1), None)["obs"].shape == (11, n, 2)


def test_param_sites_of_the_model_and_the_exact_loss_at_a_given_draw():
    """NumPyro's ``test_param``: the model's own ``param`` sites (constrained to ``(1, inf)`` and
    ``(0, inf)``) keep their initial values, and with the latent draw substituted the
    one-particle ``Trace_ELBO`` loss is ``ln q(x) - ln p(x)``: ``q`` the mixture of the guide's
    initial parameters (its density by SciPy), ``p`` the model's ``Normal(a, b)``. (The
    initialisation fits ``q`` to ``p`` closely, so the loss is near zero, the difference of two
    terms of about -390.)"""
    keys = random.split(random.PRNGKey(0), 3)
    a_init = float(jnp.exp(random.normal(keys[0])) + 1.0)
    b_init = float(jnp.exp(random.normal(keys[1])))
    x_init = float(random.normal(keys[2]))

    def model():
        a = numpyro.param("a", a_init, constraint=constraints.greater_than(1.0))
        b = numpyro.param("b", b_init, constraint=constraints.positive)
        numpyro.sample("x", dist.Normal(a, b))

    class SubstitutedGuide(AutoGaussianMixture):
        def __call__(self, *args, **kwargs):
            draw = {"_auto_latent": jnp.array([x_init])}
            return handlers.substitute(super().__call__, draw)(*args, **kwargs)

    guide = SubstitutedGuide(model)
    svi = SVI(model, guide, optim.Adam(0.01), Trace_ELBO())
    state = svi.init(random.PRNGKey(1))
    params = {k: np.asarray(v, np.float64) for k, v in svi.get_params(state).items()}
    np.testing.assert_allclose(params["a"], a_init, rtol=1e-6)
    np.testing.assert_allclose(params["b"], b_init, rtol=1e-6)

    tril = params["auto_scale_tril"]
    weights = np.exp(params["auto_logits"] - logsumexp(params["auto_logits"]))
    log_q = reference.mixture_logpdf(np.array([x_init]), weights, guide_locs(params), tril @ np.swapaxes(tril, -1, -2))
    log_p = stats.norm.logpdf(x_init, a_init, b_init)
    # both terms are about -390 here: a few roundings of the working dtype at that size
    atol = 8 * np.finfo(jnp.result_type(float)).eps * abs(log_p)
    np.testing.assert_allclose(float(svi.evaluate(state)), log_q - log_p, rtol=0, atol=atol)


@pytest.mark.slow
def test_dynamic_support_through_a_reparameterised_site():
    """NumPyro's ``test_dynamic_supports``: a location whose support ``(0, alpha)`` depends on
    another latent, through ``TransformReparam``, against the same model written with the base
    site: the same log density over the same unconstrained vector, so the same initial
    parameters (the initialisation sees only the log density and the key), medians and loss."""
    data = 0.9 + random.normal(random.PRNGKey(0), (1000,))

    def reparameterised(data):
        alpha = numpyro.sample("alpha", dist.Uniform(0, 1))
        with handlers.reparam(config={"loc": TransformReparam()}):
            base = dist.Uniform(0, 1)
            loc = numpyro.sample("loc", dist.TransformedDistribution(base, transforms.AffineTransform(0, alpha)))
        with numpyro.plate("N", len(data)):
            numpyro.sample("obs", dist.Normal(loc, 0.1), obs=data)

    def direct(data):
        alpha = numpyro.sample("alpha", dist.Uniform(0, 1))
        loc = numpyro.sample("loc", dist.Uniform(0, 1)) * alpha
        with numpyro.plate("N", len(data)):
            numpyro.sample("obs", dist.Normal(loc, 0.1), obs=data)

    out = []
    for model in (reparameterised, direct):
        guide = AutoGaussianMixture(model)
        svi = SVI(model, guide, optim.Adam(0.01), TraceEntropy_ELBO())
        state = svi.init(random.PRNGKey(1), data)
        params = svi.get_params(state)
        out.append((params, guide.median(params), svi.evaluate(state, data)))
    (p1, m1, l1), (p2, m2, l2) = out
    assert set(p1) == set(p2)
    for name in p1:
        np.testing.assert_allclose(p1[name], p2[name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(m1["alpha"], m2["alpha"], rtol=1e-5)
    np.testing.assert_allclose(m1["loc_base"], m2["loc"], rtol=1e-5)
    np.testing.assert_allclose(l1, l2, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.float32_pass
def test_improper_priors_under_lax_scan():
    """NumPyro's ``test_improper``: ``ImproperUniform`` priors (real and positive; the
    initialisation draws their starting points like ``init_to_uniform``) and SVI steps in a
    ``lax.scan``; the losses stay finite and the fit is the flat-prior posterior of a Gaussian
    sample (mean of ``mu`` the sample mean within 4 posterior standard deviations
    ``s / sqrt(n)``; ``sigma`` within 10% of the sample standard deviation)."""
    y = random.normal(random.PRNGKey(0), (100,))

    def model(y):
        lambda1 = numpyro.sample("lambda1", dist.ImproperUniform(constraints.real, (), ()))
        lambda2 = numpyro.sample("lambda2", dist.ImproperUniform(constraints.real, (), ()))
        sigma = numpyro.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
        mu = numpyro.deterministic("mu", lambda1 + lambda2)
        with numpyro.plate("N", len(y)):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    guide = AutoGaussianMixture(model)
    svi = SVI(model, guide, optim.Adam(0.003), TraceEntropy_ELBO(), y=y)
    state, losses = lax.scan(lambda s, _: svi.update(s), svi.init(random.PRNGKey(2)), jnp.zeros(3000))
    assert np.all(np.isfinite(np.asarray(losses)))
    samples = guide.sample_posterior(random.PRNGKey(0), svi.get_params(state), sample_shape=(4000,))
    y64 = np.asarray(y, np.float64)
    assert abs(float(np.mean(samples["mu"])) - y64.mean()) < 4 * y64.std() / np.sqrt(len(y64))
    np.testing.assert_allclose(float(np.mean(samples["sigma"])), y64.std(), rtol=0.1)


@pytest.mark.slow
def test_stax_module_parameters_in_the_model():
    """NumPyro's ``test_module``: a ``numpyro.module`` (a ``stax.Dense`` layer) in the model beside
    a latent site; its parameters are trained with the guide's, and the losses stay finite and
    fall."""
    from jax.example_libraries.stax import Dense

    x = random.normal(random.PRNGKey(0), (100, 10))
    y = x @ jnp.linspace(-1.0, 1.0, 10) + 0.1 * random.normal(random.PRNGKey(1), (100,))

    def model(x, y):
        nn = numpyro.module("nn", Dense(1), (10,))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1))
        with numpyro.plate("N", len(y)):
            numpyro.sample("y", dist.Normal(nn(x).squeeze(-1), sigma), obs=y)

    guide = AutoGaussianMixture(model)
    svi = SVI(model, guide, optim.Adam(0.01), TraceEntropy_ELBO(), x=x, y=y)
    state, losses = lax.scan(lambda s, _: svi.update(s), svi.init(random.PRNGKey(2)), jnp.zeros(500))
    losses = np.asarray(losses)
    assert np.all(np.isfinite(losses))
    # the loss fell (a mean of 50 one-particle losses has a standard error of about 2 nats here)
    assert losses[-50:].mean() < losses[:50].mean() - 20
    initial = svi.get_params(svi.init(random.PRNGKey(2)))["nn$params"]
    weights, initial_weights = svi.get_params(state)["nn$params"][0], initial[0]  # stax: (W, b)
    assert float(jnp.max(jnp.abs(weights - initial_weights))) > 0.1  # the layer was trained


@pytest.mark.slow
def test_deterministic_site_and_param_through_predictive():
    """NumPyro's ``test_autoguide_deterministic``: a ``param`` and a ``deterministic`` site; the
    Predictive of held-out data from posterior samples gives the deterministic site from the
    same draws (``z = (y - mu) / sigma``)."""

    def model(y=None):
        n, len_y = (y.size, len(y)) if y is not None else (1, 1)
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        sigma = numpyro.param("sigma", 1.0, constraint=constraints.positive)
        with numpyro.plate("N", len_y):
            y = numpyro.sample("y", dist.Normal(mu, sigma).expand((n,)), obs=y)
        numpyro.deterministic("z", (y - mu) / sigma)

    y = 2 + 3 * random.normal(random.PRNGKey(0), shape=(300,))
    guide = AutoGaussianMixture(model)
    svi = SVI(model, guide, optim.Adam(0.01), TraceEntropy_ELBO())
    result = svi.run(random.PRNGKey(0), 500, y=y[:200], progress_bar=False)
    samples = guide.sample_posterior(random.PRNGKey(0), result.params, sample_shape=(1000,))
    predicted = Predictive(model, samples, params=result.params)(random.PRNGKey(0), y[200:])
    assert predicted["y"].shape == (1000, 100) and predicted["z"].shape == (1000, 100)
    expected = (predicted["y"] - samples["mu"][..., None]) / result.params["sigma"]
    np.testing.assert_allclose(predicted["z"], expected, atol=0.05)


@pytest.mark.parametrize("init_loc_fn", [init_to_feasible, init_to_median, init_to_sample, init_to_uniform])
def test_site_numpyro_cannot_handle_gives_its_helpful_error(init_loc_fn):
    """NumPyro's ``test_sphere_helpful_error``: a ``ProjectedNormal`` site raises NumPyro's
    ``ValueError`` naming ``ProjectedNormalReparam``, whatever the ``init_loc_fn``."""

    def model():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        y = numpyro.sample("y", dist.ProjectedNormal(x))
        numpyro.sample("obs", dist.Normal(y, 1), obs=jnp.array([1.0, 0.0]))

    guide = AutoGaussianMixture(model, init_loc_fn=init_loc_fn)
    with pytest.raises(ValueError, match="ProjectedNormalReparam"):
        handlers.seed(guide, 0)()


def test_local_latent_site_under_subsampling_raises():
    """NumPyro's ``test_autocontinuous_local_error``: a latent site inside a subsampled plate."""

    def model():
        with numpyro.plate("N", 10, subsample_size=4):
            numpyro.sample("x", dist.Normal(0, 1))

    svi = SVI(model, AutoGaussianMixture(model), optim.Adam(1.0), TraceEntropy_ELBO())
    with pytest.raises(ValueError, match="local latent variables"):
        svi.init(random.PRNGKey(0))


@pytest.mark.slow
def test_subsampled_model_keeps_its_deterministic_site_and_scalar_init_value():
    """NumPyro's ``test_subsample_model_with_deterministic`` and ``test_init_to_scalar_value``:
    a subsampled likelihood beside a deterministic site, which ``sample_posterior`` returns,
    and ``init_to_value`` with a Python float for a scalar site (the first starting point,
    ``_init_latent``)."""

    def model():
        x = numpyro.sample("x", dist.Normal(0, 1))
        numpyro.deterministic("x2", x * 2)
        with numpyro.plate("N", 10, subsample_size=5):
            numpyro.sample("obs", dist.Normal(x, 1), obs=jnp.ones(5))

    guide = AutoGaussianMixture(model, init_loc_fn=init_to_value(values={"x": 1.0}))
    result = SVI(model, guide, optim.Adam(0.1), TraceEntropy_ELBO()).run(random.PRNGKey(0), 10, progress_bar=False)
    np.testing.assert_allclose(guide._init_latent, [1.0])
    samples = guide.sample_posterior(random.PRNGKey(1), result.params)
    np.testing.assert_allclose(samples["x2"], 2 * samples["x"], rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
def test_sample_posterior_shapes_with_a_deterministic_site(shape):
    """NumPyro's ``test_autodelta_sample_posterior_with_sample_shape`` (there for AutoDelta):
    ``sample_posterior``'s latent and deterministic sites have shape ``sample_shape + shape``
    for sample shapes ``()``, ``(1,)``, ``(2, 3)``; median and quantiles the site's shape."""

    def model():
        x = numpyro.sample("x", dist.Normal().expand(shape))
        numpyro.deterministic("x2", x**2)

    guide = AutoGaussianMixture(model)
    result = SVI(model, guide, optim.Adam(0.01), TraceEntropy_ELBO()).run(random.PRNGKey(0), 20, progress_bar=False)
    for sample_shape in [(), (1,), (2, 3)]:
        samples = guide.sample_posterior(random.PRNGKey(1), result.params, sample_shape=sample_shape)
        assert samples["x"].shape == sample_shape + shape
        np.testing.assert_allclose(samples["x2"], samples["x"] ** 2, rtol=1e-6)
    assert guide.median(result.params)["x"].shape == shape
    assert guide.quantiles(result.params, [0.1, 0.5, 0.9])["x"].shape == (3,) + shape


@pytest.mark.slow
def test_latent_sites_in_a_scan_under_a_plate():
    """NumPyro's ``test_subsample_guide`` model without subsampling (this guide, like every
    ``AutoContinuous``, has no local latents): a state-space model through
    ``contrib.control_flow.scan`` whose latent states sit in a plate; finite losses, and
    ``sample_posterior`` gives the states with their time and plate axes."""
    steps, size = 8, 20

    def model(batch, full_size):
        drift = numpyro.sample("drift", dist.LogNormal(-1, 0.5))
        plate = numpyro.plate("data", full_size)

        def transition(z_prev, y_curr):
            with plate:
                z_curr = numpyro.sample("state", dist.Normal(z_prev, drift))
                y_curr = numpyro.sample("obs", dist.Bernoulli(logits=z_curr), obs=y_curr)
            return z_curr, y_curr

        return scan(transition, jnp.zeros(full_size), batch, length=steps)[1]

    with handlers.seed(rng_seed=0):
        data = model(None, size)
    guide = AutoGaussianMixture(model)
    result = SVI(model, guide, optim.Adam(0.02), TraceEntropy_ELBO()).run(
        random.PRNGKey(0), 100, data, size, progress_bar=False
    )
    assert np.all(np.isfinite(np.asarray(result.losses)))
    assert guide.latent_dim == 1 + steps * size
    samples = guide.sample_posterior(random.PRNGKey(1), result.params, data, size, sample_shape=(3,))
    assert samples["state"].shape == (3, steps, size) and samples["drift"].shape == (3,)
    assert np.all(np.asarray(samples["drift"]) > 0)
