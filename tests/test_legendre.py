"""The Legendre entropy engine against independent references.

References: ``reference.py`` (itertools + covariance-form Gaussian products + quadrature
Legendre coefficients, float64), ``scipy.stats.Mixture.entropy`` (1-D), dense 2-D
quadrature, and closed forms.
"""

import math
from functools import partial
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import reference
from conftest import X64, ftype
from numpyro_gmm import DEFAULT_ORDER, FLOAT32_SAFE_ORDER, legendre_entropy
from numpyro_gmm._kernels.legendre import legendre_log_coefficients
from numpyro_gmm._kernels.power_integrals import log_power_integrals


def random_mixture(rng, K, d, spread=2.0):
    logits = rng.normal(size=K)
    locs = spread * rng.normal(size=(K, d))
    A = rng.normal(size=(K, d, d)) * 0.4
    covs = A @ np.swapaxes(A, -1, -2) + np.eye(d) * rng.uniform(0.3, 1.5, size=(K, 1, 1))
    return logits, locs, covs


def as_f(*xs):
    return [jnp.asarray(x, ftype()) for x in xs]


_COMPILED = {}


def H(*args, scale=None, **static):
    """``legendre_entropy(*args, scale=scale, **static)`` compiled as one program per static
    options (``order``, ``block_size``, ``a``) and shapes. The same code, traced: called
    eagerly, each of its few hundred operations compiles separately (~50 ms each on CPU).
    Eager calls stay where the test is about eager behaviour (errors, warnings, NaN, the
    jit/vmap-versus-loop comparison)."""
    key = tuple(sorted(static.items()))
    if key not in _COMPILED:
        _COMPILED[key] = jax.jit(lambda *a, scale=None: legendre_entropy(*a, scale=scale, **dict(key)))
    return _COMPILED[key](*args, scale=scale)


def weights(logits):
    w = np.exp(logits - logits.max())
    return w / w.sum()


@pytest.mark.parametrize("order", [1, 2, 5, 8, 12])
def test_coefficients_match_quadrature_projection(order):
    expected = reference.shifted_legendre_log_coefficients(order)
    np.testing.assert_allclose(legendre_log_coefficients(order), expected, rtol=1e-7, atol=1e-6)


# d = 4 and 6 exercise the unrolled and LAPACK paths; the accuracy warning is not the point here.
@pytest.mark.filterwarnings("ignore:legendre_entropy in d=:UserWarning")
@pytest.mark.parametrize("K,d,order", [(1, 1, 3), (2, 1, 4), (3, 2, 4), (4, 2, 3), (2, 3, 5), (3, 1, 6), (2, 4, 3), (3, 6, 3)])
def test_matches_independent_float64_formula(rng, K, d, order):
    logits, locs, covs = random_mixture(rng, K, d)
    expected = reference.legendre_entropy(order, weights(logits), locs, covs)
    got = H(*as_f(logits, locs, np.linalg.cholesky(covs)), order=order)
    # float64: the same formula to 1e-8; float32: within the float32 accuracy claim (1e-3).
    np.testing.assert_allclose(got, expected, atol=1e-8 if X64 else 1e-3, rtol=0)


@pytest.mark.parametrize("K,d", [(2, 1), (3, 2), (5, 2)])
def test_power_integrals_match_reference(rng, K, d):
    logits, locs, covs = random_mixture(rng, K, d)
    # jitted, as the estimators call it (eagerly each operation would compile on its own)
    f = jax.jit(partial(log_power_integrals, n_max=5, block_size=7))
    got = f(*as_f(jax.nn.log_softmax(logits), locs, np.linalg.cholesky(covs)))
    expected = [reference.log_power_integral(n, weights(logits), locs, covs) for n in range(2, 6)]
    np.testing.assert_allclose(got, expected, rtol=1e-10 if X64 else 2e-5, atol=1e-10 if X64 else 2e-5)


def test_diagonal_path_equals_full_path(rng):
    logits, locs, _ = random_mixture(rng, 4, 3)
    sd = rng.uniform(0.5, 1.5, size=(4, 3))
    full = H(*as_f(logits, locs, np.eye(3) * sd[:, None, :]), order=6)
    diag = H(*as_f(logits, locs), scale=jnp.asarray(sd, ftype()), order=6)
    np.testing.assert_allclose(diag, full, atol=1e-10 if X64 else 2e-4)


# (weights, means, sds, tolerance). The last case is the worst 1-D mixture measured at
# order 8 (error +0.030 in float32 and float64; order 10 gives +0.002): four equal
# components 3.3 sd apart, where the paper's bound a is 4x max p. It is kept, with its
# measured error as the bound, so that the documented 1-D worst case stays true.
ONE_D = [
    ([0.5, 0.5], [-1.0, 1.0], [1.0, 1.0], 0.02),
    ([0.2, 0.8], [0.0, 3.0], [0.5, 1.5], 0.02),
    ([0.3, 0.3, 0.4], [-4.0, 0.0, 4.0], [1.0, 0.7, 1.2], 0.02),
    ([0.5, 0.5], [-3.0, 3.0], [1.0, 1.0], 0.02),
    ([0.1, 0.9], [0.0, 2.0], [0.3, 1.0], 0.02),
    ([0.25, 0.25, 0.25, 0.25], [-3.0, -1.0, 1.0, 3.0], [0.6, 0.6, 0.6, 0.6], 0.035),
]


@pytest.mark.parametrize("w,m,s,tol", ONE_D)
def test_default_order_accuracy_1d_scipy(w, m, s, tol):
    expected = reference.entropy_1d_scipy(w, m, s)  # scipy.stats.Mixture(...).entropy()
    got = H(*as_f(np.log(w), np.array(m)[:, None]), scale=jnp.asarray(np.array(s)[:, None], ftype()))
    assert abs(float(got) - expected) < tol


TWO_D = [
    ([0.5, 0.5], [[-1.5, 0.0], [1.5, 0.0]], [np.eye(2), np.eye(2)]),
    ([0.3, 0.7], [[0.0, 1.0], [1.5, -0.5]], [[[1, 0.3], [0.3, 0.5]], [[0.7, 0], [0, 1.2]]]),
    ([0.2, 0.3, 0.5], [[-3, 0], [0, 3], [3, 0]], [np.eye(2) * 0.5, [[1, -0.4], [-0.4, 1]], np.eye(2)]),
]


@pytest.mark.parametrize("w,m,S", TWO_D)
def test_default_order_accuracy_2d_quadrature(w, m, S):
    w, m, S = np.array(w, float), np.array(m, float), np.array(S, float)
    expected = reference.entropy_2d_quadrature(w, m, S)  # dense trapezoid grid
    got = H(*as_f(np.log(w), m, np.linalg.cholesky(S)), order=DEFAULT_ORDER)
    assert abs(float(got) - expected) < 0.02


@pytest.mark.parametrize("order", [1, 3, 8])
def test_single_2d_gaussian_is_exact(order):
    """For one 2-D Gaussian with a = max p, u = p/a is uniform on [0, 1], so every order is
    exact: H = ln(2 pi e) + ln|L| (closed form). In float32 the series' cancellation
    leaves up to 5e-4 at order 8, inside the float32 claim (1e-3 up to FLOAT32_SAFE_ORDER)."""
    L = np.array([[[1.3, 0.0], [0.4, 0.6]]])
    expected = math.log(2 * math.pi * math.e) + math.log(1.3 * 0.6)
    got = H(*as_f(np.zeros(1), np.array([[0.5, -2.0]]), L), order=order)
    np.testing.assert_allclose(got, expected, atol=1e-10 if X64 else 1e-3)


def test_identical_components_equal_one_component():
    L = np.array([[1.0, 0.0], [0.3, 0.8]])
    one = H(*as_f(np.zeros(1), np.zeros((1, 2)) + 1.0, L[None]), order=5)
    three = H(*as_f(np.log([0.2, 0.5, 0.3]), np.ones((3, 2)), np.stack([L] * 3)), order=5)
    np.testing.assert_allclose(three, one, atol=1e-10 if X64 else 1e-4)
    np.testing.assert_allclose(one, math.log(2 * math.pi * math.e) + math.log(0.8), atol=1e-9 if X64 else 1e-3)


def test_jit_and_vmap_equal_loop(rng):
    batch = [random_mixture(rng, 3, 2) for _ in range(4)]
    logits = np.stack([b[0] for b in batch])
    locs = np.stack([b[1] for b in batch])
    tril = np.linalg.cholesky(np.stack([b[2] for b in batch]))
    f = jax.jit(jax.vmap(lambda l, m, t: legendre_entropy(l, m, t, order=5)))
    got = f(*as_f(logits, locs, tril))
    loop = [legendre_entropy(*as_f(logits[i], locs[i], tril[i]), order=5) for i in range(4)]
    np.testing.assert_allclose(got, np.array(loop), rtol=1e-12 if X64 else 1e-5)


@pytest.mark.skipif(not X64, reason="finite differences need float64")
def test_gradients_match_finite_differences(rng):
    logits, locs, covs = random_mixture(rng, 3, 2)
    tril = np.linalg.cholesky(covs)
    f = lambda lg, m, t: legendre_entropy(lg, m, t, order=4, block_size=5)  # noqa: E731
    check_grads(f, (logits, locs, tril), order=1, modes=["rev", "fwd"], atol=1e-5, rtol=1e-5)
    g = lambda lg, m, s: legendre_entropy(lg, m, scale=s, order=4)  # noqa: E731
    check_grads(g, (logits, locs, rng.uniform(0.5, 1.5, (3, 2))), order=1, modes=["rev"], atol=1e-5, rtol=1e-5)


def test_block_size_does_not_change_the_value(rng):
    logits, locs, covs = random_mixture(rng, 5, 2)
    args = as_f(logits, locs, np.linalg.cholesky(covs))
    ref = H(*args, order=6, block_size=4096)
    for bs in [1, 7, 64]:
        np.testing.assert_allclose(H(*args, order=6, block_size=bs), ref, rtol=1e-12 if X64 else 1e-5)


def test_user_bound_a(rng):
    """A larger valid bound gives a different but still accurate value (1-D, scipy reference)."""
    w, m, s, _ = ONE_D[0]
    args = as_f(np.log(w), np.array(m)[:, None])
    sc = jnp.asarray(np.array(s)[:, None], ftype())
    paper_a = sum(wi / math.sqrt(2 * math.pi) / si for wi, si in zip(w, s))
    same = H(*args, scale=sc, a=paper_a)
    np.testing.assert_allclose(same, H(*args, scale=sc), rtol=1e-10 if X64 else 1e-5)
    looser = H(*args, scale=sc, a=1.5 * paper_a)
    assert abs(float(looser) - reference.entropy_1d_scipy(w, m, s)) < 0.05


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(logits=np.zeros(3), locs=np.zeros((2, 1)), scale=np.ones((2, 1))), "logits must have shape"),
        (dict(logits=np.zeros(2), locs=np.zeros((2, 1)), scale=np.ones((3, 1))), "scale must have shape"),
        (dict(logits=np.zeros(2), locs=np.zeros((2, 2)), scale_tril=np.ones((2, 2, 3))), "scale_tril must have shape"),
        (dict(logits=np.zeros(2), locs=np.zeros(2), scale=np.ones((2, 1))), "locs must have shape"),
        (dict(logits=np.zeros(0), locs=np.zeros((0, 1)), scale=np.ones((0, 1))), "K >= 1"),
        (dict(logits=np.zeros(2), locs=np.zeros((2, 0)), scale=np.ones((2, 0))), "d >= 1"),
        (dict(logits=np.zeros(2), locs=np.zeros((2, 1))), "exactly one"),
        (dict(logits=np.zeros(1), locs=np.zeros((1, 1)), scale=np.ones((1, 1)), order=0), "order"),
        (dict(logits=np.zeros(1), locs=np.zeros((1, 1)), scale=np.ones((1, 1)), order=2.5), "order"),
        (dict(logits=np.zeros(1), locs=np.zeros((1, 1)), scale=np.ones((1, 1)), order=True), "order"),
        (dict(logits=np.zeros(1), locs=np.zeros((1, 1)), scale=np.ones((1, 1)), block_size=0), "block_size"),
        (dict(logits=np.zeros(1), locs=np.zeros((1, 1)), scale=np.ones((1, 1)), a=np.ones(2)), "a must be"),
    ],
)
def test_bad_input_raises_before_tracing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        legendre_entropy(**kwargs)


@pytest.mark.parametrize("bad", ["nan_loc", "inf_loc", "nan_logit", "nan_scale", "inf_scale"])
def test_non_finite_parameters_give_nan(bad):
    logits, locs, scale = np.zeros(2), np.array([[0.0], [1.0]]), np.ones((2, 1))
    if bad == "nan_loc":
        locs[0, 0] = np.nan
    elif bad == "inf_loc":
        locs[1, 0] = np.inf
    elif bad == "nan_logit":
        logits[0] = np.nan
    elif bad == "nan_scale":
        scale[0, 0] = np.nan
    else:
        scale[1, 0] = np.inf
    assert np.isnan(legendre_entropy(*as_f(logits, locs), scale=jnp.asarray(scale, ftype())))
    assert np.isnan(jax.jit(lambda s: legendre_entropy(*as_f(logits, locs), scale=s))(jnp.asarray(scale, ftype())))


def test_float32_beyond_safe_order_warns_once():
    args = [jnp.zeros(2, jnp.float32), jnp.array([[0.0], [1.0]], jnp.float32)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        legendre_entropy(*args, scale=jnp.ones((2, 1), jnp.float32), order=FLOAT32_SAFE_ORDER + 1)
    assert len([w for w in caught if issubclass(w.category, UserWarning)]) == 1
    assert "float64" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        legendre_entropy(*args, scale=jnp.ones((2, 1), jnp.float32), order=FLOAT32_SAFE_ORDER)


@pytest.mark.skipif(not X64, reason="float64 pass")
def test_float64_beyond_float32_safe_order_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        legendre_entropy(jnp.zeros(2), jnp.array([[0.0], [1.0]]), scale=jnp.ones((2, 1)), order=FLOAT32_SAFE_ORDER + 2)


def test_strict_dtype_promotion_keeps_input_dtype():
    """No hidden float64 constants: under strict promotion the result keeps the inputs' dtype."""
    dt = ftype()
    locs = jnp.asarray([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]], dt)
    with jax.numpy_dtype_promotion("strict"):
        full = legendre_entropy(jnp.zeros(3, dt), locs, jnp.broadcast_to(jnp.eye(2, dtype=dt), (3, 2, 2)), order=4)
        diag = legendre_entropy(jnp.zeros(3, dt), locs, scale=jnp.ones((3, 2), dt), order=4, a=0.2)
        grad = jax.grad(lambda m: legendre_entropy(jnp.zeros(3, dt), m, scale=jnp.ones((3, 2), dt), order=4))(locs)
    assert full.dtype == diag.dtype == grad.dtype == dt


# Narrow, far-apart components: the Mahalanobis distances between means are in the
# thousands, and the spread Q_m of a composition must be computed without cancelling
# them (float32 once lost 0.06 nats here at order 8).
NARROW = [
    ([0.5, 0.5], [[-2.05], [1.89]], [[[0.11**2]], [[0.09**2]]]),
    ([0.3, 0.3, 0.4], [[-3.0], [-2.9], [4.0]], [[[0.05**2]], [[0.08**2]], [[0.1**2]]]),
    ([0.5, 0.5], [[-2.0, 1.0], [2.0, -1.0]], [[[0.02, 0.005], [0.005, 0.01]], [[0.015, 0.0], [0.0, 0.02]]]),
]


@pytest.mark.parametrize("w,m,S", NARROW)
def test_narrow_separated_components_float32_accuracy(w, m, S):
    w, m, S = np.array(w), np.array(m, float), np.array(S, float)
    L = np.linalg.cholesky(S)
    expected = reference.legendre_entropy(DEFAULT_ORDER, w, m, S)  # independent float64 formula
    full = H(*as_f(np.log(w), m, L))
    np.testing.assert_allclose(full, expected, atol=1e-8 if X64 else 1e-3, rtol=0)
    if m.shape[1] == 1:
        diag = H(*as_f(np.log(w), m), scale=jnp.asarray(L[:, :, 0], ftype()))
        np.testing.assert_allclose(diag, expected, atol=1e-8 if X64 else 1e-3, rtol=0)
        # and the approximation itself is good here (scipy.stats.Mixture)
        assert abs(float(full) - reference.entropy_1d_scipy(w, m[:, 0], L[:, 0, 0])) < 0.02


def test_zero_weight_component_is_ignored(rng):
    """A component with logit -inf (weight 0) gives the entropy of the mixture without it."""
    logits, locs, covs = random_mixture(rng, 3, 2)
    tril = np.linalg.cholesky(covs)
    without = H(*as_f(logits[:2], locs[:2], tril[:2]), order=5)
    logits_zero = logits.copy()
    logits_zero[2] = -np.inf
    with_zero = H(*as_f(logits_zero, locs, tril), order=5)
    np.testing.assert_allclose(with_zero, without, rtol=1e-10 if X64 else 1e-4)
