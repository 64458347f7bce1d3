"""The numerics contract written out as exact, readable, slow pure Python (docs/design.md §1, §3).

This module is the specification of what cpd's kernels compute, in a form a person can check
line by line. Nothing here uses torch or the compiled core: values are Python ``float``s (float32
values when they are compared with cpd's tensors), exact intermediate results are
``fractions.Fraction`` values, and each rounding decision is taken exactly on the
format's grid. It is the oracle behind :func:`cpd.testing.reference_sum` and
:func:`cpd.testing.assert_allreduce_matches`, and a readable companion to ``numerics.h``.

It is slow by design (one Python call per element: microseconds each); use it on small inputs.

What it covers:

* :func:`round_value`: the exact rational ``q`` (or a float, with its NaN/inf/signed zero)
  rounded to a format, in the deterministic modes ``"nearest"``, ``"toward_zero"``, ``"up"``,
  ``"down"``; :func:`cast` is the same for one float.
* :func:`add`, :func:`mul`, :func:`fma`: the exact result of the operation rounded once, with
  IEEE 754's rules for special operands and for the sign of an exact zero.
* :func:`allreduce`: the emulated allreduce of :func:`cpd.allreduce`, algorithm by algorithm, in
  exactly the order its docstring states (ring, hierarchical, tree, sequential; Kahan or not).

Stochastic rounding is out of scope: its result depends on random words drawn from a counter-based
generator (Philox4x32-10), not on the value alone, so there is no single reference answer. Its
contract is checked statistically and against the exposed random words
(:func:`cpd.ops.random_words`) in the test suite; every function here raises ``ValueError`` for
``rounding="stochastic"``.

The rounding rule, as implemented by :func:`round_value` (IEEE 754-2019 §4.3, §7.4; the OCP
8-bit floating point specification for E4M3FN; Micikevicius et al., "FP8 formats for deep
learning", 2022):

1. NaN stays NaN. Zeros keep their sign. An infinite input is an overflow (step 5) in every mode.
2. The magnitude ``a = |q|`` lies in binade ``e = floor(log2 a)``. The grid spacing (quantum)
   there is ``2^(max(e, emin) - man)``: below the smallest normal ``2^emin`` the spacing stays
   that of the lowest binade (gradual underflow). ``a / quantum = n + r`` with an integer ``n``
   and ``0 <= r < 1``, so the two candidates are ``n`` and ``n + 1`` quanta.
3. Choose: ``nearest`` takes the closer candidate; on a tie (``r == 1/2``) the one whose
   *encoding* is even. ``toward_zero`` takes ``n``; ``up`` takes ``n + 1`` for positive values
   with ``r > 0``; ``down`` takes ``n + 1`` for negative values with ``r > 0``.
4. The grid continues above the largest finite value as if the exponent were unbounded (IEEE's
   overflow rule), so a tie just above ``max`` is decided by encodings like any other tie: with
   E4M3FN (max 448, an even code) 464 rounds down to 448; with E5M2 (max 57344, an odd code)
   61440 rounds up, i.e. overflows.
5. Overflow (the chosen candidate is above ``max``): modes that round toward zero for this sign
   (``toward_zero``; ``up`` for negatives; ``down`` for positives) give ``±max``. Otherwise
   ``saturate=True`` or ``specials="finite"`` give ``±max``, ``"ieee"`` gives ``±inf`` and
   ``"fn"`` gives NaN.
6. Without subnormals (``fmt.subnormals=False``) a result whose magnitude is below the smallest
   normal is replaced by a zero of the same sign (flush *after* rounding).
7. The result carries the sign of ``q``.

A format's codes are read from its five fields only (``exp``, ``man``, ``bias``, ``specials``,
``subnormals``); see :func:`max_code` and :func:`code_value`.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

from .formats import FloatFormat, Specials
from .rounding import Rounding

__all__ = [
    "DETERMINISTIC_MODES", "max_code", "code_value", "max_value", "round_value", "cast",
    "add", "mul", "fma", "allreduce",
]

#: The rounding modes this reference defines (stochastic rounding has no single answer).
DETERMINISTIC_MODES = (Rounding.NEAREST, Rounding.TOWARD_ZERO, Rounding.UP, Rounding.DOWN)

#: The algorithms :func:`allreduce` knows, in the order of :data:`cpd.ALLREDUCE_ALGORITHMS`.
_ALGORITHMS = ("ring", "hierarchical", "tree", "sequential")


# --------------------------------------------------------------------------------------- the format
def max_code(fmt: FloatFormat) -> int:
    """The largest magnitude code (sign bit excluded) that encodes a finite number.

    A magnitude code is ``field << man | frac`` with ``exp`` field bits and ``man`` fraction bits.
    ``"ieee"`` reserves the all-ones field for ±inf and NaN, so the largest finite code is the one
    just below it; ``"fn"`` reserves only the all-ones code (NaN); ``"finite"`` reserves nothing.
    """
    fmt = FloatFormat.parse(fmt)
    all_ones = (1 << (fmt.exp + fmt.man)) - 1
    if fmt.specials is Specials.IEEE:
        return (((1 << fmt.exp) - 1) << fmt.man) - 1
    if fmt.specials is Specials.FN:
        return all_ones - 1
    return all_ones


def code_value(fmt: FloatFormat, code: int) -> Fraction:
    """The exact value of a magnitude code, as if every code were finite (codes above
    :func:`max_code` give the values of the grid continued with an unbounded exponent).

    ``field == 0``: ``frac / 2^man * 2^emin`` (zero and subnormals);
    ``field >= 1``: ``(1 + frac / 2^man) * 2^(field - bias)``; where ``emin = 1 - bias``.
    """
    fmt = FloatFormat.parse(fmt)
    field, frac = code >> fmt.man, code & ((1 << fmt.man) - 1)
    if field == 0:
        return Fraction(frac, 1 << fmt.man) * Fraction(2) ** (1 - fmt.bias)
    return (1 + Fraction(frac, 1 << fmt.man)) * Fraction(2) ** (field - fmt.bias)


@functools.lru_cache(maxsize=256)
def max_value(fmt: FloatFormat) -> Fraction:
    """The largest finite value of the format, exactly (cached: formats are frozen)."""
    return code_value(fmt, max_code(fmt))


# --------------------------------------------------------------------------------------- rounding
def _mode(rounding) -> Rounding:
    mode = Rounding.parse(rounding)
    if mode is Rounding.STOCHASTIC:
        raise ValueError("rounding='stochastic' has no exact reference (its result depends on random words, "
                         "not only on the value); allowed: 'nearest', 'toward_zero', 'up', 'down'")
    return mode


def _floor_log2(a: Fraction) -> int:
    """``floor(log2 a)`` for a rational ``a > 0``, exactly (no float rounding)."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    # Now 2^(e-1) < a < 2^(e+1); one comparison settles it.
    return e if a >= Fraction(2) ** e else e - 1


def _overflow_value(fmt: FloatFormat, mode: Rounding, negative: bool, saturate: bool) -> float:
    """Step 5: what a magnitude above max becomes (before the sign is applied)."""
    toward_zero = (mode is Rounding.TOWARD_ZERO or (mode is Rounding.UP and negative)
                   or (mode is Rounding.DOWN and not negative))
    if toward_zero or saturate or fmt.specials is Specials.FINITE:
        return float(max_value(fmt))
    return math.inf if fmt.specials is Specials.IEEE else math.nan


def _signed(v: float, negative: bool) -> float:
    return -v if negative else v


def round_value(q, fmt, rounding="nearest", *, saturate: bool = False) -> float:
    """Round ``q`` to a value of ``fmt``: the contract of :func:`cpd.cast` on one exact number.

    Args:
        q: a :class:`~fractions.Fraction` or ``int`` (an exact value: a zero is +0), or a
            ``float`` (NaN, ±inf and signed zeros keep their IEEE meaning; a float is taken
            exactly as given — pass float32 values to compare with cpd's float32 tensors).
        fmt: a :class:`~cpd.FloatFormat`, a name or a torch dtype.
        rounding: ``"nearest"``, ``"toward_zero"``, ``"up"`` or ``"down"`` (a :class:`~cpd.Rounding`
            is accepted too).
        saturate: every overflow, infinite inputs included, gives ±max.

    Returns:
        The rounded value as a Python float (exactly representable in ``fmt``, or ±inf / NaN).

    Raises:
        ValueError: ``rounding="stochastic"`` or an unknown mode.
        TypeError: ``q`` is not a number.

    The steps are those of the module docstring, in that order.

    Example:
        >>> round_value(Fraction(3, 10), "e5m2")
        0.3125
        >>> round_value(464, "e4m3fn"), round_value(464, "e4m3fn", "up")
        (448.0, nan)
    """
    fmt = FloatFormat.parse(fmt)
    mode = _mode(rounding)
    if not isinstance(saturate, bool):
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    if isinstance(q, bool) or not isinstance(q, (Fraction, int, float)):
        raise TypeError(f"q must be a Fraction, int or float, got {type(q).__name__}")
    # 1. NaN, infinities, zeros.
    if isinstance(q, float):
        if math.isnan(q):
            return math.nan
        negative = math.copysign(1.0, q) < 0
        if math.isinf(q):
            return _signed(_overflow_value(fmt, Rounding.NEAREST, negative, saturate), negative)
        if q == 0:
            return _signed(0.0, negative)
    elif q == 0:
        return 0.0
    q = Fraction(q)
    negative = q < 0
    a = abs(q)
    # 2. The binade, the quantum and the two candidates n and n + 1 (in quanta).
    emin = 1 - fmt.bias
    e = max(_floor_log2(a), emin)
    quantum = Fraction(2) ** (e - fmt.man)
    n = math.floor(a / quantum)
    r = a / quantum - n
    # 3. The decision.
    if r == 0:
        up = False
    elif mode is Rounding.NEAREST:
        if r != Fraction(1, 2):
            up = r > Fraction(1, 2)
        else:
            # On the grid of binade e, n quanta is the magnitude code (e - emin) * 2^man + n
            # (for a normal n = 2^man + frac and field = e - emin + 1; for a subnormal e = emin
            # and n = frac), so the tie goes up exactly when that code is odd.
            up = ((e - emin) * (1 << fmt.man) + n) % 2 == 1
    elif mode is Rounding.TOWARD_ZERO:
        up = False
    elif mode is Rounding.UP:
        up = not negative
    else:  # Rounding.DOWN
        up = negative
    v = (n + up) * quantum
    # 4-5. Overflow, judged on the unbounded grid.
    if v > max_value(fmt):
        return _signed(_overflow_value(fmt, mode, negative, saturate), negative)
    # 6. Flush after rounding.
    if not fmt.subnormals and v < Fraction(2) ** emin:
        v = Fraction(0)
    # 7. The sign.
    return _signed(float(v), negative)


def cast(x: float, fmt, rounding="nearest", *, saturate: bool = False) -> float:
    """One element of :func:`cpd.cast`: the float ``x`` rounded to ``fmt`` (see :func:`round_value`).

    Example:
        >>> cast(0.3, "e5m2"), cast(-1e9, "e5m2"), cast(-1e9, "e5m2", saturate=True)
        (0.3125, -inf, -57344.0)
    """
    if isinstance(x, bool) or not isinstance(x, (float, int)):
        raise TypeError(f"x must be a float, got {type(x).__name__}")
    return round_value(float(x), fmt, rounding, saturate=saturate)


# --------------------------------------------------------------------------------------- arithmetic
def _check_float(v, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (float, int)):
        raise TypeError(f"{name} must be a float, got {type(v).__name__}")
    return float(v)


def _negative(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def _zero_sum(sign_x: bool, sign_y: bool, mode: Rounding) -> float:
    """The sign of an exact zero sum x + y (IEEE 754 §6.3): the common sign when both addends
    have it, otherwise +0, except -0 when rounding down."""
    negative = sign_x if sign_x == sign_y else mode is Rounding.DOWN
    return -0.0 if negative else 0.0


def add(x: float, y: float, fmt, rounding="nearest", *, saturate: bool = False) -> float:
    """One element of :func:`cpd.add`: the exact ``x + y`` rounded once to ``fmt``.

    * Any non-finite operand: the IEEE float result (``inf - inf`` is NaN, ``inf + y`` is inf),
      then cast (so an inf becomes the format's overflow value, NaN stays NaN).
    * An exact zero sum: ``-0`` if both addends are -0; ``+0`` if both are +0; otherwise ``+0``,
      or ``-0`` when rounding down (IEEE 754 §6.3).
    * Otherwise :func:`round_value` of the exact rational sum.

    Example:
        >>> add(1.0, 2.0**-3, "e5m2"), add(1.0, 2.0**-3, "e5m2", "up")
        (1.0, 1.25)
    """
    x, y = _check_float(x, "x"), _check_float(y, "y")
    mode = _mode(rounding)
    if not (math.isfinite(x) and math.isfinite(y)):
        return cast(x + y, fmt, mode, saturate=saturate)
    exact = Fraction(x) + Fraction(y)
    if exact == 0:
        return _zero_sum(_negative(x), _negative(y), mode)
    return round_value(exact, fmt, mode, saturate=saturate)


def mul(x: float, y: float, fmt, rounding="nearest", *, saturate: bool = False) -> float:
    """One element of :func:`cpd.mul`: the exact ``x * y`` rounded once to ``fmt``.

    Non-finite operands follow IEEE (``0 * inf`` is NaN) and are then cast; an exact zero product
    has the sign ``sign(x) xor sign(y)``; a nonzero product that rounds to zero keeps its sign.
    """
    x, y = _check_float(x, "x"), _check_float(y, "y")
    mode = _mode(rounding)
    if not (math.isfinite(x) and math.isfinite(y)):
        return cast(x * y, fmt, mode, saturate=saturate)
    exact = Fraction(x) * Fraction(y)
    if exact == 0:
        return -0.0 if _negative(x) != _negative(y) else 0.0
    return round_value(exact, fmt, mode, saturate=saturate)


def fma(c: float, a: float, b: float, fmt, rounding="nearest", *, saturate: bool = False) -> float:
    """One element of :func:`cpd.fma` (same argument order): the exact ``c + a * b`` rounded once.

    * ``a`` or ``b`` non-finite: the IEEE float result of ``c + a * b``, then cast.
    * ``c`` non-finite (``a``, ``b`` finite): ``c`` cast.
    * An exact zero result: the zero-sum sign rule of :func:`add` applied to ``c`` and the
      product, whose sign is ``sign(a) xor sign(b)`` even when it is zero.
    * Otherwise :func:`round_value` of the exact rational ``c + a * b``.
    """
    c, a, b = _check_float(c, "c"), _check_float(a, "a"), _check_float(b, "b")
    mode = _mode(rounding)
    if not (math.isfinite(a) and math.isfinite(b)):
        return cast(c + a * b, fmt, mode, saturate=saturate)
    if not math.isfinite(c):
        return cast(c, fmt, mode, saturate=saturate)
    exact = Fraction(c) + Fraction(a) * Fraction(b)
    if exact == 0:
        return _zero_sum(_negative(c), _negative(a) != _negative(b), mode)
    return round_value(exact, fmt, mode, saturate=saturate)


# --------------------------------------------------------------------------------------- allreduce
def _chunks(n: int, parts: int) -> list[range]:
    """The element indices of each of ``parts`` chunks, as ``numpy.array_split``: the first
    ``n % parts`` chunks have one element more."""
    q, r = divmod(n, parts)
    out, start = [], 0
    for c in range(parts):
        size = q + (1 if c < r else 0)
        out.append(range(start, start + size))
        start += size
    return out


class _Accumulator:
    """One partial sum s and, with Kahan, its compensation c; every operation one rounded add."""

    def __init__(self, fmt, mode, saturate, kahan):
        self.fmt, self.mode, self.saturate, self.kahan = fmt, mode, saturate, kahan

    def add(self, x: float, y: float) -> float:
        return add(x, y, self.fmt, self.mode, saturate=self.saturate)

    def start(self, x: float, c: float | None = None) -> tuple[float, float | None]:
        """A partial sum holding one value: (x, +0) with Kahan (or the given compensation)."""
        if not self.kahan:
            return x, None
        return x, (0.0 if c is None else c)

    def merge(self, s: float, c: float | None, x: float, cx: float | None = None) -> tuple[float, float | None]:
        """Add the incoming value x (with its own compensation cx, if it is a partial sum)::

            plain:  s = add(s, x)
            Kahan:  c = add(c, cx)              (only when x brings a compensation cx)
                    y = add(x, -c)
                    t = add(s, y)
                    c = add(add(t, -s), -y)
                    s = t
        """
        if not self.kahan:
            return self.add(s, x), None
        if cx is not None:
            c = self.add(c, cx)
        y = self.add(x, -c)
        t = self.add(s, y)
        c = self.add(self.add(t, -s), -y)
        return t, c


def _sequential(acc: _Accumulator, rows: list[list[float]]) -> tuple[list[float], list | None]:
    """Sum the rows in order: s = rows[0], s = add(s, rows[1]), ...; returns (s, c) per element."""
    n = len(rows[0])
    out_s, out_c = [], [] if acc.kahan else None
    for j in range(n):
        s, c = acc.start(rows[0][j])
        for row in rows[1:]:
            s, c = acc.merge(s, c, row[j])
        out_s.append(s)
        if acc.kahan:
            out_c.append(c)
    return out_s, out_c


def _ring(acc: _Accumulator, rows: list[list[float]], comps: list[list[float]] | None) -> list[float]:
    """Ring reduce-scatter over P participants (then allgather, which only copies): chunk k
    starts at participant k and visits k+1, ..., k+P-1 (mod P), one merge per hop.

    ``comps`` are the participants' Kahan compensations when their values are partial sums
    (the hierarchical leaders), else None (a fresh +0 compensation per chunk with Kahan)."""
    p, n = len(rows), len(rows[0])
    if p == 1:
        return list(rows[0])
    out = [0.0] * n
    for k, indices in enumerate(_chunks(n, p)):
        for j in indices:
            s, c = acc.start(rows[k][j], None if comps is None else comps[k][j])
            for hop in range(1, p):
                w = (k + hop) % p
                s, c = acc.merge(s, c, rows[w][j], None if comps is None else comps[w][j])
            out[j] = s
    return out


def _tree(acc: _Accumulator, rows: list[list[float]]) -> list[float]:
    """Recursive halving to worker 0: at level l (step 2^l) worker i with i % 2^(l+1) == 0 and
    i + 2^l < W merges its partner's partial (and compensation) into its own."""
    w, n = len(rows), len(rows[0])
    out = []
    for j in range(n):
        parts = [acc.start(rows[i][j]) for i in range(w)]
        step = 1
        while step < w:
            for i in range(0, w - step, 2 * step):
                s, c = parts[i]
                x, cx = parts[i + step]
                parts[i] = acc.merge(s, c, x, cx)
            step *= 2
        out.append(parts[0][0])
    return out


def allreduce(rows, fmt, *, algorithm: str = "ring", group_size: int | None = None, kahan: bool = False,
              rounding="nearest", saturate: bool = False, inputs_in_fmt: bool = False) -> list[float]:
    """The exact result of :func:`cpd.allreduce` on W workers' values, in its documented order.

    The ring and hierarchical orders are those the APS paper compares (Han, Demmel, Si & You,
    "Auto-Precision Scaling for Distributed Deep Learning": ring reduce-scatter + allgather, and
    groups summed at their first worker, then a ring across the group leaders); the paper does
    not fix the order inside a hop, so cpd's documented reading (one rounded addition per hop,
    chunk c starting at worker c) is the one written here.

    Args:
        rows: W sequences of n floats, ``rows[w]`` worker w's flattened tensor (float32 values).
        fmt: the accumulation format.
        algorithm: ``"ring"``, ``"hierarchical"``, ``"tree"`` or ``"sequential"``.
        group_size: hierarchical only: workers per group (a divisor of W).
        kahan: carry a Kahan compensation with every partial sum.
        rounding: a deterministic mode (``"nearest"``, ``"toward_zero"``, ``"up"``, ``"down"``).
        saturate: overflows give ±max.
        inputs_in_fmt: skip the initial cast of the inputs to ``fmt``.

    Returns:
        The n floats every worker holds after the allreduce.

    The order (the same text as :func:`cpd.allreduce`'s docstring; ``add`` is :func:`add`):

    0. Every input is cast to ``fmt`` (:func:`cast`) unless ``inputs_in_fmt``.
    * ring: chunks as ``numpy.array_split``; chunk k: ``s = x_k``, then ``s = add(s, x_{k+1})``,
      ..., ``add(s, x_{k+W-1})`` (indices mod W).
    * hierarchical (k = group_size): group g's leader sums ``x_{gk}, ..., x_{gk+k-1}`` in order;
      then the ring over the W/k leaders' sums (and, with Kahan, their compensations).
    * tree: recursive halving to worker 0 (see :func:`cpd.allreduce`).
    * sequential: ``s = x_0``, ``s = add(s, x_1)``, ..., ``add(s, x_{W-1})``.
    * Kahan: every merge of an incoming x into (s, c) is ``c = add(c, cx)`` (only when x is a
      partial sum with compensation cx), ``y = add(x, -c)``, ``t = add(s, y)``,
      ``c = add(add(t, -s), -y)``, ``s = t``; a partial sum starts with ``c = +0``.

    Raises:
        ValueError: no workers, rows of different lengths, unknown algorithm, bad group_size,
            stochastic rounding.
        TypeError: bad argument types.

    Example:
        >>> allreduce([[1.0], [1.0], [4.0]], "e3m0")      # 1 + 1 = 2; 2 + 4 = 6, a tie -> 8
        [8.0]
        >>> allreduce([[1.0, 1.0, 1.0], [1.0] * 3, [4.0] * 3], "e3m0", algorithm="ring")
        [8.0, 4.0, 4.0]
    """
    fmt = FloatFormat.parse(fmt)
    mode = _mode(rounding)
    if not isinstance(algorithm, str) or algorithm not in _ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is unknown; allowed: {', '.join(map(repr, _ALGORITHMS))}")
    for name, v in (("kahan", kahan), ("saturate", saturate), ("inputs_in_fmt", inputs_in_fmt)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    rows = [[_check_float(v, f"rows[{i}][{j}]") for j, v in enumerate(row)] for i, row in enumerate(rows)]
    if not rows:
        raise ValueError("rows is empty; need at least one worker's values")
    w, n = len(rows), len(rows[0])
    for i, row in enumerate(rows):
        if len(row) != n:
            raise ValueError(f"rows[{i}] has {len(row)} values but rows[0] has {n}; all workers need the same length")
    if algorithm == "hierarchical":
        if isinstance(group_size, bool) or not isinstance(group_size, int):
            raise TypeError(f"group_size must be an int for algorithm='hierarchical', got {type(group_size).__name__}")
        if group_size < 1 or w % group_size:
            raise ValueError(f"group_size={group_size} must be a positive divisor of the number of workers W={w}")
    elif group_size is not None:
        raise ValueError(f"group_size only applies to algorithm='hierarchical', got algorithm={algorithm!r}")

    # 0. What goes on the wire is in fmt.
    if not inputs_in_fmt:
        rows = [[cast(v, fmt, mode, saturate=saturate) for v in row] for row in rows]
    acc = _Accumulator(fmt, mode, saturate, kahan)
    if algorithm == "ring":
        return _ring(acc, rows, None)
    if algorithm == "sequential":
        return _sequential(acc, rows)[0]
    if algorithm == "tree":
        return _tree(acc, rows)
    k = group_size
    groups = [_sequential(acc, rows[g * k:(g + 1) * k]) for g in range(w // k)]
    return _ring(acc, [s for s, _ in groups], [c for _, c in groups] if kahan else None)
