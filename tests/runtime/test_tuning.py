"""runtime/tuning.py without a GPU: the search's ranking (timings stubbed), the cache file's merge,
the switch's nesting, and the keys that name a tuned winner (device, and the matmul problem)."""
from __future__ import annotations

import json

import pytest
import torch
import triton.testing

from warpforge.ops import matmul as matmul_mod
from warpforge.runtime import tuning
from warpforge.runtime.device import DeviceInfo

FAKE = DeviceInfo("Fake GPU 80GB", 132, 50 << 20, (9, 0), 80 << 30)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "device_info", lambda: FAKE)
    monkeypatch.setenv("WARPFORGE_CACHE", str(tmp_path / "tc"))
    monkeypatch.setattr(tuning, "shipped_path", lambda: tmp_path / "shipped.json")
    tuning.forget()
    yield
    tuning.forget()


def test_search_keeps_each_candidates_least_median(monkeypatch):
    """Each candidate keeps its least median over the rounds and the least wins; a candidate that
    fails is dropped and not timed again."""
    plan = {"a": [5.0, 1.0], "b": [2.0, 2.0], "c": [RuntimeError("out of resources")]}
    calls = []

    def fake_bench(fn, warmup, rep, return_mode):
        assert return_mode == "median"
        c = fn()
        calls.append(c)
        t = plan[c][sum(x == c for x in calls) - 1]
        if isinstance(t, Exception):
            raise t
        return t

    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    best, times = tuning.search(["a", "b", "c"], lambda c: c, rounds=2)
    assert best == "a" and times == {0: 1.0, 1: 2.0}, (best, times)
    assert calls == ["a", "b", "c", "a", "b"]
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError, match="no candidate that runs"):
        tuning.search(["a"], lambda c: c)


def test_store_merges_the_file_and_wins(private_cache):
    """store() keeps the entries another process wrote since this one read the file, and its own
    new value replaces the file's old one for the same key."""
    assert tuning.lookup("k") is None                   # this process has read the (empty) file
    path = tuning.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"k": {"old": 1}, "j": {"other": 2}}))
    tuning.store("k", {"new": 3})
    assert json.loads(path.read_text()) == {"k": {"new": 3}, "j": {"other": 2}}
    assert tuning.lookup("k") == {"new": 3}


def test_switch_nests():
    before = tuning.enabled()
    for on in (True, False):
        with tuning.tuning(on):
            with tuning.tuning(on):
                pass
            assert tuning.enabled() == on
    assert tuning.enabled() == before


def test_device_key_names_every_field():
    """Tables are per device: devices differing in any of name, capability, SM count or memory
    (an H100 PCIe has 114 SMs, an SXM 132; an H200 141 GB) must not share a file."""
    import dataclasses

    keys = {FAKE.key}
    for change in (dict(name="Other GPU"), dict(capability=(9, 1)), dict(capability=(8, 0)), dict(sm_count=114),
                   dict(memory_bytes=141 << 30)):
        keys.add(dataclasses.replace(FAKE, **change).key)
    assert len(keys) == 6, keys


def test_matmul_tuning_key_names_the_problem(monkeypatch):
    """The key a matmul winner is stored under differs for operand dtypes, layouts and shape
    buckets: a winner tuned for one must not be read for another."""
    seen = []

    def lookup(key):
        seen.append(key)
        return None

    monkeypatch.setattr(matmul_mod, "interpreting", lambda: False)
    monkeypatch.setattr(tuning, "lookup", lookup)
    with tuning.tuning(False):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            a, b = torch.empty(40, 24, dtype=dtype), torch.empty(24, 72, dtype=dtype)
            matmul_mod._plan(a, b, torch.empty(40, 72, dtype=dtype), None, "grouped", None)
        a = torch.empty(24, 40, dtype=torch.float16).T
        matmul_mod._plan(a, b.half(), torch.empty(40, 72, dtype=torch.float16), None, "grouped", None)
        a = torch.empty(40, 200, dtype=torch.float16)
        matmul_mod._plan(a, torch.empty(200, 72, dtype=torch.float16), torch.empty(40, 72, dtype=torch.float16),
                         None, "grouped", None)
    assert len(seen) == 5 and len(set(seen)) == 5, seen
