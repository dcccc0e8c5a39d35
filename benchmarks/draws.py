"""Memory and time of ``GaussianMixture.sample`` and ``log_prob`` on many draws, against NumPyro's
own ``MixtureSameFamily`` of the same components (the baseline, measured in the same run).

For each case (covariance kind, ``K`` components, dimension ``d``, ``N`` draws or values):

* *XLA buffers (GB)*: ``temp_size_in_bytes`` of the compiled program's ``memory_analysis``
  (working memory beyond inputs and outputs; compiled, not run), for this package's program
  and for NumPyro's ``MixtureSameFamily(CategoricalLogits, Normal(...).to_event(1) |
  MultivariateNormal(scale_tril) | LowRankMultivariateNormal)`` of the same parameters;
* *time (ms)*: the median of 3 calls after a first (compiling) one, for each program whose
  buffers are below ``--max-gb`` (else "not run").

float32 unless ``JAX_ENABLE_X64=1``. Usage::

    python benchmarks/draws.py [--max-gb 6] [--write]

``--write`` puts the table between ``<!-- draws:begin -->`` / ``<!-- draws:end -->`` in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_sections import write_section  # noqa: E402
from timing import timed  # noqa: E402

# (kind, K, d, r, N)
CASES = [
    ("diag", 4, 10, 0, 10_000),
    ("full", 4, 10, 0, 10_000),
    ("lowrank", 4, 100, 4, 10_000),
    ("full", 64, 100, 0, 10_000),
    ("full", 256, 10, 0, 100_000),
    ("lowrank", 64, 1000, 4, 10_000),
    ("diag", 256, 1000, 0, 100_000),
    ("full", 64, 300, 0, 100_000),
    ("lowrank", 256, 1000, 4, 100_000),
]


def _programs(kind, K, d, r, N):
    """``{(program, name): (jitted fn, args)}`` for this package and NumPyro's baseline."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import numpyro.distributions as dist

    from numpyro_gmm import GaussianMixture

    rng = np.random.default_rng(0)
    f = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    loc = jnp.asarray(rng.normal(size=(K, d)), f)
    sd = jnp.asarray(rng.uniform(0.5, 1.0, size=(K, d)), f)
    logits = jnp.asarray(rng.normal(size=K), f)
    if kind == "diag":
        ours = GaussianMixture(loc, scale=sd, logits=logits, validate_args=False)
        comp = dist.Normal(loc, sd).to_event(1)
    elif kind == "full":
        tril = jax.vmap(jnp.diag)(sd) + jnp.tril(jnp.full((d, d), 0.01, f), -1)
        ours = GaussianMixture(loc, scale_tril=tril, logits=logits, validate_args=False)
        comp = dist.MultivariateNormal(loc, scale_tril=tril, validate_args=False)
    else:
        w = jnp.asarray(rng.normal(size=(K, d, r)) * 0.1, f)
        ours = GaussianMixture(loc, cov_factor=w, cov_diag=sd**2, logits=logits, validate_args=False)
        comp = dist.LowRankMultivariateNormal(loc, w, sd**2, validate_args=False)
    base = dist.MixtureSameFamily(dist.CategoricalLogits(logits, validate_args=False), comp, validate_args=False)
    key = jax.random.PRNGKey(0)
    values = jax.random.normal(jax.random.PRNGKey(1), (N, d), f)
    out = {}
    for name, mix in (("numpyro_gmm", ours), ("NumPyro", base)):
        out[("sample", name)] = (jax.jit(lambda m, k: m.sample(k, (N,))), (mix, key))
        out[("log_prob", name)] = (jax.jit(lambda m, x: m.log_prob(x)), (mix, values))
    return out


def measure(kind, K, d, r, N, max_gb):
    rows = []
    programs = _programs(kind, K, d, r, N)
    for program in ("sample", "log_prob"):
        row = {"program": program}
        for name in ("numpyro_gmm", "NumPyro"):
            fn, args = programs[(program, name)]
            gb = fn.lower(*args).compile().memory_analysis().temp_size_in_bytes / 1e9
            row[name + "_gb"] = gb
            if gb > max_gb:
                row[name + "_ms"] = None
                continue
            row[name + "_ms"] = 1e3 * timed(fn, *args, repeats=3, reduce=statistics.median)
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-gb", type=float, default=6.0, help="run only programs whose XLA buffers are below this")
    parser.add_argument("--write", action="store_true", help="write the table into docs/performance.md")
    args = parser.parse_args()
    import jax

    dtype = "float64" if jax.config.jax_enable_x64 else "float32"
    lines = [
        f"`python benchmarks/draws.py` ({dtype}; {jax.devices()}; {os.cpu_count()} CPU cores). XLA buffers: "
        "`memory_analysis().temp_size_in_bytes` of the compiled program; time: median of 3 calls after the "
        "first; *NumPyro*: its `MixtureSameFamily` of the same components (baseline); programs with buffers "
        f"above {args.max_gb:g} GB not run.",
        "",
        "| kind | K | d | N | program | buffers (GB) | NumPyro's (GB) | time (ms) | NumPyro's (ms) | time / NumPyro's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, K, d, r, N in CASES:
        for row in measure(kind, K, d, r, N, args.max_gb):
            ours, base = row["numpyro_gmm_ms"], row["NumPyro_ms"]
            fmt = lambda ms: "not run" if ms is None else f"{ms:.1f}"  # noqa: E731
            ratio = "-" if ours is None or base is None else f"{ours / base:.2f}"
            label = f"lowrank (r = {r})" if kind == "lowrank" else kind
            lines.append(f"| {label} | {K} | {d} | {N:,} | {row['program']} | {row['numpyro_gmm_gb']:.2f} | "
                         f"{row['NumPyro_gb']:.2f} | {fmt(ours)} | {fmt(base)} | {ratio} |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print()
    print(table)
    if args.write:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "performance.md")
        write_section(path, "draws", table)


if __name__ == "__main__":
    main()
