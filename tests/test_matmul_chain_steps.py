"""Kahan's and blocked sums on cpd.matmul's register chains (cuda/cpu/matmul_h16.h h16_chain_tile
with KAHAN, BLOCK; x86-64-v3 and AVX-512 builds): the sum s, the compensation c and the block sum bs
of each output in registers, every operation of numerics.h's dot_step rounded by the chain's Sum:
Kahan's ``y = x - c, t = s + y, c = (t - s) - y, s = t`` at each step (or at each run's end, with
blocks), a block's terms summed into bs from +0 and bs added into s at the run's end:

* to nearest: into FP32 with exact products (``y`` or the block's step one FMA) or products rounded
  to a format with subnormals (bounded and general forms), into FP16 with such products (the
  conversion), into BF16-like accumulators with bounded products (the integer rounding);
* toward zero, up and down (matmul_directed.h): the same accumulators and FP16/BF16 with exact
  products, finite operands, products bounded (max|a| max|b| <= mul's max).

Invariants defended:
* every output equals the exact rational reference of tests/test_matmul.py (``ref_matmul``, each
  operation of the step an exact rational rounded once; IEEE's sign of an exact zero sum): every
  binade of the operands, products below mul's smallest subnormal (zeros of both signs), sums
  whose compensation carries the low bits (one large term and many small ones), runs that do and
  do not divide K;
* the automatic loop gives the generic loop's bits (``path=1``: dot_step, one output at a time) on
  ragged shapes around the register tiles, at the bound max|a| max|b| = mul's max and above it,
  with sums that overflow acc (Kahan's inf - inf: NaN outputs, redone by the generic steps), NaN
  and infinite operands; and the same bits on 1 and 3 threads.
"""

from __future__ import annotations

import math

import pytest
import torch

import cpd
from cpd import _cpu
from test_matmul import bits_equal, ref_matmul
from test_matmul_chains import binades, bound_cases

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")

MODES = ["nearest", "toward_zero", "up", "down"]
F510 = cpd.FloatFormat(5, 10)
# (mul, acc, modes) the chains take with Kahan or blocks (finite, bounded operands)
PAIRS = [(None, cpd.FP32, MODES), (cpd.E4M3, cpd.FP32, MODES), (cpd.E5M2, cpd.FP32, MODES),
         (cpd.FP16, cpd.FP32, MODES), (cpd.E5M2, F510, MODES), (cpd.E4M3, cpd.FP16, MODES),
         (cpd.E4M3, cpd.BF16, MODES), (cpd.E5M2, cpd.TF32, MODES), (None, cpd.FP16, MODES[1:]),
         (None, cpd.BF16, MODES[1:])]
IDS = [f"{m.name if m else 'exact'}x{a.name}" for m, a, _ in PAIRS]


# Kahan's steps, blocks (runs of 5 over K = 11, 24, ...: a short last run), both, runs of one step
STEPS = [dict(kahan=True), dict(block=5), dict(kahan=True, block=3), dict(block=1)]
STEP_IDS = ["kahan", "block5", "kahan-block3", "block1"]


def ext(a, b, mul, acc, mode, path=0, kahan=False, block=0):
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
    _cpu.extension().matmul_out(a, b, out, mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc),
                                kahan, block, cpd.Rounding(mode).code, False, 32, 0, 0, path)
    return out


def same_bits(x, y):
    """Bits equal, NaN payloads included (the chains redo NaN outputs by the generic steps)."""
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


def agree(a, b, mul, acc, mode, steps, payloads=True):
    """path 0 against the generic loop; payloads False: NaN outputs compare as NaN (non-finite
    operands send some calls to the float32 lanes, whose NaN sign and payload are not specified)."""
    fast, gen = ext(a, b, mul, acc, mode, 0, **steps), ext(a, b, mul, acc, mode, 1, **steps)
    bad = (fast.view(torch.int32) != gen.view(torch.int32)).nonzero()[:3].tolist()
    ok = same_bits(fast, gen) if payloads else bits_equal(fast, gen)
    assert ok, (mode, steps, [(i, fast[tuple(i)].item(), gen[tuple(i)].item()) for i in bad])
    return fast


def bounded(a, b, mul):
    """b scaled by a power of two so that max|a| max|b| <= mul's max (the bounded products)."""
    if mul is None:
        return b
    top = float(a.abs().max()) * float(b.abs().max())
    return b if top == 0 else b * 2.0 ** math.floor(math.log2(float(mul.max) / top))


def compensated(g, M, K, N, f):
    """One large term then many small ones per output: the sum keeps only the compensation's bits."""
    a = torch.rand(1, M, K, generator=g) + 1
    a[0, :, 0] = 2.0 ** (f.man + 2)
    b = torch.rand(1, K, N, generator=g) * 2 - 1
    b[0, 0, :] = 1.0
    return a, b


@pytest.mark.parametrize("mul,acc,modes", PAIRS, ids=IDS)
def test_exact_reference(mul, acc, modes):
    g = torch.Generator().manual_seed(41)
    f = mul or acc
    lo, hi = max(f.emin - f.man - 4, -60), min(f.emax, 60)
    a = binades(g, (1, 4, 11), lo // 2, hi // 2)
    b = bounded(a, binades(g, (1, 11, 3), lo // 2, hi // 2), mul)
    a2, b2 = compensated(g, 2, 24, 3, acc)
    b2 = bounded(a2, b2, mul)
    for mode in modes:
        for steps in STEPS:
            for x, y in ((a, b), (a2, b2)):
                got = agree(x, y, mul, acc, mode, steps)
                want = ref_matmul(x[0], y[0], mul, acc, kahan=steps.get("kahan", False), block=steps.get("block"),
                                  mode=mode)
                assert bits_equal(got[0], want), (mode, steps, got, want)


@pytest.mark.parametrize("steps", STEPS, ids=STEP_IDS)
@pytest.mark.parametrize("mul,acc,modes", PAIRS, ids=IDS)
def test_equals_generic(mul, acc, modes, steps):
    g = torch.Generator().manual_seed(43)
    f = mul or acc
    for mode in modes:
        for M, K, N in ((1, 9, 1), (7, 1, 33), (13, 40, 45), (5, 64, 17)):
            a = torch.randn(2, M, K, generator=g)
            agree(a, bounded(a, torch.randn(2, K, N, generator=g), mul), mul, acc, mode, steps)
        a, b = compensated(g, 7, 200, 40, acc)
        agree(a, bounded(a, b, mul), mul, acc, mode, steps)
        tiny = 2.0 ** ((f.emin - f.man) // 2)  # products near and below mul's smallest subnormal
        a = torch.randn(1, 6, 30, generator=g) * tiny
        agree(a, torch.randn(1, 30, 20, generator=g) * tiny, mul, acc, mode, steps)
        big = 2.0 ** (min(f.emax, 127) // 2)  # products near mul's max, one sign: sums past acc's range
        a = torch.rand(1, 6, 300, generator=g) * big + big
        agree(a, bounded(a, torch.rand(1, 300, 20, generator=g) * big + big, mul), mul, acc, mode, steps)
        if mul is not None:
            for a, b in bound_cases(mul, g):  # at the bound and one ulp above (the general form or the lanes)
                agree(a, b, mul, acc, mode, steps)
        a, b = torch.randn(1, 5, 8, generator=g), torch.randn(1, 8, 17, generator=g)
        a[0, 0, 2], a[0, 1, 3], b[0, 3, 5], b[0, 2, 4] = math.inf, -math.inf, math.nan, 0.0
        agree(a, b, mul, acc, mode, steps, payloads=False)


@pytest.mark.parametrize("mul,acc,steps", [(None, cpd.FP32, STEPS[0]), (cpd.E5M2, F510, STEPS[2]),
                                           (cpd.E4M3, cpd.BF16, STEPS[1])],
                         ids=["exact-fp32", "e5m2-fp16", "e4m3-bf16"])
def test_thread_count(mul, acc, steps):
    g = torch.Generator().manual_seed(47)
    a = torch.randn(2, 150, 64, generator=g)
    b = bounded(a, torch.randn(2, 64, 70, generator=g), mul)
    n = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 3):
            torch.set_num_threads(t)
            outs.append(ext(a, b, mul, acc, "nearest", **steps))
    finally:
        torch.set_num_threads(n)
    assert same_bits(outs[0], outs[1])
    assert same_bits(outs[0], ext(a, b, mul, acc, "nearest", 1, **steps))
