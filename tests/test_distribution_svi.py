"""Fitting a ``GaussianMixture`` likelihood by SVI recovers the generating weights and means.

Reference: the generating parameters themselves (data drawn with NumPy), with tolerances
from the sampling error of a maximum-likelihood fit on 1,500 points.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta
from numpyro.optim import Adam

from conftest import ftype
from numpyro_gmm import GaussianMixture

TRUE_W = np.array([0.5, 0.3, 0.2])
TRUE_LOC = np.array([[-4.0, 0.0], [3.0, 3.0], [2.0, -4.0]])
TRUE_SD = np.array([[1.0, 0.6], [0.8, 0.8], [0.5, 1.2]])


def model(data):
    K, d = TRUE_LOC.shape
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K, ftype())))
    loc = numpyro.sample("loc", dist.Normal(jnp.zeros((K, d), ftype()), 10.0).to_event(2))
    sd = numpyro.sample("sd", dist.LogNormal(jnp.zeros((K, d), ftype()), 2.0).to_event(2))
    with numpyro.plate("n", data.shape[0]):
        numpyro.sample("x", GaussianMixture(loc, scale=sd, probs=w), obs=data)


@pytest.mark.float32_pass
@pytest.mark.slow  # a 1,500-step SVI fit on 1,500 points (~16 CPU-s)
def test_svi_recovers_weights_and_means():
    rng = np.random.default_rng(0)
    n = 1500
    z = rng.choice(3, size=n, p=TRUE_W)
    data = jnp.asarray(TRUE_LOC[z] + TRUE_SD[z] * rng.normal(size=(n, 2)), ftype())
    # start the means at three data points far apart (a spread-out start, as k-means++ does)
    init_loc = jnp.asarray(np.array([[-3.0, 1.0], [2.0, 2.0], [1.0, -3.0]]), ftype())
    guide = AutoDelta(model, init_loc_fn=numpyro.infer.init_to_value(values={"loc": init_loc}))
    svi = SVI(model, guide, Adam(0.05), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 1500, data, progress_bar=False)
    assert np.all(np.isfinite(result.losses))
    est = guide.median(result.params)
    w, loc = np.asarray(est["w"]), np.asarray(est["loc"])
    order = [int(np.argmin(np.sum((loc - m) ** 2, -1))) for m in TRUE_LOC]  # match components
    assert sorted(order) == [0, 1, 2]
    # sampling error of the MLE with 1,500 points: weights ~ sqrt(w(1-w)/n) <= 0.013,
    # means ~ sd/sqrt(n w) <= 0.06; the bounds are about 3-4 of those.
    np.testing.assert_allclose(w[order], TRUE_W, atol=0.04)
    np.testing.assert_allclose(loc[order], TRUE_LOC, atol=0.2)
    np.testing.assert_allclose(np.asarray(est["sd"])[order], TRUE_SD, atol=0.15)
