"""Stochastic rounding is exact, unbiased, reproducible and thread-count independent.

Invariants defended (docs/design.md §2, §3, §5):
* (a) exactness: element i rounds away from zero iff floor(p * 2^k) + (w_i >> (32 - k)) >= 2^k,
  where p is the exact fractional distance (tests/oracle.py), k = sr_bits (32 by default) and
  w_i = random_words(i, seed, offset) with (seed, offset) drawn from the generator exactly as cpd
  draws them; checked element by element, including the subnormal range, inputs far below the
  quantum (d > 25 and d > 32 dropped bits), overflow and specials. The random words themselves are
  Philox4x32-10, checked against the Random123 known-answer vectors and a pure-Python Philox.
* (b) unbiasedness: the mean of many stochastic roundings of x is within 5 standard errors of x;
* (c) reproducibility: the same torch.manual_seed / generator seed gives the same bits, the
  generator advances by exactly one draw_seed per cast, different seeds give different bits;
* (d) identical bits with 1 and 2 threads on >= 1M elements;
* (e) with sr_bits = k, P(up) = floor(p * 2^k) / 2^k: distances below 2^-k never round up.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import cpd
import oracle
from cpd.ops import draw_seed, random_words

M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------------- Philox
def py_philox(c, k, rounds=10):
    """Philox4x32 in plain Python integers (Salmon et al., SC'11)."""
    c0, c1, c2, c3 = c
    k0, k1 = k
    for i in range(rounds):
        if i:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
    return [c0, c1, c2, c3]


def py_word(i: int, seed: int, offset: int) -> int:
    seed, offset, block = seed & (2**64 - 1), offset & (2**64 - 1), i >> 2
    return py_philox([block & M32, block >> 32, offset & M32, offset >> 32], [seed & M32, seed >> 32])[i & 3]


def test_philox_known_answers():
    """Random123's kat_vectors for philox4x32_10."""
    assert py_philox([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert py_philox([M32] * 4, [M32, M32]) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert py_philox([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    assert random_words(0, 4, 0, 0).tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("start,seed,offset", [(0, 1, 2), (5, -1, -(2**63)), (2**40 + 3, 2**62 + 12345, 7),
                                               (2**33 - 2, -123456789, 2**63 - 1)])
def test_random_words_are_philox(start, seed, offset):
    got = random_words(start, 9, seed, offset)
    assert got.dtype == torch.int64
    assert got.tolist() == [py_word(start + j, seed, offset) for j in range(9)]


def test_draw_seed_is_one_randint():
    g, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    s = draw_seed(g)
    assert s.dtype == torch.int64 and s.shape == (2,)
    assert torch.equal(s, torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=g2))


# ---------------------------------------------------------------------------------- (a) exactness
def _exactness_inputs(fmt) -> torch.Tensor:
    g = torch.Generator().manual_seed(99)
    q_sub = fmt.smallest_subnormal
    parts = [
        # around 1 and across the normal range
        torch.ldexp(torch.rand(1024, generator=g) + 1, torch.randint(fmt.emin, fmt.emax + 1, (1024,), generator=g)),
        # below the smallest subnormal by 0..40 binades: d = 23 + j dropped bits (d > 25, d > 32)
        torch.ldexp(torch.rand(1024, generator=g) + 1, torch.arange(1024) % 41 - 41 + int(math.log2(q_sub))),
        # subnormal range of the format
        torch.rand(512, generator=g) * fmt.smallest_normal,
        # between max and the overflow boundary and beyond
        fmt.max * (1 + torch.rand(256, generator=g) * 2.0 ** -fmt.man),
        torch.tensor([fmt.max, fmt.max * 2, 3e38, math.inf, math.nan, 0.0, 1.0, q_sub, q_sub / 2, q_sub / 3]),
    ]
    x = torch.cat(parts).float()
    x = x[(x.abs() <= 3.4e38) | ~torch.isfinite(x)]
    sign = torch.randint(0, 2, x.shape, generator=g) * 2 - 1
    return x * sign


SR_FORMATS = [cpd.E5M2, cpd.E4M3FN, cpd.FP16, cpd.BF16, cpd.E2M1, cpd.FloatFormat(3, 0),
              cpd.FloatFormat(5, 4, subnormals=False), cpd.FloatFormat(4, 3, bias=147)]


@pytest.mark.parametrize("fmt", SR_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("saturate", [False, True])
def test_every_decision_is_exact(fmt, saturate):
    x = _exactness_inputs(fmt)
    xs = x.tolist()
    nb = [oracle.oracle_neighbours(v, fmt, saturate) for v in xs]
    for k in (None, 1, 3, 8, 32):
        g, g2 = torch.Generator().manual_seed(2024), torch.Generator().manual_seed(2024)
        got = cpd.cast(x, fmt, "stochastic", saturate=saturate, sr_bits=k, generator=g).tolist()
        seed, offset = draw_seed(g2).tolist()
        words = random_words(0, len(xs), seed, offset).tolist()
        kk = 32 if k is None else k
        n_up = 0
        for i, (xi, (lo, hi, p), w, gi) in enumerate(zip(xs, nb, words, got)):
            up = math.floor(p * 2**kk) + (w >> (32 - kk)) >= 2**kk
            want = hi if up else lo
            n_up += up and p > 0
            assert oracle.same_f32(gi, want), (fmt.name, k, i, xi, lo, hi, p, w, gi)
        assert n_up > 0


def test_carry_boundary_is_exact():
    """frac + word == 2^32 - 1 must not round up, frac + word == 2^32 must (the carry out of bit
    31). Such inputs are built from the known words: in E5M2's subnormal range x = M * 2^(-16-d)
    with M in [2^23, 2^24) has d dropped bits and frac = M * 2^(32-d) for d in 24..32."""
    n = 1 << 16
    g, g2 = torch.Generator().manual_seed(31337), torch.Generator().manual_seed(31337)
    seed, offset = draw_seed(g2).tolist()
    words = random_words(0, n, seed, offset).tolist()
    xs, want_up = [], []
    for i, w in enumerate(words):
        x, up = 0.75, None
        target = 2**32 - 1 if i % 2 else 2**32  # the largest sum that does not carry / the smallest that does
        for s in range(0, 9):
            f = target - w
            if f % (1 << s) == 0 and (1 << 23) <= (f >> s) < (1 << 24):
                x, up = math.ldexp(f >> s, -16 - (32 - s)), target == 2**32
                break
        xs.append(x)
        want_up.append(up)
    y = cpd.cast(torch.tensor(xs), cpd.E5M2, "stochastic", generator=g).tolist()
    checked = 0
    for x, up, yi, w in zip(xs, want_up, y, words):
        if up is None:
            continue
        lo, hi, p = oracle.oracle_neighbours(x, cpd.E5M2)
        assert math.floor(p * 2**32) + w == (2**32 if up else 2**32 - 1)
        assert yi == (hi if up else lo), (x, w, up, yi)
        checked += 1
    assert checked > 200 and sum(u for u in want_up if u is not None) > 100


def test_word_order_is_logical_for_non_contiguous_inputs():
    g = torch.Generator().manual_seed(5)
    base = torch.rand(64, 33, generator=g) * 3
    xt = base.t()  # non-contiguous view
    a = cpd.cast(xt, cpd.E4M3, "stochastic", generator=torch.Generator().manual_seed(1))
    b = cpd.cast(xt.contiguous(), cpd.E4M3, "stochastic", generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------------- (b) unbiasedness
@pytest.mark.parametrize("fmt,x", [
    (cpd.E5M2, 1 + 1 / 3), (cpd.E5M2, -1000.0), (cpd.E4M3FN, 0.1), (cpd.E5M2, 3e-6),  # subnormal range
    (cpd.E5M2, 1.5 * 2.0 ** -26),  # d = 33 dropped bits, p = 1.5 * 2^-10
    (cpd.FP16, math.pi), (cpd.BF16, 1e-3), (cpd.E2M1, 2.9),
])
def test_unbiased(fmt, x):
    n = 1 << 21
    x = float(np.float32(x))
    lo, hi, p = oracle.oracle_neighbours(x, fmt)
    assert 0 < p < 1
    torch.manual_seed(0)
    y = cpd.cast(torch.full((n,), x), fmt, "stochastic").double()
    assert set(torch.unique(y).tolist()) == {lo, hi}
    se = abs(hi - lo) * math.sqrt(float(p * (1 - p)) / n)
    assert abs(y.mean().item() - x) < 5 * se, (y.mean().item(), x, se)


# ---------------------------------------------------------------------------------- (c) reproducibility
def _x(n=10_001):
    return torch.rand(n, generator=torch.Generator().manual_seed(3)) * 10


def test_manual_seed_reproduces():
    x = _x()
    torch.manual_seed(123)
    a = cpd.cast(x, cpd.E5M2, "stochastic")
    b = cpd.cast(x, cpd.E5M2, "stochastic")  # the generator advanced: different bits
    torch.manual_seed(123)
    a2 = cpd.cast(x, cpd.E5M2, "stochastic")
    assert torch.equal(a, a2)
    assert not torch.equal(a, b)


def test_generator_reproduces_and_advances_by_one_draw():
    x = _x()
    g1, g2, g3 = (torch.Generator().manual_seed(42) for _ in range(3))
    a = cpd.cast(x, cpd.E4M3, "stochastic", generator=g1)
    b = cpd.cast(x, cpd.E4M3, "stochastic", generator=g2)
    assert torch.equal(a, b)
    draw_seed(g3)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g3))
    state = torch.get_rng_state()
    cpd.cast(x, cpd.E4M3, "stochastic", generator=g1)
    assert torch.equal(torch.get_rng_state(), state), "generator= must not touch the global RNG"


def test_different_seeds_differ():
    x = _x()
    a = cpd.cast(x, cpd.E4M3, "stochastic", generator=torch.Generator().manual_seed(1))
    b = cpd.cast(x, cpd.E4M3, "stochastic", generator=torch.Generator().manual_seed(2))
    assert not torch.equal(a, b)
    # each element differs with probability 2p(1-p), about 1/3 on average for uniform p
    assert 0.25 < (a != b).float().mean().item() < 0.42


def test_encode_stochastic_matches_cast():
    x = _x()
    c = cpd.encode(x, cpd.E4M3, "stochastic", generator=torch.Generator().manual_seed(9), sr_bits=5)
    v = cpd.cast(x, cpd.E4M3, "stochastic", generator=torch.Generator().manual_seed(9), sr_bits=5)
    assert torch.equal(cpd.decode(c, cpd.E4M3), v)


# ---------------------------------------------------------------------------------- (d) threads
def test_same_bits_on_one_and_two_threads():
    n = (1 << 20) + 3  # not a multiple of 4: the tail block of the Philox loop too
    x = torch.randn(n, generator=torch.Generator().manual_seed(11)) * 100
    before = torch.get_num_threads()
    try:
        res = {}
        for t in (1, 2):
            torch.set_num_threads(t)
            res[t] = [cpd.cast(x, fmt, "stochastic", generator=torch.Generator().manual_seed(77), sr_bits=k)
                      for fmt in (cpd.E5M2, cpd.FP16) for k in (None, 4)]
            res[t].append(cpd.cast(x, cpd.E4M3FN, "nearest"))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(res[1], res[2]):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    # the last elements use the words their index says
    g2 = torch.Generator().manual_seed(77)
    seed, offset = draw_seed(g2).tolist()
    tail = x[-7:].tolist()
    words = random_words(n - 7, 7, seed, offset).tolist()
    for xi, w, yi in zip(tail, words, res[2][0][-7:].tolist()):
        lo, hi, p = oracle.oracle_neighbours(xi, cpd.E5M2)
        assert yi == (hi if math.floor(p * 2**32) + w >= 2**32 else lo)


# ---------------------------------------------------------------------------------- (e) sr_bits
@pytest.mark.parametrize("k", [1, 3, 8])
def test_sr_bits_never_rounds_up_below_two_to_minus_k(k):
    # E5M2 around 1: quantum 0.25; a distance just below 2^-k quanta never rounds up
    lo = 1.0
    torch.manual_seed(100 + k)
    x = lo + 0.25 * (2.0 ** -k - 2.0 ** -20)
    y = cpd.cast(torch.full((1 << 18,), x), cpd.E5M2, "stochastic", sr_bits=k)
    assert bool((y == lo).all())
    # and just at 2^-k it does, with probability 2^-k
    x = lo + 0.25 * 2.0 ** -k
    y = cpd.cast(torch.full((1 << 18,), x), cpd.E5M2, "stochastic", sr_bits=k)
    rate = (y > lo).double().mean().item()
    se = math.sqrt(2.0 ** -k * (1 - 2.0 ** -k) / y.numel())
    assert abs(rate - 2.0 ** -k) < 5 * se


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("p", [Fraction(1, 3), Fraction(5, 7), Fraction(1, 2), Fraction(15, 16) + Fraction(1, 64)])
def test_sr_bits_quantizes_the_probability(k, p):
    n = 1 << 20
    x = float(np.float32(1.0 + 0.25 * float(p)))  # E5M2: neighbours 1.0 and 1.25
    p_exact = (Fraction(x) - 1) * 4  # p itself, to float32 precision
    want = Fraction(math.floor(p_exact * 2**k), 2**k)
    torch.manual_seed(k)
    y = cpd.cast(torch.full((n,), x), cpd.E5M2, "stochastic", sr_bits=k)
    rate = (y == 1.25).double().mean().item()
    se = math.sqrt(max(float(want * (1 - want)), 1e-12) / n)
    assert abs(rate - float(want)) <= 5 * se, (k, p, rate, float(want))


def test_sr_bits_32_is_the_default():
    x = _x()
    a = cpd.cast(x, cpd.E5M2, "stochastic", generator=torch.Generator().manual_seed(8))
    b = cpd.cast(x, cpd.E5M2, "stochastic", sr_bits=32, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
