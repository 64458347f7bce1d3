"""The one wire codec of format codes (cpd.codec), against a bit stream built by hand with Python
integers: code i at bits [i*b, (i+1)*b) of one little-endian integer."""

import math
import random
import struct

import pytest
import torch
from hypothesis import given, settings, strategies as st

import cpd
from cpd.codec import FormatCodec, code_nbytes, pack_codes, unpack_codes


def oracle_pack(codes, bits):
    word = 0
    for i, c in enumerate(codes):
        word |= c << (i * bits)
    return list(word.to_bytes((len(codes) * bits + 7) // 8, "little"))


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_matches_the_hand_built_stream(bits):
    rng = random.Random(bits)
    for n in list(range(0, 25)) + [63, 64, 65, 1000]:
        codes = [rng.randrange(1 << bits) for _ in range(n)]
        t = torch.tensor(codes, dtype=torch.uint8)
        packed = pack_codes(t, bits)
        assert packed.dtype == torch.uint8 and packed.tolist() == oracle_pack(codes, bits), (bits, n)
        assert packed.numel() == code_nbytes(n, bits) == math.ceil(n * bits / 8)
        back = unpack_codes(packed, bits, n)
        assert back.dtype == torch.uint8 and back.tolist() == codes
        for dt in (torch.int16, torch.int32, torch.int64):   # any integer dtype packs the same
            assert torch.equal(pack_codes(t.to(dt), bits), packed)
    every = list(range(1 << bits))                      # every code value, exhaustively
    assert pack_codes(torch.tensor(every), bits).tolist() == oracle_pack(every, bits)


def test_known_bytes_and_bit_order():
    assert pack_codes(torch.tensor([1, 2, 15], dtype=torch.uint8), 4).tolist() == [0x21, 0x0F]
    assert pack_codes(torch.tensor([1, 0, 0, 0, 0, 0, 0, 0, 1]), 1).tolist() == [0x01, 0x01]
    assert pack_codes(torch.tensor([0b101, 0b011]), 3).tolist() == [0b011101]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda b: st.tuples(st.just(b), st.lists(st.integers(0, (1 << b) - 1), max_size=70))))
def test_pack_hypothesis(case):
    bits, codes = case
    packed = pack_codes(torch.tensor(codes, dtype=torch.int64), bits)
    assert packed.tolist() == oracle_pack(codes, bits)
    assert unpack_codes(packed, bits, len(codes)).tolist() == codes


def test_input_not_modified_and_errors():
    t = torch.tensor([3, 1, 2], dtype=torch.int32)
    copy = t.clone()
    pack_codes(t, 2)
    assert torch.equal(t, copy)
    with pytest.raises(ValueError, match="bits"):
        pack_codes(t, 9)
    with pytest.raises(ValueError, match="bits"):
        pack_codes(t, True)
    with pytest.raises(ValueError, match="range"):
        pack_codes(torch.tensor([4]), 2)
    with pytest.raises(ValueError, match="range"):
        pack_codes(torch.tensor([-1]), 8)
    with pytest.raises(TypeError, match="integer"):
        pack_codes(torch.tensor([1.0]), 4)
    with pytest.raises(ValueError, match="need"):
        unpack_codes(torch.zeros(3, dtype=torch.uint8), 4, 8)
    with pytest.raises(TypeError, match="uint8"):
        unpack_codes(torch.zeros(4, dtype=torch.int32), 4, 8)
    with pytest.raises(ValueError, match="n must be"):
        code_nbytes(-1, 4)


def test_width_rule_is_built_on_code_dtype():
    # FloatFormat objects for the sub-byte formats: their bare names (e2m1, e3m2, e2m3) are being
    # made unambiguous (issue 16 item 7), so the tests do not depend on how they parse.
    for name in (cpd.FloatFormat(2, 1), "e3m0", cpd.FloatFormat(3, 2), "e4m3", "e5m2", "fp16", "bf16", "tf32",
                 "fp32", cpd.FloatFormat(5, 10)):
        f = cpd.FloatFormat.parse(name)
        size = torch.empty(0, dtype=cpd.code_dtype(f)).element_size()
        want = math.ceil(7 * f.bits / 8) if f.bits <= 8 else 7 * size
        assert code_nbytes(7, f) == FormatCodec(f).nbytes(7) == want, name


@pytest.mark.parametrize("name", [cpd.FloatFormat(2, 1), cpd.E2M1, "e3m0", cpd.FloatFormat(3, 2),
                                  cpd.FloatFormat(2, 3, specials="finite"), "e4m3", "e5m2", "e4m3fn"],
                         ids=lambda f: f if isinstance(f, str) else f"exp{f.exp}-man{f.man}-{f.specials.value}")
def test_codec_roundtrip_exhaustive_small_formats(name):
    f = cpd.FloatFormat.parse(name)
    codec = FormatCodec(f)
    codes = torch.arange(1 << f.bits)
    values = cpd.decode(codes, f)
    values = values[~torch.isnan(values)]      # NaN codes decode to one canonical NaN
    data = codec.encode(values)
    assert data.numel() == codec.nbytes(values.numel())
    back = codec.decode(data, values.numel())
    assert torch.equal(back.view(torch.int32), values.view(torch.int32))   # bit for bit, signed zeros too
    assert torch.equal(data, pack_codes(cpd.encode(values, f), f.bits))


@pytest.mark.parametrize("name", ["fp16", "bf16", "tf32", "fp32"])
def test_codec_wide_formats_are_little_endian_code_words(name):
    f = cpd.FloatFormat.parse(name)
    x = torch.randn(33, generator=torch.Generator().manual_seed(2))
    codec = FormatCodec(f)
    data = codec.encode(x)
    codes = cpd.encode(x, f).to(torch.int64).tolist()
    size = 2 if f.bits <= 16 else 4
    fmt = "<" + ("h" if size == 2 else "i") * len(codes)
    signed = [c - (1 << (8 * size)) if c >= 1 << (8 * size - 1) else c for c in codes]
    assert bytes(data.tolist()) == struct.pack(fmt, *signed)
    assert torch.equal(codec.decode(data, 33), cpd.cast(x, f))
    assert torch.equal(codec.decode(data[0:0].new_tensor(data.tolist()), 33), cpd.cast(x, f))


def test_one_bit_order_for_compressors_and_the_transport():
    """FormatCompressor's code bytes and cpd.distributed's packed codes are the same bytes."""
    for name in (cpd.E2M1, "e3m0", cpd.FloatFormat(2, 3), "e4m3", "fp16"):
        f = cpd.FloatFormat.parse(name)
        x = cpd.cast(torch.randn(37, generator=torch.Generator().manual_seed(5)), f)
        payload = cpd.compressors.FormatCompressor(f, scale=None).encode(x)
        assert torch.equal(payload.parts["codes"], FormatCodec(f).encode(x)), name
        if f.bits <= 8:
            codes = cpd.encode(x, f)
            assert torch.equal(payload.parts["codes"], cpd.distributed.pack_codes(codes, f.bits)), name
