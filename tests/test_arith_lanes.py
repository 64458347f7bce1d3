"""cpd.add / cpd.mul / cpd.fma on the CPU's vector loops (cuda/cpu/arith.cpp) give the generic
loop's bits (``path=1``: mul_bits, add_bits, fma_bits element by element, themselves checked
against exact rationals in tests/test_arith.py).

Invariants defended:
* round to nearest (any format: float64 lanes), stochastic rounding to formats of man <= 19
  (float64 lanes, the span's words drawn at once) and the directed modes (float32 arithmetic in the
  processor's rounding direction, then the directed cast) equal the generic loop bit for bit,
  NaN payloads included: operands over every binade, float32 subnormals, zeros of both signs,
  infinities, NaN with payloads, huge exponent gaps, exact cancellation; lengths that end inside a
  span and a Philox block; two threads (chunk edges inside a block); out aliasing an operand;
* the calling thread rounds to nearest afterwards.
"""

import numpy as np
import pytest
import torch

import cpd
from cpd import _cpu

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")

FMTS = [cpd.BF16, cpd.FP16, cpd.E4M3, cpd.E5M2, cpd.E4M3FN, cpd.FP32, cpd.TF32, cpd.FloatFormat(6, 7),
        cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(8, 3, bias=140, subnormals=False), cpd.E4M3FNUZ,
        cpd.FloatFormat.p3109(8, 3), cpd.E2M1, cpd.FloatFormat(8, 20), cpd.E8M0]
MODES = ["nearest", "toward_zero", "up", "down", "stochastic", "nearest_away", "odd"]
OPS = {"mul": 0, "add": 1, "fma": 2}


def operands(n, seed):
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-150, 128, (3, n), generator=g).float()
    near = torch.randint(-20, 20, (3, n), generator=g).float()
    e = torch.where(torch.rand(3, n, generator=g) < 0.6, near, e)
    x = torch.randn(3, n, generator=g) * torch.exp2(e)
    x[1, 5:40] = -x[0, 5:40]  # exact cancellation in adds
    x[:, 40:46] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-45, -3e-39])
    bits = x.view(torch.int32)
    bits[0, 50] = 0x7FC01234  # NaN payloads
    bits[1, 51] = -0x0003ABCD
    bits[2, 52] = 0x7F800001  # a signalling NaN
    return x[0].clone(), x[1].clone(), x[2].clone()


def run(op, a, b, c, fmt, mode, path, sr_bits=32, seed=(3, -5), saturate=False, out=None):
    out = torch.empty_like(a) if out is None else out
    _cpu.extension().arith_out(OPS[op], a, b, c, out, *cpd.ops._fmt_args(fmt), cpd.Rounding(mode).code, saturate,
                               sr_bits, seed[0], seed[1], path)
    return out


def same(x, y):
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_lanes_equal_generic(fmt):
    a, b, c = operands(3001, 11)  # not a multiple of 4: a partial last block
    for mode in MODES:
        for op in OPS:
            for kw in (dict(), dict(saturate=True)) + ((dict(sr_bits=8, seed=(-9, 7)),) if mode == "stochastic" else ()):
                want = run(op, a, b, c, fmt, mode, 1, **kw)
                got = run(op, a, b, c, fmt, mode, 0, **kw)
                bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero().flatten()[:3].tolist()
                assert not bad, (op, mode, kw, [(a[i].item(), b[i].item(), got[i].item(), want[i].item()) for i in bad])


@pytest.mark.parametrize("mode", ["nearest", "stochastic", "toward_zero", "down"])
def test_threads_and_aliasing(mode):
    a, b, c = operands(50001, 5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = {op: run(op, a, b, c, cpd.BF16, mode, 1) for op in OPS}
        torch.set_num_threads(2)  # chunk edges fall inside Philox blocks
        for op in OPS:
            assert same(run(op, a, b, c, cpd.BF16, mode, 0), want[op]), op
            x = a.clone()
            run(op, x, b, c, cpd.BF16, mode, 0, out=x)  # out is a
            assert same(x, want[op]), op
    finally:
        torch.set_num_threads(threads)
    one, h = np.float32(1.0), np.float32(2.0**-24)
    assert (one + h) + h == one and (-one - h) - h == -one  # this thread rounds to nearest again


def test_public_ops_take_the_lanes():
    a, b, c = operands(1000, 2)
    for mode in ("nearest", "up"):
        assert same(cpd.add(a, b, cpd.BF16, rounding=mode), run("add", a, b, c, cpd.BF16, mode, 1))
        assert same(cpd.fma(c, a, b, cpd.E4M3, rounding=mode), run("fma", a, b, c, cpd.E4M3, mode, 1))
