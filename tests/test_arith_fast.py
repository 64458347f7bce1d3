"""The vectorized nearest-rounding path of cpd.add (numerics.h add_bits_fast: round the float32
sum, valid by Figueroa's double-rounding theorem when both operands are values of a format with
at most 11 significant bits) gives exactly the exact-sum result of the generic path (the
pure-torch twin of add_bits): over every pair of codes of every eligible format of <= 8 bits,
on a large sample of fp16 pairs, and on spans that mix format values with other float32s."""

import pytest
import torch

import cpd
from cpd import _fallback
from cpd.rounding import Rounding
from formats_grid import fid, small_formats


def _same(a, b):
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32))


def _generic(x, y, fmt):
    return _fallback.arith("add", x, y, None, fmt, Rounding.NEAREST, False, 32, 0, 0)


def _eligible(f):
    return f.man <= 10 and f.emin >= -126 and f.emin - f.man >= -126


@pytest.mark.parametrize("fmt", [f for f in small_formats() if _eligible(f)], ids=fid)
def test_every_pair_of_codes(fmt):
    n = 1 << fmt.bits
    vals = cpd.decode(torch.arange(n, dtype=torch.int64), fmt)
    x = vals.repeat_interleave(n)
    y = vals.repeat(n)
    assert _same(cpd.add(x, y, fmt), _generic(x, y, fmt))


@pytest.mark.parametrize("fmt", [cpd.FP16, cpd.FloatFormat(5, 10, specials="finite"), cpd.FloatFormat(6, 9)],
                         ids=lambda f: f.name)
def test_sampled_wide_pairs(fmt):
    g = torch.Generator().manual_seed(0)
    x = cpd.cast(torch.randn(1 << 18, generator=g) * torch.exp2(torch.randint(-20, 20, (1 << 18,), generator=g)), fmt)
    y = cpd.cast(torch.randn(1 << 18, generator=g) * torch.exp2(torch.randint(-20, 20, (1 << 18,), generator=g)), fmt)
    y[::7] = -x[::7]  # exact cancellations
    y[::11] = x[::11]  # exact doublings
    assert _same(cpd.add(x, y, fmt), _generic(x, y, fmt))


def test_spans_mixing_non_format_values():
    g = torch.Generator().manual_seed(1)
    x = cpd.cast(torch.randn(5000, generator=g), cpd.E5M2)
    y = cpd.cast(torch.randn(5000, generator=g), cpd.E5M2)
    y[3000] = 0.1  # not an e5m2 value: its span must take the exact path
    assert _same(cpd.add(x, y, cpd.E5M2), _generic(x, y, cpd.E5M2))
    out = x.clone()
    assert _same(cpd.add(out, y, cpd.E5M2), _generic(x, y, cpd.E5M2))
