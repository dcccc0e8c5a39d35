"""The noise of ``TraceEntropy_ELBO``'s loss value with and without its value control variate.

With ``value_control_variate`` (the default) one particle's value is ``sum_k w_k (L_k -
c_k) + H`` instead of ``sum_k w_k L_k + H`` (``c_k = ln N_k(z_k) + H[N_k]``, zero mean under
the component's draw; see the class docstring): the same expectation, and no gradient
changes. This script fits AutoGaussianMixture (``num_components`` = the number of modes,
``Adam(0.02)``) on the multimodal models of ``benchmarks/posteriors.py`` and on Gaussian
targets, then evaluates the one-particle loss at the fitted parameters on ``--keys`` keys
with and without the control variate (the same keys for both): mean, its standard error
and the standard deviation of one particle, at several points of the fit and for both
initialisations (the default ``"fits"``, and ``"spread"``, whose narrow components are the
case where the control variate adds noise).

Usage::

    python benchmarks/loss_noise.py [--keys 2000] [--steps 0,500,3000]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import posteriors  # noqa: E402

from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO  # noqa: E402


def gaussian_targets():
    """``(name, model, K, covariance)`` of the Gaussian targets (``log Z = 0``)."""
    d = 50
    cov = 0.8 ** np.abs(np.subtract.outer(np.arange(d), np.arange(d)))

    def ar1():
        numpyro.sample("z", dist.MultivariateNormal(jnp.zeros(d), jnp.asarray(cov)))

    def iid():
        numpyro.sample("z", dist.Normal(jnp.zeros(100), 1.0).to_event(1))

    return [("AR(1) rho 0.8, d = 50", ar1, 2, "full"), ("AR(1) rho 0.8, d = 50", ar1, 2, "diag"),
            ("N(0, I), d = 100", iid, 2, "diag")]


def loss_values(model, guide, params, args, keys, value_cv):
    loss = TraceEntropy_ELBO(value_control_variate=value_cv)
    return np.asarray(jax.jit(jax.vmap(lambda k: loss.loss(k, params, model, guide, *args)))(keys), np.float64)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=2000)
    p.add_argument("--steps", default="0,500,3000", help="comma-separated step counts at which to evaluate")
    p.add_argument("--models", default="bimodal_gauss,label_switching,coupled_d10,d50,iris")
    a = p.parse_args(argv)
    steps = sorted(map(int, a.steps.split(",")))
    cases = [(name, prob.model, prob.num_modes, "full", prob.args)
             for name, prob in ((n, getattr(posteriors, f"problem_{n}")()) for n in a.models.split(",") if n)]
    cases += [(name, model, K, cov, ()) for name, model, K, cov in gaussian_targets()]
    keys = jax.random.split(jax.random.PRNGKey(1), a.keys)
    print(f"devices: {jax.devices()}; float32; one-particle loss on {a.keys} keys (the same for both columns); "
          f"AutoGaussianMixture, Adam(0.02)\n")
    print("| model | covariance | init | step | mean loss without / with (s.e.) | sd without | sd with | sd ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model, K, cov, args in cases:
        for init in ("fits", "spread"):
            guide = AutoGaussianMixture(model, num_components=K, covariance=cov, init_method=init)
            svi = SVI(model, guide, numpyro.optim.Adam(0.02), TraceEntropy_ELBO())
            state = svi.init(jax.random.PRNGKey(0), *args)
            update = jax.jit(lambda s, n: jax.lax.scan(lambda s, _: (svi.update(s, *args)[0], None), s, None, length=n)[0],
                             static_argnums=1)
            done = 0
            for n in steps:
                if n > done:
                    state = update(state, n - done)
                    done = n
                params = svi.get_params(state)
                v0, v1 = (loss_values(model, guide, params, args, keys, cv) for cv in (False, True))
                se0, se1 = (v.std() / np.sqrt(len(v)) for v in (v0, v1))
                print(f"| {name} | {cov} | {init} | {n} | {v0.mean():.3f} ({se0:.3f}) / {v1.mean():.3f} ({se1:.3f}) | "
                      f"{v0.std():.3f} | {v1.std():.3f} | {v1.std() / v0.std():.2f} |", flush=True)


if __name__ == "__main__":
    main()
