"""numpyro-gmm: Gaussian mixtures for NumPyro with a fast, differentiable entropy."""

from .autoguide import AutoGaussianMixture
from .compositions import num_compositions, weak_compositions
from .distribution import GaussianMixture
from .elbo import TraceEntropy_ELBO
from .entropy import (
    DEFAULT_ORDER,
    ENTROPY_METHODS,
    FLOAT32_SAFE_ORDER,
    entropy_bounds,
    gamma_entropy,
    huber_lower_bound,
    huber_upper_bound,
    legendre_entropy,
    mixture_entropy,
    moment_matched_upper_bound,
    monte_carlo_entropy,
    normalized_legendre_entropy,
    pairwise_bhattacharyya_lower_bound,
    pairwise_kl_upper_bound,
    taylor_entropy,
)

__version__ = "0.1.0"

__all__ = [
    "AutoGaussianMixture",
    "DEFAULT_ORDER",
    "ENTROPY_METHODS",
    "FLOAT32_SAFE_ORDER",
    "GaussianMixture",
    "TraceEntropy_ELBO",
    "entropy_bounds",
    "gamma_entropy",
    "huber_lower_bound",
    "huber_upper_bound",
    "legendre_entropy",
    "mixture_entropy",
    "moment_matched_upper_bound",
    "monte_carlo_entropy",
    "normalized_legendre_entropy",
    "num_compositions",
    "pairwise_bhattacharyya_lower_bound",
    "pairwise_kl_upper_bound",
    "taylor_entropy",
    "weak_compositions",
]
