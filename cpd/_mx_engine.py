"""The bodies of cpd.mx's custom ops (``cpd_mx::cast``, ``encode``, ``decode``) over cpd's engines.

Per device type, cpd/mx.py registers these bodies with :func:`cpd._impl.register`, which binds
each call to the engine of the tensor's device (:mod:`cpd._impl`):

* :class:`cpd._impl.Extension` (the compiled CPU extension): the fused one-pass kernels of
  ``cuda/cpu/mx.cpp`` (``torch.ops.cpd_mx_cpu.*``);
* :class:`cpd._impl.Kernels` (CUDA, or the host shim in the tests): ``cuda/kernels/mx.cu``,
  launched through :class:`cpd._kernels.Launch`;
* :class:`cpd._impl.Fallback`, or a format the kernels do not take (:func:`fused`): pure torch,
  :mod:`cpd._mx_torch`.

All three give the same bits. The kernels see x with the block axis moved last as a contiguous
``(rows, n)`` matrix; the wrapper moves it back. A format travels as its op key (cpd/mx.py's
``_FORMATS``); NVFP4's tensor scale T is computed here, in torch, and passed as a float.
"""

from __future__ import annotations

import ctypes
import math

import torch

from . import _impl, _kernels, _mx_torch
from .ops import draw_seed
from .rounding import Rounding

__all__ = ["fused", "pack_mode", "mx_lanes", "cast", "encode", "decode", "KERNEL_FILE", "RULES"]

#: cpd/mx.py SCALE_RULES -> the core's RULE_* (cuda/include/cpd/block.h).
RULES = {"floor": 0, "ceil": 1, "even": 2, "amax": 3}
KERNEL_FILE = "mx.cu"


def fused(fmt) -> bool:
    """Whether the kernels take this format: its power-of-two scales 2^e have -127 <= e <= 127
    (so 2^-e is a float32 too); the other (exotic) scale formats take the pure-torch path."""
    return -127 <= fmt.scale.emin and fmt.scale.emax <= 127


def pack_mode(fmt, packed: bool) -> int:
    """What the kernels pack (4, 6) or 0 (one code per byte; the wrapper packs when the block's
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


# --------------------------------------------------------------------------------------- CUDA launches
_I, _LL, _ULL, _F = ctypes.c_int, ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_float


def _launch_args(fmt, t: float) -> list:
    el, sc = _mx_torch.spec(fmt.element), _mx_torch.spec(fmt.scale)
    return [*((_I, v) for v in el), *((_I, v) for v in sc), (_I, RULES[fmt.scale_rule]), (_I, int(fmt.is_int)),
            (_F, t)]


def mx_lanes(block_size: int) -> int:
    """The lanes of the group of a warp that works one block in cuda/kernels/mx.cu (its
    ``mx_lanes``): the block size rounded up to a power of two, at most 32."""
    return min(32, 1 << (block_size - 1).bit_length())


#: Consecutive blocks a group works per step (cuda/kernels/mx.cu CPD_MX_BATCH).
MX_BATCH = 4


def _grid(engine, blocks: int, block_size: int) -> dict:
    """The launch of ``blocks`` blocks of ``block_size`` elements, batches of MX_BATCH per group
    of mx_lanes lanes: the geometry's threads per thread block, but at least one whole group."""
    g = engine.geometry
    lanes = mx_lanes(block_size)
    threads = max(g.threads, lanes)
    return {"grid": (g.blocks(-(-blocks // MX_BATCH), threads // lanes), 1, 1), "block": (threads, 1, 1)}


def _ptr(t):
    return (ctypes.c_void_p, t.data_ptr())


def _row_bytes(L: int, pack: int) -> int:
    return (L + 1) // 2 if pack == 4 else (L + 3) // 4 * 3 if pack == 6 else L


def _kernel_quantize(engine, x2, fmt, t, mode, s, o, pack, encode: bool):
    rows, n = x2.shape
    nb = -(-n // fmt.block_size)
    common = [(_LL, rows), (_LL, n), (_LL, fmt.block_size), *_launch_args(fmt, t), (_I, mode.code),
              (_ULL, s & 0xFFFFFFFFFFFFFFFF), (_ULL, o & 0xFFFFFFFFFFFFFFFF)]
    if not encode:
        y = torch.empty_like(x2)
        if rows * n:
            engine.launcher(_kernels.Launch(KERNEL_FILE, "cpd_mx_cast", **_grid(engine, rows * nb, fmt.block_size),
                                            args=(_ptr(x2), _ptr(y), *common)), x2.device)
        return y
    rb = _row_bytes(nb * fmt.block_size, pack) if n else 0
    codes = torch.empty((rows, rb), dtype=torch.uint8, device=x2.device)
    scodes = torch.empty((rows, nb), dtype=torch.uint8, device=x2.device)
    if rows * n:
        engine.launcher(_kernels.Launch(KERNEL_FILE, "cpd_mx_encode", **_grid(engine, rows * nb, fmt.block_size),
                                        args=(_ptr(x2), _ptr(codes), _ptr(scodes), *common, (_I, pack),
                                              (_LL, rb))), x2.device)
    return codes, scodes


def _kernel_decode(engine, codes2, scodes2, fmt, t, n, pack):
    rows, nb = scodes2.shape
    y = torch.empty((rows, n), dtype=torch.float32, device=codes2.device)
    if rows * n:
        engine.launcher(_kernels.Launch(KERNEL_FILE, "cpd_mx_decode", **_grid(engine, rows * nb, fmt.block_size),
                                        args=(_ptr(codes2), _ptr(scodes2), _ptr(y), (_LL, rows), (_LL, n),
                                              (_LL, fmt.block_size), *_launch_args(fmt, t), (_I, pack),
                                              (_LL, codes2.shape[1]))), codes2.device)
    return y


# --------------------------------------------------------------------------------------- op bodies
def _engine_kind(engine, fmt) -> str:
    if engine is None or isinstance(engine, _impl.Fallback) or not fused(fmt):  # None: another device
        return "torch"
    return "cpu" if isinstance(engine, _impl.Extension) else "kernels"


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
    if kind == "cpu":
        y2 = torch.ops.cpd_mx_cpu.mx_cast(x2, *_core_args(fmt, t), mode.code, s, o, out if direct else None)
    else:
        y2 = _kernel_quantize(engine, x2, fmt, t, mode, s, o, 0, False)
    if direct and kind == "cpu":
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
    if kind == "cpu":
        codes, scodes = torch.ops.cpd_mx_cpu.mx_encode(x2, *_core_args(fmt, float(tt)), mode.code, s, o, pack)
    else:
        codes, scodes = _kernel_quantize(engine, x2, fmt, float(tt), mode, s, o, pack, True)
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
    if kind == "cpu":
        y = torch.ops.cpd_mx_cpu.mx_decode(c2, s2, _mx_torch.spec(fmt.element), _mx_torch.spec(fmt.scale),
                                           fmt.is_int, fmt.block_size, tf, n, pack)
    else:
        y = _kernel_decode(engine, c2, s2, fmt, tf, n, pack)
    return y.reshape(*lead, n)


def cast_seed(seed: torch.Tensor, device) -> torch.Tensor:
    """cpd_mx::cast's scalar seed -> the (seed, offset) pair, as the pure-torch cast has always drawn
    it: a generator on the device seeded with it, then cpd.ops.draw_seed."""
    gen = torch.Generator(device=device).manual_seed(int(seed.item()))
    return draw_seed(gen, device)

