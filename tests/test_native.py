"""cpd's casts to the formats torch has natively are bit-identical to torch's own casts.

Invariant defended: for FP16, BF16, E5M2 and E4M3FN, ``cpd.cast`` (round to nearest even) equals
``x.to(dtype).float()`` on millions of random float32 bit patterns (normals, subnormals, NaNs,
infinities), on every float16 and bfloat16 value, and on every float16 midpoint ± 1 ulp.
NaN is compared as NaN (payloads are not part of the contract).

What torch (2.13, CPU) does out of range, and so which cpd settings match it (checked below in
``test_torch_out_of_range_behaviour`` so that a change in torch is reported as such):
* ``float16``, ``bfloat16``, ``float8_e5m2`` do not saturate: |x| >= max + ulp/2 gives ±inf, ±inf
  stays ±inf. That is ``cpd.cast(x, fmt)`` with ``saturate=False``.
* ``float8_e4m3fn`` saturates: every finite overflow *and ±inf* give ±448 (NaN stays NaN); the
  tie 464 = 448 + ulp/2 goes to 448 (even code). That is ``cpd.cast(x, E4M3FN, saturate=True)``.
  Without saturate, cpd gives NaN exactly where |x| > 464 or x is ±inf, and agrees elsewhere.
"""

import math

import pytest
import torch

import cpd

N_RANDOM = 4_000_000

NATIVE = [  # (dtype, cpd format, saturate that matches torch)
    (torch.float16, cpd.FP16, False),
    (torch.bfloat16, cpd.BF16, False),
    (torch.float8_e5m2, cpd.E5M2, False),
    (torch.float8_e4m3fn, cpd.E4M3FN, True),
]
IDS = ["fp16", "bf16", "e5m2", "e4m3fn"]


def _random_bits(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64, generator=g).to(torch.int32)
    x = words.view(torch.float32)
    # a quarter of the samples in the formats' interesting range: exponents -30..20, some subnormal
    q = n // 4
    small = torch.ldexp(torch.rand(q, generator=g) + 1, torch.randint(-30, 20, (q,), generator=g))
    small = small * (torch.randint(0, 2, (q,), generator=g) * 2 - 1)
    sub = (torch.randint(0, 1 << 23, (q // 4,), generator=g, dtype=torch.int32)).view(torch.float32)
    return torch.cat([x, small, sub, -sub])


def _all_half() -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()


def _all_bf16() -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()


def _half_midpoints() -> torch.Tensor:
    """Every midpoint between consecutive finite float16 values, and ± 1 float32 ulp of it."""
    v = _all_half()
    v = torch.unique(v[torch.isfinite(v) & (v >= 0)])  # sorted, +0 once
    v = torch.cat([v, torch.tensor([65536.0])])  # the first value past max
    mid = (v[1:].double() + v[:-1].double()) / 2
    m = mid.float()
    assert torch.equal(m.double(), mid)  # every float16 midpoint is a float32
    up = torch.nextafter(m, torch.full_like(m, math.inf))
    down = torch.nextafter(m, torch.zeros_like(m))
    x = torch.cat([m, up, down])
    return torch.cat([x, -x])


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, what: str):
    ok = (got.view(torch.int32) == want.view(torch.int32)) | (torch.isnan(got) & torch.isnan(want))
    if not bool(ok.all()):
        idx = (~ok).nonzero().flatten()[:8]
        detail = "\n".join(f"  x={x[i].item()!r} ({x[i:i+1].view(torch.int32).item() & 0xFFFFFFFF:#010x}): "
                           f"torch {want[i].item()!r}, cpd {got[i].item()!r}" for i in idx.tolist())
        pytest.fail(f"{what}: {int((~ok).sum())} of {ok.numel()} differ\n{detail}")


@pytest.fixture(scope="module")
def random_x():
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 65504.0, 65520.0, 65519.996,
                            57344.0, 61440.0, 61439.996, 448.0, 464.0, 464.00003, 480.0, 3.4028235e38,
                            2.0 ** -149, 2.0 ** -126, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * (1 + 2.0 ** -23),
                            2.0 ** -17 * (1 + 2.0 ** -23), 2.0 ** -10, 2.0 ** -10 * 1.5])
    return torch.cat([_random_bits(N_RANDOM, 1234), special, -special])


def test_torch_out_of_range_behaviour():
    """Pins down torch's own behaviour that the comparisons below rely on (see the docstring)."""
    x = torch.tensor([464.0, 464.03125, 480.0, 1e30, math.inf, -math.inf, -1e30, math.nan])
    assert x.to(torch.float8_e4m3fn).float()[:7].tolist() == [448.0, 448.0, 448.0, 448.0, 448.0, -448.0, -448.0]
    assert math.isnan(x.to(torch.float8_e4m3fn).float()[7].item())
    y = torch.tensor([61439.996, 61440.0, 1e30, math.inf, -1e30])
    assert y.to(torch.float8_e5m2).float().tolist() == [57344.0, math.inf, math.inf, math.inf, -math.inf]
    assert torch.tensor([65519.996, 65520.0]).half().float().tolist() == [65504.0, math.inf]


@pytest.mark.parametrize("dtype,fmt,sat", NATIVE, ids=IDS)
def test_random_bit_patterns(dtype, fmt, sat, random_x):
    want = random_x.to(dtype).float()
    got = cpd.cast(random_x, fmt, saturate=sat)
    assert_same_bits(got, want, random_x, f"{fmt.name} on random float32")


@pytest.mark.parametrize("dtype,fmt,sat", NATIVE, ids=IDS)
@pytest.mark.parametrize("source", ["float16", "bfloat16", "float16 midpoints"])
def test_every_16_bit_value(dtype, fmt, sat, source):
    x = {"float16": _all_half, "bfloat16": _all_bf16, "float16 midpoints": _half_midpoints}[source]()
    assert_same_bits(cpd.cast(x, fmt, saturate=sat), x.to(dtype).float(), x, f"{fmt.name} on {source}")


@pytest.mark.parametrize("src_dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_upcast_exactly(src_dtype):
    """float16/bfloat16 tensors are accepted and give the result of their exact float32 value."""
    x16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(src_dtype)
    for fmt in (cpd.E5M2, cpd.E4M3FN, cpd.FP16, cpd.E2M1):
        got = cpd.cast(x16, fmt)
        assert got.dtype == torch.float32
        assert_same_bits(got, cpd.cast(x16.float(), fmt), x16.float(), f"{src_dtype} -> {fmt.name}")


def test_e4m3fn_without_saturate(random_x):
    """Without saturate, E4M3FN agrees with torch except that overflow (|x| > 464) and ±inf are NaN."""
    want = random_x.to(torch.float8_e4m3fn).float()
    got = cpd.cast(random_x, cpd.E4M3FN)
    over = ~torch.isnan(random_x) & (random_x.abs() > 464.0)
    assert bool(torch.isnan(got[over]).all())
    assert_same_bits(got[~over], want[~over], random_x[~over], "e4m3fn (no saturate) in range")
