"""float32 against float64: ``jax.value_and_grad`` of the default entropy for diagonal
covariances (the issue: float32 3-4x slower than float64 at d > 2). CPU time of the process
per call (``time.process_time``, best of 15: robust to other processes on a shared machine),
``GaussianMixture(...).entropy()`` (which ``vmap``s over its batch) and the pure function.
Means ``4 N(0, I) / sqrt(2)``, scales U(0.6, 1.4), logits N(0, 0.25).
``python benchmarks/float32_diag_speed.py`` (enables float64 to run both dtypes)."""

import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from numpyro_gmm import GaussianMixture, mixing_qmc_entropy  # noqa: E402


def cpu_ms(f, *a, n=15):
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(n):
        t = time.process_time()
        jax.block_until_ready(f(*a))
        ts.append(time.process_time() - t)
    return 1e3 * min(ts)


for d, K in ((5, 32), (10, 16)):
    rng = np.random.default_rng(0)
    p = 0.5 * rng.normal(size=K), 4.0 * rng.normal(size=(K, d)) / np.sqrt(2), rng.uniform(0.6, 1.4, (K, d))
    for dt in (jnp.float32, jnp.float64):
        lg, m, s = (jnp.asarray(x, dt) for x in p)
        fs = {"GaussianMixture.entropy": lambda lg, m, s: GaussianMixture(m, scale=s, logits=lg).entropy(),
              "mixing_qmc_entropy": lambda lg, m, s: mixing_qmc_entropy(lg, m, scale=s)}
        for name, f in fs.items():
            t = cpu_ms(jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2))), lg, m, s)
            print(f"d={d} K={K} {np.dtype(dt).name} {name}: value_and_grad {t:.1f} ms CPU", flush=True)
