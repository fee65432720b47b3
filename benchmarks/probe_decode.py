"""Device probe for decode attention (not the benchmark: `warpforge bench decode_attention` is):
the split/combine configuration the heuristic picks, host time per call in a loop, and the kernels'
device times from torch.profiler, at batch 1 and 16.

    python benchmarks/probe_decode.py
"""
import torch, time, warpforge as wf
from torch.profiler import profile, ProfilerActivity
from warpforge.runtime.heuristics import decode_config
for B, ctx in ((1, 4096), (1, 32768), (16, 4096)):
    Hq, Hk, D, page = 32, 8, 128, 16
    nb = B * ctx // page
    q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(nb, page, Hk, D, device="cuda", dtype=torch.bfloat16); vc = torch.randn_like(kc)
    bt = torch.randperm(nb, device="cuda", dtype=torch.int32).view(B, -1); sl = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
    for _ in range(20): wf.decode_attention(q, kc, vc, bt, sl, validate=False)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(200): wf.decode_attention(q, kc, vc, bt, sl, validate=False)
    torch.cuda.synchronize(); host = (time.perf_counter() - t) / 200 * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20): wf.decode_attention(q, kc, vc, bt, sl, validate=False)
        torch.cuda.synchronize()
    print(B, ctx, decode_config(B, Hk, Hq // Hk, bt.shape[1] * page, D, page, 2, None), f"loop {host:.1f} us/call")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=5))
