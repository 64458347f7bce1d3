"""cpd: customized-precision floating-point emulation for PyTorch.

Exact, fast casting of float32 tensors to any format of 1-8 exponent and 0-23 mantissa bits, on
CPU (C++/OpenMP) and CUDA (NVRTC), from one numerics core.

    >>> import torch, cpd
    >>> cpd.cast(torch.tensor([0.3]), cpd.E5M2)
    tensor([0.3125])
"""

from . import nn, optim, reference
from .formats import (BF16, E2M1, E2M3, E3M2, E4M3, E4M3B11FNUZ, E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0, FP16,
                      FP32, PRESETS, TF32, FloatFormat, Specials)
from .nn import Quantizer, quantizer
from .ops import add, bits, cast, code_dtype, decode, encode, fma, mul
from .ops import matmul, sum  # noqa: A004
from .rounding import Rounding
from .config import CompressedReduceConfig, ReduceConfig
from .collectives import ALGORITHMS as ALLREDUCE_ALGORITHMS, allreduce, cost_model
from .report import LayerReport, RoundoffReport, ScalingComparison
from .scaling import LossScaler, aps_allreduce, aps_exponent, compare_scalings, scaled_allreduce
from .optim import APSOptimizer
from . import compressors  # noqa: E402  (the literature's gradient compressors; see cpd/compressors)
from . import distributed
from .tensor_core import FusedDot, tensor_core  # noqa: E402  (issue 15: matrix-unit accumulators)
from . import mx  # block-scaled formats: OCP MX and NVFP4

__version__ = "0.1.0"

__all__ = [
    "FloatFormat", "Specials", "Rounding", "PRESETS", "ReduceConfig", "CompressedReduceConfig",
    "FP32", "TF32", "FP16", "BF16", "E5M2", "E4M3", "E4M3FN", "E3M2", "E2M3", "E2M1",
    "E4M3FNUZ", "E5M2FNUZ", "E4M3B11FNUZ", "E8M0",
    "cast", "encode", "decode", "bits", "code_dtype", "add", "mul", "fma", "matmul", "sum",
    "Quantizer", "quantizer", "nn", "optim", "reference",
    "allreduce", "ALLREDUCE_ALGORITHMS", "cost_model", "aps_allreduce", "aps_exponent", "scaled_allreduce",
    "LossScaler", "RoundoffReport", "LayerReport", "ScalingComparison", "compare_scalings", "APSOptimizer", "compressors", "distributed",
    "FusedDot", "tensor_core", "mx",
]
