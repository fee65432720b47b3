"""The benchmark lab on a CPU: byte models, the workload registry, the correctness run end to end,
the GPU runner's plumbing with the timers replaced (nothing is timed), and report writing."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import DEVICE

from warpforge import bench as wbench
from warpforge.bench import report, runner, timing, workloads as W

EXPECTED_OPS = {"add", "sum", "amax", "softmax", "log_softmax", "layer_norm", "rms_norm", "add_rms_norm",
                "swiglu", "geglu", "rope", "matmul", "matmul_bwd", "linear_gelu", "fp8_matmul"}


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


def test_check_run_fails_on_wrong_results(monkeypatch, capsys):
    wl = W.WORKLOADS["softmax"]
    monkeypatch.setattr(wl, "check_cases", lambda: [W.Case("2x37", {"M": 2, "N": 37})])
    monkeypatch.setattr(wl, "ours_fn", lambda get: {"warpforge": lambda x: torch.softmax(x * 1.5, -1)})
    assert wbench.bench(["softmax"], dtypes=["fp32"], check=True) == 1
    assert "FAILED: softmax" in capsys.readouterr().out


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

    def fake_ms(fn, cfg):
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
    monkeypatch.setattr(timing, "host_us", lambda fn, calls=200: 7.0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
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
        assert (r["host_us"] == 7.0) == r["small"]
    fwd = next(r for r in big if r["impl"] == "warpforge" and r["mode"] == "fwd")
    assert fwd["err_vs_eager"] < 1e-5
    assert ("warpforge[dispatch]", False) in doors and ("warpforge", True) in doors
    assert any("peer absent -- compile" in n for n in res.notes)


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
