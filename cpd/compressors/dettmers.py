"""Dettmers (2016), "8-bit approximations for parallelism in deep learning" (ICLR 2016, paper 000
in /work/shared/papers): the four 8-bit data types, as lookup tables built from the paper's
definitions, with nearest-entry encoding.

Every type is one sign bit and a 7-bit magnitude code, so a table of 128 non-negative magnitudes
indexed by the magnitude code defines it (the paper's implementation keeps "a sorted table of all
positive 128 values" and binary-searches it; cpd does the same with ``torch.bucketize`` on the
midpoints between consecutive table values). The paper's Figure 1 (the bit anatomy) is lost in
the text copy, so the tables follow the text of Section 3.1; the readings cpd implements:

* **linear** — "normalize a matrix by dividing by its absolute maximum value ... with a 7-bit
  bisection tree with the range [0,1] ... equivalent to linear quantization (Vanhoucke et al.)".
  Magnitude code k is ``k / 127`` (k = 0..127): the 128 evenly spaced points of [0, 1] including
  both ends, so 0 and the absolute maximum are exact. (A tree of *midpoints* would have no zero and
  an unbounded mean relative error on normal data, which the paper's 6.5 % rules out.)
* **static tree** — sign, a 3-bit exponent e and a 4-bit bisection tree over the interval
  (0.1, 1): the 4 route bits (1 = upper half, most significant first) select one of 16 equal
  sub-intervals of [0.1, 1], whose midpoint is the leaf value, ``t(i) = 0.1 + 0.9 (i + 1/2) / 16``.
  Value ``10**(offset - e) * t(i)``, e = 0..7 ("the number ... represents the exponent 10^-n"),
  with the paper's exponent offset 10**offset (offset=1 by default; the paper used 10^2 for
  N(0, 10^2)). Magnitude code ``(e << 4) | i``. The code of the smallest value (e = 7, i = 0) is
  given up for an exact zero, as the dynamic tree's all-zero code.
* **dynamic tree** — normalized by the absolute maximum; after the sign, n leading 0 bits
  (n = 0..6) give the exponent 10**-n, the first 1 bit is a flag, and the remaining 6 - n bits are
  the bisection tree over (0.1, 1) as above: ``10**-n * (0.1 + 0.9 (i + 1/2) / 2**(6-n))``. The
  all-zero magnitude code (n = 7) is 0 ("a maximum of 10^-6 instead of 10^-7").
* **8-bit mantissa** — sign, a 3-bit decimal exponent e and a 4-bit integer mantissa m = 0..15
  ("the mantissa will hold values between 0 and 15"): ``10**(offset - e) * m / 10`` with the same
  exponent offset as the static tree, magnitude code ``(e << 4) | m``. Codes with m = 0 are zeros
  and some values repeat across exponents (m = 10..15 at e equal m = 1 at e - 1 ...); encode picks
  the smallest code of a repeated value.

Encoding: ``y = |x| / absmax`` (float32 division; the normalized types) or ``y = |x|``; the code is
the nearest table value, ties to the smaller magnitude; the sign bit is x's sign bit (so -0 stays
-0). Decoding: ``table[code] * absmax`` (float32 multiplication). Table values are the float64
definitions rounded to float32. The payload is n code bytes, plus 4 bytes for the float32 absmax
of the normalized types: ratio ``4n / (n + 4)`` (about 4) against float32.
"""

from __future__ import annotations

import math

import torch

from .base import Compressor, Payload, bytes_float, float_bytes

__all__ = ["Dettmers8bit", "linear_table", "static_tree_table", "dynamic_tree_table", "mantissa_table",
           "DETTMERS_TYPES"]

#: The four data types' registry names.
DETTMERS_TYPES = ("linear", "static_tree", "dynamic_tree", "mantissa8")


def _leaf(i: int, depth: int) -> float:
    """Midpoint of the i-th of 2**depth equal sub-intervals of [0.1, 1] (the bisection-tree leaf
    reached by the route bits of i, most significant first)."""
    return 0.1 + 0.9 * (i + 0.5) / 2 ** depth


def linear_table() -> list[float]:
    """Magnitude code k -> k / 127 (normalized by the absolute maximum)."""
    return [k / 127 for k in range(128)]


def static_tree_table(offset: int = 1) -> list[float]:
    """Magnitude code (e << 4) | i -> 10**(offset - e) * leaf(i, 4); code (7 << 4) | 0 -> 0."""
    t = [10.0 ** (offset - (c >> 4)) * _leaf(c & 15, 4) for c in range(128)]
    t[7 << 4] = 0.0
    return t


def dynamic_tree_table() -> list[float]:
    """Magnitude code -> value of the dynamic tree (normalized by the absolute maximum)."""
    t = []
    for c in range(128):
        if c == 0:
            t.append(0.0)
            continue
        n = 7 - c.bit_length()          # leading zeros of the 7-bit code
        depth = 6 - n                   # tree bits after the flag
        i = c & ((1 << depth) - 1)
        t.append(10.0 ** -n * _leaf(i, depth))
    return t


def mantissa_table(offset: int = 1) -> list[float]:
    """Magnitude code (e << 4) | m -> 10**(offset - e) * m / 10."""
    return [10.0 ** (offset - (c >> 4)) * (c & 15) / 10 for c in range(128)]


def _round_down_f32(m64: torch.Tensor) -> torch.Tensor:
    """The largest float32 <= each float64 value (so ``y <= m`` is ``y <= result`` for float32 y)."""
    m32 = m64.to(torch.float32)
    over = m32.to(torch.float64) > m64
    return torch.where(over, torch.nextafter(m32, torch.tensor(-math.inf)), m32)


#: _nearest's prefix: the float32 bits of a non-negative value shifted right by this many bits.
_PREFIX_SHIFT = 16


class Dettmers8bit(Compressor):
    """One of Dettmers' (2016) four 8-bit data types (see the module docstring for the tables).

    Args:
        kind: ``"linear"``, ``"static_tree"``, ``"dynamic_tree"`` or ``"mantissa8"``.
        offset: exponent offset 10**offset of ``static_tree`` and ``mantissa8`` (default 1, as the
            paper for all but N(0, 10^2), which used 2); an int in -30..30. Not allowed for the
            normalized types.
        error_feedback: keep a residual when encode gets a state (the paper sends no residual; off
            by default).
    """

    def __init__(self, kind: str = "dynamic_tree", *, offset: int | None = None, error_feedback: bool = False):
        if kind not in DETTMERS_TYPES:
            raise ValueError(f"kind={kind!r} is not a Dettmers 8-bit type; allowed: {', '.join(DETTMERS_TYPES)}")
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback must be a bool, got {type(error_feedback).__name__}")
        self.normalized = kind in ("linear", "dynamic_tree")
        if offset is not None and self.normalized:
            raise ValueError(f"offset applies to static_tree and mantissa8 (the {kind} type is normalized by the "
                             f"absolute maximum instead), got offset={offset!r}")
        if offset is None:
            offset = 1
        if isinstance(offset, bool) or not isinstance(offset, int) or not -30 <= offset <= 30:
            raise ValueError(f"offset must be an int in -30..30 (the exponent of 10**offset), got {offset!r}")
        self.kind, self.offset, self.error_feedback = kind, offset, error_feedback
        self.name = kind
        table = {"linear": linear_table, "dynamic_tree": dynamic_tree_table}.get(kind)
        table = table() if table else (static_tree_table if kind == "static_tree" else mantissa_table)(offset)
        #: float64 magnitudes by magnitude code (the definition).
        self.table64 = torch.tensor(table, dtype=torch.float64)
        #: float32 magnitudes by magnitude code (what decode multiplies).
        self.table = self.table64.to(torch.float32)
        vals, inverse = torch.unique(self.table, sorted=True, return_inverse=True)
        first = torch.full((len(vals),), 128, dtype=torch.int64).scatter_reduce(
            0, inverse, torch.arange(128), "amin")
        self._sorted = vals                           # distinct float32 values, ascending
        self._sorted_codes = first.to(torch.uint8)    # smallest code of each
        mids = (vals[1:].double() + vals[:-1].double()) / 2
        self._mids = _round_down_f32(mids)            # y <= mid (exact) -> lower entry (ties down)
        # _nearest's table: the midpoints are non-negative, so their float32 bits order them; per
        # 16-bit prefix of those bits (2^15 prefixes of non-negative floats) how many midpoints
        # have a smaller prefix, and the most midpoints sharing one prefix
        prefix = self._mids.view(torch.int32).to(torch.int64) >> _PREFIX_SHIFT
        keys = torch.arange(1 << (31 - _PREFIX_SHIFT))
        self._below = torch.searchsorted(prefix, keys).to(torch.int32)
        self._share = int((torch.searchsorted(prefix, keys, right=True) - self._below).max()) if len(prefix) else 0
        self._mids_padded = torch.cat([self._mids, torch.full((self._share,), math.inf)])

    def _encode(self, x: torch.Tensor) -> Payload:
        flat = x.reshape(-1)
        a = flat.abs()
        parts = {}
        if self.normalized:
            absmax = a.max() if flat.numel() else a.new_zeros(())
            parts["absmax"] = float_bytes(absmax.reshape(1))
            y = a / absmax if float(absmax) > 0 else torch.zeros_like(a)
        else:
            y = a
        idx = self._nearest(y)
        codes = self._sorted_codes.to(idx.device)[idx] | (torch.signbit(flat).to(torch.uint8) << 7)
        return self._payload(x.shape, codes=codes, **parts)

    def _nearest(self, y: torch.Tensor) -> torch.Tensor:
        """Index into the sorted distinct values of the nearest one: the number of midpoints
        strictly below y >= 0 (``torch.bucketize`` semantics). On CPU without a binary search
        (numpy's ``searchsorted`` took 33 ns per element): y's float32 bits order it among the
        non-negative midpoints, so the midpoints below y are those of a smaller 16-bit prefix of
        the bits (a table, ``_below``) and those of y's own prefix below y (at most ``_share`` of
        them, each one compare)."""
        if y.device.type != "cpu":
            return torch.bucketize(y, self._mids.to(y.device))
        key = (y.contiguous().view(torch.int32) >> _PREFIX_SHIFT).reshape(-1)
        first = self._below.index_select(0, key)
        idx = first.to(torch.int64)
        for t in range(self._share):
            idx += self._mids_padded.index_select(0, first + t) < y.reshape(-1)
        return idx.reshape(y.shape)

    def wire_layout(self, shape) -> tuple:
        n = math.prod(tuple(shape))
        return (("codes", n), ("absmax", 4)) if self.normalized else (("codes", n),)

    def _decode(self, p: Payload) -> torch.Tensor:
        codes = p.parts["codes"]
        mag = self.table.to(codes.device)[(codes & 127).long()]
        if self.normalized:
            mag = mag * bytes_float(p.parts["absmax"])[0]
        out = torch.where((codes >> 7).bool(), -mag, mag)
        return out.reshape(p.shape)

    def __repr__(self) -> str:
        off = "" if self.normalized else f", offset={self.offset}"
        return f"Dettmers8bit({self.kind!r}{off}, error_feedback={self.error_feedback})"
