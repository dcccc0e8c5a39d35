"""AutoGaussianMixture: an autoguide whose posterior over the unconstrained latent vector
is a Gaussian mixture."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.scipy.special import ndtr
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.infer.autoguide import AutoContinuous
from numpyro.infer.initialization import init_to_uniform

from ._validation import check_int
from .distribution import GaussianMixture
from .entropy import DEFAULT_METHOD

__all__ = ["AutoGaussianMixture"]

_COVARIANCES = ("full", "diag")


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


class AutoGaussianMixture(AutoContinuous):
    r"""Autoguide whose posterior over the unconstrained latent vector is a
    :class:`~numpyro_gmm.GaussianMixture` of ``num_components`` Gaussians.

    Like :class:`numpyro.infer.autoguide.AutoMultivariateNormal` it ravels every latent
    site of the model into one unconstrained vector of size ``latent_dim``, samples it at
    the auxiliary site ``_{prefix}_latent`` and emits a ``Delta`` per model site carrying
    the log-Jacobian of the constraining transform. Train it with
    :class:`~numpyro_gmm.TraceEntropy_ELBO`: under ``Trace_ELBO`` the mixture weights get no
    useful gradient (sampling the component index is not reparameterisable).

    The ELBO is multimodal in the guide's parameters: components that start in the basin
    of the same posterior mode tend to stay in it (only the entropy term pushes them
    apart). Start them where they can reach different modes (``init_loc_fn``,
    ``init_spread``) or compare several runs.

    Parameters (constrained values in ``svi.get_params``):

    * ``{prefix}_logits`` ``(K,)``, initialised to zeros (equal weights);
    * ``{prefix}_locs`` ``(K, latent_dim)``: the initial location from ``init_loc_fn`` plus
      deterministic centred offsets of root-mean-square norm ``init_spread`` (default
      ``3 * init_scale``): for ``K <= latent_dim + 1`` the vertices of a regular simplex
      in a subspace rotated by a fixed seed (all components equally far apart), otherwise
      centred draws from a fixed seed. The components do not coincide and the mixture's
      mean stays at the initial location;
    * ``{prefix}_scale_tril`` ``(K, latent_dim, latent_dim)`` (``covariance="full"``,
      constraint ``scaled_unit_lower_cholesky``) initialised to ``init_scale * I``, or
      ``{prefix}_scale`` ``(K, latent_dim)`` (``covariance="diag"``, positive) initialised
      to ``init_scale``.

    :param model: a NumPyro model with continuous latent variables (no local latents).
    :param int num_components: ``K >= 1``.
    :param str covariance: ``"full"`` or ``"diag"``.
    :param init_loc_fn: per-site initialisation strategy (see ``numpyro.infer.initialization``).
    :param float init_scale: initial standard deviation of every component, ``> 0``.
    :param float init_spread: root-mean-square distance of the initial component means from
        the initial location, ``>= 0``; default ``3 * init_scale``.
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
        init_loc_fn=init_to_uniform,
        init_scale: float = 0.1,
        init_spread: float | None = None,
        prefix: str = "auto",
        entropy_method: str = DEFAULT_METHOD,
        entropy_order: int | None = None,
    ):
        self.num_components = check_int("num_components", num_components, 1)
        if covariance not in _COVARIANCES:
            raise ValueError(f"covariance must be one of {_COVARIANCES}, got {covariance!r}")
        self.covariance = covariance
        if not (np.ndim(init_scale) == 0 and float(init_scale) > 0):
            raise ValueError(f"init_scale must be a positive scalar, got {init_scale!r}")
        self._init_scale = float(init_scale)
        if init_spread is None:
            init_spread = 3.0 * self._init_scale
        if not (np.ndim(init_spread) == 0 and float(init_spread) >= 0):
            raise ValueError(f"init_spread must be a non-negative scalar, got {init_spread!r}")
        self._init_spread = float(init_spread)
        if not isinstance(entropy_method, str):
            raise ValueError(f"entropy_method must be a str, got {entropy_method!r}")
        self.entropy_method = entropy_method
        self.entropy_order = None if entropy_order is None else check_int("entropy_order", entropy_order, 1)
        super().__init__(model, prefix=prefix, init_loc_fn=init_loc_fn)

    # -- parameters -----------------------------------------------------------------------

    def _init_component_locs(self):
        offsets = _spread_directions(self.num_components, self.latent_dim) * self._init_spread
        return self._init_latent + jnp.asarray(offsets, dtype=jnp.result_type(self._init_latent))

    def _make_mixture(self, logits, locs, factor):
        kwargs = {"entropy_method": self.entropy_method, "entropy_order": self.entropy_order}
        if self.covariance == "full":
            return GaussianMixture(locs, scale_tril=factor, logits=logits, **kwargs)
        return GaussianMixture(locs, scale=factor, logits=logits, **kwargs)

    def _get_posterior(self):
        K, d = self.num_components, self.latent_dim
        dtype = jnp.result_type(self._init_latent)
        logits = numpyro.param(f"{self.prefix}_logits", jnp.zeros(K, dtype))
        locs = numpyro.param(f"{self.prefix}_locs", self._init_component_locs())
        if self.covariance == "full":
            factor = numpyro.param(
                f"{self.prefix}_scale_tril",
                jnp.broadcast_to(jnp.eye(d, dtype=dtype) * self._init_scale, (K, d, d)),
                constraint=constraints.scaled_unit_lower_cholesky,
            )
        else:
            factor = numpyro.param(
                f"{self.prefix}_scale",
                jnp.full((K, d), self._init_scale, dtype),
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
        sd = jnp.linalg.norm(mixture.scale_tril, axis=-1)  # sqrt(diag(L L^T)), (K, d)
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
