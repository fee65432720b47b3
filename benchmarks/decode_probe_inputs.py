"""The decode-attention probes' problem and module loader (imported by benchmarks/probe_decode*.py;
not a probe itself)."""
import importlib.util
import os
import re
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


def shapes(arg: str):
    """The probes' ``--shapes`` (e.g. "1x16384,8x4096") as [(label, batch, context)]."""
    return [(sh, *(int(x) for x in sh.split("x"))) for sh in arg.split(",") if sh]


def timing_setup():
    """What the decode probes time with: (the quick TimingConfig, the measured copy GB/s, the
    softmax scale in the log2 domain at D = 128)."""
    from warpforge.bench.timing import TimingConfig
    from warpforge.ops.decode_attention import LOG2E
    from warpforge.runtime.device import ceilings
    return TimingConfig.quick(), ceilings()["copy_gbps"], 128 ** -0.5 * LOG2E


def alternate(rows: dict, rounds: int, timer) -> dict:
    """{name: [us a round]} of ``rows`` {name: fn}: ``timer(fn)`` (ms) of each row in turn, over
    ``rounds`` rounds (so a drift of the machine touches every row alike)."""
    res = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            res[name].append(timer(fn) * 1e3)
    return res


def print_table(res, nbytes, copy_gbps, width=16):
    """The probes' closing table: {(shape, variant): [us a round]} as the best round, % of copy on
    the KV bytes ``nbytes[shape]``, and every round."""
    print(f"{'shape':9s} {'variant':{width}s} {'us':>8s} {'% copy':>7s}  rounds")
    for (sh, name), v in res.items():
        print(f"{sh:9s} {name:{width}s} {min(v):8.1f} {100 * nbytes[sh] / (min(v) * 1e-6) / 1e9 / copy_gbps:7.1f}  "
              f"{[round(x, 1) for x in v]}")


def unpaged(cache, bt, ctx):
    """The keys (or values) of a paged cache as SDPA reads them: (B, Hkv, ctx, D), contiguous."""
    return cache[bt.long()].view(bt.shape[0], ctx, cache.shape[2], cache.shape[3]).transpose(1, 2).contiguous()


def load_sm90_copy(src: str, name: str):
    """A (possibly edited) source text of ops/decode_attention_sm90.py imported as module ``name``
    (its relative imports made absolute; Triton reads kernel sources from a file, so it is one)."""
    src = re.sub(r"^from \.\.", "from warpforge.", src, flags=re.M)
    src = re.sub(r"^from \.(?=\w)", "from warpforge.ops.", src, flags=re.M)
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_sm90_patched(edits, name: str, path: str | None = None):
    """ops/decode_attention_sm90.py (or the copy of it at ``path``) with each (old, new) of ``edits``
    applied (every ``old`` found exactly once), imported as module ``name``."""
    from warpforge.ops import decode_attention_sm90
    src = open(path or decode_attention_sm90.__file__).read()
    for old, new in edits:
        assert src.count(old) == 1, old[:80]
        src = src.replace(old, new)
    return load_sm90_copy(src, name)


def stamp_samples(S, q, k_cache, v_cache, block_table, seq_lens, reps, programs, width, columns, flush=True):
    """Run the stamped copy ``S`` of ops/decode_attention_sm90.py (a split call: its stamps, int64
    %globaltimer values, ``width`` a program for programs 0 .. programs - 1, live in the output it
    does not otherwise write) ``reps`` times after two warm-up calls, each after an L2 flush when
    ``flush`` and a GPU sleep. Returns {column: [a call's median over the programs of that
    column's nonzero stamps, us after the call's first entry stamp (column 0)]} for ``columns``."""
    from warpforge.bench import timing
    from warpforge.ops import decode_attention as DA
    assert q.numel() * q.element_size() >= programs * width * 8, "the output buffer holds the stamps"
    samples = {k: [] for k in columns}
    for r in range(reps + 2):
        out = torch.zeros_like(q)
        if flush:
            timing.flush_l2()
        torch.cuda._sleep(200_000)
        parts = S.decode_sm90(q, k_cache, v_cache, block_table, seq_lens, out, q.shape[2] ** -0.5 * DA.LOG2E)
        assert parts is not None, "a split call (the stamps live in the unused output)"
        torch.cuda.synchronize()
        if r < 2:
            continue
        st = out.view(torch.int64).view(-1)[:programs * width].view(programs, width).cpu().double()
        t0 = st[:, 0][st[:, 0] > 0].min()
        for k in columns:
            col = st[:, k]
            col = col[col > 0]
            if col.numel():
                samples[k].append(float((col - t0).median()) / 1e3)
    return samples


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
