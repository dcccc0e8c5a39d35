"""The package's LAPACK-free ``tril_inverse`` and ``cholesky`` (``_kernels/gaussian.py``) against
NumPy's LAPACK (``numpy.linalg.inv`` / ``cholesky`` in float64) and the closed-form
derivatives ``d(L^-1) = -L^-1 dL L^-1`` and ``dL = L Phi(L^-1 dA L^-T)``.

The dimensions cover every code path. ``tril_inverse``: the static substitution (``d <= 6``),
the doubling from ``1 x 1`` blocks on one base block (``d = 7, 13``: padded to 8 and 16 rows),
the recursive doubling with padding to a power-of-two number of blocks (``d = 17``: 2 blocks
of 9 rows; ``d = 100``: 8 blocks of 13, sliced; ``d = 150``: 16 blocks of 10, gathered) and
without (``d = 40``: 4 blocks of 10); its ``1 x 1`` to ``4 x 4`` levels multiply elementwise.
``cholesky``: the static columns (``d <= 6``), the column loop (``d = 7, 13``) and the blocked
left-looking loop over 16-column blocks, with padding (``d = 17, 40, 100``).
``tril_solve_columns`` (blocked substitution, 16-row blocks), unrolled: exactly two blocks
(``d = 32``) and a shorter last one (``d = 40``); in the ``fori_loop`` beyond 4 blocks,
padded (``d = 100``: 7 blocks; ``d = 150``: 10); ``tril_solve`` on both its paths.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import X64, ftype
from numpyro_gmm._kernels.gaussian import cholesky, cholesky_of_inverse, tril_inverse, tril_solve, tril_solve_columns

DIMS = [1, 3, 6, 7, 13, 17, 40, 100, 150]
# float32: the errors relative to |L^-1| stay within a few hundred ulps at condition number
# 1e4 (measured 2-3e-7 at d = 100 and 300); float64 to round-off.
RTOL = 1e-12 if X64 else 1e-5


def _factor(rng, d, batch=(2, 3), spread=2.0):
    """Cholesky factors of covariances with condition number ``10^spread`` (random rotations
    of log-spaced eigenvalues), plus garbage in the strict upper triangle (must not be read)."""
    q = np.linalg.qr(rng.normal(size=batch + (d, d)))[0]
    cov = q @ (np.logspace(-spread / 2, spread / 2, d)[:, None] * np.swapaxes(q, -1, -2))
    chol = np.linalg.cholesky(cov)
    return chol, cov, chol + np.triu(rng.normal(size=chol.shape), 1)


# The kernels as the package calls them: compiled (``jax.jit``), one program per shape. Called
# eagerly, each operation would be dispatched and compiled on its own.
_tril_inverse = jax.jit(tril_inverse)
_cholesky = jax.jit(cholesky)


def _jvp(f):
    return jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))


def _rel(a, b):
    return np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max()


@pytest.mark.parametrize("d", DIMS)
def test_tril_inverse_and_its_derivative_match_numpy(rng, d):
    chol, _, dirty = _factor(rng, d)
    f = ftype()
    ref = np.linalg.inv(chol)
    assert _rel(_tril_inverse(jnp.asarray(dirty, f)), ref) < RTOL
    tangent = rng.normal(size=chol.shape)  # its upper triangle must be ignored as well
    _, dw = _jvp(tril_inverse)(jnp.asarray(dirty, f), jnp.asarray(tangent, f))
    assert _rel(dw, -ref @ np.tril(tangent) @ ref) < 10 * RTOL


@pytest.mark.parametrize("d", [3, 7, 13, 17, 40, 100])
def test_cholesky_and_its_derivative_match_numpy(rng, d):
    chol, cov, _ = _factor(rng, d)
    f = ftype()
    assert _rel(_cholesky(jnp.asarray(cov, f)), chol) < 10 * RTOL
    sym = rng.normal(size=cov.shape)
    sym = sym + np.swapaxes(sym, -1, -2)
    _, dl = _jvp(cholesky)(jnp.asarray(cov, f), jnp.asarray(sym, f))
    w = np.linalg.inv(chol)
    x = w @ sym @ np.swapaxes(w, -1, -2)
    phi = np.tril(x) - 0.5 * x * np.eye(d)
    assert _rel(dl, chol @ phi) < 100 * RTOL


@pytest.mark.parametrize("d", [3, 13, 40, 100])
def test_cholesky_of_inverse_matches_numpy(rng, d):
    """``chol(A^-1)`` from one factorisation of the reversed ``A`` against NumPy's
    ``cholesky(inv(A))`` in float64 (condition number 1e2 and 1e4), batched; NaN where ``A``
    is not positive definite."""
    f = ftype()
    for spread in (2.0, 4.0):
        _, cov, _ = _factor(rng, d, spread=spread)
        ref = np.linalg.cholesky(np.linalg.inv(cov))
        # float32 measured 5e-7-2e-6 at condition 1e2, 4e-5-8e-5 at 1e4 (d = 3-100)
        assert _rel(jax.jit(cholesky_of_inverse)(jnp.asarray(cov, f)), ref) < 10**spread * (1e-14 if X64 else 1e-6)
    bad = np.eye(d)
    bad[d // 2, d // 2] = -1.0
    assert bool(jnp.any(jnp.isnan(cholesky_of_inverse(jnp.asarray(bad, f)))))


def test_cholesky_of_a_matrix_that_is_not_positive_definite_is_nan():
    """A negative pivot in the third column block (d = 40) gives NaN, not a factor."""
    a = np.eye(40)
    a[37, 37] = -1.0
    assert bool(jnp.any(jnp.isnan(cholesky(jnp.asarray(a, ftype())))))


def test_tril_inverse_blocked_gradient_under_jit_and_vmap(rng):
    """The reverse-mode gradient of a scalar of ``L^-1`` at d = 100 (the doubling path) equals
    ``-W^T G W^T`` (lower triangle), ``G`` the gradient with respect to ``W``, also under
    ``jit(vmap)``."""
    chol, _, _ = _factor(rng, 100, batch=(3,))
    f = ftype()
    weights = rng.normal(size=chol.shape)
    grad = jax.jit(jax.vmap(jax.grad(lambda c, g: jnp.sum(g * tril_inverse(c)))))(
        jnp.asarray(chol, f), jnp.asarray(weights, f)
    )
    w = np.linalg.inv(chol)
    wt = np.swapaxes(w, -1, -2)
    assert _rel(grad, np.tril(-wt @ weights @ wt)) < 10 * RTOL


def _solve_ref(chol, rhs, transpose=False):
    """float64 SciPy triangular solves (``trsm``), batched over leading axes."""
    from scipy.linalg import solve_triangular

    sig = "(d,d),(d,r)->(d,r)"
    return np.vectorize(lambda a, b: solve_triangular(a, b, lower=True, trans=int(transpose)), signature=sig)(chol, rhs)


# d = 32: two substitution blocks exactly; 40: three, the last of 8 rows (both unrolled);
# 100: seven, padded; 150: ten, padded (both in the loop).
@pytest.mark.parametrize("d", [32, 40, 100, 150])
def test_tril_solve_columns_and_its_derivatives_match_scipy(rng, d):
    """``L^-1 B`` by blocked forward substitution against SciPy's float64 ``solve_triangular``;
    its JVP against ``L^-1 (dB - dL Y)``; its reverse-mode gradient (the back substitution
    that ``custom_linear_solve`` transposes to) against ``L^-T G`` for ``B`` and
    ``-tril(L^-T G Y^T)`` for ``L``, under ``jit(vmap)``. Garbage above the diagonal of ``L``
    and of ``dL`` must not be read."""
    chol, _, dirty = _factor(rng, d, batch=(3,))
    f = ftype()
    rhs, d_rhs, d_chol, g = (rng.normal(size=s) for s in [(3, d, 5), (3, d, 5), (3, d, d), (3, d, 5)])
    y_ref = _solve_ref(chol, rhs)
    y = jax.jit(tril_solve_columns)(jnp.asarray(dirty, f), jnp.asarray(rhs, f))
    assert _rel(y, y_ref) < 10 * RTOL
    _, dy = jax.jit(lambda c, b, dc, db: jax.jvp(tril_solve_columns, (c, b), (dc, db)))(
        *(jnp.asarray(a, f) for a in (dirty, rhs, d_chol, d_rhs))
    )
    assert _rel(dy, _solve_ref(chol, d_rhs - np.tril(d_chol) @ y_ref)) < 100 * RTOL
    grad = jax.jit(jax.vmap(jax.grad(lambda c, b, w: jnp.sum(w * tril_solve_columns(c, b)), (0, 1))))
    g_chol, g_rhs = grad(*(jnp.asarray(a, f) for a in (dirty, rhs, g)))
    lt_g = _solve_ref(chol, g, transpose=True)  # L^-T G
    assert _rel(g_rhs, lt_g) < 10 * RTOL
    assert _rel(np.tril(g_chol), np.tril(-lt_g @ np.swapaxes(y_ref, -1, -2))) < 100 * RTOL


@pytest.mark.parametrize(
    "d,chol_batch,b_batch,substitutes",
    [
        (40, (3,), (3,), True),  # one vector per factor
        (40, (2, 3), (5, 2, 3), True),  # five per factor, as log_prob of 5 draws
        (40, (3,), (), True),  # b broadcast to every factor
        (40, (1,), (5, 3), False),  # the factors broadcast: through L^-1
        (20, (3,), (3,), False),  # small d
        (40, (3,), (100, 3), False),  # many vectors per factor
    ],
)
def test_tril_solve_matches_scipy_on_either_path(rng, d, chol_batch, b_batch, substitutes):
    """``tril_solve`` with broadcasting, on the path ``substitution_pays`` picks (checked in the
    traced program: the substitution is a ``custom_linear_solve``) and the other."""
    chol, _, dirty = _factor(rng, d, batch=chol_batch)
    b = rng.normal(size=b_batch + (d,))
    shape = np.broadcast_shapes(chol_batch, b_batch)
    ref = _solve_ref(np.broadcast_to(chol, shape + (d, d)), np.broadcast_to(b, shape + (d,))[..., None])[..., 0]
    args = jnp.asarray(dirty, ftype()), jnp.asarray(b, ftype())
    assert ("custom_linear_solve" in str(jax.make_jaxpr(tril_solve)(*args))) == substitutes
    got = jax.jit(tril_solve)(*args)
    assert got.shape == ref.shape
    assert _rel(got, ref) < 10 * RTOL
