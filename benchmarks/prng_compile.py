"""Compilation and run time of random draws: ``jax.random`` against ``numpyro_gmm._kernels.prng``
(the same bits; its module docstring says why they differ in cost), measured side by side.

Each row compiles, in a fresh program (a new constant folded in, so nothing is cached),
``jax.jit(jax.vmap(f))`` over 10 keys, ``f`` one call site of the draw (or ``--sites`` of
them, each on its own key, given), and reports the lowering + compilation seconds (median over
``--repeats`` programs) and the run time of the compiled program (best of 20 calls, µs).

    python benchmarks/prng_compile.py [--sites 1,4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from numpyro_gmm._kernels import prng

DRAWS = {
    "split(key, 3)": lambda r, k: r.split(k, 3).astype(jnp.float32),
    "fold_in(key, 1)": lambda r, k: r.fold_in(k, 1).astype(jnp.float32),
    "uniform(key, (64, 3))": lambda r, k: r.uniform(k, (64, 3)),
    "normal(key, (64, 3))": lambda r, k: r.normal(k, (64, 3)),
    "normal(key, (64, 2, 50))": lambda r, k: r.normal(k, (64, 2, 50)),
}


def measure(module, draw, sites, repeats):
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(10 * sites)).reshape(10, sites, 2)
    compile_s, run_us = [], []
    for rep in range(repeats):
        def f(ks, rep=rep):  # ks (sites, 2): one key per call site
            return sum(jnp.sum(draw(module, ks[i])) for i in range(sites)) + rep

        t0 = time.perf_counter()
        compiled = jax.jit(jax.vmap(f)).lower(keys).compile()
        compile_s.append(time.perf_counter() - t0)
        jax.block_until_ready(compiled(keys))
        best = float("inf")
        for _ in range(20):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(keys))
            best = min(best, time.perf_counter() - t0)
        run_us.append(best * 1e6)
    return statistics.median(compile_s), min(run_us)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", default="1,4", help="call sites per program (comma separated)")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    jax.jit(lambda x: x + 1)(1.0)  # the backend's own start-up, outside the table
    print(f"jax {jax.__version__}, {jax.devices()}; 10 keys vmapped; compile = lowering + XLA compilation, "
          f"median of {a.repeats} fresh programs; run = best of 20 calls")
    print("| draw | call sites | jax.random compile (s) | prng compile (s) | ratio | jax.random run (µs) | prng run (µs) |")
    print("|---|---|---|---|---|---|---|")
    for sites in (int(s) for s in a.sites.split(",")):
        for name, draw in DRAWS.items():
            (cj, rj), (cp, rp) = measure(jax.random, draw, sites, a.repeats), measure(prng, draw, sites, a.repeats)
            print(f"| {name} | {sites} | {cj:.3f} | {cp:.3f} | {cj / cp:.1f} | {rj:.0f} | {rp:.0f} |", flush=True)


if __name__ == "__main__":
    main()
