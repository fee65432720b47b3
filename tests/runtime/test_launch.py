"""LaunchCache's plans, with a stand-in kernel (no GPU needed): the first launch goes through the
JIT and records the constexprs; later launches pass them straight to the compiled kernel."""
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
