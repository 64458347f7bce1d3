"""The fused-dot-product accumulator (cpd.tensor_core / cpd.FusedDot) against an independent oracle.

Invariants defended:
* every path (CPU float32 carriers, float64 carriers, the generic loop on float32 bits, the
  pure-torch fallback, the readable reference) gives the oracle's bits, for every preset, with
  ragged last groups, subnormals, zeros and non-finite operands;
* the documented behaviours that tell the architectures apart (F = 13 on Hopper FP8 versus 25 on
  Blackwell, F = 23 / 24 / 25 on Volta / Ampere / Hopper FP16, E8M13 output) hold;
* properties: with F large enough that nothing is cut, L = 1 is the existing exact path rounded
  once (``cpd.matmul(mul=None)``), and any L is the exact group sum rounded once;
* the op traces (opcheck), its gradient is straight-through, bad arguments raise clear errors,
  and the CUDA kernel compiles.

The oracle below uses only fractions, math and numpy's float conversions; it follows the model's
definition (MMA-Sim, arXiv 2511.10909): products exact, aligned to the group's largest exponent
(accumulator included, zeros at -126), cut toward zero to F fractional bits, summed, the sum
rounded once (RZ to FP32 / E8M13, RNE to FP16).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import cpd
from cpd import _fused_dot_ref
from cpd.tensor_core import ARCHITECTURES, FusedDot, tensor_core

import oracle


# ----------------------------------------------------------------------------------- the oracle
def _exp(x: float, emin: int) -> int:
    return -126 if x == 0 else max(math.frexp(x)[1] - 1, emin)


def _out_round(v: Fraction, out: str) -> float:
    """The exact step value v rounded to the output (v is exactly a float64: < 2^44 units)."""
    d = float(v)
    assert Fraction(d) == v
    if out == "f16":
        r = float(np.float16(d))  # numpy's direct float64 -> binary16 rounding (nearest even)
    else:
        if abs(d) >= 2.0**128:
            return math.copysign(math.inf, d)
        x = np.float32(d)  # nearest, then one step toward zero if that went away from zero
        if abs(float(x)) > abs(d):
            x = np.nextafter(x, np.float32(0))
        r = float(x)
        if out == "e8m13":  # 13 fraction bits: clear the low 10 of float32's 23 (normals and subnormals)
            bits = int(np.array(x, dtype=np.float32).view(np.uint32)) & ~0x3FF
            r = float(np.array(bits, dtype=np.uint32).view(np.float32))
    return 0.0 if r == 0 else r


def oracle_step(avals, bvals, c: float, acc: FusedDot) -> float:
    with np.errstate(invalid="ignore"):
        raw = np.float64(c) + sum(np.float64(x) * np.float64(y) for x, y in zip(avals, bvals))
    if not np.isfinite(raw):
        return float(raw)
    c_emin = -14 if acc.out == "f16" else -126
    terms = [(Fraction(c), _exp(c, c_emin))]
    terms += [(Fraction(x) * Fraction(y), _exp(x, acc.a.emin) + _exp(y, acc.b.emin)) for x, y in zip(avals, bvals)]
    emax = max(e for _, e in terms)
    total = sum(int(t * Fraction(2) ** (acc.frac_bits - emax)) for t, _ in terms)  # int() cuts toward zero
    return _out_round(Fraction(total) * Fraction(2) ** (emax - acc.frac_bits), acc.out)


def oracle_matmul(a: torch.Tensor, b: torch.Tensor, acc: FusedDot) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    al, bl = a.double().tolist(), b.double().tolist()
    y = torch.empty(M, N)
    for i in range(M):
        for j in range(N):
            c = 0.0
            for k0 in range(0, K, acc.group):
                ks = range(k0, min(K, k0 + acc.group))
                c = oracle_step([al[i][k] for k in ks], [bl[k][j] for k in ks], c, acc)
            y[i, j] = c
    return y


def same(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit for bit, except that any NaN equals any NaN (payloads are checked separately)."""
    nan = torch.isnan(x) & torch.isnan(y)
    return bool(torch.equal(torch.isnan(x), torch.isnan(y))) and torch.equal(
        torch.where(nan, 0, x.view(torch.int32)), torch.where(nan, 0, y.view(torch.int32)))


# ----------------------------------------------------------------------------------- inputs
def values_of(fmt, n: int, gen: torch.Generator, *, spread: int = 6, specials: bool = False) -> torch.Tensor:
    """n values of fmt: normals over a range of binades, subnormals, zeros of both signs."""
    x = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-spread, spread + 1, (n,), generator=gen).float())
    pick = torch.rand(n, generator=gen)
    x = torch.where(pick < 0.05, torch.zeros(n), x)
    x = torch.where((pick >= 0.05) & (pick < 0.08), -torch.zeros(n), x)
    x = torch.where((pick >= 0.08) & (pick < 0.15), x * 2.0 ** (fmt.emin - 2), x)  # subnormal range
    x = cpd.cast(x, fmt, "toward_zero", saturate=True)
    if specials:
        idx = torch.randint(0, n, (4,), generator=gen)
        x[idx] = torch.tensor([math.inf, -math.inf, math.nan, 0.0])[: len(idx)]
    return x


def _presets():
    out = []
    for arch, fams in ARCHITECTURES.items():
        for fam, (kinds, *_rest, outs) in fams.items():
            pairs = [(k, k) for k in kinds] + ([("e4m3", "e5m2")] if fam == "f8" else [])
            for a, b in pairs:
                for o in outs:
                    out.append((arch, a, b, o))
    return out


PRESETS = _presets()


def _paths(a, b, acc):
    """Every CPU path's result for 2-D a, b (already values of the input formats)."""
    p = acc.params
    a3, b3 = a[None].contiguous(), b[None].contiguous()
    ext = torch.ops.cpd_fused_dot.matmul
    none = torch.empty(0)
    args = (none, none, 1, -127, *p, acc.a.man, acc.a.emax, acc.b.man, acc.b.emax)
    return {
        "auto": ext(a3, b3, *args, 0)[0],
        "generic": ext(a3, b3, *args, 1)[0],
        "float64": ext(a3, b3, *args, 2)[0],
        "fallback": _fused_dot_ref.matmul_torch(a3, b3, p)[0],
        "public": cpd.matmul(a, b, acc=acc),
    }


# ----------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("arch,ka,kb,out", PRESETS, ids=lambda v: str(v))
def test_presets_match_oracle(arch, ka, kb, out):
    acc = tensor_core(arch, a=ka, b=kb, out=out)
    gen = torch.Generator().manual_seed(hash((arch, ka, kb, out)) % 2**31)
    M, K, N = 3, 2 * acc.group + 3, 4  # a ragged last group
    a = values_of(acc.a, M * K, gen).reshape(M, K)
    b = values_of(acc.b, K * N, gen).reshape(K, N)
    want = oracle_matmul(a, b, acc)
    for name, got in _paths(a, b, acc).items():
        assert same(got, want), f"{name}: {got} != {want}"
    assert same(_fused_dot_ref.reference_matmul(a[None], b[None], acc.params)[0], want)


@pytest.mark.parametrize("arch,ka,out", [("hopper", "e5m2", "f32"), ("hopper", "fp16", "f16"),
                                         ("blackwell", "e5m2", "f16"), ("ampere", "bf16", "f32")])
def test_non_finite_operands(arch, ka, out):
    acc = tensor_core(arch, a=ka, out=out)
    gen = torch.Generator().manual_seed(3)
    M, K, N = 4, acc.group + 2, 5
    a = values_of(acc.a, M * K, gen, specials=True).reshape(M, K)
    b = values_of(acc.b, K * N, gen, specials=True).reshape(K, N)
    want = oracle_matmul(a, b, acc)
    assert torch.isnan(want).any() and torch.isinf(want).any()
    nan_bits = 0x7FFFE000 if out == "f16" else 0x7FFFFFFF
    for name, got in _paths(a, b, acc).items():
        assert same(got, want), name
        assert (got.view(torch.int32)[torch.isnan(got)] == nan_bits).all(), name  # canonical NaN


def test_overflow_is_infinite():
    acc = FusedDot(group=2, frac_bits=13, out="f32", a="bf16", b="bf16")
    a = torch.tensor([[2.0**127, 2.0**127]])
    b = torch.tensor([[1.5], [1.0]])
    assert cpd.matmul(a, b, acc=acc).item() == math.inf  # 2.5 * 2^127 >= 2^128, even rounding toward zero
    b = torch.tensor([[0.5], [0.5]])
    assert cpd.matmul(a, b, acc=acc).item() == 2.0**127


def test_fp8_pairs_exhaustive():
    """Every pair of finite E4M3 values as the first product of a 32-wide Hopper step (the other
    31 products fixed), on every CPU path; the oracle on a sample."""
    acc = tensor_core("hopper", a="e4m3", b="e4m3")
    vals = torch.tensor(sorted({v for v in oracle.positive_values(cpd.E4M3FN)} | {0.0}), dtype=torch.float32)
    vals = torch.cat([vals, -vals])
    n = len(vals)
    gen = torch.Generator().manual_seed(11)
    rest_a = values_of(cpd.E4M3FN, 31, gen, spread=3)
    rest_b = values_of(cpd.E4M3FN, 31, gen, spread=3)
    a = torch.cat([vals[:, None], rest_a.expand(n, 31)], dim=1)
    b = torch.cat([vals[None, :], rest_b[:, None].expand(31, n)], dim=0)
    got = _paths(a, b, acc)
    for name, y in got.items():
        assert same(y, got["generic"]), name
    idx = torch.randint(0, n, (300, 2), generator=gen)
    for i, j in idx.tolist():
        want = oracle_matmul(a[i:i + 1], b[:, j:j + 1], acc)
        assert same(got["auto"][i:i + 1, j:j + 1], want), (vals[i].item(), vals[j].item())


def test_lanes_chosen():
    ext = torch.ops.cpd_fused_dot.lanes
    hop = tensor_core("hopper", a="e4m3").params
    assert ext(*hop, 3, 8, 3, 8, 0, 1) == 3  # FP8 with F = 13: float32 carriers
    bw = tensor_core("blackwell", a="e4m3").params
    assert ext(*bw, 3, 8, 3, 8, 0, 1) == 2  # F = 25: float64 carriers
    bf = tensor_core("hopper", a="bf16").params
    assert ext(*bf, 7, 127, 7, 127, 0, 1) == 2
    mx = tensor_core("blackwell", a="mxfp8_e4m3").params
    assert ext(*mx, 3, 8, 3, 8, 1, 32) == 2  # block-scaled, groups inside blocks: float64 carriers
    assert ext(*mx, 3, 8, 3, 8, 1, 16) == 1  # a group straddling blocks: the generic loop
    assert ext(*tensor_core("cdna3", a="fp16").params, 10, 15, 10, 15, 0, 1) == 2  # CDNA3: float64 carriers
    assert ext(*tensor_core("cdna2", a="fp16").params, 10, 15, 10, 15, 0, 1) == 1  # pairwise: generic
    # float64 carriers hold sums below 2^53 only: F = 40 with L = 4096 (2^(40 + 2 + 13)) goes generic
    wide = FusedDot(group=4096, frac_bits=40).params
    assert ext(*wide, 23, 127, 23, 127, 0, 1) == 1
    assert ext(*FusedDot(group=16, frac_bits=40).params, 23, 127, 23, 127, 0, 1) == 2


# ----------------------------------------------------------------------------------- documented behaviours
def _one(acc, avals, bvals, c_first=None):
    a = torch.tensor([avals], dtype=torch.float32)
    b = torch.tensor([[v] for v in bvals], dtype=torch.float32)
    return cpd.matmul(a, b, acc=acc).item()


def test_hopper_fp8_keeps_13_fraction_bits():
    """DeepSeek-V3 §3.3.2 / MMA-Sim: Hopper FP8 MMAs keep ~14 bits; Blackwell keeps 25 fraction bits.
    1*1 + (2^-7 * 2^-7): 2^-14 lies below 13 fraction bits of 2^0."""
    a = [1.0, 2.0**-7] + [0.0] * 30
    b = [1.0, 2.0**-7] + [0.0] * 30
    assert _one(tensor_core("hopper", a="e4m3"), a, b) == 1.0
    assert _one(tensor_core("ada", a="e4m3"), a, b) == 1.0
    assert _one(tensor_core("blackwell", a="e4m3"), a, b) == 1.0 + 2.0**-14
    # 2^-13 survives on Hopper (exactly F bits below), and the E8M13 output cuts the rest
    assert _one(tensor_core("hopper", a="e4m3"), [1.0, 2.0**-6], [1.0, 2.0**-7]) == 1.0 + 2.0**-13


def test_fp16_fraction_bits_by_architecture():
    """1 + four products of 2^-25 (fp16: 2^-12 * 2^-13): F = 23 (Volta) and 24 (Ampere) cut each to
    zero; F = 25 (Hopper, Blackwell) keeps them: 1 + 2^-23. Two products of 2^-24 separate
    Volta (cut) from Ampere (kept)."""
    a4, b4 = [1.0] + [2.0**-12] * 3, [1.0] + [2.0**-13] * 3  # Volta's group is 4: three small products
    assert _one(tensor_core("volta", a="fp16"), a4, b4) == 1.0
    a8, b8 = [1.0] + [2.0**-12] * 4, [1.0] + [2.0**-13] * 4
    assert _one(tensor_core("ampere", a="fp16"), a8, b8) == 1.0
    assert _one(tensor_core("hopper", a="fp16"), a8, b8) == 1.0 + 2.0**-23
    assert _one(tensor_core("blackwell", a="fp16"), a8, b8) == 1.0 + 2.0**-23
    a2, b2 = [1.0, 2.0**-12, 2.0**-12], [1.0, 2.0**-12, 2.0**-12]
    assert _one(tensor_core("volta", a="fp16"), a2, b2) == 1.0
    assert _one(tensor_core("ampere", a="fp16"), a2, b2) == 1.0 + 2.0**-23


def test_truncation_is_toward_zero_and_output_rz():
    """A negative cut term moves toward zero (sign-magnitude), and the FP32 result is cut, not rounded."""
    acc = tensor_core("hopper", a="fp16")
    assert _one(acc, [1.0, -(2.0**-13)], [1.0, 2.0**-13]) == 1.0  # -2^-26 is cut to 0, not to -2^-25
    assert _one(acc, [1.0, 1.0], [1.0, 2.0**-23 + 2.0**-24]) == 1.0 + 2.0**-23  # RZ, not RNE


def test_split_k_chain_is_two_steps():
    """Ampere's m16n8k16 is two steps of 8: the second step aligns to the first's result."""
    acc = tensor_core("ampere", a="fp16")
    a = [2.0**-12] * 8 + [1.0] + [0.0] * 7
    b = [2.0**-12] * 8 + [1.0] + [0.0] * 7
    # first step: 8 * 2^-24 = 2^-21 exactly; second: 1 + 2^-21 (F = 24 keeps it)
    assert _one(acc, a, b) == 1.0 + 2.0**-21
    a2, b2 = [1.0] + [2.0**-12] * 7 + [0.0] * 8, [1.0] + [2.0**-13] * 7 + [0.0] * 8
    assert _one(acc, a2, b2) == 1.0  # in one step with 1, each 2^-25 is half a unit: cut to 0
    a3, b3 = [2.0**-12] * 7 + [1.0] + [0.0] * 8, [2.0**-13] * 7 + [1.0] + [0.0] * 8
    assert _one(acc, a3, b3) == 1.0  # same step


# ----------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("out,acc_fmt,mode", [("f32", cpd.FP32, "toward_zero"), ("f16", cpd.FP16, "nearest")])
def test_group_one_wide_f_is_the_exact_path(out, acc_fmt, mode):
    """L = 1 and F large enough that nothing is cut: c = round(c + a b) once per step, which is
    cpd.matmul's exact fused path (mul=None)."""
    gen = torch.Generator().manual_seed(5)
    M, K, N = 5, 24, 6
    a = cpd.cast((torch.rand(M, K, generator=gen) + 0.5) * torch.sign(torch.randn(M, K, generator=gen)), cpd.FP16)
    b = cpd.cast((torch.rand(K, N, generator=gen) + 0.5) * torch.sign(torch.randn(K, N, generator=gen)), cpd.FP16)
    acc = FusedDot(group=1, frac_bits=40, out=out, a="fp16", b="fp16")
    got = cpd.matmul(a, b, acc=acc)
    want = cpd.matmul(a, b, mul=None, acc=acc_fmt, rounding=mode)
    want = torch.where(want == 0, torch.zeros_like(want), want)  # the model's zeros are +0
    assert same(got, want)


@pytest.mark.parametrize("group", [2, 5, 16])
def test_wide_f_is_exact_group_sum_rounded_once(group):
    gen = torch.Generator().manual_seed(group)
    M, K, N = 4, 3 * group + 1, 3
    a = cpd.cast((torch.rand(M, K, generator=gen) + 0.5) * torch.sign(torch.randn(M, K, generator=gen)), cpd.E4M3FN)
    b = cpd.cast((torch.rand(K, N, generator=gen) + 0.5) * torch.sign(torch.randn(K, N, generator=gen)), cpd.E4M3FN)
    acc = FusedDot(group=group, frac_bits=40, out="f32", a="e4m3fn", b="e4m3fn")
    got = cpd.matmul(a, b, acc=acc)
    al, bl = a.double().tolist(), b.double().tolist()
    for i in range(M):
        for j in range(N):
            c = 0.0
            for k0 in range(0, K, group):
                exact = Fraction(c) + sum(Fraction(al[i][k]) * Fraction(bl[k][j]) for k in range(k0, min(K, k0 + group)))
                c = _out_round(exact, "f32")
            assert got[i, j].item() == c


# ----------------------------------------------------------------------------------- API
def test_batched_broadcast_and_grad():
    acc = tensor_core("hopper", a="e4m3")
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(2, 3, 40, generator=gen, requires_grad=True)
    b = torch.randn(40, 5, generator=gen, requires_grad=True)
    y = cpd.matmul(a, b, acc=acc)
    assert y.shape == (2, 3, 5)
    for i in range(2):
        assert same(y[i].detach(), cpd.matmul(a[i].detach(), b.detach(), acc=acc))
    y.sum().backward()
    a8, b8 = cpd.cast(a.detach(), cpd.E4M3FN), cpd.cast(b.detach(), cpd.E4M3FN)
    # straight-through: the gradients of the exact product of the rounded operands
    assert torch.allclose(b.grad, (a8.transpose(-1, -2) @ torch.ones(2, 3, 5)).sum(0))
    assert torch.allclose(a.grad, torch.ones(2, 3, 5) @ b8.T)
    assert (y.detach() - a8 @ b8).abs().max() < 0.1 * (a8.abs() @ b8.abs()).max()


def test_opcheck():
    acc = tensor_core("blackwell", a="fp16")
    p = acc.params
    a = cpd.cast(torch.randn(3, 20), cpd.FP16).requires_grad_()
    b = cpd.cast(torch.randn(20, 4), cpd.FP16).requires_grad_()
    none = torch.empty(0)
    torch.library.opcheck(torch.ops.cpd.fused_dot_matmul.default, (a, b, none, none, 1, -127, *p, 10, 15, 10, 15))


def test_inputs_rounded_first_and_not_mutated():
    acc = tensor_core("hopper", a="e4m3")
    a = torch.tensor([[0.3, 0.7]])
    b = torch.tensor([[1.0], [1.0]])
    a0 = a.clone()
    y = cpd.matmul(a, b, acc=acc)
    assert torch.equal(a, a0)
    assert y.item() == cpd.cast(a, cpd.E4M3FN).sum().item()
    big = torch.tensor([[1000.0, -1e6]])  # finite overflow saturates to +-448 (satfinite), never NaN
    assert cpd.matmul(big, torch.tensor([[1.0], [0.0]]), acc=acc).item() == 448.0
    inf = tensor_core("hopper", a="e5m2")  # e5m2 has infinities: an infinite input stays infinite
    assert cpd.matmul(torch.tensor([[float("inf"), 1e6]]), torch.tensor([[1.0], [0.0]]), acc=inf).isinf().all()
    t = tensor_core("ampere", a="tf32")
    x = torch.tensor([[1.0 + 2.0**-11 + 2.0**-20]])  # tf32 truncates: 1 + 2^-11 -> 1 (10 fraction bits)
    assert cpd.matmul(x, torch.ones(1, 1), acc=t).item() == 1.0


@pytest.mark.parametrize("kwargs,err", [
    ({"arch": "pascal"}, "arch"), ({"arch": "volta", "a": "bf16"}, "no bf16"),
    ({"arch": "hopper", "a": "e2m1"}, "no e2m1"), ({"arch": "hopper", "a": "fp16", "b": "bf16"}, "not one"),
    ({"arch": "hopper", "a": "bf16", "out": "f16"}, "offers"), ({"arch": "hopper", "a": "int8"}, "allowed"),
])
def test_tensor_core_errors(kwargs, err):
    with pytest.raises(ValueError, match=err):
        tensor_core(**kwargs)


def test_fused_dot_errors():
    with pytest.raises(ValueError, match="group"):
        FusedDot(group=0, frac_bits=13)
    with pytest.raises(ValueError, match="frac_bits"):
        FusedDot(group=4, frac_bits=41)
    with pytest.raises(TypeError, match="group"):
        FusedDot(group=4.0, frac_bits=13)
    with pytest.raises(ValueError, match="out"):
        FusedDot(group=4, frac_bits=13, out="bf16")
    with pytest.raises(ValueError, match="a_rounding"):
        FusedDot(group=4, frac_bits=13, a_rounding="up")
    acc = tensor_core("hopper", a="e4m3")
    with pytest.raises(ValueError, match="kahan"):
        cpd.matmul(torch.ones(2, 2), torch.ones(2, 2), acc=acc, kahan=True)
    with pytest.raises(ValueError, match="do not match"):
        cpd.matmul(torch.ones(2, 3), torch.ones(2, 2), acc=acc)


def test_preset_docstring_names_sources():
    doc = tensor_core.__doc__
    assert "2511.10909" in doc and "2512.07004" in doc
    assert "hopper" in str(tensor_core("hopper", a="e4m3"))


def test_cuda_kernel_compiles():
    """fused_dot.cu compiles for Hopper (through the NVRTC cache, which the spill tests of
    tests/test_cuda.py and test_fused_dot_tiled.py share: the file takes about a minute to compile;
    test_cuda.py test_kernels_compile compiles it afresh at both ends of NVRTC's range)."""
    from cpd import _cuda

    if not _cuda.available() or 90 not in _cuda.supported_archs():
        pytest.skip("cuda-bindings NVRTC with sm_90 not installed")
    assert _cuda.compile_source("fused_dot.cu", "sm_90")[:4] == b"\x7fELF"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch,ka,out", [("hopper", "e4m3", "f32"), ("blackwell", "fp16", "f16"),
                                         ("ampere", "bf16", "f32")])
def test_gpu_matches_cpu(arch, ka, out):
    acc = tensor_core(arch, a=ka, out=out)
    gen = torch.Generator().manual_seed(1)
    a = values_of(acc.a, 64 * 100, gen, specials=True).reshape(64, 100)
    b = values_of(acc.b, 100 * 48, gen, specials=True).reshape(100, 48)
    assert same(cpd.matmul(a.cuda(), b.cuda(), acc=acc).cpu(), cpd.matmul(a, b, acc=acc))


def test_public_fallback_without_extension(monkeypatch):
    """CPD_NO_EXTENSION=1: cpd.matmul(acc=FusedDot) runs the pure-torch fallback, same bits."""
    acc = tensor_core("hopper", a="e4m3")
    gen = torch.Generator().manual_seed(21)
    a = values_of(acc.a, 3 * 70, gen).reshape(3, 70)
    b = values_of(acc.b, 70 * 4, gen).reshape(70, 4)
    want = cpd.matmul(a, b, acc=acc)
    monkeypatch.setenv("CPD_NO_EXTENSION", "1")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = cpd.matmul(a, b, acc=acc)
    assert same(got, want)
