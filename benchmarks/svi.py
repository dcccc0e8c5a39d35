"""SVI step time and ELBO-gradient variance: TraceEntropy_ELBO against Trace_ELBO.

Both estimators train the same AutoGaussianMixture guide and evaluate the model the same
number of times per step: TraceEntropy_ELBO with P particles runs the model K * P times
(one draw from every component per particle), so Trace_ELBO gets K * P particles.

For each model the guide parameters are first trained for a few hundred TraceEntropy_ELBO
steps (so they sit somewhere realistic), then the logits are reset to zero (equal weights,
where the true gradient in the logits is clearly non-zero). At those parameters:

* step time: mean wall time of a jitted ``svi.update`` (after one warm-up call);
* entropy ms: wall time of the jitted gradient of ``GaussianMixture.entropy()`` alone
  (part of every TraceEntropy_ELBO step);
* gradient: ``R`` independent single-step gradient estimates of the loss with respect to
  the logits and the component means. The table gives the mean of the logits gradient,
  the reference logits gradient of the exact ELBO (``TraceGraph_ELBO``, unbiased through
  its score-function term, averaged over ``10 R`` estimates; its standard error is
  printed), the mean squared error of one logits-gradient estimate against that reference,
  and the total variance (sum over coordinates) of each block, with ratios against
  TraceEntropy_ELBO. Trace_ELBO's logits gradient has mean zero whatever the truth (the
  component index is sampled without a score function; see NUMPYRO.md), so its variance
  alone flatters it: compare the MSE. TraceGraph_ELBO (also ``K * P`` particles) is
  unbiased but treats the whole mixture draw with a score function.

Usage: ``python benchmarks/svi.py [--particles P] [--reps R] [--steps N] [--x64]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO, TraceGraph_ELBO

from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO


def bimodal_1d():
    """z ~ N(0.7, 2), y_i ~ N(z^2, 1): two modes near +-2 (masses about 0.33 / 0.67)."""

    def model(y):
        z = numpyro.sample("z", dist.Normal(0.7, 2.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(z**2, 1.0), obs=y)

    return model, (jnp.full(5, 4.0),), 2, {"z": 0.0}


def four_modes_2d():
    """z in R^2, y_i ~ N(z_j^2, 1) per coordinate: four modes near (+-2, +-2)."""

    def model(y):
        z = numpyro.sample("z", dist.Normal(jnp.array([0.5, -0.3]), 2.0).to_event(1))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(z**2, 1.0).to_event(1), obs=y)

    return model, (jnp.full((5, 2), 4.0),), 4, {"z": jnp.zeros(2)}


def logistic_5d():
    """Bayesian logistic regression, 5 coefficients, 200 observations (unimodal)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5))
    beta = np.array([1.0, -0.5, 0.3, 0.0, 2.0])
    y = (rng.random(200) < 1 / (1 + np.exp(-X @ beta))).astype(np.float32)

    def model(X, y):
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([5]).to_event(1))
        with numpyro.plate("n", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ b), obs=y)

    return model, (jnp.asarray(X), jnp.asarray(y)), 3, {"b": jnp.zeros(5)}


MODELS = {"bimodal-1d": bimodal_1d, "four-modes-2d": four_modes_2d, "logistic-5d": logistic_5d}


def step_time(svi, state, args, n_steps):
    update = jax.jit(svi.update)
    state, loss = update(state, *args)  # compile
    jax.block_until_ready(loss)
    t0 = time.perf_counter()
    for _ in range(n_steps):
        state, loss = update(state, *args)
    jax.block_until_ready(loss)
    return (time.perf_counter() - t0) / n_steps


def entropy_time(guide, params, n_calls=50):
    def h(p):
        return guide.get_posterior(p).entropy()

    g = jax.jit(jax.grad(h))
    jax.block_until_ready(g(params))
    t0 = time.perf_counter()
    for _ in range(n_calls):
        out = g(params)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / n_calls


def gradient_stats(loss, params, model, guide, args, reps, key):
    names = ("auto_logits", "auto_locs_offset")

    def one(k):
        def f(sub):
            return loss.loss(k, {**params, **sub}, model, guide, *args)

        return jax.grad(f)({n: params[n] for n in names})

    grads = jax.jit(jax.vmap(one))(jax.random.split(key, reps))
    out = {}
    for n in names:
        g = np.asarray(grads[n], np.float64).reshape(reps, -1)
        out[n] = (g.mean(0), g.var(0, ddof=1).sum(), g)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--particles", type=int, default=1, help="TraceEntropy_ELBO particles P")
    parser.add_argument("--reps", type=int, default=2000, help="gradient estimates per estimator")
    parser.add_argument("--steps", type=int, default=200, help="timed SVI steps per estimator")
    parser.add_argument("--train", type=int, default=300, help="TraceEntropy_ELBO steps before measuring")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--order", type=int, default=None, help="guide entropy_order (default: the estimator's)")
    parser.add_argument("--x64", action="store_true")
    args = parser.parse_args(argv)
    if args.x64:
        jax.config.update("jax_enable_x64", True)

    rows = []
    for name in args.models:
        model, model_args, K, init = MODELS[name]()
        guide = AutoGaussianMixture(
            model, num_components=K, init_loc_fn=numpyro.infer.init_to_value(values=init), entropy_order=args.order
        )
        optim = numpyro.optim.Adam(0.05)
        P = args.particles
        svi_e = SVI(model, guide, optim, TraceEntropy_ELBO(num_particles=P))
        res = svi_e.run(jax.random.PRNGKey(0), args.train, *model_args, progress_bar=False)
        params = dict(res.params)
        params["auto_logits"] = jnp.zeros_like(params["auto_logits"])

        estimators = {
            f"TraceEntropy_ELBO(P={P})": TraceEntropy_ELBO(num_particles=P),
            f"Trace_ELBO(P={K * P})": Trace_ELBO(num_particles=K * P),
            f"TraceGraph_ELBO(P={K * P})": TraceGraph_ELBO(num_particles=K * P),
        }
        ref = gradient_stats(
            TraceGraph_ELBO(num_particles=K * P), params, model, guide, model_args, 10 * args.reps,
            jax.random.PRNGKey(3),
        )["auto_logits"]
        ref_mean, ref_se = ref[0], np.sqrt(ref[1] / ref[2].shape[-1] / ref[2].shape[0])
        t_entropy = entropy_time(guide, params)
        stats = {}
        for label, loss in estimators.items():
            svi = SVI(model, guide, optim, loss)
            state = svi.init(jax.random.PRNGKey(1), *model_args, init_params=params)
            t = step_time(svi, state, model_args, args.steps)
            g = gradient_stats(loss, params, model, guide, model_args, args.reps, jax.random.PRNGKey(2))
            mse = np.mean(np.sum((g["auto_logits"][2] - ref_mean) ** 2, axis=-1))
            stats[label] = (t, g, mse)
        te, ge, mse_e = next(iter(stats.values()))
        for i, (label, (t, g, mse)) in enumerate(stats.items()):
            rows.append(
                (
                    name,
                    f"K={K} d={guide.latent_dim}",
                    label,
                    K * P,
                    t * 1e3,
                    t / te,
                    f"{t_entropy * 1e3:.3f}" if i == 0 else "",
                    np.array2string(g["auto_logits"][0], precision=3, suppress_small=True),
                    np.array2string(ref_mean, precision=3, suppress_small=True) + f" (se {ref_se:.2g})"
                    if i == 0
                    else "",
                    mse,
                    mse / mse_e,
                    g["auto_logits"][1],
                    g["auto_logits"][1] / ge["auto_logits"][1],
                    g["auto_locs_offset"][1],
                    g["auto_locs_offset"][1] / ge["auto_locs_offset"][1],
                )
            )

    header = (
        "model", "guide", "estimator", "model evals/step", "step ms", "time ratio", "entropy ms",
        "mean grad logits", "reference (TraceGraph, 10R)", "MSE logits", "MSE ratio",
        "var logits", "var ratio", "var locs", "var ratio",
    )
    fmt = (
        "| {} | {} | {} | {} | {:.3f} | {:.2f} | {} | {} | {} | {:.3g} | {:.3g} | {:.3g} | {:.3g} "
        "| {:.3g} | {:.3g} |"
    )
    print(f"jax {jax.__version__}, numpyro {numpyro.__version__}, {jax.devices()[0].platform}, "
          f"{'float64' if args.x64 else 'float32'}, entropy_order={args.order or 'default'}, "
          f"P={args.particles}, reps={args.reps}, steps={args.steps}, train={args.train}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print(fmt.format(*r))


if __name__ == "__main__":
    main()
