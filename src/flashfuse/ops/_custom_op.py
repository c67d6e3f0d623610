"""One op, two entry points: a torch.library custom op for torch.compile, a direct path for eager calls.

Every flashfuse op is registered with torch.library (a fake implementation, and autograd), so that
torch.compile sees one opaque op and never a graph break. Called eagerly, though, a custom op pays for the
dispatcher, its autograd wrapper and a dynamo-disable guard on every call: about 100 us per forward +
backward of Python on top of the kernel launches (measured on the CPU with the kernels stubbed out). On an
H200 that is more than the kernels of a (16384, 4096) RMSNorm take (65 us forward, 110 us backward), so
the benchmark saw the op run at a third of its kernels' speed.

``FlashfuseOp`` therefore registers the custom op and also builds a plain ``torch.autograd.Function`` from
the very same three functions (implementation, ``setup_context``, ``backward``): an eager call on plain
tensors runs the implementation directly (through that Function when a gradient is needed); anything
being traced (torch.compile, export, fake or functional tensor subclasses, vmap, a dispatch mode) goes
through the custom op. Forward-mode AD (jvp) is supported by neither path.
Both paths run the same code, and the tests run both (eager, and torch.compile with ``aot_eager``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

_PLAIN = (torch.Tensor, torch.nn.Parameter)


_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def _tracing(args) -> bool:
    """Whether the call must go through the custom op: torch.compile, a tensor subclass (fake, functional),
    a functorch transform (vmap's batched tensors: the custom op has a vmap fallback, the kernels do not) or
    an active Python dispatch mode (FlopCounterMode, selective-checkpoint policies see the op by name)."""
    if torch.compiler.is_compiling() or _current_dispatch_mode() is not None:
        return True
    for a in args:
        if isinstance(a, torch.Tensor) and (type(a) not in _PLAIN or _functorch_wrapped(a)):
            return True
    return False


def _requires_grad(args) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


class FlashfuseOp:
    """``FlashfuseOp(name, impl, fake=..., setup_context=..., backward=...)(*args)``.

    ``impl(*args)`` takes the op's arguments positionally (its annotations are the custom op's schema) and
    returns a tensor or a tuple of tensors; ``fake`` is the register_fake function; ``setup_context(ctx,
    inputs, output)`` and ``backward(ctx, *grads)`` are what ``torch.library.register_autograd`` takes (they
    must use only the ctx API shared with autograd.Function: save_for_backward, saved_tensors,
    needs_input_grad, mark_non_differentiable, attributes). Gradients of outputs that took no part in the
    loss arrive as zeros on both paths (autograd materializes them).
    """

    def __init__(self, name: str, impl: Callable, *, fake: Callable, setup_context: Callable | None = None,
                 backward: Callable | None = None):
        self.name, self.impl = name, impl
        self.custom_op = torch.library.custom_op(name, impl, mutates_args=())
        self.custom_op.register_fake(fake)
        self.function = None
        if backward is not None:
            self.custom_op.register_autograd(backward, setup_context=setup_context)
            self.function = _autograd_function(name, impl, setup_context, backward)

    def __call__(self, *args):
        if _tracing(args):
            return self.custom_op(*args)
        if torch.is_grad_enabled() and _requires_grad(args):
            if self.function is None:
                # An op without a backward, inside a backward run with create_graph=True: the custom op
                # attaches a node that raises if anything differentiates through its outputs; impl alone
                # would return outputs that silently drop those second-order terms.
                return self.custom_op(*args)
            return self.function.apply(*args)
        return self.impl(*args)


def _autograd_function(name: str, impl, setup_context, backward) -> type:
    def forward(ctx, *args):
        out = impl(*args)
        setup_context(ctx, args, out)
        return out

    def backward_(ctx, *grads):
        return backward(ctx, *grads)

    return type(name.replace("::", "_") + "_eager", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward_)})
