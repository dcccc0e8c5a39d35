"""Fit a Gaussian mixture to an unnormalised 2-D density by reverse KL.

The target ``p~(z)`` (a ring, or a banana) is known up to its normalising constant ``Z``.
The guide ``q`` is a :class:`~numpyro_gmm.GaussianMixture` with full covariances, and SVI
minimises

    KL(q || p) - ln Z = -E_q[ln p~(z)] - H[q]

with :class:`~numpyro_gmm.TraceEntropy_ELBO`: the expectation is stratified over the
components (one reparameterised draw per component, weighted by the mixture weights) and
``H[q]`` is the mixture's entropy from ``GaussianMixture.entropy()``. A single Gaussian
(``K = 1``) is fitted the same way for comparison; ``ln Z`` is computed on a grid, so the
final KL divergences are reported in nats.

Run::

    python examples/target_density.py                 # ring, K = 8
    python examples/target_density.py --target banana
    CI=1 python examples/target_density.py            # fewer steps

Writes ``target_density_<target>.png`` to ``--out`` (default ``examples/figures``).
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.infer import SVI
from scipy.special import logsumexp

from numpyro_gmm import GaussianMixture, TraceEntropy_ELBO

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT = 4.5  # the plotting window and the quadrature grid: [-LIMIT, LIMIT]^2


def log_target(z, target: str = "ring"):
    """Unnormalised log density of the target at ``z`` (``(..., 2)``)."""
    if target == "ring":
        radius = jnp.linalg.norm(z, axis=-1)
        return -0.5 * ((radius - 2.5) / 0.3) ** 2
    if target == "banana":
        x, y = z[..., 0], z[..., 1]
        return -0.5 * (x / 2.0) ** 2 - 0.5 * ((y - 0.5 * x**2 + 2.0) / 0.5) ** 2
    raise ValueError(f"target must be 'ring' or 'banana', got {target!r}")


def log_normaliser(target: str, n: int = 801) -> float:
    """``ln Z = ln int p~(z) dz`` by the trapezoid rule on ``[-2 LIMIT, 2 LIMIT]^2``."""
    g = np.linspace(-2 * LIMIT, 2 * LIMIT, n)
    h = g[1] - g[0]
    xx, yy = np.meshgrid(g, g)
    lp = np.asarray(log_target(jnp.asarray(np.stack([xx, yy], -1)), target), np.float64)
    w = np.ones(n)
    w[[0, -1]] = 0.5
    return float(logsumexp(lp + np.log(np.outer(w, w))) + 2 * np.log(h))


def make_model(target: str):
    def model():
        # an improper flat "prior" plus the target as a factor: log p(z) = log p~(z)
        z = numpyro.sample("z", dist.ImproperUniform(constraints.real_vector, (), (2,)))
        numpyro.factor("log_target", log_target(z, target))

    return model


def make_guide(num_components: int, seed: int = 0, init_scale: float = 0.5):
    init_loc = 1.5 * jax.random.normal(jax.random.PRNGKey(seed), (num_components, 2))

    def guide():
        loc = numpyro.param("loc", init_loc)
        scale_tril = numpyro.param(
            "scale_tril",
            jnp.broadcast_to(init_scale * jnp.eye(2), (num_components, 2, 2)),
            constraint=constraints.lower_cholesky,
        )
        logits = numpyro.param("logits", jnp.zeros(num_components))
        numpyro.sample("z", GaussianMixture(loc, scale_tril=scale_tril, logits=logits))

    return guide


def mixture_from_params(params) -> GaussianMixture:
    return GaussianMixture(params["loc"], scale_tril=params["scale_tril"], logits=params["logits"])


def exponential_decay(step_size: float, num_steps: int, final_fraction: float):
    """``i -> step_size * final_fraction ** (i / num_steps)`` (a step-size schedule for
    ``numpyro.optim.Adam``)."""
    return lambda i: step_size * final_fraction ** (i / num_steps)


def fit(target: str, num_components: int, num_steps: int, snapshots=(), *, lr=0.03, num_particles=4,
        seed=0, entropy_order=None):
    """SVI with TraceEntropy_ELBO. Returns ``(params, losses, {step: params})`` with the
    parameters after each step listed in ``snapshots`` (``0`` is the initialisation)."""
    model, guide = make_model(target), make_guide(num_components, seed)
    options = {} if entropy_order is None else {"order": entropy_order}
    # the step size decays to a tenth over the run: late large steps can collapse a component
    schedule = exponential_decay(lr, num_steps, 0.1)
    svi = SVI(model, guide, numpyro.optim.Adam(schedule), TraceEntropy_ELBO(num_particles, entropy_options=options))
    state = svi.init(jax.random.PRNGKey(seed + 1))
    update = jax.jit(svi.update)  # compiled once; a Python loop lets us keep snapshots
    saved = {0: svi.get_params(state)} if 0 in snapshots else {}
    losses = np.empty(num_steps)
    for step in range(1, num_steps + 1):
        state, loss = update(state)
        losses[step - 1] = loss
        if step in snapshots:
            saved[step] = svi.get_params(state)
    return svi.get_params(state), losses, saved


def reverse_kl(params, target: str, log_z: float, key, num_samples: int = 20_000):
    """``KL(q || p)`` in nats by Monte Carlo over ``q`` (NumPyro's ``sample``/``log_prob``)
    with the exact ``ln Z``, and its standard error."""
    q = mixture_from_params(params)
    z = q.sample(key, (num_samples,))
    diff = np.asarray(q.log_prob(z) - log_target(z, target), np.float64) + log_z
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(num_samples))


def _grid(n=160):
    g = np.linspace(-LIMIT, LIMIT, n)
    xx, yy = np.meshgrid(g, g)
    return xx, yy, jnp.asarray(np.stack([xx.ravel(), yy.ravel()], -1), jnp.float32)


def make_figure(target, snapshots, gaussian_params, losses, gaussian_losses, kls):
    """Target contours (grey) under the guide's density at each snapshot, the single
    Gaussian's fit, and the loss curves."""
    import matplotlib.pyplot as plt

    xx, yy, pts = _grid()
    p = np.exp(np.asarray(log_target(pts, target))).reshape(xx.shape)
    steps = sorted(snapshots)
    ncols = len(steps) + 2
    fig, axes = plt.subplots(1, ncols, figsize=(3.1 * ncols, 3.9))

    def panel(ax, params, title):
        q = np.exp(np.asarray(mixture_from_params(params).log_prob(pts))).reshape(xx.shape)
        # colour scale from a high percentile, not the maximum: a narrow component would
        # otherwise push every other level out of sight
        top = np.percentile(q, 99.5)
        ax.contourf(xx, yy, q, levels=np.linspace(0.03, 1.0, 12) * top, cmap="Blues", extend="max")
        # target: the lines where p~ is exp(-1/2) and exp(-2) of its maximum (1 and 2 "sd")
        ax.contour(xx, yy, p / p.max(), levels=[np.exp(-2.0), np.exp(-0.5)], colors="tab:red",
                   linewidths=0.9, linestyles=["--", "-"])
        loc = np.asarray(params["loc"])
        w = np.asarray(jax.nn.softmax(params["logits"]))
        ax.scatter(loc[:, 0], loc[:, 1], s=200 * w * len(w) / 2, c="tab:orange", edgecolors="k", zorder=3)
        ax.set_xlim(-LIMIT, LIMIT)
        ax.set_ylim(-LIMIT, LIMIT)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(title, fontsize=10)

    K = len(np.asarray(snapshots[steps[0]]["logits"]))
    for ax, s in zip(axes, steps):
        extra = f"\nKL(q||p) = {kls['mixture'][0]:.3f}" if s == steps[-1] else ""
        panel(ax, snapshots[s], f"mixture K={K}, step {s}{extra}")
    panel(axes[-2], gaussian_params, f"one Gaussian, step {steps[-1]}\nKL(q||p) = {kls['gaussian'][0]:.3f}")
    ax = axes[-1]
    window = max(1, len(losses) // 40)

    def smooth(x):  # moving average: the per-step loss is a one-particle-per-component estimate
        return np.convolve(x, np.ones(window) / window, mode="valid")

    ax.plot(smooth(losses), lw=1, label=f"mixture K={K}")
    ax.plot(smooth(gaussian_losses), lw=1, label="one Gaussian")
    tail = np.concatenate([smooth(losses)[len(losses) // 10 :], smooth(gaussian_losses)[len(losses) // 10 :]])
    lo, hi = tail.min(), tail.max()
    ax.set_ylim(lo - 0.15 * (hi - lo), hi + 0.15 * (hi - lo))
    ax.set_xlabel("SVI step")
    ax.set_title(f"-ELBO = KL(q||p) - ln Z\n(moving average over {window} steps)", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle(f"Reverse-KL fit to the '{target}' density (red: target; blue: guide density; "
                 "dots: component means, area ~ weight)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def run(target="ring", num_components=8, num_steps=2000, seed=0, num_particles=4, entropy_order=None):
    """Fit the mixture and a single Gaussian; print the reverse KL of each. Returns what
    :func:`make_figure` needs."""
    steps = sorted({0, num_steps // 20, num_steps // 4, num_steps})
    params, losses, snaps = fit(target, num_components, num_steps, steps, seed=seed,
                                num_particles=num_particles, entropy_order=entropy_order)
    g_params, g_losses, _ = fit(target, 1, num_steps, (), seed=seed, num_particles=num_particles,
                                entropy_order=entropy_order)
    log_z = log_normaliser(target)
    kls = {
        "mixture": reverse_kl(params, target, log_z, jax.random.PRNGKey(seed + 10)),
        "gaussian": reverse_kl(g_params, target, log_z, jax.random.PRNGKey(seed + 11)),
    }
    print(f"target {target!r}: ln Z = {log_z:.4f} (grid quadrature)")
    print(f"{'guide':>16s} {'KL(q||p)':>9s} {'(se)':>7s}")
    for name, (kl, se) in kls.items():
        label = f"mixture K={num_components}" if name == "mixture" else "one Gaussian"
        print(f"{label:>16s} {kl:9.4f} {se:7.4f}")
    w = np.asarray(jax.nn.softmax(params["logits"]))
    print("mixture weights:", np.round(w, 3))
    return dict(target=target, snapshots=snaps, gaussian_params=g_params, losses=losses,
                gaussian_losses=g_losses, kls=kls)


def main(argv=None):
    smoke_test = "CI" in os.environ
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("ring", "banana"), default="ring")
    parser.add_argument("--num-components", type=int, default=6 if smoke_test else 8)
    parser.add_argument("--num-steps", type=int, default=600 if smoke_test else 3000)
    parser.add_argument("--num-particles", type=int, default=4)
    parser.add_argument("--entropy-order", type=int, default=None, help="Legendre order (default: the library's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "figures"), help="folder for the figure")
    args = parser.parse_args(argv)

    out = run(args.target, args.num_components, args.num_steps, args.seed, args.num_particles, args.entropy_order)

    import matplotlib

    matplotlib.use("Agg")
    fig = make_figure(**out)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"target_density_{args.target}.png")
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")

    # the claim of this example: the mixture fits the target far better than one Gaussian
    kl_mix, kl_gauss = out["kls"]["mixture"][0], out["kls"]["gaussian"][0]
    if not kl_mix < 0.5 * kl_gauss:
        raise SystemExit(f"the mixture did not beat one Gaussian: KL {kl_mix:.3f} vs {kl_gauss:.3f}")


if __name__ == "__main__":
    main()
