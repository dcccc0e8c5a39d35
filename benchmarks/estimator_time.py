"""Time per call of the default entropy and its two parts on the current device.

For each ``(d, K)``: ``auto`` (the default), ``mixing_qmc`` (1024 points per component) and
``legendre`` (order 8; only where ``C(9 + K - 1, K - 1)`` is below ``--max-compositions``),
forward and ``value_and_grad`` with respect to every parameter, float32, ``jax.jit``, best of
``--repeats`` steady-state calls. Mixtures as in ``benchmarks/accuracy.py`` (sep 1.5).

Run:  python benchmarks/estimator_time.py
      python benchmarks/estimator_time.py --dims 2 20 --ks 8 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accuracy import make_mixture  # noqa: E402
from timing import timed  # noqa: E402

import numpyro_gmm as G  # noqa: E402

warnings.filterwarnings("ignore", message="legendre_entropy in d=")  # measured on purpose


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", type=int, nargs="*", default=[2, 5, 20, 50])
    ap.add_argument("--ks", type=int, nargs="*", default=[4, 16, 64])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--max-compositions", type=int, default=3_000_000)
    args = ap.parse_args()
    print(f"devices: {jax.devices()}; float32; times in ms (best of {args.repeats})\n")
    methods = {"auto": G.auto_entropy, "mixing_qmc": G.mixing_qmc_entropy, "legendre": G.legendre_entropy}
    print("| d | K | " + " | ".join(f"{m} fwd | {m} fwd+grad" for m in methods) + " |")
    print("|---|---|" + "---|---|" * len(methods))
    for d in args.dims:
        for K in args.ks:
            lg, lo, tr = (jnp.asarray(x, jnp.float32) for x in make_mixture(d, K, 1.5, 7))
            cells = []
            for name, fn in methods.items():
                uses_legendre = name == "legendre" or (name == "auto" and d <= G.LEGENDRE_DEFAULT_MAX_DIM)
                if uses_legendre and G.num_compositions(G.DEFAULT_ORDER + 1, K) > args.max_compositions:
                    cells += ["-", "-"]
                    continue
                f = jax.jit(fn)
                g = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))
                cells += [f"{1e3 * timed(f, lg, lo, tr, repeats=args.repeats):.3g}",
                          f"{1e3 * timed(g, lg, lo, tr, repeats=args.repeats):.3g}"]
            print(f"| {d} | {K} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
