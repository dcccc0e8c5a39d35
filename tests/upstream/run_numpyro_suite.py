#!/usr/bin/env python
"""Run NumPyro's own generic distribution tests on ``GaussianMixture``.

1. Fetch ``test/test_distributions.py`` (and NumPyro's pytest configuration,
   ``pyproject.toml``) from the sdist of the *installed* numpyro version
   (``pip download --no-deps --no-binary :all: numpyro==<version>``; or ``--sdist PATH``).
2. Add one line after its ``CONTINUOUS = [...]`` registry that appends this project's cases
   (``tests/upstream/numpyro_gmm_upstream.py``); nothing else in the file is changed and the
   file is not kept in the repository.
3. Run pytest on it with that plugin, which keeps only the tests parametrised by the
   ``GaussianMixture`` cases and runs the exact-entropy comparison with the documented
   tolerance. Every selected test must pass (or be skipped by upstream's own logic).

Exits with pytest's status; 2 with a message if the upstream file has changed shape.
Extra arguments go to pytest (e.g. ``-x``, ``-n 2``).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLUGIN = "numpyro_gmm_upstream"
TEST_FILE = "test/test_distributions.py"
PATCH = (
    f"import {PLUGIN} as _numpyro_gmm_upstream; "
    "CONTINUOUS += _numpyro_gmm_upstream.register(_DIST_MAP, T)  # added by numpyro-gmm\n"
)


def fail(msg: str) -> None:
    print(f"run_numpyro_suite: {msg}", file=sys.stderr)
    sys.exit(2)


def fetch_sdist(version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"numpyro=={version}"]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        fail(f"pip could not download the sdist of numpyro {version} (offline? pass --sdist PATH)")
    found = sorted(dest.glob(f"numpyro-{version}.tar.gz"))
    if not found:
        fail(f"pip download left no numpyro-{version}.tar.gz in {dest}: {sorted(p.name for p in dest.iterdir())}")
    return found[0]


def extract(sdist: Path, dest: Path) -> tuple[Path, Path | None]:
    """``(test file, pyproject or None)`` extracted under ``dest``."""
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        roots = {n.split("/", 1)[0] for n in names}
        tests = [n for n in names if n.count("/") == 2 and n.endswith("/" + TEST_FILE)]
        if len(tests) != 1:
            fail(f"{sdist.name} has no single <root>/{TEST_FILE} (roots {sorted(roots)}); upstream layout changed")
        root = tests[0].split("/", 1)[0]
        members = [tests[0]] + [n for n in (f"{root}/pyproject.toml",) if n in names]
        for name in members:
            target = dest / Path(name).relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(name) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    pyproject = dest / "pyproject.toml"
    return dest / TEST_FILE, (pyproject if pyproject.exists() else None)


def patch(test_file: Path) -> None:
    """Insert :data:`PATCH` after the module-level ``CONTINUOUS = [...]`` assignment, after
    checking that the names it uses exist at module level."""
    src = test_file.read_text()
    tree = ast.parse(src)
    assigned, classes, registry = set(), set(), None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    assigned.add(t.id)
                    if t.id == "CONTINUOUS":
                        registry = node
        elif isinstance(node, ast.ClassDef):
            classes.add(node.name)
    problems = []
    if registry is None or not isinstance(registry.value, ast.List):
        problems.append("no module-level 'CONTINUOUS = [...]' list")
    if "_DIST_MAP" not in assigned:
        problems.append("no module-level '_DIST_MAP' (scipy reference registry)")
    if "T" not in classes:
        problems.append("no class 'T' (the registry's test-case tuple)")
    if problems:
        fail(f"{test_file} changed shape: " + "; ".join(problems))
    lines = src.splitlines(keepends=True)
    lines.insert(registry.end_lineno, PATCH)
    test_file.write_text("".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help="numpyro sdist (.tar.gz) to use instead of pip download")
    parser.add_argument("--workdir", type=Path, help="where to put the upstream file (default: a temporary folder, removed)")
    args, pytest_args = parser.parse_known_args(argv)

    version = importlib.metadata.version("numpyro")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="numpyro-upstream-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        sdist = args.sdist or fetch_sdist(version, work)
        if not sdist.name.startswith(f"numpyro-{version}."):
            fail(f"{sdist.name} is not the sdist of the installed numpyro {version}")
        test_file, pyproject = extract(sdist, work / "numpyro")
        patch(test_file)
        cmd = [sys.executable, "-m", "pytest", str(test_file), "-p", PLUGIN, "-p", "no:cacheprovider",
               "--rootdir", str(test_file.parent.parent), "-q", "-rs", "--color=auto"]
        # NumPyro's own pytest configuration (warnings as errors with its exceptions);
        # without it, warnings are errors all the same.
        cmd += ["-c", str(pyproject)] if pyproject else ["-c", os.devnull, "-W", "error"]
        cmd += pytest_args
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        print(f"numpyro {version}: {TEST_FILE} from {sdist.name}", flush=True)
        print("+", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rc = subprocess.run(cmd, env=env, cwd=test_file.parent.parent).returncode
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        print(f"run_numpyro_suite: pytest exit status {rc}, wall {time.perf_counter() - t0:.0f} s, "
              f"CPU {cpu:.0f} s (all processes)", flush=True)
        return rc
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
