"""Where the wall time of ``benchmarks/posteriors.py``'s 10-seed programs goes: each phase of a
fit (initialisation, the SVI steps, the posterior draws, the 256-particle ELBO) compiled and
run on its own, ``jit(vmap)`` over the seeds as there, split into Python tracing, lowering
to StableHLO, XLA compilation and the run, for AutoGaussianMixture (defaults) and
AutoMultivariateNormal (the 3x wall-time goal's baseline), measured in the same process.

The phases are :func:`posteriors.svi_phases`, the pieces ``posteriors.fit_svi_seeds``
composes into one program; compiled apart, their sum differs from that program's wall time
(each phase's program has its own overhead, and JAX's tracing caches are shared between the
guides of a process: the first guide measured pays them), so read the split and the
ratios, not the totals, against the table of docs/posteriors.md.

Usage::

    python benchmarks/posteriors_phases.py [--models d50,label_switching] [--seeds 10]
        [--steps 3000] [--lr 0.02] [--methods AutoGaussianMixture,AutoMultivariateNormal]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from posteriors import MASS_DRAWS, PROBLEMS, svi_phases  # noqa: E402

STAGES = ("trace", "lower", "compile", "run")


def timed_phase(fn, *args):
    """``(output, seconds per stage)`` of ``jax.jit(jax.vmap(fn))(*args)``."""
    times = []
    t0 = time.perf_counter()
    traced = jax.jit(jax.vmap(fn)).trace(*args)
    times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    lowered = traced.lower()
    times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    compiled = lowered.compile()
    times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
    return out, times


def measure(problem, method, seeds, steps, lr):
    """``{phase: [trace, lower, compile, run]}`` (seconds) of one guide on ``problem``."""
    init, run, draw, evaluate = svi_phases(problem, method, steps, lr, MASS_DRAWS)
    keys = jax.vmap(lambda k: jax.random.split(k, 4))(jax.vmap(jax.random.PRNGKey)(jnp.arange(seeds)))
    state, t_init = timed_phase(init, keys[:, 0], keys[:, 1])
    params, t_run = timed_phase(run, state)
    _, t_draw = timed_phase(draw, keys[:, 2], params)
    _, t_eval = timed_phase(evaluate, keys[:, 3], params)
    return {"init": t_init, "steps": t_run, "draws": t_draw, "ELBO": t_eval}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="d50,label_switching")
    ap.add_argument("--methods", default="AutoGaussianMixture,AutoMultivariateNormal")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=0.02)
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    print(f"devices: {jax.devices()}; float32; seconds for {args.seeds} seeds in one jit(vmap) program per phase\n")
    print("| model | method | phase | " + " | ".join(STAGES) + " | total |")
    print("|---|---|---|" + "---|" * (len(STAGES) + 1))
    for name in args.models.split(","):
        problem = PROBLEMS[name]()
        totals = {}
        for method in methods:
            phases = measure(problem, method, args.seeds, args.steps, args.lr)
            sums = [sum(t[i] for t in phases.values()) for i in range(len(STAGES))]
            for phase, t in list(phases.items()) + [("all", sums)]:
                print(f"| {name} | {method} | {phase} | " + " | ".join(f"{x:.2f}" for x in t) + f" | {sum(t):.2f} |",
                      flush=True)
            totals[method] = sums
        if len(methods) > 1:
            base = totals[methods[-1]]
            for method in methods[:-1]:
                ratios = " | ".join(f"{a / b:.1f}x" for a, b in zip(totals[method], base))
                print(f"| {name} | {method} / {methods[-1]} | all | {ratios} | {sum(totals[method]) / sum(base):.1f}x |")


if __name__ == "__main__":
    main()
