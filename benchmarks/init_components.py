"""Time of AutoGaussianMixture's initialisation and SVI step against the number of components
``K``, with AutoMultivariateNormal's on the same model as the baseline, measured in one run.

Model: ``z ~ N(0, 3^2 I_d)``, ``y ~ N(z^2, 0.5^2)`` observed at 4 in every coordinate (``2^d``
symmetric modes; float32 unless ``JAX_ENABLE_X64=1``). Each guide is measured in a fresh
Python process (so that no compiled program or tracing cache of another row is reused):

* *init, first (s)*: the first ``SVI.init`` (NumPyro's set-up, the initialisation's
  compilation and its run: ``M = max(32, 16 K)`` fits, their refinement and the choice of
  ``K`` of them);
* *init, again (s)*: a second ``SVI.init`` with another key (the compiled initialisation
  reused: its run);
* *first step (s)*: compilation and one call of ``jax.jit(svi.update)``;
* *step (ms)*: the median of 20 further calls.

Usage::

    python benchmarks/init_components.py [--components 2,8,32,128,256] [--dim 2]
        [--covariance full] [--write]

``--write`` puts the table between ``<!-- init-components:begin -->`` /
``<!-- init-components:end -->`` in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_sections import write_section  # noqa: E402
from timing import svi_step_times  # noqa: E402


def measure(guide_name: str, K: int, dim: int, covariance: str) -> dict:
    """The four times of one guide (run in this process)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoMultivariateNormal

    from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO

    def model():
        z = numpyro.sample("z", dist.Normal(0.0, 3.0).expand([dim]).to_event(1))
        numpyro.sample("y", dist.Normal(z**2, 0.5).to_event(1), obs=jnp.full(dim, 4.0))

    if guide_name == "AutoMultivariateNormal":
        svi = SVI(model, AutoMultivariateNormal(model), numpyro.optim.Adam(0.02), Trace_ELBO())
    else:
        guide = AutoGaussianMixture(model, num_components=K, covariance=covariance)
        svi = SVI(model, guide, numpyro.optim.Adam(0.02), TraceEntropy_ELBO())
    out = {}
    for name, seed in (("init_first", 0), ("init_again", 1)):
        t0 = time.perf_counter()
        state = jax.block_until_ready(svi.init(jax.random.PRNGKey(seed)))
        out[name] = time.perf_counter() - t0
    out["first_step"], step = svi_step_times(svi, state)
    out["step_ms"] = 1e3 * step
    return out


def in_subprocess(guide_name: str, K: int, dim: int, covariance: str) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"from init_components import measure; "
            f"print(json.dumps(measure({guide_name!r}, {K}, {dim}, {covariance!r})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--components", default="2,8,32,128,256")
    parser.add_argument("--dim", type=int, default=2)
    parser.add_argument("--covariance", default="full")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    import jax

    header = (f"`python benchmarks/init_components.py --components {args.components} --dim {args.dim} "
              f"--covariance {args.covariance}` ({'float64' if jax.config.jax_enable_x64 else 'float32'}; "
              f"{jax.devices()}; {os.cpu_count()} CPU cores)")
    lines = [header, "",
             "| guide | K | init, first (s) | init, again (s) | first step (s) | step (ms) | "
             "init, first / AMVN's |",
             "|---|---|---|---|---|---|---|"]
    print(header, flush=True)
    base = in_subprocess("AutoMultivariateNormal", 1, args.dim, args.covariance)
    rows = [("AutoMultivariateNormal", "-", base)]
    for K in (int(k) for k in args.components.split(",")):
        rows.append((f"AutoGaussianMixture ({args.covariance})", K,
                     in_subprocess("AutoGaussianMixture", K, args.dim, args.covariance)))
        print(f"K = {K} done", flush=True)
    for name, K, t in rows:
        line = (f"| {name} | {K} | {t['init_first']:.1f} | {t['init_again']:.2f} | {t['first_step']:.1f} | "
                f"{t['step_ms']:.2f} | {t['init_first'] / base['init_first']:.1f} |")
        lines.append(line)
        print(line, flush=True)
    if args.write:
        write_section(pathlib.Path(__file__).resolve().parents[1] / "docs" / "performance.md", "init-components",
                      "\n".join(lines))


if __name__ == "__main__":
    main()
