"""Keep XLA's CPU compiler from recomputing an elementwise result inside every consumer.

XLA fuses an elementwise producer into each of its consumers' kernels: a value read by
``n`` fused kernels (a forward product and the reverse-mode products of the gradient,
Adam's two moment updates, ...) is computed ``n`` times, once per element of each
consumer's output. For cheap producers that is what makes fusion pay; for expensive ones
it multiplies their cost. Measured cases: the entropy rule's quasi-random points (shift,
``floor``, normal quantile) in 6-8 kernels of the low-rank rule's value and gradient
(``d = 1000``, ``K = 4``, ``M = 16``: about 1 ms of its 3 ms), and the unrolled
random-number hash with its inverse error function in the two Adam updates of a low-rank
factor's gradient, recomputed for each of the ``r`` columns of the ``(K, d, r)`` output
(two kernels of 0.5 ms each per SVI step at ``d = 1000``, the whole draw 0.03 ms).
``lax.optimization_barrier`` does not help: the CPU compiler drops it before fusing.

A conditional is a boundary no fusion crosses. :func:`computed_once` evaluates ``fn``
inside one whose predicate is ``True`` behind an optimisation barrier (XLA keeps the
barrier until the conditionals are simplified, so the conditional stays; the predicate
depends on no argument, so under a ``vmap`` it stays a conditional instead of becoming a
select). Its other branch (NaN, or zeros for integers) is never taken. Only on the CPU
(``lax.platform_dependent``): on a GPU a conditional may wait for its predicate on the
host, so there ``fn`` is traced as it is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["computed_once"]


def _never(shape_dtype):
    dtype = shape_dtype.dtype
    fill = jnp.nan if jnp.issubdtype(dtype, jnp.inexact) else 0
    return jnp.full(shape_dtype.shape, fill, dtype)


def computed_once(fn, *args):
    """``fn(*args)`` (arrays in, a pytree of arrays out), computed once on the CPU however
    many fused kernels read it (module docstring)."""

    def once(*args):
        out = jax.eval_shape(fn, *args)
        always = lax.optimization_barrier(jnp.array(True))
        return lax.cond(always, fn, lambda *_: jax.tree.map(_never, out), *args)

    return lax.platform_dependent(*args, cpu=once, default=fn)
