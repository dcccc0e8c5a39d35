r"""Stratified Monte Carlo estimate of the entropy of a Gaussian mixture.

``H = -sum_i w_i E_{N_i}[ln p(X)]``. Each component gets ``S = ceil(num_samples / K)``
reparameterised draws ``x_{i,s} = mu_i + L_i z_{i,s}``, ``z ~ N(0, I)``, and

.. math::

    \hat H = -\sum_i w_i \frac1S \sum_s \ln p(x_{i,s}), \qquad
    \mathrm{se}(\hat H) = \Big(\sum_i w_i^2\, \widehat{\mathrm{var}}_s[\ln p(x_{i,s})] / S\Big)^{1/2}.

Unbiased for the value, and, because every draw is a differentiable function of the
parameters and the weights enter only as ``w_i``, its gradient is an unbiased estimate
of the entropy's gradient with respect to every parameter (logits included). Stratifying
by component removes the between-component variance of plain sampling from ``p``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .bounds import dense_tril
from .modes import mixture_log_density

Array = jnp.ndarray


def monte_carlo_entropy(log_weights, locs, scale_tril, scale, *, key, num_samples: int):
    """``(estimate, standard error)``; ``num_samples`` is static (split over components)."""
    K, d = locs.shape
    per = -(-num_samples // K)
    tril = dense_tril(scale_tril, scale)
    centre = jax.lax.stop_gradient(jnp.mean(locs, axis=0))
    locs_c = locs - centre
    z = jax.random.normal(key, (K, per, d), dtype=locs.dtype)
    x = locs_c[:, None, :] + jnp.einsum("kij,ksj->ksi", tril, z)
    lp = mixture_log_density(x.reshape(K * per, d), log_weights, locs_c, tril).reshape(K, per)
    w = jnp.exp(log_weights)
    est = -jnp.sum(w * jnp.mean(lp, axis=1))
    var = jnp.var(lp, axis=1, ddof=1) if per > 1 else jnp.full((K,), jnp.inf, lp.dtype)
    se = jnp.sqrt(jnp.sum(jnp.where(w > 0, jnp.square(w) * var, 0.0)) / per)
    return est, se
