"""AMD matrix-core presets (CDNA1-3) and Blackwell's block-scaled MMA (MX, NVFP4) against an
independent oracle.

Invariants defended:
* every CPU path (vectorized where it applies, the generic loop, the pure-torch fallback, the
  readable reference, the public ``cpd.matmul``) gives the oracle's bits for every AMD preset and
  every block-scaled kind, with ragged last groups, subnormals, zeros and non-finite operands;
* the documented behaviours hold: CDNA3's round-down alignment of a negative accumulator (the
  "asymmetric rounding" MMA-Sim reports) and the fp8 cut-off of c, CDNA2's flushing of
  subnormals (AMD MIOpen's MI200 MFMA note) versus CDNA1, the pairwise float32 order of CDNA1/2,
  product overflow on CDNA3; Blackwell's block scales enter the alignment (mxf8f6f4) and the
  mxf4nvf4 chunk sums are exact;
* every E4M3FNUZ pair (CDNA3 fp8) as a product of a 16-wide step agrees across paths (the
  float64 lanes against the generic loop on all pairs, the oracle on a sample);
* bad arguments raise clear errors; gradients of block-scaled GEMMs are straight-through.

The oracle follows MMA-Sim's formulation (arXiv 2511.10909): operands as (significand in
[1, 2) or below for subnormals, exponent); Python floats for significands (exact: at most 24
significant bits), ints and Fractions for sums; numpy's float32 for IEEE float32 arithmetic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import cpd
from cpd import _cpu, _fused_dot_ref
from cpd.tensor_core import AMD_ARCHITECTURES, FusedDot, tensor_core

import oracle
from test_tensor_core import same, values_of


# ----------------------------------------------------------------------------------- the oracle
def sig_exp(x: float, emin: int) -> tuple[float, int]:
    """(significand, exponent) of x: x = s 2^e, 1 <= |s| < 2, or e = emin for subnormals; zero: e = -126."""
    if x == 0:
        return 0.0, -126
    m, e = math.frexp(x)
    e -= 1
    if e < emin:
        return x / 2.0**emin, emin
    return m * 2, e


def f32(v: float) -> float:
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.float32(v))


def oracle_amd_pairwise(av, bv, c, L, ftz, emin_a, emin_b):
    tiny = np.float32(2.0**-126)

    def fl(v):
        v = np.float32(v)
        return v * np.float32(0.0) if ftz and abs(v) < tiny else v

    ps = []
    for k in range(L):
        x, y = (av[k], bv[k]) if k < len(av) else (0.0, 0.0)
        if ftz:
            x = 0.0 if abs(x) < 2.0**emin_a else x
            y = 0.0 if abs(y) < 2.0**emin_b else y
        if not (math.isfinite(x) and math.isfinite(y)):  # IEEE specials: inf * 0 is NaN, inf * y is inf
            with np.errstate(invalid="ignore"):
                ps.append(np.float32(x) * np.float32(y))
            continue
        exact = Fraction(x) * Fraction(y)
        ps.append(fl(np.float32(0.0) if exact == 0 else np.float32(float(exact))))  # fma(x, y, +0)
    while len(ps) > 1:
        with np.errstate(invalid="ignore", over="ignore"):
            ps = [fl(ps[i] + ps[i + 1]) for i in range(0, len(ps), 2)]
    cc = np.float32(0.0) if ftz and abs(c) < 2.0**-126 else np.float32(c)
    with np.errstate(invalid="ignore", over="ignore"):
        return float(fl(cc + ps[0]))


def oracle_amd_cdna3(av, bv, c, emin_a, emin_b, fp8):
    with np.errstate(invalid="ignore"):
        raw = np.float64(c) + sum(np.float64(x) * np.float64(y) for x, y in zip(av, bv))
    if not np.isfinite(raw):
        return float(raw)
    terms = []
    for x, y in zip(av, bv):
        if abs(x * y) >= 2.0**128:
            over = {math.copysign(1, x * y) for x, y in zip(av, bv) if abs(x * y) >= 2.0**128}
            return math.nan if len(over) == 2 else math.copysign(math.inf, over.pop())
        (sa, ea), (sb, eb) = sig_exp(x, emin_a), sig_exp(y, emin_b)
        terms.append((sa * sb, ea + eb))

    def fused(ts):
        if not ts:
            return 0, -252
        e = max(t[1] for t in ts)
        return sum(math.trunc(s * 2.0 ** (24 + ei - e)) for s, ei in ts), e  # units 2^(e - 24)

    if fp8:
        (n0, e0), (n1, e1) = fused(terms[0::2]), fused(terms[1::2])
        e = max(e0, e1)
        n = math.floor(Fraction(n0, 2 ** (e - e0))) + math.floor(Fraction(n1, 2 ** (e - e1)))
    else:
        n, e = fused(terms)
    sc, ec = sig_exp(c, -126)
    m = max(e, ec)
    total = Fraction(math.floor(Fraction(n) * Fraction(2) ** (7 + e - m)), 2**31)
    if not (fp8 and ec < m - 25):
        total += Fraction(math.floor(Fraction(sc) * Fraction(2) ** (24 + ec - m)), 2**24)
    return f32(float(total * Fraction(2) ** m)) + 0.0  # exact in float64, then RNE to float32


def oracle_nv_scaled(av, bv, c, xs, emin_a, emin_b, F, scales=None):
    """mxf8f6f4: each product's exponent and value carry 2^xs (its blocks' E8M0 exponents); a
    scale that is not finite (``scales``: the products' S_a S_b) makes the step c + sum(a b S_a S_b)
    (NaN or +-inf), as a non-finite element does."""
    scales = scales or [1.0] * len(av)
    with np.errstate(invalid="ignore", over="ignore"):
        raw = np.float64(c) + sum(np.float64(x) * np.float64(y) * np.float64(s) for x, y, s in zip(av, bv, scales))
    if not all(map(math.isfinite, scales)):
        return float(raw)
    if not np.isfinite(raw):
        return float(raw)
    terms = [sig_exp(c, -126)]
    for x, y, s in zip(av, bv, xs):
        (sa, ea), (sb, eb) = sig_exp(x, emin_a), sig_exp(y, emin_b)
        terms.append((sa * sb, ea + eb + s))
    return _cut_sum_rz(terms, F)


def _cut_sum_rz(terms, F):
    """Cut every (significand, exponent) term to F bits below the largest exponent, sum, RZ to FP32."""
    e = max(t[1] for t in terms)
    n = sum(math.trunc(Fraction(s) * Fraction(2) ** (F + ei - e)) for s, ei in terms)
    v = Fraction(n) * Fraction(2) ** (e - F)
    if v == 0:
        return 0.0
    if abs(v) >= 2**128:
        return math.copysign(math.inf, v)
    x = np.float32(float(v)) if abs(v) < 2**127 * 2 else np.float32(np.inf)
    if abs(Fraction(float(x))) > abs(v):  # nearest went away from zero: one step back
        x = np.nextafter(x, np.float32(0))
    return float(x) + 0.0


def oracle_chunk16(av, bv, c, sas, sbs, s_emin, F):
    """mxf4nvf4: exact sums of 16 products, times the scales' significands, at the scales' exponents."""
    with np.errstate(invalid="ignore"):
        raw = np.float64(c) + sum(np.float64(x) * np.float64(y) * sx * sy for x, y, sx, sy in zip(av, bv, sas, sbs))
    if not np.isfinite(raw):
        return float(raw)
    terms = [sig_exp(c, -126)]
    for k in range(0, len(av), 16):
        chunk = sum(Fraction(x) * Fraction(y) for x, y in zip(av[k:k + 16], bv[k:k + 16]))
        (ssa, esa), (ssb, esb) = sig_exp(sas[k], s_emin), sig_exp(sbs[k], s_emin)
        terms.append((chunk * Fraction(ssa) * Fraction(ssb), esa + esb))
    return _cut_sum_rz(terms, F)


def oracle_matmul(a, b, acc: FusedDot, sa=None, sb=None, block=1):
    M, K = a.shape
    N = b.shape[1]
    al, bl = a.double().tolist(), b.double().tolist()
    y = torch.empty(M, N)
    s_emin = acc.a_block.scale.emin if acc.block_scaled else -127
    for i in range(M):
        for j in range(N):
            c = 0.0
            for k0 in range(0, K, acc.group):
                ks = list(range(k0, min(K, k0 + acc.group)))
                av, bv = [al[i][k] for k in ks], [bl[k][j] for k in ks]
                if acc.algorithm == "amd_pairwise":
                    c = oracle_amd_pairwise(av, bv, c, acc.group, acc.ftz, acc.a.emin, acc.b.emin)
                elif acc.algorithm.startswith("amd_cdna3"):
                    c = oracle_amd_cdna3(av, bv, c, acc.a.emin, acc.b.emin, acc.algorithm.endswith("fp8"))
                elif acc.algorithm == "nvidia_chunk16":
                    c = oracle_chunk16(av, bv, c, [sa[i, k // block].item() for k in ks],
                                       [sb[k // block, j].item() for k in ks], s_emin, acc.frac_bits)
                else:
                    ss = [(sa[i, k // block].item(), sb[k // block, j].item()) for k in ks]
                    if all(math.isfinite(u) and math.isfinite(v) for u, v in ss):
                        xs = [sig_exp(u, s_emin)[1] + sig_exp(v, s_emin)[1] for u, v in ss]
                        c = oracle_nv_scaled(av, bv, c, xs, acc.a.emin, acc.b.emin, acc.frac_bits)
                    else:
                        c = oracle_nv_scaled(av, bv, c, [0] * len(ks), acc.a.emin, acc.b.emin, acc.frac_bits,
                                             [u * v for u, v in ss])
            y[i, j] = c
    return y


# ----------------------------------------------------------------------------------- helpers
def _paths(a, b, acc, sa=None, sb=None):
    """Every CPU path for 2-D a, b (values of the input formats; block scales sa (M, nb), sb (nb, N))."""
    p = acc.params
    none = torch.empty(0)
    s3 = (sa[None].contiguous(), sb[None].contiguous()) if sa is not None else (none, none)
    block = acc.a_block.block_size if acc.block_scaled else 1
    s_emin = acc.a_block.scale.emin if acc.block_scaled else -127
    a3, b3 = a[None].contiguous(), b[None].contiguous()
    ext = torch.ops.cpd_fused_dot.matmul
    args = (*s3, block, s_emin, *p, acc.a.man, acc.a.emax, acc.b.man, acc.b.emax)
    out = {"auto": ext(a3, b3, *args, 0)[0], "generic": ext(a3, b3, *args, 1)[0],
           "fallback": _fused_dot_ref.matmul_torch(a3, b3, p, *s3, block, s_emin)[0]}
    if a.numel() * b.shape[1] <= 400:
        out["reference"] = _fused_dot_ref.reference_matmul(a3, b3, p, *s3, block, s_emin)[0]
    return out


AMD_PRESETS = [(arch, k, k) for arch, kinds in AMD_ARCHITECTURES.items() for k in kinds] + [("cdna3", "fp8", "bf8")]


# ----------------------------------------------------------------------------------- AMD
@pytest.mark.parametrize("arch,ka,kb", AMD_PRESETS, ids=str)
def test_amd_presets_match_oracle(arch, ka, kb):
    acc = tensor_core(arch, a=ka, b=kb)
    gen = torch.Generator().manual_seed(hash((arch, ka, kb)) % 2**31)
    M, K, N = 3, 2 * acc.group + 3, 4  # a ragged (zero-padded) last group
    a = values_of(acc.a, M * K, gen).reshape(M, K)
    b = values_of(acc.b, K * N, gen).reshape(K, N)
    want = oracle_matmul(a, b, acc)
    for name, got in _paths(a, b, acc).items():
        assert same(got, want), f"{name}: {got} != {want}"
    assert same(cpd.matmul(a, b, acc=acc), want)


@pytest.mark.parametrize("arch,ka", [("cdna1", "fp16"), ("cdna2", "bf16"), ("cdna3", "bf16"), ("cdna3", "bf8")])
def test_amd_non_finite(arch, ka):
    acc = tensor_core(arch, a=ka)
    gen = torch.Generator().manual_seed(4)
    M, K, N = 4, acc.group + 2, 5
    a = values_of(acc.a, M * K, gen, specials=acc.a.has_inf).reshape(M, K)
    b = values_of(acc.b, K * N, gen, specials=acc.b.has_inf).reshape(K, N)
    if not acc.a.has_inf:  # FNUZ fp8 has no infinities: NaN only
        a[0, 0] = math.nan
    want = oracle_matmul(a, b, acc)
    assert torch.isnan(want).any()
    for name, got in _paths(a, b, acc).items():
        assert same(got, want), name
        assert (got.view(torch.int32)[torch.isnan(got)] == 0x7FC00000).all(), name


def _one(acc, avals, bvals):
    return cpd.matmul(torch.tensor([avals]), torch.tensor([[v] for v in bvals]), acc=acc).item()


def test_cdna3_rounds_a_negative_accumulator_down():
    """MMA-Sim's CDNA3 "asymmetric rounding": c is rounded down (toward -inf) to 24 fractional
    bits below the step's largest exponent, so a tiny negative c costs one unit, a positive one
    nothing; NVIDIA cuts toward zero; CDNA3 fp8 drops c below 2^(m - 25) altogether."""
    g = 8
    tiny = 2.0**-15  # an fp16 subnormal: (-2^-15) * 2^-15 = -2^-30 in the first group
    a = [-tiny] + [0.0] * (g - 1) + [1.0] + [0.0] * (g - 1)
    b = [tiny] + [0.0] * (g - 1) + [1.0] + [0.0] * (g - 1)
    assert _one(tensor_core("cdna3", a="fp16"), a, b) == 1.0 - 2.0**-24
    assert _one(tensor_core("cdna3", a="fp16"), [-a[0]] + a[1:], b) == 1.0
    assert _one(tensor_core("hopper", a="fp16"), a, b) == 1.0
    c = [-(2.0**-13)] + [0.0] * 15 + [1.0] + [0.0] * 15  # c = -2^-26 (e(c) = -26 < 0 - 25): dropped
    cb = [2.0**-13] + [0.0] * 15 + [1.0] + [0.0] * 15
    acc8 = tensor_core("cdna3", a="bf8")
    assert _one(acc8, c, cb) == 1.0
    c2 = [-(2.0**-12)] + [0.0] * 15 + [1.0] + [0.0] * 15  # c = -2^-24 (e(c) = -24 >= -25): kept, exact
    assert _one(acc8, c2, [2.0**-12] + cb[1:]) == 1.0 - 2.0**-24


def test_cdna2_flushes_subnormals_cdna1_keeps_them():
    """AMD MIOpen: MI200's MFMA_F16/BF16 flush subnormal inputs and outputs; CDNA1 does not."""
    sub = 2.0**-15  # an fp16 subnormal
    assert _one(tensor_core("cdna1", a="fp16"), [sub], [1.0]) == sub
    assert _one(tensor_core("cdna2", a="fp16"), [sub], [1.0]) == 0.0
    assert _one(tensor_core("cdna3", a="fp16"), [sub], [1.0]) == sub
    out = _one(tensor_core("cdna2", a="bf16"), [2.0**-100], [-(2.0**-30)])  # product -2^-130: flushed, sign kept
    assert out == 0.0


def test_pairwise_order_of_cdna1():
    """CDNA1/2 sum a group of 4 as (p0 + p1) + (p2 + p3) in float32: 1 + 2^-24 rounds to 1 (tie to
    even) but 2^-24 + 2^-24 is exact, so the order of the same products changes the result."""
    acc = tensor_core("cdna1", a="fp16")
    u = 2.0**-12
    assert _one(acc, [1.0, u, u, 0.0], [1.0, u, u, 0.0]) == 1.0
    assert _one(acc, [1.0, 0.0, u, u], [1.0, 0.0, u, u]) == 1.0 + 2.0**-23
    exact = tensor_core("cdna3", a="fp16")  # one fused sum: order-free here
    assert _one(exact, [1.0, u, u, 0.0], [1.0, u, u, 0.0]) == _one(exact, [1.0, 0.0, u, u], [1.0, 0.0, u, u])


def test_cdna3_product_overflow():
    acc = tensor_core("cdna3", a="bf16")
    big = 2.0**100
    assert _one(acc, [big, 1.0], [2.0**30, 1.0]) == math.inf  # 2^130 >= 2^128
    assert math.isnan(_one(acc, [big, -big], [2.0**30, 2.0**30]))  # both signs overflow: NaN


def test_cdna3_fp8_pairs_exhaustive():
    """Every pair of E4M3FNUZ values as the first product of a 16-wide CDNA3 step (the other 15
    fixed): the generic loop and the fallback agree; the oracle on a sample."""
    acc = tensor_core("cdna3", a="fp8")
    vals = torch.tensor(sorted(set(oracle.positive_values(cpd.E4M3FNUZ)) | {0.0}), dtype=torch.float32)
    vals = torch.cat([vals, -vals[1:]])
    n = len(vals)
    gen = torch.Generator().manual_seed(12)
    rest_a, rest_b = values_of(acc.a, 15, gen, spread=3), values_of(acc.b, 15, gen, spread=3)
    a = torch.cat([vals[:, None], rest_a.expand(n, 15)], dim=1)
    b = torch.cat([vals[None, :], rest_b[:, None].expand(15, n)], dim=0)
    got = _paths(a, b, acc)
    assert same(got["auto"], got["generic"])  # the float64 lanes (fd_tile_amd) on every pair
    assert same(got["fallback"][:8], got["generic"][:8])
    for i, j in torch.randint(0, n, (200, 2), generator=gen).tolist():
        assert same(got["generic"][i:i + 1, j:j + 1], oracle_matmul(a[i:i + 1], b[:, j:j + 1], acc))


# ----------------------------------------------------------------------------------- Blackwell MX / NVFP4
def _block_operands(x, fmt, k_axis):
    from cpd.tensor_core import _block_operand

    p, s, t = _block_operand(x, fmt, k_axis)
    return p, s, t


BLOCK_PAIRS = [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e5m2", "mxfp8_e4m3"), ("mxfp6_e3m2", "mxfp6_e2m3"),
               ("mxfp8_e4m3", "mxfp4"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4")]


@pytest.mark.parametrize("ka,kb", BLOCK_PAIRS, ids=str)
def test_block_scaled_match_oracle(ka, kb):
    acc = tensor_core("blackwell", a=ka, b=kb)
    gen = torch.Generator().manual_seed(hash((ka, kb)) % 2**31)
    M, K, N = 3, 2 * acc.group + 16, 4
    a = torch.randn(M, K, generator=gen) * torch.exp2(torch.randint(-12, 12, (M, K), generator=gen).float())
    b = torch.randn(K, N, generator=gen) * torch.exp2(torch.randint(-12, 12, (K, N), generator=gen).float())
    a[0, :32] = 0.0  # an all-zero block
    pa, sa, ta = _block_operands(a, acc.a_block, -1)
    pb, sb, tb = _block_operands(b, acc.b_block, -2)
    block = acc.a_block.block_size
    want = oracle_matmul(pa, pb, acc, sa, sb, block)
    for name, got in _paths(pa, pb, acc, sa, sb).items():
        assert same(got, want), f"{name}: {got} != {want}"
    public = cpd.matmul(a, b, acc=acc)
    alpha = (ta if ta is not None else torch.tensor(1.0)) * (tb if tb is not None else torch.tensor(1.0))
    assert same(public, want * alpha)
    # the model is close to the exact product of the dequantized operands
    aq, bq = cpd.mx.cast(a, acc.a_block), cpd.mx.cast(b, torch_replace(acc.b_block, axis=-2))
    assert ((public - aq @ bq).abs() <= 1e-5 * (aq.abs() @ bq.abs())).all()


def torch_replace(fmt, **kw):
    import dataclasses

    return dataclasses.replace(fmt, **kw)


def test_non_finite_block_scales():
    """A NaN or infinite scale with finite elements (the raw op; cpd.matmul makes such a block's
    elements NaN too): the step is c + sum(a b S_a S_b) in float64, NaN, or +-inf (an infinite
    scale times nonzero products), on every CPU path (the carriers hand such a call to fd_step)."""
    acc = tensor_core("blackwell", a="mxfp8_e4m3")
    if _cpu.extension() is None:
        pytest.skip("no CPU extension")
    a, b = torch.ones(3, 96), torch.ones(96, 4)
    a[2, :] = 0.0  # inf * 0: NaN
    b[40:, 3] = -2.0
    sa, sb = torch.ones(3, 3), torch.ones(3, 4)
    sa[0, 1] = math.nan
    sb[1, 1] = math.inf
    sb[2, 3] = math.inf
    want = oracle_matmul(a, b, acc, sa, sb, 32)
    assert math.isnan(want[0, 0]) and want[1, 1] == math.inf and want[1, 3] == -math.inf and math.isnan(want[2, 1])
    assert want[1, 0] == 96.0
    for name, got in _paths(a, b, acc, sa, sb).items():
        assert same(got, want), f"{name}: {got} != {want}"


def test_block_scales_enter_the_alignment():
    """mxf8f6f4 aligns by the products' exponents plus their blocks' scale exponents: a block whose
    scale is 2^22 puts the step's emax at 30, and c (1.125, from the previous block) is cut to
    the 25 fractional bits below 2^30 (units of 2^5): lost; at 2^20 (units of 2^-5) it survives."""
    acc = tensor_core("blackwell", a="mxfp8_e4m3")
    a = torch.zeros(1, 64)
    b = torch.zeros(64, 1)
    a[0, 0], b[0, 0] = 1.0 + 2.0**-3, 1.0  # block 0: c = 1.125
    a[0, 32], b[32, 0] = 2.0**20, 1.0  # block 1: 2^20 (its scale 2^12, element 256)
    y = cpd.matmul(a, b, acc=acc).item()
    assert y == 2.0**20 + 1.125  # 1.125 = 9 * 2^-3 is within 25 bits of 2^20
    a[0, 32] = 2.0**30
    assert cpd.matmul(a, b, acc=acc).item() == 2.0**30  # 1.125 < 2^(30 - 25): cut to 0


def test_mxf4nvf4_chunk_sums_are_exact():
    """mxf4nvf4 sums 16 e2m1 products exactly before its 35-bit alignment: 16 x 6 x 6 = 576."""
    acc = tensor_core("blackwell", a="mxfp4")
    assert acc.algorithm == "nvidia_chunk16" and acc.frac_bits == 35 and acc.group == 64
    a = torch.full((1, 64), 6.0)
    b = torch.full((64, 1), 6.0)
    assert cpd.matmul(a, b, acc=acc).item() == 64 * 36.0


def test_block_nan_and_grad():
    acc = tensor_core("blackwell", a="mxfp8_e4m3")
    a = torch.randn(2, 64)
    b = torch.randn(64, 3)
    a[1, 40] = math.nan  # block 1 of row 1 decodes to NaN
    y = cpd.matmul(a, b, acc=acc)
    assert torch.isnan(y[1]).all() and not torch.isnan(y[0]).any()
    a = torch.randn(2, 64, requires_grad=True)
    b = torch.randn(64, 3, requires_grad=True)
    cpd.matmul(a, b, acc=acc).sum().backward()
    bq = cpd.mx.cast(b.detach(), torch_replace(acc.b_block, axis=-2))
    assert torch.allclose(a.grad, torch.ones(2, 3) @ bq.T)


def test_block_formats_from_cpd_mx():
    acc = tensor_core("blackwell", a=cpd.mx.MXFP8_E4M3, b=cpd.mx.MXFP8_E5M2)
    assert acc.block_scaled and acc.a == cpd.E4M3FN and acc.b == cpd.E5M2
    assert tensor_core("blackwell", a=cpd.mx.NVFP4).algorithm == "nvidia_chunk16"


@pytest.mark.parametrize("kwargs,err", [
    ({"arch": "cdna3", "a": "e4m3"}, "no 'e4m3'"), ({"arch": "cdna1", "a": "fp16", "out": "f16"}, "FP32"),
    ({"arch": "cdna2", "a": "fp16", "b": "bf16"}, "not one"), ({"arch": "hopper", "a": "mxfp8_e4m3"}, "Blackwell"),
    ({"arch": "blackwell", "a": "nvfp4", "b": "mxfp8_e4m3"}, "no block-scaled"),
    ({"arch": "blackwell", "a": "mxfp4", "b": "e4m3"}, "pair"),
    ({"arch": "blackwell", "a": "mxint8"}, "allowed"), ({"arch": "mi300"}, "cdna3"),
    ({"arch": "hopper", "a": "fp8"}, "cdna3"),
])
def test_amd_and_block_errors(kwargs, err):
    with pytest.raises(ValueError, match=err):
        tensor_core(**kwargs)


def test_fused_dot_new_field_errors():
    with pytest.raises(ValueError, match="algorithm"):
        FusedDot(group=4, frac_bits=0, algorithm="intel")
    with pytest.raises(ValueError, match="power of two"):
        FusedDot(group=6, frac_bits=0, algorithm="amd_pairwise")
    with pytest.raises(ValueError, match="ftz"):
        FusedDot(group=4, frac_bits=0, ftz=True)
    with pytest.raises(ValueError, match="together"):
        FusedDot(group=32, frac_bits=25, a_block=cpd.mx.MXFP8_E4M3)
    with pytest.raises(ValueError, match="needs a_block"):
        FusedDot(group=64, frac_bits=35, algorithm="nvidia_chunk16")
    with pytest.raises(ValueError, match="inside one block"):
        FusedDot(group=64, frac_bits=25, a_block=cpd.mx.MXFP8_E4M3, b_block=cpd.mx.MXFP8_E4M3)
    with pytest.raises(TypeError, match="BlockFormat"):
        FusedDot(group=32, frac_bits=25, a_block="mxfp8", b_block="mxfp8")


def test_docstring_cites_sources_and_undocumented():
    doc = tensor_core.__doc__
    assert "2511.10909" in doc and "MIOpen" in doc and "Undocumented" in doc


# ----------------------------------------------------------------------------------- exhaustive / hypothesis
def test_mxf4nvf4_e2m1_pairs_exhaustive():
    """Every pair of E2M1 values as one product of each 16-chunk of an NVFP4 step (random UE4M3
    scales and other products), every CPU path against the oracle."""
    acc = tensor_core("blackwell", a="nvfp4")
    vals = sorted(set(oracle.positive_values(cpd.E2M1)) | {0.0})
    vals = torch.tensor(vals + [-v for v in vals if v], dtype=torch.float32)
    n = len(vals)
    gen = torch.Generator().manual_seed(13)
    a = values_of(cpd.E2M1, n * 64, gen, spread=1).reshape(n, 64)
    b = values_of(cpd.E2M1, 64 * n, gen, spread=1).reshape(64, n)
    a[:, 5], b[5, :] = vals, vals  # the pair (i, j) is product 5 of the first chunk of output (i, j)
    sa = cpd.cast(torch.rand(n, 4, generator=gen) * 4 + 0.01, cpd.E4M3FN)
    sb = cpd.cast(torch.rand(4, n, generator=gen) * 4 + 0.01, cpd.E4M3FN)
    want = oracle_matmul(a, b, acc, sa, sb, 16)
    for name, got in _paths(a, b, acc, sa, sb).items():
        if name != "reference":
            assert same(got, want), name


hyp = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


def _vals(fmt, n):
    return st.lists(st.floats(-8192.0, 8192.0, allow_nan=False, width=32), min_size=n, max_size=n).map(
        lambda v: cpd.cast(torch.tensor(v, dtype=torch.float32), fmt, saturate=True).tolist())


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("cdna3", "bf16"), ("cdna3", "fp16"), ("cdna1", "bf16"), ("cdna2", "fp16"),
                        ("cdna3", "xf32")]), st.data())
def test_amd_steps_hypothesis(preset, data):
    acc = tensor_core(preset[0], a=preset[1])
    K = 2 * acc.group
    a = torch.tensor([data.draw(_vals(acc.a, K))])
    b = torch.tensor(data.draw(_vals(acc.b, K)))[:, None]
    scale = data.draw(st.sampled_from([1.0, 2.0**-20, 2.0**-120]))  # reach the subnormal range too
    a = cpd.cast(a * scale, acc.a, "toward_zero")
    want = oracle_matmul(a, b, acc)
    got = _paths(a, b, acc)
    for name, y in got.items():
        assert same(y, want), name


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-2.0**20, 2.0**20, allow_nan=False, width=32), min_size=64, max_size=64),
       st.lists(st.floats(-2.0**-20, 2.0**-20, allow_nan=False, width=32), min_size=64, max_size=64))
def test_mxfp8_steps_hypothesis(av, bv):
    acc = tensor_core("blackwell", a="mxfp8_e4m3", b="mxfp8_e5m2")
    a, b = torch.tensor([av]), torch.tensor(bv)[:, None]
    pa, sa, _ = _block_operands(a, acc.a_block, -1)
    pb, sb, _ = _block_operands(b, acc.b_block, -2)
    want = oracle_matmul(pa, pb, acc, sa, sb, 32)
    for name, y in _paths(pa, pb, acc, sa, sb).items():
        assert same(y, want), name
    assert same(cpd.matmul(a, b, acc=acc), want)


def test_fallback_without_extension_amd_and_mx(monkeypatch):
    """CPD_NO_EXTENSION=1: the pure-torch fallback (the readable steps for AMD/chunk16), same bits."""
    import warnings

    gen = torch.Generator().manual_seed(22)
    cases = [(tensor_core("cdna3", a="fp8"), 33), (tensor_core("cdna2", a="bf16"), 9),
             (tensor_core("blackwell", a="mxfp8_e4m3"), 70), (tensor_core("blackwell", a="mxfp4"), 70)]
    for acc, K in cases:
        a = torch.randn(2, K, generator=gen)
        b = torch.randn(K, 3, generator=gen)
        want = cpd.matmul(a, b, acc=acc)
        monkeypatch.setenv("CPD_NO_EXTENSION", "1")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = cpd.matmul(a, b, acc=acc)
        monkeypatch.delenv("CPD_NO_EXTENSION")
        assert same(got, want), str(acc)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch,ka", [("cdna3", "fp8"), ("cdna3", "bf16"), ("cdna2", "fp16"), ("cdna1", "bf16"),
                                     ("blackwell", "mxfp8_e4m3"), ("blackwell", "nvfp4")])
def test_gpu_matches_cpu(arch, ka):
    acc = tensor_core(arch, a=ka)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(64, 100, generator=gen) * 4
    b = torch.randn(100, 48, generator=gen)
    if not acc.block_scaled:
        a, b = values_of(acc.a, 64 * 100, gen).reshape(64, 100), values_of(acc.b, 100 * 48, gen).reshape(100, 48)
    assert same(cpd.matmul(a.cuda(), b.cuda(), acc=acc).cpu(), cpd.matmul(a, b, acc=acc))


@pytest.mark.parametrize("arch,ka", [("cdna3", "fp8"), ("cdna3", "bf16"), ("cdna2", "fp16"), ("cdna1", "bf16"),
                                     ("hopper", "e4m3"), ("volta", "fp16"), ("blackwell", "mxfp8_e4m3"),
                                     ("blackwell", "nvfp4")])
def test_cuda_kernel_on_host_shim_matches_cpu(arch, ka, monkeypatch):
    """cuda/kernels/fused_dot.cu executed on the host (cpd._shim, the same Launch the CUDA path
    builds, 3 blocks grid-striding over ragged outputs) gives the CPU extension's bits."""
    from cpd import _shim, _tensor_core_op

    acc = tensor_core(arch, a=ka)
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(2, 9, 70, generator=gen) * 4
    b = torch.randn(70, 11, generator=gen)
    if not acc.block_scaled:
        a = values_of(acc.a, a.numel(), gen).reshape(a.shape)
        b = values_of(acc.b, b.numel(), gen).reshape(b.shape)
    a[0, 1, 3] = float("inf")
    want = cpd.matmul(a, b, acc=acc)

    def on_shim(a3, b3, sa, sb, block, s_emin, p, _fields):
        y = torch.full((a3.shape[0], a3.shape[1], b3.shape[2]), float("nan"))
        _shim.launch(_tensor_core_op.launch_of(a3, b3, y, sa, sb, block, s_emin, p, blocks=3))
        return y

    monkeypatch.setattr(_tensor_core_op, "_cpu_body", on_shim)
    got = cpd.matmul(a, b, acc=acc)
    assert same(got, want)
