"""Compile the sm90 Gluon attention kernels for sm_90a without a GPU (binder + triton.compile to cubin)."""
import os, sys, time
os.environ.setdefault("TRITON_CACHE_DIR", "/tmp/attmut_tools/cache")
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from triton.experimental.gluon._runtime import GluonASTSource
import warpforge.ops.attention_sm90 as A

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)

def compile_(fn, *args, **kw):
    binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
    bound, spec, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(BACKEND, kw, bound, spec, opts)
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=TARGET, options=options.__dict__)

def T(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype)

def fwd(D, causal, persistent, bn=128, maxnreg=A.MAXNREG, regs=240):
    B, H, L = 1, 2, 256
    q, k, v, o = T(B, H, L, D), T(B, H, L, D), T(B, H, L, D), T(B, H, L, D)
    lse = torch.empty(B, H, L)
    descs = (A._desc(q, A.HALF), A._desc(k, bn), A._desc(v, bn), A._desc(o, A.HALF))
    la = (lse, lse.stride(0), lse.stride(1), lse.stride(2))
    if persistent:
        return compile_(A._attn_fwd_sm90_persistent_kernel, *descs, *la, H, 1, L, L, 2, 4, 0.1,
                        num_warps=4, maxnreg=A.MAXNREG)
    return compile_(A._attn_fwd_sm90_kernel, *descs, *la, H, 1, L, L, 0.1, CAUSAL=causal, REGS=regs,
                    num_warps=4, maxnreg=maxnreg)

def dq(D, causal):
    B, H, L = 1, 2, 256
    bn = A.DQ_BLOCK_N_D64 if D <= 64 else A.DQ_BLOCK_N
    q, do, k, v, dqt = (T(B, H, L, D) for _ in range(5))
    lse, delta = torch.empty(B, H, L), torch.empty(B, H, L)
    return compile_(A._attn_bwd_dq_sm90_kernel, A._desc(q, A.HALF), A._desc(do, A.HALF), A._desc(k, bn),
                    A._desc(v, bn), A._desc(dqt, A.HALF), lse, delta, lse.stride(0), lse.stride(1), lse.stride(2),
                    H, 1, L, L, 0.1, 0.14, CAUSAL=causal, NB=A.DQ_SLOTS, num_warps=4, maxnreg=A.MAXNREG)

def fused(D, causal, reverse=False):
    B, H, L = 1, 2, 256
    bm = A.FUSED_BLOCK_M_D64_FULL if D <= 64 and not causal else A.HALF
    q, do, k, v, dk, dv = (T(B, H, L, D) for _ in range(6))
    dqa = T(B, H, L, D, dtype=torch.float32)
    lse, delta = torch.empty(B, H, L), torch.empty(B, H, L)
    return compile_(A._attn_bwd_fused_sm90_kernel, A._desc(q, bm), A._desc(do, bm), A._desc(k, 128), A._desc(v, 128),
                    A._desc(dk, A.HALF), A._desc(dv, A.HALF), A._desc(dqa, bm, D // 2), lse, delta,
                    lse.stride(0), lse.stride(1), lse.stride(2), H, 1, L, L, 0.1, 0.14,
                    CAUSAL=causal, NQ=A.FUSED_SLOTS, REVERSE=reverse, num_warps=4, maxnreg=A.MAXNREG)

JOBS = {
    "pers64": lambda: fwd(64, False, True), "pers128": lambda: fwd(128, False, True),
    "fwd128c": lambda: fwd(128, True, False), "fwd128f": lambda: fwd(128, False, False),
    "fwd64c": lambda: fwd(64, True, False),
    "short64c": lambda: fwd(64, True, False, bn=64, maxnreg=80, regs=112),
    "dq64c": lambda: dq(64, True), "dq64f": lambda: dq(64, False), "dq128c": lambda: dq(128, True),
    "dq128f": lambda: dq(128, False),
    "fb64f": lambda: fused(64, False), "fb64c": lambda: fused(64, True), "fb128c": lambda: fused(128, True),
    "fb128f": lambda: fused(128, False), "fb128cR": lambda: fused(128, True, True),
}
if __name__ == "__main__":
    bad = 0
    for name in sys.argv[1:]:
        t = time.time()
        try:
            k = JOBS[name]()
            print(f"{name}: ok {time.time() - t:.1f}s smem={k.metadata.shared} cubin={len(k.asm['cubin'])}", flush=True)
        except Exception as e:
            bad += 1
            print(f"{name}: FAIL {type(e).__name__}: {str(e)[-400:]}", flush=True)
    sys.exit(bad)
