"""The CPU stochastic cast with its Philox words drawn inside the cast loop (cuda/cpu/cast_loops.h
cast_sr_range: one vector Philox call, then the cast of its elements) gives the reference's bits.

Invariants defended:
* for every format family (IEEE, FN, FINITE, FNUZ, P3109 signed and unsigned, FNU/E8M0, no
  subnormals, man = 0, man = 22, man = 23, the generic path), every length 0..67 (the vector
  Philox call's 24 / 48 / 64 / 128 elements at SSE4.1 / AVX2 / NEON / AVX-512 and every tail
  block of 1..3 elements after it), lengths around the spans (384 elements) and the thread split
  (2^15 elements), the stochastic cast equals the pure-torch fallback (itself checked against the
  exact oracle, tests/test_fallback.py), which draws element i's word as random_word(i, seed,
  offset);
* inputs and outputs at float offsets that are not a multiple of the vector width (views into a
  larger buffer), 1 and 2 threads, ordinary and streaming stores, sr_bits 32 and a few bits,
  saturating or not, offsets (the Philox counter's high words) with high bits set.
This file runs at every ISA level the suite builds (tests/test_isa_levels.py SELECTION).
"""

import contextlib
import math

import pytest
import torch

import cpd
from cpd import _cpu, _fallback
from cpd.rounding import Rounding

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled CPU extension")

FORMATS = [cpd.E5M2, cpd.E4M3FN, cpd.FP16, cpd.BF16, cpd.FloatFormat(5, 2, specials="finite"), cpd.E4M3FNUZ,
           cpd.FloatFormat.p3109(8, 3), cpd.FloatFormat.p3109(8, 3, signed=False), cpd.E8M0,
           cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(5, 0), cpd.FloatFormat(8, 22), cpd.FP32,
           cpd.FloatFormat(3, 20, specials="fn", bias=129)]
SHORT = list(range(68))  # 0..67
LONG = [383, 384, 385, 4 * 96 * 3 + 5, 2**15 + 67]  # spans; past the thread split (2^15 elements)
ALWAYS, NEVER = 0, 2**62
SEED, OFFSET = -0x5DEECE66D1234567, 0x7FFF_0001_0000_0003  # high words of key and counter set


@pytest.fixture(scope="module")
def ext():
    return _cpu.extension()


@contextlib.contextmanager
def setting(ext, nthreads, stream_bytes):
    old_t, old_s = torch.get_num_threads(), ext.stream_min_bytes(stream_bytes)
    torch.set_num_threads(nthreads)
    try:
        yield
    finally:
        torch.set_num_threads(old_t)
        ext.stream_min_bytes(old_s)


def inputs(fmt, n, seed):
    """n float32 values: around the format's binades (normal and subnormal), random bit patterns,
    zeros of both signs, infinities, NaN, the overflow boundary."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64, generator=g).to(torch.int32).view(torch.float32)
    e = torch.randint(fmt.emin - fmt.man - 3, fmt.emax + 2, (n,), generator=g).clamp(-149, 127)
    near = torch.ldexp(1 + torch.rand(n, generator=g), e).float()
    near = near * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    x = torch.where(torch.randint(0, 4, (n,), generator=g) == 0, raw, near)
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, fmt.max, -fmt.max * 1.0001,
                            fmt.smallest_subnormal / 3, 3.4028235e38])
    x[5::11] = special[torch.arange(len(x[5::11])) % len(special)]
    return x


def view_at(t, k):
    """t's values in a contiguous tensor starting k floats past a 64-byte boundary."""
    buf = torch.full((t.numel() + 32,), 7.0)
    start = (-(buf.data_ptr() // 4)) % 16 + k
    v = buf[start:start + t.numel()]
    v.copy_(t)
    return v


def bits(t):
    return t.contiguous().view(torch.int32)


def check(ext, fmt, x, lengths, sr_bits, saturate, nthreads, stream, kx, ky):
    """The cast of each prefix x[:n], n in lengths: element i's result depends on x[i] and i alone,
    so the reference of a prefix is the prefix of the reference (one fallback call for them all)."""
    want = _fallback.cast(x, fmt, Rounding.STOCHASTIC, saturate, sr_bits, SEED, OFFSET)
    for n in lengths:
        xin = view_at(x[:n], kx)
        out = view_at(torch.zeros(n), ky)
        with setting(ext, nthreads, ALWAYS if stream else NEVER):
            ext.cast_out(xin, out, *cpd.ops._fmt_args(fmt), Rounding.STOCHASTIC.code, saturate, sr_bits, SEED, OFFSET)
        assert torch.equal(bits(out), bits(want[:n])), (fmt.name, n, sr_bits, saturate, nthreads, stream, kx, ky)
        assert torch.equal(bits(xin), bits(x[:n]))  # the input is not touched


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_length_to_67(ext, fmt):
    x = inputs(fmt, SHORT[-1], seed=67)
    for sr_bits, saturate, nthreads, stream, kx, ky in ((32, False, 1, False, 0, 0), (32, True, 2, False, 3, 5),
                                                        (5, False, 1, True, 1, 7), (1, True, 2, True, 13, 2)):
        check(ext, fmt, x, SHORT, sr_bits, saturate, nthreads, stream, kx, ky)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("nthreads", [1, 2])
def test_long_lengths(ext, fmt, nthreads):
    x = inputs(fmt, LONG[-1], seed=1)
    check(ext, fmt, x, LONG, 32, False, nthreads, False, 5, 3)
    check(ext, fmt, x, LONG, 7, True, nthreads, True, 9, 1)


def test_in_place(ext):
    fmt = cpd.E5M2
    for n in (67, 4 * 96 * 2 + 3):
        x = inputs(fmt, n, seed=3)
        want = _fallback.cast(x, fmt, Rounding.STOCHASTIC, False, 32, SEED, OFFSET)
        y = view_at(x, 1)
        ext.cast_out(y, y, *cpd.ops._fmt_args(fmt), Rounding.STOCHASTIC.code, False, 32, SEED, OFFSET)
        assert torch.equal(bits(y), bits(want))
