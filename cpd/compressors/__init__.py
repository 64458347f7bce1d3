"""The literature's gradient compressors behind one interface.

Every compressor is a :class:`Compressor`: ``encode(tensor, state=None) -> Payload`` (the uint8
bytes that would go on the wire; ``payload.nbytes`` is their size) and ``decode(payload) ->
tensor``, with optional error feedback kept in a per-parameter, per-worker
:class:`CompressorState`. :func:`get` builds one from a name:

=================== ===================================================== ===========================
name                method                                                module
=================== ===================================================== ===========================
``dynamic_tree``    Dettmers (2016) 8-bit dynamic tree (absmax-normalized) :mod:`.dettmers`
``static_tree``     Dettmers (2016) 8-bit static tree (``static_tree:2``: exponent offset 10^2)
``linear``          Dettmers (2016) 8-bit linear quantization (absmax)
``mantissa8``       Dettmers (2016) 8-bit mantissa type (``mantissa8:2``)
``onebit``          Seide et al. (2014) 1-bit SGD, per column, error feedback :mod:`.quantization`
``threshold``       Strom (2015) threshold τ (``threshold:0.01``; default τ = 0.001, Dryden's MNIST value)
``adaptive``        Dryden et al. (2016) adaptive, π = 64 (``adaptive:16``; ``adaptive:64:sample=256``)
``bitpack8/16/24``  Bitpack truncation to the leading bytes (paper 004)     :mod:`.awp`
a format name       APS-style cast to a :class:`cpd.FloatFormat` (``"e5m2"``, ``"e2m1fn"``, ...) :mod:`.floatformat`
=================== ===================================================== ===========================

:class:`AWP` (adaptive weight precision) is a stateful helper for weights, not a gradient
compressor (see :mod:`cpd.compressors.awp`). :func:`compressed_allreduce` (also
``cpd.allreduce(..., compressor=...)``) sums W workers' tensors with a compressor on every link.
"""

from __future__ import annotations

from .awp import AWP, Bitpack, bitpack, bitunpack
from .base import Compressor, CompressorState, Payload, pack_bits, unpack_bits
from .dettmers import DETTMERS_TYPES, Dettmers8bit, dynamic_tree_table, linear_table, mantissa_table, static_tree_table
from .floatformat import FormatCompressor
from .quantization import Adaptive, OneBit, Threshold, matrix_view
from .reduce import ALGORITHMS, CompressionReport, LayerCompression, compressed_allreduce, reduce_layers

__all__ = [
    "Compressor", "CompressorState", "Payload", "get", "NAMES",
    "Dettmers8bit", "OneBit", "Threshold", "Adaptive", "FormatCompressor", "Bitpack", "AWP",
    "bitpack", "bitunpack", "pack_bits", "unpack_bits", "matrix_view",
    "linear_table", "static_tree_table", "dynamic_tree_table", "mantissa_table", "DETTMERS_TYPES",
    "compressed_allreduce", "reduce_layers", "CompressionReport", "LayerCompression", "ALGORITHMS",
]

#: Registry names (besides format names, which give a :class:`FormatCompressor`).
NAMES = ("dynamic_tree", "static_tree", "linear", "mantissa8", "onebit", "threshold", "adaptive",
         "bitpack8", "bitpack16", "bitpack24")


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"compressor: {what} must be a number, got {text!r}") from None


def _from_name(spec: str) -> Compressor:
    name, *args = spec.strip().split(":")
    key = name.lower()
    kw = dict(a.split("=", 1) for a in args if "=" in a)
    pos = [a for a in args if "=" not in a]
    if len(pos) > 1 or (kw and key != "adaptive") or (set(kw) - {"sample"}):
        raise ValueError(f"compressor {spec!r}: at most one parameter after ':' "
                         "(and 'sample=<int>' for adaptive), e.g. 'threshold:0.01', 'adaptive:64:sample=256'")
    arg = pos[0] if pos else None
    if key in ("dynamic_tree", "linear"):
        if arg is not None:
            raise ValueError(f"compressor {spec!r}: {key} takes no parameter (it is normalized by the absmax)")
        return Dettmers8bit(key)
    if key in ("static_tree", "mantissa8"):
        off = None if arg is None else int(_number(arg, "the exponent offset"))
        return Dettmers8bit(key, offset=off)
    if key == "onebit":
        if arg is not None:
            raise ValueError(f"compressor {spec!r}: onebit takes no parameter")
        return OneBit()
    if key == "threshold":
        return Threshold(0.001 if arg is None else _number(arg, "tau"))
    if key == "adaptive":
        sample = kw.get("sample")
        if sample is not None:
            try:
                sample = int(sample)
            except ValueError:
                raise ValueError(f"compressor {spec!r}: sample must be an int") from None
        import torch

        gen = torch.Generator().manual_seed(0) if sample is not None else None
        return Adaptive(64 if arg is None else _number(arg, "pi"), sample=sample, generator=gen)
    if key in ("bitpack8", "bitpack16", "bitpack24"):
        return Bitpack(int(key[7:]) // 8)
    if arg is not None:
        raise ValueError(f"compressor {spec!r}: a format compressor takes no parameter")
    from ..formats import FloatFormat

    try:
        fmt = FloatFormat.parse(name)
    except (TypeError, ValueError):
        raise ValueError(f"compressor {spec!r} is unknown; allowed: {', '.join(NAMES)}, or a format name "
                         "such as 'e5m2' (see cpd.PRESETS)") from None
    return FormatCompressor(fmt)


def get(spec) -> Compressor:
    """A compressor from a :class:`Compressor` (returned as is), a :class:`cpd.FloatFormat` (a
    :class:`FormatCompressor`) or a name of :data:`NAMES` / a format name, optionally with one
    parameter after a colon (``"threshold:0.01"``, ``"adaptive:16"``, ``"static_tree:2"``)."""
    from ..formats import FloatFormat

    if isinstance(spec, Compressor):
        return spec
    if isinstance(spec, FloatFormat):
        return FormatCompressor(spec)
    if isinstance(spec, str):
        return _from_name(spec)
    raise TypeError(f"compressor must be a cpd.compressors.Compressor, a FloatFormat or a name "
                    f"({', '.join(NAMES)}, or a format name), got {type(spec).__name__}")
