"""The kernels that item 73's 64-bit offsets touched, timed for an A/B between two source trees
(issue 2/6 hygiene; a probe, not the benchmark). Each run prints one ``RESULT {case: ms}`` line
(bench timer: steady for >= 4 L2s moved, else clean); ``--table`` merges runs of two trees, the
least of each tree's rounds:

    git archive 81f8034^ src/warpforge | tar -x -C /tmp/old        # the tree to compare against
    for r in 1 2; do
      PYTHONPATH=/tmp/old/src python benchmarks/probe_offsets64.py > old_$r.log
      python benchmarks/probe_offsets64.py > new_$r.log
    done
    python benchmarks/probe_offsets64.py --table old_*.log -- new_*.log

AB_ONLY=sdpa,varlen (case-name prefixes) times a subset. Cases: sum / amax (and amax's backward)
over 262,144- and 2M-wide rows (the chunked kernels), batched and split-K pointer GEMMs, the
Triton attention kernels (a bool mask, D = 256, varlen causal and with a window), and the
cross-entropy backward with an upstream gradient of 3 (the scaling loop).
"""
import json
import os
import sys

import torch


def table(args):
    split = args.index("--")
    def load(files):
        rs = []
        for f in files:
            rs += [json.loads(line[7:]) for line in open(f) if line.startswith("RESULT ")]
        return rs
    old, new = load(args[:split]), load(args[split + 1:])
    print(f"{'case':34s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s}   (least of rounds; rounds old / new)")
    for k in [k for k in new[0] if k in old[0]]:
        o, n = min(r[k] for r in old), min(r[k] for r in new)
        print(f"{k:34s} {o:9.4f} {n:9.4f} {n / o:8.3f}   {[round(r[k], 4) for r in old]} {[round(r[k], 4) for r in new]}")


def main():
    import warpforge as wf
    from warpforge.bench.timing import TimingConfig, device_ms
    cfg = TimingConfig.quick()
    torch.manual_seed(0)
    dev = "cuda"
    bf = torch.bfloat16
    out = {}
    print("warpforge from", wf.__file__)
    only = [x for x in os.environ.get("AB_ONLY", "").split(",") if x]

    def T(name, fn, nbytes=None):
        if only and not any(name.startswith(o) for o in only):
            return
        fn()
        torch.cuda.synchronize()
        out[name] = device_ms(fn, cfg, nbytes)

    x = torch.randn(512, 262144, device=dev, dtype=bf)
    T("sum 512x262144", lambda: wf.sum(x), x.numel() * 2)
    T("amax 512x262144", lambda: wf.amax(x), x.numel() * 2)
    xg = x.clone().requires_grad_()
    g = torch.ones(512, device=dev, dtype=bf)
    def amax_fb():
        y = wf.amax(xg); torch.autograd.grad(y, xg, g)
    T("amax f+b 512x262144", amax_fb, x.numel() * 6)
    x2 = torch.randn(64, 2**21, device=dev, dtype=bf)
    T("sum 64x2M", lambda: wf.sum(x2), x2.numel() * 2)
    del x, xg, x2

    a = torch.randn(1024, 256, 128, device=dev, dtype=bf); b = torch.randn(1024, 128, 256, device=dev, dtype=bf)
    for v in ("pipelined", "grouped", "auto"):
        T(f"bmm 1024x256x128x256 {v}", lambda v=v: wf.matmul(a, b, variant=v))
    a = torch.randn(256, 65536, device=dev, dtype=bf); b = torch.randn(65536, 256, device=dev, dtype=bf)
    for v in ("splitk", "auto"):
        T(f"mm 256x65536x256 {v}", lambda v=v: wf.matmul(a, b, variant=v))
    del a, b

    B, H, S, D = 2, 16, 2048, 128
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=bf, requires_grad=True) for _ in range(3))
    mask = torch.rand(S, S, device=dev) > 0.3
    do = torch.randn(B, H, S, D, device=dev, dtype=bf)
    T("sdpa mask fwd", lambda: wf.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    def mask_fb():
        o = wf.scaled_dot_product_attention(q, k, v, attn_mask=mask); torch.autograd.grad(o, (q, k, v), do)
    T("sdpa mask f+b", mask_fb)
    q2, k2, v2 = (torch.randn(B, H, S, 256, device=dev, dtype=bf) for _ in range(3))
    T("sdpa D256 causal fwd", lambda: wf.scaled_dot_product_attention(q2, k2, v2, is_causal=True))
    del q2, k2, v2
    lens = [3000, 17, 1000, 4097, 2048, 1, 2500, 3721]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
    tot = sum(lens)
    qv, kv, vv = (torch.randn(tot, 16, 128, device=dev, dtype=bf, requires_grad=True) for _ in range(3))
    dov = torch.randn(tot, 16, 128, device=dev, dtype=bf)
    for name, kw in (("varlen causal", dict(causal=True)), ("varlen window256", dict(causal=True, window_size=(256, 0)))):
        T(name + " fwd", lambda kw=kw: wf.attention_varlen(qv, kv, vv, cu, cu, max(lens), max(lens), validate=False, **kw))
        def fb(kw=kw):
            o = wf.attention_varlen(qv, kv, vv, cu, cu, max(lens), max(lens), validate=False, **kw)
            torch.autograd.grad(o, (qv, kv, vv), dov)
        T(name + " f+b", fb)
    del qv, kv, vv

    logits = torch.randn(8192, 128256, device=dev, dtype=bf, requires_grad=True)
    tgt = torch.randint(0, 128256, (8192,), device=dev)
    def ce_fb():
        l = wf.cross_entropy(logits, tgt) * 3.0; torch.autograd.grad(l, logits)
    T("ce f+b g=3 8192x128256", ce_fb, logits.numel() * 4)

    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if "--table" in sys.argv:
        table(sys.argv[sys.argv.index("--table") + 1:])
    else:
        main()
