"""How values travel: the wire format of one stream of the exchange, and the byte models.

The bytes are those of the one codec of format codes (:mod:`cpd.codec`): a format of ``b <= 8``
bits sends ``ceil(n * b / 8)`` bytes for ``n`` values (a low-bit-first bit stream,
:func:`cpd.codec.pack_codes`); wider formats their codes as int16 / int32; :data:`cpd.FP32` its raw
float32 bytes (the same bytes as its int32 codes). Chunks are split into sub-chunks at multiples
of 8 elements, so sub-chunk messages concatenate to the chunk's message byte for byte.
"""

from __future__ import annotations

import dataclasses

from ..codec import code_nbytes, pack_codes, unpack_codes
from ..formats import FP32, FloatFormat
from ..primitives import chunk_bounds

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
        """Bytes of ``n`` values (:func:`cpd.codec.code_nbytes`)."""
        return code_nbytes(n, self.bits)


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
