import pytest
import torch
import triton

import warpforge as wf
from warpforge.runtime import checks, heuristics, registry
from conftest import DEVICE, assert_close, randn


@pytest.mark.parametrize("fast", [True, False])
def test_both_doors_same_results(monkeypatch, fast):
    """The fast eager door and the dispatcher door compute the same values and gradients."""
    monkeypatch.setattr(registry, "FAST_EAGER", fast)
    x = randn(5, 33, requires_grad=True)
    w = randn(33, requires_grad=True)
    y = wf.rms_norm(wf.softmax(x), (33,), w, 1e-6)
    dy = randn(5, 33)
    y.backward(dy)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    yr = torch.nn.functional.rms_norm(torch.softmax(xr, -1), (33,), wr, 1e-6)
    yr.backward(dy.double())
    assert_close(y, yr, torch.float32)
    assert_close(x.grad, xr.grad, torch.float32, scale=5)
    assert_close(w.grad, wr.grad, torch.float32, scale=5)


def test_every_op_is_registered():
    for name in ("softmax", "softmax_backward", "rms_norm", "layer_norm", "add_rms_norm", "rope",
                 "swiglu", "geglu", "sum", "amax", "add_vectorized", "add_naive"):
        assert name in registry.REGISTRY, name
        assert hasattr(torch.ops.warpforge, name)


def test_row_config_paths():
    assert heuristics.row_config(4096).mode == "block"
    assert heuristics.row_config(16384).mode == "block"
    big = heuristics.row_config(262144)
    # the interpreter runs programs one at a time: the split path's wait would never end there
    assert big.mode == ("loop" if wf.interpreting() else "split")
    assert heuristics.row_config(1).block_n == 1


def test_norm_fwd_config_paths():
    """Short rows as every row op; on a GPU one 32-warp program holds rows to 32K, and past that
    the pipe mode (LayerNorm re-reading its weight and bias every row); the interpreter keeps the
    plain row config."""
    for layer in (False, True):
        assert heuristics.norm_fwd_config(4096, layer) == heuristics.row_config(4096)
        for n in (20000, 32768, 65536, 262144):
            c = heuristics.norm_fwd_config(n, layer)
            if wf.interpreting():
                assert c == heuristics.row_config(n)
            elif n <= 32768:
                assert (c.mode, c.block_n, c.rows, c.num_warps) == ("block", 32768, 1, 32)
            else:
                assert c.mode == "pipe" and c.chunks * c.block_n >= n
                short_ln = layer and n <= 65536          # 2,048 x 2 warps (NOTES.md item 24)
                assert (c.block_n, c.num_warps) == ((2048, 2) if short_ln else (8192, 4))
                assert c.reload == (layer or n <= 65536)


def test_norm_fwd_loop_rows(monkeypatch):
    """On a GPU, rows of 4K < N <= 8K with rows enough (``many``) take the two-pass loop forward
    (RMSNorm 4,096-element steps, LayerNorm 8,192, 16 warps); fewer rows, other lengths and the
    interpreter keep their paths."""
    from warpforge.runtime.heuristics import RowConfig

    f = heuristics.norm_fwd_config.__wrapped__            # uncached: the patched interpreting() applies
    monkeypatch.setattr(heuristics, "interpreting", lambda: False)
    assert f(8192, False, True) == RowConfig("loop", 4096, 1, 16)
    assert f(8192, True, True) == RowConfig("loop", 8192, 1, 16)
    assert f(4097, False, True).mode == "loop"
    for n, layer, many in ((8192, False, False), (8192, True, False), (4096, False, True), (8193, True, True)):
        assert f(n, layer, many).mode == "block", (n, layer, many)
    # on an H200 both norms loop with N compiled in where 4,096 divides N (NORM_LOOP_CONST); elsewhere
    # LayerNorm keeps the block kernel there (NORM_LOOP_NO_LAYER) and RMSNorm loops with N an argument
    h200 = "NVIDIA H200"
    for layer in (False, True):
        assert f(8192, layer, True, h200) == RowConfig("loop", 4096, 1, 16, const_n=True), layer
        assert f(8192, layer, False, h200).mode == "block", layer
    assert f(4096, False, True, h200) == RowConfig("loop", 2048, 1, 8, const_n=True)
    assert f(4096, True, True, h200).mode == f(4096, False, False, h200).mode == "block"
    assert heuristics.norm_loop_min_n(h200) == 4096
    assert heuristics.norm_loop_min_n("NVIDIA H100 80GB HBM3") == heuristics.NORM_LOOP_MIN_N == 4097
    assert f(6000, True, True, h200).mode == "block"
    assert heuristics.reduce_loop_min_n(h200) == 4096
    assert heuristics.reduce_loop_min_n("NVIDIA H100 80GB HBM3") == heuristics.REDUCE_LOOP_MIN_N == 8192
    g = heuristics.reduce_loop_const.__wrapped__
    monkeypatch.setattr(heuristics, "sm_count", lambda *a: 132)
    for n, want in ((4096, (2048, 8)), (8192, (4096, 16)), (12288, (4096, 16)), (32768, (8192, 32)),
                    (65536, (4096, 16)), (24000, None), (262144, None), (2048, None)):
        assert g(264, n, h200) == want, n
        assert g(263, n, h200) is None and g(264, n, "NVIDIA H100 80GB HBM3") is None, n
    assert f(6000, False, True, h200) == RowConfig("loop", 4096, 1, 16)
    assert f(8192, True, True, "NVIDIA H100 80GB HBM3") == RowConfig("loop", 8192, 1, 16)
    monkeypatch.setattr(heuristics, "interpreting", lambda: True)
    assert f(8192, False, True) == heuristics.row_config(8192)


def test_norm_bwd_residual_grad_route(monkeypatch):
    """add+RMSNorm's backward takes the cluster kernel only at the lengths NORM_BWD_DSUM lists, on
    RMSNorm's launch shape for them, which the kernel must take with a residual gradient (256
    threads, at most 2 rows a group and 8 vectors a thread over them: heuristics.dsum_fits)."""
    monkeypatch.setattr(heuristics, "interpreting", lambda: False)
    monkeypatch.setattr(heuristics, "sm_count", lambda *a: 132)
    cfg = heuristics.norm_bwd_cluster_config
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    for n in heuristics.NORM_BWD_DSUM["H200"]:
        shape = cfg(n, 2**27 // n, False, h200, True)
        assert shape == heuristics.NORM_BWD_CLUSTER["H200"][(False, n)] and heuristics.dsum_fits(shape), n
    assert cfg(262144, 512, False, h200, True) is None                 # Triton: measured slower there
    assert cfg(262144, 512, False, h200) == (16, 256, 8, 1, 3)          # RMSNorm alone keeps it
    assert cfg(65536, 2048, False, h100, True) is None
    assert cfg(65536, 100, False, h200, True) is None                  # fewer rows than SMs
    assert not heuristics.dsum_fits((8, 128, 4, 2, 3)) and not heuristics.dsum_fits((2, 256, 8, 2, 3))
    assert not heuristics.dsum_fits((2, 256, 1, 4, 2))
    # a table shape the kernel cannot add the residual gradient at: RMSNorm alone keeps it
    monkeypatch.setitem(heuristics.NORM_BWD_CLUSTER, "H200", {(False, 2048): (2, 128, 1, 2, 2),
                                                              (True, 4096): (2, 256, 1, 2, 2)})
    monkeypatch.setitem(heuristics.NORM_BWD_DSUM, "H200", (2048, 4096))
    assert cfg(2048, 4096, False, h200) == (2, 128, 1, 2, 2) and cfg(2048, 4096, False, h200, True) is None
    assert cfg(4096, 4096, True, h200) == (2, 256, 1, 2, 2) and cfg(4096, 4096, True, h200, True) is None
    monkeypatch.setattr(heuristics, "interpreting", lambda: True)
    assert cfg(65536, 2048, False, h200, True) is None


def test_rope_table_order():
    """RoPE loads the table rows first only where a sequence spans several token blocks; one block
    (decode) issues q/k with them (heuristics.rope_config's table_first)."""
    assert not heuristics.rope_config(64, 1, 32, 8, 128).table_first
    assert not heuristics.rope_config(1, 1, 32, 8, 128).table_first
    assert heuristics.rope_config(4, 4096, 32, 8, 128).table_first
    c = heuristics.rope_config(2, 37, 4, 2, 32)
    assert c.table_first == (triton.cdiv(37, c.block_s) > 1)


def test_norm_fwd_h200_routes(monkeypatch):
    """H200 only (NORM_LOOP_CONST, NORM_WIDE_LOOP, NORM_BLOCK_SHAPES, NORM_RMS_PIPE): rows of
    16K < N <= 32K with rows enough take the loop, both norms in 8,192-element steps of 32 warps with
    N compiled in where 8,192 divides N, else RMSNorm the same with N an argument and LayerNorm in
    16,384-element steps of 32; LayerNorm rows of 2K < N <= 4K the block kernel at 4 warps, of 512 < N <= 1K two
    rows a program at 2 warps; RMSNorm rows of 32K < N <= 64K with rows enough the pipe in 2,048-column
    chunks of 4 warps without the re-read. Other devices, few rows and the interpreter keep theirs.
    The fast path is told to leave norm rows up to 32K with many rows to Python there."""
    from warpforge.runtime.heuristics import RowConfig

    f = heuristics.norm_fwd_config.__wrapped__
    monkeypatch.setattr(heuristics, "interpreting", lambda: False)
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    for n in (16385, 20000, 24576, 32768):
        const = n % 8192 == 0          # NORM_LOOP_CONST: N compiled in, both norms at 8,192 x 32
        assert f(n, False, True, h200) == RowConfig("loop", 8192, 1, 32, const_n=const), n
        assert f(n, False, False, h200) == f(n, False, True, h100) == RowConfig("block", 32768, 1, 32), n
        assert f(n, True, True, h200) == (RowConfig("loop", 8192, 1, 32, const_n=True) if const
                                          else RowConfig("loop", 16384, 1, 32)), n
        assert f(n, True, False, h200) == f(n, True, True, h100) == RowConfig("block", 32768, 1, 32), n
    assert f(16384, False, True, h200).mode == f(16384, True, True, h200).mode == "block"
    for n in (32769, 65536):
        assert f(n, False, True, h200) == RowConfig("pipe", 2048, 1, 4, triton.cdiv(n, 2048), False), n
        assert f(n, False, False, h200) == f(n, False, True, h100), n
        assert f(n, False, True, h100).reload and f(n, False, True, h100).block_n == 8192, n
        assert f(n, True, True, h200) == f(n, True, True, h100), n
    assert f(65537, False, True, h200) == f(65537, False, True, h100)
    for n in (2049, 4096):
        assert f(n, True, True, h200) == f(n, True, False, h200) == RowConfig("block", 4096, 1, 4), n
        assert f(n, True, True, h100).num_warps == f(n, False, True, h200).num_warps == 8, n
    assert f(1024, True, True, h200) == f(600, True, False, h200) == RowConfig("block", 1024, 2, 2)
    # add+RMSNorm (residual) rows of 4K < N <= 8K: the block kernel at 32 warps (NORM_BLOCK_SHAPES);
    # RMSNorm without a residual, other lengths and other devices keep theirs
    for n in (4097, 8192):
        assert f(n, False, False, h200, residual=True) == RowConfig("block", 8192, 1, 32), n
        assert f(n, False, False, h100, residual=True) == f(n, False, False, h200) == RowConfig("block", 8192, 1, 8), n
    assert f(4096, False, False, h200, residual=True) == f(4096, False, False, h200)
    assert f(16384, False, False, h200, residual=True) == f(16384, False, False, h200)
    assert f(1024, True, True, h100) == f(1024, False, True, h200) == heuristics.row_config(1024)
    assert f(512, True, True, h200) == heuristics.row_config(512)
    assert heuristics.norm_loop_max_n(h200) == 32768
    assert heuristics.norm_loop_max_n(h100) == heuristics.NORM_LOOP_MAX_N == 8192
    monkeypatch.setattr(heuristics, "interpreting", lambda: True)
    assert f(32768, False, True, h200) == heuristics.row_config(32768)
    assert f(4096, True, True, h200) == heuristics.row_config(4096)
    assert f(1024, True, True, h200) == heuristics.row_config(1024)


def test_norm_bwd_config_paths():
    """Whole rows to 8K (RMSNorm) / 4K (LayerNorm); on a GPU the split exchange and the pipe mode
    past it (LayerNorm in one-warp 1,024-column programs to 64K); the interpreter's two-pass
    loop. LayerNorm's short rows: 2,048-element tiles, four programs an SM in the
    weight-gradient grid (one at 4,096)."""
    for layer in (False, True):
        assert heuristics.norm_bwd_config(4096, layer).mode == "block"
        for n in (8192, 20000, 32768, 65536, 262144):
            c = heuristics.norm_bwd_config(n, layer)
            if wf.interpreting():
                assert c.mode == ("block" if n == 8192 and not layer else "loop")
            elif n == 8192 and not layer:
                assert c.mode == "block"
            elif layer and n <= 65536:
                assert (c.mode, c.block_n, c.num_warps) == ("split" if n <= 16384 else "pipe", 1024, 1)
                assert c.chunks == -(-n // 1024)
            elif n <= 32768:
                assert (c.mode, c.block_n, c.chunks) == ("split", 4096, -(-n // 4096))
            else:
                assert c.mode == "pipe" and c.chunks * c.block_n >= n
                assert (c.block_n, c.num_warps) == ((2048, 4) if n <= 131072 else (8192, 8))
    assert heuristics.norm_bwd_config(4096, False).grad_per_sm == heuristics.GRAD_PROGRAMS_PER_SM
    for n, rows, warps, per_sm in ((1024, 2, 4, 4), (2048, 1, 4, 4), (4096, 2, 16, 1), (100, 16, 4, 4)):
        c = heuristics.norm_bwd_config(n, True)
        assert (c.mode, c.rows, c.num_warps, c.grad_per_sm) == ("block", rows, warps, per_sm), n


def test_norm_bwd_config_device_routes(monkeypatch):
    """LayerNorm rows of 4K < N <= 8K in a 2-byte dtype take one 8,192-column, 16-warp block
    program an SM (NORM_LAYER_BWD_WIDE): on the H200 with its tiles staged four deep, on the H100
    unstaged; fp32, other devices, RMSNorm, other lengths and the interpreter keep their paths.
    On the H200 RMSNorm rows of 16K < N <= 64K without a residual gradient take the one-warp
    pipe (NORM_RMS_BWD_PIPE)."""
    from warpforge.runtime.heuristics import RowConfig

    monkeypatch.setattr(heuristics, "interpreting", lambda: False)
    heuristics.norm_bwd_config.cache_clear()
    try:
        h200, h100, other = "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
        f = heuristics.norm_bwd_config
        for n in (4097, 5000, 8192):
            assert f(n, True, h200) == RowConfig("block", 8192, 1, 16, grad_per_sm=1, stages=4), n
            assert f(n, True, h100) == RowConfig("block", 8192, 1, 16, grad_per_sm=1, stages=0), n
            assert f(n, True, h200, 4) == f(n, True, h100, 4) == f(n, True, other) == f(n, True), n
            assert f(n, True, other).mode == "split", n
            assert f(n, False, h200) == f(n, False, h100) == f(n, False, other), n
        for n in (4096, 8193, 32768):
            assert f(n, True, h200) == f(n, True, h100) == f(n, True, other), n
        # H200, RMSNorm past 16K to 64K without a residual gradient: the one-warp 1,024-column pipe
        for n in (16385, 32768, 65536):
            assert f(n, False, h200) == RowConfig("pipe", 1024, 1, 1, -(-n // 1024)), n
            assert f(n, False, h200, dsum=True) == f(n, False, h100) == f(n, False, other), n
            assert f(n, False, h100).block_n != 1024, n
        for n in (16384, 65537):
            assert f(n, False, h200) == f(n, False, h100), n
        monkeypatch.setattr(heuristics, "interpreting", lambda: True)
        heuristics.norm_bwd_config.cache_clear()
        assert f(8192, True, h200) == RowConfig("loop", 4096, 1, 16)
    finally:
        heuristics.norm_bwd_config.cache_clear()


def test_softmax_config_paths():
    """One 32-warp program a row to 32K on a GPU, forward and backward; 262K rows in the pipe mode
    (backward with more warps); the interpreter keeps the plain row config. The amax backward
    keeps the split kernel past 64K."""
    for backward in (False, True):
        assert heuristics.softmax_config(4096, backward) == heuristics.row_config(4096)
        for n in (20000, 65536, 262144):
            c = heuristics.softmax_config(n, backward)
            if wf.interpreting():
                assert c == heuristics.row_config(n)
            elif n <= 32768:
                assert (c.mode, c.block_n, c.num_warps) == ("block", 32768, 32)
            elif n <= 65536:
                assert c == heuristics.row_config(n)
            else:
                assert (c.mode, c.block_n, c.num_warps) == ("pipe", 8192, 8 if backward else 4)
    for n in (4096, 20000, 65536, 262144):
        c = heuristics.amax_bwd_config(n)
        if wf.interpreting() or n <= 65536:
            assert c == heuristics.softmax_config(n, False)
        else:
            assert (c.mode, c.block_n) == ("split", 8192)


def test_persistent_grid_keeps_groups_whole():
    g = heuristics.persistent_grid(1000, per_group=7, resident=100)
    assert g % 7 == 0 and g <= 100
    assert heuristics.persistent_grid(3, per_group=4, resident=100) == 4


def test_check_messages_name_the_argument():
    with pytest.raises(TypeError, match="'weight' has dtype int32"):
        checks.check_tensor("weight", torch.ones(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="'normalized_shape'"):
        checks.check_normalized_shape((3, 4), torch.ones(2, 4, device=DEVICE))
    with pytest.raises(TypeError, match="'x' must be a torch.Tensor"):
        checks.check_tensor("x", [1.0])


def test_dispatched_marks_the_dispatcher_door(monkeypatch):
    """registry.dispatched() is True while an operator runs through the dispatcher (torch.compile's
    graphs, torch.ops.warpforge.*) and False through the eager door: launchers that keep device
    buffers allocate per call on the first (CUDA graph trees refuse kept buffers from their pools)."""
    from warpforge.ops import softmax as softmax_mod
    from warpforge.runtime import fastpath, registry

    monkeypatch.setattr(fastpath, "lib", None)
    seen = []
    real = softmax_mod._softmax_fwd
    monkeypatch.setattr(softmax_mod, "_softmax_fwd", lambda *a: (seen.append(registry.dispatched()), real(*a))[1])
    x = randn(4, 16)
    wf.softmax(x)
    softmax_mod.softmax_op.op(x, False)
    torch.ops.warpforge.softmax(x, False)
    assert seen == [False, True, True] and not registry.dispatched()


def test_softmax_loop_route(monkeypatch):
    """SOFTMAX_LOOP_CONST (the H200's, NOTES item 108): a device's entry sends softmax
    forwards of many rows whose length it covers, and its step divides, to the loop kernel with N
    compiled in; the backward, few rows, other devices and the interpreter keep their paths, and
    the fast path is told the range it must leave to Python."""
    from warpforge.runtime.heuristics import RowConfig

    f = heuristics.softmax_config.__wrapped__
    monkeypatch.setattr(heuristics, "interpreting", lambda: False)
    h200 = "NVIDIA H200"
    assert heuristics.softmax_loop_range(h200) == (2048, 65536)
    assert f(32768, False, True, h200) == RowConfig("loop", 8192, 1, 32, const_n=True)
    assert f(24576, False, True, h200) == RowConfig("loop", 8192, 1, 32, const_n=True)   # the step divides
    monkeypatch.setattr(heuristics, "SOFTMAX_LOOP_CONST", {"H200": ((4096, 8192, 4096, 16), (16385, 32768, 8192, 32))})
    assert heuristics.softmax_loop_range(h200) == (4096, 32768)
    assert heuristics.softmax_loop_range("NVIDIA H100 80GB HBM3") == (0, -1)
    assert f(32768, False, True, h200) == RowConfig("loop", 8192, 1, 32, const_n=True)
    assert f(8192, False, True, h200) == RowConfig("loop", 4096, 1, 16, const_n=True)
    for args in ((32768, True, True, h200), (32768, False, False, h200), (32768, False, True, "NVIDIA H100 80GB HBM3"),
                 (20000, False, True, h200), (12288, False, True, h200)):
        assert f(*args) == f(args[0], args[1]), args
    assert f(1024, False, True, h200) == RowConfig("block", 1024, 2, 4)     # SOFTMAX_BLOCK_SHAPES
    assert f(1000, False, False, h200) == RowConfig("block", 1024, 2, 4)
    assert f(1024, True, True, h200) == f(1024, True) == heuristics.row_config(1024)   # the backward keeps its shape
    monkeypatch.setattr(heuristics, "interpreting", lambda: True)
    assert f(32768, False, True, h200) == f(32768, False)
    assert f(1024, False, True, h200) == heuristics.row_config(1024)


def test_softmax_backward_pipe_route(monkeypatch):
    """SOFTMAX_BWD_PIPE (the H200's log-softmax backward at 262K, NOTES item 114): the named
    device's log-softmax backward at that N takes the table's pipe shape; the softmax backward, the
    forward, other N, other devices and the interpreter keep their paths."""
    from warpforge.runtime.heuristics import RowConfig

    f = heuristics.softmax_config.__wrapped__
    monkeypatch.setattr(heuristics, "interpreting", lambda: False)
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    assert f(262144, True, False, h200, True) == RowConfig("pipe", 4096, 1, 4, 64)
    assert f(262144, True, False, h200, False) == f(262144, True) == RowConfig("pipe", 8192, 1, 8, 32)
    assert f(262144, True, False, h100, True) == f(262144, True)
    assert f(65536, True, False, h200, True) == f(65536, True)
    assert f(262144, False, False, h200, True) == f(262144, False)
    monkeypatch.setattr(heuristics, "interpreting", lambda: True)
    assert f(262144, True, False, h200, True) == f(262144, True)


def test_may_keep_buffers(monkeypatch):
    """A launcher keeps a device buffer across calls only off the CUDA device or, on it, neither
    on the dispatcher door nor while a graph captures (runtime/registry.py); CUDA faked here."""
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert registry.may_keep_buffers(cuda) and registry.may_keep_buffers(cpu)
    capturing[0] = True
    assert not registry.may_keep_buffers(cuda) and registry.may_keep_buffers(cpu)
    capturing[0] = False
    monkeypatch.setattr(registry._DISPATCH, "depth", 1, raising=False)
    assert registry.dispatched()
    assert not registry.may_keep_buffers(cuda) and registry.may_keep_buffers(cpu)


def test_checks_accept_and_refuse(monkeypatch):
    """runtime/checks.py directly: each check refuses what it must (naming the argument and, for
    pairs, the other one) and accepts its edge cases (a 1-d tensor, empty rows, dim = -ndim, a 0-d
    tensor option). Two devices and CUDA are faked with SimpleNamespace tensors where needed."""
    from types import SimpleNamespace

    x = torch.ones(2, 3, device=DEVICE)
    for bad in (torch.float64, torch.int32, torch.float8_e4m3fn):
        want = f"'x' has dtype {str(bad)[6:]}; expected one of float32, float16, bfloat16"
        with pytest.raises(TypeError, match=want):
            checks.check_tensor("x", x.to(bad))
    checks.check_tensor("ids", x.int(), dtypes=(torch.int32,))
    checks.check_tensor("x", torch.ones(3, device=DEVICE))
    checks.check_tensor("x", torch.ones(0, 3, device=DEVICE))                      # no rows: fine
    with pytest.raises(ValueError, match="'x' must have at least 1 dimension"):
        checks.check_tensor("x", torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="'x' must have at least 2 dimension"):
        checks.check_tensor("x", torch.ones(3, device=DEVICE), min_dim=2)
    for shape in ((0,), (2, 0)):
        with pytest.raises(ValueError, match="'x' has a zero-size last dimension"):
            checks.check_tensor("x", torch.ones(shape, device=DEVICE))
    # CPU tensors only under the interpreter; meta always (shape inference)
    monkeypatch.setattr(checks, "interpreting", lambda: False)
    with pytest.raises(RuntimeError, match="'x' is on device 'cpu'"):
        checks.check_device("x", torch.ones(2))
    checks.check_device("x", torch.ones(2, device="meta"))
    monkeypatch.undo()

    def fake(dev, dtype=torch.float32, shape=(2, 3)):
        return SimpleNamespace(device=torch.device(dev), dtype=dtype, shape=torch.Size(shape))

    with pytest.raises(RuntimeError, match="'a' is on cuda:1 but 'b' is on cuda:0"):
        checks.check_same("a", fake("cuda:1"), "b", fake("cuda:0"))
    with pytest.raises(TypeError, match="'a' has dtype torch.float16 but 'b' has torch.float32"):
        checks.check_same("a", fake("cpu", torch.float16), "b", fake("cpu"))
    with pytest.raises(ValueError, match=r"'a' has shape \(3, 2\) but 'b' has \(2, 3\)"):
        checks.check_same("a", fake("cpu", shape=(3, 2)), "b", fake("cpu"))
    checks.check_same("a", fake("cpu", torch.float16, (3,)), "b", fake("cpu"), shape=False, dtype=False)
    checks.check_weight("w", torch.ones(3, device=DEVICE), "x", x, 3)
    for bad in ((1, 3), (4,), (3, 1)):
        with pytest.raises(ValueError, match=r"'w' has shape .*; expected \(3,\) to match the last dimension of 'x'"):
            checks.check_weight("w", torch.ones(bad, device=DEVICE), "x", x, 3)
    for dim, ndim, want in ((-2, 2, 0), (-1, 2, 1), (1, 2, 1), (0, 0, 0), (-1, 0, 0)):
        assert checks.normalize_dim("dim", dim, ndim) == want, (dim, ndim)
    for dim, ndim in ((2, 2), (-3, 2), (1, 0)):
        with pytest.raises(IndexError, match=f"'dim'={dim} is out of range"):
            checks.normalize_dim("dim", dim, ndim)
    assert checks.check_normalized_shape(3, x) == checks.check_normalized_shape([3], x) == 3
    for bad in ((4,), (2, 3), ()):
        with pytest.raises(ValueError, match="'normalized_shape'"):
            checks.check_normalized_shape(bad, x)
    for bad in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(ValueError, match="'eps' is .*; expected a finite number"):
            checks.check_finite("eps", bad)
    for bad in (True, "1", None):
        with pytest.raises(TypeError, match="'eps' must be a real number"):
            checks.check_finite("eps", bad)
    assert checks.check_finite("eps", torch.tensor(0.5)) == 0.5 and checks.check_finite("eps", 2) == 2.0
    assert checks.host_sync_unavailable(torch.ones(2, device="meta")) and not checks.host_sync_unavailable(x)
