"""What the fixed rule's certified bracket costs: compilation and run time of the default
entropy's value and gradient with the bracket (the cap at a certified upper bound and the
floor at the heaviest-pair Bhattacharyya bound) against the same rule without it, measured
alternately in one run.

"Without" replaces the kernels' ``certified_upper`` by ``+inf`` and ``heaviest_pair_lower``
by ``-inf`` (the rule itself is unchanged). Compilation: ``jax.jit(jax.value_and_grad(f,
argnums=(0, 1, 2))).lower(...).compile()`` after ``jax.clear_caches()``, process CPU time;
run: median wall time of ``--calls`` calls. Min over ``--repeats`` alternations.

Usage::

    python benchmarks/bracket_cost.py            # float32
    JAX_ENABLE_X64=1 python benchmarks/bracket_cost.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_gmm._kernels import lowrank, mixing

CASES = [("diag", 8, 2, 0), ("diag", 8, 10, 0), ("diag", 4, 1000, 0), ("full", 4, 10, 0), ("full", 4, 100, 0),
         ("lowrank", 4, 1000, 4), ("lowrank", 8, 100, 2)]


def _args(kind, K, d, r, dtype):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=K), dtype)
    locs = jnp.asarray(rng.normal(size=(K, d)), dtype)
    if kind == "diag":
        return logits, locs, jnp.asarray(rng.uniform(0.5, 1.5, (K, d)), dtype)
    if kind == "full":
        tril = np.tril(rng.normal(size=(K, d, d)) * 0.1 / np.sqrt(d), -1) + np.eye(d)
        return logits, locs, jnp.asarray(tril, dtype)
    return logits, locs, (jnp.asarray(rng.normal(size=(K, d, r)) * 0.3, dtype), jnp.asarray(rng.uniform(0.5, 1.5, (K, d)), dtype))


def _fn(kind):
    log_softmax = jax.nn.log_softmax
    if kind == "diag":
        return lambda lg, m, s: mixing.mixing_qmc_entropy(log_softmax(lg), m, None, s)
    if kind == "full":
        return lambda lg, m, t: mixing.mixing_qmc_entropy(log_softmax(lg), m, t, None)
    return lambda lg, m, wd: lowrank.lowrank_mixing_qmc_entropy(log_softmax(lg), m, wd[0], wd[1])


class _Unbracketed:
    """Context: the kernels without the bracket's ``part`` (cap: +inf, floor: -inf, or both)."""

    def __init__(self, part):
        self.part = part

    def __enter__(self):
        self.saved = (mixing.certified_upper, lowrank.certified_upper, mixing.heaviest_pair_lower, lowrank.heaviest_pair_lower)
        if self.part in ("cap", "both"):
            mixing.certified_upper = lowrank.certified_upper = lambda *a, **k: jnp.inf
        if self.part in ("floor", "both"):
            mixing.heaviest_pair_lower = lowrank.heaviest_pair_lower = lambda *a, **k: -jnp.inf
        return self

    def __exit__(self, *exc):
        mixing.certified_upper, lowrank.certified_upper, mixing.heaviest_pair_lower, lowrank.heaviest_pair_lower = self.saved


def _measure(kind, args, calls):
    jax.clear_caches()
    g = jax.jit(jax.value_and_grad(_fn(kind), argnums=(0, 1, 2)))
    t0 = time.process_time()
    compiled = g.lower(*args).compile()
    comp = time.process_time() - t0
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return comp, statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--part", choices=("both", "cap", "floor"), default="both", help="what 'without' leaves out")
    p.add_argument("--kinds", default="diag,full,lowrank")
    a = p.parse_args()
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    print(f"dtype {jnp.dtype(dtype).name}; min of {a.repeats} alternations; value and gradient; without: {a.part}")
    print("| covariance | K | d | r | compile without (s) | compile with (s) | +s | run without (ms) | run with (ms) | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind, K, d, r in (c for c in CASES if c[0] in a.kinds.split(",")):
        args = _args(kind, K, d, r, dtype)
        res = {"with": [], "without": []}
        for _ in range(a.repeats):
            with _Unbracketed(a.part):
                res["without"].append(_measure(kind, args, a.calls))
            res["with"].append(_measure(kind, args, a.calls))
        cw, rw = (min(x[i] for x in res["with"]) for i in (0, 1))
        co, ro = (min(x[i] for x in res["without"]) for i in (0, 1))
        print(f"| {kind} | {K} | {d} | {r or '-'} | {co:.2f} | {cw:.2f} | {cw - co:+.2f} | {1e3 * ro:.2f} | {1e3 * rw:.2f} | {rw / ro:.2f} |", flush=True)


if __name__ == "__main__":
    main()
