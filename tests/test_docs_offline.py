"""The documentation loads no asset from another site (issue 16, deliverable 4).

The full check runs in CI after the real documentation build (``.ci/run``:
``python docs/check_offline.py docs/_build/html``). Building the real documentation takes
about 45 s, too long for the test suite, so here: the checker itself on hand-written HTML
(it must flag a CDN script, stylesheet, image, srcset and CSS ``url()``, and allow plain
hyperlinks); the documentation's configuration and the ``docs`` extra; and, where Sphinx
and ``sphinx-mathjax-offline`` are installed, a one-page Sphinx build with maths, with and
without the offline extension (without it, the checker must report Sphinx's CDN MathJax).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import check_offline  # noqa: E402

sys.path.pop(0)

PAGE = """<!DOCTYPE html><html><head>
<link rel="stylesheet" href="_static/pygments.css">
<script src="_static/doctools.js"></script>
{extra}
</head><body>
<a href="https://num.pyro.ai">NumPyro</a> <a href="//example.org/paper.pdf">paper</a>
<img src="_images/figure.png" alt="local">
</body></html>"""


@pytest.mark.parametrize(
    "extra",
    [
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@4/tex-mml-chtml.js"></script>',
        '<script defer src="//cdn.example.org/x.js"></script>',
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Lato">',
        '<link rel="icon" href="http://example.org/favicon.ico">',
        '<img src="https://example.org/badge.svg">',
        '<img srcset="a.png 1x, https://example.org/b.png 2x">',
        '<div style="background: url(\'https://example.org/bg.png\')"></div>',
        "<style>@import 'https://example.org/theme.css';</style>",
        '<iframe src="https://www.youtube.com/embed/x"></iframe>',
    ],
)
def test_checker_flags_external_assets(extra):
    findings, _, _ = check_offline.scan_html(PAGE.format(extra=extra))
    assert len(findings) == 1, findings


def test_checker_allows_local_assets_and_hyperlinks():
    findings, scripts, has_math = check_offline.scan_html(PAGE.format(extra=""))
    assert findings == [] and scripts == ["_static/doctools.js"] and not has_math


def test_checker_on_a_folder(tmp_path):
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "theme.css").write_text("body { background: url(https://example.org/a.png) }\n")
    (tmp_path / "maths.html").write_text('<html><body><span class="math">\\(x\\)</span></body></html>')
    problems = check_offline.check(tmp_path)
    assert any("theme.css" in p for p in problems)
    assert any("maths.html: maths but no MathJax script" in p for p in problems)
    assert check_offline.check(tmp_path / "missing") != []


def test_configuration_serves_mathjax_from_a_package():
    tree = ast.parse((ROOT / "docs" / "conf.py").read_text(encoding="utf-8"))
    assigned = {
        t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    extensions = ast.literal_eval(assigned["extensions"])
    assert "sphinx-mathjax-offline" in extensions
    assert extensions.index("sphinx-mathjax-offline") > extensions.index("sphinx.ext.mathjax")
    assert "mathjax_path" not in assigned  # the extension sets it to its local copy
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    docs_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    assert any(r.replace("_", "-").startswith("sphinx-mathjax-offline") for r in docs_extra)


def _build(src: Path, out: Path, extensions):
    from sphinx.application import Sphinx

    src.mkdir()
    (src / "conf.py").write_text(f"extensions = {extensions!r}\nproject = 'x'\n")
    (src / "index.rst").write_text("Maths\n=====\n\n.. math::\n\n   H = -\\int p \\ln p\n\nInline :math:`a^2`.\n")
    app = Sphinx(str(src), str(src), str(out), str(out / ".doctrees"), "html", status=None, warning=None, freshenv=True)
    app.build()
    assert app.statuscode == 0


@pytest.mark.slow  # about 5 s on a loaded 2-core machine (Sphinx start-up, MathJax copy)
@pytest.mark.skipif(
    importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("sphinx-mathjax-offline") is None,
    reason="needs the docs extra (sphinx, sphinx-mathjax-offline)",
)
def test_one_page_build_is_offline_only_with_the_extension(tmp_path):
    _build(tmp_path / "a", tmp_path / "offline", ["sphinx.ext.mathjax", "sphinx-mathjax-offline"])
    assert check_offline.check(tmp_path / "offline") == []
    _, scripts, has_math = check_offline.scan_html((tmp_path / "offline" / "index.html").read_text())
    assert has_math and any(s.startswith("_static/mathjax/") for s in scripts)
    _build(tmp_path / "b", tmp_path / "online", ["sphinx.ext.mathjax"])
    problems = check_offline.check(tmp_path / "online")
    assert problems and all("index.html: external asset <script src=" in p for p in problems)
