r"""Entropy from the Laplace transform of ``t = -ln(p(X)/a)``: a Gamma fit plus a correction.

With ``u = p(X)/a`` and ``t = -ln u >= 0``, ``H = -ln a + E_p[t]`` and the power moments the
engine computes are the Laplace transform of ``t`` at the integers,
``L(k) = E_p[e^{-k t}] = E_p[u^k]``, known in log space (``ln L(k)`` carries no
cancellation). ``E[t] = -d/dk ln L(k)`` at ``k = 0``.

1. **Gamma fit.** For ``t ~ Gamma(s, theta)`` (shape ``s``, rate ``theta``),
   ``ln L(k) = -s ln(1 + k/theta)``. Matching ``L(1)`` and ``L(2)``: ``theta`` solves
   ``ln(1 + 2/theta) / ln(1 + 1/theta) = ln L(2) / ln L(1)`` (the left side increases from 1
   to 2 with ``theta``; bisection in ``ln theta``), then ``s = -ln L(1) / ln(1 + 1/theta)``,
   and the fit's mean is ``s / theta``. For one ``d``-dimensional Gaussian with ``a`` its
   maximum, ``t ~ Gamma(d/2, 1)`` exactly, so the fit is exact at every ``d`` -- unlike the
   Legendre series, whose polynomial in ``u`` is the projection for ``t ~ Exp(1)`` only.
2. **Correction.** The residual ``r(k) = ln L(k) + s ln(1 + k/theta)`` vanishes at
   ``k = 0, 1, 2``; the polynomial interpolating it at ``k = 0..N`` (``N`` the order) has
   ``r'(0) ~ sum_{n=1}^N (-1)^{n+1} Delta^n r(0) / n`` (Newton forward differences), and

.. math::

    H \approx -\ln a + s/\theta - r'(0).

Not a bound. Measured against SciPy / quadrature / long Monte Carlo in
``benchmarks/accuracy.py`` (docs/accuracy.md). This is the "Gamma fit + correction" lead
recorded in the design notes (``ENTROPY.md`` section 4), not a published estimator; the
moment formula is Dahlke & Pacheco, NeurIPS 2023.

Differentiability: the bisection runs on ``stop_gradient``-ed values and is followed by
one Newton step on live values, whose derivative is the implicit-function derivative of
``theta`` (exact at the root).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import comb

import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jnp.ndarray

_BISECTION_STEPS = 80
_LOG_THETA_RANGE = 40.0


@lru_cache(maxsize=None)
def derivative_weights(order: int) -> np.ndarray:
    """``c_0..c_N`` with ``p'(0) = sum_k c_k f(k)`` for the polynomial interpolating ``f`` at ``0..N``."""
    c = [
        sum(
            (Fraction((-1) ** (n + 1), n) * comb(n, k) * (-1) ** (n - k) for n in range(max(k, 1), order + 1)),
            Fraction(0),
        )
        for k in range(order + 1)
    ]
    out = np.array([float(x) for x in c])
    out.setflags(write=False)
    return out


def _ratio(phi):
    """``ln(1 + 2/theta) / ln(1 + 1/theta)`` with ``theta = e^phi``."""
    x = jnp.exp(-phi)
    return jnp.log1p(2.0 * x) / jnp.log1p(x)


def gamma_entropy_from_moments(log_moments: Array, log_a: Array, order: int) -> Array:
    """The Gamma-fit-plus-correction entropy from ``ln E[u^k]``, ``k = 1..order`` (``order >= 2``)."""
    lm = log_moments[:order]
    dtype = lm.dtype
    l1, l2 = lm[0], lm[1]
    # ln L(2) / ln L(1) lies in (1, 2) for a non-degenerate t (Jensen / Cauchy-Schwarz);
    # clip so that a rounding outlier still yields a finite fit.
    eps = jnp.finfo(dtype).eps
    target = jnp.clip(l2 / l1, 1.0 + 16 * eps, 2.0 - 16 * eps)
    tgt = lax.stop_gradient(target)

    def bisect(_, lohi):
        lo, hi = lohi
        mid = 0.5 * (lo + hi)
        up = _ratio(mid) < tgt
        return jnp.where(up, mid, lo), jnp.where(up, hi, mid)

    lo, hi = lax.fori_loop(
        0, _BISECTION_STEPS, bisect, (jnp.asarray(-_LOG_THETA_RANGE, dtype), jnp.asarray(_LOG_THETA_RANGE, dtype))
    )
    phi0 = lax.stop_gradient(0.5 * (lo + hi))
    x0 = jnp.exp(-phi0)
    # d ratio / d phi at phi0, treated as a constant: one Newton step carries the implicit gradient.
    num, den = jnp.log1p(2.0 * x0), jnp.log1p(x0)
    dnum, dden = -2.0 * x0 / (1.0 + 2.0 * x0), -x0 / (1.0 + x0)
    slope = lax.stop_gradient((dnum * den - num * dden) / jnp.square(den))
    phi = phi0 - (_ratio(phi0) - target) / slope
    theta_inv = jnp.exp(-phi)
    s = -l1 / jnp.log1p(theta_inv)
    k = jnp.arange(order + 1, dtype=dtype)
    resid = jnp.concatenate([jnp.zeros((1,), dtype), lm]) + s * jnp.log1p(k * theta_inv)
    slope_r = jnp.dot(jnp.asarray(derivative_weights(order), dtype), resid)
    return -log_a + s * theta_inv - slope_r


@lru_cache(maxsize=None)
def endpoint_exact_legendre_weights(order: int) -> np.ndarray:
    """Monomial weights of the degree-``N`` polynomial closest to ``ln v`` in ``L2[0, 1]``
    among those that vanish at ``v = 1`` (exact rationals, rounded once).

    The unconstrained projection ``S`` (the paper's series) has ``S(1) = -1/(N+1)``; the
    constrained one is ``S(v) - S(1) K_N(v, 1) / (N+1)^2`` with the reproducing kernel
    ``K_N(v, 1) = sum_n (2n+1) P~_n(v)`` (``P~_n(1) = 1``, ``K_N(1, 1) = (N+1)^2``).
    """
    c = [Fraction(-1)] + [Fraction((2 * n + 1) * (-1) ** (n + 1), n * (n + 1)) for n in range(1, order + 1)]
    w = [Fraction(0)] * (order + 1)
    q = [Fraction(0)] * (order + 1)
    for n in range(order + 1):
        for k in range(n + 1):
            p = (-1) ** (n + k) * comb(n, k) * comb(n + k, k)
            w[k] += c[n] * p
            q[k] += (2 * n + 1) * p
    s1 = sum(w)
    out = np.array([float(wk - s1 * qk / (order + 1) ** 2) for wk, qk in zip(w, q)])
    out.setflags(write=False)
    return out


def normalized_legendre_entropy_from_moments(log_moments: Array, log_a: Array, order: int, dim: int) -> Array:
    r"""Legendre-type series on the Gaussian-normalised moments (an approximation, not a bound).

    For one ``d``-dimensional Gaussian with ``a`` its maximum, ``t = -ln(p/a) ~ Gamma(d/2, 1)``
    and ``L(k) = (1 + k)^{-d/2}``. For a mixture, write ``t = c + G`` as if ``G ~ Gamma(d/2, 1)``
    were independent of an offset ``c >= 0``; then ``M(k) = L(k) (1 + k)^{d/2} = E[v^k]`` with
    ``v = e^{-c}`` in ``(0, 1]``, ``E[t] = d/2 + E[-ln v]``, and ``E[ln v]`` is estimated from
    ``M(0..N)`` by the degree-``N`` polynomial ``sum_k w_k v^k`` closest to ``ln v`` in
    ``L2[0, 1]`` among those exact at ``v = 1`` (:func:`endpoint_exact_legendre_weights`; the
    paper's series would leave ``1/(N+1)`` at ``v = 1``, i.e. for one Gaussian):

    .. math::

        H \approx -\ln a + \frac d2 - \sum_{k=0}^{N} w_k\, M(k),\qquad
        M(k) = \exp\big(\ln E[u^k] + \tfrac d2 \ln(1 + k)\big).

    Exact for one Gaussian in any dimension (with the paper's ``a``, its peak). For
    well-separated components ``c`` is the discrete offset ``-ln(w_i N_i(mu_i)/a)``. The
    decomposition is a model, not an identity, so this is an approximation; it is this
    project's construction on Dahlke & Pacheco's moments (NeurIPS 2023), measured in
    ``benchmarks/accuracy.py``. ``M(k)`` is ``O(1)``, so the monomial cancellation of the
    Legendre weights applies as in the paper's method (float32: order <= 8).
    """
    lm = log_moments[:order]
    dtype = lm.dtype
    k = jnp.arange(1, order + 1, dtype=dtype)
    m = jnp.exp(lm + 0.5 * dim * jnp.log1p(k))
    w = endpoint_exact_legendre_weights(order)
    return -log_a + 0.5 * dim - float(w[0]) - jnp.dot(jnp.asarray(w[1:], dtype), m)
