"""Public pure functions estimating the entropy of one Gaussian mixture.

Each function takes the mixture's ``logits (K,)``, ``locs (K, d)`` and either
``scale_tril (K, d, d)`` (lower Cholesky factors of the covariances) or ``scale (K, d)``
(diagonal covariances), validates them before tracing, and dispatches to a kernel in
:mod:`numpyro_gmm._kernels`. They work under ``jax.jit``, ``jax.grad`` (every parameter)
and ``jax.vmap`` (use ``vmap`` for a batch of mixtures).
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
from jax.nn import log_softmax

from ._kernels import legendre as _legendre
from ._kernels.gaussian import all_finite
from ._kernels.power_integrals import DEFAULT_BLOCK_SIZE
from ._validation import check_int, check_mixture_shapes, float_dtype

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_ORDER",
    "ENTROPY_METHODS",
    "FLOAT32_SAFE_ORDER",
    "legendre_entropy",
    "mixture_entropy",
]

#: Default order of the Legendre series (see ``benchmarks/accuracy_order.py``).
DEFAULT_ORDER = 8
#: Highest order whose float32 result stays within 1e-3 nats of float64 on every mixture
#: measured (``benchmarks/float32_order.py``).
FLOAT32_SAFE_ORDER = 8

Array = jnp.ndarray


def _prepare(logits, locs, scale_tril, scale):
    """Validate shapes, cast to one float dtype, and return the kernel's inputs."""
    check_mixture_shapes(logits, locs, scale_tril, scale)
    factor = scale_tril if scale is None else scale
    dtype = float_dtype(logits, locs, factor)
    logits = jnp.asarray(logits, dtype)
    locs = jnp.asarray(locs, dtype)
    factor = jnp.asarray(factor, dtype)
    if scale is None:
        factor = jnp.tril(factor)  # only the lower triangle of a Cholesky factor counts
    scale_tril, scale = (factor, None) if scale is None else (None, factor)
    # NaN or +inf logits, or non-finite locs/scales, make the result NaN; -inf logits
    # are legitimate zero weights.
    ok = all_finite(locs, factor) & ~jnp.any(jnp.isnan(logits) | (logits == jnp.inf))
    return log_softmax(logits), locs, scale_tril, scale, ok, dtype


def _check_order(order, dtype) -> int:
    order = check_int("order", order, 1)
    if dtype == jnp.float32 and order > FLOAT32_SAFE_ORDER:
        warnings.warn(
            f"order={order} exceeds the float32-safe order {FLOAT32_SAFE_ORDER}: the Legendre "
            "series cancels catastrophically in float32 beyond it. Enable float64 "
            "(jax.config.update('jax_enable_x64', True), arrays in float64) or use "
            f"order <= {FLOAT32_SAFE_ORDER}.",
            UserWarning,
            stacklevel=3,
        )
    return order


def legendre_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    order: int = DEFAULT_ORDER,
    a: Array | float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Array:
    r"""Legendre-series approximation of the entropy of a Gaussian mixture (nats).

    .. math::

        H[p] \approx -\ln a - \sum_{k=0}^{N} w_k\, a^{-k} \int p(x)^{k+1} dx,

    where ``w_k`` are the monomial coefficients of the degree-``N`` shifted Legendre series
    of ``ln u`` on ``[0, 1]`` and ``a >= max_x p(x)``. Dahlke & Pacheco, *On convergence of
    polynomial approximations to the Gaussian mixture entropy*, NeurIPS 2023. The power
    integrals expand over all weak compositions of ``k + 1`` into ``K`` parts, evaluated
    as data (compile time does not grow with ``K`` or ``order``; see
    :mod:`numpyro_gmm._kernels.power_integrals`).

    It is an approximation, not a bound: the error oscillates in sign with the order. It
    is accurate to about 0.01 nats in one and two dimensions at the default order and
    degrades with dimension (see the documentation's accuracy table).

    Args:
      logits: ``(K,)`` unnormalised log mixture weights (``-inf`` means weight 0).
      locs: ``(K, d)`` component means.
      scale_tril: ``(K, d, d)`` lower Cholesky factors of the component covariances.
      scale: ``(K, d)`` standard deviations of diagonal covariances (instead of ``scale_tril``).
      order: static degree ``N >= 1`` of the series. Beyond :data:`FLOAT32_SAFE_ORDER`
        float32 is not accurate and a ``UserWarning`` is emitted.
      a: an upper bound on the density, default the paper's
        ``sum_i w_i N(mu_i; mu_i, Sigma_i)``. A value below ``max p`` takes ``u`` outside
        ``[0, 1]``, where the series is not an approximation of ``ln u``.
      block_size: static number of compositions evaluated at once; peak memory is
        proportional to it.

    Returns:
      A scalar of the inputs' floating dtype; NaN when a parameter is not finite.

    Example:
      >>> import jax.numpy as jnp
      >>> from numpyro_gmm import legendre_entropy
      >>> h = legendre_entropy(jnp.zeros(2), jnp.array([[-1.0], [1.0]]),
      ...                      scale=jnp.ones((2, 1)))
      >>> round(float(h), 2)
      1.84
    """
    log_w, locs, scale_tril, scale, ok, dtype = _prepare(logits, locs, scale_tril, scale)
    order = _check_order(order, dtype)
    block_size = check_int("block_size", block_size, 1)
    log_a = None
    if a is not None:
        if jnp.ndim(a) != 0:
            raise ValueError(f"a must be a positive scalar, got shape {jnp.shape(a)}")
        log_a = jnp.log(jnp.asarray(a, dtype))
    h = _legendre.legendre_entropy(
        log_w, locs, scale_tril, scale, order=order, log_a=log_a, block_size=block_size
    )
    return jnp.where(ok, h, jnp.nan)


#: Estimators reachable through :func:`mixture_entropy` and ``GaussianMixture.entropy``.
#: Each takes ``(logits, locs, scale_tril=None, *, scale=None, **options)``.
ENTROPY_METHODS = {
    "legendre": legendre_entropy,
}


def mixture_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    method: str = "legendre",
    **options,
):
    """Entropy of one mixture by the estimator named ``method`` (see :data:`ENTROPY_METHODS`).

    ``options`` go to that estimator (for example ``order`` for ``"legendre"``).
    """
    try:
        fn = ENTROPY_METHODS[method]
    except KeyError:
        raise ValueError(f"method must be one of {sorted(ENTROPY_METHODS)}, got {method!r}") from None
    return fn(logits, locs, scale_tril, scale=scale, **options)
