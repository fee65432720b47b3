"""What the benchmark runs, one :class:`Workload` per operator: data, not machinery.

A workload declares its shape sweep, how to make random inputs (never zeros), which arguments get
gradients, our public function, the plain-PyTorch call it replaces (``eager``; ``torch.compile`` of
it is the ``compile`` peer), the Liger-Kernel entry point where one exists, and the op's byte and
FLOP models. The runner (``runner.py``) does timing, peers and modes once for all of them.

Byte models count each input read once and each output written once (PERF.md), s = bytes per
element of the benchmark dtype; weight vectors of N elements are counted too:

    row op (softmax, norms)   fwd 2*M*N*s + P*N*s        (P weight vectors read)
                              bwd 3*M*N*s + 2*P*N*s      (read x or y, dy; write dx; read W, write dW)
    layer_norm (P = 2: w, b)  bwd 3*M*N*s + 3*N*s        (read w, not b: the backward never needs it;
                                                          write dw and db)
    add_rms_norm              fwd 4*M*N*s + N*s          (read x, residual; write y, x+residual)
                              bwd 4*M*N*s + 2*N*s        (read h=x+residual, dy, dh; write one dx,
                                                          which is also d(residual))
    add                       3*n*s
    sum, amax                 M*N*s + M*s
    swiglu, geglu             fwd 3*M*N*s, bwd 5*M*N*s   (fwd+bwd: 8 tensors)
    rope                      fwd 2*(|q|+|k|)*s, bwd the same again (cos/sin tables not counted)
    cross_entropy             fwd T*V*s + 8*T            (read the logits, the int64 targets)
                              fwd+bwd 2*T*V*s + 8*T      (read the logits once, write dlogits once)
    linear_cross_entropy      fwd (T*H + V*H)*s + 8*T    (read hidden and W; the logits never exist)
                              fwd+bwd 2*(T*H + V*H)*s + 8*T   (and write dhidden and dW once)
    attention (B, H, S, D)    fwd (2*B*Hq*S*D + 2*B*Hkv*S*D)*s      (read q, k, v; write o)
                              bwd (4*B*Hq*S*D + 4*B*Hkv*S*D)*s      (read q, k, v, o, do; write dq, dk,
                                                                     dv; the lse vector not counted)
    decode_attention          2*B*ctx*Hkv*D*s + 2*B*Hq*D*s (the KV bytes read; q read, out written)
    moe (T tokens, k of E     fwd 3*Ea*d*n*s + 2*T*d*s + 8*T*k   (read the weights of the Ea experts
    experts of d x n)                                           with a token, x, int32 ids, fp32
                                                                weights; write out)
                              bwd 3*Ea*d*n*s + 3*E*d*n*s + 3*T*d*s + 12*T*k   (read W, write dW of all
                                                                E; read x, dy; write dx, d(weights))

``fwd+bwd`` is always the sum of the two. FLOP models are a few FLOPs per element: every op here
is memory-bound by two orders of magnitude, the FLOPs only place points on the roofline. (The
cross-entropy ops have no separate "bwd": their gradient is formed in the forward, so fwd+bwd is
the floor itself, not a sum.) The GEMMs count 2*M*N*K; linear_cross_entropy 2*T*V*H forward and
6*T*V*H forward+backward (its three GEMMs); attention 4*B*Hq*S^2*D forward (half when causal),
backward 2.5x the forward; decode_attention 4*B*Hq*ctx*D; moe 6*T*k*d*n forward
(gate, up, down: three GEMMs per routed token), 12*T*k*d*n backward.

Beyond the peers, a workload may declare *references* (:class:`Reference`): named callables timed
in the same run that are not a competitor but a yardstick -- e.g. the cuBLAS GEMMs that
linear_cross_entropy cannot avoid. Their rows have kind "ref", are never the best peer, and every
other row records its time over theirs (``vs_ref``). ``measure_memory`` adds each row's extra peak
memory (``extra_gib``); ``liger_writes_inputs`` gives Liger's callable its own copy of the inputs.

A workload may also declare *named peers* (``peers``: e.g. SDPA with each of its backends forced),
timed as peers beside eager/compile/Liger (kind "peer", so the fastest may be the best peer); every
other row then records ``vs_peers``, each peer's time over its own. ``compile_peer=False`` drops the
``compile`` peer (where torch.compile of the eager call only reaches the same library kernels).

Our functions are imported lazily, inside :meth:`Workload.ours`, so an op whose module does not
exist yet is reported as "not available" and skipped.
"""
from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MODES = ("fwd", "bwd", "fwd+bwd")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

ROW_ELEMENTS = 2**27          # every large row-op case: 256 MB in bf16, several times any L2
DECODE_N = 4096


class OpUnavailable(Exception):
    """Our implementation of an op cannot be imported (yet)."""


class Skipped(Exception):
    """Raised by a peer that declines a case on purpose (too large to be worth timing, say): its row
    says "skipped: <reason>", not "failed"."""


@dataclass(frozen=True)
class Case:
    """One shape of a sweep. ``small``: decode-like, where per-call overhead matters (the
    dispatcher door and host_us are measured there). ``headline``: the shape the summary table and
    the roofline plot use."""
    label: str
    dims: dict
    small: bool = False
    headline: bool = False


@dataclass(frozen=True)
class Reference:
    """A yardstick timed in the same run as the rows it measures, never counted as a peer.

    ``step(mode, args)`` returns the zero-argument call to time in ``mode`` on the case's inputs;
    whatever else it needs (a gradient to multiply by, say) it allocates there, once per case and
    mode, outside the timing (the runner drops it after the row). ``modes``: where it applies
    (None: every mode of the workload)."""
    name: str
    step: Callable[[str, tuple], Callable[[], object]]
    modes: tuple[str, ...] | None = None
    notes: str = ""

    def applies(self, mode: str) -> bool:
        return self.modes is None or mode in self.modes


@dataclass(frozen=True)
class Peer:
    """A named peer (see ``Workload.peers``) with a set-up: ``fn`` takes the workload's positional
    args like ``eager``; ``context()`` (a context manager, e.g. ``sdpa_kernel(backend)``) is entered
    once around the peer's whole measurement -- warm-up, timing, host_us -- not around each call, so
    its cost (~15 us for sdpa_kernel) is not timed. A plain callable is a peer without one."""
    fn: Callable
    context: Callable[[], object] | None = None


@dataclass
class Workload:
    name: str
    module: str                                                 # where our op lives
    cases: Callable[[bool], list[Case]]                         # quick -> sweep
    check_cases: Callable[[], list[Case]]                       # small odd shapes, CPU check
    make: Callable[[Case, torch.dtype, torch.device], tuple]    # positional args of every callable
    grad_args: tuple[int, ...]                                  # which args get gradients
    ours_fn: Callable[[Callable[[str], Callable]], dict[str, Callable]]
    eager: Callable                                             # plain PyTorch
    bytes_fn: Callable[[Case, str, int], int]
    flops_fn: Callable[[Case, str], int]
    liger: tuple | None = None        # (module, class name, adapter(cls) -> callable)
    reference: Callable | None = None  # float64 ground truth; default: ``eager`` on float64 inputs
    modes: tuple[str, ...] = MODES
    notes: str = ""
    variant_cases: Callable[[Case], bool] | None = None   # where named variants run (default: every case)
    only_dtypes: tuple[torch.dtype, ...] | None = None     # an op with fixed dtypes (fp8: bf16 output)
    # Liger's callable writes into its inputs (its cross-entropy stores dlogits over the logits): the
    # runner hands it a private copy of the inputs, so the rows after it see the data they were made with
    liger_writes_inputs: bool = False
    references: tuple[Reference, ...] = ()                  # rows of kind "ref" (see Reference)
    measure_memory: bool = False                           # CUDA: each row's extra peak memory, extra_gib
    # named peers, {row name: callable or Peer}, each on the workload's args like ``eager``; rows of
    # kind "peer" (they compete for best peer) and every other row gets vs_peers {peer: peer ms / ms}
    peers: Callable[[], dict[str, Callable | Peer]] | None = None
    compile_peer: bool = True      # False: no torch.compile(eager) row (it would time the same kernels)
    # rounds of device timing, alternating over the case's implementations, each row keeping its least
    # (runner._device_rounds): the large GEMMs run at the H100's 700 W cap, where the clock -- and
    # a 100 ms measurement -- moves by 5-10% between consecutive timings of the same kernel
    device_rounds: int = 1
    rounds_for_variants: bool = True   # False: the named variants' rows (a ladder) are timed once
    # ours and the peers each draw their own random numbers (dropout masks): only ours can be checked
    # against the reference (it rebuilds our mask); a peer's values can only be checked in shape
    stochastic: bool = False

    def dtypes_of(self, dtypes) -> list[torch.dtype]:
        """The requested dtypes this workload runs in."""
        return [d for d in dtypes if self.only_dtypes is None or d in self.only_dtypes]

    def variants_on(self, case: Case) -> bool:
        """Whether rows other than "warpforge" (the ladder's named variants) are timed on ``case``."""
        return self.variant_cases is None or self.variant_cases(case)

    def ours(self) -> dict[str, Callable]:
        """Our implementations, by row name ("warpforge", "warpforge[naive]", ...)."""
        return self.ours_fn(lambda fname: resolve(fname, self.module))

    def liger_fn(self) -> Callable:
        """The Liger-Kernel callable; raises ImportError (or anything) when absent."""
        if self.liger is None:
            raise ImportError(f"Liger-Kernel has no {self.name}")
        mod, cls, adapt = self.liger
        return adapt(getattr(importlib.import_module(mod), cls))

    def bytes(self, case: Case, mode: str, elem_size: int) -> int:
        return int(self.bytes_fn(case, mode, elem_size))

    def flops(self, case: Case, mode: str) -> int:
        return int(self.flops_fn(case, mode))

    def ref(self, *args):
        return (self.reference or self.eager)(*args)


def resolve(fname: str, module: str) -> Callable:
    """``warpforge.<fname>`` if re-exported, else ``<module>.<fname>``; OpUnavailable if neither."""
    import warpforge

    fn = getattr(warpforge, fname, None)
    if callable(fn):
        return fn
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 -- a half-written module may raise anything
        raise OpUnavailable(f"{module} not importable ({type(e).__name__}: {e})") from e
    fn = getattr(mod, fname, None)
    if not callable(fn):
        raise OpUnavailable(f"{module} has no {fname}()")
    return fn


def randn(shape, dtype: torch.dtype, device, scale: float = 1.0) -> torch.Tensor:
    t = torch.randn(shape, dtype=dtype, device=device)
    return t.mul_(scale) if scale != 1.0 else t


def _by_mode(fwd: float, bwd: float) -> Callable[[str], float]:
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}.__getitem__


# ----------------------------------------------------------------------------------------------
# Row ops: (M, N), reduce or normalise along N
# ----------------------------------------------------------------------------------------------
def row_cases(quick: bool) -> list[Case]:
    ns = (4096, 32768, 262144) if quick else (1024, 4096, 8192, 32768, 65536, 262144)
    ms = (1, 64) if quick else (1, 8, 64)
    big = [Case(f"{ROW_ELEMENTS // n}x{n}", {"M": ROW_ELEMENTS // n, "N": n}, headline=(n == 4096)) for n in ns]
    small = [Case(f"{m}x{DECODE_N}", {"M": m, "N": DECODE_N}, small=True) for m in ms]
    return big + small


def row_check_cases() -> list[Case]:
    return [Case("3x123", {"M": 3, "N": 123}), Case("2x4097", {"M": 2, "N": 4097})]


def softmax_cases(quick: bool) -> list[Case]:
    """The row sweep plus the CUDA-path bar's shapes, 16384 x {4096, 8192, 32768} (issue 3)."""
    cases = row_cases(quick)
    have = {c.label for c in cases}
    extra = [Case(f"16384x{n}", {"M": 16384, "N": n}) for n in (4096, 8192, 32768)]
    return cases + [c for c in extra if c.label not in have]


def _mn(case: Case) -> tuple[int, int]:
    return case.dims["M"], case.dims["N"]


def row_bytes(weights: int = 0, fwd_tensors: int = 2, bwd_tensors: int = 3, bwd_weights_read: int | None = None):
    """``weights`` vectors of N read by the forward, their gradients written by the backward, which
    reads ``bwd_weights_read`` of them (default all; LayerNorm's backward reads w, never b)."""
    reads = weights if bwd_weights_read is None else bwd_weights_read

    def f(case: Case, mode: str, s: int) -> int:
        m, n = _mn(case)
        fwd = fwd_tensors * m * n * s + weights * n * s
        bwd = bwd_tensors * m * n * s + (reads + weights) * n * s
        return _by_mode(fwd, bwd)(mode)
    return f


def per_element_flops(fwd: float, bwd: float):
    def f(case: Case, mode: str) -> int:
        return int(math.prod(case.dims[k] for k in ("M", "N")) * _by_mode(fwd, bwd)(mode))
    return f


def reduce_bytes(case: Case, mode: str, s: int) -> int:
    """Forward reads x and writes one value a row. The backward (amax: the gradient split among
    the row's maxima) reads x and the row's dy and writes dx."""
    m, n = _mn(case)
    fwd = m * n * s + m * s
    bwd = 2 * m * n * s + m * s
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _row_x(case, dtype, device):
    return (randn(_mn(case), dtype, device),)


def _row_x_w(case, dtype, device):
    m, n = _mn(case)
    return randn((m, n), dtype, device), randn((n,), dtype, device, 0.5).add_(1.0)


def _row_x_w_b(case, dtype, device):
    m, n = _mn(case)
    return (randn((m, n), dtype, device), randn((n,), dtype, device, 0.5).add_(1.0),
            randn((n,), dtype, device, 0.5))


def _row_x_r_w(case, dtype, device):
    m, n = _mn(case)
    return (randn((m, n), dtype, device), randn((m, n), dtype, device),
            randn((n,), dtype, device, 0.5).add_(1.0))


LN_EPS = 1e-5
RMS_EPS = 1e-6


def _eager_add_rms_norm(x, r, w):
    h = x + r
    return F.rms_norm(h, h.shape[-1:], w, RMS_EPS), h


def _softmax_reference(log: bool):
    def ref(x):
        from warpforge.ops.softmax import softmax_reference
        return softmax_reference(x, -1, log=log)
    return ref


# ----------------------------------------------------------------------------------------------
# add (elementwise, 1-D)
# ----------------------------------------------------------------------------------------------
def add_cases(quick: bool) -> list[Case]:
    return [Case("n=2^28", {"n": 2**28}, headline=True), Case("n=2^20", {"n": 2**20}, small=True)]


def add_check_cases() -> list[Case]:
    return [Case("n=123", {"n": 123}), Case("n=8195", {"n": 8195})]


def _add_make(case, dtype, device):
    n = case.dims["n"]
    return randn((n,), dtype, device), randn((n,), dtype, device)


# ----------------------------------------------------------------------------------------------
# gated activations: out = act(gate) * up, (M, N)
# ----------------------------------------------------------------------------------------------
FFN = 14336


def glu_cases(quick: bool) -> list[Case]:
    return ([Case(f"16384x{FFN}", {"M": 16384, "N": FFN}, headline=True)]
            + [Case(f"{m}x{FFN}", {"M": m, "N": FFN}, small=True) for m in (1, 64)])


def _glu_make(case, dtype, device):
    m, n = _mn(case)
    return randn((m, n), dtype, device), randn((m, n), dtype, device)


# ----------------------------------------------------------------------------------------------
# rope: q (B, Hq, S, D), k (B, Hk, S, D), cos/sin (S_table, D), optional position_ids (B, S)
# ----------------------------------------------------------------------------------------------
ROPE_TABLE = 4096


def rope_cases(quick: bool) -> list[Case]:
    big = Case("q4x32x4096x128 k4x8x4096x128", {"B": 4, "Hq": 32, "Hk": 8, "S": 4096, "D": 128, "pos": False},
               headline=True)
    dec = [Case(f"decode B={b} q{b}x32x1x128 k{b}x8x1x128", {"B": b, "Hq": 32, "Hk": 8, "S": 1, "D": 128, "pos": True},
                small=True) for b in (1, 64)]
    return [big, *dec]


def rope_check_cases() -> list[Case]:
    return [Case("q2x4x5x64 k2x2x5x64", {"B": 2, "Hq": 4, "Hk": 2, "S": 5, "D": 64, "pos": False}),
            Case("decode q3x3x1x32 k3x1x1x32", {"B": 3, "Hq": 3, "Hk": 1, "S": 1, "D": 32, "pos": True})]


def rope_tables(length: int, dim: int, dtype, device, base: float = 10000.0):
    """HF rotate-half convention: cos/sin of shape (length, dim), each half repeated."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    ang = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)   # (L, D/2)
    emb = torch.cat((ang, ang), dim=-1)                                                 # (L, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rope_make(case, dtype, device):
    d = case.dims
    table = max(ROPE_TABLE, d["S"] + 8) if d["pos"] else d["S"]
    q = randn((d["B"], d["Hq"], d["S"], d["D"]), dtype, device)
    k = randn((d["B"], d["Hk"], d["S"], d["D"]), dtype, device)
    cos, sin = rope_tables(table, d["D"], dtype, device)
    pos = None
    if d["pos"]:   # decode: each sequence at its own offset into the table
        start = torch.randint(1, table - d["S"], (d["B"], 1), device=device)
        pos = start + torch.arange(d["S"], device=device)                                # (B, S)
    return q, k, cos, sin, pos


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _eager_rope(q, k, cos, sin, pos):
    if pos is not None:
        cos, sin = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)                          # (B, 1, S, D)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _liger_rope(cls):
    def fn(q, k, cos, sin, pos):
        if pos is not None:
            cos, sin = cos[pos], sin[pos]                                                # (B, S, D)
        return cls.apply(q, k, cos, sin)
    return fn


def rope_bytes(case: Case, mode: str, s: int) -> int:
    d = case.dims
    e = d["B"] * (d["Hq"] + d["Hk"]) * d["S"] * d["D"]
    return _by_mode(2 * e * s, 2 * e * s)(mode)


def rope_flops(case: Case, mode: str) -> int:
    d = case.dims
    e = d["B"] * (d["Hq"] + d["Hk"]) * d["S"] * d["D"]
    return _by_mode(3 * e, 3 * e)(mode)


# ----------------------------------------------------------------------------------------------
# Matrix multiply: C (M, N) = A (M, K) @ W^T, W (N, K) row-major -- a linear layer's layout
# ----------------------------------------------------------------------------------------------
GEMM_ROUNDS = 3    # device timing rounds of the GEMM workloads (Workload.device_rounds)
LLAMA_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096))   # q/o, gate/up, down, lm_head
LLAMA_M = (16, 128, 4096, 16384)                                        # decode ... long prefill
MATMUL_LADDER = ("naive", "pipelined", "grouped", "autotuned", "persistent", "splitk")
CUDA_MATMUL_LADDER = ("naive", "tiled", "regblock", "mma", "mma_tma")     # backend="cuda"


_T_CACHE: dict = {}


def _row_major_t(w: torch.Tensor) -> torch.Tensor:
    """W^T as a row-major (K, N) tensor, made once per weight and kept: the CUDA ladder reads B
    row-major, so its rows time the kernels on that layout, not a transpose per call."""
    key = (w.data_ptr(), tuple(w.shape), w.dtype)
    if key not in _T_CACHE:
        _T_CACHE.clear()   # one weight at a time: the previous case's is garbage
        # a leaf of its own (its gradient, in bwd mode, is the same work as W's)
        _T_CACHE[key] = w.detach().T.contiguous().requires_grad_(w.requires_grad)
    return _T_CACHE[key]


def gemm_cases(quick: bool) -> list[Case]:
    cubes = [Case("4096^3", {"M": 4096, "N": 4096, "K": 4096, "ladder": True}),
             Case("8192^3", {"M": 8192, "N": 8192, "K": 8192}, headline=True)]
    ms = (16, 4096) if quick else LLAMA_M
    llama = [Case(f"{m}x{n}x{k}", {"M": m, "N": n, "K": k, "ladder": (m == 16 and n == k == 4096)})
             for m in ms for n, k in LLAMA_NK]
    return cubes + llama


def gemm_check_cases() -> list[Case]:
    return [Case("17x33x45", {"M": 17, "N": 33, "K": 45}), Case("1x7x70", {"M": 1, "N": 7, "K": 70})]


def _gemm_make(case, dtype, device):
    d = case.dims
    return randn((d["M"], d["K"]), dtype, device), randn((d["N"], d["K"]), dtype, device)


def gemm_flops(case: Case, mode: str) -> int:
    d = case.dims
    f = 2 * d["M"] * d["N"] * d["K"]
    return _by_mode(f, 2 * f)(mode)


def gemm_bytes(case: Case, mode: str, s: int) -> int:
    """fwd: read A and W, write C. bwd: read dC, W and A; write dA and dW."""
    m, n, k = case.dims["M"], case.dims["N"], case.dims["K"]
    return _by_mode((m * k + n * k + m * n) * s, (2 * m * k + 2 * n * k + m * n) * s)(mode)


def _gemm_bwd_make(case, dtype, device):
    """x (M, K), W (N, K), dy (M, N): the operands of a linear layer's backward."""
    x, w = _gemm_make(case, dtype, device)
    return x, w, randn((case.dims["M"], case.dims["N"]), dtype, device)


def gemm_bwd_cases(quick: bool) -> list[Case]:
    return [c for c in gemm_cases(quick) if c.label != "4096^3"]


def linear_act_cases(quick: bool) -> list[Case]:
    """GPT-2/BERT-size MLPs (K = 768, 1024: the elementwise passes eager adds are a large share)
    and a Llama-size one."""
    shapes = [(8192, 3072, 768), (8192, 4096, 1024), (4096, 14336, 4096)]
    if quick:
        shapes = shapes[:1]
    return [Case(f"{m}x{n}x{k}", {"M": m, "N": n, "K": k}, headline=(i == 0)) for i, (m, n, k) in enumerate(shapes)]


def _linear_make(case, dtype, device):
    d = case.dims
    return (randn((d["M"], d["K"]), dtype, device), randn((d["N"], d["K"]), dtype, device, scale=d["K"] ** -0.5),
            randn((d["N"],), dtype, device))


def linear_act_bytes(case: Case, mode: str, s: int) -> int:
    m, n, k = case.dims["M"], case.dims["N"], case.dims["K"]
    return (m * k + n * k + n + m * n) * s


FP8_MAX = 448.0   # largest finite float8_e4m3fn


def _fp8_make(case, dtype, device):
    """Per-tensor-scaled e4m3 operands made from bf16 ones, and their dequantised values in bf16
    (the same problem for our bf16 row, and the same answer up to bf16 rounding)."""
    a, w = _gemm_make(case, torch.bfloat16, device)
    sa = (a.abs().amax().float() / FP8_MAX).reshape(())
    sw = (w.abs().amax().float() / FP8_MAX).reshape(())
    a8 = (a.float() / sa).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    w8 = (w.float() / sw).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    del a, w
    return a8, w8, sa, sw, (a8.float() * sa).bfloat16(), (w8.float() * sw).bfloat16()


def _fp8_reference(a8, w8, sa, sw, a, w):
    return ((a8.double() * sa) @ (w8.double() * sw).T).to(torch.bfloat16)


def fp8_cases(quick: bool) -> list[Case]:
    shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 14336, 4096), (16384, 4096, 14336)]
    return [Case(f"{m}x{n}x{k}", {"M": m, "N": n, "K": k}, headline=(i == 0))
            for i, (m, n, k) in enumerate(shapes[:2] if quick else shapes)]


# ----------------------------------------------------------------------------------------------
# Cross-entropy over a vocabulary: logits (T, V), int64 targets (T,); and fused with the LM head,
# hidden (T, H) @ W^T with W (V, H)
# ----------------------------------------------------------------------------------------------
CE_TOKENS = (4096, 8192, 32768)
CE_VOCABS = (32000, 128256, 262144)       # Llama 2, Llama 3, Gemma 3
CE_HIDDEN = 4096
CE_HEADLINE = (8192, 128256)


def ce_cases(quick: bool) -> list[Case]:
    shapes = [CE_HEADLINE, (4096, 32000)] if quick else [(t, v) for t in CE_TOKENS for v in CE_VOCABS]
    return [Case(f"{t}x{v}", {"T": t, "V": v}, headline=(t, v) == CE_HEADLINE) for t, v in shapes]


def ce_check_cases() -> list[Case]:
    return [Case(f"{t}x{v}", {"T": t, "V": v}) for t, v in ((5, 7), (17, 600), (9, 129))]


def _ce_make(case, dtype, device):
    t, v = case.dims["T"], case.dims["V"]
    return randn((t, v), dtype, device, 2.0), torch.randint(0, v, (t,), device=device)


def ce_bytes(case: Case, mode: str, s: int) -> int:
    t, v = case.dims["T"], case.dims["V"]
    return {"fwd": t * v * s, "fwd+bwd": 2 * t * v * s}[mode] + 8 * t


def ce_flops(case: Case, mode: str) -> int:
    return case.dims["T"] * case.dims["V"] * {"fwd": 4, "fwd+bwd": 8}[mode]


def lce_cases(quick: bool) -> list[Case]:
    shapes = [CE_HEADLINE] if quick else [(t, v) for t in CE_TOKENS for v in CE_VOCABS]
    return [Case(f"{t}x{v} H={CE_HIDDEN}", {"T": t, "V": v, "H": CE_HIDDEN}, headline=(t, v) == CE_HEADLINE)
            for t, v in shapes]


def lce_check_cases() -> list[Case]:
    return [Case(f"{t}x{v} H={h}", {"T": t, "V": v, "H": h}) for t, v, h in ((9, 50, 8), (20, 600, 32), (13, 257, 24))]


def _lce_make(case, dtype, device):
    d = case.dims
    return (randn((d["T"], d["H"]), dtype, device, 0.5), randn((d["V"], d["H"]), dtype, device, 0.02),
            torch.randint(0, d["V"], (d["T"],), device=device))


def lce_bytes(case: Case, mode: str, s: int) -> int:
    d = case.dims
    once = (d["T"] * d["H"] + d["V"] * d["H"]) * s            # hidden and W read (fwd+bwd: dh and dW written)
    return {"fwd": once, "fwd+bwd": 2 * once}[mode] + 8 * d["T"]


def lce_flops(case: Case, mode: str) -> int:
    d = case.dims
    return 2 * d["T"] * d["V"] * d["H"] * {"fwd": 1, "fwd+bwd": 3}[mode]


def _cublas_gemms(mode: str, args: tuple) -> Callable[[], object]:
    """The GEMMs linear + cross-entropy cannot avoid, alone: the logits h @ W^T (fwd); and with the
    backward's dh = dlogits @ W and dW = dlogits^T @ h, on a dlogits made here, outside the timing."""
    h, w, _t = args
    if mode == "fwd":
        return lambda: torch.mm(h, w.t())
    dlogits = torch.randn((h.shape[0], w.shape[0]), dtype=h.dtype, device=h.device)   # (T, V)

    def three():
        return torch.mm(h, w.t()), torch.mm(dlogits, w), torch.mm(dlogits.t(), h)
    return three


CE_NOTES = ("modes fwd and fwd+bwd only: with a scalar loss the gradient is formed in the forward and "
            "scaled in place by the backward, so a second backward through one graph (the 'bwd' mode's "
            "retain_graph=True) raises by design; fwd+bwd (a fresh graph each call) is the training step, "
            "with dy = 1 as loss.backward() passes (a loss's rescaling pass is skipped then)")


# ----------------------------------------------------------------------------------------------
# Attention: q (B, Hq, S, D), k/v (B, Hkv, S, D), SDPA's signature; and decode over a paged KV cache
# ----------------------------------------------------------------------------------------------
ATTN_TOKENS = 16384                        # B * S: FlashAttention's own benchmark convention
ATTN_HIDDEN = 2048                         # H * D
ATTN_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
ATTN_DIMS = (64, 128)
MATH_MAX_S = 4096   # sdpa[math] materialises B*H*S^2 scores (and their gradient): longer is skipped

# (name, SDPBackend member): the backends SDPA can be forced to, each a named peer "sdpa[<name>]"
SDPA_BACKENDS = (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"),
                 ("efficient", "EFFICIENT_ATTENTION"), ("math", "MATH"))
SDPA_PEER_NOTES = ("eager = F.scaled_dot_product_attention with its default backend choice; "
                   "sdpa[cudnn], sdpa[flash], sdpa[efficient], sdpa[math]: the same call with that one "
                   "backend forced by torch.nn.attention.sdpa_kernel (cuDNN attention; FlashAttention-2; "
                   "the memory-efficient (xformers/CUTLASS) kernel; the unfused math reference in PyTorch "
                   "ops), entered once around each peer's measurement, not per call; a backend that cannot "
                   "run a case is a failed row; no compile peer (torch.compile of SDPA calls these same "
                   "kernels) and no Liger (it has no attention)")


def _attn_case(b: int, hq: int, hkv: int, s: int, d: int, causal: bool, headline: bool = False) -> Case:
    return Case(f"B{b} H{hq}/{hkv} S{s} D{d} {'causal' if causal else 'non-causal'}",
                {"B": b, "Hq": hq, "Hkv": hkv, "S": s, "D": d, "causal": causal}, headline=headline)


def attention_cases(quick: bool) -> list[Case]:
    """16k tokens at hidden 2048 over S x D x causal (full sweep); the bar shape B4 H32 S4096 D128
    (causal and not; headline: not); GQA 32 over 8 heads at that shape (quick: causal only)."""
    bar = [_attn_case(4, 32, 32, 4096, 128, False, headline=True), _attn_case(4, 32, 32, 4096, 128, True)]
    gqa = [_attn_case(4, 32, 8, 4096, 128, c) for c in ((True,) if quick else (False, True))]
    if quick:
        return bar + gqa
    sweep = [_attn_case(max(1, ATTN_TOKENS // s), ATTN_HIDDEN // d, ATTN_HIDDEN // d, s, d, c)
             for s in ATTN_SEQS for d in ATTN_DIMS for c in (False, True)]
    have = {c.label for c in sweep}
    return sweep + [c for c in bar + gqa if c.label not in have]


def attention_check_cases() -> list[Case]:
    return [_attn_case(1, 2, 2, 17, 16, False), _attn_case(1, 2, 2, 17, 16, True),
            _attn_case(2, 4, 4, 33, 32, False), _attn_case(2, 4, 2, 33, 32, True)]


def _attn_make(case, dtype, device):
    """q, k, v ~ N(0, 1): at SDPA's default scale 1/sqrt(D) the logits are ~N(0, 1), a softmax
    neither uniform nor one-hot; then is_causal and enable_gqa (True where Hq != Hkv)."""
    d = case.dims
    q = randn((d["B"], d["Hq"], d["S"], d["D"]), dtype, device)
    k = randn((d["B"], d["Hkv"], d["S"], d["D"]), dtype, device)
    v = randn((d["B"], d["Hkv"], d["S"], d["D"]), dtype, device)
    return q, k, v, bool(d["causal"]), d["Hq"] != d["Hkv"]


def _sdpa(q, k, v, causal, gqa):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def _math_attention(q, k, v, causal, cap=None, softmax_dtype=None):
    """Attention in PyTorch ops: kv heads repeated for GQA, scores scaled by 1/sqrt(D), capped to
    cap * tanh(s / cap) when ``cap`` is given, SDPA's top-left causal mask (torch.ones(L, S).tril()),
    the softmax (in ``softmax_dtype`` and cast back, when given), then P V."""
    if k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if cap is not None:
        scores = torch.tanh(scores / cap) * cap
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if softmax_dtype is None:
        return torch.softmax(scores, dim=-1) @ v
    return torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(q.dtype) @ v


def attention_reference(q, k, v, causal=False, gqa=False):
    """Plain math attention (float64 in the correctness run): _math_attention without a cap."""
    return _math_attention(q, k, v, causal)


def attention_flops(case: Case, mode: str) -> int:
    d = case.dims
    fwd = 4 * d["B"] * d["Hq"] * d["S"] ** 2 * d["D"] // (2 if d["causal"] else 1)
    return {"fwd": fwd, "bwd": fwd * 5 // 2, "fwd+bwd": fwd + fwd * 5 // 2}[mode]


def attention_bytes(case: Case, mode: str, s: int) -> int:
    """fwd: read q, k, v; write o. bwd: read q, k, v, o, do; write dq, dk, dv (lse not counted)."""
    d = case.dims
    q, kv = d["B"] * d["Hq"] * d["S"] * d["D"], d["B"] * d["Hkv"] * d["S"] * d["D"]
    return _by_mode((2 * q + 2 * kv) * s, (4 * q + 4 * kv) * s)(mode)


def _skip_long(call: Callable, max_s: int) -> Callable:
    def fn(q, k, *rest):
        if k.shape[-2] > max_s:
            raise Skipped(f"S = {k.shape[-2]} > {max_s}: the math backend materialises the B*H*S^2 "
                          f"scores (and their gradient); not timed")
        return call(q, k, *rest)
    return fn


def sdpa_peers(call: Callable, math_max_s: int | None = None) -> Callable[[], dict[str, Peer]]:
    """Workload.peers: "sdpa[<backend>]" for each SDPA backend, ``call`` (the workload's args ->
    an SDPA call) under ``sdpa_kernel(<backend>)``; the math one declines S > ``math_max_s``."""
    def peers() -> dict[str, Peer]:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        out = {}
        for name, member in SDPA_BACKENDS:
            backend = getattr(SDPBackend, member, None)
            if backend is None:
                continue   # an older torch without that backend: no row
            fn = _skip_long(call, math_max_s) if name == "math" and math_max_s else call
            out[f"sdpa[{name}]"] = Peer(fn, context=lambda b=backend: sdpa_kernel(b))
        return out
    return peers


ATTN_DROPOUT = 0.1       # attention dropout's bench rate (BERT/GPT-2's attention_probs_dropout_prob)
DROPOUT_KEY = 1234       # the generator seed every timed call of ours restarts from (the same mask each call)


def attention_dropout_cases(quick: bool) -> list[Case]:
    """Dropout at the bar shape B4 H32 S4096 D128 (causal and not; headline: not) and, in the full
    sweep, two sweep points: S 1024 and 16384 at D 128 (16k tokens at hidden 2048)."""
    bar = [_attn_case(4, 32, 32, 4096, 128, False, headline=True), _attn_case(4, 32, 32, 4096, 128, True)]
    if quick:
        return bar
    return bar + [_attn_case(16384 // s, 16, 16, s, 128, c) for s in (1024, 16384) for c in (False, True)]


def _attn_dropout_make(case, dtype, device):
    """_attn_make's q, k, v, causal, gqa, then the rate and a generator for our key (restarted
    from DROPOUT_KEY on every call of ours, so the reference can rebuild the mask)."""
    return (*_attn_make(case, dtype, device), ATTN_DROPOUT, torch.Generator(device))


def _sdpa_dropout(q, k, v, causal, gqa, p, gen):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, enable_gqa=gqa)


def _attn_dropout_ours(get):
    f = get("scaled_dot_product_attention")

    def call(q, k, v, causal, gqa, p, gen):
        gen.manual_seed(DROPOUT_KEY)          # host only: sets the generator's state, no kernel
        return f(q, k, v, dropout_p=p, is_causal=causal, enable_gqa=gqa, generator=gen)
    return {"warpforge": call}


def attention_dropout_reference(q, k, v, causal, gqa, p, gen):
    """Plain attention with the mask our kernels draw for the key DROPOUT_KEY gives
    (ops.attention.dropout_keep_mask), kept probabilities scaled by 1 / (1 - p)."""
    from ..ops.attention import attention_reference as ref, dropout_keep_mask, dropout_seed

    key = dropout_seed(q.device, torch.Generator(gen.device).manual_seed(DROPOUT_KEY))
    keep = dropout_keep_mask(key, q.shape[0], q.shape[1], q.shape[2], k.shape[2], p)
    return ref(q, k, v, is_causal=causal, enable_gqa=gqa, dropout_keep=keep, dropout_p=p)[0]


GEMMA2_SOFTCAP = 50.0    # Gemma 2's attn_logit_softcapping (both sizes)
CHECK_SOFTCAP = 2.0      # the correctness run's cap: with N(0, 1) scores a cap of 50 changes them by ~1e-4


def _softcap_case(b: int, hq: int, hkv: int, s: int, d: int, causal: bool, cap: float = GEMMA2_SOFTCAP,
                  headline: bool = False) -> Case:
    base = _attn_case(b, hq, hkv, s, d, causal)
    return Case(f"{base.label} cap{cap:g}", {**base.dims, "cap": cap}, headline=headline)


def attention_softcap_cases(quick: bool) -> list[Case]:
    """Gemma 2's attention: Gemma-2-27B's heads (32 over 16, D 128) and Gemma-2-9B's (16 over 8,
    D 256) at B4 S4096 (causal, the model's; headline: the 27B shape), the 27B heads non-causal;
    in the full sweep the 27B heads at S 1024 (B16) and 8192 (B1: the eager peer's scores are
    then as large as at B4 S4096) too."""
    cases = [_softcap_case(4, 32, 16, 4096, 128, True, headline=True), _softcap_case(4, 16, 8, 4096, 256, True)]
    if quick:
        return cases
    return cases + [_softcap_case(4, 32, 16, 4096, 128, False), _softcap_case(16, 32, 16, 1024, 128, True),
                    _softcap_case(1, 32, 16, 8192, 128, True)]


def attention_softcap_check_cases() -> list[Case]:
    return [_softcap_case(1, 2, 2, 17, 16, False, CHECK_SOFTCAP), _softcap_case(2, 4, 2, 33, 32, True, CHECK_SOFTCAP)]


def _attn_softcap_make(case, dtype, device):
    """_attn_make's q, k, v, causal, gqa, then the cap; q ~ N(0, 9) in the correctness run (scores
    ~N(0, 9) against its cap of 2, so the cap bends most of them), N(0, 1) when timed."""
    q, k, v, causal, gqa = _attn_make(case, dtype, device)
    if case.dims["cap"] == CHECK_SOFTCAP:
        q = q * 3
    return q, k, v, causal, gqa, float(case.dims["cap"])


def softcap_attention_eager(q, k, v, causal, gqa, cap):
    """Gemma 2's eager attention (Hugging Face's): kv heads repeated, scores scaled, capped to
    cap * tanh(s / cap), the causal mask, a float32 softmax cast back, then P V (_math_attention).
    In float64 (the correctness run's reference) every step stays float64."""
    return _math_attention(q, k, v, causal, cap, torch.float64 if q.dtype == torch.float64 else torch.float32)


_FLEX: dict = {}


def _flex_softcap(q, k, v, causal, gqa, cap):
    """FlexAttention (torch.compile'd, PyTorch's own fused attention with a score_mod) with the
    cap as its score_mod and the causal block mask; the mask (create_block_mask) and the compiled
    function are built on the first call of a shape, outside the timing, as a model builds them
    once. Off a GPU it runs uncompiled (flex_attention's own reference path, which takes float64:
    the peer checked against the reference on the CPU)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention)
    fn = _FLEX["fn"] if q.is_cuda else flex_attention
    mod = _FLEX.setdefault(("mod", cap), lambda score, b, h, i, j: torch.tanh(score / cap) * cap)
    mask = None
    if causal:
        key = ("mask", q.shape[-2], k.shape[-2], q.device)
        if key not in _FLEX:
            _FLEX[key] = create_block_mask(lambda b, h, i, j: i >= j, None, None, q.shape[-2], k.shape[-2],
                                           device=q.device)
        mask = _FLEX[key]
    return fn(q, k, v, score_mod=mod, block_mask=mask, enable_gqa=gqa)


def _flex_retainable():
    """The flex peer's set-up: its compiled backward without donated buffers, which refuses the
    bwd mode's retain_graph=True (a buffer-reuse that changes memory, not the kernels)."""
    import torch._functorch.config as functorch_config

    return functorch_config.patch(donated_buffer=False)


def softcap_attention_reference(q, k, v, causal, gqa, cap):
    """warpforge's float64 reference with the cap (ops.attention.attention_reference)."""
    from ..ops.attention import attention_reference as ref

    return ref(q, k, v, is_causal=causal, enable_gqa=gqa, softcap=cap)[0]


DECODE_HQ, DECODE_HKV, DECODE_D, DECODE_BLOCK = 32, 8, 128, 16
DECODE_BATCHES = (1, 8, 16, 32, 64)
DECODE_CONTEXTS = (4096, 8192, 16384, 32768)
DECODE_HEADLINE = (16, 32768)


def _decode_case(b: int, ctx: int, hq: int = DECODE_HQ, hkv: int = DECODE_HKV, d: int = DECODE_D,
                 block: int = DECODE_BLOCK, small: bool = False, headline: bool = False) -> Case:
    return Case(f"B{b} ctx{ctx} H{hq}/{hkv} D{d} block{block}",
                {"B": b, "ctx": ctx, "Hq": hq, "Hkv": hkv, "D": d, "block": block}, small=small, headline=headline)


def decode_cases(quick: bool) -> list[Case]:
    """Llama-3-8B-like heads (32 over 8, D 128), block 16; batch x context, every sequence of the
    same length (so SDPA's unpaged problem is the same one); batch <= 8 is small (decode-like)."""
    batches, ctxs = ((1, 16, 64), (4096, 32768)) if quick else (DECODE_BATCHES, DECODE_CONTEXTS)
    return [_decode_case(b, c, small=b <= 8, headline=(b, c) == DECODE_HEADLINE) for b in batches for c in ctxs]


def decode_check_cases() -> list[Case]:
    return [_decode_case(2, 40, 4, 2, 16, 8), _decode_case(3, 37, 4, 2, 32, 8)]


def _decode_paged(case, dtype, device):
    """The paged problem -- q (B, Hq, D); k/v caches (num_blocks, block, Hkv, D) of exactly the
    blocks needed, handed out as a random permutation of the pool; block_table (B, max_blocks)
    int32; seq_lens (B,) int32, all ctx. Cache slots past ctx hold random values too."""
    d = case.dims
    b, ctx, blk = d["B"], d["ctx"], d["block"]
    nb = -(-ctx // blk)
    q = randn((b, d["Hq"], d["D"]), dtype, device)
    k_cache = randn((b * nb, blk, d["Hkv"], d["D"]), dtype, device)
    v_cache = randn((b * nb, blk, d["Hkv"], d["D"]), dtype, device)
    block_table = torch.randperm(b * nb, device=device).view(b, nb).to(torch.int32)
    seq_lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, block_table, seq_lens


def _unpaged(cache, block_table, ctx, lo: int = 0):
    """Positions [lo, ctx) of each sequence of a paged cache, as SDPA reads them:
    (B, Hkv, ctx - lo, D), contiguous; only the pages holding them are gathered."""
    b, nb = block_table.shape
    _, blk, hkv, dim = cache.shape
    first = lo // blk
    pages = cache[block_table[:, first:].long()].view(b, (nb - first) * blk, hkv, dim)
    return pages[:, lo - first * blk:ctx - first * blk].transpose(1, 2).contiguous()


def _decode_make(case, dtype, device):
    """:func:`_decode_paged`'s problem and the same values unpaged for the peers: q4 (B, Hq, 1, D),
    k4/v4 (B, Hkv, ctx, D)."""
    q, k_cache, v_cache, block_table, seq_lens = _decode_paged(case, dtype, device)
    ctx = case.dims["ctx"]
    return (q, k_cache, v_cache, block_table, seq_lens, q.unsqueeze(2), _unpaged(k_cache, block_table, ctx),
            _unpaged(v_cache, block_table, ctx))


def _sdpa_decode(q, k_cache, v_cache, block_table, seq_lens, q4, k4, v4, *_):
    """SDPA on the unpaged problem; trailing args (a window's left, fp8 scales) are ours alone."""
    return F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)


def decode_reference(q, k_cache, v_cache, block_table, seq_lens, q4, k4, v4, *_):
    return attention_reference(q4, k4, v4, False, True)


def _decode_ours(get):
    f = get("decode_attention")
    # (B, Hq, D) -> (B, Hq, 1, D), SDPA's shape: the view is on our rows' clock, not the peers'
    return {"warpforge": lambda q, kc, vc, bt, sl, *_: f(q, kc, vc, bt, sl, validate=False).unsqueeze(2),
            "warpforge[validated]": lambda q, kc, vc, bt, sl, *_: f(q, kc, vc, bt, sl).unsqueeze(2)}


def decode_bytes(case: Case, mode: str, s: int, kv_s: int | None = None) -> int:
    """The keys and values attended at ``kv_s`` bytes an element (default ``s``: the 16-bit
    caches'; 1 for fp8 ones), plus q and out at ``s``."""
    d = case.dims
    keys = min(d["ctx"], d.get("window", d["ctx"]))
    return 2 * d["B"] * keys * d["Hkv"] * d["D"] * (s if kv_s is None else kv_s) + 2 * d["B"] * d["Hq"] * d["D"] * s


def decode_flops(case: Case, mode: str) -> int:
    d = case.dims
    return 4 * d["B"] * d["Hq"] * min(d["ctx"], d.get("window", d["ctx"])) * d["D"]


def kv_fp8(cache, fmt=torch.float8_e4m3fn):
    """(cache in ``fmt``, its scale): one power-of-two scale, the smallest putting the largest
    magnitude at or under the format's max, so that fp8 * scale is exact in bf16/fp16."""
    top = torch.finfo(fmt).max
    scale = 2.0 ** math.ceil(math.log2(cache.abs().amax().float().item() / top))
    return (cache.float() / scale).clamp(-top, top).to(fmt), scale


def _decode_fp8_make(case, dtype, device):
    """:func:`_decode_paged`'s problem with the caches stored by :func:`kv_fp8`: the peers'
    unpaged k4/v4 hold exactly the values our kernel dequantises, so every row computes the same
    attention. Two trailing args: k_scale, v_scale (floats)."""
    q, k_cache, v_cache, block_table, seq_lens = _decode_paged(case, dtype, device)
    kc8, ks = kv_fp8(k_cache)
    vc8, vs = kv_fp8(v_cache)
    del k_cache, v_cache
    ctx = case.dims["ctx"]
    k4, v4 = (_unpaged(c, block_table, ctx).to(dtype) * s for c, s in ((kc8, ks), (vc8, vs)))
    return q, kc8, vc8, block_table, seq_lens, q.unsqueeze(2), k4, v4, ks, vs


def _decode_fp8_ours(get):
    f = get("decode_attention")
    return {"warpforge": lambda q, kc, vc, bt, sl, q4, k4, v4, ks, vs:
            f(q, kc, vc, bt, sl, k_scale=ks, v_scale=vs, validate=False).unsqueeze(2)}


# A sliding window (Mistral-7B's 4,096 keys; gpt-oss's 128) over a long paged context
DECODE_WINDOWS = ((1, 32768, 4096), (16, 32768, 4096), (64, 32768, 4096), (16, 32768, 128), (64, 8192, 128))


def _decode_window_case(b: int, ctx: int, window: int, hq: int = DECODE_HQ, hkv: int = DECODE_HKV,
                        d: int = DECODE_D, block: int = DECODE_BLOCK) -> Case:
    return Case(f"B{b} ctx{ctx} window{window} H{hq}/{hkv} D{d} block{block}",
                {"B": b, "ctx": ctx, "window": window, "Hq": hq, "Hkv": hkv, "D": d, "block": block},
                small=b <= 8 or window * b <= 4096, headline=(b, window) == (16, 4096))


def decode_window_cases(quick: bool) -> list[Case]:
    return [_decode_window_case(*c) for c in (DECODE_WINDOWS[1:3] if quick else DECODE_WINDOWS)]


def decode_window_check_cases() -> list[Case]:
    return [_decode_window_case(2, 40, 9, 4, 2, 16, 8), _decode_window_case(3, 37, 20, 4, 2, 32, 8)]


def _decode_window_make(case, dtype, device):
    """_decode_make's problem, every sequence attending to its last ``window`` keys
    (window_size=(window - 1, 0)); the peers get those keys unpaged and contiguous, k/v
    (B, Hkv, window, D), and the window's left as the last argument."""
    q, k_cache, v_cache, block_table, seq_lens = _decode_paged(case, dtype, device)
    ctx = case.dims["ctx"]
    w = min(case.dims["window"], ctx)
    return (q, k_cache, v_cache, block_table, seq_lens, q.unsqueeze(2), _unpaged(k_cache, block_table, ctx, ctx - w),
            _unpaged(v_cache, block_table, ctx, ctx - w), w - 1)


def _decode_window_ours(get):
    f = get("decode_attention")
    return {"warpforge": lambda q, kc, vc, bt, sl, q4, k4, v4, left:
            f(q, kc, vc, bt, sl, window_size=(left, 0), validate=False).unsqueeze(2)}


# ----------------------------------------------------------------------------------------------
# Mixture of experts: x (T, d) through E SwiGLU experts, each token to k of them.
# w_gate_up (E, 2n, d) (rows [0, n) gate, [n, 2n) up: the transformers v5 / Liger layout),
# w_down (E, d, n), topk_weights (T, k) float32, topk_ids (T, k) int32
# ----------------------------------------------------------------------------------------------
# (name, d, n, E, k): hidden size, expert intermediate size, routed experts, experts per token
MOE_MODELS = (("DeepSeek-V2-Lite", 2048, 1408, 64, 6), ("Qwen3-30B-A3B", 2048, 768, 128, 8),
              ("Mixtral-8x7B", 4096, 14336, 8, 2), ("OLMoE-1B-7B", 2048, 1024, 64, 8))
MOE_TOKENS = (8192, 16384)
MOE_ROUTINGS = ("balanced", "random", "zipf")
MOE_QUICK_MODELS = ("DeepSeek-V2-Lite", "Qwen3-30B-A3B", "Mixtral-8x7B")
MOE_HEADLINE = ("DeepSeek-V2-Lite", 8192, "random")
MOE_DECODE_TOKENS = (1, 8, 64, 256)
MOE_DECODE_QUICK_TOKENS = (1, 64)
MOE_DECODE_HEADLINE = ("DeepSeek-V2-Lite", 64)
ZIPF_EXPONENT = 1.2
MOE_SEED = 0


def _moe_case(name: str, d: int, n: int, e: int, k: int, t: int, routing: str, small: bool = False,
              headline: bool = False) -> Case:
    return Case(f"{name} T{t} d{d} n{n} E{e} k{k} {routing}",
                {"model": name, "T": t, "d": d, "n": n, "E": e, "k": k, "routing": routing},
                small=small, headline=headline)


def moe_cases(quick: bool) -> list[Case]:
    """The four models x T in {8192, 16384} x routing (full); quick: DeepSeek-V2-Lite (the headline),
    Qwen3-30B-A3B and Mixtral at T 8192, random routing."""
    out = []
    for name, d, n, e, k in MOE_MODELS:
        if quick and name not in MOE_QUICK_MODELS:
            continue
        for t in (MOE_TOKENS[:1] if quick else MOE_TOKENS):
            for r in (("random",) if quick else MOE_ROUTINGS):
                out.append(_moe_case(name, d, n, e, k, t, r, headline=(name, t, r) == MOE_HEADLINE))
    return out


def moe_decode_cases(quick: bool) -> list[Case]:
    """Decode batches, T in {1, 8, 64, 256} tokens, each of the four models, balanced, random and
    Zipf routing (T = 1: random only -- one token's k experts get a row each, whatever the routing);
    quick: DeepSeek-V2-Lite, Qwen3, Mixtral at T 1 and 64, random. All small: per-call overhead
    counts here."""
    out = []
    for name, d, n, e, k in MOE_MODELS:
        if quick and name not in MOE_QUICK_MODELS:
            continue
        for t in (MOE_DECODE_QUICK_TOKENS if quick else MOE_DECODE_TOKENS):
            for r in (("random",) if quick or t == 1 else MOE_ROUTINGS):
                out.append(_moe_case(name, d, n, e, k, t, r, small=True,
                                     headline=(name, t, r) == (*MOE_DECODE_HEADLINE, "random")))
    return out


def moe_check_cases() -> list[Case]:
    """Tiny and odd, for the interpreter: k = 2 of 6 random, k = 1 of 5 zipf, balanced 3 of 4."""
    return [_moe_case("tiny", 32, 24, 6, 2, 13, "random"), _moe_case("tiny", 48, 40, 5, 1, 7, "zipf"),
            _moe_case("tiny", 16, 56, 4, 3, 9, "balanced")]


def moe_decode_check_cases() -> list[Case]:
    """Decode-sized: one token, and three (each of k = 3 of 8 experts)."""
    return [_moe_case("tiny", 32, 24, 6, 2, 1, "random"), _moe_case("tiny", 40, 16, 8, 3, 3, "random")]


@functools.lru_cache(maxsize=16)
def _moe_routing_cpu(t: int, e: int, k: int, routing: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not 1 <= k <= e:
        raise ValueError(f"k = {k} experts per token out of {e}: expected 1 <= k <= E")
    g = torch.Generator().manual_seed(seed)
    expert_perm = torch.randperm(e, generator=g)   # which expert is "first": no structure in the ids
    if routing == "balanced":
        # token t takes slots t'k .. t'k+k-1 (t' = a random permutation of the tokens) modulo E:
        # k consecutive residues are distinct for k <= E, and the T*k slots cover each residue
        # floor or ceil(T*k / E) times -- exactly equal where E divides T*k
        slot = torch.randperm(t, generator=g)[:, None] * k + torch.arange(k)          # (T, k)
        ids = expert_perm[slot % e]
    elif routing == "random":
        ids = torch.rand(t, e, generator=g).topk(k, dim=-1).indices                    # k distinct, uniform
    elif routing == "zipf":
        p = 1.0 / torch.arange(1, e + 1, dtype=torch.float64) ** ZIPF_EXPONENT       # by popularity rank
        prob = torch.empty(e, dtype=torch.float64)
        prob[expert_perm] = p                                                          # expert_perm[0] most popular
        ids = torch.multinomial(prob.expand(t, e), k, replacement=False, generator=g)
    else:
        raise ValueError(f"unknown routing {routing!r}: expected one of {', '.join(MOE_ROUTINGS)}")
    weights = torch.randn(t, k, generator=g).softmax(dim=-1)                           # (T, k) float32
    return ids.to(torch.int32), weights


def make_moe_routing(t: int, e: int, k: int, routing: str, seed: int = MOE_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids (T, k) int32, topk_weights (T, k) float32) on the CPU, the same for a given
    (T, E, k, routing, seed) on every machine: each token's k experts are distinct. ``balanced``:
    every expert gets T*k/E slots (+-1); ``random``: k experts uniformly at random; ``zipf``: k
    experts drawn without replacement with probability proportional to 1/rank^1.2 (ranks a fixed
    random permutation of the experts). Weights: a softmax of N(0, 1) logits over the k choices."""
    ids, w = _moe_routing_cpu(t, e, k, routing, seed)
    return ids.clone(), w.clone()


def moe_active_experts(case: Case) -> int:
    """The experts that get at least one token in the case's routing (their weights must be read)."""
    d = case.dims
    ids, _ = _moe_routing_cpu(d["T"], d["E"], d["k"], d["routing"], MOE_SEED)
    return int(torch.unique(ids).numel())


def _moe_make(case, dtype, device):
    """x ~ N(0, 1); weights N(0, 1/fan_in) (gate/up pre-activations ~N(0, 1), outputs O(1));
    the routing from :func:`make_moe_routing`, made on the CPU and moved."""
    d = case.dims
    t, dm, n, e, k = d["T"], d["d"], d["n"], d["E"], d["k"]
    ids, w = make_moe_routing(t, e, k, d["routing"])
    x = randn((t, dm), dtype, device)
    w_gate_up = randn((e, 2 * n, dm), dtype, device, dm ** -0.5)
    w_down = randn((e, dm, n), dtype, device, n ** -0.5)
    return x, w_gate_up, w_down, w.to(device), ids.to(device)


def moe_reference(x, w_gate_up, w_down, topk_weights, topk_ids):
    """Every expert on every token in float32 (float64 given float64), each token's output the sum
    of its experts' outputs weighted by its routing weight (0 where not routed): E times the work
    of the op, for the tiny check shapes only. Returns float32 (float64)."""
    ct = torch.promote_types(x.dtype, torch.float32)
    x, w_gate_up, w_down, topk_weights = (a.to(ct) for a in (x, w_gate_up, w_down, topk_weights))
    n = w_gate_up.shape[1] // 2
    out = torch.zeros(x.shape, dtype=ct, device=x.device)
    for e in range(w_gate_up.shape[0]):
        we = (topk_weights * (topk_ids == e)).sum(dim=-1)                                # (T,)
        h = x @ w_gate_up[e].T                                                           # (T, 2n)
        out = out + we[:, None] * ((F.silu(h[:, :n]) * h[:, n:]) @ w_down[e].T)          # (T, d)
    return out


def _moe_slots(topk_ids):
    """The (token, choice) slots sorted by expert (stable), and each slot's token."""
    flat = topk_ids.reshape(-1)                                                          # (T*k,)
    order = torch.argsort(flat, stable=True)
    return flat, order, order // topk_ids.shape[1]


def moe_loop(x, w_gate_up, w_down, topk_weights, topk_ids):
    """The per-expert loop in PyTorch (transformers' "eager" experts): slots sorted by expert, one
    host sync for the per-expert counts, then for each expert with tokens: gather them, gate/up
    F.linear, silu(gate) * up, down F.linear, scale by the routing weight, index_add_ into out."""
    e_count = w_gate_up.shape[0]
    flat, order, tok = _moe_slots(topk_ids)
    counts = torch.bincount(flat, minlength=e_count).tolist()                           # the host sync
    w = topk_weights.reshape(-1)
    out = torch.zeros_like(x)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        sl, tk = order[start:start + c], tok[start:start + c]
        start += c
        gate, up = F.linear(x[tk], w_gate_up[e]).chunk(2, dim=-1)                        # (c, n) each
        y = F.linear(F.silu(gate) * up, w_down[e])                                       # (c, d)
        out.index_add_(0, tk, y * w[sl, None].to(y.dtype))
    return out


def moe_grouped_mm(x, w_gate_up, w_down, topk_weights, topk_ids):
    """The torch._grouped_mm pipeline, no host sync: slots sorted by expert (stable argsort), group
    ends by searchsorted on the sorted ids, gather x, one grouped GEMM for gate/up, silu(gate) * up,
    one for down, scale by the routing weight, index_add_ into out. Differentiable (grouped_mm has
    an autograd formula)."""
    e_count = w_gate_up.shape[0]
    flat, order, tok = _moe_slots(topk_ids)
    offs = torch.searchsorted(flat[order], torch.arange(e_count, dtype=flat.dtype, device=flat.device),
                              right=True, out_int32=True)                              # (E,) group ends
    h = torch._grouped_mm(x[tok], w_gate_up.transpose(1, 2), offs=offs)                 # (T*k, 2n)
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, w_down.transpose(1, 2), offs=offs)        # (T*k, d)
    y = y * topk_weights.reshape(-1)[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, tok, y)


def _grouped_mm_peer(x, *rest):
    """The grouped_mm row: declined where torch has no _grouped_mm or off CUDA (there it is a
    fallback loop whose backward also wants 16-byte-aligned strides: not a peer worth timing)."""
    if not hasattr(torch, "_grouped_mm"):
        raise Skipped(f"torch {torch.__version__} has no torch._grouped_mm")
    if x.device.type != "cuda":
        raise Skipped(f"torch._grouped_mm is timed on CUDA only, not {x.device.type}")
    return moe_grouped_mm(x, *rest)


def _graphed(fn: Callable) -> Callable:
    """``fn`` as a serving loop's decode step runs it: captured in a CUDA graph on the first call
    with these inputs (after two eager warm-up calls on a side stream), replayed on every later
    call, returning the captured output. Host time is then one replay; only the latest inputs'
    graph is kept. Declined off CUDA."""
    held: dict = {}

    def call(*args):
        key = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
        if held.get("key") != key:
            if not isinstance(args[0], torch.Tensor) or args[0].device.type != "cuda":
                raise Skipped("CUDA graphs need a CUDA device")
            held.clear()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(side):
                for _ in range(2):
                    fn(*args)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph):
                out = fn(*args)
            held.update(key=key, graph=graph, out=out)
        held["graph"].replay()
        return held["out"]
    return call


def _liger_moe(cls):
    return lambda x, w1, w2, tw, ti: cls.apply(x, w1, w2, ti.to(torch.int32), tw)


def moe_flops(case: Case, mode: str) -> int:
    """Three GEMMs of 2*d*n FLOPs per routed token forward (gate, up, down): 6*T*k*d*n; the
    backward twice that (dx and dW of each); no padding counted."""
    d = case.dims
    f = 6 * d["T"] * d["k"] * d["d"] * d["n"]
    return _by_mode(f, 2 * f)(mode)


def moe_bytes(case: Case, mode: str, s: int) -> int:
    """fwd: the weights of the experts that get a token, read once (3*E_active*d*n*s), x read, out
    written, the routing read (8*T*k: int32 ids, fp32 weights). bwd: those weights read again, dW
    written for all E experts (3*E*d*n*s), x and dy read, dx written, the routing read and
    d(topk_weights) written (4*T*k)."""
    d = case.dims
    t, dm, n, e, k = d["T"], d["d"], d["n"], d["E"], d["k"]
    weights_read = 3 * moe_active_experts(case) * dm * n * s
    fwd = weights_read + 2 * t * dm * s + 8 * t * k
    bwd = weights_read + 3 * e * dm * n * s + 3 * t * dm * s + 12 * t * k
    return _by_mode(fwd, bwd)(mode)


MOE_NOTES = (
    "x (T, d) through E SwiGLU experts, w_gate_up (E, 2n, d) (gate rows, then up: the transformers v5 / "
    "Liger layout), w_down (E, d, n); each token to k distinct experts, topk_ids int32, topk_weights fp32; "
    "out[t] = sum_j w[t, j] * down(silu(gate(x[t])) * up(x[t])). Routing made on the CPU with a fixed seed "
    "(every device times the same assignment): balanced = a random token order dealt round-robin, every "
    "expert T*k/E slots; random = k distinct experts uniformly (topk of uniform noise); zipf = k distinct "
    "experts drawn with probability proportional to 1/rank^1.2 (a fixed random ranking of the experts); "
    "weights a softmax of N(0, 1) logits over the k. FLOPs 6*T*k*d*n forward (three GEMMs of 2*d*n per "
    "routed token), 12*T*k*d*n backward, 18*T*k*d*n fwd+bwd, no padding counted. Bytes: the active "
    "experts' weights read once (3*E_active*d*n*s, E_active counted on the routing), x read, out written, "
    "the routing read; the backward adds dW written for all E experts, x and dy read, dx written. "
    "eager = the per-expert loop (transformers' 'eager' experts: slots sorted by expert, one host sync "
    "for the counts, then per expert gather, F.linear gate/up, silu * up, F.linear down, weighted "
    "index_add_; PERF.md's 'PyTorch eager' column); no compile peer (the loop's shapes come from the "
    "routing, through a host sync: a graph per expert size); grouped_mm = the torch._grouped_mm pipeline "
    "(stable argsort, searchsorted group ends, gather, grouped GEMM gate/up, silu * up, grouped GEMM down, "
    "weighted index_add_; no host sync), CUDA only; liger = LigerFusedMoEFunction (same layout). "
    "extra GiB: each row's extra peak memory; the bar is ours <= grouped_mm's")


# ----------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------
def _one(fname: str, call: Callable[[Callable], Callable]):
    """ours_fn for a single implementation named "warpforge"."""
    return lambda get: {"warpforge": call(get(fname))}


def cuda_backend_available() -> bool:
    """Whether the CUDA C++ backend (warpforge.cuda) can run here: its rows are timed only then."""
    try:
        from warpforge import cuda
    except Exception:  # noqa: BLE001
        return False
    return cuda.available()


def _with_cuda(fname: str, call: Callable[[Callable], Callable], variants: tuple[str, ...] = ()):
    """ours_fn: "warpforge" (Triton) plus, where the CUDA backend can run, "warpforge[cuda]" (and
    "warpforge[cuda:<variant>]" for each named variant), the same public function with backend="cuda"."""
    def ours(get):
        f = get(fname)
        rows = {"warpforge": call(f)}
        if cuda_backend_available():
            rows["warpforge[cuda]"] = call(lambda *a, **k: f(*a, **k, backend="cuda"))
            for v in variants:
                rows[f"warpforge[cuda:{v}]"] = call(lambda *a, _v=v, **k: f(*a, **k, variant=_v, backend="cuda"))
        return rows
    return ours


WORKLOADS: dict[str, Workload] = {}


def _register(w: Workload) -> None:
    WORKLOADS[w.name] = w


_register(Workload(
    name="add", module="warpforge.ops.add",
    cases=add_cases, check_cases=add_check_cases, make=_add_make, grad_args=(0, 1),
    ours_fn=lambda get: {
        "warpforge[naive]": (lambda f: lambda a, b: f(a, b, variant="naive"))(get("add")),
        **_with_cuda("add", lambda f: lambda a, b: f(a, b), variants=("naive",))(get),
    },
    eager=lambda a, b: torch.add(a, b),
    bytes_fn=lambda c, m, s: 3 * c.dims["n"] * s,
    flops_fn=lambda c, m: c.dims["n"],
    modes=("fwd",), notes="timed forward only: its backward is dy passed through",
))
_register(Workload(
    name="sum", module="warpforge.ops.reduce",
    cases=row_cases, check_cases=row_check_cases, make=_row_x, grad_args=(0,),
    ours_fn=_with_cuda("sum", lambda f: lambda x: f(x, -1)),
    eager=lambda x: torch.sum(x, -1),
    bytes_fn=reduce_bytes, flops_fn=per_element_flops(1, 0),
    modes=("fwd",), notes="timed forward only: its backward is an expand of dy",
))
_register(Workload(
    name="amax", module="warpforge.ops.reduce",
    cases=row_cases, check_cases=row_check_cases, make=_row_x, grad_args=(0,),
    ours_fn=_with_cuda("amax", lambda f: lambda x: f(x, -1)),
    eager=lambda x: torch.amax(x, -1),
    bytes_fn=reduce_bytes, flops_fn=per_element_flops(1, 2),
))
_register(Workload(
    name="softmax", module="warpforge.ops.softmax",
    cases=softmax_cases, check_cases=row_check_cases, make=_row_x, grad_args=(0,),
    ours_fn=_with_cuda("softmax", lambda f: lambda x: f(x, -1)),
    eager=lambda x: F.softmax(x, -1),
    liger=("liger_kernel.ops.softmax", "LigerSoftmaxFunction", lambda cls: lambda x: cls.apply(x)),
    bytes_fn=row_bytes(), flops_fn=per_element_flops(5, 4),
    reference=_softmax_reference(False),
))
_register(Workload(
    name="log_softmax", module="warpforge.ops.softmax",
    cases=row_cases, check_cases=row_check_cases, make=_row_x, grad_args=(0,),
    ours_fn=_with_cuda("log_softmax", lambda f: lambda x: f(x, -1)),
    eager=lambda x: F.log_softmax(x, -1),
    bytes_fn=row_bytes(), flops_fn=per_element_flops(5, 3),
    reference=_softmax_reference(True),
))
_register(Workload(
    name="layer_norm", module="warpforge.ops.norms",
    cases=row_cases, check_cases=row_check_cases, make=_row_x_w_b, grad_args=(0, 1, 2),
    ours_fn=_one("layer_norm", lambda f: lambda x, w, b: f(x, x.shape[-1:], w, b, LN_EPS)),
    eager=lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, LN_EPS),
    liger=("liger_kernel.ops.layer_norm", "LigerLayerNormFunction",
           lambda cls: lambda x, w, b: cls.apply(x, w, b, LN_EPS)),
    bytes_fn=row_bytes(weights=2, bwd_weights_read=1), flops_fn=per_element_flops(8, 12),
))
_register(Workload(
    name="rms_norm", module="warpforge.ops.norms",
    cases=row_cases, check_cases=row_check_cases, make=_row_x_w, grad_args=(0, 1),
    ours_fn=_one("rms_norm", lambda f: lambda x, w: f(x, x.shape[-1:], w, RMS_EPS)),
    eager=lambda x, w: F.rms_norm(x, x.shape[-1:], w, RMS_EPS),
    # casting "gemma" (everything in fp32) is also our default; in_place=False: ours never
    # overwrites dy, and an in-place backward would change dy between timed repetitions
    liger=("liger_kernel.ops.rms_norm", "LigerRMSNormFunction",
           lambda cls: lambda x, w: cls.apply(x, w, RMS_EPS, 0.0, "gemma", False)),
    bytes_fn=row_bytes(weights=1), flops_fn=per_element_flops(4, 8),
))
_register(Workload(
    name="add_rms_norm", module="warpforge.ops.norms",
    cases=row_cases, check_cases=row_check_cases, make=_row_x_r_w, grad_args=(0, 1, 2),
    ours_fn=_one("add_rms_norm", lambda f: lambda x, r, w: f(x, r, w, RMS_EPS)),
    eager=_eager_add_rms_norm,
    liger=("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction",
           lambda cls: lambda x, r, w: cls.apply(x, r, w, RMS_EPS, 0.0, "gemma", False)),
    bytes_fn=row_bytes(weights=1, fwd_tensors=4, bwd_tensors=4), flops_fn=per_element_flops(5, 9),
))
_register(Workload(
    name="swiglu", module="warpforge.ops.activations",
    cases=glu_cases, check_cases=row_check_cases, make=_glu_make, grad_args=(0, 1),
    ours_fn=_one("swiglu", lambda f: lambda g, u: f(g, u)),
    eager=lambda g, u: F.silu(g) * u,
    liger=("liger_kernel.ops.swiglu", "LigerSiLUMulFunction", lambda cls: lambda g, u: cls.apply(g, u)),
    bytes_fn=row_bytes(fwd_tensors=3, bwd_tensors=5), flops_fn=per_element_flops(5, 9),
))
_register(Workload(
    name="geglu", module="warpforge.ops.activations",
    cases=glu_cases, check_cases=row_check_cases, make=_glu_make, grad_args=(0, 1),
    ours_fn=_one("geglu", lambda f: lambda g, u: f(g, u, approximate="tanh")),
    eager=lambda g, u: F.gelu(g, approximate="tanh") * u,
    liger=("liger_kernel.ops.geglu", "LigerGELUMulFunction", lambda cls: lambda g, u: cls.apply(g, u)),
    bytes_fn=row_bytes(fwd_tensors=3, bwd_tensors=5), flops_fn=per_element_flops(10, 18),
))
_register(Workload(
    name="rope", module="warpforge.ops.rope",
    cases=rope_cases, check_cases=rope_check_cases, make=_rope_make, grad_args=(0, 1),
    ours_fn=_one("apply_rope", lambda f: lambda q, k, cos, sin, pos: f(q, k, cos, sin, position_ids=pos)),
    eager=_eager_rope,
    liger=("liger_kernel.ops.rope", "LigerRopeFunction", _liger_rope),
    bytes_fn=rope_bytes, flops_fn=rope_flops,
))


_register(Workload(
    name="matmul", module="warpforge.ops.matmul",
    cases=gemm_cases, check_cases=gemm_check_cases, make=_gemm_make, grad_args=(0, 1),
    ours_fn=lambda get: {
        "warpforge": (lambda f: lambda a, w: f(a, w.T))(get("matmul")),
        **{f"warpforge[{v}]": (lambda f, v: lambda a, w: f(a, w.T, variant=v))(get("matmul"), v)
           for v in MATMUL_LADDER},
        **{k: v for k, v in _with_cuda("matmul", lambda f: lambda a, w: f(a, _row_major_t(w)),
                                       variants=CUDA_MATMUL_LADDER)(get).items() if k != "warpforge"},
    },
    eager=lambda a, w: torch.matmul(a, w.T),
    bytes_fn=gemm_bytes, flops_fn=gemm_flops, modes=("fwd", "bwd"),
    variant_cases=lambda c: c.dims.get("ladder", False),
    notes="A (M, K) @ W^T with W (N, K) row-major, a linear layer's layout; bwd = dA and dW; "
          "the named variants (the ladder) run on 4096^3 and 16x4096x4096 only; the CUDA C++ rows "
          "(warpforge[cuda:*]) read B = W^T row-major, transposed once outside the timing",
    device_rounds=GEMM_ROUNDS, rounds_for_variants=False,
))
_register(Workload(
    name="matmul_bwd", module="warpforge.ops.matmul",
    cases=gemm_bwd_cases, check_cases=gemm_check_cases, make=_gemm_bwd_make, grad_args=(),
    ours_fn=_one("matmul", lambda f: lambda x, w, dy: (f(dy, w), f(dy.T, x))),
    eager=lambda x, w, dy: (torch.matmul(dy, w), torch.matmul(dy.T, x)),
    bytes_fn=lambda c, m, s: gemm_bytes(c, "bwd", s), flops_fn=lambda c, m: gemm_flops(c, "bwd"),
    modes=("fwd",),
    notes="a linear layer's backward GEMMs called directly, dX = dY @ W and dW = dY^T @ X (row "
          "'fwd' is the pair): the kernels against cuBLAS without the autograd engine's per-node cost",
    device_rounds=GEMM_ROUNDS,
))
_register(Workload(
    name="linear_gelu", module="warpforge.ops.matmul",
    cases=linear_act_cases, check_cases=gemm_check_cases, make=_linear_make, grad_args=(0, 1, 2),
    ours_fn=_one("linear", lambda f: lambda x, w, b: f(x, w, b, "gelu_tanh")),
    eager=lambda x, w, b: F.gelu(torch.matmul(x, w.T) + b, approximate="tanh"),
    peers=lambda: {"torch[linear]": lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh")},
    bytes_fn=linear_act_bytes, flops_fn=lambda c, m: 2 * c.dims["M"] * c.dims["N"] * c.dims["K"],
    modes=("fwd",),
    notes="gelu(x @ W^T + b): timed forward (the fused-epilogue bar). eager is the issue's baseline, "
          "matmul then the bias add then GELU (three kernels); torch[linear] is F.linear then GELU, "
          "the bias inside cuBLAS's epilogue (two kernels), a named peer",
    device_rounds=GEMM_ROUNDS,
))
_register(Workload(
    name="fp8_matmul", module="warpforge.ops.fp8",
    cases=fp8_cases, check_cases=gemm_check_cases, make=_fp8_make, grad_args=(),
    ours_fn=lambda get: {
        "warpforge": (lambda f: lambda a8, w8, sa, sw, a, w: f(a8, w8.T, sa, sw, out_dtype=torch.bfloat16))(
            get("scaled_matmul")),
        "warpforge[bf16]": (lambda f: lambda a8, w8, sa, sw, a, w: f(a, w.T))(get("matmul")),
    },
    eager=lambda a8, w8, sa, sw, a, w: torch._scaled_mm(a8, w8.T, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16),
    reference=_fp8_reference,
    bytes_fn=lambda c, m, s: (c.dims["M"] * c.dims["K"] + c.dims["N"] * c.dims["K"]) + 2 * c.dims["M"] * c.dims["N"],
    flops_fn=lambda c, m: 2 * c.dims["M"] * c.dims["N"] * c.dims["K"],
    modes=("fwd",), only_dtypes=(torch.bfloat16,),
    notes="e4m3 operands with per-tensor scales, bf16 out; eager = torch._scaled_mm (cuBLASLt fp8); "
          "warpforge[bf16] is our bf16 matmul on the same problem; % roof is against the bf16 GEMM rate",
    device_rounds=GEMM_ROUNDS,
))


_register(Workload(
    name="cross_entropy", module="warpforge.ops.cross_entropy",
    cases=ce_cases, check_cases=ce_check_cases, make=_ce_make, grad_args=(0,),
    ours_fn=_one("cross_entropy", lambda f: lambda x, t: f(x, t)),
    eager=lambda x, t: F.cross_entropy(x.float(), t),
    reference=lambda x, t: F.cross_entropy(x, t),
    liger=("liger_kernel.ops.cross_entropy", "LigerCrossEntropyFunction",
           lambda cls: lambda x, t: cls.apply(x, t, None)[0]),
    liger_writes_inputs=True, measure_memory=True,
    bytes_fn=ce_bytes, flops_fn=ce_flops, modes=("fwd", "fwd+bwd"),
    notes=CE_NOTES + "; eager upcasts the logits to fp32 first (the Hugging Face convention), so its "
          "time and memory include that copy; Liger writes dlogits over its input logits, so it runs on "
          "a private copy of them (after its first fwd+bwd call it computes on that gradient: its time "
          "does not depend on the values)",
))
_register(Workload(
    name="linear_cross_entropy", module="warpforge.ops.cross_entropy",
    cases=lce_cases, check_cases=lce_check_cases, make=_lce_make, grad_args=(0, 1),
    ours_fn=_one("linear_cross_entropy", lambda f: lambda h, w, t: f(h, w, t)),
    eager=lambda h, w, t: F.cross_entropy((h @ w.T).float(), t),
    reference=lambda h, w, t: F.cross_entropy(h @ w.T, t),
    liger=("liger_kernel.ops.fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyFunction",
           lambda cls: lambda h, w, t: cls.apply(h, w, t)[0]),
    references=(Reference("cublas_gemms", _cublas_gemms,
                          notes="fwd: h @ W^T; fwd+bwd: that and dh = dlogits @ W, dW = dlogits^T @ h"),),
    measure_memory=True,
    bytes_fn=lce_bytes, flops_fn=lce_flops, modes=("fwd", "fwd+bwd"),
    notes=CE_NOTES + "; LM head hidden (T, H) @ W^T, W (V, H); eager materialises the logits and upcasts "
          "them to fp32 (Hugging Face); reference row cublas_gemms: the GEMMs alone (fwd: the logits; "
          "fwd+bwd: also dh and dW), the bar is time / ref <= 1.1 and extra peak memory <= 1.5 GiB",
))

_register(Workload(
    name="attention", module="warpforge.ops.attention",
    cases=attention_cases, check_cases=attention_check_cases, make=_attn_make, grad_args=(0, 1, 2),
    ours_fn=_one("scaled_dot_product_attention",
                 lambda f: lambda q, k, v, causal, gqa: f(q, k, v, is_causal=causal, enable_gqa=gqa)),
    eager=_sdpa, reference=attention_reference,
    peers=sdpa_peers(_sdpa, math_max_s=MATH_MAX_S), compile_peer=False,
    bytes_fn=attention_bytes, flops_fn=attention_flops, only_dtypes=(torch.bfloat16, torch.float16),
    notes="q, k, v (B, H, S, D); " + SDPA_PEER_NOTES + f"; sdpa[math] is skipped past S = {MATH_MAX_S} (it "
          "materialises B*H*S^2 scores); FLOPs 4*B*Hq*S^2*D forward (half causal), backward 2.5x; the "
          "sweep is 16k tokens at hidden 2048 (B = 16384 / S, H = 2048 / D), plus the bar shape B4 H32 "
          "S4096 D128 and GQA 32/8 heads at it",
))
_register(Workload(
    name="attention_dropout", module="warpforge.ops.attention",
    cases=attention_dropout_cases, check_cases=attention_check_cases, make=_attn_dropout_make, grad_args=(0, 1, 2),
    ours_fn=_attn_dropout_ours, eager=_sdpa_dropout, reference=attention_dropout_reference,
    peers=sdpa_peers(_sdpa_dropout, math_max_s=MATH_MAX_S), compile_peer=False, stochastic=True,
    bytes_fn=attention_bytes, flops_fn=attention_flops, only_dtypes=(torch.bfloat16, torch.float16),
    notes=f"attention with dropout_p = {ATTN_DROPOUT}, as the attention workload otherwise (q, k, v (B, H, S, D), "
          "the same FLOP and byte models); ours draws its mask in the kernels from a Philox key (its generator "
          "restarted each call, host only), SDPA's backends from torch's generator; " + SDPA_PEER_NOTES,
))
_register(Workload(
    name="attention_softcap", module="warpforge.ops.attention",
    cases=attention_softcap_cases, check_cases=attention_softcap_check_cases, make=_attn_softcap_make,
    grad_args=(0, 1, 2),
    ours_fn=_one("scaled_dot_product_attention",
                 lambda f: lambda q, k, v, causal, gqa, cap: f(q, k, v, is_causal=causal, enable_gqa=gqa, softcap=cap)),
    eager=softcap_attention_eager, reference=softcap_attention_reference,
    peers=lambda: {"flex_attention": Peer(_flex_softcap, context=_flex_retainable)},
    bytes_fn=attention_bytes, flops_fn=attention_flops, only_dtypes=(torch.bfloat16, torch.float16),
    notes=f"Gemma 2's attention logit soft cap ({GEMMA2_SOFTCAP:g}: scores capped to cap * tanh(s / cap) before the "
          "causal mask), q, k, v (B, H, S, D) as the attention workload (the same FLOP and byte models); SDPA has "
          "no cap, so the peers are Hugging Face's eager Gemma 2 attention (kv heads repeated, scores materialised, "
          "a float32 softmax), its torch.compile, and flex_attention (compiled, "
          "the cap as its score_mod, the causal block mask built once a shape, outside the timing)",
))
_register(Workload(
    name="decode_attention", module="warpforge.ops.decode_attention",
    cases=decode_cases, check_cases=decode_check_cases, make=_decode_make, grad_args=(),
    ours_fn=_decode_ours, eager=_sdpa_decode, reference=decode_reference,
    peers=sdpa_peers(_sdpa_decode), compile_peer=False,
    bytes_fn=decode_bytes, flops_fn=decode_flops, modes=("fwd",), only_dtypes=(torch.bfloat16, torch.float16),
    notes="one query token per sequence over a paged KV cache (block table a random permutation of the "
          "pool, every sequence ctx long); warpforge = validate=False, the serving path (no host sync), "
          "warpforge[validated] = the default (checks block_table/seq_lens on the host); the peers run on "
          "the same values unpaged, q (B, Hq, 1, D), k/v (B, Hkv, ctx, D), enable_gqa=True; " + SDPA_PEER_NOTES
          + "; bytes: the KV read (2*B*ctx*Hkv*D*s) plus q and out; forward only",
))

_register(Workload(
    name="decode_attention_fp8", module="warpforge.ops.decode_attention",
    cases=decode_cases, check_cases=decode_check_cases, make=_decode_fp8_make, grad_args=(),
    ours_fn=_decode_fp8_ours, eager=_sdpa_decode, reference=decode_reference,
    peers=sdpa_peers(_sdpa_decode), compile_peer=False,
    bytes_fn=functools.partial(decode_bytes, kv_s=1), flops_fn=decode_flops, modes=("fwd",), only_dtypes=(torch.bfloat16, torch.float16),
    notes="decode_attention over fp8 caches (float8_e4m3fn, one power-of-two k_scale and v_scale; vLLM's "
          "kv_cache_dtype='fp8'), validate=False; the problem and block table as in decode_attention; no peer "
          "here reads an fp8 cache, so the peers run the same attention on the dequantised values (exact in "
          "q's dtype: the scales are powers of two), unpaged, q (B, Hq, 1, D), k/v (B, Hkv, ctx, D), "
          "enable_gqa=True -- the ratio is what storing the cache in fp8 buys against the best 16-bit kernel; "
          + SDPA_PEER_NOTES + "; bytes: the KV read at 1 byte an element (B*ctx*Hkv*D*2) plus q and out; "
          "forward only",
))

_register(Workload(
    name="decode_attention_window", module="warpforge.ops.decode_attention",
    cases=decode_window_cases, check_cases=decode_window_check_cases, make=_decode_window_make, grad_args=(),
    ours_fn=_decode_window_ours, eager=_sdpa_decode, reference=decode_reference,
    peers=sdpa_peers(_sdpa_decode), compile_peer=False,
    bytes_fn=decode_bytes, flops_fn=decode_flops, modes=("fwd",), only_dtypes=(torch.bfloat16, torch.float16),
    notes="decode_attention with a sliding window (window_size=(window - 1, 0): the last window keys of a ctx-long "
          "paged sequence; Mistral-7B's 4,096, gpt-oss's 128), validate=False; block table a random permutation "
          "of the pool as in decode_attention; the peers run SDPA on the window's keys alone, unpaged and "
          "contiguous, q (B, Hq, 1, D), k/v (B, Hkv, window, D), enable_gqa=True; " + SDPA_PEER_NOTES
          + "; bytes: the window's KV read (2*B*window*Hkv*D*s) plus q and out; forward only",
))


_register(Workload(
    name="moe", module="warpforge.ops.moe",
    cases=moe_cases, check_cases=moe_check_cases, make=_moe_make, grad_args=(0, 1, 2, 3),
    ours_fn=_one("moe_experts", lambda f: lambda x, w1, w2, tw, ti: f(x, w1, w2, tw, ti, validate=False)),
    eager=moe_loop, reference=moe_reference,
    peers=lambda: {"grouped_mm": _grouped_mm_peer}, compile_peer=False,
    liger=("liger_kernel.ops.fused_moe", "LigerFusedMoEFunction", _liger_moe),
    measure_memory=True, bytes_fn=moe_bytes, flops_fn=moe_flops, only_dtypes=(torch.bfloat16,),
    notes=MOE_NOTES + "; warpforge runs with validate=False (no host check of the ids, like the peers); bwd: dx, dW_gate_up, dW_down and d(topk_weights)",
))
_register(Workload(
    name="moe_decode", module="warpforge.ops.moe",
    cases=moe_decode_cases, check_cases=moe_decode_check_cases, make=_moe_make, grad_args=(0, 1, 2, 3),
    ours_fn=lambda get: {
        "warpforge": (lambda f: lambda x, w1, w2, tw, ti: f(x, w1, w2, tw, ti, validate=False))(get("moe_experts")),
        "warpforge[validated]": get("moe_experts"),
        "warpforge[graph]": _graphed((lambda f: lambda x, w1, w2, tw, ti: f(x, w1, w2, tw, ti, validate=False))(
            get("moe_experts")))},
    eager=moe_loop, reference=moe_reference,
    peers=lambda: {"grouped_mm": _grouped_mm_peer, "grouped_mm[graph]": _graphed(_grouped_mm_peer)},
    compile_peer=False,
    liger=("liger_kernel.ops.fused_moe", "LigerFusedMoEFunction", _liger_moe),
    measure_memory=True, bytes_fn=moe_bytes, flops_fn=moe_flops, only_dtypes=(torch.bfloat16,),
    modes=("fwd",),
    notes="the moe workload at decode batches (T 1 to 256 tokens; balanced, random and zipf routing from T 8), "
          "forward only (a "
          "warpforge = validate=False, warpforge[validated] = the default: one host check of the ids; "
          "[graph] rows = the same call captured once in a CUDA graph and replayed, as a serving loop runs "
          "a decode step: their host us is the latency of one step; "
          "workload of its own: a case cannot restrict the modes); bound by the bytes of the active experts' "
          "weights (the T*k slots touch at most min(E, T*k) experts; the byte model counts them on the "
          "routing), so GB/s against the copy roof is the figure; " + MOE_NOTES,
))



def get(names: list[str] | None) -> list[Workload]:
    """Workloads by name, in registry order; ValueError naming the known ones for an unknown name."""
    if not names:
        return list(WORKLOADS.values())
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown op{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}; "
                         f"known: {', '.join(WORKLOADS)}")
    return [WORKLOADS[n] for n in dict.fromkeys(names)]
