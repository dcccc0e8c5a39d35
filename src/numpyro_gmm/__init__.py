"""numpyro-gmm: Gaussian mixtures for NumPyro with a fast, differentiable entropy."""

from .autoguide import AutoGaussianMixture
from .compositions import num_compositions, weak_compositions
from .distribution import GaussianMixture
from .elbo import TraceEntropy_ELBO
from .entropy import DEFAULT_ORDER, ENTROPY_METHODS, FLOAT32_SAFE_ORDER, legendre_entropy, mixture_entropy

__version__ = "0.1.0"

__all__ = [
    "AutoGaussianMixture",
    "DEFAULT_ORDER",
    "ENTROPY_METHODS",
    "FLOAT32_SAFE_ORDER",
    "GaussianMixture",
    "TraceEntropy_ELBO",
    "legendre_entropy",
    "mixture_entropy",
    "num_compositions",
    "weak_compositions",
]
