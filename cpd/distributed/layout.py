"""Where each value of a stream sits on the wire: chunk-major layouts and their sub-chunks.

A stream is the layers of one wire format in one exchange. The emulator's order (docs/design.md §3)
splits every layer like ``numpy.array_split`` into P chunks; chunk c of the stream is chunk c of
every layer, layer after layer. On the wire (and in the rank's accumulator) the stream is stored
chunk-major: chunk 0's values, then chunk 1's, each chunk starting on a byte boundary, so one
chunk is one contiguous byte range — the message of one ring hop — and the fused kernels read and
write it in place. Sub-chunks (the pipelining unit) split a chunk at multiples of 8 elements,
which are byte boundaries for every code width, so the sub-chunk messages of a chunk concatenate
to the chunk's message byte for byte.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import os

import torch

from ..primitives import chunk_bounds
from ..formats import FloatFormat
from .wire import WireFormat

__all__ = ["Layout", "layout", "SUB_CHUNK"]

#: Default sub-chunk size in elements (the pipelining unit of a ring hop on gloo); the environment
#: variable ``CPD_WIRE_SUBCHUNK`` overrides it (a positive multiple of 8).
SUB_CHUNK = int(os.environ.get("CPD_WIRE_SUBCHUNK", 1 << 20))


@dataclasses.dataclass(frozen=True)
class Layout:
    """One stream of layers of ``sizes`` elements chunked into ``parts`` chunks."""

    wf: WireFormat
    parts: int
    sizes: tuple
    #: Per chunk: ((layer index in the stream, first element in the layer, length), ...).
    rows: tuple
    #: Per chunk: the position in the chunk where each of its rows starts.
    starts: tuple
    #: Elements per chunk.
    lengths: tuple
    #: Byte offset of each chunk in the stream's buffer, and the total (parts + 1 entries).
    offsets: tuple
    #: Sub-chunk size in elements (a multiple of 8).
    sub: int
    #: :meth:`segments` already built, by their arguments (the same every step while the scales
    #: hold): read-only tensors.
    _memo: dict = dataclasses.field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def nbytes(self) -> int:
        return self.offsets[-1]

    def chunk(self, c: int) -> tuple[int, int]:
        """Byte range of chunk c."""
        return self.offsets[c], self.offsets[c + 1]

    def sub_bounds(self, c: int) -> list[tuple[int, int]]:
        """Element ranges ``[a, b)`` of the sub-chunks of chunk c (one, possibly empty, at least):
        as few as hold at most ``sub`` elements each, of equal size rounded up to a multiple of 8
        (the last one shorter), so that a chunk a little over ``sub`` is cut in two halves, not
        into ``sub`` and a sliver: the first message of a hop lands, and is merged while the
        second travels, sooner."""
        n = self.lengths[c]
        k = max(-(-n // self.sub), 1)
        size = -(-(-(-n // k)) // 8) * 8 if n else self.sub
        return [(a, min(n, a + size)) for a in range(0, max(n, 1), size)]

    def subchunks(self, c: int) -> list[tuple[int, int, int]]:
        """(first byte, end byte, elements) of each sub-chunk of chunk c (:meth:`sub_bounds`)."""
        base = self.offsets[c]
        return [(base + self.wf.nbytes(a), base + self.wf.nbytes(b), b - a) for a, b in self.sub_bounds(c)]

    def _rows(self, c: int, layer_offsets, scales, lo: int, hi: int, out: list) -> None:
        """Append the (offset, length, scale) rows of elements ``[lo, hi)`` of chunk c to ``out``."""
        rows, starts = self.rows[c], self.starts[c]
        for j in range(max(bisect.bisect_right(starts, lo) - 1, 0), len(rows)):
            pos = starts[j]
            if pos >= hi:
                break
            k, a, m = rows[j]
            s0, s1 = max(lo, pos), min(hi, pos + m)
            if s1 > s0:
                out.append((layer_offsets[k] + a + s0 - pos, s1 - s0, scales[k]))

    def segments(self, c: int, layer_offsets, scales, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Kernel segments of elements ``[lo, hi)`` of chunk c (default all): (offset in the flat
        tensor, length, scale exponent) rows, for layers at ``layer_offsets`` (per stream layer)
        scaled by ``2**scales[k]``. Only the rows that meet ``[lo, hi)`` are visited (found by
        bisection), so a sub-chunk of a bucket of many layers costs what its own layers cost.
        Kept per arguments (up to 256 per layout): the caller must not write to the tensor."""
        hi = self.lengths[c] if hi is None else hi
        key = (c, lo, hi, tuple(layer_offsets), tuple(scales))
        segs = self._memo.get(key)
        if segs is None:
            out: list = []
            self._rows(c, layer_offsets, scales, lo, hi, out)
            segs = torch.tensor(out, dtype=torch.int64).reshape(-1, 3)
            if len(self._memo) >= 256:
                self._memo.clear()
            self._memo[key] = segs
        return segs

    def ranges_segments(self, c: int, layer_offsets, scales, ranges) -> torch.Tensor:
        """:meth:`segments` of several ranges ``[(lo, hi), ...]`` of chunk c, one after another."""
        out: list = []
        for lo, hi in ranges:
            self._rows(c, layer_offsets, scales, lo, hi, out)
        return torch.tensor(out, dtype=torch.int64).reshape(-1, 3)


@functools.lru_cache(maxsize=512)
def layout(fmt: FloatFormat, sizes: tuple, parts: int, sub: int = SUB_CHUNK) -> Layout:
    """The (cached) layout of layers of ``sizes`` in ``fmt`` chunked ``parts`` ways."""
    if sub < 8 or sub % 8:
        raise ValueError(f"sub-chunk size must be a positive multiple of 8 elements, got {sub}")
    wf = WireFormat(fmt)
    rows = [[] for _ in range(parts)]
    for k, n in enumerate(sizes):
        for c, (a, b) in enumerate(chunk_bounds(n, parts)):
            if b > a:
                rows[c].append((k, a, b - a))
    lengths = [sum(m for _, _, m in r) for r in rows]
    starts = []
    for r in rows:
        pos, st = 0, []
        for _, _, m in r:
            st.append(pos)
            pos += m
        starts.append(tuple(st))
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + wf.nbytes(n))
    return Layout(wf, parts, tuple(sizes), tuple(tuple(r) for r in rows), tuple(starts), tuple(lengths),
                  tuple(offsets), sub)
