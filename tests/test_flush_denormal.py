"""cpd's CPU kernels on a thread that flushes subnormals (``torch.set_flush_denormal(True)``).

Invariants defended:
* with flush-to-zero and denormals-are-zero set on the calling thread (and on the workers, one
  thread or several), every op of the extension gives the bits it gives without them: casts,
  encode/decode, add/mul/fma, sum, every matmul loop (the register chains, the float32, binary16
  and float64 lanes, the generic steps), the fused dot and the MX casts, on float32 subnormal
  operands and on results that are float32 subnormals (the kernels keep subnormals for the
  duration of each chunk of work: cuda/cpu/fp_env.h KeepSubnormals);
* the thread's flush mode is given back: torch's own ops flush again after a cpd call.
"""

import pytest
import torch

import cpd
from cpd import _cpu

pytestmark = pytest.mark.skipif(_cpu.extension() is None, reason="needs the compiled CPU extension")


def bits(t):
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


def _subnormal_operands():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 1 << 23, (4096,), generator=g, dtype=torch.int32).view(torch.float32)  # subnormals
    x[::2] = -x[::2]
    x[::7] = torch.randn(4096 // 7 + 1, generator=g) * 1e-36  # near float32's smallest normals
    return x


def _ops():
    x = _subnormal_operands()
    big = torch.full_like(x, 2.0 ** 118)
    a = (x[:16 * 32].reshape(16, 32) * 1.0).contiguous()
    b = torch.full((32, 24), 2.0 ** 116) * torch.randint(1, 4, (32, 24), generator=torch.Generator().manual_seed(1))
    scaled = torch.randn(8, 64, generator=torch.Generator().manual_seed(2)) * 1e-38
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    ops = {
        "cast bf16": lambda: cpd.cast(x, cpd.BF16),
        "cast tf32 stochastic": lambda: cpd.cast(x, cpd.TF32, "stochastic", generator=gen()),
        "cast fp32 down": lambda: cpd.cast(x, cpd.FP32, "down"),
        "encode/decode bf16": lambda: cpd.decode(cpd.encode(x, cpd.BF16), cpd.BF16),
        "add bf16": lambda: cpd.add(x, x, cpd.BF16),
        "mul e5m2": lambda: cpd.mul(x, big, cpd.E5M2),
        "fma fp32": lambda: cpd.fma(x, x, big, cpd.FP32),
        "sum bf16": lambda: cpd.sum(x, acc=cpd.BF16),
        "mx cast": lambda: cpd.mx.cast(scaled, cpd.mx.MXFP8_E4M3),
        "tensor core": lambda: cpd.matmul(a, b * 2.0 ** -100, acc=cpd.tensor_core("hopper", a="e4m3")),
    }
    for mul, acc in [(cpd.E5M2, cpd.FP16), (cpd.E5M2, cpd.FloatFormat(5, 10)), (cpd.E5M2, cpd.FP32),
                     (None, cpd.FP32), (None, cpd.TF32), (None, cpd.BF16), (cpd.E4M3, cpd.BF16)]:
        ops[f"matmul {mul and mul.name} x {acc.name}"] = lambda mul=mul, acc=acc: cpd.matmul(a, b, mul=mul, acc=acc)
    ops["matmul kahan"] = lambda: cpd.matmul(a, b, mul=cpd.E5M2, acc=cpd.BF16, kahan=True)
    ops["matmul stochastic"] = lambda: cpd.matmul(a, b, acc=cpd.BF16, rounding="stochastic", generator=gen())
    return ops


@pytest.mark.parametrize("threads", [1, 2])
def test_every_op_keeps_subnormals_on_a_flushing_thread(threads):
    ops = _ops()
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        want = {name: op() for name, op in ops.items()}
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU cannot flush subnormals")
        try:
            got = {name: op() for name, op in ops.items()}
        finally:
            torch.set_flush_denormal(False)
    finally:
        torch.set_num_threads(n)
    assert any(bool((w != 0).any()) for w in want.values())
    bad = [name for name in ops if not torch.equal(bits(got[name]), bits(want[name]))]
    assert not bad, bad


def test_the_flush_mode_is_given_back():
    x = torch.full((40,), 1e-40)
    want = torch.tensor([1e-40], dtype=torch.float64).to(torch.bfloat16).to(torch.float32).view(torch.int32)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:  # bit patterns: .item() itself flushes a subnormal on this thread
        assert bool((cpd.cast(x, cpd.BF16).view(torch.int32) == want).all()) and int(want) != 0
        assert not (x + x).view(torch.int32).any()  # torch's own op still flushes on this thread
    finally:
        torch.set_flush_denormal(False)
    assert (x + x).view(torch.int32).all()
