"""pytest plugin: ``GaussianMixture`` cases for NumPyro's own ``test/test_distributions.py``.

Used by ``run_numpyro_suite.py``, which fetches the upstream file from the sdist of the
installed numpyro and adds one line after its ``CONTINUOUS = [...]`` registry::

    CONTINUOUS += numpyro_gmm_upstream.register(_DIST_MAP, T)

``register`` puts a SciPy reference for each case's class into upstream's ``_DIST_MAP``
(so ``T`` finds it) and returns the cases. The hooks below then keep only the upstream
tests parametrised by these cases, check that the generic tests this project relies on
are all there (a clear error if the upstream file changed shape), and run upstream's
exact-entropy comparison (``test_entropy_scipy``, ``atol=1e-5``) with this project's
documented tolerance, :data:`ENTROPY_ATOL`.

The reference (:class:`ScipyGaussianMixture`) is float64 NumPy/SciPy and imports nothing
from numpyro_gmm: densities in closed form with a log-sum-exp, moments in closed form,
samples by ``numpy.random``, and the entropy ``-integral p ln p`` by
``scipy.integrate.cubature`` (adaptive Gauss-Kronrod, error estimate below 1e-8 nats).
"""

from __future__ import annotations

import inspect
import math
from functools import lru_cache

import numpy as np
import pytest
from scipy import integrate
from scipy.special import logsumexp

from numpyro_gmm import GaussianMixture

#: Absolute tolerance (nats) of upstream's exact-entropy comparison for these cases: the
#: default estimator (``entropy_method="auto"``) against the cubature reference. Measured
#: errors and the reason for the value: docs/install.md ("NumPyro's own distribution tests").
ENTROPY_ATOL = 3e-3

#: Upstream generic tests that must each collect at least one of these cases; if one is
#: missing the upstream file has changed shape and the run stops with an error.
REQUIRED_TESTS = (
    "test_dist_shape",
    "test_infer_shapes",
    "test_has_rsample",
    "test_args_attributes",
    "test_sample_gradient",
    "test_jit_log_likelihood",
    "test_log_prob",
    "test_entropy_scipy",
    "test_entropy_samples",
    "test_independent_shape",
    "test_log_prob_gradient",
    "test_output_is_array",
    "test_mean_var",
    "test_distribution_constraints",
    "test_expand",
    "test_dist_pytree",
    "test_vmap_dist",
)


# ----------------------------------------------------------------------------- cases
# Upstream calls ``jax_dist(*params)`` and names the parameters by the positional
# arguments of ``jax_dist.__init__``, so each parameterisation gets a subclass whose
# positional arguments are the constructor's keyword arguments of the same names.
class GaussianMixtureScaleLogits(GaussianMixture):
    def __init__(self, loc, scale, logits, *, validate_args=None):
        super().__init__(loc, scale=scale, logits=logits, validate_args=validate_args)


class GaussianMixtureCovLogits(GaussianMixture):
    def __init__(self, loc, covariance_matrix, logits, *, validate_args=None):
        super().__init__(loc, covariance_matrix, logits=logits, validate_args=validate_args)


class GaussianMixtureTrilProbs(GaussianMixture):
    def __init__(self, loc, scale_tril, probs, *, validate_args=None):
        super().__init__(loc, scale_tril=scale_tril, probs=probs, validate_args=validate_args)


class GaussianMixturePrecisionLogits(GaussianMixture):
    def __init__(self, loc, precision_matrix, logits, *, validate_args=None):
        super().__init__(loc, precision_matrix=precision_matrix, logits=logits, validate_args=validate_args)


_LOC3 = np.array([[-1.5, 0.5], [1.0, 1.0], [0.5, -1.5]])
_COV3 = np.array([[[1.0, 0.3], [0.3, 0.8]], [[0.6, -0.2], [-0.2, 1.2]], [[0.9, 0.0], [0.0, 0.5]]])

#: ``(class, params)``; ``GaussianMixture`` itself takes ``(loc, covariance_matrix)`` with
#: equal weights.
CASES = [
    # full covariance, K = 3, d = 2, equal weights
    (GaussianMixture, (_LOC3, _COV3)),
    # diagonal ``scale``, K = 2, d = 3, logits
    (
        GaussianMixtureScaleLogits,
        (
            np.array([[-1.0, 0.5, 2.0], [1.5, -0.5, 1.0]]),
            np.array([[0.8, 1.2, 0.6], [1.0, 0.7, 0.9]]),
            np.array([0.3, -0.4]),
        ),
    ),
    # batch shape (2,): loc and logits batched, the covariances broadcast
    (
        GaussianMixtureCovLogits,
        (np.stack([_LOC3, 0.8 * _LOC3[::-1]]), _COV3, np.array([[0.0, 0.5, -0.5], [1.0, 0.0, 0.2]])),
    ),
    # probs, scale_tril, K = 2, d = 2
    (
        GaussianMixtureTrilProbs,
        (
            np.array([[-1.0, 0.0], [1.2, 0.8]]),
            np.array([[[1.0, 0.0], [0.4, 0.7]], [[0.8, 0.0], [-0.3, 0.9]]]),
            np.array([0.35, 0.65]),
        ),
    ),
    # precision_matrix, K = 2, d = 2, logits
    (
        GaussianMixturePrecisionLogits,
        (
            np.array([[0.5, -1.0], [-0.5, 1.5]]),
            np.array([[[1.5, 0.4], [0.4, 1.0]], [[0.8, -0.1], [-0.1, 2.0]]]),
            np.array([-0.2, 0.2]),
        ),
    ),
]
CLASSES = tuple(dict.fromkeys(cls for cls, _ in CASES))


def register(dist_map, T):
    """Called from the patched upstream file: SciPy references into ``dist_map`` (keyed by
    class, as upstream's ``get_sp_dist`` looks them up), and the cases as ``T`` tuples."""
    for cls in CLASSES:
        dist_map[cls] = _reference_for(cls)
    return [T(cls, *params) for cls, params in CASES]


# ------------------------------------------------------------------------- reference
def _reference_for(cls):
    names = [
        p.name
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]

    def make(*params):
        return ScipyGaussianMixture.from_arguments(**dict(zip(names, params)))

    make.__name__ = f"scipy_{cls.__name__}"
    return make


class ScipyGaussianMixture:
    """Float64 reference of one (unbatched) Gaussian mixture, in ``scipy.stats`` style:
    ``logpdf``, ``rvs``, ``mean``, ``cov`` (attributes, as ``multivariate_normal``'s) and
    ``entropy()``."""

    def __init__(self, weights, locs, covs):
        self.weights = np.asarray(weights, np.float64)
        self.locs = np.asarray(locs, np.float64)
        self.covs = np.asarray(covs, np.float64)
        K, d = self.locs.shape
        if self.weights.shape != (K,) or self.covs.shape != (K, d, d):
            raise ValueError(
                "the reference is defined for one mixture: weights (K,), locs (K, d), covs (K, d, d); "
                f"got {self.weights.shape}, {self.locs.shape}, {self.covs.shape}"
            )
        self._tril = np.linalg.cholesky(self.covs)
        self._inv_tril = np.linalg.inv(self._tril)
        self._log_norm = (
            np.log(self.weights)
            - np.log(np.diagonal(self._tril, axis1=-2, axis2=-1)).sum(-1)
            - 0.5 * d * math.log(2 * math.pi)
        )
        self.mean = self.weights @ self.locs
        dev = self.locs - self.mean
        self.cov = np.einsum("k,kij->ij", self.weights, self.covs) + np.einsum("k,ki,kj->ij", self.weights, dev, dev)

    @classmethod
    def from_arguments(cls, loc, covariance_matrix=None, scale_tril=None, precision_matrix=None, scale=None, logits=None, probs=None):
        """From ``GaussianMixture``'s arguments (one mixture, float64)."""
        loc = np.asarray(loc, np.float64)
        K, d = loc.shape[-2:]
        if covariance_matrix is not None:
            covs = np.asarray(covariance_matrix, np.float64)
        elif scale_tril is not None:
            tril = np.asarray(scale_tril, np.float64)
            covs = tril @ np.swapaxes(tril, -1, -2)
        elif precision_matrix is not None:
            covs = np.linalg.inv(np.asarray(precision_matrix, np.float64))
        else:
            covs = np.square(np.asarray(scale, np.float64))[..., None] * np.eye(d)
        if logits is not None:
            lg = np.asarray(logits, np.float64)
            weights = np.exp(lg - logsumexp(lg, axis=-1, keepdims=True))
        elif probs is not None:
            weights = np.asarray(probs, np.float64)
        else:
            weights = np.full(K, 1.0 / K)
        return cls(weights, loc, covs)

    def logpdf(self, x):
        x = np.asarray(x, np.float64)
        z = np.einsum("kij,...kj->...ki", self._inv_tril, x[..., None, :] - self.locs)
        return logsumexp(self._log_norm - 0.5 * np.sum(z * z, -1), axis=-1)

    def rvs(self, size=(), random_state=0):
        rng = np.random.default_rng(random_state)
        size = (size,) if isinstance(size, int) else tuple(size)
        k = rng.choice(len(self.weights), size=size, p=self.weights / self.weights.sum())
        eps = rng.standard_normal(size + self.locs.shape[-1:])
        return self.locs[k] + np.einsum("...ij,...j->...i", self._tril[k], eps)

    def entropy(self):
        return _cubature_entropy(self.weights.tobytes(), self.locs.tobytes(), self.covs.tobytes(), self.locs.shape)


@lru_cache(maxsize=None)
def _cubature_entropy(w_bytes, loc_bytes, cov_bytes, shape):
    """``-integral p ln p`` over a box of +-9 component standard deviations around every
    component (the integrand's mass outside is below 1e-15 nats), adaptive Gauss-Kronrod
    (``scipy.integrate.cubature``, rule gk21) to a relative error estimate of 1e-9."""
    K, d = shape
    ref = ScipyGaussianMixture(
        np.frombuffer(w_bytes), np.frombuffer(loc_bytes).reshape(K, d), np.frombuffer(cov_bytes).reshape(K, d, d)
    )

    def integrand(x):
        lp = ref.logpdf(x)
        return -np.exp(lp) * lp

    sd = np.sqrt(np.diagonal(ref.covs, axis1=-2, axis2=-1))
    res = integrate.cubature(
        integrand, (ref.locs - 9 * sd).min(0), (ref.locs + 9 * sd).max(0),
        rule="gk21", rtol=1e-9, atol=1e-12, max_subdivisions=100_000,
    )
    if res.status != "converged" or not res.error < 1e-8:
        raise RuntimeError(f"cubature reference did not converge: {res.status}, error {res.error:.1e}")
    return float(res.estimate)


# ----------------------------------------------------------------------------- hooks
#: (case id, |default entropy - cubature|) of each exact-entropy comparison that ran
#: (collected from the test reports, so also from pytest-xdist workers).
ENTROPY_ERRORS: list[tuple[str, float]] = []


def _is_ours(item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    return any(isinstance(v, type) and v in CLASSES for v in callspec.params.values())


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection, so the shape check sees every test
def pytest_collection_modifyitems(session, config, items):
    if not any(getattr(m, "CONTINUOUS", None) is not None for m in {getattr(i, "module", None) for i in items} if m):
        raise pytest.UsageError(
            "numpyro_gmm_upstream: no collected module has a CONTINUOUS registry; "
            "run the suite through tests/upstream/run_numpyro_suite.py"
        )
    ours = [i for i in items if _is_ours(i)]
    if not ours:
        raise pytest.UsageError(
            "numpyro_gmm_upstream: no upstream test is parametrised by the GaussianMixture cases; "
            "the CONTINUOUS registry patch did not take effect (upstream file changed shape?)"
        )
    found = {i.originalname for i in ours}
    missing = [t for t in REQUIRED_TESTS if t not in found]
    if missing:
        raise pytest.UsageError(
            "numpyro_gmm_upstream: upstream test_distributions.py changed shape: these generic tests "
            f"no longer collect the GaussianMixture cases: {missing}. Update REQUIRED_TESTS in "
            "tests/upstream/numpyro_gmm_upstream.py after checking what replaced them."
        )
    config.hook.pytest_deselected(items=[i for i in items if not _is_ours(i)])
    items[:] = ours


@pytest.fixture(autouse=True)
def _gmm_entropy_tolerance(request, monkeypatch):
    """In upstream's ``test_entropy_scipy`` for these cases, its ``assert_allclose(actual,
    expected, atol=1e-5)`` runs with ``atol=ENTROPY_ATOL`` instead (and nothing else)."""
    item = request.node
    if getattr(item, "originalname", None) != "test_entropy_scipy" or not _is_ours(item):
        yield
        return
    calls = []

    def within_tolerance(actual, desired, *args, **kwargs):
        if args or set(kwargs) - {"atol", "rtol"} or len(calls):
            raise AssertionError(
                "upstream test_entropy_scipy changed shape (expected one assert_allclose(actual, "
                f"expected, atol=...) call, got args {args}, kwargs {sorted(kwargs)}, call {len(calls) + 1})"
            )
        err = float(np.max(np.abs(np.asarray(actual, np.float64) - np.asarray(desired, np.float64))))
        calls.append(err)
        item.user_properties.append(("gmm_entropy_error", err))  # reaches the controller under xdist
        np.testing.assert_allclose(actual, desired, rtol=0, atol=ENTROPY_ATOL)

    monkeypatch.setattr(item.module, "assert_allclose", within_tolerance)
    yield


def pytest_runtest_logreport(report):
    if report.when == "call":
        ENTROPY_ERRORS.extend((report.nodeid.split("[", 1)[-1].rstrip("]"), v) for k, v in report.user_properties if k == "gmm_entropy_error")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    tr.section("numpyro_gmm: GaussianMixture in NumPyro's test_distributions.py")
    counts = {k: len(tr.stats.get(k, [])) for k in ("passed", "failed", "skipped", "error", "xfailed", "xpassed")}
    if tr.stats.get("deselected"):  # (pytest-xdist workers do not report them)
        counts["deselected"] = len(tr.stats["deselected"])
    tr.write_line("  " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for reason in sorted({str(r.longrepr[2]) for r in tr.stats.get("skipped", []) if isinstance(r.longrepr, tuple)}):
        tr.write_line(f"  skip reason: {reason}")
    for cid, err in ENTROPY_ERRORS:
        tr.write_line(f"  exact entropy: |default - cubature| = {err:.2e} nats (tolerance {ENTROPY_ATOL:g}) [{cid}]")
