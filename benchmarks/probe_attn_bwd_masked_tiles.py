"""The Triton dK/dV kernel's tiles where the masked, windowed and packed backward runs it, and the
deterministic dense backward (beside the Hopper dQ kernel) (issue 6; a probe, not the benchmark).
Compiled offline for sm_90a (NOTES item 76), its default config at
D = 128 (64 x 128, 8 warps, 4 stages) spills 0.8-3.1 KB with a mask or a window, fewer stages less.
For each case, forward+backward through the public functions under each dK/dV config (the
forward and the dQ kernel unchanged), clean timer, two rounds alternating; dK and dV checked
against the default config's.

    python benchmarks/probe_attn_bwd_masked_tiles.py [--kind dkdv|fwd|dq|rule] [--head-dim 64|128]

``--kind fwd`` / ``dq`` vary the Triton forward's or dQ kernel's config instead (the cases where
they run on Hopper: masks, windows, packed calls; the forward timed alone; with fwd also the dense
calls with the Hopper kernels off). ``--kind rule`` times
attention_config's tiles against the ones every pattern took before item 77, forward and
forward+backward, on every case, the dense ones also with the Hopper kernels switched off.
"""
from __future__ import annotations

import argparse
import contextlib

import torch

import warpforge as wf
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import attention as attn
from warpforge.runtime.heuristics import AttentionConfig

CONFIGS = [None, (64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (64, 64, 8, 3), (32, 64, 4, 3),
           (32, 64, 4, 2), (32, 64, 4, 4), (16, 64, 4, 3), (64, 64, 4, 3)]


def cases(D=128):
    bf = dict(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    B, H, S = 2, 16, 2048
    q, k, v = (torch.randn(B, H, S, D, **bf, requires_grad=True) for _ in range(3))
    mask = torch.rand(S, S, device="cuda") > 0.3
    for causal in (True, False):   # deterministic: the Triton dK/dV beside the Hopper dQ kernel
        yield f"determ. causal={causal}", (q, k, v), (lambda c=causal: wf.scaled_dot_product_attention(
            q, k, v, is_causal=c))
    for causal in (True, False):   # the Triton kernels where the Hopper ones would run (rule mode)
        yield f"triton causal={causal}", (q, k, v), (lambda c=causal: wf.scaled_dot_product_attention(
            q, k, v, is_causal=c))
    yield "dense bool mask", (q, k, v), lambda: wf.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    yield "dense window +-128", (q, k, v), lambda: wf.scaled_dot_product_attention(q, k, v, window_size=(128, 128))
    yield "dense window 256", (q, k, v), lambda: wf.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                 window_size=(256, 0))
    lens = [3000, 17, 1000, 4097, 2048, 1, 2500, 3721]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    qp, kp, vp = (torch.randn(sum(lens), 16, D, **bf, requires_grad=True) for _ in range(3))
    for name, kw in (("varlen full", {}), ("varlen causal", dict(causal=True)),
                     ("varlen window 256", dict(causal=True, window_size=(256, 0)))):
        yield name, (qp, kp, vp), (lambda kw=kw: wf.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens),
                                                                     validate=False, **kw))


@contextlib.contextmanager
def _mode(name):
    """determ.: torch.use_deterministic_algorithms; triton: the Hopper kernels switched off."""
    saved = attn._sm90_kernels
    torch.use_deterministic_algorithms(name.startswith("determ."))
    if name.startswith("triton"):
        attn._sm90_kernels = lambda: None
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)
        attn._sm90_kernels = saved


# the tiles every pattern took before item 77, by head dim
OLD_TILES = {128: {"fwd": (128, 64, 8, 3), "dq": (128, 64, 8, 3), "dkdv": (64, 128, 8, 4)},
             64: {"fwd": (128, 64, 8, 3), "dq": (128, 64, 8, 3), "dkdv": (64, 64, 4, 3)}}


def rule_ab(head_dim):
    """The current attention_config against OLD_TILES on every case: forward alone and
    forward+backward, two rounds alternating; outputs and gradients compared."""
    cfg = TimingConfig.quick()
    saved = attn.attention_config

    def old(kd, d, e, *a, **kw):
        return AttentionConfig(*OLD_TILES[d][kd]) if d in OLD_TILES and e == 2 else saved(kd, d, e, *a, **kw)
    res, errs = {}, {}
    for name, (q, k, v), fwd in cases(head_dim):
        with _mode(name):
            do = torch.randn_like(fwd())
        for part in ("fwd", "f+b"):
            def step():
                with _mode(name):
                    o = fwd()
                    return (o,) if part == "fwd" else torch.autograd.grad(o, (q, k, v), do)
            outs = {}
            for r in range(2):
                for which in (("new", "old") if r % 2 == 0 else ("old", "new")):
                    attn.attention_config = saved if which == "new" else old
                    try:
                        outs[which] = step()
                        res.setdefault((name, part, which), []).append(device_ms(step, cfg) * 1e3)
                    finally:
                        attn.attention_config = saved
            errs[(name, part)] = max(float((a.detach().float() - b.detach().float()).norm()
                                           / b.detach().float().norm()) for a, b in zip(outs["new"], outs["old"]))
    print(f"{'case':22s} {'part':4s} {'old us':>9s} {'new us':>9s} {'new/old':>8s}  rel. diff  rounds old / new")
    for name, part in errs:
        o, n = res[(name, part, "old")], res[(name, part, "new")]
        print(f"{name:22s} {part:4s} {min(o):9.1f} {min(n):9.1f} {min(n) / min(o):8.3f}  {errs[(name, part)]:.1e}  "
              f"{[round(x, 1) for x in o]} {[round(x, 1) for x in n]}")


CONFIGS_FOR = {
    "fwd256": [None, (64, 32, 4, 2), (64, 32, 4, 3), (32, 64, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2),
               (32, 32, 4, 3), (64, 16, 4, 3)],
    "dkdv": CONFIGS,
    "fwd": [None, (64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2), (64, 64, 4, 4), (64, 128, 8, 3)],
    "dq": [None, (64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2), (64, 64, 4, 2), (64, 64, 8, 3)],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="dkdv", choices=["dkdv", "fwd", "dq", "rule"],
                    help="the kernel whose config varies (fwd: the forward alone is timed); rule: the "
                         "current tiles against OLD_TILES")
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128, 256],
                    help="256: --kind fwd only (the Triton forward takes every D = 256 call)")
    ap.add_argument("--only", default="", help="comma-separated case-name prefixes")
    a = ap.parse_args()
    only = [x for x in a.only.split(",") if x]
    kind = a.kind
    if kind == "rule":
        return rule_ab(a.head_dim)
    cfg = TimingConfig.quick()
    saved = attn.attention_config
    res, errs = {}, {}
    for name, (q, k, v), fwd in cases(a.head_dim):
        if name.startswith("determ.") and kind != "dkdv" or name.startswith("triton") and kind != "fwd" \
                or only and not any(name.startswith(o) for o in only):
            continue           # (the Hopper forward and dQ kernels run in determ.)
        with _mode(name):
            do = torch.randn_like(fwd())

        def step():
            with _mode(name):
                if kind == "fwd":
                    return (fwd(),)
                g = torch.autograd.grad(fwd(), (q, k, v), do)
                return g[1:] if kind == "dkdv" else g[:1]

        want = None
        confs = CONFIGS_FOR["fwd256" if kind == "fwd" and a.head_dim == 256 else kind]
        for r in range(2):
            for c in (confs if r % 2 == 0 else confs[::-1]):
                if c is not None:
                    attn.attention_config = (lambda c: lambda kd, d, e, *a, **kw: AttentionConfig(*c) if kd == kind
                                             else saved(kd, d, e, *a, **kw))(c)
                try:
                    got = step()
                    if c is None:
                        want = want or got
                    elif want is not None and r == 1:
                        errs[(name, c)] = max(float((g.detach().float() - w.detach().float()).norm()
                                                    / w.detach().float().norm()) for g, w in zip(got, want))
                    res.setdefault((name, c), []).append(device_ms(step, cfg) * 1e3)
                except Exception as e:  # noqa: BLE001 (a config that does not fit: reported)
                    res[(name, c)] = [float("nan")]
                    errs[(name, c)] = str(e)[:80]
                finally:
                    attn.attention_config = saved
    print(f"{'case':20s} {kind + ' config':18s} {'us':>9s} {'vs default':>10s}  output vs default  rounds")
    for (name, c), v in res.items():
        base = min(res[(name, None)])
        print(f"{name:20s} {str(c or 'default'):18s} {min(v):9.1f} {min(v) / base:10.3f}  {errs.get((name, c), '-')}  "
              f"{[round(x, 1) for x in v]}")


if __name__ == "__main__":
    main()
