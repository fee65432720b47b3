"""Device probe: (1) where the fwd+bwd time goes (device vs host), (2) launch sweeps of the norm
backward and RoPE. Prints a short table last; details to $OUT/probe_tune.json.

    python benchmarks/probe_tune.py
"""
from __future__ import annotations

import itertools
import json
import os

import torch
import triton
import triton.testing

import warpforge as wf
from warpforge.bench.timing import host_us
from warpforge.ops import norms as N, rope as R
from warpforge.runtime import heuristics as H

OUT = os.environ.get("OUT", ".")
COPY = None
rows = []


def ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def report(name, nbytes, t, **kw):
    r = dict(name=name, ms=t, gbps=nbytes / t / 1e6, pct=100 * nbytes / t / 1e6 / COPY, **kw)
    rows.append(r)
    print(json.dumps(r), flush=True)


def fwd_bwd_study():
    M, Nn = 32768, 4096
    x = torch.randn(M, Nn, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(Nn, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    nb = M * Nn * 2
    cases = {
        "softmax": (lambda t: wf.softmax(t, -1), lambda t: torch.softmax(t, -1)),
        "rms_norm": (lambda t: wf.rms_norm(t, (Nn,), wg, 1e-6), lambda t: torch.nn.functional.rms_norm(t, (Nn,), wg, 1e-6)),
    }
    for name, (ours, eager) in cases.items():
        for impl_name, fn in (("ours", ours), ("eager", eager)):
            xg = x.clone().requires_grad_()
            global wg
            wg = w.clone().requires_grad_()
            y = fn(xg)
            tf = ms(lambda: fn(x))
            tb = ms(lambda: torch.autograd.grad(y, [xg], dy, retain_graph=True))
            tfb = ms(lambda: torch.autograd.grad(fn(xg), [xg], dy))
            h = host_us(calls=50, include_device=False, fn=lambda: torch.autograd.grad(fn(xg), [xg], dy))
            hf = host_us(calls=50, include_device=False, fn=lambda: fn(xg))
            report(f"{name} {impl_name} fwd/bwd/fwd+bwd", 5 * nb, tfb, fwd_ms=tf, bwd_ms=tb,
                   host_fwd_us=hf, host_fwdbwd_us=h)
    # profile ours
    xg = x.clone().requires_grad_()
    from torch.profiler import profile, ProfilerActivity
    for _ in range(3):
        torch.autograd.grad(wf.softmax(xg, -1), [xg], dy)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.autograd.grad(wf.softmax(xg, -1), [xg], dy)
        torch.cuda.synchronize()
    tab = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    print(tab)
    open(os.path.join(OUT, "profile_softmax.txt"), "w").write(tab)


def norm_bwd_sweep():
    M, Nn = 32768, 4096
    x = torch.randn(M, Nn, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(Nn, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    nb = 3 * M * Nn * 2
    orig_cfg, orig_gw = N.norm_bwd_config, H.GRAD_PROGRAMS_PER_SM
    for layer in (False, True):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        bg = torch.zeros_like(w).requires_grad_() if layer else None
        y = (wf.layer_norm(xg, (Nn,), wg, bg) if layer else wf.rms_norm(xg, (Nn,), wg, 1e-6))
        ins = [xg, wg] + ([bg] if layer else [])
        ref = torch.autograd.grad(y, ins, dy, retain_graph=True)
        for warps, rws, gw in itertools.product((4, 8, 16), (1, 2), (1, 2, 4)):
            if warps * 32 * 8 // rws < 1024 and warps > 4:
                pass
            N.norm_bwd_config = lambda n, layer, w_=warps, r_=rws: H.RowConfig("block", triton.next_power_of_2(n), r_, w_)
            H.GRAD_PROGRAMS_PER_SM = gw
            try:
                got = torch.autograd.grad(y, ins, dy, retain_graph=True)
                err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(got, ref))
                t = ms(lambda: torch.autograd.grad(y, ins, dy, retain_graph=True))
                report(f"{'layer' if layer else 'rms'}_norm bwd warps={warps} rows={rws} programs/SM={gw}", nb, t, err=err)
            except Exception as e:  # noqa: BLE001
                print("failed", warps, rws, gw, repr(e)[:200])
            finally:
                N.norm_bwd_config, H.GRAD_PROGRAMS_PER_SM = orig_cfg, orig_gw


def rope_sweep():
    B, Hq, Hk, S, D = 4, 32, 8, 4096, 128
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
    ang = torch.arange(S, device="cuda")[:, None] * (1e-4 ** (torch.arange(0, D, 2, device="cuda") / D))
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()
    nb = 2 * (q.numel() + k.numel()) * 2
    ref = R.rope_reference(q, k, cos, sin, None, False)
    orig = R.rope_config
    tc = torch.compile(lambda a, b: R.rope_reference(a, b, cos, sin, None, False), dynamic=False)
    report("rope fwd compile(reference)", nb, ms(lambda: tc(q, k)))
    for bs, hq_, hk_, split, warps in itertools.product((1, 2, 4, 8), (4, 8, 16, 32), (8,), (1, 0), (4, 8)):
        def cfg(*a, bs=bs, hq_=hq_, hk_=hk_, split=split, warps=warps):
            groups = triton.cdiv(Hq, hq_) + triton.cdiv(Hk, hk_)
            return H.RopeConfig(bs, hq_, hk_, groups if split == 0 else split, warps)
        R.rope_config = cfg
        try:
            out = wf.apply_rope(q, k, cos, sin)
            err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(out, ref))
            t = ms(lambda: wf.apply_rope(q, k, cos, sin))
            tb = ms(lambda: R._rope_launch(q, k, cos, sin, None, 0, False, backward=True))
            report(f"rope block_s={bs} heads_q={hq_} split={'all' if split == 0 else 1} warps={warps}", nb, t, err=err,
                   bwd_gbps=nb / tb / 1e6)
        except Exception as e:  # noqa: BLE001
            print("failed", bs, hq_, split, warps, repr(e)[:200])
        finally:
            R.rope_config = orig


if __name__ == "__main__":
    from warpforge.runtime.device import ceilings
    COPY = ceilings()["copy_gbps"]
    fwd_bwd_study()
    norm_bwd_sweep()
    rope_sweep()
    json.dump(rows, open(os.path.join(OUT, "probe_tune.json"), "w"), indent=1)
    print(f"\n{'case':<70} {'ms':>8} {'GB/s':>6} {'%copy':>6}  extra")
    for r in rows:
        extra = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k not in ("name", "ms", "gbps", "pct")}
        print(f"{r['name']:<70} {r['ms']:8.4f} {r['gbps']:6.0f} {r['pct']:6.1f}  {extra}")
