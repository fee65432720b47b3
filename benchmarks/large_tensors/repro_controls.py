"""Controls: kernels the audit judged SAFE (int64 offsets), exercised past 2^31 elements the same way as
the suspects. Each should print OK; a failure here means the audit missed something. Run by
run_all.py only with --controls (they add ~1-2 minutes and up to ~20 GB per check).

Run alone: python repro_controls.py   (AUDIT64_TINY=1: a CPU/interpreter smoke test of the logic only)
"""
import math
import os

os.environ.setdefault("WARPFORGE_FASTPATH", "0")
import torch
import warpforge as wf

from common import DEV, TINY, nanmax as _nanmax, run_standalone, sync as _sync
BF16 = torch.bfloat16
TOL = 3e-2




def _gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def _verdict(errs: dict) -> str:
    worst = _nanmax(errs.values())
    if worst <= TOL:
        return "OK"
    return f"WRONG (max err {worst:.3g}; " + ", ".join(f"{k}: {v:.3g}" for k, v in errs.items()) + ")"


def _rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


# rows of 32K (+ 64) columns, 2^16 + 64 rows: 2.15e9 elements; the last rows are past 2^31
ROWS, COLS = (96, 20000) if TINY else (2**16 + 64, 2**15 + 64)
LAST = 16 if TINY else 64


def add() -> str:
    n = 5000 if TINY else 2**31 + 2**16
    g = _gen(0)
    x = torch.randn(n, dtype=BF16, device=DEV, generator=g)
    y = torch.randn(n, dtype=BF16, device=DEV, generator=g)
    out = wf.add(x, y, alpha=0.5)
    _sync()
    return _verdict({"tail": _rel(out[-65536:], x[-65536:].float() + 0.5 * y[-65536:].float())})


def sum_amax_rows() -> str:
    x = torch.randn(ROWS, COLS, dtype=BF16, device=DEV, generator=_gen(1))
    s, m = wf.sum(x, -1, dtype=torch.float32), wf.amax(x, -1)
    _sync()
    return _verdict({"sum": float((s[-LAST:] - x[-LAST:].float().sum(-1)).abs().max()) / 10.0,
                     "amax": _rel(m[-LAST:], x[-LAST:].amax(-1))})


def softmax_rows() -> str:
    x = torch.randn(ROWS, COLS, dtype=BF16, device=DEV, generator=_gen(2))
    y = wf.softmax(x, -1)
    ly = wf.log_softmax(x[-LAST:], -1)  # noqa: F841  (small call, just exercising the same path)
    _sync()
    return _verdict({"softmax": _rel(y[-LAST:], torch.softmax(x[-LAST:].float(), -1))})


def rms_norm_fwd_bwd() -> str:
    g = _gen(3)
    x = torch.randn(ROWS, COLS, dtype=BF16, device=DEV, generator=g).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(COLS, dtype=BF16, device=DEV, generator=g)).requires_grad_(True)
    y = wf.rms_norm(x, (COLS,), w)
    dy = torch.randn(ROWS, COLS, dtype=BF16, device=DEV, generator=g)
    y.backward(dy)
    _sync()
    xs = x.detach()[-LAST:].float().requires_grad_(True)
    ws = w.detach().float().requires_grad_(True)
    ref = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + torch.finfo(BF16).eps) * ws
    ref.backward(dy[-LAST:].float())
    return _verdict({"y": _rel(y[-LAST:], ref), "dx": _rel(x.grad[-LAST:], xs.grad)})


def swiglu_packed() -> str:
    gate_up = torch.randn(ROWS, COLS * 2 if TINY else 2**15, dtype=BF16, device=DEV, generator=_gen(4))
    n = gate_up.shape[1] // 2
    out = wf.swiglu(gate_up)
    _sync()
    gl, ul = gate_up[-LAST:, :n].float(), gate_up[-LAST:, n:].float()
    return _verdict({"tail rows": _rel(out[-LAST:], torch.nn.functional.silu(gl) * ul)})


def cross_entropy_big() -> str:
    T, V = (64, 1000) if TINY else (16400, 131072)      # 2.15e9 logits
    g = _gen(5)
    logits = torch.randn(T, V, dtype=BF16, device=DEV, generator=g).requires_grad_(True)
    target = torch.randint(0, V, (T,), device=DEV, generator=g)
    loss = wf.cross_entropy(logits, target)
    (loss * 0.5).backward()                              # upstream 0.5: the scale loop runs (int64 here)
    _sync()
    errs = {}
    for name, sl in (("grad first rows", slice(0, LAST)), ("grad last rows", slice(T - LAST, T))):
        p = torch.softmax(logits.detach()[sl].float(), -1)
        p[torch.arange(LAST, device=DEV), target[sl]] -= 1.0
        errs[name] = _rel(logits.grad[sl], p * (0.5 / T))
    return _verdict(errs)


def rope_bshd() -> str:
    L, H, D = (64, 2, 32) if TINY else (2**19 + 2**13, 32, 128)
    g = _gen(6)
    qb = torch.randn(1, L, H, D, dtype=BF16, device=DEV, generator=g)
    kb = torch.randn(1, L, H, D, dtype=BF16, device=DEV, generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    f = torch.arange(L, device=DEV).float()[:, None] * inv[None, :]
    emb = torch.cat([f, f], -1)
    cos, sin = emb.cos(), emb.sin()
    qo, ko = wf.apply_rope(qb.transpose(1, 2), kb.transpose(1, 2), cos, sin)
    _sync()
    x = qb[0, -LAST:].float()                                             # (LAST, H, D)
    c, s = cos[-LAST:, None, :], sin[-LAST:, None, :]
    rot = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
    return _verdict({"q tail": _rel(qo[0, :, -LAST:].transpose(0, 1), x * c + rot * s)})


def decode_big_cache() -> str:
    page, hkv, d, hq = 16, 8, 128, 32
    nblocks = 64 if TINY else 2**31 // (page * hkv * d) + 256          # 4.3 GB per cache
    g = _gen(7)
    kc = torch.randn(nblocks, page, hkv, d, dtype=BF16, device=DEV, generator=g)
    vc = torch.randn(nblocks, page, hkv, d, dtype=BF16, device=DEV, generator=g)
    errs = {}
    for max_blocks in ((8,) if TINY else (64, 1024)):        # 64: the Triton kernel; 1024: sm90 (Hopper)
        B = 2
        seq = max_blocks * page - 3
        # the highest blocks of the cache: all past element 2^31
        bt = torch.arange(nblocks - B * max_blocks, nblocks, device=DEV, dtype=torch.int32).view(B, max_blocks)
        lens = torch.full((B,), seq, device=DEV, dtype=torch.int32)
        q = torch.randn(B, hq, d, dtype=BF16, device=DEV, generator=g)
        out = wf.decode_attention(q, kc, vc, bt, lens)
        _sync()
        ref = torch.empty(B, hq, d, device=DEV)
        for b in range(B):
            k = kc[bt[b].long()].reshape(-1, hkv, d)[:seq].float().repeat_interleave(hq // hkv, 1)
            v = vc[bt[b].long()].reshape(-1, hkv, d)[:seq].float().repeat_interleave(hq // hkv, 1)
            s = torch.einsum("hd,nhd->hn", q[b].float(), k) / math.sqrt(d)
            ref[b] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v)
        errs[f"max_blocks={max_blocks}"] = float((out.float() - ref).abs().max())
    return _verdict(errs)


def moe_big_weights() -> str:
    E, n, d = (4, 32, 64) if TINY else (64, 2048, 8448)          # E * 2n * d = 2.21e9: the last expert starts past 2^31
    T, k = (8, 2) if TINY else (256, 2)
    g = _gen(8)
    w1 = (torch.randn(E, 2 * n, d, dtype=BF16, device=DEV, generator=g) * d ** -0.5)
    w2 = (torch.randn(E, d, n, dtype=BF16, device=DEV, generator=g) * n ** -0.5)
    x = torch.randn(T, d, dtype=BF16, device=DEV, generator=g)
    ids = torch.stack([torch.full((T,), E - 1, device=DEV), torch.full((T,), E - 2, device=DEV)], -1).int()
    wts = torch.rand(T, k, device=DEV, generator=g)
    out = wf.moe_experts(x, w1, w2, wts.to(BF16), ids)
    _sync()
    ref = torch.zeros(T, d, device=DEV)
    for j in range(k):
        e = int(ids[0, j])
        z = x.float() @ w1[e].float().T
        h = torch.nn.functional.silu(z[:, :n]) * z[:, n:]
        ref += (h @ w2[e].float().T) * wts.to(BF16)[:, j:j + 1].float()
    return _verdict({"out": _rel(out, ref)})


def attention_sm90_long_kv() -> str:
    H, D = (2, 32) if TINY else (32, 128)
    S = 300 if TINY else 2**19 + 2**13        # K/V (1, S, H, D) seen as (1, H, S, D): keys past 2^31 elements
    Lq = 64 if TINY else 128
    g = _gen(9)
    q = torch.randn(1, Lq, H, D, dtype=BF16, device=DEV, generator=g).transpose(1, 2)
    kb = torch.randn(1, S, H, D, dtype=BF16, device=DEV, generator=g)
    vb = torch.randn(1, S, H, D, dtype=BF16, device=DEV, generator=g)
    o = wf.scaled_dot_product_attention(q, kb.transpose(1, 2), vb.transpose(1, 2))   # dense: sm90 on Hopper
    _sync()
    worst = 0.0
    for h in range(H):
        s = (q[0, h].float() @ kb[0, :, h].float().T) / math.sqrt(D)
        ref = torch.softmax(s, -1) @ vb[0, :, h].float()
        worst = max(worst, float((o[0, h].float() - ref).abs().max()))
    return _verdict({"o": worst})


def linear_fwd_big_x() -> str:
    T, d, n = (512, 64, 64) if TINY else (2**19 + 2**13, 4096, 256)   # x: 2.18e9 elements; TMA persistent on Hopper
    g = _gen(10)
    x = torch.randn(T, d, dtype=BF16, device=DEV, generator=g)
    w = torch.randn(n, d, dtype=BF16, device=DEV, generator=g) * d ** -0.5
    y = wf.linear(x, w)
    _sync()
    return _verdict({"last rows": _rel(y[-LAST:], x[-LAST:].float() @ w.float().T),
                     "first rows": _rel(y[:LAST], x[:LAST].float() @ w.float().T)})


SUSPECTS = {  # named CONTROL by run_all.py
    "add (add.py int64 offsets)": add,
    "sum/amax rows (reduce.py block/loop/partial, row.to(int64))": sum_amax_rows,
    "softmax rows (softmax.py, rows.to(int64))": softmax_rows,
    "rms_norm fwd+bwd (norms.py, rows.to(int64))": rms_norm_fwd_bwd,
    "swiglu packed (activations.py, row.to(int64))": swiglu_packed,
    "cross_entropy fwd+bwd, T*V > 2^31, upstream 0.5 (cross_entropy.py, row int64; scale loop int64)": cross_entropy_big,
    "apply_rope BSHD, > 2^31 (rope.py, int64)": rope_bshd,
    "decode_attention, KV cache > 2^31 (decode_attention.py page int64 / sm90 TMA)": decode_big_cache,
    "moe_experts, E*2n*d > 2^31 (moe.py e.to(int64))": moe_big_weights,
    "sdpa dense long K/V (attention_sm90.py TMA on Hopper)": attention_sm90_long_kv,
    "linear fwd, x > 2^31 elements (matmul.py persistent TMA / int64 rows)": linear_fwd_big_x,
}

if __name__ == "__main__":
    run_standalone(SUSPECTS, "CONTROL")
