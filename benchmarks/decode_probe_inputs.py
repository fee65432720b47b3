"""The decode-attention probes' problem and module loader (imported by benchmarks/probe_decode*.py;
not a probe itself)."""
import importlib.util
import os
import sys
import tempfile

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


def load_sm90_copy(src: str, name: str):
    """A (possibly edited) source text of ops/decode_attention_sm90.py imported as module ``name``
    (its relative imports made absolute; Triton reads kernel sources from a file, so it is one)."""
    src = src.replace("from ..runtime.device import sm_count", "from warpforge.runtime.device import sm_count")
    src = src.replace("from ..runtime.launch import", "from warpforge.runtime.launch import")
    src = src.replace("from .attention_sm90 import tma_ok", "from warpforge.ops.attention_sm90 import tma_ok")
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_sm90_patched(edits, name: str):
    """ops/decode_attention_sm90.py with each (old, new) of ``edits`` applied (every ``old`` found
    exactly once), imported as module ``name``."""
    from warpforge.ops import decode_attention_sm90
    src = open(decode_attention_sm90.__file__).read()
    for old, new in edits:
        assert src.count(old) == 1, old[:80]
        src = src.replace(old, new)
    return load_sm90_copy(src, name)


def cudnn_decode(q, k_cache, v_cache, block_table, ctx, timer):
    """SDPA's cuDNN backend on the same problem unpaged: (its output (B, Hq, D), ``timer`` of its
    call). The unpaged copies are freed before returning."""
    import torch.nn.functional as F
    kd, vd = unpaged(k_cache, block_table, ctx), unpaged(v_cache, block_table, ctx)
    q4 = q.unsqueeze(2)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
        ref = F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True).squeeze(2)
        ms = timer(lambda: F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True))
    return ref, ms
