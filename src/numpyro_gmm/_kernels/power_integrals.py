r"""Moments ``E_p[(p/a)^k]`` of a Gaussian mixture, evaluated over compositions as data.

For ``p(x) = sum_i w_i N(x; mu_i, Sigma_i)`` (``i = 1..K``, ``x`` in ``R^d``) and an integer
``n >= 1``, the multinomial theorem gives

.. math::

    \int p(x)^n dx = \sum_{|m| = n} \binom{n}{m} \prod_i w_i^{m_i}
                     \int \prod_i N(x; \mu_i, \Sigma_i)^{m_i} dx,

a sum over the ``C(n + K - 1, K - 1)`` weak compositions ``m`` of ``n``. In information
form, with ``Lambda_i = Sigma_i^{-1}``, ``h_i = Lambda_i mu_i``, and for one composition
``Lambda_m = sum_i m_i Lambda_i``, ``eta_m = sum_i m_i h_i``,
``Q_m = sum_i m_i mu_i^T Lambda_i mu_i - eta_m^T Lambda_m^{-1} eta_m >= 0``:

.. math::

    \ln \int \prod_i N_i^{m_i} dx = \sum_i m_i \ln N_i(\mu_i) + \tfrac d2 \ln 2\pi
        - \tfrac12 \ln|\Lambda_m| - \tfrac12 Q_m

(Dahlke & Pacheco, NeurIPS 2023, section 3). The entropy estimators need the moments of
``u = p(X)/a`` with the paper's bound ``a = sum_i w_i N_i(mu_i) >= max p``. Writing
``alpha = ln sum_i w_i |Lambda_i|^{1/2}`` (so ``ln a = alpha - d/2 ln 2pi``) and
``r_i = ln w_i + 1/2 ln|Lambda_i| - alpha <= 0``, the ``2 pi`` factors cancel exactly and

.. math::

    \ln E_p[u^{n-1}] = \ln \frac{\int p^n}{a^{n-1}}
        = \operatorname{LSE}_{|m| = n} \Big[ \ln\binom{n}{m} + \sum_i m_i r_i
          + \alpha - \tfrac12 \ln|\Lambda_m| - \tfrac12 Q_m \Big].

Every term is ``O(1)``: the moments are invariant under affine maps of ``x``, so the
kernel first centres the means and divides each coordinate by the geometric mean of the
components' standard deviations along it. In float32 this keeps the absolute error of
each log-term near one ulp of a number of order one.

**Compositions are data, not program.** The traced graph has the same size for every
``K`` and ``n``; only array shapes change. The components are split into two halves and
every composition is a pair of half compositions
(:func:`numpyro_gmm.compositions.pair_schedule`). Small half tables (at most
:data:`EMBED_MAX_ENTRIES` entries) are int8 constants of the program; larger ones are
*unranked* on the device from their row index and a table of ``K (n+1)^2`` prefix counts
(:func:`numpyro_gmm.compositions.unrank_tables`), so no large array is ever a constant of the
computation (large constants are what made compile time grow: 6.4 s at ``K = 32``, order
10, with a 13-million-row table embedded). Per half composition, the sums
``sum m_i r_i + ln(t! / prod m_i!)`` (``t`` the half's total), the within-half spread, the
mean ``mubar`` and the upper triangle of ``sum m_i Lambda_i`` are computed once and stored
as one row (``(C, F)``); a pair adds ``ln binom(n, s)`` of its cell.

**Dense tiles.** A cell (all pairs of one total ``n`` whose first half sums to ``s``) is cut
into tiles of ``tile_short x tile_long`` pairs: one tile gathers ``tile_short +
tile_long`` rows and evaluates ``tile_short * tile_long`` pairs by broadcasting, so the pair
algebra runs on contiguous arrays (a row gather per pair cost more than the arithmetic).
Per pair: one add of the two halves, and a ``d x d`` log-determinant and quadratic form
instead of ``O(K d^2)`` work: closed forms for ``d = 1, 2`` (in 2-D without cancellation:
:func:`_pair_det`, :func:`_between_2d`, ``O(K)`` per pair), an unrolled Cholesky up to
:data:`~numpyro_gmm._kernels.gaussian.UNROLL_MAX_DIM`, batched LAPACK beyond. A diagonal
covariance needs no factorisation at all (``O(d)`` per pair).

**One pass, no running maximum.** Tiles are visited in blocks of fixed size by a
``lax.scan``. Every term is measured from a reference per power that is known before the
scan (:func:`_reference`: the largest term of a pure composition ``m = n e_i``, with the
exact bound ``ref_n <= LSE_n <= ref_n + n ln K``), so each power's sum of exponentials is
in range and the scan carries plain sums.

**Derivative in the same pass.** The log-moments are a ``custom_jvp`` function of the half
rows: when differentiated, the scan also accumulates the Jacobian of each power's
log-sum-exp with respect to every half row (softmax weight times the closed-form partials
of the pair term, :func:`_pair_core`, :func:`_row_cotangents`, summed per row by one
scatter-add per block). Forward and reverse mode are both a contraction with it; the tiles
are evaluated once, and memory is the half tables times ``k_max`` plus one block, never
proportional to the number of compositions.

**Several devices.** When JAX sees more than one device, the block axis is split across
them with ``shard_map``: each device scans its share of blocks with the same reference,
and the shares' sums (and Jacobians) are added. The result equals the single-device one up
to the order of floating-point additions.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.nn import logsumexp
from jax.sharding import PartitionSpec

from ..compositions import PairSchedule, pair_schedule, unrank_tables
from .gaussian import (
    LOG_2PI,
    UNROLL_MAX_DIM,
    information_form,
    tril_inverse,
    logdet_and_inverse_rows,
    logdet_and_quad_rows,
    solve_rows,
    symmetric_matvec_rows,
)

Array = jnp.ndarray

DEFAULT_BLOCK_SIZE = 4096

# Half tables up to this many entries (int8) are program constants; larger ones are unranked
# on the device (see _half_tables).
EMBED_MAX_ENTRIES = 1 << 18

_AXIS = "blocks"

#: Largest number of compositions (pair terms, summed over the powers) one moment evaluation
#: may take: about 5 s forward and 20 s with the gradient at d <= 2 on one CPU core
#: (2e8 / 5e7 compositions per second, docs/performance.md), more at higher d.
MAX_COMPOSITIONS = 1 << 30
#: Largest estimated peak memory (bytes) of one moment evaluation with its gradient
#: (:func:`moment_cost`).
MAX_MOMENT_BYTES = 1 << 31


def moment_cost(K: int, d: int, k_max: int, diagonal: bool, itemsize: int, block_size: int = DEFAULT_BLOCK_SIZE):
    """``(compositions, bytes)``: the number of compositions of ``n = 2..k_max + 1`` into
    ``K`` parts that :func:`log_moments` evaluates, and an estimate of its peak memory with
    the gradient, from closed forms only (nothing is allocated).

    Memory: the two half tables hold ``R = C(n_max + K_a, K_a) + C(n_max + K_b, K_b)`` rows
    (``K_a = ceil(K/2)``, ``K_b = K - K_a``, ``n_max = k_max + 1``); per row the engine keeps
    the composition counts (``K_a`` int32 and ``K_a`` floats while the rows are summed) and
    ``F = 3 + d + P`` features (``P = d`` diagonal, ``d(d+1)/2`` full; ``+ 1 + K_a`` for full
    ``d = 2``, the determinant features of :func:`_pair_det`) in the row table, its
    cotangent and the ``k_max`` Jacobian rows (:func:`_pair_lse`), plus one block of
    ``block_size`` pairs (a few dozen floats each):
    ``bytes ~= itemsize (R (2 K_a + F (k_max + 2)) + 64 block_size F)``.
    """
    from ..compositions import num_compositions

    n_max = k_max + 1
    K_a = (K + 1) // 2
    K_b = K - K_a
    rows = num_compositions(n_max, K_a + 1) + num_compositions(n_max, K_b + 1)
    comps = sum(num_compositions(n, K) for n in range(2, n_max + 1))
    F = 3 + d + (d if diagonal else d * (d + 1) // 2) + ((1 + K_a) if d == 2 and not diagonal else 0)
    nbytes = itemsize * (rows * (2 * K_a + F * (k_max + 2)) + 64 * block_size * F)
    return comps, nbytes


def check_moment_cost(K: int, d: int, k_max: int, diagonal: bool, itemsize: int, block_size: int = DEFAULT_BLOCK_SIZE):
    """Raise ``ValueError`` (before anything is allocated) when :func:`log_moments` would
    evaluate more than :data:`MAX_COMPOSITIONS` compositions or need more than
    :data:`MAX_MOMENT_BYTES` (estimated by :func:`moment_cost`)."""
    comps, nbytes = moment_cost(K, d, k_max, diagonal, itemsize, block_size)
    if comps > MAX_COMPOSITIONS or nbytes > MAX_MOMENT_BYTES:
        raise ValueError(
            f"the power moments for K={K} components, order={k_max} (d={d}) need {comps:.3g} "
            f"compositions and about {nbytes / 2**30:.3g} GiB with the gradient, beyond the "
            f"limits of {MAX_COMPOSITIONS:.3g} compositions and {MAX_MOMENT_BYTES / 2**30:.3g} GiB "
            "(the count grows as C(order + K, K - 1)). Lower the order, or use "
            "method='auto' / 'mixing_qmc' (cost O(K^2 M d), no series) or the closed-form bounds."
        )
    return comps, nbytes



def _devices() -> list:
    """The devices the block axis is split across (all that JAX sees)."""
    return jax.devices()


def _as_data(table) -> Array:
    """A small NumPy table as an array XLA treats as opaque data (no constant folding)."""
    return lax.optimization_barrier(jnp.asarray(table))


def _count_le(sorted_table: Array, x: Array) -> Array:
    """``searchsorted(sorted_table, x, side="right")`` for a short table, without a loop."""
    return jnp.sum(sorted_table <= x[..., None], axis=-1, dtype=jnp.int32)


def _unrank_halves(n_max: int, k_a: int, k_b: int) -> tuple[Array, Array]:
    """``(k_a, C_a)`` and ``(k_b, C_b)`` int32 tables: column ``r`` is row ``r`` of
    ``compositions_up_to(n_max, k)``, for both halves at once.

    Computed on the device from the row index (see :func:`numpyro_gmm.compositions.unrank_tables`)
    by one ``lax.scan`` over the ``k_a`` parts (``k_b`` is ``k_a`` or ``k_a - 1``; the second
    half's compositions are those of ``k_a`` parts with a first part forced to 0), so the
    graph does not grow with ``K``.
    """
    off_a, pre_a = unrank_tables(n_max, k_a)
    off_b, pre_b = unrank_tables(n_max, k_b)
    rows_a, rows_b = int(off_a[-1]), int(off_b[-1])
    big = np.iinfo(np.int32).max  # ranks are < C(n_max + k, k), which pair_schedule keeps in int32
    if k_b < k_a:
        zero_first = np.full((1,) + pre_b.shape[1:], big, dtype=np.int64)
        zero_first[:, :, 0] = 0
        pre_b = np.concatenate([zero_first, pre_b], axis=0)
    prefix = np.stack([pre_a, pre_b], axis=1)  # (k_a, 2, n_max + 1, n_max + 2)
    prefix = np.minimum(prefix, big).astype(np.int32).reshape(k_a, 2 * (n_max + 1), n_max + 2)
    r = lax.optimization_barrier(jnp.arange(rows_a + rows_b, dtype=jnp.int32))
    half = (r >= rows_a).astype(jnp.int32)
    r = r - half * rows_a
    offsets = _as_data(np.stack([off_a, off_b]).astype(np.int32))  # (2, n_max + 2)
    # Row r of a half has total s where offsets[s] <= r < offsets[s + 1].
    total = jnp.sum(offsets[:, 1:][half] <= r[:, None], axis=1, dtype=jnp.int32)
    rank = r - offsets[half, total]

    def part(carry, table):
        rank, total = carry
        row = table[half * (n_max + 1) + total]  # (C, n_max + 2)
        v = _count_le(row, rank) - 1
        rank = rank - jnp.take_along_axis(row, v[:, None], axis=1)[:, 0]
        return (rank, total - v), v

    _, parts = lax.scan(part, (rank, total), _as_data(prefix))  # (k_a, C_a + C_b)
    return parts[:, :rows_a], parts[k_a - k_b :, rows_a:]


def _half_tables(sched: PairSchedule) -> tuple[Array, Array]:
    """The two half tables as :func:`_unrank_halves` returns them: embedded in the program as
    int8 constants when they hold at most :data:`EMBED_MAX_ENTRIES` entries (no work per
    call), unranked on the device beyond (a large constant is what made compile time grow)."""
    if sched.rows_a * sched.K_a + sched.rows_b * sched.K_b > EMBED_MAX_ENTRIES:
        return _unrank_halves(sched.n_max, sched.K_a, sched.K_b)
    return _as_data(sched.half_a.T), _as_data(sched.half_b.T)


def _whiten(locs: Array, scale_tril: Array | None, scale: Array | None):
    """Centre the means and rescale each coordinate (moments are affine invariant).

    Returns the transformed ``(locs, scale_tril, scale)`` and ``sum_j ln s_j``, the
    log-Jacobian to add back to ``ln a``.
    """
    sd = scale if scale is not None else jnp.sqrt(jnp.sum(jnp.square(scale_tril), axis=-1))
    log_s = lax.stop_gradient(jnp.mean(jnp.log(sd), axis=0))  # (d,) any positive s is exact
    s = jnp.exp(log_s)
    locs = (locs - lax.stop_gradient(jnp.mean(locs, axis=0))) / s
    if scale is not None:
        return locs, None, scale / s, jnp.sum(log_s)
    return locs, scale_tril / s[:, None], None, jnp.sum(log_s)


def _mixed(d: int, diagonal: bool) -> bool:
    """Whether the half rows carry the accurate determinant features (full ``d = 2``)."""
    return d == 2 and not diagonal


def _num_entries(d: int, diagonal: bool) -> int:
    return d if diagonal else d * (d + 1) // 2


def _pair_algebra(ga, gb, d: int, diagonal: bool):
    """``(delta, la, lb, lam)`` of a batch of pairs; ``ga``, ``gb``: the ``F`` feature rows
    ``[s, spread, non-empty, mbar (d), Lambda entries (P)]`` of the two half compositions,
    followed for full ``d = 2`` by ``[det, vec (K_a)]`` (:func:`_pair_det`)."""
    both = lax.stop_gradient(ga[2] * gb[2])  # a 0/1 flag: no cotangent
    delta = [(ga[3 + j] - gb[3 + j]) * both for j in range(d)]
    P = _num_entries(d, diagonal)
    la, lb = ga[3 + d : 3 + d + P], gb[3 + d : 3 + d + P]
    return delta, la, lb, [x + y for x, y in zip(la, lb)]


def _pair_det(ga, gb):
    r"""``|Lambda_a + Lambda_b|`` of full 2-D pairs without cancellation.

    For ``2 x 2`` matrices ``|A + B| = |A| + |B| + D(A, B)`` with the mixed discriminant
    ``D(A, B) = tr(adj(A) B)``, bilinear and ``>= 0`` for positive semi-definite ``A, B``; so
    ``|sum_i m_i Lambda_i| = 1/2 sum_ij m_i m_j D_ij`` with ``D_ij = D(Lambda_i, Lambda_j)
    = ||L_j^-1 L_i||_F^2 / |L_i|^2`` (``D_ii = 2 |Lambda_i|``), a sum of non-negative terms.
    Each half row stores its own ``|Lambda_h| = 1/2 m_h^T D_hh m_h`` and a vector whose dot
    product with the other half's is the cross term ``m_a^T D_ab m_b`` (``m_a`` on the first
    half's rows, ``D_ab m_b`` on the second's). The product ``ac - b^2`` of the summed entries
    instead loses ``cond(Lambda) eps`` relatively: measured 3e-3 .. 1.6e-2 in the float32
    log-moments of thin ellipses (condition number 1e5), which the Legendre series amplified
    to nats.
    """
    det = ga[8] + gb[8] + sum(x * y for x, y in zip(ga[9:], gb[9:]))
    return jnp.where(det > 0, det, jnp.nan)


def _pair_terms(ga, gb, d: int, diagonal: bool):
    r"""``s_a + s_b - (ln|Lambda_m| + Q_m) / 2`` of a batch of pairs of half compositions.

    ``ga``, ``gb``: lists of feature rows (see :func:`_pair_algebra`) of broadcastable shapes.
    ``Q_m = S_a + S_b + delta^T (Lambda_a^-1 + Lambda_b^-1)^-1 delta`` with
    ``delta = mubar_a - mubar_b`` (0 when a half is empty), the Gaussian-product rule.
    With ``v = Lambda_a delta`` the last term is ``delta^T v - v^T Lambda_m^-1 v``; it is
    small whenever the term matters, so its cancellation is harmless. Diagonal and
    ``d = 1``: ``sum_j delta_j^2 la_j lb_j / (la_j + lb_j)``, no cancellation at all.
    (The value only; :func:`_pair_core` is the same term with what its derivative needs.)
    """
    delta, la, lb, lam = _pair_algebra(ga, gb, d, diagonal)
    if diagonal or d == 1:
        log_det = sum(jnp.log(x) for x in lam)
        between = sum(jnp.square(delta[j]) * (la[j] * lb[j] / lam[j]) for j in range(d))
    else:
        if _mixed(d, diagonal):
            det = _pair_det(ga, gb)
            log_det = jnp.log(det)
            between = _between_2d(ga, gb, delta, la, lb) / det
        else:
            v = symmetric_matvec_rows(la, delta, d)
            log_det, quad = logdet_and_quad_rows(v, lam, d, diagonal)
            between = jnp.maximum(sum(delta[i] * v[i] for i in range(d)) - quad, 0.0)
    return ga[0] + gb[0] - 0.5 * (ga[1] + gb[1] + log_det + between)


def _adj_times(lam, x):
    """``adj(Lambda) x`` for 2-D ``Lambda`` given as its three upper-triangle entries."""
    a, b, c = lam
    return [c * x[0] - b * x[1], a * x[1] - b * x[0]]


def _between_2d(ga, gb, delta, la, lb):
    r"""``|Lambda| B`` of a full 2-D pair, a sum of two non-negative terms:
    ``B = delta^T Lambda_a Lambda^-1 Lambda_b delta = (|Lambda_a| delta^T Lambda_b delta
    + |Lambda_b| delta^T Lambda_a delta) / |Lambda|`` (``adj(Lambda) = adj(Lambda_a) +
    adj(Lambda_b)`` and ``Lambda_a adj(Lambda_a) = |Lambda_a| I`` for ``2 x 2``), with the
    halves' accurate determinants (:func:`_pair_det`). The form ``delta^T v - v^T Lambda^-1 v``
    (``v = Lambda_a delta``) loses ``eps |v| |delta|``, i.e. ``eps delta^T Lambda_a delta``,
    which is large for crossing thin ellipses while ``B`` is not."""

    def quad(lam):
        a, b, c = lam
        return delta[0] * (a * delta[0] + 2.0 * b * delta[1]) + c * delta[1] * delta[1]

    return jnp.maximum(ga[8] * quad(lb) + gb[8] * quad(la), 0.0)


def _pair_core(ga, gb, d: int, diagonal: bool):
    r"""The pair term of :func:`_pair_terms` with what its derivative needs, from one
    factorisation: ``(T, Lambda^-1, y, u)``, with ``Lambda = Lambda_a + Lambda_b``,
    ``y = Lambda^-1 Lambda_a delta`` and ``u = delta - y = Lambda^-1 Lambda_b delta``.

    The between term is ``B = delta^T Lambda_a Lambda^-1 Lambda_b delta = v^T u`` with
    ``v = Lambda_a delta``, and (see :func:`_row_cotangents`) ``dB/dLambda_a = u u^T``,
    ``dB/dLambda_b = y y^T``, ``dB/d delta = 2 Lambda_a u = 2 Lambda_b y``;
    ``d ln|Lambda| / dLambda_x = Lambda^-1``. Diagonal: ``u_j = delta_j lb_j / lam_j`` and
    ``y_j = delta_j la_j / lam_j`` directly (no cancellation).
    """
    delta, la, lb, lam = _pair_algebra(ga, gb, d, diagonal)
    if diagonal or d == 1:
        inv = [1.0 / x for x in lam]
        log_det = sum(jnp.log(x) for x in lam)
        u = [delta[j] * lb[j] * inv[j] for j in range(d)]
        y = [delta[j] * la[j] * inv[j] for j in range(d)]
        between = sum(la[j] * delta[j] * u[j] for j in range(d))
    else:
        if _mixed(d, diagonal):
            # Accurate determinant (_pair_det; 1/det kept for the cotangents) and between
            # term (_between_2d); u = Lambda^-1 Lambda_b delta = (adj(Lambda_a) Lambda_b delta
            # + |Lambda_b| delta) / det (adj is linear in 2-D), y likewise, with no delta - y.
            r = 1.0 / _pair_det(ga, gb)
            log_det = -jnp.log(r)
            inv = [lam[2] * r, -lam[1] * r, lam[0] * r, r]
            between = _between_2d(ga, gb, delta, la, lb) * r
            u = [(x + gb[8] * dx) * r for x, dx in zip(_adj_times(la, symmetric_matvec_rows(lb, delta, 2)), delta)]
            y = [(x + ga[8] * dx) * r for x, dx in zip(_adj_times(lb, symmetric_matvec_rows(la, delta, 2)), delta)]
        else:
            log_det, inv = logdet_and_inverse_rows(lam, d)
            v = symmetric_matvec_rows(la, delta, d)
            y = symmetric_matvec_rows(inv, v, d)
            u = [delta[i] - y[i] for i in range(d)]
            between = jnp.maximum(sum(v[i] * u[i] for i in range(d)), 0.0)
    return ga[0] + gb[0] - 0.5 * (ga[1] + gb[1] + log_det + between), inv, y, u


def _row_cotangents(w, ga, gb, inv, y, u, d: int, diagonal: bool):
    r"""``sum over pairs of w * dT/dx`` for every feature ``x`` of each side's rows: the short
    side's ``(G, ts)`` sums over the long axis, the long side's ``(G, tl)`` over the short axis
    (``w``: ``(G, ts, tl)`` weights; ``inv, y, u`` from :func:`_pair_core`).

    ``dT/ds = 1`` and ``dT/dspread = -1/2`` on both sides, the flag has none;
    ``dT/dmubar_a = -Lambda_a u``, ``dT/dmubar_b = Lambda_b y`` (``-1/2 dB/d delta``; 0 when a
    half is empty, since then ``delta = 0``); ``dT/dLambda_a = -(Lambda^-1 + u u^T) / 2`` and
    ``dT/dLambda_b = -(Lambda^-1 + y y^T) / 2``, off-diagonal entries (stored once) counted
    twice. Each side's own ``Lambda`` is constant along the axis summed over, so it multiplies
    the sums of ``w u`` and ``w y`` afterwards, on rows, not on pairs.
    """
    if diagonal or d == 1:
        pairs = [(j, j) for j in range(d)]
    else:
        pairs = list(zip(*np.triu_indices(d)))
    mixed = _mixed(d, diagonal)
    P = _num_entries(d, diagonal)
    if mixed:
        # ln|Lambda| comes from the determinant features (_pair_det), not from the entries:
        # dT/d det_h = -1/(2 det), dT/d vec_a = -vec_b/(2 det) (and symmetrically).
        w_r = w * inv[3]
        w_inv = [jnp.zeros_like(w)] * P
    else:
        w_inv = [w * x for x in inv]
    sides = []
    for own, other, vec, axis, sign in ((ga, gb, u, 2, -1.0), (gb, ga, y, 1, 1.0)):
        lam_own = [jnp.squeeze(x, axis) for x in own[3 + d : 3 + d + P]]
        w_vec = [w * x for x in vec]
        total = _sum_slices(w, axis)
        sum_vec = [_sum_slices(x, axis) for x in w_vec]
        if diagonal or d == 1:
            mean = [sign * lam_own[j] * sum_vec[j] for j in range(d)]
        else:
            mean = [sign * x for x in symmetric_matvec_rows(lam_own, sum_vec, d)]
        scale = [-0.5 if i == j else -1.0 for i, j in pairs]
        prec = [f * _sum_slices(w_inv[k] + w_vec[i] * vec[j], axis) for k, (f, (i, j)) in enumerate(zip(scale, pairs))]
        extra = []
        if mixed:
            extra = [-0.5 * _sum_slices(w_r, axis)] + [-0.5 * _sum_slices(w_r * x, axis) for x in other[9:]]
        sides.append([total, -0.5 * total, jnp.zeros_like(total)] + mean + prec + extra)
    return sides


def _sum_slices(x: Array, axis: int) -> Array:
    """``x.sum(axis)`` as a tree of slice additions (elementwise work that XLA fuses into the
    producer; a reduction op is a separate library call, ~6 us each on the CPU)."""
    parts = [lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def _log_factorials(n_max: int, dtype) -> Array:
    """``ln m!`` for ``m = 0..n_max`` (a constant look-up table)."""
    return jnp.asarray([math.lgamma(m + 1.0) for m in range(n_max + 1)], dtype=dtype)


def _pair_lse(sched: PairSchedule, n_min: int, d: int, diagonal: bool, k_max: int, dtype):
    r"""The function ``(stats, ref) -> [LSE_{|m| = n} (ln binom(n, s) + T_m), n = n_min..n_max]``
    over all pairs of half compositions that :func:`numpyro_gmm.compositions.pair_schedule`
    lists (``s`` the first half's total), with ``T_m`` the pair term of :func:`_pair_terms`
    (``binom(n, s)`` times the halves' own multinomials is the multinomial coefficient),
    ``stats`` the joint ``(C, F)`` table of half rows and ``ref`` a reference per power
    (:func:`_reference`) that keeps ``exp(LSE_n - ref_n)`` within the floating-point range.

    **One pass.** The sums ``S_n = sum_m exp(ln binom(n, s) + T_m - ref_n)`` need no running
    maximum, so the result is ``ref_n + ln S_n``.

    **Derivative.** With ``w_m = exp(ln binom(n, s) + T_m - LSE_n)`` (the softmax weight of
    pair ``m`` within its power ``n``),

    .. math::

        \frac{\partial\, \mathrm{LSE}_n}{\partial\, \mathrm{stats}_{r f}} = \sum_{m \ni r} w_m
            \frac{\partial T_m}{\partial x_f}

    (sum over the pairs that use row ``r``). The same pass accumulates this Jacobian ``J``
    (``(k_max, C, F)``, unnormalised, divided by ``S_n`` at the end) with the closed-form
    partials (:func:`_pair_core`, :func:`_row_cotangents`): per tile, ``w * partial`` summed
    over the other side, then one scatter-add of the tile's rows. The tangent is
    ``J . dstats``, so forward mode works, and reverse mode is its transpose
    ``sum_n g_n J_n``: one contraction, no transposed scan. (Differentiating through the
    scan re-evaluated every tile in reverse and reduced dozens of cotangents one by one:
    gradient 4.2-7.3x the forward time at ``K = 16``, order 6, against 2.9-4.0x now.)
    Memory: ``J`` is ``k_max`` times the half table, plus one block.
    """
    n_feat = 3 + d + _num_entries(d, diagonal) + ((1 + sched.K_a) if _mixed(d, diagonal) else 0)
    num_rows = sched.rows_a + sched.rows_b
    ts, tl, per_block = sched.tile_short, sched.tile_long, sched.tiles_per_block
    # ln binom(n, s) per cell: with the halves' own multinomials, ln(n! / prod m_i!) of a pair,
    # summed from small terms (exactly 0 for a pure composition, whatever n).
    # (NumPy here: the custom_jvp function below closes over these, and a JAX array made
    # while an outer jit traces is a tracer of that trace, which must not leak into the rule.)
    log_binom = np.asarray(
        [math.lgamma(n + 1) - math.lgamma(s + 1) - math.lgamma(n - s + 1) for n, s in zip(sched.cell_n, sched.cell_s)],
        dtype=dtype,
    )
    segments = np.arange(k_max, dtype=np.int32)

    def tile_weights(stats, ref, t, with_jacobian):
        """The tiles of block ``t``: their power (``n - n_min``, ``(G,)``), weights
        ``exp(ln binom(n, s) + T_m - ref_n)`` (``(G, ts, tl)``, 0 at padding), the row numbers
        of the two sides and, if asked, the per-row sums of :func:`_row_cotangents`."""
        cell_n, start_s, start_l, count_s, count_l, tiles_l, first_tile = (
            _as_data(x)
            for x in (
                sched.cell_n,
                sched.cell_start_short,
                sched.cell_start_long,
                sched.cell_count_short,
                sched.cell_count_long,
                sched.cell_tiles_long,
                sched.cell_first_tile,
            )
        )

        def rows(start, count, index, size):
            """Row numbers ``(G, size)`` of one side of each tile, and which are real."""
            local = index[:, None] * size + jnp.arange(size, dtype=jnp.int32)
            valid = local < count[:, None]
            return start[:, None] + jnp.where(valid, local, 0), valid

        def features(g, axis):
            """The ``F`` feature rows of gathered ``(G, size, F)`` stats, shaped to broadcast
            as the short side (``axis = 2``: ``(G, size, 1)``) or the long side (``axis = 1``:
            ``(G, 1, size)``)."""
            return [jnp.expand_dims(x[..., 0], axis) for x in jnp.split(g, n_feat, axis=-1)]

        tile = t * per_block + jnp.arange(per_block, dtype=jnp.int32)
        real_tile = tile < sched.num_tiles
        c = jnp.minimum(_count_le(first_tile[1:], tile), cell_n.shape[0] - 1)
        i, j = jnp.divmod(jnp.where(real_tile, tile - first_tile[c], 0), tiles_l[c])
        rows_s, valid_s = rows(start_s[c], count_s[c], i, ts)
        rows_l, valid_l = rows(start_l[c], count_l[c], j, tl)
        # Dense tiles: ts + tl row gathers serve ts * tl pairs; the pair algebra runs on
        # (G, ts, tl) arrays broadcast from (G, ts, 1) and (G, 1, tl) feature rows. The
        # algebra is symmetric in the halves, so which side is short does not matter.
        ga, gb = features(stats[rows_s], 2), features(stats[rows_l], 1)
        seg = cell_n[c] - n_min
        if with_jacobian:
            pair, inv, y, u = _pair_core(ga, gb, d, diagonal)
        else:
            pair = _pair_terms(ga, gb, d, diagonal)
        terms = (jnp.asarray(log_binom)[c] - ref[seg])[:, None, None] + pair
        valid = valid_s[:, :, None] & valid_l[:, None, :] & real_tile[:, None, None]
        w = jnp.where(valid, jnp.exp(terms), 0.0)
        sides = _row_cotangents(w, ga, gb, inv, y, u, d, diagonal) if with_jacobian else None
        return seg, w, rows_s, rows_l, sides

    def per_power(tile_values, seg):
        """Sum of per-tile values ``(G,)`` by power: ``(k_max,)``."""
        return jnp.sum(jnp.where(seg[:, None] == segments, tile_values[:, None], 0.0), axis=0)

    def scan_blocks(stats, ref, blocks, with_jacobian: bool):
        """``S`` (``(k_max,)``) and, if asked, the unnormalised ``J`` (flat ``(k_max C, F)``,
        row ``n C + r``) over ``blocks``."""

        def step(carry, t):
            seg, w, rows_s, rows_l, sides = tile_weights(stats, ref, t, with_jacobian)
            # Without the Jacobian, slice additions fuse into the weights' loop (w is never
            # stored); with it, w feeds the cotangents too and one reduction is cheaper.
            tile_sum = jnp.sum(w, axis=(1, 2)) if with_jacobian else _sum_slices(_sum_slices(w, 2), 1)
            sums = carry[0] + per_power(tile_sum, seg)
            if not with_jacobian:
                return (sums,), None
            # Features stacked on a leading axis, then one transpose: stacking the F separate
            # per-row sums on a new trailing axis was an interleaving copy that cost more than
            # the scatter itself (d = 16 diagonal gradient 30.6 -> 25.5 ms, same-process A/B).
            values = jnp.concatenate([jnp.stack(x).reshape(n_feat, -1) for x in sides], axis=1).T
            base = seg[:, None] * num_rows
            index = jnp.concatenate([(base + rows_s).reshape(-1), (base + rows_l).reshape(-1)])
            return (sums, carry[1].at[index].add(values)), None

        init = (jnp.zeros((k_max,), dtype=dtype),)
        if with_jacobian:
            init = init + (jnp.zeros((k_max * num_rows, n_feat), dtype=dtype),)
        out, _ = lax.scan(step, init, blocks)
        return out

    devices = _devices()
    n_dev = len(devices)
    if n_dev == 1 or sched.num_blocks < n_dev:
        all_blocks = np.arange(sched.num_blocks, dtype=np.int32)
        run = scan_blocks
    else:
        # Several devices: each scans a contiguous share of the blocks (the last share is
        # padded with invalid blocks); the shares' sums (and Jacobians) add up, since every
        # device uses the same reference.
        per_dev = -(-sched.num_blocks // n_dev)
        mesh = jax.sharding.Mesh(np.array(devices), (_AXIS,))
        all_blocks = np.arange(n_dev * per_dev, dtype=np.int32)

        def run(stats, ref, blocks, with_jacobian):
            shares = jax.shard_map(
                lambda *args: jax.tree.map(lambda x: x[None], scan_blocks(*args, with_jacobian)),
                mesh=mesh,
                in_specs=(PartitionSpec(), PartitionSpec(), PartitionSpec(_AXIS)),
                out_specs=PartitionSpec(_AXIS),
                check_vma=False,
            )(stats, ref, blocks)
            return jax.tree.map(lambda x: jnp.sum(x, axis=0), shares)

    @jax.custom_jvp
    def log_lse(stats, ref):
        (sums,) = run(stats, ref, all_blocks, False)
        return ref + jnp.log(sums)

    @log_lse.defjvp
    def log_lse_jvp(primals, tangents):
        (stats, ref), (dstats, _) = primals, tangents  # ref is a constant (stop_gradient)
        sums, jac = run(stats, ref, all_blocks, True)
        # d LSE_n = (J_n . dstats) / S_n: the division on the k_max results, not on J.
        tangent = jnp.einsum("nrf,rf->n", jac.reshape(k_max, num_rows, n_feat), dstats) / sums
        return ref + jnp.log(sums), tangent

    return log_lse


@jax.custom_jvp
def _diag_spread(m: Array, locs: Array, prec: Array, mbar: Array) -> Array:
    r"""Within-half spread for diagonal precisions:
    ``Q_c = sum_i m_ic sum_j prec_ij (locs_ij - mbar_jc)^2`` for counts ``m`` ``(k, C)``,
    ``locs``, ``prec`` ``(k, d)`` and half means ``mbar`` ``(d, C)``; ``(C,)``.

    **Derivative.** ``mbar_c = argmin_x sum_i m_ic (locs_i - x)^T Lambda_i (locs_i - x)``, so
    ``dQ/dmbar = 0`` (envelope theorem) and ``dQ_c = sum_i m_ic sum_j [2 prec_ij dev_ijc
    dlocs_ij + dev_ijc^2 dprec_ij]`` with ``dev = locs - mbar``. The rule drops the ``mbar``
    path (whose reverse mode was ``d`` reductions of ``(k, C)`` arrays per half); the term
    linear in ``dev`` is two matrix products (``sum_i m_ic a_ij locs_ij - mbar_jc sum_i m_ic
    a_ij``, ``a = 2 prec dlocs``: a first-order difference, harmless in float32), the
    quadratic one a single contraction over the coordinates stacked on one axis. It is exact
    at every order: the dropped term is zero for all parameters, so its derivatives are too
    (the rule is itself differentiable; Hessians agree with finite differences). Measured at
    ``d = 16``, ``K = 16``, order 6: gradient 28.4 -> 26.5 ms (one core, same-process A/B).
    """
    d = locs.shape[1]
    q = sum(prec[:, j][:, None] * jnp.square(locs[:, j][:, None] - mbar[j][None, :]) for j in range(d))
    return jnp.sum(m * q, axis=0)


@_diag_spread.defjvp
def _diag_spread_jvp(primals, tangents):
    m, locs, prec, mbar = primals
    _, dlocs, dprec, _ = tangents  # counts are constants; the mbar path is zero (above)
    dev = locs.T[:, :, None] - mbar[:, None, :]  # (d, k, C)
    a = 2.0 * prec * dlocs
    tangent = jnp.sum(m.T @ (a * locs), axis=1) - jnp.sum(mbar.T * (m.T @ a), axis=1) + jnp.einsum(
        "kc,jkc,kj->c", m, jnp.square(dev), dprec
    )
    return _diag_spread(m, locs, prec, mbar), tangent


def _reference(r: Array, half_log_det_prec: Array, n_min: int, k_max: int, d: int, dtype) -> Array:
    r"""A reference ``ref_n`` per power with ``ref_n <= LSE_n <= ref_n + n ln K`` (both sides
    exact; ``LSE_n`` = ``ln E_p[u^{n-1}] - alpha``), shifted so the sums of
    :func:`_pair_lse` stay in the floating-point range.

    The pure compositions ``m = n e_i`` have the term ``n r_i - 1/2 ln|Lambda_i| - d/2 ln n``
    (no spread, multinomial 1); ``ref_n`` is the largest. For any ``m`` of ``n``, with
    ``p_i = m_i / n``: ``sum m_i r_i = sum p_i (n r_i)``, ``-1/2 ln|sum m_i Lambda_i| <=
    -d/2 ln n - 1/2 sum p_i ln|Lambda_i|`` (``ln det`` is concave) and ``Q_m >= 0``, so its
    term is at most ``ln binom(n, m) + ref_n``; summed over ``m``, ``LSE_n <= ref_n + n ln K``.
    The sum ``S_n = exp(LSE_n - ref_n)`` is then in ``[1, K^n]``; where ``K^n`` could overflow,
    ``ref_n`` is raised by ``n ln K - H`` (``H`` = 3/4 of the largest exponent), which keeps
    ``S_n >= exp(-(n ln K - H))`` above underflow; beyond that (``n ln K > 132`` in float32,
    e.g. ``K = 16`` and ``n > 47``) a ``ValueError`` asks for float64.
    """
    n = np.arange(n_min, n_min + k_max)
    K = r.shape[0]
    info = jnp.finfo(dtype)
    top = 0.75 * math.log(float(info.max))
    shift = np.maximum(n * math.log(K) - top, 0.0)
    if shift[-1] > -0.75 * math.log(float(info.tiny)):
        raise ValueError(
            f"k_max={k_max} with K={K} components: the sums over compositions of power "
            f"{n[-1]} span K^n = e^{n[-1] * math.log(K):.0f}, beyond the range of {np.dtype(dtype).name}; "
            "use float64 (jax_enable_x64) or a lower order"
        )
    pure = jnp.asarray(n, dtype)[:, None] * r[None, :] - half_log_det_prec[None, :]  # (k_max, K)
    ref = jnp.max(pure, axis=1) + jnp.asarray(shift - 0.5 * d * np.log(n), dtype)
    return lax.stop_gradient(ref)


def log_moments(
    log_weights: Array,
    locs: Array,
    scale_tril: Array | None = None,
    scale: Array | None = None,
    *,
    k_max: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> tuple[Array, Array]:
    r"""``(ln a, [ln E_p[u^k] for k = 1..k_max])`` with ``u = p/a`` and ``a`` the paper's bound.

    Args:
      log_weights: ``(K,)`` normalised log mixture weights.
      locs: ``(K, d)`` component means.
      scale_tril: ``(K, d, d)`` lower Cholesky factors of the covariances; or
      scale: ``(K, d)`` standard deviations of diagonal covariances (exactly one of the two).
      k_max: static highest moment, ``>= 1`` (uses powers ``n = 2..k_max + 1``).
      block_size: static number of compositions evaluated at once (memory knob).

    Returns:
      ``ln a`` (scalar) and the log moments, shape ``(k_max,)``.

    Raises:
      ValueError: before allocating, when the evaluation would exceed
        :data:`MAX_COMPOSITIONS` or :data:`MAX_MOMENT_BYTES` (:func:`check_moment_cost`).
    """
    K, d = locs.shape
    diagonal = scale is not None
    n_min, n_max = 2, k_max + 1
    check_moment_cost(K, d, k_max, diagonal, jnp.dtype(locs.dtype).itemsize, block_size)
    sched = pair_schedule(n_min, n_max, K, block_size)
    K_a = sched.K_a

    locs, scale_tril, scale, log_jac = _whiten(locs, scale_tril, scale)
    prec, log_det_cov = information_form(scale_tril, scale)
    mixed = _mixed(d, diagonal)
    if not diagonal:
        # L_i^-1: the within-half spread as |L_i^-1 (mu_i - mbar)|^2, a sum of squares (the
        # quadratic form dev^T Lambda_i dev of the entries loses cond(Lambda_i) eps).
        l_inv = tril_inverse(scale_tril)
    if mixed:
        # Mixed discriminants D_ij = ||L_j^-1 L_i||_F^2 / |L_i|^2 (_pair_det), symmetrised.
        det_l = scale_tril[:, 0, 0] * scale_tril[:, 1, 1]
        fro = jnp.sum(jnp.square(jnp.einsum("jab,ibc->ijac", l_inv, scale_tril)), axis=(-1, -2))
        mixed_disc = fro / jnp.square(det_l)[:, None]
        mixed_disc = 0.5 * (mixed_disc + mixed_disc.T)
    half_log_det_prec = -0.5 * log_det_cov
    alpha = logsumexp(log_weights + half_log_det_prec)
    log_a = alpha - 0.5 * d * LOG_2PI - log_jac
    r = log_weights + half_log_det_prec - alpha  # <= 0
    # A weight of 0 (logit -inf) must contribute exp(-inf) = 0, not 0 * -inf = NaN in the
    # count-weighted sums below: a large finite negative value does (times n <= 128 it is
    # still finite in float32, and exp of it is 0).
    r = jnp.where(jnp.isneginf(r), -1e30, r)
    if diagonal:
        lam_rows = prec.T  # (d, K)
    else:
        iu, ju = np.triu_indices(d)
        lam_rows = prec[:, iu, ju].T  # (d(d+1)/2, K), row-major upper triangle
        eye_rows = (iu == ju).astype(np.float64)
    dtype = locs.dtype
    log_fact = _log_factorials(n_max, dtype)  # ln m! by table look-up

    def half_sums(table, lo, hi):
        """Per half composition (columns): counts, ``sum m_i r_i + ln(t! / prod m_i!)`` (``t``
        the half's total), non-empty and ``sum m_i Lambda_i`` ``(P, C)``."""
        m = table.astype(dtype)  # (k, C) counts
        nonempty = jnp.sum(m, axis=0) > 0
        # ln(t! / prod m_i!) within the half (t its total): exactly 0 for a pure row.
        counts = table.astype(jnp.int32)
        s = r[lo:hi] @ m + (log_fact[jnp.sum(counts, axis=0)] - jnp.sum(log_fact[counts], axis=0))
        out = (m, s, nonempty, lam_rows[:, lo:hi] @ m)
        if mixed:
            # |Lambda_h| = 1/2 m^T D_hh m and the cross-term vector (_pair_det)
            det_h = 0.5 * jnp.sum(m * (mixed_disc[lo:hi, lo:hi] @ m), axis=0)
            vec = m if lo == 0 else mixed_disc[:K_a, lo:hi] @ m
            out = out + (det_h, vec)
        return out

    def half_means(halves):
        """``mubar = Lambda^-1 eta`` of every half composition of both halves, as
        ``mu_ref + Lambda^-1 g`` with ``g = sum_i m_i Lambda_i (mu_i - mu_ref)`` around the
        mean ``mu_ref`` of one member of the half (the one of largest count), so that a pure
        half's mean is its component's mean exactly and the rounding scales with the spread
        of the half's means, not with their size. ``Lambda^-1 eta`` itself rounds to about
        ``eps |mu| / sd`` standard deviations: in float32 with means ``10^8`` sds apart a pure
        half's mean was several sds off its component, the spread ``Q_m`` of a composition
        that should be 0 was ~100, and the Taylor "lower" bound of ``entropy_bounds`` came
        out 0.08 nats above the entropy (1-D, ``K = 2``, scales 1 and 1.3, order 4). Empty
        compositions (total 0) get ``mbar = 0``. One batched solve for both halves (two
        LAPACK calls running at once were seen to deadlock)."""
        refs, gs = [], []
        for x, (lo, hi) in zip(halves, ((0, K_a), (K_a, K))):
            m = x[0]  # (k, C)
            if hi == lo:  # an empty half (K = 1): every composition is empty
                ref = jnp.zeros((d, m.shape[1]), dtype)
            else:
                # No derivative: mubar does not depend on the choice of mu_ref (its derivative
                # through mu_ref, 1 - Lambda^-1 sum m_i Lambda_i, is 0), and the gather's
                # reverse mode (a scatter-add) cost 6 of 49 ms of the gradient at K = 16,
                # d = 2, order 8.
                ref = lax.stop_gradient(locs[lo:hi][jnp.argmax(m, axis=0)].T)  # (d, C)
            dev = [locs[lo:hi, j][:, None] - ref[j][None, :] for j in range(d)]  # (k, C)
            if diagonal:
                g = [jnp.sum(m * prec[lo:hi, j][:, None] * dev[j], axis=0) for j in range(d)]
            else:
                g = [jnp.sum(m * sum(prec[lo:hi, p_, q][:, None] * dev[q] for q in range(d)), axis=0) for p_ in range(d)]
            refs.append(ref)
            gs.append(jnp.stack(g))
        ref, g = jnp.concatenate(refs, axis=1), jnp.concatenate(gs, axis=1)
        lam = jnp.concatenate([x[3] for x in halves], axis=1)
        nonempty = jnp.concatenate([x[2] for x in halves])
        if diagonal:
            step = g / jnp.where(nonempty, lam, 1.0)
        elif mixed:
            # adj(Lambda) g / |Lambda| with the accurate determinant (_pair_det): the
            # entries' ac - b^2 lost eps cond(Lambda) to cancellation.
            det = jnp.where(nonempty, jnp.concatenate([x[4] for x in halves]), 1.0)
            step = jnp.stack(_adj_times([lam[0], lam[1], lam[2]], [g[0], g[1]])) / det
        else:
            # Empty compositions (total 0) get Lambda = I.
            step = solve_rows(g, jnp.where(nonempty, lam, jnp.asarray(eye_rows, dtype)[:, None]), d)
        mbar = jnp.where(nonempty, ref + step, 0.0)
        split = halves[0][0].shape[1]
        return mbar[:, :split], mbar[:, split:]

    def half_stats(sums, mbar, lo, hi):
        """Per half composition: ``[sum m_i r_i + ln(t! / prod m_i!), within-half spread, non-empty,
        half mean (d), sum m_i Lambda_i (entries)]`` as a ``(C, F)`` array.

        The spread of a composition, ``Q_m = sum_i m_i (mu_i - mubar)^T Lambda_i (mu_i - mubar)``
        with ``mubar = Lambda_m^-1 eta_m``, is never formed as
        ``sum m_i mu_i^T Lambda_i mu_i - eta^T Lambda^-1 eta``: for narrow, far-apart
        components both terms are in the thousands and float32 lost 0.06 nats to their
        difference. Instead each half keeps its own spread (a sum of non-negative terms
        around its own mean, computed elementwise over ``(k, C)``) and the pair adds the
        between-halves term (below).
        """
        m, s, nonempty, lam = sums[:4]
        if diagonal:
            within = _diag_spread(m, locs[lo:hi], prec[lo:hi], mbar)
        else:
            # One (k, C) deviation per coordinate, from one split of mbar: the reverse mode of
            # d slices of a stacked (d, k, C) array is d pads of the whole array (O(d^2 k C)).
            mbar_rows = jnp.split(mbar, d, axis=0)
            dev = [locs[lo:hi, i][:, None] - mbar_rows[i] for i in range(d)]
            if d > UNROLL_MAX_DIM:
                # One contraction: the elementwise form below compiled 1-2 s slower at d = 8.
                q = jnp.sum(jnp.square(jnp.einsum("kij,jkc->ikc", l_inv[lo:hi], jnp.stack(dev))), axis=0)
            else:
                q = 0.0
                for i in range(d):
                    z = sum(l_inv[lo:hi, i, j][:, None] * dev[j] for j in range(i + 1))
                    q = q + z * z
            within = jnp.sum(m * q, axis=0)
        rows = [s[None], within[None], nonempty[None].astype(dtype), mbar, lam]
        if mixed:
            rows += [sums[4][None], sums[5]]
        stats = jnp.concatenate(rows, axis=0)
        # (C, F): rows are gathered whole (a row gather measured ~20x faster than a
        # column gather of the (F, C) layout).
        return stats.T

    table_a, table_b = _half_tables(sched)
    sums_a, sums_b = half_sums(table_a, 0, K_a), half_sums(table_b, K_a, K)
    mbar_a, mbar_b = half_means((sums_a, sums_b))
    # The joint table: first-half rows, then second-half rows (the schedule's row numbers).
    stats = jnp.concatenate([half_stats(sums_a, mbar_a, 0, K_a), half_stats(sums_b, mbar_b, K_a, K)])
    log_lse = _pair_lse(sched, n_min, d, diagonal, k_max, dtype)
    return log_a, alpha + log_lse(stats, _reference(r, half_log_det_prec, n_min, k_max, d, dtype))


def log_power_integrals(log_weights, locs, scale_tril=None, scale=None, *, n_max, block_size=DEFAULT_BLOCK_SIZE):
    """``ln integral p(x)^n dx`` for ``n = 2..n_max`` (from :func:`log_moments`)."""
    log_a, lm = log_moments(log_weights, locs, scale_tril, scale, k_max=n_max - 1, block_size=block_size)
    return lm + jnp.arange(1, n_max, dtype=lm.dtype) * log_a
