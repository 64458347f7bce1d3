"""The fused wire kernels of the exchange, with their pure-torch specification.

Four operations, each one compiled pass (``cuda/cpu/hop.cpp`` on CPU tensors, ``cuda/kernels/hop.cu``
on CUDA tensors; both over the numerics core), and a pure-torch path built from the public ops
(:func:`cpd.cast`, :func:`cpd.encode`, :func:`cpd.add`, :func:`cpd.decode`) used when the CPU
extension is unavailable (``CPD_NO_EXTENSION=1``) and, in the tests, as the specification:

* :func:`encode` — segments of a float32 bucket (``(offset, length, s)``: chunk c of every layer)
  scaled by ``2**s`` (in float64, then float32, as :func:`cpd.aps_allreduce`), cast to the format
  and written as wire bytes (:mod:`.wire`: packed below 8 bits);
* :func:`hop` — one ring hop, in place: ``acc = add(received, acc)`` in the format (one rounding),
  or the Kahan merge of :class:`cpd.primitives.Accumulator`, on wire bytes;
* :func:`decode` — wire bytes back to float32 at the segments' offsets, divided by ``2**s`` (in
  float64) and optionally multiplied by ``inv`` (the hook's ``1/W``);
* :func:`absmax` — per-segment ``max |x|`` (NaN if any NaN), for the exponent exchange.
"""

from __future__ import annotations

import functools

import torch

from .. import _cpu
from ..ops import cast
from ..ops import decode as decode_codes
from ..ops import encode as encode_codes
from ..primitives import Accumulator
from ..rounding import Rounding
from . import cuda_kernels
from .wire import WireFormat, pack_codes, unpack_codes

__all__ = ["encode", "hop", "hop_path", "decode", "absmax", "compiled", "segments"]


def segments(rows) -> torch.Tensor:
    """An int64 ``(k, 3)`` tensor of ``(offset, length, scale exponent)`` rows."""
    t = torch.tensor(list(rows), dtype=torch.int64)
    return t.reshape(-1, 3)


@functools.lru_cache(maxsize=1)
def _ops():
    if _cpu.extension() is None:
        return None
    return torch.ops.cpd_wire


def compiled() -> bool:
    """True when the compiled CPU kernels are in use (False: the pure-torch path)."""
    return _ops() is not None


@functools.lru_cache(maxsize=1)
def _none() -> torch.Tensor:
    """The empty CPU tensor the compiled kernels take for an absent operand (never written)."""
    return torch.empty(0)


# ------------------------------------------------------------------------------------ encode
def encode(x: torch.Tensor, segs: torch.Tensor, wf: WireFormat, rounding: Rounding, saturate: bool,
           out: torch.Tensor | None = None, amax: torch.Tensor | None = None) -> torch.Tensor:
    """Wire bytes of ``x[segments]`` scaled, cast and encoded (``out``: a uint8 tensor of at least
    ``wf.nbytes(total)`` bytes, written from byte 0).

    ``amax`` (a float32 CPU tensor with one entry per segment) also receives each segment's
    :func:`absmax` of the unscaled values, from the same pass over ``x`` on the compiled CPU path
    (the bucket is read from memory once for both)."""
    if out is None:
        total = int(segs[:, 1].sum()) if segs.numel() else 0
        out = torch.empty(wf.nbytes(total), dtype=torch.uint8, device=x.device)
    if amax is not None and (amax.dtype != torch.float32 or amax.device.type != "cpu" or
                             amax.numel() != segs.shape[0] or not amax.is_contiguous()):
        raise ValueError(f"encode: amax must be a contiguous float32 CPU tensor of {segs.shape[0]} entries (one per "
                         f"segment), got {amax.dtype} of {amax.numel()} on {amax.device}")
    ops = None if x.is_cuda else _ops()
    if ops is not None:
        ops.wire_encode(x, segs, out, *wf.fargs, rounding.code, saturate, wf.bits, False, wf.raw32,
                        amax if amax is not None and amax.numel() else _none())
        return out
    if amax is not None and amax.numel():
        amax.copy_(torch.tensor(absmax(x, segs), dtype=torch.float32))
    if x.is_cuda:
        cuda_kernels.encode(x, segs, out, wf, rounding, saturate)
        return out
    data = encode_reference(x, segs, wf, rounding, saturate)
    out[:data.numel()] = data
    return out


def encode_reference(x, segs, wf: WireFormat, rounding: Rounding, saturate: bool) -> torch.Tensor:
    """The specification of :func:`encode` in public ops."""
    vals = []
    for off, n, s in segs.tolist():
        v = x[off:off + n]
        v = (v.double() * 2.0 ** s).to(torch.float32) if s else v
        v = cast(v, wf.fmt, rounding, saturate=saturate)  # cpd.FP32 too (the identity on finite values)
        vals.append(v)
    v = torch.cat(vals) if vals else x.new_zeros(0)
    return to_bytes(v, wf)


def to_bytes(v: torch.Tensor, wf: WireFormat) -> torch.Tensor:
    """Wire bytes of values already in the format (a format without a NaN code sends NaN as +inf:
    only after an overflow, a step every rank skips)."""
    if wf.raw32:
        return v.contiguous().view(torch.uint8).reshape(-1)
    if not wf.fmt.has_nan and bool(torch.isnan(v).any()):
        v = torch.where(torch.isnan(v), torch.full_like(v, float("inf")), v)
    codes = encode_codes(v, wf.fmt)
    if wf.bits <= 8:
        return pack_codes(codes, wf.bits)
    return codes.contiguous().view(torch.uint8).reshape(-1)


def from_bytes(b: torch.Tensor, n: int, wf: WireFormat) -> torch.Tensor:
    """The ``n`` float32 values in wire bytes ``b``."""
    b = b[:wf.nbytes(n)]
    if wf.raw32:
        return b.clone().view(torch.float32)
    if wf.bits <= 8:
        return decode_codes(unpack_codes(b.contiguous(), wf.bits, n), wf.fmt)
    return decode_codes(b.clone().view(torch.int16 if wf.bits <= 16 else torch.int32), wf.fmt)


# ------------------------------------------------------------------------------------ hop
def hop(recv: torch.Tensor, acc: torch.Tensor, n: int, wf: WireFormat, rounding: Rounding, saturate: bool, *,
        kahan: bool = False, recv_c: torch.Tensor | None = None, acc_c: torch.Tensor | None = None,
        carry: bool = False, sequential: bool = False) -> None:
    """Merge the received wire bytes into ``acc`` (wire bytes of ``n`` values), in place.

    Ring role (default): ``acc`` holds this rank's values x; the received partial sum s (with its
    compensation ``recv_c``, or +0) is merged: ``acc = add(s, x)``, or with ``kahan`` the Kahan
    merge of :meth:`cpd.primitives.Accumulator.merge` whose new compensation goes to ``acc_c`` (with
    ``carry``, ``acc_c`` first holds x's own compensation cx). ``sequential=True``: ``acc``
    (and ``acc_c``) hold the running sum s (and c), the received bytes are the next value x.
    """
    if acc.is_cuda:
        cuda_kernels.hop(recv, acc, n, wf, rounding, saturate, kahan, recv_c, acc_c, carry, sequential)
        return
    ops = _ops()
    if ops is not None:
        empty = _none()
        ops.wire_hop(recv, empty if recv_c is None else recv_c, acc, empty if acc_c is None else acc_c, n,
                     *wf.fargs, rounding.code, saturate, wf.bits, False, wf.raw32, kahan,
                     recv_c is not None, carry, 1 if sequential else 0)
        return
    hop_reference(recv, acc, n, wf, rounding, saturate, kahan=kahan, recv_c=recv_c, acc_c=acc_c, carry=carry,
                  sequential=sequential)


def hop_path(wf: WireFormat, rounding: Rounding, saturate: bool, kahan: bool = False) -> str:
    """Which CPU loop :func:`hop` runs for a hop of this format (under the current ``CPD_WIRE_HOP``).

    Plain hops: ``"vector"`` (the 8-bit formats of ``cuda/cpu/hop_avx2.h`` where AVX2 and F16C are
    compiled in), ``"scalar"`` (the fused 8-bit loop: decode through a float table, float32 add,
    one rounding), ``"wide-vector"`` / ``"wide"`` (9..31-bit codes, e.g. bf16, fp16, TF32, every
    deterministic mode: float32 add, one rounding (directed: of the sum corrected by TwoSum's error
    term), with bf16 and fp16 decoded 8 codes per step / through a table of the codes' values; codes
    past 16 bits by a shift where the format shares float32's exponent field, else decode_bits;
    :data:`cpd.FP32` itself: the float32 sum in the mode),
    ``"tables"`` (a table of every pair of codes), ``"exact"`` (``add_bits`` per element).
    Kahan hops: ``"kahan-lanes"`` (float32 lanes, each add one rounding of a float32 sum: the
    formats and modes of the wide and the fused loops, any code width) or
    ``"exact"``. ``"reference"``: no extension (the public ops)."""
    ops = _ops()
    if ops is None:
        return "reference"
    k = ops.wire_hop_path(*wf.fargs, rounding.code, saturate, wf.bits, wf.raw32, kahan)
    return ("exact", "tables", "scalar", "vector", "wide", "wide-vector", "kahan-lanes")[k]


def hop_reference(recv, acc, n, wf: WireFormat, rounding: Rounding, saturate: bool, *, kahan=False, recv_c=None,
                  acc_c=None, carry=False, sequential=False) -> None:
    """The specification of :func:`hop`: decode, :class:`cpd.primitives.Accumulator` merge, encode."""
    a = Accumulator(kahan, wf.fmt, rounding, saturate, None)
    r, mine = from_bytes(recv, n, wf), from_bytes(acc, n, wf)
    nb = wf.nbytes(n)
    if not kahan:
        acc[:nb] = to_bytes(a.add(r, mine), wf)
        return
    if sequential:
        s, c = a.merge(mine, from_bytes(acc_c, n, wf), r)
    else:
        c_in = from_bytes(recv_c, n, wf) if recv_c is not None else torch.zeros_like(r)
        s, c = a.merge(r, c_in, mine, from_bytes(acc_c, n, wf) if carry else None)
    acc[:nb] = to_bytes(s, wf)
    acc_c[:nb] = to_bytes(c, wf)


# ------------------------------------------------------------------------------------ decode
def decode(data: torch.Tensor, segs: torch.Tensor, out: torch.Tensor, wf: WireFormat, inv: float = 1.0) -> int:
    """``out[off:off+n] = decode(...) / 2**s`` (float64 division, then float32), times ``inv``.
    Returns how many of the written values are inf/NaN (the overflow check, fused)."""
    if out.is_cuda:
        cuda_kernels.decode(data, segs, out, wf, inv)
        return _count_nonfinite(out, segs)
    ops = _ops()
    if ops is not None:
        return int(ops.wire_decode(data, segs, out, *wf.fargs, wf.bits, False, wf.raw32, float(inv)))
    decode_reference(data, segs, out, wf, inv)
    return _count_nonfinite(out, segs)


def _count_nonfinite(out: torch.Tensor, segs: torch.Tensor) -> int:
    return sum(int((~torch.isfinite(out[off:off + n])).sum()) for off, n, _ in segs.tolist())


def decode_reference(data, segs, out, wf: WireFormat, inv: float = 1.0) -> None:
    """The specification of :func:`decode` in public ops."""
    total = int(segs[:, 1].sum()) if segs.numel() else 0
    vals = from_bytes(data, total, wf)
    pos = 0
    for off, n, s in segs.tolist():
        v = vals[pos:pos + n]
        pos += n
        if s:
            v = (v.double() / 2.0 ** s).to(torch.float32)
        if inv != 1.0:
            v = v * inv
        out[off:off + n] = v


# ------------------------------------------------------------------------------------ absmax
def absmax(x: torch.Tensor, segs: torch.Tensor) -> list[float]:
    """Per segment ``max |x|`` as Python floats (nan if any NaN, inf if any inf, 0.0 if empty)."""
    if not x.is_cuda:
        ops = _ops()
        if ops is not None:
            return ops.wire_absmax(x, segs).tolist()
    out = []
    for off, n, _ in segs.tolist():
        v = x[off:off + n]
        if n == 0:
            out.append(0.0)
        elif bool(torch.isnan(v).any()):
            out.append(float("nan"))
        else:
            out.append(float(v.abs().max()))
    return out
