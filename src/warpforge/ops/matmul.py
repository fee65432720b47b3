"""Matrix multiply and the linear layer: ``C = A @ B`` with fp32 accumulation, a fused epilogue, and
a ladder of named variants from the textbook tile to a persistent TMA kernel.

    matmul(a, b)                     C[m, n] = sum_k A[m, k] B[k, n]            (2-D or batched)
    linear(x, W, bias, act, res)     y = act(x @ W^T + bias) + res              (one kernel)
    backward of linear               dz = dy * act'(z);  dx = dz @ W;  dW = dz^T @ x;  db = sum_m dz

FLOP model: 2*M*N*K. Byte model (s = bytes per element): read A and B once, write C once,
(M*K + K*N + M*N)*s. At 4096^3 in bf16 that is 137 GFLOP over 100 MB: ~1,370 FLOP per byte, far
past the ~206 FLOP/B where an H200 turns compute-bound (990 TFLOP/s dense bf16 / 4.8 TB/s), so the
roof is the tensor cores and the bar is cuBLAS (~690-790 TFLOP/s at 8192^3 on the lent H200).
At M = 16 (decode) the same layer is 2*16*N*K FLOPs over a K*N weight read once: ~16 FLOP/B,
memory-bound: the roof is then the copy bandwidth, and the whole game is streaming the weight.

The ladder (``variant=``), each rung one idea. Measured in ``warpforge bench matmul`` on an H200,
bf16, 4096^3 (cuBLAS 733-775 TFLOP/s in the same run; benchmarks/results/NVIDIA-H200-2026-11-22):

``naive``       179 TFLOP/s (0.23x cuBLAS). One program per 64 x 64 output tile, row-major launch
                order, a K loop of 32-deep slices with no overlap: load, wait ~1 us for memory,
                multiply, repeat. The tensor cores wait on every load.
``pipelined``   475 TFLOP/s (2.7x naive). The same loop with ``num_stages=4``: Triton keeps the
                next three K-slices' loads in flight (asynchronous copies into a ring of shared-
                memory buffers) while the current one is multiplied, and the tile grows to
                128 x 128 x 64 (8 warps, two warpgroups of ``wgmma``): 4x the FLOPs per byte loaded.
``grouped``     566 TFLOP/s (+19%). Launch order for L2 reuse: consecutive programs walk GROUP_M = 8
                tile-rows down a column of tiles before moving right, so the A rows and B columns a
                wave of 132 programs needs are ~8x fewer distinct bytes and stay in the 50 MB L2.
``autotuned``   588 TFLOP/s (+4%). The grouped kernel with its tile, stages and warps searched per
                shape bucket on the device and cached on disk (``runtime/tuning.py``). The pointer
                kernel stops here: its warps both issue the loads and run the tensor cores.
``persistent``  734-780 TFLOP/s (+25-33%, 0.95-1.01x cuBLAS). One program per SM looping over
                tiles (no launch tail, no per-tile prologue); operands fetched by the Hopper tensor-
                memory accelerator (TMA): one thread issues a bulk copy of a whole [BLOCK, BLOCK_K]
                box described by a tensor descriptor, the hardware computes addresses and
                zero-fills the edges, and the warps' registers stay free for accumulators.
                (Triton 3.6's automatic warp specialisation, ``warp_specialize=True``, compiles on
                Hopper but measured within noise of the plain kernel: kept as a tuning option.)
                The finished tile leaves by TMA bulk stores in two 128 x 128 slices
                (``store_split=2``: half the staging buffer, the first slice's store overlapping the
                second's conversion). On an H100 over 8 large forward and backward problems the
                best configuration per problem ran 0.98-1.10x cuBLAS with it and 0.97-1.09x with
                pointer stores: level within the power-capped clock's noise; the default (one
                config for all) was best or within 3% on 6 of the 8 (benchmarks/NOTES.md).
``splitk``      for short M or long K. At 16 x 4096 x 4096 there are 64 output tiles of 16 x 64 for
                132 SMs: SPLIT_K programs share one tile's K range, each storing an fp32 partial;
                the last to finish (a per-tile arrival counter) sums the partials in a fixed order
                -- deterministic -- and runs the epilogue. 17.5 us there (1.01x cuBLAS) against
                20.0 us unsplit and 32.5 us for the persistent kernel.
                Stream-K (``MatmulConfig.stream_k``, persistent kernel only; off by default): the
                tiles of a last, partial wave are dealt out by K-steps instead of whole, so no SM
                idles. Measured on an H100 against the same tiles without it, it lost everywhere
                (128 x 14336 x 4096: 58.7 against 48.0 us; 4096^3: 212 against 179 us; not yet
                explained: the sharers' K loop, outside the flattened tile loop, may not be
                software-pipelined like the rest, and each shared tile pays an fp32 fixup);
                what closed the M = 128 gap was a 64-row TMA tile instead (64 x 64 x 128, six
                stages: 17.2 us at 128 x 4096 x 4096, cuBLAS 17.4; benchmarks/NOTES.md, item 35).
``auto``        (default) the fastest correct choice per shape: tuned over split-K pointer configs
                and persistent TMA configs when tuning is on (``WARPFORGE_AUTOTUNE=1``, ``warpforge
                bench``), else the winners shipped for the device (``runtime/tuned/``), else the
                heuristic defaults.

Every variant takes A and B with any strides (row- or column-major: ``x.T`` is not copied), so the
backward's ``dz^T @ x`` and ``dz @ W`` run on the same kernels with no transposes. The TMA kernel
needs a unit stride on one of the two dims and 16-byte aligned rows (otherwise ``auto`` takes the
pointer kernel). Inputs fp16/bf16 (fp32 accumulation) or fp32 (TF32 tensor cores when
``torch.backends.cuda.matmul.allow_tf32`` is set, else exact fp32 FMA).

The epilogue (bias, activation, residual, output cast; for fp8, the scales) runs on the fp32
accumulators in registers before the single store: ``linear(x, W, b, "gelu_tanh")`` writes y once,
where eager PyTorch writes x@W^T, reads it back for the bias, and again for the GELU.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import interpreting, new_empty, tuning
from ..runtime.amp import autocast_inputs
from ..runtime.checks import check_backend, check_device
from ..runtime.device import sm_count
from ..runtime.heuristics import MatmulConfig, gemm_configs, matmul_candidates, matmul_config
from ..runtime.launch import Desc, LaunchCache, aligned, launch, launch_fitting, shared_memory_limit
from ..runtime.registry import Op, may_keep_buffers
from .activations import _act, _act_and_grad

VARIANTS = ("auto", "naive", "pipelined", "grouped", "autotuned", "persistent", "splitk")
ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "silu": 2, "gelu": 3, "gelu_tanh": 4}
MATMUL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------
def _wide(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.device.type == "cpu" else torch.float32


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Ground truth in float64 (float32 on GPUs), cast back to ``a``'s dtype."""
    w = _wide(a)
    return torch.matmul(a.to(w), b.to(w)).to(a.dtype)


def _act_reference(z: torch.Tensor, activation: str | None) -> torch.Tensor:
    F = torch.nn.functional
    return {None: lambda t: t, "none": lambda t: t, "relu": F.relu, "silu": F.silu,
            "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation](z)


def linear_reference(x, weight, bias=None, activation=None, residual=None) -> torch.Tensor:
    w = _wide(x)
    y = x.to(w) @ weight.to(w).T
    if bias is not None:
        y = y + bias.to(w)
    y = _act_reference(y, activation)
    if residual is not None:
        y = y + residual.to(w)
    return y.to(x.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _tile_coords(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row, column) of output tile number ``tile``. GROUP_M = 1 is row-major order; larger
    groups walk GROUP_M tile-rows down each column before moving right (L2 reuse)."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows
    pid_n = (tile % per_group) // rows
    return pid_m, pid_n


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b on the tensor cores. UPCAST (the CPU interpreter only, whose dot multiplies
    bfloat16 as raw 16-bit integers) widens the operands to fp32 first."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _matmul_epilogue(acc, offs_m, offs_n, M, N,
                     c_ptr, s_cm, s_cn,          # output (any strides)
                     bias_ptr,                   # (N,) or unused
                     res_ptr, s_rm, s_rn,        # (M, N) residual or unused
                     z_ptr,                      # (M, N) contiguous pre-activation, or unused
                     sa_ptr, sb_ptr,             # fp8 scales: scalar, (M,) or (N,), or unused
                     HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                     STORE_Z: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr):
    """Everything after the K loop, on the fp32 accumulators, then one store."""
    acc = _epilogue_math(acc, offs_m, offs_n, M, N, bias_ptr, res_ptr, s_rm, s_rn, z_ptr, sa_ptr, sb_ptr,
                         HAS_BIAS, ACT, HAS_RES, STORE_Z, A_SCALE, B_SCALE)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    rows = offs_m.to(tl.int64)
    tl.store(c_ptr + rows[:, None] * s_cm + offs_n[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _epilogue_math(acc, offs_m, offs_n, M, N, bias_ptr, res_ptr, s_rm, s_rn, z_ptr, sa_ptr, sb_ptr,
                   HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                   STORE_Z: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr):
    """The epilogue on the fp32 accumulators: scales, bias, the pre-activation's store (STORE_Z),
    activation, residual. Returns the values to store."""
    mask_m = offs_m < M
    mask_n = offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    if A_SCALE == 1:
        acc = acc * tl.load(sa_ptr)
    elif A_SCALE == 2:
        acc = acc * tl.load(sa_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
    if B_SCALE == 1:
        acc = acc * tl.load(sb_ptr)
    elif B_SCALE == 2:
        acc = acc * tl.load(sb_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    rows = offs_m.to(tl.int64)
    if STORE_Z:
        tl.store(z_ptr + rows[:, None] * N + offs_n[None, :], acc.to(z_ptr.dtype.element_ty), mask=mask)
    if ACT == 1:
        acc = tl.maximum(acc, 0.0)
    elif ACT >= 2:
        acc = _act(acc, ACT - 2)          # 0 silu, 1 gelu (erf), 2 gelu (tanh)
    if HAS_RES:
        acc = acc + tl.load(res_ptr + rows[:, None] * s_rm + offs_n.to(tl.int64)[None, :] * s_rn, mask=mask).to(tl.float32)
    return acc


@triton.jit
def _shared_tile_sum(acc, tile_ws, lock, slot, slots, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A tile whose K range ``slots`` programs share (split-K, stream-K): publish this program's
    fp32 partial in its ``slot`` of the tile's workspace ``tile_ws`` and arrive on the tile's
    counter ``lock``. Returns (last, total): whether this program arrived last and, if so, the sum
    of the partials in slot order -- the same bits whoever arrives last -- with the counter reset
    for the next call."""
    TILE: tl.constexpr = BLOCK_M * BLOCK_N
    inner = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(tile_ws + slot * TILE + inner, acc)
    tl.debug_barrier()      # every thread's partial is written before the arrival is released
    arrived = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
    last = arrived == slots - 1
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if last:
        for s in range(slots):
            total += tl.load(tile_ws + s * TILE + inner, cache_modifier=".cg")
        tl.atomic_xchg(lock, 0, sem="relaxed", scope="gpu")   # ready for the next call
    return last, total


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr,            # (B, M, K), (B, K, N), (B, M, N): any strides
    bias_ptr, res_ptr, z_ptr,       # epilogue operands (see _matmul_epilogue)
    sa_ptr, sb_ptr,
    ws_ptr, lock_ptr,               # split-K: fp32 partials (tiles, SPLIT_K, BLOCK_M*BLOCK_N), int32 counters (tiles,)
    M, N, K,
    s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, s_rm, s_rn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, STORE_Z: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr,
):
    """One output tile per program (grid: tiles x batch, SPLIT_K; the batch folded into axis 0,
    whose extent is 2^31 - 1, not the 65,535 of axes 1-2); pointer loads with any strides,
    pipelined by ``num_stages`` at launch. Naive, pipelined, grouped, autotuned and split-K are
    all this kernel under different configurations."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    tile = pid % (tiles_m * tiles_n)
    batch = tl.cast(pid // (tiles_m * tiles_n), tl.int64)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _tile_coords(tile, tiles_m, tiles_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N

    k_steps = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_steps, SPLIT_K)
    k_lo = pid_k * per_split
    k_hi = min(k_lo + per_split, k_steps)
    # the split's first K column in 64 bits (times the K stride it passes 2^31), the tile's columns in
    # 32 (a 64-bit offset vector here measured 0.5-2% slower on batched GEMMs: NOTES item 76)
    k0 = tl.cast(k_lo, tl.int64) * BLOCK_K
    a_ptrs = (a_ptr + batch * s_ab + k0 * s_ak + offs_m.to(tl.int64)[:, None] * s_am + offs_k[None, :] * s_ak)
    b_ptrs = (b_ptr + batch * s_bb + k0 * s_bk + offs_k[:, None] * s_bk + offs_n.to(tl.int64)[None, :] * s_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ks in range(k_lo, k_hi):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            k_left = K - ks * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = _dot(a, b, acc, PRECISION, UPCAST)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk

    c_base = c_ptr + batch * s_cb
    if SPLIT_K == 1:
        _matmul_epilogue(acc, offs_m, offs_n, M, N, c_base, s_cm, s_cn, bias_ptr, res_ptr, s_rm, s_rn,
                         z_ptr, sa_ptr, sb_ptr, HAS_BIAS, ACT, HAS_RES, STORE_Z, A_SCALE, B_SCALE)
    else:
        # this K-range's partial; the last of the SPLIT_K programs to arrive finishes the tile
        tile_ws = ws_ptr + tl.cast(tile, tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
        last, total = _shared_tile_sum(acc, tile_ws, lock_ptr + tile, pid_k, SPLIT_K, BLOCK_M, BLOCK_N)
        if last:
            _matmul_epilogue(total, offs_m, offs_n, M, N, c_base, s_cm, s_cn, bias_ptr, res_ptr, s_rm, s_rn,
                             z_ptr, sa_ptr, sb_ptr, HAS_BIAS, ACT, HAS_RES, STORE_Z, A_SCALE, B_SCALE)


@triton.jit
def _tma_k_range(a_desc, b_desc, om, on, k_lo, k_hi, A_T: tl.constexpr, B_T: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The fp32 sum over K-steps [k_lo, k_hi) of one output tile, operands by TMA."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ks in range(k_lo, k_hi):
        ok = ks * BLOCK_K
        if A_T:
            a = a_desc.load([ok, om]).T
        else:
            a = a_desc.load([om, ok])
        if B_T:
            b = b_desc.load([on, ok]).T
        else:
            b = b_desc.load([ok, on])
        acc = _dot(a, b, acc, PRECISION, UPCAST)
    return acc


@triton.jit
def _column_halves(t, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(left, right): the two column halves of a (ROWS, COLS) tile (a register relabelling)."""
    return tl.split(tl.permute(tl.reshape(t, (ROWS, 2, COLS // 2)), (0, 2, 1)))


@triton.jit
def _tma_store_tile(c_desc, om, on, out, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store the (BLOCK_M, BLOCK_N) tile ``out`` at (om, on) by TMA: whole (SPLIT 1) or as its two
    column halves (SPLIT 2, a descriptor box half as wide)."""
    if SPLIT == 1:
        c_desc.store([om, on], out)
    else:
        left, right = _column_halves(out, BLOCK_M, BLOCK_N)
        c_desc.store([om, on], left)
        c_desc.store([om, on + BLOCK_N // 2], right)


@triton.jit
def _tma_tile_out(acc, om, on, M, N, c_desc, c_ptr, s_cm, s_cn, bias_ptr, res_ptr, s_rm, s_rn, z_ptr, sa_ptr, sb_ptr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, STORE_Z: tl.constexpr,
                  A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, STORE_SPLIT: tl.constexpr):
    """The persistent kernel's epilogue for one finished tile: pointer stores (STORE_SPLIT = 0) or
    TMA bulk stores in STORE_SPLIT column slices."""
    offs_m = om + tl.arange(0, BLOCK_M)
    offs_n = on + tl.arange(0, BLOCK_N)
    if STORE_SPLIT == 0:
        _matmul_epilogue(acc, offs_m, offs_n, M, N, c_ptr, s_cm, s_cn, bias_ptr, res_ptr, s_rm, s_rn,
                         z_ptr, sa_ptr, sb_ptr, HAS_BIAS, ACT, HAS_RES, STORE_Z, A_SCALE, B_SCALE)
    else:
        acc = _epilogue_math(acc, offs_m, offs_n, M, N, bias_ptr, res_ptr, s_rm, s_rn, z_ptr, sa_ptr, sb_ptr,
                             HAS_BIAS, ACT, HAS_RES, STORE_Z, A_SCALE, B_SCALE)
        _tma_store_tile(c_desc, om, on, acc.to(c_desc.dtype), STORE_SPLIT, BLOCK_M, BLOCK_N)


@triton.jit
def _sk_owner(step, per, extra):
    """The stream-K program whose range holds K-step ``step``: the first ``extra`` programs take
    per + 1 steps, the rest ``per``."""
    big = extra * (per + 1)
    return tl.where(step < big, step // (per + 1), extra + (step - big) // tl.maximum(per, 1))


@triton.jit
def _matmul_tma_kernel(
    a_desc, b_desc,                 # TMA descriptors: A as (M, K) or, if A_T, (K, M); B as (K, N) or, if B_T, (N, K)
    c_desc,                         # the output's descriptor (box BLOCK_M x BLOCK_N / STORE_SPLIT) when STORE_SPLIT > 0
    c_ptr, bias_ptr, res_ptr, z_ptr, sa_ptr, sb_ptr,
    ws_ptr, lock_ptr,               # stream-K: fp32 partials (SK tiles, SK_SLOTS, BLOCK_M*BLOCK_N), int32 counters
    M, N, K, s_cm, s_cn, s_rm, s_rn,
    SK_TILES,                       # stream-K: how many of the last tiles (in launch order) are shared
    SK_SLOTS,                       # stream-K: the most programs that share one tile
    A_T: tl.constexpr, B_T: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr, STORE_Z: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, STORE_SPLIT: tl.constexpr, STREAM_K: tl.constexpr,
):
    """Persistent: NUM_PROGRAMS programs (one per SM) take tiles tile, tile + NUM_PROGRAMS, ...
    in grouped order; operands arrive by TMA bulk copies (zero-filled past the edges, so no
    masks), pipelined ``num_stages`` deep. The tile and K loops are flattened into one software
    pipeline so the next tile's first loads overlap this tile's epilogue.

    STORE_SPLIT = 0: the epilogue stores through pointers (any output strides). 1 or 2: the
    finished tile leaves by TMA bulk stores (a row-major output; the hardware clips the edges), in
    STORE_SPLIT column slices, so that the staging buffer in shared memory is 1/STORE_SPLIT of the
    tile and the first slice's store overlaps the second's conversion.

    STREAM_K: the last SK_TILES tiles (those that would leave SMs idle in a last, partial wave)
    are not dealt out whole: their K-steps are, as equal contiguous ranges, one per program, so
    a tile may be shared by consecutive programs. Each sharer stores its fp32 partial in its slot;
    the last to arrive (a per-tile counter) sums the slots in order -- the same bits whoever is
    last -- and runs the epilogue."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    dp_tiles = tiles_m * tiles_n
    if STREAM_K:
        dp_tiles -= SK_TILES
    for tile in tl.range(tl.program_id(0), dp_tiles, NUM_PROGRAMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        om = pid_m * BLOCK_M
        on = pid_n * BLOCK_N
        acc = _tma_k_range(a_desc, b_desc, om, on, 0, k_steps, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K,
                           PRECISION, UPCAST)
        _tma_tile_out(acc, om, on, M, N, c_desc, c_ptr, s_cm, s_cn, bias_ptr, res_ptr, s_rm, s_rn, z_ptr,
                      sa_ptr, sb_ptr, BLOCK_M, BLOCK_N, HAS_BIAS, ACT, HAS_RES, STORE_Z, A_SCALE, B_SCALE,
                      STORE_SPLIT)
    if STREAM_K:
        pid = tl.program_id(0)
        steps = SK_TILES * k_steps
        per = steps // NUM_PROGRAMS
        extra = steps % NUM_PROGRAMS
        it = pid * per + tl.minimum(pid, extra)
        end = it + per + tl.where(pid < extra, 1, 0)
        while it < end:
            sk_tile = it // k_steps
            k_lo = it - sk_tile * k_steps
            k_hi = tl.minimum(k_steps, k_lo + (end - it))
            tile = dp_tiles + sk_tile
            pid_m, pid_n = _tile_coords(tile, tiles_m, tiles_n, GROUP_M)
            om = pid_m * BLOCK_M
            on = pid_n * BLOCK_N
            acc = _tma_k_range(a_desc, b_desc, om, on, k_lo, k_hi, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K,
                               PRECISION, UPCAST)
            first = _sk_owner(sk_tile * k_steps, per, extra)
            sharers = _sk_owner(sk_tile * k_steps + k_steps - 1, per, extra) - first + 1
            if sharers == 1:
                _tma_tile_out(acc, om, on, M, N, c_desc, c_ptr, s_cm, s_cn, bias_ptr, res_ptr, s_rm, s_rn, z_ptr,
                              sa_ptr, sb_ptr, BLOCK_M, BLOCK_N, HAS_BIAS, ACT, HAS_RES, STORE_Z, A_SCALE,
                              B_SCALE, STORE_SPLIT)
            else:
                # SK_SLOTS partials of workspace a shared tile; this program is its sharer pid - first
                tile_ws = ws_ptr + tl.cast(sk_tile, tl.int64) * (SK_SLOTS * BLOCK_M * BLOCK_N)
                last, total = _shared_tile_sum(acc, tile_ws, lock_ptr + sk_tile, pid - first, sharers, BLOCK_M, BLOCK_N)
                if last:
                    _tma_tile_out(total, om, on, M, N, c_desc, c_ptr, s_cm, s_cn, bias_ptr, res_ptr, s_rm, s_rn,
                                  z_ptr, sa_ptr, sb_ptr, BLOCK_M, BLOCK_N, HAS_BIAS, ACT, HAS_RES, STORE_Z,
                                  A_SCALE, B_SCALE, STORE_SPLIT)
            it += k_hi - k_lo


@triton.jit
def _act_bwd_kernel(
    dy_ptr, z_ptr, dz_ptr,          # (n,) contiguous incoming gradient, saved pre-activation, output
    n, ACT: tl.constexpr, BLOCK: tl.constexpr,
):
    """dz = dy * act'(z), elementwise (the linear layer's activation backward)."""
    offs = tl.cast(tl.program_id(0), tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    z = tl.load(z_ptr + offs, mask=mask).to(tl.float32)
    if ACT == 1:
        d = tl.where(z > 0.0, 1.0, 0.0)
    else:
        _, d = _act_and_grad(z, ACT - 2)
    tl.store(dz_ptr + offs, (dy * d).to(dz_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
_LOCKS: dict[tuple, torch.Tensor] = {}


def _split_locks(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed arrival counters for split-K, one per output tile, kept per (device, stream): the
    kernel resets each counter after use, so a buffer is reused without a memset launch. Under CUDA
    graph capture, fresh counters each call, zeroed inside the graph: a kept buffer first made
    during a capture was zeroed only by that graph's replays (another graph of the same stream
    replayed first read whatever was there), and graphs of one stream would share it; and through
    the dispatcher (torch.compile's graphs: see registry.dispatched), as the CUDA graph trees refuse
    a kept buffer allocated in their warm-up."""
    if not may_keep_buffers(device):
        return torch.zeros(tiles, dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    buf = _LOCKS.get(key)
    if buf is None or buf.numel() < tiles:
        buf = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
        _LOCKS[key] = buf
    return buf


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 and not interpreting() else "ieee"
    return "tf32"   # ignored for 16-bit and fp8 operands


def _upcast(dtype: torch.dtype) -> bool:
    return interpreting() and dtype == torch.bfloat16


def _tma_view(t: torch.Tensor, rows: int, cols: int):
    """How TMA can read a 2-D operand stored as (rows, cols): ``(transposed, shape, strides)`` of a
    row-major description, or None when neither dim has unit stride or rows are not 16-byte aligned."""
    es = t.element_size()
    if t.data_ptr() % 16:
        return None
    s0, s1 = t.stride()
    if s1 == 1 and (s0 * es) % 16 == 0 and (cols * es) >= 16:
        return False, [rows, cols], [s0, 1]
    if s0 == 1 and (s1 * es) % 16 == 0 and (rows * es) >= 16:
        return True, [cols, rows], [s1, 1]
    return None


def _tma_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dim() != 2 or b.dim() != 2:
        return False
    if not interpreting():
        if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device)[0] < 9:
            return False
    return _tma_view(a, *a.shape) is not None and _tma_view(b, *b.shape) is not None


class _Epilogue:
    """Epilogue operands of one launch (absent ones point at the output and are never read)."""

    def __init__(self, out, bias=None, residual=None, z=None, act=0, a_scale=None, b_scale=None):
        # the epilogue reads the bias densely (bias_ptr + offs_n): a strided view is copied
        self.bias = None if bias is None else bias.contiguous()
        self.res, self.z = residual, z
        self.act = act
        self.a_scale, self.b_scale = a_scale, b_scale

    def pointers(self, out):
        return (out if self.bias is None else self.bias, out if self.res is None else self.res,
                out if self.z is None else self.z,
                out if self.a_scale is None else self.a_scale, out if self.b_scale is None else self.b_scale)

    def strides(self):
        return (0, 0) if self.res is None else (self.res.stride(0), self.res.stride(1))

    @staticmethod
    def _scale_mode(s):
        return 0 if s is None else (1 if s.numel() == 1 else 2)

    def flags(self):
        return dict(HAS_BIAS=self.bias is not None, ACT=self.act, HAS_RES=self.res is not None,
                    STORE_Z=self.z is not None, A_SCALE=self._scale_mode(self.a_scale),
                    B_SCALE=self._scale_mode(self.b_scale))

    def signature(self) -> tuple:
        """What a launch plan depends on: which operands exist, their dtypes, alignment, strides."""
        return (self.act, self.strides(), self._scale_mode(self.a_scale), self._scale_mode(self.b_scale),
                *((None if t is None else (t.dtype, t.data_ptr() % 16 == 0))
                  for t in (self.bias, self.res, self.z, self.a_scale, self.b_scale)))


def _batched(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(3-D view, batch stride): a 2-D operand is a batch of one."""
    return (t, t.stride(0)) if t.dim() == 3 else (t.unsqueeze(0), 0)


_TILED = LaunchCache(_matmul_kernel)
_TMA = LaunchCache(_matmul_tma_kernel)


def _tiled_geometry(a, b, out, ep: _Epilogue, cfg: MatmulConfig):
    """What the pointer kernel's launch for one problem fixes: grid, integer arguments, and the
    split-K tiles with their workspace size for :func:`_partials` (all determined by the shapes and
    strides a plan key pins)."""
    a3, s_ab = _batched(a)
    b3, s_bb = _batched(b)
    c3, s_cb = _batched(out)
    batch, m, k = a3.shape
    n = b3.shape[-1]
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    split = cfg.split_k if batch == 1 else 1
    ints = (m, n, k, s_ab, a3.stride(1), a3.stride(2), s_bb, b3.stride(1), b3.stride(2),
            s_cb, c3.stride(1), c3.stride(2), *ep.strides())
    shared = (tiles, tiles * split * cfg.block_m * cfg.block_n) if split > 1 else (0, 0)
    return (tiles * batch, split), ints, shared


def _partials(out, tiles: int, ws_numel: int):
    """(fp32 partials, arrival counters) of a launch in which ``tiles`` tiles share their K range
    (split-K, stream-K) over ``ws_numel`` floats of workspace; the output stands in for both
    (never touched) when none does."""
    if tiles == 0:
        return out, out
    return torch.empty(ws_numel, dtype=torch.float32, device=out.device), _split_locks(out.device, tiles)


def _launch_tiled(a, b, out, ep: _Epilogue, cfg: MatmulConfig, plan=None) -> None:
    grid, ints, shared = _tiled_geometry(a, b, out, ep, cfg)
    k = ints[2]
    _TILED(plan, grid, (a, b, out, *ep.pointers(out), *_partials(out, *shared), *ints),
           dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                SPLIT_K=grid[1], EVEN_K=(k % cfg.block_k == 0), PRECISION=_precision(a.dtype),
                UPCAST=_upcast(a.dtype), **ep.flags()),
           num_stages=cfg.num_stages, num_warps=cfg.num_warps)


def _fast_tiled(a, b, out, ep: _Epilogue, cfg: MatmulConfig, recorded):
    """A closure that relaunches the pointer kernel for this plan with only the tensors looked up
    per call (every integer argument and the grid are fixed by the plan key)."""
    compiled, tail = recorded
    grid, ints, shared = _tiled_geometry(a, b, out, ep, cfg)

    def fire(a, b, out, ep):
        launch(compiled, grid, (a, b, out, *ep.pointers(out), *_partials(out, *shared), *ints, *tail))

    return fire


def _tma_geometry(a, b, out, ep: _Epilogue, cfg: MatmulConfig):
    """The persistent kernel's fixed launch facts: each operand's row-major description and box
    (transposed or not), the grid, the stream-K tiles with their workspace size for
    :func:`_partials`, and the integer arguments."""
    m, k = a.shape
    n = b.shape[1]
    a_t, a_shape, a_strides = _tma_view(a, m, k)
    b_t, b_shape, b_strides = _tma_view(b, k, n)
    a_desc = (a_shape, a_strides, [cfg.block_k, cfg.block_m] if a_t else [cfg.block_m, cfg.block_k])
    b_desc = (b_shape, b_strides, [cfg.block_n, cfg.block_k] if b_t else [cfg.block_k, cfg.block_n])
    # TMA stores need a row-major output it can describe; others take the pointer epilogue
    c_desc = (([m, n], [out.stride(0), 1], [cfg.block_m, cfg.block_n // cfg.store_split])
              if cfg.store_split and _tma_store_ok(out) else None)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    programs = min(tiles, sm_count())
    sk = _stream_k_split(tiles, triton.cdiv(k, cfg.block_k), sm_count()) if cfg.stream_k else None
    shared = (0, 0)
    if sk is not None:
        programs = sm_count()
        shared = (sk[0], sk[0] * sk[1] * cfg.block_m * cfg.block_n)
    return (a_t, b_t, a_desc, b_desc, c_desc, programs, shared,
            (m, n, k, out.stride(0), out.stride(1), *ep.strides(), *(sk or (0, 0))))


def _stream_k_split(tiles: int, k_steps: int, programs: int):
    """(tiles shared out by K-steps, the most programs sharing one) for stream-K: the tiles a last,
    partial wave would leave to a subset of the SMs (all of them when there are fewer tiles than
    SMs), or None when the tiles fill whole waves."""
    sk_tiles = tiles % programs if tiles > programs else tiles
    if sk_tiles == 0 or k_steps < 2:
        return None
    per = max(1, sk_tiles * k_steps // programs)
    slots = min(programs, triton.cdiv(k_steps, per) + 1)
    return sk_tiles, slots


def _tma_store_ok(out: torch.Tensor) -> bool:
    """Whether TMA can write the output: 2-D and readable by TMA without a transpose (row-major,
    16-byte aligned base and rows; :func:`_tma_view`)."""
    view = _tma_view(out, *out.shape) if out.dim() == 2 else None
    return view is not None and not view[0]


def _launch_tma(a, b, out, ep: _Epilogue, cfg: MatmulConfig, plan=None) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor    # validates what Desc takes on trust

    a_t, b_t, a_desc, b_desc, c_desc, programs, shared, ints = _tma_geometry(a, b, out, ep, cfg)
    _TMA(plan, (programs,), (TensorDescriptor(a, *a_desc), TensorDescriptor(b, *b_desc),
                             None if c_desc is None else TensorDescriptor(out, *c_desc), out, *ep.pointers(out),
                             *_partials(out, *shared), *ints),
         dict(A_T=a_t, B_T=b_t, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
              GROUP_M=cfg.group_m, NUM_PROGRAMS=programs, WARP_SPECIALIZE=cfg.warp_specialize,
              PRECISION=_precision(a.dtype), UPCAST=_upcast(a.dtype), **ep.flags(),
              STORE_SPLIT=0 if c_desc is None else cfg.store_split, STREAM_K=shared[0] > 0),
         num_stages=cfg.num_stages, num_warps=cfg.num_warps)


def _fast_tma(a, b, out, ep: _Epilogue, cfg: MatmulConfig, recorded):
    """The same for the persistent TMA kernel: descriptors rebuilt per call around the new base
    pointers (shape, strides and box are the plan's, validated on its first launch)."""
    compiled, tail = recorded
    _, _, a_desc, b_desc, c_desc, programs, shared, ints = _tma_geometry(a, b, out, ep, cfg)

    def fire(a, b, out, ep):
        launch(compiled, (programs,), (Desc(a, *a_desc), Desc(b, *b_desc), None if c_desc is None else Desc(out, *c_desc),
                                       out, *ep.pointers(out), *_partials(out, *shared), *ints, *tail))

    return fire


def _layout(t: torch.Tensor) -> str:
    return "t" if t.stride(-1) != 1 and t.stride(-2) == 1 else "n"


def _resolve(a, b, variant: str) -> tuple[str, bool]:
    """(candidate family, tune?) for ``variant`` on these operands. ``auto`` is one family whose
    candidates mix the split-K pointer kernel (short M) and the persistent TMA kernel; configs with
    ``persistent=True`` are dropped where TMA cannot read the operands."""
    if variant == "auto":
        return "auto", tuning.enabled()
    if variant == "persistent" and not _tma_ok(a, b):
        return "grouped", False       # documented: TMA needs a unit-stride dim and aligned rows
    return variant, variant == "autotuned" or (tuning.enabled() and variant in ("persistent", "splitk"))


SMEM_BYTES = 232_448        # shared memory one block may use on Hopper (227 KB)


def _fit_stages(cfg: MatmulConfig, in_bytes: int, out_bytes: int, limit: int = SMEM_BYTES) -> MatmulConfig:
    """Fewer pipeline stages when the ring of A/B tiles plus the epilogue's staging of the output
    tile would not fit in shared memory. The staging was read off compiled kernels (sm_90, Triton
    3.6): 128x256 with a 16-bit output takes 32 KB (so 4 stages of 48 KB fit: 229,376 B), with an
    fp32 output 128 KB (so fp8's 128x256x128 tiles fit 2 stages, not 4: the fp8 helper's H200
    failures, benchmarks/NOTES.md). ``limit``: the device's bytes a block (Hopper's by default)."""
    per_stage = (cfg.block_m + cfg.block_n) * cfg.block_k * in_bytes
    staging = cfg.block_m * cfg.block_n * (4 if out_bytes >= 4 else 1)
    if cfg.store_split:      # TMA stores (the persistent kernel) stage one column slice of the tile
        staging = max(staging, cfg.block_m * cfg.block_n // cfg.store_split * out_bytes)
    stages = max(1, min(cfg.num_stages, (limit - staging) // per_stage))
    return cfg if stages == cfg.num_stages else dataclasses.replace(cfg, num_stages=stages)


def _uses_tma(cfg: MatmulConfig, family: str) -> bool:
    return family == "persistent" or cfg.persistent


_PLANS: dict = {}
_MAX_PLANS = 4096


def _run(a, b, out, ep: _Epilogue, variant: str) -> None:
    """Launch with the plan (kernel, configuration) chosen for this exact problem: the first call
    of a problem picks it (tuned, cached, or the heuristic default), later calls reuse it and the
    compiled kernel, skipping ~100 us of Python (benchmarks/NOTES.md)."""
    key = (variant, tuning.enabled(), torch.backends.cuda.matmul.allow_tf32, a.device.index, a.dtype, out.dtype,
           a.shape, a.stride(), b.shape, b.stride(), out.stride(), ep.signature(), aligned(a, b, out))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:      # many distinct shapes (a serving loop's varying M): start over
            _PLANS.clear()
        plan = _PLANS[key] = [*_plan(a, b, out, ep, variant, key), None]
    tma, cfg, fire = plan
    if fire is not None:
        fire(a, b, out, ep)
        return
    if tma:
        _launch_tma(a, b, out, ep, cfg, key)
    else:
        # where the tile's pipeline does not fit this GPU's shared memory after all (_fit_stages is a
        # model), the first smaller tile that does; the plan keeps it
        cfg = plan[1] = launch_fitting("matmul", gemm_configs(cfg), lambda c: _launch_tiled(a, b, out, ep, c, key) or c,
                                       (a.dtype, out.dtype, ep.signature()))
    recorded = (_TMA if tma else _TILED).get(key)
    if recorded is not None:          # None under the interpreter: every call takes the JIT
        plan[2] = (_fast_tma if tma else _fast_tiled)(a, b, out, ep, cfg, recorded)


def _plan(a, b, out, ep: _Epilogue, variant: str, problem: tuple):
    """(TMA kernel?, configuration) for one problem (``problem``: its plan key in :func:`_run`):
    tuned (and stored), cached, or the default."""
    family, tune = _resolve(a, b, variant)
    m, k = a.shape[-2:]
    n = b.shape[-1]
    tma = _tma_ok(a, b)
    cand_family = "grouped" if family == "autotuned" else family
    key = (f"matmul|{cand_family}|{str(a.dtype)[6:]}|a{_layout(a)}b{_layout(b)}{'' if tma else '-notma'}|"
           f"{tuning.bucket(m)}x{tuning.bucket(n)}x{tuning.bucket(k)}")

    limit = shared_memory_limit(a.device.index) if a.is_cuda and not interpreting() else SMEM_BYTES

    def usable(c: MatmulConfig) -> MatmulConfig:
        if c.persistent and not tma:
            c = dataclasses.replace(c, persistent=False)
        return _fit_stages(c, a.element_size(), out.element_size(), limit)

    cached = None if interpreting() else tuning.lookup(key)
    if cached is not None:
        cfg = usable(MatmulConfig(**cached))
    elif tune and not interpreting():
        cands = list(dict.fromkeys(usable(c) for c in matmul_candidates(m, n, k, a.element_size(), cand_family)))
        # each candidate timed through its own launch plan, keyed on this exact problem: the JIT's
        # ~60 us of per-call Python would otherwise outlast a short-M kernel and the search would
        # rank host time
        def run(c):
            (_launch_tma if _uses_tma(c, cand_family) else _launch_tiled)(a, b, out, ep, c, ("tune", problem, c))

        cfg, _ = tuning.search(cands, run)
        tuning.store(key, cfg.as_dict())
    else:
        cfg = usable(matmul_config(m, n, k, a.element_size(), cand_family))
        if cand_family == "auto" and not cfg.persistent and m > 256 and a.dim() == 2 and tma:
            cfg = dataclasses.replace(cfg, persistent=True)
    return _uses_tma(cfg, cand_family), cfg


def _mm(a: torch.Tensor, b: torch.Tensor, *, variant: str = "auto", bias=None, residual=None,
        activation: int = 0, store_z: bool = False, out_dtype: torch.dtype | None = None,
        a_scale=None, b_scale=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """C = epilogue(A @ B) for 2-D or 3-D (batched) A, B; returns (C, pre-activation or None)."""
    *batch, m, k = a.shape
    n = b.shape[-1]
    dtype = out_dtype or a.dtype
    out = new_empty((*batch, m, n), device=a.device, dtype=dtype)
    z = new_empty((m, n), device=a.device, dtype=dtype) if store_z else None
    if out.numel() == 0:
        return out, z
    if k == 0:
        out.zero_()
        # an empty sum, then the epilogue: only bias/activation/residual remain
        y = out.float()
        if bias is not None:
            y = y + bias.float()
        if z is not None:
            z.copy_(y)
        y = _act_reference(y, {v: kk for kk, v in ACTIVATIONS.items() if kk}.get(activation))
        if residual is not None:
            y = y + residual.float()
        return out.copy_(y), z
    _run(a, b, out, _Epilogue(out, bias, residual, z, activation, a_scale, b_scale), variant)
    return out, z


def _act_backward(dy: torch.Tensor, z: torch.Tensor, act: int) -> torch.Tensor:
    dy = dy.contiguous()
    dz = new_empty(z.shape, device=z.device, dtype=z.dtype)
    n = z.numel()
    if n:
        block = 1024
        _act_bwd_kernel[(triton.cdiv(n, block),)](dy, z, dz, n, ACT=act, BLOCK=block, num_warps=4)
    return dz


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _matmul_impl(a: torch.Tensor, b: torch.Tensor, variant: str) -> torch.Tensor:
    return _mm(a, b, variant=variant)[0]


def _matmul_fake(a, b, variant):
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


def _matmul_setup(ctx, inputs, output):
    a, b, ctx.variant = inputs
    ctx.save_for_backward(a, b)


def _matmul_backward(ctx, dc):
    a, b = ctx.saved_tensors
    da = matmul_op(dc, b.mT, "auto") if ctx.needs_input_grad[0] else None
    db = matmul_op(a.mT, dc, "auto") if ctx.needs_input_grad[1] else None
    return da, db, None


matmul_op = Op("matmul", _matmul_impl, _matmul_fake, backward=_matmul_backward, setup_context=_matmul_setup)


def _linear_impl(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 residual: Optional[torch.Tensor], activation: int, save_preact: bool,
                 variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, z): y = act(x @ W^T + bias) + residual; z the pre-activation when ``save_preact``
    (for the backward of a non-linear activation), else an empty tensor."""
    y, z = _mm(x, weight.T, variant=variant, bias=bias, residual=residual, activation=activation,
               store_z=save_preact and activation != 0)
    return y, (x.new_empty((0,)) if z is None else z)


def _linear_fake(x, weight, bias, residual, activation, save_preact, variant):
    m, n = x.shape[0], weight.shape[0]
    z = x.new_empty((m, n) if save_preact and activation != 0 else (0,))
    return x.new_empty((m, n)), z


def _linear_setup(ctx, inputs, output):
    x, weight, bias, residual, act, _save, _variant = inputs
    _y, z = output
    ctx.mark_non_differentiable(z)
    ctx.act = act
    ctx.has_bias, ctx.has_res = bias is not None, residual is not None
    ctx.bias_dtype = None if bias is None else bias.dtype
    # for a double backward only, whose graph must run through the bias (its value is never read:
    # not saved, so updating it in place after the forward stays legal, as in torch)
    ctx.bias = bias if act != 0 else None
    ctx.save_for_backward(x, weight, z)


def _linear_backward(ctx, dy, _dz):
    x, weight, z = ctx.saved_tensors
    need_x, need_w, need_b, need_r = ctx.needs_input_grad[:4]
    dres = dy if (ctx.has_res and need_r) else None
    if not (need_x or need_w or (ctx.has_bias and need_b)):
        return None, None, None, dres, None, None, None
    if ctx.act != 0:
        if z.numel() == 0 and dy.numel() != 0:
            raise RuntimeError("warpforge.linear: the pre-activation was not saved; call linear with "
                               "inputs that require grad (save_preact is set then)")
        dz = _act_backward_graph(dy, x, weight, ctx.bias, z, ctx.act) if _creates_graph(dy, x, weight, ctx.bias) \
            else act_backward_op(dy, z, ctx.act)
    else:
        dz = dy
    dx = matmul_op(dz, weight, "auto") if need_x else None
    dw = matmul_op(dz.T, x, "auto") if need_w else None
    db = dz.sum(0, dtype=torch.float32).to(ctx.bias_dtype) if (ctx.has_bias and need_b) else None
    return dx, dw, db, dres, None, None, None


def _creates_graph(*ts) -> bool:
    """A backward run under create_graph=True (grad mode is on in a backward only then) whose
    result must itself be differentiable."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _act_backward_graph(dy, x, weight, bias, z, act: int) -> torch.Tensor:
    """dz = act'(z) * dy in torch ops that autograd can differentiate again (double backward).

    The kernel's dz is a constant to autograd and z is saved non-differentiable, so a double
    backward through it silently lost every term through the activation's derivative (dx, dW, db
    of grad-of-grad off by ~80%). Here z keeps its saved values but takes its graph from
    x @ W^T + b, recomputed (one GEMM, only under create_graph)."""
    lin = x @ weight.T if bias is None else torch.addmm(bias, x, weight.T)
    zg = z.detach() + (lin - lin.detach())                      # (M, N): z's values, lin's graph
    if not zg.requires_grad:
        zg.requires_grad_()                                     # only dy needs the graph
    y = _act_reference(zg, {v: k for k, v in ACTIVATIONS.items() if k}[act])
    return torch.autograd.grad(y, zg, dy, create_graph=True)[0]


def _act_bwd_impl(dy: torch.Tensor, z: torch.Tensor, act: int) -> torch.Tensor:
    return _act_backward(dy, z, act)


def _act_bwd_fake(dy, z, act):
    return z.new_empty(z.shape)


act_backward_op = Op("linear_act_backward", _act_bwd_impl, _act_bwd_fake)
linear_op = Op("linear", _linear_impl, _linear_fake, backward=_linear_backward, setup_context=_linear_setup)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _check_operand(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"warpforge: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in MATMUL_DTYPES:
        raise TypeError(f"warpforge: '{name}' has dtype {_dt(t)}; expected float32, float16 or bfloat16")
    check_device(name, t)


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"warpforge: 'variant' is {variant!r}; expected one of {', '.join(map(repr, VARIANTS))}")


def _check_pair(a_name, a, b_name, b) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"warpforge: '{a_name}' is {_dt(a)} but '{b_name}' is {_dt(b)}; expected the same dtype")
    if a.device != b.device:
        raise RuntimeError(f"warpforge: '{a_name}' is on {a.device} but '{b_name}' is on {b.device}; "
                           f"expected the same device")


def matmul(input: torch.Tensor, other: torch.Tensor, *, variant: str = "auto", backend: str = "triton") -> torch.Tensor:
    """``torch.matmul(input, other)`` for operands of rank >= 2: (..., M, K) @ (..., K, N).

    Batch dims broadcast as in torch. A 2-D ``other`` folds ``input``'s batch dims into M (a view
    when they are contiguous, else a copy); otherwise batch dims beyond one are flattened (a copy
    only when the strides do not allow a view). Any row/column-major layout is read in place.
    ``variant`` names a rung of the ladder (module docstring); ``"auto"`` is the fastest.

    ``backend="cuda"``: the CUDA C++ ladder (warpforge.cuda; ``variant`` "naive", "tiled",
    "regblock", "mma", "mma_tma" or "auto" = "mma_tma" for 16-bit types, "regblock" for fp32),
    with a 2-D ``other``; operands that are not row-major are copied to row-major first.

    Inside ``torch.autocast`` both operands are cast to the region's dtype first, as torch.matmul's
    are (runtime/amp.py).
    """
    input, other = autocast_inputs(input, other)
    _check_operand("input", input)
    _check_operand("other", other)
    if check_backend(backend) == "cuda":
        return _matmul_cuda(input, other, variant)
    _check_variant(variant)
    if input.dim() < 2 or other.dim() < 2:
        raise ValueError(f"warpforge: matmul needs 'input' and 'other' of rank >= 2; got shapes "
                         f"{tuple(input.shape)} and {tuple(other.shape)} (use torch.mv / unsqueeze for vectors)")
    _check_pair("input", input, "other", other)
    if input.shape[-1] != other.shape[-2]:
        raise ValueError(f"warpforge: matmul inner dimensions do not match: 'input' {tuple(input.shape)} "
                         f"has K={input.shape[-1]} but 'other' {tuple(other.shape)} has K={other.shape[-2]}")
    m, k = input.shape[-2:]
    n = other.shape[-1]
    if other.dim() == 2:
        lead = input.shape[:-2]
        a = input.reshape(math.prod(input.shape[:-1]), k) if input.dim() > 2 else input
        out = matmul_op(a, other, variant)
        return out.reshape(*lead, m, n)
    try:
        batch = torch.broadcast_shapes(input.shape[:-2], other.shape[:-2])
    except RuntimeError as e:
        raise ValueError(f"warpforge: matmul batch dimensions do not broadcast: 'input' {tuple(input.shape)}, "
                         f"'other' {tuple(other.shape)}") from e
    a = input.expand(*batch, m, k).reshape(math.prod(batch), m, k)
    b = other.expand(*batch, k, n).reshape(math.prod(batch), k, n)
    return matmul_op(a, b, variant).reshape(*batch, m, n)


def _matmul_cuda(input: torch.Tensor, other: torch.Tensor, variant: str) -> torch.Tensor:
    from ..cuda import functional as cuda_fn

    if variant != "auto" and variant not in cuda_fn.MATMUL_VARIANTS:
        raise ValueError(f"warpforge: 'variant' is {variant!r}; the CUDA backend has "
                         f"{', '.join(map(repr, ('auto', *cuda_fn.MATMUL_VARIANTS)))}")
    if other.dim() != 2 or input.dim() < 2:
        raise ValueError(f"warpforge: matmul with backend='cuda' needs 'input' of rank >= 2 and a 2-D 'other'; "
                         f"got shapes {tuple(input.shape)} and {tuple(other.shape)}")
    _check_pair("input", input, "other", other)
    if input.shape[-1] != other.shape[0]:
        raise ValueError(f"warpforge: matmul inner dimensions do not match: 'input' {tuple(input.shape)} "
                         f"has K={input.shape[-1]} but 'other' {tuple(other.shape)} has K={other.shape[0]}")
    if variant in cuda_fn.TENSOR_CORE_VARIANTS and input.dtype == torch.float32:
        raise TypeError(f"warpforge: matmul variant {variant!r} (tensor cores, mma.sync) takes float16 or "
                        "bfloat16; 'input' is float32 (use 'regblock' or 'auto')")
    a = input.reshape(-1, input.shape[-1])
    return cuda_fn.matmul_2d(a, other, variant).reshape(*input.shape[:-1], other.shape[1])


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None, residual: torch.Tensor | None = None, *,
           variant: str = "auto") -> torch.Tensor:
    """``act(F.linear(input, weight, bias)) + residual`` in one kernel.

    ``input`` (..., K), ``weight`` (N, K), ``bias`` (N,), ``residual`` (..., N) like the output.
    ``activation``: None, "relu", "silu", "gelu" (erf) or "gelu_tanh". The leading dims of
    ``input`` fold into one (a view when contiguous, else a copy). With a non-linear activation
    and gradients enabled, the pre-activation is also written (one extra store) for the backward.
    Inside ``torch.autocast`` the floating-point tensors (input, weight, bias, residual) are cast
    to the region's dtype first, as F.linear's are (runtime/amp.py).
    """
    input, weight, bias, residual = autocast_inputs(input, weight, bias, residual)
    _check_operand("input", input)
    _check_operand("weight", weight)
    _check_variant(variant)
    if not (activation is None or isinstance(activation, str)) or activation not in ACTIVATIONS:
        raise ValueError(f"warpforge: 'activation' is {activation!r}; expected one of "
                         f"{', '.join(repr(a) for a in ACTIVATIONS)}")
    if input.dim() < 1:
        raise ValueError("warpforge: linear needs 'input' of rank >= 1")
    if weight.dim() != 2:
        raise ValueError(f"warpforge: 'weight' must be 2-D (out_features, in_features); got shape {tuple(weight.shape)}")
    _check_pair("input", input, "weight", weight)
    k = input.shape[-1]
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"warpforge: linear inner dimensions do not match: 'input' {tuple(input.shape)} has "
                         f"in_features={k} but 'weight' {tuple(weight.shape)} has {weight.shape[1]}")
    lead = input.shape[:-1]
    x = input.reshape(math.prod(lead), k)
    if bias is not None:
        _check_operand("bias", bias)
        _check_pair("bias", bias, "input", input)
        if bias.shape != (n,):
            raise ValueError(f"warpforge: 'bias' has shape {tuple(bias.shape)}; expected ({n},) = out_features of 'weight'")
        bias = bias.contiguous()    # the epilogue reads it with unit stride (a copy only for a strided view)
    res = None
    if residual is not None:
        _check_operand("residual", residual)
        _check_pair("residual", residual, "input", input)
        if residual.shape != (*lead, n):
            raise ValueError(f"warpforge: 'residual' has shape {tuple(residual.shape)}; expected "
                             f"{(*lead, n)}, the output's shape")
        res = residual.reshape(math.prod(lead), n)
    act = ACTIVATIONS[activation]
    save = act != 0 and torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (input, weight, bias))
    y, _ = linear_op(x, weight, bias, res, act, save, variant)
    return y.reshape(*lead, n)
