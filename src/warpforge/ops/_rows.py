"""Shared machinery of the row-wise ops (softmax, norms, reductions): viewing a tensor as rows,
and the cross-program exchange of the ``split`` path (see ``runtime/heuristics.py``).

The exchange: each of the C programs that share a row publishes two fp32 statistics of its chunk
into ``stats[row, chunk, 0:2]`` and then polls the row's 2*C slots until none holds the sentinel
the workspace was filled with. Each slot is one 32-bit word written once by one relaxed atomic, so
a reader that sees a non-sentinel value sees the final value: no counter and, above all, no
release fence. (A first version bumped a per-row counter with release semantics; the fence waits
for the program's previous row of output stores to drain, and the split path ran at 47-63% of the
copy roof on an H200. See benchmarks/NOTES.md.) The sentinel is a NaN bit pattern that arithmetic
never produces (the hardware's NaNs are 0x7FFFFFFF).

Kernels issue the loads of their *next* row first, then compute and publish this row's statistics
and wait: the statistics and the wait overlap the next row's DRAM latency instead of idling the
memory pipe (publishing first and prefetching after left the max/exp/sum critical path exposed:
75% -> 82% of the copy roof at N = 32K once moved).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import interpreting
from ..runtime.heuristics import RowConfig, persistent_grid, resident_programs
from ..runtime.launch import run


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """View ``t`` as (M, N) rows with unit column stride; copies only when that is impossible.
    Rows may have any stride (including 0, for expanded gradients)."""
    n = t.shape[-1]
    t2 = t.reshape(-1, n)
    if t2.stride(-1) != 1 and n > 1:
        t2 = t2.contiguous()
    return t2


SENTINEL = tl.constexpr(0x7FA00001)  # int32 bits of a NaN that no float arithmetic produces
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def load_cols(ptr, mask, other, MASKED: tl.constexpr, POLICY: tl.constexpr):
    """One step's load in a row loop (``POLICY``: its eviction policy): masked, ``other`` where
    ``mask`` is off, or, for a loop whose kernel has N compiled in (a whole number of steps, so
    MASKED false), with no mask at all; the mask the caller built is then left unused."""
    if MASKED:
        v = tl.load(ptr, mask=mask, other=other, eviction_policy=POLICY)
    else:
        v = tl.load(ptr, eviction_policy=POLICY)
    return v


@triton.jit
def store_cols(ptr, v, mask, MASKED: tl.constexpr):
    """One step's store in a row loop: masked, or not at all with N compiled in (see load_cols)."""
    if MASKED:
        tl.store(ptr, v, mask=mask)
    else:
        tl.store(ptr, v)


@triton.jit
def exp_minus(x, m):
    """exp(x - m) as one FMA and one ex2 an element (x * log2 e - m * log2 e); ``tl.exp(x - m)``
    costs a subtract, a multiply and the ex2. Row kernels moving bf16 at ~4.2 TB/s have ~32 issue
    slots an element for everything (33.5 T thread-instructions a second on an H200 over 1.05 T
    elements read and written); the cross-entropy kernel was issue-bound at ~22 (NOTES.md)."""
    return tl.exp2(tl.fma(x, LOG2E, -m * LOG2E))


@triton.jit
def online_update(m_v, s_v, x):
    """One block of the online softmax statistics, per lane: running max and sum of exp(x - max)
    rescaled as the max grows (an all -inf lane keeps max -inf and sum 0)."""
    m_new = tl.maximum(m_v, x)
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    return m_new, s_v * tl.exp(m_v - m_safe) + exp_minus(x, m_safe)


@triton.jit
def online_finish(m_v, s_v):
    """Combine the lanes of ``online_update``: (max, sum of exp(x - max)) of the row (max 0 for an
    all -inf row, whose sum is then 0)."""
    m = tl.max(m_v, axis=0)
    m = tl.where(m == -float("inf"), 0.0, m)
    return m, tl.sum(s_v * tl.exp(m_v - m), axis=0)


@triton.jit
def publish_row_stats(stats_ptr, row, chunk, C, s0, s1):
    """Publish (s0, s1), this chunk's fp32 statistics of ``row``, to the int32 workspace."""
    base = stats_ptr + tl.cast(row, tl.int64) * C * 2 + chunk * 2
    tl.atomic_xchg(base, s0.to(tl.int32, bitcast=True), sem="relaxed")
    tl.atomic_xchg(base + 1, s1.to(tl.int32, bitcast=True), sem="relaxed")


@triton.jit
def gather_row_stats(stats_ptr, row, C, CP: tl.constexpr):
    """Wait until all C chunks of ``row`` have published; return their statistics as two fp32
    vectors of length CP (entries past C are 0) and the validity mask."""
    base = stats_ptr + tl.cast(row, tl.int64) * C * 2
    offs = tl.arange(0, CP)
    valid = offs < C
    a = tl.load(base + offs * 2, mask=valid, other=0, volatile=True)
    b = tl.load(base + offs * 2 + 1, mask=valid, other=0, volatile=True)
    pending = tl.sum(((a == SENTINEL) | (b == SENTINEL)).to(tl.int32), axis=0)
    while pending > 0:
        a = tl.load(base + offs * 2, mask=valid, other=0, volatile=True)
        b = tl.load(base + offs * 2 + 1, mask=valid, other=0, volatile=True)
        pending = tl.sum(((a == SENTINEL) | (b == SENTINEL)).to(tl.int32), axis=0)
    return a.to(tl.float32, bitcast=True), b.to(tl.float32, bitcast=True), valid


# resident programs per (kernel, constexprs, dtypes): read once from the compiled kernel
_RESIDENT: dict = {}


def split_launch(kernel, m: int, cfg: RowConfig, device: torch.device, args, **constexprs) -> None:
    """Launch a ``split``- or ``pipe``-mode kernel over ``m`` rows: allocates the exchange workspace, sizes a
    persistent grid that the device holds at once, and passes (stats, C, n_groups, CP) after the
    kernel's own arguments. ``args`` is that tuple, or a function of ``n_groups`` returning it
    (for kernels with per-group outputs, such as weight-gradient partial sums: it is called once
    with n_groups = 1 to compile and size the grid, then with the real count)."""
    make = args if callable(args) else (lambda _groups: args)
    c = cfg.chunks
    cp = triton.next_power_of_2(c)
    stats = torch.full((m, c, 2), SENTINEL.value, device=device, dtype=torch.int32)
    probe = make(1)
    key = (kernel, cfg.num_warps, tuple(sorted(constexprs.items())),
           tuple(a.dtype if isinstance(a, torch.Tensor) else None for a in probe))
    resident = 1 if interpreting() else _RESIDENT.get(key)
    if resident is None:
        compiled = kernel.warmup(*probe, stats, c, 1, CP=cp, grid=(1,), num_warps=cfg.num_warps, **constexprs)
        resident = _RESIDENT[key] = resident_programs(compiled, cfg.num_warps)
    grid = persistent_grid(m * c, c, resident)
    groups = grid // c
    run(kernel, (grid,), (*(probe if groups == 1 else make(groups)), stats, c, groups),
        CP=cp, num_warps=cfg.num_warps, **constexprs)
