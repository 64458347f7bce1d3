"""The CPU cast's streaming stores and constant-folded loops give the same bits (cuda/cpu/cast_loops.h).

Invariants defended:
* a cast whose output is at least ``stream_min_bytes`` (the streaming threshold; moved down here so
  that small tensors reach that path) is bit-identical to the same cast with ordinary stores, and
  to the pure-torch fallback (itself checked against the exact oracle, tests/test_fallback.py),
  for sizes around the 64-byte lines, the spans (1024 elements), the Philox buffers (384 elements)
  and the thread split; outputs at every float offset within a 64-byte line (views into a larger
  buffer); every rounding mode; formats with the common conventions (the constant-folded PLAIN
  loops: E5M2, E4M3FN, FP16, BF16, TF32, man = 22) and without (FNUZ, unsigned, no subnormals,
  man = 0, man = 23, the generic path); 1 and 2 threads;
* in-place casts (x cast into itself) and non-contiguous ``out=`` views stream correctly;
* the threshold is a size in bytes, 8 MiB by default, and an output exactly at it streams.
"""

import contextlib
import math

import pytest
import torch

import cpd
from cpd import _cpu, _fallback
from cpd.rounding import Rounding

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled CPU extension")

FORMATS = [cpd.E5M2, cpd.E4M3FN, cpd.FP16, cpd.BF16, cpd.TF32, cpd.FloatFormat(8, 22), cpd.E4M3FNUZ,
           cpd.FloatFormat(4, 3, subnormals=False), cpd.E8M0, cpd.FloatFormat(5, 0), cpd.FP32,
           cpd.FloatFormat(3, 20, specials="fn", bias=129)]
MODES = list(Rounding)
SIZES = [1, 3, 4, 15, 16, 17, 383, 384, 385, 1023, 1024, 1025, 3001]
BIG = 70_001  # above the split's grain (2^15 elements): two threads share it
ALWAYS, NEVER = 0, 2**62


@pytest.fixture(scope="module")
def ext():
    return _cpu.extension()


@contextlib.contextmanager
def threshold(ext, nbytes):
    old = ext.stream_min_bytes(nbytes)
    try:
        yield
    finally:
        ext.stream_min_bytes(old)


@contextlib.contextmanager
def threads(n):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def inputs(fmt, n, seed=0):
    """n float32 values: random bit patterns, values around the format's range, specials."""
    g = torch.Generator().manual_seed(seed * 131 + fmt.bits)
    raw = torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64, generator=g).to(torch.int32).view(torch.float32)
    e = torch.randint(fmt.emin - fmt.man - 4, fmt.emax + 2, (n,), generator=g).clamp(-149, 127)
    near = torch.ldexp(1 + torch.randint(0, 1 << 9, (n,), generator=g) / 512.0, e).float()
    near = near * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, fmt.max, -fmt.max, fmt.smallest_normal,
                            fmt.smallest_subnormal, 3.4028235e38])
    pick = torch.randint(0, 3, (n,), generator=g)
    x = torch.where(pick == 0, raw, near)
    x[:: max(n // 7, 1)] = special[torch.arange(0, n, max(n // 7, 1)) % len(special)]
    return x.contiguous()


def run(ext, x, out, fmt, mode, seed=1234, offset=99, sr_bits=32, saturate=False):
    ext.cast_out(x, out, *cpd.ops._fmt_args(fmt), mode.code, saturate, sr_bits, seed, offset)
    return out


def bits(t):
    return t.contiguous().view(torch.int32)


def at_offset(n, k):
    """A contiguous float32 output of n elements starting k floats past a 64-byte boundary."""
    buf = torch.full((n + 32,), 7.0)
    start = (-(buf.data_ptr() // 4)) % 16 + k
    return buf[start:start + n]


def test_default_threshold(ext):
    assert ext.stream_min_bytes(-1) == 8 << 20


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_stream_equals_ordinary_stores(ext, fmt):
    for mode in MODES:
        for n in SIZES:
            x = inputs(fmt, n, seed=n)
            with threshold(ext, NEVER):
                want = run(ext, x, torch.empty(n), fmt, mode)
            for k in (0, 1, 3, 8, 15):
                with threshold(ext, ALWAYS):
                    got = run(ext, x, at_offset(n, k), fmt, mode)
                assert torch.equal(bits(got), bits(want)), (fmt.name, mode, n, k)


@pytest.mark.parametrize("fmt", [cpd.E5M2, cpd.BF16, cpd.E4M3FNUZ, cpd.FloatFormat(3, 20, specials="fn", bias=129)],
                         ids=lambda f: f.name)
@pytest.mark.parametrize("nthreads", [1, 2])
def test_stream_equals_fallback(ext, fmt, nthreads):
    x = inputs(fmt, BIG, seed=5)
    for mode in MODES:
        for sat, k in ((False, 32), (True, 7)):
            want = _fallback.cast(x, fmt, mode, sat, k, 1234, 99)
            with threshold(ext, ALWAYS), threads(nthreads):
                got = run(ext, x, at_offset(BIG, 5), fmt, mode, sr_bits=k, saturate=sat)
            assert torch.equal(bits(got), bits(want)), (fmt.name, mode, sat, k, nthreads)


def test_threshold_is_inclusive(ext):
    # both sides of the threshold give the same bits (which path ran is not observable, only
    # exercised: an output of exactly `threshold` bytes streams, one float more than it does not)
    fmt, n = cpd.E5M2, 4096
    x = inputs(fmt, n)
    results = []
    for nbytes in (4 * n - 4, 4 * n, 4 * n + 4):
        with threshold(ext, nbytes):
            for mode in (Rounding.NEAREST, Rounding.STOCHASTIC, Rounding.UP):
                results.append(bits(run(ext, x, at_offset(n, 3), fmt, mode)))
    assert all(torch.equal(results[i], results[i % 3]) for i in range(len(results)))


@pytest.mark.parametrize("mode", [Rounding.NEAREST, Rounding.STOCHASTIC, Rounding.DOWN], ids=lambda m: m.value)
def test_in_place(ext, mode):
    fmt = cpd.E4M3FN
    x = inputs(fmt, BIG, seed=3)
    with threshold(ext, NEVER):
        want = run(ext, x, torch.empty(BIG), fmt, mode)
    y = x.clone()
    with threshold(ext, ALWAYS):
        run(ext, y, y, fmt, mode)
    assert torch.equal(bits(y), bits(want))


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_public_api_out_views(ext, rounding):
    x = inputs(cpd.E5M2, 2 * 3001, seed=9).reshape(3001, 2)
    def gen():  # the same draw each call (nearest takes none)
        return torch.Generator().manual_seed(7) if rounding == "stochastic" else None

    want = cpd.cast(x, cpd.E5M2, rounding, generator=gen())
    with threshold(ext, ALWAYS):
        base = torch.zeros(2, 3001)
        out = base.t()  # non-contiguous
        cpd.cast(x, cpd.E5M2, rounding, generator=gen(), out=out)
        shifted = at_offset(2 * 3001, 1).view(3001, 2)  # contiguous, not line-aligned
        cpd.cast(x, cpd.E5M2, rounding, generator=gen(), out=shifted)
    assert torch.equal(bits(out), bits(want))
    assert torch.equal(bits(shifted), bits(want))
