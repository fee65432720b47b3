"""Device probe: the sum / amax forward's row loop with N compiled in (ops/reduce.py
``_reduce_fwd_loop_kernel`` N_CONST: fixed trip count, no masks, no software prefetch) against the
same kernel with N a runtime argument, the op's default route and torch.compile (issue 2 on the
H200: amax forward at 8K read 88.5% of copy and 0.97x compile in session 18's run; NOTES item
106). bf16, M*N = 2^27; each variant checked against the default route's output, then timed with
the bench's timer in ``--rounds`` alternating rounds (least kept).

    python benchmarks/probe_reduce_const.py [--ns 4096,8192,32768] [--ops sum,amax] [--rounds 3]
"""
import argparse

import torch

import warpforge as wf
from warpforge.ops import reduce as R
from warpforge.runtime import device as dev

from probe_variants import check_variants, table_rows, time_rounds

SHAPES = {4096: [(2048, 8), (2048, 16), (4096, 8), (4096, 16)],
          8192: [(2048, 16), (4096, 8), (4096, 16), (8192, 16), (8192, 32)],
          32768: [(4096, 16), (8192, 16), (8192, 32)],
          65536: [(4096, 16), (8192, 32)],
          262144: [(4096, 16), (8192, 32)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="4096,8192,32768,65536,262144")
    ap.add_argument("--ops", default="sum,amax")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    table = []
    for n in (int(v) for v in a.ns.split(",")):
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, device="cuda", dtype=torch.bfloat16)
        nbytes = m * n * 2 + m * 2
        for op in a.ops.split(","):
            is_max = op == "amax"
            ref = x.float().amax(-1) if is_max else x.float().sum(-1)
            comp = torch.compile(lambda t, f=(torch.amax if is_max else torch.sum): f(t, -1), dynamic=False)
            comp(x)
            ours = (lambda: wf.amax(x, -1)) if is_max else (lambda: wf.sum(x, -1))

            def direct(block_n, warps, const, is_max=is_max):
                return lambda: R._reduce_fwd_loop_kernel[(m,)](x, y, y, n, x.stride(0), MAX=is_max, COUNT=False,
                                                                BLOCK_N=block_n, N_CONST=n if const else 0,
                                                                num_warps=warps)

            variants = {"compile": lambda c=comp: c(x), "default": ours}
            for block_n, warps in SHAPES.get(n, []):
                for const in (False, True):
                    variants[f"loop {block_n}x{warps}{' const' if const else ''}"] = direct(block_n, warps, const)
            label = f"{op:4s} N={n:6d}"
            check_variants(variants, y, lambda out: ((out.float() - ref).abs().max() / ref.abs().max()).item(), 1e-2,
                           label)
            table += table_rows(time_rounds(variants, a.rounds, nbytes, label), label, nbytes, copy)
    print("\n".join(table))


if __name__ == "__main__":
    main()
