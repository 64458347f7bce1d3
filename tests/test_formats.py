"""FloatFormat describes the format the contract says it does (docs/design.md §3).

Invariants defended:
* every preset has the well-known numbers of its format (max, smallest normal/subnormal, eps,
  emin/emax, codes), and agrees with ``torch.finfo`` where torch has the dtype;
* for every format of <= 8 bits and a sample of wide ones, every finfo-style property equals what
  the independent oracle derives from the definition;
* ``parse`` understands names, aliases, presets and torch dtypes and rejects everything else with
  a clear error; ``str()`` is readable;
* every invalid argument raises ValueError/TypeError naming the argument; the bias limits are
  exactly the float32 range; formats are frozen, hashable values.
"""

import dataclasses
import math
from fractions import Fraction

import pytest
import torch

import cpd
import oracle
from cpd import FloatFormat, Specials
from formats_grid import fid, small_formats, try_format


def p2(k):
    return math.ldexp(1.0, k)


# name: (bits, max, smallest_normal, smallest_subnormal, eps, emin, emax, max_code, nan_code, has_inf)
KNOWN = {
    "E5M2": (8, 57344.0, p2(-14), p2(-16), 0.25, -14, 15, 0x7B, 0x7E, True),
    "E4M3": (8, 240.0, p2(-6), p2(-9), 0.125, -6, 7, 0x77, 0x7C, True),
    "E4M3FN": (8, 448.0, p2(-6), p2(-9), 0.125, -6, 8, 0x7E, 0x7F, False),
    "FP16": (16, 65504.0, p2(-14), p2(-24), p2(-10), -14, 15, 0x7BFF, 0x7E00, True),
    "BF16": (16, (2 - p2(-7)) * p2(127), p2(-126), p2(-133), p2(-7), -126, 127, 0x7F7F, 0x7FC0, True),
    "TF32": (19, (2 - p2(-10)) * p2(127), p2(-126), p2(-136), p2(-10), -126, 127, (0xFF << 10) - 1,
             (0xFF << 10) | (1 << 9), True),
    "FP32": (32, (2 - p2(-23)) * p2(127), p2(-126), p2(-149), p2(-23), -126, 127, 0x7F7FFFFF, 0x7FC00000, True),
    "E3M2": (6, 28.0, 0.25, 0.0625, 0.25, -2, 4, 31, None, False),
    "E2M3": (6, 7.5, 1.0, 0.125, 0.125, 0, 2, 31, None, False),
    "E2M1": (4, 6.0, 1.0, 0.5, 0.5, 0, 2, 7, None, False),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_preset_known_numbers(name):
    f = cpd.PRESETS[name]
    bits, mx, sn, ss, eps, emin, emax, max_code, nan_code, has_inf = KNOWN[name]
    assert f.bits == bits
    assert f.max == mx
    assert f.smallest_normal == sn and f.tiny == sn
    assert f.smallest_subnormal == ss
    assert f.eps == eps
    assert (f.emin, f.emax) == (emin, emax)
    assert f.max_code == max_code
    assert f.nan_code == nan_code
    assert f.has_inf is has_inf
    assert f.has_nan is (nan_code is not None)
    assert getattr(cpd, name) is f


def test_preset_specials_and_names():
    assert cpd.E4M3.specials is Specials.IEEE and cpd.E4M3FN.specials is Specials.FN
    for f in (cpd.E3M2, cpd.E2M3, cpd.E2M1):
        assert f.specials is Specials.FINITE
    assert [cpd.PRESETS[k].name for k in ("FP32", "TF32", "FP16", "BF16", "E5M2", "E4M3", "E4M3FN", "E3M2", "E2M3",
                                          "E2M1")] == ["e8m23", "e8m10", "e5m10", "e8m7", "e5m2", "e4m3", "e4m3fn",
                                                       "e3m2finite", "e2m3finite", "e2m1finite"]


@pytest.mark.parametrize("dtype,fmt", [(torch.float32, cpd.FP32), (torch.float16, cpd.FP16),
                                       (torch.bfloat16, cpd.BF16), (torch.float8_e5m2, cpd.E5M2),
                                       (torch.float8_e4m3fn, cpd.E4M3FN)])
def test_presets_match_torch_finfo(dtype, fmt):
    fi = torch.finfo(dtype)
    assert fmt.max == fi.max
    assert fmt.smallest_normal == fi.smallest_normal
    assert fmt.eps == fi.eps
    assert fmt.bits == fi.bits
    assert FloatFormat.parse(dtype) is fmt


def _wide_formats():
    out = []
    for exp, man, specials, bias in [(5, 10, "ieee", None), (8, 7, "ieee", None), (8, 23, "ieee", None),
                                     (8, 22, "fn", 128), (8, 22, "finite", 128), (6, 9, "fn", None),
                                     (1, 15, "finite", None), (1, 20, "ieee", None), (8, 0, "ieee", 150),
                                     (8, 0, "finite", 128), (3, 20, "ieee", 129), (7, 16, "fn", 0),
                                     (8, 10, "ieee", 140), (2, 23, "fn", -124)]:
        out.append(FloatFormat(exp, man, specials=specials, bias=bias))
    out.append(FloatFormat(6, 12, subnormals=False))
    return out


ALL = small_formats() + _wide_formats()


@pytest.mark.parametrize("f", ALL, ids=fid)
def test_properties_match_definition(f):
    mc = oracle.max_code(f)
    vals_max = oracle.max_value(f)
    assert f.bits == oracle.nbits(f)
    assert f.max_code == mc
    assert Fraction(f.max) == vals_max
    assert f.nan_code == oracle.nan_code(f)
    assert f.has_inf == (oracle.inf_code(f) is not None)
    assert f.has_nan == (oracle.nan_code(f) is not None)
    assert Fraction(f.smallest_normal) == oracle.smallest_normal(f)
    assert f.emin == 1 - f.bias
    assert f.eps == p2(-f.man)
    # the smallest positive value the format produces
    smallest = oracle.mag_value(f, 1)
    if not f.subnormals:
        smallest = max(smallest, oracle.smallest_normal(f))
    assert Fraction(f.smallest_subnormal) == smallest
    # emax: the binade of max, 2^emax <= max < 2^(emax+1); an all-subnormal format (exp=1, ieee)
    # reports the binade its subnormals are counted in, emin
    if vals_max >= oracle.smallest_normal(f):
        assert Fraction(2) ** f.emax <= vals_max < Fraction(2) ** (f.emax + 1)
    else:
        assert f.emax == f.emin
    assert f.max <= torch.finfo(torch.float32).max and f.smallest_subnormal >= p2(-149)


def test_rejected_small_formats_are_exactly_those_without_a_positive_value():
    rejected = []
    for exp in range(1, 9):
        for man in range(0, 24):
            for specials in ("ieee", "fn", "finite"):
                lo, hi = oracle.bias_range(exp, man, specials)
                default = 2 ** (exp - 1) - 1
                if not lo <= default <= hi:
                    continue
                f = try_format(exp, man, specials=specials)
                fields = type("Fields", (), dict(exp=exp, man=man, bias=default, specials=specials, subnormals=True))
                if oracle.max_code(fields) <= 0:
                    rejected.append((exp, man, specials))
                    assert f is None
                else:
                    assert f is not None, (exp, man, specials)
    assert rejected == [(1, 0, "ieee"), (1, 0, "fn")]


def test_default_bias():
    for exp in range(1, 9):
        f = FloatFormat(exp, 3)
        assert f.bias == 2 ** (exp - 1) - 1
    assert FloatFormat(5, 2, bias=None).bias == 15
    assert FloatFormat(5, 2, bias=15) == FloatFormat(5, 2)


# ------------------------------------------------------------------------------------ parse, names
@pytest.mark.parametrize("name,expected", [
    ("e5m2", cpd.E5M2), ("E5M2", cpd.E5M2), ("fp8_e5m2", cpd.E5M2), ("float8_e5m2", cpd.E5M2),
    ("e4m3", cpd.E4M3), ("e4m3fn", cpd.E4M3FN), ("float8_e4m3fn", cpd.E4M3FN), (" E4M3FN ", cpd.E4M3FN),
    ("fp16", cpd.FP16), ("half", cpd.FP16), ("float16", cpd.FP16), ("bf16", cpd.BF16), ("bfloat16", cpd.BF16),
    ("fp32", cpd.FP32), ("float32", cpd.FP32), ("tf32", cpd.TF32), ("fp4", cpd.E2M1), ("fp4_e2m1", cpd.E2M1),
    ("fp6_e3m2", cpd.E3M2), ("fp6_e2m3", cpd.E2M3), ("e2m1finite", cpd.E2M1), ("e3m2finite", cpd.E3M2),
    ("e2m1ieee", FloatFormat(2, 1)), ("e3m2ieee", FloatFormat(3, 2)), ("E2M3IEEE", FloatFormat(2, 3)),
    ("e2m1fn", cpd.E2M1), ("mxfp4_e2m1", cpd.E2M1), ("e3m2fn", cpd.E3M2), ("e2m3fn", cpd.E2M3),
    ("e4m3fnuz", cpd.E4M3FNUZ), ("float8_e5m2fnuz", cpd.E5M2FNUZ), ("e4m3b11fnuz", cpd.E4M3B11FNUZ),
    ("e8m0fnu", cpd.E8M0), ("E8M0", cpd.E8M0), ("e3m1fn_nan", FloatFormat(3, 1, specials="fn")),
    ("e4m3b3", FloatFormat(4, 3, bias=3)), ("e4m3fnb-3nosub", FloatFormat(4, 3, bias=-3, specials="fn", subnormals=False)),
    ("e6m9", FloatFormat(6, 9)), ("e6m9fn", FloatFormat(6, 9, specials="fn")),
    ("e7m23finite", FloatFormat(7, 23, specials="finite")),
])
def test_parse_names(name, expected):
    assert FloatFormat.parse(name) == expected


def test_parse_passes_formats_and_dtypes():
    f = FloatFormat(3, 4, bias=2, specials="fn", subnormals=False)
    assert FloatFormat.parse(f) is f
    assert FloatFormat.parse(torch.float16) is cpd.FP16
    assert FloatFormat.parse(torch.bfloat16) is cpd.BF16
    assert FloatFormat.parse(torch.float8_e4m3fn) is cpd.E4M3FN


@pytest.mark.parametrize("f", list(cpd.PRESETS.values()), ids=fid)
def test_preset_name_round_trips(f):
    assert FloatFormat.parse(f.name) == f


@pytest.mark.parametrize("bad,exc,match", [
    ("e9m2", ValueError, "exp=9"), ("e5m24", ValueError, "man=24"), ("e0m2", ValueError, "exp=0"),
    ("e8m23fn", ValueError, "bias=127"),  # fn/finite formats with exp=8 need a bias >= 128
    ("foo", ValueError, "fmt='foo'"), ("", ValueError, "fmt=''"), ("e4m3xyz", ValueError, "e4m3xyz"),
    (torch.float64, ValueError, "float64"), (torch.int8, ValueError, "int8"),
    (3, TypeError, "int"), (None, TypeError, "NoneType"), (4.5, TypeError, "float"),
])
def test_parse_rejects(bad, exc, match):
    with pytest.raises(exc, match=match):
        FloatFormat.parse(bad)


def test_str_is_readable():
    s = str(cpd.E5M2)
    assert s.startswith("e5m2: 8 bits (1 sign, 5 exponent, 2 mantissa), bias 15")
    for part in ("max 57344", "smallest normal 2^-14", "smallest subnormal 2^-16", "eps 2^-2", "emin -14",
                 "emax 15", "ieee"):
        assert part in s, (part, s)
    s = str(FloatFormat(4, 3, specials="fn", subnormals=False, bias=5))
    assert "e4m3fnb5nosub" in s and "fn" in s and "flushed" in s and "bias 5" in s
    assert "no inf, no NaN" in str(cpd.E2M1) and "max 6," in str(cpd.E2M1)
    for f in ALL:
        text = str(f)
        assert f.name in text and f"{f.bits} bits" in text


def test_names_encode_every_field():
    names = [f.name for f in ALL]
    assert len(set(names)) == len(set(ALL)), "two different formats share a name"
    assert FloatFormat(4, 3, bias=3).name == "e4m3b3"
    assert FloatFormat(4, 3, subnormals=False).name == "e4m3nosub"


@pytest.mark.parametrize("f", ALL, ids=fid)
def test_every_name_round_trips(f):
    """parse(f.name) == f for every format: custom bias (b<bias>, also negative), nosub, and ieee
    formats whose bare name was ambiguous (the IEEE-like e2m1 is e2m1ieee, E2M1 is e2m1finite)."""
    assert FloatFormat.parse(f.name) == f


# ------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(exp=0, man=2), ValueError, ["exp", "0", "1..8"]),
    (dict(exp=9, man=2), ValueError, ["exp", "9", "1..8"]),
    (dict(exp=5, man=-1), ValueError, ["man", "-1", "0..23"]),
    (dict(exp=5, man=24), ValueError, ["man", "24", "0..23"]),
    (dict(exp=5, man=2, bias=149), ValueError, ["bias", "149"]),
    (dict(exp=5, man=2, bias=-98), ValueError, ["bias", "-98"]),
    (dict(exp=5, man=2, bias=10**6), ValueError, ["bias"]),
    (dict(exp=5, man=2, specials="foo"), ValueError, ["specials", "foo", "ieee", "fn", "finite"]),
    (dict(exp=5.0, man=2), TypeError, ["exp", "float"]),
    (dict(exp=5, man="2"), TypeError, ["man", "str"]),
    (dict(exp=True, man=2), TypeError, ["exp", "bool"]),
    (dict(exp=5, man=2, bias=1.5), TypeError, ["bias", "float"]),
    (dict(exp=5, man=2, bias=True), TypeError, ["bias", "bool"]),
    (dict(exp=5, man=2, specials=1), TypeError, ["specials", "int"]),
    (dict(exp=5, man=2, subnormals=1), TypeError, ["subnormals", "int"]),
    (dict(exp=5, man=2, subnormals=None), TypeError, ["subnormals"]),
    (dict(exp=1, man=0), ValueError, ["no positive finite"]),
    (dict(exp=1, man=0, specials="fn"), ValueError, ["no positive finite"]),
])
def test_bad_arguments_name_the_argument(kwargs, exc, words):
    with pytest.raises(exc) as info:
        FloatFormat(**kwargs)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("exp,man,specials", [(e, m, s) for e in (1, 2, 4, 5, 8) for m in (0, 1, 3, 10, 23)
                                              for s in ("ieee", "fn", "finite") if (e, m, s) not in
                                              ((1, 0, "ieee"), (1, 0, "fn"))])
def test_bias_limits_are_float32_range(exp, man, specials):
    lo, hi = oracle.bias_range(exp, man, specials)
    if lo > hi:  # e8m23fn / e8m23finite: 2^-150 .. 2^128 fits no bias
        for b in (lo - 1, lo, hi, hi + 1):
            with pytest.raises(ValueError, match="bias"):
                FloatFormat(exp, man, bias=b, specials=specials)
        return
    for b in (lo, hi):
        f = FloatFormat(exp, man, bias=b, specials=specials)
        assert f.max <= torch.finfo(torch.float32).max and math.isfinite(f.smallest_normal)
        assert f.smallest_subnormal >= p2(-149)
    with pytest.raises(ValueError, match=f"bias={lo - 1}"):
        FloatFormat(exp, man, bias=lo - 1, specials=specials)
    with pytest.raises(ValueError, match=f"bias={hi + 1}"):
        FloatFormat(exp, man, bias=hi + 1, specials=specials)


def test_specials_accepts_enum_and_any_case():
    assert FloatFormat(4, 3, specials=Specials.FN) == FloatFormat(4, 3, specials="FN") == cpd.E4M3FN
    assert FloatFormat(4, 3, specials="IEEE").specials is Specials.IEEE


def test_frozen_hashable_value():
    f = FloatFormat(4, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.exp = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.bias = 1
    assert f == cpd.E4M3 and hash(f) == hash(cpd.E4M3)
    assert f != cpd.E4M3FN and f != FloatFormat(4, 3, subnormals=False) and f != FloatFormat(4, 3, bias=6)
    assert len({cpd.E4M3, f, cpd.E4M3FN}) == 2


def test_rounding_parse():
    R = cpd.Rounding
    assert R.parse("nearest") is R.NEAREST and R.parse("Stochastic") is R.STOCHASTIC
    assert R.parse(R.UP) is R.UP
    assert {m.value for m in R} == {"nearest", "stochastic", "toward_zero", "up", "down", "nearest_away", "odd"}
    assert R.parse("Nearest_Away") is R.NEAREST_AWAY and R.parse("odd") is R.ODD
    with pytest.raises(ValueError, match="rounding='near'"):
        R.parse("near")
    with pytest.raises(TypeError, match="rounding"):
        R.parse(0)
