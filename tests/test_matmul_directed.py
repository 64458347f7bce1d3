"""Directed rounding (toward zero, up, down) in the CPU matmul's float32 lanes
(cuda/cpu/matmul_directed.h; issue 29, item 1: "directed rounding modes through the same lanes").

Invariants defended:
* formats whose values are all float32 values, with a signed zero of each sign
  (``cpd::directed_lane_applies``), take the directed lanes in the three directed modes
  (``matmul_lanes`` reports 34); the rest (FNUZ, P3109, wider than float32) keep the generic loop;
* the lanes (``path=0``, which takes the register chains where they apply: the binary32 chain into
  FP32 with exact products, the fused narrow chain into BF16/TF32/FP16 with exact products, the
  product chain with products rounded to a mul of <= 21 bits with subnormals and bounded operands,
  max|a| max|b| <= mul's max; and ``path=6``, the tiles alone) give the generic loop's bits
  (``path=1``: dot_step on float32
  bits, itself checked against exact rationals in tests/test_matmul.py) bit for bit: every binade
  of inputs, subnormal sums, overflow with and without saturation, signed zeros (a row of -0: every
  sum an exact zero, -0 only rounding down), NaN and infinite operands, NaN payloads, ragged shapes
  (K = 1, N not a multiple of the tile), plain, Kahan and blocked; on the product chain also
  products in every binade of mul and below its subnormals (zeros of both signs, sums of tiny
  values that round to zero in acc), operands at its bound and one ulp above, sums that overflow;
* the same for any float32 operands (hypothesis), and against the exact rational oracle
  (``ref_matmul``) on small shapes;
* the calling thread's floating-point unit is left as it was: rounding to nearest afterwards, and a
  thread that flushes subnormals (torch.set_flush_denormal) still gets the exact bits and keeps
  its flush mode.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cpd
from cpd import _cpu
from test_matmul import bits_equal, ref_matmul
from test_matmul_chains import bound_cases
from test_matmul_sr_lanes import _binades, _mismatch

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")

MODES = ["toward_zero", "up", "down"]
CODE = {m: cpd.Rounding(m).code for m in MODES}
DIR32 = 34  # matmul.cpp LANES_DIR32
F510, F67 = cpd.FloatFormat(5, 10), cpd.FloatFormat(6, 7)

# (mul, acc) pairs the directed lanes take
ROUTED = [
    (None, cpd.FP32), (cpd.E4M3, cpd.FP32), (cpd.E5M2, cpd.FP16), (None, cpd.BF16), (None, cpd.TF32),
    (cpd.E4M3, cpd.BF16), (None, cpd.FP16), (cpd.BF16, cpd.FP32), (cpd.FP32, cpd.E5M2), (cpd.E4M3FN, F67),
    (cpd.FP16, cpd.FP16), (cpd.FP16, cpd.BF16),
    (cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(5, 6, subnormals=False)),
    (cpd.FloatFormat(4, 3, specials="finite"), cpd.FloatFormat(6, 4, specials="fn")),
    (cpd.FloatFormat(8, 15), cpd.FloatFormat(8, 21)),
]
IDS = [f"{m.name if m else 'exact'}x{a.name}" for m, a in ROUTED]


def _ext(a, b, mul, acc, mode, kahan=False, block=0, path=0, saturate=False):
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
    _cpu.extension().matmul_out(a, b, out, mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc),
                                kahan, block, CODE[mode], saturate, 32, 0, 0, path)
    return out


def _lanes(mul, acc, mode):
    return _cpu.extension().matmul_lanes(mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc),
                                         CODE[mode] if isinstance(mode, str) else mode, False)


def _same_bits(x, y):
    """Bits equal, NaN payloads included (the lanes redo NaN outputs by the generic steps)."""
    return x.shape == y.shape and torch.equal(x.view(torch.int32), y.view(torch.int32))


def _agree(a, b, mul, acc, mode, **kw):
    gen = _ext(a, b, mul, acc, mode, path=1, **kw)
    for path in (0, 6):
        got = _ext(a, b, mul, acc, mode, path=path, **kw)
        assert _same_bits(got, gen), (mode, path, kw, _mismatch(got, gen))
    return gen


def test_routing():
    for mul, acc in ROUTED:
        for mode in MODES:
            assert _lanes(mul, acc, mode) == DIR32, (mul, acc, mode)
        assert _lanes(mul, acc, cpd.Rounding("nearest").code) != DIR32
    # conventions without a signed zero of each sign, or an emin below float32 normals (no fast cast): generic
    for mul, acc in [(None, cpd.E4M3FNUZ), (cpd.E5M2FNUZ, cpd.BF16), (None, cpd.FloatFormat.p3109(8, 3)),
                     (None, cpd.FloatFormat(8, 3, bias=130)), (cpd.FloatFormat(8, 20, bias=128), cpd.FP32)]:
        for mode in MODES:
            assert _lanes(mul, acc, mode) == 0, (mul, acc, mode)


def _range(mul, acc):
    lo, hi = max(acc.emin - acc.man - 4, -160), min(acc.emax + 2, 130)
    if mul is not None:
        lo, hi = max(lo, mul.emin - mul.man - 4), min(hi, mul.emax + 2)
    return lo, hi


@pytest.mark.parametrize("mul,acc", ROUTED, ids=IDS)
def test_equals_generic(mul, acc):
    g = torch.Generator().manual_seed(34)
    lo, hi = _range(mul, acc)
    half_lo, half_hi = (lo - 1) // 2, (hi + 1) // 2  # products over every binade of the formats
    a = _binades(g, (2, 3, 37), half_lo, half_hi)
    b = _binades(g, (2, 37, 67), half_lo, half_hi)
    a[0, 0, :6] = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, -0.0])
    b[1, 3:7, 5] = torch.tensor([-0.0, 0.0, -0.0, math.inf])
    a[1, 2, :] = -0.0  # a row of signed zeros: every sum an exact zero
    cases = [dict(), dict(kahan=True), dict(block=5), dict(kahan=True, block=5), dict(saturate=True),
             dict(kahan=True, saturate=True)]
    for mode in MODES:
        for kw in cases:
            _agree(a, b, mul, acc, mode, **kw)
        # K = 1 and a narrow N; sums of tiny values (the formats' subnormals)
        for K, N in ((1, 67), (3, 5)):
            a1 = _binades(g, (1, 4, K), lo // 2, hi // 2)
            b1 = _binades(g, (1, K, N), lo // 2, hi // 2)
            for kw in (dict(), dict(kahan=True), dict(block=2)):
                _agree(a1, b1, mul, acc, mode, **kw)
        tiny = float(2.0 ** (max(acc.emin, -126) - 2))
        a2 = torch.randn(1, 3, 40, generator=g) * tiny
        b2 = torch.randn(1, 40, 70, generator=g)
        for kw in (dict(), dict(kahan=True), dict(block=3)):
            _agree(a2, b2, mul, acc, mode, **kw)


@pytest.mark.parametrize("mul,acc", [(None, cpd.FP32), (None, cpd.FP16), (cpd.E4M3FN, cpd.FP16), (cpd.E5M2, F510),
                                     (cpd.E4M3, cpd.FP32)])
def test_overflow_and_nan_payloads(mul, acc):
    g = torch.Generator().manual_seed(3)
    big = min(float(acc.max), 3e38) ** 0.5
    a = torch.randn(1, 3, 30, generator=g) * big
    b = torch.randn(1, 30, 65, generator=g) * 4
    a[0, 1, 3] = torch.tensor(0x7FC01234, dtype=torch.int32).view(torch.float32)  # a NaN with a payload
    b[0, 7, 9] = torch.tensor(-0x0003ABCD, dtype=torch.int32).view(torch.float32)  # and a negative one
    b[0, 2, 11] = math.inf
    for mode in MODES:
        for kw in (dict(), dict(saturate=True), dict(kahan=True), dict(kahan=True, block=7, saturate=True)):
            out = _agree(a, b, mul, acc, mode, **kw)
            assert not kw.get("saturate") or out[~torch.isnan(out)].abs().max() <= float(acc.max)


def test_exact_zero_signs():
    """From s = +0: 3 + (-3) and +0 + (-0) are -0 rounding down and +0 otherwise; +0 + +0 is +0."""
    a = torch.tensor([[[1.0, 1.0], [-0.0, -0.0], [0.0, -0.0]]])
    b = torch.tensor([[[3.0], [-3.0]]])
    for mul, acc in [(None, cpd.FP32), (None, cpd.BF16), (cpd.E4M3, cpd.FP16)]:
        for mode in MODES:
            out = _agree(a, b, mul, acc, mode)
            signs = torch.signbit(out).flatten().tolist()
            assert signs == [mode == "down", mode == "down", False], (mul, acc, mode, out)


_F32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(ROUTED), st.lists(_F32, min_size=6, max_size=6), st.lists(_F32, min_size=6, max_size=6),
       st.sampled_from(MODES), st.booleans(), st.sampled_from([0, 2]), st.booleans())
def test_hypothesis_values(pair, av, bv, mode, kahan, block, saturate):
    """Any float32 operands (every binade, subnormals, zeros, inf, NaN), a 2 x 3 by 3 x 2 product."""
    mul, acc = pair
    a = torch.tensor(av, dtype=torch.float32).reshape(1, 2, 3)
    b = torch.tensor(bv, dtype=torch.float32).reshape(1, 3, 2)
    _agree(a, b, mul, acc, mode, kahan=kahan, block=block, saturate=saturate)


@pytest.mark.parametrize("mul,acc", [(None, cpd.FP32), (cpd.E4M3, cpd.FP16), (None, cpd.BF16), (cpd.E5M2, F67)])
@pytest.mark.parametrize("mode", MODES)
def test_against_the_exact_oracle(mul, acc, mode):
    """The public cpd.matmul against exact rationals (tests/test_matmul.py ref_matmul)."""
    g = torch.Generator().manual_seed(7)
    lo, hi = _range(mul, acc)
    a = _binades(g, (2, 7), lo // 2, hi // 2)
    b = _binades(g, (7, 3), lo // 2, hi // 2)
    a[0, 0] = -0.0
    for kw in (dict(), dict(kahan=True), dict(block=3)):
        got = cpd.matmul(a, b, mul=mul, acc=acc, rounding=mode, **kw)
        want = ref_matmul(a, b, mul, acc, mode=mode, kahan=kw.get("kahan", False), block=kw.get("block"))
        assert bits_equal(got, want), (mode, kw, got, want)


def _nearest_after():
    """Whether this thread rounds float32 to nearest: 1 + 2^-24 + 2^-24 ties to 1 twice."""
    one, h = np.float32(1.0), np.float32(2.0**-24)
    return (one + h) + h == one and (-one - h) - h == -one and one + np.float32(0.75 * 2.0**-23) == np.float32(1 + 2.0**-23)


def test_the_thread_is_left_as_it_was():
    a, b = torch.randn(3, 40), torch.randn(40, 70)
    for mode in MODES:
        cpd.matmul(a, b, rounding=mode)
        cpd.matmul(a, b, mul=cpd.E4M3, acc=cpd.BF16, rounding=mode, kahan=True)
        assert _nearest_after(), mode
    # a thread that flushes subnormals: the same bits as one that keeps them, and it keeps flushing
    tiny = torch.randn(1, 5, 40) * 2.0**-140
    want = {m: _ext(tiny, torch.randn(1, 40, 9, generator=torch.Generator().manual_seed(1)), None, cpd.FP32, m, path=1)
            for m in MODES}
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode for torch to set")
    try:
        for mode in MODES:
            got = _ext(tiny, torch.randn(1, 40, 9, generator=torch.Generator().manual_seed(1)), None, cpd.FP32, mode)
            assert _same_bits(got, want[mode]), mode
        assert torch.tensor([2.0**-140]).mul(1.0).item() == 0.0  # still flushing
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("acc", [cpd.BF16, cpd.TF32, cpd.FloatFormat(8, 4)], ids=lambda f: f.name)
def test_fused_chain(acc):
    """Exact products into TF32/BF16-like accumulators with finite operands take the register chain
    (path 0; cpd::directed_lane_bits on the FMA's bits): every binade, float32 subnormal sums, rows
    and columns that fill no whole register tile, sums that overflow (up: inf; toward zero: max)."""
    g = torch.Generator().manual_seed(8)
    a = _binades(g, (2, 7, 37), -75, 64)
    b = _binades(g, (2, 37, 45), -75, 64)
    a[1, 3, :] = -0.0
    tiny = torch.randn(1, 5, 20, generator=g) * 2.0**-66
    huge = torch.randn(1, 5, 20, generator=g) * 2.0**63
    for mode in MODES:
        _agree(a, b, None, acc, mode)
        _agree(tiny, tiny.transpose(1, 2).contiguous(), None, acc, mode)
        out = _agree(huge, huge.transpose(1, 2).contiguous() * 4, None, acc, mode)
        assert (out.abs() == math.inf).any() == (mode != "toward_zero"), mode


# (mul, acc) pairs the register chains take with finite operands (matmul.cpp dir_register_chains;
# products rounded to mul with bounded operands, or exact into FP16 and BF16 by the fused chain)
CHAINED = [(cpd.E4M3, cpd.FP32), (cpd.E5M2, cpd.FP32), (cpd.E4M3FN, cpd.FP32), (cpd.FP16, cpd.FP32),
           (cpd.E4M3, cpd.BF16), (cpd.E5M2, cpd.TF32), (cpd.E5M2, cpd.FP16), (cpd.E4M3, cpd.FP16),
           (cpd.FloatFormat(6, 5), cpd.FP16), (None, cpd.FP16), (None, cpd.BF16)]


def _bounded(a, b, mul):
    """b scaled by a power of two so that max|a| * max|b| <= mul's max (the product chain's bound)."""
    if mul is None:
        return b
    top = float(a.abs().max()) * float(b.abs().max())
    return b if top == 0 else b * 2.0 ** math.floor(math.log2(float(mul.max) / top))


@pytest.mark.parametrize("mul,acc", CHAINED, ids=[f"{m.name if m else 'exact'}x{a.name}" for m, a in CHAINED])
def test_register_chains(mul, acc):
    """Finite, bounded operands (the register chains, path 0) against the generic loop: products
    over every binade of mul and below its smallest subnormal (zero products of both signs, sums
    that round to zero in acc), rows of +0 and -0, a column of -0, rows and columns that fill no
    whole tile, K = 1, operands at the bound and one ulp above it, sums past acc's range."""
    g = torch.Generator().manual_seed(35)
    f = mul or acc
    lo, hi = f.emin - f.man - 6, f.emax + 1
    for M, K, N in ((13, 37, 45), (7, 1, 67), (2, 64, 5)):
        a = _binades(g, (2, M, K), lo // 2, hi // 2)
        b = _bounded(a, _binades(g, (2, K, N), lo // 2, hi // 2), mul)
        a[0, 1, :] = 0.0
        a[1, M - 1, :] = -0.0
        b[1, :, N // 2] = -0.0
        for mode in MODES:
            _agree(a, b, mul, acc, mode)
    tiny = 2.0 ** ((f.emin - f.man) // 2)  # products near and below mul's smallest subnormal
    a = torch.randn(1, 9, 40, generator=g) * tiny
    b = torch.randn(1, 40, 33, generator=g) * tiny
    for mode in MODES:
        out = _agree(a, b, mul, acc, mode)
        assert mode != "toward_zero" or (out == 0).any()
    big = 2.0 ** (min(f.emax, 127) // 2)  # products near mul's max, one sign: acc's sums overflow
    a = torch.rand(1, 6, 50, generator=g) * big + big
    b = _bounded(a, torch.rand(1, 50, 20, generator=g) * big + big, mul)
    for mode in MODES:
        _agree(a, b, mul, acc, mode)
        _agree(-a, b, mul, acc, mode)
    if mul is not None:
        for a, b in bound_cases(mul, g):
            for mode in MODES:
                _agree(a, b, mul, acc, mode)


_FINITE = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(CHAINED), st.lists(_FINITE, min_size=6, max_size=6), st.lists(_FINITE, min_size=6, max_size=6),
       st.sampled_from(MODES))
def test_hypothesis_register_chains(pair, av, bv, mode):
    """Any finite float32 operands, b scaled to the product chain's bound, a 2 x 3 by 3 x 2 product."""
    mul, acc = pair
    a = torch.tensor(av, dtype=torch.float32).reshape(1, 2, 3)
    b = _bounded(a, torch.tensor(bv, dtype=torch.float32).reshape(1, 3, 2), mul)
    assume(torch.isfinite(b).all())
    _agree(a, b, mul, acc, mode)


@pytest.mark.parametrize("mul,acc", [(cpd.E4M3, cpd.FP32), (cpd.E5M2, cpd.FP16), (cpd.E4M3, cpd.BF16),
                                     (None, cpd.FP16)])
@pytest.mark.parametrize("mode", MODES)
def test_register_chains_against_the_exact_oracle(mul, acc, mode):
    """The public cpd.matmul with bounded operands (the register chains) against exact rationals."""
    g = torch.Generator().manual_seed(9)
    f = mul or acc
    a = _binades(g, (3, 9), (f.emin - f.man - 4) // 2, f.emax // 2)
    b = _bounded(a, _binades(g, (9, 4), (f.emin - f.man - 4) // 2, f.emax // 2), mul)
    a[1] = -0.0
    got = cpd.matmul(a, b, mul=mul, acc=acc, rounding=mode)
    assert bits_equal(got, ref_matmul(a, b, mul, acc, mode=mode)), (got, ref_matmul(a, b, mul, acc, mode=mode))
