"""LaunchCache's plans, with a stand-in kernel (no GPU needed): the first launch goes through the
JIT and records the constexprs; later launches pass them straight to the compiled kernel."""
import dataclasses
import inspect
from types import SimpleNamespace

import pytest

from warpforge.runtime import launch as launch_mod


class _Kernel:
    """Stands in for a JITFunction: two runtime arguments, then constexprs A (no default) and B = 7."""

    def __init__(self):
        self.arg_names = ["x", "n", "A", "B"]
        empty = inspect.Parameter.empty
        self.params = [SimpleNamespace(name=n, default=d) for n, d in
                       (("x", empty), ("n", empty), ("A", empty), ("B", 7))]
        self.jit_calls = []

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            return "compiled"
        return call


@pytest.mark.parametrize("given", [{"A": 3}, {"A": 3, "B": 7}, {"A": 3, "B": 9}])
def test_plan_takes_each_constexpr_or_its_default(monkeypatch, given):
    monkeypatch.setattr(launch_mod, "interpreting", lambda: False)
    monkeypatch.setattr(launch_mod, "_BYPASS", False)
    launched = []
    monkeypatch.setattr(launch_mod, "launch", lambda compiled, grid, values: launched.append((compiled, grid, values)))
    k = _Kernel()
    cache = launch_mod.LaunchCache(k)
    cache("key", (4,), ("ptr", 10), given, num_warps=4, num_stages=None)
    assert k.jit_calls == [((4,), ("ptr", 10), {**given, "num_warps": 4})]
    assert launched == []
    cache("key", (5,), ("ptr2", 11), given, num_warps=4, num_stages=None)
    assert len(k.jit_calls) == 1                      # the plan, not the JIT
    assert launched == [("compiled", (5,), ("ptr2", 11, 3, given.get("B", 7)))]


def test_spec_key_tells_apart_what_the_jit_specialises_on():
    """A plan is reused only for arguments the JIT would compile the same kernel for: integers
    differing in being 1, in divisibility by 16 or in needing 64 bits; a bool and the int of the
    same value; tensors of other dtypes or 16-byte alignment."""
    import torch

    k = launch_mod.spec_key
    for a, b in ((16, 8), (16, 24), (1, 2), (2**31 - 1, 2**31), (-2**31, -2**31 - 1), (True, 1), (False, 0),
                 (None, 0)):
        assert k((a,)) != k((b,)), (a, b)
    assert k((32,)) == k((48,)) and k((3,)) == k((5,)) and k((0.5,)) == k((2.0,))
    t = torch.zeros(16)
    assert k((t,)) != k((t[1:],)) and k((t,)) != k((t.double(),)) and k((t,)) == k((t[4:],))


def test_specialized_plans_per_launch_option(monkeypatch):
    """specialized() keys its plans on the launch shape too: another num_warps, num_stages or
    compile option is a new JIT compile, never the plan compiled for the first."""
    import torch

    monkeypatch.setattr(launch_mod, "interpreting", lambda: False)
    monkeypatch.setattr(launch_mod, "_BYPASS", False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(launch_mod, "launch", lambda compiled, grid, values: None)
    k = _Kernel()
    cache = launch_mod.LaunchCache(k)
    variants = [dict(num_warps=4, num_stages=None), dict(num_warps=8, num_stages=None),
                dict(num_warps=4, num_stages=3), dict(num_warps=4, num_stages=None, launch_pdl=True)]
    for kw in variants + variants:
        cache.specialized((4,), ("ptr", 10), {"A": 3}, **kw)
    assert [c[2] for c in k.jit_calls] == [
        {"A": 3, "num_warps": 4}, {"A": 3, "num_warps": 8}, {"A": 3, "num_warps": 4, "num_stages": 3},
        {"A": 3, "num_warps": 4, "launch_pdl": True}]


def test_launch_pads_the_grid_and_passes_every_value(monkeypatch):
    """launch(): a 1-d or 2-d grid is padded with ones (x first), on the current device's stream."""
    import torch

    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 3, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 1000 + dev, raising=False)
    runs = []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def launch_metadata(self, grid, stream, *values):
            return ("lm", grid, stream, values)

        def run(self, *a):
            runs.append(a)

    for grid, want in (((4,), (4, 1, 1)), ((4, 3), (4, 3, 1)), ((4, 3, 2), (4, 3, 2))):
        runs.clear()
        launch_mod.launch(Compiled(), grid, ("p", 7))
        (a,) = runs
        assert a[:3] == want and a[3] == 1003 and a[4:6] == ("fn", "meta"), a
        assert a[6] == ("lm", grid, 1003, ("p", 7)) and a[-2:] == ("p", 7), a


def test_pdl_supported_from_sm90(monkeypatch):
    """Programmatic dependent launch from sm_90 on (griddepcontrol), never under the interpreter."""
    monkeypatch.setattr(launch_mod, "interpreting", lambda: False)
    monkeypatch.setattr(launch_mod, "gdc_wait", object())
    t = SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=0))
    for major, want in ((8, False), (9, True), (10, True)):
        monkeypatch.setattr(launch_mod, "device_info", lambda i, m=major: SimpleNamespace(capability=(m, 0)))
        assert launch_mod.pdl_supported(t) is want, major
    assert not launch_mod.pdl_supported(SimpleNamespace(is_cuda=False, device=SimpleNamespace(index=None)))
    monkeypatch.setattr(launch_mod, "interpreting", lambda: True)
    assert not launch_mod.pdl_supported(t)


def _refuse_over(limit, needs, calls):
    """A launch_one that records each config it is given and refuses (as Triton does when a
    compiled kernel loads) those whose ``needs(cfg)`` bytes of shared memory exceed ``limit``."""
    from triton.runtime.errors import OutOfResources

    def one(cfg):
        calls.append(cfg)
        if needs(cfg) > limit:
            raise OutOfResources(needs(cfg), limit, "shared memory")
        return ("ran", cfg)
    return one


def test_launch_fitting_steps_down_once_and_remembers(monkeypatch):
    """The first config that fits runs; a refused one is skipped on later calls without another
    attempt (each attempt is a compile), per kernel and key; nothing fitting is a clear error."""
    monkeypatch.setattr(launch_mod, "_TOO_BIG", {})
    calls = []
    one = _refuse_over(100, lambda c: c, calls)
    assert launch_mod.launch_fitting("k", iter([300, 200, 80, 40]), one, key=("a",)) == ("ran", 80)
    assert calls == [300, 200, 80]
    calls.clear()
    assert launch_mod.launch_fitting("k", iter([300, 200, 80, 40]), one, key=("a",)) == ("ran", 80)
    assert calls == [80]
    calls.clear()                                  # another key (head dim, dtype, switches): tried afresh
    assert launch_mod.launch_fitting("k", iter([300, 200, 80]), one, key=("b",)) == ("ran", 80)
    assert calls == [300, 200, 80]
    assert {(k[1], k[2], k[3]): v for k, v in launch_mod.shared_memory_fallbacks().items()} == {
        ("k", 300, ("a",)): (300, 100), ("k", 200, ("a",)): (200, 100),
        ("k", 300, ("b",)): (300, 100), ("k", 200, ("b",)): (200, 100)}
    with pytest.raises(RuntimeError, match=r"attention dq: no launch configuration fits .*100 bytes.*300 needs 300"):
        launch_mod.launch_fitting("attention dq", iter([300, 200]), _refuse_over(100, lambda c: c, []))


def test_launch_fitting_passes_other_errors(monkeypatch):
    """Only a shared-memory refusal steps down: too many threads, or any other error, propagates."""
    from triton.runtime.errors import OutOfResources
    monkeypatch.setattr(launch_mod, "_TOO_BIG", {})

    def threads(cfg):
        raise OutOfResources(2048, 1024, "threads")
    with pytest.raises(OutOfResources, match="threads"):
        launch_mod.launch_fitting("k", iter([1, 2]), threads)

    def broken(cfg):
        raise ValueError("bad argument")
    with pytest.raises(ValueError, match="bad argument"):
        launch_mod.launch_fitting("k", iter([1, 2]), broken)
    assert launch_mod.shared_memory_fallbacks() == {}


def test_fallback_ladders(monkeypatch):
    """The step-down ladders start at the Hopper tile, never grow shared memory's main terms
    (stages, and each tile side), end at the smallest tile, and keep what may not change: the MoE
    row tile (the sorted layout's padding unit)."""
    from warpforge.runtime import heuristics as Hc
    monkeypatch.setattr(Hc, "interpreting", lambda: False)
    for kind in ("fwd", "dq", "dkdv"):
        for d, e, pattern in ((128, 2, "full"), (128, 2, "causal"), (64, 2, "window"), (256, 2, "full"), (128, 4, "full")):
            ladder = list(Hc.attention_configs(kind, d, e, pattern))
            assert ladder[0] == Hc.attention_config(kind, d, e, pattern)
            assert len(set(ladder)) == len(ladder), ladder
            assert (ladder[-1].block_m, ladder[-1].block_n, ladder[-1].num_stages) == (16, 16, 1)
            for a, b in zip(ladder, ladder[1:]):
                tile = lambda c: (c.block_m, c.block_n)
                assert b.block_m <= a.block_m and b.block_n <= a.block_n, (kind, a, b)
                assert tile(b) != tile(a) or b.num_stages < a.num_stages, (kind, a, b)
                assert b.num_warps == a.num_warps, (kind, a, b)
    big = Hc.MatmulConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8)
    ladder = list(Hc.gemm_configs(big))
    assert ladder[0] == big and ladder[1:3] == [dataclasses.replace(big, num_stages=s) for s in (2, 1)]
    assert (ladder[-1].block_m, ladder[-1].block_n, ladder[-1].block_k, ladder[-1].num_stages) == (32, 32, 32, 1)
    assert all(c.group_m == 8 and c.num_warps == 8 for c in ladder)
    moe = list(Hc.gemm_configs(Hc.MoEConfig(16, 64, 128, 4, 4), keep_m=True))
    assert {c.block_m for c in moe} == {16} and moe[-1].block_n == 32 and moe[-1].block_k == 32
    assert list(Hc.gemm_configs(Hc.MoEConfig(128, 128, 64, 8, 3), keep_m=True))[-1].block_m == 128
