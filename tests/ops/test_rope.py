import dataclasses

import pytest
import torch
import triton

import warpforge.ops.rope as rope_mod
from warpforge.nn.rope import RotaryEmbedding
from warpforge.ops.rope import apply_rope, rope_backward_op, rope_op, rope_reference
from warpforge.runtime.heuristics import rope_config
from conftest import DTYPES, ON_GPU, DEVICE, assert_close, gpu_only, randn


def hf_apply_rotary_pos_emb(q, k, cos, sin):
    """Hugging Face's formula, written out independently of rope_reference: cos/sin (B or 1, S, D)."""
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def complex_rope(x, angles):
    """GPT-J (interleaved) RoPE as a complex product: (x_2i + i x_2i+1) * exp(i theta_i).
    x (B, H, S, D) float64, angles (B or 1, S, D/2)."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles).unsqueeze(1)).flatten(-2)


def make_table(b, rows, d, dtype=torch.float32, half=False):
    """Random cos and sin tables: the kernel must use each element where HF's formula does, which a
    table with equal halves could not tell apart. ``b`` None gives a 2-d (rows, D) table."""
    dt = d // 2 if half else d
    shape = (rows, dt) if b is None else (b, rows, dt)
    return randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)


def check_fwd_bwd(q, k, cos, sin, pos, interleaved, dtype, what="", rope=apply_rope):
    """Forward and both gradients of ``rope`` (apply_rope's signature) against autograd through the
    float64 reference."""
    qo, ko = rope(q, k, cos, sin, pos, interleaved)
    assert qo.dtype == dtype and ko.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    qd = q.detach().double().requires_grad_()
    kd = k.detach().double().requires_grad_()
    qr, kr = rope_reference(qd, kd, cos, sin, pos, interleaved)
    assert_close(qo, qr, dtype, what=f"{what} q_out")
    assert_close(ko, kr, dtype, what=f"{what} k_out")
    gq, gk = randn(*qo.shape, dtype=dtype), randn(*ko.shape, dtype=dtype)
    torch.autograd.backward((qo, ko), (gq, gk))
    torch.autograd.backward((qr, kr), (gq.double(), gk.double()))
    assert_close(q.grad, qd.grad, dtype, scale=2.0, what=f"{what} dq")
    assert_close(k.grad, kd.grad, dtype, scale=2.0, what=f"{what} dk")
    return qo, ko


# (B, Hq, Hk, S, D, table batch (None: 2-d table), half table, positions)
CASES = [
    (1, 2, 2, 1, 2, None, False, None),          # MHA, one token, D=2
    (3, 4, 2, 7, 64, 1, False, None),            # GQA, (1, S, D) table
    (3, 4, 1, 7, 6, 3, False, "offset"),         # MQA, odd-sized D, (B, S, D) table, decode offset
    (1, 4, 2, 123, 128, None, True, "s"),        # half-size table, (S,) positions
    (3, 2, 1, 7, 128, 3, False, "bs"),           # (B, S) positions into a (B, T, D) table
    (3, 4, 4, 5, 64, None, True, "1s"),          # (1, S) positions, half table
]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_forward_backward(case, dtype, interleaved):
    b, hq, hk, s, d, tb, half, pk = case
    q = randn(b, hq, s, d, dtype=dtype, requires_grad=True)
    k = randn(b, hk, s, d, dtype=dtype, requires_grad=True)
    rows = s + 5 if pk == "offset" else (s if pk is None else 2 * s + 3)
    table_dtype = torch.float32 if dtype == torch.float32 or s % 2 else dtype     # fp32 and q-dtype tables
    cos, sin = make_table(tb, rows, d, table_dtype, half)
    if pk == "offset":
        pos = 5
    elif pk is None:
        pos = None
    else:
        shape = {"s": (s,), "bs": (b, s), "1s": (1, s)}[pk]
        pos = torch.randint(0, rows, shape, device=DEVICE, dtype=torch.int32 if pk == "s" else torch.int64)
    check_fwd_bwd(q, k, cos, sin, pos, interleaved, dtype)


# Shapes that walk the heads in different ways: split over a second grid axis (striding over
# several groups), and one program per token block looping over several q groups then k.
@pytest.mark.parametrize("shape,split", [((1, 32, 8, 100, 64), 2), ((2, 32, 8, 64, 64), 1), ((1, 8, 1, 3, 64), None)])
def test_head_walks(shape, split):
    b, hq, hk, s, d = shape
    cfg = rope_config(b, s, hq, hk, d)
    groups = triton.cdiv(hq, cfg.heads_q) + triton.cdiv(hk, cfg.heads_k)
    if not ON_GPU and split is not None:                     # the interpreter stands in 4 SMs: these configs are as named
        assert cfg.split == split and groups > 2 * split - 1 and cfg.heads_q < hq
    q = randn(b, hq, s, d, requires_grad=True)
    k = randn(b, hk, s, d, requires_grad=True)
    cos, sin = make_table(None, s, d)
    check_fwd_bwd(q, k, cos, sin, None, False, torch.float32)


# Both orders of a program's loads (table rows first, or q/k first: rope_config picks by sequence
# length), forced on the same shapes: decode with ids, several token blocks with ids, an offset.
@pytest.mark.parametrize("table_first", [False, True])
@pytest.mark.parametrize("shape,pk", [((5, 8, 2, 1, 64), "bs"), ((2, 4, 2, 37, 32), "s"), ((3, 4, 4, 9, 16), "offset")])
def test_table_orders(monkeypatch, table_first, shape, pk):
    b, hq, hk, s, d = shape
    real = rope_config
    monkeypatch.setattr(rope_mod, "rope_config", lambda *a: dataclasses.replace(real(*a), table_first=table_first))
    rows = 2 * s + 7
    cos, sin = make_table(None, rows, d)
    pos = 6 if pk == "offset" else torch.randint(0, rows, (b, s) if pk == "bs" else (s,), device=DEVICE)

    def operator(q, k, cos, sin, pos, interleaved):                     # the operator: no fast path
        tensor = isinstance(pos, torch.Tensor)
        return rope_op(q, k, cos, sin, pos if tensor else None, 0 if tensor else pos, interleaved)
    for interleaved in (False, True):
        q = randn(b, hq, s, d, requires_grad=True)
        k = randn(b, hk, s, d, requires_grad=True)
        check_fwd_bwd(q, k, cos, sin, pos, interleaved, torch.float32, f"table_first={table_first}", rope=operator)


@pytest.mark.parametrize("interleaved", [False, True])
def test_layouts(interleaved):
    """(B, S, H, D) buffers seen as (B, H, S, D), a fused-QKV slice, and a non-unit D stride."""
    b, s, hq, hk, d = 2, 9, 4, 2, 16
    cos, sin = make_table(None, s, d)
    # HF: proj(x).view(B, S, H, D).transpose(1, 2): read in place, output in the same layout
    q = randn(b, s, hq, d).transpose(1, 2).requires_grad_()
    k = randn(b, s, hk, d).transpose(1, 2).requires_grad_()
    qo, ko = check_fwd_bwd(q, k, cos, sin, None, interleaved, torch.float32, "transposed")
    assert qo.stride() == q.stride() and ko.stride() == k.stride()
    # the reverse: contiguous q, transposed k
    q2 = randn(b, hq, s, d, requires_grad=True)
    cos2, sin2 = make_table(1, s + 2, d, half=True)
    qo2, ko2 = check_fwd_bwd(q2, k.detach().clone().requires_grad_(), cos2, sin2, 2, interleaved, torch.float32, "mixed")
    assert qo2.is_contiguous() and ko2.stride() == k.stride()
    # a fused QKV projection, sliced: non-dense strides on B and H
    qkv = randn(b, s, hq + 2 * hk, d)
    q3 = qkv[:, :, :hq].transpose(1, 2).requires_grad_()
    k3 = qkv[:, :, hq:hq + hk].transpose(1, 2).requires_grad_()
    check_fwd_bwd(q3, k3, cos, sin, None, interleaved, torch.float32, "fused qkv")
    # every other element along D: copied (documented), still right
    q4 = randn(b, hq, s, 2 * d)[..., ::2].requires_grad_()
    k4 = randn(b, hk, s, 2 * d)[..., ::2].requires_grad_()
    check_fwd_bwd(q4, k4, cos, sin, None, interleaved, torch.float32, "strided D")


def test_expanded_gradient():
    """sum().backward() hands the backward stride-0 gradients (D stride 0: copied)."""
    q = randn(2, 4, 7, 8, requires_grad=True)
    k = randn(2, 2, 7, 8, requires_grad=True)
    cos, sin = make_table(None, 7, 8)
    qo, ko = apply_rope(q, k, cos, sin)
    (qo.sum() + ko.sum()).backward()
    qd, kd = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    qr, kr = rope_reference(qd, kd, cos, sin)
    (qr.sum() + kr.sum()).backward()
    assert_close(q.grad, qd.grad, torch.float32, what="dq")
    assert_close(k.grad, kd.grad, torch.float32, what="dk")


def test_reference_matches_hf_and_complex():
    """The reference itself against HF's formula (rotate-half) and complex multiplication (GPT-J),
    using the tables RotaryEmbedding builds; and the module against both."""
    b, hq, hk, s, d = 2, 4, 2, 11, 16
    q, k = randn(b, hq, s, d).double(), randn(b, hk, s, d).double()
    pos = torch.randint(0, 50, (b, s), device=DEVICE)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64, device=DEVICE) / d))
    ang = pos.double()[..., None] * inv                                    # (B, S, D/2)
    emb = torch.cat([ang, ang], -1)
    hq_ref, hk_ref = hf_apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    full_cos, full_sin = emb.cos(), emb.sin()
    r = rope_reference(q, k, full_cos, full_sin, None, False)
    assert_close(r[0], hq_ref, torch.float32)
    assert_close(r[1], hk_ref, torch.float32)
    ri = rope_reference(q, k, ang.cos(), ang.sin(), None, True)            # half table, GPT-J pairing
    assert_close(ri[0], complex_rope(q, ang), torch.float32)
    assert_close(ri[1], complex_rope(k, ang), torch.float32)
    for interleaved, want in ((False, (hq_ref, hk_ref)), (True, (complex_rope(q, ang), complex_rope(k, ang)))):
        m = RotaryEmbedding(d, max_position_embeddings=50, interleaved=interleaved, device=DEVICE)
        assert m.cos_cached.dtype == torch.float32 and "cos_cached" not in m.state_dict()
        qo, ko = m(q.float(), k.float(), pos)
        assert_close(qo, want[0], torch.float32, scale=5.0, what=f"module q interleaved={interleaved}")
        assert_close(ko, want[1], torch.float32, scale=5.0, what=f"module k interleaved={interleaved}")
    m = RotaryEmbedding(d, max_position_embeddings=20, device=DEVICE)
    qo, _ = m(q.float()[:, :, :1], k.float()[:, :, :1], 17)                 # decode at position 17
    e17 = torch.full((1, 1), 17.0, dtype=torch.float64, device=DEVICE)[..., None] * inv
    e17 = torch.cat([e17, e17], -1)
    assert_close(qo, hf_apply_rotary_pos_emb(q[:, :, :1], k[:, :, :1], e17.cos(), e17.sin())[0],
                 torch.float32, scale=5.0, what="module decode offset")
    with pytest.raises(ValueError, match="'head_dim' is 7"):
        RotaryEmbedding(7)


def test_double_backward():
    q = randn(1, 2, 5, 8, requires_grad=True)
    k = randn(1, 1, 5, 8, requires_grad=True)
    cos, sin = make_table(None, 5, 8)
    gq = randn(1, 2, 5, 8, requires_grad=True)
    gk = randn(1, 1, 5, 8, requires_grad=True)
    qo, ko = apply_rope(q, k, cos, sin)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk), create_graph=True)
    (dq * dq).sum().add((dk * dk).sum()).backward()                        # d/dg |R^T g|^2 = 2 R R^T g
    gqd, gkd = gq.detach().double().requires_grad_(), gk.detach().double().requires_grad_()
    qd, kd = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    qr, kr = rope_reference(qd, kd, cos, sin)
    dqr, dkr = torch.autograd.grad((qr, kr), (qd, kd), (gqd, gkd), create_graph=True)
    (dqr * dqr).sum().add((dkr * dkr).sum()).backward()
    assert_close(gq.grad, gqd.grad, torch.float32, scale=2.0, what="ddq")
    assert_close(gk.grad, gkd.grad, torch.float32, scale=2.0, what="ddk")


def test_positions_out_of_range(monkeypatch):
    q, k = randn(2, 2, 4, 8), randn(2, 1, 4, 8)
    cos, sin = make_table(None, 10, 8)
    monkeypatch.setattr(rope_mod, "CHECK_POSITIONS", True)       # asked for (always so for CPU ids)
    for bad in (torch.tensor([0, 1, 10, 2], device=DEVICE), torch.tensor([[0, 1, 2, 3], [0, -1, 2, 3]], device=DEVICE)):
        with pytest.raises(IndexError, match="'position_ids' has values in"):
            apply_rope(q, k, cos, sin, bad)
    with pytest.raises(ValueError, match="'cos' has 10 rows; expected at least offset \\+ S = 11"):
        apply_rope(q, k, cos, sin, 7)
    with pytest.raises(ValueError, match="offset is -1"):
        apply_rope(q, k, cos, sin, -1)
    # unchecked (GPU ids by default, and under torch.compile): the kernel reads nothing outside
    # the table, the token is NaN
    monkeypatch.setattr(rope_mod, "CHECK_POSITIONS", False)
    bad = torch.tensor([0, 1, 10**9, -5], device=DEVICE)
    if bad.device.type == "cpu":
        with pytest.raises(IndexError, match="'position_ids' has values in"):   # CPU ids: no sync, checked
            apply_rope(q, k, cos, sin, bad)
        monkeypatch.setattr(rope_mod, "_check_positions", lambda ids, rows: None)
    qo, ko = apply_rope(q, k, cos, sin, bad)
    assert torch.isnan(qo[:, :, 2:]).all() and torch.isnan(ko[:, :, 2:]).all()
    qr, kr = rope_reference(q, k, cos, sin)                                # ids 0, 1 are rows 0, 1
    assert_close(qo[:, :, :2], qr[:, :, :2], torch.float32)
    assert_close(ko[:, :, :2], kr[:, :, :2], torch.float32)


def test_empty():
    cos, sin = make_table(None, 4, 8)
    qo, ko = apply_rope(randn(0, 4, 3, 8), randn(0, 2, 3, 8), cos, sin)
    assert qo.shape == (0, 4, 3, 8) and ko.shape == (0, 2, 3, 8)
    qo, ko = apply_rope(randn(2, 4, 0, 8), randn(2, 2, 0, 8), cos, sin, torch.empty(0, dtype=torch.long, device=DEVICE))
    assert qo.shape == (2, 4, 0, 8) and ko.shape == (2, 2, 0, 8)


def test_compile_fullgraph():
    q = randn(2, 4, 7, 16, requires_grad=True)
    k = randn(2, 2, 7, 16, requires_grad=True)
    cos, sin = make_table(None, 12, 16, half=True)
    pos = torch.randint(0, 12, (2, 7), device=DEVICE)

    def f(q, k, pos):
        a, b = apply_rope(q, k, cos, sin, pos)
        c, d = apply_rope(q, k, cos, sin, 3, interleaved=True)
        return a * 2 + c, b + d

    qo, ko = torch.compile(f, fullgraph=True)(q, k, pos)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward((qo, ko), (gq, gk))
    qd, kd = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    a, b = rope_reference(qd, kd, cos, sin, pos)
    c, d = rope_reference(qd, kd, cos, sin, 3, interleaved=True)
    torch.autograd.backward((a * 2 + c, b + d), (gq.double(), gk.double()))
    assert_close(qo, a * 2 + c, torch.float32, what="compiled q")
    assert_close(ko, b + d, torch.float32, what="compiled k")
    assert_close(q.grad, qd.grad, torch.float32, scale=2.0, what="compiled dq")
    assert_close(k.grad, kd.grad, torch.float32, scale=2.0, what="compiled dk")


@pytest.mark.parametrize("table", ["half", "full", "batched"])
def test_compile_dynamic_shapes_static_table(table):
    """torch.compile(dynamic=True, fullgraph=True) over two sequence lengths with tables whose shape
    is static (a module's buffers, as RotaryEmbedding's) and q/k of symbolic shape. The table
    checks (``cos.shape[-1] not in (d, d // 2)``, ``cos.shape[0] not in (1, bsz)``) test a constant
    for membership in a tuple of symbolic sizes, which Dynamo answers False: a valid call raised
    ValueError while tracing."""
    cos, sin = make_table(2 if table == "batched" else None, 16, 8, half=table == "half")
    torch._dynamo.reset()
    for t in (cos, sin):
        torch._dynamo.mark_static(t)
    f = torch.compile(lambda q, k, c, s: apply_rope(q, k, c, s), dynamic=True, fullgraph=True)
    for seq in (5, 9):
        q = randn(2, 4, seq, 8, requires_grad=True)
        k = randn(2, 2, seq, 8, requires_grad=True)
        qo, ko = f(q, k, cos, sin)
        (qo.sum() + ko.sum()).backward()
        qd, kd = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
        a, b = rope_reference(qd, kd, cos, sin)
        (a.sum() + b.sum()).backward()
        assert_close(qo, a, torch.float32, what=f"compiled q, S={seq}")
        assert_close(ko, b, torch.float32, what=f"compiled k, S={seq}")
        assert_close(q.grad, qd.grad, torch.float32, scale=2.0, what=f"compiled dq, S={seq}")
        assert_close(k.grad, kd.grad, torch.float32, scale=2.0, what=f"compiled dk, S={seq}")


@pytest.mark.parametrize("variant", ["offset", "positions", "transposed"])
def test_opcheck(variant):
    q = randn(2, 4, 5, 6, requires_grad=True)
    k = randn(2, 2, 5, 6, requires_grad=True)
    cos, sin = make_table(None, 9, 6)
    pos, offset, inter = None, 4, False
    if variant == "positions":
        pos, offset, inter = torch.randint(0, 9, (2, 5), device=DEVICE), 0, True
    if variant == "transposed":
        q = randn(2, 5, 4, 6).transpose(1, 2).requires_grad_()
    torch.library.opcheck(rope_op.overload, (q, k, cos, sin, pos, offset, inter))
    torch.library.opcheck(rope_backward_op.overload, (q, k, cos, sin, pos, offset, inter))


def test_bad_input():
    q, k = randn(2, 4, 5, 8), randn(2, 2, 5, 8)
    cos, sin = make_table(None, 5, 8)
    cases = [
        ((q[..., :7], k[..., :7], cos[:, :7], sin[:, :7]), ValueError, "'q' has head dim D=7; expected an even D"),
        ((randn(2, 3, 5, 8), k, cos, sin), ValueError, "'q' has 3 heads and 'k' has 2; expected Hq to be a multiple"),
        ((q, randn(3, 2, 5, 8), cos, sin), ValueError, "'k' has shape \\(3, 2, 5, 8\\) but 'q'"),
        ((q, randn(2, 2, 6, 8), cos, sin), ValueError, "expected the same batch, sequence length and head dim"),
        ((q, randn(2, 2, 5, 6), cos, sin), ValueError, "'k' has shape"),
        ((q, k, randn(5, 4), sin), ValueError, "'sin' has shape \\(5, 8\\) but 'cos' has \\(5, 4\\)"),
        ((q, k, randn(5, 6), randn(5, 6)), ValueError, "'cos' has last dim 6; expected the head dim D=8"),
        ((q, k, randn(3, 5, 8), randn(3, 5, 8)), ValueError, "'cos' has batch size 3"),
        ((q, k, cos[:4], sin[:4]), ValueError, "'cos' has 4 rows; expected at least offset \\+ S = 5"),
        ((q.long(), k.long(), cos, sin), TypeError, "'q' has dtype int64"),
        ((q, k.half(), cos, sin), TypeError, "'k' has dtype torch.float16 but 'q' has torch.float32"),
        ((q.half(), k.half(), cos.bfloat16(), sin.bfloat16()), TypeError, "'cos' has dtype bfloat16; expected one of float32, float16"),
        ((q[0], k[0], cos, sin), ValueError, "'q' must have at least 4 dimension"),
        ((q[None], k[None], cos, sin), ValueError, "'q' must be 4-d"),
        ((q, k, cos[None, None], sin[None, None]), ValueError, "'cos' must be \\(T, D\\)"),
        ((q, k, cos, sin, torch.zeros(5, device=DEVICE)), TypeError, "'position_ids' has dtype float32; expected int32 or int64"),
        ((q, k, cos, sin, torch.zeros(3, 5, dtype=torch.long, device=DEVICE)), ValueError, "'position_ids' has shape \\(3, 5\\)"),
        ((q, k, cos, sin, torch.zeros(4, dtype=torch.long, device=DEVICE)), ValueError, "'position_ids' has shape \\(4,\\)"),
        ((q, k, cos, sin, 1.5), TypeError, "'position_ids' must be None, an int offset or an int tensor"),
        ((q, k, cos, sin, True), TypeError, "'position_ids' must be None"),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            apply_rope(*args)


@gpu_only
def test_cpu_tensor_rejected_on_gpu_machine():
    q, k, cos, sin = torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), torch.ones(3, 4), torch.ones(3, 4)
    with pytest.raises(RuntimeError, match="'q' is on device 'cpu'"):
        apply_rope(q, k, cos, sin)
    with pytest.raises(RuntimeError, match="'cos' is on device 'cpu'"):
        apply_rope(q.cuda(), k.cuda(), cos, sin)


if ON_GPU:
    @pytest.mark.parametrize("interleaved", [False, True])
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_large_gpu(dtype, interleaved):
        b, s, d = 2, 1024, 128
        q = randn(b, 32, s, d, dtype=dtype, requires_grad=True)
        k = randn(b, 8, s, d, dtype=dtype, requires_grad=True)
        cos, sin = make_table(b, 4096, d, dtype)
        pos = torch.randint(0, 4096, (b, s), device=DEVICE)
        check_fwd_bwd(q, k, cos, sin, pos, interleaved, dtype, "large")
        qt = randn(b, s, 32, d, dtype=dtype).transpose(1, 2).requires_grad_()
        kt = randn(b, s, 8, d, dtype=dtype).transpose(1, 2).requires_grad_()
        check_fwd_bwd(qt, kt, cos[:, :s], sin[:, :s], None, interleaved, dtype, "large transposed")
        check_fwd_bwd(randn(1, 32, 1, d, dtype=dtype, requires_grad=True), randn(1, 8, 1, d, dtype=dtype, requires_grad=True),
                      cos[:1], sin[:1], 4000, interleaved, dtype, "decode")


def test_rotary_embedding_bad_options():
    """RotaryEmbedding: a base <= 0 or NaN made NaN angles (every output NaN, no error); a float or
    string size was taken or failed inside a comparison; and a q whose head dim is half the
    module's read the half-size table as a full-width one: rotated by the wrong angles, silently."""
    for base in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="'base' is .*; expected a finite number > 0"):
            RotaryEmbedding(8, 16, base=base)
    for head_dim in (8.0, "8"):
        with pytest.raises(ValueError, match="'head_dim' is .*; expected a positive even number"):
            RotaryEmbedding(head_dim)
    with pytest.raises(ValueError, match="'max_position_embeddings' is 2.5; expected an int >= 1"):
        RotaryEmbedding(8, 2.5)
    rope = RotaryEmbedding(16, 16).to(DEVICE)
    q, k = randn(1, 2, 3, 8), randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="'q' has head dim 8; this RotaryEmbedding was built for head_dim=16"):
        rope(q, k)


def test_cos_dtype_message_names_each_dtype_once():
    q, k = randn(1, 2, 3, 8), randn(1, 2, 3, 8)
    cos = torch.ones(3, 8, device=DEVICE, dtype=torch.float64)
    with pytest.raises(TypeError, match="'cos' has dtype float64; expected one of float32$"):
        apply_rope(q, k, cos, cos)


@pytest.mark.parametrize("table_first", [False, True])
def test_table_strides(monkeypatch, table_first):
    """cos and sin with different row and batch strides (slices of wider buffers, unit last stride:
    read in place): each table is indexed with its own strides, in both load orders."""
    real = rope_config
    monkeypatch.setattr(rope_mod, "rope_config", lambda *a: dataclasses.replace(real(*a), table_first=table_first))
    b, hq, hk, s, d = 2, 4, 2, 5, 8
    rows = s + 3
    for tb in (None, b):
        lead = () if tb is None else (tb,)
        cos = randn(*lead, rows, 3 * d)[..., d:2 * d]                      # row stride 3D
        sin = randn(*lead, 2 * rows + 1, d)[..., 1::2, :]                  # row stride 2D, batch stride (2T+1)D
        assert cos.stride(-2) != sin.stride(-2) and cos.stride(-1) == sin.stride(-1) == 1
        for interleaved in (False, True):
            q = randn(b, hq, s, d, requires_grad=True)
            k = randn(b, hk, s, d, requires_grad=True)
            check_fwd_bwd(q, k, cos, sin, 2, interleaved, torch.float32, f"strided tables tb={tb}")


def test_position_one_past_the_table(monkeypatch):
    """An id equal to the table's row count T is out of range: that token is NaN, even where the
    memory after the table holds finite numbers (the tables are the first T rows of a longer
    buffer, so reading row T would give plausible values)."""
    monkeypatch.setattr(rope_mod, "_check_positions", lambda ids, rows: None)   # the kernel's own mask
    rows, d = 6, 8
    cbuf, sbuf = make_table(None, rows + 2, d)
    cos, sin = cbuf[:rows], sbuf[:rows]
    q, k = randn(2, 2, 4, d), randn(2, 1, 4, d)
    pos = torch.tensor([0, rows, rows - 1, rows + 1], device=DEVICE)
    qo, ko = apply_rope(q, k, cos, sin, pos)
    assert torch.isnan(qo[:, :, [1, 3]]).all() and torch.isnan(ko[:, :, [1, 3]]).all()
    ok = torch.tensor([0, rows - 1], device=DEVICE)
    qr, kr = rope_reference(q[:, :, [0, 2]], k[:, :, [0, 2]], cos, sin, ok)
    assert_close(qo[:, :, [0, 2]], qr, torch.float32)
    assert_close(ko[:, :, [0, 2]], kr, torch.float32)


def test_forced_head_steps(monkeypatch):
    """Steps of different head counts for q and k (HEADS_Q 4, HEADS_K 2) with several k groups and
    one program walking them all: each k group starts at its own multiple of HEADS_K. (rope_config
    makes the two equal whenever k has more than one group; the kernel takes any pair.)"""
    real = rope_config
    monkeypatch.setattr(rope_mod, "rope_config",
                        lambda *a: dataclasses.replace(real(*a), heads_q=4, heads_k=2, split=1))
    b, hq, hk, s, d = 2, 8, 4, 3, 16
    for interleaved in (False, True):
        q = randn(b, hq, s, d, requires_grad=True)
        k = randn(b, hk, s, d, requires_grad=True)
        cos, sin = make_table(None, s, d)
        check_fwd_bwd(q, k, cos, sin, None, interleaved, torch.float32, "forced head steps")
