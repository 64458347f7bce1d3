"""cpd.sum accumulates sequentially in its documented order, every add rounded once (issue 3).

Invariants defended:
* each output is the exact reference (``fractions.Fraction`` + ``oracle.oracle_round``, written
  here): s = +0; for the elements along ``dim`` in increasing index (``dim=None``: all elements in
  row-major order) s = round_acc(s + x_k); Kahan: y = round(x_k - c), t = round(s + y),
  c = round(round(t - s) - y), s = t;
* stochastic rounding takes word (o*K + k)*8 + j (j = 1 the add, 2-4 Kahan's) of the drawn
  (seed, offset), with the exact decision;
* shapes follow torch.sum (dim, negative dim, keepdim, dim=None); thread count does not matter;
  inputs are not modified; errors are clear; gradients are straight-through (ones).
"""

import math
from fractions import Fraction

import pytest
import torch

import cpd
from oracle import oracle_round, oracle_round_neighbours

F52 = cpd.FloatFormat(5, 2)


def bits_equal(x, y):
    return x.shape == y.shape and torch.equal(x.contiguous().view(torch.int32), y.contiguous().view(torch.int32))


def neg(v: float) -> bool:
    return math.copysign(1.0, v) < 0


def ref_sum_rows(rows, acc, kahan=False, mode="nearest", seed_offset=None):
    """rows: list of lists of floats; returns one float per row (row index = output index o)."""
    out = []
    for o, row in enumerate(rows):
        K = len(row)
        words = cpd.ops.random_words(o * K * 8, K * 8, *seed_offset).tolist() if mode == "stochastic" else None

        def add(x, y, k, j):
            q = Fraction(x) + Fraction(y)
            zneg = (neg(x) and neg(y)) or (neg(x) != neg(y) and mode == "down")
            if mode != "stochastic":
                return oracle_round(q, acc, mode, False, zero_negative=zneg)
            if q == 0:
                return -0.0 if zneg else 0.0
            toward, away, p = oracle_round_neighbours(q, acc)
            return away if math.floor(p * 2**32) + words[k * 8 + j] >= 2**32 else toward

        s, c = 0.0, 0.0
        for k, x in enumerate(row):
            if kahan:
                y = add(x, -c, k, 1)
                t = add(s, y, k, 2)
                c = add(add(t, -s, k, 3), -y, k, 4)
                s = t
            else:
                s = add(s, x, k, 1)
        out.append(s)
    return out


def data(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 6, shape, generator=g).float())
    x.view(-1)[0] = -0.0
    return x


@pytest.mark.parametrize("acc", [F52, cpd.E5M2, cpd.BF16, cpd.FloatFormat(5, 10), cpd.E4M3FN], ids=lambda f: f.name)
@pytest.mark.parametrize("kahan", [False, True])
@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "down", "nearest_away", "odd"])
def test_matches_exact_reference_along_dims(acc, kahan, mode):
    x = data((3, 9, 4), seed=1)
    for dim in (0, 1, -1):
        got = cpd.sum(x, dim, acc=acc, kahan=kahan, rounding=mode)
        moved = x.movedim(dim, -1)
        want = torch.tensor(ref_sum_rows(moved.reshape(-1, moved.shape[-1]).tolist(), acc, kahan, mode))
        assert bits_equal(got, want.reshape(moved.shape[:-1]))


def test_dim_none_row_major_and_keepdim():
    x = data((4, 5), seed=2)
    got = cpd.sum(x, acc=cpd.E5M2)
    assert got.shape == ()
    assert bits_equal(got, torch.tensor(ref_sum_rows([x.reshape(-1).tolist()], cpd.E5M2)[0]))
    assert cpd.sum(x, acc=cpd.E5M2, keepdim=True).shape == (1, 1)
    assert cpd.sum(x, 1, acc=cpd.E5M2, keepdim=True).shape == (4, 1)
    assert bits_equal(cpd.sum(x.t(), 0, acc=cpd.E5M2), cpd.sum(x, 1, acc=cpd.E5M2))


@pytest.mark.parametrize("kahan", [False, True])
def test_stochastic_decisions_are_exact(kahan):
    x = data((3, 7), seed=3)
    got = cpd.sum(x, 1, acc=F52, kahan=kahan, rounding="stochastic", generator=torch.Generator().manual_seed(21))
    so = cpd.ops.draw_seed(torch.Generator().manual_seed(21)).tolist()
    assert bits_equal(got, torch.tensor(ref_sum_rows(x.tolist(), F52, kahan, "stochastic", so)))


def test_kahan_beats_plain_on_long_sums():
    g = torch.Generator().manual_seed(4)
    x = torch.rand(4, 2000, generator=g)
    exact = x.double().sum(1)
    plain = (cpd.sum(x, 1, acc=cpd.BF16).double() - exact).abs().max()
    comp = (cpd.sum(x, 1, acc=cpd.BF16, kahan=True).double() - exact).abs().max()
    assert comp < plain / 10


def test_thread_count_and_no_mutation():
    x = data((64, 300), seed=5)
    x0 = x.clone()
    old = torch.get_num_threads()
    try:
        res = []
        for n in (1, 2):
            torch.set_num_threads(n)
            res.append(cpd.sum(x, 1, acc=F52, kahan=True, rounding="stochastic",
                               generator=torch.Generator().manual_seed(1)))
    finally:
        torch.set_num_threads(old)
    assert bits_equal(*res)
    assert bits_equal(x, x0)


def test_gradient_is_ones():
    x = data((3, 4), seed=6).requires_grad_()
    cpd.sum(x, 1, acc=F52).sum().backward()
    assert torch.equal(x.grad, torch.ones(3, 4))


def test_empty_sum_is_zero():
    assert bits_equal(cpd.sum(torch.ones(3, 0), 1, acc=F52), torch.zeros(3))


@pytest.mark.parametrize("call,exc,match", [
    (lambda x: cpd.sum(x.tolist(), acc=F52), TypeError, "x must be a torch.Tensor"),
    (lambda x: cpd.sum(x.long(), acc=F52), TypeError, "x has dtype torch.int64"),
    (lambda x: cpd.sum(x, 2, acc=F52), ValueError, "dim=2 is out of range"),
    (lambda x: cpd.sum(x, 1.0, acc=F52), TypeError, "dim"),
    (lambda x: cpd.sum(x, acc=None), TypeError, "acc"),
    (lambda x: cpd.sum(x, acc=F52, kahan="yes"), TypeError, "kahan"),
    (lambda x: cpd.sum(x, acc=F52, rounding="even"), ValueError, "even"),
])
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call(torch.ones(2, 3))
