"""The tiled fused-dot GEMM kernels (cuda/kernels/fused_dot.cu cpd_fused_dot_tiled_*; their
integer step in cuda/include/cpd/fused_dot_tiled.h) executed on the host by the shim give the CPU
extension's fused-dot matmul bits (itself checked against exact oracles in test_tensor_core.py).

Invariants defended (no GPU needed):
* every tiled kernel (L = 16, 32; 32- and 64-bit group sums) equals the CPU bit for bit, NaN
  payloads included, on random codes of the input formats (every bit pattern: NaN, inf,
  subnormals, zeros of both signs), wide-range exponents, cancellation, dominant products,
  operands with more fraction bits than the format (the flagged fallback), ragged shapes
  (M, N, K not multiples of the 64 x 64 tile nor K of the group) and batches;
* cpd/_tensor_core_op.py tiled_kernel routes the NVIDIA FP8/FP16/BF16 models of Ada, Hopper and
  Blackwell (but Blackwell FP8, F = 25) to the tiled kernels and leaves the others (block scales, AMD, L = 4 or 8) alone.
Shapes are small: the shim runs GPU threads one after another on one core.
"""

import pytest
import torch

from cpd import _cpu, _shim, _tensor_core_op
from cpd.tensor_core import FusedDot, tensor_core

pytestmark = [pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim"),
              pytest.mark.skipif(_cpu.extension() is None, reason="no CPU extension")]

MODELS = [("hopper", "e4m3"), ("hopper", "e5m2"), ("hopper", "fp16"), ("hopper", "bf16"), ("ada", "e4m3"),
          ("blackwell", "bf16"), ("custom", "fp16 L=32"), ("custom", "fp16 L=32 F=26")]


def model(arch, ka):
    if arch == "custom":  # L = 32 with 64-bit group sums (no preset has both); F = 26: the largest taken
        return FusedDot(group=32, frac_bits=26 if ka.endswith("F=26") else 25, out="f32", a="e5m10", b="e5m10")
    return tensor_core(arch, a=ka)
CODES = {"e4m3fn": (torch.uint8, torch.float8_e4m3fn), "e5m2": (torch.uint8, torch.float8_e5m2),
         "e5m10": (torch.int16, torch.float16), "e8m7": (torch.int16, torch.bfloat16)}


def fields(acc):
    return (acc.a.man, acc.a.emax, acc.b.man, acc.b.emax)


def cpu(acc, a3, b3):
    e = a3.new_empty((0,))
    return torch.ops.cpd_fused_dot.matmul(a3, b3, e, e, 1, -127, *acc.params, *fields(acc), 0)


def shim(acc, a3, b3, blocks=3):
    kernel = _tensor_core_op.tiled_kernel(acc.params, fields(acc), False)
    assert kernel is not None
    y = torch.full((a3.shape[0], a3.shape[1], b3.shape[2]), 3.0)
    _shim.launch(_tensor_core_op.tiled_launch_of(a3, b3, y, acc.params, fields(acc), kernel, blocks))
    return y


def codes(fmt, shape, gen, finite=True):
    """Random bit patterns of fmt (one of CODES) as float32 values."""
    itype, ftype = CODES[fmt.name]
    bits = 8 * torch.empty((), dtype=itype).element_size()
    x = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), shape, generator=gen).to(itype)
    x = x.view(ftype).float()
    if finite:
        x = torch.where(torch.isfinite(x), x, torch.zeros(()))
    return x


def check(acc, a3, b3):
    want, got = cpu(acc, a3, b3), shim(acc, a3, b3)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got - want).abs().max()


@pytest.mark.parametrize("arch,ka", MODELS)
def test_random_codes_ragged_batched(arch, ka):
    acc = model(arch, ka)
    gen = torch.Generator().manual_seed(hash((arch, ka)) & 0xFFFF)
    a3 = codes(acc.a, (2, 70, 45), gen)
    b3 = codes(acc.b, (2, 45, 67), gen)
    check(acc, a3, b3)


@pytest.mark.parametrize("arch,ka", MODELS)
def test_specials_and_extra_fraction_bits(arch, ka):
    """NaN/inf codes anywhere, and float32 operands that are not values of the format: the outputs
    they reach take fd_step for that group (NaN payloads and all)."""
    acc = model(arch, ka)
    gen = torch.Generator().manual_seed(11)
    a3 = codes(acc.a, (1, 33, 70), gen, finite=False)
    b3 = codes(acc.b, (1, 70, 20), gen)
    b3[0, 3, 4] = float("inf")
    b3[0, 40, 5] = -float("inf")
    a3[0, 7, 40] = 1.0 + 2.0 ** -20  # more fraction bits than any of the formats
    b3[0, 50, 9] = torch.randn(()).item()
    check(acc, a3, b3)


@pytest.mark.parametrize("arch,ka", MODELS)
def test_cancellation_dominant_subnormal(arch, ka):
    acc = model(arch, ka)
    gen = torch.Generator().manual_seed(3)
    K = 64
    a = codes(acc.a, (1, 20, K), gen)
    b = codes(acc.b, (1, K, 18), gen)
    big = torch.tensor(acc.a.max_finite if hasattr(acc.a, "max_finite") else 2.0 ** acc.a.emax)
    a[0, :, 0] = big  # dominant products
    b[0, 0, :] = 1.0
    a[0, :, 1] = -big  # ... cancelled by the next one: what is left is what was cut
    b[0, 1, :] = 1.0
    a[0, 0:5, :] = 2.0 ** acc.a.emin * torch.tensor([0.5, 0.25, 1.0, -0.75, 0.125]).reshape(5, 1)  # subnormals
    a[0, 5:10, :] = 2.0 ** acc.a.emin
    b[0, :, 0:4] = 2.0 ** acc.b.emin * 0.5
    check(acc, a.contiguous(), b.contiguous())


def test_routing():
    routed = {(arch, ka): _tensor_core_op.tiled_kernel(model(arch, ka).params, fields(model(arch, ka)), False)
              for arch, ka in MODELS}
    assert routed[("hopper", "e4m3")] == "cpd_fused_dot_tiled_l32"
    assert routed[("hopper", "fp16")] == "cpd_fused_dot_tiled_l16w"
    assert routed[("ada", "e4m3")] == "cpd_fused_dot_tiled_l16"
    assert routed[("custom", "fp16 L=32")] == "cpd_fused_dot_tiled_l32w"
    # blackwell e4m3 (F = 25): M 2^(F - 6) needs 23 bits, beyond the kernel's 22
    for arch, ka in [("blackwell", "e4m3"), ("hopper", "tf32"), ("ampere", "fp16"), ("cdna3", "fp8"), ("cdna2", "fp16")]:
        acc = tensor_core(arch, a=ka)
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), False) is None, (arch, ka)
    acc = tensor_core("hopper", a="e4m3")
    assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), True) is None  # block scales
    assert routed[("custom", "fp16 L=32 F=26")] == "cpd_fused_dot_tiled_l32w"
    acc = FusedDot(group=16, frac_bits=27, out="f32", a="e5m10", b="e5m10")  # F > 26: 8 terms overflow 32 bits
    assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), False) is None


@pytest.mark.parametrize("kernel", ["cpd_fused_dot_tiled_l32", "cpd_fused_dot_tiled_l16w"])
@pytest.mark.parametrize("arch,ka", [("blackwell", "e4m3"), ("cdna3", "fp8"), ("ampere", "fp16"), ("hopper", "fp16"),
                                     ("hopper", "e4m3")])
def test_a_spec_outside_the_kernel_gets_the_generic_bits(kernel, arch, ka):
    """Each tiled kernel checks the header's predicate itself: a spec it does not take (another
    algorithm, group or width: a routing slip in Python) gets the generic steps' bits, not wrong ones."""
    acc = tensor_core(arch, a=ka)
    gen = torch.Generator().manual_seed(5)
    a3 = codes(acc.a, (2, 21, 37), gen, finite=False) if acc.a.name in CODES else torch.randn(2, 21, 37, generator=gen)
    b3 = codes(acc.b, (2, 37, 19), gen) if acc.b.name in CODES else torch.randn(2, 37, 19, generator=gen)
    y = torch.full((2, 21, 19), 3.0)
    _shim.launch(_tensor_core_op.tiled_launch_of(a3, b3, y, acc.params, fields(acc), kernel, 2))
    want = cpu(acc, a3, b3)
    assert torch.equal(y.view(torch.int32), want.view(torch.int32))
