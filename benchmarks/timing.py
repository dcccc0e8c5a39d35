"""Shared timing helper of the benchmark scripts."""

import math
import time

import jax


def timed(fn, *args, repeats=3):
    """Best wall time (s) of ``fn(*args)`` over ``repeats`` calls, after one compiling call."""
    jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best
