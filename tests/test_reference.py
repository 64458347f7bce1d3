"""cpd.reference, the readable exact spec of the numerics contract, is itself right (docs/design.md §1, §3).

Invariants defended:
* ``reference.cast`` / ``round_value`` equal the tests' independent oracle (tests/oracle.py,
  which reads only the five format fields and rounds by bracketing codes, a different algorithm
  from the reference's quantum arithmetic) and cpd's kernels, bit for bit: exhaustively over every
  code, midpoint and midpoint ± 1 float32 ulp (and beyond max, infinities, NaN, ±0, float32
  subnormals) of a spread of formats of <= 8 bits, in every deterministic mode with saturate on and
  off; by hypothesis over float32 bit patterns for formats of any width and bias, and over exact
  rationals that are not float32 values;
* ``reference.add`` / ``mul`` equal an exact-sum oracle (Fraction + ``oracle_round`` with IEEE's
  special-value and signed-zero rules) and ``cpd.add`` / ``cpd.mul`` over every pair of codes of a
  6-bit format (inf and NaN included) rounded to several narrower formats; ``reference.fma`` equals
  the oracle and ``cpd.fma`` on sampled triples; all three by hypothesis on float32 operands into
  wider formats;
* ``reference.allreduce`` equals the allreduce order oracle of tests/test_collectives.py and
  ``cpd.allreduce`` for every algorithm, Kahan on/off, deterministic modes;
* the reference imports nothing but the standard library, ``formats`` and ``rounding`` (it is a
  spec, not a wrapper of the kernels); stochastic rounding and bad arguments are clear errors; the
  docstring examples run.
"""

from __future__ import annotations

import ast
import doctest
import math
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import cpd
import cpd.testing
import oracle
from cpd import reference as R
from formats_grid import small_formats
from test_cast_exhaustive import expected, grid_inputs
from test_cast_hypothesis import format_and_inputs
from test_collectives import ref_allreduce, sample

MODES = oracle.DET_MODES

#: A spread of <= 8-bit formats: every specials convention, man = 0 (ties decided by the exponent
#: field), no normal numbers, flush-to-zero, custom biases at both ends of float32's range.
_NAMES = {"e5m2", "e4m3", "e4m3fn", "e3m0", "e3m0fn", "e2m1finite", "e7m0", "e1m2finite", "e4m3nosub",
          "e3m2b10", "e2m1finiteb-1", "e2m3finitenosub"}
SMALL = [f for f in small_formats() if f.name in _NAMES]
SMALL += [f for f in small_formats() if f.name.startswith(("e4m3fnb", "e7m0b"))]  # extreme biases


def same(a: float, b: float) -> bool:
    return oracle.same_f32(a, b)


def bits_equal(got: torch.Tensor, want: list[float]) -> bool:
    w = torch.tensor(want, dtype=torch.float32)
    return bool(((got.view(torch.int32) == w.view(torch.int32)) | (got.isnan() & w.isnan())).all())


def test_spread_of_small_formats():
    assert len(SMALL) >= 12 and len({f.name for f in SMALL}) == len(SMALL)


# --------------------------------------------------------------------------------------- cast
@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
def test_cast_every_code_and_midpoint(fmt):
    xs, want = expected(fmt)  # the oracle's answers, computed once per format
    x = torch.from_numpy(xs)
    for (mode, sat), w in want.items():
        ref = [R.cast(float(v), fmt, mode, saturate=sat) for v in xs]
        bad = [(float(v), a, float(b)) for v, a, b in zip(xs, ref, w) if not same(a, float(b))]
        assert not bad, (fmt.name, mode, sat, len(bad), bad[:5])
        assert bits_equal(cpd.cast(x, fmt, mode, saturate=sat), ref), (fmt.name, mode, sat)


def test_grid_inputs_reach_every_rounding_case():
    """The exhaustive grid contains ties, inexact values and overflows (so the test above can fail)."""
    fmt = cpd.E4M3FN
    xs = grid_inputs(fmt)
    assert 464.0 in xs and 0.0 in xs and math.inf in xs and any(math.isnan(v) for v in xs)
    assert R.cast(464.0, fmt) == 448.0 and math.isnan(R.cast(464.0, fmt, "up"))


@given(format_and_inputs(max_size=24))
def test_cast_any_format_matches_oracle_and_kernel(case):
    fmt, x = case
    xs = x.tolist()
    for mode in MODES:
        for sat in (False, True):
            ref = [R.cast(v, fmt, mode, saturate=sat) for v in xs]
            for v, r in zip(xs, ref):
                assert same(r, oracle.oracle_cast(v, fmt, mode, sat)), (fmt.name, mode, sat, v)
            assert bits_equal(cpd.cast(x, fmt, mode, saturate=sat), ref), (fmt.name, mode, sat)


@st.composite
def rationals(draw):
    """Exact rationals with more significant bits than float32 has, over float32's whole range."""
    num = draw(st.integers(1, 2**70))
    den = draw(st.integers(1, 2**40))
    shift = draw(st.integers(-170, 150))
    q = Fraction(num, den) * Fraction(2) ** shift
    return -q if draw(st.booleans()) else q


@given(cpd.testing.formats(custom_bias=True), rationals(), st.sampled_from(MODES), st.booleans())
def test_round_value_of_rationals_matches_oracle(fmt, q, mode, sat):
    assert same(R.round_value(q, fmt, mode, saturate=sat), oracle.oracle_round(q, fmt, mode, sat))


def test_round_value_named_cases():
    e5m2, e3m0 = cpd.E5M2, cpd.FloatFormat(3, 0)
    assert R.round_value(Fraction(3, 10), e5m2) == 0.3125
    assert R.round_value(61440, e5m2) == math.inf                 # tie at max + ulp/2, max code odd
    assert R.round_value(61440, e5m2, saturate=True) == 57344.0
    assert R.round_value(61440, e5m2, "toward_zero") == 57344.0
    assert R.round_value(-61440, e5m2, "up") == -57344.0 and R.round_value(-61440, e5m2, "down") == -math.inf
    assert R.round_value(6, e3m0) == 8.0 and R.round_value(3, e3m0) == 2.0 and R.round_value(12, e3m0) == 8.0
    assert R.round_value(Fraction(1, 8), e3m0) == 0.0             # half the smallest value: tie to code 0
    assert R.round_value(Fraction(1, 8) + Fraction(1, 2**80), e3m0) == 0.25  # sticky bits far below count
    assert R.round_value(Fraction(-1, 2**30), e5m2, "down") == -(2.0**-16)
    assert math.copysign(1, R.round_value(Fraction(-1, 2**30), e5m2)) < 0  # -tiny -> -0
    nosub = cpd.FloatFormat(5, 2, subnormals=False)
    assert R.round_value(Fraction(5, 2**17), nosub) == 0.0       # 2.5 * 2^-16 -> 2^-15, subnormal: flushed
    assert R.round_value(Fraction(2**14 - 1, 2**28), nosub) == 2.0**-14  # rounds up to the normal: kept
    assert R.round_value(0, e5m2) == 0.0 and math.copysign(1, R.round_value(-0.0, e5m2)) < 0
    assert math.isnan(R.round_value(math.nan, e5m2)) and R.round_value(-math.inf, cpd.E2M1) == -6.0
    assert math.isnan(R.round_value(math.inf, cpd.E4M3FN)) and R.round_value(math.inf, "e5m2", "toward_zero") == math.inf


# --------------------------------------------------------------------------------------- arithmetic
def oracle_add(a: float, b: float, fmt, mode: str, sat: bool) -> float:
    """Exact a + b rounded by the oracle; IEEE specials and the sign of an exact zero sum."""
    if not (math.isfinite(a) and math.isfinite(b)):
        r = a + b
        return math.nan if math.isnan(r) else oracle.oracle_cast(r, fmt, mode, sat)
    q = Fraction(a) + Fraction(b)
    sa, sb = math.copysign(1, a) < 0, math.copysign(1, b) < 0
    zero_neg = sa if (q == 0 and a == 0 and b == 0 and sa == sb) else mode == "down"
    return oracle.oracle_round(q, fmt, mode, sat, zero_negative=zero_neg)


def oracle_mul(a: float, b: float, fmt, mode: str, sat: bool) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        r = a * b
        return math.nan if math.isnan(r) else oracle.oracle_cast(r, fmt, mode, sat)
    neg = (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
    return oracle.oracle_round(Fraction(a) * Fraction(b), fmt, mode, sat, zero_negative=neg)


def oracle_fma(c: float, a: float, b: float, fmt, mode: str, sat: bool) -> float:
    """c + a*b exact, rounded once; a zero result takes IEEE's zero-sum sign of c and the product."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        r = c + a * b
        return math.nan if math.isnan(r) else oracle.oracle_cast(r, fmt, mode, sat)
    p = Fraction(a) * Fraction(b)
    q = Fraction(c) + p
    sc, sp = math.copysign(1, c) < 0, (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
    zero_neg = sc if (c == 0 and p == 0 and sc == sp) else mode == "down"
    return oracle.oracle_round(q, fmt, mode, sat, zero_negative=zero_neg)


def all_codes(fmt) -> list[float]:
    """Every code's value of a format (both signs, inf and NaN included), from the oracle."""
    n = 1 << oracle.nbits(fmt)
    return [oracle.code_value(fmt, c) for c in range(n)]


OPERANDS = all_codes(cpd.FloatFormat(3, 2))  # 64 codes: subnormals, ±0, ±inf, NaN
TARGETS = [cpd.FloatFormat(3, 0), cpd.FloatFormat(2, 1, specials="finite"), cpd.FloatFormat(3, 1, specials="fn"),
           cpd.FloatFormat(3, 1, subnormals=False)]


@pytest.mark.parametrize("fmt", TARGETS, ids=lambda f: f.name)
@pytest.mark.parametrize("op", ["add", "mul"])
def test_every_pair_of_codes(op, fmt):
    a = torch.tensor([x for x in OPERANDS for _ in OPERANDS])
    b = torch.tensor([y for _ in OPERANDS for y in OPERANDS])
    ref_fn, oracle_fn, kernel = {"add": (R.add, oracle_add, cpd.add), "mul": (R.mul, oracle_mul, cpd.mul)}[op]
    pairs = list(zip(a.tolist(), b.tolist()))
    for mode in MODES:
        for sat in ((False, True) if fmt is TARGETS[0] else (False,)):
            ref = [ref_fn(x, y, fmt, mode, saturate=sat) for x, y in pairs]
            bad = [(x, y, r) for (x, y), r in zip(pairs, ref) if not same(r, oracle_fn(x, y, fmt, mode, sat))]
            assert not bad, (op, fmt.name, mode, sat, len(bad), bad[:5])
            assert bits_equal(kernel(a, b, fmt, mode, saturate=sat), ref), (op, fmt.name, mode, sat)


def test_pairs_exercise_every_special_rule():
    """The code pairs above include exact zero sums of each sign, cancellations, inf - inf, 0 * inf."""
    f = TARGETS[0]
    assert math.copysign(1, R.add(-0.0, -0.0, f)) < 0 and math.copysign(1, R.add(0.25, -0.25, f)) > 0
    assert math.copysign(1, R.add(0.25, -0.25, f, "down")) < 0 and math.copysign(1, R.add(-0.0, 0.0, f, "down")) < 0
    assert math.isnan(R.add(math.inf, -math.inf, f)) and math.isnan(R.mul(0.0, math.inf, f))
    assert math.copysign(1, R.mul(-0.0, 3.0, f)) < 0 and R.mul(math.inf, -2.0, f) == -math.inf
    assert R.add(math.inf, 1.0, TARGETS[1]) == 6.0                # no inf in a finite format: max
    assert {-0.0, 0.0, math.inf, -math.inf} <= set(OPERANDS) and any(math.isnan(v) for v in OPERANDS)


@pytest.mark.parametrize("fmt", [cpd.FloatFormat(3, 0), cpd.E4M3FN, cpd.FloatFormat(3, 1, subnormals=False)],
                         ids=lambda f: f.name)
def test_fma_sampled_triples(fmt):
    rng = random.Random(7)
    triples = [tuple(rng.choice(OPERANDS) for _ in range(3)) for _ in range(1500)]
    triples += [(-0.0, -0.0, 1.0), (-0.0, 0.0, 1.0), (0.0, -0.0, 1.0), (0.25, -0.5, 0.5), (-0.0, 0.0, -1.0)]
    c, a, b = (torch.tensor(t) for t in zip(*triples))
    for mode in MODES:
        ref = [R.fma(z, x, y, fmt, mode) for z, x, y in triples]
        for (z, x, y), r in zip(triples, ref):
            assert same(r, oracle_fma(z, x, y, fmt, mode, False)), (fmt.name, mode, z, x, y, r)
        assert bits_equal(cpd.fma(c, a, b, fmt, mode), ref), (fmt.name, mode)


F32_WORDS = st.one_of(st.integers(0, 2**32 - 1),
                      st.sampled_from([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001,
                                       0x00800000, 0x3F800000, 0xBF800000, 0x7F7FFFFF]))


def f32(word: int) -> float:
    return oracle.f32_from_bits(word)


@given(st.sampled_from([cpd.FP16, cpd.BF16, cpd.E5M2, cpd.TF32, cpd.FloatFormat(6, 12, specials="fn")]),
       st.lists(st.tuples(F32_WORDS, F32_WORDS, F32_WORDS), min_size=1, max_size=16),
       st.sampled_from(MODES), st.booleans())
def test_arithmetic_on_float32_operands(fmt, words, mode, sat):
    c, a, b = ([f32(w) for w in col] for col in zip(*words))
    ta, tb, tc = (torch.tensor(v, dtype=torch.float32) for v in (a, b, c))
    checks = [
        (cpd.add(ta, tb, fmt, mode, saturate=sat), [R.add(x, y, fmt, mode, saturate=sat) for x, y in zip(a, b)],
         [oracle_add(x, y, fmt, mode, sat) for x, y in zip(a, b)]),
        (cpd.mul(ta, tb, fmt, mode, saturate=sat), [R.mul(x, y, fmt, mode, saturate=sat) for x, y in zip(a, b)],
         [oracle_mul(x, y, fmt, mode, sat) for x, y in zip(a, b)]),
        (cpd.fma(tc, ta, tb, fmt, mode, saturate=sat),
         [R.fma(z, x, y, fmt, mode, saturate=sat) for z, x, y in zip(c, a, b)],
         [oracle_fma(z, x, y, fmt, mode, sat) for z, x, y in zip(c, a, b)]),
    ]
    for i, (kernel, ref, want) in enumerate(checks):
        assert all(same(r, w) for r, w in zip(ref, want)), (i, fmt.name, mode, sat, a, b, c, ref, want)
        assert bits_equal(kernel, ref), (i, fmt.name, mode, sat, a, b, c, kernel.tolist(), ref)


@given(st.sampled_from([cpd.FP16, cpd.E5M2, cpd.FloatFormat(3, 0)]), st.floats(-8, 8, width=32),
       st.floats(-8, 8, width=32), st.sampled_from(MODES))
def test_add_of_comparable_operands(fmt, x, y, mode):
    """Operands of similar size (cancellations, carries, ties) — rare among raw bit patterns."""
    r = R.add(x, y, fmt, mode)
    assert same(r, oracle_add(x, y, fmt, mode, False))
    assert same(cpd.add(torch.tensor([x]), torch.tensor([y]), fmt, mode).item(), r)


# --------------------------------------------------------------------------------------- allreduce
@pytest.mark.parametrize("algorithm", cpd.ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("kahan", [False, True], ids=["plain", "kahan"])
def test_allreduce_matches_order_oracle_and_kernel(algorithm, kahan):
    for i, (fmt, mode, (w, n)) in enumerate([(cpd.FloatFormat(5, 2), "nearest", (6, 13)),
                                             (cpd.FloatFormat(3, 0), "down", (5, 7)),
                                             (cpd.E4M3FN, "toward_zero", (8, 5)),
                                             (cpd.FP16, "up", (3, 4))]):
        k = {6: 3, 5: 5, 8: 2, 3: 1}[w] if algorithm == "hierarchical" else None
        x = sample(w, n, fmt, 40 + i)
        ref = R.allreduce(x.tolist(), fmt, algorithm=algorithm, group_size=k, kahan=kahan, rounding=mode)
        want = ref_allreduce(x.tolist(), fmt, algorithm, mode, kahan, group_size=k)
        assert all(same(a, b) for a, b in zip(ref, want)), (fmt.name, mode, w, n, ref, want)
        got = cpd.allreduce(x, fmt, algorithm=algorithm, group_size=k, kahan=kahan, rounding=mode)
        assert bits_equal(got, ref), (fmt.name, mode, w, n, got.tolist(), ref)


def test_allreduce_orders_differ():
    """The orders give different bits on one input (so matching each one is a real check):
    worker w holds the value v_w in all 5 elements, so ring element j sums from worker j."""
    v = [0.25, -4.0, 1.0, 2.0, 2.0]
    x = [[a] * 5 for a in v]
    e3m0 = cpd.FloatFormat(3, 0)  # values 0, 0.25, 0.5, 1, 2, 4, 8
    assert R.allreduce(x, e3m0, algorithm="sequential") == [2.0] * 5  # 0.25-4 -> -4; -4+1 = -3: tie -> -2; -2+2+2
    assert R.allreduce(x, e3m0, algorithm="ring") == [2.0, 2.0, 0.0, 1.0, 1.0]
    assert R.allreduce(x, e3m0, algorithm="tree") == [0.0] * 5
    assert R.allreduce(x, e3m0, algorithm="sequential", kahan=True) == [1.0] * 5
    assert R.allreduce(x, e3m0, algorithm="hierarchical", group_size=1) == R.allreduce(x, e3m0, algorithm="ring")
    assert R.allreduce(x, e3m0, algorithm="hierarchical", group_size=5) == R.allreduce(x, e3m0, algorithm="sequential")


def test_allreduce_inputs_in_fmt_and_single_worker():
    assert R.allreduce([[0.3, -0.0]], cpd.E5M2) == [0.3125, -0.0]
    assert R.allreduce([[0.3, -0.0]], cpd.E5M2, inputs_in_fmt=True) == [0.3, -0.0]
    assert R.allreduce([[0.3], [0.3]], cpd.E5M2, algorithm="sequential", inputs_in_fmt=True) == [0.625]
    assert R.allreduce([[0.3], [0.3]], cpd.E5M2, algorithm="sequential") == [0.625]
    assert R.allreduce([[], []], cpd.E5M2, algorithm="tree") == []


# --------------------------------------------------------------------------------------- hygiene
def test_reference_is_a_spec_not_a_wrapper():
    """cpd/reference.py imports only the standard library and cpd's formats and rounding."""
    tree = ast.parse(Path(R.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
    assert imported <= {"__future__", "functools", "math", "fractions", ".formats", ".rounding"}, imported


@pytest.mark.parametrize("call, exc, needle", [
    (lambda: R.cast(1.0, cpd.E5M2, "stochastic"), ValueError, "stochastic"),
    (lambda: R.round_value(Fraction(1, 3), cpd.E5M2, "sideways"), ValueError, "sideways"),
    (lambda: R.round_value("1", cpd.E5M2), TypeError, "q must be"),
    (lambda: R.round_value(1, cpd.E5M2, saturate=1), TypeError, "saturate"),
    (lambda: R.cast(torch.tensor(1.0), cpd.E5M2), TypeError, "x must be a float"),
    (lambda: R.add(1.0, "2", cpd.E5M2), TypeError, "y must be a float"),
    (lambda: R.fma(1.0, 2.0, 3.0, "e9m2"), ValueError, "exp=9"),
    (lambda: R.allreduce([], cpd.E5M2), ValueError, "empty"),
    (lambda: R.allreduce([[1.0], [1.0, 2.0]], cpd.E5M2), ValueError, "rows[1]"),
    (lambda: R.allreduce([[1.0]] * 4, cpd.E5M2, algorithm="butterfly"), ValueError, "butterfly"),
    (lambda: R.allreduce([[1.0]] * 4, cpd.E5M2, algorithm="hierarchical", group_size=3), ValueError, "group_size=3"),
    (lambda: R.allreduce([[1.0]] * 4, cpd.E5M2, algorithm="hierarchical"), TypeError, "group_size"),
    (lambda: R.allreduce([[1.0]] * 4, cpd.E5M2, group_size=2), ValueError, "group_size"),
    (lambda: R.allreduce([[1.0]] * 4, cpd.E5M2, kahan=1), TypeError, "kahan"),
    (lambda: R.allreduce([[1.0]] * 4, cpd.E5M2, rounding="stochastic"), ValueError, "stochastic"),
])
def test_errors(call, exc, needle):
    with pytest.raises(exc) as info:
        call()
    assert needle in str(info.value), str(info.value)


def test_code_helpers_match_the_format():
    for fmt in SMALL + [cpd.FP16, cpd.BF16, cpd.FP32]:
        assert R.max_code(fmt) == fmt.max_code == oracle.max_code(fmt)
        assert R.max_value(fmt) == oracle.max_value(fmt) and float(R.max_value(fmt)) == fmt.max


def test_docstring_examples_run():
    for module in (R, cpd.testing):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, (module.__name__, result)
