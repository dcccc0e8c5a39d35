"""TraceEntropy_ELBO's reduced entropy points (``num_entropy_points``).

The guide is one GaussianMixture site and the model's density is flat (``ImproperUniform``,
log-density 0), so ``-loss(key)`` is exactly the ELBO's entropy estimate for that step
(without the value's control variate, which adds zero-mean noise to it: ``_elbo``).
Truths are independent of numpyro_gmm: SciPy quadrature in 1-D (float64) and the Gaussian
closed form ``d/2 ln(2 pi e) + sum ln s`` for one component.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from scipy import integrate, stats

from conftest import ftype
from numpyro_gmm import GaussianMixture, TraceEntropy_ELBO
from numpyro_gmm.elbo import DEFAULT_NUM_ENTROPY_POINTS

NUM_KEYS = 512
LOCS_1D = np.array([[-0.6], [0.9]])
SCALES_1D = np.array([[1.0], [0.7]])
LOGITS_1D = np.array([0.3, -0.2])


def _elbo(**options):
    """TraceEntropy_ELBO(**options) whose value is its entropy term plus the model terms."""
    return TraceEntropy_ELBO(value_control_variate=False, **options)


def _flat_model():
    numpyro.sample("z", dist.ImproperUniform(constraints.real_vector, (), (1,)))


def _mixture(loc, scale, logits):
    return GaussianMixture(jnp.asarray(loc, ftype()), scale=jnp.asarray(scale, ftype()),
                           logits=jnp.asarray(logits, ftype()))


def _guide_for(loc, scale, logits):
    def guide():
        numpyro.sample("z", _mixture(loc, scale, logits))

    return guide


def _entropy_estimates(elbo, loc, scale, logits, seed=0):
    """``-loss`` over NUM_KEYS keys: the ELBO's entropy estimate per step."""
    d = np.shape(loc)[-1]

    def model():
        numpyro.sample("z", dist.ImproperUniform(constraints.real_vector, (), (d,)))

    guide = _guide_for(loc, scale, logits)
    keys = jax.random.split(jax.random.PRNGKey(seed), NUM_KEYS)
    losses = jax.jit(jax.vmap(lambda k: elbo.loss(k, {}, model, guide)))(keys)
    return -np.asarray(losses, np.float64)


def _quadrature_entropy_1d(locs, scales, logits):
    w = np.exp(logits - np.logaddexp.reduce(logits))
    m, s = locs[:, 0], scales[:, 0]

    def p(x):
        return np.sum(w * stats.norm.pdf(x, m, s))

    def integrand(x):
        px = p(x)
        return -px * np.log(px) if px > 0 else 0.0

    h, _ = integrate.quad(integrand, -15, 15, points=list(m), epsabs=1e-12, limit=200)
    return h


@pytest.mark.parametrize("bad", [0, 3, 12, -4, 2.0, True, "16", None])
def test_num_entropy_points_validation(bad):
    with pytest.raises(ValueError, match="num_entropy_points"):
        TraceEntropy_ELBO(num_entropy_points=bad)


def test_default_is_a_small_power_of_two():
    assert DEFAULT_NUM_ENTROPY_POINTS & (DEFAULT_NUM_ENTROPY_POINTS - 1) == 0
    assert TraceEntropy_ELBO().num_entropy_points == DEFAULT_NUM_ENTROPY_POINTS
    assert TraceEntropy_ELBO(num_entropy_points=64).num_entropy_points == 64


def test_reduced_points_unbiased_against_quadrature():
    """Mean over keys of the default ELBO's entropy within 4 standard errors of quadrature."""
    h = _entropy_estimates(_elbo(), LOCS_1D, SCALES_1D, LOGITS_1D)
    truth = _quadrature_entropy_1d(LOCS_1D, SCALES_1D, LOGITS_1D)
    se = h.std(ddof=1) / np.sqrt(len(h))
    assert h.std() > 0  # the points really are shifted per key
    assert abs(h.mean() - truth) < 4 * se + 1e-5, (h.mean(), truth, se)


def test_one_component_matches_closed_form():
    """One component: the mixing term vanishes, so every key gives the Gaussian entropy."""
    loc, scale = np.array([[0.3, -1.0, 2.0]]), np.array([[0.5, 1.5, 2.0]])
    h = _entropy_estimates(_elbo(), loc, scale, np.zeros(1))
    truth = 1.5 * np.log(2 * np.pi * np.e) + np.sum(np.log(scale))
    np.testing.assert_allclose(h, truth, rtol=0, atol=2e-5 if ftype() == np.float32 else 1e-10)


def _elbo_key_entropy(key, **options):
    mix = _mixture(LOCS_1D, SCALES_1D, LOGITS_1D)
    return float(mix.entropy(key=jax.random.split(key, 4)[3], **options))


def _entropy_of_loss(elbo, key):
    return -float(elbo.loss(key, {}, _flat_model, _guide_for(LOCS_1D, SCALES_1D, LOGITS_1D)))


TOL = dict(rtol=1e-5 if ftype() == np.float32 else 1e-12)


def test_elbo_uses_num_entropy_points_and_explicit_num_points_wins():
    """The loss's entropy is GaussianMixture.entropy with the ELBO's key (split(key, 4)[3])
    and num_entropy_points; an explicit entropy_options num_points wins."""
    key = jax.random.PRNGKey(3)
    np.testing.assert_allclose(_entropy_of_loss(_elbo(), key),
                               _elbo_key_entropy(key, num_points=DEFAULT_NUM_ENTROPY_POINTS), **TOL)
    np.testing.assert_allclose(_entropy_of_loss(_elbo(entropy_options={"num_points": 1024}, num_entropy_points=8), key),
                               _elbo_key_entropy(key, num_points=1024), **TOL)


def test_explicit_key_method_and_deterministic_rule_win():
    """entropy_options key: not randomised, the estimator's default 1024 points;
    randomize_entropy=False: the deterministic value; a method that is not randomised
    gets neither a key nor num_points."""
    key, user_key = jax.random.PRNGKey(3), jax.random.PRNGKey(11)
    mix = _mixture(LOCS_1D, SCALES_1D, LOGITS_1D)
    np.testing.assert_allclose(_entropy_of_loss(_elbo(entropy_options={"key": user_key}), key),
                               float(mix.entropy(key=user_key)), **TOL)
    np.testing.assert_allclose(_entropy_of_loss(_elbo(randomize_entropy=False), key),
                               float(mix.entropy()), **TOL)
    np.testing.assert_allclose(
        _entropy_of_loss(_elbo(entropy_options={"method": "moment_matched_upper"}), key),
        float(mix.entropy(method="moment_matched_upper")), **TOL)


def test_reduced_points_gradient_unbiased():
    """d/d(separation) of the entropy: mean over keys of the ELBO's randomised 16-point
    gradient within 4 standard errors of the central difference of quadrature."""
    t0, step = 1.5, 1e-3

    def locs_of(t):
        return np.array([[0.0], [t]])

    def h_of(t, k):
        mix = GaussianMixture(jnp.stack([jnp.zeros(1, t.dtype), t[None]]), scale=jnp.asarray(SCALES_1D, t.dtype),
                              logits=jnp.asarray(LOGITS_1D, t.dtype))
        return mix.entropy(key=k, num_points=DEFAULT_NUM_ENTROPY_POINTS)

    keys = jax.random.split(jax.random.PRNGKey(5), NUM_KEYS)
    g = np.asarray(jax.jit(jax.vmap(jax.grad(h_of), in_axes=(None, 0)))(jnp.asarray(t0, ftype()), keys), np.float64)
    truth = (_quadrature_entropy_1d(locs_of(t0 + step), SCALES_1D, LOGITS_1D)
             - _quadrature_entropy_1d(locs_of(t0 - step), SCALES_1D, LOGITS_1D)) / (2 * step)
    se = g.std(ddof=1) / np.sqrt(len(g))
    assert abs(g.mean() - truth) < 4 * se + 1e-4, (g.mean(), truth, se)
