"""Working memory and time of AutoGaussianMixture's initialisation on a model whose log
density grows with its data, with the chunked evaluations (the default,
``numpyro_gmm.autoguide.INIT_MEMORY_BYTES``) against all evaluations at once (the limit set
to 1 TiB: the initialisation before the chunks), measured side by side in one run.

Model: Bayesian logistic regression, ``b ~ N(0, I_20)``, ``y_n ~ Bernoulli(sigmoid(x_n . b))``
on ``N`` rows of standard normal covariates (float32 unless ``JAX_ENABLE_X64=1``). Per row
of the table:

* *temp (MB)*: XLA's temporary buffers for the initialisation program
  (``jax.jit(guide.initial_components)``, ``memory_analysis()`` of the compiled program: the
  working memory beyond the data and the outputs); nothing is run;
* *init (s)*: ``SVI.init`` in this process (compilation and the run; the guide's eager path),
  the best of two (measured in the order chunked, all at once, all at once, chunked), for
  ``N <= --time-max-rows`` only (all at once, ``K = 8``, ``N = 200,000`` held 13.6 GB);
* *AMVN step (ms)*: one ``SVI.update`` of AutoMultivariateNormal + ``Trace_ELBO`` on the same
  model (compiled; median of 20), the scale of the model's own cost.

Usage::

    python benchmarks/init_memory.py [--rows 10000,100000] [--components 2,8]
        [--time-max-rows 100000] [--write]

``--write`` puts the table between ``<!-- init-memory:begin -->`` / ``<!-- init-memory:end -->``
in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal

import numpyro_gmm.autoguide as autoguide_module
from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_sections import write_section  # noqa: E402
from timing import svi_step_times  # noqa: E402

D = 20
UNLIMITED = 1 << 40


def model(X, y):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    numpyro.sample("y", dist.Bernoulli(logits=X @ b), obs=y)


def data(rows):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, D))
    y = rng.random(rows) < 1 / (1 + np.exp(-X @ rng.standard_normal(D)))
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    return jnp.asarray(X, dtype), jnp.asarray(y, dtype)


def guide_with_limit(K, limit, X, y):
    autoguide_module.INIT_MEMORY_BYTES = limit
    guide = AutoGaussianMixture(model, num_components=K)
    with numpyro.handlers.seed(rng_seed=0):
        guide(X, y)
    return guide


def temp_mb(K, limit, X, y):
    guide = guide_with_limit(K, limit, X, y)
    analysis = jax.jit(guide.initial_components).lower(jax.random.PRNGKey(0)).compile().memory_analysis()
    return analysis.temp_size_in_bytes / 1e6


def init_seconds(K, limit, X, y):
    autoguide_module.INIT_MEMORY_BYTES = limit
    svi = SVI(model, AutoGaussianMixture(model, num_components=K), numpyro.optim.Adam(0.01), TraceEntropy_ELBO())
    t0 = time.perf_counter()
    jax.block_until_ready(svi.init(jax.random.PRNGKey(0), X, y))
    return time.perf_counter() - t0


def amvn_step_ms(X, y):
    svi = SVI(model, AutoMultivariateNormal(model), numpyro.optim.Adam(0.01), Trace_ELBO())
    return 1e3 * svi_step_times(svi, svi.init(jax.random.PRNGKey(0), X, y), X, y)[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000,100000")
    parser.add_argument("--components", default="2,8")
    parser.add_argument("--time-max-rows", type=int, default=100_000)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    default = autoguide_module.INIT_MEMORY_BYTES
    header = (f"`python benchmarks/init_memory.py --rows {args.rows} --components {args.components} "
              f"--time-max-rows {args.time_max_rows}` ({'float64' if jax.config.jax_enable_x64 else 'float32'}; "
              f"{jax.devices()}; {os.cpu_count()} CPU cores; chunked: the default limit of "
              f"{default / 2**30:g} GiB of estimated working memory)")
    lines = [header, "",
             "| rows N | K | temp (MB), chunked | temp (MB), all at once | ratio | init (s), chunked | "
             "init (s), all at once | ratio | AMVN step (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    print(header, flush=True)
    for rows in (int(r) for r in args.rows.split(",")):
        X, y = data(rows)
        step = amvn_step_ms(X, y)
        for K in (int(k) for k in args.components.split(",")):
            chunked, at_once = temp_mb(K, default, X, y), temp_mb(K, UNLIMITED, X, y)
            if rows <= args.time_max_rows:
                # in the order chunked, all at once, all at once, chunked, the best of each (the
                # first initialisation of a process pays set-up costs of its own)
                t_chunked, t_at_once, again, t_chunked_again = (
                    init_seconds(K, limit, X, y) for limit in (default, UNLIMITED, UNLIMITED, default))
                t_chunked, t_at_once = min(t_chunked, t_chunked_again), min(t_at_once, again)
                times = f"{t_chunked:.1f} | {t_at_once:.1f} | {t_chunked / t_at_once:.2f}"
            else:
                t_chunked = init_seconds(K, default, X, y)
                times = f"{t_chunked:.1f} | - | -"
            line = (f"| {rows:,} | {K} | {chunked:.0f} | {at_once:.0f} | {chunked / at_once:.3f} | {times} | "
                    f"{step:.2f} |")
            lines.append(line)
            print(line, flush=True)
            jax.clear_caches()
    autoguide_module.INIT_MEMORY_BYTES = default
    if args.write:
        path = pathlib.Path(__file__).resolve().parents[1] / "docs" / "performance.md"
        write_section(path, "init-memory", "\n".join(lines))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
