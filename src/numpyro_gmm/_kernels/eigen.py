r"""Leading eigenpairs of a symmetric positive-definite operator known by its products,
without LAPACK: the low-rank factors of :class:`~numpyro_gmm.AutoGaussianMixture`'s
initialisation (:func:`numpyro_gmm._kernels.init_fits.curvature_cov_factors`).

Like the rest of the package (see the note in :mod:`numpyro_gmm._kernels.gaussian`) these
are plain XLA operations: a batched LAPACK call inside a program can deadlock on a 2-core
CPU, and JAX's ``eigh`` and ``qr`` are LAPACK calls there.

* :func:`orthonormal_columns`: classical Gram-Schmidt applied twice per column ("twice is
  enough": Giraud, Langou, Rozloznik and van den Eshof, *Numer. Math.* 101, 2005), which
  keeps the columns orthogonal to working precision however ill-conditioned the input
  (a Cholesky-QR of ``Y^T Y`` squares the condition number: ``10^8`` for the products below
  in float32, where it fails).
* :func:`symmetric_eigh`: the cyclic Jacobi method with the round-robin (parallel) ordering
  (Golub and Van Loan, *Matrix computations*, 4th ed., 2013, sec. 8.5; Brent and Luk,
  *SIAM J. Sci. Stat. Comput.* 6, 1985): each of the ``n - 1`` rounds of a sweep zeroes
  ``n / 2`` disjoint off-diagonal pairs at once by plane rotations, ``O(n^2)`` work per round;
  convergence is quadratic, and the eigenvalues are accurate to about the unit roundoff
  times the matrix's norm.
* :func:`nystrom_eigenpairs`: the randomised Nystrom approximation of a positive
  semi-definite ``C`` from its products with an ``n x m`` orthonormal test matrix ``Q``,
  ``C_nys = (C Q) (Q^T C Q)^+ (C Q)^T`` (Halko, Martinsson and Tropp, *SIAM Rev.* 53, 2011,
  sec. 5.4; with the shift of Tropp, Yurtsever, Udell and Cevher, *SIAM J. Matrix Anal.
  Appl.* 38, 2017, alg. 3, which keeps the factorisation of ``Q^T C Q`` finite where it is
  numerically singular), its eigenpairs from the ``m x m`` Gram matrix of its factor.
"""

from __future__ import annotations

from functools import lru_cache

import jax.numpy as jnp
import numpy as np
from jax import lax

from .gaussian import cholesky, tril_inverse

__all__ = ["nystrom_eigenpairs", "orthonormal_columns", "symmetric_eigh"]

Array = jnp.ndarray

#: Sweeps of :func:`symmetric_eigh` at most (it stops earlier where the off-diagonal part
#: has vanished to working precision: 5-7 sweeps for ``n`` up to 200).
JACOBI_SWEEPS = 12


def orthonormal_columns(y: Array) -> Array:
    """``(n, m)`` orthonormal columns spanning those of ``y (n, m)`` in order (Gram-Schmidt,
    each column projected twice; a column that depends on the earlier ones becomes zero).
    ``m`` sequential steps of ``O(n m)``."""
    n, m = y.shape
    tiny = jnp.finfo(y.dtype).eps * jnp.max(jnp.linalg.norm(y, axis=0))

    def column(j, q):
        v = y[:, j]
        for _ in range(2):
            v = v - q @ (q.T @ v)  # q's columns from j on are still zero
        norm = jnp.linalg.norm(v)
        return q.at[:, j].set(jnp.where(norm > tiny, v / jnp.where(norm > tiny, norm, 1.0), 0.0))

    return lax.fori_loop(0, m, column, jnp.zeros_like(y))


@lru_cache(maxsize=16)
def _round_robin(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(p, q)``, each ``(n - 1, n / 2)`` (``n`` even): the disjoint pairs of each round of
    a tournament in which every index meets every other once (index 0 fixed, the others
    rotated)."""
    others = np.arange(1, n)
    rounds_p, rounds_q = [], []
    for r in range(n - 1):
        order = np.concatenate([[0], np.roll(others, r)])
        rounds_p.append(order[: n // 2])
        rounds_q.append(order[::-1][: n // 2])
    p, q = np.minimum(rounds_p, rounds_q), np.maximum(rounds_p, rounds_q)
    return p, q


def symmetric_eigh(a: Array, num_sweeps: int = JACOBI_SWEEPS) -> tuple[Array, Array]:
    r"""``(eigenvalues (n,), eigenvectors (n, n))`` of a symmetric ``a (n, n)``, the
    eigenvalues in descending order and ``eigenvectors[:, i]`` the ``i``-th (module
    docstring: parallel cyclic Jacobi, at most ``num_sweeps`` sweeps). Each rotation zeroes
    ``a_pq`` with ``t = sign(tau) / (|tau| + sqrt(1 + tau^2))``, ``tau = (a_qq - a_pp) /
    (2 a_pq)``, ``c = 1 / sqrt(1 + t^2)``, ``s = t c`` (the smaller of the two angles, Golub
    and Van Loan, alg. 8.5.1), so the iteration converges."""
    n = a.shape[-1]
    size = n + n % 2  # an odd size gets a zero row and column: its pairs do not rotate
    a = jnp.pad(0.5 * (a + a.T), ((0, size - n), (0, size - n)))
    p_all, q_all = (jnp.asarray(x) for x in _round_robin(size))
    eps = jnp.finfo(a.dtype).eps

    def rotate(r, state):
        a, v = state
        p, q = p_all[r], q_all[r]
        app, aqq, apq = a[p, p], a[q, q], a[p, q]
        rotating = jnp.abs(apq) > 0
        tau = (aqq - app) / (2.0 * jnp.where(rotating, apq, 1.0))
        t = jnp.where(tau >= 0, 1.0, -1.0) / (jnp.abs(tau) + jnp.sqrt(1.0 + tau * tau))
        c = jnp.where(rotating, lax.rsqrt(1.0 + t * t), 1.0)
        s = jnp.where(rotating, t * c, 0.0)

        def apply_rows(x):  # rows p, q of J^T x
            xp, xq = x[p], x[q]
            return x.at[p].set(c[:, None] * xp - s[:, None] * xq).at[q].set(s[:, None] * xp + c[:, None] * xq)

        a = apply_rows(apply_rows(a).T).T  # J^T a J
        return a, apply_rows(v.T).T  # v J

    def off(a):
        return jnp.sum(jnp.square(a - jnp.diag(jnp.diagonal(a))))

    def sweep(state):
        i, a, v = state
        a, v = lax.fori_loop(0, size - 1, rotate, (a, v))
        return i + 1, a, v

    def running(state):
        i, a, _ = state
        return (i < num_sweeps) & (off(a) > (eps * eps) * jnp.sum(jnp.square(a)))

    _, a, v = lax.while_loop(running, sweep, (0, a, jnp.eye(size, dtype=a.dtype)))
    values, vectors = jnp.diagonal(a)[:n], v[:n, :n]
    order = jnp.argsort(-values)
    return values[order], vectors[:, order]


def nystrom_eigenpairs(q: Array, cq: Array) -> tuple[Array, Array]:
    r"""``(eigenvalues (m,), eigenvectors (n, m))`` of the Nystrom approximation of a positive
    semi-definite ``C`` (module docstring) from an orthonormal ``q (n, m)`` and ``cq = C q``,
    eigenvalues descending (at least 0).

    With the shift ``nu = sqrt(n) eps ||C q||_F`` (``eps`` the dtype's unit roundoff),
    ``Y = C q + nu q``, ``L = chol(q^T Y)``, the factor ``F = Y L^-T`` has ``F F^T`` the
    Nystrom approximation of ``C + nu I``; with ``F^T F = U diag(theta) U^T``
    (:func:`symmetric_eigh`) its eigenvectors are ``F u_i / sqrt(theta_i)`` and its
    eigenvalues ``theta_i``, those of ``C``'s approximation ``max(theta_i - nu, 0)``. Where
    ``q^T Y`` is not positive definite (a ``C`` that is not) the result is NaN."""
    n = q.shape[0]
    nu = np.sqrt(n) * jnp.finfo(cq.dtype).eps * jnp.linalg.norm(cq)
    y = cq + nu * q
    gram = q.T @ y
    factor = y @ tril_inverse(cholesky(0.5 * (gram + gram.T))).T  # (n, m): Y L^-T
    theta, u = symmetric_eigh(factor.T @ factor)
    vectors = (factor @ u) / jnp.sqrt(jnp.where(theta > 0, theta, 1.0))
    return jnp.maximum(theta - nu, 0.0), vectors
