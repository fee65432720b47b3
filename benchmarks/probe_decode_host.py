"""Where the host time of a decode_attention call goes (cProfile over 300 calls at batch 1):
the kernels take ~12 us on an H100, the call ~110 us.

    python benchmarks/probe_decode_host.py
"""
import torch, cProfile, pstats, warpforge as wf
B, ctx, Hq, Hk, D, page = 1, 4096, 32, 8, 128, 16
nb = B * ctx // page
q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
kc = torch.randn(nb, page, Hk, D, device="cuda", dtype=torch.bfloat16); vc = torch.randn_like(kc)
bt = torch.randperm(nb, device="cuda", dtype=torch.int32).view(B, -1); sl = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
for _ in range(20): wf.decode_attention(q, kc, vc, bt, sl, validate=False)
torch.cuda.synchronize()
cProfile.run("for _ in range(300): wf.decode_attention(q, kc, vc, bt, sl, validate=False)", "/tmp/p")
pstats.Stats("/tmp/p").sort_stats("tottime").print_stats(14)
