"""The straightforward vectorised power-integral kernel, kept as the throughput baseline.

All compositions of every power are one ``(N, K)`` array argument; ``Lambda_m`` is formed
as ``composition matrix @ stacked precisions`` (``O(K d^2)`` per composition), factorised
by one batched LAPACK Cholesky over all of them, and the terms are reduced by a segment
log-sum-exp per power. Diagonal covariances go through the same code as full matrices
(the straightforward kernel has no special case). Same formula as
:func:`numpyro_gmm._kernels.power_integrals.log_moments` (information form, the paper's
bound ``a``), without blocking, whitening or the pair decomposition.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.nn import logsumexp
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import gammaln

from numpyro_gmm.compositions import weak_compositions


def all_compositions(k_max: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """``(M, n)``: every composition of ``n = 2..k_max + 1`` into ``K`` parts, and its total."""
    tables = [weak_compositions(n, K) for n in range(2, k_max + 2)]
    totals = np.concatenate([np.full(len(t), n) for n, t in zip(range(2, k_max + 2), tables)])
    return np.concatenate(tables).astype(np.int32), totals.astype(np.int32)


def log_moments_baseline(log_weights, locs, scale_tril, comps, totals, *, k_max: int):
    """``(ln a, ln E_p[u^k], k = 1..k_max)``; ``comps`` ``(N, K)`` and ``totals`` ``(N,)`` are arguments."""
    K, d = locs.shape
    eye = jnp.broadcast_to(jnp.eye(d, dtype=locs.dtype), scale_tril.shape)
    l_inv = solve_triangular(scale_tril, eye, lower=True)
    prec = jnp.swapaxes(l_inv, -1, -2) @ l_inv
    h = jnp.einsum("kij,kj->ki", prec, locs)
    log_det_cov = 2.0 * jnp.sum(jnp.log(jnp.diagonal(scale_tril, axis1=-2, axis2=-1)), -1)
    log_peak = -0.5 * (d * math.log(2 * math.pi) + log_det_cov)
    log_a = logsumexp(log_weights + log_peak)
    g = log_peak - 0.5 * jnp.einsum("ki,ki->k", h, locs)
    m = comps.astype(locs.dtype)
    lam = jnp.einsum("nk,kij->nij", m, prec)  # O(K d^2) per composition
    eta = m @ h
    chol = jnp.linalg.cholesky(lam)  # one batched LAPACK call over all compositions
    z = solve_triangular(chol, eta[..., None], lower=True)[..., 0]
    log_det = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), -1)
    n = totals.astype(locs.dtype)
    terms = (
        gammaln(n + 1.0)
        - jnp.sum(gammaln(m + 1.0), -1)
        + m @ (log_weights + g)
        + 0.5 * d * math.log(2 * math.pi)
        - 0.5 * log_det
        + 0.5 * jnp.sum(z * z, -1)
    )
    seg = totals - 2
    seg_max = jax.ops.segment_max(jax.lax.stop_gradient(terms), seg, num_segments=k_max)
    seg_sum = jax.ops.segment_sum(jnp.exp(terms - seg_max[seg]), seg, num_segments=k_max)
    log_int = seg_max + jnp.log(seg_sum)
    return log_a, log_int - jnp.arange(1, k_max + 1, dtype=locs.dtype) * log_a
