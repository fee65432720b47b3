"""Device probe (not the benchmark): how far each of the MoE layer's grouped GEMMs is from a dense GEMM
of the same size, at Mixtral T = 8192 with balanced routing (every expert exactly T * k / E rows, so
the grouped problems are the dense ones cut at row-tile boundaries). Rows, each timed in R rounds
alternating over all of them (the least kept, as the bench's GEMM rows do):

- cuBLAS dense (torch.mm / torch.bmm for the weight gradients) at each GEMM's total size;
- the torch._grouped_mm pipeline's grouped GEMM (cuBLAS's grouped kernels) for up and down;
- warpforge's dense persistent TMA matmul (wf.matmul) at the same sizes;
- warpforge's MoE TMA kernels alone (ops/moe.py: up with SwiGLU and z, down with the routing
  weight, dgrad, dx, both weight gradients).

With ``--variant kind:bm,bn,bk,warps,stages,programs_per_sm,ws,flatten,store_split`` (repeatable) a
MoE kernel is also timed under that configuration, after a check that its output is bitwise equal
to the shipped configuration's (the same K order, so it must be).

    python benchmarks/probe_moe_dense.py [--shape mixtral] [--T 8192] [--rounds 3] [--only up,down,...]
        [--variant up:128,128,64,8,3,1,0,1,1 ...]
"""
import argparse
import torch
import triton
import warpforge as wf
import warpforge.ops.moe as M
import warpforge.runtime.heuristics as H
from warpforge.runtime.heuristics import MoEConfig, moe_block_m

from moe_probe_inputs import SHAPES

p = argparse.ArgumentParser()
p.add_argument("--shape", default="mixtral")
p.add_argument("--T", type=int, default=8192)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--only", default="")
p.add_argument("--variant", action="append", default=[])
p.add_argument("--routing", default="balanced", choices=("balanced", "random"))
a = p.parse_args()
dev, bf16 = "cuda", torch.bfloat16
d, n, E, k = SHAPES[a.shape]
T = a.T
S = T * k
assert S % E == 0, "balanced routing needs T * k divisible by E"
torch.manual_seed(0)
# balanced: token t takes experts t, t+1, ..., t+k-1 (mod E): every expert gets S / E slots
ids = (torch.arange(T, device=dev)[:, None] + torch.arange(k, device=dev)[None, :]).remainder(E).int()
if a.routing == "random":      # k distinct experts uniformly at random (the dense rows keep S // E a group)
    ids = torch.rand(T, E, device=dev).topk(k, -1).indices.int()
wts = torch.softmax(torch.randn(T, k, device=dev), -1)
x = torch.randn(T, d, device=dev, dtype=bf16)
w1 = (torch.randn(E, 2 * n, d, device=dev) * d ** -0.5).to(bf16)
w2 = (torch.randn(E, d, n, device=dev) * n ** -0.5).to(bf16)
bm = moe_block_m(S, E, 2)
ss, sp, te, st, cnt = M._align(ids.view(-1), E, bm)
P = ss.numel()
rows_used = int(st[-1].item())
print(f"{a.shape} T={T} d={d} n={n} E={E} k={k} block_m={bm} padded rows {P}, used {rows_used}, "
      f"counts {cnt.tolist()}", flush=True)
meta3 = (ss, te, st)
assert M.tma_path(x, w1, w2, bm), "the TMA path is not taken at this shape"
xg = M._gather_rows(x, ss, te, k, bm)
h = torch.randn(P, n, device=dev, dtype=bf16)
z = torch.empty(P, 2 * n, device=dev, dtype=bf16)
y = torch.empty(P, d, device=dev, dtype=bf16)
dz = torch.randn(P, 2 * n, device=dev, dtype=bf16) * 0.1
hw = torch.randn(P, n, device=dev, dtype=bf16) * 0.1
g = torch.empty(P, n, device=dev, dtype=bf16)
dw1 = torch.empty_like(w1)
dw2 = torch.empty_like(w2)
offs = torch.arange(1, E + 1, device=dev, dtype=torch.int32) * (S // E)
# dense operands of the same sizes (rows S; the weights as one expert's matrix repeated in size)
xs = xg[:S].contiguous()
W1 = w1.reshape(E * 2 * n, d)[: 2 * n].contiguous()          # (2n, d)
W2 = w2[0].contiguous()                                        # (d, n)
hs, dzs, hws = h[:S].contiguous(), dz[:S].contiguous(), hw[:S].contiguous()
xs_e = xs.view(E, S // E, d)
hw_e, dz_e = hws.view(E, S // E, n), dzs.view(E, S // E, 2 * n)
fl = 2 * S * d * n          # one (S, d) x (d, n) product

cases = {
    # name: (fn, flops)
    "up cublas dense": (lambda: torch.mm(xs, W1.t()), 2 * fl),
    "up grouped_mm": (lambda: torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs), 2 * fl),
    "up wf dense": (lambda: wf.matmul(xs, W1.t()), 2 * fl),
    "up wf moe": (lambda: M._gemm_tma(xg, w1, h, meta=meta3, K=d, N=n, kind="up", b_t=True, epi=1, z=z), 2 * fl),
    "upnoz wf moe": (lambda: M._gemm_tma(xg, w1, h, meta=meta3, K=d, N=n, kind="up", b_t=True, epi=1), 2 * fl),
    "down cublas dense": (lambda: torch.mm(hs, W2.t()), fl),
    "down grouped_mm": (lambda: torch._grouped_mm(hs, w2.transpose(1, 2), offs=offs), fl),
    "down wf dense": (lambda: wf.matmul(hs, W2.t()), fl),
    "down wf moe": (lambda: M._gemm_tma(h, w2, y, meta=meta3, K=n, N=d, kind="down", b_t=True,
                                        weights=wts.view(-1)), fl),
    "dgrad cublas dense": (lambda: torch.mm(xs, W2), fl),
    "dgrad wf dense": (lambda: wf.matmul(xs, W2), fl),
    "dgrad wf moe": (lambda: M._gemm_tma(xg, w2, g, meta=meta3, K=d, N=n, kind="dgrad", b_t=False), fl),
    "dx cublas dense": (lambda: torch.mm(dzs, W1), 2 * fl),
    "dx wf dense": (lambda: wf.matmul(dzs, W1), 2 * fl),
    "dx wf moe": (lambda: M._gemm_tma(dz, w1, y, meta=meta3, K=2 * n, N=d, kind="dx", b_t=False), 2 * fl),
    "wgrad cublas bmm": (lambda: (torch.bmm(xs_e.transpose(1, 2), hw_e), torch.bmm(dz_e.transpose(1, 2), xs_e)), 3 * fl),
    "wgrad wf moe": (lambda: (M._wgrad_tma(xg, hw, dw2, start=st, M=d, N=n, block_m=bm),
                              M._wgrad_tma(dz, xg, dw1, start=st, M=2 * n, N=d, block_m=bm)), 3 * fl),
}
# the MoE kernels again under other configurations: (call, outputs to compare)
moe_calls = {
    "up": (lambda: M._gemm_tma(xg, w1, h, meta=meta3, K=d, N=n, kind="up", b_t=True, epi=1, z=z), (h, z)),
    "upnoz": (lambda: M._gemm_tma(xg, w1, h, meta=meta3, K=d, N=n, kind="up", b_t=True, epi=1), (h,)),
    "down": (lambda: M._gemm_tma(h, w2, y, meta=meta3, K=n, N=d, kind="down", b_t=True, weights=wts.view(-1)), (y,)),
    "dgrad": (lambda: M._gemm_tma(xg, w2, g, meta=meta3, K=d, N=n, kind="dgrad", b_t=False), (g,)),
    "dx": (lambda: M._gemm_tma(dz, w1, y, meta=meta3, K=2 * n, N=d, kind="dx", b_t=False), (y,)),
    "wgrad": (lambda: (M._wgrad_tma(xg, hw, dw2, start=st, M=d, N=n, block_m=bm),
                       M._wgrad_tma(dz, xg, dw1, start=st, M=2 * n, N=d, block_m=bm)), (dw1, dw2)),
}
shipped = dict(H.MOE_TMA_CONFIGS)


def with_cfg(kind, cfg, fn):
    def call():
        H.MOE_TMA_CONFIGS[kind] = cfg
        try:
            return fn()
        finally:
            H.MOE_TMA_CONFIGS[kind] = shipped[kind]
    return call


for v in a.variant:
    case, nums = v.split(":")
    kind = "up" if case == "upnoz" else case
    bm_, bn_, bk_, warps, stages, pps, ws, flat, split = (int(t) for t in nums.split(","))
    cfg = (MoEConfig(bm_, bn_, bk_, warps, stages, store_split=split), pps, bool(ws), bool(flat))
    fn, outs = moe_calls[case]
    label = f"{case} wf moe {bn_}x{bk_} w{warps} s{stages} p{pps}" + (" ws" if ws else "") + (" flat" if flat else "") + \
        (f" tma{split}" if split else "")
    try:
        fn()
        torch.cuda.synchronize()
        ref = [o[:rows_used].clone() if o.shape[0] == P else o.clone() for o in outs]
        for o in outs:
            o.fill_(float("nan"))
        with_cfg(kind, cfg, fn)()
        torch.cuda.synchronize()
        same = all(torch.equal(r, o[:rows_used] if o.shape[0] == P else o) for r, o in zip(ref, outs))
        print(f"check {label}: {'bitwise equal' if same else 'DIFFERS'}", flush=True)
        if not same:
            continue
    except Exception as exc:
        print(f"check {label}: FAILED {exc!r:.300}", flush=True)
        continue
    cases[label] = (with_cfg(kind, cfg, fn), cases[f"{case} wf moe"][1])

if a.only:
    keep = a.only.split(",")
    cases = {c: v for c, v in cases.items() if c.split()[0] in keep}
best = {c: float("inf") for c in cases}
for c, (fn, _) in cases.items():          # compile / warm everything first
    fn()
torch.cuda.synchronize()
for r in range(a.rounds):
    for c, (fn, _) in cases.items():
        ms = triton.testing.do_bench(fn, warmup=10, rep=150, return_mode="median")
        best[c] = min(best[c], ms)
        print(f"round {r} {c:22s} {ms:8.3f} ms", flush=True)

print(f"\n{torch.cuda.get_device_name()} | {a.shape} T={T} {a.routing} | least of {a.rounds} rounds (do_bench median)")
print("| GEMM | impl | ms | TFLOP/s | vs cuBLAS dense |")
print("| --- | --- | --- | --- | --- |")
for c, (fn, f) in cases.items():
    kind = c.split()[0]
    base = next((best[b] for b in best if b.startswith(kind + " cublas")), None)
    ratio = f"{base / best[c]:.3f}" if base else "-"
    print(f"| {kind} | {c[len(kind) + 1:]} | {best[c]:.3f} | {f / best[c] / 1e9:.0f} | {ratio} |")
