"""Accuracy map of every entropy estimator against ground truth, with the time per call.

Ground truth (float64, independent of numpyro_gmm):
  * one component, any d: the closed form 1/2 ln|2 pi e Sigma|;
  * d = 1: ``scipy.stats.Mixture(...).entropy()``;
  * d = 2: a dense 801 x 801 trapezoid grid over +-9 sd (``tests/reference.py``);
  * d >= 3: a long stratified Monte Carlo run in NumPy with the components' log-densities as
    control variates (``reference.entropy_monte_carlo_chol``, ``2^14`` draws per component
    by default); its standard error is reported next to every row and the worst error is
    quoted with it.

Every moment estimator of order N is a function of ``(ln a, ln E[u^k], k = 1..N)`` only, so
the moments are computed once per mixture and dtype at the largest order (with
``log_moments``) and every order is evaluated from their prefix: the same numbers the
public functions return at that order (checked for the default order by the tests).
Combinations whose composition count ``C(N + K, K - 1)`` at the largest power exceeds
``--max-compositions`` are skipped and listed.

Run:  python benchmarks/accuracy.py            (full map, a few minutes on 2 cores)
      python benchmarks/accuracy.py --quick    (d in {1, 2, 5}, K in {1, 2, 4}, fewer orders)
Writes docs/accuracy.md (``--out`` to change) and prints the same tables.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from functools import partial

os.environ.setdefault("JAX_ENABLE_X64", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import logsumexp  # noqa: E402

jax.config.update("jax_enable_x64", True)
# This script measures the Legendre series where it is known to be poor, on purpose.
warnings.filterwarnings("ignore", message="legendre_entropy in d=")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import reference  # noqa: E402
from doc_sections import write_section  # noqa: E402
from timing import timed  # noqa: E402

import numpyro_gmm.entropy as E  # noqa: E402
from numpyro_gmm._kernels import bounds as B  # noqa: E402
from numpyro_gmm._kernels.frontier import (  # noqa: E402
    gamma_entropy_from_moments,
    normalized_legendre_entropy_from_moments,
)
from numpyro_gmm._kernels.legendre import legendre_entropy_from_moments  # noqa: E402
from numpyro_gmm._kernels.modes import log_max_density  # noqa: E402
from numpyro_gmm._kernels.power_integrals import log_moments  # noqa: E402
from numpyro_gmm._kernels.taylor import taylor_entropy_from_moments  # noqa: E402
from numpyro_gmm.compositions import num_compositions  # noqa: E402

LOG_2PI = math.log(2 * math.pi)


# ----------------------------------------------------------------------------- mixtures
make_mixture = reference.random_mixture  # the accuracy map's family


def truth(logits, locs, tril, mc_per_comp, seed):
    """(H, standard error, source) in float64, independent of the package."""
    K, d = locs.shape
    w = np.exp(logits - logsumexp(logits))
    covs = tril @ np.swapaxes(tril, -1, -2)
    logdet = 2 * np.sum(np.log(np.abs(np.diagonal(tril, axis1=-2, axis2=-1))), -1)
    h_comp = 0.5 * d * (LOG_2PI + 1) + 0.5 * logdet
    if K == 1:
        return float(h_comp[0]), 0.0, "closed form"
    if d == 1:
        return reference.entropy_1d_scipy(w, locs[:, 0], tril[:, 0, 0]), 0.0, "scipy"
    if d == 2:
        return reference.entropy_2d_quadrature(w, locs, covs), 0.0, "quadrature"
    est, se = reference.entropy_monte_carlo_chol(w, locs, tril, mc_per_comp, seed)
    return est, se, "Monte Carlo"


# ----------------------------------------------------------------------------- estimates
MOMENT_METHODS = ["legendre", "legendre_mode", "legendre_normalized", "taylor", "gamma_paper", "gamma"]
CLOSED = {
    "huber_lower": B.huber_lower,
    "pairwise_bhattacharyya_lower": B.pairwise_bhattacharyya_lower,
    "huber_upper": B.huber_upper,
    "pairwise_kl_upper": B.pairwise_kl_upper,
    "moment_matched_upper": B.moment_matched_upper,
}
LOWER = ["huber_lower", "pairwise_bhattacharyya_lower", "taylor"]
UPPER = ["huber_upper", "pairwise_kl_upper", "moment_matched_upper"]


@jax.jit
def _closed_all(log_w, locs, tril):
    return {k: f(log_w, locs, tril, None) for k, f in CLOSED.items()}


_moments = jax.jit(lambda lw, m, t, k_max: log_moments(lw, m, t, None, k_max=k_max), static_argnums=3)
_mode = jax.jit(lambda lw, m, t: log_max_density(lw, m, t, None))


QMC_POINTS = [256, 1024, 4096]


@partial(jax.jit, static_argnums=3)
def _mixing(lw, m, t, num_points):
    return E.mixing_qmc_entropy(lw, m, t, num_points=num_points)


@jax.jit
def _mc(lw, m, t):
    return E.monte_carlo_entropy(lw, m, t, key=jax.random.PRNGKey(0), num_samples=4096)


@partial(jax.jit, static_argnums=3)
def _from_moments(la, lm, lmode, dim):
    orders = [n for n in ORDERS if n <= lm.shape[0]]
    out = {}
    k = jnp.arange(1, lm.shape[0] + 1, dtype=lm.dtype)
    lm_mode = lm - k * (lmode - la)
    for n in orders:
        out[("legendre", n)] = legendre_entropy_from_moments(lm[:n], la, n)
        out[("legendre_mode", n)] = legendre_entropy_from_moments(lm_mode[:n], lmode, n)
        out[("legendre_normalized", n)] = normalized_legendre_entropy_from_moments(lm, la, n, dim)
        out[("taylor", n)] = taylor_entropy_from_moments(lm, la, n)
        out[("gamma_paper", n)] = gamma_entropy_from_moments(lm, la, n)
        out[("gamma", n)] = gamma_entropy_from_moments(lm_mode, lmode, n)
    return out


def estimates(logits, locs, tril, dtype, orders):
    lw = jax.nn.log_softmax(jnp.asarray(logits, dtype))
    m, t = jnp.asarray(locs, dtype), jnp.asarray(tril, dtype)
    la, lm = _moments(lw, m, t, max(orders))
    lmode = _mode(lw, m, t)
    out = {key: float(v) for key, v in _from_moments(la, lm, lmode, m.shape[1]).items()}
    out.update({(k, None): float(v) for k, v in _closed_all(lw, m, t).items()})
    for M in QMC_POINTS:
        out[("mixing_qmc", M)] = float(_mixing(lw, m, t, M))
    # the default: Legendre at the default order for d <= LEGENDRE_DEFAULT_MAX_DIM (0: never), the mixing rule
    out[("auto", None)] = (out[("legendre", E.DEFAULT_ORDER)] if m.shape[1] <= E.LEGENDRE_DEFAULT_MAX_DIM
                           else out[("mixing_qmc", E.DEFAULT_NUM_POINTS)])
    h, se = _mc(lw, m, t)
    out[("monte_carlo", None)] = float(h)
    out[("monte_carlo_se", None)] = float(se)
    out[("log_a_gap", None)] = float(la - lmode)
    return out


ORDERS: list = []


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dims", type=int, nargs="*", default=None)
    ap.add_argument("--ks", type=int, nargs="*", default=None)
    ap.add_argument("--seps", type=float, nargs="*", default=[0.5, 1.5, 4.0])
    ap.add_argument("--orders", type=int, nargs="*", default=None)
    ap.add_argument("--mc-per-comp", type=int, default=2**14)
    ap.add_argument("--max-compositions", type=int, default=2_000_000)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--timing-dims", type=int, nargs="*", default=[2, 10, 20])
    ap.add_argument("--timing-ks", type=int, nargs="*", default=[2, 8])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs", "accuracy.md"))
    args = ap.parse_args()
    dims = args.dims or ([1, 2, 5] if args.quick else [1, 2, 3, 4, 5, 10, 20])
    ks = args.ks or ([1, 2, 4] if args.quick else [1, 2, 4, 8])
    orders = args.orders or ([2, 4, 8] if args.quick else [2, 4, 6, 8, 10, 12])
    default_order = E.DEFAULT_ORDER
    if default_order not in orders:
        orders = sorted(orders + [default_order])
    ORDERS[:] = orders
    t_start = time.perf_counter()

    rows, skipped = [], []
    for d in dims:
        for K in ks:
            if num_compositions(max(orders) + 1, K) > args.max_compositions:
                skipped.append((d, K, max(orders), num_compositions(max(orders) + 1, K)))
                continue
            for sep in [0.0] if K == 1 else args.seps:
                seed = 1000 * d + 10 * K + int(10 * sep)
                logits, locs, tril = make_mixture(d, K, sep, seed)
                h, se, src = truth(logits, locs, tril, args.mc_per_comp, seed + 1)
                row = dict(d=d, K=K, sep=sep, truth=h, se=se, src=src)
                for dt in ("float64", "float32"):
                    row[dt] = estimates(logits, locs, tril, getattr(jnp, dt), orders)
                rows.append(row)
                print(f"d={d:2d} K={K} sep={sep:3.1f} H={h:9.4f} (se {se:.4f}, {src})  "
                      f"auto {row['float64'][('auto', None)] - h:+.4f} / {row['float32'][('auto', None)] - h:+.4f}  "
                      f"legendre{default_order} {row['float64'][('legendre', default_order)] - h:+.4f}", flush=True)
            # Drop the compiled programs of this shape: kept for all (d, K), they exhausted the
            # process's memory maps at d = 20 (LLVM "Cannot allocate memory", 2-core CPU).
            jax.clear_caches()
    t_acc = time.perf_counter() - t_start

    timing = []
    if not args.no_timing:
        for d in [x for x in dims if x in args.timing_dims]:
            for K in [x for x in ks if x in args.timing_ks]:
                if num_compositions(default_order + 1, K) > args.max_compositions:
                    continue
                logits, locs, tril = make_mixture(d, K, 1.5, 7)
                a = [jnp.asarray(x, jnp.float32) for x in (logits, locs, tril)]
                fns = {
                    "auto": jax.jit(lambda lg, m, t: E.auto_entropy(lg, m, t)),
                    "mixing_qmc": jax.jit(lambda lg, m, t: E.mixing_qmc_entropy(lg, m, t)),
                    "legendre": jax.jit(lambda lg, m, t: E.legendre_entropy(lg, m, t)),
                    "legendre_normalized": jax.jit(lambda lg, m, t: E.normalized_legendre_entropy(lg, m, t)),
                    "gamma": jax.jit(lambda lg, m, t: E.gamma_entropy(lg, m, t)),
                    "entropy_bounds": jax.jit(lambda lg, m, t: E.entropy_bounds(lg, m, t)),
                    "pairwise_kl_upper": jax.jit(lambda lg, m, t: E.pairwise_kl_upper_bound(lg, m, t)),
                    "monte_carlo(4096)": jax.jit(
                        lambda lg, m, t: E.monte_carlo_entropy(lg, m, t, key=jax.random.PRNGKey(0), num_samples=4096)
                    ),
                }
                timing.append((d, K, {k: timed(f, *a, repeats=20) for k, f in fns.items()}))
    figure = os.path.join(os.path.dirname(os.path.abspath(args.out)), "images", "accuracy.png")
    plot(rows, dims, default_order, figure)
    md = render(rows, skipped, timing, orders, default_order, dims, args, t_acc)
    md = md.replace("\n## Worst |error| per method", "\n![Worst error per dimension](images/accuracy.png)\n\n"
                    "## Worst |error| per method", 1)
    write_section(args.out, "accuracy", md)
    print(md)
    print(f"wrote {os.path.relpath(args.out)} in {time.perf_counter() - t_start:.0f} s")


PLOTTED = [("auto", None, "auto (default)", "k", "-"),
           ("legendre", "N", "legendre", "C0", "--"),
           ("mixing_qmc", "M", "mixing_qmc", "C2", "-."),
           ("legendre_normalized", "N", "legendre_normalized", "C1", ":"),
           ("gamma", "N", "gamma", "C3", ":")]


def plot(rows, dims, N, path):
    """Worst |error| per dimension of the default and the approximations, float64 and
    float32, on a log scale with the 0.05-nat goal; saved to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, dt in zip(axes, ("float64", "float32")):
        for m, n, label, color, ls in PLOTTED:
            order = {"N": N, "M": E.DEFAULT_NUM_POINTS}.get(n, n)
            worst = [max(abs(err(r, dt, m, order)) for r in rows if r["d"] == d) for d in dims]
            ax.plot(dims, np.maximum(worst, 1e-5), ls, color=color, marker="o", label=label)
        se = [max(r["se"] for r in rows if r["d"] == d) for d in dims]
        ax.plot(dims, np.maximum(se, 1e-5), color="0.6", lw=1, label="largest se of the truth")
        ax.axhline(0.05, color="r", lw=0.8, ls="--", label="0.05 nats")
        ax.set(xscale="log", yscale="log", xlabel="dimension d", title=f"{dt} (order {N})", xticks=dims)
        ax.set_xticklabels([str(d) for d in dims])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes[0].set_ylabel("worst |error| over the mixtures (nats)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def err(row, dt, method, order):
    return row[dt][(method, order)] - row["truth"]


def render(rows, skipped, timing, orders, N, dims, args, t_acc):
    L = []
    methods_n = MOMENT_METHODS
    names = {
        "legendre": "legendre (paper a)",
        "legendre_mode": "legendre, a=\"mode\"",
        "legendre_normalized": "legendre_normalized",
        "taylor": "taylor (lower bound)",
        "gamma_paper": "gamma, a=\"paper\"",
        "gamma": "gamma (a=\"mode\")",
    }
    L.append("# Accuracy of the entropy estimators\n")
    L.append("Generated by `python benchmarks/accuracy.py` "
             f"({'--quick, ' if args.quick else ''}{len(rows)} mixtures, "
             f"Monte Carlo truth with {args.mc_per_comp} draws per component; accuracy part {t_acc:.0f} s). "
             "Errors are estimate minus truth, in nats. Truth: closed form for K=1, SciPy in 1-D, "
             "dense quadrature in 2-D, long control-variate Monte Carlo beyond (its standard error `se` "
             "is given; an error smaller than about 3 se is not resolved).\n")
    L.append("Mixtures: weights softmax(N(0, 0.25)), full covariances with diagonal Cholesky entries in "
             "[0.6, 1.4] and small correlations, means `sep * N(0, I) / sqrt(2)` for sep in "
             f"{args.seps}.\n")
    # headline: default
    L.append("## The default (`auto`) and its parts, worst error per dimension\n")
    rule = (f"`legendre` (order {N}) for d <= {E.LEGENDRE_DEFAULT_MAX_DIM} and `mixing_qmc` "
            f"({E.DEFAULT_NUM_POINTS} points per component) beyond" if E.LEGENDRE_DEFAULT_MAX_DIM > 0
            else f"`mixing_qmc` ({E.DEFAULT_NUM_POINTS} points per component) in every dimension")
    L.append(f"`auto` is {rule}. Each cell: the error of largest "
             "magnitude over the mixtures of that dimension, and which mixture it is.\n")
    heads = [("auto", None, "auto (default)"), ("legendre", N, f"legendre {N}"),
             ("mixing_qmc", E.DEFAULT_NUM_POINTS, f"mixing_qmc {E.DEFAULT_NUM_POINTS}"),
             ("legendre_normalized", N, f"legendre_normalized {N}")]
    L.append("| d | " + " | ".join(f"{h} {dt}" for _, _, h in heads for dt in ("f64", "f32"))
             + " | worst MC se of truth |")
    L.append("|---|" + "---|" * (2 * len(heads) + 1))
    for d in dims:
        rs = [r for r in rows if r["d"] == d]
        if not rs:
            continue
        cells = []
        for m, n, _ in heads:
            for dt in ("float64", "float32"):
                e = [err(r, dt, m, n) for r in rs]
                i = int(np.argmax(np.abs(e)))
                cells.append(f"{e[i]:+.3f} (K={rs[i]['K']}, sep={rs[i]['sep']})")
        L.append(f"| {d} | " + " | ".join(cells) + f" | {max(r['se'] for r in rs):.4f} |")
    L.append("")
    # worst error per method, per d, per order (float64 and float32)
    for dt in ("float64", "float32"):
        L.append(f"## Worst |error| per method, dimension and order ({dt})\n")
        L.append("| method | order | " + " | ".join(f"d={d}" for d in dims) + " |")
        L.append("|---|---|" + "---|" * len(dims))
        for m in methods_n:
            for n in orders:
                cells = []
                for d in dims:
                    rs = [r for r in rows if r["d"] == d]
                    if not rs:
                        cells.append("-")
                        continue
                    e = [err(r, dt, m, n) for r in rs]
                    cells.append(f"{e[int(np.argmax(np.abs(e)))]:+.3f}")
                L.append(f"| {names[m]} | {n} | " + " | ".join(cells) + " |")
        for M in QMC_POINTS:
            cells = []
            for d in dims:
                rs = [r for r in rows if r["d"] == d]
                e = [err(r, dt, "mixing_qmc", M) for r in rs] if rs else [np.nan]
                cells.append(f"{e[int(np.argmax(np.abs(e)))]:+.3f}")
            L.append(f"| mixing_qmc ({M} points) | - | " + " | ".join(cells) + " |")
        for m in list(CLOSED) + ["monte_carlo"]:
            cells = []
            for d in dims:
                rs = [r for r in rows if r["d"] == d]
                e = [err(r, dt, m, None) for r in rs] if rs else [np.nan]
                cells.append(f"{e[int(np.argmax(np.abs(e)))]:+.3f}")
            label = m if m != "monte_carlo" else "monte_carlo (4096 draws)"
            L.append(f"| {label} | - | " + " | ".join(cells) + " |")
        L.append("")
    # bound checks
    L.append("## Certified bounds: on their side of the truth?\n")
    L.append("A violation is counted when a lower bound exceeds the truth (or an upper bound falls "
             "below it) by more than 3 se of the truth plus 1e-9 (float64) / 1e-4 (float32).\n")
    L.append("| bound | float64 violations | float32 violations | cases |")
    L.append("|---|---|---|---|")
    for dt, tol in (("float64", 1e-9), ("float32", 1e-4)):
        pass
    for b in LOWER + UPPER:
        counts = []
        for dt, tol in (("float64", 1e-9), ("float32", 1e-4)):
            c = 0
            for r in rows:
                for n in (orders if b == "taylor" else [None]):
                    e = err(r, dt, b, n)
                    slack = 3 * r["se"] + tol
                    c += (e > slack) if b in LOWER else (e < -slack)
            counts.append(c)
        nc = len(rows) * (len(orders) if b == "taylor" else 1)
        L.append(f"| {b}{' (all orders)' if b == 'taylor' else ''} | {counts[0]} | {counts[1]} | {nc} |")
    L.append("")
    # bracket width
    L.append(f"## `entropy_bounds` (order {N}): width of the certified bracket, float64\n")
    L.append("| d | median width | max width | brackets the truth (within 3 se) |")
    L.append("|---|---|---|---|")
    for d in dims:
        rs = [r for r in rows if r["d"] == d]
        if not rs:
            continue
        lo = [max(r["float64"][(b, N if b == "taylor" else None)] for b in LOWER) for r in rs]
        hi = [min(r["float64"][(b, None)] for b in UPPER) for r in rs]
        ok = sum(lo_ <= r["truth"] + 3 * r["se"] + 1e-9 and hi_ >= r["truth"] - 3 * r["se"] - 1e-9
                 for lo_, hi_, r in zip(lo, hi, rs))
        wdt = np.subtract(hi, lo)
        L.append(f"| {d} | {np.median(wdt):.3f} | {wdt.max():.3f} | {ok}/{len(rs)} |")
    L.append("")
    # all rows at default order
    L.append(f"## Every mixture, float64, order {N}\n")
    hdr = ["d", "K", "sep", "truth", "se", "ln a - ln a_mode", "auto"] + [names[m] for m in methods_n] + [
        f"mixing_qmc {E.DEFAULT_NUM_POINTS}", "bhatt. lower", "KL upper", "MC(4096)"]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))
    for r in rows:
        f = r["float64"]
        cells = [str(r["d"]), str(r["K"]), str(r["sep"]), f"{r['truth']:.4f}", f"{r['se']:.4f}",
                 f"{f[('log_a_gap', None)]:.3f}", f"{err(r, 'float64', 'auto', None):+.4f}"]
        cells += [f"{err(r, 'float64', m, N):+.4f}" for m in methods_n]
        cells += [f"{err(r, 'float64', 'mixing_qmc', E.DEFAULT_NUM_POINTS):+.4f}"]
        cells += [f"{err(r, 'float64', m, None):+.4f}" for m in
                  ("pairwise_bhattacharyya_lower", "pairwise_kl_upper", "monte_carlo")]
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    if skipped:
        L.append("Skipped (composition count above --max-compositions): " + ", ".join(
            f"d={d} K={K} order {n} ({c} compositions)" for d, K, n, c in skipped) + "\n")
    if timing:
        L.append(f"## Time per call (float32, jit, order {N}, best of 20, ms) on this machine\n")
        keys = list(timing[0][2])
        L.append("| d | K | " + " | ".join(keys) + " | gamma / legendre |")
        L.append("|---|---|" + "---|" * (len(keys) + 1))
        for d, K, t in timing:
            L.append(f"| {d} | {K} | " + " | ".join(f"{1e3 * t[k]:.2f}" for k in keys)
                     + f" | {t['gamma'] / t['legendre']:.2f} |")
        L.append("")
    return "\n".join(L)


if __name__ == "__main__":
    main()
