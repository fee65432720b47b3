"""matmul / linear: every rung of the ladder, every dtype, odd shapes, any layout, batching, split-K,
the TMA kernel, the fused epilogue, autograd, torch.compile, opcheck, bad input, the tuning cache.

Tolerances. The reference is float64 on the same inputs, so the error is the kernel's fp32
accumulation plus the one rounding of the output to its dtype. Observed under the interpreter
(K up to 4097): fp32 <= 2.5e-7, fp16 <= 3.5e-4, bf16 <= 4.5e-3 (the interpreter truncates
fp32 -> bf16: ~2x the GPU's rounding); on an H200, every variant at shapes up to 4097^2 x 255:
fp32 <= 1.2e-6 (K = 4097), fp16 <= 2.7e-4, bf16 <= 2.4e-3. conftest's TOL (2e-5, 3e-3, 2e-2) sits
>= 4x above all of those, so scale 1 holds for forwards; gradients (two matmuls, plus a sum over
broadcast batch dims or an activation derivative taken from the rounded pre-activation) get
scale 2, as elsewhere. fp32 is
exact IEEE FMA unless torch.backends.cuda.matmul.allow_tf32 is set (off by default, and every
test here but ``test_tf32`` leaves it so).
"""
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

import warpforge
import warpforge.ops.matmul as mm
from warpforge.ops.matmul import (ACTIVATIONS, VARIANTS, _Epilogue, _launch_tiled, _launch_tma, linear,
                                  linear_op, linear_reference, matmul, matmul_op, matmul_reference)
from warpforge.runtime import tuning
from warpforge.runtime.device import DeviceInfo
from warpforge.runtime.heuristics import MATMUL_NAIVE, MatmulConfig
from conftest import DTYPES, ON_GPU, DEVICE, SHARED_MEMORY, TOL, assert_close, gpu_only, noncontig, randn, rel_err

big = ON_GPU
# (M, N, K): 1s, primes, 255, 4097. A dim of 4097 costs 0.5-2 s a call on the CPU interpreter, so
# there it has tests of its own (test_long_k, test_long_m_and_n); on a GPU every variant sees it.
SHAPES = [(1, 7, 33), (17, 33, 45), (5, 9, 70), (33, 1, 255), (17, 33, 1), (255, 17, 33)]
if big:
    SHAPES += [(1, 17, 4097), (255, 255, 255), (4097, 17, 255), (17, 4097, 4097), (255, 4097, 1),
               (1, 4097, 4097), (1024, 1024, 1024), (4097, 255, 4097)]


def _leaf(t):
    """A float64 copy of t that collects its own gradient."""
    return None if t is None else t.detach().double().requires_grad_()


def _ref(a, b):
    return torch.matmul(a.detach().double(), b.detach().double())


@pytest.fixture(autouse=True)
def _private_tuning_cache(tmp_path, monkeypatch):
    """No test reads or writes the user's tuning cache (GPU runs of "autotuned" store winners)."""
    monkeypatch.setenv("WARPFORGE_CACHE", str(tmp_path / "cache"))
    tuning.forget()
    yield
    tuning.forget()


@pytest.fixture
def launches(monkeypatch):
    """Records (kernel, config) of every launch: "tiled" (pointer kernel) or "tma" (persistent)."""
    seen = []
    for name in ("_launch_tiled", "_launch_tma"):
        real = getattr(mm, name)

        def spy(a, b, out, ep, cfg, plan=None, _real=real, _kind=name.removeprefix("_launch_")):
            seen.append((_kind, cfg))
            return _real(a, b, out, ep, cfg, plan)

        monkeypatch.setattr(mm, name, spy)
    return seen


def _lock_counters_zero() -> bool:
    return all(int(buf.abs().sum()) == 0 for buf in mm._LOCKS.values())


# ----------------------------------------------------------------------------------------------
# The ladder: every variant x every dtype x odd shapes
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_variants(mnk, dtype, variant):
    m, n, k = mnk
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
    c = matmul(a, b, variant=variant)
    assert c.dtype == dtype and c.shape == (m, n) and c.device == a.device
    assert_close(c, _ref(a, b), dtype, what=f"{variant} {mnk}")
    assert _lock_counters_zero()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["auto", "grouped"])
def test_long_k(variant, dtype, launches):
    """K = 4097: 65 K-steps with a ragged tail. At M = 5 "auto" splits K (8 ways on the interpreter's
    4 stand-in SMs, 16 on a 132-SM GPU) and the last program to arrive sums the partials."""
    a, b = randn(5, 4097, dtype=dtype), randn(4097, 17, dtype=dtype)
    assert_close(matmul(a, b, variant=variant), _ref(a, b), dtype, what=variant)
    if dtype != torch.float32:     # (the heuristic splits 16-bit operands only, since 5aacb8e)
        assert (launches[0][1].split_k > 1) == (variant == "auto"), launches
    assert _lock_counters_zero()


def test_long_m_and_n():
    """4097 output rows, then 4097 output columns: many tiles, ragged last tile (CPU-sized)."""
    for m, n, k in ((4097, 1, 17), (1, 4097, 17)):
        a, b = randn(m, k, dtype=torch.float16), randn(k, n, dtype=torch.float16)
        assert_close(matmul(a, b), _ref(a, b), torch.float16, what=f"{(m, n, k)}")


def test_variant_routing(launches):
    """Each name reaches the kernel it promises, so the ladder tests above exercise every kernel."""
    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    h = torch.float16
    a, b = randn(24, 56, dtype=h), randn(56, 40, dtype=h)          # 16-byte aligned rows: TMA-able
    matmul(a, b, variant="persistent")
    matmul(a, b, variant="naive")
    matmul(randn(5, 4097, dtype=h), randn(4097, 9, dtype=h), variant="splitk")
    matmul(randn(7, 33, dtype=h), randn(33, 9, dtype=h), variant="persistent")   # 66-byte rows: no TMA
    matmul(randn(300, 56, dtype=h), b)                                           # auto, M > 256: TMA
    matmul(randn(2, 7, 56, dtype=h), randn(2, 56, 40, dtype=h), variant="persistent")   # batched: pointer
    kinds = [k for k, _ in launches]
    assert kinds == ["tma", "tiled", "tiled", "tiled", "tma", "tiled"], kinds
    assert launches[1][1] == MATMUL_NAIVE
    assert launches[2][1].split_k > 1, launches[2][1]
    assert _lock_counters_zero()


# ----------------------------------------------------------------------------------------------
# Layouts: transposed operands, strided rows, no unit stride at all
# ----------------------------------------------------------------------------------------------
def _operands(layout, m, n, k, dtype):
    if layout == "a_t":
        return randn(k, m, dtype=dtype).T, randn(k, n, dtype=dtype)
    if layout == "b_t":                                    # weight-style (N, K) storage
        return randn(m, k, dtype=dtype), randn(n, k, dtype=dtype).T
    if layout == "both_t":
        return randn(k, m, dtype=dtype).T, randn(n, k, dtype=dtype).T
    if layout == "rows":                                   # row stride 2K (resp. 2N)
        return noncontig(randn(m, k, dtype=dtype)), noncontig(randn(k, n, dtype=dtype))
    if layout == "no_unit":                                # strides (2K, 2), (2N, 2)
        return randn(m, 2 * k, dtype=dtype)[:, ::2], randn(k, 2 * n, dtype=dtype)[:, ::2]
    raise AssertionError(layout)


LAYOUTS = ["a_t", "b_t", "both_t", "rows", "no_unit"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mnk", [(17, 33, 45), (24, 40, 56)], ids=["odd", "aligned"])
def test_layouts(mnk, layout, variant):
    """Odd shapes take the pointer kernel; aligned ones (rows a multiple of 16 bytes) also the TMA
    kernel (``persistent``) for every layout that has a unit-stride dim."""
    dtype = torch.float16
    a, b = _operands(layout, *mnk, dtype)
    if layout == "no_unit":
        assert a.stride(-1) != 1 and a.stride(-2) != 1
    c = matmul(a, b, variant=variant)
    assert_close(c, _ref(a, b), dtype, what=f"{variant} {layout}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_backward(layout, dtype):
    a, b = _operands(layout, 17, 33, 45, dtype)
    a.requires_grad_()
    b.requires_grad_()
    c = matmul(a, b)
    dc = randn(*c.shape, dtype=dtype)
    da, db = torch.autograd.grad(c, (a, b), dc)
    ar, br = _leaf(a), _leaf(b)
    (ar @ br).backward(dc.double())
    assert da.dtype == dtype and db.dtype == dtype
    assert_close(da, ar.grad, dtype, scale=2.0, what="da")
    assert_close(db, br.grad, dtype, scale=2.0, what="db")


# ----------------------------------------------------------------------------------------------
# Split-K, forced, and the TMA kernel, launched directly
# ----------------------------------------------------------------------------------------------
SPLIT_CFG = MatmulConfig(16, 32, 16, group_m=1, num_stages=1, num_warps=4, split_k=3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mnk,split", [((19, 40, 117), 3),     # 8 K-steps: 3 + 3 + 2, the last ragged; 2 x 2 tiles
                                       ((16, 33, 128), 3),     # EVEN_K: 8 full steps
                                       ((5, 33, 40), 5)],      # 3 K-steps over 5 splits: 2 empty ones
                         ids=["ragged", "even", "empty_splits"])
def test_split_k_forced(mnk, split, dtype):
    import dataclasses
    m, n, k = mnk
    cfg = dataclasses.replace(SPLIT_CFG, split_k=split)
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
    outs = []
    for _ in range(2):
        out = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
        _launch_tiled(a, b, out, _Epilogue(out), cfg)
        outs.append(out)
        assert _lock_counters_zero(), "split-K arrival counters not reset for the next call"
    assert mm._LOCKS, "split-K never allocated its arrival counters"
    assert_close(outs[0], _ref(a, b), dtype, what=f"split {split}")
    assert torch.equal(outs[0], outs[1]), "split-K is not deterministic"


@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
def test_split_k_epilogue(act):
    """bias, activation, residual and the saved pre-activation from the last-arriving program."""
    m, n, k = 19, 45, 117
    dtype = torch.float16
    a, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype)
    bias, res = randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    out = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
    z = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
    _launch_tiled(a, w.T, out, _Epilogue(out, bias, res, z, ACTIVATIONS[act]), SPLIT_CFG)
    zr = _ref(a, w.T) + bias.double()
    assert_close(z, zr, dtype, what="pre-activation")
    assert_close(out, mm._act_reference(zr, act) + res.double(), dtype, what="output")
    assert _lock_counters_zero()


def test_split_k_batched():
    """A batched launch runs unsplit whatever the config's split_k: the workspace and arrival
    counters are indexed per tile, not per batch entry, so two entries splitting one tile's K range
    would sum each other's partials. (No default config splits the batched tests' problems: their
    K is one step deep, so only a forced config reaches this.)"""
    a, b = randn(2, 19, 117), randn(2, 117, 40)
    out = torch.full((2, 19, 40), float("nan"), device=DEVICE)
    # the interpreter runs a tile's K-splits back to back, so a batched split would still sum
    # right here: the launch geometry is what shows it (on a GPU the entries race on the counters)
    grid, _, shared = mm._tiled_geometry(a, b, out, _Epilogue(out), SPLIT_CFG)
    assert grid == (2 * 2 * 2, 1) and shared == (0, 0), (grid, shared)
    _launch_tiled(a, b, out, _Epilogue(out), SPLIT_CFG)
    assert_close(out, _ref(a, b), torch.float32, what="batched, split-K config")
    assert _lock_counters_zero()


@pytest.mark.parametrize("group_m", [3, 8])
def test_grouped_launch_order(group_m):
    """GROUP_M > 1 in the pointer kernel over an 11 x 5 grid of 16 x 16 tiles: the last group of
    tile-rows is ragged (2 rows of 3, 3 of 8), so tile coordinates that take that group as full,
    or step its columns by GROUP_M instead of its rows, compute some tiles twice and leave others
    unwritten (NaN). On the test shapes the pointer kernel's default configs are one tile wide
    under the interpreter, so only a forced config reaches this in that kernel."""
    m, n, k = 170, 75, 13
    cfg = MatmulConfig(16, 16, 16, group_m=group_m, num_stages=1, num_warps=4)
    a, b = randn(m, k), randn(k, n)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    _launch_tiled(a, b, out, _Epilogue(out), cfg)
    assert_close(out, _ref(a, b), torch.float32, what=f"GROUP_M={group_m}")


def test_pointer_store_stays_inside_the_output():
    """The pointer epilogue's row and column masks: the output is a view into a NaN-poisoned
    buffer with 8 more rows and columns (ragged against the 16 x 32 tile both ways), so a store one
    row or column too far lands in the poison instead of past an allocation's end."""
    m, n, k = 40, 72, 48
    a, b = randn(m, k, dtype=torch.float16), randn(k, n, dtype=torch.float16)
    big = torch.full((m + 8, n + 8), float("nan"), device=DEVICE, dtype=torch.float16)
    out = big[:m, :n]
    _launch_tiled(a, b, out, _Epilogue(out), MatmulConfig(16, 32, 16, group_m=2, num_stages=1, num_warps=4))
    assert_close(out, _ref(a, b), torch.float16)
    assert big[m:].isnan().all() and big[:, n:].isnan().all(), "a pointer store wrote past the output's edge"


TMA_CFG = MatmulConfig(16, 16, 16, group_m=2, num_stages=1, num_warps=4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_t", [False, True], ids=["a_n", "a_t"])
@pytest.mark.parametrize("b_t", [False, True], ids=["b_n", "b_t"])
def test_tma_kernel(b_t, a_t, dtype):
    """(24, 40, 56): 16-byte aligned, ragged against 16 in every dim; 6 tiles over min(6, SMs)
    persistent programs (4 on the interpreter: some programs take two tiles)."""
    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    m, n, k = 24, 40, 56
    a = randn(k, m, dtype=dtype).T if a_t else randn(m, k, dtype=dtype)
    b = randn(n, k, dtype=dtype).T if b_t else randn(k, n, dtype=dtype)
    assert mm._tma_view(a, m, k)[0] == a_t and mm._tma_view(b, k, n)[0] == b_t
    out = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
    _launch_tma(a, b, out, _Epilogue(out), TMA_CFG)
    assert_close(out, _ref(a, b), dtype)


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tma_store_epilogue(split, dtype):
    """TMA stores of the finished tile (whole, or in two column slices): (40, 72) is ragged against
    the 16 x 32 tile in both dims, so the hardware's clipping of the edge boxes is what keeps the
    poison around the output intact; the epilogue (bias, SiLU, residual, pre-activation) runs first."""
    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    m, n, k = 40, 72, 48
    a, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype)
    bias, res = randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    cfg = dataclasses.replace(TMA_CFG, block_n=32, store_split=split)
    big = torch.full((m + 8, n + 8), float("nan"), device=DEVICE, dtype=dtype)
    out = big[:m, :n]                   # row stride n + 8 (16-byte aligned rows), poison beyond
    z = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
    assert mm._tma_store_ok(out)
    _launch_tma(a, w.T, out, _Epilogue(out, bias, res, z, ACTIVATIONS["silu"]), cfg)
    zr = _ref(a, w.T) + bias.double()
    assert_close(z, zr, dtype, what="pre-activation")
    assert_close(out, F.silu(zr) + res.double(), dtype, what="output")
    assert big[m:].isnan().all() and big[:, n:].isnan().all(), "a TMA store wrote past the output's edge"


@pytest.mark.parametrize("programs,split", [(5, 0), (13, 2), (4, 0)])
def test_stream_k(monkeypatch, programs, split):
    """Stream-K in the persistent kernel. 40 x 72 in 16 x 32 tiles is 9 tiles of 5 K-steps (K = 80):
    on 5 programs the last 4 tiles are shared out by K-steps after one whole wave; on 13 programs
    (more than the tiles) every tile is, ~3.5 steps a program, so a tile has up to 3 sharers; on 4
    programs, 1 tile. The epilogue runs once per tile on the sum of its partials (bias, SiLU,
    residual, pre-activation); a second call must give the same bits (the arrival counters reset,
    the partials summed in a fixed order)."""
    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    monkeypatch.setattr(mm, "sm_count", lambda *_: programs)
    m, n, k = 40, 72, 80
    dtype = torch.bfloat16
    a, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype)
    bias, res = randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    cfg = dataclasses.replace(TMA_CFG, block_n=32, store_split=split, stream_k=True)
    sk = mm._stream_k_split(9, 5, programs)
    assert sk is not None and sk[0] == {5: 4, 13: 9, 4: 1}[programs]
    outs = []
    for _ in range(2):
        out = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
        z = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
        _launch_tma(a, w.T, out, _Epilogue(out, bias, res, z, ACTIVATIONS["silu"]), cfg)
        zr = _ref(a, w.T) + bias.double()
        assert_close(z, zr, dtype, what="pre-activation")
        assert_close(out, F.silu(zr) + res.double(), dtype, what="output")
        outs.append(out)
    assert torch.equal(outs[0], outs[1]), "stream-K is not deterministic"
    assert mm._split_locks(a.device, 16)[:16].eq(0).all(), "an arrival counter was left set"


def test_stream_k_split():
    """Which tiles stream-K shares: the remainder of whole waves, all tiles below one wave, none
    when the waves are whole or K is a single step."""
    assert mm._stream_k_split(512, 64, 132) == (116, 3)        # 4096^3 in 128 x 256 tiles: 56 steps a program
    assert mm._stream_k_split(112, 64, 132) == (112, 3)        # 128 x 14336 x 4096 in 128 x 128
    assert mm._stream_k_split(264, 64, 132) is None
    assert mm._stream_k_split(100, 1, 132) is None


def test_fit_stages():
    """Pipeline stages that fit shared memory beside the epilogue's staging of the output tile
    (the sizes read off compiled sm_90 kernels, in _fit_stages' docstring). The interpreter ignores
    num_stages, so only this check sees a wrong count, which on Hopper fails to compile or runs
    shallower than it could."""
    cfg = MatmulConfig(128, 256, 64, num_stages=4, num_warps=8)
    assert mm._fit_stages(cfg, 2, 2).num_stages == 4          # 4 x 48 KB + 32 KB = 229,376 B
    assert mm._fit_stages(cfg, 2, 4).num_stages == 2          # fp32 output: 128 KB of staging
    fp8 = dataclasses.replace(cfg, block_k=128)
    assert mm._fit_stages(fp8, 1, 4).num_stages == 2          # fp8 in, fp32 out: 2 stages, not 4
    assert mm._fit_stages(fp8, 1, 2).num_stages == 4
    assert mm._fit_stages(dataclasses.replace(cfg, store_split=2), 2, 2).num_stages == 4   # half-tile TMA slices
    assert mm._fit_stages(dataclasses.replace(cfg, store_split=1), 2, 2).num_stages == 3   # whole-tile: 64 KB
    assert mm._fit_stages(MatmulConfig(64, 64, 128, num_stages=6, num_warps=4), 2, 2).num_stages == 6
    # a smaller GPU's limit: an A100's 166,912 B, an sm_86/89 card's 101,376 B
    assert mm._fit_stages(cfg, 2, 2, 166_912).num_stages == 2    # 2 x 48 KB + 32 KB
    assert mm._fit_stages(cfg, 2, 2, 101_376).num_stages == 1


@gpu_only
@pytest.mark.parametrize("gpu", ["A100", "sm_86/89"])
def test_small_shared_memory_gpu(lower_shared_memory, monkeypatch, gpu):
    """As on a GPU with less shared memory a block than Hopper (Triton's limit lowered to an A100's
    or an sm_86/89 card's; no TMA, as there): _fit_stages sizes the pipeline for that limit, the
    pointer kernel loads, and every variant and dtype stays right."""
    monkeypatch.setattr(mm, "_tma_ok", lambda a, b: False)
    monkeypatch.setattr(mm, "_PLANS", {})
    lower_shared_memory(SHARED_MEMORY[gpu], mm._TILED)
    for m, n, k in ((1, 4096, 4096), (200, 4096, 1024), (4096, 4096, 1024), (1000, 333, 4097)):
        for dtype in (torch.bfloat16, torch.float32):
            a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
            for variant in ("auto", "grouped", "pipelined", "splitk"):
                assert_close(warpforge.matmul(a, b, variant=variant), _ref(a, b), dtype, what=f"{gpu} {m}x{n}x{k} {variant}")


def test_tiles_step_down_where_shared_memory_is_short(monkeypatch):
    """Where the plan's tile does not load (Triton refuses a kernel needing more shared memory than
    the GPU has; here a stand-in refuses tiles over 32 x 32 x 32), the first smaller tile of
    heuristics.gemm_configs runs, right, and the plan keeps it: a second call tries nothing else."""
    from triton.runtime.errors import OutOfResources
    from warpforge.runtime import launch as launch_mod
    monkeypatch.setattr(launch_mod, "_TOO_BIG", {})
    monkeypatch.setattr(mm, "_tma_ok", lambda a, b: False)
    monkeypatch.setattr(mm, "_PLANS", {})
    real, tried = mm._launch_tiled, []

    def refusing(a, b, out, ep, cfg, plan=None):
        tried.append(cfg)
        need = cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n
        if need > 2048:
            raise OutOfResources(need, 2048, "shared memory")
        return real(a, b, out, ep, cfg, plan)
    monkeypatch.setattr(mm, "_launch_tiled", refusing)
    a, b = randn(37, 45, dtype=torch.float32), randn(45, 70, dtype=torch.float32)
    for variant in ("grouped", "splitk"):
        tried.clear()
        assert_close(warpforge.matmul(a, b, variant=variant), _ref(a, b), torch.float32, what=variant)
        fit = tried[-1]
        assert len(tried) > 1 and fit.block_m * fit.block_k + fit.block_k * fit.block_n <= 2048, tried
        tried.clear()
        assert_close(warpforge.matmul(a, b, variant=variant), _ref(a, b), torch.float32, what=variant)
        assert tried in ([fit], []), tried        # [] on a GPU: the plan replays its compiled kernel
        assert fit in [plan[1] for plan in mm._PLANS.values()]


def test_tma_view_rejects(launches):
    """What TMA cannot read (_tma_view -> None): rows under 16 bytes (either orientation), and a
    base address that is not 16-byte aligned though the row stride is. The interpreter's TMA
    emulation reads them anyway, so the decision itself is checked, and that "persistent" then
    takes the pointer kernel, with the right values."""
    h = torch.float16
    rows16 = randn(64, 8, dtype=h)
    narrow = rows16[:, :4]                                 # 8-byte rows, 16-byte row stride
    shifted = randn(56, 48, dtype=h)[:, 1:41]              # 80-byte rows, 96-byte stride, base 2 bytes off
    assert mm._tma_view(rows16, 64, 8) == (False, [64, 8], [8, 1])       # 16-byte rows: readable
    for t in (narrow, narrow.T, shifted):
        assert mm._tma_view(t, *t.shape) is None, (t.shape, t.stride(), t.data_ptr() % 16)
    a = randn(24, 64, dtype=h)                             # TMA-readable itself
    for b in (narrow, shifted):
        aa = a[:, :b.shape[0]]
        assert_close(matmul(aa, b, variant="persistent"), _ref(aa, b), h, what=str(tuple(b.shape)))
    assert [kind for kind, _ in launches] == ["tiled", "tiled"], launches


def test_tma_store_falls_back_for_a_strided_output():
    """An output TMA cannot write (column-major here) takes the pointer epilogue, same values."""
    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    m, n, k = 24, 40, 32
    a, b = randn(m, k, dtype=torch.bfloat16), randn(k, n, dtype=torch.bfloat16)
    out = torch.full((n, m), float("nan"), device=DEVICE, dtype=torch.bfloat16).T
    assert not mm._tma_store_ok(out)
    _launch_tma(a, b, out, _Epilogue(out), dataclasses.replace(TMA_CFG, store_split=2))
    assert_close(out, _ref(a, b), torch.bfloat16)


def test_tma_kernel_epilogue_and_strided_output():
    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    m, n, k = 40, 24, 64
    dtype = torch.bfloat16
    a, w = noncontig(randn(m, k, dtype=dtype)), randn(n, k, dtype=dtype)
    bias, res = randn(n, dtype=dtype), randn(n, m, dtype=dtype).T     # column-major residual
    out = torch.full((n, m), float("nan"), device=DEVICE, dtype=dtype).T   # column-major output
    z = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
    _launch_tma(a, w.T, out, _Epilogue(out, bias, res, z, ACTIVATIONS["silu"]), TMA_CFG)
    zr = _ref(a, w.T) + bias.double()
    assert_close(z, zr, dtype, what="pre-activation")
    assert_close(out, F.silu(zr) + res.double(), dtype, what="output")


# ----------------------------------------------------------------------------------------------
# Batched and broadcast
# ----------------------------------------------------------------------------------------------
BATCHED = {
    "3d@3d": ((3, 7, 33), (3, 33, 9)),
    "broadcast": ((2, 1, 7, 33), (3, 33, 9)),
    "3d@2d": ((2, 3, 7, 33), (33, 9)),          # folds into M = 42
    "2d@3d": ((7, 33), (3, 33, 9)),
    "1_batch": ((1, 17, 45), (1, 45, 33)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(BATCHED))
def test_batched(case, dtype):
    sa, sb = BATCHED[case]
    a, b = randn(*sa, dtype=dtype, requires_grad=True), randn(*sb, dtype=dtype, requires_grad=True)
    c = matmul(a, b)
    ar, br = _leaf(a), _leaf(b)
    cr = torch.matmul(ar, br)
    assert c.shape == cr.shape and c.dtype == dtype
    assert_close(c, cr, dtype, what="forward")
    dc = randn(*c.shape, dtype=dtype)
    da, db = torch.autograd.grad(c, (a, b), dc)
    cr.backward(dc.double())
    assert da.shape == a.shape and db.shape == b.shape
    assert_close(da, ar.grad, dtype, scale=2.0, what="da")
    assert_close(db, br.grad, dtype, scale=2.0, what="db")


@pytest.mark.parametrize("variant", VARIANTS)
def test_batched_transposed_variants(variant):
    """Batch stride, transposed inner dims and a stride-0 (expanded) batch, on every variant."""
    a = randn(3, 45, 17).mT                          # (3, 17, 45), column-major per batch
    b = randn(45, 33).expand(3, 45, 33)               # batch stride 0
    c = matmul(a, b, variant=variant)
    assert_close(c, _ref(a, b), torch.float32, what=variant)


def test_batched_large():
    if not big:
        pytest.skip("GPU-sized shapes")
    for dtype in DTYPES:
        a, b = randn(4, 255, 4097, dtype=dtype), randn(4, 4097, 255, dtype=dtype)
        assert_close(matmul(a, b), _ref(a, b), dtype)


# ----------------------------------------------------------------------------------------------
# linear: the fused epilogue, forward and backward
# ----------------------------------------------------------------------------------------------
def _check_linear(x, w, bias, act, res, dtype, variant="auto", what=""):
    y = linear(x, w, bias, act, res, variant=variant)
    assert y.dtype == dtype and y.shape == (*x.shape[:-1], w.shape[0])
    leaves = [_leaf(t) for t in (x, w, bias, res)]
    xr, wr, br, rr = leaves
    yr = mm._act_reference(F.linear(xr, wr, br), act)
    if rr is not None:
        yr = yr + rr
    assert_close(y, yr, dtype, what=f"{what} forward")
    dy = randn(*y.shape, dtype=dtype)
    ins = [t for t in (x, w, bias, res) if t is not None and t.requires_grad]
    grads = torch.autograd.grad(y, ins, dy)
    yr.backward(dy.double())
    refs = [r.grad for t, r in zip((x, w, bias, res), leaves) if t is not None and t.requires_grad]
    for name, g, r in zip("x w bias residual".split(), grads, refs):
        assert g.dtype == dtype and g.shape == r.shape
        assert_close(g, r, dtype, scale=2.0, what=f"{what} d{name}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(ACTIVATIONS), ids=str)
def test_linear_all_fused(act, dtype):
    """(B, T, K) input; bias, activation and residual in one kernel; every gradient."""
    x = randn(2, 5, 45, dtype=dtype, requires_grad=True)
    w = randn(17, 45, dtype=dtype, requires_grad=True, scale=0.3)
    bias = randn(17, dtype=dtype, requires_grad=True)
    res = randn(2, 5, 17, dtype=dtype, requires_grad=True)
    _check_linear(x, w, bias, act, res, dtype, what=str(act))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("parts", ["plain", "bias", "residual", "act"])
def test_linear_parts(parts, dtype):
    x = randn(3, 7, 33, dtype=dtype, requires_grad=True)
    w = randn(9, 33, dtype=dtype, requires_grad=True, scale=0.3)
    bias = randn(9, dtype=dtype, requires_grad=True) if parts == "bias" else None
    res = randn(3, 7, 9, dtype=dtype, requires_grad=True) if parts == "residual" else None
    act = "gelu" if parts == "act" else None
    _check_linear(x, w, bias, act, res, dtype, what=parts)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mnk", [(5, 17, 45), (24, 40, 56)], ids=["odd", "aligned"])
def test_linear_variants(mnk, variant):
    """The epilogue in each kernel: pointer, split-K (auto at small M) and TMA (aligned)."""
    m, n, k = mnk
    dtype = torch.float16
    x = randn(m, k, dtype=dtype, requires_grad=True)
    w = randn(n, k, dtype=dtype, requires_grad=True, scale=0.3)
    bias = randn(n, dtype=dtype, requires_grad=True)
    res = randn(m, n, dtype=dtype, requires_grad=True)
    _check_linear(x, w, bias, "silu", res, dtype, variant=variant, what=variant)


def test_linear_layouts():
    """Strided input rows, a transposed weight view, a column-major residual, a 1-D input."""
    x = noncontig(randn(6, 45, requires_grad=True))
    w = randn(45, 17).T.requires_grad_()
    res = randn(17, 6).T.requires_grad_()
    _check_linear(x, w, randn(17, requires_grad=True), "relu", res, torch.float32, what="strided")
    _check_linear(randn(45, requires_grad=True), w, None, "silu", randn(17, requires_grad=True),
                  torch.float32, what="1-D")
    x3 = randn(4, 3, 45).transpose(0, 1).requires_grad_()      # leading dims not viewable: copied
    _check_linear(x3, w, None, "gelu_tanh", None, torch.float32, what="non-contiguous lead")


def test_linear_none_alias_and_no_grad():
    x, w, b = randn(4, 33), randn(9, 33), randn(9)
    y = linear(x, w, b, "none")
    assert torch.equal(y, linear(x, w, b, None))
    with torch.no_grad():
        xg = x.clone().requires_grad_()
        y2 = linear(xg, w, b, "gelu")
    assert not y2.requires_grad
    assert_close(y2, linear_reference(x.double(), w.double(), b.double(), "gelu"), torch.float32)


def test_linear_large():
    if not big:
        pytest.skip("GPU-sized shapes")
    for dtype in DTYPES:
        x = randn(4097, 4097, dtype=dtype, requires_grad=True)
        w = randn(255, 4097, dtype=dtype, requires_grad=True, scale=0.05)
        _check_linear(x, w, randn(255, dtype=dtype, requires_grad=True), "gelu_tanh",
                      randn(4097, 255, dtype=dtype, requires_grad=True), dtype)


def test_linear_strided_bias():
    x, w = randn(5, 16), randn(7, 16)
    bias = randn(14)[::2]
    assert_close(linear(x, w, bias), F.linear(x.double(), w.double(), bias.double()), torch.float32)


def test_linear_grad_of_residual_only():
    x, w = randn(5, 16), randn(7, 16)
    res = randn(5, 7, requires_grad=True)
    y = linear(x, w, None, "relu", res)
    (dres,) = torch.autograd.grad(y, res, torch.ones_like(y))
    assert torch.equal(dres, torch.ones_like(y))


@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
def test_linear_grad_of_bias_only(act):
    """Only the bias requires grad, through an activation: the pre-activation must still be saved
    and the backward must not return early; the incoming gradient is a broadcast row (strides
    (0, 1), from sum(0)), which the activation backward's flat kernel must not read as contiguous."""
    x, w = randn(6, 24), randn(9, 24, scale=0.3)
    bias = randn(9, requires_grad=True)
    g = randn(9)
    (db,) = torch.autograd.grad(linear(x, w, bias, act).sum(0), bias, g)
    br = _leaf(bias)
    (dbr,) = torch.autograd.grad(mm._act_reference(F.linear(x.double(), w.double(), br), act).sum(0), br, g.double())
    assert_close(db, dbr, torch.float32, scale=2.0, what=f"dbias ({act})")


@pytest.mark.parametrize("act", ["gelu", "silu", "gelu_tanh"])
def test_linear_double_backward(act):
    """Grad of grad through an activation (create_graph=True): the kernel's act'(z) * dy was a
    constant to autograd, so every second-order term through it was silently lost (~80% off)."""
    def grad_of_grad(fn, ins):
        g = torch.autograd.grad(fn(*ins).square().sum(), ins, create_graph=True)
        return torch.autograd.grad(sum((gi * gi).sum() for gi in g), ins[:3])

    ins = tuple(randn(*s, requires_grad=True) for s in ((5, 8), (6, 8), (6,), (5, 6)))   # x, w, bias, residual
    got = grad_of_grad(lambda x, w, b, r: linear(x, w, b, act, r), ins)
    ref = grad_of_grad(lambda x, w, b, r: mm.linear_reference(x, w, b, act, r), tuple(_leaf(t) for t in ins))
    for name, g, r in zip("xwb", got, ref):
        assert_close(g, r, torch.float32, scale=5.0, what=f"grad of grad d{name}")


def test_expanded_gradient():
    """sum() hands the backward stride-0 gradients; at M = 300 the backward's dz @ W takes the TMA
    path with a zero row stride (rows (0, 1)), at M = 5 the split-K pointer path."""
    for m in (5, 300):
        x = randn(m, 48, requires_grad=True)
        w = randn(24, 48, requires_grad=True)
        y = linear(x, w)
        y.sum(0).sum().backward()                       # dy strides (0, 1)
        xr, wr = _leaf(x), _leaf(w)
        F.linear(xr, wr).sum().backward()
        assert_close(x.grad, xr.grad, torch.float32, what=f"dx M={m}")
        assert_close(w.grad, wr.grad, torch.float32, what=f"dw M={m}")
        a, b = randn(m, 48, requires_grad=True), randn(48, 24, requires_grad=True)
        matmul(a, b).sum().backward()                   # dc strides (0, 0)
        assert_close(a.grad, b.detach().double().sum(1).expand(m, 48), torch.float32, what="da")


# ----------------------------------------------------------------------------------------------
# Empty problems
# ----------------------------------------------------------------------------------------------
def test_k_zero():
    """An empty sum: the product is zeros, and with an epilogue the output is the epilogue of zeros
    (_mm directly: the public linear() cannot reach it yet, see test_empty_dims_public)."""
    for dtype in DTYPES:
        a, b = randn(5, 0, dtype=dtype, requires_grad=True), randn(0, 7, dtype=dtype, requires_grad=True)
        c = matmul(a, b)
        assert c.shape == (5, 7) and c.dtype == dtype and torch.equal(c, torch.zeros_like(c))
        c.sum().backward()
        assert a.grad.shape == (5, 0) and b.grad.shape == (0, 7)
    x, w, bias, res = randn(6, 0), randn(7, 0), randn(7), randn(6, 7)
    for act in ACTIVATIONS:
        y, z = mm._mm(x, w.T, bias=bias, residual=res, activation=ACTIVATIONS[act], store_z=True)
        zr = bias.double().expand(6, 7)
        assert_close(y, mm._act_reference(zr, act) + res.double(), torch.float32, what=f"K=0 {act}")
        assert_close(z, zr, torch.float32, what=f"K=0 {act} pre-activation")


def test_m_zero():
    a, b = randn(0, 33, requires_grad=True), randn(33, 9, requires_grad=True)
    c = matmul(a, b)
    assert c.shape == (0, 9)
    c.sum().backward()
    assert a.grad.shape == (0, 33) and torch.equal(b.grad, torch.zeros_like(b))
    assert matmul(randn(0, 4, 33), randn(0, 33, 9)).shape == (0, 4, 9)       # empty batch
    assert matmul(randn(3, 4, 33), randn(33, 0)).shape == (3, 4, 0)           # N = 0
    x, w, bias = randn(2, 0, 33, requires_grad=True), randn(9, 33, requires_grad=True), randn(9, requires_grad=True)
    y = linear(x, w, bias, "gelu")
    assert y.shape == (2, 0, 9)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(bias.grad, torch.zeros_like(bias))
    assert linear(randn(2, 3, 4), randn(0, 4)).shape == (2, 3, 0)


EMPTY_PUBLIC = {
    "matmul 3d@3d K=0": lambda: (matmul(randn(2, 5, 0), randn(2, 0, 7)), (2, 5, 7)),
    "matmul 3d@3d M=0": lambda: (matmul(randn(2, 0, 4), randn(2, 4, 7)), (2, 0, 7)),
    "matmul 3d@3d N=0": lambda: (matmul(randn(2, 5, 4), randn(2, 4, 0)), (2, 5, 0)),
    "matmul 3d@2d K=0": lambda: (matmul(randn(2, 5, 0), randn(0, 7)), (2, 5, 7)),
    "linear 2d K=0": lambda: (linear(randn(3, 0), randn(7, 0), randn(7)), (3, 7)),
    "linear 3d K=0": lambda: (linear(randn(2, 3, 0), randn(7, 0), None, "silu", randn(2, 3, 7)), (2, 3, 7)),
    "linear N=0 residual": lambda: (linear(randn(2, 3, 4), randn(0, 4), None, None, randn(2, 3, 0)), (2, 3, 0)),
}


@pytest.mark.parametrize("case", list(EMPTY_PUBLIC))
def test_empty_dims_public(case):
    out, shape = EMPTY_PUBLIC[case]()
    assert out.shape == shape
    if out.numel() and case.startswith("matmul"):
        assert torch.equal(out, torch.zeros_like(out))


# ----------------------------------------------------------------------------------------------
# torch.compile and opcheck
# ----------------------------------------------------------------------------------------------
def test_compile_fullgraph():
    a = randn(2, 5, 24, requires_grad=True)
    b = randn(2, 24, 9, requires_grad=True)
    w = randn(9, 24, requires_grad=True)
    bias = randn(9, requires_grad=True)
    res = randn(2, 5, 9, requires_grad=True)

    def f(a, b, w, bias, res):
        return matmul(a, b) * 2 + linear(a, w, bias, "gelu_tanh", res)

    out = torch.compile(f, fullgraph=True)(a, b, w, bias, res)
    dy = torch.randn_like(out)
    out.backward(dy)
    leaves = [_leaf(t) for t in (a, b, w, bias, res)]
    ar, br, wr, bir, rr = leaves
    ref = (ar @ br) * 2 + F.gelu(F.linear(ar, wr, bir), approximate="tanh") + rr
    ref.backward(dy.double())
    assert_close(out, ref, torch.float32, what="compiled forward")
    for name, t, r in zip(["a", "b", "w", "bias", "res"], (a, b, w, bias, res), leaves):
        assert_close(t.grad, r.grad, torch.float32, scale=2.0, what=f"compiled d{name}")


def test_opcheck():
    """Runs on the interpreter too (as the other ops' opchecks do): ~1 s."""
    x, b = randn(5, 24, requires_grad=True), randn(24, 9, requires_grad=True)
    torch.library.opcheck(matmul_op.overload, (x, b, "auto"))
    torch.library.opcheck(matmul_op.overload, (randn(3, 5, 24, requires_grad=True),
                                               randn(3, 24, 9, requires_grad=True), "naive"))
    w, bias, res = randn(9, 24, requires_grad=True), randn(9, requires_grad=True), randn(5, 9, requires_grad=True)
    torch.library.opcheck(linear_op.overload, (x, w, bias, res, ACTIVATIONS["gelu_tanh"], True, "auto"))
    torch.library.opcheck(linear_op.overload, (x, w, None, None, 0, False, "grouped"))
    z = linear_op(x.detach(), w.detach(), bias.detach(), None, 2, True, "auto")[1]
    torch.library.opcheck(mm.act_backward_op.overload, (randn(5, 9), z, 2))


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------
def test_bad_input():
    a, b, w = randn(3, 4), randn(4, 5), randn(5, 4)
    with pytest.raises(ValueError, match=r"inner dimensions do not match: 'input' \(3, 4\) has K=4 but "
                                         r"'other' \(5, 6\) has K=5"):
        matmul(a, randn(5, 6))
    with pytest.raises(ValueError, match=r"rank >= 2; got shapes \(4,\) and \(4, 5\)"):
        matmul(randn(4), b)
    with pytest.raises(ValueError, match=r"rank >= 2; got shapes \(3, 4\) and \(4,\)"):
        matmul(a, randn(4))
    with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
        matmul(randn(2, 3, 4), randn(3, 4, 5))
    with pytest.raises(TypeError, match="'input' is float32 but 'other' is float16; expected the same dtype"):
        matmul(a, b.half())
    with pytest.raises(TypeError, match="'other' has dtype int64; expected float32, float16 or bfloat16"):
        matmul(a, torch.ones(4, 5, dtype=torch.long, device=DEVICE))
    with pytest.raises(TypeError, match="'input' has dtype float64"):
        matmul(a.double(), b)
    with pytest.raises(TypeError, match="'other' must be a torch.Tensor, got list"):
        matmul(a, [[1.0]])
    with pytest.raises(ValueError, match="'variant' is 'fastest'; expected one of 'auto', 'naive'"):
        matmul(a, b, variant="fastest")
    with pytest.raises(ValueError, match="'variant' is 'cublas'"):
        linear(a, w, variant="cublas")
    with pytest.raises(ValueError, match="'activation' is 'tanh'; expected one of None, 'none', 'relu'"):
        linear(a, w, activation="tanh")
    with pytest.raises(ValueError, match=r"'bias' has shape \(4,\); expected \(5,\)"):
        linear(a, w, randn(4))
    with pytest.raises(ValueError, match=r"'bias' has shape \(1, 5\); expected \(5,\)"):
        linear(a, w, randn(1, 5))
    with pytest.raises(TypeError, match="'bias' is float16 but 'input' is float32"):
        linear(a, w, randn(5, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"'residual' has shape \(3, 4\); expected \(3, 5\)"):
        linear(a, w, None, None, randn(3, 4))
    with pytest.raises(TypeError, match="'residual' has dtype int32"):
        linear(a, w, None, None, torch.ones(3, 5, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"'weight' must be 2-D \(out_features, in_features\); got shape \(5, 4, 1\)"):
        linear(a, randn(5, 4, 1))
    with pytest.raises(ValueError, match=r"'weight' must be 2-D .*got shape \(4,\)"):
        linear(a, randn(4))
    with pytest.raises(ValueError, match=r"in_features=4 but 'weight' \(5, 3\) has 3"):
        linear(a, randn(5, 3))
    with pytest.raises(TypeError, match="'input' is bfloat16 but 'weight' is float32"):
        linear(a.bfloat16(), w)
    with pytest.raises(ValueError, match="rank >= 1"):
        linear(randn(()), w)


def test_device_mismatch():
    """Operands on two devices (a meta tensor passes the per-operand device check, so this runs
    everywhere)."""
    a = randn(3, 4)
    with pytest.raises(RuntimeError, match=f"'input' is on {a.device} but 'other' is on meta; expected the same device"):
        matmul(a, torch.ones(4, 5, device="meta"))
    with pytest.raises(RuntimeError, match=f"'input' is on {a.device} but 'weight' is on meta"):
        linear(a, torch.ones(5, 4, device="meta"))
    with pytest.raises(RuntimeError, match=f"'bias' is on meta but 'input' is on {a.device}"):
        linear(a, randn(5, 4), torch.ones(5, device="meta"))
    with pytest.raises(RuntimeError, match=f"'residual' is on meta but 'input' is on {a.device}"):
        linear(a, randn(5, 4), None, None, torch.ones(3, 5, device="meta"))


@gpu_only
def test_cpu_tensor_rejected_on_gpu_machine():
    with pytest.raises(RuntimeError, match="'other' is on device 'cpu'"):
        matmul(randn(3, 4), torch.ones(4, 5))
    with pytest.raises(RuntimeError, match="'input' is on device 'cpu'"):
        matmul(torch.ones(3, 4), randn(4, 5))
    with pytest.raises(RuntimeError, match="'bias' is on device 'cpu'"):
        linear(randn(3, 4), randn(5, 4), torch.ones(5))


# ----------------------------------------------------------------------------------------------
# GPU numerics: TF32
# ----------------------------------------------------------------------------------------------
@gpu_only
def test_tf32(monkeypatch):
    """allow_tf32 switches fp32 to TF32 tensor cores (10-bit mantissa: ~1e-4 relative error over
    K = 1024, so within fp16's tolerance, and no longer within fp32's); off, it is IEEE again."""
    a, b = randn(300, 1024), randn(1024, 200)
    ref = _ref(a, b)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    err_tf32 = rel_err(matmul(a, b, variant="grouped"), ref)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    err_ieee = rel_err(matmul(a, b, variant="grouped"), ref)
    assert err_ieee <= TOL[torch.float32], err_ieee
    assert TOL[torch.float32] < err_tf32 <= TOL[torch.float16], err_tf32


# ----------------------------------------------------------------------------------------------
# The tuning cache
# ----------------------------------------------------------------------------------------------
def test_tuning_cache_roundtrip(tmp_path, monkeypatch):
    """A stored winner is found in memory and, after forget() (a new process), read from disk."""
    fake = DeviceInfo("Fake GPU 80GB", 132, 50 << 20, (9, 0), 80 << 30)
    monkeypatch.setattr(tuning, "device_info", lambda: fake)      # the file is named per device
    monkeypatch.setenv("WARPFORGE_CACHE", str(tmp_path / "tc"))
    monkeypatch.setattr(tuning, "shipped_path", lambda: tmp_path / "shipped.json")
    tuning.forget()
    key = "matmul|grouped|float16|anbn|64x64x128"
    cfg = MatmulConfig(64, 128, 32, group_m=4, num_stages=3, num_warps=4, split_k=2)
    assert tuning.lookup(key) is None
    tuning.store(key, cfg.as_dict())
    assert tuning.lookup(key) == cfg.as_dict()
    path = tuning.cache_path()
    assert path.parent == tmp_path / "tc" and fake.key in path.name
    assert json.loads(path.read_text())[key] == cfg.as_dict()
    tuning.forget()
    assert MatmulConfig(**tuning.lookup(key)) == cfg                   # from disk
    tuning.store("other", {"x": 1})                                    # a second entry keeps the first
    tuning.forget()
    assert tuning.lookup(key) == cfg.as_dict() and tuning.lookup("other") == {"x": 1}
    path.write_text("{not json")                                       # a corrupt file is an empty cache
    tuning.forget()
    assert tuning.lookup(key) is None
    assert tuning.bucket(1) == 16 and tuning.bucket(17) == 32 and tuning.bucket(4097) == 8192


def test_tuning_cache_shipped_tables(tmp_path, monkeypatch):
    """Shipped winners are found; the user's own entries take precedence and are all that the
    user's file holds."""
    fake = DeviceInfo("Fake GPU 80GB", 132, 50 << 20, (9, 0), 80 << 30)
    monkeypatch.setattr(tuning, "device_info", lambda: fake)
    monkeypatch.setenv("WARPFORGE_CACHE", str(tmp_path / "tc"))
    shipped = tmp_path / "shipped.json"
    monkeypatch.setattr(tuning, "shipped_path", lambda: shipped)
    a, b = MatmulConfig(16, 64, 128, split_k=4).as_dict(), MatmulConfig(128, 256, 64, persistent=True).as_dict()
    shipped.write_text(json.dumps({"k1": a, "k2": a}))
    tuning.forget()
    assert tuning.lookup("k1") == a and tuning.lookup("k2") == a
    tuning.store("k2", b)
    assert tuning.lookup("k2") == b
    assert json.loads(tuning.cache_path().read_text()) == {"k2": b}
    tuning.forget()
    assert tuning.lookup("k1") == a and tuning.lookup("k2") == b


def test_tuning_switch():
    before = tuning.enabled()
    with tuning.tuning():
        assert tuning.enabled()
        with tuning.tuning(False):
            assert not tuning.enabled()
        assert tuning.enabled()
    assert tuning.enabled() == before


@gpu_only
def test_autotune_writes_cache_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "shipped_path", lambda: tmp_path / "none.json")   # tune, do not look up
    tuning.forget()
    a, b = randn(300, 200, dtype=torch.float16), randn(200, 100, dtype=torch.float16)
    with tuning.tuning():
        c = matmul(a, b, variant="autotuned")
    assert_close(c, _ref(a, b), torch.float16)
    path = tuning.cache_path()
    table = json.loads(path.read_text())
    keys = [k for k in table if k.startswith("matmul|grouped|float16|")]
    assert len(keys) == 1, table
    MatmulConfig(**table[keys[0]])                                     # a valid config
    tuning.forget()                                                    # "a second process"

    def no_search(*args, **kwargs):
        raise AssertionError("re-tuned although the cache holds a winner")

    monkeypatch.setattr(tuning, "search", no_search)
    with tuning.tuning():
        c2 = matmul(a, b, variant="autotuned")
        matmul(randn(290, 210, dtype=torch.float16), randn(210, 120, dtype=torch.float16), variant="autotuned")
    assert torch.equal(c, c2)


# ----------------------------------------------------------------------------------------------
# References and the public namespace
# ----------------------------------------------------------------------------------------------
def test_references():
    a, b = randn(5, 33, dtype=torch.bfloat16), randn(33, 9, dtype=torch.bfloat16)
    r = matmul_reference(a, b)
    assert r.dtype == torch.bfloat16
    assert_close(r, _ref(a, b), torch.bfloat16)
    x, w, bias, res = randn(2, 5, 33), randn(9, 33), randn(9), randn(2, 5, 9)
    yr = linear_reference(x, w, bias, "silu", res)
    assert_close(yr, F.silu(F.linear(x.double(), w.double(), bias.double())) + res.double(), torch.float32)
    assert warpforge.matmul is matmul and warpforge.linear is linear


# ----------------------------------------------------------------------------------------------
# The planned relaunch (runtime/launch.py) passes what the first, JIT-launched call passed
# ----------------------------------------------------------------------------------------------
def _as_key(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", v.data_ptr(), v.dtype)
    if hasattr(v, "block_shape"):        # TensorDescriptor (first launch) or Desc (relaunch)
        return ("desc", v.base.data_ptr(), tuple(v.shape), tuple(v.strides), tuple(v.block_shape), v.padding)
    return v


@pytest.mark.parametrize("kind", ["tiled", "tiled-split", "tma"])
def test_relaunch_passes_the_first_launch_arguments(kind, monkeypatch):
    """On a GPU the second call of a problem skips the JIT and hands the compiled kernel the
    arguments directly; here both paths' arguments are captured and compared one by one (the
    interpreter itself always takes the JIT path)."""
    a, w = randn(40, 96, dtype=torch.bfloat16), randn(72, 96, dtype=torch.bfloat16)
    b = w.T
    out = torch.empty(40, 72, dtype=torch.bfloat16, device=a.device)
    bias, res = randn(72, dtype=torch.bfloat16), randn(40, 72, dtype=torch.bfloat16)
    ep = mm._Epilogue(out, bias, res, None, 2)
    cfg = MatmulConfig(16, 32, 32, group_m=1, num_stages=2, num_warps=4, split_k=3 if kind == "tiled-split" else 1)
    first = {}

    def record(self, key, grid, args, constexprs, *, num_warps, num_stages):
        first.update(grid=grid, args=args, constexprs=constexprs)

    monkeypatch.setattr(mm.LaunchCache, "__call__", record)
    tail_names = None
    if kind == "tma":
        mm._launch_tma(a, b, out, ep, cfg)
        tail_names = mm._matmul_tma_kernel.arg_names[len(first["args"]):]
    else:
        mm._launch_tiled(a, b, out, ep, cfg)
        tail_names = mm._matmul_kernel.arg_names[len(first["args"]):]
    tail = tuple(first["constexprs"][n] for n in tail_names)
    again = {}
    monkeypatch.setattr(mm, "launch", lambda compiled, grid, values: again.update(grid=grid, values=values))
    fire = (mm._fast_tma if kind == "tma" else mm._fast_tiled)(a, b, out, ep, cfg, (object(), tail))
    fire(a, b, out, ep)
    assert again["grid"] == first["grid"]
    got, want = [_as_key(v) for v in again["values"]], [_as_key(v) for v in (*first["args"], *tail)]
    if kind == "tiled-split":      # a fresh fp32 workspace each call: compare its size, not its address
        i = mm._matmul_kernel.arg_names.index("ws_ptr")
        assert again["values"][i].numel() == first["args"][i].numel()
        got[i] = want[i] = "ws"
    assert got == want


@gpu_only
def test_batched_past_the_grid_limit():
    """70,000 batch entries (more than a grid's 65,535 y/z extent: the batch is folded into axis 0)."""
    a, b = randn(70000, 5, 8), randn(70000, 8, 3)
    assert_close(matmul(a, b), a.double() @ b.double(), torch.float32)


def test_activation_not_a_string():
    """An unhashable activation failed with "unhashable type: 'list'" (a dict lookup)."""
    with pytest.raises(ValueError, match=r"'activation' is \['relu'\]; expected one of"):
        linear(randn(3, 4), randn(5, 4), activation=["relu"])
    with pytest.raises(ValueError, match=r"'activation' is \['relu'\]; expected one of"):
        warpforge.nn.Linear(4, 5, activation=["relu"])
