"""An ELBO for guides with one Gaussian-mixture site: stratified over the components,
with the mixture's entropy from :meth:`GaussianMixture.entropy`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpyro.distributions import Delta, ExpandedDistribution, Independent, MaskedDistribution
from numpyro.distributions.util import scale_and_mask
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer.elbo import ELBO
from numpyro.infer.util import compute_log_probs
from numpyro.util import _validate_model, check_model_guide_match

from ._kernels import prng
from ._kernels.gaussian import tril_solve
from ._validation import check_int
from .distribution import GaussianMixture

__all__ = ["TraceEntropy_ELBO"]

#: Entropy estimators whose points :class:`TraceEntropy_ELBO` shifts randomly per step.
RANDOMIZABLE_METHODS = ("auto", "mixing_qmc")

#: Points per component of the randomised entropy rule inside :class:`TraceEntropy_ELBO`
#: (``num_entropy_points``; benchmarks/svi_entropy_points.py). The deterministic
#: ``GaussianMixture.entropy()`` keeps ``DEFAULT_NUM_POINTS = 1024``.
DEFAULT_NUM_ENTROPY_POINTS = 16


def _wraps_gaussian_mixture(fn) -> bool:
    """Whether ``fn`` is a GaussianMixture, possibly expanded, masked or made independent."""
    while True:
        if isinstance(fn, GaussianMixture):
            return True
        if isinstance(fn, (ExpandedDistribution, MaskedDistribution, Independent)):
            fn = fn.base_dist
            continue
        return False


def _undrawn_mixture(site):
    """``substitute_fn`` of the guide's first run: the mixture's mean for every
    Gaussian-mixture site, so the run does not draw from the mixture. That draw is never
    used (the ELBO draws from every component itself): XLA drops it from the compiled step,
    but it was traced and lowered at every compilation."""
    if site["type"] == "sample" and not site["is_observed"] and _wraps_gaussian_mixture(site["fn"]):
        fn = site["fn"]
        return jnp.broadcast_to(fn.mean, fn.shape(site["kwargs"].get("sample_shape", ())))
    return None


def _find_mixture_site(guide_trace):
    """Name of the one supported GaussianMixture site of the guide, or None.

    Raises ``ValueError`` for the structures :class:`TraceEntropy_ELBO` does not support.
    """
    found = []
    for name, site in guide_trace.items():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        fn = site["fn"]
        if not _wraps_gaussian_mixture(fn):
            continue
        if not isinstance(fn, GaussianMixture) or fn.batch_shape != () or site["cond_indep_stack"]:
            raise ValueError(
                f"TraceEntropy_ELBO supports a GaussianMixture guide site only with an empty "
                f"batch shape, outside any plate, and neither masked nor expanded; site "
                f"{name!r} has distribution {type(fn).__name__} with batch_shape "
                f"{tuple(fn.batch_shape)} inside plates "
                f"{[f.name for f in site['cond_indep_stack']]}. Stratifying a batch of B "
                "mixtures would need K**B model evaluations; put the latent variables of "
                "the plate into one mixture over their joint vector instead (as "
                "AutoGaussianMixture does)."
            )
        if jnp.shape(site["value"]) != tuple(fn.event_shape):
            raise ValueError(
                f"TraceEntropy_ELBO needs one draw from the GaussianMixture site {name!r}: "
                f"value shape {jnp.shape(site['value'])}, expected the event shape "
                f"{tuple(fn.event_shape)} (no sample_shape)"
            )
        found.append(name)
    if len(found) > 1:
        raise ValueError(
            f"TraceEntropy_ELBO supports at most one GaussianMixture guide site, found "
            f"{len(found)}: {found}. Stratifying several mixtures would need the product of "
            "their component counts in model evaluations; join them into one mixture over "
            "the concatenated latent vector."
        )
    return found[0] if found else None


def _check_guide_sites(guide_trace, mixture_name):
    for name, site in guide_trace.items():
        if site["type"] == "mutable":
            raise ValueError(
                f"TraceEntropy_ELBO does not support mutable state (guide site {name!r}); use Trace_ELBO"
            )
        if site["type"] != "sample" or site["is_observed"] or name == mixture_name:
            continue
        fn = site["fn"]
        if not fn.has_rsample:
            kind = "discrete" if fn.support.is_discrete else "not reparameterisable"
            hint = (
                " Use numpyro_gmm.GaussianMixture for a Gaussian-mixture guide site."
                if hasattr(fn, "mixing_distribution")
                else ""
            )
            raise ValueError(
                f"TraceEntropy_ELBO needs reparameterised guide sites; site {name!r} "
                f"({type(fn).__name__}) is {kind}.{hint}"
            )


def _negative_log_q(site):
    """``-log q`` at the sampled value, scaled and masked like Trace_ELBO does."""
    fn, value = site["fn"], site["value"]
    if site["intermediates"]:
        log_prob = fn.log_prob(value, site["intermediates"])
    else:
        log_prob = fn.log_prob(value)
    return -jnp.sum(scale_and_mask(log_prob, site["scale"]))


def _entropy_term(site):
    """The site's contribution to ``-log q``: its analytic entropy when it has one,
    ``-log q`` at the sample otherwise. Delta sites (the log-Jacobian terms of autoguides)
    and observed guide sites always use ``-log q`` at the value, which is exact."""
    fn = site["fn"]
    if site["is_observed"] or isinstance(fn, (Delta, MaskedDistribution)):
        return _negative_log_q(site)
    try:
        entropy = fn.entropy()
    except NotImplementedError:
        return _negative_log_q(site)
    # one entropy per draw: broadcast over any sample_shape of the site's value
    value_batch = jnp.shape(site["value"])[: jnp.ndim(site["value"]) - len(fn.event_shape)]
    entropy = jnp.broadcast_to(entropy, value_batch)
    return jnp.sum(scale_and_mask(entropy, site["scale"]))


def component_draws(mixture: GaussianMixture, key, common: bool):
    """One reparameterised draw from every component of an unbatched mixture: ``(K, d)``.

    ``common=True``: one standard normal vector for all components (common random numbers),
    ``z_k = mu_k + L_k eps`` (diagonal: ``mu_k + s_k * eps``; low rank:
    ``mu_k + W_k eps_W + sqrt(D_k) * eps_D``, NumPyro's ``LowRankMultivariateNormal`` draw).
    Each ``z_k`` is still exactly ``N(mu_k, Sigma_k)``, so every component's term of the
    ELBO keeps its distribution, and the sum its expectation; only the joint law of the
    ``K`` terms changes: components that share a shape (a Gaussian block of the posterior
    that every component covers alike) see the same noise there, so the differences of
    their terms, which drive the weights, lose it. ``common=False``: independent draws
    (``component_distribution.rsample``'s ``K`` standard normal vectors)."""
    return draws_and_control_variates(mixture, key, common)[0]


def draws_and_control_variates(mixture: GaussianMixture, key, common: bool):
    r"""``(z (K, d), c (K,))``: :func:`component_draws` and, at each component's own draw,

    .. math::

        c_k = \ln N_k(z_k) + H[N_k] = \tfrac d2 - \tfrac12 |L_k^{-1} (z_k - \mu_k)|^2,

    which has mean zero under ``z_k ~ N_k`` (minus half a chi-square with ``d`` degrees of
    freedom, plus its mean), from the draw's own standard normal vectors. Diagonal and full
    components: ``|eps|^2``. Low rank, ``z = mu + W eps_W + sqrt(D) * eps_D`` (NumPyro's
    draw): the Mahalanobis distance is ``|e|^2`` for ``e = (eps_W, eps_D)`` less the part of
    ``e`` in the null space of ``[W, sqrt(D)]``, spanned by ``N = [I_r; -D^{-1/2} W]``:
    ``|e|^2 - v^T C^{-1} v`` with ``v = N^T e = eps_W - W^T (eps_D / sqrt(D))`` and
    ``C = N^T N = I_r + W^T D^{-1} W``, the capacitance matrix (``O(d r + r^3)``, no ``d x d``
    matrix)."""
    loc = mixture.loc
    K, d = loc.shape
    if mixture.is_lowrank:
        w, sd = mixture.cov_factor, jnp.sqrt(mixture.cov_diag)
        r = w.shape[-1]
        eps = jnp.broadcast_to(prng.normal(key, (r + d,) if common else (K, r + d), loc.dtype), (K, r + d))
        eps_w, eps_d = eps[:, :r], eps[:, r:]
        z = mixture._component_draws(eps)
        v = eps_w - jnp.einsum("kdr,kd->kr", w, eps_d / sd)
        u = tril_solve(mixture.component_distribution._capacitance_tril, v)  # C = L L^T: v^T C^-1 v = |L^-1 v|^2
        sq = jnp.sum(jnp.square(eps_w), -1) + jnp.sum(jnp.square(eps_d), -1) - jnp.sum(jnp.square(u), -1)
        return z, 0.5 * d - 0.5 * sq
    eps = jnp.broadcast_to(prng.normal(key, (d,) if common else (K, d), loc.dtype), (K, d))
    return mixture._component_draws(eps), jnp.broadcast_to(0.5 * d - 0.5 * jnp.sum(jnp.square(eps), -1), (K,))


def _frozen(mixture: GaussianMixture, but_weights: bool = False) -> GaussianMixture:
    """``mixture`` with its parameters behind a stop-gradient (``but_weights``: all but the
    weights)."""
    keep = mixture.mixing_distribution if but_weights else None
    return jax.tree.map(lambda x: x if x is keep else jax.lax.stop_gradient(x), mixture, is_leaf=lambda x: x is keep)


def _guide_entropy_terms(guide_trace, skip=None):
    total = jnp.zeros(())
    for name, site in guide_trace.items():
        if site["type"] == "sample" and name != skip:
            total = total + _entropy_term(site)
    return total


class TraceEntropy_ELBO(ELBO):
    r"""ELBO with a stratified, score-function-free treatment of a Gaussian-mixture guide.

    The objective is :math:`\mathcal L = \mathbb E_q[\log p(x, z)] + H[q]`. When the guide
    has one :class:`~numpyro_gmm.GaussianMixture` site :math:`z \sim q(z) = \sum_k w_k
    \mathcal N(z; \mu_k, \Sigma_k)` followed by other sites :math:`y \sim q(y \mid z)`,

    .. math::

        \mathcal L = H[q(z)] + \sum_{k=1}^K w_k\,
        \mathbb E_{\varepsilon}\Big[\log p(x, z_k, y_k) + H\big[q(y \mid z_k)\big]\Big],
        \qquad z_k = \mu_k + L_k \varepsilon_k,\; y_k \sim q(y \mid z_k),

    (Morningstar, Vikram, Ham, Gallagher, Dillon, *Automatic differentiation variational
    inference with mixtures*, AISTATS 2021, arXiv:2003.01687). Each particle draws one
    reparameterised sample from *every* component, runs the guide and the model once per
    component (a ``vmap`` over ``K``) and weights the model terms by ``w = softmax(logits)``:
    the weights get exact gradients without a score function, and ``H[q(z)]`` comes from
    ``GaussianMixture.entropy(**entropy_options)`` (an approximation whose accuracy is the
    entropy estimator's; see :mod:`numpyro_gmm.entropy`). The other guide sites of a
    component's run share one random key across components (common random numbers; the
    components' own draws are independent unless ``common_component_noise``).

    The entropy term of a guide site other than the mixture is

    * its analytic ``entropy()`` when the distribution has one (``Normal``,
      ``MultivariateNormal``, ``Independent``, ``ExpandedDistribution`` of those, ...),
      multiplied by the site's scale;
    * ``-log q`` at the sampled value otherwise, and always for ``Delta`` sites (whose
      ``log_density`` is the log-Jacobian of the constrained latents that autoguides such as
      ``AutoContinuous`` emit: this term is exact, as in ``Trace_ELBO``), for masked sites
      and for observed guide sites.

    **The weights' gradient.** Per particle it is :math:`\partial \mathcal L / \partial
    \text{logit}_j = w_j (L_j - \sum_k w_k L_k) + \partial H / \partial \text{logit}_j`,
    :math:`L_k` the component's term above. The noise of :math:`L_k` moves the weights, and
    it is large where it says nothing about the modes: a component that fits its mode has
    :math:`\log p(z_k)` varying like :math:`\log \mathcal N_k(z_k)`, by about
    :math:`\sqrt{d/2}` nats. With ``weight_control_variate`` (the default) the weights'
    gradient uses :math:`L_k - c_k` instead, with the zero-mean control variate

    .. math::

        c_k = \ln \mathcal N_k(z_k) + H[\mathcal N_k]
            = \tfrac d2 - \tfrac12 |\varepsilon_k|^2, \qquad z_k = \mu_k + L_k \varepsilon_k,

    through the objective :math:`\sum_k \bar w_k L_k + (w_k - \bar w_k)\, \overline{L_k - c_k}`
    (the bar: stop-gradient). Its value is the one above and so are the gradients of all
    parameters but the weights; the weights' expected gradient is unchanged
    (:math:`\mathbb E[c_k] = 0`, ``c_k`` not depending on them); and where the posterior
    around component ``k``'s mode is that Gaussian up to a constant factor, :math:`L_k -
    c_k` is that constant's logarithm: no noise at all (the idea of Roeder, Wu and Duvenaud,
    *Sticking the landing*, NeurIPS 2017, applied to the weights only). For a Gaussian
    posterior :math:`\mathcal N(m, \Sigma)` around the mode and a component
    :math:`\mathcal N(m, s^2 \Sigma)`, :math:`\operatorname{Var} L_k = s^4 d / 2` and
    :math:`\operatorname{Var}(L_k - c_k) = (1 - s^2)^2 d / 2`: lower for :math:`s^2 > 1/2`,
    zero at the fit :math:`s = 1`, higher for components much narrower than the posterior
    (e.g. ``init_method="spread"``'s ``init_scale = 0.1`` before the scales have grown); for
    a diagonal component at the mean-field optimum the variance falls by exactly
    :math:`d / 2` (with :math:`\Lambda = \Sigma^{-1}` and the component's variances
    :math:`1 / \Lambda_{ii}`, :math:`L_k - c_k` is the off-diagonal part of the quadratic
    form, uncorrelated with the diagonal part). The default initialisation of
    :class:`~numpyro_gmm.AutoGaussianMixture` starts the components at fits of their modes.
    No model evaluation is added, and nothing measurable to the step (CPU time per step of
    AutoGaussianMixture(K = 4) on ``z ~ N(0, I_d)``, without / with: low rank, rank 4,
    ``d = 100`` 0.40 / 0.37 ms, ``d = 1000`` 2.14 / 2.14 ms; diagonal ``d = 1000`` 0.61 /
    0.59 ms; full ``d = 100`` 1.50 / 1.50 ms). With common draws (``common_component_noise``
    ``True`` or ``"weights"``) the diagonal and full components' ``c_k`` are one number for
    all ``k``, which cancels from ``L_j - sum_k w_k L_k``: there the control variate changes
    nothing. Measured with ``benchmarks/posteriors.py`` (AutoGaussianMixture
    defaults, ``Adam(0.02)``, 3000 steps, 10 seeds; median / largest mode-mass error
    without -> with): ``bimodal_gauss`` 0.021 / 0.044 -> 0.013 / 0.021, ``four_modes``
    0.017 / 0.029 -> 0.006 / 0.016, ``label_switching`` 0.014 / 0.037 -> 0.006 / 0.015,
    ``coupled_d10`` 0.018 / 0.047 -> 0.009 / 0.027, ``unequal`` 0.013 / 0.039 -> 0.007 /
    0.011, ``d50`` 0.011 / 0.063 -> 0.014 / 0.035, ``iris`` 0.025 / 0.042 -> 0.010 / 0.017;
    the final ELBOs equal within 0.01 nats.

    **The components' gradient** (``path_gradient``, the default). The gradient of the
    components' parameters :math:`\phi` (means and factors) is the path derivative

    .. math::

        \sum_k \bar w_k\, \nabla_z \big[\log p(x, z) - \log \bar q(z)\big]_{z = z_k}
        \frac{\partial z_k}{\partial \phi}

    (:math:`\bar q`: the mixture's density with its parameters behind a stop-gradient), in
    place of the reparameterised gradient of the model terms plus the exact gradient of
    the entropy approximation. Both are unbiased for the ELBO's gradient: the difference is
    :math:`\sum_k w_k \mathbb E_{\mathcal N_k}[\nabla_\phi \log q(z)] = \mathbb E_q[\nabla_\phi
    \log q] = \nabla_\phi \int q = 0` (Roeder, Wu and Duvenaud, *Sticking the landing*,
    NeurIPS 2017, whose estimator this is, with the stratified draws of one sample per
    component). Where the posterior around component ``k`` is that component's Gaussian up
    to a constant factor, :math:`\log p - \log q` is constant there and the path derivative
    is zero for every draw: the components stop moving at an exact fit instead of
    wandering in the one-particle noise of :math:`\log p(z_k)`, which the entropy's
    gradient does not cancel. The entropy approximation then only gives the value and the
    weights' gradient (the components' parameters behind a stop-gradient), and the value
    and the weights' gradient are those of ``path_gradient=False`` for the same key. Cost:
    the mixture's log density at the ``K`` draws and its gradient, ``O(K^2 d^2)`` (full),
    ``O(K^2 d)`` (diagonal), ``O(K^2 d r)`` (low rank), in place of the entropy's own
    gradient in the components. Measured (``benchmarks/path_gradient.py``: Gaussian targets,
    ``log Z = 0``, ``Adam(0.02)``, ELBO by 256 particles, means of 3 seeds, without / with
    it after 3000 steps): ``z ~ N(0, I_d)`` from the default initialisation (nearly exact),
    full components -1.315 / 0.047 at ``d = 100`` and -7.975 / -0.599 at ``d = 500``
    (starting from -0.952: without it the fit got worse at every checkpoint), diagonal
    -0.630 / 0.078 and -4.206 / -0.038 (from 0.115 and -2.203); a correlated Gaussian from ``init_method="spread"``,
    -0.167 / 0.067 at ``d = 10`` and -2.178 / -0.079 at ``d = 50`` (values above 0 are the
    evaluation's own noise). On the seven models of ``benchmarks/posteriors.py`` (10 seeds,
    3000 steps): energy distance to the reference without / with it ``bimodal_gauss``
    0.013 / 0.003, ``four_modes`` 0.003 / 0.002, ``label_switching`` 0.009 / 0.007,
    ``coupled_d10`` 0.015 / 0.014, ``unequal`` 0.003 / 0.001, ``d50`` 0.147 / 0.032,
    ``iris`` 0.056 / 0.007; ELBO higher by 0.01-0.20 nats, and by 2.8 on ``d50``; median
    mode-mass error 0.005-0.013 / 0.006-0.020, 10 of 10 seeds on every model either way.

    **The value** (``value_control_variate``, the default). One particle's value is

    .. math::

        \sum_k w_k (L_k - c_k) + H[q(z)]

    with the :math:`c_k` above: the same expectation as :math:`\sum_k w_k L_k + H[q(z)]`,
    and no gradient changes (the :math:`c_k` enter behind a stop-gradient). Near a fit it is
    far less noisy: where the posterior around component ``k`` is its Gaussian up to a
    constant factor, :math:`L_k - c_k` is that constant, while :math:`L_k` varies by about
    :math:`\sqrt{d/2}` nats. This is the number :meth:`SVI.evaluate` and the losses of
    ``SVI.run`` report, and what a comparison of fits by their ELBO rests on. Measured
    (``benchmarks/loss_noise.py``: one-particle loss over 2000 keys, AutoGaussianMixture
    defaults, ``Adam(0.02)``, standard deviation without / with it after 3000 steps):
    ``bimodal_gauss`` 0.86 / 0.09, ``label_switching`` 0.71 / 0.02, ``coupled_d10`` 1.59 /
    0.15, ``d50`` 3.53 / 0.46, ``iris`` 0.78 / 0.25; Gaussian targets, AR(1) ``d = 50`` full
    components 3.63 / 0.68, diagonal 4.57 / 2.67, ``N(0, I_100)`` diagonal 5.00 / 0.15 (and
    0.00 from the default initialisation, which is exact there); the means equal within their
    standard errors. It adds noise where the components are much
    narrower than the posterior (:math:`\operatorname{Var}(L_k - c_k) = (1 - s^2)^2 d / 2`
    against :math:`s^4 d / 2` in the Gaussian example above): ``init_method="spread"`` at
    its first step, ``bimodal_gauss`` 0.50 / 1.05, ``label_switching`` 1.05 / 1.28,
    ``N(0, I_100)`` 0.84 / 5.01; 500 steps later lower with it on every model measured. Nothing is computed for it: the
    :math:`c_k` are the weights' control variates.

    Without a mixture site the estimator is ``Trace_ELBO`` with analytic entropies.

    Supported guides: at most one ``GaussianMixture`` site, unmasked, with empty batch
    shape, outside plates and drawn once (no ``sample_shape``; an
    :class:`~numpyro_gmm.AutoGaussianMixture` guide is of this form); every other latent
    guide site reparameterisable (``has_rsample``); no mutable state. Anything else raises
    ``ValueError`` naming the site. The model may use plates, subsampling, observed data
    and ``numpyro.factor``.

    Cost: ``num_particles * K`` model evaluations per step, plus one entropy evaluation per
    particle. With ``randomize_entropy`` (the default) the entropy is the randomised mixing
    rule with ``num_entropy_points`` points per component (default
    ``DEFAULT_NUM_ENTROPY_POINTS = 16``), not the 1024 of the deterministic
    ``GaussianMixture.entropy()``: the randomised rule is unbiased, in value and gradient, at
    any number of points, so the points only set the entropy term's noise, and that noise is
    small next to the model term's, which already uses one draw per component. Measured
    (``benchmarks/svi_entropy_points.py``, float32, K = 4): the standard deviation of the
    entropy value over keys is about 0.025 nats at 16 points and 0.0015-0.0026 at 1024
    (d = 10 and 100, components about 2 standard deviations apart); the variance of the
    whole loss gradient at the guide's initial parameters is 0.2-0.7% above its 1024-point
    value at 16 points (0.3-1.5% at 8) at d = 10 and 100; final KL after 2000 Adam steps on a
    d = 10 Gaussian is the same within the seed-to-seed spread for 8, 16 and 32 points
    (docs/performance.md, "SVI: how many entropy points per step"); and the
    entropy's cost, ``O(K^2 M d r)`` (low rank) / ``O(K^2 M d)`` (diagonal) /
    ``O(K^2 M d^2)`` (full; no ``O(K d^3)`` inverse while ``K M < 2 d``, the points being
    solved by substitution: docs/performance.md, "Full covariances in high dimension"), falls
    with ``M`` down to a fixed per-call part of about 1-3 ms CPU: the d = 1000, rank-4 step fell from 68 ms CPU at
    1024 points to 2.9 ms at 16, against 0.37 ms for ``AutoLowRankMultivariateNormal``
    (same section; loaded 2-core machine). Antithetic points and i.i.d. points were measured
    not to lower the noise below that of the shifted Sobol' points, which all components
    share (common random numbers).

    :param int num_particles: number of particles (each evaluates the model ``K`` times).
    :param vectorize_particles: ``True`` (``vmap``), ``False`` (``lax.map``) or a callable,
        as for :class:`numpyro.infer.Trace_ELBO`; also used over the components.
    :param dict entropy_options: keyword arguments of ``GaussianMixture.entropy``
        (e.g. ``{"method": "legendre", "order": 6}``); by default the mixture's own
        ``entropy_method`` / ``entropy_order`` are used.
    :param bool randomize_entropy: when the entropy estimator is the mixing rule (``"auto"``,
        the default, or ``"mixing_qmc"``) and ``entropy_options`` has no ``key``, pass it a key
        derived from the step's random key (the fourth of ``random.split(key, 4)``, whose
        first three are the model's, the guide's and the component draws' keys), so that its
        points are randomly shifted each step (randomised QMC): the entropy term and its
        gradient are then unbiased and SVI follows the true ELBO's gradient in expectation. The fixed points (``False``) give a
        deterministic entropy with a small, fixed gradient bias (docs/accuracy.md,
        gradient table). Default ``True``.
    :param int num_entropy_points: points per component of that randomised rule (a power of
        2; default ``DEFAULT_NUM_ENTROPY_POINTS = 16``); an explicit ``num_points`` in
        ``entropy_options`` wins, and it is not used when the rule is not randomised (a
        ``key`` in ``entropy_options``, ``randomize_entropy=False``, or another ``method``),
        where the estimator's own default (1024 points, accuracy-certified) applies.
    :param bool weight_control_variate: use the control variate ``c_k`` above in the
        weights' gradient (default ``True``); ``False`` gives the plain stratified gradient.
    :param bool path_gradient: the components' gradient by the path derivative above
        (default ``True``); ``False``: the reparameterised gradient of the model terms plus
        the entropy approximation's gradient in the components' parameters.
    :param bool value_control_variate: report the value with the control variates ``c_k``
        subtracted (above; default ``True``); ``False``: ``sum_k w_k L_k + H``. Gradients
        are the same either way.
    :param common_component_noise: ``False``, ``True`` or ``"weights"``. ``True``: draw the
        ``K`` components' samples from one standard
        normal vector, ``z_k = mu_k + L_k eps`` (common random numbers, see
        ``numpyro_gmm.elbo.component_draws``), instead of ``K`` independent ones (default
        ``False``). Each component's term, and so the objective and every gradient, keeps
        its expectation; what changes is the joint noise: the weights' gradient
        ``w_j (L_j - sum_k w_k L_k)`` depends on the *differences* of the component terms,
        whose noise cancels where components cover a part of the posterior alike, but the
        components' means then also receive the same noise and wander together. Measured
        with ``benchmarks/posteriors.py`` (AutoGaussianMixture defaults, ``Adam(0.02)``,
        3000 steps; median mode-mass error, independent -> common): ``bimodal_gauss``
        0.022 -> 0.007 and ``coupled_d10`` 0.018 -> 0.007 (10 seeds), ``iris`` 0.016 ->
        0.004 (20 seeds), but ``d50`` 0.019 -> 0.042 with its energy distance 0.154 ->
        0.274 (20 seeds): not the default. ``"weights"``: common draws for the weights'
        gradient only. The value and the gradients of everything but the weights come from
        the independent draws; each component's term is evaluated a second time, forward
        only (no gradient through it), on common draws, and the weights' gradient uses those:
        the objective is ``sum_k sg(w_k) L_k(z_k) + (w_k - sg(w_k)) sg(L_k(z'_k))`` (``sg``:
        stop-gradient), whose value is the independent one and whose expected gradient is
        unchanged. Cost: ``K`` more forward evaluations of the model per particle. Measured
        (``benchmarks/posteriors.py --common-noise weights``, same settings, seeds 0..19;
        median / root-mean-square mode-mass error, independent -> ``"weights"``):
        ``bimodal_gauss`` 0.015 / 0.022 -> 0.008 / 0.013, ``label_switching`` 0.015 / 0.022
        -> 0.010 / 0.014, ``unequal`` 0.010 / 0.017 -> 0.008 / 0.012, ``four_modes`` 0.020 /
        0.022 -> 0.018 / 0.020, ``iris`` 0.016 / 0.114 -> 0.011 / 0.113, ``coupled_d10``
        0.019 / 0.032 -> 0.023 / 0.027, ``d50`` 0.019 / 0.023 -> 0.015 / 0.028; seed by seed
        the ``"weights"`` fit was the closer one in 9 to 12 of 20 on every model, i.e. the
        gain is within the seeds' spread, and the wall time grew by up to 23%
        (``coupled_d10``): not the default either. (These figures predate the weights'
        control variate: they were measured with ``weight_control_variate=False``.)
    """

    def __init__(
        self,
        num_particles: int = 1,
        vectorize_particles=True,
        entropy_options: dict | None = None,
        randomize_entropy: bool = True,
        num_entropy_points: int = DEFAULT_NUM_ENTROPY_POINTS,
        common_component_noise: bool | str = False,
        weight_control_variate: bool = True,
        path_gradient: bool = True,
        value_control_variate: bool = True,
    ):
        num_particles = check_int("num_particles", num_particles, 1)
        if not isinstance(randomize_entropy, bool):
            raise ValueError(f"randomize_entropy must be a bool, got {randomize_entropy!r}")
        self.randomize_entropy = randomize_entropy
        num_entropy_points = check_int("num_entropy_points", num_entropy_points, 1)
        if num_entropy_points & (num_entropy_points - 1):
            raise ValueError(f"num_entropy_points must be a power of 2 (an int >= 1), got {num_entropy_points}")
        self.num_entropy_points = num_entropy_points
        if not (isinstance(common_component_noise, bool) or common_component_noise == "weights"):
            raise ValueError(f"common_component_noise must be False, True or 'weights', got {common_component_noise!r}")
        self.common_component_noise = common_component_noise
        if not isinstance(weight_control_variate, bool):
            raise ValueError(f"weight_control_variate must be a bool, got {weight_control_variate!r}")
        self.weight_control_variate = weight_control_variate
        if not isinstance(path_gradient, bool):
            raise ValueError(f"path_gradient must be a bool, got {path_gradient!r}")
        self.path_gradient = path_gradient
        if not isinstance(value_control_variate, bool):
            raise ValueError(f"value_control_variate must be a bool, got {value_control_variate!r}")
        self.value_control_variate = value_control_variate
        if entropy_options is None:
            entropy_options = {}
        if not isinstance(entropy_options, dict):
            raise ValueError(f"entropy_options must be a dict or None, got {type(entropy_options).__name__}")
        self.entropy_options = dict(entropy_options)
        super().__init__(num_particles=num_particles, vectorize_particles=vectorize_particles)

    def _map_components(self, fn, xs):
        if self.vectorize_particles is False:
            return jax.lax.map(fn, xs)
        return jax.vmap(fn)(xs)

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        def model_term(model_key, guide_trace):
            seeded_model = seed(model, model_key)
            model_log_probs, model_trace = compute_log_probs(replay(seeded_model, guide_trace), args, kwargs, param_map)
            check_model_guide_match(model_trace, guide_trace)
            _validate_model(model_trace, plate_warning="loose")
            for name, site in model_trace.items():
                if site["type"] == "mutable":
                    raise ValueError(
                        f"TraceEntropy_ELBO does not support mutable state (model site {name!r}); use Trace_ELBO"
                    )
            return sum(model_log_probs.values(), start=jnp.zeros(()))

        def run_guide(guide_key, data=None):
            g = substitute(guide, data=param_map)
            # data: the mixture site's draw; none on the first run, which only finds the site
            g = substitute(g, substitute_fn=_undrawn_mixture) if data is None else substitute(g, data=data)
            return trace(seed(g, guide_key)).get_trace(*args, **kwargs)

        def single_particle_elbo(key):
            model_key, guide_key, eps_key, entropy_key = prng.split(key, 4)
            guide_trace = run_guide(guide_key)
            name = _find_mixture_site(guide_trace)
            _check_guide_sites(guide_trace, name)
            if name is None:
                return model_term(model_key, guide_trace) + _guide_entropy_terms(guide_trace)

            site = guide_trace[name]
            mixture = site["fn"]

            def component_elbo(z_k):
                tr = run_guide(guide_key, {name: z_k})
                return model_term(model_key, tr) + _guide_entropy_terms(tr, skip=name)

            weights = jax.nn.softmax(mixture.mixing_distribution.logits, axis=-1)
            common = self.common_component_noise
            # one reparameterised draw from every component: shape (K, d)
            z, control = draws_and_control_variates(mixture, eps_key, common is True)
            per_component = self._map_components(component_elbo, z)
            frozen = jax.lax.stop_gradient(weights)
            if self.path_gradient:
                # the components' gradient by the path derivative of ln p - ln q at their own
                # draws, the mixture's density frozen (its value: the terms' own), scaled like
                # the site's entropy
                log_q = scale_and_mask(_frozen(mixture).log_prob(z), site["scale"])
                # value sum_k w_k L_k, gradient that of sum_k w_k (L_k - ln q(z_k))
                terms = jnp.sum(frozen * (per_component - log_q)) + jax.lax.stop_gradient(jnp.sum(frozen * log_q))
                entropy = entropy_of(_frozen(mixture, but_weights=True), site, entropy_key)
            else:
                terms = jnp.sum(frozen * per_component)
                entropy = entropy_of(mixture, site, entropy_key)
            if self.value_control_variate:  # the value sum_k w_k (L_k - c_k); no gradient changes
                terms = terms - jax.lax.stop_gradient(jnp.sum(frozen * control))
            # The weights' gradient comes from other terms of the same expectation, sg(L'_k)
            # (sg: stop-gradient), everything else's from the terms above:
            # sum_k sg(w_k) L_k + (w_k - sg(w_k)) sg(L'_k), the second sum 0 in value.
            if common == "weights":  # L'_k: the terms on common draws
                z, control = draws_and_control_variates(mixture, prng.fold_in(eps_key, 1), True)
                for_weights = self._map_components(component_elbo, z)
            else:
                for_weights = per_component
            if self.weight_control_variate:
                for_weights = for_weights - control
            return terms + jnp.sum((weights - frozen) * jax.lax.stop_gradient(for_weights)) + entropy

        def entropy_of(mixture, site, key):
            options = dict(self.entropy_options)
            method = options.get("method") or mixture.entropy_method
            if self.randomize_entropy and "key" not in options and method in RANDOMIZABLE_METHODS:
                options["key"] = key
                options.setdefault("num_points", self.num_entropy_points)
            entropy = mixture.entropy(**options)
            return jnp.sum(scale_and_mask(entropy, site["scale"]))

        if self.num_particles == 1:
            elbo = single_particle_elbo(rng_key)
        else:
            keys = prng.split(rng_key, self.num_particles)
            elbo = jnp.mean(self.vectorize_particles_fn(single_particle_elbo, keys))
        return {"loss": -elbo, "mutable_state": None}
