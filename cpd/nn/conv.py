"""Convolutions whose GEMMs are emulated: :class:`QuantConv1d`, :class:`QuantConv3d`,
:class:`QuantConvTranspose2d` (``QuantConv2d`` is in :mod:`cpd.nn.layers`).

Each is im2col + :func:`cpd.nn.quant_matmul`, with the formats of :class:`cpd.nn.QuantLinear`:
every output element of every group is one dot product over ``in_channels/groups * prod(kernel)``
in the order (channel, kernel index row-major), the order of ``weight.reshape(out, -1)``.
A transposed convolution is the convolution of the input with zeros inserted between its
elements (``stride - 1`` of them), padded by ``dilation * (k - 1) - padding`` (plus
``output_padding`` at the end), with the kernel flipped and its in/out channels swapped: the
inserted zeros are exact zero products.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .layers import _SAME, _QuantMixin, quant_matmul

__all__ = ["QuantConv1d", "QuantConv3d", "QuantConvTranspose2d", "conv_nd"]


def _im2col(x: torch.Tensor, kernel, stride, dilation):
    """(N, C, *S) padded -> (N, C * prod(kernel), prod(out)), and the output sizes."""
    nd = len(kernel)
    for i in range(nd):
        span = dilation[i] * (kernel[i] - 1) + 1
        x = x.unfold(2 + i, span, stride[i])
        if dilation[i] > 1:
            x = x[..., :: dilation[i]]
    n, c = x.shape[:2]
    outs = tuple(x.shape[2:2 + nd])
    x = x.permute(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))  # (N, C, k..., o...)
    return x.reshape(n, c * math.prod(kernel), math.prod(outs)), outs


def _pads(padding, kernel, dilation) -> list:
    """F.pad's list (last dim first) for int/tuple padding or "same"/"valid"."""
    pairs = []
    for i, (k, d) in enumerate(zip(kernel, dilation)):
        if padding == "valid":
            pairs.append((0, 0))
        elif padding == "same":
            total = d * (k - 1)
            pairs.append((total // 2, total - total // 2))
        else:
            pairs.append((padding[i], padding[i]))
    return [p for pair in reversed(pairs) for p in pair]


def conv_nd(x: torch.Tensor, weight: torch.Tensor, bias, stride, padding, dilation, groups: int, gemm,
            backward_gemm) -> torch.Tensor:
    """N-d convolution (x: (N, C, *S), weight: (O, C/groups, *k)) as im2col + quant_matmul."""
    nd = weight.dim() - 2
    kernel = tuple(weight.shape[2:])
    x = F.pad(x, _pads(padding, kernel, dilation))
    cols, outs = _im2col(x, kernel, stride, dilation)
    n, c = x.shape[:2]
    o = weight.shape[0]
    cols = cols.reshape(n, groups, (c // groups) * math.prod(kernel), math.prod(outs))
    w = weight.reshape(groups, o // groups, -1)
    y = quant_matmul(w, cols, gemm, backward_gemm).reshape(n, o, *outs)
    if bias is None:
        return y
    return gemm.add_bias(y, bias.reshape(1, -1, *([1] * nd)))


class _QuantConvNd(_QuantMixin):
    _nd = 2

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != self._nd + 2:
            raise ValueError(f"{type(self).__name__} expects input of shape (N, C, {self._nd} spatial dims), "
                             f"got {tuple(x.shape)}")

    def extra_repr(self) -> str:
        return super().extra_repr() + ", " + self._quant_repr()


def _init_quant(self, kw, padding_mode):
    if padding_mode != "zeros":
        raise ValueError(f"{type(self).__name__} supports padding_mode='zeros' only, got {padding_mode!r}")
    self._setup_quant(kw["mul"], kw["acc"], kw["weight"], kw["activation"], kw["grad"], kw["backward_mul"],
                      kw["backward_acc"], kw["kahan"], kw["fma"], kw["block"], kw["rounding"])


_QUANT_DEFAULTS = dict(mul=None, acc=None, weight=None, activation=None, grad=None, backward_mul=_SAME,
                       backward_acc=_SAME, kahan=False, fma=False, block=None, rounding="nearest")


def _split(kwargs):
    quant = {k: kwargs.pop(k, v) for k, v in _QUANT_DEFAULTS.items()}
    return quant, kwargs


class QuantConv1d(_QuantConvNd, torch.nn.Conv1d):
    """``nn.Conv1d`` as im2col + :func:`cpd.matmul`; the keyword formats of :class:`cpd.nn.QuantLinear`."""

    _nd = 1

    def __init__(self, *args, **kwargs):
        quant, rest = _split(kwargs)
        torch.nn.Conv1d.__init__(self, *args, **rest)
        _init_quant(self, quant, self.padding_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return conv_nd(self.act(x), self._quant_weight(self.weight), self.bias, self.stride, self.padding,
                       self.dilation, self.groups, self.gemm, self.backward_gemm)


class QuantConv3d(_QuantConvNd, torch.nn.Conv3d):
    """``nn.Conv3d`` as im2col + :func:`cpd.matmul`; the keyword formats of :class:`cpd.nn.QuantLinear`."""

    _nd = 3

    def __init__(self, *args, **kwargs):
        quant, rest = _split(kwargs)
        torch.nn.Conv3d.__init__(self, *args, **rest)
        _init_quant(self, quant, self.padding_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return conv_nd(self.act(x), self._quant_weight(self.weight), self.bias, self.stride, self.padding,
                       self.dilation, self.groups, self.gemm, self.backward_gemm)


class QuantConvTranspose2d(_QuantConvNd, torch.nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` as a convolution of the zero-stuffed input (see the module docstring)."""

    _nd = 2

    def __init__(self, *args, **kwargs):
        quant, rest = _split(kwargs)
        torch.nn.ConvTranspose2d.__init__(self, *args, **rest)
        _init_quant(self, quant, self.padding_mode)

    def forward(self, x: torch.Tensor, output_size=None) -> torch.Tensor:
        self._check_input(x)
        if output_size is not None:
            raise ValueError("QuantConvTranspose2d: output_size is not supported; use output_padding")
        x = self.act(x)
        n, c, h, w = x.shape
        sh, sw = self.stride
        up = x.new_zeros(n, c, (h - 1) * sh + 1, (w - 1) * sw + 1)
        up[:, :, ::sh, ::sw] = x
        pads = []
        for i in (1, 0):  # F.pad order: last dim first
            k, d, p, op = self.kernel_size[i], self.dilation[i], self.padding[i], self.output_padding[i]
            pads += [d * (k - 1) - p, d * (k - 1) - p + op]
        up = F.pad(up, pads)  # negative entries crop
        g = self.groups
        wq = self._quant_weight(self.weight)  # (C_in, C_out/g, kh, kw)
        cin, cog = wq.shape[:2]
        wt = wq.reshape(g, cin // g, cog, *self.kernel_size).transpose(1, 2).reshape(g * cog, cin // g,
                                                                                     *self.kernel_size)
        wt = wt.flip(-1, -2)
        return conv_nd(up, wt, self.bias, (1, 1), (0, 0), self.dilation, g, self.gemm, self.backward_gemm)
