r"""The Legendre-polynomial approximation of Gaussian-mixture entropy.

Dahlke & Pacheco, *On convergence of polynomial approximations to the Gaussian mixture
entropy*, NeurIPS 2023.

With ``a >= max_x p(x)`` and ``u = p(x) / a`` in ``[0, 1]``, ``ln p = ln a + ln u``. The
shifted Legendre series of degree ``N`` (the *order*) of ``ln u`` on ``[0, 1]`` is

.. math::

    \ln u \approx \sum_{n=0}^{N} c_n \tilde P_n(u), \qquad
    \tilde P_n(u) = \sum_{k=0}^{n} (-1)^{n+k} \binom{n}{k}\binom{n+k}{k} u^k,

with ``c_0 = -1`` and ``c_n = (2n+1)(-1)^{n+1} / (n(n+1))`` (from
``(2n+1) int_0^1 ln(u) P~_n(u) du``). Collapsing to monomials,
``ln u ~ sum_k w_k u^k``, hence

.. math::

    H[p] = -E_p[\ln p] \approx -\ln a - \sum_{k=0}^{N} w_k\, E_p[u^k],
    \qquad E_p[u^k] = a^{-k} \int p(x)^{k+1} dx .

The moments come from :func:`~numpyro_gmm._kernels.power_integrals.log_power_integrals`.
The default ``a`` is the paper's bound ``sum_i w_i N(mu_i; mu_i, Sigma_i) >= max p``.

Numerics: the monomial weights grow like ``5.8^N`` (``sum |w_k|`` is 198 at ``N = 4``,
7.9e4 at ``N = 8``) while ``E[u^k]`` is known to a relative ``~1e-6`` in float32, so the
cancellation in ``sum_k w_k E[u^k]`` -- inherent to the monomial basis -- bounds the usable
order in float32 (see :data:`numpyro_gmm.entropy.FLOAT32_SAFE_ORDER`).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import comb

import jax.numpy as jnp
import numpy as np

Array = jnp.ndarray


@lru_cache(maxsize=None)
def legendre_log_coefficients(order: int) -> np.ndarray:
    """Monomial weights ``w_0..w_N`` with ``ln u ~ sum_k w_k u^k`` on ``[0, 1]`` (float64).

    Computed in exact rational arithmetic, then rounded once.
    """
    c = [Fraction(-1)] + [
        Fraction((2 * n + 1) * (-1) ** (n + 1), n * (n + 1)) for n in range(1, order + 1)
    ]
    w = [
        sum(
            (c[n] * (-1) ** (n + k) * comb(n, k) * comb(n + k, k) for n in range(k, order + 1)),
            Fraction(0),
        )
        for k in range(order + 1)
    ]
    out = np.array([float(x) for x in w])
    out.setflags(write=False)
    return out


def entropy_from_log_series(coefficients: np.ndarray, log_moments: Array, log_a: Array) -> Array:
    """``-ln a - sum_k c_k E[u^k]`` for a polynomial series ``ln u ~ sum_k c_k u^k``.

    ``coefficients`` are ``c_0..c_N`` (float64, static); ``log_moments[k - 1]`` is
    ``ln E[u^k]`` (``E[u^0] = 1``).
    """
    moments = jnp.exp(log_moments[: len(coefficients) - 1])
    return -log_a - float(coefficients[0]) - jnp.dot(jnp.asarray(coefficients[1:], dtype=moments.dtype), moments)


def legendre_entropy_from_moments(log_moments: Array, log_a: Array, order: int) -> Array:
    """``-ln a - sum_k w_k E[u^k]`` given ``ln E[u^k]`` for ``k = 1..order`` (``E[u^0] = 1``)."""
    return entropy_from_log_series(legendre_log_coefficients(order), log_moments, log_a)
