"""What a matrix unit computes: the fused-dot-product accumulator model and per-architecture presets.

cpd's :func:`cpd.matmul` rounds every product and every addition once, in order: the model of a
scalar low-precision unit. Matrix units (NVIDIA tensor cores, AMD matrix cores) compute *fused*
dot products instead. One instruction step is

    d = round_out(c + a_1 b_1 + ... + a_L b_L)

with the products exact, every term aligned to the largest exponent of the group (the
accumulator ``c`` included) and truncated to ``F`` fractional bits below it, the truncated terms
summed exactly and the sum rounded once (round-toward-zero into FP32 or into E8M13 -- 13 fraction
bits -- or round-to-nearest-even into FP16). A GEMM of depth K is the chain of such steps over
k-groups of L, in k order, each step's result the next one's ``c``. The five steps are written
out in ``cuda/include/cpd/fused_dot.h``, the one place they are implemented for the CPU and CUDA,
with the other documented algorithms: AMD's CDNA1-3 matrix cores and Blackwell's block-scaled
MX/NVFP4 instructions (:func:`tensor_core`); :mod:`cpd._fused_dot_ref` holds the pure-torch
fallback and a readable reference, :mod:`cpd._tensor_core_op` the custom op, :mod:`cpd._fused_dot`
:class:`FusedDot` (below :mod:`cpd.ops`, whose :func:`cpd.matmul` reaches :func:`tensor_core_matmul`
through :mod:`cpd.registry`).

Sources of the model and of every preset's parameters:

* P. Xie, Y. Wang, F. Yang, M. Yang, "MMA-Sim: Bit-Accurate Reference Model of Tensor Cores and
  Matrix Cores", arXiv 2511.10909 (2025), and its simulator (github.com/microsoft/MMA-Sim,
  ``mmasim/simulator``), checked bit for bit against the hardware of each architecture: group
  sizes, the internal split of Ampere/Ada ``mma.sync``, F = 23 (Volta), 24 (Turing, Ampere, Ada),
  25 (Hopper, Blackwell), 13 with E8M13 output for FP8 on Ada and Hopper, zero operands aligned
  at exponent -126, RZ/RNE output.
* F. A. Khattak, M. Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004 (2025):
  the same features (alignment, truncation, normalization, carry bits) for V100/A100/H100/B200.
* M. Fasi, N. J. Higham, M. Mikaitis, S. Pranesh, "Numerical behavior of NVIDIA tensor cores",
  PeerJ Computer Science 7:e330 (2021): truncation and round-toward-zero on Volta/Turing/Ampere.
* DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437, §3.3.2: the ~14-bit
  accumulation of Hopper FP8 GEMMs, and why they promote partial sums to FP32 every 128 elements.

Usage::

    acc = cpd.tensor_core("hopper", a="e4m3", b="e4m3", out="f32")
    y = cpd.matmul(x, w, acc=acc)          # float32 tensors; inputs are rounded to e4m3 first
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import _tensor_core_op, mx, registry
from ._fused_dot import FusedDot
from .formats import BF16, E2M1, E2M3, E3M2, E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0, FP16, FP32, TF32, FloatFormat
from .ops import _check_matmul_operands, _sum_to, cast, decode

__all__ = ["FusedDot", "tensor_core", "tensor_core_matmul", "ARCHITECTURES", "AMD_ARCHITECTURES", "INPUT_KINDS",
           "BLOCK_KINDS"]

#: Input kinds of the presets: name -> (format, how a float32 input is brought to it). NVIDIA's
#: "e4m3" is the OCP E4M3FN; TF32 inputs are float32 with the low 13 bits cut (MMA-Sim truncates).
INPUT_KINDS = {
    "e4m3": (E4M3FN, "nearest"),
    "e5m2": (E5M2, "nearest"),
    "e2m1": (E2M1, "nearest"),
    "fp16": (FP16, "nearest"),
    "bf16": (BF16, "nearest"),
    "tf32": (TF32, "toward_zero"),
    "xf32": (TF32, "toward_zero"),  # AMD CDNA3's name for the same truncation
    "fp8": (E4M3FNUZ, "nearest"),  # AMD CDNA3 (MI300): the FNUZ variants
    "bf8": (E5M2FNUZ, "nearest"),
}
# ----------------------------------------------------------------------------------- presets
# arch -> family -> (allowed input kinds, instruction, instruction depth k, group L, F, F for f16 out,
#                    {out requested: out rounding})
# All from MMA-Sim's simulator tables (see the module docstring); "f16" out is offered where the
# instruction has an f16 accumulator.
_F8 = ("e4m3", "e5m2")
ARCHITECTURES = {
    "volta": {"f16": (("fp16",), "mma.sync m8n8k4", 4, 4, 23, {"f32": "f32", "f16": "f16"})},
    "turing": {"f16": (("fp16",), "mma.sync m16n8k8", 8, 8, 24, {"f32": "f32", "f16": "f16"})},
    "ampere": {
        "f16": (("fp16",), "mma.sync m16n8k16 (two steps of 8)", 16, 8, 24, {"f32": "f32", "f16": "f16"}),
        "bf16": (("bf16",), "mma.sync m16n8k16 (two steps of 8)", 16, 8, 24, {"f32": "f32"}),
        "tf32": (("tf32",), "mma.sync m16n8k8 (two steps of 4)", 8, 4, 24, {"f32": "f32"}),
    },
    "ada": {
        "f16": (("fp16",), "mma.sync m16n8k16 (two steps of 8)", 16, 8, 24, {"f32": "f32", "f16": "f16"}),
        "bf16": (("bf16",), "mma.sync m16n8k16 (two steps of 8)", 16, 8, 24, {"f32": "f32"}),
        "tf32": (("tf32",), "mma.sync m16n8k8 (two steps of 4)", 8, 4, 24, {"f32": "f32"}),
        "f8": (_F8, "mma.sync m16n8k32 (two steps of 16)", 32, 16, 13, {"f32": "e8m13", "f16": "f16"}),
    },
    "hopper": {
        "f16": (("fp16",), "wgmma m64nNk16", 16, 16, 25, {"f32": "f32", "f16": "f16"}),
        "bf16": (("bf16",), "wgmma m64nNk16", 16, 16, 25, {"f32": "f32"}),
        "tf32": (("tf32",), "wgmma m64nNk8", 8, 8, 25, {"f32": "f32"}),
        "f8": (_F8, "wgmma m64nNk32", 32, 32, 13, {"f32": "e8m13", "f16": "f16"}),
    },
    "blackwell": {
        "f16": (("fp16",), "tcgen05.mma kind::f16 k16", 16, 16, 25, {"f32": "f32", "f16": "f16"}),
        "bf16": (("bf16",), "tcgen05.mma kind::f16 k16", 16, 16, 25, {"f32": "f32"}),
        "tf32": (("tf32",), "tcgen05.mma kind::tf32 k8", 8, 8, 25, {"f32": "f32"}),
        "f8": (_F8 + ("e2m1",), "tcgen05.mma kind::f8f6f4 k32", 32, 32, 25, {"f32": "f32", "f16": "f16"}),
    },
}
_FAMILY = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32", "e4m3": "f8", "e5m2": "f8", "e2m1": "f8"}

# AMD matrix cores: arch -> input kind -> (instruction, group L, F, algorithm, ftz). MMA-Sim's
# simulator (mmasim/simulator/amd.py, mmasim/isa/amd.py); see tensor_core's docstring.
AMD_ARCHITECTURES = {
    "cdna1": {"fp16": ("v_mfma_f32_32x32x8f16", 4, 0, "amd_pairwise", False),
              "bf16": ("v_mfma_f32_32x32x4bf16", 2, 0, "amd_pairwise", False)},
    "cdna2": {"fp16": ("v_mfma_f32_32x32x8f16", 4, 0, "amd_pairwise", True),
              "bf16": ("v_mfma_f32_32x32x8bf16_1k", 4, 0, "amd_pairwise", True)},
    "cdna3": {"fp16": ("v_mfma_f32_32x32x8_f16", 8, 24, "amd_cdna3", False),
              "bf16": ("v_mfma_f32_32x32x8_bf16", 8, 24, "amd_cdna3", False),
              "xf32": ("v_mfma_f32_16x16x8_xf32", 4, 24, "amd_cdna3", False),
              "fp8": ("v_mfma_f32_32x32x16_fp8_fp8 (bf8 mixes)", 16, 24, "amd_cdna3_fp8", False),
              "bf8": ("v_mfma_f32_32x32x16_bf8_bf8 (fp8 mixes)", 16, 24, "amd_cdna3_fp8", False)},
}

#: Blackwell block-scaled operand kinds: name -> cpd.mx preset name.
BLOCK_KINDS = {"mxfp8_e4m3": "mxfp8_e4m3", "mxfp8_e5m2": "mxfp8_e5m2", "mxfp6_e3m2": "mxfp6_e3m2",
               "mxfp6_e2m3": "mxfp6_e2m3", "mxfp4": "mxfp4", "nvfp4": "nvfp4"}


def tensor_core(arch: str, a="e4m3", b=None, out: str = "f32") -> FusedDot:
    """The fused-dot model of one architecture's matrix instruction for these input kinds.

    Args:
        arch: ``"volta"``, ``"turing"``, ``"ampere"``, ``"ada"``, ``"hopper"``, ``"blackwell"``
            (NVIDIA) or ``"cdna1"`` (MI100), ``"cdna2"`` (MI200), ``"cdna3"`` (MI300) (AMD).
        a, b: input kinds: ``"e4m3"``, ``"e5m2"``, ``"e2m1"`` (Blackwell), ``"fp16"``, ``"bf16"``,
            ``"tf32"``; AMD CDNA3 also ``"xf32"``, ``"fp8"`` (E4M3FNUZ), ``"bf8"`` (E5M2FNUZ);
            Blackwell's block-scaled kinds ``"mxfp8_e4m3"``, ``"mxfp8_e5m2"``, ``"mxfp6_e3m2"``,
            ``"mxfp6_e2m3"``, ``"mxfp4"``, ``"nvfp4"`` or a :class:`cpd.mx.BlockFormat` (b defaults
            to a; FP8 kinds mix freely, and so do the MX kinds).
        out: the accumulator/output type, ``"f32"`` or ``"f16"`` (NVIDIA, where offered).

    Parameters (MMA-Sim, arXiv 2511.10909, simulator ``mmasim/simulator/nv_ptx.py`` and the ISA
    tables; corroborated by Khattak & Mikaitis, arXiv 2512.07004, and Fasi et al. 2021):

    ==========  ====================  ==============================  =====  ==  ============
    arch        inputs                instruction                     L      F   f32 out
    ==========  ====================  ==============================  =====  ==  ============
    volta       fp16                  mma.sync m8n8k4                 4      23  RZ FP32
    turing      fp16                  mma.sync m16n8k8                8      24  RZ FP32
    ampere      fp16, bf16 / tf32     m16n8k16 / m16n8k8, split 2x    8 / 4  24  RZ FP32
    ada         as ampere; FP8        m16n8k32, split 2x              16     13  RZ E8M13
    hopper      fp16, bf16 / tf32     wgmma k16 / k8                  16 / 8 25  RZ FP32
    hopper      FP8                   wgmma k32                       32     13  RZ E8M13
    blackwell   fp16, bf16 / tf32     tcgen05.mma k16 / k8            16 / 8 25  RZ FP32
    blackwell   FP8, FP4 (e2m1)       tcgen05.mma kind::f8f6f4 k32    32     25  RZ FP32
    ==========  ====================  ==============================  =====  ==  ============

    ``out="f16"`` (FP16 accumulators, where the instruction has them) rounds each step to nearest
    even FP16.

    **Blackwell block-scaled MMA** (``tcgen05.mma`` / sm_120 ``mma`` with ``.block_scale``;
    MMA-Sim ``nv_fused_dot_add`` with scales and ``nv_fused_dot_add_with_block_scale``): the
    operands are quantized with :mod:`cpd.mx` along K (``a``'s rows, ``b``'s columns), then

    ===================  =========================  ===  ==  ==========================================
    kinds                instruction                L    F   step
    ===================  =========================  ===  ==  ==========================================
    MX fp8/fp6/fp4 mix   kind::mxf8f6f4 k32         32   25  products' exponents + both E8M0 scales'
    mxfp4 x mxfp4        kind::mxf4 k64 (block32)   64   35  exact 16-product chunk sums x scales,
    nvfp4 x nvfp4        kind::mxf4nvf4 k64         64   35  aligned by the scales' exponents alone
    ===================  =========================  ===  ==  ==========================================

    all with RZ FP32 output. NVFP4's float32 tensor scales are not part of the instruction: they
    multiply the result in float32 (the GEMM epilogue's alpha, as cuBLAS/CUTLASS apply them), an
    assumption of this model. The FP6 kinds (e3m2, e2m3) are assumed to follow the FP8 path:
    MMA-Sim's simulator lists them as unsupported (not measured).

    **AMD matrix cores** (MMA-Sim, arXiv 2511.10909, ``mmasim/simulator/amd.py``; the paper
    validates two AMD architectures against hardware; MI200's flushing is also AMD's MIOpen
    documentation, "MI200 matrix fused multiply-add (MFMA) behavior specifics": "MFMA_F16,
    MFMA_BF16 and MFMA_BF16_1K flush subnormal input/output data to zero"):

    =====  ========  =====================================  ==  ==  ==================================
    arch   inputs    instruction                            L   F   step
    =====  ========  =====================================  ==  ==  ==================================
    cdna1  fp16      v_mfma_f32_32x32x8f16                  4   -   FP32 products, pairwise FP32 sums
    cdna1  bf16      v_mfma_f32_32x32x4bf16                 2   -   (RNE), then c + sum (RNE)
    cdna2  fp16      v_mfma_f32_32x32x8f16                  4   -   as cdna1, subnormals flushed
    cdna2  bf16      v_mfma_f32_32x32x8bf16_1k              4   -   (inputs, products, sums)
    cdna3  fp16/bf16 v_mfma_f32_32x32x8_{f16,bf16}          8   24  fused sum cut to 24 bits, rounded
    cdna3  xf32      v_mfma_f32_16x16x8_xf32                4   24  down against c (31 / 24 bits),
    cdna3  fp8/bf8   v_mfma_f32_32x32x16_{fp8,bf8}_*        16  24  then RNE FP32; FP8: even/odd halves
    =====  ========  =====================================  ==  ==  ==================================

    Undocumented, hence not modelled: the sign and payload of AMD's NaN results (cpd returns
    0x7fc00000; MMA-Sim leaves it as a TODO), the sign of an all-zero CDNA2 result where one
    instruction spans several groups (the model re-flushes the accumulator every group), CDNA1
    on hardware (the paper's abstract counts two AMD architectures; CDNA1 is its simulator's
    model), and AMD's FP32 ``v_mfma_f32_*f32`` (an FMA chain: ``cpd.matmul(a, b, acc=cpd.FP32,
    fma=True)``). CDNA3's FP8 inputs are the FNUZ formats (MI300); CDNA4 (MI350, OCP FP8/MX) is
    not in the literature used here.
    """
    if not isinstance(arch, str) or arch.lower() not in {**ARCHITECTURES, **AMD_ARCHITECTURES}:
        raise ValueError(f"tensor_core arch={arch!r}; allowed {list(ARCHITECTURES) + list(AMD_ARCHITECTURES)}")
    arch = arch.lower()
    b = a if b is None else b
    if arch in AMD_ARCHITECTURES:
        return _amd_preset(arch, a, b, out)
    if _is_block_kind(a) or _is_block_kind(b):
        return _block_preset(arch, a, b, out)
    for name, kind in (("a", a), ("b", b)):
        if kind not in _FAMILY:
            raise ValueError(f"tensor_core {name}={kind!r}; allowed for NVIDIA {list(_FAMILY)} or the block-scaled "
                             f"{list(BLOCK_KINDS)} (AMD's xf32/fp8/bf8 go with arch='cdna3')")
    fam_a, fam_b = _FAMILY[a], _FAMILY[b]
    if fam_a != fam_b or (fam_a != "f8" and a != b):
        raise ValueError(f"tensor_core: a={a!r} and b={b!r} are not one instruction's inputs (FP8 kinds mix; "
                         "16/19-bit kinds must match)")
    families = ARCHITECTURES[arch]
    if fam_a not in families or a not in families[fam_a][0] or b not in families[fam_a][0]:
        offered = sorted({k for f in families.values() for k in f[0]})
        raise ValueError(f"tensor_core: {arch} has no {a} x {b} instruction; its input kinds: {offered}")
    kinds, instr, _k, group, frac, outs = families[fam_a]
    if out not in outs:
        raise ValueError(f"tensor_core: {arch} {a} x {b} offers out={list(outs)}, got out={out!r}")
    (fa, ra), (fb, rb) = INPUT_KINDS[a], INPUT_KINDS[b]
    return FusedDot(group=group, frac_bits=frac, out=outs[out], a=fa, b=fb, a_rounding=ra, b_rounding=rb,
                    name=f"{arch} {a} x {b} -> {out} ({instr})")


def _amd_preset(arch: str, a, b, out: str) -> FusedDot:
    kinds = AMD_ARCHITECTURES[arch]
    for name, kind in (("a", a), ("b", b)):
        if kind not in kinds:
            raise ValueError(f"tensor_core: {arch} has no {kind!r} input; its input kinds: {list(kinds)} ({name})")
    if a != b and {a, b} != {"fp8", "bf8"}:
        raise ValueError(f"tensor_core: a={a!r} and b={b!r} are not one {arch} instruction's inputs (fp8/bf8 mix; "
                         "the others must match)")
    if out != "f32":
        raise ValueError(f"tensor_core: {arch} MFMA accumulates in FP32; offers out=['f32'], got out={out!r}")
    instr, group, frac, algorithm, ftz = kinds[a]
    (fa, ra), (fb, rb) = INPUT_KINDS[a], INPUT_KINDS[b]
    return FusedDot(group=group, frac_bits=frac, out="f32", a=fa, b=fb, a_rounding=ra, b_rounding=rb,
                    algorithm=algorithm, ftz=ftz, name=f"{arch} {a} x {b} -> f32 ({instr})")


def _is_block_kind(kind) -> bool:
    return isinstance(kind, mx.BlockFormat) or (isinstance(kind, str) and kind in BLOCK_KINDS)


def _block_preset(arch: str, a, b, out: str) -> FusedDot:
    if arch != "blackwell":
        raise ValueError(f"tensor_core: block-scaled kinds ({a!r}, {b!r}) are Blackwell's; {arch} has none")
    fmts = []
    for name, kind in (("a", a), ("b", b)):
        if isinstance(kind, str):
            if kind not in BLOCK_KINDS:
                raise ValueError(f"tensor_core {name}={kind!r}: block-scaled operands pair with block-scaled "
                                 f"operands; allowed {list(BLOCK_KINDS)}")
            kind = mx.PRESETS[BLOCK_KINDS[kind]]
        elif not isinstance(kind, mx.BlockFormat):
            raise TypeError(f"tensor_core {name} must be a kind name or a cpd.mx.BlockFormat, got {type(kind).__name__}")
        fmts.append(kind)
    fa, fb = fmts
    if out != "f32":
        raise ValueError(f"tensor_core: Blackwell's block-scaled MMA offers out=['f32'], got out={out!r}")
    label = f"blackwell {fa.name} x {fb.name} -> f32"
    e2m1 = fa.element == E2M1 and fb.element == E2M1
    f8f6f4 = {E4M3FN, E5M2, E3M2, E2M3, E2M1}
    if fa.scale == E8M0 and fb.scale == E8M0 and fa.block_size == fb.block_size == 32 and not (
            fa.tensor_scale or fb.tensor_scale) and fa.element in f8f6f4 and fb.element in f8f6f4 and not e2m1:
        return FusedDot(group=32, frac_bits=25, a_block=fa, b_block=fb, name=f"{label} (kind::mxf8f6f4 k32)")
    if e2m1 and (fa.block_size, fa.scale) == (fb.block_size, fb.scale) and (
            (fa.scale == E8M0 and fa.block_size in (16, 32)) or (fa.scale == E4M3FN and fa.block_size == 16)):
        kind = "mxf4nvf4" if fa.scale == E4M3FN else "mxf4"
        return FusedDot(group=64, frac_bits=35, algorithm="nvidia_chunk16", a_block=fa, b_block=fb,
                        name=f"{label} (kind::{kind} k64)")
    raise ValueError(f"tensor_core: Blackwell has no block-scaled instruction for {fa} x {fb}: kind::mxf8f6f4 takes "
                     "MX fp8/fp6/fp4 elements with E8M0 scales per 32; kind::mxf4nvf4 e2m1 with E8M0 per 32/16 or "
                     "E4M3 per 16 on both operands")


# ----------------------------------------------------------------------------------- the GEMM
def _to_input(x: torch.Tensor, fmt: FloatFormat, rounding: str) -> torch.Tensor:
    """x rounded to an input format: finite overflows saturate (FP8 recipes convert with
    satfinite); infinities stay infinite where the format has them; NaN stays NaN."""
    if fmt == FP32:
        return x.to(torch.float32)
    y = cast(x, fmt, rounding, saturate=True)
    return torch.where(torch.isinf(x), x.to(torch.float32), y) if fmt.has_inf else y


def _block_operand(x: torch.Tensor, fmt, k_axis: int, dequantized: bool = False):
    """x quantized along K with cpd.mx: (elements (..., K', ...), scales, tensor scale or None),
    plus, with ``dequantized``, x's block-format values (``cpd.mx.cast(x)``: P fl(S T)).

    The elements keep x's layout with K zero-padded to whole blocks; the scales are (..., M, nb)
    for a (k_axis=-1) and (..., nb, N) for b (k_axis=-2). A NaN scale makes its block's elements NaN."""
    f = dataclasses.replace(fmt, axis=k_axis)
    enc = mx.encode(x, f, pack=False)  # block axis moved last
    p = decode(enc.codes, f.element)
    s = decode(enc.scales, f.scale)
    p = torch.where(torch.isnan(s).repeat_interleave(f.block_size, dim=-1), math.nan, p)
    q = None
    if dequantized:  # cpd.mx's decode rule: P * fl(S * T), the padding cut off
        d = s if enc.tensor_scale is None else s * enc.tensor_scale
        q = (p * d.repeat_interleave(f.block_size, dim=-1))[..., :x.shape[k_axis]]
    if k_axis == -2:
        p, s = p.transpose(-1, -2), s.transpose(-1, -2)
        q = None if q is None else q.transpose(-1, -2)
    out = (p.contiguous(), s.contiguous(), enc.tensor_scale)
    return out + (q,) if dequantized else out


class _BlockScaledMatmul(torch.autograd.Function):
    """Block-scaled GEMM; straight-through gradients w.r.t. the dequantized operands."""

    @staticmethod
    def forward(ctx, a, b, acc):
        pa, sa, ta, aq = _block_operand(a, acc.a_block, -1, dequantized=True)
        pb, sb, tb, bq = _block_operand(b, acc.b_block, -2, dequantized=True)
        s_emin = acc.a_block.scale.emin
        fields = acc.op_fields
        y = _tensor_core_op.fused_dot_matmul(pa, pb, acc.params, fields, sa, sb, acc.a_block.block_size, s_emin)
        if ta is not None or tb is not None:  # NVFP4's tensor scales: the epilogue's alpha, in float32
            one = torch.ones((), dtype=torch.float32, device=y.device)
            y = y * ((one if ta is None else ta) * (one if tb is None else tb))
        ctx.save_for_backward(aq, bq)
        return y

    @staticmethod
    def backward(ctx, grad):
        aq, bq = ctx.saved_tensors
        ga = _sum_to(torch.matmul(grad, bq.transpose(-1, -2)), aq.shape) if ctx.needs_input_grad[0] else None
        gb = _sum_to(torch.matmul(aq.transpose(-1, -2), grad), bq.shape) if ctx.needs_input_grad[1] else None
        return ga, gb, None


def tensor_core_matmul(a: torch.Tensor, b: torch.Tensor, acc: FusedDot, **unused) -> torch.Tensor:
    """``a @ b`` as the chain of ``acc``'s fused-dot steps (what ``cpd.matmul(a, b, acc=acc)`` runs).

    ``a`` (..., M, K) and ``b`` (..., K, N), float32 (float16/bfloat16 upcast exactly), batch dims
    broadcast. Inputs are first rounded to ``acc.a`` / ``acc.b``, saturating (a finite overflow
    gives ±max, as FP8 recipes convert with ``satfinite``; infinities stay infinite in formats
    that have them, NaN stays NaN; values already in the formats are unchanged); block-scaled
    operands are quantized with :func:`cpd.mx.encode` along K instead (K zero-padded to whole
    blocks). For each output, ``c = +0``, then for each k-group of ``acc.group`` in k order
    ``c = step(c, group)`` by ``acc.algorithm`` (``fused_dot.h``; a short last group is
    zero-padded). The result is float32 holding values of ``acc.out``. Autograd is
    straight-through (the gradients of the exact product of the rounded operands).

    ``unused``: the other arguments of :func:`cpd.matmul`, which must keep their defaults
    (a fused dot has no separate product format, Kahan, block or rounding mode).
    """
    if not isinstance(acc, FusedDot):
        raise TypeError(f"acc must be a FusedDot (see cpd.tensor_core), got {type(acc).__name__}")
    for key, value in unused.items():
        if key not in _MATMUL_DEFAULTS:
            raise TypeError(f"tensor_core_matmul got an unexpected argument {key!r}")
        if value is not _MATMUL_DEFAULTS[key] and value != _MATMUL_DEFAULTS[key]:
            raise ValueError(f"{key}={value!r} does not apply to a FusedDot accumulator (its rounding is the "
                             f"model's); leave {key} at {_MATMUL_DEFAULTS[key]!r}")
    _check_matmul_operands(a, b)
    if acc.block_scaled:
        return _BlockScaledMatmul.apply(a.to(torch.float32), b.to(torch.float32), acc)
    a = _to_input(a, acc.a, acc.a_rounding)
    b = _to_input(b, acc.b, acc.b_rounding)
    return _tensor_core_op.fused_dot_matmul(a, b, acc.params, acc.op_fields)


# cpd.matmul's other arguments, which a FusedDot accumulator takes at these values only
_MATMUL_DEFAULTS = {"mul": None, "fma": False, "kahan": False, "block": None, "rounding": "nearest",
                    "saturate": False, "sr_bits": None, "generator": None}


# cpd.matmul(acc=FusedDot) calls upward through the registry (docs/design.md §1).
registry.register(registry.FUSED_DOT_MATMUL, tensor_core_matmul)
