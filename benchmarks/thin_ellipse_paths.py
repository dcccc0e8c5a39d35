"""Thin ellipses (covariance condition number 1e4, 1e5; d = 2, K = 2, 4, 8, two seeds; and
d = 3, 5, 10) through each covariance path of ``GaussianMixture`` (scale_tril,
covariance_matrix, precision_matrix), every estimator, in the current dtype.

    python benchmarks/thin_ellipse_paths.py > f32.jsonl
    JAX_ENABLE_X64=1 python benchmarks/thin_ellipse_paths.py > f64.jsonl
    python benchmarks/thin_ellipse_paths.py --compare f32.jsonl f64.jsonl

The comparison prints, per estimator, the worst ``|value - float64 value through scale_tril|``
of each path, and (d = 2) the worst error against the nested Gauss-Legendre quadrature of
tests/test_adversarial.py (``entropy_2d_conditional``, float64, NumPy).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import warnings

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))
PATHS = ("scale_tril", "covariance_matrix", "precision_matrix")


def thin(d, K, cond, seed):
    rng = np.random.default_rng(seed)
    sds = np.ones(d)
    sds[1:] = 1.0 / math.sqrt(cond)  # covariance condition number cond
    covs = []
    for _ in range(K):
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        covs.append((q * sds**2) @ q.T)
    covs = np.array(covs)
    covs = 0.5 * (covs + np.swapaxes(covs, 1, 2))
    locs = 0.5 * rng.normal(size=(K, d))
    return rng.normal(size=K) * 0.5, locs, covs


CASES = [(2, K, c, s) for K in (2, 4, 8) for c in (1e4, 1e5) for s in (0, 1)] + [(d, 4, 1e4, 0) for d in (3, 5, 10)]


def measure():
    import jax
    import jax.numpy as jnp

    from numpyro_gmm import ENTROPY_METHODS, GaussianMixture

    warnings.simplefilter("ignore")
    F = jnp.float64 if os.environ.get("JAX_ENABLE_X64") == "1" else jnp.float32
    for d, K, cond, seed in CASES:
        lg, locs, covs = thin(d, K, cond, seed)
        prec = np.linalg.inv(covs)
        values = {"scale_tril": np.linalg.cholesky(covs), "covariance_matrix": covs,
                  "precision_matrix": 0.5 * (prec + np.swapaxes(prec, 1, 2))}
        out = {"d": d, "K": K, "cond": cond, "seed": seed}
        for path in PATHS:
            gm = GaussianMixture(jnp.asarray(locs, F), logits=jnp.asarray(lg, F), **{path: jnp.asarray(values[path], F)})
            res = {}
            for m in ENTROPY_METHODS:
                if m == "monte_carlo" or (m in ("legendre", "taylor", "legendre_normalized") and d > 3):
                    continue
                res[m] = float(gm.entropy(method=m))
            est, se = gm.entropy(method="monte_carlo", key=jax.random.PRNGKey(0), num_samples=1 << 14)
            res["monte_carlo"], res["monte_carlo_se"] = float(est), float(se)
            lo, hi = gm.entropy_bounds()
            res["bounds_lo"], res["bounds_hi"] = float(lo), float(hi)
            out[path] = res
        print(json.dumps(out), flush=True)


def compare(f32_file, f64_file):
    from test_adversarial import entropy_2d_conditional

    f32 = [json.loads(x) for x in open(f32_file) if x.startswith("{")]
    f64 = [json.loads(x) for x in open(f64_file) if x.startswith("{")]
    rounding, vs_truth = {}, {}
    for a, b in zip(f32, f64):
        truth = None
        if a["d"] == 2:
            lg, locs, covs = thin(2, a["K"], a["cond"], a["seed"])
            truth = entropy_2d_conditional(np.exp(lg - np.logaddexp.reduce(lg)), locs, np.linalg.cholesky(covs))
        for m, ref in b["scale_tril"].items():
            if m == "monte_carlo_se":
                continue
            for i, p in enumerate(PATHS):
                r = rounding.setdefault(m, [0.0] * 3)
                r[i] = max(r[i], abs(a[p][m] - ref))
                if truth is not None:
                    for tag, rec in (("float32", a), ("float64", b)):
                        e = rec[p][m] - truth
                        e = max(e, 0.0) if m == "bounds_lo" else min(e, 0.0) if m == "bounds_hi" else e
                        t = vs_truth.setdefault((m, tag), [0.0] * 3)
                        t[i] = max(t[i], abs(e))
    print("worst |float32 - float64 (scale_tril)| per path: scale_tril / covariance_matrix / precision_matrix")
    for m, r in rounding.items():
        print(f"  {m:30s} " + " / ".join(f"{x:.2e}" for x in r))
    print("worst |value - quadrature| (d = 2; bounds: violations only)")
    for (m, tag), r in vs_truth.items():
        print(f"  {m:30s} {tag} " + " / ".join(f"{x:.2e}" for x in r))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        measure()
