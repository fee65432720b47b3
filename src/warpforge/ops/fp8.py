"""FP8 (e4m3) inference GEMM with per-tensor and per-row scales, and the quantise kernel that makes
the operands.

    quantize_fp8(x)          s_i = amax_j |x[i, j]| / 448          q[i, j] = rne(clamp(x[i, j] / s_i, +-448))
    quantize_fp8(x, per_row=False)    the same with one s = amax |x| / 448 for the whole tensor
    scaled_matmul(a, b, sa, sb)       C[m, n] = sa[m] * sb[n] * sum_k a[m, k] b[k, n]  (+ bias[n])
    linear_fp8(x, Wq, sw)             quantise x per row, then scaled_matmul(xq, Wq^T, sx, sw)

448 is the largest finite e4m3 value (``torch.float8_e4m3fn``: 4 exponent bits, 3 mantissa bits, no
infinities), so the scale maps each row's (or the tensor's) largest magnitude onto the top of the
format and every element keeps 3 mantissa bits: a rounding error of at most half an ulp, 2^-4
relative in the e4m3 normal range (|x| >= 2^-6 s) and 2^-10 s absolute below it. ``float8_e5m2`` (max 57,344,
2 mantissa bits) is also accepted by ``quantize_fp8``; the GEMM takes e4m3 only, as fp8 inference
GEMMs do (e5m2 is the gradient format).

Quantise -- byte model (s = bytes per input element, M rows of K): read x once, write q once:
(s + 1) bytes per element, plus 4 bytes of scale per row: 3 B/elem for bf16, 5 for fp32. A max, a
divide, a clamp and a convert per element: far below any compute roof, so the bound is the copy
bandwidth (~3.0 TB/s measured on the lent H100, ~4.3 TB/s on an H200). Why it is shaped so:

- per row, K <= 16,384 (``row_config`` "block"): a program holds ROWS whole rows in registers
  (ROWS x K ~ 4,096 elements, so short rows are packed and every program still moves ~8 KB), takes
  each row's amax, and quantises from the same registers: one pass, the byte floor. Eager PyTorch
  (abs, amax, div, clamp, to) reads x three times and writes four fp32 temporaries: ~8x the bytes.
  Measured on an H200 (bf16, 8192 x 8192 and 32768 x 4096): 64 / 123 us, 3.1-3.3 TB/s at
  3 B/elem, 77-81% of the 4.05 TB/s copy; eager 12x slower.
- per row, K > 16,384: a row no longer fits in registers (a 1 MiB fp32 row against a 256 KB
  register file), so one program per row walks it in 4,096-element chunks twice -- amax, then
  quantise. (2s + 1) B/elem; the second read of a 40 KB (bf16, K = 20,000) row mostly hits L2
  (H200, 4096 x 20000: 2.8 TB/s counted at 3 B/elem). With few rows the grid is small (64 rows:
  64 programs for 132 SMs, 0.3 TB/s); splitting a row over programs is the next step if decode
  ever quantises such rows.
- per tensor: the scale depends on every element, so no element can be quantised before all of x
  has been read. Two launches: ``_fp8_amax_partial_kernel`` (P <= 2 x SMs programs, each owning a
  run of rows and a stride of column blocks) writes P partial maxima; ``_fp8_quantize_tensor_kernel``
  (one program per 2-D tile) reduces the P partials itself (P x 4 B <= 1 KB from L2, against 8 KB
  of bf16 read per tile) -- so there is no third "final max" launch -- and quantises its tile.
  (2s + 1) B/elem from the memory system; when x fits in L2 (50 MB) the second read is an L2 hit
  and DRAM sees (s + 1). A fused single launch would need a grid-wide barrier (a spin-wait on a
  counter), which the CPU interpreter cannot run, for at most one read of x saved. (H200, bf16
  8192 x 8192: 108 us, 1.9 TB/s counted at 3 B/elem, 3.1 TB/s at the 5 B/elem it moves.)

Rounding: the quotient x / s is computed in fp32 (a true IEEE divide, ``div_rn``, as torch does for
a tensor divisor; Triton's ``/`` is the approximate ``div.full.f32``, up to 2 ulp, which put
some q of a 4096 x 4096 input on the wrong side of an fp8 rounding boundary on an H200) and rounded
once, to nearest-even, by the hardware convert (``cvt.rn.satfinite.e4m3x2.f32`` on sm_89+), so q is
bit-identical to torch's ``(x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn)`` for the same s.

Scales: s = max(amax, 1e-12) / 448, one IEEE fp32 divide (``div_rn``; torch's ``amax / 448`` is
the same on a CPU, but on CUDA it multiplies by the rounded reciprocal of 448, which is 1 ulp off
now and then). The floor keeps an all-zero row from dividing 0 by 0 (its q is all zeros and its
s ~2.2e-15, so dequantising gives exact zeros) and keeps s a normal fp32 number for tiny rows.

Non-finite input propagates, never silently: a row (per_row) or tensor (per-tensor) holding any
NaN or +-inf gets scale NaN, and every q of it is NaN (e4m3 has no infinity). A scaled_matmul that
consumes it then yields NaN in those rows -- visible, never plausible garbage. (The alternative, a
ValueError, needs a device-to-host sync per call -- ruinous for decode -- and cannot be traced by
torch.compile; callers that want one can check ``scale.isfinite().all()``.) The hardware max
drops NaN (``max.f32`` returns the other operand), so the kernels map NaN to +inf before the max.

scaled_matmul -- FLOP model 2*M*N*K; byte model: read A and B once (1 byte each), the scales
(4*M + 4*N), write C once: M*K + K*N + M*N*s_out. At 8192^3 (bf16 out) that is 1.1 TFLOP over
268 MB: ~4,100 FLOP/B, far past the ~590 FLOP/B where an H100 turns compute-bound (1,979 TFLOP/s
dense fp8 / 3.35 TB/s), so the roof is the fp8 tensor cores -- twice the bf16 rate -- and the bar
is cuBLASLt behind ``torch._scaled_mm``. It runs on the GEMM ladder of ``ops/matmul.py``
(``matmul._mm``): the scales cost nothing in the K loop, because (a * sa) @ (b * sb) =
sa[m] * sb[n] * (a @ b) -- the kernel multiplies the fp32 accumulator tile once in the epilogue,
by sa (a scalar or a BLOCK_M column) and sb (a scalar or a BLOCK_N row), before bias and the
single cast-and-store. Decode (M <= 256) takes the split-K rung, which streams the 1-byte weight:
half the bytes of bf16, so twice the tokens per second at the copy roof. Measured on an H200 with
the untuned default configs: 8192^3 with per-row scales 1,295 TFLOP/s (torch._scaled_mm rowwise
1,220; per-tensor 1,245, or 1,290 with use_fast_accum); 4096^3 1,338 (torch rowwise 1,221);
16 x 8192 x 8192 ~37 us (1.8 TB/s of weight) against cuBLASLt's 27 us. Per-row and per-tensor
scales cost the same (within noise).

Accumulation: on sm_90 Triton issues fp8 ``wgmma`` in Hopper's fast-accumulation mode (its default
``max_num_imprecise_acc``): the tensor core adds products into an accumulator of ~14 significant
bits within the K loop -- the equivalent of ``torch._scaled_mm(use_fast_accum=True)``. Measured
||err|| / ||ref|| of an fp32 output ~2e-5 * sqrt(K): 1.3e-3 at K = 4,096, the same as cuBLASLt's
fast mode, where its default precise mode gives 1.3e-4. That is below the bf16 output's own
rounding (2^-9 per element) for the K of LLM layers. Promoting to fp32 once per K block
(``max_num_imprecise_acc=BLOCK_K``, a change in ``matmul._dot``) matches the precise mode at about
2/3 of the speed (929 against 1,394 TFLOP/s at 4096^3).

Layout: fp8 tensor cores (Hopper ``wgmma``) read both operands K-major from shared memory, so A is
(M, K) row-major and B is (K, N) column-major -- ``b = w.t()`` for an (N, K) row-major weight,
exactly ``torch._scaled_mm``'s contract. Other layouts are copied to that one (documented in
:func:`scaled_matmul`), never silently run slowly.

The CPU interpreter (``TRITON_INTERPRET=1``) has two fp8 quirks, both handled only there (the GPU
kernels are unchanged): its fp32 -> fp8 convert drops the carry when a round-up overflows the
mantissa (1.9925 -> 1.0 instead of 2.0; -127.99 -> -64) and turns NaN into 384; so under the
interpreter the quotient is first rounded onto the fp8 grid in fp32 arithmetic (after which the
convert is exact) and NaN is written as its bit pattern. Its ``tl.dot`` widens fp8 operands
correctly (through fp16, exact), unlike bfloat16 (``matmul.UPCAST``), so the GEMM needs nothing.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..runtime import interpreting, new_empty
from ..runtime.checks import FLOAT_DTYPES, check_device, check_tensor
from ..runtime.device import sm_count
from ..runtime.heuristics import row_config, tile_config
from ..runtime.registry import Op
from . import matmul as _matmul
from ._rows import as_rows

# Largest finite value, mantissa bits and smallest normal exponent of each fp8 format.
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_FP8_GRID = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}
AMAX_FLOOR = 1e-12          # s = max(amax, AMAX_FLOOR) / FP8_MAX: no 0/0 for an all-zero row
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
PARTIALS_PER_SM = 2         # per-tensor amax: at most this many partial-max programs per SM


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------
def quantize_fp8_reference(x: torch.Tensor, per_row: bool = True,
                           dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Ground truth of :func:`quantize_fp8`, in float32 on purpose: the scale *is* an fp32 number
    and q is defined as the fp32 quotient rounded once to fp8 (as torch and torchao compute it); a
    float64 quotient would round differently at the rare fp32-representable ties."""
    fmax = FP8_MAX[dtype]
    xf = x.float()
    mag = torch.where(torch.isnan(xf), torch.inf, xf.abs())                 # NaN counts as +inf
    if per_row:
        amax = mag.amax(-1)
    else:
        amax = mag.amax() if mag.numel() else mag.new_zeros(())
    # a tensor divisor: torch divides exactly (IEEE) on every device, where ``amax / 448`` with a
    # Python number multiplies by the rounded reciprocal on CUDA (1 ulp off now and then)
    scale = torch.where(torch.isfinite(amax), amax.clamp(min=AMAX_FLOOR) / torch.full_like(amax, fmax),
                        torch.full_like(amax, float("nan")))
    q = (xf / (scale.unsqueeze(-1) if per_row else scale)).clamp(-fmax, fmax).to(dtype)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * scale in float32, with a per-row (..., ) or per-tensor () scale."""
    s = scale.float()
    return q.float() * (s if s.dim() == 0 else s.unsqueeze(-1))


def scaled_matmul_reference(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                            bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(a * scale_a) @ (b * scale_b) + bias, dequantised in float64 (float32 on GPUs), cast once."""
    w = torch.float64 if a.device.type == "cpu" else torch.float32
    y = (a.to(w) * scale_a.to(w).reshape(-1, 1)) @ (b.to(w) * scale_b.to(w).reshape(1, -1))
    if bias is not None:
        y = y + bias.to(w)
    return y.to(out_dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _fp8_magnitude(x):
    """|x| with NaN mapped to +inf, so a plain max sees it (the hardware max drops NaN)."""
    return tl.where(x == x, tl.abs(x), float("inf"))


@triton.jit
def _fp8_scale(amax, FP8_MAX: tl.constexpr, AMAX_FLOOR: tl.constexpr):
    """max(amax, floor) / FP8_MAX; NaN where amax is +inf (the block held an inf or a NaN)."""
    return tl.where(amax < float("inf"), tl.math.div_rn(tl.maximum(amax, AMAX_FLOOR), FP8_MAX), float("nan"))


@triton.jit
def _fp8_round_to_grid(v, MANT: tl.constexpr, EMIN: tl.constexpr):
    """Interpreter only: v (fp32, |v| <= the fp8 max) rounded to nearest-even onto the fp8 grid in
    fp32 arithmetic. The ulp there is 2^(max(e, EMIN) - MANT); adding and subtracting
    1.5 * 2^23 ulp makes the fp32 adder round at exactly that bit. The sign is restored with a
    multiply (0 - x would turn -0 into +0)."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
    magic = (((e - MANT + 150) << 23) | 0x400000).to(tl.float32, bitcast=True)
    r = (tl.abs(v) + magic) - magic
    r = tl.where(bits < 0, r * -1.0, r)
    return tl.where(v == v, r, v)


@triton.jit
def _fp8_quantize(x, scale, q_ty: tl.constexpr, FP8_MAX: tl.constexpr,
                  FIX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr):
    """fp32 x / scale (an IEEE divide, see the module docstring), clamped to +-FP8_MAX (NaN kept),
    rounded to nearest-even into fp8."""
    v = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    if FIX:
        v = _fp8_round_to_grid(v, MANT, EMIN)
    q = v.to(q_ty)
    if FIX:   # the interpreter converts NaN to a finite value; 0x7F is NaN in e4m3fn and e5m2
        q = tl.where(v == v, q, tl.full(v.shape, 0x7F, tl.uint8).to(q_ty, bitcast=True))
    return q


@triton.jit
def _fp8_quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr,        # (M, K) input (row stride stride_x, unit column stride), (M, K) contiguous q, (M,) fp32 scales
    M, K, stride_x,
    FP8_MAX: tl.constexpr, AMAX_FLOOR: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
    FIX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
):
    """ROWS rows per program. ONE_PASS (K <= BLOCK_K): the rows stay in registers between the
    amax and the quantise. Otherwise one row per program, walked twice in BLOCK_K chunks."""
    q_ty: tl.constexpr = q_ptr.dtype.element_ty
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < M
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows64[:, None] * stride_x            # (ROWS, 1)
    q_rows = q_ptr + rows64[:, None] * K
    if ONE_PASS:
        mask = row_mask[:, None] & (cols[None, :] < K)
        x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        scale = _fp8_scale(tl.max(_fp8_magnitude(x), axis=1), FP8_MAX, AMAX_FLOOR)
        q = _fp8_quantize(x, scale[:, None], q_ty, FP8_MAX, FIX, MANT, EMIN)
        tl.store(q_rows + cols[None, :], q, mask=mask)
    else:
        amax = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)  # elementwise running max, reduced once
        for k0 in range(0, K, BLOCK_K):
            mask = row_mask[:, None] & (k0 + cols[None, :] < K)
            x = tl.load(x_rows + k0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, _fp8_magnitude(x))
        scale = _fp8_scale(tl.max(amax, axis=1), FP8_MAX, AMAX_FLOOR)
        for k0 in range(0, K, BLOCK_K):
            mask = row_mask[:, None] & (k0 + cols[None, :] < K)
            x = tl.load(x_rows + k0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            q = _fp8_quantize(x, scale[:, None], q_ty, FP8_MAX, FIX, MANT, EMIN)
            tl.store(q_rows + k0 + cols[None, :], q, mask=mask)
    tl.store(s_ptr + rows, scale, mask=row_mask)


@triton.jit
def _fp8_amax_partial_kernel(
    x_ptr, part_ptr,            # (M, K) input (row stride stride_x, unit column stride), (PM * PK,) fp32 partial maxima
    M, K, stride_x, rows_per_program,
    ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (i, j) takes the max magnitude (NaN -> inf) over rows [i * rows_per_program, ...)
    (a multiple of ROWS) and column blocks j, j + PK, j + 2 PK, ... and stores one partial."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_k = tl.num_programs(1)
    row_lo = pid_m * rows_per_program
    row_hi = tl.minimum(row_lo + rows_per_program, M)
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)
    for r0 in range(row_lo, row_hi, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
        for k0 in range(pid_k * BLOCK_K, K, n_k * BLOCK_K):
            mask = (rows[:, None] < row_hi) & (k0 + cols[None, :] < K)
            x = tl.load(x_rows + k0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            acc = tl.maximum(acc, _fp8_magnitude(x))
    tl.store(part_ptr + pid_m * n_k + pid_k, tl.max(tl.max(acc, axis=1), axis=0))


@triton.jit
def _fp8_quantize_tensor_kernel(
    x_ptr, q_ptr, s_ptr, part_ptr,   # (M, K) input, (M, K) contiguous q, () fp32 scale out, (P,) partial maxima
    M, K, stride_x, P,
    FP8_MAX: tl.constexpr, AMAX_FLOOR: tl.constexpr, P_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    FIX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_K) tile per program: reduce the P partials to the global scale (every
    program, from L2; program (0, 0) stores it), then quantise the tile."""
    p = tl.arange(0, P_BLOCK)
    amax = tl.max(tl.load(part_ptr + p, mask=p < P, other=0.0), axis=0)
    scale = _fp8_scale(amax, FP8_MAX, AMAX_FLOOR)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(s_ptr, scale)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    q = _fp8_quantize(x, scale, q_ptr.dtype.element_ty, FP8_MAX, FIX, MANT, EMIN)
    tl.store(q_ptr + rows64 * K + cols[None, :], q, mask=mask)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def fp8_quantize_consts(dtype: torch.dtype) -> dict:
    """The constexprs :func:`_fp8_quantize` takes for the fp8 ``dtype`` (its max and grid, and the
    interpreter's rounding fix): also the paged-KV append's (ops/decode_attention.py)."""
    mant, emin = _FP8_GRID[dtype]
    return dict(FP8_MAX=FP8_MAX[dtype], FIX=interpreting(), MANT=mant, EMIN=emin)


def _fp8_consts(dtype: torch.dtype) -> dict:
    return dict(fp8_quantize_consts(dtype), AMAX_FLOOR=AMAX_FLOOR)


def _quantize(x: torch.Tensor, per_row: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q shaped like x, fp32 scale shaped x.shape[:-1] (per_row) or ())."""
    k = x.shape[-1]
    lead = x.shape[:-1]
    x2 = as_rows(x)                                  # (M, K), unit column stride (a copy only if needed)
    m = x2.shape[0]
    q = new_empty((m, k), dtype=dtype, device=x.device)
    scale = new_empty((m,) if per_row else (), dtype=torch.float32, device=x.device)
    consts = _fp8_consts(dtype)
    if m == 0:
        if not per_row:      # the max of nothing is 0: the floor's scale
            scale.fill_(AMAX_FLOOR / FP8_MAX[dtype])
        return q.reshape(x.shape), scale.reshape(lead) if per_row else scale
    cfg = row_config(k, split_ok=False)              # "block" (rows in registers) or "loop" (chunks)
    if per_row:
        _fp8_quantize_rows_kernel[(triton.cdiv(m, cfg.rows),)](
            x2, q, scale, m, k, x2.stride(0),
            ROWS=cfg.rows, BLOCK_K=cfg.block_n, ONE_PASS=cfg.mode == "block", **consts,
            num_warps=cfg.num_warps)
        return q.reshape(x.shape), scale.reshape(lead)
    # per tensor: P = PM x PK partial maxima, then every quantise tile reduces them
    row_blocks = triton.cdiv(m, cfg.rows)
    col_blocks = triton.cdiv(k, cfg.block_n)
    target = PARTIALS_PER_SM * sm_count()
    pm = min(row_blocks, target)
    rows_per = triton.cdiv(row_blocks, pm) * cfg.rows
    pm = triton.cdiv(m, rows_per)
    pk = min(col_blocks, max(1, target // pm))
    partials = torch.empty(pm * pk, dtype=torch.float32, device=x.device)
    _fp8_amax_partial_kernel[(pm, pk)](x2, partials, m, k, x2.stride(0), rows_per,
                                       ROWS=cfg.rows, BLOCK_K=cfg.block_n, num_warps=cfg.num_warps)
    bm, bk, warps = tile_config(k)
    _fp8_quantize_tensor_kernel[(triton.cdiv(m, bm), triton.cdiv(k, bk))](
        x2, q, scale, partials, m, k, x2.stride(0), pm * pk,
        P_BLOCK=triton.next_power_of_2(pm * pk), BLOCK_M=bm, BLOCK_K=bk, **consts, num_warps=warps)
    return q.reshape(x.shape), scale


def _as_scale(s: torch.Tensor) -> torch.Tensor:
    """A validated scale as the GEMM epilogue reads it: a 0-d scalar, or a contiguous 1-d vector."""
    return s.reshape(()) if s.numel() == 1 else s.reshape(-1).contiguous()


# ----------------------------------------------------------------------------------------------
# PyTorch operators
# ----------------------------------------------------------------------------------------------
def _quantize_impl(x: torch.Tensor, per_row: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize(x, per_row, dtype)


def _quantize_fake(x, per_row, dtype):
    return (x.new_empty(x.shape, dtype=dtype),
            x.new_empty(x.shape[:-1] if per_row else (), dtype=torch.float32))


def _scaled_mm_impl(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                    bias: Optional[torch.Tensor], out_dtype: torch.dtype, variant: str) -> torch.Tensor:
    return _matmul._mm(a, b, variant=variant, out_dtype=out_dtype, bias=bias,
                       a_scale=_as_scale(scale_a), b_scale=_as_scale(scale_b))[0]


def _scaled_mm_fake(a, b, scale_a, scale_b, bias, out_dtype, variant):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


quantize_fp8_op = Op("quantize_fp8", _quantize_impl, _quantize_fake)
scaled_mm_op = Op("scaled_mm", _scaled_mm_impl, _scaled_mm_fake)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _dt(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def _check_fp8(name: str, t, ndim: int = 2) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"warpforge: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float8_e4m3fn:
        raise TypeError(f"warpforge: '{name}' has dtype {_dt(t.dtype)}; expected float8_e4m3fn "
                        f"(quantize it with warpforge.quantize_fp8)")
    if t.dim() != ndim:
        raise ValueError(f"warpforge: '{name}' must be {ndim}-D; got shape {tuple(t.shape)}")
    check_device(name, t)


def _check_scale(name: str, s, ref_name: str, ref: torch.Tensor, n: int, what: str, shapes: tuple) -> None:
    """A float32 scale on ref's device: one element (per-tensor) or n elements in one of ``shapes``."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"warpforge: '{name}' must be a torch.Tensor, got {type(s).__name__}")
    if s.dtype != torch.float32:
        raise TypeError(f"warpforge: '{name}' has dtype {_dt(s.dtype)}; expected float32")
    if s.device != ref.device:
        raise RuntimeError(f"warpforge: '{name}' is on {s.device} but '{ref_name}' is on {ref.device}; "
                           f"expected the same device")
    if s.numel() == 1 and s.dim() <= 2:
        return
    if tuple(s.shape) not in shapes:
        raise ValueError(f"warpforge: '{name}' has shape {tuple(s.shape)}; expected a per-tensor scale "
                         f"(shape () or (1,)) or a {what} scale of shape {' or '.join(map(str, shapes))}")


def _check_dtype_arg(name: str, d, allowed) -> None:
    if d not in allowed:
        raise ValueError(f"warpforge: '{name}' is {d}; expected one of {', '.join(_dt(a) for a in allowed)}")


def _scaled_mm_checked(a, b, scale_a, scale_b, bias, out_dtype, variant, names) -> torch.Tensor:
    na, nb, nsa, nsb = names
    _check_dtype_arg("out_dtype", out_dtype, OUT_DTYPES)
    _matmul._check_variant(variant)
    m, k = a.shape
    n = b.shape[1]
    if b.device != a.device:
        raise RuntimeError(f"warpforge: '{nb}' is on {b.device} but '{na}' is on {a.device}; expected the same device")
    _check_scale(nsa, scale_a, na, a, m, "per-row", ((m,), (m, 1)))
    _check_scale(nsb, scale_b, na, a, n, "per-column", ((n,), (1, n)) if nb == "b" else ((n,), (n, 1)))
    if bias is not None:
        check_tensor("bias", bias, dtypes=FLOAT_DTYPES)
        if bias.shape != (n,):
            raise ValueError(f"warpforge: 'bias' has shape {tuple(bias.shape)}; expected ({n},), the output's columns")
        if bias.device != a.device:
            raise RuntimeError(f"warpforge: 'bias' is on {bias.device} but '{na}' is on {a.device}; expected the same device")
    # Both operands K-contiguous, the layout fp8 tensor cores read (copies otherwise, documented).
    if a.stride(1) != 1 and k > 1:
        a = a.contiguous()
    if b.stride(0) != 1 and k > 1:
        b = b.t().contiguous().t()
    return scaled_mm_op(a, b, scale_a, scale_b, bias, out_dtype, variant)


def quantize_fp8(x: torch.Tensor, *, per_row: bool = True,
                 dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic fp8 quantisation: ``(q, scale)`` with ``x ~= q.float() * scale``.

    ``x`` (..., K) float32/float16/bfloat16; the amax is taken over the last dim. ``per_row``:
    ``scale`` has shape ``x.shape[:-1]`` (``(M,)`` for a 2-D x), one fp32 scale per row; otherwise
    ``scale`` is a 0-d fp32 tensor for the whole tensor. ``scale = max(amax, 1e-12) / fmax``
    (fmax = 448 for ``float8_e4m3fn``, 57,344 for ``float8_e5m2``) and
    ``q = (x / scale).clamp(-fmax, fmax).to(dtype)``, rounded to nearest-even -- bit-identical to
    torch's eager expression for the same scale. A row (or tensor) holding NaN or inf gets scale
    NaN and all-NaN q (see the module docstring). ``q`` is contiguous, shaped like ``x``; a
    strided last dim is copied first.
    """
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if not isinstance(per_row, bool):
        raise TypeError(f"warpforge: 'per_row' must be a bool, got {type(per_row).__name__}")
    _check_dtype_arg("dtype", dtype, tuple(FP8_MAX))
    return quantize_fp8_op(x, per_row, dtype)


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
                  out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
                  variant: str = "auto") -> torch.Tensor:
    """``torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype)``:
    ``(a * scale_a) @ (b * scale_b) + bias`` with fp32 accumulation, cast once to ``out_dtype``.

    ``a`` (M, K) and ``b`` (K, N), both ``float8_e4m3fn``; ``b`` is expected column-major
    (``b = w.t()`` for a row-major (N, K) weight ``w``) and ``a`` row-major: both K-contiguous.
    Other layouts are copied into that one first (an extra read and write of the operand).
    ``scale_a``: float32, per-tensor (one element, shape () or (1,)) or per-row ((M,) or (M, 1));
    ``scale_b``: per-tensor or per-column ((N,) or (1, N)). ``bias`` (N,) float32/16/bf16.
    ``out_dtype``: bfloat16 (default), float16 or float32. ``variant`` names a rung of the GEMM
    ladder (``warpforge.ops.matmul``); ``"auto"`` picks the fastest. Inference only: no autograd.
    """
    _check_fp8("a", a)
    _check_fp8("b", b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"warpforge: scaled_matmul inner dimensions do not match: 'a' {tuple(a.shape)} has "
                         f"K={a.shape[1]} but 'b' {tuple(b.shape)} has K={b.shape[0]}")
    return _scaled_mm_checked(a, b, scale_a, scale_b, bias, out_dtype, variant, ("a", "b", "scale_a", "scale_b"))


def linear_fp8(x: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
               variant: str = "auto") -> torch.Tensor:
    """``F.linear(x, weight_q * weight_scale, bias)`` with x quantised per row on the fly.

    ``x`` (..., K) float32/float16/bfloat16; ``weight_q`` (N, K) ``float8_e4m3fn`` and
    ``weight_scale`` per-tensor or per-output-row ((N,) or (N, 1)), e.g. from
    ``quantize_fp8(weight)``. Output (..., N) in ``out_dtype`` (default: x's dtype). Two launches:
    quantise x (3 B/elem for bf16), then the scaled GEMM.
    """
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    _check_fp8("weight_q", weight_q)
    k = x.shape[-1]
    n = weight_q.shape[0]
    if weight_q.shape[1] != k:
        raise ValueError(f"warpforge: linear_fp8 inner dimensions do not match: 'x' {tuple(x.shape)} has "
                         f"in_features={k} but 'weight_q' {tuple(weight_q.shape)} has {weight_q.shape[1]}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_dtype_arg("out_dtype", out_dtype, OUT_DTYPES)
    xq, xs = quantize_fp8_op(x.reshape(-1, k), True, torch.float8_e4m3fn)
    y = _scaled_mm_checked(xq, weight_q.t(), xs, weight_scale, bias, out_dtype, variant,
                           ("x", "weight_q", "x_scale", "weight_scale"))
    return y.reshape(*x.shape[:-1], n)
