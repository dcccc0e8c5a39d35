"""The randomised rule's normal quantile in float32: JAX's ``ndtri`` against the package's
(``_kernels.mixing.normal_quantile_traced``: Giles's single-precision ``erfinv``
polynomials), measured side by side in one process.

Three levels, CPU time (``time.process_time``, median over calls; each call is one compiled
program of ``INNER`` repetitions, divided by ``INNER``), programs timed alternately:

* the quantile alone of ``M x d`` shifted Sobol' points;
* the randomised rule's value and weights' gradient (what ``TraceEntropy_ELBO``'s path
  gradient differentiates), ``K = 4`` diagonal or low-rank (rank 4) components, ``M = 16``;
* the SVI step of ``benchmarks/scale.py --part svi --svi-model logistic`` (AutoGaussianMixture,
  ``K = 4``), and the same step without the entropy term (its rule and the mixture's log
  density at the draws replaced by zeros), whose ratio gives the entropy's share.

Usage::

    python benchmarks/normal_quantile.py [--dims 100,1000] [--covs diag,lowrank] [--calls 41]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax import lax
from numpyro.infer import SVI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale import INNER, _entropy_stubbed, _ScannedSteps, svi_model  # noqa: E402

from numpyro_gmm import AutoGaussianMixture, GaussianMixture, TraceEntropy_ELBO  # noqa: E402
from numpyro_gmm._kernels import mixing  # noqa: E402

PACKAGE = mixing.normal_quantile_traced
QUANTILES = {"ndtri": jax.scipy.special.ndtri, "package": PACKAGE}
M, K = 16, 4


def with_quantile(name, build):
    """``build()`` traced and compiled with the quantile ``name`` in place (``build`` must
    compile ahead of time: ``jax.clear_caches`` drops the programs of plain ``jax.jit``
    functions, which a later call would then trace again with the other quantile)."""
    mixing.normal_quantile_traced = QUANTILES[name]
    try:
        jax.clear_caches()
        return build()
    finally:
        mixing.normal_quantile_traced = PACKAGE


def cpu_per_call(fn, calls):
    out = []
    for _ in range(calls):
        c = time.process_time()
        jax.block_until_ready(fn())
        out.append(time.process_time() - c)
    return out


def alternate(programs, calls):
    """Median CPU ms per inner repetition of each ``name -> fn`` (called alternately)."""
    times = {name: [] for name in programs}
    for _ in range(calls):
        for name, fn in programs.items():
            times[name] += cpu_per_call(fn, 1)
    return {name: 1e3 * float(np.median(t)) / INNER for name, t in times.items()}


def quantile_programs(d):
    u = jnp.asarray(mixing.sobol_points(M, d), jnp.float32)
    shifts = jax.random.uniform(jax.random.PRNGKey(0), (INNER, d))

    def build():
        def body(acc, s):
            return acc + jnp.sum(mixing.rotated_normal_points(u, s)), None

        f = jax.jit(lambda ss: lax.scan(body, jnp.zeros(()), ss)[0]).lower(shifts).compile()
        return lambda: f(shifts)

    return {name: with_quantile(name, build) for name in QUANTILES}


def rule_programs(d, cov):
    rng = np.random.default_rng(0)
    loc = jnp.asarray(rng.normal(size=(K, d)), jnp.float32)
    scale = jnp.asarray(rng.uniform(0.5, 1.5, size=(K, d)), jnp.float32)
    factor = jnp.asarray(rng.normal(size=(K, d, 4)) * 0.3, jnp.float32)

    def entropy(logits, key):
        if cov == "diag":
            mix = GaussianMixture(loc, scale=scale, logits=logits)
        else:
            mix = GaussianMixture(loc, cov_factor=factor, cov_diag=jnp.square(scale), logits=logits)
        return mix.entropy(key=key, num_points=M)

    value_and_grad = jax.value_and_grad(entropy)
    keys = jax.random.split(jax.random.PRNGKey(1), INNER)

    def build():
        def body(acc, k):
            v, g = value_and_grad(jnp.zeros(K), k)
            return acc + v + jnp.sum(g), None

        f = jax.jit(lambda ks: lax.scan(body, jnp.zeros(()), ks)[0]).lower(keys).compile()
        return lambda: f(keys)

    return {name: with_quantile(name, build) for name in QUANTILES}


def step_programs(d, cov):
    model, y = svi_model(d, "logistic")
    guide = AutoGaussianMixture(model, num_components=K, covariance=cov, init_method="spread",
                                **({"rank": 4} if cov == "lowrank" else {}))
    svi = SVI(model, guide, numpyro.optim.Adam(1e-3), TraceEntropy_ELBO())
    state = svi.init(jax.random.PRNGKey(0), y)

    def build(stub=False):
        if stub:
            with _entropy_stubbed():
                steps = _ScannedSteps(svi.update, state, y)
        else:
            steps = _ScannedSteps(svi.update, state, y)
        steps(y)
        return lambda: steps(y)

    programs = {name: with_quantile(name, build) for name in QUANTILES}
    programs["without entropy"] = build(stub=True)
    return programs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dims", default="100,1000")
    p.add_argument("--covs", default="diag,lowrank")
    p.add_argument("--calls", type=int, default=41)
    a = p.parse_args(argv)
    print(f"devices: {jax.devices()}; float32; CPU ms per call (median of {a.calls}, programs of {INNER} calls "
          f"timed alternately); K = {K}, M = {M}; 2 CPU cores\n")
    print("| d | covariance | what | ndtri | package | ratio | step without entropy | entropy share (ndtri / package) |")
    print("|---|---|---|---|---|---|---|---|")
    for d in map(int, a.dims.split(",")):
        t = alternate(quantile_programs(d), a.calls)
        print(f"| {d} | - | quantile of M d points | {t['ndtri']:.4f} | {t['package']:.4f} | "
              f"{t['package'] / t['ndtri']:.2f} | | |", flush=True)
        for cov in a.covs.split(","):
            t = alternate(rule_programs(d, cov), a.calls)
            print(f"| {d} | {cov} | rule: value + weights' gradient | {t['ndtri']:.4f} | {t['package']:.4f} | "
                  f"{t['package'] / t['ndtri']:.2f} | | |", flush=True)
            t = alternate(step_programs(d, cov), a.calls)
            z = t["without entropy"]
            print(f"| {d} | {cov} | SVI step, logistic model | {t['ndtri']:.3f} | {t['package']:.3f} | "
                  f"{t['package'] / t['ndtri']:.2f} | {z:.3f} | {100 * (1 - z / t['ndtri']):.0f}% / "
                  f"{100 * (1 - z / t['package']):.0f}% |", flush=True)


if __name__ == "__main__":
    main()
