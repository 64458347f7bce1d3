"""Modules that round what flows through a network: :class:`Quantizer` and :func:`quantizer`."""

from __future__ import annotations

import torch

from .formats import FloatFormat
from .ops import cast
from .rounding import Rounding

__all__ = ["Quantizer", "quantizer"]


class _Quantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd, bwd, fwd_rounding, bwd_rounding, saturate):
        ctx.bwd, ctx.bwd_rounding, ctx.saturate = bwd, bwd_rounding, saturate
        return x if fwd is None else cast(x, fwd, fwd_rounding, saturate=saturate)

    @staticmethod
    def backward(ctx, grad):
        g = grad if ctx.bwd is None else cast(grad, ctx.bwd, ctx.bwd_rounding, saturate=ctx.saturate)
        return g, None, None, None, None, None


def quantizer(x: torch.Tensor, forward_fmt=None, backward_fmt=None, *, forward_rounding="nearest",
              backward_rounding="nearest", saturate: bool = False) -> torch.Tensor:
    """Round ``x`` to ``forward_fmt`` in the forward pass and its gradient to ``backward_fmt`` in
    the backward pass (either may be None: pass through unchanged).

    Stochastic rounding draws from torch's default generator, so ``torch.manual_seed`` makes a
    training run reproducible.
    """
    fwd = None if forward_fmt is None else FloatFormat.parse(forward_fmt)
    bwd = None if backward_fmt is None else FloatFormat.parse(backward_fmt)
    fr, br = Rounding.parse(forward_rounding, "forward_rounding"), Rounding.parse(backward_rounding, "backward_rounding")
    if not isinstance(saturate, bool):
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    return _Quantize.apply(x, fwd, bwd, fr, br, saturate)


class Quantizer(torch.nn.Module):
    """``nn.Module`` form of :func:`quantizer`: rounds activations forward, gradients backward.

    Example:
        >>> q = Quantizer(forward_fmt="e4m3", backward_fmt="e5m2")
        >>> y = q(torch.randn(4, requires_grad=True))
    """

    def __init__(self, forward_fmt=None, backward_fmt=None, *, forward_rounding="nearest",
                 backward_rounding="nearest", saturate: bool = False):
        super().__init__()
        self.forward_fmt = None if forward_fmt is None else FloatFormat.parse(forward_fmt)
        self.backward_fmt = None if backward_fmt is None else FloatFormat.parse(backward_fmt)
        self.forward_rounding = Rounding.parse(forward_rounding, "forward_rounding")
        self.backward_rounding = Rounding.parse(backward_rounding, "backward_rounding")
        if not isinstance(saturate, bool):
            raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
        self.saturate = saturate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Quantize.apply(x, self.forward_fmt, self.backward_fmt, self.forward_rounding,
                               self.backward_rounding, self.saturate)

    def extra_repr(self) -> str:
        f = self.forward_fmt.name if self.forward_fmt else None
        b = self.backward_fmt.name if self.backward_fmt else None
        return f"forward_fmt={f}, backward_fmt={b}, forward_rounding={self.forward_rounding.value}, " \
               f"backward_rounding={self.backward_rounding.value}, saturate={self.saturate}"
