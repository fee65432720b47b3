"""ncu target, session 57 (as run from .whl/, on the 0ec0e02 tree): the fp8 Gluon decode kernel at 16 x 8K, shipped (halves' chains at one
split only) at 1 and 2 splits, and a copy with the halves' chains in split launches too, at 2."""
import sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import torch
import warpforge.ops.decode_attention as DA
from decode_probe_inputs import paged_problem, timing_setup, load_sm90_patched
from warpforge.bench.workloads import kv_fp8
G = DA._sm90_kernel()
H = load_sm90_patched([("            if FP8 and ONE:\n", "            if FP8:\n"),
                       ("            if ONE:                                                       # the halves' Q^T",
                        "            if True:  # the halves' Q^T")], "ncu57_h")
_, _, scale2 = timing_setup()
q, kc, vc, bt, sl, _ = paged_problem(16, 8192)
(k8, ks), (v8, vs) = kv_fp8(kc), kv_fp8(vc)
kst, vst = (torch.tensor([x], device="cuda", dtype=torch.float32) for x in (ks, vs))
o = torch.empty_like(q)
calls = [(G, 1), (G, 2), (H, 2), (H, 1)]
for mod, s in calls:
    for _ in range(3):
        mod.decode_sm90(q, k8, v8, bt, sl, o, scale2, splits=s, k_scale=kst, v_scale=vst)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for mod, s in calls:
    mod.decode_sm90(q, k8, v8, bt, sl, o, scale2, splits=s, k_scale=kst, v_scale=vst)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("ncu target: done")
