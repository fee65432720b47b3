"""The ``warpforge`` command line on a CPU: argument errors and ``warpforge info``."""
from __future__ import annotations

import pytest

import warpforge
from warpforge.cli import main


def test_unknown_op_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "softmax", "nope"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown op: nope" in err and "known: add, sum, amax, softmax" in err and "rope" in err


@pytest.mark.parametrize("argv, what", [(["bench", "--modes", "fwd,sideways"], "unknown mode: sideways"),
                                        (["bench", "--dtype", "fp8"], "unknown dtype: fp8"),
                                        (["bench", "--match", "T(256"], "--match: not a regular expression")])
def test_bad_mode_and_dtype(argv, what, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert what in capsys.readouterr().err


def test_no_command_is_an_error():
    with pytest.raises(SystemExit):
        main([])


def test_info_on_cpu(monkeypatch, capsys):
    import torch

    from warpforge import cuda

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # the backend's verdict is cached per process: on a GPU machine an earlier test has cached
    # "available", which this test's patched torch.cuda contradicts (it then asked the absent
    # device for its capability)
    cuda.unavailable_reason.cache_clear()
    try:
        assert main(["info"]) == 0
    finally:
        cuda.unavailable_reason.cache_clear()
    out = capsys.readouterr().out
    assert f"warpforge {warpforge.__version__}" in out
    assert f"torch     {torch.__version__}" in out and "triton" in out
    assert "Triton interpreter" in out and "no CUDA device" in out


@pytest.mark.parametrize("capability, limit, hopper", [((9, 0), 232_448, True), ((8, 0), 166_912, False)])
def test_info_on_a_gpu(monkeypatch, capsys, capability, limit, hopper):
    """On a GPU, info names the device's facts, its shared memory a block (where the Hopper tiles
    step down below 227 KB) and whether the Hopper kernels run there (stand-ins: no GPU needed)."""
    import torch

    from warpforge.runtime import device, launch
    from warpforge.runtime.device import DeviceInfo

    info = DeviceInfo("GPU X", 108, 40 << 20, capability, 80 << 30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(warpforge, "interpreting", lambda: False)
    monkeypatch.setattr(device, "device_info", lambda index=None: info)
    monkeypatch.setattr(device, "ceilings", lambda refresh=False: {"copy_gbps": 1500.0, "bf16_tflops": 280.0,
                                                                   "fp16_tflops": 280.0, "measured_at": ""})
    monkeypatch.setattr(launch, "shared_memory_limit", lambda index=None: limit)
    monkeypatch.setattr("warpforge.cli._cuda_status", lambda: "stand-in")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "device    GPU X" in out and f"compute capability  {capability[0]}.{capability[1]}" in out
    assert f"shared memory       {limit // 1024} KB a block" in out
    assert ("step down" in out) is not hopper
    assert ("Hopper kernels      on" in out) is hopper and ("off (sm_90 only)" in out) is not hopper


def test_report_merges_runs(tmp_path):
    import json

    from warpforge.bench import report

    row = {"op": "softmax", "mode": "fwd", "dtype": "bf16", "shape": "4x8", "impl": "warpforge", "kind": "ours",
           "status": "ok", "ms": 1.0, "gbps": 1.0, "pct_copy": 50.0, "ratio": 1.0, "headline": True,
           "small": False, "bytes": 1, "flops": 1, "tflops": 0.0}
    meta = {"device": {"name": "FakeGPU"}, "ceilings": {"copy_gbps": 2.0, "bf16_tflops": 1.0}, "command": "x"}
    small = {**row, "shape": "1x8", "small": True, "headline": False}
    runs = [[{**row, "op": "softmax", "ms": 2.0}, {**row, "op": "sum"},   # softmax bf16 re-timed in run 1
             {**row, "op": "sum", "dtype": "fp16", "ms": 3.0},
             {**small, "op": "rms_norm", "ms": 5.0}, {**row, "op": "rms_norm", "ms": 6.0}],
            [{**row, "op": "softmax"}, {**row, "op": "add", "timing": "clean"},
             {**row, "op": "sum", "dtype": "fp32", "ms": 4.0}, {**row, "op": "amax", "status": "failed: x", "ms": None}],
            [{**small, "op": "rms_norm", "ms": 7.0}],   # a --small run
            [{**row, "op": "add", "shape": "9x9", "ms": 8.0}, {**row, "op": "sum", "dtype": "fp32", "ms": 9.0}]]
    for i, rows in enumerate(runs):
        extra = {"match": "9x9|4x8"} if i == 3 else {}      # a --match run: some shapes of a group
        report.write_results(tmp_path / f"r{i}", rows, {**meta, "command": f"run {i}", **extra}, [f"note {i}"])
    assert main(["report", *(str(tmp_path / f"r{i}") for i in range(4)), "--out", str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    assert sorted(r["op"] for r in merged["rows"]) == ["add", "add", "amax", "rms_norm", "rms_norm", "softmax", "sum",
                                                        "sum", "sum"]
    assert sorted((r["shape"], r["ms"]) for r in merged["rows"] if r["op"] == "add") == [("4x8", 1.0), ("9x9", 8.0)], \
        "a --match run adds its shapes to the group and leaves the others"
    assert [r["ms"] for r in merged["rows"] if r["op"] == "softmax"] == [1.0], "the later run wins"
    assert sorted(r["ms"] for r in merged["rows"] if r["op"] == "sum") == [1.0, 3.0, 9.0], \
        "a later run of another dtype keeps the earlier dtype's rows; a --match run replaces the shapes it timed"
    assert sorted((r["small"], r["ms"]) for r in merged["rows"] if r["op"] == "rms_norm") == [(False, 6.0), (True, 7.0)], \
        "a --small run replaces the small rows and keeps the large ones"
    timings = {(r["op"], r["shape"], r["dtype"]): r.get("timing") for r in merged["rows"]}
    assert {k: v for k, v in timings.items() if k[0] in ("add", "sum", "amax")} == {
        ("add", "4x8", "bf16"): "clean", ("add", "9x9", "bf16"): "memset", ("sum", "4x8", "bf16"): "memset",
        ("sum", "4x8", "fp16"): "memset", ("sum", "4x8", "fp32"): "memset", ("amax", "4x8", "bf16"): None}, \
        "a row's timing condition kept; rows from before that column: memset (failed rows: none)"
    assert merged["merged_from"] == ["run 0", "run 1", "run 2", "run 3"]
    assert merged["notes"] == ["note 0", "note 1", "note 2", "note 3"]


def test_bench_flags_reach_bench(monkeypatch):
    """Every flag of ``warpforge bench`` lands in its own argument of bench(): comma lists split,
    repeated flags merged, duplicates and empty items dropped."""
    import warpforge.bench as wbench
    from warpforge.bench.workloads import MODES

    got = []
    monkeypatch.setattr(wbench, "bench", lambda ops, **kw: got.append((ops, kw)) or 0)
    assert main(["bench"]) == 0
    assert got.pop() == (None, dict(modes=list(MODES), dtypes=None, quick=False, out=None, use_compile=True,
                                    use_liger=True, check=False, small_only=False, match=None))
    assert main(["bench", "softmax", "rms_norm", "--modes", "fwd,", "--modes", "bwd, fwd", "--dtype", "fp16,bf16",
                 "--dtype", "fp16", "--no-liger", "--small", "--check", "--match", "T256|zipf"]) == 0
    assert got.pop() == (["softmax", "rms_norm"], dict(modes=["fwd", "bwd"], dtypes=["fp16", "bf16"], quick=False,
                                                       out=None, use_compile=True, use_liger=False, check=True,
                                                       small_only=True, match="T256|zipf"))
    assert main(["bench", "--quick", "--no-compile", "--out", "somewhere", "--dtype", "fp32"]) == 0
    assert got.pop() == (None, dict(modes=list(MODES), dtypes=["fp32"], quick=True, out="somewhere",
                                    use_compile=False, use_liger=True, check=False, small_only=False, match=None))
