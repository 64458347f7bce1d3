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
  compensations travelling), a broadcast back.
* :func:`one_rounding` — ``all_to_all`` of the chunks, a float32 sum of my chunk in worker order
  (:func:`cpd.add` in FP32), an allgather of the float32 chunks.
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


def _each(lay: Layout, c: int, fn) -> None:
    if fn is not None:
        for j, (lo, hi, n) in enumerate(lay.subchunks(c)):
            fn(c, j, lo, hi)


def ring(tp: Transport, lay: Layout, s_buf: torch.Tensor, c_buf: torch.Tensor | None, members: list[int], pos: int,
         sums: Sums, *, carry: bool = False, prepare=None, final=None) -> None:
    """Ring reduce-scatter + allgather of ``s_buf`` among ``members`` (this rank at ``pos``), in place.

    With Kahan, ``c_buf`` holds the compensations (``carry``: the local values come with theirs,
    the hierarchical leaders'); the compensation travels with the partial sum from the hop where
    it exists (hop 1 with ``carry``, hop 2 otherwise), as the emulator's ``Accumulator.merge``
    specifies.

    ``prepare(c)`` fills chunk c of ``s_buf`` (the fused encode): chunk ``pos`` first, the others
    while its messages travel. ``final(c, j, lo, hi)`` is called once per sub-chunk as soon as its
    bytes are final (the fused decode), so decoding overlaps the rest of the allgather.
    """
    p = len(members)
    if p == 1:
        for c in range(p):
            if prepare is not None:
                prepare(c)
            _each(lay, c, final)
        return
    if not tp.tagged:
        for c in range(p):
            if prepare is not None:
                prepare(c)
        _ring_batched(tp, lay, s_buf, c_buf, members, pos, sums, carry)
        for c in range(p):
            _each(lay, c, final)
        return
    nxt, prv = members[(pos + 1) % p], members[(pos - 1) % p]
    subs = [lay.subchunks(c) for c in range(p)]
    nsub = max(len(s) for s in subs)
    dev = s_buf.device

    def tag(phase: int, h: int, j: int, comp: int = 0) -> int:
        return ((phase * p + h) * nsub + j) * 2 + comp

    def with_c(h: int) -> bool:
        return sums.kahan and (carry or h > 1)

    reads: dict = {}  # (chunk, sub) -> send works reading s_buf there (waited before an overwrite)
    other = []        # every other send work

    def send(phase: int, h: int, c: int, j: int) -> None:
        lo, hi, _ = subs[c][j]
        reads.setdefault((c, j), []).append(tp.isend(s_buf[lo:hi], nxt, tag(phase, h, j)))
        if phase == 0 and with_c(h):
            other.append(tp.isend(c_buf[lo:hi], nxt, tag(0, h, j, 1)))

    def post_reduce_recvs(h: int) -> list:
        c = (pos - h) % p
        out = []
        for j, (lo, hi, _) in enumerate(subs[c]):
            rs = _empty(hi - lo, dev)
            rc = _empty(hi - lo, dev) if with_c(h) else None
            out.append((rs, rc, tp.irecv(rs, prv, tag(0, h, j)),
                        tp.irecv(rc, prv, tag(0, h, j, 1)) if rc is not None else None))
        return out

    # Every receive of the step is posted before any data can arrive for it (gloo then lands each
    # message in place as it comes, and no sender waits on a receive posted late); the
    # allgather's land in buffers of their own, copied into s_buf once its sends have left.
    own = (pos + 1) % p
    gathers = {}
    for g in range(1, p):
        for j, (lo, hi, _) in enumerate(subs[(own - g) % p]):
            b = _empty(hi - lo, dev)
            gathers[g, j] = (b, tp.irecv(b, prv, tag(1, g, j)))
    all_recvs = [post_reduce_recvs(h) for h in range(1, p)]

    # Reduce-scatter.
    if prepare is not None:
        prepare(pos)
    for j in range(len(subs[pos])):
        send(0, 1, pos, j)
    if prepare is not None:
        for c in range(p):
            if c != pos:
                prepare(c)
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
                send(0, h + 1, cr, j)
            else:
                send(1, 1, cr, j)  # the reduced chunk starts the allgather at once
                if final is not None:
                    final(cr, j, lo, hi)
    # Allgather: hop g brings chunk (own - g), which goes into s_buf and on.
    for g in range(1, p):
        c = (own - g) % p
        for j, (lo, hi, _) in enumerate(subs[c]):
            b, w = gathers.pop((g, j))
            tp.wait((w,))
            tp.wait(reads.pop((c, j), ()))  # the reduce-scatter's send of this range has left
            s_buf[lo:hi].copy_(b)
            if g + 1 < p:
                send(1, g + 1, c, j)
            if final is not None:
                final(c, j, lo, hi)
    for ws in reads.values():
        tp.wait(ws)
    tp.wait(other)


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


def hierarchical(tp: Transport, lay: Layout, s_buf: torch.Tensor, sums: Sums, group_size: int, sub) -> None:
    """Gather at the group's first rank, sequential sum there, ring across the leaders, broadcast.
    ``lay`` chunks the stream W / group_size ways (the leaders' ring)."""
    k = group_size
    g, j = divmod(tp.pos, k)
    leader = tp.ranks[g * k]
    c_buf = torch.zeros_like(s_buf) if sums.kahan else None  # code 0 is +0: the +0 compensation
    nb = lay.nbytes
    if k > 1:
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
        else:
            tp.sent += nb
    if j == 0:
        ring(tp, lay, s_buf, c_buf, tp.ranks[::k], g, sums, carry=sums.kahan)
    if k > 1:
        tp.broadcast(s_buf, leader, sub)
        if j == 0:
            tp.sent += (k - 1) * nb
        else:
            tp.received += nb


def one_rounding(tp: Transport, lay: Layout, s_buf: torch.Tensor) -> tuple[Layout, torch.Tensor]:
    """all_to_all of the chunks; my chunk summed in float32 in worker order; float32 allgather.
    Returns the float32 layout and its buffer (every chunk's float32 sum)."""
    w, pos = tp.world, tp.pos
    lay32 = layout(FP32, lay.sizes, lay.parts, lay.sub)
    out = torch.empty(lay32.nbytes, dtype=torch.uint8, device=s_buf.device)
    n = lay.lengths[pos]
    in_splits = [lay.offsets[c + 1] - lay.offsets[c] for c in range(w)]
    my = in_splits[pos]
    recv = torch.empty(my * w, dtype=torch.uint8, device=s_buf.device)
    if w > 1:
        tp.all_to_all(recv, s_buf, [my] * w, in_splits)
        tp.sent += sum(in_splits) - my
        tp.received += my * (w - 1)
    else:
        recv.copy_(s_buf)
    seg = torch.tensor([[0, n, 0]], dtype=torch.int64)
    acc = Accumulator(False, FP32, Rounding.NEAREST, False, None)
    total = None
    for r in range(w):
        row = torch.empty(n, dtype=torch.float32, device=s_buf.device)
        kernels.decode(recv[r * my:(r + 1) * my], seg, row, lay.wf)
        total = row if total is None else acc.add(total, row)
    lo, hi = lay32.chunk(pos)
    if n:
        out[lo:hi] = total.view(torch.uint8)
    if w > 1:
        allgather(tp, lay32, out, tp.ranks, pos, pos)
    return lay32, out
