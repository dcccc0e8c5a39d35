r"""``jax.random``'s ``split``, ``fold_in``, ``uniform`` and ``normal`` for threefry keys, bit
for bit, as plain array operations that compile faster on a CPU.

JAX lowers its Threefry-2x32 hash (Salmon, Moraes, Dror, Shaw, *Parallel random numbers: as
easy as 1, 2, 3*, SC 2011) on CPUs to a rolled loop (five iterations of four rounds), which
XLA compiles into a ``while`` loop of about ten kernels: each call site of ``jax.random``
costs about 0.17-0.2 s of XLA compilation on a 2-core CPU, vmapped over 10 keys, against
0.065 s for the same hash written out here as ``uint32`` adds, rotations and xors that fuse
into one kernel (``benchmarks/prng_compile.py``). The package's own random draws (the
initial fits of :class:`~numpyro_gmm.AutoGaussianMixture`, the draws and the entropy's
shift in :class:`~numpyro_gmm.TraceEntropy_ELBO`) go through these functions; the model's
and NumPyro's draws keep ``jax.random``.

The values are those of ``jax.random`` with its default ``threefry2x32`` implementation and
``jax_threefry_partitionable`` (the default since JAX 0.5): counters ``(hi, lo)`` of the
flat index, the two output words xor-ed for 32-bit draws, concatenated for 64-bit ones;
``uniform`` by the mantissa trick, ``normal`` as ``sqrt(2) erfinv(u)`` with ``u`` uniform
on ``(-1, 1)`` (``tests/test_prng.py`` compares them bit for bit). Any other key (a typed
key, another implementation, the non-partitionable scheme) is passed to ``jax.random``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jnp.ndarray

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotate_left(x: Array, r: int) -> Array:
    return lax.shift_left(x, np.uint32(r)) | lax.shift_right_logical(x, np.uint32(32 - r))


def threefry2x32(k0: Array, k1: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
    """The Threefry-2x32 hash (20 rounds) of the counters ``(x0, x1)`` under the key
    ``(k0, k1)``, all ``uint32``, elementwise: the function JAX's ``threefry2x32``
    primitive computes."""
    k2 = k0 ^ k1 ^ np.uint32(0x1BD11BDA)
    ks = (k0, k1, k2)
    x0, x1 = x0 + k0, x1 + k1
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, r) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _is_raw_threefry(key) -> bool:
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    return (
        not jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        and key.dtype == jnp.uint32
        and key.shape == (2,)
        and jax.config.jax_default_prng_impl == "threefry2x32"
        and jax.config.jax_threefry_partitionable
    )


def _hash_of_index(key: Array, shape: tuple[int, ...]) -> tuple[Array, Array]:
    """Both output words of the hash of the counters ``(0, i)``, ``i`` the flat index."""
    n = math.prod(shape)
    if n >= 2**32:
        raise ValueError(f"draws of {n} numbers need 64-bit counters; at most 2**32 - 1 here")
    lo = lax.iota(np.uint32, n).reshape(shape)
    return threefry2x32(key[0], key[1], jnp.zeros_like(lo), lo)


def split(key: Array, num: int = 2) -> Array:
    """``jax.random.split(key, num)``: ``(num, 2)`` keys."""
    if not _is_raw_threefry(key):
        return jax.random.split(key, num)
    return jnp.stack(_hash_of_index(key, (num,)), axis=-1)


def fold_in(key: Array, data: int) -> Array:
    """``jax.random.fold_in(key, data)`` for a Python ``int`` ``0 <= data < 2**32``."""
    if not _is_raw_threefry(key) or not 0 <= int(data) < 2**32:
        return jax.random.fold_in(key, data)
    # threefry_2x32(key, [0, data]): the counters are the two halves of the seed's words
    a, b = threefry2x32(key[0], key[1], jnp.zeros((1,), np.uint32), jnp.full((1,), data, np.uint32))
    return jnp.concatenate([a, b])


def _bits(key: Array, shape: tuple[int, ...], width: int) -> Array:
    a, b = _hash_of_index(key, shape)
    if width == 32:
        return a ^ b
    return lax.shift_left(a.astype(np.uint64), np.uint64(32)) | b.astype(np.uint64)


def uniform(key: Array, shape=(), dtype=None, minval=0.0, maxval=1.0) -> Array:
    """``jax.random.uniform(key, shape, dtype, minval, maxval)`` (float32 or float64)."""
    shape = tuple(shape)
    dtype = jax.dtypes.canonicalize_dtype(float) if dtype is None else jnp.dtype(dtype)
    if not _is_raw_threefry(key) or dtype not in (jnp.float32, jnp.float64):
        return jax.random.uniform(key, shape, dtype, minval, maxval)
    finfo = jnp.finfo(dtype)
    nbits, nmant = finfo.bits, finfo.nmant
    uint = np.uint32 if nbits == 32 else np.uint64
    bits = lax.shift_right_logical(_bits(key, shape, nbits), uint(nbits - nmant))
    one = np.array(1.0, dtype).view(uint)
    floats = lax.bitcast_convert_type(bits | one, dtype) - jnp.array(1.0, dtype)
    minval, maxval = jnp.asarray(minval, dtype), jnp.asarray(maxval, dtype)
    return lax.max(minval, floats * (maxval - minval) + minval)


def normal(key: Array, shape=(), dtype=None) -> Array:
    """``jax.random.normal(key, shape, dtype)`` (float32 or float64)."""
    shape = tuple(shape)
    dtype = jax.dtypes.canonicalize_dtype(float) if dtype is None else jnp.dtype(dtype)
    if not _is_raw_threefry(key) or dtype not in (jnp.float32, jnp.float64):
        return jax.random.normal(key, shape, dtype)
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
    u = uniform(key, shape, dtype, lo, 1.0)
    return np.array(np.sqrt(2), dtype) * lax.erf_inv(u)
