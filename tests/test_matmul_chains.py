"""cpd.matmul's register chains into float32-range accumulators (x86-64-v3 and AVX-512 builds):

* the fused narrow chain (cuda/cpu/matmul_fchain.h): no mul (exact products), acc TF32, BF16 or
  another format of float32's exponent range with at most 10 mantissa bits, to nearest, no Kahan,
  no blocks, finite operands: ``s = round(fl32(s + a*b))`` per step, the lanes where fl32 lands
  on a midpoint of acc redone exactly;
* its binary16 form (FChain16): acc FP16, the same steps rounded by the processor's float32 ->
  binary16 conversion, the midpoints (and the steps that overflow) found by |r - h| >= binary16's
  half-quantum at r and redone exactly;
* the binary16 chain into binary32 (cuda/cpu/matmul_h16.h with SumB32): acc FP32, products
  rounded to a format with subnormals (E4M3, E5M2, FP16, ...), bounded and general forms;
* the same chain into a narrow acc of float32's exponent range (SumI: BF16, (8, 3)), products
  rounded to mul, bounded form only (max|a| * max|b| <= mul's max, finite operands; otherwise the
  float32 lanes serve).

Invariants defended:
* every output equals an exact reference written here (each step's exact rational sum rounded
  once by tests/oracle.py's ``oracle_round``, IEEE's sign of an exact zero sum), never the
  kernel's algorithm: sums on every binade, subnormal sums, overflow to infinity, signed zeros,
  steps whose float32 sum lands on a midpoint of acc with the exact sum above, below or on it;
* the automatic loop (the chains) gives the generic loop's bits (one output at a time) on ragged
  shapes around the register tiles and row blocks, with NaN and infinite operands (which send the
  fused call to the float32 lanes), at the bound max|a| * max|b| = mul's max and above it;
* results do not depend on the thread count; a thread that flushes float32 subnormals gets the
  generic steps' bits;
* the same chain into an acc rounded by round_f's constant (SumF: (6, 7), (5, 7), E5M2-like, with
  subnormals; bounded products), guarded: tiles whose sums reach 2^emax (and overflow to infinity)
  are run again on the float32 lanes, with the same bits as tiles that never trip (``path=7``
  takes SumF whatever K max|a| max|b|; the automatic loop only where that is below 2^(emax - 1)).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import cpd
from cpd import _cpu
from oracle import oracle_round

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")

NARROW = [cpd.TF32, cpd.BF16, cpd.FloatFormat(8, 3), cpd.FloatFormat(8, 1)]
B32_MULS = [cpd.E4M3, cpd.E5M2, cpd.FP16, cpd.E4M3FN]
NARROW_MUL = [(cpd.E4M3, cpd.BF16), (cpd.E5M2, cpd.BF16), (cpd.E4M3FN, cpd.BF16), (cpd.E2M1, cpd.FloatFormat(8, 3))]
FSUM = [(cpd.E5M2, cpd.FloatFormat(6, 7)), (cpd.E4M3, cpd.FloatFormat(6, 7)), (cpd.E5M2, cpd.FloatFormat(5, 7)),
        (cpd.E5M2, cpd.FloatFormat(5, 2))]


def _neg(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def ext(a, b, mul, acc, path=0):
    """matmul_out to nearest, no Kahan, no blocks; path 0: automatic (the chains), 1: generic."""
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
    _cpu.extension().matmul_out(a, b, out, mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc),
                                False, 0, cpd.Rounding("nearest").code, False, 32, 0, 0, path)
    return out


def ref_dot(arow, bcol, mul, acc) -> float:
    """s = round_acc(s + P) from s = +0 in k order, P = a*b exact (mul None) or rounded to mul,
    each rounding of an exact rational; finite operands (infinite sums stay infinite)."""
    s = 0.0
    for a, b in zip(arow, bcol):
        exact, p_neg = Fraction(a) * Fraction(b), _neg(a) != _neg(b)
        if mul is not None:
            p = oracle_round(exact, mul, zero_negative=p_neg)
            if not math.isfinite(p):
                s = s + p  # an overflowing product (inf, or NaN for formats without inf)
                continue
            exact, p_neg = Fraction(p), _neg(p)
        if math.isfinite(s):
            s = oracle_round(Fraction(s) + exact, acc, zero_negative=_neg(s) and p_neg)
    return s


def same_bits(x, y):
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


def mismatch(x, y):
    bad = (x.view(torch.int32) != y.view(torch.int32)).nonzero()[:5].tolist()
    return "; ".join(f"{i}: {x[tuple(i)].item()!r} != {y[tuple(i)].item()!r}" for i in bad)


def check(a, b, mul, acc, oracle=False, path=0):
    fast, gen = ext(a, b, mul, acc, path), ext(a, b, mul, acc, 1)
    assert same_bits(fast, gen), mismatch(fast, gen)
    if oracle:
        a3, b3 = a.tolist(), b.tolist()
        for bi in range(a.shape[0]):
            for i in range(a.shape[1]):
                for j in range(b.shape[2]):
                    want = ref_dot(a3[bi][i], [b3[bi][k][j] for k in range(a.shape[2])], mul, acc)
                    got = fast[bi, i, j].item()
                    if math.isnan(want):
                        assert math.isnan(got), (bi, i, j, got)
                    else:
                        assert got == want and _neg(got) == _neg(want), (bi, i, j, got, want)


def binades(g, shape, lo, hi):
    """float32 values on every binade from 2^lo to 2^hi, both signs, with +-0 sprinkled in."""
    e = torch.randint(lo, hi + 1, shape, generator=g)
    v = torch.ldexp(1 + torch.rand(shape, generator=g), e).float()
    v = torch.where(torch.rand(shape, generator=g) < 0.5, -v, v)
    v.view(-1)[::13] = 0.0
    v.view(-1)[5::17] = -0.0
    return v


def bound_cases(mul, g):
    """Operands at the bounded chains' bound, max|a| * max|b| = mul's max, and one float32 ulp above
    it (the float32 lanes), with products of +-max in every row."""
    top = float(mul.max)
    for hi in (top, math.nextafter(top, math.inf)):
        a = torch.rand(1, 5, 11, generator=g) * 2 - 1
        a[:, :, 0] = 1.0
        b = (torch.rand(1, 11, 7, generator=g) * 2 - 1) * hi
        b[:, 0, :] = hi
        b[:, 1, :] = -hi
        yield a, b


def midpoint_steps(acc, g, rows, K):
    """Rows whose every step has fl32(s + a*b) on a midpoint of acc (the lanes the chain redoes):
    the first product sets s to a value of acc with a random exponent and odd or even last bit,
    each later product is +-q/2 times (1 - 2^-24), 1 or (1 + 2^-23) (exact sum just below, on or
    just above the midpoint, fl32 of it on it), q = acc's quantum at s. Column 0 of b holds 1."""
    a = torch.zeros(1, rows, K)
    for r in range(rows):
        e = int(torch.randint(-100, 100, (1,), generator=g))
        m = int(torch.randint(1 << acc.man, 2 << acc.man, (1,), generator=g))
        a[0, r, 0] = math.ldexp(m, e - acc.man) * (1 if r % 2 else -1)
        for k in range(1, K):
            f = [1 - 2.0 ** -24, 1.0, 1 + 2.0 ** -23][int(torch.randint(0, 3, (1,), generator=g))]
            a[0, r, k] = math.ldexp(f, e - acc.man - 1) * (1 if torch.rand(1, generator=g) < 0.5 else -1)
    b = torch.ones(1, K, 3)
    b[0, :, 1] = -1.0
    b[0, :, 2] = 2.0
    return a, b


def midpoint_steps_fp16(g, rows, K):
    """midpoint_steps for FP16: s's first value on binary16's grid in a random binade from region S
    (multiples of 2^-24 below 2^-14) to 2^15, each later product +-q/2 times (1 - 2^-24), 1 or
    (1 + 2^-23), q the grid's quantum there (2^-24 in region S)."""
    acc = cpd.FP16
    a = torch.zeros(1, rows, K)
    for r in range(rows):
        e = int(torch.randint(-24, 16, (1,), generator=g))
        q = max(e, acc.emin) - acc.man
        lo = 1 if e < acc.emin else 1 << acc.man
        m = int(torch.randint(lo, 2 << acc.man, (1,), generator=g))
        a[0, r, 0] = math.ldexp(m, q) * (1 if r % 2 else -1)
        for k in range(1, K):
            f = [1 - 2.0 ** -24, 1.0, 1 + 2.0 ** -23][int(torch.randint(0, 3, (1,), generator=g))]
            a[0, r, k] = math.ldexp(f, q - 1) * (1 if torch.rand(1, generator=g) < 0.5 else -1)
    b = torch.ones(1, K, 3)
    b[0, :, 1] = -1.0
    b[0, :, 2] = 2.0
    return a, b


def test_chains_report_float32_lanes():
    e = _cpu.extension()
    for acc in NARROW:
        assert e.matmul_lanes(False, *cpd.ops._fmt_args(acc), *cpd.ops._fmt_args(acc), 0, False) == 32
    for mul, acc in [(m, cpd.FP32) for m in B32_MULS] + NARROW_MUL:
        assert e.matmul_lanes(True, *cpd.ops._fmt_args(mul), *cpd.ops._fmt_args(acc), 0, False) == 32


@pytest.mark.parametrize("acc", NARROW, ids=lambda f: f.name)
def test_fused_exact_reference(acc):
    """Every binade (cancellation, absorption), subnormal sums, overflow to infinity (and past it),
    signed zeros (products that underflow float32 to -0), midpoint steps."""
    g = torch.Generator().manual_seed(3)
    cases = [
        (binades(g, (1, 3, 23), -75, 63), binades(g, (1, 23, 5), -75, 63)),     # every binade
        (binades(g, (1, 2, 17), -80, -60), binades(g, (1, 17, 4), -80, -60)),    # subnormal sums
        (binades(g, (1, 2, 19), 60, 64), binades(g, (1, 19, 4), 60, 64)),        # overflow
        (torch.tensor([[[-0.0, 1e-30, -0.0], [-0.0, -0.0, -0.0]]]), torch.tensor([[[1.0, -1.0], [-1e-30, 1e-30],
                                                                               [0.0, -0.0]]])),  # zeros
        midpoint_steps(acc, g, 7, 9),
    ]
    for a, b in cases:
        check(a, b, None, acc, oracle=True)


@pytest.mark.parametrize("acc", NARROW, ids=lambda f: f.name)
def test_fused_equals_generic_ragged_and_nonfinite(acc):
    """Shapes around the register tile (4 or 6 rows, 16 or 32 columns) and the row blocks, coarse
    grids (many exact midpoints), large midpoint runs; NaN and infinite operands (the float32
    lanes then serve the call)."""
    g = torch.Generator().manual_seed(5)
    for M in (1, 3, 4, 5, 6, 7, 65, 97):
        for N, K in ((1, 9), (15, 1), (16, 33), (17, 8), (33, 3), (70, 20)):
            check(torch.randn(2, M, K, generator=g), torch.randn(2, K, N, generator=g) * 0.1, None, acc)
    steps = torch.randint(-8, 9, (1, 13, 53), generator=g).float() * 0.125
    check(steps, torch.randint(-3, 4, (1, 53, 40), generator=g).float() * 0.5, None, acc)
    a, b = midpoint_steps(acc, g, 30, 40)
    check(a, b.repeat(1, 1, 11), None, acc)
    check(torch.randn(1, 5, 0), torch.randn(1, 0, 7), None, acc)  # K = 0: +0
    a, b = torch.randn(2, 5, 11, generator=g), torch.randn(2, 11, 20, generator=g)
    for v in (math.inf, -math.inf, math.nan):
        a2 = a.clone()
        a2[0, 1, 3] = v
        check(a2, b, None, acc)
    a2 = a.clone()
    a2[1, 0, :] = 3e38
    check(a2, b * 1e10, None, acc)  # float32 overflow in the FMA: infinities


def test_fused_fp16_exact_reference():
    """Into binary16 (FChain16): every binade of the sums from below the smallest subnormal to past
    the largest value, region S sums, overflow to infinity and the sums that stay there, the sums
    whose float32 value is 65520 (binary16's overflow midpoint) with the exact sum below, on and
    above it, signed zeros, midpoint steps in every binade and in region S."""
    g = torch.Generator().manual_seed(23)
    near = torch.tensor([[[65504.0, 16 * (1 - 2.0 ** -24)], [65504.0, 16.0], [65504.0, 16 * (1 + 2.0 ** -23)],
                          [-65504.0, -16 * (1 - 2.0 ** -24)], [65504.0, 15.0]]])
    cases = [
        (binades(g, (1, 3, 23), -20, 8), binades(g, (1, 23, 5), -20, 8)),     # every binade
        (binades(g, (1, 2, 17), -16, -9), binades(g, (1, 17, 4), -16, -9)),   # region S sums
        (binades(g, (1, 2, 19), 6, 9), binades(g, (1, 19, 4), 6, 9)),         # overflow
        (near, torch.tensor([[[1.0, -1.0], [1.0, 1.0]]])),                    # 65520
        (torch.tensor([[[-0.0, 1e-30, -0.0], [-0.0, -0.0, -0.0]]]), torch.tensor([[[1.0, -1.0], [-1e-30, 1e-30],
                                                                               [0.0, -0.0]]])),  # zeros
        midpoint_steps_fp16(g, 9, 9),
    ]
    for a, b in cases:
        check(a, b, None, cpd.FP16, oracle=True)


def test_fused_fp16_equals_generic_ragged_and_nonfinite():
    """FChain16 against the generic loop: shapes around the tile, operands of every scale (region S
    sums, overflow), grids with many exact midpoints, long midpoint runs; NaN and infinite operands
    (the float32 lanes then serve the call), float32 overflow in the FMA."""
    g = torch.Generator().manual_seed(29)
    for M in (1, 3, 4, 5, 6, 7, 65):
        for N, K in ((1, 9), (15, 1), (16, 33), (17, 8), (33, 3), (70, 20)):
            for scale in (1.0, 2.0 ** -12, 40.0):
                check(torch.randn(2, M, K, generator=g) * scale, torch.randn(2, K, N, generator=g), None, cpd.FP16)
    steps = torch.randint(-8, 9, (1, 13, 53), generator=g).float() * 0.125
    for scale in (1.0, 2.0 ** -20, 2.0 ** -12, 2.0 ** 11):
        check(steps * scale, torch.randint(-3, 4, (1, 53, 40), generator=g).float() * 0.5, None, cpd.FP16)
    a, b = midpoint_steps_fp16(g, 30, 40)
    check(a, b.repeat(1, 1, 11), None, cpd.FP16)
    check(torch.randn(1, 5, 0), torch.randn(1, 0, 7), None, cpd.FP16)  # K = 0: +0
    a, b = torch.randn(2, 5, 11, generator=g), torch.randn(2, 11, 20, generator=g)
    for v in (math.inf, -math.inf, math.nan):
        a2 = a.clone()
        a2[0, 1, 3] = v
        check(a2, b, None, cpd.FP16)
    a2 = a.clone()
    a2[1, 0, :] = 3e38
    check(a2, b * 1e10, None, cpd.FP16)  # float32 overflow in the FMA: infinities


@pytest.mark.parametrize("mul", B32_MULS, ids=lambda f: f.name)
def test_b32_chain_exact_reference_and_bound(mul):
    """Into binary32: random operands (bounded form), at and one ulp above the bound (general form),
    products that overflow mul, products below mul's smallest subnormal (+-0), every binade."""
    g = torch.Generator().manual_seed(7)
    top = float(mul.max)
    for hi in (top, math.nextafter(top, math.inf), 4 * top):
        a = torch.rand(1, 5, 9, generator=g) * 2 - 1
        a[:, :, 0] = 1.0
        b = (torch.rand(1, 9, 7, generator=g) * 2 - 1) * hi
        b[:, 0, :] = hi
        check(a, b, mul, cpd.FP32, oracle=True)
    check(binades(g, (1, 3, 21), -12, 9), binades(g, (1, 21, 5), -12, 9), mul, cpd.FP32, oracle=True)


@pytest.mark.parametrize("mul", [cpd.E4M3, cpd.E5M2], ids=lambda f: f.name)
def test_b32_chain_equals_generic_ragged_and_nonfinite(mul):
    g = torch.Generator().manual_seed(11)
    for M in (1, 4, 5, 6, 7, 65, 97):
        for N, K in ((1, 9), (15, 1), (16, 33), (17, 8), (33, 3), (70, 20)):
            check(torch.randn(2, M, K, generator=g), torch.randn(2, K, N, generator=g) * 0.1, mul, cpd.FP32)
    a, b = torch.randn(1, 5, 8, generator=g), torch.randn(1, 8, 17, generator=g)
    a[0, 0, 2], a[0, 1, 3], a[0, 2, 0] = math.inf, -math.inf, 0.0
    b[0, 0, 1], b[0, 2, 4], b[0, 3, 5] = math.inf, 0.0, math.nan
    check(a, b, mul, cpd.FP32)


@pytest.mark.parametrize("mul,acc", NARROW_MUL, ids=lambda x: x.name)
def test_narrow_chain_with_mul_exact_reference(mul, acc):
    """Products rounded to mul summed into BF16 / (8, 3): ties of the sums (to even), sums that
    cancel to +0, products that round to +-0, at and above the bound (above: the float32 lanes),
    every binade of the operands (tiny products: subnormal-range sums of acc's grid)."""
    g = torch.Generator().manual_seed(17)
    for a, b in bound_cases(mul, g):
        check(a, b, mul, acc, oracle=True)
    vals = cpd.cast(torch.linspace(-3, 3, 41), mul)
    vals = vals[torch.isfinite(vals)]
    a = torch.stack([vals, -vals, vals.flip(0), torch.full_like(vals, 2.0 ** -30), torch.full_like(vals, -0.0)])[None]
    b = torch.ones(1, vals.numel(), 6)
    b[0, :, 1], b[0, :, 2], b[0, :, 3] = -1.0, 0.5, -0.0
    b[0, :, 4:] = torch.randn(vals.numel(), 2, generator=g)
    check(a, b, mul, acc, oracle=True)
    check(binades(g, (1, 3, 21), -40, 1), binades(g, (1, 21, 5), -40, 1), mul, acc, oracle=True)


@pytest.mark.parametrize("mul,acc", NARROW_MUL, ids=lambda x: x.name)
def test_narrow_chain_with_mul_equals_generic(mul, acc):
    """Ragged shapes, long sums of the largest products, NaN and infinite operands (the float32
    lanes)."""
    g = torch.Generator().manual_seed(19)
    for M in (1, 4, 5, 7, 65):
        for N, K in ((1, 9), (16, 33), (17, 8), (70, 20)):
            check(torch.randn(2, M, K, generator=g), torch.randn(2, K, N, generator=g) * 0.1, mul, acc)
    K = 300  # long sums of the largest products (bounded: max|a| * max|b| = mul's max), both signs
    a, b = torch.ones(1, 3, K), torch.full((1, K, 5), float(mul.max))
    a[0, 1] = torch.linspace(-1, 1, K)
    b[0, :, 1] = -float(mul.max)
    check(a, b, mul, acc)
    a, b = torch.randn(1, 5, 8, generator=g), torch.randn(1, 8, 17, generator=g)
    a[0, 0, 2], b[0, 3, 5], b[0, 2, 4] = math.inf, math.nan, -math.inf
    check(a, b, mul, acc)


@pytest.mark.parametrize("mul,acc", FSUM, ids=lambda x: x.name)
@pytest.mark.parametrize("path", [0, 7])
def test_fsum_chain_exact_reference(mul, acc, path):
    """Products rounded to mul summed into a narrow-range acc (SumF): at and above the bound (above:
    the float32 lanes), ties of the sums, cancellation to +0, every binade of the operands (region S
    sums), sums that pass 2^emax and overflow to infinity (the guard's redo)."""
    g = torch.Generator().manual_seed(31)
    top = float(mul.max)
    for a, b in bound_cases(mul, g):
        check(a, b, mul, acc, oracle=True, path=path)
    vals = cpd.cast(torch.linspace(-3, 3, 41), mul)
    vals = vals[torch.isfinite(vals)]
    a = torch.stack([vals, -vals, vals.flip(0), torch.full_like(vals, -0.0)])[None]
    b = torch.ones(1, vals.numel(), 6)
    b[0, :, 1], b[0, :, 2], b[0, :, 3] = -1.0, 0.5, -0.0
    b[0, :, 4:] = torch.randn(vals.numel(), 2, generator=g)
    check(a, b, mul, acc, oracle=True, path=path)
    lo = acc.emin - acc.man
    check(binades(g, (1, 3, 21), lo // 2, 1), binades(g, (1, 21, 5), lo // 2, 1), mul, acc, oracle=True, path=path)
    K = min(int(2 * float(acc.max) / top) + 3, 300)  # products +-mul's max (bounded): sums that pass
    a, b = torch.ones(1, 7, K), torch.full((1, K, 3), top)  # 2^emax and overflow where K allows
    a[0, 1:4] = -1.0
    a[0, 4, ::2] = -1.0
    a[0, 5, K // 2:] = -1.0
    b[0, :, 1] = 0.25
    check(a, b, mul, acc, oracle=True, path=path)


@pytest.mark.parametrize("mul,acc", FSUM, ids=lambda x: x.name)
@pytest.mark.parametrize("path", [0, 7])
def test_fsum_chain_equals_generic(mul, acc, path):
    """Ragged shapes around the tile and row blocks; operands of every scale, some rows tripping
    the guard and others not (the tiles after a tripped one in a task take the float32 lanes too);
    NaN and infinite operands (the float32 lanes)."""
    g = torch.Generator().manual_seed(37)
    for M in (1, 4, 5, 7, 65):
        for N, K in ((1, 9), (16, 33), (17, 8), (70, 20)):
            check(torch.randn(2, M, K, generator=g), torch.randn(2, K, N, generator=g) * 0.1, mul, acc, path=path)
    top = float(mul.max) ** 0.5
    a, b = torch.rand(1, 97, 64, generator=g) * top, torch.rand(1, 64, 40, generator=g) * top
    a[0, 30:40] *= -1
    a[0, 60:] *= 1e-3  # rows that stay below 2^emax, after tripped tiles
    check(a, b, mul, acc, path=path)
    check(a.flip(1), b, mul, acc, path=path)
    a, b = torch.randn(1, 5, 8, generator=g), torch.randn(1, 8, 17, generator=g)
    a[0, 0, 2], b[0, 3, 5], b[0, 2, 4] = math.inf, math.nan, -math.inf
    check(a, b, mul, acc, path=path)


@pytest.mark.parametrize("mul,acc", [(None, cpd.TF32), (None, cpd.BF16), (cpd.E4M3, cpd.FP32), (cpd.E4M3, cpd.BF16),
                                     (None, cpd.FP16), (cpd.E5M2, cpd.FloatFormat(6, 7))],
                         ids=["tf32", "bf16", "e4m3-fp32", "e4m3-bf16", "fp16", "e5m2-6-7"])
def test_thread_count_and_flush_to_zero(mul, acc):
    g = torch.Generator().manual_seed(13)
    a, b = torch.randn(2, 150, 64, generator=g), torch.randn(2, 64, 70, generator=g) * 0.1
    a[0, :, :3] = 2.0 ** -70  # subnormal products, which a flushing thread would lose
    n = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(ext(a, b, mul, acc))
    finally:
        torch.set_num_threads(n)
    assert all(same_bits(o, outs[0]) for o in outs)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        ftz, gen = ext(a, b, mul, acc), ext(a, b, mul, acc, 1)
    finally:
        torch.set_flush_denormal(False)
    assert same_bits(ftz, gen), mismatch(ftz, gen)


@pytest.mark.parametrize("mul,acc", [(cpd.E5M2, cpd.FP16), (cpd.E5M2, cpd.FloatFormat(5, 10)), (cpd.E5M2, cpd.FP32),
                                     (None, cpd.FP16)],
                         ids=["e5m2-fp16", "e5m2-5-10", "e5m2-fp32", "none-fp16"])
def test_subnormal_operands_on_a_flushing_thread(mul, acc):
    """float32-subnormal operands whose products are values of mul (2^-127 * 2^118 = 2^-9), within
    the bounded chain's bound: a thread that flushes subnormals (DAZ) would read them as zeros, so
    it must take the generic steps, into binary16 too."""
    g = torch.Generator().manual_seed(3)
    a = torch.full((1, 6, 16), 2.0 ** -127) * torch.randint(1, 4, (1, 6, 16), generator=g)
    b = torch.full((1, 16, 20), 2.0 ** 116) * torch.randint(1, 4, (1, 16, 20), generator=g)
    want = ext(a, b, mul, acc, 1)
    assert bool((want != 0).all())
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        got = {path: ext(a, b, mul, acc, path) for path in (0, 2, 3, 4)}
    finally:
        torch.set_flush_denormal(False)
    for path, out in got.items():
        assert same_bits(out, want), (path, mismatch(out, want))
