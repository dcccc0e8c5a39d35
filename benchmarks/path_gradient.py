"""``TraceEntropy_ELBO(path_gradient=...)``: how far SVI takes AutoGaussianMixture on Gaussian
targets, whose log-evidence is 0, with the components' gradient by the path derivative
(``True``, the default) or by the model terms plus the entropy approximation's gradient
(``False``).

Targets: ``x ~ N(0, I_d)`` from the default initialisation (nearly exact there: the Laplace
fits of a Gaussian), and ``x ~ N(m, S)``, ``S`` an AR(1) correlation (``rho = 0.7``) with
standard deviations from 0.5 to 2, from ``init_method="spread"`` (the correlations to be
learnt). ``Adam(0.02)``, one particle; the ELBO (a lower bound of 0, the gap being the KL
divergence from the guide to the target) by ``TraceEntropy_ELBO(num_particles=256)`` every
1000 steps; mean over the seeds and the lowest final value.

Usage::

    python benchmarks/path_gradient.py [--steps 3000] [--seeds 3] [--cases standard:100,standard:500,ar1:10,ar1:50]
        [--covariance full]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import lax
from numpyro.infer import SVI
from numpyro.optim import Adam

from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO

CHECKPOINT = 1000


def target(kind: str, d: int):
    """``(model, init_method)`` of a Gaussian target of dimension ``d``."""
    if kind == "standard":
        def model():
            numpyro.sample("x", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        return model, "fits"
    sd = np.linspace(0.5, 2.0, d)
    cov = 0.7 ** np.abs(np.subtract.outer(np.arange(d), np.arange(d))) * np.outer(sd, sd)
    mean = np.linspace(-1.0, 1.0, d)

    def model():
        numpyro.sample("x", dist.MultivariateNormal(jnp.asarray(mean, jnp.float32),
                                                    covariance_matrix=jnp.asarray(cov, jnp.float32)))
    return model, "spread"


def elbo_path(kind, d, covariance, path, seed, steps):
    """ELBO (256 particles) at steps 0, CHECKPOINT, 2 CHECKPOINT, ..., ``steps``."""
    model, init_method = target(kind, d)
    guide = AutoGaussianMixture(model, covariance=covariance, init_method=init_method)
    svi = SVI(model, guide, Adam(0.02), TraceEntropy_ELBO(path_gradient=path))
    evaluate = TraceEntropy_ELBO(num_particles=256)
    state = svi.init(jax.random.PRNGKey(seed))
    run = jax.jit(lambda s: lax.scan(lambda s, _: (svi.update(s)[0], None), s, None, length=CHECKPOINT)[0])
    out = []
    for i in range(steps // CHECKPOINT + 1):
        if i:
            state = run(state)
        out.append(-float(evaluate.loss(jax.random.PRNGKey(10_000 + seed), svi.get_params(state), model, guide)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cases", default="standard:100,standard:500,ar1:10,ar1:50")
    ap.add_argument("--covariance", default="full")
    args = ap.parse_args(argv)
    marks = list(range(0, args.steps + 1, CHECKPOINT))
    print(f"float32, Adam(0.02), AutoGaussianMixture(covariance={args.covariance!r}), {args.seeds} seeds; "
          "ELBO (log Z = 0) by 256 particles, mean over the seeds\n")
    print("| target | d | init | path_gradient | " + " | ".join(f"step {m}" for m in marks) + " | lowest final |")
    print("|---|---|---|---|" + "---|" * (len(marks) + 1))
    for case in args.cases.split(","):
        kind, d = case.split(":")
        for path in (False, True):
            runs = np.array([elbo_path(kind, int(d), args.covariance, path, s, args.steps) for s in range(args.seeds)])
            init = "fits" if kind == "standard" else "spread"
            print(f"| {kind} | {d} | {init} | {path} | " + " | ".join(f"{v:.3f}" for v in runs.mean(0))
                  + f" | {runs[:, -1].min():.3f} |", flush=True)


if __name__ == "__main__":
    main()
