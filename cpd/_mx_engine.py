"""cpd.mx's custom ops (``cpd_mx::cast``, ``encode``, ``decode``) in Python: the bodies used until
(or where) the compiled extension's C++ kernels are registered, and their pure-torch path.

Once the CPU extension is loaded, its C++ kernels serve the ops (``cuda/cpu/mx_ops.cpp``: the CPU
loops of ``cuda/cpu/mx.cpp``, the CUDA kernels of ``cuda/kernels/mx.cu`` launched from C++, on a
GPU or through the host shim). The bodies here serve the calls before that (the first call, which
builds or loads the extension), a machine with no compiler, and a CUDA device the kernels cannot
serve; :func:`cpd._impl.CoreOps.register` binds each call to the engine of the tensor's device:

* :class:`cpd._impl.Extension` (the compiled CPU extension): the fused one-pass loops of
  ``cuda/cpu/mx.cpp`` (``torch.ops.cpd_mx_cpu.*``);
* any other engine, or a format the kernels do not take (:func:`fused`): pure torch,
  :mod:`cpd._mx_torch` (:func:`torch_body` is what the C++ kernels call for such a format).

All give the same bits. The loops see x with the block axis moved last as a contiguous
``(rows, n)`` matrix; the wrapper moves it back. NVFP4's tensor scale T is computed here, in
torch, and passed as a float.
"""

from __future__ import annotations

import math

import torch

from . import _impl, _mx_torch
from ._block_format import RULES, from_spec, fused
from .ops import draw_seed
from .rounding import Rounding

__all__ = ["fused", "pack_mode", "cast", "encode", "decode", "cast_seed", "torch_body", "RULES"]


def pack_mode(fmt, packed: bool) -> int:
    """What the loops pack (4, 6) or 0 (one code per byte; the wrapper packs when the block's
    codes do not fill whole bytes: an odd block of 4-bit codes, a block of 6-bit codes not a
    multiple of 4)."""
    bits = fmt.element.bits
    if packed and bits == 4 and fmt.block_size % 2 == 0:
        return 4
    if packed and bits == 6 and fmt.block_size % 4 == 0:
        return 6
    return 0


def _rows(x: torch.Tensor, fmt) -> tuple[torch.Tensor, tuple, int]:
    """x (float32) with the block axis last as a contiguous (rows, n) matrix, the moved shape's
    leading dims, and n."""
    xm = x.movedim(fmt.axis % x.dim(), -1)
    lead, n = tuple(xm.shape[:-1]), xm.shape[-1]
    return xm.reshape(math.prod(lead), n).contiguous(), lead, n


def _t(x, fmt) -> torch.Tensor:
    return _mx_torch.tensor_scale(x, fmt) if fmt.tensor_scale else torch.ones((), device=x.device)


def _seed_pair(seed: torch.Tensor, mode: Rounding) -> tuple[int, int]:
    if mode is not Rounding.STOCHASTIC:
        return 0, 0
    s, o = seed.tolist()
    return int(s), int(o)


def _core_args(fmt, t: float) -> tuple:
    return (_mx_torch.spec(fmt.element), _mx_torch.spec(fmt.scale), RULES[fmt.scale_rule], fmt.is_int,
            fmt.block_size, t)


# --------------------------------------------------------------------------------------- op bodies
def _engine_kind(engine, fmt) -> str:
    """"cpu" (the extension's loops) or "torch" (any other engine; None: another device)."""
    return "cpu" if isinstance(engine, _impl.Extension) and fused(fmt) else "torch"


def cast(engine, x, seed, fmt, mode: Rounding, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fake-quantized x; seed: the (seed, offset) pair (stochastic rounding). With ``out`` (a
    float32 tensor of x's shape) the result is written there (directly by the CPU kernel when
    the blocks run along out's contiguous last axis) and out is returned."""
    kind = _engine_kind(engine, fmt)
    if kind == "torch":
        y = _mx_torch.cast(x, fmt, mode, seed)
        return y if out is None else out.copy_(y)
    s, o = _seed_pair(seed, mode)
    x2, lead, n = _rows(x, fmt)
    t = float(_mx_torch.tensor_scale(x, fmt)) if fmt.tensor_scale else 1.0
    direct = out is not None and out.is_contiguous() and fmt.axis % x.dim() == x.dim() - 1
    y2 = torch.ops.cpd_mx_cpu.mx_cast(x2, *_core_args(fmt, t), mode.code, s, o, out if direct else None)
    if direct:
        return out
    y = y2.reshape(*lead, n).movedim(-1, fmt.axis % x.dim())
    return y.contiguous() if out is None else out.copy_(y)


def encode(engine, x, seed, fmt, mode: Rounding, packed: bool):
    """(codes, scale codes, T) as cpd/_mx_torch.encode gives them."""
    kind = _engine_kind(engine, fmt)
    if kind == "torch":
        return _mx_torch.encode(x, fmt, mode, seed, packed)
    s, o = _seed_pair(seed, mode)
    x2, lead, n = _rows(x, fmt)
    tt = _t(x, fmt)
    pack = pack_mode(fmt, packed)
    codes, scodes = torch.ops.cpd_mx_cpu.mx_encode(x2, *_core_args(fmt, float(tt)), mode.code, s, o, pack)
    if packed and not pack:
        codes = _mx_torch.pack(codes, fmt.element.bits)
    return codes.reshape(*lead, codes.shape[-1]), scodes.reshape(*lead, scodes.shape[-1]), tt


def decode(engine, codes, scales, t, fmt, n: int, packed: bool) -> torch.Tensor:
    """The float32 values (..., n) (block axis last) of codes and scale codes."""
    kind = _engine_kind(engine, fmt)
    if kind == "torch":
        return _mx_torch.decode(codes, scales, t, fmt, n, packed)
    bits = fmt.element.bits
    pack = bits if packed and bits in (4, 6) else 0
    lead = tuple(scales.shape[:-1])
    rows = math.prod(lead)
    c2 = codes.reshape(rows, codes.shape[-1]).contiguous()
    s2 = scales.reshape(rows, scales.shape[-1]).contiguous()
    tf = float(t) if fmt.tensor_scale else 1.0
    y = torch.ops.cpd_mx_cpu.mx_decode(c2, s2, _mx_torch.spec(fmt.element), _mx_torch.spec(fmt.scale),
                                       fmt.is_int, fmt.block_size, tf, n, pack)
    return y.reshape(*lead, n)


def cast_seed(seed: torch.Tensor, device) -> torch.Tensor:
    """cpd_mx::cast's scalar seed -> the (seed, offset) pair, as the pure-torch cast has always drawn
    it: a generator on the device seeded with it, then cpd.ops.draw_seed."""
    gen = torch.Generator(device=device).manual_seed(int(seed.item()))
    return draw_seed(gen, device)


_NO_SEED = torch.zeros(2, dtype=torch.int64)


def torch_body(op: str, *args):
    """The pure-torch op bodies the C++ kernels (cuda/cpu/mx_ops.cpp) call for a format the kernels
    do not take; ``args`` are the op's (the format as its op spec, the rounding as its code)."""
    if op == "decode":
        codes, scales, t, spec, n, packed = args
        return _mx_torch.decode(codes, scales, t, from_spec(spec), n, packed)
    x, seed, spec, rounding, *rest = args
    fmt, mode = from_spec(spec), Rounding.from_code(rounding)
    if op == "encode":
        return _mx_torch.encode(x, fmt, mode, seed, *rest)
    return _mx_torch.cast(x, fmt, mode, cast_seed(seed, x.device) if mode is Rounding.STOCHASTIC else _NO_SEED)
