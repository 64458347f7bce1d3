"""The binary32 accumulator on float32 lanes (cuda/cpu/matmul.cpp ACC_B32, matmul_f32.h AccB32).

``acc=cpd.FP32`` (IEEE binary32, no saturation) to nearest: a step ``s = round(s + a*b)`` with the
exact product is one fused multiply-add, and with a product rounded to a format whose values are
float32 values (E4M3, E5M2, FP16, ...) the product is exact in float32 and the step is one float32
addition. Invariants defended, on every ISA level the suite builds (tests/test_isa_levels.py):

* every output equals an exact oracle written here: each step's exact rational sum rounded once
  to binary32 by tests/oracle.py (IEEE's sign of an exact zero sum; infinities by IEEE's rules),
  for products and sums on every binade of float32, subnormal sums, overflow, signed zeros,
  plain, Kahan and blocked;
* every output equals the generic path (one output at a time, ``dot_step``) bit for bit, NaN
  payloads included, on ragged shapes (partial tiles, batches, K = 0 and 1) and with NaN and
  infinite operands;
* the result does not depend on the thread count; a thread that flushes float32 subnormals runs
  the generic steps (their bits on that thread);
* the lanes are taken only where they apply: round to nearest, binary32 without saturation, and
  products either exact or rounded on float32 lanes.
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

FP32 = cpd.FP32
MULS = [None, cpd.E4M3, cpd.E5M2, cpd.FP16, cpd.FloatFormat(4, 3, subnormals=False)]
MUL_IDS = ["exact", "e4m3", "e5m2", "fp16", "e4m3-nosub"]


def _lanes(mul, acc, mode=0, saturate=False):
    return _cpu.extension().matmul_lanes(mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc),
                                         mode, saturate)


def _run(a, b, mul, kahan=False, block=0, path=0, saturate=False):
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
    _cpu.extension().matmul_out(a, b, out, mul is not None, *cpd.ops._fmt_args(mul or FP32), *cpd.ops._fmt_args(FP32),
                                kahan, block, 0, saturate, 32, 0, 0, path)
    return out


def _same_bits(x, y):
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


def _mismatch(x, y):
    bad = (x.view(torch.int32) != y.view(torch.int32)).nonzero()[:4].tolist()
    return "; ".join(f"{i}: {x[tuple(i)].item()!r} != {y[tuple(i)].item()!r}" for i in bad)


# ------------------------------------------------------------------------------------ the oracle
def _r32(q: Fraction, zero_negative: bool) -> float:
    return oracle_round(q, FP32, "nearest", zero_negative=zero_negative)


def _neg(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def _add(x: float, y: float) -> float:
    """round32(x + y) for float32 values x, y: exact rational sum rounded once; IEEE 754's rules for
    an exact zero (the common sign, else +0) and for infinities (Python's float arithmetic)."""
    if not (math.isfinite(x) and math.isfinite(y)):
        return x + y
    return _r32(Fraction(x) + Fraction(y), _neg(x) and _neg(y))


def _term(x: float, a: float, b: float, mul) -> float:
    """round32(x + P), P = a*b rounded to mul (oracle_round) or exact (mul None: one rounding)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return x + a * b
    exact = Fraction(a) * Fraction(b)
    p_neg = _neg(a) != _neg(b)
    if mul is not None:
        return _add(x, oracle_round(exact, mul, "nearest", zero_negative=p_neg))
    if not math.isfinite(x):
        return x
    return _r32(Fraction(x) + exact, _neg(x) and p_neg)


def _kahan_add(s: float, c: float, y: float) -> tuple[float, float]:
    t = _add(s, y)
    return t, _add(_add(t, -s), -y)


def oracle_dot(arow, bcol, mul, kahan: bool, block: int) -> float:
    """numerics.h "Accumulation" with acc = binary32, to nearest, from the definition."""
    s = c = bs = 0.0
    K = len(arow)
    for k, (a, b) in enumerate(zip(arow, bcol)):
        if block:
            bs = _term(bs, a, b, mul)
            if (k + 1) % block == 0 or k + 1 == K:
                if kahan:
                    s, c = _kahan_add(s, c, _add(bs, -c))
                else:
                    s = _add(s, bs)
                bs = 0.0
        elif kahan:
            s, c = _kahan_add(s, c, _term(-c, a, b, mul))
        else:
            s = _term(s, a, b, mul)
    return s


def _check_oracle(a, b, mul, kahan, block):
    got = _run(a, b, mul, kahan, block)
    for bi in range(a.shape[0]):
        for i in range(a.shape[1]):
            arow = a[bi, i].tolist()
            for j in range(b.shape[2]):
                want = oracle_dot(arow, b[bi, :, j].tolist(), mul, kahan, block)
                g = got[bi, i, j].item()
                if math.isnan(want):
                    assert math.isnan(g), (bi, i, j, g)
                else:
                    assert g == want and _neg(g) == _neg(want), (bi, i, j, g, want, mul, kahan, block)


# ------------------------------------------------------------------------------------ tests
def test_binary32_lanes_only_where_they_apply():
    if _lanes(None, FP32) != 32:
        assert "fma" not in _cpu.extension().isa() and "avx512" not in _cpu.extension().isa()
        pytest.skip("no fused multiply-add instruction in this build: the float64 lanes serve binary32")
    assert _lanes(cpd.E4M3, FP32) == _lanes(cpd.E5M2, FP32) == _lanes(cpd.FP16, FP32) == 32
    assert _lanes(None, FP32, saturate=True) == 64      # saturating binary32: not the processor's overflow
    assert _lanes(None, FP32, mode=cpd.Rounding("up").code) == 34  # directed: their own lanes (test_matmul_directed.py)
    assert _lanes(None, FP32, mode=cpd.Rounding("stochastic").code) != 32
    assert _lanes(cpd.BF16, FP32) == 64   # bf16 products: not rounded on float32 lanes (round_f's range)
    assert _lanes(None, cpd.FloatFormat(8, 23, subnormals=False)) != 32  # flushing binary32


def _binade_operands(g, shape, lo=-149, hi=127):
    """float32 values on every binade from 2^lo to 2^hi (subnormals included), both signs, zeros."""
    e = torch.randint(lo, hi + 1, shape, generator=g)
    v = torch.ldexp(1 + torch.rand(shape, generator=g), e).float()
    v = torch.where(torch.rand(shape, generator=g) < 0.5, -v, v)
    v.view(-1)[::13] = 0.0
    v.view(-1)[5::17] = -0.0
    return v


@pytest.mark.parametrize("mul", MULS, ids=MUL_IDS)
def test_exact_oracle(mul):
    """Products and sums on every binade (wide exponent spread: cancellations, absorption),
    subnormal sums, overflow to infinity, signed zeros: plain, Kahan and blocked (whichever loop
    the build takes: the binary32 lanes where the processor has an FMA instruction)."""
    g = torch.Generator().manual_seed(3)
    cases = [
        (_binade_operands(g, (1, 3, 23), -75, 63), _binade_operands(g, (1, 23, 5), -75, 63)),   # every binade
        (_binade_operands(g, (1, 2, 17), -80, -60), _binade_operands(g, (1, 17, 4), -80, -60)),  # subnormal sums
        (_binade_operands(g, (1, 2, 19), 60, 64), _binade_operands(g, (1, 19, 4), 60, 64)),     # overflow
        (torch.tensor([[[-0.0, 0.0, -0.0], [-0.0, -0.0, -0.0]]]), torch.tensor([[[1.0], [-2.0], [0.0]]])),  # zeros
    ]
    if mul is not None:  # products that are values of mul's subnormal range and its overflow
        cases.append((_binade_operands(g, (1, 2, 29), -12, 9), _binade_operands(g, (1, 29, 5), -12, 9)))
    for a, b in cases:
        for kahan in (False, True):
            for block in (0, 4):
                _check_oracle(a, b, mul, kahan, block)


@pytest.mark.parametrize("mul", MULS, ids=MUL_IDS)
def test_equals_generic_path_bit_for_bit(mul):
    """Ragged shapes (partial tiles of 64 / 128 lanes, rows of one column, batches, K = 0 and 1) and
    non-finite operands (NaN payloads of both signs, infinities that make inf - inf): every bit of
    the generic path, NaN payloads included on the binary32 lanes (builds without an FMA
    instruction take the float64 lanes, whose NaN results are NaN but keep payloads of their own)."""
    g = torch.Generator().manual_seed(5)
    lanes = _lanes(mul, FP32) == 32
    nans = torch.tensor([0x7FC00123, -0x003FFEDD, 0x7FA00001], dtype=torch.int32).view(torch.float32)
    for B, M, K, N in ((2, 3, 37, 129), (1, 1, 1, 1), (1, 4, 0, 7), (3, 2, 1, 65), (1, 5, 70, 300), (2, 1, 9, 64)):
        a = torch.randn(B, M, K, generator=g) * 4
        b = torch.randn(B, K, N, generator=g)
        if K >= 9:
            a[0, 0, :3] = nans
            a[-1, -1, 4] = math.inf
            b[0, 5, :] = -math.inf
            b[-1, 6, 1::3] = nans[1]
            a[0, -1, 7] = 3e38
            b[0, 7, :5] = 3e38
        for kahan in (False, True):
            for block in (0, 5):
                fast, gen = _run(a, b, mul, kahan, block), _run(a, b, mul, kahan, block, path=1)
                if not lanes:  # the float64 lanes (no FMA instruction): NaN payloads are theirs
                    nan = torch.isnan(gen)
                    assert torch.equal(torch.isnan(fast), nan)
                    fast, gen = fast.masked_fill(nan, 0.0), gen.masked_fill(nan, 0.0)
                assert _same_bits(fast, gen), ((B, M, K, N), kahan, block, _mismatch(fast, gen))


def test_thread_count_independent():
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(2, 33, 41, generator=g), torch.randn(2, 41, 150, generator=g)
    old = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append([_run(a, b, mul, kahan) for mul in (None, cpd.E4M3) for kahan in (False, True)])
    finally:
        torch.set_num_threads(old)
    assert all(_same_bits(x, y) for x, y in zip(*outs))


def test_flush_to_zero_thread_takes_the_generic_steps():
    """Subnormal sums on a calling thread that flushes them (torch.set_flush_denormal; one thread, so
    the tiles run on that thread): the binary32 lanes give the generic steps' bits on that thread.
    (Those are not gradual underflow's: the generic steps' float32 operations flush there too, as
    every CPU loop's do; see docs/performance.md.)"""
    if _lanes(None, FP32) != 32:
        pytest.skip("no binary32 lanes in this build")
    g = torch.Generator().manual_seed(9)
    a, b = _binade_operands(g, (1, 3, 21), -80, -60), _binade_operands(g, (1, 21, 70), -80, -60)
    want = _run(a, b, None, path=1)
    assert (want != 0).any() and (want.abs() < 2.0 ** -126).any()
    old = torch.get_num_threads()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        torch.set_num_threads(1)
        for kahan in (False, True):
            got, gen = _run(a, b, None, kahan), _run(a, b, None, kahan, path=1)
            assert _same_bits(got, gen), _mismatch(got, gen)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(old)


def test_public_matmul_default_accumulator():
    """cpd.matmul(a, b) (acc defaults to FP32) is the fused chain in k order: float64 oracle per step
    (a*b + s is exact in float64 for these small-integer-scaled inputs, so fl32 of it is one rounding)."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-64, 65, (7, 30), generator=g).float() / 8
    b = torch.randint(-64, 65, (30, 11), generator=g).float() / 16
    want = torch.zeros(7, 11)
    for k in range(30):  # every partial sum is a small multiple of 2^-7: exact in float32
        want = (want.double() + a[:, k:k + 1].double() * b[k:k + 1, :].double()).float()
    assert _same_bits(cpd.matmul(a, b), want)
