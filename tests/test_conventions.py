"""The special-value conventions beyond IEEE/FN/FINITE, exactly (issue 14, item 1).

Invariants defended:
* for every format of <= 8 bits of the conventions ``fnuz``, ``p3109`` (signed and unsigned),
  unsigned ``fn``/``ieee`` and ``fnu`` (E8M0-like), every deterministic rounding mode and
  saturate on/off, ``cpd.cast`` (compiled core and pure-torch fallback) and ``cpd.reference``
  equal the independent Fraction oracle (tests/oracle.py) on every code's value, every midpoint,
  each midpoint ± 1 float32 ulp, values beyond max, ±inf, NaN, ±0 and float32 subnormals;
  ``encode`` gives the oracle's codes and ``decode`` the oracle's value of every code;
* bit-identity with ml_dtypes for every float type it ships (values and codes), with torch's
  ``float8_e4m3fnuz``/``float8_e5m2fnuz``/``float8_e8m0fnu`` casts, and with gfloat's P3109
  definitions (every code's value);
* names parse like ml_dtypes' and gfloat's, round-trip, and never differ only by letter case.
"""

import functools
import math
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch

import cpd
import oracle
from cpd import FloatFormat, _fallback, reference
from cpd.rounding import Rounding
from test_cast_exhaustive import assert_same_bits, assert_same_codes, grid_inputs


def _try(exp, man, **kw):
    try:
        return FloatFormat(exp, man, **kw)
    except ValueError:
        return None


def convention_formats() -> list:
    """Every <= 8-bit format of the new conventions, plus custom biases and flush variants."""
    out = []
    for exp in range(1, 9):
        for man in range(0, 9 - exp):
            signed_ok = exp + man <= 7
            cands = [dict(specials="p3109", signed=False), dict(specials="fn", signed=False),
                     dict(specials="fnu", signed=False)]
            if signed_ok:
                cands += [dict(specials="fnuz"), dict(specials="p3109")]
            if exp + man <= 4:
                cands.append(dict(specials="ieee", signed=False))
            if exp + man == 8 and exp not in (4, 5, 8):  # 8-bit unsigned: a few splits (time)
                cands = []
            for kw in cands:
                f = _try(exp, man, **kw)
                if f is not None:
                    out.append(f)
    out += [FloatFormat(4, 3, bias=11, specials="fnuz"), FloatFormat(4, 3, specials="fnuz", subnormals=False),
            FloatFormat(5, 2, specials="p3109", subnormals=False), FloatFormat(3, 2, bias=-2, specials="p3109"),
            FloatFormat(4, 4, specials="fn", signed=False, subnormals=False), FloatFormat(3, 5, bias=0, specials="fnu",
                                                                                          signed=False)]
    return out


FORMATS = convention_formats()
#: A few formats on which the (slow, pure Python) reference is run exhaustively too.
REF_FORMATS = [cpd.E4M3FNUZ, cpd.E8M0, FloatFormat.p3109(8, 3), FloatFormat.p3109(6, 3, signed=False),
               FloatFormat(3, 1, specials="fnu", signed=False), FloatFormat(2, 1, specials="fnuz")]


#: Every deterministic mode, and saturation with one mode of each overflow kind (time).
COMBOS = [(m, False) for m in oracle.DET_MODES] + [("nearest", True), ("up", True)]


@functools.lru_cache(maxsize=None)
def expected(fmt):
    xs = grid_inputs(fmt)
    exp = {(m, sat): np.array([oracle.oracle_cast(x, fmt, m, sat) for x in xs], dtype=np.float32)
           for m, sat in COMBOS}
    return np.array(xs, dtype=np.float32), exp


def test_grid_covers_the_conventions():
    kinds = {(f.specials.value, f.signed) for f in FORMATS}
    assert kinds == {("fnuz", True), ("p3109", True), ("p3109", False), ("fn", False), ("fnu", False),
                     ("ieee", False)}
    assert len(FORMATS) > 130 and len({f.name for f in FORMATS}) == len(FORMATS)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_cast_encode_decode_exhaustive(fmt):
    xs, exp = expected(fmt)
    x = torch.from_numpy(xs)
    mask = (1 << (fmt.exp + fmt.man)) - 1
    for (mode, sat), want in exp.items():
        got = cpd.cast(x, fmt, mode, saturate=sat)
        assert_same_bits(got, want, xs, f"cast {fmt.name} {mode} saturate={sat}")
        if FORMATS.index(fmt) % 3 == 0:  # the pure-torch twin on a third of the grid (time)
            fb = _fallback.cast(x, fmt, Rounding.parse(mode), sat, 32, 0, 0)
            assert_same_bits(fb, want, xs, f"fallback cast {fmt.name} {mode} saturate={sat}")
        keep = ~np.isnan(xs) if not fmt.has_nan else np.ones(len(xs), dtype=bool)
        want_codes = torch.tensor([oracle.oracle_code(float(v), fmt) for v in want[keep]], dtype=torch.int64)
        codes = cpd.encode(x[torch.from_numpy(keep)], fmt, mode, saturate=sat).to(torch.int64)
        nan = torch.from_numpy(np.isnan(want[keep]))
        if fmt.signed and fmt.has_negative_zero:  # a sign-symmetric NaN: either sign is fine
            codes, want_codes = (torch.where(nan, c & mask, c) for c in (codes, want_codes))
        assert torch.equal(codes, want_codes), (fmt.name, mode, sat)
    n = 1 << fmt.bits
    dec = cpd.decode(torch.arange(n).to(torch.uint8), fmt)
    want = np.array([oracle.code_value(fmt, c) for c in range(n)], dtype=np.float32)
    assert_same_bits(dec, want, np.arange(n, dtype=np.float32), f"decode {fmt.name}")
    assert_same_bits(_fallback.decode(torch.arange(n), fmt), want, np.arange(n, dtype=np.float32), "fallback")
    ok = ~torch.isnan(dec)
    if fmt.subnormals:
        assert torch.equal(cpd.encode(dec[ok], fmt).to(torch.int64), torch.arange(n)[ok])
    if fmt.has_nan:
        assert int(cpd.encode(torch.tensor([math.nan]), fmt)) & (mask if fmt.has_negative_zero else -1) == \
            oracle.nan_code(fmt)


@pytest.mark.parametrize("fmt", REF_FORMATS, ids=lambda f: f.name)
def test_reference_matches_oracle(fmt):
    xs, exp = expected(fmt)
    for (mode, sat), want in exp.items():
        got = np.array([reference.cast(float(v), fmt, mode, saturate=sat) for v in xs], dtype=np.float32)
        assert_same_bits(torch.from_numpy(got), want, xs, f"reference {fmt.name} {mode} {sat}")


def test_fnu_and_unsigned_rules():
    e8 = cpd.E8M0
    x = torch.tensor([0.0, -0.0, -1.0, 1.0, 2.0 ** -140, 2.0 ** -127, 1.5, 3.0, 2.0 ** 127 * 1.5, math.inf])
    got = cpd.cast(x, e8, "nearest")
    assert [v if not math.isnan(v) else "nan" for v in got.tolist()] == \
        ["nan", "nan", "nan", 1.0, 2.0 ** -127, 2.0 ** -127, 2.0, 2.0, 2.0 ** 127, "nan"]  # ties to the even field
    away = cpd.cast(x, e8, "nearest_away")  # ml_dtypes/torch round ties away
    assert away[7].item() == 4.0 and math.isnan(away[8].item())
    assert cpd.cast(x, e8, "toward_zero")[8].item() == 2.0 ** 127
    u = FloatFormat.p3109(8, 3, signed=False)
    assert math.isnan(cpd.cast(torch.tensor([-1.0]), u).item())
    assert cpd.cast(torch.tensor([-0.0]), u).view(torch.int32).item() == 0
    z = cpd.cast(torch.tensor([-1e-30, -0.0]), cpd.E4M3FNUZ)
    assert z.view(torch.int32).tolist() == [0, 0]  # no -0
    assert int(cpd.encode(torch.tensor([math.nan]), cpd.E4M3FNUZ)) == 0x80
    assert int(cpd.encode(torch.tensor([-math.nan]), cpd.E8M0)) == 0xFF


# ------------------------------------------------------------------------------ ml_dtypes, torch, gfloat
ML = [("float8_e3m4", "e3m4"), ("float8_e4m3", "e4m3"), ("float8_e4m3fn", "e4m3fn"), ("float8_e5m2", "e5m2"),
      ("float8_e4m3fnuz", "e4m3fnuz"), ("float8_e5m2fnuz", "e5m2fnuz"), ("float8_e4m3b11fnuz", "e4m3b11fnuz"),
      ("float8_e8m0fnu", "e8m0fnu"), ("float6_e2m3fn", "e2m3fn"), ("float6_e3m2fn", "e3m2fn"),
      ("float4_e2m1fn", "e2m1fn")]


def _samples() -> np.ndarray:
    g = np.random.default_rng(14)
    rnd = g.integers(0, 1 << 32, size=1 << 17, dtype=np.uint64).astype(np.uint32).view(np.float32)
    small = (g.standard_normal(1 << 15) * np.exp2(g.integers(-20, 20, 1 << 15))).astype(np.float32)
    bf16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    mids = ((np.arange(1 << 16, dtype=np.uint32) << 16) | (1 << 15)).view(np.float32)  # bf16 midpoints
    return np.concatenate([rnd, small, bf16, mids])


@pytest.mark.parametrize("ml_name,name", ML, ids=[n for _, n in ML])
def test_bit_identical_to_ml_dtypes(ml_name, name):
    """parse(suffix) is ml_dtypes' type: same values for every code, same cast of every bf16 value,
    every bf16 midpoint and 2^17 random float32 bit patterns. e8m0fnu: ml_dtypes (and torch) round
    ties away from zero, so the comparison uses rounding='nearest_away' ('nearest' differs only on
    ties), and they round every float32 *subnormal* in (2^-127, 2^-126) up to 2^-126 where the
    nearest value is 2^-127 -- those inputs are left out (test_e8m0_float32_subnormals pins it)."""
    dt = getattr(ml_dtypes, ml_name)
    fmt = FloatFormat.parse(name)
    assert FloatFormat.parse(ml_name) == fmt
    info = ml_dtypes.finfo(dt)
    assert fmt.bits == info.bits and fmt.max == float(info.max) and fmt.smallest_normal == float(info.smallest_normal)
    n = 1 << fmt.bits
    want = np.arange(n, dtype=np.uint8).view(dt).astype(np.float32)
    got = cpd.decode(torch.arange(n).to(torch.uint8), fmt)
    assert_same_bits(got, want, np.arange(n, dtype=np.float32), f"decode {name}")
    xs = _samples()
    mode = "nearest_away" if name == "e8m0fnu" else "nearest"
    if name == "e8m0fnu":
        xs = xs[~((np.abs(xs) > 2.0 ** -127) & (np.abs(xs) < 2.0 ** -126))]
    if not fmt.has_nan:  # ml_dtypes turns NaN into a zero; cpd keeps NaN (and encode rejects it)
        xs = xs[~np.isnan(xs)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # ml_dtypes warns on NaN results
        want = xs.astype(dt).astype(np.float32)
    got = cpd.cast(torch.from_numpy(xs), fmt, mode)
    assert_same_bits(got, want, xs, f"cast {name}")
    ok = ~np.isnan(want)
    codes = cpd.encode(torch.from_numpy(xs[ok]), fmt, mode).numpy()
    assert np.array_equal(codes, xs[ok].astype(dt).view(np.uint8)), name


@pytest.mark.parametrize("dtype,fmt", [(torch.float8_e4m3fnuz, cpd.E4M3FNUZ), (torch.float8_e5m2fnuz, cpd.E5M2FNUZ),
                                       (torch.float8_e8m0fnu, cpd.E8M0)], ids=str)
def test_bit_identical_to_torch(dtype, fmt):
    """torch's casts, code for code. torch's float8_e8m0fnu rounds ties away from zero and maps 0
    and negative inputs to codes (ml_dtypes and cpd give NaN), so it is compared on positive inputs."""
    assert FloatFormat.parse(dtype) is fmt
    xs = torch.from_numpy(_samples())
    mode = "nearest"
    if fmt is cpd.E8M0:
        xs = xs[(xs > 0) & ~torch.isnan(xs) & ~((xs > 2.0 ** -127) & (xs < 2.0 ** -126))]
        mode = "nearest_away"
    want = xs.to(dtype).view(torch.uint8)
    got = cpd.encode(xs, fmt, mode)
    assert torch.equal(got, want)
    assert_same_bits(cpd.cast(xs, fmt, mode), want.view(dtype).float().numpy(), xs.numpy(), str(dtype))


def test_e8m0_float32_subnormals():
    """Where cpd departs from ml_dtypes/torch on purpose: 1.25 * 2^-127 (a float32 subnormal) is
    nearer 2^-127 than 2^-126; cpd rounds it there, the libraries to 2^-126."""
    x = np.array([1.25 * 2.0 ** -127], dtype=np.float32)
    assert int(x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)[0]) == 1
    assert int(cpd.encode(torch.from_numpy(x), cpd.E8M0, "nearest_away")) == 0
    assert int(cpd.encode(torch.from_numpy(x * 2 ** 10), cpd.E8M0, "nearest_away")) == 10  # normal: agree


P3109 = [(k, p, s, d) for k in (3, 4, 6, 8) for p in range(1, k + 1) for s in (True, False)
         for d in ("extended", "finite") if k - p + (0 if s else 1) >= 1]


@pytest.mark.parametrize("k,p,signed,domain", P3109)
def test_p3109_codes_match_gfloat(k, p, signed, domain):
    gfloat = pytest.importorskip("gfloat")
    from gfloat.formats import format_info_p3109

    fi = format_info_p3109(k, p, gfloat.Signedness.Signed if signed else gfloat.Signedness.Unsigned,
                                  gfloat.Domain.Extended if domain == "extended" else gfloat.Domain.Finite)
    f = FloatFormat.p3109(k, p, signed=signed, domain=domain)
    assert FloatFormat.parse(fi.name) == f
    assert f.bits == k and f.max == fi.max
    codes = range(1 << k)
    want = np.array([gfloat.decode_float(fi, c).fval for c in codes], dtype=np.float32)
    got = cpd.decode(torch.tensor(list(codes)).to(torch.uint8), f)
    assert_same_bits(got, want, np.arange(1 << k, dtype=np.float32), fi.name)
    xs = np.array([x for x in grid_inputs(f) if not (x < 0 and not signed)], dtype=np.float32)
    modes = {"nearest": gfloat.RoundMode.TiesToEven, "nearest_away": gfloat.RoundMode.TiesToAway,
             "toward_zero": gfloat.RoundMode.TowardZero, "up": gfloat.RoundMode.TowardPositive,
             "down": gfloat.RoundMode.TowardNegative}
    for mode, rm in modes.items():
        want = np.array([gfloat.round_float(fi, float(x), rm, sat=False) for x in xs], dtype=np.float32)
        assert_same_bits(cpd.cast(torch.from_numpy(xs), f, mode), want, xs, f"{fi.name} {mode}")


# ------------------------------------------------------------------------------ names
def test_ml_dtypes_and_gfloat_names():
    assert FloatFormat.parse("e4m3fnuz") == FloatFormat(4, 3, bias=8, specials="fnuz")
    assert FloatFormat.parse("float8_e4m3b11fnuz").bias == 11
    assert FloatFormat.parse("e8m0fnu") is not None and FloatFormat.parse("E8M0") == cpd.E8M0
    assert FloatFormat.parse("e2m1fn") == cpd.E2M1 == FloatFormat.parse("mxfp4_e2m1") == FloatFormat.parse("FP4")
    assert FloatFormat.parse("e3m2fn") == cpd.E3M2 and FloatFormat.parse("e2m3fn") == cpd.E2M3
    assert FloatFormat.parse("e4m3fn").specials is cpd.Specials.FN  # 8 bits: one NaN code
    assert FloatFormat.parse("e3m1fn_nan") == FloatFormat(3, 1, specials="fn")
    assert FloatFormat.parse("p3109_k8p3se") == FloatFormat.p3109(8, 3)
    assert FloatFormat.parse("p3109_k8p4sf") == cpd.E4M3FNUZ  # P3109's finite domain is fnuz
    assert FloatFormat.parse("e2m1ieee") == FloatFormat(2, 1)
    with pytest.raises(ValueError, match="says 6 bits"):
        FloatFormat.parse("float6_e4m3fn")


@pytest.mark.parametrize("spelling", ["E2M1", "e2m1", "E3M2", "e3m2", "e2m3", " E2M3 "])
def test_ambiguous_spellings_are_a_clear_error(spelling):
    with pytest.raises(ValueError, match="ambiguous") as info:
        FloatFormat.parse(spelling)
    assert "fn" in str(info.value) and "ieee" in str(info.value)


def test_names_round_trip_and_ignore_case():
    from formats_grid import small_formats

    fmts = FORMATS + small_formats() + list(cpd.PRESETS.values())
    for f in fmts:
        assert FloatFormat.parse(f.name) == f, f.name
        assert FloatFormat.parse(f.name.upper()) == f, f.name
    by_lower = {}
    for f in fmts:
        by_lower.setdefault(f.name.lower(), set()).add(f)
    assert all(len(v) == 1 for v in by_lower.values())


@pytest.mark.parametrize("kwargs,words", [
    (dict(exp=8, man=0, specials="fnu"), ["fnu", "signed=False"]),
    (dict(exp=4, man=3, specials="fnuz", signed=False), ["fnuz", "unsigned"]),
    (dict(exp=4, man=3, specials="finite", signed=False), ["finite", "unsigned"]),
    (dict(exp=4, man=3, specials="fnu", signed=False, subnormals=False), ["fnu", "subnormals"]),
    (dict(exp=4, man=3, signed=1), ["signed", "bool"]),
])
def test_bad_convention_arguments(kwargs, words):
    with pytest.raises((ValueError, TypeError)) as info:
        FloatFormat(**kwargs)
    for w in words:
        assert w in str(info.value)


def test_p3109_bad_arguments():
    with pytest.raises(ValueError, match="k=8, p=8"):
        FloatFormat.p3109(8, 8)
    with pytest.raises(ValueError, match="domain"):
        FloatFormat.p3109(8, 3, domain="big")
    with pytest.raises(TypeError, match="k"):
        FloatFormat.p3109(8.0, 3)


# ------------------------------------------------------------------------------ wider formats (hypothesis)
from hypothesis import given, settings, strategies as st  # noqa: E402

import cpd.testing as ct  # noqa: E402

NEW = ("fnuz", "p3109", "fnu", "fn", "ieee")


@settings(max_examples=60, deadline=None)
@given(ct.formats(min_bits=9, max_bits=20, specials=NEW, signed=(True, False), custom_bias=True).flatmap(
    lambda f: st.tuples(st.just(f), st.lists(ct.boundary_values(f), min_size=1, max_size=24))),
    st.sampled_from(oracle.DET_MODES), st.booleans())
def test_wide_formats_match_oracle(fx, mode, sat):
    """Formats of 9-20 bits of every convention, signed or not, custom biases: cast and encode agree
    with the oracle on the strategy's boundary values (cpd.testing covers the new conventions)."""
    fmt, xs = fx
    x = torch.tensor(xs, dtype=torch.float32)
    want = np.array([oracle.oracle_cast(v, fmt, mode, sat) for v in x.tolist()], dtype=np.float32)
    assert_same_bits(cpd.cast(x, fmt, mode, saturate=sat), want, x.numpy(), f"{fmt.name} {mode} {sat}")
    ok = ~np.isnan(want)
    codes = cpd.encode(x[torch.from_numpy(ok)], fmt, mode, saturate=sat).to(torch.int64) & ((1 << fmt.bits) - 1)
    assert codes.tolist() == [oracle.oracle_code(float(v), fmt) for v in want[ok]]


def _wide_pool(fmt, rng) -> np.ndarray:
    """Float32 inputs of a 9-16 bit format: codes' values, midpoints between neighbours and one
    float32 ulp either side, values below 2^emin, beyond the largest finite value, of both signs."""
    k = 1 << (fmt.bits - (1 if fmt.signed else 0))
    c = np.unique(rng.integers(0, k - 1, size=150))
    lo = cpd.decode(torch.from_numpy(c), fmt).numpy()
    hi = cpd.decode(torch.from_numpy(c + 1), fmt).numpy()
    ok = np.isfinite(lo) & np.isfinite(hi)
    mid = ((lo[ok].astype(np.float64) + hi[ok]) / 2).astype(np.float32)
    tiny = (rng.random(40) * fmt.smallest_normal).astype(np.float32)
    big = np.minimum(fmt.max * np.array([1.0, 1.0 + 2.0 ** -(fmt.man + 1), 1.5, 4.0]),
                     float(np.finfo(np.float32).max)).astype(np.float32)  # float32's max where beyond it
    pool = np.concatenate([lo[np.isfinite(lo)], mid, np.nextafter(mid, np.float32(np.inf)),
                           np.nextafter(mid, np.float32(-np.inf)), tiny, big]).astype(np.float32)
    pool = np.unique(pool[np.isfinite(pool)])
    return np.concatenate([pool, -pool]) if fmt.signed else pool


WIDE_SPAN_FORMATS = [cpd.FP16, cpd.BF16, FloatFormat(6, 9), FloatFormat(5, 10, specials="fn"),
                     FloatFormat(5, 9, specials="finite"), FloatFormat(1, 14)]


@pytest.mark.parametrize("fmt", WIDE_SPAN_FORMATS, ids=str)
def test_wide_encode_spans_with_small_and_special_values(fmt):
    """encode of 9-16 bit codes works on spans of 1024 elements: a span of finite values reads
    each code off the rounding (region S's steps only where an element lies below 2^emin), one
    with an inf or NaN casts and then encodes. Inputs with the oracle's codes, laid out so that
    a small value, an inf and a NaN sit at a span's first and last element and inside it, next
    to spans with none; IEEE e1m14 (largest finite value subnormal) takes the cast-then-encode
    steps throughout."""
    rng = np.random.default_rng(fmt.bits * 100 + fmt.man)
    pool = _wide_pool(fmt, rng)
    small = np.flatnonzero(np.abs(pool) < fmt.smallest_normal)
    normal = np.flatnonzero(np.abs(pool) >= fmt.smallest_normal)
    specials = [math.inf, -math.inf] + ([math.nan] if fmt.has_nan else [])
    xs = np.concatenate([pool, np.array(specials, dtype=np.float32)])
    inf, nan = len(pool), len(pool) + (2 if fmt.has_nan else 1)
    a = rng.choice(normal, size=3 * 1024 + 345)
    a[3072 + 45:] = rng.choice(small, size=300)
    a[1023] = rng.choice(small)          # span 0: a small value, its last element
    a[1024] = inf                        # span 1: an inf, its first element
    a[2048 + 500] = nan                  # span 2: a NaN (an inf without NaNs) inside it
    a[3072 + 344] = nan                  # the last span: a NaN, its last element
    b = rng.choice(normal, size=1024 + 77)  # finite values above 2^emin only
    x_all = torch.from_numpy(xs)
    for mode in oracle.DET_MODES:
        for sat in (False, True):
            want_vals = np.array([oracle.oracle_cast(float(v), fmt, mode, sat) for v in xs], dtype=np.float32)
            codes = np.array([oracle.oracle_code(float(v), fmt) for v in want_vals])
            for idx in (a, b):
                got = cpd.encode(x_all[idx], fmt, mode, saturate=sat).to(torch.int64) & ((1 << fmt.bits) - 1)
                assert_same_codes(got, torch.from_numpy(codes[idx]), torch.from_numpy(np.isnan(want_vals[idx])), fmt,
                                  xs[idx], f"encode {fmt.name} {mode} saturate={sat}, n={len(idx)}")
