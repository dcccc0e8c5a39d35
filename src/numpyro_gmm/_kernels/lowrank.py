r"""Low-rank-plus-diagonal Gaussian components: the mixing rule without ``d x d`` matrices.

Component ``j`` has covariance ``Sigma_j = W_j W_j^T + diag(D_j)`` with ``W_j (d, r)`` and
``D_j > 0 (d,)`` (the parameterisation of NumPyro's ``LowRankMultivariateNormal``).

**Linear algebra** (never a ``d x d`` matrix). With the capacitance
``C_j = I_r + W_j^T D_j^{-1} W_j`` (``r x r``) and its lower Cholesky factor ``L_j``
(:func:`numpyro_gmm._kernels.gaussian.cholesky`, no LAPACK call):

* matrix determinant lemma: ``ln|Sigma_j| = ln|C_j| + sum_k ln D_jk = 2 sum ln diag L_j + sum ln D_j``;
* Woodbury identity: ``Sigma_j^{-1} = D_j^{-1} - D_j^{-1} W_j C_j^{-1} W_j^T D_j^{-1}``, so
  ``y^T Sigma_j^{-1} y = sum_k y_k^2 / D_jk - |P_j^T y|^2`` with ``P_j = D_j^{-1} W_j L_j^{-T}``
  (``d x r``).

(Woodbury: M. A. Woodbury, *Inverting modified matrices*, Memorandum Report 42, Princeton,
1950; the lemma: D. A. Harville, *Matrix Algebra From a Statistician's Perspective*,
Springer 1997, theorem 18.1.1; both as in ``numpyro.distributions.LowRankMultivariateNormal``.)

**Entropy.** The mixing rule of :mod:`numpyro_gmm._kernels.mixing`,

.. math::

    H[p] = \sum_i w_i \tfrac12 \ln|2\pi e \Sigma_i| + H(w)
         - \sum_i w_i\, E_{X \sim N_i}\big[H\big(r(X)\big)\big],

with the expectation over ``N_i`` written through the exact reparameterisation
``X = mu_i + W_i e + sqrt(D_i) * eps``, ``(e, eps) ~ N(0, I_{r + d})`` (``W e`` and
``sqrt(D) eps`` are independent centred Gaussians with covariances ``W W^T`` and ``diag D``,
so their sum has covariance ``Sigma_i``), and integrated with ``M`` points
``(e_m, eps_m) = Phi^{-1}(frac(u_m + s_i))``, ``u_m`` the first ``M`` scrambled Sobol' points
of dimension ``r + d`` and ``s_i`` a fixed shift per component, or one random shift shared
by all components with a ``key`` (unbiased; :func:`numpyro_gmm._kernels.mixing.component_points`). For the visited
component ``i`` and every ``j``, with ``a_j = mu_i - mu_j`` and ``u_m = W_i e_m + sqrt(D_i) eps_m``,

.. math::

    y^T D_j^{-1} y = \textstyle\sum_k a_{jk}^2/D_{jk} + 2\, u_m \cdot (a_j / D_j) + u_m^2 \cdot (1 / D_j),
    \qquad P_j^T y = P_j^T a_j + P_j^T u_m,

three matrix products ``(M, d) x (d, K)`` and one ``(M, d) x (d, K r)``, so the cost is
``O(K^2 M d r)`` in all (``O(K M d r)`` per visited component) and the memory of one step
is ``O(M d + M K r)`` floats, besides the ``(K, d, r)`` matrices ``P_j`` and the parameters.
As in the full and diagonal paths, all ``K`` components are evaluated at once (a ``vmap``)
while their work, ``K M (d + K r)`` floats, fits in
:data:`numpyro_gmm._kernels.mixing.ALL_AT_ONCE_MAX_ELEMENTS` (0.8-1.0x the time of the
one-at-a-time loop at ``M = 16``, ``K = 4-8``, ``d = 100-1000``,
``benchmarks/mixing_all_at_once.py``); beyond, they are visited one at a time by a
rematerialised ``lax.map``, so the gradient holds one step's work at a time.

**Bracket.** As the full and diagonal rules, the fixed rule (``key=None``) is clipped to a
certified bracket: below at :func:`~numpyro_gmm._kernels.bounds.heaviest_pair_lower` (with
``Delta^T Sigma Delta`` from the factors, :func:`_spread`), above at :func:`certified_upper`
(from the rule's own Woodbury factors). Before, on narrow components of weight ``1e-4``
inside an equicorrelated wide one (float64), the rule was up to ``3.7e-4`` nats above the
moment-matched bound (1-D; quadrature confirms) and ``4.9e-4`` below the pairwise
Bhattacharyya bound (2-D).

**Float32.** The means are centred and everything is expressed in units of the geometric
mean ``c`` of the components' marginal standard deviations ``sqrt(D + rowsum W^2)``
(exact: ``H(cY) = H(Y) + d ln c``). The Woodbury quadratic form is a difference of two
terms that cancel along the directions of ``W_j`` when ``|W_j|^2 >> D_j``, so its
rounding error grows with that ratio: measured float32 - float64 entropy differences of
5e-6, 1.5e-5 and 7e-3 nats at ``|W|^2 / D`` about 1e2, 1e4 and 1e6 on overlapping elongated
components (``benchmarks/lowrank_float32.py``; the full-covariance path stays within 5e-6
there). Use float64 for components more elongated than about 1e4. The log-densities enter
only through a ``log_softmax``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from jax.nn import logsumexp

from .bounds import (
    LOG_2PI,
    deviations_jensen,
    heaviest_pair_lower,
    log_abs_det,
    log_det_identity_plus,
    log_det_identity_plus_bracket,
    pairwise_bound,
    shifted_bracket,
    widened,
)
from .gaussian import cholesky, tril_inverse, tril_solve, zeroed_unless_finite
from .mixing import (
    DEFAULT_NUM_POINTS,
    _entropy_of_responsibilities,
    component_points,
    over_components,
)

Array = jnp.ndarray


def capacitance_tril(cov_factor: Array, cov_diag: Array) -> Array:
    """``(..., r, r)`` lower Cholesky factors of ``C = I_r + W^T D^{-1} W`` (no LAPACK)."""
    r = cov_factor.shape[-1]
    wt_dinv = jnp.swapaxes(cov_factor, -1, -2) / cov_diag[..., None, :]
    cap = wt_dinv @ cov_factor + jnp.eye(r, dtype=cov_factor.dtype)
    return cholesky(cap)


def log_det_cov(cov_factor: Array, cov_diag: Array, cap_tril: Array | None = None) -> Array:
    """``ln|W W^T + diag D|`` by the matrix determinant lemma, shape ``(...)``."""
    if cap_tril is None:
        cap_tril = capacitance_tril(cov_factor, cov_diag)
    diag = jnp.diagonal(cap_tril, axis1=-2, axis2=-1)
    return 2.0 * jnp.sum(jnp.log(diag), -1) + jnp.sum(jnp.log(cov_diag), -1)


def woodbury_factor(cov_factor: Array, cov_diag: Array, cap_tril: Array | None = None) -> Array:
    """``(..., d, r)`` ``P = D^{-1} W L^{-T}``: ``y^T Sigma^{-1} y = sum y^2 / D - |P^T y|^2``."""
    if cap_tril is None:
        cap_tril = capacitance_tril(cov_factor, cov_diag)
    return (cov_factor / cov_diag[..., :, None]) @ jnp.swapaxes(tril_inverse(cap_tril), -1, -2)


def log_prob(value: Array, loc: Array, cov_factor: Array, cov_diag: Array, cap_tril: Array | None = None) -> Array:
    """``ln N(value; loc, W W^T + diag D)`` by Woodbury and the determinant lemma; broadcasts
    over leading axes; ``O(d r)`` per value, no ``d x d`` matrix."""
    if cap_tril is None:
        cap_tril = capacitance_tril(cov_factor, cov_diag)
    y = value - loc
    p = woodbury_factor(cov_factor, cov_diag, cap_tril)
    v = jnp.einsum("...dr,...d->...r", p, y)
    quad = jnp.sum(jnp.square(y) / cov_diag, -1) - jnp.sum(jnp.square(v), -1)
    d = loc.shape[-1]
    return -0.5 * (d * LOG_2PI + log_det_cov(cov_factor, cov_diag, cap_tril) + quad)


def dense_scale_tril(cov_factor: Array, cov_diag: Array) -> Array:
    """``(..., d, d)`` lower Cholesky factor of ``W W^T + diag D``, as
    ``sqrt(D) chol(I + D^{-1/2} W W^T D^{-1/2})`` (eigenvalues of the inner matrix are
    ``>= 1``, so its factorisation is well conditioned); forms ``d x d`` matrices."""
    s = jnp.sqrt(cov_diag)
    wt = cov_factor / s[..., :, None]
    d = cov_factor.shape[-2]
    inner = wt @ jnp.swapaxes(wt, -1, -2) + jnp.eye(d, dtype=cov_factor.dtype)
    return s[..., :, None] * cholesky(inner)


def dense_factor_correction(log_weights: Array, cov_factor: Array, cov_diag: Array, tril: Array):
    r"""``(delta, rounding)`` for an estimate ``sum_k w_k (h_k - ln w_k) - C`` computed on the
    dense factors ``tril (K, d, d)`` of ``W W^T + diag D`` (:func:`dense_scale_tril`), as
    :func:`numpyro_gmm._kernels.monte_carlo.monte_carlo_entropy` computes it.

    ``delta = sum_k w_k (ln|Sigma_k| / 2 - sum ln diag tril_k)`` replaces the closed-form part's
    log-determinants by the determinant lemma's (:func:`log_det_cov`, from the ``r x r``
    capacitance). The dense factor ``sqrt(D) chol(A)``, ``A = I + V V^T``, ``V = D^-1/2 W``, is
    the exact factor of a matrix within about ``eps |A|`` of ``A`` (Cholesky's backward error;
    N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002,
    theorem 10.3), and ``A >= I``, so in the component's whitened coordinates its covariance is
    off by about ``eps cond(A)``; before, the log-determinant took all of that: on one component
    (float64, ``d = 3-30``, ``r = 1-2``) the closed form was off by 3e-12 nats at elongation
    ``max_i |W[i]|^2 / D[i] = 1e4``, 1e-9 at 1e6, 1e-5 at 1e10 and 2.7e-4 at 1e12 against a
    reported standard error of 1e-15 (float32: 8 of 10 components at 1e3 outside 3 se, up to
    22 se). What is left is the responsibilities' part ``C``, a smooth function of the
    covariances: ``rounding = eps sum_k w_k (1 + |G_k|_inf)`` for ``K >= 2`` (``0`` for one
    component, whose ``C`` is ``0``), ``G_k = V_k^T V_k`` (``1 + |G_k|_inf >= 1 + |V_k|_2^2 =
    cond(A_k)``). Measured as float32 minus float64 on the same draws (two overlapping
    components, ``d = 3-30``, elongation 1e3): at most 1.6e-5 nats, about a thirtieth of it."""
    w = jnp.exp(log_weights)  # 0 at a zero weight (ln w = -inf)
    # the dense log-determinants as the Monte Carlo kernel takes them (bounds.log_abs_det)
    delta = jnp.sum(w * (0.5 * log_det_cov(cov_factor, cov_diag) - log_abs_det(tril, None)))
    if w.shape[-1] == 1:
        return delta, jnp.zeros_like(delta)
    v = cov_factor / jnp.sqrt(cov_diag)[..., None]
    gram = jnp.einsum("kdr,kds->krs", v, v)
    cond = 1.0 + jnp.max(jnp.sum(jnp.abs(gram), -1), -1)
    return delta, jnp.finfo(tril.dtype).eps * jnp.sum(w * cond)


def rescaled(locs: Array, cov_factor: Array, cov_diag: Array):
    """``(locs', W', D', d ln c)`` for the mixture of ``(X - m) / c``: ``m`` the mean of the
    means, ``c`` the geometric mean of the marginal standard deviations (``stop_gradient``)."""
    d = locs.shape[-1]
    marginal_var = cov_diag + jnp.sum(jnp.square(cov_factor), -1)
    log_c = lax.stop_gradient(0.5 * jnp.mean(jnp.log(marginal_var)))
    inv_c = jnp.exp(-log_c)
    locs = (locs - lax.stop_gradient(jnp.mean(locs, axis=0))) * inv_c
    return locs, cov_factor * inv_c, cov_diag * jnp.square(inv_c), d * log_c


def certified_upper(
    log_weights: Array, locs: Array, cov_factor: Array, cov_diag: Array, p: Array, log_det: Array
) -> Array:
    r"""The fixed rule's cap: a certified upper bound on the entropy in ``O(K d r^2)`` from the
    rule's own Woodbury factors ``p`` and ``ln|Sigma_k|`` (``log_det``), no ``d x d`` matrix
    and no factorisation; widened for rounding as
    :func:`numpyro_gmm._kernels.mixing.certified_upper` (``8 eps (1 + |upper|)``); ``+inf``
    where not finite.

    The moment-matched Gaussian's entropy ``1/2 ln|2 pi e Sigma_mix|`` bounds the entropy from
    above, and its determinant is bounded in the coordinates whitened by the heaviest
    component ``h`` by the arithmetic-geometric mean inequality on the eigenvalues of
    ``A = Sigma_h^{-1/2} Sigma_mix Sigma_h^{-1/2}``:

    .. math::

        \ln|\Sigma_{mix}| = \ln|\Sigma_h| + \ln|A|
        \le \ln|\Sigma_h| + d \ln\big(\operatorname{tr}(\Sigma_h^{-1} \Sigma_{mix}) / d\big),

    ``tr(Sigma_h^{-1} Sigma_mix) = sum_k w_k [tr(Sigma_h^{-1} W_k W_k^T) + tr(Sigma_h^{-1} D_k)
    + (mu_k - mu)^T Sigma_h^{-1} (mu_k - mu)]`` by Woodbury (``Sigma_h^{-1} = D_h^{-1} - P_h P_h^T``).
    Exact when ``A`` is a multiple of the identity, and within second order of the moment-matched
    bound where the mixture is nearly its heaviest component: the narrow component of small
    weight inside a wide one that the fixed rule misses (measured before the cap, float64,
    ``r = 1``: up to ``+3.7e-4`` nats above ``entropy_bounds``' upper bound in 1-D, ``+1.7e-4``
    in 2-D, ``+5.3e-5`` in 3-D, ``+1.6e-4`` in 5-D). Where smaller, the same with AM-GM on the
    components' part ``B`` of ``A`` only and Jensen on the deviations' part ``C`` (rank ``n``,
    one less than the positive weights), ``tr(B^-1 C) <= sum_kj w_k w_j dev_j^T Sigma_k^-1
    dev_j`` by the operator convexity of the inverse: exact for two components of one
    covariance, which the first form is not (before, up to ``7.4e-5`` nats above the
    moment-matched bound for such a pair 0.3 sd apart, ``d = 10``, ``r = 2``, float64).
    Where smaller again, AM-GM on ``B`` and the deviations' part through the ``K x K``
    determinant ``ln|I_K + G|``, ``G = sum_k w_k Y_k Sigma_k^-1 Y_k^T`` (rows ``sqrt(w_j)
    dev_j``; :func:`~numpyro_gmm._kernels.bounds.log_det_identity_plus`), exact for
    components of one covariance of any number: before it, the default was up to ``2.8e-4``
    nats above ``entropy_bounds``' upper bound on ``K = 3-8`` heavily overlapping components
    of one covariance in 10-D (float64). Elsewhere it may be loose and the cap inactive.
    Inputs in the rule's rescaled units (:func:`rescaled`).
    """
    d = locs.shape[-1]
    w = jnp.exp(log_weights)
    h = jnp.argmax(log_weights)
    dev = locs - w @ locs  # (K, d)
    # Deviations whose squares overflow (means 1e19 or more sds apart in float32) make the
    # bound +inf (still a bound)
    dev, overflow = zeroed_unless_finite(dev, jnp.sum(jnp.square(dev) @ (1.0 / cov_diag).T))
    inv_d, p_h = 1.0 / cov_diag[h], p[h]  # Sigma_h^{-1} = diag(inv_d) - p_h p_h^T

    def trace(u):  # (K, d, n) -> the two (K,) terms of tr(u^T Sigma_h^{-1} u) = plus - minus
        projected = jnp.einsum("dr,kdn->krn", p_h, u)
        return jnp.sum(jnp.square(u) * inv_d[:, None], (-2, -1)), jnp.sum(jnp.square(projected), (-2, -1))

    (f_plus, f_minus), (v_plus, v_minus) = trace(cov_factor), trace(dev[..., None])
    plus = w @ (f_plus + cov_diag @ inv_d + v_plus)  # cov_diag @ ...: tr(Sigma_h^{-1} D_k)
    minus = w @ (f_minus + cov_diag @ jnp.sum(jnp.square(p_h), -1) + v_minus)
    # Woodbury's difference loses about eps (plus + minus) to rounding where the factors are
    # long against D (float32, |W|^2 / D = 1e6: 0.04 of the trace, the cap 0.4 nats too low);
    # measured at most 2 eps (plus + minus) from |W|^2 / D = 1e2 to 1e8, so 16 eps is added
    eps = jnp.finfo(plus.dtype).eps
    total = plus - minus + 16.0 * eps * (plus + minus)
    am_gm = d * jnp.log(total / d)
    # Or, A = B + C with C = Sigma_h^-1/2 (sum_k w_k dev_k dev_k^T) Sigma_h^-1/2 of rank <= n:
    # ln|A| <= d ln(tr B / d) + n ln(1 + tr(B^-1 C) / n) (AM-GM, Jensen), and by the operator
    # convexity of the inverse tr(B^-1 C) <= tau = sum_kj w_k w_j dev_j^T Sigma_k^-1 dev_j
    # (Woodbury with every component's P_k, O(K^2 d r); widened like the trace). Exact for two
    # components of one covariance (before, up to 7.4e-5 nats above the moment-matched bound
    # in 10-D, r = 2, float64).
    b_plus, b_minus = w @ (f_plus + cov_diag @ inv_d), w @ (f_minus + cov_diag @ jnp.sum(jnp.square(p_h), -1))
    b_total = b_plus - b_minus + 16.0 * eps * (b_plus + b_minus)
    q_plus = jnp.square(dev) @ (1.0 / cov_diag).T  # (K_j, K_k): dev_j^T D_k^-1 dev_j
    q_minus = jnp.sum(jnp.square(jnp.einsum("kdr,jd->jkr", p, dev)), -1)  # |P_k^T dev_j|^2
    tau = w @ (q_plus - q_minus + 16.0 * eps * (q_plus + q_minus)) @ w
    jensen = d * jnp.log(b_total / d) + deviations_jensen(w, tau, d)
    # Tighter than Jensen on the same relaxation: ln|I + B^-1/2 C B^-1/2| <= ln|I_K + G| with
    # G = sum_k w_k Y_k Sigma_k^-1 Y_k^T >= E^T B^-1 E (Y the rows sqrt(w_j) dev_j; tr G =
    # tau), a K x K determinant (exact for components of one covariance). Woodbury's
    # difference in G errs by at most 16 eps of the two parts' entries, whose sizes are
    # bounded by their diagonals (both parts positive semi-definite), so 16 eps tr(plus +
    # minus) I is added: the result still dominates the exact G in the Loewner order.
    # O(K^2 d + K^3 r): the D_k^-1 parts sum to one diagonal before the product.
    root_w = jnp.exp(0.5 * log_weights)  # not sqrt(w): a finite derivative at w_k = 0
    y = root_w[:, None] * dev  # (K_j, d)
    g_plus = (y * (w @ (1.0 / cov_diag))) @ y.T  # sum_k w_k Y D_k^-1 Y^T
    z = root_w[:, None, None] * jnp.einsum("kdr,jd->kjr", p, y)  # sqrt(w_k) P_k^T y_j
    g_minus = jnp.einsum("kjr,klr->jl", z, z)
    K = w.shape[0]
    slack = 16.0 * eps * (jnp.trace(g_plus) + jnp.trace(g_minus))
    g = g_plus - g_minus + slack * jnp.eye(K, dtype=g_plus.dtype)
    exact = d * jnp.log(b_total / d) + log_det_identity_plus(g, d + K)
    upper = 0.5 * (d * (LOG_2PI + 1.0) + log_det[h] + jnp.minimum(jnp.minimum(am_gm, jensen), exact))
    upper = jnp.where(jnp.isfinite(upper) & ~overflow, upper, jnp.inf)
    return widened(upper, 8.0)


def _spread(cov_factor: Array, cov_diag: Array):
    """``spread(delta, onehot)`` of :func:`~numpyro_gmm._kernels.bounds.heaviest_pair_lower`:
    ``Delta_i^T (Sigma_i + Sigma_h) Delta_i`` with ``Delta^T Sigma_k Delta = |W_k^T Delta|^2 +
    sum_l D_kl Delta_l^2``, ``O(K d r)``."""

    def spread(delta, onehot):
        w_h, d_h = jnp.einsum("k,kdr->dr", onehot, cov_factor), onehot @ cov_diag
        own = jnp.sum(jnp.square(jnp.einsum("kdr,kd->kr", cov_factor, delta)), -1)
        return own + jnp.sum(jnp.square(delta @ w_h), -1) + jnp.sum(jnp.square(delta) * (cov_diag + d_h), -1)

    return spread


def lowrank_mixing_qmc_entropy(
    log_weights: Array,
    locs: Array,
    cov_factor: Array,
    cov_diag: Array,
    *,
    num_points: int = DEFAULT_NUM_POINTS,
    key: Array | None = None,
) -> Array:
    """The mixing rule (module docstring) for ``log_weights (K,)`` (normalised), ``locs (K, d)``,
    ``cov_factor (K, d, r)``, ``cov_diag (K, d)``; scalar. ``key``: ``None`` for the fixed
    Sobol' points, or a ``jax.random`` key for one random shift of them (unbiased)."""
    K, d = locs.shape
    r = cov_factor.shape[-1]
    dtype = locs.dtype
    # The barrier keeps XLA from evaluating the parameters' part of the rule at compile time
    # when they are constants of the program (e.g. a jitted function that closes over fitted
    # parameters). That constant folding gave NaN gradients in some processes and not in others
    # for one and the same program (jaxlib 0.10.2, CPU, float32: K = 4, d = 100, r = 4, 16
    # shifted points, the gradient vmapped over 64 keys; 3 of 6 fresh processes, and 0 of 8 with
    # the folding pass disabled or with this barrier). Where the parameters are arguments it
    # changes nothing (value and gradient 0.175 / 0.177 ms before / after at d = 100).
    log_weights, locs, cov_factor, cov_diag = lax.optimization_barrier((log_weights, locs, cov_factor, cov_diag))
    raw_locs = locs
    locs, cov_factor, cov_diag, d_log_c = rescaled(locs, cov_factor, cov_diag)
    inv_c = jnp.exp(-d_log_c / d)
    points, shifts = component_points(key, num_points, K, r + d, dtype)  # component i: points(shifts[i])
    finite = jnp.isfinite(log_weights)
    w = jnp.exp(log_weights)

    cap = capacitance_tril(cov_factor, cov_diag)  # (K, r, r)
    p = woodbury_factor(cov_factor, cov_diag, cap)  # (K, d, r)
    p_flat = jnp.transpose(p, (1, 0, 2)).reshape(d, K * r)  # (d, K r)
    inv_d = 1.0 / cov_diag  # (K, d)
    log_det = log_det_cov(cov_factor, cov_diag, cap)  # (K,)
    log_c = log_weights - 0.5 * log_det  # the common -d/2 ln 2pi cancels in r

    def half_quad(args):  # (M, K): (y^T Sigma_j^{-1} y) / 2 at y = mu_i + u_m - mu_j
        raw_i, w_i, d_i, shift_i = args
        z = points(shift_i)  # (M, r + d): (e_m, eps_m)
        e, eps = z[:, :r], z[:, r:]
        u = e @ w_i.T + eps * jnp.sqrt(d_i)  # (M, d): u_m = W_i e_m + sqrt(D_i) eps_m
        # a_j = mu_i - mu_j from the means as given, then rescaled, so that a_i is exactly 0:
        # from the rescaled means, which XLA's CPU compiler computed in two fused kernels with
        # different rounding, a_i was one ulp of the means, and at standard deviations 1e-8 and
        # 1e8 (float64, d = 1) that ulp over the narrow component's scale moved its own points'
        # responsibilities: the compiled rule was off by up to 0.045 nats, the eager one right
        # (benchmarks/scale_ratio_limit.py, tests/test_adversarial.py)
        a = (raw_i - raw_locs) * inv_c  # (K, d)
        # A component so far that a^T D_j^-1 a overflows (1e19 sds in float32) has
        # responsibility 0: its distance is +inf
        a, far = zeroed_unless_finite(a, jnp.sum(jnp.square(a) * inv_d, -1))  # far: (K,)
        diag_part = (
            jnp.sum(jnp.square(a) * inv_d, -1)[None]
            + 2.0 * u @ (a * inv_d).T
            + jnp.square(u) @ inv_d.T
        )  # (M, K)
        v = (u @ p_flat).reshape(num_points, K, r) + jnp.einsum("kdr,kd->kr", p, a)[None]  # (M, K, r)
        return jnp.where(far[None], jnp.inf, 0.5 * jnp.maximum(diag_part - jnp.sum(jnp.square(v), -1), 0.0))

    def mixing_term(args):
        log_joint = log_c[None] - half_quad(args)  # (M, K)
        return jnp.mean(_entropy_of_responsibilities(log_joint, finite[None]))

    mix = over_components(mixing_term, (raw_locs, cov_factor, cov_diag, shifts), K * num_points * (d + K * r), "lowrank")
    h_gauss = 0.5 * (d * (LOG_2PI + 1.0) + log_det)
    h_w = -jnp.sum(w * jnp.where(finite, log_weights, 0.0))
    h = jnp.sum(w * (h_gauss - mix)) + h_w
    if key is None:  # the fixed rule: never outside a certified bracket
        lower = heaviest_pair_lower(log_weights, locs, h_gauss, _spread(cov_factor, cov_diag))
        h = jnp.minimum(jnp.maximum(h, lower), certified_upper(log_weights, locs, cov_factor, cov_diag, p, log_det))
    return h + d_log_c


#: Largest number of floats of one block of rows of :func:`entropy_bounds` (``rows K d (2 r
#: + 4)``; 16 MiB in float32): blocks of rows ``i`` run one after another.
BOUNDS_ROW_ELEMENTS = 1 << 22


def bounds_rows_per_block(K: int, d: int, r: int) -> int:
    """Rows ``i`` per block of :func:`entropy_bounds` (all ``K`` when they fit)."""
    return max(1, min(K, BOUNDS_ROW_ELEMENTS // max(1, K * d * (2 * r + 4))))


def blocked_gram(x: Array, y: Array) -> tuple[Array, int]:
    """``(x^T y, n)`` over the second-to-last axis of ``x (..., d, p)`` and ``y (..., d, q)``,
    and a length ``n`` for which each entry's rounding is at most ``n eps`` times the sum of
    its terms' magnitudes: ``d`` is cut into ``m`` blocks of ``b = ceil(sqrt(d))`` (zeros
    pad the last), each block's products summed by one matrix product (``b eps``), and the
    ``m`` partial sums added as a balanced tree (``ceil(log2 m) eps``), so ``n = b +
    ceil(log2 m)`` instead of ``d`` for one product of length ``d`` (in float32 at ``d =
    10^4``: ``1.3e-5`` relative instead of ``1.2e-3``, which the certified bounds must allow
    for; the bracket of ``benchmarks/lowrank_bounds.py`` at ``K = 4``, ``d = 10^4``, ``r = 8``
    0.91 -> 0.065 nats wide, at ``K = 128``, ``d = 1000`` 0.019 -> 0.006, its time per call
    1.1-4x). Float64 (``d eps`` below ``1e-11`` for any practical ``d``): one product, ``n =
    d``."""
    d = x.shape[-2]
    if x.dtype != jnp.float32:
        return jnp.einsum("...dp,...dq->...pq", x, y), d
    b = max(1, math.isqrt(d - 1) + 1) if d > 1 else 1
    m = -(-d // b)
    pad = [(0, 0)] * (x.ndim - 2) + [(0, m * b - d), (0, 0)]
    xb = jnp.pad(x, pad).reshape(x.shape[:-2] + (m, b, x.shape[-1]))
    yb = jnp.pad(y, pad[: y.ndim - 2] + pad[-2:]).reshape(y.shape[:-2] + (m, b, y.shape[-1]))
    parts = jnp.einsum("...mbp,...mbq->...mpq", xb, yb)  # (..., m, p, q)
    levels = 0
    while parts.shape[-3] > 1:  # pairs of partial sums, level by level
        if parts.shape[-3] % 2:
            parts = jnp.concatenate([parts, jnp.zeros_like(parts[..., :1, :, :])], -3)
        parts = parts[..., 0::2, :, :] + parts[..., 1::2, :, :]
        levels += 1
    return parts[..., 0, :, :], b + levels


def _log_dets(cov_factor: Array, cov_diag: Array):
    """``(sum ln D_k, ln|C_k| from below, ln|C_k| from above)``, ``(K,)`` each
    (``ln|Sigma_k| = sum ln D_k + ln|C_k|``, ``C_k = I + W_k^T D_k^-1 W_k``)."""
    gram, length = blocked_gram(cov_factor / cov_diag[..., None], cov_factor)
    return (jnp.sum(jnp.log(cov_diag), -1), *log_det_identity_plus_bracket(gram, length, by_entries=True))


def pair_terms(locs: Array, cov_factor: Array, cov_diag: Array, p: Array | None = None,
               log_dets: tuple[Array, Array, Array] | None = None) -> tuple[Array, Array, Array]:
    r"""``(K, K)`` pairwise terms of :func:`entropy_bounds`, each rounded in the direction that
    keeps the bounds bounds: the Bhattacharyya distances ``D_B(N_i, N_j)`` from below, ``ln
    N(mu_i; mu_j, Sigma_i + Sigma_j)`` from above, ``KL(N_i || N_j)`` from above; a component
    against itself exactly (``0``, the closed form, ``0``). One block of rows ``i`` at a time
    (:func:`bounds_rows_per_block`). For the pair, with ``S = (Sigma_i + Sigma_j) / 2 =
    diag(E) + B B^T`` (``E = (D_i + D_j) / 2``, ``B = [W_i, W_j] / sqrt 2``), ``G = B^T E^-1
    B`` and ``v = L^-1 B^T E^-1 Delta`` (``I + G = L L^T``): ``ln|S| = sum ln E + ln|I + G|``,
    ``Delta^T S^-1 Delta = sum Delta^2 / E - |v|^2``; ``Sigma_j^-1 = D_j^-1 - P_j P_j^T``
    gives ``tr(Sigma_j^-1 Sigma_i) = sum (D_i + rowsum W_i^2) / D_j - sum D_i rowsum P_j^2 -
    |W_i^T P_j|^2`` and ``Delta^T Sigma_j^-1 Delta``. Each Woodbury difference ``plus -
    minus`` is moved by ``16 eps (plus + minus)``, each ``ln|I + G|`` and ``ln|C_k|`` by its
    rounding bracket. ``p`` (:func:`woodbury_factor`) and ``log_dets`` (:func:`_log_dets`):
    computed here unless given."""
    K, d = locs.shape
    r = cov_factor.shape[-1]
    eps = jnp.finfo(locs.dtype).eps
    log_d, ld_c_lo, ld_c_hi = _log_dets(cov_factor, cov_diag) if log_dets is None else log_dets
    p = woodbury_factor(cov_factor, cov_diag) if p is None else p  # (K, d, r)

    def row(args):  # component i against every j: (K,) Bhattacharyya (lower), ln N (upper), KL (upper)
        mu_i, w_i, d_i, c_lo_i, c_hi_i = args
        delta = mu_i - locs  # (K, d)
        e = 0.5 * (d_i + cov_diag)
        b = jnp.concatenate([jnp.broadcast_to(w_i, cov_factor.shape), cov_factor], -1) * (0.5**0.5)  # (K, d, 2r)
        be = b / e[..., None]
        gram, length = blocked_gram(b, be)
        a_lo, _ = log_det_identity_plus_bracket(gram, length, by_entries=True)
        a_tril = cholesky(jnp.eye(2 * r, dtype=b.dtype) + gram)
        v = tril_solve(a_tril, jnp.einsum("kdr,kd->kr", be, delta))
        plus, minus = jnp.sum(jnp.square(delta) / e, -1), jnp.sum(jnp.square(v), -1)
        quad_lo = jnp.maximum(plus - minus - 16.0 * eps * (plus + minus), 0.0)  # Delta^T S^-1 Delta
        log_e_ratio = jnp.sum(jnp.log(e / jnp.sqrt(d_i * cov_diag)), -1)  # sum ln E - (ln|D_i| + ln|D_j|) / 2 >= 0
        bhatt = 0.125 * quad_lo + 0.5 * (log_e_ratio + a_lo) - 0.25 * (c_hi_i + ld_c_hi)
        # ln N(mu_i; mu_j, Sigma_i + Sigma_j) = ln N(0; Delta, 2 S), from above
        log_s_lo = jnp.sum(jnp.log(e), -1) + a_lo
        log_n = -0.5 * (d * (LOG_2PI + math.log(2.0)) + log_s_lo + 0.5 * quad_lo)
        # KL(N_i || N_j) from above: tr(Sigma_j^-1 Sigma_i) + Delta^T Sigma_j^-1 Delta by Woodbury
        t_plus = (d_i + jnp.sum(jnp.square(w_i), -1)) @ (1.0 / cov_diag).T  # (K,)
        t_minus = jnp.sum(jnp.square(p) * d_i[None, :, None], (-2, -1)) + jnp.sum(
            jnp.square(jnp.einsum("dr,kds->krs", w_i, p)), (-2, -1))
        q_plus = jnp.sum(jnp.square(delta) / cov_diag, -1)
        q_minus = jnp.sum(jnp.square(jnp.einsum("kdr,kd->kr", p, delta)), -1)
        slack = 16.0 * eps * (t_plus + t_minus + q_plus + q_minus)
        kl = 0.5 * (t_plus - t_minus + q_plus - q_minus + slack - d
                    + (log_d + ld_c_hi) - (jnp.sum(jnp.log(d_i)) + c_lo_i))
        return bhatt, log_n, jnp.maximum(kl, 0.0)

    bhatt, log_n, kl = lax.map(jax.checkpoint(row), (locs, cov_factor, cov_diag, ld_c_lo, ld_c_hi),
                               batch_size=bounds_rows_per_block(K, d, r))
    # a component against itself: D_B = KL = 0 and N(mu_i; mu_i, 2 Sigma_i) in closed form
    same = jnp.eye(K, dtype=bool)
    bhatt, kl = jnp.where(same, 0.0, bhatt), jnp.where(same, 0.0, kl)
    log_n = jnp.where(same, (-0.5 * (d * (LOG_2PI + math.log(2.0)) + log_d + ld_c_lo))[:, None], log_n)

    return bhatt, log_n, kl


def entropy_bounds(log_weights: Array, locs: Array, cov_factor: Array, cov_diag: Array) -> tuple[Array, Array]:
    r"""Certified ``(lower, upper)`` bounds on the entropy of a mixture of low-rank-plus-diagonal
    components without a ``d x d`` matrix: ``O(K^2 d r^2)`` operations, memory of one block
    of rows (:data:`BOUNDS_ROW_ELEMENTS`) at a time, for any ``K`` and ``d``.

    ``lower = max(huber_lower, pairwise_bhattacharyya_lower, heaviest_pair_lower)`` and
    ``upper = min(huber_upper, pairwise_kl_upper, certified_upper)``: the bounds of
    :func:`numpyro_gmm.entropy_bounds` (Huber, Kolchinsky & Tracey; see
    :mod:`numpyro_gmm._kernels.bounds`), with the pairs' determinants and quadratic forms by
    the determinant lemma and Woodbury's identity, and the moment-matched bound relaxed as
    the fixed rule's cap (:func:`certified_upper`). For a pair ``(i, j)``

    .. math::

        S = \tfrac12 (\Sigma_i + \Sigma_j) = \operatorname{diag}(E) + B B^T, \quad
        E = \tfrac12 (D_i + D_j), \quad B = \tfrac{1}{\sqrt2} [W_i, W_j] \; (d \times 2r),

    ``ln|S| = sum ln E + ln|I + G|``, ``Delta^T S^-1 Delta = sum Delta^2 / E - v^T (I + G)^-1
    v`` with ``G = B^T E^-1 B`` and ``v = B^T E^-1 Delta``; and ``Sigma_j^-1 = D_j^-1 - P_j
    P_j^T`` (:func:`woodbury_factor`) gives ``tr(Sigma_j^-1 Sigma_i)`` and ``Delta^T
    Sigma_j^-1 Delta`` of the Kullback-Leibler divergence. Rounding is bounded in the
    direction that keeps each a bound: every Woodbury difference ``plus - minus`` moves by
    ``16 eps (plus + minus)`` (the margin of :func:`certified_upper`), the ``ln|I + G|`` by
    their rounding bracket (:func:`~numpyro_gmm._kernels.bounds.log_det_identity_plus_bracket`),
    and the results are widened by ``16 eps (1 + |upper| + |d ln c|)`` as :func:`numpyro_gmm.entropy_bounds`
    widens them; a term that is not finite is dropped. Inputs: ``log_weights`` normalised;
    the result in the inputs' units (the work is done in rescaled ones, :func:`rescaled`).
    """
    lowers, uppers, d_log_c = bound_terms(log_weights, locs, cov_factor, cov_diag)
    lower = jnp.max(jnp.stack([jnp.where(jnp.isfinite(x), x, -jnp.inf) for x in lowers.values()]))
    upper = jnp.min(jnp.stack([jnp.where(jnp.isfinite(x), x, jnp.inf) for x in uppers.values()]))
    return shifted_bracket(lower, upper, d_log_c)


#: Largest side ``K (r + 1)`` of the determinant lemma's Gram matrix for which
#: :func:`moment_matched_log_det` factorises it (``O(K^3 r^3)``; 2048: 4 M floats); beyond,
#: :func:`named_bound` answers ``"moment_matched_upper"`` with :func:`certified_upper`, its
#: relaxation.
MOMENT_MATCHED_MAX_SIDE = 2048


def moment_matched_log_det(log_weights: Array, locs: Array, cov_factor: Array, cov_diag: Array) -> Array:
    r"""An upper bound on ``ln|Sigma_mix|`` of the moment-matched Gaussian, within its rounding of
    the exact value, without a ``d x d`` matrix: ``Sigma_mix = sum_k w_k (W_k W_k^T + diag D_k +
    dev_k dev_k^T) = diag(a) + B B^T`` with ``a = sum_k w_k D_k`` and the ``K (r + 1)`` columns
    ``B = [sqrt(w_k) W_k, sqrt(w_k) dev_k]``, so by the determinant lemma ``ln|Sigma_mix| = sum ln
    a + ln|I + V^T V|``, ``V = diag(a)^-1/2 B``, with the rounding bracket of
    :func:`~numpyro_gmm._kernels.bounds.log_det_identity_plus_bracket` (by entries; the Gram
    matrix by :func:`blocked_gram`) and ``(K + 2) eps`` per ``ln a_l`` (a sum of ``K`` positive
    terms); or Hadamard's ``sum_l ln (Sigma_mix)_ll`` with its rounding where that is smaller or
    the former not finite. ``O(d K^2 r^2 + K^3 r^3)``."""
    K, d = locs.shape
    r = cov_factor.shape[-1]
    eps = jnp.finfo(locs.dtype).eps
    w = jnp.exp(log_weights)
    dev = locs - w @ locs
    a = w @ cov_diag  # (d,)
    root_w = jnp.exp(0.5 * log_weights)  # not sqrt(w): a finite derivative at w_k = 0
    cols = jnp.concatenate([cov_factor, dev[..., None]], -1) * root_w[:, None, None]  # (K, d, r + 1)
    v = jnp.transpose(cols, (1, 0, 2)).reshape(d, K * (r + 1)) / jnp.sqrt(a)[:, None]
    gram, length = blocked_gram(v, v)
    _, upper = log_det_identity_plus_bracket(gram, length, by_entries=True)
    lemma = jnp.sum(jnp.log(a)) + d * (K + 2) * eps + upper
    diag = a + jnp.sum(jnp.square(cols), (0, 2))  # (Sigma_mix)_ll, a sum of K (r + 2) positive terms
    hadamard = jnp.sum(jnp.log(diag)) + d * (K * (r + 2) + 4) * eps
    return jnp.minimum(jnp.where(jnp.isfinite(lemma), lemma, jnp.inf), hadamard)


def bound_terms(log_weights: Array, locs: Array, cov_factor: Array, cov_diag: Array, *, exact_moment_matched: bool = False):
    """``(lowers, uppers, d ln c)``: the bounds of :func:`entropy_bounds` by name, in rescaled
    units (:func:`rescaled`; add ``d ln c`` for the inputs' units), not yet widened;
    ``exact_moment_matched`` adds ``"moment_matched_upper"`` (:func:`moment_matched_log_det`)."""
    d = locs.shape[-1]
    locs, cov_factor, cov_diag, d_log_c = rescaled(locs, cov_factor, cov_diag)
    w = jnp.exp(log_weights)
    safe_log_w = jnp.where(w > 0, log_weights, 0.0)
    cap = capacitance_tril(cov_factor, cov_diag)
    p, log_det = woodbury_factor(cov_factor, cov_diag, cap), log_det_cov(cov_factor, cov_diag, cap)
    log_dets = log_d, ld_c_lo, ld_c_hi = _log_dets(cov_factor, cov_diag)
    const = 0.5 * d * (LOG_2PI + 1.0)
    h_lo, h_hi = const + 0.5 * (log_d + ld_c_lo), const + 0.5 * (log_d + ld_c_hi)
    bhatt, log_n, kl = pair_terms(locs, cov_factor, cov_diag, p, log_dets)
    lowers = {
        "huber_lower": -jnp.sum(w * logsumexp(log_weights[None, :] + log_n, axis=1)),
        "pairwise_bhattacharyya_lower": pairwise_bound(log_weights, h_lo, bhatt),
        "heaviest_pair_lower": heaviest_pair_lower(log_weights, locs, h_lo, _spread(cov_factor, cov_diag)),
    }
    uppers = {
        "huber_upper": jnp.sum(w * (h_hi - safe_log_w)),
        "pairwise_kl_upper": pairwise_bound(log_weights, h_hi, kl),
        "certified_upper": certified_upper(log_weights, locs, cov_factor, cov_diag, p, log_det),
    }
    if exact_moment_matched:
        K, r = cov_factor.shape[0], cov_factor.shape[-1]
        if K * (r + 1) <= MOMENT_MATCHED_MAX_SIDE:
            mm = 0.5 * (d * (LOG_2PI + 1.0) + moment_matched_log_det(log_weights, locs, cov_factor, cov_diag))
            uppers["moment_matched_upper"] = jnp.minimum(mm, uppers["certified_upper"])
        else:
            uppers["moment_matched_upper"] = uppers["certified_upper"]
    return lowers, uppers, d_log_c


#: The single bounds of low-rank components that :func:`named_bound` computes on the factors,
#: by the names of ``numpyro_gmm.ENTROPY_METHODS``.
NAMED_BOUNDS = ("huber_lower", "huber_upper", "pairwise_bhattacharyya_lower", "pairwise_kl_upper", "moment_matched_upper")


def named_bound(name: str, log_weights: Array, locs: Array, cov_factor: Array, cov_diag: Array) -> Array:
    """One certified bound of :data:`NAMED_BOUNDS` on the factors (no ``d x d`` matrix), in the
    inputs' units, widened outwards for rounding as :func:`entropy_bounds` widens its bracket
    (:func:`~numpyro_gmm._kernels.bounds.shifted_bracket`)."""
    lowers, uppers, d_log_c = bound_terms(log_weights, locs, cov_factor, cov_diag,
                                          exact_moment_matched=name == "moment_matched_upper")
    is_lower = name in lowers
    value = {**lowers, **uppers}[name]
    finite = jnp.isfinite(value)
    safe = jnp.where(finite, value, 0.0)
    lower, upper = shifted_bracket(safe, safe, d_log_c)
    return jnp.where(finite, lower, -jnp.inf) if is_lower else jnp.where(finite, upper, jnp.inf)
