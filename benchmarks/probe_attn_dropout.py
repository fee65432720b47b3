"""Device probe: what attention dropout costs our kernels, beside SDPA's backends with the same
dropout. Rows, each forward, forward+backward and backward alone (do_bench medians, ms; least of --rounds
alternating rounds): ours at p = 0 as routed (the Hopper Gluon kernels), ours at p = 0 on the
Triton kernels, ours at p as routed (since session 52 the Gluon forward draws the mask; the
backward is Triton's), ours at p on the Triton kernels alone; SDPA's cuDNN, FlashAttention-2 and
efficient backends at p (--no-efficient leaves the last out).

    python benchmarks/probe_attn_dropout.py [--shapes 4,32,4096,128] [--p 0.1] [--rounds 2]
        [--variant r7x16|r10x8] [--ours-only]

``--variant`` swaps the Triton kernels' mask draw (attention._dropout_keep) before anything
compiles, to time other draws than the session-51 one (the mapping before session 52: key 8g + t
of group g; the Gluon forward is not swapped, so time a variant with --ours-only, whose row is
then on the Triton kernels) (Philox-4x32-10, 16 bits a score): r7x16 (7 rounds), r10x8 (8
bits a score, 16 scores a draw, the threshold p * 2^8; FlashAttention-2's width). Outputs of a
variant are not the shipped kernels' (another mask); only its time is of interest. (The variants
share _draw since their run in session 51: the same operations, written once.)
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

import warpforge as wf
from warpforge.ops import attention as attn


def _triton_only(fn):
    """``fn`` with the Hopper kernels switched off (attention.py's route reads _SM90 each call)."""
    def run(*a):
        saved = attn._SM90[:]
        attn._SM90[:] = [None]
        try:
            return fn(*a)
        finally:
            attn._SM90[:] = saved
    return run


def _fused_bm64(fn):
    """``fn`` with the fused backward's D-64 query tile at 64 rows (as at D 128) instead of 128."""
    def run(*a):
        from warpforge.ops import attention_sm90 as sm90
        saved = sm90.FUSED_BLOCK_M_D64_FULL
        sm90.FUSED_BLOCK_M_D64_FULL = 64
        try:
            return fn(*a)
        finally:
            sm90.FUSED_BLOCK_M_D64_FULL = saved
    return run


def _plain(fn):
    return fn


@triton.jit
def _draw(seed, b, h, i, g, N_ROUNDS: tl.constexpr = 10):
    """Philox-4x32 words for counters (g, i, h, b), g and i broadcastable to each other."""
    zero = i * 0 + g * 0
    return tl.philox(seed, (g + zero).to(tl.uint32), (i + zero).to(tl.uint32), (zero + h).to(tl.uint32),
                     (zero + b).to(tl.uint32), n_rounds=N_ROUNDS)


@triton.jit
def _keep_r7x16(seed, b, h, rows, n0, thr, BLOCK_N: tl.constexpr):
    g = n0 // 8 + tl.arange(0, BLOCK_N // 8)
    r0, r1, r2, r3 = _draw(seed, b, h, rows[:, None], g[None, :], 7)
    lo = tl.join(tl.join(r0 & 0xFFFF, r0 >> 16), tl.join(r1 & 0xFFFF, r1 >> 16))
    hi = tl.join(tl.join(r2 & 0xFFFF, r2 >> 16), tl.join(r3 & 0xFFFF, r3 >> 16))
    return tl.reshape(tl.join(lo, hi), (rows.shape[0], BLOCK_N)).to(tl.int32) >= thr


@triton.jit
def _bytes(r):
    return tl.join(tl.join(r & 0xFF, (r >> 8) & 0xFF), tl.join((r >> 16) & 0xFF, r >> 24))


@triton.jit
def _keep_r10x8(seed, b, h, rows, n0, thr, BLOCK_N: tl.constexpr):
    g = n0 // 16 + tl.arange(0, BLOCK_N // 16)
    r0, r1, r2, r3 = _draw(seed, b, h, rows[:, None], g[None, :])
    r = tl.join(tl.join(_bytes(r0), _bytes(r1)), tl.join(_bytes(r2), _bytes(r3)))
    return tl.reshape(r, (rows.shape[0], BLOCK_N)).to(tl.int32) >= (thr >> 8)


@triton.jit
def _keep_sel16(seed, b, h, rows, n0, thr, BLOCK_N: tl.constexpr):
    """The shipped mask (key 8g + t: half t % 2 of word t // 2), unpacked by selects on a
    (R, G, 8) broadcast instead of joins: no layout conversions (offline sm_90: none against
    ~15 a kernel), but the draw is recomputed by each thread holding a column pair of its group
    (mul.hi 531 against 131 in the forward)."""
    g = (n0 // 8 + tl.arange(0, BLOCK_N // 8))[None, :, None]
    r0, r1, r2, r3 = _draw(seed, b, h, rows[:, None, None], g)
    t = tl.arange(0, 8)[None, None, :]
    word = tl.where(t < 4, tl.where(t < 2, r0, r1), tl.where(t < 6, r2, r3))
    half = tl.where((t % 2) == 0, word & 0xFFFF, word >> 16)
    return tl.reshape(half, (rows.shape[0], BLOCK_N)).to(tl.int32) >= thr


@triton.jit
def _keep_sel32(seed, b, h, rows, n0, thr, BLOCK_N: tl.constexpr):
    """Groups of 4 keys, a 32-bit word each (top 16 bits against thr): a thread's column pair
    shares a draw with one other thread, not three."""
    g = (n0 // 4 + tl.arange(0, BLOCK_N // 4))[None, :, None]
    r0, r1, r2, r3 = _draw(seed, b, h, rows[:, None, None], g)
    t = tl.arange(0, 4)[None, None, :]
    word = tl.where(t < 2, tl.where(t < 1, r0, r1), tl.where(t < 3, r2, r3))
    return tl.reshape(word >> 16, (rows.shape[0], BLOCK_N)).to(tl.int32) >= thr


@triton.jit
def _keep_cheap(seed, b, h, rows, n0, thr, BLOCK_N: tl.constexpr):
    """No random numbers (a fixed pattern keeping 7 of 8): what the masking alone costs."""
    cols = n0 + tl.arange(0, BLOCK_N)
    return ((rows[:, None] * 3 + cols[None, :] + h) & 7) != 0


VARIANTS = {"r7x16": _keep_r7x16, "r10x8": _keep_r10x8, "sel16": _keep_sel16, "sel32": _keep_sel32,
            "cheap": _keep_cheap}


def time_rows(rows: dict, inputs: tuple, do, rounds: int, bench) -> dict:
    """{name: (fwd ms, fwd+bwd ms, bwd ms, error)} of ``rows`` {name: (forward, route)}, each the
    least over ``rounds`` alternating rounds (``route`` wraps every timing of its row; the
    gradients are taken into ``inputs`` with upstream ``do``); a row that raises keeps (None,
    None, None, the error's first line)."""
    best = {}
    for _ in range(rounds):
        for name, (fn, route) in rows.items():
            try:
                with torch.no_grad():
                    f = bench(route(fn))
                fb = bench(route(lambda: torch.autograd.grad(fn(), inputs, do)))
                o = route(fn)()
                bw = bench(route(lambda: torch.autograd.grad(o, inputs, do, retain_graph=True)))
            except Exception as e:  # noqa: BLE001 -- a backend that cannot run the case
                best[name] = (None, None, None, str(e).splitlines()[0][:60])
                continue
            old = best.get(name)
            if old is None or old[0] is None:
                best[name] = (f, fb, bw, "")
            else:
                best[name] = (min(old[0], f), min(old[1], fb), min(old[2], bw), "")
    return best


def _check_variant(p: float, triton_only: bool = False) -> str:
    """Ours at p against the reference with the mask dropout_keep_mask rebuilds (it draws with the
    swapped _dropout_keep too): forward and gradients' relative errors, bf16 (as routed, or on the
    Triton kernels alone)."""
    if triton_only:
        return _triton_only(_check_variant)(p)
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, 300, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    torch.manual_seed(2)
    o = wf.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    torch.manual_seed(2)
    keep = attn.dropout_keep_mask(attn.dropout_seed(q.device), 1, 4, 300, 300, p)
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, _ = attn.attention_reference(qr, kr, vr, is_causal=True, dropout_keep=keep, dropout_p=p)
    do = torch.randn_like(o)
    errs = [((o.float() - ref).norm() / ref.norm()).item()]
    for g, r in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(ref, (qr, kr, vr), do.float())):
        errs.append(((g.float() - r).norm() / r.norm()).item())
    return "check fwd/dq/dk/dv rel err " + " ".join(f"{e:.2e}" for e in errs) + f", kept {keep.float().mean():.4f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4,32,4096,128"])
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variant", choices=sorted(VARIANTS))
    ap.add_argument("--ours-only", action="store_true", help="only ours at p (the variant's row)")
    ap.add_argument("--no-efficient", action="store_true", help="leave SDPA's efficient backend out")
    args = ap.parse_args()
    if args.variant:
        attn._dropout_keep = VARIANTS[args.variant]
    bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")  # noqa: E731
    attn._sm90_kernels()
    p = args.p
    print(f"variant {args.variant or 'shipped'}, routed: {_check_variant(p)}")
    print(f"variant {args.variant or 'shipped'}, triton: {_check_variant(p, True)}")
    print(f"{'shape':>22} {'causal':>6} {'row':>24} {'fwd ms':>8} {'fwd+bwd ms':>10} {'bwd ms':>8} {'fwd TF/s':>8}")
    for shape in args.shapes:
        B, H, S, D = (int(x) for x in shape.split(","))
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        for causal in (False, True):
            def ours(pp):
                return lambda: wf.scaled_dot_product_attention(q, k, v, dropout_p=pp, is_causal=causal)

            def sdpa(backend):
                def run():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
                return run

            # (forward, route): the route wraps the forward, forward+backward and backward timings alike
            rows = {"ours p=0 routed": (ours(0.0), _plain), "ours p=0 triton": (ours(0.0), _triton_only),
                    f"ours p={p} routed": (ours(p), _plain), f"ours p={p} triton": (ours(p), _triton_only),
                    "sdpa[cudnn]": (sdpa(SDPBackend.CUDNN_ATTENTION), _plain),
                    "sdpa[flash]": (sdpa(SDPBackend.FLASH_ATTENTION), _plain)}
            if D <= 64 and not causal:
                rows[f"ours p={p} fused bm64"] = (ours(p), _fused_bm64)
            if not args.no_efficient:
                rows["sdpa[efficient]"] = (sdpa(SDPBackend.EFFICIENT_ATTENTION), _plain)
            if args.ours_only:
                rows = {f"ours p={p} {args.variant or 'shipped'}": (ours(p), _triton_only if args.variant else _plain)}
            best = time_rows(rows, (q, k, v), do, args.rounds, bench)
            flops = 4 * B * H * S * S * D // (2 if causal else 1)
            for name, (f, fb, bw, err) in best.items():
                if f is None:
                    print(f"{shape:>22} {str(causal):>6} {name:>24} failed: {err}")
                else:
                    print(f"{shape:>22} {str(causal):>6} {name:>24} {f:8.3f} {fb:10.3f} {bw:8.3f} {flops / f / 1e9:8.0f}")


if __name__ == "__main__":
    main()
