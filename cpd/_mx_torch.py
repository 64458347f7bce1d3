"""cpd.mx in pure torch: the block-scaled quantization over cpd's exact element ops.

The fallback of cpd.mx's custom ops (no compiled extension, an unusual format, or a device
without kernels), and the readable statement of what cuda/cpu/mx.cpp and cuda/kernels/mx.cu
compute in one pass (cuda/include/cpd/block.h; the rules are in cpd/mx.py's docstring).
Stochastic rounding takes the (seed, offset) pair of :func:`cpd.ops.draw_seed` as a tensor, so
element i of the padded ``(..., nblocks, block)`` layout draws the word cpd.cast / cpd.mul give it.
"""

from __future__ import annotations

import math

import torch

from .formats import FloatFormat
from .ops import cast as _cast, decode as _decode_codes, encode as _encode_codes
from .rounding import Rounding

__all__ = ["blocks", "unblocks", "tensor_scale", "block_scales", "quantize", "dequantize", "encode", "decode", "pack",
           "unpack", "spec"]


def spec(fmt: FloatFormat) -> list[int]:
    """The custom ops' format argument ``[exp, man, bias, specials, subnormals]``."""
    return [fmt.exp, fmt.man, fmt.bias, fmt.core_specials, int(fmt.subnormals)]


def blocks(x: torch.Tensor, fmt) -> tuple[torch.Tensor, int]:
    """x with the block axis moved last, zero-padded to whole blocks, as (..., nblocks, block)."""
    xm = x.movedim(fmt.axis % x.dim(), -1)
    n = xm.shape[-1]
    pad = (-n) % fmt.block_size
    if pad:
        xm = torch.nn.functional.pad(xm, (0, pad))
    return xm.reshape(*xm.shape[:-1], -1, fmt.block_size), n


def unblocks(y: torch.Tensor, ndim: int, n: int, fmt) -> torch.Tensor:
    y = y.reshape(*y.shape[:-2], -1)[..., :n]
    return y.movedim(-1, fmt.axis % ndim)


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) of positive finite float32 values, exactly (frexp: a = m 2^e, m in [0.5, 1))."""
    return torch.frexp(a)[1].to(torch.int32) - 1


def _emax_elem(el: FloatFormat) -> int:
    """The spec's emax_elem: the exponent of the element format's largest value, floor(log2 max)."""
    return math.frexp(el.max)[1] - 1


def tensor_scale(x: torch.Tensor, fmt) -> torch.Tensor:
    """NVFP4's float32 per-tensor scale T = amax / (max_scale * max_elem) (1 for 0 or non-finite).
    amax = max(max x, -min x): one pass, the same value as max |x| (NaN propagates)."""
    if x.numel():
        lo, hi = torch.aminmax(x)
        amax = torch.maximum(hi, -lo)
    else:
        amax = torch.zeros((), device=x.device)
    t = amax / torch.tensor(fmt.scale.max * fmt.element.max, dtype=torch.float32, device=x.device)
    return torch.where(torch.isfinite(amax) & (amax > 0), t, torch.ones_like(t))


def block_scales(xb: torch.Tensor, fmt, t: torch.Tensor | None) -> torch.Tensor:
    """The shared scale S of every block (float32 values of fmt.scale; NaN for NaN/inf blocks)."""
    amax = xb.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax)  # NaN (amax propagates it) or an infinity
    zero = amax == 0
    a = torch.where(bad | zero, torch.ones_like(amax), amax)
    sf, el = fmt.scale, fmt.element
    smallest = torch.tensor(sf.smallest_subnormal, dtype=torch.float32, device=xb.device)
    if fmt.scale_rule == "amax":
        q = a / torch.tensor(el.max, dtype=torch.float32, device=xb.device)
        if t is not None:
            q = q / t
        s = _cast(q, sf, saturate=True)
        s = torch.maximum(torch.where(s > 0, s, smallest), smallest)
    else:
        if fmt.scale_rule == "even":  # amax to the element's precision first (unbounded exponent)
            a = _cast(a, FloatFormat(8, el.man, bias=127), saturate=True)
        e = _floor_log2(a) - _emax_elem(el)
        if fmt.scale_rule == "ceil":  # one binade up where max_elem * 2^e < amax
            below = torch.ldexp(torch.full_like(a, el.max, dtype=torch.float64), e.to(torch.float64)) < a.double()
            e = e + below.to(torch.int32)
        e = e.clamp(sf.emin, sf.emax)
        s = torch.ldexp(torch.ones_like(a), e.to(torch.float32))
    s = torch.where(zero, smallest, s)
    return torch.where(bad, torch.full_like(s, float("nan")), s)


def _elements(xb, s, fmt, t, mode: Rounding, seed: torch.Tensor) -> torch.Tensor:
    """P_i: the block values divided by their scale, rounded and saturated to the element format."""
    finite = torch.isfinite(s)
    all_finite = bool(finite.all())
    s1 = (s if all_finite else torch.where(finite, s, torch.ones_like(s))).unsqueeze(-1)
    el = fmt.element
    args = (spec(el), mode.code, True, 32)
    if fmt.scale_rule != "amax":  # a power of two: x * 2^-e exactly, rounded once
        inv = torch.ldexp(torch.ones_like(s1), -_floor_log2(s1).to(torch.float32))
        if mode in (Rounding.NEAREST, Rounding.NEAREST_AWAY) and el.smallest_subnormal >= 2.0 ** -120:
            # fl(x * 2^-e) is exact unless it is below 2^-126, where it is so far below half the
            # element's smallest value that both it and the exact quotient round to the same ±0.
            p = torch.ops.cpd.cast((xb * inv).contiguous(), seed, *args)
        else:  # cpd.mul: the exact product rounded once
            xc = xb.contiguous()
            p = torch.ops.cpd.arith(0, xc, inv.expand_as(xb).contiguous(), xc, seed, *args)
    else:
        d = s1 * t if t is not None else s1
        p = torch.ops.cpd.cast((xb / d).contiguous(), seed, *args)
    if fmt.is_int:
        p = p + 0.0  # integers have no -0 (their codes are two's complement)
    return p if all_finite else torch.where(finite.unsqueeze(-1), p, torch.zeros_like(p))


def quantize(x, fmt, mode: Rounding, seed: torch.Tensor):
    """(P (..., nblocks, block), S (..., nblocks), T or None, n) of float32 x."""
    xb, n = blocks(x, fmt)
    t = tensor_scale(x, fmt) if fmt.tensor_scale else None
    s = block_scales(xb, fmt, t)
    p = _elements(xb, s, fmt, t, mode, seed)
    return p, s, t, n


def dequantize(p, s, t):
    d = s if t is None else s * t
    return p.mul_(d.unsqueeze(-1))  # in place (p is ours); NaN scales make the whole block NaN


def cast(x, fmt, mode: Rounding, seed: torch.Tensor) -> torch.Tensor:
    p, s, t, n = quantize(x, fmt, mode, seed)
    return unblocks(dequantize(p, s, t), x.dim(), n, fmt).contiguous()


def encode(x, fmt, mode: Rounding, seed: torch.Tensor, packed: bool):
    """(codes (..., L or packed bytes), scale codes (..., nblocks), T as a 0-d tensor (1 if none))."""
    p, s, t, n = quantize(x, fmt, mode, seed)
    if fmt.is_int:
        codes = torch.round(p * 64).to(torch.int8).view(torch.uint8)
    else:
        codes = _encode_codes(p, fmt.element)
    codes = codes.reshape(*codes.shape[:-2], -1)
    sc = _encode_codes(s, fmt.scale)
    if packed:
        codes = pack(codes, fmt.element.bits)
    return codes, sc, (t if t is not None else torch.ones((), device=x.device))


def decode(codes, scales, t, fmt, n: int, packed: bool) -> torch.Tensor:
    """The float32 values (..., n), block axis last, of codes and scale codes."""
    nb = scales.shape[-1]
    if packed:
        codes = unpack(codes, fmt.element.bits, nb * fmt.block_size)
    if fmt.is_int:
        p = codes.view(torch.int8).to(torch.float32) / 64
    else:
        p = _decode_codes(codes, fmt.element)
    p = p.reshape(*scales.shape, fmt.block_size)
    s = _decode_codes(scales, fmt.scale)
    y = dequantize(p, s, t if fmt.tensor_scale else None)
    return y.reshape(*y.shape[:-2], -1)[..., :n]


# --------------------------------------------------------------------------------------- packing
def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack the low ``bits`` (4, 6 or 8) of uint8 codes along the last axis, low bits first:
    4 -> two per byte (first code in the low nibble); 6 -> four per three bytes. The last axis is
    zero-padded to a whole group (2 codes for 4 bits, 4 for 6)."""
    if bits == 8 or bits not in (4, 6):
        if bits in (5, 7, 8):
            return codes.contiguous()
        raise ValueError(f"pack: bits={bits} is not supported; allowed 4, 6, 8 (5 and 7 stay one per byte)")
    group = 2 if bits == 4 else 4
    pad = (-codes.shape[-1]) % group
    c = torch.nn.functional.pad(codes, (0, pad)).to(torch.int32)
    c = c.reshape(*c.shape[:-1], -1, group)
    if bits == 4:
        return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)
    w = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)  # 24 bits
    out = torch.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], dim=-1)
    return out.reshape(*out.shape[:-2], -1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The inverse of :func:`pack`: the first ``n`` codes of each row."""
    if bits in (5, 7, 8):
        return packed[..., :n]
    p = packed.to(torch.int32)
    if bits == 4:
        c = torch.stack([p & 0xF, p >> 4], dim=-1)
    elif bits == 6:
        p = p.reshape(*p.shape[:-1], -1, 3)
        w = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
        c = torch.stack([(w >> (6 * i)) & 0x3F for i in range(4)], dim=-1)
    else:
        raise ValueError(f"unpack: bits={bits} is not supported; allowed 4, 6, 8")
    return c.reshape(*c.shape[:-2], -1)[..., :n].to(torch.uint8)
