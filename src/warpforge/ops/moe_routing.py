"""Mixture-of-experts routing (DeepSeek-style): pick top_k of E experts for every token, with their
gate weights, the per-expert token counts and, optionally, the load-balancing auxiliary loss.

For a token with router logits x (E,):

    s = softmax(x)  or  sigmoid(x)                         the scores; the weights come from these
    b = s + correction_bias                                the choice scores (bias: DeepSeek-V3's
                                                           e_score_correction_bias; default 0)
    group-limited routing (n_group > 1): experts form n_group contiguous groups of E / n_group;
        group score = max(b over the group)                (group_score "max", DeepSeek-V2)
                    | sum of the group's top-2 b           (group_score "top2", DeepSeek-V3)
        keep the topk_group best groups; experts outside them cannot be chosen
    ids = the top_k experts by b among those allowed       (ties: the lowest expert index first)
    w   = s[ids];  w /= sum(w) + 1e-20 if renormalize;  w *= routed_scaling_factor
    counts[e] = #(token, slot) pairs routed to e
    aux_loss  = coef * E * sum_e f_e * P_e,  f_e = counts[e] / (T * top_k) (no gradient),
                P_e = mean over tokens of softmax(x)_e (sigmoid: s_e / sum(s))

The bias moves the *choice* only; the weights are the unbiased scores (so a bias update balances
the load without changing what a chosen expert's output is worth). ``moe_update_bias_`` is
DeepSeek-V3's auxiliary-loss-free balancing step: bias += rate * sign(mean(counts) - counts).

Tie rule. Equal choice scores (exactly equal logits; bf16 logits collide often: 8 bits of mantissa)
go to the lowest expert index, and equal group scores to the lowest group index. torch.topk
promises no order among ties, so the reference implements the rule with stable sorts and the
kernel with a min over the indices of the maximum; ids then agree exactly.

Byte model (s = bytes per logit): read the logits once, T * E * s, and write the weights and ids,
T * k * 8 bytes, plus E * 4 bytes of counts. DeepSeek-V3 (E = 256, k = 8) at T = 4096 tokens in
bf16: 2.1 MB read, 0.26 MB written, ~0.8 us at an H100's ~3 TB/s. FLOP model: each of the k
selection rounds costs ~8 elementwise operations (or reduction steps) on every (token, expert),
and the scores and group scores ~15 more: ~80 operations a logit at k = 8, 40 per byte in bf16,
twice the fp32 CUDA-core ridge (~67 TFLOP/s / 3.35 TB/s ~ 20). So at large T the bound is
instruction issue, not bandwidth (1 M logits * 80 ~ 84 MFLOP ~ 1.3 us at the fp32 peak), and at
the usual T (decode: 1-256 tokens) the kernel is a few microseconds of launch latency whatever
it does. Hence the design goal: ONE launch, no host sync and no (T, E) intermediate in memory (a
torch eager router makes ~12 launches and writes the scores, the biased scores, the group scores
and masks and a top-k: ~6 * T * E * 4 bytes).

Why the kernel looks the way it does:
- One program owns BLOCK_T tokens and holds their whole (BLOCK_T, E) logits tile in registers
  (BLOCK_T * E_pad <= 8192 values: 32 tokens at E = 256, 8 at E = 1024): read once, everything else
  is register work.
- The tile is laid out 3-D, (BLOCK_T, n_group, group_size), each axis padded to a power of two and
  masked, so a group score is one reduction over the last axis whatever n_group is (no loop over
  groups, no power-of-two group size: E = 60 in 4 groups of 15 is a (BLOCK_T, 4, 16) tile). When
  no group is dropped (n_group == 1 or topk_group == n_group) the launcher uses one group of E.
- Top-k is k rounds of (max, lowest index holding the max, knock it out): k is small (1-8 in the
  models that use this), and a round is a few register passes over the tile; a sort of E values
  per token would be log2(E)^2 / 2 ~ 32 passes at E = 256.
- Without a correction bias the chosen weight IS the round's maximum; with one, it is gathered from
  the unbiased scores in the same pass (two extra operations a round).
- Counts: each program sums its chosen (token, expert) flags down the token axis and issues one
  integer atomic per expert it routed to (at most BLOCK_T * k of them), not one per (token, slot):
  integer atomics are exact, so counts are deterministic.
- Scores in fp32 whatever the logits' dtype; weights out in fp32 (they scale expert outputs and
  are differentiated); ids int32.
- Gradient: only the weights carry one (ids and counts are integers). Backward is a few torch ops
  on (T, E): d w / d s restricted to the chosen experts (including the renormalisation and
  scale), scattered into a dense (T, E) and pushed through the softmax Jacobian (all E logits) or
  the sigmoid's (the chosen ones only). That is ~8 fp32 passes over (T, E), ~10x the forward's
  bytes at bf16 (0.1 ms-scale at DeepSeek-V3 sizes, estimated, not measured); a fused backward
  kernel (read logits, write d logits) is the follow-up if training profiles show it.

Limits: E <= 1024 (one program holds BLOCK_T x n_group_pad x group_pad values: at most 4096 padded
experts, BLOCK_T >= 2); any n_group dividing E, any group size, 1 <= topk_group <= n_group (the
group stage is unrolled topk_group times: keep it small, as models do: 4 of 8 in DeepSeek-V3).
A NaN choice score ranks above every number, as in torch.topk: a token with NaN logits (softmax:
its whole row) or a NaN bias gets those experts first, lowest id first, with NaN weights, and its
top_k ids stay distinct (one expert never gets a token twice).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..runtime import new_empty, unit_last_dim
from ..runtime.checks import check_device, check_same, check_tensor, is_finite
from ..runtime.heuristics import warps_for
from ..runtime.launch import LaunchCache
from ..runtime.registry import Op

MAX_EXPERTS = 1024
TILE_ELEMS = 8192          # (BLOCK_T x padded experts) values a program holds: 32 KB of fp32 registers
MAX_BLOCK_T = 32
SCORES = ("softmax", "sigmoid")
GROUP_SCORES = ("max", "top2")
RENORM_EPS = 1e-20


class MoERouting(NamedTuple):
    weights: torch.Tensor               # (T, k) float32, differentiable w.r.t. logits
    ids: torch.Tensor                   # (T, k) int32 expert indices
    counts: torch.Tensor                # (E,) int32 (token, slot) pairs routed to each expert
    aux_loss: torch.Tensor | None       # scalar float32 when aux_loss_coef > 0, else None


# ----------------------------------------------------------------------------------------------
# Argument checks (shared by the public function and the reference)
# ----------------------------------------------------------------------------------------------
class _Config(NamedTuple):
    top_k: int
    sigmoid: bool
    n_group: int
    topk_group: int
    top2: bool
    renormalize: bool
    scale: float
    coef: float


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_args(logits, top_k, score, n_group, topk_group, group_score, renormalize, routed_scaling_factor,
                correction_bias, aux_loss_coef, *, reference: bool = False) -> _Config:
    """Every argument, before any kernel: a ValueError/TypeError naming the argument and what was
    expected. The reference also accepts float64 logits/bias, on any device."""
    dtypes = (torch.float32, torch.float16, torch.bfloat16) + ((torch.float64,) if reference else ())
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"warpforge: 'logits' must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point() or logits.dtype not in dtypes:
        raise TypeError(f"warpforge: 'logits' has dtype {_dt(logits.dtype)}; expected a floating tensor "
                        f"({', '.join(_dt(d) for d in dtypes)})")
    if logits.dim() != 2:
        raise ValueError(f"warpforge: 'logits' must be 2-d (T, n_experts), got shape {tuple(logits.shape)}")
    n_experts = logits.shape[1]
    if n_experts == 0:
        raise ValueError("warpforge: 'logits' has 0 experts (dim 1); expected at least 1")
    if n_experts > MAX_EXPERTS:
        raise ValueError(f"warpforge: 'logits' has {n_experts} experts (dim 1); moe_route supports at most "
                         f"{MAX_EXPERTS} (one program holds a token's whole row of expert scores)")
    if not reference:
        check_tensor("logits", logits, dtypes=dtypes, min_dim=2)       # the device
    if not _is_int(top_k):
        raise TypeError(f"warpforge: 'top_k' must be an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"warpforge: 'top_k' is {top_k}; expected 1 <= top_k <= n_experts ({n_experts})")
    if score not in SCORES:
        raise ValueError(f"warpforge: 'score' is {score!r}; expected one of {', '.join(map(repr, SCORES))}")
    for name, v in (("n_group", n_group), ("topk_group", topk_group)):
        if not _is_int(v):
            raise TypeError(f"warpforge: '{name}' must be an int, got {type(v).__name__}")
    if n_group < 1 or n_experts % n_group:
        raise ValueError(f"warpforge: 'n_group' is {n_group}; expected a positive divisor of n_experts ({n_experts})")
    if not 1 <= topk_group <= n_group:
        raise ValueError(f"warpforge: 'topk_group' is {topk_group}; expected 1 <= topk_group <= n_group ({n_group})")
    group_size = n_experts // n_group
    if top_k > topk_group * group_size:
        raise ValueError(f"warpforge: 'top_k' is {top_k} but only topk_group * (n_experts / n_group) = "
                         f"{topk_group} * {group_size} = {topk_group * group_size} experts remain after group "
                         f"selection; expected top_k <= {topk_group * group_size}")
    if group_score is not None and group_score not in GROUP_SCORES:
        raise ValueError(f"warpforge: 'group_score' is {group_score!r}; expected None, "
                         f"{', '.join(map(repr, GROUP_SCORES))}")
    if not isinstance(renormalize, bool):
        raise TypeError(f"warpforge: 'renormalize' must be a bool, got {type(renormalize).__name__}")
    if not _is_number(routed_scaling_factor) or not is_finite(routed_scaling_factor):
        raise ValueError(f"warpforge: 'routed_scaling_factor' is {routed_scaling_factor!r}; expected a finite number")
    if not _is_number(aux_loss_coef) or not (is_finite(aux_loss_coef) and aux_loss_coef >= 0):
        raise ValueError(f"warpforge: 'aux_loss_coef' is {aux_loss_coef!r}; expected a finite number >= 0")
    if correction_bias is not None:
        bias_dtypes = (torch.float32, torch.float64) if reference else (torch.float32,)
        if not isinstance(correction_bias, torch.Tensor):
            raise TypeError(f"warpforge: 'correction_bias' must be a torch.Tensor or None, "
                            f"got {type(correction_bias).__name__}")
        if correction_bias.dtype not in bias_dtypes:
            raise TypeError(f"warpforge: 'correction_bias' has dtype {_dt(correction_bias.dtype)}; expected "
                            f"{' or '.join(_dt(d) for d in bias_dtypes)}")
        if correction_bias.shape != (n_experts,):
            raise ValueError(f"warpforge: 'correction_bias' has shape {tuple(correction_bias.shape)}; expected "
                             f"({n_experts},) (one bias per expert, n_experts of 'logits')")
        if not reference:
            check_device("correction_bias", correction_bias)
        check_same("correction_bias", correction_bias, "logits", logits, shape=False, dtype=False)
    if group_score is None:
        group_score = "top2" if (correction_bias is not None or score == "sigmoid") else "max"
    return _Config(top_k, score == "sigmoid", n_group, topk_group, group_score == "top2", renormalize,
                   float(routed_scaling_factor), float(aux_loss_coef))


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------
def _stable_topk_desc(v: torch.Tensor, k: int, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the k largest entries of each row of v, ties to the lowest index (two stable
    sorts: by value, then allowed entries first)."""
    order = torch.sort(v, dim=-1, descending=True, stable=True).indices
    if allowed is not None:
        first = torch.sort(allowed.gather(-1, order).to(torch.int8), dim=-1, descending=True, stable=True).indices
        order = order.gather(-1, first)
    return order[:, :k]


def moe_route_reference(logits: torch.Tensor, top_k: int, *, score: str = "softmax", n_group: int = 1,
                        topk_group: int = 1, group_score: str | None = None, renormalize: bool = False,
                        routed_scaling_factor: float = 1.0, correction_bias: torch.Tensor | None = None,
                        aux_loss_coef: float = 0.0) -> MoERouting:
    """Ground truth in plain PyTorch: float32, or float64 for float64 logits (weights and aux_loss
    come back in that dtype); differentiable w.r.t. logits through autograd."""
    cfg = _check_args(logits, top_k, score, n_group, topk_group, group_score, renormalize, routed_scaling_factor,
                      correction_bias, aux_loss_coef, reference=True)
    wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(wide)                                                       # (T, E)
    t, e = x.shape
    s = torch.sigmoid(x) if cfg.sigmoid else torch.softmax(x, dim=-1)        # (T, E) unbiased scores
    b = s.detach() if correction_bias is None else s.detach() + correction_bias.to(wide)   # choice scores
    allowed = None
    if cfg.n_group > 1 and cfg.topk_group < cfg.n_group:
        gsize = e // cfg.n_group
        bg = b.view(t, cfg.n_group, gsize)                                   # (T, G, E/G)
        gs = bg.topk(min(2, gsize), dim=-1).values.sum(-1) if cfg.top2 else bg.amax(-1)   # (T, G)
        keep = _stable_topk_desc(gs, cfg.topk_group)                         # (T, topk_group)
        gmask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, keep, True)
        allowed = gmask.repeat_interleave(gsize, dim=1)                      # (T, E)
    ids = _stable_topk_desc(b, cfg.top_k, allowed)                           # (T, k) int64
    w = s.gather(1, ids)                                                     # (T, k)
    if cfg.renormalize:
        w = w / (w.sum(-1, keepdim=True) + RENORM_EPS)
    w = w * cfg.scale
    counts = torch.bincount(ids.flatten(), minlength=e).to(torch.int32)
    aux = None
    if cfg.coef > 0:
        if t == 0:
            aux = x.sum() * 0.0
        else:
            # f from the one-hot of the choices (not from counts: the public path uses counts)
            f = torch.nn.functional.one_hot(ids, e).to(wide).sum((0, 1)) / (t * cfg.top_k)
            p = s / s.sum(-1, keepdim=True) if cfg.sigmoid else s
            aux = cfg.coef * e * (f * p.mean(0)).sum()
    return MoERouting(w, ids.to(torch.int32), counts, aux)


# ----------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------
@triton.jit
def _moe_route_fwd_kernel(
    logits_ptr,                # (T, E) router logits, expert dim unit-stride
    bias_ptr,                  # (E,) fp32 correction bias (read when HAS_BIAS)
    w_ptr,                     # (T, TOP_K) fp32 weights out
    ids_ptr,                   # (T, TOP_K) int32 expert ids out
    counts_ptr,                # (E,) int32 counts, zeroed by the launcher, atomically accumulated
    T, stride_t,               # tokens, logits row stride in elements
    scale,                     # routed_scaling_factor
    N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr,       # experts are e = g * GROUP_SIZE + j
    G_PAD: tl.constexpr, J_PAD: tl.constexpr,              # powers of two >= N_GROUP, GROUP_SIZE
    TOPK_GROUP: tl.constexpr, GROUPED: tl.constexpr,       # GROUPED: some groups are dropped
    TOP_K: tl.constexpr, K_PAD: tl.constexpr,
    SIGMOID: tl.constexpr, TOP2: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)             # (BLOCK_T,)
    row_ok = rows < T
    g = tl.arange(0, G_PAD)
    j = tl.arange(0, J_PAD)
    eid = (g[:, None] * GROUP_SIZE + j[None, :])[None, :, :]              # (1, G_PAD, J_PAD) expert id
    valid = ((g[:, None] < N_GROUP) & (j[None, :] < GROUP_SIZE))[None, :, :]
    r3 = rows.to(tl.int64)[:, None, None]
    ok3 = row_ok[:, None, None]
    x = tl.load(logits_ptr + r3 * stride_t + eid, mask=valid & ok3, other=0.0).to(tl.float32)
    x = tl.where(valid, x, -float("inf"))                                 # (BLOCK_T, G_PAD, J_PAD)

    # scores (padding -> 0) and choice scores (padding -> -inf)
    if SIGMOID:
        s = tl.sigmoid(x)
    else:
        mx = tl.max(tl.max(x, axis=2), axis=1)
        e = tl.exp(x - mx[:, None, None])
        s = e / tl.sum(tl.sum(e, axis=2), axis=1)[:, None, None]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + eid, mask=valid, other=0.0)
        b = tl.where(valid, s + bias, -float("inf"))
    else:
        b = tl.where(valid, s, -float("inf"))
    # a NaN choice score ranks above every number, as in torch.topk: NaN logits (softmax: the whole
    # row) or a NaN bias get chosen first, lowest id first, and keep a token's ids distinct
    b = tl.where(b != b, float("inf"), b)
    avail = valid & ok3                                                   # may still be chosen

    if GROUPED:
        # group scores (BLOCK_T, G_PAD): max, or the sum of the two largest (first max knocked out)
        m1 = tl.max(b, axis=2)
        if TOP2:                                                          # GROUP_SIZE >= 2
            first = tl.min(tl.where((b == m1[:, :, None]) & valid, j[None, None, :], J_PAD), axis=2)
            m2 = tl.max(tl.where(j[None, None, :] == first[:, :, None], -float("inf"), b), axis=2)
            gs = m1 + m2
        else:
            gs = m1
        gfree = (g < N_GROUP)[None, :] & row_ok[:, None]                  # (BLOCK_T, G_PAD)
        gkeep = (g[None, :] < 0) & row_ok[:, None]                       # all False
        for _ in tl.static_range(TOPK_GROUP):
            gm = tl.max(tl.where(gfree, gs, -float("inf")), axis=1)
            gi = tl.min(tl.where(gfree & (gs == gm[:, None]), g[None, :], G_PAD), axis=1)
            ghit = g[None, :] == gi[:, None]
            gkeep = gkeep | ghit
            gfree = gfree & ~ghit
        avail = avail & gkeep[:, :, None]
        b = tl.where(gkeep[:, :, None], b, -float("inf"))
    start = avail

    # top-k: k rounds of (max, lowest expert id holding it, knock it out)
    kk = tl.arange(0, K_PAD)[None, :]
    w_tile = tl.zeros((BLOCK_T, K_PAD), tl.float32)
    id_tile = tl.zeros((BLOCK_T, K_PAD), tl.int32)
    for r in range(TOP_K):
        m = tl.max(tl.max(b, axis=2), axis=1)                              # (BLOCK_T,)
        cand = avail & (b == m[:, None, None])
        idx = tl.min(tl.min(tl.where(cand, eid, G_PAD * J_PAD), axis=2), axis=1)   # (BLOCK_T,)
        idx = tl.minimum(idx, N_GROUP * GROUP_SIZE - 1)                    # rows past T: stay in range
        hit = eid == idx[:, None, None]
        # the chosen expert's (unbiased) score, not m: a NaN choice carries its NaN, not +inf
        w = tl.sum(tl.sum(tl.where(hit, s, 0.0), axis=2), axis=1)
        avail = avail & ~hit
        b = tl.where(hit, -float("inf"), b)
        w_tile = tl.where(kk == r, w[:, None], w_tile)
        id_tile = tl.where(kk == r, idx[:, None], id_tile)

    if RENORM:
        w_tile = w_tile / (tl.sum(w_tile, axis=1)[:, None] + 1e-20)
    w_tile = w_tile * scale
    out = rows.to(tl.int64)[:, None] * TOP_K + kk
    omask = row_ok[:, None] & (kk < TOP_K)
    tl.store(w_ptr + out, w_tile, mask=omask)
    tl.store(ids_ptr + out, id_tile, mask=omask)

    # counts: one atomic per expert this program routed to
    chosen = (start & ~avail).to(tl.int32)
    cnt = tl.sum(chosen, axis=0)                                           # (G_PAD, J_PAD)
    e2 = g[:, None] * GROUP_SIZE + j[None, :]
    tl.atomic_add(counts_ptr + e2, cnt, mask=(cnt > 0) & (g[:, None] < N_GROUP) & (j[None, :] < GROUP_SIZE),
                  sem="relaxed")                                           # a sum: no ordering needed


# ----------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------
_FWD = LaunchCache(_moe_route_fwd_kernel)


def _route_config(t: int, e: int, n_group: int, topk_group: int) -> tuple[int, int, int, int, int]:
    """(n_group, group_size, G_PAD, J_PAD, BLOCK_T) of the kernel's tile. When no group is dropped
    the tile is one group of E, which never pads more than the grouped layout (E = 40 in 8 groups
    of 5: 8 x 8 = 64 either way; E = 36 in 4 groups of 9: 4 x 16 = 64 grouped, 64 flat; E = 20 in
    4 of 5: 32 flat, 4 x 8 = 32) and skips the group stage. BLOCK_T shrinks to the token count
    (decode: T = 1 uses 2 lanes, not 32)."""
    if topk_group >= n_group:
        n_group = 1
    gsize = e // n_group
    g_pad, j_pad = triton.next_power_of_2(n_group), triton.next_power_of_2(gsize)
    block_t = max(2, min(MAX_BLOCK_T, TILE_ELEMS // (g_pad * j_pad), triton.next_power_of_2(max(t, 1))))
    return n_group, gsize, g_pad, j_pad, block_t


def _route_fwd(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, sigmoid: bool, n_group: int,
               topk_group: int, top2: bool, renormalize: bool, scale: float):
    t, e = logits.shape
    weights = new_empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    counts = torch.zeros((e,), dtype=torch.int32, device=logits.device)
    if t == 0:
        return weights, ids, counts
    logits = unit_last_dim(logits)
    if bias is not None:
        bias = unit_last_dim(bias)
    n_group, gsize, g_pad, j_pad, block_t = _route_config(t, e, n_group, topk_group)
    const = dict(N_GROUP=n_group, GROUP_SIZE=gsize, G_PAD=g_pad, J_PAD=j_pad,
                 TOPK_GROUP=topk_group, GROUPED=n_group > 1,
                 TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
                 SIGMOID=sigmoid, TOP2=top2 and gsize > 1,             # a group of one scores its expert
                 HAS_BIAS=bias is not None, RENORM=renormalize, BLOCK_T=block_t)
    args = (logits, logits if bias is None else bias, weights, ids, counts, t, logits.stride(0), scale)
    warps = warps_for(block_t * g_pad * j_pad)
    # routing runs for microseconds: launch the compiled kernel directly after the first call
    _FWD.specialized((triton.cdiv(t, block_t),), args, const, num_warps=warps, num_stages=1)
    return weights, ids, counts


# ----------------------------------------------------------------------------------------------
# PyTorch operator
# ----------------------------------------------------------------------------------------------
def _route_impl(logits: torch.Tensor, correction_bias: torch.Tensor | None, top_k: int, sigmoid: bool,
                n_group: int, topk_group: int, top2: bool, renormalize: bool,
                scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _route_fwd(logits, correction_bias, top_k, sigmoid, n_group, topk_group, top2, renormalize, scale)


def _route_fake(logits, correction_bias, top_k, sigmoid, n_group, topk_group, top2, renormalize, scale):
    t, e = logits.shape
    return (logits.new_empty((t, top_k), dtype=torch.float32), logits.new_empty((t, top_k), dtype=torch.int32),
            logits.new_empty((e,), dtype=torch.int32))


def _setup(ctx, inputs, output):
    logits, _bias, _k, sigmoid, _ng, _tg, _top2, renormalize, scale = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.args = (sigmoid, renormalize, scale)


def _backward(ctx, dw, _dids, _dcounts):
    """d logits from d weights. u = s[ids] (the chosen unbiased scores), w = c * u (/ (sum u + eps)):
    du_j = c * dw_j                                     (no renormalisation)
    du_j = c / S * (dw_j - sum_i dw_i u_i / S)          (S = sum u + eps)
    then ds = scatter(du) into (T, E) and dlogits = s * (ds - sum(s * ds)) (softmax: every logit
    moves every score) or ds * s * (1 - s) (sigmoid: the chosen logits only)."""
    logits, ids = ctx.saved_tensors
    sigmoid, renormalize, scale = ctx.args
    if dw is None:
        return (None,) * 9
    idx = ids.long()
    x = logits.float()
    s = torch.sigmoid(x) if sigmoid else torch.softmax(x, dim=-1)             # (T, E)
    dw = dw.float()
    if renormalize:
        u = s.gather(1, idx)                                                   # (T, k)
        total = u.sum(-1, keepdim=True) + RENORM_EPS
        du = (scale / total) * (dw - (dw * u).sum(-1, keepdim=True) / total)
    else:
        du = dw * scale
    ds = torch.zeros_like(s).scatter_add_(1, idx, du)                         # (T, E)
    if sigmoid:
        dx = ds * s * (1.0 - s)
    else:
        dx = s * (ds - (s * ds).sum(-1, keepdim=True))
    return dx.to(logits.dtype), None, None, None, None, None, None, None, None


moe_route_op = Op("moe_route", _route_impl, _route_fake, backward=_backward, setup_context=_setup)


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------
def _aux_loss(logits: torch.Tensor, counts: torch.Tensor, top_k: int, sigmoid: bool, coef: float) -> torch.Tensor:
    """coef * E * sum_e f_e * P_e in float32, differentiable through P (f is a constant)."""
    t, e = logits.shape
    x = logits.float()
    if t == 0:
        return x.sum() * 0.0                                                   # no tokens, no imbalance
    if sigmoid:
        s = torch.sigmoid(x)
        p = s / s.sum(-1, keepdim=True)
    else:
        p = torch.softmax(x, dim=-1)
    f = counts.float() / (t * top_k)                                           # (E,), no gradient
    return coef * e * (f * p.mean(0)).sum()


def moe_route(logits: torch.Tensor, top_k: int, *, score: str = "softmax", n_group: int = 1, topk_group: int = 1,
              group_score: str | None = None, renormalize: bool = False, routed_scaling_factor: float = 1.0,
              correction_bias: torch.Tensor | None = None, aux_loss_coef: float = 0.0) -> MoERouting:
    """Route each token to its top_k experts (DeepSeek-V2/V3 style), in one kernel launch.

    Args:
        logits: (T, E) router logits, fp32/fp16/bf16 (scores are computed in fp32), any row
            stride. E <= 1024. T = 0 gives empty weights/ids and zero counts.
        top_k: experts per token, 1 <= top_k <= E.
        score: "softmax" (over all E experts) or "sigmoid".
        n_group, topk_group: group-limited routing: the E experts form n_group contiguous groups
            (n_group must divide E; any group size); only experts in the topk_group best groups
            may be chosen (top_k <= topk_group * E / n_group).
        group_score: "max" (DeepSeek-V2) or "top2" (sum of the group's two best, DeepSeek-V3; a
            group of one expert scores that expert). None: "top2" when correction_bias is given
            or score is "sigmoid", else "max".
        renormalize: divide the k weights of a token by their sum (+ 1e-20).
        routed_scaling_factor: multiplies the weights (after renormalisation).
        correction_bias: (E,) float32 or None: added to the scores for choosing the groups and
            experts only; the weights are the unbiased scores (DeepSeek-V3).
        aux_loss_coef: > 0 returns the load-balancing loss coef * E * sum_e f_e * P_e.

    Ties (equal choice scores) go to the lowest expert index, equal group scores to the lowest
    group index. Returns MoERouting(weights (T, k) fp32 differentiable w.r.t. logits, ids (T, k)
    int32, counts (E,) int32, aux_loss scalar fp32 or None).
    """
    cfg = _check_args(logits, top_k, score, n_group, topk_group, group_score, renormalize, routed_scaling_factor,
                      correction_bias, aux_loss_coef)
    weights, ids, counts = moe_route_op(logits, correction_bias, cfg.top_k, cfg.sigmoid, cfg.n_group,
                                        cfg.topk_group, cfg.top2, cfg.renormalize, cfg.scale)
    aux = _aux_loss(logits, counts, cfg.top_k, cfg.sigmoid, cfg.coef) if cfg.coef > 0 else None
    return MoERouting(weights, ids, counts, aux)


COUNT_DTYPES = (torch.int32, torch.int64, torch.float32)


def check_rate(name: str, rate) -> None:
    """A balancing step size (``moe_update_bias_``'s ``rate``, ``nn.MoE``'s ``bias_update_rate``):
    a finite number >= 0, else a ValueError naming the argument."""
    if not _is_number(rate) or not (is_finite(rate) and rate >= 0):
        raise ValueError(f"warpforge: '{name}' is {rate!r}; expected a finite number >= 0")


def moe_update_bias_(correction_bias: torch.Tensor, counts: torch.Tensor, rate: float = 1e-3) -> torch.Tensor:
    """Auxiliary-loss-free load balancing (DeepSeek-V3), in place: each expert's bias rises by
    ``rate`` when it got fewer tokens than the mean and falls when it got more
    (bias += rate * sign(mean(counts) - counts)). Returns ``correction_bias``.

    Args:
        correction_bias: (E,) float32, updated in place (no autograd history is recorded).
        counts: (E,) int32/int64/float32 tokens per expert (``MoERouting.counts``, possibly summed
            over steps or ranks), on the bias's device.
        rate: the step, a finite number >= 0.
    """
    if not isinstance(correction_bias, torch.Tensor):
        raise TypeError(f"warpforge: 'correction_bias' must be a torch.Tensor, got {type(correction_bias).__name__}")
    if correction_bias.dtype != torch.float32:
        raise TypeError(f"warpforge: 'correction_bias' has dtype {_dt(correction_bias.dtype)}; expected float32")
    if correction_bias.dim() != 1:
        raise ValueError(f"warpforge: 'correction_bias' must be 1-d (E,), got shape {tuple(correction_bias.shape)}")
    if not isinstance(counts, torch.Tensor):
        raise TypeError(f"warpforge: 'counts' must be a torch.Tensor, got {type(counts).__name__}")
    if counts.dtype not in COUNT_DTYPES:
        raise TypeError(f"warpforge: 'counts' has dtype {_dt(counts.dtype)}; expected one of "
                        f"{', '.join(_dt(d) for d in COUNT_DTYPES)}")
    if counts.shape != correction_bias.shape:
        raise ValueError(f"warpforge: 'counts' has shape {tuple(counts.shape)} but 'correction_bias' has "
                         f"{tuple(correction_bias.shape)}; expected one count per expert")
    check_same("counts", counts, "correction_bias", correction_bias, shape=False, dtype=False)
    check_rate("rate", rate)
    if counts.numel() == 0:
        return correction_bias
    c = counts.float()
    with torch.no_grad():
        correction_bias.add_(torch.sign(c.mean() - c), alpha=float(rate))
    return correction_bias
