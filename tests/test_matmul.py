"""cpd.matmul follows its documented order of operations exactly (docs/design.md §3; issue 3).

Invariants defended:
* every output equals an exact reference written here with ``fractions.Fraction``: each output
  accumulates sequentially over k from +0; each product is exact then rounded once to ``mul``
  (``None``: not rounded); each addition is exact then rounded once to ``acc``; Kahan keeps one
  compensation term (y = P - c, t = s + y, c = (t - s) - y, s = t, each rounded); ``block=L``
  sums runs of L products from +0 and adds the run sums in ``acc``; every rounding is
  ``oracle.oracle_round`` (never the kernel's algorithm) with IEEE's sign of an exact zero sum;
* stochastic rounding: every decision is the exact one for the documented random word
  ``(o*K + k)*8 + j`` of the (seed, offset) drawn from the generator;
* the compiled fast paths (round-to-nearest, and stochastic rounding for formats of up to 19
  mantissa bits, on float64 carriers), the compiled generic path and
  the pure-torch fallback (CPD_NO_EXTENSION=1) give the same bits;
* results do not depend on the thread count or on the other columns; inputs are not modified;
* ``cpd::matmul`` passes opcheck; gradients are straight-through; bad arguments are clear errors.
"""

import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.library import opcheck

import cpd
from cpd import _cpu
from cpd.testing import boundary_list
from oracle import oracle_cast, oracle_round, oracle_round_neighbours

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

F52 = cpd.FloatFormat(5, 2)
F510 = cpd.FloatFormat(5, 10)


# --------------------------------------------------------------------------------------- reference
class Ref:
    """Exact reference of one matmul configuration; values are Python floats (float32 values)."""

    def __init__(self, mul, acc, mode="nearest", saturate=False, words=None):
        self.mul, self.acc, self.mode, self.saturate = mul, acc, mode, saturate
        self.words = words  # callable (o, k, j) -> 32-bit word, for stochastic rounding
        self.o = self.k = 0

    def rnd(self, q: Fraction, fmt, zero_negative: bool, j: int) -> float:
        if self.mode != "stochastic":
            return oracle_round(q, fmt, self.mode, self.saturate, zero_negative=zero_negative)
        if q == 0:
            return -0.0 if zero_negative else 0.0
        toward, away, p = oracle_round_neighbours(q, fmt, self.saturate)
        w = self.words(self.o, self.k, j)
        return away if math.floor(p * 2**32) + w >= 2**32 else toward

    @staticmethod
    def neg(x: float) -> bool:
        return math.copysign(1.0, x) < 0

    def zero_sign(self, sx: bool, sy: bool) -> bool:
        """IEEE 754 §6.3: an exact zero sum is -0 iff both addends are negative, or rounding down."""
        return (sx and sy) or (sx != sy and self.mode == "down")

    def special(self, v: float, fmt) -> float:
        """A non-finite operand: float arithmetic (inf - inf = NaN, ...), then the cast's mapping."""
        return oracle_cast(v, fmt, self.mode, self.saturate)

    def add(self, x: float, y: float, j: int) -> float:
        if not (math.isfinite(x) and math.isfinite(y)):
            return self.special(x + y, self.acc)
        return self.rnd(Fraction(x) + Fraction(y), self.acc, self.zero_sign(self.neg(x), self.neg(y)), j)

    def term(self, x: float, a: float, b: float, j: int) -> float:
        """round_acc(x + P): P = round_mul(a*b) (word 0), or the exact a*b rounded once with x."""
        if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(x)):
            p = a * b if self.mul is None else self.special(a * b, self.mul)
            return self.special(x + p, self.acc)
        if self.mul is not None:
            p = self.rnd(Fraction(a) * Fraction(b), self.mul, self.neg(a) != self.neg(b), 0)
            return self.add(x, p, j)
        q = Fraction(x) + Fraction(a) * Fraction(b)
        return self.rnd(q, self.acc, self.zero_sign(self.neg(x), self.neg(a) != self.neg(b)), j)

    def kahan(self, s, c, y, j):
        t = self.add(s, y, j)
        ts = self.add(t, -s, j + 1)
        return t, self.add(ts, -y, j + 2)

    def dot(self, o: int, arow, bcol, kahan=False, block=None) -> float:
        self.o = o
        K = len(arow)
        s, c, bs = 0.0, 0.0, 0.0
        for k in range(K):
            self.k = k
            a, b = arow[k], bcol[k]
            if block:
                bs = self.term(bs, a, b, 1)
                if (k + 1) % block == 0 or k + 1 == K:
                    if kahan:
                        y = self.add(bs, -c, 4)
                        s, c = self.kahan(s, c, y, 5)
                    else:
                        s = self.add(s, bs, 4)
                    bs = 0.0
            elif kahan:
                y = self.term(-c, a, b, 1)
                s, c = self.kahan(s, c, y, 2)
            else:
                s = self.term(s, a, b, 1)
        return s


def ref_matmul(a, b, mul, acc, kahan=False, block=None, mode="nearest", saturate=False, seed_offset=None):
    """The reference on a (..., M, K) @ b (..., K, N), broadcast batch dims."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    a3 = a.expand(*batch, M, K).reshape(-1, M, K).tolist()
    b3 = b.expand(*batch, K, N).reshape(-1, K, N).tolist()
    words = None
    if mode == "stochastic":
        seed, offset = seed_offset
        cache = {}

        def words(o, k, j):
            if o not in cache:
                cache[o] = cpd.ops.random_words(o * K * 8, K * 8, seed, offset).tolist()
            return cache[o][k * 8 + j]

    ref = Ref(mul, acc, mode, saturate, words)
    out = []
    for bi in range(len(a3)):
        for i in range(M):
            for j in range(N):
                o = (bi * M + i) * N + j
                out.append(ref.dot(o, a3[bi][i], [b3[bi][k][j] for k in range(K)], kahan, block))
    return torch.tensor(out, dtype=torch.float32).reshape(*batch, M, N)


def bits_equal(x, y):
    """Same shape and bits; NaNs compare equal to NaNs (their payload and sign are not specified)."""
    if x.shape != y.shape or not torch.equal(torch.isnan(x), torch.isnan(y)):
        return False
    x, y = torch.nan_to_num(x, nan=0.0), torch.nan_to_num(y, nan=0.0)
    return torch.equal(x.contiguous().view(torch.int32), y.contiguous().view(torch.int32))


def inputs(shape_a, shape_b, seed=0, scale_a=1.0, scale_b=1.0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape_a, generator=g) * scale_a
    b = torch.randn(shape_b, generator=g) * scale_b
    # exact zeros of both signs, and values that are already on coarse grids (ties, cancellation)
    a.view(-1)[0] = 0.0
    b.view(-1)[1] = -0.0
    a.view(-1)[2] = 1.5
    b.view(-1)[-1] = 0.75
    return a, b


PAIRS = [(F52, F510), (cpd.E4M3, cpd.BF16), (None, F52), (cpd.E5M2, cpd.FP16), (cpd.BF16, cpd.E4M3FN),
         (None, cpd.FP32), (cpd.FloatFormat(3, 0), cpd.FloatFormat(4, 1, subnormals=False)),
         (cpd.E4M3FNUZ, cpd.FloatFormat.p3109(8, 3)), (None, cpd.E5M2FNUZ)]
PAIR_IDS = [f"{m.name if m else 'exact'}-{a.name}" for m, a in PAIRS]


# --------------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("mul,acc", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("variant", ["plain", "kahan", "block3", "block3-kahan"])
def test_matches_exact_reference(mul, acc, variant):
    kahan = "kahan" in variant
    block = 3 if "block" in variant else None
    a, b = inputs((5, 7), (7, 4), seed=1)
    for ai, bi in ((a, b), (a * 1e-3, b * 1e-3), (a * 40, b)):  # normal, subnormal-heavy, large
        got = cpd.matmul(ai, bi, mul=mul, acc=acc, kahan=kahan, block=block)
        want = ref_matmul(ai, bi, mul, acc, kahan, block)
        assert bits_equal(got, want), (got, want)


@pytest.mark.parametrize("mode", ["toward_zero", "up", "down", "nearest_away", "odd"])
@pytest.mark.parametrize("mul,acc", PAIRS[:3], ids=PAIR_IDS[:3])
def test_directed_modes(mul, acc, mode):
    a, b = inputs((4, 6), (6, 3), seed=2)
    for kahan in (False, True):
        got = cpd.matmul(a, b, mul=mul, acc=acc, kahan=kahan, rounding=mode)
        assert bits_equal(got, ref_matmul(a, b, mul, acc, kahan, None, mode))


def test_fma_flag_is_the_exact_product_path():
    a, b = inputs((5, 7), (7, 4), seed=3)
    got = cpd.matmul(a, b, acc=F52, fma=True)
    assert bits_equal(got, ref_matmul(a, b, None, F52))
    assert bits_equal(got, cpd.matmul(a, b, acc=F52))


def test_batched_broadcast():
    a, b = inputs((2, 3, 5, 6), (3, 6, 4), seed=4)
    for mul, acc in PAIRS[:3]:
        got = cpd.matmul(a, b, mul=mul, acc=acc, kahan=True)
        assert got.shape == (2, 3, 5, 4)
        assert bits_equal(got, ref_matmul(a, b, mul, acc, True))


@pytest.mark.parametrize("mul,acc", PAIRS[:3], ids=PAIR_IDS[:3])
@pytest.mark.parametrize("variant", ["plain", "kahan", "block2-kahan"])
def test_stochastic_decisions_are_exact(mul, acc, variant):
    kahan = "kahan" in variant
    block = 2 if "block" in variant else None
    a, b = inputs((3, 5), (5, 2), seed=6)
    got = cpd.matmul(a, b, mul=mul, acc=acc, kahan=kahan, block=block, rounding="stochastic",
                     generator=torch.Generator().manual_seed(11))
    seed, offset = cpd.ops.draw_seed(torch.Generator().manual_seed(11)).tolist()
    want = ref_matmul(a, b, mul, acc, kahan, block, "stochastic", seed_offset=(seed, offset))
    assert bits_equal(got, want)


@settings(max_examples=25)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 4), st.integers(0, 2**31 - 1),
       st.sampled_from(range(len(PAIRS))), st.booleans(), st.sampled_from([None, 1, 2, 4]),
       st.sampled_from([1e-6, 1.0, 1e3]))
def test_hypothesis_shapes(m, k, n, seed, pair, kahan, block, scale):
    mul, acc = PAIRS[pair]
    a, b = inputs((m, k), (k, n), seed=seed, scale_a=scale) if m * k > 2 and k * n > 1 else (
        torch.randn(m, k) * scale, torch.randn(k, n))
    got = cpd.matmul(a, b, mul=mul, acc=acc, kahan=kahan, block=block)
    assert bits_equal(got, ref_matmul(a, b, mul, acc, kahan, block))


def test_overflow_and_saturate():
    a = torch.tensor([[30000.0, 30000.0, -1.0]])
    b = torch.tensor([[2.0], [2.0], [1.0]])
    assert cpd.matmul(a, b, acc=cpd.FP16).item() == math.inf
    assert cpd.matmul(a, b, acc=cpd.FP16, saturate=True).item() == 65504.0 - 1.0 or \
        cpd.matmul(a, b, acc=cpd.FP16, saturate=True).item() == 65504.0
    assert bits_equal(cpd.matmul(a, b, acc=cpd.FP16, saturate=True),
                      ref_matmul(a, b, None, cpd.FP16, saturate=True))
    assert math.isnan(cpd.matmul(a, b, acc=cpd.E4M3FN).item())


def test_empty_and_k_zero():
    assert cpd.matmul(torch.ones(0, 3), torch.ones(3, 2), acc=F52).shape == (0, 2)
    z = cpd.matmul(torch.ones(2, 0), torch.ones(0, 3), acc=F52)
    assert z.shape == (2, 3) and bits_equal(z, torch.zeros(2, 3))


# --------------------------------------------------------------------------------------- paths agree
def _ext_matmul(a, b, mul, acc, kahan, block, mode, path, seed=(5, -6), sr_bits=32):
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
    mf = mul or acc
    _cpu.extension().matmul_out(a, b, out, mul is not None, *cpd.ops._fmt_args(mf), *cpd.ops._fmt_args(acc), kahan,
                                block, cpd.Rounding(mode).code, False, sr_bits, seed[0], seed[1], path)
    return out


@pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")
@pytest.mark.parametrize("mul,acc", PAIRS, ids=PAIR_IDS)
def test_fast_path_equals_generic_path(mul, acc):
    g = torch.Generator().manual_seed(8)
    for scale in (1.0, 1e-5, 1e3):
        a = torch.randn(2, 9, 70, generator=g) * scale
        b = torch.randn(2, 70, 67, generator=g)
        a[0, 0, :5] = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0])
        for kahan in (False, True):
            for block, mode, sr_bits in ((0, "nearest", 32), (16, "nearest", 32), (0, "stochastic", 32),
                                         (16, "stochastic", 32), (5, "stochastic", 4)):
                gen = _ext_matmul(a, b, mul, acc, kahan, block, mode, 1, sr_bits=sr_bits)
                for path in (0, 2):  # automatic (float32 lanes where they apply), float64 lanes
                    assert bits_equal(_ext_matmul(a, b, mul, acc, kahan, block, mode, path, sr_bits=sr_bits), gen)


# Pairs on the float32-lane path (cuda/cpu/matmul.cpp f32_applies: round to nearest, both formats
# with numerics.h's float32 rounding, mul's values within acc's, acc of at most 11 bits), and on
# the binary16-lane path when acc is binary16 (h16_applies, CPUs with AVX512-FP16).
F32_PAIRS = [(F52, F510), (cpd.E4M3, cpd.FP16), (cpd.E4M3FN, cpd.FP16), (cpd.E2M1, cpd.FP16), (F52, F52),
             (cpd.E3M2, cpd.FloatFormat(4, 6)), (cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(5, 6)),
             (cpd.FloatFormat(3, 1), cpd.FloatFormat(4, 2, subnormals=False)),
             (cpd.FloatFormat(4, 3, specials="finite"), cpd.FloatFormat(6, 4, specials="fn")),
             (cpd.E4M3, cpd.BF16), (cpd.E5M2, cpd.BF16), (cpd.FloatFormat(4, 3, subnormals=False), cpd.BF16),
             (cpd.E4M3, cpd.FloatFormat(8, 7, subnormals=False))]


# matmul_out's path argument: automatic (binary16 lanes where they apply), float32 lanes (round_f
# where it applies), float32 lanes on integer-lane rounding only, float32 lanes with Kahan's steps on
# guarded lanes (matmul_f32.h kahan_guarded_lanes)
LANE_PATHS = (0, 3, 4, 5)


def _bits_mismatch(x, y):
    bad = (x.view(torch.int32) != y.view(torch.int32)).nonzero()[:5].tolist()
    return "; ".join(f"{i}: {x[tuple(i)].item()!r} != {y[tuple(i)].item()!r}" for i in bad)


@pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")
def test_float32_lanes_only_where_they_apply():
    ext = _cpu.extension()
    lanes = lambda mul, acc, mode=0, saturate=False: ext.matmul_lanes(  # noqa: E731
        mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc), mode, saturate)
    assert lanes(F52, F510) in (16, 32)  # binary16 lanes where the CPU has AVX512-FP16 (acc is binary16)
    assert lanes(F52, F510, saturate=True) == 32 and lanes(F52, cpd.FloatFormat(5, 9)) == 32
    assert lanes(F52, F510, mode=cpd.Rounding("up").code) == 34  # directed: their own lanes (test_matmul_directed.py)
    # stochastic: the stochastic float32 lanes (33, tests/test_matmul_sr_lanes.py), float64 lanes for more bits
    assert lanes(F52, F510, mode=cpd.Rounding("stochastic").code) == 33
    assert lanes(F52, cpd.FloatFormat(5, 12), mode=cpd.Rounding("stochastic").code) == 64
    # fused products (no mul): float32 lanes with the midpoint redo; binary16 rounding by
    # conversion (F16C, Arm FCVT) where the build has it
    assert lanes(None, F510) in (16, 32) and lanes(None, cpd.BF16) == 32 and lanes(None, F52) == 32
    assert lanes(None, F510, mode=cpd.Rounding("stochastic").code) == 33
    assert lanes(None, cpd.FloatFormat(5, 11)) == 64  # acc over 11 bits: Figueroa's identity fails
    assert lanes(cpd.E4M3, cpd.BF16) == 32          # BF16: integer-lane rounding
    assert lanes(cpd.E4M3, cpd.FloatFormat(8, 12)) == 64
    assert lanes(F510, F52) == 64                   # products not values of acc
    assert lanes(cpd.FloatFormat(3, 0), F510) == 64  # man = 0: "even" is the even code
    assert lanes(F52, cpd.FloatFormat(5, 10, subnormals=False)) == 64  # subnormal products
    assert lanes(cpd.E4M3, cpd.FloatFormat(5, 10, subnormals=False)) == 32  # ... all >= 2^-14


@pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")
@pytest.mark.parametrize("mul,acc", F32_PAIRS, ids=[f"{m.name}-{a.name}" for m, a in F32_PAIRS])
def test_float32_lane_path_equals_generic_path(mul, acc):
    """Products: every value, midpoint and midpoint +- 1 float32 ulp of mul (both signs, zeros,
    infinities, NaN) times powers of two, odd multiples and random values (K = 1, so each output
    is round_acc(+0 + round_mul(a*b))); sums: K = 97 of such products, plain, Kahan and blocked."""
    ext = _cpu.extension()
    assert ext.matmul_lanes(True, *cpd.ops._fmt_args(mul), *cpd.ops._fmt_args(acc), 0, False) in (16, 32)
    vals = torch.tensor(boundary_list(mul), dtype=torch.float32)
    payload_nans = torch.tensor([0x7FC00123, -0x003FFEDD], dtype=torch.int32).view(torch.float32)  # +-NaN, payloads
    vals = torch.cat([vals, -vals, torch.tensor([math.nan]), payload_nans])
    g = torch.Generator().manual_seed(11)
    scales = [2.0 ** e for e in range(-30, 31, 3)] + [1.5, 3.0, 5.0, 0.75, 1 / 3, -1.0, 0.0, math.inf]
    scales = torch.tensor(scales + torch.randn(12, generator=g).tolist(), dtype=torch.float32)
    no_nan = lambda t: torch.where(torch.isnan(t), torch.zeros(()), t)  # noqa: E731

    def check(a, b, kahan=False, block=0):
        # NaN operands take the float32 lanes even where binary16 lanes apply (to keep NaN
        # payloads), so every case also runs with its NaNs replaced by zeros
        for a_ in (a, no_nan(a)):
            gen = _ext_matmul(a_, b, mul, acc, kahan, block, "nearest", 1)
            for path in LANE_PATHS:
                fast = _ext_matmul(a_, b, mul, acc, kahan, block, "nearest", path)
                assert bits_equal(fast, gen), _bits_mismatch(fast, gen)

    check(vals.reshape(1, -1, 1), scales.reshape(1, 1, -1))
    # sums of products that are values of mul (so ties and overflow in acc are common), and of
    # random products, at several magnitudes
    idx = torch.randint(0, len(vals) - 1, (3, 24, 97), generator=g)
    a = vals[idx]
    a = torch.where(torch.isfinite(a), a, torch.zeros(()))
    a[0, 0, 3] = math.inf
    a[2, 0, 4] = -math.inf
    a[0, 1, 5] = math.nan
    a[1, 2, 7] = payload_nans[0]  # a NaN operand with a payload: kept bit for bit on every path
    for b in (torch.ones(3, 97, 33), torch.randn(3, 97, 33, generator=g), 2.0 ** -12 * torch.randn(3, 97, 33, generator=g),
              torch.randint(-4, 5, (3, 97, 33), generator=g).float() * 0.5):
        for kahan in (False, True):
            for block in (0, 8):
                check(a, b, kahan, block)


@pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")
@pytest.mark.parametrize("mul,acc", [(F52, F510), (cpd.E4M3, cpd.BF16), (cpd.E5M2, cpd.FloatFormat(6, 7)),
                                     (None, cpd.FP16), (None, F52)], ids=lambda f: getattr(f, "name", str(f)))
def test_lane_tiles_across_many_columns(mul, acc):
    """Rows wider than several tiles (64 lanes, or 128 on AVX-512 builds), with a partial last
    tile and a batch: every lane path equals the generic one, plain, Kahan and blocked (the tiles'
    column offsets, the live-lane count and b's column blocks are each checked against it)."""
    g = torch.Generator().manual_seed(31)
    for n in (129, 300):
        a = torch.randn(2, 5, 37, generator=g)
        b = torch.randn(2, 37, n, generator=g) * 0.5
        for kahan in (False, True):
            for block in (0, 5):
                gen = _ext_matmul(a, b, mul, acc, kahan, block, "nearest", 1)
                for path in LANE_PATHS:
                    fast = _ext_matmul(a, b, mul, acc, kahan, block, "nearest", path)
                    assert bits_equal(fast, gen), (n, kahan, block, path, _bits_mismatch(fast, gen))


# Accumulators for fused steps (no mul: each step rounds x + a*b once) on float32 lanes
FUSED_ACCS = [F510, cpd.BF16, F52, cpd.FloatFormat(6, 7), cpd.FloatFormat(4, 3, subnormals=False),
              cpd.FloatFormat(5, 6, specials="fn"), cpd.FloatFormat(3, 2, specials="finite")]


def _near_midpoint_inputs(acc, g):
    """a, b (1, 2K) x (2K, N) whose even steps put s on values of acc and whose odd steps add a
    product a*b = h + e with h half a quantum of s and e far below float32's resolution at s, so
    that fl32(s + a*b) is a midpoint of acc while s + a*b is not (or, e = 0, is one exactly)."""
    K, N = 40, 16
    a = torch.empty(1, 2 * K)
    b = torch.empty(2 * K, N)
    vals = torch.ldexp(torch.rand(256, generator=g) + 1, torch.randint(-6, 10, (256,), generator=g))
    vals = cpd.cast(vals * (torch.randint(0, 2, (256,), generator=g) * 2 - 1), acc)
    vals = vals[torch.isfinite(vals) & (vals.abs() >= 2.0 ** (acc.emin + 1))]
    for k in range(K):
        # step 2k: s becomes (about) a value v of acc; step 2k + 1: + half a quantum of v, nudged
        v = vals[torch.randint(0, len(vals), (1,), generator=g)].item()
        a[0, 2 * k] = 1.0
        b[2 * k] = v
        q = 2.0 ** (math.frexp(abs(v))[1] - 1 - acc.man)  # the quantum at v
        a[0, 2 * k + 1] = (q / 2) * (1 + 2.0 ** -23)
        b[2 * k + 1] = torch.tensor([1.0, 1 - 2.0 ** -24, 1 + 2.0 ** -23, -1.0, -(1 - 2.0 ** -24), 0.5,
                                     1 / (1 + 2.0 ** -23), 1.0 - 2.0 ** -23] * 2)[:N]
    return a.reshape(1, 1, -1), b.reshape(1, *b.shape)


@pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")
@pytest.mark.parametrize("acc", FUSED_ACCS, ids=[a.name for a in FUSED_ACCS])
def test_fused_lane_path_equals_generic_path(acc):
    """No mul: float32 lanes round fl32(x + a*b) (one FMA) to acc and redo the lanes where that
    lands on a midpoint of acc. Sums of random products at several magnitudes, of products that
    are exact midpoints, and of products that make fl32 land on a midpoint the exact sum is not
    (the double rounding the redo exists for); plain, Kahan and blocked, against the generic path."""
    ext = _cpu.extension()
    assert ext.matmul_lanes(False, *cpd.ops._fmt_args(acc), *cpd.ops._fmt_args(acc), 0, False) in (16, 32)
    g = torch.Generator().manual_seed(21)
    cases = [_near_midpoint_inputs(acc, g)]
    for scale in (1.0, 2.0 ** -12, 300.0):
        a = torch.randn(2, 5, 53, generator=g) * scale
        cases.append((a, torch.randn(2, 53, 70, generator=g)))
    steps = torch.randint(-8, 9, (1, 6, 53), generator=g).float() * 0.125  # sums on coarse grids: exact midpoints
    cases.append((steps, torch.randint(-3, 4, (1, 53, 9), generator=g).float() * 0.5))
    a, b = cases[1]
    a = a.clone()
    a[0, 0, :4] = torch.tensor([math.inf, -math.inf, math.nan, 0.0])
    cases.append((a, b))
    for a, b in cases:
        for kahan in (False, True):
            for block in (0, 4):
                gen = _ext_matmul(a, b, None, acc, kahan, block, "nearest", 1)
                for path in LANE_PATHS:
                    fast = _ext_matmul(a, b, None, acc, kahan, block, "nearest", path)
                    assert bits_equal(fast, gen), (path, kahan, block, _bits_mismatch(fast, gen))


_FALLBACK_SCRIPT = r"""
import torch, cpd, sys
g = torch.Generator().manual_seed(3)
a, b = torch.randn(2, 4, 11, generator=g), torch.randn(11, 5, generator=g)
outs = []
for kw in [dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10)), dict(mul=cpd.E4M3, acc=cpd.BF16, kahan=True),
           dict(acc=cpd.FloatFormat(5, 2), block=3, kahan=True), dict(acc=cpd.FP16, fma=True, rounding="stochastic",
           generator=torch.Generator().manual_seed(1)), dict(mul=cpd.E5M2, acc=cpd.BF16, rounding="down", kahan=True),
           dict(mul=cpd.E4M3, acc=cpd.FP16, rounding="stochastic", sr_bits=3, block=4, kahan=True,
                generator=torch.Generator().manual_seed(9))]:
    outs.append(cpd.matmul(a, b, **kw))
outs.append(cpd.sum(a, 2, acc=cpd.BF16, kahan=True))
outs.append(cpd.sum(a, acc=cpd.FloatFormat(5, 4), rounding="stochastic", generator=torch.Generator().manual_seed(2)))
torch.save(outs, sys.argv[1])
"""


@pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")
def test_fallback_equals_compiled(tmp_path):
    paths = {}
    for name, env in (("ext", {}), ("torch", {"CPD_NO_EXTENSION": "1"})):
        paths[name] = tmp_path / f"{name}.pt"
        subprocess.run([sys.executable, "-c", _FALLBACK_SCRIPT, str(paths[name])], check=True, timeout=300,
                       env={**os.environ, **env}, cwd=Path(__file__).resolve().parent)
    for x, y in zip(torch.load(paths["ext"]), torch.load(paths["torch"])):
        assert bits_equal(x, y)


# --------------------------------------------------------------------------------------- independence
def test_thread_count_independent():
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(33, 70, generator=g), torch.randn(70, 130, generator=g)
    old = torch.get_num_threads()
    try:
        res = []
        for n in (1, 2):
            torch.set_num_threads(n)
            res.append([cpd.matmul(a, b, mul=cpd.E5M2, acc=F510, kahan=True),
                        cpd.matmul(a, b, acc=cpd.FP16, rounding="stochastic",
                                   generator=torch.Generator().manual_seed(4))])
    finally:
        torch.set_num_threads(old)
    for x, y in zip(*res):
        assert bits_equal(x, y)


def test_columns_and_rows_independent():
    g = torch.Generator().manual_seed(10)
    a, b = torch.randn(6, 40, generator=g), torch.randn(40, 90, generator=g)
    full = cpd.matmul(a, b, mul=cpd.E4M3, acc=cpd.BF16)
    for j in (0, 63, 64, 89):
        assert bits_equal(full[:, j:j + 1], cpd.matmul(a, b[:, j:j + 1], mul=cpd.E4M3, acc=cpd.BF16))
    assert bits_equal(full[2:3], cpd.matmul(a[2:3], b, mul=cpd.E4M3, acc=cpd.BF16))


def test_inputs_not_modified_and_noncontiguous():
    g = torch.Generator().manual_seed(12)
    a, b = torch.randn(7, 5, generator=g), torch.randn(4, 7, generator=g)
    a0, b0 = a.clone(), b.clone()
    got = cpd.matmul(a.t(), b.t(), mul=cpd.E5M2, acc=F510)
    assert bits_equal(a, a0) and bits_equal(b, b0)
    assert bits_equal(got, cpd.matmul(a.t().contiguous(), b.t().contiguous(), mul=cpd.E5M2, acc=F510))


def test_half_inputs_upcast_exactly():
    g = torch.Generator().manual_seed(13)
    a, b = torch.randn(3, 4, generator=g).half(), torch.randn(4, 2, generator=g).bfloat16()
    assert bits_equal(cpd.matmul(a, b, acc=F510), cpd.matmul(a.float(), b.float(), acc=F510))


def test_kahan_reduces_error_on_long_sums():
    g = torch.Generator().manual_seed(14)
    K = 4096
    a = torch.rand(8, K, generator=g)
    b = torch.ones(K, 1)
    exact = a.double().sum(1, keepdim=True)
    plain = (cpd.matmul(a, b, acc=cpd.FP16).double() - exact).abs().max().item()
    comp = (cpd.matmul(a, b, acc=cpd.FP16, kahan=True).double() - exact).abs().max().item()
    # plain fp16 stagnates (sum ~2048 has ulp 2, the addends are < 1); Kahan stays within a few ulps
    assert comp < plain / 20
    assert comp <= 4 * 2.0


# --------------------------------------------------------------------------------------- op, autograd
def test_opcheck():
    g = torch.Generator().manual_seed(15)
    a = torch.randn(2, 3, 4, generator=g, requires_grad=True)
    b = torch.randn(4, 5, generator=g, requires_grad=True)
    mul, acc = cpd.ops._fmt_spec(cpd.E5M2), cpd.ops._fmt_spec(F510)
    for rounding in (0, 1):
        seed = cpd.ops.draw_seed(torch.Generator().manual_seed(1))
        opcheck(torch.ops.cpd.matmul.default, (a, b, seed, mul, acc, True, 0, rounding, False, 32))
    opcheck(torch.ops.cpd.matmul.default, (a, b, cpd.ops._zero_seed(torch.device("cpu")), [], acc, False, 2,
                                           0, False, 32))


def test_gradients_straight_through():
    g = torch.Generator().manual_seed(16)
    a = torch.randn(2, 3, 4, generator=g, requires_grad=True)
    b = torch.randn(4, 5, generator=g, requires_grad=True)
    y = cpd.matmul(a, b, mul=cpd.E5M2, acc=F510)
    gy = torch.randn(y.shape, generator=g)
    ga, gb = torch.autograd.grad(y, (a, b), gy)
    ea, eb = torch.autograd.grad(torch.matmul(a, b), (a, b), gy)
    assert torch.allclose(ga, ea) and torch.allclose(gb, eb)
    # broadcast batch dims: gradients are reduced to each operand's shape
    a2 = torch.randn(2, 1, 3, 4, generator=g, requires_grad=True)
    b2 = torch.randn(5, 4, 2, generator=g, requires_grad=True)
    y2 = cpd.matmul(a2, b2, acc=cpd.BF16)
    assert y2.shape == (2, 5, 3, 2)
    gy2 = torch.randn(y2.shape, generator=g)
    got = torch.autograd.grad(y2, (a2, b2), gy2)
    want = torch.autograd.grad(torch.matmul(a2, b2), (a2, b2), gy2)
    for x, w in zip(got, want):
        assert x.shape == w.shape and torch.allclose(x, w, atol=1e-5)


# --------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("call,exc,match", [
    (lambda a, b: cpd.matmul([[1.0]], b), TypeError, "a must be a torch.Tensor"),
    (lambda a, b: cpd.matmul(a.double(), b), TypeError, "a has dtype torch.float64"),
    (lambda a, b: cpd.matmul(a, b.int()), TypeError, "b has dtype torch.int32"),
    (lambda a, b: cpd.matmul(a, b.t()), ValueError, r"shapes \(3, 4\) and \(5, 4\)"),
    (lambda a, b: cpd.matmul(a[0], b), ValueError, "at least 2 dims"),
    (lambda a, b: cpd.matmul(a.expand(2, 3, 4), b.expand(3, 4, 5)), ValueError, "do not broadcast"),
    (lambda a, b: cpd.matmul(a, b, acc="e9m3"), ValueError, "exp=9"),
    (lambda a, b: cpd.matmul(a, b, mul="e4m3", acc=cpd.FloatFormat(5, 24)), ValueError, "man=24"),
    (lambda a, b: cpd.matmul(a, b, acc=None), TypeError, "acc"),
    (lambda a, b: cpd.matmul(a, b, mul=cpd.E5M2, fma=True), ValueError, "mul must be None"),
    (lambda a, b: cpd.matmul(a, b, block=0), ValueError, "block must be >= 1"),
    (lambda a, b: cpd.matmul(a, b, block=2.0), TypeError, "block"),
    (lambda a, b: cpd.matmul(a, b, kahan=1), TypeError, "kahan"),
    (lambda a, b: cpd.matmul(a, b, rounding="sideways"), ValueError, "sideways"),
    (lambda a, b: cpd.matmul(a, b, generator=torch.Generator()), ValueError, "generator"),
    (lambda a, b: cpd.matmul(a, b, saturate="yes"), TypeError, "saturate"),
])
def test_errors(call, exc, match):
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with pytest.raises(exc, match=match):
        call(a, b)
