"""The closed forms behind ``benchmarks/high_dim_init.py``'s tables (the evidence ``log Z``
and the best diagonal Gaussian's gap of each model), against the models themselves: for a
Gaussian posterior the Laplace approximation is exact, so ``log Z = log p(y, m) + d/2 log 2 pi
- log det H / 2`` at the mode ``m`` (one Newton step from anywhere), and the best diagonal
Gaussian is ``(sum_i log H_ii - log det H) / 2`` from the evidence, with ``H`` the Hessian of
the model's own log density by JAX's autodiff (float64, NumPy's ``slogdet``): independent of
the benchmark's hand-derived marginal likelihoods and banded factorisations. Float64 only
(the regression's Hessian spans seven decades)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.infer.util import log_density

from conftest import X64

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import high_dim_init  # noqa: E402

DIMS = {"regression": 20, "hierarchical": 50, "random_walk": 50}


@pytest.mark.skipif(not X64, reason="float64 pass only: the closed forms are checked to 1e-8")
@pytest.mark.parametrize("name", sorted(high_dim_init.MODELS))
def test_high_dim_init_closed_forms_match_the_model(name):
    model, log_z, diagonal_gap = high_dim_init.MODELS[name](DIMS[name])
    trace = handlers.trace(handlers.seed(model, 0)).get_trace()
    latent = {k: jnp.zeros_like(v["value"]) for k, v in trace.items() if v["type"] == "sample" and not v["is_observed"]}
    zero, unravel = ravel_pytree(latent)
    assert zero.shape == (DIMS[name],)

    def log_joint(z):
        return log_density(model, (), {}, unravel(z))[0]

    h = -np.asarray(jax.hessian(log_joint)(zero))
    mode = zero + jnp.asarray(np.linalg.solve(h, np.asarray(jax.grad(log_joint)(zero))))
    np.testing.assert_allclose(np.asarray(jax.grad(log_joint)(mode)), 0.0, atol=1e-6 * np.abs(h).max())
    log_det = np.linalg.slogdet(h)[1]
    d = DIMS[name]
    expected = float(log_joint(mode)) + 0.5 * d * np.log(2 * np.pi) - 0.5 * log_det
    np.testing.assert_allclose(log_z, expected, rtol=1e-9, atol=1e-8)
    np.testing.assert_allclose(diagonal_gap, 0.5 * (np.sum(np.log(np.diag(h))) - log_det), rtol=1e-9, atol=1e-8)
