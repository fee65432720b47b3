"""Device probe: each MoE kernel timed alone (do_bench, median) over a few tile configurations, at the
issue's shapes, T = 8192 random routing. Prints ms and TFLOP/s per (shape, kernel, config).

    python benchmarks/probe_moe_tune.py [--shapes dsv2,mixtral] [--kinds up,down,dgrad,dx,wgrad1,wgrad2]
"""
import argparse, torch, triton
import warpforge.ops.moe as M
from warpforge.runtime.heuristics import MoEConfig, moe_block_m

SHAPES = {"dsv2": (2048, 1408, 64, 6), "qwen3": (2048, 768, 128, 8), "mixtral": (4096, 14336, 8, 2),
          "olmoe": (2048, 1024, 64, 8)}
CFGS = {
    "up": [(64, 64, 8, 4), (64, 64, 8, 3), (64, 128, 8, 3), (64, 64, 4, 4), (128, 64, 8, 3), (32, 64, 4, 4)],
    "down": [(128, 64, 8, 4), (128, 64, 8, 3), (256, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 4), (64, 128, 4, 3)],
    "dgrad": [(64, 64, 8, 4), (64, 64, 8, 3), (128, 64, 8, 3), (64, 128, 8, 3), (64, 64, 4, 4), (32, 64, 4, 4)],
    "dx": [(128, 64, 8, 4), (128, 64, 8, 3), (256, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 4), (64, 128, 4, 3)],
    "wgrad1": [(128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
               (128, 128, 32, 8, 5), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4)],
}
CFGS["wgrad2"] = CFGS["wgrad1"]
p = argparse.ArgumentParser()
p.add_argument("--shapes", default="dsv2,mixtral")
p.add_argument("--kinds", default="up,down,dgrad,dx,wgrad1,wgrad2")
p.add_argument("--T", type=int, default=8192)
p.add_argument("--group", default="8")
a = p.parse_args()
dev, bf16 = "cuda", torch.bfloat16
out = []
for name in a.shapes.split(","):
    d, n, E, k = SHAPES[name]
    T = a.T
    x = torch.randn(T, d, device=dev, dtype=bf16)
    w1 = (torch.randn(E, 2 * n, d, device=dev) * d ** -0.5).to(bf16)
    w2 = (torch.randn(E, d, n, device=dev) * n ** -0.5).to(bf16)
    ids = torch.rand(T, E, device=dev).topk(k, -1).indices.int()
    wts = torch.softmax(torch.randn(T, k, device=dev), -1)
    bm = moe_block_m(T * k, E, 2)
    ss, sp, te, st, cnt = M._align(ids.view(-1), E, bm)
    meta = (ss, te)
    P = ss.numel()
    h = torch.randn(P, n, device=dev, dtype=bf16)
    z = torch.randn(P, 2 * n, device=dev, dtype=bf16)
    y = torch.empty(P, d, device=dev, dtype=bf16)
    dout = torch.randn(T, d, device=dev, dtype=bf16)
    dz = torch.randn(P, 2 * n, device=dev, dtype=bf16)
    hw = torch.randn(P, n, device=dev, dtype=bf16)
    dw1, dw2 = torch.empty_like(w1), torch.empty_like(w2)
    fl = 2 * T * k * d * n
    for kind in a.kinds.split(","):
        for c in CFGS[kind]:
            for gm in map(int, a.group.split(",")):
                try:
                    if kind.startswith("wgrad"):
                        cfg = MoEConfig(c[0], c[1], c[2], c[3], c[4], gm)
                    else:
                        cfg = MoEConfig(bm, c[0], c[1], c[2], c[3], gm)
                    if kind == "up":
                        f = lambda: M._gemm(x, M._b_fwd_up(w1), h, meta=meta, K=d, N=n, cfg=cfg, topk=k, gather_a=True, epi=1, z=z, store_z=True)
                        flops = 2 * fl
                    elif kind == "down":
                        f = lambda: M._gemm(h, M._b_fwd_down(w2), y, meta=meta, K=n, N=d, cfg=cfg, topk=k, gather_a=False, epi=0, weights=wts.view(-1), scale_rows=True)
                        flops = fl
                    elif kind == "dgrad":
                        f = lambda: M._gemm(dout, M._b_bwd_down(w2), hw, meta=meta, K=d, N=n, cfg=cfg, topk=k, gather_a=True, epi=0)
                        flops = fl
                    elif kind == "dx":
                        f = lambda: M._gemm(dz, M._b_bwd_up(w1), y, meta=meta, K=2 * n, N=d, cfg=cfg, topk=k, gather_a=False, epi=0)
                        flops = 2 * fl
                    elif kind == "wgrad2":
                        f = lambda: M._wgrad(dout, hw, dw2, sorted_slot=ss, start=st, M=d, N=n, topk=k, gather_a=True, gather_b=False, cfg=cfg)
                        flops = fl
                    else:
                        f = lambda: M._wgrad(dz, x, dw1, sorted_slot=ss, start=st, M=2 * n, N=d, topk=k, gather_a=False, gather_b=True, cfg=cfg)
                        flops = 2 * fl
                    ms = triton.testing.do_bench(f, warmup=10, rep=50, return_mode="median")
                    out.append((name, kind, c, gm, ms, flops / ms / 1e9))
                except Exception as exc:
                    out.append((name, kind, c, gm, float("nan"), 0.0))
                    print(name, kind, c, "failed", repr(exc)[:200])
                print(*out[-1], flush=True)
print("\n| shape | kernel | config (bn,bk,w,s) / wgrad (bm,bn,bk,w,s) | group | ms | TFLOP/s |")
for r in out:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.3f} | {r[5]:.0f} |")
