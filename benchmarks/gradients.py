"""Bias and variance of the gradient of the entropy, against a long Monte Carlo reference.

Reference (independent of the package): in 1-D and 2-D central differences of quadrature
(adaptive ``scipy.integrate.quad`` with break points at every component in 1-D, per-component
Gauss-Hermite in 2-D); beyond, written here from ``jax.numpy`` primitives, the
reparameterised, control-variate Monte Carlo estimator

    H = sum_i w_i (H_i - E_z[ln p(mu_i + L_i z) - ln N_i(mu_i + L_i z)]),  z ~ N(0, I),

with ``H_i`` in closed form, differentiated by ``jax.grad`` and averaged over ``--batches``
independent batches of ``--draws`` draws per component, float64; its standard error is
given. ``--reference rb`` uses instead its label average, ``H = sum_i w_i (H_i - ln w_i -
E_z[H(r(mu_i + L_i z))])`` with the responsibilities ``r`` (bounded integrand, lower variance;
i.i.d. draws, not the package's Sobol' points), and ``--antithetic`` draws pairs ``(z, -z)``.
Estimators: the default (``auto``: the mixing rule on the fixed 1024 Sobol' points),
the randomised rule (``key``: the same points shifted uniformly modulo 1 per call; mean and
spread over ``--keys`` keys), and the Legendre series (order 8) where its cost allows
(d <= 2). Error: ``||g - g_ref|| / ||g_ref||`` per parameter group (``loc``, the
covariance factor, ``logits``).

``python benchmarks/gradients.py [--write]`` writes the table between
``<!-- gradients:begin -->`` and ``<!-- gradients:end -->`` in docs/accuracy.md; the rows at
d = 50 and 100 (``--min-d 50 --reference rb --antithetic --section gradients-large``) go to
their own section.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import reference as R  # noqa: E402

from doc_sections import write_section  # noqa: E402
import numpyro_gmm.entropy as E  # noqa: E402

GROUPS = ("loc", "factor", "logits")

# (label, family, d, K, covariance)
CASES = [
    ("two (README)", "two", 1, 2, "diag"),
    ("spike_light", "spike_light", 1, 2, "diag"),
    ("weights 1e-6..1", "weights", 2, 8, "full"),
    ("thin", "thin", 2, 4, "full"),
    ("weights 1e-6..1", "weights", 5, 8, "full"),
    ("overlap", "overlap", 10, 16, "diag"),
    ("map sep 1.5", "map", 20, 16, "full"),
    ("ill-conditioned", "illcond", 50, 8, "full"),
    ("ill-conditioned", "illcond", 100, 8, "full"),
]


def ill_conditioned(d, K, dist=2.0, eps=0.1, seed=0):
    """Hard full-covariance mixture for large d: one random orientation with standard
    deviations log-spaced 0.1 .. 10 (covariance condition number 1e4, measured 1.0e4 at
    d = 50, 1.1e4 at d = 100), each component's factor ``L_0 (I + eps G_k / sqrt(d))``,
    means ``dist`` apart in the whitened metric (``L_0 g_k dist / sqrt(2 d)``), weights
    log-spaced 1e-2 .. 1. The components overlap: the mixing term ``sum_i w_i E_i[H(r)]`` is
    0.82 nats at d = 50 and 0.70 at d = 100 (of ``H(w)`` = 1.40), so the gradient is not
    carried by the closed-form parts alone."""
    rng = np.random.default_rng(seed)
    logits = np.log(np.logspace(-2, 0, K))
    sds = np.logspace(-1, 1, d)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    l0 = np.linalg.cholesky((q * sds**2) @ q.T)
    tril = np.empty((K, d, d))
    for k in range(K):
        a = np.eye(d) + eps * rng.normal(size=(d, d)) / math.sqrt(d)
        tril[k] = np.linalg.cholesky(l0 @ a @ a.T @ l0.T)
    locs = (dist / math.sqrt(2 * d)) * rng.normal(size=(K, d)) @ l0.T
    return logits, locs, tril


def mixture(fam, d, K):
    if fam == "map":
        return R.random_mixture(d, K, 1.5, 0)
    if fam == "illcond":
        return ill_conditioned(d, K)
    logits, locs, tril = R.hard_mixture(fam, d, K)
    if fam == "two":  # unequal weights: with equal ones the logits' gradient is 0 by symmetry
        logits = np.log(np.array([0.3, 0.7]))
    return logits, locs, tril


def quad_entropy(logits, locs, factor, diag):
    """Independent quadrature truth: adaptive 1-D quadrature with break points at every
    component (d = 1), per-component Gauss-Hermite (d = 2, no spikes)."""
    from scipy import integrate

    w = np.exp(logits - np.logaddexp.reduce(logits))
    d = locs.shape[1]
    tril = np.stack([np.diag(f) for f in factor]) if diag else factor
    if d == 2:
        return R.entropy_gauss_hermite(w, locs, tril, n=120)
    mu, sd = locs[:, 0], tril[:, 0, 0]

    def f(x):
        lc = np.log(w) - np.log(sd) - 0.5 * math.log(2 * math.pi) - 0.5 * ((x - mu) / sd) ** 2
        lp = np.logaddexp.reduce(lc)
        return -math.exp(lp) * lp

    knots = sorted({float(v) for m, s_ in zip(mu, sd) for v in (m - 12 * s_, m - s_, m, m + s_, m + 12 * s_)})
    return sum(integrate.quad(f, a, b, limit=400, epsabs=1e-13)[0] for a, b in zip(knots[:-1], knots[1:]))


def fd_gradient(params, diag, rel_step=1e-4):
    """Central differences of :func:`quad_entropy` (float64), step ``rel_step`` times the
    smallest component scale; the factor's entries that are structurally 0 get gradient 0."""
    base = [np.asarray(x, float) for x in params]
    scale_min = float(np.min(np.abs(np.diagonal(base[2], axis1=-2, axis2=-1)) if not diag else np.min(base[2])))
    out = []
    for i, x in enumerate(base):
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            if i == 2 and not diag and idx[-1] > idx[-2]:
                continue
            h = rel_step * (1.0 if i == 0 else scale_min)
            vals = []
            for sgn in (1, -1):
                y = [b.copy() for b in base]
                y[i][idx] += sgn * h
                vals.append(quad_entropy(*y, diag))
            g[idx] = (vals[0] - vals[1]) / (2 * h)
        out.append(g)
    return out


def mc_estimate(logits, locs, factor, z, diag):
    """Control-variate reparameterised estimate of H from draws z (K, S, d)."""
    d = locs.shape[-1]
    lw = jax.nn.log_softmax(logits)
    w = jnp.exp(lw)
    if diag:
        x = locs[:, None, :] + factor[:, None, :] * z  # (K, S, d)
        log_det = jnp.sum(jnp.log(factor), -1)
        diff = (x[:, :, None, :] - locs[None, None]) / factor[None, None]  # (K, S, K, d)
        sq = jnp.sum(diff**2, -1)
    else:
        factor = jnp.tril(factor)  # only the lower triangle counts, as in the package
        x = locs[:, None, :] + jnp.einsum("kab,ksb->ksa", factor, z)
        log_det = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(factor, axis1=1, axis2=2))), -1)
        diff = x[:, :, None, :] - locs[None, None]  # (K, S, K, d)
        inv = jnp.linalg.inv(factor)
        sq = jnp.sum(jnp.einsum("jab,ksjb->ksja", inv, diff) ** 2, -1)
    log_n = -0.5 * (d * math.log(2 * math.pi) + sq) - log_det[None, None]  # (K, S, K)
    log_p = jax.scipy.special.logsumexp(lw[None, None] + log_n, axis=-1)  # (K, S)
    own = jnp.diagonal(log_n, axis1=0, axis2=2).T  # (K, S): ln N_i at its own draws
    h_i = 0.5 * d * math.log(2 * math.pi * math.e) + log_det
    return jnp.sum(w * (h_i - jnp.mean(log_p - own, axis=1)))


def mc_estimate_rb(logits, locs, factor, z, diag):
    """Label-averaged (Rao-Blackwellised) reparameterised estimate of H from draws z (K, S, d):
    ``H = sum_i w_i (H_i - ln w_i - E_z[H(r(mu_i + L_i z))])`` with the responsibilities
    ``r_j = w_j N_j / p`` (``E[-ln r_Z(X) | X] = H(r(X))``, so this is the control-variate
    integrand of :func:`mc_estimate` averaged over the label given ``X``: bounded in
    ``[0, ln K]``, lower variance). I.i.d. normal draws, own code (not the package's)."""
    d = locs.shape[-1]
    lw = jax.nn.log_softmax(logits)
    w = jnp.exp(lw)
    if diag:
        x = locs[:, None, :] + factor[:, None, :] * z
        log_det = jnp.sum(jnp.log(factor), -1)
        sq = jnp.sum(((x[:, :, None, :] - locs[None, None]) / factor[None, None]) ** 2, -1)
    else:
        factor = jnp.tril(factor)
        x = locs[:, None, :] + jnp.einsum("kab,ksb->ksa", factor, z)
        log_det = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(factor, axis1=1, axis2=2))), -1)
        inv = jnp.linalg.inv(factor)
        sq = jnp.sum(jnp.einsum("jab,ksjb->ksja", inv, x[:, :, None, :] - locs[None, None]) ** 2, -1)
    lj = lw[None, None] - log_det[None, None] - 0.5 * sq  # (K, S, K): ln w_j N_j + const
    h_r = -jnp.sum(jax.nn.softmax(lj, -1) * jax.nn.log_softmax(lj, -1), -1)  # (K, S)
    h_i = 0.5 * d * math.log(2 * math.pi * math.e) + log_det
    return jnp.sum(w * (h_i - lw - jnp.mean(h_r, axis=1)))


def flat(g):
    return [np.ravel(np.asarray(x)) for x in g]


def reference_gradient(params, diag, draws, batches, seed=0, antithetic=False, estimator="cv"):
    K, d = params[1].shape
    fn = mc_estimate if estimator == "cv" else mc_estimate_rb
    f = jax.jit(jax.grad(lambda lg, m, fa, z: fn(lg, m, fa, z, diag), argnums=(0, 1, 2)))
    key = jax.random.PRNGKey(seed)
    chunk = max(1, min(draws, int(2**24 // max(1, K * K * d))))
    gs = []
    for b in range(batches):
        acc = None
        n = 0
        while n < draws:
            key, sub = jax.random.split(key)
            z = jax.random.normal(sub, (K, chunk, d), jnp.float64)
            if antithetic:  # (z, -z): still unbiased; cancels the odd (linear) part of the noise
                z = jnp.concatenate([z[:, : chunk // 2], -z[:, : chunk // 2]], axis=1)
            g = f(*params, z)
            acc = g if acc is None else jax.tree.map(jnp.add, acc, g)
            n += chunk
        gs.append([np.asarray(x) / (n // chunk) for x in acc])
    stacked = [np.stack([g[i] for g in gs]) for i in range(3)]  # order: logits, loc, factor
    mean = [s.mean(0) for s in stacked]
    se = [s.std(0, ddof=1) / math.sqrt(batches) for s in stacked]
    return mean, se


def rel(g, ref):
    """||g - ref|| / ||ref|| per group, in the order loc, factor, logits."""
    order = (1, 2, 0)
    return [float(np.linalg.norm(np.ravel(g[i]) - np.ravel(ref[i])) / np.linalg.norm(np.ravel(ref[i]))) for i in order]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=2**14, help="draws per component per batch")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--keys", type=int, default=32)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--max-d", type=int, default=100)
    ap.add_argument("--min-d", type=int, default=1)
    ap.add_argument("--antithetic", action="store_true", help="reference with antithetic pairs (z, -z)")
    ap.add_argument("--reference", choices=("cv", "rb"), default="cv",
                    help="Monte Carlo reference: control variate ln p - ln N_i (cv) or its label average H(r) (rb)")
    ap.add_argument("--section", default="gradients", help="marker name of the docs section to write")
    a = ap.parse_args(argv)
    rows, t0 = [], time.time()
    for label, fam, d, K, cov in CASES:
        if not a.min_d <= d <= a.max_d:
            continue
        diag = cov == "diag"
        logits, locs, tril = mixture(fam, d, K)
        factor = np.diagonal(tril, axis1=1, axis2=2).copy() if diag else tril
        params = tuple(jnp.asarray(x, jnp.float64) for x in (logits, locs, factor))
        t = time.time()
        if d <= 2 and not (d == 2 and (fam.startswith("spike") or fam == "thin")):
            ref = fd_gradient(params, diag)
            se = [np.zeros_like(x) for x in ref]
        else:
            ref, se = reference_gradient(params, diag, a.draws, a.batches, antithetic=a.antithetic, estimator=a.reference)
        noise = [float(np.linalg.norm(np.ravel(se[i])) / np.linalg.norm(np.ravel(ref[i]))) for i in (1, 2, 0)]
        t_ref = time.time() - t

        def est(fn, **kw):
            if diag:
                return lambda lg, m, fa: fn(lg, m, scale=fa, **kw)
            return lambda lg, m, fa: fn(lg, m, fa, **kw)

        g_fixed = jax.grad(est(E.auto_entropy), argnums=(0, 1, 2))(*params)
        fixed = rel(g_fixed, ref)
        g_key = jax.jit(jax.grad(lambda lg, m, fa, k: est(E.auto_entropy, key=k)(lg, m, fa), argnums=(0, 1, 2)))
        keys = jax.random.split(jax.random.PRNGKey(123), a.keys)
        gk = [g_key(*params, k) for k in keys]
        per_key = np.array([rel(g, ref) for g in gk])  # (keys, 3)
        mean_g = [np.mean([np.asarray(g[i]) for g in gk], axis=0) for i in range(3)]
        rand_mean = rel(mean_g, ref)
        sd_g = [np.std([np.asarray(g[i]) for g in gk], axis=0, ddof=1) for i in range(3)]
        rand_sd = [float(np.linalg.norm(np.ravel(sd_g[i])) / np.linalg.norm(np.ravel(ref[i]))) for i in (1, 2, 0)]
        leg = None
        if d <= 2 and K <= 8:
            leg = rel(jax.grad(est(E.legendre_entropy), argnums=(0, 1, 2))(*params), ref)
        rows.append((label, d, K, cov, noise, fixed, rand_mean, per_key.mean(0), rand_sd, leg, time.time() - t))
        pct = lambda v: "/".join(f"{100 * x:.2f}" for x in v)  # noqa: E731
        print(f"{label:16s} d={d:3d} K={K:2d} {cov}: ref noise {pct(noise)} % | fixed {pct(fixed)} % | "
              f"randomised mean of {a.keys} {pct(rand_mean)} %, one key (avg) {pct(per_key.mean(0))} %, sd {pct(rand_sd)} % | "
              f"legendre {'-' if leg is None else pct(leg)} %  (ref {t_ref:.0f} s)", flush=True)
    total = time.time() - t0
    pct = lambda v: " / ".join(f"{100 * x:.2f}" for x in v)  # noqa: E731
    lines = [
        "## Gradient of the entropy: bias and variance against a long Monte Carlo reference"
        if a.section == "gradients"
        else f"### Gradient at d = {a.min_d} .. {a.max_d}: bias and variance against a long Monte Carlo reference",
        "",
        f"Generated by `python benchmarks/gradients.py {' '.join(sys.argv[1:] if argv is None else argv)}` ({total:.0f} s, loaded 2-core machine). Reference: "
        "central differences of quadrature in d <= 2 (adaptive quad in 1-D, Gauss-Hermite in 2-D; ref noise 0), "
        f"beyond a reparameterised control-variate Monte Carlo gradient written independently of the package, {a.batches} "
        f"batches x {a.draws} draws per component{' in antithetic pairs (z, -z)' if a.antithetic else ''}, "
        f"{'integrand ln p - ln N_i' if a.reference == 'cv' else 'label-averaged integrand H(r) (i.i.d. draws)'}, float64; "
        "*ref noise* is its standard error relative to its norm (an error below about twice it is not resolved). "
        "Each cell: `||g - g_ref|| / ||g_ref||` in percent for loc / covariance factor / logits. *fixed*: the "
        "default (`auto`, 1024 fixed Sobol' points); *randomised, mean*: the mean gradient over "
        f"{a.keys} random shifts (tests unbiasedness: it should fall to the reference noise and the QMC spread over "
        f"sqrt({a.keys})); *randomised, one key*: the average error of a single shifted rule (its spread, what one "
        "SVI step sees); *randomised sd*: the spread of one shifted rule's gradient over keys, `||sd|| / ||g_ref||` "
        "(its variance); *legendre 8*: the series (d <= 2, K <= 8).",
        "",
        "| mixture | d | K | cov | ref noise | fixed (default) | randomised, mean | randomised, one key | "
        "randomised sd | legendre 8 | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, d, K, cov, noise, fixed, rm, pk, sd, leg, dt in rows:
        lines.append(f"| {label} | {d} | {K} | {cov} | {pct(noise)} | {pct(fixed)} | {pct(rm)} | {pct(pk)} | "
                     f"{pct(sd)} | {'-' if leg is None else pct(leg)} | {dt:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.write:
        write_section(ROOT / "docs" / "accuracy.md", a.section, text)


if __name__ == "__main__":
    main()
