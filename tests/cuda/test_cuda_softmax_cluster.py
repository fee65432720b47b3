"""The CUDA backend's staged cluster softmax forward (``torch.ops.warpforge_cuda.softmax_fwd_cluster``,
csrc/softmax.cu: a row over a thread-block cluster, groups of rows staged in shared memory by bulk
copies, the slices' (max, sum of exp) pairs exchanged by st.async -- the LayerNorm forward's
skeleton, csrc/cluster_rows.cuh) on a GPU, and the route by which ``warpforge.softmax`` and
``log_softmax`` take it (heuristics.SOFTMAX_CLUSTER: forced here, and the device's own table).

Outputs are allocated by the caller and filled with NaN first, so an element the kernel leaves
unwritten fails. References are float64. Launch shapes: n = cluster x threads x vectors a thread x 8
exactly; the cases cover 2- to 16-block clusters, 1 to 8 rows a group, 2 and 3 stages, partial last
groups, fewer groups than resident clusters and more (every stage and exchange slot reused), both
16-bit dtypes, softmax and log-softmax, and rows holding -inf, NaN, a max in the last slice and a
1e4 scale.
"""
from __future__ import annotations

import pytest
import torch

import warpforge as wf
from warpforge.runtime import heuristics
from conftest import assert_close
from cuda_support import (BACKEND_MARKS, DEV, _synchronize_after_test, built,  # noqa: F401 (autouse fixtures)
                          needs_hopper)

pytestmark = BACKEND_MARKS


def cluster_softmax(x, log, cfg):
    y = torch.full_like(x, float("nan"))
    torch.ops.warpforge_cuda.softmax_fwd_cluster(x, log, list(cfg), y)
    torch.cuda.synchronize()
    return y


def hard_rows(m, n, dtype):
    """Random rows scaled by 3; the first five: the max in the last column, one finite element among
    -inf, a NaN, a 1e4-scaled row, a row of equal values."""
    x = torch.randn(m, n, device=DEV) * 3
    if m >= 5:
        x[0, n - 1] = 40.0
        x[1] = -float("inf")
        x[1, n // 3] = 1.0
        x[2, 5] = float("nan")
        x[3] *= 1e4
        x[4] = 0.25
    return x.to(dtype)


def check(x, log, cfg, what=""):
    """Against float64, the 1e4-scaled row (hard_rows' row 3; its log-softmax values would swamp a
    norm over every row) apart from the others; NaN and -inf where the reference has them."""
    y = cluster_softmax(x, log, cfg)
    ref = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
    rest = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    if x.shape[0] >= 5:
        rest[3] = False
        assert_close(y[3], ref[3], x.dtype, what=f"{what} (1e4-scaled row)")
    assert_close(y[rest], ref[rest], x.dtype, what=what)


# (cluster, threads, vectors a thread, rows a group, stages[, blocks an SM]): n = cluster x threads x
# vectors x 8
SHAPES = [
    (2, 128, 1, 2, 2),    # n = 2,048
    (4, 128, 2, 4, 3),    # 8,192
    (4, 256, 1, 8, 2),    # 8,192, 8 rows a group
    (16, 128, 1, 2, 2),   # 16,384 over 16 blocks
    (2, 1024, 1, 1, 3),   # 16,384 at 1,024 threads
    (8, 256, 4, 4, 3),    # 65,536: LayerNorm's H200 shape
    (16, 512, 4, 2, 3),   # 262,144: LayerNorm's H200 shape
    (4, 128, 2, 4, 3, 2),     # 8,192, two blocks an SM
    (8, 256, 4, 2, 3, 2),     # 65,536, two blocks an SM
    (16, 256, 8, 1, 3, 2),    # 262,144, two blocks an SM
    (8, 512, 2, 1, 3, 2),     # 65,536, 1,024 threads an SM in two blocks (2 vectors: the most that fit)
    (16, 1024, 2, 1, 3),      # 262,144, 1,024 threads an SM in one block
]


@needs_hopper
@pytest.mark.parametrize("cfg", SHAPES, ids=str)
@pytest.mark.parametrize("m", [1, 5, 301])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cluster_softmax_shapes(cfg, m, log, dtype):
    c, t, v = cfg[:3]
    n = c * t * v * 8
    if n > 65536 and m > 5:
        m = 133    # 262K: more groups than the 8 resident 16-block clusters, at a bearable size
    check(hard_rows(m, n, dtype), log, cfg, what=f"{cfg} m={m} log={log}")


@needs_hopper
def test_cluster_softmax_strided_rows():
    cfg = (2, 128, 1, 2, 2)
    n = 2048
    buf = (torch.randn(9, n + 64, device=DEV) * 3).to(torch.bfloat16)
    x = buf[:, :n]
    assert not x.is_contiguous()
    check(x, False, cfg, what="strided rows")


@needs_hopper
def test_cluster_softmax_refuses_bad_calls():
    op = torch.ops.warpforge_cuda.softmax_fwd_cluster
    x = torch.randn(4, 2048, device=DEV).to(torch.bfloat16)
    y = torch.empty_like(x)
    with pytest.raises(RuntimeError, match="exactly cluster x threads"):
        op(x, False, [4, 128, 1, 2, 2], y)
    with pytest.raises(RuntimeError, match="stages must be 2 to 8"):
        op(x, False, [2, 128, 1, 2, 1], y)
    with pytest.raises(RuntimeError, match="blocks an SM must be 1 or 2"):
        op(x, False, [2, 128, 1, 2, 2, 3], y)
    with pytest.raises(RuntimeError, match="exceeds shared memory \\(x blocks an SM\\)"):
        op(torch.randn(4, 32768, device=DEV).to(torch.bfloat16), False, [2, 256, 8, 1, 4, 2],
           torch.empty(4, 32768, device=DEV, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="must be \\[cluster, threads"):
        op(x, False, [2, 128, 1, 2], y)
    with pytest.raises(RuntimeError, match="1,024 threads an SM .* hold at most 2 vectors"):
        op(torch.randn(4, 65536, device=DEV).to(torch.bfloat16), False, [2, 1024, 4, 1, 2],
           torch.empty(4, 65536, device=DEV, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="1,024 threads an SM .* hold at most 2 vectors"):
        op(torch.randn(4, 32768, device=DEV).to(torch.bfloat16), False, [2, 512, 4, 1, 2, 2],
           torch.empty(4, 32768, device=DEV, dtype=torch.bfloat16))
    xf = x.float()
    with pytest.raises(RuntimeError, match="16-bit dtypes only"):
        op(xf, False, [2, 128, 1, 2, 2], torch.empty_like(xf))
    buf = torch.empty(4 * 2048 + 1, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="16-byte boundaries"):
        op(buf[1:].view(4, 2048), False, [2, 128, 1, 2, 2], y)


@needs_hopper
def test_opcheck_cluster_softmax():
    x = torch.randn(5, 2048, device=DEV).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.warpforge_cuda.softmax_fwd_cluster.default,
                          (x, True, [2, 128, 1, 2, 2], torch.empty_like(x)))


@needs_hopper
@pytest.mark.parametrize("log", [False, True])
def test_softmax_takes_the_cluster_route(monkeypatch, log):
    """warpforge.softmax / log_softmax with a SOFTMAX_CLUSTER entry for this device: rows of that
    length, at least one an SM, 16-bit and aligned, go to the cluster kernel (the forward; the
    backward keeps its kernels); too few rows and fp32 keep the Triton path. Against float64."""
    from warpforge.ops import softmax as mod
    from warpforge.runtime import fastpath
    from warpforge.runtime.device import device_info, sm_count

    monkeypatch.setattr(fastpath, "lib", None)   # 8K rows: the eager fast path would replay the block kernel
    n, cfg = 8192, (4, 128, 2, 4, 3)
    monkeypatch.setattr(heuristics, "SOFTMAX_CLUSTER", {device_info().name: {n: cfg}})
    routes = []
    real = mod._softmax_cluster
    monkeypatch.setattr(mod, "_softmax_cluster", lambda *a: routes.append(real(*a)) or routes[-1])
    fn, tfn = (wf.log_softmax, torch.log_softmax) if log else (wf.softmax, torch.softmax)
    x = (torch.randn(sm_count() + 3, n, device=DEV) * 3).to(torch.bfloat16).requires_grad_()
    y = fn(x, -1)
    assert routes == [cfg]
    assert_close(y, tfn(x.detach().double(), -1), torch.bfloat16, what="routed forward")
    xr = x.detach().double().requires_grad_()
    g = torch.randn_like(y)
    y.backward(g)
    tfn(xr, -1).backward(g.double())
    assert_close(x.grad, xr.grad, torch.bfloat16, what="backward after the routed forward")
    fn(x.detach()[:4], -1)                        # too few rows: Triton
    fn(x.detach().float(), -1)                    # fp32: Triton
    assert routes[1:] == [None, None]


@needs_hopper
@pytest.mark.parametrize("log", [False, True])
def test_device_table_route_with_the_fast_path(monkeypatch, log):
    """With this device's own SOFTMAX_CLUSTER entry (H200: 262,144) and the eager fast path left on,
    a forward of one row an SM of that length reaches the cluster kernel (the fast path replays only
    the block kernel, which no such call offers) twice running, and is right."""
    from warpforge.ops import softmax as mod
    from warpforge.runtime.device import device_info, sm_count

    table = heuristics._by_device(heuristics.SOFTMAX_CLUSTER, device_info().name) or {}
    if not table:
        pytest.skip(f"no SOFTMAX_CLUSTER entry for {device_info().name}")
    n = max(table)
    routes = []
    real = mod._softmax_cluster
    monkeypatch.setattr(mod, "_softmax_cluster", lambda *a: routes.append(real(*a)) or routes[-1])
    fn, tfn = (wf.log_softmax, torch.log_softmax) if log else (wf.softmax, torch.softmax)
    x = hard_rows(sm_count(), n, torch.bfloat16)
    for _ in range(2):
        y = fn(x, -1)
    assert routes == [table[n]] * 2
    ref = tfn(x.double(), -1)
    rest = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    rest[3] = False
    assert_close(y[rest], ref[rest], torch.bfloat16, what=f"table route n={n}")
    assert_close(y[3], ref[3], torch.bfloat16, what=f"table route n={n} (1e4-scaled row)")
