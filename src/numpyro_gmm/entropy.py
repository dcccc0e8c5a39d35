"""Public pure functions estimating the entropy of one Gaussian mixture.

Each function takes the mixture's ``logits (K,)``, ``locs (K, d)`` and either
``scale_tril (K, d, d)`` (lower Cholesky factors of the covariances) or ``scale (K, d)``
(diagonal covariances), validates them before tracing, and dispatches to a kernel in
:mod:`numpyro_gmm._kernels`. They work under ``jax.jit``, ``jax.grad`` (every parameter)
and ``jax.vmap`` (use ``vmap`` for a batch of mixtures).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.nn import log_softmax
from numpyro.util import not_jax_tracer

from ._kernels import bounds as _bounds
from ._kernels import frontier as _frontier
from ._kernels import legendre as _legendre
from ._kernels import lowrank as _lowrank
from ._kernels import mixing as _mixing
from ._kernels import modes as _modes
from ._kernels import monte_carlo as _monte_carlo
from ._kernels import taylor as _taylor
from ._kernels.gaussian import all_finite
from ._kernels.mixing import DEFAULT_NUM_POINTS, default_num_points
from ._kernels.power_integrals import DEFAULT_BLOCK_SIZE, log_moments, moment_cost
from ._validation import check_int, check_mixture_shapes, float_dtype

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_METHOD",
    "DEFAULT_NUM_POINTS",
    "DEFAULT_ORDER",
    "ENTROPY_METHODS",
    "FLOAT32_SAFE_ORDER",
    "FLOAT64_SAFE_ORDER",
    "LEGENDRE_ACCURATE_MAX_DIM",
    "LEGENDRE_DEFAULT_MAX_DIM",
    "LOWRANK_DENSE_MAX_DIM",
    "TAYLOR_BOUND_MAX_COMPOSITIONS",
    "TAYLOR_BOUND_MAX_DIM",
    "TAYLOR_MAX_ORDER",
    "auto_entropy",
    "entropy_bounds",
    "huber_lower_bound",
    "huber_upper_bound",
    "legendre_entropy",
    "lowrank_mixing_qmc_entropy",
    "mixing_qmc_entropy",
    "mixture_entropy",
    "moment_matched_upper_bound",
    "monte_carlo_entropy",
    "normalized_legendre_entropy",
    "pairwise_bhattacharyya_lower_bound",
    "pairwise_kl_upper_bound",
    "taylor_entropy",
]

#: Default order of the Legendre series (see ``benchmarks/accuracy_order.py``).
DEFAULT_ORDER = 8
#: Highest order whose float32 result stays within 1e-3 nats of float64 on every mixture
#: measured (``benchmarks/float32_order.py``). Beyond it the Legendre estimators warn.
FLOAT32_SAFE_ORDER = 8
#: Highest order at which the float64 Legendre series is no less accurate than at lower
#: orders on every mixture measured (``benchmarks/float32_order.py --max-order 30``: worst
#: error against SciPy / quadrature 0.007 nats at orders 12-24, 0.013 at 26, 0.63 at 28,
#: 14 at 30; the monomial weights grow like ``5.8^N``). Beyond it the Legendre estimators warn.
FLOAT64_SAFE_ORDER = 24
#: Highest order of the Taylor lower bound per float dtype: the largest order whose float32
#: result stays within 1e-3 nats of float64 (7.7e-4 at 24, 1.5e-3 at 26; the bound itself
#: was 0.012 nats or more below the truth there, so rounding cannot cross it); float64
#: measured monotone and below the truth up to 50. Higher orders are clamped to it with a
#: ``UserWarning`` (float32 order 46 gave a value above the entropy, order 48 gave 7.63 for
#: an entropy of 1.756).
TAYLOR_MAX_ORDER = {"float32": 24, "float64": 50}
#: Largest dimension at which :func:`entropy_bounds` includes the Taylor lower bound. The
#: Taylor bound is at most ``-ln a + sum_{n<=N} 1/n`` and for one ``d``-dimensional Gaussian
#: it misses ``H`` by about ``d/2 - ln N``; on random mixtures (order 8) it was the tightest
#: lower bound in 5 of 12 at d = 1 and in none at d = 2 and 3, while its power moments are
#: the only part of the bounds whose cost grows with the order and ``K``.
TAYLOR_BOUND_MAX_DIM = 2
#: Largest number of compositions for which :func:`entropy_bounds` includes the Taylor lower
#: bound (2^21: ``K <= 16`` components at order 8, about 0.2 s on one CPU core); beyond it
#: the bounds are the closed forms alone, so that they stay cheap for any ``K`` (the Taylor
#: term's cost grows as ``C(order + K, K - 1)``; the explicit ``taylor_entropy`` still
#: computes it, or raises ``ValueError`` past the engine's size limits).
TAYLOR_BOUND_MAX_COMPOSITIONS = 1 << 21
#: Largest dimension at which the default (``"auto"``) uses the Legendre series: 0, i.e.
#: nowhere. Measured (docs/accuracy.md, "Why the default is not the Legendre series"): at
#: order 8 the series is off by +0.0145 nats on two unit Gaussians 2 apart in 1-D, +0.007 on a
#: single 1-D Gaussian, -0.95 (1-D) and -4.6 (2-D) with a narrow component inside a wide
#: one, and no cheap quantity (the paper's ``a`` against the highest mode) separated the
#: mixtures where it is within 0.01 nats from those where it is not;
#: :func:`mixing_qmc_entropy` was within 0.01 nats on every mixture measured (the worst
#: found 0.0037: d = 5, K = 4 random low-rank-plus-diagonal covariances, against a 2^19-draw
#: Monte Carlo truth of standard error 0.0003). The series stays available as
#: ``method="legendre"``.
LEGENDRE_DEFAULT_MAX_DIM = 0
#: Largest dimension at which :func:`legendre_entropy` stayed within 0.05 nats of the truth
#: on the accuracy map (order 8: worst 0.013 at d = 3; 0.074 at d = 4, 0.26 at d = 5,
#: 2.0 at d = 10, 6.9 at d = 20). Beyond it the function warns.
LEGENDRE_ACCURATE_MAX_DIM = 3
#: Largest dimension at which the series and Monte Carlo (``"legendre"``,
#: ``"legendre_normalized"``, ``"taylor"``, ``"monte_carlo"``) accept low-rank components
#: (``cov_factor``, ``cov_diag``): they run on the dense Cholesky factors of ``W W^T + diag D``
#: (``K`` matrices ``d x d``). Beyond it they raise ``ValueError`` before allocating. The mixing
#: rule (``"auto"``, ``"mixing_qmc"``), the single bounds (``"huber_lower"``, ...,
#: ``"moment_matched_upper"``: :func:`numpyro_gmm._kernels.lowrank.named_bound`) and
#: ``GaussianMixture.entropy_bounds`` (:func:`lowrank_entropy_bounds`) work on the factors at
#: every ``d``.
LOWRANK_DENSE_MAX_DIM = 100
#: The largest elongation ``max_k,i |W_k[i]|^2 / D_k[i]`` of low-rank components whose dense
#: float32 factors those estimators use. The factor ``sqrt(D) chol(I + V V^T)``,
#: ``V = D^{-1/2} W``, is computed with an error of about ``eps |V|^2`` in its unit
#: directions, so beyond about ``1e4`` the bounds and Monte Carlo lose their guarantees:
#: measured on three mixtures of three components (d = 5, r = 2, weights 1e-6 / 0.5 / 0.5,
#: truth the float64 bracket, width <= 4e-5 there), at elongations 4.6e4-5.7e6 the float32
#: upper bound fell below the truth by 1e-3 to 0.09 nats and the Monte Carlo estimate was
#: off by as much with a standard error of 2e-6 to 1e-5, while the default (the low-rank
#: mixing rule, on the factors themselves) stayed within 1e-6. Beyond it, float32 inputs
#: raise ``ValueError`` (concrete values) or give NaN (traced ones). Float64 has no limit,
#: but its factors carry the same ``eps |V|^2`` (a single component's closed-form entropy
#: was 1e-11 .. 3.8e-4 nats outside the dense float64 bracket at elongations 1e6 .. 1e12).
#: ``GaussianMixture.entropy_bounds`` and the single bounds of low-rank components work on the
#: factors instead (:func:`lowrank_entropy_bounds`), in every dtype and at any elongation, and
#: ``monte_carlo`` counts the dense factors' rounding in its standard error.
LOWRANK_DENSE_FLOAT32_MAX_ELONGATION = 1e4
#: Name of the default estimator of :func:`mixture_entropy` and ``GaussianMixture.entropy``.
DEFAULT_METHOD = "auto"

Array = jnp.ndarray


def _check(logits, locs, scale_tril, scale):
    """Validate the shapes and find the float dtype, in Python before any tracing:
    ``(K, d, dtype)``; ``ValueError`` naming the argument."""
    K, d = check_mixture_shapes(logits, locs, scale_tril, scale)
    return K, d, float_dtype(logits, locs, scale_tril if scale is None else scale)


def _cast(logits, locs, scale_tril, scale, dtype):
    """The kernels' inputs ``(log_w, locs, scale_tril, scale, ok)`` in ``dtype`` (traced)."""
    factor = scale_tril if scale is None else scale
    logits = jnp.asarray(logits, dtype)
    locs = jnp.asarray(locs, dtype)
    factor = jnp.asarray(factor, dtype)
    if scale is None:
        factor = jnp.tril(factor)  # only the lower triangle of a Cholesky factor counts
    scale_tril, scale = (factor, None) if scale is None else (None, factor)
    # NaN or +inf logits, or non-finite locs/scales, make the result NaN; -inf logits
    # are legitimate zero weights.
    ok = all_finite(locs, factor) & ~jnp.any(jnp.isnan(logits) | (logits == jnp.inf))
    return log_softmax(logits), locs, scale_tril, scale, ok


@functools.partial(jax.jit, static_argnames=("body", "dtype", "static"))
def _compiled(logits, locs, scale_tril, scale, dynamic, *, body, dtype, static):
    """``body(log_w, locs, scale_tril, scale, **static, **dynamic)`` after :func:`_cast`,
    NaN where a parameter is not finite, compiled as one program per shape and static
    option. (Called eagerly, the kernels would dispatch, and compile, each of their
    operations on its own: measured 200 compilations and 10.6 CPU-seconds for one eager
    ``legendre_entropy`` against 2 and 1.8 s jitted. Under an outer ``jit``, ``grad`` or
    ``vmap`` this is an ordinary nested ``jit``.)"""
    log_w, locs, scale_tril, scale, ok = _cast(logits, locs, scale_tril, scale, dtype)
    out = body(log_w, locs, scale_tril, scale, **dict(static), **dynamic)
    return jax.tree.map(lambda x: jnp.where(ok, x, jnp.asarray(jnp.nan, x.dtype)), out)


def _run(body, logits, locs, scale_tril, scale, dtype, dynamic=None, **static):
    """:func:`_compiled` with the validated static options as keywords and the traced ones
    (keys, array-valued options) in ``dynamic``."""
    return _compiled(
        logits, locs, scale_tril, scale, dynamic or {}, body=body, dtype=jnp.dtype(dtype),
        static=tuple(sorted(static.items())),
    )


def _a_option(a) -> tuple[dict, dict]:
    """The ``a`` option split for :func:`_run`: ``None``, ``"paper"`` and ``"mode"`` static,
    a positive scalar traced; ``ValueError`` for anything else."""
    if a is None or isinstance(a, str):
        if a not in (None, "paper", "mode"):
            raise ValueError(f"a must be None, 'paper', 'mode' or a positive scalar, got {a!r}")
        return {"a": a}, {}
    if jnp.ndim(a) != 0:
        raise ValueError(f"a must be a positive scalar, got shape {jnp.shape(a)}")
    return {}, {"a": a}


def _user_log_a(a, log_w, locs, scale_tril, scale):
    """``ln a`` for the ``a`` option: ``None``/``"paper"`` -> ``None`` (the kernel's bound),
    ``"mode"`` -> ln of the highest mode found, a positive scalar -> its log."""
    if a is None or (isinstance(a, str) and a == "paper"):
        return None
    if isinstance(a, str):  # "mode" (checked by _a_option)
        return _modes.log_max_density(log_w, locs, scale_tril, scale)
    return jnp.log(jnp.asarray(a, locs.dtype))


def _moments(log_w, locs, scale_tril, scale, *, order, a, block_size):
    """``(ln a, ln E_p[(p/a)^k] for k = 1..order)`` for the ``a`` option.

    The engine computes the moments for the paper's bound ``a0``; another ``a`` only
    rescales them: ``E[(p/a)^k] = E[(p/a0)^k] (a0/a)^k``.
    """
    log_a_user = _user_log_a(a, log_w, locs, scale_tril, scale)
    log_a, lm = log_moments(log_w, locs, scale_tril, scale, k_max=order, block_size=block_size)
    if log_a_user is None:
        return log_a, lm
    return log_a_user, lm - jnp.arange(1, order + 1, dtype=lm.dtype) * (log_a_user - log_a)


def _legendre_body(log_w, locs, scale_tril, scale, *, order, a, block_size):
    log_a, lm = _moments(log_w, locs, scale_tril, scale, order=order, a=a, block_size=block_size)
    return _legendre.legendre_entropy_from_moments(lm, log_a, order)


def _taylor_body(log_w, locs, scale_tril, scale, *, order, block_size):
    log_a, lm = _moments(log_w, locs, scale_tril, scale, order=order, a=None, block_size=block_size)
    return _taylor.taylor_entropy_from_moments(lm, log_a, order)


def _gamma_body(log_w, locs, scale_tril, scale, *, order, a, block_size):
    log_a, lm = _moments(log_w, locs, scale_tril, scale, order=order, a=a, block_size=block_size)
    return _frontier.gamma_entropy_from_moments(lm, log_a, order)


def _normalized_legendre_body(log_w, locs, scale_tril, scale, *, order, a, block_size):
    log_a, lm = _moments(log_w, locs, scale_tril, scale, order=order, a=a, block_size=block_size)
    return _frontier.normalized_legendre_entropy_from_moments(lm, log_a, order, locs.shape[-1])


def _check_order(order, dtype) -> int:
    """A Legendre order: an int ``>= 1``; a ``UserWarning`` beyond the dtype's safe order
    (:data:`FLOAT32_SAFE_ORDER`, :data:`FLOAT64_SAFE_ORDER`)."""
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
    elif dtype == jnp.float64 and order > FLOAT64_SAFE_ORDER:
        warnings.warn(
            f"order={order} exceeds the float64-safe order {FLOAT64_SAFE_ORDER}: the Legendre "
            "series cancels catastrophically in float64 beyond it (measured 0.63 nats off at "
            f"order 28, 14 at order 30). Use order <= {FLOAT64_SAFE_ORDER}.",
            UserWarning,
            stacklevel=3,
        )
    return order


def _check_taylor_order(order, dtype) -> int:
    """A Taylor order: an int ``>= 1``, clamped with a ``UserWarning`` to
    :data:`TAYLOR_MAX_ORDER` of the dtype (beyond it rounding can lift the bound above the
    entropy)."""
    order = check_int("order", order, 1)
    limit = TAYLOR_MAX_ORDER[jnp.dtype(dtype).name]
    if order > limit:
        warnings.warn(
            f"order={order} exceeds the highest order {limit} at which the Taylor lower bound "
            f"stays certified in {jnp.dtype(dtype).name} (rounding of its alternating "
            f"coefficients, which grow like 2^N/N); using order={limit}.",
            UserWarning,
            stacklevel=3,
        )
        order = limit
    return order


def _validates_order(fn):
    """Check ``order`` (an int ``>= 1``) before ``fn`` runs, whatever the dimension (an
    estimator that dispatches on ``d`` may not use it)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "order" in kwargs:
            check_int("order", kwargs["order"], 1)
        return fn(*args, **kwargs)

    return wrapper


def _check_legendre_dim(d: int) -> None:
    if d > LEGENDRE_ACCURATE_MAX_DIM:
        warnings.warn(
            f"legendre_entropy in d={d} dimensions: the Legendre series degrades with dimension "
            "(measured worst error at order 8: 0.074 nats at d=4, 0.26 at d=5, 2.0 at d=10, "
            "6.9 at d=20; docs/accuracy.md). method='auto' (the default) or "
            "mixing_qmc_entropy stays within 0.01 nats there.",
            UserWarning,
            stacklevel=3,
        )


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
    is accurate to about 0.01 nats in one to three dimensions at the default order and
    degrades with dimension (see the documentation's accuracy table); for
    ``d > LEGENDRE_ACCURATE_MAX_DIM`` a ``UserWarning`` says by how much.

    Args:
      logits: ``(K,)`` unnormalised log mixture weights (``-inf`` means weight 0).
      locs: ``(K, d)`` component means.
      scale_tril: ``(K, d, d)`` lower Cholesky factors of the component covariances.
      scale: ``(K, d)`` standard deviations of diagonal covariances (instead of ``scale_tril``).
      order: static degree ``N >= 1`` of the series. Beyond :data:`FLOAT32_SAFE_ORDER`
        float32 is not accurate and a ``UserWarning`` is emitted.
      a: an upper bound on the density, default (``None`` or ``"paper"``) the paper's
        ``sum_i w_i N(mu_i; mu_i, Sigma_i)``. A value below ``max p`` takes ``u`` outside
        ``[0, 1]``, where the series is not an approximation of ``ln u``. ``"mode"`` uses
        the highest mode found by fixed-point iterations from every mean
        (:func:`numpyro_gmm._kernels.modes.log_max_density`): tighter, but not guaranteed
        to be ``>= max p`` (see the accuracy table for when it helps).
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
      1.77
    """
    _, d, dtype = _check(logits, locs, scale_tril, scale)
    order = _check_order(order, dtype)
    _check_legendre_dim(d)
    static, dynamic = _a_option(a)
    block_size = check_int("block_size", block_size, 1)
    return _run(_legendre_body, logits, locs, scale_tril, scale, dtype, dynamic, order=order, block_size=block_size, **static)


def taylor_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    order: int = DEFAULT_ORDER,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Array:
    r"""Truncated convergent Taylor series of ``ln p`` around ``a``: a certified lower bound.

    .. math::

        H_N = -\ln a + \sum_{n=1}^{N} \frac1n E_p\big[(1 - p(X)/a)^n\big] \;\le\; H[p],

    with the paper's ``a = sum_i w_i N(mu_i; mu_i, Sigma_i) >= max p``, so every dropped
    term is ``<= 0``; the bound rises monotonically with ``N`` towards ``H`` (slowly: it
    is the loosest of the moment estimators). Dahlke & Pacheco, *On convergence of
    polynomial approximations to the Gaussian mixture entropy*, NeurIPS 2023. Uses the same
    power moments as :func:`legendre_entropy`; its coefficients grow like ``2^N / N``, so
    rounding limits the order less than for the Legendre series but still does: orders above
    :data:`TAYLOR_MAX_ORDER` (24 in float32, 50 in float64) are clamped to it with a
    ``UserWarning`` (measured: float32 order 46 lands above the entropy).

    Args: as :func:`legendre_entropy` (``order >= 1``; no ``a``: the bound needs the paper's).
    Returns: a scalar; NaN when a parameter is not finite.
    """
    _, _, dtype = _check(logits, locs, scale_tril, scale)
    order = _check_taylor_order(order, dtype)
    block_size = check_int("block_size", block_size, 1)
    return _run(_taylor_body, logits, locs, scale_tril, scale, dtype, order=order, block_size=block_size)


def gamma_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    order: int = DEFAULT_ORDER,
    a: Array | float | str | None = "mode",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Array:
    r"""Gamma fit of ``t = -ln(p(X)/a)`` plus a polynomial correction: an EXPERIMENT, not
    one of the public estimators (not in :data:`ENTROPY_METHODS`, not exported).

    It can be far off: 93.0 nats on a mixture whose entropy is 2.74 (certified bounds
    2.7369-2.7378); the fit and its polynomial extrapolation have no error control. Kept
    only for ``benchmarks/accuracy.py``.

    The moments ``L(k) = E_p[(p/a)^k] = E_p[e^{-k t}]`` are the Laplace transform of ``t``
    and ``H = -ln a + E[t]``. Fit ``t ~ Gamma(s, theta)`` to ``L(1), L(2)``
    (``ln L(k) = -s ln(1 + k/theta)``), then correct the fit's mean ``s/theta`` by the slope
    at ``k = 0`` of the polynomial interpolating the residual
    ``r(k) = ln L(k) + s ln(1 + k/theta)`` at ``k = 0..N``:

    .. math::

        H \approx -\ln a + s/\theta - r'(0), \qquad
        r'(0) = \sum_{n=1}^{N} \frac{(-1)^{n+1}}{n} \Delta^n r(0).

    Exact for one Gaussian in any dimension (``t ~ Gamma(d/2, 1)`` when ``a`` is its
    maximum), and it works on ``ln L(k)`` directly, so the float32 cancellation of the
    Legendre series does not arise. Not a bound. Moments: Dahlke & Pacheco, NeurIPS 2023;
    the estimator is this project's (see :mod:`numpyro_gmm._kernels.frontier` and the
    accuracy table in the documentation).

    Args: as :func:`legendre_entropy`, with ``order >= 2`` and ``a`` defaulting to
      ``"mode"`` (the highest mode found from every mean; ``"paper"``/``None`` gives the
      paper's bound, a positive scalar is used as given).

    Returns: a scalar; NaN when a parameter is not finite.
    """
    _, _, dtype = _check(logits, locs, scale_tril, scale)
    order = check_int("order", order, 2)
    static, dynamic = _a_option(a)
    block_size = check_int("block_size", block_size, 1)
    return _run(_gamma_body, logits, locs, scale_tril, scale, dtype, dynamic, order=order, block_size=block_size, **static)


def normalized_legendre_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    order: int = DEFAULT_ORDER,
    a: Array | float | str | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Array:
    r"""Legendre series on Gaussian-normalised moments (an approximation, not a bound).

    .. math::

        H \approx -\ln a + \frac d2 - \sum_{k=0}^{N} w_k\, E_p[u^k]\,(1 + k)^{d/2},

    with ``u = p/a``, ``a`` the paper's bound by default, and ``w_k`` the monomial weights of
    the degree-``N`` polynomial closest to ``ln v`` in ``L2[0, 1]`` among those vanishing at
    ``v = 1`` (the paper's shifted-Legendre projection, made exact at the endpoint). ``(1 + k)^{-d/2}`` is ``E[u^k]`` for one ``d``-dimensional Gaussian with
    ``a`` its peak, so the series only has to model how the mixture departs from one Gaussian
    (``t = -ln u`` is treated as ``Gamma(d/2, 1)`` plus an offset; see
    :func:`numpyro_gmm._kernels.frontier.normalized_legendre_entropy_from_moments`). Exact for
    one Gaussian in any dimension; far more accurate
    than :func:`legendre_entropy` for ``d >= 5`` (docs/accuracy.md). Moments: Dahlke &
    Pacheco, NeurIPS 2023; the normalisation is this project's.

    Args: as :func:`legendre_entropy` (same float32 order limit and warning).
    Returns: a scalar; NaN when a parameter is not finite.
    """
    _, _, dtype = _check(logits, locs, scale_tril, scale)
    order = _check_order(order, dtype)
    static, dynamic = _a_option(a)
    block_size = check_int("block_size", block_size, 1)
    return _run(
        _normalized_legendre_body, logits, locs, scale_tril, scale, dtype, dynamic, order=order,
        block_size=block_size, **static,
    )


def _points_per_component(num_components: int, num_points: int | None) -> int:
    """``num_points`` checked (a positive int), or where ``None`` the default rule's for
    ``num_components`` components (:func:`numpyro_gmm._kernels.mixing.default_num_points`)."""
    if num_points is None:
        return default_num_points(num_components)
    return check_int("num_points", num_points, 1)


def mixing_qmc_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    num_points: int | None = None,
    key: Array | None = None,
) -> Array:
    r"""Exact Gaussian part plus the mixing part by a fixed quasi-Monte Carlo rule.

    .. math::

        H[p] = \sum_i w_i \tfrac12 \ln|2\pi e\Sigma_i| + H(w)
               - \sum_i w_i\, E_{z \sim N(0, I)}\big[H(r(\mu_i + L_i z))\big],

    exactly (``H(X) = H(X|Z) + H(Z) - H(Z|X)`` with the component label ``Z``), where
    ``r(x)`` are the responsibilities ``w_j N_j(x) / p(x)`` and ``H(r) in [0, ln K]``. Only
    the last, bounded expectation is approximated: by the mean over ``num_points`` fixed
    points ``z_m = Phi^{-1}(frac(u_m + s_i))``, ``u_m`` a scrambled Sobol' sequence with a
    fixed seed and ``s_i`` a fixed shift per component (the same points for every call; one
    shift per component makes the components' errors independent, so that they average out
    where many components overlap). Deterministic and differentiable in every
    parameter; exact for one component in any dimension; not a bound, but the fixed rule
    (``key=None``) is clipped to a certified bracket (above: the moment-matched Gaussian's
    entropy, exact in ``d <= 2`` and for diagonal covariances, relaxed by Hadamard's
    inequality for full ones, :func:`numpyro_gmm._kernels.mixing.certified_upper`; below: the pairwise
    Bhattacharyya bound relaxed to the distances to the heaviest component,
    :func:`numpyro_gmm._kernels.bounds.heaviest_pair_lower`), which can only bring it closer
    to the truth; the randomised rule is not clipped (it would be biased). Measured within
    0.01 nats of the truth on every mixture of the accuracy map and of the hard cases
    (narrow spikes in wide components, weights 1e-6, condition number 1e4, ``d`` up to
    1000, ``K`` up to 128), in float32 and float64 alike; see :mod:`numpyro_gmm._kernels.mixing` for the
    derivation and references (Kolchinsky & Tracey, Entropy 2017, for the decomposition;
    Sobol' 1967 and Owen 1995 for the point set). Cost ``O(K^2 M d^2)``
    (``O(K^2 M d)`` for diagonal covariances), independent of any series order.

    Args:
      logits, locs, scale_tril, scale: as :func:`legendre_entropy`.
      num_points: static number ``M`` of points per component, a power of 2; ``None``
        (default): ``DEFAULT_NUM_POINTS`` (1024) up to 64 components, then about ``2^16 / K``,
        at least 128 (:func:`numpyro_gmm._kernels.mixing.default_num_points`: the
        components' errors are independent and average out). An i.i.d. rule would have a
        standard error of at most ``ln(K) / (2 sqrt(M))``; the Sobol' points do better in
        practice.
      key: ``None`` (default): the fixed points, deterministic, with a small fixed bias in
        the value and the gradient (docs/accuracy.md). A ``jax.random`` key: the points
        shifted by one uniform random vector modulo 1 (randomised QMC, a Cranley-Patterson
        rotation), so the estimate and its gradient are unbiased; pass a fresh key per
        optimisation step (:class:`~numpyro_gmm.TraceEntropy_ELBO` does).

    Cost and memory: ``O(K^2 M d^2)`` work (diagonal ``O(K^2 M d)``); the components are
    visited one at a time, so the value and the gradient hold ``O(K M d + K d^2)`` floats
    (diagonal ``O(K M + K d)``) besides the parameters (docs/performance.md, scale table).

    Returns:
      A scalar of the inputs' floating dtype; NaN when a parameter is not finite.

    Example:
      >>> import jax.numpy as jnp
      >>> from numpyro_gmm import mixing_qmc_entropy
      >>> h = mixing_qmc_entropy(jnp.zeros(2), jnp.array([[-1.0], [1.0]]),
      ...                        scale=jnp.ones((2, 1)))
      >>> round(float(h), 3)  # SciPy quadrature: 1.75577
      1.756
    """
    K, d, dtype = _check(logits, locs, scale_tril, scale)
    num_points = _points_per_component(K, num_points)
    _mixing.sobol_points(num_points, d)  # ValueError unless a power of 2 (cached)
    return _run(_mixing.mixing_qmc_entropy, logits, locs, scale_tril, scale, dtype, {"key": key}, num_points=num_points)


@_validates_order
def auto_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    order: int = DEFAULT_ORDER,
    num_points: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    key: Array | None = None,
) -> Array:
    """The default estimator: :func:`mixing_qmc_entropy` (``num_points``, ``key``) in every
    dimension.

    The rule (docs/accuracy.md, "Why the default is not the Legendre series"): the Legendre
    series would be used for ``d <= LEGENDRE_DEFAULT_MAX_DIM``, which is 0, because on the
    mixtures measured it missed 0.01 nats even on simple ones (+0.0145 on two unit Gaussians
    2 apart in 1-D) and by nats on narrow-inside-wide mixtures, and no cheap per-mixture
    quantity predicted where it is accurate. The mixing rule was within 0.01 nats of
    independent truth (quadrature, long Monte Carlo) on every mixture measured, in float32
    and float64 (worst found: 0.0037 at d = 5, K = 4). Its cost, ``O(K^2 M d^2)`` (diagonal
    ``O(K^2 M d)``), has no combinatorial growth, so no size limit applies.

    ``order`` and ``block_size`` are accepted (and validated) so that an ``entropy_order``
    configured on a :class:`~numpyro_gmm.GaussianMixture` keeps working; they are used only
    by the Legendre branch, which the default rule never takes. Deterministic (``key=None``)
    or randomised (``key``, unbiased; see :func:`mixing_qmc_entropy`); differentiable.
    """
    check_int("order", order, 1)
    check_int("block_size", block_size, 1)
    if jnp.ndim(locs) >= 1 and jnp.shape(locs)[-1] <= LEGENDRE_DEFAULT_MAX_DIM:  # never with 0
        return legendre_entropy(logits, locs, scale_tril, scale=scale, order=order, block_size=block_size)
    return mixing_qmc_entropy(logits, locs, scale_tril, scale=scale, num_points=num_points, key=key)


#: Largest estimated peak memory (bytes) of the closed-form bounds (:func:`_check_bounds_cost`).
MAX_BOUNDS_BYTES = 1 << 33


def _bounds_bytes(K: int, d: int, itemsize: int, diagonal: bool, pairwise: bool = True) -> int:
    """Estimated peak memory (bytes) of the closed-form bounds. Full covariances: the pairwise
    bounds work on ``K^2`` dense ``d x d`` matrices (measured 1.24 GB peak for
    :func:`entropy_bounds` at ``K = 64``, ``d = 100``, float32), estimated as ``8 K^2 d^2``
    floats; the moment-matched bound on ``K`` of them (``4 K d^2``). Diagonal covariances: one
    block of rows at a time (``8 rows K d`` floats, see
    :func:`numpyro_gmm._kernels.bounds.diagonal_rows_per_block`) plus the ``K x K`` results;
    the moment-matched bound ``4 K d + 4 min(K, d)^2``."""
    if diagonal:
        rows = _bounds.diagonal_rows_per_block(K, d)
        floats = 8 * rows * K * d + 8 * K * K if pairwise else 4 * K * d + 4 * min(K, d) ** 2
    else:
        floats = 8 * K * K * d * d if pairwise else 4 * K * d * d
    return itemsize * floats


def _check_bounds_cost(name: str, K: int, d: int, itemsize: int, diagonal: bool, pairwise: bool = True) -> None:
    """``ValueError`` before allocating when a closed-form bound would need more than
    :data:`MAX_BOUNDS_BYTES` (estimated by ``_bounds_bytes``)."""
    nbytes = _bounds_bytes(K, d, itemsize, diagonal, pairwise)
    if nbytes > MAX_BOUNDS_BYTES:
        what = "K^2 = " + str(K * K) + " pairs of" if pairwise else "K"
        raise ValueError(
            f"{name} with K={K} components in d={d} dimensions works on {what} dense d x d "
            f"matrices: about {nbytes / 2**30:.3g} GiB, beyond the limit of "
            f"{MAX_BOUNDS_BYTES / 2**30:.3g} GiB. Use fewer components, diagonal covariances "
            "(O(K^2 d) memory-bounded), or method='auto' or huber_upper_bound (O(K d))."
        )


def _closed_form(kernel, pairwise=True):
    def fn(logits, locs, scale_tril=None, *, scale=None):
        K, d, dtype = _check(logits, locs, scale_tril, scale)
        if kernel is not _bounds.huber_upper:
            _check_bounds_cost(kernel.__name__, K, d, jnp.dtype(dtype).itemsize, scale is not None, pairwise)
        return _run(_rescaled_body, logits, locs, scale_tril, scale, dtype, kernel=kernel)

    return fn


def _rescaled_body(log_w, locs, scale_tril, scale, *, kernel):
    locs, scale_tril, scale, shift = _bounds.rescaled(locs, scale_tril, scale)  # exact
    return kernel(log_w, locs, scale_tril, scale) + shift


def huber_lower_bound(logits, locs, scale_tril=None, *, scale=None) -> Array:
    r"""Huber et al. lower bound (Jensen per component), certified:

    .. math::

        H \ge -\sum_i w_i \ln \sum_j w_j\, N(\mu_i; \mu_j, \Sigma_i + \Sigma_j).

    M. Huber, T. Bailey, H. Durrant-Whyte, U. Hanebeck, *On entropy approximation for
    Gaussian mixture random vectors*, MFI 2008. ``O(K^2 d^3)``, no power moments.
    """
    return _closed_form(_bounds.huber_lower)(logits, locs, scale_tril, scale=scale)


def huber_upper_bound(logits, locs, scale_tril=None, *, scale=None) -> Array:
    r"""Huber et al. upper bound ``H(X) <= H(X, Z)``, certified:

    .. math::

        H \le \sum_i w_i \big(-\ln w_i + \tfrac12 \ln|2\pi e \Sigma_i|\big).

    Huber et al., MFI 2008 (see :func:`huber_lower_bound`). Tight for well-separated
    components, loose (by up to ``ln K``) for overlapping ones.
    """
    return _closed_form(_bounds.huber_upper)(logits, locs, scale_tril, scale=scale)


def pairwise_bhattacharyya_lower_bound(logits, locs, scale_tril=None, *, scale=None) -> Array:
    r"""Kolchinsky & Tracey pairwise-distance estimator with the Bhattacharyya distance, a
    certified lower bound:

    .. math::

        H \ge \sum_i w_i H_i - \sum_i w_i \ln \sum_j w_j e^{-D_B(p_i, p_j)},\quad
        D_B = \tfrac18 \Delta\mu^T \bar\Sigma^{-1} \Delta\mu
              + \tfrac12 \ln\frac{|\bar\Sigma|}{\sqrt{|\Sigma_i||\Sigma_j|}},\
        \bar\Sigma = \tfrac{\Sigma_i + \Sigma_j}{2}.

    A. Kolchinsky, B. Tracey, *Estimating mixture entropy with pairwise distances*,
    Entropy 19(7), 2017.
    """
    return _closed_form(_bounds.pairwise_bhattacharyya_lower)(logits, locs, scale_tril, scale=scale)


def pairwise_kl_upper_bound(logits, locs, scale_tril=None, *, scale=None) -> Array:
    r"""Kolchinsky & Tracey pairwise-distance estimator with the Kullback-Leibler
    divergence, a certified upper bound:
    ``H <= sum_i w_i H_i - sum_i w_i ln sum_j w_j exp(-KL(p_i || p_j))``.

    Kolchinsky & Tracey, Entropy 19(7), 2017 (see :func:`pairwise_bhattacharyya_lower_bound`).
    """
    return _closed_form(_bounds.pairwise_kl_upper)(logits, locs, scale_tril, scale=scale)


def moment_matched_upper_bound(logits, locs, scale_tril=None, *, scale=None) -> Array:
    r"""Entropy of the moment-matched Gaussian, a certified upper bound (a Gaussian has the
    largest entropy for a given covariance):

    .. math::

        H \le \tfrac12 \ln|2\pi e\, \Sigma_{mix}|, \quad
        \Sigma_{mix} = \sum_i w_i \big(\Sigma_i + (\mu_i - \bar\mu)(\mu_i - \bar\mu)^T\big).

    Cover & Thomas, *Elements of Information Theory*, theorem 8.6.5; listed among the
    bounds in Huber et al., MFI 2008. Diagonal covariances take the determinant from the
    ``min(K, d)``-sized side (the determinant lemma) with a bound on its rounding added, so
    that float32 does not fall below the exact value where deviations are long; where a
    factorisation is not finite (float32, separations of ``10^4`` standard deviations), the
    larger, finite Hadamard bound ``sum_l ln (Sigma_mix)_ll`` is returned instead of NaN
    (:func:`numpyro_gmm._kernels.bounds.moment_matched_upper`).
    """
    return _closed_form(_bounds.moment_matched_upper, pairwise=False)(logits, locs, scale_tril, scale=scale)


def monte_carlo_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    key: Array,
    num_samples: int = 4096,
):
    r"""Monte Carlo estimate and its standard error, ``(estimate, se)``.

    .. math::

        H = \sum_i w_i (H_i - \ln w_i) - E_p\Big[-\sum_k r_k(X) \ln r_k(X)\Big],\quad
        r_k = w_k N_k / p,

    with the component entropies ``H_i`` exact and the expected entropy of the
    responsibilities estimated by multiple importance sampling: ``K^2`` strata, each
    component and, for each ordered pair, a Gaussian on the layer where the pair's
    densities cross (between them, or, for a narrow component inside a wider one, the
    shell around the narrow one), combined by the balance heuristic with a defensive half on the
    mixture itself (Veach & Guibas 1995; Hesterberg 1995); formulas in
    ``numpyro_gmm._kernels.monte_carlo``. Unbiased, not a bound; reparameterised, so its
    gradient is an unbiased estimate of the entropy's gradient with respect to every
    parameter. ``se`` is the sample standard error over the strata plus the float
    rounding of the closed-form part (for low-rank components, given as ``cov_factor`` /
    ``cov_diag`` to :func:`mixture_entropy` or ``GaussianMixture``, the closed-form part comes
    from the determinant lemma and ``se`` also counts the rounding of their dense factors,
    :func:`numpyro_gmm._kernels.lowrank.dense_factor_correction`); its coverage (fraction of estimates within 2 and 3
    ``se`` of the truth, close to the normal's 95% / 99.7%) is tested from overlapping to
    well-separated and nested components in float32 and float64.

    Args:
      key: a ``jax.random`` key.
      num_samples: static total number of draws, ``max(2, ceil(num_samples / K^2))`` per
        stratum (``>= 2 K``).
    """
    K, _, dtype = _check(logits, locs, scale_tril, scale)
    num_samples = check_int("num_samples", num_samples, 2 * K)
    return _run(_monte_carlo.monte_carlo_entropy, logits, locs, scale_tril, scale, dtype, {"key": key}, num_samples=num_samples)


def entropy_bounds(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    order: int = DEFAULT_ORDER,
    block_size: int = DEFAULT_BLOCK_SIZE,
):
    """Tightest certified bounds ``(lower, upper)`` on the entropy.

    ``lower = max(huber_lower, pairwise_bhattacharyya_lower[, taylor(order)])`` and
    ``upper = min(huber_upper, pairwise_kl_upper, moment_matched_upper)`` (see each
    function for its formula and reference). Every term is a bound in exact arithmetic.

    * The Taylor lower bound is included only for ``d <= TAYLOR_BOUND_MAX_DIM`` (2): beyond
      it it cannot compete (it misses ``H`` by about ``d/2 - ln(order)`` for one Gaussian)
      and its power moments are the only costly part. ``order`` (an int ``>= 1``, checked in
      every dimension) is clamped to :data:`TAYLOR_MAX_ORDER` with a warning. It is also left
      out when its power moments need more than :data:`TAYLOR_BOUND_MAX_COMPOSITIONS`
      compositions (``K > 16`` at order 8), so the bounds stay cheap for any ``K``.
    * The bounds are evaluated in rescaled units (:func:`numpyro_gmm._kernels.bounds.rescaled`:
      ``H(cY) = H(Y) + d ln c``), so scales far from 1 (``1e-20``, ``1e20`` in float32) do
      not under- or overflow.
    * A term that is not finite (an overflow at extreme parameter ratios) is dropped; both
      results are widened outwards by ``16 eps (1 + |upper| + |d ln c|)`` to cover rounding, and
      ``lower <= upper`` always holds (``lower`` is capped at ``upper``, whose main term
      ``huber_upper`` is a closed form without solves).
    * Memory: with full covariances ``K^2`` dense ``d x d`` matrices; beyond
      :data:`MAX_BOUNDS_BYTES` of estimated memory (``8 K^2 d^2`` floats;
      e.g. ``K = 128``, ``d = 100`` in float32 fits, ``K = 512``, ``d = 1000`` does not) a
      ``ValueError`` is raised before anything is allocated. Diagonal covariances never form a
      ``d x d`` matrix: ``O(K^2 d)`` operations in blocks of rows, memory bounded for any
      ``K`` and ``d`` (value and gradient).

    Unbatched; use ``jax.vmap`` for a batch. NaN (both) when a parameter is not finite.
    """
    K, d, dtype = _check(logits, locs, scale_tril, scale)
    order = check_int("order", order, 1)
    _check_bounds_cost("entropy_bounds", K, d, jnp.dtype(dtype).itemsize, scale is not None)
    taylor_order = _check_taylor_order(order, dtype) if d <= TAYLOR_BOUND_MAX_DIM else 0
    if taylor_order:
        comps, _ = moment_cost(K, d, taylor_order, scale is not None, jnp.dtype(dtype).itemsize)
        if comps > TAYLOR_BOUND_MAX_COMPOSITIONS:
            taylor_order = 0
    block_size = check_int("block_size", block_size, 1)
    return _run(_bounds_body, logits, locs, scale_tril, scale, dtype, taylor_order=taylor_order, block_size=block_size)


def _bounds_body(log_w, locs_, tril_, scale_, *, taylor_order, block_size):
    """:func:`entropy_bounds` after validation (compiled by :func:`_run`)."""
    locs_, tril_, scale_, shift = _bounds.rescaled(locs_, tril_, scale_)

    def finite_or(x, fill):
        return jnp.where(jnp.isfinite(x), x, fill)

    lowers = [
        _bounds.huber_lower(log_w, locs_, tril_, scale_),
        _bounds.pairwise_bhattacharyya_lower(log_w, locs_, tril_, scale_),
    ]
    if taylor_order:
        lowers.append(_taylor_body(log_w, locs_, tril_, scale_, order=taylor_order, block_size=block_size))
    uppers = [
        _bounds.huber_upper(log_w, locs_, tril_, scale_),
        _bounds.pairwise_kl_upper(log_w, locs_, tril_, scale_),
        _bounds.moment_matched_upper(log_w, locs_, tril_, scale_),
    ]
    lower = jnp.max(jnp.stack([finite_or(x, -jnp.inf) for x in lowers]))
    upper = jnp.min(jnp.stack([finite_or(x, jnp.inf) for x in uppers]))
    return _bounds.shifted_bracket(lower, upper, shift)


#: Estimators reachable through :func:`mixture_entropy` and ``GaussianMixture.entropy``.
#: Each takes ``(logits, locs, scale_tril=None, *, scale=None, **options)``.
ENTROPY_METHODS = {
    "auto": auto_entropy,
    "legendre": legendre_entropy,
    "mixing_qmc": mixing_qmc_entropy,
    "taylor": taylor_entropy,
    "legendre_normalized": normalized_legendre_entropy,
    "huber_lower": huber_lower_bound,
    "huber_upper": huber_upper_bound,
    "pairwise_bhattacharyya_lower": pairwise_bhattacharyya_lower_bound,
    "pairwise_kl_upper": pairwise_kl_upper_bound,
    "moment_matched_upper": moment_matched_upper_bound,
    "monte_carlo": monte_carlo_entropy,
}


def mixture_entropy(
    logits: Array,
    locs: Array,
    scale_tril: Array | None = None,
    *,
    scale: Array | None = None,
    cov_factor: Array | None = None,
    cov_diag: Array | None = None,
    method: str = DEFAULT_METHOD,
    **options,
):
    """Entropy of one mixture by the estimator named ``method`` (see :data:`ENTROPY_METHODS`;
    the default ``"auto"`` is :func:`auto_entropy`).

    ``options`` go to that estimator (for example ``order`` for ``"legendre"``).

    Low-rank components ``Sigma_k = W_k W_k^T + diag(D_k)``: give ``cov_factor (K, d, r)``
    and ``cov_diag (K, d)`` instead of ``scale_tril`` / ``scale``. ``"auto"`` and
    ``"mixing_qmc"`` then run :func:`lowrank_mixing_qmc_entropy` (``O(K^2 M d r)``, no
    ``d x d`` matrix); the single bounds (``"huber_lower"``, ``"huber_upper"``,
    ``"pairwise_bhattacharyya_lower"``, ``"pairwise_kl_upper"``, ``"moment_matched_upper"``) work
    on the factors too (:func:`numpyro_gmm._kernels.lowrank.named_bound`: the pieces of
    :func:`lowrank_entropy_bounds`, the moment-matched bound by the determinant lemma); the
    series and ``"monte_carlo"`` run on the dense factors of ``W W^T + diag D`` for ``d <=
    LOWRANK_DENSE_MAX_DIM`` and raise ``ValueError`` beyond.
    """
    try:
        fn = ENTROPY_METHODS[method]
    except KeyError:
        raise ValueError(f"method must be one of {sorted(ENTROPY_METHODS)}, got {method!r}") from None
    if cov_factor is not None or cov_diag is not None:
        if scale_tril is not None or scale is not None:
            raise ValueError("give either scale_tril / scale or cov_factor and cov_diag, not both")
        if method in ("auto", "mixing_qmc"):
            if method == "auto":  # accepted (and checked) as auto_entropy does; unused
                check_int("order", options.pop("order", DEFAULT_ORDER), 1)
                check_int("block_size", options.pop("block_size", DEFAULT_BLOCK_SIZE), 1)
            return lowrank_mixing_qmc_entropy(logits, locs, cov_factor, cov_diag, **options)
        if method in _lowrank.NAMED_BOUNDS:  # on the factors: any d, no dense rounding
            if options:
                raise ValueError(f"method={method!r} takes no options, got {sorted(options)}")
            _check_lowrank(logits, locs, cov_factor, cov_diag)
            dtype = jnp.dtype(float_dtype(logits, locs, cov_factor, cov_diag))
            return _lowrank_bounds_compiled(logits, locs, cov_factor, cov_diag, dtype=dtype, name=method)
        tril = dense_lowrank_tril(logits, locs, cov_factor, cov_diag, method=method)
        if method == "monte_carlo":  # closed-form part by the determinant lemma, rounding in se
            h, se = fn(logits, locs, tril, **options)
            delta, rounding = _lowrank.dense_factor_correction(
                log_softmax(jnp.asarray(logits, h.dtype)), jnp.asarray(cov_factor, h.dtype), jnp.asarray(cov_diag, h.dtype), tril
            )
            return h + delta, jnp.sqrt(jnp.square(se) + jnp.square(rounding))
        return fn(logits, locs, tril, **options)
    return fn(logits, locs, scale_tril, scale=scale, **options)


def _check_lowrank(logits, locs, cov_factor, cov_diag):
    """Shapes ``logits (K,)``, ``locs (K, d)``, ``cov_factor (K, d, r)``, ``cov_diag (K, d)``;
    returns ``(K, d, r)``."""
    if cov_factor is None or cov_diag is None:
        raise ValueError("give both cov_factor (K, d, r) and cov_diag (K, d)")
    if jnp.ndim(locs) != 2:
        raise ValueError(f"locs must have shape (K, d), got {jnp.shape(locs)}")
    K, d = jnp.shape(locs)
    if K == 0 or d == 0:
        raise ValueError(f"locs must have K >= 1 components of dimension d >= 1, got shape {jnp.shape(locs)}")
    if jnp.shape(logits) != (K,):
        raise ValueError(f"logits must have shape (K,) = ({K},) to match locs, got {jnp.shape(logits)}")
    fs = jnp.shape(cov_factor)
    if len(fs) != 3 or fs[:2] != (K, d) or fs[2] < 1:
        raise ValueError(f"cov_factor must have shape (K, d, r) = ({K}, {d}, r) with r >= 1 to match locs, got {fs}")
    if jnp.shape(cov_diag) != (K, d):
        raise ValueError(f"cov_diag must have shape (K, d) = ({K}, {d}) to match locs, got {jnp.shape(cov_diag)}")
    return K, d, fs[2]


@functools.partial(jax.jit, static_argnames=("dtype", "num_points"))
def _lowrank_compiled(logits, locs, cov_factor, cov_diag, key, *, dtype, num_points):
    """:func:`lowrank_mixing_qmc_entropy` after validation, one program per shape (as
    :func:`_compiled`)."""
    logits, locs, cov_factor, cov_diag = (jnp.asarray(x, dtype) for x in (logits, locs, cov_factor, cov_diag))
    ok = (
        all_finite(locs, cov_factor, cov_diag)
        & jnp.all(cov_diag > 0)
        & ~jnp.any(jnp.isnan(logits) | (logits == jnp.inf))
    )
    h = _lowrank.lowrank_mixing_qmc_entropy(log_softmax(logits), locs, cov_factor, cov_diag, num_points=num_points, key=key)
    return jnp.where(ok, h, jnp.asarray(jnp.nan, h.dtype))


def lowrank_mixing_qmc_entropy(
    logits: Array,
    locs: Array,
    cov_factor: Array,
    cov_diag: Array,
    *,
    num_points: int | None = None,
    key: Array | None = None,
) -> Array:
    r""":func:`mixing_qmc_entropy` for low-rank-plus-diagonal components
    ``Sigma_k = W_k W_k^T + diag(D_k)``, ``cov_factor = W (K, d, r)``, ``cov_diag = D (K, d)``
    (NumPyro's ``LowRankMultivariateNormal`` parameterisation).

    The same exact split and the same rule, with the points moved by the exact
    reparameterisation ``x = mu_i + W_i e + sqrt(D_i) eps``, ``(e, eps)`` from ``M``
    Sobol' points of dimension ``r + d``, and the component log-densities by the Woodbury
    identity and the matrix determinant lemma (``r x r`` capacitance
    ``I + W^T D^{-1} W``); see :mod:`numpyro_gmm._kernels.lowrank`. Cost ``O(K^2 M d r)``,
    memory ``O(M d + M K r + K d r)`` floats; no ``d x d`` matrix is formed. ``num_points``
    and ``key`` as in :func:`mixing_qmc_entropy`, the fixed rule likewise clipped to a
    certified bracket (``O(K d r^2)``, no factorisation). NaN when a parameter is not finite or
    ``cov_diag`` is not positive.
    """
    K, _, _ = _check_lowrank(logits, locs, cov_factor, cov_diag)
    dtype = jnp.dtype(float_dtype(logits, locs, cov_factor, cov_diag))
    num_points = _points_per_component(K, num_points)
    return _lowrank_compiled(logits, locs, cov_factor, cov_diag, key, dtype=dtype, num_points=num_points)


@functools.partial(jax.jit, static_argnames=("dtype", "name"))
def _lowrank_bounds_compiled(logits, locs, cov_factor, cov_diag, *, dtype, name=None):
    """:func:`lowrank_entropy_bounds` (``name=None``) or one named bound of low-rank components
    (:func:`numpyro_gmm._kernels.lowrank.named_bound`) after validation, one program per shape."""
    logits, locs, cov_factor, cov_diag = (jnp.asarray(x, dtype) for x in (logits, locs, cov_factor, cov_diag))
    ok = (
        all_finite(locs, cov_factor, cov_diag)
        & jnp.all(cov_diag > 0)
        & ~jnp.any(jnp.isnan(logits) | (logits == jnp.inf))
    )
    if name is None:
        bounds = _lowrank.entropy_bounds(log_softmax(logits), locs, cov_factor, cov_diag)
    else:
        bounds = _lowrank.named_bound(name, log_softmax(logits), locs, cov_factor, cov_diag)
    return jax.tree.map(lambda b: jnp.where(ok, b, jnp.asarray(jnp.nan, b.dtype)), bounds)


def lowrank_entropy_bounds(logits: Array, locs: Array, cov_factor: Array, cov_diag: Array) -> tuple[Array, Array]:
    r"""Certified ``(lower, upper)`` bounds on the entropy of a mixture of low-rank-plus-diagonal
    components ``Sigma_k = W_k W_k^T + diag(D_k)`` (``cov_factor = W (K, d, r)``, ``cov_diag =
    D (K, d)``), without a ``d x d`` matrix: the bounds of :func:`entropy_bounds` (Huber's
    pair, Kolchinsky & Tracey's pairwise Bhattacharyya and Kullback-Leibler bounds; the
    moment-matched bound relaxed to the one the low-rank rule is clipped to) by the
    determinant lemma and Woodbury's identity on each pair, with their rounding bounded
    outwards (:func:`numpyro_gmm._kernels.lowrank.entropy_bounds`). ``O(K^2 d r^2)``
    operations; memory of one block of rows of pairs at a time, for any ``K`` and ``d``.
    ``GaussianMixture.entropy_bounds`` uses it for every low-rank mixture: the dense factors
    of ``W W^T + diag D`` are rounded (a single float64 component with ``|W|^2 / D`` of
    1e6 .. 1e12 had its closed-form entropy 1e-11 .. 3.8e-4 nats outside the dense
    bracket; these contain it). NaN (both) when a parameter is not finite or ``cov_diag`` is
    not positive.
    """
    _check_lowrank(logits, locs, cov_factor, cov_diag)
    dtype = jnp.dtype(float_dtype(logits, locs, cov_factor, cov_diag))
    return _lowrank_bounds_compiled(logits, locs, cov_factor, cov_diag, dtype=dtype)


def dense_lowrank_tril(logits, locs, cov_factor, cov_diag, *, method: str = "this estimator") -> Array:
    """``(K, d, d)`` Cholesky factors of ``W W^T + diag D`` for the estimators that need
    dense factors; ``ValueError`` (before allocating) for ``d > LOWRANK_DENSE_MAX_DIM``, and
    in float32 for components more elongated than ``LOWRANK_DENSE_FLOAT32_MAX_ELONGATION``
    (NaN factors where the parameters are traced)."""
    K, d, r = _check_lowrank(logits, locs, cov_factor, cov_diag)
    check_lowrank_dense_dim(K, d, r, method)
    dtype = float_dtype(logits, locs, cov_factor, cov_diag)
    cov_factor, cov_diag = jnp.asarray(cov_factor, dtype), jnp.asarray(cov_diag, dtype)
    check_lowrank_dense_elongation(cov_factor, cov_diag, method)
    tril = _lowrank.dense_scale_tril(cov_factor, cov_diag)
    if dtype == jnp.float32:
        too_long = lowrank_elongation(cov_factor, cov_diag) > LOWRANK_DENSE_FLOAT32_MAX_ELONGATION
        tril = jnp.where(too_long, jnp.nan, tril)
    return tril


def lowrank_elongation(cov_factor: Array, cov_diag: Array, xp=jnp) -> Array:
    """``max_k,i |W_k[i]|^2 / D_k[i]`` over the last three / two axes of ``cov_factor (..., K,
    d, r)`` / ``cov_diag (..., K, d)``: shape ``(...)``; ``xp``: ``jax.numpy``, or ``numpy``
    for concrete values (no eager JAX dispatch)."""
    return xp.max(xp.sum(xp.square(cov_factor), -1) / cov_diag, axis=(-2, -1))


def check_lowrank_dense_elongation(cov_factor, cov_diag, method: str) -> None:
    """``ValueError`` when ``method`` would run on float32 dense factors of low-rank
    components more elongated than ``LOWRANK_DENSE_FLOAT32_MAX_ELONGATION`` (concrete
    values only; traced ones are checked in the program, see :func:`dense_lowrank_tril`)."""
    if jnp.result_type(cov_factor, cov_diag) != jnp.float32 or not all(map(not_jax_tracer, (cov_factor, cov_diag))):
        return
    # concrete values: NumPy, as the constructor's value checks (no eager JAX dispatch)
    w, dg = (np.asarray(x, np.float64) for x in (cov_factor, cov_diag))
    elongation = float(np.max(lowrank_elongation(w, dg, np)))
    if elongation > LOWRANK_DENSE_FLOAT32_MAX_ELONGATION:
        raise ValueError(
            f"method={method!r} needs the dense d x d factors of the low-rank components, and in "
            f"float32 they lose the components' short directions: max |W_k[i]|^2 / D_k[i] = "
            f"{elongation:.3g} > LOWRANK_DENSE_FLOAT32_MAX_ELONGATION = "
            f"{LOWRANK_DENSE_FLOAT32_MAX_ELONGATION:.0e} (bounds and Monte Carlo measured off by "
            "up to 0.09 nats there). Use float64 (jax.config.update('jax_enable_x64', True)), or "
            "the default estimator ('auto', the low-rank mixing rule), which works on the factors."
        )


def check_lowrank_dense_dim(K: int, d: int, r: int, method: str) -> None:
    """``ValueError`` when ``method`` would need dense factors of low-rank components with
    ``d > LOWRANK_DENSE_MAX_DIM``."""
    if d > LOWRANK_DENSE_MAX_DIM:
        raise ValueError(
            f"method={method!r} needs the dense d x d covariances of the low-rank components "
            f"(K={K}, d={d}, r={r}: {K * d * d} entries); it is available for "
            f"d <= LOWRANK_DENSE_MAX_DIM = {LOWRANK_DENSE_MAX_DIM}. The default ('auto', the "
            "mixing rule) works on the low-rank factors at any d."
        )
