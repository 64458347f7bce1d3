"""Format grids shared by the tests (not a test module)."""

from __future__ import annotations

import cpd
import oracle

SPECIALS = ("ieee", "fn", "finite")


def try_format(exp, man, **kw):
    """FloatFormat(exp, man, **kw), or None when cpd rejects it (e.g. no positive finite value)."""
    try:
        return cpd.FloatFormat(exp, man, **kw)
    except ValueError:
        return None


def small_formats() -> list:
    """Every format of at most 8 bits: all exp/man splits x all specials, plus flush-to-zero
    variants and custom biases at both ends of the allowed range and in between."""
    out = []
    for exp in range(1, 8):
        for man in range(0, 8 - exp):
            for specials in SPECIALS:
                f = try_format(exp, man, specials=specials)
                if f is not None:
                    out.append(f)
    extra = [
        dict(exp=4, man=3, subnormals=False), dict(exp=5, man=2, subnormals=False),
        dict(exp=4, man=3, specials="fn", subnormals=False), dict(exp=2, man=1, specials="finite", subnormals=False),
        dict(exp=3, man=0, subnormals=False), dict(exp=2, man=3, specials="finite", subnormals=False),
        dict(exp=1, man=2, specials="finite", subnormals=False),
        dict(exp=4, man=3, bias=0), dict(exp=4, man=3, bias=-3, specials="fn"), dict(exp=3, man=2, bias=10),
        dict(exp=5, man=2, bias=20, subnormals=False), dict(exp=2, man=1, bias=-1, specials="finite"),
    ]
    for exp, man, specials in ((4, 3, "ieee"), (4, 3, "fn"), (5, 2, "ieee"), (3, 4, "finite"), (7, 0, "ieee"),
                               (2, 5, "finite"), (3, 0, "fn")):
        lo, hi = oracle.bias_range(exp, man, specials)
        extra.append(dict(exp=exp, man=man, specials=specials, bias=lo))  # max near 2^127
        extra.append(dict(exp=exp, man=man, specials=specials, bias=hi))  # smallest value 2^-149
    extra.append(dict(exp=4, man=3, bias=oracle.bias_range(4, 3, "ieee")[1], subnormals=False))
    for kw in extra:
        out.append(cpd.FloatFormat(**kw))
    return out


def fid(f) -> str:
    return f.name
