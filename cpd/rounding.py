"""Rounding modes and their string names.

The integer code of each member is what the numerics core (``cuda/include/cpd/base.h``)
receives; keep the two in step.
"""

from __future__ import annotations

import enum

__all__ = ["Rounding"]


class Rounding(enum.Enum):
    """How a value between two representable neighbours is resolved.

    Members carry the strings users type: ``cpd.cast(x, fmt, "stochastic")``.
    """

    #: IEEE roundTiesToEven (ties go to the even *encoding*).
    NEAREST = "nearest"
    #: Round up with probability equal to the exact fractional distance to the lower neighbour.
    STOCHASTIC = "stochastic"
    #: IEEE roundTowardZero (truncation); never overflows to infinity.
    TOWARD_ZERO = "toward_zero"
    #: IEEE roundTowardPositive.
    UP = "up"
    #: IEEE roundTowardNegative.
    DOWN = "down"
    #: IEEE roundTiesToAway: to nearest, ties away from zero (microxcaling's default; what
    #: ml_dtypes and torch do when they cast to float8_e8m0fnu).
    NEAREST_AWAY = "nearest_away"
    #: Round to odd: exact values stay; anything else takes the neighbour with the odd encoding
    #: (truncation that sets a sticky last bit). Rounding to odd at p + 2 or more bits and then to
    #: nearest at p bits equals rounding to nearest once (Boldo & Melquiond, 2008). Overflows
    #: give ±max, like toward_zero.
    ODD = "odd"

    @property
    def code(self) -> int:
        """The integer the numerics core uses for this mode."""
        return _CODES[self._value_]  # keyed by the string: an enum member hashes in Python

    @classmethod
    def from_code(cls, code: int) -> "Rounding":
        """The mode whose :attr:`code` is ``code`` (the inverse of ``code``)."""
        return _FROM_CODE[code]

    @classmethod
    def parse(cls, value: "Rounding | str", name: str = "rounding") -> "Rounding":
        """Accept a member or its string name; anything else is a clear error."""
        if isinstance(value, Rounding):
            return value
        if isinstance(value, str):
            mode = _BY_NAME.get(value)  # the common spellings, with no lower()
            if mode is not None:
                return mode
            try:
                return cls(value.lower())
            except ValueError:
                pass
            raise ValueError(
                f"{name}={value!r} is not a rounding mode; allowed: "
                + ", ".join(repr(m.value) for m in cls)
            )
        raise TypeError(f"{name} must be a str or cpd.Rounding, got {type(value).__name__}")


_CODES = {
    Rounding.NEAREST.value: 0,
    Rounding.STOCHASTIC.value: 1,
    Rounding.TOWARD_ZERO.value: 2,
    Rounding.UP.value: 3,
    Rounding.DOWN.value: 4,
    Rounding.NEAREST_AWAY.value: 5,
    Rounding.ODD.value: 6,
}
_FROM_CODE = {c: Rounding(v) for v, c in _CODES.items()}
_BY_NAME = {m.value: m for m in Rounding}
