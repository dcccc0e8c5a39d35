"""Full covariances: ``L^-1 B`` by blocked substitution against forming ``L^-1``, side by side.

Where the points are few for the dimension (:func:`numpyro_gmm._kernels.gaussian.substitution_pays`:
``d >= 32`` and fewer than ``2 d`` columns per factor), the mixing rule and ``tril_solve``
solve ``L_j^{-1} (x - mu_j)`` by forward substitution (``O(d^2 R)``) instead of forming the
inverse (``O(d^3)``, and two ``d x d`` products more for its gradient). This script times, in
one run, the same programs traced with the rule as it is and with ``substitution_pays`` forced
to ``False`` (the baseline: the inverse, the only path before):

1. the value and gradient of the randomised mixing rule as ``TraceEntropy_ELBO`` calls it
   (``M = 16``, ``N`` calls in one ``lax.scan``, a new key each);
2. one SVI step of ``AutoGaussianMixture(K = 4)`` (full covariances) + ``TraceEntropy_ELBO``
   on ``z ~ N(0, I_d)``, ``y ~ N(z, 1)`` (``N`` steps in one ``lax.scan``), with NumPyro's
   ``AutoMultivariateNormal`` + ``Trace_ELBO`` (its own LAPACK solves) in the same run for scale;
3. ``GaussianMixture.log_prob`` of one draw (as ``Trace_ELBO`` asks a guide for ``ln q(z)``),
   value and gradient.

Minimum CPU time per call over ``--repeats`` interleaved repeats, first-call (compile) wall
time, and the largest difference between the two variants' outputs.

``python benchmarks/substitution.py [--repeats 7] [--dims 50,100,300,1000]``
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO  # noqa: E402
from numpyro.infer.autoguide import AutoMultivariateNormal  # noqa: E402

from numpyro_gmm import AutoGaussianMixture, GaussianMixture, TraceEntropy_ELBO  # noqa: E402
from numpyro_gmm._kernels import gaussian, mixing  # noqa: E402

N = 20  # calls (entropy) or SVI steps per compiled program


@contextlib.contextmanager
def substitution(enabled: bool):
    """While tracing: the rule as it is, or ``substitution_pays`` forced to ``False``; JAX's
    caches cleared first."""
    saved = gaussian.substitution_pays, mixing.substitution_pays
    jax.clear_caches()  # the package's module-level jits would reuse the other variant's traces
    if not enabled:
        gaussian.substitution_pays = mixing.substitution_pays = lambda d, num_rhs: False
    try:
        yield
    finally:
        gaussian.substitution_pays, mixing.substitution_pays = saved


def _factors(K, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(K, d, d)) * 0.3 / np.sqrt(d)
    tril = np.linalg.cholesky(a @ np.swapaxes(a, -1, -2) + np.eye(d))
    return jnp.asarray(0.1 * rng.normal(size=(K, d)), dtype), jnp.asarray(tril, dtype)


def compiled(fn, args, enabled):
    with substitution(enabled):
        t = time.perf_counter()
        prog = jax.jit(fn).lower(*args).compile()
        first = time.perf_counter() - t
    return prog, first


def entropy_program(K, d, dtype):
    locs, tril = _factors(K, d, dtype)
    vg = jax.value_and_grad(
        lambda lg, m, t, k: mixing.mixing_qmc_entropy(jax.nn.log_softmax(lg), m, t, None, num_points=16, key=k),
        argnums=(0, 1, 2),
    )

    def run(lg, m, t, key):
        def one(acc, k):
            value, grads = vg(lg, m, t, k)
            return acc + sum(jnp.sum(g) for g in jax.tree_util.tree_leaves(grads)), value
        return lax.scan(one, jnp.zeros((), dtype), jax.random.split(key, N))

    return run, (jnp.zeros(K, dtype), locs, tril, jax.random.PRNGKey(0))


def svi_program(d, dtype, guide_kind):
    y = jnp.asarray(np.random.default_rng(1).normal(size=d), dtype)

    def model(y):
        z = numpyro.sample("z", dist.Normal(jnp.zeros(d, y.dtype), 1.0).to_event(1))
        numpyro.sample("y", dist.Normal(z, 1.0).to_event(1), obs=y)

    if guide_kind == "mixture":
        svi = SVI(model, AutoGaussianMixture(model, num_components=4), numpyro.optim.Adam(1e-3), TraceEntropy_ELBO())
    else:
        svi = SVI(model, AutoMultivariateNormal(model), numpyro.optim.Adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), y)

    def run(state, y):
        return lax.scan(lambda s, _: svi.update(s, y), state, None, length=N)

    return run, (state, y)


def log_prob_program(K, d, dtype):
    locs, tril = _factors(K, d, dtype)
    x = jnp.asarray(np.random.default_rng(2).normal(size=d), dtype)

    def lp(m, t, x):
        return GaussianMixture(m, scale_tril=t).log_prob(x)

    vg = jax.value_and_grad(lp, argnums=(0, 1, 2))

    def run(m, t, x):
        def one(acc, i):
            value, grads = vg(m, t, x + i)
            return acc + sum(jnp.sum(g) for g in jax.tree_util.tree_leaves(grads)), value
        return lax.scan(one, jnp.zeros((), dtype), jnp.arange(N, dtype=dtype))

    return run, (locs, tril, x)


def timed(progs_args, repeats):
    """Minimum CPU seconds per call of each compiled program, interleaved over repeats."""
    times = [[] for _ in progs_args]
    for _ in range(repeats):
        for i, (prog, args) in enumerate(progs_args):
            t = time.process_time()
            jax.block_until_ready(prog(*args))
            times[i].append(time.process_time() - t)
    return [min(t) / N for t in times]


def _outputs(prog, args):
    return np.concatenate([np.ravel(np.asarray(x, np.float64))
                           for x in jax.tree_util.tree_leaves(prog(*args)) if jnp.issubdtype(x.dtype, jnp.floating)])


def compare(label, build, repeats):
    fn, args = build()  # a new function per variant: jax.jit caches traces per function
    new, c_new = compiled(fn, args, True)
    fn, _ = build()
    old, c_old = compiled(fn, args, False)
    t_new, t_old = timed([(new, args), (old, args)], repeats)
    a, b = _outputs(new, args), _outputs(old, args)
    diff = float(np.max(np.abs(a - b) / (1.0 + np.abs(b))))
    print(f"| {label} | {c_new:.2f} / {c_old:.2f} | {1e3 * t_new:.2f} | {1e3 * t_old:.2f} | {t_old / t_new:.1f} | {diff:.1e} |",
          flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dims", default="50,100,300,1000")
    a = ap.parse_args(argv)
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    dims = [int(x) for x in a.dims.split(",")]
    print(f"{np.dtype(dtype).name}; {jax.devices()}; minimum CPU time per call over {a.repeats} interleaved repeats "
          f"of programs of {N} calls; first call: compilation wall time, substitution / inverse; *difference*: "
          "largest |a - b| / (1 + |b|) over the outputs")
    print("\n| setup | first call (s) | substitution (ms) | inverse (ms) | speed-up | difference |")
    print("|---|---|---|---|---|---|")
    for d in dims:
        for K in (2, 4):
            compare(f"mixing rule, value + gradient, K = {K}, d = {d}, M = 16", lambda: entropy_program(K, d, dtype),  # noqa: B023
                    a.repeats)
    for d in dims:
        compare(f"SVI step, AutoGaussianMixture(K = 4, full), d = {d}", lambda: svi_program(d, dtype, "mixture"),  # noqa: B023
                a.repeats)
    for d in dims:
        compare(f"log_prob of one draw, value + gradient, K = 4, d = {d}", lambda: log_prob_program(4, d, dtype),  # noqa: B023
                a.repeats)
    print("\n| d | AutoMultivariateNormal + Trace_ELBO step (ms) |\n|---|---|")
    for d in dims:
        fn, args = svi_program(d, dtype, "mvn")
        prog, _ = compiled(fn, args, True)
        print(f"| {d} | {1e3 * timed([(prog, args)], a.repeats)[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
