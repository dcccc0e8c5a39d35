"""A posterior with a light mode: how far SVI takes AutoGaussianMixture's weights from the
initial weights of its initialisation (step 5 of its docstring: those that maximise the ELBO
of the initial components) against equal initial weights (the start before, measured in the
same run by a subclass whose initial logits are zeros).

Target: ``z`` with the density of ``(1 - m) N(-3, 0.5^2) + m N(3, 0.5^2)`` (the light mode's
mass ``m`` exact, closed form) beside ``d - 1`` standard normal coordinates; ``K = 2``
(one component per mode), ``TraceEntropy_ELBO()``, ``Adam(lr)``. Reported: the weight of
the component on the light mode at the start and after each checkpoint, its error against
``m`` (median and largest over the seeds); all seeds of one setting in one ``jit(vmap)``.

Usage::

    python benchmarks/light_mode.py [--masses 0.1,0.01,0.003] [--lr 0.01] [--steps 300,1000,3000]
        [--seeds 5] [--dim 3] [--covariance full]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import lax
from numpyro import handlers
from numpyro.infer import SVI

from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO


class EqualStart(AutoGaussianMixture):
    """The guide with the initial weights equal (the start before step 5)."""

    def _initial_logits(self, potential, budget, locs, scales, factor, at_mode):
        return jnp.zeros(locs.shape[0], locs.dtype)


def light_mode_model(mass: float, d: int):
    def model():
        z = numpyro.sample("z", dist.Normal(0.0, 10.0))
        heavy = jnp.log1p(-mass) + dist.Normal(-3.0, 0.5).log_prob(z)
        light = jnp.log(mass) + dist.Normal(3.0, 0.5).log_prob(z)
        numpyro.factor("mixture", jnp.logaddexp(heavy, light) - dist.Normal(0.0, 10.0).log_prob(z))
        if d > 1:
            numpyro.sample("x", dist.Normal(0.0, 1.0).expand([d - 1]).to_event(1))
    return model


def light_weights(guide_class, mass, d, covariance, lr, checkpoints, seeds):
    """``(seeds, 1 + len(checkpoints))``: the light mode's weight at the start and after each
    checkpoint (the weights of the components whose mean of ``z`` is above 0)."""
    model = light_mode_model(mass, d)
    guide = guide_class(model, num_components=2, covariance=covariance)
    svi = SVI(model, guide, numpyro.optim.Adam(lr), TraceEntropy_ELBO())
    with handlers.block(), handlers.seed(rng_seed=0):
        guide()  # the model's structure once, outside the vmap

    def light(state):
        params = svi.get_params(state)
        locs = guide.get_posterior(params).loc[:, 0]
        return jnp.sum(jnp.where(locs > 0, jax.nn.softmax(params["auto_logits"]), 0.0))

    def one(key):
        init_key, run_key = jax.random.split(key)
        state = svi.init(init_key)._replace(rng_key=run_key)
        out, done = [light(state)], 0
        for c in checkpoints:
            state, _ = lax.scan(lambda s, _: (svi.update(s)[0], None), state, None, length=c - done)
            out.append(light(state))
            done = c
        return jnp.stack(out)

    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(seeds))
    return np.asarray(jax.jit(jax.vmap(one))(keys), np.float64)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--masses", default="0.1,0.01,0.003")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", default="300,1000,3000", help="checkpoints (cumulative steps)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--dim", type=int, default=3)
    parser.add_argument("--covariance", default="full", choices=["full", "diag", "lowrank"])
    args = parser.parse_args()
    checkpoints = [int(s) for s in args.steps.split(",")]
    print(f"jax {jax.__version__} numpyro {numpyro.__version__} float64 {jax.config.jax_enable_x64}; d = {args.dim}, "
          f"K = 2, {args.covariance}, Adam({args.lr}), {args.seeds} seeds; the light mode's weight, median "
          "(largest error) over seeds")
    head = " | ".join(["start"] + [f"{c} steps" for c in checkpoints])
    print(f"| light mass | initial weights | {head} |")
    print("|---|---|" + "---|" * (1 + len(checkpoints)))
    for mass in (float(m) for m in args.masses.split(",")):
        for name, cls in (("equal", EqualStart), ("the ELBO's (default)", AutoGaussianMixture)):
            w = light_weights(cls, mass, args.dim, args.covariance, args.lr, checkpoints, args.seeds)
            err = np.max(np.abs(w - mass), axis=0)
            cells = " | ".join(f"{np.median(w[:, j]):.4f} ({err[j]:.4f})" for j in range(w.shape[1]))
            print(f"| {mass} | {name} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
