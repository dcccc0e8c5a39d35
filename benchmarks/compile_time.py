"""First-call (trace + compile) and steady-state time of the Legendre entropy, against a
faithful unrolled baseline.

For every ``K in {2,3,4,8,16,32}``, ``order in {2,4,6,8,10}``, ``d in {1,2,8}`` one fresh
subprocess (so nothing is cached between configurations) measures, for
``jax.jit(legendre_entropy)`` in float32:

* ``setup``: building the composition schedule and unranking tables (NumPy, once per
  ``(K, order)``, cached afterwards);
* ``trace``: ``jax.jit(f).lower(*args)`` (tracing and lowering to StableHLO);
* ``compile``: ``.compile()`` -- wall time and this process's CPU time;
* ``first run`` and ``run`` (median of repeated calls) of the compiled function, skipped
  when the configuration has more than ``--max-run`` compositions.

The first call a user sees is ``trace + compile + first run``. The *unrolled baseline*
(:func:`unrolled_entropy`) is the structure of the original code: a Python loop over the
``itertools`` compositions, each composition's Gaussian-product integral computed with its
own operations and its counts as static Python ints, so the graph has one sub-graph per
composition. It runs in a subprocess with a time cap (``--cap`` seconds, default 60) on
trace + compile + first run; configurations larger (in compositions, same ``d``) than one
that hit the cap are not attempted and are also reported as ``> cap``.

The machine is shared: wall times move with the load, so the CPU time of the compiling
process is printed too and the summary (slowest / fastest compile) is given for both.

Usage::

    python benchmarks/compile_time.py              # full table, prints markdown
    python benchmarks/compile_time.py --quick      # a few configurations
    python benchmarks/compile_time.py --write docs/performance.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time

from doc_sections import write_section

KS = (2, 3, 4, 8, 16, 32)
ORDERS = (2, 4, 6, 8, 10)
DIMS = (1, 2, 8)


def num_terms(K: int, order: int) -> int:
    """Compositions evaluated for one entropy: powers ``n = 2..order + 1``."""
    return sum(math.comb(n + K - 1, K - 1) for n in range(2, order + 2))


def make_args(K: int, d: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    logits = rng.normal(size=K).astype(np.float32)
    locs = (2.0 * rng.normal(size=(K, d))).astype(np.float32)
    tril = (np.tril(rng.normal(size=(K, d, d)), -1) * 0.3 + np.eye(d) * rng.uniform(0.5, 1.5, (K, 1, 1))).astype(
        np.float32
    )
    return logits, locs, tril


def unrolled_entropy(logits, locs, scale_tril, *, order: int):
    """The original structure: one sub-graph per composition (static Python counts).

    Same formula as the engine (information-form Gaussian products, log-space, the
    paper's bound ``a``), written as the original code did: a Python loop over
    ``itertools`` compositions with the counts as Python ints.
    """
    import jax.numpy as jnp
    from jax.nn import log_softmax, logsumexp

    from numpyro_gmm._kernels.legendre import legendre_entropy_from_moments

    K, d = locs.shape
    log_w = log_softmax(logits)
    eye = jnp.eye(d, dtype=locs.dtype)
    comps = []
    for i in range(K):
        l_inv = jnp.linalg.solve(scale_tril[i], eye)
        prec = l_inv.T @ l_inv
        h = prec @ locs[i]
        log_det_cov = 2.0 * jnp.sum(jnp.log(jnp.diag(scale_tril[i])))
        g = -0.5 * (d * math.log(2 * math.pi) + log_det_cov + locs[i] @ h)
        comps.append((prec, h, g, log_det_cov))
    log_a = logsumexp(jnp.stack([log_w[i] - 0.5 * (d * math.log(2 * math.pi) + comps[i][3]) for i in range(K)]))
    log_moments = []
    for n in range(2, order + 2):
        terms = []
        for bars in itertools.combinations(range(n + K - 1), K - 1):  # stars and bars
            cuts = (-1,) + bars + (n + K - 1,)
            m = [cuts[i + 1] - cuts[i] - 1 for i in range(K)]
            log_coef = math.lgamma(n + 1) - sum(math.lgamma(mi + 1) for mi in m)
            lam = sum(mi * comps[i][0] for i, mi in enumerate(m) if mi)
            eta = sum(mi * comps[i][1] for i, mi in enumerate(m) if mi)
            chol = jnp.linalg.cholesky(lam)
            z = jnp.linalg.solve(chol, eta)
            log_int = (
                sum(mi * (log_w[i] + comps[i][2]) for i, mi in enumerate(m) if mi)
                + 0.5 * d * math.log(2 * math.pi)
                - jnp.sum(jnp.log(jnp.diag(chol)))
                + 0.5 * z @ z
            )
            terms.append(log_coef + log_int)
        log_moments.append(logsumexp(jnp.stack(terms)) - (n - 1) * log_a)
    return legendre_entropy_from_moments(jnp.stack(log_moments), log_a, order)


def worker(kind: str, K: int, order: int, d: int, max_run: int, repeats: int) -> dict:
    import warnings

    warnings.simplefilter("ignore")  # order 10 > the float32-safe order warns
    t0 = time.perf_counter()
    from numpyro_gmm.compositions import pair_schedule, unrank_tables

    setup = 0.0
    if kind == "engine":
        from numpyro_gmm._kernels.power_integrals import DEFAULT_BLOCK_SIZE

        t0 = time.perf_counter()
        sched = pair_schedule(2, order + 1, K, DEFAULT_BLOCK_SIZE)
        unrank_tables(order + 1, sched.K_a)
        unrank_tables(order + 1, sched.K_b)
        setup = time.perf_counter() - t0
    import jax
    import numpy as np

    jax.jit(lambda x: x + 1)(1.0).block_until_ready()  # backend start-up, not measured
    if kind == "engine":
        from numpyro_gmm import legendre_entropy

        fn = jax.jit(lambda a, b, c: legendre_entropy(a, b, c, order=order))
    else:
        fn = jax.jit(lambda a, b, c: unrolled_entropy(a, b, c, order=order))
    args = [jax.numpy.asarray(x) for x in make_args(K, d)]
    t0 = time.perf_counter()
    lowered = fn.lower(*args)
    trace = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    compile_wall, compile_cpu = time.perf_counter() - t0, time.process_time() - c0
    out = dict(setup=setup, trace=trace, compile=compile_wall, compile_cpu=compile_cpu, n=num_terms(K, order))
    if out["n"] > max_run:
        return out
    t0 = time.perf_counter()
    value = float(compiled(*args))
    out["first_run"] = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        compiled(*args).block_until_ready()
        times.append(time.perf_counter() - t0)
        if sum(times) > 5.0:
            break
    out["run"] = float(np.median(times))
    out["value"] = value
    return out


def run_worker(kind, K, order, d, max_run, repeats, timeout):
    cmd = [sys.executable, __file__, "--worker", kind, str(K), str(order), str(d), "--max-run", str(max_run)]
    cmd += ["--repeats", str(repeats)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"rc={res.returncode}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def fmt_s(x):
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", nargs=4, metavar=("KIND", "K", "ORDER", "D"))
    p.add_argument("--cap", type=float, default=60.0, help="time cap of one baseline subprocess (s)")
    p.add_argument("--max-run", type=int, default=15_000_000, help="run only up to this many compositions")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--write", help="markdown file to put the table in (between markers)")
    a = p.parse_args()
    if a.worker:
        kind, K, order, d = a.worker
        print(json.dumps(worker(kind, int(K), int(order), int(d), a.max_run, a.repeats)))
        return
    configs = [(K, o, d) for d in DIMS for K in KS for o in ORDERS]
    if a.quick:
        configs = [(2, 2, 1), (20, 8, 2), (32, 10, 1), (32, 10, 8), (3, 4, 2)]
    header = (
        "| d | K | order | compositions | setup (NumPy) | trace | compile (wall) | compile (CPU) "
        "| first call | run | unrolled first call | unrolled / engine |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print(lines[0], flush=True)
    print(lines[1], flush=True)
    capped = {}  # d -> smallest composition count that hit the cap
    rows = []
    for K, order, d in configs:
        r = run_worker("engine", K, order, d, a.max_run, a.repeats, 600)
        if r is None or "error" in r:
            print(f"engine failed at K={K} order={order} d={d}: {r}", file=sys.stderr)
            continue
        first = r["trace"] + r["compile"] + r.get("first_run", 0.0)
        n = r["n"]
        base = "not run"
        ratio = "-"
        if not a.no_baseline:
            if d in capped and n >= capped[d]:
                base = f"> {a.cap:.0f} s (larger than a capped case)"
            else:
                b = run_worker("unrolled", K, order, d, a.max_run, 1, a.cap)
                if b is None:
                    capped[d] = min(capped.get(d, n), n)
                    base = f"> {a.cap:.0f} s"
                elif "error" in b:
                    base = f"error: {b['error'][:40]}"
                else:
                    bfirst = b["trace"] + b["compile"] + b.get("first_run", 0.0)
                    base = fmt_s(bfirst)
                    ratio = f"{bfirst / first:.0f}x"
                    # float32; beyond the float32-safe order both values are cancellation noise
                    if "value" in b and "value" in r and order <= 8 and abs(b["value"] - r["value"]) > 5e-3:
                        ratio += f" (values differ: {b['value']:.5f} vs {r['value']:.5f})"
        run = fmt_s(r.get("run")) if "run" in r else f"run skipped ({n:.3g} compositions)"
        line = (
            f"| {d} | {K} | {order} | {n:,} | {fmt_s(r['setup'])} | {fmt_s(r['trace'])} | {fmt_s(r['compile'])} "
            f"| {fmt_s(r['compile_cpu'])} | {fmt_s(first) if 'first_run' in r else fmt_s(r['trace'] + r['compile']) + ' (no run)'} "
            f"| {run} | {base} | {ratio} |"
        )
        print(line, flush=True)
        lines.append(line)
        rows.append(r)
    if rows:
        tc = [r["trace"] + r["compile"] for r in rows]
        cc = [r["compile_cpu"] for r in rows]
        summary = (
            f"trace + compile (wall): fastest {min(tc):.2f} s, slowest {max(tc):.2f} s, ratio {max(tc) / min(tc):.2f}; "
            f"compile CPU time: fastest {min(cc):.2f} s, slowest {max(cc):.2f} s, ratio {max(cc) / min(cc):.2f}"
        )
        print("\n" + summary)
        try:
            load = os.getloadavg()
            print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")
        except OSError:
            pass
        if a.write:
            write_section(a.write, "compile-time", "\n".join(lines) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    main()
