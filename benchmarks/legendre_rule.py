"""Can a cheap per-mixture quantity tell where the Legendre series (order 8, paper's ``a``) is
within 0.01 nats? 1-D sweeps against SciPy's ``stats.Mixture`` entropy (quadrature):
one Gaussian (orders 6..12), two unit Gaussians at separations 0..10, and a wide and a narrow
concentric component at scale ratios 1.5..1000; for each, ``ln a - ln max p`` (the paper's
bound over the highest mode found, ``_kernels/modes.py``) and the mixing rule's error.
``python benchmarks/legendre_rule.py`` (float64)."""

import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.nn import log_softmax  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))
from reference import entropy_1d_scipy  # noqa: E402

from numpyro_gmm import legendre_entropy, mixing_qmc_entropy  # noqa: E402
from numpyro_gmm._kernels import modes  # noqa: E402


def gap(lg, locs, sc):
    lw = log_softmax(jnp.asarray(lg))
    d = locs.shape[1]
    la = jax.scipy.special.logsumexp(lw - jnp.sum(jnp.log(sc), 1) - 0.5 * d * np.log(2 * np.pi))
    return float(la - modes.log_max_density(lw, jnp.asarray(locs), None, jnp.asarray(sc)))


h1 = 0.5 * np.log(2 * np.pi * np.e)
print("one 1-D Gaussian, Legendre error by order:",
      ", ".join(f"{o}: {float(legendre_entropy(np.zeros(1), np.zeros((1, 1)), scale=np.ones((1, 1)), order=o)) - h1:+.4f}"
                for o in (6, 8, 10, 12)))
print("| mixture | ln a - ln max p | legendre 8 error | mixing_qmc error |")
print("|---|---|---|---|")
for sep in (0, 0.5, 1, 2, 3, 4, 6, 10):
    lg, locs, sc = np.zeros(2), np.array([[-sep / 2], [sep / 2]]), np.ones((2, 1))
    t = entropy_1d_scipy([0.5, 0.5], locs[:, 0], sc[:, 0])
    print(f"| two unit Gaussians {sep} apart | {gap(lg, locs, sc):.3f} | "
          f"{float(legendre_entropy(lg, locs, scale=sc)) - t:+.4f} | {float(mixing_qmc_entropy(lg, locs, scale=sc)) - t:+.5f} |")
for r in (1.5, 3, 10, 100, 1000):
    lg, locs, sc = np.zeros(2), np.zeros((2, 1)), np.array([[1.0], [1 / r]])
    t = entropy_1d_scipy([0.5, 0.5], locs[:, 0], sc[:, 0])
    print(f"| concentric, scale ratio {r} | {gap(lg, locs, sc):.3f} | "
          f"{float(legendre_entropy(lg, locs, scale=sc)) - t:+.4f} | {float(mixing_qmc_entropy(lg, locs, scale=sc)) - t:+.5f} |")
