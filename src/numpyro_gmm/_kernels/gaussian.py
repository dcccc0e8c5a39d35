"""Gaussian components in information form, and small dense linear algebra.

All functions are pure and batch over leading axes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jnp.ndarray

LOG_2PI = math.log(2.0 * math.pi)

# Up to this dimension the Cholesky factorisation and the triangular solve are unrolled
# into elementwise operations over the batch (d(d+1)/2 fused expressions); beyond it the
# loop-based :func:`cholesky` / :func:`tril_inverse` below are used. The unrolled graph
# grows like d^3 and so does its compile time (measured 1.9 s at d = 8), which is why the
# bound is not higher.
UNROLL_MAX_DIM = 4


# ---------------------------------------------------------------- LAPACK-free factorisation
#
# No function of this package calls a LAPACK custom call (jnp.linalg.cholesky, solve,
# jax.scipy.linalg.solve_triangular, ...). jaxlib's CPU LAPACK kernels split a batch over
# XLA's intra-op thread pool (``ParallelBatchMap``) and block their worker until the parts
# are done, while XLA's CPU runtime runs independent operations of one program at the same
# time on the same pool. When as many batched LAPACK calls as there are workers start at
# once (two on a 2-core machine), every worker is blocked waiting for parts that no free
# worker can run: the program never returns (0% CPU; seen with jaxlib 0.10.2 on ``potrf`` and
# ``trsm``). The factorisations below are plain XLA operations (up to 16 rows, loops over
# single columns or rows; beyond, the Cholesky factor by a ``fori_loop`` over blocks of 16
# columns and the triangular inverse by recursive doubling over blocks, both as batched
# matrix products), which the runtime schedules like any other, with closed-form
# derivatives (custom JVPs) so that autodiff does not introduce LAPACK calls either (JAX
# differentiates ``cholesky`` and ``triangular_solve`` with more of them).


def _unit(j, d: int, dtype):
    return (jnp.arange(d) == j).astype(dtype)


# Up to this dimension the column loops below are Python loops with static slices (O(d^2)
# operations in the graph, no wasted products on the zero columns); beyond it a fori_loop.
# Measured (B = 8 batched K = 4 mixtures, full covariances, jit of value_and_grad, first call
# incl. compile, 2-core CPU): at 16, d = 8 entropy 3.1 s / entropy_bounds 9.5 s and d = 12
# 8.4 s / 23.1 s; at 6, d = 8 2.4 s / 4.4 s (runtime 12.0 vs 10.7 ms and 1.8 vs 1.3 ms);
# at 4, d = 12 2.2 s / 4.3 s. Compile time is the project's promise, so the loop starts early.
_STATIC_LOOP_MAX_DIM = 6


def _cholesky_static(a: Array) -> Array:
    d = a.shape[-1]
    cols = []  # cols[j]: (..., d - j) entries L[j:, j]
    for j in range(d):
        v = a[..., j:, j]
        for k in range(j):
            v = v - cols[k][..., j - k :] * cols[k][..., j - k, None]
        pivot = jnp.sqrt(v[..., :1])
        cols.append(jnp.concatenate([pivot, v[..., 1:] / pivot], axis=-1))
    zero = jnp.zeros_like(a[..., 0, :1])
    full = [jnp.concatenate([zero] * j + [cols[j]], axis=-1) if j else cols[0] for j in range(d)]
    return jnp.stack(full, axis=-1)


def _tril_inverse_static(chol: Array) -> Array:
    d = chol.shape[-1]
    rows = []  # rows[i]: (..., i + 1) entries W[i, :i + 1]
    for i in range(d):
        acc = jnp.zeros_like(chol[..., i, : i + 1])
        for k in range(i):
            acc = acc + chol[..., i, k, None] * jnp.pad(rows[k], [(0, 0)] * (chol.ndim - 2) + [(0, i - k)])
        e = (jnp.arange(i + 1) == i).astype(chol.dtype)
        rows.append((e - acc) / chol[..., i, i, None])
    full = [jnp.pad(rows[i], [(0, 0)] * (chol.ndim - 2) + [(0, d - i - 1)]) for i in range(d)]
    return jnp.stack(full, axis=-2)


def _cholesky_loop(a: Array) -> Array:
    """Left-looking Cholesky, column ``j`` per step: ``v = a[:, j] - L L[j, :]^T`` (columns
    ``>= j`` of ``L`` still zero), ``L[j, j] = sqrt(v_j)``, ``L[i, j] = v_i / L[j, j]`` (i > j).
    A non-positive pivot gives NaN (``sqrt`` of a negative), which propagates."""
    d = a.shape[-1]
    rows = jnp.arange(d)

    def step(j, chol):
        e = _unit(j, d, a.dtype)
        row_j = jnp.einsum("...ik,i->...k", chol, e)  # L[j, :]
        v = jnp.einsum("...ik,k->...i", a, e) - jnp.einsum("...ik,...k->...i", chol, row_j)
        pivot = jnp.sqrt(jnp.einsum("...i,i->...", v, e))
        col = jnp.where(rows > j, v / pivot[..., None], 0.0) + e * pivot[..., None]
        return chol + col[..., :, None] * e

    return lax.fori_loop(0, d, step, jnp.zeros_like(a))


def _tril_inverse_loop(chol: Array) -> Array:
    """``W = L^-1`` by forward substitution, row ``i`` per step:
    ``W[i, :] = (e_i - L[i, :] W) / L[i, i]`` (rows ``>= i`` of ``W`` still zero)."""
    d = chol.shape[-1]

    def step(i, w):
        e = _unit(i, d, chol.dtype)
        row_l = jnp.einsum("...ik,i->...k", chol, e)  # L[i, :]
        diag = jnp.einsum("...k,k->...", row_l, e)
        row_w = (e - jnp.einsum("...k,...kj->...j", row_l, w)) / diag[..., None]
        return w + e[:, None] * row_w[..., None, :]

    return lax.fori_loop(0, d, step, jnp.zeros_like(chol))


# Base block of the recursive triangular inverse below (at most this many rows, inverted by
# the row loop) and column block of the blocked Cholesky factor. Measured for the inverse
# (K = 4 factors, jit of value_and_grad, 2-core CPU, XLA's default optimisation level),
# against the row loop over all d rows: d = 50 compile 0.68 s / run
# 0.27 ms (loop 0.40 s / 1.24 ms), d = 100 0.79 s / 0.73 ms (0.34 s / 7.2 ms), d = 300
# 1.3 s / 4.9 ms (0.44 s / 245 ms). Base blocks of 8 rows by static substitution compiled
# 2-3x slower for no faster run; a loop over block rows (one (b, d) x (d, d) product per
# step) compiled as fast as the loop but ran 2-5x slower than the doubling.
_BLOCK_MAX_DIM = 16


def _pad_with_identity(a: Array, size: int) -> Array:
    """``[[a, 0], [0, I]]``, ``(..., size, size)``: the factor and the inverse of the padded
    matrix are those of ``a`` in the top-left block and the identity below."""
    d = a.shape[-1]
    pad = size - d
    if not pad:
        return a
    batch = a.shape[:-2]
    eye = jnp.broadcast_to(jnp.eye(pad, dtype=a.dtype), batch + (pad, pad))
    zeros = jnp.zeros(batch + (d, pad), a.dtype)
    top = jnp.concatenate([a, zeros], -1)
    bottom = jnp.concatenate([jnp.swapaxes(zeros, -1, -2), eye], -1)
    return jnp.concatenate([top, bottom], -2)


def _cholesky_blocked(a: Array) -> Array:
    r"""Left-looking Cholesky by column blocks of ``b = _BLOCK_MAX_DIM`` columns, one block per
    step of a ``fori_loop`` (``a`` padded with an identity block to ``n b`` rows). Step ``j``:
    the panel ``P = A[:, J] - L L[J, :]^T`` (columns ``>= jb`` of ``L`` still zero), the
    diagonal block ``L_JJ = chol(P_JJ)`` by the column loop, and the rows below
    ``L[I, J] = P_I L_JJ^{-T}`` (``L_JJ^{-1}`` by the row loop). ``d^3`` work as matrix
    products; the column loop it replaces (``d`` steps, each updating the whole ``d x d``
    factor) took 28 s for the 4 pairwise ``1000 x 1000`` factors of ``huber_lower_bound`` at
    ``K = 2``, ``d = 1000``. A non-positive pivot gives NaN, which propagates."""
    d = a.shape[-1]
    b = _BLOCK_MAX_DIM
    n = math.ceil(d / b)
    size = n * b
    a = _pad_with_identity(a, size)
    row_axis, col_axis = a.ndim - 2, a.ndim - 1
    rows = jnp.arange(size)[:, None]

    def step(j, chol):
        start = j * b
        l_j = lax.dynamic_slice_in_dim(chol, start, b, axis=row_axis)  # (..., b, size): L[J, :]
        panel = lax.dynamic_slice_in_dim(a, start, b, axis=col_axis) - chol @ jnp.swapaxes(l_j, -1, -2)
        l_jj = _cholesky_loop(lax.dynamic_slice_in_dim(panel, start, b, axis=row_axis))  # (..., b, b)
        below = panel @ jnp.swapaxes(_tril_inverse_loop(l_jj), -1, -2)  # (..., size, b)
        col = jnp.where(rows >= start + b, below, 0.0)
        chol = lax.dynamic_update_slice_in_dim(chol, col, start, axis=col_axis)
        start_index = (0,) * (a.ndim - 2) + (start, start)
        return lax.dynamic_update_slice(chol, l_jj, start_index)

    return lax.fori_loop(0, n, step, jnp.zeros_like(a))[..., :d, :d]


# Up to this many blocks :func:`_diagonal_blocks` takes them by static slices; beyond, by
# ``jnp.diagonal`` of a reshape (a gather, whose CPU kernel computes every entry's index; one
# operation in the graph whatever ``n``).
_SLICED_BLOCKS_MAX = 8


def _diagonal_blocks(a: Array, n: int) -> Array:
    """``(..., n, s, s)`` diagonal blocks of ``(..., n s, n s)`` matrices."""
    s = a.shape[-1] // n
    if n <= _SLICED_BLOCKS_MAX:  # static slices instead of a gather (jnp.diagonal)
        return jnp.stack([a[..., i * s : (i + 1) * s, i * s : (i + 1) * s] for i in range(n)], -3)
    blocks = a.reshape(a.shape[:-2] + (n, s, n, s))
    return jnp.moveaxis(jnp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)


def _tril_inverse_blocked(chol: Array) -> Array:
    r"""``W = L^-1`` by recursive doubling over diagonal blocks:

    .. math::

        \begin{pmatrix} A & 0 \\ C & D \end{pmatrix}^{-1}
        = \begin{pmatrix} A^{-1} & 0 \\ -D^{-1} C A^{-1} & D^{-1} \end{pmatrix}.

    ``L`` is padded with an identity block to ``n b`` rows, ``n = 2^k`` blocks of ``b <=
    _BLOCK_MAX_DIM`` rows (the padding's inverse is the identity, so the top-left ``d x d``
    block of the result is ``L^-1`` exactly). The ``n`` base blocks are inverted at once by
    the row loop (:func:`_tril_inverse_loop`, ``b`` steps), then ``k`` levels each merge pairs of
    neighbouring blocks with two batched matrix products. ``O(d^3)`` work as batched products
    and ``O(log d)`` operations in the graph; the row-by-row loop it replaced took ``d``
    sequential steps: at ``K = 4``, ``d = 100`` (float32, quiet 2-core CPU) 2.2 ms for the value
    and 2.7 ms with the gradient, against 0.14 ms and 0.30 ms here, at the same or smaller
    float32 error (measured at condition numbers 10-1e4, d = 20-300).
    Only the lower triangle is read: the base blocks are masked to theirs and the ``C``
    blocks lie below the diagonal.
    """
    d = chol.shape[-1]
    n = 1 << max(0, math.ceil(math.log2(math.ceil(d / _BLOCK_MAX_DIM))))
    b = math.ceil(d / n)
    chol = _pad_with_identity(chol, n * b)
    w = _tril_inverse_loop(jnp.tril(_diagonal_blocks(chol, n)))  # (..., n, b, b)
    return _merge_blocks(chol, w)[..., :d, :d]


def _tril_inverse_base(chol: Array) -> Array:
    """``L^-1`` of small lower-triangular ``(..., b, b)`` matrices (``b <= _BLOCK_MAX_DIM``;
    only the lower triangle is read) by the doubling of :func:`_tril_inverse_blocked` from the
    ``1 x 1`` blocks ``1 / L_ii`` (padded with an identity block to a power of two rows):
    ``log2 b`` levels of batched products, no loop. For the diagonal blocks of the
    substitution, which runs at every SVI step: the row loop (:func:`_tril_inverse_loop`)
    runs its ``b`` steps one after the other, and the SVI step of AutoGaussianMixture
    (``K = 2``, full covariances, ``d = 50``, 10 seeds in one program) took 541 us per seed
    and step with it, 437 us with this (float32, 2-core CPU, same session). Elsewhere (the
    base blocks of ``tril_inverse`` and ``cholesky``, called at many places by the bounds,
    mostly once) the loop stays: it compiles to fewer operations."""
    b = chol.shape[-1]
    size = 1 << max(0, math.ceil(math.log2(b)))
    chol = _pad_with_identity(chol, size)
    w = (1.0 / jnp.diagonal(chol, axis1=-2, axis2=-1))[..., None, None]  # (..., size, 1, 1)
    return _merge_blocks(chol, w)[..., :b, :b]


# Blocks of at most this many rows are multiplied in :func:`_merge_blocks` by
# :func:`_small_matmul` (elementwise, fused by XLA) instead of a batched ``dot``. XLA's CPU
# runtime ran each level's batched products of ``1 x 1`` to ``4 x 4`` blocks as separate small
# matrix products: in the SVI step of AutoGaussianMixture (``K = 2``, full covariances,
# ``d = 50``, 10 seeds in one program; the substitution's diagonal blocks, inverted by
# :func:`_tril_inverse_base` at every step) the two products of the ``4 x 4`` level took
# 55 of 386 ms over 300 steps in the CPU profile. The value and gradient of the ELBO's
# entropy rule there (``M = 16``, 10 mixtures): 0.68-0.79 -> 0.54-0.61 ms a call; ``8``
# measured no better than ``4``, ``2`` worse.
_SMALL_PRODUCT_MAX = 4


def _small_matmul(a: Array, b: Array) -> Array:
    """``a @ b`` for small ``(..., s, s)`` matrices as a broadcast product and a sum over ``s``
    terms (the same products and sums as a ``dot``, in XLA's elementwise loops)."""
    return jnp.sum(a[..., :, :, None] * b[..., None, :, :], axis=-2)


def _merge_blocks(chol: Array, w: Array) -> Array:
    """The doubling levels of :func:`_tril_inverse_blocked`: ``w (..., n, s, s)``, the
    inverses of the ``n`` diagonal blocks of ``chol (..., n s, n s)`` (``n`` a power of two),
    merged pairwise ``log2 n`` times into ``L^-1 (..., n s, n s)``."""
    batch = chol.shape[:-2]
    n = w.shape[-3]
    while n > 1:
        n //= 2
        s = w.shape[-1]
        pairs = w.reshape(batch + (n, 2, s, s))
        a_inv, d_inv = pairs[..., 0, :, :], pairs[..., 1, :, :]
        c = _diagonal_blocks(chol, n)[..., s:, :s]  # (..., n, s, s): lower-left of each 2s block
        matmul = _small_matmul if s <= _SMALL_PRODUCT_MAX else jnp.matmul
        lower = -matmul(matmul(d_inv, c), a_inv)
        top = jnp.concatenate([a_inv, jnp.zeros_like(a_inv)], -1)
        w = jnp.concatenate([top, jnp.concatenate([lower, d_inv], -1)], -2)
    return w[..., 0, :, :]


@jax.custom_jvp
def tril_inverse(chol: Array) -> Array:
    """``L^-1`` of lower-triangular ``(..., d, d)`` matrices (only the lower triangle is read),
    without LAPACK. Derivative ``dW = -W dL W``."""
    if chol.shape[-1] <= _STATIC_LOOP_MAX_DIM:
        return _tril_inverse_static(chol)
    return _tril_inverse_blocked(chol)


@tril_inverse.defjvp
def _tril_inverse_jvp(primals, tangents):
    (chol,), (dchol,) = primals, tangents
    w = tril_inverse(chol)
    return w, -w @ jnp.tril(dchol) @ w


@jax.custom_jvp
def cholesky(a: Array) -> Array:
    """Lower Cholesky factor of symmetric positive-definite ``(..., d, d)`` matrices, without
    LAPACK (NaN where ``a`` is not positive definite). Derivative (Murray, *Differentiation
    of the Cholesky decomposition*, 2016): ``dL = L Phi(L^-1 dA L^-T)``, ``Phi`` the lower
    triangle with the diagonal halved; ``dA`` is symmetrised first."""
    if a.shape[-1] <= _STATIC_LOOP_MAX_DIM:
        return _cholesky_static(a)
    if a.shape[-1] <= _BLOCK_MAX_DIM:
        return _cholesky_loop(a)
    return _cholesky_blocked(a)


@cholesky.defjvp
def _cholesky_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    chol = cholesky(a)
    w = tril_inverse(chol)
    da = 0.5 * (da + jnp.swapaxes(da, -1, -2))
    x = w @ da @ jnp.swapaxes(w, -1, -2)
    phi = jnp.tril(x) - 0.5 * x * jnp.eye(a.shape[-1], dtype=a.dtype)
    return chol, chol @ phi


def precision_of_tril(chol: Array) -> Array:
    """``Sigma^-1 = L^-T L^-1`` for ``Sigma = L L^T``, ``chol (..., d, d)`` lower triangular."""
    w = tril_inverse(chol)
    return jnp.swapaxes(w, -1, -2) @ w


def cholesky_of_inverse(a: Array) -> Array:
    r"""Lower Cholesky factor ``S`` of ``a^-1`` (``S S^T = a^-1``) of symmetric positive-definite
    ``(..., d, d)`` matrices: one factorisation and one triangular inverse, no second
    factorisation of the inverse (NaN where ``a`` is not positive definite).

    With ``J`` the reversal permutation and ``J a J = L L^T`` (:func:`cholesky` of ``a`` with
    rows and columns reversed), ``a^-1 = J L^-T L^-1 J = (J L^-T J)(J L^-T J)^T``, and
    ``J L^-T J`` is lower triangular (``L^-T`` is upper triangular; reversing both axes maps
    upper to lower) with the positive diagonal of ``L^-1``: it is the unique Cholesky factor."""
    flip = lambda m: m[..., ::-1, ::-1]  # noqa: E731
    return flip(jnp.swapaxes(tril_inverse(cholesky(flip(a))), -1, -2))


def _substitution_blocks(chol: Array):
    """``(factor, inv)`` for :func:`_substitute`: the inverses of the ``n`` diagonal blocks of
    ``L`` padded with an identity block to ``n b`` rows (``b = _BLOCK_MAX_DIM``), by
    :func:`_tril_inverse_base` (``O(d b^2)``). Up to ``_STATIC_SUBSTITUTION_BLOCKS`` blocks:
    ``L`` itself and a tuple of the ``n`` inverses, the last cut to its ``d - (n - 1) b`` rows
    (the padding's inverse is the identity beside it); beyond: the padded ``L`` and the
    inverses ``(..., n, b, b)``."""
    d = chol.shape[-1]
    b = _BLOCK_MAX_DIM
    n = math.ceil(d / b)
    padded = _pad_with_identity(chol, n * b)
    inv = _tril_inverse_base(_diagonal_blocks(padded, n))
    if n > _STATIC_SUBSTITUTION_BLOCKS:
        return padded, inv
    last = d - (n - 1) * b
    return chol, tuple(inv[..., i, :, :] for i in range(n - 1)) + (inv[..., n - 1, :last, :last],)


# Up to this many 16-row blocks (d <= 64) the block substitution below is unrolled in Python:
# static slices, each block row multiplying only the rows already solved, and no padding. The
# fori_loop it replaces there multiplied whole (zero-padded) block rows with dynamic slices,
# one step after the other: the SVI step of AutoGaussianMixture (K = 2, full covariances,
# d = 50, 10 seeds in one program) took 437 us per seed and step with the loop and 307 us
# unrolled on the padded factor (float32, 2-core CPU, same session), its compilation unchanged
# within noise (8.6 -> 8.9 s). Not beyond: at d = 100 (7 blocks) the unrolled solves added
# 330 operations (+7%) and 1.5-1.9 s of compilation to the value and gradient of
# entropy_bounds() (K = 2, full), which calls them at several places.
_STATIC_SUBSTITUTION_BLOCKS = 4


def _substitute(factor: Array, inv, rhs: Array, transpose: bool) -> Array:
    r"""``L^-1 B`` (``transpose=False``) or ``L^-T B`` for lower-triangular ``L`` given as
    :func:`_substitution_blocks` and ``rhs (..., d, R)`` (same batch shape) by blocked
    substitution, one block row after the other, forward
    ``Y_I = L_II^{-1} (B_I - L_{I,:} Y)`` or backward ``Y_I = L_II^{-T} (B_I - L_{:,I}^T Y)``.
    Up to ``_STATIC_SUBSTITUTION_BLOCKS`` blocks (``inv`` a tuple) unrolled, with only the
    solved rows of ``Y``; beyond, one block row per step of a ``fori_loop`` on the padded
    factor, where the rows of ``Y`` not yet solved are still zero, so the whole block row
    (column) of ``L`` can multiply ``Y`` with static shapes. ``d^2 R`` multiply-adds as
    ``(b, d) x (d, R)`` products, against ``d^3 / 3`` for ``L^-1`` itself. ``L`` must be
    lower triangular (the callers mask it): entries above the diagonal would meet solved rows."""
    d = rhs.shape[-2]
    b = _BLOCK_MAX_DIM
    if isinstance(inv, tuple):
        n = len(inv)
        solved = {}
        for i in reversed(range(n)) if transpose else range(n):
            rows = slice(i * b, min((i + 1) * b, d))
            rhs_i = rhs[..., rows, :]
            if solved:  # the rows of Y already solved: blocks i + 1.. (backward) or ..i - 1
                y = jnp.concatenate([solved[j] for j in sorted(solved)], -2)
                if transpose:
                    rhs_i = rhs_i - jnp.swapaxes(factor[..., rows.stop :, rows], -1, -2) @ y
                else:
                    rhs_i = rhs_i - factor[..., rows, : rows.start] @ y
            solved[i] = (jnp.swapaxes(inv[i], -1, -2) if transpose else inv[i]) @ rhs_i
        return jnp.concatenate([solved[j] for j in range(n)], -2)

    n = inv.shape[-3]
    rhs = jnp.pad(rhs, [(0, 0)] * (rhs.ndim - 2) + [(0, n * b - d), (0, 0)])
    if transpose:
        inv = jnp.swapaxes(inv, -1, -2)

    def step(k, y):
        i = n - 1 - k if transpose else k
        start = i * b
        inv_i = lax.dynamic_index_in_dim(inv, i, axis=-3, keepdims=False)
        if transpose:
            part = jnp.swapaxes(lax.dynamic_slice_in_dim(factor, start, b, axis=-1), -1, -2)  # L[:, I]^T
        else:
            part = lax.dynamic_slice_in_dim(factor, start, b, axis=-2)  # L[I, :]
        y_i = inv_i @ (lax.dynamic_slice_in_dim(rhs, start, b, axis=-2) - part @ y)
        return lax.dynamic_update_slice_in_dim(y, y_i, start, axis=-2)

    return lax.fori_loop(0, n, step, jnp.zeros_like(rhs))[..., :d, :]


def tril_solve_columns(chol: Array, rhs: Array) -> Array:
    """``L^-1 B`` for lower-triangular ``chol (..., d, d)`` (only the lower triangle is read)
    and ``rhs (..., d, R)`` with the same batch shape, by blocked forward substitution
    (:func:`_substitute`), ``O(d^2 R)`` instead of the ``O(d^3)`` of forming ``L^-1``. No
    LAPACK call. Differentiated implicitly by ``lax.custom_linear_solve`` (the solve is the
    inverse of ``x -> L x``): ``dY = L^-1 (dB - dL Y)``, and in reverse mode the back
    substitution ``L^-T`` carries the cotangent, so the gradient costs ``O(d^2 R)`` as well
    (``tril_inverse``'s derivative ``-W dL W`` is two ``d x d`` products)."""
    chol = jnp.tril(chol)
    factor, inv = _substitution_blocks(chol)  # once, for the solve and its transpose
    return lax.custom_linear_solve(
        lambda x: chol @ x,
        rhs,
        lambda _, r: _substitute(factor, inv, r, False),
        lambda _, r: _substitute(factor, inv, r, True),
    )


def substitution_pays(d: int, num_rhs: int) -> bool:
    """Whether ``L^-1 B`` with ``num_rhs`` columns per factor is cheaper by substitution
    (:func:`tril_solve_columns`, ``d^2 R`` in ``d / 16`` sequential steps) than through
    ``L^-1`` (:func:`tril_inverse`, ``d^3 / 3`` in ``log2(d / 16)`` batched products, then a
    product). Static. Measured (value and gradient of the mixing rule, full covariances,
    float32, 2-core CPU, best wall time of 20 calls; ``R = K M``; CPU times in
    ``benchmarks/substitution.py``): substitution 0.64 vs 0.91 ms at ``R = 64, d = 100``,
    1.1 vs 3.0 ms at ``R = 32, d = 300``, 10 vs 73 ms at ``R = 32, d = 1000``, even at
    ``R = 32, d = 50``, slower at ``R = 32, d = 20`` (0.17 vs 0.13 ms), ``R = 256, d = 50``
    (2.7 vs 2.2 ms) and ``R = 1024, d = 200`` (17.6 vs 13.4 ms)."""
    return d >= 2 * _BLOCK_MAX_DIM and num_rhs < 2 * d


def tril_solve(chol: Array, b: Array) -> Array:
    """``L^-1 b`` for lower-triangular ``chol (..., d, d)`` and vectors ``b (..., d)``
    (broadcast against each other). Where ``b``'s extra leading axes give few enough vectors
    per factor (:func:`substitution_pays`) and the factors' batch shape is not broadcast, by
    substitution (:func:`tril_solve_columns`); else through ``L^-1`` (:func:`tril_inverse`)."""
    d = chol.shape[-1]
    chol_batch = chol.shape[:-2]
    batch = jnp.broadcast_shapes(chol_batch, b.shape[:-1])
    lead = batch[: len(batch) - len(chol_batch)]
    per_factor = math.prod(lead)
    if batch[len(lead) :] == chol_batch and substitution_pays(d, per_factor):
        cols = jnp.broadcast_to(b, batch + (d,)).reshape((per_factor,) + chol_batch + (d,))
        y = tril_solve_columns(chol, jnp.moveaxis(cols, 0, -1))  # (..., d, R)
        return jnp.moveaxis(y, -1, 0).reshape(batch + (d,))
    return jnp.einsum("...ij,...j->...i", tril_inverse(chol), b)


def tril_log_prob(x: Array, loc: Array, chol: Array) -> Array:
    """``ln N(x; loc, L L^T) = -|L^-1 (x - loc)|^2 / 2 - sum_j ln|L_jj| - d ln(2 pi) / 2`` without
    LAPACK: ``L^-1`` comes from :func:`tril_inverse` once per factor and multiplies the
    differences (``x (..., d)`` broadcasts against ``loc (..., d)``, ``chol (..., d, d)``).
    The same value as NumPyro's ``MultivariateNormal.log_prob`` (which solves with LAPACK's
    ``trsm``); the inverse's rounding is that of forward substitution, since row ``i`` of
    ``L^-1`` is computed by substitution."""
    z = tril_solve(chol, x - loc)
    half_log_det = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(chol, axis1=-2, axis2=-1))), -1)
    return -0.5 * jnp.sum(z * z, -1) - half_log_det - 0.5 * chol.shape[-1] * LOG_2PI


def information_form(scale_tril: Array | None, scale: Array | None):
    """Precision and log-determinant of the covariance of each component.

    Args:
      scale_tril: ``(K, d, d)`` lower Cholesky factors ``L_i`` of ``Sigma_i = L_i L_i^T``,
        or ``None`` when ``scale`` is given.
      scale: ``(K, d)`` standard deviations of diagonal components, or ``None``.

    Returns:
      ``(prec, log_det_cov)`` with ``prec`` ``(K, d, d)`` (full) or ``(K, d)``
      (diagonal: the diagonal of the precision) and ``log|Sigma_i|`` ``(K,)``.
    """
    if scale is not None:
        prec = 1.0 / jnp.square(scale)
        return prec, 2.0 * jnp.sum(jnp.log(scale), axis=-1)
    d = scale_tril.shape[-1]
    if d <= UNROLL_MAX_DIM:
        # L^-1 by unrolled forward substitution (elementwise over the batch).
        inv = [[None] * d for _ in range(d)]
        for j in range(d):
            inv[j][j] = 1.0 / scale_tril[..., j, j]
            for i in range(j + 1, d):
                acc = sum(scale_tril[..., i, k] * inv[k][j] for k in range(j, i))
                inv[i][j] = -acc / scale_tril[..., i, i]
        zero = jnp.zeros_like(scale_tril[..., 0, 0])
        l_inv = jnp.stack([jnp.stack([inv[i][j] if j <= i else zero for j in range(d)], -1) for i in range(d)], -2)
    else:
        l_inv = tril_inverse(scale_tril)  # L^-1
    prec = jnp.swapaxes(l_inv, -1, -2) @ l_inv  # Sigma^-1 = L^-T L^-1
    # Symmetrise: the two triangles come out of the product with different rounding.
    prec = 0.5 * (prec + jnp.swapaxes(prec, -1, -2))
    return prec, _chol_logdet(scale_tril)


def _looped_logdet_and_quad(prec: Array, eta: Array):
    """``(ln|Lambda|, eta^T Lambda^-1 eta)`` for a batch ``prec (B, d, d)``, ``eta (B, d)``
    by the loop-based :func:`cholesky` (used beyond :data:`UNROLL_MAX_DIM`)."""
    chol = cholesky(prec)
    z = tril_solve(chol, eta)
    return _chol_logdet(chol), jnp.sum(jnp.square(z), -1)


def _chol_logdet(chol: Array) -> Array:
    """``ln|A| = 2 sum_j ln L_jj`` from the Cholesky factor ``L`` of ``A`` (``(..., d, d)``)."""
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)


def _unrolled_logdet(chol, d: int):
    """:func:`_chol_logdet` of an unrolled factor (``chol[i][j]`` arrays)."""
    return 2.0 * sum(jnp.log(chol[j][j]) for j in range(d))


def _det2(a, b, c):
    """``|[[a, b], [b, c]]|``, NaN where it is not positive (not positive definite)."""
    det = a * c - b * b
    return jnp.where(det > 0, det, jnp.nan)


def logdet_and_quad_rows(eta, lam, d: int, diagonal: bool):
    """``(ln|Lambda|, eta^T Lambda^-1 eta)`` for a batch stored as rows (structure of arrays).

    ``eta`` holds ``d`` rows; ``lam`` holds ``d`` rows (``diagonal``: the diagonal of ``Lambda``)
    or ``d(d+1)/2`` rows, the upper triangle of ``Lambda`` in row-major order
    (``numpy.triu_indices(d)``). Each is a ``(rows, B)`` array or a sequence of ``(B,)`` rows;
    a sequence is better under reverse mode (the derivative of one row sliced out of a
    stacked array is a pad of the whole array). Closed forms for ``d <= 2``, an unrolled
    Cholesky up to :data:`UNROLL_MAX_DIM`, the loop-based :func:`cholesky` beyond. A
    non-positive-definite ``Lambda`` gives NaN, never a silent value.
    """
    if diagonal:
        return sum(jnp.log(lam[i]) for i in range(d)), sum(jnp.square(eta[i]) / lam[i] for i in range(d))
    if d == 1:
        return jnp.log(lam[0]), jnp.square(eta[0]) / lam[0]
    if d == 2:
        a, b, c = lam[0], lam[1], lam[2]
        det = _det2(a, b, c)
        e0, e1 = eta[0], eta[1]
        return jnp.log(det), (c * e0 * e0 - 2.0 * b * e0 * e1 + a * e1 * e1) / det
    n_tri = d * (d + 1) // 2
    if d <= UNROLL_MAX_DIM:
        return _unrolled_logdet_and_quad_rows([eta[i] for i in range(d)], [lam[k] for k in range(n_tri)])
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in [*eta[:d], *lam[:n_tri]]))
    log_det, quad = _looped_logdet_and_quad(_full_matrices(lam, d, shape), _flat_rows(eta[:d], shape).T)
    return log_det.reshape(shape), quad.reshape(shape)


def solve_rows(eta: Array, lam: Array, d: int) -> Array:
    """``Lambda^-1 eta`` for a batch stored as rows: ``eta`` ``(d, B)``, ``lam`` ``(d(d+1)/2, B)``
    (upper triangle, row-major). ``(d, B)`` result.

    Closed forms for ``d <= 2``, the unrolled Cholesky with back substitution up to
    :data:`UNROLL_MAX_DIM` (elementwise over the batch, differentiable by plain automatic
    differentiation), the loop-based :func:`cholesky` and :func:`tril_inverse` beyond (no
    LAPACK call: see the note above :func:`cholesky`).
    """
    if d == 1:
        return eta / lam
    if d == 2:
        a, b, c = lam[0], lam[1], lam[2]
        det = _det2(a, b, c)
        return jnp.stack([(c * eta[0] - b * eta[1]) / det, (a * eta[1] - b * eta[0]) / det])
    index = _triu_index(d)
    if d <= UNROLL_MAX_DIM:
        _, _, chol, z = _unrolled_rows(lambda i, j: lam[index[i, j]], [eta[i] for i in range(d)], d)
        return jnp.stack(_back_substitute(chol, z, d))
    w = tril_inverse(cholesky(_full_matrices(lam, d, jnp.shape(lam[0]))))
    return jnp.einsum("bji,bj->ib", w, jnp.einsum("bij,jb->bi", w, eta))  # L^-T L^-1 eta


def _triu_index(d: int) -> dict:
    index = {}
    for k, (i, j) in enumerate(zip(*np.triu_indices(d))):
        index[i, j] = index[j, i] = k
    return index


def symmetric_matvec_rows(lam, x, d: int) -> list:
    """``Lambda x`` on rows: ``lam`` the ``d(d+1)/2`` upper-triangle rows (row-major), ``x`` the
    ``d`` rows of the vector (broadcastable shapes); returns ``d`` rows."""
    index = _triu_index(d)
    return [sum(lam[index[i, j]] * x[j] for j in range(d)) for i in range(d)]


def _flat_rows(rows, shape) -> Array:
    """``(len(rows), prod(shape))``: each row broadcast to ``shape`` and flattened (the one flat
    batch the looped factorisation takes)."""
    return jnp.stack([jnp.broadcast_to(x, shape).reshape(-1) for x in rows])


def _full_matrices(lam, d: int, shape) -> Array:
    """``(B, d, d)`` symmetric matrices from upper-triangle rows broadcast to ``shape``."""
    index = _triu_index(d)
    flat = _flat_rows([lam[k] for k in range(d * (d + 1) // 2)], shape)
    return jnp.moveaxis(flat[np.array([[index[i, j] for j in range(d)] for i in range(d)])], -1, 0)


@jax.custom_jvp
def _unrolled_logdet_and_quad_rows(eta: list, lam: list):
    """Unrolled Cholesky on rows (lists of ``(B,)`` arrays); derivative in closed form (below).

    ``d ln|L| = tr(L^-1 dL)`` and ``d(e^T L^-1 e) = 2 x^T de - x^T dL x`` with
    ``x = L^-1 e``: cheaper to differentiate than the unrolled factorisation itself
    (automatic differentiation of the unrolled graph made the gradient about 10x the
    forward time at ``d = 4``).
    """
    d = len(eta)
    index = _triu_index(d)
    log_det, quad, _, _ = _unrolled_rows(lambda i, j: lam[index[i, j]], [eta[i] for i in range(d)], d)
    return log_det, quad


@_unrolled_logdet_and_quad_rows.defjvp
def _unrolled_jvp(primals, tangents):
    eta, lam = primals
    d_eta, d_lam = tangents
    d = len(eta)
    index = _triu_index(d)
    log_det, quad, chol, z = _unrolled_rows(lambda i, j: lam[index[i, j]], [eta[i] for i in range(d)], d)
    # x = L^-T z (back substitution), and W = chol^-1 (lower) so Lambda^-1 = W^T W.
    x = _back_substitute(chol, z, d)
    inv = _inverse_from_chol(chol, d)
    d_log_det = 0.0
    d_quad = 0.0
    for (i, j), k in sorted((key, k) for key, k in index.items() if key[0] <= key[1]):
        inv_ij = inv[k]
        factor = 1.0 if i == j else 2.0  # off-diagonal entries appear twice in Lambda
        d_log_det = d_log_det + factor * inv_ij * d_lam[k]
        d_quad = d_quad - factor * x[i] * x[j] * d_lam[k]
    for i in range(d):
        d_quad = d_quad + 2.0 * x[i] * d_eta[i]
    return (log_det, quad), (d_log_det, d_quad)


def _inverse_from_chol(chol, d):
    """Upper triangle (row-major, ``numpy.triu_indices(d)``) of ``Lambda^-1 = W^T W`` with
    ``W = L^-1``, from the unrolled factor ``chol[i][j]`` (arrays)."""
    w = [[None] * d for _ in range(d)]
    for j in range(d):
        w[j][j] = 1.0 / chol[j][j]
        for i in range(j + 1, d):
            s = chol[i][j] * w[j][j]
            for k in range(j + 1, i):
                s = s + chol[i][k] * w[k][j]
            w[i][j] = -s / chol[i][i]
    return [sum(w[m][i] * w[m][j] for m in range(j, d)) for i, j in zip(*np.triu_indices(d))]


def logdet_and_inverse_rows(lam, d: int) -> tuple[Array, list]:
    """``(ln|Lambda|, Lambda^-1)`` for a batch stored as rows: ``lam`` holds the ``d(d+1)/2``
    upper-triangle rows (row-major, any broadcastable shapes); the inverse comes in the same
    layout. One factorisation for both: closed forms for ``d <= 2`` (one division), the
    unrolled Cholesky up to :data:`UNROLL_MAX_DIM`, the loop-based :func:`cholesky` beyond. A
    non-positive-definite ``Lambda`` gives NaN."""
    if d == 1:
        return jnp.log(lam[0]), [1.0 / lam[0]]
    if d == 2:
        a, b, c = lam[0], lam[1], lam[2]
        det = _det2(a, b, c)
        r = 1.0 / det
        return jnp.log(det), [c * r, -b * r, a * r]
    if d <= UNROLL_MAX_DIM:
        index = _triu_index(d)
        chol = _unrolled_chol(lambda i, j: lam[index[i, j]], d)
        return _unrolled_logdet(chol, d), _inverse_from_chol(chol, d)
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in lam[: d * (d + 1) // 2]))
    full = _full_matrices(lam, d, shape)
    chol = cholesky(full)
    w = tril_inverse(chol)
    inv = jnp.swapaxes(w, -1, -2) @ w
    return _chol_logdet(chol).reshape(shape), [inv[:, i, j].reshape(shape) for i, j in zip(*np.triu_indices(d))]


def _back_substitute(chol, z, d):
    """``x = L^-T z`` on rows: ``chol[i][j]`` (lower factor) and ``z[i]`` are ``(B,)`` arrays."""
    x = [None] * d
    for i in reversed(range(d)):
        s = z[i]
        for k in range(i + 1, d):
            s = s - chol[k][i] * x[k]
        x[i] = s / chol[i][i]
    return x


def _unrolled_chol(entry, d):
    # Cholesky-Banachiewicz on rows of the batch: chol[i][j] are arrays of shape (B,).
    # A non-positive pivot gives sqrt(<0) = NaN, which propagates.
    chol = [[None] * d for _ in range(d)]
    for j in range(d):
        s = entry(j, j)
        for k in range(j):
            s = s - chol[j][k] * chol[j][k]
        chol[j][j] = jnp.sqrt(s)
        for i in range(j + 1, d):
            s = entry(i, j)
            for k in range(j):
                s = s - chol[i][k] * chol[j][k]
            chol[i][j] = s / chol[j][j]
    return chol


def _unrolled_rows(entry, eta, d):
    """Unrolled Cholesky factor, ``z = L^-1 eta``, ``ln|Lambda|`` and ``|z|^2`` on rows."""
    chol = _unrolled_chol(entry, d)
    z = []
    for i in range(d):
        s = eta[i]
        for k in range(i):
            s = s - chol[i][k] * z[k]
        z.append(s / chol[i][i])
    return _unrolled_logdet(chol, d), sum(zi * zi for zi in z), chol, z


def log_gaussian_peak(log_det_cov: Array, d: int) -> Array:
    """``ln N(mu; mu, Sigma) = -(d ln 2pi + ln|Sigma|) / 2``, the maximum of a Gaussian density."""
    return -0.5 * (d * LOG_2PI + log_det_cov)


def all_finite(*xs: Array) -> Array:
    """Scalar boolean: every entry of every array is finite."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs]))


def zeroed_unless_finite(x: Array, *sizes: Array) -> tuple[Array, Array]:
    """``(x', far)``: ``far`` (no derivative) where any of ``sizes`` (quantities computed from
    ``x``, e.g. squared distances, with the shape of ``x``'s leading axes or scalars) is not
    finite, and ``x'`` is ``x`` with those entries (rows) zeroed.

    For pairs or deviations so far apart that their squares overflow: the caller takes them
    as infinitely apart (a bound ``+inf``, a responsibility or ``exp(-D)`` of 0) and computes
    the rest from ``x'``, whose derivative there is 0; from ``x`` itself it would be
    ``inf * 0 = NaN`` and make the whole gradient NaN."""
    finite = jnp.isfinite(sizes[0])
    for size in sizes[1:]:
        finite = finite & jnp.isfinite(size)
    far = lax.stop_gradient(~finite)
    return jnp.where(far.reshape(far.shape + (1,) * (x.ndim - far.ndim)), 0.0, x), far
