"""Execute the example notebooks with nbclient.

Run from anywhere::

    python examples/run_notebooks.py                       # execute and save in place
    CI=1 python examples/run_notebooks.py --out-dir /tmp/nb  # smoke settings, keep the repo clean
    python examples/run_notebooks.py quickstart clustering   # a subset

Each notebook runs with its folder (``examples/notebooks``) as working directory, imports
the functions of its example script from ``examples/`` and switches to small settings when
the environment variable ``CI`` is set (``smoke_test = "CI" in os.environ``). A cell that
raises makes this script exit non-zero. Prints the wall time of each notebook.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOK_DIR = os.path.join(HERE, "notebooks")
NOTEBOOKS = ("quickstart", "target_density", "multimodal_posterior", "clustering")


def execute(name: str, out_dir: str | None, timeout: int, kernel_name: str) -> float:
    import nbformat
    from nbclient import NotebookClient

    path = os.path.join(NOTEBOOK_DIR, f"{name}.ipynb")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": NOTEBOOK_DIR}},
        record_timing=False,
    )
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    target = path if out_dir is None else os.path.join(out_dir, f"{name}.ipynb")
    nbformat.write(nb, target)
    return elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(NOTEBOOKS), help="notebooks to run (default: all)")
    parser.add_argument("--out-dir", default=None, help="write the executed notebooks here instead of in place")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--kernel-name", default="python3")
    args = parser.parse_args(argv)
    if args.out_dir is not None:
        os.makedirs(args.out_dir, exist_ok=True)
    for name in args.names:
        if name not in NOTEBOOKS:
            parser.error(f"unknown notebook {name!r}; choose from {NOTEBOOKS}")
        elapsed = execute(name, args.out_dir, args.timeout, args.kernel_name)
        print(f"{name}: executed in {elapsed:.1f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
