"""The tiled fused-dot GEMM kernels (cuda/kernels/fused_dot.cu cpd_fused_dot_tiled_*; their
integer step in cuda/include/cpd/fused_dot_tiled.h) executed on the host by the shim give the CPU
extension's fused-dot matmul bits (itself checked against exact oracles in test_tensor_core.py).

Invariants defended (no GPU needed):
* every tiled kernel (L = 4, 8, 16, 32; 32- and 64-bit group sums) equals the CPU bit for bit, NaN
  payloads included, on random codes of the input formats (every bit pattern: NaN, inf,
  subnormals, zeros of both signs), wide-range exponents, cancellation, dominant products,
  operands with more fraction bits than the format (the flagged fallback), ragged shapes
  (M, N, K not multiples of the 64 x 64 tile nor K of the group) and batches;
* every tile shape built (one stage; cp.async double buffering with slices of one or two depths:
  cpd/_tensor_core_op.py TILE_SHAPES, shapes_of; groups of 4 / 8 share a slice of 16 or 32) gives those
  bits, K running over several slices, a partial last slice and a slice whose later groups lie
  past K; the shim runs a block's threads in turn
  between barriers, so a stage written before the barrier that should guard it shows as wrong bits;
* the scaled kernel (Blackwell's kind::mxf8f6f4: MXFP8/6/4 elements with E8M0 scales per 32)
  equals the CPU loops with the same scales, the ends of E8M0's range and NaN scales included;
* the chunk16 kernels (Blackwell's kind::mxf4 / mxf4nvf4: NVFP4, MXFP4 x MXFP4, E8M0 per 16;
  cpd_fused_dot_tiled_c16) equal the CPU loops in both their shapes, with groups spanning slices,
  a partial last chunk, E4M3 scales of every binade (subnormal, zero, max), E8M0's ends, scales
  that are not m 2^x with m < 16, NaN / inf / negative scales, elements that are not e2m1 values,
  overflow to inf and float32-subnormal results (the flagged and slow outputs' fd_chunk16_step),
  and custom groups (16 to 256) and F (0 to 40);
* the AMD pairwise kernels (CDNA1 fp16 / bf16, CDNA2's with their flushes: float32 products,
  pairwise sums and c + sum; cpd_fused_dot_tiled_amdp / _amdpz) equal the CPU loops in both
  shapes: subnormal inputs, products and sums (flushed or kept), NaN / inf operands, overflow,
  an odd K (a partial last group), signed zeros;
* cpd/_tensor_core_op.py tiled_kernel routes every NVIDIA model (Volta to Blackwell:
  FP16/BF16/TF32/FP8/FP4, L 4 to 32, F 13 to 25, the MX kinds and the chunk16 kinds) and
  CDNA1 / CDNA2 to the tiled kernels and leaves the others (CDNA3, other group sizes, L 4 with
  64-bit sums, block scales other than per 32 at L 32) alone; tile_shape picks a shape per GPU
  from cp.async and its shared memory.
Shapes are small: the shim runs GPU threads one after another on one core.
"""

import pytest
import torch

import cpd
from cpd import _cpu, _kernels, _shim, _tensor_core_op
from cpd.tensor_core import FusedDot, tensor_core

pytestmark = [pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim"),
              pytest.mark.skipif(_cpu.extension() is None, reason="no CPU extension")]

MODELS = [("hopper", "e4m3"), ("hopper", "e5m2"), ("hopper", "fp16"), ("hopper", "bf16"), ("ada", "e4m3"),
          ("blackwell", "bf16"), ("blackwell", "e4m3"), ("blackwell", "e5m2"), ("blackwell", "e2m1"),
          ("blackwell", "e4m3 x e5m2"), ("blackwell", "e4m3 f16"), ("custom", "fp16 L=32"),
          ("custom", "fp16 L=32 F=26"), ("volta", "fp16"), ("volta", "fp16 f16"), ("turing", "fp16"),
          ("ampere", "fp16 f16"), ("ampere", "bf16"), ("ampere", "tf32"), ("hopper", "tf32"),
          ("custom", "fp16 L=4 F=25"), ("custom", "e4m3 L=8 F=6")]
SHAPES = list(_tensor_core_op.TILE_SHAPES)


def model(arch, ka):
    if ka == "fp16 L=4 F=25":  # L = 4: the largest F of 32-bit sums (the largest taken at L 4)
        return FusedDot(group=4, frac_bits=25, out="f32", a="e5m10", b="e5m10")
    if ka == "e4m3 L=8 F=6":  # F = ma + mb: products kept exactly, nothing more (much is cut)
        return FusedDot(group=8, frac_bits=6, out="f32", a="e4m3fn", b="e4m3fn")
    if arch == "custom":  # L = 32 with 64-bit group sums; F = 26: the largest taken
        return FusedDot(group=32, frac_bits=26 if ka.endswith("F=26") else 25, out="f32", a="e5m10", b="e5m10")
    if ka.endswith(" f16"):  # an FP16 accumulator (RNE binary16 out)
        return tensor_core(arch, a=ka.split()[0], out="f16")
    if ka == "e4m3 x e5m2":
        return tensor_core(arch, a="e4m3", b="e5m2")
    return tensor_core(arch, a=ka)


# e2m1's 16 codes as float32 values (by the OCP MX spec's table: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6})
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1 = torch.cat([_E2M1, -_E2M1])
CODES = {"e4m3fn": (torch.uint8, torch.float8_e4m3fn), "e5m2": (torch.uint8, torch.float8_e5m2),
         "e5m10": (torch.int16, torch.float16), "e8m7": (torch.int16, torch.bfloat16), "e2m1finite": None,
         "e8m10": None, "e4m3fnuz": (torch.uint8, torch.float8_e4m3fnuz),
         "e5m2fnuz": (torch.uint8, torch.float8_e5m2fnuz)}


def fields(acc):
    return (acc.a.man, acc.a.emax, acc.b.man, acc.b.emax)


def cpu(acc, a3, b3):
    e = a3.new_empty((0,))
    return torch.ops.cpd_fused_dot.matmul(a3, b3, e, e, 1, -127, *acc.params, *fields(acc), 0)


def shim(acc, a3, b3, blocks=3, shape="s1"):
    kernel = _tensor_core_op.tiled_kernel(acc.params, fields(acc), False)
    assert kernel is not None
    y = torch.full((a3.shape[0], a3.shape[1], b3.shape[2]), 3.0)
    _shim.launch(_tensor_core_op.tiled_launch_of(a3, b3, y, acc.params, fields(acc), kernel, blocks, shape))
    return y


def codes(fmt, shape, gen, finite=True):
    """Random bit patterns of fmt (one of CODES) as float32 values."""
    if fmt.name.startswith("e2m1"):  # every code is finite
        return _E2M1[torch.randint(0, 16, shape, generator=gen)]
    if fmt.name == "e8m10":  # TF32: float32 bit patterns with the low 13 fraction bits clear
        x = torch.randint(-(2 ** 31), 2 ** 31, shape, generator=gen, dtype=torch.int64) & ~0x1FFF
        x = x.to(torch.int32).view(torch.float32)
    else:
        itype, ftype = CODES[fmt.name]
        bits = 8 * torch.empty((), dtype=itype).element_size()
        x = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), shape, generator=gen).to(itype)
        x = x.view(ftype).float()
    if finite:
        x = torch.where(torch.isfinite(x), x, torch.zeros(()))
    return x


def built(acc, shape, block=0):
    """Skip a shape the family is not built in (s2 exists for L 32 without scales only)."""
    if shape not in _tensor_core_op.shapes_of(acc.group, block):
        pytest.skip(f"no {shape} kernel for L {acc.group}{' with scales' if block else ''}")


def check(acc, a3, b3, shape="s1"):
    want, got = cpu(acc, a3, b3), shim(acc, a3, b3, shape=shape)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (shape, (got - want).abs().max())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("arch,ka", MODELS)
def test_random_codes_ragged_batched(arch, ka, shape):
    """K = 45: one partial slice of two groups (s2g2), two slices of one (s1, s2) at L 32; three
    at L 16 (two full slices and a partial one for s2g2: its second group past K)."""
    acc = model(arch, ka)
    built(acc, shape)
    gen = torch.Generator().manual_seed(sum(map(ord, arch + ka)))
    a3 = codes(acc.a, (2, 70, 45), gen)
    b3 = codes(acc.b, (2, 45, 67), gen)
    check(acc, a3, b3, shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("arch,ka", [("hopper", "e4m3"), ("blackwell", "e4m3"), ("hopper", "fp16"), ("ada", "e4m3"),
                                     ("volta", "fp16"), ("hopper", "tf32")])
def test_many_slices(arch, ka, shape):
    """K = 200: several slices in every shape (double buffering alternates its stages more than
    once), the last one partial; two tiles per block (grid-stride: each tile starts its stages anew)."""
    acc = model(arch, ka)
    built(acc, shape)
    gen = torch.Generator().manual_seed(7)
    a3 = codes(acc.a, (1, 70, 200), gen)
    b3 = codes(acc.b, (1, 200, 9), gen)
    want, got = cpu(acc, a3, b3), shim(acc, a3, b3, blocks=1, shape=shape)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), shape


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("arch,ka", MODELS)
def test_specials_and_extra_fraction_bits(arch, ka, shape):
    """NaN/inf codes anywhere, and float32 operands that are not values of the format: the outputs
    they reach take fd_step for that group (NaN payloads and all)."""
    acc = model(arch, ka)
    built(acc, shape)
    gen = torch.Generator().manual_seed(11)
    a3 = codes(acc.a, (1, 33, 70), gen, finite=False)
    b3 = codes(acc.b, (1, 70, 20), gen)
    b3[0, 3, 4] = float("inf")
    b3[0, 40, 5] = -float("inf")
    a3[0, 7, 40] = 1.0 + 2.0 ** -20  # more fraction bits than any of the formats
    b3[0, 50, 9] = torch.randn(()).item()
    a3[0, 9, 66] = float("nan")
    check(acc, a3, b3, shape)


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
    for ka in ("e4m3", "e5m2", "e2m1", "e4m3 x e5m2", "e4m3 f16"):  # Blackwell FP8/FP4: L 32, F 25: 64-bit sums
        assert routed[("blackwell", ka)] == "cpd_fused_dot_tiled_l32w", ka
    assert routed[("blackwell", "bf16")] == "cpd_fused_dot_tiled_l16w"
    # L 4 / 8: Volta (F 23), Turing and Ampere (F 24: 32-bit sums), Hopper's TF32 (F 25: 64-bit at L 8)
    assert routed[("volta", "fp16")] == routed[("volta", "fp16 f16")] == "cpd_fused_dot_tiled_l4"
    assert routed[("ampere", "tf32")] == routed[("custom", "fp16 L=4 F=25")] == "cpd_fused_dot_tiled_l4"
    assert routed[("turing", "fp16")] == routed[("ampere", "bf16")] == routed[("ampere", "fp16 f16")] \
        == routed[("custom", "e4m3 L=8 F=6")] == "cpd_fused_dot_tiled_l8"
    assert routed[("hopper", "tf32")] == "cpd_fused_dot_tiled_l8w"
    for arch in ("ada", "ampere", "blackwell"):
        acc = tensor_core(arch, a="tf32")
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), False) == \
            ("cpd_fused_dot_tiled_l8w" if arch == "blackwell" else "cpd_fused_dot_tiled_l4"), arch
    for ka, want in [("fp8", "cpd_fused_dot_tiled_l16a"), ("xf32", "cpd_fused_dot_tiled_l4a"),
                     ("bf16", "cpd_fused_dot_tiled_l8a")]:
        acc = tensor_core("cdna3", a=ka)  # FP8's even / odd halves: _l16a (test_cdna3_routing)
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), False) == want, ka
    for arch, ka, want in [("cdna1", "fp16", "amdp"), ("cdna1", "bf16", "amdp"), ("cdna2", "fp16", "amdpz"),
                           ("cdna2", "bf16", "amdpz")]:
        acc = tensor_core(arch, a=ka)
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), False) == f"cpd_fused_dot_tiled_{want}"
        assert _tensor_core_op.tiled_kernel(acc.params._replace(group=8), fields(acc), False) is None
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), 32) is None  # no scales on AMD
    for group, frac, routed_to in [(4, 26, None), (2, 23, None), (12, 23, None), (8, 26, "cpd_fused_dot_tiled_l8w")]:
        acc = FusedDot(group=group, frac_bits=frac, out="f32", a="e5m10", b="e5m10")  # L 4 takes 32-bit sums only
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), False) == routed_to, (group, frac)
    acc = tensor_core("hopper", a="e4m3")
    assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), 32) is None  # block scales: L 32, 64-bit sums only
    assert routed[("custom", "fp16 L=32 F=26")] == "cpd_fused_dot_tiled_l32w"
    acc = FusedDot(group=16, frac_bits=27, out="f32", a="e5m10", b="e5m10")  # F > 26: 8 terms overflow 32 bits
    assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), False) is None


MX_KINDS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8_e4m3 x mxfp4", "mxfp4 x mxfp6_e3m2"]


def mx_model(ka):
    a, _, b = ka.partition(" x ")
    return tensor_core("blackwell", a=a, b=b or None)


def test_block_scaled_routing():
    """Blackwell's kind::mxf8f6f4 kinds (L 32, F 25, an E8M0 scale per 32 elements) take the scaled
    tiled kernel; NVFP4 and MXFP4 x MXFP4 (kind::mxf4nvf4: 16-element chunks, another algorithm) the
    chunk16 one; scales per 16 or per a block that is not a multiple of L, and scaled specs of
    other groups keep the per-output kernel."""
    for ka in MX_KINDS:
        acc = mx_model(ka)
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), acc.a_block.block_size) == \
            "cpd_fused_dot_tiled_l32ws", ka
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), 0) == "cpd_fused_dot_tiled_l32w", ka
        for block in (16, 48, -32):
            assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), block) is None, (ka, block)
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), 64) == "cpd_fused_dot_tiled_l32ws"
    for ka in ("nvfp4", "mxfp4"):  # kind::mxf4nvf4 (MXFP4 with MXFP4: k64, chunks of 16): their own family
        acc = tensor_core("blackwell", a=ka)
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), acc.a_block.block_size) == \
            "cpd_fused_dot_tiled_c16"
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), 0) is None  # chunk16 without scales
    for arch, ka in (("hopper", "fp16"), ("ampere", "bf16"), ("hopper", "e4m3")):  # L 16 / 8 / 32-bit sums
        acc = tensor_core(arch, a=ka)
        assert _tensor_core_op.tiled_kernel(acc.params, fields(acc), 32) is None, (arch, ka)


def elements(fmt, shape, gen):
    """Random values of an MX element format: every code where CODES has the format, else values
    of many binades (subnormals and zeros too) rounded to it."""
    if fmt.name in CODES:
        return codes(fmt, shape, gen)
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-5, 4, shape, generator=gen).float())
    return cpd.cast(x, fmt, saturate=True)


def e8m0(shape, gen, specials):
    """E8M0 scale values: mostly 2^-4 .. 2^4, with the range's ends (2^-127, a float32 subnormal,
    and 2^127: products past float32's range) and, with ``specials``, NaN scales."""
    e = torch.randint(-4, 5, shape, generator=gen)
    flat = e.view(-1)
    pick = torch.randperm(flat.numel(), generator=gen)
    flat[pick[:3]] = -127
    flat[pick[3:6]] = 127
    flat[pick[6:8]] = -126
    sc = torch.exp2(e.double()).float()
    if specials:
        sc.view(-1)[pick[8:10]] = float("nan")
    return sc


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ka", MX_KINDS)
def test_block_scaled_kinds(ka, shape):
    """The scaled kernel == the CPU loops with the same elements and E8M0 scales: ragged shapes
    (K = 77: three blocks, the last partial), batches, scales at the ends of E8M0's range
    (overflow to inf, 2^-127 products cut to nothing) and NaN scales (fd_step for those outputs)."""
    acc = mx_model(ka)
    built(acc, shape, acc.a_block.block_size)
    gen = torch.Generator().manual_seed(sum(map(ord, ka + shape)))
    B, M, K, N, block = 2, 67, 77, 70, acc.a_block.block_size
    nb = -(-K // block)
    a3, b3 = elements(acc.a, (B, M, K), gen), elements(acc.b, (B, K, N), gen)
    sa, sb = e8m0((B, M, nb), gen, specials=True), e8m0((B, nb, N), gen, specials=True)
    s_emin = acc.a_block.scale.emin
    want = torch.ops.cpd_fused_dot.matmul(a3, b3, sa, sb, block, s_emin, *acc.params, *fields(acc), 0)
    kernel = _tensor_core_op.tiled_kernel(acc.params, fields(acc), block)
    y = torch.full((B, M, N), 3.0)
    _shim.launch(_tensor_core_op.tiled_launch_of(a3, b3, y, acc.params, fields(acc), kernel, 3, shape, sa, sb, block,
                                                 s_emin))
    assert torch.equal(y.view(torch.int32), want.view(torch.int32)), (ka, shape)
    assert torch.isinf(want).any() and torch.isnan(want).any()  # the ends were reached


def test_tile_shape_per_architecture():
    """Two stages where cp.async exists (sm_80+), slices of twice the depth where the block's shared
    memory holds them (groups of 4 / 8: 16 / 32 elements per slice, several groups); the sizes are fused_dot.cu's FdShape (S = 1: today's 17 / 33 KiB)."""
    smem, shape = _tensor_core_op.tile_smem, _tensor_core_op.tile_shape
    assert [smem(32, s) for s in SHAPES] == [33 * 1024, 65 * 1024, 130 * 1024]
    assert [smem(16, s) for s in SHAPES] == [17 * 1024, 33 * 1024, 66 * 1024]
    assert [smem(8, s) for s in SHAPES] == [18 * 1024, 34 * 1024, 68 * 1024]  # 2 / 2 / 4 groups of 8
    assert [smem(4, s) for s in SHAPES] == [20 * 1024, 36 * 1024, 72 * 1024]  # 4 / 4 / 8 groups of 4
    assert [_tensor_core_op.slice_groups(4, s) for s in SHAPES] == [4, 4, 8]
    kib = 1024
    assert shape((7, 0), 96 * kib, 32) == "s1" and shape((7, 5), 64 * kib, 16) == "s1"  # no cp.async
    assert shape((8, 0), 163 * kib, 32) == "s2g2" and shape((9, 0), 227 * kib, 32) == "s2g2"
    assert shape((8, 9), 99 * kib, 32) == "s2" and shape((8, 6), 99 * kib, 16) == "s2g2"
    assert shape((8, 6), 99 * kib, 4) == shape((8, 6), 99 * kib, 8) == "s2g2" and shape((7, 0), 96 * kib, 4) == "s1"
    # from sm_80 no s1 is built but the scaled L 32 family's: where nothing built fits, the per-output kernel
    assert shape((8, 0), 70 * kib, 4) is None and shape((8, 0), 70 * kib, 8) == "s2g2"  # no s2 at L 4
    assert shape((8, 9), 99 * kib, 32, 32) == "s1" and shape((9, 0), 227 * kib, 32, 32) == "s2g2"  # MX: no s2
    assert shape((8, 0), 48 * kib, 32) is None and shape((8, 0), 48 * kib, 32, 32) == "s1"
    assert shape((7, 5), 16 * kib, 16) is None  # not even s1
    shapes_of = _tensor_core_op.shapes_of
    assert shapes_of(32) == ("s1", "s2", "s2g2")  # the host shim's: every shape
    assert shapes_of(16) == shapes_of(32, 32) == shapes_of(32, raw=True) == ("s1", "s2g2")
    assert shapes_of(32, major=7) == shapes_of(4, 32, 7) == shapes_of(64, 16, 7, True) == ("s1",)
    assert shapes_of(32, major=8) == ("s2", "s2g2") and shapes_of(32, 32, 9) == ("s1", "s2g2")
    assert shapes_of(16, major=9) == shapes_of(4, major=12) == shapes_of(32, 16, 10, True) == ("s2g2",)
    acc = model("hopper", "e4m3")
    z = torch.zeros(1, 1, 1)
    for s in SHAPES:
        launch = _tensor_core_op.tiled_launch_of(z, z, z, acc.params, fields(acc), "cpd_fused_dot_tiled_l32", 1, s)
        assert launch.name == f"cpd_fused_dot_tiled_l32_{s}" and launch.smem == smem(32, s)
    with pytest.raises(ValueError, match="smem"):
        _kernels.Launch("fused_dot.cu", "k", (1, 1, 1), (1, 1, 1), (), smem=_kernels.DYNAMIC_SMEM_MAX + 1)
    with pytest.raises(ValueError, match="shape"):
        _tensor_core_op.tiled_launch_of(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1),
                                        model("hopper", "e4m3").params, fields(model("hopper", "e4m3")),
                                        "cpd_fused_dot_tiled_l32", 1, "s3")
    with pytest.raises(ValueError, match="shape='s2'; allowed \\['s1', 's2g2'\\]"):
        _tensor_core_op.tiled_launch_of(z, z, z, model("hopper", "fp16").params, fields(model("hopper", "fp16")),
                                        "cpd_fused_dot_tiled_l16w", 1, "s2")


@pytest.mark.parametrize("kernel", ["cpd_fused_dot_tiled_l32", "cpd_fused_dot_tiled_l16w", "cpd_fused_dot_tiled_l16a"])
@pytest.mark.parametrize("arch,ka", [("blackwell", "tf32"), ("cdna3", "fp8"), ("ampere", "fp16"), ("hopper", "fp16"),
                                     ("hopper", "e4m3")])
def test_a_spec_outside_the_kernel_gets_the_generic_bits(kernel, arch, ka):
    """Each tiled kernel checks the header's predicate itself: a spec it does not take (another
    algorithm, group or width: a routing slip in Python) gets the generic steps' bits, not wrong ones."""
    acc = tensor_core(arch, a=ka)
    gen = torch.Generator().manual_seed(5)
    a3 = codes(acc.a, (2, 21, 37), gen, finite=False) if acc.a.name in CODES else torch.randn(2, 21, 37, generator=gen)
    b3 = codes(acc.b, (2, 37, 19), gen) if acc.b.name in CODES else torch.randn(2, 37, 19, generator=gen)
    y = torch.full((2, 21, 19), 3.0)
    _shim.launch(_tensor_core_op.tiled_launch_of(a3, b3, y, acc.params, fields(acc), kernel, 2, "s2g2"))
    want = cpu(acc, a3, b3)
    assert torch.equal(y.view(torch.int32), want.view(torch.int32))


# ------------------------------------------------------------------ chunk16 (kind::mxf4 / mxf4nvf4)
C16_KINDS = ["nvfp4", "mxfp4", "mxfp4 per 16"]
C16_SHAPES = ["s1", "s2g2"]


def c16_model(ka):
    if ka == "mxfp4 per 16":  # kind::mxf4nvf4 with E8M0 scales per 16
        return tensor_core("blackwell", a=cpd.mx.BlockFormat(cpd.E2M1, block_size=16, scale=cpd.E8M0, name="mxfp4_16"))
    return tensor_core("blackwell", a=ka)


def c16_elements(shape, gen):
    """e2m1 values, with a few that are not (flagged: fd_chunk16_step's bits for their outputs)."""
    x = _E2M1[torch.randint(0, 16, shape, generator=gen)]
    flat = x.view(-1)
    pick = torch.randperm(flat.numel(), generator=gen)[:10]
    flat[pick] = torch.tensor([0.75, 5.0, 0.25, 7.0, -1e-30, 1.0 + 2.0 ** -20, float("nan"), float("inf"),
                               -float("inf"), 12.0])
    return x


def c16_scales(fmt, shape, gen):
    """Scale values of fmt's scale format over its range (E4M3: every binade, subnormals, zero,
    448; E8M0: 2^-127 .. 2^127), plus scales no kind produces: NaN, inf, negative, a float32
    subnormal m 2^x, and ones with more than four significant bits (flagged)."""
    if fmt.scale == cpd.E8M0:
        sc = e8m0(shape, gen, specials=True)
    else:
        codes_ = torch.randint(0, 127, shape, generator=gen).to(torch.uint8)  # positive E4M3 codes (no NaN)
        sc = codes_.view(torch.float8_e4m3fn).float()
    flat = sc.view(-1)
    pick = torch.randperm(flat.numel(), generator=gen)[:7]
    flat[pick] = torch.tensor([float("nan"), float("inf"), -2.0, 3 * 2.0 ** -140, 2.0 ** -149, 1.0 + 2.0 ** -10,
                               17.0])
    return sc


def c16_check(acc, shape, B, M, K, N, seed, blocks=3, block=None):
    gen = torch.Generator().manual_seed(seed)
    block = block or acc.a_block.block_size
    nb = -(-K // block)
    a3, b3 = c16_elements((B, M, K), gen), c16_elements((B, K, N), gen)
    sa, sb = c16_scales(acc.a_block, (B, M, nb), gen), c16_scales(acc.b_block, (B, nb, N), gen)
    if acc.a_block.scale == cpd.E8M0:  # outputs (., 1, 1) below 2^-126: float32 subnormals
        sa[:, 1, :], sb[:, :, 1] = 2.0 ** -127, 2.0 ** -10
    s_emin = acc.a_block.scale.emin
    want = torch.ops.cpd_fused_dot.matmul(a3, b3, sa, sb, block, s_emin, *acc.params, *fields(acc), 0)
    kernel = _tensor_core_op.tiled_kernel(acc.params, fields(acc), block)
    assert kernel == "cpd_fused_dot_tiled_c16"
    y = torch.full((B, M, N), 3.0)
    _shim.launch(_tensor_core_op.tiled_launch_of(a3, b3, y, acc.params, fields(acc), kernel, blocks, shape, sa, sb,
                                                 block, s_emin))
    assert torch.equal(y.view(torch.int32), want.view(torch.int32)), (acc, shape, (y != want).sum())
    return want


@pytest.mark.parametrize("shape", C16_SHAPES)
@pytest.mark.parametrize("ka", C16_KINDS)
def test_chunk16_kinds(ka, shape):
    """The chunk16 kernel == the CPU loops: K = 150 (groups of 64, 64 and 22: groups across s1's
    slices of 32, a partial last chunk), ragged M and N, batches, grid-stride tiles."""
    want = c16_check(c16_model(ka), shape, 2, 67, 150, 70, sum(map(ord, ka + shape)))
    assert torch.isnan(want).any()
    if ka != "nvfp4":  # E8M0's ends: overflow past 2^128, and results below 2^-126 (the slow rounding)
        assert torch.isinf(want).any()
        small = want[torch.isfinite(want)].abs()
        assert ((small > 0) & (small < 2.0 ** -126)).any()


@pytest.mark.parametrize("group,frac", [(16, 0), (32, 20), (128, 40), (256, 35), (48, 12)])
def test_chunk16_custom_groups(group, frac):
    """Groups of 16 to 256 chunks' worth (several slices per group, or several groups per slice),
    F from 0 (most is cut) to 40 (the largest taken: 64-bit sums)."""
    base = c16_model("nvfp4")
    acc = FusedDot(group=group, frac_bits=frac, out="f32", algorithm="nvidia_chunk16", a_block=base.a_block,
                   b_block=base.b_block)
    for shape in C16_SHAPES:
        c16_check(acc, shape, 1, 33, 300, 20, group + frac, blocks=1)


@pytest.mark.parametrize("block", [24, 48, 64])
def test_chunk16_other_blocks(block):
    """Scales per 24, 48 or 64 elements (the raw op's; no kind has them): a chunk takes the scale
    of its first element, which the kernel's counters follow without a division."""
    for shape in C16_SHAPES:
        c16_check(c16_model("nvfp4"), shape, 1, 40, 230, 30, block, blocks=2, block=block)


def test_chunk16_routing_and_shapes():
    base = c16_model("nvfp4")
    route = _tensor_core_op.tiled_kernel
    for group, frac, want in [(64, 35, "cpd_fused_dot_tiled_c16"), (256, 40, "cpd_fused_dot_tiled_c16"),
                              (512, 35, None)]:
        acc = FusedDot(group=group, frac_bits=frac, out="f32", algorithm="nvidia_chunk16", a_block=base.a_block,
                       b_block=base.b_block)
        assert route(acc.params, fields(acc), 16) == want, (group, frac)
    # what the raw op alone can ask for: F 41 (64-bit sums no longer hold), a binary16 output (not
    # the kernel's float32 rounding), elements of more than one fraction bit
    assert route(base.params._replace(frac=41), fields(base), 16) is None
    assert route(base.params._replace(group=40), fields(base), 16) is None
    assert route(base.params._replace(out=2), fields(base), 16) is None
    assert route(base.params, (3, 15, 1, 2), 16) is None
    assert route(base.params, fields(base), 8) is None  # scales per fewer than 16: a chunk spans several
    kib = 1024
    assert [_tensor_core_op.tile_smem(64, s, raw=True) for s in C16_SHAPES] == [17 * kib, 67 * kib]
    shape = _tensor_core_op.tile_shape
    assert shape((7, 5), 64 * kib, 64, 16, True) == "s1" and shape((8, 6), 99 * kib, 64, 16, True) == "s2g2"
    assert shape((8, 0), 48 * kib, 64, 16, True) is None and shape((9, 0), 227 * kib, 64, 16, True) == "s2g2"
    z = torch.zeros(1, 1, 1)
    launch = _tensor_core_op.tiled_launch_of(z, z, z, base.params, fields(base), "cpd_fused_dot_tiled_c16", 1, "s2g2",
                                             z, z, 16, -9)
    assert launch.name == "cpd_fused_dot_tiled_c16_s2g2" and launch.smem == 67 * kib


# ------------------------------------------------------------------ AMD pairwise (CDNA1, CDNA2)
AMD_MODELS = [("cdna1", "fp16"), ("cdna1", "bf16"), ("cdna2", "fp16"), ("cdna2", "bf16")]


@pytest.mark.parametrize("shape", C16_SHAPES)
@pytest.mark.parametrize("arch,ka", AMD_MODELS)
def test_amd_pairwise_kernels(arch, ka, shape):
    """The AMD pairwise kernels == the CPU loops: random codes of the input format (every bit
    pattern: subnormals, which CDNA2 flushes, NaN, inf, signed zeros), values over many binades
    (products and sums past float32's range and below its normals), an odd K (a partial last
    group of 4, a lone last element at L 2), several slices and tiles."""
    acc = tensor_core(arch, a=ka)
    kernel = _tensor_core_op.tiled_kernel(acc.params, fields(acc), 0)
    assert kernel == f"cpd_fused_dot_tiled_{'amdpz' if arch == 'cdna2' else 'amdp'}"
    gen = torch.Generator().manual_seed(sum(map(ord, arch + ka + shape)))
    B, M, K, N = 2, 67, 75, 70
    a3 = codes(acc.a, (B, M, K), gen)
    spread = torch.randn(B, K, N, generator=gen) * torch.exp2(torch.randint(-70, 70, (B, K, N), generator=gen).float())
    b3 = cpd.cast(spread, acc.b, saturate=True)
    b3[0, :, :3] = codes(acc.b, (K, 3), gen)
    a3[1, :5] = 2.0 ** acc.a.emin * 0.5  # subnormal inputs in every step of some outputs
    a3[1, 5:8] = -0.0
    a3[0, 9, 4], a3[1, 10, 70], b3[0, 11, 12] = float("nan"), float("inf"), -float("inf")
    e = a3.new_empty((0,))
    want = torch.ops.cpd_fused_dot.matmul(a3, b3, e, e, 1, -127, *acc.params, *fields(acc), 0)
    y = torch.full((B, M, N), 3.0)
    _shim.launch(_tensor_core_op.tiled_launch_of(a3, b3, y, acc.params, fields(acc), kernel, 3, shape))
    assert torch.equal(y.view(torch.int32), want.view(torch.int32)), (arch, ka, shape, (y != want).sum())
    assert torch.isnan(want).any() and torch.isinf(want).any()


# ------------------------------------------------------------------ AMD CDNA3 fp16 / bf16 / xf32 / fp8 / bf8
CDNA3_MODELS = ["fp16", "bf16", "xf32"]
CDNA3_FP8 = ["fp8", "bf8", "fp8 x bf8", "bf8 x fp8"]  # the even / odd halves (_l16a)


def cdna3_model(ka):
    a, _, b = ka.partition(" x ")
    return tensor_core("cdna3", a=a, b=b or None)


@pytest.mark.parametrize("shape", C16_SHAPES)
@pytest.mark.parametrize("ka", CDNA3_MODELS + CDNA3_FP8)
def test_cdna3_kernels(ka, shape):
    """The CDNA3 kernels (_l8a / _l4a / _l16a: the NVIDIA words and passes with F 24 and emax
    over the products alone, fp8's halves apart, then the step's round-down alignment against c)
    == the CPU loops: random codes of the input format (every bit pattern: subnormals, NaN, inf,
    signed zeros), values over many binades (bf16 / xf32 products past 2^128, which take fd_step,
    and below float32's normals), groups whose products cancel exactly (c alone, or a tiny
    negative c: the one-unit asymmetry of rounding down; at fp8, the even half against the odd),
    fp8's halves far apart (the smaller half rounded down, of either sign) and a small c cut off
    by a later group, an odd K (a partial last group), several slices and tiles."""
    acc = cdna3_model(ka)
    fp8 = ka in CDNA3_FP8
    kernel = _tensor_core_op.tiled_kernel(acc.params, fields(acc), 0)
    assert kernel == f"cpd_fused_dot_tiled_l{acc.group}a"
    gen = torch.Generator().manual_seed(sum(map(ord, ka + shape)))
    B, M, K, N = 2, 67, 75, 70
    reach = 15 if ka == "fp16" else 9 if fp8 else 40

    def spread(shp, lo=-reach, hi=reach, fmt=acc.a):
        return cpd.cast(torch.randn(*shp, generator=gen) * torch.exp2(torch.randint(lo, hi, shp, generator=gen).float()),
                        fmt, saturate=True)

    a3, b3 = spread((B, M, K)), spread((B, K, N), fmt=acc.b)
    if fp8:  # rows 28-33: the even half far above the odd (or below), either sign; then a c cut off
        a3[1, 28:34] = spread((6, K), -9, -6)
        a3[1, 28:31, 0::2] = spread((3, (K + 1) // 2), 5, 7)
        a3[1, 31:34, 1::2] = spread((3, K // 2), 5, 7)
        a3[1, 33, :16] = spread((16,), -9, -8)  # group 0: a small c; group 1: products 2^10 above it
        a3[1, 34] = 0.0  # c = -2^-20 after group 0, then 2^14: c cut off (25 binades below), 2^14 exactly
        a3[1, 34, 0], a3[1, 34, 16], b3[1, 0, 60:62], b3[1, 16, 60:62] = 2.0 ** -10, 2.0 ** 7, -(2.0 ** -10), 2.0 ** 7
    elif ka != "fp16":  # products past 2^128 (fd_step's infinities), and results below 2^-126 (fd_step's too)
        a3[0, 40:44], b3[0, :, 40:44] = spread((4, K), 90, 127), spread((K, 4), 20, 127)
        a3[0, 30:36], b3[0, :, 20:26] = spread((6, K), -90, -60), spread((K, 6), -90, -60)
    a3[0, :7] = codes(acc.a, (7, K), gen, finite=False)
    b3[1, :, :5] = codes(acc.b, (K, 5), gen)
    a3[1, 20:23] = 1.0 + torch.arange(K).float() % 3  # products cancelling in pairs: k even + k odd
    a3[1, 20:23, 1::2] *= -1.0
    b3[1, 1::2, 10:14] = b3[1, 0:-1:2, 10:14]
    a3[1, 22, -1] = 2.0 ** -20  # a tiny last product: a small c of either sign meets a zero sum
    a3[1, 25:27] = 0.0
    a3[1, 26, :3] = -0.0
    a3[0, 9, 4], a3[1, 10, 70], b3[0, 11, 12] = float("nan"), float("inf"), -float("inf")
    want = cpu(acc, a3, b3)
    y = torch.full((B, M, N), 3.0)
    _shim.launch(_tensor_core_op.tiled_launch_of(a3, b3, y, acc.params, fields(acc), kernel, 3, shape))
    assert torch.equal(y.view(torch.int32), want.view(torch.int32)), (ka, shape, (y != want).sum())
    assert torch.isnan(want).any() and torch.isinf(want).any()
    assert (want[1, 20:23, 10:14] != 0).any() and (want == 0).any()
    if fp8:  # the fp8 paths reached: the halves' join rounding down, and c cut off
        e = a3.new_empty((0,))  # the same rows without halves (amd_cdna3's algorithm) differ
        whole = torch.ops.cpd_fused_dot.matmul(a3, b3, e, e, 1, -127, *acc.params._replace(algo=_tensor_core_op.AMD_RD),
                                               *fields(acc), 0)
        assert not torch.equal(want[1, 28:34], whole[1, 28:34])
        assert (want[1, 34, 60:62] == 2.0 ** 14).all()
    elif ka != "fp16":  # both reached, and most outputs finite (the tiled path's)
        assert ((want.abs() < 2.0 ** -126) & (want != 0)).any() and not torch.isfinite(want[0, 40:44, 40:44]).any()
        assert torch.isfinite(want).float().mean() > 0.5


def test_cdna3_routing():
    """_tensor_core_op.tiled_kernel mirrors cpd::fd_amdrd_applies / fd_amdrd8_applies: CDNA3's fp16 /
    bf16 (L 8) and xf32 (L 4) take _l8a / _l4a, its fp8 / bf8 and their mixes (even / odd halves,
    L 16) _l16a, other groups, outputs and block scales the per-output kernel; the C++ launch
    picks the same (test_fused_dot_launch.py)."""
    route = _tensor_core_op.tiled_kernel
    for ka in CDNA3_MODELS:
        acc = tensor_core("cdna3", a=ka)
        assert route(acc.params, fields(acc), 0) == f"cpd_fused_dot_tiled_l{acc.group}a"
        assert route(acc.params, fields(acc), 32) is None  # no block scales
        assert route(acc.params._replace(group=16), fields(acc), 0) is None
    for ka in CDNA3_FP8:  # the even / odd halves: _l16a (cpd::fd_amdrd8_applies)
        fp8 = cdna3_model(ka)
        assert route(fp8.params, fields(fp8), 0) == "cpd_fused_dot_tiled_l16a"
        assert route(fp8.params, fields(fp8), 16) is None
        assert route(fp8.params._replace(group=8), fields(fp8), 0) is None
        assert route(fp8.params._replace(out=1), fields(fp8), 0) is None
    acc = tensor_core("cdna3", a="fp16")
    assert route(acc.params, (13, 15, 12, 15), 0) is None  # 13 + 12 > 24 fraction bits of products
