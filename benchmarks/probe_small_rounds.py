"""How much of the bench's small-row spread is the moment a row was timed (issue 2's small-row bar).

The bench times each implementation of a small case once (``clean``: 1,000 single calls, each after
an L2 flush, the median). Two rows of the same kernel (``warpforge`` and ``warpforge[dispatch]``
differ only in the host path) have read up to 1.1 us apart on a 5 us call. This probe times the
same implementations in ``--rounds`` alternating rounds with the bench's own timer and prints each
round's median: if the rounds of one implementation spread as far as the implementations do, a
single round cannot rank them, and the least of several alternating rounds (as the GEMMs and the
host times already take) is the fairer figure. Also: the distribution of one round's samples.

    python benchmarks/probe_small_rounds.py [--rounds 5] [--ops layer_norm,rms_norm] [--modes fwd]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from warpforge.bench import runner, timing, workloads
from warpforge.bench.runner import Impl


def samples(fn, cfg, n: int = 1000) -> list[float]:
    """One clean round's samples, as timing._clean_ms takes them (us)."""
    est = timing._estimate_ms(fn)
    for _ in range(timing._warm_calls(cfg, est)):
        fn()
    sleep = timing._cover(timing._host_ms(fn))
    start, end = timing._events(n), timing._events(n)
    for i in range(n):
        timing.flush_l2()
        torch.cuda._sleep(sleep)
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return sorted(1e3 * s.elapsed_time(e) for s, e in zip(start, end))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", default="layer_norm,rms_norm")
    ap.add_argument("--modes", default="fwd")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    cfg = timing.TimingConfig()
    summary = []
    for wl in workloads.get(a.ops.split(",")):
        ours = wl.ours()
        try:
            liger = wl.liger_fn() if wl.liger is not None else None
        except Exception as e:  # noqa: BLE001
            print(f"{wl.name}: liger absent ({type(e).__name__}: {e})")
            liger = None
        for case in [c for c in wl.cases(False) if c.small]:
            base = wl.make(case, torch.bfloat16, torch.device("cuda"))
            impls = [Impl("warpforge", "ours", ours["warpforge"]),
                     Impl("warpforge[dispatch]", "ours", ours["warpforge"], dispatch=True),
                     Impl("eager", "peer", wl.eager)]
            if not a.no_compile:
                torch._dynamo.reset()
                impls.append(Impl("compile", "peer", torch.compile(wl.eager, dynamic=False)))
            if liger is not None:
                impls.append(Impl("liger", "peer", liger, private_inputs=wl.liger_writes_inputs))
            for mode in a.modes.split(","):
                steps = []
                for impl in impls:
                    args = runner.private_copy(base) if impl.private_inputs else base
                    with runner._impl_context(impl):
                        step = runner._impl_step(wl, mode, impl, args)
                        timing.warm(step, 3)
                    steps.append((impl, step))
                times = {impl.name: [] for impl, _ in steps}
                for _ in range(a.rounds):
                    for impl, step in steps:
                        with runner._impl_context(impl):
                            times[impl.name].append(1e3 * timing.device_ms(step, cfg, None))
                print(f"\n{wl.name} {mode} {case.label}: each round's median, us")
                for name, ts in times.items():
                    print(f"  {name:22s} " + " ".join(f"{t:6.2f}" for t in ts)
                          + f"   min {min(ts):6.2f}  spread {max(ts) - min(ts):5.2f}")
                best_peer = min(min(ts) for n, ts in times.items() if not n.startswith("warpforge"))
                first_peer = min(ts[0] for n, ts in times.items() if not n.startswith("warpforge"))
                summary.append((wl.name, mode, case.label, times["warpforge"][0], first_peer,
                                min(times["warpforge"]), best_peer))
                if case.label.startswith("1x"):
                    for impl, step in steps:
                        if impl.name in ("warpforge", "liger"):
                            with runner._impl_context(impl):
                                s = samples(step, cfg)
                            q = [s[int(p * (len(s) - 1))] for p in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)]
                            print(f"  samples {impl.name}: " + " ".join(f"{v:.2f}" for v in q)
                                  + f"  (min p10 p25 p50 p75 p90 p99); distinct values {len(set(s))}")
                del steps
            del base
    print("\nop mode shape | first round: ours us, best peer us, ratio | least of rounds: ours, best peer, ratio")
    for op, mode, label, o1, p1, om, pm in summary:
        print(f"{op} {mode} {label} | {o1:.2f} {p1:.2f} {p1 / o1:.2f}x | {om:.2f} {pm:.2f} {pm / om:.2f}x")


if __name__ == "__main__":
    main()
