"""Device probe: the two-pass loop forwards with N compiled in (ops/norms.py
``_norm_fwd_loop_kernel`` and ``_layer_norm_fwd_loop_kernel`` N_CONST: fixed trip counts, no
masks), against the same kernels with N a runtime argument, the op's default route and
torch.compile (issue 2 on the H200: RMSNorm forward at 8K and 32K read 0.99x compile, LayerNorm
forward at 32K 87% of copy against 90%; NOTES item 105). bf16, M*N = 2^27, weight (and bias), eps
1e-6 (1e-5); each variant checked against the default route's output, then timed with the bench's
timer in ``--rounds`` alternating rounds (least kept). Also prints torch.compile's launch (grid and
block of its kernel, from the profiler).

    python benchmarks/probe_rms_const.py [--ns 8192,32768] [--norms rms,ln] [--shapes 4096:16,...] [--rounds 3]
"""
import argparse
import json
import os
import tempfile

import torch

import warpforge as wf
from warpforge.ops import norms
from warpforge.runtime import device as dev

from probe_variants import check_variants, table_rows, time_rounds

SHAPES = {("rms", 8192): [(1024, 4), (1024, 8), (2048, 4), (2048, 8), (2048, 16), (4096, 8), (4096, 16),
                          (8192, 16)],
          ("rms", 32768): [(8192, 32), (16384, 32)],
          ("ln", 32768): [(8192, 16), (8192, 32), (16384, 16), (16384, 32), (32768, 32)],
          ("ln", 8192): [(4096, 16), (8192, 16), (8192, 32)],
          ("rms", 4096): [(1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (4096, 16)],
          ("rms", 65536): [(8192, 16), (8192, 32), (16384, 32)],
          ("ln", 65536): [(8192, 16), (8192, 32), (16384, 32)]}


def compile_launch(fn):
    """(grid, block) of the CUDA kernels one call of ``fn`` runs, from a profiler trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    return [(e["name"][:50], e["args"].get("grid"), e["args"].get("block"))
            for e in events if e.get("cat") == "kernel"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="8192,32768")
    ap.add_argument("--norms", default="rms,ln")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="", help="block_n:warps,... instead of the built-in lists")
    a = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    table = []
    for n in (int(v) for v in a.ns.split(",")):
        m = 2**27 // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
        w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * m * n * 2
        y = torch.empty_like(x)
        stat = torch.empty(m, device="cuda", dtype=torch.float32)
        rstd = torch.empty(m, device="cuda", dtype=torch.float32)
        for norm in a.norms.split(","):
            if (norm, n) not in SHAPES:
                continue
            if norm == "rms":
                comp = torch.compile(lambda t: torch.nn.functional.rms_norm(t, (n,), w, 1e-6), dynamic=False)
                op = lambda: wf.rms_norm(x, (n,), w, eps=1e-6)          # noqa: E731
            else:
                comp = torch.compile(lambda t: torch.nn.functional.layer_norm(t, (n,), w, b, 1e-5), dynamic=False)
                op = lambda: wf.layer_norm(x, (n,), w, b, eps=1e-5)     # noqa: E731
            comp(x)
            print(f"{norm} N={n}: compile launches {compile_launch(lambda: comp(x))}", flush=True)
            base = op()

            def direct(block_n, warps, const, norm=norm):
                if norm == "rms":
                    args = (x, x, y, y, w, x, rstd, rstd, m, n, x.stride(0), 0, y.stride(0), 0, 1e-6, 0.0)
                    return lambda: norms._norm_fwd_loop_kernel[(m,)](
                        *args, RMS=True, HAS_W=True, HAS_B=False, HAS_RES=False, LLAMA=False, HAS_OFFSET=False,
                        BLOCK_N=block_n, N_CONST=n if const else 0, num_warps=warps)
                args = (x, y, w, b, stat, rstd, m, n, x.stride(0), y.stride(0), 1e-5)
                return lambda: norms._layer_norm_fwd_loop_kernel[(m,)](
                    *args, HAS_W=True, HAS_B=True, BLOCK_N=block_n, ROWS=1, EVEN_N=n % block_n == 0,
                    N_CONST=n if const else 0, num_warps=warps)

            variants = {"compile": lambda c=comp: c(x), "default": op}
            shapes = [tuple(int(v) for v in t.split(":")) for t in a.shapes.split(",") if t] or SHAPES[(norm, n)]
            for block_n, warps in shapes:
                for const in (False, True):
                    variants[f"loop {block_n}x{warps}{' const' if const else ''}"] = direct(block_n, warps, const)
            label = f"{norm:3s} N={n:6d}"
            # against the default route: one bf16 step at the outputs' size
            check_variants(variants, y, lambda out: (out.float() - base.float()).abs().max().item(), 0.0625, label)
            table += table_rows(time_rounds(variants, a.rounds, nbytes, label), label, nbytes, copy)
    print("\n".join(table))


if __name__ == "__main__":
    main()
