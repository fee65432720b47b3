"""Shared machinery of the row-wise ops (softmax, norms, reductions): viewing a tensor as rows,
and the cross-program exchange of the ``split`` path (see ``runtime/heuristics.py``).

The exchange: each of the C programs that share a row publishes two fp32 statistics of its chunk
to ``stats[row, chunk, 0:2]``, bumps ``counter[row]`` with release semantics, and spins with
acquire loads until the counter reaches C. Then every program reads all C pairs (volatile, so no
stale L1 line) and combines them itself -- C is at most 64, so that is one tiny load. Cost per row:
two atomics and one round trip to L2 (~1-2 us), hidden behind the other resident programs' loads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime.heuristics import RowConfig, persistent_grid, resident_programs


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """View ``t`` as (M, N) rows with unit column stride; copies only when that is impossible.
    Rows may have any stride (including 0, for expanded gradients)."""
    n = t.shape[-1]
    t2 = t.reshape(-1, n)
    if t2.stride(-1) != 1 and n > 1:
        t2 = t2.contiguous()
    return t2


@triton.jit
def exchange_row_stats(stats_ptr, count_ptr, row, chunk, C, s0, s1, CP: tl.constexpr):
    """Publish (s0, s1) for this chunk of ``row``; wait for all C chunks; return the C pairs as two
    vectors of length CP (entries past C are 0) and their validity mask."""
    base = stats_ptr + row.to(tl.int64) * C * 2
    tl.store(base + chunk * 2, s0)
    tl.store(base + chunk * 2 + 1, s1)
    tl.debug_barrier()
    tl.atomic_add(count_ptr + row, 1, sem="release")
    seen = tl.atomic_add(count_ptr + row, 0, sem="acquire")
    while seen < C:
        seen = tl.atomic_add(count_ptr + row, 0, sem="acquire")
    offs = tl.arange(0, CP)
    valid = offs < C
    a = tl.load(base + offs * 2, mask=valid, other=0.0, volatile=True)
    b = tl.load(base + offs * 2 + 1, mask=valid, other=0.0, volatile=True)
    return a, b, valid


# resident programs per (kernel, constexprs, dtypes): read once from the compiled kernel
_RESIDENT: dict = {}


def split_launch(kernel, m: int, cfg: RowConfig, device: torch.device, args: tuple, **constexprs) -> None:
    """Launch a ``split``-mode kernel over ``m`` rows: allocates the exchange workspace, sizes a
    persistent grid that the device holds at once, and passes (stats, counter, C, n_groups, CP)
    after ``args``."""
    c = cfg.chunks
    cp = triton.next_power_of_2(c)
    stats = torch.empty((m, c, 2), device=device, dtype=torch.float32)
    counter = torch.zeros((m,), device=device, dtype=torch.int32)
    full = (*args, stats, counter, c, 1)
    key = (kernel, tuple(sorted(constexprs.items())), tuple(a.dtype if isinstance(a, torch.Tensor) else None for a in args))
    resident = _RESIDENT.get(key)
    if resident is None:
        compiled = kernel.warmup(*full, CP=cp, grid=(1,), num_warps=cfg.num_warps, **constexprs)
        resident = _RESIDENT[key] = resident_programs(compiled, cfg.num_warps)
    grid = persistent_grid(m * c, c, resident)
    kernel[(grid,)](*args, stats, counter, c, grid // c, CP=cp, num_warps=cfg.num_warps, **constexprs)
