"""Argument checks shared by the pure functions and the classes. Shapes are static, so
every check here runs before tracing and raises ``ValueError`` naming the argument."""

from __future__ import annotations

import operator

import jax.numpy as jnp
import numpy as np


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as a Python ``int >= minimum`` (bools refused)."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    try:
        as_int = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}") from None
    if as_int < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {as_int}")
    return as_int


def float_dtype(*arrays):
    """The floating dtype the computation runs in: JAX's promotion of the inputs (integer or
    boolean inputs: the default float dtype).

    Half precision (``float16``, ``bfloat16``) is refused with a ``ValueError``: the
    log-densities, determinants and series of this package lose all accuracy there (a
    float16 entropy was measured 0.2 nats off), and NumPyro's distributions do not support
    it either. Complex inputs are refused too.
    """
    arrays = [a for a in arrays if a is not None]
    dtype = jnp.result_type(*arrays)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise ValueError(f"the parameters must be real floating arrays, got dtype {jnp.dtype(dtype).name}")
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    if jnp.finfo(dtype).bits < 32:
        raise ValueError(
            f"the parameters have dtype {jnp.dtype(dtype).name}; half precision is not supported. "
            "Cast them to float32 (or float64 with jax_enable_x64): e.g. jnp.asarray(x, jnp.float32)."
        )
    return dtype


def check_mixture_shapes(logits, locs, scale_tril, scale, *, batch: bool = False):
    """Check one mixture's parameter shapes; return ``(K, d)``.

    Without ``batch``: ``logits (K,)``, ``locs (K, d)``, and exactly one of
    ``scale_tril (K, d, d)`` / ``scale (K, d)``.
    """
    if (scale_tril is None) == (scale is None):
        raise ValueError("give exactly one of scale_tril (K, d, d) and scale (K, d)")
    if jnp.ndim(locs) != 2:
        raise ValueError(f"locs must have shape (K, d), got {jnp.shape(locs)}")
    K, d = jnp.shape(locs)
    if K == 0:
        raise ValueError("locs must have at least one component (K >= 1), got K = 0")
    if d == 0:
        raise ValueError("locs must have dimension d >= 1, got d = 0")
    if jnp.shape(logits) != (K,):
        raise ValueError(f"logits must have shape (K,) = ({K},) to match locs, got {jnp.shape(logits)}")
    if scale_tril is not None and jnp.shape(scale_tril) != (K, d, d):
        raise ValueError(
            f"scale_tril must have shape (K, d, d) = ({K}, {d}, {d}) to match locs, "
            f"got {jnp.shape(scale_tril)}"
        )
    if scale is not None and jnp.shape(scale) != (K, d):
        raise ValueError(f"scale must have shape (K, d) = ({K}, {d}) to match locs, got {jnp.shape(scale)}")
    return K, d
