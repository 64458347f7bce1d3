"""Block-scaled formats: OCP Microscaling (MX) v1.0 and NVIDIA's NVFP4, on cpd's exact casts.

A block format stores a tensor as blocks of ``block_size`` consecutive elements along one axis;
each block shares one scale ``S`` (a value of the ``scale`` format) and each element is a code of
the ``element`` format, so an element stands for ``P * S`` (NVFP4: ``P * S * T`` with a float32
per-tensor scale ``T``).

The shared-scale rule (OCP MX v1.0, §6.3, "Conversion from vector of scalar float to MX"):

1. ``amax = max |V_i|`` over the block. A NaN or an infinity in the block makes the scale NaN
   (E8M0 code 0xFF), and every element of the block decodes to NaN.
2. ``scale_rule="floor"`` (the spec's rule): ``S = 2^(floor(log2 amax) - emax_elem)`` with
   ``emax_elem`` the exponent of the element format's largest value; ``"ceil"``: the smallest
   power of two with ``amax / S <= max_elem`` (no element saturates); ``"even"``: ``amax`` first
   rounded to the element's precision (ties to even), then the floor rule (the largest value
   cannot round up past ``max_elem``'s binade); ``"amax"``: ``S = amax / max_elem`` (float32
   division, divided by ``T`` for two-level formats) rounded to the scale format to nearest
   (NVFP4's E4M3 block scales). Every rule clamps ``S`` to the scale format's positive range;
   an all-zero block gets the smallest positive scale.
3. ``P_i = V_i / S`` rounded to the element format in the requested rounding mode and
   *saturated* to ``±max_elem``. With a power-of-two scale ``V_i * 2^-e`` is computed exactly and
   rounded once (``cpd.mul``); with any other scale the float32 quotient ``fl(V_i / fl(S * T))``
   is rounded (as torchao and TransformerEngine do for NVFP4).
4. NVFP4's tensor scale ``T = fl(amax_tensor / (max_scale * max_elem))`` (1 for an all-zero or
   non-finite tensor).

Decoding gives ``P_i * S`` (exact for power-of-two scales) or ``fl(P_i * fl(S * T))``.
A ragged last block is padded with zeros (which never change its amax); any axis may carry the
blocks. MXINT8's element is the 8-bit two's-complement integer ``k`` standing for ``k / 64``;
cpd represents its values as the sign-magnitude format ``FloatFormat(1, 6, bias=1,
specials="finite")`` (every ``k / 64`` with ``|k| <= 127``, so ``-2`` is not used, as in
microxcaling) and encodes it as two's complement.

References: OCP Microscaling Formats (MX) Specification v1.0 (2023); Rouhani et al.,
"Microscaling Data Formats for Deep Learning", 2023; NVIDIA, "NVFP4" (Blackwell), 2025.
See docs/mx.md.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .formats import E2M1, E2M3, E3M2, E4M3FN, E5M2, E8M0, FloatFormat
from .ops import cast as _cast, decode as _decode_codes, encode as _encode_codes, mul as _mul
from .rounding import Rounding

__all__ = ["BlockFormat", "SCALE_RULES", "MXINT8_ELEMENT", "MXFP8_E4M3", "MXFP8_E5M2", "MXFP6_E3M2", "MXFP6_E2M3",
           "MXFP4", "MXINT8", "NVFP4", "PRESETS", "Encoded", "cast", "encode", "decode", "scales", "pack", "unpack"]

#: The shared-scale rules (see the module docstring).
SCALE_RULES = ("floor", "ceil", "even", "amax")
#: Every BlockFormat made, by its op key (the custom op takes the format as one string).
_FORMATS: dict = {}
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
        key = repr((self.element, self.block_size, self.scale, self.axis, self.scale_rule, self.tensor_scale))
        object.__setattr__(self, "_op_key", key)
        _FORMATS.setdefault(key, self)

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


MXFP8_E4M3 = BlockFormat(E4M3FN, name="mxfp8_e4m3")
MXFP8_E5M2 = BlockFormat(E5M2, name="mxfp8_e5m2")
MXFP6_E3M2 = BlockFormat(E3M2, name="mxfp6_e3m2")
MXFP6_E2M3 = BlockFormat(E2M3, name="mxfp6_e2m3")
MXFP4 = BlockFormat(E2M1, name="mxfp4")
MXINT8 = BlockFormat(MXINT8_ELEMENT, name="mxint8")
NVFP4 = BlockFormat(E2M1, block_size=16, scale=E4M3FN, scale_rule="amax", tensor_scale=True, name="nvfp4")
PRESETS = {f.name: f for f in (MXFP8_E4M3, MXFP8_E5M2, MXFP6_E3M2, MXFP6_E2M3, MXFP4, MXINT8, NVFP4)}


def _fmt(fmt) -> BlockFormat:
    if isinstance(fmt, BlockFormat):
        return fmt
    if isinstance(fmt, str) and fmt.lower() in PRESETS:
        return PRESETS[fmt.lower()]
    raise TypeError(f"fmt must be a cpd.mx.BlockFormat or one of {sorted(PRESETS)}, got {fmt!r}")


def _check_x(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"x has dtype {x.dtype}; allowed: torch.float32, torch.float16, torch.bfloat16")
    return x.to(torch.float32)


def _axis(fmt: BlockFormat, x: torch.Tensor) -> int:
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to carry blocks")
    if not -x.dim() <= fmt.axis < x.dim():
        raise ValueError(f"axis={fmt.axis} does not exist for x of shape {tuple(x.shape)} "
                         f"(allowed {-x.dim()}..{x.dim() - 1})")
    return fmt.axis % x.dim()


def _blocks(x: torch.Tensor, fmt: BlockFormat) -> tuple[torch.Tensor, int]:
    """x with the block axis moved last, zero-padded to whole blocks, as (..., nblocks, block)."""
    xm = x.movedim(_axis(fmt, x), -1)
    n = xm.shape[-1]
    pad = (-n) % fmt.block_size
    if pad:
        xm = torch.nn.functional.pad(xm, (0, pad))
    return xm.reshape(*xm.shape[:-1], -1, fmt.block_size), n


def _unblocks(y: torch.Tensor, x_shape, n: int, fmt: BlockFormat) -> torch.Tensor:
    y = y.reshape(*y.shape[:-2], -1)[..., :n]
    return y.movedim(-1, fmt.axis % len(x_shape))


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) of positive finite float32 values, exactly (frexp: a = m 2^e, m in [0.5, 1))."""
    return torch.frexp(a)[1].to(torch.int32) - 1


def _emax_elem(el: FloatFormat) -> int:
    """The spec's emax_elem: the exponent of the element format's largest value, floor(log2 max)."""
    return math.frexp(el.max)[1] - 1


def _tensor_scale(x: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """NVFP4's float32 per-tensor scale T = amax / (max_scale * max_elem) (1 for 0 or non-finite)."""
    amax = x.abs().amax() if x.numel() else torch.zeros((), device=x.device)
    t = amax / torch.tensor(fmt.scale.max * fmt.element.max, dtype=torch.float32, device=x.device)
    return torch.where(torch.isfinite(amax) & (amax > 0), t, torch.ones_like(t))


def _block_scales(xb: torch.Tensor, fmt: BlockFormat, t: torch.Tensor | None) -> torch.Tensor:
    """The shared scale S of every block (float32 values of fmt.scale; NaN for NaN/inf blocks)."""
    amax = xb.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax)  # NaN (amax propagates it) or an infinity
    zero = amax == 0
    a = torch.where(bad | zero, torch.ones_like(amax), amax)
    sf, el = fmt.scale, fmt.element
    smallest = torch.tensor(sf.smallest_subnormal, dtype=torch.float32, device=xb.device)
    if fmt.scale_rule == "amax":
        q = a / torch.tensor(el.max, dtype=torch.float32, device=xb.device)
        if t is not None:
            q = q / t
        s = _cast(q, sf, saturate=True)
        s = torch.maximum(torch.where(s > 0, s, smallest), smallest)
    else:
        if fmt.scale_rule == "even":  # amax to the element's precision first (unbounded exponent)
            a = _cast(a, FloatFormat(8, el.man, bias=127), saturate=True)
        e = _floor_log2(a) - _emax_elem(el)
        if fmt.scale_rule == "ceil":  # one binade up where max_elem * 2^e < amax
            below = torch.ldexp(torch.full_like(a, el.max, dtype=torch.float64), e.to(torch.float64)) < a.double()
            e = e + below.to(torch.int32)
        e = e.clamp(sf.emin, sf.emax)
        s = torch.ldexp(torch.ones_like(a), e.to(torch.float32))
    s = torch.where(zero, smallest, s)
    return torch.where(bad, torch.full_like(s, float("nan")), s)


def _elements(xb, s, fmt: BlockFormat, t, mode: Rounding, generator) -> torch.Tensor:
    """P_i: the block values divided by their scale, rounded and saturated to the element format."""
    finite = torch.isfinite(s)
    all_finite = bool(finite.all())
    s1 = (s if all_finite else torch.where(finite, s, torch.ones_like(s))).unsqueeze(-1)
    el = fmt.element
    if fmt.scale_rule != "amax":  # a power of two: x * 2^-e exactly, rounded once
        inv = torch.ldexp(torch.ones_like(s1), -_floor_log2(s1).to(torch.float32))
        if mode in (Rounding.NEAREST, Rounding.NEAREST_AWAY) and el.smallest_subnormal >= 2.0 ** -120:
            # fl(x * 2^-e) is exact unless it is below 2^-126, where it is so far below half the
            # element's smallest value that both it and the exact quotient round to the same ±0.
            p = _cast(xb * inv, el, mode, saturate=True)
        else:
            p = _mul(xb, inv.expand_as(xb).contiguous(), el, mode, saturate=True, generator=generator)
    else:
        d = s1 * t if t is not None else s1
        p = _cast((xb / d).contiguous(), el, mode, saturate=True, generator=generator)
    if fmt.is_int:
        p = p + 0.0  # integers have no -0 (their codes are two's complement)
    return p if all_finite else torch.where(finite.unsqueeze(-1), p, torch.zeros_like(p))


def _quantize(x, fmt: BlockFormat, rounding, generator):
    mode = Rounding.parse(rounding)
    if mode is not Rounding.STOCHASTIC and generator is not None:
        raise ValueError(f"generator only applies to rounding='stochastic', got rounding={mode.value!r}")
    xb, n = _blocks(x, fmt)
    t = _tensor_scale(x, fmt) if fmt.tensor_scale else None
    s = _block_scales(xb, fmt, t)
    p = _elements(xb, s, fmt, t, mode, generator)
    return p, s, t, n


def _dequantize(p, s, t):
    d = s if t is None else s * t
    return p.mul_(d.unsqueeze(-1))  # in place (p is ours); NaN scales make the whole block NaN


# --------------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("cpd_mx::cast", mutates_args=())
def _cast_op(x: torch.Tensor, seed: torch.Tensor, fmt: str, rounding: str) -> torch.Tensor:
    """One block-format fake quantization; ``fmt`` is the BlockFormat's repr key (see _FORMATS)."""
    f = _FORMATS[fmt]
    gen = None
    if rounding == "stochastic":
        gen = torch.Generator(device=x.device).manual_seed(int(seed.item()))
    p, s, t, n = _quantize(x, f, rounding, gen)
    return _unblocks(_dequantize(p, s, t), x.shape, n, f).contiguous()


@_cast_op.register_fake
def _(x, seed, fmt, rounding):
    return torch.empty_like(x)


def _cast_backward(ctx, grad):  # straight-through: the quantizer's gradient is the identity
    return grad, None, None, None


_cast_op.register_autograd(_cast_backward)



# --------------------------------------------------------------------------------------- public API
def cast(x: torch.Tensor, fmt, rounding="nearest", *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Fake-quantize ``x`` to a block format: encode then decode, as float32 of ``x``'s shape.

    Args:
        x: float32 (float16/bfloat16 upcast exactly) tensor, CPU or CUDA; never modified.
        fmt: a :class:`BlockFormat` or a preset name (``"mxfp8_e4m3"``, ``"nvfp4"``, ...).
        rounding: the element rounding (any mode of :func:`cpd.cast`; scales follow their rule).
        generator: stochastic rounding's torch generator.

    A custom op (``torch.ops.cpd_mx.cast``) with a fake implementation, so ``torch.compile``
    traces through it; its gradient is the identity (straight-through).

    Example:
        >>> cast(torch.tensor([1.0, 0.3, -100.0]), BlockFormat("e2m1fn", 3)).tolist()
        [0.0, 0.0, -96.0]
    """
    x = _check_x(x)
    fmt = _fmt(fmt)
    _axis(fmt, x)
    mode = Rounding.parse(rounding)
    if mode is not Rounding.STOCHASTIC and generator is not None:
        raise ValueError(f"generator only applies to rounding='stochastic', got rounding={mode.value!r}")
    seed = torch.zeros((), dtype=torch.int64)
    if mode is Rounding.STOCHASTIC:
        seed = torch.randint(0, 2**62, (), generator=generator, dtype=torch.int64)
    return _cast_op(x, seed, fmt._op_key, mode.value)


class Encoded(tuple):
    """``(codes, scales)`` of :func:`encode`, with what :func:`decode` needs besides.

    ``codes``: uint8, the block axis moved last and padded to whole blocks, ``(..., nblocks *
    block_size)`` or packed (``pack=True``: 4-bit codes two per byte, 6-bit codes four per three
    bytes, low bits first). ``scales``: uint8 codes of the scale format, ``(..., nblocks)``.
    Attributes ``fmt``, ``shape`` (of x), ``packed`` and ``tensor_scale`` (a float32 scalar
    tensor or None).
    """

    def __new__(cls, codes, scales, fmt, shape, packed, tensor_scale):
        self = super().__new__(cls, (codes, scales))
        self.fmt, self.shape, self.packed, self.tensor_scale = fmt, tuple(shape), packed, tensor_scale
        return self

    @property
    def codes(self) -> torch.Tensor:
        return self[0]

    @property
    def scales(self) -> torch.Tensor:
        return self[1]


def encode(x: torch.Tensor, fmt, rounding="nearest", *, pack: bool = True,
           generator: torch.Generator | None = None) -> Encoded:
    """Encode ``x`` to element codes and scale codes: ``codes, scales = encode(x, MXFP4)``."""
    x = _check_x(x)
    fmt = _fmt(fmt)
    p, s, t, n = _quantize(x, fmt, rounding, generator)
    if fmt.is_int:
        codes = torch.round(p * 64).to(torch.int8).view(torch.uint8)
    else:
        codes = _encode_codes(p, fmt.element)
    codes = codes.reshape(*codes.shape[:-2], -1)
    sc = _encode_codes(s, fmt.scale)
    if pack:
        codes = globals()["pack"](codes, fmt.element.bits)
    return Encoded(codes, sc, fmt, x.shape, bool(pack), t)


def decode(encoded: Encoded) -> torch.Tensor:
    """The float32 values of an :class:`Encoded` (``decode(encode(x, f)) == cast(x, f)``)."""
    if not isinstance(encoded, Encoded):
        raise TypeError(f"decode takes what cpd.mx.encode returned, got {type(encoded).__name__}")
    fmt = encoded.fmt
    codes = encoded.codes
    moved = list(encoded.shape)
    n = moved.pop(fmt.axis % len(encoded.shape))
    nb = -(-n // fmt.block_size)
    if encoded.packed:
        codes = unpack(codes, fmt.element.bits, nb * fmt.block_size)
    if fmt.is_int:
        p = codes.view(torch.int8).to(torch.float32) / 64
    else:
        p = _decode_codes(codes, fmt.element)
    p = p.reshape(*moved, nb, fmt.block_size)
    s = _decode_codes(encoded.scales, fmt.scale)
    y = _dequantize(p, s, encoded.tensor_scale)
    return _unblocks(y, encoded.shape, n, fmt)


def scales(x: torch.Tensor, fmt) -> torch.Tensor:
    """The float32 block scales S of ``x`` (``(..., nblocks)``, block axis last; NaN for NaN blocks)."""
    x = _check_x(x)
    fmt = _fmt(fmt)
    xb, _ = _blocks(x, fmt)
    return _block_scales(xb, fmt, _tensor_scale(x, fmt) if fmt.tensor_scale else None)


# --------------------------------------------------------------------------------------- packing
def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack the low ``bits`` (4, 6 or 8) of uint8 codes along the last axis, low bits first:
    4 -> two per byte (first code in the low nibble); 6 -> four per three bytes. The last axis is
    zero-padded to a whole group (2 codes for 4 bits, 4 for 6)."""
    if bits == 8 or bits not in (4, 6):
        if bits in (5, 7, 8):
            return codes.contiguous()
        raise ValueError(f"pack: bits={bits} is not supported; allowed 4, 6, 8 (5 and 7 stay one per byte)")
    group = 2 if bits == 4 else 4
    pad = (-codes.shape[-1]) % group
    c = torch.nn.functional.pad(codes, (0, pad)).to(torch.int32)
    c = c.reshape(*c.shape[:-1], -1, group)
    if bits == 4:
        return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)
    w = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)  # 24 bits
    out = torch.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], dim=-1)
    return out.reshape(*out.shape[:-2], -1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The inverse of :func:`pack`: the first ``n`` codes of each row."""
    if bits in (5, 7, 8):
        return packed[..., :n]
    p = packed.to(torch.int32)
    if bits == 4:
        c = torch.stack([p & 0xF, p >> 4], dim=-1)
    elif bits == 6:
        p = p.reshape(*p.shape[:-1], -1, 3)
        w = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
        c = torch.stack([(w >> (6 * i)) & 0x3F for i in range(4)], dim=-1)
    else:
        raise ValueError(f"unpack: bits={bits} is not supported; allowed 4, 6, 8")
    return c.reshape(*c.shape[:-2], -1)[..., :n].to(torch.uint8)
