"""The README's example: the default entropy of N(-1, 1) and N(1, 1) (equal weights) beside
the exact value by quadrature (``scipy.stats.Mixture(...).entropy()`` and
``scipy.integrate.quad``) and the Legendre series (order 8). ``python benchmarks/readme_example.py``."""

import math
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
from scipy import integrate, stats

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
from numpyro_gmm import GaussianMixture  # noqa: E402

gm = GaussianMixture(jnp.array([[-1.0], [1.0]]), scale=jnp.ones((2, 1)))
mix = stats.Mixture([stats.Normal(mu=-1.0, sigma=1.0), stats.Normal(mu=1.0, sigma=1.0)], weights=[0.5, 0.5])


def f(x):
    p = 0.5 * (math.exp(-0.5 * (x + 1) ** 2) + math.exp(-0.5 * (x - 1) ** 2)) / math.sqrt(2 * math.pi)
    return -p * math.log(p) if p > 0 else 0.0


print(f"default gm.entropy():            {float(gm.entropy()):.4f}")
print(f"scipy.stats.Mixture.entropy():   {float(mix.entropy()):.4f}")
print(f"scipy.integrate.quad:            {integrate.quad(f, -np.inf, np.inf, epsabs=1e-12)[0]:.4f}")
print(f"method='legendre' (order 8):     {float(gm.entropy(method='legendre')):.4f}")
