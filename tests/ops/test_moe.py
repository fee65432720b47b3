"""warpforge.moe_experts (ops/moe.py) and warpforge.nn.MoE: forward and every gradient against a float64
per-expert loop (experts with no tokens, all tokens on one expert, k = 1, E not a power of two, T not
a multiple of the tile, layouts), determinism, torch.compile, opcheck, bad input, and ids out of
range with validation off staying in bounds."""
from __future__ import annotations

import pytest
import torch

import warpforge as wf
from warpforge.ops.moe import moe_experts, moe_experts_bwd_op, moe_experts_op, moe_experts_reference
from warpforge.ops.moe_routing import moe_route_reference

from conftest import DEVICE, ON_GPU, SHARED_MEMORY, assert_close, gpu_only, randn, rel_err

SMALL = (13, 32, 24, 6, 2) if not ON_GPU else (300, 256, 192, 12, 3)


def _inputs(T, d, n, E, k, dtype, ids=None):
    x = randn(T, d, dtype=dtype, requires_grad=True)
    w1 = randn(E, 2 * n, d, dtype=dtype, scale=d ** -0.5, requires_grad=True)
    w2 = randn(E, d, n, dtype=dtype, scale=n ** -0.5, requires_grad=True)
    if ids is None:
        ids = torch.rand(T, E, device=DEVICE).topk(k, -1).indices.int()
    wts = torch.softmax(torch.randn(T, ids.shape[-1], device=DEVICE), -1).requires_grad_()
    return x, w1, w2, wts, ids


def _check(x, w1, w2, wts, ids, dtype, scale=1.0):
    out = moe_experts(x, w1, w2, wts, ids)
    dout = torch.randn_like(out)
    out.backward(dout)
    leaves = [t.detach().double().requires_grad_() for t in (x, w1, w2, wts)]
    ref = moe_experts_reference(*leaves, ids)
    ref.backward(dout.double())
    assert_close(out, ref, dtype, scale=scale, what="out")
    for name, t, r in zip(("dx", "dw_gate_up", "dw_down", "dweights"), (x, w1, w2, wts), leaves):
        assert t.grad.dtype == t.dtype
        assert_close(t.grad, r.grad, dtype, scale=2 * scale, what=name)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_forward_backward(dtype):
    _check(*_inputs(*SMALL, dtype), dtype)


@pytest.mark.parametrize("shape", [(37, 48, 40, 5, 1),      # k = 1, odd sizes
                                   (20, 32, 16, 60, 4),     # E = 60, most experts get no token
                                   (1, 16, 16, 3, 2)])      # a single token
def test_shapes(shape):
    _check(*_inputs(*shape, torch.float32), torch.float32)


def test_empty_experts_get_exact_zero_gradients():
    T, d, n, E, k = 9, 32, 16, 7, 2
    ids = torch.tensor([[0, 2]] * T, dtype=torch.int32, device=DEVICE)       # experts 1, 3-6 idle
    x, w1, w2, wts, ids = _inputs(T, d, n, E, k, torch.float32, ids)
    _check(x, w1, w2, wts, ids, torch.float32)
    for e in (1, 3, 4, 5, 6):
        assert torch.count_nonzero(w1.grad[e]) == 0 and torch.count_nonzero(w2.grad[e]) == 0
    assert torch.count_nonzero(w1.grad[0]) > 0


def test_all_tokens_on_one_expert_and_repeats():
    T, d, n, E, k = 21, 16, 32, 4, 2
    ids = torch.full((T, k), 3, dtype=torch.int64, device=DEVICE)           # int64 ids, one expert chosen twice
    _check(*_inputs(T, d, n, E, k, torch.float32, ids), torch.float32)


def test_backward_wider_row_tiles(monkeypatch):
    """Forward and backward at 64-row tiles (the interpreter otherwise always takes 16, where the
    SwiGLU backward's 16-row programs are whole tiles): experts of one partial tile, none, and two
    tiles, so a tile's later 16-row blocks hold real rows while later tiles are unused. The row
    GEMMs take the layout's tile height, as moe_config gives fp32 on a GPU."""
    import warpforge.ops.moe as M
    from warpforge.runtime.heuristics import MoEConfig

    block_m = 64
    counts = [40, 0, 5, 70]                       # tile owners [0, 2, 3, 3, -1, -1]
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel())].to(DEVICE)[:, None]
    monkeypatch.setattr(M, "moe_block_m", lambda *a: block_m)
    if not ON_GPU:
        real = M.moe_config
        monkeypatch.setattr(M, "moe_config", lambda kind, bm, s: real(kind, bm, s) if kind == "wgrad"
                            else MoEConfig(bm, 16, 16, 4, 1, 2))
    _check(*_inputs(ids.shape[0], 16, 24, len(counts), 1, torch.float32, ids), torch.float32)


def test_tiles_step_down_where_shared_memory_is_short(monkeypatch):
    """Where a grouped-GEMM or weight-gradient tile does not load (Triton refuses a kernel that
    needs more shared memory than the GPU has; here a stand-in refuses N x K or M x N tiles of
    2,048 elements), the first smaller tile of heuristics.gemm_configs runs, keeping the row tile
    (the sorted layout's padding unit): output and every gradient stay right."""
    import warpforge.ops.moe as M
    from triton.runtime.errors import OutOfResources
    from warpforge.runtime import launch as launch_mod
    from warpforge.runtime.heuristics import MoEConfig

    monkeypatch.setattr(launch_mod, "_TOO_BIG", {})
    monkeypatch.setattr(M, "moe_config", lambda kind, bm, s: MoEConfig(64, 32, 32, 4, 1) if kind == "wgrad"
                        else MoEConfig(bm, 64, 32, 4, 1))
    real, ran = M._launch, []

    def refusing(cache, grid, args, cfg, pdl=False, **const):
        if cache in (M._GEMM, M._WGRAD):
            area = cfg.block_n * cfg.block_k if cache is M._GEMM else cfg.block_m * cfg.block_n
            if area >= 2048:
                raise OutOfResources(area, 2047, "shared memory")
            ran.append((cache.kernel.__name__, cfg.block_m if cache is M._WGRAD else "row tile", cfg.block_n,
                        cfg.block_k))
        return real(cache, grid, args, cfg, pdl, **const)
    monkeypatch.setattr(M, "_launch", refusing)
    _check(*_inputs(37, 48, 40, 5, 2, torch.float32), torch.float32)
    assert set(ran) == {("_moe_gemm_kernel", "row tile", 32, 32), ("_moe_wgrad_kernel", 32, 32, 32)}, ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swapped_decode_kernels(monkeypatch, dtype):
    """The decode kernels with A and B swapped (ops/moe.py, _moe_swap_kernel), forced on: experts
    with no rows, fewer than the short token box (TM), more (passes of TW rows: two of them a tile
    under the interpreter's 64-row tiles, the second skipped where it has no real row) and more
    than one tile, against the float64 loop."""
    import warpforge.ops.moe as M

    if dtype == torch.float32 and ON_GPU:
        pytest.skip("the swapped kernels are 16-bit only on a GPU (TMA path)")
    block_m = 128 if ON_GPU else 64
    d, n = (640, 256) if ON_GPU else (40, 24)   # the gather in several column blocks; partial column and K tiles
    counts = [0, 10, 20, 40, 70, 100, 150] if ON_GPU else [0, 10, 20, 40, 70, 100, 140]
    E = len(counts)
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel())].to(DEVICE)[:, None]                   # k = 1, tokens shuffled
    x, w1, w2, wts, ids = _inputs(ids.shape[0], d, n, E, 1, dtype, ids)
    calls = []
    real = M._gemm_swap
    monkeypatch.setattr(M, "_gemm_swap", lambda *a, **kw: (calls.append(kw["epi"]), real(*a, **kw))[1])
    monkeypatch.setattr(M, "_SWAP_INTERP", True)
    monkeypatch.setattr(M, "MOE_SWAP_MAX_ROWS", 1 << 20)
    monkeypatch.setattr(M, "moe_block_m", lambda *a: block_m)
    monkeypatch.setattr(M, "_TMA_DECODE_MIN_WEIGHTS", 0)
    with torch.no_grad():
        out = moe_experts(x, w1, w2, wts, ids)
        ref = moe_experts_reference(x.double(), w1.double(), w2.double(), wts.double(), ids)
    assert calls == [1, 0], "the swapped kernels ran (gate/up, then down)"
    assert_close(out, ref, dtype, what="out")


_ALIGN_NAMES = ("sorted_slot", "slot_pos", "tile_expert", "start", "counts")


def _align_want(ids: torch.Tensor, E: int, block_m: int) -> tuple:
    """_align's five outputs built on the host: slots of ids outside [0, E) dropped, every kept
    slot at its expert's first padded row + its rank among that expert's slots in slot order,
    padding rows -1, the owner of every tile (-1 past the used ones)."""
    import warpforge.ops.moe as M

    ids = ids.cpu().long().flatten()
    S = ids.numel()
    ok = (ids >= 0) & (ids < E)
    counts = torch.bincount(ids[ok], minlength=E)
    tiles = (counts + block_m - 1) // block_m
    start = torch.cat([torch.zeros(1, dtype=torch.long), tiles.cumsum(0)]) * block_m
    tiles_max = M._tiles_max(S, E, block_m)
    owner = torch.full((tiles_max,), -1, dtype=torch.long)
    owner[:int(tiles.sum())] = torch.repeat_interleave(torch.arange(E), tiles)
    kept = ok.nonzero().flatten()
    kept = kept[torch.sort(ids[kept], stable=True).indices]            # by expert, slot order within
    e = ids[kept]
    rows = start[e] + torch.arange(kept.numel()) - (counts.cumsum(0) - counts)[e]
    sorted_slot = torch.full((tiles_max * block_m,), -1, dtype=torch.long)
    sorted_slot[rows] = kept
    pos = torch.full((S,), -1, dtype=torch.long)
    pos[kept] = rows
    return sorted_slot, pos, owner, start, counts


def _assert_align(got: tuple, want: tuple, what: str) -> None:
    """_align's outputs exactly as :func:`_align_want`'s, the first differing entries named."""
    for name, o, w in zip(_ALIGN_NAMES, got, want):
        o = o.cpu().long()
        assert o.shape == w.shape, f"{what}: {name} has shape {tuple(o.shape)}, want {tuple(w.shape)}"
        bad = (o != w).nonzero().flatten()
        assert bad.numel() == 0, (f"{what}: {name} differs at {bad.numel()} of {w.numel()} entries, first "
                                  f"{bad[:8].tolist()}: got {o[bad[:8]].tolist()}, want {w[bad[:8]].tolist()}")


@pytest.mark.parametrize("S,E,block_m", [(1, 5, 16), (77, 5, 16), (128, 60, 16), (300, 5, 64), (512, 60, 16),
                                           (700, 5, 64), (2048, 128, 16), (300, 1100, 16)])
def test_align_paths(monkeypatch, S, E, block_m):
    """The padded expert layout from one program (decode: MOE_ALIGN_ONE_MAX, MOE_ALIGN_ONE_WORK) and
    from the three chunked launches, each against a Python construction: counts, starts, tile
    owners, every slot in order within its expert, and out-of-range ids (-1, E) dropped. At E =
    1100 the offsets kernel walks its 3 chunk histograms 2 at a time (4,096 // NB = 2 rows a
    step), so the second step's prefix starts from the first's running sums."""
    import warpforge.ops.moe as M

    g = torch.Generator().manual_seed(S * 100 + E)
    ids = torch.randint(-1, E + 1, (S,), generator=g, dtype=torch.int32)
    want = _align_want(ids, E, block_m)
    for one_max in (0, 1 << 20):
        monkeypatch.setattr(M, "MOE_ALIGN_ONE_MAX", one_max)
        monkeypatch.setattr(M, "MOE_ALIGN_ONE_WORK", one_max * E)
        _assert_align(M._align(ids.to(DEVICE), E, block_m), want, f"one program: {one_max > 0}")


def _transposed_weights(E, d, n, grad=False):
    """w_gate_up and w_down stored transposed, (E, d, 2n).transpose(1, 2) and (E, n, d).transpose(1, 2)."""
    w1 = randn(E, d, 2 * n, scale=d ** -0.5).transpose(1, 2)
    w2 = randn(E, n, d, scale=n ** -0.5).transpose(1, 2)
    return (w1.requires_grad_(), w2.requires_grad_()) if grad else (w1, w2)


def test_layouts():
    """3-d x, strided x rows, weights stored transposed (non-contiguous), bf16 routing weights."""
    T, d, n, E, k = 10, 32, 24, 5, 2
    x = randn(2, T, 2 * d)[..., :d].requires_grad_()
    w1, w2 = _transposed_weights(E, d, n, grad=True)
    ids = torch.rand(2, T, E, device=DEVICE).topk(k, -1).indices
    wts = torch.softmax(torch.randn(2, T, k, device=DEVICE), -1).to(torch.bfloat16).requires_grad_()
    out = moe_experts(x, w1, w2, wts, ids)
    assert out.shape == (2, T, d)
    out.sum().backward()
    leaves = [t.detach().double().requires_grad_() for t in (x, w1, w2, wts)]
    ref = moe_experts_reference(*leaves, ids)
    ref.sum().backward()
    assert_close(out, ref, torch.float32, scale=50, what="out")   # bf16 weights: their rounding is in both
    assert wts.grad.dtype == torch.bfloat16
    for t, r in zip((x, w1, w2), leaves):
        assert_close(t.grad, r.grad, torch.float32, scale=50)


def test_deterministic():
    args = _inputs(*SMALL, torch.bfloat16)
    outs, grads = [], []
    for _ in range(2):
        for t in args[:4]:
            t.grad = None
        out = moe_experts(*args)
        out.backward(torch.ones_like(out))
        outs.append(out)
        grads.append([t.grad.clone() for t in args[:4]])
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_no_grad_and_empty():
    x, w1, w2, wts, ids = _inputs(*SMALL, torch.float32)
    with torch.no_grad():
        out = moe_experts(x, w1, w2, wts, ids)
    assert_close(out, moe_experts_reference(x.double(), w1.double(), w2.double(), wts.double(), ids), torch.float32)
    e = moe_experts(x[:0], w1, w2, wts[:0], ids[:0])
    assert e.shape == (0, x.shape[1])
    e.sum().backward()
    assert torch.count_nonzero(w1.grad) == 0


def test_empty_through_the_registered_operator(monkeypatch):
    """Zero tokens through the registered operator (the torch.compile / dispatcher door): its
    outputs must not alias each other (one shared empty tensor was returned three times)."""
    monkeypatch.setattr("warpforge.runtime.registry.FAST_EAGER", False)
    x, w1, w2, wts, ids = _inputs(0, 16, 8, 3, 2, torch.float32)
    e = moe_experts(x, w1, w2, wts, ids)
    assert e.shape == (0, 16)
    e.sum().backward()
    assert torch.count_nonzero(w1.grad) == 0 and x.grad.shape == (0, 16)


def test_out_of_range_ids_unvalidated_are_dropped():
    """validate=True raises on an id past either end (each alone); validate=False drops such slots,
    forward and backward: they add nothing to the output or to any gradient, and their routing
    weights get an exact-zero gradient (not another row's)."""
    T, d, n, E, k = 8, 16, 16, 4, 2
    x, w1, w2, wts, ids = _inputs(T, d, n, E, k, torch.float32)
    for i, j, v in ((1, 0, 9), (5, 1, -3), (2, 1, E), (6, 0, -1)):
        one = ids.clone()
        one[i, j] = v
        want = f"\\[{v}, " if v < 0 else f", {v}\\]"                         # the bad end named
        with pytest.raises(ValueError, match=f"'topk_ids' holds expert ids in .*{want}"):
            moe_experts(x, w1, w2, wts, one)
    bad = ids.clone()
    bad[1, 0], bad[5, 1] = 9, -3
    out = moe_experts(x, w1, w2, wts, bad, validate=False)
    dout = torch.randn_like(out)
    out.backward(dout)
    dropped = torch.zeros(T, k, dtype=torch.bool, device=DEVICE)
    dropped[1, 0] = dropped[5, 1] = True
    keep = wts.detach().masked_fill(dropped, 0.0)
    leaves = [t.detach().double().requires_grad_() for t in (x, w1, w2)] + [keep.double().requires_grad_()]
    ref = moe_experts_reference(*leaves, bad.clamp(0, E - 1))
    ref.backward(dout.double())
    assert_close(out, ref, torch.float32)
    for name, t, r in zip(("dx", "dw_gate_up", "dw_down"), (x, w1, w2), leaves):
        assert_close(t.grad, r.grad, torch.float32, scale=2, what=name)
    assert torch.equal(wts.grad[dropped], torch.zeros(2, device=DEVICE)), "a dropped slot's weight got a gradient"
    assert_close(wts.grad[~dropped], leaves[3].grad[~dropped], torch.float32, scale=2, what="dweights")


def test_compile_fullgraph():
    x, w1, w2, wts, ids = _inputs(*SMALL, torch.float32)
    f = torch.compile(lambda *a: moe_experts(*a, validate=False), fullgraph=True)
    out = f(x, w1, w2, wts, ids)
    out.sum().backward()
    ref = moe_experts_reference(*[t.detach().double() for t in (x, w1, w2, wts)], ids)
    assert_close(out, ref, torch.float32)
    assert torch.isfinite(w1.grad).all() and torch.count_nonzero(x.grad) > 0


def test_opcheck():
    x, w1, w2, wts, ids = _inputs(7, 16, 16, 3, 2, torch.float32)
    torch.library.opcheck(moe_experts_op.overload, (x, w1, w2, wts.detach(), ids, 16, True),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_bad_input():
    x, w1, w2, wts, ids = _inputs(5, 16, 8, 4, 2, torch.float32)
    cases = [
        ((x, w1, w2, torch.rand(5, 5, device=DEVICE), torch.zeros(5, 5, dtype=torch.int32, device=DEVICE)),
         ValueError, "top_k"),
        ((x, w1[:, :15], w2, wts, ids), ValueError, "w_gate_up"),
        # an odd 2n whose n = 2n // 2 w_down matches: only the parity check stops it
        ((x, w1[:, :15], w2[:, :, :7], wts, ids), ValueError, "'w_gate_up' has shape \\(4, 15, 16\\); expected"),
        ((x, w1, w2[:, :, :7], wts, ids), ValueError, "w_down"),
        ((x, w1, w2[:3], wts, ids), ValueError, "w_down"),
        ((x, w1[0], w2, wts, ids), ValueError, "w_gate_up"),
        ((x, w1.half(), w2, wts, ids), TypeError, "w_gate_up"),
        ((x, w1, w2, wts, ids.float()), TypeError, "topk_ids"),
        ((x, w1, w2, wts[:, :1], ids), ValueError, "topk_weights"),
        ((x, w1, w2, wts, ids[:4]), ValueError, "topk_ids"),
        ((x.int(), w1, w2, wts, ids), TypeError, "'x'"),
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            moe_experts(*args)


def test_module_matches_reference():
    torch.manual_seed(0)
    d, n, E, k, ns = 32, 16, 8, 2, 1
    m = wf.nn.MoE(d, n, E, k, n_shared=ns, score="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.0,
                  bias_update_rate=0.01, aux_loss_coef=0.0, device=DEVICE)
    x = randn(3, 5, d, requires_grad=True)
    y = m(x)
    r = moe_route_reference(x.reshape(-1, d).double() @ m.router.double().T, k, score="sigmoid", n_group=4,
                            topk_group=2, renormalize=True, routed_scaling_factor=2.0,
                            correction_bias=torch.zeros(E, device=DEVICE))
    ids = torch.cat([r.ids.long(), torch.full((15, ns), E, device=DEVICE)], 1)
    wts = torch.cat([r.weights, torch.ones(15, ns, device=DEVICE, dtype=r.weights.dtype)], 1)
    ref = moe_experts_reference(x.reshape(-1, d).double(), m.w_gate_up.double(), m.w_down.double(), wts.double(), ids)
    assert_close(y.reshape(-1, d), ref, torch.float32, scale=5)
    y.sum().backward()
    assert m.router.grad is not None and torch.isfinite(m.router.grad).all() and m.router.grad.abs().sum() > 0
    assert m.w_gate_up.grad[E].abs().sum() > 0                    # the shared expert saw every token
    assert int(m.counts.sum()) == 15 * k
    assert m.correction_bias.abs().sum() > 0                      # the training forward nudged the bias
    with pytest.raises(ValueError, match="n_group"):
        wf.nn.MoE(d, n, 6, 2, n_group=4)
    with pytest.raises(ValueError, match="top_k"):
        wf.nn.MoE(d, n, 4, 5)


@gpu_only
@pytest.mark.parametrize("gpu", ["A100", "sm_86/89"])
def test_small_shared_memory_gpu(lower_shared_memory, monkeypatch, gpu):
    """As on a GPU with less shared memory a block than Hopper (Triton's limit lowered to an A100's
    or an sm_86/89 card's; the TMA kernels off, as there): the pointer GEMMs load a tile that fits
    (the 128-row tiles of 3 stages, 96-144 KB for sm_90, are refused on the smaller card; all fit
    an A100), and output and gradients stay right, training-size and decode."""
    import warpforge.ops.moe as M
    from warpforge.runtime import launch
    monkeypatch.setattr(M, "_TMA_ON", False)
    lower_shared_memory(SHARED_MEMORY[gpu], M._GEMM, M._WGRAD)
    _check(*_inputs(1024, 1024, 512, 8, 2, torch.bfloat16), torch.bfloat16)
    _check(*_inputs(8, 1024, 512, 8, 2, torch.bfloat16), torch.bfloat16)
    if gpu == "sm_86/89":
        assert "MoE grouped GEMM" in {key[1] for key in launch.shared_memory_fallbacks()}


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: the training-size shapes are too slow for the interpreter")
@pytest.mark.parametrize("shape", [(2048, 512, 384, 64, 6), (1000, 1024, 512, 8, 2), (4, 2048, 768, 128, 8)])
def test_large_gpu(shape):
    _check(*_inputs(*shape, torch.bfloat16), torch.bfloat16)


ON_HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.skipif(not ON_HOPPER, reason="the TMA kernels need an sm_90+ GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,routing", [
    ((1500, 256, 320, 12, 3), "random"),   # n = 320: the gate/up column tiles straddle n (masked columns)
    ((3000, 384, 256, 60, 4), "random"),   # E = 60, T not a multiple of the tile
    ((700, 256, 192, 5, 1), "one"),        # k = 1, every token on expert 0, the rest idle
    ((900, 128, 128, 16, 2), "skewed"),    # a few experts with most tokens, several with none
])
@pytest.mark.parametrize("block_m", [128, 64, 32])
def test_tma_path(monkeypatch, dtype, shape, routing, block_m):
    """The Hopper kernels (gathered rows, TMA operands, persistent GEMMs) against float64, checked
    to be the kernels that ran; decode's 32- and 64-row tiles forced (and the weight-size threshold
    lowered), with weight gradients whose K step is the tile."""
    import warpforge.ops.moe as M
    T, d, n, E, k = shape
    if routing == "one":
        ids = torch.zeros(T, 1, dtype=torch.int32, device=DEVICE)
    elif routing == "skewed":
        g = torch.Generator(device="cpu").manual_seed(3)
        first = torch.randint(0, 3, (T,), generator=g)
        ids = torch.stack([first, 3 + (first + torch.randint(1, 6, (T,), generator=g)) % 6], 1).int().to(DEVICE)
    else:
        ids = None
    calls = []
    for fn in ("_gemm_tma", "_wgrad_tma", "_gemm", "_wgrad"):
        real = getattr(M, fn)
        monkeypatch.setattr(M, fn, lambda *a, _f=real, _n=fn, **kw: (calls.append(_n), _f(*a, **kw))[1])
    monkeypatch.setattr(M, "_TMA_DECODE_MIN_WEIGHTS", 0)
    monkeypatch.setattr(M, "moe_block_m", lambda *a: block_m)
    x, w1, w2, wts, ids = _inputs(T, d, n, E, k, dtype, ids)
    _check(x, w1, w2, wts, ids, dtype)
    assert set(calls) == {"_gemm_tma", "_wgrad_tma"}, calls
    if routing == "one":
        assert torch.count_nonzero(w1.grad[1:]) == 0 and torch.count_nonzero(w2.grad[1:]) == 0


@pytest.mark.skipif(not ON_HOPPER, reason="programmatic dependent launch needs an sm_90+ GPU")
@pytest.mark.parametrize("path", ["pointer", "tma", "swap"])
@pytest.mark.parametrize("mode", [1, 2])
def test_pdl_forward(monkeypatch, path, mode):
    """Inference forwards launch every kernel as a programmatic dependent of the one before
    (ops/moe.py, _pdl), the next launch released at each program's start (mode 1) or end (2): the
    same output bit for bit as without, eagerly and replayed from a CUDA graph, on each GEMM path
    (the TMA and swapped decode kernels forced at small sizes)."""
    import warpforge.ops.moe as M
    T, d, n, E, k = 80, 256, 192, 6, 2
    if path != "pointer":
        monkeypatch.setattr(M, "_TMA_DECODE_MIN_WEIGHTS", 0)
        monkeypatch.setattr(M, "moe_block_m", lambda *a: 128 if path == "swap" else 32)
    if path == "swap":
        monkeypatch.setattr(M, "MOE_SWAP_MAX_ROWS", 1 << 20)
    x, w1, w2, wts, ids = _inputs(T, d, n, E, k, torch.bfloat16)
    flags = []
    real = M._launch
    monkeypatch.setattr(M, "_launch", lambda *a, **kw: (flags.append(bool(a[4]) if len(a) > 4 else kw.get("pdl", False)),
                                                        real(*a, **kw))[1])
    with torch.no_grad():
        monkeypatch.setattr(M, "_PDL_MODE", 0)
        want = moe_experts(x, w1, w2, wts, ids)
        assert not any(flags)
        monkeypatch.setattr(M, "_PDL_MODE", mode)
        flags.clear()
        got = moe_experts(x, w1, w2, wts, ids)
        assert flags and all(flags), flags
        assert torch.equal(got, want)
        out = torch.empty_like(want)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            out.copy_(moe_experts(x, w1, w2, wts, ids))
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out.copy_(moe_experts(x, w1, w2, wts, ids, validate=False))
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


@pytest.mark.skipif(not ON_HOPPER, reason="the TMA kernels need an sm_90+ GPU")
def test_tma_path_declines_unreadable_weights(monkeypatch):
    """Weights TMA cannot read as one 2-D matrix (experts not stacked at a uniform stride) take the
    pointer kernels, still correct."""
    import warpforge.ops.moe as M
    T, d, n, E, k = 1200, 256, 128, 6, 2
    x, w1, w2, wts, ids = _inputs(T, d, n, E, k, torch.bfloat16)
    w1p = randn(E, 2 * n + 8, d, dtype=torch.bfloat16, scale=d ** -0.5)[:, :2 * n].detach().requires_grad_()
    assert M._weights_2d(w1p) is None
    calls = []
    real = M._gemm
    monkeypatch.setattr(M, "_gemm", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    _check(x, w1p, w2, wts, ids, torch.bfloat16)
    assert calls


def test_weights_2d_view():
    """The weights' (E * R, C) matrix for TMA: the same elements as the stacked experts, and None
    where the experts are not stacked at a uniform stride or the columns are not unit-stride."""
    import warpforge.ops.moe as M
    w = torch.randn(3, 16, 64)
    w2d = M._weights_2d(w)
    assert w2d is not None and w2d.shape == (48, 64) and torch.equal(w2d, w.reshape(48, 64))
    assert M._weights_2d(torch.randn(3, 20, 64)[:, :16]) is None           # padded rows between experts
    assert M._weights_2d(torch.randn(3, 64, 16).transpose(1, 2)) is None    # columns not unit-stride
    assert M._weights_2d(torch.randn(1, 20, 64)[:, :16]) is not None        # one expert: any expert stride


def test_unvalidated_int64_ids_past_int32_are_dropped():
    """validate=False with int64 ids: an id of 2^32 was narrowed to int32 (wrapping to expert 0) and
    routed there, where the docstring promises an out-of-range id is dropped."""
    x, w1, w2, wts, ids = _inputs(5, 16, 8, 4, 2, torch.float32)
    bad = ids.long().clone()
    bad[1, 0], bad[3, 1] = 2**32, -(2**32) + 1       # both wrap into [0, 4) when narrowed
    out = moe_experts(x, w1, w2, wts, bad, validate=False)
    keep = wts.detach().clone()
    keep[1, 0] = keep[3, 1] = 0.0
    ref = moe_experts_reference(x.double(), w1.double(), w2.double(), keep.double(), bad.clamp(0, 3))
    assert_close(out, ref, torch.float32)


def test_meta_tensors():
    """Meta tensors: the output's shape, without a kernel or the ids' host check."""
    x, w1, w2, wts, ids = (t.detach().to("meta") for t in _inputs(5, 16, 8, 4, 2, torch.float32))
    assert moe_experts(x, w1, w2, wts, ids).shape == (5, 16)


def test_module_bad_options():
    """nn.MoE checked its routing options only at the first forward (or never: a negative
    bias_update_rate silently switched balancing off), and a string n_group or a float n_shared
    failed inside a comparison or torch.empty."""
    d, n, E = 16, 8, 4
    cases = [
        (dict(score="relu"), ValueError, "'score' is 'relu'"),
        (dict(group_score="sum"), ValueError, "'group_score' is 'sum'"),
        (dict(n_group=2, topk_group=3), ValueError, "'topk_group' is 3"),
        (dict(n_group=2, topk_group=0), ValueError, "'topk_group' is 0"),
        (dict(n_group="2"), ValueError, "'n_group' = '2'"),
        (dict(n_shared=1.5), ValueError, "'n_shared' = 1.5"),
        (dict(aux_loss_coef=-1.0), ValueError, "'aux_loss_coef' is -1.0"),
        (dict(routed_scaling_factor=float("nan")), ValueError, "'routed_scaling_factor' is nan"),
        (dict(renormalize="yes"), TypeError, "'renormalize' must be a bool"),
        (dict(bias_update_rate=-1.0), ValueError, "'bias_update_rate' is -1.0"),
        (dict(bias_update_rate=float("nan")), ValueError, "'bias_update_rate' is nan"),
    ]
    for kw, exc, match in cases:
        with pytest.raises(exc, match=match):
            wf.nn.MoE(d, n, E, 2, **kw)
    with pytest.raises(ValueError, match="'top_k' is 3 but only topk_group"):
        wf.nn.MoE(d, n, E, 3, n_group=2, topk_group=1)
    with pytest.raises(ValueError, match="at most 1024 routed"):
        wf.nn.MoE(d, n, 2000, 2)
    m = wf.nn.MoE(d, n, E, 2, device=DEVICE)
    with pytest.raises(ValueError, match="'x' must have at least 1 dimension"):
        m(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(TypeError, match="'x' must be a torch.Tensor, got list"):
        m([1.0] * d)


def test_bad_input_more():
    """Checks test_bad_input leaves out, each the only one that stops its case: w_gate_up's d_model
    not x's (with a w_down that agrees with w_gate_up), more than MAX_EXPERTS experts, and integer
    routing weights."""
    from warpforge.ops.moe import MAX_EXPERTS
    x, w1, w2, wts, ids = _inputs(5, 16, 8, 4, 2, torch.float32)
    big = MAX_EXPERTS + 1
    cases = [
        ((x, randn(4, 16, 32), randn(4, 32, 8), wts, ids), ValueError,
         "'w_gate_up' has shape \\(4, 16, 32\\); expected \\(n_experts, 2 \\* expert_dim, 16\\)"),
        ((x, torch.zeros(big, 2, 16, device=DEVICE), torch.zeros(big, 16, 1, device=DEVICE), wts, ids), ValueError,
         f"{big} experts; at most {MAX_EXPERTS}"),
        ((x, w1, w2, torch.ones(5, 2, dtype=torch.int64, device=DEVICE), ids), TypeError, "'topk_weights' has dtype int64"),
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            moe_experts(*args)


def test_strided_routing_tensors():
    """int32 topk_ids and float32 topk_weights as strided views (every other column of a wider
    buffer): the two dtypes moe_experts hands to the kernels unconverted, so it must still make
    them contiguous (the kernels index them as flat arrays)."""
    T, d, n, E, k = 9, 16, 16, 6, 2
    x, w1, w2, _, _ = _inputs(T, d, n, E, k, torch.float32)
    ids = torch.rand(T, E, device=DEVICE).topk(2 * k, -1).indices.int()[:, ::2]
    wts = torch.softmax(torch.randn(T, 2 * k, device=DEVICE), -1)[:, ::2]
    assert not ids.is_contiguous() and not wts.is_contiguous()
    with torch.no_grad():
        out = moe_experts(x, w1, w2, wts, ids)
    assert_close(out, moe_experts_reference(x.double(), w1.double(), w2.double(), wts.double(), ids), torch.float32)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's swapped-kernel boxes (test_swapped_decode_kernels covers the GPU)")
def test_swapped_decode_row_boundaries(monkeypatch):
    """The swapped decode kernels (forced on, as in test_swapped_decode_kernels) at the row counts
    where a tile's passes change: one row past the short token box (TM + 1: the tile takes the TW
    passes) and one past the first TW pass (TW + 1: a second pass for one real row), in the first
    and in a later row tile of an expert; x stored transposed (the gather reads unit-stride
    columns, so moe_experts must hand it a unit-stride copy)."""
    import warpforge.ops.moe as M

    tm, tw = M._swap_config("up")[:2]
    block_m = 2 * tw
    counts = [tm + 1, tw + 1, 0, block_m + tm + 1, block_m + tw + 1]
    E, d, n = len(counts), 16, 16
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel())].to(DEVICE)[:, None]
    _, w1, w2, wts, ids = _inputs(ids.shape[0], d, n, E, 1, torch.float32, ids)
    x = randn(d, ids.shape[0]).T                                  # column stride T
    calls = []
    real = M._gemm_swap
    monkeypatch.setattr(M, "_gemm_swap", lambda *a, **kw: (calls.append(kw["epi"]), real(*a, **kw))[1])
    monkeypatch.setattr(M, "_SWAP_INTERP", True)
    monkeypatch.setattr(M, "moe_block_m", lambda *a: block_m)
    with torch.no_grad():
        out = moe_experts(x, w1, w2, wts, ids)
        ref = moe_experts_reference(x.double(), w1.double(), w2.double(), wts.double(), ids)
    assert calls == [1, 0], "the swapped kernels ran (gate/up, then down)"
    assert_close(out, ref, torch.float32, what="out")


def test_combine_sums_choices_in_order():
    """The combine adds a token's k rows in choice order j = 0, 1, ... in fp32. With expert outputs
    that every kernel computes exactly (integer x, w_gate_up in quarters, a one-hot w_down), a
    choice's row is what the k = 1 call returns, so the k = 3 output is those summed in that order,
    bit for bit (any other order rounds differently somewhere)."""
    T, d, n, E, k = 12, 16, 16, 5, 3
    x = torch.randint(-2, 3, (T, d), device=DEVICE).float()
    w1 = torch.randint(-2, 3, (E, 2 * n, d), device=DEVICE).float() / 4
    w2 = torch.zeros(E, d, n, device=DEVICE).scatter_(2, torch.randint(0, n, (E, d, 1), device=DEVICE), 1.0)
    ids = torch.rand(T, E, device=DEVICE).topk(k, -1).indices.int()
    wts = torch.randn(T, k, device=DEVICE)
    with torch.no_grad():
        out = moe_experts(x, w1, w2, wts, ids)
        rows = [moe_experts(x, w1, w2, wts[:, j:j + 1].contiguous(), ids[:, j:j + 1].contiguous()) for j in range(k)]
    assert torch.equal(out, (rows[0] + rows[1]) + rows[2])


def test_routing_weight_gradient_kept_in_fp32():
    """bf16 experts, routing weights' gradient: dw = g . h is summed and kept in fp32 (the
    operator returns it in fp32). With integer inputs every bf16 intermediate it reads (z, g) is
    exact, so it matches the float64 reference to fp32 precision, far below bf16's rounding."""
    T, d, n, E, k = 8, 16, 16, 4, 2
    x = torch.randint(-2, 3, (T, d), device=DEVICE).bfloat16()
    w1 = torch.randint(-1, 2, (E, 2 * n, d), device=DEVICE).bfloat16()
    w2 = torch.randint(-1, 2, (E, d, n), device=DEVICE).bfloat16()
    ids = torch.rand(T, E, device=DEVICE).topk(k, -1).indices.int()
    wts = torch.softmax(torch.randn(T, k, device=DEVICE), -1).requires_grad_()
    dout = torch.randint(-2, 3, (T, d), device=DEVICE).bfloat16()
    moe_experts(x, w1, w2, wts, ids).backward(dout)
    ref_wts = wts.detach().double().requires_grad_()
    moe_experts_reference(x.double(), w1.double(), w2.double(), ref_wts, ids).backward(dout.double())
    assert rel_err(wts.grad, ref_wts.grad) < 1e-4


def test_backward_needs_saved_preactivations():
    """The forward operator called with save_z=False (moe_experts' inference call) keeps no
    pre-activations: a backward through it must raise rather than read an empty z."""
    x, w1, w2, wts, ids = _inputs(6, 16, 8, 3, 2, torch.float32)
    out = moe_experts_op(x, w1, w2, wts, ids, 16, False)[0]
    with pytest.raises(RuntimeError, match="save_z=False"):
        out.sum().backward()


def test_opcheck_inference():
    """opcheck of the forward operator as an inference call runs it (save_z=False: z is (0, 2n))."""
    x, w1, w2, wts, ids = _inputs(7, 16, 16, 3, 2, torch.float32)
    torch.library.opcheck(moe_experts_op.overload, (x.detach(), w1.detach(), w2.detach(), wts.detach(), ids, 16, False),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("T", [10, 0])
def test_backward_fake_layout_with_transposed_weights(T):
    """The backward operator's fake gives the gradients the layout the real one allocates
    (contiguous) when the weights are stored transposed, with tokens and with none (an early
    return). The fake used to keep their strides (empty_like), and so did the zero-token return
    (zeros_like): torch.compile's backward failed its stride assertion on such weights."""
    d, n, E, k = 32, 24, 5, 2
    x = randn(T, d)
    w1, w2 = _transposed_weights(E, d, n)
    ids = torch.rand(T, E, device=DEVICE).topk(k, -1).indices.int()
    wts = torch.softmax(torch.randn(T, k, device=DEVICE), -1)
    out, z, sorted_slot, slot_pos, tile_expert, start, _ = moe_experts_op.overload(x, w1, w2, wts, ids, 16, True)
    torch.library.opcheck(moe_experts_bwd_op.overload,
                          (torch.randn_like(out), x, w1, w2, wts, z, sorted_slot, slot_pos, tile_expert, start, 16),
                          test_utils=("test_schema", "test_faketensor"))


def test_compile_backward_no_tokens_transposed_weights():
    """torch.compile(fullgraph=True) of a zero-token batch (an expert-parallel rank that got no
    tokens) with transposed weights: the compiled backward's stride assertion on dW must hold."""
    d, n, E, k = 32, 24, 5, 2
    x = randn(0, d, requires_grad=True)
    w1, w2 = _transposed_weights(E, d, n, grad=True)
    ids = torch.zeros(0, k, device=DEVICE, dtype=torch.int32)
    wts = torch.zeros(0, k, device=DEVICE, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(lambda *a: moe_experts(*a, validate=False), fullgraph=True)(x, w1, w2, wts, ids)
    out.sum().backward()
    assert torch.count_nonzero(w1.grad) == 0 and torch.count_nonzero(w2.grad) == 0
    assert w1.grad.shape == w1.shape and w2.grad.shape == w2.shape


# ----------------------------------------------------------------------------------------------
# GPU-only guards from a mutation audit of ops/moe.py (NOTES items 141, 145): three of these tests
# each fail on a planted bug the interpreter cannot show; the one-program alignment's is exact only
# ----------------------------------------------------------------------------------------------
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_count_kernel_drops_negative_ids(monkeypatch, dtype):
    """Guards _moe_count_kernel's ``ids >= 0`` (mutant: ``ok = (offs < S) & (ids < E)``). Slots of
    negative ids (-1: dropped, e.g. tokens of another expert-parallel rank; any negative int32 with
    validate=False) must not be counted, in the three-launch alignment that runs above the
    one-program limits (T * k = 3600 > MOE_ALIGN_ONE_MAX). Why only a GPU shows it: the
    interpreter's histogram (np.histogram over [0, NB)) ignores negative values, while the
    compiled tl.histogram bins a value by its low log2(max(NB, 32)) bits (ballots per bit,
    HistogramOpToLLVM). -1 lands in bin 31 >= E (here E = 12, NB = 16, 32 bins), which the store
    drops, so -1 alone cannot catch the mutant either: ids congruent to a real expert mod 32
    (e - 32, e - 160, -2^31 -> bin 0) are counted for that expert. The padded layout is checked
    exactly (counts, starts, tile owners, rows; a miscount leaves -1 rows inside an expert's
    range), then forward and every gradient against the float64/float32 loop with those slots
    dropped (their routing weights' gradient exactly zero). float32 takes the pointer kernels,
    bfloat16 the Hopper ones where present. int64 ids are not used: moe_experts clamps unchecked
    int64 ids to [-1, E], which the histogram drops anyway."""
    import warpforge.ops.moe as M

    T, d, n, E, k = 1200, 256, 128, 12, 3
    assert T * k > M.MOE_ALIGN_ONE_MAX                       # count, offsets and scatter kernels
    x, w1, w2, wts, ids = _inputs(T, d, n, E, k, dtype)
    bins = max(32, 1 << E.bit_length())                      # the compiled histogram's bins (NB >= E + 1)
    pool = ([-1, E, E + 9, 2**31 - 1, -2**31, -2**31 + 7] + [e - bins for e in range(E)]
            + [e - 5 * bins for e in range(0, E, 2)])
    pool = torch.tensor(pool, dtype=torch.int32)
    drop = torch.rand(T, k) < 0.3
    bad = ids.cpu().clone()
    bad[drop] = pool[torch.randint(0, pool.numel(), (int(drop.sum()),))]
    bad, drop = bad.to(DEVICE), drop.to(DEVICE)

    for block_m in (16, 64):                                 # the layout alone, two tile heights
        _assert_align(M._align(bad.view(-1), E, block_m), _align_want(bad, E, block_m), f"_align, block_m {block_m}")

    layouts = []
    real = M._align
    monkeypatch.setattr(M, "_align", lambda *a, **kw: layouts.append(real(*a, **kw)) or layouts[-1])
    out = moe_experts(x, w1, w2, wts, bad, validate=False)
    assert len(layouts) == 1
    block_m = layouts[0][0].numel() // layouts[0][2].numel()
    _assert_align(layouts[0], _align_want(bad, E, block_m), f"the forward's layout (block_m {block_m})")
    dout = torch.randn_like(out)
    out.backward(dout)
    keep = wts.detach().masked_fill(drop, 0.0)
    leaves = [t.detach().double().requires_grad_() for t in (x, w1, w2)] + [keep.double().requires_grad_()]
    ref = moe_experts_reference(*leaves, bad.clamp(0, E - 1))
    ref.backward(dout.double())
    assert_close(out, ref, dtype, what="out")
    for name, t, r in zip(("dx", "dw_gate_up", "dw_down"), (x, w1, w2), leaves):
        assert_close(t.grad, r.grad, dtype, scale=2, what=name)
    assert torch.count_nonzero(wts.grad[drop]) == 0, "a dropped slot's routing weight got a gradient"
    assert_close(wts.grad[~drop], leaves[3].grad[~drop], dtype, scale=2, what="dweights")


@gpu_only
def test_align_one_program_exact():
    """The one-program alignment (_moe_align_one_kernel) exact against the host construction over
    five shapes that stress its -1 fill: one pass holding every real row (E = 8, up to S = 1,000),
    two passes (E = 60), five (E = 32, 64-row tiles), and up to 17 or 33 passes of 256 or 128
    lanes where every expert gets at most one slot, so the real rows (the first of each expert's
    tile) reach into the late passes; ids -1 and E among them (dropped slots).

    It was written for the tl.debug_barrier() between the fill and the real rows' store: without
    it a warp that lags could write -1 over a real row another warp already stored (the compiled
    sm_90 PTX then has no bar.sync between the two). On an H200 that mutant passed this test in 3
    of 3 runs (NOTES item 145): the warps leave the sort's last barrier together and each issues its
    fill before its own real rows, so a warp would have to lag by a whole fill loop. So this test
    does not guard the barrier; it guards the layout, and only a GPU runs the compiled kernel's
    histogram and sort."""
    import warpforge.ops.moe as M

    cases = [((520, 1000), 8, 16, "random"), ((520, 1024), 60, 16, "random"), ((257, 512), 32, 64, "random"),
             ((129, 256), 256, 16, "one each"), ((65, 128), 128, 32, "one each")]
    g = torch.Generator().manual_seed(7)
    runs = []
    for (lo, hi), E, block_m, routing in cases:
        for _ in range(16):
            S = int(torch.randint(lo, hi + 1, (1,), generator=g))
            assert S <= M.MOE_ALIGN_ONE_MAX and S * E <= M.MOE_ALIGN_ONE_WORK     # the one-program path
            if routing == "random":
                ids = torch.randint(-1, E + 1, (S,), generator=g, dtype=torch.int32)
            else:
                ids = torch.randperm(E, generator=g)[:S].int()
                ids[torch.rand(S, generator=g) < 0.1] = -1
            runs.append((f"S {S}, E {E}, block_m {block_m}", M._align(ids.to(DEVICE), E, block_m),
                         _align_want(ids, E, block_m)))
    failures = []
    for what, got, want in runs:
        try:
            _assert_align(got, want, what)
        except AssertionError as err:
            failures.append(str(err))
    assert not failures, f"{len(failures)} of {len(runs)} alignments wrong; first: {failures[0]}"


@gpu_only
@pytest.mark.skipif(not ON_HOPPER, reason="the TMA kernels need an sm_90+ GPU")
@pytest.mark.parametrize("layout", ["transposed", "strided columns"])
def test_tma_backward_noncontiguous_grad(monkeypatch, layout):
    """Guards the ``dout.contiguous()`` in _bwd_impl (mutant: dout passed as it comes). The Hopper
    backward gathers dout's rows with _gather_rows, which honours the row stride only (columns
    unit-stride), so an upstream gradient whose last dim is strided -- a transposed buffer,
    strides (1, T), or every other column, (2d, 2) -- is read wrongly without the copy; the
    pointer kernels take both strides and never show it, and the interpreter never takes the TMA
    path. Forward and backward on a TMA-path shape (bf16, d = 256, 2n = 384, 128-row tiles),
    the gradient checked to reach the backward operator non-contiguous and the TMA backward
    checked to run, every gradient against the float64/float32 loop."""
    import warpforge.ops.moe as M

    T, d, n, E, k = 640, 256, 192, 8, 2
    dtype = torch.bfloat16
    monkeypatch.setattr(M, "moe_block_m", lambda *a: 128)
    seen, calls = [], []
    real_op, real_wgrad = M.moe_experts_bwd_op, M._wgrad_tma
    monkeypatch.setattr(M, "moe_experts_bwd_op", lambda *a: (seen.append(a[0].stride()), real_op(*a))[1])
    monkeypatch.setattr(M, "_wgrad_tma", lambda *a, **kw: (calls.append(1), real_wgrad(*a, **kw))[1])
    x, w1, w2, wts, ids = _inputs(T, d, n, E, k, dtype)
    out = moe_experts(x, w1, w2, wts, ids)
    dout = randn(d, T, dtype=dtype).t() if layout == "transposed" else randn(T, 2 * d, dtype=dtype)[:, ::2]
    assert dout.shape == out.shape and dout.stride(-1) != 1
    out.backward(dout)
    assert seen and seen[0][-1] != 1, f"the gradient reached the backward operator with strides {seen}"
    assert calls, "the TMA backward ran"
    leaves = [t.detach().double().requires_grad_() for t in (x, w1, w2, wts)]
    moe_experts_reference(*leaves, ids).backward(dout.double())
    for name, t, r in zip(("dx", "dw_gate_up", "dw_down", "dweights"), (x, w1, w2, wts), leaves):
        assert_close(t.grad, r.grad, dtype, scale=2, what=name)


@gpu_only
@pytest.mark.skipif(not ON_HOPPER, reason="the TMA kernels need an sm_90+ GPU")
@pytest.mark.parametrize("config", ["pointer stores, one program", "shipped"])
@pytest.mark.parametrize("block_m", [128, 64])
def test_tma_wgrad_partial_tiles(monkeypatch, block_m, config):
    """Guards the row and column masks of _moe_wgrad_tma_kernel's pointer store (its STORE_SPLIT ==
    0 branch; mutant: the mask removed). The weight gradients' column count is n for dW_down and
    d for dW_gate_up; with n = 320 and d = 384 the last column tile of a 256-column (block_m 128)
    or 128-column (decode) tile is partial, and an unmasked store writes its columns past N --
    exact zeros, the TMA boxes' fill -- over the first columns of the next row (of the next
    expert, past the last one's end). "pointer stores, one program": the wgrad config's
    store_split forced to 0 (the shipped 128-row config stores by TMA, store_split 2; the decode
    one already stores by pointers) and the kernel run as one persistent program, so tile (m, 1)
    is stored after tile (m, 0) (grouped order: column 0 of an expert's row tiles first) and the
    zeros land over values already written: caught every run, not by a race. "shipped": the
    configs as tuned (TMA stores at 128 rows; at 64 rows pointer stores, one program a tile,
    where the mutant is caught when a partial tile stores after its neighbour). Only a GPU:
    the interpreter never takes the TMA path. Outputs start NaN (conftest's poison), so an
    element no tile writes fails too."""
    import dataclasses

    import warpforge.ops.moe as M

    T, d, n, E, k = 512, 384, 320, 4, 2
    dtype = torch.bfloat16
    monkeypatch.setattr(M, "moe_block_m", lambda *a: block_m)
    monkeypatch.setattr(M, "_TMA_DECODE_MIN_WEIGHTS", 0)
    used = []
    real_cfg, real_wgrad = M.moe_tma_config, M._wgrad_tma

    def tma_config(kind, bm=128):
        cfg = real_cfg(kind, bm)
        if kind == "wgrad":
            if config != "shipped":
                cfg = (dataclasses.replace(cfg[0], store_split=0), 1, False, False)
            used.append(cfg[0])
        return cfg

    def one_program(*a, **kw):
        with monkeypatch.context() as mp:
            mp.setattr(M, "sm_count", lambda: 1)
            return real_wgrad(*a, **kw)

    monkeypatch.setattr(M, "moe_tma_config", tma_config)
    if config != "shipped":
        monkeypatch.setattr(M, "_wgrad_tma", one_program)
    _check(*_inputs(T, d, n, E, k, dtype), dtype)
    assert len(used) == 2, "the TMA weight gradients ran (dW_down, dW_gate_up)"
    if config != "shipped":
        assert all(c.store_split == 0 for c in used)
        assert any(N % c.block_n for N in (n, d) for c in used), "a partial column tile"
