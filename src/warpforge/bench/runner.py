"""The benchmark runner: timing, peers and modes, once for every workload.

Two entry points:

- :func:`run_bench` (CUDA): for each op, dtype and shape, makes the inputs once, then for each mode
  times every implementation -- ours (``warpforge``, named variants, and on decode shapes the
  dispatcher door ``warpforge[dispatch]``), the peers (``eager``, ``compile``, ``liger``) and the
  workload's references (kind "ref": yardsticks such as the cuBLAS GEMMs an op must do, never a
  peer; every other row gets ``vs_ref``, its time over theirs). A workload's named peers (``peers``,
  e.g. ``sdpa[cudnn]``) are peers like the others; with them every other row gets ``vs_peers``,
  {peer: peer ms / its ms} over every peer that ran (> 1: faster), and ``compile_peer=False`` drops
  the compile row. A failing implementation becomes a row marked "failed: <reason>" (one that
  declines a case on purpose, raising ``Skipped``: "skipped: <reason>"); nothing stops the run (an
  out-of-memory frees what it can first).
  Workloads with ``measure_memory`` record each row's extra peak memory (``extra_gib``); one with
  ``liger_writes_inputs`` runs Liger on a private copy of the inputs.
- :func:`run_check` (any device, the CPU one under the Triton interpreter): every op forward and
  backward on small odd shapes against a float64 reference; relative error, pass/fail, wall time.

Modes. ``fwd``: the forward alone, inputs without ``requires_grad``. ``bwd``: the backward alone, on
a graph built once outside the timing (``torch.autograd.grad(out, inputs, dy, retain_graph=True)``).
``fwd+bwd``: both, a fresh graph per call. The upstream gradient dy is random, but 1 for a scalar
output (a loss: what ``loss.backward()`` passes; see :func:`upstream_grad`).
"""
from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from . import timing
from .workloads import DTYPE_NAMES, Case, OpUnavailable, Peer, Skipped, Workload

PEERS = ("eager", "compile", "liger")

# |out - ref| / |ref| against float64, by dtype (as in tests/conftest.py); backward gets 2x.
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
BWD_TOL_SCALE = 2.0


# ----------------------------------------------------------------------------------------------
# Helpers shared by both runs
# ----------------------------------------------------------------------------------------------
def tensors(out) -> list[torch.Tensor]:
    """The tensor outputs of a call, in order (an op may return one tensor or a tuple)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [o for o in out if isinstance(o, torch.Tensor)]


def with_grad(args: tuple, grad_args: tuple[int, ...]) -> tuple:
    """Fresh leaves (sharing storage) with ``requires_grad`` on the differentiable arguments."""
    return tuple(a.detach().requires_grad_() if i in grad_args else a for i, a in enumerate(args))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 over the finite values of ref; inf on a shape mismatch, on
    NaN/inf where ref is finite, and on a non-finite value other than ref's there (NaN for -inf, +inf
    for -inf, a finite value for either)."""
    if out is None or ref is None:
        return 0.0 if out is None and ref is None else float("inf")
    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(r)
    if not torch.equal(torch.isfinite(o), finite):
        return float("inf")
    if not torch.equal(o[~finite].nan_to_num(nan=0.0), r[~finite].nan_to_num(nan=0.0)):   # NaN, +inf, -inf alike
        return float("inf")
    o, r = o[finite], r[finite]
    den = r.norm().item()
    num = (o - r).norm().item()
    return num / den if den > 0 else num


def failure(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"failed: {type(e).__name__}: {msg[:160]}".rstrip(": ")


@contextlib.contextmanager
def dispatcher_door(on: bool):
    """Send eager calls through the torch.library dispatcher while ``on`` (restored after)."""
    from ..runtime import registry

    saved = registry.FAST_EAGER
    if on:
        registry.FAST_EAGER = False
    try:
        yield
    finally:
        registry.FAST_EAGER = saved


class NullProgress:
    """The progress interface the runner reports to (report.py has a rich one)."""

    def start(self, total: int) -> None: ...
    def advance(self, what: str) -> None: ...
    def stop(self) -> None: ...
    def log(self, msg: str) -> None:
        print(msg, flush=True)


# ----------------------------------------------------------------------------------------------
# GPU benchmark
# ----------------------------------------------------------------------------------------------
@dataclass
class Impl:
    name: str
    kind: str                 # "ours" | "peer" | "ref"
    fn: Callable              # ours, peer: the op on the workload's args; ref: (mode, args) -> the step
    dispatch: bool = False    # time through the dispatcher door
    private_inputs: bool = False   # it writes into its inputs: give it its own copy (made before its
                                   # row in each mode, outside the timing; dropped after)
    context: Callable[[], object] | None = None   # a context manager entered around the whole
                                                  # measurement (a named Peer's set-up)


@dataclass
class BenchResult:
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)      # skipped ops, absent peers


def _step(fn: Callable, mode: str, base: tuple, grad_args: tuple[int, ...]) -> Callable[[], object]:
    """The zero-argument callable that ``mode`` times."""
    if mode == "fwd":
        return lambda: fn(*base)
    args = with_grad(base, grad_args)
    inputs = [args[i] for i in grad_args]
    outs = [o for o in tensors(fn(*args)) if o.requires_grad]
    if not outs:
        raise RuntimeError("output does not require grad (no autograd formula)")
    dys = [upstream_grad(o) for o in outs]
    if mode == "bwd":
        return lambda: torch.autograd.grad(outs, inputs, dys, retain_graph=True, allow_unused=True)
    del outs   # fwd+bwd builds its own graph each call

    def fwd_bwd():
        o = [t for t in tensors(fn(*args)) if t.requires_grad]
        return torch.autograd.grad(o, inputs, dys, allow_unused=True)
    return fwd_bwd


def private_copy(args: tuple) -> tuple:
    """A copy of every tensor argument (for an implementation that writes into its inputs)."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def free_memory() -> None:
    """Give cached device memory back after a failure (an out-of-memory above all), so the next
    implementation starts from the inputs alone."""
    gc.collect()
    with contextlib.suppress(Exception):
        torch.cuda.synchronize()
    with contextlib.suppress(Exception):
        torch.cuda.empty_cache()


def upstream_grad(out: torch.Tensor) -> torch.Tensor:
    """The dy a timed backward gets: random, except 1 for a scalar output -- a loss, whose
    ``loss.backward()`` passes exactly 1, and the fused-gradient losses (ours, Liger's) skip their
    rescaling pass over the gradient exactly then; a random scalar would time a pass no training
    step makes. (The correctness run keeps a random one: it checks that scaling.)"""
    return torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)


def attainable_tflops(flops: int, nbytes: int, copy_gbps: float | None, flat_tflops: float | None) -> float | None:
    """The roofline's height at this op's arithmetic intensity: min(copy bandwidth x FLOP/byte,
    the measured GEMM rate). Without a GEMM rate (fp32) only the memory roof applies."""
    if not copy_gbps or not nbytes:
        return None
    mem = copy_gbps * (flops / nbytes) / 1e3
    return min(mem, flat_tflops) if flat_tflops else mem


def _measure(wl: Workload, case: Case, dtype: torch.dtype, mode: str, impl: Impl, base: tuple,
             cfg: timing.TimingConfig, copy_gbps: float | None, flat_tflops: float | None = None) -> dict:
    s = torch.empty((), dtype=dtype).element_size()
    nbytes, nflops = wl.bytes(case, mode, s), wl.flops(case, mode)
    row = {
        "op": wl.name, "mode": mode, "dtype": DTYPE_NAMES[dtype], "shape": case.label, "dims": dict(case.dims),
        "small": case.small, "headline": case.headline, "impl": impl.name, "kind": impl.kind,
        "status": "ok", "ms": None, "host_us": None, "bytes": nbytes, "flops": nflops,
        "timing": None, "gbps": None, "tflops": None, "pct_copy": None, "pct_roof": None, "best_peer": None, "best_peer_ms": None, "ratio": None,
        "err_vs_eager": None,
    }
    if wl.references:
        row["vs_ref"] = None
    if wl.measure_memory:
        row["extra_gib"] = None
    if wl.peers is not None:
        row["vs_peers"] = None
    failed = False
    step = args = None
    try:
        args = private_copy(base) if impl.private_inputs else base
        with _impl_context(impl):
            step = _impl_step(wl, mode, impl, args)
            timing.warm(step, cfg.warm_calls)
            ms = timing.device_ms(step, cfg, nbytes)
            row["timing"] = timing.method(nbytes)
            if wl.measure_memory:
                row["extra_gib"] = timing.extra_gib(step)
            step = None   # its graph and outputs go before the check below
            if impl.kind == "ours" and mode == "fwd" and not wl.stochastic:   # (eager's own dropout mask: no check)
                row["err_vs_eager"] = _err_vs_eager(wl, impl, args)
        _set_ms(row, ms, copy_gbps, flat_tflops)
    except Skipped as e:   # declined on purpose, before allocating anything
        row["status"] = f"skipped: {e}"
    except Exception as e:  # noqa: BLE001 -- any failure of one implementation is a row, not a crash
        row["status"] = failure(e)
        failed = True
    if failed:
        # out of the except block: the traceback (and the tensors its frames hold) is gone now
        del step, args
        free_memory()
    return row


def _set_ms(row: dict, ms: float, copy_gbps: float | None, flat_tflops: float | None) -> None:
    """A row's time and what follows from it (rate, % of the copy roof and of the attainable roof)."""
    nbytes, nflops = row["bytes"], row["flops"]
    row["ms"] = ms
    row["gbps"] = nbytes / ms / 1e6
    row["tflops"] = nflops / ms / 1e9
    if copy_gbps:
        row["pct_copy"] = 100.0 * row["gbps"] / copy_gbps
        roof = attainable_tflops(nflops, nbytes, copy_gbps, flat_tflops)
        row["pct_roof"] = 100.0 * row["tflops"] / roof if roof else None


def _case_rounds(wl: Workload, case: Case, cfg: timing.TimingConfig) -> tuple[int, timing.TimingConfig]:
    """How many device-timing rounds a case gets, and the timing config of each round: the
    workload's ``device_rounds``, and for a small case at least ``cfg.small_rounds`` rounds that
    share one measurement's budget of calls between them (timing.py: a few-microsecond call's
    median moves by ~1 us from one measurement to the next)."""
    if not case.small or cfg.small_rounds <= 1:
        return wl.device_rounds, cfg
    rounds = max(wl.device_rounds, cfg.small_rounds)
    return rounds, replace(cfg, rep_ms=cfg.rep_ms / rounds, clean_calls=max(10, cfg.clean_calls // rounds))


def _device_rounds(wl: Workload, mode: str, impls: list[Impl], group: list[dict], base: tuple,
                   cfg: timing.TimingConfig, copy_gbps: float | None, flat_tflops: float | None,
                   rounds: int) -> None:
    """``rounds - 1`` more rounds of device timing after :func:`_measure`'s, each timing every
    implementation of the case once in turn; each row keeps its least time and records all of them
    (``ms_rounds``). Why: a large GEMM holds the H100 at its 700 W power cap from its first
    second, and the clock under the cap wanders (cuBLAS at 8192^3 timed 1.39, 1.46 and 1.58 ms in
    three consecutive measurements; benchmarks/NOTES.md), so two implementations timed once each,
    one after the other, compare two moments of the clock as much as two kernels; and a small
    case's few-microsecond call reads ~1 us apart between measurements (:func:`_case_rounds`)."""
    if rounds <= 1:
        return
    pairs = [(impl, row) for impl, row in zip(impls, group) if row["status"] == "ok" and row["ms"] is not None
             # a ladder rung: its place on the ladder does not hang on 5%
             and (wl.rounds_for_variants or impl.kind != "ours" or impl.name == "warpforge")]
    try:
        timed = _alternating(wl, mode, pairs, base, rounds - 1,
                             lambda step, row: timing.device_ms(step, cfg, row["bytes"]))
    except Exception as e:  # noqa: BLE001 -- a failure here leaves the first round's times standing
        for row in group:
            if row.get("ms") is not None:
                row["rounds_error"] = failure(e)
        return
    for row, times in timed:
        row["ms_rounds"] = [row["ms"], *times]
        _set_ms(row, min(row["ms_rounds"]), copy_gbps, flat_tflops)


def _alternating(wl: Workload, mode: str, pairs: list[tuple[Impl, dict]], base: tuple, rounds: int,
                 timer: Callable[[Callable, dict], float], warm_calls: int = 0) -> list[tuple[dict, list[float]]]:
    """``rounds`` rounds over the (implementation, row) pairs, each round timing every pair's step
    once in turn with ``timer(step, row)``, inside the implementation's context; returns each row
    with its times. Exceptions propagate; the steps (and what they hold) are freed either way."""
    steps: list[tuple[dict, Impl, Callable, list]] = []
    try:
        for impl, row in pairs:
            args = private_copy(base) if impl.private_inputs else base
            with _impl_context(impl):
                step = _impl_step(wl, mode, impl, args)
                if warm_calls:
                    timing.warm(step, warm_calls)
            steps.append((row, impl, step, []))
        for _ in range(rounds):
            for row, impl, step, times in steps:
                with _impl_context(impl):
                    times.append(timer(step, row))
        return [(row, times) for row, _, _, times in steps]
    finally:
        steps.clear()
        free_memory()


def _impl_step(wl: Workload, mode: str, impl: Impl, args: tuple) -> Callable[[], object]:
    """The zero-argument callable timed for ``impl`` in ``mode`` (a reference builds its own)."""
    return impl.fn(mode, args) if impl.kind == "ref" else _step(impl.fn, mode, args, wl.grad_args)


def _impl_context(impl: Impl) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(dispatcher_door(impl.dispatch))
    if impl.context:
        stack.enter_context(impl.context())
    return stack


def _host_times(wl: Workload, mode: str, impls: list[Impl], group: list[dict], base: tuple,
                cfg: timing.TimingConfig) -> None:
    """``host_us`` of a small case's implementations, timed in alternation: round r times every
    implementation once (``cfg.host_calls`` back-to-back calls), and each keeps its least round.
    The host's speed drifts over seconds; timed one after another, two implementations could land
    in different spells of it (single loops varied +-30% from run to run on the lent H100's host),
    while alternating rounds give each the same spells to pick its minimum from."""
    pairs = [(impl, row) for impl, row in zip(impls, group) if row["status"] == "ok"]
    try:
        timed = _alternating(wl, mode, pairs, base, cfg.host_rounds,
                             lambda step, row: timing.host_us(step, cfg.host_calls), warm_calls=1)
    except Exception:  # noqa: BLE001 -- a failure here costs the host column, never the rows
        for row in group:
            row["host_us"] = None
        return
    for row, times in timed:
        row["host_us"] = min(times)


def _err_vs_eager(wl: Workload, impl: Impl, args: tuple) -> float | None:
    """Relative difference of our forward from eager's on the timed inputs. None where eager runs
    out of memory (it may need several times the inputs: an fp32 upcast of (T, V) logits, say):
    that costs the check, never our row."""
    ours = ref = None
    try:
        with torch.no_grad():
            ours = tensors(impl.fn(*args))
            ref = tensors(wl.eager(*args))
            return max((rel_err(o, r) for o, r in zip(ours, ref)), default=None)
    except Exception as e:
        if not is_oom(e):
            raise
    ours = ref = None
    free_memory()
    return None


def _fill_ratios(rows: list[dict]) -> None:
    """Best peer (fastest of eager/compile/liger and the named peers) of one (op, mode, dtype, shape)
    group, and every row's ratio best_peer_ms / ms (> 1: that row beats the best peer). References
    (kind "ref") are never a peer; every other row gets ``vs_ref``: {reference: ms / reference ms}
    (< 1: faster). Where the workload has named peers (rows carry ``vs_peers``), every ok row that is
    not a peer gets ``vs_peers``: {peer: peer ms / ms} over every peer that ran (> 1: faster)."""
    refs = [r for r in rows if r["kind"] == "ref" and r["status"] == "ok"]
    for r in rows:
        if refs and r["kind"] != "ref" and r["status"] == "ok":
            r["vs_ref"] = {f["impl"]: r["ms"] / f["ms"] for f in refs}
    peers = [r for r in rows if r["kind"] == "peer" and r["status"] == "ok"]
    for r in rows:
        if peers and "vs_peers" in r and r["kind"] != "peer" and r["status"] == "ok":
            r["vs_peers"] = {p["impl"]: p["ms"] / r["ms"] for p in peers}
    if not peers:
        return
    best = min(peers, key=lambda r: r["ms"])
    for r in rows:
        if r["kind"] == "ref":
            continue
        r["best_peer"], r["best_peer_ms"] = best["impl"], best["ms"]
        if r["status"] == "ok":
            r["ratio"] = best["ms"] / r["ms"]


def select_cases(wl: Workload, *, check: bool = False, quick: bool = False, small_only: bool = False,
                 match: str | None = None) -> list[Case]:
    """The cases a run takes of ``wl``: its correctness cases (``check``) or its timing sweep (the
    decode-like ones alone with ``small_only``), those whose label ``match`` finds (re.search)."""
    cases = wl.check_cases() if check else [c for c in wl.cases(quick) if c.small or not small_only]
    return [c for c in cases if match is None or re.search(match, c.label)]


def run_bench(workloads: list[Workload], modes: list[str], dtypes: list[torch.dtype], *, quick: bool = False,
              use_compile: bool = True, use_liger: bool = True, copy_gbps: float | None = None,
              gemm_tflops: dict | None = None, progress=None, device: str = "cuda",
              small_only: bool = False, match: str | None = None) -> BenchResult:
    """Time every implementation of every workload on the current CUDA device. ``gemm_tflops``:
    measured GEMM rate by dtype (the roofline's flat part). (``device`` exists for the tests, which
    run this on the CPU with the timers replaced.) ``small_only``: the decode-like cases alone;
    ``match``: only the cases whose label this regular expression finds (re.search)."""
    progress = progress or NullProgress()
    cfg = timing.TimingConfig.quick() if quick else timing.TimingConfig()
    device = torch.device(device)
    result = BenchResult()

    # What runs: our implementations (op skipped when not importable) and which peers are present.
    plan = []
    absent: dict[str, list[str]] = {}   # "why" -> ops
    for wl in workloads:
        try:
            ours = wl.ours()
        except OpUnavailable as e:
            result.notes.append(f"{wl.name}: not available ({e}); skipped")
            continue
        liger = None
        if not use_liger:
            absent.setdefault("liger: disabled by --no-liger", []).append(wl.name)
        elif wl.liger is None:
            absent.setdefault("liger: no kernel for this op", []).append(wl.name)
        else:
            try:
                liger = wl.liger_fn()
            except Exception as e:  # noqa: BLE001
                absent.setdefault(f"liger: not importable ({type(e).__name__}: {e})", []).append(wl.name)
        if not use_compile:
            absent.setdefault("compile: disabled by --no-compile", []).append(wl.name)
        elif not wl.compile_peer:
            absent.setdefault("compile: not a peer of this op (compile_peer=False; see the op's note)",
                              []).append(wl.name)
        named: dict[str, Peer | Callable] = {}
        if wl.peers is not None:
            try:
                named = wl.peers()
            except Exception as e:  # noqa: BLE001
                absent.setdefault(f"named peers: not available ({type(e).__name__}: {e})", []).append(wl.name)
        wl_modes = [m for m in modes if m in wl.modes]
        if not wl_modes:
            result.notes.append(f"{wl.name}: none of the modes {','.join(modes)} applies ({wl.notes}); skipped")
            continue
        if len(wl_modes) < len(modes) or wl.peers is not None:   # named peers: the note says what they are
            result.notes.append(f"{wl.name}: {wl.notes}")
        if wl.device_rounds > 1:
            result.notes.append(f"{wl.name}: device times are the least of {wl.device_rounds} rounds alternating "
                                "over the implementations (each row's ms_rounds lists them)"
                                + ("" if wl.rounds_for_variants else "; the named variants' rows are timed once"))
        plan.append((wl, ours, liger, wl_modes, named))

    def cases(wl):
        return select_cases(wl, quick=quick, small_only=small_only, match=match)

    if match is not None:
        result.notes.append(f"cases matching {match!r} only")
    small_ops = [wl.name for wl, *_ in plan if any(c.small for c in cases(wl))]
    if small_ops and cfg.small_rounds > 1:
        result.notes.append(f"decode-like (small) cases: device times are the least of {cfg.small_rounds} or more "
                            "rounds alternating over the implementations, at most "
                            f"{cfg.clean_calls // cfg.small_rounds} clean calls a round (one measurement's calls "
                            "shared out; a few-microsecond call's "
                            "median moves ~1 us between measurements; each row's ms_rounds lists them): "
                            + ", ".join(small_ops))
    for why, ops in absent.items():
        result.notes.append(f"peer absent -- {why}: {', '.join(ops)}")
    if quick and use_compile:
        result.notes.append("quick: the compile peer runs on the large shapes only (each shape costs seconds "
                            "of compilation); on decode shapes the best peer is eager or liger")
    for note in result.notes:
        progress.log(note)

    if use_compile:
        import torch._dynamo as dynamo   # binds only `dynamo`: `torch` stays the module global
        dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 64)

    total = sum(len(cases(wl)) * len(wl.dtypes_of(dtypes)) for wl, *_ in plan)
    progress.start(total)
    try:
        for wl, ours, liger, wl_modes, named in plan:
            for dtype in wl.dtypes_of(dtypes):
                for case in cases(wl):
                    progress.advance(f"{wl.name} {DTYPE_NAMES[dtype]} {case.label}")
                    result.rows.extend(_bench_case(wl, case, dtype, device, ours, liger, wl_modes,
                                                   use_compile and wl.compile_peer and not (quick and case.small),
                                                   cfg, copy_gbps, (gemm_tflops or {}).get(dtype), named))
            gc.collect()
            torch.cuda.empty_cache()
    finally:
        progress.stop()
    return result


def _bench_case(wl, case, dtype, device, ours, liger, modes, use_compile, cfg, copy_gbps, flat=None,
                named=None) -> list[dict]:
    rows: list[dict] = []
    try:
        base = wl.make(case, dtype, device)
    except Exception as e:  # noqa: BLE001 -- e.g. out of memory for this dtype
        rows = [{"op": wl.name, "mode": m, "dtype": DTYPE_NAMES[dtype], "shape": case.label, "dims": dict(case.dims),
                 "small": case.small, "headline": case.headline, "impl": "inputs", "kind": "inputs",
                 "status": failure(e)} for m in modes]
    if rows:
        free_memory()   # what the inputs made before failing
        return rows
    impls = [Impl(name, "ours", fn) for name, fn in ours.items() if name == "warpforge" or wl.variants_on(case)]
    if case.small and "warpforge" in ours:
        impls.append(Impl("warpforge[dispatch]", "ours", ours["warpforge"], dispatch=True))
    impls.append(Impl("eager", "peer", wl.eager))
    if use_compile:
        torch._dynamo.reset()   # one compiled graph per shape; never hit the recompile limit
        impls.append(Impl("compile", "peer", torch.compile(wl.eager, dynamic=False)))
    if liger is not None:
        impls.append(Impl("liger", "peer", liger, private_inputs=wl.liger_writes_inputs))
    for name, p in (named or {}).items():
        impls.append(Impl(name, "peer", p.fn, context=p.context) if isinstance(p, Peer) else Impl(name, "peer", p))
    refs = {ref.name: ref for ref in wl.references}
    impls += [Impl(name, "ref", ref.step) for name, ref in refs.items()]
    rounds, case_cfg = _case_rounds(wl, case, cfg)
    for mode in modes:
        timed = [impl for impl in impls if impl.kind != "ref" or refs[impl.name].applies(mode)]
        group = [_measure(wl, case, dtype, mode, impl, base, case_cfg, copy_gbps, flat) for impl in timed]
        _device_rounds(wl, mode, timed, group, base, case_cfg, copy_gbps, flat, rounds)
        if case.small:
            _host_times(wl, mode, timed, group, base, cfg)
        _fill_ratios(group)
        rows.extend(group)
    del base, impls
    gc.collect()
    torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------------------------
# Correctness run (the CPU path: the Triton interpreter)
# ----------------------------------------------------------------------------------------------
def _float64(args: tuple, grad_args: tuple[int, ...], grad: bool) -> tuple:
    out = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a = a.detach().double()
            if grad and i in grad_args:
                a.requires_grad_()
        out.append(a)
    return tuple(out)


def run_check(workloads: list[Workload], dtypes: list[torch.dtype], *, device: str | torch.device = "cpu",
              progress=None, match: str | None = None) -> BenchResult:
    """Every op, forward and backward, on small odd shapes, against a float64 reference (the cases
    whose label ``match`` finds, if given)."""
    progress = progress or NullProgress()
    result = BenchResult()
    plan = []
    for wl in workloads:
        try:
            plan.append((wl, wl.ours()))
        except OpUnavailable as e:
            result.notes.append(f"{wl.name}: not available ({e}); skipped")
    for note in result.notes:
        progress.log(note)

    def cases(wl):
        return select_cases(wl, check=True, match=match)

    progress.start(sum(len(cases(wl)) * len(wl.dtypes_of(dtypes)) for wl, _ in plan))
    try:
        for wl, ours in plan:
            for dtype in wl.dtypes_of(dtypes):
                for case in cases(wl):
                    progress.advance(f"{wl.name} {DTYPE_NAMES[dtype]} {case.label}")
                    for name, fn in ours.items():
                        result.rows.extend(_check_case(wl, case, dtype, torch.device(device), name, fn))
    finally:
        progress.stop()
    return result


def _check_case(wl: Workload, case: Case, dtype: torch.dtype, device, name: str, fn: Callable) -> list[dict]:
    tol = TOL[dtype]

    def row(direction, **kw):
        r = {"op": wl.name, "dtype": DTYPE_NAMES[dtype], "shape": case.label, "dims": dict(case.dims),
             "impl": name, "direction": direction, "rel_err": None, "tol": None, "ok": False,
             "status": "ok", "wall_ms": None}
        r.update(kw)
        return r

    def verdict(direction, outs, refs, tol, ms):
        err = max(rel_err(o, r) for o, r in zip(outs, refs))
        return row(direction, rel_err=err, tol=tol, ok=err <= tol, wall_ms=ms,
                   status="ok" if err <= tol else "failed: error above tolerance")

    rows = []
    try:
        base = wl.make(case, dtype, device)
    except Exception as e:  # noqa: BLE001
        return [row("fwd", status=failure(e))]

    # forward
    try:
        out, ms = timing.wall_ms(lambda: fn(*base))
        ref = wl.ref(*_float64(base, wl.grad_args, grad=False))
        outs, refs = tensors(out), tensors(ref)
        if len(outs) != len(refs):
            raise RuntimeError(f"{len(outs)} outputs, reference has {len(refs)}")
        rows.append(verdict("fwd", outs, refs, tol, ms))
    except Skipped as e:   # an implementation that declines the device (a CUDA graph on the CPU)
        rows.append(row("fwd", ok=True, status=f"skipped: {e}"))
        return rows
    except Exception as e:  # noqa: BLE001
        rows.append(row("fwd", status=failure(e)))
        return rows

    # backward
    try:
        args = with_grad(base, wl.grad_args)
        outs = tensors(fn(*args))
        if not all(o.requires_grad for o in outs):
            rows.append(row("bwd", ok=True, status="skipped: output does not require grad"))
            return rows
        dys = [torch.randn_like(o) for o in outs]
        inputs = [args[i] for i in wl.grad_args]
        grads, ms = timing.wall_ms(lambda: torch.autograd.grad(outs, inputs, dys, allow_unused=True))
        rargs = _float64(base, wl.grad_args, grad=True)
        routs = [o for o in tensors(wl.ref(*rargs))]
        rgrads = torch.autograd.grad(routs, [rargs[i] for i in wl.grad_args], [d.double() for d in dys],
                                     allow_unused=True)
        rows.append(verdict("bwd", grads, rgrads, tol * BWD_TOL_SCALE, ms))
    except Exception as e:  # noqa: BLE001
        rows.append(row("bwd", status=failure(e)))
    return rows
