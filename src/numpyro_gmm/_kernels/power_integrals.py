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
(:func:`numpyro_gmm.compositions.pair_schedule`): the half sums ``sum m_i r_i``,
``sum m_i Lambda_i``, ``sum m_i h_i`` and ``sum m_i mu_i^T Lambda_i mu_i`` are one matrix
product per half, and each pair costs one gather, one add and one ``d x d`` Cholesky
instead of ``O(K d^2)`` work. Pairs are visited in blocks of fixed size by a
``lax.scan`` whose body is rematerialised in reverse mode (``jax.checkpoint``), so peak
memory, forward and gradient, depends on the block size and the half tables, never on
the number of compositions. The log-sum-exp is streamed: the carry holds a running
maximum and a rescaled sum per ``n``; exponentiated terms are ``<= 1`` and the maxima are
``stop_gradient``-ed, which leaves value and gradient exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.nn import logsumexp
from jax.scipy.special import gammaln

from ..compositions import pair_schedule
from .gaussian import LOG_2PI, information_form, logdet_and_quad

Array = jnp.ndarray

DEFAULT_BLOCK_SIZE = 4096


def _as_data(table) -> Array:
    """A NumPy table as an array XLA treats as opaque data.

    Inside a caller's ``jit`` the table is a constant of the computation; without the
    barrier XLA constant-folds everything computed from it (casts, ``lgamma``), which
    made the compile time grow with the table size (measured: 9.0 s at K=20, order 8;
    0.5 s with the barrier).
    """
    return lax.optimization_barrier(jnp.asarray(table))


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
    K_a = sched.half_a.shape[1]

    locs, scale_tril, scale, log_jac = _whiten(locs, scale_tril, scale)
    prec, h, log_det_cov = information_form(locs, scale_tril, scale)
    half_log_det_prec = -0.5 * log_det_cov
    alpha = logsumexp(log_weights + half_log_det_prec)
    log_a = alpha - 0.5 * d * LOG_2PI - log_jac
    r = log_weights + half_log_det_prec - alpha  # <= 0
    mahal = jnp.einsum("ki,ki->k", h, locs)  # mu_i^T Lambda_i mu_i

    def half_stats(table, lo, hi):
        m = _as_data(table).astype(locs.dtype)  # (C, k) counts
        s = m @ r[lo:hi] - jnp.sum(gammaln(m + 1.0), axis=1)
        lam = jnp.tensordot(m, prec[lo:hi], axes=1)  # (C, d[, d])
        return s, lam, m @ h[lo:hi], m @ mahal[lo:hi]

    s_a, lam_a, eta_a, c_a = half_stats(sched.half_a, 0, K_a)
    s_b, lam_b, eta_b, c_b = half_stats(sched.half_b, K_a, K)
    bs = sched.block_size
    cell_n = _as_data(sched.cell_n)
    cell_start_a = _as_data(sched.cell_start_a)
    cell_start_b = _as_data(sched.cell_start_b)
    cell_count_b = _as_data(sched.cell_count_b)
    cell_count = _as_data(sched.cell_count)
    first_block = _as_data(sched.cell_first_block)

    @jax.checkpoint
    def block_terms(t):
        # Which cell block t lies in, and the pair indices of its compositions.
        c = jnp.searchsorted(first_block[1:], t, side="right")
        local = (t - first_block[c]) * bs + jnp.arange(bs, dtype=jnp.int32)
        valid = local < cell_count[c]
        local = jnp.where(valid, local, 0)
        ia = cell_start_a[c] + local // cell_count_b[c]
        ib = cell_start_b[c] + local % cell_count_b[c]
        n = cell_n[c]
        log_det, quad = logdet_and_quad(lam_a[ia] + lam_b[ib], eta_a[ia] + eta_b[ib], diagonal)
        spread = c_a[ia] + c_b[ib] - quad  # Q_m >= 0
        terms = gammaln(n.astype(locs.dtype) + 1.0) + s_a[ia] + s_b[ib] + alpha - 0.5 * (log_det + spread)
        return n - n_min, jnp.where(valid, terms, -jnp.inf)

    def step(carry, t):
        run_max, run_sum = carry
        seg, terms = block_terms(t)
        blk_max = lax.stop_gradient(jnp.max(terms))
        blk_sum = jnp.sum(jnp.exp(terms - blk_max))
        old_max = run_max[seg]
        new_max = jnp.maximum(old_max, blk_max)
        # exp(-inf - finite) = 0 takes care of the first block of each n.
        new_sum = run_sum[seg] * jnp.exp(old_max - new_max) + blk_sum * jnp.exp(blk_max - new_max)
        return (run_max.at[seg].set(new_max), run_sum.at[seg].set(new_sum)), None

    init = (
        jnp.full((k_max,), -jnp.inf, dtype=locs.dtype),
        jnp.zeros((k_max,), dtype=locs.dtype),
    )
    (run_max, run_sum), _ = lax.scan(step, init, jnp.arange(sched.num_blocks, dtype=jnp.int32))
    return log_a, run_max + jnp.log(run_sum)


def log_power_integrals(log_weights, locs, scale_tril=None, scale=None, *, n_max, block_size=DEFAULT_BLOCK_SIZE):
    """``ln integral p(x)^n dx`` for ``n = 2..n_max`` (from :func:`log_moments`)."""
    log_a, lm = log_moments(log_weights, locs, scale_tril, scale, k_max=n_max - 1, block_size=block_size)
    return lm + jnp.arange(1, n_max, dtype=lm.dtype) * log_a
