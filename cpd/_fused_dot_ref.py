"""The fused-dot-product GEMM (``cpd.tensor_core``) in pure torch and in readable Python.

Two implementations of the model of ``cuda/include/cpd/fused_dot.h`` (read its header comment for
the five steps), kept apart from the compiled ones:

* :func:`matmul_torch` -- the fallback used when the CPU extension is not built: float64 tensors,
  one k-group at a time, vectorized over the outputs. Products of float32 values, scalings by
  powers of two, truncations and sums of the truncated integers (< 2**53) are exact in float64.
* :func:`reference_matmul` -- the readable reference: one output at a time, Python integers and
  :class:`fractions.Fraction`, each step of the model written out.

Both take ``(B, M, K)`` and ``(B, K, N)`` float32 tensors whose values are already values of the
input formats (``cpd.tensor_core`` rounds them first) and a :class:`Params` tuple; block-scaled
operands (Blackwell MX/NVFP4) also take their scales ``sa`` (B, M, nb) and ``sb`` (B, nb, N), one
per ``block`` elements along K, as float32 values of a scale format whose exponent floor is
``s_emin``. The algorithms other than NVIDIA's (``Params.algo``: the AMD matrix cores and
Blackwell's mxf4nvf4 chunks, see ``fused_dot.h``) have only the readable form here: the pure-torch
fallback runs it (slowly) when the CPU extension is not built.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import torch

__all__ = ["Params", "matmul_torch", "reference_matmul", "OUT_CODES", "ALGORITHMS"]

#: Output rounding codes of the numerics core (FD_OUT_*).
OUT_CODES = {"f32": 0, "e8m13": 1, "f16": 2}
#: Step algorithms of the numerics core (FD_NV, FD_AMD_*, FD_NV_CHUNK16).
ALGORITHMS = {"nvidia": 0, "amd_pairwise": 1, "amd_cdna3": 2, "amd_cdna3_fp8": 3, "nvidia_chunk16": 4}
_CANONICAL_NAN = {0: 0x7FFFFFFF, 1: 0x7FFFFFFF, 2: 0x7FFFE000}  # float32 bits (f16: 0x7fff widened)
_AMD_NAN = 0x7FC00000


class Params(NamedTuple):
    """The integers of one fused-dot configuration (``FusedDotSpec`` of the numerics core)."""

    group: int  # L
    frac: int  # F
    out: int  # OUT_CODES value
    a_emin: int
    b_emin: int
    zero_exp: int
    algo: int = 0  # ALGORITHMS value
    ftz: int = 0  # amd_pairwise: flush subnormals (CDNA2)

    @property
    def c_emin(self) -> int:
        return -14 if self.out == 2 else -126


# ----------------------------------------------------------------------------------- fallback
def _exponents(x: torch.Tensor, emin: int, zero_exp: int) -> torch.Tensor:
    """e(x) of step 1 for float32 values (int64): max(floor(log2|x|), emin); zero_exp for zeros."""
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    e = torch.clamp((bits >> 23) - 127, min=emin)
    return torch.where(bits == 0, torch.full_like(e, zero_exp), e)


def _round_out(v: torch.Tensor, out: int) -> torch.Tensor:
    """Step 5 on exact float64 values: RZ to float32 / E8M13, or RNE to binary16; zeros are +0."""
    _, e = torch.frexp(v)
    E = (e - 1).to(torch.int64)  # floor(log2|v|) for v != 0
    if out == 2:
        q = torch.ldexp(torch.ones_like(v), torch.clamp(E, min=-14) - 10)
        r = torch.round(v / q) * q  # half to even
        r = torch.where(r.abs() > 65504.0, torch.copysign(torch.full_like(r, math.inf), v), r)
    else:
        man = 13 if out == 1 else 23
        q = torch.ldexp(torch.ones_like(v), torch.clamp(E, min=-126) - man)
        r = torch.trunc(v / q) * q
        r = torch.where(r.abs() >= 2.0**128, torch.copysign(torch.full_like(r, math.inf), v), r)
    return torch.where(r == 0, torch.zeros_like(r), r)


def matmul_torch(a: torch.Tensor, b: torch.Tensor, p: Params, sa=None, sb=None, block: int = 1,
                 s_emin: int = -127) -> torch.Tensor:
    """The chain of fused-dot steps over k-groups of ``p.group``, vectorized over the outputs.

    NVIDIA's algorithm (with E8M0 block scales where every group lies in one block); the other
    algorithms, and groups that straddle blocks, run :func:`reference_matmul` (slow)."""
    B, M, K = a.shape
    N = b.shape[2]
    scaled = sa is not None and sa.numel() > 0
    if p.algo != 0 or (scaled and block % p.group):
        return reference_matmul(a, b, p, sa, sb, block, s_emin).to(a.device)
    ea = _exponents(a, p.a_emin, p.zero_exp)
    eb = _exponents(b, p.b_emin, p.zero_exp)
    ad, bd = a.double(), b.double()
    if scaled:  # a block's scale exponents join its products' exponents and values (mxf8f6f4)
        xa = _exponents(sa, s_emin, s_emin).repeat_interleave(block, dim=2)[:, :, :K]
        xb = _exponents(sb, s_emin, s_emin).repeat_interleave(block, dim=1)[:, :K, :]
        ea, eb = ea + xa, eb + xb
        ad, bd = torch.ldexp(ad, xa.double()), torch.ldexp(bd, xb.double())
        # a scale that is not finite (NaN, +-inf) makes its products a b S_a S_b: NaN or +-inf (fd_special)
        sa_k = sa.double().repeat_interleave(block, dim=2)[:, :, :K]
        sb_k = sb.double().repeat_interleave(block, dim=1)[:, :K, :]
        ad = torch.where(torch.isfinite(sa_k), ad, ad * sa_k)
        bd = torch.where(torch.isfinite(sb_k), bd, bd * sb_k)
    c = torch.zeros((B, M, N), dtype=torch.float64, device=a.device)
    for k0 in range(0, K, p.group):
        k1 = min(K, k0 + p.group)
        em = _exponents(c.float(), p.c_emin, p.zero_exp)
        em = torch.maximum(em, (ea[:, :, k0:k1, None] + eb[:, None, k0:k1, :]).amax(dim=2))
        scale = torch.ldexp(torch.ones_like(c), p.frac - em)
        prod = ad[:, :, k0:k1, None] * bd[:, None, k0:k1, :]  # exact
        s = torch.trunc(c * scale) + torch.trunc(prod * scale[:, :, None, :]).sum(dim=2)  # exact integers
        raw = c + prod.sum(dim=2)  # tells NaN and +-inf apart; finite sums never overflow float64
        v = s * torch.ldexp(torch.ones_like(c), em - p.frac)
        r = _round_out(v, p.out)
        special = torch.where(torch.isnan(raw), torch.full_like(raw, math.nan), torch.copysign(torch.full_like(raw, math.inf), raw))
        c = torch.where(torch.isfinite(raw), r, special)
    y = c.float()
    nan_bits = torch.tensor(_CANONICAL_NAN[p.out], dtype=torch.int32, device=y.device)
    return torch.where(torch.isnan(y), nan_bits.view(torch.float32), y)


# ----------------------------------------------------------------------------------- reference
def _e(x: float, emin: int, zero_exp: int) -> int:
    """Step 1: the exponent a term is aligned by."""
    if x == 0:
        return zero_exp
    return max(math.frexp(x)[1] - 1, emin)


def _cut(t: Fraction, emax: int, frac: int) -> int:
    """Step 3: t cut to ``frac`` fractional bits below 2**emax, toward zero, as an integer."""
    scaled = t * Fraction(2) ** (frac - emax)
    return math.trunc(scaled)


def _round_out_exact(v: Fraction, out: int) -> float:
    """Step 5 on the exact value of a step."""
    if v == 0:
        return 0.0
    E = math.floor(math.log2(abs(v)))
    while Fraction(2) ** E > abs(v):  # log2 of a Fraction may be off by one near powers of two
        E -= 1
    while Fraction(2) ** (E + 1) <= abs(v):
        E += 1
    if out == 2:
        q = Fraction(2) ** (max(E, -14) - 10)
        n = v / q
        r = round(n) * q  # Python's round of a Fraction: half to even
        if abs(r) > 65504:
            return math.copysign(math.inf, v)
    else:
        man = 13 if out == 1 else 23
        q = Fraction(2) ** (max(E, -126) - man)
        r = math.trunc(v / q) * q
        if abs(r) >= Fraction(2) ** 128:
            return math.copysign(math.inf, v)
    return float(r) if r != 0 else 0.0


def reference_step(avals: list, bvals: list, c: float, p: Params, xs: list | None = None) -> float:
    """One instruction step ``round_out(c + sum a_k b_k)`` of the model, written out. ``xs``: per
    product, the exponent its block scales add (E8M0 scales: value and alignment), or None."""
    xs = xs or [0] * len(avals)
    raw = c + sum(float(x) * float(y) * 2.0**s for x, y, s in zip(avals, bvals, xs))  # Python floats are float64
    if math.isnan(raw) or math.isinf(raw):
        return raw
    terms = [(Fraction(c), _e(c, p.c_emin, p.zero_exp))]  # (exact value, exponent) of every term
    for x, y, sx in zip(avals, bvals, xs):
        terms.append((Fraction(x) * Fraction(y) * Fraction(2) ** sx,
                      _e(x, p.a_emin, p.zero_exp) + _e(y, p.b_emin, p.zero_exp) + sx))
    emax = max(e for _, e in terms)  # step 2
    S = sum(_cut(t, emax, p.frac) for t, _ in terms)  # steps 3 and 4
    return _round_out_exact(Fraction(S) * Fraction(2) ** (emax - p.frac), p.out)  # step 5


def chunk16_step(avals: list, bvals: list, c: float, p: Params, sas: list, sbs: list, s_emin: int) -> float:
    """Blackwell mxf4nvf4: each chunk of 16 products summed exactly; its term is that sum times the
    scales' significands, aligned by the scales' exponents alone; then steps 3-5 (F = 35, RZ FP32)."""
    raw = c + sum(float(x) * float(y) * sx * sy for x, y, sx, sy in zip(avals, bvals, sas, sbs))
    if math.isnan(raw) or math.isinf(raw):
        return raw
    terms = [(Fraction(c), _e(c, p.c_emin, p.zero_exp))]
    for k in range(0, len(avals), 16):
        chunk = sum(Fraction(x) * Fraction(y) for x, y in zip(avals[k:k + 16], bvals[k:k + 16]))
        ea, eb = _e(sas[k], s_emin, s_emin), _e(sbs[k], s_emin, s_emin)
        sig = Fraction(sas[k]) * Fraction(sbs[k]) / Fraction(2) ** (ea + eb)
        terms.append((chunk * sig * Fraction(2) ** (ea + eb), ea + eb))
    emax = max(e for _, e in terms)
    S = sum(_cut(t, emax, p.frac) for t, _ in terms)
    return _round_out_exact(Fraction(S) * Fraction(2) ** (emax - p.frac), p.out)


def _f32(v) -> float:
    """A float64 (or exact Fraction) rounded to the nearest-even float32, as a Python float."""
    return float(np.float32(float(v))) if not isinstance(v, Fraction) else _rne32(v)


def _rne32(v: Fraction) -> float:
    """An exact value rounded to nearest even float32 (subnormals; overflow to inf); zero is +0."""
    if v == 0:
        return 0.0
    E = math.floor(math.log2(abs(v)))
    while Fraction(2) ** E > abs(v):
        E -= 1
    while Fraction(2) ** (E + 1) <= abs(v):
        E += 1
    q = Fraction(2) ** (max(E, -126) - 23)
    r = round(v / q) * q  # half to even
    if abs(r) >= Fraction(2) ** 128:
        return math.copysign(math.inf, v)
    return float(r)


def amd_pairwise_step(avals: list, bvals: list, c: float, p: Params) -> float:
    """CDNA1/2: float32 products (an fma with +0), pairwise float32 sums of the group (zero-padded to
    L), then c + that sum; CDNA2 (ftz) flushes subnormal inputs to +0 and subnormal products/sums to
    zeros of their sign."""
    tiny_a, tiny_b = 2.0**p.a_emin, 2.0**p.b_emin

    def flush(v):
        return v * 0.0 if p.ftz and abs(v) < 2.0**-126 else v

    prods = []
    for k in range(p.group):
        x, y = (avals[k], bvals[k]) if k < len(avals) else (0.0, 0.0)
        if p.ftz:
            x, y = (0.0 if abs(x) < tiny_a else x), (0.0 if abs(y) < tiny_b else y)
        exact = float(x) * float(y)  # exact in float64 (products of <= 24-bit significands)
        prods.append(flush(_f32(exact) + 0.0 if exact == 0 else _f32(exact)))

    def tree(v):
        if len(v) == 1:
            return v[0]
        h = len(v) // 2
        return flush(float(np.float32(tree(v[:h])) + np.float32(tree(v[h:]))))

    cf = 0.0 if p.ftz and abs(c) < 2.0**-126 else c
    r = flush(float(np.float32(cf) + np.float32(tree(prods))))
    return math.nan if math.isnan(r) else r


def amd_cdna3_step(avals: list, bvals: list, c: float, p: Params) -> float:
    """CDNA3 (fp16/bf16/xf32; ``algo`` 3: fp8): the products aligned to their own largest exponent
    and cut to 24 fractional bits (fp8: even and odd halves apart, then each half rounded down to
    24 bits below the larger); with m = max(e, e(c)) the sum rounded down to 31 and c to 24
    fractional bits below 2^m (fp8: c dropped below 2^(m-25)); the total rounded to nearest FP32."""
    raw = c + sum(float(x) * float(y) for x, y in zip(avals, bvals))
    if math.isnan(raw) or math.isinf(raw):
        return raw
    prods = [(Fraction(x) * Fraction(y), _e(x, p.a_emin, p.zero_exp) + _e(y, p.b_emin, p.zero_exp))
             for x, y in zip(avals, bvals)]
    big = [t for t, _ in prods if abs(t) >= Fraction(2) ** 128]
    if big:
        signs = {t > 0 for t in big}
        return math.nan if len(signs) == 2 else math.copysign(math.inf, big[0])

    def fused(ts):  # (sum of terms cut to 24 bits below their largest exponent, that exponent)
        e = max([x for _, x in ts] + [2 * p.zero_exp])
        return sum(_cut(t, e, 24) for t, _ in ts) * Fraction(2) ** (e - 24), e

    fp8 = p.algo == ALGORITHMS["amd_cdna3_fp8"]
    if fp8:
        (s0, e0), (s1, e1) = fused(prods[0::2]), fused(prods[1::2])
        e = max(e0, e1)
        S = sum(math.floor(t * Fraction(2) ** (24 - e)) for t in (s0, s1)) * Fraction(2) ** (e - 24)
    else:
        S, e = fused(prods)
    ec = _e(c, -126, p.zero_exp)
    m = max(e, ec)
    total = math.floor(S * Fraction(2) ** (31 - m)) * Fraction(2) ** (m - 31)
    if not (fp8 and ec < m - 25):
        total += math.floor(Fraction(c) * Fraction(2) ** (24 - m)) * Fraction(2) ** (m - 24)
    return _rne32(total)


def reference_matmul(a: torch.Tensor, b: torch.Tensor, p: Params, sa=None, sb=None, block: int = 1,
                     s_emin: int = -127) -> torch.Tensor:
    """The chain of steps over k-groups, one output at a time (slow: tests only)."""
    B, M, K = a.shape
    N = b.shape[2]
    y = torch.empty((B, M, N), dtype=torch.float32)
    al, bl = a.double().tolist(), b.double().tolist()
    scaled = sa is not None and sa.numel() > 0
    sal, sbl = (sa.double().tolist(), sb.double().tolist()) if scaled else (None, None)
    for bi in range(B):
        for i in range(M):
            for j in range(N):
                c = 0.0
                for k0 in range(0, K, p.group):
                    ks = range(k0, min(K, k0 + p.group))
                    av, bv = [al[bi][i][k] for k in ks], [bl[bi][k][j] for k in ks]
                    if p.algo == ALGORITHMS["amd_pairwise"]:
                        c = amd_pairwise_step(av, bv, c, p)
                    elif p.algo in (ALGORITHMS["amd_cdna3"], ALGORITHMS["amd_cdna3_fp8"]):
                        c = amd_cdna3_step(av, bv, c, p)
                    elif scaled:
                        sas = [sal[bi][i][k // block] for k in ks]
                        sbs = [sbl[bi][k // block][j] for k in ks]
                        if p.algo == ALGORITHMS["nvidia_chunk16"]:
                            c = chunk16_step(av, bv, c, p, sas, sbs, s_emin)
                        elif not all(map(math.isfinite, sas + sbs)):  # fd_special: NaN or +-inf
                            c = c + sum(x * z * u * v for x, z, u, v in zip(av, bv, sas, sbs))
                        else:
                            c = reference_step(av, bv, c, p, [_e(x, s_emin, s_emin) + _e(z, s_emin, s_emin)
                                                              for x, z in zip(sas, sbs)])
                    else:
                        c = reference_step(av, bv, c, p)
                y[bi, i, j] = c
    nan = _AMD_NAN if p.algo in (1, 2, 3) else _CANONICAL_NAN[p.out]
    nan_bits = torch.tensor(nan, dtype=torch.int32)
    return torch.where(torch.isnan(y), nan_bits.view(torch.float32), y)
