"""No control characters in the project's text files.

A non-raw docstring turns ``\\approx``, ``\\frac``, ``\\big`` and ``\\tfrac`` into BEL, form
feed, backspace and tab; such a file renders wrongly in the documentation and is hard to
see in review. Every text file under the project's source folders may contain printable
characters and newlines only (no tab, no carriage return).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("src", "tests", "examples", "benchmarks", "docs", ".ci")
TOP_FILES = ("README.md", "pyproject.toml", "LICENSE", ".gitignore")
SUFFIXES = {".py", ".md", ".rst", ".toml", ".txt", ".ipynb", ".cfg", ".yml", ".yaml", ".json", ""}
SKIP_PARTS = {"_build", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", "_generated", "figures"}
# C0 controls except newline (0x0A), DEL, and the C1 controls.
BAD = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def control_characters(text: str):
    """``(line, column, character)`` of every control character other than newline."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        out += [(n, m.start() + 1, repr(m.group())) for m in BAD.finditer(line)]
    return out


def text_files():
    files = [ROOT / f for f in TOP_FILES if (ROOT / f).is_file()]
    for folder in FOLDERS:
        base = ROOT / folder
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(ROOT)
            if not p.is_file() or SKIP_PARTS & set(rel.parts) or p.suffix not in SUFFIXES:
                continue
            if p.suffix == "" and folder != ".ci":  # extension-less files: only the CI scripts
                continue
            files.append(p)
    return files


def test_detector_finds_what_a_non_raw_docstring_makes():
    # the exact damage of "\approx", "\frac", "\big", "\tfrac" in a non-raw string
    damaged = "H \approx \frac d2\n\big(\tfrac d2\big)\r\n"
    found = control_characters(damaged)
    assert [c for _, _, c in found] == ["'\\x07'", "'\\x0c'", "'\\x08'", "'\\t'", "'\\x08'", "'\\r'"]
    assert found[0][:2] == (1, 3)
    assert control_characters(r"H \approx \frac d2" + "\n") == []


def test_files_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in text_files()}
    assert "src/numpyro_gmm/_kernels/frontier.py" in names
    assert "pyproject.toml" in names
    assert len(names) > 20


@pytest.mark.parametrize("folder", (".",) + FOLDERS)
def test_no_control_characters(folder):
    bad = {}
    for p in text_files():
        rel = p.relative_to(ROOT)
        if (folder == "." and len(rel.parts) > 1) or (folder != "." and rel.parts[0] != folder):
            continue
        found = control_characters(p.read_text(encoding="utf-8"))
        if found:
            bad[rel.as_posix()] = found[:5]
    assert not bad, f"control characters (line, column, char): {bad}"
