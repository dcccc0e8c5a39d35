"""numpyro-gmm: Gaussian mixtures for NumPyro with a fast, differentiable entropy."""

from .autoguide import AutoGaussianMixture
from .compositions import num_compositions, weak_compositions
from .distribution import GaussianMixture
from .elbo import TraceEntropy_ELBO
from .entropy import (
    DEFAULT_METHOD,
    DEFAULT_NUM_POINTS,
    DEFAULT_ORDER,
    ENTROPY_METHODS,
    FLOAT32_SAFE_ORDER,
    FLOAT64_SAFE_ORDER,
    LEGENDRE_ACCURATE_MAX_DIM,
    LEGENDRE_DEFAULT_MAX_DIM,
    LOWRANK_DENSE_FLOAT32_MAX_ELONGATION,
    LOWRANK_DENSE_MAX_DIM,
    auto_entropy,
    entropy_bounds,
    huber_lower_bound,
    huber_upper_bound,
    legendre_entropy,
    lowrank_entropy_bounds,
    lowrank_mixing_qmc_entropy,
    mixing_qmc_entropy,
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
    "DEFAULT_METHOD",
    "DEFAULT_NUM_POINTS",
    "DEFAULT_ORDER",
    "ENTROPY_METHODS",
    "FLOAT32_SAFE_ORDER",
    "FLOAT64_SAFE_ORDER",
    "GaussianMixture",
    "LEGENDRE_ACCURATE_MAX_DIM",
    "LEGENDRE_DEFAULT_MAX_DIM",
    "LOWRANK_DENSE_FLOAT32_MAX_ELONGATION",
    "LOWRANK_DENSE_MAX_DIM",
    "TraceEntropy_ELBO",
    "auto_entropy",
    "entropy_bounds",
    "huber_lower_bound",
    "huber_upper_bound",
    "legendre_entropy",
    "lowrank_entropy_bounds",
    "lowrank_mixing_qmc_entropy",
    "mixing_qmc_entropy",
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
