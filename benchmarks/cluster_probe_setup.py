"""The set-up the CUDA cluster-norm probes share (benchmarks/probe_ln_cluster.py,
probe_norm_bwd_cluster.py; not a probe itself): the CUDA backend built or loaded (and how long that
took), and the copy ceiling and the quick timing config they report against."""
import time

import torch

import warpforge.cuda as wcuda
from warpforge.bench import timing
from warpforge.runtime import device as dev


def setup():
    """(torch.ops.warpforge_cuda, copy GB/s, timing config), printing the build time and the device."""
    t0 = time.time()
    wcuda.load()
    print(f"CUDA backend built/loaded in {time.time() - t0:.1f} s", flush=True)
    copy = dev.ceilings()["copy_gbps"]
    print(torch.cuda.get_device_name(), "copy GB/s", copy, flush=True)
    return torch.ops.warpforge_cuda, copy, timing.TimingConfig.quick()
