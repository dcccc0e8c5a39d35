"""``GaussianMixture``: a NumPyro ``MixtureSameFamily`` of Gaussians with an ``entropy()``.

The class validates and holds the parameters and dispatches the entropy to
:func:`numpyro_gmm.entropy.mixture_entropy`; it does no numerics of its own beyond the
conversions between parameterisations and the mixture's moments.
"""

from __future__ import annotations

import copy
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro.distributions import (
    CategoricalLogits,
    CategoricalProbs,
    Independent,
    MixtureSameFamily,
    MultivariateNormal,
    Normal,
)
from numpyro.distributions.batch_util import promote_batch_shape, vmap_over
from numpyro.distributions.util import cholesky_of_inverse
from numpyro.util import not_jax_tracer

from .entropy import DEFAULT_METHOD, ENTROPY_METHODS, entropy_bounds, mixture_entropy
from ._validation import check_int, float_dtype

__all__ = ["GaussianMixture"]

#: Estimators that take an ``order`` option; a configured ``entropy_order`` is passed
#: only to these (an order given in the call is always passed).
ORDERED_METHODS = ("auto", "legendre", "taylor")

_COVARIANCE_ARGS = ("covariance_matrix", "scale_tril", "precision_matrix", "scale")


def _shape_str(shape):
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


class GaussianMixture(MixtureSameFamily):
    r"""A finite mixture of Gaussians, ``p(x) = sum_k w_k N(x; mu_k, Sigma_k)``.

    A :class:`numpyro.distributions.MixtureSameFamily` whose mixing distribution is a
    :class:`~numpyro.distributions.CategoricalLogits` and whose components are a
    :class:`~numpyro.distributions.MultivariateNormal` (full covariances) or
    ``Normal(loc, scale).to_event(1)`` (diagonal covariances, given as ``scale``; that path
    never forms a ``d x d`` matrix unless one is asked for). Everything the base class
    offers (``sample``, ``log_prob``, ``mean``, ``variance``, ``support``) works as usual;
    this class adds :meth:`entropy` (by the estimators of :mod:`numpyro_gmm.entropy`), the
    mixture's :attr:`covariance_matrix` and :meth:`from_mixture`.

    Args:
      loc: ``(..., K, d)`` component means.
      covariance_matrix: ``(..., K, d, d)`` component covariances, or
      scale_tril: ``(..., K, d, d)`` their lower Cholesky factors, or
      precision_matrix: ``(..., K, d, d)`` their inverses, or
      scale: ``(..., K, d)`` standard deviations of diagonal covariances. Exactly one of
        these four is given.
      logits: ``(..., K)`` unnormalised log weights, or
      probs: ``(..., K)`` weights summing to one. At most one; equal weights if neither.
      entropy_method: default estimator of :meth:`entropy`, a key of
        :data:`numpyro_gmm.ENTROPY_METHODS`; ``"auto"`` (:func:`numpyro_gmm.auto_entropy`):
        the Legendre series in 1-D and 2-D, the mixing rule beyond.
      entropy_order: default ``order`` of :meth:`entropy` for the estimators that take one
        (``None``: the estimator's own default).
      validate_args: check the parameters' values (ignored for traced values). Shapes
        are always checked.

    Leading dimensions ``...`` broadcast; ``batch_shape`` is their broadcast shape and
    ``event_shape`` is ``(d,)``. All parameters are stored broadcast to
    ``batch_shape + (K, ...)``. The entropy configuration is static pytree data, so it
    survives ``jax.jit`` and ``jax.vmap``.

    Example:
      >>> import jax.numpy as jnp
      >>> from numpyro_gmm import GaussianMixture
      >>> gm = GaussianMixture(jnp.array([[-1.0], [1.0]]), scale=jnp.ones((2, 1)))
      >>> round(float(gm.entropy()), 3)  # SciPy quadrature: 1.7558
      1.756
    """

    # The parameters live in the two component distributions (the base class's data
    # fields); ``loc``, ``scale_tril``, ... are read-only views of them, so none of them
    # may become a pytree data field.
    pytree_data_fields = ()
    pytree_aux_fields = ("_entropy_method", "_entropy_order", "_is_diagonal")

    def __init__(
        self,
        loc,
        covariance_matrix=None,
        *,
        scale_tril=None,
        precision_matrix=None,
        scale=None,
        logits=None,
        probs=None,
        entropy_method: str = DEFAULT_METHOD,
        entropy_order: int | None = None,
        validate_args: bool | None = None,
    ):
        if not isinstance(entropy_method, str) or entropy_method not in ENTROPY_METHODS:
            raise ValueError(
                f"entropy_method must be one of {sorted(ENTROPY_METHODS)}, got {entropy_method!r}"
            )
        if entropy_order is not None:
            entropy_order = check_int("entropy_order", entropy_order, 1)

        given = {
            "covariance_matrix": covariance_matrix,
            "scale_tril": scale_tril,
            "precision_matrix": precision_matrix,
            "scale": scale,
        }
        given = {k: v for k, v in given.items() if v is not None}
        if len(given) != 1:
            raise ValueError(
                "give exactly one of covariance_matrix, scale_tril, precision_matrix "
                f"(..., K, d, d) and scale (..., K, d); got {sorted(given) or 'none'}"
            )
        (cov_name, cov_value), = given.items()
        if logits is not None and probs is not None:
            raise ValueError("give at most one of logits and probs (..., K), not both")

        dtype = float_dtype(loc, cov_value, logits, probs)
        loc = jnp.asarray(loc, dtype)
        cov_value = jnp.asarray(cov_value, dtype)
        weight_name = "probs" if probs is not None else "logits"
        weight_value = None if (logits is None and probs is None) else jnp.asarray(
            probs if probs is not None else logits, dtype
        )

        # ---- shapes (always checked) ----
        if loc.ndim < 2:
            raise ValueError(f"loc must have shape (..., K, d), got {_shape_str(loc.shape)}")
        K, d = loc.shape[-2:]
        if K == 0 or d == 0:
            raise ValueError(f"loc must have K >= 1 components of dimension d >= 1, got shape {_shape_str(loc.shape)}")
        is_diagonal = cov_name == "scale"
        event_nd = 2 if is_diagonal else 3
        expected = (K, d) if is_diagonal else (K, d, d)
        if cov_value.ndim < event_nd or cov_value.shape[-event_nd:] != expected:
            lead = "(..., K, d)" if is_diagonal else "(..., K, d, d)"
            raise ValueError(
                f"{cov_name} must have shape {lead} = (..., {', '.join(map(str, expected))}) to match "
                f"loc {_shape_str(loc.shape)}, got {_shape_str(cov_value.shape)}"
            )
        if weight_value is not None and (weight_value.ndim < 1 or weight_value.shape[-1] != K):
            raise ValueError(
                f"{weight_name} must have shape (..., K) = (..., {K}) to match loc "
                f"{_shape_str(loc.shape)}, got {_shape_str(weight_value.shape)}"
            )
        shapes = {"loc": loc.shape[:-2], cov_name: cov_value.shape[:-event_nd]}
        if weight_value is not None:
            shapes[weight_name] = weight_value.shape[:-1]
        try:
            batch_shape = tuple(lax.broadcast_shapes(*shapes.values()))
        except ValueError:
            desc = ", ".join(f"{k} {_shape_str(v)}" for k, v in shapes.items())
            raise ValueError(f"batch dimensions (the '...') do not broadcast: {desc}") from None

        # ---- values (validate_args; skipped for traced values) ----
        validate = type(self)._validate_args if validate_args is None else validate_args
        if validate:
            _check_values(loc, cov_name, cov_value, weight_name, weight_value)

        # ---- convert and broadcast ----
        loc = jnp.broadcast_to(loc, batch_shape + (K, d))
        if weight_value is None:
            logits = jnp.zeros(batch_shape + (K,), dtype)
        elif weight_name == "probs":
            logits = jnp.broadcast_to(jnp.log(weight_value), batch_shape + (K,))
        else:
            logits = jnp.broadcast_to(weight_value, batch_shape + (K,))
        if is_diagonal:
            scale = jnp.broadcast_to(cov_value, batch_shape + (K, d))
            component = Independent(Normal(loc, scale, validate_args=False), 1, validate_args=False)
        else:
            if cov_name == "covariance_matrix":
                tril = jnp.linalg.cholesky(cov_value)
            elif cov_name == "precision_matrix":
                tril = cholesky_of_inverse(cov_value)
            else:
                tril = jnp.tril(cov_value)
            tril = jnp.broadcast_to(tril, batch_shape + (K, d, d))
            component = MultivariateNormal(loc, scale_tril=tril, validate_args=False)

        self._entropy_method = entropy_method
        self._entropy_order = entropy_order
        self._is_diagonal = is_diagonal
        # The components are not validated by NumPyro: this class checks the arguments the
        # user gave, with messages naming them.
        super().__init__(CategoricalLogits(logits, validate_args=False), component, validate_args=validate_args)

    # ------------------------------------------------------------------ validation
    def validate_args(self, strict: bool = True) -> None:
        """Check the stored parameters' values; raise ``ValueError`` naming the argument.

        Traced values cannot be checked: with ``strict`` a ``RuntimeError`` is raised for
        them (as in NumPyro), otherwise they are skipped.
        """
        if self._is_diagonal:
            factor_name, factor = "scale", self.scale
        else:
            factor_name, factor = "scale_tril", self._component_distribution.scale_tril
        params = [self.loc, factor, self.logits]
        if not all(not_jax_tracer(p) for p in params):
            if strict:
                raise RuntimeError("Cannot validate arguments inside jitted code.")
            return
        _check_values(self.loc, factor_name, factor, "logits", self.logits)

    # ------------------------------------------------------------------ parameters
    @property
    def loc(self):
        """``batch_shape + (K, d)`` component means."""
        comp = self._component_distribution
        return comp.base_dist.loc if self._is_diagonal else comp.loc

    @property
    def scale(self):
        """``batch_shape + (K, d)`` standard deviations (diagonal) or ``None`` (full)."""
        return self._component_distribution.base_dist.scale if self._is_diagonal else None

    @property
    def scale_tril(self):
        """``batch_shape + (K, d, d)`` lower Cholesky factors of the component covariances
        (a dense diagonal matrix for a diagonal mixture)."""
        if self._is_diagonal:
            s = self.scale
            return s[..., None] * jnp.eye(s.shape[-1], dtype=s.dtype)
        return self._component_distribution.scale_tril

    @property
    def component_covariance_matrix(self):
        """``batch_shape + (K, d, d)`` component covariances."""
        if self._is_diagonal:
            v = jnp.square(self.scale)
            return v[..., None] * jnp.eye(v.shape[-1], dtype=v.dtype)
        tril = self.scale_tril
        return tril @ jnp.swapaxes(tril, -1, -2)

    @property
    def logits(self):
        """``batch_shape + (K,)`` log weights (as given; ``log(probs)`` when probs were given)."""
        return self._mixing_distribution.logits

    @property
    def probs(self):
        """``batch_shape + (K,)`` normalised weights."""
        return self._mixing_distribution.probs

    @property
    def num_components(self) -> int:
        return self._mixture_size

    @property
    def is_diagonal(self) -> bool:
        return self._is_diagonal

    @property
    def entropy_method(self) -> str:
        return self._entropy_method

    @property
    def entropy_order(self) -> int | None:
        return self._entropy_order

    @property
    def covariance_matrix(self):
        r"""``batch_shape + (d, d)`` covariance of the mixture,
        ``sum_k w_k (Sigma_k + (mu_k - mu)(mu_k - mu)^T)``."""
        w = self.probs
        loc = self.loc
        dev = loc - jnp.einsum("...k,...kd->...d", w, loc)[..., None, :]
        between = jnp.einsum("...k,...ki,...kj->...ij", w, dev, dev)
        if self._is_diagonal:
            within = jnp.einsum("...k,...kd->...d", w, jnp.square(self.scale))
            return between + within[..., None] * jnp.eye(within.shape[-1], dtype=within.dtype)
        tril = self.scale_tril
        return between + jnp.einsum("...k,...kij,...klj->...il", w, tril, tril)

    # ------------------------------------------------------------------ entropy
    def entropy(self, method: str | None = None, order: int | None = None, **options):
        """Entropy of each mixture in the batch (nats), shape ``batch_shape``.

        Args:
          method: a key of :data:`numpyro_gmm.ENTROPY_METHODS`; ``None`` is the configured
            ``entropy_method``.
          order: the estimator's order; ``None`` is the configured ``entropy_order`` (passed
            only to estimators that take an order) or the estimator's default.
          options: further keyword arguments for the estimator. A ``key`` option is split
            so that each mixture of the batch gets its own.

        Returns whatever the estimator returns (a scalar per mixture, or a tuple of them,
        e.g. an estimate and its standard error), with ``batch_shape`` leading dimensions.
        """
        method = self._entropy_method if method is None else method
        if method not in ENTROPY_METHODS:
            raise ValueError(f"method must be one of {sorted(ENTROPY_METHODS)}, got {method!r}")
        if order is None and method in ORDERED_METHODS:
            order = self._entropy_order
        if order is not None:
            options["order"] = order
        return self._over_batch(method, options)

    def entropy_bounds(self, order: int | None = None):
        """Certified ``(lower, upper)`` bounds on the entropy of each mixture (nats).

        The tightest of the certified bounds of :func:`numpyro_gmm.entropy.entropy_bounds`
        (Huber et al. 2008, Kolchinsky & Tracey 2017, the moment-matched Gaussian, and the
        Taylor lower bound of Dahlke & Pacheco at ``order``; ``None``: the configured
        ``entropy_order`` or the default). Each has shape ``batch_shape``.
        """
        order = self._entropy_order if order is None else order
        return self._over_batch(entropy_bounds, {} if order is None else {"order": order})

    def _over_batch(self, method, options):
        """``method`` (a name in ``ENTROPY_METHODS`` or a pure function of one mixture) over
        the flattened batch, reshaped to ``batch_shape``."""
        key = options.pop("key", None)
        diag = self._is_diagonal
        logits, loc = self.logits, self.loc
        factor = self.scale if diag else self._component_distribution.scale_tril
        # Batch shape from the arrays themselves (robust to a stale batch_shape inside vmap).
        batch = tuple(
            lax.broadcast_shapes(logits.shape[:-1], loc.shape[:-2], factor.shape[: -(2 if diag else 3)])
        )
        K, d = loc.shape[-2:]
        n = math.prod(batch)
        fshape = (K, d) if diag else (K, d, d)
        logits = jnp.broadcast_to(logits, batch + (K,)).reshape((n, K))
        loc = jnp.broadcast_to(loc, batch + (K, d)).reshape((n, K, d))
        factor = jnp.broadcast_to(factor, batch + fshape).reshape((n,) + fshape)
        keys = None if key is None else jax.random.split(key, n)
        static = tuple(sorted((k, v) for k, v in options.items() if _is_static(v)))
        dynamic = {k: v for k, v in options.items() if not _is_static(v)}
        out = _batched_entropy(
            logits, loc, factor, keys, dynamic, method=method, diag=diag, static_options=static
        )
        return jax.tree.map(lambda x: x.reshape(batch + x.shape[1:]), out)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mixture(cls, mixture, **kwargs) -> "GaussianMixture":
        """A ``GaussianMixture`` equal to ``mixture``, a ``MixtureSameFamily`` whose
        components are a ``MultivariateNormal`` or ``Normal(...).to_event(1)``.

        ``kwargs`` (``entropy_method``, ``entropy_order``, ``validate_args``) go to the
        constructor; from a ``GaussianMixture`` its entropy configuration is the default.
        """
        if not isinstance(mixture, MixtureSameFamily):
            raise ValueError(f"mixture must be a MixtureSameFamily, got {type(mixture).__name__}")
        if isinstance(mixture, GaussianMixture):
            kwargs.setdefault("entropy_method", mixture.entropy_method)
            kwargs.setdefault("entropy_order", mixture.entropy_order)
        mixing = mixture.mixing_distribution
        if isinstance(mixing, CategoricalLogits):
            weights = {"logits": mixing.logits}
        elif isinstance(mixing, CategoricalProbs):
            weights = {"probs": mixing.probs}
        else:  # MixtureSameFamily itself refuses other mixing distributions
            raise ValueError(f"unsupported mixing distribution {type(mixing).__name__}")
        comp = mixture.component_distribution
        if isinstance(comp, MultivariateNormal):
            return cls(comp.loc, scale_tril=comp.scale_tril, **weights, **kwargs)
        if (
            isinstance(comp, Independent)
            and comp.reinterpreted_batch_ndims == 1
            and type(comp.base_dist) is Normal
        ):
            loc, scale = jnp.broadcast_arrays(comp.base_dist.loc, comp.base_dist.scale)
            return cls(loc, scale=scale, **weights, **kwargs)
        raise ValueError(
            "mixture components must be a MultivariateNormal or Normal(...).to_event(1), "
            f"got {type(comp).__name__}"
            + (f" of {type(comp.base_dist).__name__}" if isinstance(comp, Independent) else "")
        )

    def __repr__(self):
        return (
            f"GaussianMixture(K={self.num_components}, d={self.event_shape[0] if self.event_shape else '?'}, "
            f"batch_shape={self.batch_shape}, diagonal={self._is_diagonal}, "
            f"entropy_method={self._entropy_method!r}, entropy_order={self._entropy_order})"
        )


def _check_values(loc, cov_name, cov_value, weight_name, weight_value):
    """Value checks behind ``validate_args``; each failure names its argument."""
    with jax.ensure_compile_time_eval():
        arrays = [loc, cov_value] + ([] if weight_value is None else [weight_value])
        if not all(not_jax_tracer(a) for a in arrays):
            return  # traced values cannot be checked
        loc_np = np.asarray(loc)
        if not np.all(np.isfinite(loc_np)):
            raise ValueError("loc must be finite, got a non-finite value (NaN or inf)")
        c = np.asarray(cov_value, dtype=np.float64)
        if not np.all(np.isfinite(c)):
            raise ValueError(f"{cov_name} must be finite, got a non-finite value (NaN or inf)")
        if cov_name == "scale":
            if not np.all(c > 0):
                raise ValueError("scale must be positive (every standard deviation > 0)")
        elif cov_name == "scale_tril":
            diag = np.diagonal(c, axis1=-2, axis2=-1)
            if not np.all(diag > 0):
                raise ValueError(
                    "scale_tril must be a lower Cholesky factor with a positive diagonal"
                )
        else:
            sym = 0.5 * (c + np.swapaxes(c, -1, -2))
            tol = 1e-6 * np.max(np.abs(c), axis=(-2, -1), keepdims=True) + 1e-12
            eps = np.finfo(np.asarray(cov_value).dtype).eps
            if not np.all(np.abs(c - np.swapaxes(c, -1, -2)) <= tol):
                raise ValueError(f"{cov_name} must be symmetric positive definite, got a non-symmetric matrix")
            eig = np.linalg.eigvalsh(sym)
            if not np.all(eig > eps * np.max(np.abs(eig), axis=-1, keepdims=True)):
                raise ValueError(f"{cov_name} must be positive definite, got an eigenvalue <= 0")
        if weight_value is None:
            return
        w = np.asarray(weight_value, dtype=np.float64)
        if weight_name == "logits":
            if np.any(np.isnan(w)) or np.any(w == np.inf):
                raise ValueError("logits must not be NaN or +inf (-inf is a zero weight)")
            if np.any(np.all(w == -np.inf, axis=-1)):
                raise ValueError("logits must have at least one finite entry per mixture")
        else:
            if not np.all(np.isfinite(w)) or np.any(w < 0):
                raise ValueError("probs must be finite and non-negative")
            K = w.shape[-1]
            tol = max(1e-6, 10 * K * np.finfo(np.asarray(weight_value).dtype).eps)
            if not np.all(np.abs(w.sum(-1) - 1) <= tol):
                raise ValueError(f"probs must sum to 1 along the last axis (tolerance {tol:.1e})")


def _is_static(value) -> bool:
    """Python scalars, strings and tuples of them are static options of an estimator
    (orders, sample counts, block sizes); arrays are traced."""
    if value is None or isinstance(value, (bool, int, float, complex, str, np.generic)):
        return True
    return isinstance(value, tuple) and all(_is_static(v) for v in value)


@partial(jax.jit, static_argnames=("method", "diag", "static_options"))
def _batched_entropy(logits, loc, factor, keys, dynamic_options, *, method, diag, static_options):
    """``mixture_entropy`` over a flat batch ``(n, ...)`` of mixtures, compiled once per
    shapes, estimator and static options (eager calls of ``entropy()`` reuse it)."""

    def one(lg, lc, f, k):
        kw = {**dict(static_options), **dynamic_options}
        if k is not None:
            kw["key"] = k
        fn = partial(mixture_entropy, method=method) if isinstance(method, str) else method
        if diag:
            return fn(lg, lc, None, scale=f, **kw)
        return fn(lg, lc, f, **kw)

    return jax.vmap(one)(logits, loc, factor, keys)


# ---------------------------------------------------------------------- batch utilities
@vmap_over.register
def _vmap_over_gaussian_mixture(
    dist: GaussianMixture,
    loc=None,
    covariance_matrix=None,
    scale_tril=None,
    precision_matrix=None,
    scale=None,
    logits=None,
    probs=None,
):
    """Axes of a ``GaussianMixture`` pytree for ``jax.vmap`` ``in_axes``/``out_axes``.

    The covariance-like arguments all map to the stored factor (``scale_tril`` or
    ``scale``); ``logits``/``probs`` map to the stored logits.
    """
    factor_axis = next(
        (a for a in (covariance_matrix, scale_tril, precision_matrix, scale) if a is not None), None
    )
    weight_axis = logits if logits is not None else probs
    axes = copy.copy(dist)
    axes._mixing_distribution = vmap_over(dist._mixing_distribution, logits=weight_axis)
    comp = dist._component_distribution
    if dist._is_diagonal:
        base = vmap_over(comp.base_dist, loc=loc, scale=factor_axis)
        axes._component_distribution = vmap_over(comp, base_dist=base)
    else:
        axes._component_distribution = vmap_over(comp, loc=loc, scale_tril=factor_axis)
    return axes


@promote_batch_shape.register
def _promote_batch_shape_gaussian_mixture(dist: GaussianMixture):
    new = copy.copy(dist)
    new._component_distribution = promote_batch_shape(dist._component_distribution)
    new._mixing_distribution = promote_batch_shape(dist._mixing_distribution)
    new._batch_shape = tuple(
        lax.broadcast_shapes(
            new._component_distribution.batch_shape[:-1], new._mixing_distribution.batch_shape
        )
    )
    return new
