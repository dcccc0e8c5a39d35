"""Shared timing helper of the benchmark scripts."""

import statistics
import time

import jax


def timed(fn, *args, repeats=3, reduce=min):
    """Best wall time (s) of ``fn(*args)`` over ``repeats`` calls, after one compiling call
    (``reduce``: another statistic of the ``repeats`` times, e.g. ``statistics.median``)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return reduce(times)


def svi_step_times(svi, state, *args, calls=20):
    """``(first, median)`` seconds of ``jax.jit(svi.update)(state, *args)``: its first call
    (compilation and run) and the median of ``calls`` further calls, each continuing from the
    state the previous one returned."""
    update = jax.jit(svi.update)
    t0 = time.perf_counter()
    state, _ = jax.block_until_ready(update(state, *args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        state, _ = jax.block_until_ready(update(state, *args))
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)
