"""Float32 against float64 of the low-rank mixing rule on elongated, overlapping components
(``|W|^2 / D`` from 1e2 to 1e6; K = 4, d = 20, r = 2), next to the full-covariance path on
``W W^T + diag D``. ``python benchmarks/lowrank_float32.py`` (enables float64 itself)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
import jax; jax.config.update("jax_enable_x64", True)
import numpy as np, jax.numpy as jnp
from numpyro_gmm import lowrank_mixing_qmc_entropy, mixing_qmc_entropy
rng = np.random.default_rng(0)
K, d, r = 4, 20, 2
for ratio in (1e2, 1e4, 1e6):
    W0 = rng.normal(size=(d, r)) * np.sqrt(ratio / d); W = W0 * rng.uniform(0.7, 1.3, size=(K, 1, r)) + 0.1 * rng.normal(size=(K, d, r)); mu = 0.3 * rng.normal(size=(K, d)) + rng.normal(size=(K, 1)) * W0[:, 0] ; D = np.ones((K, d))
    lg = np.zeros(K)
    cov = W @ np.swapaxes(W, -1, -2) + D[..., None] * np.eye(d)
    L = np.linalg.cholesky(cov)
    h = {dt: float(lowrank_mixing_qmc_entropy(*(jnp.asarray(x, dt) for x in (lg, mu, W, D)))) for dt in (jnp.float32, jnp.float64)}
    hf = {dt: float(mixing_qmc_entropy(jnp.asarray(lg, dt), jnp.asarray(mu, dt), jnp.asarray(L, dt))) for dt in (jnp.float32, jnp.float64)}
    print(f"|W|^2/D ~ {ratio:.0e}: lowrank f32 {h[jnp.float32]:.5f} f64 {h[jnp.float64]:.5f} diff {h[jnp.float32]-h[jnp.float64]:+.2e} | full f32-f64 {hf[jnp.float32]-hf[jnp.float64]:+.2e}, lowrank-full f64 {h[jnp.float64]-hf[jnp.float64]:+.4f}")
