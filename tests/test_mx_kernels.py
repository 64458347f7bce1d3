"""cpd.mx's fused kernels (cuda/cpu/mx.cpp, cuda/kernels/mx.cu over cuda/include/cpd/block.h)
against the pure-torch path (cpd/_mx_torch.py) and the independent reference tests/mx_oracle.py.

Invariants defended:
* the compiled CPU kernels give the pure-torch path's bits for cast, encode (packed and not) and
  decode: every preset and scale rule, every rounding mode (stochastic included: the same Philox
  words, so the same bits for the same generator), ragged last blocks, several axes,
  non-contiguous and float16 inputs, NaN/inf/zero/tiny/huge blocks, any thread count;
* they equal tests/mx_oracle.py (exact Fractions) on every value of every <= 8-bit element
  format and every midpoint between neighbours, scaled into blocks of several scales, in
  every deterministic mode;
* the CUDA kernels, run on the host through the shim (odd launch geometries), give the CPU
  kernels' bytes; they compile through NVRTC without local memory (when NVRTC is installed);
* the encode/decode custom ops trace (opcheck, torch.compile) and bad arguments are clear errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cpd
import mx_oracle
import oracle
from cpd import _cpu, _mx_engine, _mx_torch, _shim, mx
from cpd.ops import draw_seed
from cpd.rounding import Rounding

compiled = pytest.mark.skipif(_cpu.extension() is None, reason="the CPU extension is not built")

PRESETS = list(mx.PRESETS.values())
VARIANTS = [mx.BlockFormat(cpd.E4M3FN, 8, scale_rule="ceil"), mx.BlockFormat(cpd.E2M1, 5, scale_rule="even"),
            mx.BlockFormat(cpd.E5M2, 4, scale_rule="amax"), mx.BlockFormat("e3m2fn", 7, axis=0),
            mx.BlockFormat(cpd.E2M1, 16, scale=cpd.E4M3FN, scale_rule="amax"),
            mx.BlockFormat("int8", 3, scale_rule="ceil"), mx.BlockFormat(cpd.E2M3, 6, scale_rule="even"),
            mx.BlockFormat(cpd.E3M2, 12, axis=0, scale_rule="ceil")]
FORMATS = PRESETS + VARIANTS
MODES = [m.value for m in Rounding]
ZERO = torch.zeros(2, dtype=torch.int64)


def data(shape, seed=0):
    """Random values over 24 binades, with blocks of specials and extremes in the first rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 12, shape, generator=g).float())
    flat = x.view(-1)
    special = [0.0, -0.0, 1e-30, 2e30, -7.0, 0.1, 3e-39, -1e-45]
    k = min(len(special), flat.numel())
    flat[:k] = torch.tensor(special)[:k]
    if x.dim() == 2 and x.shape[0] >= 4 and x.shape[1] > 10:
        x[1, 10] = math.nan
        x[2, -1] = -math.inf
        x[3, :] = 0.0
    return x


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def torch_cast(x, fmt, mode, pair=ZERO):
    return _mx_engine.cast(None, x, pair, fmt, Rounding.parse(mode))


def torch_encode(x, fmt, mode, pair=ZERO, packed=True):
    return _mx_engine.encode(None, x, pair, fmt, Rounding.parse(mode), packed)


# ------------------------------------------------------------------------------------ CPU vs torch
@compiled
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("mode", MODES)
def test_cpu_kernel_matches_torch_path(fmt, mode):
    x = data((5, 45), seed=len(fmt.name) + len(mode))  # 45: a ragged last block for every size
    seed = torch.tensor(987654321)
    stochastic = mode == "stochastic"
    pair = _mx_engine.cast_seed(seed, x.device) if stochastic else ZERO
    got = torch.ops.cpd_mx.cast(x, seed, fmt._op_spec, Rounding.parse(mode).code)
    assert torch.equal(bits(got), bits(torch_cast(x, fmt, mode, pair))), (fmt.name, mode)
    for packed in (True, False):
        g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        enc = mx.encode(x, fmt, mode, pack=packed, generator=g1 if stochastic else None)
        want = torch_encode(x, fmt, mode, draw_seed(g2) if stochastic else ZERO, packed)
        assert torch.equal(enc.codes, want[0]) and torch.equal(enc.scales, want[1]), (fmt.name, mode, packed)
        y = mx.decode(enc)
        n = x.shape[fmt.axis]
        ref = _mx_torch.decode(enc.codes.clone(), enc.scales, want[2], fmt, n, packed).movedim(-1, fmt.axis)
        assert torch.equal(bits(y), bits(ref)), (fmt.name, mode, packed)
        if not stochastic:
            assert torch.equal(bits(y), bits(got))


@compiled
@pytest.mark.parametrize("shape,axis", [((5, 33), -1), ((33, 5), 0), ((2, 3, 40), 1), ((70,), 0), ((4, 0), 1),
                                        ((3, 64), 1)])
def test_axes_ragged_and_layouts(shape, axis):
    for fmt in (mx.BlockFormat(cpd.E4M3FN, 32, axis=axis), mx.BlockFormat(cpd.E2M1, 16, scale=cpd.E4M3FN,
                                                                           scale_rule="amax", tensor_scale=True,
                                                                           axis=axis)):
        x = data(shape, seed=3)
        for inp in (x, x.transpose(0, -1).contiguous().transpose(0, -1), x.half()):  # non-contiguous, float16
            got = mx.cast(inp, fmt)
            assert got.shape == x.shape and got.is_contiguous()
            assert torch.equal(bits(got), bits(torch_cast(inp.float(), fmt, "nearest")))
        enc = mx.encode(x, fmt)
        want = torch_encode(x, fmt, "nearest")
        assert torch.equal(enc.codes, want[0]) and torch.equal(enc.scales, want[1])
        assert torch.equal(bits(mx.decode(enc)), bits(mx.cast(x, fmt)))


@compiled
@pytest.mark.parametrize("threads", [1, 3])
def test_any_thread_count(threads):
    x = data((37, 200), seed=8)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = [mx.cast(x, f, m, generator=torch.Generator().manual_seed(1) if m == "stochastic" else None)
               for f in (mx.MXFP8_E4M3, mx.NVFP4, mx.MXFP6_E2M3) for m in ("nearest", "stochastic")]
        enc = mx.encode(x, mx.MXFP4)
    finally:
        torch.set_num_threads(old)
    ref = [mx.cast(x, f, m, generator=torch.Generator().manual_seed(1) if m == "stochastic" else None)
           for f in (mx.MXFP8_E4M3, mx.NVFP4, mx.MXFP6_E2M3) for m in ("nearest", "stochastic")]
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(out, ref))
    assert torch.equal(enc.codes, mx.encode(x, mx.MXFP4).codes)


@compiled
def test_stochastic_is_reproducible_and_matches_the_old_draws():
    """Same generator, same bits; and the bits the pure-torch path drew before the kernels."""
    x = data((8, 64), seed=11)
    a = mx.cast(x, mx.MXFP4, "stochastic", generator=torch.Generator().manual_seed(1))
    seed = torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(1), dtype=torch.int64)
    want = torch_cast(x, mx.MXFP4, "stochastic", _mx_engine.cast_seed(seed, x.device))
    assert torch.equal(bits(a), bits(want))


# ------------------------------------------------------------------------------------ vs the oracle
def _grid_values(el) -> list[float]:
    """Every nonnegative value of the element format and every midpoint between neighbours,
    plus a little above and below each midpoint (as float32)."""
    vals = sorted({float(v) for v in oracle.positive_values(el)} | {0.0})
    out = set(vals)
    for a, b in zip(vals, vals[1:]):
        mid = (a + b) / 2
        out |= {mid, float(np.nextafter(np.float32(mid), np.float32(0))), float(np.nextafter(np.float32(mid),
                                                                                             np.float32(np.inf)))}
    return sorted(out)


@compiled
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.scale_rule != "amax"] + [mx.NVFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "up", "down", "nearest_away", "odd"])
def test_every_element_code_against_the_oracle(fmt, mode):
    """Every element value and midpoint (both signs), in blocks whose largest value sets the scale
    to 2^k for several k (and NVFP4's amax scales), equals the exact reference."""
    el = fmt.element
    grid = _grid_values(el)
    vals = np.array(grid + [-v for v in grid], dtype=np.float32)
    bs = fmt.block_size
    rows = []
    for k in (-3, 0, 5):
        body = vals * np.float32(2.0 ** k)
        pad = (-len(body)) % (bs - 1)
        body = np.concatenate([body, np.zeros(pad, np.float32)]).reshape(-1, bs - 1)
        top = np.full((body.shape[0], 1), np.float32(el.max * 2.0 ** k), np.float32)  # fixes the scale
        rows.append(np.concatenate([top, body], axis=1).reshape(-1))
    x = np.concatenate(rows)
    f = mx.BlockFormat(el, bs, scale=fmt.scale, scale_rule=fmt.scale_rule, tensor_scale=fmt.tensor_scale)
    got = mx.cast(torch.from_numpy(x.copy()), f, mode)
    want = mx_oracle.quantize(x, f, mode)
    assert np.array_equal(got.numpy().view(np.int32), want.astype(np.float32).view(np.int32)), (fmt.name, mode)


# ------------------------------------------------------------------------------------ CUDA via the shim
shim = pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim")


@shim
@compiled
@pytest.mark.parametrize("fmt", PRESETS + VARIANTS[:3], ids=lambda f: f.name)
def test_cuda_kernels_on_the_shim_match_the_cpu_kernels(fmt):
    x = data((6, 45), seed=21)
    xs = x[:, ::2]  # a strided view: the wrapper makes it contiguous for both
    cases = [("nearest", None), ("odd", None), ("down", None), ("stochastic", 3)]
    cpu = []
    for inp in (x, xs):
        for mode, s in cases:
            g = torch.Generator().manual_seed(s) if s is not None else None
            g2 = torch.Generator().manual_seed(s) if s is not None else None
            cpu.append((mx.cast(inp, fmt, mode, generator=g), mx.encode(inp, fmt, mode, generator=g2)))
    with _shim.on_host(threads=33, max_blocks=3):
        k = 0
        for inp in (x, xs):
            for mode, s in cases:
                g = torch.Generator().manual_seed(s) if s is not None else None
                g2 = torch.Generator().manual_seed(s) if s is not None else None
                y, enc = mx.cast(inp, fmt, mode, generator=g), mx.encode(inp, fmt, mode, generator=g2)
                cy, cenc = cpu[k]
                k += 1
                assert torch.equal(bits(y), bits(cy)), (fmt.name, mode)
                assert torch.equal(enc.codes, cenc.codes) and torch.equal(enc.scales, cenc.scales), (fmt.name, mode)
                assert torch.equal(bits(mx.decode(enc)), bits(mx.decode(cenc))), (fmt.name, mode)
        unpacked = mx.encode(x, fmt, pack=False)
        assert torch.equal(unpacked.codes, mx.encode(x, fmt, pack=False).codes)
    assert torch.equal(unpacked.codes, mx.encode(x, fmt, pack=False).codes)


def _nvrtc():
    try:
        from cpd import _cuda
        return _cuda if _cuda.available() else None
    except Exception:  # noqa: BLE001
        return None


@pytest.mark.skipif(_nvrtc() is None, reason="NVRTC (cuda-bindings) is not installed")
def test_mx_kernels_compile_without_local_memory(tmp_path, monkeypatch):
    cuda = _nvrtc()
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    archs = [a for a in (70, 80, 90) if a in cuda.supported_archs()] or cuda.supported_archs()[-1:]
    for a in archs:
        assert cuda.compile_source("mx.cu", f"sm_{a}", use_cache=False)[:4] == b"\x7fELF"
    for a in archs:  # the warp-cooperative kernels hold a block's state in registers on every target
        usage = cuda.resource_usage("mx.cu", f"sm_{a}")
        assert usage and all(u["stack"] == 0 and u["spill_stores"] == 0 for u in usage.values()), (a, usage)


# ------------------------------------------------------------------------------------ ops, errors
def test_op_spec_names_its_format():
    """The ops take a format as 16 ints (BlockFormat._op_spec); from_spec gives the format back,
    also one the registry has not seen."""
    from cpd._block_format import FORMATS as REGISTRY, from_spec

    for fmt in FORMATS:
        spec = fmt._op_spec
        assert len(spec) == 16 and from_spec(list(spec)) == fmt
        saved = REGISTRY.pop(spec)
        try:
            assert from_spec(spec) == fmt and from_spec(spec)._op_spec == spec
        finally:
            REGISTRY[spec] = saved
    with pytest.raises(ValueError, match="16 ints"):
        from_spec([1, 2, 3])


@compiled
def test_scales_past_float32s_exponents_take_the_pure_torch_path():
    """A scale format whose powers of two leave -127..127 is not the kernels' (fused = 0): the C++
    kernels hand cast, cast_out, encode and decode to the pure-torch path, with the same seeds."""
    fmt = mx.BlockFormat(cpd.E2M1, 8, scale=cpd.FloatFormat(7, 0, bias=140, specials="finite"))
    assert fmt._op_spec[-1] == 0
    g = torch.Generator().manual_seed(4)  # finite, no all-zero block (2^-139 has no float32 inverse)
    x = torch.randn((5, 45), generator=g) * torch.exp2(torch.randint(-12, 12, (5, 45), generator=g).float())
    for mode in ("nearest", "stochastic"):
        gen = (lambda: torch.Generator().manual_seed(2)) if mode == "stochastic" else (lambda: None)  # noqa: E731
        seed = torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(2), dtype=torch.int64)
        want = torch_cast(x, fmt, mode, _mx_engine.cast_seed(seed, x.device) if mode == "stochastic" else ZERO)
        assert torch.equal(bits(mx.cast(x, fmt, mode, generator=gen())), bits(want)), mode
        out = torch.empty_like(x)
        mx.cast(x, fmt, mode, generator=gen(), out=out)
        assert torch.equal(bits(out), bits(want)), mode
        enc = mx.encode(x, fmt, mode, generator=gen())
        ref = torch_encode(x, fmt, mode, draw_seed(gen()) if mode == "stochastic" else ZERO)
        assert torch.equal(enc.codes, ref[0]) and torch.equal(enc.scales, ref[1]), mode
        if mode == "nearest":
            assert torch.equal(bits(mx.decode(enc)), bits(want))


def test_encode_decode_ops_trace():
    x = data((4, 40), seed=2)
    key = mx.MXFP4._op_spec
    torch.library.opcheck(torch.ops.cpd_mx.encode.default, (x, ZERO, key, 0, True),
                          test_utils=("test_schema", "test_faketensor"))
    codes, scales, t = torch.ops.cpd_mx.encode(x, ZERO, key, 0, True)
    torch.library.opcheck(torch.ops.cpd_mx.decode.default, (codes, scales, t, key, 40, True),
                          test_utils=("test_schema", "test_faketensor"))
    f = torch.compile(lambda v: mx.decode(mx.encode(v, mx.NVFP4)), fullgraph=False)
    assert torch.equal(bits(f(x)), bits(mx.cast(x, mx.NVFP4)))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: mx.encode(torch.ones(3, 4), mx.MXFP4, pack=1), TypeError, "pack must be a bool"),
    (lambda: mx.encode(torch.ones(3, 4), mx.BlockFormat(cpd.E2M1, axis=-3)), ValueError, "axis=-3"),
    (lambda: mx.encode(torch.ones(3, dtype=torch.int64), mx.MXFP4), TypeError, "int64"),
    (lambda: mx.encode(torch.ones(3), mx.MXFP4, "sideways"), ValueError, "sideways"),
    (lambda: mx.encode(torch.ones(()), mx.MXFP4), ValueError, "at least one dimension"),
])
def test_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("fmt", [mx.MXFP8_E4M3, mx.NVFP4, mx.BlockFormat(cpd.E2M1, 7, axis=0)], ids=lambda f: f.name)
def test_cast_out(fmt):
    x = data((6, 64), seed=31)
    out = torch.full_like(x, 5.0)
    assert mx.cast(x, fmt, out=out) is out
    assert torch.equal(bits(out), bits(mx.cast(x, fmt)))
    strided = torch.empty(64, 6).t()  # a non-contiguous out
    mx.cast(x, fmt, "stochastic", generator=torch.Generator().manual_seed(2), out=strided)
    assert torch.equal(bits(strided), bits(mx.cast(x, fmt, "stochastic", generator=torch.Generator().manual_seed(2))))
    with pytest.raises(ValueError, match="out must be a float32 tensor"):
        mx.cast(x, fmt, out=torch.empty(6, 63))
    with pytest.raises(ValueError, match="out must not be x"):
        mx.cast(x, fmt, out=x)
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        mx.cast(x, fmt, out=[1.0])


# ------------------------------------------------------------------------------------ the AVX2 path
# cuda/cpu/mx_avx2.h takes round-to-nearest casts and encodes of rows made of whole blocks of 16
# or 32 (every preset but MXINT8); the rest, ragged rows included, stays on the scalar loops
# above. Its float32 results are streamed when at least STREAM_MIN_BYTES and 32-byte aligned
# (cuda/cpu/stream_store.h), and fresh outputs of at least 4 MiB get huge pages.
STREAM_MIN_BYTES = 16 << 20
WHOLE = [f for f in FORMATS if f.block_size in (16, 32)]


def vector_data(shape, seed):
    """data() plus blocks whose small elements land below float32's normals once scaled (the
    exact redo), subnormal and huge blocks."""
    x = data(shape, seed)
    if x.dim() == 2 and x.shape[0] >= 8:
        x[4, 0::2], x[4, 1::2] = 3e-39, 2e30      # products underflow: redone exactly
        x[5, 0::3], x[5, 1::3] = 1e-38, 6e4       # products in float32's subnormals
        x[6] = torch.linspace(-1, 1, x.shape[1]) * 1e-39  # a subnormal amax
        x[7] = torch.linspace(-3e38, 3e38, x.shape[1])
    return x


@compiled
@pytest.mark.parametrize("fmt", WHOLE, ids=lambda f: f.name)
@pytest.mark.parametrize("threads", [1, 3])
def test_vector_path_matches_torch_path(fmt, threads):
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for shape, axis in (((9, 64), -1), ((3, 96), -1), ((64, 5), 0), ((2, 3, 32), -1)):
            f = mx.BlockFormat(fmt.element, fmt.block_size, scale=fmt.scale, scale_rule=fmt.scale_rule,
                               tensor_scale=fmt.tensor_scale, axis=axis)
            x = vector_data(shape, seed=threads + len(shape))
            want = torch_cast(x, f, "nearest")
            assert torch.equal(bits(mx.cast(x, f)), bits(want)), (f.name, shape)
            buf = torch.full((x.numel() + 9,), 7.0)
            for off in (0, 1, 8):  # out= at 32-byte-aligned and unaligned addresses
                out = buf[off:off + x.numel()].view(x.shape)
                mx.cast(x, f, out=out)
                assert torch.equal(bits(out), bits(want)), (f.name, shape, off)
            for packed in (True, False):
                enc = mx.encode(x, f, pack=packed)
                w = torch_encode(x, f, "nearest", packed=packed)
                assert torch.equal(enc.codes, w[0]) and torch.equal(enc.scales, w[1]), (f.name, shape, packed)
                assert torch.equal(bits(mx.decode(enc)), bits(want))
    finally:
        torch.set_num_threads(old)


@compiled
@pytest.mark.parametrize("fmt", [f for f in WHOLE if f.scale_rule != "amax"] + [mx.NVFP4], ids=lambda f: f.name)
def test_vector_path_every_element_code_against_the_oracle(fmt):
    """The oracle test above in rows of whole blocks (the AVX2 path): every element value and
    midpoint, both signs, under several scales; cast and encode + decode."""
    el, bs = fmt.element, fmt.block_size
    grid = _grid_values(el)
    vals = np.array(grid + [-v for v in grid], dtype=np.float32)
    rows = []
    for k in (-3, 0, 5):
        body = vals * np.float32(2.0 ** k)
        body = np.concatenate([body, np.zeros((-len(body)) % (bs - 1), np.float32)]).reshape(-1, bs - 1)
        top = np.full((body.shape[0], 1), np.float32(el.max * 2.0 ** k), np.float32)
        rows.append(np.concatenate([top, body], axis=1))
    x = np.concatenate(rows)  # (blocks, bs): whole blocks
    x = np.concatenate([x, np.zeros(((-len(x)) % 4, bs), np.float32)]).reshape(-1, 4 * bs)
    f = mx.BlockFormat(el, bs, scale=fmt.scale, scale_rule=fmt.scale_rule, tensor_scale=fmt.tensor_scale)
    want = mx_oracle.quantize(x.reshape(-1), f, "nearest").astype(np.float32).reshape(x.shape)
    xt = torch.from_numpy(x.copy())
    assert np.array_equal(mx.cast(xt, f).numpy().view(np.int32), want.view(np.int32)), fmt.name
    for packed in (True, False):
        got = mx.decode(mx.encode(xt, f, pack=packed)).numpy()
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), (fmt.name, packed)


@compiled
@pytest.mark.parametrize("numel", [STREAM_MIN_BYTES // 4 - 1024, STREAM_MIN_BYTES // 4])
@pytest.mark.parametrize("threads", [1, 3])
def test_streamed_and_huge_outputs_around_the_threshold(numel, threads):
    """Casts just below and at the streaming threshold, into aligned and unaligned out= and a new
    tensor: the same bits, which are the torch path's (checked on the first and last rows)."""
    x = vector_data((numel // 1024, 1024), seed=numel % 7)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        fresh = mx.cast(x, mx.MXFP8_E4M3)
        buf = torch.empty(numel + 8)
        aligned = buf[8 - (buf.data_ptr() // 4) % 8:][:numel].view(x.shape)
        unaligned = buf[(1 - (buf.data_ptr() // 4)) % 8:][:numel].view(x.shape)
        assert aligned.data_ptr() % 32 == 0 and unaligned.data_ptr() % 32 == 4
        for out in (aligned, unaligned):
            mx.cast(x, mx.MXFP8_E4M3, out=out)
            assert torch.equal(bits(out), bits(fresh))
        enc = mx.encode(x, mx.MXFP8_E4M3)  # 4 MiB of codes: huge pages
    finally:
        torch.set_num_threads(old)
    for rows in (slice(0, 16), slice(-16, None)):
        assert torch.equal(bits(fresh[rows]), bits(torch_cast(x[rows], mx.MXFP8_E4M3, "nearest")))
        w = torch_encode(x[rows], mx.MXFP8_E4M3, "nearest")
        assert torch.equal(enc.codes[rows], w[0]) and torch.equal(enc.scales[rows], w[1])


AMAX_VECTOR = [mx.NVFP4, mx.BlockFormat(cpd.E2M1, 16, scale=cpd.E4M3FN, scale_rule="amax"),
               mx.BlockFormat(cpd.E2M1, 32, scale=cpd.E4M3FN, scale_rule="amax", tensor_scale=True),
               mx.BlockFormat(cpd.E4M3FN, 16, scale=cpd.E4M3FN, scale_rule="amax")]


def amax_sweep(fmt, specials: bool) -> torch.Tensor:
    """Whole blocks whose block scale quotient fl(fl(amax / max_elem) / T) is every positive scale
    value s, every midpoint between neighbours (ties of the scale's rounding) and points just off
    them, below the smallest scale and past the largest; with ``specials`` also NaN, inf and zero
    blocks at every position of a group of 8 blocks (the vector scale computes 8 at a time).
    Two-level formats get T = 3 (the largest block, 2 * max_scale * max_elem * 1.5, over
    max_scale * max_elem): amax = 1.5 s max_elem, so the quotients are s / 2 exactly, ties
    included; the points a few float32 ulps off the ties make a division by T done any other way
    (times fl(1/3)) show."""
    bs, sc = fmt.block_size, fmt.scale
    vals = sorted(float(v) for v in cpd.decode(torch.arange(1 << sc.bits), sc).tolist() if v == v and 0 < v < math.inf)
    mids = [(a + b) / 2 for a, b in zip(vals, vals[1:])]
    near = [m * (1 + j * 2.0 ** -23) for m in mids for j in (-3, -2, -1, 1, 2, 3)]  # a float32 ulp or so off
    amaxes = vals + mids + near + [vals[0] / 4, vals[0] / 1000, vals[-1] * 2]
    g = torch.Generator().manual_seed(len(amaxes) + bs)
    body = torch.rand(len(amaxes), bs - 1, generator=g) * 2 - 1
    x = torch.cat([torch.tensor(amaxes).unsqueeze(1), body * torch.tensor(amaxes).unsqueeze(1)], 1)
    x = x * (fmt.element.max * (1.5 if fmt.tensor_scale else 1.0))
    x[1::2] = -x[1::2].flip(1)
    if specials:
        odd = x[:24].clone()
        for i, v in enumerate((math.nan, math.inf, 0.0, -math.inf, math.nan, 0.0, math.inf, math.nan)):
            odd[i * 3 + i % 3, i % bs] = v
            if v == 0.0:
                odd[i * 3 + i % 3] = 0.0
        x = torch.cat([odd, x])
    x = torch.cat([x, x[:(-len(x)) % 8 + 5]])  # not a whole number of groups of 8
    return x.reshape(-1, 4 * bs) if len(x) % 4 == 0 else x.reshape(-1, bs)


@compiled
@pytest.mark.parametrize("fmt", AMAX_VECTOR, ids=lambda f: f.name)
@pytest.mark.parametrize("threads", [1, 3])
def test_amax_rule_scales_in_vectors(fmt, threads):
    """The amax rule's scales, 8 blocks at a time on the AVX2 path (NVFP4 and its relatives):
    every scale value, midpoint and neighbour, tiny and saturating blocks, NaN/inf/zero blocks at
    every position of a group of 8, against the pure-torch path (cast, encode packed and not,
    decode) and, on the finite blocks, the exact oracle."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for specials in (False, True):
            x = amax_sweep(fmt, specials)
            want = torch_cast(x, fmt, "nearest")
            assert torch.equal(bits(mx.cast(x, fmt)), bits(want)), (fmt.name, specials)
            for packed in (True, False):
                enc = mx.encode(x, fmt, pack=packed)
                w = torch_encode(x, fmt, "nearest", packed=packed)
                assert torch.equal(enc.codes, w[0]) and torch.equal(enc.scales, w[1]), (fmt.name, specials, packed)
                assert torch.equal(bits(mx.decode(enc)), bits(want)), (fmt.name, specials, packed)
            if not specials:
                ref = mx_oracle.quantize(x.numpy().reshape(-1), fmt, "nearest").astype(np.float32).reshape(x.shape)
                assert np.array_equal(mx.cast(x, fmt).numpy().view(np.int32), ref.view(np.int32)), fmt.name
    finally:
        torch.set_num_threads(old)
