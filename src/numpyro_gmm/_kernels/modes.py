r"""Highest mode of a Gaussian mixture by fixed-point iterations started at every mean.

At a stationary point of ``p(x) = sum_i w_i N(x; mu_i, Sigma_i)``,
``sum_i r_i(x) Lambda_i (mu_i - x) = 0`` with responsibilities ``r_i(x) ∝ w_i N_i(x)`` and
precisions ``Lambda_i``, so ``x = (sum_i r_i Lambda_i)^{-1} sum_i r_i Lambda_i mu_i``
(Carreira-Perpinan, *Mode-finding for mixtures of Gaussian distributions*, IEEE TPAMI
2000; with equal covariances this is mean shift). The iteration runs a fixed number of
steps from each of the ``K`` means (``lax.fori_loop``, shapes static) and the largest
density over the end points and the means is returned.

The result is a density value actually attained, hence ``<= max p``; it equals ``max p``
when one of the ``K`` runs reaches the global mode, which is not guaranteed. The
gradient uses the envelope theorem: the end points are treated as constants
(``stop_gradient``), which is exact at a stationary point.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax
from jax.nn import logsumexp, softmax

from .bounds import dense_tril, log_abs_det
from .gaussian import cholesky, precision_of_tril, tril_inverse

Array = jnp.ndarray

LOG_2PI = math.log(2.0 * math.pi)

DEFAULT_MODE_ITERATIONS = 64


def component_log_densities(x: Array, log_weights: Array, locs: Array, tril: Array) -> Array:
    """``ln w_i + ln N(x_s; mu_i, L_i L_i^T)`` for points ``x (S, d)``: shape ``(S, K)``."""
    d = locs.shape[-1]
    l_inv = tril_inverse(tril)  # (K, d, d)
    z = jnp.einsum("kij,skj->ski", l_inv, x[:, None, :] - locs[None, :, :])
    return log_weights - log_abs_det(tril, None) - 0.5 * (d * LOG_2PI + jnp.sum(jnp.square(z), -1))


def mixture_log_density(x, log_weights, locs, tril) -> Array:
    """``ln p(x_s)``, shape ``(S,)``."""
    return logsumexp(component_log_densities(x, log_weights, locs, tril), axis=-1)


def log_max_density(
    log_weights: Array,
    locs: Array,
    scale_tril: Array | None,
    scale: Array | None,
    *,
    num_iterations: int = DEFAULT_MODE_ITERATIONS,
) -> Array:
    """``ln p`` at the highest of the modes reached from every mean (a value ``<= ln max p``)."""
    centre = lax.stop_gradient(jnp.mean(locs, axis=0))
    locs_c = locs - centre
    tril = dense_tril(scale_tril, scale)
    prec = precision_of_tril(tril)  # (K, d, d)
    h = jnp.einsum("kij,kj->ki", prec, locs_c)
    sg = lax.stop_gradient
    lw, lc, tr, pr, hh = sg(log_weights), sg(locs_c), sg(tril), sg(prec), sg(h)

    def step(_, x):
        r = softmax(component_log_densities(x, lw, lc, tr), axis=-1)  # (S, K)
        lam = jnp.einsum("sk,kij->sij", r, pr)
        eta = r @ hh
        w = tril_inverse(cholesky(lam))  # lam is positive definite; no LAPACK call
        return jnp.einsum("sji,sj->si", w, jnp.einsum("sij,sj->si", w, eta))

    x = lax.fori_loop(0, num_iterations, step, lc)
    pts = sg(jnp.concatenate([x, lc], axis=0))
    pts = jnp.where(jnp.isfinite(pts), pts, lc[:1])  # a diverged run falls back to a mean
    return jnp.max(mixture_log_density(pts, log_weights, locs_c, tril))
