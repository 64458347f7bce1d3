"""What :func:`cpd.nn.convert` replaces: the table of conversions (``torch.nn`` layers, the layer
types of ``transformers``/``torchvision``/``timm`` that are not plain ``nn.Linear``/``nn.Conv*``,
and the user's own through :func:`register_conversion`), :class:`QuantTransposedLinear` (the
``Conv1D`` of ``transformers``), and :func:`multiplies_by_weight` (which modules hold a weight
matrix that a GEMM multiplies by).

Third-party types are registered by their qualified name (``"transformers.pytorch_utils.Conv1D"``)
and matched against ``type(module).__module__ + "." + type(module).__qualname__``: nothing of
``transformers``, ``torchvision`` or ``timm`` is imported, here or at ``import cpd``.

A factory is called as ``factory(module, **formats)`` with the keywords of :func:`cpd.nn.convert`
(``mul, acc, weight, activation, grad, backward_mul, backward_acc, kahan, fma, block, rounding,
softmax, scaling, grad_scaling``; use those you need, accept the rest with ``**kw``) and returns a
module computing the same function with its GEMMs emulated, holding the same parameters under the
same names and shapes (convert then puts ``module``'s own parameter objects into it, so that tied
weights stay tied).
"""

from __future__ import annotations

import inspect

import torch

from .conv import QuantConv1d, QuantConv3d, QuantConvTranspose2d
from .emulate import QuantMultiheadAttention, _gemm
from .layers import _SAME, QuantConv2d, QuantLinear, _QuantMixin

__all__ = ["register_conversion", "conversion_for", "QuantTransposedLinear", "multiplies_by_weight",
           "FORMAT_KEYWORDS"]

#: The keywords every factory receives (convert's formats).
FORMAT_KEYWORDS = ("mul", "acc", "weight", "activation", "grad", "backward_mul", "backward_acc", "kahan", "fma",
                   "block", "rounding", "softmax", "scaling", "grad_scaling")

_LAYER_KW = ("mul", "acc", "weight", "activation", "grad", "backward_mul", "backward_acc", "kahan", "fma", "block",
             "rounding")
_CONV_ARGS = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups")


def _layer_kw(kw: dict) -> dict:
    return {k: kw[k] for k in _LAYER_KW}


def _dev(m: torch.nn.Module) -> dict:
    w = next(m.parameters())
    return {"device": w.device, "dtype": w.dtype}


class QuantTransposedLinear(torch.nn.Module, _QuantMixin):
    """``transformers.pytorch_utils.Conv1D`` (GPT, GPT-2, ...) with its GEMM emulated: a linear layer
    whose weight is stored ``(in, out)``, ``y = bias + x @ W`` computed as that layer computes it,
    ``torch.addmm(bias, x.view(-1, in), W)``. The product is :func:`cpd.nn.quant_matmul` with the
    formats of :class:`QuantLinear` (activation, weight, gradient formats; ``mul``/``acc`` forward,
    ``backward_mul``/``backward_acc`` backward) and the bias is added as :class:`cpd.nn.emulate`
    adds ``addmm``'s input (float32): the layer equals ``Conv1D`` run under ``emulate`` bit for
    bit. ``nf``, ``nx``: output and input features, the names ``Conv1D`` uses.
    """

    def __init__(self, nf: int, nx: int, *, mul=None, acc=None, weight=None, activation=None, grad=None,
                 backward_mul=_SAME, backward_acc=_SAME, kahan: bool = False, fma: bool = False,
                 block: int | None = None, rounding="nearest", device=None, dtype=None):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        torch.nn.init.normal_(self.weight, std=0.02)
        self._setup_quant(mul, acc, weight, activation, grad, backward_mul, backward_acc, kahan, fma, block, rounding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.shape[:-1] + (self.nf,)
        x2 = self.act(x).reshape(-1, x.shape[-1])
        w = self._quant_weight(self.weight)
        y = _gemm(x2, w, self.gemm, self.backward_gemm)  # what emulate runs for addmm's product
        return (y + self.bias).reshape(size_out)

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}, " + self._quant_repr()


# ----------------------------------------------------------------------------- built-in factories
def _linear(m, **kw):
    return QuantLinear(m.in_features, m.out_features, m.bias is not None, **_dev(m), **_layer_kw(kw),
                       scaling=kw["scaling"], grad_scaling=kw["grad_scaling"])


def _conv(cls):
    def make(m, **kw):
        if m.padding_mode != "zeros":
            return None
        return cls(*[getattr(m, a) for a in _CONV_ARGS], bias=m.bias is not None, **_dev(m), **_layer_kw(kw))
    return make


def _conv_transpose2d(m, **kw):
    if m.padding_mode != "zeros":
        return None
    return QuantConvTranspose2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.output_padding,
                                m.groups, m.bias is not None, m.dilation, **_dev(m), **_layer_kw(kw))


def _mha(m, **kw):
    if m.bias_k is not None or m.add_zero_attn:  # cpd's attention does not model these (see attention.py)
        return None
    ekw = {k: kw[k] for k in ("mul", "acc", "fma", "kahan", "block", "rounding", "backward_mul", "backward_acc",
                              "softmax")}
    return QuantMultiheadAttention(m.embed_dim, m.num_heads, dropout=m.dropout, bias=m.in_proj_bias is not None,
                                   add_bias_kv=False, add_zero_attn=False, kdim=m.kdim, vdim=m.vdim,
                                   batch_first=m.batch_first, **_dev(m), **ekw)


def _hf_conv1d(m, **kw):
    return QuantTransposedLinear(m.nf, m.nx, **_dev(m), **_layer_kw(kw))


_TORCH = {torch.nn.Linear: _linear, torch.nn.Conv1d: _conv(QuantConv1d), torch.nn.Conv2d: _conv(QuantConv2d),
          torch.nn.Conv3d: _conv(QuantConv3d), torch.nn.ConvTranspose2d: _conv_transpose2d,
          torch.nn.MultiheadAttention: _mha}

#: Third-party layer types, by qualified name (matched without importing their library).
#: torchvision's models (ResNet, VGG, ViT, ...) are built of torch.nn layers; its
#: ``ops.DeformConv2d`` and timm's ``Conv2dSame``/``StdConv2d``/``CondConv2d`` compute their
#: weights or padding in their own forward and are reported as unsupported, never converted wrong.
_BY_NAME = {
    "transformers.pytorch_utils.Conv1D": _hf_conv1d,
    "timm.layers.linear.Linear": _linear,          # nn.Linear with a torchscript dtype cast in forward
    "timm.models.layers.linear.Linear": _linear,   # older timm path
}

_USER: dict = {}


def _qualname(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def register_conversion(module_type: type, factory) -> None:
    """Make :func:`cpd.nn.convert` replace every module of exactly ``module_type`` by
    ``factory(module, **formats)`` (see the module docstring for the contract). A later
    registration of the same type replaces the earlier one (also a built-in); ``factory=None``
    removes a user registration.

    Example::

        cpd.nn.register_conversion(MyLinear, lambda m, **kw: cpd.nn.QuantLinear(
            m.in_features, m.out_features, mul=kw["mul"], acc=kw["acc"]))
    """
    if not (isinstance(module_type, type) and issubclass(module_type, torch.nn.Module)):
        raise TypeError(f"module_type must be a subclass of torch.nn.Module, got {module_type!r}")
    if factory is None:
        _USER.pop(module_type, None)
        return
    if not callable(factory):
        raise TypeError(f"factory must be callable as factory(module, **formats), got {type(factory).__name__}")
    _USER[module_type] = factory


def conversion_for(module: torch.nn.Module):
    """The factory :func:`cpd.nn.convert` uses for ``module``'s type, or None: a user registration,
    a built-in entry (exact type, or its qualified name), or for a subclass of a ``torch.nn`` layer
    that keeps that layer's ``forward`` (``NonDynamicallyQuantizableLinear``) the layer's entry."""
    t = type(module)
    if t in _USER:
        return _USER[t]
    if t in _TORCH:
        return _TORCH[t]
    f = _BY_NAME.get(_qualname(t))
    if f is not None:
        return f
    for base, f in _TORCH.items():
        if issubclass(t, base) and inspect.getattr_static(t, "forward") is inspect.getattr_static(base, "forward"):
            return f
    return None


#: Modules whose 2-D weight is a lookup table or a per-channel scale, not a GEMM operand.
_NOT_GEMM = (torch.nn.Embedding, torch.nn.EmbeddingBag)


def multiplies_by_weight(module: torch.nn.Module) -> bool:
    """True when ``module`` itself (not its children) holds a parameter whose name contains
    ``weight`` with two or more dims and is not an embedding: a layer that multiplies by a weight
    matrix (Linear-, Conv-, RNN-like). Norms hold 1-D weights; positional tables and class tokens
    are not named ``weight``."""
    if isinstance(module, _NOT_GEMM):
        return False
    return any("weight" in n and p is not None and p.dim() >= 2 for n, p in module._parameters.items())
