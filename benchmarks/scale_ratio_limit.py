"""How large a ratio of standard deviations between components the default entropy takes.

Two concentric components with weights 1/2, standard deviations ``1 / sqrt(rho)`` and
``sqrt(rho)`` per axis (so ``rho`` is their ratio), the wide one's mean moved by half its
scale. As ``rho`` grows each component's density is negligible where the other's mass is,
and the entropy tends to the separated-components limit ``H(w) + sum_k w_k H_k`` (closed form;
its error falls like ``rho^-d``, below 1e-8 nats from ``rho = 1e8`` here). Printed: the
default ``entropy()`` (the fixed rule), the ELBO's randomised rule (16 points, one key) and
the gradient of the latter's value in a common factor of the scales (``d``, exactly, by
``H(c X) = H(X) + d ln c``), for diagonal, full and low-rank components, in the dtype of the
run (``JAX_ENABLE_X64=1`` for float64).

Usage::

    python benchmarks/scale_ratio_limit.py [--dims 1,3] [--exponents 8,12,16,18,19,20,24]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import reference as R  # noqa: E402

from numpyro_gmm import GaussianMixture  # noqa: E402


def mixture(cov: str, d: int, rho: float, factor=1.0):
    """The two-component mixture of the module docstring (``reference.concentric_pair``),
    its scales times ``factor``."""
    dtype = jnp.result_type(float)
    locs, sds, _ = R.concentric_pair(d, rho)
    loc = jnp.asarray(locs, dtype)
    s = jnp.asarray(sds, dtype) * factor
    logits = jnp.zeros(2, dtype)
    if cov == "diag":
        return GaussianMixture(loc, scale=s, logits=logits)
    if cov == "full":
        return GaussianMixture(loc, scale_tril=s[..., None] * jnp.eye(d, dtype=dtype), logits=logits)
    return GaussianMixture(loc, cov_factor=jnp.zeros((2, d, 1), dtype), cov_diag=s**2, logits=logits)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="1,3")
    ap.add_argument("--exponents", default="8,12,16,18,19,20,24", help="rho = 10^e")
    args = ap.parse_args(argv)
    key = jax.random.PRNGKey(0)
    print(f"{jnp.dtype(jnp.result_type(float)).name}; error = estimate - separated limit (nats)\n")
    print("| rho | d | components | default entropy() error | randomised rule error | d/dc at c = 1 (exact: d) |")
    print("|---|---|---|---|---|---|")
    for e in map(int, args.exponents.split(",")):
        rho = 10.0**e
        for d in map(int, args.dims.split(",")):
            truth = R.concentric_pair(d, rho)[2]
            for cov in ("diag", "full", "lowrank"):
                fixed = float(mixture(cov, d, rho).entropy())
                rand = float(mixture(cov, d, rho).entropy(key=key, num_points=16))
                grad = float(jax.grad(lambda c: mixture(cov, d, rho, c).entropy(key=key, num_points=16))(1.0))  # noqa: B023
                print(f"| 1e{e} | {d} | {cov} | {fixed - truth:+.2e} | {rand - truth:+.2e} | {grad:.4g} |", flush=True)


if __name__ == "__main__":
    main()
