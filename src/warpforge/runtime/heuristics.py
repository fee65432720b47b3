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
``pipe``   the split exchange with each program's wait deferred by one row (it publishes row r,
           then finishes row r - n_groups, whose statistics are already there): the exchange's
           latency leaves the critical path. The long-row default past 32K (per op, below).
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
CHUNK = 4096               # elements per program in the split and loop paths
SPLIT_WARPS = 4            # 32 elements a thread: 16 resident programs an SM hide the exchange best
SPLIT_MAX_CHUNKS = 128     # split path up to N = 128 * CHUNK = 524,288; loop past that
ELEMS_PER_PROGRAM = 4096   # pack short rows until a program holds about this many elements
GRAD_PROGRAMS_PER_SM = 2   # programs per SM a weight-gradient grid aims for (RowConfig.grad_per_sm)


@dataclasses.dataclass(frozen=True)
class RowConfig:
    mode: str          # "block" | "split" | "loop"
    block_n: int       # columns a program holds at once (the row, or one chunk)
    rows: int          # rows per program (block mode)
    num_warps: int
    chunks: int = 1    # programs per row (split and pipe modes)
    reload: bool = False   # pipe mode: re-read the per-column weight (and bias) every row
    grad_per_sm: int = GRAD_PROGRAMS_PER_SM   # block-mode norm backward: weight-gradient grid (grad_grid)
    stages: int = 0    # norm backward (block): row tiles staged through shared memory by the
                       # compiler's software pipeline this many deep; 0: one tile prefetched in registers
    const_n: bool = False  # norm forward (loop): N compiled into the kernel (fixed trip counts, no masks)


def warps_for(elems: int) -> int:
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
        return RowConfig("block", block, rows, warps_for(block * rows))
    chunks = triton.cdiv(n, CHUNK)
    if split_ok and not interpreting() and chunks <= SPLIT_MAX_CHUNKS:
        return RowConfig("split", CHUNK, 1, SPLIT_WARPS, chunks)
    return RowConfig("loop", CHUNK, 1, warps_for(CHUNK))


# Rows past BLOCK_MAX, on a GPU (norm forward, softmax forward and backward, amax backward): to 32K
# a single program of 32 warps still holds the row (32 fp32 values a thread) and beats the split
# exchange; past that each op picks its split chunk (fewer programs to wait on per row as N grows).
# H100, bf16, M*N = 2^27, % of copy (benchmarks/NOTES.md): at N = 32K block x 32 warps RMSNorm 97.7,
# LayerNorm 95.0, softmax forward 94.3 / log-softmax 94.7, backward 97.2 / 100.8 (split 4,096 x 4:
# 89.7, 79.4, 90.0 / 90.4, 94.7 / 97.1; torch.compile's norms 96.1 / 92.5).
WIDE_BLOCK_MAX = 32768
WIDE_WARPS = 32


def _wide_row(n: int) -> RowConfig | None:
    """``row_config(n)`` in the interpreter and for rows a program holds anyway, one 32-warp
    program a row up to WIDE_BLOCK_MAX on a GPU; None past that (the caller picks its split)."""
    base = row_config(n)
    if interpreting() or base.mode == "block":
        return base
    block = triton.next_power_of_2(n)
    return RowConfig("block", block, 1, WIDE_WARPS) if block <= WIDE_BLOCK_MAX else None


def _exchange_or_row(mode: str, n: int, chunk: int, warps: int, reload: bool = False) -> RowConfig:
    """A ``split`` or ``pipe`` config of ``chunk``-column programs, or ``row_config(n)`` past
    SPLIT_MAX_CHUNKS chunks a row."""
    chunks = triton.cdiv(n, chunk)
    return RowConfig(mode, chunk, 1, warps, chunks, reload) if chunks <= SPLIT_MAX_CHUNKS else row_config(n)


# Past 32K the ``pipe`` mode: the split exchange with the wait deferred by one row (a program
# publishes row r and then finishes row r - n_groups, whose statistics are already there), so the
# exchange latency leaves the critical path; each program holds three rows' chunks. H100, bf16,
# M*N = 2^27, % of copy (benchmarks/NOTES.md, 2026-11-22):
#   norm forward   262K RMSNorm 8,192 x 4 94.7 (split 16,384 x 8: 75.7); LayerNorm 8,192 x 4 with the
#                  weight and bias re-read every row 88.7 (held in registers 75.5, split 70.6);
#                  add+RMSNorm 97.0 (90.6). 65K: RMSNorm 8,192 x 4 re-read 92.8 (split 4,096 x 4
#                  90.0), LayerNorm 4,096 x 4 re-read 84.2 (split 8,192 x 4 84.1).
#   norm backward  65K 2,048 x 4: RMSNorm 82.8, LayerNorm 77.5 (split 4,096 x 4: 76.2 / 64.1);
#                  262K 8,192 x 8: 84.3 / 75.2 (the two-pass loop: 57.3 / 52.6). At 32K the split
#                  stays (83.3 / 69.3; pipe 82.4 / 69.9).
#   softmax        262K forward 8,192 x 4 89.5 / 92.2 (softmax / log-softmax; split 80.6 / 88.8),
#                  backward 8,192 x 8 95.3 / 87.7 (split 16,384 x 8 90.2 / 81.0). At 65K the split
#                  4,096 x 4 stays (93.8 / 96.9, pipe <= 89.7 forward).
# Some pipe shapes misbehave badly (softmax backward 8,192 x 4: 45% at 262K, 3% at 65K, repeatably),
# so only measured shapes are used.
#
# Norm forward over rows of 4K < N <= 8K with rows enough to fill the chip and no residual: the
# two-pass loop kernel (pass 1 reads x marked evict-last, pass 2 re-reads it from L2 marked
# evict-first), as torch.compile's looped reduction does. H100, 16384 x 8192 bf16 (NOTES item 42):
# RMSNorm 4,096 x 16 warps 180.8 us, LayerNorm 8,192 x 16 181.0, against the block kernel's 182.9 /
# 183.2 and torch.compile's 181.0 / 180.9; at 16K and 32K the block kernel stays ahead. The C++
# fast path declines these calls (it replays the block kernel whatever M is).
NORM_LOOP_MIN_N, NORM_LOOP_MAX_N = 4097, 8192
NORM_LOOP_ROWS_PER_SM = 2
NORM_LOOP = {False: (4096, 16), True: (8192, 16)}   # RMSNorm, LayerNorm: elements a step, warps
# On the H200 (4.8 TB/s over the same 132 SMs) the LayerNorm loop is 15% behind the block kernel
# at 16384 x 8192: 152.8 against 133.2 us, torch.compile 145.3 (benchmarks/probe_norm_long.py,
# NOTES item 50), so LayerNorm keeps the block kernel on devices named here. RMSNorm's loop stays
# ahead there too (131.1 against 133.3).
NORM_LOOP_NO_LAYER = ("H200",)
# Also on the H200 (NOTES item 58, benchmarks/probe_norm_long.py, M*N = 2^27 bf16): RMSNorm rows of
# 16K < N <= 32K take the loop, 8,192 x 32 warps (32K: 135.6 us, 93.6% of copy, against the block
# kernel's 146.8, 86.5%; torch.compile 132.6), and LayerNorm's block kernel takes fewer warps:
# rows of 2K < N <= 4K at 4 warps, not 8 (4K: 134.8 against 143.2 us, 94.2% against 88.6%;
# torch.compile 185), rows of 512 < N <= 1K two rows a program at 2 warps, not four at 8 (1K:
# 131.0 against 138.6 us, 96.4% against 91.1%; torch.compile 129.4).
# Session 24 (NOTES item 61, after the HAS_OFFSET / EVEN_N constexprs): LayerNorm rows of
# 16K < N <= 32K take the loop too, 16,384 x 16 warps (32K: 154.8 / 155.2 us, 81.6% of copy, against
# the block kernel's 166.9, 75.7%; 8,192-element steps 169-204 us), and RMSNorm rows of
# 32K < N <= 64K with rows enough the pipe kernel in 2,048-column chunks of 4 warps without the
# weight re-read (65K: 137.5 us, 91.8%, against 8,192 x 4 re-read 148.6, 85.0%; 2,048 x 2 and
# 1,024 x 1 138.3-138.9).
# Session 26 (NOTES item 66): LayerNorm's own loop kernel (statistics a thread group, no reduction
# across the program inside the loop) takes 16,384 x 32 warps at 32K: 147.0-149.0 us, 85-86% of
# copy, against the previous loop's 154.6-155.9 at 16,384 x 16 (the new kernel at 16 warps: 166).
NORM_WIDE_LOOP = {"H200": {False: (16385, 32768, 8192, 32), True: (16385, 32768, 16384, 32)}}
# device: {LayerNorm?: (min N, max N, elements a step, warps)}
# Session 38 (NOTES item 105, benchmarks/probe_rms_const.py, M*N = 2^27 bf16, 3-5 alternating rounds
# each within 0.3 us): the two loop kernels with N compiled in (N_CONST: fixed trip counts, every
# mask gone) where the step divides N. At 32K: LayerNorm 8,192 x 32 warps 134.1-134.3 us, 94.2% of
# copy, against 174.2 with N a runtime argument and the cluster kernel's 144.7-145.7 (87.3%);
# RMSNorm 8,192 x 32 130.2-130.3 against 133.5-134.0 (torch.compile 132.6). At 8K: RMSNorm
# 4,096 x 16 128.1-128.2 against 128.8-129.0 (compile 127.7-128.0); LayerNorm 4,096 x 16 130.3
# against the block kernel's 131.7 (compile 145.2). The same change slows other shapes (RMSNorm
# 8K 4,096 x 8: 129.8 -> 132.6; LayerNorm 32K 16,384 x 32: 147.0 -> 156.0), and at 65K neither
# loop comes near the pipe (RMSNorm 136.2 against 140.4) or cluster kernels (LayerNorm 142.6
# against 163.3), so only these measured shapes take it. RMSNorm at 4K also loops, 2,048 x 8:
# 128.3-128.5 us against the block kernel's 129.8-130.0 (Liger ~130; N as an argument 128.2-128.4).
# Checked before the rules above.
NORM_LOOP_CONST = {"H200": {False: ((4096, 4096, 2048, 8), (4097, 8192, 4096, 16), (16385, 32768, 8192, 32)),
                            True: ((4097, 8192, 4096, 16), (16385, 32768, 8192, 32))}}
# device: {LayerNorm?: ((min N, max N, elements a step, warps), ...)}: taken where the step divides N
# The block kernel's shape where a device's measurements moved it off _wide_row's: LayerNorm's
# (above), and add+RMSNorm's (a residual: x, r, h and y, four row streams) at 4K < N <= 8K on the
# H200, 32 warps, not 8. 16384 x 8192 bf16 (NOTES item 96, benchmarks/probe_norm_long.py, two
# runs): 260.3-260.7 us (97.5% of copy) against 265.2-265.4 at 8 warps and 263.0-263.1 at 16; the
# loop shapes 269-298. (RMSNorm alone there: 32 warps 173.6 against its loop's 129.3.)
NORM_BLOCK_SHAPES = {"H200": {("layer", 1024): (2, 2), ("layer", 4096): (1, 4), ("add", 8192): (1, 32)}}
# device: {(norm: "layer", "rms" or "add", block_n): (rows, warps)}
NORM_RMS_PIPE = {"H200": (2048, 4)}   # device: (chunk, warps) of RMSNorm's pipe at 32K < N <= 64K, many rows
# Session 32 (NOTES item 86, benchmarks/probe_ln_cluster.py, M*N = 2^27 bf16): LayerNorm rows of
# 65,536 and 262,144 (32,768 since session 33) on the H200 take the CUDA backend's cluster kernel
# (cuda/csrc/norm.cu: a row spread over a thread-block cluster, w and b held in registers, x staged
# by bulk copies, partial statistics exchanged through distributed shared memory). 65K at 8 blocks x 256 threads x 4
# vectors, 4 rows a group, 3 stages: 144.4-145.2 us, 87.4% of copy, against the pipe kernel's
# 153.2-154.7 (82.5%); 262K at 16 x 512 x 4, 2 rows, 3 stages: 144.2-144.4 us, 87.6%, against
# 170.6-171.0 (73.9%). At 32K its best shape (4 x 256 x 4, 4 rows) tied the loop kernel (147.3-147.5
# against 147.6-147.8 us) until session 33 cut its instructions an element (bf16 pairs converted
# by a shift and a mask): 144.8-145.1 us (87.8%) against 148.6-148.9 (85.5%), taken (NOTES item
# 90). Other row lengths, fp32, mixed-dtype parameters and misaligned rows keep the Triton
# kernels, as does any machine where the CUDA backend cannot build.
NORM_LAYER_CLUSTER = {"H200": {65536: (8, 256, 4, 4, 3), 262144: (16, 512, 4, 2, 3)}}
# (32K left the table in session 38: the loop kernel with N compiled in, NORM_LOOP_CONST, 94.2% of copy)
# device: {N: (cluster, threads, vectors a thread, rows a group, stages)}


# The backward of the same design (cuda/csrc/norm.cu: w held and dw/db accumulated in registers
# over every row a block walks, x and dy staged by bulk copies, each group's saved statistics
# loaded a group ahead): LayerNorm and RMSNorm outside the "llama" casting mode, and add+RMSNorm
# (a residual gradient) where NORM_BWD_DSUM lists the length. H200, bf16, M*N = 2^27, backward alone, us and % of copy against the Triton
# backward in the same run (NOTES item 90, probes_s33/probe_bwd_lean_sweep.log): LayerNorm 32K
# 225.1 (84.7%) / 264.4 (72.1%), 65K 218.8 (87.1%) / 267.9 (71.2%), 262K 231.9 (82.2%) / 311.5
# (61.2%); RMSNorm 32K 209.9 (90.8%) / 255.9 (74.5%), 65K 202.3 (94.2%) / 257.8 (73.9%), 262K
# 211.0 (90.4%) / 266.2 (71.6%). Groups of 64 KB of x and dy a block won (4 vectors x 2 rows or 8
# vectors x 1 row a thread at 256 threads); one row of 4 vectors, or 512 threads, ran 58-82%.
# device: {(LayerNorm?, N): (cluster, threads, vectors a thread, rows a group, stages)}.
NORM_BWD_CLUSTER = {"H200": {(True, 32768): (4, 256, 4, 2, 3), (True, 65536): (4, 256, 8, 1, 3),
                             (True, 262144): (16, 256, 8, 1, 3), (False, 32768): (4, 256, 4, 2, 3),
                             (False, 65536): (8, 256, 4, 2, 3), (False, 262144): (16, 256, 8, 1, 3)}}


def _cluster_shape(tables: dict, key, m: int, device_name: str) -> tuple[int, ...] | None:
    """``key``'s launch shape in this device's cluster table (NORM_LAYER_CLUSTER, NORM_BWD_CLUSTER,
    SOFTMAX_CLUSTER), or None: not interpreting, and at least one row an SM."""
    if interpreting():
        return None
    table = _by_device(tables, device_name)
    if not table or key not in table or m < sm_count():
        return None
    return table[key]


# add+RMSNorm's backward (a residual gradient added to dx) on the same kernel and RMSNorm's shape,
# at these row lengths only (session 42, NOTES item 117, probes_s42/probe_add_rms_bwd_v1.log; H200,
# bf16, M*N = 2^27, backward alone): 65K 318.1 us (79.4% of copy on 4 streams) against the Triton
# backward's 330.8; 262K 345.7 against 335.0, so it stays Triton.
NORM_BWD_DSUM = {"H200": (65536,)}
# device: row lengths


# The shapes cuda/csrc/norm.cu instantiates the residual-gradient backward at (its dsum_config_error):
# 256 threads, a group of at most 2 rows, at most 8 vectors a thread over the group's rows.
DSUM_THREADS, DSUM_MAX_ROWS, DSUM_MAX_VECTORS = 256, 2, 8


def dsum_fits(cfg) -> bool:
    """Whether the cluster backward can add a residual gradient at launch shape ``cfg``."""
    _, threads, vpt, rows, _ = cfg[:5]
    return threads == DSUM_THREADS and rows <= DSUM_MAX_ROWS and rows * vpt <= DSUM_MAX_VECTORS


def norm_bwd_cluster_config(n: int, m: int, layer: bool, device_name: str,
                            dsum: bool = False) -> tuple[int, int, int, int, int] | None:
    """The cluster backward's launch shape for rows of ``n`` (``m`` rows), or None (NORM_BWD_CLUSTER;
    at least one row an SM). With ``dsum`` (add+RMSNorm's residual gradient): RMSNorm's shape, only
    at NORM_BWD_DSUM's lengths and where the kernel takes a residual gradient at it (dsum_fits)."""
    if dsum and (layer or n not in (_by_device(NORM_BWD_DSUM, device_name) or ())):
        return None
    cfg = _cluster_shape(NORM_BWD_CLUSTER, (layer, n), m, device_name)
    return cfg if cfg is None or not dsum or dsum_fits(cfg) else None


# The softmax forward over long rows through the CUDA backend's staged cluster kernel
# (cuda/csrc/softmax.cu softmax_fwd_cluster_kernel: the LayerNorm forward's skeleton, NORM_LAYER_CLUSTER,
# with (max, sum of exp) pairs exchanged and softmax's exps kept in the stage), 16-bit dtypes, at least
# one row an SM. H200, bf16, 512 x 262,144 (NOTES items 114-115, probe_softmax_shapes): 16 blocks x 256
# threads x 8 vectors, a row a group, 3 stages (99 KB: two blocks share an SM) 143.9 us softmax and
# 143.9 log-softmax after item 115's instruction diet (160.1 / 152.8 before), 88.3% of copy, against
# the Triton pipe's 172.4 / 161.8 and the loop's 197.5 / 196.8; 2 rows a group 156.2 / 153.2, one
# block of 512 x 4 201, 1,024 threads x 2 vectors 256-268, 2 stages 184, 3 blocks an SM at 2 stages
# 166.7 / 150.5, 8 x 512 x 8 147.1 / 144.7. At 65,536 the Triton loop with N compiled in keeps it
# (145.6 / 145.1 us; the best cluster shapes, 8 x 256 x 4 at 2 rows, one or two blocks an SM, 145.7 /
# 145.2).
SOFTMAX_CLUSTER: dict = {"H200": {262144: (16, 256, 8, 1, 3)}}
# device: {N: (cluster, threads, vectors a thread, rows a group, stages[, blocks an SM])}


def softmax_cluster_config(n: int, m: int, device_name: str) -> tuple[int, ...] | None:
    """The staged cluster kernel's launch shape for softmax forwards of ``m`` rows of ``n`` on this
    device, or None where the Triton kernels keep the call (SOFTMAX_CLUSTER; at least one row an SM)."""
    return _cluster_shape(SOFTMAX_CLUSTER, n, m, device_name)


def layer_norm_cluster_config(n: int, m: int, device_name: str) -> tuple[int, int, int, int, int] | None:
    """The cluster kernel's launch shape for LayerNorm rows of ``n`` (``m`` rows) on this device, or
    None where the Triton kernels keep the call (NORM_LAYER_CLUSTER; at least one row an SM)."""
    return _cluster_shape(NORM_LAYER_CLUSTER, n, m, device_name)


def _device_match(names, device_name: str) -> str | None:
    """The first of ``names`` (device name fragments, or a table keyed by them) in ``device_name``."""
    return next((k for k in names if k in device_name), None)


def _by_device(table: dict, device_name: str):
    key = _device_match(table, device_name)
    return None if key is None else table[key]


def _const_loop_shape(shapes, n: int) -> tuple[int, int] | None:
    """(elements a step, warps) of the first (min N, max N, step, warps) entry of ``shapes`` (a
    NORM_LOOP_CONST or REDUCE_LOOP_CONST list) covering ``n`` whose step divides it, or None."""
    return next(((block, warps) for lo, hi, block, warps in shapes or () if lo <= n <= hi and n % block == 0), None)


def _device_block_shape(wide: RowConfig | None, table: dict, device_name: str, key=lambda block_n: block_n):
    """``wide`` (``_wide_row``'s config) with the (rows, warps) this device's ``table`` gives its
    block kernel (NORM_BLOCK_SHAPES, SOFTMAX_BLOCK_SHAPES) at ``key(block_n)``; else ``wide`` as it
    is (None, not the block kernel, no entry, or the interpreter)."""
    if wide is None or wide.mode != "block" or interpreting():
        return wide
    shape = (_by_device(table, device_name) or {}).get(key(wide.block_n))
    return wide if shape is None else dataclasses.replace(wide, rows=shape[0], num_warps=shape[1])


def norm_loop_max_n(device_name: str) -> int:
    """The longest row ``norm_fwd_config`` may give the loop kernel on this device: the eager fast
    path (which replays the block kernel whatever M is) leaves norm forwards of many rows from
    ``norm_loop_min_n`` up to it to Python."""
    wide = _by_device(NORM_WIDE_LOOP, device_name)
    return max([NORM_LOOP_MAX_N] + [v[1] for v in (wide or {}).values()])


def norm_loop_min_n(device_name: str) -> int:
    """The shortest row ``norm_fwd_config`` may give the loop kernel on this device (see
    ``norm_loop_max_n``)."""
    const = _by_device(NORM_LOOP_CONST, device_name) or {}
    return min([NORM_LOOP_MIN_N] + [v[0] for shapes in const.values() for v in shapes])


@functools.lru_cache(maxsize=4096)
def norm_fwd_config(n: int, layer: bool, many: bool = False, device_name: str = "",
                    residual: bool = False) -> RowConfig:
    """The norm forward's path for rows of ``n`` (LayerNorm if ``layer``, else RMSNorm); ``many``:
    at least NORM_LOOP_ROWS_PER_SM rows an SM and no residual; ``device_name``: the GPU's name
    (NORM_LOOP_CONST, NORM_LOOP_NO_LAYER, NORM_WIDE_LOOP, NORM_BLOCK_SHAPES, NORM_RMS_PIPE);
    ``residual``: add+RMSNorm."""
    const = None if interpreting() or not many else \
        _const_loop_shape((_by_device(NORM_LOOP_CONST, device_name) or {}).get(layer), n)
    if const is not None:
        return RowConfig("loop", const[0], 1, const[1], const_n=True)
    loop_ok = not (layer and _device_match(NORM_LOOP_NO_LAYER, device_name))
    if many and loop_ok and not interpreting() and NORM_LOOP_MIN_N <= n <= NORM_LOOP_MAX_N:
        block, warps = NORM_LOOP[layer]
        return RowConfig("loop", block, 1, warps)
    wide_loop = None if interpreting() else (_by_device(NORM_WIDE_LOOP, device_name) or {}).get(layer)
    if many and wide_loop and wide_loop[0] <= n <= wide_loop[1]:
        return RowConfig("loop", wide_loop[2], 1, wide_loop[3])
    wide = _device_block_shape(_wide_row(n), NORM_BLOCK_SHAPES, device_name,
                               lambda block_n: ("layer" if layer else "add" if residual else "rms", block_n))
    if wide is not None:
        return wide
    if n > 16 * CHUNK:
        return _exchange_or_row("pipe", n, 2 * CHUNK, SPLIT_WARPS, reload=layer)
    if layer:   # 2,048 x 2 warps at 65K: 92.1% (4,096 x 4: 83.3%; 262K keeps 8,192 x 4, 88.5 against 80.7)
        return _exchange_or_row("pipe", n, CHUNK // 2, 2, reload=True)
    rms_pipe = _by_device(NORM_RMS_PIPE, device_name) if many and not interpreting() else None
    if rms_pipe:
        return _exchange_or_row("pipe", n, rms_pipe[0], rms_pipe[1])
    return _exchange_or_row("pipe", n, 2 * CHUNK, SPLIT_WARPS, reload=True)


# The softmax forward's two-pass loop (x kept in L2 between the passes; online statistics per
# 8-column group) with N compiled in, on the H200 where the step divides N and rows are many
# (session 39, NOTES item 108, benchmarks/probe_softmax_loop.py, M*N = 2^27 bf16, 3 alternating
# rounds, softmax / log-softmax, us): 32K at 8,192 x 32 130.4 / 130.6 (97.5% of copy) against the
# one-program block kernel's 170.3 / 168.7 (Liger 170.6); 16K at 8,192 x 16 129.3 / 128.8 against
# 138.4 / 138.6; 8K at 4,096 x 16 127.3 / 127.3 against 131.1 / 131.4 (Liger 129.0); 4K at
# 4,096 x 8 127.7 / 127.7 against 130.7 (Liger 131.3); 2K at 2,048 x 4 127.2 / 127.2 against
# 130.6 / 129.7 (Liger 144.1); 65K at 16,384 x 32 145.4 / 144.8 against the pipe's 148.5 / 150.2.
# N as a runtime argument costs up to 24 us (32K 8,192 x 32: 154.1); other step/warp pairs lose
# up to 30%. 1K keeps the block kernel (the loop's best 139.6 against 132.8).
SOFTMAX_LOOP_CONST = {"H200": ((2048, 2048, 2048, 4), (4096, 4096, 4096, 8), (4097, 8192, 4096, 16),
                               (8193, 16384, 8192, 16), (16385, 32768, 8192, 32), (32769, 65536, 16384, 32))}
# device: ((min N, max N, elements a step, warps), ...): taken where the step divides N, rows enough
# The forward's block kernel where a device's measurements moved it off row_config's shape: 1K rows
# on the H200, 2 rows x 4 warps, not 4 x 8 (session 39, NOTES item 109, benchmarks/
# probe_softmax_shapes.py, 131,072 x 1,024 bf16, least of 3 rounds, softmax / log-softmax):
# 129.2 / 129.0 us against 132.6-134.2 / 138.0 (torch.compile 129.2 / 129.1; 1 x 2: 129.4).
SOFTMAX_BLOCK_SHAPES = {"H200": {1024: (2, 4)}}
# device: {block_n: (rows, warps)}


def softmax_loop_range(device_name: str) -> tuple[int, int]:
    """(shortest, longest) row a softmax forward of many rows may loop over on this device, (0, -1)
    for none: the eager fast path (which replays the block kernel whatever M is) leaves those calls
    to Python."""
    shapes = _by_device(SOFTMAX_LOOP_CONST, device_name) or ()
    return (min(v[0] for v in shapes), max(v[1] for v in shapes)) if shapes else (0, -1)


# The backward's pipe shape by (log-softmax?, N) where a device measured one better than the shared
# route (8,192 x 8 past 32K). H200, bf16, 512 x 262,144, the backward alone (NOTES item 114,
# probe_softmax_bwd_shapes): log-softmax, whose dx = dy - exp(y) sum(dy) runs an exp an element,
# 4,096 x 4 223.5 us (84.7% of copy; 2,048 x 2 222.9) against 8,192 x 8's 262.9 (72.0%) and
# torch.compile's 270.1; softmax keeps 8,192 x 8 (226.7 us, 83.5%; 4,096 x 4 247.5).
SOFTMAX_BWD_PIPE = {"H200": {(True, 262144): (4096, 4)}}


@functools.lru_cache(maxsize=4096)
def softmax_config(n: int, backward: bool, many: bool = False, device_name: str = "", log: bool = False) -> RowConfig:
    """The softmax forward's (or backward's) path for rows of ``n``; ``many``: at least
    NORM_LOOP_ROWS_PER_SM rows an SM (the forward's loop with N compiled in, SOFTMAX_LOOP_CONST);
    the forward's block kernel takes SOFTMAX_BLOCK_SHAPES' shape where the device has one; the
    backward (``log``: of log-softmax) a SOFTMAX_BWD_PIPE shape where the device has one."""
    const = _const_loop_shape(_by_device(SOFTMAX_LOOP_CONST, device_name), n) \
        if many and not backward and not interpreting() else None
    if const is not None:
        return RowConfig("loop", const[0], 1, const[1], const_n=True)
    pipe = (_by_device(SOFTMAX_BWD_PIPE, device_name) or {}).get((log, n)) if backward and not interpreting() else None
    if pipe is not None and n % pipe[0] == 0:
        return RowConfig("pipe", pipe[0], 1, pipe[1], n // pipe[0])
    wide = _wide_row(n) if backward else _device_block_shape(_wide_row(n), SOFTMAX_BLOCK_SHAPES, device_name)
    if wide is not None:
        return wide
    if n <= 16 * CHUNK:
        return row_config(n)
    return _exchange_or_row("pipe", n, 2 * CHUNK, 8 if backward else SPLIT_WARPS)


# The amax backward holds one array a row, as the softmax forward, and shares its block paths; past
# 32K it has a split kernel only (8,192 x 4 at 262K: 84% of copy, benchmarks/NOTES.md).
@functools.lru_cache(maxsize=4096)
def amax_bwd_config(n: int) -> RowConfig:
    wide = _wide_row(n)
    if wide is not None:
        return wide
    if n <= 16 * CHUNK:
        return row_config(n)
    return _exchange_or_row("split", n, 2 * CHUNK, SPLIT_WARPS)


# The amax mask forward (ops/reduce.py) holds its rows and keeps them until their max is known: 32
# elements a thread and 4,096 elements a program (rows of 32K: 32 warps) hold the most loads in
# flight an SM. H200, bf16, M*N = 2^27, us (benchmarks/NOTES.md, item 38): 1K 75.6 (8 rows x 8
# warps, the norms' shape: 91.5), 4K 68.2 (73.2), 8K-32K 68.3-69.7, where a walk twice over the row
# (the second from L2) took 84-95; the plain forward 61.5-71.3.
AMAX_MASK_ELEMS = 4096


@functools.lru_cache(maxsize=4096)
def amax_mask_config(n: int) -> RowConfig:
    """The amax mask forward's tile over rows of ``n`` (a program holds them: amax_holds_row)."""
    block = triton.next_power_of_2(n)
    rows = max(1, min(64, AMAX_MASK_ELEMS // block))
    return RowConfig("block", block, rows, min(WIDE_WARPS, max(4, rows * block // 1024)))


def amax_row_limit() -> int:
    """The longest row ``amax_bwd_config`` gives the block mode (one program holds it)."""
    return BLOCK_MAX if interpreting() else WIDE_BLOCK_MAX


def amax_holds_row(n: int) -> bool:
    """Whether ``amax_bwd_config(n)`` is the block mode, in plain arithmetic that torch.compile
    traces without a cached call."""
    return n <= amax_row_limit()


# Cross-entropy (ops/cross_entropy.py): a vocabulary row of V logits. On the GPU the split path
# (C = V / CE_CHUNK co-resident programs a row, one read and one write); in the interpreter, which
# runs programs one at a time, one program a row walking it in CE_LOOP_BLOCK pieces.
CE_CHUNK = 4096
CE_SPLIT_WARPS = 4
CE_LOOP_BLOCK = 1024


@functools.lru_cache(maxsize=4096)
def ce_config(v: int) -> RowConfig:
    """How the cross-entropy forward covers rows of ``v`` logits."""
    if not interpreting():
        # 8,192-column chunks (4 warps, 64 a thread) from V = 65,536: fewer programs to wait on per
        # row. H200, 8192 rows: V = 128,256 1.33 ms (16 chunks) against 1.46 ms with 32 of 4,096;
        # V = 262,144 2.99 ms (32 chunks) against 5.6 ms with 64 (benchmarks/NOTES.md)
        chunk = min(CE_CHUNK * (2 if v >= 16 * CE_CHUNK else 1), triton.next_power_of_2(v))
        chunks = triton.cdiv(v, chunk)
        if chunks <= SPLIT_MAX_CHUNKS:
            return RowConfig("split", chunk, 1, CE_SPLIT_WARPS, chunks)
        return RowConfig("loop", CE_CHUNK, 1, 8)
    block = min(CE_LOOP_BLOCK, triton.next_power_of_2(v))
    if block >= v:       # one program holds the row: the split kernel with C = 1 (nothing to wait for)
        return RowConfig("split", block, 1, 4, 1)
    return RowConfig("loop", block, 1, 4)


def resident_programs(compiled, num_warps: int) -> int:
    """How many programs of a compiled kernel the whole device holds at once, from its register
    and shared-memory use (the occupancy calculation, kept conservative)."""
    if interpreting():
        return 1
    info = device_info()
    threads = 32 * num_warps
    if getattr(compiled, "n_regs", None) is None and hasattr(compiled, "_init_handles"):
        compiled._init_handles()        # warmup() compiles but loads lazily; n_regs is set on load
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


# RoPE: a program loads the cos/sin rows of its BLOCK_S tokens once and rotates HEADS x BLOCK_S x D
# elements of q or k a step, ~ROPE_STEP of them (8 KB of bf16): 16-byte accesses along D, a few per
# thread. On a GPU every program does one step (grid axis 1 = the head groups), two heads of 16
# tokens at D = 128: a flat stream of light programs, like the elementwise kernels. H100 sweep,
# q (4, 32, 4096, 128) k (4, 8, 4096, 128) bf16 (benchmarks/NOTES.md): 95.1% of copy forward and
# 95.4% backward (torch.compile 95.5%), against 89.3% for 4 tokens x 8 heads looping over the 5
# head groups, and 91-93% for 4-8 heads a step. The interpreter keeps the looping shape (a
# program walks several head groups, split only to fill its 4 stand-in SMs), which the CPU tests
# exercise.
ROPE_STEP = 4096
ROPE_HEADS = 2


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    block_s: int       # tokens per program
    heads_q: int       # q heads per loop step
    heads_k: int       # k heads per loop step
    split: int         # programs sharing one token block's heads (grid axis 1)
    num_warps: int
    table_first: bool = True   # load the table rows at the top of the program, before the q/k loads


@functools.lru_cache(maxsize=4096)
def rope_config(batch: int, seqlen: int, hq: int, hk: int, head_dim: int) -> RopeConfig:
    rows = max(1, ROPE_STEP // triton.next_power_of_2(head_dim))   # (token, head) rows per step
    per_step = ROPE_HEADS if not interpreting() else min(triton.next_power_of_2(hq), 8)
    block_s = min(triton.next_power_of_2(seqlen), max(1, rows // per_step))
    heads_q = min(triton.next_power_of_2(hq), max(1, rows // block_s))
    heads_k = min(triton.next_power_of_2(hk), max(1, rows // block_s))
    groups = triton.cdiv(hq, heads_q) + triton.cdiv(hk, heads_k)
    split = groups
    if interpreting():
        # too few token blocks to fill the (stand-in) chip: split the heads over a second grid
        # axis; each share re-reads the (L2-resident) table rows
        programs = batch * triton.cdiv(seqlen, block_s)
        split = max(1, min(groups, triton.cdiv(4 * sm_count(), max(programs, 1))))
    elems = block_s * heads_q * triton.next_power_of_2(head_dim)
    # A sequence in one token block (decode, short chunks) is latency-bound: its q/k loads go out
    # first and the table rows after them, never waiting on each other. Longer sequences keep the
    # table rows first (0.5-1% faster at q (4, 32, 4096, 128) on the H200; NOTES.md, item 116).
    # seqlen alone decides (with the head counts and dim, the fast path's key), never the batch.
    table_first = triton.cdiv(seqlen, block_s) > 1
    return RopeConfig(block_s, heads_q, heads_k, split, 4 if elems >= 2048 else (2 if elems >= 512 else 1), table_first)


# ----------------------------------------------------------------------------------------------
# Decode attention over a paged KV cache (ops/decode_attention.py): flash-decoding. A program
# owns (sequence, kv head, split) and streams its split's share of the context once, for all the
# query heads of its GQA group. B * Hkv programs alone are 8 at batch 1 for Hkv = 8, against 132
# SMs, so each sequence's context is split over a second grid axis until the grid holds about
# DECODE_PROGRAMS_PER_SM programs an SM. The count is chosen from what the host knows without a
# sync (the block table's capacity, not the sequences' lengths); the kernel cuts each sequence's
# actual length into that many equal chunks, so a short sequence gets short chunks, not empty ones.
# H200 sweep (benchmarks/probe_decode_sweep.py, NOTES item 40; Hq 32 / Hkv 8, D 128, bf16, pages of
# 16): 32 KB K and V tiles (128 tokens at D 128) with 2 stages and 4 warps read 92-96% of copy at
# batch 32-64 and 72-78% at batch 8-16, where 16 KB tiles read 61-71%; 3, 6 or 12 programs an SM
# within 1-4% of each other. At batch 1 x 32K the 16 KB tile stays ahead (52.4 against 58.4 us):
# DECODE_BIG_TILE_MIN_PROGRAMS (sequence, kv head) pairs take the large tile.
# ----------------------------------------------------------------------------------------------
DECODE_PROGRAMS_PER_SM = 3      # 2-4 co-resident programs an SM, each with 2-3 K/V tiles in flight
DECODE_TILE_BYTES = 16384       # one K (or V) tile: 64 tokens x 128 dims x 2 B; 16-byte vectors
DECODE_BIG_TILE_BYTES = 32768   # 128 tokens x 128 dims x 2 B, where B * Hkv is at least:
DECODE_BIG_TILE_MIN_PROGRAMS = 64
DECODE_MIN_STEPS = 2            # a split covers at least this many tiles of its capacity share
# Hopper takes ops/decode_attention_sm90.py (Gluon, TMA-fed, persistent) from this many cached
# (token, kv head) pairs of capacity up. With its combine launched as a programmatic dependent and
# no merge in split launches (NOTES items 136-138) it is ahead of the Triton kernel at every size
# re-timed, down to batch 1 x 1K: H100 1 x 1K 11.6 against 12.9 us, 1 x 4K 15.4 against 16.6;
# H200 1 x 4K 13.7 against 15.5, 8 x 512 13.8 against 15.8 (32 x 256 excepted: 17.4 against 17.0).
# So every call it covers takes it.
DECODE_SM90_MIN_TOKENS = 0
DECODE_COMBINE_STEP = 128       # partials the combine kernel merges in one pass (more: in steps of 16)
DECODE_COMBINE_D = 32           # head-dim slice a combine program merges (4 programs a head at D 128)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    block_n: int       # tokens a loop step streams (one K and one V tile); may span several pages
    block_g: int       # query-head rows of the q tile: the GQA group padded to >= 16 for tl.dot
    block_d: int       # head dim padded to a power of two
    num_splits: int    # programs sharing one (sequence, kv head); 1: no combine pass
    granule: int       # split boundaries are multiples of this (block_n, or the page if larger)
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=4096)
def decode_config(batch: int, kv_heads: int, group: int, capacity: int, head_dim: int,
                  block_size: int, elem_bytes: int, num_splits: int | None = None) -> DecodeConfig:
    """Launch shape of the decode kernels. ``capacity`` = max_blocks_per_seq * block_size, the
    longest context the block table can describe; ``num_splits`` forces the split count (clamped
    to the number of granules in the capacity, past which splits could only be empty)."""
    block_d = triton.next_power_of_2(head_dim)
    block_g = max(16, triton.next_power_of_2(group))
    if interpreting():
        # the interpreter's cost is per op: small tiles keep the tests' loops several steps long
        block_n = 16
    else:
        # 16 KB K tiles (64 tokens at D = 128 in bf16, 32 at D = 256 or in fp32), 32 KB with many
        # (sequence, kv head) pairs
        tile = DECODE_BIG_TILE_BYTES if batch * kv_heads >= DECODE_BIG_TILE_MIN_PROGRAMS else DECODE_TILE_BYTES
        block_n = max(16, min(128, tile // (block_d * elem_bytes)))
    granule = max(block_n, block_size)
    useful = max(1, triton.cdiv(capacity, granule))
    if num_splits is None:
        target = DECODE_PROGRAMS_PER_SM * sm_count()
        splits = triton.cdiv(target, max(1, batch * kv_heads))
        # every split keeps at least DECODE_MIN_STEPS tiles of the capacity (pipelining needs steps)
        splits = min(splits, max(1, capacity // max(DECODE_MIN_STEPS * block_n, granule)))
    else:
        splits = num_splits
    splits = max(1, min(splits, useful))
    stage = 2 * block_n * block_d * elem_bytes          # one K and one V tile
    stages = 3 if 3 * stage <= 96 * 1024 else 2
    return DecodeConfig(block_n, block_g, block_d, splits, granule, 4, stages)


# ----------------------------------------------------------------------------------------------
# Elementwise ops (add, GLU activations). Little's law: to stream ~4.8 TB/s through ~700 ns of
# DRAM latency a GPU must keep ~3.4 MB in flight, ~25 KB per SM of an H200. A flat program of
# FLAT_BLOCK elements and FLAT_WARPS warps gives each thread one 16-byte vector per bf16 operand,
# and 16 such programs fit an SM (2,048 threads): 16 x 128 x 16 B x 2 operands = 64 KB per SM.
# H200 sweep (benchmarks/NOTES.md): 1,024 x 4 warps 101.7% of copy on a SwiGLU-shaped stream,
# 2,048 x 4 101.0%, 4,096 x 8 101.0%; a persistent grid of larger blocks 96-98%.
# ----------------------------------------------------------------------------------------------
FLAT_BLOCK = 1024
FLAT_WARPS = 4
TILE_ELEMS = 4096               # elements per program in 2-D elementwise tiles (16 per thread at 8 warps)
TILE_MAX_N = 2048               # widest tile: a multiple of every common hidden size (14336 = 7 * 2048)
REDUCE_CHUNK = 8192             # row reductions past BLOCK_MAX: elements per (row, chunk) program
# Row reductions past BLOCK_MAX with rows enough to fill the chip: one program a row walks it in
# REDUCE_LOOP_BLOCK-element steps (one launch; the (row, chunk) partials need a second, ~3 us, which
# left sum/amax at 32K-262K 2-4% behind torch.compile on the H100). H100, bf16, M*N = 2^27, us at
# N = 32K / 65K / 262K (benchmarks/NOTES.md, item 28): 4,096 x 16 warps, prefetched, evict-first
# 87.4 / 87.6 / 89.0 (sum), 87.8 / 87.9 / 88.9 (amax); without evict-first 88.3-89.7; 8,192 x 8
# unprefetched 94.6-100 (sum); partials 90.4-91.4; torch.compile 86.9-89.7. At 256 x 262,144
# 47.8 against the partials' 50.2; at 128 rows the partials win (28.9 against 36.4), so fewer rows
# than REDUCE_LOOP_ROWS_PER_SM an SM keep them.
# Rows of 8K and 16K, which one program could hold, take the loop too: 86.3-86.7 us against the
# block kernel's 87.0-88.0 and torch.compile's 86.1-86.7; at 4K the block kernel holds (87.1 / 87.5
# against 90.8 / 106.3).
REDUCE_LOOP_BLOCK = 4096
REDUCE_LOOP_WARPS = 16
REDUCE_LOOP_ROWS_PER_SM = 2
REDUCE_LOOP_MIN_N = 8192
# amax with a gradient to come over rows a program holds (ops/reduce.py, amax_grad_path): the
# forward writes a bit mask of the ties, so the backward reads N / 8 bytes a row, not x. It goes
# through Python; the eager fast path (C++, a small forward's host time 35-120 -> 9-17 us, NOTES
# item 23) keeps the count-and-scatter backward, so calls below this many elements, where host time
# is what a call costs, stay there (the mask saves ~1.9 bytes an element: ~8 us at 2^24 on an H200).
AMAX_MASK_MIN_NUMEL = 1 << 24


# The same loop with N compiled in (N_CONST: fixed trip count, no masks, no software prefetch) on
# the H200 where the step divides N, sum and amax without tie counts (session 38, NOTES item 106,
# benchmarks/probe_reduce_const.py, M*N = 2^27 bf16, least of 3 rounds, us, sum / amax): 4K at
# 2,048 x 8 60.0 / 60.0 (the block kernel 61.1 / 61.4); 8K at 4,096 x 16 59.9 / 60.3 (N an
# argument 60.4 / 70.8, torch.compile 59.9 / 69.5); 32K at 8,192 x 32 59.9 / 60.2 (60.9 / 61.9,
# compile 60.0 / 61.8); 65K at 4,096 x 16 60.6 / 60.8 (60.9 / 61.7). Other shapes lose with it
# (8,192 x 32 at 262K: 141-144 against 61; 2,048 x 16 at 4K: 75-87 against 61), and 262K gains
# nothing, so it keeps the plain loop. 16K and 24K take their neighbours' shapes unmeasured.
REDUCE_LOOP_CONST = {"H200": ((4096, 4096, 2048, 8), (8192, 16384, 4096, 16), (16385, 32768, 8192, 32),
                              (32769, 65536, 4096, 16))}
# device: ((min N, max N, elements a step, warps), ...): taken where the step divides N, rows enough


@functools.lru_cache(maxsize=4096)
def reduce_loop_const(m: int, n: int, device_name: str) -> tuple[int, int] | None:
    """(BLOCK_N, num_warps) of the sum/amax row loop with N compiled in for M rows of N on this
    device (REDUCE_LOOP_CONST; REDUCE_LOOP_ROWS_PER_SM rows an SM or more, not interpreting), or
    None: :func:`reduce_config` decides."""
    if interpreting() or m < REDUCE_LOOP_ROWS_PER_SM * sm_count():
        return None
    return _const_loop_shape(_by_device(REDUCE_LOOP_CONST, device_name), n)


def reduce_loop_min_n(device_name: str) -> int:
    """The shortest row a sum/amax forward of many rows may loop over on this device: the eager fast
    path (which replays the block kernel whatever M is) leaves such calls to Python."""
    return min([REDUCE_LOOP_MIN_N] + [v[0] for v in _by_device(REDUCE_LOOP_CONST, device_name) or ()])


@functools.lru_cache(maxsize=4096)
def reduce_config(m: int, n: int) -> tuple[str, int, int]:
    """(mode, BLOCK_N, num_warps) of a sum/amax forward over M rows of N: ``loop`` (one program a
    row walking it), ``partial`` (past BLOCK_MAX with too few rows for that: (row, chunk) programs,
    then the block kernel over the partials) or ``block`` (:func:`row_config`'s whole rows; the
    other two values unused)."""
    if n >= REDUCE_LOOP_MIN_N and m >= REDUCE_LOOP_ROWS_PER_SM * sm_count():
        return "loop", REDUCE_LOOP_BLOCK, REDUCE_LOOP_WARPS
    if n > BLOCK_MAX:
        return "partial", REDUCE_CHUNK, warps_for(REDUCE_CHUNK)
    return "block", 0, 0


@functools.lru_cache(maxsize=4096)
def tile_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of a 2-D elementwise tile over rows of ``n_cols``: up to
    TILE_MAX_N columns, short rows stacked until a tile holds TILE_ELEMS elements."""
    block_n = min(triton.next_power_of_2(n_cols), TILE_MAX_N)
    block_m = max(1, TILE_ELEMS // block_n)
    return block_m, block_n, warps_for(block_m * block_n)


# Norm backward (ops/norms.py): x, dy, x_hat, g, the dw/db accumulators and the prefetched next
# tile are all live, ~15 registers per element a thread holds, so a backward tile gives each
# thread 16 elements (NORM_BWD_ELEMS_PER_THREAD) and rows longer than the limit take the two-pass
# tiled path (RMSNorm whole to 8,192; LayerNorm's extra accumulator spills there, so it stops at
# 4,096). H200 sweep at 32768 x 4096 bf16 (benchmarks/NOTES.md): RMSNorm 8 warps x 1 row 85% of
# copy against 42-60% with 16 warps; LayerNorm 16 warps x 2 rows 71%; two programs an SM.
# LayerNorm, H100 (NOTES.md item 24): its 8,192-element tile at 16 warps is capped at 128 registers
# a thread and spills (380 bytes at N = 1,024: 69.5% of copy); 2,048-element tiles of 4 warps
# (168 registers, three resident an SM) with four programs an SM in the weight-gradient grid run
# 83-85% at N <= 2,048, and at 4,096 the 16-warp tile with one program an SM 87% (two: 84.5%).
NORM_BWD_BLOCK_MAX = 8192
NORM_BWD_TILE = {False: 4096, True: 8192}    # elements a program holds: RMSNorm, LayerNorm
LN_BWD_SHORT_TILE = 2048                     # LayerNorm rows of <= 2,048: elements a program holds
NORM_BWD_ELEMS_PER_THREAD = 16
# Longer rows on a GPU: the split exchange to 32K (C = 8), the pipe mode past it (see above: the
# split backward waited on the slowest of C programs every row, and at C = 64 lost to the two-pass
# loop; with the wait deferred a row, 262K runs at 75-84% of copy against the loop's 53-57%).


# LayerNorm rows of 4K < N <= 8K in a 2-byte dtype (benchmarks/NOTES.md item 67): one 8,192-column
# program of 16 warps an SM (123 registers, so one fits) instead of the split exchange, whose
# one-warp programs hold the next row in 255 registers a thread. 16384 x 8192 bf16:
#   H200: the row tiles staged four deep through shared memory by the compiler's software pipeline
#         (cp.async, ~147 KB) 224.8 us, 84.3% of copy; unstaged 237.8 (80.1%); split 276 (69%).
#   H100: unstaged 310.3 us, 86.4%; staged 3-5 deep 319.5-340.5; split 324.8 (82.5%).
# fp32 keeps the split (four 64 KB stages are more shared memory than an SM has; its next-row
# registers were not measured).
NORM_LAYER_BWD_WIDE = {"H200": (8192, 16, 4), "H100": (8192, 16, 0)}   # device: (columns, warps, stages)
# H200, RMSNorm without a residual gradient, rows of 16K < N <= 64K (NOTES item 68): the pipe in
# LayerNorm's one-warp 1,024-column programs. Backward alone, bf16, M*N = 2^27: 32K 257.0 us
# against the split 4,096 x 4's 267.5; 65K 257.2 against the pipe 2,048 x 4's 275.5 (add+RMSNorm
# keeps its path: it meets the bars there, and its extra gradient stream was not measured).
NORM_RMS_BWD_PIPE = {"H200": (1024, 1)}   # device: (chunk, warps)


@functools.lru_cache(maxsize=4096)
def norm_bwd_config(n: int, layer: bool, device_name: str = "", itemsize: int = 2, dsum: bool = False) -> RowConfig:
    """The norm backward's path for rows of ``n`` (LayerNorm if ``layer``, else RMSNorm):
    ``block`` (whole rows, one pass over x and dy), ``split``/``pipe`` (longer rows on a GPU: C
    programs a row exchange the row sums, still one pass) or ``loop`` (row statistics first, then
    4,096-column tiles: two passes; the interpreter's path, and rows past the pipe's reach).
    ``device_name``: the GPU's name, ``itemsize`` the bytes of an element of x and dy, ``dsum``:
    add+RMSNorm's backward (a gradient of x + residual to add) (NORM_LAYER_BWD_WIDE,
    NORM_RMS_BWD_PIPE)."""
    block = triton.next_power_of_2(n)
    wide = (_by_device(NORM_LAYER_BWD_WIDE, device_name)
            if layer and itemsize <= 2 and not interpreting() else None)
    if wide and NORM_BWD_BLOCK_MAX // 2 < block <= wide[0]:
        return RowConfig("block", block, 1, wide[1], grad_per_sm=1, stages=wide[2])
    if block <= (NORM_BWD_BLOCK_MAX // 2 if layer else NORM_BWD_BLOCK_MAX):
        short = layer and block <= LN_BWD_SHORT_TILE
        tile = LN_BWD_SHORT_TILE if short else NORM_BWD_TILE[layer]
        rows = max(1, min(64, tile // block))
        warps = max(4, min(16, block * rows // (32 * NORM_BWD_ELEMS_PER_THREAD)))
        per_sm = (4 if short else 1) if layer else GRAD_PROGRAMS_PER_SM
        return RowConfig("block", block, rows, warps, grad_per_sm=per_sm)
    if interpreting():
        return RowConfig("loop", 4096, 1, 16)
    if layer and n <= 16 * CHUNK:
        # one-warp programs of 1,024 columns (32 a thread), many resident an SM: 82.8% of copy at
        # 8K (split), 82.2 at 32K and 81.0 at 65K (pipe), against 72.9 / 68.6 / 77.7 before
        return _exchange_or_row("split" if n <= 4 * CHUNK else "pipe", n, CHUNK // 4, 1)
    rms_pipe = None if layer or dsum else _by_device(NORM_RMS_BWD_PIPE, device_name)
    if rms_pipe and 4 * CHUNK < n <= 16 * CHUNK:
        return _exchange_or_row("pipe", n, *rms_pipe)
    if n <= 8 * CHUNK:
        return _exchange_or_row("split", n, CHUNK, SPLIT_WARPS)
    if n <= 32 * CHUNK:
        return _exchange_or_row("pipe", n, CHUNK // 2, SPLIT_WARPS)
    return _exchange_or_row("pipe", n, 2 * CHUNK, 8, reload=layer)


@functools.lru_cache(maxsize=4096)
def grad_grid(m: int, rows: int, col_tiles: int, per_sm: int = GRAD_PROGRAMS_PER_SM) -> tuple[int, int]:
    """Row groups G and rows per group of a deterministic weight-gradient kernel: G x col_tiles
    programs, ``per_sm`` per SM in all, each owning a fixed contiguous run of rows (a multiple of
    ``rows``) and writing one row of a (G, N) partial-sum buffer. G depends only on the shape, the
    config and the device, so the reduction order -- and the result's bits -- never change."""
    target = sm_count() * per_sm
    groups = max(1, min(triton.cdiv(m, rows), target // col_tiles))
    per = triton.cdiv(triton.cdiv(m, groups), rows) * rows
    return triton.cdiv(m, per), per


def grad_sum_config(n: int, max_rows: int) -> tuple[int, int]:
    """(rows a step, columns a program) of the norms' partial-sum reduction (ops/norms.py's
    ``_grad_sum_kernel``; at most ``max_rows`` partial rows). To 16K columns -- decode-sized calls,
    where the kernel is all latency -- every row in one load, in 32-column programs (128 at 4K):
    one trip to memory, where 8-row steps made four in sequence (H100, LayerNorm backward of 64 x
    4,096 bf16: 14.1 -> 10.2 us; the old kernel alone was 6.1 us of it). Longer rows (the few row
    groups of the split/pipe backward) keep 8-row steps of 256 columns: with 32-column programs
    the 262K fwd+bwd read 1-1.5 points lower (79.9 / 87.6% against 81.4 / 88.4)."""
    return (max_rows, 32) if n <= 4 * CHUNK else (8, 256)


# ----------------------------------------------------------------------------------------------
# Matrix multiply (ops/matmul.py). A config is a tile (BLOCK_M x BLOCK_N, K in BLOCK_K steps), the
# L2 grouping (GROUP_M rows of tiles launched together), the pipeline depth (num_stages shared-
# memory buffers of A and B in flight), warps, and SPLIT_K (programs sharing one tile's K range).
#
# Why these defaults (H100/H200, 16-bit inputs, fp32 accumulators):
# - A 128 x 256 tile with BLOCK_K 64 does 2*128*256*64 = 4.2 MFLOP per 48 KB of operands loaded:
#   ~87 FLOP per byte of shared memory traffic, and its 128 KB of fp32 accumulators are spread
#   over 8 warps (two warpgroups, 128 registers each). Three stages are 3 x 48 KB = 144 KB of
#   shared memory, under the 227 KB an SM offers.
# - Small M (decode, M <= 64): the tensor cores idle; the weight stream is the cost. A GEMV-like
#   problem has few output tiles (N / BLOCK_N), often fewer than the 132 SMs, so SPLIT_K programs
#   share a tile's K range until the grid covers the chip about twice, each streaming BLOCK_K-deep
#   slices of the weight with several stages in flight.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MatmulConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_stages: int = 3
    num_warps: int = 8
    split_k: int = 1
    warp_specialize: bool = False   # persistent kernel only: producer/consumer warp partitions
    persistent: bool = False        # the persistent TMA kernel (variant "auto" chooses per config)
    store_split: int = 0            # persistent kernel only: 0 pointer stores, 1-2 TMA stores in that many slices
    stream_k: bool = False          # persistent kernel only: the last partial wave's tiles shared out by K-steps

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


MATMUL_NAIVE = MatmulConfig(64, 64, 32, group_m=1, num_stages=1, num_warps=4)


def matmul_split_k(m: int, n: int, k: int, cfg: MatmulConfig, programs_per_sm: float = 1.5) -> int:
    """SPLIT_K so that a short, wide-K problem puts ~``programs_per_sm`` programs on every SM,
    each program keeping at least 2 K-steps. (H200 sweep, 16 x N x K bf16: the winners ran 200-520
    programs, 1.5-4 per SM; 16 x 4096 x 4096 at 18.2 us with 16x64x128 tiles split 4 ways, where
    one program per tile (64 programs) took 3x longer.)"""
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    k_steps = triton.cdiv(k, cfg.block_k)
    want = triton.cdiv(int(programs_per_sm * sm_count()), tiles)
    return max(1, min(want, k_steps // 2, 16))


def _with_split(m, n, k, cfg: MatmulConfig, programs_per_sm: float = 1.5) -> MatmulConfig:
    return dataclasses.replace(cfg, split_k=matmul_split_k(m, n, k, cfg, programs_per_sm))


@functools.lru_cache(maxsize=4096)
def matmul_config(m: int, n: int, k: int, elem_bytes: int, variant: str) -> MatmulConfig:
    """The untuned default of one variant for an (m, n, k) problem: sound on Hopper, and what the
    first call uses before (or without) autotuning. fp8 operands take twice the K depth (the same
    bytes per stage, and the tensor cores consume K in 32-element steps for 8-bit types)."""
    cfg = _matmul_config(m, n, k, 2 if elem_bytes == 1 else elem_bytes, variant)
    if elem_bytes == 1 and variant != "naive":
        cfg = dataclasses.replace(cfg, block_k=cfg.block_k * 2)
    return cfg


def _matmul_config(m: int, n: int, k: int, elem_bytes: int, variant: str) -> MatmulConfig:
    if variant == "naive":
        return MATMUL_NAIVE
    if variant == "pipelined":      # naive's loop with 4 stages in flight and a wgmma-sized tile
        return MatmulConfig(128, 128, 64, group_m=1, num_stages=4, num_warps=8)
    wide = elem_bytes == 4
    if wide:     # fp32 (TF32 or exact): K slices of 32 keep a stage at 32 KB
        if m <= 256 and variant in ("splitk", "auto"):
            return _with_split(m, n, k, MatmulConfig(16 if m <= 16 else 64, 64, 32, group_m=1, num_stages=4,
                                                     num_warps=4))
        return MatmulConfig(128, 128, 32, num_stages=3, num_warps=8)
    if m <= 256 and variant in ("splitk", "auto"):
        # short M: stream the weight; H200 sweep winners (benchmarks/NOTES.md)
        if m <= 16:
            return _with_split(m, n, k, MatmulConfig(16, 64, 128, group_m=1, num_stages=5, num_warps=4))
        if m <= 64:
            return _with_split(m, n, k, MatmulConfig(64, 64, 128, group_m=1, num_stages=4, num_warps=4))
        # 64 < M <= 256: two 64-row tiles per weight tile (the second read comes from L2), six
        # stages deep, K not split; H200 M = 128 sweep: 20.3 us at 128x4096x4096 against 22.3 us
        # for the best 128-row tile (cuBLAS 18.9 us); H100 under the bench's timing: 18.4 us
        # unsplit, 23.7 us split in two (cuBLAS 17.4 us). Fed by TMA in the persistent kernel
        # where the operands allow it (H100 probe_matmul_picks/streamk: 17.2 against 18.3 us at
        # 128x4096x4096, 52 against 62 us at 128x14336x4096, dX layouts alike; benchmarks/NOTES.md).
        # The split-K rung of the ladder still splits.
        cfg = MatmulConfig(64, 64, 128, group_m=8, num_stages=6, num_warps=4)
        return _with_split(m, n, k, cfg) if variant == "splitk" else dataclasses.replace(cfg, persistent=True)
    if variant == "grouped" or m <= 256:
        return MatmulConfig(128, 128, 64, num_stages=4, num_warps=8)
    # persistent / auto at large M: 128 x 256 x 64, two consumer warpgroups, 3 stages, the tile
    # leaving by TMA stores in two 128 x 128 slices (H200: 780-790 TFLOP/s at 8192^3 and
    # 4096 x 14336 x 4096 with pointer stores; H100 probe, 8 large problems: this one best or within
    # 3% on 6, 1.03x cuBLAS at 8192^3; benchmarks/NOTES.md)
    return MatmulConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8, persistent=variant == "auto",
                        store_split=2)


def matmul_candidates(m: int, n: int, k: int, elem_bytes: int, variant: str) -> list[MatmulConfig]:
    """What the autotuner tries for one variant (the default first). ``auto`` mixes the split-K
    pointer kernel and the persistent TMA kernel (``persistent=True``) for short M."""
    base = matmul_config(m, n, k, elem_bytes, variant)
    out = [base]
    fp8 = elem_bytes == 1

    def add(cfg):
        if fp8:
            cfg = dataclasses.replace(cfg, block_k=cfg.block_k * 2)
        if cfg not in out:
            out.append(cfg)

    if elem_bytes == 4:
        for bm, bn, bk, st, w in [(128, 128, 32, 3, 8), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 256, 32, 3, 8)]:
            add(MatmulConfig(bm, bn, bk, num_stages=st, num_warps=w))
        return out
    if m <= 256 and variant in ("splitk", "auto", "autotuned", "grouped"):
        bm = 16 if m <= 16 else (64 if m <= 64 else 128)
        tiles = [(64, 128, 5), (64, 64, 5), (32, 64, 5), (32, 256, 3), (64, 128, 3), (128, 128, 3)]
        group = 1
        if bm == 128:       # M = 128 sweep winners: 64-row tiles grouped over M, and 128-row ones
            bm, group = 64, 8
            tiles = [(64, 128, 6), (64, 64, 6), (128, 128, 4), (32, 128, 4)]
        splits = variant in ("splitk", "auto")
        for bn, bk, st in tiles:
            cfg = MatmulConfig(bm, bn, bk, group_m=group, num_stages=st, num_warps=4)
            add(_with_split(m, n, k, cfg) if splits else cfg)
            if splits:
                add(_with_split(m, n, k, cfg, 3.0))
                if m > 64:
                    add(cfg)      # M = 128 on the H100: unsplit 64x64x128 won (the split lost 29%)
        if m > 64:
            for bn, bk, st in [(64, 128, 4), (32, 64, 5)]:
                cfg = MatmulConfig(128, bn, bk, group_m=1, num_stages=st, num_warps=4)
                add(_with_split(m, n, k, cfg) if splits else cfg)
        if variant == "auto" and m > 64:
            for bn, bk, st, w in [(64, 64, 4, 4), (64, 128, 4, 4), (128, 64, 4, 8), (32, 128, 6, 4)]:
                add(MatmulConfig(128, bn, bk, group_m=1, num_stages=st, num_warps=w, persistent=True))
            # 64-row TMA tiles: the H100's M = 128 winners (64 x 64 x 128 s6 at N = 4096, 64 x 128 x 128
            # s4 at N = 14336: 1.01x and 0.98x cuBLAS; benchmarks/NOTES.md)
            for bn, st in [(64, 6), (128, 4)]:
                add(MatmulConfig(64, bn, 128, group_m=8, num_stages=st, num_warps=4, persistent=True))
        return out
    persistent = variant in ("persistent", "auto")
    # (tile, stages, group, TMA store slices; 0 = pointer stores): the H100 probe's winners over
    # 8 large forward and backward problems (benchmarks/probe_matmul_epi.py)
    for (bm, bn, bk), st, g, sp in [((128, 256, 64), 3, 8, 0), ((128, 256, 64), 3, 16, 2),
                                    ((128, 256, 64), 4, 8, 2), ((128, 256, 64), 4, 16, 0),
                                    ((256, 128, 64), 3, 8, 2), ((128, 128, 64), 4, 8, 0)]:
        add(MatmulConfig(bm, bn, bk, group_m=g, num_stages=st, num_warps=8, persistent=persistent,
                         store_split=sp if persistent else 0))
    return out


# ----------------------------------------------------------------------------------------------
# CUDA C++ backend (warpforge/cuda): launch shapes of the softmax kernels
# ----------------------------------------------------------------------------------------------
CUDA_WARP_ROWS = 4          # rows (one warp each) per block of the warp-per-row kernels
CUDA_ROW_THREADS = 1024     # threads per block before a row is spread over a cluster (H100: one
                            # 1,024-thread block per 32K-bf16 row 96% of the copy roof, 2-8 block
                            # clusters 75% before the st.async exchange)
CUDA_VPT = 4                # 16-byte vectors a thread holds: 32 bf16, the 64-register limit
CUDA_MAX_CLUSTER = 16       # Hopper's non-portable cluster maximum


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def cuda_softmax_config(n: int, elem_size: int, backward: bool = False) -> list[int]:
    """``[threads, vectors per thread, cluster, rows per block]`` for warpforge_cuda::softmax(_backward).

    A row of ``n`` elements is ``nv`` 16-byte vectors. Up to 32 x 4 of them a warp holds it (no
    shared memory, no barrier); up to CUDA_ROW_THREADS x 4 one block; past that a cluster of
    blocks (2-16) that exchange statistics through distributed shared memory; past 16 blocks the
    looped kernel (vectors per thread 0), which reads the row twice. The backward holds two arrays,
    so its 16-bit shape is 512 x 4 or, in a cluster, 1,024 x 2 (see softmax.cu).
    """
    nv = triton.cdiv(n, 16 // elem_size)
    if nv <= 32 * CUDA_VPT:
        return [32, min(CUDA_VPT, _pow2_at_least(triton.cdiv(nv, 32))), 1, CUDA_WARP_ROWS]
    vpt = CUDA_VPT
    if backward and elem_size == 2:
        # two arrays: 4 vectors a thread cap the block at 512 threads (softmax.cu); a row that
        # needs a cluster runs 1,024 x 2 instead (H100, bf16: 32K-262K rows 86-94% of the copy
        # roof against 74-91% at 512 x 4)
        if nv <= 512 * CUDA_VPT:
            return [triton.cdiv(triton.cdiv(nv, CUDA_VPT), 32) * 32, CUDA_VPT, 1, 1]
        vpt = 2
    cluster = _pow2_at_least(triton.cdiv(nv, CUDA_ROW_THREADS * vpt))
    if cluster > CUDA_MAX_CLUSTER:
        return [1024, 0, 1, 1]
    threads = triton.cdiv(triton.cdiv(nv, vpt * cluster), 32) * 32
    return [threads, vpt, cluster, 1]


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    block_m: int       # query rows a program holds (fwd, dq) / streams per step (dk dv)
    block_n: int       # key rows a program streams per step (fwd, dq) / holds (dk dv)
    num_warps: int
    num_stages: int


# Tiles at D = 128 and 64 (16-bit) by the pattern of keys a query sees: "full", "causal", "window" (a left
# bound, causal or not) or "mask" (a user mask). H200, forward alone and forward+backward through
# the public functions (benchmarks/probe_attn_bwd_masked_tiles.py, NOTES item 77), against the
# tiles every pattern took before (fwd 128 x 64 x 8 warps x 3 stages, dq the same, dkdv 64 x 128 x
# 8 x 4). Where a band or a mask leaves tiles partly or wholly empty, smaller tiles waste less and
# spill less (the 64 x 128 dkdv tile spills 0.8-3.1 KB with a mask or window, compiled offline):
# - fwd: a window or mask 64 x 32 x 4 x 3 (window 0.76-0.79x, mask 0.86x); causal 64 x 64 x 4 x 3
#   (packed causal 0.97x; 64 x 32 1.08x there);
# - dq: a window or mask 64 x 64 x 4 x 2 (forward+backward 0.91-0.96x); causal keeps 128 x 64 (the
#   others 1.03-1.08x);
# - dkdv: causal or a window 32 x 64 x 4 x 3 (0.86-0.95x); full or a mask keep 64 x 128 (1.02x).
_ATTN_D128 = {
    ("fwd", "causal"): (64, 64, 4, 3), ("fwd", "window"): (64, 32, 4, 3), ("fwd", "mask"): (64, 32, 4, 3),
    ("dq", "window"): (64, 64, 4, 2), ("dq", "mask"): (64, 64, 4, 2),
    ("dkdv", "causal"): (32, 64, 4, 3), ("dkdv", "window"): (32, 64, 4, 3),
}
# D = 64, the same probe (`--head-dim 64`), each kernel varied alone against the tiles before
# (fwd and dq 128 x 64 x 8 x 3, dkdv 64 x 64 x 4 x 3): fwd a window 64 x 32 x 4 x 3 (forward
# 0.71-0.83x), causal 64 x 64 x 4 x 3 (0.96x; a mask and no band keep theirs, 64 x 64 1.00-1.01x);
# dq 64 x 64 x 4 x 3 with any pattern (forward+backward 0.91x packed full, 0.92x causal, 0.97x a
# mask), 64 x 32 x 4 x 3 with a window (0.88-0.90x); dkdv 16 x 64 x 4 x 3 with a window
# (0.95-0.96x), 32 x 64 x 4 x 3 with a mask (0.95x), causal and no band keep 64 x 64 (the rest
# 1.00-1.06x). All together against the tiles before, forward+backward: a window 0.78-0.80x, a mask
# 0.92x, causal 0.90-0.92x, packed full 0.91x, dense full 1.01x (the dq tile; Hopper kernels off)
_ATTN_D64 = {
    ("fwd", "causal"): (64, 64, 4, 3), ("fwd", "window"): (64, 32, 4, 3),
    ("dq", "full"): (64, 64, 4, 3), ("dq", "causal"): (64, 64, 4, 3), ("dq", "mask"): (64, 64, 4, 3),
    ("dq", "window"): (64, 32, 4, 3),
    ("dkdv", "window"): (16, 64, 4, 3), ("dkdv", "mask"): (32, 64, 4, 3),
}


def attention_pattern(mask_given: bool, win_left: int, win_right: int) -> str:
    """The key pattern attention_config keys its tiles on (see _ATTN_D128, _ATTN_D64)."""
    if mask_given:
        return "mask"
    if win_left >= 0:
        return "window"
    return "causal" if win_right >= 0 else "full"


def attention_config(kind: str, head_dim: int, elem_bytes: int, pattern: str = "full") -> AttentionConfig:
    """Tiles of the attention kernels. ``kind``: "fwd", "dq" or "dkdv"; ``head_dim`` the padded
    power-of-two head dim; ``pattern`` the keys a query sees (attention_pattern). The fwd and dq
    programs hold BLOCK_M query rows (and their O or dQ accumulator) in registers and stream K/V
    tiles; dk dv programs hold BLOCK_N key rows and two accumulators (dK, dV) and stream Q/dO
    tiles. A 128-row tile of a 128-wide fp32 accumulator is 64 KB of registers, a quarter of an
    SM's file: 8 warps carry it; at D = 256 the tiles halve so the streamed K/V stages
    (2 x 64 x 256 x 2 B each) still fit the 227 KB of shared memory."""
    if interpreting():
        return AttentionConfig(32, 32, 4, 1)   # few, large numpy ops: the interpreter's fastest shape
    if elem_bytes == 4:                         # fp32 (exact dots, not a performance target)
        return AttentionConfig(32, 32, 4, 2)
    by_pattern = _ATTN_D128 if 64 < head_dim <= 128 else _ATTN_D64 if 32 < head_dim <= 64 else {}
    if (kind, pattern) in by_pattern:
        return AttentionConfig(*by_pattern[(kind, pattern)])
    if kind == "fwd":
        if head_dim <= 128:                     # H100: 484 TFLOP/s at D = 128 (128x128 s3: 483, 64x64 w4: 480)
            return AttentionConfig(128, 64, 8, 3)
        return AttentionConfig(64, 32, 4, 2)   # D 256 (item 77): 0.78-0.88x the time of 64 x 64 at every pattern
    # D 256 backward (H200, benchmarks/probe_attn_bwd256.py, NOTES item 160): the 32 x 64 x 4-warp
    # dK/dV tile spilled ~1 KB a thread (two 64 x 256 fp32 accumulators on 128 threads); on 8 warps
    # with 3 stages (40 B) and a 128-row dQ tile on 8 warps (none), B4 H16/8 S4096 takes 12.9 ms
    # against 26.4 (causal 6.8 against 13.7)
    if kind == "dq":
        if head_dim <= 128:
            return AttentionConfig(128, 64, 8, 3)
        return AttentionConfig(128, 32, 8, 2)
    if head_dim <= 64:                          # dkdv; H200 at D 64 (probe_attn_bwd_tiles): the whole
        return AttentionConfig(64, 64, 4, 3)   # backward 6-11% faster than with 64 x 128 x 8 warps
    if head_dim <= 128:
        return AttentionConfig(64, 128, 8, 4)
    return AttentionConfig(32, 64, 8, 3)


def _step_down(cfg, smaller):
    """The fallback order of launch.launch_fitting's ladders (the tiles were chosen on Hopper's
    227 KB; an A100 has 163 KB a block, sm_86/89 cards 99 KB): ``cfg``, the same tile at fewer
    stages, then each tile of ``smaller`` (configs needing less shared memory, best first) at two
    stages and one."""
    yield cfg
    for stages in range(cfg.num_stages - 1, 0, -1):
        yield dataclasses.replace(cfg, num_stages=stages)
    low = sorted({min(2, cfg.num_stages), 1}, reverse=True)
    for c in smaller:
        for stages in low:
            yield dataclasses.replace(c, num_stages=stages)


def attention_configs(kind: str, head_dim: int, elem_bytes: int, pattern: str = "full"):
    """attention_config's tile, then tiles needing less shared memory, for a GPU where it does not
    fit (_step_down): the streamed tile (keys in fwd and dq, queries in dk dv) halved down to 16
    rows, then the held one, on as many warps (at D = 256 the dK/dV tile needs its 8 for the
    accumulators)."""
    cfg = attention_config(kind, head_dim, elem_bytes, pattern)

    def smaller():
        held, streamed = (cfg.block_n, cfg.block_m) if kind == "dkdv" else (cfg.block_m, cfg.block_n)
        while held > 16 or streamed > 16:
            if streamed > 16:
                streamed //= 2
            else:
                held //= 2
            bm, bn = (streamed, held) if kind == "dkdv" else (held, streamed)
            yield AttentionConfig(bm, bn, cfg.num_warps, cfg.num_stages)

    return _step_down(cfg, smaller())


def gemm_configs(cfg, keep_m: bool = False):
    """A GEMM tile (MatmulConfig or MoEConfig), then tiles needing less shared memory, for a GPU
    where it does not fit (_step_down): the K step halved down to 32, then the N side, then
    (unless ``keep_m``: the MoE row tile is the sorted layout's padding unit) the M side, down to 32."""
    def smaller():
        c = cfg
        while True:
            if c.block_k > 32:
                c = dataclasses.replace(c, block_k=c.block_k // 2)
            elif c.block_n > 32:
                c = dataclasses.replace(c, block_n=c.block_n // 2)
            elif c.block_m > 32 and not keep_m:
                c = dataclasses.replace(c, block_m=c.block_m // 2)
            else:
                return
            yield c

    return _step_down(cfg, smaller())


# ----------------------------------------------------------------------------------------------
# Mixture of Experts (ops/moe.py)
# ----------------------------------------------------------------------------------------------
MOE_ALIGN_CHUNK = 128   # slots per alignment program: the rank step is a 128 x 128 compare
# up to MOE_ALIGN_ONE_MAX slots (T * k), and slots x experts up to MOE_ALIGN_ONE_WORK, the alignment is
# one program (ops/moe.py, _moe_align_one_kernel: a histogram, the layout, one sort of the slots)
# instead of three launches: decode, where each launch's latency is most of its cost. H200, each
# alone as graph latency (benchmarks/probe_moe_align.py; NOTES item 103), one program / three
# launches in us: 8 experts 3.7-4.9 / 7.1-7.5 up to 512 slots, 7.3 / 7.5 at 1,024, 18.8 / 7.9 at
# 1,536 (a 2,048-wide sort); 64 experts 3.6-6.4 / 8.1-10.1 up to 512, 9.5 / 10.4 at 1,024, 21.8 /
# 11.3 at 1,536; 128 experts 4.7-11.1 / 7.9-12.9 up to 512, 15.6 / 14.0 at 1,024
MOE_ALIGN_ONE_MAX = 1024
MOE_ALIGN_ONE_WORK = 65536


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    store_split: int = 0    # TMA MoE kernels: 0 pointer stores; 1 or 2 TMA bulk stores in that many column slices


def moe_block_m(slots: int, experts: int, elem_bytes: int) -> int:
    """Rows per tile of the expert GEMMs (and the padding unit of the sorted layout): about the
    rows an expert gets. At training sizes (hundreds to thousands of rows an expert) 128-row tiles;
    at decode (T * k slots over min(E, T * k) experts, often 1-4 rows each) 16, the smallest tile
    tl.dot takes, so padding wastes at most 15 rows of tensor-core work per expert while each
    program streams its strip of weights once."""
    if interpreting():
        return 16
    per_expert = slots / max(1, min(experts, slots))
    cap = 64 if elem_bytes == 4 else 128
    for bm in (16, 32, 64):
        # a tile with room to spare: with random routing many experts get more than the mean, and
        # each row tile of an expert streams its weights again (H200, Mixtral T = 256: 64-row tiles
        # 926 us, 128-row 801; benchmarks/NOTES.md, item 54)
        if per_expert <= 0.75 * bm:
            return min(bm, cap)
    return cap


MOE_TMA_CONFIGS = {
    # kind: (tile, programs an SM (0: one program a tile), warp specialisation, flattened tile and K
    # loops), for 128-row tiles. H200, T = 8192 (benchmarks/NOTES.md, items 53 and 57), TFLOP/s at
    # DeepSeek-V2-Lite / Mixtral against the pointer kernels' 449 / 516 (up), 469 / 571 (down),
    # 493 / 526 (dgrad), 534 / 605 (dx), 311 / 363 (both weight gradients):
    # session 25 (probe_moe_dense.py, Mixtral, each kernel against cuBLAS on the same total size):
    # up with TMA stores, 3 stages (4 leave no room for the staging), warp-specialised 6.01 -> 5.89 ms;
    # dgrad with TMA stores in two column slices, 3 stages 2.97 -> 2.84 ms (0.96 -> 1.01x cuBLAS)
    "up": (MoEConfig(128, 128, 64, 8, 3, store_split=1), 1, True, True),    # 606 / 639 before (one gate+up accumulator, PAIRED)
    "down": (MoEConfig(128, 256, 64, 8, 3), 1, True, True),      # 569 / 666
    "dgrad": (MoEConfig(128, 256, 64, 8, 3, store_split=2), 1, False, True),    # 633 / 637 before
    "dx": (MoEConfig(128, 256, 64, 8, 3), 1, False, True),       # 587 / 674
    "wgrad": (MoEConfig(128, 256, 64, 8, 3, store_split=2), 1, False, False),   # 511 / 625 with pointer stores
}
# decode row tiles (32 or 64 rows, experts of >= 2^24 weights a matrix: Mixtral), one program a tile:
# H200, Mixtral T = 64 at 32-row tiles 685 us against the pointer kernels' 743 (16-row tiles: 786)
# (benchmarks/NOTES.md, item 54)
MOE_TMA_DECODE = {32: MoEConfig(32, 128, 128, 4, 4), 64: MoEConfig(64, 128, 64, 4, 4)}
MOE_TMA_DECODE_WGRAD = MoEConfig(128, 128, 64, 8, 3)
# decode with A and B swapped (ops/moe.py, _moe_swap_kernel): (TM, TW, BJ, BK, warps, stages) --
# TM token rows where a 128-row tile has at most that many real rows, else passes of TW; BJ output
# columns a program (gate/up: 2 * BJ weight rows); for 128-row tiles whose experts average at most
# MOE_SWAP_MAX_ROWS rows. H200, Mixtral T = 256 graph latency (benchmarks/NOTES.md, item 101):
# balanced / random / zipf 720 / 779 / 925 us, against 782 / 788 / 959 for the 128-row kernels
MOE_SWAP = {"up": (64, 128, 64, 64, 4, 4), "down": (64, 128, 128, 128, 4, 3)}
MOE_SWAP_MAX_ROWS = 64


def moe_tma_config(kind: str, block_m: int = 128) -> tuple[MoEConfig, int, bool, bool]:
    """(tile, programs an SM, warp specialisation, flatten) of the Hopper MoE kernels (ops/moe.py,
    TMA operands): "up", "down", "dgrad", "dx", "wgrad". The row tile is the padding unit
    ``block_m``; the weight gradients' K step divides it. The gate/up kernel takes one
    [128, 256] accumulator for a column tile's gate and up (two 128 x 128 ones left no registers
    for a flattened loop: ptxas serialised their wgmmas). Under 128 rows
    (decode): one program a tile streaming a strip of weights, long K steps."""
    if block_m >= 128:
        return MOE_TMA_CONFIGS[kind]
    if kind == "wgrad":
        return dataclasses.replace(MOE_TMA_DECODE_WGRAD, block_k=min(64, block_m)), 0, False, False
    return MOE_TMA_DECODE[block_m], 0, False, False


def moe_config(kind: str, block_m: int, elem_bytes: int) -> MoEConfig:
    """Tiles of the MoE kernels. ``kind``: "up" (gate and up accumulators, SwiGLU epilogue; BLOCK_N
    columns of each), "down" (down projection / dX rows), "dgrad" (dout @ Wd with the SwiGLU
    backward epilogue), "wgrad" (weight gradients; block_m is then the output tile, not the row
    tile). ``block_m``: the row tile of the sorted layout."""
    if interpreting():
        # wgrad's K step (32) exceeds the 16-row padding unit on purpose: the tests then cover a K
        # step that overruns an expert's rows (as fp32 on a GPU does)
        return MoEConfig(16, 16, 32 if kind == "wgrad" else 16, 4, 1, 2)
    if elem_bytes == 4:
        return MoEConfig(block_m if kind != "wgrad" else 64, 32, 32, 4, 2)
    if kind == "wgrad":
        # H100, DeepSeek-V2-Lite / Mixtral at T = 8192 (benchmarks/NOTES.md): 32-deep K steps, 5
        # stages: 387 / 396 TFLOP/s for dW_gate_up against 348 / 383 with 64-deep, 4 stages
        return MoEConfig(128, 128, 32, 8, 5, 4)
    if block_m <= 32:
        # decode: stream weight strips; many programs, long K steps
        return MoEConfig(block_m, 64, 128, 4, 4)
    warps = 8 if block_m >= 128 else 4
    if kind == "up":        # two 128 x 128 accumulators: 456 / 501 TFLOP/s against 440 / 435 at 64 columns
        return MoEConfig(block_m, 128, 64, warps, 3)
    if kind == "dgrad":     # dout @ Wd, plain store: 490 TFLOP/s at DeepSeek-V2-Lite (64-column tiles: 345)
        return MoEConfig(block_m, 128, 64, warps, 3, 4)
    # down and dX: 256-column tiles, 3 stages: 499 / 589 (down), 575 / 662 (dX) against 394-512 at 128
    return MoEConfig(block_m, 256, 64, warps, 3)
