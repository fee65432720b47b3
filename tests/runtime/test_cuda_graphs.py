"""CUDA graph capture of every public op, which serving loops and torch.compile(mode="reduce-overhead")
rely on. Each op is warmed up eagerly on a side stream (the PyTorch CUDA-graphs recipe), one call is
captured -- the forward, or forward and backward together ("whole network capture": the leaves' .grad
set to None first, so the backward allocates them in the graph's pool) -- new values are copied into
the static inputs, and the replay must give the eager call's bits on those values: outputs, gradients
and inputs written in place (the paged KV cache). Only attention's Hopper backward, whose dQ is summed
by TMA reduce-adds, is held to a tolerance. Outputs start NaN-poisoned (conftest) and NaN never passes.
The eager fast path's C++ launches and the Python path are each captured. GPU only: capture needs CUDA."""
from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch

import warpforge as wf
import warpforge.ops.decode_attention as decode_mod
import warpforge.ops.matmul as matmul_mod
from warpforge.runtime import fastpath, heuristics
from conftest import DEVICE, TOL, gpu_only, randn, rel_err

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
ATTN_GRAD_TOL = 1e-2    # dQ of the Hopper fused backward: reduce-adds in an order that varies


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------
def _x(*shape, dtype=BF16, scale=1.0):
    """A float input that takes a gradient (detached for the forward-only captures)."""
    return randn(*shape, dtype=dtype, scale=scale, requires_grad=True)


def _w(n):
    """A norm weight around 1."""
    return (randn(n) * 0.5 + 1).to(BF16).requires_grad_()


def _ids(*shape, high):
    return torch.randint(0, high, shape, device=DEVICE)


def _fp8(*shape):
    return (randn(*shape) * 4).to(FP8)


def _scale(n):
    return torch.rand(n, device=DEVICE) + 0.5


def _rope_inputs():
    ang = torch.rand(256, 64, device=DEVICE) * 6.28
    return _x(2, 4, 256, 64), _x(2, 2, 256, 64), ang.cos(), ang.sin(), _ids(2, 256, high=256)


def _varlen_inputs():
    """GQA over 4 packed sequences; the replays shuffle them (same total and longest: the grid's)."""
    lens = torch.tensor([100, 256, 37, 119])[torch.randperm(4)]
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).int().to(DEVICE)
    return _x(512, 4, 64), _x(512, 2, 64), _x(512, 2, 64), cu


def _varlen(q, k, v, cu, validate=False):
    return wf.attention_varlen(q, k, v, cu, cu, 256, 256, causal=True, validate=validate)


def _moe_inputs(t, d=256, n=128, e=8, k=2):
    ids = torch.rand(t, e, device=DEVICE).topk(k, -1).indices.int()
    wts = torch.softmax(torch.randn(t, k, device=DEVICE), -1).requires_grad_()
    return _x(t, d), _x(e, 2 * n, d, scale=d ** -0.5), _x(e, d, n, scale=n ** -0.5), wts, ids


def _moe(x, w1, w2, wts, ids, validate=False):
    return wf.moe_experts(x, w1, w2, wts, ids, validate=validate)


def _decode_inputs(bsz=4, hq=8, hkv=2, d=128, page=16, mb=16):
    """q, the new token's key and value, paged caches, a shuffled block table, lengths with room for
    one more token (sequence 0 fills its table but for it), as tests/ops/test_decode_attention.py."""
    nb = bsz * mb + 5
    bt = torch.randperm(nb, device=DEVICE)[: bsz * mb].view(bsz, mb).int()
    lens = torch.randint(0, mb * page, (bsz,), device=DEVICE, dtype=torch.int32)
    lens[0] = mb * page - 1
    return (randn(bsz, hq, d, dtype=BF16), randn(bsz, 1, hkv, d, dtype=BF16), randn(bsz, 1, hkv, d, dtype=BF16),
            randn(nb, page, hkv, d, dtype=BF16), randn(nb, page, hkv, d, dtype=BF16), bt, lens)


def _decode_step(q, key, value, kc, vc, bt, lens, validate=False):
    """A decode step: append the new token into the caches in place, then attend over the grown sequences."""
    wf.append_paged_kv(key, value, kc, vc, bt, lens, validate=validate)
    return wf.decode_attention(q, kc, vc, bt, lens + 1, validate=validate)


@dataclasses.dataclass
class Case:
    make: Callable[[], tuple]     # fresh inputs of fixed shapes; the float leaves that take gradients require grad
    fn: Callable                  # fn(*inputs) -> a tensor or a tuple of them (None entries dropped)
    fast: bool = False            # the eager fast path (C++ launch and autograd node) takes the call
    differentiable: bool = True
    grad_tol: float = 0.0         # 0: gradients bit for bit; else the relative error allowed
    needs: str = ""               # "fp8": compute capability >= 8.9; "sm90": the Hopper decode kernel


def _linear(x, w, b, r):
    return wf.linear(x, w, b, "silu", r)


def _sdpa(q, k, v):
    return wf.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sdpa_gqa(q, k, v):
    return wf.scaled_dot_product_attention(q, k, v, enable_gqa=True)


CASES = {
    "add": Case(lambda: (_x(64, 4096), _x(64, 4096)), lambda x, y: wf.add(x, y, alpha=0.5), fast=True),
    "sum": Case(lambda: (_x(32, 4096, scale=2.0),), lambda x: wf.sum(x, -1), fast=True),
    "amax": Case(lambda: (_x(32, 4096),), lambda x: wf.amax(x, -1), fast=True),
    "softmax": Case(lambda: (_x(32, 4096, scale=3.0),), lambda x: wf.softmax(x, -1), fast=True),
    "log_softmax": Case(lambda: (_x(32, 4096, scale=3.0),), lambda x: wf.log_softmax(x, -1), fast=True),
    # 64K rows: the split exchange (heuristics.softmax_config; a workspace per call, _rows.split_launch)
    "softmax_65536": Case(lambda: (_x(32, 65536, scale=3.0),), lambda x: wf.softmax(x, -1)),
    # one row an SM at 262K: on the H200 the CUDA backend's staged cluster forward (SOFTMAX_CLUSTER)
    "softmax_262144": Case(lambda: (_x(132, 262144, scale=3.0),), lambda x: wf.softmax(x, -1)),
    "layer_norm": Case(lambda: (_x(32, 4096, scale=2.0), _w(4096), _x(4096)),
                       lambda x, w, b: wf.layer_norm(x, (4096,), w, b), fast=True),
    "rms_norm": Case(lambda: (_x(32, 4096, scale=2.0), _w(4096)), lambda x, w: wf.rms_norm(x, (4096,), w, 1e-6),
                     fast=True),
    # 64K rows: the pipe exchange forward (heuristics.norm_fwd_config) and its backward
    "rms_norm_65536": Case(lambda: (_x(32, 65536, scale=2.0), _w(65536)),
                           lambda x, w: wf.rms_norm(x, (65536,), w, 1e-6)),
    # more rows than SMs at 65K / 32K: on the H200 the CUDA backend's cluster kernels (LayerNorm's
    # forward and both backwards; heuristics.NORM_LAYER_CLUSTER, NORM_BWD_CLUSTER), Triton elsewhere
    "layer_norm_65536": Case(lambda: (_x(264, 65536, scale=2.0), _w(65536), _x(65536)),
                             lambda x, w, b: wf.layer_norm(x, (65536,), w, b)),
    "rms_norm_32768": Case(lambda: (_x(264, 32768, scale=2.0), _w(32768)),
                           lambda x, w: wf.rms_norm(x, (32768,), w, 1e-6)),
    "add_rms_norm": Case(lambda: (_x(32, 4096), _x(32, 4096), _w(4096)),
                         lambda x, r, w: wf.add_rms_norm(x, r, w, 1e-6), fast=True),
    "swiglu": Case(lambda: (_x(32, 4096, scale=2.0), _x(32, 4096)), wf.swiglu, fast=True),
    "geglu": Case(lambda: (_x(32, 4096, scale=2.0), _x(32, 4096)), wf.geglu, fast=True),
    "apply_rope": Case(_rope_inputs, wf.apply_rope, fast=True),
    "matmul": Case(lambda: (_x(32, 4096), _x(4096, 1024, scale=4096 ** -0.5)), wf.matmul),   # split-K
    "linear": Case(lambda: (_x(64, 1024), _x(4096, 1024, scale=1024 ** -0.5), _x(4096), _x(64, 4096)), _linear),
    "cross_entropy": Case(lambda: (_x(64, 32000, scale=2.0), _ids(64, high=32000)), wf.cross_entropy),
    "linear_cross_entropy": Case(lambda: (_x(64, 1024), _x(32000, 1024, scale=1024 ** -0.5), _ids(64, high=32000)),
                                 wf.linear_cross_entropy),
    "sdpa_causal": Case(lambda: tuple(_x(2, 4, 256, 64) for _ in range(3)), _sdpa, grad_tol=ATTN_GRAD_TOL),
    "sdpa_gqa": Case(lambda: (_x(2, 4, 256, 128), _x(2, 2, 256, 128), _x(2, 2, 256, 128)), _sdpa_gqa,
                     grad_tol=ATTN_GRAD_TOL),
    "attention_varlen": Case(_varlen_inputs, _varlen),
    "decode": Case(_decode_inputs, _decode_step, differentiable=False),
    "decode_sm90": Case(_decode_inputs, _decode_step, differentiable=False, needs="sm90"),
    "moe_route": Case(lambda: (_x(64, 8, dtype=torch.float32, scale=2.0),),
                      lambda x: wf.moe_route(x, 2, renormalize=True, aux_loss_coef=0.01)),
    "moe_experts": Case(lambda: _moe_inputs(64), _moe),
    "moe_experts_1024": Case(lambda: _moe_inputs(1024), _moe),      # 128-row tiles: the Hopper TMA kernels
    "quantize_fp8": Case(lambda: (randn(64, 4096, dtype=BF16),), wf.quantize_fp8, differentiable=False, needs="fp8"),
    "scaled_matmul": Case(lambda: (_fp8(64, 4096), _fp8(1024, 4096), _scale(64), _scale(1024)),
                          lambda a, w, sa, sb: wf.scaled_matmul(a, w.t(), sa, sb), differentiable=False, needs="fp8"),
    "linear_fp8": Case(lambda: (randn(64, 4096, dtype=BF16), _fp8(1024, 4096), _scale(1024), randn(1024, dtype=BF16)),
                       wf.linear_fp8, differentiable=False, needs="fp8"),
}


# ----------------------------------------------------------------------------------------------
# Capture, replay, compare
# ----------------------------------------------------------------------------------------------
def _outs(out) -> list:
    return [t for t in (out if isinstance(out, tuple) else (out,)) if t is not None]


def _same(got, want, what: str, tol: float = 0.0) -> None:
    """Bit for bit (or within ``tol`` relative error), and never NaN: an element the replay left
    unwritten keeps its NaN poison (torch.equal fails on NaN too)."""
    assert got is not None and got.shape == want.shape and got.dtype == want.dtype, what
    if got.is_floating_point():
        assert torch.isfinite(got.float()).all(), f"{what}: the replay left NaN/inf"
        assert torch.isfinite(want.float()).all(), f"{what}: the eager call gave NaN/inf"
    if tol:
        err = rel_err(got, want)
        assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"
    else:
        bits = (lambda t: t.view(torch.uint8)) if got.element_size() == 1 and got.is_floating_point() else (lambda t: t)
        assert torch.equal(bits(got), bits(want)), f"{what}: the replay differs from the eager call"


class Graphed:
    """``case`` captured in a CUDA graph: forward only, or (``grad``) forward and the backward of
    sum(out * gout) over its float outputs, gout a static seed."""

    def __init__(self, case: Case, grad: bool):
        self.case = case
        self.static = [t if grad else t.detach() for t in case.make()]
        leaves = [t for t in self.static if t.requires_grad]
        # eager, without grad: the outputs' shapes (and the fast path's offers). With grad, the graph it
        # built would keep the leaves' AccumulateGrad nodes alive, tied to the default stream, and the
        # captured backward would then make the legacy stream wait on the capture (an error)
        with torch.no_grad():
            outs = _outs(case.fn(*self.static))
        self.gouts = [torch.randn(o.shape, device=DEVICE).to(o.dtype) if o.is_floating_point() else None
                      for o in outs] if leaves else None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step(self.static)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outs = self._step(self.static)
        self.grads = [t.grad for t in leaves]      # in the graph's pool: every replay rewrites them

    def _step(self, inputs) -> list:
        for t in inputs:
            if t.requires_grad:
                t.grad = None
        outs = _outs(self.case.fn(*inputs))
        if self.gouts is not None:
            sum((o.float() * g.float()).sum() for o, g in zip(outs, self.gouts) if g is not None).backward()
        return outs

    def check(self) -> None:
        """New values into the static inputs and seeds, replay, and an eager call on a copy of the
        same values must match it: outputs, gradients, and the inputs (those written in place)."""
        with torch.no_grad():
            for s, new in zip(self.static, self.case.make()):
                s.copy_(new)
            for g in self.gouts or ():
                if g is not None:
                    g.copy_(torch.randn(g.shape, device=DEVICE).to(g.dtype))
        before = [t.detach().clone().requires_grad_(t.requires_grad) for t in self.static]
        self.graph.replay()
        outs = self._step(before)
        for i, (got, want) in enumerate(zip(self.outs, outs, strict=True)):
            _same(got.detach(), want.detach(), f"output {i}")
        for i, (got, leaf) in enumerate(zip(self.grads, [t for t in before if t.requires_grad], strict=True)):
            _same(got, leaf.grad, f"gradient of leaf {i}", self.case.grad_tol)
        for i, (got, want) in enumerate(zip(self.static, before)):
            _same(got.detach(), want.detach(), f"input {i}")


def _require(case: Case, monkeypatch) -> None:
    if case.needs == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 GEMMs need compute capability 8.9 or newer")
    if case.needs == "sm90":
        if torch.cuda.get_device_capability()[0] != 9 or decode_mod._sm90_kernel() is None:
            pytest.skip("needs a Hopper GPU and Gluon (ops/decode_attention_sm90.py)")
        monkeypatch.setattr(heuristics, "DECODE_SM90_MIN_TOKENS", 0)      # small calls take it too


def _path(path: str, monkeypatch) -> None:
    """'fast': the eager fast path on (its C++ launches and nodes are what is captured); 'python':
    off, as WARPFORGE_FASTPATH=0; '-': as it is (an op the fast path does not take)."""
    if path == "python":
        monkeypatch.setattr(fastpath, "lib", None)
    elif path == "fast":
        if not fastpath.load():
            pytest.skip(f"the eager fast path is {fastpath.status()}")
        monkeypatch.setattr(fastpath, "lib", fastpath.lib)      # restored after the test


def _cpp_node(y) -> bool:
    """y was made by one of the fast path's C++ autograd nodes (as tests/runtime/test_fastpath.py)."""
    node = y.grad_fn
    while node.name().startswith("Unsqueeze"):
        node = node.next_functions[0][0]
    name = node.name()
    return "Fn" in name and "autograd" not in name.lower().replace("torch::autograd", "")


PARAMS = [pytest.param(name, path, grad, id="-".join(p for p in (name, path, "fwd+bwd" if grad else "fwd") if p != "-"))
          for name, case in CASES.items() for path in (("fast", "python") if case.fast else ("-",))
          for grad in ((False, True) if case.differentiable else (False,))]


@gpu_only
@pytest.mark.parametrize("name, path, grad", PARAMS)
def test_capture_replays_eager_bits(name, path, grad, monkeypatch):
    """Guards that an op captures (no host sync, nothing compiled or allocated for keeps inside the
    capture) and that replays read the static inputs' new values rather than anything cached at
    capture: two replays on fresh values, each against an eager call, forward and backward."""
    case = CASES[name]
    _require(case, monkeypatch)
    _path(path, monkeypatch)
    g = Graphed(case, grad)
    if path == "fast" and grad:
        assert _cpp_node(g.outs[0]), f"the fast path did not take the captured call ({g.outs[0].grad_fn.name()})"
    for _ in range(2):
        g.check()


# Shapes whose plans and launch caches differ: decode_attention's _PLANS (compiled kernels replayed
# per signature), matmul's _PLANS and split-K counters, the fast path's table, MoE's tile layout.
PAIRS = {
    "decode": (CASES["decode"], Case(lambda: _decode_inputs(bsz=2, hq=4, hkv=1, d=64, mb=8), _decode_step,
                                     differentiable=False)),
    "linear": (CASES["linear"], Case(lambda: (_x(16, 2048), _x(1024, 2048, scale=2048 ** -0.5), _x(1024),
                                              _x(16, 1024)), _linear)),
    "rms_norm": (CASES["rms_norm"], Case(lambda: (_x(8, 1024), _w(1024)), lambda x, w: wf.rms_norm(x, (1024,), w, 1e-6))),
    "moe_experts": (CASES["moe_experts"], Case(lambda: _moe_inputs(200, d=128, n=64), _moe)),
}


@gpu_only
@pytest.mark.parametrize("name", PAIRS)
def test_two_shapes_two_graphs(name, monkeypatch):
    """Two captures of one op at different shapes in one process both replay correctly: caches keyed
    by shape (decode's per-signature plans, matmul's plans) must not cross. The second graph is
    replayed first, before the first one ever ran, as a serving engine that captures every batch
    size and then replays whichever comes: state the first capture created (matmul's split-K
    counters, emptied here as in a fresh process) must not depend on that graph having run."""
    monkeypatch.setattr(matmul_mod, "_LOCKS", {})
    first, second = (Graphed(case, case.differentiable) for case in PAIRS[name])
    for g in (second, first, second, first):
        g.check()


@gpu_only
@pytest.mark.parametrize("name", ["matmul", "linear"])
def test_split_k_graph_owns_its_counters(name, monkeypatch):
    """A graph of split-K GEMMs zeroes its own arrival counters: with the counter buffers kept for
    eager calls filled with garbage after the capture, replays still match eager (on fresh, zeroed
    kept buffers). Kept buffers used inside captures were zeroed only where they were first made,
    possibly inside another graph (ops/matmul.py, _split_locks)."""
    monkeypatch.setattr(matmul_mod, "_LOCKS", {})
    g = Graphed(CASES[name], grad=True)
    for _ in range(2):
        kept = list(matmul_mod._LOCKS.values())     # held, so their memory is not handed out again
        for buf in kept:
            buf.fill_(7)
        matmul_mod._LOCKS.clear()        # check()'s eager call makes fresh, zeroed ones
        g.check()
        del kept


VALIDATED = {
    "moe_experts": Case(lambda: _moe_inputs(64), lambda *a: _moe(*a, validate=True)),
    "decode": Case(_decode_inputs, lambda *a: _decode_step(*a, validate=True), differentiable=False),
    "attention_varlen": Case(_varlen_inputs, lambda *a: _varlen(*a, validate=True)),
}


@gpu_only
@pytest.mark.parametrize("name", VALIDATED)
def test_validate_true_is_skipped_under_capture(name):
    """validate=True (the default) checks the metadata with a device-to-host copy, which no capture
    allows: during capture the check must be skipped (decode's _skip_sync, moe's _validate_ids) and
    the call captured, rather than the capture broken."""
    g = Graphed(VALIDATED[name], grad=False)
    g.check()


# ----------------------------------------------------------------------------------------------
# torch.compile(mode="reduce-overhead"): CUDA graph trees over the compiled forward and backward
# ----------------------------------------------------------------------------------------------
class _Block(torch.nn.Module):
    """RMSNorm -> Linear(silu) (the qkv projection) -> causal attention -> Linear."""

    def __init__(self, d: int = 512, heads: int = 8):
        super().__init__()
        kw = dict(device=DEVICE, dtype=BF16)
        self.heads = heads
        self.norm = wf.nn.RMSNorm(d, **kw)
        self.qkv = wf.nn.Linear(d, 3 * d, activation="silu", **kw)
        self.proj = wf.nn.Linear(d, d, **kw)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.1)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = wf.scaled_dot_product_attention(q, k, v, is_causal=True)            # (B, H, S, D / H)
        return self.proj(o.transpose(1, 2).reshape(b, s, d))


def _fwd_bwd(model, x, gout, params) -> list:
    torch.compiler.cudagraph_mark_step_begin()
    for p in params:
        p.grad = None
    x = x.detach().clone().requires_grad_()
    out = model(x)
    (out.float() * gout.float()).sum().backward()
    # clones: a graph tree's outputs (and the grads autograd took from them) are its pool's, rewritten next step
    return [out.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in params)]


@gpu_only
@pytest.mark.parametrize("bsz, seq", [(2, 256), (1, 48)], ids=["prefill", "decode-sized"])
def test_compile_reduce_overhead(bsz, seq):
    """torch.compile(mode="reduce-overhead", fullgraph=True) over a block of warpforge modules: graph
    trees capture the compiled forward and backward (no cudagraph skip) and their replays, on new
    inputs each step, agree with eager. 48 tokens make the projections' GEMMs split K (counters kept
    per stream, matmul._LOCKS) inside the graph tree's pool."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _Block()
    params = list(model.parameters())
    names = ["out", "dx", *(n for n, _ in model.named_parameters())]
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    try:
        for step in range(4):        # warm-up, record, then replays
            x, gout = randn(bsz, seq, 512, dtype=BF16), randn(bsz, seq, 512, dtype=BF16)
            got = _fwd_bwd(compiled, x, gout, params)
            want = _fwd_bwd(model, x, gout, params)
            for name, a, b in zip(names, got, want, strict=True):
                err = rel_err(a, b)          # NaN never passes
                assert err <= TOL[BF16], f"step {step}, {name}: relative error {err:.2e}"
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    finally:
        torch._dynamo.reset()
