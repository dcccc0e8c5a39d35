"""The mixing rule's two ways of visiting the components, timed side by side.

:func:`numpyro_gmm._kernels.mixing.mixing_qmc_entropy` evaluates all ``K`` components at once
(diagonal: two matrix products over all pairs; full and low rank: a ``vmap``) while their work fits in
``ALL_AT_ONCE_MAX_ELEMENTS`` floats, and one at a time (a rematerialised ``lax.map``)
beyond. This script times the value and gradient of the kernel with the randomised points
(as ``TraceEntropy_ELBO`` calls it), ``N`` calls in one compiled ``lax.scan`` with a new key
each, both ways in the same run (the one-at-a-time baseline by setting the limits to 0 while
tracing), interleaved over repeats; it prints the minimum CPU time per call of each and
their ratio, and checks that both give the same values.

``python benchmarks/mixing_all_at_once.py [--repeats 15]``
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from numpyro_gmm._kernels import lowrank, mixing  # noqa: E402

RANK = 4

N = 100
CASES = [  # (covariance, K, d, M)
    ("diag", 2, 3, 16), ("diag", 4, 100, 16), ("diag", 8, 50, 16), ("diag", 4, 1000, 16), ("diag", 8, 10, 1024),
    ("full", 2, 3, 16), ("full", 4, 10, 16), ("full", 2, 50, 16), ("full", 4, 100, 16), ("full", 2, 2, 1024),
    ("full", 8, 10, 1024), ("lowrank", 4, 100, 16), ("lowrank", 4, 1000, 16), ("lowrank", 8, 1000, 16),
]


def program(cov, K, d, M, dtype, at_once: bool):
    rng = np.random.default_rng(0)
    locs = jnp.asarray(rng.normal(size=(K, d)), dtype)
    if cov == "diag":
        factor = jnp.asarray(np.exp(0.3 * rng.normal(size=(K, d))), dtype)
    elif cov == "lowrank":
        factor = (jnp.asarray(0.3 * rng.normal(size=(K, d, RANK)), dtype),
                  jnp.asarray(np.exp(0.3 * rng.normal(size=(K, d))), dtype))
    else:
        a = rng.normal(size=(K, d, d)) * 0.3 / np.sqrt(d)
        factor = jnp.asarray(np.linalg.cholesky(a @ np.swapaxes(a, -1, -2) + np.eye(d)), dtype)
    logits = jnp.zeros(K, dtype)

    def entropy(lg, m, f, key):
        if cov == "lowrank":
            return lowrank.lowrank_mixing_qmc_entropy(jax.nn.log_softmax(lg), m, f[0], f[1], num_points=M, key=key)
        tril, scale = (None, f) if cov == "diag" else (f, None)
        return mixing.mixing_qmc_entropy(jax.nn.log_softmax(lg), m, tril, scale, num_points=M, key=key)

    vg = jax.value_and_grad(entropy, argnums=(0, 1, 2))

    def run(lg, m, f, key):
        def one(acc, k):
            value, grads = vg(lg, m, f, k)
            return acc + value + sum(jnp.sum(g) for g in jax.tree_util.tree_leaves(grads)), value
        return lax.scan(one, jnp.zeros((), dtype), jax.random.split(key, N))

    saved = dict(mixing.ALL_AT_ONCE_MAX_ELEMENTS)
    if not at_once:
        mixing.ALL_AT_ONCE_MAX_ELEMENTS.update(diag=0, full=0, lowrank=0)
    try:
        compiled = jax.jit(run).lower(logits, locs, factor, jax.random.PRNGKey(0)).compile()
    finally:
        mixing.ALL_AT_ONCE_MAX_ELEMENTS.update(saved)
    return compiled, (logits, locs, factor)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    print(f"{np.dtype(dtype).name}; value and gradient of the randomised mixing rule, {N} calls per program; "
          f"minimum CPU time per call over {a.repeats} interleaved repeats")
    print("| cov | K | d | M | all at once? | at once / default (us) | one at a time (us) | ratio | max value difference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cov, K, d, M in CASES:
        work = {"diag": K * K * (M + d), "full": K * K * d * (M + d), "lowrank": K * M * (d + K * RANK)}[cov]
        used = work <= mixing.ALL_AT_ONCE_MAX_ELEMENTS[cov]
        progs = [program(cov, K, d, M, dtype, True), program(cov, K, d, M, dtype, False)]
        times = [[], []]
        for rep in range(a.repeats):
            for i, (p, args) in enumerate(progs):
                t = time.process_time()
                jax.block_until_ready(p(*args, jax.random.PRNGKey(rep)))
                times[i].append(time.process_time() - t)
        values = [np.asarray(p(*args, jax.random.PRNGKey(0))[1], np.float64) for p, args in progs]
        diff = float(np.max(np.abs(values[0] - values[1])))
        t0, t1 = (min(t) / N * 1e6 for t in times)
        print(f"| {cov} | {K} | {d} | {M} | {'yes' if used else 'no'} | {t0:.1f} | {t1:.1f} | {t0 / t1:.2f} | {diff:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
