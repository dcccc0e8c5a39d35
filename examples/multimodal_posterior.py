"""A bimodal posterior: a Gaussian-mixture guide against Gaussian guides, with NUTS as the
reference, compared in ArviZ.

The model observes ``y_i ~ Normal(theta**2, sigma)``: the data determine ``theta**2``, so
the posterior of ``theta`` has two modes, at ``+sqrt(mean y)`` and ``-sqrt(mean y)``, of
equal mass (the prior is symmetric). It is fitted with

* :class:`~numpyro_gmm.AutoGaussianMixture` with its defaults (only ``num_components=2``
  set; the default initialisation starts the components on different modes, found by
  short independent fits) and :class:`~numpyro_gmm.TraceEntropy_ELBO`;
* NumPyro's ``AutoNormal`` and ``AutoMultivariateNormal`` with ``Trace_ELBO``;
* NUTS, the reference. NUTS chains do not cross between modes this far apart, so half of
  the chains start in each mode (by the symmetry of the model the two modes have equal
  mass, so pooling the chains gives the right weights).

Each result becomes an ArviZ ``InferenceData`` (``az.from_numpyro`` for NUTS,
``az.from_dict`` for the guides' posterior draws); ``az.summary`` and ``az.plot_pair`` /
``az.plot_posterior`` compare them. The mixture guide keeps both modes; the Gaussian guides
keep one.

Run::

    python examples/multimodal_posterior.py
    CI=1 python examples/multimodal_posterior.py      # fewer steps and draws

Writes ``multimodal_posterior.png`` to ``--out`` (default ``examples/figures``).
"""

from __future__ import annotations

import argparse
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal, AutoNormal

from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO

with warnings.catch_warnings():  # arviz announces its refactor with a FutureWarning on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

HERE = os.path.dirname(os.path.abspath(__file__))
VAR_NAMES = ["theta", "sigma"]


def model(y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta**2, sigma), obs=y)


def make_data(n: int = 20, theta: float = 1.5, sigma: float = 1.0, seed: int = 0):
    return theta**2 + sigma * jax.random.normal(jax.random.PRNGKey(seed), (n,))


def fit_guide(guide, loss, y, num_steps: int, lr: float, seed: int):
    svi = SVI(model, guide, numpyro.optim.Adam(lr), loss)
    result = svi.run(jax.random.PRNGKey(seed), num_steps, y, progress_bar=False)
    return result.params, np.asarray(result.losses)


def guide_idata(guide, params, num_draws: int, seed: int):
    """The guide's posterior draws as InferenceData (one chain)."""
    draws = guide.sample_posterior(jax.random.PRNGKey(seed), params, sample_shape=(num_draws,))
    return az.from_dict(posterior={k: np.asarray(draws[k])[None] for k in VAR_NAMES})


def run_nuts(y, num_warmup: int, num_samples: int, num_chains: int = 4, seed: int = 0):
    """NUTS with half of the chains started at theta > 0 and half at theta < 0."""
    signs = jnp.where(jnp.arange(num_chains) % 2 == 0, 1.0, -1.0)
    init = {"theta": signs * jnp.sqrt(jnp.abs(jnp.mean(y))), "sigma": jnp.ones(num_chains)}
    mcmc = MCMC(NUTS(model), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), y, init_params=init)
    return mcmc


def run(num_steps=3000, num_draws=4000, num_warmup=500, num_samples=1000, seed=0):
    """Fit all four; return ``{name: InferenceData}`` (NUTS first) and the SVI losses."""
    y = make_data(seed=seed)
    idata, losses = {}, {}
    mcmc = run_nuts(y, num_warmup, num_samples, seed=seed)
    idata["NUTS (reference)"] = az.from_numpyro(mcmc)

    mixture = AutoGaussianMixture(model, num_components=2)  # defaults: nothing tuned for this model
    params, losses["mixture"] = fit_guide(mixture, TraceEntropy_ELBO(), y, num_steps, 0.02, seed)
    idata["AutoGaussianMixture"] = guide_idata(mixture, params, num_draws, seed + 1)
    q = mixture.get_posterior(params)
    print("AutoGaussianMixture weights:", np.round(np.asarray(q.probs), 3),
          " component means (unconstrained theta, log sigma):", np.round(np.asarray(q.loc), 3).tolist())

    mvn = AutoMultivariateNormal(model)
    params, losses["mvn"] = fit_guide(mvn, Trace_ELBO(), y, num_steps, 0.02, seed)
    idata["AutoMultivariateNormal"] = guide_idata(mvn, params, num_draws, seed + 2)

    normal = AutoNormal(model)
    params, losses["normal"] = fit_guide(normal, Trace_ELBO(), y, num_steps, 0.02, seed)
    idata["AutoNormal"] = guide_idata(normal, params, num_draws, seed + 3)
    return idata, losses


def summaries(idata):
    """``az.summary`` of each fit (one table, a row per method and variable) and the
    posterior mass of ``theta > 0``."""
    import pandas as pd

    tables = []
    for name, data in idata.items():
        table = az.summary(data, var_names=VAR_NAMES, kind="stats", round_to=3)
        theta = np.asarray(data.posterior["theta"]).ravel()
        table["P(theta > 0)"] = [float(np.mean(theta > 0)), np.nan]
        table.index = pd.MultiIndex.from_product([[name], table.index])
        tables.append(table)
    return pd.concat(tables)


def make_figure(idata):
    """Top: ``az.plot_pair`` of (theta, sigma) per method. Bottom: ``az.plot_posterior`` of
    theta per method, on a common axis."""
    import matplotlib.pyplot as plt

    names = list(idata)
    fig, axes = plt.subplots(2, len(names), figsize=(3.6 * len(names), 6.6))
    colors = ["k", "tab:blue", "tab:orange", "tab:red"]
    for j, name in enumerate(names):
        az.plot_pair(idata[name], var_names=VAR_NAMES, kind="scatter", ax=axes[0, j], textsize=9,
                     scatter_kwargs=dict(alpha=0.15, s=2, color=colors[j]))
        axes[0, j].set_title(name, fontsize=10)
        axes[0, j].set_xlim(-2.6, 2.6)
        axes[0, j].set_ylim(0.4, 2.2)
        az.plot_posterior(idata[name], var_names=["theta"], ax=axes[1, j], hdi_prob="hide",
                          point_estimate=None, color=colors[j], textsize=9)
        axes[1, j].set_xlim(-2.6, 2.6)
        theta = np.asarray(idata[name].posterior["theta"]).ravel()
        axes[1, j].set_title(f"theta: P(theta > 0) = {np.mean(theta > 0):.2f}", fontsize=10)
    fig.suptitle("Posterior of y ~ Normal(theta^2, sigma): the mixture guide keeps both modes, "
                 "the Gaussian guides one", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def main(argv=None):
    smoke_test = "CI" in os.environ
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-steps", type=int, default=1500 if smoke_test else 4000, help="SVI steps")
    parser.add_argument("--num-draws", type=int, default=2000 if smoke_test else 4000, help="draws per guide")
    parser.add_argument("--num-warmup", type=int, default=300 if smoke_test else 1000)
    parser.add_argument("--num-samples", type=int, default=500 if smoke_test else 1000, help="NUTS draws per chain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "figures"), help="folder for the figure")
    args = parser.parse_args(argv)

    idata, _ = run(args.num_steps, args.num_draws, args.num_warmup, args.num_samples, args.seed)
    print(summaries(idata).to_string())

    import matplotlib

    matplotlib.use("Agg")
    fig = make_figure(idata)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "multimodal_posterior.png")
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")

    # the claim of this example: the mixture guide puts mass on both modes
    p_pos = float(np.mean(np.asarray(idata["AutoGaussianMixture"].posterior["theta"]) > 0))
    if not 0.2 < p_pos < 0.8:
        raise SystemExit(f"AutoGaussianMixture found one mode only: P(theta > 0) = {p_pos:.3f}")


if __name__ == "__main__":
    main()
