"""Session 57: consumer-loop variants (variants57.py edits) of the Gluon decode kernel, bf16 and e4m3 caches.
As run (from .whl/; the edits apply to the s57a source, before lsum and the halves shipped)."""
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
ap.add_argument("--shapes", default="1x4096,1x16384,8x8192,16x8192,64x4096")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--variants", default="split,lsum,split+lsum")
a = ap.parse_args()
tcfg, copy, _ = timing_setup()
mods = {"base": DA._sm90_kernel()}
for v in a.variants.split(","):
    mods[v] = load_sm90_patched(VARIANTS[v], "v57_" + v.replace("+", "_"))
res, nbytes = {}, {}
for sh, bsz, ctx in shapes(a.shapes):
    q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx)
    (k8, ks), (v8, vs) = kv_fp8(kc), kv_fp8(vc)
    kd, vd = k8.to(torch.bfloat16) * ks, v8.to(torch.bfloat16) * vs
    ref = DA.decode_attention_reference(q, kd, vd, bt, sl)
    del kc, vc
    rows = {}
    for name, mod in mods.items():
        for kvn in ("bf16", "e4m3"):
            plans = {}
            args = (kd, vd, {}) if kvn == "bf16" else (k8, v8, dict(k_scale=ks, v_scale=vs))
            def call(mod=mod, plans=plans, args=args):
                DA._PLANS, DA._SM90[0] = plans, mod
                return DA.decode_attention(q, args[0], args[1], bt, sl, validate=False, **args[2])
            rows[f"{kvn} {name}"] = call
    for name, fn in rows.items():
        out = fn()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 2e-2 and not out.isnan().any(), (sh, name, err)
    nbytes[sh] = kv_bytes
    times = alternate(rows, a.rounds, lambda fn: device_ms(fn, tcfg, kv_bytes))
    res.update({(sh, n): us for n, us in times.items()})
    print(sh, {n: round(min(u), 1) for n, u in times.items()}, flush=True)
    del q, k8, v8, kd, vd
    torch.cuda.empty_cache()
DA._SM90[0] = mods["base"]
print(f"\n{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s")
print(f"{'shape':9s} {'variant':18s} {'us':>8s} {'% copy':>7s} {'base/x':>7s}  rounds")
for (sh, name), v in res.items():
    b = nbytes[sh] // (1 if name.startswith("bf16") else 2)
    base = min(res[(sh, name.split()[0] + " base")])
    print(f"{sh:9s} {name:18s} {min(v):8.1f} {100 * b / (min(v) * 1e-6) / 1e9 / copy:7.1f} {base / min(v):7.3f}  {[round(x, 1) for x in v]}")
