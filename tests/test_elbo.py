"""Tests of TraceEntropy_ELBO.

Reference values are independent of numpyro_gmm: Gauss-Hermite quadrature and dense grids
in NumPy/SciPy (float64), closed-form conjugate posteriors, and central finite differences.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Predictive, Trace_ELBO, init_to_value
from numpyro.infer.autoguide import AutoNormal
from scipy import stats
from scipy.special import logsumexp

from conftest import X64, guide_locs, guide_params, regression_data, subsampled_regression
from numpyro_gmm import AutoGaussianMixture, GaussianMixture, TraceEntropy_ELBO

# ----------------------------------------------------------------------------- models

Y_SCALE = np.array([0.5, -1.2, 2.0])


def scale_model(y):
    """s ~ Exponential(1), y_i ~ Normal(0, s): one positive latent (exp transform)."""
    s = numpyro.sample("s", dist.Exponential(1.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, s), obs=y)


def scale_log_joint_unconstrained(u):
    """log p(exp(u), y) + u (the log-Jacobian) in float64 NumPy, vectorised over u."""
    s = np.exp(u)
    lp = stats.expon.logpdf(s) + u
    return lp + stats.norm.logpdf(Y_SCALE[:, None], 0.0, s[None, :]).sum(0)


# Bimodal posterior: z ~ N(0.7, 2), y_i ~ N(z^2, 1), five observations of 4. The modes
# sit near -2 and +2; the asymmetric prior gives them masses about 0.33 and 0.67.
Y_BIMODAL = np.full(5, 4.0)


def bimodal_model(n, y=None):
    z = numpyro.sample("z", dist.Normal(0.7, 2.0))
    with numpyro.plate("n", n):
        numpyro.sample("y", dist.Normal(z**2, 1.0), obs=y)


def bimodal_grid_reference():
    """Masses and means of the two modes (split at z = 0) on a dense grid (NumPy)."""
    z = np.linspace(-8.0, 8.0, 400_001)
    lp = stats.norm(0.7, 2.0).logpdf(z) + stats.norm(z[:, None] ** 2, 1.0).logpdf(Y_BIMODAL).sum(-1)
    p = np.exp(lp - lp.max())
    p /= p.sum()
    pos = z > 0
    mass_pos = p[pos].sum()
    mean_pos = (z * p)[pos].sum() / mass_pos
    mean_neg = (z * p)[~pos].sum() / (1 - mass_pos)
    return {"mass": (1 - mass_pos, mass_pos), "mean": (mean_neg, mean_pos)}


def gauss_hermite(n=120):
    """Nodes/weights for E[f(X)], X ~ N(0, 1)."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / np.sqrt(2 * np.pi)


def setup_guide(guide, model, *args):
    """Run the guide once so that its prototype (latent layout) exists."""
    with handlers.seed(rng_seed=0):
        guide(*args)


def fdtype():
    return np.float64 if X64 else np.float32


# ----------------------------------------------------------------------------- values


def loc_scale_model(y):
    """m ~ N(0, 1) (real: Normal guide, analytic entropy), s ~ Exponential(1) (positive:
    transformed guide, -log q at the sample), y_i ~ Normal(m, s)."""
    m = numpyro.sample("m", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.Exponential(1.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(m, s), obs=y)


def test_value_without_mixture_matches_quadrature():
    # AutoNormal guide: analytic entropy for m, -log q (with its log-Jacobian) for s.
    # Reference: 2-D Gauss-Hermite quadrature of E_q[log p(m, e^u, y) + u] + H[q] in
    # float64. Dropping the analytic entropy of m would shift the value by 0.73 nats, many
    # standard errors.
    y = jnp.asarray(Y_SCALE, fdtype())
    guide = AutoNormal(loc_scale_model)
    setup_guide(guide, loc_scale_model, y)
    (mm, ms), (m, sd) = (0.3, 0.5), (0.5, 0.4)
    params = {
        "m_auto_loc": jnp.asarray(mm, fdtype()),
        "m_auto_scale": jnp.asarray(ms, fdtype()),
        "s_auto_loc": jnp.asarray(m, fdtype()),
        "s_auto_scale": jnp.asarray(sd, fdtype()),
    }
    num = 5000
    loss_fn = jax.jit(lambda key: TraceEntropy_ELBO(num_particles=num).loss(key, params, loc_scale_model, guide, y))
    loss = loss_fn(jax.random.PRNGKey(1))

    x, w = gauss_hermite(60)
    mv = (mm + ms * x)[:, None]
    u = (m + sd * x)[None, :]
    s = np.exp(u)
    f = stats.norm.logpdf(mv) + stats.expon.logpdf(s) + u
    f = f + stats.norm.logpdf(Y_SCALE[:, None, None], mv[None], s[None]).sum(0)
    ww = w[:, None] * w[None, :]
    entropy = 0.5 * np.log(2 * np.pi * np.e * ms**2) + 0.5 * np.log(2 * np.pi * np.e * sd**2)
    mean_f = np.sum(ww * f)
    exact = mean_f + entropy
    # the analytic entropy of m removes its -log q noise, so this bounds the variance
    se = np.sqrt((np.sum(ww * f**2) - mean_f**2) / num)
    assert abs(-float(loss) - exact) < 4 * se + 1e-5 * abs(exact)


def _mixture_params(dtype):
    return guide_params(
        jnp.asarray([[0.1], [0.9]], dtype),
        auto_logits=jnp.asarray([0.3, -0.2], dtype),
        auto_scale_tril=jnp.asarray([[[0.3]], [[0.5]]], dtype),
    )


def _mixture_reference(params):
    """Exact stratified cross term sum_k w_k E_k[f], the per-particle variance of its
    estimate with the value control variate, and the mixture entropy, by quadrature in
    float64."""
    logits = np.asarray(params["auto_logits"], np.float64)
    w = np.exp(logits - logsumexp(logits))
    mu = guide_locs(params)[:, 0]
    sd = np.asarray(params["auto_scale_tril"], np.float64)[:, 0, 0]
    x, gw = gauss_hermite()
    f = scale_log_joint_unconstrained((mu[:, None] + sd[:, None] * x[None]).ravel()).reshape(2, -1)
    mean_k = f @ gw
    cross = np.sum(w * mean_k)
    # one draw per component per particle; the value control variate (the default) subtracts
    # c = 1/2 - x^2/2 (d = 1) from each component's term
    f_cv = f - (0.5 - 0.5 * x**2)[None]
    var = np.sum(w**2 * ((f_cv**2) @ gw - (f_cv @ gw) ** 2))
    u = np.linspace(-8, 8, 200_001)
    logq = logsumexp(np.log(w)[:, None] + stats.norm.logpdf(u[None], mu[:, None], sd[:, None]), axis=0)
    entropy = -np.sum(np.exp(logq) * logq) * (u[1] - u[0])
    return cross, var, entropy


def test_value_with_mixture_matches_quadrature_via_svi_evaluate():
    # AutoGaussianMixture guide at fixed parameters, evaluated through SVI.evaluate. The
    # ELBO minus the mixture's entropy estimate is the stratified cross term, checked
    # against quadrature within 4 standard errors; the whole ELBO is checked against
    # quadrature (grid entropy) within 4 standard errors plus 0.02 nats (the Legendre
    # entropy's accuracy in one dimension). Dropping the Delta sites' log-Jacobian would
    # shift the value by E_q[u] = 0.41, about 20 standard errors.
    y = jnp.asarray(Y_SCALE, fdtype())
    guide = AutoGaussianMixture(scale_model, num_components=2)
    params = _mixture_params(fdtype())
    num = 5000
    svi = SVI(scale_model, guide, numpyro.optim.Adam(0.01), TraceEntropy_ELBO(num_particles=num))
    state = svi.init(jax.random.PRNGKey(2), y, init_params=params)
    for name, value in params.items():
        np.testing.assert_allclose(svi.get_params(state)[name], value, rtol=1e-5)
    loss = svi.evaluate(state, y)
    entropy_hat = float(guide.get_posterior(params).entropy())
    cross, var, entropy = _mixture_reference(params)
    se = np.sqrt(var / num)
    assert abs(-float(loss) - entropy_hat - cross) < 4 * se + 1e-5 * abs(cross)
    assert abs(-float(loss) - (cross + entropy)) < 4 * se + 0.02


def test_vectorize_particles_false_matches_vmap():
    # lax.map over particles and components gives the same value as vmap (same key).
    y = jnp.asarray(Y_SCALE, fdtype())
    guide = AutoGaussianMixture(scale_model, num_components=2)
    setup_guide(guide, scale_model, y)
    params = _mixture_params(fdtype())
    key = jax.random.PRNGKey(3)

    @jax.jit
    def both(params):
        a = TraceEntropy_ELBO(num_particles=3).loss(key, params, scale_model, guide, y)
        b = TraceEntropy_ELBO(num_particles=3, vectorize_particles=False).loss(key, params, scale_model, guide, y)
        return a, b

    a, b = both(params)
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_the_loss_never_draws_from_the_mixture(monkeypatch):
    # The ELBO draws from every component itself; the guide's own run that finds the mixture
    # site gets the mixture's mean for it, so GaussianMixture's sampler is never called (made
    # to raise here) and the value is that of an ordinary run: the same loss as with sampling
    # allowed.
    y = jnp.asarray(Y_SCALE, fdtype())
    guide = AutoGaussianMixture(scale_model, num_components=2)
    setup_guide(guide, scale_model, y)
    params = _mixture_params(fdtype())
    key = jax.random.PRNGKey(3)
    expected = TraceEntropy_ELBO(num_particles=2).loss(key, params, scale_model, guide, y)

    def refuse(*args, **kwargs):
        raise AssertionError("TraceEntropy_ELBO drew from the mixture")

    monkeypatch.setattr(GaussianMixture, "sample_with_intermediates", refuse)
    monkeypatch.setattr(GaussianMixture, "sample", refuse)
    np.testing.assert_allclose(TraceEntropy_ELBO(num_particles=2).loss(key, params, scale_model, guide, y), expected)


def test_hand_written_guide_with_dependent_site_matches_closed_form():
    # Guide z ~ GaussianMixture (a model site, not auxiliary), then w | z ~ N(z, 0.5),
    # re-run per component. Model z ~ N(0, 1), w | z ~ N(z, 1). Closed form:
    # E_q[log p] = sum_k w_k (-log 2 pi - (mu_k^2 + s_k^2) / 2 - 0.25 / 2),
    # H[q(w | z)] = log(2 pi e 0.25) / 2, H[q(z)] by grid quadrature (float64).
    dt = fdtype()
    locs, sds, logits = np.array([-1.0, 0.8]), np.array([0.4, 0.7]), np.array([0.5, -0.5])

    def model():
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([1]).to_event(1))
        numpyro.sample("w", dist.Normal(z, 1.0).to_event(1))

    def guide():
        mix = GaussianMixture(jnp.asarray(locs[:, None], dt), scale=jnp.asarray(sds[:, None], dt), logits=jnp.asarray(logits, dt))
        z = numpyro.sample("z", mix)
        numpyro.sample("w", dist.Normal(z, 0.5).to_event(1))

    num = 4000
    loss = jax.jit(lambda key: TraceEntropy_ELBO(num_particles=num).loss(key, {}, model, guide))(jax.random.PRNGKey(6))
    wts = np.exp(logits - logsumexp(logits))
    cross = np.sum(wts * (-np.log(2 * np.pi) - 0.5 * (locs**2 + sds**2) - 0.125))
    u = np.linspace(-8, 8, 200_001)
    logq = logsumexp(np.log(wts)[:, None] + stats.norm.logpdf(u[None], locs[:, None], sds[:, None]), axis=0)
    h_z = -np.sum(np.exp(logq) * logq) * (u[1] - u[0])
    exact = cross + h_z + 0.5 * np.log(2 * np.pi * np.e * 0.25)
    # per-particle sd: sum_k w_k z_k^2 / 2 varies by well under 1 nat -> 4 SE < 0.06;
    # plus 0.02 nats for the Legendre entropy in one dimension
    assert abs(-float(loss) - exact) < 0.06 + 0.02


# ----------------------------------------------------------------------------- gradients


def _gradient_setup():
    """``(y, guide, params, keys)`` of the two gradient tests below: the scale model's
    two-component guide at fixed parameters, 4000 particle keys."""
    y = jnp.asarray(Y_SCALE, fdtype())
    # Order 4: at order 8 the float32 entropy jitters by ~1e-3 nats between nearby
    # parameters (the documented float32 accuracy), which a finite difference with
    # h = 1e-2 turns into gradient errors of ~0.05; order 4 jitters by ~1e-5.
    guide = AutoGaussianMixture(scale_model, num_components=2, entropy_order=4)
    setup_guide(guide, scale_model, y)
    return y, guide, _mixture_params(fdtype()), jax.random.split(jax.random.PRNGKey(4), 4000)


def _exact_logits_gradient(params):
    """The exact ELBO's gradient in the logits (quadrature of the cross term and grid
    entropy, differentiated by central differences in float64)."""

    def exact_loss(lg):
        cross, _, entropy = _mixture_reference({**params, "auto_logits": np.asarray(lg)})
        return -(cross + entropy)

    lg = np.asarray(params["auto_logits"], np.float64)
    return np.array([(exact_loss(lg + 1e-4 * e) - exact_loss(lg - 1e-4 * e)) / 2e-4 for e in np.eye(2)])


def test_logits_gradient_matches_finite_difference_and_quadrature():
    y, guide, params, keys = _gradient_setup()

    @jax.jit
    def per_particle(logits):
        """Per-particle loss and its gradient in the logits, one particle per key."""

        def one(key):  # without the control variates: the derivative of each particle's loss
            return jax.value_and_grad(
                lambda lg: TraceEntropy_ELBO(weight_control_variate=False, value_control_variate=False).loss(
                    key, {**params, "auto_logits": lg}, scale_model, guide, y)
            )(logits)

        return jax.vmap(one)(keys)

    logits = params["auto_logits"]
    _, grads = per_particle(logits)
    grads = np.asarray(grads, np.float64)
    g = grads.mean(0)

    # Central finite difference of the objective averaged over the same keys (common
    # random numbers): the objective is then a smooth function of the logits.
    h = 1e-5 if X64 else 1e-2

    def objective(lg):
        return float(np.mean(np.asarray(per_particle(lg)[0], np.float64)))

    fd = np.array([(objective(logits.at[i].add(h)) - objective(logits.at[i].add(-h))) / (2 * h) for i in range(2)])
    tol = dict(rtol=1e-6, atol=1e-8) if X64 else dict(rtol=2e-2, atol=5e-3)
    np.testing.assert_allclose(g, fd, **tol)
    assert np.all(np.abs(g) > 0.05)

    # The gradient's expectation is the exact gradient of the exact ELBO.
    exact = _exact_logits_gradient(params)
    se = grads.std(0) / np.sqrt(len(grads))
    # 0.02: the derivative of the entropy approximation's error (1-D, Legendre default order)
    np.testing.assert_array_less(np.abs(g - exact), 4 * se + 0.02)


def _assert_only_the_logits_gradient_changes_and_is_unbiased(elbo):
    """``elbo`` against ``TraceEntropy_ELBO(weight_control_variate=False)`` on the same keys:
    the same value and gradients of the locations and factors, a different logits' gradient
    whose mean over the keys is the exact gradient (quadrature, ``_exact_logits_gradient``)."""
    y, guide, params, keys = _gradient_setup()

    def both(key):  # per particle, the reference and ``elbo``, in one program
        return [
            jax.value_and_grad(lambda p: loss.loss(key, p, scale_model, guide, y))(params)
            for loss in (TraceEntropy_ELBO(weight_control_variate=False), elbo)
        ]

    (v_ref, g_ref), (v, g) = jax.jit(jax.vmap(both))(keys)
    rtol = 1e-12 if X64 else 1e-5
    np.testing.assert_allclose(v, v_ref, rtol=rtol, atol=rtol)
    for name in ("auto_locs_offset", "auto_scale_tril"):
        np.testing.assert_allclose(g[name], g_ref[name], rtol=rtol, atol=rtol)
    grads = np.asarray(g["auto_logits"], np.float64)
    assert not np.allclose(grads, np.asarray(g_ref["auto_logits"], np.float64))
    se = grads.std(0) / np.sqrt(len(grads))
    np.testing.assert_array_less(np.abs(grads.mean(0) - _exact_logits_gradient(params)), 4 * se + 0.02)


def test_common_noise_for_the_weights_only_keeps_the_value_and_the_other_gradients():
    # common_component_noise="weights": the value and the gradients of the locations and
    # factors are those of independent draws (the same key gives the same numbers), and only
    # the logits' gradient comes from terms on common draws, whose expectation is the exact
    # gradient (quadrature, as in the test above).
    _assert_only_the_logits_gradient_changes_and_is_unbiased(
        TraceEntropy_ELBO(common_component_noise="weights", weight_control_variate=False))


def test_weight_control_variate_keeps_the_value_and_the_other_gradients_and_is_unbiased():
    # weight_control_variate (the default): the value and the gradients of the locations and
    # factors are those without it (the same key gives the same numbers); the logits'
    # gradient uses L_k - c_k, whose expectation is the exact gradient (quadrature, as above).
    _assert_only_the_logits_gradient_changes_and_is_unbiased(TraceEntropy_ELBO())


def _exact_component_gradients(params):
    """The exact ELBO's gradient in the locations and scales of the scale model's guide
    (quadrature, as :func:`_exact_logits_gradient`, by central differences in float64)."""

    def exact_loss(name, value):
        cross, _, entropy = _mixture_reference({**params, name: value})
        return -(cross + entropy)

    out = {}
    for name in ("auto_locs_offset", "auto_scale_tril"):
        value = np.asarray(params[name], np.float64)
        grad = np.zeros_like(value)
        for i in np.ndindex(value.shape):
            e = np.zeros_like(value)
            e[i] = 1e-4
            grad[i] = (exact_loss(name, value + e) - exact_loss(name, value - e)) / 2e-4
        out[name] = grad
    return out


def test_path_gradient_keeps_the_value_and_the_weights_and_is_unbiased():
    # path_gradient (the default): the same value and logits' gradient as the estimator
    # without it on the same keys; the gradients of the locations and scales differ per
    # particle, and their means over 4000 particles are the exact gradient (quadrature and
    # central differences in float64), as are those of the estimator without it.
    y, guide, params, keys = _gradient_setup()

    def both(key):
        return [
            jax.value_and_grad(lambda p: TraceEntropy_ELBO(path_gradient=path).loss(key, p, scale_model, guide, y))(params)
            for path in (False, True)
        ]

    (v_ref, g_ref), (v, g) = jax.jit(jax.vmap(both))(keys)
    rtol = 1e-12 if X64 else 1e-5
    np.testing.assert_allclose(v, v_ref, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(g["auto_logits"], g_ref["auto_logits"], rtol=rtol, atol=10 * rtol)
    exact = _exact_component_gradients(params)
    for name in ("auto_locs_offset", "auto_scale_tril"):
        assert not np.allclose(g[name], g_ref[name])
        for grads in (g[name], g_ref[name]):
            grads = np.asarray(grads, np.float64).reshape(len(keys), -1)
            se = grads.std(0) / np.sqrt(len(grads))
            np.testing.assert_array_less(np.abs(grads.mean(0) - exact[name].ravel()), 4 * se + 0.02)


def _separated_mixture_model(locs, sds, masses):
    """z ~ sum_k m_k N(mu_k, diag(s_k^2)) (NumPyro's MixtureSameFamily): the posterior is
    that mixture."""

    def model():
        comp = dist.Normal(jnp.asarray(locs), jnp.asarray(sds)).to_event(1)
        numpyro.sample("z", dist.MixtureSameFamily(dist.Categorical(probs=jnp.asarray(masses)), comp))

    return model


#: Masses of the separated target of the exact-fit tests, and the guide's logits there.
EXACT_FIT_MASSES = np.array([0.5, 0.3, 0.2])
EXACT_FIT_LOGITS = np.array([0.4, -0.1, 0.2])


def _exact_fit_weights():
    """``(masses, w)``: the target's masses and the guide's weights ``softmax(EXACT_FIT_LOGITS)``."""
    return EXACT_FIT_MASSES, np.exp(EXACT_FIT_LOGITS - logsumexp(EXACT_FIT_LOGITS))


def _exact_fit_setup(covariance, logits=EXACT_FIT_LOGITS):
    """``(model, guide, params)``: three Gaussians 40 sds apart (masses 0.5, 0.3, 0.2),
    d = 4, and a guide of three components equal to the target's (low rank: W = 0) with
    the given logits."""
    dt = fdtype()
    d, r = 4, 2
    sds = np.random.default_rng(3).uniform(0.5, 2.0, (3, d))
    locs = np.array([-40.0, 0.0, 40.0])[:, None] * np.ones(d) * 2.0
    model = _separated_mixture_model(locs.astype(dt), sds.astype(dt), EXACT_FIT_MASSES.astype(dt))
    guide = AutoGaussianMixture(model, num_components=3, covariance=covariance, init_method="spread",
                                **({"rank": r} if covariance == "lowrank" else {}))
    setup_guide(guide, model)
    params = guide_params(jnp.asarray(locs, dt), auto_logits=jnp.asarray(logits, dt))
    if covariance == "full":
        params["auto_scale_tril"] = jnp.asarray(np.eye(d) * sds[:, None], dt)
    elif covariance == "diag":
        params["auto_scale"] = jnp.asarray(sds, dt)
    else:  # W = 0 (a cov_diag-only component is the target's diagonal one)
        params["auto_cov_factor"] = jnp.zeros((3, d, r), dt)
        params["auto_cov_diag"] = jnp.asarray(sds**2, dt)
    return model, guide, params


@pytest.mark.parametrize("covariance", ["full", "diag", "lowrank"])
def test_weight_control_variate_removes_the_noise_of_the_weights_at_an_exact_fit(covariance):
    # Target: three Gaussians 40 sds apart (masses 0.5, 0.3, 0.2), d = 4; guide components
    # equal to the target's, weights not: each component term is ln m_k + ln N_k(z_k) up to
    # e^-800, so L_k - c_k = ln m_k - H_k exactly, and the logits' gradient of the loss is,
    # for every key, -w_j (a_j - sum_k w_k a_k) with a_k = ln m_k - ln w_k (the exact ELBO
    # sum_k w_k (ln m_k - ln w_k) + const, the components not overlapping). Without the
    # control variate the same gradient scatters by the chi-square noise of ln N_k(z_k).
    model, guide, params = _exact_fit_setup(covariance)
    masses, w = _exact_fit_weights()
    a = np.log(masses) - np.log(w)
    exact = -w * (a - w @ a)  # the gradient of the loss (minus the ELBO)
    keys = jax.random.split(jax.random.PRNGKey(0), 64)

    def logits_grads(elbo):
        grad = jax.vmap(lambda k: jax.grad(lambda p: elbo.loss(k, p, model, guide))(params)["auto_logits"])
        return np.asarray(jax.jit(grad)(keys), np.float64)

    with_cv, without = logits_grads(TraceEntropy_ELBO()), logits_grads(TraceEntropy_ELBO(weight_control_variate=False))
    tol = 1e-6 if X64 else 2e-4
    np.testing.assert_allclose(with_cv, np.broadcast_to(exact, with_cv.shape), atol=tol)
    assert np.all(without.std(0) > 0.05)


@pytest.mark.parametrize("covariance", ["full", "diag", "lowrank"])
def test_path_gradient_removes_the_noise_of_the_components_at_an_exact_fit(covariance):
    # The target of the test above, the guide's components equal to the target's: ln p -
    # ln q is constant near each component (ln m_k - ln w_k up to e^-800), so the path
    # derivative of the components' parameters is zero for every key; without it the same
    # gradients scatter by the noise of ln p(z_k) against the entropy's exact gradient.
    model, guide, params = _exact_fit_setup(covariance)
    keys = jax.random.split(jax.random.PRNGKey(0), 64)

    def component_grads(elbo):
        grad = jax.vmap(lambda k: jax.grad(lambda p: elbo.loss(k, p, model, guide))(params))
        g = jax.jit(grad)(keys)
        return {name: np.asarray(v, np.float64) for name, v in g.items() if name != "auto_logits"}

    path, plain = component_grads(TraceEntropy_ELBO()), component_grads(TraceEntropy_ELBO(path_gradient=False))
    for name in ("auto_locs_origin", "auto_locs_unit"):  # held fixed: no gradient at all
        np.testing.assert_array_equal(path.pop(name), 0.0)
        np.testing.assert_array_equal(plain.pop(name), 0.0)
    tol = 1e-6 if X64 else 2e-4
    for name in path:
        np.testing.assert_allclose(path[name], 0.0, atol=tol)
        assert plain[name].std(0).max() > 0.05, name


def _random_mixture(covariance, loc, rng, r):
    """A ``GaussianMixture`` at ``loc (K, d)`` with random components of the given kind (low
    rank: rank ``r``), its factors drawn from the NumPy generator ``rng``."""
    dt = loc.dtype
    K, d = loc.shape
    if covariance == "full":
        tril = np.tril(rng.normal(size=(K, d, d)) * 0.5, -1) + np.eye(d) * rng.uniform(0.5, 2, (K, 1, d))
        return GaussianMixture(loc, scale_tril=jnp.asarray(tril, dt))
    if covariance == "diag":
        return GaussianMixture(loc, scale=jnp.asarray(rng.uniform(0.5, 2, (K, d)), dt))
    return GaussianMixture(loc, cov_factor=jnp.asarray(rng.normal(size=(K, d, r)), dt),
                           cov_diag=jnp.asarray(rng.uniform(0.3, 2, (K, d)), dt))


@pytest.mark.parametrize("covariance", ["full", "diag", "lowrank"])
@pytest.mark.parametrize("common", [False, True])
def test_draws_and_control_variates_match_scipy(covariance, common):
    # c_k = ln N_k(z_k) + H[N_k] at each component's own draw: SciPy's multivariate normal
    # log density and entropy (float64) on the returned draws; and its mean over 4,000 keys
    # is zero (Monte Carlo, 5 standard errors of a (d - chi2_d) / 2 variable).
    from numpyro_gmm.elbo import component_draws, draws_and_control_variates

    dt = fdtype()
    rng = np.random.default_rng(1)
    K, d, r = 3, 5, 2
    loc = jnp.asarray(rng.normal(size=(K, d)), dt)
    mix = _random_mixture(covariance, loc, rng, r)
    cov = np.asarray(mix.component_covariance_matrix, np.float64)
    keys = jax.random.split(jax.random.PRNGKey(2), 4000)
    z, c = jax.jit(jax.vmap(lambda k: draws_and_control_variates(mix, k, common)))(keys)
    np.testing.assert_allclose(z[0], component_draws(mix, keys[0], common), rtol=1e-6, atol=1e-6)
    z, c = np.asarray(z, np.float64), np.asarray(c, np.float64)
    for k in range(K):
        normal = stats.multivariate_normal(np.asarray(loc[k], np.float64), cov[k])
        expect = normal.logpdf(z[:50, k]) + normal.entropy()
        np.testing.assert_allclose(c[:50, k], expect, rtol=1e-4 if dt == np.float32 else 1e-9, atol=1e-4 if dt == np.float32 else 1e-9)
        assert abs(c[:, k].mean()) < 5 * np.sqrt(d / 2) / np.sqrt(len(keys))


# ----------------------------------------------------------------------------- inference


@pytest.mark.float32_pass
@pytest.mark.slow  # two 1,500-step SVI fits (~16 CPU-s)
def test_bimodal_posterior_mixture_recovers_both_modes_and_mean_field_one():
    ref = bimodal_grid_reference()
    y = jnp.asarray(Y_BIMODAL, fdtype())
    # Start at z = 0, between the modes: the two components begin at -0.3 and +0.3 (the
    # default spread) with equal weights, so each can reach its own mode and the masses
    # have to be learnt through the logits. (Components started on the same side of 0
    # both fall into that side's mode: the ELBO is multimodal in the guide parameters.)
    init = numpyro.infer.init_to_value(values={"z": 0.0})
    guide = AutoGaussianMixture(bimodal_model, num_components=2, init_loc_fn=init)
    schedule = lambda i: 0.05 * 0.998**i  # noqa: E731 -- decaying step size to settle the noise
    svi = SVI(bimodal_model, guide, numpyro.optim.Adam(schedule), TraceEntropy_ELBO(num_particles=4))
    result = svi.run(jax.random.PRNGKey(0), 1500, 5, y, progress_bar=False, stable_update=True)
    assert np.all(np.isfinite(result.losses))
    post = guide.get_posterior(result.params)
    assert isinstance(post, GaussianMixture)
    order = np.argsort(np.asarray(post.loc[:, 0]))  # negative mode first
    masses = np.asarray(post.probs)[order]
    means = np.asarray(post.loc[:, 0])[order]
    np.testing.assert_allclose(masses, ref["mass"], atol=0.1)
    np.testing.assert_allclose(means, ref["mean"], atol=0.15)

    # Predictive with the guide: the posterior draws of z fall on both modes with the
    # guide's weights (binomial standard error of 2000 draws is about 0.011).
    pred = Predictive(
        bimodal_model, guide=guide, params=result.params, num_samples=2000, return_sites=["z", "y"]
    )
    samples = pred(jax.random.PRNGKey(1), 5)
    assert samples["z"].shape == (2000,) and samples["y"].shape == (2000, 5)
    assert abs(float(jnp.mean(samples["z"] > 0)) - masses[1]) < 0.05

    # Mean-field AutoNormal with Trace_ELBO on the same model covers one mode only: its
    # mass on the other side of 0 is negligible.
    normal_guide = AutoNormal(bimodal_model)
    svi_n = SVI(bimodal_model, normal_guide, numpyro.optim.Adam(0.05), Trace_ELBO(num_particles=4))
    res_n = svi_n.run(jax.random.PRNGKey(0), 1500, 5, y, progress_bar=False)
    loc = float(res_n.params["z_auto_loc"])
    scale = float(res_n.params["z_auto_scale"])
    nearest = ref["mean"][int(loc > 0)]
    assert abs(loc - nearest) < 0.15
    assert stats.norm(loc, scale).cdf(0.0) < 1e-3 or stats.norm(loc, scale).sf(0.0) < 1e-3


@pytest.mark.float32_pass
@pytest.mark.slow  # a 2,000-step SVI fit, one Python step at a time (~22 CPU-s)
def test_conjugate_linear_gaussian_one_component():
    # y = X beta + N(0, 1) noise, beta ~ N(0, I) in a plate: exact posterior
    # N(S X^T y, S), S = (I + X^T X)^-1 (closed form).
    rng = np.random.default_rng(0)
    n = 20
    X = rng.normal(size=(n, 2)) @ np.array([[1.0, 0.6], [0.0, 0.8]])
    beta_true = np.array([0.7, -1.2])
    y = X @ beta_true + rng.normal(size=n)
    S = np.linalg.inv(np.eye(2) + X.T @ X)
    mean = S @ X.T @ y

    def model(X, y):
        with numpyro.plate("coef", 2):
            beta = numpyro.sample("beta", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ beta, 1.0), obs=y)

    guide = AutoGaussianMixture(model, num_components=1)
    schedule = lambda i: 0.05 * 0.998**i  # noqa: E731 -- decaying step size to settle the noise
    svi = SVI(model, guide, numpyro.optim.Adam(schedule), TraceEntropy_ELBO(num_particles=8))
    Xj, yj = jnp.asarray(X, fdtype()), jnp.asarray(y, fdtype())
    # the progress-bar path of SVI.run (a Python loop over a jitted update)
    result = svi.run(jax.random.PRNGKey(0), 2000, Xj, yj, progress_bar=True)
    post = guide.get_posterior(result.params)
    np.testing.assert_allclose(np.asarray(post.loc[0]), mean, atol=0.05)
    cov = np.asarray(post.covariance_matrix, np.float64)
    assert np.linalg.norm(cov - S) / np.linalg.norm(S) < 0.1
    # median of a one-component mixture is its mean
    np.testing.assert_allclose(np.asarray(guide.median(result.params)["beta"]), mean, atol=0.05)


# ----------------------------------------------------------------------------- errors


def _two_mixture_guide(y):
    for name in ("a", "b"):
        numpyro.sample(name, GaussianMixture(jnp.array([[0.0], [1.0]]), scale=jnp.ones((2, 1))))


def _two_site_model(y):
    numpyro.sample("a", dist.Normal(0.0, 1.0).expand([1]).to_event(1))
    numpyro.sample("b", dist.Normal(0.0, 1.0).expand([1]).to_event(1))


def _plate_mixture_guide(y):
    with numpyro.plate("p", 3):
        numpyro.sample("a", GaussianMixture(jnp.array([[0.0], [1.0]]), scale=jnp.ones((2, 1))))


def _plate_model(y):
    with numpyro.plate("p", 3):
        numpyro.sample("a", dist.Normal(0.0, 1.0).expand([1]).to_event(1))


def _msf_guide(y):
    mix = dist.MixtureSameFamily(dist.Categorical(logits=jnp.zeros(2)), dist.Normal(jnp.array([0.0, 1.0]), 1.0))
    numpyro.sample("a", mix)


def _scalar_model(y):
    numpyro.sample("a", dist.Normal(0.0, 1.0))


def _bernoulli_guide(y):
    numpyro.sample("a", dist.Bernoulli(0.5))


def _bernoulli_model(y):
    numpyro.sample("a", dist.Bernoulli(0.3))


@pytest.mark.parametrize(
    "model, guide, match",
    [
        (_two_site_model, _two_mixture_guide, "at most one GaussianMixture"),
        (_plate_model, _plate_mixture_guide, "outside any plate"),
        (_scalar_model, _msf_guide, "Use numpyro_gmm.GaussianMixture"),
        (_bernoulli_model, _bernoulli_guide, "discrete"),
    ],
)
def test_unsupported_guides_raise(model, guide, match):
    with pytest.raises(ValueError, match=match):
        TraceEntropy_ELBO().loss(jax.random.PRNGKey(0), {}, model, guide, None)


@pytest.mark.parametrize("covariance", ["full", "diag", "lowrank"])
def test_value_control_variate_gives_the_exact_elbo_at_an_exact_fit_and_changes_no_gradient(covariance):
    # The target of the tests above (three Gaussians 40 sds apart, d = 4), the guide's
    # components equal to the target's and its weights w not the masses m: the exact loss
    # is KL(q || p) = sum_k w_k ln(w_k / m_k) (log Z = 0, the components not overlapping;
    # closed form). With the value control variate every key gives it (L_k - c_k = ln m_k -
    # H_k, and the entropy rule's mixing term is 0); without it the loss scatters by the
    # chi-square noise of ln N_k(z_k) around the same mean (4 standard errors). The
    # gradients are the same with and without it, key by key.
    model, guide, params = _exact_fit_setup(covariance)
    masses, w = _exact_fit_weights()
    exact = float(np.sum(w * (np.log(w) - np.log(masses))))
    keys = jax.random.split(jax.random.PRNGKey(0), 256)

    def values_and_grads(elbo):
        out = jax.jit(jax.vmap(lambda k: jax.value_and_grad(lambda p: elbo.loss(k, p, model, guide))(params)))(keys)
        return np.asarray(out[0], np.float64), out[1]

    (with_cv, g), (without, g_ref) = (values_and_grads(TraceEntropy_ELBO(value_control_variate=cv)) for cv in (True, False))
    np.testing.assert_allclose(with_cv, exact, atol=1e-9 if X64 else 2e-4)
    assert without.std() > 0.3
    assert abs(without.mean() - exact) < 4 * without.std() / np.sqrt(len(without))
    rtol = 1e-12 if X64 else 1e-5
    for name in g:
        np.testing.assert_allclose(g[name], g_ref[name], rtol=rtol, atol=rtol)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="num_particles"):
        TraceEntropy_ELBO(num_particles=0)
    with pytest.raises(ValueError, match="entropy_options"):
        TraceEntropy_ELBO(entropy_options=4)
    with pytest.raises(ValueError, match="common_component_noise"):
        TraceEntropy_ELBO(common_component_noise=1)
    with pytest.raises(ValueError, match="common_component_noise"):
        TraceEntropy_ELBO(common_component_noise="all")
    with pytest.raises(ValueError, match="weight_control_variate"):
        TraceEntropy_ELBO(weight_control_variate=1)
    with pytest.raises(ValueError, match="path_gradient"):
        TraceEntropy_ELBO(path_gradient="yes")
    with pytest.raises(ValueError, match="value_control_variate"):
        TraceEntropy_ELBO(value_control_variate=None)


@pytest.mark.parametrize("covariance", ["full", "diag", "lowrank"])
def test_common_component_draws_share_the_noise_and_keep_each_component(covariance):
    # Common random numbers: z_k = mu_k + L_k eps with one eps for every k, so each
    # standardised draw is the same vector; and each z_k is N(mu_k, Sigma_k): the mean and
    # covariance of 20,000 draws against the parameters (Monte Carlo, 5 standard errors).
    from numpyro_gmm.elbo import component_draws

    dt = fdtype()
    rng = np.random.default_rng(0)
    K, d, r = 3, 4, 2
    loc = jnp.asarray(rng.normal(size=(K, d)) * 3, dt)
    mix = _random_mixture(covariance, loc, rng, r)
    cov = np.asarray(mix.component_covariance_matrix, np.float64)
    keys = jax.random.split(jax.random.PRNGKey(1), 20_000)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: component_draws(mix, k, True)))(keys), np.float64)  # (S, K, d)
    assert jax.eval_shape(lambda: component_draws(mix, keys[0], True)).dtype == dt
    for k in range(K):
        centred = draws[:, k] - np.asarray(loc[k], np.float64)
        se_mean = np.sqrt(np.diag(cov[k]) / len(keys))
        assert np.all(np.abs(centred.mean(0)) < 5 * se_mean)
        emp = centred.T @ centred / len(keys)
        se_cov = np.sqrt((cov[k] ** 2 + np.outer(np.diag(cov[k]), np.diag(cov[k]))) / len(keys))
        assert np.all(np.abs(emp - cov[k]) < 5 * se_cov)
    if covariance != "lowrank":  # one eps: L_k^-1 (z_k - mu_k) is the same for every k
        tril = np.asarray(mix.scale_tril, np.float64)
        std = np.linalg.solve(tril[None], (draws[:50] - np.asarray(loc, np.float64))[..., None])[..., 0]
        np.testing.assert_allclose(std, np.broadcast_to(std[:, :1], std.shape), atol=1e-4)
    else:  # the same (eps_W, eps_D) for every k: compare with the construction per component
        e = jax.random.normal(keys[0], (r + d,), dt)  # one draw of (eps_W, eps_D)
        ew, ed = e[:r], e[r:]
        expect = np.asarray(loc + jnp.einsum("kdr,r->kd", mix.cov_factor, ew) + jnp.sqrt(mix.cov_diag) * ed)
        np.testing.assert_allclose(draws[0], expect, rtol=1e-5, atol=1e-5)
    # independent draws on request: the standardised draws differ between components
    ind = np.asarray(component_draws(mix, keys[0], common=False))
    assert not np.allclose(ind[0] - np.asarray(loc[0]), ind[1] - np.asarray(loc[1]))


@pytest.mark.slow  # two programs over 1,000 and 20 keys (~6 CPU-s)
def test_subsampled_loss_is_unbiased_for_the_full_data_loss():
    """Under a subsampling plate (50 of 400 rows) the loss, averaged over subsamples, is the
    full-data loss: the likelihood is scaled by 400 / 50 as in NumPyro's ELBOs. Reference:
    NumPyro's ``Trace_ELBO`` on the model without subsampling (its own Monte Carlo, ``log q``
    by the mixture's ``log_prob``), 20,000 particles; both within 4 standard errors."""
    X, y = (jnp.asarray(a) for a in regression_data())
    model = subsampled_regression
    # near the posterior (at the least-squares solution, NumPy), where the subsamples' noise is small
    centre = np.linalg.lstsq(np.asarray(X), np.asarray(y), rcond=None)[0]
    guide = AutoGaussianMixture(model, num_components=2, init_method="spread", init_scale=0.05,
                                init_loc_fn=init_to_value(values={"b": jnp.asarray(centre)}))
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), TraceEntropy_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y, 50))  # the prototype under subsampling
    full = jax.jit(jax.vmap(lambda k: Trace_ELBO(num_particles=1000).loss(k, params, model, guide, X, y)))
    sub = jax.jit(jax.vmap(lambda k: TraceEntropy_ELBO(num_particles=8).loss(k, params, model, guide, X, y, 50)))
    reference = np.asarray(full(jax.random.split(jax.random.PRNGKey(1), 20)))
    losses = np.asarray(sub(jax.random.split(jax.random.PRNGKey(2), 1000)))
    se = np.hypot(reference.std() / np.sqrt(reference.size), losses.std() / np.sqrt(losses.size))
    assert abs(losses.mean() - reference.mean()) < 4 * se, (losses.mean(), reference.mean(), se)
    # resolving power: the likelihood term is about 570 nats, so an unscaled subsample (50
    # rows counted as 50, not as 400) would be hundreds of nats off, against 4 se here
    assert se < 1.0, se
