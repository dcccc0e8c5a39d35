"""Weak compositions as data (NumPy, built once, cached).

A *weak composition* of ``n`` into ``K`` parts is a vector ``m`` of ``K`` non-negative
integers with ``sum(m) == n``; there are ``C(n + K - 1, K - 1)`` of them. The power
integrals ``integral p(x)^n dx`` of a ``K``-component mixture expand over exactly these
vectors (see :mod:`numpyro_gmm._kernels.power_integrals`).

Nothing here is traced. Every table is built with vectorised NumPy (one loop over the
parts, never one per composition), cached per argument tuple, and returned read-only so
that a cached table cannot be corrupted by a caller.

The engine never materialises all compositions of a large problem. It splits the ``K``
components into two halves ``A`` (the first ``ceil(K/2)``) and ``B`` (the rest): every
composition of ``n`` is exactly one pair ``(m_A, m_B)`` with ``|m_A| = s`` and
``|m_B| = n - s``. The half tables (all compositions of totals ``0..n_max`` into
``K/2`` parts) are small -- ``C(n_max + K/2, K/2)`` rows -- and the pairs are enumerated
on the device from a short list of *cells* ``(n, s)`` (:func:`pair_schedule`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

__all__ = [
    "num_compositions",
    "weak_compositions",
    "compositions_up_to",
    "PairSchedule",
    "pair_schedule",
    "unrank_table",
    "unrank_tables",
]

_INT32_MAX = np.iinfo(np.int32).max


def num_compositions(n: int, K: int) -> int:
    """Number of weak compositions of ``n`` into ``K`` parts, ``C(n + K - 1, K - 1)``."""
    if n < 0 or K < 0:
        return 0
    if K == 0:
        return 1 if n == 0 else 0
    return math.comb(n + K - 1, K - 1)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@lru_cache(maxsize=64)
def compositions_up_to(n_max: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """All weak compositions of every total ``0..n_max`` into ``K`` parts.

    Returns ``(table, offsets)``: ``table`` is an ``int8`` array of shape
    ``(C(n_max + K, K), K)`` whose rows are sorted by total and, within one total,
    lexicographically; rows of total ``s`` are ``table[offsets[s]:offsets[s + 1]]``.
    ``K == 0`` gives the single empty composition (of total 0).
    """
    if n_max < 0 or K < 0:
        raise ValueError(f"n_max and K must be >= 0, got n_max={n_max}, K={K}")
    if n_max > 127:
        raise ValueError(f"n_max={n_max} does not fit the int8 table (max 127)")
    rows = np.zeros((1, 0), dtype=np.int8)
    totals = np.zeros(1, dtype=np.int64)
    # Append one part at a time: a row of total t gets every value v in 0..n_max - t.
    # Parents stay in order and values ascend, so the rows stay lexicographically sorted.
    for _ in range(K):
        reps = n_max - totals + 1
        parent = np.repeat(np.arange(len(rows)), reps)
        start = np.cumsum(reps) - reps
        value = np.arange(len(parent)) - np.repeat(start, reps)
        rows = np.concatenate([rows[parent], value[:, None].astype(np.int8)], axis=1)
        totals = totals[parent] + value
    # A stable sort by total keeps the lexicographic order within each total.
    order = np.argsort(totals, kind="stable")
    rows, totals = rows[order], totals[order]
    offsets = np.searchsorted(totals, np.arange(n_max + 2)).astype(np.int64)
    return _readonly(np.ascontiguousarray(rows)), _readonly(offsets)


@lru_cache(maxsize=128)
def weak_compositions(n: int, K: int) -> np.ndarray:
    """All weak compositions of ``n`` into ``K`` parts, ``int8`` array ``(C(n+K-1, K-1), K)``.

    Rows are in lexicographic order. Cached per ``(n, K)``.
    """
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    # The compositions of n into K parts are those of totals <= n into K - 1 parts,
    # completed by the slack n - total as the last part.
    head, _ = compositions_up_to(n, K - 1)
    last = n - head.astype(np.int64).sum(axis=1)
    table = np.concatenate([head, last[:, None].astype(np.int8)], axis=1)
    order = np.lexsort([table[:, k] for k in range(K - 1, -1, -1)])
    return _readonly(np.ascontiguousarray(table[order]))


class PairSchedule(NamedTuple):
    """How the compositions of ``n = n_min..n_max`` into ``K`` parts are walked in blocks.

    ``K`` components are split into halves of ``K_a = ceil(K/2)`` and ``K_b = K - K_a``
    parts. A *cell* ``(n, s)`` holds the ``count_a[s] * count_b[n - s]`` compositions whose
    first half sums to ``s``; its pairs are numbered row-major (first half slow). Each
    cell is padded to whole blocks of ``block_size``, so every block lies in one cell and
    hence has one total ``n``.

    All arrays are small (one entry per cell, at most ``(n_max + 1)^2 / 2`` of them). The
    half tables themselves are not built here (the engine unranks them on the device,
    :func:`unrank_table`); :attr:`half_a` and :attr:`half_b` build them in NumPy on demand.
    """

    K: int
    n_max: int
    K_a: int
    K_b: int
    rows_a: int  # C(n_max + K_a, K_a): rows of the first half table (totals 0..n_max)
    rows_b: int
    cell_n: np.ndarray  # (cells,) int32: the total n of each cell
    cell_start_a: np.ndarray  # (cells,) int32: first row of half_a in the cell
    cell_start_b: np.ndarray  # (cells,) int32: first row of half_b in the cell
    cell_count_b: np.ndarray  # (cells,) int32: rows of half_b in the cell
    cell_count: np.ndarray  # (cells,) int32: compositions in the cell
    cell_first_block: np.ndarray  # (cells + 1,) int32: cumulative block counts
    block_size: int
    num_blocks: int
    num_compositions: int

    @property
    def half_a(self) -> np.ndarray:
        """``(rows_a, K_a)`` int8: compositions of totals ``0..n_max`` into ``K_a`` parts."""
        return compositions_up_to(self.n_max, self.K_a)[0]

    @property
    def half_b(self) -> np.ndarray:
        """``(rows_b, K_b)`` int8: compositions of totals ``0..n_max`` into ``K_b`` parts."""
        return compositions_up_to(self.n_max, self.K_b)[0]


def _offsets(n_max: int, K: int) -> np.ndarray:
    """``offsets[s]``: first row of total ``s`` in ``compositions_up_to(n_max, K)`` (closed form)."""
    counts = [num_compositions(s, K) for s in range(n_max + 1)]
    return np.concatenate([[0], np.cumsum(np.array(counts, dtype=np.int64))])


@lru_cache(maxsize=64)
def unrank_tables(n_max: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Small tables from which any row of ``compositions_up_to(n_max, K)`` is computed.

    Returns ``(offsets, prefix)``: ``offsets`` ``(n_max + 2,)`` as in
    :func:`compositions_up_to`, and ``prefix`` ``(K, n_max + 1, n_max + 2)`` int64 with
    ``prefix[j, s, v]`` the number of compositions of ``s`` into ``K - j`` parts whose first
    part is ``< v`` (for ``v <= s``; larger ``v`` hold a sentinel above every rank). In
    lexicographic order, the first part of the composition of rank ``q`` among those of
    total ``s`` is the largest ``v`` with ``prefix[j, s, v] <= q``.
    """
    big = np.iinfo(np.int64).max // 4
    prefix = np.full((max(K, 0), n_max + 1, n_max + 2), big, dtype=np.int64)
    for j in range(K):
        parts = K - j
        for s in range(n_max + 1):
            counts = [num_compositions(s - u, parts - 1) for u in range(s + 1)]
            prefix[j, s, : s + 1] = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return _readonly(_offsets(n_max, K)), _readonly(prefix)


def unrank_table(n_max: int, K: int) -> np.ndarray:
    """``compositions_up_to(n_max, K)[0]`` rebuilt row by row from :func:`unrank_tables`.

    NumPy mirror of the engine's device unranking (used by the tests).
    """
    offsets, prefix = unrank_tables(n_max, K)
    rows = np.arange(offsets[-1])
    total = np.searchsorted(offsets[1:], rows, side="right")
    rank = rows - offsets[total]
    out = np.zeros((len(rows), K), dtype=np.int8)
    for j in range(K):
        table = prefix[j, total]  # (C, n_max + 2)
        v = np.sum(table <= rank[:, None], axis=1) - 1
        rank = rank - table[np.arange(len(rows)), v]
        total = total - v
        out[:, j] = v
    return out


@lru_cache(maxsize=64)
def pair_schedule(n_min: int, n_max: int, K: int, block_size: int) -> PairSchedule:
    """The cell list and block layout for all compositions of ``n_min..n_max`` into ``K`` parts.

    The block size actually used is ``min(block_size, next power of two >= largest cell)``,
    so that small problems are not padded to a large block.

    Raises ``ValueError`` when one cell holds more compositions than an ``int32`` can
    index (about 2.1e9: a problem far too large to evaluate anyway).
    """
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if not 0 <= n_min <= n_max:
        raise ValueError(f"need 0 <= n_min <= n_max, got {n_min}, {n_max}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    K_a = (K + 1) // 2
    K_b = K - K_a
    # Sizes first (closed forms), so that an impossible request fails before allocating.
    cnt_a = np.array([num_compositions(s, K_a) for s in range(n_max + 1)], dtype=object)
    cnt_b = np.array([num_compositions(s, K_b) for s in range(n_max + 1)], dtype=object)
    cells = [
        (n, s)
        for n in range(n_min, n_max + 1)
        for s in range(n + 1)
        if cnt_a[s] > 0 and cnt_b[n - s] > 0
    ]
    n_arr = np.array([c[0] for c in cells], dtype=np.int64)
    s_arr = np.array([c[1] for c in cells], dtype=np.int64)
    count = cnt_a[s_arr] * cnt_b[n_arr - s_arr]
    biggest = int(count.max())
    if biggest + block_size > _INT32_MAX:
        raise ValueError(
            f"K={K} with powers up to {n_max} has cells of {biggest:.3g} compositions "
            f"({sum(num_compositions(n, K) for n in range(n_min, n_max + 1)):.3g} in all), "
            "more than int32 can index; lower the order"
        )
    count = count.astype(np.int64)
    off_a, off_b = _offsets(n_max, K_a), _offsets(n_max, K_b)
    bs = int(min(block_size, 1 << max(biggest - 1, 0).bit_length()))
    blocks = -(-count // bs)
    first_block = np.concatenate([[0], np.cumsum(blocks)])
    if first_block[-1] > _INT32_MAX:
        raise ValueError(f"too many blocks ({first_block[-1]}); raise block_size")
    i32 = lambda a: _readonly(np.asarray(a, dtype=np.int32))  # noqa: E731
    return PairSchedule(
        K=K,
        n_max=n_max,
        K_a=K_a,
        K_b=K_b,
        rows_a=int(off_a[-1]),
        rows_b=int(off_b[-1]),
        cell_n=i32(n_arr),
        cell_start_a=i32(off_a[s_arr]),
        cell_start_b=i32(off_b[n_arr - s_arr]),
        cell_count_b=i32(np.diff(off_b)[n_arr - s_arr]),
        cell_count=i32(count),
        cell_first_block=i32(first_block),
        block_size=bs,
        num_blocks=int(first_block[-1]),
        num_compositions=int(count.sum()),
    )
