"""The block-scaled format descriptor, :class:`BlockFormat`, re-exported by :mod:`cpd.mx`.

A frozen dataclass over :mod:`cpd.formats` alone, kept below :mod:`cpd.ops` so that the fused-dot
accumulator (:class:`cpd.tensor_core.FusedDot`, whose block-scaled operands are BlockFormats) can
sit below :mod:`cpd.ops` too; the rules it describes, the presets and the ops are in :mod:`cpd.mx`.
"""

from __future__ import annotations

import dataclasses

from .formats import E8M0, FloatFormat

__all__ = ["BlockFormat", "SCALE_RULES", "MXINT8_ELEMENT", "FORMATS", "RULES", "op_spec", "from_spec", "fused"]

#: The shared-scale rules (see :mod:`cpd.mx`'s docstring).
SCALE_RULES = ("floor", "ceil", "even", "amax")
#: Every BlockFormat made, by its op spec (:func:`op_spec`: the custom ops take the format as one int[]).
FORMATS: dict = {}
#: cpd/mx.py SCALE_RULES -> the core's RULE_* (cuda/include/cpd/block.h).
RULES = {"floor": 0, "ceil": 1, "even": 2, "amax": 3}
#: MXINT8's element values k / 64, |k| <= 127, as a float format (codes are two's complement).
MXINT8_ELEMENT = FloatFormat(1, 6, bias=1, specials="finite")


@dataclasses.dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format: ``element`` codes sharing one ``scale`` per ``block_size`` values.

    Args:
        element: the element format (a :class:`~cpd.FloatFormat` or a name; ``"int8"`` is
            MXINT8's element).
        block_size: elements per block (>= 1; MX uses 32, NVFP4 16).
        scale: the scale format (default E8M0, ``cpd.E8M0``).
        axis: the axis the blocks run along (default the last).
        scale_rule: ``"floor"`` (OCP MX), ``"ceil"``, ``"even"`` or ``"amax"`` (see
            :mod:`cpd.mx`); the power-of-two rules need a scale format with ``man == 0``.
        tensor_scale: a float32 per-tensor scale on top of the block scales (NVFP4); needs
            ``scale_rule="amax"``.
        name: a label (``"mxfp8_e4m3"``); not part of the format's identity.
    """

    element: FloatFormat
    block_size: int = 32
    scale: FloatFormat = E8M0
    axis: int = -1
    scale_rule: str = "floor"
    tensor_scale: bool = False
    name: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        elem = MXINT8_ELEMENT if isinstance(self.element, str) and self.element.lower() == "int8" else self.element
        object.__setattr__(self, "element", FloatFormat.parse(elem))
        object.__setattr__(self, "scale", FloatFormat.parse(self.scale))
        for name in ("block_size", "axis"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"BlockFormat {name} must be an int, got {type(v).__name__}")
        if self.block_size < 1:
            raise ValueError(f"BlockFormat block_size={self.block_size} must be >= 1")
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(f"BlockFormat scale_rule={self.scale_rule!r} is unknown; allowed: {SCALE_RULES}")
        if self.scale_rule != "amax" and self.scale.man != 0:
            raise ValueError(f"BlockFormat scale_rule={self.scale_rule!r} gives powers of two; scale={self.scale.name} "
                             "is not a power-of-two format (man=0); use scale_rule='amax'")
        if not isinstance(self.tensor_scale, bool):
            raise TypeError(f"BlockFormat tensor_scale must be a bool, got {type(self.tensor_scale).__name__}")
        if self.tensor_scale and self.scale_rule != "amax":
            raise ValueError("BlockFormat tensor_scale=True (two-level scaling) needs scale_rule='amax'")
        if self.element.bits > 8 or self.scale.bits > 8:
            raise ValueError(f"BlockFormat element and scale must have at most 8 bits; got {self.element.name} "
                             f"({self.element.bits}) and {self.scale.name} ({self.scale.bits})")
        if not self.name:
            object.__setattr__(self, "name", f"{self.element.name}x{self.block_size}/{self.scale.name}")
        object.__setattr__(self, "_op_spec", op_spec(self))
        FORMATS.setdefault(self._op_spec, self)

    @property
    def is_int(self) -> bool:
        """Whether the elements are MXINT8's integers (two's-complement codes)."""
        return self.element == MXINT8_ELEMENT

    @property
    def bits_per_element(self) -> float:
        """Storage per element, the scales included (e.g. 4.25 for MXFP4)."""
        return self.element.bits + self.scale.bits / self.block_size + (32 / 1e9 if self.tensor_scale else 0.0)

    def __str__(self) -> str:
        two = ", float32 tensor scale" if self.tensor_scale else ""
        return (f"{self.name}: {self.element.name} elements ({self.element.bits} bits, max {self.element.max:g}), "
                f"one {self.scale.name} scale per {self.block_size} along axis {self.axis} "
                f"(rule {self.scale_rule!r}{two}); {self.bits_per_element:.4g} bits per element")


def fused(fmt: BlockFormat) -> bool:
    """Whether the compiled kernels take ``fmt``: its power-of-two scales 2^e have -127 <= e <= 127
    (so 2^-e is a float32 too); the other (exotic) scale formats take the pure-torch path."""
    return -127 <= fmt.scale.emin and fmt.scale.emax <= 127


def op_spec(fmt: BlockFormat) -> tuple:
    """The format as cpd.mx's custom ops take it (cuda/cpu/mx_ops.cpp reads it): 16 ints, the
    element's and the scale's ``[exp, man, bias, specials, subnormals]``, the rule (:data:`RULES`),
    MXINT8's integer elements, the block size, the axis, two-level scaling, :func:`fused`."""
    def five(f):
        return f.exp, f.man, f.bias, f.core_specials, int(f.subnormals)

    return (*five(fmt.element), *five(fmt.scale), RULES[fmt.scale_rule], int(fmt.is_int), fmt.block_size, fmt.axis,
            int(fmt.tensor_scale), int(fused(fmt)))


def from_spec(spec) -> BlockFormat:
    """The BlockFormat of an op spec (:func:`op_spec`): the one made with it, or a new one."""
    key = tuple(int(v) for v in spec)
    fmt = FORMATS.get(key)
    if fmt is None:
        if len(key) != 16:
            raise ValueError(f"a block format's op spec is 16 ints (BlockFormat._op_spec), got {len(key)}")
        fmt = BlockFormat(FloatFormat.from_core(*key[0:5]), key[12], FloatFormat.from_core(*key[5:10]), key[13],
                          SCALE_RULES[key[10]], bool(key[14]))
    return fmt
