"""Shared by benchmarks/probe_rms_const.py and probe_reduce_const.py (not a probe itself): check
launch variants against a reference, then time them in alternating rounds with the bench's timer."""
import torch

from warpforge.bench import timing


def check_variants(variants: dict, out_buf: torch.Tensor, error, limit: float, label: str) -> None:
    """Drop (and say so) each variant that raises, or whose output -- its return value, or
    ``out_buf``, which it writes and which is filled with NaN first -- has ``error(out)`` above
    ``limit`` (NaN fails)."""
    for name, fn in list(variants.items()):
        out_buf.fill_(float("nan"))
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 -- a variant this device or shape refuses: drop it, keep the rest
            print(f"{label} {name}: {type(e).__name__}: {e}: dropped", flush=True)
            del variants[name]
            continue
        out = out if isinstance(out, torch.Tensor) else out_buf
        err = error(out)
        if not err <= limit:
            print(f"{label} {name}: error {err} (limit {limit}): dropped", flush=True)
            del variants[name]


def time_rounds(variants: dict, rounds: int, nbytes: int, label: str) -> dict:
    """The least GPU time (ms) of each variant over ``rounds`` rounds alternating over them."""
    cfg = timing.TimingConfig.quick()
    best = {}
    for rnd in range(rounds):
        for name, fn in variants.items():
            ms = timing.device_ms(fn, cfg, nbytes)
            best[name] = min(best.get(name, 1e9), ms)
            print(f"{label} round {rnd} {name}: {ms * 1e3:.1f} us", flush=True)
    return best


def table_rows(best: dict, label: str, nbytes: int, copy_gbps: float) -> list[str]:
    """One line a variant: time, % of the copy ceiling, torch.compile's time over it."""
    return [f"{label} {name:24s} {ms * 1e3:7.1f} us {100 * nbytes / ms / 1e6 / copy_gbps:5.1f}% of copy "
            f"{best['compile'] / ms:.3f}x compile" for name, ms in best.items()]
