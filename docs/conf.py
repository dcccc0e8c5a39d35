"""Sphinx configuration of the numpyro-gmm documentation.

Build (offline, warnings as errors), then check that no page loads an external asset::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
    python docs/check_offline.py docs/_build/html

The notebooks live in ``examples/notebooks/`` and are rendered with their committed
outputs (``nb_execution_mode = "off"``); they are copied into ``docs/notebooks/`` (git-ignored)
at the start of every build.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("MPLBACKEND", "Agg")

import numpyro_gmm  # noqa: E402

# -- the notebooks: copied from examples/notebooks (the single source) ----------------------
NOTEBOOKS = ("quickstart", "target_density", "multimodal_posterior", "clustering")
_nb_dst = HERE / "notebooks"
_nb_dst.mkdir(exist_ok=True)
for _name in NOTEBOOKS:
    _src = ROOT / "examples" / "notebooks" / f"{_name}.ipynb"
    if _src.exists():
        shutil.copy2(_src, _nb_dst / f"{_name}.ipynb")

# -- project ---------------------------------------------------------------------------------
project = "numpyro-gmm"
author = "the numpyro-gmm developers"
copyright = "2026, the numpyro-gmm developers"
release = numpyro_gmm.__version__
version = release

# -- general ---------------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    # MathJax served from the build's _static/mathjax (PyPI package sphinx-mathjax-offline),
    # not from a CDN: the built HTML references no external asset (checked in CI by
    # docs/check_offline.py).
    "sphinx-mathjax-offline",
    "sphinx.ext.viewcode",
    "myst_nb",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
root_doc = "index"

# MyST / myst-nb: render the committed outputs, never execute (the build is offline and fast).
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = "off"
nb_output_stderr = "remove"
nb_merge_streams = True

# autodoc + napoleon (Google-style docstrings; reST ``:param:`` fields work as well)
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_inherit_docstrings = False
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True


# -- the API reference: generated from numpyro_gmm.__all__ at every build --------------------
# One directive per public name (autoclass / autofunction / py:data), so a name added to
# __all__ is documented without editing api.rst, and a name autodoc cannot import fails
# the -W build. Data constants take their text from the ``#:`` comment where they are
# defined. The other estimators of numpyro_gmm.entropy get a section of their own.
import inspect  # noqa: E402

import numpyro_gmm.entropy as _entropy_module  # noqa: E402
from sphinx.pycode import ModuleAnalyzer  # noqa: E402

_gen = HERE / "_generated"
_gen.mkdir(exist_ok=True)


def _data_doc(name, obj):
    """``#:`` documentation of a constant re-exported by numpyro_gmm, from its defining module."""
    for mod in (_entropy_module, *(m for m in sys.modules.values() if (getattr(m, "__name__", "") or "").startswith("numpyro_gmm"))):
        if getattr(mod, name, None) is obj:
            try:
                docs = ModuleAnalyzer.for_module(mod.__name__).find_attr_docs()
            except Exception:  # noqa: BLE001 - a module without source: no text
                continue
            if ("", name) in docs:
                return [line for line in docs[("", name)] if line.strip()]
    return []


def _api_lines(module_name, names):
    mod = sys.modules[module_name]
    lines = []
    for name in names:
        obj = getattr(mod, name)
        if inspect.isclass(obj):
            lines += [f".. autoclass:: {module_name}.{name}", "   :members:", ""]
        elif callable(obj):
            lines += [f".. autofunction:: {module_name}.{name}", ""]
        else:
            if isinstance(obj, dict):
                value = "{" + ", ".join(repr(k) + ": ..." for k in obj) + "}"
            else:
                value = repr(obj)
            lines += [f".. py:data:: {module_name}.{name}", f"   :value: {value}", ""]
            lines += ["   " + line for line in _data_doc(name, obj)] + [""]
    return lines


_top = sorted(numpyro_gmm.__all__, key=lambda n: (not inspect.isclass(getattr(numpyro_gmm, n)), n.lower()))
(_gen / "api_top.txt").write_text("\n".join(_api_lines("numpyro_gmm", _top)) + "\n")
_extra = [n for n in _entropy_module.__all__ if n not in numpyro_gmm.__all__]
(_gen / "api_entropy.txt").write_text(
    "\n".join(_api_lines("numpyro_gmm.entropy", _extra) or ["(All are exported at the top level.)"]) + "\n"
)


# -- HTML ------------------------------------------------------------------------------------
html_theme = "sphinx_rtd_theme"
html_title = f"numpyro-gmm {release}"
html_static_path = []
html_theme_options = {"navigation_depth": 3}
