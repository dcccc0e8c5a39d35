"""The default entropy (``auto``) on hard mixtures, against independent truth.

Families (``tests/reference.py: hard_mixture``): narrow spikes (sd 1e-3) inside a wide
component, weights 1e-6..1, thin ellipses (condition number 1e4), heavy overlap, the
README's example; d = 1..1000, K = 2..128. Truth, NumPy/SciPy only: per-component tensor
Gauss-Hermite quadrature (200 nodes per axis, d = 1, 2; SciPy's ``stats.Mixture`` entropy
as a cross-check in 1-D), stratified control-variate Monte Carlo beyond and for the spike
families (2^20 draws per component in d <= 2; its standard error is given). Estimators: ``auto`` (the default) in float64 and float32, the Legendre series
(order 8, paper's ``a``; only where its cost is allowed), and the ratio ``ln a - ln max p``
(the paper's bound against the highest mode found), the quantity a per-mixture rule would use.

Writes the table between ``<!-- hard-cases:begin -->`` and ``<!-- hard-cases:end -->`` in
docs/accuracy.md (``--write``). ``python benchmarks/hard_cases.py [--write]``.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import reference as R  # noqa: E402

from doc_sections import write_section  # noqa: E402
import numpyro_gmm.entropy as E  # noqa: E402
from numpyro_gmm._kernels import modes  # noqa: E402
from numpyro_gmm._kernels.power_integrals import MAX_COMPOSITIONS, moment_cost  # noqa: E402

# (family, d, K, covariance)
CASES = [
    ("two", 1, 2, "diag"),
    ("spike", 1, 2, "diag"),
    ("spike_light", 1, 2, "diag"),
    ("weights", 1, 8, "diag"),
    ("overlap", 1, 8, "diag"),
    ("overlap", 1, 128, "diag"),
    ("spike", 2, 2, "diag"),
    ("spike", 2, 8, "full"),
    ("spike_light", 2, 2, "full"),
    ("weights", 2, 8, "full"),
    ("thin", 2, 4, "full"),
    ("overlap", 2, 16, "full"),
    ("overlap", 2, 64, "diag"),
    ("weights", 2, 128, "full"),
    ("spike", 10, 4, "full"),
    ("weights", 10, 8, "full"),
    ("thin", 10, 4, "full"),
    ("overlap", 10, 16, "full"),
    ("overlap", 10, 128, "diag"),
    ("spike", 100, 4, "diag"),
    ("weights", 100, 8, "full"),
    ("thin", 100, 4, "full"),
    ("overlap", 100, 16, "full"),
    ("overlap", 100, 64, "diag"),
    ("overlap", 100, 128, "diag"),
    ("spike", 1000, 4, "diag"),
    ("weights", 1000, 8, "diag"),
    ("overlap", 1000, 8, "diag"),
    ("overlap", 1000, 128, "diag"),
]


def truth(fam, logits, locs, tril, draws):
    """Quadrature for d <= 2 except spikes and thin ellipses (a grid in one component's
    coordinates does not resolve a narrow bump or a crossing ridge of ln p: Gauss-Hermite was
    0.011 off on crossing thin ellipses); control-variate Monte Carlo otherwise (spikes in d <= 2 with
    2^20 draws per component; ``reference.entropy_monte_carlo_chol``, which takes diagonal
    factors as their standard deviations)."""
    w = np.exp(logits - np.logaddexp.reduce(logits))
    d = locs.shape[1]
    if d <= 2 and not fam.startswith("spike") and fam != "thin":
        return R.entropy_gauss_hermite(w, locs, tril, n=200), 0.0
    if d <= 2:
        draws = 2**20
    return R.entropy_monte_carlo_chol(w, locs, tril, draws_per_component=draws, seed=1)


def args_for(logits, locs, tril, cov, dtype):
    if cov == "diag":
        sc = np.diagonal(tril, axis1=1, axis2=2)
        return (jnp.asarray(logits, dtype), jnp.asarray(locs, dtype)), {"scale": jnp.asarray(sc, dtype)}
    return (jnp.asarray(logits, dtype), jnp.asarray(locs, dtype), jnp.asarray(tril, dtype)), {}


def log_a_gap(logits, locs, tril):
    lw = jax.nn.log_softmax(jnp.asarray(logits))
    d = locs.shape[1]
    ld = np.sum(np.log(np.abs(np.diagonal(tril, axis1=1, axis2=2))), 1)
    log_a = float(jax.scipy.special.logsumexp(lw - ld - 0.5 * d * math.log(2 * math.pi)))
    return log_a - float(modes.log_max_density(lw, jnp.asarray(locs), jnp.asarray(tril), None))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--draws", type=int, default=2**13, help="Monte Carlo draws per component (d > 2)")
    ap.add_argument("--max-d", type=int, default=1000)
    ap.add_argument("--min-d", type=int, default=1)
    a = ap.parse_args(argv)
    rows, t0 = [], time.time()
    for fam, d, K, cov in CASES:
        if not a.min_d <= d <= a.max_d:
            continue
        logits, locs, tril = R.hard_mixture(fam, d, K)
        draws = a.draws if K * d <= 16000 else max(512, a.draws // 8)
        t = time.time()
        h, se = truth(fam, logits, locs, tril, draws)
        t_truth = time.time() - t
        res = {}
        for name, dt in (("f64", jnp.float64), ("f32", jnp.float32)):
            pos, kw = args_for(logits, locs, tril, cov, dt)
            res[name] = float(E.auto_entropy(*pos, **kw)) - h
        comps, _ = moment_cost(K, d, E.DEFAULT_ORDER, cov == "diag", 8)
        if d <= 3 and comps <= MAX_COMPOSITIONS:
            pos, kw = args_for(logits, locs, tril, cov, jnp.float64)
            leg = float(E.legendre_entropy(*pos, **kw)) - h
        else:
            leg = None
        gap = log_a_gap(logits, locs, tril) if d <= 100 else None
        sci = None
        if d == 1 and fam != "spike" and K <= 8:
            w = np.exp(logits - np.logaddexp.reduce(logits))
            sci = R.entropy_1d_scipy(w, locs[:, 0], tril[:, 0, 0]) - h
        rows.append((fam, d, K, cov, h, se, res["f64"], res["f32"], leg, gap, sci))
        print(f"{fam:12s} d={d:4d} K={K:3d} {cov:4s} truth {h:10.4f} se {se:.4f} auto f64 {res['f64']:+.4f} "
              f"f32 {res['f32']:+.4f} legendre {'-' if leg is None else f'{leg:+.4f}'} "
              f"gap {'-' if gap is None else f'{gap:.3f}'} (truth {t_truth:.0f} s)", flush=True)
    total = time.time() - t0
    worst = max(rows, key=lambda r: max(abs(r[6]), abs(r[7])))
    lines = [
        "## The default on hard mixtures (narrow spikes, extreme weights, thin ellipses, K up to 128, d up to 1000)",
        "",
        f"Generated by `python benchmarks/hard_cases.py --write` ({len(rows)} mixtures, {total:.0f} s on a loaded "
        "2-core machine). Families: `tests/reference.py: hard_mixture` (spike: sd 1e-3 components inside a "
        "sd 1 one, equal weights; spike_light: their total weight 1e-3; weights: 1e-6..1; thin: condition "
        "number 1e4; overlap: identity covariances, means 0.25 N(0, I)/sqrt(2); two: the README's example). "
        "Truth: per-component Gauss-Hermite quadrature (200 nodes per axis) for d <= 2 except the spike "
        "families, control-variate Monte Carlo for those (2^20 draws per component) and "
        f"beyond ({a.draws} draws per component, {max(512, a.draws // 8)} when K d > 16000; se given). "
        "Errors are estimate minus truth (nats). *legendre 8*: the series at order 8 with the paper's `a` "
        "(only d <= 3 and within its cost limit). *ln a/max p*: the paper's bound over the highest mode found. "
        "*SciPy - GH*: `scipy.stats.Mixture` entropy minus the quadrature (1-D cross-check of the truth).",
        "",
        "| family | d | K | cov | truth | se | auto f64 | auto f32 | legendre 8 (f64) | ln a/max p | SciPy - GH |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fam, d, K, cov, h, se, e64, e32, leg, gap, sci in rows:
        lines.append(
            f"| {fam} | {d} | {K} | {cov} | {h:.4f} | {se:.4f} | {e64:+.4f} | {e32:+.4f} | "
            f"{'-' if leg is None else f'{leg:+.4f}'} | {'-' if gap is None else f'{gap:.3f}'} | "
            f"{'-' if sci is None else f'{sci:+.1e}'} |"
        )
    lines += ["", f"Worst |error| of the default: {max(abs(worst[6]), abs(worst[7])):.4f} ({worst[0]}, d={worst[1]}, "
              f"K={worst[2]}, {worst[3]}; se of the truth {worst[5]:.4f}).", ""]
    text = "\n".join(lines)
    print(text)
    if a.write:
        write_section(ROOT / "docs" / "accuracy.md", "hard-cases", text)


if __name__ == "__main__":
    main()
