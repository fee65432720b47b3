"""What the large-tensor repros share: the device (CPU under the Triton interpreter with
AUDIT64_TINY=1, a smoke test of the logic at tiny sizes), a synchronize, a NaN-aware max, and the
loop that runs a file's cases when it is run alone."""
import os

import torch

TINY = os.environ.get("AUDIT64_TINY") == "1"
DEV = "cpu" if TINY else "cuda"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def nanmax(values) -> float:
    """max that treats NaN as +inf (Python's max() silently skips a NaN that is not first)."""
    return max((float("inf") if v != v else float(v)) for v in values)


def run_standalone(cases: dict, kind: str = "SUSPECT") -> None:
    """Run each case, one line each (OK / WRONG ... / ERROR ...), freeing memory between them."""
    for name, fn in cases.items():
        try:
            status = fn()
        except Exception as e:  # noqa: BLE001
            status = f"ERROR {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"{kind} {name}: {status}", flush=True)
        if DEV == "cuda":
            torch.cuda.empty_cache()
