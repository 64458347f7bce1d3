"""Emulated GEMMs for code you cannot edit: :class:`emulate` (a ``TorchFunctionMode``), the
attention of :func:`scaled_dot_product_attention` with cpd GEMMs, and
:class:`QuantMultiheadAttention`.

Inside ``with cpd.nn.emulate(mul=..., acc=...):`` every ``torch.matmul`` / ``@``, ``mm``,
``bmm``, ``baddbmm``, ``addmm``, ``F.linear``, ``F.conv1d/2d/3d`` (im2col, as
``QuantConv1d/2d/3d``; not with ``scaling=``), ``F.scaled_dot_product_attention`` and
``F.multi_head_attention_forward`` (``nn.MultiheadAttention``; its fused fast path is switched
off meanwhile, see :mod:`cpd.nn.attention`) on float
tensors runs through :func:`cpd.nn.quant_matmul`: the forward GEMM with ``(mul, acc, ...)``, the
two backward GEMMs with ``(backward_mul, backward_acc)``. ``acc`` may be a
:class:`cpd.FusedDot` (``cpd.tensor_core("hopper", a="e4m3")``). Anything else runs unchanged.
"""

from __future__ import annotations

import dataclasses

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import mx
from ..formats import FloatFormat
from .attention import multi_head_attention
from .conv import conv_nd
from .layers import _SAME, GemmConfig, quant_matmul, quantizer
from .recipes import ScalingRecipe

__all__ = ["emulate", "scaled_dot_product_attention", "QuantMultiheadAttention"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _gemm(a, b, fwd: GemmConfig, bwd: GemmConfig, recipe=None):
    """a @ b through quant_matmul, 1-D operands promoted as torch.matmul does; the result in the
    operands' dtype. ``recipe``: a stateless scaling recipe (tensorwise, rowwise along k, or block)."""
    dtype = torch.result_type(a, b)
    a1, b1 = a.dim() == 1, b.dim() == 1
    a2 = (a.unsqueeze(0) if a1 else a).float()
    b2 = (b.unsqueeze(-1) if b1 else b).float()
    if recipe is None:
        y = quant_matmul(a2, b2, fwd, bwd)
    elif recipe.kind == "block":  # block formats along k (a block-scaled GEMM quantizes by itself)
        if not (fwd.fused and fwd.acc.block_scaled):
            a2 = mx.cast(a2, dataclasses.replace(recipe.fmt, axis=-1))
            b2 = mx.cast(b2, dataclasses.replace(recipe.fmt, axis=-2))
        y = quant_matmul(a2, b2, fwd, bwd)
    else:
        with torch.no_grad():
            rows = recipe.kind == "rowwise"
            sa = recipe.scale_from_amax(a2.abs().amax(dim=-1, keepdim=True) if rows else a2.abs().amax())
            sb = recipe.scale_from_amax(b2.abs().amax(dim=-2, keepdim=True) if rows else b2.abs().amax())
        y = quant_matmul(a2 * sa, b2 * sb, fwd, bwd) / sa / sb
    if a1:
        y = y.squeeze(-2)
    if b1:
        y = y.squeeze(-1)
    return y.to(dtype)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale=None, enable_gqa: bool = False, *, gemm: GemmConfig = GemmConfig(),
                                 backward_gemm: GemmConfig | None = None, softmax=None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with its two GEMMs (``q @ k^T``, ``p @ v``) emulated by
    ``gemm`` (backward: ``backward_gemm``, default the same) and the softmax in float32, its
    result rounded to ``softmax`` (a format, or None). The scores are ``(q @ k^T) * scale`` (the
    scale applied after the GEMM), then the mask (boolean: False masks out; float: added) and
    causal mask, softmax over the last dim, dropout, ``@ v``.
    """
    bwd = gemm if backward_gemm is None else backward_gemm
    if enable_gqa and query.shape[-3] != key.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, dim=-3), value.repeat_interleave(rep, dim=-3)
    s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = _gemm(query, key.transpose(-2, -1), gemm, bwd) * s
    L, S = query.shape[-2], key.shape[-2]
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    p = torch.softmax(scores.float(), dim=-1)
    if softmax is not None:
        p = quantizer(p, FloatFormat.parse(softmax))
    if dropout_p > 0.0:
        p = F.dropout(p, dropout_p, training=True)
    return _gemm(p.to(value.dtype), value, gemm, bwd)


class emulate(TorchFunctionMode):
    """Route the GEMMs of any code through cpd (see the module docstring).

    Args:
        mul, acc, fma, kahan, block, rounding: the forward GEMM (:class:`cpd.nn.GemmConfig`);
            ``acc`` may be a :class:`cpd.FusedDot`.
        backward_mul, backward_acc: the backward GEMMs (default: the forward's).
        softmax: format the attention probabilities are rounded to (None: float32).
        scaling: ``"tensorwise"``/``"rowwise"``/``"block"`` (or a stateless
            :class:`cpd.nn.recipes.ScalingRecipe`): both operands of every routed GEMM are scaled
            before it and the result unscaled (``"block"``: fake-quantized to the recipe's
            :class:`cpd.mx.BlockFormat` along k, unless ``acc`` is block-scaled).

    Example::

        with cpd.nn.emulate(acc=cpd.tensor_core("hopper", a="e4m3")):
            loss = model(x).sum()
            loss.backward()
    """

    def __init__(self, mul=None, acc=None, *, fma: bool = False, kahan: bool = False, block=None,
                 rounding="nearest", backward_mul=_SAME, backward_acc=_SAME, softmax=None, scaling=None):
        super().__init__()
        self.scaling = ScalingRecipe.parse(scaling)
        if self.scaling is not None and self.scaling.kind == "delayed":
            raise ValueError("emulate(scaling='delayed') has no per-call-site state; use 'tensorwise' or 'rowwise' "
                             "here, and convert(..., scaling='delayed') for Linear layers")
        self.gemm = GemmConfig(mul, acc, fma, kahan, block, rounding)
        bmul = mul if backward_mul is _SAME else backward_mul
        bacc = acc if backward_acc is _SAME else backward_acc
        self.backward_gemm = GemmConfig(bmul, bacc, fma and bmul is None, kahan, block, rounding)
        self.softmax = None if softmax is None else FloatFormat.parse(softmax)
        self.calls: dict = {}

    # functions -> how to run them; filled once (the methods and functions torch dispatches)
    _MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm, torch.bmm,
                torch.Tensor.bmm}
    _ADDMMS = {torch.baddbmm, torch.Tensor.baddbmm, torch.addmm, torch.Tensor.addmm}

    def __enter__(self):
        # nn.MultiheadAttention / TransformerEncoderLayer fast paths are fused kernels with no GEMM
        # to route: turn them off while emulating (restored on exit).
        self._fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.backends.mha.set_fastpath_enabled(self._fastpath)
        return super().__exit__(*exc)

    def _ok(self, *ts) -> bool:
        return all(isinstance(t, torch.Tensor) and t.dtype in _FLOATS for t in ts)

    def _linear(self, x, w, b):
        """F.linear: x @ w^T emulated, the bias added in the GEMM's epilogue format."""
        self._count("linear")
        y = _gemm(x, w.t(), self.gemm, self.backward_gemm, self.scaling)
        if b is None:
            return y
        return y + b if self.gemm.exact else self.gemm.add_bias(y.float(), b.float()).to(y.dtype)

    _CONVS = {F.conv1d: 1, F.conv2d: 2, F.conv3d: 3}

    def _conv(self, nd, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        """F.conv1d/2d/3d as im2col + the emulated GEMM (:func:`cpd.nn.conv.conv_nd`, what
        ``QuantConv1d/2d/3d`` compute), the bias added in the GEMM's epilogue format."""
        def tup(v):
            return (v,) * nd if isinstance(v, int) else tuple(v)
        dtype = torch.result_type(input, weight)
        x = input.unsqueeze(0) if input.dim() == nd + 1 else input
        y = conv_nd(x.float(), weight.float(), None if bias is None else bias.float(), tup(stride),
                    padding if isinstance(padding, str) else tup(padding), tup(dilation), groups, self.gemm,
                    self.backward_gemm)
        return (y.squeeze(0) if input.dim() == nd + 1 else y).to(dtype)

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fwd, bwd = self.gemm, self.backward_gemm
        if func in self._MATMULS and len(args) == 2 and not kwargs and self._ok(*args):
            self._count("matmul")
            return _gemm(args[0], args[1], fwd, bwd, self.scaling)
        if func is torch.Tensor.__rmatmul__ and len(args) == 2 and self._ok(*args):
            self._count("matmul")
            return _gemm(args[1], args[0], fwd, bwd, self.scaling)
        if func in self._ADDMMS and len(args) == 3 and self._ok(*args) and set(kwargs) <= {"beta", "alpha"}:
            self._count("addmm")
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            y = _gemm(args[1], args[2], fwd, bwd, self.scaling)
            y = y if alpha == 1 else y * alpha
            return y if beta == 0 else y + (args[0] if beta == 1 else beta * args[0])
        if func is F.linear:
            x, w = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            if self._ok(x, w):
                return self._linear(x, w, b)
        if func in self._CONVS and self.scaling is None and self._ok(*args[:2]):
            self._count("conv")
            return self._conv(self._CONVS[func], *args, **kwargs)
        if func is F.multi_head_attention_forward and self._ok(*args[:3]):
            self._count("multi_head_attention")
            def gemm(a, b):
                return _gemm(a, b, fwd, bwd, self.scaling)

            return multi_head_attention(*args, **kwargs, linear=self._linear, gemm=gemm, softmax=self.softmax)
        if func is F.scaled_dot_product_attention and self._ok(*args[:3]):
            self._count("sdpa")
            return scaled_dot_product_attention(*args, **kwargs, gemm=fwd, backward_gemm=bwd, softmax=self.softmax)
        return func(*args, **kwargs)


class QuantMultiheadAttention(torch.nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose projections and attention GEMMs run under :class:`emulate`
    with this module's configuration (keywords of :class:`emulate` after the usual arguments)."""

    def __init__(self, *args, mul=None, acc=None, fma: bool = False, kahan: bool = False, block=None,
                 rounding="nearest", backward_mul=_SAME, backward_acc=_SAME, softmax=None, scaling=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._emulate_kw = dict(mul=mul, acc=acc, fma=fma, kahan=kahan, block=block, rounding=rounding,
                                backward_mul=backward_mul, backward_acc=backward_acc, softmax=softmax,
                                scaling=scaling)
        emulate(**self._emulate_kw)  # validate once

    def forward(self, *args, **kwargs):
        with emulate(**self._emulate_kw):
            return super().forward(*args, **kwargs)
