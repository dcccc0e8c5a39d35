"""AutoGaussianMixture: an autoguide whose posterior over the unconstrained latent vector
is a Gaussian mixture."""

from __future__ import annotations

import hashlib
import math
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax import lax
from jax.scipy.special import ndtr
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.distributions.transforms import AffineTransform, SoftplusTransform, Transform, biject_to
from numpyro.infer.autoguide import AutoContinuous
from numpyro.infer.initialization import init_to_sample, init_to_uniform
from numpyro.primitives import Messenger
from numpyro.util import not_jax_tracer

from ._kernels import prng
from ._kernels.init_fits import (
    HessianPreconditioner,
    choose_separated,
    curvature_cov_factors,
    fit_diagonal_gaussians,
    hessian_preconditioner,
    is_factor,
    laplace_cov_factors,
    laplace_or_diagonal,
    laplace_scale_tril,
    location_units,
    mixture_logits,
    newton_cg_refine,
    newton_refine,
    score_points,
)
from ._kernels.memory import UNBOUNDED, MemoryBudget, map_batched, peak_bytes
from ._validation import check_int
from .distribution import GaussianMixture
from .entropy import DEFAULT_METHOD

__all__ = ["AutoGaussianMixture"]

Array = jnp.ndarray

_COVARIANCES = ("full", "diag", "lowrank")
#: Scale of the initial ``cov_factor`` of ``covariance="lowrank"`` relative to the initial
#: standard deviations (see :class:`AutoGaussianMixture`).
LOWRANK_INIT_FACTOR = 0.1
_INIT_METHODS = ("fits", "spread")
#: Largest ``latent_dim`` whose initial fits are refined by Newton steps (each costs, per
#: fit, ``latent_dim`` Hessian-vector products and a ``latent_dim``-square factorisation).
NEWTON_MAX_DIM = 100
#: Largest ``latent_dim`` whose Newton-CG refinement (beyond :data:`NEWTON_MAX_DIM`) is
#: preconditioned by the Hessian at the best fit (formed once, one ``latent_dim``-square
#: matrix: 64 MB in float32 at 4000; per fit and step up to 16 Hessian-vector products and
#: as many products with a ``latent_dim``-square matrix).
DENSE_PRECONDITIONER_MAX_DIM = 4000
#: Largest ``latent_dim`` whose initial fits are refined by Newton-CG steps; beyond
#: :data:`DENSE_PRECONDITIONER_MAX_DIM` preconditioned by the diagonal blocks of 256 x 256
#: of the Hessian at the best fit (``latent_dim`` Hessian-vector products once, the whole
#: Hessian never formed).
NEWTON_CG_MAX_DIM = 10_000
#: Quasi-random normal points, common to all fits, of the refined fits' ELBO scores (a power of 2).
NEWTON_SCORE_DRAWS = 64
#: Estimated working memory (bytes) of the initialisation's batched evaluations of the log
#: density, its gradients and Hessians: beyond it they run in chunks (see
#: :mod:`numpyro_gmm._kernels.memory`; the estimate overestimates many evaluations at once:
#: XLA's own buffers were 0.8-1.0 GB at this limit on a logistic regression with 10^5 rows,
#: 1.6-6.6 GB all at once; ``benchmarks/init_memory.py``). Models whose log density is cheap
#: are not chunked.
INIT_MEMORY_BYTES = 4 << 30
#: Step scale of the location parameters held fixed (``locs_origin``, ``locs_unit``,
#: ``locs_gauge``; see **Locations** in :class:`AutoGaussianMixture`): a power of two, so the
#: map to the unconstrained value is exact.
FROZEN_STEP_SCALE = 2.0**-32
#: Largest estimated memory (bytes) of ``covariance="full"``: ``FULL_MEMORY_FACTOR * K d^2``
#: floats (see :func:`_check_full_covariance_memory`); beyond it the guide raises
#: ``ValueError`` before allocating. Raise it on a machine with more memory.
FULL_COVARIANCE_MAX_BYTES = 1 << 33
#: Copies of the ``K`` dense ``d x d`` factors held at the peak: the parameter (unconstrained,
#: a ``d x d`` matrix, and constrained), its gradient, an Adam-type optimiser's two moments,
#: and at the initialisation the Laplace Hessians and their factorisations. Measured: peak
#: resident memory 5.2 GB at ``K = 4``, ``d = 5000``, float32 (``SVI.run`` of 5 steps in a
#: fresh process: 13.1 copies of ``K d^2``, 0.4 GB, above the resident memory before it; 10.1
#: when the unconstrained parameter was NumPyro's packed vector of ``d (d + 1) / 2`` entries).
#: With the 8 GiB limit, float32: ``d`` up to 6,192 at ``K = 4``, 8,757 at ``K = 2`` (4,378 and
#: 6,192 in float64).
FULL_MEMORY_FACTOR = 14


class _StepScaled:
    """Mixin of the step-scaled constraints and transforms below: one static float ``scale``
    (a pytree with no leaves; equal when of the same class and scale)."""

    def __init__(self, scale: float):
        self.scale = scale

    def tree_flatten(self):
        return (), ((), {"scale": self.scale})

    def eq(self, other, static=False):
        return type(other) is type(self) and self.scale == other.scale

    def __repr__(self):
        return f"{type(self).__name__.lstrip('_')}(scale={self.scale})"


class _ScaledReal(_StepScaled, constraints.Constraint):
    """The real line, optimised through ``x = scale * u`` (``u`` unconstrained): with an
    Adam-type optimiser ``x`` moves ``scale`` times as fast as an unscaled parameter."""

    def __call__(self, x):
        return jnp.isfinite(x)

    def feasible_like(self, prototype):
        return jnp.zeros_like(prototype)


@biject_to.register(_ScaledReal)
def _transform_to_scaled_real(constraint):
    return AffineTransform(0.0, constraint.scale)


class _StepScaledUnitLowerCholesky(_StepScaled, constraints.Constraint):
    """NumPyro's ``scaled_unit_lower_cholesky`` (``L = diag(s) (I + N)``, ``N`` strictly
    lower), optimised through ``N = scale * u``: with an Adam-type optimiser the entries of
    ``N`` move ``scale`` times as fast as an unscaled parameter (the diagonal as usual)."""

    event_dim = 2

    def __call__(self, x):
        return constraints.scaled_unit_lower_cholesky(x)

    def feasible_like(self, prototype):
        return constraints.scaled_unit_lower_cholesky.feasible_like(prototype)


class _StepScaledUnitLowerCholeskyTransform(_StepScaled, Transform):
    """``L = (I + scale * tril(U, -1)) diag-rows softplus(diag(U))``, i.e. row ``i`` of the
    unit lower triangle scaled by ``softplus(U_ii)``: NumPyro's
    ``ScaledUnitLowerCholeskyTransform`` with the strictly lower entries scaled by ``scale``,
    on a real ``(..., d, d)`` matrix ``U`` instead of NumPyro's packed vector of its
    ``d (d + 1) / 2`` entries. The upper triangle of ``U`` is not read; the inverse puts zeros
    there and their gradient is zero, so an Adam-type optimiser leaves them at zero and moves
    every other entry exactly as it would move the packed vector's. Everything is
    elementwise: packing is a scatter and its gradient a gather, which took about a fifth of
    AutoGaussianMixture's SVI step (``K = 2``, ``d = 50``, 10 seeds in one program, CPU
    profile: 0.41 of 2.39 ms per step)."""

    domain = constraints.independent(constraints.real, 2)

    @property
    def codomain(self):
        return _StepScaledUnitLowerCholesky(self.scale)

    def __call__(self, x):
        eye = jnp.eye(x.shape[-1], dtype=x.dtype)
        diag = jax.nn.softplus(jnp.diagonal(x, axis1=-2, axis2=-1))
        return (eye + self.scale * jnp.tril(x, -1)) * diag[..., None]

    def _inverse(self, y):
        eye = jnp.eye(y.shape[-1], dtype=y.dtype)
        diag = jnp.diagonal(y, axis1=-2, axis2=-1)
        return jnp.tril(y / diag[..., None], -1) / self.scale + eye * SoftplusTransform().inv(diag)[..., None]

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        """Of the map from the lower triangle of ``x`` (the entries it reads) to that of ``y``:
        triangular, ``dL_ij / dU_ij = scale * s_i`` (``j < i``), ``dL_ii / dU_ii = sigmoid(U_ii)``."""
        d = x.shape[-1]
        log_s = jnp.log(jnp.diagonal(y, axis1=-2, axis2=-1))
        log_sigmoid = -jax.nn.softplus(-jnp.diagonal(x, axis1=-2, axis2=-1))
        return jnp.sum(log_s * jnp.arange(d) + log_sigmoid, -1) + d * (d - 1) / 2 * math.log(self.scale)


@biject_to.register(_StepScaledUnitLowerCholesky)
def _transform_to_step_scaled_unit_lower_cholesky(constraint):
    return _StepScaledUnitLowerCholeskyTransform(constraint.scale)


#: XLA options of the initialisation's own program when it is compiled on its own (the
#: guide's first call outside any ``jit`` / ``vmap``, as in ``SVI.init`` and ``SVI.run``): the
#: CPU backend's classic elemental emitters instead of its MLIR fusion emitters. The program
#: is compiled once and run once, so its compilation is most of its cost; the option changes
#: code generation only, not the program. Measured (``jax.jit(guide.initial_components)``,
#: CPU, models of ``benchmarks/posteriors.py``; compilation / run): ``d50`` 5.5 -> 3.6 s /
#: 47 -> 43 ms, ``iris`` 4.1 -> 2.8 s / 51 -> 64 ms. (LLVM's optimisation level 0 as well
#: compiled in 2.1 / 1.9 s but ran 5-7x slower: not used, since the run grows with the model.)
INIT_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


def _run_once(fn, args: tuple, programs: dict, closed_over=()):
    """``jax.jit(fn)(*args)``, the jitted ``fn`` kept in ``programs`` (so that a later call
    with arguments of the same shapes reuses the compiled program; ``fn``'s own closure is
    the caller's to key ``programs`` by, see ``AutoGaussianMixture._programs_for``), compiled
    with :data:`INIT_COMPILER_OPTIONS` where that is allowed and known: a call outside any
    trace (JAX refuses compiler options on a nested ``jit``; ``args`` and the values
    ``closed_over`` by ``fn`` all concrete) on the CPU backend; an XLA that does not know the
    options gets the defaults."""
    leaves = jax.tree_util.tree_leaves((args, closed_over))
    top_level = jax.default_backend() == "cpu" and all(not_jax_tracer(a) for a in leaves)
    if top_level and "tuned" not in programs:
        try:
            programs["tuned"] = jax.jit(fn, compiler_options=INIT_COMPILER_OPTIONS)
        except TypeError:  # a jax.jit without compiler_options
            programs["tuned"] = None
    if top_level and programs["tuned"] is not None:
        try:
            return programs["tuned"](*args)
        except jax.errors.JaxRuntimeError as err:  # an XLA that does not know the options
            if "compile option" not in str(err):
                raise
            programs["tuned"] = None
    return programs.setdefault("plain", jax.jit(fn))(*args)


def _argument_token(leaf) -> tuple:
    """What identifies a leaf of the model's arguments for a compiled program that closes over
    it: a NumPy array by its shape, dtype and a digest of its bytes (it may be changed in
    place between calls), a Python scalar or string by its value, anything else (JAX arrays,
    which are immutable) by the object itself (:func:`_same_tokens`)."""
    if isinstance(leaf, np.ndarray):
        digest = hashlib.blake2b(np.ascontiguousarray(leaf).tobytes(), digest_size=16).digest()
        return ("numpy", leaf.shape, leaf.dtype.str, digest)
    if isinstance(leaf, (bool, int, float, complex, str)):
        return ("scalar", type(leaf), leaf)
    return ("object", leaf)


def _same_tokens(a: list, b: list) -> bool:
    """Whether two lists of :func:`_argument_token` are of the same arguments."""
    if len(a) != len(b):
        return False
    return all(x[0] == y[0] and (x[1] is y[1] if x[0] == "object" else x == y) for x, y in zip(a, b))


def _check_full_covariance_memory(num_components: int, dim: int, dtype) -> None:
    """``ValueError`` when ``covariance="full"`` would need more than
    :data:`FULL_COVARIANCE_MAX_BYTES` (estimated as ``FULL_MEMORY_FACTOR * K d^2`` floats)."""
    entries = num_components * dim * dim
    nbytes = FULL_MEMORY_FACTOR * entries * jnp.dtype(dtype).itemsize
    if nbytes > FULL_COVARIANCE_MAX_BYTES:
        raise ValueError(
            f"covariance='full' with num_components={num_components} at latent_dim={dim} has "
            f"K d^2 = {entries:.3g} dense Cholesky-factor entries: about {nbytes / 2**30:.3g} GiB "
            f"({FULL_MEMORY_FACTOR} copies: the parameter, its gradient, the optimiser's moments, "
            f"the initial Hessians; {jnp.dtype(dtype).name}), beyond FULL_COVARIANCE_MAX_BYTES = "
            f"{FULL_COVARIANCE_MAX_BYTES / 2**30:.3g} GiB (numpyro_gmm.autoguide). Use "
            "covariance='lowrank' (O(K d r) memory and time per step) or 'diag' (O(K d)), or raise "
            "that limit on a machine with the memory."
        )


def _spread_directions(num_components: int, dim: int) -> np.ndarray:
    """``(K, d)`` deterministic offsets: centred (the mixture's mean stays at the initial
    location) and of root-mean-square norm one (all zero for ``K = 1``).

    For ``K <= d + 1`` they are the vertices of a regular simplex (all pairwise distances
    equal, ``sqrt(2K / (K - 1))``) in a randomly rotated subspace; for ``K > d + 1`` they
    are centred Gaussian draws. The randomness comes from a fixed NumPy seed, so the
    initialisation does not depend on the SVI key."""
    K = num_components
    if K == 1:
        return np.zeros((1, dim))
    rng = np.random.default_rng(0)
    if K <= dim + 1:
        centred = np.eye(K) - 1.0 / K  # centred basis vectors: a regular simplex, rank K - 1
        u, sv, _ = np.linalg.svd(centred)
        simplex = u[:, : K - 1] * sv[: K - 1]  # (K, K - 1), same geometry
        rotation, _ = np.linalg.qr(rng.standard_normal((dim, K - 1)))  # (d, K - 1) orthonormal
        raw = simplex @ rotation.T
    else:
        raw = rng.standard_normal((K, dim))
        raw = raw - raw.mean(axis=0)
    rms = np.sqrt(np.mean(np.sum(raw**2, axis=-1)))
    return raw / rms


def _blocks(model) -> bool:
    """Whether ``model`` is, or wraps through NumPyro handlers, a ``handlers.block``."""
    seen = 0
    while isinstance(model, Messenger) and seen < 100:  # a handler's wrapped callable: .fn
        if isinstance(model, handlers.block):
            return True
        model, seen = model.fn, seen + 1
    return False


def _warn_if_likelihood_blocked(model, prototype_trace, prefix: str) -> None:
    """``UserWarning`` when the guide's model is behind ``handlers.block`` and shows no observed
    site (likelihood or factor): the initial fits then see only the prior of the exposed
    sites. That is the ``AutoGuideList`` pattern ``block(model, expose=[...])``, which hides
    the observed sites as well; ``block(model, hide=[the other guides' sites])`` keeps them."""
    if not _blocks(model):
        return
    sites = [site for site in prototype_trace.values() if site["type"] == "sample"]
    if any(site["is_observed"] for site in sites):
        return
    latent = [site["name"] for site in sites]
    warnings.warn(
        f"AutoGaussianMixture (prefix {prefix!r}) sees its model through numpyro.handlers.block, "
        f"which leaves it no observed site (only {latent}): its initialisation "
        "(init_method='fits') then finds the modes of these sites' prior, not of the posterior, "
        "since the likelihood is hidden. In an AutoGuideList, give this guide the model with the "
        "other guides' latent sites hidden, handlers.block(model, hide=[...]), rather than with "
        "its own sites exposed, so that it sees the observed sites.",
        UserWarning,
        stacklevel=4,
    )


class _Fitted(NamedTuple):
    """What :meth:`AutoGaussianMixture._fits_and_curvature` returns."""

    locs: Array  #: (K, d), the chosen fits' means
    scales: Array  #: (K, d), their standard deviations
    chosen: Array  #: (K,), their indices into ``fits``
    fits: tuple  #: (locs (C, d), scales (C, d), scores (C,)) of all candidates (see initial_fits)
    laplace: Array | None  #: (K, d, d) Laplace factors of the Newton refinement (NaN: not PD); None without it
    at_mode: Array | None  #: (K,) whether each is at a certified mode; None without the refinement
    budget: MemoryBudget  #: the memory budget the kernels used
    potential: Callable  #: the model's potential in the latent space
    preconditioner: HessianPreconditioner | None  #: the Newton-CG refinement's, None where it did not run


class AutoGaussianMixture(AutoContinuous):
    r"""Autoguide whose posterior over the unconstrained latent vector is a
    :class:`~numpyro_gmm.GaussianMixture` of ``num_components`` Gaussians.

    Like :class:`numpyro.infer.autoguide.AutoMultivariateNormal` it ravels every latent
    site of the model into one unconstrained vector of size ``latent_dim``, samples it at
    the auxiliary site ``_{prefix}_latent`` and emits a ``Delta`` per model site carrying
    the log-Jacobian of the constraining transform. Train it with
    :class:`~numpyro_gmm.TraceEntropy_ELBO`: under ``Trace_ELBO`` the mixture weights get no
    useful gradient (sampling the component index is not reparameterisable), and
    ``TraceGraph_ELBO`` gives every parameter a score-function gradient (``GaussianMixture``
    is not ``has_rsample``, so NumPyro stops the draws' gradient): unbiased but noisy.
    Measured on ``a ~ N(0, 3)``, ``b ~ HalfNormal(1)``, four ``y ~ N(a^2, b)`` near 4, 300
    steps of ``Adam(0.02)`` from the default start (negative ELBO 4.28; 4000 particles):
    3.93 with ``TraceEntropy_ELBO``, 3.99 with ``Trace_ELBO``, 5.47 with ``TraceGraph_ELBO``,
    55.9 with ``RenyiELBO`` (2 particles), which drifted away from the posterior: NumPyro's
    ``RenyiELBO`` differentiates the importance weights through the draws and has no
    score-function term, so for a guide whose draws are not reparameterised its gradient
    misses the term of the draws' distribution (with one particle what is left,
    :math:`\nabla_\theta \log q_\theta(z)` at a stopped draw, has expectation zero): do not
    use it with this guide.

    **Initialisation.** The ELBO is multimodal in the guide's parameters: components that
    start in the basin of the same posterior mode stay in it (only the entropy term pushes
    them apart, weakly). The default ``init_method="fits"`` therefore starts the components
    at *different* modes, found when the parameters are first created (a call of the guide
    without them, e.g. ``SVI.init``), deterministically given that call's random key, for the
    model's arguments of that call (a guide used again with other data, e.g. ``SVI.run`` on
    a second data set, starts from fits to those data):

    1. ``num_init_fits`` (``M``, default ``max(32, 16 K)``) starting points in unconstrained
       space: the ``init_loc_fn`` point, ``M // 2`` prior draws (``init_to_sample``;
       ``init_to_uniform`` for improper priors) and ``M - 1 - M // 2`` uniform draws in
       ``(-2, 2)`` per coordinate (``init_to_uniform``'s points, drawn directly in
       unconstrained space without running the model), from keys split off the given one;
    2. from each, a short independent ADVI fit of a *diagonal Gaussian* to the posterior
       (``init_fit_steps`` steps of Adam, learning rate ``init_fit_lr`` decaying linearly
       to a tenth, 2 draws per step, all ``M`` fits in one ``vmap`` / ``lax.scan``;
       starting standard deviation ``init_scale``); then, for
       ``latent_dim <= NEWTON_MAX_DIM`` (100), each fit's mean refined by up to
       ``init_newton_steps`` damped Newton steps on the potential (a step only where the
       Hessian is positive definite, never one that raises the potential), its standard
       deviations set to ``1 / sqrt(diag(Hessian))`` and every fit scored again on 64
       quasi-random normal points common to all fits (scrambled Sobol' points, fixed;
       :func:`numpyro_gmm._kernels.init_fits.newton_refine`); the ``M`` starting points are
       refined and scored the same way (standard deviation ``init_scale`` where the Hessian is
       not positive definite) and join the fits as candidates. Adam moves
       a mean about ``init_fit_lr`` per step, so without it a posterior mode far from every
       starting point (a location under a wide prior such as ``N(0, 1000)``, data on their
       natural scale) is not reached by the fits, and their scores stop telling the modes
       apart: on a bimodal coordinate beside two Gaussian ones 100 units from the origin the
       fits stopped about 93 units short and both components started in one mode in 2 of 4
       seeds; with the refinement the components start at the posterior's location and on
       both modes (``tests/test_autoguide_modes.py``). Nor does a fit stay in a mode
       narrower than Adam's steps: on a spike-and-slab posterior (a component of standard
       deviation 0.01 and weight 0.9 inside one of 0.995; the posterior is exactly that
       two-component mixture) no fit ended on the spike in 3 of 10 seeds, and both components
       then started in the slab (ELBO after 3000 steps 2.2 nats below the evidence); the
       starting points that prior draws put on the spike find it by Newton's steps, and now
       every seed starts on both (the fit exact: within 0.0003 nats of the evidence in 10 of
       10 seeds, against 2 of 10 before this and the distance below;
       ``benchmarks/spike_and_slab.py``, docs/posteriors.md). For
       ``NEWTON_MAX_DIM < latent_dim <= NEWTON_CG_MAX_DIM`` (10,000), where ``latent_dim``
       Hessian-vector products per fit and step cost too much, the refinement takes up to
       ``init_newton_steps`` Newton-CG steps instead: one Hessian, at the best fit's mean,
       preconditions the conjugate gradients of every fit's steps (so a Gaussian part of the
       posterior is again solved in one step, whatever its correlations and scales; beyond
       ``DENSE_PRECONDITIONER_MAX_DIM`` (4000) only its diagonal blocks of 256 coordinates,
       computed without forming it, so the steps take more products where the posterior is
       correlated across blocks), the
       standard deviations come from Hutchinson probes of the Hessian's diagonal with that
       Hessian as control variate, and each fit keeps whichever of its given and refined
       versions scores better (:func:`numpyro_gmm._kernels.init_fits.newton_cg_refine`; the
       mode is not the best Gaussian mean of a skewed posterior: on a ``d = 200`` logistic
       regression the refined means scored 26 nats below the fits'). On a ``d = 150``
       regression with covariates on scales ``0.1 .. 300`` (posterior standard deviations
       ``3e-4 .. 0.6``) the fits ended a median 35 standard deviations from the posterior
       mean with scales up to 290 times too wide, and the guide started about ``10^6`` nats
       below the evidence and ended 23-76 below after 3000 steps; now it starts 0.0006 below
       and ends 0.06-0.09 below (the optimiser's noise; ``benchmarks/high_dim_init.py``,
       docs/posteriors.md), and the 150-D spike above is found (0.04 nats below the evidence
       after 3000 steps, 2.99 before); at ``d = 2000`` the guide with ``covariance="full"``
       starts exact (0.02 nats from the evidence by 200 draws, against 1.8e8 without the
       refinement);
    3. among the fits (with the refinement: and the refined starting points) whose ELBO (the
       refined score; without the refinement the mean over their last half of steps) is
       within ``init_tolerance`` nats of the best, a greedy choice of ``K`` fits, starting
       from the best, each next one the least crowded by those chosen in the Bhattacharyya
       distance of the fitted Gaussians,
       :math:`\sum_i \frac{(m_{ji} - m_{li})^2}{4 (s_{ji}^2 + s_{li}^2)}
       + \frac12 \ln \frac{s_{ji}^2 + s_{li}^2}{2 s_{ji} s_{li}}`, with a small
       preference for better scores (farthest-point selection while modes without a
       choice remain), then each choice replaced by the
       best-scoring eligible fit of its cluster (see :mod:`numpyro_gmm._kernels.init_fits`).
       Fits that found the same mode are close in this distance and fits in different modes
       far apart, also when one mode is narrow and inside another (the spike above: 0.06
       from the difference of the means, 1.96 from the widths; without the widths' term the
       spike and the slab were one mode, and where fits had found both, both components
       could start on the spike: 0.10 nats below the evidence after training), so the ``K`` components start
       on ``K`` different modes whenever the fits found that many (of mass down to about
       ``exp(-init_tolerance)`` times the largest), and spare components (more than the
       modes found) are spread evenly over the modes;
    4. component ``k`` starts at the chosen fit's mean ``m_k``; for ``covariance="full"``
       with the Laplace covariance there, ``scale_tril = chol((grad^2 U(m_k))^-1)`` (``U``
       the potential; exact for Gaussian parts of the posterior, with their correlations,
       which the diagonal fits lack; ``diag(s)`` where the Hessian is not positive
       definite, and after the Newton-CG refinement where no mode was certified, since a
       Laplace covariance away from a mode can put mass where the density vanishes;
       ``latent_dim`` gradient evaluations per component, see
       :func:`numpyro_gmm._kernels.init_fits.laplace_scale_tril`), otherwise with the
       fit's standard deviations ``s`` (``scale = s``; ``cov_diag = s^2`` for
       ``covariance="lowrank"``, with the Laplace covariance's leading directions as
       ``cov_factor`` at a certified mode: **The start of the low-rank factors** below);
    5. the weights of the components at a mode certified by step 2's refinement start at
       those that maximise the ELBO of the mixture of these ``K`` components, estimated on 64
       quasi-random points of each (``K`` times as many evaluations of the log density;
       exponentiated-gradient ascent, see
       :func:`numpyro_gmm._kernels.init_fits.mixture_logits`): for components on different
       modes, weights proportional to the exponentials of their own ELBOs, the Gaussian
       approximation of the modes' masses; components on the same mode share its mass. The
       log-weights are kept within ``init_tolerance`` nats of the largest. A component
       not at a certified mode keeps ``1 / K`` (its own ELBO says little about the mass
       it will hold once it has moved), and without the refinement all weights start
       equal: in an ``AutoGuideList`` whose other guides' sites are hidden (see below) the
       fits saw one prior draw of those sites and both components started near ``a = 0``,
       away from the posterior's modes at ``+-2``, one of them uncertified; weighted by
       its ELBO it started at 0.0025 and held 0.07 of the mass after 2000 steps (1/2 by
       symmetry; ``tests/test_autoguide_modes.py``). Before, the
       weights started equal and a mode of small mass was reached only as fast as the logits
       move (about ``weight_step_scale * lr`` per step, see **Weights**): on a posterior
       with modes of mass 0.99 and 0.01 (``K = 2``, ``Adam(0.01)``, 5 seeds, medians) the
       light mode kept 0.255 / 0.081 / 0.0215 after 300 / 1000 / 3000 steps; now it starts at
       0.0100 and stays there (``benchmarks/light_mode.py``, float32 and float64; a mass of
       0.003 likewise; one below ``exp(-init_tolerance)`` times the largest, 0.001, is not
       among the eligible fits and gets no component). Cost: the model's log density at
       ``64 K`` points, ``64 K^2`` component densities.

    **Locations.** Component ``k``'s mean is ``locs_origin + locs_unit * locs_offset``
    (per coordinate), and only the offset is optimised: the origin is the initial mean and the
    unit, where the refinement of step 2 certified a mode (Newton: its Hessian there positive
    definite; Newton-CG: the conjugate gradients converged and the Newton decrement
    ``g^T H^-1 g`` is at most 1), the refined standard deviation, else 1 (``"spread"``,
    ``latent_dim > NEWTON_CG_MAX_DIM``, ``init_newton_steps=0``, a fit at a saddle, a fit
    kept unrefined); neither
    gets a gradient, so an optimiser leaves them where they start. Weight decay does move
    parameters without a gradient, so they are held in place twice over: their unconstrained
    values are ``2^32`` times their values (``FROZEN_STEP_SCALE``), so a decay added to the
    gradient, which Adam turns into steps of about ``lr`` on those values whatever its size,
    moves them ``2^-32 lr`` per step; and both are divided by ``locs_gauge`` (ones, held like
    them), so a decay of the parameters themselves (AdamW: each multiplied by
    ``1 - lr * decay`` per step) cancels. Measured (posterior mean 100, standard deviation
    0.04, ``K = 2``, 2000 steps of Adam at lr 0.01 with weight decay; ``tests/test_autoguide.py``):
    with the decay in the gradient (``optax.chain(optax.add_decayed_weights(1e-6),
    optax.adam(0.01))``) the unit reached 0 within a few steps and the means, then the
    origin, fell to 80.8 (470 standard deviations off); with AdamW (decay ``1e-2``) the origin
    shrank to 81.9 (means 420 off); now the means end within 0.26 standard deviations of the
    exact one, as with Adam alone (0.02-0.2 over four keys). The offsets decay as any
    optimised parameter does, towards the initial means. An Adam-type optimiser moves each
    offset about ``lr`` per step whatever the size of its gradient, so a mean moves about
    ``lr`` of its standard deviations, not ``lr`` in the model's units: with
    unscaled means a posterior with standard deviations of ``1e-4`` (data with small noise,
    covariates on a large scale) was found exactly by the initialisation and then shaken
    off it by the first steps. Measured (``Adam(0.01)``, ``K = 2``, linear Gaussian models,
    exact posterior and evidence in closed form): with posterior standard deviations
    ``3.3e-5`` and ``0.027`` (``tests/test_autoguide.py``), after 2000 steps the first mean
    was 1.6 (float32) and 4.8 (float64) standard deviations off and its standard deviation
    1.36 and 10.5 times too large, now both are within 0.001 standard deviations and 0.1%;
    in float32 the ELBO after 3000 steps was 50.2 nats below the evidence, now 0.0 (1.1 ->
    0.0 with standard deviations ``3.3e-4`` and ``0.27``; a regression on four covariates
    of scales ``1e-2 .. 1e3``, standard deviations ``1.4e-4 .. 8.4``: 0.43 -> 0.00; a location
    with posterior standard deviation ``1e-7``, float32, after 2000 steps: mean 4,910 standard
    deviations off and standard deviation 5,850 times too large, now within 1e-5 and 1e-6). Where the
    refinement has not certified a mode the mean may still be far from it, so the unit stays 1:
    with the fits' own standard deviations as units instead, a ``d = 150`` regression
    (standard deviations ``8e-4 .. 0.85``, started 10,131 nats below the evidence, before the
    Newton-CG refinement) ended 390 nats below it after 3000 steps, against 4.7-5.8 with unit
    steps.

    **Weights.** The logits are optimised through ``logits = weight_step_scale * u``
    (``u`` the unconstrained parameter; ``svi.get_params`` returns the logits), so an
    Adam-type optimiser moves them ``weight_step_scale`` (default 0.2) times as fast as
    the other parameters. With one particle the per-component ELBO terms that drive the
    weights are noisy (their noise grows with ``latent_dim``) and so are the other
    components' transient errors; slower logits average them: measured on the d = 50
    model of ``benchmarks/posteriors.py`` (``Adam(0.02)``, 3000 steps, 10 seeds) the median
    error of the mode masses fell from 0.147 (5 of 10 seeds within 0.15) with scale 1 to
    0.022 (10 of 10) with 0.2, the Laplace start being the same. The cost
    is a slower approach to unequal weights (a logit moves at most about
    ``weight_step_scale * lr`` per step), which the initial weights (step 5 of
    **Initialisation**) take from the initial components' ELBOs. (Measured before
    :class:`~numpyro_gmm.TraceEntropy_ELBO`'s control variate in the weights' gradient,
    ``weight_control_variate``, which removes most of that noise where the components fit
    their modes: with both, the median errors on that benchmark's seven models are
    0.005-0.014; with the components' path gradient as well, 0.006-0.020; with the location
    steps in units of the fits' standard deviations (**Locations**), 0.004-0.012.)

    **Cholesky factors** (``covariance="full"``). Each ``scale_tril`` is
    ``L = diag(s) (I + N)`` (NumPyro's ``scaled_unit_lower_cholesky``) with the strictly
    lower ``N`` optimised through ``N = tril_step_scale * u`` (default ``d^(-3/4)``,
    ``d = latent_dim``). An Adam-type optimiser moves every entry of ``u`` about ``lr`` per
    step whatever the size of its gradient, and near a good fit the one-particle gradient of
    ``N`` is noise of rank one (``eps eps^T``), so unscaled the ``d (d - 1) / 2``
    off-diagonal entries take coherent steps of ``lr``: one step can multiply ``|L^-1|`` by
    up to ``(1 + lr)^d``, and their stationary noise adds ``O(d^2 lr^2)`` nats of KL against
    ``O(d lr^2)`` from the means and scales. A scale ``kappa`` makes these ``exp(kappa lr d)``
    and ``O(kappa^2 d^2 lr^2)`` but also slows the learning of correlations that the start
    lacks by ``kappa``: ``d^(-1/2)`` learns them fastest, ``d^(-1)`` is the least noisy, and
    ``d^(-3/4)`` was the best compromise measured (``Adam``, one component, a correlated
    Gaussian target, KL in closed form or by 2000 draws; unscaled / ``d^(-1/2)`` /
    ``d^(-3/4)`` / ``d^(-1)``): from the exact (Laplace) start, KL 4.3 / 1.1 / 0.75 / - after
    300 steps at ``d = 30`` (lr 0.02; ``tests/test_autoguide.py``), 47 / 5.5 / 2.8 / 2.1 after
    2000 at ``d = 100`` and 93 / 9.6 / 3.9 / 2.6 at ``d = 200``; from ``init_method="spread"``,
    which has to learn the correlations, 0.50 / 0.21 / 0.20 / 0.28 (``d = 10``) and
    14.1 / 2.3 / 3.0 / 6.6 (``d = 50``) after 3000 steps. At ``d = 3000`` (lr 0.01) the
    unscaled factor's inverse reached ``1e20`` in three steps and the loss became NaN (default:
    one-particle losses 4478-4580 over 30 steps, the evidence being -4546.5). On
    ``benchmarks/posteriors.py`` (docs/posteriors.md) the ELBO rose by 7.8 nats on ``d50`` and
    0.27 on ``coupled_d10``. (These were measured with the components' gradient of
    ``TraceEntropy_ELBO(path_gradient=False)``; the default path gradient is zero at an
    exact fit, so the rank-one noise above vanishes there; the scale was not re-tuned
    for it.) (NumPyro's ``AutoMultivariateNormal`` has the unscaled factor: at
    ``d = 1000`` with ``Adam(0.01)`` its loss reached ``-1e24`` within 1000 steps, an
    impossible ELBO from a numerically singular factor.)

    **Low-rank factors** (``covariance="lowrank"``). ``cov_factor`` (``W``, ``d x r``) is
    optimised through ``W = diag(locs_unit) * cov_factor_step_scale * u`` (default
    ``d^(-1/2)``) for the same reason: a step of Adam's equal-size moves on all ``d r``
    entries of ``W``, of rank one near a good fit, adds a spurious variance of up to
    ``lr^2 d r`` along one direction; in the location units (the refined standard
    deviations where a mode was certified, see **Locations**) that noise is relative to each
    coordinate's width. In absolute units it was not: on the ``d = 2000`` regression of
    ``benchmarks/high_dim_init.py`` (posterior standard deviations ``3e-4 .. 0.6``) the guide
    started 392 nats below the evidence (the best diagonal Gaussian: 390.7) and ended
    1.4e6 below after 3000 steps of ``Adam(0.01)`` (AutoLowRankMultivariateNormal: 9.8e6);
    in the units, 392.9 (medians of three seeds; from the small start of ``W`` that preceded
    the curvature's start below, which ends at 365.4). The units also set how fast ``W`` learns
    correlations the start lacks, relative to the coordinates' refined (conditional) widths:
    on ``N(m, 0.3^2 I + U U^T)`` (``d = 200``, ``U`` rank 4 with standard normal entries,
    ``Adam(0.02)``, one component, KL in closed form) from KL 13.4 at the start, 5.6 / 3.4 /
    2.2 after 2000 / 4000 / 6000 steps, against 2.7 / 1.5 / 0.9 in absolute units; with
    ``0.3`` replaced by ``3``, 0.01 after 2000 steps against 1.07.
    Measured (``Adam``, one component, KL in closed form; unscaled / default): from the
    exact start of ``N(1, 0.5 I)`` (``W`` small), KL 5.8 / 1.05 after 300 steps at
    ``d = 100`` (lr 0.02; ``tests/test_lowrank.py``), 17.8 / 2.3 at ``d = 200``, and at
    ``d = 1000`` (rank 32, lr 0.01) 114 / 6.4 after 100 steps; on a target with a rank-4
    covariance part that ``W`` has to learn from its small start, KL 10.8 at the start,
    then 17.7 / 7.0 after 6000 steps at ``d = 200`` (lr 0.02; scales 0.1 and 0.3: 6.6 and
    7.3) and 110 / 18.7 after 2000 at ``d = 1000`` (lr 0.01).

    **The start of the low-rank factors.** Where the refinement certified a mode, ``W``
    starts from the Laplace covariance there: in the location units (the refined mean-field
    standard deviations, in which the start's ``cov_diag`` is 1),
    ``W = V diag(sqrt(max(lambda - 1, 0.1^2)))`` with ``(lambda, V)`` the ``rank`` leading
    eigenpairs of the scaled Laplace covariance (probabilistic PCA with unit noise: the
    variance the mean field lacks along the posterior's widest directions; each column at
    least ``LOWRANK_INIT_FACTOR = 0.1`` long, since ``W = 0`` is a stationary point), from a
    randomised Nystrom approximation with ``3 (rank + 10)`` products with the Laplace
    covariance (exact ones from the Newton refinement's factors up to ``NEWTON_MAX_DIM``,
    conjugate-gradient solves with the Newton-CG refinement's preconditioner beyond; no
    ``d x d`` matrix beyond ``DENSE_PRECONDITIONER_MAX_DIM``) and a LAPACK-free eigensolver
    (:func:`numpyro_gmm._kernels.init_fits.principal_cov_factor`). Elsewhere it starts small
    (see ``{prefix}_cov_factor`` below). Measured (``benchmarks/high_dim_init.py
    --covariance lowrank``, ``K = 2``, 3 seeds, 3000 steps of ``Adam(0.01)``, medians of the
    gap below the evidence; from the small start -> from the curvature's): the ``d = 2000``
    regression starts 392.5 -> 358.4 nats below and ends 392.9 -> 365.4 (the best diagonal
    Gaussian: 390.7, the best Gaussian of the family 355.0); a ``d = 5000`` random walk
    1689 -> 1446 and 1690.2 -> 1462.8 (best diagonal 1683, the exact eigenpairs' factor
    1445.5); a ``d = 5001`` hierarchical model 5.52 -> 0.129 (the small factor's random
    correlations cost 5.4 nats there) and 0.31 -> 0.36 after the steps. The initialisation
    took 2-4 s longer on those models (12.3, 9.7, 9.9 s against 10.1, 6.5, 5.7 s). The
    steps drift from the start by 1-2% of the gap (the one-particle gradients' noise; a
    quarter of the default ``cov_factor_step_scale`` removed a third of that drift on a
    ``d = 1000`` regression: 171.8 -> 174.9 at the default, 173.8 at a quarter, one seed;
    the default was kept for the factors that start small).

    Cost: ``2 * M * init_fit_steps`` evaluations of the model's log density and its
    gradient, once, vectorised over the ``M`` fits (with the defaults and ``K = 2``: 12,800,
    as many as 6,400 / K steps of ``TraceEntropy_ELBO`` with one particle, but in 200
    vectorised steps: 0.02 s for a scalar model), for ``covariance="full"`` ``K`` Hessians
    of the log density (``K * latent_dim`` gradient evaluations by forward-over-reverse
    differentiation, and a ``d x d`` Cholesky and inverse each; taken from the Newton
    refinement's last pass where it ran), for the refinement ``(init_newton_steps + 1) * 2 M``
    Hessians and ``d x d`` factorisations and ``128 M`` further log densities (run time, on a
    logistic regression with ``10^4`` rows, ``K = 2``: 0.4 s at ``d = 20`` and 1.1 s at
    ``d = 100`` beside the fits' 0.9 and 1.2 s, about half of it for the starting points;
    compilation of the initialisation about 1.5-2.5 s longer, measured on
    the ``iris`` and ``d50`` models of ``benchmarks/posteriors.py``); beyond
    ``NEWTON_MAX_DIM`` the Newton-CG refinement instead costs one Hessian (``latent_dim``
    Hessian-vector products; beyond ``DENSE_PRECONDITIONER_MAX_DIM`` only its diagonal blocks
    of 256 are kept) and, per fit, at most ``init_newton_steps * 16 + 64 + 16`` Hessian-vector products
    (fewer where the conjugate gradients converge sooner), as many ``d x d`` matrix-vector
    products (with the 256 x 256 blocks beyond ``DENSE_PRECONDITIONER_MAX_DIM``) and ``6 * init_newton_steps +
    192`` log densities (run time of the initialisation without -> with it, on the
    regressions of ``benchmarks/high_dim_init.py`` (``2 d`` rows; ``K = 2``,
    ``covariance="full"``): 0.1 -> 0.1-0.2 s at ``d = 150``, 0.9 -> 1.6 s at ``d = 1000``,
    4.0 -> 5.8 s at ``d = 2000``; compilation 1.9-2.5 s longer); for
    ``covariance="lowrank"`` at a certified mode, ``3 (rank + 10)`` products with the
    Laplace covariance per component (beyond ``NEWTON_MAX_DIM`` each a conjugate-gradient
    solve of at most 64 Hessian-vector products) and a ``(rank + 10)``-square eigensolver
    (2-4 s more on the models above, mostly compilation); plus one
    compilation of the fits, which
    dominates for small models (25 s for a scalar model on a heavily loaded 2-core
    machine, where compiling one ``TraceEntropy_ELBO`` update took 48 s). That compilation
    happens once per guide object: a later ``SVI.init`` (or ``SVI.run``) with another key
    reuses the program, and outside any ``jit`` / ``vmap`` it is compiled with the CPU's
    classic emitters (:data:`INIT_COMPILER_OPTIONS`). Measured, eager ``SVI.init`` on three
    models of ``benchmarks/posteriors.py`` (``bimodal_gauss`` / ``d50`` / ``iris``; 2-core
    CPU), first call 8.1 / 12.4 / 13.3 -> 7.7 / 11.3 / 11.1 s (about 5 s of it NumPyro's
    eager set-up, as for ``AutoMultivariateNormal``: 5.8 s), a second call with another key
    3.3 / 5.2 / 4.6 -> 0.02 / 0.07 / 0.07 s.
    **Memory.** The fits, the refinement's Hessians, line searches and scores evaluate the
    log density at many points at once; where the estimated working memory of that (one
    trace of the log density's gradient gives the bytes one evaluation keeps alive) would
    exceed :data:`INIT_MEMORY_BYTES` (4 GiB) they run in chunks, with the same values
    (where the estimate fails, a ``RuntimeWarning`` and all at once, as before).
    Models whose log density is cheap are unaffected. On a model whose log density grows
    with its data the initialisation is worth thousands of steps: measured on a logistic
    regression with ``d = 20`` (``benchmarks/init_memory.py``, docs/performance.md), with
    ``N = 10^5`` rows ``SVI.init`` took 11 s (``K = 2``) and 36 s (``K = 8``) against
    AutoMultivariateNormal steps of 1.4 ms, and XLA's buffers 0.8-1.0 GB (1.6 and 6.6 GB
    all at once, as before the chunks); with ``N = 10^6``, ``K = 2``: 134 s and 1.6 GB peak
    memory (17.1 GB before). There, fewer ``num_init_fits``, ``init_fit_steps`` or
    ``init_newton_steps`` cut the cost, or ``init_method="spread"`` for a posterior known
    to have one mode.
    ``init_method="spread"`` is the cheap alternative: all components around the
    ``init_loc_fn`` point (centred offsets of root-mean-square norm ``init_spread``, the
    vertices of a regular simplex for ``K <= latent_dim + 1``), which finds one mode only
    unless ``init_loc_fn`` / ``init_spread`` are chosen for the model.

    Still check a fit: compare the ELBO of runs with different keys and numbers of
    components; the fits find modes that prior draws can reach by gradient ascent, not
    modes hidden behind a barrier that none of the ``M`` starting points crosses.

    **In an** ``AutoGuideList`` the initialisation sees only the model this guide is given.
    NumPyro's ``handlers.block(model, expose=[...])`` hides the observed sites as well, so the
    fits find the modes of the exposed sites' *prior*; the guide warns (``UserWarning`` at its
    first call) when its model is behind ``handlers.block`` and shows no observed site. Give it
    ``handlers.block(model, hide=[...])`` with the other guides' latent sites hidden instead:
    they take prior draws (from the call's key) in the initial fits and the likelihood stays.
    Measured (``tests/test_autoguide_modes.py``'s ``guide_list_model``: a bimodal ``a`` whose
    likelihood also holds a vector ``b``; AutoNormal for ``b`` and a scale, ``K = 2``,
    ``Adam(0.02)``, 3000 steps, 3 seeds): with ``expose=["a"]`` both components started at the
    prior's mode 0 and ended within 0.22 of it (mean loss of the last 300 steps 11.3-11.8);
    with ``hide=["b", "s"]`` they ended at ``a = +-1.95 .. 2.04`` with weights 0.47-0.53 (the
    posterior's modes, each of mass 1/2 by symmetry; loss 6.41-6.43).

    Parameters (constrained values in ``svi.get_params``):

    * ``{prefix}_logits`` ``(K,)``, initialised by step 5 of **Initialisation** (zeros,
      equal weights, for ``init_method="spread"``), real
      (optimised through ``weight_step_scale * u``, see above);
    * ``{prefix}_locs_origin``, ``{prefix}_locs_unit``, ``{prefix}_locs_gauge`` and
      ``{prefix}_locs_offset`` ``(K, latent_dim)``: the means are
      ``(origin + unit * offset) / gauge`` (**Locations** above;
      ``guide.get_posterior(params).loc``), the origin the initial means above, the unit the
      refined standard deviations or 1, the gauge ones, all three held fixed (optimised
      through ``FROZEN_STEP_SCALE * u``; a parameter set without the gauge, from an earlier
      version, reads as gauge 1), the offset initialised to zeros;
    * ``{prefix}_scale_tril`` ``(K, latent_dim, latent_dim)`` (``covariance="full"``,
      constraint ``scaled_unit_lower_cholesky``, its off-diagonal part optimised through
      ``tril_step_scale * u``, see above): the Laplace factors above
      (``init_method="fits"``) or ``init_scale * I`` (``"spread"``); or ``{prefix}_scale``
      ``(K, latent_dim)`` (``covariance="diag"``, positive): the fits' standard deviations
      (``"fits"``) or ``init_scale`` (``"spread"``);
    * ``covariance="lowrank"`` (``Sigma_k = W_k W_k^T + diag(D_k)``, as NumPyro's
      ``AutoLowRankMultivariateNormal`` but per component; the default entropy costs
      ``O(K^2 M d r)`` and nothing of size ``d x d`` is formed, so ``latent_dim`` in the
      thousands is practical): ``{prefix}_cov_diag`` ``(K, latent_dim)`` (positive,
      ``softplus_positive``), initialised to the squares of the standard deviations above,
      and ``{prefix}_cov_factor`` ``(K, latent_dim, rank)`` (real, optimised through
      ``cov_factor_step_scale * u``, see above; in the location units: the component's
      ``W_k`` is ``locs_unit_k[:, None]`` times it), initialised, where the refinement
      certified a mode, from the Laplace covariance there (**The start of the low-rank
      factors** above: its
      ``rank`` leading directions in the location units, each column at least
      ``LOWRANK_INIT_FACTOR = 0.1`` long), elsewhere (and for ``init_method="spread"``) so
      that ``W_k`` is ``LOWRANK_INIT_FACTOR * s_k * G_k / sqrt(rank)`` (``s_k`` the standard
      deviations, ``G_k`` fixed standard normal draws from a NumPy seed): small, so the
      initial components are the fits' (marginal variances larger by about 1%), but not
      zero, because ``q`` is unchanged by ``W -> -W``: ``W = 0`` is a stationary point of
      the expected ELBO (its expected gradient vanishes there and only sampling noise would
      move it).

    :param model: a NumPyro model with continuous latent variables (no local latents).
    :param int num_components: ``K >= 1``.
    :param str covariance: ``"full"``, ``"diag"`` or ``"lowrank"``. ``"full"`` raises
        ``ValueError`` at the guide's first call when ``FULL_MEMORY_FACTOR * K d^2`` floats
        (14: the factors, their gradient, the optimiser's moments, the initial Hessians)
        exceed ``FULL_COVARIANCE_MAX_BYTES`` (8 GiB; with ``K = 4``, ``d`` above 6,192 in
        float32), naming ``"lowrank"`` and ``"diag"``, instead of allocating them.
    :param int rank: ``r >= 1`` for ``covariance="lowrank"``; default (``None``)
        ``round(sqrt(latent_dim))`` as ``AutoLowRankMultivariateNormal``. Ignored otherwise.
    :param init_loc_fn: per-site initialisation strategy (see ``numpyro.infer.initialization``);
        the first starting point of ``"fits"``, the centre of ``"spread"``.
    :param float init_scale: ``> 0``; starting standard deviation of the fits
        (``"fits"``) or of every component (``"spread"``).
    :param str init_method: ``"fits"`` (default) or ``"spread"``, see above.
    :param int num_init_fits: ``M >= K`` for ``"fits"``; default ``max(32, 16 K)``.
    :param int init_fit_steps: Adam steps of each fit, ``>= 1`` (default 200).
    :param float init_fit_lr: initial learning rate of the fits, ``> 0`` (default 0.05).
    :param float init_tolerance: ELBO window of the eligible fits in nats, ``> 0`` (default 6).
    :param int init_newton_steps: Newton steps refining each fit, ``>= 0`` (default 8; 0 turns
        the refinement off; Newton-CG steps for ``NEWTON_MAX_DIM < latent_dim <=
        NEWTON_CG_MAX_DIM``, none beyond), see above.
    :param float init_spread: for ``"spread"``: root-mean-square distance of the initial
        component means from the initial location, ``>= 0``; default ``3 * init_scale``.
    :param float weight_step_scale: ``> 0``; relative speed of the logits under an
        Adam-type optimiser (default 0.2; 1 optimises the logits directly), see above.
    :param float tril_step_scale: ``> 0``; for ``covariance="full"``, relative speed of the
        Cholesky factors' off-diagonal entries under an Adam-type optimiser; default
        (``None``) ``latent_dim ** -0.75``, see above.
    :param float cov_factor_step_scale: ``> 0``; for ``covariance="lowrank"``, relative speed
        of ``cov_factor`` under an Adam-type optimiser; default (``None``)
        ``latent_dim ** -0.5``, see above.
    :param str prefix: prefix of the parameter names.
    :param str entropy_method: ``GaussianMixture`` entropy estimator used by
        :class:`~numpyro_gmm.TraceEntropy_ELBO` (unless its ``entropy_options`` override it).
    :param int entropy_order: order of that estimator (``None``: its default).
    """

    def __init__(
        self,
        model,
        *,
        num_components: int = 2,
        covariance: str = "full",
        rank: int | None = None,
        init_loc_fn=init_to_uniform,
        init_scale: float = 0.1,
        init_method: str = "fits",
        num_init_fits: int | None = None,
        init_fit_steps: int = 200,
        init_fit_lr: float = 0.05,
        init_tolerance: float = 6.0,
        init_newton_steps: int = 8,
        init_spread: float | None = None,
        weight_step_scale: float = 0.2,
        tril_step_scale: float | None = None,
        cov_factor_step_scale: float | None = None,
        prefix: str = "auto",
        entropy_method: str = DEFAULT_METHOD,
        entropy_order: int | None = None,
    ):
        self.num_components = check_int("num_components", num_components, 1)
        if covariance not in _COVARIANCES:
            raise ValueError(f"covariance must be one of {_COVARIANCES}, got {covariance!r}")
        self.covariance = covariance
        self.rank = None if rank is None else check_int("rank", rank, 1)
        if not (np.ndim(init_scale) == 0 and float(init_scale) > 0):
            raise ValueError(f"init_scale must be a positive scalar, got {init_scale!r}")
        self._init_scale = float(init_scale)
        if init_method not in _INIT_METHODS:
            raise ValueError(f"init_method must be one of {_INIT_METHODS}, got {init_method!r}")
        self.init_method = init_method
        if num_init_fits is None:
            num_init_fits = max(32, 16 * self.num_components)
        self.num_init_fits = check_int("num_init_fits", num_init_fits, self.num_components)
        self.init_fit_steps = check_int("init_fit_steps", init_fit_steps, 1)
        for name, value in (("init_fit_lr", init_fit_lr), ("init_tolerance", init_tolerance)):
            if not (np.ndim(value) == 0 and float(value) > 0):
                raise ValueError(f"{name} must be a positive scalar, got {value!r}")
        self.init_fit_lr = float(init_fit_lr)
        self.init_tolerance = float(init_tolerance)
        self.init_newton_steps = check_int("init_newton_steps", init_newton_steps, 0)
        if init_spread is None:
            init_spread = 3.0 * self._init_scale
        if not (np.ndim(init_spread) == 0 and float(init_spread) >= 0):
            raise ValueError(f"init_spread must be a non-negative scalar, got {init_spread!r}")
        self._init_spread = float(init_spread)
        if not (np.ndim(weight_step_scale) == 0 and float(weight_step_scale) > 0):
            raise ValueError(f"weight_step_scale must be a positive scalar, got {weight_step_scale!r}")
        self.weight_step_scale = float(weight_step_scale)
        for name, value in (("tril_step_scale", tril_step_scale), ("cov_factor_step_scale", cov_factor_step_scale)):
            if value is not None and not (np.ndim(value) == 0 and float(value) > 0):
                raise ValueError(f"{name} must be a positive scalar or None, got {value!r}")
        self.tril_step_scale = None if tril_step_scale is None else float(tril_step_scale)
        self.cov_factor_step_scale = None if cov_factor_step_scale is None else float(cov_factor_step_scale)
        if not isinstance(entropy_method, str):
            raise ValueError(f"entropy_method must be a str, got {entropy_method!r}")
        self.entropy_method = entropy_method
        self.entropy_order = None if entropy_order is None else check_int("entropy_order", entropy_order, 1)
        super().__init__(model, prefix=prefix, init_loc_fn=init_loc_fn)

    # -- initialisation -------------------------------------------------------------------

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        # the compiled initialisation of this prototype (_run_once): a later SVI.init with
        # another key reuses it instead of compiling it again (2.5-3 s each on bimodal_gauss)
        self._init_programs = {}
        # the model's arguments of the first call: those of the initialisation when it is
        # given none (initial_components etc. called directly; _model_args)
        self._prototype_args = (args, kwargs)
        if self.covariance == "full":
            _check_full_covariance_memory(self.num_components, self.latent_dim, jnp.result_type(self._init_latent))
        if self.init_method == "fits":
            _warn_if_likelihood_blocked(self.model, self.prototype_trace, self.prefix)

    def __getstate__(self):
        # the compiled programs are a cache of jitted functions, which pickle cannot store:
        # dropped, and compiled again where needed (as NumPyro's autoguides, the guide
        # pickles before and after its first call)
        state = self.__dict__.copy()
        state.pop("_init_programs", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "_prototype_args" in state:
            self._init_programs = {}

    def _model_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The model's arguments of the initialisation: those given, or where none are, those
        of the guide's first call."""
        return (args, kwargs) if args or kwargs else self._prototype_args

    def _programs_for(self, args: tuple, kwargs: dict) -> dict:
        """The cache of compiled initialisations (:func:`_run_once`) for these model
        arguments: kept while a call passes the same arguments (the same JAX arrays, NumPy
        arrays of the same contents, equal Python scalars; :func:`_argument_token`), emptied
        for others, whose data the compiled programs do not hold."""
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        tokens = [_argument_token(leaf) for leaf in leaves]
        cached = self._init_programs.get("data")
        if cached is None or cached[0] != treedef or not _same_tokens(cached[1], tokens):
            self._init_programs = {"data": (treedef, tokens)}
        return self._init_programs

    def _latent_potential(self, args: tuple, kwargs: dict):
        """The potential (minus the log joint density) as a function of the unconstrained
        latent vector, for the model's arguments ``args``, ``kwargs``."""
        potential = self._potential_fn_gen(*args, **kwargs)
        return lambda z: potential(self._unpack_latent(z))

    def _draw_start(self, key, strategy, args: tuple, kwargs: dict):
        """One starting point: ``strategy`` per site, in unconstrained space, ravelled."""
        with handlers.block():
            seeded = handlers.substitute(handlers.seed(self.model, key), substitute_fn=strategy)
            tr = handlers.trace(seeded).get_trace(*args, **kwargs)
        flat = []  # the order of AutoContinuous's ravel: that of _init_locs
        for name in self._init_locs:
            site = tr[name]
            flat.append(jnp.reshape(biject_to(site["fn"].support).inv(site["value"]), -1))
        return jnp.concatenate(flat)

    def starting_points(self, rng_key, *args, **kwargs):
        """The ``(num_init_fits, latent_dim)`` starting points of ``init_method="fits"``
        (step 1 of the class docstring), given a key and the model's arguments (where none
        are given, those of the guide's first call); after the guide's first call."""
        args, kwargs = self._model_args(args, kwargs)
        M = self.num_init_fits
        dtype = jnp.result_type(self._init_latent)
        n_prior = M // 2
        keys = prng.split(rng_key, n_prior + 1)
        # One draw after the other (lax.map): the same values as a vmap over the keys, and
        # the model's samplers (rejection loops for Gamma, Beta, Dirichlet, LKJ priors)
        # compile unbatched: compilation of these starting points 28-42% shorter, measured on
        # four models (e.g. Dirichlet + HalfNormal + LKJCholesky priors 7.2-8.8 -> 4.4-5.6 s).
        prior = lax.map(lambda k: self._draw_start(k, init_to_sample, args, kwargs), keys[:n_prior])
        # init_to_uniform's points, uniform in (-2, 2) in unconstrained space, drawn directly:
        # running the model for them (as for the prior draws) costs two jax.random calls per
        # site, and each call site about 40-70 ms of XLA compilation on a CPU
        uniform = prng.uniform(keys[n_prior], (M - 1 - n_prior, self.latent_dim), dtype, -2.0, 2.0)
        return jnp.concatenate([self._init_latent[None], prior, uniform]).astype(dtype)

    def initial_fits(self, rng_key, *args, **kwargs):
        """Run steps 1-3 of the class docstring: ``(locs (K, d), scales (K, d), chosen (K,),
        fits)``, ``fits = (locs (C, d), scales (C, d), scores (C,))`` of all candidates
        (``C = 2 M`` with the Newton refinement: the ``M`` fits, then the ``M`` refined
        starting points; else ``C = M``, the fits), ``chosen`` indexing them, for the
        model's arguments ``args``, ``kwargs`` (where none are given, those of the guide's
        first call). Needs the guide's prototype (its first call)."""
        fitted = self._fits_and_curvature(rng_key, *self._model_args(args, kwargs))
        return fitted.locs, fitted.scales, fitted.chosen, fitted.fits

    def _memory_budget(self, potential):
        """The initialisation's :class:`~numpyro_gmm._kernels.memory.MemoryBudget`: one
        gradient evaluation of ``potential``, estimated from one trace of it, against
        :data:`INIT_MEMORY_BYTES` (unbounded, with a warning, where the estimate fails)."""
        point = jnp.asarray(self._init_latent)
        jaxpr = jax.make_jaxpr(jax.value_and_grad(potential))(point)  # the model's errors raise here
        try:
            evaluation = peak_bytes(jaxpr)
        except Exception as error:  # a construct the estimate does not know: fit without the bound
            warnings.warn(f"AutoGaussianMixture: the initialisation's memory estimate failed ({error!r}); "
                          "it evaluates the log density at all its points at once", RuntimeWarning, stacklevel=2)
            return UNBOUNDED
        return MemoryBudget(evaluation, INIT_MEMORY_BYTES)

    def _fits_and_curvature(self, rng_key, args: tuple, kwargs: dict) -> _Fitted:
        """Steps 1-3 of the class docstring and what the initial components need of them
        (:class:`_Fitted`), for the model's arguments ``args``, ``kwargs``."""
        start_key, fit_key = prng.split(rng_key)
        starts = self.starting_points(start_key, *args, **kwargs)
        potential = self._latent_potential(args, kwargs)
        budget = self._memory_budget(potential)
        locs, scales, scores = fit_diagonal_gaussians(
            potential, starts, jnp.log(self._init_scale), fit_key,
            num_steps=self.init_fit_steps, learning_rate=self.init_fit_lr, num_particles=2, budget=budget,
        )
        laplace = at_mode = preconditioner = None
        if self.init_newton_steps and self.latent_dim <= NEWTON_CG_MAX_DIM:
            # the starting points are candidates too: a fit does not stay in a mode narrower
            # than Adam's steps, which Newton's steps from a start inside it find
            locs = jnp.concatenate([locs, starts])
            scales = jnp.concatenate([scales, jnp.full_like(starts, self._init_scale)])
            options = dict(num_steps=self.init_newton_steps, num_draws=NEWTON_SCORE_DRAWS, budget=budget)
            if self.latent_dim <= NEWTON_MAX_DIM:
                locs, scales, scores, laplace = newton_refine(potential, locs, scales, **options)
                at_mode = is_factor(laplace)
            else:  # preconditioned by the Hessian at the best fit's mean
                best = jnp.argmax(scores)
                kind = "dense" if self.latent_dim <= DENSE_PRECONDITIONER_MAX_DIM else "blocks"
                preconditioner = hessian_preconditioner(potential, locs[best], scales[best], kind, budget=budget)
                locs, scales, scores, at_mode = newton_cg_refine(
                    potential, locs, scales, best, preconditioner=preconditioner, **options)
        chosen = choose_separated(locs, scales, scores, self.num_components, self.init_tolerance)
        return _Fitted(locs[chosen], scales[chosen], chosen, (locs, scales, scores),
                       None if laplace is None else laplace[chosen], None if at_mode is None else at_mode[chosen],
                       budget, potential, preconditioner)

    # -- parameters -----------------------------------------------------------------------

    def _init_component_locs(self):
        offsets = _spread_directions(self.num_components, self.latent_dim) * self._init_spread
        return self._init_latent + jnp.asarray(offsets, dtype=jnp.result_type(self._init_latent))

    def initial_components(self, rng_key, *args, **kwargs):
        """``(locs (K, d), scales (K, d), factor, units (K, d), logits (K,))`` of the initial
        components of ``init_method="fits"`` (steps 1-5 of the class docstring) for the model's
        arguments ``args``, ``kwargs`` (where none are given, those of the guide's first call):
        ``factor`` the Laplace factors ``scale_tril (K, d, d)`` for ``covariance="full"``,
        the low-rank factors ``W (K, d, rank)`` in the model's coordinates for
        ``"lowrank"`` (**The start of the low-rank factors** in the class docstring), ``None`` for
        ``"diag"``; ``units`` the units of the location steps (``locs_unit``, see
        **Locations**); ``logits`` those of the initial weights (step 5). Needs the guide's
        prototype."""
        args, kwargs = self._model_args(args, kwargs)
        fitted = self._fits_and_curvature(rng_key, args, kwargs)
        locs, scales, laplace, at_mode = fitted.locs, fitted.scales, fitted.laplace, fitted.at_mode
        budget, potential, preconditioner = fitted.budget, fitted.potential, fitted.preconditioner
        units = location_units(scales, at_mode)
        if self.covariance == "diag":
            factor = None
        elif self.covariance == "lowrank":
            # from the curvature at a certified mode, small elsewhere
            factor = small = self._initial_cov_factor(scales)
            if laplace is not None:
                factor = laplace_cov_factors(laplace, units, self._rank(), at_mode, small, LOWRANK_INIT_FACTOR)
            elif preconditioner is not None:
                factor = curvature_cov_factors(potential, locs, units, self._rank(), at_mode, small, preconditioner,
                                               min_scale=LOWRANK_INIT_FACTOR, budget=budget)
        elif laplace is not None:  # the refinement's Laplace factors at these means
            factor = laplace_or_diagonal(laplace, scales)
        else:  # after the Newton-CG refinement the Laplace covariance only at a certified mode
            factor = laplace_scale_tril(potential, locs, scales, budget, at_mode)
        return locs, scales, factor, units, self._initial_logits(potential, budget, locs, scales, factor, at_mode)

    def _initial_logits(self, potential, budget: MemoryBudget, locs, scales, factor, at_mode):
        """``(K,)`` logits of the weights that maximise the ELBO of the initial components
        (step 5 of the class docstring) over those of the components at a certified mode
        (``at_mode (K,)``; none where it is ``None``), the others keeping ``1 / K``:
        :func:`~numpyro_gmm._kernels.init_fits.mixture_logits` on :data:`NEWTON_SCORE_DRAWS`
        quasi-random points of each component, ``K`` times as many evaluations of the log
        density (within the memory ``budget``) and ``K^2`` times as many of a component's
        density."""
        if at_mode is None:  # no refinement: no component certified, the weights equal
            return jnp.zeros(locs.shape[0], locs.dtype)
        K, d = locs.shape
        lowrank = self.covariance == "lowrank"
        mixture = self._make_mixture(jnp.zeros(K, locs.dtype), locs,
                                     scales if factor is None else (factor, jnp.square(scales)) if lowrank else factor)
        n = NEWTON_SCORE_DRAWS
        eps = jnp.asarray(score_points(n, d + factor.shape[-1] if lowrank else d), locs.dtype)
        z = mixture._component_draws(eps[:, None, :])  # (n, K, d): the same points for every component
        flat = z.reshape(n * K, d)
        log_p = -map_batched(potential, budget.batch(1, n * K), flat).reshape(n, K).T
        components = mixture.component_distribution
        # (K, n, K), one component's points at a time: working arrays (n, K, d), not (n, K, K, d)
        log_q = lax.map(lambda z_k: components.log_prob(z_k[:, None, :]), jnp.swapaxes(z, 0, 1))
        return mixture_logits(log_p, log_q, self.init_tolerance, at_mode)

    def _initial_values(self, rng_key, args: tuple, kwargs: dict):
        """``(locs (K, d), scales (K, d), factor, units (K, d), logits (K,))`` of the initial
        components for the model's arguments ``args``, ``kwargs`` (those of the call that creates the
        parameters); ``factor`` ``scale_tril (K, d, d)`` for ``covariance="full"`` (the
        Laplace factors of ``"fits"``, ``diag(scales)`` for ``"spread"``), ``cov_factor``
        ``(K, d, rank)`` in the model's coordinates for ``"lowrank"`` (see
        :meth:`initial_components`; :meth:`_initial_cov_factor` for ``"spread"``), ``None``
        for ``"diag"``; ``units`` those of the location steps (1 for ``"spread"``); ``logits``
        those of the initial weights (equal for ``"spread"``)."""
        K, d = self.num_components, self.latent_dim
        dtype = jnp.result_type(self._init_latent)
        if self.init_method == "spread":
            locs, scales, tril = self._init_component_locs(), jnp.full((K, d), self._init_scale, dtype), None
            units, logits = jnp.ones((K, d), dtype), jnp.zeros(K, dtype)
        else:
            args, kwargs = self._model_args(args, kwargs)
            programs = self._programs_for(args, kwargs)
            with handlers.block():  # the fits run the model: keep its sites out of outer traces
                locs, scales, tril, units, logits = _run_once(
                    lambda key: self.initial_components(key, *args, **kwargs), (rng_key,), programs, (args, kwargs)
                )
        if self.covariance == "full" and tril is None:
            tril = scales[..., None] * jnp.eye(d, dtype=scales.dtype)
        if self.covariance == "lowrank" and tril is None:
            tril = self._initial_cov_factor(scales)
        tril = None if tril is None else tril.astype(dtype)
        return locs.astype(dtype), scales.astype(dtype), tril, units.astype(dtype), logits.astype(dtype)

    def _make_mixture(self, logits, locs, factor):
        kwargs = {"entropy_method": self.entropy_method, "entropy_order": self.entropy_order}
        if self.covariance == "full":
            return GaussianMixture(locs, scale_tril=factor, logits=logits, **kwargs)
        if self.covariance == "lowrank":
            return GaussianMixture(locs, cov_factor=factor[0], cov_diag=factor[1], logits=logits, **kwargs)
        return GaussianMixture(locs, scale=factor, logits=logits, **kwargs)

    def _tril_step_scale(self) -> float:
        """``tril_step_scale``, by default ``latent_dim ** -0.75`` (class docstring)."""
        return self.latent_dim**-0.75 if self.tril_step_scale is None else self.tril_step_scale

    def _cov_factor_step_scale(self) -> float:
        """``cov_factor_step_scale``, by default ``latent_dim ** -0.5`` (class docstring)."""
        return self.latent_dim**-0.5 if self.cov_factor_step_scale is None else self.cov_factor_step_scale

    def _rank(self) -> int:
        return int(round(self.latent_dim**0.5)) if self.rank is None else self.rank

    def _initial_cov_factor(self, scales):
        """``(K, latent_dim, rank)``: ``LOWRANK_INIT_FACTOR * s_k G_k / sqrt(rank)``, the
        factor away from a certified mode (class docstring)."""
        K, d, r = self.num_components, self.latent_dim, self._rank()
        g = np.random.default_rng(0).standard_normal((K, d, r)) / np.sqrt(r)
        return LOWRANK_INIT_FACTOR * scales[..., None] * jnp.asarray(g, scales.dtype)

    def _sample_latent(self, *args, **kwargs):
        # as AutoContinuous._sample_latent, with the model's arguments of this call passed on
        # to the initialisation (a guide called again with other data starts from the fits
        # to those data, not to its first call's)
        sample_shape = kwargs.pop("sample_shape", ())
        posterior = self._get_posterior(args, kwargs)
        return numpyro.sample(
            f"_{self.prefix}_latent", posterior.expand_by(sample_shape), infer={"is_auxiliary": True}
        )

    def _get_posterior(self, args: tuple = (), kwargs: dict | None = None):
        """The mixture at the parameters of the guide's call; those not yet created start
        from the initialisation for the model's arguments ``args``, ``kwargs`` (where none
        are given, those of the guide's first call)."""
        K = self.num_components
        dtype = jnp.result_type(self._init_latent)
        cache = []

        def initial(rng_key):  # computed once, at the first parameter that needs it
            if not cache:
                cache.append(self._initial_values(rng_key, args, kwargs or {}))
            return cache[0]

        # locs = (origin + unit * offset) / gauge, only the offset optimised (**Locations** in
        # the class docstring): the origin, the unit and the gauge (ones) get no gradient, so an
        # optimiser leaves them; weight decay still moves them, so: a decay added to the
        # gradient (L2 before Adam) becomes steps of about lr on their unconstrained values,
        # 2^-32 lr on theirs (the constraint); a decay of the parameters themselves (AdamW)
        # scales all three alike, which the division by the gauge undoes
        frozen = _ScaledReal(FROZEN_STEP_SCALE)
        origin = numpyro.param(f"{self.prefix}_locs_origin", lambda key: initial(key)[0], constraint=frozen)
        # after the first parameter that computes the initialisation, so that it gets the same key
        logits = numpyro.param(
            f"{self.prefix}_logits", lambda key: initial(key)[4], constraint=_ScaledReal(self.weight_step_scale)
        )
        unit = numpyro.param(f"{self.prefix}_locs_unit", lambda key: initial(key)[3], constraint=frozen)
        gauge = numpyro.param(f"{self.prefix}_locs_gauge", jnp.ones((K, self.latent_dim), dtype), constraint=frozen)
        offset = numpyro.param(f"{self.prefix}_locs_offset", jnp.zeros((K, self.latent_dim), dtype))
        origin, unit = (lax.stop_gradient(x / gauge) for x in (origin, unit))
        locs = origin + unit * offset
        if self.covariance == "full":
            factor = numpyro.param(
                f"{self.prefix}_scale_tril",
                lambda key: initial(key)[2],
                constraint=_StepScaledUnitLowerCholesky(self._tril_step_scale()),
            )
        elif self.covariance == "lowrank":
            # in the location units (per coordinate, like the offsets): W = unit * cov_factor
            cov_factor = numpyro.param(
                f"{self.prefix}_cov_factor",
                lambda key: initial(key)[2] / initial(key)[3][..., None],
                constraint=_ScaledReal(self._cov_factor_step_scale()),
            )
            cov_diag = numpyro.param(
                f"{self.prefix}_cov_diag",
                lambda key: jnp.square(initial(key)[1]),
                constraint=constraints.softplus_positive,
            )
            factor = (unit[..., None] * cov_factor, cov_diag)
        else:
            factor = numpyro.param(
                f"{self.prefix}_scale",
                lambda key: initial(key)[1],
                constraint=constraints.softplus_positive,
            )
        return self._make_mixture(logits, locs, factor)

    # -- AutoContinuous interface ---------------------------------------------------------

    def get_base_dist(self):
        """Not available: a mixture is not an invertible transform of one base distribution.
        Use :meth:`get_posterior`."""
        raise NotImplementedError(
            "AutoGaussianMixture has no base distribution and transform (a mixture is not a "
            "bijective transform of one distribution); use get_posterior(params)"
        )

    def get_transform(self, params):
        """Not available; see :meth:`get_base_dist`."""
        self.get_base_dist()

    def get_posterior(self, params):
        """The :class:`~numpyro_gmm.GaussianMixture` over the unconstrained latent vector
        (event shape ``(latent_dim,)``) at the given parameters."""
        return handlers.substitute(self._get_posterior, params)()

    def median(self, params):
        """A mixture has no single median; this returns the **mean of the most probable
        component** (largest weight; the first on ties), unpacked and mapped to constrained
        space per site. For a well-separated mixture it is the location of the heaviest mode.
        """
        mixture = self.get_posterior(params)
        k = jnp.argmax(mixture.logits)
        return self._unpack_and_constrain(mixture.loc[k], params)

    def quantiles(self, params, quantiles):
        """Marginal quantiles of the mixture, coordinate by coordinate.

        For each coordinate ``j`` of the unconstrained latent vector, ``x_j(q)`` solves
        ``F_j(x) = sum_k w_k Phi((x - mu_kj) / sigma_kj) = q`` (``sigma_kj`` the marginal
        standard deviation of component ``k``), found by bisection on
        ``[min_k mu_kj - 40 sigma_kj, max_k mu_kj + 40 sigma_kj]`` to the dtype's
        resolution. Each site's coordinates are then mapped to constrained space with the
        site's transform. For element-wise increasing transforms (``exp``, ``sigmoid``,
        affine, ...) the result is exactly the marginal quantile of the constrained variable;
        for vector transforms (simplex, correlation, Cholesky factors) it is the transform of
        the unconstrained marginal quantiles, as in ``AutoMultivariateNormal.quantiles``.

        :param params: the guide's parameters.
        :param quantiles: array-like of levels in ``(0, 1)``.
        :return: dict site name -> array of shape ``(len(quantiles),) + site shape``.
        """
        q = jnp.asarray(quantiles)
        if q.ndim != 1:
            raise ValueError(f"quantiles must be a 1-D array of levels in (0, 1), got shape {q.shape}")
        mixture = self.get_posterior(params)
        locs = mixture.loc  # (K, d)
        sd = mixture.component_stddev  # sqrt(diag Sigma_k), (K, d); no d x d for diag / lowrank
        weights = mixture.probs  # (K,)
        q = q.astype(locs.dtype)
        latent = _mixture_marginal_quantiles(weights, locs, sd, q)  # (Q, d)
        return self._unpack_and_constrain(latent, params)


def _mixture_marginal_quantiles(weights, locs, sd, q, num_iter: int = 100):
    """Bisection for ``sum_k w_k Phi((x - locs[k]) / sd[k]) = q``; returns ``(Q, d)``."""
    lo = jnp.min(locs - 40.0 * sd, axis=0)  # (d,)
    hi = jnp.max(locs + 40.0 * sd, axis=0)
    lo = jnp.broadcast_to(lo, q.shape + lo.shape)
    hi = jnp.broadcast_to(hi, q.shape + hi.shape)
    target = q[:, None]

    def cdf(x):  # x (Q, d)
        return jnp.sum(weights[:, None, None] * ndtr((x[None] - locs[:, None]) / sd[:, None]), axis=0)

    def body(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < target
        return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

    lo, hi = jax.lax.fori_loop(0, num_iter, body, (lo, hi))
    return 0.5 * (lo + hi)
