"""The public API and its custom ops behave as documented around the numerics (docs/design.md §3, §4).

Invariants defended:
* ``cpd::cast``, ``cpd::cast_out``, ``cpd::encode``, ``cpd::decode`` pass ``torch.library.opcheck``
  (schema, fake impl, autograd registration, AOT dispatch), and ``torch.compile`` gives the eager
  bits (stochastic rounding included, under a seeded global RNG);
* autograd is straight-through; Quantizer/quantizer round forward to forward_fmt and gradients to
  backward_fmt;
* ``out=`` writes and returns ``out`` (also in place, ``out=x``); inputs are never modified;
  non-contiguous, empty and 0-d tensors work and keep their shape; float16/bfloat16 upcast exactly;
* every bad argument is a clear TypeError/ValueError naming it;
* codes: dtypes by width, the bit patterns of torch's own fp16/bf16/fp8/fp32, any integer input
  dtype, out-of-range codes rejected; ``cpd.bits`` prints sign | exponent | mantissa.
"""

import math

import pytest
import torch
from torch.library import opcheck

import cpd
from cpd.ops import code_dtype

# torch's own opcheck/compile machinery warns about its internal use of torch.jit.script_method
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

FMTS = [cpd.E5M2, cpd.E4M3FN, cpd.FP16, cpd.E2M1, cpd.FloatFormat(8, 10, bias=140, subnormals=False)]
MODES = ["nearest", "stochastic", "toward_zero", "up", "down"]
MODE_CODE = {m: cpd.Rounding(m).code for m in MODES}


def fargs(f):
    return cpd.ops._fmt_spec(f)  # the ops' one-argument format


def bits_equal(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def sample(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 50


# ------------------------------------------------------------------------------------ opcheck
@pytest.mark.parametrize("fmt", FMTS[:3], ids=lambda f: f.name)
@pytest.mark.parametrize("mode", ["nearest", "stochastic", "up"])
def test_opcheck_cast(fmt, mode):
    seed = torch.tensor([123, 456], dtype=torch.int64)
    for x in (sample(3, 5), sample(4, 6).t(), torch.empty(0, 3), torch.tensor(2.5)):
        opcheck(torch.ops.cpd.cast.default, (x, seed, fargs(fmt), MODE_CODE[mode], False, 32))
    x = sample(7).requires_grad_()
    opcheck(torch.ops.cpd.cast.default, (x, seed, fargs(fmt), MODE_CODE[mode], True, 32))


def test_opcheck_cast_out():
    seed = torch.tensor([1, 2], dtype=torch.int64)
    for fmt in FMTS[:3]:
        for x, out in ((sample(3, 5), torch.empty(3, 5)), (sample(4, 6), torch.empty(6, 4).t())):
            opcheck(torch.ops.cpd.cast_out.default, (x, seed, fargs(fmt), MODE_CODE["stochastic"], False, 8, out))
            opcheck(torch.ops.cpd.cast_out.default, (x, seed, fargs(fmt), MODE_CODE["nearest"], True, 32, out))


def test_opcheck_encode_decode():
    for fmt in FMTS:
        for x in (sample(3, 5), sample(4, 6).t(), torch.empty(0)):
            opcheck(torch.ops.cpd.encode.default, (x, fargs(fmt), MODE_CODE["nearest"], False))
            opcheck(torch.ops.cpd.encode.default, (x, fargs(fmt), MODE_CODE["down"], True))
        codes = cpd.encode(sample(4, 4), fmt)
        opcheck(torch.ops.cpd.decode.default, (codes, fargs(fmt)))
        opcheck(torch.ops.cpd.decode.default, (codes.t(), fargs(fmt)))


# ------------------------------------------------------------------------------------ torch.compile
def test_compile_matches_eager():
    def fn(x):
        a = cpd.cast(x * 2, cpd.E5M2)
        b = cpd.cast(x, cpd.E4M3, "stochastic", sr_bits=6)
        c = cpd.decode(cpd.encode(x, "e4m3fn", "toward_zero", saturate=True), cpd.E4M3FN)
        return a + 1, b, c

    x = sample(1000) / 10
    compiled = torch.compile(fn, fullgraph=False)
    torch.manual_seed(0)
    eager = [fn(x), fn(x)]
    torch.manual_seed(0)
    comp = [compiled(x), compiled(x)]
    for e, c in zip(eager, comp):
        for te, tc in zip(e, c):
            assert bits_equal(te, tc)
    assert not torch.equal(eager[0][1], eager[1][1])  # the second call drew a new seed


# ------------------------------------------------------------------------------------ autograd
@pytest.mark.parametrize("mode", MODES)
def test_straight_through_gradient(mode):
    x = sample(20).requires_grad_()
    y = cpd.cast(x, cpd.E2M1, mode)
    g = sample(20, seed=1) / 7  # not representable in E2M1: must come through unrounded
    y.backward(g)
    assert bits_equal(x.grad, g)


def test_gradient_through_a_network():
    lin = torch.nn.Linear(4, 3)
    x = sample(5, 4)
    y = cpd.cast(lin(x), cpd.BF16).sum()
    y.backward()
    assert bits_equal(lin.weight.grad, x.sum(0).expand(3, 4).contiguous())


def test_quantizer_forward_and_backward():
    x = sample(64).requires_grad_()
    g = sample(64, seed=3)
    y = cpd.quantizer(x, cpd.E4M3, cpd.E5M2)
    assert bits_equal(y, cpd.cast(x.detach(), cpd.E4M3))
    y.backward(g)
    assert bits_equal(x.grad, cpd.cast(g, cpd.E5M2))

    x.grad = None
    q = cpd.Quantizer(forward_fmt="e2m1finite", backward_fmt="bf16", backward_rounding="toward_zero", saturate=True)
    y = q(x)
    assert bits_equal(y, cpd.cast(x.detach(), cpd.E2M1, saturate=True))
    y.backward(g * 1e38)
    assert bits_equal(x.grad, cpd.cast(g * 1e38, cpd.BF16, "toward_zero", saturate=True))
    assert "forward_fmt=e2m1finite" in repr(q) and "backward_fmt=e8m7" in repr(q)


def test_quantizer_none_passes_through_and_stochastic_is_seeded():
    x = sample(64).requires_grad_()
    y = cpd.quantizer(x, None, cpd.E5M2)
    assert bits_equal(y, x.detach())
    y.backward(sample(64, seed=4))
    assert bits_equal(x.grad, cpd.cast(sample(64, seed=4), cpd.E5M2))
    torch.manual_seed(5)
    a = cpd.quantizer(x, cpd.E4M3, forward_rounding="stochastic")
    torch.manual_seed(5)
    b = cpd.Quantizer(cpd.E4M3, forward_rounding="stochastic")(x)
    assert bits_equal(a, b)
    with pytest.raises(ValueError, match="forward_rounding"):
        cpd.quantizer(x, cpd.E4M3, forward_rounding="sideways")
    with pytest.raises(ValueError, match="backward_rounding"):
        cpd.Quantizer(cpd.E4M3, backward_rounding="sideways")


# ------------------------------------------------------------------------------------ out=
def test_out_is_written_and_returned():
    x = sample(6, 7)
    out = torch.full((6, 7), math.nan)
    r = cpd.cast(x, cpd.E5M2, out=out)
    assert r is out and bits_equal(out, cpd.cast(x, cpd.E5M2))
    out_nc = torch.empty(7, 6).t()  # non-contiguous out
    r = cpd.cast(x, cpd.E5M2, "up", out=out_nc)
    assert r is out_nc and bits_equal(out_nc, cpd.cast(x, cpd.E5M2, "up"))
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert bits_equal(cpd.cast(x, cpd.E5M2, "stochastic", generator=g1, out=torch.empty(6, 7)),
                      cpd.cast(x, cpd.E5M2, "stochastic", generator=g2))


@pytest.mark.parametrize("mode", MODES)
def test_out_is_x_in_place(mode):
    x = sample(100)
    want = cpd.cast(x, cpd.E4M3, mode, generator=torch.Generator().manual_seed(0) if mode == "stochastic" else None)
    r = cpd.cast(x, cpd.E4M3, mode, generator=torch.Generator().manual_seed(0) if mode == "stochastic" else None,
                 out=x)
    assert r is x and bits_equal(x, want)
    xt = sample(10, 10).t()  # in place on a non-contiguous tensor
    want = cpd.cast(xt, cpd.E2M1)
    cpd.cast(xt, cpd.E2M1, out=xt)
    assert bits_equal(xt, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", [cpd.E5M2, cpd.BF16, cpd.FloatFormat(4, 3, bias=147)], ids=lambda f: f.name)
def test_in_place_on_large_tensors(mode, fmt):
    """out=x on a tensor spanning many threads' chunks and blocks, with runs of tiny and of
    large magnitudes, gives the out-of-place bits."""
    g = torch.Generator().manual_seed(2)
    x = torch.ldexp(torch.rand(300_001, generator=g) + 0.5,
                    torch.randint(fmt.emin - fmt.man - 4, fmt.emax + 2, (300_001,), generator=g)).clamp(max=3e38)
    x = x[torch.argsort(x)] * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1)
    kw = lambda: {"generator": torch.Generator().manual_seed(4)} if mode == "stochastic" else {}  # noqa: E731
    want = cpd.cast(x, fmt, mode, **kw())
    r = cpd.cast(x, fmt, mode, out=x, **kw())
    assert r is x and bits_equal(x, want)


@pytest.mark.parametrize("out,exc,match", [
    (torch.empty(6, 7, dtype=torch.float64), ValueError, "out must be a float32"),
    (torch.empty(6, 7, dtype=torch.float16), ValueError, "float16"),
    (torch.empty(7, 6), ValueError, r"shape \(6, 7\)"),
    (torch.empty(42), ValueError, "shape"),
    (torch.empty(6, 7, device="meta"), ValueError, "meta"),
    ([0.0] * 42, TypeError, "out must be a torch.Tensor"),
])
def test_bad_out(out, exc, match):
    with pytest.raises(exc, match=match):
        cpd.cast(sample(6, 7), cpd.E5M2, out=out)


# ------------------------------------------------------------------------------------ inputs
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("use_out", [False, True])
def test_input_never_modified(mode, use_out):
    for x in (sample(1000), sample(30, 40).t(), sample(64).half(), sample(64).bfloat16()):
        before = x.clone()
        out = torch.empty(x.shape) if use_out else None
        cpd.cast(x, cpd.E4M3FN, mode, out=out)
        cpd.encode(x, cpd.E4M3FN, mode)
        cpd.bits(x[:3].reshape(-1), cpd.E4M3FN, mode)
        assert torch.equal(x.view(torch.int16) if x.element_size() == 2 else x.view(torch.int32),
                           before.view(torch.int16) if x.element_size() == 2 else before.view(torch.int32))


def _layouts():
    base = sample(8, 9, 10)
    return {
        "transposed": base.transpose(0, 2),
        "strided slice": base[::2, 1::3, 2:],
        "permuted": base.permute(1, 2, 0),
        "expanded": sample(1, 9).expand(5, 9),
        "column": base[:, 3, :],
        "empty": torch.empty(0),
        "empty 2d": torch.empty(3, 0, 4),
        "0-d": torch.tensor(3.3),
        "channels_last": sample(2, 3, 4, 5).to(memory_format=torch.channels_last),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize("mode", MODES)
def test_layouts_and_shapes(layout, mode):
    x = _layouts()[layout]
    kw = {"generator": torch.Generator().manual_seed(3)} if mode == "stochastic" else {}
    y = cpd.cast(x, cpd.E5M2, mode, **kw)
    kw = {"generator": torch.Generator().manual_seed(3)} if mode == "stochastic" else {}
    want = cpd.cast(x.contiguous(), cpd.E5M2, mode, **kw)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert bits_equal(y, want)
    if mode != "stochastic":
        c = cpd.encode(x, cpd.E5M2, mode)
        assert c.shape == x.shape and c.dtype == torch.uint8
        assert bits_equal(cpd.decode(c, cpd.E5M2), want)
        assert bits_equal(cpd.decode(c.t() if c.dim() == 2 else c, cpd.E5M2),
                          want.t() if c.dim() == 2 else want)


def test_0d_and_empty_values():
    assert cpd.cast(torch.tensor(0.3), cpd.E5M2).item() == 0.3125
    assert cpd.cast(torch.tensor(0.3), cpd.E5M2).shape == ()
    assert cpd.encode(torch.tensor(0.3), cpd.E5M2).item() == 0b00110101
    assert cpd.decode(torch.tensor(0b00110101, dtype=torch.uint8), cpd.E5M2).item() == 0.3125
    assert cpd.cast(torch.empty(0), cpd.E5M2, "stochastic").shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_upcast_exactly(dtype):
    x = sample(1000).to(dtype)
    for mode in ("nearest", "down"):
        y = cpd.cast(x, cpd.E4M3, mode)
        assert y.dtype == torch.float32 and bits_equal(y, cpd.cast(x.float(), cpd.E4M3, mode))
    assert bits_equal(cpd.cast(x, dtype), x.float())  # casting to its own format is exact
    assert torch.equal(cpd.encode(x, cpd.E5M2), cpd.encode(x.float(), cpd.E5M2))


def test_format_names_and_dtypes_accepted():
    x = sample(50)
    want = cpd.cast(x, cpd.E4M3FN)
    assert bits_equal(cpd.cast(x, "e4m3fn"), want)
    assert bits_equal(cpd.cast(x, torch.float8_e4m3fn), want)
    assert bits_equal(cpd.cast(x, "E4M3FN", cpd.Rounding.NEAREST), want)


# ------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("x,match", [
    (torch.arange(4), "int64"), (torch.arange(4, dtype=torch.int32), "int32"),
    (torch.ones(4, dtype=torch.complex64), "complex64"), (torch.ones(4, dtype=torch.float64), "float64"),
    (torch.ones(4, dtype=torch.bool), "bool"), ([1.0, 2.0], "torch.Tensor"), (1.5, "torch.Tensor"),
    (None, "torch.Tensor"),
])
def test_bad_input_type(x, match):
    with pytest.raises(TypeError, match=match):
        cpd.cast(x, cpd.E5M2)
    with pytest.raises(TypeError, match=match):
        cpd.encode(x, cpd.E5M2)


def test_bad_arguments():
    x = sample(4)
    with pytest.raises(ValueError, match="rounding='nearset'"):
        cpd.cast(x, cpd.E5M2, "nearset")
    with pytest.raises(TypeError, match="rounding"):
        cpd.cast(x, cpd.E5M2, 0)
    for k in (0, 33, -1):
        with pytest.raises(ValueError, match=f"sr_bits={k}"):
            cpd.cast(x, cpd.E5M2, "stochastic", sr_bits=k)
    with pytest.raises(TypeError, match="sr_bits"):
        cpd.cast(x, cpd.E5M2, "stochastic", sr_bits=4.0)
    for mode in ("nearest", "up"):
        with pytest.raises(ValueError, match="sr_bits"):
            cpd.cast(x, cpd.E5M2, mode, sr_bits=8)
        with pytest.raises(ValueError, match="generator"):
            cpd.cast(x, cpd.E5M2, mode, generator=torch.Generator())
        with pytest.raises(ValueError, match="generator"):
            cpd.encode(x, cpd.E5M2, mode, generator=torch.Generator())
        with pytest.raises(ValueError, match="sr_bits"):
            cpd.encode(x, cpd.E5M2, mode, sr_bits=8)
    with pytest.raises(TypeError, match="generator"):
        cpd.cast(x, cpd.E5M2, "stochastic", generator=42)
    with pytest.raises(TypeError, match="saturate"):
        cpd.cast(x, cpd.E5M2, saturate=1)
    with pytest.raises(ValueError, match="fmt='e5m9x'"):
        cpd.cast(x, "e5m9x")
    with pytest.raises(TypeError, match="fmt"):
        cpd.cast(x, 8)


def test_encode_nan_without_a_nan_code():
    x = torch.tensor([1.0, math.nan])
    for fmt in (cpd.E2M1, cpd.E3M2, cpd.FloatFormat(4, 0), cpd.FloatFormat(8, 7, specials="finite", bias=128)):
        assert not fmt.has_nan
        with pytest.raises(ValueError, match="NaN"):
            cpd.encode(x, fmt)
    for fmt in (cpd.E5M2, cpd.E4M3FN):  # formats with a NaN code encode it
        assert cpd.encode(x, fmt)[1].item() == fmt.nan_code


# ------------------------------------------------------------------------------------ codes
def test_code_dtypes():
    assert code_dtype(cpd.E2M1) == torch.uint8 and code_dtype(cpd.E4M3FN) == torch.uint8
    assert code_dtype(cpd.FloatFormat(4, 4)) == torch.int16 and code_dtype(cpd.FP16) == torch.int16
    assert code_dtype(cpd.TF32) == torch.int32 and code_dtype(cpd.FP32) == torch.int32
    x = sample(10)
    for fmt in (cpd.E2M1, cpd.FloatFormat(4, 4), cpd.BF16, cpd.TF32, cpd.FP32):
        assert cpd.encode(x, fmt).dtype == code_dtype(fmt)


def test_codes_are_torch_bit_patterns():
    x = torch.cat([sample(100_000), torch.tensor([0.0, -0.0, math.inf, -math.inf, 1e-40, -1e-42, 70000.0])])
    assert torch.equal(cpd.encode(x, cpd.FP16), x.half().view(torch.int16))
    assert torch.equal(cpd.encode(x, cpd.BF16), x.bfloat16().view(torch.int16))
    assert torch.equal(cpd.encode(x, cpd.FP32), x.view(torch.int32))
    assert torch.equal(cpd.encode(x, cpd.E5M2), x.to(torch.float8_e5m2).view(torch.uint8))
    assert torch.equal(cpd.encode(x, cpd.E4M3FN, saturate=True), x.to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(cpd.decode(x.half().view(torch.int16), cpd.FP16).view(torch.int32),
                       x.half().float().view(torch.int32))
    assert torch.equal(cpd.decode(x.view(torch.int32), cpd.FP32).view(torch.int32), x.view(torch.int32))
    nan = torch.tensor([math.nan])
    assert cpd.encode(nan, cpd.FP16).item() == 0x7E00 and cpd.encode(nan, cpd.FP32).item() == 0x7FC00000


def test_decode_accepts_any_integer_dtype():
    codes = torch.arange(256)
    want = cpd.decode(codes.to(torch.uint8), cpd.E5M2)
    for dt in (torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32):
        assert bits_equal(cpd.decode(codes.to(dt), cpd.E5M2), want)
    # full-width patterns may be negative: an int8 view of the uint8 codes decodes the same
    assert bits_equal(cpd.decode(codes.to(torch.uint8).view(torch.int8), cpd.E5M2), want)
    h = torch.arange(-(2**15), 2**15)
    want = cpd.decode(h.to(torch.int16), cpd.FP16)
    assert bits_equal(cpd.decode(h & 0xFFFF, cpd.FP16), want)  # unsigned 16-bit patterns in int64
    assert bits_equal(cpd.decode(h.to(torch.int32), cpd.FP16), want)  # negative int16 values in int32
    native = h.to(torch.int16).view(torch.float16).float()
    nan = torch.isnan(native)  # NaN payloads are not part of the contract
    assert torch.equal(torch.isnan(want), nan) and bits_equal(want[~nan], native[~nan])


@pytest.mark.parametrize("codes,fmt", [
    (torch.tensor([256]), cpd.E5M2), (torch.tensor([-129]), cpd.E5M2), (torch.tensor([-1]), cpd.E3M2),
    (torch.tensor([16], dtype=torch.uint8), cpd.E2M1),
    (torch.tensor([64], dtype=torch.int16), cpd.E3M2), (torch.tensor([2**16]), cpd.FP16),
    (torch.tensor([-(2**15) - 1]), cpd.FP16), (torch.tensor([1 << 19], dtype=torch.int32), cpd.TF32),
    (torch.tensor([-5], dtype=torch.int32), cpd.TF32), (torch.tensor([2**32]), cpd.FP32),
])
def test_decode_rejects_out_of_range_codes(codes, fmt):
    with pytest.raises(ValueError, match="code"):
        cpd.decode(codes, fmt)


def test_decode_bad_types():
    with pytest.raises(TypeError, match="codes"):
        cpd.decode(torch.ones(3), cpd.E5M2)
    with pytest.raises(TypeError, match="codes"):
        cpd.decode([1, 2], cpd.E5M2)


def test_bits_text():
    assert cpd.bits(torch.tensor([0.3]), "e5m2") == "0.300000012 -> 0 01101 01 = 0.3125"
    lines = cpd.bits(torch.tensor([[-1.0, 1000.0], [math.inf, math.nan]]), cpd.E4M3FN).splitlines()
    assert lines == ["-1 -> 1 0111 000 = -1", "1000 -> 0 1111 111 = nan", "inf -> 0 1111 111 = nan",
                     "nan -> 0 1111 111 = nan"]
    assert cpd.bits(torch.tensor([0.3]), "e5m2", "toward_zero") == "0.300000012 -> 0 01101 00 = 0.25"
    assert cpd.bits(torch.tensor([3.0, -math.inf]), cpd.FloatFormat(3, 0)).splitlines() == \
        ["3 -> 0 100 - = 2", "-inf -> 1 111 - = -inf"]
    assert cpd.bits(torch.tensor([math.nan]), cpd.E2M1) == "nan -> (no NaN code in e2m1finite)"
    assert cpd.bits(torch.tensor([1000.0]), cpd.E4M3FN, saturate=True) == "1000 -> 0 1111 110 = 448"
