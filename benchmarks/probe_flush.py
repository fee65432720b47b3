"""How the L2 flush between timed calls moves a kernel's measured bandwidth (not the benchmark).

`triton.testing.do_bench` overwrites a 256 MB buffer (a memset) before every call. The last ~L2's
worth of those writes is still dirty in L2 when the timed call starts, so the call's misses write
the memset's lines back: a read-only kernel is charged writes that are not its own, while the copy
ceiling (back-to-back copies, `runtime/device.py`) is not. This probe times the same calls four ways:

- ``memset``: do_bench as shipped (memset flush, median);
- ``read``:   events around each call after a read-only pass over a 2x-L2 buffer (L2 left clean);
- ``clean``:  memset flush, then the read pass (the memset's lines written back before the call):
  `bench/timing.py`'s ``flush_l2``;
- ``steady``: back-to-back calls over rotating input sets, no flush, mean per call -- each call pays
  for the previous call's dirty lines, which for the same op are its own: the ceiling's conditions;
- ``same``:   as ``steady`` on one input set (what the bench can do: its closures hold one set);
- ``bench``:  `bench/timing.py`'s ``device_ms`` for the call's byte model (what `warpforge bench` uses).

With ``--ncu`` it runs one memset + row sum sequence for `ncu --cache-control none`, so the DRAM
bytes the sum kernel writes can be read off (a read-only kernel that writes ~L2 bytes pays for the
flush).

    python benchmarks/probe_flush.py [--ncu]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton.testing

import warpforge as wf
from warpforge.bench import timing

BF16 = torch.bfloat16


def _events(n):
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


class Flusher:
    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.wipe = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
        self.clean_src = torch.empty(max(2 * l2, 128 * 2**20) // 4, dtype=torch.float32, device="cuda").uniform_()

    def memset(self):
        self.wipe.zero_()

    def read(self):
        self.clean_src.sum()

    clean = staticmethod(timing.flush_l2)   # memset, then a read pass: the bench's own clean flush


def timed(fns, flush, reps=60):
    """Median ms of single calls, each after ``flush`` (rotating over ``fns``)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    s, e = _events(reps), _events(reps)
    for i in range(reps):
        flush()
        s[i].record()
        fns[i % len(fns)]()
        e[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(s, e))


def steady(fns, batch=20, reps=9):
    """Mean ms a call over ``batch`` back-to-back calls rotating over ``fns``; median of reps."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = _events(1)[0], _events(1)[0]
        s.record()
        for i in range(batch):
            fns[i % len(fns)]()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) / batch)
    return statistics.median(out)


def cases():
    """(name, bytes moved by the op's byte model, [one closure per input set])."""
    n = 2**27
    out = []

    def copy_sets(k):
        pairs = [(torch.randn(n, device="cuda", dtype=BF16), torch.empty(n, device="cuda", dtype=BF16)) for _ in range(k)]
        return [lambda p=p: p[1].copy_(p[0]) for p in pairs]

    out.append(("copy 2^27 bf16 (torch)", 4 * n, copy_sets(2)))
    big = 2**30
    src = [torch.empty(big, dtype=torch.uint8, device="cuda").random_() for _ in range(2)]
    dst = [torch.empty_like(s) for s in src]
    out.append(("copy 1 GiB (the ceiling's)", 2 * big, [lambda a=a, b=b: b.copy_(a) for a, b in zip(src, dst)]))
    for m, nn in ((512, 262144), (2048, 65536), (32768, 4096)):
        xs = [torch.randn(m, nn, device="cuda", dtype=BF16) for _ in range(2)]
        out.append((f"cuda sum {m}x{nn}", 2 * m * nn, [lambda x=x: wf.sum(x, backend="cuda") for x in xs]))
        out.append((f"torch sum {m}x{nn}", 2 * m * nn, [lambda x=x: x.sum(-1) for x in xs]))
        if nn == 262144:
            out.append((f"cuda amax {m}x{nn}", 2 * m * nn, [lambda x=x: wf.amax(x, backend="cuda") for x in xs]))
    xs = [torch.randn(32768, 4096, device="cuda", dtype=BF16) for _ in range(2)]
    out.append(("triton softmax 32768x4096", 4 * n, [lambda x=x: wf.softmax(x) for x in xs]))
    out.append(("cuda softmax 32768x4096", 4 * n, [lambda x=x: wf.softmax(x, backend="cuda") for x in xs]))
    a = [torch.randn(n, device="cuda", dtype=BF16) for _ in range(4)]
    out.append(("cuda add 2^27 bf16", 6 * n, [lambda i=i: wf.add(a[i], a[i + 1], backend="cuda") for i in (0, 2)]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args()
    fl = Flusher()
    if args.ncu:
        x = torch.randn(512, 262144, device="cuda", dtype=BF16)
        for flush in (fl.memset, fl.clean):
            wf.sum(x, backend="cuda")
            torch.cuda.synchronize()
            flush()
            wf.sum(x, backend="cuda")
            torch.cuda.synchronize()
        print("ncu target done: the 2nd sum follows a memset flush, the 4th a memset + read pass")
        return
    ceil = None
    rows = []
    cfg = timing.TimingConfig()
    for name, nbytes, fns in cases():
        r = {
            "memset": triton.testing.do_bench(fns[0], warmup=10, rep=60, return_mode="median"),
            "read": timed(fns, fl.read),
            "clean": timed(fns, fl.clean),
            "steady": steady(fns),
            "same": steady(fns[:1]),
            "bench": timing.device_ms(fns[0], cfg, nbytes),
        }
        if name.startswith("copy 1 GiB"):
            ceil = nbytes / r["steady"] / 1e6
        rows.append((name, {k: nbytes / v / 1e6 for k, v in r.items()}))
        print(name, {k: round(v, 4) for k, v in r.items()}, flush=True)
    print(f"\nceiling (copy 1 GiB steady, as runtime/device.py): {ceil:,.0f} GB/s; % of it:")
    keys = ("memset", "read", "clean", "steady", "same", "bench")
    print(f"{'case':32s} " + " ".join(f"{k:>8s}" for k in keys))
    for name, g in rows:
        print(f"{name:32s} " + " ".join(f"{100 * g[k] / ceil:7.1f}%" for k in keys))


if __name__ == "__main__":
    main()
