r"""Bounded working memory for many evaluations of a model's log density at once.

The initialisation of :class:`~numpyro_gmm.AutoGaussianMixture` evaluates the potential
(minus the log joint density) and its derivatives at many points at once (``vmap`` over
fits, particles, Hessian columns and scoring points). Each evaluation's intermediate values
scale with the model's data: a logistic regression on ``N = 10^6`` rows keeps a few arrays
of ``N`` floats per evaluation, so the 32 Newton refinements' Hessians (20 columns each) at
once took 17 GB. Batched in chunks (``lax.map`` with ``batch_size``: a ``vmap`` inside
each chunk, a loop over the chunks) the same values need a bounded working set.

**Estimate.** :func:`peak_bytes` takes one evaluation traced to a jaxpr and walks its
equations in order, keeping each intermediate value alive from the equation that makes it to
its last use (sub-programs of loops and conditionals add their own peak while they run); its
peak is the estimate. Inputs and closed-over constants (the data) are not counted: they exist
once whatever the batch. It ignores what XLA's fusion and buffer reuse save, so for many
evaluations at once it overestimates; XLA may add buffers of its own per program (a copy of
the data in another layout), which no per-evaluation count sees. Measured on a logistic
regression, ``N = 10^6``, ``d = 20``: 43 MB per gradient evaluation; XLA's own buffers
(``memory_analysis`` of the compiled program) 96 MB for one gradient (80 MB of it the size
of the data), 176 MB for 8 at once against the estimate's 344 MB, for 8 Hessians 0.93 GB
against 13.8 GB by the rule of the initialisation's kernels (a Hessian-vector product
counted as two gradient evaluations, ``d`` of them per Hessian).

**Chunks.** :meth:`MemoryBudget.batch` is the largest number of items (of ``evaluations``
gradient evaluations each) whose estimate fits the budget, at least 1 and at most the
number of items (all of them for :data:`UNBOUNDED`); :func:`map_batched` is then a plain ``vmap`` when one chunk holds every
item (the program is unchanged) and ``lax.map(..., batch_size=...)`` otherwise, whose
results are the same values.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax import lax
from jax.extend.core import Var, jaxprs_in_params

__all__ = ["UNBOUNDED", "MemoryBudget", "map_batched", "peak_bytes"]


def _nbytes(var) -> int:
    aval = var.aval
    if not hasattr(aval, "shape"):
        return 0
    # JAX's extended dtypes (PRNG keys, ``key<fry>``) are no NumPy dtypes but have an itemsize
    return int(np.prod(aval.shape, dtype=np.int64)) * int(getattr(aval.dtype, "itemsize", 0))


def peak_bytes(jaxpr) -> int:
    """Peak bytes of the intermediate values alive at once while ``jaxpr`` (a ``Jaxpr`` or
    ``ClosedJaxpr``) runs its equations in order (module docstring)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    eqns = jaxpr.eqns
    last_use = {}
    for i, eqn in enumerate(eqns):
        for v in eqn.invars:
            if isinstance(v, Var):
                last_use[v] = i
    for v in jaxpr.outvars:
        if isinstance(v, Var):
            last_use[v] = len(eqns)
    live = peak = 0
    held = set()  # intermediates made by this jaxpr's equations and still needed
    for i, eqn in enumerate(eqns):
        inner = max((peak_bytes(sub) for sub in jaxprs_in_params(eqn.params)), default=0)
        peak = max(peak, live + inner + sum(_nbytes(v) for v in eqn.outvars))
        for v in eqn.outvars:
            if isinstance(v, Var) and last_use.get(v, -1) > i:
                held.add(v)
                live += _nbytes(v)
        for v in {v for v in eqn.invars if isinstance(v, Var)}:
            if v in held and last_use[v] == i:
                held.discard(v)
                live -= _nbytes(v)
    return peak


@dataclass(frozen=True)
class MemoryBudget:
    """``limit`` bytes for the estimated working set of ``evaluation`` bytes per gradient
    evaluation of the potential (:func:`peak_bytes` of its trace; 0: no bound)."""

    evaluation: int
    limit: int

    def batch(self, evaluations: float, items: int) -> int:
        """How many items of ``evaluations`` gradient evaluations each to evaluate at once:
        ``limit // (evaluations * evaluation)``, clipped to ``[1, items]``; all of them where
        the estimate is 0."""
        per_item = evaluations * self.evaluation
        if per_item <= 0:
            return items
        return int(min(max(self.limit // per_item, 1), items))


#: Every item at once (a plain ``vmap``): the kernels' default.
UNBOUNDED = MemoryBudget(evaluation=0, limit=0)


def map_batched(fn, batch_size: int, *args):
    """``jax.vmap(fn)(*args)`` over the leading axis of ``args``, ``batch_size`` items at a
    time (``lax.map``) when that is fewer than all of them."""
    n = jax.tree.leaves(args)[0].shape[0]
    if batch_size >= n:
        return jax.vmap(fn)(*args)
    return lax.map(lambda a: fn(*a), args, batch_size=batch_size)
