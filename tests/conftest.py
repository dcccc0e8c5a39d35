"""Test configuration: float64 runs are selected with ``JAX_ENABLE_X64=1`` (a separate CI pass)."""

import jax
import numpy as np
import pytest

X64 = bool(jax.config.jax_enable_x64)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def ftype():
    """The float dtype of this pass (float64 with JAX_ENABLE_X64=1, else float32)."""
    return np.float64 if X64 else np.float32
