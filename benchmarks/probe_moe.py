"""Device probe for the MoE experts (not the benchmark: `warpforge bench moe` is): correctness on the
GPU against a float32 loop, then fwd and fwd+bwd TFLOP/s of warpforge, the torch._grouped_mm pipeline
and Liger's fused MoE (when importable) at the issue's shapes, saved-for-backward memory, and a
per-kernel profile of one shape.

    python benchmarks/probe_moe.py [--shapes dsv2,qwen3,mixtral,olmoe] [--T 8192] [--profile qwen3] [--skip-check]
"""
import argparse, sys, torch, triton
import torch.nn.functional as F
import warpforge as wf
from warpforge.ops.moe import moe_experts, moe_experts_reference

from moe_probe_inputs import SHAPES, make
p = argparse.ArgumentParser()
p.add_argument("--shapes", default="dsv2,qwen3,mixtral,olmoe")
p.add_argument("--T", default="8192")
p.add_argument("--profile", default="")
p.add_argument("--skip-check", action="store_true")
p.add_argument("--decode", default="1,64,256")
p.add_argument("--host", default="", help="T: host time per call and kernel times")
p.add_argument("--peers", default="warpforge,grouped_mm,liger")
p.add_argument("--cfg", action="append", default=[], help="kind=block_n,block_k,warps,stages[,block_m]: override moe_config")
a = p.parse_args()
if a.cfg:
    import warpforge.ops.moe as M
    from warpforge.runtime.heuristics import MoEConfig
    over = {c.split("=")[0]: [int(v) for v in c.split("=")[1].split(",")] for c in a.cfg}
    base = M.moe_config

    def patched(kind, block_m, s):
        c = base(kind, block_m, s)
        if kind not in over:
            return c
        bn, bk, w, st, *bm = over[kind]
        return MoEConfig(bm[0] if bm else c.block_m, bn, bk, w, st)
    M.moe_config = patched
dev, bf16 = "cuda", torch.bfloat16


def pipeline(x, w1, w2, wts, ids):
    T, k = ids.shape
    E = w1.shape[0]
    flat = ids.view(-1)
    order = flat.argsort(stable=True)
    counts = torch.zeros(E, device=x.device, dtype=torch.int32).scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0, dtype=torch.int32)
    tok = order // k
    h = torch._grouped_mm(x[tok], w1.transpose(1, 2), offs=offs)
    g, u = h.chunk(2, -1)
    y = torch._grouped_mm(F.silu(g) * u, w2.transpose(1, 2), offs=offs)
    y = y * wts.view(-1)[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, tok, y)


peers = {"warpforge": lambda *t: moe_experts(*t, validate=False), "grouped_mm": pipeline}
try:
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
    peers["liger"] = lambda x, w1, w2, wts, ids: LigerFusedMoEFunction.apply(x, w1, w2, ids, wts)
except Exception as exc:
    print("liger absent:", exc)
peers = {k: v for k, v in peers.items() if k in a.peers.split(",")}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


if not a.skip_check:
    for name in a.shapes.split(","):
        d, n, E, k = SHAPES[name]
        x, w1, w2, wts, ids = make(777, d, n, E, k)
        ts = [t.clone().requires_grad_() for t in (x, w1, w2, wts)]
        out = moe_experts(*ts, ids)
        dout = torch.randn_like(out)
        out.backward(dout)
        rs = [t.detach().float().requires_grad_() for t in (x, w1, w2, wts)]
        ref = moe_experts_reference(*rs, ids)
        ref.backward(dout.float())
        errs = [rel(out, ref)] + [rel(t.grad, r.grad) for t, r in zip(ts, rs)]
        print(f"check {name}: fwd {errs[0]:.2e} dx {errs[1]:.2e} dw1 {errs[2]:.2e} dw2 {errs[3]:.2e} dwts {errs[4]:.2e}",
              "OK" if all(e < 2e-2 for e in errs) and not torch.isnan(out).any() else "FAIL")
        del ts, rs, out, ref

rows = []
for name in a.shapes.split(","):
    d, n, E, k = SHAPES[name]
    for T in map(int, a.T.split(",")):
        args = make(T, d, n, E, k)
        fl = 6 * T * k * d * n
        for pname, fn in peers.items():
            try:
                ms = triton.testing.do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode="median")
                ts = [t.clone().requires_grad_() if i < 4 else t for i, t in enumerate(args)]
                dout = torch.randn(T, d, device=dev, dtype=bf16)

                def step():
                    for t in ts[:4]:
                        t.grad = None
                    fn(*ts).backward(dout)
                ms2 = triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")
                torch.cuda.synchronize(); base = torch.cuda.memory_allocated()
                out = fn(*ts); torch.cuda.synchronize()
                saved = (torch.cuda.memory_allocated() - base - out.numel() * out.element_size()) / 2**20
                del out
                rows.append((name, T, pname, ms, fl / ms / 1e9, ms2, 3 * fl / ms2 / 1e9, saved))
            except Exception as exc:
                rows.append((name, T, pname, float("nan"), 0, float("nan"), 0, 0))
                print(name, T, pname, "failed:", repr(exc)[:300])
            print(*rows[-1], flush=True)
        del args

for T in map(int, a.decode.split(",")) if a.decode else ():
    for name in a.shapes.split(","):
        d, n, E, k = SHAPES[name]
        args = make(T, d, n, E, k)
        res = []
        for pname, fn in peers.items():
            try:
                res.append(f"{pname} {triton.testing.do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode='median') * 1e3:.1f}us")
            except Exception as exc:
                res.append(f"{pname} failed {exc!r:.80}")
        print("decode", name, T, *res, flush=True)

if a.profile:
    from torch.profiler import profile, ProfilerActivity
    d, n, E, k = SHAPES[a.profile]
    T = int(a.T.split(",")[0])
    ts = [t.clone().requires_grad_() if i < 4 else t for i, t in enumerate(make(T, d, n, E, k))]
    dout = torch.randn(T, d, device=dev, dtype=bf16)
    for _ in range(3):
        moe_experts(*ts, validate=False).backward(dout)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            moe_experts(*ts, validate=False).backward(dout)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=40))

print("\n| shape | T | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | saved MiB |")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.0f} | {r[5]:.3f} | {r[6]:.0f} | {r[7]:.0f} |")

if a.host:
    import cProfile, pstats, time
    from torch.profiler import profile, ProfilerActivity
    for name in a.shapes.split(","):
        d, n, E, k = SHAPES[name]
        args = make(int(a.host), d, n, E, k)
        for pname, fn in peers.items():
            for _ in range(20):
                fn(*args)
            torch.cuda.synchronize(); t0 = time.perf_counter()
            for _ in range(200):
                fn(*args)
            t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn(*args)
                torch.cuda.synchronize()
            dev_us = sum(e.device_time_total for e in prof.key_averages()) / 10
            print(f"host {name} T={a.host} {pname}: issue {(t1 - t0) / 200 * 1e6:.1f} us/call, loop {(t2 - t0) / 200 * 1e6:.1f} us/call, kernels {dev_us:.1f} us/call")
            if pname == "warpforge" and name == a.shapes.split(",")[0]:
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=30))
                pr = cProfile.Profile(); pr.enable()
                for _ in range(100):
                    fn(*args)
                pr.disable(); torch.cuda.synchronize()
                pstats.Stats(pr).sort_stats("tottime").print_stats(12)
