"""Device probe: does the bench's row order move the decode figure? The bench times warpforge's
row first in each shape, right after the previous shape's sdpa[math] row (tens of ms a call of
unfused GEMMs). Times the decode kernel and cuDNN at batch 64 (4K, 32K) cold, then right after
~2 s of SDPA math calls, with the bench's timer.

    python benchmarks/probe_decode_order.py
"""
import torch
import torch.nn.functional as F

import warpforge as wf
from decode_probe_inputs import paged_problem, unpaged
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.runtime import device as dev

copy = dev.ceilings()["copy_gbps"]
cfg = TimingConfig()
hq, hk, d, page = 32, 8, 128, 16
for bsz, ctx in ((64, 4096), (64, 32768)):
    q, kc, vc, bt, sl, kv = paged_problem(bsz, ctx, hq, hk, d, page)
    kd, vd = unpaged(kc, bt, ctx), unpaged(vc, bt, ctx)
    q4 = q.unsqueeze(2)
    ours = lambda: wf.decode_attention(q, kc, vc, bt, sl, validate=False)  # noqa: E731
    cud = lambda: F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True)  # noqa: E731
    pct = lambda ms: kv / (ms * 1e-3) / 1e9 / copy * 100  # noqa: E731
    row = {"ours cold": device_ms(ours, cfg, kv), "cudnn cold": device_ms(cud, cfg, kv)}
    qm, km, vm = q4[:16], kd[:16].repeat_interleave(4, 1), vd[:16].repeat_interleave(4, 1)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        for _ in range(40):
            F.scaled_dot_product_attention(qm.expand(16, hq, 64, d).contiguous(), km, vm)
    row["ours after math"] = device_ms(ours, cfg, kv)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        for _ in range(40):
            F.scaled_dot_product_attention(qm.expand(16, hq, 64, d).contiguous(), km, vm)
    row["cudnn after math"] = device_ms(cud, cfg, kv)
    row["ours again"] = device_ms(ours, cfg, kv)
    print(f"B{bsz} ctx{ctx}: " + " | ".join(f"{k} {v * 1e3:.1f} us {pct(v):.0f}%" for k, v in row.items()), flush=True)
    del kc, vc, kd, vd, km, vm
