"""Session 57: kernel-only times (decode_sm90, no combine) of variants at forced split counts, e4m3.
As run (from .whl/, beside ../s57b/variants57.py; the edits apply to the s57a source)."""
import argparse, sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
sys.path.insert(0, os.path.dirname(__file__))
import torch
import warpforge.ops.decode_attention as DA
from decode_probe_inputs import alternate, paged_problem, shapes, timing_setup, load_sm90_patched
from warpforge.bench.timing import device_ms
from warpforge.bench.workloads import kv_fp8
from variants57 import VARIANTS

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="8x8192,16x8192,4x16384,32x4096")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--variants", default="lsum,split+lsum")
ap.add_argument("--splits", default="1,2,4")
a = ap.parse_args()
tcfg, copy, scale2 = timing_setup()
mods = {"base": DA._sm90_kernel()}
for v in a.variants.split(","):
    mods[v] = load_sm90_patched(VARIANTS[v], "v57b_" + v.replace("+", "_"))
res, nbytes = {}, {}
for sh, bsz, ctx in shapes(a.shapes):
    q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx)
    (k8, ks), (v8, vs) = kv_fp8(kc), kv_fp8(vc)
    kst, vst = (torch.tensor([x], device="cuda", dtype=torch.float32) for x in (ks, vs))
    del kc, vc
    o = torch.empty_like(q)
    rows = {}
    for name, mod in mods.items():
        for s in (int(x) for x in a.splits.split(",")):
            rows[f"e4m3 {name} s{s}"] = lambda mod=mod, s=s: mod.decode_sm90(q, k8, v8, bt, sl, o, scale2, splits=s,
                                                                            k_scale=kst, v_scale=vst)
    nbytes[sh] = kv_bytes // 2
    times = alternate(rows, a.rounds, lambda fn: device_ms(fn, tcfg, kv_bytes // 2))
    res.update({(sh, n): us for n, us in times.items()})
    print(sh, {n: round(min(u), 1) for n, u in times.items()}, flush=True)
    del q, k8, v8
    torch.cuda.empty_cache()
print(f"\n{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s")
print(f"{'shape':9s} {'variant':22s} {'us':>8s} {'% copy':>7s} {'base/x':>7s}  rounds")
for (sh, name), v in res.items():
    base = min(res[(sh, "e4m3 base " + name.split()[-1])])
    print(f"{sh:9s} {name:22s} {min(v):8.1f} {100 * nbytes[sh] / (min(v) * 1e-6) / 1e9 / copy:7.1f} {base / min(v):7.3f}  {[round(x, 1) for x in v]}")
