"""Device probe (branch s38-softmax-loop; NOTES item 108): softmax and log-softmax forward through
the two-pass loop kernel (ops/softmax.py ``_softmax_fwd_loop_kernel``: online statistics per
8-column group, x kept in L2 between the passes), with N a runtime argument and compiled in
(N_CONST), against the op's default route (the one-program block kernel to 32K), torch.compile and
Liger's softmax where importable. Issue 2 on the H200 (NOTES item 107): the softmax forwards read
75% of copy at 32K and 0.98-0.99x Liger at 4K-8K. bf16, M*N = 2^27; each variant checked against a
float64 reference, then timed with the bench's timer in ``--rounds`` alternating rounds.

    python benchmarks/probe_softmax_loop.py [--ns 4096,8192,16384,32768,65536] [--ops softmax,log_softmax] [--rounds 3]
"""
import argparse

import torch

import warpforge as wf
from warpforge.ops import softmax as S
from warpforge.runtime import device as dev

from probe_variants import check_variants, table_rows, time_rounds

SHAPES = {1024: [(512, 4), (1024, 4), (1024, 8)],
          2048: [(1024, 4), (2048, 4), (2048, 8)],
          4096: [(2048, 8), (2048, 16), (4096, 8), (4096, 16)],
          8192: [(2048, 16), (4096, 8), (4096, 16), (8192, 16)],
          16384: [(4096, 16), (8192, 16), (8192, 32)],
          32768: [(4096, 16), (8192, 16), (8192, 32), (16384, 32)],
          65536: [(8192, 32), (16384, 32)]}


def liger_softmax():
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
    except Exception:  # noqa: BLE001 -- absent or broken: no Liger row
        return None
    return LigerSoftmaxFunction.apply


def softmax_cases(ns, ops, scale: float = 3.0):
    """For each N and op: (x, log, label, bytes moved, the peers' variants, the error of an
    output's first 64 rows against float64). x: bf16 rows of N scaled by ``scale``, M*N = 2^27; the peers:
    torch.compile (warmed up) and Liger's softmax where it applies (rows to 64K)."""
    liger = liger_softmax()
    for n in ns:
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * scale
        for op in ops:
            log = op == "log_softmax"
            tfn = torch.log_softmax if log else torch.softmax
            ref = tfn(x[:64].double(), -1)
            comp = torch.compile(lambda t, f=tfn: f(t, -1), dynamic=False)
            comp(x)
            peers = {"compile": lambda c=comp, x=x: c(x)}
            if liger is not None and not log and n <= 65536:
                peers["liger"] = lambda x=x: liger(x)
            yield (x, log, f"{op:11s} N={n:6d}", 2 * m * n * 2, peers,
                   lambda out, ref=ref: ((out[:64].double() - ref).norm() / ref.norm()).item())


def check_and_time(variants: dict, out_buf, error, label: str, nbytes: int, rounds: int, copy: float) -> list[str]:
    """Check every variant (limit 1e-2), time the rest in alternating rounds, print their rows."""
    check_variants(variants, out_buf, error, 1e-2, label)
    rows = table_rows(time_rounds(variants, rounds, nbytes, label), label, nbytes, copy)
    print("\n".join(rows), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="4096,8192,16384,32768,65536")
    ap.add_argument("--ops", default="softmax,log_softmax")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    table = []
    for x, log, label, nbytes, peers, error in softmax_cases([int(v) for v in a.ns.split(",")], a.ops.split(",")):
        m, n = x.shape
        y = torch.empty_like(x)

        def direct(block_n, warps, const, x=x, y=y, log=log):
            return lambda: S._softmax_fwd_loop_kernel[(m,)](x, y, m, n, x.stride(0), y.stride(0), LOG=log,
                                                             BLOCK_N=block_n, N_CONST=n if const else 0,
                                                             num_warps=warps)

        variants = dict(peers, default=(lambda x=x: wf.log_softmax(x, -1)) if log else (lambda x=x: wf.softmax(x, -1)))
        for block_n, warps in SHAPES.get(n, []):
            for const in (False, True):
                variants[f"loop {block_n}x{warps}{' const' if const else ''}"] = direct(block_n, warps, const)
        table += check_and_time(variants, y, error, label, nbytes, a.rounds, copy)
    print("\n".join(table))


if __name__ == "__main__":
    main()
