"""Write ``tests/slow_tests.txt``: the tests that cost more than ``--threshold`` CPU-seconds.

The README's test command runs the fast tier (``conftest.py`` marks every test listed in
``slow_tests.txt`` as ``slow``, so it is skipped without ``--run-slow``); CI runs both tiers,
in float32 and float64 (``.ci/run``), so no test is dropped. Re-run this after adding
expensive tests::

    python tests/profile_tests.py            # the whole suite, float32, --run-slow, -n auto
    python tests/profile_tests.py --threshold 2.5

Each test's CPU time (this process and its children, so compilation counts) is measured by a
small pytest plugin in this file; tests marked ``slow`` in their own code stay slow whatever
they cost and are not listed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LIST = HERE / "slow_tests.txt"
HEADER = """\
# Tests run only with --run-slow (CI runs them in both float passes): each took more than
# {threshold} CPU-seconds (mostly compilation) when `python tests/profile_tests.py` wrote this
# list. One pytest node id a line; a test missing here runs in the fast tier.
"""


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class CpuTimer:
    """pytest plugin: CPU-seconds per test, written as JSON to ``$PROFILE_TESTS_OUT.<worker>``."""

    def __init__(self):
        self.rows = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        start = _cpu()
        yield
        self.rows.append((item.nodeid, _cpu() - start, "slow" in item.keywords and item.nodeid not in _listed()))

    def pytest_sessionfinish(self, session):
        out = os.environ.get("PROFILE_TESTS_OUT")
        if out and self.rows:
            Path(f"{out}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}").write_text(json.dumps(self.rows))


def _listed() -> set[str]:
    if not LIST.exists():
        return set()
    return {line.strip() for line in LIST.read_text().splitlines() if line.strip() and not line.startswith("#")}


def pytest_configure(config):  # loaded with -p tests.profile_tests
    config.pluginmanager.register(CpuTimer(), "cpu_timer")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=2.0, help="CPU-seconds (default 2)")
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PROFILE_TESTS_OUT=str(Path(tmp) / "rows"), PYTHONPATH=str(HERE.parent))
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "auto", "--dist", "worksteal", "--run-slow",
               "-p", "tests.profile_tests", *pytest_args]
        rc = subprocess.run(cmd, env=env, cwd=HERE.parent).returncode
        rows = [r for f in Path(tmp).glob("rows.*") for r in json.loads(f.read_text())]
    slow = sorted(node for node, cpu, marked in rows if cpu > args.threshold and not marked)
    fast = sum(cpu for node, cpu, marked in rows if node not in slow and not marked)
    LIST.write_text(HEADER.format(threshold=args.threshold) + "".join(f"{n}\n" for n in slow))
    print(f"{len(slow)} tests over {args.threshold} CPU-s listed in {LIST.name}; the fast tier's tests took {fast:.0f} CPU-s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
