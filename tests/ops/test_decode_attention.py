"""Decode attention over a paged KV cache and the paged append: against the float64 reference on
shuffled block tables, every dtype, MHA/GQA/MQA, odd head dims, several split counts, strided
layouts, torch.compile, opcheck, bad input, and bad metadata with validation off (guard pages full
of NaN around the caches: a read or write outside them would show)."""
import pytest
import torch

import warpforge as wf
import warpforge.runtime.heuristics as heur
from warpforge.ops.decode_attention import (append_paged_kv, append_paged_kv_op, decode_attention,
                                            decode_attention_lse_op, decode_attention_op,
                                            decode_attention_reference)
from conftest import DTYPES, DEVICE, ON_GPU, assert_close, gpu_only, randn, rel_err


def paged(bsz, max_blocks, page, hkv, d, dtype, extra=5, guard=False):
    """(k_cache, v_cache, block_table, pool): a shuffled pool of bsz * max_blocks + extra blocks.
    ``guard``: the caches are views of one (nb + 2, page, 2, Hkv, D) buffer (K and V interleaved,
    so strided) whose first and last blocks are NaN, just outside block ids 0 and nb - 1."""
    nb = bsz * max_blocks + extra
    if guard:
        pool = randn(nb + 2, page, 2, hkv, d, dtype=dtype)
        pool[0] = float("nan")
        pool[-1] = float("nan")
        kc, vc = pool[1:-1, :, 0], pool[1:-1, :, 1]
    else:
        pool = None
        kc, vc = randn(nb, page, hkv, d, dtype=dtype), randn(nb, page, hkv, d, dtype=dtype)
    bt = torch.randperm(nb, device=DEVICE)[:bsz * max_blocks].view(bsz, max_blocks).to(torch.int32)
    return kc, vc, bt, pool


def reference(q, kc, vc, bt, lens, scale=None, **kw):
    return decode_attention_reference(q.double(), kc.double(), vc.double(), bt, lens, scale, **kw)


# (Hq, Hkv, D, block_size, max_blocks_per_seq): MHA, GQA, MQA with a non-power-of-two D, and pages
# longer than the interpreter's 16-token tile
CASES = [(4, 4, 16, 8, 6), (8, 2, 32, 16, 4), (6, 1, 24, 8, 5), (8, 2, 16, 32, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_decode(case, dtype):
    hq, hkv, d, page, mb = case
    cap = mb * page
    lens = torch.tensor([1, cap, 13, 0, cap - page + 3], device=DEVICE, dtype=torch.int32)
    bsz = lens.numel()
    kc, vc, bt, _ = paged(bsz, mb, page, hkv, d, dtype)
    bt[0, 1:] = 10**6                          # columns past a sequence's length are never read
    q = randn(bsz, hq, d, dtype=dtype)
    ref = reference(q, kc, vc, bt, lens)
    assert ref[3].abs().max() == 0
    for splits in (None, 1, 3):
        out = decode_attention(q, kc, vc, bt, lens, num_splits=splits)
        assert out.dtype == dtype and out.shape == q.shape
        assert_close(out, ref, dtype, what=f"num_splits={splits}")
        assert out[3].abs().max() == 0, "seq_len 0 gives zeros"


def _check_lse(got, want, dtype, what):
    """A log-sum-exp against float64's: -inf exactly where nothing is attended, else within a
    tolerance on its absolute error (lse sits in an exponent: an absolute error e scales a merge
    weight by e^e), 16-bit inputs rounding the scores first."""
    out, lse = got
    ref_out, ref_lse = want
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape, (lse.dtype, lse.shape)
    assert_close(out, ref_out, dtype, what=f"{what} out")
    empty = ref_lse == -float("inf")
    assert torch.equal(lse == -float("inf"), empty.to(lse.device)), f"{what}: -inf where nothing is attended"
    err = (lse.double() - ref_lse.to(lse.device))[~empty].abs().max().item() if (~empty).any() else 0.0
    assert err <= (1e-5 if dtype == torch.float32 else 2e-2), f"{what}: lse off by {err:.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES[:3])
def test_return_lse(case, dtype):
    """return_lse: the output as without it (bit for bit on the Triton kernels, which these head
    dims take) and the log-sum-exp of the scaled scores,
    at every split count (one split included: the lse then comes from the combine), with a window
    and a softcap, a length-0 sequence (-inf); merging two halves of a context by their lse gives
    the whole context's attention (what a shared prefix or a sharded cache needs)."""
    hq, hkv, d, page, mb = case
    cap = mb * page
    lens = torch.tensor([1, cap, 13, 0, cap - page + 3], device=DEVICE, dtype=torch.int32)
    kc, vc, bt, _ = paged(lens.numel(), mb, page, hkv, d, dtype)
    q = randn(lens.numel(), hq, d, dtype=dtype, scale=2.0)
    for kw in (dict(), dict(window_size=(6, 0), softcap=3.0)):
        want = reference(q, kc, vc, bt, lens, return_lse=True, **kw)
        for splits in (None, 1, 3):
            got = decode_attention(q, kc, vc, bt, lens, num_splits=splits, return_lse=True, **kw)
            _check_lse(got, want, dtype, f"{kw} num_splits={splits}")
            assert torch.equal(got[0], decode_attention(q, kc, vc, bt, lens, num_splits=splits, **kw))
    # the first half of each page-aligned context and the rest, merged by their lse
    half = (lens // (2 * page)) * page
    first = decode_attention(q, kc, vc, bt, half, return_lse=True)
    rest_bt = torch.stack([torch.roll(row, -int(h) // page) for row, h in zip(bt, half)])   # from page half / page
    rest = decode_attention(q, kc, vc, rest_bt, lens - half, return_lse=True)
    lse = torch.logaddexp(first[1], rest[1])
    merged = sum(o.double() * torch.exp(l - lse).nan_to_num()[..., None] for o, l in (first, rest))
    want_out, want_lse = reference(q, kc, vc, bt, lens, return_lse=True)
    assert_close(merged.to(dtype), want_out, dtype, what="merged halves")
    live = want_lse > -float("inf")
    assert torch.allclose(lse[live].double(), want_lse[live].to(lse.device), atol=2e-2 if dtype != torch.float32 else 1e-5)


def test_combine_wide_head_dim_and_many_splits(monkeypatch):
    """The merge of the split partials at D = 48 (two 32-wide slices of D a (sequence, head) in
    the one-pass combine, the second half masked) and, with the one-pass limit lowered, the stepped
    two-pass merge of 22 partials (two steps of 16, the second ragged; a GPU's longer tiles leave
    6). Head 0 of sequence 0 has one key aligned with its query in the last split (a score ~600 in
    the exp2 domain): every partial must enter the maximum, or exp2 overflows. Sequence 2's later
    splits are empty (m = -inf)."""
    import warpforge.ops.decode_attention as DA
    from warpforge.runtime.launch import LaunchCache
    monkeypatch.setattr(DA, "_SM90", [None])               # the Triton kernels, on a GPU too
    hq, hkv, d, page, mb = 2, 1, 48, 16, 22                # capacity 352: 22 granules of 16 tokens
    lens = torch.tensor([345, 0, 200], device=DEVICE, dtype=torch.int32)
    kc, vc, bt, _ = paged(3, mb, page, hkv, d, torch.float32)
    q = randn(3, hq, d)
    kc[int(bt[0, 340 // page]), 340 % page, 0] = 8 * q[0, 0]
    ref = reference(q, kc, vc, bt, lens, scale=1.0)
    for step in (heur.DECODE_COMBINE_STEP, 2):             # one pass; two passes in steps of 16
        monkeypatch.setattr(DA, "DECODE_COMBINE_STEP", step)
        monkeypatch.setattr(DA, "_PLANS", {})              # no plan or compiled combine recorded before
        monkeypatch.setattr(DA, "_COMBINE_LAUNCH", LaunchCache(DA._decode_attention_combine_kernel))
        out = decode_attention(q, kc, vc, bt, lens, scale=1.0, num_splits=22)
        assert_close(out, ref, torch.float32, what=f"num_splits=22, combine step limit {step}")
        assert out[1].abs().max() == 0, "seq_len 0 gives zeros"


def test_layouts_and_scale():
    """Strided q (a fused-projection slice, and a non-unit D stride), K/V interleaved in one
    buffer, int64 metadata, a block table that is a slice of a wider one, a custom scale."""
    hq, hkv, d, page, mb = 8, 2, 32, 8, 5
    lens = torch.tensor([40, 17, 1], device=DEVICE, dtype=torch.int64)
    kc, vc, bt, _ = paged(3, mb, page, hkv, d, torch.float32, guard=True)
    assert not kc.is_contiguous()
    wide = torch.full((3, mb + 4), 10**6, device=DEVICE, dtype=torch.int64)
    wide[:, :mb] = bt
    bt = wide[:, :mb]
    qkv = randn(3, hq + 2 * hkv, d)
    q = qkv[:, :hq]
    assert not q.is_contiguous()
    ref = reference(q, kc, vc, bt, lens, scale=0.3)
    assert_close(decode_attention(q, kc, vc, bt, lens, scale=0.3), ref, torch.float32, what="sliced q")
    q2 = randn(3, hq, 2 * d)[..., ::2]
    assert_close(decode_attention(q2, kc, vc, bt, lens, num_splits=2), reference(q2, kc, vc, bt, lens),
                 torch.float32, what="strided D")
    assert_close(wf.decode_attention(q, kc, vc, bt, lens, scale=0.3), ref, torch.float32)


def check_appended(key, value, kc, vc, bt, lens, cache, before):
    """After append_paged_kv(key, value, kc, vc, bt, lens): row lens[b] + i of sequence b holds
    key[b, i] and value[b, i] exactly, and ``cache`` (kc or vc) differs from ``before`` in those
    B x T rows only."""
    bsz, t = key.shape[:2]
    page = kc.shape[1]
    for b, n in enumerate(lens.tolist()):
        for i in range(t):
            blk, row = int(bt[b, (n + i) // page]), (n + i) % page
            assert torch.equal(kc[blk, row], key[b, i]) and torch.equal(vc[blk, row], value[b, i])
    assert int((cache != before).any(-1).any(-1).sum()) == bsz * t, "only the appended rows changed"


def test_k_and_v_caches_with_different_strides():
    """k_cache contiguous, v_cache a view of a padded buffer (other block, row and head strides):
    the decode reads and the append writes each cache with its own strides."""
    hq, hkv, d, page, mb = 4, 2, 16, 8, 4
    kc, _, bt, _ = paged(2, mb, page, hkv, d, torch.float32)
    vc = randn(kc.shape[0], page, hkv, 2 * d)[..., :d]     # strides (8 * 2 * 32, 2 * 32, 32, 1)
    assert kc.stride() != vc.stride()
    lens = torch.tensor([13, 30], device=DEVICE, dtype=torch.int32)
    q = randn(2, hq, d)
    for splits in (1, 2):
        assert_close(decode_attention(q, kc, vc, bt, lens, num_splits=splits), reference(q, kc, vc, bt, lens),
                     torch.float32, what=f"num_splits={splits}")
    key, value = randn(2, 2, hkv, d), randn(2, 2, hkv, d)
    v0 = vc.clone()
    append_paged_kv(key, value, kc, vc, bt, lens)
    check_appended(key, value, kc, vc, bt, lens, vc, v0)


def test_strided_lengths():
    """seq_lens and cache_seqlens as strided views (a column of a (B, 2) metadata tensor): the kernels
    index them densely, so the launchers copy them (a strided view once read other rows' values)."""
    hq, hkv, d, page, mb = 4, 2, 16, 8, 4
    meta = torch.tensor([[20, 999], [5, -7], [31, 10**6]], device=DEVICE, dtype=torch.int32)
    lens = meta[:, 0]
    assert not lens.is_contiguous()
    kc, vc, bt, _ = paged(3, mb, page, hkv, d, torch.float32)
    q = randn(3, hq, d)
    ref = reference(q, kc, vc, bt, lens.contiguous())
    for splits in (None, 2):
        assert_close(decode_attention(q, kc, vc, bt, lens, num_splits=splits), ref, torch.float32,
                     what=f"strided seq_lens, num_splits={splits}")
        assert_close(decode_attention(q, kc, vc, bt, lens, num_splits=splits, validate=False), ref, torch.float32,
                     what="strided seq_lens, unvalidated")
    key, value = randn(3, 1, hkv, d), randn(3, 1, hkv, d)
    k0 = kc.clone()
    append_paged_kv(key, value, kc, vc, bt, lens)
    for b, n in enumerate(lens.tolist()):
        blk = int(bt[b, n // page])
        assert torch.equal(kc[blk, n % page], key[b, 0]), f"sequence {b}'s token went to position {n}"
    assert int((kc != k0).any(-1).any(-1).sum()) == 3


def test_reference_matches_sdpa():
    """The reference on a cache laid out in order equals dense attention (GQA by repetition)."""
    b, hq, hkv, d, page, n = 2, 4, 2, 16, 8, 24
    k, v, q = randn(b, n, hkv, d).double(), randn(b, n, hkv, d).double(), randn(b, hq, d).double()
    kc, vc = k.reshape(-1, page, hkv, d), v.reshape(-1, page, hkv, d)
    bt = torch.arange(b * n // page, device=DEVICE).view(b, -1)
    lens = torch.full((b,), n, device=DEVICE)
    kr, vr = k.repeat_interleave(2, 2).transpose(1, 2), v.repeat_interleave(2, 2).transpose(1, 2)
    want = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], kr, vr)[:, :, 0]
    assert_close(decode_attention_reference(q, kc, vc, bt, lens), want, torch.float32)


def test_reference_window_softcap():
    """The reference's window and softcap against dense attention written out here: a window of
    left keeps the last left + 1 keys (SDPA on that slice), and the softcap caps the scaled scores
    to c * tanh(s / c) before the softmax."""
    b, hq, hkv, d, page, n = 2, 4, 2, 16, 8, 24
    k, v, q = randn(b, n, hkv, d).double(), randn(b, n, hkv, d).double(), randn(b, hq, d).double() * 3
    kc, vc = k.reshape(-1, page, hkv, d), v.reshape(-1, page, hkv, d)
    bt = torch.arange(b * n // page, device=DEVICE).view(b, -1)
    lens = torch.tensor([n, 11], device=DEVICE)
    kr, vr = k.repeat_interleave(2, 2).transpose(1, 2), v.repeat_interleave(2, 2).transpose(1, 2)
    for left in (0, 6, 100):
        for i, m in enumerate(lens.tolist()):
            lo = max(m - 1 - left, 0)
            want = torch.nn.functional.scaled_dot_product_attention(q[i, :, None], kr[i, :, lo:m], vr[i, :, lo:m])[:, 0]
            got = decode_attention_reference(q, kc, vc, bt, lens, window_size=(left, -1))[i]
            assert_close(got, want, torch.float32, what=f"window {left}, sequence {i}")
    s = torch.einsum("bhd,bhnd->bhn", q, kr) * d ** -0.5
    s = 2.0 * torch.tanh(s / 2.0)
    want = torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), vr)
    got = decode_attention_reference(q, kc, vc, bt, torch.full((b,), n, device=DEVICE), softcap=2.0)
    assert_close(got, want, torch.float32, what="softcap")
    assert rel_err(got, decode_attention_reference(q, kc, vc, bt, torch.full((b,), n, device=DEVICE))) > 0.05


def _window_problem(lens, left, page, kc, vc, bt):
    """Poison what a call with window ``left`` (-1: none) must not touch: the cache rows of each
    sequence's pages before its window or at and past its length are set to NaN, and the block
    table entries of pages wholly before the window to -1 (a server may have freed them). Returns
    the block table to call with (the original is kept for the reference)."""
    n = lens.long()[:, None]
    lo = (n - 1 - left).clamp(min=0) if left >= 0 else torch.zeros_like(n)
    pos = torch.arange(bt.shape[1] * page, device=bt.device)[None, :]
    dead = (pos < lo) | (pos >= n)                                          # (B, positions)
    blocks, rows = bt.long()[:, pos[0] // page], (pos % page).expand_as(dead)
    kc[blocks[dead], rows[dead]] = float("nan")
    vc[blocks[dead], rows[dead]] = float("nan")
    called = bt.clone()
    called[(pos[:, ::page] + page <= lo)] = -1
    return called


WINDOWS = [-1, 0, 5, 17, 10**6]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES[:3])
def test_window_softcap(case, dtype):
    """Sliding windows (none, the last key only, odd sizes, wider than any sequence) with and
    without a softcap, at several split counts, against float64. The rows a window or a length
    leaves out are NaN and the table entries of pages before the window are -1, so a kernel that
    reads them (or lets 0 x NaN into the output) fails; validate=True must accept such a table."""
    hq, hkv, d, page, mb = case
    cap = mb * page
    lens = torch.tensor([1, cap, 13, 0, cap - page + 3], device=DEVICE, dtype=torch.int32)
    q = randn(lens.numel(), hq, d, dtype=dtype, scale=3.0)
    for left in WINDOWS:
        kc, vc, bt, _ = paged(lens.numel(), mb, page, hkv, d, dtype)
        called = _window_problem(lens, left, page, kc, vc, bt)
        for softcap in (0.0, 2.5):
            ref = reference(q, kc, vc, bt, lens, window_size=(left, -1), softcap=softcap)
            for splits in (None, 1, 3):
                out = decode_attention(q, kc, vc, called, lens, window_size=(left, 0), softcap=softcap,
                                       num_splits=splits)
                assert_close(out, ref, dtype, what=f"window {left}, softcap {softcap}, num_splits={splits}")
                assert out[3].abs().max() == 0, "seq_len 0 gives zeros"


def test_window_softcap_errors():
    hq, hkv, d, page = 4, 2, 16, 8
    kc, vc, bt, _ = paged(2, 3, page, hkv, d, torch.float32)
    q = randn(2, hq, d)
    lens = torch.tensor([3, 20], device=DEVICE, dtype=torch.int32)
    for w, exc, msg in (((-2, 0), ValueError, r"'window_size' \(-2, 0\)"), ((1, 2, 3), TypeError, r"'window_size'"),
                        ((1.5, 0), TypeError, r"'window_size'"), (4, TypeError, r"'window_size'")):
        with pytest.raises(exc, match=msg):
            decode_attention(q, kc, vc, bt, lens, window_size=w)
    for c, exc, msg in ((-1.0, ValueError, r"'softcap' is -1.0; expected a finite number >= 0"),
                        (float("inf"), ValueError, r"'softcap' is inf"), (float("nan"), ValueError, r"'softcap' is nan"),
                        ("2", TypeError, r"'softcap' must be a real number")):
        with pytest.raises(exc, match=msg):
            decode_attention(q, kc, vc, bt, lens, softcap=c)
    # validate checks the window's pages only: one before it may be anything, one inside may not
    bt[1, 0] = -1
    decode_attention(q, kc, vc, bt, lens, window_size=(8, -1))
    with pytest.raises(ValueError, match=r"'block_table'\[1, 0\] is -1"):
        decode_attention(q, kc, vc, bt, lens, window_size=(12, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_append_then_decode(dtype):
    """Decode step: append one token (crossing into a new page for one sequence), then attend over
    the grown sequences; prefill-like: append T > 1 across a block boundary, check the pages."""
    hq, hkv, d, page, mb = 4, 2, 16, 8, 4
    lens = torch.tensor([8, 5, 0], device=DEVICE, dtype=torch.int32)   # 8: the new token opens block 1
    kc, vc, bt, _ = paged(3, mb, page, hkv, d, dtype)
    key, value = randn(3, 1, hkv, d, dtype=dtype), randn(3, 1, hkv, d, dtype=dtype)
    before = [(kc.clone(), vc.clone())]
    append_paged_kv(key, value, kc, vc, bt, lens)
    q = randn(3, hq, d, dtype=dtype)
    out = decode_attention(q, kc, vc, bt, lens + 1)
    # the reference on the old cache contents with the new token concatenated
    k0, v0 = before[0]
    ref = torch.zeros(3, hq, d, dtype=torch.float64, device=DEVICE)
    for b, n in enumerate(lens.tolist()):
        ks = torch.cat([k0[bt[b].long()].reshape(-1, hkv, d)[:n], key[b]]).double()
        vs = torch.cat([v0[bt[b].long()].reshape(-1, hkv, d)[:n], value[b]]).double()
        dense_bt = torch.arange(mb, device=DEVICE)[None]
        pad = torch.zeros(mb * page - n - 1, hkv, d, dtype=torch.float64, device=DEVICE)
        kd, vd = torch.cat([ks, pad]).view(mb, page, hkv, d), torch.cat([vs, pad]).view(mb, page, hkv, d)
        ref[b] = decode_attention_reference(q[b:b + 1].double(), kd, vd, dense_bt, lens[b:b + 1] + 1)[0]
    assert_close(out, ref, dtype, what="append then decode")
    # untouched blocks stay as they were: only the appended rows changed
    changed = (kc != k0).any(-1).any(-1)       # (num_blocks, page)
    assert int(changed.sum()) == 3

    # T = 5 from position 6 of sequence 1: rows 6, 7 of its block 0 and rows 0-2 of its block 1
    t = 5
    key, value = randn(3, t, hkv, d, dtype=dtype), randn(3, t, hkv, d, dtype=dtype)
    start = torch.tensor([0, 6, 11], device=DEVICE, dtype=torch.int64)
    append_paged_kv(key, value, kc, vc, bt.long(), start)
    for b, s0 in enumerate(start.tolist()):
        for i in range(t):
            p = s0 + i
            blk = int(bt[b, p // page])
            assert torch.equal(kc[blk, p % page], key[b, i]) and torch.equal(vc[blk, p % page], value[b, i])
    out = decode_attention(q, kc, vc, bt, start + t)
    assert_close(out, reference(q, kc, vc, bt, start + t), dtype, what="after T=5 append")


def test_append_many_kv_heads():
    """Hkv = 17 at D = 256: more heads than one append tile holds (16 x 256 elements), so the
    kernel walks the heads in blocks; every head of every appended row lands."""
    hkv, d, page = 17, 256, 8
    kc, vc, bt, _ = paged(2, 2, page, hkv, d, torch.float32)
    key, value = randn(2, 2, hkv, d), randn(2, 2, hkv, d)
    lens = torch.tensor([3, 7], device=DEVICE, dtype=torch.int32)   # 7, 8: across a block boundary
    k0 = kc.clone()
    append_paged_kv(key, value, kc, vc, bt, lens)
    check_appended(key, value, kc, vc, bt, lens, kc, k0)


def test_compile_fullgraph():
    hq, hkv, d, page, mb = 4, 2, 16, 8, 3
    kc, vc, bt, _ = paged(2, mb, page, hkv, d, torch.float32)
    lens = torch.tensor([7, 16], device=DEVICE, dtype=torch.int32)
    q, key, value = randn(2, hq, d), randn(2, 1, hkv, d), randn(2, 1, hkv, d)
    kc2, vc2 = kc.clone(), vc.clone()

    def step(q, key, value, kc, vc, bt, lens):
        append_paged_kv(key, value, kc, vc, bt, lens)
        return decode_attention(q, kc, vc, bt, lens + 1) * 2

    out = torch.compile(step, fullgraph=True)(q, key, value, kc, vc, bt, lens)
    append_paged_kv(key, value, kc2, vc2, bt, lens)                          # eager twin
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2), "compiled append mutated the caches as eager does"
    assert_close(out, 2 * reference(q, kc2, vc2, bt, lens + 1), torch.float32, what="compiled")
    o, lse = torch.compile(lambda *a: decode_attention(*a, return_lse=True), fullgraph=True)(q, kc, vc, bt, lens)
    _check_lse((o, lse), reference(q, kc, vc, bt, lens, return_lse=True), torch.float32, "compiled")


def test_opcheck():
    hq, hkv, d, page, mb = 4, 2, 16, 8, 2
    kc, vc, bt, _ = paged(2, mb, page, hkv, d, torch.float32)
    lens = torch.tensor([5, 16], device=DEVICE, dtype=torch.int32)
    torch.library.opcheck(decode_attention_op.overload, (randn(2, hq, d), kc, vc, bt, lens, 0.25, 2))
    torch.library.opcheck(decode_attention_lse_op.overload, (randn(2, hq, d), kc, vc, bt, lens, 0.25, 0))
    torch.library.opcheck(append_paged_kv_op.overload, (randn(2, 1, hkv, d), randn(2, 1, hkv, d), kc, vc, bt, lens))


def test_validation_errors():
    hq, hkv, d, page, mb = 4, 2, 16, 8, 3
    kc, vc, bt, _ = paged(2, mb, page, hkv, d, torch.float32)
    q = randn(2, hq, d)
    nb = kc.shape[0]

    def lens(*v):
        return torch.tensor(v, device=DEVICE, dtype=torch.int32)

    with pytest.raises(ValueError, match=r"'seq_lens'\[1\] is 25, past the block table's capacity 24 .* for sequence 1"):
        decode_attention(q, kc, vc, bt, lens(3, 25))
    with pytest.raises(ValueError, match=r"'seq_lens'\[0\] is -1; expected lengths >= 0"):
        decode_attention(q, kc, vc, bt, lens(-1, 2))
    bad = bt.clone()
    bad[1, 1] = nb
    with pytest.raises(ValueError, match=rf"'block_table'\[1, 1\] is {nb}, a block in use by sequence 1; expected a block id in \[0, {nb}\)"):
        decode_attention(q, kc, vc, bad, lens(3, 9))
    decode_attention(q, kc, vc, bad, lens(3, 8))                             # column 1 not in use: fine
    bad[0, 0] = -3
    with pytest.raises(ValueError, match=r"'block_table'\[0, 0\] is -3"):
        decode_attention(q, kc, vc, bad, lens(3, 8))
    key = randn(2, 2, hkv, d)
    with pytest.raises(ValueError, match=r"'cache_seqlens'\[0\] is 23 \+ 2 new token\(s\) = 25, past the block table's capacity 24"):
        append_paged_kv(key, key, kc, vc, bt, lens(23, 0))
    with pytest.raises(ValueError, match=r"'cache_seqlens'\[1\] is -2"):
        append_paged_kv(key, key, kc, vc, bt, lens(0, -2))
    bad = bt.clone()
    bad[1, 2] = nb + 4
    with pytest.raises(ValueError, match=rf"'block_table'\[1, 2\] is {nb + 4}, a block written by sequence 1"):
        append_paged_kv(key, key, kc, vc, bad, lens(0, 15))
    append_paged_kv(key, key, kc, vc, bad, lens(0, 14))                      # writes only block column 1
    bad = bt.clone()
    bad[1, 0] = -5
    append_paged_kv(key, key, kc, vc, bad, lens(0, 8))                       # column 0 is not written: fine


def test_unvalidated_bad_metadata_stays_in_bounds():
    """validate=False with a length past the capacity and out-of-range block ids: the kernels
    read and write nothing outside the caches (the NaN guard blocks around them stay untouched
    and never reach an output); the other sequences are exact."""
    hq, hkv, d, page, mb = 4, 2, 16, 8, 3
    kc, vc, bt, pool = paged(4, mb, page, hkv, d, torch.float32, guard=True)
    nb = kc.shape[0]
    wide = torch.full((4, mb + 3), nb, device=DEVICE, dtype=torch.int32)    # beyond the row: id nb
    wide[:, :mb] = bt
    bt = wide[:, :mb]
    good = bt.clone()
    bt[2, 1] = -1                              # the guard block before the cache
    bt[3, 0] = nb                              # the guard block after it
    lens = torch.tensor([10, 10**6, 20, 9], device=DEVICE, dtype=torch.int32)
    q = randn(4, hq, d)
    for splits in (1, 2):
        out = decode_attention(q, kc, vc, bt, lens, num_splits=splits, validate=False)
        assert torch.isfinite(out).all()
        assert_close(out[0], reference(q, kc, vc, good, lens)[0], torch.float32)
        # sequence 1 is clamped to the capacity: attention over every position the table holds
        assert_close(out[1], reference(q[1:2], kc, vc, good[1:2], torch.tensor([mb * page], device=DEVICE))[0],
                     torch.float32, what="clamped")
    key = randn(4, 3, hkv, d)
    snap = pool.clone()
    append_paged_kv(key, key, kc, vc, bt, torch.tensor([2, mb * page - 1, 7, 0], device=DEVICE), validate=False)
    assert torch.isnan(pool[0]).all() and torch.isnan(pool[-1]).all(), "nothing written outside the caches"
    changed = (pool != snap) & ~(torch.isnan(pool) & torch.isnan(snap))
    assert int(changed.any(-1).any(-1).any(-1).sum()) == 3 + 1 + 1        # rows: 3, 1 (capacity), 1 (block 0 of seq 2)


def test_unvalidated_dead_tiles_stay_finite():
    """validate=False with a sequence's first 8 blocks invalid: whole key tiles (any tile size up
    to 128 tokens) are masked out while the running max is still -inf, which must not turn into
    -inf - (-inf) = NaN; with 2 splits the first split sees no live token at all. The output stays
    finite and the sequence with good metadata is exact."""
    hq, hkv, d, page, mb = 4, 2, 16, 16, 10
    kc, vc, bt, _ = paged(2, mb, page, hkv, d, torch.float32)
    good = bt.clone()
    bt[1, :8] = -1
    lens = torch.tensor([150, 150], device=DEVICE, dtype=torch.int32)
    q = randn(2, hq, d)
    for splits in (1, 2):
        out = decode_attention(q, kc, vc, bt, lens, num_splits=splits, validate=False)
        assert torch.isfinite(out).all(), f"num_splits={splits}"
        assert_close(out[0], reference(q, kc, vc, good, lens)[0], torch.float32)


def test_unvalidated_never_past_the_table_row():
    """validate=False with lengths past the capacity, the block table a slice of a wider one whose
    next columns hold a *valid* block id (a bait block no sequence owns): the decode attends to
    exactly the capacity (the bait's keys would change it) and an append running past the capacity
    drops those tokens (the bait block stays untouched)."""
    hq, hkv, d, page, mb = 4, 2, 16, 8, 3
    kc, vc, bt, _ = paged(2, mb, page, hkv, d, torch.float32)
    bait = min(set(range(kc.shape[0])) - set(bt.flatten().tolist()))
    wide = torch.full((2, mb + 2), bait, device=DEVICE, dtype=torch.int32)
    wide[:, :mb] = bt
    bt = wide[:, :mb]
    cap = mb * page
    q = randn(2, hq, d)
    ref = reference(q, kc, vc, bt, torch.tensor([cap, cap], device=DEVICE))
    for splits in (1, 2):
        out = decode_attention(q, kc, vc, bt, torch.tensor([cap + 5, 10**6], device=DEVICE, dtype=torch.int32),
                               num_splits=splits, validate=False)
        assert_close(out, ref, torch.float32, what=f"clamped to the capacity, num_splits={splits}")
    key = randn(2, 3, hkv, d)
    k0, v0 = kc.clone(), vc.clone()
    append_paged_kv(key, key, kc, vc, bt, torch.tensor([cap - 1, cap - 2], device=DEVICE), validate=False)
    assert torch.equal(kc[bait], k0[bait]) and torch.equal(vc[bait], v0[bait]), "nothing written past the row"
    assert int((kc != k0).any(-1).any(-1).sum()) == 1 + 2                   # rows cap - 1; cap - 2, cap - 1


def test_bad_input():
    hq, hkv, d, page = 4, 2, 16, 8
    kc, vc, bt, _ = paged(2, 3, page, hkv, d, torch.float32)
    q = randn(2, hq, d)
    lens = torch.tensor([3, 4], device=DEVICE, dtype=torch.int32)
    cases = [
        ((q[0], kc, vc, bt, lens), ValueError, r"'q' must be 3-d \(B, Hq, D\)"),
        ((q, kc[0], vc[0], bt, lens), ValueError, r"'k_cache' must be 4-d \(num_blocks, block_size, Hkv, D\)"),
        ((q, kc, vc[:-1], bt, lens), ValueError, r"'v_cache' has shape .* but 'k_cache' has"),
        ((q, kc, vc.half(), bt, lens), TypeError, r"'v_cache' has dtype torch.float16 but 'k_cache' has torch.float32"),
        ((q.half(), kc, vc, bt, lens), TypeError, r"'k_cache' has dtype torch.float32 but 'q' has torch.float16"),
        ((q.long(), kc, vc, bt, lens), TypeError, r"'q' has dtype int64"),
        ((randn(2, hq, 32), kc, vc, bt, lens), ValueError, r"'q' has head dim D=32 but 'k_cache' has D=16"),
        ((randn(2, 3, d), kc, vc, bt, lens), ValueError, r"'q' has 3 heads and 'k_cache' has 2 kv heads"),
        ((q, kc, vc, bt.float(), lens), TypeError, r"'block_table' has dtype float32; expected an integer tensor"),
        ((q, kc, vc, bt, lens.float()), TypeError, r"'seq_lens' has dtype float32; expected an integer tensor"),
        ((q, kc, vc, bt.short(), lens), TypeError, r"'block_table' has dtype int16"),
        ((q, kc, vc, bt[0], lens), ValueError, r"'block_table' must be 2-d \(B, max_blocks_per_seq\)"),
        ((q, kc, vc, bt[:1], lens), ValueError, r"'block_table' has batch size 1; expected 2"),
        ((q, kc, vc, bt, lens[:1]), ValueError, r"'seq_lens' has batch size 1; expected 2"),
        ((q, kc, vc, bt, lens[None]), ValueError, r"'seq_lens' must be 1-d"),
        ((randn(2, hq, 8), randn(9, page, hkv, 8), randn(9, page, hkv, 8), bt, lens), ValueError,
         r"'k_cache' has head dim D=8; expected 16 <= D <= 256"),
        ((q, randn(9, 12, hkv, d), randn(9, 12, hkv, d), bt, lens), ValueError,
         r"'k_cache' has block_size 12 \(dim 1\); expected a power of two >= 8"),
        ((q, randn(9, 4, hkv, d), randn(9, 4, hkv, d), bt, lens), ValueError, r"block_size 4"),
        ((q, randn(9, page, hkv, 2 * d)[..., ::2], randn(9, page, hkv, 2 * d)[..., ::2], bt, lens), ValueError,
         r"'k_cache' has stride 2 on its head dim; expected 1"),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            decode_attention(*args)
    with pytest.raises(ValueError, match=r"'num_splits' is 0; expected None or an int >= 1"):
        decode_attention(q, kc, vc, bt, lens, num_splits=0)
    with pytest.raises(TypeError, match=r"'scale' must be a float or None"):
        decode_attention(q, kc, vc, bt, lens, scale="1")
    with pytest.raises(RuntimeError, match=r"'seq_lens' is on meta but 'q' is on"):
        decode_attention(q, kc, vc, bt, lens.to("meta"))

    key = randn(2, 1, hkv, d)
    append_cases = [
        ((key[0], key[0], kc, vc, bt, lens), ValueError, r"'key' must be 4-d \(B, T, Hkv, D\)"),
        ((key, key.half(), kc, vc, bt, lens), TypeError, r"'value' has dtype torch.float16 but 'key' has torch.float32"),
        ((key, key[:, :, :1], kc, vc, bt, lens), ValueError, r"'value' has shape"),
        ((randn(2, 1, 1, d), randn(2, 1, 1, d), kc, vc, bt, lens), ValueError, r"'key' has 1 heads of D=16 but 'k_cache' has 2"),
        ((key.half(), key.half(), kc, vc, bt, lens), TypeError, r"'k_cache' has dtype torch.float32 but 'key' has torch.float16"),
        ((key[:, :0], key[:, :0], kc, vc, bt, lens), ValueError, r"'key' has T=0 tokens"),
        ((key, key, kc, vc, bt, lens.double()), TypeError, r"'cache_seqlens' has dtype float64; expected an integer"),
        ((key, key, kc, vc, bt[:1], lens), ValueError, r"'block_table' has batch size 1; expected 2"),
        ((key, key, kc, vc[:, :, :1], bt, lens), ValueError, r"'v_cache' has shape"),
    ]
    for args, exc, msg in append_cases:
        with pytest.raises(exc, match=msg):
            append_paged_kv(*args)


def test_decode_config(monkeypatch):
    """The split heuristic as on an H100 (132 SMs): batch 1 fills 2-4 programs an SM, batch 64
    needs no split, short capacities keep at least 2 tiles a split, forced counts are clamped."""
    cfg = heur.decode_config.__wrapped__       # uncached: the patched device facts apply
    monkeypatch.setattr(heur, "sm_count", lambda: 132)
    monkeypatch.setattr(heur, "interpreting", lambda: False)
    c = cfg(1, 8, 4, 32768, 128, 16, 2)
    assert (c.block_n, c.block_g, c.block_d, c.num_warps) == (64, 16, 128, 4)
    assert 2 * 132 <= 8 * c.num_splits <= 4 * 132 and c.num_stages in (2, 3)
    assert cfg(64, 8, 4, 32768, 128, 16, 2).num_splits == 1
    assert cfg(16, 8, 4, 4096, 128, 16, 2).num_splits == 4
    assert cfg(1, 8, 4, 256, 128, 16, 2).num_splits == 2          # at least 2 tiles a split
    assert cfg(1, 8, 4, 4096, 256, 16, 4).block_n == 16
    assert cfg(1, 8, 4, 64, 128, 16, 2, 1000).num_splits == 1     # forced, clamped to the tiles
    big = cfg(8, 8, 4, 8192, 128, 16, 2)                          # 64 (sequence, kv head) pairs:
    assert (big.block_n, big.num_stages, big.granule) == (128, 2, 128)   # 32 KB tiles, 2 stages
    assert cfg(7, 8, 4, 8192, 128, 16, 2).block_n == 64


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_large_gpu(dtype):
    hq, hkv, d, page, mb = 32, 8, 128, 16, 256
    lens = torch.tensor([4096, 1, 3001, 0, 2048 + 7], device=DEVICE, dtype=torch.int32)
    kc, vc, bt, _ = paged(5, mb, page, hkv, d, dtype)
    q = randn(5, hq, d, dtype=dtype)
    ref = reference(q, kc, vc, bt, lens)
    for splits in (None, 1, 7):
        assert_close(decode_attention(q, kc, vc, bt, lens, num_splits=splits), ref, dtype)
    # 8 sequences x 8 kv heads: the 128-token tiles, lengths off the tile and the page
    lens8 = torch.tensor([4095, 0, 1, 127, 129, 3000, 4096, 2047], device=DEVICE, dtype=torch.int32)
    kc, vc, bt, _ = paged(8, mb, page, hkv, d, dtype)
    q = randn(8, hq, d, dtype=dtype)
    ref = reference(q, kc, vc, bt, lens8)
    for splits in (None, 1, 3):
        assert_close(decode_attention(q, kc, vc, bt, lens8, num_splits=splits), ref, dtype)


@pytest.mark.parametrize("card,dram", [("H100", 3.35e12), ("H200", 4.8e12)])
def test_sm90_split_plan(card, dram):
    """The Hopper kernel's split count (NOTES item 139) on 132 SMs, GQA 32/8 at D 128 in bf16 (512
    bytes a token): batch 1 splits to fill the grid, batch >= 16 never splits, and where the pairs
    alone come near the DRAM's rate (batch 8 at short contexts, batch 12) one split is planned
    though two (or four) would fill the grid. The grid never exceeds the programs' slots."""
    from warpforge.ops.decode_attention_sm90 import plan
    picks = {(b, ctx): plan(b * 8, ctx, 132, 512, dram) for b in (1, 4, 8, 12, 16, 64)
             for ctx in (512, 1024, 2048, 4096, 8192, 32768)}
    for (b, ctx), (s, grid) in picks.items():
        assert grid == min(b * 8 * s, 132), (b, ctx, s, grid)
    assert [picks[1, c][0] for c in (512, 1024, 4096, 32768)] == [2, 4, 16, 16]
    assert all(picks[12, c][0] == 1 for c in (512, 1024, 2048, 8192))
    assert all(picks[b, c][0] == 1 for b in (16, 64) for c in (512, 1024, 2048, 8192, 32768))
    assert picks[8, 512][0] == picks[8, 1024][0] == 1 and picks[8, 32768][0] == 2
    assert picks[4, 2048][0] == 4
    assert picks[8, 2048][0] == (1 if card == "H100" else 2)     # the faster DRAM leaves the pairs' streams short
    assert plan(64, 4096, 132, 512, 1e15)[0] == 2                # an unbounded DRAM: the filling count
    assert plan(64, 4096, 132, 512, 1e9)[0] == 1                 # a slow one: the pairs saturate it


def test_sm90_fp8_halves_rule():
    """Which fp8 launches run S^T as two MMA chains (NOTES item 166): one split, or units of 32
    slots (2048 tokens) or more; never a 16-bit launch. A window's span, not the capacity, sets
    the unit."""
    from warpforge.ops.decode_attention_sm90 import _halves
    bt = torch.zeros(2, 256, dtype=torch.int32)                     # 256 pages of 16: 4096 tokens a sequence
    k8 = torch.empty(600, 16, 8, 128, dtype=torch.float8_e4m3fn)
    k16 = torch.empty(600, 16, 8, 128, dtype=torch.bfloat16)
    assert [_halves(k8, bt, s, -1) for s in (1, 2, 3, 4, 16)] == [True, True, False, False, False]
    assert not any(_halves(k16, bt, s, -1) for s in (1, 2, 16))
    assert _halves(k8, bt, 1, 100) and not _halves(k8, bt, 2, 100)   # a 101-key window: 2 slots a unit


def _sm90():
    import warpforge.ops.decode_attention as DA
    return DA._sm90_kernel() if ON_GPU and torch.cuda.get_device_capability()[0] == 9 else None


sm90_only = pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] != 9 or _sm90() is None,
                               reason="needs a Hopper GPU and Gluon (the sm_90 decode kernel)")

# (Hq, Hkv, D, block_size, lengths, interleaved K/V buffer, block-table dtype): the GQA groups the
# kernel covers (1 to 16 query heads a kv head), both head dims, pages of 16 to 64 tokens, lengths
# 0, 1, off the 16-token slice and the page, and past one 64-token slot
SM90_CASES = [(32, 8, 128, 16, [4097, 1, 0, 1000, 17], False, torch.int32),
              (32, 8, 64, 32, [63, 64, 65, 2048, 0], True, torch.int64),
              (8, 8, 128, 64, [300, 5, 129], False, torch.int32),
              (16, 1, 128, 16, [2000, 33], True, torch.int32),
              (32, 4, 64, 16, [777, 1, 4096], False, torch.int64),
              (6, 2, 128, 16, [129, 0, 1, 3000], False, torch.int32)]


def _sm90_calls(monkeypatch) -> list:
    """Every call the Hopper kernel covers goes to it (no size threshold, no plan left by another
    test); returns the list its calls append to, so a test can check it ran (or did not)."""
    import warpforge.ops.decode_attention as DA
    mod = _sm90()
    monkeypatch.setattr(DA, "_PLANS", {})
    monkeypatch.setattr(heur, "DECODE_SM90_MIN_TOKENS", 0)
    calls = []
    real = mod.decode_sm90
    monkeypatch.setattr(mod, "decode_sm90", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@sm90_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", SM90_CASES)
def test_sm90_decode(case, dtype, monkeypatch):
    """The Hopper kernel (ops/decode_attention_sm90.py) against float64, checked to be the one
    that ran, at its own split plan and at forced counts."""
    hq, hkv, d, page, lens, interleave, bt_dtype = case
    calls = _sm90_calls(monkeypatch)
    lens_t = torch.tensor(lens, device=DEVICE, dtype=torch.int32)
    mb = -(-max(lens) // page) + 1
    kc, vc, bt, _ = paged(len(lens), mb, page, hkv, d, dtype, guard=interleave)
    bt = bt.to(bt_dtype)
    q = randn(len(lens), hq, d, dtype=dtype)
    ref = reference(q, kc, vc, bt, lens_t)
    for splits in (None, 1, 5):
        out = decode_attention(q, kc, vc, bt, lens_t, num_splits=splits)
        assert_close(out, ref, dtype, what=f"num_splits={splits}")
        for i, n in enumerate(lens):
            if n == 0:
                assert out[i].abs().max() == 0, "seq_len 0 gives zeros"
    assert len(calls) == 3, "the sm_90 kernel took the calls"


@sm90_only
@pytest.mark.parametrize("case", SM90_CASES[:4])
def test_sm90_window_softcap(case, monkeypatch):
    """The Hopper kernel with sliding windows and a softcap (test_window_softcap's poisoned
    problem: NaN in every row a window or a length leaves out, -1 for the pages before the
    window), at its own split plan and forced counts, checked to be the kernel that ran. Without
    a window the NaN rows past each length sit in the last page's slice, which the kernel loads
    whole."""
    hq, hkv, d, page, lens, interleave, bt_dtype = case
    calls = _sm90_calls(monkeypatch)
    lens_t = torch.tensor(lens, device=DEVICE, dtype=torch.int32)
    mb = -(-max(lens) // page) + 1
    q = randn(len(lens), hq, d, dtype=torch.bfloat16, scale=3.0)
    for left in (-1, 0, 37, 1000, 10**6):
        kc, vc, bt, _ = paged(len(lens), mb, page, hkv, d, torch.bfloat16, guard=interleave)
        bt = bt.to(bt_dtype)
        called = _window_problem(lens_t, left, page, kc, vc, bt)
        for softcap in (0.0, 30.0):
            ref = reference(q, kc, vc, bt, lens_t, window_size=(left, -1), softcap=softcap)
            for splits in (None, 1, 5):
                out = decode_attention(q, kc, vc, called, lens_t, window_size=(left, -1), softcap=softcap,
                                       num_splits=splits)
                assert_close(out, ref, torch.bfloat16, what=f"window {left}, softcap {softcap}, num_splits={splits}")
    assert len(calls) == 30, "the sm_90 kernel took the calls"


@sm90_only
def test_sm90_bad_metadata_stays_in_bounds(monkeypatch):
    """validate=False with block ids outside the cache and a length past the capacity: the guard
    blocks (NaN) around the caches never reach an output; the sequence with good metadata is exact."""
    hq, hkv, d, page, mb = 32, 8, 128, 16, 6
    kc, vc, bt, pool = paged(3, mb, page, hkv, d, torch.bfloat16, guard=True)
    good = bt.clone()
    bt[1, 2] = -1
    bt[2, 0] = kc.shape[0]
    lens = torch.tensor([70, 90, 10**6], device=DEVICE, dtype=torch.int32)
    q = randn(3, hq, d, dtype=torch.bfloat16)
    monkeypatch.setattr(heur, "DECODE_SM90_MIN_TOKENS", 0)
    for splits in (None, 1, 3):
        out = decode_attention(q, kc, vc, bt, lens, num_splits=splits, validate=False)
        assert torch.isfinite(out).all()
        assert_close(out[0], reference(q, kc, vc, good, lens)[0], torch.bfloat16)


@sm90_only
def test_sm90_unvalidated_metadata_exact(monkeypatch):
    """The Hopper kernel with validate=False, each bad sequence against its exact meaning (the
    test above only asks for finite values): a block id of -1 and one past the cache drop their
    pages' tokens (TMA zero-fills those boxes, so a token kept rather than masked scores 0, not
    -inf, and shifts the softmax), and a length past the capacity attends to exactly the capacity
    (the table is a slice of a wider one whose next columns hold a valid bait block: a read past
    the row would add its keys). NaN guard blocks around the caches. A mutation audit of the
    kernel (NOTES item 146) found each of the three checks (the length clamp, the block id's upper
    bound, the mask of a -1 page) removable with every other test passing."""
    calls = _sm90_calls(monkeypatch)
    hq, hkv, d, page, mb = 32, 8, 128, 16, 6
    kc, vc, bt, _ = paged(4, mb, page, hkv, d, torch.bfloat16, guard=True)
    nb = kc.shape[0]
    bait = min(set(range(nb)) - set(bt.flatten().tolist()))
    wide = torch.full((4, mb + 2), bait, device=DEVICE, dtype=torch.int32)
    wide[:, :mb] = bt
    good = bt.clone()
    bt = wide[:, :mb]
    bt[2, 2] = -1                              # sequence 2: its third page dropped
    bt[3, 0] = nb                              # sequence 3: its first page dropped (the guard block's id)
    lens = torch.tensor([70, 10**6, 90, 40], device=DEVICE, dtype=torch.int32)
    # the tokens each sequence keeps, as a valid table and length for the reference
    ref_bt = good.clone()
    ref_bt[2, 2:mb - 1] = good[2, 3:]
    ref_bt[3, :mb - 1] = good[3, 1:]
    ref_lens = torch.tensor([70, mb * page, 90 - page, 40 - page], device=DEVICE, dtype=torch.int32)
    q = randn(4, hq, d, dtype=torch.bfloat16)
    ref = reference(q, kc, vc, ref_bt, ref_lens)
    for splits in (None, 1, 3):
        out = decode_attention(q, kc, vc, bt, lens, num_splits=splits, validate=False)
        for i, what in enumerate(("good", "length past the capacity", "block id -1", "block id past the cache")):
            assert_close(out[i], ref[i], torch.bfloat16, what=f"{what}, num_splits={splits}")
    assert len(calls) == 3, "the sm_90 kernel took the calls"


@sm90_only
@pytest.mark.parametrize("why", ["pages of 8", "unaligned caches"])
def test_sm90_declined_calls_take_triton(why, monkeypatch):
    """Calls the Hopper kernel must decline (``covers``) go to the Triton kernel, and are right:
    pages under its 16-token box (a box would run into the next page) and caches whose base is
    not 16-byte aligned (TMA cannot address them). Both were routed to the Hopper kernel with
    every other test passing (NOTES item 146)."""
    calls = _sm90_calls(monkeypatch)
    hq, hkv, d = 32, 8, 128
    page = 8 if why == "pages of 8" else 16
    lens = torch.tensor([300, 1, 77], device=DEVICE, dtype=torch.int32)
    mb = -(-300 // page)
    kc, vc, bt, _ = paged(3, mb, page, hkv, d, torch.bfloat16)
    if why == "unaligned caches":
        def shifted(t):                        # the same values at a base 2 bytes past a 16-byte boundary
            buf = torch.empty(t.numel() + 8, device=DEVICE, dtype=t.dtype)
            out = buf[1:1 + t.numel()].view(t.shape)
            out.copy_(t)
            return out
        kc, vc = shifted(kc), shifted(vc)
        assert kc.data_ptr() % 16 != 0
    q = randn(3, hq, d, dtype=torch.bfloat16)
    ref = reference(q, kc, vc, bt, lens)
    for splits in (None, 1, 3):
        assert_close(decode_attention(q, kc, vc, bt, lens, num_splits=splits), ref, torch.bfloat16,
                     what=f"num_splits={splits}")
    assert not calls, "the sm_90 kernel declined the calls"


@sm90_only
def test_sm90_pdl_combine(monkeypatch):
    """The combine launched as the Gluon kernel's programmatic dependent (it waits for that grid in
    its first step): the same bits as with PDL off, first call and plan replays, batch 1 (16
    splits) and 3 with short and empty sequences, and the kernel was asked for it."""
    import warpforge.ops.decode_attention as DA
    mod = _sm90()
    monkeypatch.setattr(heur, "DECODE_SM90_MIN_TOKENS", 0)
    seen = []
    real = mod.decode_sm90
    monkeypatch.setattr(mod, "decode_sm90", lambda *a, **k: seen.append(k.get("pdl")) or real(*a, **k))
    hq, hkv, d, page = 32, 8, 128, 16
    for lens in ([4000], [700, 0, 2049]):
        mb = -(-max(lens) // page)
        kc, vc, bt, _ = paged(len(lens), mb, page, hkv, d, torch.bfloat16)
        lens_t = torch.tensor(lens, device=DEVICE, dtype=torch.int32)
        q = randn(len(lens), hq, d, dtype=torch.bfloat16)
        ref = reference(q, kc, vc, bt, lens_t)
        outs = {}
        for on in (False, True):
            monkeypatch.setattr(DA, "_PDL_ON", on)
            monkeypatch.setattr(DA, "_PLANS", {})
            outs[on] = [decode_attention(q, kc, vc, bt, lens_t, validate=False) for _ in range(3)]
        for o in outs[False] + outs[True]:
            assert_close(o, ref, torch.bfloat16)
            assert torch.equal(o, outs[False][0])
    assert seen == [False, True] * 2, seen


def _replay_route(route, monkeypatch):
    """Calls on ``route`` ("triton" or "sm90", skipped without the Hopper kernel) with no plan left
    by another test; returns (the list each call through the launchers appends to, the module)."""
    import warpforge.ops.decode_attention as DA
    if route == "sm90":
        if _sm90() is None:
            pytest.skip("needs a Hopper GPU and Gluon (the sm_90 decode kernel)")
        monkeypatch.setattr(heur, "DECODE_SM90_MIN_TOKENS", 0)
    else:
        monkeypatch.setattr(DA, "_SM90", [None])
    monkeypatch.setattr(DA, "_PLANS", {})
    firsts = []
    real = DA._decode_first
    monkeypatch.setattr(DA, "_decode_first", lambda *a: firsts.append(1) or real(*a))
    return firsts, DA


@gpu_only
@pytest.mark.parametrize("heads", [(32, 8), (6, 2)])
@pytest.mark.parametrize("bsz", [4, 17])
@pytest.mark.parametrize("route", ["triton", "sm90"])
def test_plan_replay(route, bsz, heads, monkeypatch):
    """Calls after the first of a shape replay its recorded launches (decode_attention's plans,
    no JIT): new cache contents, block table, lengths and scale each call, every result against
    float64; only the first call takes the launchers. Batch 4 splits the context (a combine pass),
    batch 17 x 8 kv heads fills the Hopper kernel's grid with one split; 6 query heads make the
    partials' row count odd (their pieces of one allocation stay 16-byte aligned)."""
    firsts, DA = _replay_route(route, monkeypatch)
    (hq, hkv), d, page, mb = heads, 128, 16, 20
    kc, vc, bt, _ = paged(bsz, mb, page, hkv, d, torch.bfloat16)
    for i in range(3):
        kc.normal_()
        vc.normal_()
        bt = bt[torch.randperm(bsz, device=DEVICE)]
        lens = torch.randint(0, mb * page + 1, (bsz,), device=DEVICE, dtype=torch.int32)
        lens[0] = mb * page
        q = randn(bsz, hq, d, dtype=torch.bfloat16)
        scale = 0.05 * (i + 1)
        out = decode_attention(q, kc, vc, bt, lens, scale=scale, validate=False)
        assert_close(out, reference(q, kc, vc, bt, lens, scale=scale), torch.bfloat16, what=f"call {i}")
    assert len(firsts) == 1 and len(DA._PLANS) == 1, "calls after the first replay the plan"


@sm90_only
@pytest.mark.parametrize("case", SM90_CASES)
def test_sm90_return_lse(case, monkeypatch):
    """The Hopper kernel with return_lse at every split count: at one split its in-kernel merge
    writes the lse beside the output, with splits the combine does; checked to be the sm_90
    kernel's, the output and lse (and the plain call's output) held to float64's."""
    hq, hkv, d, page, lens, interleave, bt_dtype = case
    calls = _sm90_calls(monkeypatch)
    lens_t = torch.tensor(lens, device=DEVICE, dtype=torch.int32)
    mb = -(-max(lens) // page) + 1
    kc, vc, bt, _ = paged(len(lens), mb, page, hkv, d, torch.bfloat16, guard=interleave)
    bt = bt.to(bt_dtype)
    q = randn(len(lens), hq, d, dtype=torch.bfloat16, scale=2.0)
    want = reference(q, kc, vc, bt, lens_t, return_lse=True)
    for splits in (None, 1, 5):
        got = decode_attention(q, kc, vc, bt, lens_t, num_splits=splits, return_lse=True)
        _check_lse(got, want, torch.bfloat16, f"num_splits={splits}")
        assert_close(decode_attention(q, kc, vc, bt, lens_t, num_splits=splits), want[0], torch.bfloat16,
                     what=f"plain, num_splits={splits}")
    assert len(calls) == 6, "the sm_90 kernel took the calls"


@gpu_only
@pytest.mark.parametrize("bsz", [4, 17])
@pytest.mark.parametrize("route", ["triton", "sm90"])
def test_plan_replay_return_lse(route, bsz, monkeypatch):
    """return_lse's plan (its own, beside the plain call's) replays: new contents, lengths and
    scale each call, output and lse against float64; batch 17 x 8 kv heads is one split (the
    partials and the combine only because the lse is asked for)."""
    firsts, DA = _replay_route(route, monkeypatch)
    hq, hkv, d, page, mb = 32, 8, 128, 16, 20
    kc, vc, bt, _ = paged(bsz, mb, page, hkv, d, torch.bfloat16)
    for i in range(3):
        kc.normal_()
        vc.normal_()
        lens = torch.randint(0, mb * page + 1, (bsz,), device=DEVICE, dtype=torch.int32)
        lens[0] = mb * page
        q = randn(bsz, hq, d, dtype=torch.bfloat16)
        scale = 0.05 * (i + 1)
        got = decode_attention(q, kc, vc, bt, lens, scale=scale, validate=False, return_lse=True)
        _check_lse(got, reference(q, kc, vc, bt, lens, scale=scale, return_lse=True), torch.bfloat16, f"call {i}")
    assert len(firsts) == 1 and len(DA._PLANS) == 1, "calls after the first replay the plan"


@gpu_only
@pytest.mark.parametrize("route", ["triton", "sm90"])
def test_plan_replay_window_softcap(route, monkeypatch):
    """A windowed, soft-capped call's plan replays with each call's own scale and softcap (the
    plan is keyed by the window and by whether there is a softcap, not by its value)."""
    firsts, DA = _replay_route(route, monkeypatch)
    bsz, hq, hkv, d, page, mb = 4, 32, 8, 128, 16, 40
    kc, vc, bt, _ = paged(bsz, mb, page, hkv, d, torch.bfloat16)
    lens = torch.tensor([mb * page, 300, 1, 77], device=DEVICE, dtype=torch.int32)
    q = randn(bsz, hq, d, dtype=torch.bfloat16, scale=3.0)
    for i, (scale, softcap) in enumerate(((0.1, 5.0), (0.05, 20.0), (0.2, 1.0))):
        out = decode_attention(q, kc, vc, bt, lens, scale=scale, window_size=(200, 0), softcap=softcap, validate=False)
        want = reference(q, kc, vc, bt, lens, scale=scale, window_size=(200, 0), softcap=softcap)
        assert_close(out, want, torch.bfloat16, what=f"call {i}")
    assert len(firsts) == 1 and len(DA._PLANS) == 1, "calls after the first replay the plan"


def test_scale_not_finite():
    """scale NaN or inf gave an all-NaN output without an error."""
    kc, vc, bt, _ = paged(2, 3, 8, 2, 16, torch.float32)
    q, lens = randn(2, 4, 16), torch.tensor([3, 4], device=DEVICE, dtype=torch.int32)
    for s in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="'scale' is .*; expected a finite number"):
            decode_attention(q, kc, vc, bt, lens, scale=s)


def test_append_refuses_one_tensor_as_both_caches():
    """The same tensor as k_cache and v_cache: the values overwrote the keys just written, silently.
    Two views of one buffer (a (blocks, 2, block, Hkv, D) cache split in two) stay fine."""
    kc, vc, bt, _ = paged(2, 3, 8, 2, 16, torch.float32)
    key, value = randn(2, 1, 2, 16), randn(2, 1, 2, 16)
    lens = torch.tensor([3, 4], device=DEVICE, dtype=torch.int32)
    with pytest.raises(ValueError, match="'k_cache' and 'v_cache' are the same memory"):
        append_paged_kv(key, value, kc, kc, bt, lens)
    both = torch.stack([kc, vc], 1)                       # (blocks, 2, block, Hkv, D)
    append_paged_kv(key, value, both[:, 0], both[:, 1], bt, lens)
    append_paged_kv(key, value, kc, vc, bt, lens)
    assert torch.equal(both[:, 0], kc) and torch.equal(both[:, 1], vc)


# ----------------------------------------------------------------------------------------------
# fp8 caches (k_scale / v_scale)
# ----------------------------------------------------------------------------------------------
FP8_KV = [torch.float8_e4m3fn, torch.float8_e5m2]
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def quantized(x, kv_dtype, scale):
    """torch's per-tensor quantisation, the rounding append_paged_kv promises."""
    m = FP8_MAX[kv_dtype]
    return (x.float() / scale).clamp(-m, m).to(kv_dtype)


def fp8_paged(bsz, max_blocks, page, hkv, d, kv_dtype, ks, vs):
    """(k_cache, v_cache, block_table, float caches they came from): fp8 views of one interleaved
    (blocks + 2, page, 2, Hkv, D) pool whose first and last blocks are NaN, K quantised with ``ks``
    and V with ``vs`` (different scales, so a swap shows)."""
    kf, vf, bt, pool = paged(bsz, max_blocks, page, hkv, d, torch.float32, guard=True)
    q8 = torch.empty(pool.shape, dtype=kv_dtype, device=DEVICE)
    q8[:, :, 0] = quantized(pool[:, :, 0], kv_dtype, ks)
    q8[:, :, 1] = quantized(pool[:, :, 1], kv_dtype, vs)
    assert q8[0].float().isnan().all(), "the guard blocks stay NaN in fp8"
    return q8[1:-1, :, 0], q8[1:-1, :, 1], bt, (kf, vf)


@pytest.mark.parametrize("kv_dtype", FP8_KV)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES[:3])
def test_fp8_cache(case, dtype, kv_dtype):
    """fp8 caches with per-tensor scales (as floats and as device tensors, 0-d and (1,)): against
    float64 on the dequantised caches at every split count, with the lse, a window and a softcap;
    and within the fp8 rounding of the answer on the unquantised caches. The guard blocks around
    the caches are NaN: a read outside them would show."""
    hq, hkv, d, page, mb = case
    cap = mb * page
    ks, vs = 0.012, 0.015                      # |x| / scale up to ~300-400 (x ~ N(0, 1)): e4m3's top, unclamped
    kc, vc, bt, (kf, vf) = fp8_paged(5, mb, page, hkv, d, kv_dtype, ks, vs)
    assert kc.dtype == kv_dtype and not kc.is_contiguous()
    lens = torch.tensor([1, cap, 13, 0, cap - page + 3], device=DEVICE, dtype=torch.int32)
    q = randn(5, hq, d, dtype=dtype)
    want = decode_attention_reference(q.double(), kc, vc, bt, lens, k_scale=ks, v_scale=vs, return_lse=True)
    for splits, k_scale, v_scale in ((None, ks, vs), (1, torch.tensor(ks, device=DEVICE), torch.tensor([vs], device=DEVICE)),
                                     (3, torch.tensor([ks], device=DEVICE, dtype=torch.float64), vs)):
        out = decode_attention(q, kc, vc, bt, lens, num_splits=splits, k_scale=k_scale, v_scale=v_scale)
        assert out.dtype == dtype and out.shape == q.shape
        assert_close(out, want[0], dtype, what=f"num_splits={splits}")
        assert out[3].abs().max() == 0, "seq_len 0 gives zeros"
        got = decode_attention(q, kc, vc, bt, lens, num_splits=splits, k_scale=k_scale, v_scale=v_scale,
                               return_lse=True)
        _check_lse(got, want, dtype, f"lse, num_splits={splits}")
    # the fp8 rounding is the only difference from the 16/32-bit cache's answer (e4m3: 2^-4
    # relative an element, e5m2: 2^-3; averaged over many keys the output moves far less)
    exact = reference(q, kf, vf, bt, lens)     # the values before quantisation
    assert rel_err(out.double(), exact.double()) < (0.05 if kv_dtype == torch.float8_e4m3fn else 0.1)
    kw = dict(window_size=(9, 0), softcap=3.0, k_scale=ks, v_scale=vs)
    assert_close(decode_attention(q, kc, vc, bt, lens, num_splits=2, **kw),
                 decode_attention_reference(q.double(), kc, vc, bt, lens, **kw), dtype, what="window, softcap")


@pytest.mark.parametrize("kv_dtype", FP8_KV)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_append_then_decode(dtype, kv_dtype):
    """16/32-bit tokens appended into fp8 caches land as torch's rounding of x / scale, clamped
    to the format's max (outliers past it included; NaN stays NaN); fp8 tokens into fp8 caches are
    copied as they are; then decode over them matches float64 on the dequantised caches. Scales
    as a float (K) and a device tensor (V)."""
    hq, hkv, d, page, mb = 4, 2, 16, 8, 4
    ks, vs = 0.02, 0.5
    kc, vc, bt, _ = fp8_paged(3, mb, page, hkv, d, kv_dtype, ks, vs)
    lens = torch.tensor([8, 5, 0], device=DEVICE, dtype=torch.int32)
    t = 6
    key, value = randn(3, t, hkv, d, dtype=dtype, scale=2.0), randn(3, t, hkv, d, dtype=dtype, scale=50.0)
    key[0, 0, 0, 0] = 1e6                      # past the format's max: clamped, not inf/NaN
    key[1, 2, 1, 3] = float("nan")
    k0, v0 = kc.clone(), vc.clone()
    append_paged_kv(key, value, kc, vc, bt, lens, k_scale=ks, v_scale=torch.tensor(vs, device=DEVICE))
    qk, qv = quantized(key, kv_dtype, ks), quantized(value, kv_dtype, vs)
    assert qk[0, 0, 0, 0].float() == FP8_MAX[kv_dtype]
    for b, s0 in enumerate(lens.tolist()):
        for i in range(t):
            p = s0 + i
            blk = int(bt[b, p // page])
            got_k, got_v = kc[blk, p % page].float(), vc[blk, p % page].float()
            want_k = qk[b, i].float()
            assert torch.equal(got_k.isnan(), want_k.isnan()), (b, i)
            assert torch.equal(got_k.nan_to_num(), want_k.nan_to_num()), (b, i)
            assert torch.equal(got_v, qv[b, i].float()), (b, i)
    changed = (kc.view(torch.uint8) != k0.view(torch.uint8)).any(-1).any(-1)
    assert int(changed.sum()) <= 3 * t, "only the appended rows changed"
    key[1, 2, 1, 3] = 0.0                      # decode over clean caches
    append_paged_kv(key, value, kc, vc, bt, lens, k_scale=ks, v_scale=vs)
    q = randn(3, hq, d, dtype=dtype)
    out = decode_attention(q, kc, vc, bt, lens + t, k_scale=ks, v_scale=vs)
    assert_close(out, decode_attention_reference(q.double(), kc, vc, bt, lens + t, k_scale=ks, v_scale=vs), dtype)
    # fp8 tokens into fp8 caches: a copy, bit for bit
    raw_k, raw_v = qk.clone(), qv.clone()
    append_paged_kv(raw_k, raw_v, kc, vc, bt, lens + t)
    blk = int(bt[0, (8 + t) // page])
    assert torch.equal(kc[blk, (8 + t) % page].view(torch.uint8), raw_k[0, 0].view(torch.uint8))


def test_fp8_errors():
    """What fp8 caches and their scales refuse, each naming the argument."""
    hq, hkv, d, page = 4, 2, 16, 8
    kc, vc, bt, _ = fp8_paged(2, 3, page, hkv, d, torch.float8_e4m3fn, 1.0, 1.0)
    kf, vf, _, _ = paged(2, 3, page, hkv, d, torch.float32)
    q = randn(2, hq, d, dtype=torch.bfloat16)
    lens = torch.tensor([3, 4], device=DEVICE, dtype=torch.int32)
    two = torch.ones(2, device=DEVICE)
    cases = [
        (dict(k_scale=0.0), ValueError, r"'k_scale' is 0.0; expected a finite scale > 0"),
        (dict(v_scale=-1.0), ValueError, r"'v_scale' is -1.0; expected a finite scale > 0"),
        (dict(k_scale=float("nan")), ValueError, r"'k_scale' is nan"),
        (dict(k_scale="1"), TypeError, r"'k_scale' must be a float, a one-element tensor or None"),
        (dict(k_scale=True), TypeError, r"'k_scale' must be a float"),
        (dict(v_scale=two), ValueError, r"'v_scale' is a float32 tensor of shape \(2,\); expected one floating"),
        (dict(k_scale=torch.ones(1, device=DEVICE, dtype=torch.int32)), ValueError, r"'k_scale' is a int32 tensor"),
        (dict(k_scale=torch.ones(1, device="meta")), RuntimeError, r"'k_scale' is on meta but 'k_cache' is on"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            decode_attention(q, kc, vc, bt, lens, **kw)
    with pytest.raises(ValueError, match=r"'k_scale' is given but the caches are float32; a scale applies only to fp8"):
        decode_attention(q.float(), kf, vf, bt, lens, k_scale=1.0)
    with pytest.raises(TypeError, match=r"'v_cache' has dtype torch.float8_e5m2 but 'k_cache' has torch.float8_e4m3fn"):
        decode_attention(q, kc, vc.to(torch.float8_e5m2), bt, lens)
    with pytest.raises(TypeError, match=r"'q' has dtype float8_e4m3fn"):
        decode_attention(q.to(torch.float8_e4m3fn), kc, vc, bt, lens)
    with pytest.raises(TypeError, match=r"'k_cache' has dtype int8"):
        decode_attention(q, kc.view(torch.int8), vc.view(torch.int8), bt, lens)
    with pytest.raises(TypeError, match=r"'k_cache' has dtype torch.float32 but 'q' has torch.bfloat16; expected the "
                                        r"same dtype, or an fp8 cache"):
        decode_attention(q, kf, vf, bt, lens)
    key = randn(2, 1, hkv, d, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"'k_scale'/'v_scale' are given but 'key' already has the caches' dtype"):
        append_paged_kv(key.to(torch.float8_e4m3fn), key.to(torch.float8_e4m3fn), kc, vc, bt, lens, k_scale=2.0)
    with pytest.raises(ValueError, match=r"'v_scale' is 0; expected a finite scale > 0"):
        append_paged_kv(key, key, kc, vc, bt, lens, v_scale=0)
    with pytest.raises(TypeError, match=r"'k_cache' has dtype torch.float32 but 'key' has torch.float8_e4m3fn"):
        append_paged_kv(key.to(torch.float8_e4m3fn), key.to(torch.float8_e4m3fn), kf, vf, bt, lens)


def test_fp8_compile_and_opcheck():
    """fp8 caches through torch.compile(fullgraph=True) (append quantising, then decode, scales
    as floats and as a tensor) against eager, and opcheck of both operators with scales."""
    hq, hkv, d, page, mb = 4, 2, 16, 8, 3
    kc, vc, bt, _ = fp8_paged(2, mb, page, hkv, d, torch.float8_e4m3fn, 0.01, 0.02)
    lens = torch.tensor([7, 16], device=DEVICE, dtype=torch.int32)
    q, key, value = randn(2, hq, d), randn(2, 1, hkv, d), randn(2, 1, hkv, d)
    vs = torch.tensor(0.02, device=DEVICE)
    kc2, vc2 = kc.clone(), vc.clone()

    def step(q, key, value, kc, vc, bt, lens, vs):
        append_paged_kv(key, value, kc, vc, bt, lens, k_scale=0.01, v_scale=vs)
        return decode_attention(q, kc, vc, bt, lens + 1, k_scale=0.01, v_scale=vs) * 2

    out = torch.compile(step, fullgraph=True)(q, key, value, kc, vc, bt, lens, vs)
    want = step(q, key, value, kc2, vc2, bt, lens, vs)
    assert torch.equal(kc.view(torch.uint8), kc2.view(torch.uint8)) and torch.equal(vc.view(torch.uint8),
                                                                                   vc2.view(torch.uint8))
    assert_close(out, want, torch.float32, what="compiled")
    s1 = torch.full((1,), 0.01, device=DEVICE)
    # test_schema left out: its mutation check compares tensors with arithmetic PyTorch lacks for
    # fp8 ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'); test_opcheck runs it on
    # the 16/32-bit caches
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(decode_attention_op.overload, (q, kc, vc, bt, lens, 0.25, 2, -1, 0.0, s1, s1),
                          test_utils=utils)
    torch.library.opcheck(decode_attention_lse_op.overload, (q, kc, vc, bt, lens, 0.25, 0, -1, 0.0, s1, s1),
                          test_utils=utils)
    torch.library.opcheck(append_paged_kv_op.overload, (key, value, kc, vc, bt, lens, s1, s1), test_utils=utils)


@gpu_only
@pytest.mark.parametrize("kv_dtype", FP8_KV)
def test_fp8_large_gpu(kv_dtype):
    """Serving sizes on a GPU (Hq 32 / Hkv 8, D 128, pages of 16, fp8 tiles of 128 tokens): long
    and odd lengths at several split counts; then the plan's replays and a CUDA graph read the
    scale tensors each launch (a changed value changes the output, with no recompile)."""
    hq, hkv, d, page, mb = 32, 8, 128, 16, 256
    ks, vs = 0.02, 0.01
    kc, vc, bt, _ = fp8_paged(8, mb, page, hkv, d, kv_dtype, ks, vs)
    lens = torch.tensor([4095, 0, 1, 127, 129, 3000, 4096, 2047], device=DEVICE, dtype=torch.int32)
    q = randn(8, hq, d, dtype=torch.bfloat16)
    ref = decode_attention_reference(q, kc, vc, bt, lens, k_scale=ks, v_scale=vs)
    for splits in (None, 1, 7):
        assert_close(decode_attention(q, kc, vc, bt, lens, num_splits=splits, k_scale=ks, v_scale=vs), ref,
                     torch.bfloat16, what=f"num_splits={splits}")
    k_t, v_t = torch.tensor([ks], device=DEVICE), torch.tensor([vs], device=DEVICE)
    for i in range(3):                         # the plan: first call, then replays
        k_t.fill_(ks * (i + 1))
        v_t.fill_(vs / (i + 1))
        out = decode_attention(q, kc, vc, bt, lens, k_scale=k_t, v_scale=v_t, validate=False)
        want = decode_attention_reference(q, kc, vc, bt, lens, k_scale=ks * (i + 1), v_scale=vs / (i + 1))
        assert_close(out, want, torch.bfloat16, what=f"replay {i}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = decode_attention(q, kc, vc, bt, lens, k_scale=k_t, v_scale=v_t, validate=False)
    k_t.fill_(0.05)
    v_t.fill_(0.003)
    graph.replay()
    want = decode_attention_reference(q, kc, vc, bt, lens, k_scale=0.05, v_scale=0.003)
    assert_close(static, want, torch.bfloat16, what="CUDA graph replay with new scales")


@sm90_only
@pytest.mark.parametrize("kv_dtype", FP8_KV)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", SM90_CASES)
def test_sm90_fp8(case, dtype, kv_dtype, monkeypatch):
    """The Hopper kernel over fp8 caches (tiles widened to fp16 in registers, q brought to fp16 at
    a power of two a head, V^T's rows relabelled): against float64 on the dequantised caches at its
    own split plan and forced counts, with the lse, the rows past each length NaN (the kernel loads
    a length's last slice whole); then a window and a softcap; checked to be the kernel that ran."""
    hq, hkv, d, page, lens, _, bt_dtype = case
    calls = _sm90_calls(monkeypatch)
    lens_t = torch.tensor(lens, device=DEVICE, dtype=torch.int32)
    mb = -(-max(lens) // page) + 1
    ks, vs = 0.012, 0.015
    kc, vc, bt, _ = fp8_paged(len(lens), mb, page, hkv, d, kv_dtype, ks, vs)
    bt = bt.to(bt_dtype)
    _window_problem(lens_t, -1, page, kc, vc, bt)
    q = randn(len(lens), hq, d, dtype=dtype)
    want = decode_attention_reference(q.double(), kc, vc, bt, lens_t, k_scale=ks, v_scale=vs, return_lse=True)
    for splits in (None, 1, 2, 5):             # 2 splits of 4097 keys: units of 33 slots, the two-chain S^T
        out = decode_attention(q, kc, vc, bt, lens_t, num_splits=splits, k_scale=ks, v_scale=vs)
        assert_close(out, want[0], dtype, what=f"num_splits={splits}")
        got = decode_attention(q, kc, vc, bt, lens_t, num_splits=splits, k_scale=torch.tensor([ks], device=DEVICE),
                               v_scale=vs, return_lse=True)
        _check_lse(got, want, dtype, f"lse, num_splits={splits}")
    kw = dict(window_size=(37, -1), softcap=30.0, k_scale=ks, v_scale=vs)
    called = _window_problem(lens_t, 37, page, kc, vc, bt)
    ref = decode_attention_reference(q.double(), kc, vc, bt, lens_t, **kw)
    for splits in (None, 3):
        assert_close(decode_attention(q, kc, vc, called, lens_t, num_splits=splits, **kw), ref, dtype,
                     what=f"window, softcap, num_splits={splits}")
    assert len(calls) == 10, "the sm_90 kernel took the calls"


@sm90_only
@pytest.mark.parametrize("kv_dtype", FP8_KV)
def test_sm90_fp8_query_range(kv_dtype, monkeypatch):
    """bf16 queries fp16 cannot hold as they are (|q| to ~4e5, and ~3e-7 where fp16 keeps a few
    bits), each head at its own magnitude, with softmax scales that bring the scores back to O(1):
    the kernel's power of two a head keeps them exact."""
    calls = _sm90_calls(monkeypatch)
    hq, hkv, d, page = 32, 8, 128, 16
    lens = torch.tensor([700, 33, 2000], device=DEVICE, dtype=torch.int32)
    kc, vc, bt, _ = fp8_paged(3, 130, page, hkv, d, kv_dtype, 0.01, 0.01)
    for mag in (1e5, 3e-7):
        q = randn(3, hq, d, dtype=torch.float32) * mag
        q[:, ::4] *= 4.0                        # heads of one group at different powers of two
        q = q.to(torch.bfloat16)
        scale = 0.5 / (mag * d ** 0.5)
        want = decode_attention_reference(q.double(), kc, vc, bt, lens, scale=scale, k_scale=0.01, v_scale=0.01)
        for splits in (None, 1):
            out = decode_attention(q, kc, vc, bt, lens, scale=scale, num_splits=splits, k_scale=0.01, v_scale=0.01)
            assert_close(out, want, torch.bfloat16, what=f"|q| ~ {mag}, num_splits={splits}")
    assert len(calls) == 3, "the sm_90 kernel took the calls (the second plain call replays the first's plan)"
