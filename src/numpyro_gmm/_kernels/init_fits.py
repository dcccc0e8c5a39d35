r"""Short independent Gaussian fits from spread starting points, and a greedy choice of
well-separated ones: the initialisation of :class:`~numpyro_gmm.AutoGaussianMixture`.

**Fits.** From ``M`` starting points :math:`m_j^{(0)}` each of ``M`` diagonal Gaussians
:math:`q_j = \mathcal N(m_j, \operatorname{diag}(s_j^2))` maximises its own ELBO

.. math::

    \mathcal L_j = \mathbb E_{\varepsilon \sim \mathcal N(0, I)}
    \big[-U(m_j + s_j \odot \varepsilon)\big] + \sum_i \log s_{ji} + \text{const},

(``U`` the potential, minus the log joint density in unconstrained space), estimated with
``P`` reparameterised draws per step (ADVI: Kucukelbir, Tran, Ranganath, Gelman, Blei,
*Automatic differentiation variational inference*, JMLR 2017), by ``T`` steps of Adam
(Kingma and Ba, ICLR 2015) on :math:`(m_j, \log s_j)` with a learning rate that decays
linearly from ``lr`` to ``lr / 10``. All ``M`` fits run at once (``vmap``) inside one
``lax.scan``; shapes are static. A non-finite gradient is replaced by zero and a
non-finite ELBO estimate counts as ``-inf``. Each fit returns the means of its iterates
:math:`(m_j, \log s_j)` over the last half of the steps (Polyak-Ruppert averaging, which
removes most of the optimiser's noise) and, as its score, the mean of its ELBO estimates
over those steps (without the constant :math:`\tfrac d2 (1 + \log 2\pi)`). Cost: ``M * P * T`` evaluations of
``U`` and its gradient.

**Choice.** Among the fits whose score is within ``tolerance`` nats of the best, the first
chosen is the best; each next one is the least crowded by those already chosen, with a
small preference for better scores ``S``,

.. math::

    \arg\min_j \Big[\ln \sum_{c \text{ chosen}} e^{-B(j, c)}
    + \tfrac14 (S_{\max} - S_j)\Big], \qquad
    B(j, l) = \sum_i \frac{(m_{ji} - m_{li})^2}{4 (s_{ji}^2 + s_{li}^2)}
    + \frac12 \ln \frac{s_{ji}^2 + s_{li}^2}{2 s_{ji} s_{li}}

(``B`` is the Bhattacharyya distance of the two fitted Gaussians and ``exp(-B)`` their
Bhattacharyya coefficient, the overlap :math:`\int \sqrt{q_j q_l}` (Bhattacharyya 1943;
Kailath, *IEEE Trans. Commun. Technol.* 15, 1967), so the sum counts the chosen fits that
overlap ``j``; the score term, at most ``tolerance / 4``, keeps poorly converged fits of a
mode, a few ``B`` from its centre and a few nats below, from looking like the least
crowded). Fits that converged to the same mode are at distance ``O(1)`` or less, fits in
different modes at the modes' separation in units of their widths, or, for a narrow mode
inside a wide one (a spike-and-slab posterior), by the log-ratio of their widths (the
second term: 1.96 for widths 0.01 and 1, where the first is 0.06). While some eligible fit lies in a mode with no choice yet, the sum is
dominated by the nearest choice and the rule is in effect farthest-point selection (Gonzalez,
*Clustering to minimize the maximum intercluster distance*, TCS 1985, under a
Mahalanobis-type metric), so ``K`` choices land on ``K`` different modes whenever the fits
found at least ``K`` modes with scores within ``tolerance`` of the best. With more choices
than modes, each spare one goes to the mode with the fewest choices so far (the
farthest-point rule sent them to the mode whose fits were the most spread: 3 of 4
components in one of two modes in 4 of 10 seeds of ``benchmarks/posteriors.py``'s ``d50``
model, whose fitted masses then stayed near 0.67 / 0.33; without the score term, 3 of 4
in 1 of 10 seeds of a ``d = 200`` model, whose fits are not Newton-refined, see
docs/posteriors.md). Each choice is finally replaced
by the best-scoring eligible fit of its cluster (the eligible fits nearer to it than to the
other choices; a farthest point is an extreme of its mode). A mode whose fits score
``tolerance`` nats below the best has, in the Gaussian approximation, a mass about
``exp(-tolerance)`` times the best's.

**Newton refinement** (:func:`newton_refine`, between the fits and the choice). Adam moves
a mean by about the learning rate per step, so ``T`` steps travel ``O(T * lr)`` in
unconstrained units: a posterior mode 100 units from every starting point (a location
under a wide prior such as ``N(0, 1000)``, data on their natural scale) is not reached, and
the fits' scores, dominated by that distance, stop saying which fits found which mode.
Each fit's mean is therefore refined by damped Newton steps on ``U``,

.. math::

    m \leftarrow m - t H^{-1} \nabla U(m), \qquad H = \nabla^2 U(m) \succ 0,

with ``t`` the largest of ``1, 1/2, ..., 1/32`` that does not increase ``U`` (no step where
``H`` is not positive definite or nothing decreases ``U``), so ``U`` never rises and a
Gaussian part of the posterior is solved exactly in one step, whatever its location and
scale (Nocedal and Wright, *Numerical optimization*, 2006, ch. 3). Then each fit's standard
deviations become :math:`1 / \sqrt{H_{ii}}` (the mean-field optimum for a Gaussian target;
kept from the fit where ``H`` is not positive definite) and every fit is scored again by its
ELBO estimate on the same ``n`` quasi-random standard normal points
:math:`\varepsilon_i = \Phi^{-1}(u_i)`, ``u_i`` the first ``n`` scrambled Sobol' points
(:func:`score_points`; common to all fits, and fixed: a deterministic rule, whose points are
constants of the program rather than draws of a random-number generator). The guide refines
its starting points the same way and offers them to the choice beside the fits: Adam's steps
(about ``lr``) carry a fit out of a mode narrower than them (the spike of a spike-and-slab
posterior), which Newton's steps from a start inside it find.

**Newton-CG refinement** (:func:`newton_cg_refine`, for the guide's
``NEWTON_MAX_DIM < d <= NEWTON_CG_MAX_DIM``). Forming each fit's Hessian costs ``d``
Hessian-vector products per step; instead each step solves the Newton system by conjugate
gradients (:func:`conjugate_gradient`, at most :data:`CG_ITERATIONS` products) preconditioned
by the inverse of one Hessian, formed once at the best fit's mean, so that a Gaussian part of
the posterior is solved in one step whatever its correlations and scales (beyond the guide's
``DENSE_PRECONDITIONER_MAX_DIM``, without forming it: by the inverses of its diagonal
blocks, block Jacobi);
the same line search keeps ``U`` from rising. Standard deviations come from Hutchinson's
estimate of the Hessian's diagonal with the Hessian at the best fit as control variate, and
each fit keeps whichever of its given and refined versions scores better (a mode is not the
best Gaussian mean of a skewed posterior).

**Low-rank factors** (:func:`principal_cov_factor`, for ``covariance="lowrank"``). At a
certified mode the component starts as the mean-field Gaussian with standard deviations
``s`` plus ``W W^T``, ``W`` the probabilistic-PCA factor of the Laplace covariance
:math:`H^{-1}` in the units ``s`` (its ``r`` leading directions, each with the variance it
has in excess of the mean field's). Its products :math:`H^{-1} V` are exact with the Newton
refinement's Laplace factors (:func:`laplace_cov_factors`) and conjugate-gradient solves with
the Newton-CG refinement's preconditioner beyond (:func:`curvature_cov_factors`); the leading
eigenpairs come from a randomised Nystrom approximation with LAPACK-free orthonormalisation
and eigensolver (:mod:`numpyro_gmm._kernels.eigen`).

**Weights** (:func:`mixture_logits`). Given the initial components, the weights that
maximise the mixture's ELBO, estimated on points of each component, by exponentiated-gradient
ascent: for components on different modes, weights proportional to the exponentials of the
components' own ELBOs (the modes' masses in the Gaussian approximation).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import prng
from .eigen import nystrom_eigenpairs, orthonormal_columns
from .gaussian import cholesky_of_inverse
from .memory import UNBOUNDED, MemoryBudget, map_batched
from .mixing import normal_quantile, sobol_points

Array = jnp.ndarray


def fit_diagonal_gaussians(potential_fn, init_locs: Array, init_log_scale: Array, key, *, num_steps: int,
                           learning_rate: float, num_particles: int, budget: MemoryBudget = UNBOUNDED):
    """``M`` independent diagonal-Gaussian ADVI fits (see the module docstring).

    :param potential_fn: ``(d,) -> ()``, minus the log joint density.
    :param init_locs: ``(M, d)`` starting means.
    :param init_log_scale: ``(M, d)`` or broadcastable starting log standard deviations.
    :param key: PRNG key.
    :param budget: the working memory of the fits' gradients (:mod:`.memory`; by default all
        ``M`` fits at once).
    :return: ``(locs (M, d), scales (M, d), scores (M,))``.
    """
    M, d = init_locs.shape
    dtype = init_locs.dtype
    init_log_scale = jnp.broadcast_to(jnp.asarray(init_log_scale, dtype), (M, d))

    def neg_elbo(params, eps):  # one fit; eps (P, d)
        loc, log_scale = params
        z = loc + jnp.exp(log_scale) * eps
        energy = jnp.mean(jax.vmap(potential_fn)(z))
        return energy - jnp.sum(log_scale)

    fits_at_once = budget.batch(num_particles, M)

    def value_and_grad(params, eps):
        return map_batched(jax.value_and_grad(neg_elbo), fits_at_once, params, eps)

    b1, b2, tiny = 0.9, 0.999, 1e-8
    half = num_steps // 2

    def step(state, inputs):
        params, m, v, score_sum, avg = state
        t, step_key = inputs
        eps = prng.normal(step_key, (M, num_particles, d), dtype)
        loss, grads = value_and_grad(params, eps)
        grads = tuple(jnp.where(jnp.isfinite(g), g, 0.0) for g in grads)
        loss = jnp.where(jnp.isfinite(loss), loss, jnp.inf)
        m = tuple(b1 * mi + (1 - b1) * g for mi, g in zip(m, grads))
        v = tuple(b2 * vi + (1 - b2) * g * g for vi, g in zip(v, grads))
        tf = (t + 1).astype(dtype)
        lr = learning_rate * (1.0 - 0.9 * t.astype(dtype) / num_steps)
        corr = jnp.sqrt(1 - b2**tf) / (1 - b1**tf)
        params = tuple(p - lr * corr * mi / (jnp.sqrt(vi) + tiny) for p, mi, vi in zip(params, m, v))
        late = t >= half
        score_sum = score_sum + jnp.where(late, -loss, 0.0)
        avg = tuple(a + jnp.where(late, p, 0.0) for a, p in zip(avg, params))
        return (params, m, v, score_sum, avg), None

    params = (init_locs, init_log_scale)
    zeros = (jnp.zeros_like(init_locs), jnp.zeros_like(init_log_scale))
    state = (params, zeros, zeros, jnp.zeros(M, dtype), zeros)
    inputs = (jnp.arange(num_steps), prng.split(key, num_steps))
    (_, _, _, score_sum, avg), _ = lax.scan(step, state, inputs)
    count = max(num_steps - half, 1)
    locs, log_scale = (a / count for a in avg)
    scores = score_sum / count
    scores = jnp.where(jnp.isfinite(scores), scores, -jnp.inf)
    return locs, jnp.exp(log_scale), scores


#: Step lengths tried, largest first, by each Newton iteration of :func:`newton_refine`.
NEWTON_STEP_LENGTHS = tuple(0.5**i for i in range(6))


@lru_cache(maxsize=16)
def score_points(num_points: int, d: int) -> np.ndarray:
    """``(n, d)`` float64 standard normal quasi-random points ``Phi^-1(u_i)`` of the first
    ``n`` (a power of 2) scrambled Sobol' points ``u_i`` (:func:`~numpyro_gmm._kernels.mixing.sobol_points`,
    clipped to ``[2^-24, 1 - 2^-24]``); read-only."""
    eps = normal_quantile(sobol_points(num_points, d))
    eps.setflags(write=False)
    return eps


def newton_refine(potential_fn, locs: Array, scales: Array, *, num_steps: int, num_draws: int,
                  budget: MemoryBudget = UNBOUNDED):
    """Damped Newton refinement of ``M`` fits, their new scales and scores (module docstring).

    :param potential_fn: ``(d,) -> ()``, minus the log joint density.
    :param locs: ``(M, d)`` means; :param scales: ``(M, d)`` standard deviations of the fits.
    :param num_draws: the scores' points (:func:`score_points`; a power of 2).
    :param num_steps: Newton iterations (each ``d`` Hessian-vector products and a ``d x d``
        Cholesky factorisation per fit).
    :param budget: the working memory of the Hessians, line searches and scores
        (:mod:`.memory`: a Hessian-vector product counted as two gradients, a log density
        as one; by default everything at once).
    :return: ``(locs (M, d), scales (M, d), scores (M,), factors (M, d, d))``, the last the
        lower Cholesky factors of the inverses of the symmetrised Hessians at the refined
        means, i.e. of the Laplace covariances (NaN where the Hessian is not positive
        definite; for :func:`laplace_or_diagonal`).
    """
    M, d = locs.shape
    dtype = locs.dtype
    lengths = jnp.asarray(NEWTON_STEP_LENGTHS, dtype)

    columns_at_once = budget.batch(2, d)
    hessian_and_grad = _hessian_and_grad(potential_fn, columns_at_once)

    def curvature(m):
        """``(g, H, S, ok)`` at ``m``: the gradient, the symmetrised Hessian, the lower
        Cholesky factor of its inverse (``S S^T = H^-1``) and whether ``H`` is positive
        definite."""
        h, g = hessian_and_grad(m)
        h = 0.5 * (h + h.T)
        factor = cholesky_of_inverse(h)  # LAPACK-free: NaN where not PD
        return g, h, factor, is_factor(factor)

    def body(_, state):  # one fit: apply the pending step (line search), then plan the next
        m, u, step, _h, _factor, _ok = state
        m, u = _line_search(potential_fn, m, u, step, lengths)
        g, h, factor, ok = curvature(m)
        # H^-1 g = S S^T g; zero where H is not PD (S NaN) or g not finite
        step = jnp.where(ok & jnp.all(jnp.isfinite(g)), -(factor @ (factor.T @ g)), 0.0)
        return m, u, step, jnp.diagonal(h), factor, ok

    def refine(m):
        zeros = jnp.zeros((d, d), dtype)
        # u = +inf: the first pass's line search (its step is zero) evaluates U(m) and keeps
        # it where finite, with no trace of the potential of its own (less to compile)
        state = (m, jnp.array(jnp.inf, dtype), jnp.zeros_like(m), jnp.zeros_like(m), zeros, jnp.array(False))
        # num_steps + 1 passes: the first only plans (its step is zero), so the last leaves
        # the curvature at the final mean
        m, _, _, diag, factor, ok = lax.fori_loop(0, num_steps + 1, body, state)
        return m, diag, factor, ok

    fits_at_once = budget.batch(max(len(NEWTON_STEP_LENGTHS), 2 * columns_at_once), M)
    locs, diag, factors, ok = map_batched(refine, fits_at_once, locs)
    scales = jnp.where(ok[:, None], lax.rsqrt(jnp.where(ok[:, None], diag, 1.0)), scales)
    return locs, scales, _scores(potential_fn, locs, scales, num_draws, budget), factors


#: Conjugate-gradient iterations per step of :func:`newton_cg_refine` (Hessian-vector
#: products; fewer where the residual reaches :data:`CG_TOLERANCE` sooner).
CG_ITERATIONS = 16
#: Relative residual (in the preconditioner's norm) at which the conjugate gradients stop.
CG_TOLERANCE = 0.01
#: Conjugate-gradient iterations at most of :func:`newton_cg_refine`'s last solve, at the
#: refined mean, whose convergence certifies a mode (it stops where it converges).
CERTIFY_ITERATIONS = 64
#: Size of the diagonal blocks of the Hessian that precondition :func:`newton_cg_refine`
#: with ``preconditioner="blocks"``.
PRECONDITIONER_BLOCK = 256
#: Rademacher probes of :func:`newton_cg_refine`'s estimate of the Hessians' diagonals.
DIAGONAL_PROBES = 16


@lru_cache(maxsize=16)
def rademacher_probes(num_probes: int, d: int) -> np.ndarray:
    """``(P, d)`` float64 signs ``+-1``, fixed (a NumPy generator of seed 0: constants of the
    program, as :func:`score_points` are); read-only."""
    signs = np.where(np.random.default_rng(0).random((num_probes, d)) < 0.5, -1.0, 1.0)
    signs.setflags(write=False)
    return signs


def conjugate_gradient(hvp, g: Array, precondition, num_iterations: int, tolerance: float):
    r"""``(x, converged)``: ``x`` approximately solves ``H x = -g`` (``hvp(v) = H v``) by
    preconditioned conjugate gradients from ``x = 0`` (``precondition(r) = P r``, ``P``
    symmetric positive definite, ideally near ``H^-1``; Nocedal and Wright, *Numerical
    optimization*, 2006, alg. 5.3), stopped when the residual ``r`` satisfies
    ``r^T P r <= tolerance^2 g^T P g`` (``converged``) or at a direction ``p`` with
    ``p^T H p <= 0``, keeping the iterate before it (Steihaug's truncation, ibid. alg. 7.1);
    where that happens at the first direction, ``x = -P g``, the preconditioned steepest
    descent. At most ``num_iterations`` products ``H v`` (a ``while_loop``: under ``vmap``
    it runs until every solve has stopped, the stopped ones unchanged)."""
    r = -g
    z = precondition(r)
    rz = r @ z
    target = tolerance**2 * rz
    converged = rz <= 0.0  # g = 0: x = 0 solves it

    def body(state):
        i, x, r, p, rz, done, converged = state
        hp = hvp(p)
        curvature = p @ hp
        go = ~done & (curvature > 0) & jnp.isfinite(curvature)
        alpha = jnp.where(go, rz / jnp.where(go, curvature, 1.0), 0.0)
        x_new = x + alpha * p
        r_new = r - alpha * hp
        z = precondition(r_new)
        rz_new = r_new @ z
        reached = rz_new <= target
        p_new = z + rz_new / jnp.where(rz > 0, rz, 1.0) * p
        x, r, p, rz = (jnp.where(go, new, old) for new, old in ((x_new, x), (r_new, r), (p_new, p), (rz_new, rz)))
        return i + 1, x, r, p, rz, done | ~go | reached, converged | (go & reached)

    def running(state):
        return (state[0] < num_iterations) & ~state[5]

    state = (0, jnp.zeros_like(g), r, z, rz, converged, converged)
    _, x, _, _, _, _, converged = lax.while_loop(running, body, state)
    stalled = ~converged & jnp.all(x == 0)
    return jnp.where(stalled, -precondition(g), x), converged


class HessianPreconditioner(NamedTuple):
    """The preconditioner of :func:`newton_cg_refine` from the Hessian :math:`H_0` at one
    point (:func:`hessian_preconditioner`): ``apply(r) = P r`` (``(d,) -> (d,)``, ``P``
    symmetric positive definite, near :math:`H_0^{-1}`), ``product(v) = H_0 v`` and
    ``diagonal``, the diagonal of :math:`H_0` ``(d,)``."""

    apply: Callable[[Array], Array]
    product: Callable[[Array], Array]
    diagonal: Array


def hessian_preconditioner(potential_fn, point: Array, fallback: Array, kind: str = "dense", *,
                           block_size: int = PRECONDITIONER_BLOCK,
                           budget: MemoryBudget = UNBOUNDED) -> HessianPreconditioner:
    """The :class:`HessianPreconditioner` of kind ``"dense"``, ``"blocks"`` or ``"diagonal"``
    (see :func:`newton_cg_refine`) from the Hessian of ``potential_fn`` at ``point (d,)``,
    ``fallback (d,)`` the standard deviations where it is not positive definite; else
    ``ValueError``. Cost: ``d`` Hessian-vector products (``columns_at_once`` within
    ``budget``), and a ``d x d`` factorisation (dense) or ``d / b`` of ``b x b`` (blocks)."""
    d = point.shape[-1]
    dtype = point.dtype
    columns_at_once = budget.batch(2, d)
    if kind == "dense":
        h0, _ = _hessian_and_grad(potential_fn, columns_at_once)(point)
        h0 = 0.5 * (h0 + h0.T)
        factor = laplace_or_diagonal(cholesky_of_inverse(h0), fallback)
        return HessianPreconditioner(lambda r: factor @ (factor.T @ r), lambda v: h0 @ v, jnp.diagonal(h0))
    if kind in ("blocks", "diagonal"):
        size = 1 if kind == "diagonal" else min(block_size, d)
        _, hvp0 = jax.linearize(jax.grad(potential_fn), point)
        blocks = hessian_blocks(hvp0, d, size, dtype, columns_at_once)
        num_blocks = blocks.shape[0]
        factor = block_factors(blocks, _pad(fallback, num_blocks * size, 1.0))

        def apply(r):
            r = _pad(r, num_blocks * size, 0.0).reshape(num_blocks, size)
            return jnp.einsum("nij,nj->ni", factor, jnp.einsum("nji,nj->ni", factor, r)).reshape(-1)[:d]

        return HessianPreconditioner(apply, hvp0, jnp.diagonal(blocks, axis1=-2, axis2=-1).reshape(-1)[:d])
    raise ValueError(f"preconditioner must be 'dense', 'blocks' or 'diagonal', got {kind!r}")


def newton_cg_refine(potential_fn, locs: Array, scales: Array, reference: Array, *, num_steps: int,
                     num_draws: int, budget: MemoryBudget = UNBOUNDED, cg_iterations: int = CG_ITERATIONS,
                     num_probes: int = DIAGONAL_PROBES, certify_iterations: int = CERTIFY_ITERATIONS,
                     preconditioner: str | HessianPreconditioner = "dense", block_size: int = PRECONDITIONER_BLOCK):
    r"""Newton-CG refinement of ``M`` fits, their scales and scores: :func:`newton_refine`
    where ``d`` Hessian-vector products per fit and step cost too much.

    The preconditioner comes from the Hessian :math:`H_0 = \nabla^2 U(m_0)` at the mean
    ``m_0`` of fit ``reference`` (the best, in the guide; ``d`` Hessian-vector products
    once). ``preconditioner="dense"``: :math:`H_0` is formed, with the lower Cholesky factor
    ``S`` of its inverse (:func:`laplace_or_diagonal`: that fit's ``diag(scales)`` where
    :math:`H_0` is not positive definite), and ``P = S S^T`` (:math:`H_0^{-1}`);
    ``"blocks"`` (for ``d`` in the thousands: memory ``O(d b)``, no ``d x d`` matrix): only
    the ``ceil(d / b)`` diagonal blocks ``B_j`` of :math:`H_0` of ``b = block_size``
    coordinates are kept (:func:`hessian_blocks`), and ``P = blockdiag(B_j^{-1})`` (block
    Jacobi: Saad, *Iterative methods for sparse linear systems*, 2003, sec. 10.2; the Jacobi
    preconditioner in a block that is not positive definite, see :func:`block_factors`);
    ``"diagonal"``: the same with ``b = 1``, ``P = diag(H_0)^{-1}`` (Jacobi; the fit's
    ``scales^2`` where a diagonal entry is not positive). Blocks hold the correlations of
    neighbouring coordinates, which a model's latent vector often orders (a random walk, a
    time series, a banded design): on the posterior of a ``GaussianRandomWalk`` of 5000
    steps observed with noise (correlation length 50 steps; ``benchmarks/high_dim_init.py
    --model random_walk``) Jacobi certified no fit's mode and the guide, its location steps
    then in absolute units, ended 3488 nats below the evidence after 3000 steps of
    ``Adam(0.01)`` (1809 at the start; one seed); blocks of 256 certify them (1689 at the
    start, 1690.2 after, medians of 3 seeds; the best diagonal Gaussian 1683). Each step of each fit solves
    ``H s = -g`` approximately by :func:`conjugate_gradient` (at most ``cg_iterations``
    Hessian-vector products), preconditioned by ``P``, then takes the line search of
    :func:`newton_refine` along ``s`` (truncated Newton: Nocedal and Wright, *Numerical
    optimization*, 2006, sec. 7.1). With the dense preconditioner, where the fit's Hessian
    is :math:`H_0` (a Gaussian part of the posterior, whatever its correlations and scales)
    the conjugate gradients converge in one iteration and the step is Newton's; elsewhere,
    and with blocks, they correct for the difference (iterations growing as the
    square root of the condition number of :math:`P H`: a truncated step still descends).
    At the final mean ``m``:

    * ``at_mode``: the conjugate gradients, given up to ``certify_iterations`` products
      there, converged and the Newton decrement ``g^T H^{-1} g`` (approximately
      ``-g^T s``; the squared Mahalanobis distance from ``m`` to the mode of the local
      quadratic model) is at most 1 (with the 16 products of a step the certificate failed
      at random at the mode of a ``d = 2000`` regression, diagonal preconditioner);
    * the diagonal of ``H``, estimated from ``num_probes`` fixed Rademacher probes ``z``
      (Hutchinson, *Commun. Stat. Simul. Comput.* 18, 1989; Bekas, Kokiopoulou and Saad,
      *Appl. Numer. Math.* 57, 2007) with :math:`H_0` as control variate,
      :math:`\hat h = \operatorname{diag}(H_0) + \frac1P \sum_p z_p \odot (H - H_0) z_p`:
      exact where :math:`H - H_0` is diagonal (a Gaussian part: :math:`H = H_0`; a narrow
      isotropic mode), with error :math:`\sqrt{\sum_{j \ne i} (H - H_0)_{ij}^2 / P}` in
      coordinate ``i`` otherwise (every preconditioner: the block ones keep the products
      :math:`H_0 z_p`, not :math:`H_0`).

    Each fit is then scored (on the points of :func:`score_points`) in three versions, and
    keeps the best: as given (mean and scales), and at the refined mean with its own scales
    and with the mean-field scales ``1 / sqrt(h_i)`` (its own where ``h_i <= 0``). The
    refined mean is a mode of the posterior density, which for a skewed posterior is not
    the best mean for a Gaussian: on a logistic regression with ``d = 200`` (1000 rows,
    covariates on scales ``10^-1 .. 10``) the refined means scored 26 nats below the ADVI
    fits' and the guide ended 7 nats lower after 3000 steps, before the given versions were
    kept; on a centred hierarchical model (150 groups) the refinement went down the funnel.
    ``at_mode`` is false where the given version is kept (on ties the refined one is).

    :param potential_fn: ``(d,) -> ()``, minus the log joint density.
    :param locs: ``(M, d)``; :param scales: ``(M, d)`` the fits' standard deviations.
    :param reference: ``()`` integer, the fit whose mean is the point of :math:`H_0`.
    :param budget: working memory (:mod:`.memory`: a Hessian-vector product counted as two
        gradients).
    :param preconditioner: ``"dense"``, ``"blocks"`` or ``"diagonal"`` (above; else
        ``ValueError``), or a :class:`HessianPreconditioner` made by
        :func:`hessian_preconditioner` (then ``reference`` and ``block_size`` are not used).
    :param block_size: ``b`` of ``"blocks"`` (default :data:`PRECONDITIONER_BLOCK`; at most ``d``).
    :return: ``(locs (M, d), scales (M, d), scores (M,), at_mode (M,))``.

    Cost: ``d`` Hessian-vector products once (``"blocks"``, ``"diagonal"``: ``d +
    num_probes`` and ``d / b`` factorisations of ``b x b``; ``"dense"``: a ``d x d``
    factorisation); per fit at most ``num_steps * cg_iterations + certify_iterations +
    num_probes`` Hessian-vector products and as many products with ``P`` (``O(d^2)`` dense,
    ``O(d b)`` blocks), ``6 num_steps`` log densities (line search) and ``3 num_draws``
    (scores). Memory ``O(d^2)`` dense, ``O(d b)`` blocks (besides the evaluations' working
    sets, batched within ``budget``).
    """
    M, d = locs.shape
    dtype = locs.dtype
    lengths = jnp.asarray(NEWTON_STEP_LENGTHS, dtype)
    # a barrier: the probes are constants, and so are a model's data, whose products XLA
    # would otherwise fold while compiling (seconds for a 4000 x 2000 design matrix)
    probes = lax.optimization_barrier(jnp.asarray(rademacher_probes(num_probes, d), dtype))
    gradient = jax.grad(potential_fn)
    if not isinstance(preconditioner, HessianPreconditioner):
        preconditioner = hessian_preconditioner(potential_fn, locs[reference], scales[reference], preconditioner,
                                                block_size=block_size, budget=budget)
    precondition = preconditioner.apply
    h0_diagonal = preconditioner.diagonal
    h0_probes = map_batched(preconditioner.product, budget.batch(2, num_probes), probes)  # H0 z_p

    def plan(m, iterations):  # the Newton-CG step from m, the certificate, the Hessian at m
        g, hvp = jax.linearize(gradient, m)
        x, converged = conjugate_gradient(hvp, g, precondition, iterations, CG_TOLERANCE)
        finite = jnp.all(jnp.isfinite(g)) & jnp.all(jnp.isfinite(x))
        return jnp.where(finite, x, 0.0), finite & converged & (-(g @ x) <= 1.0), hvp

    def refine(m):
        def body(_, state):  # apply the pending step (line search), then plan the next
            m, u, step = state
            m, u = _line_search(potential_fn, m, u, step, lengths)
            return m, u, plan(m, cg_iterations)[0]

        state = (m, jnp.array(jnp.inf, dtype), jnp.zeros_like(m))
        m, u, step = lax.fori_loop(0, num_steps, body, state)
        m, _ = _line_search(potential_fn, m, u, step, lengths)
        _, at_mode, hvp = plan(m, certify_iterations)
        difference = jax.vmap(hvp)(probes) - h0_probes  # (H - H0) z_p
        return m, h0_diagonal + jnp.mean(probes * difference, axis=0), at_mode

    fits_at_once = budget.batch(max(len(NEWTON_STEP_LENGTHS), 2 * num_probes), M)
    refined, diag, at_mode = map_batched(refine, fits_at_once, locs)
    diagonal_scales = _mean_field_scales(diag, scales)
    # the three versions of each fit scored in one batch (one trace of the potential)
    versions_locs = jnp.stack([refined, refined, locs])  # (3, M, d)
    versions_scales = jnp.stack([scales, diagonal_scales, scales])
    versions = _scores(potential_fn, versions_locs.reshape(3 * M, d), versions_scales.reshape(3 * M, d),
                       num_draws, budget).reshape(3, M)
    best = jnp.argmax(versions, axis=0)  # ties: the earlier version (refined before given)
    pick = lambda v: jnp.take_along_axis(v, best[None, :, None], axis=0)[0]  # noqa: E731
    return pick(versions_locs), pick(versions_scales), jnp.max(versions, axis=0), at_mode & (best < 2)


def hessian_blocks(hvp, d: int, size: int, dtype, columns_at_once: int) -> Array:
    """``(n, size, size)``: the ``n = ceil(d / size)`` diagonal blocks of a symmetric ``d x d``
    matrix ``H`` given by its products ``hvp(v) = H v`` (``(d,) -> (d,)``), the last padded
    with the identity: ``d`` products ``H e_j``, ``columns_at_once`` at a time, of which each
    keeps the ``size`` rows of its own block (memory ``O(d size)``, no ``d x d`` matrix);
    symmetrised."""
    num_blocks = -(-d // size)
    padded = num_blocks * size

    def column(j):  # rows of j's block of column j
        product = _pad(hvp(jnp.zeros(d, dtype).at[j].set(1.0)), padded, 0.0)
        return lax.dynamic_slice(product, ((j // size) * size,), (size,))

    columns = _pad(map_batched(column, columns_at_once, jnp.arange(d)), padded, 0.0)  # (padded, size)
    blocks = jnp.swapaxes(columns.reshape(num_blocks, size, size), -1, -2)
    padding = (jnp.arange(padded) >= d).astype(dtype).reshape(num_blocks, size)
    return 0.5 * (blocks + jnp.swapaxes(blocks, -1, -2)) + padding[..., None] * jnp.eye(size, dtype=dtype)


def block_factors(blocks: Array, fallback: Array) -> Array:
    """``(n, size, size)`` lower Cholesky factors ``S_b`` of the blocks' inverses
    (:func:`~.gaussian.cholesky_of_inverse`), and where a block is not positive definite
    the diagonal :func:`_mean_field_scales` of that block with ``fallback (n size,)`` (so
    ``size = 1`` is the Jacobi preconditioner, ``fallback`` where an entry is not
    positive)."""
    num_blocks, size, _ = blocks.shape
    diagonal = jnp.diagonal(blocks, axis1=-2, axis2=-1)
    scales = _mean_field_scales(diagonal, fallback.reshape(num_blocks, size))
    jacobi = scales[..., None] * jnp.eye(size, dtype=blocks.dtype)
    factors = cholesky_of_inverse(blocks)
    return jnp.where(is_factor(factors)[:, None, None], factors, jacobi)


def _pad(x: Array, size: int, value: float) -> Array:
    """``x`` padded with ``value`` along its leading axis to ``size`` entries."""
    return jnp.pad(x, [(0, size - x.shape[0])] + [(0, 0)] * (x.ndim - 1), constant_values=value)


def _mean_field_scales(diagonal: Array, fallback: Array) -> Array:
    """``1 / sqrt(h)`` for a Hessian's diagonal ``h`` where it is positive and finite,
    ``fallback`` elsewhere."""
    curved = jnp.isfinite(diagonal) & (diagonal > 0)
    return jnp.where(curved, lax.rsqrt(jnp.where(curved, diagonal, 1.0)), fallback)


def _line_search(potential_fn, m: Array, u: Array, step: Array, lengths: Array):
    """``(m, U(m))`` after the step ``m + t * step`` with the largest ``t`` of ``lengths``
    (largest first) whose potential is finite and not above ``u = U(m)``; unchanged where
    none is."""
    trial = m + lengths[:, None] * step
    u_trial = jax.vmap(potential_fn)(trial)
    better = jnp.isfinite(u_trial) & (u_trial <= u)
    first = jnp.argmax(better)
    return jnp.where(better[first], trial[first], m), jnp.where(better[first], u_trial[first], u)


def _scores(potential_fn, locs: Array, scales: Array, num_draws: int, budget: MemoryBudget) -> Array:
    """``(M,)`` ELBO estimates of the fits ``N(locs, diag(scales^2))`` on the common points
    :func:`score_points` (without the constant ``d/2 (1 + ln 2 pi)``; ``-inf`` where not
    finite)."""
    M, d = locs.shape
    points_at_once = budget.batch(1, num_draws)
    scores_at_once = budget.batch(num_draws, M) if points_at_once == num_draws else 1
    eps = jnp.asarray(score_points(num_draws, d), locs.dtype)

    def score(m, s):
        u = map_batched(potential_fn, points_at_once, m + s * eps)
        value = -jnp.mean(u) + jnp.sum(jnp.log(s))
        return jnp.where(jnp.isfinite(value), value, -jnp.inf)

    return map_batched(score, scores_at_once, locs, scales)


def _hessian_and_grad(potential_fn, columns_at_once: int):
    """``m (d,) -> (H (d, d), g (d,))``, the Hessian and gradient of ``potential_fn`` from
    one trace of it (forward over reverse: ``H`` column ``j`` is the derivative of the
    gradient along ``e_j``), ``columns_at_once`` columns at a time (all: ``jax.jacfwd``)."""

    def grad_and_aux(m):
        g = jax.grad(potential_fn)(m)
        return g, g

    def hessian_and_grad(m):
        if columns_at_once >= m.shape[-1]:
            return jax.jacfwd(grad_and_aux, has_aux=True)(m)
        basis = jnp.eye(m.shape[-1], dtype=m.dtype)
        grads, columns = map_batched(lambda e: jax.jvp(jax.grad(potential_fn), (m,), (e,)), columns_at_once, basis)
        return columns.T, grads[0]

    return hessian_and_grad


def bhattacharyya_distance(loc_a: Array, scale_a: Array, loc_b: Array, scale_b: Array) -> Array:
    r"""Bhattacharyya distance of diagonal Gaussians (broadcast over leading axes, summed over
    the last): :math:`\sum_i \frac{(a_i - b_i)^2}{4 (s_i^2 + t_i^2)}
    + \frac12 \ln \frac{s_i^2 + t_i^2}{2 s_i t_i}` (the second term 0 for equal widths,
    ``ln`` of the ratio of the arithmetic to the geometric mean of the variances)."""
    var = scale_a**2 + scale_b**2
    width = 0.5 * jnp.log(0.5 * var / (scale_a * scale_b))
    return jnp.sum(0.25 * (loc_a - loc_b) ** 2 / var + width, axis=-1)


def choose_separated(locs: Array, scales: Array, scores: Array, num_chosen: int, tolerance: float) -> Array:
    """Indices ``(num_chosen,)`` of well-separated fits (see the module docstring).

    :param locs: ``(M, d)``; :param scales: ``(M, d)``; :param scores: ``(M,)``.
    """
    best = jnp.argmax(scores)
    eligible = scores >= scores[best] - tolerance

    def choose_next(i, carry):
        chosen, crowding, taken = carry
        last = chosen[i - 1]
        crowding = jnp.logaddexp(crowding, -bhattacharyya_distance(locs, scales, locs[last], scales[last]))
        least = jnp.where(eligible & ~taken, crowding + 0.25 * (scores[best] - scores), jnp.inf)
        # fewer eligible fits than choices: the best-scoring fit not taken yet
        fallback = jnp.argmax(jnp.where(taken, -jnp.inf, scores))
        nxt = jnp.where(jnp.any(eligible & ~taken), jnp.argmin(least), fallback)
        return chosen.at[i].set(nxt), crowding, taken.at[nxt].set(True)

    # one rolled loop, not num_chosen - 1 copies of its body: the program's size (and its
    # compilation) does not grow with the number of components
    chosen = jnp.zeros((num_chosen,), best.dtype).at[0].set(best)
    crowding = jnp.full(scores.shape, -jnp.inf, locs.dtype)  # ln sum_c exp(-B(j, c))
    taken = jnp.zeros(scores.shape, bool).at[best].set(True)
    chosen, _, _ = lax.fori_loop(1, num_chosen, choose_next, (chosen, crowding, taken))
    # farthest points are the extremes of their modes: replace each by the best-scoring
    # eligible fit of its cluster (the fits nearest to it among the chosen)
    distance = bhattacharyya_distance(locs[:, None], scales[:, None], locs[chosen][None], scales[chosen][None])
    cluster = jnp.argmin(distance, axis=1)  # (M,)
    member = eligible[:, None] & (cluster[:, None] == jnp.arange(num_chosen)[None])  # (M, K)
    best_member = jnp.argmax(jnp.where(member, scores[:, None], -jnp.inf), axis=0)
    return jnp.where(jnp.any(member, axis=0), best_member, chosen)


def laplace_scale_tril(potential_fn, locs: Array, scales: Array, budget: MemoryBudget = UNBOUNDED,
                       usable: Array | None = None) -> Array:
    r"""``(K, d, d)`` lower Cholesky factors of the Laplace covariances at ``locs``.

    For each ``m_k`` (a fit's mean, near a mode of the posterior), the Laplace
    approximation (e.g. Bishop, *Pattern recognition and machine learning*, 2006, sec. 4.4)
    has covariance :math:`\Sigma_k = H_k^{-1}`, :math:`H_k = \nabla^2 U(m_k)` (``U`` the
    potential). It is exact for a Gaussian posterior and, unlike the diagonal fit's
    standard deviations :math:`s_k` (which are the *conditional* ones,
    :math:`1 / \sqrt{H_{k,ii}}` for a Gaussian target), has the correlations and the
    marginal variances. ``H_k`` is formed by forward-over-reverse differentiation
    (``d`` Hessian-vector products, i.e. ``O(d)`` gradient evaluations of ``U``), then
    :math:`L_k = \operatorname{chol}(H_k^{-1})` by
    :func:`~numpyro_gmm._kernels.gaussian.cholesky_of_inverse` (one factorisation of the
    reversed ``H_k`` and one triangular inverse). Where ``H_k`` is not positive definite or
    anything is not finite (``m_k`` not at a mode, a flat or improper direction), the
    fallback is :math:`\operatorname{diag}(s_k)`.

    :param potential_fn: ``(d,) -> ()``.
    :param locs: ``(K, d)``; :param scales: ``(K, d)`` fallback standard deviations.
    :param budget: the Hessians' working memory (as in :func:`newton_refine`).
    :param usable: ``(K,)``, where the Laplace factor may be used (e.g. where a mode was
        certified, :func:`newton_cg_refine`); by default everywhere (see
        :func:`laplace_or_diagonal`).
    """
    K, d = locs.shape
    columns_at_once = budget.batch(2, d)
    at_once = budget.batch(2 * columns_at_once, K)
    hessians, _ = map_batched(_hessian_and_grad(potential_fn, columns_at_once), at_once, locs)
    # the package's LAPACK-free factorisation (a batched LAPACK call can deadlock on 2 cores,
    # see numpyro_gmm._kernels.gaussian); NaN where H is not positive definite
    hessians = 0.5 * (hessians + jnp.swapaxes(hessians, -1, -2))
    return laplace_or_diagonal(cholesky_of_inverse(hessians), scales, usable)


#: Columns of :func:`principal_cov_factor`'s test matrix beyond the rank (oversampling;
#: Halko, Martinsson and Tropp, *SIAM Rev.* 53, 2011, sec. 4.2).
NYSTROM_OVERSAMPLE = 10


@lru_cache(maxsize=16)
def nystrom_test_matrix(d: int, m: int) -> np.ndarray:
    """``(d, m)`` float64 orthonormal columns, fixed (the QR factor of a NumPy standard
    normal matrix of seed 0, computed once by NumPy: a constant of the program); read-only."""
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((d, m)))
    q.setflags(write=False)
    return q


def principal_cov_factor(cov_products, units: Array, rank: int, min_scale: float = 0.0,
                         oversample: int = NYSTROM_OVERSAMPLE, power_steps: int = 2) -> Array:
    r"""``(d, rank)``: the factor ``W`` of the best low-rank correction of a mean-field
    Gaussian towards a covariance ``C`` known by its products, in the coordinates scaled by
    ``units``.

    In those coordinates (``x_i / u_i``) the covariance is
    :math:`C_u = U^{-1} C U^{-1}`, ``U = diag(units)``, and the mean-field Gaussian that the
    guide starts from has covariance ``I`` (``units`` are its standard deviations). With
    :math:`(\lambda_i, v_i)` the ``rank`` largest eigenpairs of :math:`C_u`,

    .. math::

        W = [v_1, \dots, v_r] \operatorname{diag}\big(\sqrt{\max(\lambda_i - 1, 0)}\big),

    so that ``I + W W^T`` has :math:`C_u`'s variance :math:`\lambda_i` along each
    :math:`v_i` and the mean-field one elsewhere: the maximum-likelihood factor of
    probabilistic PCA with noise variance 1 (Tipping and Bishop, *J. R. Stat. Soc. B* 61,
    1999, eq. 7); with ``min_scale`` ``> 0`` each column's length is at least ``min_scale``
    (variance ``max(lambda_i, 1 + min_scale^2)``: a factor of zero is a stationary point
    of the ELBO in ``W``, which only the gradient's noise leaves). The eigenpairs are those
    of the randomised Nystrom approximation
    (:func:`~numpyro_gmm._kernels.eigen.nystrom_eigenpairs`),
    :math:`(C_u Q)(Q^T C_u Q)^{-1}(C_u Q)^T` (Halko, Martinsson and Tropp, *SIAM Rev.* 53,
    2011, secs. 4.5 and 5.4) for ``Q`` the orthonormal columns of
    :math:`C_u^q Q_1` after ``q = power_steps`` power steps (each orthonormalised:
    :func:`~numpyro_gmm._kernels.eigen.orthonormal_columns`), ``Q_1`` the fixed orthonormal
    ``d x m`` :func:`nystrom_test_matrix` (``m = rank + oversample``, at most ``d``):
    ``(q + 1) m`` products with ``C``. Measured (float64, NumPy, KL divergence in closed
    form; the mean-field Gaussian / this factor with ``q`` = 0, 1, 2, 3 / the exact
    eigenpairs): the posterior of the ``d = 2000`` regression of
    ``benchmarks/high_dim_init.py`` (rank 45) 390.7 / 371.5, 360.9, 358.0, 356.8 / 355.2 (the
    best Gaussian of the family, by L-BFGS: 355.0); its ``d = 5000`` random walk (rank 71)
    1683.4 / 1463.3, 1447.3, 1446.0, 1445.7 / 1445.5. ``q = 2`` is the default: a spectrum
    that decays slowly (the regression) gains from it, and it costs a third more products.

    :param cov_products: ``(d, m) -> (d, m)``, ``V -> C V`` in the model's coordinates.
    :param units: ``(d,)`` positive.
    :param rank: ``r`` (columns beyond ``d`` are zero).
    :param min_scale: the columns' least length (above).
    :param oversample: ``m - rank``; :param power_steps: ``q`` (above).
    """
    d = units.shape[-1]
    m = min(rank + oversample, d)
    q1 = lax.optimization_barrier(jnp.asarray(nystrom_test_matrix(d, m), units.dtype))

    def scaled(v):  # C_u V
        return cov_products(v / units[:, None]) / units[:, None]

    q2 = q1
    for _ in range(power_steps):
        q2 = orthonormal_columns(scaled(q2))
    values, vectors = nystrom_eigenpairs(q2, scaled(q2))
    w = vectors[:, :rank] * jnp.sqrt(jnp.maximum(values[:rank] - 1.0, min_scale**2))
    return jnp.pad(w, ((0, 0), (0, rank - w.shape[-1])))


def _usable_factors(factors: Array, usable: Array, fallback: Array) -> Array:
    """``factors (K, d, r)`` where ``usable (K,)`` and finite, ``fallback`` elsewhere, and
    ``fallback``'s columns beyond ``d`` (``r > d``: :func:`principal_cov_factor` leaves them
    zero, a stationary point)."""
    keep = usable & jnp.all(jnp.isfinite(factors), axis=(-2, -1))
    d = factors.shape[-2]
    factors = factors.at[..., d:].set(fallback[..., d:])
    return jnp.where(keep[:, None, None], factors, fallback)


def laplace_cov_factors(laplace: Array, units: Array, rank: int, usable: Array, fallback: Array,
                        min_scale: float = 0.0) -> Array:
    """``(K, d, rank)`` low-rank factors in the model's coordinates, ``units * W``
    (:func:`principal_cov_factor`) of the Laplace covariances ``C = S S^T`` given by their
    lower Cholesky factors ``laplace (K, d, d)`` (:func:`newton_refine`), where ``usable
    (K,)``; ``fallback (K, d, rank)`` elsewhere and where not finite (``min_scale`` as
    there)."""

    def factor(chol, unit):
        return unit[:, None] * principal_cov_factor(lambda v: chol @ (chol.T @ v), unit, rank, min_scale)

    return _usable_factors(jax.vmap(factor)(laplace, units), usable, fallback)


def curvature_cov_factors(potential_fn, locs: Array, units: Array, rank: int, usable: Array, fallback: Array,
                          preconditioner: HessianPreconditioner, *, min_scale: float = 0.0,
                          budget: MemoryBudget = UNBOUNDED, cg_iterations: int = CERTIFY_ITERATIONS,
                          tolerance: float = CG_TOLERANCE) -> Array:
    """``(K, d, rank)`` low-rank factors in the model's coordinates, ``units * W``
    (:func:`principal_cov_factor`) of the Laplace covariances :math:`H_k^{-1}` at ``locs
    (K, d)`` (``H_k`` the Hessian of ``potential_fn``), where ``usable (K,)`` (a certified
    mode, :func:`newton_cg_refine`); ``fallback (K, d, rank)`` elsewhere and where not
    finite (``min_scale`` as there). Each product :math:`H_k^{-1} v` is a
    :func:`conjugate_gradient` solve (at most ``cg_iterations`` Hessian-vector products,
    relative residual ``tolerance``) with ``preconditioner``'s ``P``
    (:func:`hessian_preconditioner`), so no ``d x d`` matrix is formed beyond the
    preconditioner's own (none with ``"blocks"``). Cost per component: ``3 m`` solves (``m =
    rank + NYSTROM_OVERSAMPLE``, at most ``d``; two power steps and the Nystrom products;
    within ``budget``, a Hessian-vector product counted as two gradients), ``O(d m^2)`` for
    the orthonormal columns and ``O(m^3)`` per sweep of the eigensolver."""
    K, d = locs.shape
    m = min(rank + NYSTROM_OVERSAMPLE, d)
    columns_at_once = budget.batch(2, m)
    gradient = jax.grad(potential_fn)

    def factor(loc, unit):
        _, hvp = jax.linearize(gradient, loc)

        def solve(b):  # H x = b
            return conjugate_gradient(hvp, -b, preconditioner.apply, cg_iterations, tolerance)[0]

        def cov_products(v):
            return map_batched(solve, columns_at_once, v.T).T

        return unit[:, None] * principal_cov_factor(cov_products, unit, rank, min_scale)

    factors = map_batched(factor, budget.batch(2 * columns_at_once, K), locs, units)
    return _usable_factors(factors, usable, fallback)


def is_factor(factor: Array) -> Array:
    """Whether ``factor (..., d, d)`` is a Cholesky factor: finite with a positive diagonal."""
    finite = jnp.all(jnp.isfinite(factor), axis=(-2, -1))
    return finite & jnp.all(jnp.diagonal(factor, axis1=-2, axis2=-1) > 0, axis=-1)


def laplace_or_diagonal(factors: Array, scales: Array, usable: Array | None = None) -> Array:
    """``(K, d, d)``: the Laplace covariances' factors ``factors`` (NaN where the Hessian
    was not positive definite), ``diag(scales_k)`` where they are not Cholesky factors (see
    :func:`laplace_scale_tril`) or ``usable (K,)`` is false."""
    diagonal = scales[..., None] * jnp.eye(factors.shape[-1], dtype=factors.dtype)
    keep = is_factor(factors) if usable is None else is_factor(factors) & usable
    return jnp.where(keep[..., None, None], factors, diagonal)


def location_units(scales: Array, at_mode: Array | None) -> Array:
    """``(K, d)`` units of the components' location steps (AutoGaussianMixture's
    ``locs = locs_origin + locs_unit * locs_offset``): the refined standard deviations
    ``scales`` where the refinement certified a mode (``at_mode (K,)``: the Hessian positive
    definite at the mean after :func:`newton_refine`, see :func:`is_factor`; the Newton
    decrement at most 1 after :func:`newton_cg_refine`), 1 elsewhere, and 1 everywhere
    without the refinement (``at_mode`` ``None``). Only a refined fit's mean is at a mode, so
    that only there is a step of a fraction of a standard deviation the right size;
    elsewhere the mean may still have far to go."""
    if at_mode is None:
        return jnp.ones_like(scales)
    return jnp.where(at_mode[:, None], scales, jnp.ones_like(scales))


#: Steps of :func:`mixture_logits` (exponentiated-gradient steps of length 1).
WEIGHT_ITERATIONS = 64


def mixture_logits(log_p: Array, log_q: Array, tolerance: float, free: Array | None = None,
                   num_iterations: int = WEIGHT_ITERATIONS) -> Array:
    r"""``(K,)`` logits (largest 0) of the weights ``w`` that maximise the ELBO of the mixture
    :math:`q_w = \sum_j w_j N_j` of ``K`` fixed Gaussian components, estimated on ``n`` points
    :math:`z_{ki} \sim N_k` of each component (stratified: each component's term on its own
    points),

    .. math::

        \hat F(w) = \sum_k w_k a_k - \sum_k w_k b_k(w), \qquad
        a_k = \frac1n \sum_i \ln p(z_{ki}), \qquad
        b_k(w) = \frac1n \sum_i \ln \sum_j w_j N_j(z_{ki}),

    by exponentiated-gradient (mirror) ascent with steps of length 1,
    :math:`\ln w_k \leftarrow \ln w_k + \partial_k \hat F(w) + \text{const}`, from equal
    weights, where

    .. math::

        \partial_k \hat F = a_k - b_k(w) - \sum_l \frac{w_l}{n} \sum_i
        \frac{N_k(z_{li})}{q_w(z_{li})}

    (the last sum is 1 in expectation). For components that do not overlap
    (:math:`q_w(z_{ki}) = w_k N_k(z_{ki})`) one step gives :math:`w_k \propto e^{\mathcal L_k}`,
    :math:`\mathcal L_k = a_k + H[N_k]` the component's own ELBO (in the Gaussian
    approximation, the log-mass of its mode), the optimum; components that overlap share
    their mode's mass (equal ones equally, by symmetry). The mixture's entropy is
    1-smooth relative to the weights' negative entropy (by Cauchy-Schwarz,
    :math:`\int (\sum_j v_j N_j)^2 / q_w \le \sum_j v_j^2 / w_j`), so steps of length 1 do not
    overshoot (Lu, Freund, Nesterov, *Relatively smooth convex optimization by first-order
    methods*, SIAM J. Optim. 2018). Only the ``free`` components' weights are optimised: the
    others keep the equal start's ``1 / K`` (each step projects onto that set, in the
    Kullback-Leibler divergence: the free weights rescaled to their total), and so do all
    where none is free. The free log-weights are kept within ``tolerance`` nats of the largest
    (each step), so that no component starts too light to be moved by an optimiser's steps;
    a component whose ``a_k`` is not finite gets that floor, and where none is finite the
    weights stay equal.

    :param log_p: ``(K, n)``, ``ln p(z_ki)`` (up to a common constant).
    :param log_q: ``(K, n, K)``, ``ln N_j(z_ki)``.
    :param tolerance: ``> 0``, the log-weights' range.
    :param free: ``(K,)`` bool, the weights optimised (default: all).
    :return: ``(K,)``, finite.
    """
    K = log_p.shape[0]
    free = jnp.ones(K, bool) if free is None else free
    a = jnp.mean(log_p, axis=1)
    a = jnp.where(jnp.isfinite(a), a, -jnp.inf)
    free = free & jnp.any(jnp.isfinite(a) & free)  # none free where no free one's a_k is finite
    equal = jnp.full((K,), -np.log(K), log_p.dtype)
    free_mass = jnp.log(jnp.maximum(jnp.sum(free), 1) / K).astype(log_p.dtype)

    def projected(log_w):
        largest = jnp.max(jnp.where(free, log_w, -jnp.inf))
        log_w = jnp.where(free, jnp.maximum(log_w, largest - tolerance), -jnp.inf)
        return jnp.where(free, log_w - jax.nn.logsumexp(log_w) + free_mass, equal)

    def step(log_w, _):
        log_mix = jax.nn.logsumexp(log_w + log_q, axis=-1)  # (K, n): ln q_w(z_ki)
        b = jnp.mean(log_mix, axis=1)
        c = jnp.einsum("l,lik->k", jnp.exp(log_w), jnp.exp(log_q - log_mix[..., None])) / log_p.shape[1]
        return projected(jnp.where(free, log_w + a - b - c, equal)), None

    log_w, _ = lax.scan(step, equal, None, length=num_iterations)
    return log_w - jnp.max(log_w)
