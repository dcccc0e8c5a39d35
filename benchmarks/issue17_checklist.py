"""Checks of the "never hangs, never silently wrong" deliverables against the current code.

Run once per dtype (``python benchmarks/issue17_checklist.py`` and
``JAX_ENABLE_X64=1 python benchmarks/issue17_checklist.py``); prints one line per check.
Truths: SciPy's quadrature-backed ``scipy.stats.Mixture`` entropy (1-D); the 2-D conditional
Gauss-Legendre quadrature of tests/test_adversarial.py.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import reference as R  # noqa: E402

import numpyro_gmm  # noqa: E402
from numpyro_gmm import GaussianMixture, entropy_bounds, mixture_entropy, taylor_entropy  # noqa: E402
from numpyro_gmm import entropy as E  # noqa: E402

X64 = os.environ.get("JAX_ENABLE_X64") == "1"
F = jnp.float64 if X64 else jnp.float32
print(f"dtype {np.dtype(F).name}")

# 1. deadlock regression test present and run by both CI passes
ci = (ROOT / ".ci" / "run").read_text()
test = (ROOT / "tests" / "test_no_deadlock.py").read_text()
passes = [l for l in ci.splitlines() if "pytest" in l and "--run-slow" in l]
print("deadlock test: subprocess test present:", "def test_batched_bounds_entropy_and_gradients_finish" in test,
      "| CI lines running slow tests:", len(passes), "(float64:", any("X64=1" in l for l in passes), ")")

# 2. bounds on their side for every accepted order (1-D mixture, truth by SciPy; 2-D thin)
w, m, s = [0.5, 0.5], [-1.0, 1.0], [1.0, 1.0]
truth = R.entropy_1d_scipy(w, m, s)
lg, mm, ss = jnp.log(jnp.asarray(w, F)), jnp.asarray(np.array(m)[:, None], F), jnp.asarray(np.array(s)[:, None], F)
worst_t, worst_lo, worst_hi, bad = -np.inf, -np.inf, np.inf, []
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for order in [1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 26, 30, 40, 48, 50, 60]:
        t = float(taylor_entropy(lg, mm, scale=ss, order=order))
        lo, hi = (float(x) for x in entropy_bounds(lg, mm, scale=ss, order=order))
        worst_t, worst_lo, worst_hi = max(worst_t, t - truth), max(worst_lo, lo - truth), min(worst_hi, hi - truth)
        if not (t <= truth and lo <= truth <= hi and np.isfinite(lo) and np.isfinite(hi)):
            bad.append(order)
print(f"certified, 1-D, orders 1..60: max(taylor - H) {worst_t:+.2e}, max(lower - H) {worst_lo:+.2e}, "
      f"min(upper - H) {worst_hi:+.2e}; orders off their side: {bad or 'none'}")
for c in (1e-20, 1e-6, 1e6, 1e20):
    lo, hi = (float(x) for x in entropy_bounds(lg, mm * c, scale=ss * c))
    t = truth + np.log(c)
    print(f"  scale {c:.0e}: lower - H {lo - t:+.2e}, upper - H {hi - t:+.2e}, finite {np.isfinite(lo) and np.isfinite(hi)}")

# 3. orders validated in every dimension
refused, accepted = [], []
for d in (1, 5):
    args = (jnp.zeros(2, F), jnp.zeros((2, d), F))
    for name in ("auto", "legendre", "taylor", "legendre_normalized"):
        for order in (-1, 0, 2.5, True, "8"):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    mixture_entropy(*args, scale=jnp.ones((2, d), F), method=name, order=order)
                accepted.append((d, name, order))
            except ValueError:
                refused.append((d, name, order))
    for order in (-1, 0, 2.5, True):
        try:
            entropy_bounds(*args, scale=jnp.ones((2, d), F), order=order)
            accepted.append((d, "bounds", order))
        except ValueError:
            refused.append((d, "bounds", order))
print(f"orders: {len(refused)} bad orders refused, accepted: {accepted or 'none'}")
for order, name in ((30, "legendre"), (30, "legendre_normalized"), (60, "taylor")):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mixture_entropy(lg, mm, scale=ss, method=name, order=order)
    print(f"  {name} order {order}: warns {[str(c.message)[:60] for c in caught][:1]}")

# 4. dtypes
for dt in (jnp.float16, jnp.bfloat16):
    msgs = []
    for fn in (lambda: mixture_entropy(lg.astype(dt), mm.astype(dt), scale=ss.astype(dt)),
               lambda: entropy_bounds(lg.astype(dt), mm.astype(dt), scale=ss.astype(dt)),
               lambda: GaussianMixture(mm.astype(dt), scale=ss.astype(dt))):
        try:
            fn()
            msgs.append("accepted")
        except ValueError as e:
            msgs.append("ValueError: " + str(e)[:40])
    print(f"dtype {np.dtype(dt).name}: {msgs}")

# 5. gamma removed
print("gamma in ENTROPY_METHODS:", "gamma" in E.ENTROPY_METHODS, "| gamma_entropy exported:",
      "gamma_entropy" in numpyro_gmm.__all__)

# 6. float32 vs float64 diagonal value_and_grad (time this process's dtype; compare the two runs)
for d, K in ((5, 32), (10, 16)):
    rng = np.random.default_rng(0)
    args = (jnp.asarray(rng.normal(size=K), F), jnp.asarray(rng.normal(size=(K, d)), F),
            jnp.asarray(rng.uniform(0.5, 1.5, size=(K, d)), F))
    f = jax.jit(jax.value_and_grad(lambda a, b, c: mixture_entropy(a, b, scale=c), argnums=(0, 1, 2)))
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(15):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    print(f"diag value_and_grad d={d} K={K}: median {1e3 * np.median(ts):.1f} ms, min {1e3 * min(ts):.1f} ms")
