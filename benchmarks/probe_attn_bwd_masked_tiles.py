"""The Triton dK/dV kernel's tiles where the masked, windowed and packed backward runs it (issue 6;
a probe, not the benchmark). Compiled offline for sm_90a (NOTES item 76), its default config at
D = 128 (64 x 128, 8 warps, 4 stages) spills 0.8-3.1 KB with a mask or a window, fewer stages less.
For each case, forward+backward through the public functions under each dK/dV config (the
forward and the dQ kernel unchanged), clean timer, two rounds alternating; dK and dV checked
against the default config's.

    python benchmarks/probe_attn_bwd_masked_tiles.py
"""
from __future__ import annotations

import torch

import warpforge as wf
from warpforge.bench.timing import TimingConfig, device_ms
from warpforge.ops import attention as attn
from warpforge.runtime.heuristics import AttentionConfig

CONFIGS = [None, (64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (64, 64, 8, 3), (32, 64, 4, 3)]


def cases():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    B, H, S, D = 2, 16, 2048, 128
    q, k, v = (torch.randn(B, H, S, D, **bf, requires_grad=True) for _ in range(3))
    mask = torch.rand(S, S, device="cuda") > 0.3
    yield "dense bool mask", (q, k, v), lambda: wf.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    yield "dense window 256", (q, k, v), lambda: wf.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                 window_size=(256, 0))
    lens = [3000, 17, 1000, 4097, 2048, 1, 2500, 3721]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    qp, kp, vp = (torch.randn(sum(lens), 16, D, **bf, requires_grad=True) for _ in range(3))
    for name, kw in (("varlen causal", dict(causal=True)), ("varlen window 256", dict(causal=True, window_size=(256, 0)))):
        yield name, (qp, kp, vp), (lambda kw=kw: wf.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens),
                                                                     validate=False, **kw))


def main():
    cfg = TimingConfig.quick()
    saved = attn.attention_config
    res, errs = {}, {}
    for name, (q, k, v), fwd in cases():
        do = torch.randn_like(fwd())

        def step():
            return torch.autograd.grad(fwd(), (q, k, v), do)

        want = None
        for r in range(2):
            for c in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):
                if c is not None:
                    attn.attention_config = (lambda c: lambda kind, d, e: AttentionConfig(*c) if kind == "dkdv"
                                             else saved(kind, d, e))(c)
                try:
                    got = step()
                    if c is None:
                        want = want or got
                    elif want is not None and r == 1:
                        errs[(name, c)] = max(float((g.float() - w.float()).norm() / w.float().norm())
                                              for g, w in zip(got[1:], want[1:]))
                    res.setdefault((name, c), []).append(device_ms(step, cfg) * 1e3)
                except Exception as e:  # noqa: BLE001 (a config that does not fit: reported)
                    res[(name, c)] = [float("nan")]
                    errs[(name, c)] = str(e)[:80]
                finally:
                    attn.attention_config = saved
    print(f"{'case':20s} {'dkdv config':18s} {'us':>9s} {'vs default':>10s}  dK/dV vs default  rounds")
    for (name, c), v in res.items():
        base = min(res[(name, None)])
        print(f"{name:20s} {str(c or 'default'):18s} {min(v):9.1f} {min(v) / base:10.3f}  {errs.get((name, c), '-')}  "
              f"{[round(x, 1) for x in v]}")


if __name__ == "__main__":
    main()
