"""The benchmark lab on a CPU: byte models, the workload registry, the correctness run end to end,
the GPU runner's plumbing with the timers replaced (nothing is timed), and report writing."""
from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE

from warpforge import bench as wbench
from warpforge.bench import report, runner, timing, workloads as W

EXPECTED_OPS = {"add", "sum", "amax", "softmax", "log_softmax", "layer_norm", "rms_norm", "add_rms_norm",
                "swiglu", "geglu", "rope", "matmul", "matmul_bwd", "linear_gelu", "fp8_matmul", "cross_entropy",
                "linear_cross_entropy", "attention", "attention_dropout", "attention_softcap", "decode_attention",
                "decode_attention_fp8", "decode_attention_window", "moe", "moe_decode"}


def _case(name: str, label: str) -> W.Case:
    return next(c for c in W.WORKLOADS[name].cases(False) if c.label == label)


# ---------------------------------------------------------------------------------------------- models
def test_registry_is_complete():
    assert set(W.WORKLOADS) == EXPECTED_OPS
    for wl in W.WORKLOADS.values():
        assert wl.cases(False) and wl.cases(True) and wl.check_cases()
        assert sum(c.headline for c in wl.cases(False)) == 1, wl.name
        assert sum(c.headline for c in wl.cases(True)) == 1, wl.name
        assert set(wl.modes) <= set(W.MODES)


def test_row_sweep_fills_the_chip():
    full = W.row_cases(False)
    big = [c for c in full if not c.small]
    assert [c.dims["N"] for c in big] == [1024, 4096, 8192, 32768, 65536, 262144]
    assert all(c.dims["M"] * c.dims["N"] == 2**27 for c in big)
    assert [c.dims["M"] for c in full if c.small] == [1, 8, 64]
    assert len(W.row_cases(True)) < len(full)


def test_byte_models_exact():
    M, N = 32768, 4096
    c = _case("softmax", f"{M}x{N}")
    sm = W.WORKLOADS["softmax"]
    assert sm.bytes(c, "fwd", 2) == 2 * M * N * 2
    assert sm.bytes(c, "bwd", 2) == 3 * M * N * 2
    assert sm.bytes(c, "fwd+bwd", 2) == 5 * M * N * 2
    rms = W.WORKLOADS["rms_norm"]
    assert rms.bytes(c, "fwd", 2) == 2 * M * N * 2 + N * 2
    assert rms.bytes(c, "fwd+bwd", 2) == 5 * M * N * 2 + 3 * N * 2
    ln = W.WORKLOADS["layer_norm"]
    assert ln.bytes(c, "fwd", 4) == 2 * M * N * 4 + 2 * N * 4
    # the backward reads x, dy and w (never b) and writes dx, dw and db
    assert ln.bytes(c, "bwd", 2) == 3 * M * N * 2 + 3 * N * 2
    assert ln.bytes(c, "fwd+bwd", 2) == 5 * M * N * 2 + 5 * N * 2
    assert W.WORKLOADS["add"].bytes(_case("add", "n=2^28"), "fwd", 2) == 3 * 2**28 * 2
    assert W.WORKLOADS["sum"].bytes(c, "fwd", 2) == M * N * 2 + M * 2
    assert W.WORKLOADS["amax"].bytes(c, "fwd", 4) == M * N * 4 + M * 4
    g = _case("swiglu", "16384x14336")
    assert W.WORKLOADS["swiglu"].bytes(g, "fwd", 2) == 3 * 16384 * 14336 * 2
    assert W.WORKLOADS["swiglu"].bytes(g, "fwd+bwd", 2) == 8 * 16384 * 14336 * 2
    r = next(c for c in W.WORKLOADS["rope"].cases(False) if c.headline)
    qk = 4 * 32 * 4096 * 128 + 4 * 8 * 4096 * 128
    assert W.WORKLOADS["rope"].bytes(r, "fwd", 2) == 2 * qk * 2
    assert W.WORKLOADS["rope"].bytes(r, "bwd", 2) == 2 * qk * 2
    assert W.WORKLOADS["rope"].bytes(r, "fwd+bwd", 2) == 4 * qk * 2
    for wl in W.WORKLOADS.values():   # every FLOP model is positive (it places roofline points)
        assert all(wl.flops(c, m) > 0 for c in wl.cases(True) for m in wl.modes)


def test_cross_entropy_workloads():
    ce, lce = W.WORKLOADS["cross_entropy"], W.WORKLOADS["linear_cross_entropy"]
    T, V, H = 8192, 128256, 4096
    assert [c.label for c in ce.cases(False) if c.headline] == [f"{T}x{V}"]
    assert len(ce.cases(False)) == 9 and {c.label for c in ce.cases(True)} == {f"{T}x{V}", "4096x32000"}
    assert [c.dims for c in lce.cases(True)] == [{"T": T, "V": V, "H": H}] and len(lce.cases(False)) == 9
    c, lc = _case("cross_entropy", f"{T}x{V}"), next(c for c in lce.cases(False) if c.headline)
    assert ce.bytes(c, "fwd", 2) == T * V * 2 + 8 * T
    assert ce.bytes(c, "fwd+bwd", 2) == 2 * T * V * 2 + 8 * T      # PERF.md's floor: read logits, write dlogits
    assert lce.bytes(lc, "fwd+bwd", 2) == 2 * (T * H + V * H) * 2 + 8 * T
    assert lce.flops(lc, "fwd") == 2 * T * V * H and lce.flops(lc, "fwd+bwd") == 6 * T * V * H
    for wl in (ce, lce):   # one graph, one backward: the gradient is formed in the forward
        assert wl.modes == ("fwd", "fwd+bwd") and "retain_graph" in wl.notes and wl.measure_memory
    assert ce.liger_writes_inputs and not lce.liger_writes_inputs
    assert [r.name for r in lce.references] == ["cublas_gemms"] and not ce.references
    h, w, t = lce.make(W.Case("5x7 H=3", {"T": 5, "V": 7, "H": 3}), torch.float32, "cpu")
    assert t.dtype == torch.int64 and 0 <= t.min() and t.max() < 7
    assert W._cublas_gemms("fwd", (h, w, t))().shape == (5, 7)
    assert [tuple(o.shape) for o in W._cublas_gemms("fwd+bwd", (h, w, t))()] == [(5, 7), (5, 3), (7, 3)]


def test_unknown_op_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown op: nope.*known: add, sum"):
        W.get(["softmax", "nope"])
    assert [w.name for w in W.get(["rms_norm", "softmax", "rms_norm"])] == ["rms_norm", "softmax"]


def test_inputs_are_random_never_zero():
    for wl in W.WORKLOADS.values():
        args = wl.make(wl.check_cases()[0], torch.float32, "cpu")
        for i in wl.grad_args:   # the data (rope's cos/sin tables are tables, not data)
            a = args[i]
            assert a.std() > 0 and (a != 0).float().mean() > 0.99, wl.name


# ---------------------------------------------------------------------------------------------- CPU correctness run
def test_check_run_softmax_end_to_end(monkeypatch, capsys, tmp_path):
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "check_cases", lambda: [W.Case("2x37", {"M": 2, "N": 37})])
    monkeypatch.setattr(W, "cuda_backend_available", lambda: False)   # a GPU would add its rows
    rc = wbench.bench(["softmax"], dtypes=["fp32"], out=tmp_path, check=True)
    out = capsys.readouterr().out
    assert rc == 0
    if torch.cuda.is_available():
        assert "Correctness run on the GPU" in out
    else:
        assert out.count(report.BANNER_CPU) == 2, "banner before and after the table"
    data = json.loads((tmp_path / "correctness.json").read_text())
    rows = data["rows"]
    assert [(r["direction"], r["ok"]) for r in rows] == [("fwd", True), ("bwd", True)]
    assert rows[0]["rel_err"] < 2e-5 and rows[0]["wall_ms"] > 0
    assert (tmp_path / "correctness.md").exists()


def test_check_run_cross_entropy_workloads(monkeypatch):
    """The workloads' inputs, our calls and the float64 references wired up (bf16: eager's upcast
    is not the reference; the targets stay int64), forward and backward."""
    wls = [W.WORKLOADS["cross_entropy"], W.WORKLOADS["linear_cross_entropy"]]
    def first_of(wl):
        first = wl.check_cases()[0]
        return lambda: [first]

    for wl in wls:
        monkeypatch.setattr(wl, "check_cases", first_of(wl))
    res = runner.run_check(wls, [torch.bfloat16], device="cuda" if torch.cuda.is_available() else "cpu")
    assert [(r["op"], r["direction"], r["status"]) for r in res.rows] == [
        (op, d, "ok") for op in ("cross_entropy", "linear_cross_entropy") for d in ("fwd", "bwd")]


def test_check_run_fails_on_wrong_results(monkeypatch, capsys):
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "check_cases", lambda: [W.Case("2x37", {"M": 2, "N": 37})])
    monkeypatch.setattr(wl, "ours_fn", lambda get: {"warpforge": lambda x: torch.softmax(x * 1.5, -1)})
    assert wbench.bench(["softmax"], dtypes=["fp32"], check=True) == 1
    assert "FAILED: softmax" in capsys.readouterr().out


def test_check_run_tolerances(monkeypatch):
    """fp32 at the tolerances' edges (2e-5, the backward 2x that): an output 1e-5 off passes and
    1e-4 off fails; a gradient 3e-5 off passes and 1e-4 off fails (its forward exact)."""
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "check_cases", lambda: [W.Case("2x37", {"M": 2, "N": 37})])

    def off(fwd=0.0, bwd=0.0):
        def fn(x):
            x = x + bwd * (x - x.detach())   # the same x forward, the gradient (1 + bwd) times
            return torch.softmax(x, -1) * (1 + fwd)
        return fn

    ours = {"out 1e-5": off(fwd=1e-5), "out 1e-4": off(fwd=1e-4),
            "grad 3e-5": off(bwd=3e-5), "grad 1e-4": off(bwd=1e-4)}
    monkeypatch.setattr(wl, "ours_fn", lambda get: ours)
    res = runner.run_check([wl], [torch.float32])
    got = {(r["impl"], r["direction"]): r["ok"] for r in res.rows}
    assert got == {("out 1e-5", "fwd"): True, ("out 1e-5", "bwd"): True, ("out 1e-4", "fwd"): False,
                   ("out 1e-4", "bwd"): False, ("grad 3e-5", "fwd"): True, ("grad 3e-5", "bwd"): True,
                   ("grad 1e-4", "fwd"): True, ("grad 1e-4", "bwd"): False}, got
    assert all(r["status"] == ("ok" if r["ok"] else "failed: error above tolerance") for r in res.rows)


def test_rel_err_never_passes_what_differs():
    """Relative error in float64; inf for a shape mismatch and for any value where the reference
    has another kind (a finite value for a non-finite one and the other way round, NaN for -inf,
    +inf for -inf); an all-zero reference gives the absolute error."""
    t, inf, nan = torch.tensor, float("inf"), float("nan")
    assert runner.rel_err(t([1.0, 2.0]), t([1.0, 2.0])) == 0
    assert runner.rel_err(t([3.0, 4.0]), t([0.0, 0.0])) == pytest.approx(5.0), "all-zero reference: |out - ref|"
    assert runner.rel_err(t([[1.0, 2.0]]), t([1.0, 2.0])) == inf
    assert runner.rel_err(t([1.0, nan]), t([1.0, 2.0])) == inf and runner.rel_err(t([1.0, inf]), t([1.0, 2.0])) == inf
    assert runner.rel_err(t([1.0, 2.0]), t([1.0, inf])) == inf, "finite where the reference is not"
    assert runner.rel_err(t([1.0, nan]), t([1.0, -inf])) == inf, "NaN where the reference is -inf"
    assert runner.rel_err(t([1.0, inf]), t([1.0, -inf])) == inf, "+inf where the reference is -inf"
    assert runner.rel_err(t([-inf, 2.0]), t([nan, 2.0])) == inf, "-inf where the reference is NaN"
    assert runner.rel_err(t([1.0, -inf, nan]), t([1.0, -inf, nan])) == 0, "the same non-finite values"
    assert runner.rel_err(t([1.0, 2.02, -inf]), t([1.0, 2.0, -inf])) == pytest.approx(0.02 / 5**0.5)


def test_match_selects_cases(monkeypatch, capsys, tmp_path):
    """--match: the correctness run and the timing run take only the cases whose label the regular
    expression finds (and the timing run says so in its notes)."""
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "check_cases", lambda: [W.Case("2x37", {"M": 2, "N": 37}), W.Case("3x5", {"M": 3, "N": 5})])
    assert wbench.bench(["softmax"], dtypes=["fp32"], out=tmp_path, check=True, match=r"^3x") == 0
    rows = json.loads((tmp_path / "correctness.json").read_text())["rows"]
    # one row a direction for each implementation checked (on a GPU machine the CUDA backend's
    # warpforge[cuda] rows join warpforge's)
    assert {r["shape"] for r in rows} == {"3x5"}
    pairs = [(r["impl"], r["direction"]) for r in rows]
    assert len(pairs) == len(set(pairs)) and {("warpforge", "fwd"), ("warpforge", "bwd")} <= set(pairs)
    capsys.readouterr()
    assert wbench.bench(["softmax"], dtypes=["fp32"], check=True, match="T256") == 2
    err = capsys.readouterr().err
    assert "--match 'T256' matches none of the 2 correctness cases of softmax" in err and "'2x37'" in err

    monkeypatch.setattr(runner, "_host_times", lambda *a: None)
    monkeypatch.setattr(timing, "warm", lambda fn, n: fn())
    monkeypatch.setattr(timing, "device_ms", lambda fn, cfg, nbytes=None: (fn(), 1.0)[1])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(W, "cuda_backend_available", lambda: False)
    monkeypatch.setattr(wl, "cases", lambda quick: [W.Case("1x33", {"M": 1, "N": 33}, small=True),
                                                    W.Case("4x33", {"M": 4, "N": 33}, headline=True)])
    res = runner.run_bench([wl], ["fwd"], [torch.float32], use_compile=False, use_liger=False, copy_gbps=1.0,
                           device=DEVICE, match="4x")
    assert {r["shape"] for r in res.rows} == {"4x33"}
    assert "cases matching '4x' only" in res.notes
    assert not any("decode-like (small) cases" in n for n in res.notes), "the small case did not run"


def test_check_run_skips_unavailable_op(monkeypatch):
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "check_cases", lambda: [W.Case("2x37", {"M": 2, "N": 37})])
    missing = W.Workload(**{**wl.__dict__, "name": "ghost", "module": "warpforge.ops.ghost",
                            "ours_fn": lambda get: {"warpforge": get("ghost")}})
    res = runner.run_check([missing, wl], [torch.float32])
    assert any("ghost: not available" in n for n in res.notes)
    assert {r["op"] for r in res.rows} == {"softmax"}


# ---------------------------------------------------------------------------------------------- GPU runner plumbing
def test_bench_runner_plumbing_with_fake_timers(monkeypatch):
    """The GPU runner on the CPU with the timers replaced by constants: modes, the dispatcher door,
    failing peers, ratios. Nothing is timed."""
    from warpforge.runtime import registry

    times = {"warpforge": 1.0, "warpforge[dispatch]": 1.5, "eager": 2.0}
    current = {}
    doors = []

    def fake_ms(fn, cfg, nbytes=None):
        fn()
        doors.append((current["impl"], registry.FAST_EAGER))
        return times[current["impl"]]

    real_measure = runner._measure

    def measure(wl, case, dtype, mode, impl, *a):
        current["impl"] = impl.name
        return real_measure(wl, case, dtype, mode, impl, *a)

    monkeypatch.setattr(runner, "_measure", measure)
    monkeypatch.setattr(timing, "warm", lambda fn, n: fn())
    monkeypatch.setattr(timing, "device_ms", fake_ms)
    host_doors = []

    host_vals = []

    def fake_host_us(fn, calls=200):   # rounds in no order: the least is not always the first or last
        fn()
        host_doors.append(registry.FAST_EAGER)
        host_vals.append(float(7 * len(host_doors) % 11 + 1))
        return host_vals[-1]

    monkeypatch.setattr(timing, "host_us", fake_host_us)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(W, "cuda_backend_available", lambda: False)   # a GPU would add warpforge[cuda]
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "cases", lambda quick: [W.Case("4x33", {"M": 4, "N": 33}, headline=True),
                                                    W.Case("1x33", {"M": 1, "N": 33}, small=True)])

    def broken_liger():
        def fn(x):
            raise RuntimeError("boom")
        return fn
    monkeypatch.setattr(wl, "liger_fn", broken_liger)
    saved = registry.FAST_EAGER
    res = runner.run_bench([wl], list(W.MODES), [torch.float32], use_compile=False, copy_gbps=1.0, device=DEVICE)
    assert registry.FAST_EAGER == saved
    rows = res.rows
    big = [r for r in rows if r["shape"] == "4x33"]
    small = [r for r in rows if r["shape"] == "1x33"]
    assert {r["impl"] for r in big} == {"warpforge", "eager", "liger"}
    assert {r["impl"] for r in small} == {"warpforge", "warpforge[dispatch]", "eager", "liger"}
    assert {r["mode"] for r in rows} == set(W.MODES)
    for r in rows:
        if r["impl"] == "liger":
            assert r["status"].startswith("failed: RuntimeError: boom")
            continue
        assert r["status"] == "ok", r
        assert r["best_peer"] == "eager"
        assert r["ratio"] == pytest.approx(2.0 / times[r["impl"]])
        assert r["gbps"] == pytest.approx(r["bytes"] / r["ms"] / 1e6)
        assert (r["host_us"] is not None) == r["small"]
    # host time of the small case: the three working implementations in alternating rounds, each
    # keeping its least round
    rounds = timing.TimingConfig().host_rounds
    assert host_doors == [saved, False, saved] * rounds * len(W.MODES)
    kept = set()
    for j, mode in enumerate(W.MODES):
        for i, impl in enumerate(("warpforge", "warpforge[dispatch]", "eager")):
            r = next(r for r in small if r["impl"] == impl and r["mode"] == mode)
            mine = [host_vals[3 * rounds * j + 3 * k + i] for k in range(rounds)]
            assert r["host_us"] == min(mine), (mode, impl, mine)
            kept.add(mine.index(min(mine)))
    assert {0, rounds - 1} < kept, "the scripted rounds tell the least from the first and the last"
    fwd = next(r for r in big if r["impl"] == "warpforge" and r["mode"] == "fwd")
    assert fwd["err_vs_eager"] < 1e-5
    assert ("warpforge[dispatch]", False) in doors and ("warpforge", True) in doors
    assert any("peer absent -- compile" in n for n in res.notes)
    assert all("vs_peers" not in r for r in rows), "no named peers: the rows are as before"


def _tag_timed_impl(monkeypatch, current: dict) -> None:
    """Keep ``current["impl"]`` (and ``current["shape"]``) naming what the runner is timing: set by
    runner._measure before a row's first timing and by every step it builds, which the alternating
    rounds call."""
    real_measure, real_step = runner._measure, runner._impl_step

    def measure(wl, case, dtype, mode, impl, *a):
        current["impl"], current["shape"] = impl.name, case.label
        return real_measure(wl, case, dtype, mode, impl, *a)

    def impl_step(wl, mode, impl, args):
        step = real_step(wl, mode, impl, args)

        def tagged():
            current["impl"] = impl.name
            return step()
        return tagged

    monkeypatch.setattr(runner, "_measure", measure)
    monkeypatch.setattr(runner, "_impl_step", impl_step)


def test_bench_runner_small_case_rounds(monkeypatch):
    """A decode-like (small) case gets cfg.small_rounds alternating device-timing rounds, each with
    its share of one measurement's calls (clean_calls and rep_ms divided by the rounds), and keeps
    each row's least round; a large case of the same run is timed once with the full budget."""
    seen = []
    current = {}

    def fake_ms(fn, cfg, nbytes=None):
        fn()
        impl = current["impl"]
        k = sum(1 for i, *_ in seen if i == impl)
        seen.append((impl, current["shape"], cfg.clean_calls, cfg.rep_ms))
        return [5.0, 4.0, 6.0, 4.5, 5.5][k % 5] * (1.0 if impl == "warpforge" else 1.1)

    _tag_timed_impl(monkeypatch, current)
    monkeypatch.setattr(runner, "_host_times", lambda *a: None)
    monkeypatch.setattr(timing, "warm", lambda fn, n: fn())
    monkeypatch.setattr(timing, "device_ms", fake_ms)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(W, "cuda_backend_available", lambda: False)
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "cases", lambda quick: [W.Case("1x33", {"M": 1, "N": 33}, small=True),
                                                    W.Case("4x33", {"M": 4, "N": 33}, headline=True)])
    monkeypatch.setattr(wl, "liger_fn", lambda: (lambda x: torch.softmax(x, -1)))
    cfg = timing.TimingConfig()
    res = runner.run_bench([wl], ["fwd"], [torch.float32], use_compile=False, copy_gbps=1.0, device=DEVICE)
    rows = {(r["shape"], r["impl"]): r for r in res.rows}
    n = cfg.small_rounds
    assert n > 1
    small_impls = ("warpforge", "warpforge[dispatch]", "eager", "liger")
    small = [s for s in seen if s[1] == "1x33"]
    # the first round one implementation after another, then n - 1 rounds alternating over them
    assert [s[0] for s in small] == list(small_impls) * n
    assert {(c, r) for _, _, c, r in small} == {(cfg.clean_calls // n, cfg.rep_ms / n)}
    for impl in small_impls:
        r = rows[("1x33", impl)]
        assert len(r["ms_rounds"]) == n and r["ms"] == min(r["ms_rounds"])
    assert rows[("1x33", "warpforge")]["ms"] == 4.0
    assert rows[("1x33", "warpforge")]["ratio"] == pytest.approx(1.1)   # least of rounds against least
    big = [s for s in seen if s[1] == "4x33"]
    assert [s[0] for s in big] == ["warpforge", "eager", "liger"]
    assert {(c, r) for _, _, c, r in big} == {(cfg.clean_calls, cfg.rep_ms)}
    assert all("ms_rounds" not in rows[("4x33", i)] for i in ("warpforge", "eager", "liger"))
    assert any("decode-like (small) cases: device times are the least of" in note for note in res.notes)


def test_bench_runner_device_rounds(monkeypatch):
    """A workload with device_rounds = 3: after the first round (one implementation after another),
    two more rounds alternate over the implementations; each row keeps its least time, lists all
    three, and its rate, percentages and ratio follow the kept time. A row that failed is not
    timed again."""
    order = []
    scripted = {"warpforge": [3.0, 1.0, 2.0], "eager": [2.0, 2.5, 4.0]}
    current = {}

    def fake_ms(fn, cfg, nbytes=None):
        fn()
        impl = current["impl"]
        order.append(impl)
        return scripted[impl][sum(1 for o in order if o == impl) - 1]

    _tag_timed_impl(monkeypatch, current)
    monkeypatch.setattr(timing, "warm", lambda fn, n: fn())
    monkeypatch.setattr(timing, "device_ms", fake_ms)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(W, "cuda_backend_available", lambda: False)
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "device_rounds", 3)
    monkeypatch.setattr(wl, "cases", lambda quick: [W.Case("4x33", {"M": 4, "N": 33}, headline=True)])

    def broken_liger():
        def fn(x):
            raise RuntimeError("boom")
        return fn
    monkeypatch.setattr(wl, "liger_fn", broken_liger)
    res = runner.run_bench([wl], ["fwd"], [torch.float32], use_compile=False, copy_gbps=1.0, device=DEVICE)
    rows = {r["impl"]: r for r in res.rows}
    assert order == ["warpforge", "eager", "warpforge", "eager", "warpforge", "eager"]
    assert rows["liger"]["status"].startswith("failed") and "ms_rounds" not in rows["liger"]
    assert rows["warpforge"]["ms_rounds"] == [3.0, 1.0, 2.0] and rows["warpforge"]["ms"] == 1.0
    assert rows["eager"]["ms_rounds"] == [2.0, 2.5, 4.0] and rows["eager"]["ms"] == 2.0
    assert rows["warpforge"]["ratio"] == pytest.approx(2.0)
    assert rows["warpforge"]["gbps"] == pytest.approx(rows["warpforge"]["bytes"] / 1.0 / 1e6)
    assert any("least of 3 rounds" in n for n in res.notes)

    # rounds_for_variants=False (the matmul ladder): a named variant's row keeps its one time
    order.clear()
    scripted["warpforge[naive]"] = [5.0]
    monkeypatch.setattr(wl, "rounds_for_variants", False)
    monkeypatch.setattr(wl, "ours_fn", lambda get: {"warpforge": lambda x: torch.softmax(x, -1),
                                                    "warpforge[naive]": lambda x: torch.softmax(x, -1)})
    res = runner.run_bench([wl], ["fwd"], [torch.float32], use_compile=False, copy_gbps=1.0, device=DEVICE)
    rows = {r["impl"]: r for r in res.rows}
    assert order == ["warpforge", "warpforge[naive]", "eager", "warpforge", "eager", "warpforge", "eager"]
    assert rows["warpforge[naive]"]["ms"] == 5.0 and "ms_rounds" not in rows["warpforge[naive]"]
    assert rows["warpforge"]["ms_rounds"] == [3.0, 1.0, 2.0]
    assert any("variants' rows are timed once" in n for n in res.notes)


def test_bench_runner_refs_memory_private_inputs_oom(monkeypatch):
    """The runner's workload features on the CPU with the timers and the CUDA memory counters
    replaced: reference rows (timed, never a peer, vs_ref on the others), extra_gib, Liger's private
    inputs (its in-place writes never reach the others), an out-of-memory peer as a failed row that
    frees memory and does not stop the run (nor cost our row, whose eager check needs that peer)."""
    import torch.nn.functional as F

    times = {"warpforge": 1.0, "eager": 2.0, "liger": 1.5, "cublas_gemms": 0.5}
    gib = {"warpforge": 0.25, "eager": 3.0, "liger": 1.0, "cublas_gemms": 2.0}
    current, events, made, seen, dys = {}, [], [], [], []

    def fake_ms(fn, cfg, nbytes=None):
        fn()
        events.append(current["impl"])
        return times[current["impl"]]

    real_measure = runner._measure

    def measure(wl, case, dtype, mode, impl, *a):
        current["impl"], current["mode"] = impl.name, mode
        return real_measure(wl, case, dtype, mode, impl, *a)

    monkeypatch.setattr(runner, "_measure", measure)
    monkeypatch.setattr(timing, "warm", lambda fn, n: fn())
    monkeypatch.setattr(timing, "device_ms", fake_ms)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: events.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: int(2**30 * (1 + gib[current["impl"]])))

    ce, lce = W.WORKLOADS["cross_entropy"], W.WORKLOADS["linear_cross_entropy"]
    monkeypatch.setattr(ce, "cases", lambda quick: [W.Case("6x37", {"T": 6, "V": 37}, headline=True)])
    monkeypatch.setattr(lce, "cases", lambda quick: [W.Case("6x37 H=8", {"T": 6, "V": 37, "H": 8}, headline=True)])
    real_make = ce.make
    monkeypatch.setattr(ce, "make", lambda *a: made.append(real_make(*a)) or made[-1])

    def oom(x, t):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 100.00 GiB")

    def liger_like(x, t):   # as Liger: the gradient lands in the logits' storage
        seen.append((current["mode"], x.detach().clone(), x.data_ptr()))
        loss = F.cross_entropy(x.float(), t)
        x.detach().fill_(float("nan"))
        if loss.requires_grad:
            loss.register_hook(lambda g: dys.append(g.item()))
        return loss

    # ours in plain PyTorch: this is the runner's plumbing (the interpreter runs the real ops in
    # test_check_run_cross_entropy_workloads)
    monkeypatch.setattr(ce, "ours_fn", lambda get: {"warpforge": lambda x, t: F.cross_entropy(x, t)})
    monkeypatch.setattr(lce, "ours_fn", lambda get: {"warpforge": lambda h, w, t: F.cross_entropy(h @ w.T, t)})
    monkeypatch.setattr(ce, "eager", oom)
    monkeypatch.setattr(ce, "liger_fn", lambda: liger_like)
    monkeypatch.setattr(lce, "liger_fn", lambda: lambda h, w, t: F.cross_entropy((h @ w.T).float(), t))
    res = runner.run_bench([ce, lce], list(W.MODES), [torch.float32], use_compile=False, copy_gbps=1.0,
                           device=DEVICE)
    assert any(n.startswith("cross_entropy: modes fwd and fwd+bwd only") for n in res.notes)
    rows = {(r["op"], r["mode"], r["impl"]): r for r in res.rows}
    assert {m for _, m, _ in rows} == {"fwd", "fwd+bwd"}

    # cross_entropy: eager out of memory -> failed rows; the run goes on; ours keeps its row
    for mode in ("fwd", "fwd+bwd"):
        assert rows["cross_entropy", mode, "eager"]["status"].startswith("failed: OutOfMemoryError")
        ours, liger = rows["cross_entropy", mode, "warpforge"], rows["cross_entropy", mode, "liger"]
        assert ours["status"] == liger["status"] == "ok"
        assert ours["best_peer"] == "liger" and ours["ratio"] == pytest.approx(1.5)
        assert ours["extra_gib"] == pytest.approx(0.25) and liger["extra_gib"] == pytest.approx(1.0)
        assert rows["cross_entropy", mode, "eager"]["extra_gib"] is None
        assert "vs_ref" not in ours
    assert rows["cross_entropy", "fwd", "warpforge"]["err_vs_eager"] is None   # eager's OOM cost only the check
    assert dys and set(dys) == {1.0}, "a loss's backward is timed with dy = 1, as loss.backward() passes"
    assert events[:5] == ["warpforge", "reset", "empty_cache", "empty_cache", "liger"], \
        "memory freed after the failed check and after the failed eager row, before liger runs"
    # Liger got a private copy in each mode, made once (its later calls see its own writes): equal
    # to the inputs, never their storage; its in-place writes stayed in it
    (x, _t), = made
    assert torch.isfinite(x).all()
    assert all(ptr != x.data_ptr() for _m, _v, ptr in seen)
    for mode in ("fwd", "fwd+bwd"):
        calls = [v for m, v, _p in seen if m == mode]
        assert len(calls) >= 3 and torch.equal(calls[0], x) and all(v.isnan().all() for v in calls[1:])

    # linear_cross_entropy: the reference row is timed, never a peer, and the others' yardstick
    for mode in ("fwd", "fwd+bwd"):
        ref = rows["linear_cross_entropy", mode, "cublas_gemms"]
        assert ref["kind"] == "ref" and ref["status"] == "ok" and ref["ms"] == 0.5
        assert ref["ratio"] is None and ref["best_peer"] is None and ref["vs_ref"] is None
        assert ref["extra_gib"] == pytest.approx(2.0)
        for impl in ("warpforge", "eager", "liger"):
            r = rows["linear_cross_entropy", mode, impl]
            assert r["status"] == "ok" and r["best_peer"] == "liger", r
            assert r["vs_ref"] == {"cublas_gemms": pytest.approx(times[impl] / 0.5)}
            assert r["extra_gib"] == pytest.approx(gib[impl])
    assert rows["linear_cross_entropy", "fwd", "warpforge"]["err_vs_eager"] < 1e-5

    # the report: the optional columns for these ops only; the summary reads the bars
    md = report.results_markdown(res.rows + _rows(), {"date": "2026-01-01"}, res.notes)
    sections = {s.split("\n", 1)[0]: s for s in md.split("## ")[1:]}
    assert "time / ref" in sections["linear_cross_entropy"] and "extra GiB" in sections["linear_cross_entropy"]
    assert "2.00x cublas_gemms" in sections["linear_cross_entropy"] and "0.25" in sections["cross_entropy"]
    assert "extra GiB" in sections["cross_entropy"] and "time / ref" not in sections["cross_entropy"]
    assert "extra GiB" not in sections["softmax"] and "time / ref" not in sections["softmax"]
    summ = {(e["op"], e["mode"]): e for e in report.summary(res.rows)}
    e = summ["linear_cross_entropy", "fwd+bwd"]
    assert e["vs_ref"] == {"cublas_gemms": pytest.approx(2.0)} and e["extra_gib"] == pytest.approx(0.25)
    assert e["ours_ms"] == 1.0 and e["floor_ms"] == pytest.approx(e["ours_pct"] / 100)
    heads = [h for _, h in report.summary_columns(list(summ.values()))]
    assert heads[-2:] == ["time / ref", "extra GiB"] and "roof ms" in heads
    assert not {"time / ref", "extra GiB", "peer ms / warpforge ms"} & {
        h for _, h in report.summary_columns(report.summary(_rows()))}


def _fake_timers(monkeypatch, times: dict, current: dict, seen: list | None = None):
    """The runner's timers replaced: each row's time from ``times`` by implementation; ``seen``
    records (impl, what the fake timer observed) per timed call."""
    real_measure = runner._measure

    def measure(wl, case, dtype, mode, impl, *a):
        current["impl"], current["mode"] = impl.name, mode
        return real_measure(wl, case, dtype, mode, impl, *a)

    def fake_ms(fn, cfg, nbytes=None):
        fn()
        if seen is not None:
            seen.append((current["impl"], current.get("ctx")))
        return times[current["impl"]]

    monkeypatch.setattr(runner, "_measure", measure)
    monkeypatch.setattr(timing, "warm", lambda fn, n: fn())
    monkeypatch.setattr(timing, "device_ms", fake_ms)
    monkeypatch.setattr(timing, "host_us", lambda fn, calls=200: 7.0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_bench_runner_named_peers(monkeypatch):
    """Named peers: rows of kind "peer" (a Peer's context entered once around its measurement, not
    per call; a failing one a failed row; a Skipped one a skipped row), the fastest the best peer,
    vs_peers on every other ok row, no compile row with compile_peer=False; the markdown's per-op
    peer table and the summary's column for that op only."""
    import contextlib

    times = {"warpforge": 1.0, "warpforge[v]": 2.0, "eager": 3.0, "p[fast]": 1.5, "p[slow]": 4.0}
    current, seen, entered = {}, [], []
    _fake_timers(monkeypatch, times, current, seen)

    @contextlib.contextmanager
    def ctx():
        entered.append(current["mode"])
        current["ctx"] = "in"
        try:
            yield
        finally:
            current["ctx"] = None

    def broken(x):
        raise RuntimeError("no kernel for this case")

    def declines(x):
        raise W.Skipped("S = 9 > 4: too big")

    def f(x):
        return x * 2

    wl = W.Workload(
        name="fake_attn", module="warpforge.ops.fake", cases=lambda quick: [W.Case("4x8", {"M": 4, "N": 8}, headline=True)],
        check_cases=list, make=lambda c, dt, dev: (torch.randn(4, 8, dtype=dt, device=dev),), grad_args=(0,),
        ours_fn=lambda get: {"warpforge": f, "warpforge[v]": f}, eager=f,
        bytes_fn=lambda c, m, s: 64 * s, flops_fn=lambda c, m: 64,
        peers=lambda: {"p[fast]": W.Peer(f, context=ctx), "p[slow]": f, "p[broken]": W.Peer(broken, context=ctx),
                       "p[skip]": declines},
        compile_peer=False, notes="p[fast] is fast, p[slow] slow")
    res = runner.run_bench([wl], list(W.MODES), [torch.bfloat16], use_compile=True, use_liger=False,
                           copy_gbps=1.0, device=DEVICE)
    assert any("compile: not a peer of this op" in n and "fake_attn" in n for n in res.notes)
    assert "fake_attn: p[fast] is fast, p[slow] slow" in res.notes, "an op with named peers says what they are"
    rows = {(r["mode"], r["impl"]): r for r in res.rows}
    assert {i for _, i in rows} == {"warpforge", "warpforge[v]", "eager", "p[fast]", "p[slow]", "p[broken]", "p[skip]"}
    assert entered == [m for m in W.MODES for _ in (1, 2)], "once per peer and mode (p[fast], p[broken]), not per call"
    assert {c for i, c in seen if i == "p[fast]"} == {"in"} and {c for i, c in seen if i != "p[fast]"} == {None}
    for mode in W.MODES:
        assert rows[mode, "p[broken]"]["status"] == "failed: RuntimeError: no kernel for this case"
        assert rows[mode, "p[skip]"]["status"] == "skipped: S = 9 > 4: too big"
        for impl in ("p[fast]", "p[slow]", "eager"):
            r = rows[mode, impl]
            assert r["kind"] == "peer" and r["status"] == "ok" and r["vs_peers"] is None
        for impl in ("warpforge", "warpforge[v]"):
            r = rows[mode, impl]
            assert r["kind"] == "ours" and r["best_peer"] == "p[fast]"
            assert r["ratio"] == pytest.approx(1.5 / times[impl])
            assert r["vs_peers"] == {p: pytest.approx(times[p] / times[impl]) for p in ("eager", "p[fast]", "p[slow]")}

    md = report.results_markdown(res.rows + _rows(), {"date": "2026-01-01"}, res.notes)
    sections = {s.split("\n", 1)[0]: s for s in md.split("## ")[1:]}
    head = "fake_attn: each peer's time / this row's time (> 1: this row is faster)"
    assert head in sections and "### " + head not in sections["softmax"]
    table = sections[head]
    assert "| mode | dtype | shape | impl | eager | p[fast] | p[slow] |" in table
    assert "| fwd | bf16 | 4x8 | warpforge[v] | 1.50x | 0.75x | 2.00x |" in table
    assert "p[skip]" not in table and "vs_peers" not in sections["fake_attn"].split("###")[0]
    assert sections["softmax"] == sections["softmax"].replace("peer ms", ""), "other ops' tables as before"
    summ = {(e["op"], e["mode"]): e for e in report.summary(res.rows + _rows())}
    assert summ["fake_attn", "fwd"]["vs_peers"] == {"eager": 3.0, "p[fast]": 1.5, "p[slow]": 4.0}
    assert "vs_peers" not in summ["softmax", "fwd"]
    assert "3.00x eager, 1.50x p[fast], 4.00x p[slow]" in sections["Summary"]
    prow, pcols = report.peer_table(_rows())
    assert prow == [] and pcols == []


def test_attention_workload():
    at = W.WORKLOADS["attention"]
    full, quick = at.cases(False), at.cases(True)
    assert len(full) == 6 * 2 * 2 + 2 + 2 and len({c.label for c in full}) == len(full)
    sweep = full[:24]
    assert {(c.dims["S"], c.dims["D"], c.dims["causal"]) for c in sweep} == {
        (s, d, c) for s in (512, 1024, 2048, 4096, 8192, 16384) for d in (64, 128) for c in (False, True)}
    assert all(c.dims["B"] * c.dims["S"] == 16384 and c.dims["Hq"] * c.dims["D"] == 2048 == c.dims["Hkv"] * c.dims["D"]
               for c in sweep)
    labels = [c.label for c in full]
    assert labels[24:] == ["B4 H32/32 S4096 D128 non-causal", "B4 H32/32 S4096 D128 causal",
                           "B4 H32/8 S4096 D128 non-causal", "B4 H32/8 S4096 D128 causal"]
    assert "B16 H16/16 S1024 D128 causal" in labels and "B1 H32/32 S16384 D64 non-causal" in labels
    assert [c.label for c in quick] == ["B4 H32/32 S4096 D128 non-causal", "B4 H32/32 S4096 D128 causal",
                                        "B4 H32/8 S4096 D128 causal"]
    assert [c.label for c in full if c.headline] == [c.label for c in quick if c.headline] == [labels[24]]
    bar, bar_c, gqa = (_case("attention", lab) for lab in (labels[24], labels[25], labels[26]))
    f = 4 * 4 * 32 * 4096**2 * 128
    assert at.flops(bar, "fwd") == f and at.flops(bar_c, "fwd") == f // 2 == at.flops(gqa, "fwd") // 2
    assert at.flops(bar, "bwd") == 2.5 * f and at.flops(bar, "fwd+bwd") == 3.5 * f
    assert at.flops(bar_c, "bwd") == 2.5 * f / 2
    n = 4 * 32 * 4096 * 128
    assert at.bytes(bar, "fwd", 2) == 4 * n * 2 and at.bytes(bar, "bwd", 2) == 8 * n * 2
    assert at.bytes(bar, "fwd+bwd", 2) == 12 * n * 2
    assert at.bytes(gqa, "fwd", 2) == (2 * n + 2 * n // 4) * 2 and at.bytes(gqa, "bwd", 2) == (4 * n + 4 * n // 4) * 2
    assert at.modes == W.MODES and at.grad_args == (0, 1, 2) and at.only_dtypes == (torch.bfloat16, torch.float16)
    assert at.liger is None and not at.compile_peer and at.eager is W._sdpa
    assert list(at.peers()) == ["sdpa[cudnn]", "sdpa[flash]", "sdpa[efficient]", "sdpa[math]"]
    assert all(name in at.notes for name in ("eager", *at.peers(), "cuDNN", "FlashAttention-2", "math"))
    assert [c.dims["Hq"] != c.dims["Hkv"] for c in at.check_cases()].count(True) == 1
    assert max(c.dims["S"] * c.dims["B"] * c.dims["Hq"] for c in at.check_cases()) < 300, "tiny: the interpreter runs it"

    # the inputs, the float64 reference against SDPA's math, and the math peer's skip
    for case in at.check_cases():
        q, k, v, causal, gqa = args = at.make(case, torch.float64, "cpu")
        d = case.dims
        assert q.shape == (d["B"], d["Hq"], d["S"], d["D"]) and k.shape == v.shape == (d["B"], d["Hkv"], d["S"], d["D"])
        assert causal == d["causal"] and gqa == (d["Hq"] != d["Hkv"])
        torch.testing.assert_close(at.ref(*args), W._sdpa(*args))
        math = at.peers()["sdpa[math]"]
        with math.context():
            torch.testing.assert_close(math.fn(*args), at.ref(*args))
    long = torch.zeros(1, 1, 4097, 8)
    with pytest.raises(W.Skipped, match="S = 4097 > 4096"):
        at.peers()["sdpa[math]"].fn(long, long, long, False, False)


def test_decode_attention_workload():
    de = W.WORKLOADS["decode_attention"]
    full, quick = de.cases(False), de.cases(True)
    assert [(c.dims["B"], c.dims["ctx"]) for c in full] == [
        (b, c) for b in (1, 8, 16, 32, 64) for c in (4096, 8192, 16384, 32768)]
    assert [(c.dims["B"], c.dims["ctx"]) for c in quick] == [(b, c) for b in (1, 16, 64) for c in (4096, 32768)]
    assert all(c.small == (c.dims["B"] <= 8) for c in full)
    assert all((c.dims["Hq"], c.dims["Hkv"], c.dims["D"], c.dims["block"]) == (32, 8, 128, 16) for c in full)
    assert [c.label for c in full if c.headline] == [c.label for c in quick if c.headline] == [
        "B16 ctx32768 H32/8 D128 block16"]
    c = _case("decode_attention", "B64 ctx32768 H32/8 D128 block16")
    kv = 2 * 64 * 32768 * 8 * 128
    assert de.bytes(c, "fwd", 2) == (kv + 2 * 64 * 32 * 128) * 2
    assert de.flops(c, "fwd") == 4 * 64 * 32 * 32768 * 128
    assert de.modes == ("fwd",) and de.grad_args == () and not de.compile_peer and de.liger is None
    assert list(de.peers()) == ["sdpa[cudnn]", "sdpa[flash]", "sdpa[efficient]", "sdpa[math]"]
    assert "validate=False" in de.notes and "no host sync" in de.notes

    # paged and unpaged hold the same values; the block table is a shuffled pool
    for case in de.check_cases():
        d = case.dims
        q, kc, vc, bt, sl, q4, k4, v4 = de.make(case, torch.float32, "cpu")
        nb = -(-d["ctx"] // d["block"])
        assert bt.dtype == sl.dtype == torch.int32 and bt.shape == (d["B"], nb) and sl.tolist() == [d["ctx"]] * d["B"]
        assert sorted(bt.flatten().tolist()) == list(range(kc.shape[0])) and bt.flatten().tolist() != sorted(bt.flatten().tolist())
        assert kc.shape == vc.shape == (d["B"] * nb, d["block"], d["Hkv"], d["D"]) and q.shape == (d["B"], d["Hq"], d["D"])
        assert torch.equal(q4, q.unsqueeze(2)) and k4.shape == v4.shape == (d["B"], d["Hkv"], d["ctx"], d["D"])
        for b in range(d["B"]):
            for t in (0, d["block"] + 1, d["ctx"] - 1):
                blk, off = bt[b, t // d["block"]], t % d["block"]
                assert torch.equal(kc[blk, off], k4[b, :, t]) and torch.equal(vc[blk, off], v4[b, :, t])

    # ours: validate=False is "warpforge", the default "warpforge[validated]"
    calls = []
    ours = de.ours_fn(lambda name: (lambda *a, **kw: calls.append((name, kw)) or a[0]))
    args = de.make(de.check_cases()[0], torch.float32, "cpu")
    assert ours["warpforge"](*args).shape == args[5].shape and ours["warpforge[validated]"](*args) is not None
    assert calls == [("decode_attention", {"validate": False}), ("decode_attention", {})]


def test_decode_attention_fp8_workload():
    """The fp8 workload: e4m3 caches with power-of-two scales, and the peers' unpaged k/v hold
    exactly the dequantised values (so every row computes the same attention); ours passes the
    scales without the host check; bytes count the KV at one byte."""
    wl = W.WORKLOADS["decode_attention_fp8"]
    assert [c.label for c in wl.cases(False)] == [c.label for c in W.WORKLOADS["decode_attention"].cases(False)]
    c = _case("decode_attention_fp8", "B16 ctx32768 H32/8 D128 block16")
    assert wl.bytes(c, "fwd", 2) == 2 * 16 * 32768 * 8 * 128 + 2 * 16 * 32 * 128 * 2
    for case in wl.check_cases():
        d = case.dims
        q, kc, vc, bt, sl, q4, k4, v4, ks, vs = wl.make(case, torch.bfloat16, "cpu")
        assert kc.dtype == vc.dtype == torch.float8_e4m3fn and k4.dtype == torch.bfloat16
        for sc, cache in ((ks, kc), (vs, vc)):
            assert math.log2(sc) == round(math.log2(sc)) and cache.float().abs().max() > 224
        for b in range(d["B"]):
            for t in range(d["ctx"]):
                blk, off = bt[b, t // d["block"]], t % d["block"]
                assert torch.equal(kc[blk, off].float() * ks, k4[b, :, t].float())
                assert torch.equal(vc[blk, off].float() * vs, v4[b, :, t].float())
    calls = []
    ours = wl.ours_fn(lambda name: (lambda *a, **kw: calls.append((name, kw)) or a[0]))
    args = wl.make(wl.check_cases()[0], torch.bfloat16, "cpu")
    assert list(ours) == ["warpforge"] and ours["warpforge"](*args).shape == args[5].shape
    assert calls == [("decode_attention", {"k_scale": args[-2], "v_scale": args[-1], "validate": False})]


def test_decode_attention_window_workload():
    """The window workload: the peers' k/v are the last ``window`` keys of each paged sequence,
    contiguous; ours asks for window_size=(window - 1, 0) without the host check; bytes and FLOPs
    count the window's keys only."""
    dw = W.WORKLOADS["decode_attention_window"]
    assert [(c.dims["B"], c.dims["ctx"], c.dims["window"]) for c in dw.cases(False)] == list(W.DECODE_WINDOWS)
    assert all((c.dims["Hq"], c.dims["Hkv"], c.dims["D"], c.dims["block"]) == (32, 8, 128, 16) for c in dw.cases(False))
    c = _case("decode_attention_window", "B16 ctx32768 window128 H32/8 D128 block16")
    assert dw.bytes(c, "fwd", 2) == (2 * 16 * 128 * 8 * 128 + 2 * 16 * 32 * 128) * 2
    assert dw.flops(c, "fwd") == 4 * 16 * 32 * 128 * 128
    assert dw.modes == ("fwd",) and not dw.compile_peer and "window_size=(window - 1, 0)" in dw.notes
    for case in dw.check_cases():
        d = case.dims
        q, kc, vc, bt, sl, q4, k4, v4, left = dw.make(case, torch.float32, "cpu")
        w = min(d["window"], d["ctx"])
        assert left == w - 1 and k4.shape == v4.shape == (d["B"], d["Hkv"], w, d["D"]) and k4.is_contiguous()
        for b in range(d["B"]):
            for i, t in enumerate(range(d["ctx"] - w, d["ctx"])):
                blk, off = bt[b, t // d["block"]], t % d["block"]
                assert torch.equal(kc[blk, off], k4[b, :, i]) and torch.equal(vc[blk, off], v4[b, :, i])
    calls = []
    ours = dw.ours_fn(lambda name: (lambda *a, **kw: calls.append((name, kw)) or a[0]))
    args = dw.make(dw.check_cases()[0], torch.float32, "cpu")
    assert list(ours) == ["warpforge"] and ours["warpforge"](*args).shape == args[5].shape
    assert calls == [("decode_attention", {"window_size": (args[-1], 0), "validate": False})]


def _paged_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale=None, num_splits=None, validate=True):
    """A plain-PyTorch decode over the paged cache (a fake of ours: the workload's wiring, not the kernel)."""
    b, nb = block_table.shape
    blk, hkv, d = k_cache.shape[1:]
    ctx = int(seq_lens[0])
    k = k_cache[block_table.long()].reshape(b, nb * blk, hkv, d)[:, :ctx].transpose(1, 2)
    v = v_cache[block_table.long()].reshape(b, nb * blk, hkv, d)[:, :ctx].transpose(1, 2)
    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)


def test_check_run_attention_workloads(monkeypatch):
    """The attention workloads' inputs, calls and float64 references wired up in the correctness
    run, with plain-PyTorch fakes for ours (the real ops are tested in tests/ops)."""
    at, de = W.WORKLOADS["attention"], W.WORKLOADS["decode_attention"]
    monkeypatch.setattr(at, "ours_fn", lambda get: {"warpforge": W._sdpa})
    monkeypatch.setattr(de, "ours_fn", lambda get: W._decode_ours(lambda name: _paged_decode))
    res = runner.run_check([at, de], [torch.float32, torch.bfloat16])
    assert [(r["op"], r["dtype"], r["direction"], r["status"]) for r in res.rows] == [
        ("attention", "bf16", d, "ok") for _ in at.check_cases() for d in ("fwd", "bwd")] + [
        ("decode_attention", "bf16", d, s) for _ in de.check_cases() for _i in ("warpforge", "warpforge[validated]")
        for d, s in (("fwd", "ok"), ("bwd", "skipped: output does not require grad"))]
    assert all(r["ok"] for r in res.rows)


def test_bench_runner_decode_attention(monkeypatch):
    """The decode workload through the GPU runner (timers replaced, ours a plain-PyTorch fake): our
    two rows and the dispatcher door on small batches, eager and the SDPA backends as peers (each
    under its sdpa_kernel; those the device lacks are failed rows), vs_peers, no compile row."""
    de = W.WORKLOADS["decode_attention"]
    monkeypatch.setattr(de, "ours_fn", lambda get: W._decode_ours(lambda name: _paged_decode))
    monkeypatch.setattr(de, "cases", lambda quick: [W._decode_case(1, 40, 4, 2, 16, 8, small=True),
                                                    W._decode_case(3, 37, 4, 2, 32, 8, headline=True)])
    times = {"warpforge": 1.0, "warpforge[validated]": 1.2, "warpforge[dispatch]": 1.1, "eager": 2.0,
             "sdpa[cudnn]": 1.5, "sdpa[flash]": 3.0, "sdpa[efficient]": 4.0, "sdpa[math]": 5.0}
    _fake_timers(monkeypatch, times, {})
    res = runner.run_bench([de], ["fwd"], [torch.bfloat16], use_compile=True, copy_gbps=1.0, device=DEVICE)
    rows = {(r["shape"], r["impl"]): r for r in res.rows}
    small, big = "B1 ctx40 H4/2 D16 block8", "B3 ctx37 H4/2 D32 block8"
    assert {i for s, i in rows if s == big} == set(times) - {"warpforge[dispatch]"}
    assert {i for s, i in rows if s == small} == set(times)
    ok_peers = {i for (s, i), r in rows.items() if s == big and r["kind"] == "peer" and r["status"] == "ok"}
    assert {"eager", "sdpa[math]"} <= ok_peers, ok_peers
    for (s, i), r in rows.items():
        assert r["status"] == "ok" or r["status"].startswith("failed: "), r
        if r["kind"] == "ours":
            assert r["status"] == "ok" and set(r["vs_peers"]) == ok_peers
            assert r["vs_peers"]["eager"] == pytest.approx(2.0 / times[i])
    assert rows[big, "warpforge"]["err_vs_eager"] < 2e-2
    assert any("compile: not a peer of this op" in n for n in res.notes)

# ---------------------------------------------------------------------------------------------- moe
MOE_SHAPES = {"DeepSeek-V2-Lite": (2048, 1408, 64, 6), "Qwen3-30B-A3B": (2048, 768, 128, 8),
              "Mixtral-8x7B": (4096, 14336, 8, 2), "OLMoE-1B-7B": (2048, 1024, 64, 8)}   # d, n, E, k


def _counts(ids: torch.Tensor, e: int) -> torch.Tensor:
    return torch.bincount(ids.flatten().long(), minlength=e)


@pytest.mark.parametrize("routing", W.MOE_ROUTINGS)
@pytest.mark.parametrize("t, e, k", [(1, 8, 2), (13, 6, 2), (7, 5, 1), (64, 8, 8), (300, 64, 6), (257, 128, 8)])
def test_moe_routing_distinct_experts_in_range(routing, t, e, k):
    ids, w = W.make_moe_routing(t, e, k, routing)
    assert ids.shape == w.shape == (t, k) and ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.device.type == w.device.type == "cpu"
    assert ids.min() >= 0 and ids.max() < e
    srt = ids.sort(dim=-1).values
    assert (srt[:, 1:] > srt[:, :-1]).all(), "each token's k experts are distinct"
    assert (w > 0).all() and torch.allclose(w.sum(-1), torch.ones(t)), "a softmax over the k choices"
    again = W.make_moe_routing(t, e, k, routing)
    assert torch.equal(again[0], ids) and torch.equal(again[1], w), "the same routing every time (fixed seed)"
    ids.fill_(-1)
    w.fill_(0)
    assert W.make_moe_routing(t, e, k, routing)[0].min() >= 0, "a caller's copy: the cached routing is untouched"
    with pytest.raises(ValueError, match="1 <= k <= E"):
        W.make_moe_routing(t, e, e + 1, routing)


def test_moe_routing_balance_and_skew():
    # E divides T*k; in the last two not T (tokens dealt k consecutive slots each, not overlapping)
    for t, e, k in ((48, 8, 2), (96, 8, 2), (8192, 64, 6), (1024, 128, 8), (9, 3, 3), (12, 8, 2), (20, 6, 3)):
        assert (_counts(W.make_moe_routing(t, e, k, "balanced")[0], e) == t * k // e).all(), (t, e, k)
    c = _counts(W.make_moe_routing(13, 6, 2, "balanced")[0], 6)
    assert c.max() - c.min() == 1, "otherwise off by one at most"
    ids, _ = W.make_moe_routing(64, 8, 2, "balanced")
    assert not torch.equal(ids[1], (ids[0] + 2) % 8), "the tokens are dealt in a shuffled order"
    for e, k in ((8, 2), (64, 6), (128, 8)):
        t = 8192
        mean = t * k / e
        z, r = (_counts(W.make_moe_routing(t, e, k, kind)[0], e) for kind in ("zipf", "random"))
        assert z.max() > 2 * mean and z.min() < mean / 2, (e, k, z.max() / mean)
        assert 0.7 * mean < r.min() and r.max() < 1.3 * mean, (e, k)
    with pytest.raises(ValueError, match="unknown routing 'skewed'"):
        W.make_moe_routing(4, 4, 1, "skewed")


def test_moe_workloads(capsys):
    wl, de = W.WORKLOADS["moe"], W.WORKLOADS["moe_decode"]
    full, quick = wl.cases(False), wl.cases(True)
    assert len(full) == 24 == len({c.label for c in full})
    assert [(c.dims["model"], c.dims["T"], c.dims["routing"]) for c in full] == [
        (m, t, r) for m in MOE_SHAPES for t in (8192, 16384) for r in ("balanced", "random", "zipf")]
    assert all((c.dims["d"], c.dims["n"], c.dims["E"], c.dims["k"]) == MOE_SHAPES[c.dims["model"]] and not c.small
               for c in full + quick)
    assert [(c.dims["model"], c.dims["T"], c.dims["routing"]) for c in quick] == [
        ("DeepSeek-V2-Lite", 8192, "random"), ("Qwen3-30B-A3B", 8192, "random"), ("Mixtral-8x7B", 8192, "random")]
    head = "DeepSeek-V2-Lite T8192 d2048 n1408 E64 k6 random"
    assert [c.label for c in full if c.headline] == [c.label for c in quick if c.headline] == [head]
    assert wl.modes == W.MODES and wl.grad_args == (0, 1, 2, 3) and wl.only_dtypes == (torch.bfloat16,)
    assert wl.measure_memory and not wl.compile_peer and wl.eager is W.moe_loop and wl.reference is W.moe_reference
    assert list(wl.peers()) == ["grouped_mm"] and wl.module == "warpforge.ops.moe"
    assert wl.liger[:2] == ("liger_kernel.ops.fused_moe", "LigerFusedMoEFunction") and not wl.liger_writes_inputs
    assert all(s in wl.notes for s in ("6*T*k*d*n", "balanced", "random", "zipf", "eager", "grouped_mm", "Liger",
                                       "host sync", "extra GiB"))

    # the FLOP and byte models at the headline case: every expert gets tokens there
    c = _case("moe", head)
    T, d, n, E, k = 8192, 2048, 1408, 64, 6
    f = 6 * T * k * d * n
    assert wl.flops(c, "fwd") == f == 850_403_524_608
    assert wl.flops(c, "bwd") == 2 * f and wl.flops(c, "fwd+bwd") == 3 * f
    assert W.moe_active_experts(c) == E
    weights = 3 * E * d * n * 2
    assert wl.bytes(c, "fwd", 2) == weights + 2 * T * d * 2 + 8 * T * k
    assert wl.bytes(c, "bwd", 2) == 2 * weights + 3 * T * d * 2 + 12 * T * k
    assert wl.bytes(c, "fwd+bwd", 2) == wl.bytes(c, "fwd", 2) + wl.bytes(c, "bwd", 2)
    for case in full + quick:
        assert all(wl.flops(case, m) > 0 and wl.bytes(case, m, 2) > 0 for m in wl.modes)

    # decode: a workload of its own (forward only), bytes = the weights of the experts it touches
    dfull, dquick = de.cases(False), de.cases(True)
    assert [(c.dims["model"], c.dims["T"], c.dims["routing"]) for c in dfull] == [
        (m, t, r) for m in MOE_SHAPES for t in (1, 8, 64, 256)
        for r in (("random",) if t == 1 else ("balanced", "random", "zipf"))]
    assert len({c.label for c in dfull}) == len(dfull) == 40
    assert [(c.dims["model"], c.dims["T"]) for c in dquick] == [
        (m, t) for m in ("DeepSeek-V2-Lite", "Qwen3-30B-A3B", "Mixtral-8x7B") for t in (1, 64)]
    assert all(c.small for c in dfull) and all(c.small and c.dims["routing"] == "random" for c in dquick)
    assert [c.label for c in dfull if c.headline] == [c.label for c in dquick if c.headline] == [
        "DeepSeek-V2-Lite T64 d2048 n1408 E64 k6 random"]
    assert de.modes == ("fwd",) and de.measure_memory and not de.compile_peer and de.eager is W.moe_loop
    assert list(de.peers()) == ["grouped_mm", "grouped_mm[graph]"] and de.liger == wl.liger and de.module == wl.module
    assert list(de.ours()) == ["warpforge", "warpforge[validated]", "warpforge[graph]"] and "CUDA graph" in de.notes
    # the [graph] rows capture a CUDA graph: declined (a skipped row, not a failure) off CUDA
    with pytest.raises(W.Skipped, match="CUDA"):
        de.ours()["warpforge[graph]"](*de.make(de.check_cases()[0], torch.bfloat16, "cpu"))
    one = _case("moe_decode", "Mixtral-8x7B T1 d4096 n14336 E8 k2 random")
    assert W.moe_active_experts(one) == 2
    assert de.bytes(one, "fwd", 2) == 3 * 2 * 4096 * 14336 * 2 + 2 * 4096 * 2 + 8 * 2
    assert de.flops(one, "fwd") == 6 * 2 * 4096 * 14336
    eight = _case("moe_decode", "DeepSeek-V2-Lite T8 d2048 n1408 E64 k6 random")
    ids, _ = W.make_moe_routing(8, 64, 6, "random")
    assert W.moe_active_experts(eight) == len(set(ids.flatten().tolist())) < 48, "counted, not min(E, T*k)"

    # registered, and listed where the known ops are named
    assert [w.name for w in W.get(["moe", "moe_decode"])] == ["moe", "moe_decode"]
    with pytest.raises(ValueError, match="known: .*moe, moe_decode"):
        W.get(["nope"])
    from warpforge import cli
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "moe, moe_decode" in " ".join(capsys.readouterr().out.split())


def test_moe_inputs_and_plain_peers_against_the_reference():
    """The inputs (shapes, dtypes, routing from make_moe_routing, outputs O(1)); the loop (eager) against
    the reference forward and backward; the pipelines agree with each other."""
    wl = W.WORKLOADS["moe"]
    for case in wl.check_cases() + W.WORKLOADS["moe_decode"].check_cases():
        dm = case.dims
        t, d, n, e, k = dm["T"], dm["d"], dm["n"], dm["E"], dm["k"]
        x, w1, w2, tw, ti = args = wl.make(case, torch.bfloat16, "cpu")
        assert x.shape == (t, d) and w1.shape == (e, 2 * n, d) and w2.shape == (e, d, n)
        assert x.dtype == w1.dtype == w2.dtype == torch.bfloat16
        assert tw.shape == ti.shape == (t, k) and tw.dtype == torch.float32 and ti.dtype == torch.int32
        ids, weights = W.make_moe_routing(t, e, k, dm["routing"])
        assert torch.equal(ti, ids) and torch.equal(tw, weights)
        ref = W.moe_reference(*args)
        assert ref.dtype == torch.float32 and ref.shape == (t, d) and 0.1 < ref.std() < 3, case.label
        out = W.moe_loop(*args)
        assert out.dtype == torch.bfloat16 and runner.rel_err(out, ref) < 2e-2, case.label
        assert runner.rel_err(W.moe_loop(x, w1, w2, tw, ti.long()), ref) < 2e-2, "int64 ids too"

        # float32 against the float64 reference, forward and the four gradients
        args32 = wl.make(case, torch.float32, "cpu")
        a = runner.with_grad(args32, wl.grad_args)
        r = runner._float64(args32, wl.grad_args, grad=True)
        out, ref = W.moe_loop(*a), W.moe_reference(*r)
        assert ref.dtype == torch.float64 and runner.rel_err(out, ref) < 1e-5
        dy = torch.randn_like(out)
        got = torch.autograd.grad(out, [a[i] for i in wl.grad_args], dy)
        want = torch.autograd.grad(ref, [r[i] for i in wl.grad_args], dy.double())
        for g, gw, what in zip(got, want, ("x", "w_gate_up", "w_down", "topk_weights")):
            assert g.dtype == torch.float32, what
            assert runner.rel_err(g, gw) < 1e-5, (case.label, what)


def test_moe_grouped_mm_peer():
    """The grouped_mm peer declines off CUDA (a Skipped row, not a failure); the pipeline itself
    agrees with the reference wherever this torch runs torch._grouped_mm (the forward on CPU too)."""
    wl = W.WORKLOADS["moe"]
    case = wl.check_cases()[0]
    args = wl.make(case, torch.bfloat16, DEVICE)
    if DEVICE == "cpu":
        with pytest.raises(W.Skipped, match="CUDA only"):
            W._grouped_mm_peer(*args)
    if not hasattr(torch, "_grouped_mm"):
        with pytest.raises(W.Skipped, match="no torch._grouped_mm"):
            W._grouped_mm_peer(*args)
        pytest.skip("this torch has no torch._grouped_mm")
    try:
        out = W.moe_grouped_mm(*args)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._grouped_mm does not run here: {e}")
    ref = W.moe_reference(*args)
    assert out.dtype == torch.bfloat16 and runner.rel_err(out, ref) < 2e-2
    assert runner.rel_err(out, W.moe_loop(*args)) < 2e-2


def test_moe_liger_adapter():
    """Liger's apply takes (x, gate_up_proj, down_proj, top_k_index int32, top_k_weights)."""
    seen = []

    class FakeLiger:
        @staticmethod
        def apply(*a):
            seen.append(a)
            return a[0]

    x, w1, w2, tw, ti = W.WORKLOADS["moe"].make(W.WORKLOADS["moe"].check_cases()[0], torch.bfloat16, "cpu")
    W._liger_moe(FakeLiger)(x, w1, w2, tw, ti.long())
    (a,) = seen
    assert a[0] is x and a[1] is w1 and a[2] is w2 and a[4] is tw
    assert a[3].dtype == torch.int32 and torch.equal(a[3], ti)


def test_check_run_moe_workloads(monkeypatch):
    """The MoE workloads' inputs, calls and float64 reference wired up in the correctness run (bf16
    only), with the plain-PyTorch loop standing in for ours (the real op: the next test)."""
    wls = [W.WORKLOADS["moe"], W.WORKLOADS["moe_decode"]]
    for wl in wls:
        monkeypatch.setattr(wl, "ours_fn", lambda get: {"warpforge": W.moe_loop})
    res = runner.run_check(wls, [torch.float32, torch.bfloat16])
    assert [(r["op"], r["dtype"], r["direction"], r["status"]) for r in res.rows] == [
        (wl.name, "bf16", d, "ok") for wl in wls for _ in wl.check_cases() for d in ("fwd", "bwd")]
    assert all(r["ok"] and r["rel_err"] < 1e-2 for r in res.rows)


def test_check_run_moe_real_op():
    """warpforge.ops.moe.moe_experts through the correctness run (the interpreter on a CPU); skipped
    until the op exists."""
    wls = [W.WORKLOADS["moe"], W.WORKLOADS["moe_decode"]]
    try:
        wls[0].ours()
    except W.OpUnavailable as e:
        pytest.skip(f"moe_experts not available yet: {e}")
    res = runner.run_check(wls, [torch.bfloat16], device=DEVICE)
    # fwd and bwd of every row; a row whose forward declined the device (a CUDA graph off CUDA) has no bwd
    declined = sum(r["direction"] == "fwd" and r["status"].startswith("skipped") for r in res.rows)
    assert declined == (len(wls[1].check_cases()) if str(DEVICE) == "cpu" else 0)
    assert len(res.rows) == 2 * sum(len(wl.ours()) * len(wl.check_cases()) for wl in wls) - declined
    bad = [(r["op"], r["shape"], r["direction"], r["status"], r["rel_err"]) for r in res.rows if not r["ok"]]
    assert not bad, bad


def test_bench_runner_moe(monkeypatch):
    """The moe workload through the GPU runner (timers and memory counters replaced, ours the loop):
    bf16 only; eager (the loop) and grouped_mm as peers (grouped_mm a skipped row off CUDA); no
    compile row; extra_gib and vs_peers on our rows; every mode."""
    wl = W.WORKLOADS["moe"]
    monkeypatch.setattr(wl, "ours_fn", lambda get: {"warpforge": W.moe_loop})
    monkeypatch.setattr(wl, "cases", lambda quick: [W._moe_case("tiny", 32, 24, 6, 2, 16, "zipf", headline=True)])
    times = {"warpforge": 1.0, "eager": 2.0, "grouped_mm": 1.6}
    current = {}
    _fake_timers(monkeypatch, times, current)
    gib = {"warpforge": 0.25, "eager": 1.0, "grouped_mm": 0.5}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: int(2**30 * (1 + gib[current["impl"]])))
    res = runner.run_bench([wl], list(W.MODES), [torch.float32, torch.bfloat16], use_compile=True, use_liger=False,
                           copy_gbps=1.0, device=DEVICE)
    assert any("compile: not a peer of this op" in n and "moe" in n for n in res.notes)
    assert any(n.startswith("moe: x (T, d) through E SwiGLU experts") for n in res.notes)
    rows = {(r["mode"], r["impl"]): r for r in res.rows}
    assert {r["dtype"] for r in res.rows} == {"bf16"} and {m for m, _ in rows} == set(W.MODES)
    assert {i for _, i in rows} == {"warpforge", "eager", "grouped_mm"}
    for mode in W.MODES:
        ours, gm = rows[mode, "warpforge"], rows[mode, "grouped_mm"]
        assert ours["status"] == "ok" and ours["extra_gib"] == pytest.approx(0.25)
        assert ours["flops"] == wl.flops(wl.cases(False)[0], mode)
        assert rows[mode, "eager"]["status"] == "ok" and rows[mode, "eager"]["extra_gib"] == pytest.approx(1.0)
        if DEVICE == "cpu":
            assert gm["status"] == "skipped: torch._grouped_mm is timed on CUDA only, not cpu"
        else:   # a GPU whose torch cannot run it: a failed row, never a stopped run
            assert gm["status"] == "ok" or gm["status"].startswith(("failed: ", "skipped: ")), gm
        ran = [p for p in ("eager", "grouped_mm") if rows[mode, p]["status"] == "ok"]
        assert ours["vs_peers"] == {p: times[p] for p in ran}
        assert ours["best_peer"] == ("grouped_mm" if "grouped_mm" in ran else "eager")
    assert rows["fwd", "warpforge"]["err_vs_eager"] < 1e-2


def test_fill_ratios_rules():
    """One group's ratios: the best peer is the fastest peer that ran (never a failed one, never a
    reference); ratio = best peer ms / ms on every ok row but a reference's; vs_ref = ms / reference
    ms; vs_peers = peer ms / ms on every ok row that is not a peer. Failed and skipped rows get the
    best peer's name and nothing else (and never stop the rest)."""
    def row(impl, kind, ms, status="ok"):
        return {"impl": impl, "kind": kind, "ms": ms, "status": status, "best_peer": None, "best_peer_ms": None,
                "ratio": None, "vs_ref": None, "vs_peers": None}

    rows = [row("warpforge", "ours", 1.0), row("warpforge[cuda]", "ours", None, "failed: RuntimeError: x"),
            row("warpforge[graph]", "ours", None, "skipped: CUDA only"), row("eager", "peer", 4.0),
            row("compile", "peer", 2.0), row("liger", "peer", None, "failed: ImportError: y"),
            row("sdpa[math]", "peer", 8.0), row("cublas_gemms", "ref", 0.5)]
    runner._fill_ratios(rows)
    by = {r["impl"]: r for r in rows}
    for r in rows:
        if r["kind"] != "ref":
            assert (r["best_peer"], r["best_peer_ms"]) == ("compile", 2.0), r
    assert {i: r["ratio"] for i, r in by.items()} == {
        "warpforge": 2.0, "warpforge[cuda]": None, "warpforge[graph]": None, "eager": 0.5, "compile": 1.0,
        "liger": None, "sdpa[math]": 0.25, "cublas_gemms": None}
    assert by["cublas_gemms"]["best_peer"] is None and by["cublas_gemms"]["vs_ref"] is None
    assert by["warpforge"]["vs_ref"] == {"cublas_gemms": 2.0} and by["eager"]["vs_ref"] == {"cublas_gemms": 8.0}
    assert by["warpforge"]["vs_peers"] == {"eager": 4.0, "compile": 2.0, "sdpa[math]": 8.0}
    assert by["cublas_gemms"]["vs_peers"] == {"eager": 8.0, "compile": 4.0, "sdpa[math]": 16.0}
    for impl in ("warpforge[cuda]", "warpforge[graph]", "eager", "compile", "liger", "sdpa[math]"):
        assert by[impl]["vs_peers"] is None, impl
        if by[impl]["status"] != "ok":
            assert by[impl]["vs_ref"] is None, impl

    # no peer ran: no best peer, no ratio; vs_ref still; rows without vs_peers (no named peers) stay so
    rows = [row("warpforge", "ours", 1.0), row("eager", "peer", None, "failed: OutOfMemoryError: z"),
            row("cublas_gemms", "ref", 4.0)]
    for r in rows:
        del r["vs_peers"]
    runner._fill_ratios(rows)
    assert [(r["best_peer"], r["ratio"]) for r in rows] == [(None, None)] * 3
    assert rows[0]["vs_ref"] == {"cublas_gemms": 0.25} and all("vs_peers" not in r for r in rows)


def test_upstream_grad():
    """A loss (scalar) is timed with dy = 1, as loss.backward() passes; any other output with a random dy."""
    assert runner.upstream_grad(torch.zeros((), dtype=torch.bfloat16)).item() == 1.0
    dy = runner.upstream_grad(torch.zeros(16, 32))
    assert dy.shape == (16, 32) and dy.std() > 0.5 and (dy != 1).all()


def _toy_workload(cases: list, **kw) -> W.Workload:
    """A workload of plain PyTorch calls (x * 2 on a (4, 8) input: the runner's arithmetic, not an
    op), its byte and FLOP models read from each case's dims."""
    def f(x):
        return x * 2

    return W.Workload(**{
        "name": "toy", "module": "warpforge.ops.toy", "cases": lambda quick: cases, "check_cases": list,
        "make": lambda c, dt, dev: (torch.randn(4, 8, dtype=dt, device=dev),), "grad_args": (0,),
        "ours_fn": lambda get: {"warpforge": f}, "eager": f,
        "bytes_fn": lambda c, m, s: c.dims["bytes"], "flops_fn": lambda c, m: c.dims["flops"], **kw})


def test_bench_rates_and_roofline(monkeypatch):
    """GB/s, TFLOP/s, % of copy and % of the attainable roof, min(copy bandwidth x FLOP/byte, the
    dtype's GEMM rate): a memory-bound case under the copy slope, a compute-bound one under the GEMM
    flat, in fp32 (no GEMM rate) under the memory roof alone; the summary's roof ms."""
    _fake_timers(monkeypatch, {"warpforge": 2.0, "eager": 4.0}, {})
    cases = [W.Case("mem", {"bytes": 3e9, "flops": 3e9}),                    # 1 FLOP/byte
             W.Case("gemm", {"bytes": 1e9, "flops": 1e12}, headline=True)]   # 1000 FLOP/byte
    res = runner.run_bench([_toy_workload(cases, compile_peer=False)], ["fwd"], [torch.bfloat16, torch.float32],
                           use_liger=False, copy_gbps=3000.0, gemm_tflops={torch.bfloat16: 700.0}, device=DEVICE)
    rows = {(r["dtype"], r["shape"], r["impl"]): r for r in res.rows}
    mem, gemm = rows["bf16", "mem", "warpforge"], rows["bf16", "gemm", "warpforge"]
    assert mem["gbps"] == pytest.approx(1500) and mem["tflops"] == pytest.approx(1.5)
    assert mem["pct_copy"] == pytest.approx(50)
    assert mem["pct_roof"] == pytest.approx(50), "the roof: 3000 GB/s x 1 FLOP/byte = 3 TFLOP/s"
    assert gemm["gbps"] == pytest.approx(500) and gemm["tflops"] == pytest.approx(500)
    assert gemm["pct_copy"] == pytest.approx(100 * 500 / 3000)
    assert gemm["pct_roof"] == pytest.approx(100 * 500 / 700), "3000 TFLOP/s of memory roof, capped at 700"
    assert rows["bf16", "gemm", "eager"]["pct_roof"] == pytest.approx(100 * 250 / 700)
    assert rows["fp32", "gemm", "warpforge"]["pct_roof"] == pytest.approx(100 * 500 / 3000), "no GEMM rate: memory roof"
    assert rows["fp32", "mem", "warpforge"]["pct_roof"] == pytest.approx(50)
    assert runner.attainable_tflops(10**12, 10**9, None, 700.0) is None
    (e,) = report.summary(res.rows)
    assert (e["dtype"], e["shape"], e["ours_ms"]) == ("bf16", "gemm", 2.0)
    assert e["floor_ms"] == pytest.approx(1e12 / 700e12 * 1e3), "the FLOPs at 700 TFLOP/s"


def test_bench_quick_compiles_large_cases_only(monkeypatch):
    """--quick: the compile peer on the large cases alone (each shape costs seconds of compilation),
    said in the notes; a full run compiles every case."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(kw) or fn)
    current = {}
    _fake_timers(monkeypatch, {"warpforge": 1.0, "warpforge[dispatch]": 1.2, "eager": 2.0, "compile": 1.5}, current)
    _tag_timed_impl(monkeypatch, current)   # the small case's alternating rounds too
    cases = [W.Case("1x8", {"bytes": 64, "flops": 64}, small=True),
             W.Case("4x8", {"bytes": 256, "flops": 256}, headline=True)]
    for quick in (True, False):
        compiled.clear()
        res = runner.run_bench([_toy_workload(cases)], ["fwd"], [torch.float32], quick=quick, use_liger=False,
                               copy_gbps=1.0, device=DEVICE)
        with_compile = {r["shape"] for r in res.rows if r["impl"] == "compile" and r["status"] == "ok"}
        assert with_compile == ({"4x8"} if quick else {"1x8", "4x8"}), quick
        assert compiled == [{"dynamic": False}] * len(with_compile)
        assert any(n.startswith("quick: the compile peer runs on the large shapes only") for n in res.notes) == quick
        assert next(r for r in res.rows if r["shape"] == "1x8" and r["impl"] == "warpforge")["best_peer"] == \
            ("eager" if quick else "compile")


def test_select_cases_small_only_and_match():
    """The timing sweep or the correctness cases; --small: the decode-like cases alone; --match: a
    regular expression found anywhere in the label (re.search)."""
    cases = [W.Case("1x33", {}, small=True), W.Case("4x33", {}, headline=True), W.Case("T256x8", {})]
    wl = _toy_workload(cases, check_cases=lambda: [W.Case("2x37", {}), W.Case("3x5", {})])

    def labels(**kw):
        return [c.label for c in runner.select_cases(wl, **kw)]

    assert labels() == ["1x33", "4x33", "T256x8"] and labels(small_only=True) == ["1x33"]
    assert labels(match="x33$") == ["1x33", "4x33"], "re.search: anywhere in the label"
    assert labels(match="256") == ["T256x8"] and labels(match="256", small_only=True) == []
    assert labels(check=True, small_only=True) == ["2x37", "3x5"] and labels(check=True, match="x5") == ["3x5"]


# ---------------------------------------------------------------------------------------------- reports
def _rows():
    rows = []
    for op in ("softmax", "rms_norm"):
        for mode in ("fwd", "fwd+bwd"):
            for impl, kind, ms in (("warpforge", "ours", 0.10), ("eager", "peer", 0.20),
                                   ("compile", "peer", 0.15), ("liger", "peer", None)):
                nbytes = 2**28 * (1 if mode == "fwd" else 2.5)
                r = {"op": op, "mode": mode, "dtype": "bf16", "shape": "32768x4096", "dims": {"M": 32768, "N": 4096},
                     "small": False, "headline": True, "impl": impl, "kind": kind,
                     "status": "ok" if ms else "failed: ImportError: x", "ms": ms, "host_us": None,
                     "bytes": nbytes, "flops": nbytes, "best_peer": "compile", "best_peer_ms": 0.15}
                if ms:
                    r.update(gbps=nbytes / ms / 1e6, tflops=nbytes / ms / 1e9, pct_copy=nbytes / ms / 1e6 / 30,
                             ratio=0.15 / ms)
                rows.append(r)
    return rows


def test_summary_from_synthetic_rows():
    s = report.summary(_rows())
    assert [(e["op"], e["mode"]) for e in s] == [("softmax", "fwd"), ("softmax", "fwd+bwd"),
                                                 ("rms_norm", "fwd"), ("rms_norm", "fwd+bwd")]
    assert s[0]["best_peer"] == "compile" and s[0]["ratio"] == pytest.approx(1.5)
    assert s[0]["ours_pct"] == pytest.approx(2**28 / 0.1 / 1e6 / 30)
    assert s[0]["peer_pct"] == pytest.approx(2**28 / 0.15 / 1e6 / 30)
    assert s[0]["geomean_ratio"] == pytest.approx(1.5)


def test_summary_headline_geomean_and_roof():
    """The summary's entry: the summary dtype (bf16, though an fp32 run comes first), the headline
    shape's warpforge row (not the first large shape's), % of the roof before % of copy, for ours and
    the best peer; the geomean ratio over warpforge's large rows alone (no decode-sized row, no variant)."""
    def row(shape, impl, kind, ms, ratio, dtype="bf16", headline=False, small=False, pct_roof=None):
        return {"op": "softmax", "mode": "fwd", "dtype": dtype, "shape": shape, "impl": impl, "kind": kind,
                "status": "ok", "ms": ms, "ratio": ratio, "best_peer": "eager", "headline": headline,
                "small": small, "pct_copy": 25.0, "pct_roof": pct_roof}

    rows = [row("H", "warpforge", "ours", 9.0, 9.0, dtype="fp32", headline=True),
            row("A", "warpforge", "ours", 0.5, 3.0), row("A", "eager", "peer", 1.5, 1.0),
            row("H", "warpforge", "ours", 2.0, 1.5, headline=True, pct_roof=60.0),
            row("H", "warpforge[v]", "ours", 3.75, 0.8, headline=True),
            row("H", "eager", "peer", 3.0, 1.0, headline=True, pct_roof=40.0),
            row("S", "warpforge", "ours", 0.01, 0.5, small=True)]
    (e,) = report.summary(rows)
    assert (e["dtype"], e["shape"], e["ours_ms"], e["best_peer"], e["ratio"]) == ("bf16", "H", 2.0, "eager", 1.5)
    assert e["ours_pct"] == 60.0 and e["peer_pct"] == 40.0, "% of the roof where the rows have it"
    assert e["floor_ms"] == pytest.approx(1.2)
    assert e["geomean_ratio"] == pytest.approx(math.sqrt(3.0 * 1.5)), "warpforge's large rows, geometric mean"


def test_write_results(tmp_path):
    meta = {"date": "2026-01-01", "torch": torch.__version__, "triton": "3.6", "warpforge": "0.1.0",
            "device": {"name": "Fake GPU"}, "ceilings": {"copy_gbps": 3000.0, "bf16_tflops": 700.0,
                                                         "fp16_tflops": 700.0}}
    written = report.write_results(tmp_path, _rows(), meta, ["peer absent -- liger: test"])
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["ceilings"]["copy_gbps"] == 3000.0 and len(data["rows"]) == 16
    assert {"op", "mode", "dtype", "shape", "impl", "ms", "gbps", "tflops", "pct_copy", "ratio", "status"} <= set(data["rows"][0])
    md = (tmp_path / "results.md").read_text()
    assert "## Summary" in md and "## softmax" in md and "## rms_norm" in md
    assert "failed: ImportError" in md and "1.50x" in md
    if report.have_matplotlib():
        assert (tmp_path / "roofline.png").stat().st_size > 10_000
        assert tmp_path / "roofline.png" in written
    else:
        assert not (tmp_path / "roofline.png").exists()


def test_plain_text_fallback(monkeypatch, capsys):
    monkeypatch.setattr(report, "have_rich", lambda: False)
    report.print_table(_rows()[:2], report.BENCH_COLUMNS, title="softmax")
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "softmax" and "warpforge" in out and "2.00x" not in out
    assert report.default_out_dir("NVIDIA H100 80GB HBM3").name.startswith("nvidia-h100-80gb-hbm3-")


# ---------------------------------------------------------------------------------------------- timing
def test_timing_method_on_cpu_is_none():
    """Without CUDA there is no timing condition (the correctness run times wall clock only)."""
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    assert timing.method(2**30) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: times GPU work")
def test_device_ms_conditions_on_gpu():
    """The condition follows the byte count (>= 4 L2s: steady, back to back; else clean flushes),
    and both give a plausible time: a copy in either condition lands between a tenth and 1.3x of the
    measured copy ceiling (not a benchmark: a guard against a timer that measures the host, an empty
    region or the L2)."""
    from warpforge.runtime.device import ceilings

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy = ceilings()["copy_gbps"]
    cfg = timing.TimingConfig.quick()
    for n, want in ((2**20, "clean"), (4 * l2, "steady")):
        src = torch.randn(n // 2, device="cuda", dtype=torch.bfloat16)   # n bytes read + n written
        dst = torch.empty_like(src)
        nbytes = 2 * n
        assert timing.method(nbytes) == want
        ms = timing.device_ms(lambda: dst.copy_(src), cfg, nbytes)
        gbps = nbytes / ms / 1e6
        assert math.isfinite(ms) and ms > 0
        if want == "steady":
            assert 0.1 * copy < gbps < 1.3 * copy, (gbps, copy)


class _FakeGPU:
    """timing.py's CUDA calls on a fake clock (ms) shared by the host and the GPU, as if each call
    ran on the GPU as it is issued: each call of :meth:`fn` takes the next of ``durations``
    (cycled), a flush 100 ms, a sleep its cycles at 1e6 cycles/ms, a synchronize 0.5 ms; an event
    reads the clock when recorded, time.perf_counter reads it too. The L2 is 1,000 bytes."""

    def __init__(self, monkeypatch, durations):
        import types

        self.now, self.durations, self.calls = 0.0, durations, []
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = gpu.now

            def elapsed_time(self, end):
                return end.t - self.t

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(L2_cache_size=1000))
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: self.tick(0.5))
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: self.tick(cycles / 1e6))
        monkeypatch.setitem(timing._CYCLES_PER_MS, 0, 1e6)
        monkeypatch.setattr(timing, "flush_l2", lambda: self.tick(100.0))
        monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: self.now / 1e3))

    def tick(self, ms: float) -> None:
        self.now += ms

    def fn(self) -> None:
        self.calls.append(self.durations[len(self.calls) % len(self.durations)])
        self.tick(self.calls[-1])


def test_device_ms_and_host_us_on_a_fake_clock(monkeypatch):
    """device_ms's two conditions and host_us, with CUDA's events, sleeps, flush and synchronize on a
    fake clock: which condition (>= 4 L2s: steady), how many calls (estimate, warm-up, host-time
    probe, timed), what the events bracket (no flush inside), and the median (clean: of the calls;
    steady: of the batches' per-call means). Calls take 1, 1, 1, 1, 6 ms in turn: the estimate
    (5 calls) reads 2 ms, so warm-up int(5 / 2) = 2 calls, then 3 host-time calls."""
    gpu = _FakeGPU(monkeypatch, [1.0, 1.0, 1.0, 1.0, 6.0])
    assert timing.method(4000) == "steady" and timing.method(3999) == "clean"
    assert timing.method(None) == timing.method(0) == "clean"
    cfg = timing.TimingConfig(warmup_ms=5.0, rep_ms=40.0, clean_calls=15)

    # clean: min(max(int(40 / 2), 10), 15) = 15 single calls, their median (mean: 2.0)
    ms = timing.device_ms(gpu.fn, cfg, nbytes=3999)
    assert len(gpu.calls) == 5 + 2 + 3 + 15
    assert gpu.calls[-15:].count(6.0) == 3 and ms == pytest.approx(1.0)

    # steady: batches of min(max(ceil(2 / 2), 4), 64) = 4 calls, min(max(int(40 / 8), 5), 100) = 5
    # batches; the median of their per-call means (the mean of those: 2.0)
    gpu = _FakeGPU(monkeypatch, [1.0, 1.0, 1.0, 1.0, 6.0])
    ms = timing.device_ms(gpu.fn, cfg, nbytes=4000)
    assert len(gpu.calls) == 5 + 2 + 3 + 5 * 4
    timed = gpu.calls[-20:]
    assert sorted(sum(timed[i:i + 4]) / 4 for i in range(0, 20, 4)) == [1.0, 2.25, 2.25, 2.25, 2.25]
    assert ms == pytest.approx(2.25)

    # host_us: 10 calls of 2 ms after 3 warm-up calls; the clock stops after the synchronize (0.5 ms)
    # with include_device, before it without
    gpu = _FakeGPU(monkeypatch, [2.0])
    assert timing.host_us(gpu.fn, calls=10, warmup=3) == pytest.approx(2050.0)
    assert timing.host_us(gpu.fn, calls=10, warmup=3, include_device=False) == pytest.approx(2000.0)
    assert len(gpu.calls) == 2 * (3 + 10)


# ---------------------------------------------------------------------------------------------- models by hand
def _nb(*tensors) -> int:
    """Bytes of the tensors, as stored."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _hand_bytes(name: str, args: tuple, out) -> dict:
    """Each op's byte floor counted from its definition on the actual tensors: every input it reads
    once, every output it writes once (a gradient has its tensor's shape and dtype; tables, scales,
    block tables and saved statistics are not counted). Independent of workloads.py's formulas."""
    nb = _nb
    if name == "add":
        return {"fwd": nb(*args, out)}
    if name == "sum":
        return {"fwd": nb(args[0], out)}
    if name == "amax":   # bwd: read x and the row's dy, write dx
        x = args[0]
        return {"fwd": nb(x, out), "bwd": nb(x, out, x)}
    if name in ("softmax", "log_softmax"):   # bwd: read y and dy, write dx
        x = args[0]
        return {"fwd": nb(x, out), "bwd": nb(out, out, x)}
    if name == "layer_norm":   # bwd: read x, dy and w (not b); write dx, dw, db
        x, w, b = args
        return {"fwd": nb(x, w, b, out), "bwd": nb(x, out, w) + nb(x, w, b)}
    if name == "rms_norm":
        x, w = args
        return {"fwd": nb(x, w, out), "bwd": nb(x, out, w) + nb(x, w)}
    if name == "add_rms_norm":   # bwd: read h, dy, dh and w; write one dx (= d residual) and dw
        x, r, w = args
        y, h = out
        return {"fwd": nb(x, r, w, y, h), "bwd": nb(h, y, h, w) + nb(x, w)}
    if name in ("swiglu", "geglu"):
        g, u = args
        return {"fwd": nb(g, u, out), "bwd": nb(g, u, out) + nb(g, u)}
    if name == "rope":   # bwd: read dq_out, dk_out, write dq, dk
        q, k = args[:2]
        return {"fwd": nb(q, k, *out), "bwd": nb(*out, q, k)}
    if name == "matmul":   # bwd: read dC, A and W; write dA and dW
        a, w = args
        return {"fwd": nb(a, w, out), "bwd": nb(out, a, w) + nb(a, w)}
    if name == "matmul_bwd":   # its one row is the pair dX = dY @ W, dW = dY^T @ X
        x, w, dy = args
        return {"fwd": nb(dy, w, x) + nb(x, w)}
    if name == "linear_gelu":
        return {"fwd": nb(*args, out)}
    if name == "fp8_matmul":   # the e4m3 operands (1 byte each), the bf16 product
        return {"fwd": nb(args[0], args[1], out)}
    if name == "cross_entropy":   # fwd+bwd: and write dlogits
        x, t = args
        return {"fwd": nb(x, t), "fwd+bwd": nb(x, t) + nb(x)}
    if name == "linear_cross_entropy":   # fwd+bwd: and write dh, dW
        h, w, t = args
        return {"fwd": nb(h, w, t), "fwd+bwd": nb(h, w, t) + nb(h, w)}
    if name in ("attention", "attention_dropout", "attention_softcap"):   # bwd: read q, k, v, o, do; write dq, dk, dv
        q, k, v = args[:3]
        return {"fwd": nb(q, k, v, out), "bwd": nb(q, k, v, out, out) + nb(q, k, v)}
    if name in ("decode_attention", "decode_attention_window"):   # q, the keys and values attended (k4/v4
        q, k4, v4 = args[0], args[6], args[7]   # hold exactly those, not the pool's slack), out
        return {"fwd": nb(q, k4, v4, out)}
    if name == "decode_attention_fp8":   # the same keys and values at one byte each
        q, k4, v4 = args[0], args[6], args[7]
        return {"fwd": nb(q, out) + k4.numel() + v4.numel()}
    if name in ("moe", "moe_decode"):
        x, w1, w2, tw, ti = args
        active = torch.unique(ti.long())
        weights = nb(w1[active], w2[active])   # the experts that get a token
        fwd = weights + nb(x, tw, ti, out)
        # bwd: those weights again, dW of every expert, x and dy read, dx written, the routing
        # read and d(topk_weights) written
        bwd = weights + nb(w1, w2) + nb(x, out, x) + nb(tw, ti) + nb(tw)
        return {"fwd": fwd, "bwd": bwd}
    raise AssertionError(f"no hand count for {name}")


def _hand_flops(name: str, case: W.Case) -> dict | None:
    """The GEMM-shaped ops' FLOPs from their matrix products (the row ops' few per element are a
    convention, not counted here)."""
    d = case.dims
    if name in ("matmul", "linear_gelu", "fp8_matmul"):
        f = 2 * d["M"] * d["N"] * d["K"]
        return {"fwd": f, "bwd": 2 * f}          # bwd: dA and dW, one GEMM each
    if name == "matmul_bwd":
        return {"fwd": 4 * d["M"] * d["N"] * d["K"]}
    if name == "linear_cross_entropy":   # logits; then dh and dW
        f = 2 * d["T"] * d["V"] * d["H"]
        return {"fwd": f, "fwd+bwd": 3 * f}
    if name in ("attention", "attention_dropout", "attention_softcap"):   # QK^T and PV per head (the causal half counted as S^2 / 2); bwd 2.5x
        f = 2 * 2 * d["B"] * d["Hq"] * d["S"] * d["S"] * d["D"] // (2 if d["causal"] else 1)
        return {"fwd": f, "bwd": f * 5 // 2}
    if name in ("decode_attention", "decode_attention_fp8"):   # q.K^T and p.V over ctx cached tokens, per query head
        return {"fwd": 2 * 2 * d["B"] * d["Hq"] * d["ctx"] * d["D"]}
    if name == "decode_attention_window":   # the same over the window's keys
        return {"fwd": 2 * 2 * d["B"] * d["Hq"] * min(d["window"], d["ctx"]) * d["D"]}
    if name in ("moe", "moe_decode"):   # per routed token: gate and up (d -> 2n), down (n -> d)
        f = d["T"] * d["k"] * (2 * d["d"] * 2 * d["n"] + 2 * d["n"] * d["d"])
        return {"fwd": f, "bwd": 2 * f}
    return None


def test_byte_and_flop_models_against_hand_counts():
    """Every workload's byte model (and the GEMM-shaped ones' FLOP model) against a count from the
    op's definition on the tensors its ``make`` builds, for each check case, each mode and each
    element size it runs in: a term dropped, counted twice or taken from the wrong tensor fails."""
    for wl in W.WORKLOADS.values():
        dtypes = [d for d in (torch.bfloat16, torch.float32) if wl.only_dtypes is None or d in wl.only_dtypes]
        for case in wl.check_cases():
            for dtype in dtypes:
                args = wl.make(case, dtype, "cpu")
                with torch.no_grad():
                    out = wl.eager(*args)
                hand = _hand_bytes(wl.name, args, out)
                hand["fwd+bwd"] = hand.get("fwd+bwd", hand["fwd"] + hand.get("bwd", 0))
                s = torch.finfo(dtype).bits // 8
                for mode in wl.modes:
                    assert wl.bytes(case, mode, s) == hand[mode], (wl.name, case.label, mode, dtype)
            hf = _hand_flops(wl.name, case)
            if hf is not None:
                hf["fwd+bwd"] = hf.get("fwd+bwd", hf["fwd"] + hf.get("bwd", 0))
                for mode in wl.modes:
                    assert wl.flops(case, mode) == hf[mode], (wl.name, case.label, mode)
    # moe's modes that a decode workload does not run, on a case where 2 of the 6 experts get tokens:
    # the backward writes dW for all 6
    moe, case = W.WORKLOADS["moe"], W.WORKLOADS["moe_decode"].check_cases()[0]
    args = moe.make(case, torch.bfloat16, "cpu")
    assert W.moe_active_experts(case) == 2 < case.dims["E"]
    hand = _hand_bytes("moe", args, W.moe_loop(*args))
    assert moe.bytes(case, "bwd", 2) == hand["bwd"] and moe.bytes(case, "fwd+bwd", 2) == hand["fwd"] + hand["bwd"]


# ---------------------------------------------------------------------------------------------- sweeps
HEADLINES = {"add": "n=2^28", "sum": "32768x4096", "amax": "32768x4096", "softmax": "32768x4096",
             "log_softmax": "32768x4096", "layer_norm": "32768x4096", "rms_norm": "32768x4096",
             "add_rms_norm": "32768x4096", "swiglu": "16384x14336", "geglu": "16384x14336",
             "rope": "q4x32x4096x128 k4x8x4096x128", "matmul": "8192^3", "matmul_bwd": "8192^3",
             "linear_gelu": "8192x3072x768", "fp8_matmul": "8192x8192x8192", "cross_entropy": "8192x128256",
             "linear_cross_entropy": "8192x128256 H=4096", "attention": "B4 H32/32 S4096 D128 non-causal",
             "attention_dropout": "B4 H32/32 S4096 D128 non-causal",
             "attention_softcap": "B4 H32/16 S4096 D128 causal cap50",
             "decode_attention": "B16 ctx32768 H32/8 D128 block16",
             "decode_attention_fp8": "B16 ctx32768 H32/8 D128 block16",
             "decode_attention_window": "B16 ctx32768 window4096 H32/8 D128 block16",
             "moe": "DeepSeek-V2-Lite T8192 d2048 n1408 E64 k6 random",
             "moe_decode": "DeepSeek-V2-Lite T64 d2048 n1408 E64 k6 random"}


def test_headlines_and_the_issue_bars_shapes():
    """The headline of every workload (the summary table's and the README's shape), full and quick;
    and the shapes the issues' bars are judged on are in the sweeps."""
    assert set(HEADLINES) == EXPECTED_OPS
    for wl in W.WORKLOADS.values():
        for quick in (False, True):
            assert [c.label for c in wl.cases(quick) if c.headline] == [HEADLINES[wl.name]], (wl.name, quick)
    # softmax: the CUDA path's bar, 16384 x {4096, 8192, 32768} and 512 x 262144 (issue 3), both sweeps
    for quick in (False, True):
        labels = {c.label for c in W.WORKLOADS["softmax"].cases(quick)}
        assert {"16384x4096", "16384x8192", "16384x32768", "512x262144"} <= labels, quick
    # matmul (issue 4): 4096^3, 8192^3 and Llama-3-8B's four (N, K) at M in {16, 128, 4096, 16384}
    mm = [(c.dims["M"], c.dims["N"], c.dims["K"]) for c in W.WORKLOADS["matmul"].cases(False)]
    llama = [(m, n, k) for m in (16, 128, 4096, 16384) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336),
                                                                    (128256, 4096))]
    assert mm == [(4096,) * 3, (8192,) * 3] + llama
    assert [(c.dims["M"], c.dims["N"], c.dims["K"]) for c in W.WORKLOADS["matmul_bwd"].cases(False)] == mm[1:]
    assert [c.label for c in W.WORKLOADS["matmul"].cases(False) if c.dims.get("ladder")] == ["4096^3", "16x4096x4096"]
    assert [c.label for c in W.WORKLOADS["linear_gelu"].cases(False)] == ["8192x3072x768", "8192x4096x1024",
                                                                         "4096x14336x4096"]
    assert [c.label for c in W.WORKLOADS["fp8_matmul"].cases(False)] == [
        "8192x8192x8192", "4096x4096x4096", "4096x14336x4096", "16384x4096x14336"]


def test_inputs_contiguous_in_the_dtype_asked():
    """Every tensor ``make`` builds is contiguous (a strided input would time another layout) and in
    the benchmark dtype, except the documented ones: fp8 operands and their fp32 scales, MoE's fp32
    routing weights, integer ids, targets, block tables and lengths."""
    fixed = {("fp8_matmul", 0), ("fp8_matmul", 1), ("fp8_matmul", 2), ("fp8_matmul", 3), ("moe", 3),
             ("moe_decode", 3), ("decode_attention_fp8", 1), ("decode_attention_fp8", 2)}
    for wl in W.WORKLOADS.values():
        dtype = torch.float32 if wl.only_dtypes is None else wl.only_dtypes[0]
        for case in wl.check_cases():
            for i, a in enumerate(wl.make(case, dtype, "cpu")):
                if not isinstance(a, torch.Tensor):
                    continue
                assert a.is_contiguous(), (wl.name, case.label, i)
                if a.is_floating_point() and (wl.name, i) not in fixed:
                    assert a.dtype == dtype, (wl.name, case.label, i, a.dtype)


def test_eager_and_named_peers_against_the_reference():
    """On every check case in float64: eager and every named peer that runs on a CPU (each under its
    own context) give the reference's answer -- a peer bound to the wrong call, or fed the wrong
    argument, fails here rather than in a GPU run's ratio."""
    for wl in W.WORKLOADS.values():
        peers = wl.peers() if wl.peers else {}
        for case in wl.check_cases():
            args = wl.make(case, torch.float64, "cpu")
            ref = wl.ref(*args)
            calls = {"eager": W.Peer(wl.eager), **{n: p if isinstance(p, W.Peer) else W.Peer(p) for n, p in peers.items()}}
            for name, peer in calls.items():
                try:
                    with (peer.context() if peer.context else contextlib.nullcontext()):
                        got = peer.fn(*args)
                except W.Skipped:
                    continue
                except RuntimeError:
                    # SDPA's fused backends have no CPU kernel (the inputs are on the CPU); every other peer runs
                    assert name.startswith("sdpa[") and name != "sdpa[math]", (wl.name, name)
                    continue
                got, want = (got, ref) if isinstance(ref, tuple) else ((got,), (ref,))
                for g, r in zip(got, want, strict=True):
                    if wl.stochastic:   # the peer's own dropout mask: its shape, finite values
                        assert g.shape == r.shape and g.isfinite().all(), (wl.name, case.label, name)
                        continue
                    assert runner.rel_err(g, r) < 1e-5, (wl.name, case.label, name)


def test_check_run_wires_ours_up():
    """Our public functions through the correctness run (fp32; fp8 in bf16) for the ops whose call
    the workload spells out: eps and the bias (layer_norm), the residual pair (add_rms_norm),
    approximate="tanh" (geglu), position_ids (rope's decode case), the activation (linear_gelu),
    the fp8 operands, scales and W^T (fp8_matmul)."""
    wls = [W.WORKLOADS[n] for n in ("layer_norm", "add_rms_norm", "geglu", "rope", "linear_gelu")]
    res = runner.run_check(wls, [torch.float32], device=DEVICE)
    res.rows += runner.run_check([W.WORKLOADS["fp8_matmul"]], [torch.bfloat16], device=DEVICE).rows
    bad = [(r["op"], r["impl"], r["shape"], r["direction"], r["status"]) for r in res.rows
           if not (r["ok"] or r["status"] == "skipped: output does not require grad")]
    assert not bad, bad
    assert {r["op"] for r in res.rows if r["ok"]} == {wl.name for wl in wls} | {"fp8_matmul"}


def test_rope_eager_is_the_rotation_at_each_position():
    """The rope inputs and eager call against the rotation written out: (x1 + i x2) e^{i p theta_j},
    theta_j = base^(-2j/D), p the token's position -- position_ids (B, S) at offsets of their own in
    a table longer than the sequence (decode), else 0..S-1."""
    wl = W.WORKLOADS["rope"]
    for case in wl.check_cases() + [c for c in wl.cases(False) if c.dims["pos"]]:
        d = case.dims
        small = case in wl.check_cases()
        q, k, cos, sin, pos = wl.make(case, torch.float64 if small else torch.bfloat16, "cpu")
        if d["pos"]:
            assert pos.shape == (d["B"], d["S"]) and pos.dtype == torch.int64
            assert (pos[:, 1:] == pos[:, :1] + torch.arange(1, d["S"])).all(), "consecutive within a sequence"
            assert pos.min() >= 1 and pos.max() < cos.shape[0] and cos.shape[0] >= W.ROPE_TABLE
            if d["B"] > 2:
                assert len(set(pos[:, 0].tolist())) > 1, "each sequence at an offset of its own"
        else:
            assert pos is None and cos.shape[0] == d["S"]
        if not small:
            continue
        p = (pos if pos is not None else torch.arange(d["S"]).expand(d["B"], -1)).double()
        theta = 10000.0 ** (-torch.arange(0, d["D"], 2, dtype=torch.float64) / d["D"])
        rot = torch.polar(torch.ones((), dtype=torch.float64), p[:, None, :, None] * theta)   # (B, 1, S, D/2)

        def rotate(x):
            h = x.shape[-1] // 2
            z = torch.complex(x[..., :h], x[..., h:]) * rot
            return torch.cat((z.real, z.imag), dim=-1)

        qo, ko = wl.eager(q, k, cos, sin, pos)   # (the tables' angles are fp32, as HF makes them: ~1e-5 at 4k)
        assert runner.rel_err(qo, rotate(q)) < 1e-4 and runner.rel_err(ko, rotate(k)) < 1e-4, case.label


def test_moe_routing_edges():
    """k = 0 is refused like k > E; zipf's ranking is a random permutation of the experts (the most
    popular is not always expert 0); random routing gives each token its own draw."""
    for routing in W.MOE_ROUTINGS:
        with pytest.raises(ValueError, match="1 <= k <= E"):
            W.make_moe_routing(4, 4, 0, routing)
    top = {int(_counts(W.make_moe_routing(4096, e, k, "zipf")[0], e).argmax()) for e, k in ((8, 2), (64, 6), (128, 8))}
    assert top != {0}, "zipf ranks a shuffled expert order"
    ids, _ = W.make_moe_routing(64, 64, 6, "random")
    assert len({tuple(sorted(r)) for r in ids.tolist()}) > 60, "each token draws its own experts"


class _FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it lives on CUDA: lets _graphed take its capture path on a CPU."""
    @property
    def device(self):
        return torch.device("cuda")


def _fake_cuda_graphs(monkeypatch) -> dict:
    """torch.cuda's stream and graph API replaced by recorders (a replay does nothing: a captured
    output stays what the capture call returned)."""
    seen = {"captures": 0, "replays": 0}

    class Stream:
        def wait_stream(self, other):
            pass

    class Graph:
        def replay(self):
            seen["replays"] += 1

    @contextlib.contextmanager
    def graph(g):
        seen["captures"] += 1
        yield

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    return seen


def test_graphed_captures_again_for_new_inputs(monkeypatch):
    """_graphed: two warm-up calls and a capture for inputs it has not seen (new storage, even of the
    same shape), then one replay per call returning the captured output; a stale graph is never
    replayed for other inputs."""
    seen = _fake_cuda_graphs(monkeypatch)
    calls = []

    def fn(x, y):
        calls.append((x.data_ptr(), y.data_ptr()))
        return x + y

    g = W._graphed(fn)
    a, b = torch.randn(5).as_subclass(_FakeCudaTensor), torch.randn(5)
    out = g(a, b)
    assert calls == [(a.data_ptr(), b.data_ptr())] * 3 and seen == {"captures": 1, "replays": 1}
    assert torch.equal(out, a + b) and g(a, b) is out and len(calls) == 3 and seen["replays"] == 2
    c = torch.randn(5).as_subclass(_FakeCudaTensor)
    out2 = g(c, b)
    assert len(calls) == 6 and seen["captures"] == 2, "new inputs: a new graph"
    assert torch.equal(out2, c + b)
    out3 = g(c, torch.randn(5))
    assert len(calls) == 9 and seen["captures"] == 3, "any argument's storage is part of the key"
    with pytest.raises(W.Skipped, match="CUDA"):
        g(torch.randn(5), b)

    # moe_decode's [graph] peer graphs the grouped_mm pipeline (the same call as the grouped_mm row)
    wl = W.WORKLOADS["moe_decode"]
    ran = []
    monkeypatch.setattr(W, "moe_grouped_mm", lambda *args: ran.append(len(args)) or args[0])
    x, *rest = wl.make(wl.check_cases()[0], torch.bfloat16, "cpu")
    wl.peers()["grouped_mm[graph]"](x.as_subclass(_FakeCudaTensor), *rest)
    assert ran == [5, 5, 5]


def test_sdpa_peers_force_their_own_backend():
    """Each sdpa[<backend>] peer's context enables that backend alone (not the last one of the loop);
    only the math peer declines long sequences, and from S > math_max_s on (S = max still runs)."""
    b = torch.backends.cuda
    enabled = {"cudnn": b.cudnn_sdp_enabled, "flash": b.flash_sdp_enabled, "efficient": b.mem_efficient_sdp_enabled,
               "math": b.math_sdp_enabled}
    for wl in (W.WORKLOADS["attention"], W.WORKLOADS["decode_attention"]):
        for name, peer in wl.peers().items():
            with peer.context():
                on = {k for k, f in enabled.items() if f()}
            assert on == {name[len("sdpa["):-1]}, (wl.name, name, on)
            if name != "sdpa[math]" or wl.name == "decode_attention":
                assert peer.fn is wl.eager, (wl.name, name)
    peers = W.sdpa_peers(lambda q, k, *rest: "ran", math_max_s=4)()
    at4, at5 = torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 5, 2)
    assert peers["sdpa[math]"].fn(at4, at4) == "ran"
    with pytest.raises(W.Skipped, match="S = 5 > 4"):
        peers["sdpa[math]"].fn(at5, at5)
    assert all(p.fn(at5, at5) == "ran" for n, p in peers.items() if n != "sdpa[math]")


def test_named_variants_reach_their_rows(monkeypatch):
    """Every row named warpforge[<variant>] or warpforge[cuda:<variant>] calls our function with that
    variant (not the loop's last one), the cuda rows with backend="cuda", the plain row with neither."""
    monkeypatch.setattr(W, "cuda_backend_available", lambda: True)
    seen = []

    def get(fname):
        def fake(*args, **kw):
            seen.append(kw)
            return args[0]
        return fake

    checked = 0
    for wl in W.WORKLOADS.values():
        args = wl.make(wl.check_cases()[0], torch.float32 if wl.only_dtypes is None else wl.only_dtypes[0], "cpu")
        for name, fn in wl.ours_fn(get).items():
            inner = name[len("warpforge["):-1] if name.startswith("warpforge[") else None
            if inner in ("validated", "graph", "bf16"):
                continue
            seen.clear()
            fn(*args)
            assert seen, (wl.name, name)
            for kw in seen:   # (matmul_bwd's row makes two calls)
                if inner is None:
                    assert "variant" not in kw and "backend" not in kw, (wl.name, name, kw)
                    continue
                cuda = inner.startswith("cuda")
                variant = inner.split(":")[1] if ":" in inner else None if cuda else inner
                assert kw.get("backend") == ("cuda" if cuda else None), (wl.name, name, kw)
                assert kw.get("variant") == variant, (wl.name, name, kw)
            checked += inner is not None
    assert checked >= len(W.MATMUL_LADDER) + len(W.CUDA_MATMUL_LADDER) + 1


def test_row_major_t_is_made_for_each_weight():
    """_row_major_t keeps W^T for the weight it was made from: another weight of the same shape and
    dtype gets its own, never the previous one."""
    w1, w2 = torch.randn(3, 5), torch.randn(3, 5)
    t1 = W._row_major_t(w1)
    assert torch.equal(t1, w1.T) and t1.is_contiguous() and W._row_major_t(w1) is t1
    assert torch.equal(W._row_major_t(w2), w2.T)


def test_fp8_inputs_scaled_per_tensor():
    """_fp8_make: each operand's scale is its own amax / 448 (the bf16 operands it came from, redrawn
    from the same seed), so each e4m3 tensor reaches 448 and the dequantised values are a8 * sa."""
    case = W.WORKLOADS["fp8_matmul"].check_cases()[0]
    torch.manual_seed(7)
    a, w = W._gemm_make(case, torch.bfloat16, "cpu")
    torch.manual_seed(7)
    a8, w8, sa, sw, ad, wd = W._fp8_make(case, torch.float32, "cpu")
    assert a8.dtype == w8.dtype == torch.float8_e4m3fn and sa.dtype == sw.dtype == torch.float32 and sa.dim() == 0
    assert sa == a.abs().amax().float() / W.FP8_MAX and sw == w.abs().amax().float() / W.FP8_MAX
    assert a8.float().abs().max() == w8.float().abs().max() == W.FP8_MAX
    assert torch.equal(ad, (a8.float() * sa).bfloat16()) and torch.equal(wd, (w8.float() * sw).bfloat16())
    assert runner.rel_err(ad, a) < 0.05 and runner.rel_err(wd, w) < 0.05


def test_bench_on_a_cpu_is_the_correctness_run(monkeypatch):
    """Without CUDA, ``bench`` without --check is the correctness run (fp32 and bf16 unless told),
    never the timing run (which would ask for the device)."""
    got = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(wbench, "_check", lambda wls, dts, names, out, match=None: got.append((
        [w.name for w in wls], dts, names, match)) or 0)
    assert wbench.bench(["softmax"]) == 0
    assert wbench.bench(["rms_norm"], dtypes=["fp16"], match="3x") == 0
    assert got == [(["softmax"], [torch.float32, torch.bfloat16], ["fp32", "bf16"], None),
                   (["rms_norm"], [torch.float16], ["fp16"], "3x")]
