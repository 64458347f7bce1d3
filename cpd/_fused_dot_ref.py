"""The fused-dot-product GEMM (``cpd.tensor_core``) in pure torch and in readable Python.

Two implementations of the model of ``cuda/include/cpd/fused_dot.h`` (read its header comment for
the five steps), kept apart from the compiled ones:

* :func:`matmul_torch` -- the fallback used when the CPU extension is not built: float64 tensors,
  one k-group at a time, vectorized over the outputs. Products of float32 values, scalings by
  powers of two, truncations and sums of the truncated integers (< 2**53) are exact in float64.
* :func:`reference_matmul` -- the readable reference: one output at a time, Python integers and
  :class:`fractions.Fraction`, each step of the model written out.

Both take ``(B, M, K)`` and ``(B, K, N)`` float32 tensors whose values are already values of the
input formats (``cpd.tensor_core`` rounds them first) and a :class:`Params` tuple.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import torch

__all__ = ["Params", "matmul_torch", "reference_matmul", "OUT_CODES"]

#: Output rounding codes of the numerics core (FD_OUT_*).
OUT_CODES = {"f32": 0, "e8m13": 1, "f16": 2}
_CANONICAL_NAN = {0: 0x7FFFFFFF, 1: 0x7FFFFFFF, 2: 0x7FFFE000}  # float32 bits (f16: 0x7fff widened)


class Params(NamedTuple):
    """The integers of one fused-dot configuration (``FusedDotSpec`` of the numerics core)."""

    group: int  # L
    frac: int  # F
    out: int  # OUT_CODES value
    a_emin: int
    b_emin: int
    zero_exp: int

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


def matmul_torch(a: torch.Tensor, b: torch.Tensor, p: Params) -> torch.Tensor:
    """The chain of fused-dot steps over k-groups of ``p.group``, vectorized over the outputs."""
    B, M, K = a.shape
    N = b.shape[2]
    ea = _exponents(a, p.a_emin, p.zero_exp)
    eb = _exponents(b, p.b_emin, p.zero_exp)
    ad, bd = a.double(), b.double()
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


def reference_step(avals: list, bvals: list, c: float, p: Params) -> float:
    """One instruction step ``round_out(c + sum a_k b_k)`` of the model, written out."""
    raw = c + sum(float(x) * float(y) for x, y in zip(avals, bvals))  # Python floats are float64
    if math.isnan(raw) or math.isinf(raw):
        return raw
    terms = [(Fraction(c), _e(c, p.c_emin, p.zero_exp))]  # (exact value, exponent) of every term
    for x, y in zip(avals, bvals):
        terms.append((Fraction(x) * Fraction(y), _e(x, p.a_emin, p.zero_exp) + _e(y, p.b_emin, p.zero_exp)))
    emax = max(e for _, e in terms)  # step 2
    S = sum(_cut(t, emax, p.frac) for t, _ in terms)  # steps 3 and 4
    return _round_out_exact(Fraction(S) * Fraction(2) ** (emax - p.frac), p.out)  # step 5


def reference_matmul(a: torch.Tensor, b: torch.Tensor, p: Params) -> torch.Tensor:
    """The chain of :func:`reference_step` over k-groups, one output at a time (slow: tests only)."""
    B, M, K = a.shape
    N = b.shape[2]
    y = torch.empty((B, M, N), dtype=torch.float32)
    al, bl = a.double().tolist(), b.double().tolist()
    for bi in range(B):
        for i in range(M):
            for j in range(N):
                c = 0.0
                for k0 in range(0, K, p.group):
                    ks = range(k0, min(K, k0 + p.group))
                    c = reference_step([al[bi][i][k] for k in ks], [bl[bi][k][j] for k in ks], c, p)
                y[bi, i, j] = c
    nan_bits = torch.tensor(_CANONICAL_NAN[p.out], dtype=torch.int32)
    return torch.where(torch.isnan(y), nan_bits.view(torch.float32), y)
