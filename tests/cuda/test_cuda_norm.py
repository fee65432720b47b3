"""The CUDA backend's cluster LayerNorm forward (``torch.ops.warpforge_cuda.layer_norm_fwd``,
csrc/norm.cu) and LayerNorm / RMSNorm backward (``norm_bwd``) on a GPU, and the routes by which
``warpforge.layer_norm`` and ``rms_norm`` take them (H200: the forward at 65,536 and 262,144,
heuristics.NORM_LAYER_CLUSTER; the backward at 32,768, 65,536 and 262,144, NORM_BWD_CLUSTER).

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
from warpforge.ops import norms
from conftest import assert_close
from cuda_support import (BACKEND_MARKS, DEV, _synchronize_after_test, built,  # noqa: F401 (autouse fixtures)
                          needs_hopper)

pytestmark = BACKEND_MARKS


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
    (4, 256, 4, 4, 3),    # 32,768: the H200 route's shape until session 38 (now the Triton loop)
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
    with pytest.raises(RuntimeError, match="one block an SM"):
        op(x, None, None, 1e-5, [2, 128, 1, 2, 2, 2], y, mean, rstd)
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
def route_rows_of_2048(monkeypatch, route_fn: str) -> list:
    """norms' cluster route ``route_fn`` taken for rows of 2,048, every cluster table giving them
    2 x 128 x 1 at 2 rows a group from any row count (heuristics' other checks, such as the residual
    gradient's, still apply), as the H200's tables do for the long rows; returns the launch shapes it
    takes."""
    from warpforge.runtime import heuristics

    taken = []
    real = getattr(norms, route_fn)

    def spy(*args):
        cfg = real(*args)
        if cfg is not None:
            taken.append(cfg)
        return cfg

    def table(tables, key, m, name):   # key: N (forward) or (layer, N) (backward)
        return (2, 128, 1, 2, 2) if (key[-1] if isinstance(key, tuple) else key) == 2048 else None

    monkeypatch.setattr(heuristics, "_cluster_shape", table)
    monkeypatch.setattr(norms, route_fn, spy)
    # the eager fast path replays Triton block kernels Python launched before for the same key
    monkeypatch.setattr(norms.fastpath, "door", lambda t: None)
    return taken


@pytest.fixture
def small_route(monkeypatch):
    """warpforge.layer_norm takes the cluster forward for rows of 2,048."""
    return route_rows_of_2048(monkeypatch, "_layer_norm_cluster")


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


# ---- backward -----------------------------------------------------------------------------------
def cluster_bwd(x, dy, w, mean, rstd, rms, has_b, cfg, parts, offset=0.0, ds=None):
    n = x.shape[1]
    dx = torch.full_like(x, float("nan"))
    dwp = torch.full((parts, n), float("nan"), device=DEV) if w is not None else None
    dbp = torch.full((parts, n), float("nan"), device=DEV) if has_b else None
    torch.ops.warpforge_cuda.norm_bwd(x, dy, w, mean, rstd, offset, rms, list(cfg), dx, dwp, dbp, ds)
    torch.cuda.synchronize()
    return dx, (None if dwp is None else dwp.sum(0)), (None if dbp is None else dbp.sum(0))


def reference_bwd(x, dy, w, b, rms, offset=0.0, eps=1e-5):
    """float64 autograd of the forward, and the fp32 statistics the kernel reads."""
    x64 = x.double().requires_grad_()
    w64 = None if w is None else w.double().requires_grad_()
    b64 = None if b is None else b.double().requires_grad_()
    if rms:
        rstd = (x64.detach().pow(2).mean(-1) + eps).rsqrt()
        y = x64 * (x64.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
        if w64 is not None:
            y = y * (w64 + offset)
        mean = None
    else:
        mean = x64.detach().mean(-1)
        rstd = (x64.detach().var(-1, unbiased=False) + eps).rsqrt()
        y = F.layer_norm(x64, (x.shape[1],), w64, b64, eps)
    y.backward(dy.double())
    grads = (x64.grad, None if w64 is None else w64.grad, None if b64 is None else b64.grad)
    return grads, (None if mean is None else mean.float().contiguous()), rstd.float().contiguous()


BWD_SHAPES = [
    (2, 128, 1, 2, 2),    # n = 2,048
    (4, 128, 2, 4, 3),    # 8,192
    (2, 256, 4, 2, 2),    # 16,384
    (16, 128, 1, 2, 2),   # 16,384 over 16 blocks
    (2, 512, 2, 1, 3),    # 16,384 at 512 threads (w packed)
    (8, 256, 4, 2, 3),    # 65,536
]
# the H200 route's shapes (heuristics.NORM_BWD_CLUSTER), rows past one group a resident cluster
ROUTE_BWD_SHAPES = [
    ((2, 256, 8, 1, 3), 301),   # 32,768: 8 vectors a thread, w held as fp32
    ((4, 256, 4, 2, 3), 269),   # 32,768: 2 rows a group, a partial last group
    ((4, 256, 8, 1, 3), 139),   # 65,536, LayerNorm's
    ((8, 256, 4, 2, 3), 67),    # 65,536, RMSNorm's
    ((16, 256, 8, 1, 3), 21),   # 262,144 over 16 blocks (8 clusters fit)
]


@needs_hopper
@pytest.mark.parametrize("cfg,m", [(c, m) for c in BWD_SHAPES for m in (1, 5, 301)] + ROUTE_BWD_SHAPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_cluster_norm_backward(cfg, m, rms):
    c, t, v, _, _ = cfg
    n = c * t * v * 8
    dtype = torch.bfloat16 if m != 5 else torch.float16
    x = (torch.randn(m, n, device=DEV) * 2 + (0.0 if rms else 0.5)).to(dtype)
    dy = torch.randn(m, n, device=DEV).to(dtype)
    w = (torch.rand(n, device=DEV) + 0.5).to(dtype)
    b = None if rms else torch.randn(n, device=DEV).to(dtype)
    offset = 1.0 if rms else 0.0
    (rdx, rdw, rdb), mean, rstd = reference_bwd(x, dy, w, b, rms, offset)
    # parts: as the route sizes it, and fewer than the clusters that fit (a cap) when rows are many
    for parts in sorted({max(1, 132 // c), 3}):
        dx, dw, db = cluster_bwd(x, dy, w, mean, rstd, rms, not rms, cfg, parts, offset)
        assert_close(dx, rdx, dtype, scale=2, what=f"{cfg} m={m} parts={parts} dx")
        assert_close(dw, rdw, torch.float32, scale=50, what=f"{cfg} m={m} parts={parts} dw")
        if not rms:
            assert_close(db, rdb, torch.float32, scale=50, what=f"{cfg} m={m} parts={parts} db")


@needs_hopper
@pytest.mark.parametrize("cfg,m", [((2, 128, 1, 2, 2), 5), ((2, 256, 8, 1, 3), 301), ((8, 256, 4, 2, 3), 67)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_cluster_norm_backward_strided_rows(cfg, m, rms):
    """x and dy as column slices of buffers of different widths (each its own row stride, as a
    gradient narrowed out of a concatenation arrives): every other backward test gave the two
    the same stride, so a kernel reading dy's rows with x's stride passed them (NOTES item 153)."""
    c, t, v, _, _ = cfg
    n = c * t * v * 8
    dtype = torch.bfloat16
    x = (torch.randn(m, n + 64, device=DEV) * 2 + 0.5).to(dtype)[:, 32:32 + n]
    dy = torch.randn(m, n + 256, device=DEV).to(dtype)[:, 128:128 + n]
    assert x.stride(0) != dy.stride(0) != n
    w = (torch.rand(n, device=DEV) + 0.5).to(dtype)
    b = None if rms else torch.randn(n, device=DEV).to(dtype)
    (rdx, rdw, rdb), mean, rstd = reference_bwd(x, dy, w, b, rms)
    dx, dw, db = cluster_bwd(x, dy, w, mean, rstd, rms, not rms, cfg, max(1, 132 // c))
    assert_close(dx, rdx, dtype, scale=2, what=f"{cfg} m={m} dx")
    assert_close(dw, rdw, torch.float32, scale=50, what=f"{cfg} m={m} dw")
    if not rms:
        assert_close(db, rdb, torch.float32, scale=50, what=f"{cfg} m={m} db")


# add+RMSNorm's backward (a residual gradient added to dx): the shapes the kernel instantiates it at
# (256 threads, 1 or 2 rows a group, at most 8 vectors a thread over them), RMSNorm's two H200
# route shapes (65K: 8 x 256 x 4, 2 rows; 262K: 16 x 256 x 8, 1 row) among them
DSUM_SHAPES = [
    ((2, 256, 1, 2, 2), 1), ((2, 256, 1, 2, 2), 301), ((2, 256, 2, 1, 3), 5), ((4, 256, 2, 2, 3), 67),
    ((2, 256, 8, 1, 2), 37), ((8, 256, 4, 2, 3), 67), ((16, 256, 8, 1, 3), 21),
]


@needs_hopper
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("cfg,m", DSUM_SHAPES, ids=str)
def test_cluster_norm_backward_residual_grad(cfg, m, offset):
    """offset 1.0 (Gemma's 1 + w) also on the kernels that hold w packed in registers (1 row a
    group, 8 vectors a thread): every other offset test reached only the fp32-held weight, so a
    packed weight adding the offset to every other element passed them (NOTES item 153)."""
    c, t, v, _, _ = cfg
    n = c * t * v * 8
    dtype = torch.float16 if m == 5 else torch.bfloat16
    x = (torch.randn(m, n, device=DEV) * 2).to(dtype)
    dy = torch.randn(m, n, device=DEV).to(dtype)
    w = (torch.rand(n, device=DEV) + 0.5).to(dtype)
    # a strided dsum (rows of a wider buffer): its own row stride
    ds = (torch.randn(m, n + 64, device=DEV) * 3).to(dtype)[:, 32:32 + n]
    (rdx, rdw, _), _, rstd = reference_bwd(x, dy, w, None, True, offset)
    for parts in sorted({max(1, 132 // c), 3}):
        dx, dw, _ = cluster_bwd(x, dy, w, None, rstd, True, False, cfg, parts, offset, ds=ds)
        assert_close(dx, rdx + ds.double(), dtype, scale=2, what=f"{cfg} m={m} parts={parts} dx")
        assert_close(dw, rdw, torch.float32, scale=50, what=f"{cfg} m={m} parts={parts} dw")
    # and without it, the same call gives the plain gradient (the kernel without dsum)
    dx, _, _ = cluster_bwd(x, dy, w, None, rstd, True, False, cfg, 3, offset)
    assert_close(dx, rdx, dtype, scale=2, what=f"{cfg} m={m} no dsum")


@needs_hopper
def test_cluster_norm_backward_residual_grad_refuses_bad_calls():
    op = torch.ops.warpforge_cuda.norm_bwd
    x = torch.randn(4, 4096, device=DEV).to(torch.bfloat16)
    dy, dx, ds = torch.randn_like(x), torch.empty_like(x), torch.randn_like(x)
    rstd = torch.ones(4, device=DEV)
    with pytest.raises(RuntimeError, match="RMSNorm's only"):
        op(x, dy, None, rstd, rstd, 0.0, False, [2, 256, 1, 2, 2], dx, None, None, ds)
    with pytest.raises(RuntimeError, match="runs 256 threads"):
        op(x, dy, None, None, rstd, 0.0, True, [4, 128, 1, 2, 2], dx, None, None, ds)
    with pytest.raises(RuntimeError, match="8 vectors"):
        op(x, dy, None, None, rstd, 0.0, True, [2, 256, 1, 4, 2], dx, None, None, ds)
    with pytest.raises(RuntimeError, match="'grad_sum' must have the input's dtype"):
        op(x, dy, None, None, rstd, 0.0, True, [2, 256, 1, 2, 2], dx, None, None, ds.half())
    with pytest.raises(RuntimeError, match="16-byte boundaries"):
        buf = torch.randn(4 * 4096 + 1, device=DEV).to(torch.bfloat16)
        op(x, dy, None, None, rstd, 0.0, True, [2, 256, 1, 2, 2], dx, None, None, buf[1:].view(4, 4096))


def spy_norm_bwd_route(monkeypatch) -> list:
    """Every launch shape norms' backward route returns (None: Triton), with the eager fast path off
    (it replays Triton kernels Python launched before for the same key)."""
    taken = []
    real = norms._norm_bwd_cluster
    monkeypatch.setattr(norms, "_norm_bwd_cluster", lambda *a: taken.append(real(*a)) or taken[-1])
    monkeypatch.setattr(norms.fastpath, "door", lambda t: None)
    return taken


def check_add_rms_norm_backward(shape, what):
    """wf.add_rms_norm's gradients of h, r and w, both outputs differentiated, against float64
    autograd of RMSNorm over the sum it returned (dh = dr = its gradient plus the sum's own)."""
    n = shape[-1]
    h = torch.randn(*shape, device=DEV).to(torch.bfloat16).requires_grad_()
    r = torch.randn(*shape, device=DEV).to(torch.bfloat16).requires_grad_()
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16).requires_grad_()
    out, s = wf.add_rms_norm(h, r, w, eps=1e-6)
    dout, ds = torch.randn_like(out), torch.randn_like(s)
    torch.autograd.backward((out, s), (dout, ds))
    s64 = s.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    (s64 * (s64.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w64).backward(dout.double())
    assert_close(h.grad, s64.grad + ds.double(), torch.bfloat16, scale=2, what=f"{what} dh")
    assert_close(r.grad, s64.grad + ds.double(), torch.bfloat16, scale=2, what=f"{what} dr")
    assert_close(w.grad, w64.grad, torch.bfloat16, scale=2, what=f"{what} dw")


@needs_hopper
def test_add_rms_norm_backward_routes_to_cluster_kernel(monkeypatch):
    """add+RMSNorm's backward takes the cluster kernel where the table's shape can add the residual
    gradient (rows of 4,096 at 2 x 256 x 1 here), and keeps Triton where it cannot (128 threads),
    the device's tables patched (heuristics.norm_bwd_cluster_config checks the shape)."""
    from warpforge.runtime import heuristics

    taken = spy_norm_bwd_route(monkeypatch)
    name = torch.cuda.get_device_name()
    m = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {4096: (2, 256, 1, 2, 2), 2048: (2, 128, 1, 2, 2)}
    monkeypatch.setattr(heuristics, "NORM_BWD_CLUSTER", {name: {(False, n): c for n, c in shapes.items()}})
    monkeypatch.setattr(heuristics, "NORM_BWD_DSUM", {name: tuple(shapes)})
    for n, want in ((4096, (2, 256, 1, 2, 2)), (2048, None)):
        taken.clear()
        check_add_rms_norm_backward((m, n), f"n={n}")
        assert taken == [want], f"n={n}: route {taken}"


@needs_hopper
def test_add_rms_norm_backward_route_real_table(monkeypatch):
    """The device's own tables: add+RMSNorm's backward takes the cluster kernel at the lengths
    heuristics.NORM_BWD_DSUM lists, and Triton at a length RMSNorm's table has but it does not."""
    name = torch.cuda.get_device_name()
    m = torch.cuda.get_device_properties(0).multi_processor_count
    lengths = [n for n in (65536, 262144) if norms.norm_bwd_cluster_config(n, m, False, name) is not None]
    if not lengths:
        pytest.skip(f"no cluster backward for long rows on {name}")
    taken = spy_norm_bwd_route(monkeypatch)
    for n in lengths:
        taken.clear()
        want = norms.norm_bwd_cluster_config(n, m, False, name, True) is not None
        check_add_rms_norm_backward((m, n), f"n={n}")
        assert len(taken) == 1 and (taken[0] is not None) == want, f"n={n}: route {taken}, cluster expected {want}"


@needs_hopper
@pytest.mark.parametrize("which", ["none", "bias", "weight"])
def test_cluster_norm_backward_optional_parameters(which):
    cfg = (2, 128, 1, 2, 2)
    n = 2048
    x = torch.randn(37, n, device=DEV).to(torch.bfloat16)
    dy = torch.randn(37, n, device=DEV).to(torch.bfloat16)
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16) if which == "weight" else None
    b = torch.randn(n, device=DEV).to(torch.bfloat16) if which == "bias" else None
    (rdx, rdw, rdb), mean, rstd = reference_bwd(x, dy, w, b, False)
    dx, dw, db = cluster_bwd(x, dy, w, mean, rstd, False, b is not None, cfg, 66)
    assert_close(dx, rdx, torch.bfloat16, scale=2, what="dx")
    if w is not None:
        assert_close(dw, rdw, torch.float32, scale=50, what="dw")
    if b is not None:
        assert_close(db, rdb, torch.float32, scale=50, what="db")


@needs_hopper
def test_cluster_norm_backward_refuses_bad_calls():
    op = torch.ops.warpforge_cuda.norm_bwd
    x = torch.randn(4, 2048, device=DEV).to(torch.bfloat16)
    dy, dx = torch.randn_like(x), torch.empty_like(x)
    rstd = torch.ones(4, device=DEV)
    with pytest.raises(RuntimeError, match="needs 'mean'"):
        op(x, dy, None, None, rstd, 0.0, False, [2, 128, 1, 2, 2], dx, None, None)
    with pytest.raises(RuntimeError, match="128 or 256 threads"):
        op(x, torch.randn(4, 4096, device=DEV).to(torch.bfloat16)[:, :2048], None, None, rstd, 0.0, True,
           [2, 1024, 1, 2, 2], dx, None, None)
    with pytest.raises(RuntimeError, match="same parts"):
        op(x, dy, None, rstd, rstd, 0.0, False, [2, 128, 1, 2, 2], dx, torch.empty(3, 2048, device=DEV),
           torch.empty(2, 2048, device=DEV))
    with pytest.raises(RuntimeError, match="'grad_output' must have the input's dtype"):
        op(x, dy.half(), None, rstd, rstd, 0.0, False, [2, 128, 1, 2, 2], dx, None, None)


@pytest.fixture
def small_bwd_route(monkeypatch):
    """The LayerNorm / RMSNorm backward takes the cluster kernel for rows of 2,048."""
    return route_rows_of_2048(monkeypatch, "_norm_bwd_cluster")


@needs_hopper
@pytest.mark.parametrize("op", ["layer", "rms", "rms_offset"])
def test_norm_backward_routes_to_cluster_kernel(small_bwd_route, op):
    n = 2048
    x = torch.randn(4, 9, n, device=DEV).to(torch.bfloat16).requires_grad_()
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16).requires_grad_()
    b = torch.randn(n, device=DEV).to(torch.bfloat16).requires_grad_()
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    if op == "layer":
        y = wf.layer_norm(x, (n,), w, b)
        ref = F.layer_norm(x64, (n,), w64, b64, 1e-5)
    else:
        off = 1.0 if op == "rms_offset" else 0.0
        y = wf.rms_norm(x, (n,), w, eps=1e-6, offset=off)
        ref = x64 * (x64.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * (w64 + off)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref.backward(dy.double())
    assert small_bwd_route == [(2, 128, 1, 2, 2)]
    assert_close(x.grad, x64.grad, torch.bfloat16, scale=2, what="dx")
    assert_close(w.grad, w64.grad, torch.bfloat16, scale=2, what="dw")
    if op == "layer":
        assert_close(b.grad, b64.grad, torch.bfloat16, scale=2, what="db")


@needs_hopper
def test_norm_backward_route_narrowed_gradient(small_bwd_route):
    """y concatenated with another tensor: the backward hands the norm a dy narrowed out of the
    concatenation's gradient (row stride 2n, x's n). The route takes it and the gradients are right."""
    n = 2048
    x = torch.randn(12, n, device=DEV).to(torch.bfloat16).requires_grad_()
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16).requires_grad_()
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    y = wf.rms_norm(x, (n,), w, eps=1e-6)
    ref = x64 * (x64.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w64
    g = torch.randn(12, 2 * n, device=DEV).to(torch.bfloat16)
    torch.cat([y, torch.zeros_like(y)], -1).backward(g)
    ref.backward(g[:, :n].double())
    assert small_bwd_route == [(2, 128, 1, 2, 2)]
    assert_close(x.grad, x64.grad, torch.bfloat16, scale=2, what="dx")
    assert_close(w.grad, w64.grad, torch.bfloat16, scale=2, what="dw")


@needs_hopper
@pytest.mark.parametrize("op", ["layer", "rms"])
def test_norm_backward_route_real_table(monkeypatch, op):
    """The device's own table (H200: 32,768 columns), through autograd with the eager fast path on:
    the cluster backward runs on every call, the fast path's later replays included."""
    n, m = 32768, 2 * torch.cuda.get_device_properties(0).multi_processor_count
    name = torch.cuda.get_device_name()
    if norms.norm_bwd_cluster_config(n, m, op == "layer", name) is None:
        pytest.skip(f"no cluster backward for rows of {n} on {name}")
    taken = []
    real = norms._norm_bwd_cluster
    monkeypatch.setattr(norms, "_norm_bwd_cluster", lambda *a: taken.append(real(*a)) or taken[-1])
    x = torch.randn(m, n, device=DEV).to(torch.bfloat16)
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16)
    b = torch.randn(n, device=DEV).to(torch.bfloat16)
    dy = torch.randn(m, n, device=DEV).to(torch.bfloat16)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    if op == "layer":
        F.layer_norm(x64, (n,), w64, b64, 1e-5).backward(dy.double())
    else:
        (x64 * (x64.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w64).backward(dy.double())
    for call in range(3):
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
        y = wf.layer_norm(xg, (n,), wg, bg) if op == "layer" else wf.rms_norm(xg, (n,), wg, eps=1e-6)
        y.backward(dy)
        assert len(taken) == call + 1 and taken[-1] is not None, f"call {call}: the Triton backward ran"
        assert_close(xg.grad, x64.grad, torch.bfloat16, scale=2, what=f"call {call} dx")
        assert_close(wg.grad, w64.grad, torch.bfloat16, scale=2, what=f"call {call} dw")
        if op == "layer":
            assert_close(bg.grad, b64.grad, torch.bfloat16, scale=2, what=f"call {call} db")


@needs_hopper
def test_norm_backward_route_declines(small_bwd_route):
    n = 2048
    x = torch.randn(6, n, device=DEV).to(torch.bfloat16).requires_grad_()
    w = torch.rand(n, device=DEV).requires_grad_()            # fp32 weight: Triton
    wf.rms_norm(x, (n,), w).sum().backward()
    xl = torch.randn(6, n, device=DEV).to(torch.bfloat16).requires_grad_()
    wb = torch.rand(n, device=DEV).to(torch.bfloat16)
    wf.rms_norm(xl, (n,), wb, casting_mode="llama").sum().backward()   # llama casting: Triton
    h = torch.randn(6, n, device=DEV).to(torch.bfloat16).requires_grad_()
    r = torch.randn(6, n, device=DEV).to(torch.bfloat16).requires_grad_()
    out, s = wf.add_rms_norm(h, r, wb)
    (out.float().sum() + s.float().sum()).backward()            # a residual gradient: Triton
    assert small_bwd_route == []
