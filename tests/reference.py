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
