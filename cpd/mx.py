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

import torch

from . import _cuda, _impl, _mx_engine as _engine, _mx_torch
from ._block_format import MXINT8_ELEMENT, SCALE_RULES, BlockFormat, from_spec as _from_spec
from ._mx_torch import pack, unpack
from .formats import E2M1, E2M3, E3M2, E4M3FN, E5M2
from .ops import draw_seed
from .rounding import Rounding

__all__ = ["BlockFormat", "SCALE_RULES", "MXINT8_ELEMENT", "MXFP8_E4M3", "MXFP8_E5M2", "MXFP6_E3M2", "MXFP6_E2M3",
           "MXFP4", "MXINT8", "NVFP4", "PRESETS", "Encoded", "cast", "encode", "decode", "scales", "pack", "unpack"]

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
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def _axis(fmt: BlockFormat, x: torch.Tensor) -> int:
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to carry blocks")
    if not -x.dim() <= fmt.axis < x.dim():
        raise ValueError(f"axis={fmt.axis} does not exist for x of shape {tuple(x.shape)} "
                         f"(allowed {-x.dim()}..{x.dim() - 1})")
    return fmt.axis % x.dim()


def _checked(x, fmt, rounding, generator) -> tuple[torch.Tensor, BlockFormat, Rounding]:
    """The checked (float32 x, BlockFormat, Rounding) of cast / encode; generator= only with
    stochastic rounding."""
    x = _check_x(x)
    fmt = _fmt(fmt)
    _axis(fmt, x)
    mode = Rounding.parse(rounding)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if mode is not Rounding.STOCHASTIC and generator is not None:
        raise ValueError(f"generator only applies to rounding='stochastic', got rounding={mode.value!r}")
    return x, fmt, mode


# --------------------------------------------------------------------------------------- ops
# Schemas defined with torch.library (not custom_op: its Python layers cost ~70 us a call), so that
# they exist with no compiler. A format is its op spec (BlockFormat._op_spec: 16 ints), a rounding
# its code. Once the CPU extension is loaded, its C++ kernels serve CPU, CUDA and autograd
# (cuda/cpu/mx_ops.cpp, installed by cpd._impl.CoreOps with the core ops'); until then, and with
# no compiler, the Python bodies of cpd/_mx_engine.py bound to the device's engine (the CPU loops,
# or the pure-torch path), registered below; the default body (any other device) is pure torch.
_LIB = torch.library.Library("cpd_mx", "FRAGMENT")
_SCHEMAS = (
    # one block-format fake quantization; seed a scalar int64 (stochastic rounding: a CPU generator
    # seeded with it draws the (seed, offset) pair)
    "cast(Tensor x, Tensor seed, int[] fmt, int rounding) -> Tensor",
    "cast_out(Tensor x, Tensor seed, int[] fmt, int rounding, Tensor(a!) out) -> ()",
    # (codes, scale codes, tensor scale T or 1) of x; seed the (seed, offset) pair
    "encode(Tensor x, Tensor seed, int[] fmt, int rounding, bool packed) -> (Tensor, Tensor, Tensor)",
    # the float32 values (..., n), block axis last
    "decode(Tensor codes, Tensor scales, Tensor t, int[] fmt, int n, bool packed) -> Tensor",
)
for _schema in _SCHEMAS:
    _LIB.define(_schema, tags=(torch.Tag.pt2_compliant_tag,))


def _cast_body(engine, x, seed, fmt, rounding):
    mode = Rounding.from_code(rounding)
    pair = _engine.cast_seed(seed, x.device) if mode is Rounding.STOCHASTIC else _NO_SEED
    return _engine.cast(engine, x, pair, _from_spec(fmt), mode)


def _cast_out_body(engine, x, seed, fmt, rounding, out):
    mode = Rounding.from_code(rounding)
    pair = _engine.cast_seed(seed, x.device) if mode is Rounding.STOCHASTIC else _NO_SEED
    _engine.cast(engine, x, pair, _from_spec(fmt), mode, out)
    torch.autograd.graph.increment_version(out)  # the write is counted, as for torch's in-place ops


def _encode_body(engine, x, seed, fmt, rounding, packed):
    return _engine.encode(engine, x, seed, _from_spec(fmt), Rounding.from_code(rounding), packed)


def _decode_body(engine, codes, scales, t, fmt, n, packed):
    return _engine.decode(engine, codes, scales, t, _from_spec(fmt), n, packed)


_BODIES = {"cast": (_cast_body, 0), "cast_out": (_cast_out_body, 0), "encode": (_encode_body, 0),
           "decode": (_decode_body, 0)}
for _name, (_body, _) in _BODIES.items():  # any other device: the pure-torch path
    _LIB.impl(_name, _impl._bind(_body, lambda args: None), "CompositeExplicitAutograd")


@torch.library.register_fake("cpd_mx::cast", lib=_LIB)
def _(x, seed, fmt, rounding):
    return torch.empty_like(x)


def _cast_backward(ctx, grad):  # straight-through: the quantizer's gradient is the identity
    return grad, None, None, None


@torch.library.register_fake("cpd_mx::cast_out", lib=_LIB)
def _(x, seed, fmt, rounding, out):
    return None


@torch.library.register_fake("cpd_mx::encode", lib=_LIB)
def _(x, seed, fmt, rounding, packed):
    bits, block, axis = 1 + fmt[0] + fmt[1], fmt[12], fmt[13] % x.dim()
    lead = [s for i, s in enumerate(x.shape) if i != axis]
    nb = -(-x.shape[axis] // block)
    L = nb * block
    width = (L + 1) // 2 if packed and bits == 4 else (L + 3) // 4 * 3 if packed and bits == 6 else L
    codes = x.new_empty((*lead, width), dtype=torch.uint8)
    return codes, x.new_empty((*lead, nb), dtype=torch.uint8), x.new_empty(())


@torch.library.register_fake("cpd_mx::decode", lib=_LIB)
def _(codes, scales, t, fmt, n, packed):
    return scales.new_empty((*scales.shape[:-1], n), dtype=torch.float32)


_NO_SEED = torch.zeros(2, dtype=torch.int64)
_ZERO_SEED = torch.zeros((), dtype=torch.int64)  # cpd_mx::cast's seed argument for the deterministic modes
_core = _impl._core
_core.register(_BODIES, {"cast": (_cast_backward, None)}, ns="cpd_mx", torch_path=_engine.torch_body)
_OP_CAST, _OP_CAST_OUT = torch.ops.cpd_mx.cast.default, torch.ops.cpd_mx.cast_out.default


# --------------------------------------------------------------------------------------- public API
def cast(x: torch.Tensor, fmt, rounding="nearest", *, generator: torch.Generator | None = None,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """Fake-quantize ``x`` to a block format: encode then decode, as float32 of ``x``'s shape.

    Args:
        x: float32 (float16/bfloat16 upcast exactly) tensor, CPU or CUDA; never modified.
        fmt: a :class:`BlockFormat` or a preset name (``"mxfp8_e4m3"``, ``"nvfp4"``, ...).
        rounding: the element rounding (any mode of :func:`cpd.cast`; scales follow their rule).
        generator: stochastic rounding's torch generator.
        out: a float32 tensor of x's shape (not x's memory) to write the result into; returned.
            Not differentiable (as ``cpd.cast``'s ``out=``); it saves allocating the result.

    A custom op (``torch.ops.cpd_mx.cast``) with a fake implementation, so ``torch.compile``
    traces through it; its gradient is the identity (straight-through).

    Example:
        >>> cast(torch.tensor([1.0, 0.3, -100.0]), BlockFormat("e2m1fn", 3)).tolist()
        [0.0, 0.0, -96.0]
    """
    x, fmt, mode = _checked(x, fmt, rounding, generator)
    if not _core.done:
        _core.install()
    seed = _ZERO_SEED
    if mode is Rounding.STOCHASTIC:
        # a CUDA generator draws through its CPU twin (as cpd.ops.draw_seed does): torch.randint
        # on the CPU refuses a CUDA generator
        gen = _cuda.cpu_twin(generator) if generator is not None and generator.device.type == "cuda" else generator
        seed = torch.randint(0, 2**62, (), generator=gen, dtype=torch.int64)
    if out is None:
        ext = _impl.direct(x)
        return ext.call_mx_cast(x, seed, fmt._op_spec, mode.code) if ext is not None else _OP_CAST(
            x, seed, fmt._op_spec, mode.code)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype != torch.float32 or out.shape != x.shape or out.device != x.device:
        raise ValueError(f"out must be a float32 tensor of shape {tuple(x.shape)} on {x.device}; got {out.dtype}, "
                         f"shape {tuple(out.shape)} on {out.device}")
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        raise ValueError("out= is not differentiable: x or out requires grad; call cast without out= "
                         "(or under torch.no_grad())")
    if out.data_ptr() == x.data_ptr():
        raise ValueError("out must not be x's memory (cpd.mx.cast reads whole blocks before writing)")
    ext = _impl.direct(x, out)
    if ext is not None:
        ext.call_mx_cast_out(x, seed, fmt._op_spec, mode.code, out)
    else:
        _OP_CAST_OUT(x, seed, fmt._op_spec, mode.code, out)
    return out


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
    x, fmt, mode = _checked(x, fmt, rounding, generator)
    if not isinstance(pack, bool):
        raise TypeError(f"pack must be a bool, got {type(pack).__name__}")
    seed = draw_seed(generator, x.device) if mode is Rounding.STOCHASTIC else _NO_SEED
    if not _core.done:
        _core.install()
    codes, sc, t = torch.ops.cpd_mx.encode(x, seed, fmt._op_spec, mode.code, pack)
    return Encoded(codes, sc, fmt, x.shape, pack, t if fmt.tensor_scale else None)


def decode(encoded: Encoded) -> torch.Tensor:
    """The float32 values of an :class:`Encoded` (``decode(encode(x, f)) == cast(x, f)``)."""
    if not isinstance(encoded, Encoded):
        raise TypeError(f"decode takes what cpd.mx.encode returned, got {type(encoded).__name__}")
    fmt = encoded.fmt
    n = encoded.shape[fmt.axis % len(encoded.shape)]
    t = encoded.tensor_scale if encoded.tensor_scale is not None else torch.ones(())
    if not _core.done:
        _core.install()
    y = torch.ops.cpd_mx.decode(encoded.codes, encoded.scales, t, fmt._op_spec, n, encoded.packed)
    return y.movedim(-1, fmt.axis % len(encoded.shape))


def scales(x: torch.Tensor, fmt) -> torch.Tensor:
    """The float32 block scales S of ``x`` (``(..., nblocks)``, block axis last; NaN for NaN blocks)."""
    x = _check_x(x)
    fmt = _fmt(fmt)
    _axis(fmt, x)
    xb, _ = _mx_torch.blocks(x, fmt)
    return _mx_torch.block_scales(xb, fmt, _mx_torch.tensor_scale(x, fmt) if fmt.tensor_scale else None)
