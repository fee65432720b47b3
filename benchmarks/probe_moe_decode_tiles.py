"""Device probe for MoE decode (not the benchmark: `warpforge bench moe_decode` is): at T = 1-256
tokens, GPU time (the bench's timer) of the pointer kernels and the TMA kernels at forced row tiles
(block_m 16-128; a bigger tile reads an expert's weights once where its tokens overflow a small
one), against the torch._grouped_mm pipeline; then each one's latency as a CUDA graph replayed
back to back (what a serving loop sees), and the eager host time per call.

    python benchmarks/probe_moe_decode_tiles.py [--shapes mixtral,dsv2] [--T 64,256]
"""
import argparse, torch
import warpforge.ops.moe as M
import warpforge.runtime.heuristics as H
from warpforge.bench import timing
from warpforge.bench.workloads import moe_grouped_mm
from warpforge.runtime.heuristics import MoEConfig

from moe_probe_inputs import SHAPES, graph_us, make
p = argparse.ArgumentParser()
p.add_argument("--shapes", default="mixtral,dsv2,qwen3,olmoe")
p.add_argument("--T", default="1,8,64,256")
p.add_argument("--routing", default="random", help="random (the probe's own draw), or the bench's: random/zipf/balanced as "
               "bench:NAME (workloads.make_moe_routing)")
p.add_argument("--variants", default="", help="comma-separated labels to run (default all), e.g. 'shipped default'")
p.add_argument("--kernels", action="store_true",
               help="per-kernel GPU time (profiler) of the TMA up/down kernels under a few tiles instead")
a = p.parse_args()
dev, bf16 = "cuda", torch.bfloat16
cfg = timing.TimingConfig()
real_bm = M.moe_block_m


VARIANTS = [("shipped", None, None), ("pointer", None, None), ("pointer", 32, None), ("pointer", 64, None), ("pointer", 128, None),
            ("tma", 16, (64, 128, 4, 4)), ("tma", 32, (64, 128, 4, 4)), ("tma", 32, (128, 128, 4, 4)),
            ("tma", 64, (64, 128, 4, 4)), ("tma", 64, (128, 64, 4, 4)), ("tma", 128, None)]
default_decode = dict(H.MOE_TMA_DECODE)
KERNEL_VARIANTS = [   # (block_m, up (tile, programs an SM, ws, flatten), down (...)); None = shipped
    (128, None, None),
    (128, (MoEConfig(128, 128, 64, 8, 3), 0, False, False), (MoEConfig(128, 256, 64, 8, 3), 0, False, False)),
    (128, (MoEConfig(128, 128, 64, 8, 4), 1, True, False), (MoEConfig(128, 128, 64, 8, 4), 1, True, True)),
    (128, (MoEConfig(128, 64, 128, 8, 3), 0, False, False), (MoEConfig(128, 128, 128, 8, 3), 0, False, False)),
    (64, None, None),
    (64, (MoEConfig(64, 64, 128, 4, 4), 0, False, False), None),
    (64, (MoEConfig(64, 128, 64, 4, 5), 0, False, False), None),
    (64, (MoEConfig(64, 128, 64, 8, 4), 0, False, False), None),
]
if a.kernels:
    from torch.profiler import profile, ProfilerActivity
    default_cfg = dict(H.MOE_TMA_CONFIGS)
    for name in a.shapes.split(","):
        d, n, E, k = SHAPES[name]
        for T in map(int, a.T.split(",")):
            args = make(T, d, n, E, k)
            M._TMA_ON = False
            ref = M.moe_experts(*args, validate=False).float()
            M._TMA_ON = True
            M._TMA_DECODE_MIN_BLOCK_M, M._TMA_DECODE_MIN_WEIGHTS = 16, 0
            for bm, up, down in KERNEL_VARIANTS:
                M.moe_block_m = lambda *x, _b=bm: _b
                H.MOE_TMA_CONFIGS.update(default_cfg)
                H.MOE_TMA_DECODE.update(default_decode)
                if bm == 128:
                    if up:
                        H.MOE_TMA_CONFIGS["up"] = up
                    if down:
                        H.MOE_TMA_CONFIGS["down"] = down
                elif up:
                    H.MOE_TMA_DECODE[bm] = up[0]
                fn = lambda: M.moe_experts(*args, validate=False)
                try:
                    err = ((fn().float() - ref).norm() / ref.norm()).item()
                    lat = graph_us(fn)
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(10):
                            fn()
                        torch.cuda.synchronize()
                    ks = {e.key: e.device_time_total / 10 for e in prof.key_averages() if e.device_time_total > 0}
                    gem = sorted((v for kk, v in ks.items() if "gemm" in kk), reverse=True)
                    print(f"{name} T={T} bm={bm} up={up[0] if up else 'shipped'} down={down[0] if down else 'shipped'}: "
                          f"graph {lat:.1f} us, gemm kernels {' + '.join(f'{g:.1f}' for g in gem)} us, "
                          f"rest {sum(ks.values()) - sum(gem):.1f} us, err {err:.1e}", flush=True)
                except Exception as exc:
                    print(name, T, bm, up, down, "failed", repr(exc)[:200], flush=True)
            M.moe_block_m = real_bm
            H.MOE_TMA_CONFIGS.update(default_cfg)
            H.MOE_TMA_DECODE.update(default_decode)
            M._TMA_DECODE_MIN_BLOCK_M, M._TMA_DECODE_MIN_WEIGHTS = 32, 1 << 24
    raise SystemExit
rows = []
for name in a.shapes.split(","):
    d, n, E, k = SHAPES[name]
    for T in map(int, a.T.split(",")):
        args = make(T, d, n, E, k)
        if a.routing.startswith("bench:"):
            from warpforge.bench.workloads import make_moe_routing
            ids_cpu, w_cpu = make_moe_routing(T, E, k, a.routing[6:])
            args = (*args[:3], w_cpu.to(dev), ids_cpu.to(dev))
        active = int(torch.unique(args[4]).numel())
        counts = sorted(torch.bincount(args[4].view(-1).long(), minlength=E).tolist(), reverse=True)
        print(f"{name} T={T} {a.routing}: {active} experts active, most rows {counts[:8]}", flush=True)
        nbytes = 3 * active * d * n * 2
        M._TMA_ON = False
        M.moe_block_m = real_bm
        ref = M.moe_experts(*args, validate=False).float()
        gm = lambda: moe_grouped_mm(*args)
        res = {"grouped_mm": (timing.device_ms(gm, cfg, nbytes), graph_us(gm), timing.host_us(gm))}
        for path, bm, tile in VARIANTS:
            label = f"{path}" + (f" bm{bm}" if bm else " default") + (f" {tile[0]}x{tile[1]}" if tile else "")
            if a.variants and label not in a.variants.split(","):
                continue
            M._TMA_ON = path != "pointer"
            if path != "shipped":
                M._TMA_DECODE_MIN_BLOCK_M, M._TMA_DECODE_MIN_WEIGHTS = 16, 0
            M.moe_block_m = real_bm if bm is None else (lambda *x, _b=bm: _b)
            if tile:
                H.MOE_TMA_DECODE[bm] = MoEConfig(bm, *tile)
            fn = lambda: M.moe_experts(*args, validate=False)
            try:
                out = fn().float()
                err = ((out - ref).norm() / ref.norm()).item()
                res[label] = (timing.device_ms(fn, cfg, nbytes), graph_us(fn), timing.host_us(fn), err)
            except Exception as exc:
                res[label] = (float("nan"), float("nan"), float("nan"), repr(exc)[:120])
        M._TMA_ON, M.moe_block_m = True, real_bm
        M._TMA_DECODE_MIN_BLOCK_M, M._TMA_DECODE_MIN_WEIGHTS = 32, 1 << 24
        H.MOE_TMA_DECODE.update(default_decode)
        g0 = res["grouped_mm"][0]
        for lab, r in res.items():
            extra = "" if lab == "grouped_mm" else (f" err {r[3]:.1e}" if isinstance(r[3], float) else f" {r[3]}")
            line = (f"{name} T={T} bm={real_bm(T * k, E, 2)} {lab}: gpu {r[0] * 1e3:.1f} us ({nbytes / r[0] / 1e6:.0f} GB/s, "
                    f"{g0 / r[0]:.2f}x gmm) graph {r[1]:.1f} us host {r[2]:.1f} us{extra}")
            rows.append(line)
            print(line, flush=True)
        del args
