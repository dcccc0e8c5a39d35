r"""Closed-form bounds on the entropy of a Gaussian mixture (no power moments needed).

For ``p(x) = sum_i w_i N(x; mu_i, Sigma_i)`` with component entropies
``H_i = 1/2 ln|2 pi e Sigma_i|``:

* Huber et al. 2008, lower bound (Jensen on ``-ln`` per component):
  ``H >= -sum_i w_i ln sum_j w_j N(mu_i; mu_j, Sigma_i + Sigma_j)``.
* Huber et al. 2008, upper bound (``H(X) <= H(X, Z) = H(Z) + H(X | Z)``):
  ``H <= sum_i w_i (-ln w_i + H_i)``.
* Kolchinsky & Tracey 2017, pairwise distances:
  ``H_D = sum_i w_i H_i - sum_i w_i ln sum_j w_j exp(-D(p_i || p_j))`` is an upper bound with
  ``D`` the Kullback-Leibler divergence and a lower bound with ``D`` the Bhattacharyya
  distance.
* Moment-matched Gaussian (maximum entropy at fixed covariance):
  ``H <= 1/2 ln|2 pi e Sigma_mix|``, ``Sigma_mix = sum_i w_i (Sigma_i + (mu_i - mu)(mu_i - mu)^T)``.

References: M. Huber, T. Bailey, H. Durrant-Whyte, U. Hanebeck, *On entropy approximation
for Gaussian mixture random vectors*, MFI 2008. A. Kolchinsky, B. Tracey, *Estimating
mixture entropy with pairwise distances*, Entropy 19(7), 2017.

Every function takes normalised ``log_weights (K,)``, ``locs (K, d)`` and exactly one of
``scale_tril (K, d, d)`` / ``scale (K, d)``. With full covariances the pairwise bounds work
on ``K x K`` pairs of dense ``d x d`` matrices, which is cheap next to the power moments.
With diagonal covariances (``scale``) every pairwise quantity is a sum over coordinates,
computed for one block of rows ``i`` at a time (:func:`_diagonal_rows`): ``O(K^2 d)``
operations and at most :data:`DIAGONAL_ROW_ELEMENTS` temporaries, never a ``d x d``
matrix; the moment-matched covariance ``diag(a) + U^T U`` (``U`` of rank ``K``) takes its
determinant from the ``min(K, d)``-sized side (the matrix determinant lemma,
:func:`log_det_identity_plus`).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.nn import logsumexp

from .gaussian import cholesky, tril_inverse, tril_solve, zeroed_unless_finite

Array = jnp.ndarray

LOG_2PI = math.log(2.0 * math.pi)


def covariances(scale_tril: Array | None, scale: Array | None) -> Array:
    """Dense ``(K, d, d)`` covariances from Cholesky factors or diagonal standard deviations."""
    if scale is not None:
        return jnp.vectorize(jnp.diag, signature="(d)->(d,d)")(jnp.square(scale))
    return scale_tril @ jnp.swapaxes(scale_tril, -1, -2)


def dense_tril(scale_tril: Array | None, scale: Array | None) -> Array:
    """Dense ``(K, d, d)`` lower Cholesky factors."""
    if scale is not None:
        return jnp.vectorize(jnp.diag, signature="(d)->(d,d)")(scale)
    return scale_tril


def log_abs_det(scale_tril: Array | None, scale: Array | None) -> Array:
    """``ln|L_i| = 1/2 ln|Sigma_i|`` from Cholesky factors or diagonal standard deviations,
    shape ``(K,)``."""
    factor = scale if scale is not None else jnp.diagonal(scale_tril, axis1=-2, axis2=-1)
    return jnp.sum(jnp.log(jnp.abs(factor)), -1)


def component_entropies(scale_tril: Array | None, scale: Array | None, d: int) -> Array:
    """``H_i = 1/2 (d ln(2 pi e) + ln|Sigma_i|)``, shape ``(K,)``."""
    return 0.5 * d * (LOG_2PI + 1.0) + log_abs_det(scale_tril, scale)


def rescaled(locs: Array, scale_tril: Array | None, scale: Array | None):
    """``(locs', scale_tril', scale', d ln c)``: the mixture of ``(X - m) / c`` with ``m`` the
    mean of the means and ``c`` the geometric mean of the standard deviations (``stop_gradient``).

    Entropy is translation invariant and ``H(c Y) = H(Y) + d ln c`` exactly, so every bound of
    the rescaled mixture plus ``d ln c`` is a bound of the original, and the derivative at
    fixed ``c`` is the derivative (the sum does not depend on ``c``). In rescaled units the
    covariances are ``O(1)``: scales of ``1e-20`` or ``1e20`` no longer under- or overflow
    float32 when squared (``Sigma_i + Sigma_j``, ``Sigma_mix``).
    """
    d = locs.shape[-1]
    factor = scale if scale is not None else jnp.diagonal(scale_tril, axis1=-2, axis2=-1)
    log_c = lax.stop_gradient(jnp.mean(jnp.log(jnp.abs(factor))))
    inv_c = jnp.exp(-log_c)
    locs = (locs - lax.stop_gradient(jnp.mean(locs, axis=0))) * inv_c
    scale_tril = None if scale_tril is None else scale_tril * inv_c
    scale = None if scale is None else scale * inv_c
    return locs, scale_tril, scale, d * log_c


#: Elements of the ``(rows, K, d)`` temporaries of one block of :func:`_diagonal_rows`.
DIAGONAL_ROW_ELEMENTS = 1 << 22


def diagonal_rows_per_block(K: int, d: int) -> int:
    """Rows ``i`` per block of :func:`_diagonal_rows` (all ``K`` when they fit)."""
    return max(1, min(K, DIAGONAL_ROW_ELEMENTS // max(1, K * d)))


def _diagonal_rows(row, locs: Array, var: Array) -> Array:
    """``stack_i row(mu_i, v_i, locs, var)`` for diagonal variances ``var (K, d)``; ``row``
    returns ``(K,)`` (or a tuple of them) from ``(K, d)`` temporaries. Blocks of rows run
    one after another (``lax.map``), each recomputed in the backward pass
    (``jax.checkpoint``), so that neither the value nor the gradient holds ``K^2 d``
    numbers."""
    K, d = locs.shape
    fn = jax.checkpoint(lambda a: row(a[0], a[1], locs, var))
    return lax.map(fn, (locs, var), batch_size=diagonal_rows_per_block(K, d))


def _row_sum_log_quad(mu_i, v_i, locs, var, c):
    """``(sum_l ln s_l, sum_l (mu_il - mu_jl)^2 / s_l)`` over ``j``, ``s = c (v_i + v_j)``."""
    s = c * (v_i + var)
    return jnp.sum(jnp.log(s), -1), jnp.sum(jnp.square(mu_i - locs) / s, -1)


def _pair_logdet_quad(locs: Array, scale_tril: Array | None, scale: Array | None, c: float):
    """``(ln|S_ij|, dmu_ij^T S_ij^-1 dmu_ij)`` for ``S_ij = c (Sigma_i + Sigma_j)``, ``(K, K)``
    each: by rows for diagonal covariances, in the coordinates whitened by ``L_j`` otherwise,

    ``S_ij = c L_j (I + M M^T) L_j^T`` with ``M = L_j^-1 L_i`` (:func:`_whitened`), so
    ``ln|S_ij| = d ln c + ln|Sigma_j| + ln|I + M M^T|`` and the quadratic form is
    ``|chol(I + M M^T)^-1 L_j^-1 dmu|^2 / c``. ``I + M M^T`` has its eigenvalues ``>= 1``.
    Factorising the formed sum ``Sigma_i + Sigma_j`` instead lost the short directions that
    thin components share (error about ``cond * eps`` in ``ln|S|``): for two equal components
    of standard deviations 1 and ``1e-3`` along rotated axes (float32) the Bhattacharyya lower
    bound was up to ``7e-3`` nats above the entropy (``d = 3``; ``0.4`` at ``1e-4``), the
    Huber lower bound ``4.5e-3`` (``d = 2``, ``1e-4``); whitened, both stay below it
    (``tests/test_adversarial.py``). The self pairs, ``S_ii = 2 c Sigma_i``, in closed form."""
    locs = _centre(locs)
    eye = jnp.eye(locs.shape[0], dtype=bool)
    if scale is not None:
        # The self pairs' quadratic form is 0 by definition, not left to mu_i - mu_i: under
        # jit the row (mapped) and the columns (closed over) of one array were seen to differ
        # by an ulp (1024 for a mean 9e9 sds from the centre, float32; 1-D, K = 5), and the
        # Huber and Bhattacharyya "lower bounds" came out 3e4 nats above the entropy.
        log_det, quad = _diagonal_rows(partial(_row_sum_log_quad, c=c), locs, jnp.square(scale))
        return log_det, jnp.where(eye, 0.0, quad)
    d = locs.shape[-1]
    m, z = _whitened(locs, scale_tril)
    a = jnp.eye(d, dtype=locs.dtype) + m @ jnp.swapaxes(m, -1, -2)
    chol = cholesky(0.5 * (a + jnp.swapaxes(a, -1, -2)))
    ld = 2.0 * log_abs_det(scale_tril, None)  # ln|Sigma_j|
    log_det = d * math.log(c) + ld[None, :] + 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), -1)
    quad = jnp.sum(jnp.square(tril_solve(chol, z)), -1) / c
    self_log_det = d * jnp.log(2.0 * c) + ld
    return jnp.where(eye, self_log_det[:, None], log_det), jnp.where(eye, 0.0, quad)


def _whitened(locs: Array, scale_tril: Array):
    """``(M, z)``, ``(K, K, d, d)`` and ``(K, K, d)``: ``M[i, j] = L_j^-1 L_i`` and ``z[i, j] =
    L_j^-1 (mu_i - mu_j)``, from the ``K`` inverses ``L_j^-1`` (not one per pair); shared by
    the pairwise Kullback-Leibler, Bhattacharyya and Huber terms."""
    inv = tril_inverse(scale_tril)
    m = jnp.einsum("jab,ibc->ijac", inv, scale_tril)
    z = jnp.einsum("jab,ijb->ija", inv, locs[:, None, :] - locs[None, :, :])
    return m, z


def _centre(locs: Array) -> Array:
    # Every bound is translation invariant; centring keeps float32 differences exact.
    return locs - jnp.mean(locs, axis=0)


def huber_lower(log_weights, locs, scale_tril, scale) -> Array:
    """``-sum_i w_i ln sum_j w_j N(mu_i; mu_j, Sigma_i + Sigma_j)`` (a lower bound)."""
    d = locs.shape[-1]
    log_det, quad = _pair_logdet_quad(locs, scale_tril, scale, 1.0)
    log_n = -0.5 * (d * LOG_2PI + log_det + quad)  # (K, K)
    inner = logsumexp(log_weights[None, :] + log_n, axis=1)
    return -jnp.sum(jnp.exp(log_weights) * inner)


def huber_upper(log_weights, locs, scale_tril, scale) -> Array:
    """``sum_i w_i (-ln w_i + H_i)`` (an upper bound; ``0 ln 0 = 0``)."""
    d = locs.shape[-1]
    w = jnp.exp(log_weights)
    safe_log_w = jnp.where(w > 0, log_weights, 0.0)
    return jnp.sum(w * (component_entropies(scale_tril, scale, d) - safe_log_w))


def pairwise_bound(log_weights: Array, entropies: Array, divergence: Array) -> Array:
    """Kolchinsky & Tracey's ``sum_i w_i H_i - sum_i w_i ln sum_j w_j exp(-D_ij)`` from the
    components' entropies ``(K,)`` and divergences ``(K, K)``."""
    w = jnp.exp(log_weights)
    return jnp.sum(w * entropies) - jnp.sum(w * logsumexp(log_weights[None, :] - divergence, axis=1))


def _pairwise(log_weights, locs, scale_tril, scale, divergence):
    return pairwise_bound(log_weights, component_entropies(scale_tril, scale, locs.shape[-1]), divergence)


def bhattacharyya_distances(locs, scale_tril, scale) -> Array:
    """``D_B(p_i, p_j) = 1/8 dmu^T S^-1 dmu + 1/2 ln(|S| / sqrt(|Sigma_i||Sigma_j|))``,
    ``S = (Sigma_i + Sigma_j) / 2``; shape ``(K, K)``."""
    d = locs.shape[-1]
    log_det, quad = _pair_logdet_quad(locs, scale_tril, scale, 0.5)
    ld = 2.0 * (component_entropies(scale_tril, scale, d) - 0.5 * d * (LOG_2PI + 1.0))  # ln|Sigma_i|
    return 0.125 * quad + 0.5 * log_det - 0.25 * (ld[:, None] + ld[None, :])


def kl_divergences(locs, scale_tril, scale) -> Array:
    """``KL(p_i || p_j) = 1/2 [tr(Sigma_j^-1 Sigma_i) + dmu^T Sigma_j^-1 dmu - d + ln|Sigma_j|/|Sigma_i|]``."""
    d = locs.shape[-1]
    locs = _centre(locs)
    ld = 2.0 * (component_entropies(scale_tril, scale, d) - 0.5 * d * (LOG_2PI + 1.0))
    if scale is not None:  # sum_l (v_il + (mu_il - mu_jl)^2) / v_jl over j, row i
        trace_quad = _diagonal_rows(
            lambda mu_i, v_i, m, v: jnp.sum((v_i + jnp.square(mu_i - m)) / v, -1), locs, jnp.square(scale)
        )
        # the self pairs 0 by definition (see _pair_logdet_quad)
        return jnp.where(jnp.eye(locs.shape[0], dtype=bool), 0.0, 0.5 * (trace_quad - d + ld[None, :] - ld[:, None]))
    m, z = _whitened(locs, scale_tril)  # L_j^-1 L_i and L_j^-1 (mu_i - mu_j) at [i, j]
    trace = jnp.sum(jnp.square(m), axis=(-1, -2))
    return 0.5 * (trace + jnp.sum(jnp.square(z), -1) - d + ld[None, :] - ld[:, None])


def pairwise_bhattacharyya_lower(log_weights, locs, scale_tril, scale) -> Array:
    """Kolchinsky & Tracey with the Bhattacharyya distance (a lower bound)."""
    return _pairwise(log_weights, locs, scale_tril, scale, bhattacharyya_distances(locs, scale_tril, scale))


def pairwise_kl_upper(log_weights, locs, scale_tril, scale) -> Array:
    """Kolchinsky & Tracey with the Kullback-Leibler divergence (an upper bound)."""
    return _pairwise(log_weights, locs, scale_tril, scale, kl_divergences(locs, scale_tril, scale))


def log_det_identity_plus(gram: Array, dot_length: int) -> Array:
    r"""An upper bound on ``ln|I + G|`` for a positive semi-definite ``gram (s, s)`` formed
    by dot products of length ``dot_length``, exceeding the exact value by at most its own
    float rounding; ``+inf`` where that rounding cannot be bounded
    (:func:`log_det_identity_plus_bracket`, whose upper end this is).

    This is what keeps the moment-matched bounds finite and above the truth where the
    deviations are long: the determinant lemma's Gram matrix has eigenvalues near 0
    (exactly 0 along ``sqrt(w)`` where ``K <= d``: the weighted deviations sum to zero)
    beside eigenvalues as large as the squared separation, and in float32 at separations of
    a few thousand standard deviations its rounding made the factorisation fail
    (``moment_matched_upper_bound`` was NaN on 48 of 400 random diagonal mixtures,
    ``K = 3-16``, ``d = 3-20``, separations ``10^2.5-10^5``) or the determinant lose ``0.24``
    nats.
    """
    return log_det_identity_plus_bracket(gram, dot_length)[1]


def log_det_identity_plus_bracket(gram: Array, dot_length: int, by_entries: bool = False) -> tuple[Array, Array]:
    r"""``(lower, upper)`` bounds on ``ln|I + G|`` for positive semi-definite ``gram (..., s,
    s)`` formed by dot products of length ``dot_length`` (``t``), batched over leading axes:
    the computed ``ln|A|`` (``A = I + G``, from a Cholesky factor) minus and plus ``2 e``, the
    smaller of two rounding bounds below; where neither holds or the factor is not finite,
    ``0`` (``G >= 0``) and ``+inf``. ``O(s^3)``.

    Why it is safe. For a symmetric perturbation ``E`` of ``A`` and ``F = A^{-1/2} E
    A^{-1/2}``, ``|ln|A + E| - ln|A|| = |sum ln(1 + f_i)| <= ||F||_* / (1 - ||F||_2)``, at
    most ``2 ||F||_*`` while ``||F||_2 <= 1/2``; ``A``'s eigenvalues are ``>= 1``. The
    errors: forming ``G`` (dot products of length ``t``, ``|dG_jk| <= t eps |v_j| |v_k|`` by
    Cauchy-Schwarz, ``6 eps`` more for the vectors' own entries; ``|v_j|^2 = G_jj``) and the
    Cholesky factor (``|E| <= (s + 1) eps |L| |L^T|``, Higham, *Accuracy and Stability of
    Numerical Algorithms*, 2002, theorem 10.3; ``(|L| |L^T|)_jk <= sqrt(A_jj A_kk)``).

    * By norms: ``||F||_* <= sqrt(s) ||E||_F`` (``||A^-1||_2 <= 1``), ``||E||_F <= (t + 6)
      eps tr G + (s + 1) eps tr A``: ``e = sqrt(s) eps ((s + 1)(s + tr G) + (t + 6) tr G)``.
      Tight where ``G`` is small; grows with ``G``'s size.
    * By entries (``by_entries=True``; it costs a second factorisation and a triangular
      inverse, so the default entropy's caps, compiled into every fixed rule, do not use
      it): with ``|E_jk| <= c_G sqrt(G_jj G_kk) + c_A sqrt(A_jj A_kk)`` (``c_G = (t +
      6) eps``, ``c_A = (s + 1) eps``), ``||F||_F <= c_G V_G + c_A V_A``, ``V_X = (sum_j
      sqrt((A^-1)_jj X_jj))^2`` (``|(A^-1)_ij| <= sqrt((A^-1)_ii (A^-1)_jj)``): ``e = sqrt(s)
      (c_G V_G + c_A V_A)``, which grows with the variance inflation of ``A``'s columns, not
      their size. ``V`` comes from the computed factor, i.e. from ``A`` perturbed by ``F``,
      which moves ``(A^-1)_jj`` by at most a factor 2 while ``||F||_2 <= 1/2``: both ``V``
      are doubled. Before it (the first bound alone) the bracket was infinite for long
      low-rank factors, ``|W|^2 / D`` about ``1e4`` at ``d = 30`` in float32, where the
      factor is still accurate.

    The correction carries no derivative.
    """
    s = gram.shape[-1]
    eye = jnp.eye(s, dtype=gram.dtype)
    a = eye + 0.5 * (gram + jnp.swapaxes(gram, -1, -2))
    eps = jnp.finfo(gram.dtype).eps
    fixed = lax.stop_gradient(a)
    diag_a = jnp.diagonal(fixed, axis1=-2, axis2=-1)
    tr_g = jnp.sum(diag_a, -1) - s
    f = eps * ((s + 1) * (s + tr_g) + (dot_length + 6) * tr_g)  # a bound on ||E||_F, so on ||F||_F
    if by_entries:
        inv_diag = jnp.sum(jnp.square(tril_inverse(cholesky(fixed))), -2)  # (A^-1)_jj = |L^-1 e_j|^2
        v_g, v_a = (2.0 * jnp.square(jnp.sum(jnp.sqrt(inv_diag * x), -1)) for x in (diag_a - 1.0, diag_a))
        entries = eps * ((dot_length + 6) * v_g + (s + 1) * v_a)  # a bound on ||F||_F
        f = jnp.minimum(f, jnp.where(jnp.isfinite(entries), entries, jnp.inf))
    ok = f <= 0.5
    e = math.sqrt(s) * jnp.where(ok, f, 0.0)
    chol = cholesky(jnp.where(ok[..., None, None], a, eye))  # no NaN in the unused branch's derivative
    log_det = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), -1)
    ok = ok & jnp.isfinite(log_det)
    return jnp.where(ok, jnp.maximum(log_det - 2.0 * e, 0.0), 0.0), jnp.where(ok, log_det + 2.0 * e, jnp.inf)


def log_det_identity_plus_gram(v: Array) -> Array:
    """:func:`log_det_identity_plus` of ``ln|I + V V^T| = ln|I + V^T V|`` (Sylvester) for
    ``v (n, m)``, from the Gram matrix of the smaller side (``O(n m min(n, m))``)."""
    n, m = v.shape
    return log_det_identity_plus(v @ v.T, m) if n <= m else log_det_identity_plus(v.T @ v, n)


def diagonal_moment_matched_log_det(log_weights: Array, dev: Array, scale: Array) -> Array:
    """An upper bound on ``ln|Sigma_mix|`` for diagonal covariances, within its rounding of the
    exact value: ``Sigma_mix = diag(a) + U^T U`` (``a = sum_k w_k s_k^2``, rows ``U_k =
    sqrt(w_k) dev_k``), ``sum ln a + ln|I + V V^T|`` with ``V = U diag(a)^-1/2`` by
    :func:`log_det_identity_plus_gram`, or Hadamard's ``sum_l ln (Sigma_mix)_ll`` where that is
    smaller or the former is not finite. ``dev (K, d)``: the deviations from the mixture's
    mean."""
    a = jnp.exp(log_weights) @ jnp.square(scale)
    u = jnp.exp(0.5 * log_weights)[:, None] * dev  # exp keeps the derivative finite at w_k = 0
    hadamard = jnp.sum(jnp.log(a + jnp.sum(jnp.square(u), 0)))
    return jnp.minimum(jnp.sum(jnp.log(a)) + log_det_identity_plus_gram(u / jnp.sqrt(a)), hadamard)  # +inf if not finite


def small_moment_matched_log_det(log_weights: Array, dev: Array, scale_tril: Array | None, scale: Array | None) -> Array:
    r"""An upper bound on ``ln|Sigma_mix|`` in ``d <= 2``, exceeding the exact value by at most a
    bound on its own rounding; ``dev (K, d)``: the deviations from the mixture's mean.

    ``Sigma_mix = C C^T`` with the ``n = (d + 1) K`` columns ``c`` of ``sqrt(w_k) L_k`` and
    ``sqrt(w_k) dev_k``, so (Cauchy-Binet) in 2-D

    .. math::

        |\Sigma_{mix}| = \sum_{i < j} (c_i \times c_j)^2, \qquad
        c_i \times c_j = x_i y_j - y_i x_j,

    a sum of squares (in 1-D, ``sum_i c_i^2``). The formed ``a c - b^2`` of the 2 x 2 matrix
    cancels where the mixture is thin: for one component of standard deviations 1 and
    ``1e-3`` along rotated axes (float32) it lost up to ``4e-3`` in the log-determinant, below
    the exact value, so the fixed rule's cap (:func:`numpyro_gmm._kernels.mixing.certified_upper`)
    pulled the default entropy ``1.8e-3`` nats under the truth (``0.10`` at ``1e-4``) and
    ``entropy_bounds()``' upper end lay below it. Here a component's own pair of columns,
    ``(L_00, L_10)`` and ``(0, L_11)``, gives ``L_00 L_11`` without a subtraction, so a single
    thin component is exact to rounding. Each cross product is off by at most ``8 eps (|x_i
    y_j| + |y_i x_j|)`` (the columns' entries within ``3 eps`` of the exact ones: the weights'
    root, the product, the rescaling; two products and a difference), and the sum of the
    ``n (n - 1) / 2`` positive terms by a factor ``1 + n^2 eps``: both are added, so the
    result is an upper bound. The deviations are taken from the computed mean ``mu'``; that
    only adds ``(mu - mu')(mu - mu')^T >= 0`` to ``Sigma_mix`` (an upper bound still). The
    correction carries no derivative. ``O(K^2)``.

    The columns are first divided by a power of 2 near their largest entry (exact, so the
    rounding above is unchanged; its logarithm added back): the squares and products of
    products otherwise overflowed float32 for deviations of about ``1e9`` (2-D) or ``2e19``
    (1-D) standard deviations (the bound ``+inf``, still a bound, but ``inf - inf`` in the
    stopped slack made its derivative NaN, and the default's gradient with it).
    """
    d = dev.shape[-1]
    eps = jnp.finfo(dev.dtype).eps
    root_w = jnp.exp(0.5 * log_weights)  # (K,); exp keeps the derivative finite at w_k = 0
    factor = dense_tril(scale_tril, scale)  # (K, d, d), d <= 2
    if d == 1:
        cols = jnp.concatenate([root_w * factor[:, 0, 0], root_w * dev[:, 0]])
        cols, log_unit = _power_of_2_units(cols)
        n = cols.shape[0]
        return jnp.log(jnp.sum(jnp.square(cols))) + 2.0 * log_unit + lax.stop_gradient(jnp.log1p((n + 8) * eps))
    x = jnp.concatenate([root_w * factor[:, 0, 0], jnp.zeros_like(root_w), root_w * dev[:, 0]])
    y = jnp.concatenate([root_w * factor[:, 1, 0], root_w * factor[:, 1, 1], root_w * dev[:, 1]])
    (x, y), log_unit = _power_of_2_units(x, y)
    n = x.shape[0]
    xy = x[:, None] * y[None, :]  # x_i y_j
    cross = xy - xy.T
    det = 0.5 * jnp.sum(jnp.square(cross))  # every pair twice
    mag = lax.stop_gradient(jnp.abs(xy) + jnp.abs(xy.T))
    fixed = lax.stop_gradient(cross)
    slack = 0.5 * jnp.sum(jnp.square(jnp.abs(fixed) + 8.0 * eps * mag) - jnp.square(fixed))
    return jnp.log(det + slack) + 4.0 * log_unit + lax.stop_gradient(jnp.log1p(n * n * eps))


def _power_of_2_units(*arrays: Array):
    """``arrays`` divided by ``u = 2^k`` near their largest absolute entry (exact), and
    ``ln u``; ``u`` carries no derivative (the quotients' derivatives are the arrays' own
    divided by ``u``). A single array comes back unpacked."""
    top = lax.stop_gradient(jnp.max(jnp.stack([jnp.max(jnp.abs(a)) for a in arrays])))
    k = jnp.where((top > 0) & jnp.isfinite(top), jnp.floor(jnp.log2(jnp.where(top > 0, top, 1.0))), 0.0)
    # ldexp, not exp2: XLA's exp2 of an integer is not always the power of 2 itself (207 of
    # 2^-120 .. 2^119 differed in float32 on the CPU), and the division must be exact
    unit = jnp.ldexp(jnp.ones((), top.dtype), k.astype(jnp.int32))
    scaled = tuple(a / unit for a in arrays)
    return (scaled[0] if len(scaled) == 1 else scaled), k * math.log(2.0)


def log_det_bracket(a: Array, dot_length: int) -> tuple[Array, Array]:
    r"""``(lower, upper)`` bounds on ``ln|A|`` for a symmetric positive-definite ``a (s, s)``
    whose entries were formed by sums of products of length ``dot_length`` (``t``) of a
    positive semi-definite kind (``|A_jk| <= sqrt(A_jj A_kk)`` holds term by term): the
    computed ``ln|A|`` (a Cholesky factor) minus and plus ``2 e``; ``(-inf, +inf)`` where
    ``e > 1/2`` or the factor is not finite. ``O(s^3)``.

    Why it is safe. The errors of forming ``A`` (``|dA_jk| <= (t + 6) eps sqrt(A_jj A_kk)``,
    Cauchy-Schwarz on the terms) and of the factor (``|E_jk| <= (s + 1) eps (|L| |L^T|)_jk
    <= (s + 1) eps sqrt(A_jj A_kk)``, Higham, *Accuracy and Stability of Numerical
    Algorithms*, 2002, theorem 10.3) are entrywise at most ``c sqrt(A_jj A_kk)``, ``c = (t +
    s + 7) eps``. With ``D = diag(A)`` and the correlation matrix ``C = D^-1/2 A D^-1/2``, the
    eigenvalues ``lambda_i`` of ``A^-1 E`` are those of ``C^-1 E'`` (``|E'_jk| <= c``), so
    ``sum |lambda_i| <= ||C^-1 E'||_* <= ||C^-1||_F ||E'||_F <= ||C^-1||_F c s =: e`` (Hoelder;
    also a bound on their largest), and ``|ln|A + E| - ln|A|| = |sum ln(1 + lambda_i)| <= 2 e``
    while ``e <= 1/2``. ``||C^-1||_F^2 = sum_jk A_jj A_kk (A^-1)_jk^2`` comes from the computed
    factor, i.e. from ``A + E``; while ``e <= 1/2``, ``A + E <= 3/2 A``, so ``A^-1 <= 3/2 (A +
    E)^-1`` in the Loewner order, which the congruence by ``D^1/2`` keeps and the Frobenius
    norm of positive semi-definite matrices respects: it is doubled. About ``c s^1.5`` for a
    well-conditioned ``A``; infinite where ``A``'s correlations make its factor inaccurate.
    Before, ``tr(C^-1)`` (``>= ||C^-1||_F``) stood in its place: ``c s^2`` at best, and on
    moment-matched covariances of four random full components (float32) 2.4-6.5x the present
    bound (``2 e`` 0.33-0.49 -> 0.05-0.09 at ``s = 60``, 0.04 -> 0.01 at ``s = 30``); the
    moment-matched bound 0.20 -> 0.033 nats above the truth at ``d = 60``, 0.019 -> 0.004 at
    ``d = 30`` (``tests/test_estimators.py::test_moment_matched_bound_of_full_components_is_tight``),
    and on 150 random mixtures (K = 1-8, d = 3-60, axis scale ratios up to 1e4) never below the
    float64 truth, its median excess 0.024 -> 0.009 nats. The correction carries no derivative.
    """
    s = a.shape[-1]
    eps = jnp.finfo(a.dtype).eps
    a = 0.5 * (a + a.T)
    chol = cholesky(a)
    log_det = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
    l_inv = tril_inverse(lax.stop_gradient(chol))
    root_diag = jnp.sqrt(jnp.diagonal(lax.stop_gradient(a)))
    scaled = l_inv * root_diag[None, :]  # L^-1 D^1/2: C^-1 = (L^-1 D^1/2)^T (L^-1 D^1/2)
    frobenius_c_inv = 2.0 * jnp.sqrt(jnp.sum(jnp.square(scaled.T @ scaled)))
    e = (dot_length + s + 7) * eps * s * frobenius_c_inv
    ok = (e <= 0.5) & jnp.isfinite(log_det) & jnp.isfinite(e)
    return jnp.where(ok, log_det - 2.0 * e, -jnp.inf), jnp.where(ok, log_det + 2.0 * e, jnp.inf)


def moment_matched_upper(log_weights, locs, scale_tril, scale) -> Array:
    """``1/2 ln|2 pi e Sigma_mix|`` of the moment-matched Gaussian (an upper bound). Diagonal
    covariances: ``Sigma_mix = diag(a) + U^T U`` (``a = sum_k w_k s_k^2``, rows ``U_k =
    sqrt(w_k) dev_k``), ``ln|Sigma_mix| = sum ln a + ln|I + V V^T|`` with ``V = U diag(a)^-1/2``
    by :func:`log_det_identity_plus_gram` (exceeds the exact value by at most its rounding;
    long deviations no longer make it NaN or ``-inf`` in float32). Full covariances: in
    ``d <= 2`` :func:`small_moment_matched_log_det` (a sum of squares, no cancellation),
    beyond a Cholesky factor of ``Sigma_mix`` plus a bound on its rounding
    (:func:`log_det_bracket`). Where that bound fails, or is larger, Hadamard's inequality
    ``ln|Sigma_mix| <= sum_l ln (Sigma_mix)_ll`` plus its own rounding (before, NaN at
    separations of ``10^4`` standard deviations in float32; and with the factor's
    determinant taken as exact, up to ``0.5`` nats below the entropy of a single component of
    standard deviations 1 and ``1e-4`` along rotated axes, ``d = 5``, float32)."""
    d = locs.shape[-1]
    w = jnp.exp(log_weights)
    locs = _centre(locs)
    dev = locs - w @ locs
    if scale is not None:
        log_det = diagonal_moment_matched_log_det(log_weights, dev, scale)
    elif d <= 2:
        log_det = small_moment_matched_log_det(log_weights, dev, scale_tril, scale)
    else:
        cov = jnp.einsum("k,kij->ij", w, covariances(scale_tril, scale)) + jnp.einsum("k,ki,kj->ij", w, dev, dev)
        length = d + locs.shape[0]  # d products per component's L_k L_k^T, summed over K
        # Hadamard's product, each A_ll a sum of positive terms: within (length + 4) eps
        hadamard = jnp.sum(jnp.log(jnp.diagonal(cov))) + d * (length + 4) * jnp.finfo(cov.dtype).eps
        _, exact = log_det_bracket(cov, length)  # +inf where its rounding is not bounded
        log_det = jnp.minimum(exact, hadamard)
    return 0.5 * (d * (LOG_2PI + 1.0) + log_det)


def deviations_jensen(weights: Array, trace: Array, d: int) -> Array:
    """``n ln(1 + trace / n)``, an upper bound on ``ln|I + M|`` for the deviations' part ``M``
    of a moment-matched covariance (``sum_k w_k dev_k dev_k^T`` scaled on both sides, positive
    semi-definite, ``tr M <= trace``): its rank is at most ``n``, one less than the positive
    weights (the weighted deviations sum to zero; clipped to ``[1, d]``), and Jensen's
    inequality on its ``n`` largest eigenvalues gives the bound, exact for two components. The
    fixed mixing rules' caps (:func:`numpyro_gmm._kernels.mixing.certified_upper`,
    :func:`numpyro_gmm._kernels.lowrank.certified_upper`)."""
    n = jnp.clip(jnp.sum(weights > 0) - 1, 1, d).astype(trace.dtype)
    return n * jnp.log1p(trace / n)


def widened(value: Array, eps_units: float) -> Array:
    """``value + eps_units * eps * (1 + |value|)``: a certified bound moved outwards by that
    many units of the dtype's rounding (negative ``eps_units`` for a lower bound), as the
    fixed mixing rules' caps and floor do (``8 eps``, half of ``entropy_bounds``' 16, so that a
    clipped value stays inside that bracket after the rounding of adding the rescaling's
    ``d ln c``)."""
    return value + eps_units * jnp.finfo(value.dtype).eps * (1.0 + jnp.abs(value))


def shifted_bracket(lower: Array, upper: Array, shift: Array) -> tuple[Array, Array]:
    """``(lower, upper)`` of ``entropy_bounds`` (and the low-rank bounds) moved back from
    rescaled units by ``shift = d ln c`` (:func:`rescaled`) and widened for rounding by
    ``16 eps (1 + |upper| + |shift|)``, with ``lower <= upper``. The ``|shift|`` term covers
    the final addition's rounding, about ``eps |upper + shift| / 2``: widened by ``16 eps (1 +
    |upper|)`` in rescaled units alone, a float32 bracket collapsed at a point ``4.1e-5``
    above the entropy of a mixture of separated components (``K = 8``, ``d = 60``, entropy
    ``-472.52``, rescaled about ``1``: the spacing of float32 numbers there is ``3e-5``)."""
    margin = 16.0 * jnp.finfo(upper.dtype).eps * (1.0 + jnp.abs(upper) + jnp.abs(shift))
    upper = upper + margin
    lower = jnp.minimum(lower - margin, upper)
    return lower + shift, upper + shift


def heaviest_pair_lower(log_weights: Array, locs: Array, entropies: Array, spread) -> Array:
    r"""A lower bound on the entropy from the Bhattacharyya distances to the heaviest component
    ``h`` only, each itself bounded below without factorisation; ``O(K d)`` besides ``spread``.
    Widened for rounding by ``8 eps (1 + |lower|)``.

    Kolchinsky & Tracey: ``H >= sum_i w_i H_i - sum_i w_i ln s_i``, ``s_i = sum_j w_j
    exp(-D_ij)``, ``D_ij`` the Bhattacharyya distances (:func:`pairwise_bhattacharyya_lower`).
    A larger ``s_i`` or a smaller ``D_ij`` gives a smaller bound, so with ``exp(-D_ij) <= 1``
    for the pairs without ``h`` and a lower bound ``D_i <= D_ih``:

    .. math::

        s_h \le \sum_j w_j e^{-D_j}, \qquad s_i \le (1 - w_h) + w_h e^{-D_i} \quad (i \ne h),

    .. math::

        D_i = \frac{|\Delta_i|^4}{4\, \Delta_i^T (\Sigma_i + \Sigma_h) \Delta_i}
            + \frac d2 \ln\cosh\frac{\ln|\Sigma_i| - \ln|\Sigma_h|}{2d}, \qquad \Delta_i = \mu_i - \mu_h.

    ``D_B = 1/8 Delta^T S^{-1} Delta + 1/2 ln|S| - 1/4 ln|Sigma_i||Sigma_h|`` with
    ``S = (Sigma_i + Sigma_h) / 2``: Cauchy-Schwarz (``|Delta|^4 <= (Delta^T S Delta)
    (Delta^T S^{-1} Delta)``) bounds the first term and Minkowski's determinant inequality
    (``|S|^{1/d} >= (|Sigma_i|^{1/d} + |Sigma_h|^{1/d}) / 2``) the rest. Equal to the pairwise
    bound for ``K = 2`` in 1-D, and close to it where the mixture is nearly its heaviest
    component (a narrow component of small weight inside a wide one, where the fixed rule of
    :mod:`~numpyro_gmm._kernels.mixing` fell below the pairwise bound by up to ``2.9e-4``
    nats, float64, 3-D). ``entropies``: the ``H_i``, ``(K,)``; ``spread(delta, onehot)``: the
    ``(K,)`` values ``Delta_i^T (Sigma_i + Sigma_h) Delta_i`` from ``delta (K, d)`` and the
    one-hot ``(K,)`` indicator of ``h``.
    """
    d = locs.shape[-1]
    w = jnp.exp(log_weights)
    onehot = lax.stop_gradient(jax.nn.one_hot(jnp.argmax(log_weights), w.shape[0], dtype=w.dtype))
    at_h = onehot > 0
    # Delta_h and the log-determinant gap at h are set to 0, not left to ``x_h - onehot @ x``:
    # XLA may compute ``locs`` in two fusions with different rounding, and then Delta_h was
    # a tiny non-zero vector whose spread underflowed to 0 (float32, jit; 2-D, K = 4 of the
    # accuracy map): D_h = inf dropped h's own term from s_h, and the "lower" bound rose
    # 0.76 nats, above the truth and the upper bound (the default returned the upper bound,
    # 0.248 nats off).
    delta = jnp.where(at_h[:, None], 0.0, locs - onehot @ locs)  # (K, d)
    # A pair whose |Delta|^2 or spread overflows is infinitely apart (exp(-D) = 0, no derivative)
    delta, far = zeroed_unless_finite(delta, jnp.sum(jnp.square(delta), -1), spread(delta, onehot))
    sq = jnp.sum(jnp.square(delta), -1)
    spread_ = spread(delta, onehot)
    # Delta = 0 (at h, or equal means): the first term is 0, and so its derivative. A spread
    # that underflows where |Delta|^2 does not takes the first term as 0 too: any D_i' <= D_i
    # gives a smaller s_i, so the bound stays a bound.
    # |Delta|^4 / (4 spread) as |Delta|^2 (|Delta|^2 / (4 spread)): the ratio is O(1) in the
    # rescaled units, while |Delta|^4 overflowed float32 from |Delta| ~ 4e9 sds (value
    # exp(-inf) = 0 still right, but its gradient inf * 0 = NaN: the default's gradient was
    # NaN on components 1e10 sds apart).
    apart = (sq > 0) & (spread_ > 0)
    ratio = jnp.where(apart, sq, 0.0) / (4.0 * jnp.where(apart, spread_, 1.0))
    quad = jnp.where(far, jnp.inf, jnp.where(apart, sq * ratio, 0.0))
    t = jnp.where(at_h, 0.0, jnp.abs(entropies - onehot @ entropies)) / d  # |ln|Sigma_i| - ln|Sigma_h|| / (2 d)
    log_cosh = t + jnp.log1p(jnp.exp(-2.0 * t)) - math.log(2.0)
    near = jnp.exp(-(quad + 0.5 * d * log_cosh))  # exp(-D_i), 1 at h
    w_h = onehot @ w
    s = onehot * (w @ near) + (1.0 - onehot) * ((1.0 - w_h) + w_h * near)
    lower = jnp.sum(w * entropies) - jnp.sum(w * jnp.log(s + jnp.finfo(w.dtype).tiny))  # s = 0 only where w_h = 1
    return widened(lower, -8.0)
