"""The power-integral engine against an independent enumeration, its second derivatives,
its range check and a zero weight.

The reference values here never go through the engine's information-form algebra: every
composition's integral is built by folding Gaussians together one factor at a time in
covariance form, with SciPy's ``multivariate_normal`` for each normaliser (see
:func:`log_product_integral`).
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln, logsumexp
from scipy.stats import multivariate_normal

from conftest import X64, ftype
from numpyro_gmm._kernels.power_integrals import _reference, log_moments

N_MAX = 6  # powers n = 2..N_MAX, i.e. k_max = N_MAX - 1

# The engine compiled as one program per static options and shapes: the same code, traced
# (called eagerly, each of its few hundred operations compiles separately, ~50 ms each on CPU).
jit_log_moments = jax.jit(log_moments, static_argnames=("k_max", "block_size"))


def random_mixture(rng, K, d):
    """Normalised log weights, means and lower Cholesky factors of full covariances."""
    logits = rng.normal(size=K)
    log_w = logits - logsumexp(logits)
    locs = 2.0 * rng.normal(size=(K, d))
    diag = np.einsum("kd,de->kde", rng.uniform(0.5, 1.5, (K, d)), np.eye(d))
    tril = np.tril(rng.normal(size=(K, d, d)), -1) * 0.5 + diag
    return log_w, locs, tril


def extreme_mixture():
    """A very narrow (sd 0.01), a unit and a very wide (sd 100) component, means 30 apart."""
    log_w = np.log([0.2, 0.5, 0.3])
    locs = np.array([[0.0, 0.0], [30.0, 0.0], [0.0, -30.0]])
    rot = np.array([[np.cos(0.4), -np.sin(0.4)], [np.sin(0.4), np.cos(0.4)]])
    covs = np.stack([np.diag([1e-4, 4e-4]), rot @ np.diag([1.0, 0.25]) @ rot.T, np.diag([1e4, 2.5e3])])
    return log_w, locs, np.linalg.cholesky(covs)


def log_product_integral(counts, locs, covs):
    r"""``ln \int prod_i N(x; mu_i, Sigma_i)^{m_i} dx`` by folding one factor at a time.

    The product rule ``N(x; a, A) N(x; b, B) = N(a; b, A + B) N(x; c, C)`` with
    ``C = (A^-1 + B^-1)^-1``, ``c = C (A^-1 a + B^-1 b)``: starting from the first factor,
    each further factor multiplies the running Gaussian ``N(x; c, C)`` and adds
    ``ln N(c; mu_i, C + Sigma_i)`` (SciPy) to the log scale; the last Gaussian integrates
    to 1. Covariance form throughout, so nothing is shared with the engine's
    ``Lambda_m, eta_m, Q_m`` algebra.
    """
    factors = [i for i, m in enumerate(counts) for _ in range(m)]
    c, C = locs[factors[0]], covs[factors[0]]
    log_scale = 0.0
    for i in factors[1:]:
        log_scale += multivariate_normal.logpdf(c, locs[i], C + covs[i])
        C_inv, S_inv = np.linalg.inv(C), np.linalg.inv(covs[i])
        C_new = np.linalg.inv(C_inv + S_inv)
        c = C_new @ (C_inv @ c + S_inv @ locs[i])
        C = 0.5 * (C_new + C_new.T)
    return log_scale


def weak_compositions(n, K):
    """Every ``m`` in ``N^K`` with ``sum m = n`` (itertools, independent of the engine's tables)."""
    return [m for m in itertools.product(range(n + 1), repeat=K) if sum(m) == n]


def enumerated(log_w, locs, tril, n_max=N_MAX):
    """``(ln \\int p^n, P_n)`` for ``n = 2..n_max``: the log-sum-exp over all weak compositions
    of ``ln(n! / prod m_i!) + sum m_i ln w_i + ln \\int prod N_i^{m_i}``, and the largest pure
    term (``m = n e_i``)."""
    covs = tril @ np.swapaxes(tril, -1, -2)
    K = len(log_w)
    totals, pure = [], []
    for n in range(2, n_max + 1):
        terms, pure_terms = [], []
        for m in weak_compositions(n, K):
            m_arr = np.array(m)
            if np.any(np.isneginf(log_w[m_arr > 0])):
                continue  # a zero weight to a positive power: the term is 0
            term = gammaln(n + 1) - np.sum(gammaln(m_arr + 1)) + np.sum(m_arr[m_arr > 0] * log_w[m_arr > 0])
            term += log_product_integral(m, locs, covs)
            terms.append(term)
            if max(m) == n:
                pure_terms.append(term)
        totals.append(logsumexp(terms))
        pure.append(max(pure_terms))
    return np.array(totals), np.array(pure)


def as_f(*arrays):
    return [jnp.asarray(a, ftype()) for a in arrays]


def rounded(*arrays):
    """The parameters as the engine sees them in this pass (rounded to its dtype), in float64."""
    return [np.asarray(a, ftype()).astype(np.float64) for a in arrays]


CASES = [
    ("K1 d2", 1, 2),
    ("K3 d1", 3, 1),
    ("K3 d3", 3, 3),
    ("K5 d2", 5, 2),
]


def identical_mixture():
    """Three copies of one Gaussian, equal weights: ``\\int p^n = \\int N^n`` and every pure term
    is ``n ln(1/3) + ln \\int N^n``, so the upper end of the bracket is attained exactly."""
    _, locs, tril = random_mixture(np.random.default_rng(3), 1, 2)
    return np.full(3, -math.log(3.0)), np.repeat(locs, 3, axis=0), np.repeat(tril, 3, axis=0)


CASE_NAMES = [c[0] for c in CASES] + ["extreme", "identical"]


def case_params(name):
    if name == "extreme":
        return extreme_mixture()
    if name == "identical":
        return identical_mixture()
    _, K, d = next(c for c in CASES if c[0] == name)
    return random_mixture(np.random.default_rng(sum(map(ord, name))), K, d)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_power_integrals_match_enumeration(name):
    """``lm[n-2] + (n-1) ln a = ln \\int p^n`` against the SciPy fold over all compositions."""
    log_w, locs, tril = rounded(*case_params(name))
    expected, _ = enumerated(log_w, locs, tril)
    log_a, lm = jit_log_moments(*as_f(log_w, locs, tril), k_max=N_MAX - 1)
    got = np.asarray(lm, np.float64) + np.arange(1, N_MAX) * float(log_a)
    tol = dict(rtol=1e-10, atol=1e-10) if X64 else dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got, expected, **tol)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_reference_bracket_holds_in_the_enumeration(name):
    """The mathematics behind ``_reference``: ``P_n <= ln \\int p^n <= P_n + n ln K`` with
    ``P_n`` the largest pure composition term, all from the NumPy/SciPy enumeration (no JAX)."""
    log_w, locs, tril = case_params(name)
    total, pure = enumerated(log_w, locs, tril)
    n = np.arange(2, N_MAX + 1)
    K = len(log_w)
    assert np.all(pure <= total + 1e-12)
    assert np.all(total <= pure + n * math.log(K) + 1e-12)
    if K == 1:  # the lower end is attained
        np.testing.assert_allclose(total, pure, rtol=0, atol=1e-12)
    if name == "identical":  # the upper end is attained: the bound cannot be lowered
        np.testing.assert_allclose(total, pure + n * math.log(K), rtol=0, atol=1e-12)


@pytest.mark.skipif(not X64, reason="the bracket is checked at 1e-12, float64 pass")
@pytest.mark.parametrize("name", CASE_NAMES)
def test_engine_reference_brackets_the_enumeration(name):
    """``_reference`` itself: ``ref_n <= LSE_n <= ref_n + n ln K`` with ``LSE_n = ln E[u^{n-1}] -
    alpha`` from the SciPy enumeration (``ln E[u^{n-1}] = ln \\int p^n - (n-1) ln a``,
    ``ln a = alpha - d/2 ln 2pi``); ``r`` and ``1/2 ln|Lambda_i|`` computed here in NumPy
    from the raw (unwhitened) parameters. No shift applies at these small powers."""
    log_w, locs, tril = case_params(name)
    K, d = locs.shape
    total, _ = enumerated(log_w, locs, tril)
    half_log_det_prec = -np.sum(np.log(np.abs(np.diagonal(tril, axis1=-2, axis2=-1))), axis=-1)
    alpha = logsumexp(log_w + half_log_det_prec)
    log_a = alpha - 0.5 * d * math.log(2 * math.pi)
    n = np.arange(2, N_MAX + 1)
    lse = total - (n - 1) * log_a - alpha
    r = log_w + half_log_det_prec - alpha
    ref = np.asarray(_reference(jnp.asarray(r), jnp.asarray(half_log_det_prec), 2, N_MAX - 1, d, jnp.float64))
    assert np.all(ref <= lse + 1e-10), (ref, lse)
    assert np.all(lse <= ref + n * math.log(K) + 1e-10), (ref, lse)


# ----------------------------------------------------------------------------- derivatives


def scalar_of_locs(log_w, tril=None, scale=None, k_max=3):
    coef = jnp.arange(1.0, k_max + 1.0, dtype=ftype())

    def f(locs):
        log_a, lm = log_moments(log_w, locs, tril, scale, k_max=k_max, block_size=16)
        return log_a + jnp.sum(jnp.exp(lm) * coef)

    return f


def derivative_cases():
    rng = np.random.default_rng(7)
    log_w, locs, tril = random_mixture(rng, 3, 2)
    scale = rng.uniform(0.5, 1.5, (3, 2))
    return [
        ("full", as_f(log_w)[0], as_f(locs)[0], dict(tril=as_f(tril)[0])),
        ("diagonal", as_f(log_w)[0], as_f(locs)[0], dict(scale=as_f(scale)[0])),
    ]


@pytest.mark.skipif(not X64, reason="finite differences need float64")
@pytest.mark.parametrize("case", derivative_cases(), ids=lambda c: c[0])
def test_hessian_matches_finite_differences_of_gradient(case):
    """Forward-over-reverse (``jax.hessian``) through the custom_jvp against central finite
    differences (step 1e-5) of ``jax.grad``; truncation ~1e-10, rounding ~1e-11."""
    _, log_w, locs, kw = case
    f = scalar_of_locs(log_w, **kw)
    hess = np.asarray(jax.jit(jax.hessian(f))(locs)).reshape(locs.size, locs.size)
    grad = jax.jit(jax.grad(f))
    h = 1e-5
    fd = np.zeros_like(hess)
    for j in range(locs.size):
        e = np.zeros(locs.size)
        e[j] = h
        e = jnp.asarray(e.reshape(locs.shape))
        fd[:, j] = (np.asarray(grad(locs + e)) - np.asarray(grad(locs - e))).ravel() / (2 * h)
    scale = np.max(np.abs(fd))
    assert scale > 1e-3  # a non-trivial Hessian
    np.testing.assert_allclose(hess, fd, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(hess, hess.T, rtol=1e-9, atol=1e-9 * scale)


@pytest.mark.parametrize("case", derivative_cases(), ids=lambda c: c[0])
def test_forward_mode_equals_reverse_mode(case):
    """``jax.jacfwd`` (the custom_jvp's tangent) equals ``jax.grad`` (its transpose)."""
    _, log_w, locs, kw = case
    f = scalar_of_locs(log_w, **kw)
    fwd, rev = np.asarray(jax.jit(jax.jacfwd(f))(locs)), np.asarray(jax.jit(jax.grad(f))(locs))
    assert np.max(np.abs(rev)) > 1e-3
    tol = dict(rtol=1e-12, atol=1e-12) if X64 else dict(rtol=1e-5, atol=1e-5 * np.max(np.abs(rev)))
    np.testing.assert_allclose(fwd, rev, **tol)


@pytest.mark.skipif(not X64, reason="compared to 1e-10")
def test_spread_rule_equals_the_derivative_through_the_half_mean():
    """The diagonal within-half spread's custom rule drops the path through the half mean
    (envelope theorem). Against plain automatic differentiation of the same formula with the
    half mean recomputed from the parameters (``mbar = sum m prec locs / sum m prec``, so the
    path is present): gradient and Hessian with respect to ``locs`` and ``prec`` agree."""
    from numpyro_gmm._kernels.power_integrals import _diag_spread

    rng = np.random.default_rng(5)
    k, d, C = 4, 3, 9
    m = jnp.asarray(rng.integers(0, 3, size=(k, C)).astype(float))
    locs, prec = jnp.asarray(rng.normal(size=(k, d))), jnp.asarray(rng.uniform(0.5, 2.0, size=(k, d)))
    g = jnp.asarray(rng.normal(size=C))

    def mean(locs, prec):
        return ((prec * locs).T @ m) / jnp.maximum(prec.T @ m, 1e-300)

    def with_rule(locs, prec):
        return g @ _diag_spread(m, locs, prec, mean(locs, prec))

    def plain(locs, prec):
        dev = locs.T[:, :, None] - mean(locs, prec)[:, None, :]
        return g @ jnp.einsum("kc,kj,jkc->c", m, prec, jnp.square(dev))

    for derivative in (jax.grad, jax.hessian):  # jitted: one program each, not one per operation
        got = jax.jit(derivative(with_rule, argnums=(0, 1)))(locs, prec)
        want = jax.jit(derivative(plain, argnums=(0, 1)))(locs, prec)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert np.max(np.abs(b)) > 1e-3
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * np.max(np.abs(b)))


# ----------------------------------------------------------------------------- range check


@pytest.mark.skipif(X64, reason="the range check concerns float32")
def test_float32_range_error_asks_for_float64():
    """K = 4, k_max = 100: power 101 spans 4^101 = e^140, beyond float32 (the check needs
    only tracing, so eval_shape)."""
    log_w, locs, tril = as_f(np.full(4, -math.log(4.0)), np.arange(4.0)[:, None], np.ones((4, 1, 1)))
    with pytest.raises(ValueError, match="float64"):
        jax.eval_shape(lambda a, b, c: log_moments(a, b, c, k_max=100), log_w, locs, tril)


@pytest.mark.skipif(not X64, reason="float64 pass")
def test_float64_has_the_range_for_the_same_order():
    """The same call as above traces in float64, and its reference is finite; the sums then
    fit (e^140 is far inside float64's e^709)."""
    log_w, locs, tril = as_f(np.full(4, -math.log(4.0)), np.arange(4.0)[:, None], np.ones((4, 1, 1)))
    out = jax.eval_shape(lambda a, b, c: log_moments(a, b, c, k_max=100), log_w, locs, tril)
    assert out[1].shape == (100,)
    ref = _reference(jnp.zeros(4), jnp.zeros(4), 2, 100, 1, jnp.float64)
    assert np.all(np.isfinite(np.asarray(ref)))


# ----------------------------------------------------------------------------- zero weight


@pytest.mark.parametrize("position", [0, 2])
def test_zero_weight_equals_dropping_the_component(position):
    """A weight of exactly 0 (log weight -inf): same ``ln a`` and moments as the mixture
    without that component (reference: the engine on the K = 2 mixture, plus the SciPy
    enumeration), finite gradients, and a zero gradient for the absent component's mean."""
    rng = np.random.default_rng(11)
    log_w2, locs2, tril2 = random_mixture(rng, 2, 2)
    _, extra_loc, extra_tril = random_mixture(rng, 1, 2)
    log_w3 = np.insert(log_w2, position, -np.inf)
    locs3 = np.insert(locs2, position, extra_loc[0], axis=0)
    tril3 = np.insert(tril2, position, extra_tril[0], axis=0)
    tol = dict(rtol=1e-10, atol=1e-10) if X64 else dict(rtol=1e-5, atol=1e-5)

    a3, lm3 = jit_log_moments(*as_f(log_w3, locs3, tril3), k_max=4)
    a2, lm2 = jit_log_moments(*as_f(log_w2, locs2, tril2), k_max=4)
    assert np.all(np.isfinite(np.asarray(lm3)))
    np.testing.assert_allclose(float(a3), float(a2), **tol)
    np.testing.assert_allclose(np.asarray(lm3), np.asarray(lm2), **tol)
    expected, _ = enumerated(*rounded(log_w3, locs3, tril3), n_max=5)
    np.testing.assert_allclose(np.asarray(lm3, np.float64) + np.arange(1, 5) * float(a3), expected, **tol)

    def f(log_w, tril):
        def g(locs):
            log_a, lm = log_moments(log_w, locs, tril, k_max=4, block_size=8)
            return log_a + jnp.sum(jnp.exp(lm) * jnp.arange(1.0, 5.0, dtype=lm.dtype))

        return g

    g3 = np.asarray(jax.jit(jax.grad(f(*as_f(log_w3, tril3))))(as_f(locs3)[0]))
    g2 = np.asarray(jax.jit(jax.grad(f(*as_f(log_w2, tril2))))(as_f(locs2)[0]))
    assert np.all(np.isfinite(g3)), g3
    np.testing.assert_allclose(g3[position], 0.0, atol=tol["atol"])
    others = np.delete(g3, position, axis=0)
    np.testing.assert_allclose(others, g2, rtol=tol["rtol"], atol=tol["atol"] * np.max(np.abs(g2)))
