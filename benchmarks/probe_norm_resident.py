"""Do the slow pipe shapes of the long-row LayerNorm forward have more programs than the device
holds at once? Scales the resident-program estimate that sizes the split/pipe grids
(``_rows.split_launch``) by 1.0 ... 0.5 and times each (NOTES item 83; a probe, not the benchmark).

    WARPFORGE_FASTPATH=0 python benchmarks/probe_norm_resident.py
"""
import torch, warpforge as wf
from warpforge.bench import timing
from warpforge.ops import norms, _rows
from warpforge.runtime import device as dev
from warpforge.runtime import heuristics as H
from warpforge.runtime.heuristics import RowConfig

copy = dev.ceilings()["copy_gbps"]
cfg_t = timing.TimingConfig.quick()
real_rp = _rows.resident_programs
real_cfg = norms.norm_fwd_config
info = {}

def scaled(f):
    def rp(compiled, num_warps):
        r = real_rp(compiled, num_warps)
        info["regs"] = getattr(compiled, "n_regs", None); info["shared"] = compiled.metadata.shared; info["r"] = r
        return max(1, int(r * f))
    return rp

CASES = [  # n, affine, (mode, chunk, warps, reload) or None (default)
    (65536, "w", ("pipe", 2048, 2, True)), (65536, "wb", ("pipe", 2048, 2, True)),
    (262144, "wb", None), (262144, "none", None), (262144, "wb", ("pipe", 2048, 2, False)),
    (262144, "wb", ("pipe", 8192, 8, False)), (65536, "wb", ("pipe", 8192, 4, True)),
]
rows = []
for n, aff, forced in CASES:
    m = 2**27 // n
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    lw = None if aff == "none" else w
    lb = b if aff == "wb" else None
    if forced:
        mode, chunk, warps, reload = forced
        c = RowConfig(mode, chunk, 1, warps, -(-n // chunk), reload)
        norms.norm_fwd_config = lambda _n, layer=False, _c=c, **_kw: _c
    ref = None
    for f in (1.0, 0.97, 0.9, 0.75, 0.5):
        _rows._RESIDENT.clear()
        _rows.resident_programs = scaled(f)
        fn = lambda: wf.layer_norm(x, (n,), lw, lb, eps=1e-5)
        out = fn()
        if ref is None:
            ref = out.clone()
        assert torch.equal(out, ref)
        ms = timing.device_ms(fn, cfg_t, 4 * m * n)
        rows.append((n, aff, str(forced), f, info.get("regs"), info.get("shared"), info.get("r"), ms * 1e3,
                     100 * 4 * m * n / ms / 1e6 / copy))
        print(rows[-1], flush=True)
    norms.norm_fwd_config = real_cfg
_rows.resident_programs = real_rp
print("n affine forced factor regs shared resident us %copy")
for r in rows:
    print(f"{r[0]:7d} {r[1]:4s} {r[2]:32s} {r[3]:.2f} regs {r[4]} smem {r[5]} resident {r[6]:5d} {r[7]:8.1f} us {r[8]:5.1f}%")
