"""Device probe (session 40, NOTES item 114): the softmax and log-softmax backward alone through
``ops.softmax._softmax_bwd`` with its route forced to each of a list of shapes (``softmax_config``
patched), against the op's own route and torch.compile's backward. The H200's short cell after the
cluster forward: log-softmax forward+backward at 262K, 75% of copy (bar 80%), whose backward
(dx = dy - exp(y) sum(dy)) runs an exp an element that the softmax backward does not.
bf16, M*N = 2^27, 3 tensors moved; each variant checked against a float64 reference on 64 rows,
then timed in ``--rounds`` alternating rounds with the bench's timer.

    python benchmarks/probe_softmax_bwd_shapes.py [--ns 65536,262144] [--ops softmax,log_softmax] [--rounds 2] [--match REGEX]
"""
import argparse
import re

import torch

from warpforge.ops import softmax as S
from warpforge.runtime import device as dev
from warpforge.runtime.heuristics import RowConfig

from probe_softmax_loop import check_and_time


def shapes(n: int) -> dict:
    out = {}
    for mode in ("pipe", "split"):
        for chunk, warps in ((2048, 2), (4096, 2), (4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16)):
            if n // chunk <= 128 and n % chunk == 0:
                out[f"{mode} {chunk}x{warps}"] = RowConfig(mode, chunk, 1, warps, n // chunk)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="65536,262144")
    ap.add_argument("--ops", default="softmax,log_softmax")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--match", default="")
    a = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    own = S.softmax_config
    table = []
    for n in (int(v) for v in a.ns.split(",")):
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
        dy = torch.randn_like(x)
        for op in a.ops.split(","):
            log = op == "log_softmax"
            tfn = torch.log_softmax if log else torch.softmax
            y = tfn(x.float(), -1).to(torch.bfloat16)
            yd, dyd = y[:64].double(), dy[:64].double()
            ref = dyd - yd.exp() * dyd.sum(-1, keepdim=True) if log else yd * (dyd - (yd * dyd).sum(-1, keepdim=True))
            bwd = torch._log_softmax_backward_data if log else torch._softmax_backward_data
            comp = torch.compile(lambda g, o, f=bwd: f(g, o, -1, torch.bfloat16), dynamic=False)
            comp(dy, y)

            def forced(cfg, y=y, dy=dy, log=log):
                def call():
                    if cfg is not None:
                        S.softmax_config = lambda *_a, **_k: cfg
                    try:
                        return S._softmax_bwd(y, dy, log)
                    finally:
                        S.softmax_config = own
                return call

            variants = {"compile": lambda c=comp, y=y, dy=dy: c(dy, y), "default": forced(None)}
            variants.update({k: forced(c) for k, c in shapes(n).items() if re.search(a.match, k)})
            table += check_and_time(variants, torch.empty_like(x), lambda out, ref=ref: (
                (out[:64].double() - ref).norm() / ref.norm()).item(), f"{op:11s} bwd N={n:6d}", 3 * m * n * 2,
                a.rounds, copy)
    print("\n".join(table))


if __name__ == "__main__":
    main()
