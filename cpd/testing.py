"""Helpers for users' own tests of low-precision code (needs ``hypothesis``).

- :func:`formats`: a hypothesis strategy of valid :class:`~cpd.FloatFormat` values.
- :func:`boundary_values`: a strategy of float32 values where rounding decisions happen for a
  format: its values, the midpoints between neighbours, one float32 ulp either side of those,
  the overflow threshold, subnormals, zeros and infinities.

Example::

    from hypothesis import given
    import cpd, cpd.testing as ct

    @given(ct.formats(max_bits=8).flatmap(lambda f: ct.boundary_values(f).map(lambda x: (f, x))))
    def test_my_kernel(fx):
        fmt, x = fx
        ...
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

from .formats import FloatFormat

__all__ = ["formats", "boundary_values", "boundary_list", "format_values"]


def _st():
    try:
        from hypothesis import strategies as st
    except ImportError as exc:  # pragma: no cover - hypothesis is a test dependency
        raise ImportError("cpd.testing needs hypothesis: pip install hypothesis") from exc
    return st


def _valid(exp: int, man: int, bias: int, specials: str, subnormals: bool) -> FloatFormat | None:
    try:
        return FloatFormat(exp, man, bias=bias, specials=specials, subnormals=subnormals)
    except ValueError:
        return None


def formats(*, min_bits: int = 2, max_bits: int = 32, specials=("ieee", "fn", "finite"), custom_bias: bool = False,
            subnormals=(True, False)):
    """Strategy of valid formats with ``min_bits <= 1 + exp + man <= max_bits``.

    ``custom_bias=True`` also draws biases other than the default (within float32's range).
    """
    st = _st()
    if not 2 <= min_bits <= max_bits <= 32:
        raise ValueError(f"need 2 <= min_bits <= max_bits <= 32, got min_bits={min_bits}, max_bits={max_bits}")

    @st.composite
    def draw(d):
        exp = d(st.integers(1, min(8, max_bits - 1)))
        man = d(st.integers(max(0, min_bits - 1 - exp), min(23, max_bits - 1 - exp)))
        default = (1 << (exp - 1)) - 1
        bias = d(st.integers(default - 20, default + 20)) if custom_bias else default
        f = _valid(exp, man, bias, d(st.sampled_from(list(specials))), d(st.sampled_from(list(subnormals))))
        if f is None:
            f = _valid(exp, man, default, "finite", True) or FloatFormat(exp, max(man, 1), specials="finite")
        return f

    return draw()


def _f32(v) -> float:
    return struct.unpack("<f", struct.pack("<f", float(v)))[0]


def _next(v: float, up: bool) -> float:
    """The float32 neighbour of the float32 value v."""
    if v == 0:
        return 1.401298464324817e-45 if up else -1.401298464324817e-45
    b = struct.unpack("<I", struct.pack("<f", v))[0]
    b += 1 if (v > 0) == up else -1
    return struct.unpack("<f", struct.pack("<I", b))[0]


def format_values(fmt: FloatFormat, limit: int = 4096) -> list[Fraction]:
    """The format's non-negative finite values, from the definition (all of them when there are
    at most ``limit``; otherwise a spread: the first and last codes of every binade)."""
    n = fmt.max_code + 1
    if n <= limit:
        codes = range(n)
    else:
        per = 1 << fmt.man
        codes = sorted({c for field in range(n // per + 1) for c in (field * per, field * per + 1,
                                                                     field * per + per - 1) if c < n})
    return [fmt.code_value(c) for c in codes]


def boundary_list(fmt) -> list[float]:
    """The non-negative float32 values (and +inf) :func:`boundary_values` draws from (and their negatives)."""
    fmt = FloatFormat.parse(fmt)
    vals = format_values(fmt)
    pts: set[float] = {0.0, -0.0, math.inf, -math.inf, 3.4028234663852886e38, 1.401298464324817e-45}
    ulp_max = vals[-1] - vals[-2] if len(vals) > 1 else vals[-1]
    for q in vals + [(a + b) / 2 for a, b in zip(vals, vals[1:])] + [vals[-1] + ulp_max / 2]:
        v = _f32(q)
        if math.isfinite(v):
            pts.update({v, _next(v, True), _next(v, False)})
    return sorted(p for p in pts if p >= 0 and math.copysign(1.0, p) > 0)


def boundary_values(fmt):
    """Strategy of float32 values (Python floats) at and around ``fmt``'s rounding boundaries:
    :func:`boundary_list` and the negatives."""
    st = _st()
    return st.sampled_from(boundary_list(fmt)).flatmap(lambda v: st.sampled_from([v, -v]))
