"""Operator registration: one place that turns a launcher into a real PyTorch operator.

Every warpforge operator is a ``torch.library.custom_op`` in the ``warpforge`` namespace with a fake
(meta) implementation and, where differentiable, an autograd formula. That is what makes it work
under ``torch.compile(fullgraph=True)`` (the compiler sees an opaque node whose output shapes come
from the fake) and pass ``torch.library.opcheck``.

The dispatcher costs tens of microseconds of Python per call in eager mode, more than a small
kernel takes on the GPU. So an :class:`Op` has two doors:

- eager, real tensors: call the launcher directly, wrapped in a ``torch.autograd.Function`` built
  from the *same* ``setup_context``/``backward`` the operator registers (so both doors compute the
  same gradients with the same kernels);
- anything else (``torch.compile`` tracing, fake or functional tensors, ``torch.ops.warpforge.*``):
  the registered operator. So do eager calls of an operator without an autograd formula (the
  ``*_backward`` operators) whose inputs require grad -- inside a create_graph backward: its output
  then carries the node that raises on a second backward, instead of being a silent constant.

Set ``WARPFORGE_EAGER_DISPATCH=1`` (or ``warpforge.runtime.registry.FAST_EAGER = False``) to send
eager calls through the dispatcher too; ``warpforge bench`` times both doors.
"""
from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable

import torch

NAMESPACE = "warpforge"
FAST_EAGER = os.environ.get("WARPFORGE_EAGER_DISPATCH", "0") != "1"

REGISTRY: dict[str, "Op"] = {}

_DISPATCH = threading.local()


def dispatched() -> bool:
    """Whether the running operator was called through the dispatcher (torch.compile's graphs,
    ``torch.ops.warpforge.*``, the dispatch door) rather than the eager door. Launchers that keep
    device buffers across calls allocate per call then: under torch.compile(mode="reduce-overhead")
    the CUDA graph trees' warm-up runs allocate from the graphs' private pool, and a buffer kept from
    there is a live allocation the trees do not track (they refuse it)."""
    return getattr(_DISPATCH, "depth", 0) > 0


def may_keep_buffers(device: torch.device) -> bool:
    """Whether a launcher may keep a device buffer across calls (made once, reused): not on a CUDA
    device while a CUDA graph captures (the buffer's fill would run only when that graph replays,
    and graphs would share it) nor on the dispatcher door (:func:`dispatched`)."""
    return device.type != "cuda" or not (dispatched() or torch.cuda.is_current_stream_capturing())


def _marked(impl: Callable) -> Callable:
    """``impl`` as the registered operator runs it: :func:`dispatched` is True inside."""
    @functools.wraps(impl)
    def run(*args, **kwargs):
        _DISPATCH.depth = getattr(_DISPATCH, "depth", 0) + 1
        try:
            return impl(*args, **kwargs)
        finally:
            _DISPATCH.depth -= 1
    # the schema is inferred from the signature: resolved in impl's module (its annotations are
    # strings under ``from __future__ import annotations``, and this module lacks their names)
    run.__signature__ = inspect.signature(impl, eval_str=True)
    del run.__wrapped__
    return run


def _eager_function(name: str, impl: Callable, setup_context: Callable, backward: Callable):
    """A ``torch.autograd.Function`` running ``impl`` with the operator's own autograd formula.

    Written in the ctx-in-forward style on purpose: a Function with a separate ``setup_context``
    re-binds its arguments through ``inspect.signature`` on every call, ~15 us of host time
    (measured on an H200 host, benchmarks/NOTES.md)."""

    def forward(ctx, *args):
        out = impl(*args)
        setup_context(ctx, args, out)
        return out

    return type(f"{name}_autograd", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def eager_door(t) -> bool:
    """Whether a call whose first tensor is ``t`` takes the direct eager door: the door is on
    (:data:`FAST_EAGER`), ``t`` is a plain tensor (type() is exact on purpose: FakeTensor and
    FunctionalTensor are subclasses and must take the operator door), not on the meta device (the
    checks accept meta tensors for shape inference; the operator door answers them with the fake
    implementation, where the eager door launched a kernel on them) and Dynamo is not tracing."""
    return FAST_EAGER and type(t) is torch.Tensor and not t.is_meta and not torch.compiler.is_compiling()


class Op:
    """A custom operator ``warpforge::<name>`` with a fast eager path.

    ``impl`` is the launcher (type-annotated: the schema is inferred from it), ``fake`` computes
    output metadata only. ``backward(ctx, *grads)`` and ``setup_context(ctx, inputs, output)`` follow
    ``torch.library.register_autograd``; they are also used verbatim by the eager autograd path.
    ``mutates_args`` names the arguments the operator writes in place (e.g. a KV cache); such an
    operator returns None and its fake does too.
    """

    def __init__(self, name: str, impl: Callable, fake: Callable, *,
                 backward: Callable | None = None, setup_context: Callable | None = None,
                 mutates_args: tuple[str, ...] = ()) -> None:
        self.name = name
        self.impl = impl
        self._mutates = bool(mutates_args)
        self.op = torch.library.custom_op(f"{NAMESPACE}::{name}", _marked(impl), mutates_args=tuple(mutates_args))
        self.op.register_fake(fake)
        self._function = None
        if backward is not None:
            self.op.register_autograd(backward, setup_context=setup_context)
            self._function = _eager_function(name, impl, setup_context, backward)
        REGISTRY[name] = self

    @property
    def overload(self) -> torch._ops.OpOverload:
        """``torch.ops.warpforge.<name>.default``, e.g. for ``torch.library.opcheck``."""
        return getattr(getattr(torch.ops, NAMESPACE), self.name).default

    def __call__(self, *args):
        t = args[0]
        if not torch.compiler.is_compiling() and type(t) is torch.Tensor and t.is_cuda \
                and t.get_device() != torch._C._cuda_getDevice():
            # the launchers compile, look up plans and launch on the current device's stream: run
            # with the tensors' device current, as PyTorch's own CUDA ops do (a cuda:1 call while
            # cuda:0 is current failed inside the launch, tests/ops/test_two_gpus.py)
            with torch.cuda.device(t.device):
                return self._call(*args)
        return self._call(*args)

    def _call(self, *args):
        if eager_door(args[0]):
            if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                if self._function is not None:
                    return self._function.apply(*args)
                if not self._mutates:
                    # no autograd formula (the *_backward ops, decode): the registered operator, whose
                    # output carries a node that raises on backward ("no autograd formula was
                    # registered"). Called directly, the launcher's output had no grad_fn, so a
                    # double backward (create_graph=True, then a backward through these gradients)
                    # silently lost every second-order term through the op
                    return self.op(*args)
            return self.impl(*args)
        return self.op(*args)
