"""cpd.add, cpd.mul and cpd.fma are the exact result rounded once (numerics.h, "Exact arithmetic
rounded once"), checked against ``fractions.Fraction`` and ``oracle.oracle_round``.

Invariants defended: for a few hundred operand pairs/triples per format, including huge exponent
gaps (the sticky tail), exact and near cancellation, float32 subnormals and results in the
format's subnormal range, every deterministic mode gives the oracle's bits with IEEE's sign of an
exact zero sum; stochastic rounding takes the exact decision for element i's word i.
"""

import math
import struct
import zlib
from fractions import Fraction

import pytest
import torch

import cpd
from oracle import oracle_round, oracle_round_neighbours

FMTS = [cpd.FloatFormat(5, 2), cpd.FloatFormat(5, 10), cpd.BF16, cpd.E4M3FN, cpd.FP32, cpd.FloatFormat(3, 0),
        cpd.FloatFormat(8, 3, bias=140, subnormals=False), cpd.E4M3FNUZ, cpd.FloatFormat.p3109(8, 3, signed=False),
        cpd.E8M0]
MODES = ["nearest", "toward_zero", "up", "down", "nearest_away", "odd"]


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def operands(n: int, seed: int):
    """float32 values with exponents spread over the whole range, in related pairs."""
    g = torch.Generator().manual_seed(seed)
    mant = torch.randint(0, 1 << 23, (3, n), generator=g)
    field = torch.randint(0, 255, (3, n), generator=g)  # 0 (subnormals) .. 254
    near = torch.randint(100, 140, (3, n), generator=g)
    field = torch.where(torch.rand(3, n, generator=g) < 0.6, near, field)  # mostly near 1, some far
    sign = torch.randint(0, 2, (3, n), generator=g)
    bits = (sign << 31) | (field << 23) | mant
    vals = [[f32(v) for v in row] for row in bits.tolist()]
    x, y, z = vals
    for i in range(0, n, 5):  # cancellation: y = -x (exact zero) or -x one ulp away
        y[i] = -x[i] if i % 10 == 0 else -f32(struct.unpack("<I", struct.pack("<f", x[i]))[0] + 1)
    for i in range(1, n, 7):  # huge gaps
        y[i] = x[i] * 2.0**-60 if math.isfinite(x[i] * 2.0**-60) else y[i]
        y[i] = f32(struct.unpack("<I", struct.pack("<f", y[i]))[0] | 1) if y[i] != 0 else y[i]
    return [torch.tensor(v, dtype=torch.float32) for v in (x, y, z)]


def neg(v: float) -> bool:
    return math.copysign(1.0, v) < 0


def zero_neg(sx: bool, sy: bool, mode: str) -> bool:
    return (sx and sy) or (sx != sy and mode == "down")


def bits_equal(x, y):
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@pytest.mark.parametrize("mode", MODES)
def test_add_mul_fma_match_oracle(fmt, mode):
    x, y, z = operands(300, seed=zlib.crc32(f"{fmt.name}{mode}".encode()) % 1000)
    xs, ys, zs = x.tolist(), y.tolist(), z.tolist()
    got_add = cpd.add(x, y, fmt, mode)
    got_mul = cpd.mul(x, y, fmt, mode)
    z_small = z * 2.0**-100  # c + a*b with products near c's magnitude
    got_fma = cpd.fma(z_small, x, y, fmt, mode)
    want_add, want_mul, want_fma = [], [], []
    for a, b, c in zip(xs, ys, z_small.tolist()):
        want_add.append(oracle_round(Fraction(a) + Fraction(b), fmt, mode, zero_negative=zero_neg(neg(a), neg(b), mode)))
        want_mul.append(oracle_round(Fraction(a) * Fraction(b), fmt, mode, zero_negative=neg(a) != neg(b)))
        q = Fraction(c) + Fraction(a) * Fraction(b)
        want_fma.append(oracle_round(q, fmt, mode, zero_negative=zero_neg(neg(c), neg(a) != neg(b), mode)))
    for got, want in ((got_add, want_add), (got_mul, want_mul), (got_fma, want_fma)):
        want = torch.tensor(want, dtype=torch.float32)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert bits_equal(torch.nan_to_num(got, nan=0.0), torch.nan_to_num(want, nan=0.0))


@pytest.mark.parametrize("fmt", FMTS[:4], ids=lambda f: f.name)
@pytest.mark.parametrize("op", ["add", "mul", "fma"])
def test_stochastic_decisions_exact(fmt, op):
    x, y, z = operands(200, seed=7)
    z = z * 2.0**-100
    gen_seed = 99
    gen = torch.Generator().manual_seed(gen_seed)
    if op == "fma":
        got = cpd.fma(z, x, y, fmt, "stochastic", generator=gen)
    else:
        got = getattr(cpd, op)(x, y, fmt, "stochastic", generator=gen)
    seed, offset = cpd.ops.draw_seed(torch.Generator().manual_seed(gen_seed)).tolist()
    words = cpd.ops.random_words(0, x.numel(), seed, offset).tolist()
    for i, (a, b, c) in enumerate(zip(x.tolist(), y.tolist(), z.tolist())):
        if op == "add":
            q, zn = Fraction(a) + Fraction(b), neg(a) and neg(b)
        elif op == "mul":
            q, zn = Fraction(a) * Fraction(b), neg(a) != neg(b)
        else:
            q, zn = Fraction(c) + Fraction(a) * Fraction(b), neg(c) and (neg(a) != neg(b))
        if q == 0:
            want = -0.0 if zn else 0.0
        else:
            toward, away, p = oracle_round_neighbours(q, fmt)
            want = away if math.floor(p * 2**32) + words[i] >= 2**32 else toward
        assert torch.equal(torch.isnan(got[i:i + 1]), torch.isnan(torch.tensor([want]))), (i, a, b, c)
        if not math.isnan(want):
            assert bits_equal(got[i:i + 1], torch.tensor([want], dtype=torch.float32)), (i, a, b, c)
