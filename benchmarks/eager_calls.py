"""Eager (un-jitted) first calls: how many XLA programs each compiles, and how long it takes.

Called outside ``jax.jit``, JAX dispatches every operation on its own and compiles one small
program per new operation and shape (tens of milliseconds each on a CPU). ``GaussianMixture``
runs each of its eager entry points (construction, ``log_prob``, ``sample``, the moments,
``entropy``) as one compiled program per shapes; NumPyro's
``MixtureSameFamily(CategoricalLogits, MultivariateNormal)`` with the same parameters, measured
in the same run, is the baseline. Each library runs in a fresh subprocess (nothing cached
between them; no persistent compilation cache), with XLA's default flags unless ``XLA_FLAGS``
says otherwise. Counts are of backend compilations (``jax.monitoring``); times are the wall
and CPU time of the call, compilation included.

Usage::

    python benchmarks/eager_calls.py [--K 3] [--d 2] [--cov full|diag]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import jax, jax.numpy as jnp, numpy as np
    import jax.monitoring as mon
    import numpyro.distributions as dist
    from numpyro_gmm import GaussianMixture

    lib, K, d, cov = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    count = [0]
    mon.register_event_duration_secs_listener(
        lambda e, s, **k: count.__setitem__(0, count[0] + (e == "/jax/core/compile/backend_compile_duration")))
    rng = np.random.default_rng(0)
    loc = rng.normal(size=(K, d))
    sd = rng.uniform(0.5, 1.5, size=(K, d))
    tril = np.tril(rng.normal(size=(K, d, d)) * 0.3, -1) + np.eye(d) * sd[..., None]
    logits = rng.normal(size=K)
    x = rng.normal(size=(4, d))
    jnp.zeros(1).block_until_ready()  # backend start-up, not counted
    rows = []

    def step(name, fn):
        count[0] = 0
        t, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        rows.append((name, count[0], time.perf_counter() - t, time.process_time() - c))

    holder = {}  # the parameters as NumPy arrays, as a user passes them, to both libraries
    if lib == "numpyro_gmm":
        kw = dict(scale=sd) if cov == "diag" else dict(scale_tril=tril)
        step("construct", lambda: holder.setdefault("m", GaussianMixture(loc, logits=logits, **kw)))
    else:
        comp = ((lambda: dist.Normal(loc, sd).to_event(1)) if cov == "diag"
                else (lambda: dist.MultivariateNormal(loc, scale_tril=tril)))
        step("construct", lambda: holder.setdefault("m", dist.MixtureSameFamily(dist.CategoricalLogits(logits), comp())))
    m = holder["m"]
    step("log_prob", lambda: m.log_prob(jnp.asarray(x, jnp.float32)))
    step("sample", lambda: m.sample(jax.random.PRNGKey(0), (5,)))
    step("mean, variance", lambda: (m.mean, m.variance))
    if lib == "numpyro_gmm":
        step("entropy", lambda: m.entropy())
    print(json.dumps(rows))
    """
)


def run(lib, K, d, cov):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", CHILD, lib, str(K), str(d), cov], env=env,
                         capture_output=True, text=True, check=True)
    return {name: (n, wall, cpu) for name, n, wall, cpu in json.loads(out.stdout.strip().splitlines()[-1])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--d", type=int, default=2)
    ap.add_argument("--cov", choices=["full", "diag"], default="full")
    args = ap.parse_args()
    ours = run("numpyro_gmm", args.K, args.d, args.cov)
    base = run("numpyro", args.K, args.d, args.cov)
    print(f"Eager first calls, K = {args.K}, d = {args.d}, {args.cov} covariances, float32, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '') or '(defaults)'}\n")
    print("| call | GaussianMixture: programs | wall (s) | CPU (s) "
          "| NumPyro MixtureSameFamily: programs | wall (s) | CPU (s) | CPU ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (n, wall, cpu) in ours.items():
        if name in base:
            bn, bw, bc = base[name]
            tail = f"{bn} | {bw:.2f} | {bc:.2f} | {cpu / bc:.2f}"
        else:
            tail = "- | - | - | -"
        print(f"| {name} | {n} | {wall:.2f} | {cpu:.2f} | {tail} |")


if __name__ == "__main__":
    main()
