"""The one wire codec of format codes: how values of a :class:`cpd.FloatFormat` travel as bytes.

Rules (the same for the compressors' :class:`~cpd.compressors.FormatCompressor` payloads and for
the real transport of :mod:`cpd.distributed`):

* **Width**: a format of ``b <= 8`` bits sends ``ceil(n * b / 8)`` bytes for ``n`` codes (a bit
  stream, no padding between codes: two 4-bit codes per byte, eight 1-bit codes per byte, 3/5/6/7-
  bit codes straddling bytes); wider formats send each code in its :func:`cpd.code_dtype`
  (int16 for 9..16 bits, int32 above), little-endian. :func:`code_nbytes` is the rule.
* **Bit order**: little-endian bit stream, low bit first: code ``i`` occupies bits
  ``[i*b, (i+1)*b)`` of the stream, bit ``k`` of the stream being bit ``k % 8`` of byte ``k // 8``
  (code 0 in the low bits of byte 0; for 4-bit codes byte j is ``codes[2j] | codes[2j+1] << 4``).
  The last byte is zero-padded.
"""

from __future__ import annotations

import torch

from .formats import FP32, FloatFormat
from .ops import code_dtype, decode, encode

__all__ = ["code_nbytes", "pack_codes", "unpack_codes", "FormatCodec"]

_INT_DTYPES = (torch.uint8, torch.int16, torch.int32, torch.int64)


def _check_bits(bits) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")
    return bits


def code_nbytes(n: int, fmt) -> int:
    """Bytes on the wire of ``n`` codes of ``fmt`` (a :class:`cpd.FloatFormat`, a name, or a width
    in bits): ``ceil(n * bits / 8)`` up to 8 bits, ``n`` times the :func:`cpd.code_dtype` size above."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    bits = fmt if isinstance(fmt, int) and not isinstance(fmt, bool) else FloatFormat.parse(fmt).bits
    if bits <= 8:
        return (n * _check_bits(bits) + 7) // 8
    if bits > 32:
        raise ValueError(f"formats have at most 32 bits, got {bits}")
    return n * (2 if bits <= 16 else 4)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes of ``bits`` bits (1..8) into a uint8 byte stream of ``ceil(n * bits / 8)``
    bytes, low bit first (the module's bit order). ``bits=8`` returns the codes as uint8.
    Vectorized (eight codes make ``bits`` bytes of one int64 word; 1/2/4 bits whole codes per
    byte); the input is not modified."""
    _check_bits(bits)
    if not isinstance(codes, torch.Tensor) or codes.dtype not in _INT_DTYPES:
        raise TypeError(f"codes must be an integer tensor, got {getattr(codes, 'dtype', type(codes).__name__)}")
    c = codes.reshape(-1)
    n = c.numel()
    if n and not (bits == 8 and c.dtype == torch.uint8):
        lo, hi = torch.aminmax(c)  # one reduction (a comparison pass costs ~100x more on uint8)
        if int(lo) < 0 or int(hi) >= (1 << bits):
            raise ValueError(f"codes hold values outside the {bits}-bit range 0..{(1 << bits) - 1}")
    if bits == 8:
        return c.to(torch.uint8)
    if 8 % bits == 0:  # 1, 2, 4 bits: whole codes per byte, code j of a byte at bits [j*b, (j+1)*b)
        k = 8 // bits
        c = c.to(torch.uint8)
        if n % k:
            c = torch.cat([c, c.new_zeros(k - n % k)])
        out = c[0::k].clone()
        for j in range(1, k):
            out |= c[j::k] << (j * bits)
        return out
    pad = (-n) % 8  # 3, 5, 6, 7 bits: eight codes make one (8*bits)-bit word, written as `bits` bytes
    c = c.to(torch.int64)
    if pad:
        c = torch.cat([c, c.new_zeros(pad)])
    words = c[0::8].clone()
    for j in range(1, 8):
        words |= c[j::8] << (j * bits)
    out = torch.empty(words.numel(), bits, dtype=torch.uint8, device=c.device)
    for k in range(bits):
        out[:, k] = (words >> (8 * k)) & 0xFF
    return out.reshape(-1)[:(n * bits + 7) // 8].contiguous()


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The ``n`` codes (uint8) of ``bits`` bits that :func:`pack_codes` packed into ``packed``."""
    _check_bits(bits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got {getattr(packed, 'dtype', type(packed).__name__)}")
    need = code_nbytes(n, bits)
    if packed.numel() != need:
        raise ValueError(f"packed has {packed.numel()} bytes; {n} codes of {bits} bits need {need}")
    p = packed.reshape(-1)
    if bits == 8:
        return p.clone()
    if 8 % bits == 0:
        k, mask = 8 // bits, (1 << bits) - 1
        out = torch.empty(p.numel(), k, dtype=torch.uint8, device=p.device)
        for j in range(k):
            out[:, j] = (p >> (j * bits)) & mask
        return out.reshape(-1)[:n].contiguous()
    pad = (-need) % bits
    p = p.to(torch.int64)
    if pad:
        p = torch.cat([p, p.new_zeros(pad)])
    p = p.view(-1, bits)
    words = p[:, 0].clone()
    for k in range(1, bits):
        words |= p[:, k] << (8 * k)
    mask = (1 << bits) - 1
    codes = torch.empty(words.numel(), 8, dtype=torch.uint8, device=p.device)
    for j in range(8):
        codes[:, j] = (words >> (j * bits)) & mask
    return codes.reshape(-1)[:n].contiguous()


class FormatCodec:
    """Values of one format <-> wire bytes (:func:`code_nbytes` bytes for n values).

    ``encode`` rounds float values to the format (:func:`cpd.encode`) and packs the codes;
    ``decode`` unpacks and decodes (:func:`cpd.decode`). :data:`cpd.FP32` travels as its raw
    float32 bytes (the same bytes its int32 codes would give).
    """

    def __init__(self, fmt):
        self.fmt = FloatFormat.parse(fmt)
        self.bits = self.fmt.bits
        self.dtype = code_dtype(self.fmt)

    def nbytes(self, n: int) -> int:
        return code_nbytes(n, self.bits)

    def pack(self, codes: torch.Tensor) -> torch.Tensor:
        """uint8 wire bytes of integer codes of the format."""
        if self.bits <= 8:
            return pack_codes(codes, self.bits)
        return codes.reshape(-1).to(self.dtype).contiguous().view(torch.uint8)

    def unpack(self, data: torch.Tensor, n: int) -> torch.Tensor:
        """The ``n`` codes (in :func:`cpd.code_dtype`) in ``data``."""
        if self.bits <= 8:
            return unpack_codes(data, self.bits, n)
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
            raise TypeError(f"data must be a uint8 tensor, got {getattr(data, 'dtype', type(data).__name__)}")
        if data.numel() != self.nbytes(n):
            raise ValueError(f"data has {data.numel()} bytes; {n} codes of {self.fmt.name} need {self.nbytes(n)}")
        return data.reshape(-1).clone().view(self.dtype)   # clone: a slice may start at any byte

    def encode(self, x: torch.Tensor, rounding="nearest", *, saturate: bool = False,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Round ``x`` to the format and return its wire bytes (``x`` is not modified)."""
        if self.fmt == FP32 and not saturate and isinstance(x, torch.Tensor) and x.dtype == torch.float32:
            return x.reshape(-1).contiguous().view(torch.uint8).clone()
        return self.pack(encode(x, self.fmt, rounding, saturate=saturate, generator=generator))

    def decode(self, data: torch.Tensor, n: int) -> torch.Tensor:
        """The ``n`` float32 values in ``data`` (a flat tensor)."""
        if self.fmt == FP32:
            return self.unpack(data, n).view(torch.float32)
        return decode(self.unpack(data, n), self.fmt)

    def __repr__(self) -> str:
        return f"FormatCodec({self.fmt.name}, {self.bits} bits)"
