"""The float64 pass's check of the SVI paths whose statistical tests run in the float32 pass
only (marked ``float32_pass``; ``tests/conftest.py``): every covariance of
AutoGaussianMixture, and a GaussianMixture likelihood under AutoDelta, fitted with JAX's x64
mode on. The fits are short, so the assertions are the ones a float32 leak or a dtype error
would break: every parameter, loss and draw is float64, constrained sites stay in their
support, and the ELBO and the fitted mean reach the exact log evidence and posterior mean
(both closed form), which a wrong entropy or log density in this pass would miss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI, Predictive, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta

from conftest import X64
from numpyro_gmm import AutoGaussianMixture, GaussianMixture, TraceEntropy_ELBO

pytestmark = pytest.mark.skipif(
    not X64, reason="float64 pass only: the float32 pass runs the full tests this stands for"
)

Y = np.array([0.8, 1.3, 0.4, 1.1, 0.9, 1.6])
NOISE_SD = 0.5


def conjugate_model():
    """``a ~ N(0, 1)``, ``y_i ~ N(a, 0.5)``; the exact posterior of ``a`` is Gaussian with
    mean ``sum(y) / (n + 0.5^2)``; a positive site ``s`` with its own prior, unobserved."""
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    numpyro.sample("s", dist.LogNormal(0.0, 0.5))
    with numpyro.plate("data", len(Y)):
        numpyro.sample("y", dist.Normal(a, NOISE_SD), obs=jnp.asarray(Y))


POSTERIOR_MEAN_A = Y.sum() / (len(Y) + NOISE_SD**2)
# y ~ N(0, 0.5^2 I + 1 1^T) marginally; s's prior is a factor the guide can match exactly
_COV = NOISE_SD**2 * np.eye(len(Y)) + 1.0
LOG_EVIDENCE = -0.5 * (len(Y) * np.log(2 * np.pi) + np.linalg.slogdet(_COV)[1] + Y @ np.linalg.solve(_COV, Y))


@pytest.mark.parametrize("covariance", ["full", "diag", "lowrank"])
def test_autoguide_fit_stays_float64(covariance):
    rank = {"rank": 1} if covariance == "lowrank" else {}
    guide = AutoGaussianMixture(conjugate_model, num_components=2, covariance=covariance, **rank)
    svi = SVI(conjugate_model, guide, numpyro.optim.Adam(0.05), TraceEntropy_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 400, progress_bar=False)
    assert result.losses.dtype == jnp.float64
    assert np.all(np.isfinite(result.losses))
    # E[loss] = -ELBO >= -ln Z, with equality at the exact posterior (a Gaussian times s's
    # prior, which every covariance can represent). The mean of the last 100 one-particle
    # losses (sd about 0.85 each, so 0.09 for the mean) sat 0.10-0.24 above -ln Z after 400
    # steps; a wrong entropy or log density in this pass moves it by far more.
    gap = np.mean(result.losses[-100:]) + LOG_EVIDENCE
    assert -0.3 < gap < 0.6, gap
    for name, value in result.params.items():
        assert jnp.asarray(value).dtype == jnp.float64, name
    draws = guide.sample_posterior(jax.random.PRNGKey(1), result.params, sample_shape=(2000,))
    assert draws["a"].dtype == jnp.float64 and np.all(np.asarray(draws["s"]) > 0)
    # the posterior sd of a is 0.2: 400 steps of Adam(0.05) get the mean within 0.1
    assert abs(float(np.mean(draws["a"])) - POSTERIOR_MEAN_A) < 0.1
    pred = Predictive(conjugate_model, guide=guide, params=result.params, num_samples=5)(jax.random.PRNGKey(2))
    assert pred["y"].shape == (5, len(Y)) and pred["y"].dtype == jnp.float64


def test_mixture_likelihood_under_autodelta_stays_float64():
    data = jnp.asarray(np.r_[np.full(20, -2.0), np.full(20, 2.0)][:, None] + 0.1 * np.sin(np.arange(40))[:, None])

    def model():
        loc = numpyro.sample("loc", dist.Normal(jnp.zeros((2, 1)), 5.0).to_event(2))
        with numpyro.plate("data", data.shape[0]):
            numpyro.sample("x", GaussianMixture(loc, scale=jnp.full((2, 1), 0.5)), obs=data)

    init = numpyro.infer.init_to_value(values={"loc": jnp.array([[-1.0], [1.0]])})
    guide = AutoDelta(model, init_loc_fn=init)
    result = SVI(model, guide, numpyro.optim.Adam(0.05), Trace_ELBO()).run(jax.random.PRNGKey(0), 300, progress_bar=False)
    assert result.losses.dtype == jnp.float64 and np.all(np.isfinite(result.losses))
    loc = np.sort(np.asarray(guide.median(result.params)["loc"]).ravel())
    assert loc.dtype == np.float64
    np.testing.assert_allclose(loc, [-2.0, 2.0], atol=0.1)  # the two clusters' centres
