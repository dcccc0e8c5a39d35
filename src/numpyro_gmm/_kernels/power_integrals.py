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
(:func:`numpyro_gmm.compositions.pair_schedule`). The half tables are not embedded in the
program: each is *unranked* on the device from its row index and a table of
``K (n+1)^2`` prefix counts (:func:`numpyro_gmm.compositions.unrank_tables`), so no array
whose size grows with the number of compositions is ever a constant of the computation
(large constants are what made compile time grow: 6.4 s at ``K = 32``, order 10, with a
13-million-row table embedded). The half sums ``sum m_i r_i``, ``sum m_i mu_i^T Lambda_i
mu_i``, ``sum m_i h_i`` and the upper triangle of ``sum m_i Lambda_i`` are one matrix
product per half, stored feature-major (*structure of arrays*, ``(F, C)``), so each pair
costs two column gathers, one add, and a ``d x d`` log-determinant and quadratic form on
rows of the block instead of ``O(K d^2)`` work: closed forms for ``d = 1, 2``, an unrolled
Cholesky up to :data:`~numpyro_gmm._kernels.gaussian.UNROLL_MAX_DIM`, batched LAPACK
beyond. A diagonal covariance needs no factorisation at all (``O(d)`` per pair).

Pairs are visited in blocks of fixed size by a ``lax.scan`` whose body is rematerialised
in reverse mode (``jax.checkpoint``), so peak memory, forward and gradient, depends on the
block size and the half tables, never on the number of compositions. The log-sum-exp is
streamed: the carry holds a running maximum and a rescaled sum per ``n``; exponentiated
terms are ``<= 1`` and the maxima are ``stop_gradient``-ed, which leaves value and
gradient exact.

**Several devices.** When JAX sees more than one device, the block axis is split across
them with ``shard_map``: each device scans its share of blocks, and the per-device
``(max, sum)`` pairs are combined by one more log-sum-exp. The result equals the
single-device one up to the order of floating-point additions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.nn import logsumexp
from jax.scipy.special import gammaln
from jax.sharding import PartitionSpec

from ..compositions import pair_schedule, unrank_tables
from .gaussian import LOG_2PI, UNROLL_MAX_DIM, _triu_index, information_form, logdet_and_quad_rows, solve_rows

Array = jnp.ndarray

DEFAULT_BLOCK_SIZE = 4096

_AXIS = "blocks"


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
    """
    K, d = locs.shape
    diagonal = scale is not None
    n_min, n_max = 2, k_max + 1
    sched = pair_schedule(n_min, n_max, K, block_size)
    K_a = sched.K_a

    locs, scale_tril, scale, log_jac = _whiten(locs, scale_tril, scale)
    prec, h, log_det_cov = information_form(locs, scale_tril, scale)
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

    def half_sums(table, lo, hi):
        """Per half composition (columns): counts, ``sum m_i r_i - sum ln m_i!``, non-empty,
        ``eta = sum m_i h_i`` ``(d, C)`` and ``sum m_i Lambda_i`` ``(P, C)``."""
        m = table.astype(dtype)  # (k, C) counts
        nonempty = jnp.sum(m, axis=0) > 0
        s = r[lo:hi] @ m - jnp.sum(gammaln(m + 1.0), axis=0)
        return m, s, nonempty, h[lo:hi].T @ m, lam_rows[:, lo:hi] @ m

    def half_means(halves):
        """``mubar = Lambda^-1 eta`` of every half composition of both halves, in one solve
        (one batched call: two LAPACK calls running at once were seen to deadlock)."""
        eta = jnp.concatenate([x[3] for x in halves], axis=1)
        lam = jnp.concatenate([x[4] for x in halves], axis=1)
        nonempty = jnp.concatenate([x[2] for x in halves])
        if diagonal:
            mbar = eta / jnp.where(nonempty, lam, 1.0)
        else:
            # Empty compositions (total 0) get Lambda = I, then mbar = 0.
            mbar = solve_rows(eta, jnp.where(nonempty, lam, jnp.asarray(eye_rows, dtype)[:, None]), d)
        mbar = jnp.where(nonempty, mbar, 0.0)
        split = halves[0][0].shape[1]
        return mbar[:, :split], mbar[:, split:]

    def half_stats(sums, mbar, lo, hi):
        """Per half composition: ``[sum m_i r_i - sum ln m_i!, within-half spread, non-empty,
        half mean (d), sum m_i Lambda_i (entries)]`` as a ``(C, F)`` array.

        The spread of a composition, ``Q_m = sum_i m_i (mu_i - mubar)^T Lambda_i (mu_i - mubar)``
        with ``mubar = Lambda_m^-1 eta_m``, is never formed as
        ``sum m_i mu_i^T Lambda_i mu_i - eta^T Lambda^-1 eta``: for narrow, far-apart
        components both terms are in the thousands and float32 lost 0.06 nats to their
        difference. Instead each half keeps its own spread (a sum of non-negative terms
        around its own mean, computed elementwise over ``(k, C)``) and the pair adds the
        between-halves term (below).
        """
        m, s, nonempty, _, lam = sums
        dev = locs[lo:hi].T[:, :, None] - mbar[:, None, :]  # (d, k, C)
        if diagonal:
            q = sum(prec[lo:hi, i][:, None] * jnp.square(dev[i]) for i in range(d))  # (k, C)
        elif d > UNROLL_MAX_DIM:
            # One contraction: the elementwise form below compiled 1-2 s slower at d = 8.
            q = jnp.einsum("dkc,kde,ekc->kc", dev, prec[lo:hi], dev)
        else:
            q = 0.0
            for i in range(d):
                inner = prec[lo:hi, i, i][:, None] * dev[i]
                for j in range(i + 1, d):
                    inner = inner + 2.0 * prec[lo:hi, i, j][:, None] * dev[j]
                q = q + dev[i] * inner
        within = jnp.sum(m * q, axis=0)
        stats = jnp.concatenate([s[None], within[None], nonempty[None].astype(dtype), mbar, lam], axis=0)
        # (C, F): rows are gathered whole (a row gather measured ~20x faster than a
        # column gather of the (F, C) layout).
        return stats.T

    def log_det_and_spread(ga, gb):
        """``ln|Lambda_m|`` and ``Q_m`` of a block of pairs (``ga``, ``gb``: lists of ``F``
        rows of shape ``(B,)``, one per feature).

        ``Q_m = S_a + S_b + delta^T (Lambda_a^-1 + Lambda_b^-1)^-1 delta`` with
        ``delta = mubar_a - mubar_b`` (0 when a half is empty), the Gaussian-product rule.
        With ``v = Lambda_a delta`` the last term is ``delta^T v - v^T Lambda_m^-1 v``; it is
        small whenever the term matters, so its cancellation is harmless. Diagonal and
        ``d = 1``: ``sum_j delta_j^2 la_j lb_j / (la_j + lb_j)``, no cancellation at all.
        """
        both = ga[2] * gb[2]
        delta = [(ga[3 + j] - gb[3 + j]) * both for j in range(d)]
        la, lb = ga[3 + d :], gb[3 + d :]
        lam = [x + y for x, y in zip(la, lb)]
        within = ga[1] + gb[1]
        if diagonal or d == 1:
            between = sum(jnp.square(delta[j]) * (la[j] * lb[j] / lam[j]) for j in range(d))
            return sum(jnp.log(x) for x in lam), within + between
        index = _triu_index(d)
        v = [sum(la[index[i, j]] * delta[j] for j in range(d)) for i in range(d)]
        log_det, quad = logdet_and_quad_rows(v, lam, d, diagonal)
        return log_det, within + jnp.maximum(sum(delta[i] * v[i] for i in range(d)) - quad, 0.0)

    table_a, table_b = _unrank_halves(n_max, K_a, sched.K_b)
    sums_a, sums_b = half_sums(table_a, 0, K_a), half_sums(table_b, K_a, K)
    mbar_a, mbar_b = half_means((sums_a, sums_b))
    stats_a = half_stats(sums_a, mbar_a, 0, K_a)
    stats_b = half_stats(sums_b, mbar_b, K_a, K)
    bs = sched.block_size
    n_feat = stats_a.shape[1]
    cells = tuple(
        _as_data(x)
        for x in (
            sched.cell_n,
            sched.cell_start_a,
            sched.cell_start_b,
            sched.cell_count_b,
            sched.cell_count,
            sched.cell_first_block,
        )
    )
    log_fact_n = gammaln(jnp.arange(n_max + 1, dtype=locs.dtype) + 1.0)

    def scan_blocks(stats_a, stats_b, alpha, blocks):
        cell_n, start_a, start_b, count_b, count, first_block = cells

        @jax.checkpoint
        def block_terms(t):
            # Which cell block t lies in, and the pair indices of its compositions.
            c = jnp.minimum(_count_le(first_block[1:], t), cell_n.shape[0] - 1)  # padding blocks (t >= num_blocks)
            local = (t - first_block[c]) * bs + jnp.arange(bs, dtype=jnp.int32)
            valid = (local < count[c]) & (t < sched.num_blocks)
            local = jnp.where(valid, local, 0)
            ia = start_a[c] + local // count_b[c]
            ib = start_b[c] + local % count_b[c]
            n = cell_n[c]
            # Structure of arrays for the algebra: one list of F rows (bs,) per half, cut by
            # one split (its reverse mode is one concatenate, not one pad per row).
            ga, gb = (
                [jnp.squeeze(x, 0) for x in jnp.split(g.T, n_feat, axis=0)] for g in (stats_a[ia], stats_b[ib])
            )
            log_det, spread = log_det_and_spread(ga, gb)
            terms = log_fact_n[n] + ga[0] + gb[0] + alpha - 0.5 * (log_det + spread)
            return n - n_min, jnp.where(valid, terms, -jnp.inf)

        def step(carry, t):
            run_max, run_sum = carry
            seg, terms = block_terms(t)
            blk_max = lax.stop_gradient(jnp.max(terms))
            old_max = run_max[seg]
            new_max = jnp.maximum(old_max, blk_max)
            safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
            # exp(-inf - finite) = 0 takes care of the first block of each n.
            new_sum = run_sum[seg] * jnp.exp(old_max - safe_max) + jnp.sum(jnp.exp(terms - safe_max))
            return (run_max.at[seg].set(new_max), run_sum.at[seg].set(new_sum)), None

        init = (
            jnp.full((k_max,), -jnp.inf, dtype=locs.dtype),
            jnp.zeros((k_max,), dtype=locs.dtype),
        )
        (run_max, run_sum), _ = lax.scan(step, init, blocks)
        return run_max, run_sum

    devices = _devices()
    if len(devices) == 1 or sched.num_blocks < len(devices):
        run_max, run_sum = scan_blocks(stats_a, stats_b, alpha, jnp.arange(sched.num_blocks, dtype=jnp.int32))
        return log_a, run_max + jnp.log(run_sum)

    # Several devices: each scans a contiguous share of the blocks (the last share is
    # padded with invalid blocks), then the (max, sum) pairs are merged.
    n_dev = len(devices)
    per_dev = -(-sched.num_blocks // n_dev)
    mesh = jax.sharding.Mesh(np.array(devices), (_AXIS,))
    blocks = jnp.arange(n_dev * per_dev, dtype=jnp.int32)
    sharded = jax.shard_map(
        lambda *args: tuple(x[None] for x in scan_blocks(*args)),
        mesh=mesh,
        in_specs=(PartitionSpec(),) * 3 + (PartitionSpec(_AXIS),),
        out_specs=(PartitionSpec(_AXIS), PartitionSpec(_AXIS)),
        check_vma=False,
    )
    dev_max, dev_sum = sharded(stats_a, stats_b, alpha, blocks)  # (n_dev, k_max)
    top = lax.stop_gradient(jnp.max(dev_max, axis=0))
    total = jnp.sum(dev_sum * jnp.exp(dev_max - top), axis=0)
    return log_a, top + jnp.log(total)


def log_power_integrals(log_weights, locs, scale_tril=None, scale=None, *, n_max, block_size=DEFAULT_BLOCK_SIZE):
    """``ln integral p(x)^n dx`` for ``n = 2..n_max`` (from :func:`log_moments`)."""
    log_a, lm = log_moments(log_weights, locs, scale_tril, scale, k_max=n_max - 1, block_size=block_size)
    return lm + jnp.arange(1, n_max, dtype=lm.dtype) * log_a
