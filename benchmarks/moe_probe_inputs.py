"""The MoE probes' shapes and inputs, and their CUDA-graph latency timer (imported by
benchmarks/probe_moe*.py; not a probe itself)."""
import time

import torch

SHAPES = {"dsv2": (2048, 1408, 64, 6), "qwen3": (2048, 768, 128, 8), "mixtral": (4096, 14336, 8, 2),
          "olmoe": (2048, 1024, 64, 8)}   # (d, n, E, k): DeepSeek-V2-Lite, Qwen3-30B-A3B, Mixtral, OLMoE


def make(T, d, n, E, k, seed=0, dev="cuda", dtype=torch.bfloat16):
    """x (T, d), w_gate_up (E, 2n, d), w_down (E, d, n), routing weights (T, k) fp32 and ids (T, k)
    int32: k distinct experts uniformly at random, from one seeded generator on the device."""
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(T, d, device=dev, dtype=dtype, generator=g)
    w1 = (torch.randn(E, 2 * n, d, device=dev, generator=g) * d ** -0.5).to(dtype)
    w2 = (torch.randn(E, d, n, device=dev, generator=g) * n ** -0.5).to(dtype)
    ids = torch.rand(T, E, device=dev, generator=g).topk(k, -1).indices.int()
    wts = torch.softmax(torch.randn(T, k, device=dev, generator=g), -1)
    return x, w1, w2, wts, ids


def graph_us(fn, reps=200):
    """Latency of ``fn`` as a serving loop sees it: captured once in a CUDA graph (after warm-up
    calls on a side stream), replayed ``reps`` times back to back, microseconds a replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def routed_cases(cases: str, routings: str):
    """Each ``shape:T`` of ``cases`` (comma-separated; SHAPES' names) under each routing of
    ``routings`` (comma-separated; make_moe_routing's names): yields (shape, T, routing, x, w1, w2,
    routing weights, ids), the routing moved to the device; one set of inputs a case."""
    from warpforge.bench.workloads import make_moe_routing

    for case in cases.split(","):
        shape, T = case.split(":")
        T = int(T)
        d, n, E, k = SHAPES[shape]
        x, w1, w2, _, _ = make(T, d, n, E, k)
        for r in routings.split(","):
            ids, wts = make_moe_routing(T, E, k, r)
            yield shape, T, r, x, w1, w2, wts.cuda(), ids.cuda()
