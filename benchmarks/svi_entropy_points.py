"""How many entropy points per component TraceEntropy_ELBO needs: cost, noise, convergence.

Inside ``TraceEntropy_ELBO`` the mixture's entropy is the randomised mixing rule (a fresh
Cranley-Patterson shift of ``M`` Sobol' points every step), unbiased at any ``M``; the model
term already uses one draw per component. This script measures what ``M``
(``TraceEntropy_ELBO(num_entropy_points=M)``) costs and what it changes.

``--part cost``: for d in ``--dims``, covariance in {full (d <= 100), diag, lowrank (rank 4)}
and M in ``--points``: one ``jax.jit(svi.update)`` step of ``AutoGaussianMixture(K=4)`` +
``TraceEntropy_ELBO`` on ``z ~ N(0, I_d)``, ``y ~ N(z, 1)`` (median wall ms over ``--steps``
steps after compilation, and CPU ms per step from ``time.process_time``), and the value and
gradient of the entropy alone as the ELBO calls it (``GaussianMixture.entropy(key=..,
num_points=M)``, same parameters, a new key per call; its share of the step in CPU time).
Baselines measured in the same run: ``AutoLowRankMultivariateNormal(rank 4)``,
``AutoMultivariateNormal`` and ``AutoDiagonalNormal`` + ``Trace_ELBO``.

``--part noise``: gradient noise over ``--keys`` random keys. (a) The entropy alone, for a
mixture with moderate overlap (K = 4, component means about 2 standard deviations apart,
the regime where the mixing term varies most): relative noise ``sqrt(E|g - gbar|^2) / |gbar|``
of the gradient in all parameters (``gbar``: the mean at M = 1024) and the standard deviation of
the value, for three point sets shared by all components (common random numbers): ``rqmc``
(the package's rule: shifted scrambled Sobol'), ``mc`` (i.i.d. normal points) and
``rqmc-anti`` (M / 2 shifted Sobol' points and their negatives, antithetic; these two only
at d in ``--variant-dims``). (b) The whole
``TraceEntropy_ELBO`` loss gradient on the Gaussian model at the guide's initial parameters,
per M: the same relative noise, and its variance over that at M = 1024.

``--part converge``: final KL(q || p) = ln p(y) - ELBO after ``--train-steps`` Adam steps
(lr 0.01) for several M and ``--seeds`` seeds, on (1) the Gaussian model above at d = 10
(``ln p(y)`` in closed form: ``y_i ~ N(0, 2)``), ``AutoGaussianMixture(K=4, diag)``; (2) the
bimodal ``a ~ N(0, 3)``, ``y ~ N(a^2, 0.5)``, ``y = 4`` observed, ``K = 2`` (``ln p(y)``
by ``scipy.integrate.quad``). The final ELBO is estimated with 4096 particles and the
deterministic 1024-point entropy.

``python benchmarks/svi_entropy_points.py [--part cost|noise|converge|all] [--dims 10,100,1000]``
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO  # noqa: E402
from numpyro.infer.autoguide import (  # noqa: E402
    AutoDiagonalNormal,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
)

from numpyro_gmm import AutoGaussianMixture, GaussianMixture, TraceEntropy_ELBO  # noqa: E402
from numpyro_gmm._kernels import lowrank as _lowrank  # noqa: E402
from numpyro_gmm._kernels import mixing as _mixing  # noqa: E402


def gaussian_model(d):
    def model(y):
        z = numpyro.sample("z", dist.Normal(jnp.zeros(d, y.dtype), 1.0).to_event(1))
        numpyro.sample("y", dist.Normal(z, 1.0).to_event(1), obs=y)

    return model


def bimodal_model(y):
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    numpyro.sample("y", dist.Normal(a**2, 0.5), obs=y)


def time_steps(update, state, args, steps):
    """(first call s, median wall ms, CPU ms per step) of a jitted update."""
    t = time.perf_counter()
    state, _ = jax.block_until_ready(update(state, *args))
    first = time.perf_counter() - t
    walls = []
    c0 = time.process_time()
    for _ in range(steps):
        t = time.perf_counter()
        state, _ = jax.block_until_ready(update(state, *args))
        walls.append(time.perf_counter() - t)
    cpu = (time.process_time() - c0) / steps
    return first, 1e3 * float(np.median(walls)), 1e3 * cpu, state


def entropy_fn(cov, M):
    def f(lg, m, fac, k):
        if cov == "lowrank":
            g = GaussianMixture(m, cov_factor=fac[0], cov_diag=fac[1], logits=lg)
        elif cov == "diag":
            g = GaussianMixture(m, scale=fac, logits=lg)
        else:
            g = GaussianMixture(m, scale_tril=fac, logits=lg)
        return g.entropy(key=k, num_points=M)

    return f


def part_cost(a, dtype):
    rows = []
    for d in map(int, a.dims.split(",")):
        model = gaussian_model(d)
        y = jnp.asarray(np.random.default_rng(0).normal(size=d), dtype)
        base = [("AutoLowRankMultivariateNormal(rank 4)", AutoLowRankMultivariateNormal(model, rank=4)),
                ("AutoDiagonalNormal", AutoDiagonalNormal(model))]
        if d <= 1000:
            base.append(("AutoMultivariateNormal", AutoMultivariateNormal(model)))
        for name, guide in base:
            svi = SVI(model, guide, numpyro.optim.Adam(1e-3), Trace_ELBO())
            state = svi.init(jax.random.PRNGKey(0), y)
            first, wall, cpu, _ = time_steps(jax.jit(svi.update), state, (y,), a.steps)
            rows.append((d, name + " + Trace_ELBO", "-", first, wall, cpu, None, None))
            print(f"d={d} {name}: first {first:.1f} s, step {wall:.2f} ms wall, {cpu:.2f} ms CPU", flush=True)
        for cov in ("full", "diag", "lowrank"):
            if cov == "full" and d > 100:
                continue
            kw = dict(rank=4) if cov == "lowrank" else {}
            for M in map(int, a.points.split(",")):
                guide = AutoGaussianMixture(model, num_components=4, covariance=cov, init_method="spread", **kw)
                svi = SVI(model, guide, numpyro.optim.Adam(1e-3), TraceEntropy_ELBO(num_entropy_points=M))
                state = svi.init(jax.random.PRNGKey(0), y)
                first, wall, cpu, state = time_steps(jax.jit(svi.update), state, (y,), a.steps)
                post = guide.get_posterior(svi.get_params(state))
                fac = {"diag": post.scale, "lowrank": (post.cov_factor, post.cov_diag)}.get(cov, post.scale_tril)
                lg = post.mixing_distribution.logits
                je = jax.jit(jax.value_and_grad(entropy_fn(cov, M), argnums=(0, 1, 2)))
                jax.block_until_ready(je(lg, post.loc, fac, jax.random.PRNGKey(0)))
                walls = []
                c0 = time.process_time()
                for i in range(a.steps):
                    t = time.perf_counter()
                    jax.block_until_ready(je(lg, post.loc, fac, jax.random.PRNGKey(i + 1)))
                    walls.append(time.perf_counter() - t)
                e_cpu = 1e3 * (time.process_time() - c0) / a.steps
                e_wall = 1e3 * float(np.median(walls))
                name = f"AutoGaussianMixture(K=4, {cov}{', rank 4' if kw else ''}) + TraceEntropy_ELBO"
                rows.append((d, name, M, first, wall, cpu, e_wall, e_cpu))
                print(f"d={d} {cov} M={M}: first {first:.1f} s, step {wall:.2f} ms wall, {cpu:.2f} ms CPU; "
                      f"entropy {e_wall:.2f} ms wall, {e_cpu:.2f} ms CPU ({100 * e_cpu / cpu:.0f}%)", flush=True)
    lines = [f"**Step cost vs M** (`--part cost`; median wall ms of {a.steps} steps after compilation, CPU ms "
             "per step from `time.process_time`, entropy = value and gradient of the entropy alone, "
             "share = entropy CPU / step CPU).", "",
             "| d | guide + ELBO | M | first step (s) | step wall (ms) | step CPU (ms) | entropy CPU (ms) | "
             "entropy share |", "|---|---|---|---|---|---|---|---|"]
    for d, name, M, first, wall, cpu, e_wall, e_cpu in rows:
        share = "-" if e_cpu is None else f"{100 * e_cpu / cpu:.0f}%"
        ent = "-" if e_cpu is None else f"{e_cpu:.2f}"
        lines.append(f"| {d} | {name} | {M} | {first:.1f} | {wall:.2f} | {cpu:.2f} | {ent} | {share} |")
    return lines


# ----------------------------------------------------------------------------- noise
def _mc_points(key, num_points, d, dtype):
    return jax.random.normal(key, (num_points, d), dtype)


def _antithetic_points(key, num_points, d, dtype):
    half = _ORIGINAL(key, max(num_points // 2, 1), d, dtype)
    return jnp.concatenate([half, -half], axis=0)[:num_points]


_ORIGINAL = _mixing.shifted_normal_points
POINT_SETS = {"rqmc": _ORIGINAL, "mc": _mc_points, "rqmc-anti": _antithetic_points}


def overlapping_mixture(cov, d, dtype, K=4, seed=0):
    rng = np.random.default_rng(seed)
    lw = jax.nn.log_softmax(jnp.asarray(0.3 * rng.normal(size=K), dtype))
    locs = jnp.asarray(rng.normal(size=(K, d)) * (2.0 / np.sqrt(2 * d)), dtype)  # |mu_i - mu_j| ~ 2
    if cov == "lowrank":
        fac = (jnp.asarray(0.5 * rng.normal(size=(K, d, 4)) / np.sqrt(d), dtype),
               jnp.asarray(rng.uniform(0.7, 1.3, (K, d)), dtype))
    elif cov == "diag":
        fac = jnp.asarray(rng.uniform(0.8, 1.2, (K, d)), dtype)
    else:
        fac = jnp.asarray(np.eye(d) * rng.uniform(0.8, 1.2, (K, 1, d)), dtype)
    return lw, locs, fac


def kernel_entropy(cov, M):
    def f(lw, locs, fac, key):
        if cov == "lowrank":
            return _lowrank.lowrank_mixing_qmc_entropy(lw, locs, fac[0], fac[1], num_points=M, key=key)
        if cov == "diag":
            return _mixing.mixing_qmc_entropy(lw, locs, None, fac, num_points=M, key=key)
        return _mixing.mixing_qmc_entropy(lw, locs, fac, None, num_points=M, key=key)

    return f


def _flat(tree):
    return jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])


def rel_noise(grads, ref_mean):
    """sqrt(E |g - gbar|^2) / |gbar_ref| over the rows of ``grads (R, P)``."""
    g = np.asarray(grads, np.float64)
    return float(np.sqrt(np.mean(np.sum((g - g.mean(0)) ** 2, -1))) / np.linalg.norm(ref_mean))


def part_noise(a, dtype):
    lines = [f"**Entropy gradient noise vs M** (`--part noise`; {a.keys} keys; K = 4 mixture with means about "
             "2 standard deviations apart; relative noise = sqrt(E|g - mean g|^2) / |mean g at M = 1024| over "
             "all parameters; value sd = standard deviation of the entropy value over keys, nats).", "",
             "| d | cov | points | M | value sd (nats) | gradient relative noise | value mean - mean at 1024 "
             "(nats, +- 2 se) |", "|---|---|---|---|---|---|---|"]
    keys = jax.random.split(jax.random.PRNGKey(123), a.keys)
    Ms = list(map(int, a.points.split(",")))
    variant_dims = set(map(int, a.variant_dims.split(",")))
    for d in map(int, a.dims.split(",")):
        for cov in ("full", "diag", "lowrank"):
            if cov == "full" and d > 100:
                continue
            params = overlapping_mixture(cov, d, dtype)
            results = {}
            sets = list(POINT_SETS) if d in variant_dims else ["rqmc"]
            for pts in sets:
                _mixing.shifted_normal_points = POINT_SETS[pts]
                _lowrank.shifted_normal_points = POINT_SETS[pts]
                try:
                    for M in Ms:
                        f = jax.value_and_grad(kernel_entropy(cov, M), argnums=(0, 1, 2))
                        # the parameters are arguments, not constants of the program (XLA
                        # folded constant low-rank parameters into NaN gradients in some
                        # processes; see lowrank_mixing_qmc_entropy)
                        vg = jax.jit(jax.vmap(lambda k, p: f(*p, k), (0, None)))  # noqa: B023
                        vals, grads = jax.block_until_ready(vg(keys, params))
                        results[pts, M] = (np.asarray(vals, np.float64),
                                           np.asarray(jax.vmap(_flat)(grads), np.float64))
                finally:
                    _mixing.shifted_normal_points = _ORIGINAL
                    _lowrank.shifted_normal_points = _ORIGINAL
            ref_v, ref_g = results["rqmc", 1024] if ("rqmc", 1024) in results else results["rqmc", max(Ms)]
            for pts in sets:
                for M in Ms:
                    v, g = results[pts, M]
                    diff = v.mean() - ref_v.mean()
                    se = np.sqrt(v.var(ddof=1) / len(v) + ref_v.var(ddof=1) / len(ref_v))
                    lines.append(f"| {d} | {cov} | {pts} | {M} | {v.std(ddof=1):.2e} | "
                                 f"{rel_noise(g, ref_g.mean(0)):.3f} | {diff:+.1e} +- {2 * se:.1e} |")
                    print(lines[-1], flush=True)
    # (b) the whole loss gradient on the Gaussian model at the guide's initial parameters
    lines += ["", "**Whole TraceEntropy_ELBO gradient noise vs M** (Gaussian model z ~ N(0, I_d), y ~ N(z, 1), "
              "AutoGaussianMixture(K=4) at its initial parameters (`init_method='fits'`), one particle; relative "
              "noise as above, the reference mean from M = 1024; variance ratio = total variance at M over total "
              "variance at M = 1024).", "",
              "| d | cov | M | loss-gradient relative noise | variance / variance at M = 1024 |", "|---|---|---|---|---|"]
    for d in map(int, a.dims.split(",")):
        model = gaussian_model(d)
        y = jnp.asarray(np.random.default_rng(0).normal(size=d), dtype)
        for cov in ("full", "diag", "lowrank"):
            if cov == "full" and d > 100:
                continue
            kw = dict(rank=4) if cov == "lowrank" else {}
            guide = AutoGaussianMixture(model, num_components=4, covariance=cov, **kw)
            svi = SVI(model, guide, numpyro.optim.Adam(1e-3), TraceEntropy_ELBO())
            params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
            res = {}
            for M in Ms:
                elbo = TraceEntropy_ELBO(num_entropy_points=M)
                gfun = jax.jit(jax.vmap(lambda k, q: _flat(jax.grad(  # noqa: B023
                    lambda p: elbo.loss(k, p, model, guide, y))(q)), (0, None)))  # noqa: B023
                res[M] = np.asarray(jax.block_until_ready(gfun(keys, params)), np.float64)
            ref = res[1024] if 1024 in res else res[max(Ms)]
            ref_var = np.sum(ref.var(0))
            for M in Ms:
                lines.append(f"| {d} | {cov} | {M} | {rel_noise(res[M], ref.mean(0)):.3f} | "
                             f"{np.sum(res[M].var(0)) / ref_var:.3f} |")
                print(lines[-1], flush=True)
    return lines


# ----------------------------------------------------------------------------- convergence
def _log_evidence_bimodal(y=4.0):
    from scipy import integrate, stats

    f = lambda a: stats.norm.pdf(a, 0, 3) * stats.norm.pdf(y, a * a, 0.5)  # noqa: E731
    z, _ = integrate.quad(f, -10, 10, points=[-2, 2], epsabs=1e-13, limit=200)
    return float(np.log(z))


def part_converge(a, dtype):
    Ms = list(map(int, a.points.split(",")))
    d = 10
    y_g = jnp.asarray(np.random.default_rng(0).normal(size=d), dtype)
    log_z_g = float(np.sum(-0.5 * np.log(2 * np.pi * 2.0) - np.asarray(y_g, np.float64) ** 2 / 4.0))
    cases = [
        ("gaussian d=10, K=4 diag", gaussian_model(d), (y_g,), dict(num_components=4, covariance="diag"), log_z_g),
        ("bimodal a~N(0,3), y~N(a^2,0.5), y=4, K=2", bimodal_model, (jnp.asarray(4.0, dtype),),
         dict(num_components=2), _log_evidence_bimodal()),
    ]
    cases = [c for c, key in zip(cases, ("gaussian", "bimodal")) if key in a.models.split(",")]
    lines = [f"**Convergence vs M** (`--part converge`; KL(q||p) = ln p(y) - ELBO after {a.train_steps} Adam "
             f"steps, lr 0.01, one particle; {a.seeds} seeds (keys 0..{a.seeds - 1}, init_method='fits'); final "
             "ELBO from 4096 particles with the deterministic 1024-point entropy; mean and range over seeds).", "",
             "| model | M | KL mean (nats) | KL min | KL max |", "|---|---|---|---|---|"]
    for name, model, args, gkw, log_z in cases:
        for M in Ms:
            guide = AutoGaussianMixture(model, **gkw)
            svi = SVI(model, guide, numpyro.optim.Adam(0.01), TraceEntropy_ELBO(num_entropy_points=M))
            states = [svi.init(jax.random.PRNGKey(s), *args) for s in range(a.seeds)]
            stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)

            def train(state):
                return jax.lax.fori_loop(0, a.train_steps, lambda i, s: svi.update(s, *args)[0], state)  # noqa: B023

            final = jax.jit(jax.vmap(train))(stacked)
            params = svi.get_params(final)
            ev = TraceEntropy_ELBO(num_particles=4096, randomize_entropy=False)
            loss = jax.jit(jax.vmap(lambda p: ev.loss(jax.random.PRNGKey(7), p, model, guide, *args)))(params)  # noqa: B023
            kl = log_z + np.asarray(loss, np.float64)
            lines.append(f"| {name} | {M} | {kl.mean():.4f} | {kl.min():.4f} | {kl.max():.4f} |")
            print(lines[-1], flush=True)
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["cost", "noise", "converge", "all"], default="all")
    ap.add_argument("--dims", default="10,100,1000")
    ap.add_argument("--points", default="8,16,32,64,128,1024")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--keys", type=int, default=128)
    ap.add_argument("--variant-dims", default="10", help="noise part: d where mc and rqmc-anti are also run")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--train-steps", type=int, default=2000)
    ap.add_argument("--models", default="gaussian,bimodal", help="converge part: comma-separated gaussian, bimodal")
    a = ap.parse_args(argv)
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    load = os.getloadavg()[0]
    state = "a loaded machine: times are upper bounds" if load > 0.5 * os.cpu_count() else "a quiet machine"
    lines = [f"`python benchmarks/svi_entropy_points.py {' '.join(sys.argv[1:] if argv is None else argv)}` "
             f"({np.dtype(dtype).name}; {os.cpu_count()} CPU cores, load average {load:.1f} at the "
             f"start: {state}).", ""]
    for part, fn in (("cost", part_cost), ("noise", part_noise), ("converge", part_converge)):
        if a.part in (part, "all"):
            lines += fn(a, dtype) + [""]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
