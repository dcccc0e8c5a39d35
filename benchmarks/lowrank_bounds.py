"""``GaussianMixture.entropy_bounds()`` of low-rank components beyond ``LOWRANK_DENSE_MAX_DIM``
(``numpyro_gmm.lowrank_entropy_bounds``: no ``d x d`` matrix): first call, time per call,
XLA's planned memory, the bracket's width, and whether the default entropy lies inside it;
with ``--methods``, the same timings of the single bounds (``entropy("huber_lower")``, ...,
``"moment_matched_upper"``: ``_kernels/lowrank.py: named_bound``) and their values.

Mixtures: ``K`` components with means ``N(0, s^2 I)`` (``s = 1``: far apart in high
dimension; ``s = 0.02``: overlapping), ``W ~ N(0, 0.1^2)`` of rank ``r``, ``D ~ U(0.5, 1.5)``.

Usage::

    python benchmarks/lowrank_bounds.py [--sizes 4x1000x4,4x10000x8,32x1000x4,128x1000x4]
    JAX_ENABLE_X64=1 python benchmarks/lowrank_bounds.py
    python benchmarks/lowrank_bounds.py --methods moment_matched_upper,pairwise_kl_upper --spreads 0.02
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_gmm import GaussianMixture
from numpyro_gmm._kernels import lowrank as lowrank_kernel


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4x200x2,4x1000x4,4x10000x8,32x1000x4,128x200x2,128x1000x4",
                   help="comma-separated KxDxR")
    p.add_argument("--spreads", default="1,0.02")
    p.add_argument("--methods", default="", help="comma-separated single bounds to time instead of the bracket")
    a = p.parse_args(argv)
    if a.methods:
        return single_bounds(a)
    columns = ["first call (s)", "per call (ms)", "memory (MiB)", "lower", "upper", "width", "default inside"]
    for K, d, r, spread, mix in _mixtures(a, "; memory = XLA's planned arguments + outputs + temporaries", columns):
        (lower, upper), first, best = _timed(mix.entropy_bounds)
        compiled = jax.jit(lambda lg, m, w, dg: lowrank_kernel.entropy_bounds(jax.nn.log_softmax(lg), m, w, dg)).lower(
            mix.logits, mix.loc, mix.cov_factor, mix.cov_diag).compile()
        mem = compiled.memory_analysis()
        mib = (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes) / 2**20
        h = float(mix.entropy())
        print(f"| {K} | {d} | {r} | {spread:g} | {first:.2f} | {1e3 * best:.1f} | {mib:.1f} | {lower:.4f} | "
              f"{upper:.4f} | {upper - lower:.2e} | {'yes' if lower <= h <= upper else 'NO'} |", flush=True)


def _timed(fn):
    """``(fn()'s value(s) as float, first call (s), best of 3 later calls (s))``, caches cleared first."""
    jax.clear_caches()
    t = time.perf_counter()
    out = jax.tree.map(float, fn())
    first = time.perf_counter() - t
    best = np.inf
    for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return out, first, best


def _mixtures(a, note, columns):
    """Print the table's preamble and header; yield ``(K, d, r, spread, mixture)`` per row group."""
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    print(f"devices: {jax.devices()}; {jnp.dtype(dtype).name}; first call = compilation + one run, "
          f"per call = best of 3{note}\n")
    print("| K | d | r | means' spread | " + " | ".join(columns) + " |")
    print("|---" * (4 + len(columns)) + "|")
    for size in a.sizes.split(","):
        K, d, r = map(int, size.split("x"))
        for spread in map(float, a.spreads.split(",")):
            yield K, d, r, spread, _mixture(K, d, r, spread, dtype)


def _mixture(K, d, r, spread, dtype):
    rng = np.random.default_rng(0)
    return GaussianMixture(jnp.asarray(rng.normal(size=(K, d)) * spread, dtype),
                           cov_factor=jnp.asarray(rng.normal(size=(K, d, r)) * 0.1, dtype),
                           cov_diag=jnp.asarray(rng.uniform(0.5, 1.5, (K, d)), dtype),
                           logits=jnp.asarray(rng.normal(size=K), dtype))


def single_bounds(a):
    """The table of ``--methods``: first call and best of 3 per bound, its value, and the bracket
    of ``entropy_bounds()`` beside it."""
    columns = ["method", "first call (s)", "per call (ms)", "value", "entropy_bounds()"]
    for K, d, r, spread, mix in _mixtures(a, "", columns):
        lower, upper = (float(x) for x in mix.entropy_bounds())
        for method in a.methods.split(","):
            value, first, best = _timed(lambda: mix.entropy(method))
            print(f"| {K} | {d} | {r} | {spread:g} | {method} | {first:.2f} | {1e3 * best:.1f} | {value:.4f} | "
                  f"[{lower:.4f}, {upper:.4f}] |", flush=True)

if __name__ == "__main__":
    main()
