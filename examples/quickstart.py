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
    """Left: the mixture's density. Middle: every estimate beside the Monte Carlo band.
    Right: compile time against the number of compositions."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), gridspec_kw=dict(width_ratios=[1, 1.5, 1.2]))
    # density
    ax = axes[0]
    g = np.linspace(-5.5, 5.5, 200)
    xx, yy = np.meshgrid(g, g)
    pts = jnp.asarray(np.stack([xx.ravel(), yy.ravel()], -1), jnp.float32)
    dens = np.exp(np.asarray(gm.log_prob(pts))).reshape(xx.shape)
    ax.contourf(xx, yy, dens, levels=20, cmap="viridis")
    ax.plot(*np.asarray(gm.loc).T, "w+", ms=10)
    ax.set_title("GaussianMixture, K = 4, d = 2")
    ax.set_aspect("equal")
    # estimates
    ax = axes[1]
    ax.axvspan(mc - 2 * mc_se, mc + 2 * mc_se, color="0.85", label="Monte Carlo +- 2 se")
    ax.axvline(mc, color="0.4", lw=1)
    for i, (label, value) in enumerate(rows):
        kind = BOUNDS.get(label.split(" ")[0])
        marker, color = {"lower": (">", "tab:blue"), "upper": ("<", "tab:red")}.get(kind, ("o", "k"))
        ax.plot(value, i, marker, color=color, ms=7)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    lo = min(v for _, v in rows)
    hi = max(v for _, v in rows)
    ax.set_xlim(lo - 0.05 * (hi - lo) - 0.02, hi + 0.05 * (hi - lo) + 0.02)
    ax.set_xlabel("entropy (nats)")
    ax.set_title("estimates (o), lower (>) and upper (<) bounds")
    ax.legend(loc="upper left", fontsize=8)
    # compile time
    ax = axes[2]
    order = np.argsort([r["compositions"] for r in timing_rows])
    n = np.array([timing_rows[i]["compositions"] for i in order])
    c = np.array([timing_rows[i]["compile"] for i in order])
    ax.semilogx(n, c, "o-", color="tab:green")
    for j, i in enumerate(order):
        r = timing_rows[i]
        ax.annotate(f"K={r['K']}\nN={r['order']}", (r["compositions"], r["compile"]), fontsize=7,
                    ha="center", va="bottom" if j % 2 == 0 else "top",
                    xytext=(0, 6 if j % 2 == 0 else -6), textcoords="offset points")
    ax.set_ylim(0, max(1.0, 1.6 * c.max()))
    ax.set_xlabel("compositions in the series (log scale)")
    ax.set_ylabel("trace + compile (s)")
    ax.set_title(f"compositions x{n.max() / n.min():,.0f}, compile time x{c.max() / c.min():.1f}")
    fig.tight_layout()
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
