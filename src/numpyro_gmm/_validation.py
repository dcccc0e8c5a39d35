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
    """The floating dtype the computation runs in: JAX's promotion of the inputs."""
    dtype = jnp.result_type(*[a for a in arrays if a is not None])
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
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
