"""Every format of at most 8 bits is cast exactly right, bit for bit (docs/design.md §3, §5).

Invariant defended: for every such format (all exp/man splits, all three specials conventions,
flush-to-zero variants, custom biases at both ends of float32's range), every deterministic
rounding mode and saturate on/off, ``cpd.cast`` equals the independent exact oracle
(tests/oracle.py) on every code's value, every midpoint between neighbouring values, each
midpoint ± 1 float32 ulp, values beyond max (max + ulp/2 and ± 1 ulp, 2*max, float32 max, inf),
NaN, ±0 and float32 subnormals, of both signs. ``cpd.encode`` gives the oracle's codes for the
same inputs, and encode/decode round-trip over every code.

The cpd calls are vectorized (one tensor per format) and the oracle is computed once per input,
so the file runs in seconds.
"""

import functools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import cpd
import oracle
from formats_grid import fid, small_formats

FORMATS = small_formats()
F32_MAX = float(np.finfo(np.float32).max)


def _nextafter32(v: float, toward: float) -> float:
    return float(np.nextafter(np.float32(v), np.float32(toward)))


def grid_inputs(fmt) -> list[float]:
    """The test inputs of a format (positive and negative), each a float32 value as a Python float."""
    k = oracle.key(fmt)
    vals = oracle.positive_values(fmt)
    beyond = oracle._value(k, oracle.max_code(fmt) + 1)  # the first value past max (unbounded exponent)
    grid = vals + [beyond]
    xs = set()
    for v in vals:
        xs.add(float(v))
    for a, b in zip(grid, grid[1:]):
        m = float((a + b) / 2)  # exact in double: at most man + 2 significant bits
        m32 = oracle.f32(m)
        for v in (m32, _nextafter32(m32, math.inf), _nextafter32(m32, -math.inf)):
            xs.add(v)
    mx = float(vals[-1])
    xs.update([
        oracle.f32(min(float(beyond), F32_MAX)), oracle.f32(min(2 * mx, F32_MAX)), F32_MAX,
        _nextafter32(mx, math.inf), _nextafter32(mx, -math.inf), math.inf,
        # float32 subnormals and the normal boundary
        2.0 ** -149, 3 * 2.0 ** -149, 2.0 ** -148, 2.0 ** -127, 2.0 ** -126 - 2.0 ** -149, 2.0 ** -126,
        0.7 * 2.0 ** -140, 1.0, 1.5, 0.1, 1 / 3,
    ])
    xs = {oracle.f32(x) for x in xs if not math.isnan(x)}
    xs.discard(0.0)
    out = sorted(xs)
    out = out + [-x for x in out] + [0.0, -0.0, math.nan, -math.nan]
    return out


@functools.lru_cache(maxsize=None)
def expected(fmt):
    """(inputs, {(mode, saturate): expected results}) as float32 numpy arrays."""
    xs = grid_inputs(fmt)
    exp = {}
    for mode in oracle.DET_MODES:
        for sat in (False, True):
            exp[mode, sat] = np.array([oracle.oracle_cast(x, fmt, mode, sat) for x in xs], dtype=np.float32)
    return np.array(xs, dtype=np.float32), exp


def assert_same_bits(actual: torch.Tensor, want: np.ndarray, xs: np.ndarray, what: str):
    """Bitwise equality of float32 tensors, NaN compared as NaN; reports the first mismatches."""
    want_t = torch.from_numpy(want)
    a, w = actual.contiguous().view(torch.int32), want_t.view(torch.int32)
    ok = (a == w) | (torch.isnan(actual) & torch.isnan(want_t))
    if not bool(ok.all()):
        bad = (~ok).nonzero().flatten()[:10].tolist()
        lines = [f"  x={float(xs[i])!r} ({oracle.f32_bits(float(xs[i])):#010x}): want {float(want[i])!r}, "
                 f"got {float(actual.flatten()[i])!r}" for i in bad]
        pytest.fail(f"{what}: {int((~ok).sum())} of {ok.numel()} differ\n" + "\n".join(lines))


@functools.lru_cache(maxsize=None)
def expected_codes(fmt):
    """{(mode, saturate): the oracle's code of each grid input's expected result} (int64 numpy;
    -1 for a NaN result of a format without a NaN code: its NaN inputs, which encode refuses)."""
    xs, exp = expected(fmt)
    return {k: np.array([oracle.oracle_code(float(v), fmt) if not (np.isnan(v) and not fmt.has_nan) else -1
                         for v in vals], dtype=np.int64) for k, vals in exp.items()}


def assert_same_codes(got: torch.Tensor, want: torch.Tensor, nan: torch.Tensor, fmt, xs, what: str):
    """Integer codes (int64) equal to the oracle's; where the result is NaN (``nan``) any NaN code
    of the format is acceptable, the canonical one expected up to the sign bit (see
    test_encode_nan_sign). Reports the first mismatches with their inputs ``xs``."""
    got = torch.where(nan, got & ((1 << (fmt.exp + fmt.man)) - 1), got)
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten()[:10].tolist()
        pytest.fail(f"{what}:\n" + "\n".join(
            f"  [{i}] x={float(xs[i])!r}: want code {int(want[i]):#x}, got {int(got[i]):#x}" for i in bad))


@pytest.mark.parametrize("fmt", FORMATS, ids=fid)
def test_cast_every_code_midpoint_and_edge(fmt):
    xs, exp = expected(fmt)
    x = torch.from_numpy(xs)
    x_before = x.clone()
    # Fast paths may treat a block with no element below the smallest normal differently from a
    # mixed block, so the elements at or above it are also cast on their own.
    normal = ~(np.abs(xs) < fmt.smallest_normal)
    for (mode, sat), want in exp.items():
        got = cpd.cast(x, fmt, mode, saturate=sat)
        assert got.dtype == torch.float32 and got.shape == x.shape
        assert_same_bits(got, want, xs, f"cast {fmt.name} {mode} saturate={sat}")
        got = cpd.cast(x[torch.from_numpy(normal)], fmt, mode, saturate=sat)
        assert_same_bits(got, want[normal], xs[normal], f"cast {fmt.name} {mode} saturate={sat} (normal block)")
    assert torch.equal(x.view(torch.int32), x_before.view(torch.int32)), "input modified"


@pytest.mark.parametrize("fmt", FORMATS, ids=fid)
def test_encode_gives_oracle_codes(fmt):
    xs, exp = expected(fmt)
    keep = ~np.isnan(xs) if not fmt.has_nan else np.ones(len(xs), dtype=bool)
    xs = xs[keep]
    x = torch.from_numpy(xs)
    for (mode, sat), want_vals in exp.items():
        want = torch.from_numpy(expected_codes(fmt)[mode, sat][keep])
        codes = cpd.encode(x, fmt, mode, saturate=sat)
        assert codes.dtype == torch.uint8
        nan = torch.from_numpy(np.isnan(want_vals[keep]))
        assert_same_codes(codes.to(torch.int64), want, nan, fmt, xs, f"encode {fmt.name} {mode} saturate={sat}")
        # encoding the rounded values gives the same codes
        assert torch.equal(cpd.encode(cpd.cast(x, fmt, mode, saturate=sat), fmt).to(torch.int64) &
                           torch.where(nan, (1 << (fmt.exp + fmt.man)) - 1, -1), want)


@pytest.mark.parametrize("fmt", FORMATS, ids=fid)
def test_encode_spans_blocks_and_tails(fmt):
    """encode works on spans of 1024 elements (those with an element below 2^emin take region
    S's steps, the others not) and, for 8-bit codes to nearest with AVX2, 32 elements per step
    with the span's last m % 32 one by one; a span holding an inf or NaN is encoded again by the
    exact loop. Grid inputs with known oracle codes are laid out so that a small value, an inf
    and a NaN land at the first and last element of a span, inside a 32-element block and in a
    span's tail, next to spans with none."""
    xs, exp = expected(fmt)
    codes = expected_codes(fmt)
    finite = np.isfinite(xs)
    small = finite & (np.abs(xs) < fmt.smallest_normal)
    normal, small = np.flatnonzero(finite & ~small), np.flatnonzero(small)
    inf = np.flatnonzero(np.isinf(xs))
    nan = np.flatnonzero(np.isnan(xs)) if fmt.has_nan else inf
    rng = np.random.default_rng(1000 * fmt.exp + fmt.man)
    a = rng.choice(normal, size=4 * 1024 + 345)
    a[4096 + 45:] = rng.choice(small, size=300)  # the last span: mostly small values
    a[1024 + 1023] = rng.choice(small)           # span 1: one small value, its last element
    a[2048] = rng.choice(small)                   # span 2: one small value, its first element
    a[2048 + 32 * 3 + 5] = rng.choice(inf)        # span 2: an inf inside a block
    a[3072 + 1000] = rng.choice(nan)              # span 3: a NaN in its last whole block
    a[4096 + 330] = rng.choice(nan)               # span 4 (345 elements): a NaN in the tail
    b = rng.choice(normal, size=1024 + 45)
    b[1024 + 40] = rng.choice(inf)                # normal values only, an inf in the last tail
    c = rng.choice(normal, size=1024 + 31)        # none: every span on its fast steps
    for idx in (a, b, c):
        x = torch.from_numpy(xs[idx])
        nan_in = torch.from_numpy(np.isnan(xs[idx]))
        for (mode, sat), want_vals in exp.items():
            want = torch.from_numpy(codes[mode, sat][idx])
            got = cpd.encode(x, fmt, mode, saturate=sat).to(torch.int64)
            nan_out = torch.from_numpy(np.isnan(want_vals[idx]))
            assert_same_codes(got, want, nan_out, fmt, x, f"encode {fmt.name} {mode} saturate={sat}, n={len(idx)}")
        assert not bool(nan_in.any()) or fmt.has_nan


@pytest.mark.parametrize("fmt", FORMATS, ids=fid)
def test_decode_every_code_and_round_trip(fmt):
    n = 1 << fmt.bits
    codes = torch.arange(n, dtype=torch.int64).to(torch.uint8)
    want = np.array([oracle.code_value(fmt, c) for c in range(n)], dtype=np.float32)
    dec = cpd.decode(codes, fmt)
    assert dec.dtype == torch.float32
    assert_same_bits(dec, want, np.arange(n, dtype=np.float32), f"decode {fmt.name}")
    # encode(decode(c)) == c for every code that is not NaN; NaN codes encode to the canonical NaN.
    # Without subnormals, a subnormal code still decodes to its value, but encoding (which
    # rounds first) flushes it to the zero of its sign.
    re = cpd.encode(dec, fmt).to(torch.int64)
    is_nan = torch.isnan(dec)
    want_codes = codes.to(torch.int64)
    if not fmt.subnormals:
        sub = ((want_codes >> fmt.man) & ((1 << fmt.exp) - 1) == 0)
        want_codes = torch.where(sub, want_codes & (1 << (fmt.exp + fmt.man)), want_codes)
    assert torch.equal(re[~is_nan], want_codes[~is_nan])
    if fmt.has_nan:
        mag = re[is_nan] & ((1 << (fmt.exp + fmt.man)) - 1)
        assert bool((mag == oracle.nan_code(fmt)).all())
    redec = cpd.decode(cpd.encode(dec, fmt), fmt)
    assert torch.equal(redec.view(torch.int32)[~is_nan], cpd.cast(dec, fmt).view(torch.int32)[~is_nan])
    assert bool(torch.isnan(cpd.decode(cpd.encode(dec, fmt), fmt))[is_nan].all())
    # -0 is the sign bit alone
    neg_zero = 1 << (fmt.exp + fmt.man)
    assert oracle.f32_bits(float(dec[neg_zero])) == 0x80000000
    assert int(cpd.encode(torch.tensor([-0.0]), fmt)) == neg_zero
    assert int(cpd.encode(torch.tensor([0.0]), fmt)) == 0


@pytest.mark.parametrize("fmt", FORMATS, ids=fid)
def test_every_value_is_a_fixed_point(fmt):
    """A value of the format is returned unchanged by every mode (and stochastic rounding)."""
    vals = torch.tensor([float(v) for v in oracle.positive_values(fmt)], dtype=torch.float32)
    if not fmt.subnormals:
        vals = vals[(vals == 0) | (vals >= fmt.smallest_normal)]
    x = torch.cat([vals, -vals])
    for mode in oracle.MODES:
        got = cpd.cast(x, fmt, mode)
        assert torch.equal(got.view(torch.int32), x.view(torch.int32)), mode


# ------------------------------------------------------------------------------ named regressions
def test_65000_overflows_to_inf_in_e5m2():
    """Earlier libraries returned 57344: 65000 is past max + ulp/2 = 61440, so it overflows."""
    f = cpd.FloatFormat(5, 2)
    assert oracle.oracle_cast(65000.0, f) == math.inf
    assert cpd.cast(torch.tensor([65000.0, -65000.0]), f).tolist() == [math.inf, -math.inf]
    assert cpd.cast(torch.tensor([65000.0]), f, saturate=True).item() == 57344.0
    assert cpd.cast(torch.tensor([61439.99]), f).item() == 57344.0


def test_no_double_rounding_below_the_smallest_subnormal_e5m2():
    """Earlier libraries gave 0: 2^-17 (1 + 2^-23) is just above half the smallest subnormal
    2^-16 of e5m2, so it rounds up to 2^-16; the sticky bit below the subnormal boundary counts."""
    f = cpd.FloatFormat(5, 2)
    x = 2.0 ** -17 * (1 + 2.0 ** -23)
    assert oracle.f32(x) == x
    assert oracle.oracle_cast(x, f) == 2.0 ** -16
    assert cpd.cast(torch.tensor([x, -x]), f).tolist() == [2.0 ** -16, -(2.0 ** -16)]
    # the exact half is a tie to the even code: zero
    assert cpd.cast(torch.tensor([2.0 ** -17]), f).item() == 0.0


def test_e4m3fn_ties_at_max_go_to_max():
    """464 = 448 + ulp/2: e4m3fn's max code 0x7E is even, so the tie stays at 448; anything above
    overflows to NaN (or 448 with saturate)."""
    f = cpd.E4M3FN
    got = cpd.cast(torch.tensor([464.0, 464.03125, -464.0, 1e10]), f)
    assert got[0].item() == 448.0 and got[2].item() == -448.0
    assert math.isnan(got[1].item()) and math.isnan(got[3].item())
    assert cpd.cast(torch.tensor([464.03125]), f, saturate=True).item() == 448.0


def test_man0_tie_at_max_goes_to_the_even_encoding():
    """man = 0: e3m0 ieee has max 8 (field 6, even); the tie 12 = 8 + ulp/2 stays at 8, and the
    tie 6 between 4 (field 5) and 8 (field 6) goes to 8, the tie 3 between 2 (field 4) and 4 to 2."""
    f = cpd.FloatFormat(3, 0)
    assert f.max == 8.0
    assert cpd.cast(torch.tensor([12.0, 12.000001, 6.0, 3.0]), f).tolist() == [8.0, math.inf, 8.0, 2.0]


def test_directed_rounding_never_overflows_inward():
    f = cpd.E5M2
    x = torch.tensor([1e6, -1e6, math.inf, -math.inf])
    assert cpd.cast(x, f, "toward_zero").tolist() == [57344.0, -57344.0, math.inf, -math.inf]
    assert cpd.cast(x, f, "up").tolist() == [math.inf, -57344.0, math.inf, -math.inf]
    assert cpd.cast(x, f, "down").tolist() == [57344.0, -math.inf, math.inf, -math.inf]
    assert cpd.cast(x, f, "up", saturate=True).tolist() == [57344.0, -57344.0, 57344.0, -57344.0]


def test_oracle_sanity():
    """The oracle itself, on a few hand-checked cases (so that a wrong oracle cannot hide a bug)."""
    e5m2, e2m1 = cpd.FloatFormat(5, 2), cpd.E2M1
    assert oracle.positive_values(e2m1) == [Fraction(v) for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]
    assert [oracle.oracle_cast(v, e2m1) for v in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0)] == \
        [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0]
    assert [oracle.oracle_cast(v, e5m2, m) for m in oracle.DET_MODES for v in (0.3, -0.3)] == \
        [0.3125, -0.3125, 0.25, -0.25, 0.3125, -0.25, 0.25, -0.3125, 0.3125, -0.3125, 0.3125, -0.3125]
    assert [oracle.oracle_cast(0.28125, e5m2, m) for m in ("nearest", "nearest_away", "odd")] == [0.25, 0.3125, 0.3125]
    assert oracle.oracle_cast(0.25, e5m2, "odd") == 0.25 and oracle.oracle_cast(1e6, e5m2, "odd") == 57344.0
    assert math.isnan(oracle.oracle_cast(1e9, cpd.E4M3FN))
    assert oracle.oracle_cast(1e9, cpd.E4M3FN, "toward_zero") == 448.0
    assert oracle.oracle_cast(math.inf, cpd.E4M3FN, "toward_zero", saturate=True) == 448.0
    assert oracle.oracle_cast(-math.inf, e2m1) == -6.0
    nosub = cpd.FloatFormat(5, 2, subnormals=False)
    assert oracle.f32_bits(oracle.oracle_cast(-2.0 ** -15, nosub)) == 0x80000000
    assert oracle.oracle_cast(2.0 ** -14 * 0.875, nosub) == 2.0 ** -14  # rounds up to the normal
