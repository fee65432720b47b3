"""``warpforge.nn.MoE``: a DeepSeek-style Mixture-of-Experts feed-forward layer (router, routed SwiGLU
experts, shared experts) over the fused kernels of ops/moe_routing.py and ops/moe.py."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..ops.moe import MAX_EXPERTS, moe_experts
from ..ops.moe_routing import MAX_EXPERTS as MAX_ROUTED, _check_args, check_rate, moe_route, moe_update_bias_
from ..runtime.checks import check_tensor
from ._buffers import apply_keeping_dtype


class MoE(nn.Module):
    """y = sum over the top_k routed experts of w_e * SwiGLU_e(x) + sum over the shared experts of SwiGLU_s(x).

    Parameters: ``router`` (n_experts, d_model); ``w_gate_up`` (n_experts + n_shared, 2 * expert_dim,
    d_model) and ``w_down`` (n_experts + n_shared, d_model, expert_dim), the routed experts first
    and then the shared ones. Shared experts ride in the same grouped GEMMs as routed ones: every
    token is also routed to each of them with weight 1 (a DeepSeek shared expert of width
    n_shared * expert_dim is exactly n_shared experts of width expert_dim summed).

    Routing (see ``warpforge.ops.moe_routing.moe_route``): ``score`` "softmax" or "sigmoid",
    group-limited routing with ``n_group`` / ``topk_group`` (``group_score`` "max" or "top2"),
    ``renormalize`` the chosen weights, ``routed_scaling_factor``. Load balancing: ``aux_loss_coef``
    > 0 makes ``self.aux_loss`` the auxiliary loss of the last forward (add it to the training
    loss); ``bias_update_rate`` > 0 turns on auxiliary-loss-free balancing (DeepSeek-V3): a
    ``correction_bias`` buffer steers the choice and is nudged after every training forward.
    ``self.counts`` holds the last forward's tokens per routed expert, for monitoring. Under
    ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) both live in the graph's memory and the
    next call overwrites them: use or ``clone()`` them before the next forward.
    """

    def __init__(self, d_model: int, expert_dim: int, n_experts: int, top_k: int, n_shared: int = 0,
                 score: str = "softmax", n_group: int = 1, topk_group: int = 1, *, group_score: str | None = None,
                 renormalize: bool = True, routed_scaling_factor: float = 1.0, aux_loss_coef: float = 0.0,
                 bias_update_rate: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        for name, v in (("d_model", d_model), ("expert_dim", expert_dim), ("n_experts", n_experts), ("top_k", top_k)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"warpforge: MoE '{name}' = {v!r}; expected a positive int")
        if top_k > n_experts:
            raise ValueError(f"warpforge: MoE 'top_k' = {top_k} > n_experts = {n_experts}; expected top_k <= n_experts")
        if not isinstance(n_group, int) or n_group < 1 or n_experts % n_group:
            raise ValueError(f"warpforge: MoE n_experts = {n_experts} is not divisible by 'n_group' = {n_group!r}")
        if not isinstance(n_shared, int) or n_shared < 0:
            raise ValueError(f"warpforge: MoE 'n_shared' = {n_shared!r}; expected an int >= 0")
        if n_experts > MAX_ROUTED or n_experts + n_shared > MAX_EXPERTS:
            raise ValueError(f"warpforge: MoE has {n_experts} routed + {n_shared} shared experts; expected at most "
                             f"{MAX_ROUTED} routed and {MAX_EXPERTS} in all")
        # the routing options (score, topk_group, group_score, ...), checked here rather than at the first forward
        _check_args(torch.empty(0, n_experts, device="meta"), top_k, score, n_group, topk_group, group_score,
                    renormalize, routed_scaling_factor, None, aux_loss_coef)
        check_rate("bias_update_rate", bias_update_rate)
        self.d_model, self.expert_dim, self.n_experts, self.top_k, self.n_shared = d_model, expert_dim, n_experts, top_k, n_shared
        self.route_args = dict(score=score, n_group=n_group, topk_group=topk_group, group_score=group_score,
                               renormalize=renormalize, routed_scaling_factor=routed_scaling_factor,
                               aux_loss_coef=aux_loss_coef)
        self.bias_update_rate = bias_update_rate
        kw = dict(device=device, dtype=dtype)
        total = n_experts + n_shared
        self.router = nn.Parameter(torch.empty(n_experts, d_model, **kw))
        self.w_gate_up = nn.Parameter(torch.empty(total, 2 * expert_dim, d_model, **kw))
        self.w_down = nn.Parameter(torch.empty(total, d_model, expert_dim, **kw))
        if bias_update_rate > 0 or score == "sigmoid":
            self.register_buffer("correction_bias", torch.zeros(n_experts, device=device, dtype=torch.float32))
        else:
            self.correction_bias = None
        self.aux_loss: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.reset_parameters()

    def _apply(self, fn, recurse=True):
        # the correction bias stays float32 through module casts: moe_route takes it in float32
        # only, and its updates (~1e-3 a step) would vanish in bf16
        return apply_keeping_dtype(self, fn, recurse, ("correction_bias",))

    def reset_parameters(self) -> None:
        # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for each projection
        for w, fan_in in ((self.router, self.d_model), (self.w_gate_up, self.d_model), (self.w_down, self.expert_dim)):
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(w, -bound, bound)
        if self.correction_bias is not None:
            self.correction_bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"warpforge: MoE input has last dim {x.shape[-1]}; expected d_model = {self.d_model}")
        x2 = x.reshape(-1, self.d_model)
        logits = torch.nn.functional.linear(x2, self.router.to(x2.dtype))
        r = moe_route(logits, self.top_k, correction_bias=self.correction_bias, **self.route_args)
        self.aux_loss, self.counts = r.aux_loss, r.counts
        ids, weights = r.ids, r.weights
        if self.n_shared:
            T = x2.shape[0]
            shared = torch.arange(self.n_experts, self.n_experts + self.n_shared, device=x.device, dtype=ids.dtype)
            ids = torch.cat([ids, shared.expand(T, self.n_shared)], dim=1)
            weights = torch.cat([weights, weights.new_ones(T, self.n_shared)], dim=1)
        out = moe_experts(x2, self.w_gate_up, self.w_down, weights, ids, validate=False)
        if self.training and self.bias_update_rate > 0:
            moe_update_bias_(self.correction_bias, r.counts, self.bias_update_rate)
        return out.reshape(x.shape)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, expert_dim={self.expert_dim}, n_experts={self.n_experts}, top_k={self.top_k}, "
                f"n_shared={self.n_shared}, " + ", ".join(f"{k}={v}" for k, v in self.route_args.items()))
