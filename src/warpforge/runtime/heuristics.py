"""Launch heuristics for every warpforge kernel, in one place.

Row-wise ops (softmax, norms, reductions) pick one of three shapes by the row length N:

``block``  N <= 16,384: a program holds whole rows in registers (ROWS rows of BLOCK_N), reads
           each element once and writes it once: the byte floor. Short rows are packed several
           to a program so each program still moves ~8 KB.
``split``  16,384 < N: one row would need more registers than an SM has (262,144 fp32 values are
           1 MiB; an SM's register file is 256 KB), so C = N / CHUNK co-resident programs share a
           row, each holding its CHUNK in registers. They exchange per-chunk statistics through a
           small global workspace and wait on a per-row counter, then finish their chunk: still one
           read and one write per element. The grid is persistent and never larger than what the
           device holds at once, so every program of a row is resident and the wait cannot deadlock.
``loop``   the fallback (and the interpreter's path past 16,384, since it runs programs one at a
           time and a wait would never end): one program per row walks it in CHUNK pieces, twice
           (statistics, then output). Reads the row twice: ~2/3 of the byte floor at best.
"""
from __future__ import annotations

import dataclasses
import functools

import triton

from . import interpreting
from .device import device_info, sm_count

BLOCK_MAX = 16384          # largest row a single program keeps in registers
CHUNK = 8192               # elements per program in the split and loop paths
SPLIT_MAX_CHUNKS = 64      # split path up to N = 64 * CHUNK = 524,288; loop past that
ELEMS_PER_PROGRAM = 4096   # pack short rows until a program holds about this many elements


@dataclasses.dataclass(frozen=True)
class RowConfig:
    mode: str          # "block" | "split" | "loop"
    block_n: int       # columns a program holds at once (the row, or one chunk)
    rows: int          # rows per program (block mode)
    num_warps: int
    chunks: int = 1    # programs per row (split mode)


def _warps_for(elems: int) -> int:
    if elems <= 1024:
        return 4
    if elems <= 4096:
        return 8 if elems > 2048 else 4
    if elems <= 8192:
        return 8
    return 16


@functools.lru_cache(maxsize=4096)
def row_config(n: int, split_ok: bool = True) -> RowConfig:
    """How a row-wise kernel covers rows of length ``n``."""
    block = triton.next_power_of_2(n)
    if block <= BLOCK_MAX:
        rows = max(1, min(64, ELEMS_PER_PROGRAM // block))
        return RowConfig("block", block, rows, _warps_for(block * rows))
    chunks = triton.cdiv(n, CHUNK)
    if split_ok and not interpreting() and chunks <= SPLIT_MAX_CHUNKS:
        return RowConfig("split", CHUNK, 1, _warps_for(CHUNK), chunks)
    return RowConfig("loop", CHUNK, 1, _warps_for(CHUNK))


def resident_programs(compiled, num_warps: int) -> int:
    """How many programs of a compiled kernel the whole device holds at once, from its register
    and shared-memory use (the occupancy calculation, kept conservative)."""
    if interpreting():
        return 1
    info = device_info()
    threads = 32 * num_warps
    regs = max(int(getattr(compiled, "n_regs", 0) or 0), 1)
    regs_per_warp = ((regs * 32 + 255) // 256) * 256        # allocated per warp in 256s
    by_regs = info.regs_per_sm // (regs_per_warp * num_warps)
    shared = int(compiled.metadata.shared) if hasattr(compiled, "metadata") else 0
    by_smem = (info.smem_per_sm // shared) if shared and info.smem_per_sm else 32
    by_threads = 2048 // threads
    per_sm = max(1, min(by_regs, by_smem, by_threads, 32))
    return per_sm * info.sm_count


def persistent_grid(programs: int, per_group: int = 1, resident: int | None = None) -> int:
    """A persistent grid: no more programs than there is work, nor than fit on the device at
    once; a multiple of ``per_group`` so groups of programs that cooperate stay whole."""
    cap = resident if resident is not None else sm_count()
    cap = max(per_group, (cap // per_group) * per_group)
    return max(per_group, min(cap, triton.cdiv(programs, per_group) * per_group))
