"""The emulated allreduce sums in exactly the documented order, rounding once per hop (docs/design.md §3).

Invariants defended:
* every algorithm (ring, hierarchical with every group size, tree, sequential), with and without
  Kahan compensation, in every deterministic rounding mode, gives the bits of a slow scalar
  reference written here with exact rational arithmetic (``fractions.Fraction`` rounded by
  ``oracle_round``) that follows the docstring's order step by step;
* with ``fmt=FP32`` and integer-valued inputs every algorithm gives the exact sum; with FP32 and
  random inputs it is within float32 round-off of ``torch.sum``;
* stochastic rounding is reproducible under the same generator / global seed;
* inputs are never modified; both input layouts (list, leading-W tensor) agree;
* bad arguments are clear TypeError/ValueError naming them.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import cpd
from oracle import oracle_cast, oracle_round, same_f32

FMTS = [cpd.FloatFormat(5, 2), cpd.E4M3, cpd.FloatFormat(3, 0), cpd.FP16]
DET_MODES = ["nearest", "toward_zero", "up", "down"]
#: (W, n) pairs: odd sizes not divisible by W, a single element, W a power of two or not.
SIZES = [(3, 5), (4, 13), (6, 13), (8, 5), (6, 1)]


# ------------------------------------------------------------------------------- exact reference
def ref_add(a: float, b: float, fmt, mode: str, saturate: bool) -> float:
    """Exact a + b rounded once to fmt, with IEEE's special-value and signed-zero rules."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        r = a + b
        return math.nan if math.isnan(r) else oracle_cast(r, fmt, mode, saturate)
    q = Fraction(a) + Fraction(b)
    if a == 0 and b == 0 and math.copysign(1, a) == math.copysign(1, b):
        neg = math.copysign(1, a) < 0
    else:
        neg = mode == "down"
    return oracle_round(q, fmt, mode, saturate, zero_negative=neg)


class RefAcc:
    """The docstring's accumulation step on scalars: plain, or Kahan with a travelling compensation."""

    def __init__(self, fmt, mode, saturate, kahan):
        self.fmt, self.mode, self.saturate, self.kahan = fmt, mode, saturate, kahan

    def a(self, x, y):
        return ref_add(x, y, self.fmt, self.mode, self.saturate)

    def merge(self, s, c, x, cx=None):
        if not self.kahan:
            return self.a(s, x), None
        if cx is not None:
            c = self.a(c, cx)
        y = self.a(x, -c)
        t = self.a(s, y)
        c = self.a(self.a(t, -s), -y)
        return t, c


def np_chunks(n, p):
    q, r = divmod(n, p)
    out, start = [], 0
    for c in range(p):
        size = q + (c < r)
        out.append(range(start, start + size))
        start += size
    return out


def ref_ring(acc, vals, comps):
    """vals[p][j] (and comps or None): ring across P participants, returns the reduced list."""
    p, n = len(vals), len(vals[0])
    if p == 1:
        return list(vals[0])
    out = [None] * n
    for c, idx in enumerate(np_chunks(n, p)):
        for j in idx:
            s = vals[c][j]
            cc = (comps[c][j] if comps is not None else 0.0) if acc.kahan else None
            for h in range(1, p):
                w = (c + h) % p
                s, cc = acc.merge(s, cc, vals[w][j], comps[w][j] if comps is not None else None)
            out[j] = s
    return out


def ref_sequential(acc, rows):
    n = len(rows[0])
    s = list(rows[0])
    c = [0.0] * n if acc.kahan else None
    for r in rows[1:]:
        for j in range(n):
            s[j], cj = acc.merge(s[j], c[j] if c else None, r[j])
            if c is not None:
                c[j] = cj
    return s, c


def ref_allreduce(xs, fmt, algorithm, mode, kahan, saturate=False, group_size=None, inputs_in_fmt=False):
    """xs: list of W lists of Python floats (float32 values). Returns the list every worker gets."""
    acc = RefAcc(fmt, mode, saturate, kahan)
    w = len(xs)
    if not inputs_in_fmt:
        xs = [[oracle_cast(v, fmt, mode, saturate) for v in row] for row in xs]
    if algorithm == "ring":
        return ref_ring(acc, xs, None)
    if algorithm == "sequential":
        return ref_sequential(acc, xs)[0]
    if algorithm == "hierarchical":
        k = group_size
        sums, comps = [], []
        for g in range(w // k):
            s, c = ref_sequential(acc, xs[g * k:(g + 1) * k])
            sums.append(s)
            comps.append(c)
        return ref_ring(acc, sums, comps if kahan else None)
    # tree: recursive halving, documented level by level
    n = len(xs[0])
    p = [list(r) for r in xs]
    c = [[0.0] * n for _ in range(w)] if kahan else None
    step = 1
    while step < w:
        for i in range(0, w, 2 * step):
            if i + step < w:
                for j in range(n):
                    p[i][j], cj = acc.merge(p[i][j], c[i][j] if c else None, p[i + step][j],
                                            c[i + step][j] if c else None)
                    if c is not None:
                        c[i][j] = cj
        step *= 2
    return p[0]


# ------------------------------------------------------------------------------- helpers
def sample(w, n, fmt, seed):
    """Values spread over the format's range: zeros, tiny (underflowing), mid and near-max."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-3, 2, (w, n), generator=g).float()) * torch.randn(w, n, generator=g)
    x = mag * (fmt.max / 8)
    x[torch.rand(w, n, generator=g) < 0.1] = 0.0
    tiny = torch.rand(w, n, generator=g) < 0.1
    x[tiny] = x[tiny] * fmt.smallest_subnormal / fmt.max
    return x


def bits_same(got: torch.Tensor, want: list) -> bool:
    return all(same_f32(float(a), b) for a, b in zip(got.tolist(), want))


def cases(algorithm):
    for w, n in SIZES:
        if algorithm == "hierarchical":
            for k in [d for d in range(1, w + 1) if w % d == 0]:
                yield w, n, k
        else:
            yield w, n, None


# ------------------------------------------------------------------------------- bit-exact order
@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@pytest.mark.parametrize("mode", DET_MODES)
@pytest.mark.parametrize("kahan", [False, True], ids=["plain", "kahan"])
@pytest.mark.parametrize("algorithm", cpd.ALLREDUCE_ALGORITHMS)
def test_matches_exact_reference(fmt, mode, kahan, algorithm):
    for seed, (w, n, k) in enumerate(cases(algorithm)):
        x = sample(w, n, fmt, seed)
        got = cpd.allreduce(list(x), fmt, algorithm=algorithm, group_size=k, kahan=kahan, rounding=mode)
        want = ref_allreduce(x.tolist(), fmt, algorithm, mode, kahan, group_size=k)
        assert got.shape == (n,)
        assert bits_same(got, want), (w, n, k, got.tolist(), want)


@pytest.mark.parametrize("algorithm", cpd.ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("fmt", [cpd.E4M3FN, cpd.FloatFormat(3, 0)], ids=lambda f: f.name)
def test_saturate_and_overflow_match_reference(algorithm, fmt):
    for saturate in (False, True):
        for seed, (w, n, k) in enumerate(cases(algorithm)):
            x = sample(w, n, fmt, 100 + seed) * 6  # many overflows
            got = cpd.allreduce(x, fmt, algorithm=algorithm, group_size=k, kahan=True, saturate=saturate)
            want = ref_allreduce(x.tolist(), fmt, algorithm, "nearest", True, saturate, group_size=k)
            assert bits_same(got, want), (saturate, w, n, k, got.tolist(), want)


@pytest.mark.parametrize("algorithm", cpd.ALLREDUCE_ALGORITHMS)
def test_inputs_in_fmt_skips_the_cast(algorithm):
    fmt = cpd.FloatFormat(5, 2)
    x = sample(6, 13, fmt, 7)  # not in fmt: the reference adds them exactly without casting
    k = 2 if algorithm == "hierarchical" else None
    got = cpd.allreduce(x, fmt, algorithm=algorithm, group_size=k, inputs_in_fmt=True)
    want = ref_allreduce(x.tolist(), fmt, algorithm, "nearest", False, group_size=k, inputs_in_fmt=True)
    assert bits_same(got, want)
    xc = cpd.cast(x, fmt)
    assert torch.equal(cpd.allreduce(xc, fmt, algorithm=algorithm, group_size=k, inputs_in_fmt=True),
                       cpd.allreduce(x, fmt, algorithm=algorithm, group_size=k))


def test_ring_visits_chunks_from_their_owner():
    """A hand-checked case: in (3, 0) 1 + 1 + 8 and 8 + 1 + 1 differ, so the order is visible."""
    fmt = cpd.FloatFormat(3, 0)  # values 0, 0.25 (subnormal), 0.5, 1, 2, 4, 8
    x = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [4.0, 4.0, 4.0]])
    # chunk 0 starts at worker 0: 1 + 1 = 2, 2 + 4 = 6 is a tie between 4 (code 5) and 8 (code 6) -> 8
    # chunk 1 starts at worker 1: 1 + 4 = 5 -> 4, 4 + 1 = 5 -> 4;  chunk 2 at worker 2: 4 + 1 -> 4, + 1 -> 4
    got = cpd.allreduce(x, fmt, algorithm="ring")
    assert got.tolist() == [8.0, 4.0, 4.0]
    assert cpd.allreduce(x, fmt, algorithm="sequential").tolist() == [8.0, 8.0, 8.0]


# ------------------------------------------------------------------------------- fp32 sanity
@pytest.mark.parametrize("algorithm", cpd.ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("kahan", [False, True])
def test_fp32_integers_are_exact(algorithm, kahan):
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-1000, 1000, (8, 101), generator=g).float()
    k = 4 if algorithm == "hierarchical" else None
    assert torch.equal(cpd.allreduce(x, cpd.FP32, algorithm=algorithm, group_size=k, kahan=kahan), x.sum(0))


@pytest.mark.parametrize("algorithm", cpd.ALLREDUCE_ALGORITHMS)
def test_fp32_close_to_torch_sum(algorithm):
    x = torch.randn(16, 1000, 3, generator=torch.Generator().manual_seed(4))
    k = 4 if algorithm == "hierarchical" else None
    got = cpd.allreduce(list(x), cpd.FP32, algorithm=algorithm, group_size=k)
    assert got.shape == (1000, 3)
    exact = x.double().sum(0)
    bound = 16 * 2.0**-24 * x.double().abs().sum(0)
    assert ((got.double() - exact).abs() <= bound).all()


def test_single_worker_is_the_cast():
    x = torch.randn(1, 33)
    for a in cpd.ALLREDUCE_ALGORITHMS:
        k = 1 if a == "hierarchical" else None
        assert torch.equal(cpd.allreduce(x, cpd.E5M2, algorithm=a, group_size=k, kahan=True), cpd.cast(x[0], cpd.E5M2))


def test_empty_and_multidim_tensors():
    x = torch.empty(4, 0, 3)
    assert cpd.allreduce(x, cpd.E5M2).shape == (0, 3)
    y = torch.randn(4, 2, 3, 5)
    assert torch.equal(cpd.allreduce(y, "e5m2"), cpd.allreduce(list(y), cpd.E5M2).reshape(2, 3, 5))


# ------------------------------------------------------------------------------- stochastic
@pytest.mark.parametrize("algorithm", cpd.ALLREDUCE_ALGORITHMS)
def test_stochastic_reproducible(algorithm):
    x = torch.randn(6, 257, generator=torch.Generator().manual_seed(5))
    k = 3 if algorithm == "hierarchical" else None
    run = lambda s: cpd.allreduce(x, cpd.E5M2, algorithm=algorithm, group_size=k, rounding="stochastic",  # noqa: E731
                                  kahan=True, generator=torch.Generator().manual_seed(s))
    a, b, c = run(1), run(1), run(2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(9)
    d = cpd.allreduce(x, cpd.E5M2, algorithm=algorithm, group_size=k, rounding="stochastic")
    torch.manual_seed(9)
    assert torch.equal(d, cpd.allreduce(x, cpd.E5M2, algorithm=algorithm, group_size=k, rounding="stochastic"))


def test_stochastic_is_unbiased_on_average():
    x = torch.full((8, 20000), 0.3)  # 0.3 is not in E5M2; nearest gives a biased 8 * 0.3125-ish sum
    got = cpd.allreduce(x, cpd.E5M2, rounding="stochastic", generator=torch.Generator().manual_seed(0))
    assert abs(got.double().mean().item() - 2.4) < 0.02  # per-element std ~0.3, 20000 samples


# ------------------------------------------------------------------------------- inputs & errors
def test_inputs_not_mutated():
    xs = [torch.randn(13) for _ in range(6)]
    copies = [t.clone() for t in xs]
    stacked = torch.stack(xs)
    s_copy = stacked.clone()
    for a in cpd.ALLREDUCE_ALGORITHMS:
        k = 2 if a == "hierarchical" else None
        cpd.allreduce(xs, cpd.E4M3, algorithm=a, group_size=k, kahan=True)
        cpd.allreduce(stacked, cpd.E4M3, algorithm=a, group_size=k, rounding="up")
    assert all(torch.equal(a, b) for a, b in zip(xs, copies)) and torch.equal(stacked, s_copy)


def test_half_inputs_upcast():
    x = torch.randn(4, 9).half()
    assert torch.equal(cpd.allreduce(x, cpd.E5M2), cpd.allreduce(x.float(), cpd.E5M2))


@pytest.mark.parametrize("kwargs, exc, needle", [
    (dict(tensors=[]), ValueError, "empty"),
    (dict(tensors=torch.empty(0, 3)), ValueError, "worker"),
    (dict(tensors=torch.tensor(1.0)), ValueError, "0-d"),
    (dict(tensors=[torch.zeros(3), torch.zeros(4)]), ValueError, "shape"),
    (dict(tensors=[torch.zeros(3), torch.zeros(3, dtype=torch.int32)]), TypeError, "int32"),
    (dict(tensors=torch.zeros(2, 3, dtype=torch.float64)), TypeError, "float64"),
    (dict(tensors=[torch.zeros(3), "x"]), TypeError, "tensors[1]"),
    (dict(tensors=3.0), TypeError, "tensors"),
    (dict(algorithm="butterfly"), ValueError, "butterfly"),
    (dict(algorithm="hierarchical"), ValueError, "group_size"),
    (dict(algorithm="hierarchical", group_size=4), ValueError, "group_size=4"),
    (dict(algorithm="hierarchical", group_size=0), ValueError, "group_size=0"),
    (dict(algorithm="hierarchical", group_size=2.0), TypeError, "group_size"),
    (dict(algorithm="ring", group_size=2), ValueError, "group_size"),
    (dict(kahan=1), TypeError, "kahan"),
    (dict(rounding="sideways"), ValueError, "sideways"),
    (dict(generator=torch.Generator()), ValueError, "generator"),
])
def test_errors(kwargs, exc, needle):
    args = dict(tensors=[torch.zeros(3)] * 6)
    args.update(kwargs)
    tensors = args.pop("tensors")
    with pytest.raises(exc, match=None) as info:
        cpd.allreduce(tensors, cpd.E5M2, **args)
    assert needle in str(info.value), str(info.value)


def test_inputs_requiring_grad_are_fine():
    xs = [torch.randn(7, requires_grad=True) for _ in range(4)]
    out = cpd.allreduce(xs, cpd.E5M2, kahan=True)
    assert not out.requires_grad and torch.equal(out, cpd.allreduce([x.detach() for x in xs], cpd.E5M2, kahan=True))


def test_hierarchical_extremes():
    """k = W is the sequential sum; k = 1 (plain) is the ring."""
    x = torch.randn(6, 29, generator=torch.Generator().manual_seed(11)) * 100
    for mode in DET_MODES:
        for kahan in (False, True):
            h = cpd.allreduce(x, cpd.E4M3, algorithm="hierarchical", group_size=6, rounding=mode, kahan=kahan)
            s = cpd.allreduce(x, cpd.E4M3, algorithm="sequential", rounding=mode, kahan=kahan)
            assert torch.equal(h.view(torch.int32), s.view(torch.int32))
        h1 = cpd.allreduce(x, cpd.E4M3, algorithm="hierarchical", group_size=1, rounding=mode)
        assert torch.equal(h1.view(torch.int32), cpd.allreduce(x, cpd.E4M3, rounding=mode).view(torch.int32))
