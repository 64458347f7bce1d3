"""Casts to any format (exp 1..8, man 0..23, any specials, any valid bias) are exactly right.

Invariants defended, by hypothesis over formats and float32 bit patterns (raw patterns, plus
values at, between and next to the format's codes, where the rounding decisions are):
* every deterministic mode, with saturate on and off, equals the exact oracle bit for bit;
* the result is one of the two neighbours of x (stochastic rounding included), and a value of
  the format comes back unchanged (idempotence);
* nearest / toward_zero / up / down are monotone: sorted inputs give sorted outputs;
* nearest and toward_zero are sign-symmetric, and up(-x) = -down(x).
"""

import math

import numpy as np
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import cpd
import oracle
from formats_grid import SPECIALS

F32_MAX_BITS = 0x7F7FFFFF


@st.composite
def formats(draw):
    exp = draw(st.integers(1, 8))
    man = draw(st.integers(0, 23))
    specials = draw(st.sampled_from(SPECIALS))
    lo, hi = oracle.bias_range(exp, man, specials)
    assume(lo <= hi)
    default = (1 << (exp - 1)) - 1
    choices = [st.integers(lo, hi), st.sampled_from([lo, hi])]
    if lo <= default <= hi:
        choices.insert(0, st.just(default))
    bias = draw(st.one_of(*choices))
    subnormals = draw(st.sampled_from([True, True, True, False]))
    try:
        return cpd.FloatFormat(exp, man, bias=bias, specials=specials, subnormals=subnormals)
    except ValueError:
        assume(False)


def _to_f32_bits(v) -> int:
    """Float32 bits of a non-negative Fraction/float (round to nearest; beyond float32: max)."""
    with np.errstate(over="ignore"):
        f = np.float32(float(v))
    if math.isinf(f):
        return F32_MAX_BITS
    return int(np.array(f).view(np.uint32))


def near_grid(fmt):
    """Bit patterns at, between and next to the format's codes (within a few float32 ulps)."""
    k = oracle.key(fmt)
    top = oracle.max_code(fmt) + 1  # one past max: the overflow boundary

    @st.composite
    def strat(draw):
        c = draw(st.one_of(st.integers(0, top), st.sampled_from([0, 1, 2, top - 1, top])))
        v = oracle._value(k, c)
        if draw(st.booleans()) and c < top:
            v = (v + oracle._value(k, c + 1)) / 2
        b = _to_f32_bits(v) + draw(st.sampled_from([0, 0, 0, 1, -1, 2, -2]))
        b = min(max(b, 0), 0x7F800000)
        return b | (draw(st.booleans()) << 31)

    return strat()


def inputs(fmt, max_size=48):
    specials = st.sampled_from([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x00000000, 0x80000000,
                                0x00000001, 0x807FFFFF, 0x00800000, F32_MAX_BITS, 0xFF7FFFFF])
    word = st.one_of(st.integers(0, 2**32 - 1), near_grid(fmt), near_grid(fmt), specials)
    return st.lists(word, min_size=1, max_size=max_size)


def as_tensor(words) -> torch.Tensor:
    return torch.tensor(np.array(words, dtype=np.uint32).view(np.int32)).view(torch.float32)


@st.composite
def format_and_inputs(draw, max_size=48):
    fmt = draw(formats())
    return fmt, as_tensor(draw(inputs(fmt, max_size)))


def same(a: float, b: float) -> bool:
    return oracle.same_f32(a, b)


@given(format_and_inputs())
def test_matches_oracle(case):
    fmt, x = case
    xs = x.tolist()
    normal = ~(x.abs() < fmt.smallest_normal)  # also cast alone: fast paths may special-case such blocks
    for mode in oracle.DET_MODES:
        for sat in (False, True):
            got = cpd.cast(x, fmt, mode, saturate=sat).tolist()
            for xi, gi in zip(xs, got):
                want = oracle.oracle_cast(xi, fmt, mode, sat)
                assert same(gi, want), (fmt.name, mode, sat, xi, oracle.f32_bits(xi), want, gi)
            got_n = cpd.cast(x[normal], fmt, mode, saturate=sat)
            want_n = cpd.cast(x, fmt, mode, saturate=sat)[normal]
            assert torch.equal(torch.isnan(got_n), torch.isnan(want_n))
            assert torch.equal(got_n[~torch.isnan(got_n)].view(torch.int32),
                               want_n[~torch.isnan(want_n)].view(torch.int32))


@given(format_and_inputs(), st.sampled_from(oracle.MODES), st.booleans())
def test_result_is_a_neighbour_and_idempotent(case, mode, sat):
    fmt, x = case
    y = cpd.cast(x, fmt, mode, saturate=sat)
    for xi, yi in zip(x.tolist(), y.tolist()):
        lo, hi, p = oracle.oracle_neighbours(xi, fmt, sat)
        assert same(yi, lo) or (p > 0 and same(yi, hi)), (fmt.name, mode, xi, lo, hi, p, yi)
    for mode2 in oracle.MODES:
        z = cpd.cast(y, fmt, mode2, saturate=sat)
        assert torch.equal(torch.isnan(z), torch.isnan(y))
        ok = torch.isnan(y) | (z.view(torch.int32) == y.view(torch.int32))
        assert bool(ok.all()), (fmt.name, mode, mode2)


@given(format_and_inputs(max_size=64), st.sampled_from(oracle.DET_MODES), st.booleans())
def test_monotone(case, mode, sat):
    fmt, x = case
    x = x[~torch.isnan(x)]
    xs, _ = torch.sort(x)
    y = cpd.cast(xs, fmt, mode, saturate=sat)
    y = y[~torch.isnan(y)]  # fn formats overflow to NaN
    assert bool((y[1:] >= y[:-1]).all()), (fmt.name, mode, xs.tolist(), y.tolist())


@given(format_and_inputs(), st.booleans())
def test_sign_symmetry(case, sat):
    fmt, x = case
    neg = (x.view(torch.int32) ^ torch.tensor(-(2**31), dtype=torch.int32)).view(torch.float32)

    def assert_negated(a, b):
        bits = a.view(torch.int32) ^ torch.tensor(-(2**31), dtype=torch.int32)
        ok = (bits == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))
        assert bool(ok.all()), fmt.name

    for mode in ("nearest", "toward_zero"):
        assert_negated(cpd.cast(x, fmt, mode, saturate=sat), cpd.cast(neg, fmt, mode, saturate=sat))
    assert_negated(cpd.cast(x, fmt, "up", saturate=sat), cpd.cast(neg, fmt, "down", saturate=sat))


@given(formats())
def test_format_edges(fmt):
    """max, the overflow midpoint and the smallest values, per mode, for any format."""
    mx = oracle.max_value(fmt)
    beyond = oracle._value(oracle.key(fmt), oracle.max_code(fmt) + 1)
    words = [_to_f32_bits(v) + d for v in (mx, (mx + beyond) / 2, oracle.mag_value(fmt, 1),
                                            oracle.mag_value(fmt, 1) / 2, oracle.smallest_normal(fmt))
             for d in (-1, 0, 1)]
    words = [min(max(w, 0), 0x7F800000) for w in words]
    x = as_tensor(words + [w | 0x80000000 for w in words])
    xs = x.tolist()
    for mode in oracle.DET_MODES:
        for sat in (False, True):
            got = cpd.cast(x, fmt, mode, saturate=sat).tolist()
            for xi, gi in zip(xs, got):
                assert same(gi, oracle.oracle_cast(xi, fmt, mode, sat)), (fmt.name, mode, sat, xi, gi)
