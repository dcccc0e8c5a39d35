"""Up to which order is the Legendre entropy safe in float32, and which order should be the default?

For a fixed set of 1-D, 2-D and 3-D mixtures, prints for each order N:
  * max |H_float32 - H_float64| (the float32 cancellation error),
  * max |H_float64 - truth| for the 1-D (scipy.stats.Mixture) and 2-D (dense quadrature) cases,
  * the number of compositions at K = 8 (cost).
The float32-safe order is the largest N whose float32 error stays below 1e-3 nats on every case.

Run: python benchmarks/float32_order.py [--max-order 14]
"""

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import reference  # noqa: E402

from numpyro_gmm import legendre_entropy, num_compositions  # noqa: E402


def cases():
    rng = np.random.default_rng(1)
    out = [
        ("1d 2c sep2", [0.5, 0.5], [[-1.0], [1.0]], [[[1.0]], [[1.0]]]),
        ("1d 2c unequal", [0.2, 0.8], [[0.0], [3.0]], [[[0.25]], [[2.25]]]),
        ("1d 4c sep3.3", [0.25] * 4, [[-3.0], [-1.0], [1.0], [3.0]], [[[0.36]]] * 4),
        ("1d 3c", [0.3, 0.3, 0.4], [[-4.0], [0.0], [4.0]], [[[1.0]], [[0.49]], [[1.44]]]),
        ("2d 2c", [0.5, 0.5], [[-1.5, 0], [1.5, 0]], [np.eye(2)] * 2),
        ("2d 3c", [0.2, 0.3, 0.5], [[-3, 0], [0, 3], [3, 0]], [np.eye(2) * 0.5, [[1, -0.4], [-0.4, 1]], np.eye(2)]),
    ]
    for K in (4, 8):
        A = rng.normal(size=(K, 2, 2)) * 0.5
        out.append((f"2d {K}c random", rng.dirichlet(np.ones(K)), 2.0 * rng.normal(size=(K, 2)), A @ A.transpose(0, 2, 1) + 0.3 * np.eye(2)))
    A = rng.normal(size=(3, 3, 3)) * 0.5
    out.append(("3d 3c random", [0.3, 0.3, 0.4], 1.5 * rng.normal(size=(3, 3)), A @ A.transpose(0, 2, 1) + 0.5 * np.eye(3)))
    return [(n, np.asarray(w, float), np.asarray(m, float), np.asarray(S, float)) for n, w, m, S in out]


def truth(w, m, S):
    d = m.shape[1]
    if d == 1:
        return reference.entropy_1d_scipy(w, m[:, 0], np.sqrt(S[:, 0, 0]))
    if d == 2:
        return reference.entropy_2d_quadrature(w, m, S)
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-order", type=int, default=14)
    args = p.parse_args(argv)
    cs = cases()
    truths = [truth(w, m, S) for _, w, m, S in cs]
    import warnings

    print(f"{'order':>5} | {'max |f32 - f64|':>15} | {'max |f64 - truth| (1-D/2-D)':>28} | {'compositions K=8':>16}")
    print("-" * 75)
    for order in range(1, args.max_order + 1):
        f32_err, true_err = 0.0, 0.0
        for (_, w, m, S), t in zip(cs, truths):
            L = np.linalg.cholesky(S)
            h64 = float(legendre_entropy(jnp.log(w), m, L, order=order))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # beyond the safe order float32 warns, by design
                h32 = legendre_entropy(*(jnp.asarray(x, jnp.float32) for x in (np.log(w), m, L)), order=order)
            assert h32.dtype == jnp.float32
            f32_err = max(f32_err, abs(float(h32) - h64))
            if t is not None:
                true_err = max(true_err, abs(h64 - t))
        comps = sum(num_compositions(n, 8) for n in range(2, order + 2))
        print(f"{order:>5} | {f32_err:>15.2e} | {true_err:>28.4f} | {comps:>16,}")


if __name__ == "__main__":
    main()
