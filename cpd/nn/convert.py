"""``convert``: a copy of a model with its GEMM layers replaced by emulated ones."""

from __future__ import annotations

import copy

import torch

from .conv import QuantConv1d, QuantConv3d, QuantConvTranspose2d
from .emulate import QuantMultiheadAttention
from .layers import _SAME, GemmConfig, QuantConv2d, QuantLinear
from .recipes import ScalingRecipe, grad_recipe

__all__ = ["convert"]

_KINDS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose2d,
          torch.nn.MultiheadAttention)
_CONV_ARGS = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups")


def _replacement(child: torch.nn.Module, kw: dict, emulate_kw: dict, scaling, grad_scaling=None):
    """The emulated twin of ``child`` (same hyper-parameters, no weights yet), or None."""
    t = type(child)
    if t not in _KINDS:
        return None
    w = next(child.parameters())
    dev = {"device": w.device, "dtype": w.dtype}
    if t is torch.nn.Linear:
        return QuantLinear(child.in_features, child.out_features, child.bias is not None, **dev, **kw, scaling=scaling,
                           grad_scaling=grad_scaling)
    if t in (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d) and child.padding_mode == "zeros":
        cls = {torch.nn.Conv1d: QuantConv1d, torch.nn.Conv2d: QuantConv2d, torch.nn.Conv3d: QuantConv3d}[t]
        args = [getattr(child, a) for a in _CONV_ARGS]
        return cls(*args, bias=child.bias is not None, **dev, **kw)
    if t is torch.nn.ConvTranspose2d and child.padding_mode == "zeros":
        return QuantConvTranspose2d(child.in_channels, child.out_channels, child.kernel_size, child.stride,
                                    child.padding, child.output_padding, child.groups, child.bias is not None,
                                    child.dilation, **dev, **kw)
    if t is torch.nn.MultiheadAttention:
        return QuantMultiheadAttention(child.embed_dim, child.num_heads, dropout=child.dropout,
                                       bias=child.in_proj_bias is not None, add_bias_kv=child.bias_k is not None,
                                       add_zero_attn=child.add_zero_attn, kdim=child.kdim, vdim=child.vdim,
                                       batch_first=child.batch_first, **dev, **emulate_kw)
    return None


def convert(model: torch.nn.Module, *, mul=None, acc=None, weight=None, activation=None, grad=None,
            backward_mul=_SAME, backward_acc=_SAME, kahan: bool = False, fma: bool = False,
            block: int | None = None, rounding="nearest", softmax=None, scaling=None, grad_scaling=None,
            skip=()) -> torch.nn.Module:
    """A copy of ``model`` whose GEMM layers are emulated (same weights; the original is untouched).

    Replaced: ``nn.Linear`` -> :class:`QuantLinear`, ``nn.Conv1d/2d/3d`` ->
    :class:`QuantConv1d`/:class:`QuantConv2d`/:class:`QuantConv3d`, ``nn.ConvTranspose2d`` ->
    :class:`QuantConvTranspose2d` (``padding_mode="zeros"``), ``nn.MultiheadAttention`` ->
    :class:`QuantMultiheadAttention` (projections and both attention GEMMs emulated, softmax in
    float32 rounded to ``softmax``). ``acc`` may be a :class:`cpd.FusedDot`
    (``cpd.tensor_core(...)``). Attention written with ``@``/``F.scaled_dot_product_attention``
    inside your own modules is reached with :class:`cpd.nn.emulate` instead. ``scaling`` (a
    :class:`cpd.nn.recipes.ScalingRecipe` or its kind) applies to the ``Linear`` layers (each
    keeps its own state: delayed scaling's amax history), and ``grad_scaling`` (a recipe or
    ``"tensorwise"``/``"delayed"``/``"block"``: E5M2 gradients) to their backward GEMMs' output
    gradient (see :class:`QuantLinear`). Modules whose
    qualified name equals or starts with ``prefix + "."`` for a prefix in ``skip`` are kept.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    kw = dict(mul=mul, acc=acc, weight=weight, activation=activation, grad=grad, backward_mul=backward_mul,
              backward_acc=backward_acc, kahan=kahan, fma=fma, block=block, rounding=rounding)
    emulate_kw = dict(mul=mul, acc=acc, fma=fma, kahan=kahan, block=block, rounding=rounding,
                      backward_mul=backward_mul, backward_acc=backward_acc, softmax=softmax)
    GemmConfig(mul, acc, fma, kahan, block, rounding)  # validate once, before copying anything
    ScalingRecipe.parse(scaling)
    grad_recipe(grad_scaling)
    new = copy.deepcopy(model)

    def swap(parent: torch.nn.Module, prefix: str):
        for name, child in list(parent.named_children()):
            full = f"{prefix}{name}"
            if any(full == s or full.startswith(s + ".") for s in skip):
                continue
            q = _replacement(child, kw, emulate_kw, scaling, grad_scaling)
            if q is None:
                swap(child, full + ".")
                continue
            missing, unexpected = q.load_state_dict(child.state_dict(), strict=False)
            if unexpected or any(not k.startswith("scale_") for k in missing):  # only scaler state is new
                raise RuntimeError(f"convert: {full}: state mismatch (missing {missing}, unexpected {unexpected})")
            q.train(child.training)
            setattr(parent, name, q)

    swap(new, "")
    return new
