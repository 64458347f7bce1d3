"""The fused wire kernels of cpd.distributed (cuda/cpu/hop.cpp) against the exact public ops.

Invariants defended:
* one hop (decode received codes, add in the format, encode) equals ``cpd.add`` on the decoded
  values followed by ``cpd.encode`` (the wire's NaN rule included), for every pair of codes of
  the 8-bit formats e4m3, e5m2, e4m3fn, the 6-bit finite e3m2 and the 4-bit (3, 0) (packed,
  both parities of the element count), every deterministic rounding mode, with and without
  saturate; on random pairs of bfloat16 codes (16-bit, the direct path);
* the fused 8-bit hop (float32 add, one rounding, code read off the rounding) equals it on every
  pair of codes of ten 8-bit formats (IEEE, FN, finite, man 0..5, no subnormals, FNUZ), the pairs
  of finite values in whole vector blocks, and so do the pair tables (``CPD_WIRE_HOP=table``) and
  the scalar fused loop without the AVX2 + F16C path (``CPD_WIRE_HOP=scalar``); the vector path
  also on lengths ending inside a 32-element step and a block, with zeros, subnormals, the
  smallest normal, overflowing sums and inf/NaN codes in the vector steps and the tails, and
  ``kernels.hop_path`` names the loop each format takes; the decode's binary16-view path equals
  the public ops on every code, in whole blocks and tails, next to inf/NaN codes;
  the bucket encode equals ``cpd.cast`` + ``cpd.encode`` on every binade, kept pattern and tie
  (also scaled by 2^s, in ragged runs: the vector encode of round to nearest);
* the wide hop of 16-bit codes (bf16, fp16, (6, 9), an FN fp16, a 15-bit finite (5, 9): float32 add, one rounding; in the
  directed modes of the sum corrected by TwoSum's error term, cpd::sum_f32_directed) equals it on hypothesis' pairs of codes (all 65536 reachable)
  and on random pairs over several blocks (near-cancelling sums, ±0), with ±0, subnormals, the
  smallest normal, the largest finite value (overflowing sums), inf and NaN codes in the vector
  steps and the tails, lengths ending inside an 8-element step and a block, every deterministic
  mode, saturate on and off, each loop (vector, ``CPD_WIRE_HOP=scalar``, ``=table``: add_bits)
  and 1 or 3 threads; under flush-to-zero it writes what the exact loop writes; its directed modes
  also equal an exact rational oracle (tests/oracle.py) on sums float32 does not hold exactly
  (large + tiny, at the largest finite value), exact and cancelling sums;
* the Kahan hop (ring role, with and without a received compensation and a carried one, and the
  sequential role of a hierarchical leader) equals ``cpd.primitives.Accumulator.merge`` on random code
  triples, including specials;
* the bucket encode (scale by 2^s in float64, cast, encode, pack) equals ``cpd.cast`` +
  ``cpd.encode`` + ``pack_codes`` segment by segment, scales far outside float32's range and
  overflow to inf / NaN included; the decode (unpack, decode, / 2^s, * 1/W) equals the public ops;
* the per-segment absmax is the largest magnitude, NaN when any NaN, 0 for an empty segment;
  so is the encode's ``amax=`` (the maxima found in the encode's own pass), on segments that
  cross blocks and threads, with inf, NaN, -0 and empty segments, for every kind of format
  (vector 8-bit, packed 4-bit, 16-bit, float32), and the codes are those of the plain encode;
* the CUDA twin (cuda/kernels/hop.cu) compiles through NVRTC for sm_70/80/90 on any machine and,
  on a GPU (tests marked ``cuda``), gives the CPU kernels' bytes for the same inputs.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

import cpd
from cpd.distributed import kernels
from cpd.distributed.wire import WireFormat
from cpd.rounding import Rounding

compiled = pytest.mark.skipif(not kernels.compiled(), reason="the CPU extension is not built")

MODES = [Rounding.NEAREST, Rounding.TOWARD_ZERO, Rounding.UP, Rounding.DOWN]
SMALL = ["e4m3", "e5m2", "e4m3fn", cpd.FloatFormat(3, 2, specials="finite"), cpd.FloatFormat(3, 0)]


def _all_pairs(bits: int, odd: bool):
    k = 1 << bits
    a = torch.arange(k).repeat_interleave(k)
    b = torch.arange(k).repeat(k)
    if odd:  # an odd element count: the last packed byte is half padding
        a, b = a[:-1], b[:-1]
    return a, b


def _same(got: torch.Tensor, want: torch.Tensor, n: int, wf: WireFormat) -> bool:
    """Equal wire values, bit for bit, except that any NaN equals any NaN (the sign and payload of
    a NaN sum are not specified: the hardware's NaN propagation, operand order)."""
    if got.numel() != want.numel():
        return False
    a, b = kernels.from_bytes(got, n, wf), kernels.from_bytes(want, n, wf)
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32))


def _bytes(codes: torch.Tensor, wf: WireFormat) -> torch.Tensor:
    return kernels.to_bytes(cpd.decode(codes.to(torch.int64), wf.fmt), wf) if not wf.raw32 else codes


@compiled
@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_hop_every_code_pair(fmt):
    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    for odd in (False, True):
        a, b = _all_pairs(wf.bits, odd)
        n = a.numel()
        ra, rb = _bytes(a, wf), _bytes(b, wf)
        for mode, sat in itertools.product(MODES, (False, True)):
            got = rb.clone()
            kernels.hop(ra, got, n, wf, mode, sat)
            want = rb.clone()
            kernels.hop_reference(ra, want, n, wf, mode, sat)
            assert _same(got, want, n, wf), (wf.fmt.name, mode, sat, odd)


# 8-bit formats of every sign convention the fused hop (decode, float32 add, one rounding, code)
# takes, and some it leaves to the pair tables (no subnormals, FNUZ).
FAST8 = ["e4m3", "e5m2", "e4m3fn", cpd.FloatFormat(4, 3, specials="finite"), cpd.FloatFormat(2, 5),
         cpd.FloatFormat(6, 1), cpd.FloatFormat(7, 0), cpd.FloatFormat(3, 4, bias=1),
         cpd.FloatFormat(4, 3, subnormals=False), "e4m3fnuz",
         cpd.FloatFormat(1, 6)]  # IEEE e1m6: no normal value, its max a subnormal (the fused hop misread its code)


def _finite_pairs_first(fmt):
    """Every pair of 8-bit codes, those of two finite values first: whole blocks of the kernel
    (2048 elements) then hold no inf or NaN operand and run the vector path."""
    a, b = _all_pairs(8, False)
    fin = torch.isfinite(cpd.decode(torch.arange(256), fmt))
    order = torch.argsort((~(fin[a] & fin[b])).to(torch.int8), stable=True)
    return a[order], b[order]


@compiled
@pytest.mark.parametrize("fmt", FAST8, ids=str)
def test_fused_hop_every_pair_equals_cpd_add(fmt, monkeypatch):
    """The fused 8-bit hop against the exact path (cpd.add + cpd.encode), on every pair of codes,
    every deterministic mode, with and without saturate; and against the pair tables."""
    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    a, b = _finite_pairs_first(wf.fmt)
    n = a.numel()
    ra, rb = _bytes(a, wf), _bytes(b, wf)
    for mode, sat in itertools.product(MODES, (False, True)):
        want = rb.clone()
        kernels.hop_reference(ra, want, n, wf, mode, sat)
        got = rb.clone()
        kernels.hop(ra, got, n, wf, mode, sat)
        assert _same(got, want, n, wf), (wf.fmt.name, mode, sat)
        monkeypatch.setenv("CPD_WIRE_HOP", "table")
        table = rb.clone()
        kernels.hop(ra, table, n, wf, mode, sat)
        monkeypatch.setenv("CPD_WIRE_HOP", "scalar")  # the fused loop without its AVX2 + F16C path
        scalar = rb.clone()
        kernels.hop(ra, scalar, n, wf, mode, sat)
        monkeypatch.delenv("CPD_WIRE_HOP")
        assert _same(table, want, n, wf), (wf.fmt.name, mode, sat)
        assert _same(scalar, want, n, wf), (wf.fmt.name, mode, sat)


def _vector_build() -> bool:
    """The loaded extension was compiled with AVX2 (every AVX2 CPU has F16C; -march=native)."""
    from cpd import _cpu

    ext = _cpu.extension()
    return ext is not None and ext.isa().split(",")[0] in ("avx2+fma", "avx2", "avx512", "avx512+fp16")


# The 8-bit formats of the vector hop (binary16 view: exp <= 5) and, for contrast, others.
VECTOR8 = ["e4m3", "e5m2", "e4m3fn", cpd.FloatFormat(4, 3, specials="finite"), cpd.FloatFormat(2, 5),
           cpd.FloatFormat(3, 4, bias=1), cpd.FloatFormat(5, 2, specials="fn"), cpd.FloatFormat(4, 3, bias=20)]


@compiled
def test_hop_path_names_the_loop(monkeypatch):
    """kernels.hop_path says which loop runs: the vector path for the 8-bit formats with exp <= 5
    (every deterministic mode), the scalar fused loop for wider exponents, pair tables for the
    formats the fused loop leaves (no subnormals, FNUZ, sub-byte), add_bits per element above 8
    bits; CPD_WIRE_HOP moves it."""
    wf = lambda f: WireFormat(cpd.FloatFormat.parse(f))  # noqa: E731
    vec = "vector" if _vector_build() else "scalar"
    for f in VECTOR8:
        wide = wf(f).fmt.exp == 5  # directed sums of exp-5 formats are not exact in float32: tables
        for mode in MODES:
            want = "tables" if wide and mode != Rounding.NEAREST else vec
            assert kernels.hop_path(wf(f), mode, False) == want, (f, mode)
    assert kernels.hop_path(wf("e4m3"), Rounding.NEAREST, True) == vec
    assert kernels.hop_path(wf("e5m2"), Rounding.TOWARD_ZERO, False) == "tables"  # directed: sums not exact in fp32
    assert kernels.hop_path(wf(cpd.FloatFormat(6, 1)), Rounding.NEAREST, False) == "scalar"
    assert kernels.hop_path(wf(cpd.FloatFormat(7, 0)), Rounding.NEAREST, False) == "scalar"
    assert kernels.hop_path(wf("e4m3fnuz"), Rounding.NEAREST, False) == "tables"
    assert kernels.hop_path(wf(cpd.FloatFormat(1, 6)), Rounding.NEAREST, False) == "tables"  # max subnormal
    assert kernels.hop_path(wf(cpd.FloatFormat(3, 0)), Rounding.NEAREST, False) == "tables"
    wide = "wide-vector" if vec == "vector" else "wide"
    assert kernels.hop_path(wf("bf16"), Rounding.NEAREST, False) == wide  # 16-bit codes: the wide loop
    assert kernels.hop_path(wf("fp16"), Rounding.NEAREST, True) == wide
    assert kernels.hop_path(wf(cpd.FloatFormat(6, 9)), Rounding.NEAREST, False) == "wide"  # table decode
    for mode in MODES[1:]:  # directed: the wide loop too (sum_f32_directed's corrected sums)
        assert kernels.hop_path(wf("bf16"), mode, False) == wide, mode
        assert kernels.hop_path(wf("fp16"), mode, True) == wide, mode
        assert kernels.hop_path(wf(cpd.FloatFormat(6, 9)), mode, False) == "wide", mode
    monkeypatch.setenv("CPD_WIRE_HOP", "scalar")
    assert kernels.hop_path(wf("e4m3"), Rounding.NEAREST, False) == "scalar"
    assert kernels.hop_path(wf("bf16"), Rounding.NEAREST, False) == "wide"
    monkeypatch.setenv("CPD_WIRE_HOP", "table")
    assert kernels.hop_path(wf("e4m3"), Rounding.NEAREST, False) == "tables"
    assert kernels.hop_path(wf("bf16"), Rounding.NEAREST, False) == "exact"  # no pair table: add_bits


def _steered_pairs(fin: torch.Tensor, steer: torch.Tensor, n: int, g: torch.Generator, shift: int, last=None):
    """Codes a, b of n random finite values (``fin``), with the codes ``steer`` (and, rolled by
    ``shift``, in b) placed at a vector step, the tail and the middle; ``last``: b's last steered
    code of each placement, where n leaves room."""
    a = fin[torch.randint(0, fin.numel(), (n,), generator=g)]
    b = fin[torch.randint(0, fin.numel(), (n,), generator=g)]
    k = min(n, steer.numel())
    for at in {0, max(n - k, 0), max(n // 2 - k, 0)}:  # vector step, tail, middle
        a[at:at + k] = steer[:k]
        b[at:at + k] = torch.roll(steer, shift)[:k]
        if last is not None and n >= k + 1:
            b[at + k - 1] = last
    return a, b


@compiled
@pytest.mark.parametrize("fmt", VECTOR8 + [cpd.FloatFormat(6, 1)], ids=str)
def test_fused_hop_tails_and_specials(fmt, monkeypatch):
    """The vector hop (and the scalar loop) against cpd.add on lengths that end inside a 32-element
    step and inside a 2048-element block, with the codes that steer its selects placed in the
    vector steps and in the tails: ±0, the smallest subnormals, the largest subnormal and smallest
    normal, the largest finite value (sums overflow: inf, NaN or saturation), and in some rows an
    inf or NaN code, which sends that block (only) through the pair table."""
    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    f = wf.fmt
    vals = cpd.decode(torch.arange(256), f)
    fin = torch.nonzero(torch.isfinite(vals)).flatten()
    special = torch.nonzero(~torch.isfinite(vals)).flatten()
    mag = vals.abs()
    pos = (vals > 0) & torch.isfinite(vals)
    sub = torch.nonzero(pos & (mag < 2.0 ** f.emin)).flatten()
    top = int(torch.nonzero(pos & (mag == mag[pos].max())).flatten()[0])
    steer = torch.tensor([0, 128, top, top | 128, 1, 129, int(torch.nonzero(pos & (mag == 2.0 ** f.emin))[0])]
                         + (sub[-1:].tolist() if sub.numel() else []))
    g = torch.Generator().manual_seed(7)
    for n in (1, 5, 31, 32, 33, 63, 2047, 2048 + 33, 3 * 2048 + 17):
        for with_special in (False, True):
            a, b = _steered_pairs(fin, steer, n, g, 2)
            if with_special and special.numel():
                a[n // 2] = special[0]
                b[n - 1] = special[-1]
            ra, rb = a.to(torch.uint8), b.to(torch.uint8)
            for mode, sat in itertools.product(MODES, (False, True)):
                want = rb.clone()
                kernels.hop_reference(ra, want, n, wf, mode, sat)
                for path in (None, "scalar"):
                    if path:
                        monkeypatch.setenv("CPD_WIRE_HOP", path)
                    got = rb.clone()
                    kernels.hop(ra, got, n, wf, mode, sat)
                    monkeypatch.delenv("CPD_WIRE_HOP", raising=False)
                    assert _same(got, want, n, wf), (f.name, n, with_special, mode, sat, path)


@compiled
@pytest.mark.parametrize("fmt", FAST8 + [cpd.FloatFormat(3, 2, specials="finite"), cpd.FloatFormat(3, 0)], ids=str)
def test_encode_every_binade_and_tie(fmt):
    """The bucket encode (code read off the rounding) against cpd.cast + cpd.encode on every float32
    whose low 16 bits are 0, 1 or 0xffff (every binade, every kept pattern, ties and their
    neighbours for formats of <= 7 mantissa bits), finite values first (whole vector blocks),
    then infinities and NaN."""
    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    hi = torch.arange(1 << 16, dtype=torch.int64) << 16
    u = torch.cat([hi, hi | 1, hi | 0xFFFF]).to(torch.int32)
    x = u.view(torch.float32)
    x = torch.cat([x[torch.isfinite(x)], x[~torch.isfinite(x)]])
    segs = kernels.segments([(0, x.numel(), 0)])
    for mode, sat in itertools.product(MODES, (False, True)):
        got = kernels.encode(x, segs, wf, mode, sat)
        want = kernels.encode_reference(x, segs, wf, mode, sat)
        assert _same(got, want, x.numel(), wf), (wf.fmt.name, mode, sat)
    # scaled runs (the vector encode multiplies by 2^s in float32), ragged run boundaries
    n = x.numel()
    segs = kernels.segments([(0, 1000, -20), (1000, 2071, 7), (3071, n - 3071 - 5, -140), (n - 5, 5, 3)])
    for sat in (False, True):
        got = kernels.encode(x, segs, wf, Rounding.NEAREST, sat)
        want = kernels.encode_reference(x, segs, wf, Rounding.NEAREST, sat)
        assert _same(got, want, n, wf), (wf.fmt.name, "scaled", sat)


@compiled
def test_hop_bfloat16_random_pairs():
    wf = WireFormat(cpd.FloatFormat.parse("bf16"))
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 1 << 16, (2, 20001), generator=g)
    specials = torch.tensor([0, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F7F, 0x0001, 0x8001])
    codes[:, :64] = specials.repeat(8)[None, :].expand(2, 64)
    codes[1, :64] = specials.repeat_interleave(8)
    ra, rb = _bytes(codes[0], wf), _bytes(codes[1], wf)
    for mode in MODES:
        got = rb.clone()
        kernels.hop(ra, got, codes.shape[1], wf, mode, False)
        want = rb.clone()
        kernels.hop_reference(ra, want, codes.shape[1], wf, mode, False)
        assert _same(got, want, codes.shape[1], wf), mode


WIDE16 = ["bf16", "fp16", cpd.FloatFormat(6, 9), cpd.FloatFormat(5, 10, specials="fn"),
          cpd.FloatFormat(5, 9, specials="finite")]  # the last: 15-bit codes, no inf or NaN


def _hop_all_paths(ra, rb, n, wf, monkeypatch, threads=(1,), modes=MODES, paths=(None, "scalar", "table")):
    """Every mode and saturate flag, each CPU loop (CPD_WIRE_HOP) and torch thread count, against
    hop_reference (cpd.add + cpd.encode)."""
    old = torch.get_num_threads()
    try:
        for mode, sat in itertools.product(modes, (False, True)):
            _check_plain_hop(ra, rb, n, wf, mode, sat, monkeypatch, list(itertools.product(paths, threads)))
    finally:
        torch.set_num_threads(old)
        monkeypatch.delenv("CPD_WIRE_HOP", raising=False)


def _wide_codes(fmt):
    f = cpd.FloatFormat.parse(fmt) if isinstance(fmt, str) else fmt
    return WireFormat(f), f


@compiled
@settings(max_examples=25, deadline=None)
@given(data=st.data(), fmt=st.sampled_from(WIDE16))
def test_wide_hop_random_code_pairs(data, fmt):
    """The wide hop of 16-bit codes (float32 add, one rounding) against cpd.add + cpd.encode on
    hypothesis' pairs of codes (any of the 65536, inf and NaN included), every deterministic mode,
    saturate on and off, each loop."""
    wf, f = _wide_codes(fmt)
    n = data.draw(st.integers(1, 70), label="n")
    codes = st.lists(st.integers(0, (1 << wf.bits) - 1), min_size=n, max_size=n)
    a, b = torch.tensor(data.draw(codes, label="a")), torch.tensor(data.draw(codes, label="b"))
    mp = pytest.MonkeyPatch()
    try:
        _hop_all_paths(_bytes(a, wf), _bytes(b, wf), n, wf, mp)
    finally:
        mp.undo()


@compiled
@pytest.mark.parametrize("fmt", WIDE16, ids=str)
def test_wide_hop_many_random_pairs(fmt, monkeypatch):
    """Random pairs of codes over several blocks (finite ones in most blocks, so that the fast
    loop, not the exact redo, answers them), with 1 and 3 threads."""
    wf, f = _wide_codes(fmt)
    g = torch.Generator().manual_seed(11)
    n = 5 * 2048 + 3
    vals = cpd.decode(torch.arange(1 << wf.bits), f)
    fin = torch.nonzero(torch.isfinite(vals)).flatten()
    a = fin[torch.randint(0, fin.numel(), (n,), generator=g)]
    b = fin[torch.randint(0, fin.numel(), (n,), generator=g)]
    if not torch.isfinite(vals).all():
        b[3 * 2048 + 5] = int(torch.nonzero(~torch.isfinite(vals))[0])  # one block redone exactly
    # near-cancelling pairs: sums deep in the subnormals, exact zeros of both signs
    a[:512] = fin[torch.randint(0, fin.numel(), (512,), generator=g)]
    b[:512] = a[:512] ^ (1 << (wf.bits - 1))
    b[:256] = b[:256] + torch.randint(-3, 4, (256,), generator=g).clamp(min=0)
    b[:512] = torch.where(torch.isfinite(cpd.decode(b[:512], f)), b[:512], a[:512])
    _hop_all_paths(_bytes(a, wf), _bytes(b, wf), n, wf, monkeypatch, threads=(1, 3),
                   modes=[Rounding.NEAREST, Rounding.DOWN])


@compiled
@pytest.mark.parametrize("fmt", WIDE16, ids=str)
def test_wide_hop_tails_and_specials(fmt, monkeypatch):
    """Lengths ending inside an 8-element vector step and inside a 2048-element block, with ±0, the
    smallest and largest subnormals, the smallest normal, the largest finite value (sums that
    overflow: inf past float32's range for bf16, the cast's overflow for fp16; saturation), and in
    some rows inf and NaN codes, in the vector steps and in the tails; 1 and 3 threads."""
    wf, f = _wide_codes(fmt)
    sign = 1 << (wf.bits - 1)
    vals = cpd.decode(torch.arange(1 << wf.bits), f)
    pos = (vals > 0) & torch.isfinite(vals)
    mag = vals.abs()
    top = int(torch.nonzero(pos & (mag == mag[pos].max()))[0])
    sub_top = int(torch.nonzero(pos & (mag < 2.0 ** f.emin)).flatten()[-1])
    normal = int(torch.nonzero(pos & (mag == 2.0 ** f.emin))[0])
    steer = torch.tensor([0, sign, 1, sign | 1, sub_top, sign | sub_top, normal, sign | normal, top, top, sign | top,
                          top - 1])
    special = torch.nonzero(~torch.isfinite(vals)).flatten()
    inf_nan = special[[0, -1]] if special.numel() else None  # +inf and a NaN (IEEE), NaN codes (FN)
    fin = torch.nonzero(torch.isfinite(vals)).flatten()
    g = torch.Generator().manual_seed(5)
    for n in (1, 7, 8, 9, 2047, 2048 + 9, 3 * 2048 + 17):
        for with_special in (False, True):
            a, b = _steered_pairs(fin, steer, n, g, 3, last=top)  # top + top: the overflowing sum
            if with_special and inf_nan is not None:
                a[n // 2] = inf_nan[0]
                b[n - 1] = inf_nan[1]
                a[0] = inf_nan[1]
            _hop_all_paths(_bytes(a, wf), _bytes(b, wf), n, wf, monkeypatch, threads=(1, 3) if n > 4096 else (1,))


@compiled
@pytest.mark.parametrize("fmt", ["bf16", "fp16", cpd.FloatFormat(5, 9, specials="finite")], ids=str)
def test_wide_hop_directed_equals_exact_sums(fmt):
    """The directed modes of the wide hop against an oracle of their own (tests/oracle.py: the exact
    rational sum of the two values, rounded once by bracketing, the IEEE sign of an exact zero):
    pairs whose float32 sum is not exact (a large value plus a tiny one: the correction of
    cpd::sum_f32_directed, on both sides of the large value's code, at the largest finite value:
    overflow, saturation), exact ones, cancelling ones (±0), both signs, in vector steps and tails."""
    import oracle
    from fractions import Fraction

    wf, f = _wide_codes(fmt)
    sign, n = 1 << (wf.bits - 1), 3 * 2048 + 13
    vals = cpd.decode(torch.arange(1 << wf.bits), f)
    fin = torch.nonzero(torch.isfinite(vals)).flatten()
    mag = vals.abs()
    top = int(torch.nonzero((vals > 0) & (mag == mag[torch.isfinite(vals)].max()))[0])
    g = torch.Generator().manual_seed(7)
    a = fin[torch.randint(0, fin.numel(), (n,), generator=g)]
    b = fin[torch.randint(0, fin.numel(), (n,), generator=g)]
    tiny = torch.randint(1, 1 << (f.man + 2), (n,), generator=g) | (torch.randint(0, 2, (n,), generator=g) * sign)
    big = torch.randint(0, 2, (n,), generator=g) * sign
    b[: n // 2] = tiny[: n // 2]  # large + tiny: float32 sums that are not exact
    a[: n // 8] = top | big[: n // 8]  # around the largest finite value
    a[n // 8: n // 4] = (top - torch.randint(0, 4, (n // 4 - n // 8,), generator=g)) | big[n // 8: n // 4]
    b[n // 2: n // 2 + 300] = a[n // 2: n // 2 + 300] ^ sign  # exact cancellation
    b[n // 2 + 300: n // 2 + 400] = a[n // 2 + 300: n // 2 + 400]
    a[n // 2 + 400: n // 2 + 450], b[n // 2 + 400: n // 2 + 450] = 0, sign  # +0 + -0
    ra, rb = _bytes(a, wf), _bytes(b, wf)
    value = {c: Fraction(oracle.code_value(f, c)) for c in set(a.tolist()) | set(b.tolist())}
    for mode, sat in itertools.product(MODES[1:], (False, True)):
        got = rb.clone()
        kernels.hop(ra, got, n, wf, mode, sat)
        codes = (got.view(torch.int16).to(torch.int64) & ((1 << wf.bits) - 1)).tolist()
        for i, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
            q = value[x] + value[y]
            neg_zero = (x & sign and y & sign) or (bool((x ^ y) & sign) and mode == Rounding.DOWN)
            want = oracle.oracle_round(q, f, mode.value, sat, zero_negative=bool(neg_zero))
            assert oracle.same_f32(oracle.code_value(f, codes[i]), want), (fmt, mode, sat, i, x, y)


@compiled
def test_wide_hop_under_flush_to_zero(monkeypatch):
    """bfloat16's subnormals are float32 subnormals: with flush-to-zero / denormals-are-zero on the
    hop's thread (torch.set_flush_denormal) every loop (wide, scalar, table) writes what it writes
    without the flags: the extension's chunks run with subnormals kept (cuda/cpu/fp_env.h
    KeepSubnormals; before it, the table loop's decode flushed bfloat16 subnormals)."""
    wf, f = _wide_codes("bf16")
    g = torch.Generator().manual_seed(2)
    n = 4096 + 5
    a = torch.randint(0, 1 << 16, (n,), generator=g) & 0x807F  # ±0 and subnormals
    b = torch.randint(0, 1 << 16, (n,), generator=g) & 0x80FF  # and the smallest normal binade
    ra, rb = _bytes(a, wf), _bytes(b, wf)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    got = {}
    try:
        if not torch.set_flush_denormal(True):
            pytest.skip("no flush-to-zero control on this CPU")
        for path in (None, "scalar", "table"):
            if path:
                monkeypatch.setenv("CPD_WIRE_HOP", path)
            got[path] = rb.clone()
            kernels.hop(ra, got[path], n, wf, Rounding.NEAREST, False)
            monkeypatch.delenv("CPD_WIRE_HOP", raising=False)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(old)
    assert torch.equal(got[None], got["table"]) and torch.equal(got["scalar"], got["table"])
    ftz_free = rb.clone()
    kernels.hop(ra, ftz_free, n, wf, Rounding.NEAREST, False)
    assert torch.equal(ftz_free, got[None])  # the flags did not reach the hop's arithmetic


KAHAN_LANES = ["e4m3", "e5m2", "e4m3fn", cpd.FloatFormat(3, 0), cpd.FloatFormat(3, 2, specials="finite"), "bf16",
               "fp16", cpd.FloatFormat(5, 9, specials="finite")]


@compiled
@pytest.mark.parametrize("fmt", KAHAN_LANES, ids=lambda f: getattr(f, "name", f))
def test_kahan_hop_lanes(fmt, monkeypatch):
    """The Kahan hop's float32 lanes (each add one rounding of a float32 sum: kahan_lanes) against
    Accumulator.merge (cpd.add per line) and against the add_bits loop (CPD_WIRE_HOP=table), on
    finite codes in most blocks (so that the lanes, not the redo, answer them), the operands decoded
    by the vector paths and by the table (CPD_WIRE_HOP=scalar): sums and values
    of like and of far-apart magnitudes, compensations from tiny to as large as the sum, exact
    cancellations; one block with an inf/NaN code (redone through add_bits), a length ending
    inside a block; every deterministic mode, saturate on and off, each role (ring, with and
    without a received and a carried compensation, and sequential), 1 and 3 threads."""
    f = cpd.FloatFormat.parse(fmt) if isinstance(fmt, str) else fmt
    wf = WireFormat(f)
    for mode in MODES:
        assert kernels.hop_path(wf, mode, False, kahan=True) == "kahan-lanes", mode
    g = torch.Generator().manual_seed(3)
    n = 2 * 2048 + 37
    vals = cpd.decode(torch.arange(1 << wf.bits), f)
    fin = torch.nonzero(torch.isfinite(vals)).flatten()
    mag = vals[fin].abs()
    small = fin[mag <= mag.max() * 2.0 ** -(f.man + 3)]
    pick = lambda pool, k: pool[torch.randint(0, pool.numel(), (k,), generator=g)]  # noqa: E731
    rows = [pick(fin, n) for _ in range(4)]  # recv, recv_c, acc, acc_c
    rows[1][: n // 2] = pick(small, n // 2)  # compensations far below the sums
    rows[3][n // 4:] = pick(small, n - n // 4)
    rows[2][100:300] = rows[0][100:300] ^ (1 << (wf.bits - 1))  # x = -s
    special = torch.nonzero(~torch.isfinite(vals)).flatten()
    if special.numel():
        rows[2][2048 + 7] = special[0]  # the second block: redone through add_bits
        rows[1][2048 + 9] = special[-1]
    rows = [_bytes(r, wf) for r in rows]
    old = torch.get_num_threads()
    try:
        for mode, sat, (has_c, carry, seq) in itertools.product(
                MODES, (False, True), [(False, False, False), (True, False, False), (True, True, False),
                                       (False, True, False), (False, False, True)]):
            recv, recv_c, acc, acc_c = rows
            args = dict(kahan=True, recv_c=recv_c if has_c else None, carry=carry, sequential=seq)
            want, want_c = acc.clone(), acc_c.clone()
            kernels.hop_reference(recv, want, n, wf, mode, sat, acc_c=want_c, **args)
            for path, th in ((None, 1), (None, 3), ("scalar", 1), ("table", 1)):  # scalar: the lanes' table decode
                torch.set_num_threads(th)
                if path:
                    monkeypatch.setenv("CPD_WIRE_HOP", path)
                got, got_c = acc.clone(), acc_c.clone()
                kernels.hop(recv, got, n, wf, mode, sat, acc_c=got_c, **args)
                monkeypatch.delenv("CPD_WIRE_HOP", raising=False)
                assert _same(got, want, n, wf) and _same(got_c, want_c, n, wf), (f.name, mode, sat, has_c, carry,
                                                                                 seq, path, th)
    finally:
        torch.set_num_threads(old)
    monkeypatch.setenv("CPD_WIRE_HOP", "table")
    assert kernels.hop_path(wf, Rounding.NEAREST, False, kahan=True) == "exact"
    monkeypatch.delenv("CPD_WIRE_HOP")
    assert kernels.hop_path(WireFormat(cpd.FloatFormat(4, 3, specials="fnuz")), Rounding.NEAREST, False,
                            kahan=True) == "exact"  # FNUZ: add_bits


@compiled
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", cpd.FloatFormat(3, 0), "bf16"], ids=str)
def test_kahan_hop(fmt):
    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    g = torch.Generator().manual_seed(2)
    n = 4099
    k = 1 << min(wf.bits, 16)
    rows = [_bytes(torch.randint(0, k, (n,), generator=g), wf) for _ in range(4)]
    for mode, (has_c, carry, seq) in itertools.product(
            MODES[:2], [(False, False, False), (True, False, False), (True, True, False), (False, True, False),
                        (False, False, True)]):
        recv, recv_c, acc, acc_c = (r.clone() for r in rows)
        args = dict(kahan=True, recv_c=recv_c if has_c else None, carry=carry, sequential=seq)
        a1, c1 = acc.clone(), acc_c.clone()
        kernels.hop(recv, a1, n, wf, mode, False, acc_c=c1, **args)
        a2, c2 = acc.clone(), acc_c.clone()
        kernels.hop_reference(recv, a2, n, wf, mode, False, acc_c=c2, **args)
        assert _same(a1, a2, n, wf) and _same(c1, c2, n, wf), (wf.fmt.name, mode, has_c, carry, seq)


@compiled
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e4m3fn", cpd.FloatFormat(3, 0),
                                 cpd.FloatFormat(2, 2, specials="finite"), "bf16", "fp32"], ids=str)
def test_encode_and_decode_segments(fmt):
    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(10007, generator=g) * 2.0 ** torch.randint(-30, 30, (10007,), generator=g)
    x[5] = 3e38
    x[6] = -1e-45
    segs = kernels.segments([(0, 7, 0), (100, 0, 3), (10, 2048, -12), (3000, 4097, 40), (9000, 1000, 150),
                             (7, 3, -150), (8000, 1, 9)])  # disjoint: decode writes each once
    for mode, sat in itertools.product(MODES, (False, True)):
        got = kernels.encode(x, segs, wf, mode, sat)
        want = kernels.encode_reference(x, segs, wf, mode, sat)
        assert torch.equal(got, want), (wf.fmt.name, mode, sat)
        for inv in (1.0, 0.25):
            o1 = torch.full((10007,), 7.0)
            o2 = o1.clone()
            bad = kernels.decode(got, segs, o1, wf, inv)
            kernels.decode_reference(got, segs, o2, wf, inv)
            assert bad == kernels._count_nonfinite(o2, segs), (wf.fmt.name, mode, sat, inv)
            nan = torch.isnan(o1)
            assert torch.equal(nan, torch.isnan(o2)), (wf.fmt.name, mode, sat, inv)
            assert torch.equal(o1[~nan].view(torch.int32), o2[~nan].view(torch.int32)), (wf.fmt.name, mode, sat, inv)


@compiled
@pytest.mark.parametrize("fmt", VECTOR8 + ["e4m3fnuz", cpd.FloatFormat(4, 3, subnormals=False)], ids=str)
def test_decode_every_code(fmt, monkeypatch):
    """The decode (binary16-view path for the formats of the vector hop, table otherwise) against
    the public ops on every code: blocks of finite codes only, a block with the inf/NaN codes,
    lengths ending inside a 16-element step, scale exponents that keep, shrink (to float32
    subnormals: rounded once) and grow the values, with and without the 1/W factor."""
    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    vals = cpd.decode(torch.arange(256), wf.fmt)
    fin = torch.nonzero(torch.isfinite(vals)).flatten()
    bad = torch.nonzero(~torch.isfinite(vals)).flatten()
    codes = torch.cat([fin.repeat(2048 // fin.numel() + 1)[:2048], fin, bad, fin[:37]]).to(torch.uint8)
    for n in (codes.numel(), 2048 + 15, 2048, 17, 3):
        rows = [(0, n, 0)] if n < 64 else [(0, 1000, 0), (1000, 1100, -135), (2100, n - 2100, 20)] if n > 2100 \
            else [(0, 600, 3), (600, 400, 130), (1000, n - 1000, -140)]  # 2^-130: a float32 subnormal
        segs = kernels.segments(rows)
        for inv, path in itertools.product((1.0, 0.25), (None, "scalar")):
            if path:
                monkeypatch.setenv("CPD_WIRE_HOP", path)
            o1 = torch.full((n,), 7.0)
            o2 = o1.clone()
            nbad = kernels.decode(codes[:n], segs, o1, wf, inv)
            monkeypatch.delenv("CPD_WIRE_HOP", raising=False)
            kernels.decode_reference(codes[:n], segs, o2, wf, inv)
            assert nbad == kernels._count_nonfinite(o2, segs), (wf.fmt.name, n, inv, path)
            nan = torch.isnan(o1)
            assert torch.equal(nan, torch.isnan(o2)), (wf.fmt.name, n, inv, path)
            assert torch.equal(o1[~nan].view(torch.int32), o2[~nan].view(torch.int32)), (wf.fmt.name, n, inv, path)


@compiled
@pytest.mark.parametrize("fmt", ["bf16", "fp16", cpd.FloatFormat(5, 9, specials="finite")], ids=lambda f: getattr(f, "name", f))
def test_decode_every_16_bit_code(fmt):
    """The decode of 9..16-bit codes (through the table of the codes' values) against the public
    ops on every code (inf and NaN included), scale exponents that keep, shrink (to float32
    subnormals) and grow the values, with and without the 1/W factor, 1 and 3 threads; bf16's APS
    scales are about 2^130, whose inverse is a float32 subnormal (the float64 product: 126 is the
    last exponent multiplied in float32)."""
    f = cpd.FloatFormat.parse(fmt) if isinstance(fmt, str) else fmt
    wf = WireFormat(f)
    n = 1 << wf.bits
    codes = _bytes(torch.arange(n), wf)
    scales = (0, -120, 30, 126, 127, 133, 149)
    k = n // len(scales)
    segs = kernels.segments([(i * k, k if i + 1 < len(scales) else n - i * k, sc) for i, sc in enumerate(scales)])
    old = torch.get_num_threads()
    try:
        for inv, th in itertools.product((1.0, 0.25), (1, 3)):
            torch.set_num_threads(th)
            o1 = torch.full((n,), 7.0)
            o2 = o1.clone()
            nbad = kernels.decode(codes, segs, o1, wf, inv)
            kernels.decode_reference(codes, segs, o2, wf, inv)
            assert nbad == kernels._count_nonfinite(o2, segs), (f.name, inv, th)
            nan = torch.isnan(o1)
            assert torch.equal(nan, torch.isnan(o2)), (f.name, inv, th)
            assert torch.equal(o1[~nan].view(torch.int32), o2[~nan].view(torch.int32)), (f.name, inv, th)
    finally:
        torch.set_num_threads(old)


@compiled
def test_absmax():
    x = torch.tensor([1.0, -3.0, 2.0, float("inf"), 0.5, float("nan"), -0.0, 7.0])
    segs = kernels.segments([(0, 3, 0), (0, 4, 0), (4, 2, 0), (6, 1, 0), (2, 0, 0), (7, 1, 0)])
    got = kernels.absmax(x, segs)
    assert got[:2] == [3.0, float("inf")] and got[2] != got[2] and got[3:] == [0.0, 0.0, 7.0]


def _absmax_oracle(x: torch.Tensor, segs: torch.Tensor) -> list:
    out = []
    for off, n, _ in segs.tolist():
        v = x[off:off + n].double()
        out.append(0.0 if n == 0 else float("nan") if bool(torch.isnan(v).any()) else float(v.abs().max()))
    return out


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("fmt", ["e4m3", cpd.FloatFormat(3, 0), "bf16", "fp32"])
def test_encode_finds_the_maxima_of_its_segments(fmt, threads):
    wf = WireFormat(cpd.FP32 if fmt == "fp32" else cpd.FloatFormat.parse(fmt) if isinstance(fmt, str) else fmt)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20000, generator=g) * 2.0 ** torch.randint(-30, 10, (20000,), generator=g)
    x[4100] = -3.0e6  # the largest magnitude, negative, deep inside a segment that spans blocks
    x[9000] = float("inf")
    x[12001] = float("nan")
    x[15000:15008] = -0.0
    segs = kernels.segments([(0, 5000, -3), (5000, 0, 0), (5000, 4001, 2), (11000, 1500, 0), (15000, 8, 5),
                             (15008, 4992, -7), (3, 1, 0)])
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        amax = torch.full((segs.shape[0],), 7.0)
        got = kernels.encode(x, segs, wf, Rounding.NEAREST, False, amax=amax)
        plain = kernels.encode(x, segs, wf, Rounding.NEAREST, False)
    finally:
        torch.set_num_threads(old)
    want = _absmax_oracle(x, segs)
    assert [v != v for v in amax.tolist()] == [v != v for v in want], (amax, want)
    assert [v for v in amax.tolist() if v == v] == [v for v in want if v == v], (amax, want)
    assert torch.equal(got, plain)
    assert want[0] == 3.0e6 and want[2] == float("inf") and want[3] != want[3] and want[4] == 0.0
    with pytest.raises(ValueError, match="amax"):
        kernels.encode(x, segs, wf, Rounding.NEAREST, False, amax=torch.zeros(2))


@pytest.mark.parametrize("arch", ["sm_70", "sm_80", "sm_90"])
def test_cuda_hop_kernels_compile(arch, tmp_path, monkeypatch):
    from cpd import _cuda

    if not _cuda.available():
        pytest.skip("cuda-bindings NVRTC not installed")
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    assert _cuda.compile_source("hop.cu", arch, use_cache=False)[:4] == b"\x7fELF"


@pytest.mark.cuda
@compiled
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", cpd.FloatFormat(3, 0), cpd.FloatFormat(3, 2, specials="finite"),
                                 "bf16", "fp32"], ids=str)
def test_cuda_kernels_equal_cpu(fmt):
    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5003, generator=g) * 2.0 ** torch.randint(-20, 20, (5003,), generator=g)
    segs = kernels.segments([(0, 1001, 3), (2000, 2003, -7), (1500, 5, 0)])
    cuda = torch.device("cuda")
    for mode in MODES:
        cpu = kernels.encode(x, segs, wf, mode, False)
        gpu = kernels.encode(x.to(cuda), segs, wf, mode, False)
        assert torch.equal(gpu.cpu(), cpu), (wf.fmt.name, mode)
        n = 3009
        a, b = cpu[:wf.nbytes(n)].clone(), torch.roll(cpu, 7)[:wf.nbytes(n)].clone()
        for kahan in (False, True):
            c1, c2 = a.clone(), a.clone()
            s1, s2 = b.clone(), b.to(cuda)
            kernels.hop(a, s1, n, wf, mode, False, kahan=kahan, acc_c=c1 if kahan else None, recv_c=b if kahan else None)
            kernels.hop(a.to(cuda), s2, n, wf, mode, False, kahan=kahan, acc_c=c2.to(cuda) if kahan else None,
                        recv_c=b.to(cuda) if kahan else None)
            assert _same(s2.cpu(), s1, n, wf), (wf.fmt.name, mode, kahan)
        o1, o2 = torch.zeros(5003), torch.zeros(5003, device=cuda)
        kernels.decode(cpu, segs, o1, wf, 0.5)
        kernels.decode(cpu.to(cuda), segs, o2, wf, 0.5)
        assert torch.equal(o1.view(torch.int32), o2.cpu().view(torch.int32)), (wf.fmt.name, mode)


@compiled
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", cpd.FloatFormat(3, 0), cpd.FloatFormat(3, 2, specials="finite"),
                                 "bf16", "fp32"], ids=str)
@pytest.mark.parametrize("route", ["cpp", "python"])
def test_cuda_kernels_through_the_host_shim_equal_cpu(fmt, route):
    """hop.cu, run on the host by cpd._shim with the parameter array cuLaunchKernel would get, gives
    the CPU kernels' bytes: encode, hop (plain and Kahan) and decode, ragged segments included.
    route "cpp": the extension's C++ launches (cuda/cpu/launch.cpp, what a GPU gets), on CPU
    tensors through the shim; "python": the Python launches (a GPU machine with no compiler)."""
    from cpd import _shim
    from cpd.distributed import cuda_kernels

    launch = _shim.launch if route == "python" else None
    assert route == "python" or cuda_kernels.native() is not None

    wf = WireFormat(cpd.FloatFormat.parse(fmt))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1203, generator=g) * 2.0 ** torch.randint(-20, 20, (1203,), generator=g)
    rows = [(0, 301, 3), (700, 203, -7), (500, 5, 0)]
    segs = kernels.segments(rows)
    total = sum(n for _, n, _ in rows)
    for mode in MODES:
        cpu = kernels.encode(x, segs, wf, mode, False)
        shim = torch.zeros_like(cpu)
        cuda_kernels.encode(x, segs, shim, wf, mode, False, launcher=launch)
        assert torch.equal(shim[:wf.nbytes(total)], cpu[:wf.nbytes(total)]), (wf.fmt.name, mode)
        n = 509
        a, b = cpu[:wf.nbytes(n)].clone(), torch.roll(cpu, 7)[:wf.nbytes(n)].clone()
        for kahan in (False, True):
            c1, c2 = a.clone(), a.clone()
            s1, s2 = b.clone(), b.clone()
            kernels.hop(a, s1, n, wf, mode, False, kahan=kahan, acc_c=c1 if kahan else None, recv_c=b if kahan else None)
            cuda_kernels.hop(a, s2, n, wf, mode, False, kahan, b if kahan else None, c2 if kahan else None, False,
                             False, launcher=launch)
            assert _same(s2, s1, n, wf), (wf.fmt.name, mode, kahan)
        o1, o2 = torch.zeros(1203), torch.zeros(1203)
        kernels.decode(cpu, segs, o1, wf, 0.5)
        cuda_kernels.decode(cpu, segs, o2, wf, 0.5, launcher=launch)
        assert torch.equal(o1.view(torch.int32), o2.view(torch.int32)), (wf.fmt.name, mode)


@compiled
@pytest.mark.parametrize("fmt", SMALL + ["bf16", "fp16", cpd.TF32, cpd.FP32], ids=lambda f: getattr(f, "name", f))
@pytest.mark.parametrize("route", ["cpp", "python"])
def test_cuda_hop_lanes_through_the_host_shim(fmt, route):
    """hop.cu's hop (its float32 lanes, add_lanes, where arith.h's identities hold; add_bits
    otherwise), run on the host by the shim, against the public ops (hop_reference: cpd.add per
    merge): every pair of codes of the formats of <= 8 bits and random pairs of 16-bit, TF32 and
    float32 codes (inf and NaN included), then the Kahan merge of every role on random codes, sums and
    compensations both, every deterministic mode, saturate on and off."""
    from cpd import _shim
    from cpd.distributed import cuda_kernels

    launch = _shim.launch if route == "python" else None  # None: the C++ launches, through the shim
    f = cpd.FloatFormat.parse(fmt) if isinstance(fmt, str) else fmt
    wf = WireFormat(f)
    g = torch.Generator().manual_seed(11)
    def wire(codes):  # cpd.FP32: the codes are the float32 bits themselves
        return codes.to(torch.int32).view(torch.uint8) if wf.raw32 else _bytes(codes, wf)

    if wf.bits <= 8:
        ra, rb = _all_pairs(wf.bits, False)
    else:
        ra, rb = (torch.randint(0, 1 << wf.bits, (6000,), generator=g) for _ in range(2))
    n = ra.numel()
    recv, acc = wire(ra), wire(rb)
    for mode, sat in itertools.product(MODES, (False, True)):
        want = acc.clone()
        kernels.hop_reference(recv, want, n, wf, mode, sat)
        got = acc.clone()
        cuda_kernels.hop(recv, got, n, wf, mode, sat, False, None, None, False, False, launcher=launch)
        assert _same(got, want, n, wf), (f.name, mode, sat)
    n = 1000 + 5
    rows = [wire(torch.randint(0, 1 << wf.bits, (n,), generator=g)) for _ in range(4)]
    for mode, sat, (has_c, carry, seq) in itertools.product(
            MODES, (False, True), [(False, False, False), (True, False, False), (True, True, False),
                                   (False, True, False), (False, False, True)]):
        recv, recv_c, acc, acc_c = rows
        want, want_c = acc.clone(), acc_c.clone()
        kernels.hop_reference(recv, want, n, wf, mode, sat, kahan=True, recv_c=recv_c if has_c else None,
                              acc_c=want_c, carry=carry, sequential=seq)
        got, got_c = acc.clone(), acc_c.clone()
        cuda_kernels.hop(recv, got, n, wf, mode, sat, True, recv_c if has_c else None, got_c, carry, seq,
                         launcher=launch)
        assert _same(got, want, n, wf) and _same(got_c, want_c, n, wf), (f.name, mode, sat, has_c, carry, seq)


@compiled
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3", "e5m2", cpd.FloatFormat(3, 0), cpd.FP32],
                         ids=lambda f: getattr(f, "name", f))
def test_encode_scales_past_float32s_largest_power_of_two(fmt):
    """The encode's scale 2^s for 127 < s <= 254 (bfloat16's APS scales are about 2^130), taken
    as two float32 products, and past it (float64), against the public ops in float64
    (encode_reference): values from float32's smallest subnormal to its largest finite value, so
    that the scaled values reach every binade of the format, overflow, and stay exact."""
    wf = WireFormat(cpd.FloatFormat.parse(fmt) if isinstance(fmt, str) else fmt)
    g = torch.Generator().manual_seed(4)
    e = torch.randint(-149, 128, (6000,), generator=g).double()
    x = (torch.rand(6000, generator=g, dtype=torch.float64) + 1.0) * 2.0 ** e
    x = torch.where(torch.rand(6000, generator=g) < 0.5, -x, x).to(torch.float32)
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e-45, -1e-45, 3.4e38, float("inf"), float("nan"), 2.0 ** -127])])
    scales = [126, 127, 128, 130, 200, 253, 254, 255, 300]
    k = x.numel() // len(scales)
    segs = kernels.segments([(i * k, k if i + 1 < len(scales) else x.numel() - i * k, s) for i, s in enumerate(scales)]
                            + [(0, 40, 140)])  # a second pass over some values, at another scale
    total = int(segs[:, 1].sum())
    for mode, sat in itertools.product(MODES, (False, True)):
        got = kernels.encode(x, segs, wf, mode, sat)
        want = kernels.encode_reference(x, segs, wf, mode, sat)
        assert _same(got, want, total, wf), (wf.fmt.name, mode, sat)


def _check_plain_hop(recv, acc, n, wf, mode, sat, monkeypatch, runs=((None, 1), (None, 3), ("table", 1))) -> None:
    """The plain hop against hop_reference (cpd.add per element) for each (CPD_WIRE_HOP, torch
    threads) of ``runs`` (default: the default path with 1 and 3 threads, and add_bits); the
    caller restores the thread count."""
    want = acc.clone()
    kernels.hop_reference(recv, want, n, wf, mode, sat)
    for path, th in runs:
        torch.set_num_threads(th)
        if path:
            monkeypatch.setenv("CPD_WIRE_HOP", path)
        got = acc.clone()
        kernels.hop(recv, got, n, wf, mode, sat)
        monkeypatch.delenv("CPD_WIRE_HOP", raising=False)
        assert _same(got, want, n, wf), (wf.fmt.name, n, mode, sat, path, th)


WIDE32 = [cpd.FloatFormat(8, 10), cpd.FloatFormat(8, 12), cpd.FloatFormat(6, 12), cpd.FloatFormat(8, 10, bias=140),
          cpd.FloatFormat(5, 14, specials="finite")]


def _codes_past_16(wf: WireFormat, n: int, g) -> torch.Tensor:
    """n uniformly random codes of a 17..31-bit format (every binade: sums that cancel, overflow
    and reach the subnormals); inf/NaN codes only in the first two blocks (the others run the
    lanes: a block with an inf or NaN goes to add_bits whole)."""
    f = wf.fmt
    codes = torch.randint(0, 1 << wf.bits, (n,), generator=g)
    vals = cpd.decode(codes, f)
    special = torch.nonzero(~torch.isfinite(vals)).flatten()
    codes[special[special > 2 * 2048]] = 0  # the first blocks only may hold an inf or NaN code
    return codes


@compiled
@pytest.mark.parametrize("fmt", WIDE32, ids=lambda f: f.name)
def test_wide_hop_of_codes_past_16_bits(fmt, monkeypatch):
    """Codes of 17..31 bits (int32 on the wire; TF32 = (8, 10) is 19 bits) through the wide loop's
    float32 lanes (the shift view where the format shares float32's exponent field, decode_bits
    otherwise) and the Kahan lanes, against the public ops (hop_reference: cpd.add per merge) and
    the add_bits loop (CPD_WIRE_HOP=table): random codes (a block with inf/NaN codes, sums that
    cancel exactly, mixed magnitudes), a length ending inside a block, every deterministic mode,
    saturate on and off, every Kahan role, 1 and 3 threads."""
    wf = WireFormat(fmt)
    assert wf.bits > 16 and wf.nbytes(3) == 12
    g = torch.Generator().manual_seed(17)
    n = 3 * 2048 + 11
    rows = [_codes_past_16(wf, n, g) for _ in range(4)]
    rows[2][500:700] = rows[0][500:700] ^ (1 << (wf.bits - 1))  # x = -s
    rows[3][2048:] = 0  # +0 compensations past the first block
    rows = [_bytes(r, wf) for r in rows]
    old = torch.get_num_threads()
    try:
        for mode, sat in itertools.product(MODES, (False, True)):
            path = kernels.hop_path(wf, mode, sat)
            assert path == "wide" if fmt == cpd.FloatFormat(8, 10) else path in ("wide", "exact"), (fmt.name, mode)
            assert kernels.hop_path(wf, mode, sat, kahan=True) == ("kahan-lanes" if path == "wide" else "exact")
            recv, recv_c, acc, acc_c = rows
            _check_plain_hop(recv, acc, n, wf, mode, sat, monkeypatch)
            for has_c, carry, seq in [(False, False, False), (True, False, False), (True, True, False),
                                      (False, True, False), (False, False, True)]:
                args = dict(kahan=True, recv_c=recv_c if has_c else None, carry=carry, sequential=seq)
                want, want_c = acc.clone(), acc_c.clone()
                kernels.hop_reference(recv, want, n, wf, mode, sat, acc_c=want_c, **args)
                got, got_c = acc.clone(), acc_c.clone()
                kernels.hop(recv, got, n, wf, mode, sat, acc_c=got_c, **args)
                assert _same(got, want, n, wf) and _same(got_c, want_c, n, wf), (fmt.name, mode, sat, has_c,
                                                                                 carry, seq)
    finally:
        torch.set_num_threads(old)


@compiled
def test_decode_every_tf32_code():
    """The decode of every code of TF32 = (8, 10) (the shift view) and of random codes of the other
    formats past 16 bits (decode_bits), at scales that keep, shrink (to float32 subnormals) and
    grow the values, with and without the 1/W factor, against the public ops."""
    for fmt in WIDE32:
        wf = WireFormat(fmt)
        codes = torch.arange(1 << wf.bits) if wf.bits == 19 else \
            torch.randint(0, 1 << wf.bits, (70000,), generator=torch.Generator().manual_seed(3))
        n = codes.numel()
        data = _bytes(codes, wf)
        scales = (0, -120, 30, 126, 127, 133)
        k = n // len(scales)
        segs = kernels.segments([(i * k, k if i + 1 < len(scales) else n - i * k, s) for i, s in enumerate(scales)])
        for inv in (1.0, 0.25):
            o1, o2 = torch.full((n,), 7.0), torch.full((n,), 7.0)
            nbad = kernels.decode(data, segs, o1, wf, inv)
            kernels.decode_reference(data, segs, o2, wf, inv)
            assert nbad == kernels._count_nonfinite(o2, segs), (fmt.name, inv)
            nan = torch.isnan(o1)
            assert torch.equal(nan, torch.isnan(o2)), (fmt.name, inv)
            assert torch.equal(o1[~nan].view(torch.int32), o2[~nan].view(torch.int32)), (fmt.name, inv)


@compiled
@pytest.mark.parametrize("fmt", ["e5m2", cpd.FloatFormat(5, 6), "bf16", cpd.FloatFormat(8, 10)],
                         ids=lambda f: getattr(f, "name", f))
def test_kernels_refuse_buffers_shorter_than_the_codes(fmt):
    """The hop and the decode check their byte buffers against the codes' storage (packed up to 8
    bits, int16 up to 16, int32 beyond): one byte short is an error, not a read past the end."""
    wf = WireFormat(cpd.FloatFormat.parse(fmt) if isinstance(fmt, str) else fmt)
    n = 40
    nb = wf.nbytes(n)
    ok = torch.zeros(nb, dtype=torch.uint8)
    short = torch.zeros(nb - 1, dtype=torch.uint8)
    kernels.hop(ok, ok.clone(), n, wf, Rounding.NEAREST, False)
    with pytest.raises(RuntimeError, match="recv"):
        kernels.hop(short, ok.clone(), n, wf, Rounding.NEAREST, False)
    with pytest.raises(RuntimeError, match="acc"):
        kernels.hop(ok, short.clone(), n, wf, Rounding.NEAREST, False)
    segs = kernels.segments([(0, n, 0)])
    with pytest.raises(RuntimeError, match="in"):
        kernels.decode(short, segs, torch.zeros(n), wf)


@compiled
def test_float32_hop(monkeypatch):
    """cpd.FP32 on the wire (the fp32_layers and the hybrid phase): the wide loop's float32 sums
    (to nearest the float32 sum, directed sum_f32_directed's bits, non-finite sums through
    add_bits) against the public ops (hop_reference: cpd.add in FP32) and the add_bits loop
    (CPD_WIRE_HOP=table): random bit patterns (every binade, subnormals, inf, NaN), sums that
    cancel exactly, that overflow and that land on float32's subnormals, every deterministic mode,
    saturate on and off, 1 and 3 threads."""
    wf = WireFormat(cpd.FP32)
    g = torch.Generator().manual_seed(23)
    n = 3 * 2048 + 5
    r = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, generator=g)
    a = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, generator=g)
    nan = torch.isnan(r.view(torch.float32)) | torch.isinf(r.view(torch.float32))
    r[2048:][nan[2048:]] = 0  # inf/NaN operands in the first block only: the later ones run the lanes
    nan = torch.isnan(a.view(torch.float32)) | torch.isinf(a.view(torch.float32))
    a[2048:][nan[2048:]] = 0
    a[2100:2300] = r[2100:2300] ^ (-(2**31))  # x = -s: exact zeros
    r[2400:2500] = 0x7F7FFFFF  # max + max: past float32's range
    a[2400:2500] = 0x7F7FFF00
    r[2600:2700] = torch.randint(0, 1 << 23, (100,), dtype=torch.int32, generator=g)  # subnormal sums
    a[2600:2700] = torch.randint(-(1 << 23), 1 << 23, (100,), dtype=torch.int32, generator=g) & 0x807FFFFF
    r[3000:5000] = (torch.randn(2000, generator=g) * 3).view(torch.int32)  # like magnitudes
    a[3000:5000] = (torch.randn(2000, generator=g) * 3).view(torch.int32)
    recv, acc = r.view(torch.uint8), a.view(torch.uint8)
    old = torch.get_num_threads()
    try:
        for mode, sat in itertools.product(MODES, (False, True)):
            assert kernels.hop_path(wf, mode, sat) == "wide"
            _check_plain_hop(recv, acc, n, wf, mode, sat, monkeypatch)
    finally:
        torch.set_num_threads(old)
