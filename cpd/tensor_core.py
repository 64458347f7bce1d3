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
out in ``cuda/include/cpd/fused_dot.h``, the one place they are implemented for the CPU and CUDA;
:mod:`cpd._fused_dot_ref` holds the pure-torch fallback and a readable reference.

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

from . import _cpu, _fused_dot_ref
from .formats import BF16, E2M1, E4M3FN, E5M2, FP16, FP32, TF32, FloatFormat
from .ops import _batch_shape, _check_matmul_operands, _sum_to, cast

__all__ = ["FusedDot", "tensor_core", "tensor_core_matmul", "ARCHITECTURES", "INPUT_KINDS"]

#: Input kinds of the presets: name -> (format, how a float32 input is brought to it). NVIDIA's
#: "e4m3" is the OCP E4M3FN; TF32 inputs are float32 with the low 13 bits cut (MMA-Sim truncates).
INPUT_KINDS = {
    "e4m3": (E4M3FN, "nearest"),
    "e5m2": (E5M2, "nearest"),
    "e2m1": (E2M1, "nearest"),
    "fp16": (FP16, "nearest"),
    "bf16": (BF16, "nearest"),
    "tf32": (TF32, "toward_zero"),
}
_OUTS = tuple(_fused_dot_ref.OUT_CODES)


@dataclasses.dataclass(frozen=True)
class FusedDot:
    """A fused-dot-product accumulator: ``cpd.matmul(a, b, acc=FusedDot(...))``.

    Args:
        group: L, the products summed in one step (the instruction's depth, or its half where the
            instruction splits, as Ampere's ``m16n8k16``). 1..4096.
        frac_bits: F, the fractional bits kept below the group's largest exponent. 0..40.
        out: how a step's sum is rounded: ``"f32"`` (toward zero to FP32), ``"e8m13"`` (toward
            zero to 13 fraction bits, FP32's exponent range: Hopper/Ada FP8 into FP32) or
            ``"f16"`` (to nearest even FP16). The GEMM's result holds values of this format.
        a, b: the input formats (a :class:`FloatFormat` or name; default FP32). Inputs are
            rounded to them first (``a_rounding``/``b_rounding``); their smallest normal exponent
            is where subnormal operands are aligned.
        zero_exp: the exponent a zero operand is aligned at (-126 on NVIDIA, per MMA-Sim).
        a_rounding, b_rounding: how inputs are brought to a/b: ``"nearest"`` or
            ``"toward_zero"`` (TF32 inputs on NVIDIA).
        name: a label (the presets name themselves ``"hopper e4m3 x e4m3 -> f32"``).
    """

    group: int
    frac_bits: int
    out: str = "f32"
    a: FloatFormat = FP32
    b: FloatFormat = FP32
    zero_exp: int = -126
    a_rounding: str = "nearest"
    b_rounding: str = "nearest"
    name: str = ""

    def __post_init__(self):
        for field, lo, hi in (("group", 1, 4096), ("frac_bits", 0, 40), ("zero_exp", -1000, -126)):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"FusedDot {field} must be an int, got {type(v).__name__}")
            if not lo <= v <= hi:
                raise ValueError(f"FusedDot {field}={v} is out of range; allowed {lo}..{hi}")
        if self.out not in _OUTS:
            raise ValueError(f"FusedDot out={self.out!r}; allowed {list(_OUTS)}")
        for field in ("a", "b"):
            fmt = FloatFormat.parse(getattr(self, field))
            if fmt.emin < -126:
                raise ValueError(f"FusedDot {field}={fmt.name} has emin {fmt.emin} below float32's -126")
            object.__setattr__(self, field, fmt)
        for field in ("a_rounding", "b_rounding"):
            if getattr(self, field) not in ("nearest", "toward_zero"):
                raise ValueError(f"FusedDot {field}={getattr(self, field)!r}; allowed 'nearest', 'toward_zero'")
        if not isinstance(self.name, str):
            raise TypeError(f"FusedDot name must be a str, got {type(self.name).__name__}")

    @property
    def params(self) -> _fused_dot_ref.Params:
        """The integers the numerics core takes (``FusedDotSpec``)."""
        return _fused_dot_ref.Params(self.group, self.frac_bits, _fused_dot_ref.OUT_CODES[self.out], self.a.emin,
                                     self.b.emin, self.zero_exp)

    def __str__(self) -> str:
        label = f"{self.name}: " if self.name else ""
        return f"{label}FusedDot(L={self.group}, F={self.frac_bits}, out={self.out}, a={self.a.name}, b={self.b.name})"


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


def tensor_core(arch: str, a: str = "e4m3", b: str | None = None, out: str = "f32") -> FusedDot:
    """The fused-dot model of one architecture's matrix instruction for these input kinds.

    Args:
        arch: ``"volta"``, ``"turing"``, ``"ampere"``, ``"ada"``, ``"hopper"`` or ``"blackwell"``.
        a, b: input kinds: ``"e4m3"``, ``"e5m2"``, ``"e2m1"`` (Blackwell), ``"fp16"``, ``"bf16"``,
            ``"tf32"`` (b defaults to a; FP8 kinds mix freely).
        out: the accumulator/output type, ``"f32"`` or ``"f16"``.

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
    even FP16. AMD CDNA matrix cores follow other algorithms (pairwise FP32 FMAs on CDNA1/2,
    round-down alignment on CDNA3; MMA-Sim ``simulator/amd.py``) and are not modelled yet.
    """
    if not isinstance(arch, str) or arch.lower() not in ARCHITECTURES:
        raise ValueError(f"tensor_core arch={arch!r}; allowed {list(ARCHITECTURES)}")
    arch = arch.lower()
    b = a if b is None else b
    for name, kind in (("a", a), ("b", b)):
        if kind not in INPUT_KINDS:
            raise ValueError(f"tensor_core {name}={kind!r}; allowed {list(INPUT_KINDS)}")
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


# ----------------------------------------------------------------------------------- the op
def _run(a, b, group, frac, out, a_emin, b_emin, zero_exp, a_man, a_emax, b_man, b_emax, body):
    """Broadcast the batch dims, make both operands contiguous (B, M, K) / (B, K, N), run ``body``."""
    batch = _batch_shape(a.shape, b.shape)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    B = math.prod(batch)
    a3 = a.expand(*batch, M, K).reshape(B, M, K).contiguous()
    b3 = b.expand(*batch, K, N).reshape(B, K, N).contiguous()
    p = _fused_dot_ref.Params(group, frac, out, a_emin, b_emin, zero_exp)
    return body(a3, b3, p, (a_man, a_emax, b_man, b_emax)).reshape(*batch, M, N)


@torch.library.custom_op("cpd::fused_dot_matmul", mutates_args=())
def _fused_dot_op(a: torch.Tensor, b: torch.Tensor, group: int, frac: int, out: int, a_emin: int, b_emin: int,
                  zero_exp: int, a_man: int, a_emax: int, b_man: int, b_emax: int) -> torch.Tensor:
    """a (..., M, K) @ b (..., K, N) under the fused-dot model; see :func:`tensor_core_matmul`.

    Devices other than CPU and CUDA run the pure-torch path (the CPU and CUDA kernels are
    registered per dispatch key below, as :mod:`cpd.ops` does for its ops)."""
    return _run(a, b, group, frac, out, a_emin, b_emin, zero_exp, a_man, a_emax, b_man, b_emax,
                lambda a3, b3, p, _: _fused_dot_ref.matmul_torch(a3, b3, p))


def _cpu_body(a3, b3, p, fields):
    if _cpu.extension() is None:  # loading the extension registers torch.ops.cpd_fused_dot
        return _fused_dot_ref.matmul_torch(a3, b3, p)
    return torch.ops.cpd_fused_dot.matmul(a3, b3, p.group, p.frac, p.out, p.a_emin, p.b_emin, p.zero_exp, *fields, 0)


def _cuda_body(a3, b3, p, fields):
    from . import _cuda, _impl

    if isinstance(_cuda.engine(a3.device), _impl.Fallback):  # no NVRTC / driver for this device
        return _fused_dot_ref.matmul_torch(a3, b3, p)
    return _cuda_matmul(a3, b3, p)


@_fused_dot_op.register_kernel("cpu")
def _(a, b, *args):
    return _run(a, b, *args, _cpu_body)


@_fused_dot_op.register_kernel("cuda")
def _(a, b, *args):
    return _run(a, b, *args, _cuda_body)


@_fused_dot_op.register_fake
def _(a, b, group, frac, out, a_emin, b_emin, zero_exp, a_man, a_emax, b_man, b_emax):
    return a.new_empty((*_batch_shape(a.shape, b.shape), a.shape[-2], b.shape[-1]))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])


def _backward(ctx, grad):
    """Straight-through: the gradients of the exact float32 product (as :func:`cpd.matmul`)."""
    a, b = ctx.saved_tensors
    ga = _sum_to(torch.matmul(grad, b.transpose(-1, -2)), a.shape) if ctx.needs_input_grad[0] else None
    gb = _sum_to(torch.matmul(a.transpose(-1, -2), grad), b.shape) if ctx.needs_input_grad[1] else None
    return (ga, gb) + (None,) * 10


_fused_dot_op.register_autograd(_backward, setup_context=_setup)


def _cuda_matmul(a3: torch.Tensor, b3: torch.Tensor, p: _fused_dot_ref.Params) -> torch.Tensor:
    """Launch cuda/kernels/fused_dot.cu through cpd._cuda's NVRTC loader (one thread per output).

    The launch is built as a :class:`cpd._kernels.Launch`, like every kernel of :mod:`cpd.ops`.
    """
    import ctypes

    from . import _cuda

    B, M, K = a3.shape
    N = b3.shape[2]
    y = torch.empty((B, M, N), dtype=torch.float32, device=a3.device)
    if y.numel() == 0:
        return y
    i, ll, ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
    args = [(ptr, a3.data_ptr()), (ptr, b3.data_ptr()), (ptr, y.data_ptr()), (ll, B), (ll, M), (ll, K), (ll, N),
            (i, p.group), (i, p.frac), (i, p.out), (i, p.a_emin), (i, p.b_emin), (i, p.zero_exp)]
    from . import _kernels

    sms = torch.cuda.get_device_properties(a3.device).multi_processor_count
    blocks = max(1, min((y.numel() + 255) // 256, sms * 32))
    _cuda.launch(_kernels.Launch("fused_dot.cu", "cpd_fused_dot_matmul", (blocks, 1, 1), (256, 1, 1), tuple(args)),
                 a3.device)
    return y


def _to_input(x: torch.Tensor, fmt: FloatFormat, rounding: str) -> torch.Tensor:
    """x rounded to an input format: finite overflows saturate (FP8 recipes convert with
    satfinite); infinities stay infinite where the format has them; NaN stays NaN."""
    if fmt == FP32:
        return x.to(torch.float32)
    y = cast(x, fmt, rounding, saturate=True)
    return torch.where(torch.isinf(x), x.to(torch.float32), y) if fmt.has_inf else y


def _ensure_extension() -> None:
    _cpu.extension()  # loading the library registers torch.ops.cpd_fused_dot


def tensor_core_matmul(a: torch.Tensor, b: torch.Tensor, acc: FusedDot, **unused) -> torch.Tensor:
    """``a @ b`` as the chain of ``acc``'s fused-dot steps (what ``cpd.matmul(a, b, acc=acc)`` runs).

    ``a`` (..., M, K) and ``b`` (..., K, N), float32 (float16/bfloat16 upcast exactly), batch dims
    broadcast. Inputs are first rounded to ``acc.a`` / ``acc.b``, saturating (a finite overflow
    gives ±max, as FP8 recipes convert with ``satfinite``; infinities stay infinite in formats
    that have them, NaN stays NaN; values already in the formats are unchanged). For each output, ``c = +0``, then for each k-group of ``acc.group`` in k
    order ``c = round_out(c + sum a_k b_k)`` by the model's five steps (``fused_dot.h``). The
    result is float32 holding values of ``acc.out``. Autograd is straight-through (the
    gradients of the exact product, computed by ``torch.matmul``).

    ``unused``: the other arguments of :func:`cpd.matmul`, which must keep their defaults
    (a fused dot has no separate product format, Kahan, block or rounding mode).
    """
    if not isinstance(acc, FusedDot):
        raise TypeError(f"acc must be a FusedDot (see cpd.tensor_core), got {type(acc).__name__}")
    defaults = {"mul": None, "fma": False, "kahan": False, "block": None, "rounding": "nearest", "saturate": False,
                "sr_bits": None, "generator": None}
    for key, value in unused.items():
        if key not in defaults:
            raise TypeError(f"tensor_core_matmul got an unexpected argument {key!r}")
        if value is not defaults[key] and value != defaults[key]:
            raise ValueError(f"{key}={value!r} does not apply to a FusedDot accumulator (its rounding is the "
                             f"model's); leave {key} at {defaults[key]!r}")
    _check_matmul_operands(a, b)
    a = _to_input(a, acc.a, acc.a_rounding)
    b = _to_input(b, acc.b, acc.b_rounding)
    if a.device.type == "cpu":
        _ensure_extension()
    p = acc.params
    return torch.ops.cpd.fused_dot_matmul(a, b, p.group, p.frac, p.out, p.a_emin, p.b_emin, p.zero_exp, acc.a.man,
                                          acc.a.emax, acc.b.man, acc.b.emax)
