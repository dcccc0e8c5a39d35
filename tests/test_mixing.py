"""The mixing-split estimator (``mixing_qmc_entropy``) and the default (``auto_entropy``)
against independent references, in this pass's dtype (float32, or float64 with
``JAX_ENABLE_X64=1``).

Truths: ``scipy.stats.Mixture(...).entropy()`` in 1-D, a dense 2-D trapezoid grid, a long
control-variate Monte Carlo run in NumPy/SciPy beyond (``reference.entropy_monte_carlo``;
the tolerance adds 4 of its standard errors), and closed forms (one Gaussian; components
so far apart that ``H = sum_i w_i H_i + H(w)``).
"""

import math
import warnings
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import reference
from conftest import X64, ftype
from numpyro_gmm import (
    LEGENDRE_ACCURATE_MAX_DIM,
    LEGENDRE_DEFAULT_MAX_DIM,
    GaussianMixture,
    auto_entropy,
    legendre_entropy,
    mixing_qmc_entropy,
    mixture_entropy,
)
from numpyro_gmm._kernels.gaussian import substitution_pays
from numpyro_gmm._kernels import lowrank as lowrank_kernel
from numpyro_gmm._kernels import mixing as mixing_kernel
from numpyro_gmm._kernels.mixing import component_points, fixed_shifts, shifted_normal_points

LOG_2PIE = math.log(2 * math.pi * math.e)


def _random_mixture(d, K, sep, seed):
    """``(weights, locs, scale_tril)`` of the accuracy map's family (``K >= 2``)."""
    logits, locs, tril = reference.random_mixture(d, K, sep, seed)
    return np.exp(logits) / np.exp(logits).sum(), locs, tril


@lru_cache(maxsize=None)
def _mc_truth(d, K, sep, seed):
    w, locs, tril = _random_mixture(d, K, sep, seed)
    return reference.entropy_monte_carlo(w, locs, tril @ np.swapaxes(tril, -1, -2), 2**14, seed + 1)


_mixing = jax.jit(mixing_qmc_entropy, static_argnames="num_points")


def _as_f(*arrays):
    return [jnp.asarray(a, ftype()) for a in arrays]


@pytest.mark.parametrize(
    "w,m,s",
    [
        ([0.5, 0.5], [-1.0, 1.0], [1.0, 1.0]),
        ([0.2, 0.8], [0.0, 3.0], [0.5, 1.5]),
        ([0.25, 0.25, 0.25, 0.25], [-3.0, -1.0, 1.0, 3.0], [0.6, 0.6, 0.6, 0.6]),
        ([0.1, 0.6, 0.3], [0.0, 0.3, 5.0], [0.05, 1.0, 2.0]),
    ],
)
def test_one_dimension_against_scipy(w, m, s):
    truth = reference.entropy_1d_scipy(w, m, s)  # scipy.stats.Mixture(...).entropy()
    lg, loc, sc = _as_f(np.log(w), np.array(m)[:, None], np.array(s)[:, None])
    # measured |error| <= 1.1e-4 on these cases (float64; the Legendre series at order 8: up to 0.03)
    assert abs(float(_mixing(lg, loc, None, scale=sc)) - truth) < 2e-3


def test_two_dimensions_against_quadrature():
    w, locs, tril = _random_mixture(2, 4, 1.5, 7)
    covs = tril @ np.swapaxes(tril, -1, -2)
    truth = reference.entropy_2d_quadrature(w, locs, covs)  # dense trapezoid grid
    got = float(_mixing(*_as_f(np.log(w), locs, tril)))
    assert abs(got - truth) < 2e-3


@pytest.mark.parametrize("d,K,sep", [(5, 4, 1.5), (10, 8, 0.5), (20, 4, 0.5), (20, 8, 1.5)])
def test_high_dimension_against_long_monte_carlo(d, K, sep):
    """The frontier: within 0.02 nats (+ 4 se of the truth) where the Legendre series is off
    by 0.3 to 7 nats (docs/accuracy.md)."""
    seed = 100 * d + K
    w, locs, tril = _random_mixture(d, K, sep, seed)
    truth, se = _mc_truth(d, K, sep, seed)
    got = float(_mixing(*_as_f(np.log(w), locs, tril)))
    assert abs(got - truth) < 0.02 + 4 * se


@pytest.mark.parametrize("d", [1, 7, 30])
def test_one_gaussian_is_exact(d):
    rng = np.random.default_rng(d)
    tril = np.tril(rng.normal(size=(d, d)) * 0.2, -1) + np.diag(rng.uniform(0.5, 1.5, d))
    truth = 0.5 * d * LOG_2PIE + float(np.sum(np.log(np.diag(tril))))  # closed form
    got = _mixing(*_as_f(np.zeros(1), rng.normal(size=(1, d)), tril[None]))
    np.testing.assert_allclose(got, truth, rtol=1e-12 if X64 else 1e-6)


def test_far_apart_components_reach_the_closed_form_limit():
    """Components 200 sd apart: ``r`` is one-hot wherever a component has mass, so
    ``H = sum_i w_i H_i + H(w)`` (the Huber upper bound) to rounding."""
    w = np.array([0.2, 0.5, 0.3])
    sd = np.array([[1.0, 0.5, 2.0], [0.7, 0.7, 0.7], [1.5, 1.0, 0.3]])
    locs = np.array([[0.0, 0.0, 0.0], [400.0, 0.0, 0.0], [0.0, -400.0, 0.0]])
    truth = float(np.sum(w * (0.5 * 3 * LOG_2PIE + np.sum(np.log(sd), 1))) - np.sum(w * np.log(w)))
    got = _mixing(*_as_f(np.log(w), locs), None, scale=jnp.asarray(sd, ftype()))
    np.testing.assert_allclose(got, truth, rtol=1e-12 if X64 else 1e-6)


def test_diagonal_path_equals_full_path():
    w, locs, tril = _random_mixture(6, 3, 1.0, 11)
    sd = np.abs(np.diagonal(tril, axis1=1, axis2=2))
    full = _mixing(*_as_f(np.log(w), locs, sd[:, :, None] * np.eye(6)))
    diag = _mixing(*_as_f(np.log(w), locs), None, scale=jnp.asarray(sd, ftype()))
    np.testing.assert_allclose(diag, full, rtol=1e-12 if X64 else 1e-6)


def test_gradient_matches_quadrature_finite_differences():
    """d H / d(mean, sd, logit) of a 1-D mixture: autodiff of the estimator against central
    differences of the SciPy entropy (float64, independent of the package)."""
    w, m, s = np.array([0.3, 0.7]), np.array([-0.5, 1.2]), np.array([0.8, 1.1])

    def truth(theta):
        lg, mm, ss = theta[:2], theta[2:4], theta[4:]
        ww = np.exp(lg - np.logaddexp.reduce(lg))
        return reference.entropy_1d_scipy(ww, mm, ss)

    theta = np.concatenate([np.log(w), m, s])
    eps = 1e-4
    fd = np.array([(truth(theta + eps * e) - truth(theta - eps * e)) / (2 * eps) for e in np.eye(6)])
    f = ftype()
    grad = jax.grad(
        lambda t: mixing_qmc_entropy(t[:2], t[2:4, None], scale=t[4:, None])
    )(jnp.asarray(theta, f))
    np.testing.assert_allclose(np.asarray(grad), fd, atol=2e-3)


@pytest.mark.skipif(not X64, reason="finite differences need float64")
def test_check_grads_full_covariance():
    w, locs, tril = _random_mixture(3, 3, 1.0, 5)
    check_grads(lambda lg, m, t: mixing_qmc_entropy(lg, m, t, num_points=128),
                (jnp.log(jnp.asarray(w)), jnp.asarray(locs), jnp.asarray(tril)), order=1, modes=("rev",))


def _substitution_case():
    """K = 4 overlapping components in 48-D with the ELBO's M = 16 randomised points: K M < 2 d,
    so the rule solves the points by substitution (``gaussian.tril_solve_columns``)."""
    d, K, M = 48, 4, 16
    assert substitution_pays(d, K * M)
    w, locs, tril = _random_mixture(d, K, 0.2, 7)
    return w, locs, tril, M, jax.random.PRNGKey(3)


def test_substitution_path_matches_a_numpy_evaluation_of_the_rule():
    """The randomised rule on the substitution path against the same rule evaluated in float64
    NumPy/SciPy (``reference.mixing_rule``, ``solve_triangular``) on the same shifted points.
    The mixing term is far from zero here (0.12 nats), so an error in it would show."""
    w, locs, tril, M, key = _substitution_case()
    z = np.asarray(shifted_normal_points(key, M, locs.shape[1], ftype()), float)
    truth, mixing_term = reference.mixing_rule(w, locs, tril, z)
    assert mixing_term > 0.1
    got = jax.jit(mixing_qmc_entropy, static_argnames="num_points")(*_as_f(np.log(w), locs, tril), num_points=M, key=key)
    np.testing.assert_allclose(got, truth, rtol=1e-12 if X64 else 1e-6)


@pytest.mark.skipif(not X64, reason="finite differences need float64")
def test_check_grads_full_covariance_by_substitution():
    """Reverse-mode gradient of the substitution path (``custom_linear_solve``'s implicit
    derivative) against finite differences."""
    w, locs, tril, M, key = _substitution_case()
    check_grads(lambda lg, m, t: mixing_qmc_entropy(lg, m, t, num_points=M, key=key),
                (jnp.log(jnp.asarray(w)), jnp.asarray(locs), jnp.asarray(tril)), order=1, modes=("rev",))


@pytest.mark.parametrize(
    "kind,d,K",
    # full: through L^-1 (K M >= 2 d), by substitution; low rank: rank 2
    [("diag", 12, 3), ("full", 12, 3), ("full", 48, 4), ("lowrank", 30, 3)],
)
def test_one_component_at_a_time_matches_the_numpy_rule(monkeypatch, kind, d, K):
    """The memory-bounded path (components visited one at a time by a rematerialised
    ``lax.map``, forced here by setting ``ALL_AT_ONCE_MAX_ELEMENTS`` to 0) of the mixing rule
    and of the low-rank one: its value against the rule evaluated in float64 NumPy/SciPy on
    the same shifted points (``reference.mixing_rule_on_points``), its gradient against the
    all-at-once path's (checked against finite differences elsewhere)."""
    w, locs, tril = _random_mixture(d, K, 0.2, 7)
    M, key = 16, jax.random.PRNGKey(3)
    assert substitution_pays(d, K * M) == (d == 48)
    if kind == "lowrank":  # x = mu + W e + sqrt(D) eps on the (M, r + d) points, as the kernel draws them
        rng = np.random.default_rng(1)
        cov_factor, cov_diag = 0.4 * rng.normal(size=(K, d, 2)), np.exp(0.3 * rng.normal(size=(K, d)))
        z = np.asarray(shifted_normal_points(key, M, 2 + d, ftype()), float)
        x = locs[:, None] + z[:, :2] @ np.swapaxes(cov_factor, -1, -2) + z[:, 2:] * np.sqrt(cov_diag)[:, None]
        tril = np.linalg.cholesky(cov_factor @ np.swapaxes(cov_factor, -1, -2) + cov_diag[:, :, None] * np.eye(d))
        truth, mixing_term = reference.mixing_rule_on_points(w, locs, tril, x)
        kernel, factors = lowrank_kernel.lowrank_mixing_qmc_entropy, _as_f(cov_factor, cov_diag)
    else:
        if kind == "diag":
            scale = np.abs(np.diagonal(tril, axis1=1, axis2=2))
            tril = scale[:, :, None] * np.eye(d)
            factors = (None, jnp.asarray(scale, ftype()))
        else:
            factors = (jnp.asarray(tril, ftype()), None)
        z = np.asarray(shifted_normal_points(key, M, d, ftype()), float)
        truth, mixing_term = reference.mixing_rule(w, locs, tril, z)
        kernel = mixing_kernel.mixing_qmc_entropy
    assert mixing_term > 0.05

    def value_and_grad():  # traced anew: the limits are read while tracing
        f = lambda lg, m, f0, f1: kernel(lg, m, f0, f1, num_points=M, key=key)  # noqa: E731
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 3 if kind == "diag" else 2)))(
            *_as_f(np.log(w), locs), *factors)

    at_once, grads_at_once = value_and_grad()
    monkeypatch.setitem(mixing_kernel.ALL_AT_ONCE_MAX_ELEMENTS, kind, 0)
    one_at_a_time, grads = value_and_grad()
    rtol = 1e-12 if X64 else 2e-6
    np.testing.assert_allclose(one_at_a_time, truth, rtol=rtol)
    np.testing.assert_allclose(at_once, truth, rtol=rtol)
    for g, g0 in zip(grads, grads_at_once):
        np.testing.assert_allclose(g, g0, rtol=1e-9 if X64 else 1e-4, atol=1e-12 if X64 else 1e-5)


def test_fixed_points_are_deterministic_standard_normal_and_per_component():
    points, shifts = component_points(None, 4096, 3, 5, jnp.float64 if X64 else jnp.float32)
    z = np.asarray(points(shifts), float)  # (K, M, d)
    assert z.shape == (3, 4096, 5) and np.isfinite(z).all() and np.abs(z).max() < 6.0
    # moments of N(0, I) per component: i.i.d. draws at n=4096 would be off by ~0.016 (mean)
    # and ~0.016-0.022 (covariance) per entry; the shifted Sobol' sets: means within 5e-3,
    # covariances within 0.011 (measured)
    for zk in z:
        np.testing.assert_allclose(zk.mean(0), 0.0, atol=5e-3)
        np.testing.assert_allclose(np.cov(zk.T), np.eye(5), atol=0.02)
    assert not np.allclose(z[0], z[1])  # one shift per component
    # deterministic, and a component's shift does not depend on how many components there are
    assert fixed_shifts(3, 5) is fixed_shifts(3, 5) and not fixed_shifts(3, 5).flags.writeable
    np.testing.assert_array_equal(fixed_shifts(2, 5), fixed_shifts(3, 5)[:2])


def test_fixed_points_held_as_constants_equal_the_computed_ones(monkeypatch):
    """Up to ``FIXED_POINTS_CONSTANT_MAX`` numbers the fixed rule's points are SciPy's
    quantiles computed once (float64, then rounded); beyond, JAX computes them as the program
    runs. Both are the same points: JAX's quantile of the float-rounded shifted Sobol' points
    against SciPy's (an independent implementation), within float32 rounding; and the default
    entropy is the same by either path."""
    f = ftype()
    K, M, d = 3, 64, 5
    points, shifts = component_points(None, M, K, d, f)
    held = np.asarray(points(shifts), float)
    monkeypatch.setattr(mixing_kernel, "FIXED_POINTS_CONSTANT_MAX", 0)
    points, shifts = component_points(None, M, K, d, f)
    computed = np.asarray(jax.jit(points)(shifts), float)
    assert held.shape == computed.shape == (K, M, d)
    np.testing.assert_allclose(computed, held, rtol=1e-12 if X64 else 2e-5, atol=1e-12 if X64 else 2e-5)

    rng = np.random.default_rng(3)
    mix = dict(locs=jnp.asarray(rng.normal(size=(K, d)) * 0.5, f), scale=jnp.asarray(rng.uniform(0.5, 2, (K, d)), f))
    entropy = lambda: float(mixing_kernel.mixing_qmc_entropy(jnp.log(jnp.full(K, 1 / K, f)), mix["locs"], None, mix["scale"], num_points=M))
    by_runtime = entropy()
    monkeypatch.setattr(mixing_kernel, "FIXED_POINTS_CONSTANT_MAX", 1 << 20)
    np.testing.assert_allclose(entropy(), by_runtime, rtol=1e-12 if X64 else 1e-6)


def test_float32_normal_quantile_against_scipy():
    """The traced normal quantile of the randomised rule's points in float32 (Giles's
    polynomials, ``w`` from ``v`` itself) against SciPy's float64 ``ndtri`` (an independent
    implementation) on ``[2^-24, 1 - 2^-24]``, dense in both tails: within ``2e-6``
    absolute and ``5e-7`` relative (``ndtri`` in float32: ``8e-7`` / ``4e-7``); exactly 0 at
    ``1/2``. ``lax.erf_inv(2 v - 1)``, which rounds ``2 v - 1`` first, is ``3e-4`` off near
    ``v = 2^-24`` and fails this. float64 inputs get JAX's ``ndtri`` (within ``1e-14``)."""
    from scipy.special import ndtri

    lo = 2.0**-24
    tail = np.geomspace(lo, 0.5, 20_001)
    v = np.concatenate([tail, 1.0 - tail, np.linspace(lo, 1.0 - lo, 20_001)]).astype(np.float32)
    v = v[(v >= np.float32(lo)) & (v <= np.float32(1.0 - lo))]
    got = np.asarray(mixing_kernel.normal_quantile_traced(jnp.asarray(v, jnp.float32)), float)
    want = ndtri(v.astype(float))
    err = np.abs(got - want)
    assert err.max() <= 2e-6
    big = np.abs(want) > 1e-3
    assert (err[big] / np.abs(want[big])).max() <= 5e-7
    assert float(mixing_kernel.normal_quantile_traced(jnp.asarray([0.5], jnp.float32))[0]) == 0.0
    if X64:
        v64 = jnp.asarray(v, jnp.float64)
        np.testing.assert_allclose(np.asarray(mixing_kernel.normal_quantile_traced(v64)), ndtri(v.astype(float)), rtol=1e-14, atol=1e-14)


def _compiled_floor_count(fn, *args) -> int:
    """Number of ``floor`` operations in the CPU program XLA compiled for ``fn(*args)``: the
    points' ``frac(u + s)`` is the only ``floor`` of the mixing rules."""
    return jax.jit(fn).lower(*args).compile().as_text().count(" floor(")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="counts operations of XLA's CPU fusion")
@pytest.mark.parametrize(
    "kind, d, key, most",
    [("lowrank", 40, True, 1), ("lowrank", 40, "vmap", 1), ("lowrank", 40, False, 1), ("diag", 100, False, 2),
     ("lowrank", 400, False, 2)],
    ids=["lowrank-keyed", "lowrank-keyed-vmapped", "lowrank-fixed-all-at-once", "diag-fixed-one-at-a-time",
         "lowrank-fixed-one-at-a-time"],
)
def test_points_are_computed_once_per_pass(kind, d, key, most):
    """XLA's CPU fusion copied the points' shift, ``floor`` and normal quantile into every
    kernel that used them: 6 copies in the low-rank rule's value and gradient with a key
    (``d = 40``; also vmapped over 4 keys, as several particles), 4 in the fixed rule with all
    components at once (a ``vmap``), 8 visiting one component at a time (diagonal
    ``d = 100``, low rank ``d = 400``, ``K = 3``, 1024 points; ``K M d`` quantiles each), about
    1 ms of CPU of the ``d = 1000`` low-rank SVI step's 3. The points now come from a
    conditional, which no fusion crosses: once, and one component at a time once in the
    forward and once in the rematerialised backward pass (``most``). The values are SciPy's
    quantile of the same shifted Sobol' points (float64 reference, float32 within rounding)."""
    f = ftype()
    K = 3
    rng = np.random.default_rng(0)
    loc = jnp.asarray(rng.normal(size=(K, d)), f)
    if kind == "diag":
        make = lambda p: GaussianMixture(loc + p, scale=jnp.ones((K, d), f))
    else:
        make = lambda p: GaussianMixture(loc + p, cov_factor=jnp.full((K, d, 2), 0.3, f), cov_diag=jnp.ones((K, d), f))
    if key == "vmap":
        entropy = lambda p, k: jnp.sum(jax.vmap(lambda kk: make(p).entropy(key=kk, num_points=16))(jax.random.split(k, 4)))
    else:
        entropy = (lambda p, k: make(p).entropy(key=k, num_points=16)) if key else (lambda p, k: make(p).entropy())
    assert _compiled_floor_count(jax.value_and_grad(entropy), jnp.zeros((), f), jax.random.PRNGKey(0)) <= most

    from scipy.special import ndtri

    k = jax.random.PRNGKey(7)
    z = np.asarray(shifted_normal_points(k, 16, 9, f), float)
    dt = np.float64 if X64 else np.float32  # frac(u + s) rounded as the points are
    u = mixing_kernel.sobol_points(16, 9).astype(dt) + np.asarray(jax.random.uniform(k, (9,), f))
    expected = ndtri(np.clip(u - np.floor(u), 2.0**-24, 1 - 2.0**-24).astype(float))
    np.testing.assert_allclose(z, expected, rtol=1e-12 if X64 else 1e-5, atol=1e-12 if X64 else 1e-5)


@pytest.mark.parametrize("bad", [0, 3, 1000])
def test_bad_num_points_raises(bad):
    with pytest.raises(ValueError, match="num_points"):
        mixing_qmc_entropy(np.zeros(2), np.zeros((2, 1)), scale=np.ones((2, 1)), num_points=bad)


@pytest.mark.parametrize("d", [1, 2, 3, 5])
def test_auto_dispatches_on_dimension(d):
    w, locs, tril = _random_mixture(d, 3, 1.0, 3)
    args = _as_f(np.log(w), locs, tril)
    got = auto_entropy(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # legendre_entropy at d > 3 warns (tested below)
        want = legendre_entropy(*args) if d <= LEGENDRE_DEFAULT_MAX_DIM else mixing_qmc_entropy(*args)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(mixture_entropy(*args), got)  # the default method


def test_legendre_warns_beyond_its_accurate_dimension():
    d = LEGENDRE_ACCURATE_MAX_DIM + 1
    args = _as_f(np.zeros(2), np.zeros((2, d)), np.ones((2, d)))
    with pytest.warns(UserWarning, match=f"d={d} dimensions"):
        legendre_entropy(args[0], args[1], scale=args[2], order=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        legendre_entropy(args[0], args[1][:, :-1], scale=args[2][:, :-1], order=2)


def test_randomised_gradient_finite_when_the_parameters_are_constants_of_the_program():
    """Diagonal K = 4, d = 1000, 16 shifted points, the gradient vmapped over 64 keys in a
    program that closes over the parameters: XLA's constant folding of the rule made every
    gradient NaN (6 of 6 fresh processes, float32) before the kernel's optimisation barrier;
    with the parameters as arguments it was finite. The reference is that finiteness: the
    gradient with the parameters as arguments, and the same values either way."""
    rng = np.random.default_rng(0)
    f = ftype()
    K, d = 4, 1000
    loc = jnp.asarray(rng.normal(size=(K, d)), f)
    scale = jnp.full((K, d), 0.5, f)
    logits = jnp.zeros(K, f)
    keys = jax.random.split(jax.random.PRNGKey(123), 64)

    def grad(params, key):
        return jax.grad(lambda p: GaussianMixture(p[1], scale=p[2], logits=p[0]).entropy(key=key, num_points=16))(params)

    closed = jax.jit(jax.vmap(lambda k: grad((logits, loc, scale), k)))(keys)
    passed = jax.jit(jax.vmap(grad, (None, 0)))((logits, loc, scale), keys)
    for a, b in zip(closed, passed):
        assert bool(jnp.all(jnp.isfinite(a))) and bool(jnp.all(jnp.isfinite(b)))
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def _tiny_weight_mixture(kind):
    """Two components 3 apart in d = 10, as ``(loc, covariance kwargs of GaussianMixture,
    dense Cholesky factors)``: unit diagonal ones, or low-rank-plus-diagonal ones (rank 2)
    given as low-rank factors or as their dense Cholesky factors."""
    d = 10
    rng = np.random.default_rng(0)
    loc = np.zeros((2, d))
    loc[1, 0] = 3.0
    if kind == "diag":
        scale = np.ones((2, d))
        return loc, {"scale": scale}, np.stack([np.eye(d)] * 2)
    cov_factor = rng.standard_normal((2, d, 2)) * 0.5
    cov_diag = np.exp(rng.uniform(-0.3, 0.3, (2, d)))
    tril = np.linalg.cholesky(cov_factor @ np.swapaxes(cov_factor, -1, -2) + cov_diag[:, None, :] * np.eye(d))
    if kind == "lowrank":
        return loc, {"cov_factor": cov_factor, "cov_diag": cov_diag}, tril
    return loc, {"scale_tril": tril}, tril


@pytest.mark.parametrize("weight", [0.3, 1e-3, 1e-5])
@pytest.mark.parametrize("kind", ["diag", "full", "lowrank"])
def test_gradient_with_respect_to_the_weights(kind, weight):
    """``d H / d logits`` of the default (the fixed rule's exact derivative) against a NumPy
    Monte Carlo of the identity ``d H / d logit_k = w_k (-E_{N_k}[ln p] - H)``
    (``reference.logit_gradient_monte_carlo``, 2^17 draws per component; d = 10, the second
    component of weight ``weight``): its entry within 10% + 4 standard errors for weights
    ``>= 1e-3`` (measured: at most 6.3%); at ``1e-5``, where the other component's points
    barely reach the light one's region, within 60% (measured up to 33%; docs/accuracy.md,
    "Gradient with respect to a light component's weight")."""
    loc, cov, tril = _tiny_weight_mixture(kind)
    w = np.array([1.0 - weight, weight])
    truth, se = reference.logit_gradient_monte_carlo(w, loc, tril, 2**17, seed=1)
    f = ftype()
    cov = {k: jnp.asarray(v, f) for k, v in cov.items()}
    grad = jax.jit(jax.grad(lambda lg: GaussianMixture(jnp.asarray(loc, f), logits=lg, **cov).entropy()))
    got = np.asarray(grad(jnp.log(jnp.asarray(w, f))), float)
    rel = 0.1 if weight >= 1e-3 else 0.6
    assert abs(got[1] - truth[1]) < rel * abs(truth[1]) + 4 * se[1], (got, truth, se)
