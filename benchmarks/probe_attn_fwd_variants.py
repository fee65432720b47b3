"""Device probe: forward-attention loop structures on the bar shape (B=4, H=32, S=4096, D=128,
bf16), beside warpforge's kernel and SDPA's cuDNN backend. Not the benchmark (`warpforge bench
attention` is): a bench of inner-loop shapes, each a constexpr of one experimental kernel, dense
and self-attention only (L == S, top-left causal), to find what to carry into ops/attention.py.

Variants (constexpr flags of `_probe_fwd`):
- PIPE: QK^T of the next key tile is issued before the softmax of this one, so the tensor cores
  work on it while the exp2s run (FlashAttention-3's intra-warpgroup overlap, written by hand:
  the dot is asynchronous on sm_90 until its result is first used).
- DESC: K and V tiles through TMA tensor descriptors (host-made) instead of pointer loads.
- WS: the key loop as `tl.range(..., warp_specialize=True)`.

    python benchmarks/probe_attn_fwd_variants.py [--shape 4,32,4096,128] [--compile-only]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None


@triton.jit
def _load_kv(k_ptr, v_ptr, k_desc, v_desc, row0, n0, offs_n, offs_d, D: tl.constexpr, DESC: tl.constexpr):
    if DESC:
        k = k_desc.load([row0 + n0, 0])
        v = v_desc.load([row0 + n0, 0])
    else:
        n = row0 + n0 + offs_n
        k = tl.load(k_ptr + n[:, None] * D + offs_d[None, :])
        v = tl.load(v_ptr + n[:, None] * D + offs_d[None, :])
    return k, v


@triton.jit
def _load_k(k_ptr, k_desc, row0, n0, offs_n, offs_d, D: tl.constexpr, DESC: tl.constexpr):
    if DESC:
        return k_desc.load([row0 + n0, 0])
    n = row0 + n0 + offs_n
    return tl.load(k_ptr + n[:, None] * D + offs_d[None, :])


@triton.jit
def _load_v(v_ptr, v_desc, row0, n0, offs_n, offs_d, D: tl.constexpr, DESC: tl.constexpr):
    if DESC:
        return v_desc.load([row0 + n0, 0])
    n = row0 + n0 + offs_n
    return tl.load(v_ptr + n[:, None] * D + offs_d[None, :])


@triton.jit
def _softmax_step(qk, m_i, l_i, acc, scale_log2):
    m_new = tl.maximum(m_i, tl.max(qk, 1) * scale_log2)
    p = tl.math.exp2(qk * scale_log2 - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, m_new, l_i, acc


@triton.jit
def _probe_fwd(q_ptr, k_ptr, v_ptr, o_ptr, k_desc, v_desc, S, H, scale_log2,
               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, PIPE: tl.constexpr, DESC: tl.constexpr, WS: tl.constexpr,
               STAGES: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    row0 = bh * S                                   # first row of this head in the (B*H*S, D) views
    m0 = pid_m * BLOCK_M
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + (row0 + m0 + offs_m)[:, None] * D + offs_d[None, :])
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    hi = S
    if CAUSAL:
        hi = m0                                     # unmasked tiles: wholly below the diagonal
    if PIPE:
        if hi > 0:
            k = _load_k(k_ptr, k_desc, row0, 0, offs_n, offs_d, D, DESC)
            qk = tl.dot(q, k.T)
            for n0 in tl.range(BLOCK_N, hi, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
                kn = _load_k(k_ptr, k_desc, row0, n0, offs_n, offs_d, D, DESC)
                qk_next = tl.dot(q, kn.T)
                p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, scale_log2)
                v = _load_v(v_ptr, v_desc, row0, n0 - BLOCK_N, offs_n, offs_d, D, DESC)
                acc = tl.dot(p.to(v.dtype), v, acc)
                qk = qk_next
            p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, scale_log2)
            v = _load_v(v_ptr, v_desc, row0, hi - BLOCK_N, offs_n, offs_d, D, DESC)
            acc = tl.dot(p.to(v.dtype), v, acc)
    else:
        for n0 in tl.range(0, hi, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
            k, v = _load_kv(k_ptr, v_ptr, k_desc, v_desc, row0, n0, offs_n, offs_d, D, DESC)
            qk = tl.dot(q, k.T)
            p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, scale_log2)
            acc = tl.dot(p.to(v.dtype), v, acc)
    if CAUSAL:                                      # the diagonal tiles, masked
        for n0 in range(m0, m0 + BLOCK_M, BLOCK_N):
            k, v = _load_kv(k_ptr, v_ptr, k_desc, v_desc, row0, n0, offs_n, offs_d, D, DESC)
            qk = tl.dot(q, k.T)
            qk = tl.where((m0 + offs_m)[:, None] >= (n0 + offs_n)[None, :], qk, -float("inf"))
            p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, scale_log2)
            acc = tl.dot(p.to(v.dtype), v, acc)
    out = acc / l_i[:, None]
    tl.store(o_ptr + (row0 + m0 + offs_m)[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty))


VARIANTS = {
    # name: (BLOCK_M, BLOCK_N, warps, stages, PIPE, DESC, WS, maxnreg)
    "base 128x64 w8 s3": (128, 64, 8, 3, False, False, False, None),
    "base 128x64 w8 s2": (128, 64, 8, 2, False, False, False, None),
    "base 128x64 w8 s2 r128": (128, 64, 8, 2, False, False, False, 128),
    "base 128x32 w8 s3 r128": (128, 32, 8, 3, False, False, False, 128),
    "base 128x128 w8 s2": (128, 128, 8, 2, False, False, False, None),
    "base 64x64 w4 s3": (64, 64, 4, 3, False, False, False, None),
    "base 64x128 w4 s2": (64, 128, 4, 2, False, False, False, None),
    "desc 128x64 w8 s3": (128, 64, 8, 3, False, True, False, None),
    "desc 128x64 w8 s2 r128": (128, 64, 8, 2, False, True, False, 128),
    "pipe 128x64 w8 s2": (128, 64, 8, 2, True, False, False, None),
    "ws+desc 128x128 w8 s2": (128, 128, 8, 2, False, True, True, None),
    "ws+desc 128x64 w8 s2 r128": (128, 64, 8, 2, False, True, True, 128),
}


def launch(q, k, v, o, causal, cfg):
    BM, BN, w, s, pipe, desc, ws, nreg = cfg
    B, H, S, D = q.shape
    q2, k2, v2, o2 = (t.view(B * H * S, D) for t in (q, k, v, o))
    kd = vd = None
    if desc:
        kd = TensorDescriptor.from_tensor(k2, [BN, D])
        vd = TensorDescriptor.from_tensor(v2, [BN, D])
    else:
        kd, vd = k2, v2                              # unused placeholders
    grid = (S // BM, B * H)
    _probe_fwd[grid](q2, k2, v2, o2, kd, vd, S, H, D ** -0.5 * 1.4426950408889634,
                     D=D, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=causal, PIPE=pipe, DESC=desc, WS=ws,
                     STAGES=s, num_warps=w, num_stages=s, maxnreg=nreg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,32,4096,128")
    ap.add_argument("--only", default="", help="comma list of variant name prefixes")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import warpforge as wf
    B, H, S, D = (int(x) for x in args.shape.split(","))
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rows = []
    out_dir = os.environ.get("OUT", "/tmp")

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=300, return_mode="median")

    for causal in (False, True):
        fl = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
        rows.append(dict(causal=causal, impl="sdpa cudnn", ms=ms, tflops=fl / ms / 1e9, err=0.0))
        print(rows[-1], flush=True)
        ms = bench(lambda: wf.scaled_dot_product_attention(q, k, v, is_causal=causal))
        err = ((wf.scaled_dot_product_attention(q, k, v, is_causal=causal).float() - ref.float()).norm() / ref.float().norm()).item()
        rows.append(dict(causal=causal, impl="warpforge", ms=ms, tflops=fl / ms / 1e9, err=err))
        print(rows[-1], flush=True)
        for name, cfg in VARIANTS.items():
            if args.only and not any(name.startswith(p) for p in args.only.split(",")):
                continue
            o = torch.full_like(q, float("nan"))
            try:
                launch(q, k, v, o, causal, cfg)
                torch.cuda.synchronize()
                err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                ms = bench(lambda: launch(q, k, v, o, causal, cfg))
                rows.append(dict(causal=causal, impl=name, ms=ms, tflops=fl / ms / 1e9, err=err))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(causal=causal, impl=name, error=str(e)[:300]))
            print(rows[-1], flush=True)
    with open(os.path.join(out_dir, "probe_attn_fwd_variants.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), shape=[B, H, S, D], rows=rows), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  B{B} H{H} S{S} D{D} bf16")
    print("| causal | impl | ms | TFLOP/s | rel err |\n|---|---|---|---|---|")
    for r in rows:
        if "ms" in r:
            print(f"| {r['causal']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} | {r['err']:.1e} |")
        else:
            print(f"| {r['causal']} | {r['impl']} | error: {r['error'][:120]} | | |")


if __name__ == "__main__":
    main()
