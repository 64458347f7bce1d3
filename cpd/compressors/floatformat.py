"""APS-style casting to a :class:`cpd.FloatFormat` as one more compressor (Han et al., "Auto-Precision
Scaling for distributed deep learning", paper 003): the tensor is multiplied by a per-tensor power of
two 2**s, rounded to the format with :func:`cpd.encode`, and sent as the format's codes.

Wire: the codes as :mod:`cpd.codec` sends every format's codes (the real transport too): a bit
stream of ``fmt.bits`` bits each, low bit first, for formats of at most 8 bits ("sub-byte
packing": two e2m1 codes per byte, ``ceil(n * bits / 8)`` bytes), two bytes per code for 9..16
bits, four above; plus one byte for the signed scale exponent s when ``scale="aps"``.
"""

from __future__ import annotations

import math

import torch

from ..codec import FormatCodec
from ..formats import FloatFormat
from ..primitives import aps_exponent, scale_pow2
from ..rounding import Rounding
from .base import Compressor, Payload

__all__ = ["FormatCompressor"]


class FormatCompressor(Compressor):
    """Cast to ``fmt`` (optionally after APS's power-of-two scaling) and send the codes.

    Args:
        fmt: the wire format (a :class:`cpd.FloatFormat`, a name such as ``"e5m2"`` or a dtype).
        rounding: rounding mode of the cast (``"stochastic"`` needs ``generator`` for reproducibility).
        scale: ``"aps"``: multiply by 2**s with ``s = cpd.aps_exponent(x, fmt, workers)`` (so the sum
            of ``workers`` such tensors cannot overflow; s = 0 for an all-zero tensor), clamped to
            -128..127 and sent as one byte; None: send the cast as it is.
        workers: W of APS's exponent (the number of tensors that will be summed).
        saturate: clamp overflows to ±max (see :func:`cpd.cast`).
        generator: the torch generator of stochastic rounding.
        error_feedback: keep a residual when encode gets a state (off by default).

    Decoding: ``decode(codes, fmt) * 2**-s`` (exact: a power of two, unless it underflows float32).
    """

    def __init__(self, fmt, *, rounding="nearest", scale: str | None = "aps", workers: int = 1,
                 saturate: bool = False, generator: torch.Generator | None = None, error_feedback: bool = False):
        self.fmt = FloatFormat.parse(fmt)
        self.rounding = Rounding.parse(rounding)
        if scale not in ("aps", None):
            raise ValueError(f"scale must be 'aps' or None, got {scale!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        for n, v in (("saturate", saturate), ("error_feedback", error_feedback)):
            if not isinstance(v, bool):
                raise TypeError(f"{n} must be a bool, got {type(v).__name__}")
        if generator is not None and self.rounding is not Rounding.STOCHASTIC:
            raise ValueError(f"generator only applies to rounding='stochastic', got rounding={self.rounding.value!r}")
        self.scale, self.workers, self.saturate, self.generator = scale, workers, saturate, generator
        self.error_feedback = error_feedback
        self.name = self.fmt.name
        self.codec = FormatCodec(self.fmt)

    def _encode(self, x: torch.Tensor) -> Payload:
        parts = {}
        if self.scale == "aps":
            s = aps_exponent(x, self.fmt, self.workers)
            s = 0 if s is None else max(-128, min(127, s))
            parts["scale"] = torch.tensor([s & 0xFF], dtype=torch.uint8, device=x.device)
            x = scale_pow2(x, s)
        parts["codes"] = self.codec.encode(x, self.rounding, saturate=self.saturate, generator=self.generator)
        return self._payload(x.shape, **parts)

    def wire_layout(self, shape) -> tuple:
        codes = self.codec.nbytes(math.prod(tuple(shape)))
        return ((("scale", 1),) if self.scale == "aps" else ()) + (("codes", codes),)

    def _decode(self, p: Payload) -> torch.Tensor:
        out = self.codec.decode(p.parts["codes"], p.numel)
        if "scale" in p.parts:
            s = int(p.parts["scale"][0])
            s = s - 256 if s > 127 else s
            out = scale_pow2(out, -s)
        return out.reshape(p.shape)

    def __repr__(self) -> str:
        return (f"FormatCompressor({self.fmt.name}, rounding={self.rounding.value!r}, scale={self.scale!r}, "
                f"workers={self.workers})")
