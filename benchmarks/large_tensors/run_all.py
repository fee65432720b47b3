#!/usr/bin/env python
"""Run every int32-overflow / grid-limit suspect of the warpforge audit on a GPU and print one line each:

    SUSPECT <name>: OK | WRONG (max err ...) | ERROR <exception>

Usage (from anywhere; needs warpforge importable, e.g. /work/main/.venv/bin/python):

    python benchmarks/large_tensors/run_all.py               # all suspects, ~2-4 min on an H200, peak ~40 GB
    python benchmarks/large_tensors/run_all.py --controls    # also the controls (kernels judged safe): CONTROL lines
    python benchmarks/large_tensors/run_all.py --only attention matmul   # names containing any of these substrings
    python benchmarks/large_tensors/run_all.py --isolate     # every repro in its own process (timeout per repro)
    python benchmarks/large_tensors/run_all.py --list

Each repro runs inside try/except; its tensors are dropped (the exception's frames cleared, gc, then
torch.cuda.empty_cache()) before the next. A repro that trips an illegal memory access leaves the
CUDA context unusable for the rest of the process: the runner detects that and continues with the
remaining repros in a fresh child process (so one crash never turns the later lines into ERRORs).
WARPFORGE_FASTPATH=0 is set so that the one-time C++ fast-path build (~1 min) is skipped; the fast
path replays the same Triton kernels and is never taken for these shapes' first calls anyway.

Expected outcome if the audit is right: every SUSPECT line is WRONG or ERROR, every CONTROL OK.
"""
import argparse
import gc
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("WARPFORGE_FASTPATH", "0")

MODULES = ["repro_reduce_1d", "repro_matmul", "repro_attention", "repro_ce_scale"]
CONTROLS = ["repro_controls"]


def _items(controls: bool):
    import importlib

    out = []
    for kind, mods in (("SUSPECT", MODULES), ("CONTROL", CONTROLS if controls else [])):
        for m in mods:
            mod = importlib.import_module(m)
            for name, fn in mod.SUSPECTS.items():
                out.append((kind, name, fn))
    return out


def _select(items, only):
    if not only:
        return items
    return [it for it in items if any(s.lower() in it[1].lower() for s in only)]


def _cuda_alive() -> bool:
    import torch

    if not torch.cuda.is_available():
        return True
    try:
        torch.cuda.synchronize()
        return float(torch.ones(1, device="cuda").add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001
        return False


def _cleanup():
    import torch

    gc.collect()
    if torch.cuda.is_available():
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


def _run_one(fn) -> str:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        status = f"ERROR {type(e).__name__}: {msg}"[:400]
        traceback.clear_frames(e.__traceback__)      # drop the frames' references to the big tensors
        return status


def _child_cmd(args, start=None, one=None):
    cmd = [sys.executable, os.path.abspath(__file__)]
    if args.controls:
        cmd.append("--controls")
    if args.only:
        cmd += ["--only", *args.only]
    if start is not None:
        cmd += ["--start", str(start)]
    if one is not None:
        cmd += ["--one", str(one)]
    return cmd


def _header():
    import torch

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        print(f"# device: {p.name}, {p.multi_processor_count} SMs, {total / 2**30:.0f} GiB ({free / 2**30:.0f} GiB free); "
              f"torch {torch.__version__}", flush=True)
        if free < 48 * 2**30:
            print("# warning: the attention backward repro needs ~40 GB of free GPU memory", flush=True)
    else:
        print("# no CUDA device: running under the Triton interpreter (only meaningful with AUDIT64_TINY=1)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controls", action="store_true", help="also run the controls (kernels judged safe)")
    ap.add_argument("--only", nargs="*", default=[], help="run names containing any of these substrings")
    ap.add_argument("--isolate", action="store_true", help="each repro in its own process")
    ap.add_argument("--timeout", type=int, default=300, help="per-repro timeout with --isolate (s)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    items = _select(_items(args.controls), args.only)
    if args.list:
        for i, (kind, name, _) in enumerate(items):
            print(f"{i:2d} {kind} {name}")
        return 0

    if args.one is not None:                        # child of --isolate: one repro
        kind, name, fn = items[args.one]
        print(f"{kind} {name}: {_run_one(fn)}", flush=True)
        return 0

    t_all = time.time()
    if args.start == 0:
        _header()
    if args.isolate:
        for i, (kind, name, _) in enumerate(items):
            t0 = time.time()
            try:
                r = subprocess.run(_child_cmd(args, one=i), capture_output=True, text=True, timeout=args.timeout)
                lines = [ln for ln in r.stdout.splitlines() if ln.startswith(f"{kind} ")]
                if lines:
                    print(lines[-1], flush=True)
                else:
                    tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
                    print(f"{kind} {name}: ERROR child exited with code {r.returncode}: {tail}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{kind} {name}: ERROR timeout after {args.timeout} s", flush=True)
            print(f"#   {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        print(f"# done in {time.time() - t_all:.0f} s", flush=True)
        return 0

    import torch

    for i in range(args.start, len(items)):
        kind, name, fn = items[i]
        t0 = time.time()
        status = _run_one(fn)
        print(f"{kind} {name}: {status}", flush=True)
        _cleanup()
        used = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
        print(f"#   {time.time() - t0:.1f} s, {used:.1f} GiB still allocated", file=sys.stderr, flush=True)
        if not _cuda_alive():
            if i + 1 < len(items):
                print(f"# the CUDA context is unusable after '{name}' (sticky error); continuing in a fresh process",
                      flush=True)
                rc = subprocess.run(_child_cmd(args, start=i + 1)).returncode
                if args.start == 0:
                    print(f"# done in {time.time() - t_all:.0f} s", flush=True)
                return rc
            break
    if args.start == 0:
        print(f"# done in {time.time() - t_all:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
