import sys, torch, warpforge.cuda as wcuda
wcuda.load()
ops = torch.ops.warpforge_cuda
c = [int(v) for v in sys.argv[1].split(",")]
rms = sys.argv[2] == "rms"
n = c[0] * c[1] * c[2] * 8
m = 2**27 // n
x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16); dy = torch.randn_like(x)
w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
mean = x.float().mean(-1); rstd = torch.ones(m, device="cuda")
parts = 132 // c[0]
dx = torch.empty_like(x); dwp = torch.empty(parts, n, device="cuda"); dbp = None if rms else torch.empty(parts, n, device="cuda")
for _ in range(2):
    ops.norm_bwd(x, dy, w, None if rms else mean, rstd, 0.0, rms, c, dx, dwp, dbp)
torch.cuda.synchronize()
