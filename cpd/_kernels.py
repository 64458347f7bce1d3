"""Kernel launches as data: which kernel of ``cuda/kernels/*.cu``, its grid, and its parameter array.

One code path builds every launch of cpd's CUDA kernels; two launchers run it:

* :mod:`cpd._cuda` hands the parameter array to ``cuLaunchKernel`` on a GPU;
* :mod:`cpd._shim` hands the *same* array to the kernels compiled as host C++ (the tests, on any
  machine), which also checks every parameter's size against the kernel's C++ signature.

A launcher is a callable ``launcher(launch: Launch, device: torch.device) -> None``. The
functions below (``cast``, ``encode``, ``decode``, ``arith``, ``matmul``) take contiguous
tensors prepared by :mod:`cpd.ops`, a format as the 5-tuple ``(exp, man, bias, specials,
subnormals)``, the (seed, offset) pair as Python ints (passed to the kernels by value), the
launcher, and the launch geometry (:class:`Geometry`; tests pick odd ones).

Geometry: 1-D grids of ``threads`` threads (at most 256, the kernels' ``__launch_bounds__``),
``min(needed, max_blocks)`` blocks; every kernel loops grid-stride with 64-bit indices, so any
grid covers any size. The tiled matmul grid-strides over output tiles.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from .formats import FloatFormat

__all__ = ["Geometry", "Launch", "pack", "cast", "encode", "decode", "arith", "reduce_rows", "matmul", "MAX_THREADS",
           "CAST_KERNELS", "CODE_SUFFIX", "TILE_M", "TILE_N", "MATMUL_THREADS", "FAMILY_KERNELS",
           "matmul_family"]

#: __launch_bounds__ of every kernel (cuda/kernels/*.cu, CPD_THREADS).
MAX_THREADS = 256
#: Rounding.code -> the cast kernel specialized for that mode.
CAST_KERNELS = {0: "cpd_cast_nearest", 1: "cpd_cast_stochastic", 2: "cpd_cast_toward_zero", 3: "cpd_cast_up",
                4: "cpd_cast_down", 5: "cpd_cast_nearest_away", 6: "cpd_cast_odd"}
CODE_SUFFIX = {torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32"}
#: The tiled matmul (cuda/kernels/matmul.cu): a block of MATMUL_THREADS threads computes a tile of
#: TILE_M x TILE_N outputs on float32 lanes (a 4 x 4 register tile per thread) or of
#: GENERIC_TILE x GENERIC_TILE outputs on the generic steps (2 x 2 per thread); the grid counts the
#: smaller tiles (a block past the float32-lane tiles exits at once).
TILE_M, TILE_N, GENERIC_TILE, MATMUL_THREADS = 64, 64, 32, 256
#: The family kernels of matmul.cu (cpd/gemm.h gemm_family) and the side of their square output tile
#: (16 R: an R x R register tile per thread of 256).
FAMILY_KERNELS = {"chain": ("cpd_matmul_chain", 128), "lanes": ("cpd_matmul_lanes", 64),
                  "kahan": ("cpd_matmul_kahan", 64), "f32": ("cpd_matmul_f32", 64),
                  "kahan32": ("cpd_matmul_kahan32", 64), "fkahan32": ("cpd_matmul_fkahan32", 64),
                  "lanes16": ("cpd_matmul_lanes16", 64),
                  "kahan16": ("cpd_matmul_kahan16", 64), "lanesbf": ("cpd_matmul_lanesbf", 64),
                  "kahanbf": ("cpd_matmul_kahanbf", 64), "fusedbf": ("cpd_matmul_fusedbf", 64),
                  "fkahanbf": ("cpd_matmul_fkahanbf", 64), "fused16": ("cpd_matmul_fused16", 64),
                  "fkahan16": ("cpd_matmul_fkahan16", 64), "f32b": ("cpd_matmul_f32b", 64),
                  "ff32b": ("cpd_matmul_ff32b", 64), "sr": ("cpd_matmul_sr", 32)}


@dataclass(frozen=True)
class Geometry:
    """Threads per block and the most blocks of a launch (None: no limit but the work)."""

    threads: int = MAX_THREADS
    max_blocks: int | None = None

    def __post_init__(self):
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or not 1 <= self.threads <= MAX_THREADS:
            raise ValueError(f"threads must be an int in 1..{MAX_THREADS}, got {self.threads!r}")
        if self.max_blocks is not None and (isinstance(self.max_blocks, bool) or not isinstance(self.max_blocks, int)
                                            or self.max_blocks < 1):
            raise ValueError(f"max_blocks must be an int >= 1 or None, got {self.max_blocks!r}")

    def blocks(self, items: int, threads: int | None = None) -> int:
        """Blocks for ``items`` work items of one thread each (at least 1, at most max_blocks)."""
        t = threads or self.threads
        need = max(1, -(-items // t))
        return need if self.max_blocks is None else min(need, self.max_blocks)


#: The most dynamic shared memory a launch may ask for (cuda/include/cpd/launch.h DYNAMIC_SMEM_MAX:
#: 227 KiB, sm_90's per-block limit; the host shim's buffer has this size).
DYNAMIC_SMEM_MAX = 227 * 1024


@dataclass(frozen=True)
class Launch:
    """One kernel launch: kernel file and name, grid and block, the parameters as
    ``(ctypes type, value)`` pairs in the kernel's order, and the bytes of dynamic shared memory
    (``extern __shared__``: cpd/launch.h ``dynamic_smem``; 0 for kernels with static tiles only)."""

    kernel_file: str
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple
    smem: int = 0

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"kernel name {self.name!r} is not an identifier")
        if any(g < 1 for g in self.grid) or any(b < 1 for b in self.block):
            raise ValueError(f"{self.name}: grid {self.grid} and block {self.block} must be positive")
        if not 0 <= self.smem <= DYNAMIC_SMEM_MAX:
            raise ValueError(f"{self.name}: smem={self.smem} bytes of dynamic shared memory; allowed 0 to "
                             f"{DYNAMIC_SMEM_MAX} (cpd/launch.h DYNAMIC_SMEM_MAX)")


def pack(args) -> tuple[list, ctypes.Array, ctypes.Array]:
    """The ``void*[]`` array of cuLaunchKernel's ``kernelParams``: one pointer per parameter, to a
    ctypes object holding its value. Returns (holders, params, sizes); the holders must outlive
    the launch, ``sizes`` (size_t per parameter) is what the shim checks against the signature."""
    holders = [ctype(value) for ctype, value in args]
    params = (ctypes.c_void_p * max(1, len(holders)))(*(ctypes.addressof(h) for h in holders))
    sizes = (ctypes.c_size_t * max(1, len(holders)))(*(ctypes.sizeof(h) for h in holders))
    return holders, params, sizes


# --------------------------------------------------------------------------------------- parameters
_I, _LL, _ULL = ctypes.c_int, ctypes.c_longlong, ctypes.c_ulonglong


def _ptr(t: torch.Tensor):
    return (ctypes.c_void_p, t.data_ptr())


def _fmt(fmt) -> list:
    exp, man, bias, specials, subnormals = fmt
    return [(_I, exp), (_I, man), (_I, bias), (_I, specials), (_I, int(subnormals))]


def _seed(seed: int, offset: int) -> list:
    return [(_ULL, seed & 0xFFFFFFFFFFFFFFFF), (_ULL, offset & 0xFFFFFFFFFFFFFFFF)]


def _grid(blocks: int, threads: int) -> dict:
    return {"grid": (blocks, 1, 1), "block": (threads, 1, 1)}


# --------------------------------------------------------------------------------------- launches
def cast(x, out, fmt, mode: int, saturate: bool, sr_bits: int, seed: int, offset: int, launcher,
         geometry: Geometry = Geometry()) -> None:
    """out = cast(x) (float32, contiguous, same numel; out may be x)."""
    n = x.numel()
    if n == 0:
        return
    groups = -(-n // 4)  # 4 elements per thread and iteration
    launcher(Launch("cast.cu", CAST_KERNELS[mode], **_grid(geometry.blocks(groups), geometry.threads),
                    args=(_ptr(x), _ptr(out), (_LL, n), *_fmt(fmt), (_I, int(saturate)), (_I, sr_bits),
                          *_seed(seed, offset))), x.device)


def encode(x, codes, fmt, mode: int, saturate: bool, launcher, geometry: Geometry = Geometry()) -> None:
    """codes = encode(round(x)) for a deterministic mode; codes uint8 / int16 / int32."""
    n = x.numel()
    if n == 0:
        return
    launcher(Launch("cast.cu", f"cpd_encode_{CODE_SUFFIX[codes.dtype]}", **_grid(geometry.blocks(n), geometry.threads),
                    args=(_ptr(x), _ptr(codes), (_LL, n), *_fmt(fmt), (_I, mode), (_I, int(saturate)))), x.device)


def decode(codes, out, fmt, launcher, geometry: Geometry = Geometry()) -> None:
    n = codes.numel()
    if n == 0:
        return
    launcher(Launch("cast.cu", f"cpd_decode_{CODE_SUFFIX[codes.dtype]}", **_grid(geometry.blocks(n), geometry.threads),
                    args=(_ptr(codes), _ptr(out), (_LL, n), *_fmt(fmt))), codes.device)


def arith(op: int, a, b, c, out, fmt, mode: int, saturate: bool, sr_bits: int, seed: int, offset: int, launcher,
          geometry: Geometry = Geometry()) -> None:
    """out = round(a*b) (op 0), round(a+b) (1) or round(c + a*b) (2); all of out's numel."""
    n = out.numel()
    if n == 0:
        return
    launcher(Launch("cast.cu", "cpd_arith", **_grid(geometry.blocks(n), geometry.threads),
                    args=((_I, op), _ptr(a), _ptr(b), _ptr(c), _ptr(out), (_LL, n), *_fmt(fmt), (_I, mode),
                          (_I, int(saturate)), (_I, sr_bits), *_seed(seed, offset))), a.device)


def reduce_rows(x, out, w: int, k: int, kahan: bool, leader_comp: bool, cast_inputs: bool, fmt, mode: int,
                saturate: bool, sr_bits: int, seeds, launcher, geometry: Geometry = Geometry()) -> None:
    """out (n,) = the emulated allreduce of the rows of x (w, n) in one launch (cast.cu
    cpd_reduce_rows: k rows per group summed in order, the w / k group sums round the ring; k = 0:
    cpd_reduce_tree, the tree order);
    seeds: a contiguous int64 tensor on x's device holding the (seed, offset) pair of every add
    in draw order (read in stochastic mode only)."""
    n = out.numel()
    if n == 0:
        return
    if k == 0:  # the tree order (cpd_reduce_tree): every Kahan merge carries the sender's compensation
        launcher(Launch("cast.cu", "cpd_reduce_tree", **_grid(geometry.blocks(n), geometry.threads),
                        args=(_ptr(x), _ptr(out), (_LL, n), (_I, w), (_I, int(kahan)), (_I, int(cast_inputs)),
                              *_fmt(fmt), (_I, mode), (_I, int(saturate)), (_I, sr_bits), _ptr(seeds))), x.device)
        return
    launcher(Launch("cast.cu", "cpd_reduce_rows", **_grid(geometry.blocks(n), geometry.threads),
                    args=(_ptr(x), _ptr(out), (_LL, n), (_I, w), (_I, k), (_I, int(kahan)), (_I, int(leader_comp)),
                          (_I, int(cast_inputs)), *_fmt(fmt), (_I, mode), (_I, int(saturate)), (_I, sr_bits),
                          _ptr(seeds))), x.device)


# ------------------------------------------------------------------------------ matmul families
_F32_MAX_EXP = 128  # float32's overflow exponent: a format value must be below 2^128


def _fast(f) -> bool:  # cpd/format.h fast_path_applies
    qsub = f.emin - f.man
    return 0 <= f.man <= 23 and f.emin >= -126 and -149 <= qsub <= 31 and f.max < 2.0 ** _F32_MAX_EXP


def _plain_convention(core_specials: int) -> bool:  # cpd/arith.h plain_convention (IEEE, FN, FINITE; signed)
    return core_specials <= 2


def _nearest_f(f, cs: int) -> bool:  # cpd/arith.h nearest_f_applies (mode NEAREST checked by the caller)
    return _fast(f) and 1 <= f.man <= 21 and f.emax + 24 - f.man <= 127 and _plain_convention(cs)


def _add_fast(f, cs: int) -> bool:  # cpd/arith.h add_fast_applies
    return _fast(f) and f.man <= 10 and f.emin - f.man >= -126 and _plain_convention(cs)


def _values_within(m, f) -> bool:  # cpd/arith.h values_within
    m_min_exp = m.emin - m.man if m.subnormals else m.emin
    return (m.man <= f.man and m.max <= f.max and m.emin - m.man >= f.emin - f.man
            and (f.subnormals or m_min_exp >= f.emin))


def _sr_lane(spec) -> bool:  # cpd/accumulate.h sr_lane_applies
    return _fast(FloatFormat.from_core(*spec)) and spec[1] <= 10 and _plain_convention(spec[3])


def matmul_family(mul, acc, kahan: bool, block: int, mode: int, saturate: bool) -> str:
    """Which kernel of matmul.cu runs a spec: "chain", "f32", "kahan32", "fkahan32", "lanes16",
    "kahan16", "lanes", "kahan", "lanesbf", "kahanbf", "fusedbf", "fkahanbf", "fused16",
    "fkahan16", "f32b", "ff32b", "sr" (the family kernels) or "tiled" (the generic steps). The
    conditions are cpd/gemm.h's gemm_family, whose kernels also check them on the device (a spec
    outside a kernel's family gets the generic steps' bits there, only slower)."""
    if mode == 1:  # STOCHASTIC: gemm_sr_applies (any Kahan / blocks)
        return "sr" if _sr_lane(acc) and (mul is None or _sr_lane(mul)) else "tiled"
    if mode != 0:  # NEAREST
        return "tiled"
    af = FloatFormat.from_core(*acc)
    # gemm.h is_f32_range_format: BF16, TF32, ... (float32's exponent range, <= 11 bits)
    bfloat16 = acc[0] == 8 and 1 <= acc[1] <= 10 and tuple(acc[2:4]) == (127, 0) and bool(acc[4]) and not saturate
    fp32 = tuple(acc[:4]) == (8, 23, 127, 0) and bool(acc[4]) and not saturate    # gemm.h is_float32_format
    if block:  # gemm_f32_applies with blocks: float32 accumulators only
        if not fp32:
            return "tiled"
        if mul is None:
            return "ff32b"
        mf = FloatFormat.from_core(*mul)
        return "f32b" if _nearest_f(mf, mul[3]) and mf.subnormals and _values_within(mf, af) else "tiled"
    if mul is None:
        if bfloat16:  # gemm_fbf16_applies
            return "fkahanbf" if kahan else "fusedbf"
        if tuple(acc[:4]) == (5, 10, 15, 0) and bool(acc[4]) and not saturate:  # gemm_fh16_applies
            return "fkahan16" if kahan else "fused16"
        return ("fkahan32" if kahan else "chain") if fp32 else "tiled"  # gemm_f32_applies / gemm_chain_applies
    mf = FloatFormat.from_core(*mul)
    if fp32 and _nearest_f(mf, mul[3]) and mf.subnormals and _values_within(mf, af):  # gemm_f32_applies
        return "kahan32" if kahan else "f32"
    if (_nearest_f(mf, mul[3]) and _nearest_f(af, acc[3]) and _add_fast(af, acc[3]) and _values_within(mf, af)):
        binary16 = tuple(acc[:4]) == (5, 10, 15, 0) and bool(acc[4]) and not saturate  # gemm.h is_binary16_format
        family = "kahan" if kahan else "lanes"
        return family + "16" if binary16 and mf.subnormals else family
    if bfloat16 and _nearest_f(mf, mul[3]) and mf.subnormals and _values_within(mf, af):  # gemm_bf16_applies
        return "kahanbf" if kahan else "lanesbf"
    return "tiled"


def matmul(a, b, out, mul, acc, kahan: bool, block: int, mode: int, saturate: bool, sr_bits: int, seed: int,
           offset: int, launcher, geometry: Geometry = Geometry(), kernel: str = "auto") -> None:
    """out (B, M, N) = the accumulated a (B, M, K) @ b (B, K, N); ``mul`` None for exact products.

    ``kernel``: "auto" (the family kernel of :func:`matmul_family`, else "tiled"), "tiled"
    (shared-memory tiles on the generic steps), "simple" (one thread per output), or a family
    kernel by name (:data:`FAMILY_KERNELS`); every one gives the same bits."""
    B, M, K = a.shape
    N = b.shape[2]
    if out.numel() == 0:
        return
    dims = [(_LL, B), (_LL, M), (_LL, K), (_LL, N)]
    rest = [(_I, int(mul is not None)), *_fmt(mul if mul is not None else acc), *_fmt(acc), (_I, int(kahan)),
            (_I, block), (_I, mode), (_I, int(saturate)), (_I, sr_bits), *_seed(seed, offset)]
    if kernel == "auto":
        kernel = matmul_family(mul, acc, kahan, block, mode, saturate)
    if kernel in FAMILY_KERNELS:
        name, side = FAMILY_KERNELS[kernel]
        grid = _grid(geometry.blocks(B * -(-M // side) * -(-N // side), 1), MATMUL_THREADS)
    elif kernel == "simple":
        grid = _grid(geometry.blocks(out.numel()), geometry.threads)
        name = "cpd_matmul_simple"
    elif kernel == "tiled":
        tiles = B * -(-M // GENERIC_TILE) * -(-N // GENERIC_TILE)
        grid = _grid(geometry.blocks(tiles, 1), MATMUL_THREADS)
        name = "cpd_matmul_tiled"
    else:
        raise ValueError(f"kernel must be 'auto', 'tiled', 'simple' or one of {sorted(FAMILY_KERNELS)}, "
                         f"got {kernel!r}")
    launcher(Launch("matmul.cu", name, **grid, args=(_ptr(a), _ptr(b), _ptr(out), *dims, *rest)), a.device)
