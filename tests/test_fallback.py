"""The pure-torch fallback (cpd/_fallback.py) is bit-identical to the compiled CPU path.

Invariants defended (docs/design.md §2: "tested against the fast path"):
* ``_fallback.cast`` equals ``torch.ops.cpd.cast`` (the C++ extension) bit for bit on random bit
  patterns, values near the format's codes and specials, for narrow and wide formats, every
  rounding mode, saturate on/off, and stochastic rounding with the same (seed, offset) and
  sr_bits;
* ``_fallback.encode_values``/``decode``/``random_words`` equal the compiled encode/decode/words;
* with ``CPD_NO_EXTENSION=1`` the public API runs on the fallback and still meets the exact
  oracle (a subset of tests/test_cast_exhaustive.py is re-run in a subprocess).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cpd
from cpd import _cpu, _fallback
from cpd.rounding import Rounding

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="no compiled CPU extension to compare with")

FORMATS = [cpd.E5M2, cpd.E4M3FN, cpd.E4M3, cpd.E2M1, cpd.FloatFormat(3, 0), cpd.FloatFormat(4, 3, subnormals=False),
           cpd.FP16, cpd.BF16, cpd.TF32, cpd.FP32, cpd.FloatFormat(8, 0, bias=150),
           cpd.FloatFormat(3, 20, specials="fn", bias=129), cpd.FloatFormat(6, 12, subnormals=False, bias=40),
           cpd.FloatFormat(8, 22, specials="finite", bias=128)]
SEEDS = [(0, 0), (123456789, 987654321), (-1, -(2**63)), (2**62 + 5, 2**40 + 17)]


def fargs(f):
    return cpd.ops._fmt_spec(f)  # the ops' one-argument format


def inputs(fmt, n=100_000):
    g = torch.Generator().manual_seed(fmt.bits * 7 + fmt.exp)
    raw = torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64, generator=g).to(torch.int32).view(torch.float32)
    # values around the format's range: max, the overflow boundary, subnormals, below the quantum
    e = torch.randint(fmt.emin - fmt.man - 30, fmt.emax + 3, (n,), generator=g).clamp(-149, 127)
    near = torch.ldexp(1 + torch.randint(0, 1 << 9, (n,), generator=g) / 512.0, e).float()
    near = near * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, fmt.max, -fmt.max,
                            fmt.smallest_normal, fmt.smallest_subnormal, fmt.smallest_subnormal / 2,
                            fmt.max * (1 + 2.0 ** (-fmt.man - 1)), 3.4028235e38, 2.0 ** -149])
    return torch.cat([raw, near, special])


def bits_equal(a, b):
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def report(x, a, b):
    bad = (a.view(torch.int32) != b.view(torch.int32)).nonzero().flatten()[:5].tolist()
    return "; ".join(f"x={x[i].item()!r}: compiled {a[i].item()!r}, fallback {b[i].item()!r}" for i in bad)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("saturate", [False, True])
def test_cast_deterministic_modes(fmt, saturate):
    x = inputs(fmt, 40_000)
    x = torch.cat([x, x[torch.argsort(x.abs())]])  # shuffled, then long runs of similar magnitude
    zero = torch.zeros(2, dtype=torch.int64)
    for mode in (Rounding.NEAREST, Rounding.TOWARD_ZERO, Rounding.UP, Rounding.DOWN):
        a = torch.ops.cpd.cast(x, zero, fargs(fmt), mode.code, saturate, 32)
        b = _fallback.cast(x, fmt, mode, saturate, 32, 0, 0)
        assert bits_equal(a, b), (fmt.name, mode, report(x, a, b))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_cast_stochastic(fmt):
    x = inputs(fmt, 10_000)
    x = torch.cat([x, x[torch.argsort(x.abs())]])
    for (seed, offset), k, sat in zip(SEEDS, (32, 1, 7, 23), (False, True, False, True)):
        st = torch.tensor([seed, offset], dtype=torch.int64)
        a = torch.ops.cpd.cast(x, st, fargs(fmt), Rounding.STOCHASTIC.code, sat, k)
        b = _fallback.cast(x, fmt, Rounding.STOCHASTIC, sat, k, seed, offset)
        assert bits_equal(a, b), (fmt.name, seed, offset, k, report(x, a, b))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_encode_decode(fmt):
    x = inputs(fmt, 30_000)
    if not fmt.has_nan:
        x = x[~torch.isnan(x)]
    x = x[~(torch.isnan(x) & torch.signbit(x))]  # negative NaN: see test_encode_negative_nan
    mask = (1 << fmt.bits) - 1
    for mode in (Rounding.NEAREST, Rounding.DOWN):
        a = torch.ops.cpd.encode(x, fargs(fmt), mode.code, True).to(torch.int64) & mask
        b = _fallback.encode_values(_fallback.cast(x, fmt, mode, True, 32, 0, 0), fmt)
        assert torch.equal(a, b), fmt.name
    if fmt.bits <= 16:
        codes = torch.arange(1 << fmt.bits)
    else:
        codes = torch.randint(0, 1 << fmt.bits, (100_000,), generator=torch.Generator().manual_seed(1))
        codes = torch.cat([codes, torch.tensor([0, 1, fmt.max_code, fmt.max_code + 1, mask, mask >> 1])])
    a = cpd.decode(codes, fmt)
    b = _fallback.decode(codes, fmt)
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b))
    assert bits_equal(a[~nan], b[~nan]), fmt.name


def test_encode_negative_nan():
    """A negative NaN keeps its sign bit in the code on both paths (0xFF for e4m3fn, like torch)."""
    x = torch.tensor([-math.nan])
    fmt = cpd.E4M3FN
    a = torch.ops.cpd.encode(x, fargs(fmt), 0, False).to(torch.int64) & 0xFF
    b = _fallback.encode_values(_fallback.cast(x, fmt, Rounding.NEAREST, False, 32, 0, 0), fmt)
    assert torch.equal(a, b) and a.item() == 0xFF


@pytest.mark.parametrize("start,seed,offset", [(0, 0, 0), (3, 5, 7), (2**35 + 1, -3, 2**63 - 1),
                                               (10**15, 2**63 - 1, -(2**63))])
def test_random_words(start, seed, offset):
    n = 1001
    a = cpd.ops.random_words(start, n, seed, offset)
    b = _fallback.random_words(start, n, seed, offset)
    assert torch.equal(a, b)


def test_public_api_without_extension():
    """CPD_NO_EXTENSION=1: cpd works on the fallback, silently, and gives the compiled path's bits."""
    env = dict(os.environ, CPD_NO_EXTENSION="1")
    script = """if True:
        import json, warnings, torch, cpd
        from cpd import _cpu
        warnings.simplefilter("error")
        assert _cpu.extension() is None
        x = torch.tensor(json.loads(input()))
        res = [cpd.cast(x, "e5m2").tolist(), cpd.cast(x, "e4m3fn", "up").tolist(),
               cpd.encode(x, "e5m2", saturate=True).tolist(), cpd.decode(torch.arange(256), "e5m2").tolist(),
               cpd.cast(x, "e5m2", "stochastic", generator=torch.Generator().manual_seed(0)).tolist(),
               cpd.cast(x, "fp16", "stochastic", sr_bits=3, generator=torch.Generator().manual_seed(1)).tolist()]
        print(json.dumps(res))
    """
    xs = [0.3, 65000.0, 2**-17 * (1 + 2**-23), -464.0, 1e-7, -1.1, math.inf, 1 / 3]
    out = subprocess.run([sys.executable, "-c", script], env=env, input=json.dumps(xs), capture_output=True,
                         text=True, timeout=600)  # a hang's backstop: imports alone take tens of seconds on a loaded machine
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    x = torch.tensor(xs)
    want = [cpd.cast(x, "e5m2").tolist(), cpd.cast(x, "e4m3fn", "up").tolist(),
            cpd.encode(x, "e5m2", saturate=True).tolist(), cpd.decode(torch.arange(256), "e5m2").tolist(),
            cpd.cast(x, "e5m2", "stochastic", generator=torch.Generator().manual_seed(0)).tolist(),
            cpd.cast(x, "fp16", "stochastic", sr_bits=3, generator=torch.Generator().manual_seed(1)).tolist()]
    assert got[0][:4] == [0.3125, math.inf, 2.0 ** -16, -448.0]
    for g, w in zip(got, want):
        assert len(g) == len(w)
        assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(g, w)), (g, w)


@pytest.mark.slow
def test_exhaustive_subset_on_fallback():
    env = dict(os.environ, CPD_NO_EXTENSION="1")
    tests = Path(__file__).resolve().parent
    sel = "e5m2 or e4m3fn or e2m1finite or e3m0 or e4m3nosub or e4m3b147 or e7m0b150 or e1m6"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-x",
                          str(tests / "test_cast_exhaustive.py"), "-k", sel],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tests.parent)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout
