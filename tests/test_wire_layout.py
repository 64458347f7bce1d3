"""The chunk-major layout of a stream (cpd/distributed/layout.py) against a per-element oracle.

Invariants defended:
* chunk c of a stream is chunk c of every layer (``numpy.array_split``), layer after layer, and
  :meth:`Layout.segments` of elements ``[lo, hi)`` of chunk c names exactly those elements of the
  flat bucket, in order, each with its layer's scale: checked element by element against the
  positions built from ``numpy.array_split`` for hypothesis' layer sizes (empty layers, layers
  smaller than the number of chunks, single elements) and ranges (empty, whole, inside one layer,
  across many);
* :meth:`Layout.ranges_segments` of several ranges is their segments one after another;
* segments are kept per arguments (the same tensor again; new rows when a scale or offset moves);
* a chunk's sub-chunks tile its bytes: as few as hold at most ``sub`` elements, each starting on
  a multiple of 8 elements, of equal size but the last (a chunk a little over ``sub`` goes in two
  halves);
* the float32 byte model (:func:`cpd.distributed.float32_ring_bytes`) counts the messages of a ring
  built from ``numpy.array_split``, and :meth:`WireFormat.nbytes` equals ``cpd.codec.code_nbytes``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cpd
from cpd.distributed.layout import layout


def _chunk_positions(sizes, parts, c):
    """Flat positions of chunk c of the stream (layer after layer), and each one's layer."""
    pos, layer, base = [], [], 0
    for k, n in enumerate(sizes):
        piece = np.array_split(np.arange(base, base + n), parts)[c]
        pos += piece.tolist()
        layer += [k] * len(piece)
        base += n
    return pos, layer


def _expand(segs):
    """(flat position, scale) of every element the segments rows name, in order."""
    out = []
    for off, n, s in segs.tolist():
        out += [(off + i, s) for i in range(n)]
    return out


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=12), parts=st.integers(1, 5),
       fmt=st.sampled_from(["e4m3", cpd.FloatFormat(3, 0), "bf16"]), data=st.data())
def test_segments_name_the_chunk_elements(sizes, parts, fmt, data):
    lay = layout(cpd.FloatFormat.parse(fmt) if isinstance(fmt, str) else fmt, tuple(sizes), parts, 8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
    scales = [data.draw(st.integers(-20, 20)) for _ in sizes]
    for c in range(parts):
        pos, layer = _chunk_positions(sizes, parts, c)
        assert lay.lengths[c] == len(pos)
        assert _expand(lay.segments(c, offsets, scales)) == [(p, scales[k]) for p, k in zip(pos, layer)]
        n = len(pos)
        lo = data.draw(st.integers(0, n))
        hi = data.draw(st.integers(lo, n))
        want = [(p, scales[k]) for p, k in zip(pos[lo:hi], layer[lo:hi])]
        assert _expand(lay.segments(c, offsets, scales, lo, hi)) == want
        # several disjoint ranges, one after another
        cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
        ranges = [(a, b) for a, b in zip(cuts[::2], cuts[1::2])]
        if ranges:
            got = _expand(lay.ranges_segments(c, offsets, scales, ranges))
            assert got == [(p, scales[k]) for a, b in ranges for p, k in zip(pos[a:b], layer[a:b])]
        # sub-chunks tile the chunk's bytes: as few as hold at most `sub` elements each, cut at
        # multiples of 8 elements (byte boundaries for every width), the same size but the last
        subs, bounds = lay.subchunks(c), lay.sub_bounds(c)
        lo_b, hi_b = lay.chunk(c)
        assert subs[0][0] == lo_b and subs[-1][1] == hi_b
        assert all(x[1] == y[0] for x, y in zip(subs, subs[1:]))
        assert sum(m for _, _, m in subs) == n
        assert len(bounds) == max(-(-n // 8), 1) and bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a % 8 == 0 and b - a <= 8 for a, b in bounds)
        assert [(lo_b + lay.wf.nbytes(a), lo_b + lay.wf.nbytes(b), b - a) for a, b in bounds] == subs


@pytest.mark.parametrize("n,sub,want", [(1180421, 1 << 20, [590216, 590205]), (100, 48, [40, 40, 20]),
                                        (96, 48, [48, 48]), (7, 48, [7]), (0, 48, [0]), (49, 8, [8] * 6 + [1])])
def test_sub_chunks_are_balanced(n, sub, want):
    """A chunk a little over `sub` elements is cut in two halves, not `sub` and a sliver."""
    lay = layout(cpd.FloatFormat.parse("e4m3"), (n,), 1, sub)
    assert [b - a for a, b in lay.sub_bounds(0)] == want


def test_segments_of_a_bucket_of_many_layers_visit_only_their_rows():
    """A sub-range inside one layer of a stream of thousands gives that layer's one row (found by
    bisection: the cost of a sub-chunk's segments does not grow with the bucket's layer count)."""
    sizes = tuple([3, 1000] * 2000)
    lay = layout(cpd.FloatFormat.parse("e4m3"), sizes, 2, 8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
    scales = list(range(len(sizes)))
    pos, layer = _chunk_positions(sizes, 2, 1)
    lo = pos.index(offsets[2001] + 500)  # inside layer 2001's chunk 1
    segs = lay.segments(1, offsets, scales, lo, lo + 10)
    assert segs.tolist() == [[offsets[2001] + 500, 10, 2001]]
    with pytest.raises(ValueError, match="sub-chunk size"):
        layout(cpd.FloatFormat.parse("e4m3"), (4,), 2, 12)


def test_segments_are_kept_per_arguments():
    """The segments of a chunk are built once per (chunk, range, offsets, scales) and kept: the same
    tensor again for the same arguments (the next step, while the scales hold), the rows of the new
    arguments when a scale or an offset moves, and at most 256 kept per layout."""
    sizes = (5, 9, 3)
    lay = layout(cpd.FloatFormat.parse("e5m2"), sizes, 2, 8)
    offsets = (0, 5, 14)
    a = lay.segments(1, offsets, (1, 2, 3))
    assert lay.segments(1, list(offsets), [1, 2, 3]) is a  # lists and tuples alike
    pos, layer = _chunk_positions(sizes, 2, 1)
    for scales, offs in [((1, 2, 3), offsets), ((1, 7, 3), offsets), ((1, 2, 3), (100, 105, 114))]:
        want = [(p - offsets[k] + offs[k], scales[k]) for p, k in zip(pos, layer)]
        assert _expand(lay.segments(1, offs, scales)) == want
        assert _expand(lay.segments(1, offs, scales, 2, 6)) == want[2:6]
    for s in range(600):
        lay.segments(0, offsets, (s, 0, 0))
    assert len(lay._memo) <= 256
    assert _expand(lay.segments(1, offsets, (1, 2, 3))) == [(p, (1, 2, 3)[k]) for p, k in zip(pos, layer)]


@settings(max_examples=200, deadline=None)
@given(numels=st.lists(st.integers(0, 100), max_size=8), world=st.integers(1, 9), data=st.data())
def test_float32_ring_bytes_counts_the_ring_messages(numels, world, data):
    """The byte model of a float32 ring allreduce equals the chunks a ring sends, counted from
    numpy.array_split: rank r sends every chunk but (r + 1) % W in the reduce-scatter and every
    chunk but (r + 2) % W in the allgather (4 bytes each, or itemsize)."""
    from cpd.distributed import float32_ring_bytes

    rank = data.draw(st.integers(0, world - 1))
    want = 0
    if world > 1:
        for n in numels:
            sizes = [len(c) for c in np.array_split(np.arange(n), world)]
            want += sum(sizes[c] for c in range(world) if c != (rank + 1) % world)
            want += sum(sizes[c] for c in range(world) if c != (rank + 2) % world)
    assert float32_ring_bytes(numels, world, rank) == 4 * want
    assert float32_ring_bytes(numels, world, rank, itemsize=2) == 2 * want


@pytest.mark.parametrize("fmt", [cpd.FloatFormat(e, m) for e, m in ((2, 0), (2, 1), (3, 0), (3, 2), (4, 3), (5, 2),
                                                                    (5, 3), (5, 10), (8, 7), (6, 9), (8, 15), (8, 22))]
                         + [cpd.FP32])
def test_wire_bytes_of_every_width(fmt):
    """WireFormat.nbytes (computed from its width, found once) equals cpd.codec.code_nbytes; FP32
    travels as 4 raw bytes per value."""
    from cpd.codec import code_nbytes
    from cpd.distributed.wire import WireFormat

    wf = WireFormat(fmt)
    for n in (0, 1, 2, 3, 7, 8, 9, 1000, 1001):
        assert wf.nbytes(n) == (4 * n if fmt == cpd.FP32 else code_nbytes(n, fmt.bits)), (fmt, n)
    f = fmt
    assert wf.fargs == (f.exp, f.man, f.bias, f.core_specials, f.subnormals)  # the kernels' format fields
