"""Stochastic matmul on float32 lanes (cuda/cpu/matmul_sr.h sr32_tile; issue 29, item 2).

Invariants defended:
* formats of at most 11 significant bits with a signed classic convention (``cpd::sr_lane_applies``)
  take the float32 lanes (``matmul_lanes`` reports 33), the rest keep the float64 lanes or the
  generic loop;
* the float32 lanes give the generic loop's bits (``path=1``: dot_step on float32 bits, itself
  checked against exact rationals in tests/test_matmul.py) and the float64 lanes' (``path=2``), bit
  for bit: every binade of inputs, subnormal sums, overflow with and without saturation, signed
  zeros, NaN and infinite operands, ragged shapes (K = 1, N not a multiple of the tile), several
  seeds and ``sr_bits`` (32, 23, 8, 1), plain, Kahan and blocked;
* the same for any float32 operands (hypothesis);
* lanes built to sit in the redo window (``cpd::sr_lane``: the exact value's decision differs from
  its float32 rounding's; a hair below a power of two; dropped part a hair above 0 or below it)
  give the exact oracle's result (tests/test_matmul.py ``ref_matmul``: exact rationals and the
  documented random words).
"""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cpd
from cpd import _cpu
from oracle import f32, oracle_round_neighbours
from test_matmul import bits_equal, ref_matmul

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")

SR = cpd.Rounding("stochastic").code
F510, F67 = cpd.FloatFormat(5, 10), cpd.FloatFormat(6, 7)
SR32 = 33  # matmul.cpp LANES_SR32

# (mul, acc) pairs the float32 lanes take: the benchmark's three first
ROUTED = [
    (None, cpd.FP16), (cpd.E4M3, cpd.BF16), (cpd.E5M2, F510),
    (None, cpd.BF16), (None, cpd.TF32), (cpd.E5M2, F67), (cpd.E4M3FN, cpd.FP16), (cpd.E2M1, cpd.FloatFormat(4, 3)),
    (cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(5, 6, subnormals=False)),
    (cpd.FloatFormat(4, 3, specials="finite"), cpd.FloatFormat(6, 4, specials="fn")),
]


def _ext(a, b, mul, acc, kahan=False, block=0, path=0, seed=(5, -6), sr_bits=32, saturate=False):
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
    _cpu.extension().matmul_out(a, b, out, mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc),
                                kahan, block, SR, saturate, sr_bits, seed[0], seed[1], path)
    return out


def _lanes(mul, acc, mode=SR):
    return _cpu.extension().matmul_lanes(mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc),
                                         mode, False)


def _mismatch(x, y):
    bad = (x.view(torch.int32) != y.view(torch.int32)).nonzero()[:5].tolist()
    return "; ".join(f"{i}: {x[tuple(i)].item()!r} != {y[tuple(i)].item()!r}" for i in bad)


def _agree(a, b, mul, acc, **kw):
    gen = _ext(a, b, mul, acc, path=1, **kw)
    for path in (0, 2):
        got = _ext(a, b, mul, acc, path=path, **kw)
        assert bits_equal(got, gen), (path, kw, _mismatch(got, gen))
    return gen


def test_routing():
    for mul, acc in ROUTED:
        assert _lanes(mul, acc) == SR32, (mul, acc)
        assert _lanes(mul, acc, cpd.Rounding("nearest").code) != SR32
    # more than 11 bits, or conventions without a signed zero of each sign: float64 lanes
    for mul, acc in [(None, cpd.FloatFormat(5, 11)), (cpd.FloatFormat(5, 12), cpd.FP16), (None, cpd.E4M3FNUZ),
                     (cpd.E4M3FNUZ, cpd.BF16)]:
        assert _lanes(mul, acc) == 64, (mul, acc)
    assert _lanes(None, cpd.FP32) == 0  # 23 bits: the generic loop


def _binades(g, shape, lo, hi):
    """Random values whose exponents spread evenly over [lo, hi), both signs."""
    e = torch.randint(lo, hi, shape, generator=g).to(torch.float32)
    return torch.randn(shape, generator=g) * torch.exp2(e)


@pytest.mark.parametrize("mul,acc", ROUTED, ids=[f"{m and m.name}x{a.name}" for m, a in ROUTED])
def test_equals_generic_and_float64_lanes(mul, acc):
    g = torch.Generator().manual_seed(29)
    lo, hi = acc.emin - acc.man - 4, acc.emax + 2
    if mul is not None:
        lo, hi = max(lo, mul.emin - mul.man - 4), min(hi, mul.emax + 2)
    half_lo, half_hi = (lo - 1) // 2, (hi + 1) // 2  # products over every binade of the formats
    a = _binades(g, (2, 3, 37), half_lo, half_hi)
    b = _binades(g, (2, 37, 67), half_lo, half_hi)
    a[0, 0, :6] = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, -0.0])
    b[1, 3:7, 5] = torch.tensor([-0.0, 0.0, -0.0, math.inf])
    a[1, 2, :] = -0.0  # a row of signed zeros: every sum an exact zero
    cases = [dict(), dict(kahan=True), dict(block=5), dict(kahan=True, block=5), dict(sr_bits=23, seed=(1, 2)),
             dict(sr_bits=8, kahan=True, seed=(-7, 3)), dict(sr_bits=1, block=4), dict(saturate=True)]
    for kw in cases:
        _agree(a, b, mul, acc, **kw)
    # K = 1 and a narrow N; sums of tiny values (the format's subnormals)
    for K, N in ((1, 67), (3, 5)):
        a1 = _binades(g, (1, 4, K), lo // 2, hi // 2)
        b1 = _binades(g, (1, K, N), lo // 2, hi // 2)
        for kw in (dict(), dict(kahan=True), dict(block=2, sr_bits=8)):
            _agree(a1, b1, mul, acc, **kw)
    tiny = float(2.0 ** (acc.emin - 2))
    a2 = torch.randn(1, 3, 40, generator=g) * tiny
    b2 = torch.randn(1, 40, 70, generator=g)
    for kw in (dict(), dict(kahan=True, sr_bits=23), dict(block=3)):
        _agree(a2, b2, mul, acc, **kw)


@pytest.mark.parametrize("mul,acc", [(None, cpd.FP16), (cpd.E4M3FN, cpd.FP16), (cpd.E5M2, F510)])
def test_overflow_and_nan_payloads(mul, acc):
    g = torch.Generator().manual_seed(3)
    big = float(acc.max) ** 0.5
    a = torch.randn(1, 3, 30, generator=g) * big
    b = torch.randn(1, 30, 65, generator=g) * 4
    a[0, 1, 3] = torch.tensor(0x7FC01234, dtype=torch.int32).view(torch.float32)  # a NaN with a payload
    b[0, 7, 9] = torch.tensor(-0x0003ABCD, dtype=torch.int32).view(torch.float32)  # and a negative one
    for kw in (dict(), dict(saturate=True), dict(kahan=True), dict(kahan=True, block=7, saturate=True)):
        out = _agree(a, b, mul, acc, **kw)
        assert not kw.get("saturate") or out[~torch.isnan(out)].abs().max() <= float(acc.max)


_F32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@settings(max_examples=60)
@given(st.sampled_from(ROUTED), st.lists(_F32, min_size=6, max_size=6), st.lists(_F32, min_size=6, max_size=6),
       st.integers(-(2**63), 2**63 - 1), st.sampled_from([32, 23, 8, 1]), st.booleans(), st.sampled_from([0, 2]))
def test_hypothesis_values(pair, av, bv, seed, sr_bits, kahan, block):
    """Any float32 operands (every binade, subnormals, zeros, inf, NaN), a 2 x 3 by 3 x 2 product."""
    mul, acc = pair
    a = torch.tensor(av, dtype=torch.float32).reshape(1, 2, 3)
    b = torch.tensor(bv, dtype=torch.float32).reshape(1, 3, 2)
    _agree(a, b, mul, acc, kahan=kahan, block=block, seed=(seed, seed // 3), sr_bits=sr_bits)


# ------------------------------------------------------------------------------------ the window
def _sr(q: Fraction, fmt, w: int) -> float:
    """The exact stochastic rounding of q != 0 with word w (sr_bits = 32): tests/test_matmul.py Ref.rnd."""
    toward, away, p = oracle_round_neighbours(q, fmt)
    return away if math.floor(p * 2**32) + w >= 2**32 else toward


def _words(n, j, seed, K=1):
    """Word j of step 0 of outputs 0..n-1 (K steps each)."""
    return [int(cpd.ops.random_words((o * K) * 8 + j, 1, seed[0], seed[1])) for o in range(n)]


def _window_b(a0: float, fmt, w: int):
    """A float32 b with SR(a0 * b) != SR(fl32(a0 * b)) for word w, or None: the float32 lane's own
    decision is wrong there, and only the redo gives the exact one. Aims a0 * b at the decision's
    edge (frac(v / U) = 1 - w / 2^32, moved by up to 2^-14 of a quantum) in cell after cell until a
    product lands between the edge and its float32 rounding (which, for a word near the middle of
    two float32 steps, takes long: then None)."""
    a = Fraction(a0)
    u = Fraction(2) ** (-fmt.man)  # the quantum in [1, 2)
    for r in range(min(1 << fmt.man, 24)):
        for d in range(-3, 4):
            v = 1 + r * u + Fraction(2**32 - w + d * 2**16, 2**32) * u
            b = f32(float(v / a))
            q = a * Fraction(b)
            if _sr(q, fmt, w) != _sr(Fraction(f32(float(q))), fmt, w):
                return b
    return None


@pytest.mark.parametrize("mul,acc", [(None, cpd.FP16), (None, cpd.BF16), (cpd.E4M3, cpd.BF16), (cpd.E5M2, F510)])
def test_window_lanes_take_the_exact_decision(mul, acc):
    seed = (11, 4)
    n = 70  # two tiles, the second ragged
    a0 = f32(math.pi / 2)  # a * b has up to 48 bits, its float32 rounding error varies with b
    words = _words(n, 0 if mul is not None else 1, seed)
    a = torch.tensor([[[a0]]])
    bs = [_window_b(a0, mul or acc, w) for w in words]
    assert sum(b is not None for b in bs) >= n * 3 // 4  # most lanes built to need the redo
    b = torch.tensor([[[1.25 if b is None else b for b in bs]]])
    want = ref_matmul(a, b, mul, acc, mode="stochastic", seed_offset=seed)
    got = _ext(a, b, mul, acc, seed=seed)
    assert bits_equal(got, want), _mismatch(got, want)
    assert bits_equal(_ext(a, b, mul, acc, seed=seed, path=1), want)


@pytest.mark.parametrize("mul,acc", [(None, cpd.FP16), (None, cpd.BF16), (cpd.E4M3, cpd.BF16), (cpd.E5M2, F510)])
def test_edges_against_the_exact_oracle(mul, acc):
    """Exact values a hair below a power of two (fl32 rounds them up onto it: the binade below has half
    the quantum), and a hair above or below a point of the grid (dropped part near 0: a borrow when
    below), over the formats' binades, subnormal ones included; K = 2 (the second step adds to the
    first's sum, +0 or -0); several seeds, so that words land each side of the decisions."""
    fmt = mul or acc
    xs = [2.0**e * (1 + i / 8) for e in range(fmt.emin - fmt.man, min(fmt.emax + 1, 127)) for i in (0, 1, 3)]
    for a1, bs in ((f32(1 + 2.0**-23), [f32(x * (1 - 2.0**-23)) for x in xs]),  # x (1 - 2^-46) for x = 2^e
                   (f32(1 + 2.0**-23), [f32(x) for x in xs]),                   # a hair above x
                   (f32(1 - 2.0**-24), [f32(x) for x in xs])):                  # a hair below x
        for seed, first in (((1, 0), 0.0), ((2, 9), -0.0), ((3, -1), 0.0)):
            a = torch.tensor([[[1.0, a1]]])
            b = torch.tensor([[[first] * len(bs), bs]])
            want = ref_matmul(a, b, mul, acc, mode="stochastic", seed_offset=seed)
            got = _ext(a, b, mul, acc, seed=seed)
            assert bits_equal(got, want), _mismatch(got, want)
            assert bits_equal(_ext(a, b, mul, acc, seed=seed, path=1), want)
