"""Device probe: torch.compile's RMSNorm and LayerNorm forward at one shape (bf16), timed as the
bench does. Run it with TORCH_LOGS=output_code to see the Triton kernels Inductor generates (their
loads' eviction policies, looped or persistent reduction) next to the times.

    TORCH_LOGS=output_code python benchmarks/probe_inductor_norm.py [--shape 16384,8192]
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
    for name, fn in (("rms", lambda t: F.rms_norm(t, (n,), w, 1e-6)), ("ln", lambda t: F.layer_norm(t, (n,), w, b, 1e-5))):
        torch._dynamo.reset()
        comp = torch.compile(fn, dynamic=False)
        comp(x)
        ms = device_ms(lambda: comp(x), TimingConfig(), 2 * m * n * 2)
        print(f"==== {name} {m}x{n}: {ms * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    main()
