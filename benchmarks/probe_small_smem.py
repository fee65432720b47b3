"""Every public op as on a GPU with less shared memory a block than Hopper, run on a Hopper GPU.

The launch tiles were chosen on Hopper (232,448 B a block); an A100 has 166,912 B and sm_86/89
cards (RTX 3090/4090, A10, L4, L40) 101,376 B, and Triton refuses a kernel that needs more when it
loads. Without such a card, this emulates one: Triton's limit lowered (``--limit``), and
``torch.cuda.get_device_capability`` answering 8.0 after Triton has taken the real one (so
warpforge routes as on an A100: no Gluon, TMA or cluster kernels; Triton still compiles for the
GPU it runs on, whose shared-memory sizes are within a few KB of sm_80's, measured offline). The
CUDA C++ backend is switched off (it builds for the capability it reads). Each op runs forward
and, where it has one, backward at a training- or serving-size shape against its reference;
the table lists the relative error, an error if the call failed, and the launch configurations
that stepped down (runtime/launch.py, launch_fitting).

    python benchmarks/probe_small_smem.py --limit 101376
"""
from __future__ import annotations

import argparse
import os
import traceback

os.environ.setdefault("WARPFORGE_NORM_CUDA", "0")
os.environ.setdefault("WARPFORGE_SOFTMAX_CUDA", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.compiler import compiler  # noqa: E402
from triton.runtime import driver  # noqa: E402


def _rel(out, ref) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _leaves(*ts):
    return [t.detach().double().requires_grad_() for t in ts]


def _fb(fn, ref_fn, *inputs, grads=True):
    """Relative errors of fn(*inputs) against ref_fn on float64 copies, and of each input gradient."""
    xs = [t.detach().clone().requires_grad_(grads and t.is_floating_point()) for t in inputs]
    rs = [t.detach().double().requires_grad_(grads and t.is_floating_point()) if t.is_floating_point() else t
          for t in inputs]
    out, ref = fn(*xs), ref_fn(*rs)
    errs = [_rel(out, ref)]
    if grads:
        g = torch.randn_like(out)
        out.backward(g)
        ref.backward(g.double())
        errs += [_rel(x.grad, r.grad) for x, r in zip(xs, rs) if x.requires_grad]
    return max(errs)


def cases(wf):
    from warpforge.ops.attention import attention_reference
    from warpforge.ops.decode_attention import decode_attention_reference
    from warpforge.ops.moe import moe_experts_reference
    dev, bf = "cuda", torch.bfloat16
    r = lambda *s, dt=bf, sc=1.0: (torch.randn(*s, device=dev) * sc).to(dt)
    x = r(4096, 4096)
    w = r(4096)
    yield "add", lambda: _fb(wf.add, torch.add, x, r(4096, 4096))
    yield "softmax", lambda: _fb(lambda t: wf.softmax(t, -1), lambda t: torch.softmax(t, -1), r(4096, 32768))
    yield "log_softmax", lambda: _fb(lambda t: wf.log_softmax(t, -1), lambda t: torch.log_softmax(t, -1), r(1024, 131072))
    rms = lambda t, g: wf.rms_norm(t, (t.shape[-1],), g, 1e-6)
    rms_ref = lambda t, g: F.rms_norm(t, (t.shape[-1],), g, 1e-6)
    yield "rms_norm", lambda: _fb(rms, rms_ref, x, w)
    yield "rms_norm 16K", lambda: _fb(rms, rms_ref, r(2048, 16384), r(16384))
    yield "layer_norm", lambda: _fb(lambda t, g, b: wf.layer_norm(t, (4096,), g, b),
                                    lambda t, g, b: F.layer_norm(t, (4096,), g, b), x, w, r(4096))
    yield "layer_norm 64K", lambda: _fb(lambda t, g, b: wf.layer_norm(t, (65536,), g, b),
                                        lambda t, g, b: F.layer_norm(t, (65536,), g, b), r(256, 65536), r(65536), r(65536))
    yield "swiglu", lambda: _fb(wf.swiglu, lambda a, b: F.silu(a) * b, x, r(4096, 4096))
    yield "sum", lambda: _fb(lambda t: wf.sum(t, -1), lambda t: t.sum(-1), r(4096, 32768, dt=torch.float32))
    yield "amax", lambda: _fb(lambda t: wf.amax(t, -1), lambda t: t.amax(-1), r(4096, 32768, dt=torch.float32))

    def rope():
        q, k = r(4, 32, 4096, 128), r(4, 8, 4096, 128)             # (B, H, S, D)
        ang = torch.outer(torch.arange(4096, device=dev).float(), 1e-4 ** (torch.arange(64, device=dev) / 64))
        cos, sin = ang.cos().repeat(1, 2), ang.sin().repeat(1, 2)    # (S, D)

        def ref(q, k):
            rot = lambda t: torch.cat((-t[..., 64:], t[..., :64]), -1)
            c, s = cos.double()[None, None], sin.double()[None, None]
            return torch.cat([(q * c + rot(q) * s).flatten(), (k * c + rot(k) * s).flatten()])
        return _fb(lambda q, k: torch.cat([t.flatten() for t in wf.apply_rope(q, k, cos, sin)]), ref, q, k)
    yield "rope", rope
    yield "cross_entropy", lambda: _fb(lambda t, y: wf.cross_entropy(t, y), lambda t, y: F.cross_entropy(t, y),
                                       r(2048, 128256), torch.randint(0, 128256, (2048,), device=dev))
    yield "linear_cross_entropy", lambda: _fb(
        lambda h, wt, y: wf.linear_cross_entropy(h, wt, y), lambda h, wt, y: F.cross_entropy(h @ wt.T, y),
        r(2048, 4096, sc=0.5), r(32000, 4096, sc=0.02), torch.randint(0, 32000, (2048,), device=dev))
    for m in (16, 128, 4096):
        yield f"matmul {m}x4096x4096", lambda m=m: _fb(wf.matmul, torch.matmul, r(m, 4096), r(4096, 4096, sc=0.02))
        yield f"matmul fp32 {m}", lambda m=m: _fb(wf.matmul, torch.matmul, r(m, 4096, dt=torch.float32),
                                                  r(4096, 4096, dt=torch.float32, sc=0.02))
    yield "linear", lambda: _fb(lambda a, b, c: wf.linear(a, b, c), F.linear, r(4096, 4096), r(11008, 4096, sc=0.02), r(11008))

    def fp8():
        xw, wt = r(1024, 4096), r(4096, 4096, sc=0.02)
        wq, ws = wf.quantize_fp8(wt)
        return _rel(wf.linear_fp8(xw, wq, ws), F.linear(xw.double(), wt.double()))
    yield "linear_fp8", fp8
    for d in (64, 128, 256):
        for causal in (False, True):
            yield f"sdpa D{d}{' causal' if causal else ''}", lambda d=d, c=causal: _fb(
                lambda q, k, v: wf.scaled_dot_product_attention(q, k, v, is_causal=c, enable_gqa=True),
                lambda q, k, v: attention_reference(q, k, v, is_causal=c, enable_gqa=True)[0],
                r(2, 16, 2048, d), r(2, 4, 2048, d), r(2, 4, 2048, d))

    yield "sdpa fp32 D256 causal", lambda: _fb(
        lambda q, k, v: wf.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda q, k, v: attention_reference(q, k, v, is_causal=True)[0],
        *(r(1, 4, 1000, 256, dt=torch.float32) for _ in range(3)))

    def varlen():
        lens = torch.tensor([0, 700, 1, 1300], device=dev)
        cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).int()
        q, k, v = r(2001, 16, 128), r(2001, 4, 128), r(2001, 4, 128)

        def ref(q, k, v):
            outs = []
            for i in range(4):
                a, b = int(cu[i]), int(cu[i + 1])
                if b > a:
                    o, _ = attention_reference(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None],
                                               v[a:b].transpose(0, 1)[None], is_causal=True, enable_gqa=True)
                    outs.append(o[0].transpose(0, 1))
            return torch.cat(outs)
        return _fb(lambda q, k, v: wf.attention_varlen(q, k, v, cu, cu, 1300, 1300, causal=True), ref, q, k, v)
    yield "attention_varlen", varlen

    def decode():
        B, hq, hk, D, ctx, page = 16, 32, 8, 128, 8192, 16
        n_pages = B * ctx // page
        kc, vc = r(n_pages, page, hk, D), r(n_pages, page, hk, D)
        table = torch.randperm(n_pages, device=dev).int().view(B, -1)
        lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
        q = r(B, hq, D)
        return _rel(wf.decode_attention(q, kc, vc, table, lens),
                    decode_attention_reference(q.double(), kc.double(), vc.double(), table, lens))
    yield "decode_attention", decode

    def moe(T, d, n, E, k):
        ids = torch.rand(T, E, device=dev).topk(k, -1).indices.int()
        wts = torch.softmax(torch.randn(T, k, device=dev), -1)
        return _fb(lambda x, a, b, g: wf.moe_experts(x, a, b, g, ids), lambda x, a, b, g: moe_experts_reference(x, a, b, g, ids),
                   r(T, d), r(E, 2 * n, d, sc=d ** -0.5), r(E, d, n, sc=n ** -0.5), wts)
    yield "moe DeepSeek-V2-Lite T4096", lambda: moe(4096, 2048, 1408, 64, 6)
    yield "moe Mixtral T2048", lambda: moe(2048, 4096, 14336, 8, 2)
    yield "moe OLMoE T8 (decode)", lambda: moe(8, 2048, 1024, 64, 8)
    yield "moe Mixtral T64 (decode)", lambda: moe(64, 4096, 14336, 8, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=101_376, help="shared memory a block, bytes")
    ap.add_argument("--capability", default="8.0", help="what torch.cuda.get_device_capability answers")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    args = ap.parse_args()
    driver.active.get_current_target()            # Triton binds the real capability (its compile target)
    cap = tuple(int(c) for c in args.capability.split("."))
    torch.cuda.get_device_capability = lambda *a, **kw: cap
    compiler.max_shared_mem = lambda device: args.limit
    import warpforge as wf
    from warpforge.runtime import launch

    torch.manual_seed(0)
    rows = []
    for name, run in cases(wf):
        if args.k not in name:
            continue
        before = set(launch.shared_memory_fallbacks())
        try:
            err, note = run(), ""
        except Exception as e:  # noqa: BLE001 -- a probe: report and go on
            err, note = float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
            traceback.print_exc()
        torch.cuda.synchronize()
        stepped = sorted({f"{k[1]} {k[2]}" for k in set(launch.shared_memory_fallbacks()) - before})
        rows.append((name, err, note, stepped))
        print(f"{name:32s} rel {err:.2e} {note}", flush=True)
        for s in stepped:
            print(f"{'':32s}   refused: {s}", flush=True)
    print(f"\nlimit {args.limit:,} B, capability reported {cap}, on {torch.cuda.get_device_name()}")
    print(f"{'case':32s} {'rel err':>9s}  refused configs / error")
    for name, err, note, stepped in rows:
        print(f"{name:32s} {err:9.2e}  {note or len(stepped)}")


if __name__ == "__main__":
    main()
