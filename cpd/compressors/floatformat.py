"""APS-style casting to a :class:`cpd.FloatFormat` as one more compressor (Han et al., "Auto-Precision
Scaling for distributed deep learning", paper 003): the tensor is multiplied by a per-tensor power of
two 2**s, rounded to the format with :func:`cpd.encode`, and sent as the format's codes.

Wire: the codes packed as a bitstream of ``fmt.bits`` bits each (MSB first) for formats of at most
4 bits ("sub-byte packing": two e2m1 codes per byte), one byte per code for 5..8 bits, two for
9..16 bits, four above; plus one byte for the signed scale exponent s when ``scale="aps"``.
"""

from __future__ import annotations

import math

import torch

from ..formats import FloatFormat
from ..ops import decode as _decode_codes, encode as _encode_codes
from ..rounding import Rounding
from .base import Compressor, Payload, pack_bits, unpack_bits

__all__ = ["FormatCompressor"]


def _code_bytes(bits: int) -> int:
    return 1 if bits <= 8 else 2 if bits <= 16 else 4


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

    def _encode(self, x: torch.Tensor) -> Payload:
        from ..scaling import aps_exponent

        parts = {}
        if self.scale == "aps":
            s = aps_exponent(x, self.fmt, self.workers)
            s = 0 if s is None else max(-128, min(127, s))
            parts["scale"] = torch.tensor([s & 0xFF], dtype=torch.uint8, device=x.device)
            x = (x.double() * 2.0 ** s).to(torch.float32)
        codes = _encode_codes(x, self.fmt, self.rounding, saturate=self.saturate, generator=self.generator)
        codes = codes.reshape(-1)
        b = self.fmt.bits
        if b <= 4:
            shifts = torch.arange(b - 1, -1, -1, dtype=torch.uint8, device=codes.device)
            parts["codes"] = pack_bits(((codes.view(-1, 1) >> shifts) & 1).reshape(-1))
        elif b <= 8:
            parts["codes"] = codes.to(torch.uint8)
        else:
            parts["codes"] = codes.to(torch.int16 if b <= 16 else torch.int32).contiguous().view(torch.uint8)
        return self._payload(x.shape, **parts)

    def wire_layout(self, shape) -> tuple:
        b, n = self.fmt.bits, math.prod(tuple(shape))
        codes = (n * b + 7) // 8 if b <= 4 else n * _code_bytes(b)
        return ((("scale", 1),) if self.scale == "aps" else ()) + (("codes", codes),)

    def _decode(self, p: Payload) -> torch.Tensor:
        b, n = self.fmt.bits, p.numel
        raw = p.parts["codes"]
        if b <= 4:
            bits = unpack_bits(raw, n * b).view(n, b).to(torch.int64)
            weights = 1 << torch.arange(b - 1, -1, -1, device=raw.device)
            codes = (bits * weights).sum(1).to(torch.uint8)
        elif b <= 8:
            codes = raw
        else:
            codes = raw.contiguous().view(torch.int16 if b <= 16 else torch.int32)
        out = _decode_codes(codes, self.fmt)
        if "scale" in p.parts:
            s = int(p.parts["scale"][0])
            s = s - 256 if s > 127 else s
            if s:
                out = (out.double() * 2.0 ** -s).to(torch.float32)
        return out.reshape(p.shape)

    def __repr__(self) -> str:
        return (f"FormatCompressor({self.fmt.name}, rounding={self.rounding.value!r}, scale={self.scale!r}, "
                f"workers={self.workers})")
