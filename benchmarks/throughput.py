"""Throughput of the power-integral engine against the straightforward vectorised kernel.

For ``d in {1, 2, 4, 8, 16}``, full and diagonal covariances, forward and forward +
gradient (``jax.value_and_grad`` with respect to weights, means and factors), one run
measures on the same inputs (``K = 16``, powers 2..7, i.e. order 6: 245,140 compositions):

* the engine, :func:`numpyro_gmm._kernels.power_integrals.log_moments`;
* the baseline, ``benchmarks/baseline.py``: one batched LAPACK Cholesky over all
  compositions, ``Lambda_m`` formed as composition matrix @ stacked precisions (diagonal
  covariances are passed to it as full matrices: it has no special case).

Reported: compositions per second, the speed-up, gradient time / forward time, and the
achieved GFLOP/s counted with the floating-point work each kernel does per composition
(:func:`flops_per_composition`), beside the machine's measured float32 matrix-multiply
rate (the arithmetic floor). Times are the minimum of ``--repeats`` steady-state calls in
each of ``--rounds`` rounds that alternate the engine and the baseline.

Then entropy against Monte Carlo on a 2-D, 4-component mixture: the Legendre estimate's
error against dense quadrature, its time, and the time Monte Carlo (``-mean ln p(x_s)``)
needs for a root-mean-square error equal to that error (``S = (sd ln p / error)^2``
samples).

Usage::

    python benchmarks/throughput.py
    python benchmarks/throughput.py --dims 1 2 4 --repeats 5
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baseline import all_compositions, log_moments_baseline  # noqa: E402
from timing import timed  # noqa: E402

from numpyro_gmm._kernels.power_integrals import log_moments  # noqa: E402


def flops_per_composition(kind: str, d: int, K: int) -> float:
    """Floating-point operations one composition costs (transcendental = 1 flop).

    Factorisation ``d^3/3 + d^2/2 + d/6``, triangular solve ``d^2``, log-determinant
    ``d``, quadratic form ``2d``, and about 8 for the log-term and the log-sum-exp.
    Forming ``Lambda_m, eta_m`` and the scalar sums: the engine adds two half rows
    (``2 + d + d(d+1)/2`` adds); the baseline multiplies the composition by the stacked
    precisions (``2 K d^2 + 2 K d + 3 K``). Diagonal engine: ``2 + 2d`` adds, ``d`` logs,
    ``3d`` for the quadratic form, no factorisation.
    """
    factor = d**3 / 3 + d**2 / 2 + d / 6 + d**2 + d + 2 * d + 8
    if kind == "engine_full":
        return (2 + d + d * (d + 1) / 2) + factor
    if kind == "engine_diag":
        return (2 + 2 * d) + d + 3 * d + 8
    if kind == "baseline":
        return 2 * K * d * d + 2 * K * d + 3 * K + factor
    raise ValueError(kind)


def matmul_gflops(n=1024, repeats=5):
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    return 2 * n**3 / timed(f, a, repeats=repeats) / 1e9


def scalar(moments):
    log_a, lm = moments
    return log_a + jnp.sum(jnp.exp(lm))


def throughput_table(dims, K, k_max, repeats, rounds=3):
    comps, totals = all_compositions(k_max, K)
    N = len(comps)
    rng = np.random.default_rng(0)
    rows = []
    for d in dims:
        log_w = jax.nn.log_softmax(jnp.asarray(rng.normal(size=K), jnp.float32))
        locs = jnp.asarray(2.0 * rng.normal(size=(K, d)), jnp.float32)
        tril = jnp.asarray(np.tril(rng.normal(size=(K, d, d)), -1) * 0.3 / math.sqrt(d) + np.eye(d), jnp.float32)
        scale = jnp.asarray(rng.uniform(0.5, 1.5, (K, d)), jnp.float32)
        for cov in ("full", "diag"):
            factor = tril if cov == "full" else scale
            factor_b = tril if cov == "full" else jax.vmap(jnp.diag)(scale)
            eng = (lambda lw, m, f: log_moments(lw, m, f, k_max=k_max)) if cov == "full" else (
                lambda lw, m, f: log_moments(lw, m, None, f, k_max=k_max)
            )
            base = lambda lw, m, f: log_moments_baseline(lw, m, f, comps, totals, k_max=k_max)  # noqa: E731
            res, calls = {}, {}
            for name, fn, arg in (("engine", eng, factor), ("baseline", base, factor_b)):
                fwd = jax.jit(lambda lw, m, f, fn=fn: scalar(fn(lw, m, f)))
                grad = jax.jit(jax.value_and_grad(lambda lw, m, f, fn=fn: scalar(fn(lw, m, f)), argnums=(0, 1, 2)))
                calls[name] = (fwd, grad, arg)
                res[name] = (math.inf, math.inf)
                res[name + "_value"] = float(fwd(log_w, locs, arg))
            # Rounds alternate engine and baseline, the best of all rounds is kept: a slow
            # spell of the machine then hits both kernels instead of one row.
            for _ in range(rounds):
                for name, (fwd, grad, arg) in calls.items():
                    t = (timed(fwd, log_w, locs, arg, repeats=repeats), timed(grad, log_w, locs, arg, repeats=repeats))
                    res[name] = tuple(map(min, res[name], t))
            fl_e = flops_per_composition("engine_" + cov, d, K)
            fl_b = flops_per_composition("baseline", d, K)
            (ef, eg), (bf, bg) = res["engine"], res["baseline"]
            rows.append(
                dict(
                    d=d,
                    cov=cov,
                    N=N,
                    eng_fwd=ef,
                    eng_grad=eg,
                    base_fwd=bf,
                    base_grad=bg,
                    eng_gflops=N * fl_e / ef / 1e9,
                    base_gflops=N * fl_b / bf / 1e9,
                    fl_e=fl_e,
                    fl_b=fl_b,
                    rel_diff=abs(res["engine_value"] - res["baseline_value"]) / abs(res["baseline_value"]),
                )
            )
            r = rows[-1]
            print(
                f"| {d} | {cov} | {N / ef:.3g} | {N / bf:.3g} | **{bf / ef:.1f}x** | {N / eg:.3g} | {N / bg:.3g} "
                f"| {bg / eg:.1f}x | {eg / ef:.2f} | {fl_e:.0f} / {fl_b:.0f} | {r['eng_gflops']:.2f} / {r['base_gflops']:.2f} "
                f"| {r['rel_diff']:.1e} |",
                flush=True,
            )
    return rows


def mixture_2d(K=4, seed=3):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=K)
    locs = 1.5 * rng.normal(size=(K, 2))
    A = rng.normal(size=(K, 2, 2)) * 0.4
    covs = A @ np.swapaxes(A, -1, -2) + np.eye(2) * rng.uniform(0.3, 1.0, size=(K, 1, 1))
    return logits, locs, covs


def quadrature_entropy_2d(logits, locs, covs, n=1201, half_width=12.0):
    """``-integral p ln p`` on a dense grid (float64, NumPy): the reference value."""
    from scipy.special import logsumexp as lse
    from scipy.stats import multivariate_normal

    w = np.exp(logits - lse(logits))
    xs = np.linspace(-half_width, half_width, n)
    X, Y = np.meshgrid(xs, xs, indexing="ij")
    pts = np.stack([X.ravel(), Y.ravel()], -1)
    logp = lse(np.stack([np.log(w[i]) + multivariate_normal(locs[i], covs[i]).logpdf(pts) for i in range(len(w))]), axis=0)
    dx = xs[1] - xs[0]
    return float(-np.sum(np.exp(logp) * logp) * dx * dx)


def entropy_vs_monte_carlo(repeats):
    import warnings

    from numpyro_gmm import legendre_entropy

    logits, locs, covs = mixture_2d()
    exact = quadrature_entropy_2d(logits, locs, covs)
    tril = np.linalg.cholesky(covs)
    args = [jnp.asarray(x, jnp.float32) for x in (logits, locs, tril)]
    lw = jax.nn.log_softmax(args[0])

    def log_p(x):
        diff = x[:, None, :] - args[1][None]  # (S, K, d)
        z = jax.scipy.linalg.solve_triangular(args[2][None], diff[..., None], lower=True)[..., 0]
        logdet = jnp.sum(jnp.log(jnp.diagonal(args[2], axis1=-2, axis2=-1)), -1)
        comp = -0.5 * jnp.sum(z * z, -1) - logdet - jnp.log(2 * jnp.pi)
        return jax.nn.logsumexp(lw + comp, axis=-1)

    def mc(key, S):
        k1, k2 = jax.random.split(key)
        idx = jax.random.categorical(k1, lw, shape=(S,))
        eps = jax.random.normal(k2, (S, 2))
        x = args[1][idx] + jnp.einsum("sij,sj->si", args[2][idx], eps)
        return -jnp.mean(log_p(x)), jnp.std(log_p(x))

    _, sd = jax.jit(mc, static_argnums=1)(jax.random.key(1), 200_000)
    sd = float(sd)
    print("| order | Legendre error (nats) | Legendre time | Monte Carlo samples for that RMSE | Monte Carlo time | MC / Legendre |")
    print("|---|---|---|---|---|---|")
    for order in (4, 6, 8):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = jax.jit(lambda a, b, c, order=order: legendre_entropy(a, b, c, order=order))
            err = abs(float(f(*args)) - exact)
            t_leg = timed(f, *args, repeats=repeats)
        S = int(math.ceil((sd / max(err, 1e-6)) ** 2))
        g = jax.jit(lambda key, S=S: mc(key, S)[0])
        t_mc = timed(g, jax.random.key(2), repeats=repeats)
        print(f"| {order} | {err:.4f} | {t_leg * 1e3:.2f} ms | {S:,} | {t_mc * 1e3:.2f} ms | {t_mc / t_leg:.1f}x |", flush=True)
    print(f"\n(2-D, K=4; reference: dense quadrature {exact:.5f} nats; sd of ln p = {sd:.3f}; float32)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--K", type=int, default=16)
    p.add_argument("--order", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="alternating engine/baseline rounds per row")
    p.add_argument("--skip-mc", action="store_true")
    a = p.parse_args()
    print(f"devices: {jax.devices()}; float32; K={a.K}, order={a.order}")
    rate = matmul_gflops()
    print(f"measured float32 matmul (1024 x 1024): {rate:.1f} GFLOP/s\n")
    print(
        "| d | cov | engine comps/s (fwd) | baseline comps/s (fwd) | speed-up fwd | engine comps/s (fwd+grad) "
        "| baseline comps/s (fwd+grad) | speed-up grad | engine grad/fwd | flops/comp engine / baseline "
        "| GFLOP/s engine / baseline | rel. diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    throughput_table(a.dims, a.K, a.order, a.repeats, a.rounds)
    print(f"\n(matmul floor: {rate:.1f} GFLOP/s)")
    if not a.skip_mc:
        print()
        entropy_vs_monte_carlo(a.repeats)
    try:
        load = os.getloadavg()
        print(f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")
    except OSError:
        pass


if __name__ == "__main__":
    main()
