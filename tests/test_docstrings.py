"""The examples in the public docstrings run and print what they say (doctest)."""

import doctest
import importlib
import pkgutil

import pytest

import numpyro_gmm

MODULES = sorted(m.name for m in pkgutil.walk_packages(numpyro_gmm.__path__, "numpyro_gmm."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
