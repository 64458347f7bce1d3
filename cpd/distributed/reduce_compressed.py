"""The compressor-based reduction (:mod:`cpd.compressors` payloads on every link), across processes.

The emulator's ``cpd.compressors.reduce_layers`` with this rank as worker ``tp.pos``: one
``all_reduce(MAX)`` of per-layer flags (no gradient / finite / inf-NaN), each rank quantizes its
layers once with its own error-feedback states (rank r keeps the emulator's worker-r state), then
the ``"ring"`` or ``"pairwise"`` order of :mod:`cpd.compressors.reduce` over point-to-point
messages and a ring allgather of the final payloads. A message concatenates the payloads' uint8
parts in :meth:`cpd.compressors.Compressor.wire_layout` order; sizes that follow from the shapes
are not sent, data-dependent ones (threshold/adaptive index words) go first as int32
(:attr:`StepReport.length_bytes`). A step with inf/NaN can be rolled back (:meth:`rollback`).
"""

from __future__ import annotations

import torch

from ..compressors import CompressorState, ErrorFeedback, Payload
from ..compressors.reduce import quantize_chunks
from ..formats import FP32
from ..primitives import all_finite
from ..rounding import Rounding
from . import kernels
from .layout import layout
from .orders import Sums, one_rounding, ring
from .reduce_format import NONE as _NONE
from .reduce_format import NONFINITE as _NONFINITE
from .report import StepReport
from .transport import Transport
from .wire import float32_ring_bytes

__all__ = ["CompressedReducer"]


class CompressedReducer:
    """Sums the ranks' gradients as ``cpd.allreduce(..., compressor=...)`` per layer, bit for bit."""

    def __init__(self, cfg, tp: Transport):
        self.cfg = cfg
        self.tp = tp
        #: {layer name: this rank's CompressorState} (error feedback).
        self.states: dict = {}
        self._undo: dict = {}  # states changed since begin_step(): name -> (residual, steps)
        self._layouts: dict = {}
        self._lens = 0

    def begin_step(self) -> None:
        """Start a step: forget the error-feedback states saved for :meth:`rollback`."""
        self._undo = {}

    def rollback(self) -> None:
        """Restore the error-feedback states changed since :meth:`begin_step` (a skipped step
        leaves them untouched, as the emulator's ``reduce_layers`` does)."""
        for name, (residual, steps) in self._undo.items():
            st = self.states[name]
            st.residual, st.steps = residual, steps
        self._undo = {}

    def _fp32_allreduce(self, flat: list[torch.Tensor]) -> torch.Tensor:
        """The float32 layers: ``allreduce(..., FP32, algorithm="ring" | "sequential")``."""
        tp = self.tp
        lay = layout(FP32, tuple(f.numel() for f in flat), tp.world)
        x = torch.cat([f.reshape(-1) for f in flat]).to(tp.device)
        offs, acc = [], 0
        for f in flat:
            offs.append(acc)
            acc += f.numel()
        buf = torch.empty(lay.nbytes, dtype=torch.uint8, device=x.device)
        sc = [0] * len(flat)
        for c in range(lay.parts):
            lo, hi = lay.chunk(c)
            if hi > lo:
                kernels.encode(x, lay.segments(c, offs, sc), lay.wf, Rounding.NEAREST, False, out=buf[lo:hi])
        out = torch.empty_like(x)

        def final(c: int, j: int, data: torch.Tensor) -> None:  # sub-chunk j of chunk c is final
            if data.numel():
                a, b = lay.sub_bounds(c)[j]
                kernels.decode(data, lay.segments(c, offs, sc, a, b), out, lay.wf)

        if self.cfg.algorithm == "ring":
            ring(tp, lay, buf, None, tp.ranks, tp.pos, Sums(Rounding.NEAREST, False, False), final=final)
        else:
            one_rounding(tp, lay, buf, final=final,
                         scratch=lambda slot, n: torch.empty(n, dtype=torch.uint8, device=x.device))
        return out.cpu()

    @torch.no_grad()
    def reduce(self, grads, names, shapes, step):
        """The emulator's ``cpd.compressors.reduce_layers`` across processes (this rank = worker
        ``self.pos``): flags exchange, then every compressed layer in the order of
        :mod:`cpd.compressors.reduce`, all layers of one hop in one message."""
        cfg, tp, comp = self.cfg, self.tp, self.cfg.compressor
        w = tp.world
        sent0, recv0 = tp.sent, tp.received
        self._lens = 0
        flat = [None if g is None else g.detach().to(torch.float32).cpu().reshape(tuple(sh))
                for g, sh in zip(grads, shapes)]
        all_fp32 = step < cfg.hybrid_steps
        fp32 = [all_fp32 or cfg.is_fp32_layer(n) for n in names]
        # 1. Per layer: error-feedback value v = g + residual (not committed yet), and one MAX
        #    exchange of _NONE (no gradient) < 0 (finite) < 1 (v overflows float32) < _NONFINITE.
        values, codes = {}, []
        for i, (name, g) in enumerate(zip(names, flat)):
            if g is None:
                codes.append(_NONE)
            elif not all_finite(g):
                codes.append(_NONFINITE)
            else:
                codes.append(0)
                if not fp32[i]:
                    values[i] = self._value(name, g)
                    codes[-1] = int(not all_finite(values[i].value))
        ex = torch.tensor(codes, dtype=torch.int32)
        if w > 1 and len(codes):
            ex = tp.all_reduce_max(ex)
            flag_bytes = float32_ring_bytes([len(codes)], w, tp.pos)
        else:
            flag_bytes = 0
        ex = ex.tolist()
        # 2. Per layer decision (reduce_layers: any inf/NaN anywhere -> every layer in float32).
        found_inf = _NONFINITE in ex
        rep = StepReport(step=step, world=w, rank=tp.pos, algorithm=cfg.algorithm, fmt=comp.name, buckets=1,
                         found_inf=found_inf)
        low, f32, overflow = [], [], []
        for i, (name, e) in enumerate(zip(names, ex)):
            if e == _NONE:
                rep.status[name], rep.scale_exp[name] = "skipped", None
                continue
            rep.scale_exp[name] = None
            if flat[i] is None:  # no gradient here, one elsewhere: zeros (the emulator's zeros_like)
                flat[i] = torch.zeros(tuple(shapes[i]), dtype=torch.float32)
                if not fp32[i]:
                    values[i] = self._value(name, flat[i])
            if found_inf or fp32[i]:
                rep.status[name] = "nonfinite" if found_inf else "fp32"
                f32.append(i)
            else:
                rep.status[name] = "compressed"
                low.append(i)
                if e == 1:
                    overflow.append(name)
        if overflow:
            raise ValueError(f"layers {overflow}: gradient + error-feedback residual is inf on some rank, which the "
                             f"{comp.name} compressor cannot encode (the emulator raises too)")
        out = [None] * len(grads)
        # 3. float32 layers: allreduce(..., FP32, algorithm="ring" | "sequential"), as reduce_layers.
        if f32:
            red = self._fp32_allreduce([flat[i] for i in f32])
            off = 0
            for i in f32:
                n = flat[i].numel()
                out[i] = red[off:off + n].reshape(tuple(shapes[i])).clone()
                off += n
        # 4. Compressed layers: quantize once (commit the error feedback), then reduce.
        items = []
        for i in low:
            ef = values[i]
            if ef.active:  # the state exists from the first step that commits a residual
                ef.state = self.states.setdefault(names[i], CompressorState())
                self._undo.setdefault(names[i], (ef.state.residual, ef.state.steps))
            items.append((i, *quantize_chunks(comp, ef, w)))
        if items:
            for (i, _, _, join), chunks in zip(items, self._compressed_allreduce(items)):
                out[i] = join(chunks).reshape(tuple(shapes[i]))
        rep.length_bytes = self._lens
        rep.bytes_sent = tp.sent - sent0 + flag_bytes
        rep.bytes_received = tp.received - recv0 + flag_bytes
        rep.exponent_bytes = flag_bytes
        rep.float32_bytes = float32_ring_bytes([f.numel() for f in flat if f is not None], w, tp.pos)
        return out, rep

    def _value(self, name: str, g: torch.Tensor) -> ErrorFeedback:
        """The error-feedback step of layer ``name``: ``.value`` (``g + residual``, float32) is encoded."""
        return ErrorFeedback(g, self.states.get(name), enabled=self.cfg.compressor.error_feedback)

    def _compressed_allreduce(self, items):
        """items: per layer (index, this rank's W chunk payloads, its W decoded chunks, join).
        Returns per layer the W reduced chunks (identical on every rank)."""
        comp, w, pos = self.cfg.compressor, self.tp.world, self.tp.pos
        ranks = self.tp.ranks
        if w == 1:
            return [list(qs) for _, _, qs, _ in items]
        nxt, prv = ranks[(pos + 1) % w], ranks[(pos - 1) % w]

        def live(c):  # layers whose chunk c is not empty (nothing is sent for an empty chunk)
            return [k for k, (_, _, qs, _) in enumerate(items) if qs[c].numel()]

        def shape(k, c):
            return items[k][2][c].shape

        cur = {}  # layer -> the payload this rank holds for the chunk it sends next
        if self.cfg.algorithm == "ring":
            # Reduce-scatter: chunk c starts at worker c; hop h is done by worker (c + h) % W, which
            # decodes the partial sum, adds its own quantized chunk (float32) and re-encodes.
            for k in live(pos):
                cur[k] = items[k][1][pos]
            for h in range(1, w):
                cs, cr = (pos - h + 1) % w, (pos - h) % w
                got = self._exchange([(nxt, [cur[k] for k in live(cs)])], [(prv, [shape(k, cr) for k in live(cr)])])[0]
                cur = {k: comp.encode_raw(comp.decode_raw(p) + items[k][2][cr]) for k, p in zip(live(cr), got)}
            own = (pos + 1) % w
        else:
            # Pairwise exchange: every worker sends its payload of chunk c to worker c, which sums the
            # W decoded chunks in worker order (float32) and encodes the result.
            sends = [(ranks[c], [items[k][1][c] for k in live(c)]) for c in range(w) if c != pos]
            srcs = [r for r in range(w) if r != pos]
            got = self._exchange(sends, [(ranks[r], [shape(k, pos) for k in live(pos)]) for r in srcs])
            rows = dict(zip(srcs, got))
            for j, k in enumerate(live(pos)):
                terms = [items[k][2][pos] if r == pos else comp.decode_raw(rows[r][j]) for r in range(w)]
                s = terms[0].clone()
                for t in terms[1:]:
                    s = s + t
                cur[k] = comp.encode_raw(s)
            own = pos
        # Allgather along the ring: the owner's final payload reaches the W-1 others; every worker
        # (the owner too) decodes it.
        final = [dict() for _ in items]
        for k, p in cur.items():
            final[k][own] = p
        have = own
        for _ in range(1, w):
            cr = (have - 1) % w
            got = self._exchange([(nxt, [final[k][have] for k in live(have)])],
                                 [(prv, [shape(k, cr) for k in live(cr)])])[0]
            for k, p in zip(live(cr), got):
                final[k][cr] = p
            have = cr
        return [[comp.decode_raw(final[k][c]) if c in final[k] else qs[c] for c in range(w)]
                for k, (_, _, qs, _) in enumerate(items)]

    def _layout(self, shape) -> tuple:
        key = tuple(shape)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layouts[key] = tuple(self.cfg.compressor.wire_layout(torch.Size(key)))
        return lay

    def _exchange(self, sends, recvs):
        """Send payloads and receive payloads of known shapes, point to point, in one batch per phase.

        ``sends``: [(dst rank, [Payload])]; ``recvs``: [(src rank, [chunk shape])]. Each message is
        the concatenation of its payloads' parts in :meth:`Compressor.wire_layout` order; the sizes
        of data-dependent parts travel first, as int32, in a message of their own (counted in
        ``length_bytes``). Returns, per ``recvs`` entry, the list of received Payloads.
        """
        comp = self.cfg.compressor
        out_lens, out_bytes = [], []
        for dst, pays in sends:
            lens, parts = [], []
            for p in pays:
                lay = self._layout(p.shape)
                if set(p.parts) != {n for n, _ in lay}:
                    raise RuntimeError(f"compressor {comp.name}: payload parts {sorted(p.parts)} differ from its "
                                       f"wire_layout {[n for n, _ in lay]}")
                for name, size in lay:
                    t = p.parts[name].reshape(-1)
                    if size is None:
                        lens.append(t.numel())
                    elif t.numel() != size:
                        raise RuntimeError(f"compressor {comp.name}: part {name!r} of a {tuple(p.shape)} payload has "
                                           f"{t.numel()} bytes; its wire_layout says {size}")
                    parts.append(t)
            out_lens.append(torch.tensor(lens, dtype=torch.int32).view(torch.uint8))
            out_bytes.append(torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8))
        layouts = [[self._layout(sh) for sh in shapes] for _, shapes in recvs]
        ndyn = [sum(size is None for lay in lays for _, size in lay) for lays in layouts]
        if any(lens.numel() for lens in out_lens) or any(ndyn):
            before = self.tp.sent
            got = self._p2p_many([(t, dst) for t, (dst, _) in zip(out_lens, sends)],
                                 [(4 * n, src) for n, (src, _) in zip(ndyn, recvs)])
            self._lens += self.tp.sent - before
            in_lens = [g.view(torch.int32).tolist() if g.numel() else [] for g in got]
        else:
            in_lens = [[] for _ in recvs]
        sizes = []
        for lays, lens in zip(layouts, in_lens):
            it = iter(lens)
            sizes.append([[size if size is not None else next(it) for _, size in lay] for lay in lays])
        got = self._p2p_many([(t, dst) for t, (dst, _) in zip(out_bytes, sends)],
                             [(sum(map(sum, sz)), src) for sz, (src, _) in zip(sizes, recvs)])
        result = []
        for buf, (_, shapes), lays, sz in zip(got, recvs, layouts, sizes):
            off, pays = 0, []
            for sh, lay, ps in zip(shapes, lays, sz):
                parts = {}
                for (name, _), n in zip(lay, ps):
                    parts[name] = buf[off:off + n].clone()  # clone: a part may start at any byte
                    off += n
                pays.append(Payload(comp.name, torch.Size(sh), parts))
            result.append(pays)
        return result

    def _p2p_many(self, sends, recvs):
        """One ``batch_isend_irecv`` of uint8 messages: sends [(tensor, dst)], recvs [(nbytes, src)];
        returns the received tensors (bytes counted; empty messages are not sent)."""
        return self.tp.exchange(sends, recvs)
