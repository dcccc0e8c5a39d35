r"""``jax.random``'s threefry numbers, bit for bit, with the hash unrolled.

JAX's default generator is the Threefry-2x32 hash (J. K. Salmon, M. A. Moraes, R. O. Dror,
D. E. Shaw, *Parallel random numbers: as easy as 1, 2, 3*, SC 2011): 20 rounds of
``x0 += x1; x1 = rotl(x1, r) ^ x0`` on 32-bit words, with the key injected every 4 rounds.
On the CPU, JAX lowers the hash as a rolled loop of 5 iterations (``use_rolled_loops=True``
in ``jax/_src/random/threefry2x32.py``), to keep programs small. But each loop is a
control-flow region of its own that XLA's CPU compiler neither fuses with its inputs and
outputs nor compiles cheaply: one ``jax.random.normal(key, (16, 50))`` call site costs
0.45-0.5 s of compilation on a 2-core CPU (0.95 s under a ``vmap`` over keys) and runs in
64-83 us; unrolled, the hash is one elementwise kernel: 0.22-0.26 s of
compilation (vmapped too) and 36 us (measured with the lowering swapped; the values are
identical). AutoGaussianMixture's programs draw at a dozen sites (starting points, the
initial fits' steps, the ELBO's component draws and entropy shifts, the sampler).

So the functions here compute the same hash, unrolled, on the key's data with ``jnp``
integer operations, and build from it what ``jax.random`` builds: :func:`split`,
:func:`fold_in`, :func:`uniform`, :func:`normal`. For a threefry key (typed, or a raw
``uint32[2]`` key of the default implementation) with ``jax_threefry_partitionable`` on
(JAX's default), the results equal ``jax.random``'s bit for bit
(``tests/test_prng.py``), so a fit gives the same numbers whichever is used. Any other key
(another implementation, or the old non-partitionable layout) is passed to ``jax.random``.

The layout reproduced (``jax/_src/random/threefry2x32.py``, partitionable): the ``n``
numbers of a draw hash the counters ``(0, i)``, ``i = 0..n-1`` in row-major order, to
``(b0_i, b1_i)``; 32 random bits are ``b0 ^ b1``, 64 are ``b0 << 32 | b1``. ``split(key, n)``
takes ``(b0_i, b1_i)`` as the ``i``-th key, ``fold_in(key, m)`` hashes the counter ``(0, m)``.
A uniform float has its mantissa from the top bits of the random word and the exponent of
``[1, 2)``, minus 1, scaled to ``[minval, maxval)`` and clipped below at ``minval``; a normal is
``sqrt(2) erfinv(u)`` of a uniform on ``[nextafter(-1, 0), 1)``.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from .fusion import computed_once

__all__ = ["fold_in", "normal", "split", "threefry2x32", "uniform"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: Array, r: int) -> Array:
    return lax.shift_left(x, np.uint32(r)) | lax.shift_right_logical(x, np.uint32(32 - r))


def threefry2x32(k0: Array, k1: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
    """The Threefry-2x32 hash (20 rounds) of the counters ``(x0, x1)`` under the key
    ``(k0, k1)``, all ``uint32`` (broadcast together), unrolled: 5 groups of 4 rounds, the key
    schedule ``(k0, k1, k0 ^ k1 ^ 0x1BD11BDA)`` injected before and after each group."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = x0 ^ _rotate_left(x1, r)
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _key_words(key: Array, size: int = 1):
    """``(words, wrap)`` of a threefry key that this module reproduces: its ``uint32[2]``
    data, and a function that turns ``(..., 2)`` words back into keys of the same kind (typed
    or raw); else ``None``."""
    if not jax.config.jax_threefry_partitionable or size >= 2**32:
        return None  # (JAX's counters are then 64-bit: not reproduced here)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != () or str(jax.random.key_impl(key)) != "threefry2x32":
            return None
        wrap = lambda words: jax.random.wrap_key_data(words, impl="threefry2x32")  # noqa: E731
        return jax.random.key_data(key), wrap
    data = jnp.asarray(key)
    if data.dtype != jnp.uint32 or data.shape != (2,) or jax.config.jax_default_prng_impl != "threefry2x32":
        return None
    return data, lambda words: words


def _hash_counters(words: Array, shape) -> tuple[Array, Array]:
    """The hash of the counters ``(0, i)``, ``i = 0..prod(shape) - 1`` in row-major order."""
    counters = lax.iota(np.uint32, math.prod(shape)).reshape(shape)
    return threefry2x32(words[0], words[1], jnp.zeros_like(counters), counters)


# The uniform and normal draws are computed once (fusion.computed_once): unrolled, the hash
# is elementwise, and XLA's CPU compiler copied it (with the inverse error function of a
# normal draw) into every fused kernel that reads the draw, e.g. into both Adam updates of a
# low-rank factor's gradient, once per column of the (K, d, r) output: 2 x 0.5 ms per SVI
# step at d = 1000 (JAX's rolled loop was a boundary of its own). Keys (split, fold_in) are
# a few words read by the draws' conditionals: no copy worth a conditional. The draws are
# jitted functions of static shapes, so that their 200-odd operations are traced once per
# shape, not at every call site and again for each branch of computed_once.


@partial(jax.jit, static_argnums=1)
def _split_words(words: Array, num: int) -> Array:
    return jnp.stack(_hash_counters(words, (num,)), axis=-1)


@jax.jit
def _fold_in_words(words: Array, data: Array) -> Array:
    return jnp.stack(threefry2x32(words[0], words[1], np.uint32(0), data), axis=-1)


def split(key: Array, num: int = 2) -> Array:
    """``jax.random.split(key, num)``."""
    found = _key_words(key, num)
    if found is None:
        return jax.random.split(key, num)
    words, wrap = found
    return wrap(_split_words(words, num))


def fold_in(key: Array, data: int) -> Array:
    """``jax.random.fold_in(key, data)`` (``data`` a Python or array integer below 2^32)."""
    found = _key_words(key)
    if found is None:
        return jax.random.fold_in(key, data)
    words, wrap = found
    return wrap(_fold_in_words(words, jnp.asarray(data, jnp.uint32)))


def _float_dtype(dtype):
    """``dtype``, or JAX's default float (float64 with ``jax_enable_x64``) for ``None``."""
    return jnp.dtype(jnp.result_type(float) if dtype is None else dtype)


@partial(jax.jit, static_argnums=(1, 2))
def _uniform(words: Array, shape, dtype, minval: Array, maxval: Array) -> Array:
    finfo = jnp.finfo(dtype)
    nbits, nmant = finfo.bits, finfo.nmant
    b0, b1 = _hash_counters(words, shape)
    if nbits == 32:
        bits, uint = b0 ^ b1, jnp.uint32
    else:
        bits, uint = lax.shift_left(b0.astype(jnp.uint64), np.uint64(32)) | b1.astype(jnp.uint64), jnp.uint64
    # the random mantissa under the exponent of 1.0: a float in [1, 2)
    one = np.array(1.0, dtype).view(uint)
    floats = lax.bitcast_convert_type(lax.shift_right_logical(bits, uint(nbits - nmant)) | one, dtype)
    floats = floats - jnp.array(1.0, dtype)
    minval = lax.broadcast_to_rank(minval, len(shape))
    maxval = lax.broadcast_to_rank(maxval, len(shape))
    return lax.max(minval, floats * (maxval - minval) + minval)


@partial(jax.jit, static_argnums=(1, 2))
def _normal(words: Array, shape, dtype) -> Array:
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
    u = _uniform(words, shape, dtype, jnp.asarray(lo), jnp.asarray(1.0, dtype))
    return lax.mul(np.array(np.sqrt(2), dtype), lax.erf_inv(u))


def _reproduced(key, shape, dtype):
    """``(words, shape, dtype)`` where this module reproduces the draw, else ``None``."""
    dtype = _float_dtype(dtype)
    shape = tuple(shape)
    found = _key_words(key, math.prod(shape))
    if found is None or dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        return None
    return found[0], shape, dtype


def uniform(key: Array, shape: tuple[int, ...], dtype=None, minval=0.0, maxval=1.0) -> Array:
    """``jax.random.uniform(key, shape, dtype, minval, maxval)`` (float32 or float64)."""
    found = _reproduced(key, shape, dtype)
    if found is None:
        return jax.random.uniform(key, shape, _float_dtype(dtype), minval, maxval)
    words, shape, dtype = found
    minval, maxval = (lax.convert_element_type(v, dtype) for v in (minval, maxval))
    return computed_once(lambda w, lo, hi: _uniform(w, shape, dtype, lo, hi), words, minval, maxval)


def normal(key: Array, shape: tuple[int, ...], dtype=None) -> Array:
    """``jax.random.normal(key, shape, dtype)`` (float32 or float64)."""
    found = _reproduced(key, shape, dtype)
    if found is None:
        return jax.random.normal(key, shape, _float_dtype(dtype))
    words, shape, dtype = found
    return computed_once(lambda w: _normal(w, shape, dtype), words)
