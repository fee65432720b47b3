"""The CUDA backend's cluster LayerNorm forward (``torch.ops.warpforge_cuda.layer_norm_fwd``,
csrc/norm.cu) on a GPU, and the route by which ``warpforge.layer_norm`` takes it (H200, rows of
65,536 and 262,144: heuristics.NORM_LAYER_CLUSTER).

Outputs are allocated by the caller and filled with NaN first, so an element, mean or rstd the kernel
leaves unwritten fails. References are float64 (conftest.TOL for y; mean and rstd to 1e-5).
Launch shapes: n = cluster x threads x vectors a thread x 8 exactly; the cases cover 2- to 16-block
clusters, 1 to 8 rows a group, 2 and 3 stages, partial last groups, fewer groups than resident
clusters and more (every stage and exchange slot reused), w and b as fp32 held and as packed
registers (kernel's Affine), both 16-bit dtypes and each combination of the parameters.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import warpforge as wf
import warpforge.cuda as wcuda
from warpforge.ops import norms
from conftest import assert_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not wcuda.available(),
                       reason=f"the CUDA C++ backend cannot run here: {wcuda.unavailable_reason()}"),
]

DEV = torch.device("cuda")
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
needs_hopper = pytest.mark.skipif(not HOPPER, reason="thread-block clusters and bulk copies need sm_90")


@pytest.fixture(scope="module", autouse=True)
def built():
    wcuda.load()


@pytest.fixture(autouse=True)
def _synchronize_after_test():
    yield
    torch.cuda.synchronize()


def cluster_ln(x, w, b, cfg, eps=1e-5):
    y = torch.full_like(x, float("nan"))
    mean = torch.full((x.shape[0],), float("nan"), device=x.device)
    rstd = torch.full_like(mean, float("nan"))
    torch.ops.warpforge_cuda.layer_norm_fwd(x, w, b, eps, list(cfg), y, mean, rstd)
    torch.cuda.synchronize()
    return y, mean, rstd


def reference(x, w, b, eps=1e-5):
    x64 = x.double()
    mean = x64.mean(-1)
    var = x64.var(-1, unbiased=False)
    rstd = (var + eps).rsqrt()
    y = (x64 - mean[:, None]) * rstd[:, None]
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y, mean, rstd


def check(x, w, b, cfg, what=""):
    y, mean, rstd = cluster_ln(x, w, b, cfg)
    ry, rmean, rrstd = reference(x, w, b)
    assert_close(y, ry, x.dtype, what=f"{what} y")
    for got, ref, name in ((mean, rmean, "mean"), (rstd, rrstd, "rstd")):
        err = ((got.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()
        assert err < 1e-5, f"{what} {name} relative error {err:.2e}"


# (cluster, threads, vectors a thread, rows a group, stages): n = cluster x threads x vectors x 8
SHAPES = [
    (2, 128, 1, 2, 2),    # n = 2,048, fp32 parameters held
    (4, 128, 2, 4, 3),    # 8,192
    (4, 256, 1, 8, 2),    # 8,192, 8 rows a group
    (16, 128, 1, 2, 2),   # 16,384 over 16 blocks, two stages
    (2, 1024, 2, 1, 3),   # 32,768, parameters packed (1,024 threads)
    (8, 256, 4, 4, 3),    # 65,536: the H200 route's shape
]


@needs_hopper
@pytest.mark.parametrize("cfg", SHAPES, ids=str)
@pytest.mark.parametrize("m", [1, 5, 301])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cluster_layer_norm_shapes(cfg, m, dtype):
    c, t, v, _, _ = cfg
    n = c * t * v * 8
    x = (torch.randn(m, n, device=DEV) * 2 + 0.5).to(dtype)
    w = (torch.rand(n, device=DEV) + 0.5).to(dtype)
    b = torch.randn(n, device=DEV).to(dtype)
    check(x, w, b, cfg, what=f"{cfg} m={m}")


@needs_hopper
@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
@pytest.mark.parametrize("cfg", [(2, 128, 1, 2, 2), (2, 1024, 2, 1, 3)], ids=str)
def test_cluster_layer_norm_optional_affine(affine, cfg):
    c, t, v, _, _ = cfg
    n = c * t * v * 8
    x = torch.randn(37, n, device=DEV).to(torch.bfloat16)
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16) if affine == "weight" else None
    b = torch.randn(n, device=DEV).to(torch.bfloat16) if affine == "bias" else None
    check(x, w, b, cfg, what=affine)


@needs_hopper
@pytest.mark.parametrize("dtype,shift", [(torch.float16, 1000.0), (torch.bfloat16, 100.0), (torch.bfloat16, 3e4)])
def test_cluster_layer_norm_large_mean(dtype, shift):
    """Statistics about a pivot (each thread's first value): no E[x^2] - mean^2 cancellation."""
    cfg = (4, 128, 2, 4, 3)
    n = 8192
    x = (torch.randn(64, n, device=DEV) + shift).to(dtype)
    check(x, None, None, cfg, what="large mean")


@needs_hopper
def test_cluster_layer_norm_strided_rows_and_nan():
    cfg = (2, 128, 1, 2, 2)
    n = 2048
    buf = torch.randn(9, n + 64, device=DEV).to(torch.bfloat16)
    x = buf[:, :n]
    assert not x.is_contiguous()
    check(x, None, None, cfg, what="strided rows")
    x = torch.randn(6, n, device=DEV).to(torch.bfloat16)
    x[2, 77] = float("nan")
    y, mean, rstd = cluster_ln(x, None, None, cfg)
    assert torch.isnan(y[2]).all() and torch.isnan(mean[2])
    keep = torch.tensor([0, 1, 3, 4, 5], device=DEV)
    assert torch.isfinite(y[keep]).all()


@needs_hopper
def test_cluster_layer_norm_refuses_bad_calls():
    op = torch.ops.warpforge_cuda.layer_norm_fwd
    x = torch.randn(4, 2048, device=DEV).to(torch.bfloat16)
    y, mean, rstd = torch.empty_like(x), torch.empty(4, device=DEV), torch.empty(4, device=DEV)
    with pytest.raises(RuntimeError, match="exactly cluster x threads"):
        op(x, None, None, 1e-5, [4, 128, 1, 2, 2], y, mean, rstd)
    with pytest.raises(RuntimeError, match="rows a group must not exceed"):
        op(x, None, None, 1e-5, [2, 128, 1, 8, 2], y, mean, rstd)
    with pytest.raises(RuntimeError, match="stages must be 2 to 8"):
        op(x, None, None, 1e-5, [2, 128, 1, 2, 1], y, mean, rstd)
    with pytest.raises(RuntimeError, match="must be \\[cluster, threads"):
        op(x, None, None, 1e-5, [2, 128, 1, 2], y, mean, rstd)
    xf = x.float()
    with pytest.raises(RuntimeError, match="16-bit dtypes only"):
        op(xf, None, None, 1e-5, [2, 128, 1, 2, 2], torch.empty_like(xf), mean, rstd)
    buf = torch.empty(4 * 2048 + 1, device=DEV, dtype=torch.bfloat16)
    xm = buf[1:].view(4, 2048)
    with pytest.raises(RuntimeError, match="16-byte boundaries"):
        op(xm, None, None, 1e-5, [2, 128, 1, 2, 2], y, mean, rstd)
    with pytest.raises(RuntimeError, match="'weight' has dtype"):
        op(x, torch.ones(2048, device=DEV), None, 1e-5, [2, 128, 1, 2, 2], y, mean, rstd)
    with pytest.raises(RuntimeError, match="'rstd' must be a contiguous float32"):
        op(x, None, None, 1e-5, [2, 128, 1, 2, 2], y, mean, torch.empty(3, device=DEV))


@needs_hopper
def test_opcheck_cluster_layer_norm():
    n = 2048
    x = torch.randn(5, n, device=DEV).to(torch.bfloat16)
    w = torch.rand(n, device=DEV).to(torch.bfloat16)
    args = (x, w, None, 1e-5, [2, 128, 1, 2, 2], torch.empty_like(x), torch.empty(5, device=DEV),
            torch.empty(5, device=DEV))
    torch.library.opcheck(torch.ops.warpforge_cuda.layer_norm_fwd.default, args)


# ---- the route through warpforge.layer_norm -------------------------------------------------------
@pytest.fixture
def small_route(monkeypatch):
    """warpforge.layer_norm takes the cluster kernel for rows of 2,048 (as the H200's table does for
    65,536 and 262,144); records each launch shape it takes."""
    taken = []
    real = norms._layer_norm_cluster

    def table(n, m, device_name):
        return (2, 128, 1, 2, 2) if n == 2048 else None

    def spy(*args):
        cfg = real(*args)
        if cfg is not None:
            taken.append(cfg)
        return cfg

    monkeypatch.setattr(norms, "layer_norm_cluster_config", table)
    monkeypatch.setattr(norms, "_layer_norm_cluster", spy)
    # the eager fast path replays Triton block kernels Python launched before for the same key
    monkeypatch.setattr(norms.fastpath, "door", lambda t: None)
    return taken


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_routes_to_cluster_kernel(small_route, dtype):
    n = 2048
    x = torch.randn(3, 7, n, device=DEV).to(dtype).requires_grad_()
    w = (torch.rand(n, device=DEV) + 0.5).to(dtype).requires_grad_()
    b = torch.randn(n, device=DEV).to(dtype).requires_grad_()
    y = wf.layer_norm(x, (n,), w, b)
    assert small_route == [(2, 128, 1, 2, 2)]
    dy = torch.randn_like(y)
    y.backward(dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref = F.layer_norm(x64, (n,), w64, b64, 1e-5)
    ref.backward(dy.double())
    assert_close(y, ref, dtype, what="y")
    for got, want, name in ((x.grad, x64.grad, "dx"), (w.grad, w64.grad, "dw"), (b.grad, b64.grad, "db")):
        assert_close(got, want, dtype, scale=2, what=name)


@needs_hopper
def test_layer_norm_route_compiled(small_route):
    n = 2048
    x = torch.randn(9, n, device=DEV).to(torch.bfloat16)
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16)
    fn = torch.compile(lambda t: wf.layer_norm(t, (n,), w, None), fullgraph=True)
    y = fn(x)
    assert small_route, "the compiled call did not take the cluster kernel"
    assert_close(y, F.layer_norm(x.double(), (n,), w.double(), None, 1e-5), torch.bfloat16)


@needs_hopper
def test_layer_norm_route_declines(small_route):
    """fp32 rows, parameters of another dtype, misaligned rows and other lengths keep Triton."""
    n = 2048
    x = torch.randn(4, n, device=DEV)
    wf.layer_norm(x, (n,))
    xb = x.to(torch.bfloat16)
    wf.layer_norm(xb, (n,), torch.ones(n, device=DEV))
    buf = torch.randn(4 * n + 1, device=DEV).to(torch.bfloat16)
    wf.layer_norm(buf[1:].view(4, n), (n,))
    wf.layer_norm(torch.randn(4, 1024, device=DEV).to(torch.bfloat16), (1024,))
    assert small_route == []
    wf.layer_norm(xb, (n,))
    assert small_route == [(2, 128, 1, 2, 2)]
