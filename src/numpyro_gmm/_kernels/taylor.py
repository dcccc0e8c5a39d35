r"""The convergent Taylor series of ``ln p`` around ``a`` (Dahlke & Pacheco, NeurIPS 2023).

With ``a >= max_x p(x)`` and ``u = p(x)/a`` in ``(0, 1]``,
``ln u = -sum_{n >= 1} (1 - u)^n / n`` converges, and every term is ``<= 0``. Truncating
after ``N`` terms (the *order*) therefore over-estimates ``ln p`` pointwise, so

.. math::

    H_N = -\ln a + \sum_{n=1}^{N} \frac{1}{n} E_p[(1 - u)^n] \le H[p],

a certified lower bound that rises monotonically with ``N`` towards ``H``. Expanding the
binomials, ``H_N = -ln a - sum_{k=0}^N t_k E_p[u^k]`` with
``t_0 = -sum_{n=1}^N 1/n`` and ``t_k = -(-1)^k sum_{n=k}^N C(n, k)/n``: the same moments
as the Legendre series, with coefficients growing only like ``2^N / N``.

The bound holds for the exact moments with the paper's ``a`` (or any ``a >= max p``);
rounding can move a float32 result above the truth by about ``1e-6 sum|t_k|``.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import comb

import jax.numpy as jnp
import numpy as np

from .legendre import entropy_from_log_series

Array = jnp.ndarray


@lru_cache(maxsize=None)
def taylor_log_coefficients(order: int) -> np.ndarray:
    """``t_0..t_N`` with ``-sum_{n=1}^N (1-u)^n / n = sum_k t_k u^k`` (exact, rounded once)."""
    t = [
        -sum((Fraction((-1) ** k * comb(n, k), n) for n in range(max(k, 1), order + 1)), Fraction(0))
        for k in range(order + 1)
    ]
    out = np.array([float(x) for x in t])
    out.setflags(write=False)
    return out


def taylor_entropy_from_moments(log_moments: Array, log_a: Array, order: int) -> Array:
    """``H_N`` from ``ln E[u^k]``, ``k = 1..order`` (``log_moments[:order]`` is used)."""
    return entropy_from_log_series(taylor_log_coefficients(order), log_moments, log_a)
