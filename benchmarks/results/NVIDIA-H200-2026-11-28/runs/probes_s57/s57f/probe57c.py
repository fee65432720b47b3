"""Session 57 (as run from .whl/, on commit 0ec0e02): shipped fp8 Gluon decode (halves' chains at one split only) against a copy with the
halves' chains in split launches too (H): kernel only at forced splits, and the full route."""
import sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import torch
import warpforge.ops.decode_attention as DA
from decode_probe_inputs import alternate, paged_problem, shapes, timing_setup, load_sm90_patched
from warpforge.bench.timing import device_ms
from warpforge.bench.workloads import kv_fp8
G = DA._sm90_kernel()
H = load_sm90_patched([("            if FP8 and ONE:\n", "            if FP8:\n"),
                       ("            if ONE:                                                       # the halves' Q^T",
                        "            if True:  # the halves' Q^T")], "p57c_h")
tcfg, copy, scale2 = timing_setup()
res, nbytes = {}, {}
for sh, bsz, ctx in shapes("1x4096,1x16384,4x16384,8x8192,8x32768,16x8192"):
    q, kc, vc, bt, sl, kv_bytes = paged_problem(bsz, ctx)
    (k8, ks), (v8, vs) = kv_fp8(kc), kv_fp8(vc)
    kst, vst = (torch.tensor([x], device="cuda", dtype=torch.float32) for x in (ks, vs))
    del kc, vc
    ref = DA.decode_attention_reference(q, k8, v8, bt, sl, k_scale=ks, v_scale=vs)
    o = torch.empty_like(q)
    rows = {}
    for name, mod in (("G", G), ("H", H)):
        plans = {}
        def route(mod=mod, plans=plans):
            DA._PLANS, DA._SM90[0] = plans, mod
            return DA.decode_attention(q, k8, v8, bt, sl, k_scale=ks, v_scale=vs, validate=False)
        rows[f"{name} route"] = route
        out = route()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 2e-2 and not out.isnan().any(), (sh, name, err)
        if bsz >= 4:
            for s in (1, 2):
                rows[f"{name} kernel s{s}"] = lambda mod=mod, s=s: mod.decode_sm90(q, k8, v8, bt, sl, o, scale2, splits=s,
                                                                                  k_scale=kst, v_scale=vst)
    nbytes[sh] = kv_bytes // 2
    times = alternate(rows, 4, lambda fn: device_ms(fn, tcfg, kv_bytes // 2))
    res.update({(sh, n): us for n, us in times.items()})
    print(sh, {n: round(min(u), 1) for n, u in times.items()}, flush=True)
    del q, k8, v8
    torch.cuda.empty_cache()
DA._SM90[0] = G
print(f"\n{torch.cuda.get_device_name()}, copy {copy:.0f} GB/s")
print(f"{'shape':9s} {'variant':14s} {'us':>8s} {'% copy':>7s} {'G/H':>6s}  rounds")
for (sh, name), v in res.items():
    g = min(res[(sh, "G" + name[1:])])
    print(f"{sh:9s} {name:14s} {min(v):8.1f} {100 * nbytes[sh] / (min(v) * 1e-6) / 1e9 / copy:7.1f} {g / min(v):6.3f}  {[round(x, 1) for x in v]}")
