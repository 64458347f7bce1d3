"""Kahan's steps on guarded float32 lanes (cuda/include/cpd/arith.h round_lane_guarded,
cuda/cpu/matmul_f32.h kahan_guarded_lanes): each of the step's four sums rounded by region N's
integer rounding alone, on the signed bits, with no range handling; a tile whose sums leave the
range |t| < G = 2^(emax - 2) runs again on the exact lanes.

Invariants defended:
* the claim the lanes rest on: for x, y values of a format with add_lane_guard_applies (round to
  nearest, at most 11 significant bits, signed IEEE / FN / FINITE, subnormals on), the integer
  rounding of fl32(x + y) is the exact sum rounded to nearest (the pure-torch generic add, itself
  tested against the exact oracle) whenever |x + y| is below the overflow threshold: every pair of
  codes of every such format of <= 8 bits;
* matmul_out's guarded path (path 5, forced; and the automatic path 0, which takes it for Kahan
  into accumulators other than binary16) gives the generic path's bits (path 1): sums that stay
  inside the guard, cross it in some tiles only, overflow to infinity, run through the
  accumulator's subnormals, are signed zeros (products that underflow to -0), partial tiles,
  blocked and fused steps, and operands with infinities or NaN (which take the exact lanes).
"""

import math

import pytest
import torch

import cpd
from cpd import _cpu, _fallback
from cpd.rounding import Rounding
from formats_grid import fid, small_formats

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")


def _guarded_round(u, fmt):
    """The integer rounding of round_lane_guarded on float32 bits (int64 holding 32 bits)."""
    d0 = 23 - fmt.man
    half_m1 = (1 << (d0 - 1)) - 1
    parity_add = fmt.bias + 1 if fmt.man == 0 else 0
    even = ((u >> d0) + parity_add) & 1
    return (u + half_m1 + even) & ~((1 << d0) - 1) & 0xFFFFFFFF


def _eligible(f):
    return (f.man <= 10 and f.subnormals and f.emin >= -126 and f.emin - f.man >= -149 and f.signed
            and f.specials in (cpd.Specials.IEEE, cpd.Specials.FN, cpd.Specials.FINITE))


@pytest.mark.parametrize("fmt", [f for f in small_formats() if _eligible(f)], ids=fid)
def test_guarded_rounding_is_the_exact_sum_below_overflow(fmt):
    n = 1 << fmt.bits
    vals = cpd.decode(torch.arange(n, dtype=torch.int64), fmt)
    vals = vals[torch.isfinite(vals)]
    x, y = vals.repeat_interleave(len(vals)), vals.repeat(len(vals))
    threshold = fmt.max + 2.0 ** (math.frexp(fmt.max)[1] - 1 - fmt.man) / 2  # max + half its quantum
    inside = (x.double() + y.double()).abs() < threshold
    x, y = x[inside], y[inside]
    u = (x + y).view(torch.int32).long() & 0xFFFFFFFF
    got = _guarded_round(u, fmt)
    got = torch.where(got >= 1 << 31, got - (1 << 32), got).int().view(torch.float32)
    want = _fallback.arith("add", x, y, None, fmt, Rounding.NEAREST, False, 32, 0, 0)  # exact sum, rounded
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def _ext_matmul(a, b, mul, acc, kahan, block, path):
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
    mf = mul or acc
    _cpu.extension().matmul_out(a, b, out, mul is not None, *cpd.ops._fmt_args(mf), *cpd.ops._fmt_args(acc), kahan,
                                block, Rounding.NEAREST.code, False, 32, 0, 0, path)
    return out


def bits_equal(x, y):
    """Same bits; NaNs equal to NaNs (a matmul's NaN sign and payload are not specified: the
    generic path's inf - inf is not the processor's)."""
    if not torch.equal(torch.isnan(x), torch.isnan(y)):
        return False
    return torch.equal(torch.nan_to_num(x, nan=0.0).view(torch.int32), torch.nan_to_num(y, nan=0.0).view(torch.int32))


def _binary16(acc):
    return (acc.exp, acc.man, acc.bias, acc.specials) == (5, 10, 15, cpd.Specials.IEEE)


def _mismatch(x, y):
    bad = (x.view(torch.int32) != y.view(torch.int32)).nonzero()[:5].tolist()
    return "; ".join(f"{i}: {x[tuple(i)].item()!r} != {y[tuple(i)].item()!r}" for i in bad)


# (mul, acc): mul's values within acc's; None: fused steps (x + a*b rounded once)
GUARD_PAIRS = [(cpd.E5M2, cpd.FloatFormat(6, 7)), (None, cpd.FloatFormat(6, 7)), (cpd.E4M3, cpd.BF16),
               (None, cpd.BF16), (cpd.E5M2, cpd.FloatFormat(5, 10)), (cpd.E3M2, cpd.FloatFormat(4, 6)),
               (cpd.FloatFormat(3, 1), cpd.FloatFormat(4, 3)), (None, cpd.FloatFormat(4, 3)),
               (cpd.FloatFormat(4, 3, specials="finite"), cpd.FloatFormat(6, 4, specials="fn")),
               (None, cpd.FloatFormat(5, 6, specials="finite")), (cpd.E2M1, cpd.FloatFormat(3, 2))]


def _cases(mul, acc, g):
    """(a, b) pairs: the sums' magnitudes placed against the guard G = 2^(emax - 2)."""
    fmt = mul or acc
    emax = math.frexp(acc.max)[1] - 1
    G = 2.0 ** (emax - 2)
    K = 90
    unit = math.sqrt(K)  # randn sums of K unit products are about sqrt(K)
    pmax = min(fmt.max, acc.max)
    out = []
    for target in (1.0, G / 64, G / 4, G, 4 * G, acc.max):  # inside, some tiles cross, all cross, overflow
        scale = min(target / unit, pmax / 4)
        a = torch.randn(2, 6, K, generator=g) * math.sqrt(scale)
        b = torch.randn(2, K, 70, generator=g) * math.sqrt(scale)
        out.append((a, b))
    # products at the top of mul, all of one sign: the sums run into the accumulator's overflow
    a = torch.full((1, 3, K), math.sqrt(pmax))
    b = torch.full((1, K, 67), math.sqrt(pmax))
    b[0, :, 1::2] *= -1
    out.append((a, b))
    # the accumulator's subnormals (and mul's): tiny products, sums below 2^emin
    tiny = 2.0 ** ((max(acc.emin - acc.man, fmt.emin - fmt.man) + acc.emin) / 2)
    out.append((torch.randn(1, 5, K, generator=g) * tiny, torch.randn(1, K, 131, generator=g)))
    # signed zeros: products that round to -0 or +0 (and exact zeros), rows of only -0
    z = torch.randn(1, 4, K, generator=g) * 2.0 ** (fmt.emin - fmt.man - 3)
    z[0, 0] = -z[0, 0].abs()
    z[0, 1, ::3] = -0.0
    out.append((z, torch.rand(1, K, 65, generator=g) + 0.5))
    # coarse grids: exact cancellations and ties in acc
    out.append((torch.randint(-8, 9, (1, 5, K), generator=g).float() * 0.25,
                torch.randint(-3, 4, (1, K, 70), generator=g).float() * 0.5))
    return out


@pytest.mark.parametrize("mul,acc", GUARD_PAIRS, ids=[f"{m.name if m else 'fused'}-{a.name}" for m, a in GUARD_PAIRS])
def test_guarded_kahan_equals_generic_path(mul, acc):
    ext = _cpu.extension()
    args = (mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc), 0, False)
    assert ext.matmul_lanes(*args) in (16, 32)
    g = torch.Generator().manual_seed(31)
    cases = _cases(mul, acc, g)
    a, b = cases[0]
    a = a.clone()
    a[0, 0, :3] = torch.tensor([math.inf, math.nan, -0.0])  # non-finite operands: the exact lanes
    cases.append((a, b))
    for a, b in cases:
        for block in (0, 8):
            gen = _ext_matmul(a, b, mul, acc, True, block, 1)
            lanes = _ext_matmul(a, b, mul, acc, True, block, 3)  # the same lanes, unguarded
            assert bits_equal(lanes, gen), (block, _mismatch(lanes, gen))
            for path in (5, 0):
                fast = _ext_matmul(a, b, mul, acc, True, block, path)
                assert bits_equal(fast, gen), (path, block, _mismatch(fast, gen))
                if path == 5 or not _binary16(acc):  # path 0 into binary16: F16C's lanes (NaN bits aside)
                    assert torch.equal(fast.view(torch.int32), lanes.view(torch.int32)), (path, block)


def test_guarded_kahan_signed_zero_rows():
    """Products that all round to -0: Kahan's y = -0 - (+0) is -0, and t = s + y from s = +0 is
    +0 (the sum starts at +0), on every path; columns of +0 and of mixed zeros alike."""
    a = torch.full((1, 2, 40), -1e-30)
    b = torch.full((1, 40, 70), 1e-30)
    b[0, :, 3] = -1e-30
    b[0, ::2, 5] = -1e-30
    gen = _ext_matmul(a, b, cpd.E5M2, cpd.FloatFormat(6, 7), True, 0, 1)
    assert torch.equal(gen.view(torch.int32), torch.zeros_like(gen).view(torch.int32))
    for path in (5, 0):
        out = _ext_matmul(a, b, cpd.E5M2, cpd.FloatFormat(6, 7), True, 0, path)
        assert torch.equal(out.view(torch.int32), gen.view(torch.int32))
