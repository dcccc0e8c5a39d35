"""Quickstart: a Gaussian mixture, its entropy by every estimator beside Monte Carlo, and
the compile time of the Legendre entropy as the number of components and the order grow.

Run::

    python examples/quickstart.py               # full settings
    CI=1 python examples/quickstart.py          # small settings (seconds)
    python examples/quickstart.py --out /tmp/figs

Prints two tables and writes ``quickstart.png`` to ``--out`` (default ``examples/figures``).
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_gmm import ENTROPY_METHODS, GaussianMixture, legendre_entropy, num_compositions

HERE = os.path.dirname(os.path.abspath(__file__))

#: Estimators that are certified bounds, and on which side.
BOUNDS = {
    "taylor": "lower",
    "huber_lower": "lower",
    "pairwise_bhattacharyya_lower": "lower",
    "huber_upper": "upper",
    "pairwise_kl_upper": "upper",
    "moment_matched_upper": "upper",
}


def settings(smoke_test: bool) -> dict:
    """Default settings: small with ``smoke_test`` (the ``CI`` environment variable)."""
    if smoke_test:
        return dict(num_mc=20_000, orders=(2, 4, 8), configs=[(2, 2), (4, 4), (8, 8), (16, 4)])
    return dict(
        num_mc=400_000,
        orders=(2, 4, 6, 8),
        configs=[(2, 2), (2, 8), (4, 4), (4, 8), (8, 4), (8, 8), (16, 4), (16, 6), (32, 4)],
    )


def make_mixture() -> GaussianMixture:
    """A 2-D mixture of four components: overlapping, differently shaped and weighted."""
    loc = jnp.array([[-2.0, 0.0], [1.5, 0.5], [0.0, 2.5], [3.0, -2.0]])
    cov = jnp.array(
        [
            [[1.0, 0.6], [0.6, 0.8]],
            [[0.5, 0.0], [0.0, 0.5]],
            [[0.9, -0.3], [-0.3, 0.4]],
            [[0.3, 0.1], [0.1, 0.6]],
        ]
    )
    return GaussianMixture(loc, cov, probs=jnp.array([0.4, 0.25, 0.2, 0.15]))


def monte_carlo_entropy(gm: GaussianMixture, key, num_samples: int):
    """``-mean log p(x)`` over ``x ~ gm`` (NumPyro's ``sample`` and ``log_prob``), and its
    standard error ``sd(log p) / sqrt(S)``."""
    x = gm.sample(key, (num_samples,))
    log_p = np.asarray(gm.log_prob(x), dtype=np.float64)
    return float(-log_p.mean()), float(log_p.std(ddof=1) / np.sqrt(num_samples))


def entropy_estimates(gm: GaussianMixture, orders=(2, 4, 8)) -> list[tuple[str, float]]:
    """``(label, value)`` for every deterministic estimator of ``ENTROPY_METHODS``; the
    series estimators at each order of ``orders``."""
    rows = []
    for method in ENTROPY_METHODS:
        if method == "monte_carlo":
            continue
        if method in ("legendre", "taylor"):
            for order in orders:
                rows.append((f"{method} (order {order})", float(gm.entropy(method=method, order=order))))
        elif method == "gamma":
            rows.append((f"{method} (order {max(orders)})", float(gm.entropy(method=method, order=max(orders)))))
        else:
            try:
                rows.append((method, float(gm.entropy(method=method))))
            except TypeError as err:  # an estimator that needs options this script does not know
                print(f"skipped {method!r}: {err}")
    return rows


def compile_times(configs, d: int = 2, seed: int = 0) -> list[dict]:
    """First-call cost of ``jax.jit(legendre_entropy)`` for each ``(K, order)``.

    ``compile`` is trace + lower + XLA compile (``jit(f).lower(*args).compile()``, a fresh
    function each time so nothing is cached); ``run`` is one call of the compiled function.
    ``compositions`` is the number of terms the series sums (powers ``2 .. order + 1``).
    """
    rng = np.random.default_rng(seed)
    rows = []
    for K, order in configs:
        logits = jnp.asarray(rng.normal(size=K), jnp.float32)
        locs = jnp.asarray(2.0 * rng.normal(size=(K, d)), jnp.float32)
        tril = jnp.asarray(np.eye(d) * rng.uniform(0.5, 1.5, size=(K, 1, 1)), jnp.float32)
        fn = jax.jit(functools.partial(legendre_entropy, order=order))
        t0 = time.perf_counter()
        compiled = fn.lower(logits, locs, tril).compile()
        t1 = time.perf_counter()
        compiled(logits, locs, tril).block_until_ready()
        t2 = time.perf_counter()
        terms = sum(num_compositions(n, K) for n in range(2, order + 2))
        rows.append(dict(K=K, order=order, compositions=terms, compile=t1 - t0, run=t2 - t1))
    return rows


def print_entropy_table(rows, mc, mc_se):
    print(f"\nEntropy of the 4-component 2-D mixture (nats); Monte Carlo: {mc:.4f} +- {mc_se:.4f} (1 se)")
    print(f"{'estimator':34s} {'value':>8s} {'- MC':>8s} {'(se)':>7s}  kind")
    for label, value in rows:
        kind = BOUNDS.get(label.split(" ")[0], "approximation")
        kind = kind if kind == "approximation" else f"{kind} bound"
        print(f"{label:34s} {value:8.4f} {value - mc:+8.4f} {(value - mc) / mc_se:+7.1f}  {kind}")


def print_compile_table(rows):
    print("\nFirst call of jax.jit(legendre_entropy), float32, d = 2 (seconds)")
    print(f"{'K':>3s} {'order':>5s} {'compositions':>12s} {'compile':>8s} {'run':>8s}")
    for r in rows:
        print(f"{r['K']:3d} {r['order']:5d} {r['compositions']:12,d} {r['compile']:8.2f} {r['run']:8.4f}")
    c = [r["compile"] for r in rows]
    n = [r["compositions"] for r in rows]
    print(
        f"compositions grow {max(n) / min(n):,.0f}x; compile time ranges "
        f"{min(c):.2f}-{max(c):.2f} s (ratio {max(c) / min(c):.1f}x)"
    )


def make_figure(gm, rows, mc, mc_se, timing_rows):
    """Left: the mixture's density. Middle: every estimate beside the Monte Carlo value.
    Right: compile time against the number of compositions, one colour per ``K`` and one
    marker per order."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, 3, figsize=(15, 4.8), gridspec_kw=dict(width_ratios=[1.05, 1.45, 1.2]), layout="constrained"
    )
    # density
    ax = axes[0]
    g = np.linspace(-5.5, 5.5, 200)
    xx, yy = np.meshgrid(g, g)
    pts = jnp.asarray(np.stack([xx.ravel(), yy.ravel()], -1), jnp.float32)
    dens = np.exp(np.asarray(gm.log_prob(pts))).reshape(xx.shape)
    cs = ax.contourf(xx, yy, dens, levels=20, cmap="viridis")
    ax.plot(*np.asarray(gm.loc).T, "w+", ms=10, mew=1.5, label="component means")
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    ax.set_title("density of the mixture, K = 4, d = 2")
    ax.set_aspect("equal")
    ax.legend(loc="lower left", fontsize=8, facecolor="0.3", labelcolor="w", framealpha=0.7)
    fig.colorbar(cs, ax=ax, label="p(x)", shrink=0.85, pad=0.02)
    # estimates
    ax = axes[1]
    lo = min([v for _, v in rows] + [mc])
    hi = max([v for _, v in rows] + [mc])
    span = hi - lo + 0.04
    band_visible = 4 * mc_se > 0.004 * span
    mc_label = f"Monte Carlo {mc:.4f} $\\pm$ {2 * mc_se:.4f} (2 se)"
    if band_visible:
        ax.axvspan(mc - 2 * mc_se, mc + 2 * mc_se, color="0.85", label="Monte Carlo $\\pm$ 2 se")
        ax.axvline(mc, color="0.4", lw=1, label=f"Monte Carlo {mc:.4f}")
    else:  # the band would be thinner than the line: say so in the legend
        ax.axvline(mc, color="0.4", lw=1, label=mc_label + "; band thinner than the line")
    styles = {"lower": (">", "tab:blue", "lower bound"), "upper": ("<", "tab:red", "upper bound")}
    seen = set()
    for i, (label, value) in enumerate(rows):
        kind = BOUNDS.get(label.split(" ")[0])
        marker, color, name = styles.get(kind, ("o", "k", "approximation"))
        ax.plot(value, i, marker, color=color, ms=7, ls="none", label=None if name in seen else name)
        seen.add(name)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(lo - 0.05 * span, hi + 0.05 * span)
    ax.set_xlabel("entropy (nats)")
    ax.set_title("every estimator of ENTROPY_METHODS")
    ax.grid(axis="x", color="0.92")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8, frameon=False)
    # compile time
    ax = axes[2]
    Ks = sorted({r["K"] for r in timing_rows})
    orders = sorted({r["order"] for r in timing_rows})
    colors = dict(zip(Ks, plt.cm.tab10(np.arange(len(Ks)) % 10)))
    markers = dict(zip(orders, "osD^vP*X"))
    for r in timing_rows:
        ax.semilogx(r["compositions"], r["compile"], markers[r["order"]], color=colors[r["K"]], ms=8, mec="k", mew=0.5)
    n = np.array([r["compositions"] for r in timing_rows])
    c = np.array([r["compile"] for r in timing_rows])
    handles = [plt.Line2D([], [], ls="none", marker="s", color=colors[K], mec="k", mew=0.5, label=f"K = {K}") for K in Ks]
    handles += [plt.Line2D([], [], ls="none", marker=markers[o], color="0.6", mec="k", mew=0.5, label=f"order {o}") for o in orders]
    ax.legend(handles=handles, fontsize=8, ncol=2, loc="upper left")
    ax.set_ylim(0, max(1.0, 1.5 * c.max()))
    ax.set_xlabel("compositions in the series (log scale)")
    ax.set_ylabel("trace + compile (s)")
    ax.set_title(f"compile time of jit(legendre_entropy)\ncompositions x{n.max() / n.min():,.0f}, time x{c.max() / c.min():.1f}")
    ax.grid(color="0.92")
    return fig


def main(argv=None):
    smoke_test = "CI" in os.environ
    defaults = settings(smoke_test)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-mc", type=int, default=defaults["num_mc"], help="Monte Carlo draws")
    parser.add_argument("--orders", type=int, nargs="+", default=list(defaults["orders"]))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "figures"), help="folder for the figure")
    args = parser.parse_args(argv)

    gm = make_mixture()
    mc, mc_se = monte_carlo_entropy(gm, jax.random.PRNGKey(args.seed), args.num_mc)
    rows = entropy_estimates(gm, tuple(args.orders))
    print_entropy_table(rows, mc, mc_se)
    timing_rows = compile_times(defaults["configs"])
    print_compile_table(timing_rows)

    import matplotlib

    matplotlib.use("Agg")
    fig = make_figure(gm, rows, mc, mc_se, timing_rows)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "quickstart.png")
    fig.savefig(path, dpi=90)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
