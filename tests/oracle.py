"""An exact oracle of the numerics contract (docs/design.md §3), independent of the code under test.

Invariant defended: nothing here calls into cpd. A format is read only through its five fields
(``exp``, ``man``, ``bias``, ``specials``, ``subnormals``); every value, code and rounding
decision is derived from the definition with exact rational arithmetic (``fractions.Fraction``):

    code = s | field (exp bits) | frac (man bits)
    field == 0:  (-1)^s * frac / 2^man * 2^(1 - bias)             (zero and subnormals)
    field >= 1:  (-1)^s * (1 + frac / 2^man) * 2^(field - bias)   (normals)
    specials "ieee":   field == 2^exp - 1 is inf (frac == 0) or NaN (frac != 0)
    specials "fn":     only the all-ones magnitude is NaN, no inf
    specials "finite": every code is a number
    specials "fnuz":   every magnitude is a number; the code of -0 (sign bit alone) is the NaN
    specials "p3109":  the all-ones magnitude is inf, the code of -0 is the NaN; unsigned: all
                       ones is NaN, the code below it +inf
    specials "fnu":    (unsigned) no zero: field 0 is (1 + frac / 2^man) * 2^-bias; all ones NaN
    signed False:      no sign bit; a negative input is NaN, -0 is +0
    no -0 (fnuz, p3109, unsigned): a zero result is +0

Positive magnitudes grow with the magnitude code, so rounding a value means finding the two
consecutive codes c, c + 1 whose values bracket it (by bisection) and applying the rule:

* ``nearest``: the closer one; a tie goes to the even *code* (for man = 0 that is the even
  exponent field). Above the largest finite code the grid continues with the same formula
  ("unbounded exponent"), so ``max_code + 1`` is a hypothetical value; rounding to it is an
  overflow.
* ``toward_zero``: c; ``up``/``down``: c + 1 when that moves toward +inf/-inf, else c.
* ``nearest_away``: the closer one, a tie away from zero; ``odd``: c + 1 when x is inexact and c's
  code is even (an overflow in this mode gives ±max).
* overflow: ``saturate`` or specials "finite" give ±max; otherwise "ieee"/"p3109" give ±inf and
  the others NaN.
* "fnu" (no zero): a positive value below the smallest, 2^-bias, rounds to it in every mode.
  Infinite inputs become that same overflow value in every mode.
* ``subnormals=False``: a result (rounded with gradual underflow; a saturated ±max too) whose magnitude is below
  2^(1 - bias) becomes a zero of the input's sign.
* NaN in gives NaN out; zeros keep their sign.

For stochastic rounding, :func:`oracle_neighbours` gives the two candidates and the exact
probability of taking the one away from zero.
"""

from __future__ import annotations

import bisect
import functools
import math
import struct
from fractions import Fraction

__all__ = [
    "DET_MODES", "MODES", "key", "nbits", "top_field", "mag_code_kind", "mag_value", "max_code", "nan_code",
    "inf_code", "positive_values", "code_value", "max_value", "smallest_normal", "oracle_cast", "oracle_code",
    "oracle_neighbours", "f32", "f32_bits", "f32_from_bits", "same_f32",
]

DET_MODES = ("nearest", "toward_zero", "up", "down", "nearest_away", "odd")
MODES = DET_MODES + ("stochastic",)

INF = math.inf
NAN = math.nan

#: Above this many magnitude codes, rounding bisects over codes instead of a stored value list.
_LIST_LIMIT = 1 << 12


# ----------------------------------------------------------------------------------- float32 helpers
def f32(v: float) -> float:
    """Round a Python float to float32 (round to nearest even, as the hardware does)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def f32_from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def same_f32(a: float, b: float) -> bool:
    """Bitwise float32 equality, except that any NaN equals any NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return f32_bits(a) == f32_bits(b)


# ----------------------------------------------------------------------------------- a format's fields
def key(fmt) -> tuple:
    """The six defining fields as plain values (the only thing read from a FloatFormat)."""
    specials = fmt.specials.value if hasattr(fmt.specials, "value") else str(fmt.specials)
    return (int(fmt.exp), int(fmt.man), int(fmt.bias), specials, bool(fmt.subnormals),
            bool(getattr(fmt, "signed", True)))


def nbits(fmt) -> int:
    exp, man, *_ = key(fmt)
    return int(key(fmt)[5]) + exp + man


def _no_neg_zero(k: tuple) -> bool:
    return k[3] in ("fnuz", "p3109") or not k[5]


def top_field(fmt) -> int:
    return (1 << key(fmt)[0]) - 1


@functools.lru_cache(maxsize=None)
def _kind(k: tuple, c: int) -> str:
    exp, man, bias, specials, _, signed = k
    field, frac = c >> man, c & ((1 << man) - 1)
    ones = (1 << (exp + man)) - 1
    if specials == "ieee" and field == (1 << exp) - 1:
        return "inf" if frac == 0 else "nan"
    if specials in ("fn", "fnu") and c == ones:
        return "nan"
    if specials == "p3109":
        if c == ones:
            return "inf" if signed else "nan"
        if c == ones - 1 and not signed:
            return "inf"
    return "finite"


def mag_code_kind(fmt, c: int) -> str:
    """'finite', 'inf' or 'nan' for a magnitude code (no sign bit)."""
    return _kind(key(fmt), c)


def _value(k: tuple, c: int) -> Fraction:
    """The definition's value of magnitude code c, ignoring specials (also used one past the top)."""
    exp, man, bias, specials = k[:4]
    field, frac = c >> man, c & ((1 << man) - 1)
    if field == 0 and specials != "fnu":
        return Fraction(frac, 1 << man) * Fraction(2) ** (1 - bias)
    return (1 + Fraction(frac, 1 << man)) * Fraction(2) ** (field - bias)


def mag_value(fmt, c: int) -> Fraction:
    """Exact value of a finite magnitude code."""
    assert mag_code_kind(fmt, c) == "finite", c
    return _value(key(fmt), c)


@functools.lru_cache(maxsize=None)
def _max_code(k: tuple) -> int:
    exp, man = k[0], k[1]
    c = (1 << (exp + man)) - 1
    while c >= 0 and _kind(k, c) != "finite":  # at most 2^man steps (ieee's reserved binade)
        if k[3] == "ieee" and (c >> man) == (1 << exp) - 1:
            c = ((1 << exp) - 1 << man) - 1
        else:
            c -= 1
    return c


def max_code(fmt) -> int:
    """Largest magnitude code that is a finite number."""
    return _max_code(key(fmt))


def nan_code(fmt) -> int | None:
    """Canonical (quiet) NaN code: ieee -> top field with the top mantissa bit; fn, fnu and unsigned
    p3109 -> all ones; fnuz and signed p3109 -> the sign bit alone (the -0 code)."""
    exp, man, _, specials, _, signed = key(fmt)
    if specials in ("fnuz", "p3109") and signed:
        return 1 << (exp + man)
    if specials == "ieee":
        return None if man == 0 else ((1 << exp) - 1 << man) | (1 << (man - 1))
    if specials in ("fn", "fnu", "p3109"):
        return (1 << (exp + man)) - 1
    return None


def inf_code(fmt) -> int | None:
    exp, man, _, specials, _, signed = key(fmt)
    if specials == "p3109":
        return (1 << (exp + man)) - (1 if signed else 2)
    return ((1 << exp) - 1) << man if specials == "ieee" else None


def max_value(fmt) -> Fraction:
    return _value(key(fmt), max_code(fmt))


def smallest_normal(fmt) -> Fraction:
    k = key(fmt)
    return Fraction(2) ** ((0 if k[3] == "fnu" else 1) - k[2])


@functools.lru_cache(maxsize=None)
def _values(k: tuple) -> tuple:
    return tuple(_value(k, c) for c in range(_max_code(k) + 2))  # one past the top: hypothetical


def positive_values(fmt) -> list[Fraction]:
    """Sorted values of the finite magnitude codes 0..max_code (index = code)."""
    return list(_values(key(fmt))[:-1])


def code_value(fmt, code: int) -> float:
    """Value of a full code (sign bit included) as a Python float: ±inf, NaN or an exact number."""
    exp, man = key(fmt)[:2]
    if nan_code(fmt) is not None and code == nan_code(fmt):
        return NAN
    neg = (code >> (exp + man)) & 1 if key(fmt)[5] else 0
    c = code & ((1 << (exp + man)) - 1)
    kind = _kind(key(fmt), c)
    if kind == "nan":
        return NAN
    v = INF if kind == "inf" else float(_value(key(fmt), c))
    return -v if neg else v


# ----------------------------------------------------------------------------------- bracketing
def _bracket(k: tuple, a: Fraction) -> int:
    """Largest magnitude code c in 0..max_code+1 with value(c) <= a (max_code+1 is hypothetical)."""
    top = _max_code(k) + 1
    if top < _LIST_LIMIT:
        return bisect.bisect_right(_values(k), a) - 1
    lo, hi = 0, top  # invariant: value(lo) <= a; answer in [lo, hi]
    if _value(k, hi) <= a:
        return hi
    while hi - lo > 1:  # value(hi) > a
        mid = (lo + hi) // 2
        if _value(k, mid) <= a:
            lo = mid
        else:
            hi = mid
    return lo


@functools.lru_cache(maxsize=1 << 20)
def _analyse(k: tuple, a: Fraction):
    """(c, p) for a finite magnitude a >= 0: a lies in [value(c), value(c+1)) with fractional
    distance p in [0, 1); c == max_code+1 means a is at or beyond the first value past the top
    (p is then 1: any rounding away from zero overflows, toward zero gives max)."""
    c = _bracket(k, a)
    top = _max_code(k)
    if c > top:
        return top, Fraction(1)
    lo, hi = _value(k, c), _value(k, c + 1)
    return c, (a - lo) / (hi - lo)


def _overflow(k: tuple, saturate: bool):
    """What an overflow (or an infinite input) becomes, before the flush rule."""
    if saturate or k[3] == "finite":
        return _value(k, _max_code(k))
    return INF if k[3] in ("ieee", "p3109") else NAN


def _finish(k: tuple, c: int, saturate: bool, neg: bool) -> float:
    """Value of rounding to magnitude code c (c == max_code+1: overflow), flushed and signed."""
    if neg and not k[5]:
        return NAN  # unsigned: a negative input (a zero was handled before)
    v = _overflow(k, saturate) if c > _max_code(k) else _value(k, c)
    if not k[4] and 0 < v < Fraction(2) ** (1 - k[2]):  # also a saturated max that is subnormal
        v = 0
    v = float(v)
    if v == 0 and _no_neg_zero(k):
        return 0.0
    return -v if neg else v


def _neg(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def oracle_cast(x: float, fmt, mode: str = "nearest", saturate: bool = False) -> float:
    """The contract's result of casting the float32 value x (a Python float) in a deterministic mode."""
    k = key(fmt)
    if math.isnan(x):
        return NAN
    neg = _neg(x)
    if math.isinf(x):
        return _finish(k, _max_code(k) + 1, saturate, neg)
    return oracle_round(Fraction(x), fmt, mode, saturate, zero_negative=neg)


def _no_zero_small(k: tuple, a: Fraction) -> bool:
    """fnu has no zero: a magnitude below its smallest value 2^-bias rounds to that value."""
    return k[3] == "fnu" and a < Fraction(2) ** -k[2]


def oracle_neighbours(x: float, fmt, saturate: bool = False) -> tuple[float, float, Fraction]:
    """(lo, hi, p): the results of rounding x toward zero (lo) and away from zero (hi), as cast
    would give them (overflow, flush and sign rules applied), and the exact probability p that
    stochastic rounding picks hi: the fractional distance |x - lo| / |hi - lo| on the unbounded
    grid (1 when |x| is at or beyond the first value past max; 0 for exact values, inf and NaN)."""
    k = key(fmt)
    if math.isnan(x):
        return NAN, NAN, Fraction(0)
    neg = _neg(x)
    if math.isinf(x):
        v = _finish(k, _max_code(k) + 1, saturate, neg)
        return v, v, Fraction(0)
    if x == 0 or (neg and not k[5]) or _no_zero_small(k, Fraction(abs(x))):
        v = oracle_cast(x, fmt, "nearest", saturate)
        return v, v, Fraction(0)
    c, p = _analyse(k, Fraction(abs(x)))
    return _finish(k, c, saturate, neg), _finish(k, c + 1, saturate, neg), p


def oracle_code(v: float, fmt) -> int:
    """The full code of a value of the format (as returned by oracle_cast), sign bit included.

    NaN gives the canonical NaN code with the sign bit clear."""
    exp, man = key(fmt)[:2]
    if math.isnan(v):
        c = nan_code(fmt)
        assert c is not None, "format has no NaN code"
        return c
    sign = (1 << (exp + man)) if math.copysign(1.0, v) < 0 else 0
    assert not (sign and (not key(fmt)[5] or (v == 0 and _no_neg_zero(key(fmt))))), f"{v} is not a value"
    if math.isinf(v):
        c = inf_code(fmt)
        assert c is not None, "format has no inf code"
        return sign | c
    a = Fraction(abs(v))
    c = _bracket(key(fmt), a)
    assert c <= max_code(fmt) and _value(key(fmt), c) == a, f"{v} is not a value of the format"
    return sign | c


def bias_range(exp: int, man: int, specials: str) -> tuple[int, int]:
    """Inclusive range of biases that keep a format inside float32: its smallest positive value
    2^(1 - bias - man) at least 2^-149, and both its top binade exponent max(field of max, 1) - bias
    and hence 2^emin at most 2^127. Computed from the definition, not from cpd."""
    k = (exp, man, 0, specials, True, True)
    field = _max_code(k) >> man
    return max(field, 1) - 127, 150 - man


def oracle_round(q: Fraction, fmt, mode: str = "nearest", saturate: bool = False, zero_negative: bool = False) -> float:
    """The contract's result of rounding an exact rational q (an exact product, sum, dot product)
    to the format in a deterministic mode, as cast would round it. A zero q is -0.0 when
    ``zero_negative`` (the caller applies IEEE's sign-of-zero rule for sums), else +0.0."""
    k = key(fmt)
    if q == 0:
        if k[3] == "fnu":
            return NAN  # no zero
        return -0.0 if zero_negative and not _no_neg_zero(k) else 0.0
    neg = q < 0
    if neg and not k[5]:
        return NAN
    if _no_zero_small(k, abs(q)):
        return float(Fraction(2) ** -k[2])
    c, p = _analyse(k, abs(q))
    if p == 0:
        away = False
    elif mode == "nearest":
        away = p > Fraction(1, 2) if p != Fraction(1, 2) else (c + 1) % 2 == 0
    elif mode == "nearest_away":
        away = p >= Fraction(1, 2)
    elif mode == "odd":
        away = c % 2 == 0
        if c + away > _max_code(k):  # an overflow to odd gives ±max
            away = False
    elif mode == "toward_zero":
        away = False
    elif mode == "up":
        away = not neg
    elif mode == "down":
        away = neg
    else:
        raise ValueError(f"oracle_round: mode {mode!r} is not deterministic")
    return _finish(k, c + away, saturate, neg)


def oracle_round_neighbours(q: Fraction, fmt, saturate: bool = False) -> tuple[float, float, Fraction]:
    """(toward-zero result, away-from-zero result, exact probability of the latter) for rounding
    the exact rational q != 0 stochastically (see oracle_neighbours)."""
    k = key(fmt)
    neg = q < 0
    if (neg and not k[5]) or _no_zero_small(k, abs(q)):
        v = oracle_round(q, fmt, "nearest", saturate)
        return v, v, Fraction(0)
    c, p = _analyse(k, abs(q))
    return _finish(k, c, saturate, neg), _finish(k, c + 1, saturate, neg), p
