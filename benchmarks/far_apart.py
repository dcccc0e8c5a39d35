"""Components far apart against their scales: the default entropy, its randomised rule (the
ELBO's), their gradients and ``entropy_bounds`` against the closed form.

Components ``R`` standard deviations apart (scales ``1/R`` with unit distances; low rank:
distances ``R`` with unit scales, since ``cov_diag = 1/R^2`` underflows float32) have the
entropy ``sum_i w_i H_i + H(w)`` to every digit (overlap ``exp(-R^2/8)``), whose gradient is
taken here from the component log-determinants. Three components, random weights and
scales within ``e^{+-0.5}``. Writes the table to docs/accuracy.md (markers far-apart) and
exits non-zero when a value misses by more than ``1e-4 (1 + |H|)`` (float64: ``1e-9``), a
gradient is not finite or misses by more than ``2e-3`` of the largest entry (float64:
``1e-7``), or the bracket leaves out the truth.

    python benchmarks/far_apart.py            # float32
    JAX_ENABLE_X64=1 python benchmarks/far_apart.py
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_far_apart import _case, _closed_form, _log_dets, _mixture  # noqa: E402

from doc_sections import write_section  # noqa: E402

X64 = bool(jax.config.jax_enable_x64)
SEPARATIONS = (1e3, 1e6, 1e10, 1e15, 1e20, 1e40, 1e80, 1e150) if X64 else (1e3, 1e6, 1e10, 1e15, 1e18, 1e20, 1e25)


def main():
    rows, failures = [], 0
    for kind, dims in (("diag", (1, 2, 10)), ("full", (1, 2, 10)), ("lowrank", (2, 10))):
        for d in dims:
            worst_v = worst_g = 0.0
            bracket_ok, finite = True, True
            for seed, separation in enumerate(SEPARATIONS):
                loc, factor, logits = _case(kind, d, 3, separation, seed)
                truth, truth_grad = jax.value_and_grad(
                    lambda f, lc, lg: _closed_form(lg, _log_dets(kind, f), d), argnums=(0, 1, 2)
                )(factor, loc, logits)
                top = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(truth_grad))
                for options in ({}, {"key": jax.random.PRNGKey(0)}):
                    value, grad = jax.value_and_grad(
                        lambda f, lc, lg: _mixture(kind, lc, f, lg).entropy(**options), argnums=(0, 1, 2)
                    )(factor, loc, logits)
                    worst_v = max(worst_v, abs(float(value) - float(truth)) / (1.0 + abs(float(truth))))
                    for got, want in zip(jax.tree.leaves(grad), jax.tree.leaves(truth_grad)):
                        finite &= bool(jnp.all(jnp.isfinite(got)))
                        worst_g = max(worst_g, float(jnp.max(jnp.abs(got - want))) / top)
                lo, hi = _mixture(kind, loc, factor, logits).entropy_bounds()
                tol = (1e-9 if X64 else 1e-4) * (1.0 + abs(float(truth)))
                bracket_ok &= float(lo) - tol <= float(truth) <= float(hi) + tol
            ok = worst_v <= (1e-9 if X64 else 1e-4) and finite and worst_g <= (1e-7 if X64 else 2e-3) and bracket_ok
            failures += not ok
            rows.append(
                f"| {kind} | {d} | {worst_v:.1e} | {'yes' if finite else 'NO'} | {worst_g:.1e} | "
                f"{'yes' if bracket_ok else 'NO'} |"
            )
    name = "float64" if X64 else "float32"
    body = "\n".join(
        [
            f"### Components far apart ({name}; `benchmarks/far_apart.py`)",
            "",
            f"Three components `R` sds apart, `R` in {', '.join(f'{r:.0e}' for r in SEPARATIONS)}: the worst over",
            "`R`, the default and its randomised rule, of the value's error relative to `1 + |H|`, the",
            "gradients' error relative to their largest entry (against the closed form", "`sum_i w_i H_i + H(w)`), and whether `entropy_bounds()` holds the truth.",
            "",
            "| covariance | d | value error | gradients finite | gradient error | bracket holds |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(body)
    write_section(os.path.join(os.path.dirname(__file__), "..", "docs", "accuracy.md"), f"far-apart-{name}", body)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
