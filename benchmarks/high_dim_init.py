"""AutoGaussianMixture's initialisation beyond ``NEWTON_MAX_DIM = 100`` latent dimensions:
the Newton-CG refinement (the default up to ``NEWTON_CG_MAX_DIM = 10,000``; preconditioned
by the Hessian at the best fit up to ``DENSE_PRECONDITIONER_MAX_DIM = 4000``, by its
diagonal blocks of 256 beyond) against the same guide without a refinement (``init_newton_steps=0``,
the initialisation at these sizes before the Newton-CG refinement) and
AutoMultivariateNormal (``--covariance lowrank``: the guides with low-rank covariances and
AutoLowRankMultivariateNormal), in one run. ``--model hierarchical``: a hierarchical model
with ``d - 1`` groups and measurement errors on scales ``10^-2 .. 10`` (Gaussian posterior,
evidence in closed form; :func:`hierarchical`). ``--model random_walk``: a latent
``GaussianRandomWalk`` of ``d`` steps observed with noise (a strongly correlated Gaussian
posterior, evidence in closed form; :func:`random_walk`).

Model: Bayesian linear regression ``b ~ N(0, I_d)``, ``y ~ N(X b, I)`` on ``2 d`` rows of
correlated covariates on scales ``10^-1 .. 10^2.5`` (posterior standard deviations about
``3e-4 .. 0.6``; float32 unless ``JAX_ENABLE_X64=1``). The posterior is Gaussian and the
evidence ``log Z`` is in closed form (SciPy), so ``log Z - ELBO`` is the fit's KL
divergence from the posterior; full covariances can reach 0, low-rank ones not (for them
the table gives the best diagonal Gaussian's gap, closed form). Per dimension and method,
over seeds: *init (s)*, the first ``SVI.init`` of a new guide (compilation and run; the
guide's eager path); the gap at the start and after ``--steps`` steps of ``Adam(--lr)``
(median over seeds, ELBO by ``Trace_ELBO`` with 2000 particles, standard error below 0.01
where the gap is below 1); *step (ms)*, the median compiled ``SVI.update``.

Usage::

    python benchmarks/high_dim_init.py [--dims 150,300,1000] [--seeds 3] [--steps 3000] [--lr 0.01]
                                       [--covariance full|lowrank] [--model regression|hierarchical|random_walk]
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
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal
from scipy import stats

from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO
from numpyro_gmm.autoguide import DENSE_PRECONDITIONER_MAX_DIM, NEWTON_CG_MAX_DIM, NEWTON_MAX_DIM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import svi_step_times  # noqa: E402


def regression(d, seed=1):
    """``(model, log_z, mean_field_gap)``: the badly scaled regression, its evidence and the
    smallest gap of a diagonal Gaussian, ``(sum_i log H_ii - log det H) / 2`` (closed form,
    ``H`` the posterior precision): what a low-rank guide's start from mean-field fits can
    reach, and an upper bound of its optimum."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(2 * d, d)) @ (np.eye(d) + 0.3 * rng.normal(size=(d, d)) / np.sqrt(d))
    X = X * 10 ** rng.uniform(-1, 2.5, size=d)
    y = X @ rng.normal(size=d) + rng.normal(size=2 * d)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def model():
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        numpyro.sample("y", dist.Normal(Xj @ b, 1.0).to_event(1), obs=yj)

    log_z = stats.multivariate_normal(np.zeros(2 * d), X @ X.T + np.eye(2 * d)).logpdf(y)
    H = X.T @ X + np.eye(d)
    return model, float(log_z), 0.5 * (np.sum(np.log(np.diag(H))) - np.linalg.slogdet(H)[1])


def hierarchical(d, seed=0, tau=2.0):
    """``(model, log_z, mean_field_gap)``: ``mu ~ N(0, 10)``, ``theta_j ~ N(mu, tau)``,
    ``y_j ~ N(theta_j, sigma_j)`` for ``J = d - 1`` groups with measurement errors
    ``sigma_j`` on scales ``10^-2 .. 10`` (``tau = 2`` known: the posterior is Gaussian, with
    standard deviations about ``0.01 .. 2``); the evidence and the best diagonal Gaussian's
    gap in closed form (the marginal covariance ``diag(tau^2 + sigma^2) + 100 1 1^T`` and the
    posterior precision, an arrow matrix, by their rank-one structure)."""
    J = d - 1
    rng = np.random.default_rng(seed)
    sigma = 10 ** rng.uniform(-2, 1, J)
    y = 3.0 + tau * rng.normal(size=J) + sigma * rng.normal(size=J)
    sj, yj = jnp.asarray(sigma), jnp.asarray(y)

    def model():
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("J", J):
            theta = numpyro.sample("theta", dist.Normal(mu, tau))
            numpyro.sample("y", dist.Normal(theta, sj), obs=yj)

    a = tau**2 + sigma**2  # log N(y; 0, diag(a) + 100 1 1^T), by the determinant lemma and Woodbury
    c = 1.0 + 100.0 * np.sum(1 / a)
    log_z = -0.5 * (J * np.log(2 * np.pi) + np.sum(np.log(a)) + np.log(c)
                    + np.sum(y**2 / a) - 100.0 * np.sum(y / a) ** 2 / c)
    h = 1 / tau**2 + 1 / sigma**2  # precision: mu's entry, the thetas' diagonal, -1/tau^2 between them
    h_mu = 1 / 100.0 + J / tau**2
    log_det = np.sum(np.log(h)) + np.log(h_mu - np.sum(1 / (tau**4 * h)))
    return model, float(log_z), 0.5 * (np.log(h_mu) + np.sum(np.log(h)) - log_det)


def random_walk(d, seed=0, step_sd=0.02, noise_sd=1.0):
    """``(model, log_z, mean_field_gap)``: a latent random walk of ``d`` steps,
    ``x ~ GaussianRandomWalk(step_sd)``, observed with noise, ``y_t ~ N(x_t, noise_sd)`` (the
    local-level model; the latent field of a stochastic-volatility model). Its posterior is
    Gaussian with a tridiagonal precision ``H = D^T D / step_sd^2 + I / noise_sd^2`` (``D`` the
    first differences), strongly correlated (correlation length about ``noise_sd / step_sd``
    steps; condition number about ``4 noise_sd^2 / step_sd^2``), with a constant diagonal,
    so a diagonal preconditioner does nothing for it. Evidence and the best diagonal
    Gaussian's gap in closed form (``log Z = log p(y, m) + d/2 log 2 pi - log det H / 2`` at
    the posterior mean ``m``, exact for a Gaussian posterior; banded Cholesky)."""
    from scipy import linalg

    rng = np.random.default_rng(seed)
    x = np.cumsum(step_sd * rng.normal(size=d))
    y = x + noise_sd * rng.normal(size=d)
    yj = jnp.asarray(y)

    def model():
        x = numpyro.sample("x", dist.GaussianRandomWalk(step_sd, num_steps=d))
        numpyro.sample("y", dist.Normal(x, noise_sd).to_event(1), obs=yj)

    upper = np.zeros((2, d))  # H in upper banded form: row 0 the superdiagonal, row 1 the diagonal
    upper[0, 1:] = -1 / step_sd**2
    upper[1, :-1] = 2 / step_sd**2
    upper[1, -1] = 1 / step_sd**2
    upper[1] += 1 / noise_sd**2
    mean = linalg.solveh_banded(upper, y / noise_sd**2)
    log_det = 2 * np.sum(np.log(linalg.cholesky_banded(upper)[1]))
    increments = np.diff(mean, prepend=0.0)
    log_joint = (stats.norm(0, step_sd).logpdf(increments).sum()
                 + stats.norm(mean, noise_sd).logpdf(y).sum())
    log_z = log_joint + 0.5 * d * np.log(2 * np.pi) - 0.5 * log_det
    return model, float(log_z), 0.5 * (np.sum(np.log(upper[1])) - log_det)


MODELS = {
    "regression": regression,
    "hierarchical": hierarchical,
    "random_walk": random_walk,
}


def warm_up():
    numpyro.sample("x", dist.Normal(0.0, 1.0))


METHODS = {
    "full": {
        "AutoGaussianMixture (K = 2)": (lambda m: AutoGaussianMixture(m, num_components=2), TraceEntropy_ELBO),
        "same, init_newton_steps=0": (lambda m: AutoGaussianMixture(m, num_components=2, init_newton_steps=0),
                                      TraceEntropy_ELBO),
        "AutoMultivariateNormal": (AutoMultivariateNormal, Trace_ELBO),
    },
    "lowrank": {
        "AutoGaussianMixture (K = 2, lowrank)": (
            lambda m: AutoGaussianMixture(m, num_components=2, covariance="lowrank"), TraceEntropy_ELBO),
        "same, init_newton_steps=0": (
            lambda m: AutoGaussianMixture(m, num_components=2, covariance="lowrank", init_newton_steps=0),
            TraceEntropy_ELBO),
        "AutoLowRankMultivariateNormal": (AutoLowRankMultivariateNormal, Trace_ELBO),
    },
}


def gap(model, guide, params, log_z, key):
    return log_z + float(Trace_ELBO(num_particles=2000).loss(key, params, model, guide))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", default="150,300,1000")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--covariance", choices=sorted(METHODS), default="full",
                        help="the guides' family: full covariances (AutoMultivariateNormal) or low rank "
                             "(AutoLowRankMultivariateNormal), for thousands of dimensions")
    parser.add_argument("--model", choices=sorted(MODELS), default="regression",
                        help="the badly scaled regression, a hierarchical model with d - 1 groups, or a "
                             "random walk of d steps")
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} numpyro {numpyro.__version__} backend {jax.default_backend()} "
          f"float64 {jax.config.jax_enable_x64}; NEWTON_MAX_DIM {NEWTON_MAX_DIM}, DENSE_PRECONDITIONER_MAX_DIM "
          f"{DENSE_PRECONDITIONER_MAX_DIM}, NEWTON_CG_MAX_DIM {NEWTON_CG_MAX_DIM}; {args.steps} steps of "
          f"Adam({args.lr}), {args.seeds} seeds; covariance {args.covariance}; model {args.model}")
    print()
    print("| d | method | init (s) | gap at start | gap after steps | largest gap after | step (ms) |")
    print("|---|---|---|---|---|---|---|")
    for d in (int(v) for v in args.dims.split(",")):
        model, log_z, diagonal_gap = MODELS[args.model](d)
        if args.covariance == "lowrank":
            print(f"| {d} | (the best diagonal Gaussian) | | {diagonal_gap:.4g} | | | |")
        # warm-up, untimed, on another model: the process's first SVI.init pays for set-up
        # that no method owns
        SVI(warm_up, AutoMultivariateNormal(warm_up), numpyro.optim.Adam(args.lr), Trace_ELBO()).init(
            jax.random.PRNGKey(0))
        for name, (make_guide, make_loss) in METHODS[args.covariance].items():
            inits, starts, ends = [], [], []
            for seed in range(args.seeds):
                guide = make_guide(model)
                svi = SVI(model, guide, numpyro.optim.Adam(args.lr), make_loss())
                t0 = time.perf_counter()
                state = svi.init(jax.random.PRNGKey(seed))
                jax.block_until_ready(state)
                inits.append(time.perf_counter() - t0)
                starts.append(gap(model, guide, svi.get_params(state), log_z, jax.random.PRNGKey(100 + seed)))
                result = svi.run(jax.random.PRNGKey(seed), args.steps, progress_bar=False, init_state=state)
                ends.append(gap(model, guide, result.params, log_z, jax.random.PRNGKey(200 + seed)))
            step = 1e3 * svi_step_times(svi, state)[1]
            print(f"| {d} | {name} | {np.median(inits):.1f} | {np.median(starts):.4g} | {np.median(ends):.3f} "
                  f"| {max(ends):.3f} | {step:.2f} |", flush=True)


if __name__ == "__main__":
    main()
