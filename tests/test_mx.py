"""cpd.mx: block-scaled formats (OCP MX v1.0, NVFP4) against an independent reference.

Invariants defended:
* ``cpd.mx.cast`` equals tests/mx_oracle.py (the spec's shared-scale rule and exact element
  rounding, block by block) for every preset, every scale rule, deterministic rounding modes,
  ragged last blocks, any axis, NaN/inf blocks, all-zero blocks, tiny and huge blocks; and gfloat's
  ``quantize_block`` for the MXFP presets;
* ``decode(encode(x)) == cast(x)`` bit for bit, packed 4/6-bit codes round-trip, MXINT8 codes are
  two's complement, scale codes are E8M0 codes;
* stochastic rounding picks one of the two neighbours and is reproducible with a generator;
* the custom op has a fake implementation (opcheck), compiles with ``torch.compile(fullgraph=True)``
  and passes gradients straight through; bad arguments are clear errors.
"""

import math

import numpy as np
import pytest
import torch

import cpd
import mx_oracle
from cpd import mx


def data(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 12, shape, generator=g).float())
    k = min(3, x.numel())
    x.view(-1)[:k] = torch.tensor([0.0, -0.0, 3.0])[:k]
    return x


def same(a: torch.Tensor, b: np.ndarray) -> bool:
    bt = torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32))
    return bool(((a.contiguous().view(torch.int32) == bt.view(torch.int32)) | (a.isnan() & bt.isnan())).all())


PRESETS = list(mx.PRESETS.values())
VARIANTS = [mx.BlockFormat(cpd.E4M3FN, 8, scale_rule="ceil"), mx.BlockFormat(cpd.E2M1, 5, scale_rule="even"),
            mx.BlockFormat(cpd.E5M2, 4, scale_rule="amax"), mx.BlockFormat("e3m2fn", 7, axis=0),
            mx.BlockFormat(cpd.E2M1, 16, scale=cpd.E4M3FN, scale_rule="amax"),
            mx.BlockFormat("int8", 3, scale_rule="ceil")]


@pytest.mark.parametrize("fmt", PRESETS + VARIANTS, ids=lambda f: f.name)
@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "nearest_away"])
def test_cast_matches_reference(fmt, mode):
    x = data((3, 45), seed=hash(fmt.name) % 100)  # 45: a ragged last block for every size
    x[1, 5:9] = torch.tensor([1e-30, 2e30, -7.0, 0.1])  # extremes in one block
    x[2, :] = 0.0  # all-zero row
    got = mx.cast(x, fmt, mode)
    assert same(got, mx_oracle.quantize(x.numpy(), fmt, mode)), (fmt.name, mode)
    assert torch.equal(mx.decode(mx.encode(x, fmt, mode)).view(torch.int32), got.view(torch.int32))


def test_nan_and_inf_blocks_are_nan():
    x = torch.ones(2, 64)
    x[0, 3] = math.nan
    x[1, 40] = math.inf
    y = mx.cast(x, mx.MXFP8_E4M3)
    assert bool(y[0, :32].isnan().all()) and not bool(y[0, 32:].isnan().any())
    assert bool(y[1, 32:].isnan().all()) and bool((y[1, :32] == 1).all())
    assert mx.encode(x, mx.MXFP8_E4M3).scales.tolist() == [[0xFF, 119], [119, 0xFF]]  # 1 = 1.0 * 2^(0 - 8) * 2^8


@pytest.mark.parametrize("fmt", [f for f in PRESETS if f.element.bits <= 8 and not f.tensor_scale and not f.is_int],
                         ids=lambda f: f.name)
def test_matches_gfloat_quantize_block(fmt):
    block = pytest.importorskip("gfloat.block")
    formats = pytest.importorskip("gfloat.formats")
    fi = getattr(formats, "format_info_" + {"mxfp4": "mxfp4_e2m1"}.get(fmt.name, fmt.name))
    x = data((6, 32), seed=7)
    got = mx.cast(x, fmt)
    for r in range(6):
        want = block.quantize_block(fi, x[r].double().numpy(), block.compute_scale_amax)
        assert same(got[r], want.astype(np.float32)), r


@pytest.mark.parametrize("shape,axis", [((5, 33), -1), ((33, 5), 0), ((2, 3, 40), 1), ((70,), 0)])
def test_any_axis_and_ragged(shape, axis):
    fmt = mx.BlockFormat(cpd.E4M3FN, 32, axis=axis)
    x = data(shape, seed=3)
    got = mx.cast(x, fmt)
    assert got.shape == x.shape
    assert same(got, mx_oracle.quantize(x.numpy(), fmt))
    moved = mx.cast(x.movedim(axis, -1).contiguous(), mx.MXFP8_E4M3).movedim(-1, axis)
    assert torch.equal(got, moved)


def test_codes_scales_and_packing():
    x = data((4, 50), seed=5)
    for fmt, nbytes in ((mx.MXFP4, 32), (mx.MXFP6_E2M3, 48), (mx.MXFP8_E5M2, 64), (mx.MXINT8, 64)):
        enc = mx.encode(x, fmt)
        codes, scales = enc
        assert codes.dtype == torch.uint8 and codes.shape == (4, nbytes) and scales.shape == (4, 2)
        flat = mx.encode(x, fmt, pack=False).codes
        assert torch.equal(mx.unpack(codes, fmt.element.bits, 64), flat)
        assert torch.equal(mx.decode(enc), mx.cast(x, fmt))
        s = mx.scales(x, fmt)
        assert torch.equal(cpd.decode(scales, cpd.E8M0), s)
    # 4-bit: first code in the low nibble; 6-bit: low bits first
    assert mx.pack(torch.tensor([[1, 2, 3]], dtype=torch.uint8), 4).tolist() == [[0x21, 0x03]]
    assert mx.pack(torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8), 6).tolist() == [[0x81, 0x30, 0x10]]
    # MXINT8: two's complement k for k / 64
    enc = mx.encode(torch.tensor([[-1.0, 0.5, -0.0] + [0.0] * 29]), mx.MXINT8)
    assert enc.codes[0, :3].view(torch.int8).tolist() == [-64, 32, 0] and enc.scales.tolist() == [[127]]


def test_nvfp4_two_level_scaling():
    x = data((2, 64), seed=9) * 1e-3
    enc = mx.encode(x, mx.NVFP4)
    t = float(enc.tensor_scale)
    assert t == mx_oracle.tensor_scale([float(v) for v in x.flatten()], mx.NVFP4)
    assert enc.scales.shape == (2, 4) and enc.codes.shape == (2, 32)
    assert same(mx.cast(x, mx.NVFP4), mx_oracle.quantize(x.numpy(), mx.NVFP4))


def test_stochastic_rounding():
    x = data((8, 64), seed=11)
    lo = mx.cast(x, mx.MXFP4, "toward_zero")
    hi = mx_oracle.quantize(x.numpy(), mx.MXFP4, "up")
    hi_neg = mx_oracle.quantize(x.numpy(), mx.MXFP4, "down")
    hi = torch.from_numpy(np.where(x.numpy() < 0, hi_neg, hi))
    a = mx.cast(x, mx.MXFP4, "stochastic", generator=torch.Generator().manual_seed(1))
    b = mx.cast(x, mx.MXFP4, "stochastic", generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert bool(((a == lo) | (a == hi)).all())
    assert bool((a != lo).any())


def test_custom_op_fake_compile_and_gradient():
    x = data((4, 40), seed=2)
    key = mx.MXFP8_E4M3._op_spec
    torch.library.opcheck(torch.ops.cpd_mx.cast.default, (x, torch.zeros((), dtype=torch.int64), key, 0),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    f = torch.compile(lambda t: mx.cast(t, mx.MXFP6_E3M2), fullgraph=True)
    assert torch.equal(f(x), mx.cast(x, mx.MXFP6_E3M2))
    xr = x.clone().requires_grad_(True)
    mx.cast(xr, mx.MXFP4).sum().backward()
    assert torch.equal(xr.grad, torch.ones_like(x))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: mx.BlockFormat(cpd.E2M1, 0), ValueError, "block_size=0"),
    (lambda: mx.BlockFormat(cpd.E2M1, 3.0), TypeError, "block_size"),
    (lambda: mx.BlockFormat(cpd.E2M1, scale=cpd.E4M3FN), ValueError, "scale_rule"),
    (lambda: mx.BlockFormat(cpd.E2M1, scale_rule="round"), ValueError, "scale_rule='round'"),
    (lambda: mx.BlockFormat(cpd.E2M1, tensor_scale=True), ValueError, "tensor_scale"),
    (lambda: mx.BlockFormat(cpd.FP16), ValueError, "at most 8 bits"),
    (lambda: mx.cast(torch.ones(3, 4), mx.BlockFormat(cpd.E2M1, axis=2)), ValueError, "axis=2"),
    (lambda: mx.cast(torch.ones(3, dtype=torch.int32), mx.MXFP4), TypeError, "int32"),
    (lambda: mx.cast([1.0], mx.MXFP4), TypeError, "torch.Tensor"),
    (lambda: mx.cast(torch.ones(3), "mxfp5"), TypeError, "mxfp4"),
    (lambda: mx.cast(torch.ones(3), mx.MXFP4, generator=torch.Generator()), ValueError, "generator"),
    (lambda: mx.decode((torch.ones(1), torch.ones(1))), TypeError, "encode"),
])
def test_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_inputs_not_modified():
    x = data((3, 40), seed=4)
    before = x.clone()
    mx.cast(x, mx.NVFP4)
    mx.encode(x, mx.MXFP4)
    assert torch.equal(x, before)


from hypothesis import given, settings, strategies as st  # noqa: E402

import cpd.testing as ct  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(ct.block_formats(max_block=20), st.integers(1, 3), st.integers(1, 45), st.integers(0, 1000),
       st.sampled_from(["nearest", "toward_zero", "up", "odd"]))
def test_random_block_formats_match_reference(fmt, rows, cols, seed, mode):
    x = data((rows, cols), seed=seed)
    assert same(mx.cast(x, fmt, mode), mx_oracle.quantize(x.numpy(), fmt, mode)), fmt


@pytest.mark.parametrize("fmt", PRESETS + VARIANTS[:3], ids=lambda f: f.name)
def test_readable_reference_agrees(fmt):
    """cpd.reference.mx_block, the spec written out in cpd, agrees with the kernels (and so with
    tests/mx_oracle.py, which the test above checks independently)."""
    x = data((64,), seed=12)
    x[7] = 1e-30
    t = float(mx.encode(x, fmt).tensor_scale) if fmt.tensor_scale else None
    for mode in ("nearest", "odd"):
        ref = [v for i in range(0, 64, fmt.block_size)
               for v in cpd.reference.mx_block(x[i:i + fmt.block_size].tolist(), fmt, mode, tensor_scale=t)]
        assert same(mx.cast(x, fmt, mode), np.array(ref, dtype=np.float32)), mode
