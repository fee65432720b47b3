import pytest
import torch

from warpforge.ops import matmul
from warpforge.ops.fp8 import (AMAX_FLOOR, FP8_MAX, dequantize_fp8, linear_fp8, quantize_fp8, quantize_fp8_op,
                               quantize_fp8_reference, scaled_matmul, scaled_matmul_reference, scaled_mm_op)
from conftest import DEVICE, DTYPES, ON_GPU, gpu_only, noncontig, randn, rel_err

E4M3 = torch.float8_e4m3fn
# (M, K): K = 1, 7 (sub-vector rows, packed many to a program), 4097 (one row a program, masked
# tail), 20000 (past the 16,384 register limit: the two-pass chunk loop)
QUANT_SHAPES = [(37, 1), (19, 7), (3, 4097), (2, 20000)]
if ON_GPU:
    QUANT_SHAPES += [(1031, 20000), (4099, 4096)]

# ||out - ref|| / ||ref|| of scaled_matmul against the dequantised float64 product. The fp8
# products are exact in fp32 and K is small, so the output cast dominates: half a bf16 ulp is
# 2^-9 per element (2^-8 where the interpreter truncates instead of rounding), fp16 2^-12, and
# fp32 only the accumulation order (~K * 2^-24).
MM_TOL = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5}


def _tol(dtype, k):
    """MM_TOL, except fp32 output on a GPU: Hopper's fp8 tensor cores add products into an
    accumulator of ~14 significant bits unless the kernel promotes it to fp32 (Triton's default on
    sm_90, as torch._scaled_mm(use_fast_accum=True)); measured on an H200, ||err|| / ||ref|| ~
    2e-5 * sqrt(K) (1.3e-3 at K = 4096, the same as cuBLASLt's fast mode). Bound: 3e-5 * sqrt(K)."""
    if dtype == torch.float32 and ON_GPU:
        return max(MM_TOL[dtype], 3e-5 * k ** 0.5)
    return MM_TOL[dtype]


def _torch_q(x, scale, per_row, dtype=E4M3):
    """torch's own eager quantisation for a given scale."""
    fmax = FP8_MAX[dtype]
    s = scale.unsqueeze(-1) if per_row and scale.dim() > 0 else scale
    return (x.float() / s).clamp(-fmax, fmax).to(dtype)


def _bits(q):
    return q.view(torch.uint8)


def _check_quantized(x, q, scale, per_row, dtype=E4M3):
    """Scale = amax / fmax exactly; q bit-identical to torch for that scale; round trip within
    half an fp8 ulp."""
    fmax = FP8_MAX[dtype]
    mant = {E4M3: 3, torch.float8_e5m2: 2}[dtype]
    min_normal = {E4M3: 2.0 ** -6, torch.float8_e5m2: 2.0 ** -14}[dtype]
    assert q.dtype == dtype and q.shape == x.shape and q.is_contiguous()
    assert scale.dtype == torch.float32
    xf = x.float()
    amax = xf.abs().amax(-1) if per_row else xf.abs().amax()
    assert scale.shape == amax.shape
    # a tensor divisor: an exact divide on CPU and CUDA alike (a Python 448 is a reciprocal
    # multiply on CUDA)
    assert torch.equal(scale, amax.clamp(min=AMAX_FLOOR) / torch.full_like(amax, fmax)), "scale != amax / fmax"
    assert torch.equal(_bits(q), _bits(_torch_q(x, scale, per_row, dtype))), "q differs from torch's rounding"
    s = scale.unsqueeze(-1) if per_row and scale.dim() > 0 else scale
    err = (dequantize_fp8(q, scale) - xf).abs()
    # half an ulp: 2^-(mant+1) relative in the normal range, half the subnormal step below it
    bound = torch.maximum(xf.abs() * 2.0 ** -(mant + 1), s * min_normal * 2.0 ** -(mant + 1)) * (1 + 1e-6)
    assert bool((err <= bound).all()), f"round trip error {(err / bound).max().item():.3f} x the half-ulp bound"


# ----------------------------------------------------------------------------------------------
# quantize_fp8
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_row", [True, False], ids=["row", "tensor"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", QUANT_SHAPES, ids=str)
def test_quantize(shape, dtype, per_row):
    x = randn(*shape, dtype=dtype, scale=3.0)
    x[0, 0] = 0.0                                   # exact zero and a wide dynamic range in one row
    if shape[1] > 2:
        x[-1, 1] = 1e-4
    q, scale = quantize_fp8(x, per_row=per_row)
    _check_quantized(x, q, scale, per_row)
    qr, sr = quantize_fp8_reference(x, per_row)
    assert torch.equal(scale, sr) and torch.equal(_bits(q), _bits(qr))


@pytest.mark.parametrize("per_row", [True, False], ids=["row", "tensor"])
def test_quantize_layouts(per_row):
    x = randn(2, 3, 45, dtype=torch.bfloat16)       # leading dims fold into M; scale keeps them
    q, s = quantize_fp8(x, per_row=per_row)
    assert s.shape == ((2, 3) if per_row else ())
    _check_quantized(x, q, s, per_row)
    v = noncontig(randn(6, 77))                     # strided rows: read in place
    q, s = quantize_fp8(v, per_row=per_row)
    _check_quantized(v, q, s, per_row)
    t = randn(33, 9).t()                            # strided last dim: copied first
    q, s = quantize_fp8(t, per_row=per_row)
    _check_quantized(t, q, s, per_row)
    x1 = randn(50)                                  # 1-D: one row, a 0-d scale either way
    q, s = quantize_fp8(x1, per_row=per_row)
    assert s.shape == ()
    _check_quantized(x1, q, s, per_row)


@pytest.mark.parametrize("per_row", [True, False], ids=["row", "tensor"])
def test_quantize_e5m2(per_row):
    x = randn(9, 130, scale=100.0)
    q, s = quantize_fp8(x, per_row=per_row, dtype=torch.float8_e5m2)
    _check_quantized(x, q, s, per_row, torch.float8_e5m2)


@pytest.mark.parametrize("dtype", [E4M3, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_rounding_ties_and_carries(dtype):
    """Every fp8 value, every midpoint between neighbours (ties go to even) and the fp32 numbers
    just either side of each midpoint, with scale exactly 1 (the row's amax is fmax). This is the
    test that catches a convert which drops the carry of a round-up into the exponent (the CPU
    interpreter's, worked around in the kernel)."""
    fmax = FP8_MAX[dtype]
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    vals = codes[codes.isfinite()].unique()
    mids = (vals[1:] + vals[:-1]) / 2
    up, down = torch.full_like(mids, 1e9), torch.full_like(mids, -1e9)
    x = torch.cat([torch.tensor([fmax, -0.0]), vals, mids, torch.nextafter(mids, up), torch.nextafter(mids, down)])
    x = x.to(DEVICE)
    q, s = quantize_fp8(x, per_row=True, dtype=dtype)
    assert s.item() == 1.0
    assert torch.equal(_bits(q), _bits(x.clamp(-fmax, fmax).to(dtype)))
    x2 = x[: x.numel() // 3 * 3].reshape(3, -1)      # fmax in row 0 only: the global amax
    q, s = quantize_fp8(x2, per_row=False, dtype=dtype)
    assert s.item() == 1.0
    assert torch.equal(_bits(q), _bits(x2.clamp(-fmax, fmax).to(dtype)))


def test_quantize_special_rows():
    x = randn(5, 40)
    x[1] = 0.0                                       # all-zero row: floor scale, zeros, no NaN
    x[2, 7] = float("nan")
    x[3, 0] = -float("inf")
    x[4] = 1e-30                                     # below the floor: scale floor / 448
    q, s = quantize_fp8(x, per_row=True)
    qf = q.float()
    assert torch.isfinite(s[[0, 1, 4]]).all() and torch.isnan(s[[2, 3]]).all()
    assert s[1].item() == pytest.approx(AMAX_FLOOR / 448, rel=1e-6, abs=0)
    assert torch.equal(qf[1], torch.zeros_like(qf[1]))
    assert torch.equal(dequantize_fp8(q, s)[1], torch.zeros_like(x[1]))
    assert torch.isnan(qf[2]).all() and torch.isnan(qf[3]).all()       # the bad rows, wholly NaN
    assert torch.isfinite(qf[[0, 1, 4]]).all()                          # the others untouched
    _check_quantized(x[[0, 1, 4]], q[[0, 1, 4]], s[[0, 1, 4]], True)
    qr, sr = quantize_fp8_reference(x, True)
    torch.testing.assert_close(s, sr, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(_bits(q), _bits(qr))
    q, s = quantize_fp8(x, per_row=False)           # per tensor: one bad element poisons all
    assert torch.isnan(s) and torch.isnan(q.float()).all()
    q, s = quantize_fp8(torch.zeros(3, 8, device=DEVICE), per_row=False)
    assert s.item() == pytest.approx(AMAX_FLOOR / 448, rel=1e-6, abs=0) and not q.float().any()


def test_quantize_empty():
    q, s = quantize_fp8(torch.empty(0, 16, device=DEVICE))
    assert q.shape == (0, 16) and s.shape == (0,)
    q, s = quantize_fp8(torch.empty(0, 16, device=DEVICE), per_row=False)
    # the max of nothing is 0: the floor's scale (approx's default abs=1e-12 would pass 1e-12 itself)
    assert s.shape == () and s.item() == pytest.approx(AMAX_FLOOR / 448, rel=1e-6, abs=0)


# ----------------------------------------------------------------------------------------------
# scaled_matmul
# ----------------------------------------------------------------------------------------------
def _operands(m, n, k, a_rows=True, b_cols=True, a_2d=False, b_2d=False):
    """a (M, K) row-major and b = w.t() (K, N) column-major, with per-row/column or per-tensor
    scales in the shapes torch._scaled_mm accepts ((M, 1) / (1, N) when a_2d / b_2d)."""
    a, sa = quantize_fp8(randn(m, k, scale=2.0), per_row=a_rows)
    w, sb = quantize_fp8(randn(n, k, scale=0.5), per_row=b_cols)
    if a_2d:
        sa = sa.reshape(-1, 1) if a_rows else sa.reshape(1, 1)
    if b_2d:
        sb = sb.reshape(1, -1) if b_cols else sb.reshape(1)
    return a, w.t(), sa, sb


SCALES = {"tensor-tensor": (False, False, False, False), "row-tensor": (True, False, False, False),
          "tensor-col": (False, True, False, False), "row-col": (True, True, False, False),
          "row-col-2d": (True, True, True, True), "tensor-tensor-1el": (False, False, True, True)}
MM_SHAPES = [(1, 17, 32), (17, 33, 64), (7, 5, 33)]
# Larger odd shapes (several tiles, masked edges, K = 1) with two scale layouts only: the
# interpreter takes ~0.5 s a GEMM there.
MM_SHAPES_BIG = [(255, 129, 96), (300, 40, 1)]
if ON_GPU:
    MM_SHAPES += MM_SHAPES_BIG + [(1000, 1000, 1000), (4097, 511, 257)]


@pytest.mark.parametrize("scales", list(SCALES))
@pytest.mark.parametrize("shape", MM_SHAPES, ids=str)
def test_scaled_matmul(shape, scales):
    _check_scaled_matmul(shape, scales, (torch.bfloat16, torch.float32))


@pytest.mark.skipif(ON_GPU, reason="covered by test_scaled_matmul's full sweep on a GPU")
@pytest.mark.parametrize("scales", ["tensor-tensor", "row-col-2d"])
@pytest.mark.parametrize("shape", MM_SHAPES_BIG, ids=str)
def test_scaled_matmul_big(shape, scales):
    _check_scaled_matmul(shape, scales, (torch.bfloat16,))


def _check_scaled_matmul(shape, scales, out_dtypes):
    m, n, k = shape
    a, b, sa, sb = _operands(m, n, k, *SCALES[scales])
    for out_dtype in out_dtypes:
        out = scaled_matmul(a, b, sa, sb, out_dtype=out_dtype)
        assert out.dtype == out_dtype and out.shape == (m, n)
        ref = scaled_matmul_reference(a, b, sa, sb, out_dtype=torch.float64)
        assert rel_err(out, ref) <= _tol(out_dtype, k), out_dtype


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("variant", matmul.VARIANTS)
def test_scaled_matmul_variants_bias(variant, out_dtype):
    m, n, k = (19, 47, 64) if variant != "persistent" else (300, 47, 64)
    a, b, sa, sb = _operands(m, n, k)
    bias = randn(n, dtype=torch.bfloat16)
    out = scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, bias=bias, variant=variant)
    ref = scaled_matmul_reference(a, b, sa, sb, bias=bias, out_dtype=torch.float64)
    assert out.dtype == out_dtype
    assert rel_err(out, ref) <= _tol(out_dtype, k), f"{variant} {out_dtype}"


def test_strided_bias():
    """A bias that is a strided view (a column of an (N, 2) table) or expanded: the GEMM epilogue
    reads it densely, so it is copied; the same as the contiguous bias, for scaled_matmul and
    linear_fp8."""
    m, n, k = 19, 47, 64
    a, b, sa, sb = _operands(m, n, k)
    table = randn(n, 2)
    for bias in (table[:, 0], table[:1, 0].expand(n)):
        assert not bias.is_contiguous()
        want = scaled_matmul(a, b, sa, sb, out_dtype=torch.float32, bias=bias.contiguous())
        assert torch.equal(scaled_matmul(a, b, sa, sb, out_dtype=torch.float32, bias=bias), want)
        x, w = randn(m, k), randn(n, k)
        wq, sw = quantize_fp8(w)
        want = linear_fp8(x, wq, sw, bias.contiguous(), out_dtype=torch.float32)
        assert torch.equal(linear_fp8(x, wq, sw, bias, out_dtype=torch.float32), want)


def test_dot_converts_every_e4m3_code():
    """Every finite e4m3 code (subnormals, +-0, 448) through tl.dot: the interpreter widens fp8
    operands via fp16 (exact); checked against float64 with the fp32 output. (On a GPU the fast
    fp8 accumulator loses ~1e-3 on this mix of 2^-9 .. 2^17 products: see _tol.)"""
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[codes.view(E4M3).float().isfinite()]                  # 254 codes
    a = codes.view(E4M3)[:252].reshape(4, 63).repeat(5, 1).to(DEVICE)   # (20, 63)
    w = codes.flip(0)[:252].view(E4M3).reshape(4, 63).to(DEVICE)       # (4, 63)
    one = torch.ones((), device=DEVICE)
    out = scaled_matmul(a, w.t(), one, one, out_dtype=torch.float32)
    ref = a.double() @ w.t().double()
    assert rel_err(out, ref) <= (2e-3 if ON_GPU else 1e-6)
    # one product at a time: subnormal x normal, max x max, signed zeros, exactly
    for i in range(0, 252, 63):
        ai = codes[i:i + 63].view(E4M3).reshape(63, 1).to(DEVICE)
        bi = codes.flip(0)[i:i + 63].view(E4M3).reshape(1, 63).to(DEVICE)
        out = scaled_matmul(ai, bi, one, one, out_dtype=torch.float32)
        assert torch.equal(out.double(), ai.double() @ bi.double())


def test_layout_copies_and_views():
    m, n, k = 23, 19, 48
    a, b, sa, sb = _operands(m, n, k)
    ref = scaled_matmul(a, b, sa, sb, out_dtype=torch.float32)
    b_row_major = b.contiguous()                     # (K, N) N-contiguous: copied to column-major
    a_col_major = a.t().contiguous().t()             # (M, K) M-contiguous: copied to row-major
    assert torch.equal(scaled_matmul(a_col_major, b_row_major, sa, sb, out_dtype=torch.float32), ref)
    big = torch.randn(m, 3, device=DEVICE)
    big[:, 1] = sa
    sa_view = big[:, 1:2]                            # (M, 1) strided view of the scales
    assert torch.equal(scaled_matmul(a, b, sa_view, sb, out_dtype=torch.float32), ref)


def test_empty_and_k_zero():
    one = torch.ones((), device=DEVICE)
    a = torch.zeros(0, 32, device=DEVICE).to(E4M3)
    b = torch.zeros(5, 32, device=DEVICE).to(E4M3).t()
    assert scaled_matmul(a, b, one, one).shape == (0, 5)
    a = torch.zeros(3, 0, device=DEVICE).to(E4M3)
    b = torch.zeros(0, 5, device=DEVICE).to(E4M3)
    bias = randn(5)
    out = scaled_matmul(a, b, one, one, bias=bias, out_dtype=torch.float32)
    assert torch.equal(out, bias.expand(3, 5))


def test_nan_propagates_through_matmul():
    x = randn(4, 64)
    x[2, 5] = float("nan")
    w, sw = quantize_fp8(randn(9, 64))
    y = linear_fp8(x, w, sw)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()


# ----------------------------------------------------------------------------------------------
# linear_fp8
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_fp8(dtype):
    x = randn(2, 5, 96, dtype=dtype)
    w = randn(33, 96, scale=0.1)
    bias = randn(33, dtype=dtype)
    wq, ws = quantize_fp8(w)
    y = linear_fp8(x, wq, ws, bias)
    assert y.shape == (2, 5, 33) and y.dtype == dtype
    xq, xs = quantize_fp8_reference(x.reshape(-1, 96))
    ref = scaled_matmul_reference(xq, wq.t(), xs, ws, bias, out_dtype=torch.float64).reshape(2, 5, 33)
    assert rel_err(y, ref) <= _tol(dtype, 96)
    # against the unquantised layer: each operand carries <= 2^-4 relative rounding, averaging
    # down over K = 96 terms to a few percent
    full = x.double() @ w.double().t() + bias.double()
    assert rel_err(y, full) <= 0.06
    y32 = linear_fp8(x, wq, ws.reshape(-1, 1), out_dtype=torch.float32)     # (N, 1) weight scale
    assert y32.dtype == torch.float32


def test_compile_fullgraph():
    x = randn(7, 64, dtype=torch.bfloat16)
    wq, ws = quantize_fp8(randn(24, 64))
    bias = randn(24, dtype=torch.bfloat16)

    def f(x, wq, ws, bias):
        xq, xs = quantize_fp8(x)
        y = scaled_matmul(xq, wq.t(), xs, ws, bias=bias)
        q2, s2 = quantize_fp8(y, per_row=False)
        return y, q2, s2, linear_fp8(x[None], wq, ws, bias)

    y, q2, s2, yl = torch.compile(f, fullgraph=True)(x, wq, ws, bias)
    ye, q2e, s2e, yle = f(x, wq, ws, bias)
    assert torch.equal(y, ye) and torch.equal(_bits(q2), _bits(q2e)) and torch.equal(s2, s2e)
    assert yl.shape == (1, 7, 24) and torch.equal(yl, yle) and torch.equal(yl[0], ye)


# opcheck's test_schema compares every input before and after the call with torch.allclose,
# which has no float8 kernel ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'), so
# the fp8-input operator runs the other checks, and its inputs are compared bitwise here instead.
MM_OPCHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _opcheck_scaled_mm(args):
    before = [t.clone() if isinstance(t, torch.Tensor) else t for t in args]
    torch.library.opcheck(scaled_mm_op.overload, args, test_utils=MM_OPCHECKS)
    scaled_mm_op.overload(*args)
    for x, y in zip(args, before):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                               y.view(torch.uint8) if y.element_size() == 1 else y), "an input was mutated"


def test_opcheck():
    x = randn(5, 40, dtype=torch.bfloat16)
    torch.library.opcheck(quantize_fp8_op.overload, (x, True, E4M3))
    torch.library.opcheck(quantize_fp8_op.overload, (x, False, E4M3))
    a, b, sa, sb = _operands(17, 24, 64)
    _opcheck_scaled_mm((a, b, sa, sb, None, torch.bfloat16, "auto"))
    a, b, sa, sb = _operands(17, 24, 64, False, False)
    _opcheck_scaled_mm((a, b, sa, sb, randn(24), torch.float32, "grouped"))


def test_bad_input():
    a, b, sa, sb = _operands(6, 10, 32)
    one = torch.ones((), device=DEVICE)
    with pytest.raises(TypeError, match="'a' has dtype bfloat16; expected float8_e4m3fn"):
        scaled_matmul(a.to(torch.bfloat16), b, sa, sb)
    with pytest.raises(TypeError, match="'b' has dtype float8_e5m2; expected float8_e4m3fn"):
        scaled_matmul(a, b.to(torch.float8_e5m2), sa, sb)
    with pytest.raises(ValueError, match=r"'a' must be 2-D; got shape \(1, 6, 32\)"):
        scaled_matmul(a[None], b, sa, sb)
    with pytest.raises(ValueError, match=r"inner dimensions do not match: 'a' \(6, 32\) has K=32 but 'b' \(31, 10\)"):
        scaled_matmul(a, b[:31], sa, sb)
    with pytest.raises(ValueError, match=r"'scale_a' has shape \(5,\); expected a per-tensor scale .* per-row scale of shape \(6,\) or \(6, 1\)"):
        scaled_matmul(a, b, sa[:5], sb)
    with pytest.raises(ValueError, match=r"'scale_b' has shape \(10, 1\); expected .* per-column scale of shape \(10,\) or \(1, 10\)"):
        scaled_matmul(a, b, sa, sb.reshape(10, 1))
    with pytest.raises(TypeError, match="'scale_b' has dtype bfloat16; expected float32"):
        scaled_matmul(a, b, sa, sb.bfloat16())
    with pytest.raises(TypeError, match="'scale_a' must be a torch.Tensor, got float"):
        scaled_matmul(a, b, 1.0, sb)
    with pytest.raises(ValueError, match=r"'scale_a' has shape \(1, 1, 1\); expected a per-tensor scale"):
        scaled_matmul(a, b, one.reshape(1, 1, 1), sb)      # one element, but of no shape torch._scaled_mm takes
    with pytest.raises(ValueError, match="'out_dtype' is torch.float8_e4m3fn; expected one of bfloat16, float16, float32"):
        scaled_matmul(a, b, sa, sb, out_dtype=E4M3)
    with pytest.raises(ValueError, match=r"'bias' has shape \(6,\); expected \(10,\)"):
        scaled_matmul(a, b, sa, sb, bias=randn(6))
    with pytest.raises(TypeError, match="'bias' has dtype int64"):
        scaled_matmul(a, b, sa, sb, bias=torch.ones(10, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="'variant' is 'fast'"):
        scaled_matmul(a, b, one, one, variant="fast")
    x = randn(4, 32)
    with pytest.raises(TypeError, match="'x' has dtype int64"):
        quantize_fp8(torch.ones(3, 4, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="zero-size last dimension"):
        quantize_fp8(torch.ones(3, 0, device=DEVICE))
    with pytest.raises(ValueError, match="'dtype' is torch.float16; expected one of float8_e4m3fn, float8_e5m2"):
        quantize_fp8(x, dtype=torch.float16)
    with pytest.raises(TypeError, match="'per_row' must be a bool"):
        quantize_fp8(x, per_row=1)
    wq, ws = quantize_fp8(randn(10, 32))
    with pytest.raises(ValueError, match=r"'x' \(4, 31\) has in_features=31 but 'weight_q' \(10, 32\) has 32"):
        linear_fp8(x[:, :31], wq, ws)
    with pytest.raises(ValueError, match=r"'weight_scale' has shape \(1, 10\); expected .* \(10,\) or \(10, 1\)"):
        linear_fp8(x, wq, ws.reshape(1, 10))
    with pytest.raises(TypeError, match="'weight_q' has dtype float32"):
        linear_fp8(x, wq.float(), ws)


def test_device_mismatch():
    """Operands on two devices (a meta tensor passes the per-operand device check, so this runs
    everywhere): each of b, the scales and the bias is checked against a's device."""
    a, b, sa, sb = _operands(6, 10, 32)

    def on_meta(t):
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    with pytest.raises(RuntimeError, match=f"'b' is on meta but 'a' is on {a.device}; expected the same device"):
        scaled_matmul(a, on_meta(b), sa, sb)
    with pytest.raises(RuntimeError, match=f"'scale_a' is on meta but 'a' is on {a.device}"):
        scaled_matmul(a, b, on_meta(sa), sb)
    with pytest.raises(RuntimeError, match=f"'scale_b' is on meta but 'a' is on {a.device}"):
        scaled_matmul(a, b, sa, on_meta(sb))
    with pytest.raises(RuntimeError, match=f"'bias' is on meta but 'a' is on {a.device}"):
        scaled_matmul(a, b, sa, sb, bias=torch.empty(10, device="meta"))
    wq, ws = quantize_fp8(randn(10, 32))
    with pytest.raises(RuntimeError, match=f"'weight_scale' is on meta but 'x' is on {a.device}"):
        linear_fp8(randn(4, 32), wq, on_meta(ws))


# ----------------------------------------------------------------------------------------------
# GPU only: against cuBLASLt (torch._scaled_mm), larger shapes
# ----------------------------------------------------------------------------------------------
def _torch_scaled_mm_or_skip(*args, **kw):
    try:
        return torch._scaled_mm(*args, **kw)
    except RuntimeError as e:            # pre-sm_89 GPUs, or rowwise scales on an older torch
        pytest.skip(f"torch._scaled_mm unavailable here: {e}")


@gpu_only
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensor", "rowwise"])
@pytest.mark.parametrize("shape", [(16, 4096, 4096), (200, 1040, 1008), (1024, 2048, 4096), (4096, 4096, 2048)], ids=str)
def test_against_torch_scaled_mm(shape, rowwise):
    m, n, k = shape
    a, b, sa, sb = _operands(m, n, k, rowwise, rowwise, True, True)
    out = scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    ref = _torch_scaled_mm_or_skip(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    exact = scaled_matmul_reference(a, b, sa, sb, out_dtype=torch.float32)
    # both round to bf16 (2^-9) after fp32 (or fast fp8) accumulation
    assert rel_err(out, exact) <= 8e-3 and rel_err(ref, exact) <= 8e-3
    assert rel_err(out, ref) <= 1e-2
    out32 = scaled_matmul(a, b, sa, sb, out_dtype=torch.float32)
    assert rel_err(out32, exact) <= _tol(torch.float32, k), "fp32 output: accumulation error"


@gpu_only
def test_gpu_large_rows_and_opcheck():
    x = randn(64, 20000, dtype=torch.bfloat16, scale=5.0)
    for per_row in (True, False):
        q, s = quantize_fp8(x, per_row=per_row)
        _check_quantized(x, q, s, per_row)
    a, b, sa, sb = _operands(300, 256, 512)
    _opcheck_scaled_mm((a, b, sa, sb, None, torch.bfloat16, "auto"))
    torch.library.opcheck(quantize_fp8_op.overload, (x, True, E4M3))

