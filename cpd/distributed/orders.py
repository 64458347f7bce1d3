"""The reduction orders of the format-based exchange, on wire bytes: ring, hierarchical, one_rounding.

Each works on a stream's buffer in its :class:`~.layout.Layout` (chunk-major wire bytes, every
value already in the format) and leaves there what every rank holds at the end; no value is ever
expanded to float32 except in one_rounding's float32 sums. The orders are the emulator's
(:func:`cpd.allreduce`, docs/design.md §3), distributed:

* :func:`ring` — reduce-scatter (chunk c starts at member c; at hop h member p receives the
  partial sum of chunk (p - h) mod P and merges its own values into it with one fused
  :func:`.kernels.hop`) then allgather of the reduced chunks. On gloo every hop is cut into
  sub-chunks sent with their own tags, and every receive of the step is posted first: while
  sub-chunk j is merged, j + 1 is on the wire, and a merged sub-chunk leaves for the next hop at
  once (the pipeline spans hops and the allgather).
  On NCCL one batched send/receive per hop (the device orders the work).
* :func:`hierarchical` — the group's buffers gathered at its first rank, summed there in rank
  order (the sequential role of the hop kernel), the ring across the leaders (with the Kahan
  compensations travelling), a broadcast back. On gloo pipelined like the ring: the members send
  their chunks as sub-chunk messages in the order the leaders' ring needs them (chunk g, g - 1,
  ...: the encode of the next chunk overlaps the send of this one), the leader merges each
  sub-chunk as it lands, and every sub-chunk that becomes final at the leader goes down to the
  members at once (they decode it while the rest is still on the wire).
* :func:`one_rounding` — ``all_to_all`` of the chunks, a float32 sum of my chunk in worker order
  (:func:`cpd.add` in FP32), an allgather of the float32 chunks. On gloo pipelined: every receive
  posted first, each chunk sent as soon as it is encoded, each float32 sub-chunk summed as soon
  as its W rows are in and passed on at once, each received float32 sub-chunk decoded and passed
  on as it lands.

Every order takes ``prepare(c)`` (fill chunk c of the stream's buffer: the fused encode) and
``final(c, j, data)`` (the bytes ``data`` of sub-chunk j of chunk c are final: the fused decode).
Pipelined or not, the bytes that travel and their sums are the same (sub-chunks split chunks at
byte boundaries; every element sees the same adds in the same order).
"""

from __future__ import annotations

import dataclasses

import torch

from ..formats import FP32
from ..primitives import Accumulator
from ..rounding import Rounding
from . import kernels
from .layout import Layout, layout
from .transport import Transport

__all__ = ["Sums", "ring", "hierarchical", "one_rounding"]


@dataclasses.dataclass(frozen=True)
class Sums:
    """How a merge rounds: the rounding mode, saturate, Kahan."""

    rounding: Rounding
    saturate: bool
    kahan: bool


def _empty(n: int, device) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8, device=device)


def _each(lay: Layout, c: int, fn, buf: torch.Tensor) -> None:
    if fn is not None:
        for j, (lo, hi, n) in enumerate(lay.subchunks(c)):
            fn(c, j, buf[lo:hi])


def _prepare_all(lay: Layout, prepare) -> None:
    if prepare is not None:
        for c in range(lay.parts):
            prepare(c)


def _nsub(lay: Layout) -> int:
    return max(len(lay.subchunks(c)) for c in range(lay.parts))


def ring(tp: Transport, lay: Layout, s_buf: torch.Tensor, c_buf: torch.Tensor | None, members: list[int], pos: int,
         sums: Sums, *, carry: bool = False, prepare=None, final=None, scratch=None) -> None:
    """Ring reduce-scatter + allgather of ``s_buf`` among ``members`` (this rank at ``pos``).

    Batched (NCCL): in place, ``s_buf`` ends with the sums. Tagged (gloo): the allgathered chunks
    land in a receive buffer and are decoded and passed on from there (no copy back): only
    ``final`` sees every final byte. ``scratch(slot, nbytes)`` gives kept receive buffers (slots
    100 to 102; default: fresh ones).

    With Kahan, ``c_buf`` holds the compensations (``carry``: the local values come with theirs,
    the hierarchical leaders'); the compensation travels with the partial sum from the hop where
    it exists (hop 1 with ``carry``, hop 2 otherwise), as the emulator's ``Accumulator.merge``
    specifies.

    ``prepare(c)`` fills chunk c of ``s_buf`` (the fused encode): chunk ``pos`` first, then
    ``pos - 1``, ``pos - 2``, ... (the order the hops merge them) while the first messages travel.
    ``final(c, j, data)`` is called once per sub-chunk as soon as its bytes ``data`` (a view of
    ``s_buf``, not written again) are final (the fused decode), so decoding overlaps the rest of
    the allgather.
    """
    p = len(members)
    if p == 1:
        for c in range(p):
            if prepare is not None:
                prepare(c)
            _each(lay, c, final, s_buf)
        return
    if not tp.tagged:
        _prepare_all(lay, prepare)
        _ring_batched(tp, lay, s_buf, c_buf, members, pos, sums, carry)
        for c in range(p):
            _each(lay, c, final, s_buf)
        return
    nxt, prv = members[(pos + 1) % p], members[(pos - 1) % p]
    subs = [lay.subchunks(c) for c in range(p)]
    nsub = max(len(s) for s in subs)
    dev = s_buf.device
    if scratch is None:
        def scratch(slot, nbytes):
            return _empty(nbytes, dev)
    # The receives of hop h hold chunk (pos - h), those of allgather hop g chunk (own - g): distinct
    # chunks, so each kind fits one buffer laid out like the stream.
    r_buf, g_buf = scratch(100, lay.nbytes), scratch(101, lay.nbytes)
    rc_buf = scratch(102, lay.nbytes) if sums.kahan else None

    def tag(phase: int, h: int, j: int, comp: int = 0) -> int:
        return ((phase * p + h) * nsub + j) * 2 + comp

    def with_c(h: int) -> bool:
        return sums.kahan and (carry or h > 1)

    sends = []  # every send work (waited at the end)

    def send(phase: int, h: int, c: int, j: int, src: torch.Tensor) -> None:
        lo, hi, _ = subs[c][j]
        sends.append(tp.isend(src[lo:hi], nxt, tag(phase, h, j)))
        if phase == 0 and with_c(h):
            sends.append(tp.isend(c_buf[lo:hi], nxt, tag(0, h, j, 1)))

    def post_reduce_recvs(h: int) -> list:
        c = (pos - h) % p
        out = []
        for j, (lo, hi, _) in enumerate(subs[c]):
            rs = r_buf[lo:hi]
            rc = rc_buf[lo:hi] if with_c(h) else None
            out.append((rs, rc, tp.irecv(rs, prv, tag(0, h, j)),
                        tp.irecv(rc, prv, tag(0, h, j, 1)) if rc is not None else None))
        return out

    # Every receive of the step is posted before any data can arrive for it (gloo then lands each
    # message in place as it comes, and no sender waits on a receive posted late); the
    # allgather's land in a buffer of their own, decoded and passed on from there.
    own = (pos + 1) % p
    gathers = {}
    for g in range(1, p):
        for j, (lo, hi, _) in enumerate(subs[(own - g) % p]):
            gathers[g, j] = tp.irecv(g_buf[lo:hi], prv, tag(1, g, j))
    all_recvs = [post_reduce_recvs(h) for h in range(1, p)]

    # Reduce-scatter.
    if prepare is not None:
        prepare(pos)
    for j in range(len(subs[pos])):
        send(0, 1, pos, j, s_buf)
    if prepare is not None:
        for i in range(1, p):
            prepare((pos - i) % p)
    for h in range(1, p):
        cr = (pos - h) % p
        recvs = all_recvs[h - 1]
        for j, (lo, hi, n) in enumerate(subs[cr]):
            rs, rc, w1, w2 = recvs[j]
            tp.wait((w1, w2))
            if n:
                kernels.hop(rs, s_buf[lo:hi], n, lay.wf, sums.rounding, sums.saturate, kahan=sums.kahan,
                            recv_c=rc, acc_c=c_buf[lo:hi] if sums.kahan else None, carry=carry)
            if h + 1 < p:
                send(0, h + 1, cr, j, s_buf)
            else:
                send(1, 1, cr, j, s_buf)  # the reduced chunk starts the allgather at once
                if final is not None:
                    final(cr, j, s_buf[lo:hi])
    # Allgather: hop g brings chunk (own - g) into g_buf, decoded and passed on from there.
    for g in range(1, p):
        c = (own - g) % p
        for j, (lo, hi, _) in enumerate(subs[c]):
            tp.wait((gathers.pop((g, j)),))
            if g + 1 < p:
                send(1, g + 1, c, j, g_buf)
            if final is not None:
                final(c, j, g_buf[lo:hi])
    tp.wait(sends)


def _ring_batched(tp, lay, s_buf, c_buf, members, pos, sums, carry) -> None:
    """The same order, one batched send/receive per hop (NCCL: the device orders the work)."""
    p = len(members)
    nxt, prv = members[(pos + 1) % p], members[(pos - 1) % p]
    dev = s_buf.device
    for h in range(1, p):
        cs, cr = (pos - h + 1) % p, (pos - h) % p
        with_c = sums.kahan and (carry or h > 1)
        (slo, shi), (lo, hi) = lay.chunk(cs), lay.chunk(cr)
        rs = _empty(hi - lo, dev)
        rc = _empty(hi - lo, dev) if with_c else None
        sends = [(s_buf[slo:shi], nxt)] + ([(c_buf[slo:shi], nxt)] if with_c else [])
        tp.batch(sends, [(rs, prv)] + ([(rc, prv)] if with_c else []))
        if lay.lengths[cr]:
            kernels.hop(rs, s_buf[lo:hi], lay.lengths[cr], lay.wf, sums.rounding, sums.saturate, kahan=sums.kahan,
                        recv_c=rc, acc_c=c_buf[lo:hi] if sums.kahan else None, carry=carry)
    allgather(tp, lay, s_buf, members, pos, (pos + 1) % p)


def allgather(tp: Transport, lay: Layout, buf: torch.Tensor, members: list[int], pos: int, own: int) -> None:
    """Ring allgather: this rank holds chunk ``own`` of ``buf`` and passes the most recently
    completed chunk on, P - 1 times; ``buf`` ends complete."""
    p = len(members)
    nxt, prv = members[(pos + 1) % p], members[(pos - 1) % p]
    have = own
    for _ in range(1, p):
        cr = (have - 1) % p
        (slo, shi), (lo, hi) = lay.chunk(have), lay.chunk(cr)
        tp.batch([(buf[slo:shi], nxt)], [(buf[lo:hi], prv)])
        have = cr


def hierarchical(tp: Transport, lay: Layout, s_buf: torch.Tensor, sums: Sums, group_size: int, sub, *,
                 scratch, prepare=None, final=None) -> None:
    """Gather at the group's first rank, sequential sum there, ring across the leaders, broadcast.
    ``lay`` chunks the stream W / group_size ways (the leaders' ring). ``scratch(slot, nbytes)``
    gives kept uint8 buffers (receives of the group's rows, the members' final bytes)."""
    k = group_size
    g, j = divmod(tp.pos, k)
    leader = tp.ranks[g * k]
    c_buf = torch.zeros_like(s_buf) if sums.kahan else None  # code 0 is +0: the +0 compensation
    if k > 1 and not tp.tagged:
        _prepare_all(lay, prepare)
        _hierarchical_batched(tp, lay, s_buf, c_buf, sums, k, sub)
        for c in range(lay.parts):
            _each(lay, c, final, s_buf)
        return
    if k == 1:
        ring(tp, lay, s_buf, c_buf, tp.ranks, g, sums, carry=sums.kahan, prepare=prepare, final=final,
             scratch=scratch)
        return
    p = lay.parts
    nsub = _nsub(lay)
    order = [(g - i) % p for i in range(p)]  # the leaders' ring merges chunk g first, then g - 1, ...

    def tag(c: int, jj: int, down: int) -> int:  # member <-> leader messages (no other pair uses them)
        return (c * nsub + jj) * 2 + down

    if j:  # a member: send up chunk by chunk as encoded, decode what comes down as it lands
        down = scratch(1, lay.nbytes)
        final_order = [(g + 1 - i) % p for i in range(p)]  # as the leaders' ring finishes chunks
        recvs = [(c, jj, lo, hi, tp.irecv(down[lo:hi], leader, tag(c, jj, 1)))
                 for c in final_order for jj, (lo, hi, _) in enumerate(lay.subchunks(c))]
        sends = []
        for c in order:
            if prepare is not None:
                prepare(c)
            sends += [tp.isend(s_buf[lo:hi], leader, tag(c, jj, 0)) for jj, (lo, hi, _) in enumerate(lay.subchunks(c))]
        for c, jj, lo, hi, w in recvs:
            tp.wait((w,))
            if final is not None:
                final(c, jj, down[lo:hi])
        tp.wait(sends)
        return
    # The leader: every row's sub-chunk receives posted first.
    rows = [scratch(1 + r, lay.nbytes) for r in range(1, k)]
    ups = {(c, jj): [tp.irecv(row[lo:hi], tp.ranks[g * k + r], tag(c, jj, 0)) for r, row in enumerate(rows, 1)]
           for c in range(p) for jj, (lo, hi, _) in enumerate(lay.subchunks(c))}
    downs = []

    def merge(c: int) -> None:  # my chunk c encoded, then the members' rows merged in rank order
        if prepare is not None:
            prepare(c)
        for jj, (lo, hi, n) in enumerate(lay.subchunks(c)):
            for r, w in enumerate(ups.pop((c, jj)), 1):
                tp.wait((w,))
                if n:
                    kernels.hop(rows[r - 1][lo:hi], s_buf[lo:hi], n, lay.wf, sums.rounding, sums.saturate,
                                kahan=sums.kahan, acc_c=c_buf[lo:hi] if sums.kahan else None, sequential=True)

    def done(c: int, jj: int, data: torch.Tensor) -> None:  # final at the leader: down at once
        downs.extend(tp.isend(data, tp.ranks[g * k + r], tag(c, jj, 1)) for r in range(1, k))
        if final is not None:
            final(c, jj, data)

    ring(tp, lay, s_buf, c_buf, tp.ranks[::k], g, sums, carry=sums.kahan, prepare=merge, final=done,
         scratch=scratch)
    tp.wait(downs)


def _hierarchical_batched(tp, lay, s_buf, c_buf, sums, k, sub) -> None:
    """The same order with one gather and one broadcast (NCCL)."""
    g, j = divmod(tp.pos, k)
    leader = tp.ranks[g * k]
    nb = lay.nbytes
    rows = [torch.empty_like(s_buf) for _ in range(k)] if j == 0 else None
    tp.gather(s_buf, rows, leader, sub)
    if j == 0:
        tp.received += (k - 1) * nb
        for r in range(1, k):
            for c in range(lay.parts):
                lo, hi = lay.chunk(c)
                if lay.lengths[c]:
                    kernels.hop(rows[r][lo:hi], s_buf[lo:hi], lay.lengths[c], lay.wf, sums.rounding,
                                sums.saturate, kahan=sums.kahan,
                                acc_c=c_buf[lo:hi] if sums.kahan else None, sequential=True)
        ring(tp, lay, s_buf, c_buf, tp.ranks[::k], g, sums, carry=sums.kahan)
    else:
        tp.sent += nb
    tp.broadcast(s_buf, leader, sub)
    if j == 0:
        tp.sent += (k - 1) * nb
    else:
        tp.received += nb


def one_rounding(tp: Transport, lay: Layout, s_buf: torch.Tensor, *, scratch, prepare=None, final=None) -> None:
    """all_to_all of the chunks; my chunk summed in float32 in worker order; float32 allgather.
    ``final(c, j, data)`` gets float32 bytes (the layout ``layout(FP32, ...)`` of the same
    layers: same chunks and sub-chunks); ``scratch(slot, nbytes)`` gives kept uint8 buffers."""
    w, pos = tp.world, tp.pos
    lay32 = layout(FP32, lay.sizes, lay.parts, lay.sub)
    out = scratch(1, lay32.nbytes)
    acc = Accumulator(False, FP32, Rounding.NEAREST, False, None)
    my_lo, my_hi = lay.chunk(pos)
    my = my_hi - my_lo
    if not tp.tagged:
        _prepare_all(lay, prepare)
        recv = scratch(2, my * w)
        in_splits = [lay.offsets[c + 1] - lay.offsets[c] for c in range(w)]
        tp.all_to_all(recv, s_buf, [my] * w, in_splits)
        tp.sent += sum(in_splits) - my
        tp.received += my * (w - 1)
        _sum_rows(lay, lay32, [recv[r * my:(r + 1) * my] for r in range(w)], out, pos, acc,
                  range(len(lay.subchunks(pos))), my_lo)
        allgather(tp, lay32, out, tp.ranks, pos, pos)
        for c in range(w):
            _each(lay32, c, final, out)
        return
    nsub = _nsub(lay)
    nxt, prv = tp.ranks[(pos + 1) % w], tp.ranks[(pos - 1) % w]
    # Tags: the all_to_all's sub-chunk j is j; the allgather's hop g (1..W-1) sub-chunk j is g * nsub + j.
    rows = [None if r == pos else scratch(2 + r, my) for r in range(w)]
    a2a = {r: [tp.irecv(rows[r][lo - my_lo:hi - my_lo], tp.ranks[r], jj)
               for jj, (lo, hi, _) in enumerate(lay.subchunks(pos))] for r in range(w) if r != pos}
    gathers = {(g, jj): tp.irecv(out[lo:hi], prv, g * nsub + jj)
               for g in range(1, w) for jj, (lo, hi, _) in enumerate(lay32.subchunks((pos - g) % w))}
    sends = []
    for i in range(1, w + 1):  # the next ranks' chunks first, mine last
        c = (pos + i) % w
        if prepare is not None:
            prepare(c)
        if c != pos:
            sends += [tp.isend(s_buf[lo:hi], tp.ranks[c], jj) for jj, (lo, hi, _) in enumerate(lay.subchunks(c))]
    rows[pos] = s_buf[my_lo:my_hi]
    for jj, (lo, hi, n) in enumerate(lay32.subchunks(pos)):
        tp.wait([a2a[r][jj] for r in a2a])
        _sum_rows(lay, lay32, rows, out, pos, acc, (jj,), my_lo)
        sends.append(tp.isend(out[lo:hi], nxt, nsub + jj))
        if final is not None:
            final(pos, jj, out[lo:hi])
    for g in range(1, w):
        c = (pos - g) % w
        for jj, (lo, hi, _) in enumerate(lay32.subchunks(c)):
            tp.wait((gathers.pop((g, jj)),))
            if g + 1 < w:
                sends.append(tp.isend(out[lo:hi], nxt, (g + 1) * nsub + jj))
            if final is not None:
                final(c, jj, out[lo:hi])
    tp.wait(sends)


def _sum_rows(lay: Layout, lay32: Layout, rows, out, pos: int, acc, which, base: int) -> None:
    """out's float32 bytes of the sub-chunks ``which`` of chunk ``pos`` = the rows' values summed
    in worker order; ``rows[r]`` holds rank r's bytes of chunk ``pos`` (its byte 0 is byte
    ``base`` of the stream)."""
    subs, subs32 = lay.subchunks(pos), lay32.subchunks(pos)
    for k in which:
        (lo, hi, n), (lo32, hi32, _) = subs[k], subs32[k]
        if not n:
            continue
        seg = torch.tensor([[0, n, 0]], dtype=torch.int64)
        total = out[lo32:hi32]  # the float32 sum, in place: row 0 decoded, then each row added
        v = torch.empty(n, dtype=torch.float32, device=out.device)
        for r, row in enumerate(rows):
            kernels.decode(row[lo - base:hi - base], seg, total.view(torch.float32) if r == 0 else v, lay.wf)
            if r:  # acc.add(total, v): the fused hop of cpd.FP32 (float32's own sum in acc's mode)
                kernels.hop(v.view(torch.uint8), total, n, lay32.wf, acc.rounding, acc.saturate)
