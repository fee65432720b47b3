import torch, triton.testing as tt, warpforge as wf
from warpforge.ops import rope as R
B,Hq,Hk,S,D=4,32,8,4096,128
q=torch.randn(B,Hq,S,D,device="cuda",dtype=torch.bfloat16); k=torch.randn(B,Hk,S,D,device="cuda",dtype=torch.bfloat16)
ang=torch.arange(S,device="cuda")[:,None]*(1e-4**(torch.arange(0,D,2,device="cuda")/D)); emb=torch.cat([ang,ang],-1)
nb=2*(q.numel()+k.numel())*2
ms=lambda f: tt.do_bench(f,warmup=10,rep=60,return_mode="median")
for tdt in (torch.float32, torch.bfloat16):
    cos,sin=emb.cos().to(tdt),emb.sin().to(tdt)
    f=ms(lambda: R._rope_launch(q,k,cos,sin,None,0,False,backward=False))
    b=ms(lambda: R._rope_launch(q,k,cos,sin,None,0,False,backward=True))
    qg,kg=q.clone().requires_grad_(),k.clone().requires_grad_()
    out=wf.apply_rope(qg,kg,cos,sin); dys=[torch.randn_like(o) for o in out]
    ab=ms(lambda: torch.autograd.grad(out,[qg,kg],dys,retain_graph=True))
    print(tdt, "kernel fwd %.0f bwd %.0f GB/s; autograd bwd %.0f GB/s" % (nb/f/1e6, nb/b/1e6, nb/ab/1e6), flush=True)
