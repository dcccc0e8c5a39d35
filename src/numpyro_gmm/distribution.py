"""``GaussianMixture``: a NumPyro ``MixtureSameFamily`` of Gaussians with an ``entropy()``.

The class validates and holds the parameters and dispatches the entropy to
:func:`numpyro_gmm.entropy.mixture_entropy`; it does no numerics of its own beyond the
conversions between parameterisations and the mixture's moments.
"""

from __future__ import annotations

import copy
import inspect
import math
from functools import partial, wraps

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.typing import ArrayLike
from numpyro.distributions import (
    CategoricalLogits,
    CategoricalProbs,
    Distribution,
    Independent,
    LowRankMultivariateNormal,
    MixtureSameFamily,
    MultivariateNormal,
    Normal,
)
from numpyro.distributions import constraints
from numpyro.distributions.batch_util import promote_batch_shape, vmap_over
from numpyro.distributions.util import lazy_property, validate_sample
from numpyro.util import not_jax_tracer

from .entropy import (
    DEFAULT_METHOD,
    ENTROPY_METHODS,
    check_lowrank_dense_dim,
    check_lowrank_dense_elongation,
    entropy_bounds,
    lowrank_entropy_bounds,
    mixture_entropy,
)
from ._kernels import lowrank as _lowrank
from ._kernels import prng
from ._kernels.gaussian import cholesky, precision_of_tril, tril_inverse, tril_log_prob
from ._kernels.memory import MemoryBudget, map_batched
from ._validation import check_int, float_dtype

__all__ = ["GaussianMixture"]

#: Estimators that take an ``order`` option; a configured ``entropy_order`` is passed
#: only to these (an order given in the call is always passed).
ORDERED_METHODS = ("auto", "legendre", "taylor")

_COVARIANCE_ARGS = ("covariance_matrix", "scale_tril", "precision_matrix", "scale")
_LOWRANK_ARGS = ("cov_factor", "cov_diag")


_WEIGHT_ARGS = ("logits", "probs")


def _shape_str(shape):
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _infer_shapes(loc_shape, cov_name, cov_shape, weight_name, weight_shape):
    """``(batch_shape, K, d)`` from the arguments' shapes; ``ValueError`` naming the
    argument and the expected shape. Shared by the constructor and ``infer_shapes``."""
    loc_shape, cov_shape = tuple(loc_shape), tuple(cov_shape)
    if len(loc_shape) < 2:
        raise ValueError(f"loc must have shape (..., K, d), got {_shape_str(loc_shape)}")
    K, d = loc_shape[-2:]
    if K == 0 or d == 0:
        raise ValueError(
            f"loc must have K >= 1 components of dimension d >= 1, got shape {_shape_str(loc_shape)}"
        )
    if cov_name == "cov_factor":  # low rank: cov_shape = (cov_factor shape, cov_diag shape)
        factor_shape, diag_shape = (tuple(x) for x in cov_shape)
        if len(factor_shape) < 3 or factor_shape[-3:-1] != (K, d) or factor_shape[-1] < 1:
            raise ValueError(
                f"cov_factor must have shape (..., K, d, r) = (..., {K}, {d}, r) with r >= 1 to match "
                f"loc {_shape_str(loc_shape)}, got {_shape_str(factor_shape)}"
            )
        if len(diag_shape) < 2 or diag_shape[-2:] != (K, d):
            raise ValueError(
                f"cov_diag must have shape (..., K, d) = (..., {K}, {d}) to match loc "
                f"{_shape_str(loc_shape)}, got {_shape_str(diag_shape)}"
            )
        shapes = {"loc": loc_shape[:-2], "cov_factor": factor_shape[:-3], "cov_diag": diag_shape[:-2]}
        return _batch_and_weights(shapes, loc_shape, K, d, weight_name, weight_shape)
    is_diagonal = cov_name == "scale"
    event_nd = 2 if is_diagonal else 3
    expected = (K, d) if is_diagonal else (K, d, d)
    if len(cov_shape) < event_nd or cov_shape[-event_nd:] != expected:
        lead = "(..., K, d)" if is_diagonal else "(..., K, d, d)"
        raise ValueError(
            f"{cov_name} must have shape {lead} = (..., {', '.join(map(str, expected))}) to match "
            f"loc {_shape_str(loc_shape)}, got {_shape_str(cov_shape)}"
        )
    shapes = {"loc": loc_shape[:-2], cov_name: cov_shape[:-event_nd]}
    return _batch_and_weights(shapes, loc_shape, K, d, weight_name, weight_shape)


def _batch_and_weights(shapes, loc_shape, K, d, weight_name, weight_shape):
    if weight_shape is not None:
        weight_shape = tuple(weight_shape)
        if len(weight_shape) < 1 or weight_shape[-1] != K:
            raise ValueError(
                f"{weight_name} must have shape (..., K) = (..., {K}) to match loc "
                f"{_shape_str(loc_shape)}, got {_shape_str(weight_shape)}"
            )
        shapes[weight_name] = weight_shape[:-1]
    try:
        batch_shape = tuple(lax.broadcast_shapes(*shapes.values()))
    except ValueError:
        desc = ", ".join(f"{k} {_shape_str(v)}" for k, v in shapes.items())
        raise ValueError(f"batch dimensions (the '...') do not broadcast: {desc}") from None
    return batch_shape, K, d


def _one_covariance(covariance_matrix, scale_tril, precision_matrix, scale, cov_factor=None, cov_diag=None):
    """The one covariance-like argument given, as ``(name, value)``; low rank (both of
    ``cov_factor`` and ``cov_diag``): ``("cov_factor", (cov_factor, cov_diag))``."""
    if cov_factor is not None or cov_diag is not None:
        others = [k for k, v in zip(_COVARIANCE_ARGS, (covariance_matrix, scale_tril, precision_matrix, scale)) if v is not None]
        if cov_factor is None or cov_diag is None or others:
            raise ValueError(
                "low-rank components need both cov_factor (..., K, d, r) and cov_diag (..., K, d) and "
                f"no other covariance argument; got {sorted(others + [k for k, v in (('cov_factor', cov_factor), ('cov_diag', cov_diag)) if v is not None])}"
            )
        return "cov_factor", (cov_factor, cov_diag)
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
            "(..., K, d, d), scale (..., K, d), or the pair cov_factor (..., K, d, r) and "
            f"cov_diag (..., K, d); got {sorted(given) or 'none'}"
        )
    ((name, value),) = given.items()
    return name, value


# The conversions run as one compiled program per shape (called eagerly, the unrolled
# factorisations would dispatch, and compile, each of their operations on its own); inside an
# outer jit, grad or vmap they are ordinary nested jits.
_tril_of_covariance = jax.jit(cholesky)


@jax.jit
def _tril_of_precision(precision: Array) -> Array:
    """Lower Cholesky factor of ``P^-1``: ``P = U U^T`` with ``U`` upper (the flipped
    Cholesky factor); ``Sigma = U^-T U^-1``, so its lower Cholesky factor is ``U^-T`` (as
    ``numpyro.distributions.util.cholesky_of_inverse``)."""
    u_t = jnp.swapaxes(cholesky(precision[..., ::-1, ::-1])[..., ::-1, ::-1], -2, -1)
    return tril_inverse(u_t)


# One program per shape, also when called eagerly (the triangular inverse is a loop).
_tril_log_prob = jax.jit(tril_log_prob)


# ``Sigma^-1 = L^-T L^-1`` from the LAPACK-free triangular inverse, one program per shape.
_precision_of_tril = jax.jit(precision_of_tril)


def _one_program(prop: property) -> property:
    """``prop`` computed as one compiled program per shapes (see GaussianMixture.log_prob):
    eagerly, NumPyro's moments dispatched 5-9 single-operation programs per new shape."""
    fn = jax.jit(prop.fget)
    return property(wraps(prop.fget)(lambda self: fn(self)))


#: Largest estimated working memory (bytes) of one ``sample`` or ``log_prob`` program beyond
#: its inputs and outputs: the draws (values) whose estimate exceeds it are processed in
#: chunks of rows, so memory stays bounded for any number of draws, components and
#: dimensions. The estimates, in floats per draw (value): ``log_prob`` evaluates every
#: component at every value, ``2 K d`` for full and low-rank components (XLA's
#: ``memory_analysis``: 2.0 K d all at once), ``2 K + d`` diagonal (XLA fuses the sum over
#: ``d`` into the componentwise terms); ``sample`` draws from the chosen component's
#: gathered parameters, ``2 d`` diagonal, ``(r + 2) d`` low rank, ``d^2 + d`` full, or, where
#: that is more, from every component and keeps one, ``K d`` (``K d + d`` full: a matrix
#: product per component is faster than a gathered factor per draw). Before the chunks,
#: ``10^5`` draws of ``K = 256`` low-rank components in ``d = 1000`` took 103 GB to sample
#: and 205 GB to evaluate; now 1.2 and 0.7 GB (``tests/test_distribution.py``).
SAMPLE_MEMORY_BYTES = 1 << 28


def _rows_per_chunk(rows: int, floats_per_row: int, itemsize: int) -> int:
    """How many of ``rows`` rows of ``floats_per_row`` working floats each to process at once
    within :data:`SAMPLE_MEMORY_BYTES` (at least 1; all of them when they fit)."""
    return MemoryBudget(evaluation=itemsize, limit=SAMPLE_MEMORY_BYTES).batch(floats_per_row, rows)


def _in_chunks(fn, x: Array, chunk: int) -> Array:
    """``fn(x)`` for ``fn`` that maps rows (the leading axis) to rows independently, applied
    to ``chunk`` rows at a time (``lax.map`` over whole chunks, then the remainder): each
    call sees a block of rows, as ``fn(x)`` would, so shape-dependent choices inside ``fn``
    (e.g. :func:`~numpyro_gmm._kernels.gaussian.tril_solve`'s) are made for the block."""
    n = x.shape[0]
    whole = n // chunk * chunk
    out = lax.map(fn, x[:whole].reshape((n // chunk, chunk) + x.shape[1:]))
    out = out.reshape((whole,) + out.shape[2:])
    return out if whole == n else jnp.concatenate([out, fn(x[whole:])])


@jax.jit
def _mixture_log_prob(mixture: GaussianMixture, value: Array) -> Array:
    """NumPyro's ``MixtureSameFamily.log_prob`` (without its support check, done outside), one
    program per shapes (see GaussianMixture.log_prob), in chunks of the values' leading
    (sample) dimensions where all at once would exceed :data:`SAMPLE_MEMORY_BYTES`: it
    evaluates every component at every value (``(..., K, d)`` working arrays). Each chunk's
    values are those of the whole call."""
    base = MixtureSameFamily.log_prob.__wrapped__
    batch = tuple(mixture.batch_shape)
    K, d = mixture.loc.shape[-2:]
    shape = jnp.broadcast_shapes(jnp.shape(value)[:-1], batch)
    lead = shape[: len(shape) - len(batch)]
    rows = math.prod(lead)
    if rows == 0:  # no values (NumPyro's sum over the event dimension divides by their number)
        return jnp.zeros(shape, mixture.loc.dtype)
    per_value = 2 * K * (1 if mixture._is_diagonal else d) + d  # see SAMPLE_MEMORY_BYTES
    chunk = _rows_per_chunk(rows, math.prod(batch) * per_value, mixture.loc.dtype.itemsize)
    if chunk >= rows:
        return base(mixture, value)
    value = jnp.broadcast_to(value, shape + (d,)).reshape((rows,) + batch + (d,))
    return _in_chunks(partial(base, mixture), value, chunk).reshape(lead + batch)


def _affine_draws(kind: str, loc: Array, factor, eps: Array) -> Array:
    """``mu + A eps`` for Gaussians ``N(mu, A A^T)`` of one family, broadcast over leading
    dimensions: ``loc (..., d)``; ``factor`` is ``scale (..., d)`` (``kind="diag"``),
    ``scale_tril (..., d, d)`` (``"full"``) or ``(W (..., d, r), D (..., d))`` (``"lowrank"``);
    standard normal ``eps (..., n)``. NumPyro's draws of each family: ``n = d`` (``scale *
    eps`` diagonal, ``L eps`` full) or ``n = r + d`` low rank (``W eps[:r] + sqrt(D) *
    eps[r:]``)."""
    if kind == "lowrank":
        w, diag = factor
        r = w.shape[-1]
        return loc + jnp.einsum("...dr,...r->...d", w, eps[..., :r]) + jnp.sqrt(diag) * eps[..., r:]
    if kind == "diag":
        return loc + factor * eps
    return loc + jnp.einsum("...ij,...j->...i", factor, eps)


def _one_draw(loc: Array, factor, index: Array, eps: Array, *, kind: str, gather: bool) -> Array:
    """One draw of component ``k = index`` of one mixture (``loc (K, d)``, the factor(s)
    ``(K, ...)``, standard normal ``eps (n,)``; :func:`_affine_draws`): from the chosen
    component's gathered parameters (``gather``), or from every component's draw, keeping
    one (under ``vmap`` a matrix product per component: for full covariances with ``K <= d``
    faster than a gathered ``d x d`` factor per draw)."""
    if gather:
        return _affine_draws(kind, loc[index], jax.tree.map(lambda f: f[index], factor), eps)
    return _affine_draws(kind, loc, factor, eps)[index]


@partial(jax.jit, static_argnums=2)
def _mixture_sample(mixture: GaussianMixture, key: Array, sample_shape: tuple[int, ...]):
    """``(draws, [indices])`` of ``mixture``: for each draw one component ``k`` (inverse CDF
    of one uniform) and one draw of ``N(mu_k, Sigma_k)`` from ``d`` standard normals
    (``r + d`` for low-rank components, as NumPyro's ``LowRankMultivariateNormal``),
    both from :mod:`numpyro_gmm._kernels.prng`.

    NumPyro's ``MixtureSameFamily.sample`` draws from all ``K`` components (``K d`` normals
    per draw) and a categorical by Gumbel-max (``K`` uniforms and logarithms), each from a
    ``jax.random`` call compiled as a rolled loop. Here the component's interval
    ``[c_{k-1}, c_k)`` of the cumulative weights contains ``u c_K``; the largest ``k`` with
    a positive weight and ``c_{k-1} <= u c_K`` is taken, so a component of weight exactly 0 is
    never drawn, even where rounding puts ``u c_K`` at ``c_K``. The draw is made from the
    chosen component's parameters (:func:`_one_draw`: memory per draw ``O(d)`` diagonal,
    ``O(min(K, r) d)`` low rank, ``O(min(K, d) d)`` full), in chunks of draws within
    :data:`SAMPLE_MEMORY_BYTES`."""
    sample_shape = tuple(sample_shape)
    batch = tuple(mixture.batch_shape)
    shape = sample_shape + batch
    loc = mixture.loc
    dtype = loc.dtype
    K, d = loc.shape[-2:]
    key_comp, key_ind = prng.split(key)
    probs = mixture.probs
    start = jnp.cumsum(probs, -1) - probs  # c_{k-1}
    u = prng.uniform(key_ind, shape, dtype) * jnp.sum(probs, -1)
    allowed = (start <= u[..., None]) & (probs > 0)
    index = K - 1 - jnp.argmax(allowed[..., ::-1], axis=-1)
    kind, factor = mixture._family()
    r = factor[0].shape[-1] if kind == "lowrank" else 0
    noise = d + r
    # floats per draw: the chosen component's gathered parameters, or every component's draw
    gathered = {"diag": 2 * d, "lowrank": (r + 2) * d, "full": d * d + d}[kind]
    every = K * d + (d if kind == "full" else 0)
    gather, per_draw = gathered < every, min(gathered, every)
    eps = prng.normal(key_comp, shape + (noise,), dtype)
    rows, members = math.prod(sample_shape), math.prod(batch)
    flat = jax.tree.map(lambda p: p.reshape((members,) + p.shape[len(batch):]), (loc, factor))

    def draws(idx, e):  # one row of draws: idx (members,), e (members, noise) -> (members, d)
        return jax.vmap(partial(_one_draw, kind=kind, gather=gather))(*flat, idx, e)

    chunk = _rows_per_chunk(rows, members * per_draw, dtype.itemsize)
    x = map_batched(draws, chunk, index.reshape((rows, members)), eps.reshape((rows, members, noise)))
    return x.reshape(shape + (d,)), [index]


@jax.custom_jvp
def _log_probs(probs: Array) -> Array:
    """``ln(probs)``, ``-inf`` at a probability of exactly 0 (that component's weight is 0 in
    every estimator), with the derivative ``dp / p`` where ``p > 0`` and 0 where ``p = 0``.

    The plain logarithm's derivative there is infinite, and every use of the log weight
    multiplies it by the weight, 0, so the gradient with respect to ``probs`` was NaN in
    ``log_prob``, ``entropy()`` and ``entropy_bounds()`` alike, and so was the gradient of
    anything that reaches ``probs`` through a transform (``probs = softmax(theta)`` with one
    ``theta`` 104 below another in float32 underflows to an exact 0, and the whole gradient
    with respect to ``theta`` was NaN). NumPyro's
    ``MixtureSameFamily(Categorical(probs=...), ...)`` is finite there too, with 0 for that
    probability: its ``Categorical`` clamps probabilities at the smallest normal float before
    the logarithm. Here the value keeps the exact 0 weight; only the derivative is taken as 0
    (a one-sided quantity at the boundary of the simplex, where a transform's own derivative
    is 0)."""
    return jnp.log(probs)


@_log_probs.defjvp
def _log_probs_jvp(primals, tangents):
    (p,), (dp,) = primals, tangents
    positive = p > 0
    return jnp.log(p), jnp.where(positive, dp / jnp.where(positive, p, 1), 0)


@partial(jax.jit, static_argnames=("shape", "cov_name", "weight_name", "dtype"))
def _parameters(loc, cov_value, weight_value, *, shape, cov_name, weight_name, dtype):
    """The constructor's conversions, one program per shapes (called eagerly, each operation
    compiled on its own: 12 programs at K = 3, d = 2, full covariances): the arguments cast to
    ``dtype`` and broadcast to ``shape = batch_shape + (K, d)``; returns ``loc``, the stored
    factor (``scale``, ``scale_tril``, or ``(cov_factor, cov_diag)``), ``logits`` and their
    softmax (which NumPyro's mixture reads for its number of components)."""
    batch_shape, (K, d) = shape[:-2], shape[-2:]
    loc = jnp.broadcast_to(jnp.asarray(loc, dtype), shape)
    if weight_value is None:
        logits = jnp.zeros(batch_shape + (K,), dtype)
    elif weight_name == "probs":
        logits = jnp.broadcast_to(_log_probs(jnp.asarray(weight_value, dtype)), batch_shape + (K,))
    else:
        logits = jnp.broadcast_to(jnp.asarray(weight_value, dtype), batch_shape + (K,))
    if cov_name == "cov_factor":
        w, dg = (jnp.asarray(v, dtype) for v in cov_value)
        factor = (jnp.broadcast_to(w, shape + w.shape[-1:]), jnp.broadcast_to(dg, shape))
    elif cov_name == "scale":
        factor = jnp.broadcast_to(jnp.asarray(cov_value, dtype), shape)
    else:
        # LAPACK-free factorisations (see numpyro_gmm._kernels.gaussian.cholesky): inside
        # a jitted model or guide a LAPACK call here could run concurrently with others.
        cov_value = jnp.asarray(cov_value, dtype)
        if cov_name == "covariance_matrix":
            tril = _tril_of_covariance(cov_value)
        elif cov_name == "precision_matrix":
            tril = _tril_of_precision(cov_value)
        else:
            tril = jnp.tril(cov_value)
        factor = jnp.broadcast_to(tril, shape + (d,))
    return loc, factor, logits, jax.nn.softmax(logits, axis=-1)


class _ArgConstraints(dict):
    """``arg_constraints`` of :class:`GaussianMixture`: on the class, the constraint of every
    constructor argument; on an instance, those of the parameters it holds (``loc``,
    ``scale_tril`` or ``scale``, ``logits``, ``probs``), so that ``get_args()`` and code that
    reads ``getattr(d, name)`` for each name see only arrays of the documented shapes.

    (The mixture's own ``covariance_matrix`` property is the moment of the mixture, not the
    component covariances the constructor argument of that name takes, so it is not listed
    on instances; nor is ``scale`` of a full-covariance mixture, which is ``None``.)
    """

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        if getattr(instance, "_is_lowrank", False):
            return {k: self[k] for k in ("loc", "cov_factor", "cov_diag", "logits", "probs")}
        factor = "scale" if getattr(instance, "_is_diagonal", False) else "scale_tril"
        return {k: self[k] for k in ("loc", factor, "logits", "probs")}


class GaussianMixture(MixtureSameFamily):
    r"""A finite mixture of Gaussians, ``p(x) = sum_k w_k N(x; mu_k, Sigma_k)``.

    A :class:`numpyro.distributions.MixtureSameFamily` whose mixing distribution is a
    :class:`~numpyro.distributions.CategoricalLogits` and whose components are a
    :class:`~numpyro.distributions.MultivariateNormal` (full covariances) or
    ``Normal(loc, scale).to_event(1)`` (diagonal covariances, given as ``scale``; that path
    never forms a ``d x d`` matrix unless one is asked for). Everything the base class
    offers (``sample``, ``log_prob``, ``mean``, ``variance``, ``support``) works as usual;
    with low-rank components (``cov_factor``, ``cov_diag``) the components are a LAPACK-free
    :class:`~numpyro.distributions.LowRankMultivariateNormal` whose ``log_prob`` uses the
    Woodbury identity, and ``log_prob``, ``sample``, ``mean``, ``variance`` and the default
    :meth:`entropy` never form a ``d x d`` matrix (``O(K d r)`` per point; the entropy
    ``O(K^2 M d r)``, :func:`numpyro_gmm.lowrank_mixing_qmc_entropy`), nor does
    :meth:`entropy_bounds` (:func:`numpyro_gmm.lowrank_entropy_bounds`, ``O(K^2 d r^2)``) nor
    the single bounds (``entropy("huber_lower")``, ...); the series and ``monte_carlo`` use
    the dense covariances and are refused with a
    ``ValueError`` beyond ``d = LOWRANK_DENSE_MAX_DIM`` (100), and :attr:`covariance_matrix`,
    :attr:`scale_tril` and :attr:`component_covariance_matrix` are ``d x d`` by definition;
    this class adds :meth:`entropy` (by the estimators of :mod:`numpyro_gmm.entropy`), the
    mixture's :attr:`covariance_matrix` and :meth:`from_mixture`.

    Args:
      loc: ``(..., K, d)`` component means.
      covariance_matrix: ``(..., K, d, d)`` component covariances, or
      scale_tril: ``(..., K, d, d)`` their lower Cholesky factors, or
      precision_matrix: ``(..., K, d, d)`` their inverses, or
      scale: ``(..., K, d)`` standard deviations of diagonal covariances, or
      cov_factor: ``(..., K, d, r)`` factors ``W_k`` and
      cov_diag: ``(..., K, d)`` positive diagonals ``D_k`` of low-rank-plus-diagonal
        covariances ``Sigma_k = W_k W_k^T + diag(D_k)`` (the parameterisation of NumPyro's
        ``LowRankMultivariateNormal``; given together). Exactly one of these five
        parameterisations is given.
      logits: ``(..., K)`` unnormalised log weights, or
      probs: ``(..., K)`` weights summing to one. At most one; equal weights if neither.
        A probability of exactly 0 is a component of weight 0 everywhere; derivatives with
        respect to it are 0 (finite, as for NumPyro's ``Categorical``), not NaN.
      entropy_method: default estimator of :meth:`entropy`, a key of
        :data:`numpyro_gmm.ENTROPY_METHODS`; ``"auto"`` (:func:`numpyro_gmm.auto_entropy`):
        the mixing rule in every dimension.
      entropy_order: default ``order`` of :meth:`entropy` for the estimators that take one
        (``None``: the estimator's own default).
      validate_args: check the parameters' values: every argument that is a constant is
        checked, also inside ``jax.jit`` (as NumPyro's own distributions check theirs);
        traced values cannot be. Shapes are always checked.

    Parameters are arrays (JAX or NumPy) or nested lists of numbers. Leading dimensions
    ``...`` broadcast; ``batch_shape`` is their broadcast shape and
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

    #: Constraint of each constructor argument, with the argument's full event shape
    #: (``loc`` is ``(..., K, d)``, so its event dimension is 2, and so on). On an instance,
    #: only the parameters it holds: ``loc``, ``scale_tril`` or ``scale``, ``logits``, ``probs``.
    arg_constraints = _ArgConstraints(
        loc=constraints.independent(constraints.real, 2),
        covariance_matrix=constraints.independent(constraints.positive_definite, 1),
        scale_tril=constraints.independent(constraints.lower_cholesky, 1),
        precision_matrix=constraints.independent(constraints.positive_definite, 1),
        scale=constraints.independent(constraints.positive, 2),
        cov_factor=constraints.independent(constraints.real, 3),
        cov_diag=constraints.independent(constraints.positive, 2),
        logits=constraints.real_vector,
        probs=constraints.simplex,
    )
    # The parameters live in the two component distributions (the base class's data
    # fields); ``loc``, ``scale_tril``, ... are read-only views of them, so none of them
    # may become a pytree data field (NumPyro's default is the keys of arg_constraints).
    pytree_data_fields = ()
    pytree_aux_fields = ("_entropy_method", "_entropy_order", "_is_diagonal", "_is_lowrank")

    def __init__(
        self,
        loc,
        covariance_matrix=None,
        *,
        scale_tril=None,
        precision_matrix=None,
        scale=None,
        cov_factor=None,
        cov_diag=None,
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

        loc, covariance_matrix, scale_tril, precision_matrix, scale, cov_factor, cov_diag, logits, probs = map(
            _array_of_sequence,
            (loc, covariance_matrix, scale_tril, precision_matrix, scale, cov_factor, cov_diag, logits, probs),
        )
        cov_name, cov_value = _one_covariance(
            covariance_matrix, scale_tril, precision_matrix, scale, cov_factor, cov_diag
        )
        is_lowrank = cov_name == "cov_factor"
        if logits is not None and probs is not None:
            raise ValueError("give at most one of logits and probs (..., K), not both")
        weight_name = "probs" if probs is not None else "logits"
        weight_value = probs if probs is not None else logits

        # ---- shapes (always checked) ----
        cov_shape = tuple(map(jnp.shape, cov_value)) if is_lowrank else jnp.shape(cov_value)
        batch_shape, K, d = _infer_shapes(
            jnp.shape(loc), cov_name, cov_shape, weight_name,
            None if weight_value is None else jnp.shape(weight_value),
        )
        is_diagonal = cov_name == "scale"

        # ---- values (validate_args) ----
        # Checked on the arguments as given, before any conversion: under ``jax.jit`` a
        # constant argument is still concrete here (``jnp.asarray`` would make it a
        # tracer), so it is checked, while a traced one cannot be. Each argument is checked
        # on its own, as NumPyro checks each parameter that is not a tracer.
        cov_args = dict(zip(_LOWRANK_ARGS, cov_value)) if is_lowrank else {cov_name: cov_value}
        dtype = float_dtype(loc, *cov_args.values(), weight_value)
        validate = type(self)._validate_args if validate_args is None else validate_args
        if validate:
            _check_values(dtype, loc=loc, **cov_args, **{weight_name: weight_value})

        # ---- convert and broadcast (one program per shapes) ----
        loc, factor, logits, probs = _parameters(
            loc, cov_value, weight_value, shape=batch_shape + (K, d), cov_name=cov_name,
            weight_name=weight_name, dtype=jnp.dtype(dtype),
        )
        if is_lowrank:
            component = _LowRankNormal(loc, *factor)
        elif is_diagonal:
            component = Independent(Normal(loc, factor, validate_args=False), 1, validate_args=False)
        else:
            component = _TrilNormal(loc, scale_tril=factor, validate_args=False)
        mixing = CategoricalLogits(logits, validate_args=False)
        if not_jax_tracer(probs):  # as NumPyro's lazy_property caches it (read for K below)
            mixing.probs = probs

        self._entropy_method = entropy_method
        self._entropy_order = entropy_order
        self._is_diagonal = is_diagonal
        self._is_lowrank = is_lowrank
        # The components are not validated by NumPyro: this class checks the arguments the
        # user gave, with messages naming them.
        super().__init__(mixing, component, validate_args=validate_args)

    # ------------------------------------------------------------------ validation
    def validate_args(self, strict: bool = True) -> None:
        """Check the stored parameters' values; raise ``ValueError`` naming the argument.

        Traced values cannot be checked: with ``strict`` a ``RuntimeError`` is raised for
        them (as in NumPyro), otherwise they are skipped.
        """
        if self._is_lowrank:
            factors = {"cov_factor": self.cov_factor, "cov_diag": self.cov_diag}
        elif self._is_diagonal:
            factors = {"scale": self.scale}
        else:
            factors = {"scale_tril": self._component_distribution.scale_tril}
        params = {"loc": self.loc, **factors, "logits": self.logits}
        if strict and not all(not_jax_tracer(p) for p in params.values()):
            raise RuntimeError("Cannot validate arguments inside jitted code.")
        _check_values(self.loc.dtype, **params)

    # ------------------------------------------------------------------ parameters
    @property
    def loc(self) -> Array:
        """``batch_shape + (K, d)`` component means."""
        comp = self._component_distribution
        return comp.base_dist.loc if self._is_diagonal else comp.loc

    @property
    def scale(self) -> Array | None:
        """``batch_shape + (K, d)`` standard deviations (diagonal) or ``None`` (full)."""
        return self._component_distribution.base_dist.scale if self._is_diagonal else None

    @property
    def cov_factor(self) -> Array | None:
        """``batch_shape + (K, d, r)`` factors ``W_k`` of low-rank components, else ``None``."""
        return self._component_distribution.cov_factor if self._is_lowrank else None

    @property
    def cov_diag(self) -> Array | None:
        """``batch_shape + (K, d)`` diagonals ``D_k`` of low-rank components, else ``None``."""
        return self._component_distribution.cov_diag if self._is_lowrank else None

    @property
    def component_stddev(self) -> Array:
        """``batch_shape + (K, d)`` marginal standard deviations ``sqrt(diag Sigma_k)`` (no
        ``d x d`` matrix for diagonal or low-rank components)."""
        if self._is_diagonal:
            return self.scale
        if self._is_lowrank:
            return jnp.sqrt(self._component_distribution.variance)
        return jnp.linalg.norm(self.scale_tril, axis=-1)

    @property
    def scale_tril(self) -> Array:
        """``batch_shape + (K, d, d)`` lower Cholesky factors of the component covariances
        (a dense diagonal matrix for a diagonal mixture; for low-rank components the dense
        factor of ``W W^T + diag D``, ``d x d``)."""
        if self._is_diagonal:
            s = self.scale
            return s[..., None] * jnp.eye(s.shape[-1], dtype=s.dtype)
        return self._component_distribution.scale_tril

    @_one_program
    @property
    def component_covariance_matrix(self) -> Array:
        """``batch_shape + (K, d, d)`` component covariances."""
        if self._is_diagonal:
            v = jnp.square(self.scale)
            return v[..., None] * jnp.eye(v.shape[-1], dtype=v.dtype)
        if self._is_lowrank:
            return self._component_distribution.covariance_matrix
        tril = self.scale_tril
        return tril @ jnp.swapaxes(tril, -1, -2)

    @property
    def logits(self) -> Array:
        """``batch_shape + (K,)`` log weights (as given; ``log(probs)`` when probs were given)."""
        return self._mixing_distribution.logits

    @property
    def probs(self) -> Array:
        """``batch_shape + (K,)`` normalised weights."""
        return self._mixing_distribution.probs

    @property
    def num_components(self) -> int:
        return self._mixture_size

    @property
    def is_diagonal(self) -> bool:
        return self._is_diagonal

    def _family(self) -> tuple[str, object]:
        """``(kind, factor)`` of the components for :func:`_affine_draws`: ``("diag", scale)``,
        ``("full", scale_tril)`` or ``("lowrank", (cov_factor, cov_diag))``."""
        if self._is_lowrank:
            return "lowrank", (self.cov_factor, self.cov_diag)
        if self._is_diagonal:
            return "diag", self.scale
        return "full", self.scale_tril

    def _component_draws(self, eps: Array) -> Array:
        """``mu_k + A_k eps_k`` for every component ``k``, ``(..., K, d)``, from standard
        normal ``eps`` of shape ``(..., K or 1, n)`` (:func:`_affine_draws`)."""
        kind, factor = self._family()
        return _affine_draws(kind, self.loc, factor, eps)

    @property
    def is_lowrank(self) -> bool:
        """Whether the components are low-rank-plus-diagonal (``cov_factor``, ``cov_diag``)."""
        return self._is_lowrank

    @property
    def entropy_method(self) -> str:
        return self._entropy_method

    @property
    def entropy_order(self) -> int | None:
        return self._entropy_order

    @_one_program
    @property
    def covariance_matrix(self) -> Array:
        r"""``batch_shape + (d, d)`` covariance of the mixture,
        ``sum_k w_k (Sigma_k + (mu_k - mu)(mu_k - mu)^T)`` (a ``d x d`` matrix, also for
        diagonal and low-rank components)."""
        w = self.probs
        loc = self.loc
        dev = loc - jnp.einsum("...k,...kd->...d", w, loc)[..., None, :]
        between = jnp.einsum("...k,...ki,...kj->...ij", w, dev, dev)
        if self._is_diagonal:
            within = jnp.einsum("...k,...kd->...d", w, jnp.square(self.scale))
            return between + within[..., None] * jnp.eye(within.shape[-1], dtype=within.dtype)
        if self._is_lowrank:
            f, dg = self.cov_factor, self.cov_diag
            within = jnp.einsum("...k,...kd->...d", w, dg)
            low = jnp.einsum("...k,...kir,...kjr->...ij", w, f, f)
            return between + low + within[..., None] * jnp.eye(within.shape[-1], dtype=within.dtype)
        tril = self.scale_tril
        return between + jnp.einsum("...k,...kij,...klj->...il", w, tril, tril)

    mean = _one_program(MixtureSameFamily.mean)
    variance = _one_program(MixtureSameFamily.variance)

    # ------------------------------------------------------------------ density and sampling
    # NumPyro's own computations, each compiled as one program per shapes: called eagerly,
    # NumPyro's MixtureSameFamily dispatches (and, for new shapes, compiles) each of its
    # operations on its own (measured at K = 3, d = 2: 20-29 programs for the first
    # log_prob, 14-16 for the first sample). Inside an outer jit, grad or vmap they are
    # ordinary nested jits. The support check of ``validate_args`` stays outside, so an
    # out-of-support concrete value still warns as in NumPyro.
    @validate_sample
    def log_prob(self, value: ArrayLike, intermediates=None) -> Array:
        """``ln p(value)`` of each mixture, shape ``sample_shape + batch_shape`` (NumPyro's
        ``MixtureSameFamily.log_prob``, compiled as one program; many values are evaluated in
        chunks within ``SAMPLE_MEMORY_BYTES``, numpyro_gmm.distribution)."""
        del intermediates
        return _mixture_log_prob(self, value)

    def sample_with_intermediates(self, key, sample_shape=()) -> tuple[Array, list[Array]]:
        """Samples, shape ``sample_shape + batch_shape + (d,)``, and the sampled component
        indices (the contract of NumPyro's ``MixtureSameFamily.sample_with_intermediates``;
        one component draw per sample, not ``K``, in chunks within ``SAMPLE_MEMORY_BYTES``: see
        ``_mixture_sample``), compiled as one program."""
        return _mixture_sample(self, key, tuple(sample_shape))

    # ------------------------------------------------------------------ entropy
    def entropy(self, method: str | None = None, order: int | None = None, **options) -> Array:
        """Entropy of each mixture in the batch (nats), shape ``batch_shape``.

        Args:
          method: a key of :data:`numpyro_gmm.ENTROPY_METHODS`; ``None`` is the configured
            ``entropy_method``.
          order: the estimator's order; ``None`` is the configured ``entropy_order`` (passed
            only to estimators that take an order) or the estimator's default.
          options: further keyword arguments for the estimator. A ``key`` option is split
            so that each mixture of the batch gets its own (a single mixture, batch shape
            ``()`` or one element, takes the key itself).

        Returns an array of shape ``batch_shape`` (NumPyro's ``Distribution.entropy``
        contract, hence the annotation), except for an estimator that returns several
        values per mixture (``"monte_carlo"``: an estimate and its standard error), whose
        tuple of such arrays is returned as it is.
        """
        method = self._entropy_method if method is None else method
        if method not in ENTROPY_METHODS:
            raise ValueError(f"method must be one of {sorted(ENTROPY_METHODS)}, got {method!r}")
        if order is None and method in ORDERED_METHODS:
            order = self._entropy_order
        if order is not None:
            options["order"] = order
        return self._over_batch(method, options)

    def entropy_bounds(self, order: int | None = None) -> tuple[Array, Array]:
        """Certified ``(lower, upper)`` bounds on the entropy of each mixture (nats).

        The tightest of the certified bounds of :func:`numpyro_gmm.entropy.entropy_bounds`
        (Huber et al. 2008, Kolchinsky & Tracey 2017, the moment-matched Gaussian, and the
        Taylor lower bound of Dahlke & Pacheco at ``order``; ``None``: the configured
        ``entropy_order`` or the default). Each has shape ``batch_shape``. Low-rank
        components: the same pairwise and Huber bounds on the factors ``W``, ``D`` themselves,
        without a ``d x d`` matrix, and the moment-matched one relaxed
        (:func:`numpyro_gmm.lowrank_entropy_bounds`), in every dtype and dimension: dense
        factors of ``W W^T + diag D`` are rounded, in float32 losing the short directions of
        elongated components (``LOWRANK_DENSE_FLOAT32_MAX_ELONGATION``) and in float64 too
        (a single component with ``|W|^2 / D`` of 1e6 .. 1e12: its closed-form entropy
        1e-11 .. 3.8e-4 nats outside the dense bracket), and need ``K^2`` dense pairs.
        """
        order = self._entropy_order if order is None else order
        if self._is_lowrank:
            check_int("order", order if order is not None else 1, 1)
            return self._over_batch(lowrank_entropy_bounds, {})  # no d x d matrix
        return self._over_batch(entropy_bounds, {} if order is None else {"order": order})

    def _over_batch(self, method, options):
        """``method`` (a name in ``ENTROPY_METHODS`` or a pure function of one mixture) over
        the flattened batch, reshaped to ``batch_shape``."""
        key = options.pop("key", None)
        diag = self._is_diagonal
        logits, loc = self.logits, self.loc
        K, d = loc.shape[-2:]
        if self._is_lowrank:
            diag = "lowrank"
            comp = self._component_distribution
            factor = (comp.cov_factor, comp.cov_diag)
            r = comp.cov_factor.shape[-1]
            fshapes = ((K, d, r), (K, d))
            # the rest need dense d x d factors: refused past the limits
            if method not in ("auto", "mixing_qmc", lowrank_entropy_bounds, *_lowrank.NAMED_BOUNDS):
                check_lowrank_dense_dim(K, d, r, method)
                check_lowrank_dense_elongation(comp.cov_factor, comp.cov_diag, method)
        else:
            factor = (self.scale if diag else self._component_distribution.scale_tril,)
            fshapes = ((K, d) if diag else (K, d, d),)
        # Batch shape from the arrays themselves (robust to a stale batch_shape inside vmap).
        batch = tuple(
            lax.broadcast_shapes(
                logits.shape[:-1], loc.shape[:-2], *(f.shape[: f.ndim - len(fs)] for f, fs in zip(factor, fshapes))
            )
        )
        static = tuple(sorted((k, v) for k, v in options.items() if _is_static(v)))
        dynamic = {k: v for k, v in options.items() if not _is_static(v)}
        return _batched_entropy(
            logits, loc, factor, key, dynamic, method=method, diag=diag, static_options=static,
            batch=batch, fshapes=fshapes,
        )

    # ------------------------------------------------------------------ construction
    @classmethod
    def infer_shapes(cls, *args, **kwargs) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(batch_shape, event_shape)`` of the mixture the constructor would build from
        arguments of the given shapes (NumPyro's ``Distribution.infer_shapes`` contract).

        ``args`` are the shapes of ``cls.__init__``'s positional arguments, in order;
        ``kwargs`` map argument names to shapes (``None``: not given). Entries for the
        non-array options (``entropy_method``, ``entropy_order``, ``validate_args``) are
        ignored. The same shape checks as the constructor's raise ``ValueError``.
        """
        names = [
            p.name
            for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__}.infer_shapes takes at most {len(names)} positional shapes, got {len(args)}")
        for name, shape in zip(names, args):
            if name in kwargs:
                raise TypeError(f"{cls.__name__}.infer_shapes got two shapes for {name!r}")
            kwargs[name] = shape
        unknown = set(kwargs) - {
            "loc", *_COVARIANCE_ARGS, *_LOWRANK_ARGS, *_WEIGHT_ARGS, "entropy_method", "entropy_order", "validate_args"
        }
        if unknown:
            raise TypeError(f"{cls.__name__}.infer_shapes got unexpected arguments {sorted(unknown)}")
        if kwargs.get("loc") is None:
            raise ValueError("loc must have shape (..., K, d), got none")
        cov_name, cov_shape = _one_covariance(*(kwargs.get(k) for k in _COVARIANCE_ARGS + _LOWRANK_ARGS))
        weights = {k: kwargs[k] for k in _WEIGHT_ARGS if kwargs.get(k) is not None}
        if len(weights) > 1:
            raise ValueError("give at most one of logits and probs (..., K), not both")
        weight_name, weight_shape = next(iter(weights.items()), ("logits", None))
        batch_shape, _, d = _infer_shapes(kwargs["loc"], cov_name, cov_shape, weight_name, weight_shape)
        return batch_shape, (d,)

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
        if isinstance(comp, LowRankMultivariateNormal):
            return cls(comp.loc, cov_factor=comp.cov_factor, cov_diag=comp.cov_diag, **weights, **kwargs)
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
            "mixture components must be a MultivariateNormal, LowRankMultivariateNormal or Normal(...).to_event(1), "
            f"got {type(comp).__name__}"
            + (f" of {type(comp.base_dist).__name__}" if isinstance(comp, Independent) else "")
        )

    def __repr__(self) -> str:
        return (
            f"GaussianMixture(K={self.num_components}, d={self.event_shape[0] if self.event_shape else '?'}, "
            f"batch_shape={self.batch_shape}, diagonal={self._is_diagonal}, "
            + (f"rank={self.cov_factor.shape[-1]}, " if self._is_lowrank else "")
            + f"entropy_method={self._entropy_method!r}, entropy_order={self._entropy_order})"
        )


def _check_values(dtype, **params):
    """Value checks behind ``validate_args``: each argument (name -> value or ``None``)
    whose value is concrete is checked; a traced one is skipped. Each failure is a
    ``ValueError`` naming its argument. ``dtype``: the computation's float dtype (its
    resolution sets the positive-definiteness threshold)."""
    eps = float(np.finfo(dtype).eps)
    with jax.ensure_compile_time_eval():
        for name, value in params.items():
            if value is None or not not_jax_tracer(value):
                continue
            c = np.asarray(value, dtype=np.float64)
            if name == "loc":
                if not np.all(np.isfinite(c)):
                    raise ValueError("loc must be finite, got a non-finite value (NaN or inf)")
            elif name in _COVARIANCE_ARGS:
                _check_covariance(name, c, eps)
            elif name == "cov_factor":
                if not np.all(np.isfinite(c)):
                    raise ValueError("cov_factor must be finite, got a non-finite value (NaN or inf)")
            elif name == "cov_diag":
                if not np.all(np.isfinite(c)):
                    raise ValueError("cov_diag must be finite, got a non-finite value (NaN or inf)")
                if not np.all(c > 0):
                    raise ValueError("cov_diag must be positive (every entry of the diagonal D > 0)")
            elif name == "logits":
                if np.any(np.isnan(c)) or np.any(c == np.inf):
                    raise ValueError("logits must not be NaN or +inf (-inf is a zero weight)")
                if np.any(np.all(c == -np.inf, axis=-1)):
                    raise ValueError("logits must have at least one finite entry per mixture")
            elif name == "probs":
                if not np.all(np.isfinite(c)) or np.any(c < 0):
                    raise ValueError("probs must be finite and non-negative")
                tol = max(1e-6, 10 * c.shape[-1] * eps)
                if not np.all(np.abs(c.sum(-1) - 1) <= tol):
                    raise ValueError(f"probs must sum to 1 along the last axis (tolerance {tol:.1e})")
            else:  # pragma: no cover - internal misuse
                raise AssertionError(name)


def _check_covariance(name, c, eps):
    if not np.all(np.isfinite(c)):
        raise ValueError(f"{name} must be finite, got a non-finite value (NaN or inf)")
    if name == "scale":
        if not np.all(c > 0):
            raise ValueError("scale must be positive (every standard deviation > 0)")
        return
    if name == "scale_tril":
        if np.any(np.triu(c, 1) != 0):
            raise ValueError(
                "scale_tril must be lower triangular (a lower Cholesky factor), got a "
                "non-zero entry above the diagonal"
            )
        if not np.all(np.diagonal(c, axis1=-2, axis2=-1) > 0):
            raise ValueError("scale_tril must be a lower Cholesky factor with a positive diagonal")
        return
    tol = 1e-6 * np.max(np.abs(c), axis=(-2, -1), keepdims=True) + 1e-12
    if not np.all(np.abs(c - np.swapaxes(c, -1, -2)) <= tol):
        raise ValueError(f"{name} must be symmetric positive definite, got a non-symmetric matrix")
    eig = np.linalg.eigvalsh(0.5 * (c + np.swapaxes(c, -1, -2)))
    if not np.all(eig > eps * np.max(np.abs(eig), axis=-1, keepdims=True)):
        raise ValueError(f"{name} must be positive definite, got an eigenvalue <= 0")


def _array_of_sequence(value):
    """A (nested) list or tuple of numbers as an array (NumPy's while every entry is concrete,
    so that ``validate_args`` can check it; JAX's where an entry is traced); anything else
    unchanged."""
    if not isinstance(value, (list, tuple)):
        return value
    if all(not_jax_tracer(v) for v in jax.tree.leaves(value)):
        return np.asarray(value)
    return jnp.asarray(value)


def _is_static(value) -> bool:
    """Python scalars, strings and tuples of them are static options of an estimator
    (orders, sample counts, block sizes); arrays are traced."""
    if value is None or isinstance(value, (bool, int, float, complex, str, np.generic)):
        return True
    return isinstance(value, tuple) and all(_is_static(v) for v in value)


@partial(jax.jit, static_argnames=("method", "diag", "static_options", "batch", "fshapes"))
def _batched_entropy(logits, loc, factor, key, dynamic_options, *, method, diag, static_options, batch, fshapes):
    """``mixture_entropy`` over the mixtures of ``batch`` (the parameters broadcast to it and
    flattened to ``(n, ...)``, a ``key`` split into one per mixture (one mixture takes the key
    itself: one ``jax.random`` call less per SVI step), the results reshaped to
    ``batch``), compiled once per shapes, estimator and static options: an eager call of
    ``entropy()`` is one program (its broadcasts and reshapes dispatched on their own
    compiled four or five more programs per new shape)."""
    n = math.prod(batch)
    K, d = loc.shape[-2:]
    logits = jnp.broadcast_to(logits, batch + (K,)).reshape((n, K))
    loc = jnp.broadcast_to(loc, batch + (K, d)).reshape((n, K, d))
    factor = tuple(jnp.broadcast_to(f, batch + fs).reshape((n,) + fs) for f, fs in zip(factor, fshapes))
    keys = None if key is None else (key[None] if n == 1 else prng.split(key, n))

    def one(lg, lc, f, k):
        kw = {**dict(static_options), **dynamic_options}
        if k is not None:
            kw["key"] = k
        fn = partial(mixture_entropy, method=method) if isinstance(method, str) else method
        if diag == "lowrank":  # a method name, or lowrank_entropy_bounds: both take the factors
            return fn(lg, lc, cov_factor=f[0], cov_diag=f[1], **kw)
        if diag:
            return fn(lg, lc, None, scale=f[0], **kw)
        return fn(lg, lc, f[0], **kw)

    if n == 1:  # one mixture: no vmap (a batch of one turns the estimators'
        # matrix products into batched ones, measured 1.5-2x slower on the CPU)
        out = one(logits[0], loc[0], tuple(f[0] for f in factor), None if keys is None else keys[0])
        out = jax.tree.map(lambda x: x[None], out)
    else:
        out = jax.vmap(one)(logits, loc, factor, keys)
    return jax.tree.map(lambda x: x.reshape(batch + x.shape[1:]), out)


# ---------------------------------------------------------------------- batch utilities
@vmap_over.register
def _vmap_over_gaussian_mixture(
    dist: GaussianMixture,
    loc=None,
    covariance_matrix=None,
    scale_tril=None,
    precision_matrix=None,
    scale=None,
    cov_factor=None,
    cov_diag=None,
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
    if getattr(dist, "_is_lowrank", False):
        axes._component_distribution = vmap_over(comp, loc=loc, cov_factor=cov_factor, cov_diag=cov_diag)
    elif dist._is_diagonal:
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


class _TrilNormal(MultivariateNormal):
    """NumPyro's ``MultivariateNormal`` (given ``scale_tril``) whose ``log_prob`` and
    ``precision_matrix`` make no LAPACK call (NumPyro's use ``solve_triangular`` /
    ``cho_solve``; a LAPACK call inside a jitted model or guide can deadlock, see
    :mod:`numpyro_gmm._kernels.gaussian`): :func:`~numpyro_gmm._kernels.gaussian.tril_log_prob`
    and ``L^-T L^-1`` from the LAPACK-free triangular inverse."""

    @validate_sample
    def log_prob(self, value):
        return _tril_log_prob(value, self.loc, self.scale_tril)

    @lazy_property
    def precision_matrix(self):
        return _precision_of_tril(self.scale_tril)


class _LowRankNormal(LowRankMultivariateNormal):
    """NumPyro's ``LowRankMultivariateNormal`` without LAPACK calls: the capacitance Cholesky
    factor, ``log_prob`` (Woodbury identity and determinant lemma,
    :mod:`numpyro_gmm._kernels.lowrank`), ``entropy``, ``scale_tril`` and
    ``precision_matrix`` use the package's LAPACK-free factorisations (a LAPACK call inside
    a jitted model or guide can deadlock; see :mod:`numpyro_gmm._kernels.gaussian`).
    Parameters come broadcast by :class:`GaussianMixture`: ``loc (..., d)``,
    ``cov_factor (..., d, r)``, ``cov_diag (..., d)``; no ``d x d`` matrix unless
    ``scale_tril``, ``covariance_matrix`` or ``precision_matrix`` is asked for."""

    def __init__(self, loc, cov_factor, cov_diag, *, validate_args=False):
        self.loc = loc
        self.cov_factor = cov_factor
        self.cov_diag = cov_diag
        self._capacitance_tril = _lowrank.capacitance_tril(cov_factor, cov_diag)
        Distribution.__init__(self, batch_shape=jnp.shape(loc)[:-1], event_shape=jnp.shape(loc)[-1:],
                              validate_args=validate_args)

    @validate_sample
    def log_prob(self, value):
        return _lowrank.log_prob(value, self.loc, self.cov_factor, self.cov_diag, self._capacitance_tril)

    def entropy(self):
        d = self.loc.shape[-1]
        log_det = _lowrank.log_det_cov(self.cov_factor, self.cov_diag, self._capacitance_tril)
        return jnp.broadcast_to(0.5 * (d * (1.0 + math.log(2 * math.pi)) + log_det), self.batch_shape)

    @lazy_property
    def scale_tril(self):
        return _lowrank.dense_scale_tril(self.cov_factor, self.cov_diag)

    @lazy_property
    def precision_matrix(self):
        p = _lowrank.woodbury_factor(self.cov_factor, self.cov_diag, self._capacitance_tril)
        d = self.loc.shape[-1]
        return jnp.eye(d, dtype=p.dtype) / self.cov_diag[..., None] - p @ jnp.swapaxes(p, -1, -2)
