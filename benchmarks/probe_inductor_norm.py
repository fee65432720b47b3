"""Device probe: the Triton kernels torch.compile generates for RMSNorm and LayerNorm forward at a
given shape (bf16), with the launch configs its autotuner settled on and their times, to compare
launch strategies with ours. Prints the kernels' source.

    python benchmarks/probe_inductor_norm.py [--shape 16384,8192]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from warpforge.bench.timing import TimingConfig, device_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16384,8192")
    a = ap.parse_args()
    m, n = (int(v) for v in a.shape.split(","))
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    from torch._inductor.codecache import PyCodeCache
    for name, fn in (("rms", lambda t: F.rms_norm(t, (n,), w, 1e-6)), ("ln", lambda t: F.layer_norm(t, (n,), w, b, 1e-5))):
        torch._dynamo.reset()
        before = set(PyCodeCache.modules) if isinstance(PyCodeCache.modules, dict) else set()
        comp = torch.compile(fn, dynamic=False)
        comp(x)
        ms = device_ms(lambda: comp(x), TimingConfig(), 2 * m * n * 2)
        print(f"==== {name} {m}x{n}: {ms * 1e3:.1f} us", flush=True)
        mods = PyCodeCache.modules
        for key in (set(mods) - before if isinstance(mods, dict) else []):
            mod = mods[key]
            for attr in dir(mod):
                obj = getattr(mod, attr)
                if hasattr(obj, "launchers") or hasattr(obj, "fn"):
                    src = getattr(getattr(obj, "fn", None), "src", None)
                    if src:
                        print(f"---- {attr}\n{src}")
                    for l in getattr(obj, "launchers", []) or []:
                        print("  launcher config:", getattr(l, "config", l), "n_regs", getattr(l, "n_regs", "?"),
                              "n_spills", getattr(l, "n_spills", "?"))
                    cfgs = getattr(obj, "configs", None)
                    if cfgs:
                        print("  autotune configs:", [str(c) for c in cfgs])


if __name__ == "__main__":
    main()
