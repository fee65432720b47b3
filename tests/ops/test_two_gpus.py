"""The Triton operators on a second GPU after the first, with the same shapes, then on the first
again, while the current device stays cuda:0. A compiled kernel is loaded per device, so every
cached launch (runtime/launch.py's plans, the decode plans, the eager fast path) must be keyed by
the tensors' device and run on that device's stream. Each result against float64."""
import pytest
import torch
import torch.nn.functional as F

import warpforge as wf
from conftest import ON_GPU, assert_close

two_gpus = pytest.mark.skipif(not ON_GPU or torch.cuda.device_count() < 2,
                              reason="needs two CUDA GPUs")
DEVICES = ("cuda:0", "cuda:1", "cuda:0", "cuda:1")


def _rand(*shape, device, dtype=torch.bfloat16, gen=None):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


@two_gpus
def test_row_ops_and_matmul_on_two_devices():
    gen = torch.Generator().manual_seed(0)
    for dev in DEVICES:
        x = _rand(64, 4096, device=dev, gen=gen)
        w = _rand(4096, device=dev, gen=gen)
        xd, wd = x.double(), w.double()
        assert_close(wf.softmax(x, -1), torch.softmax(xd, -1), torch.bfloat16, what=f"softmax {dev}")
        assert_close(wf.rms_norm(x, (4096,), w, 1e-6), F.rms_norm(xd, (4096,), wd, 1e-6), torch.bfloat16,
                     what=f"rms_norm {dev}")
        assert_close(wf.layer_norm(x, (4096,), w, w), F.layer_norm(xd, (4096,), wd, wd), torch.bfloat16,
                     what=f"layer_norm {dev}")
        xg, xr = x.clone().requires_grad_(), xd.clone().requires_grad_()
        dy = _rand(64, 4096, device=dev, gen=gen)
        wf.layer_norm(xg, (4096,), w, w).backward(dy)
        F.layer_norm(xr, (4096,), wd, wd).backward(dy.double())
        assert_close(xg.grad, xr.grad, torch.bfloat16, scale=2.0, what=f"layer_norm dx {dev}")
        a, b = _rand(256, 512, device=dev, gen=gen), _rand(512, 384, device=dev, gen=gen)
        assert_close(wf.matmul(a, b), a.double() @ b.double(), torch.bfloat16, what=f"matmul {dev}")
        torch.cuda.synchronize(dev)


@two_gpus
@pytest.mark.parametrize("bsz", [1, 17])
def test_decode_and_attention_on_two_devices(bsz):
    from warpforge.ops.decode_attention import decode_attention_reference
    gen = torch.Generator().manual_seed(1)
    hq, hkv, d, page, mb = 32, 8, 128, 16, 64
    for dev in DEVICES:
        nb = bsz * mb
        kc, vc = _rand(nb, page, hkv, d, device=dev, gen=gen), _rand(nb, page, hkv, d, device=dev, gen=gen)
        bt = torch.randperm(nb, generator=gen).view(bsz, mb).to(device=dev, dtype=torch.int32)
        lens = torch.full((bsz,), mb * page, dtype=torch.int32, device=dev)
        q = _rand(bsz, hq, d, device=dev, gen=gen)
        ref = decode_attention_reference(q.double().cpu(), kc.double().cpu(), vc.double().cpu(), bt.cpu(), lens.cpu())
        for _ in range(2):                  # the second call of a shape replays its plan
            out = wf.decode_attention(q, kc, vc, bt, lens, validate=False)
            assert_close(out, ref, torch.bfloat16, what=f"decode {dev}")
        qa, ka, va = (_rand(1, 4, 300, 64, device=dev, gen=gen) for _ in range(3))
        want = F.scaled_dot_product_attention(qa.double(), ka.double(), va.double(), is_causal=True)
        assert_close(wf.scaled_dot_product_attention(qa, ka, va, is_causal=True), want, torch.bfloat16,
                     what=f"attention {dev}")
        torch.cuda.synchronize(dev)
