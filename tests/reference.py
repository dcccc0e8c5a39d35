"""Independent float64 NumPy/SciPy references for the tests.

Nothing here imports numpyro_gmm: compositions come from ``itertools``, Gaussian product
integrals from the covariance-form product rule, Legendre coefficients from
``numpy.polynomial`` and ``scipy.integrate.quad``, and densities from ``scipy.stats``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import integrate, stats
from scipy.special import logsumexp


def compositions(n, K):
    """Weak compositions of n into K parts by stars and bars (itertools)."""
    out = []
    for bars in itertools.combinations(range(n + K - 1), K - 1):
        prev, parts = -1, []
        for b in bars:
            parts.append(b - prev - 1)
            prev = b
        parts.append(n + K - 1 - prev - 1)
        out.append(parts)
    return np.array(out, dtype=np.int64).reshape(-1, K)


def log_gauss_product_integral(m, locs, covs):
    """ln integral prod_i N(x; mu_i, S_i)^{m_i} dx by folding Gaussians in covariance form.

    N(x; a, A) N(x; b, B) = N(a; b, A + B) N(x; c, C) with C = (A^-1 + B^-1)^-1, and
    N(x; mu, S)^m = (2 pi)^{d(1-m)/2} |S|^{(1-m)/2} m^{-d/2} N(x; mu, S/m).
    """
    d = locs.shape[1]
    total, cur_mu, cur_cov = 0.0, None, None
    for mi, mu, S in zip(m, locs, covs):
        if mi == 0:
            continue
        _, logdet = np.linalg.slogdet(S)
        total += 0.5 * d * (1 - mi) * math.log(2 * math.pi) + 0.5 * (1 - mi) * logdet - 0.5 * d * math.log(mi)
        S_m = S / mi
        if cur_mu is None:
            cur_mu, cur_cov = mu, S_m
            continue
        total += stats.multivariate_normal(cur_mu, cur_cov + S_m).logpdf(mu)
        C = np.linalg.inv(np.linalg.inv(cur_cov) + np.linalg.inv(S_m))
        cur_mu = C @ (np.linalg.solve(cur_cov, cur_mu) + np.linalg.solve(S_m, mu))
        cur_cov = C
    return total


def log_power_integral(n, weights, locs, covs):
    """ln integral p^n over all compositions, in float64."""
    K = len(weights)
    terms = []
    for m in compositions(n, K):
        log_multi = math.lgamma(n + 1) - sum(math.lgamma(x + 1) for x in m)
        terms.append(log_multi + float(np.dot(m, np.log(weights))) + log_gauss_product_integral(m, locs, covs))
    return logsumexp(terms)


def shifted_legendre_log_coefficients(order):
    """Monomial coefficients of the degree-`order` L2 projection of ln u on [0, 1].

    Projection coefficients by quadrature, basis from numpy.polynomial.Legendre mapped to [0, 1].
    """
    poly = np.polynomial.Polynomial([0.0])
    for n in range(order + 1):
        P = np.polynomial.Legendre.basis(n, domain=[0, 1]).convert(kind=np.polynomial.Polynomial)
        coef = (2 * n + 1) * integrate.quad(lambda u: math.log(u) * P(u) if u > 0 else 0.0, 0, 1, limit=200)[0]
        poly = poly + coef * P
    return poly.coef


def legendre_entropy(order, weights, locs, covs):
    """The Legendre formula, every piece computed independently in float64."""
    d = locs.shape[1]
    log_a = logsumexp(
        np.log(weights) - 0.5 * np.array([d * math.log(2 * math.pi) + np.linalg.slogdet(S)[1] for S in covs])
    )
    w = shifted_legendre_log_coefficients(order)
    moments = [1.0] + [
        math.exp(log_power_integral(k + 1, weights, locs, covs) - k * log_a) for k in range(1, order + 1)
    ]
    return -log_a - float(np.dot(w, moments))


def mixture_logpdf(x, weights, locs, covs):
    return logsumexp(
        [np.log(w) + stats.multivariate_normal(m, S).logpdf(x) for w, m, S in zip(weights, locs, covs)], axis=0
    )


def entropy_1d_scipy(weights, locs, sds):
    """Exact (quadrature-backed) entropy of a 1-D mixture from scipy.stats.Mixture."""
    comps = [stats.Normal(mu=float(m), sigma=float(s)) for m, s in zip(locs, sds)]
    return float(stats.Mixture(comps, weights=np.asarray(weights, float)).entropy())


def entropy_2d_quadrature(weights, locs, covs, n=801, pad=9.0):
    """Entropy of a 2-D mixture by a dense tensor grid (trapezoid rule) over +-pad sd."""
    sds = np.sqrt(np.array([np.diag(S) for S in covs]))
    lo = (locs - pad * sds).min(0)
    hi = (locs + pad * sds).max(0)
    xs = np.linspace(lo[0], hi[0], n)
    ys = np.linspace(lo[1], hi[1], n)
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    pts = np.stack([X.ravel(), Y.ravel()], -1)
    logp = mixture_logpdf(pts, weights, locs, covs).reshape(n, n)
    f = -np.exp(logp) * logp
    return float(integrate.trapezoid(integrate.trapezoid(f, ys, axis=1), xs))


def entropy_monte_carlo(weights, locs, covs, draws_per_component=2**15, seed=0):
    """``(H, standard error)`` by stratified Monte Carlo with control variates, float64.

    ``H = sum_i w_i (H_i - E_{N_i}[ln p(X) - ln N_i(X)])`` with the closed form
    ``H_i = 1/2 ln|2 pi e Sigma_i|``; draws by ``numpy.random``, densities by ``scipy.stats``.
    """
    weights, locs, covs = (np.asarray(x, float) for x in (weights, locs, covs))
    rng = np.random.default_rng(seed)
    d = locs.shape[1]
    est, var = 0.0, 0.0
    for w, m, S in zip(weights, locs, covs):
        if w == 0:
            continue
        comp = stats.multivariate_normal(m, S)
        x = comp.rvs(size=draws_per_component, random_state=rng).reshape(-1, d)
        g = mixture_logpdf(x, weights, locs, covs) - comp.logpdf(x)
        h_i = 0.5 * (d * math.log(2 * math.pi * math.e) + np.linalg.slogdet(S)[1])
        est += w * (h_i - g.mean())
        var += w**2 * g.var(ddof=1) / draws_per_component
    return float(est), float(math.sqrt(var))


def random_mixture(d, K, sep, seed):
    """``(logits, locs, scale_tril)`` of the accuracy map's family (benchmarks/accuracy.py).

    Weights ~ softmax(N(0, 0.5^2)); Cholesky factors with diagonal U(0.6, 1.4) and
    off-diagonal N(0, 0.3^2 / d); means sep * g_i / sqrt(2) with g_i ~ N(0, I_d), so that
    neighbouring components are about ``sep`` standard deviations apart along each axis."""
    rng = np.random.default_rng(seed)
    logits = 0.5 * rng.normal(size=K)
    tril = np.tril(rng.normal(size=(K, d, d)) * 0.3 / math.sqrt(d), -1)
    tril += np.einsum("ki,ij->kij", rng.uniform(0.6, 1.4, size=(K, d)), np.eye(d))
    locs = sep * rng.normal(size=(K, d)) / math.sqrt(2.0)
    if K == 1:
        locs[:] = 0.0
    return logits, locs, tril


def concentric_pair(d, rho):
    """``(locs (2, d), sds (2, d), entropy)`` of two components of weight 1/2 with standard
    deviations ``1 / sqrt(rho)`` and ``sqrt(rho)`` per axis, the wide one's mean moved by half
    its scale, and their separated-components limit ``H(w) + sum_k w_k H_k`` (closed form; the
    logs of the two scales cancel). For ``rho >= 1e8`` each component's density is negligible
    where the other's mass is, and the limit is the entropy (its error falls like
    ``rho^-d``)."""
    locs = np.array([[0.0] * d, [0.5 * rho**0.5] * d])
    sds = np.array([[rho**-0.5] * d, [rho**0.5] * d])
    return locs, sds, math.log(2.0) + 0.5 * d * math.log(2 * math.pi * math.e)


def _diagonal_scales(trils):
    """The standard deviations ``(K, d)`` of Cholesky factors ``(K, d, d)`` that are all
    diagonal, else ``None``."""
    diag = np.diagonal(trils, axis1=1, axis2=2)
    return np.abs(diag) if np.all(trils == diag[:, :, None] * np.eye(trils.shape[-1])) else None


def _log_mixture_density_chol(x, weights, locs, trils=None, scales=None):
    """ln p(x) for points x (S, d) of a mixture with Cholesky factors ``trils (K, d, d)`` or
    standard deviations ``scales (K, d)`` (diagonal covariances), float64, NumPy only. Full
    factors: per component one matrix product with ``L^-1``. Diagonal ones (``scales``, or
    factors that are all diagonal): every ``|(x - mu_k) / s_k|^2`` expanded into matrix products
    over all components at once, ``sum x^2 / s_k^2 - 2 x . mu_k / s_k^2 + sum mu_k^2 / s_k^2``,
    so that ``K`` and ``d`` in the hundreds take seconds."""
    K, d = locs.shape
    log_w = np.log(np.asarray(weights, float))
    if scales is None:
        scales = _diagonal_scales(trils)
    if scales is not None:
        inv2 = 1.0 / np.square(scales)  # (K, d)
        quad = np.square(x) @ inv2.T - 2.0 * x @ (locs * inv2).T + np.sum(np.square(locs) * inv2, 1)
        log_c = log_w - np.sum(np.log(scales), 1) - 0.5 * d * math.log(2 * math.pi)
        return logsumexp(log_c - 0.5 * quad, axis=1)
    log_det = np.sum(np.log(np.abs(np.diagonal(trils, axis1=1, axis2=2))), axis=1)
    lc = np.empty((len(x), K))
    for k in range(K):
        z = (x - locs[k]) @ np.linalg.inv(trils[k]).T
        lc[:, k] = log_w[k] - log_det[k] - 0.5 * (d * math.log(2 * math.pi) + np.sum(z * z, -1))
    return logsumexp(lc, axis=1)


def entropy_gauss_hermite(weights, locs, trils, n=200):
    """Entropy ``-sum_i w_i E_{N_i}[ln p(X)]`` with each expectation by a tensor Gauss-Hermite
    rule of ``n`` nodes per axis in that component's own coordinates ``x = mu_i + L_i z``
    (NumPy ``hermgauss``; d = 1, 2). A narrow component inside a wide one is resolved in its
    own coordinates, unlike a grid in x."""
    weights, locs, trils = (np.asarray(a, float) for a in (weights, locs, trils))
    K, d = locs.shape
    t, gw = np.polynomial.hermite.hermgauss(n)
    z = np.sqrt(2.0) * np.stack(np.meshgrid(*([t] * d), indexing="ij"), -1).reshape(-1, d)
    wq = np.prod(np.stack(np.meshgrid(*([gw] * d), indexing="ij"), -1).reshape(-1, d), -1) / math.pi ** (d / 2)
    h = 0.0
    for w, mu, L in zip(weights, locs, trils):
        if w == 0:
            continue
        h -= w * float(np.sum(wq * _log_mixture_density_chol(mu + z @ L.T, weights, locs, trils)))
    return h


def entropy_monte_carlo_chol(weights, locs, trils=None, draws_per_component=2**14, seed=0, *, scales=None,
                             batch=4096):
    """``(H, se)`` as :func:`entropy_monte_carlo` (control variates ``ln p - ln N_i``, stratified
    by component), vectorised for Cholesky factors ``trils (K, d, d)`` or, for diagonal
    covariances, standard deviations ``scales (K, d)`` (no ``d x d`` arrays; factors that are
    all diagonal are taken as their scales), and large d (NumPy only). Each component's draws
    come in batches of ``batch`` rows of one stream, so the batch size does not change the
    draws."""
    weights, locs = np.asarray(weights, float), np.asarray(locs, float)
    if scales is None:
        trils = np.asarray(trils, float)
        scales = _diagonal_scales(trils)
    if scales is not None:
        scales, trils = np.asarray(scales, float), None
    factors = trils if scales is None else scales
    rng = np.random.default_rng(seed)
    K, d = locs.shape
    est, var = 0.0, 0.0
    for w, mu, f in zip(weights, locs, factors):
        if w == 0:
            continue
        log_s = np.sum(np.log(np.abs(f if scales is not None else np.diag(f))))
        g = []
        for start in range(0, draws_per_component, batch):
            z = rng.standard_normal((min(batch, draws_per_component - start), d))
            x = mu + (z * f if scales is not None else z @ f.T)
            log_ni = -log_s - 0.5 * (d * math.log(2 * math.pi) + np.sum(z * z, -1))
            g.append(_log_mixture_density_chol(x, weights, locs, trils, scales) - log_ni)
        g = np.concatenate(g)
        h_i = 0.5 * d * math.log(2 * math.pi * math.e) + log_s
        est += w * (h_i - g.mean())
        var += w**2 * g.var(ddof=1) / draws_per_component
    return float(est), float(math.sqrt(var))


def hard_mixture(name, d, K, seed=0):
    """``(logits, locs, scale_tril)`` of the hard families of benchmarks/hard_cases.py (float64).

    * ``spike``: component 0 wide (sd 1), the others narrow (sd 1e-3) near its centre
      (offsets 0.3 N(0, I)), equal weights;
    * ``spike_light``: the same with the narrow components' total weight 1e-3;
    * ``weights``: weights 1e-6 .. 1 (log-spaced), unit covariances, means 1.5 N(0, I) / sqrt(2);
    * ``thin``: thin ellipses, covariance condition number 1e4 (sds 1 and 1e-2 along random
      orthogonal axes; in d > 2 the first axis 1, the rest 1e-2), means 0.5 N(0, I);
    * ``overlap``: identity covariances, means 0.25 N(0, I) / sqrt(2) (heavy overlap: the
      mixing term is largest);
    * ``two``: the README's example, N(-1, 1) and N(1, 1) in d = 1 (K = 2).
    """
    rng = np.random.default_rng(seed)
    eye = np.broadcast_to(np.eye(d), (K, d, d)).copy()
    logits = np.zeros(K)
    locs = np.zeros((K, d))
    tril = eye
    if name in ("spike", "spike_light"):
        sd = np.full(K, 1e-3)
        sd[0] = 1.0
        tril = eye * sd[:, None, None]
        locs[1:] = 0.3 * rng.normal(size=(K - 1, d))
        if name == "spike_light":
            logits[1:] = math.log(1e-3 / (K - 1))
    elif name == "weights":
        logits = np.log(np.logspace(-6, 0, K))
        locs = 1.5 * rng.normal(size=(K, d)) / math.sqrt(2)
    elif name == "thin":
        sds = np.full(d, 1e-2)
        sds[0] = 1.0
        tril = np.empty((K, d, d))
        for k in range(K):
            q, _ = np.linalg.qr(rng.normal(size=(d, d)))
            tril[k] = np.linalg.cholesky((q * sds**2) @ q.T + 1e-14 * np.eye(d))
        locs = 0.5 * rng.normal(size=(K, d))
    elif name == "overlap":
        locs = 0.25 * rng.normal(size=(K, d)) / math.sqrt(2)
    elif name == "two":
        locs = np.array([[-1.0], [1.0]])
        logits = np.zeros(2)
        tril = np.ones((2, 1, 1))
    else:
        raise ValueError(name)
    return logits, locs, tril


def combined_mixture(d, K, seed, kind="full"):
    """``(weights, locs, scale_tril)`` (float64) with every hard feature at once: weights
    log-uniform in ``[1e-6, 1]`` (the first 1), each component's overall scale log-uniform in
    ``[1e-3, 1]`` (scale ratios up to 1000; the first 1), its axis scales a further factor
    log-uniform in ``[1e-2, 1]`` (condition numbers up to 1e4) along random orthogonal axes
    (``kind="full"``) or the coordinate axes (``"diag"``), and means ``c N(0, I)`` with ``c``
    drawn from ``{0, 0.1, 0.5, 2}`` (from all centred to well apart)."""
    rng = np.random.default_rng(seed)
    w = np.exp(rng.uniform(math.log(1e-6), 0.0, K))
    w[0] = 1.0
    overall = np.exp(rng.uniform(math.log(1e-3), 0.0, K))
    overall[0] = 1.0
    trils = np.empty((K, d, d))
    for k in range(K):
        sds = overall[k] * np.exp(rng.uniform(math.log(1e-2), 0.0, d))
        if kind == "diag":
            trils[k] = np.diag(sds)
        else:
            q, _ = np.linalg.qr(rng.normal(size=(d, d)))
            trils[k] = np.linalg.cholesky((q * sds**2) @ q.T)
    locs = rng.choice([0.0, 0.1, 0.5, 2.0]) * rng.normal(size=(K, d))
    return w / w.sum(), locs, trils


def mixing_rule(weights, locs, trils, z):
    """The mixing split's rule on given standard-normal points ``z (M, d)`` (float64 NumPy/SciPy):
    ``sum_i w_i (H(N_i) - mean_m H(r(mu_i + L_i z_m))) + H(w)``, ``r`` the responsibilities.
    Returns ``(entropy, mixing term)``; no clipping (the randomised rule's)."""
    trils = np.asarray(trils, float)
    x = np.asarray(locs, float)[:, None] + np.asarray(z, float) @ np.swapaxes(trils, -1, -2)  # (K, M, d)
    return mixing_rule_on_points(weights, locs, trils, x)


def mixing_rule_on_points(weights, locs, trils, x):
    """:func:`mixing_rule` with the points ``x (K, M, d)`` given (``x[i]`` drawn from component
    ``i``): each ``L_j^-1 (x - mu_j)`` by SciPy's ``solve_triangular``."""
    from scipy.linalg import solve_triangular

    weights, locs, trils, x = (np.asarray(a, float) for a in (weights, locs, trils, x))
    K, d = locs.shape
    log_det = np.sum(np.log(np.abs(np.diagonal(trils, axis1=1, axis2=2))), 1)
    x = x.reshape(-1, d)  # (K M, d), component-major
    log_joint = np.stack(
        [
            np.log(weights[j]) - log_det[j]
            - 0.5 * np.sum(np.square(solve_triangular(trils[j], (x - locs[j]).T, lower=True)), 0)
            for j in range(K)
        ],
        -1,
    )  # (K M, K); the common -d/2 ln 2 pi cancels in r
    log_r = log_joint - logsumexp(log_joint, axis=1, keepdims=True)
    h_r = -np.sum(np.exp(log_r) * log_r, 1).reshape(K, -1).mean(1)  # (K,)
    h_gauss = 0.5 * d * math.log(2 * math.pi * math.e) + log_det
    return float(np.sum(weights * (h_gauss - h_r)) - np.sum(weights * np.log(weights))), float(weights @ h_r)


def logit_gradient_monte_carlo(weights, locs, trils, draws_per_component=2**18, seed=0):
    """``(dH/dlogits (K,), se (K,))`` of a mixture with Cholesky factors ``trils (K, d, d)``
    from the identity ``dH / d ln w_k = -w_k (E_{N_k}[ln p] + 1)`` through the softmax,
    ``dH / d logit_k = w_k (-L_k - H)``, ``L_k = E_{N_k}[ln p]``, ``H = -sum_j w_j L_j``; each
    ``L_k`` by plain Monte Carlo with the control variate ``ln N_k`` (``E_{N_k}[ln N_k]`` in
    closed form). NumPy only, float64."""
    weights, locs, trils = (np.asarray(a, float) for a in (weights, locs, trils))
    rng = np.random.default_rng(seed)
    K, d = locs.shape
    L, var = np.empty(K), np.empty(K)
    for k in range(K):
        z = rng.standard_normal((draws_per_component, d))
        log_s = np.sum(np.log(np.abs(np.diag(trils[k]))))
        log_nk = -log_s - 0.5 * (d * math.log(2 * math.pi) + np.sum(z * z, -1))
        g = _log_mixture_density_chol(locs[k] + z @ trils[k].T, weights, locs, trils) - log_nk
        h_k = 0.5 * d * math.log(2 * math.pi * math.e) + log_s
        L[k], var[k] = g.mean() - h_k, g.var(ddof=1) / draws_per_component
    H = -weights @ L
    return weights * (-L - H), weights * np.sqrt(var + weights**2 @ var)
