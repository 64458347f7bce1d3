"""Emulated low-precision networks.

* :mod:`cpd.nn.layers`: :class:`Quantizer`/:func:`quantizer`, :class:`GemmConfig`,
  :func:`quant_matmul`, :class:`QuantLinear`, :class:`QuantConv2d`;
* :mod:`cpd.nn.conv`: :class:`QuantConv1d`, :class:`QuantConv3d`, :class:`QuantConvTranspose2d`;
* :mod:`cpd.nn.emulate`: :class:`emulate` (a ``TorchFunctionMode`` routing matmul/@/bmm/
  baddbmm/F.linear/SDPA through cpd), :func:`scaled_dot_product_attention`,
  :class:`QuantMultiheadAttention`;
* :mod:`cpd.nn.zoo`: :func:`register_conversion`, :class:`QuantTransposedLinear` (what convert
  replaces);
* :mod:`cpd.nn.convert`: :func:`convert`;
* :mod:`cpd.nn.conversion_report`: :func:`conversion_report`;
* :mod:`cpd.nn.recipes`: :class:`ScalingRecipe`, :class:`Scaler`, :func:`scaling_report`.
"""

from .layers import GemmConfig, QuantConv2d, QuantLinear, Quantizer, quant_matmul, quantizer
from .conv import QuantConv1d, QuantConv3d, QuantConvTranspose2d
from .emulate import QuantMultiheadAttention, emulate, scaled_dot_product_attention
from .zoo import QuantTransposedLinear, register_conversion
from .convert import ConversionWarning, convert
from .conversion_report import ConversionReport, conversion_report
from .recipes import ScalingRecipe, Scaler, scaling_report

__all__ = ["Quantizer", "quantizer", "GemmConfig", "quant_matmul", "QuantLinear", "QuantConv2d", "QuantConv1d",
           "QuantConv3d", "QuantConvTranspose2d", "QuantMultiheadAttention", "emulate",
           "scaled_dot_product_attention", "convert", "ConversionWarning", "register_conversion", "QuantTransposedLinear",
           "conversion_report", "ConversionReport", "ScalingRecipe", "Scaler", "scaling_report"]
