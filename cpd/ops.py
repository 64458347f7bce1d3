"""The cast, encode and decode: public functions over ``torch.library`` custom ops.

``cpd::cast`` (and ``cpd::cast_out``, ``cpd::encode``, ``cpd::decode``, ``cpd::arith``,
``cpd::matmul``) are custom ops with fake impls, so they trace under ``torch.compile``; the
differentiable ones have straight-through autograd. A format is one ``int[]`` argument,
``[exp, man, bias, specials, subnormals]`` (:func:`_fmt_spec`; an empty list: no format).

Device dispatch is the dispatcher's: each op registers one implementation per device type
(``register_kernel("cpu")``, ``register_kernel("cuda")``), the op bodies of :mod:`cpd._impl`
bound to that device's engine: the compiled CPU extension (or the pure-torch fallback), and the
NVRTC-compiled CUDA kernels (or the fallback on the device). All of them run the one numerics
core (``cuda/include/cpd/``).
"""

from __future__ import annotations

import math

import torch

from . import _cpu, _cuda, _fallback, _impl
from ._fused_dot import FusedDot
from .formats import FP32, FloatFormat
from .registry import FUSED_DOT_MATMUL, lookup
from .rounding import Rounding

__all__ = ["cast", "encode", "decode", "bits", "code_dtype", "draw_seed", "random_words", "add", "mul", "fma", "matmul", "sum"]

_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16)
_CODE_INPUTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32)


# --------------------------------------------------------------------------------------- checks
def _check_tensor(x, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_INPUTS:
        raise TypeError(
            f"{name} has dtype {x.dtype}; cpd casts float32 tensors (float16 and bfloat16 are upcast "
            "exactly); convert other dtypes to float32 yourself (float64 -> float32 is itself a rounding)"
        )
    return x


def _check_sr_bits(sr_bits, rounding: Rounding) -> int:
    if sr_bits is None:
        return 32
    if rounding is not Rounding.STOCHASTIC:
        raise ValueError(f"sr_bits={sr_bits!r} only applies to rounding='stochastic', got rounding={rounding.value!r}")
    if isinstance(sr_bits, bool) or not isinstance(sr_bits, int):
        raise TypeError(f"sr_bits must be an int or None, got {type(sr_bits).__name__}")
    if not 1 <= sr_bits <= 32:
        raise ValueError(f"sr_bits={sr_bits} is out of range; allowed 1..32 (None means 32)")
    return sr_bits


def _check_rounding_args(rounding, saturate, sr_bits, generator) -> tuple[Rounding, int]:
    """Validate the rounding arguments every op takes; returns (mode, sr_bits as an int)."""
    mode = Rounding.parse(rounding)
    k = _check_sr_bits(sr_bits, mode)
    if not isinstance(saturate, bool):
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    if generator is not None and mode is not Rounding.STOCHASTIC:
        raise ValueError(f"generator only applies to rounding='stochastic', got rounding={mode.value!r}")
    return mode, k


def _fmt_args(fmt: FloatFormat) -> tuple[int, int, int, int, bool]:
    return fmt.exp, fmt.man, fmt.bias, fmt.core_specials, fmt.subnormals


def _fmt_spec(fmt: FloatFormat | None) -> list[int]:
    """The ops' format argument: ``[exp, man, bias, specials, subnormals]`` ([] for None); ``specials``
    is the core's integer (:attr:`FloatFormat.core_specials`: the convention and the unsigned flag)."""
    if fmt is None:
        return []
    hit = _SPECS.get(id(fmt))
    if hit is not None and hit[0] is fmt:  # the cache holds fmt, so its id is not reused
        return hit[1]
    spec = [fmt.exp, fmt.man, fmt.bias, fmt.core_specials, int(fmt.subnormals)]
    if len(_SPECS) < 1024:
        _SPECS[id(fmt)] = (fmt, spec)
    return spec


_SPECS: dict = {}  # id(format) -> (format, its spec): a call costs no dataclass hashing


def code_dtype(fmt: FloatFormat) -> torch.dtype:
    """The integer dtype that holds ``fmt``'s codes: uint8 up to 8 bits, int16 up to 16, else int32."""
    fmt = FloatFormat.parse(fmt)
    return torch.uint8 if fmt.bits <= 8 else torch.int16 if fmt.bits <= 16 else torch.int32


# --------------------------------------------------------------------------------------- randomness
_DEVICE_TYPES: dict = {}


def _device_type(dev: torch.device) -> str:
    """``dev.type``, remembered per device: reading ``torch.device.type`` takes about 0.7 us (torch
    2.13, a Zen 3 core), a sixth of a stochastic call's seed draw."""
    kind = _DEVICE_TYPES.get(dev)
    if kind is None:
        kind = _DEVICE_TYPES[dev] = dev.type
    return kind


def draw_seed(generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """Draw the (seed, offset) pair of one stochastic launch from torch's generator.

    Two int64 from ``torch.randint`` on ``generator`` (or the default generator of ``device``), so
    ``torch.manual_seed`` and ``generator=`` make stochastic rounding reproducible, and each call
    advances the generator like any other torch random op. The pair is always a CPU tensor: the
    kernels take it by value, with no device copy and no host synchronisation.

    A CUDA generator (or the default generator of a CUDA device) gives the pair a CPU generator
    seeded alike gives: cpd keeps a CPU generator beside it, seeded with its ``initial_seed()``
    when its offset is 0 (just seeded), and advances the CUDA generator's offset by 4 per draw
    so that a state cpd did not leave behind (other random ops in between) restarts the CPU
    generator from (seed, offset) rather than repeating a stream. So ``torch.manual_seed(s)``
    gives the same stochastic bits on CPU and GPU.
    """
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator is not None:
        dev = generator.device
    else:
        dev = device if type(device) is torch.device else torch.device(device)
    kind = _device_type(dev)
    if kind == "cuda":
        if generator is None:
            idx = dev.index if dev.index is not None else torch.cuda.current_device()
            generator = torch.cuda.default_generators[idx]
        generator = _cuda.cpu_twin(generator)
    elif kind != "cpu":  # meta (shape tracing) and others: the CPU default generator
        generator = None
    ext = _impl.direct()  # the extension's at::randint: the same kernel, bits and generator state
    if ext is not None:
        return ext.draw_seed(generator)
    return torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=generator)


def random_words(start: int, n: int, seed: int, offset: int) -> torch.Tensor:
    """The 32-bit random words (as int64) that elements ``start..start+n-1`` of a stochastic cast
    keyed by (seed, offset) use. Exposed so tests can check every stochastic decision exactly."""
    ext = _cpu.extension()
    if ext is None:
        return _fallback.random_words(start, n, seed, offset)
    out = torch.empty(n, dtype=torch.int32)
    ext.random_words(out, start, seed, offset)
    return out.to(torch.int64) & 0xFFFFFFFF


_ZERO_SEED = torch.zeros(2, dtype=torch.int64)


def _zero_seed(device: torch.device | str = "cpu") -> torch.Tensor:
    """The seed pair of a deterministic launch (a CPU tensor, whatever the device)."""
    return _ZERO_SEED


# --------------------------------------------------------------------------------------- ops
# The schemas are defined here, in Python, so that the ops exist on any machine (the pure-torch
# fallback runs them where nothing can be compiled); the kernels are registered per dispatch key
# at the end of this module (cpd._impl.CoreOps): the CUDA bodies, and for CPU and autograd the
# extension's C++ kernels (cuda/cpu/ops.cpp) once it is loaded, Python bodies until then.
_LIB = torch.library.Library("cpd", "FRAGMENT")
_SCHEMAS = (
    "cast(Tensor x, Tensor seed, int[] fmt, int rounding, bool saturate, int sr_bits) -> Tensor",
    "cast_out(Tensor x, Tensor seed, int[] fmt, int rounding, bool saturate, int sr_bits, Tensor(a!) out) -> ()",
    # round (a deterministic mode) and encode in one pass; codes of code_dtype(fmt)
    "encode(Tensor x, int[] fmt, int rounding, bool saturate) -> Tensor",
    "decode(Tensor codes, int[] fmt) -> Tensor",
    # round(a*b), round(a+b) or round(c + a*b) (op 0, 1, 2) of same-shape float32 tensors
    "arith(int op, Tensor a, Tensor b, Tensor c, Tensor seed, int[] fmt, int rounding, bool saturate, "
    "int sr_bits) -> Tensor",
    # a (..., M, K) @ b (..., K, N), batch dims broadcast; mul [] for exact products; see matmul()
    "matmul(Tensor a, Tensor b, Tensor seed, int[] mul, int[] acc, bool kahan, int block, int rounding, "
    "bool saturate, int sr_bits) -> Tensor",
)
for _schema in _SCHEMAS:
    _LIB.define(_schema, tags=(torch.Tag.pt2_compliant_tag,))
_OP_CAST, _OP_CAST_OUT, _OP_ENCODE, _OP_DECODE, _OP_ARITH, _OP_MATMUL = (
    getattr(torch.ops.cpd, s.partition("(")[0]).default for s in _SCHEMAS)


@torch.library.register_fake("cpd::cast", lib=_LIB)
def _(x, seed, fmt, rounding, saturate, sr_bits):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _cast_backward(ctx, grad):
    return grad, None, None, None, None, None  # straight-through


@torch.library.register_fake("cpd::cast_out", lib=_LIB)
def _(x, seed, fmt, rounding, saturate, sr_bits, out):
    return None


@torch.library.register_fake("cpd::encode", lib=_LIB)
def _(x, fmt, rounding, saturate):
    return torch.empty(x.shape, dtype=_impl.code_dtype_of(_impl.fmt_tuple(fmt)), device=x.device)


@torch.library.register_fake("cpd::decode", lib=_LIB)
def _(codes, fmt):
    return torch.empty(codes.shape, dtype=torch.float32, device=codes.device)


_to_code_dtype = _impl._to_code_dtype


# --------------------------------------------------------------------------------------- public API
def cast(x: torch.Tensor, fmt, rounding="nearest", *, saturate: bool = False, sr_bits: int | None = None,
         generator: torch.Generator | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Round every element of ``x`` to a value of ``fmt``; return float32.

    Args:
        x: float32 tensor (float16/bfloat16 are upcast exactly) of any shape, layout or size, on
            CPU or CUDA. Never modified unless ``out`` is ``x``.
        fmt: a :class:`FloatFormat`, a name (``"e5m2"``) or a torch float dtype.
        rounding: ``"nearest"`` (ties to even encoding), ``"stochastic"``, ``"toward_zero"``,
            ``"up"``, ``"down"``, ``"nearest_away"`` (ties away from zero) or ``"odd"`` (round to odd).
        saturate: clamp every overflow, infinite inputs included, to ±max.
        sr_bits: stochastic rounding only: round with k random bits, so probabilities are
            quantized to 2**-k (hardware style); None uses 32 bits.
        generator: stochastic rounding only: the torch generator its seed comes from (default:
            the device's default generator, so ``torch.manual_seed`` makes it reproducible).
        out: float32 tensor of ``x``'s shape and device to write into (may be ``x``).

    Returns:
        A float32 tensor (``out`` if given) of values exactly representable in ``fmt``.

    Overflow is decided as IEEE 754 does: round as if the exponent were unbounded, and overflow if
    the result exceeds max. Under round-to-nearest that means |x| beyond max + ulp/2 overflows,
    and the tie at exactly max + ulp/2 goes to the even encoding: up (overflow) when max's code is
    odd (ieee and finite formats with man >= 1), down to max when it is even (``fn`` formats such as
    E4M3FN, where 464 -> 448; ieee formats with man = 0). An overflow gives ±inf for ``ieee``
    formats, NaN for ``fn`` formats and ±max for ``finite`` formats; rounding toward zero (and up
    for negatives, down for positives) never overflows past ±max.
    NaN stays NaN, zeros keep their sign, float32 subnormal inputs are exact; with
    ``fmt.subnormals=False`` results below the smallest normal are flushed to signed zero.
    """
    x = _check_tensor(x)
    fmt = FloatFormat.parse(fmt)
    mode, k = _check_rounding_args(rounding, saturate, sr_bits, generator)
    x32 = x if x.dtype == torch.float32 else x.to(torch.float32)
    seed = draw_seed(generator, x.device) if mode is Rounding.STOCHASTIC else _ZERO_SEED
    args = (_fmt_spec(fmt), mode.code, saturate, k)
    if out is None:
        _ready()
        ext = _direct(x32)
        return ext.call_cast(x32, seed, *args) if ext is not None else _OP_CAST(x32, seed, *args)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        raise ValueError("out= is not differentiable: x or out requires grad; call cast without out= "
                         "(or under torch.no_grad())")
    if out.dtype != torch.float32 or out.shape != x.shape or out.device != x.device:
        raise ValueError(
            f"out must be a float32 tensor of shape {tuple(x.shape)} on {x.device}; got {out.dtype}, "
            f"shape {tuple(out.shape)} on {out.device}"
        )
    _ready()
    ext = _direct(x32, out)
    if ext is not None:
        ext.call_cast_out(x32, seed, *args, out)
    else:
        _OP_CAST_OUT(x32, seed, *args, out)
    return out


def encode(x: torch.Tensor, fmt, rounding="nearest", *, saturate: bool = False, sr_bits: int | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Round ``x`` to ``fmt`` (as :func:`cast`) and return its integer codes.

    A code is ``sign | exponent field | mantissa`` in the low ``fmt.bits`` bits, stored as uint8
    for formats of up to 8 bits, int16 up to 16 bits (the 16-bit pattern), int32 above.
    NaN inputs raise ValueError for formats with no NaN code (``finite``, and ``ieee`` with man=0).
    """
    x = _check_tensor(x)
    fmt = FloatFormat.parse(fmt)
    mode = Rounding.parse(rounding)
    if mode is Rounding.STOCHASTIC:  # round first, then encode the (exact) values
        x = cast(x, fmt, mode, saturate=saturate, sr_bits=sr_bits, generator=generator)
        mode = Rounding.NEAREST
    else:
        _check_sr_bits(sr_bits, mode)
        if generator is not None:
            raise ValueError(f"generator only applies to rounding='stochastic', got rounding={mode.value!r}")
    x32 = x if x.dtype == torch.float32 else x.to(torch.float32)
    if not fmt.has_nan and bool(torch.isnan(x32).any()):
        raise ValueError(f"x contains NaN, which format {fmt.name} has no code for")
    _ready()
    args = (x32, _fmt_spec(fmt), mode.code, bool(saturate))
    ext = _direct(x32)
    return ext.call_encode(*args) if ext is not None else _OP_ENCODE(*args)


def decode(codes: torch.Tensor, fmt) -> torch.Tensor:
    """Float32 values of integer codes of ``fmt`` (the inverse of :func:`encode`).

    Accepts any integer dtype. Codes are ``0 .. 2**fmt.bits - 1``; for formats of exactly 8, 16 or
    32 bits a negative value is also read as the two's-complement bit pattern (so an int8 view of
    uint8 codes, or int16 fp16 patterns, decode as expected). Anything else is a ValueError.
    """
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype not in _CODE_INPUTS:
        raise TypeError(f"codes has dtype {codes.dtype}; allowed integer dtypes: {list(_CODE_INPUTS)}")
    fmt = FloatFormat.parse(fmt)
    want = code_dtype(fmt)
    if codes.dtype != want:
        c64 = codes.to(torch.int64)
        width = torch.iinfo(want).bits
        if codes.numel() and (bool((c64 < -(1 << (width - 1))).any()) or bool((c64 >= 1 << width).any())):
            raise ValueError(f"codes hold values outside {fmt.name}'s {fmt.bits}-bit code range")
        codes = _to_code_dtype(c64 & ((1 << width) - 1), want)
    if fmt.bits < torch.iinfo(want).bits and codes.numel():
        c64 = codes.to(torch.int64)
        if bool((c64 < 0).any()) or bool((c64 >= 1 << fmt.bits).any()):
            raise ValueError(f"codes hold values outside {fmt.name}'s {fmt.bits}-bit code range 0..{(1 << fmt.bits) - 1}")
    _ready()
    args = (codes, _fmt_spec(fmt))
    ext = _direct(codes)
    return ext.call_decode(*args) if ext is not None else _OP_DECODE(*args)


def bits(x: torch.Tensor, fmt, rounding="nearest", *, saturate: bool = False, sr_bits: int | None = None,
         generator: torch.Generator | None = None) -> str:
    """The encodings of ``x`` rounded to ``fmt``, one line per element, as ``sign | exponent | mantissa``.

    Example:
        >>> print(bits(torch.tensor([0.3]), "e5m2"))
        0.3 -> 0 01101 01 = 0.3125
    """
    x = _check_tensor(x, "x").reshape(-1)
    fmt = FloatFormat.parse(fmt)
    x32 = x.to(torch.float32)
    vals = cast(x32, fmt, rounding, saturate=saturate, sr_bits=sr_bits, generator=generator)
    codes = encode(torch.nan_to_num(vals, nan=0.0, posinf=math.inf, neginf=-math.inf) if not fmt.has_nan else vals, fmt)
    codes = codes.to(torch.int64) & ((1 << fmt.bits) - 1)
    lines = []
    for xi, ci, vi in zip(x32.tolist(), codes.tolist(), vals.tolist()):
        if math.isnan(vi) and not fmt.has_nan:
            lines.append(f"{xi:.9g} -> (no NaN code in {fmt.name})")
            continue
        s = ci >> (fmt.exp + fmt.man)
        e = (ci >> fmt.man) & ((1 << fmt.exp) - 1)
        m = ci & ((1 << fmt.man) - 1)
        mstr = format(m, f"0{fmt.man}b") if fmt.man else "-"
        lines.append(f"{xi:.9g} -> {s} {format(e, f'0{fmt.exp}b')} {mstr} = {vi:.9g}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- arithmetic
_ARITH = {"mul": 0, "add": 1, "fma": 2}


@torch.library.register_fake("cpd::arith", lib=_LIB)
def _(op, a, b, c, seed, fmt, rounding, saturate, sr_bits):
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def _arith_setup(ctx, inputs, output):
    op, a, b = inputs[0], inputs[1], inputs[2]
    ctx.op = op
    ctx.save_for_backward(a, b)


def _arith_backward(ctx, grad):
    """Gradients of the exact operation (the rounding is passed straight through)."""
    a, b = ctx.saved_tensors
    if ctx.op == 1:
        ga, gb, gc = grad, grad, None
    else:
        ga, gb = grad * b, grad * a
        gc = grad if ctx.op == 2 else None
    return None, ga, gb, gc, None, None, None, None, None


def _arith(name: str, tensors: list, fmt, rounding, saturate, sr_bits, generator):
    for t, arg in zip(tensors, ("a", "b", "c")[: len(tensors)] if name == "fma" else ("x", "y")):
        _check_tensor(t, arg)
    fmt = FloatFormat.parse(fmt)
    mode, k = _check_rounding_args(rounding, saturate, sr_bits, generator)
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"{name}: all tensors must be on one device, got {sorted(map(str, devices))}")
    tensors = [t if t.dtype == torch.float32 else t.to(torch.float32) for t in tensors]
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors[1:]):  # equal shapes (the common call) need no expanded views
        try:
            tensors = torch.broadcast_tensors(*tensors)
        except RuntimeError as exc:
            raise ValueError(f"{name}: shapes {[tuple(t.shape) for t in tensors]} do not broadcast") from exc
    device = tensors[0].device
    seed = draw_seed(generator, device) if mode is Rounding.STOCHASTIC else _zero_seed(device)
    if name == "fma":
        c, a, b = tensors
    else:
        (a, b), c = tensors, tensors[0]
    _ready()
    args = (_ARITH[name], a, b, c, seed, _fmt_spec(fmt), mode.code, saturate, k)
    ext = _direct(a, b, c)
    return ext.call_arith(*args) if ext is not None else _OP_ARITH(*args)


def mul(x: torch.Tensor, y: torch.Tensor, fmt, rounding="nearest", *, saturate: bool = False,
        sr_bits: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """``x * y`` computed exactly and rounded once to ``fmt`` (broadcasting like ``torch.mul``).

    The same rounding rules as :func:`cast` (overflow, saturate, subnormals, stochastic rounding
    with ``sr_bits``/``generator``); float32 (or exactly upcast float16/bfloat16) inputs. The
    gradient is that of the exact product (the rounding is straight-through).
    """
    return _arith("mul", [x, y], fmt, rounding, saturate, sr_bits, generator)


def add(x: torch.Tensor, y: torch.Tensor, fmt, rounding="nearest", *, saturate: bool = False,
        sr_bits: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """``x + y`` computed exactly and rounded once to ``fmt`` (broadcasting like ``torch.add``).

    This is one step of a low-precision accumulator: unlike ``cast(x + y, fmt)``, whose float32
    addition rounds first (double rounding, and lost bits for directed and stochastic modes), the
    exact sum is rounded once. An exact zero sum is +0 (-0 when rounding down), or the common
    sign of two zeros, as IEEE 754 says.
    """
    return _arith("add", [x, y], fmt, rounding, saturate, sr_bits, generator)


def fma(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, fmt, rounding="nearest", *, saturate: bool = False,
        sr_bits: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """``c + a * b`` computed exactly and rounded once to ``fmt``: a fused multiply-add in ``fmt``."""
    return _arith("fma", [c, a, b], fmt, rounding, saturate, sr_bits, generator)


# --------------------------------------------------------------------------------------- accumulation
_batch_shape = _impl.batch_shape


@torch.library.register_fake("cpd::matmul", lib=_LIB)
def _(a, b, seed, mul, acc, kahan, block, rounding, saturate, sr_bits):
    batch = _batch_shape(a.shape, b.shape)
    return a.new_empty((*batch, a.shape[-2], b.shape[-1]))


def _sum_to(g: torch.Tensor, shape) -> torch.Tensor:
    """Reduce a broadcast gradient to ``shape`` (sum over the broadcast dims)."""
    lead = g.dim() - len(shape)
    if lead:
        g = g.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(dim=dims, keepdim=True) if dims else g


def _matmul_setup(ctx, inputs, output):
    a, b = inputs[0], inputs[1]
    ctx.save_for_backward(a, b)


def _matmul_backward(ctx, grad):
    """Straight-through: the gradients of the exact float32 product a @ b."""
    a, b = ctx.saved_tensors
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = _sum_to(torch.matmul(grad, b.transpose(-1, -2)), a.shape)
    if ctx.needs_input_grad[1]:
        gb = _sum_to(torch.matmul(a.transpose(-1, -2), grad), b.shape)
    return (ga, gb) + (None,) * 8


def _check_accum_args(acc, kahan, rounding, saturate, sr_bits, generator):
    if acc is None:
        raise TypeError("acc must be a FloatFormat, a format name or a torch float dtype, got None")
    acc = FloatFormat.parse(acc)
    if not isinstance(kahan, bool):
        raise TypeError(f"kahan must be a bool, got {type(kahan).__name__}")
    mode, k = _check_rounding_args(rounding, saturate, sr_bits, generator)
    return acc, mode, k


def _check_matmul_operands(a, b) -> None:
    """The operand checks of every matmul (this module's and :func:`cpd.tensor_core_matmul`)."""
    for t, name in ((a, "a"), (b, "b")):
        _check_tensor(t, name)
        if t.dim() < 2:
            raise ValueError(f"matmul: {name} must have at least 2 dims (..., rows, cols), got shape {tuple(t.shape)}")
    if a.device != b.device:
        raise ValueError(f"matmul: a is on {a.device} and b on {b.device}; they must be on one device")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not match: a has "
                         f"{a.shape[-1]} columns, b has {b.shape[-2]} rows")
    try:
        _batch_shape(a.shape, b.shape)
    except RuntimeError as exc:
        raise ValueError(f"matmul: batch dims of shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast") from exc


def matmul(a: torch.Tensor, b: torch.Tensor, *, mul=None, acc=FP32, fma: bool = False,
           kahan: bool = False, block: int | None = None, rounding="nearest", saturate: bool = False,
           sr_bits: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """``a @ b`` with every product and every addition rounded to a chosen format.

    ``a`` is ``(..., M, K)`` and ``b`` is ``(..., K, N)`` (2-D or batched; batch dims broadcast
    like ``torch.matmul``); float32 (float16/bfloat16 are upcast exactly), CPU or CUDA. The result
    is float32 of shape ``(..., M, N)`` holding values of ``acc``.

    Order of operations, for each output element ``o`` independently (so a column's result never
    depends on the other columns, the thread count, the tiling or the device):

    1. ``s = +0``; for ``k = 0, 1, ..., K-1`` in order, with ``p = a[i, k] * b[k, j]`` exact:
    2. plain: ``s = round_acc(s + round_mul(p))``; with ``mul=None`` the exact ``p`` is added and
       the sum rounded once (a fused multiply-add in ``acc``). ``fma=True`` asks for exactly that
       and requires ``mul=None``.
    3. ``kahan=True`` keeps one compensation ``c = +0`` per output, every operation rounded to
       ``acc``: ``y = round(P - c)``, ``t = round(s + y)``, ``c = round(round(t - s) - y)``,
       ``s = t`` (``P = round_mul(p)``, or the exact ``p`` with ``mul=None``, so that ``y`` is
       rounded once).
    4. ``block=L``: each run of ``L`` consecutive k (the last one may be shorter) is summed plainly
       from +0 as in 2 into a block sum, which is then added to ``s`` in ``acc`` as in 2 (or, with
       ``kahan=True``, compensated as in 3 with the block sum in place of ``P``): the chunked
       accumulation of tensor-core-style hardware.

    Every rounding is the exact result rounded once (no double rounding), with the rules of
    :func:`cast` (overflow, ``saturate`` for both formats, subnormals, signed zeros: an exact zero
    sum is +0 unless both addends are -0, or -0 when rounding down). Non-finite values propagate
    as float32 arithmetic would, each result mapped to the format like :func:`cast` maps it.

    Stochastic rounding: every rounding draws its own 32-bit word; rounding ``j`` of step ``k``
    of output ``o`` (flattened row-major index into the result) uses word ``(o*K + k)*8 + j`` of
    the launch's (seed, offset) (see :func:`draw_seed`, :func:`random_words`), with ``j`` = 0
    the product, 1 the add (Kahan's ``y``; in block mode the add into the block sum), 2, 3, 4
    Kahan's ``t``, ``t - s`` and ``- y``; block mode: 4 the add of the block sum into ``s``, or
    4-7 Kahan's ``y``, ``t``, ``t - s``, ``- y`` at the end of each run.

    Autograd is straight-through: ``grad_a = grad @ b^T`` and ``grad_b = a^T @ grad`` computed
    by ``torch.matmul`` in float32 (reduced over broadcast batch dims).

    Speed (CPU, 512^3, one core, ratio to ``torch.mm``; ``benchmarks/bench_matmul.py``, figures
    on the docs' Figures page): the default (``mul=None, acc=FP32``) is a float32 FMA chain, about
    2x; products of an 8-bit format into FP16 or FP32, about 5-8x; other round-to-nearest
    accumulators of up to 11 bits and BF16/TF32, 4-30x; stochastic rounding for formats of up to
    11 bits runs float32 lanes, about 130-400x (its Philox words alone cost about 85-110x on AVX2),
    and up to 19 mantissa bits float64 lanes, several hundred times; the directed modes run float32
    lanes in the processor's own rounding direction: exact products into FP32, TF32 or BF16 about
    as fast as round-to-nearest, other formats about 40-90x; the rest (wider stochastic formats,
    FNUZ/P3109 accumulators) a scalar path, about 1000x or more. Every path gives the same bits.

    Args:
        a, b: the operands.
        mul: format of each product, or None for exact products.
        acc: format of the accumulator (default FP32), or a :class:`cpd.FusedDot` (e.g.
            ``cpd.tensor_core("hopper", a="e4m3")``): the fused dot products of a matrix unit,
            see :mod:`cpd.tensor_core` (the other arguments must then keep their defaults).
        fma: fused multiply-add in ``acc`` (requires ``mul=None``).
        kahan: compensated (Kahan) summation.
        block: block length L >= 1 for blocked accumulation, or None.
        rounding: ``"nearest"``, ``"stochastic"``, ``"toward_zero"``, ``"up"`` or ``"down"``, used
            for every rounding.
        saturate: overflows give ±max in both formats.
        sr_bits, generator: as in :func:`cast`.
    """
    # --- tensor-core accumulators (issue 15, cpd/tensor_core.py): acc=FusedDot runs its own op ---
    # (cpd.tensor_core.tensor_core_matmul, looked up in cpd.registry: that module imports this one)
    if isinstance(acc, FusedDot):
        return lookup(FUSED_DOT_MATMUL)(a, b, acc, mul=mul, fma=fma, kahan=kahan, block=block, rounding=rounding,
                                        saturate=saturate, sr_bits=sr_bits, generator=generator)
    # --- end tensor-core accumulators ---
    _check_matmul_operands(a, b)
    acc, mode, k = _check_accum_args(acc, kahan, rounding, saturate, sr_bits, generator)
    mul = None if mul is None else FloatFormat.parse(mul)
    if not isinstance(fma, bool):
        raise TypeError(f"fma must be a bool, got {type(fma).__name__}")
    if fma and mul is not None:
        raise ValueError(f"fma=True rounds acc + a*b once, so products are not rounded: mul must be None, got {mul.name}")
    if block is not None:
        if isinstance(block, bool) or not isinstance(block, int):
            raise TypeError(f"block must be an int >= 1 or None, got {type(block).__name__}")
        if block < 1:
            raise ValueError(f"block must be >= 1 (or None), got {block}")
    seed = draw_seed(generator, a.device) if mode is Rounding.STOCHASTIC else _ZERO_SEED
    _ready()
    a = a if a.dtype == torch.float32 else a.to(torch.float32)
    b = b if b.dtype == torch.float32 else b.to(torch.float32)
    args = (a, b, seed, _fmt_spec(mul), _fmt_spec(acc), kahan, block or 0, mode.code, saturate, k)
    ext = _direct(a, b)
    return ext.call_matmul(*args) if ext is not None else _OP_MATMUL(*args)


def sum(x: torch.Tensor, dim: int | None = None, *, acc, kahan: bool = False, rounding="nearest",  # noqa: A001
        saturate: bool = False, sr_bits: int | None = None, generator: torch.Generator | None = None,
        keepdim: bool = False) -> torch.Tensor:
    """Sum of ``x`` along ``dim`` accumulated in the format ``acc``.

    Each output sums its elements sequentially in increasing index along ``dim`` (``dim=None``:
    all elements in row-major order) from +0, every addition exact then rounded once to ``acc``;
    ``kahan=True`` compensates as in :func:`matmul` (``y = round(x_k - c)``,
    ``t = round(s + y)``, ``c = round(round(t - s) - y)``, ``s = t``).

    It is :func:`matmul` of ``x`` (moved to ``(outputs, K)``) with a column of ones and
    ``mul=None``, so the stochastic words are keyed the same way: rounding ``j`` of step ``k``
    of output ``o`` (row-major index into the result) uses word ``(o*K + k)*8 + j``, ``j`` = 1 the
    add (Kahan's ``y``), 2-4 Kahan's ``t``, ``t - s``, ``- y``. Gradient: straight-through (ones).
    """
    _check_tensor(x, "x")
    acc, mode, _ = _check_accum_args(acc, kahan, rounding, saturate, sr_bits, generator)
    if not isinstance(keepdim, bool):
        raise TypeError(f"keepdim must be a bool, got {type(keepdim).__name__}")
    if dim is None:
        rows = x.reshape(1, -1)
        out_shape = (1,) * x.dim() if keepdim else ()
    else:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim must be an int or None, got {type(dim).__name__}")
        if x.dim() == 0 or not -x.dim() <= dim < x.dim():
            raise ValueError(f"dim={dim} is out of range for x of shape {tuple(x.shape)}")
        dim %= x.dim()
        moved = x.movedim(dim, -1)
        rows = moved.reshape(math.prod(moved.shape[:-1]), x.shape[dim])
        out_shape = list(x.shape)
        if keepdim:
            out_shape[dim] = 1
        else:
            del out_shape[dim]
        out_shape = tuple(out_shape)
    ones = torch.ones(rows.shape[1], 1, dtype=torch.float32, device=x.device)
    y = matmul(rows, ones, mul=None, acc=acc, kahan=kahan, rounding=rounding, saturate=saturate, sr_bits=sr_bits,
               generator=generator)
    return y.reshape(out_shape)


# --------------------------------------------------------------------------------------- dispatch
# Per op: its body in cpd/_impl.py and the index of the tensor whose device picks the CUDA engine;
# the Python autograd (backward, setup_context) used until the extension's C++ kernels are in.
_impl._core.register(
    {"cast": (_impl.cast, 0), "cast_out": (_impl.cast_out, 0), "encode": (_impl.encode, 0),
     "decode": (_impl.decode, 0), "arith": (_impl.arith, 1), "matmul": (_impl.matmul, 0)},
    {"cast": (_cast_backward, None), "arith": (_arith_backward, _arith_setup),
     "matmul": (_matmul_backward, _matmul_setup)})


_core = _impl._core
_direct = _impl.direct


def _ready() -> None:
    """Before each public call: the C++ kernels in, once the extension is loaded (a flag check
    after that)."""
    if not _core.done:
        _core.install()
