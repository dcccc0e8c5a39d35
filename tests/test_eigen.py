"""The LAPACK-free eigen kernels (numpyro_gmm._kernels.eigen) and the low-rank factor of the
initialisation built on them (init_fits.principal_cov_factor), against NumPy's LAPACK
(``numpy.linalg.eigh`` / ``qr``, float64) as the independent reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import X64, ppca_factor

from numpyro_gmm._kernels.eigen import nystrom_eigenpairs, orthonormal_columns, symmetric_eigh
from numpyro_gmm._kernels.init_fits import principal_cov_factor

EPS = 1e-12 if X64 else 1e-6  # about the unit roundoff of the pass
DTYPE = np.float64 if X64 else np.float32


def random_spd(n, log10_spread, seed):
    """``(n, n)`` symmetric positive definite, eigenvalues ``10^u``, ``u`` uniform on
    ``[0, log10_spread]``, random eigenvectors (float64)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return (q * 10 ** rng.uniform(0, log10_spread, n)) @ q.T


@pytest.mark.parametrize("n", [1, 2, 5, 16, 33])
def test_symmetric_eigh_matches_lapack(n):
    # indefinite, eigenvalues of both signs and magnitudes 1e-2 .. 1e2, and a repeated one
    rng = np.random.default_rng(n)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    values = rng.choice([-1.0, 1.0], n) * 10 ** rng.uniform(-2, 2, n)
    values[: n // 3] = 3.0
    a = (q * values) @ q.T
    w, v = jax.jit(symmetric_eigh)(jnp.asarray(a, DTYPE))
    w, v = np.asarray(w, np.float64), np.asarray(v, np.float64)
    norm = np.abs(values).max()
    np.testing.assert_allclose(w, np.sort(values)[::-1], atol=50 * n * EPS * norm)
    assert np.all(np.diff(w) <= 0)
    np.testing.assert_allclose(v.T @ v, np.eye(n), atol=50 * n * EPS)
    np.testing.assert_allclose(a @ v, v * w, atol=50 * n * EPS * norm)


def test_symmetric_eigh_of_a_diagonal_matrix_and_under_vmap():
    # nothing to rotate: the diagonal, sorted, with unit vectors; a batch of two as vmap gives it
    a = np.stack([np.diag([2.0, -1.0, 5.0]), np.diag([1.0, 1.0, 1.0])])
    w, v = jax.jit(jax.vmap(symmetric_eigh))(jnp.asarray(a, DTYPE))
    np.testing.assert_array_equal(np.asarray(w), [[5.0, 2.0, -1.0], [1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(np.abs(np.asarray(v[0])), np.eye(3)[:, [2, 0, 1]])


def test_orthonormal_columns_of_ill_conditioned_and_dependent_columns():
    # columns scaled over 10^0 .. 10^-5 (a Cholesky-QR of Y^T Y fails at cond 10^10 in
    # float32); the span is Y's (projection residual at roundoff) and a column that
    # repeats an earlier one becomes zero
    rng = np.random.default_rng(0)
    y = rng.normal(size=(300, 20)) @ np.diag(10.0 ** np.linspace(0, -5, 20))
    y[:, 7] = 2.0 * y[:, 3]
    q = np.asarray(jax.jit(orthonormal_columns)(jnp.asarray(y, DTYPE)), np.float64)
    kept = [j for j in range(20) if j != 7]
    np.testing.assert_allclose(q[:, kept].T @ q[:, kept], np.eye(19), atol=100 * EPS)
    assert np.abs(q[:, 7]).max() < 10 * EPS ** 0.5
    reference, _ = np.linalg.qr(y[:, kept])
    np.testing.assert_allclose(np.abs(q[:, kept]), np.abs(reference), atol=1e-8 if X64 else 2e-3)


def test_nystrom_eigenpairs_exact_with_a_full_basis_and_on_a_low_rank_matrix():
    # m = n: Q Q^T = I, so the approximation is C itself; m = 12 on C = U U^T + 1e-3 I (rank
    # 8 plus a small part): the 8 leading eigenpairs to the small part's size
    c = random_spd(10, 3, seed=1)
    q, _ = np.linalg.qr(np.random.default_rng(2).normal(size=(10, 10)))
    w, v = jax.jit(nystrom_eigenpairs)(jnp.asarray(q, DTYPE), jnp.asarray(c @ q, DTYPE))
    exact, vectors = np.linalg.eigh(c)
    np.testing.assert_allclose(np.asarray(w), exact[::-1], rtol=1e-9 if X64 else 2e-3, atol=1e-9 if X64 else 2e-3)
    v = np.asarray(v, np.float64)
    np.testing.assert_allclose(np.abs(v[:, 0] @ vectors[:, -1]), 1.0, atol=1e-9 if X64 else 1e-4)

    rng = np.random.default_rng(3)
    u = rng.normal(size=(200, 8)) * np.linspace(1, 10, 8)
    c = u @ u.T + 1e-3 * np.eye(200)
    q, _ = np.linalg.qr(rng.normal(size=(200, 12)))
    q, _ = np.linalg.qr(c @ q)
    w, v = jax.jit(nystrom_eigenpairs)(jnp.asarray(q, DTYPE), jnp.asarray(c @ q, DTYPE))
    exact, vectors = np.linalg.eigh(c)
    np.testing.assert_allclose(np.asarray(w)[:8], exact[::-1][:8], rtol=1e-4)
    overlap = np.abs(np.asarray(v, np.float64)[:, :8].T @ vectors[:, ::-1][:, :8])
    np.testing.assert_allclose(np.diag(overlap), 1.0, atol=1e-3)


@pytest.mark.parametrize("rank", [3, 40])
def test_principal_cov_factor_is_probabilistic_pca_in_units(rank):
    # d = 30, units on scales 1e-2 .. 1e2 (the product function sees the model's
    # coordinates): rank 40 > d: m = d, the eigenpairs are exact and the columns beyond d
    # zero; rank 3 (m = 13 < d) on a covariance whose scaled form has 3 dominant directions:
    # W W^T equals the exact one (NumPy eigh) to the next eigenvalue's share
    d = 30
    rng = np.random.default_rng(4)
    units = 10 ** rng.uniform(-2, 2, d)
    u = rng.normal(size=(d, 3)) * [20.0, 10.0, 5.0]
    c_units = u @ u.T + random_spd(d, 0.3, seed=5)  # eigenvalues of the rest within [1, 2]
    c = c_units * np.outer(units, units)
    w = jax.jit(lambda u_: principal_cov_factor(lambda v: jnp.asarray(c, DTYPE) @ v, u_, rank))(
        jnp.asarray(units, DTYPE))
    w = np.asarray(w, np.float64)
    assert w.shape == (d, rank)
    exact = ppca_factor(c_units, min(rank, d))
    tol = (1e-8 if X64 else 1e-3) if rank > d else 0.05
    np.testing.assert_allclose(w[:, :d] @ w[:, :d].T, exact @ exact.T, atol=tol * np.abs(exact @ exact.T).max())
    if rank > d:
        np.testing.assert_array_equal(w[:, d:], 0.0)


def test_principal_cov_factor_floor_keeps_columns_off_zero():
    # C = the mean-field covariance itself (C_u = I): the exact factor is zero, a stationary
    # point of the ELBO; with min_scale each column has that length instead
    factors = jax.jit(lambda u: [principal_cov_factor(lambda v: u[:, None] ** 2 * v, u, 4, min_scale=m)
                                 for m in (0.1, 0.0)])
    w, w0 = factors(jnp.asarray(np.linspace(0.5, 2.0, 12), DTYPE))
    np.testing.assert_allclose(np.linalg.norm(np.asarray(w, np.float64), axis=0), 0.1, rtol=1e-3)
    assert np.abs(np.asarray(w0)).max() < 1e-3
