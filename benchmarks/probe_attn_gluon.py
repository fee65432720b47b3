"""Device probe: a Hopper forward-attention kernel written in Gluon (Triton's explicit-layout
dialect), with the next tile's QK^T in flight while this tile's softmax runs -- the overlap
Triton's `tl.dot` does not give (its pipeliner waits on a QK^T result right after issuing it,
NOTES item 43). Dense self-attention, L == S a multiple of the tiles, contiguous (B, H, S, D).

Schedule of one program (BLOCK_M query rows, 2 warpgroups; K and V tiles in 2-slot TMA rings):
    S_0 = Q K_0^T;  P_0 = softmax(S_0)
    for j in 1..n-1:
        issue S_j = Q K_j^T          (async)
        issue O  += P_{j-1} V_{j-1}  (async)
        wait S_j;  P_j, alpha = softmax(S_j)        <- the exp2s run under the PV MMA
        wait O;    O *= alpha;  refill the freed K and V slots
    O += P_{n-1} V_{n-1}

A second schedule, S_{j+1} issued before the softmax of S_j, was slower (495 against 520
TFLOP/s; probes_s19/attn_gluon_2_schedule2.log, its code in git history at 97117a0). The kernel
that landed is the warp-specialised one in ops/attention_sm90.py (config "ws" here).

    python benchmarks/probe_attn_gluon.py [--shape 4,32,4096,128]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _gl_attn_fwd(q_desc, k_desc, v_desc, o_desc, lse_ptr, S_len, scale_log2,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                 CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    m0 = pid_m * BLOCK_M
    row0 = bh * S_len
    dtype: gl.constexpr = q_desc.dtype

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    scol: gl.constexpr = gl.SliceLayout(0, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)

    if CAUSAL:
        n_tiles = (m0 + BLOCK_M) // BLOCK_N
    else:
        n_tiles = S_len // BLOCK_N
    kv_bytes: gl.constexpr = BLOCK_N * D * 2

    mbarrier.expect(q_bar, BLOCK_M * D * 2)
    tma.async_copy_global_to_shared(q_desc, [row0 + m0, 0], q_bar, q_smem)
    for i in gl.static_range(2):
        ok = i < n_tiles
        mbarrier.expect(k_bar.index(i), kv_bytes, pred=ok)
        tma.async_copy_global_to_shared(k_desc, [row0 + i * BLOCK_N, 0], k_bar.index(i), k_smem.index(i), pred=ok)
        mbarrier.expect(v_bar.index(i), kv_bytes, pred=ok)
        tma.async_copy_global_to_shared(v_desc, [row0 + i * BLOCK_N, 0], v_bar.index(i), v_smem.index(i), pred=ok)

    rows = m0 + gl.arange(0, BLOCK_M, layout=srow)
    cols = gl.arange(0, BLOCK_N, layout=scol)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)),
                      gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    gl.thread_barrier()                                     # every warpgroup is done with K_0
    ok = 2 < n_tiles
    mbarrier.expect(k_bar.index(0), kv_bytes, pred=ok)
    tma.async_copy_global_to_shared(k_desc, [row0 + 2 * BLOCK_N, 0], k_bar.index(0), k_smem.index(0), pred=ok)
    if CAUSAL:
        if BLOCK_N > m0:
            s = gl.where(rows[:, None] >= cols[None, :], s, -float("inf"))
    m_i = gl.max(s, 1) * scale_log2
    p = gl.exp2(s * scale_log2 - m_i[:, None])
    l_i = gl.sum(p, 1)
    acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)

    for j in range(1, n_tiles):
        st = j % 2
        mbarrier.wait(k_bar.index(st), (j // 2) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s, use_acc=False, is_async=True)
        pv = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_bar.index(1 - st), ((j - 1) // 2) & 1)
        acc = warpgroup_mma(pv, v_smem.index(1 - st), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        if CAUSAL:
            if (j + 1) * BLOCK_N > m0:
                s = gl.where(rows[:, None] >= (j * BLOCK_N + cols)[None, :], s, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * scale_log2)
        p = gl.exp2(s * scale_log2 - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc, pv = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pv))
        acc = acc * gl.convert_layout(alpha, orow)[:, None]
        gl.thread_barrier()                                 # every warpgroup is done with K_j, V_{j-1}
        ok = j + 2 < n_tiles
        mbarrier.expect(k_bar.index(st), kv_bytes, pred=ok)
        tma.async_copy_global_to_shared(k_desc, [row0 + (j + 2) * BLOCK_N, 0], k_bar.index(st), k_smem.index(st), pred=ok)
        ok = j + 1 < n_tiles
        mbarrier.expect(v_bar.index(1 - st), kv_bytes, pred=ok)
        tma.async_copy_global_to_shared(v_desc, [row0 + (j + 1) * BLOCK_N, 0], v_bar.index(1 - st), v_smem.index(1 - st), pred=ok)

    last = n_tiles - 1
    pv = gl.convert_layout(p.to(dtype), p_layout)
    mbarrier.wait(v_bar.index(last % 2), (last // 2) & 1)
    acc = warpgroup_mma(pv, v_smem.index(last % 2), acc, is_async=True)
    acc, pv = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pv))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(2):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))
    out = acc / gl.convert_layout(l_i, orow)[:, None]
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(lse_ptr + row0 + rows, lse)
    q_smem.store(out.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(o_desc, [row0 + m0, 0], q_smem)
    tma.store_wait(pendings=0)


def launch(q, k, v, o, lse, causal, BM=128, BN=128, warps=8, sched=1):
    """sched 1: the single-partition kernel (8 warps, BM query rows); sched "ws": the library's
    warp-specialised kernel (two 64-row consumer warpgroups + a loader)."""
    B, H, S, D = q.shape
    q2, k2, v2, o2 = (t.view(B * H * S, D) for t in (q, k, v, o))
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    qrows = 64 if str(sched).startswith("ws") else BM
    lq = gl.NVMMASharedLayout.get_default_for([qrows, D], gdt)
    lk = gl.NVMMASharedLayout.get_default_for([BN, D], gdt)
    qd = TensorDescriptor.from_tensor(q2, [qrows, D], lq)
    od = TensorDescriptor.from_tensor(o2, [qrows, D], lq)
    kd = TensorDescriptor.from_tensor(k2, [BN, D], lk)
    vd = TensorDescriptor.from_tensor(v2, [BN, D], lk)
    scale = D ** -0.5 * 1.4426950408889634
    if str(sched).startswith("ws"):
        # the warp-specialised kernel as it landed in the library (4-D descriptors, 2 slots); this
        # probe's first version of it (2-D views, "ws2"/"ws3" slots) is in probes_s19/attn_gluon_3_ws.log
        from warpforge.ops.attention_sm90 import attention_fwd_sm90
        attention_fwd_sm90(q, k, v, o, lse.view(B, H, S), D ** -0.5, causal)
        return
    _gl_attn_fwd[(S // BM, B * H)](qd, kd, vd, od, lse, S, scale, BLOCK_M=BM, BLOCK_N=BN, D=D, CAUSAL=causal, num_warps=warps)


CONFIGS = [(128, 128, 8, 1), (128, 128, 4, "ws")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,32,4096,128")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import warpforge as wf
    B, H, S, D = (int(x) for x in args.shape.split(","))
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rows = []

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
        rows.append(dict(causal=causal, impl="warpforge", ms=ms, tflops=fl / ms / 1e9, err=0.0))
        print(rows[-1], flush=True)
        for BM, BN, w, sched in CONFIGS:
            name = f"gluon{sched} {BM}x{BN} w{w}"
            o = torch.full_like(q, float("nan"))
            lse = torch.full((B * H * S,), float("nan"), device="cuda")
            try:
                launch(q, k, v, o, lse, causal, BM, BN, w, sched)
                torch.cuda.synchronize()
                err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                ms = bench(lambda: launch(q, k, v, o, lse, causal, BM, BN, w, sched))
                rows.append(dict(causal=causal, impl=name, ms=ms, tflops=fl / ms / 1e9, err=err,
                                 lse_nan=bool(lse.isnan().any())))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(causal=causal, impl=name, error=str(e)[:400]))
            print(rows[-1], flush=True)
    out_dir = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out_dir, "probe_attn_gluon.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), shape=[B, H, S, D], rows=rows), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  B{B} H{H} S{S} D{D} bf16")
    print("| causal | impl | ms | TFLOP/s | rel err |\n|---|---|---|---|---|")
    for r in rows:
        if "ms" in r:
            print(f"| {r['causal']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} | {r['err']:.1e} |")
        else:
            print(f"| {r['causal']} | {r['impl']} | error: {r['error'][:150]} | | |")


if __name__ == "__main__":
    main()
