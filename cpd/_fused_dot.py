"""The fused-dot-product accumulator's configuration, :class:`FusedDot`, re-exported by
:mod:`cpd.tensor_core` (the model, the presets and the GEMM are there).

A frozen dataclass over :mod:`cpd.formats`, :mod:`cpd._block_format` and the integer codes of
:mod:`cpd._fused_dot_ref`, kept below :mod:`cpd.ops` so that :func:`cpd.matmul` recognises
``acc=FusedDot(...)`` without importing :mod:`cpd.tensor_core`, which imports :mod:`cpd.ops`
(it then calls :func:`cpd.tensor_core.tensor_core_matmul` through :mod:`cpd.registry`).
"""

from __future__ import annotations

import dataclasses

from . import _fused_dot_ref
from ._block_format import BlockFormat
from .formats import E2M1, E4M3FN, E8M0, FP32, FloatFormat

__all__ = ["FusedDot"]

_OUTS = tuple(_fused_dot_ref.OUT_CODES)


@dataclasses.dataclass(frozen=True)
class FusedDot:
    """A fused-dot-product accumulator: ``cpd.matmul(a, b, acc=FusedDot(...))``.

    Args:
        group: L, the products summed in one step (the instruction's depth, or its half where the
            instruction splits, as Ampere's ``m16n8k16``). 1..4096.
        frac_bits: F, the fractional bits kept below the group's largest exponent. 0..40: the
            widest documented configuration is 35 (Blackwell mxf4nvf4); the integer and float64
            forms hold every sum exactly up to 40 (see docs/tensor_cores.md, "The limit on F").
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
        algorithm: the step (``cuda/include/cpd/fused_dot.h``): ``"nvidia"`` (the five steps
            of :mod:`cpd.tensor_core`), ``"amd_pairwise"`` (CDNA1/2: float32 products summed
            pairwise in float32; ``group`` a power of two <= 16, F unused), ``"amd_cdna3"`` /
            ``"amd_cdna3_fp8"`` (CDNA3: the products' fused sum cut to F = 24 bits, then rounded
            down against c and rounded to nearest FP32), ``"nvidia_chunk16"`` (Blackwell mxf4nvf4: exact sums of 16
            e2m1 products aligned by their block scales). AMD algorithms have ``out="f32"``.
        ftz: ``"amd_pairwise"`` only: flush subnormal inputs, products and sums (CDNA2).
        a_block, b_block: block-scaled operands (Blackwell MX/NVFP4): :class:`cpd.mx.BlockFormat`
            whose blocks run along K (the axis is set by the GEMM); ``a``/``b`` are then their
            elements. ``"nvidia"`` takes E8M0 scales with every group inside one block
            (kind::mxf8f6f4); ``"nvidia_chunk16"`` e2m1 elements with E8M0 or E4M3 scales
            (kind::mxf4 / mxf4nvf4, NVFP4's float32 tensor scales applied to the result).
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
    algorithm: str = "nvidia"
    ftz: bool = False
    a_block: object = None
    b_block: object = None

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
        if self.algorithm not in _fused_dot_ref.ALGORITHMS:
            raise ValueError(f"FusedDot algorithm={self.algorithm!r}; allowed {list(_fused_dot_ref.ALGORITHMS)}")
        if not isinstance(self.ftz, bool):
            raise TypeError(f"FusedDot ftz must be a bool, got {type(self.ftz).__name__}")
        if self.ftz and self.algorithm != "amd_pairwise":
            raise ValueError("FusedDot ftz=True applies to algorithm='amd_pairwise' (CDNA2) only")
        if self.algorithm.startswith("amd") and self.out != "f32":
            raise ValueError(f"FusedDot algorithm={self.algorithm!r} accumulates in FP32: out must be 'f32'")
        if self.algorithm == "amd_pairwise" and (self.group > 16 or self.group & (self.group - 1)):
            raise ValueError(f"FusedDot algorithm='amd_pairwise' sums a group pairwise: group must be a power of two "
                             f"<= 16, got {self.group}")
        _check_blocks(self)
        # what each call passes the op, made once (frozen: nothing they derive from changes)
        object.__setattr__(self, "_params", _fused_dot_ref.Params(
            self.group, self.frac_bits, _fused_dot_ref.OUT_CODES[self.out], self.a.emin, self.b.emin, self.zero_exp,
            _fused_dot_ref.ALGORITHMS[self.algorithm], int(self.ftz)))
        object.__setattr__(self, "_op_fields", (self.a.man, self.a.emax, self.b.man, self.b.emax))

    @property
    def block_scaled(self) -> bool:
        """Whether the operands are block-scaled (``a_block``/``b_block``)."""
        return self.a_block is not None

    @property
    def params(self) -> _fused_dot_ref.Params:
        """The integers the numerics core takes (``FusedDotSpec``)."""
        return self._params

    @property
    def op_fields(self) -> tuple[int, int, int, int]:
        """The input formats' fields the tiled kernels take: ``(a.man, a.emax, b.man, b.emax)``."""
        return self._op_fields

    def __str__(self) -> str:
        label = f"{self.name}: " if self.name else ""
        alg = "" if self.algorithm == "nvidia" else f", {self.algorithm}{' ftz' if self.ftz else ''}"
        blocks = f", blocks {self.a_block.name} x {self.b_block.name}" if self.block_scaled else ""
        return (f"{label}FusedDot(L={self.group}, F={self.frac_bits}, out={self.out}, a={self.a.name}, "
                f"b={self.b.name}{alg}{blocks})")


def _check_blocks(acc: FusedDot) -> None:
    """Validate a block-scaled FusedDot's BlockFormats and set ``a``/``b`` to their elements."""
    blocks = (acc.a_block, acc.b_block)
    if acc.algorithm == "nvidia_chunk16" and None in blocks:
        raise ValueError("FusedDot algorithm='nvidia_chunk16' (mxf4nvf4) needs a_block and b_block")
    if blocks == (None, None):
        return
    if None in blocks:
        raise ValueError("FusedDot a_block and b_block go together (both operands are block-scaled)")
    for name, f in zip(("a_block", "b_block"), blocks):
        if not isinstance(f, BlockFormat):
            raise TypeError(f"FusedDot {name} must be a cpd.mx.BlockFormat, got {type(f).__name__}")
    fa, fb = blocks
    if acc.algorithm not in ("nvidia", "nvidia_chunk16"):
        raise ValueError(f"FusedDot block scales apply to the NVIDIA algorithms, not {acc.algorithm!r}")
    if (fa.block_size, fa.scale) != (fb.block_size, fb.scale):
        raise ValueError(f"FusedDot a_block and b_block must share block_size and scale format, got {fa} and {fb}")
    if acc.algorithm == "nvidia":
        if fa.scale != E8M0 or fa.tensor_scale or fb.tensor_scale or fa.block_size % acc.group:
            raise ValueError("FusedDot block-scaled 'nvidia' (mxf8f6f4) takes E8M0 scales without a tensor scale, "
                             f"every group of {acc.group} inside one block; got {fa} and {fb}")
    else:
        if fa.element != E2M1 or fb.element != E2M1 or acc.group % 16 or fa.block_size not in (16, 32) \
                or fa.scale not in (E8M0, E4M3FN):
            raise ValueError("FusedDot 'nvidia_chunk16' (mxf4nvf4) takes e2m1 elements in blocks of 16 or 32 with "
                             f"E8M0 or E4M3 scales, group a multiple of 16; got {fa} and {fb}")
    if acc.out != "f32":
        raise ValueError("FusedDot block-scaled instructions accumulate in FP32: out must be 'f32'")
    object.__setattr__(acc, "a", fa.element)
    object.__setattr__(acc, "b", fb.element)
