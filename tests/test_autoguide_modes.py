"""AutoGaussianMixture's default initialisation (short independent fits, farthest-point
choice) and the success criterion of issue 14: with only ``num_components`` set, every
mode's mass within 0.15 of the truth in at least 9 of 10 seeds.

References: the true mode masses come from symmetry (a symmetric prior under
``y ~ N(a**2, s)``) or from SciPy quadrature of the one-dimensional posterior
(``scipy.integrate.quad``); the fitted Gaussian of the kernel test is the closed-form ADVI
optimum for a Gaussian target (the target itself, with ELBO = log Z = 0).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import lax
from numpyro import handlers
from numpyro.infer import SVI, Predictive, Trace_ELBO
from scipy import integrate, stats
from scipy.special import logsumexp

from conftest import X64, guide_locs
from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO
from numpyro_gmm.autoguide import DENSE_PRECONDITIONER_MAX_DIM, NEWTON_CG_MAX_DIM
from numpyro_gmm._kernels.memory import MemoryBudget
from numpyro_gmm._kernels.init_fits import (
    bhattacharyya_distance,
    choose_separated,
    conjugate_gradient,
    curvature_cov_factors,
    fit_diagonal_gaussians,
    hessian_preconditioner,
    is_factor,
    laplace_scale_tril,
    location_units,
    mixture_logits,
    newton_cg_refine,
    newton_refine,
)


def bimodal_model():
    """The issue's model: two symmetric modes of mass 1/2 at a = +-2."""
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    numpyro.sample("y", dist.Normal(a**2, 0.5), obs=4.0)


def bimodal_half_sd():
    """The standard deviation of ``a`` over one half (``a > 0``) of ``bimodal_model``'s
    posterior, by quadrature (SciPy)."""
    dens = lambda a: stats.norm.pdf(a, 0, 3) * stats.norm.pdf(4.0, a**2, 0.5)  # noqa: E731
    z = integrate.quad(dens, 0, 10)[0]
    m1 = integrate.quad(lambda a: a * dens(a), 0, 10)[0] / z
    m2 = integrate.quad(lambda a: a * a * dens(a), 0, 10)[0] / z
    return np.sqrt(m2 - m1**2)


def unequal_model():
    """An asymmetric prior under y ~ N(z**2, 1): modes near +-2 of unequal mass."""
    z = numpyro.sample("z", dist.Normal(0.4, 1.5))
    numpyro.sample("y", dist.Normal(z**2, 1.0), obs=4.0)


def unequal_positive_mass():
    """P(z > 0) by SciPy quadrature of the unnormalised posterior."""
    dens = lambda z: stats.norm.pdf(z, 0.4, 1.5) * stats.norm.pdf(4.0, z**2, 1.0)  # noqa: E731
    pos = integrate.quad(dens, 0, 10, epsabs=1e-13)[0]
    neg = integrate.quad(dens, -10, 0, epsabs=1e-13)[0]
    return pos / (pos + neg)


LIGHT_MASS = 0.01


def light_mode_model():
    """A posterior with modes of mass ``1 - LIGHT_MASS`` at -3 and ``LIGHT_MASS`` at +3
    (standard deviations 0.5): the log density is that Gaussian mixture's, exactly (its
    masses in closed form), beside two standard normal coordinates."""
    z = numpyro.sample("z", dist.Normal(0.0, 10.0))
    heavy = jnp.log1p(-LIGHT_MASS) + dist.Normal(-3.0, 0.5).log_prob(z)
    light = jnp.log(LIGHT_MASS) + dist.Normal(3.0, 0.5).log_prob(z)
    numpyro.factor("mixture", jnp.logaddexp(heavy, light) - dist.Normal(0.0, 10.0).log_prob(z))
    numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]).to_event(1))


def light_mode_mass(locs, logits):
    """The weight of the components on the light mode (mean of ``z`` above 0)."""
    w = np.exp(logits - np.max(logits))
    return float(np.sum(w[locs[:, 0] > 0]) / np.sum(w))


def constrained_model():
    """A bimodal real site beside a positive and a simplex site."""
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    numpyro.sample("y", dist.Normal(a**2, 0.5), obs=4.0)
    s = numpyro.sample("s", dist.LogNormal(0.0, 0.5))
    p = numpyro.sample("p", dist.Dirichlet(jnp.ones(3)))
    numpyro.sample("obs", dist.Normal(s * p[0], 1.0), obs=0.3)


def fitted_guide(model, seed=0, **kwargs):
    guide = AutoGaussianMixture(model, **kwargs)
    with handlers.seed(rng_seed=seed):
        params = handlers.trace(guide).get_trace()
    params = {k: v["value"] for k, v in params.items() if v["type"] == "param"}
    return guide, params


def positive_mass_over_seeds(model, site, num_seeds, steps, lr):
    """The fraction of each seed's guide draws with ``site > 0``: ``(num_seeds,)``; all
    seeds in one jit(vmap) program."""
    guide = AutoGaussianMixture(model, num_components=2)
    svi = SVI(model, guide, numpyro.optim.Adam(lr), TraceEntropy_ELBO())
    with handlers.block(), handlers.seed(rng_seed=0):
        guide()  # model structure once, outside the vmap

    def one(key):
        init_key, run_key, draw_key = jax.random.split(key, 3)
        state = svi.init(init_key)._replace(rng_key=run_key)
        state, _ = lax.scan(lambda s, _: (svi.update(s)[0], None), state, None, length=steps)
        draws = guide.sample_posterior(draw_key, svi.get_params(state), sample_shape=(2000,))
        return jnp.mean(draws[site] > 0)

    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(num_seeds))
    return np.asarray(jax.jit(jax.vmap(one))(keys))


# -- the success criterion ----------------------------------------------------------------


@pytest.mark.float32_pass
@pytest.mark.slow
@pytest.mark.parametrize("name", ["symmetric", "unequal"])
def test_defaults_find_both_modes_in_nine_of_ten_seeds(name):
    model, site, truth = {
        "symmetric": (bimodal_model, "a", 0.5),  # by symmetry
        "unequal": (unequal_model, "z", unequal_positive_mass()),  # by quadrature
    }[name]
    mass = positive_mass_over_seeds(model, site, num_seeds=10, steps=1500, lr=0.05)
    assert np.sum(np.abs(mass - truth) <= 0.15) >= 9, (mass, truth)


@pytest.mark.float32_pass
@pytest.mark.slow
def test_defaults_keep_both_modes_short_training():
    """Four seeds, 300 steps: no seed's guide loses a mode of the issue's model (Adam's
    noise on the logits is still visible after so few steps, hence the wide window)."""
    mass = positive_mass_over_seeds(bimodal_model, "a", num_seeds=4, steps=300, lr=0.02)
    assert np.all((mass > 0.2) & (mass < 0.8)), mass


# -- the initialisation -------------------------------------------------------------------


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_initial_components_on_different_modes(covariance):
    guide, params = fitted_guide(bimodal_model, num_components=2, covariance=covariance)
    locs = guide_locs(params)
    assert locs.shape == (2, 1)
    # the modes of p(a | y) are at a = +-sqrt(4 - 0.25/9 * ...) ~ +-2: one component each
    np.testing.assert_allclose(np.sort(locs[:, 0]), [-2.0, 2.0], atol=0.1)
    # their standard deviations: that of each half of the posterior (quadrature)
    sd = bimodal_half_sd()
    if covariance == "full":
        tril = np.asarray(params["auto_scale_tril"])
        assert tril.shape == (2, 1, 1)
        scales = tril[:, 0, 0]
    else:
        scales = np.asarray(params["auto_scale"])[:, 0]
    np.testing.assert_allclose(scales, sd, rtol=0.25)
    # the initial weights: the modes' masses, 1/2 each by symmetry
    np.testing.assert_allclose(np.exp(params["auto_logits"]) / np.sum(np.exp(params["auto_logits"])), 0.5, atol=0.02)


@pytest.mark.parametrize("covariance", ["full", "diag", "lowrank"])
def test_initial_weights_are_the_masses_of_the_modes(covariance):
    """Step 5 of the initialisation: a mode of mass 0.01 (closed form, ``light_mode_model``)
    starts at its mass, not at 1/3; the spare component (K = 3) and the other one on the
    heavy mode share its mass."""
    guide, params = fitted_guide(light_mode_model, num_components=3, covariance=covariance)
    locs = guide_locs(params)
    assert np.sum(locs[:, 0] > 0) == 1 and np.sum(locs[:, 0] < 0) == 2, locs
    logits = np.asarray(params["auto_logits"], np.float64)
    np.testing.assert_allclose(light_mode_mass(locs, logits), LIGHT_MASS, rtol=0.02)
    heavy = logits[locs[:, 0] < 0]  # equal halves of the heavy mode
    np.testing.assert_allclose(heavy[0], heavy[1], atol=0.02)


@pytest.mark.slow
def test_light_mode_keeps_its_mass_under_svi():
    """1000 steps of ``Adam(0.01)`` keep the light mode's mass (0.01, closed form); from
    equal starting weights the logits, moving about ``weight_step_scale * lr`` per step, had
    only reached 0.081 (measured before step 5 of the initialisation)."""
    guide = AutoGaussianMixture(light_mode_model, num_components=2)
    svi = SVI(light_mode_model, guide, numpyro.optim.Adam(0.01), TraceEntropy_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 1000, progress_bar=False)
    locs = guide_locs(result.params)
    mass = light_mode_mass(locs, np.asarray(result.params["auto_logits"], np.float64))
    np.testing.assert_allclose(mass, LIGHT_MASS, atol=0.003)


def test_mixture_logits_of_separated_components_are_their_masses():
    """Components equal to the separated components of a Gaussian-mixture target: the
    weights that maximise the ELBO are the target's (closed form; KL 0); a duplicated
    component shares its mode's mass; a mass below ``exp(-tolerance)`` times the largest
    gets that floor."""
    dt = jnp.float64 if X64 else jnp.float32
    masses, means, sds = np.array([0.7, 0.3 - 1e-5, 1e-5]), np.array([-10.0, 0.0, 10.0]), np.array([1.0, 0.5, 2.0])
    eps = np.random.default_rng(0).standard_normal(64)

    def logits(comp, free=None):
        z = means[comp][:, None] + sds[comp][:, None] * eps  # (K, n)
        log_p = logsumexp(np.log(masses) + stats.norm.logpdf(z[..., None], means, sds), axis=-1)
        log_q = stats.norm.logpdf(z[..., None], means[comp], sds[comp])  # (K, n, K)
        return np.asarray(mixture_logits(jnp.asarray(log_p, dt), jnp.asarray(log_q, dt), 6.0, free), np.float64)

    np.testing.assert_allclose(logits(np.arange(3)), np.log(masses / masses[0]).clip(-6.0), atol=1e-4)
    dup = logits(np.array([0, 0, 1]))  # the first mode twice, the third not covered
    np.testing.assert_allclose(dup, np.log([0.35, 0.35, 0.3 - 1e-5] / np.float64(0.35)), atol=1e-4)
    # only the free weights optimised: the second keeps 1/3, the others share 2/3 as 0.7 : 0.3
    w = np.exp(logits(np.array([0, 2, 1]), jnp.array([True, False, True])))
    np.testing.assert_allclose(w / w.sum(), [2 / 3 * 0.7, 1 / 3, 2 / 3 * (0.3 - 1e-5)], rtol=1e-4)
    np.testing.assert_array_equal(logits(np.arange(3), jnp.zeros(3, bool)), np.zeros(3))  # none free: equal


def test_mixture_logits_of_overlapping_components_reach_the_target_masses():
    """Components of a Gaussian-mixture target 2 standard deviations apart (overlapping):
    the ELBO's maximiser is the target's own weights 0.3 / 0.7 (KL 0, closed form), reached
    by the steps from equal weights on 20,000 random draws of each component (the
    estimate's noise is what the tolerance allows for)."""
    dt = jnp.float64 if X64 else jnp.float32
    masses, means = np.array([0.3, 0.7]), np.array([0.0, 2.0])
    z = means[:, None] + np.random.default_rng(1).standard_normal((2, 20000))
    log_p = logsumexp(np.log(masses) + stats.norm.logpdf(z[..., None], means), axis=-1)
    log_q = stats.norm.logpdf(z[..., None], means)
    w = np.exp(np.asarray(mixture_logits(jnp.asarray(log_p, dt), jnp.asarray(log_q, dt), 6.0), np.float64))
    np.testing.assert_allclose(w / w.sum(), masses, atol=0.01)


def test_mixture_logits_where_the_log_density_is_not_finite():
    """A component whose points have no finite log density gets the floor (``-tolerance``);
    where none has, the weights stay equal."""
    log_q = jnp.zeros((3, 4, 3))
    log_p = jnp.array([[0.0] * 4, [-1.0, jnp.nan, 0.0, 0.0], [-jnp.inf] * 4])
    np.testing.assert_allclose(mixture_logits(log_p, log_q, 5.0)[1:], [-5.0, -5.0], atol=1e-6)
    np.testing.assert_array_equal(mixture_logits(jnp.full((3, 4), jnp.nan), log_q, 5.0), np.zeros(3))


SPIKE_SD, SLAB_SD, SPIKE_Y = 0.01, 10.0, 0.5


def spike_and_slab_model():
    """``z ~ (N(0, 0.01^2) + N(0, 10^2)) / 2``, ``y = 0.5 ~ N(z, 1)``: the posterior is
    exactly a mixture of two Gaussians, a spike inside a slab 100 times wider."""
    prior = dist.MixtureSameFamily(dist.Categorical(probs=jnp.array([0.5, 0.5])),
                                   dist.Normal(0.0, jnp.array([SPIKE_SD, SLAB_SD])))
    z = numpyro.sample("z", prior)
    numpyro.sample("y", dist.Normal(z, 1.0), obs=SPIKE_Y)


def spike_and_slab_posterior():
    """``(weights, means, sds)`` of its posterior's components (conjugacy: each prior
    component times the likelihood, weighted by its evidence ``N(y; 0, s^2 + 1)``)."""
    s2 = np.array([SPIKE_SD, SLAB_SD]) ** 2
    var = 1.0 / (1.0 / s2 + 1.0)
    evidence = stats.norm.pdf(SPIKE_Y, 0.0, np.sqrt(s2 + 1.0))
    return evidence / evidence.sum(), var * SPIKE_Y, np.sqrt(var)


@pytest.mark.parametrize("seed", range(6))
def test_initial_components_on_the_spike_and_the_slab(seed):
    # The spike (weight 0.90, sd 0.010 at 0) and the slab (0.10, sd 0.995 at 0.495) are
    # modes of the posterior density, but the fits' old distance (the means' difference
    # over the summed variances, 0.25 here) took them for one mode; and Adam's steps (about
    # init_fit_lr = 0.05) shook the fits out of the spike, 5 times narrower, so that in some
    # seeds none found it: both components started on the spike or both in the slab (after
    # 3000 steps 0.10 and up to 2.2 nats below the evidence; 2 of 10 seeds within 0.01,
    # benchmarks/spike_and_slab.py; 4 of these 6 keys failed). Now the choice measures
    # Bhattacharyya distances (0.25 / 4 + 1.96 here) and the starting points are
    # Newton-refined as candidates beside the fits.
    guide, params = fitted_guide(spike_and_slab_model, seed, num_components=2, covariance="diag")
    _, means, sds = spike_and_slab_posterior()
    order = np.argsort(np.asarray(params["auto_scale"])[:, 0])
    assert np.all(np.abs(guide_locs(params)[order, 0] - means) < 0.1 * sds), guide_locs(params)
    np.testing.assert_allclose(np.asarray(params["auto_scale"])[order, 0], sds, rtol=0.1)


def spike_and_slab_150():
    """``(model, means (2,), sds (2,))``: ``spike_and_slab_model`` in 150 dimensions
    (``z ~ (N(0, 0.01^2 I) + N(0, 10^2 I)) / 2``, ``y = 2.15 * 1 ~ N(z, I)``), where the
    spike has the posterior weight 0.95, and its posterior components (conjugacy, per
    coordinate)."""
    d, y = 150, 2.15

    def model():
        prior = dist.MixtureSameFamily(dist.Categorical(probs=jnp.array([0.5, 0.5])),
                                       dist.Normal(0.0, jnp.array([[SPIKE_SD], [SLAB_SD]])).expand([2, d]).to_event(1))
        z = numpyro.sample("z", prior)
        numpyro.sample("y", dist.Normal(z, 1.0).to_event(1), obs=jnp.full(d, y))

    var = 1.0 / (1.0 / np.array([SPIKE_SD, SLAB_SD]) ** 2 + 1.0)
    return model, var * y, np.sqrt(var)


@pytest.mark.slow
def test_initial_components_on_the_spike_and_the_slab_beyond_newton_max_dim():
    # d = 150 > NEWTON_MAX_DIM: before the Newton-CG refinement both components started in
    # the slab (a fit started on the spike with init_scale 0.1 sees only the slab in 150
    # dimensions), 2.99 nats below the evidence after 3000 steps in every seed of
    # benchmarks/spike_and_slab.py. Now a prior draw on the spike is refined to its centre:
    # one component on each, with the posterior's means and standard deviations (closed form)
    model, means, sds = spike_and_slab_150()
    for seed in range(2):
        guide, params = fitted_guide(model, seed, num_components=2)
        tril = np.asarray(params["auto_scale_tril"])
        order = np.argsort(tril[:, 0, 0])
        locs = guide_locs(params)[order]
        assert np.all(np.abs(locs - means[:, None]) < 0.1 * sds[:, None]), locs[:, :3]
        np.testing.assert_allclose(np.diagonal(tril[order], axis1=1, axis2=2), np.broadcast_to(sds[:, None], (2, 150)),
                                   rtol=0.01)


def test_spike_and_slab_fit_reaches_the_evidence():
    # the posterior is a two-component mixture, so the fit can be exact: the ELBO of
    # Trace_ELBO with 20,000 particles (se ~0.003) at the evidence, the weights the posterior's.
    # Keys 0-7: before, 0.10 nats below in three keys (both components on the spike) and
    # 2.17 in this one (both in the slab); now within 0.0006 in all
    guide = AutoGaussianMixture(spike_and_slab_model, num_components=2)
    svi = SVI(spike_and_slab_model, guide, numpyro.optim.Adam(0.01), TraceEntropy_ELBO())
    result = svi.run(jax.random.PRNGKey(1), 2000, progress_bar=False)
    weights, means, sds = spike_and_slab_posterior()
    s2 = np.array([SPIKE_SD, SLAB_SD]) ** 2
    log_evidence = np.log(np.sum(0.5 * stats.norm.pdf(SPIKE_Y, 0.0, np.sqrt(s2 + 1.0))))
    elbo = -Trace_ELBO(num_particles=20000).loss(jax.random.PRNGKey(1), result.params, spike_and_slab_model, guide)
    assert abs(float(elbo) - log_evidence) < 0.01, (float(elbo), log_evidence)
    mixture = guide.get_posterior(result.params)
    order = np.argsort(np.asarray(mixture.component_stddev[:, 0]))
    np.testing.assert_allclose(np.asarray(mixture.probs)[order], weights, atol=0.02)


@pytest.mark.float32_pass
def test_initialisation_deterministic_given_key():
    def init(seed):
        guide = AutoGaussianMixture(bimodal_model, num_components=3)
        with handlers.seed(rng_seed=seed):
            tr = handlers.trace(guide).get_trace()
        return guide, {k: np.asarray(v["value"]) for k, v in tr.items() if v["type"] == "param"}

    (guide, a), (_, b) = init(0), init(0)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    # the key is used: other keys, other starting points (the Newton-refined fits may then
    # converge to the same modes, so the final parameters need not differ)
    starts = [np.asarray(guide.starting_points(jax.random.PRNGKey(s))) for s in (0, 1)]
    assert not np.array_equal(*starts)


@pytest.mark.float32_pass
def test_starting_points_and_fits_shapes():
    # the guide's own first call starts by "spread" (no fits compiled there): the two
    # programs below are the ones under test
    guide, _ = fitted_guide(constrained_model, num_components=2, num_init_fits=20, init_fit_steps=50,
                            init_method="spread")
    d = guide.latent_dim
    assert d == 1 + 1 + 2  # a, log s, stick-breaking coordinates of the 3-simplex
    # one program for both (eagerly: one per op)
    starts, fits = jax.jit(lambda k: (guide.starting_points(k), guide.initial_fits(k)))(jax.random.PRNGKey(3))
    assert starts.shape == (20, d)
    assert np.all(np.isfinite(starts))
    np.testing.assert_allclose(starts[0], guide._init_latent, rtol=1e-6)  # the init_loc_fn point first
    # prior draws spread: the bimodal site's N(0, 3) prior is wider than init_to_uniform's (-2, 2)
    assert np.std(np.asarray(starts[:, 0])) > 1.0
    # the last 20 - 1 - 10 points: init_to_uniform's, uniform on (-2, 2) in unconstrained space
    # in every coordinate (the simplex's stick-breaking ones included), all distinct
    uniform = np.asarray(starts[11:])
    assert uniform.shape == (9, d) and np.all(np.abs(uniform) < 2.0)
    assert len(np.unique(uniform[:, 0])) == 9 and np.std(uniform) > 0.5
    locs, scales, chosen, (all_locs, all_scales, scores) = fits
    assert locs.shape == (2, d) and scales.shape == (2, d) and chosen.shape == (2,)
    # the candidates: the 20 fits and, Newton-refined beside them (d <= NEWTON_MAX_DIM), the
    # 20 starting points
    assert all_locs.shape == (40, d) and all_scales.shape == (40, d) and scores.shape == (40,)
    assert len(set(np.asarray(chosen).tolist())) == 2
    assert np.all(np.asarray(scales) > 0)


@pytest.mark.float32_pass
def test_constrained_sites_sample_posterior_and_predictive():
    guide, params = fitted_guide(constrained_model, num_components=2)
    locs = guide_locs(params)
    assert np.all(np.isfinite(locs)) and locs.shape == (2, guide.latent_dim)
    assert np.sign(locs[0, 0]) != np.sign(locs[1, 0])  # one component per mode of a
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, sample_shape=(500,))
    assert np.all(np.asarray(draws["s"]) > 0)
    np.testing.assert_allclose(np.asarray(draws["p"]).sum(-1), 1.0, rtol=1e-5)
    assert 0.2 < float(np.mean(np.asarray(draws["a"]) > 0)) < 0.8
    pred = Predictive(constrained_model, guide=guide, params=params, num_samples=50)(jax.random.PRNGKey(2))
    assert pred["obs"].shape == (50,)
    median = guide.median(params)
    assert float(median["s"]) > 0


def test_init_runs_under_jit():
    guide = AutoGaussianMixture(bimodal_model, num_components=2)
    svi = SVI(bimodal_model, guide, numpyro.optim.Adam(0.05), TraceEntropy_ELBO())
    with handlers.block(), handlers.seed(rng_seed=0):
        guide()
    eager = svi.get_params(svi.init(jax.random.PRNGKey(5)))
    jitted = svi.get_params(jax.jit(svi.init)(jax.random.PRNGKey(5)))
    tol = 1e-10 if X64 else 1e-4
    for k in eager:
        np.testing.assert_allclose(jitted[k], eager[k], atol=tol)


def guide_list_model():
    """``bimodal_model`` with a second latent vector ``b`` in the likelihood of ``a`` and its own
    observations: ``a -> -a`` leaves the posterior unchanged, so ``a``'s two modes have mass 1/2."""
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    numpyro.sample("y", dist.Normal(a**2 + b.sum(), 0.5), obs=4.0)
    numpyro.sample("y2", dist.Normal(b, s), obs=jnp.array([0.3, -0.2]))


def test_blocked_model_without_observed_sites_warns():
    # AutoGuideList's pattern block(model, expose=[...]) hides the likelihood: the fits would
    # see only the prior of "a" (all components at its mode 0). Warned at the first call;
    # block(model, hide=[...]) keeps the observed sites and does not warn, nor does an
    # unblocked model (warnings are errors in this suite), nor init_method="spread" (which
    # does not read the log density), nor a blocked model with its likelihood exposed.
    def first_call(model, **kwargs):
        handlers.seed(AutoGaussianMixture(model, **kwargs), rng_seed=0)()

    with pytest.warns(UserWarning, match=r"handlers.block.*no observed site.*\['a'\].*hide="):
        first_call(handlers.block(guide_list_model, expose=["a"]))
    with pytest.warns(UserWarning, match="no observed site"):  # wrapped in another handler
        first_call(handlers.seed(handlers.block(guide_list_model, expose=["a"]), rng_seed=1))
    first_call(handlers.block(guide_list_model, hide=["b", "s"]))
    first_call(handlers.block(guide_list_model, expose=["a", "y"]))
    first_call(handlers.block(guide_list_model, expose=["a"]), init_method="spread")
    first_call(guide_list_model)


@pytest.mark.slow
@pytest.mark.float32_pass
def test_guide_list_with_the_other_latents_hidden_finds_both_modes():
    # AutoGuideList: the mixture over "a" (the model with b and s hidden, as the warning
    # above advises), AutoNormal over the rest. Both modes, each of mass 1/2 by symmetry.
    from numpyro.infer.autoguide import AutoGuideList, AutoNormal

    guide = AutoGuideList(guide_list_model)
    guide.append(AutoGaussianMixture(handlers.block(guide_list_model, hide=["b", "s"]), num_components=2))
    guide.append(AutoNormal(handlers.block(guide_list_model, hide=["a"])))
    svi = SVI(guide_list_model, guide, numpyro.optim.Adam(0.02), TraceEntropy_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 2000, progress_bar=False)
    samples = guide.sample_posterior(jax.random.PRNGKey(1), result.params, sample_shape=(20000,))
    a = np.asarray(samples["a"], np.float64)
    assert abs(np.mean(a > 0) - 0.5) < 0.1
    assert np.median(a[a > 0]) > 1.0 and np.median(a[a < 0]) < -1.0  # not both near 0
    locs = guide_locs(result.params)[:, 0]
    assert locs.min() < -1.0 < 1.0 < locs.max()


def data_model(y):
    """``y ~ N(a^2, 0.5)`` per entry of ``y``, ``a ~ N(0, 3)``: one mode at ``a = 0`` for data
    below 0, two symmetric ones at ``+-sqrt(mean y)`` (mass 1/2 each) for data well above 0."""
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(a**2, 0.5), obs=y)


def test_initialisation_fits_the_data_of_the_call_that_creates_the_parameters():
    # A guide initialised on one data set and then on another (SVI.init again, e.g. SVI.run
    # on new data) starts from fits to the second: the same parameters as a fresh guide's,
    # both components on the second data's modes at +-2. Before, the fits reused the first
    # call's data (the unimodal posterior at 0), and both components started at 0.
    unimodal, bimodal = jnp.array([-1.0, -1.2, -0.8]), jnp.array([4.0, 4.2, 3.8])
    key = jax.random.PRNGKey(0)

    def init(guide, y):
        svi = SVI(data_model, guide, numpyro.optim.Adam(0.05), TraceEntropy_ELBO())
        return svi.get_params(svi.init(key, y))

    reused = AutoGaussianMixture(data_model, num_components=2)
    first = init(reused, unimodal)
    assert np.abs(guide_locs(first)).max() < 0.5  # the unimodal data's mode
    again, fresh = init(reused, bimodal), init(AutoGaussianMixture(data_model, num_components=2), bimodal)
    for name in fresh:  # the same program up to XLA's choices (a difference of 5e-6 in float32)
        np.testing.assert_allclose(again[name], fresh[name], rtol=1e-9 if X64 else 2e-5, atol=1e-9 if X64 else 2e-5)
    locs = np.sort(guide_locs(again)[:, 0])
    np.testing.assert_allclose(locs, [-2.0, 2.0], atol=0.1)
    # the compiled initialisation is kept for the same data, replaced for other data
    assert reused._init_programs["data"][1][0][1] is bimodal
    programs = reused._init_programs
    init(reused, bimodal)
    assert reused._init_programs is programs
    init(reused, unimodal)
    assert reused._init_programs is not programs
    # NumPy data changed in place between two calls are other data (the compiled program
    # holds the first call's values): fits to the new values
    data = np.array(unimodal)
    assert np.abs(guide_locs(init(reused, data))).max() < 0.5
    data[:] = np.asarray(bimodal)
    np.testing.assert_allclose(np.sort(guide_locs(init(reused, data))[:, 0]), [-2.0, 2.0], atol=0.1)
    # the public methods take the model's arguments too (default: the first call's)
    locs_first = np.asarray(reused.initial_components(key)[0])
    locs_bimodal = np.asarray(reused.initial_components(key, bimodal)[0])
    assert np.abs(locs_first).max() < 0.5 and np.sort(np.abs(locs_bimodal[:, 0])).min() > 1.5


def test_initialisation_compiled_once_per_prototype_with_its_options(monkeypatch):
    # SVI.init (outside any trace) compiles the initialisation with INIT_COMPILER_OPTIONS on
    # the CPU and keeps the program: a second init with another key reuses it (one entry in
    # the jit's cache; the Newton-refined fits of both keys may end on the same modes, so the
    # parameters need not differ); an option this XLA does not know falls back to the default
    # compilation with the same result.
    import numpyro_gmm.autoguide as ag

    def init(key, guide):
        svi = SVI(bimodal_model, guide, numpyro.optim.Adam(0.05), TraceEntropy_ELBO())
        return svi.get_params(svi.init(jax.random.PRNGKey(key)))

    guide = AutoGaussianMixture(bimodal_model, num_components=2)
    traced = []
    original = guide.initial_components

    def counting(key, *args, **kwargs):  # runs once per trace, not per call of the compiled program
        traced.append(key)
        return original(key, *args, **kwargs)

    guide.initial_components = counting
    first, second = init(5, guide), init(6, guide)
    assert len(traced) == 1
    assert "plain" not in guide._init_programs and guide._init_programs["tuned"] is not None
    assert np.all(np.isfinite(guide_locs(second)))

    monkeypatch.setattr(ag, "INIT_COMPILER_OPTIONS", {"xla_no_such_option_of_this_test": False})
    other = AutoGaussianMixture(bimodal_model, num_components=2)
    fallback = init(5, other)
    assert other._init_programs["tuned"] is None and "plain" in other._init_programs
    tol = 1e-10 if X64 else 1e-4
    for k in first:
        np.testing.assert_allclose(fallback[k], first[k], atol=tol)


def test_location_units():
    """The units of the location steps: the refined fits' standard deviations where the
    Newton refinement certified a mode (each component of the bimodal model sits on one; the
    standard deviation of each half of the posterior, by quadrature, as in
    ``test_initial_components_on_different_modes``), 1 without the refinement and for
    ``"spread"``, and 1 for a fit whose Hessian was not positive definite (NaN factor)."""
    guide, params = fitted_guide(bimodal_model, num_components=2, covariance="diag")
    np.testing.assert_array_equal(params["auto_locs_unit"], params["auto_scale"])
    np.testing.assert_array_equal(params["auto_locs_offset"], np.zeros((2, 1)))
    np.testing.assert_allclose(np.asarray(params["auto_locs_unit"])[:, 0], bimodal_half_sd(), rtol=0.25)
    for options in ({"init_newton_steps": 0}, {"init_method": "spread"}):
        _, params = fitted_guide(bimodal_model, num_components=2, **options)
        np.testing.assert_array_equal(params["auto_locs_unit"], np.ones((2, 1)))
    scales = jnp.asarray([[0.5, 2.0], [0.1, 0.3]])
    factors = jnp.asarray([np.diag([0.5, 2.0]), np.full((2, 2), np.nan)])
    np.testing.assert_array_equal(location_units(scales, is_factor(factors)), [[0.5, 2.0], [1.0, 1.0]])
    np.testing.assert_array_equal(location_units(scales, None), np.ones((2, 2)))


def test_spread_method_keeps_components_around_init_point():
    guide, params = fitted_guide(bimodal_model, num_components=2, init_method="spread", init_scale=0.2)
    locs = guide_locs(params)
    np.testing.assert_allclose(locs.mean(0), guide._init_latent, atol=1e-5)
    np.testing.assert_allclose(np.sqrt(np.mean(np.sum((locs - locs.mean(0)) ** 2, -1))), 0.6, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"init_method": "prior"}, "init_method"),
        ({"num_init_fits": 1}, "num_init_fits"),
        ({"init_fit_steps": 0}, "init_fit_steps"),
        ({"init_fit_lr": 0.0}, "init_fit_lr"),
        ({"init_tolerance": -1.0}, "init_tolerance"),
        ({"weight_step_scale": 0.0}, "weight_step_scale"),
    ],
)
def test_bad_init_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AutoGaussianMixture(bimodal_model, num_components=2, **kwargs)


# -- the kernels --------------------------------------------------------------------------


def test_fit_diagonal_gaussians_recovers_gaussian_target():
    """ADVI on a diagonal Gaussian target: the optimum is the target, ELBO = log Z = 0."""
    mean = jnp.array([1.0, -2.0, 0.5])
    sd = jnp.array([0.5, 2.0, 1.0])
    potential = lambda z: -jnp.sum(jax.scipy.stats.norm.logpdf(z, mean, sd))  # noqa: E731
    starts = jax.random.normal(jax.random.PRNGKey(0), (8, 3)) * 3.0
    locs, scales, scores = fit_diagonal_gaussians(
        potential, starts, jnp.log(0.1), jax.random.PRNGKey(1), num_steps=1500, learning_rate=0.05, num_particles=2
    )
    assert np.all(np.abs(np.asarray(locs) - np.asarray(mean)) < 0.25 * np.asarray(sd)), locs
    np.testing.assert_allclose(scales, np.broadcast_to(sd, (8, 3)), rtol=0.15)
    # the score averages ELBO estimates over the last half of the steps (early ones below 0)
    d_entropy = 0.5 * 3 * (1 + np.log(2 * np.pi))  # the constant the kernel's ELBO leaves out
    np.testing.assert_allclose(np.asarray(scores) + d_entropy, 0.0, atol=0.3)


def test_choose_separated_picks_farthest_eligible():
    locs = jnp.array([[0.0], [0.1], [5.0], [-5.0], [20.0]])
    scales = jnp.ones((5, 1))
    scores = jnp.array([0.0, -0.1, -1.0, -2.0, -50.0])  # the last is not eligible
    # jitted, as the guide calls it (eagerly each operation would compile on its own)
    choose = jax.jit(choose_separated, static_argnums=3)
    chosen = np.asarray(choose(locs, scales, scores, 3, tolerance=6.0))
    assert chosen[0] == 0
    assert set(chosen[1:].tolist()) == {2, 3}
    # a farthest point is replaced by the best-scoring fit of its cluster
    locs2 = jnp.array([[0.0], [5.0], [5.5], [-5.0]])
    chosen = np.asarray(choose(locs2, jnp.ones((4, 1)), jnp.array([0.0, -0.5, -1.0, -3.0]), 2, 6.0))
    assert chosen.tolist() == [0, 1]  # 2 is the farthest from 0, 1 the best of its cluster
    # more choices than eligible fits: the best remaining ones, no repeats
    chosen = np.asarray(choose(locs, scales, scores, 5, tolerance=0.5))
    assert sorted(chosen.tolist()) == [0, 1, 2, 3, 4]


def test_bhattacharyya_distance_against_quadrature():
    # -ln of the integral of sqrt(p q) (SciPy quadrature, per coordinate: the coefficient of
    # diagonal Gaussians is the product of the coordinates')
    a, s = np.array([0.0, 1.0, -2.0]), np.array([0.01, 1.0, 3.0])
    b, t = np.array([0.5, 1.0, 1.0]), np.array([1.0, 1.0, 0.5])
    coefficient = [
        integrate.quad(lambda x: np.sqrt(stats.norm.pdf(x, a[i], s[i]) * stats.norm.pdf(x, b[i], t[i])),
                       -30, 30, points=[a[i], b[i]], limit=200, epsabs=1e-13)[0]
        for i in range(3)
    ]
    got = bhattacharyya_distance(jnp.asarray(a), jnp.asarray(s), jnp.asarray(b), jnp.asarray(t))
    np.testing.assert_allclose(float(got), -np.sum(np.log(coefficient)), rtol=1e-5)


def test_choose_separated_tells_nested_widths_apart():
    # a narrow fit inside a wide one (the spike and the slab of a spike-and-slab posterior)
    # is another component: chosen second before a second fit of the best one's mode, which
    # scores better; equal widths at the same distance are still one mode (the best's fits)
    locs = jnp.array([[0.0], [0.0], [0.495], [0.49]])
    scales = jnp.array([[0.01], [0.01], [0.995], [0.995]])
    scores = jnp.array([-3.15, -3.15, -5.23, -5.23])
    choose = jax.jit(choose_separated, static_argnums=3)
    assert sorted(np.asarray(choose(locs, scales, scores, 2, 6.0)).tolist()) in ([0, 2], [0, 3])
    same = jnp.array([[0.0], [0.0], [0.495], [0.49]])
    wide = jnp.full((4, 1), 0.995)
    assert np.asarray(choose(same, wide, scores, 2, 6.0)).tolist() == [0, 1]


def test_choose_separated_program_does_not_grow_with_the_number_of_components():
    # the greedy choice is one rolled loop: its program has as many equations for K = 256 as
    # for K = 3 (a loop unrolled in Python had K - 1 copies of its body; the guide's first
    # SVI.init at K = 256 compiled for 24 s instead of 6, benchmarks/init_components.py)
    def size(K):
        M = 16 * K
        jaxpr = jax.make_jaxpr(choose_separated, static_argnums=(3, 4))(
            jnp.zeros((M, 2)), jnp.ones((M, 2)), jnp.zeros(M), K, 6.0)
        return len(jaxpr.jaxpr.eqns)

    assert size(3) == size(256)


def test_choose_separated_spreads_spare_components_over_the_modes():
    # More components than modes: after one choice per mode, each next choice goes to the
    # mode with the fewest (the least crowded, crowding = sum over the choices of exp(-B),
    # B the Bhattacharyya distance), not to the widest spread of fits. Mode A's fits are
    # spread 0.3 apart, mode B's 0.05: farthest-point selection put the spare components all in A (3:1, and
    # the fitted masses then stayed near 3:1 on benchmarks/posteriors.py's d50 model).
    a = [0.0, 0.3, -0.3, 0.15, -0.15]
    b = [10.0, 10.05, 9.95, 10.02, 9.98]
    c = [-10.0, -10.02, -9.99]
    locs = jnp.asarray(a + b + c)[:, None]
    scales = jnp.ones((len(a) + len(b) + len(c), 1))
    scores = -0.01 * jnp.arange(locs.shape[0], dtype=locs.dtype)  # all eligible, fit 0 the best
    choose = jax.jit(choose_separated, static_argnums=3)

    def per_mode(chosen):
        mode = np.where(chosen < len(a), 0, np.where(chosen < len(a) + len(b), 1, 2))
        return np.bincount(mode, minlength=3).tolist()

    two = slice(0, len(a) + len(b))
    for k, counts in [(2, [1, 1, 0]), (4, [2, 2, 0]), (6, [3, 3, 0])]:
        chosen = np.asarray(choose(locs[two], scales[two], scores[two], k, 6.0))
        assert len(set(chosen.tolist())) == k and per_mode(chosen) == counts, (k, chosen)
    for k, counts in [(3, [1, 1, 1]), (6, [2, 2, 2])]:
        chosen = np.asarray(choose(locs, scales, scores, k, 6.0))
        assert len(set(chosen.tolist())) == k and per_mode(chosen) == counts, (k, chosen)
    # five of three modes: two in the best mode (A), then one more in B or C
    chosen = np.asarray(choose(locs, scales, scores, 5, 6.0))
    assert sorted(per_mode(chosen)) == [1, 2, 2] and per_mode(chosen)[0] == 2, chosen
    # two poorly converged fits of mode A, 3 sd from its centre and 5 nats below the best
    # (as without the Newton refinement at d = 200): less crowded than B's fits, but their
    # score keeps them from taking B's spare component (3:1 before the score's term)
    locs = jnp.asarray([0.0, 0.1, -0.1, 3.0, -3.0, 10.0, 10.05, 9.95])[:, None]
    scores = jnp.asarray([0.0, -0.01, -0.01, -5.0, -5.0, -0.02, -0.02, -0.02])
    chosen = np.asarray(choose(locs, jnp.ones((8, 1)), scores, 4, 6.0))
    assert np.bincount((chosen >= 5).astype(int), minlength=2).tolist() == [2, 2], chosen


def test_laplace_scale_tril_exact_for_gaussian_and_falls_back():
    """For a Gaussian potential the Laplace covariance is the target's (closed form:
    chol(Sigma) by NumPy); at a point where the Hessian is not positive definite the
    factor is diag(fallback scales)."""
    cov = np.array([[1.0, 0.6, 0.0], [0.6, 2.0, -0.5], [0.0, -0.5, 0.5]])
    prec = jnp.asarray(np.linalg.inv(cov))
    mean = jnp.array([0.3, -1.0, 2.0])
    gaussian = lambda z: 0.5 * (z - mean) @ prec @ (z - mean)  # noqa: E731
    locs = jnp.array([[0.0, 0.0, 0.0], [1.0, 2.0, -1.0]])  # exact anywhere: the Hessian is constant
    laplace = jax.jit(lambda l: laplace_scale_tril(gaussian, l, jnp.ones((2, 3))))
    # no LAPACK call: batched over the fits, one could deadlock on 2 cores (test_no_deadlock)
    assert "lapack" not in laplace.lower(locs).as_text().lower()
    tril = np.asarray(laplace(locs))
    tol = 1e-10 if X64 else 1e-5
    for k in range(2):
        np.testing.assert_allclose(tril[k], np.linalg.cholesky(cov), atol=tol)
    # double well U(a) = (a^2 - 1)^2: U'' = 12 a^2 - 4 < 0 at a = 0 (fallback), 8 at a = 1
    well = lambda z: (z[0] ** 2 - 1.0) ** 2  # noqa: E731
    tril = np.asarray(laplace_scale_tril(well, jnp.array([[0.0], [1.0]]), jnp.array([[0.7], [0.7]])))
    np.testing.assert_allclose(tril[:, 0, 0], [0.7, 1 / np.sqrt(8.0)], rtol=1e-5)


def test_newton_refine_solves_a_gaussian_from_far_away():
    """A correlated Gaussian potential whose mean is 100-5000 units from the starts and
    whose scales span 1e-3..1e2: one Newton step is exact. Expected values in closed form
    (NumPy): the mean, the mean-field standard deviations 1 / sqrt(P_ii) (P the precision),
    equal scores for equal fits (their points are common), each the fit's ELBO."""
    rng = np.random.default_rng(0)
    sd = np.array([1e-3, 1.0, 1e2])
    corr = np.array([[1.0, 0.3, 0.0], [0.3, 1.0, -0.5], [0.0, -0.5, 1.0]])
    cov = corr * np.outer(sd, sd)
    prec = np.linalg.inv(cov)
    mean = np.array([5000.0, -100.0, 300.0])
    f = jnp.float64 if X64 else jnp.float32
    prec_j, mean_j = jnp.asarray(prec, f), jnp.asarray(mean, f)
    gaussian = lambda z: 0.5 * (z - mean_j) @ prec_j @ (z - mean_j)  # noqa: E731
    starts = jnp.asarray(rng.normal(size=(6, 3)) * 2.0, f)
    refine = jax.jit(lambda l, s: newton_refine(gaussian, l, s, num_steps=3, num_draws=64))
    assert "lapack" not in refine.lower(starts, jnp.ones_like(starts)).as_text().lower()
    locs, scales, scores, laplace = (np.asarray(v) for v in refine(starts, jnp.ones_like(starts)))
    # within 1e-6 (float64) / 1e-3 (float32) posterior sds, plus 8 spacings of the float
    # type at the mean (float32's spacing at 5000 is 5e-4, half the smallest sd)
    eps = np.finfo(np.float64 if X64 else np.float32).eps
    tol = (1e-6 if X64 else 1e-3) * sd + 8 * eps * np.abs(mean)
    assert np.all(np.abs(locs - mean) <= tol), (locs - mean, tol)
    np.testing.assert_allclose(scales, np.broadcast_to(1 / np.sqrt(np.diag(prec)), (6, 3)), rtol=1e-6 if X64 else 2e-3)
    assert np.all(np.isfinite(scores))
    np.testing.assert_allclose(scores, scores[0], atol=1e-6 if X64 else 1e-2)
    # each score estimates -E[U] + sum log s = -d / 2 + sum log s (closed form; U has no
    # constant); the 64 quasi-random points within 0.004 here (64 i.i.d. draws: sd 0.18);
    # float32 rounds the points' first coordinate (mean 5000, sd 1e-3, spacing 5e-4)
    np.testing.assert_allclose(scores, -1.5 - 0.5 * np.sum(np.log(np.diag(prec))), atol=0.02 if X64 else 0.1)
    # the Laplace factors: chol(H^-1) = chol(cov) by NumPy, row i in units of sd_i
    expected = np.linalg.cholesky(cov) / sd[:, None]
    np.testing.assert_allclose(laplace / sd[:, None], np.broadcast_to(expected, (6, 3, 3)), atol=1e-8 if X64 else 1e-4)


def test_newton_refine_never_raises_the_potential_and_keeps_non_convex_points():
    """Rosenbrock in 2-D plus a double well: from 40 random starts the potential after
    refinement is never above the start's; at a = 0 of the double well U(a) = (a^2 - 1)^2
    (U'' = -4: not positive definite) the point and its scale stay; started beside a
    minimum it converges to it (a = +-1, scale 1 / sqrt(U''(1)) = 1 / sqrt(8))."""

    def potential(z):
        return (1 - z[0]) ** 2 + 10.0 * (z[1] - z[0] ** 2) ** 2 + (z[2] ** 2 - 1.0) ** 2

    rng = np.random.default_rng(1)
    starts = jnp.asarray(rng.uniform(-2, 2, size=(40, 3)))
    refine = jax.jit(lambda l, s: newton_refine(potential, l, s, num_steps=8, num_draws=16))
    locs = refine(starts, jnp.ones_like(starts))[0]
    before, after = (np.asarray(jax.vmap(potential)(v)) for v in (starts, locs))
    assert np.all(after <= before * (1 + 1e-6) + 1e-7), (before, after)
    # one-dimensional double well alone: a saddle-free check of the fallback and convergence
    well = lambda z: (z[0] ** 2 - 1.0) ** 2  # noqa: E731
    locs, scales, _, _ = newton_refine(well, jnp.array([[0.0], [0.8], [-1.3]]), jnp.full((3, 1), 0.7),
                                       num_steps=8, num_draws=16)
    np.testing.assert_allclose(np.asarray(locs)[:, 0], [0.0, 1.0, -1.0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(scales)[:, 0], [0.7, 1 / np.sqrt(8.0), 1 / np.sqrt(8.0)], rtol=1e-4)


def badly_scaled_regression(d=120, seed=1):
    """``(model, mean, cov)``: ``b ~ N(0, I_d)``, ``y ~ N(X b, I)`` with ``2 d`` rows of
    correlated covariates on scales ``10^-1 .. 10^2.5``, and its posterior in closed form
    (NumPy float64; posterior standard deviations about ``3e-4 .. 0.6``)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(2 * d, d)) @ (np.eye(d) + 0.3 * rng.normal(size=(d, d)) / np.sqrt(d))
    X = X * 10 ** rng.uniform(-1, 2.5, size=d)
    y = X @ rng.normal(size=d) + rng.normal(size=2 * d)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def model():
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        numpyro.sample("y", dist.Normal(Xj @ b, 1.0).to_event(1), obs=yj)

    cov = np.linalg.inv(X.T @ X + np.eye(d))
    return model, cov @ X.T @ y, cov


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_initial_components_exact_for_a_badly_scaled_regression_beyond_newton_max_dim(covariance):
    # d = 120 > NEWTON_MAX_DIM: the fits (200 Adam steps) end tens of standard deviations
    # from the mean (median 35, largest 340) with scales up to 290 times too wide; before
    # the Newton-CG refinement they were the initial components (a d = 150 regression of this kind started 10^5-10^6
    # nats below the evidence and ended 22-76 below after 3000 steps). Now the refinement
    # solves the Gaussian posterior: means, Laplace covariance (full) or mean-field standard
    # deviations 1 / sqrt(P_ii) (diag), and location units, against the closed form
    model, mean, cov = badly_scaled_regression()
    guide, params = fitted_guide(model, 0, num_components=2, covariance=covariance)
    sd = np.sqrt(np.diag(cov))
    err = np.abs(guide_locs(params) - mean) / sd
    assert err.max() < (1e-5 if X64 else 0.05), err.max()
    mean_field = 1 / np.sqrt(np.diag(np.linalg.inv(cov)))
    rtol = 1e-6 if X64 else 5e-3
    np.testing.assert_allclose(np.asarray(params["auto_locs_unit"]), np.broadcast_to(mean_field, (2, 120)), rtol=rtol)
    if covariance == "full":
        tril = np.asarray(params["auto_scale_tril"], np.float64)
        np.testing.assert_allclose(tril[0] @ tril[0].T / np.outer(sd, sd), cov / np.outer(sd, sd),
                                   atol=1e-6 if X64 else 5e-3)
    else:
        np.testing.assert_allclose(np.asarray(params["auto_scale"]), np.broadcast_to(mean_field, (2, 120)), rtol=rtol)


def banded_regression(d, seed=2):
    """``(model, mean, precision)``: ``b ~ N(0, I_d)``, ``y_i ~ N(c_i b_i + c_{i+1} b_{i+1} / 2, 1)``
    (``i < d``; covariates ``c_i`` on scales ``10^-1 .. 10^2.5``): the badly scaled
    regression of :func:`badly_scaled_regression` with a banded design, whose log density
    costs ``O(d)`` (thousands of dimensions in a test); posterior in closed form (NumPy
    float64)."""
    rng = np.random.default_rng(seed)
    c = 10 ** rng.uniform(-1, 2.5, size=d)
    A = np.zeros((d - 1, d))
    A[np.arange(d - 1), np.arange(d - 1)] = c[:-1]
    A[np.arange(d - 1), np.arange(1, d)] = 0.5 * c[1:]
    y = A @ rng.normal(size=d) + rng.normal(size=d - 1)
    cj, yj = jnp.asarray(c), jnp.asarray(y)

    def model():
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        cb = cj * b
        numpyro.sample("y", dist.Normal(cb[:-1] + 0.5 * cb[1:], 1.0).to_event(1), obs=yj)

    precision = A.T @ A + np.eye(d)
    return model, np.linalg.solve(precision, A.T @ y), precision


@pytest.mark.parametrize("covariance", ["diag", "lowrank"])
def test_initial_components_exact_beyond_the_dense_preconditioner(covariance):
    # d = 4100 > DENSE_PRECONDITIONER_MAX_DIM: the Newton-CG refinement preconditioned by
    # the diagonal of the Hessian at the best fit, no d x d matrix formed. Before it (no
    # refinement beyond d = 1000) the components started at the 200-step Adam fits, tens of
    # standard deviations from the mean with scales far too wide (a d = 2000 regression
    # started 2.4e8 nats below the evidence). Means, mean-field standard deviations
    # 1 / sqrt(P_ii) (the scale, or the low-rank cov_diag), location units and the low-rank
    # factor in those units (its initial value 0.1 G / sqrt(rank)) against the closed form
    d = 4100
    assert NEWTON_CG_MAX_DIM >= d > DENSE_PRECONDITIONER_MAX_DIM
    model, mean, precision = banded_regression(d)
    guide, params = fitted_guide(model, 0, num_components=2, covariance=covariance)
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    err = np.abs(guide_locs(params) - mean) / sd
    assert err.max() < (1e-5 if X64 else 0.05), err.max()
    mean_field = np.broadcast_to(1 / np.sqrt(np.diag(precision)), (2, d))
    rtol = 1e-6 if X64 else 5e-3
    np.testing.assert_allclose(np.asarray(params["auto_locs_unit"]), mean_field, rtol=rtol)
    if covariance == "diag":
        np.testing.assert_allclose(np.asarray(params["auto_scale"]), mean_field, rtol=rtol)
    else:
        np.testing.assert_allclose(np.asarray(params["auto_cov_diag"]), mean_field**2, rtol=2 * rtol)
        # the factor from the Laplace covariance's leading eigenpairs (randomised Nystrom):
        # at least 60% of the gap between the mean-field start and the exact probabilistic-PCA
        # factor of the same rank (measured 79%, float32: KL 200.4 against 217.0 and 196.0);
        # before, a small random factor (0.1 G / sqrt(rank) in units): KL above the mean field's
        for k in range(2):
            kl, mean_field_kl, ppca_kl = tridiagonal_lowrank_kls(params, np.diag(precision), np.diag(precision, 1), k)
            assert kl < ppca_kl + 0.4 * (mean_field_kl - ppca_kl), (kl, mean_field_kl, ppca_kl)


def tridiagonal_lowrank_kls(params, diagonal, off_diagonal, k):
    """``(KL(q_k || p), KL(mean field || p), KL(PPCA || p))`` without the means' term: ``q_k``
    the low-rank guide's component ``k`` (``params``; covariance ``diag(cov_diag) + W W^T``,
    ``W = locs_unit * cov_factor``), the mean-field Gaussian ``diag(1 / P_ii)`` and the best
    rank-``r`` probabilistic-PCA correction of it, ``S (I + V diag(lambda - 1) V^T) S``
    (``(lambda, V)`` the ``r`` largest eigenpairs of ``S^-1 P^-1 S^-1``, ``S = diag(P_ii)^-1/2``),
    for a Gaussian ``p`` with the tridiagonal precision ``P`` (``diagonal``, ``off_diagonal``).
    Closed forms in the scaled coordinates, ``A = S P S``: ``KL = (tr(A C) - d - log det C -
    log det A) / 2`` with SciPy's banded Cholesky and tridiagonal eigensolver (float64)."""
    from scipy import linalg

    d = diagonal.shape[0]
    s = 1 / np.sqrt(diagonal)
    off = off_diagonal * s[:-1] * s[1:]  # A's off-diagonal; its diagonal is 1
    log_det_a = 2 * np.sum(np.log(linalg.cholesky_banded(np.vstack([np.r_[0.0, off], np.ones(d)]))[1]))
    unit = np.asarray(params["auto_locs_unit"][k], np.float64)
    w = np.asarray(params["auto_cov_factor"][k], np.float64) * (unit / s)[:, None]
    var = np.asarray(params["auto_cov_diag"][k], np.float64) / s**2
    a_w = w.copy()
    a_w[:-1] += off[:, None] * w[1:]
    a_w[1:] += off[:, None] * w[:-1]
    log_det_c = np.sum(np.log(var)) + np.linalg.slogdet(np.eye(w.shape[1]) + (w / var[:, None]).T @ w)[1]
    kl = 0.5 * (np.sum(var) + np.sum(w * a_w) - d - log_det_c - log_det_a)
    lam = 1 / linalg.eigh_tridiagonal(np.ones(d), off, select="i", select_range=(0, w.shape[1] - 1),
                                      eigvals_only=True)
    lam = np.maximum(lam, 1.0)
    return kl, -0.5 * log_det_a, 0.5 * (np.sum(1 - 1 / lam) - np.sum(np.log(lam)) - log_det_a)


def test_initial_components_certify_a_random_walk_beyond_the_dense_preconditioner():
    # d = 4100 > DENSE_PRECONDITIONER_MAX_DIM: a GaussianRandomWalk observed with noise
    # (random_walk_posterior; condition number about 1e4, constant diagonal). Preconditioned
    # by the Hessian's diagonal (the guide's choice here before), the conjugate gradients did
    # not converge, no fit's mode was certified and the location steps stayed in absolute
    # units, Adam's 0.01 being 0.7 conditional standard deviations here (measured with the
    # diagonal: these means 32.9 standard deviations off; the d = 5000 random walk of
    # benchmarks/high_dim_init.py ended 3488 nats below the evidence after 3000 steps, from
    # 1809 at the start). The blocks of the Hessian certify
    # the modes: means within 0.05 conditional standard deviations 1 / sqrt(P_ii) of the
    # posterior mean (closed form, SciPy), units and scales those standard deviations
    d = 4100
    assert NEWTON_CG_MAX_DIM >= d > DENSE_PRECONDITIONER_MAX_DIM
    y, mean, precision_diagonal = random_walk_posterior(d, 0.02, seed=3)
    yj = jnp.asarray(y)

    def model():
        x = numpyro.sample("x", dist.GaussianRandomWalk(0.02, num_steps=d))
        numpyro.sample("y", dist.Normal(x, 1.0).to_event(1), obs=yj)

    guide, params = fitted_guide(model, 0, num_components=2, covariance="diag")
    sd = np.broadcast_to(1 / np.sqrt(precision_diagonal), (2, d))
    err = np.abs(guide_locs(params) - mean) / sd
    assert err.max() < (1e-5 if X64 else 0.05), err.max()
    rtol = 1e-6 if X64 else 5e-3
    np.testing.assert_allclose(np.asarray(params["auto_locs_unit"]), sd, rtol=rtol)
    np.testing.assert_allclose(np.asarray(params["auto_scale"]), sd, rtol=rtol)


def log_gamma_model():
    """``x ~ Gamma(1, 1)^150``: in unconstrained space (``z = log x``) a product of skewed
    log-Gamma(1) densities ``exp(z - e^z)``, normalised (``log Z = 0``); the best Gaussian
    per coordinate has mean -1/2 and sd 1 and is ``1.5 - (1 + log 2 pi) / 2 = 0.0811`` nats
    from it (closed form; see ``test_newton_cg_refine_keeps_a_fit_better_than_the_mode``)."""
    numpyro.sample("x", dist.Gamma(1.0, 1.0).expand([150]).to_event(1))


def test_initial_components_on_a_skewed_posterior_beyond_newton_max_dim():
    # the Laplace covariance (covariance="full") only where the refinement certified a mode:
    # the fits kept here (ADVI means, better than the mode for this skewed posterior) are
    # not at one, and the Laplace covariance at a poorly converged coordinate (z = -2.9:
    # U'' = e^z, sd 4.2) put mass where e^z explodes: the initial guide was 8e11 nats from
    # the posterior for this test's first key (42 and 204 for SVI.init with keys 0 and 1;
    # 307 and 35 there without any refinement); now
    # diag(scales) there: within 50% of the best Gaussian's 0.0811 * 150 = 12.2 (K = 2; 14-15.3
    # measured, the fits after 200 Adam steps)
    best = (1.5 - 0.5 * (1 + np.log(2 * np.pi))) * 150
    for seed in range(2):
        guide, params = fitted_guide(log_gamma_model, seed, num_components=2)
        gap = float(Trace_ELBO(num_particles=4000).loss(jax.random.PRNGKey(7), params, log_gamma_model, guide))
        assert gap < 1.5 * best, (seed, gap, best)


def test_conjugate_gradient_solves_and_truncates():
    """Against NumPy's solve on a positive-definite system (d = 20, 20 products: exact up to
    rounding), with a diagonal preconditioner; a direction of negative curvature first:
    ``x = -P g`` (the preconditioned steepest descent), not converged."""
    rng = np.random.default_rng(3)
    a = rng.normal(size=(20, 20))
    h = a @ a.T / 20 + np.diag(10.0 ** rng.uniform(-2, 2, 20))
    g = rng.normal(size=20)
    f = jnp.float64 if X64 else jnp.float32
    hj, gj, pj = jnp.asarray(h, f), jnp.asarray(g, f), jnp.asarray(1 / np.diag(h), f)
    tol = 1e-12 if X64 else 1e-6
    x, converged = jax.jit(lambda: conjugate_gradient(lambda v: hj @ v, gj, lambda r: pj * r, 20, tol))()
    assert bool(converged)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(h, -g), rtol=1e-7 if X64 else 2e-3)
    indefinite = jnp.asarray(np.diag([-1.0, 2.0]), f)
    # g = (1, 0): the first direction -P g = (-0.5, 0) has curvature -0.25
    x, converged = conjugate_gradient(lambda v: indefinite @ v, jnp.asarray([1.0, 0.0], f),
                                      lambda r: 0.5 * r, 5, 1e-6)
    assert not bool(converged)
    np.testing.assert_allclose(np.asarray(x), [-0.5, 0.0])
    # g = (1, 1): the first direction (-0.5, -0.5) has curvature 0.25 > 0, its step
    # x = 4 p = (-2, -2); the second, (-3.5, -2), curvature -4.25: truncated there
    x, converged = conjugate_gradient(lambda v: indefinite @ v, jnp.asarray([1.0, 1.0], f),
                                      lambda r: 0.5 * r, 5, 1e-6)
    assert not bool(converged)
    np.testing.assert_allclose(np.asarray(x), [-2.0, -2.0])


def badly_scaled_gaussian(seed, condition, d=150):
    """``(potential, starts (4, d), precision, sd, mean, dtype)``: a Gaussian potential with
    marginal standard deviations ``sd = 1e-3 .. 1e2`` (geometric), a correlation matrix of
    condition number about ``condition`` (a random rotation of ``geomspace(1, condition)``,
    rescaled) and mean 10-1000 units from the standard normal ``starts``."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    corr_like = q @ np.diag(np.geomspace(1.0, condition, d)) @ q.T
    sd = np.geomspace(1e-3, 1e2, d)
    w = np.sqrt(np.diag(corr_like))
    prec = np.linalg.inv(corr_like / np.outer(w, w) * np.outer(sd, sd))
    mean = rng.uniform(10, 1000, d) * rng.choice([-1, 1], d)
    f = jnp.float64 if X64 else jnp.float32
    prec_j, mean_j = jnp.asarray(prec, f), jnp.asarray(mean, f)
    potential = lambda z: 0.5 * (z - mean_j) @ prec_j @ (z - mean_j)  # noqa: E731
    return potential, jnp.asarray(rng.normal(size=(4, d)), f), prec, sd, mean, f


def test_newton_cg_refine_solves_a_badly_scaled_gaussian_from_far_away():
    """Beyond NEWTON_MAX_DIM: a correlated Gaussian potential in d = 150 with marginal
    standard deviations 1e-3..1e2 and correlations of condition number about 1e3, mean 10-1000
    units from the starts, whose scales (1.0) say nothing about it. The one Hessian, at the
    reference fit, is the target's, so the preconditioned conjugate gradients converge in one
    product and one Newton step is exact. Expected values in closed form (NumPy): the mean,
    the mean-field standard deviations 1 / sqrt(P_ii) (the control variate makes the
    diagonal's estimate exact: H - H_0 = 0), a certified mode for every fit, and scores equal
    to each other and near -d / 2 + sum log s (QMC points in 150 dimensions)."""
    d = 150
    gaussian, starts, prec, sd, mean, f = badly_scaled_gaussian(0, 1e3, d)
    refine = jax.jit(lambda l, s: newton_cg_refine(gaussian, l, s, 0, num_steps=2, num_draws=64))
    assert "lapack" not in refine.lower(starts, jnp.ones_like(starts)).as_text().lower()
    locs, scales, scores, at_mode = (np.asarray(v) for v in refine(starts, jnp.ones_like(starts)))
    assert at_mode.all()
    err = np.abs(locs - mean) / sd  # in posterior standard deviations
    assert err.max() < (1e-6 if X64 else 0.05) + 8 * np.finfo(f).eps * np.max(np.abs(mean) / sd), err.max()
    np.testing.assert_allclose(scales, np.broadcast_to(1 / np.sqrt(np.diag(prec)), (4, d)), rtol=1e-6 if X64 else 2e-3)
    np.testing.assert_allclose(scores, scores[0], atol=1e-6 if X64 else 0.05)
    np.testing.assert_allclose(scores, -d / 2 - 0.5 * np.sum(np.log(np.diag(prec))), atol=3.0)


def test_newton_cg_refine_diagonal_preconditioner_solves_a_badly_scaled_gaussian():
    """The matrix-free refinement (``preconditioner="diagonal"``, beyond
    DENSE_PRECONDITIONER_MAX_DIM): a Gaussian potential in d = 150 with marginal standard
    deviations 1e-3..1e2 and correlations of condition number 30 (so about 30 after the
    Jacobi preconditioner, whose diagonal is the Hessian's, exactly), mean 10-1000 units from
    the starts. The conjugate gradients do not converge within one Newton step's 16 products
    here, but the steps still shrink the error; the last solve (up to CERTIFY_ITERATIONS
    products) certifies every fit (with 16 products the certificate failed at random on a
    d = 2000 regression). Closed form (NumPy): the mean, the mean-field standard deviations
    1 / sqrt(P_ii) (exact: H - H_0 = 0), equal scores; no factorisation in the program."""
    d = 150
    gaussian, starts, prec, sd, mean, f = badly_scaled_gaussian(4, 30.0, d)
    options = dict(num_steps=6, num_draws=64, preconditioner="diagonal")
    refine = jax.jit(lambda l, s: newton_cg_refine(gaussian, l, s, 0, **options))
    text = refine.lower(starts, jnp.ones_like(starts)).as_text().lower()
    assert "lapack" not in text and "cholesky" not in text
    locs, scales, scores, at_mode = (np.asarray(v) for v in refine(starts, jnp.ones_like(starts)))
    assert at_mode.all()
    err = np.abs(locs - mean) / sd
    assert err.max() < (1e-5 if X64 else 0.05) + 8 * np.finfo(f).eps * np.max(np.abs(mean) / sd), err.max()
    np.testing.assert_allclose(scales, np.broadcast_to(1 / np.sqrt(np.diag(prec)), (4, d)), rtol=1e-6 if X64 else 2e-3)
    np.testing.assert_allclose(scores, scores[0], atol=1e-6 if X64 else 0.05)
    with pytest.raises(ValueError, match="preconditioner"):
        newton_cg_refine(gaussian, starts, jnp.ones_like(starts), 0, num_steps=1, num_draws=4, preconditioner="lu")


#: the preconditioners of newton_cg_refine, as keyword arguments: blocks of 32 split the
#: tests' d = 120 into four, the last padded
PRECONDITIONERS = {"dense": {"preconditioner": "dense"}, "diagonal": {"preconditioner": "diagonal"},
                   "blocks": {"preconditioner": "blocks", "block_size": 32}}


def random_walk_posterior(d, step_sd, seed=0):
    """``(y, mean, precision_diagonal)``: data ``y`` of a latent random walk
    ``x_t - x_{t-1} ~ N(0, step_sd)`` (``x_0 = 0``; NumPyro's ``GaussianRandomWalk``)
    observed with unit noise, ``y_t ~ N(x_t, 1)``, and its posterior: Gaussian with the
    tridiagonal precision ``D^T D / step_sd^2 + I`` (``D`` the first differences),
    correlation length about ``1 / step_sd`` steps, condition number about
    ``4 / step_sd^2``, constant diagonal (so the Jacobi preconditioner is no
    preconditioner); mean by SciPy's banded solver (float64)."""
    from scipy import linalg

    rng = np.random.default_rng(seed)
    y = np.cumsum(step_sd * rng.normal(size=d)) + rng.normal(size=d)
    upper = np.zeros((2, d))  # upper banded: the superdiagonal, then the diagonal
    upper[0, 1:] = -1 / step_sd**2
    upper[1] = np.r_[np.full(d - 1, 2.0), 1.0] / step_sd**2 + 1.0
    return y, linalg.solveh_banded(upper, y), upper[1]


def test_newton_cg_refine_block_preconditioner_solves_a_random_walk():
    """``preconditioner="blocks"`` (the guide's beyond DENSE_PRECONDITIONER_MAX_DIM): the
    posterior of a random walk of d = 600 steps (a GaussianRandomWalk observed with noise),
    condition number about 1e4, correlation length 50 steps. The diagonal blocks of 64 (the
    last padded: 600 = 9 x 64 + 24) hold nearly all of its correlation, so the conjugate
    gradients converge within the steps' products and every fit is certified at the mode;
    with the Jacobi preconditioner (the guide's choice there before) none was, and the means
    stayed up to 21 conditional standard deviations off (measured, float32; asserted below
    as "not all certified"). Closed form (SciPy, float64): the mean, the mean-field standard
    deviations ``1 / sqrt(P_ii)`` (exact: H - H_0 = 0); with a memory budget of 64
    Hessian-vector products at once, no 600 x 600 array in the program (the dense
    preconditioner's has them)."""
    d = 600
    y, mean, precision_diagonal = random_walk_posterior(d, 0.02)
    sd = 1 / np.sqrt(precision_diagonal)
    f = jnp.float64 if X64 else jnp.float32
    yj = jnp.asarray(y, f)
    starts = jnp.asarray(np.random.default_rng(1).normal(size=(4, d)), f)

    def potential(x):
        return 0.5 * jnp.sum(jnp.diff(x, prepend=0.0) ** 2) / 0.02**2 + 0.5 * jnp.sum((x - yj) ** 2)

    def refine(preconditioner, block_size=64):
        return jax.jit(lambda l, s: newton_cg_refine(potential, l, s, 0, num_steps=8, num_draws=16,
                                                     preconditioner=preconditioner, block_size=block_size,
                                                     budget=MemoryBudget(evaluation=1, limit=2 * 64)))

    def has_square(preconditioner):
        return f"tensor<{d}x{d}x" in refine(preconditioner).lower(starts, jnp.ones_like(starts)).as_text()

    assert has_square("dense") and not has_square("blocks")
    blocks = refine("blocks")
    locs, scales, _, at_mode = (np.asarray(v) for v in blocks(starts, jnp.ones_like(starts)))
    assert at_mode.all()
    err = np.abs(locs - mean) / sd
    assert err.max() < (1e-5 if X64 else 0.05), err.max()
    np.testing.assert_allclose(scales, np.broadcast_to(sd, (4, d)), rtol=1e-6 if X64 else 2e-3)
    at_mode = np.asarray(refine("diagonal", 1)(starts, jnp.ones_like(starts))[3])
    assert not at_mode.all()


def test_curvature_cov_factors_capture_a_random_walk_without_a_dense_matrix():
    """The low-rank factors of ``covariance="lowrank"`` beyond NEWTON_MAX_DIM: at the mode of
    the d = 600 random walk's posterior (random_walk_posterior; correlation length 50 steps,
    so far from the mean field: KL 202 nats), products with the Laplace covariance by
    conjugate gradients preconditioned by the Hessian's diagonal blocks of 64, and the
    randomised Nystrom approximation of its leading eigenpairs (rank 24). Against the exact
    probabilistic-PCA factor of that rank (SciPy's tridiagonal eigensolver, float64, through
    tridiagonal_lowrank_kls): at least 90% of its gain over the mean field (measured 99.95%
    in both float passes: KL 137.59 against 137.56; a random small factor, the guide's start
    before, adds to the mean field's 202.0). A component not usable (not at a certified
    mode) keeps the fallback, and with a budget of 64 Hessian-vector products no 600 x 600
    array is in the program."""
    d, rank = 600, 24
    y, mean, precision_diagonal = random_walk_posterior(d, 0.02)
    sd = 1 / np.sqrt(precision_diagonal)
    f = jnp.float64 if X64 else jnp.float32
    yj = jnp.asarray(y, f)

    def potential(x):
        return 0.5 * jnp.sum(jnp.diff(x, prepend=0.0) ** 2) / 0.02**2 + 0.5 * jnp.sum((x - yj) ** 2)

    budget = MemoryBudget(evaluation=1, limit=2 * 64)
    locs, units = jnp.asarray(np.stack([mean, mean]), f), jnp.asarray(np.stack([sd, sd]), f)
    fallback = jnp.full((2, d, rank), 0.5, f)

    def factors(locs, units):
        preconditioner = hessian_preconditioner(potential, locs[0], units[0], "blocks", block_size=64, budget=budget)
        return curvature_cov_factors(potential, locs, units, rank, jnp.array([True, False]), fallback,
                                     preconditioner, min_scale=0.1, budget=budget)

    lowered = jax.jit(factors).lower(locs, units)
    assert f"tensor<{d}x{d}x" not in lowered.as_text()
    w = np.asarray(lowered.compile()(locs, units), np.float64)
    np.testing.assert_array_equal(w[1], 0.5)
    params = {"auto_cov_factor": w / sd[:, None], "auto_locs_unit": sd[None], "auto_cov_diag": sd[None] ** 2}
    upper_off = -np.ones(d - 1) / 0.02**2
    kl, mean_field_kl, ppca_kl = tridiagonal_lowrank_kls(params, precision_diagonal, upper_off, 0)
    assert kl < ppca_kl + 0.1 * (mean_field_kl - ppca_kl), (kl, mean_field_kl, ppca_kl)


@pytest.mark.parametrize("preconditioner", sorted(PRECONDITIONERS))
def test_newton_cg_refine_never_raises_the_potential_and_finds_a_narrow_mode(preconditioner):
    """Non-Gaussian, d = 120: a chain of Rosenbrock terms plus double wells; from 8
    random starts the potential after refinement is never above the start's. A narrow
    isotropic well (sd 0.01) beside a wide one, with the reference at the wide one: a start
    inside the narrow well converges to its centre with scales 0.01 (the control variate's
    H - H_0 is diagonal there, so the diagonal estimate is exact; closed form)."""
    d = 120

    def potential(z):
        rosen = jnp.sum((1 - z[:-1:2]) ** 2 + 10.0 * (z[1::2] - z[:-1:2] ** 2) ** 2)
        return rosen + jnp.sum((z[:20] ** 2 - 1.0) ** 2)

    f = jnp.float64 if X64 else jnp.float32
    rng = np.random.default_rng(1)
    starts = jnp.asarray(rng.uniform(-2, 2, size=(8, d)), f)
    options = dict(num_steps=8, num_draws=16, **PRECONDITIONERS[preconditioner])
    locs = jax.jit(lambda l, s: newton_cg_refine(potential, l, s, 0, **options))(starts, jnp.ones_like(starts))[0]
    before, after = (np.asarray(jax.vmap(potential)(v)) for v in (starts, locs))
    assert np.all(after <= before * (1 + 1e-6) + 1e-5), (before, after)
    assert np.all(after < before)

    centre = jnp.asarray(np.full(d, 0.3), f)

    def spike_and_slab(z):  # -log(0.5 N(z; centre, 0.01^2 I) + 0.5 N(z; 0, I))
        narrow = -0.5 * jnp.sum((z - centre) ** 2) / 0.01**2 - d * jnp.log(0.01)
        return -jnp.logaddexp(narrow, -0.5 * jnp.sum(z**2))

    starts = jnp.stack([jnp.zeros(d, f), centre + 0.005 * jnp.asarray(rng.normal(size=d), f)])
    options = dict(num_steps=4, num_draws=16, **PRECONDITIONERS[preconditioner])
    refine = jax.jit(lambda l, s: newton_cg_refine(spike_and_slab, l, s, 0, **options))
    locs, scales, _, at_mode = refine(starts, jnp.ones_like(starts))
    np.testing.assert_allclose(np.asarray(locs[1]), np.asarray(centre), atol=1e-5)
    np.testing.assert_allclose(np.asarray(scales), np.stack([np.ones(d), np.full(d, 0.01)]), rtol=1e-3)
    assert np.asarray(at_mode).all()


@pytest.mark.parametrize("preconditioner", sorted(PRECONDITIONERS))
def test_newton_cg_refine_keeps_a_fit_better_than_the_mode(preconditioner):
    """A skewed posterior, d = 120: ``U(z) = sum_i (exp(z_i) - z_i)`` (a log-Gamma(1)
    coordinate each), mode at 0, whose best Gaussian (ADVI) has mean -1/2 and standard
    deviation 1 (closed form: ``E_q[-U] + sum log s = sum (m - exp(m + s^2 / 2) + log s)``,
    maximal at ``s^2 = 1``, ``m = -1/2``; -1.5 per coordinate, against ``-e^{1/2}`` at the
    mode with ``s = 1``: 17.8 nats lower in all). Given the ADVI optimum, the refinement keeps it
    (not certified at a mode); given a fit far from the mode (mean 3), it returns the
    refined one: the mode, ``s = 1 / sqrt(U'') = 1``, certified. Scores against the closed
    form (64 quasi-random points)."""
    d = 120
    potential = lambda z: jnp.sum(jnp.exp(z) - z)  # noqa: E731
    f = jnp.float64 if X64 else jnp.float32
    locs = jnp.asarray(np.stack([np.full(d, -0.5), np.full(d, 3.0)]), f)
    options = dict(num_steps=8, num_draws=64, **PRECONDITIONERS[preconditioner])
    refine = jax.jit(lambda l, s: newton_cg_refine(potential, l, s, 0, **options))
    out_locs, out_scales, scores, at_mode = (np.asarray(v) for v in refine(locs, jnp.ones_like(locs)))
    np.testing.assert_array_equal(out_locs[0], np.asarray(locs[0]))
    np.testing.assert_allclose(out_locs[1], 0.0, atol=1e-4)
    np.testing.assert_allclose(out_scales, 1.0, rtol=1e-4)
    assert at_mode.tolist() == [False, True]
    np.testing.assert_allclose(scores, [-1.5 * d, -np.exp(0.5) * d], rtol=0.01)


def wide_prior_model():
    """The bimodal coordinate beside a Gaussian block under a wide prior, N(0, 1000), with
    data 100 units from the origin: x | y ~ N(y * 1e6 / (1e6 + 1), 1e6 / (1e6 + 1)) per
    coordinate (conjugate, closed form); modes of a at +-2 by symmetry."""
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    numpyro.sample("y_a", dist.Normal(a**2, 0.5), obs=4.0)
    x = numpyro.sample("x", dist.Normal(jnp.zeros(2), 1000.0).to_event(1))
    numpyro.sample("y_x", dist.Normal(x, 1.0).to_event(1), obs=jnp.array([100.0, -30.0]))


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_wide_prior_initial_components_on_both_modes_at_the_posterior_location(covariance):
    """The default initialisation on ``wide_prior_model``: 200 Adam steps of the fits travel
    about 10 units, so before the Newton refinement no fit reached x (100 units away: the
    components started at x_1 = 6.4-6.8) and both in one mode of a in 2 of seeds 0-3; now they sit
    at x's posterior mean (closed form) and at a of both signs."""
    guide, params = fitted_guide(wide_prior_model, num_components=2, covariance=covariance)
    locs = guide_locs(params)  # (2, 3): a, x_1, x_2
    shrink = 1e6 / (1e6 + 1.0)
    np.testing.assert_allclose(locs[:, 1:], np.broadcast_to(np.array([100.0, -30.0]) * shrink, (2, 2)), atol=1e-3)
    assert sorted(np.sign(locs[:, 0]).tolist()) == [-1.0, 1.0], locs
    # the modes of a: U'(a) = 0 for U = (4 - a^2)^2 / (2 * 0.25) + a^2 / 18 (NumPy's roots)
    roots = np.roots([8.0, 0.0, -32.0 + 1.0 / 9.0, 0.0])
    np.testing.assert_allclose(np.sort(locs[:, 0]), np.sort(roots[np.abs(roots) > 1]), atol=1e-3)
