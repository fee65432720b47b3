"""Device probe (session 39, NOTES item 109): the softmax and log-softmax forward through
``ops.softmax._softmax_fwd`` with its route forced to each of a list of shapes (``softmax_config``
patched; the eager fast path off, so no call replays another shape's kernel), against the op's own
route, torch.compile and Liger where importable. The H200's short cells after item 108: 1K (the
block kernel 0.93-0.96x torch.compile) and 262K (the pipe, 73-78% of copy; the bar is 85%), where
items 113-115 add the CUDA backend's staged cluster forward (``cluster`` rows; a sixth value is
blocks an SM). The ``default`` row is the op's own route: at 262K on the H200 that is now the
cluster kernel (heuristics.SOFTMAX_CLUSTER); ``pipe 8192x4`` is the Triton route it replaced.
bf16, M*N = 2^27; each variant checked against a float64 reference, then timed in ``--rounds``
alternating rounds with the bench's timer.

    python benchmarks/probe_softmax_shapes.py [--ns 1024,65536,262144] [--ops softmax,log_softmax] [--rounds 3] [--scale 3]
                                              [--match REGEX]
"""
import argparse
import re

import torch

from warpforge.ops import softmax as S
from warpforge.runtime import device as dev
from warpforge.runtime import fastpath
from warpforge.runtime.heuristics import RowConfig

from probe_softmax_loop import check_and_time, softmax_cases


def shapes(n: int) -> dict:
    """name -> RowConfig tried at rows of ``n``."""
    out = {}
    if n <= 4096:
        for rows, warps in ((1, 2), (1, 4), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (16, 8)):
            out[f"block {rows}r x{warps}"] = RowConfig("block", n, rows, warps)
        return out
    for mode in ("pipe", "split"):
        for chunk, warps in ((2048, 2), (4096, 2), (4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16)):
            if n // chunk <= 128 and n % chunk == 0:
                out[f"{mode} {chunk}x{warps}"] = RowConfig(mode, chunk, 1, warps, n // chunk)
    for step in (8192, 16384):
        out[f"loop {step}x32 const"] = RowConfig("loop", step, 1, 32, const_n=True)
    for c, t, v, r, st, *more in CLUSTER_SHAPES.get(n, ()):
        out[f"cluster {c}x{t}x{v} r{r} s{st}" + (f" b{more[0]}" if more else "")] = (c, t, v, r, st, *more)
    return out


# (cluster, threads, vectors a thread, rows a group, stages[, blocks an SM]) of the CUDA backend's
# staged cluster forward (NOTES items 113-115; LayerNorm's H200 shapes first, NORM_LAYER_CLUSTER;
# item 115's instruction diet lets 1,024 threads an SM hold 2 vectors a thread)
CLUSTER_SHAPES = {65536: ((8, 256, 4, 2, 3), (8, 256, 4, 2, 3, 2), (4, 256, 8, 1, 3, 2), (2, 512, 8, 1, 3),
                          (8, 512, 2, 1, 3, 2), (8, 512, 2, 2, 2, 2), (4, 1024, 2, 1, 3), (4, 1024, 2, 2, 3)),
                  262144: ((16, 256, 8, 1, 3), (16, 256, 8, 2, 3), (16, 512, 4, 1, 3), (16, 1024, 2, 1, 3),
                           (16, 1024, 2, 2, 2), (16, 1024, 2, 1, 4), (16, 256, 8, 1, 2, 2), (8, 512, 8, 1, 3))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1024,65536,262144")
    ap.add_argument("--ops", default="softmax,log_softmax")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=3.0, help="x ~ N(0, 1) times this (the bench's rows: 1)")
    ap.add_argument("--match", default="", help="only the shapes whose name matches this regex (the peers always)")
    a = ap.parse_args()
    copy = dev.ceilings()["copy_gbps"]
    own_config, own_cluster = S.softmax_config, S.softmax_cluster_config
    fastpath.lib = None
    table = []
    for x, log, label, nbytes, peers, error in softmax_cases([int(v) for v in a.ns.split(",")], a.ops.split(","), a.scale):
        def forced(cfg, x=x, log=log):
            def call():
                if isinstance(cfg, tuple):      # a cluster shape: the CUDA staged cluster forward
                    S.softmax_cluster_config = lambda *_a: cfg
                elif cfg is not None:           # a Triton shape, also where the cluster route would take N
                    S.softmax_config = lambda *_a, **_k: cfg
                    S.softmax_cluster_config = lambda *_a: None
                try:
                    return S._softmax_fwd(x, log)
                finally:
                    S.softmax_config, S.softmax_cluster_config = own_config, own_cluster
            return call

        variants = dict(peers, default=forced(None))
        variants.update({name: forced(cfg) for name, cfg in shapes(x.shape[1]).items() if re.search(a.match, name)})
        table += check_and_time(variants, torch.empty_like(x), error, label, nbytes, a.rounds, copy)
    print("\n".join(table))


if __name__ == "__main__":
    main()
