"""RoPE at decode shapes (and the benchmark's prefill shape), where the backward trailed Liger's:
an earlier ops/rope.py (``--old``) against today's kernel with either order of its loads forced
(``RopeConfig.table_first``: table rows at the top, or after the step's q/k loads), beside Liger's
kernels fed pre-gathered rows.

Kernel launches only (no autograd, no fast path), timed with the bench's timer in alternating
rounds (the least of each implementation's per-round medians, as the bench's small cases are).

    python benchmarks/probe_rope_decode.py [--old PATH_TO_OLD_rope.py] [--rounds 7]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util

import torch

from warpforge.bench import timing
from warpforge.bench.workloads import _rope_make, rope_cases
from warpforge.ops import rope as R


def load_old(path: str):
    """An earlier ops/rope.py, imported as a sibling module (its relative imports resolve)."""
    spec = importlib.util.spec_from_file_location("warpforge.ops._rope_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def impls(old, q, k, cos, sin, pos, backward):
    real = R.rope_config

    def ours(table_first):
        def f():
            R.rope_config = lambda *a: dataclasses.replace(real(*a), table_first=table_first)
            try:
                return R._rope_launch(q, k, cos, sin, pos, 0, False, backward=backward)
            finally:
                R.rope_config = real
        return f
    out = {"qk first": ours(False), "table first": ours(True)}
    if old is not None:
        out["old"] = lambda: old._rope_launch(q, k, cos, sin, pos, 0, False, backward=backward)
    try:
        from liger_kernel.ops.rope import rope_backward, rope_forward
        cg, sg = (cos[pos], sin[pos]) if pos is not None else (cos, sin)    # Liger takes gathered rows
        lq, lk = q.clone(), k.clone()                                       # it writes in place
        f = rope_backward if backward else rope_forward
        out["liger"] = lambda: f(lq, lk, cg, sg)
    except ImportError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    old = load_old(a.old) if a.old else None
    cfg = timing.TimingConfig.quick()
    table = []
    for case in rope_cases(quick=True):
        q, k, cos, sin, pos = _rope_make(case, torch.bfloat16, "cuda")
        nbytes = 2 * (q.numel() + k.numel()) * 2
        for backward in (False, True):
            fns = impls(old, q, k, cos, sin, pos, backward)
            ref = R.rope_reference(q, k, cos, -sin if backward else sin, pos)   # HF tables: bwd = sin -> -sin
            for name in ("qk first", "table first", "old"):
                if name in fns:
                    oq, ok_ = fns[name]()
                    err = max(rel(oq, ref[0]), rel(ok_, ref[1]))
                    assert err < 1e-2, (case.label, name, backward, err)
            best = {n: [] for n in fns}
            for _ in range(a.rounds):
                for n, f in fns.items():
                    best[n].append(timing.device_ms(f, cfg, nbytes) * 1e3)
            for n, v in best.items():
                table.append((case.label[:24], "bwd" if backward else "fwd", n, min(v), sorted(v)[len(v) // 2]))
                print(table[-1], [round(x, 2) for x in v], flush=True)
    print(f"\n{'case':26s} {'mode':4s} {'impl':12s} {'min us':>8s} {'median us':>10s}")
    for c, m, n, lo, med in table:
        print(f"{c:26s} {m:4s} {n:12s} {lo:8.2f} {med:10.2f}")


if __name__ == "__main__":
    main()
