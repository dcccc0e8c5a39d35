"""Peak resident memory of the Legendre entropy at K = 20, order 8, d = 2 (10 million compositions).

Each measurement runs in a fresh subprocess and reads its peak resident set size
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``), which includes the Python interpreter,
JAX/XLA and compilation. A subprocess that only imports JAX and runs a trivial ``jit`` is
measured too, as the floor.

Usage::

    python benchmarks/memory.py                    # forward and forward + gradient, float32
    JAX_ENABLE_X64=1 python benchmarks/memory.py   # float64
    python benchmarks/memory.py --K 20 --order 8 --d 2 --block-size 4096
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def worker(mode: str, K: int, order: int, d: int, block_size: int) -> dict:
    import resource
    import warnings

    warnings.simplefilter("ignore")
    import jax
    import jax.numpy as jnp
    import numpy as np

    from numpyro_gmm import legendre_entropy
    from numpyro_gmm.compositions import num_compositions

    rng = np.random.default_rng(0)
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    logits = jnp.asarray(rng.normal(size=K), dtype)
    locs = jnp.asarray(2.0 * rng.normal(size=(K, d)), dtype)
    tril = jnp.asarray(np.tril(rng.normal(size=(K, d, d)), -1) * 0.3 + np.eye(d), dtype)
    f = lambda lg, m, t: legendre_entropy(lg, m, t, order=order, block_size=block_size)  # noqa: E731
    t0 = time.perf_counter()
    if mode == "floor":
        out = float(jax.jit(lambda x: x + 1)(1.0))
    elif mode == "forward":
        out = float(jax.jit(f)(logits, locs, tril))
    else:
        value, grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(logits, locs, tril)
        out = float(value)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    seconds = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    n = sum(num_compositions(k, K) for k in range(2, order + 2))
    return dict(mode=mode, value=out, peak_mib=peak_kib / 1024, seconds=seconds, compositions=n, dtype=str(dtype.dtype))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker")
    p.add_argument("--K", type=int, default=20)
    p.add_argument("--order", type=int, default=8)
    p.add_argument("--d", type=int, default=2)
    p.add_argument("--block-size", type=int, default=None)
    a = p.parse_args()
    if a.block_size is None:
        from numpyro_gmm._kernels.power_integrals import DEFAULT_BLOCK_SIZE

        a.block_size = DEFAULT_BLOCK_SIZE
    if a.worker:
        print(json.dumps(worker(a.worker, a.K, a.order, a.d, a.block_size)))
        return
    print(f"K={a.K}, order={a.order}, d={a.d}, block_size={a.block_size}")
    print("| mode | compositions | dtype | peak RSS | time (compile + run) | value |")
    print("|---|---|---|---|---|---|")
    for mode in ("floor", "forward", "forward+gradient"):
        cmd = [sys.executable, __file__, "--worker", mode, "--K", str(a.K), "--order", str(a.order), "--d", str(a.d)]
        cmd += ["--block-size", str(a.block_size)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            print(f"| {mode} | failed: {res.stderr.strip().splitlines()[-1] if res.stderr else res.returncode} |")
            continue
        r = json.loads(res.stdout.strip().splitlines()[-1])
        label = "floor (import + trivial jit)" if mode == "floor" else mode
        print(
            f"| {label} | {r['compositions']:,} | {r['dtype']} | {r['peak_mib']:.0f} MiB | {r['seconds']:.2f} s "
            f"| {r['value']:.6f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
