"""Compressors by name: :func:`get` builds a :class:`Compressor` from a name (with an optional
parameter after a colon), a :class:`cpd.FloatFormat` or a compressor; :data:`NAMES` lists the names.
"""

from __future__ import annotations

import torch

from ..formats import FloatFormat
from .awp import Bitpack
from .base import Compressor
from .dettmers import Dettmers8bit
from .floatformat import FormatCompressor
from .quantization import Adaptive, OneBit, Threshold

__all__ = ["NAMES", "get"]

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
        gen = torch.Generator().manual_seed(0) if sample is not None else None
        return Adaptive(64 if arg is None else _number(arg, "pi"), sample=sample, generator=gen)
    if key in ("bitpack8", "bitpack16", "bitpack24"):
        return Bitpack(int(key[7:]) // 8)
    if arg is not None:
        raise ValueError(f"compressor {spec!r}: a format compressor takes no parameter")
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
    if isinstance(spec, Compressor):
        return spec
    if isinstance(spec, FloatFormat):
        return FormatCompressor(spec)
    if isinstance(spec, str):
        return _from_name(spec)
    raise TypeError(f"compressor must be a cpd.compressors.Compressor, a FloatFormat or a name "
                    f"({', '.join(NAMES)}, or a format name), got {type(spec).__name__}")
