"""How values travel: the wire format of one stream of the exchange, and the byte models.

The bytes are those of the one codec of format codes (:mod:`cpd.codec`): a format of ``b <= 8``
bits sends ``ceil(n * b / 8)`` bytes for ``n`` values (a low-bit-first bit stream,
:func:`cpd.codec.pack_codes`); wider formats their codes as int16 / int32; :data:`cpd.FP32` its raw
float32 bytes (the same bytes as its int32 codes). Chunks are split into sub-chunks at multiples
of 8 elements, so sub-chunk messages concatenate to the chunk's message byte for byte.
"""

from __future__ import annotations

import dataclasses
import functools

from ..codec import code_nbytes, pack_codes, unpack_codes
from ..formats import FP32, FloatFormat

__all__ = ["WireFormat", "pack_codes", "unpack_codes", "float32_ring_bytes"]


@dataclasses.dataclass(frozen=True)
class WireFormat:
    """One stream's wire format: the :class:`cpd.FloatFormat`, its code width and whether it
    travels as raw float32 (:data:`cpd.FP32`)."""

    fmt: FloatFormat

    @functools.cached_property
    def raw32(self) -> bool:
        return self.fmt == FP32

    @functools.cached_property
    def bits(self) -> int:
        return 32 if self.raw32 else self.fmt.bits

    @functools.cached_property
    def fargs(self) -> tuple:
        """The format's fields as the compiled kernels take them (exp, man, bias, specials code,
        subnormals), found once."""
        f = self.fmt
        return f.exp, f.man, f.bias, f.core_specials, f.subnormals

    @functools.cached_property
    def _per(self) -> tuple[int, int]:
        """(bits per value, 1) up to 8 bits (packed), else (bytes per value, 0)."""
        b = self.bits
        code_nbytes(0, b)  # checks the width once
        return (b, 1) if b <= 8 else (2 if b <= 16 else 4, 0)

    def nbytes(self, n: int) -> int:
        """Bytes of ``n`` values (:func:`cpd.codec.code_nbytes`; the hot path of the layouts,
        computed from the width found once)."""
        w, packed = self._per
        return (n * w + 7) // 8 if packed else n * w


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
    c1, c2 = (rank + 1) % world, (rank + 2) % world
    for n in numels:  # chunk c of n has q + 1 elements for c < r, else q (chunk_bounds)
        q, r = divmod(n, world)
        total += 2 * n - 2 * q - (c1 < r) - (c2 < r)
    return itemsize * total
