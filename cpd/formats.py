"""Floating-point formats: ``FloatFormat``, its special-value conventions, presets and ``parse``.

A format has one sign bit (none when ``signed=False``), ``exp`` exponent bits and ``man`` stored
mantissa bits, and a special-value convention (:class:`Specials`); float32 is the
carrier, so every format must fit inside float32 (docs/design.md §3). Properties follow
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
    "E4M3FNUZ",
    "E5M2FNUZ",
    "E4M3B11FNUZ",
    "E8M0",
    "PRESETS",
]


class Specials(enum.Enum):
    """Which codes of a format are not finite numbers (the special-value convention).

    The first three are the classic ones; ``FNUZ``, ``P3109`` and ``FNU`` put the NaN where other
    formats have -0 or reserve it in an unsigned format (see docs/formats.md for a table).
    """

    #: The top exponent code is reserved: mantissa 0 is ±inf, anything else NaN (fp16, e5m2).
    IEEE = "ieee"
    #: OCP "finite + NaN" (E4M3FN): no infinities, only the all-ones code is NaN.
    FN = "fn"
    #: Every code is a finite number (MX FP6/FP4 style): no infinities and no NaN.
    FINITE = "finite"
    #: "finite, NaN, unsigned zero" (ml_dtypes ``float8_e4m3fnuz``, AMD MI300, Graphcore): no -0 and
    #: no infinities; the code of -0 (sign bit alone) is the single NaN. Default bias ``2**(exp-1)``.
    FNUZ = "fnuz"
    #: IEEE P3109 extended domain: no -0, the code of -0 is the single NaN, ±inf are the all-ones
    #: magnitudes (unsigned: NaN is all ones, +inf the code below it). Default bias ``2**(exp-1)``.
    #: (P3109's finite domain is ``FNUZ`` for signed formats and ``FN`` for unsigned ones.)
    P3109 = "p3109"
    #: "finite, NaN, unsigned" with no zero (OCP MX E8M0, ml_dtypes ``float8_e8m0fnu``): every
    #: exponent field, 0 included, is a normal binade; the all-ones code is NaN. Needs ``signed=False``.
    FNU = "fnu"

    @property
    def code(self) -> int:
        """The integer the numerics core uses for this convention (base.h SPECIALS_*)."""
        return _SPECIALS_CODES[self]


_SPECIALS_CODES = {Specials.IEEE: 0, Specials.FN: 1, Specials.FINITE: 2, Specials.FNUZ: 3, Specials.P3109: 4,
                   Specials.FNU: 5}
_SPECIALS_FROM_CODE = {c: m for m, c in _SPECIALS_CODES.items()}
#: Added to Specials.code for an unsigned format (base.h SPECIALS_UNSIGNED).
_UNSIGNED_FLAG = 8
#: The conventions whose default bias is 2**(exp-1) (one more than IEEE's), as in ml_dtypes and P3109.
_HIGH_BIAS = (Specials.FNUZ, Specials.P3109)


def _pow2(k: int) -> float:
    return float(Fraction(2) ** k)


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format emulated on a float32 carrier.

    Args:
        exp: exponent bits, 1..8.
        man: stored mantissa (fraction) bits, 0..23.
        bias: exponent bias; default ``2**(exp-1) - 1`` (``2**(exp-1)`` for ``"fnuz"`` and
            ``"p3109"``, as in ml_dtypes and P3109). A custom bias must keep every value of the
            format (down to the smallest subnormal) inside float32's range.
        specials: ``"ieee"``, ``"fn"``, ``"finite"``, ``"fnuz"``, ``"p3109"`` or ``"fnu"`` (see
            :class:`Specials`).
        subnormals: if False, results below :attr:`smallest_normal` are flushed to zero.
        signed: False for a format without a sign bit (``bits = exp + man``): negative inputs
            become NaN and -0 becomes +0. ``"fnu"`` (E8M0) needs it; ``"fnuz"`` and ``"finite"``
            cannot have it (the first has no -0 code to spare, the second no NaN for negatives).

    Example:
        >>> FloatFormat(5, 2).max
        57344.0
        >>> FloatFormat.parse("e4m3fn").max
        448.0
        >>> FloatFormat.parse("e4m3fnuz").bias, FloatFormat.p3109(8, 3).name
        (8, 'p3109_k8p3se')
    """

    #: Number of exponent bits (1..8).
    exp: int
    #: Number of stored mantissa bits (0..23).
    man: int
    #: Exponent bias; ``None`` at construction means the convention's default.
    bias: int = dataclasses.field(default=None, kw_only=True)  # type: ignore[assignment]
    #: Special-value convention (a :class:`Specials`; strings are accepted and converted).
    specials: Specials = dataclasses.field(default=Specials.IEEE, kw_only=True)
    #: Whether results below the smallest normal are kept (gradual underflow) or flushed to zero.
    subnormals: bool = dataclasses.field(default=True, kw_only=True)
    #: Whether the format has a sign bit.
    signed: bool = dataclasses.field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        _validate(self)

    # ----------------------------------------------------------------------------- codes
    @property
    def _no_zero(self) -> bool:
        return self.specials is Specials.FNU

    @property
    def bits(self) -> int:
        """Total bits of an encoding: sign (if signed) + exp + man."""
        return int(self.signed) + self.exp + self.man

    @property
    def max_code(self) -> int:
        """Largest positive code that encodes a finite number."""
        top = (1 << (self.exp + self.man)) - 1  # all ones below the sign bit
        sp = self.specials
        if sp is Specials.IEEE:
            return ((1 << self.exp) - 1 << self.man) - 1  # just below the reserved exponent
        if sp in (Specials.FN, Specials.FNU):
            return top - 1  # all ones is NaN
        if sp is Specials.P3109:
            return top - 1 if self.signed else top - 2  # all ones is inf (unsigned: NaN, inf below it)
        return top  # finite, fnuz

    @property
    def nan_code(self) -> int | None:
        """Code of the canonical (quiet) NaN -- positive for the sign-symmetric conventions, the
        sign bit alone (the code of -0) for ``fnuz``/``p3109`` -- or None if the format has no NaN."""
        width = self.exp + self.man
        sp = self.specials
        if sp in (Specials.FNUZ, Specials.P3109) and self.signed:
            return 1 << width
        if sp is Specials.IEEE:
            return None if self.man == 0 else ((1 << self.exp) - 1 << self.man) | (1 << (self.man - 1))
        if sp in (Specials.FN, Specials.P3109, Specials.FNU):
            return (1 << width) - 1
        return None

    @property
    def inf_code(self) -> int | None:
        """Code of +inf, or None if the format has no infinities."""
        if self.specials is Specials.IEEE:
            return (1 << self.exp) - 1 << self.man
        if self.specials is Specials.P3109:
            return (1 << (self.exp + self.man)) - (1 if self.signed else 2)
        return None

    @property
    def has_inf(self) -> bool:
        """Whether ±inf are codes of this format."""
        return self.inf_code is not None

    @property
    def has_nan(self) -> bool:
        """Whether NaN is a code of this format."""
        return self.nan_code is not None

    @property
    def has_negative_zero(self) -> bool:
        """Whether -0 is a code (False for ``fnuz``, ``p3109`` and unsigned formats)."""
        return self.signed and self.specials not in (Specials.FNUZ, Specials.P3109)

    @property
    def core_specials(self) -> int:
        """The one integer the numerics core receives for ``specials`` and ``signed``."""
        return self.specials.code | (0 if self.signed else _UNSIGNED_FLAG)

    @classmethod
    def from_core(cls, exp: int, man: int, bias: int, specials: int, subnormals: bool) -> "FloatFormat":
        """The format of the numerics core's five fields (the inverse of ``core_specials``)."""
        return cls(exp, man, bias=bias, specials=_SPECIALS_FROM_CODE[specials & (_UNSIGNED_FLAG - 1)],
                   subnormals=bool(subnormals), signed=not specials & _UNSIGNED_FLAG)

    # ----------------------------------------------------------------------------- finfo-style
    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number: ``1 - bias`` (``-bias`` for ``fnu``, whose
        exponent field 0 is a normal binade)."""
        return (0 if self._no_zero else 1) - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        field = self.max_code >> self.man
        return (field if self._no_zero else max(field, 1)) - self.bias

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
        if not self.subnormals or self.man == 0 or self._no_zero:
            return self.smallest_normal
        return _pow2(self.emin - self.man)

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value of the same binade, ``2**-man``."""
        return _pow2(-self.man)

    @property
    def name(self) -> str:
        """Short name that :meth:`parse` reads back: ``e5m2``, ``e4m3fn``, ``e2m1finite``,
        ``e4m3fnuz``, ``e4m3b11fnuz``, ``e8m0fnu``, ``p3109_k8p3se``; ``b<bias>`` for a custom
        bias, ``nosub`` without subnormals, a leading ``u`` for other unsigned formats."""
        return _name_of(self)

    def _is_p3109(self) -> bool:
        """Whether this is exactly a P3109 format (standard bias, subnormals) named p3109_k..."""
        if not self.subnormals or self.bias != 1 << (self.exp - 1):
            return False
        if self.signed:
            return self.specials is Specials.P3109
        return self.specials in (Specials.P3109, Specials.FN)

    def code_value(self, code: int) -> Fraction:
        """Exact value of a non-negative finite magnitude code (no sign bit), straight from the definition."""
        field, frac = code >> self.man, code & ((1 << self.man) - 1)
        if field == 0 and not self._no_zero:
            return Fraction(frac, 1 << self.man) * Fraction(2) ** self.emin
        return (1 + Fraction(frac, 1 << self.man)) * Fraction(2) ** (field - self.bias)

    # ----------------------------------------------------------------------------- constructors
    @classmethod
    def p3109(cls, k: int, p: int, *, signed: bool = True, domain: str = "extended") -> "FloatFormat":
        """The IEEE P3109 format binary{k}p{p} (interim report, 2024; gfloat's ``format_info_p3109``).

        ``k`` bits in all, precision ``p`` (``p - 1`` stored mantissa bits), bias
        ``2**(k-p-1)`` (signed) or ``2**(k-p)`` (unsigned); one NaN (the -0 code 0x80 when
        signed, all ones when unsigned), no -0; ``domain="extended"`` has ±inf at the top codes,
        ``"finite"`` makes them finite. Example: ``FloatFormat.p3109(8, 3)`` is ``p3109_k8p3se``;
        ``FloatFormat.p3109(8, 4, domain="finite")`` is ml_dtypes' ``float8_e4m3fnuz``.
        """
        for name, v in (("k", k), ("p", p)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"FloatFormat.p3109 {name} must be an int, got {type(v).__name__}")
        if not isinstance(signed, bool):
            raise TypeError(f"FloatFormat.p3109 signed must be a bool, got {type(signed).__name__}")
        if domain not in ("extended", "finite"):
            raise ValueError(f"FloatFormat.p3109 domain={domain!r} is unknown; allowed: 'extended', 'finite'")
        exp = k - p + (0 if signed else 1)
        if p < 1 or not 1 <= exp <= 8 or p - 1 > 23:
            raise ValueError(f"FloatFormat.p3109 k={k}, p={p} (signed={signed}) gives {exp} exponent bits and "
                             f"{p - 1} mantissa bits; allowed 1..8 and 0..23 (1 <= p <= k - {1 if signed else 0})")
        specials = (Specials.P3109 if domain == "extended" else Specials.FNUZ if signed else Specials.FN)
        return cls(exp, p - 1, bias=1 << (exp - 1), specials=specials, signed=signed)

    # ----------------------------------------------------------------------------- parsing, text
    @classmethod
    def parse(cls, spec: "FloatFormat | str | object") -> "FloatFormat":
        """A format from a name, a ``torch`` floating dtype, or a FloatFormat.

        Names are case-insensitive (``_`` and ``-`` are ignored):

        * ``e<exp>m<man>`` then a convention suffix -- none (IEEE-like), ``fn``, ``finite``,
          ``fnuz``, ``fnu``, ``p3109``, ``ieee`` -- with ``b<bias>`` before or after it and
          ``nosub`` last; a leading ``u`` for an unsigned format. ``fn`` reads as ml_dtypes
          spells its types: one NaN code at 8 bits and more (``e4m3fn``), no NaN at all below 8
          bits (``e2m1fn`` is ``float4_e2m1fn``: finite, saturating); ``fn_nan`` is the one-NaN
          convention at any width. So each ml_dtypes suffix (``e3m4``, ``e4m3``, ``e4m3fn``,
          ``e5m2``, ``e4m3fnuz``, ``e5m2fnuz``, ``e4m3b11fnuz``, ``e8m0fnu``, ``e2m3fn``,
          ``e3m2fn``, ``e2m1fn``) and full name (``float8_e4m3fnuz``) is that type.
        * ``p3109_k<k>p<p><s|u><e|f>`` (gfloat's names): :meth:`p3109`.
        * aliases: ``fp32``/``float32``, ``tf32``, ``fp16``/``half``, ``bf16``/``bfloat16``,
          ``fp8_e5m2``, ``fp8_e4m3fn``, ``fp6_e3m2``, ``fp6_e2m3``, ``fp4``/``fp4_e2m1``,
          ``mxfp4_e2m1``, ``mxfp6_e3m2``, ``mxfp6_e2m3``, ``e8m0``, and the keys of :data:`PRESETS`.

        The bare names ``e2m1``, ``e3m2`` and ``e2m3`` are an error: they used to mean the MX
        preset in upper case and the IEEE-like format in lower case. Write ``e2m1fn`` (MX FP4,
        ``cpd.E2M1``) or ``e2m1ieee``. ``parse(f.name) == f`` for every format.
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
        return _parse_name(cls, spec)

    def __str__(self) -> str:
        return _describe(self)


#: Bare names that meant two formats (upper case: the MX preset; lower case: IEEE-like): an error.
_AMBIGUOUS = {"e2m1": "fp4", "e3m2": "fp6", "e2m3": "fp6"}
_MX_KIND = _AMBIGUOUS


def _validate(self: "FloatFormat") -> None:
    """FloatFormat.__post_init__: types, ranges, the convention's default bias, float32's range."""
    for name, lo, hi in (("exp", 1, 8), ("man", 0, 23)):
        v = getattr(self, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"FloatFormat {name} must be an int, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise ValueError(f"FloatFormat {name}={v} is out of range; allowed {lo}..{hi}")
    allowed = ", ".join(repr(m.value) for m in Specials)
    if isinstance(self.specials, str):
        try:
            object.__setattr__(self, "specials", Specials(self.specials.lower()))
        except ValueError:
            raise ValueError(f"FloatFormat specials={self.specials!r} is unknown; allowed: {allowed}") from None
    elif not isinstance(self.specials, Specials):
        raise TypeError(f"FloatFormat specials must be a str or Specials, got {type(self.specials).__name__}")
    if self.bias is None:
        high = self.specials in _HIGH_BIAS
        object.__setattr__(self, "bias", (1 << (self.exp - 1)) - (0 if high else 1))
    elif isinstance(self.bias, bool) or not isinstance(self.bias, int):
        raise TypeError(f"FloatFormat bias must be an int or None, got {type(self.bias).__name__}")
    for name in ("subnormals", "signed"):
        if not isinstance(getattr(self, name), bool):
            raise TypeError(f"FloatFormat {name} must be a bool, got {type(getattr(self, name)).__name__}")
    sp = self.specials
    if sp is Specials.FNU and self.signed:
        raise ValueError("FloatFormat specials='fnu' is unsigned (E8M0: no sign, no zero); pass signed=False")
    if sp is Specials.FNU and not self.subnormals:
        raise ValueError("FloatFormat specials='fnu' has no subnormals to flush (every exponent field is a "
                         "normal binade); leave subnormals=True")
    if not self.signed and sp in (Specials.FNUZ, Specials.FINITE):
        raise ValueError(f"FloatFormat specials={sp.value!r} cannot be unsigned (signed=False): 'fnuz' keeps "
                         "its NaN in the sign bit and 'finite' has no NaN for negative inputs; allowed "
                         "unsigned specials: 'ieee', 'fn', 'p3109', 'fnu'")
    if not self.signed and self.nan_code is None:
        raise ValueError(f"FloatFormat(exp={self.exp}, man={self.man}, specials={sp.value!r}, signed=False) has no "
                         "NaN code for negative inputs; use man >= 1 or specials='fn'/'p3109'")
    if self.max_code <= 0:
        raise ValueError(
            f"FloatFormat(exp={self.exp}, man={self.man}, specials={sp.value!r}) has no "
            "positive finite value; use more bits or specials='finite'"
        )
    if not self.subnormals and self.max_code >> self.man == 0:
        raise ValueError(
            f"FloatFormat(exp={self.exp}, man={self.man}, specials={sp.value!r}) has no normal "
            "numbers, so subnormals=False would flush every value to zero; keep subnormals=True"
        )
    if self.emin - self.man < -149 and not self._no_zero:
        raise ValueError(
            f"FloatFormat bias={self.bias} puts the smallest subnormal 2^{self.emin - self.man} below "
            f"float32's 2^-149; allowed bias <= {self.bias + (self.emin - self.man + 149)} for "
            f"exp={self.exp}, man={self.man}"
        )
    if self._no_zero and self.emin < -149:
        raise ValueError(f"FloatFormat bias={self.bias} puts the smallest value 2^{self.emin} below float32's "
                         f"2^-149; allowed bias <= 149")
    if self.emax > 127:
        raise ValueError(
            f"FloatFormat bias={self.bias} puts the largest exponent 2^{self.emax} above float32's "
            f"2^127; allowed bias >= {self.bias + self.emax - 127} for exp={self.exp}, man={self.man}"
        )


def _name_of(self: "FloatFormat") -> str:
    """FloatFormat.name: see there."""
    sp, high = self.specials, 1 << (self.exp - 1)
    default_bias = high if sp in _HIGH_BIAS else high - 1
    core = f"e{self.exp}m{self.man}"
    if self._is_p3109():
        k, p = self.bits, self.man + 1
        return f"p3109_k{k}p{p}{'s' if self.signed else 'u'}{'e' if sp is Specials.P3109 else 'f'}"
    b = f"b{self.bias}" if self.bias != default_bias else ""
    nosub = "" if self.subnormals else "nosub"
    if sp is Specials.FNUZ:  # ml_dtypes' order: e4m3b11fnuz
        return f"{core}{b}fnuz{nosub}"
    if sp is Specials.FNU:
        return f"{core}{b}fnu"
    if sp is Specials.FN and self.bits < 8 and self.signed:
        suffix = "fn_nan"  # "fn" alone is ml_dtypes' no-NaN sub-byte spelling (e2m1fn = finite)
    elif sp is Specials.IEEE:
        suffix = "ieee" if core in _AMBIGUOUS and not b and not nosub else ""
    else:
        suffix = {Specials.FN: "fn", Specials.FINITE: "finite", Specials.P3109: "p3109"}[sp]
    return ("" if self.signed else "u") + f"{core}{suffix}{b}{nosub}"


def _parse_name(cls, spec: str) -> "FloatFormat":
    """FloatFormat.parse of a name (see its docstring)."""
    key = spec.strip().lower().replace("_", "")
    if re.fullmatch(r"e\dm\d+b-?\d+.*|.*b-\d+(nosub)?", key) is None:
        key = key.replace("-", "")  # "fp8-e5m2"; a negative bias keeps its minus
    if key in _AMBIGUOUS:
        raise ValueError(
            f"fmt={spec!r} is ambiguous: the MX preset cpd.{key.upper()} (no inf, no NaN, ml_dtypes' "
            f"float{1 + int(key[1]) + int(key[3])}_{key}fn) is {key + 'fn'!r} (also 'mx{_MX_KIND[key]}_{key}'), "
            f"the IEEE-like {key} with inf and NaN codes is {key + 'ieee'!r}")
    if key in _ALIASES:
        return _ALIASES[key]
    m = re.fullmatch(r"p3109k(\d+)p(\d+)([su])([ef])", key)
    if m:
        return cls.p3109(int(m.group(1)), int(m.group(2)), signed=m.group(3) == "s",
                         domain="extended" if m.group(4) == "e" else "finite")
    m = re.fullmatch(r"(?:(?:float|fp)(\d+))?(u)?e(\d)m(\d+)(?:b(-?\d+))?(fnnan|fnuz|fnu|fn|finite|ieee|p3109)?"
                     r"(?:b(-?\d+))?(nosub)?", key)
    if m and not (m.group(5) and m.group(7)):
        width, uns, exp, man = m.group(1), m.group(2) is not None, int(m.group(3)), int(m.group(4))
        suffix, bias = m.group(6) or "ieee", m.group(5) or m.group(7)
        if suffix == "fn":
            suffix = "fn" if uns or 1 + exp + man >= 8 else "finite"
        specials = {"fnnan": "fn"}.get(suffix, suffix)
        f = cls(exp, man, specials=specials, bias=None if bias is None else int(bias),
                subnormals=m.group(8) is None, signed=not uns and specials != "fnu")
        if width is not None and int(width) != f.bits:
            raise ValueError(f"fmt={spec!r} says {width} bits but {f.name} has {f.bits}")
        return f
    raise ValueError(
        f"fmt={spec!r} is not a format name; use e.g. 'e5m2', 'e4m3fn', 'e4m3fnuz', 'e8m0fnu', 'e2m1fn', "
        f"'p3109_k8p3se', 'fp16', 'bf16', 'tf32', 'fp32' or one of {sorted(PRESETS)}"
    )


def _describe(self: "FloatFormat") -> str:
    """str(FloatFormat): a readable summary."""
    def p2(v: float) -> str:
        k = Fraction(v).denominator.bit_length() - 1 if v < 1 else Fraction(v).numerator.bit_length() - 1
        return f"2^{-k if v < 1 else k} = {v:.9g}"

    specials = {
        Specials.IEEE: "ieee (top exponent code: ±inf and NaN)" if self.man else "ieee (top exponent code: ±inf, no NaN)",
        Specials.FN: "fn (no inf; only the all-ones code is NaN)",
        Specials.FINITE: "finite (no inf, no NaN)",
        Specials.FNUZ: "fnuz (no inf, no -0; the -0 code is the NaN)",
        Specials.P3109: ("p3109 (no -0; the -0 code is the NaN, ±inf at the top codes)" if self.signed
                         else "p3109 (all ones is NaN, +inf below it)"),
        Specials.FNU: "fnu (no inf, no zero; all ones is NaN)",
    }[self.specials]
    sign = "1 sign, " if self.signed else "unsigned, "
    return (
        f"{self.name}: {self.bits} bits ({sign}{self.exp} exponent, {self.man} mantissa), bias {self.bias}\n"
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
#: OCP MX FP6 E3M2 (ml_dtypes ``float6_e3m2fn``): no inf, no NaN, max 28.
E3M2 = FloatFormat(3, 2, specials="finite")
#: OCP MX FP6 E2M3 (ml_dtypes ``float6_e2m3fn``): no inf, no NaN, max 7.5.
E2M3 = FloatFormat(2, 3, specials="finite")
#: OCP MX FP4 E2M1 (ml_dtypes ``float4_e2m1fn``): no inf, no NaN, max 6. Parses as ``"e2m1fn"``.
E2M1 = FloatFormat(2, 1, specials="finite")
#: AMD/Graphcore FNUZ fp8 (ml_dtypes and torch ``float8_e4m3fnuz``): bias 8, max 240, NaN at 0x80.
E4M3FNUZ = FloatFormat(4, 3, specials="fnuz")
#: ml_dtypes/torch ``float8_e5m2fnuz``: bias 16, max 57344, NaN at 0x80.
E5M2FNUZ = FloatFormat(5, 2, specials="fnuz")
#: Graphcore ``float8_e4m3b11fnuz``: bias 11, max 30.
E4M3B11FNUZ = FloatFormat(4, 3, bias=11, specials="fnuz")
#: OCP MX E8M0 scale (ml_dtypes/torch ``float8_e8m0fnu``): unsigned powers of two 2^-127..2^127, NaN 0xFF.
E8M0 = FloatFormat(8, 0, specials="fnu", signed=False)

PRESETS = {
    "FP32": FP32, "TF32": TF32, "FP16": FP16, "BF16": BF16, "E5M2": E5M2, "E4M3": E4M3,
    "E4M3FN": E4M3FN, "E3M2": E3M2, "E2M3": E2M3, "E2M1": E2M1, "E4M3FNUZ": E4M3FNUZ, "E5M2FNUZ": E5M2FNUZ,
    "E4M3B11FNUZ": E4M3B11FNUZ, "E8M0": E8M0,
}
_ALIASES = {k.lower(): v for k, v in PRESETS.items() if not re.fullmatch(r"e\dm\d+", k.lower())}
_ALIASES.update({
    "float32": FP32, "single": FP32, "float16": FP16, "half": FP16, "bfloat16": BF16,
    "fp8e5m2": E5M2, "fp8e4m3": E4M3, "fp8e4m3fn": E4M3FN, "float8e5m2": E5M2, "float8e4m3fn": E4M3FN,
    "fp6e3m2": E3M2, "fp6e2m3": E2M3, "fp4e2m1": E2M1, "fp4": E2M1, "e8m0": E8M0,
    "mxfp4e2m1": E2M1, "mxfp6e3m2": E3M2, "mxfp6e2m3": E2M3, "mxfp8e4m3": E4M3FN, "mxfp8e5m2": E5M2,
})


def _dtype_formats() -> dict:
    import torch

    return {torch.float32: FP32, torch.float16: FP16, torch.bfloat16: BF16,
            torch.float8_e5m2: E5M2, torch.float8_e4m3fn: E4M3FN, torch.float8_e4m3fnuz: E4M3FNUZ,
            torch.float8_e5m2fnuz: E5M2FNUZ, torch.float8_e8m0fnu: E8M0}


try:
    _DTYPE_FORMATS = _dtype_formats()
except ImportError:  # pragma: no cover
    _DTYPE_FORMATS = {}
