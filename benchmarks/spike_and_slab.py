"""AutoGaussianMixture with its defaults on spike-and-slab posteriors: a narrow mode inside
a wide one, where the exact posterior is a two-component Gaussian mixture.

Model: ``z ~ (N(0, s^2 I) + N(0, S^2 I)) / 2`` in ``d`` dimensions (a spike of width ``s``
and a slab of width ``S``), ``y ~ N(z, I)`` observed at ``y = ybar 1``. By conjugacy the
posterior is the mixture of ``N(v_c ybar 1, v_c I)``, ``v_c = 1 / (1 / s_c^2 + 1)``, with
weights proportional to ``N(y; 0, (s_c^2 + 1) I)``, and the evidence ``log Z`` is the log of
their sum: a guide with two components can reach it exactly, and ``log Z - ELBO`` is the
KL divergence of the fit from the posterior.

Per case and seed: ``AutoGaussianMixture(model, num_components=2)`` (every other option at its
default) trained by ``TraceEntropy_ELBO()`` with ``Adam(--lr)`` for ``--steps`` steps; the
table gives the number of seeds within 0.01 nats of the evidence, the median and largest gap
``log Z - ELBO`` over seeds (ELBO by ``Trace_ELBO`` with 20,000 particles, standard error
about 0.003), the largest error of the spike's weight, and, for reference, the gap of
AutoMultivariateNormal (``Trace_ELBO``, one seed: a Gaussian cannot be both).

Usage::

    python benchmarks/spike_and_slab.py [--seeds 10] [--steps 3000] [--lr 0.01]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal
from scipy import stats

from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO

#: (name, d, spike sd, slab sd, ybar)
CASES = [
    ("1-D, prior widths 1 : 1000", 1, 0.01, 10.0, 0.5),
    ("1-D, posterior widths 1 : 1000", 1, 0.001, 10.0, 0.5),
    ("1-D, slab mass 0.42", 1, 0.01, 10.0, 2.0),
    ("3-D, slab mass 0.004", 3, 0.01, 10.0, 1.0),
    ("5-D, spike mass 0.5", 5, 0.01, 10.0, 2.15),
    # beyond NEWTON_MAX_DIM = 100 the initialisation has no Newton refinement
    ("150-D, spike mass 0.95", 150, 0.01, 10.0, 2.15),
]


def make_model(d, spike, slab, ybar):
    y = jnp.full(d, ybar)

    def model():
        prior = dist.MixtureSameFamily(
            dist.Categorical(probs=jnp.array([0.5, 0.5])),
            dist.Normal(0.0, jnp.array([[spike], [slab]])).expand([2, d]).to_event(1),
        )
        z = numpyro.sample("z", prior)
        numpyro.sample("y", dist.Normal(z, 1.0).to_event(1), obs=y)

    return model


def posterior(d, spike, slab, ybar):
    """``(log Z, weights (2,))`` of the exact posterior (conjugacy, SciPy densities)."""
    log_evidence = np.array([
        np.log(0.5) + stats.norm.logpdf(np.full(d, ybar), 0.0, np.sqrt(s**2 + 1.0)).sum() for s in (spike, slab)
    ])
    log_z = np.logaddexp(*log_evidence)
    return log_z, np.exp(log_evidence - log_z)


def elbo(model, guide, params, key):
    return -float(Trace_ELBO(num_particles=20_000).loss(key, params, model, guide))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} numpyro {numpyro.__version__} backend {jax.default_backend()} "
          f"float64 {jax.config.jax_enable_x64}; {args.steps} steps of Adam({args.lr}), {args.seeds} seeds")
    print()
    print("| case | d | spike / slab sd | posterior spike weight | within 0.01 nats | median gap | largest gap "
          "| largest weight error | AutoMultivariateNormal gap | time per seed (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, d, spike, slab, ybar in CASES:
        model = make_model(d, spike, slab, ybar)
        log_z, weights = posterior(d, spike, slab, ybar)
        gaps, weight_errors = [], []
        start = time.perf_counter()
        for seed in range(args.seeds):
            guide = AutoGaussianMixture(model, num_components=2)
            svi = SVI(model, guide, numpyro.optim.Adam(args.lr), TraceEntropy_ELBO())
            result = svi.run(jax.random.PRNGKey(seed), args.steps, progress_bar=False)
            gaps.append(log_z - elbo(model, guide, result.params, jax.random.PRNGKey(10_000 + seed)))
            mixture = guide.get_posterior(result.params)
            spike_component = int(np.argmin(np.asarray(mixture.component_stddev[:, 0])))
            weight_errors.append(abs(float(mixture.probs[spike_component]) - weights[0]))
        per_seed = (time.perf_counter() - start) / args.seeds
        mvn = AutoMultivariateNormal(model)
        result = SVI(model, mvn, numpyro.optim.Adam(args.lr), Trace_ELBO()).run(
            jax.random.PRNGKey(0), args.steps, progress_bar=False)
        mvn_gap = log_z - elbo(model, mvn, result.params, jax.random.PRNGKey(1))
        gaps = np.asarray(gaps)
        print(f"| {name} | {d} | {spike} / {slab} | {weights[0]:.3f} | {np.sum(gaps < 0.01)}/{args.seeds} "
              f"| {np.median(gaps):.4f} | {gaps.max():.4f} | {max(weight_errors):.3f} | {mvn_gap:.3f} | {per_seed:.1f} |")


if __name__ == "__main__":
    main()
