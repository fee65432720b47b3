"""Suspects in ops/attention.py's Triton kernels (taken for every call with a mask, a sliding window,
varlen, head dims other than 64/128, fp32 -- and for all calls on pre-Hopper GPUs; on sm_90 dense
unmasked calls go to the Gluon kernels of attention_sm90.py, which address memory by TMA).

Row offsets inside a sequence are int32 row index times an int32 row stride:

  forward   q_base + rows[:, None] * sqm          attention.py:260   (q load)
            o_base + rows[:, None] * som          attention.py:279   (o store)
            k_base + n[None, :] * skn             attention.py:170/173/176 (_fwd_tiles, K)
            v_base + n[:, None] * svn             attention.py:171/174/177 (_fwd_tiles, V)
  backward  q_base + i[:, None] * sqm, sdm        attention.py:325-326/331-332/334-335 (_dkdv_tiles)
            k_base + n[:, None] * skn, svn        attention.py:432-439 (_dq_tiles)
  mask      mask_base + i * smm + n * smn         attention.py:184/187, 343/346, 444/447

(the batch/head/sequence-start terms and the kernels' own tile loads use int64: q0 + i, k0 + n).
The row stride of the usual (B, S, H, D) buffer seen as (B, H, S, D) through .transpose(1, 2) -- and
of varlen's packed (T, H, D) -- is H * D, so one sequence longer than 2^31 / (H * D) rows (524,288
tokens at H = 32, D = 128) overflows; a dense mask overflows once L * S > 2^31 (L = S >= 46,341).

Also a grid limit: every attention launch puts batch x heads on grid axis y (attention.py:625, 648,
667, 676; attention_sm90.py:825, 855, 873), which CUDA caps at 65,535: B * H > 65,535 (e.g. 2,048
sequences x 32 heads) fails to launch (the non-causal sm90 forward with L <= 2048 is persistent and
escapes it).

The repros use a causal sliding window (window_size=(127, 0)) so that the work is linear in L and
the Triton kernels are used on every GPU. Memory: fwd ~18 GB, bwd ~36 GB, mask ~3 GB, grid ~1 GB.

Run alone: python repro_attention.py   (AUDIT64_TINY=1: a CPU/interpreter smoke test of the logic only)
"""
import math
import os

os.environ.setdefault("WARPFORGE_FASTPATH", "0")
import torch
import warpforge as wf

from common import DEV, TINY, nanmax as _nanmax, run_standalone, sync as _sync
BF16 = torch.bfloat16

# (B, S, H, D) buffers seen as (B, H, S, D): row stride H * D = 4096; rows >= 2^19 are past 2^31.
H, D = (2, 32) if TINY else (32, 128)
L = 300 if TINY else 2**19 + 2**13          # 532,480 tokens: the last 8,192 rows are past 2^31 elements
LEFT = 15 if TINY else 127                   # sliding window: query i sees keys [i - LEFT, i]
R = 64 if TINY else 256                      # rows compared at each end




def _bshd(g, requires_grad=False):
    t = torch.randn(1, L, H, D, dtype=BF16, device=DEV, generator=g)
    return t.requires_grad_(requires_grad)


def _ref_window(q, k, v, q0, k0):
    """fp32 reference for query rows q0.. of (H, Lq, D) q against keys k0.. of (H, Lk, D) k, v."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    i = torch.arange(q0, q0 + q.shape[1], device=q.device)[:, None]
    j = torch.arange(k0, k0 + k.shape[1], device=q.device)[None, :]
    s = s.masked_fill(~((j <= i) & (j >= i - LEFT)), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _heads(t, lo, hi):
    """rows [lo, hi) of a (1, L, H, D) buffer as (H, rows, D) fp32."""
    return t[0, lo:hi].transpose(0, 1).float()


def run_fwd() -> str:
    g = torch.Generator(device=DEV).manual_seed(0)
    qb, kb, vb = _bshd(g), _bshd(g), _bshd(g)                                    # 3 x 4.4 GB
    o = wf.scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2),
                                        is_causal=True, window_size=(LEFT, 0))   # (1, H, L, D), BSHD memory
    _sync()
    errs = {}
    for name, lo in (("first rows", 0), ("last rows", L - R)):
        k0 = max(0, lo - LEFT)
        ref = _ref_window(_heads(qb, lo, lo + R), _heads(kb, k0, lo + R), _heads(vb, k0, lo + R), lo, k0)
        errs[name] = float((o[0, :, lo:lo + R].float() - ref).abs().max()) / max(1.0, float(ref.abs().max()))
    worst = _nanmax(errs.values())
    if worst <= 3e-2:
        return "OK"
    return f"WRONG (max err {worst:.3g}; " + ", ".join(f"{k}: {v:.3g}" for k, v in errs.items()) + ")"


def run_bwd() -> str:
    g = torch.Generator(device=DEV).manual_seed(1)
    qb, kb, vb = _bshd(g, True), _bshd(g, True), _bshd(g, True)
    o = wf.scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2),
                                        is_causal=True, window_size=(LEFT, 0))
    do = torch.zeros_like(o)                                                     # upstream gradient: last R rows only
    do[0, :, L - R:] = torch.randn(H, R, D, dtype=BF16, device=DEV, generator=g)
    o.backward(do)
    _sync()
    # reference on the slice: queries [L-R, L) (the only ones with a gradient) and the keys they see
    k0 = L - R - LEFT
    qs = _heads(qb.detach(), L - R, L).requires_grad_(True)
    ks = _heads(kb.detach(), k0, L).requires_grad_(True)
    vs = _heads(vb.detach(), k0, L).requires_grad_(True)
    _ref_window(qs, ks, vs, L - R, k0).backward(do[0, :, L - R:].float())
    errs = {}
    for name, got, ref in (("dq", qb.grad[0, L - R:], qs.grad), ("dk", kb.grad[0, k0:], ks.grad),
                           ("dv", vb.grad[0, k0:], vs.grad)):
        got = got.transpose(0, 1).float()
        errs[name] = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    worst = _nanmax(errs.values())
    if worst <= 3e-2:
        return "OK"
    return f"WRONG (max err {worst:.3g} relative; " + ", ".join(f"{k}: {v:.3g}" for k, v in errs.items()) + ")"


def run_mask() -> str:
    n = 300 if TINY else 47104                   # L = S; rows i >= 2^31 / S = 45,590 overflow i * S
    d = 32 if TINY else 64
    g = torch.Generator(device=DEV).manual_seed(2)
    q, k, v = (torch.randn(1, 1, n, d, dtype=BF16, device=DEV, generator=g) for _ in range(3))
    mask = torch.ones(n, n, dtype=torch.bool, device=DEV).tril_()                 # 2.2 GB, broadcast over (B, H)
    o = wf.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    _sync()
    rr = 64 if TINY else 256
    errs = {}
    for name, lo in (("first rows", 0), ("last rows", n - rr)):
        s = (q[0, 0, lo:lo + rr].float() @ k[0, 0].float().T) / math.sqrt(d)
        s = s.masked_fill(~mask[lo:lo + rr], float("-inf"))
        ref = torch.softmax(s, dim=-1) @ v[0, 0].float()
        errs[name] = float((o[0, 0, lo:lo + rr].float() - ref).abs().max()) / max(1.0, float(ref.abs().max()))
    worst = _nanmax(errs.values())
    if worst <= 3e-2:
        return "OK"
    return f"WRONG (max err {worst:.3g}; " + ", ".join(f"{k}: {v:.3g}" for k, v in errs.items()) + ")"


def _grid(window: bool) -> str:
    B, Hh, Lq, d = (2, 2, 16, 32) if TINY else (2048, 32, 16, 64)              # B * H = 65,536 > 65,535
    g = torch.Generator(device=DEV).manual_seed(3)
    q, k, v = (torch.randn(B, Hh, Lq, d, dtype=BF16, device=DEV, generator=g) for _ in range(3))
    kw = dict(is_causal=True, window_size=(4, 0)) if window else dict(is_causal=True)
    o = wf.scaled_dot_product_attention(q, k, v, **kw)
    _sync()
    i = torch.arange(Lq, device=DEV)[:, None]
    j = torch.arange(Lq, device=DEV)[None, :]
    allowed = (j <= i) & ((j >= i - 4) if window else True)
    errs = []
    for sl in (slice(0, 2), slice(B - 2, B)):
        s = (q[sl].float() @ k[sl].float().transpose(-1, -2)) / math.sqrt(d)
        ref = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1) @ v[sl].float()
        errs.append(float((o[sl].float() - ref).abs().max()) / max(1.0, float(ref.abs().max())))
    worst = _nanmax(errs)
    return "OK" if worst <= 3e-2 else f"WRONG (max err {worst:.3g})"


def run_grid_causal() -> str:
    return _grid(window=False)


def run_grid_window() -> str:
    return _grid(window=True)


SUSPECTS = {
    "attention.fwd_row_times_row_stride (attention.py:260,279,170-177; BSHD L*H*D > 2^31)": run_fwd,
    "attention.bwd_row_times_row_stride (attention.py:325-337,432-439; BSHD L*H*D > 2^31)": run_bwd,
    "attention.mask_row_times_mask_stride (attention.py:184,187,343,346,444,447; L*S > 2^31)": run_mask,
    "attention.grid_y_B*H_over_65535 causal (sm90 attention_sm90.py:855 / Triton attention.py:625)": run_grid_causal,
    "attention.grid_y_B*H_over_65535 window (Triton attention.py:625)": run_grid_window,
}

if __name__ == "__main__":
    run_standalone(SUSPECTS, "SUSPECT")
