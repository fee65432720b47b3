"""GPU check that a planned problem's relaunch path (runtime/launch.py) gives the same bits as its
first, JIT-launched call, for every kernel family and an fp8 and epilogue case."""
import torch

import warpforge as wf

torch.manual_seed(0)
bad = 0
for m, n, k in [(16, 4096, 4096), (128, 4096, 14336), (300, 520, 1000), (4096, 4096, 4096), (7, 33, 4097)]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    for v in ("auto", "splitk", "persistent", "grouped"):
        first = [wf.matmul(a, w.T, variant=v), wf.linear(a, w, b, "gelu_tanh", r, variant=v)]
        again = [wf.matmul(a.clone(), w.T.clone().T.T, variant=v), wf.linear(a, w, b, "gelu_tanh", r, variant=v)]
        for x, y in zip(first, again):
            if not torch.equal(x, y):
                bad += 1
                print("MISMATCH", m, n, k, v)
        ref = (a.double() @ w.double().T)
        err = ((first[0].double() - ref).norm() / ref.norm()).item()
        if err > 1e-2:
            bad += 1
            print("WRONG", m, n, k, v, err)
qa, sa = wf.quantize_fp8(torch.randn(256, 512, device="cuda"))
qw, sw = wf.quantize_fp8(torch.randn(384, 512, device="cuda"))
y1 = wf.scaled_matmul(qa, qw.T, sa, sw)
y2 = wf.scaled_matmul(qa, qw.T, sa, sw)
bad += not torch.equal(y1, y2)
print("fast-path check:", "ok" if not bad else f"{bad} failures")
