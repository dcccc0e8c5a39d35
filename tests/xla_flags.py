"""XLA's cheap code generation for the suite, NumPyro's suite and an example lane in CI: one
list of flags for ``tests/conftest.py`` (imported) and ``.ci/run`` (``python tests/xla_flags.py``
prints ``$XLA_FLAGS`` with them added).

- LLVM optimisation level 0 (measured: the K = 3, d = 2 Legendre gradient 6.0 -> 2.5 CPU-s);
- the classic elemental emitters instead of the MLIR fusion emitters
  (``--xla_cpu_use_fusion_emitters=false``; measured on four engine gradients at level 0:
  7.0 -> 2.0 s of compilation, and the fast tier 258 -> 163 CPU-s).

Both change code generation only, not the HLO program (XLA's CPU fast-math stays off), but
not the last bits of every result: the same expression may be rounded differently where the
emitters fuse it differently, and one float32 defect of the certified floor showed only at
the default code generation (docs/accuracy.md). So two slow tests run in a fresh process at
XLA's defaults (``tests/test_default_accuracy.py``, ``*_at_default_code_generation``). A flag
the given flags already set wins.
"""

import os

CHEAP_CODEGEN = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}


def with_cheap_codegen(flags: str) -> str:
    """``flags`` (an ``XLA_FLAGS`` string) with each flag of ``CHEAP_CODEGEN`` it lacks added."""
    for flag, value in CHEAP_CODEGEN.items():
        if flag not in flags:
            flags = f"{flags} --{flag}={value}"
    return flags.strip()


def without_cheap_codegen(flags: str) -> str:
    """``flags`` with every flag of ``CHEAP_CODEGEN`` removed: XLA's default code generation."""
    return " ".join(f for f in flags.split() if not f.startswith(tuple(f"--{k}" for k in CHEAP_CODEGEN)))


if __name__ == "__main__":
    print(with_cheap_codegen(os.environ.get("XLA_FLAGS", "")))
