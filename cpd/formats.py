"""Floating-point formats: ``FloatFormat``, its special-value conventions, presets and ``parse``.

A format has one sign bit, ``exp`` exponent bits and ``man`` stored mantissa bits; float32 is the
carrier, so every format must fit inside float32 (DESIGN.md §3). Properties follow
``torch.finfo``'s names.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from fractions import Fraction

__all__ = [
    "Specials",
    "FloatFormat",
    "FP32",
    "TF32",
    "FP16",
    "BF16",
    "E5M2",
    "E4M3",
    "E4M3FN",
    "E3M2",
    "E2M3",
    "E2M1",
    "PRESETS",
]


class Specials(enum.Enum):
    """Which codes of a format are not finite numbers."""

    #: The top exponent code is reserved: mantissa 0 is ±inf, anything else NaN (fp16, e5m2).
    IEEE = "ieee"
    #: OCP "finite + NaN" (E4M3FN): no infinities, only the all-ones code is NaN.
    FN = "fn"
    #: Every code is a finite number (MX FP6/FP4 style): no infinities and no NaN.
    FINITE = "finite"

    @property
    def code(self) -> int:
        """The integer the numerics core uses for this convention."""
        return {Specials.IEEE: 0, Specials.FN: 1, Specials.FINITE: 2}[self]


def _pow2(k: int) -> float:
    return float(Fraction(2) ** k)


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format emulated on a float32 carrier.

    Args:
        exp: exponent bits, 1..8.
        man: stored mantissa (fraction) bits, 0..23.
        bias: exponent bias; default ``2**(exp-1) - 1``. A custom bias must keep every value of
            the format (down to the smallest subnormal) inside float32's range.
        specials: ``"ieee"``, ``"fn"`` or ``"finite"`` (see :class:`Specials`).
        subnormals: if False, results below :attr:`smallest_normal` are flushed to signed zero.

    Example:
        >>> FloatFormat(5, 2).max
        57344.0
        >>> FloatFormat.parse("e4m3fn").max
        448.0
    """

    #: Number of exponent bits (1..8).
    exp: int
    #: Number of stored mantissa bits (0..23).
    man: int
    #: Exponent bias; ``None`` at construction means the IEEE default ``2**(exp-1) - 1``.
    bias: int = dataclasses.field(default=None, kw_only=True)  # type: ignore[assignment]
    #: Special-value convention (a :class:`Specials`; strings are accepted and converted).
    specials: Specials = dataclasses.field(default=Specials.IEEE, kw_only=True)
    #: Whether results below the smallest normal are kept (gradual underflow) or flushed to zero.
    subnormals: bool = dataclasses.field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        for name, lo, hi in (("exp", 1, 8), ("man", 0, 23)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"FloatFormat {name} must be an int, got {type(v).__name__}")
            if not lo <= v <= hi:
                raise ValueError(f"FloatFormat {name}={v} is out of range; allowed {lo}..{hi}")
        if self.bias is None:
            object.__setattr__(self, "bias", (1 << (self.exp - 1)) - 1)
        elif isinstance(self.bias, bool) or not isinstance(self.bias, int):
            raise TypeError(f"FloatFormat bias must be an int or None, got {type(self.bias).__name__}")
        if isinstance(self.specials, str):
            try:
                object.__setattr__(self, "specials", Specials(self.specials.lower()))
            except ValueError:
                raise ValueError(
                    f"FloatFormat specials={self.specials!r} is unknown; allowed: 'ieee', 'fn', 'finite'"
                ) from None
        elif not isinstance(self.specials, Specials):
            raise TypeError(f"FloatFormat specials must be a str or Specials, got {type(self.specials).__name__}")
        if not isinstance(self.subnormals, bool):
            raise TypeError(f"FloatFormat subnormals must be a bool, got {type(self.subnormals).__name__}")
        if self.max_code <= 0:
            raise ValueError(
                f"FloatFormat(exp={self.exp}, man={self.man}, specials={self.specials.value!r}) has no "
                "positive finite value; use more bits or specials='finite'"
            )
        if not self.subnormals and self.max_code >> self.man == 0:
            raise ValueError(
                f"FloatFormat(exp={self.exp}, man={self.man}, specials={self.specials.value!r}) has no normal "
                "numbers, so subnormals=False would flush every value to zero; keep subnormals=True"
            )
        if self.emin - self.man < -149:
            raise ValueError(
                f"FloatFormat bias={self.bias} puts the smallest subnormal 2^{self.emin - self.man} below "
                f"float32's 2^-149; allowed bias <= {self.bias + (self.emin - self.man + 149)} for "
                f"exp={self.exp}, man={self.man}"
            )
        if self.emax > 127:
            raise ValueError(
                f"FloatFormat bias={self.bias} puts the largest exponent 2^{self.emax} above float32's "
                f"2^127; allowed bias >= {self.bias + self.emax - 127} for exp={self.exp}, man={self.man}"
            )

    # ----------------------------------------------------------------------------- codes
    @property
    def bits(self) -> int:
        """Total bits of an encoding: 1 + exp + man."""
        return 1 + self.exp + self.man

    @property
    def max_code(self) -> int:
        """Largest positive code that encodes a finite number."""
        top = (1 << (self.exp + self.man)) - 1  # all ones below the sign bit
        if self.specials is Specials.IEEE:
            return ((1 << self.exp) - 1 << self.man) - 1  # just below the reserved exponent
        if self.specials is Specials.FN:
            return top - 1  # all ones is NaN
        return top

    @property
    def nan_code(self) -> int | None:
        """Positive code of the canonical (quiet) NaN, or None if the format has no NaN."""
        if self.specials is Specials.IEEE:
            return None if self.man == 0 else ((1 << self.exp) - 1 << self.man) | (1 << (self.man - 1))
        if self.specials is Specials.FN:
            return (1 << (self.exp + self.man)) - 1
        return None

    @property
    def has_inf(self) -> bool:
        """Whether ±inf are codes of this format."""
        return self.specials is Specials.IEEE

    @property
    def has_nan(self) -> bool:
        """Whether NaN is a code of this format."""
        return self.nan_code is not None

    # ----------------------------------------------------------------------------- finfo-style
    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number, ``1 - bias``."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        return max(self.max_code >> self.man, 1) - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        return float(self.code_value(self.max_code))

    @property
    def smallest_normal(self) -> float:
        """Smallest positive normal value, ``2**emin`` (``torch.finfo.smallest_normal``)."""
        return _pow2(self.emin)

    tiny = smallest_normal

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value: ``2**(emin - man)``, or the smallest normal without subnormals."""
        if not self.subnormals or self.man == 0:
            return self.smallest_normal
        return _pow2(self.emin - self.man)

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value of the same binade, ``2**-man``."""
        return _pow2(-self.man)

    @property
    def name(self) -> str:
        """Short name, ``e5m2``/``e4m3fn``/``e2m1finite``, with ``b<bias>`` for a custom bias."""
        suffix = {Specials.IEEE: "", Specials.FN: "fn", Specials.FINITE: "finite"}[self.specials]
        s = f"e{self.exp}m{self.man}{suffix}"
        if self.bias != (1 << (self.exp - 1)) - 1:
            s += f"b{self.bias}"
        if not self.subnormals:
            s += "nosub"
        return s

    def code_value(self, code: int) -> Fraction:
        """Exact value of a non-negative finite magnitude code (no sign bit), straight from the definition."""
        field, frac = code >> self.man, code & ((1 << self.man) - 1)
        if field == 0:
            return Fraction(frac, 1 << self.man) * Fraction(2) ** self.emin
        return (1 + Fraction(frac, 1 << self.man)) * Fraction(2) ** (field - self.bias)

    # ----------------------------------------------------------------------------- parsing, text
    @classmethod
    def parse(cls, spec: "FloatFormat | str | object") -> "FloatFormat":
        """A format from a name, a ``torch`` floating dtype, or a FloatFormat.

        Names: ``e<exp>m<man>`` is the IEEE-like format, with suffix ``fn`` or ``finite`` for the
        other conventions, then optionally ``b<bias>`` and ``nosub`` -- exactly what :attr:`name`
        produces, so ``parse(f.name) == f``. Also ``fp32``/``float32``, ``tf32``, ``fp16``/``half``,
        ``bf16``/``bfloat16``, ``fp8_e5m2``, ``fp8_e4m3fn``, ``fp4``, and the preset names exactly as
        spelled in :data:`PRESETS` (``"E2M1"`` is the finite MX FP4 preset ``e2m1finite``, while a
        lower-case ``"e2m1"`` is the IEEE-like e2m1 with max 3).
        """
        if isinstance(spec, FloatFormat):
            return spec
        try:
            import torch

            if isinstance(spec, torch.dtype):
                if spec in _DTYPE_FORMATS:
                    return _DTYPE_FORMATS[spec]
                raise ValueError(f"fmt={spec} has no cpd format; allowed float dtypes: {list(_DTYPE_FORMATS)}")
        except ImportError:  # pragma: no cover - torch is a hard dependency
            pass
        if not isinstance(spec, str):
            raise TypeError(f"fmt must be a FloatFormat, a name or a torch dtype, got {type(spec).__name__}")
        if spec.strip() in PRESETS:  # case-sensitive preset names first: "E2M1" is the finite preset
            return PRESETS[spec.strip()]
        key = spec.strip().lower().replace("_", "")
        m = re.fullmatch(r"e(\d)m(\d+)(fn|finite)?(?:b(-?\d+))?(nosub)?", key)
        if m:
            return cls(int(m.group(1)), int(m.group(2)), specials=m.group(3) or "ieee",
                       bias=None if m.group(4) is None else int(m.group(4)), subnormals=m.group(5) is None)
        key = key.replace("-", "")
        if key in _ALIASES:
            return _ALIASES[key]
        raise ValueError(
            f"fmt={spec!r} is not a format name; use e.g. 'e5m2', 'e4m3fn', 'e2m1finite', 'fp16', 'bf16', "
            f"'tf32', 'fp32' or one of {sorted(PRESETS)}"
        )

    def __str__(self) -> str:
        def p2(v: float) -> str:
            k = Fraction(v).denominator.bit_length() - 1 if v < 1 else Fraction(v).numerator.bit_length() - 1
            return f"2^{-k if v < 1 else k} = {v:.9g}"

        specials = {
            Specials.IEEE: "ieee (top exponent code: ±inf and NaN)" if self.man else "ieee (top exponent code: ±inf, no NaN)",
            Specials.FN: "fn (no inf; only the all-ones code is NaN)",
            Specials.FINITE: "finite (no inf, no NaN)",
        }[self.specials]
        return (
            f"{self.name}: {self.bits} bits (1 sign, {self.exp} exponent, {self.man} mantissa), bias {self.bias}\n"
            f"  max {self.max:.9g}, smallest normal {p2(self.smallest_normal)}, "
            f"smallest subnormal {p2(self.smallest_subnormal)}\n"
            f"  eps {p2(self.eps)}, emin {self.emin}, emax {self.emax}, specials {specials}"
            + ("" if self.subnormals else ", subnormals flushed to zero")
        )


FP32 = FloatFormat(8, 23)
TF32 = FloatFormat(8, 10)
FP16 = FloatFormat(5, 10)
BF16 = FloatFormat(8, 7)
E5M2 = FloatFormat(5, 2)
#: IEEE-like E4M3: the top exponent code is reserved, max 240.
E4M3 = FloatFormat(4, 3)
#: OCP E4M3FN: no infinities, max 448, bit-identical to ``torch.float8_e4m3fn``.
E4M3FN = FloatFormat(4, 3, specials="fn")
E3M2 = FloatFormat(3, 2, specials="finite")
E2M3 = FloatFormat(2, 3, specials="finite")
E2M1 = FloatFormat(2, 1, specials="finite")

PRESETS = {
    "FP32": FP32, "TF32": TF32, "FP16": FP16, "BF16": BF16, "E5M2": E5M2, "E4M3": E4M3,
    "E4M3FN": E4M3FN, "E3M2": E3M2, "E2M3": E2M3, "E2M1": E2M1,
}
_ALIASES = {k.lower(): v for k, v in PRESETS.items() if not re.fullmatch(r"e\dm\d+", k.lower())}
_ALIASES.update({
    "float32": FP32, "single": FP32, "float16": FP16, "half": FP16, "bfloat16": BF16,
    "fp8e5m2": E5M2, "fp8e4m3": E4M3, "fp8e4m3fn": E4M3FN, "float8e5m2": E5M2, "float8e4m3fn": E4M3FN,
    "fp6e3m2": E3M2, "fp6e2m3": E2M3, "fp4e2m1": E2M1, "fp4": E2M1,
})


def _dtype_formats() -> dict:
    import torch

    return {torch.float32: FP32, torch.float16: FP16, torch.bfloat16: BF16,
            torch.float8_e5m2: E5M2, torch.float8_e4m3fn: E4M3FN}


try:
    _DTYPE_FORMATS = _dtype_formats()
except ImportError:  # pragma: no cover
    _DTYPE_FORMATS = {}
