"""add+RMSNorm's backward over long rows: the CUDA cluster backward with the residual gradient
added in the write (norm.cu, DS_ROWS) against the Triton backward it replaces, and RMSNorm's
backward (no residual gradient) on the cluster kernel beside them. M * N = 2^27 bf16, the bench's
shapes; the bench's timer, alternating rounds, least per-round time. The cluster rows bypass
heuristics.NORM_BWD_DSUM (which keeps 262K on Triton).

    python benchmarks/probe_add_rms_bwd.py [--rounds 5]
"""
from __future__ import annotations

import argparse

import torch

from warpforge.bench import timing
from warpforge.ops import norms
from warpforge.runtime import device as dev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    cfg = timing.TimingConfig.quick()
    real = norms._norm_bwd_cluster
    real_cfg = norms.norm_bwd_cluster_config
    # the cluster kernel at both lengths, whatever heuristics.NORM_BWD_DSUM routes
    norms.norm_bwd_cluster_config = lambda n, m, layer, name, dsum=False: real_cfg(n, m, layer, name)
    table = []
    for n in (65536, 262144):
        m = 2**27 // n
        h = torch.randn(m, n, device="cuda").to(torch.bfloat16)
        dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
        ds = torch.randn(m, n, device="cuda").to(torch.bfloat16)
        w = (torch.rand(n, device="cuda") + 0.5).to(torch.bfloat16)
        rstd = (h.float().pow(2).mean(-1) + 1e-6).rsqrt()

        def call(with_ds, cluster):
            def f():
                norms._norm_bwd_cluster = real if cluster else (lambda *args: None)
                try:
                    return norms._norm_bwd(dy, h, ds if with_ds else None, w, None, rstd, 0.0, True, False, False)
                finally:
                    norms._norm_bwd_cluster = real
            return f
        fns = {"add_rms cluster": (call(True, True), 4), "add_rms triton": (call(True, False), 4),
               "rms cluster": (call(False, True), 3)}
        ref = call(True, False)()[0].float()
        got = fns["add_rms cluster"][0]()[0].float()
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 1e-2, err
        best = {k: [] for k in fns}
        for _ in range(a.rounds):
            for k, (f, streams) in fns.items():
                best[k].append(timing.device_ms(f, cfg, streams * m * n * 2) * 1e3)
        for k, (f, streams) in fns.items():
            us = min(best[k])
            pct = streams * m * n * 2 / (us * 1e-6) / 1e9 / copy * 100
            table.append((f"{m}x{n}", k, us, pct, err if k == "add_rms cluster" else None))
            print(table[-1], [round(x, 1) for x in best[k]], flush=True)
    print(f"\n{'shape':12s} {'impl':16s} {'us':>8s} {'% copy':>7s}")
    for s, k, us, pct, _ in table:
        print(f"{s:12s} {k:16s} {us:8.1f} {pct:7.1f}")


if __name__ == "__main__":
    main()
