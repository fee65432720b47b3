"""The decode-attention probes' problem (imported by benchmarks/probe_decode*.py; not a probe itself)."""
import torch


def paged_problem(bsz, ctx, hq=32, hk=8, d=128, page=16):
    """q (B, Hq, D) and K/V caches (num_blocks, page, Hkv, D) in bf16, every sequence's pages a
    random permutation of the pool (int32 block table), every length ``ctx``; with the bytes of K
    and V a call reads. Returns (q, k_cache, v_cache, block_table, seq_lens, kv_bytes)."""
    nb = bsz * ctx // page
    q = torch.randn(bsz, hq, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(nb, page, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    bt = torch.randperm(nb, device="cuda", dtype=torch.int32).view(bsz, -1)
    sl = torch.full((bsz,), ctx, device="cuda", dtype=torch.int32)
    return q, kc, vc, bt, sl, 2 * bsz * ctx * hk * d * 2


def unpaged(cache, bt, ctx):
    """The keys (or values) of a paged cache as SDPA reads them: (B, Hkv, ctx, D), contiguous."""
    return cache[bt.long()].view(bt.shape[0], ctx, cache.shape[2], cache.shape[3]).transpose(1, 2).contiguous()
