"""cpd.matmul's binary16 register chain (cuda/cpu/matmul_h16.h): products rounded to a format with
subnormals whose values are binary16 values (E4M3, E5M2, E4M3FN, E2M1), sums rounded to IEEE
binary16 to nearest, no Kahan, no blocks, on x86-64-v3 and AVX-512 builds.

Invariants defended:
* every output equals an exact reference written here with ``fractions.Fraction`` and
  ``oracle.oracle_round`` (each product exact then rounded once to mul, each sum exact then
  rounded once to binary16, IEEE's sign of an exact zero sum), never the kernel's algorithm;
* the automatic loop (the chain, in its bounded form when every operand is finite and
  max|a| * max|b| <= mul's largest value, else its general form) gives the generic loop's bits,
  NaN signs and payloads included, for shapes around the register tile (4 or 6 rows, 16 or 32
  columns) and the row blocks, for ties, subnormal, zero and negative-zero products, overflow of
  the products and of the binary16 sums, infinities, and at the boundary max|a| * max|b| = max;
* results do not depend on the thread count.
"""

import math
from fractions import Fraction

import pytest
import torch

import cpd
from cpd import _cpu
from oracle import oracle_cast, oracle_round

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")

MULS = [cpd.E4M3, cpd.E5M2, cpd.E4M3FN, cpd.E2M1]


def _neg(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def ref_dot(arow, bcol, mul, acc=cpd.FP16) -> float:
    """s = round_acc(s + round_mul(a*b)) from s = +0, in k order, each rounding exact."""
    s = 0.0
    for a, b in zip(arow, bcol):
        if math.isfinite(a) and math.isfinite(b):
            p = oracle_round(Fraction(a) * Fraction(b), mul, zero_negative=_neg(a) != _neg(b))
        else:
            p = oracle_cast(a * b, mul)
        if math.isfinite(s) and math.isfinite(p):
            s = oracle_round(Fraction(s) + Fraction(p), acc, zero_negative=_neg(s) and _neg(p))
        else:
            s = oracle_cast(s + p, acc)
    return s


def ref_matmul(a, b, mul):
    B, M, K = a.shape
    N = b.shape[-1]
    a3, b3 = a.tolist(), b.tolist()
    out = [ref_dot(a3[i][m], [b3[i][k][n] for k in range(K)], mul)
           for i in range(B) for m in range(M) for n in range(N)]
    return torch.tensor(out, dtype=torch.float32).reshape(B, M, N)


def ext_matmul(a, b, mul, path):
    """matmul_out with acc = FP16 to nearest; path 0: automatic (the chain), 1: generic."""
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
    _cpu.extension().matmul_out(a, b, out, True, *cpd.ops._fmt_args(mul), *cpd.ops._fmt_args(cpd.FP16), False, 0,
                                cpd.Rounding("nearest").code, False, 32, 0, 0, path)
    return out


def same_bits(x, y):
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


def same_values(x, y):
    """Bits equal, NaN for NaN (the reference does not model NaN payloads)."""
    if not torch.equal(torch.isnan(x), torch.isnan(y)):
        return False
    return same_bits(torch.nan_to_num(x, nan=0.0), torch.nan_to_num(y, nan=0.0))


def mismatch(x, y):
    bad = (x.view(torch.int32) != y.view(torch.int32)).nonzero()[:5].tolist()
    return "; ".join(f"{i}: {x[tuple(i)].item()!r} != {y[tuple(i)].item()!r}" for i in bad)


def check(a, b, mul, oracle=False):
    fast, gen = ext_matmul(a, b, mul, 0), ext_matmul(a, b, mul, 1)
    assert same_bits(fast, gen), mismatch(fast, gen)
    if oracle:
        ref = ref_matmul(a, b, mul)
        assert same_values(fast, ref), mismatch(fast, ref)


def test_chain_takes_these_formats():
    ext = _cpu.extension()
    for mul in MULS:  # binary16 lanes: the chain on x86-64-v3 / AVX-512 builds
        assert ext.matmul_lanes(True, *cpd.ops._fmt_args(mul), *cpd.ops._fmt_args(cpd.FP16), 0, False) in (16, 32)


@pytest.mark.parametrize("mul", MULS, ids=lambda f: f.name)
def test_exact_reference_small(mul):
    """Against the exact reference: random operands (bounded) and at a scale where products
    overflow mul (general form), rows and columns around the register tile."""
    g = torch.Generator().manual_seed(3)
    for scale in (0.25, 1.0, 40.0):
        a = torch.randn(2, 7, 23, generator=g) * scale
        b = torch.randn(2, 23, 19, generator=g)
        a[0, 0, :4] = torch.tensor([0.0, -0.0, 1.5, -2.0 ** -20])
        check(a, b, mul, oracle=True)


@pytest.mark.parametrize("mul", [cpd.E4M3, cpd.E5M2], ids=lambda f: f.name)
def test_shapes_around_tiles_and_row_blocks(mul):
    g = torch.Generator().manual_seed(5)
    for M in (1, 3, 4, 5, 6, 7, 63, 64, 65, 97, 130):
        for N, K in ((1, 9), (15, 1), (16, 33), (17, 8), (33, 3), (70, 20)):
            a = torch.randn(2, M, K, generator=g)
            b = torch.randn(2, K, N, generator=g) * 0.1
            check(a, b, mul)
    check(torch.randn(1, 5, 0), torch.randn(1, 0, 7), mul)  # K = 0: +0
    assert same_bits(ext_matmul(torch.randn(1, 5, 0), torch.randn(1, 0, 7), mul, 0), torch.zeros(1, 5, 7))


@pytest.mark.parametrize("mul", MULS, ids=lambda f: f.name)
def test_ties_subnormals_and_zero_signs(mul):
    """Products on mul's midpoints (ties to even), below its smallest subnormal (to +-0) and
    exactly half of it, zero products of both signs (a row of only -0 products sums to +0),
    sums on binary16 midpoints; against the exact reference."""
    vals = cpd.cast(torch.linspace(-4, 4, 65), mul)
    vals = vals[torch.isfinite(vals)]
    tiny = 2.0 ** (mul.emin - mul.man)  # mul's smallest subnormal
    mids = (vals[1:] + vals[:-1]) / 2  # midpoints of mul's grid (exact in float32)
    extra = torch.tensor([tiny, tiny / 2, -tiny / 2, tiny * 0.75, -tiny * 0.25, tiny * 1.5, -tiny * 2.5, 0.0, -0.0,
                          2.0 ** -24, -(2.0 ** -25), 1 + 2.0 ** -11, 2049.0, -2049.0])
    col = torch.cat([vals, mids, extra])
    K = col.numel()
    a = torch.empty(1, 6, K)
    a[0, 0] = col                         # products: the values themselves (b = 1), in k order
    a[0, 1] = -col
    a[0, 2] = col.flip(0)
    a[0, 3] = 2.0 ** -30                  # every product tiny: +-0 or the smallest subnormals
    a[0, 4] = -0.0                        # every product a zero
    a[0, 5] = 1.0
    b = torch.ones(1, K, 20)
    b[0, :, 1] = -1.0
    b[0, :, 2] = 0.5
    b[0, :, 3] = -0.0
    b[0, :, 4] = 2.0 ** -6
    b[0, :, 5:] = torch.randn(K, 15, generator=torch.Generator().manual_seed(7))
    check(a, b, mul, oracle=True)


@pytest.mark.parametrize("mul", MULS, ids=lambda f: f.name)
def test_bound_edges_overflow_and_infinities(mul):
    """max|a| * max|b| exactly mul's largest value (bounded form, products up to max), one float32
    ulp above it (general form), products that overflow mul (infinity or NaN), binary16 sums that
    overflow to infinity and then meet the other infinity (NaN), infinite operands (inf * 0 = NaN):
    the generic loop's bits, NaN signs and payloads included."""
    top = float(mul.max)
    g = torch.Generator().manual_seed(9)
    K = 600  # 600 products of up to max overflow binary16's 65504 for max >= 110
    for hi in (top, math.nextafter(top, math.inf), 4 * top):
        a = (torch.rand(2, 9, K, generator=g) * 2 - 1)
        a[:, :, 0] = 1.0
        b = (torch.rand(2, K, 18, generator=g) * 2 - 1) * hi
        b[:, 0, 0] = hi
        b[:, :, 1] = hi                                  # one column of large products, both signs
        b[:, : K // 2, 2], b[:, K // 2:, 2] = hi, -hi   # +inf sums then -max products
        check(a, b, mul)
        check(a[:, :, :5].contiguous(), b[:, :5].contiguous(), mul, oracle=True)
    a = torch.randn(1, 5, 8, generator=g)
    a[0, 0, 2], a[0, 1, 3], a[0, 2, 0] = math.inf, -math.inf, 0.0
    b = torch.randn(1, 8, 17, generator=g)
    b[0, 0, 1], b[0, 2, 4], b[0, 3, 5] = math.inf, 0.0, 0.0
    check(a, b, mul, oracle=True)


def test_thread_count_independent():
    g = torch.Generator().manual_seed(13)
    a = torch.randn(2, 150, 64, generator=g)
    b = torch.randn(2, 64, 70, generator=g) * 0.1
    n = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(ext_matmul(a, b, cpd.E4M3, 0))
    finally:
        torch.set_num_threads(n)
    assert all(same_bits(o, outs[0]) for o in outs)
