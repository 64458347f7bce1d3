"""The format-based reduction of one bucket: exponent exchange, per-layer decisions, streams.

1. **Exponent exchange**: one ``all_reduce(MAX)`` of one int32 per layer: ``ceil(log2(max|g| *
   W))`` (APS's FINDMAXEXP) or a sentinel for "no gradient", "all zero", "inf/NaN", so every rank
   decides the same for every layer (the emulator's edge cases, in its order).
2. **Streams**: the low-precision layers (scaled by ``2**s``, cast, encoded: one fused
   :func:`.kernels.encode` per chunk, straight from the bucket) and the float32 layers
   (``fp32_layers``, the hybrid phase), each in its chunk-major :class:`~.layout.Layout`.

   **Encoding ahead.** The exchange needs every layer's max |g| before any scale is known, and the
   encode needs the scales: two passes over the bucket. When the scales can be told in advance
   (``scaling="loss"`` or None: they do not depend on the gradients; ``"aps"``: the scales this
   bucket's layers agreed on in the previous step, a guess) the low-precision stream is encoded
   *before* the exchange, in the pass that finds the maxima (:func:`.kernels.encode` with
   ``amax=``), so the bucket is read once. After the exchange only the layers whose agreed scale
   differs from the guess are encoded again (sub-byte codes: widened to whole bytes; the whole
   stream when the layers on the wire differ), so the codes are always those of the agreed
   scales: the result does not depend on the guess, only the time does
   (:attr:`StepReport.encoded_ahead`, :attr:`StepReport.reencoded`).
3. **Reduce** each stream in the configured order (:mod:`.orders`), then one fused
   :func:`.kernels.decode` per chunk writes ``sum / 2**s`` (times ``inv``) back into the layers'
   positions. inf/NaN layers: the float32 sum over the ranks (an all_gather), visible, flagged.
"""

from __future__ import annotations

import dataclasses
import math
import struct

import torch

from ..formats import FP32
from ..ops import cast
from ..primitives import ceil_log2
from ..report import RoundoffReport, layer_stats
from . import kernels
from .layout import SUB_CHUNK, layout
from .orders import Sums, hierarchical, one_rounding, ring
from .report import StepReport
from .transport import Transport
from .wire import float32_ring_bytes

__all__ = ["FormatReducer", "NONE", "ZERO", "NONFINITE"]

# Per-layer int32 codes of the exponent exchange, combined with MAX: inf/NaN anywhere wins, then
# the largest real exponent, then "all zero", then "no gradient on any rank".
NONE = -(2**31) + 1
ZERO = -(2**31) + 2
NONFINITE = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """The low-precision stream of a bucket, encoded before the exponent exchange."""

    #: The stream's layers (indices into the bucket) and the scale each was encoded with.
    low: tuple
    scales: tuple
    buf: torch.Tensor
    #: This rank's max |g| of each of those layers (from the same pass).
    mags: dict


def _float_of_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


class FormatReducer:
    """Sums the ranks' gradients of one bucket as the emulator would (a format on the wire)."""

    def __init__(self, cfg, tp: Transport, sub_group=None):
        self.cfg = cfg
        self.tp = tp
        self.sub = sub_group
        self.sums = Sums(cfg.rounding, cfg.saturate, cfg.kahan)
        #: Sub-chunk size in elements (the pipelining unit of a ring hop; a multiple of 8).
        self.sub_chunk = SUB_CHUNK
        self._buffers: dict = {}
        #: Per bucket (its layer names and sizes): the scales its low-precision layers agreed on in
        #: the last exchange, the next exchange's guess (APS).
        self._agreed: dict = {}
        #: Encode ahead of the exponent exchange where the scales can be told (see the module's
        #: docstring); False: always find the maxima first, then encode (the same bits).
        self.encode_ahead = True

    def _group(self) -> int:
        """Ranks per group of the order (hierarchical: group_size; else 1)."""
        return self.cfg.group_size if self.cfg.algorithm == "hierarchical" else 1

    def _layout(self, fmt, sizes: tuple):
        """The chunk-major layout of a stream of ``sizes`` (the encode ahead fills the buffer the
        stream then reduces: one layout for both)."""
        return layout(fmt, sizes, self.tp.world // self._group(), self.sub_chunk)

    def _encode_ahead(self, flat, present, names, sizes, offsets, *, step: int, scale_exp) -> _Ahead | None:
        """Encode the low-precision stream before the exchange, with the scales it will most
        likely agree on, finding the layers' max |g| in the same pass; None when no guess exists
        (the first step of a bucket with APS, the hybrid phase, no low-precision layer)."""
        cfg = self.cfg
        if not self.encode_ahead or step < cfg.hybrid_steps:
            return None
        low = tuple(i for i in range(len(sizes)) if present[i] and not cfg.is_fp32_layer(names[i]))
        if not low:
            return None
        if cfg.scaling == "aps":
            last = self._agreed.get((tuple(names), tuple(sizes)))
            if last is None or any(i not in last for i in low):
                return None
            scales = tuple(last[i] for i in low)
        else:
            scales = ((scale_exp or 0) if cfg.scaling == "loss" else 0,) * len(low)
        lay = self._layout(cfg.fmt, tuple(sizes[i] for i in low))
        offs = tuple(offsets[i] for i in low)
        buf = self._buffer(lay.nbytes, flat.device)
        top = dict.fromkeys(low, 0)  # max magnitude bits per layer (NaN's bits above inf's)
        for c in range(lay.parts):
            lo, hi = lay.chunk(c)
            if hi <= lo:
                continue
            segs = lay.segments(c, offs, scales)
            amax = torch.empty(segs.shape[0], dtype=torch.float32)
            kernels.encode(flat, segs, lay.wf, cfg.rounding, cfg.saturate, out=buf[lo:hi], amax=amax)
            for (k, _, _), b in zip(lay.rows[c], amax.view(torch.int32).tolist()):
                top[low[k]] = max(top[low[k]], b)
        return _Ahead(low, scales, buf, {i: _float_of_bits(b) for i, b in top.items()})

    def exponents(self, flat: torch.Tensor, present: list[bool], offsets: list[int], sizes: list[int],
                  known: dict | None = None):
        """This rank's exponent codes, MAX-exchanged; (codes, bytes this rank sent for them).
        ``known``: max |g| of some layers, already found (by the encode ahead)."""
        w = self.tp.world
        mags = dict(known or {})
        rest = [i for i in range(len(sizes)) if present[i] and i not in mags]
        if rest:
            segs = torch.tensor([[offsets[i], sizes[i], 0] for i in rest], dtype=torch.int64).reshape(-1, 3)
            mags.update(zip(rest, kernels.absmax(flat, segs)))
        codes = []
        for i, here in enumerate(present):
            m = mags.get(i, 0.0)
            if not here:
                codes.append(NONE)
            elif not math.isfinite(m):
                codes.append(NONFINITE)
            else:
                codes.append(ZERO if m == 0.0 else ceil_log2(m * w))
        if w == 1 or not codes:
            return codes, 0
        ex = self.tp.all_reduce_max(torch.tensor(codes, dtype=torch.int32))
        return ex.tolist(), float32_ring_bytes([len(codes)], w, self.tp.pos)  # int32: as float32

    @torch.no_grad()
    def reduce(self, flat: torch.Tensor, present: list[bool], names: list[str], sizes: list[int], *, step: int,
               scale_exp: int | None, roundoff: bool = False, inv: float = 1.0, out: torch.Tensor | None = None):
        """Reduce the layers of ``flat`` (float32, layers back to back; absent layers are zeros).

        Returns ``(out, report)``: ``out`` (like ``flat``) holds every layer's sum times ``inv``
        (skipped layers: zeros), ``report`` a :class:`StepReport` (status "skipped" for layers no
        rank has). ``out`` may be given, ``flat`` itself included (the hook's in-place result: a
        layer's positions are written only after the last read of them), except with ``roundoff``
        (which reads ``flat`` at the end).
        """
        cfg, tp, w = self.cfg, self.tp, self.tp.world
        offsets = [0]
        for n in sizes[:-1]:
            offsets.append(offsets[-1] + n)
        sent0, recv0 = tp.sent, tp.received
        ahead = self._encode_ahead(flat, present, names, sizes, offsets, step=step, scale_exp=scale_exp)
        ex, exp_bytes = self.exponents(flat, present, offsets, sizes, ahead.mags if ahead is not None else None)
        all_fp32 = step < cfg.hybrid_steps
        rep = StepReport(step=step, world=w, rank=tp.pos, algorithm=cfg.algorithm, fmt=cfg.fmt.name, buckets=1)
        low, f32, nonfinite, scales = [], [], [], {}
        emax = cfg.fmt.emax
        for i, (name, e) in enumerate(zip(names, ex)):
            if e == NONE:
                rep.status[name], rep.scale_exp[name] = "skipped", None
            elif e == NONFINITE:
                rep.status[name], rep.scale_exp[name] = "nonfinite", None
                nonfinite.append(i)
            elif all_fp32 or cfg.is_fp32_layer(name):
                rep.status[name], rep.scale_exp[name] = "fp32", None
                f32.append(i)
            elif e == ZERO:
                rep.status[name], rep.scale_exp[name] = "zero", None
                low.append(i)
                scales[i] = 0
            else:
                s = (emax - e - cfg.margin if cfg.scaling == "aps"
                     else (scale_exp or 0) if cfg.scaling == "loss" else 0)
                rep.status[name], rep.scale_exp[name] = "lowp", s
                low.append(i)
                scales[i] = s
        if cfg.scaling == "aps":  # the next exchange's guess (an all-zero layer keeps its last one)
            key = (tuple(names), tuple(sizes))
            last = self._agreed.get(key, {})
            if len(self._agreed) >= 64:  # a handful of buckets; forget the rest
                self._agreed.clear()
            self._agreed[key] = {i: last.get(i, 0) if ex[i] == ZERO else scales[i] for i in low}
        if ahead is not None:
            rep.encoded_ahead = sum(sizes[i] for i in ahead.low)
            if ahead.low != tuple(low):  # other layers on the wire: the stream is encoded again
                rep.reencoded, ahead = rep.encoded_ahead, None
        if out is None:
            out = torch.empty_like(flat)
        elif roundoff and out.data_ptr() == flat.data_ptr():
            raise ValueError("reduce: roundoff=True reads flat after the sums; out must not be flat")
        for i, e in enumerate(ex):
            if e == NONE:
                out[offsets[i]:offsets[i] + sizes[i]] = 0.0
        overflow = False  # possible without APS: a non-finite sum (counted by the fused decode)
        zero = frozenset(i for i in low if ex[i] == ZERO)
        for fmt, layers in ((cfg.fmt, low), (FP32, f32)):
            if layers:
                bad, again = self._stream(fmt, layers, flat, out, offsets, sizes, scales, inv,
                                          ahead if fmt is cfg.fmt else None, zero)
                overflow |= bad > 0
                rep.reencoded += again
        for i in nonfinite:  # the float32 sum over the ranks (the emulator's x.sum(0)): visible, flagged
            x = flat[offsets[i]:offsets[i] + sizes[i]]
            rows = tp.all_gather(x) if w > 1 else [x]
            tp.sent += (w - 1) * x.numel() * 4
            tp.received += (w - 1) * x.numel() * 4
            res = torch.stack([r.to(flat.device) for r in rows]).sum(0)
            out[offsets[i]:offsets[i] + sizes[i]] = res * inv if inv != 1.0 else res
        rep.found_inf = bool(nonfinite) or overflow
        if roundoff:
            rep.roundoff, rep.diagnostic_bytes = self._roundoff(names, flat, out, offsets, sizes, rep, scales)
        rep.bytes_sent = tp.sent - sent0 + exp_bytes
        rep.bytes_received = tp.received - recv0 + exp_bytes
        rep.exponent_bytes = exp_bytes
        rep.float32_bytes = float32_ring_bytes([n for n, e in zip(sizes, ex) if e != NONE], w, tp.pos)
        return out, rep

    def _stream(self, fmt, layers, flat, out, offsets, sizes, scales, inv, ahead: _Ahead | None = None,
                zero=frozenset()) -> tuple[int, int]:
        """Encode, reduce and decode the layers ``layers`` of one wire format; returns the number
        of inf/NaN results and of elements encoded again. ``ahead``: these layers, already encoded
        with guessed scales (the layers of ``zero`` are all ±0 on every rank: right at any scale)."""
        cfg, tp = self.cfg, self.tp
        alg, k = cfg.algorithm, self._group()
        lay = self._layout(fmt, tuple(sizes[i] for i in layers))
        offs = tuple(offsets[i] for i in layers)
        sc = tuple(scales.get(i, 0) for i in layers)
        buf = self._buffer(lay.nbytes, flat.device) if ahead is None else ahead.buf
        bad, again = [0], [0]

        def prepare(c: int) -> None:  # the fused encode of chunk c, straight from the bucket
            lo, hi = lay.chunk(c)
            if hi <= lo:
                return
            if ahead is None:
                kernels.encode(flat, lay.segments(c, offs, sc), lay.wf, cfg.rounding, cfg.saturate, out=buf[lo:hi])
                return
            # encoded ahead: again only the layers whose agreed scale is not the guess, in place;
            # sub-byte codes share bytes with their neighbours, so each range is widened to whole
            # bytes (the neighbours' codes, at their agreed scales, come out as they were)
            g = 8 // math.gcd(lay.wf.bits, 8)  # codes per whole number of bytes
            pos, stale = 0, []
            for kk, _, m in lay.rows[c]:
                if sc[kk] != ahead.scales[kk] and layers[kk] not in zero:
                    a, b = pos // g * g, min(-(-(pos + m) // g) * g, lay.lengths[c])
                    if stale and a <= stale[-1][1]:
                        a = stale.pop()[0]
                    stale.append((a, b))
                pos += m
            if len(stale) == 1:
                a, b = stale[0]
                kernels.encode(flat, lay.segments(c, offs, sc, a, b), lay.wf, cfg.rounding, cfg.saturate,
                               out=buf[lo + lay.wf.nbytes(a):lo + lay.wf.nbytes(b)])
            elif stale:  # many moved layers (a bucket of many small ones): one encode, then copies
                codes = kernels.encode(flat, lay.ranges_segments(c, offs, sc, stale), lay.wf, cfg.rounding,
                                       cfg.saturate, out=self._buffer(hi - lo, flat.device, 1))
                at = 0
                for a, b in stale:  # each range starts on a byte boundary, so its bytes follow on
                    n = lay.wf.nbytes(b) - lay.wf.nbytes(a)
                    buf[lo + lay.wf.nbytes(a):lo + lay.wf.nbytes(b)].copy_(codes[at:at + n])
                    at += n
            again[0] += sum(b - a for a, b in stale)

        def final(c: int, j: int, data: torch.Tensor) -> None:  # the fused decode of one final sub-chunk
            if data.numel():
                a, b = lay.sub_bounds(c)[j]  # sub-chunk j of chunk c
                wf = lay32.wf if lay32 is not None else lay.wf
                bad[0] += kernels.decode(data, lay.segments(c, offs, sc, a, b), out, wf, inv)

        def scratch(slot: int, nbytes: int) -> torch.Tensor:
            return self._buffer(nbytes, flat.device, slot)

        lay32 = None
        if alg == "ring":
            c_buf = torch.zeros_like(buf) if cfg.kahan else None
            ring(tp, lay, buf, c_buf, tp.ranks, tp.pos, self.sums, prepare=prepare, final=final, scratch=scratch)
        elif alg == "hierarchical":
            hierarchical(tp, lay, buf, self.sums, k, self.sub, scratch=scratch, prepare=prepare, final=final)
        else:
            lay32 = layout(FP32, lay.sizes, lay.parts, lay.sub)  # final's bytes are float32 sums
            one_rounding(tp, lay, buf, scratch=scratch, prepare=prepare, final=final)
        return bad[0], again[0]

    def _buffer(self, nbytes: int, device, slot: int = 0) -> torch.Tensor:
        """A buffer of ``nbytes`` (uninitialized) for ``slot`` (0: the stream; others: receives of
        the orders), kept for the next bucket and step: the buckets are reduced one at a time, so
        one buffer per slot, size and device serves them all, and its pages are not faulted in
        again every step."""
        key = (slot, nbytes, str(device))
        buf = self._buffers.get(key)
        if buf is None:
            if len(self._buffers) >= 32:  # a handful of bucket sizes and slots; forget the rest
                self._buffers.clear()
            buf = self._buffers[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return buf

    def _roundoff(self, names, flat, out, offsets, sizes, rep, scales):
        """The emulator's per-layer report rows (cpd.report.layer_stats) from every rank's float32
        gradients (one all_gather, off the hot path)."""
        w, cfg = self.tp.world, self.cfg
        rows = self.tp.all_gather(flat) if w > 1 and flat.numel() else [flat]
        every = torch.stack([r.cpu() for r in rows])
        layers = {}
        for i, name in enumerate(names):
            status = rep.status[name]
            if status == "skipped":
                layers[name] = layer_stats(name, "skipped", torch.zeros(max(w, 1), 0), torch.zeros(0), cfg.fmt)
                continue
            x = every[:, offsets[i]:offsets[i] + sizes[i]]
            res = out[offsets[i]:offsets[i] + sizes[i]].cpu()
            if status in ("nonfinite", "fp32"):
                layers[name] = layer_stats(name, status, x, res, cfg.fmt)
            elif status == "zero":
                layers[name] = layer_stats(name, "zero", x, res, cfg.fmt, None, x, res.new_zeros(x.shape))
            else:
                s = scales[i]
                scaled = (x.double() * 2.0 ** s).to(torch.float32)
                low = cast(scaled, cfg.fmt, cfg.rounding, saturate=cfg.saturate)
                layers[name] = layer_stats(name, "lowp", x, res, cfg.fmt, s, scaled, low)
        method = {"aps": "aps", "loss": "loss-scaled"}.get(cfg.scaling, "unscaled")
        report = RoundoffReport(layers, cfg.fmt, cfg.algorithm, w, method, cfg.group_size)
        return report, (w - 1) * flat.numel() * 4
