"""``GaussianMixture`` as a NumPyro distribution, in the style of NumPyro's own tests.

One registry of cases (``CASES``) drives the generic checks. References: NumPyro's own
``MixtureSameFamily(CategoricalLogits, MultivariateNormal)`` built from the raw inputs,
SciPy ``multivariate_normal`` densities in float64, closed-form moments in NumPy float64,
long Monte Carlo runs in NumPy/SciPy float64 (entropy; ``reference.entropy_monte_carlo``)
and z-scores of sample moments.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.test_util import check_grads
from numpyro.distributions.batch_util import vmap_over
from numpyro.infer import Predictive
from numpyro.infer.util import log_density
from scipy import stats
from scipy.special import logsumexp

import reference as reference_mc
from conftest import X64, ftype
from numpyro_gmm import ENTROPY_METHODS, GaussianMixture


# --------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Case:
    """One registry entry. ``param``: which covariance argument is passed; ``weights``:
    ``"logits"``, ``"probs"`` or ``None`` (equal weights). ``*_batch``: leading shapes of
    each raw argument (they broadcast to ``batch``)."""

    K: int
    d: int
    param: str
    weights: str | None
    batch: tuple
    loc_batch: tuple | None = None
    cov_batch: tuple | None = None
    w_batch: tuple | None = None
    seed: int = 0

    def __post_init__(self):
        for f in ("loc_batch", "cov_batch", "w_batch"):
            if getattr(self, f) is None:
                object.__setattr__(self, f, self.batch)

    @property
    def id(self):
        return f"{self.param}-{self.weights}-K{self.K}-d{self.d}-b{'x'.join(map(str, self.batch)) or '0'}"


# A covering subset, not the cartesian product: each parameterisation appears twice, and
# K in {1, 2, 5}, d in {1, 2, 4}, batch shapes (), (3,), (2, 3) and the weight arguments
# rotate; the last case broadcasts differently-shaped leading dimensions.
CASES = [
    Case(1, 1, "covariance_matrix", "logits", ()),
    Case(5, 4, "covariance_matrix", "probs", (3,)),
    Case(2, 2, "scale_tril", "probs", (2, 3)),
    Case(5, 1, "scale_tril", None, (3,)),
    Case(1, 4, "precision_matrix", "logits", (3,)),
    Case(5, 2, "precision_matrix", "probs", ()),
    Case(2, 4, "scale", "logits", (2, 3)),
    Case(1, 2, "scale", None, ()),
    Case(3, 2, "scale_tril", "logits", (2, 3), loc_batch=(3,), cov_batch=(), w_batch=(2, 1)),
]
IDS = [c.id for c in CASES]


def raw_params(case: Case):
    """float64 NumPy parameters of ``case``: ``(loc, covs, weights, kwargs)`` where ``covs``
    are the full covariances (broadcast to their own leading shape) and ``kwargs`` the
    constructor's keyword arguments (in this pass's float dtype)."""
    rng = np.random.default_rng(1000 + case.seed + 17 * case.K + 5 * case.d)
    K, d = case.K, case.d
    loc = 2.0 * rng.normal(size=case.loc_batch + (K, d))
    if case.param == "scale":
        sd = rng.uniform(0.5, 1.5, size=case.cov_batch + (K, d))
        covs = sd[..., :, None] * np.eye(d) * sd[..., None, :]
        factor = sd
    else:
        A = 0.4 * rng.normal(size=case.cov_batch + (K, d, d))
        covs = A @ np.swapaxes(A, -1, -2) + np.eye(d) * rng.uniform(0.4, 1.5, size=case.cov_batch + (K, 1, 1))
        factor = {
            "covariance_matrix": covs,
            "scale_tril": np.linalg.cholesky(covs),
            "precision_matrix": np.linalg.inv(covs),
        }[case.param]
    logits = rng.normal(size=case.w_batch + (K,))
    kwargs = {case.param: factor}
    if case.weights == "logits":
        kwargs["logits"] = logits
    elif case.weights == "probs":
        kwargs["probs"] = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    else:
        logits = np.zeros(case.w_batch + (K,))
    f = ftype()
    kwargs = {k: jnp.asarray(v, f) for k, v in kwargs.items()}
    return loc, covs, logits, kwargs


def make(case: Case, **extra):
    loc, _, _, kwargs = raw_params(case)
    return GaussianMixture(jnp.asarray(loc, ftype()), **kwargs, **extra)


def reference(case: Case):
    """NumPyro's own ``MixtureSameFamily(CategoricalLogits, MultivariateNormal)`` built
    from the raw covariances, broadcast to the full batch."""
    loc, covs, logits, _ = raw_params(case)
    b = case.batch
    f = ftype()
    loc = np.broadcast_to(loc, b + loc.shape[-2:])
    covs = np.broadcast_to(covs, b + covs.shape[-3:])
    logits = np.broadcast_to(logits, b + logits.shape[-1:])
    # validate_args=False: the inputs are valid by construction, and NumPyro's eager constraint
    # checks would compile one program per operation and shape
    return dist.MixtureSameFamily(
        dist.CategoricalLogits(jnp.asarray(logits, f), validate_args=False),
        dist.MultivariateNormal(jnp.asarray(loc, f), covariance_matrix=jnp.asarray(covs, f), validate_args=False),
        validate_args=False,
    )


def dense(case: Case):
    """float64 NumPy ``(weights, loc, covs)`` broadcast to ``batch + ...``."""
    loc, covs, logits, _ = raw_params(case)
    b = case.batch
    w = np.exp(logits - logsumexp(logits, -1, keepdims=True))
    return (
        np.broadcast_to(w, b + w.shape[-1:]),
        np.broadcast_to(loc, b + loc.shape[-2:]),
        np.broadcast_to(covs, b + covs.shape[-3:]),
    )


def tol(f32, f64):
    return f64 if X64 else f32


# Compilation dominates this file: every JAX operation run eagerly on a new shape compiles a
# small program (~50 ms each on CPU). So the reference (NumPyro's own mixture) is built,
# sampled and evaluated inside one jitted function per case, and the code under test is
# called on the same shapes across tests (N_POINTS draws), so its eager operations compile
# once per case and are reused.
N_POINTS = 7


@lru_cache(maxsize=None)
def reference_draws(case: Case, seed: int, n: int):
    """``n`` draws of :func:`reference` and its log densities at them (this pass's dtype),
    computed in one jitted function."""

    def draw(key):
        ref = reference(case)
        x = ref.sample(key, (n,))
        return x, ref.log_prob(x)

    return jax.jit(draw)(jax.random.PRNGKey(seed))


@lru_cache(maxsize=None)
def reference_entropy_mc(case: Case):
    """``(H, standard error)`` per mixture of the batch by a long Monte Carlo run in NumPy/SciPy
    float64 (``tests/reference.py``, ``entropy_monte_carlo``: 2**15 draws per component, stratified, with the
    closed-form component entropies as control variates; no JAX)."""
    w, loc, covs = dense(case)
    h, se = np.empty(case.batch), np.empty(case.batch)
    for i, idx in enumerate(np.ndindex(*case.batch)):
        h[idx], se[idx] = reference_mc.entropy_monte_carlo(w[idx], loc[idx], covs[idx], 2**15, seed=i)
    return h, se


@lru_cache(maxsize=None)
def points(case: Case):
    """``N_POINTS`` draws of the mixture under test (its eager ``sample``), shared by the tests."""
    return make(case).sample(jax.random.PRNGKey(5), (N_POINTS,))


# --------------------------------------------------------------------------- generic checks
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_shapes(case):
    gm = make(case)
    K, d, b = case.K, case.d, case.batch
    assert isinstance(gm, dist.MixtureSameFamily)
    assert gm.batch_shape == b and gm.event_shape == (d,)
    assert gm.num_components == K and gm.mixture_size == K
    assert gm.is_diagonal == (case.param == "scale")
    assert gm.loc.shape == b + (K, d)
    assert gm.scale_tril.shape == b + (K, d, d)
    assert gm.scale is None if case.param != "scale" else gm.scale.shape == b + (K, d)
    assert gm.logits.shape == b + (K,) and gm.probs.shape == b + (K,)
    assert gm.mean.shape == b + (d,) and gm.variance.shape == b + (d,)
    assert gm.covariance_matrix.shape == b + (d, d)
    assert isinstance(gm.mixing_distribution, dist.CategoricalLogits)
    comp = gm.component_distribution
    if gm.is_diagonal:
        assert isinstance(comp, dist.Independent) and isinstance(comp.base_dist, dist.Normal)
    else:
        assert isinstance(comp, dist.MultivariateNormal)
    assert comp.batch_shape == b + (K,) and comp.event_shape == (d,)
    x = gm.sample(jax.random.PRNGKey(0), (N_POINTS,))
    assert x.shape == (N_POINTS,) + b + (d,) and x.dtype == ftype()
    assert gm.log_prob(x).shape == (N_POINTS,) + b
    # no sample_shape: the shape is a tracing result (eval_shape runs the same code, no compile)
    assert jax.eval_shape(lambda g, k: g.sample(k), gm, jax.random.PRNGKey(1)).shape == b + (d,)
    assert gm.entropy().shape == b
    assert gm.support.event_dim == 1
    assert bool(jnp.all(gm.support(x)))
    for a in (gm.loc, gm.scale_tril, gm.probs, gm.mean, gm.covariance_matrix, gm.entropy()):
        assert a.dtype == ftype()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_log_prob_matches_numpyro_and_scipy(case):
    gm = make(case)
    x, ref_lp = reference_draws(case, 2, N_POINTS)
    lp = jax.jit(gm.log_prob)(x)  # one program (eagerly each operation compiles on its own)
    # NumPyro's own MixtureSameFamily(CategoricalLogits, MultivariateNormal), same dtype.
    np.testing.assert_allclose(lp, ref_lp, rtol=1e-5, atol=1e-5)
    # SciPy, float64, component by component.
    w, loc, covs = dense(case)
    xs = np.asarray(x, np.float64)
    expected = np.empty(xs.shape[:-1])
    for idx in np.ndindex(*xs.shape[:-1]):
        b = idx[1:]
        comp = [np.log(w[b + (k,)]) + stats.multivariate_normal(loc[b + (k,)], covs[b + (k,)]).logpdf(xs[idx])
                for k in range(case.K)]
        expected[idx] = logsumexp(comp)
    np.testing.assert_allclose(lp, expected, rtol=tol(2e-5, 1e-10), atol=tol(2e-5, 1e-10))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_moments_closed_form(case):
    gm = make(case)
    w, loc, covs = dense(case)
    mean = np.einsum("...k,...kd->...d", w, loc)
    dev = loc - mean[..., None, :]
    cov = np.einsum("...k,...kij->...ij", w, covs + dev[..., :, None] * dev[..., None, :])
    t = tol(2e-5, 1e-10)
    np.testing.assert_allclose(gm.mean, mean, rtol=t, atol=t)
    np.testing.assert_allclose(gm.covariance_matrix, cov, rtol=t, atol=t)
    np.testing.assert_allclose(gm.variance, np.diagonal(cov, axis1=-2, axis2=-1), rtol=t, atol=t)
    np.testing.assert_allclose(gm.probs, w, rtol=t, atol=t)
    np.testing.assert_allclose(gm.component_covariance_matrix, covs, rtol=tol(1e-4, 1e-10), atol=tol(1e-4, 1e-10))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_sample_moments(case):
    gm = make(case)
    n = 20_000
    # one jitted draw (the eager sample is exercised, on the same code, by test_shapes)
    x = np.asarray(jax.jit(lambda g, k: g.sample(k, (n,)))(gm, jax.random.PRNGKey(3)), np.float64)
    mean, var = np.asarray(gm.mean), np.asarray(gm.variance)
    # z-scores against the closed-form mean and variance (the previous test ties those to
    # NumPy); 5 standard errors, with the variance's standard error from the sample's own
    # fourth central moment.
    xbar = x.mean(0)
    assert np.all(np.abs(xbar - mean) <= 5 * np.sqrt(var / n))
    c = x - xbar
    s2 = (c**2).mean(0)
    se_var = np.sqrt(np.maximum((c**4).mean(0) - s2**2, 0) / n)
    assert np.all(np.abs(s2 - var) <= 5 * se_var + 1e-6)
    # cross-covariances against the mixture covariance matrix (off-diagonal entries)
    if case.d > 1:
        emp = np.einsum("n...i,n...j->...ij", c, c) / n
        cov = np.asarray(gm.covariance_matrix, np.float64)
        sd = np.sqrt(np.diagonal(cov, axis1=-2, axis2=-1))
        # |r_emp - r| <~ (1 - r^2)/sqrt(n) for a correlation; bound the covariance loosely
        assert np.all(np.abs(emp - cov) <= 5 * sd[..., :, None] * sd[..., None, :] * 2 / np.sqrt(n) + 1e-6)


# Accuracy of the Legendre estimate at its default order 8, per dimension. Documented:
# about 0.01 nats in 2-D, 1-D worst case +0.030 (``test_legendre.ONE_D``), degrading with
# dimension (ENTROPY.md section 4: one 5-D Gaussian -0.036). Measured on this registry
# against 400,000-draw Monte Carlo runs of the reference in float64 (standard errors
# <= 0.003), largest |error|: d=1 0.025 (K=5), d=2 0.018 (K=5), d=4 0.040 (K=2, diagonal;
# 0.032 for K=5 full). The bounds keep little slack above those.
ENTROPY_APPROX_ERROR = {1: 0.03, 2: 0.02, 4: 0.05}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_entropy_against_monte_carlo(case):
    gm = make(case)
    # Long Monte Carlo run in NumPy/SciPy float64 (stratified, control variates).
    mc, se = reference_entropy_mc(case)
    h = np.asarray(gm.entropy(), np.float64)
    assert h.shape == case.batch
    bound = ENTROPY_APPROX_ERROR[case.d] + 5 * se
    assert np.all(np.abs(h - mc) <= bound), (h - mc, bound)


# The entropy compiles once per shapes and options (a few seconds each); the checks that
# need fresh compilations of it run on this covering subset (full / diagonal / broadcast).
SUBSET = [CASES[1], CASES[6], CASES[8]]
SUBSET_IDS = [c.id for c in SUBSET]


@pytest.mark.parametrize("case", SUBSET, ids=SUBSET_IDS)
def test_entropy_bounds_bracket_monte_carlo(case):
    """Certified bounds, batched, bracket a long Monte Carlo estimate (NumPy/SciPy, float64;
    up to 5 standard errors and float32 rounding)."""
    gm = make(case)
    mc, se = reference_entropy_mc(case)  # NumPy/SciPy Monte Carlo, as in the test above
    lower, upper = (np.asarray(b, np.float64) for b in gm.entropy_bounds(order=4))
    assert lower.shape == upper.shape == case.batch
    slack = 5 * se + 1e-4
    assert np.all(lower <= mc + slack) and np.all(mc - slack <= upper), (lower, mc, upper)
    assert np.all(lower <= upper)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pytree_round_trip_under_jit(case):
    gm = make(case, entropy_order=6, entropy_method="legendre")
    out = jax.jit(lambda g: g)(gm)
    assert type(out) is GaussianMixture
    assert out.entropy_order == 6 and out.entropy_method == "legendre"
    assert out.is_diagonal == gm.is_diagonal
    assert out.batch_shape == gm.batch_shape and out.event_shape == gm.event_shape
    assert out.num_components == case.K
    assert len(jax.tree.leaves(out)) == len(jax.tree.leaves(gm)) == 3
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(gm)):
        np.testing.assert_array_equal(a, b)
    x = points(case)
    t = tol(1e-5, 1e-12)
    np.testing.assert_allclose(jax.jit(lambda g, x: g.log_prob(x))(gm, x), gm.log_prob(x), rtol=t, atol=t)
    np.testing.assert_allclose(jax.jit(lambda g: g.covariance_matrix)(gm), gm.covariance_matrix, rtol=t, atol=t)
    # built inside a jitted function and returned: configuration kept
    loc, _, _, kwargs = raw_params(case)
    built = jax.jit(lambda l, kw: GaussianMixture(l, **kw, entropy_order=5))(jnp.asarray(loc, ftype()), kwargs)
    assert built.entropy_order == 5 and built.is_diagonal == gm.is_diagonal and built.batch_shape == case.batch
    np.testing.assert_allclose(built.log_prob(x), gm.log_prob(x), rtol=t, atol=t)


@pytest.mark.parametrize("case", SUBSET, ids=SUBSET_IDS)
def test_entropy_under_jit_and_lax_map(case):
    # An ordered method: the Legendre series for d <= 2, the Taylor series beyond (the
    # default "auto" is the mixing rule, which has no order).
    method = "legendre" if case.d <= 2 else "taylor"
    gm = make(case, entropy_method=method, entropy_order=6)
    h6 = gm.entropy()
    # the configured order is used (the check can fail: order 6 and 8 differ)
    assert np.all(np.asarray(h6) != np.asarray(gm.entropy(order=8)))
    np.testing.assert_array_equal(h6, gm.entropy(order=6))
    # float32: the same series compiled inside another jit rounds differently (~1e-4)
    t = tol(5e-4, 1e-10)
    np.testing.assert_allclose(jax.jit(lambda g: g.entropy())(gm), h6, rtol=t, atol=t)
    loc, _, _, kwargs = raw_params(case)
    built = jax.jit(lambda l, kw: GaussianMixture(l, **kw, entropy_method=method, entropy_order=6))(
        jnp.asarray(loc, ftype()), kwargs)
    np.testing.assert_allclose(built.entropy(), h6, rtol=t, atol=t)
    # lax.map over a stack of two copies
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), gm, built)
    h = jax.lax.map(lambda g: g.entropy(), stacked)
    np.testing.assert_allclose(h, jnp.stack([h6, h6]), rtol=t, atol=t)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vmap(case):
    # As NumPyro's test_vmap_dist: vmap the constructor, then vmap functions of the
    # distribution with in_axes from vmap_over.
    loc, _, _, kwargs = raw_params(case)
    loc = jnp.asarray(loc, ftype())
    kw2 = {k: jnp.stack([v, 1.1 * v if k != "probs" else v]) for k, v in kwargs.items()}
    if case.weights is None:  # equal weights are created inside, hence batched by out_axes=0
        kw2["logits"] = jnp.zeros((2,) + case.w_batch + (case.K,), ftype())
    loc2 = jnp.stack([loc, loc + 1.0])
    single = [GaussianMixture(loc2[i], **{k: v[i] for k, v in kw2.items()}) for i in range(2)]
    make_ = lambda l, kw: GaussianMixture(l, **kw)  # noqa: E731
    axes = vmap_over(single[0], loc=0, **{k: 0 for k in kw2})
    out_axes = vmap_over(single[0], loc=0)
    x = points(case)

    # The vmapped functions run inside one jit (the batching rules and the traced Python are
    # those of an eager vmap; one compilation instead of one per batched operation).
    @jax.jit
    def batched_results(loc2, kw2):
        batched = jax.vmap(make_)(loc2, kw2)
        out = dict(
            lp=jax.vmap(lambda g: g.log_prob(x), in_axes=(axes,))(batched),
            s=jax.vmap(lambda g: g.sample(jax.random.PRNGKey(0)), in_axes=(axes,))(batched),
        )
        if case in SUBSET:
            out["h"] = jax.vmap(lambda g: g.entropy(), in_axes=(axes,))(batched)
        # vmap over loc only, out over that attribute only
        only_loc = jax.vmap(lambda l: GaussianMixture(l, **kwargs), out_axes=out_axes)(loc2)
        out["m"] = jax.vmap(lambda g: g.mean, in_axes=(out_axes,))(only_loc)
        return out

    out = batched_results(loc2, kw2)
    if case in SUBSET:
        t = tol(5e-4, 1e-10)  # float32: a batch and one mixture round differently (~1e-4)
        np.testing.assert_allclose(out["h"], jnp.stack([g.entropy() for g in single]), rtol=t, atol=t)
    lp = out["lp"]
    np.testing.assert_allclose(lp, jnp.stack([g.log_prob(x) for g in single]), rtol=tol(1e-5, 1e-12), atol=tol(1e-5, 1e-12))
    assert out["s"].shape == (2,) + case.batch + (case.d,)
    m = out["m"]
    np.testing.assert_allclose(m[1] - m[0], jnp.ones_like(m[0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradients_finite(case):
    loc, _, _, kwargs = raw_params(case)
    loc = jnp.asarray(loc, ftype())
    x = points(case)

    def lp(loc, kw):
        return GaussianMixture(loc, **kw).log_prob(x).sum()

    def ent(loc, kw):
        return GaussianMixture(loc, **kw).entropy().sum()

    for f in (lp, ent):
        g_loc, g_kw = jax.jit(jax.grad(f, argnums=(0, 1)))(loc, kwargs)
        assert g_loc.shape == loc.shape and np.all(np.isfinite(g_loc))
        for k, v in kwargs.items():
            assert g_kw[k].shape == v.shape and np.all(np.isfinite(g_kw[k])), k
        if f is lp:  # (the entropy does not depend on a common shift: zero for K = 1)
            assert np.any(g_loc != 0)


@pytest.mark.skipif(not X64, reason="finite differences need float64")
@pytest.mark.parametrize("case", [CASES[2], CASES[6]], ids=[IDS[2], IDS[6]])
def test_gradients_match_finite_differences(case):
    loc, _, _, kwargs = raw_params(case)
    x = points(case)
    name = case.param

    def f(loc, factor, logits):
        # finite differences perturb every entry; a scale_tril must stay lower triangular
        # (validation refuses it otherwise), so only its lower triangle is a parameter
        kw = {name: jnp.tril(factor) if name == "scale_tril" else factor, "logits": logits}
        g = GaussianMixture(loc, **kw)
        return g.log_prob(x).sum() + g.entropy().sum()

    logits = jnp.zeros(case.batch + (case.K,)) + 0.3 * jnp.arange(case.K)
    check_grads(f, (jnp.asarray(loc), kwargs[name], logits), order=1, modes=["rev"], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- bad input
def _good(d=2, K=2):
    return dict(
        loc=np.zeros((K, d)),
        covariance_matrix=np.broadcast_to(np.eye(d), (K, d, d)).copy(),
    )


BAD_VALUES = [
    # (kwargs, message fragment)
    (dict(covariance_matrix=np.array([[[1.0, 2.0], [2.0, 1.0]]] * 2)), "covariance_matrix"),
    (dict(covariance_matrix=np.array([[[1.0, 0.5], [0.0, 1.0]]] * 2)), "covariance_matrix"),
    (dict(covariance_matrix=None, precision_matrix=-np.broadcast_to(np.eye(2), (2, 2, 2))), "precision_matrix"),
    (dict(covariance_matrix=None, scale_tril=np.array([[[1.0, 0.0], [0.3, -1.0]]] * 2)), "scale_tril"),
    (dict(covariance_matrix=None, scale=np.array([[1.0, 0.0], [1.0, 1.0]])), "scale"),
    (dict(covariance_matrix=None, scale=np.array([[1.0, -0.5], [1.0, 1.0]])), "scale"),
    (dict(probs=np.array([0.3, 0.3])), "probs"),
    (dict(probs=np.array([1.2, -0.2])), "probs"),
    (dict(loc=np.array([[0.0, np.nan], [0.0, 0.0]])), "loc"),
    (dict(logits=np.array([0.0, np.nan])), "logits"),
    (dict(covariance_matrix=np.array([[[1.0, np.nan], [np.nan, 1.0]]] * 2)), "covariance_matrix"),
    (dict(covariance_matrix=None, scale=np.array([[1.0, np.nan], [1.0, 1.0]])), "scale"),
    (dict(probs=np.array([np.nan, 0.5])), "probs"),
]


@pytest.mark.parametrize("bad,match", BAD_VALUES)
def test_bad_values_raise_with_validation(bad, match):
    kw = {**_good(), **bad}
    kw = {k: (None if v is None else jnp.asarray(v, ftype())) for k, v in kw.items()}
    loc = kw.pop("loc")
    with pytest.raises(ValueError, match=match):
        GaussianMixture(loc, **kw, validate_args=True)
    # without validation the constructor does not look at values
    GaussianMixture(loc, **kw, validate_args=False)


def test_validation_follows_numpyro_default():
    kw = {**_good(), "probs": np.array([0.3, 0.3])}
    loc = kw.pop("loc")
    # NumPyro's global switch, restored on exit (the tests after this one see NumPyro's
    # default again, whichever worker runs them)
    with numpyro.validation_enabled(True):
        with pytest.raises(ValueError, match="probs"):
            GaussianMixture(loc, **kw)
    with numpyro.validation_enabled(False):
        GaussianMixture(loc, **kw)


def test_nested_lists_are_arrays():
    """Parameters given as nested Python lists (integers too) make the same mixture as arrays
    (before: ``TypeError: Cannot determine dtype``), are validated like arrays, and may hold
    traced entries under ``jit``. Reference: the same mixture built from arrays, and the
    closed form of one component's log density (SciPy)."""
    x = jnp.asarray([0.5, -1.0], ftype())
    from_lists = GaussianMixture([[0, 1], [2.0, -1]], scale=[[1, 2], [0.5, 1]], logits=[0.0, 1])
    from_arrays = GaussianMixture(jnp.asarray([[0, 1], [2, -1]], ftype()), scale=jnp.asarray([[1, 2], [0.5, 1]], ftype()),
                                  logits=jnp.asarray([0, 1], ftype()))
    assert from_lists.loc.dtype == ftype()
    np.testing.assert_array_equal(from_lists.log_prob(x), from_arrays.log_prob(x))
    np.testing.assert_array_equal(from_lists.entropy(), from_arrays.entropy())
    one = GaussianMixture([[0.0, 1.0]], covariance_matrix=[[[2.0, 0.5], [0.5, 1.0]]])
    expected = stats.multivariate_normal([0.0, 1.0], [[2.0, 0.5], [0.5, 1.0]]).logpdf(np.asarray(x, np.float64))
    np.testing.assert_allclose(one.log_prob(x), expected, rtol=tol(1e-6, 1e-12))
    with pytest.raises(ValueError, match="scale must be positive"):
        GaussianMixture([[0.0], [1.0]], scale=[[1.0], [-1.0]], validate_args=True)
    traced = jax.jit(lambda a: GaussianMixture([[a], [1.0]], scale=[[1.0], [1.0]]).log_prob(x[:1]))(0.0)
    np.testing.assert_array_equal(traced, GaussianMixture([[0.0], [1.0]], scale=[[1.0], [1.0]]).log_prob(x[:1]))


def test_validation_skipped_for_traced_values():
    kw = _good()
    loc = kw.pop("loc")
    f = jax.jit(lambda c: GaussianMixture(loc, c, validate_args=True).mean)
    np.testing.assert_allclose(f(kw["covariance_matrix"]), 0.0)
    with pytest.raises(RuntimeError, match="jitted"):
        jax.jit(lambda c: GaussianMixture(loc, c, validate_args=False).validate_args())(kw["covariance_matrix"])


BAD_SHAPES = [
    (dict(loc=np.zeros(2)), "loc"),
    (dict(loc=np.zeros((0, 2)), covariance_matrix=np.zeros((0, 2, 2))), "loc"),
    (dict(covariance_matrix=np.zeros((2, 3, 3))), "covariance_matrix"),
    (dict(covariance_matrix=np.zeros((3, 2, 2))), "covariance_matrix"),
    (dict(covariance_matrix=np.eye(2)), "covariance_matrix"),
    (dict(covariance_matrix=None, scale_tril=np.zeros((2, 2))), "scale_tril"),
    (dict(covariance_matrix=None, precision_matrix=np.zeros((2, 2, 3))), "precision_matrix"),
    (dict(covariance_matrix=None, scale=np.ones((2, 2, 3))), "scale"),
    (dict(covariance_matrix=None, scale=np.ones((3, 2))), "scale"),
    (dict(logits=np.zeros(3)), "logits"),
    (dict(probs=np.full((2, 3), 1 / 3)), "probs"),
    (dict(covariance_matrix=None), "exactly one"),
    (dict(scale=np.ones((2, 2))), "exactly one"),
    (dict(logits=np.zeros(2), probs=np.full(2, 0.5)), "at most one"),
    (dict(loc=np.zeros((3, 2, 2)), logits=np.zeros((4, 2))), "broadcast"),
    (dict(entropy_method="nope"), "entropy_method"),
    (dict(entropy_order=0), "entropy_order"),
    (dict(entropy_order=2.5), "entropy_order"),
]


@pytest.mark.parametrize("bad,match", BAD_SHAPES)
@pytest.mark.parametrize("validate", [False, True])
def test_bad_shapes_always_raise(bad, match, validate):
    kw = {**_good(), **bad}
    loc = kw.pop("loc")
    with pytest.raises(ValueError, match=match):
        GaussianMixture(loc, **kw, validate_args=validate)


def test_bad_entropy_method_in_call():
    gm = GaussianMixture(**_good())
    with pytest.raises(ValueError, match="method"):
        gm.entropy(method="nope")


# --------------------------------------------------------------------------- dispatch
def test_entropy_dispatch_options(monkeypatch):
    calls = []

    def no_order(logits, locs, scale_tril=None, *, scale=None):
        calls.append(("no_order", scale_tril is None, scale is None))
        return jnp.sum(locs)

    def with_key(logits, locs, scale_tril=None, *, scale=None, key, num_samples=10):
        calls.append(("with_key", num_samples))
        return jax.random.normal(key), jnp.asarray(num_samples, locs.dtype)

    monkeypatch.setitem(ENTROPY_METHODS, "no_order_method", no_order)
    monkeypatch.setitem(ENTROPY_METHODS, "key_method", with_key)
    gm = GaussianMixture(jnp.ones((3, 2, 1)), scale=jnp.ones((3, 2, 1)), entropy_order=5)
    # a configured order is not passed to an estimator without one; the diagonal path
    # passes scale and no scale_tril
    np.testing.assert_allclose(gm.entropy(method="no_order_method"), jnp.full(3, 2.0))
    assert calls[-1] == ("no_order", True, False)
    with pytest.raises(TypeError):
        gm.entropy(method="no_order_method", order=3)  # an explicit order is passed
    est, se = gm.entropy(method="key_method", key=jax.random.PRNGKey(0), num_samples=7)
    assert est.shape == (3,) and se.shape == (3,) and calls[-1] == ("with_key", 7)
    assert len(np.unique(np.asarray(est))) == 3  # one key per mixture of the batch
    # the configured default method and order
    gm2 = GaussianMixture(jnp.ones((2, 1)), scale=jnp.ones((2, 1)), entropy_method="no_order_method")
    np.testing.assert_allclose(gm2.entropy(), 2.0)
    g3 = GaussianMixture(
        jnp.array([[-1.0], [1.0]]), scale=jnp.ones((2, 1)), entropy_method="legendre", entropy_order=3
    )
    assert float(g3.entropy()) == float(g3.entropy(method="legendre", order=3))
    assert float(g3.entropy()) != float(g3.entropy(order=8))


def test_diagonal_path_does_no_dense_work():
    K, d = 3, 5
    gm = GaussianMixture(jnp.zeros((K, d)), scale=jnp.ones((K, d)))
    x = jnp.zeros((4, d))

    def shapes(fn, *args):
        jaxpr = jax.make_jaxpr(fn)(*args)
        out = set()

        def walk(j):
            for eqn in j.eqns:
                for v in list(eqn.invars) + list(eqn.outvars):
                    if hasattr(v, "aval"):
                        out.add(tuple(getattr(v.aval, "shape", ())))
                for p in eqn.params.values():
                    if hasattr(p, "jaxpr"):
                        walk(p.jaxpr if hasattr(p.jaxpr, "eqns") else p.jaxpr.jaxpr)

        walk(jaxpr.jaxpr)
        return out

    for fn, args in [
        (lambda g, x: g.log_prob(x), (gm, x)),
        (lambda g: g.sample(jax.random.PRNGKey(0), (2,)), (gm,)),
        (lambda g: g.entropy(), (gm,)),
        (lambda g: (g.mean, g.variance), (gm,)),
    ]:
        dense_ = [s for s in shapes(fn, *args) if len(s) >= 2 and s[-2:] == (d, d)]
        assert not dense_, dense_
    # the full path does form d x d arrays (the check can fail)
    full = GaussianMixture(jnp.zeros((K, d)), scale_tril=jnp.broadcast_to(jnp.eye(d), (K, d, d)))
    assert [s for s in shapes(lambda g, x: g.log_prob(x), full, x) if s[-2:] == (d, d)]


# --------------------------------------------------------------------------- from_mixture
@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[6]], ids=[IDS[1], IDS[5], IDS[6]])
def test_from_mixture(case):
    gm = make(case, entropy_order=6)
    x = points(case)
    t = tol(1e-5, 1e-12)
    # from the reference MixtureSameFamily(CategoricalLogits, MVN)
    ref = reference(case)
    g1 = GaussianMixture.from_mixture(ref)
    assert not g1.is_diagonal and g1.batch_shape == case.batch
    # the reference's log density in one program (eagerly: one per NumPyro operation)
    np.testing.assert_allclose(g1.log_prob(x), jax.jit(ref.log_prob)(x), rtol=t, atol=t)
    # from a GaussianMixture: configuration kept
    g2 = GaussianMixture.from_mixture(gm)
    assert g2.entropy_order == 6 and g2.is_diagonal == gm.is_diagonal
    np.testing.assert_allclose(g2.log_prob(x), gm.log_prob(x), rtol=t, atol=t)
    # from CategoricalProbs + Normal(...).to_event(1)
    w, loc, _ = dense(case)
    sd = np.linspace(0.5, 1.5, case.d)
    m = dist.MixtureSameFamily(
        dist.CategoricalProbs(jnp.asarray(w, ftype()), validate_args=False),
        dist.Normal(jnp.asarray(loc, ftype()), jnp.asarray(sd, ftype()), validate_args=False).to_event(1),
        validate_args=False,
    )
    g3 = GaussianMixture.from_mixture(m, entropy_order=4)
    assert g3.is_diagonal and g3.entropy_order == 4 and g3.scale.shape == case.batch + (case.K, case.d)
    np.testing.assert_allclose(g3.log_prob(x), jax.jit(m.log_prob)(x), rtol=t, atol=t)


def test_from_mixture_rejects_other_components():
    mix = dist.CategoricalLogits(jnp.zeros(2))
    with pytest.raises(ValueError, match="MultivariateNormal"):
        GaussianMixture.from_mixture(dist.MixtureSameFamily(mix, dist.Normal(jnp.zeros(2), 1.0)))
    with pytest.raises(ValueError, match="MultivariateNormal"):
        GaussianMixture.from_mixture(dist.MixtureSameFamily(mix, dist.Laplace(jnp.zeros((2, 3)), 1.0).to_event(1)))
    with pytest.raises(ValueError, match="MultivariateNormal"):
        GaussianMixture.from_mixture(
            dist.MixtureSameFamily(mix, dist.MultivariateStudentT(3.0, jnp.zeros((2, 3)), jnp.eye(3)))
        )
    with pytest.raises(ValueError, match="MixtureSameFamily"):
        GaussianMixture.from_mixture(dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)))


# --------------------------------------------------------------------------- in models
def _model(data=None):
    loc = numpyro.sample("loc", dist.Normal(0.0, 3.0).expand([2, 2]).to_event(2))
    z = numpyro.sample("z", GaussianMixture(loc, scale=jnp.ones((2, 2)), logits=jnp.array([0.0, 1.0])))
    with numpyro.plate("n", 5):
        numpyro.sample("x", GaussianMixture(loc, scale_tril=jnp.broadcast_to(jnp.eye(2), (2, 2, 2))), obs=data)
    return z


@pytest.mark.float32_pass
def test_sample_site_observed_and_latent():
    data = jnp.arange(10.0).reshape(5, 2) / 5
    params = {"loc": jnp.array([[0.0, 1.0], [2.0, -1.0]]), "z": jnp.array([0.5, 0.5])}
    lp, trace = log_density(_model, (data,), {}, params)
    # independent: the same sum assembled from NumPyro's own classes
    mix = dist.MixtureSameFamily
    expected = (
        dist.Normal(0.0, 3.0).log_prob(params["loc"]).sum()
        + mix(dist.CategoricalLogits(jnp.array([0.0, 1.0])), dist.MultivariateNormal(params["loc"], jnp.eye(2))).log_prob(params["z"])
        + mix(dist.CategoricalLogits(jnp.zeros(2)), dist.MultivariateNormal(params["loc"], jnp.eye(2))).log_prob(data).sum()
    )
    np.testing.assert_allclose(lp, expected, rtol=1e-5)
    assert trace["x"]["is_observed"] and not trace["z"]["is_observed"]
    pred = Predictive(_model, num_samples=6)(jax.random.PRNGKey(0))
    assert pred["z"].shape == (6, 2) and pred["x"].shape == (6, 5, 2) and pred["loc"].shape == (6, 2, 2)
    post = Predictive(_model, posterior_samples={"loc": jnp.zeros((4, 2, 2))})(jax.random.PRNGKey(1))
    assert post["x"].shape == (4, 5, 2)


@pytest.mark.slow
@pytest.mark.parametrize("cov", ["diag", "full", "lowrank"])
def test_gradient_finite_at_a_probability_of_exactly_zero(cov):
    """A weight of exactly 0 (here ``probs = softmax(theta)`` with one ``theta`` 800 below the
    others: the exponential underflows, in float32 already 104 below) made every gradient NaN:
    the logarithm of the probabilities has an infinite derivative there. Reference for
    ``log_prob``: NumPyro's own ``MixtureSameFamily(Categorical(probs), MultivariateNormal)``,
    whose gradient is finite (its ``Categorical`` clamps the probabilities at the smallest
    normal float), through the same softmax. For the entropy and
    its bounds: the gradient with respect to the non-zero probabilities equals that of the
    reduced mixture without the zero-weight component (the values are equal,
    ``test_adversarial.py::test_zero_and_tiny_weights_match_the_reduced_mixture``), and the
    zero one's derivative is 0."""
    f = ftype()
    K, d = 3, 2
    rng = np.random.default_rng(5)
    loc = jnp.asarray(rng.normal(size=(K, d)), f)
    sd = jnp.asarray(np.exp(0.3 * rng.normal(size=(K, d))), f)
    u = jnp.asarray([0.2, 0.0, -800.0], f)  # the last weight 0: the reduced mixture keeps the others' rule points
    to_simplex = jax.nn.softmax
    assert float(to_simplex(u)[2]) == 0.0
    x = jnp.asarray(rng.normal(size=(5, d)), f)

    def make(probs, keep=slice(None)):
        if cov == "diag":
            return GaussianMixture(loc[keep], scale=sd[keep], probs=probs)
        if cov == "full":
            return GaussianMixture(loc[keep], scale_tril=sd[keep, :, None] * jnp.eye(d, dtype=f), probs=probs)
        return GaussianMixture(loc[keep], cov_factor=0.3 * sd[keep, :, None], cov_diag=jnp.square(sd[keep]), probs=probs)

    cov_k = jax.vmap(jnp.diag)(jnp.square(sd))  # the components' covariances, as make() builds them
    if cov == "lowrank":
        cov_k = cov_k + 0.09 * sd[:, :, None] * sd[:, None, :]

    def numpyro_log_prob(v):
        comp = dist.MultivariateNormal(loc, covariance_matrix=cov_k)
        return jnp.sum(dist.MixtureSameFamily(dist.Categorical(probs=to_simplex(v)), comp).log_prob(x))

    ours = jax.grad(lambda v: jnp.sum(make(to_simplex(v)).log_prob(x)))(u)
    theirs = jax.grad(numpyro_log_prob)(u)
    assert bool(jnp.all(jnp.isfinite(ours))), ours
    tol = dict(rtol=1e-9, atol=1e-12) if X64 else dict(rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), **tol)

    probs = to_simplex(u)
    for name, fn in [("entropy", lambda m: m.entropy()), ("lower", lambda m: m.entropy_bounds()[0]),
                     ("upper", lambda m: m.entropy_bounds()[1])]:
        g = jax.grad(lambda p: fn(make(p)))(probs)
        reduced = jax.grad(lambda p: fn(make(p, slice(0, 2))))(probs[:2])
        assert bool(jnp.all(jnp.isfinite(g))), (name, g)
        assert float(g[2]) == 0.0, (name, g)
        np.testing.assert_allclose(np.asarray(g[:2]), np.asarray(reduced), rtol=1e-6 if X64 else 1e-3,
                                   atol=1e-9 if X64 else 1e-4, err_msg=name)
