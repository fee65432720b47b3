"""``warpforge``: the command line.

    warpforge bench [OPS ...] [--modes fwd,bwd,fwd+bwd] [--dtype bf16[,fp16,fp32]] [--quick]
                    [--out DIR] [--no-compile] [--no-liger] [--check]
    warpforge info [--refresh]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys


def _split(values: list[str] | None) -> list[str]:
    """``--x a,b --x c`` -> [a, b, c]."""
    out: list[str] = []
    for v in values or []:
        out += [p.strip() for p in v.split(",") if p.strip()]
    return list(dict.fromkeys(out))


def build_parser() -> argparse.ArgumentParser:
    from .bench.workloads import DTYPES, MODES, WORKLOADS

    p = argparse.ArgumentParser(prog="warpforge", description="Triton kernels for LLM operators: benchmark and facts.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    b = sub.add_parser(
        "bench", help="time every op against its peers (GPU) or check correctness (no GPU)",
        description="Time our kernels and every peer (eager, torch.compile, Liger) over a shape sweep and write "
                    "results.json, results.md and roofline.png. Without a CUDA GPU: a correctness run under the "
                    "Triton interpreter.",
        epilog=f"ops: {', '.join(WORKLOADS)}")
    b.add_argument("ops", nargs="*", metavar="OPS", help="ops to run (default: all)")
    b.add_argument("--modes", action="append", metavar="M[,M]",
                   help=f"comma-separated, from {','.join(MODES)} (default: all)")
    b.add_argument("--dtype", action="append", metavar="D[,D]",
                   help=f"comma-separated, from {','.join(DTYPES)} (default: bf16; the correctness run: fp32,bf16)")
    b.add_argument("--quick", action="store_true", help="trimmed sweep and fewer repetitions (~5 GPU minutes)")
    b.add_argument("--small", action="store_true", help="the decode-like (host-bound) cases only")
    b.add_argument("--match", metavar="REGEX",
                   help="only the cases whose shape label matches (re.search), e.g. 'T256|zipf' (both runs)")
    b.add_argument("--out", metavar="DIR", help="output folder (default: bench-out/<gpu>-<date>/)")
    b.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    b.add_argument("--no-liger", action="store_true", help="skip the Liger-Kernel peer")
    b.add_argument("--check", action="store_true",
                   help="run the correctness sweep instead of timing, even on a GPU")
    b.set_defaults(_parser=b)

    m = sub.add_parser("report", help="merge the results.json of several bench runs into one report "
                                      "(e.g. a sweep split over several GPU calls)")
    m.add_argument("inputs", nargs="+", metavar="DIR", help="folders holding results.json")
    m.add_argument("--out", metavar="DIR", required=True, help="output folder")

    i = sub.add_parser("info", help="versions, where kernels run, device facts and measured ceilings")
    i.add_argument("--refresh", action="store_true", help="re-measure the ceilings instead of reading the cache")
    c = sub.add_parser("build-cuda", help="build the CUDA C++ backend now (else it builds on first use)")
    c.add_argument("--verbose", action="store_true", help="show the compiler's output")
    f = sub.add_parser("build-fastpath", help="build the eager fast path now (else it builds on the first eligible call)")
    f.add_argument("--verbose", action="store_true", help="show the compiler's output")
    return p


def _cuda_status() -> str:
    from . import cuda

    why = cuda.unavailable_reason()
    if why is not None:
        return f"unavailable: {why}"
    return f"available (builds on first use, cached in {cuda.cache_dir()}; `warpforge build-cuda` builds now)"


def _build_fastpath(args) -> int:
    import time

    from .runtime import fastpath

    t = time.time()
    if not fastpath.load(verbose=args.verbose):
        print(f"warpforge: the eager fast path is {fastpath.status()}", file=sys.stderr)
        return 1
    print(f"eager fast path built and loaded in {time.time() - t:.1f} s")
    return 0


def _build_cuda(args) -> int:
    import time

    from . import cuda

    t = time.time()
    try:
        cuda.load(verbose=args.verbose)
    except cuda.CudaBackendUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    print(f"CUDA backend built and loaded in {time.time() - t:.1f} s ({cuda.cache_dir()})")
    return 0


def _bench(args, parser) -> int:
    from .bench import bench
    from .bench.workloads import DTYPES, MODES, WORKLOADS

    unknown = [o for o in args.ops if o not in WORKLOADS]
    if unknown:
        parser.error(f"unknown op{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
                     f"(known: {', '.join(WORKLOADS)})")
    modes = _split(args.modes) or list(MODES)
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"unknown mode: {', '.join(bad)} (known: {', '.join(MODES)})")
    dtypes = _split(args.dtype) or None   # bench: bf16; correctness run: fp32 and bf16
    bad = [d for d in dtypes or [] if d not in DTYPES]
    if bad:
        parser.error(f"unknown dtype: {', '.join(bad)} (known: {', '.join(DTYPES)})")
    if args.match is not None:
        try:
            re.compile(args.match)
        except re.error as e:
            parser.error(f"--match: not a regular expression ({e}): {args.match!r}")
    return bench(args.ops or None, modes=modes, dtypes=dtypes, quick=args.quick, out=args.out,
                 use_compile=not args.no_compile, use_liger=not args.no_liger, check=args.check,
                 small_only=args.small, match=args.match)


def _info(args) -> int:
    import torch
    import triton

    import warpforge
    from .runtime import fastpath

    print(f"warpforge {getattr(warpforge, '__version__', '?')}")
    print(f"torch     {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    print(f"triton    {triton.__version__}")
    if not torch.cuda.is_available():
        how = "the Triton interpreter (TRITON_INTERPRET=1): correctness only, not speed"
        if not warpforge.interpreting():
            how = "nowhere: no CUDA device and TRITON_INTERPRET is off"
        print(f"kernels   run under {how}; no CUDA device")
        print(f"cuda C++  {_cuda_status()}")
        print(f"fastpath  {fastpath.status()}")
        return 0
    from .runtime.device import ceilings, device_info
    from .runtime.launch import shared_memory_limit

    d = device_info()
    print(f"kernels   run on the GPU{' (but TRITON_INTERPRET=1 is set: interpreted)' if warpforge.interpreting() else ''}")
    print(f"cuda C++  {_cuda_status()}")
    print(f"fastpath  {fastpath.status()}")
    print(f"device    {d.name}")
    print(f"  SMs                 {d.sm_count}")
    print(f"  L2                  {d.l2_bytes / 2**20:.0f} MiB")
    print(f"  compute capability  {d.capability[0]}.{d.capability[1]}")
    print(f"  memory              {d.memory_bytes / 2**30:.1f} GiB")
    hopper = d.capability[0] == 9
    print(f"  shared memory       {shared_memory_limit() // 1024} KB a block"
          + ("" if hopper else " (tiles chosen for Hopper's 227 KB step down where they do not fit)"))
    print(f"  Hopper kernels      {'on' if hopper else 'off (sm_90 only): the Triton kernels take every call'}"
          " (Gluon attention and decode, TMA matmul and MoE, cluster row ops)")
    started = _dt.datetime.now().astimezone()
    c = ceilings(refresh=args.refresh)
    source = "measured just now"
    try:
        when = _dt.datetime.strptime(c.get("measured_at", ""), "%Y-%m-%dT%H:%M:%S%z")
        if when < started - _dt.timedelta(seconds=1):
            source = f"from the cache (measured {c['measured_at']}; --refresh re-measures)"
    except ValueError:
        source = "from the cache"
    print(f"ceilings  {source}")
    print(f"  copy (read + write) {c['copy_gbps']:,.0f} GB/s")
    print(f"  cuBLAS bf16 GEMM    {c['bf16_tflops']:,.0f} TFLOP/s")
    print(f"  cuBLAS fp16 GEMM    {c['fp16_tflops']:,.0f} TFLOP/s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        return _bench(args, args._parser)
    if args.command == "report":
        from .bench import merge

        return merge(args.inputs, args.out)
    if args.command == "build-cuda":
        return _build_cuda(args)
    if args.command == "build-fastpath":
        return _build_fastpath(args)
    return _info(args)


if __name__ == "__main__":
    sys.exit(main())
