"""Test configuration: float64 runs are selected with ``JAX_ENABLE_X64=1`` (a separate CI pass).

Tests marked ``@pytest.mark.slow`` (long statistical runs, several seconds each) are skipped
unless ``--run-slow`` is given; CI gives it, so they run on every change (see ``.ci/run``).
"""

import os
from pathlib import Path

# The suite is compile-bound (hundreds of small programs, each run a few times), so it asks
# XLA's CPU backend for cheap code generation (the flags and their measured effect:
# tests/xla_flags.py); a flag the user's XLA_FLAGS already sets wins. CI runs the main demo's
# example lane at XLA's defaults. Set before jax initialises its backend.
from xla_flags import with_cheap_codegen  # noqa: E402

os.environ["XLA_FLAGS"] = with_cheap_codegen(os.environ.get("XLA_FLAGS", ""))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest

X64 = bool(jax.config.jax_enable_x64)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (CI does)")


def _listed_slow():
    """Node ids in ``slow_tests.txt`` (written by ``tests/profile_tests.py``: the tests over
    2 CPU-seconds, mostly compilation); they are marked ``slow`` like the ones marked in code."""
    path = Path(__file__).with_name("slow_tests.txt")
    return {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def pytest_configure(config):
    """A persistent XLA compilation cache under pytest's cache folder
    (``.pytest_cache/d/jax-compilation-cache``), shared by the xdist workers and by later runs
    (CI's slow tier reuses what its fast tier compiled). Sound: JAX keys each entry by the
    whole program, the compile options and flags, and the jax/jaxlib versions, so a changed
    program or flag is a miss; a hit skips XLA's compilation only (tracing, warnings and
    validation still run). ``-p no:cacheprovider`` turns it off; a user's
    ``JAX_COMPILATION_CACHE_DIR`` wins. Measured on the fast tier (2 cores): cold 245 CPU-s
    (254 without the cache), warm 104 CPU-s."""
    # The cache is an optimisation only: an unreadable or unwritable entry (JAX warns and
    # compiles) must not fail a test under filterwarnings = error. Added before the early
    # return: pytest-xdist's workers inherit the cache folder through the environment and
    # return there, and without the filter a worker reading an entry another worker was still
    # writing failed a test (CI, "Error -5 while decompressing data").
    config.addinivalue_line("filterwarnings", "ignore:Error (reading|writing) persistent compilation cache entry")
    cache = getattr(config, "cache", None)
    if cache is None or jax.config.jax_compilation_cache_dir:
        return
    settings = {
        "jax_compilation_cache_dir": str(cache.mkdir("jax-compilation-cache")),
        "jax_persistent_cache_min_compile_time_secs": 0.0,  # the suite's programs are small
    }
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)  # the subprocess tests inherit it


#: Why a test marked ``float32_pass`` is skipped in the float64 pass.
FLOAT32_PASS_REASON = (
    "float32 pass only: a behaviour test (an SVI fit, the modes found, shapes, an error raised) "
    "whose claim is about JAX's default float32; its float64 plumbing is checked by "
    "tests/test_float64_svi.py"
)


def pytest_collection_modifyitems(config, items):
    listed = _listed_slow()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
        if X64 and "float32_pass" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=FLOAT32_PASS_REASON))
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def ftype():
    """The float dtype of this pass (float64 with JAX_ENABLE_X64=1, else float32)."""
    return np.float64 if X64 else np.float32


def run_fresh_python(script: str, *args: str, x64: bool, xla_flags: str | None = None, timeout: float = 600,
                     **env_vars: str) -> str:
    """Run ``python -c script args...`` in a fresh process (its own JAX backend and compiled
    programs) with this checkout's ``src`` first on the path, ``JAX_ENABLE_X64`` set from
    ``x64``, ``XLA_FLAGS`` replaced where given, and ``env_vars`` added; assert that it exited
    with 0 and return its standard output."""
    import subprocess
    import sys

    env = dict(os.environ, JAX_ENABLE_X64="1" if x64 else "0", **env_vars)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent / "src") + os.pathsep + env.get("PYTHONPATH", "")
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    res = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def run_fresh_python_json(script: str, *args: str, **kwargs):
    """:func:`run_fresh_python`, returning the JSON value of the last line the script printed."""
    import json

    return json.loads(run_fresh_python(script, *args, **kwargs).strip().splitlines()[-1])


def guide_params(locs, prefix="auto", **others):
    """AutoGaussianMixture parameters with the component means ``locs``: the guide's
    ``locs = locs_origin + locs_unit * locs_offset`` with origin ``locs``, unit 1 and offset 0,
    and ``others`` (logits, the covariance factors) as given."""
    locs = np.asarray(locs)
    return {f"{prefix}_locs_origin": locs, f"{prefix}_locs_unit": np.ones_like(locs),
            f"{prefix}_locs_offset": np.zeros_like(locs), **others}


def guide_locs(params, prefix="auto"):
    """``(K, d)`` float64 component means of AutoGaussianMixture parameters ((origin + unit *
    offset) / gauge, the guide's definition; the gauge is 1 where the parameters lack it)."""
    p = {k: np.asarray(params[f"{prefix}_locs_{k}"], np.float64) for k in ("origin", "unit", "offset")}
    gauge = np.asarray(params.get(f"{prefix}_locs_gauge", 1.0), np.float64)
    return (p["origin"] + p["unit"] * p["offset"]) / gauge


def regression_data(rows=400, seed=0):
    """``(X (rows, 3), y (rows,))`` NumPy float64: standard normal covariates, coefficients
    ``(1, -2, 0.5)``, unit noise."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, 3))
    return X, X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=rows)


def subsampled_regression(X, y, subsample_size=None):
    """``b ~ N(0, I)``, ``y ~ N(X b, 1)`` with the rows in a plate, ``subsample_size`` of them
    per evaluation (all for ``None``)."""
    import numpyro
    import numpyro.distributions as dist

    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("rows", X.shape[0], subsample_size=subsample_size) as rows:
        numpyro.sample("y", dist.Normal(X[rows] @ b, 1.0), obs=y[rows])


def ppca_factor(c_units, rank):
    """The probabilistic-PCA factor ``V_r diag(sqrt(max(lambda - 1, 0)))`` of a covariance in
    the units of the mean field (``(lambda, V)`` its ``rank`` largest eigenpairs by NumPy's
    ``eigh``, float64): the reference for the low-rank initialisation
    (``numpyro_gmm._kernels.init_fits.principal_cov_factor``)."""
    lam, v = np.linalg.eigh(c_units)
    lam, v = lam[::-1][:rank], v[:, ::-1][:, :rank]
    return v * np.sqrt(np.maximum(lam - 1.0, 0.0))
