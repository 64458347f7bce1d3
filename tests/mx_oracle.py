"""An independent reference for block-scaled formats, written from the OCP MX v1.0 spec (§6.3)
and NVIDIA's NVFP4 recipe, one block at a time in exact arithmetic (not a test module).

Invariant defended: nothing here calls into cpd's kernels; a BlockFormat is read through its
fields only and every element is rounded by tests/oracle.py (Fractions):

    amax = max |v|;  NaN or inf in the block -> every element NaN
    floor: e = floor(log2 amax) - emax_elem      ceil: smallest e with max_elem * 2^e >= amax
    even:  amax rounded to the element's precision (ties to even), then floor
    amax:  S = round_nearest_to_scale(f32(f32(amax / max_elem) / T)), at least the smallest scale
    e clamped to the scale format's exponents; amax == 0 -> the smallest positive scale
    P = round(v / S) saturated (exact quotient for powers of two; f32(v / f32(S * T)) otherwise)
    value = P * S  (or f32(P * f32(S * T)))
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

import oracle

f32 = oracle.f32


def _fields(exp, man, bias, specials="ieee", subnormals=True, signed=True):
    return type("Fields", (), dict(exp=exp, man=man, bias=bias, specials=specials, subnormals=subnormals,
                                   signed=signed))


def _floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    return e if a >= Fraction(2) ** e else e - 1


def _emax(fmt) -> int:
    return _floor_log2(oracle.max_value(fmt))


def _scale_limits(sf) -> tuple[Fraction, Fraction]:
    """Smallest positive and largest value of the scale format."""
    vals = [v for v in oracle.positive_values(sf) if v > 0]
    return vals[0], vals[-1]


def tensor_scale(values: list[float], fmt) -> float | None:
    if not fmt.tensor_scale:
        return None
    amax = max((abs(v) for v in values), default=0.0)
    if not math.isfinite(amax) or amax == 0:
        return 1.0
    return f32(f32(amax) / f32(float(oracle.max_value(fmt.scale) * oracle.max_value(fmt.element))))


def block_scale(block: list[float], fmt, t: float | None) -> Fraction | None:
    """The shared scale S of one block as a Fraction, or None (NaN) for a NaN/inf block."""
    if any(not math.isfinite(v) for v in block):
        return None
    sf, el = fmt.scale, fmt.element
    smallest, largest = _scale_limits(sf)
    amax = max(Fraction(abs(v)) for v in block)
    if amax == 0:
        return smallest
    max_elem = oracle.max_value(el)
    if fmt.scale_rule == "amax":
        q = f32(f32(float(amax)) / f32(float(max_elem)))
        if t is not None:
            q = f32(q / t)
        s = Fraction(oracle.oracle_round(Fraction(q), sf, "nearest", saturate=True))
        return max(s, smallest)
    if fmt.scale_rule == "even":
        amax = Fraction(oracle.oracle_round(amax, _fields(8, el.man, 127), "nearest", saturate=True))
    e = _floor_log2(amax) - _emax(el)
    if fmt.scale_rule == "ceil":
        while max_elem * Fraction(2) ** e < amax:
            e += 1
    lo, hi = _floor_log2(smallest), _floor_log2(largest)
    return Fraction(2) ** min(max(e, lo), hi)


def quantize_block(block: list[float], fmt, mode: str = "nearest", t: float | None = None) -> list[float]:
    """The fake-quantized values of one block (Python floats, float32 values)."""
    s = block_scale(block, fmt, t)
    if s is None:
        return [math.nan] * len(block)
    out = []
    for v in block:
        if fmt.scale_rule != "amax":
            p = oracle.oracle_round(Fraction(v) / s, fmt.element, mode, saturate=True,
                                    zero_negative=math.copysign(1, v) < 0)
            r = float(Fraction(p) * s) if p != 0 else p
        else:
            d = f32(float(s) * (t if t is not None else 1.0))
            p = oracle.oracle_cast(f32(v / d), fmt.element, mode, saturate=True)
            r = f32(p * d)
        if fmt.is_int and r == 0:
            r = 0.0
        out.append(r)
    return out


def quantize(x: np.ndarray, fmt, mode: str = "nearest") -> np.ndarray:
    """The reference of cpd.mx.cast on a float32 numpy array, block by block along fmt.axis."""
    xm = np.moveaxis(x.astype(np.float32), fmt.axis, -1)
    t = tensor_scale([float(v) for v in x.ravel()], fmt)
    out = np.empty_like(xm)
    for idx in np.ndindex(*xm.shape[:-1]):
        row = [float(v) for v in xm[idx]]
        res = []
        for i in range(0, len(row), fmt.block_size):
            res += quantize_block(row[i:i + fmt.block_size], fmt, mode, t)
        out[idx] = np.array(res, dtype=np.float32)
    return np.moveaxis(out, -1, fmt.axis)
