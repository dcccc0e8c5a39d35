"""Time and memory of the default entropy at scale, and SVI step time against NumPyro's guides.

Part 1 (``--part entropy``): for K in {2, 8, 32, 128} x d in {2, 10, 100, 1000} x {full, diag},
``GaussianMixture(...).entropy()`` (the default, ``auto``) under ``jax.jit``: first call
(compilation + one run) and per-call time (best of ``--repeats``) of the value and of
``jax.value_and_grad`` with respect to logits, means and factors, and the peak memory XLA
plans for the call (``compiled.memory_analysis()``: arguments + outputs + temporaries).
Configurations whose work ``K^2 M d^2`` (full) exceeds ``--max-flops`` are skipped (listed).
``lowrank``: ``GaussianMixture(loc, cov_factor=W, cov_diag=D)`` with ``W (K, d, --rank)``
(work ``K^2 M d r``; ``--dims`` may add d = 10000).

Part 2 (``--part svi``): one ``SVI.update`` step (median wall time and CPU time per step over
``--steps`` calls of a program of ``INNER`` steps in a ``lax.scan``, after the first) on the model
``z ~ N(0, I_d)``, ``y ~ N(z, 1)`` (100 observations per coordinate... one vector), for
``AutoGaussianMixture(K=4)`` + ``TraceEntropy_ELBO`` (full covariances for d <= 1000, diagonal
at every d; ``lowrank``: ``covariance="lowrank", rank=4``) and ``AutoMultivariateNormal`` /
``AutoLowRankMultivariateNormal`` (rank 4) +
``Trace_ELBO``, side by side in one run (``--svi-model logistic``: a Bayesian logistic
regression on 1,000 rows instead, a model whose own cost grows with its data); and the share of the mixture's step spent in its
entropy: one minus the CPU time of the same step compiled with ``GaussianMixture.entropy``
replaced by zero over the step's, and, for comparison, the CPU time of the entropy's value and
gradient called alone (the ELBO's ``num_entropy_points``, same parameters) over the step's;
the issue's goals checked per row.

``python benchmarks/scale.py [--part entropy|svi|all] [--covs diag,full,lowrank] [--dims ...]
[--svi-dims ...] [--svi-model gaussian|logistic] [--write]`` writes its tables between ``<!-- scale-PART[-TAG]:begin -->`` /
``<!-- scale-PART[-TAG]:end -->`` in docs/performance.md (``--tag``, e.g. ``lowrank``, keeps
the sections of a restricted run apart).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO  # noqa: E402
from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal  # noqa: E402

from doc_sections import write_section  # noqa: E402
from numpyro_gmm import AutoGaussianMixture, GaussianMixture, TraceEntropy_ELBO  # noqa: E402
from numpyro_gmm._kernels.mixing import default_num_points  # noqa: E402


def best(f, *a, repeats=3):
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(*a))
        ts.append(time.perf_counter() - t)
    return min(ts)


def peak_bytes(jitted, *a):
    m = jitted.lower(*a).compile().memory_analysis()
    if m is None:
        return float("nan")
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes


def mixture_params(K, d, cov, dtype, seed=0, rank=2):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(0.5 * rng.normal(size=K), dtype)
    locs = jnp.asarray(rng.normal(size=(K, d)), dtype)
    if cov == "diag":
        factor = jnp.asarray(rng.uniform(0.6, 1.4, (K, d)), dtype)
    elif cov == "lowrank":
        factor = (jnp.asarray(rng.normal(size=(K, d, rank)) / np.sqrt(d), dtype),
                  jnp.asarray(rng.uniform(0.4, 2.0, (K, d)), dtype))
    else:
        factor = jnp.asarray(np.eye(d) * rng.uniform(0.6, 1.4, (K, 1, d)), dtype)
    return logits, locs, factor


def entropy_fn(cov):
    if cov == "diag":
        return lambda lg, m, f: GaussianMixture(m, scale=f, logits=lg).entropy()
    if cov == "lowrank":
        return lambda lg, m, f: GaussianMixture(m, cov_factor=f[0], cov_diag=f[1], logits=lg).entropy()
    return lambda lg, m, f: GaussianMixture(m, scale_tril=f, logits=lg).entropy()


def part_entropy(a, dtype):
    rows, skipped = [], []
    for cov in a.covs.split(","):
        for d in map(int, a.dims.split(",")):
            for K in (2, 8, 32, 128):
                M = default_num_points(K)  # the default's points per component
                flops = K * K * M * {"full": d * d, "diag": d, "lowrank": d * a.rank}[cov]
                if flops > a.max_flops:
                    skipped.append((K, d, cov, flops))
                    continue
                args = mixture_params(K, d, cov, dtype, rank=a.rank)
                f = entropy_fn(cov)
                out = [K, d, cov]
                for g in (f, jax.value_and_grad(f, argnums=(0, 1, 2))):
                    j = jax.jit(g)
                    t = time.perf_counter()
                    jax.block_until_ready(j(*args))
                    first = time.perf_counter() - t
                    per = best(j, *args, repeats=a.repeats)
                    out += [first, per, peak_bytes(j, *args)]
                rows.append(out)
                print(f"K={K:3d} d={d:4d} {cov}: value first {out[3]:.2f} s, per call {1e3 * out[4]:.1f} ms, "
                      f"{out[5] / 2**20:.1f} MiB | grad first {out[6]:.2f} s, per call {1e3 * out[7]:.1f} ms, "
                      f"{out[8] / 2**20:.1f} MiB", flush=True)
    return rows, skipped


#: Observations of the ``--svi-model logistic`` model.
LOGISTIC_N = 1000


def svi_model(d, kind="gaussian", dtype=jnp.float32):
    """``(model, data)`` of the SVI part. ``gaussian``: ``z ~ N(0, I_d)``, ``y ~ N(z, 1)``, one
    observed vector (the model costs ``O(d)``, so the guide's own work is all there is);
    ``logistic``: Bayesian logistic regression, ``z ~ N(0, I_d)``, ``y_n ~ Bernoulli(logit =
    x_n . z)`` for ``LOGISTIC_N`` rows ``x_n ~ N(0, I_d / d)`` (fixed seed; the model costs
    ``O(n d)``, as a model with data does)."""
    rng = np.random.default_rng(0)
    if kind == "gaussian":
        def model(y):
            z = numpyro.sample("z", dist.Normal(jnp.zeros(d, y.dtype), 1.0).to_event(1))
            numpyro.sample("y", dist.Normal(z, 1.0).to_event(1), obs=y)

        return model, jnp.asarray(rng.normal(size=d), dtype)
    x = jnp.asarray(rng.normal(size=(LOGISTIC_N, d)) / np.sqrt(d), dtype)
    z_true = rng.normal(size=d)
    y = (rng.random(LOGISTIC_N) < 1 / (1 + np.exp(-np.asarray(x, np.float64) @ z_true))).astype(np.float64)

    def model(y):
        z = numpyro.sample("z", dist.Normal(jnp.zeros(d, y.dtype), 1.0).to_event(1))
        with numpyro.plate("n", LOGISTIC_N):
            numpyro.sample("y", dist.Bernoulli(logits=x @ z), obs=y)

    return model, jnp.asarray(y, dtype)


def _timed_calls(f, args_of, n):
    """(median wall s, median CPU s) over ``n`` calls ``f(*args_of(i))``, each timed alone
    (``time.perf_counter`` / ``time.process_time``; medians resist the load's spikes)."""
    walls, cpus = [], []
    for i in range(n):
        args = args_of(i)
        t, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(f(*args))
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return float(np.median(walls)), float(np.median(cpus))


class _ScannedSteps:
    """A compiled program of ``INNER`` consecutive ``update`` steps (``lax.scan``, as
    ``benchmarks/posteriors.py`` and ``SVI.run``'s loop body run them), called on its own
    state (``self.state``): timed per call and divided by ``INNER``, the per-step time without
    the per-call dispatch and synchronisation (0.1-0.3 ms on the CPU, which a timing of single
    steps adds to every row)."""

    def __init__(self, update, state, y):
        def run(state, y):
            return lax.scan(lambda s, _: (update(s, y)[0], None), state, None, length=INNER)[0]

        self.program = jax.jit(run).lower(state, y).compile()
        self.state = state

    def __call__(self, y):
        self.state = self.program(self.state, y)
        return self.state


#: SVI steps (and entropy calls) per timed program of the SVI part.
INNER = 50


class _entropy_stubbed:
    """Within the block ``GaussianMixture.entropy`` returns zeros of the batch shape, and
    ``GaussianMixture.log_prob`` zeros of the values' batch shape (for the step-without-entropy
    program of :func:`part_svi`; only while tracing). The step calls ``log_prob`` only for
    ``TraceEntropy_ELBO(path_gradient=True)``'s ``ln q`` at the components' draws, the part of
    its entropy term that carries the components' gradient."""

    def __enter__(self):
        self._saved = GaussianMixture.entropy, GaussianMixture.log_prob
        GaussianMixture.entropy = lambda self, **_: jnp.zeros(self.batch_shape, self.loc.dtype)
        GaussianMixture.log_prob = lambda self, value, *_: jnp.zeros(jnp.shape(value)[:-1], self.loc.dtype)

    def __exit__(self, *exc):
        GaussianMixture.entropy, GaussianMixture.log_prob = self._saved


def part_svi(a, dtype):
    """``(rows, skipped)``: the table's rows and the setups not run (name, d, why)."""
    rows, skipped = [], []
    for d in map(int, a.svi_dims.split(",")):
        model, y = svi_model(d, a.svi_model, dtype)
        setups = []
        if d <= 1000:  # d x d factor and its O(d^3) work per step beyond
            setups.append(("AutoMultivariateNormal + Trace_ELBO", AutoMultivariateNormal(model), Trace_ELBO(), None))
        else:
            skipped.append(("AutoMultivariateNormal", d, "d x d factor: d > 1000"))
        setups.append(("AutoLowRankMultivariateNormal(rank 4) + Trace_ELBO",
                       AutoLowRankMultivariateNormal(model, rank=4), Trace_ELBO(), None))
        for cov in a.covs.split(","):
            if cov == "full" and d > 1000:
                skipped.append(("AutoGaussianMixture(K=4, full)", d, "K d x d factors: d > 1000"))
                continue
            kw = dict(rank=4) if cov == "lowrank" else {}
            options = {} if a.entropy_points is None else {"num_entropy_points": a.entropy_points}
            if a.path_gradient is not None:
                options["path_gradient"] = a.path_gradient == "True"
            loss = TraceEntropy_ELBO(**options)
            setups.append((f"AutoGaussianMixture(K=4, {cov}{', rank 4' if kw else ''}) + TraceEntropy_ELBO "
                           f"(M = {loss.num_entropy_points})",
                           AutoGaussianMixture(model, num_components=4, covariance=cov, init_method=a.init_method, **kw),
                           loss, cov))
        lowrank_step = None
        for name, guide, loss, cov in setups:
            svi = SVI(model, guide, numpyro.optim.Adam(1e-3), loss)
            state = svi.init(jax.random.PRNGKey(0), y)
            upd = jax.jit(svi.update)
            t = time.perf_counter()
            state, _ = jax.block_until_ready(upd(state, y))
            first = time.perf_counter() - t
            steps = _ScannedSteps(svi.update, state, y)
            wall, cpu = (t / INNER for t in _timed_calls(steps, lambda i: (y,), a.steps))  # noqa: B023
            share = alone = ratio = None
            if cov is None and name.startswith("AutoLowRank"):
                lowrank_step = cpu
            if cov is not None:
                post = guide.get_posterior(svi.get_params(steps.state))
                factor = {"diag": post.scale, "lowrank": (post.cov_factor, post.cov_diag)}.get(cov, post.scale_tril)
                lg = post.mixing_distribution.logits
                # the value and gradient of the whole entropy alone: what the step differentiates
                # without the path gradient (with it, the entropy's gradient reaches the weights only)
                je = None
                if not loss.path_gradient:
                    M = loss.num_entropy_points
                    if cov == "lowrank":
                        fe = lambda lg, m, f, k: GaussianMixture(  # noqa: E731
                            m, cov_factor=f[0], cov_diag=f[1], logits=lg).entropy(key=k, num_points=M)  # noqa: B023
                    elif cov == "diag":
                        fe = lambda lg, m, f, k: GaussianMixture(m, scale=f, logits=lg).entropy(key=k, num_points=M)  # noqa: E731,B023
                    else:
                        fe = lambda lg, m, f, k: GaussianMixture(m, scale_tril=f, logits=lg).entropy(key=k, num_points=M)  # noqa: E731,B023
                    vg = jax.value_and_grad(fe, argnums=(0, 1, 2))

                    def entropy_calls(lg, m, f, key):  # INNER value-and-gradient calls, a new key each
                        def one(acc, k):
                            out = vg(lg, m, f, k)
                            return acc + sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(out)), None
                        return lax.scan(one, jnp.zeros((), m.dtype), jax.random.split(key, INNER))[0]

                    je = jax.jit(entropy_calls)
                    jax.block_until_ready(je(lg, post.loc, factor, jax.random.PRNGKey(0)))
                # the same steps with the mixture's entropy replaced by 0 (traced under the stub,
                # so the compiled program has no entropy and no entropy gradient)
                with _entropy_stubbed():
                    steps0 = _ScannedSteps(svi.update, steps.state, y)
                jax.block_until_ready(steps0(y))
                # steps, steps without entropy and entropy alone timed alternately, so that a
                # change of load biases none of them
                e_cpus, s_cpus, s_walls, z_cpus = [], [], [], []
                for i in range(a.steps):
                    if je is not None:
                        e_cpus.append(_timed_calls(je, lambda _: (lg, post.loc, factor, jax.random.PRNGKey(i + 1)), 1)[1])  # noqa: B023
                    w1, c1 = _timed_calls(steps, lambda _: (y,), 1)  # noqa: B023
                    s_walls.append(w1)
                    s_cpus.append(c1)
                    z_cpus.append(_timed_calls(steps0, lambda _: (y,), 1)[1])  # noqa: B023
                wall, cpu = float(np.median(s_walls)) / INNER, float(np.median(s_cpus)) / INNER
                alone = None if je is None else float(np.median(e_cpus)) / INNER / cpu
                share = max(0.0, 1.0 - float(np.median(z_cpus)) / INNER / cpu)
                ratio = cpu / (4 * lowrank_step)
            rows.append((d, name, first, wall, cpu, share, alone, ratio))
            print(f"d={d:4d} {name}: first {first:.2f} s, step {1e3 * wall:.2f} ms (median wall), "
                  f"{1e3 * cpu:.2f} ms CPU" + ("" if share is None else
                  f", entropy share {100 * share:.0f}% (alone / step "
                  f"{'-' if alone is None else f'{100 * alone:.0f}%'}), "
                  f"step / (4 x AutoLowRank step) {ratio:.1f}"), flush=True)
    return rows, skipped


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["entropy", "svi", "all"], default="all")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--max-flops", type=float, default=4e10)
    ap.add_argument("--covs", default="diag,full", help="comma-separated: diag, full, lowrank")
    ap.add_argument("--dims", default="2,10,100,1000", help="entropy part: comma-separated d")
    ap.add_argument("--svi-dims", default="10,100,1000", help="svi part: comma-separated d")
    ap.add_argument("--rank", type=int, default=2, help="rank r of the lowrank entropy rows")
    ap.add_argument("--init-method", default="fits", help="AutoGaussianMixture init_method (svi part)")
    ap.add_argument("--svi-model", choices=["gaussian", "logistic"], default="gaussian",
                    help="svi part: the model (see svi_model)")
    ap.add_argument("--tag", default="", help="suffix of the docs section name")
    ap.add_argument("--entropy-points", type=int, default=None,
                    help="svi part: TraceEntropy_ELBO(num_entropy_points=...); default: the ELBO's default")
    ap.add_argument("--path-gradient", choices=["False", "True"], default=None,
                    help="svi part: TraceEntropy_ELBO(path_gradient=...); default: the ELBO's default")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    lines = [f"`python benchmarks/scale.py {' '.join(sys.argv[1:] if argv is None else argv)}` "
             f"({np.dtype(dtype).name}; devices {jax.devices()}; "
             f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the start; under load, times "
             "are upper bounds of what an idle machine gives).", ""]
    if a.part in ("entropy", "all"):
        rows, skipped = part_entropy(a, dtype)
        lines += ["**The default entropy** (`GaussianMixture.entropy()`, the mixing rule with "
                  f"{default_num_points(2)} points per component, {default_num_points(128)} at K = 128; first call = compilation + one run, per call = best of {a.repeats}; "
                  "memory = XLA's planned arguments + outputs + temporaries of the call).", "",
                  "| K | d | cov | value: first call (s) | value: per call (ms) | value: memory (MiB) | "
                  "value+grad: first call (s) | value+grad: per call (ms) | value+grad: memory (MiB) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for K, d, cov, f1, p1, m1, f2, p2, m2 in rows:
            lines.append(f"| {K} | {d} | {cov} | {f1:.2f} | {1e3 * p1:.1f} | {m1 / 2**20:.1f} | {f2:.2f} | "
                         f"{1e3 * p2:.1f} | {m2 / 2**20:.1f} |")
        if skipped:
            lines += ["", "Not run (work `K^2 M d^2` / `K^2 M d` / `K^2 M d r` above " f"{a.max_flops:.0e} flops): "
                      + ", ".join(f"K={K} d={d} {cov} ({fl:.1e})" for K, d, cov, fl in skipped) + "."]
        lines.append("")
    if a.part in ("svi", "all"):
        rows, svi_skipped = part_svi(a, dtype)
        lines += [f"**SVI step** (`jax.jit(svi.update)` for the first step; then {a.steps} calls of one program of "
                  f"{INNER} steps in a `lax.scan`, as a training loop runs them, per-step = call / {INNER}; model "
                  + ("z ~ N(0, I_d), y ~ N(z, 1) with one observed vector" if a.svi_model == "gaussian" else
                     f"z ~ N(0, I_d), y_n ~ Bernoulli(logit = x_n . z), n = {LOGISTIC_N} rows x_n ~ N(0, I_d / d)")
                  + "; Adam; *step*: median over calls of wall ms and CPU ms per "
                  f"step (`time.process_time`; for the mixture rows over {a.steps} more calls timed alternately "
                  "with the entropy and with the step without entropy). *entropy share*: 1 - (CPU time of the "
                  "same step compiled with the mixture's entropy replaced by 0) / (the step's CPU time), i.e. "
                  "the part of the step the entropy's value and gradient add. *entropy alone / step*: CPU "
                  "time of the value and gradient of the mixture's entropy computed alone (randomised rule with "
                  f"the ELBO's M points, {INNER} in one program, a new key each) over the step's. "
                  "*vs 4 x low-rank*: the mixture's step CPU time over 4 times that of "
                  "AutoLowRankMultivariateNormal (goal: <= 2). *goal*: both goals (<= 2x, and share < 30% at "
                  "d >= 100).", "",
                  "| d | guide + ELBO | first step (s) | step wall (ms) | step CPU (ms) | entropy share | "
                  "entropy alone / step | vs 4 x low-rank | goal |", "|---|---|---|---|---|---|---|---|---|"]
        for d, name, first, wall, cpu, share, alone, ratio in rows:
            if share is None:
                goal = "-"
            else:
                ok = ratio <= 2 and (d < 100 or share < 0.3)
                goal = "met" if ok else "not met"
            lines.append(f"| {d} | {name} | {first:.2f} | {1e3 * wall:.2f} | {1e3 * cpu:.2f} | "
                         f"{'-' if share is None else f'{100 * share:.0f}%'} | "
                         f"{'-' if alone is None else f'{100 * alone:.0f}%'} | "
                         f"{'-' if ratio is None else f'{ratio:.1f}'} | {goal} |")
        if svi_skipped:
            lines += ["", "Not run: " + ", ".join(f"{name} at d={d} ({why})" for name, d, why in svi_skipped) + "."]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.write:
        write_section(ROOT / "docs" / "performance.md", f"scale-{a.part}" + (f"-{a.tag}" if a.tag else ""), text)


if __name__ == "__main__":
    main()
