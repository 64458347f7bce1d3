"""cpd::fused_dot_matmul's CUDA launch from C++ (cuda/cpu/launch.cpp cpd_launch::fused_dot), run
on CPU tensors through the host shim under cpd._shim.on_host: the parameter block and grid the GPU
gets, marshalled in C++, give the CPU extension's loops' bits (themselves checked against exact
oracles in test_tensor_core.py).

Invariants defended (no GPU needed):
* the kernel choice is cuda/include/cpd/fused_dot_tiled.h's own (fd_tiled_applies, fd_tiled_wide)
  and agrees with cpd/_tensor_core_op.py's Python mirror (tiled_kernel) on every model, scaled or
  not; the tile shape per architecture agrees with _tensor_core_op.tile_shape;
* under on_host the op's C++ CPU kernel launches the CUDA kernels through the shim (host_kernels
  on), and outside it the loops again; the bits equal the loops' for Hopper e4m3, Ada e4m3, fp16,
  Blackwell e4m3 (tiled, in every tile shape the shim can be given), block-scaled MX kinds, NVFP4
  and MXFP4 x MXFP4 (the chunk16 family), AMD CDNA1 / CDNA2 (the pairwise family), CDNA3 bf16 /
  xf32 / FP8 (_l8a / _l4a / _l16a), broadcast batch dims, NaN/inf operands;
* a bad tile shape is a clear error.
Shapes are small: the shim runs GPU threads one after another on one core (run with -n 0).
"""

import pytest
import torch

import cpd
from cpd import _cpu, _shim, _tensor_core_op
from cpd.tensor_core import FusedDot, tensor_core, tensor_core_matmul

pytestmark = [pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim"),
              pytest.mark.skipif(_cpu.extension() is None or not hasattr(_cpu.extension(), "fused_dot_kernel"),
                                 reason="no CPU extension with the C++ launches")]

SHAPES = list(_tensor_core_op.TILE_SHAPES)
MODELS = [("hopper", "e4m3"), ("hopper", "e5m2"), ("hopper", "fp16"), ("hopper", "bf16"), ("hopper", "tf32"),
          ("ada", "e4m3"), ("ampere", "fp16"), ("blackwell", "bf16"), ("blackwell", "e4m3"), ("blackwell", "e2m1"),
          ("blackwell", "tf32"), ("cdna3", "fp8"), ("cdna3", "fp16"), ("cdna3", "xf32"), ("cdna2", "fp16"),
          ("cdna1", "bf16"), ("volta", "fp16"),
          ("blackwell", "mxfp8_e5m2"), ("blackwell", "mxfp6_e2m3"), ("blackwell", "nvfp4")]


@pytest.fixture(scope="module")
def ext():
    e = _cpu.extension()
    cpd.cast(torch.zeros(4), cpd.E5M2)  # a public call installs the core's C++ kernels
    acc = tensor_core("hopper", a="e4m3")
    tensor_core_matmul(torch.zeros(2, 2), torch.zeros(2, 2), acc=acc)  # ... and the fused dot's
    assert _tensor_core_op._installed
    yield e
    e.set_fused_dot_host_shape("s1")


def fields(acc):
    return (acc.a.man, acc.a.emax, acc.b.man, acc.b.emax)


def spec(acc):
    return [*acc.params, acc.a.man, acc.b.man]


def same(x, y):
    return x.shape == y.shape and torch.equal(x.view(torch.int32), y.view(torch.int32))


@pytest.mark.parametrize("arch,ka", MODELS)
def test_kernel_choice_is_the_headers_and_agrees_with_python(ext, arch, ka):
    acc = tensor_core(arch, a=ka)
    for block in (0, 16, 32, 64, 48):  # 0: no block scales
        family = _tensor_core_op.tiled_kernel(acc.params, fields(acc), block)
        for shape in SHAPES:  # a shape the family lacks (s2 but at L 32 without scales) runs s2g2
            run = shape if shape in _tensor_core_op.shapes_of(acc.group, block) else "s2g2"
            want = "cpd_fused_dot_matmul" if family is None else f"{family}_{run}"
            assert ext.fused_dot_kernel(spec(acc), block, shape) == want, (arch, ka, block, shape)
    for group, frac in [(32, 23), (32, 25), (32, 26), (32, 27), (4, 25), (4, 26), (8, 26), (2, 23)]:
        # F > 26 leaves the tiled kernels, and so do L 4 with 64-bit sums (F 26) and L 2
        custom = FusedDot(group=group, frac_bits=frac, out="f32", a="e5m10", b="e5m10")
        family = _tensor_core_op.tiled_kernel(custom.params, fields(custom), False)
        run = "s2" if group == 32 else "s2g2"  # s2: L 32 only
        assert ext.fused_dot_kernel(spec(custom), 0, "s2") == (
            "cpd_fused_dot_matmul" if family is None else f"{family}_{run}"), (group, frac)


def test_tile_shape_per_architecture_agrees_with_python(ext):
    kib = 1024
    for major in (7, 8, 9, 10, 12):
        for optin in (48 * kib, 64 * kib, 96 * kib, 99 * kib, 163 * kib, 227 * kib):
            for group in (4, 8, 16, 32):
                for block in (0, 32):
                    assert ext.fused_dot_tile_shape(major, optin, group, block) == (_tensor_core_op.tile_shape(
                        (major, 0), optin, group, block) or ""), (major, optin, group, block)
            for group in (16, 64, 256):  # the chunk16 family (raw elements: its own shared memory)
                assert ext.fused_dot_tile_shape(major, optin, group, 16, _tensor_core_op.CHUNK16) == \
                    (_tensor_core_op.tile_shape((major, 0), optin, group, 16, True) or ""), (major, optin, group)
            for group in (2, 4):  # AMD pairwise (raw elements)
                assert ext.fused_dot_tile_shape(major, optin, group, 0, _tensor_core_op.AMD_PAIRWISE) == \
                    (_tensor_core_op.tile_shape((major, 0), optin, group, 0, True) or ""), (major, optin, group)
    with pytest.raises(RuntimeError, match="shape=s3; allowed s1, s2, s2g2"):
        ext.set_fused_dot_host_shape("s3")
    with pytest.raises(RuntimeError, match="shape"):
        ext.fused_dot_kernel(spec(tensor_core("hopper", a="e4m3")), 0, "")


def run_both(a, b, acc):
    want = tensor_core_matmul(a, b, acc=acc)
    with _shim.on_host():
        assert _cpu.extension().host_kernels()
        got = tensor_core_matmul(a, b, acc=acc)
    assert not _cpu.extension().host_kernels()
    return want, got


@pytest.mark.parametrize("arch,ka", [("hopper", "e4m3"), ("ada", "e4m3"), ("hopper", "fp16"), ("blackwell", "e4m3"),
                                     ("cdna3", "fp8"), ("cdna3", "bf16"), ("cdna3", "xf32"), ("hopper", "tf32"),
                                     ("volta", "fp16"), ("ampere", "bf16"),
                                     ("cdna2", "fp16"), ("cdna1", "bf16")])
@pytest.mark.parametrize("shape", SHAPES)
def test_shim_launch_matches_the_loops(ext, arch, ka, shape):
    """Ragged M, N, K (not multiples of the 64 x 64 tile nor K of the group), a broadcast batch dim,
    an inf and a NaN operand."""
    acc = tensor_core(arch, a=ka)
    if shape != "s1" and _tensor_core_op.tiled_kernel(acc.params, fields(acc), False) is None:
        pytest.skip("the per-output kernel has no tile shape")
    if shape not in _tensor_core_op.shapes_of(acc.group):
        pytest.skip(f"no {shape} kernel at L {acc.group} (s2g2 runs: test_kernel_choice_...)")
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(2, 1, 67, 45, generator=gen) * 4
    b = torch.randn(3, 45, 70, generator=gen)
    a[0, 0, 1, 3] = float("inf")
    b[1, 7, 2] = float("nan")
    ext.set_fused_dot_host_shape(shape)
    want, got = run_both(a, b, acc)
    assert want.shape == (2, 3, 67, 70)
    assert same(got, want), (arch, ka, shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ka", ["mxfp8_e4m3", "mxfp6_e2m3", "nvfp4", "mxfp4"])
def test_block_scaled_kinds_through_the_launch(ext, ka, shape):
    """The MX kinds on the scaled tiled kernel, NVFP4 and MXFP4 x MXFP4 on the chunk16 one, in every
    shape (C++ marshalling of the scales and of the chunk16 family's shared memory)."""
    if shape == "s2":
        pytest.skip("the scaled and chunk16 families have no s2 (s2g2 runs: test_kernel_choice_...)")
    ext.set_fused_dot_host_shape(shape)
    acc = tensor_core("blackwell", a=ka)
    assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), acc.a_block.block_size) == (
        "cpd_fused_dot_tiled_c16" if ka in ("nvfp4", "mxfp4") else "cpd_fused_dot_tiled_l32ws")
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(2, 9, 70, generator=gen) * 4
    b = torch.randn(70, 11, generator=gen)
    want, got = run_both(a, b, acc)
    assert same(got, want), ka


def test_direct_op_with_scales_and_broadcast(ext):
    """torch.ops.cpd.fused_dot_matmul with block scales broadcast over a batch dim, straight to the op."""
    acc = tensor_core("blackwell", a="mxfp8_e4m3")
    gen = torch.Generator().manual_seed(4)
    K, block = 64, 32
    a = cpd.cast(torch.randn(3, 5, K, generator=gen), cpd.E4M3)
    b = cpd.cast(torch.randn(K, 6, generator=gen), cpd.E4M3)
    sa = torch.exp2(torch.randint(-3, 4, (3, 5, K // block), generator=gen).float())
    sb = torch.exp2(torch.randint(-3, 4, (K // block, 6), generator=gen).float())
    args = (block, -127, *acc.params, *fields(acc))
    want = torch.ops.cpd.fused_dot_matmul(a, b, sa, sb, *args)
    with _shim.on_host():
        got = torch.ops.cpd.fused_dot_matmul(a, b, sa, sb, *args)
    assert got.shape == (3, 5, 6) and same(got, want)


def test_bad_block_scales_are_clear_errors(ext):
    acc = tensor_core("blackwell", a="mxfp8_e4m3")
    a, b = torch.ones(2, 64), torch.ones(64, 3)
    sa, sb = torch.ones(2, 2), torch.ones(2, 3)
    with _shim.on_host():
        for block, s_emin in ((0, -127), (32, 1), (16, -127)):
            with pytest.raises(RuntimeError, match="block scales want block >= 1"):
                torch.ops.cpd.fused_dot_matmul(a, b, sa, sb, block, s_emin, *acc.params, *fields(acc))
