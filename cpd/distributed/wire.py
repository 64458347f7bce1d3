"""How values travel: the wire format of one stream of the exchange, and the byte models.

A format of ``b <= 8`` bits sends ``ceil(n * b / 8)`` bytes for ``n`` values (a low-bit-first bit
stream, :func:`pack_codes`); wider formats their codes as int16 / int32; :data:`cpd.FP32` its raw
float32 bytes. Chunks are split into sub-chunks at multiples of 8 elements, so sub-chunk
messages concatenate to the chunk's message byte for byte, for every width.
"""

from __future__ import annotations

import dataclasses

import torch

from ..collectives import chunk_bounds
from ..formats import FP32, FloatFormat

__all__ = ["WireFormat", "pack_codes", "unpack_codes", "float32_ring_bytes"]


@dataclasses.dataclass(frozen=True)
class WireFormat:
    """One stream's wire format: the :class:`cpd.FloatFormat`, its code width and whether it
    travels as raw float32 (:data:`cpd.FP32`)."""

    fmt: FloatFormat

    @property
    def raw32(self) -> bool:
        return self.fmt == FP32

    @property
    def bits(self) -> int:
        return 32 if self.raw32 else self.fmt.bits

    def nbytes(self, n: int) -> int:
        b = self.bits
        if b <= 8:
            return (n * b + 7) // 8
        return n * (2 if b <= 16 else 4)


def _check_bits(bits) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes of ``bits`` bits (1..8) into a uint8 byte stream, ``ceil(n * bits / 8)`` bytes.

    Code i occupies bits ``[i*bits, (i+1)*bits)`` of the little-endian bit stream (code 0 in the low
    bits of byte 0; for 4-bit codes byte j = ``codes[2j] | codes[2j+1] << 4``). ``bits=8`` returns
    the codes as uint8. Vectorized; the input is not modified.
    """
    _check_bits(bits)
    if not isinstance(codes, torch.Tensor) or codes.dtype not in (torch.uint8, torch.int16, torch.int32, torch.int64):
        raise TypeError(f"codes must be an integer tensor, got {getattr(codes, 'dtype', type(codes).__name__)}")
    c = codes.reshape(-1)
    if bits == 8:
        return c.to(torch.uint8)
    n = c.numel()
    pad = (-n) % 8
    c = c.to(torch.int64)
    if pad:
        c = torch.cat([c, c.new_zeros(pad)])
    shifts = torch.arange(0, 8 * bits, bits, device=c.device, dtype=torch.int64)
    words = (c.view(-1, 8) << shifts).sum(1)  # 8 codes -> one (8 * bits)-bit word
    byte_shifts = torch.arange(0, 8 * bits, 8, device=c.device, dtype=torch.int64)
    out = ((words.unsqueeze(1) >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)
    return out[:(n * bits + 7) // 8].contiguous()


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The ``n`` uint8 codes of ``bits`` bits packed by :func:`pack_codes`."""
    _check_bits(bits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got {getattr(packed, 'dtype', type(packed).__name__)}")
    need = (n * bits + 7) // 8
    if packed.numel() != need:
        raise ValueError(f"packed has {packed.numel()} bytes; {n} codes of {bits} bits need {need}")
    p = packed.reshape(-1)
    if bits == 8:
        return p.clone()
    pad = (-need) % bits
    p = p.to(torch.int64)
    if pad:
        p = torch.cat([p, p.new_zeros(pad)])
    byte_shifts = torch.arange(0, 8 * bits, 8, device=p.device, dtype=torch.int64)
    words = (p.view(-1, bits) << byte_shifts).sum(1)
    shifts = torch.arange(0, 8 * bits, bits, device=p.device, dtype=torch.int64)
    return ((words.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1)[:n].to(torch.uint8)


def float32_ring_bytes(numels, world: int, rank: int = 0, itemsize: int = 4) -> int:
    """Bytes rank ``rank`` sends in a ring allreduce of layers of ``numels`` elements of
    ``itemsize`` bytes (float32: 4), each layer chunked into ``world`` chunks (numpy.array_split).

    In the reduce-scatter rank r sends every chunk but ``(r+1) % W``, in the allgather every chunk
    but ``(r+2) % W``; summed over the ranks this is ``2 (W-1) n`` values. The baseline of
    :attr:`StepReport.ratio`, and the model of the exponent exchange (int32: same size).
    """
    if world == 1:
        return 0
    total = 0
    for n in numels:
        b = chunk_bounds(n, world)
        size = lambda c: b[c % world][1] - b[c % world][0]  # noqa: E731
        total += 2 * n - size(rank + 1) - size(rank + 2)
    return itemsize * total
