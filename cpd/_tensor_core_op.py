"""The op behind :func:`cpd.tensor_core_matmul`: ``torch.ops.cpd.fused_dot_matmul``.

One op for every algorithm of ``cuda/include/cpd/fused_dot.h`` (NVIDIA tensor cores, AMD matrix
cores, Blackwell's block-scaled kinds), registered per dispatch key as :mod:`cpd.ops` does: the
CPU extension's loops and the autograd node from C++ once the extension is loaded
(``cuda/cpu/fused_dot.cpp``; Python bodies before that), the CUDA kernel
(``cuda/kernels/fused_dot.cu``) launched from C++ (``cuda/cpu/launch.cpp`` cpd_launch::fused_dot;
from Python through cpd._cuda's NVRTC loader without the extension or under
``CPD_CUDA_LAUNCH=python``), and the pure-torch fallback (:mod:`cpd._fused_dot_ref`) on other
devices or without the extension. Under :func:`cpd._shim.on_host` the C++ CPU kernel runs the CUDA
kernels through the host shim with the GPU's marshalling (tests/test_fused_dot_launch.py).

Operands are ``a`` (..., M, K) and ``b`` (..., K, N) float32 values of the input formats;
block-scaled operands add ``sa`` (..., M, ceil(K/block)) and ``sb`` (..., ceil(K/block), N)
(float32 scale values; empty tensors when there are none). Autograd is straight-through for
``a`` and ``b`` (the gradients of the exact float32 product); scales get none.
"""

from __future__ import annotations

import ctypes
import math
import os

import torch

from . import _cpu, _cuda, _fused_dot_ref, _impl, _kernels, _shim
from .ops import _batch_shape, _sum_to

__all__ = ["fused_dot_matmul"]


def _run(a, b, sa, sb, block, s_emin, p, fields, body):
    """Broadcast the batch dims, make every operand contiguous (B, M, K) / (B, K, N), run ``body``."""
    batch = _batch_shape(a.shape, b.shape)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    B = math.prod(batch)
    a3 = a.expand(*batch, M, K).reshape(B, M, K).contiguous()
    b3 = b.expand(*batch, K, N).reshape(B, K, N).contiguous()
    if sa.numel():
        nb = sa.shape[-1]
        sa = sa.expand(*batch, M, nb).reshape(B, M, nb).contiguous()
        sb = sb.expand(*batch, nb, N).reshape(B, nb, N).contiguous()
    return body(a3, b3, sa, sb, block, s_emin, p, fields).reshape(*batch, M, N)


def _torch_body(a3, b3, sa, sb, block, s_emin, p, _fields):
    return _fused_dot_ref.matmul_torch(a3, b3, p, sa, sb, block, s_emin)


# Defined with torch.library and Python kernels per dispatch key (custom_op's Python layers cost
# ~50 us a call): the pure-torch body for any device, the CPU and CUDA bodies below.
_LIB = torch.library.Library("cpd", "FRAGMENT")
_LIB.define("fused_dot_matmul(Tensor a, Tensor b, Tensor sa, Tensor sb, int block, int s_emin, int group, int frac, "
            "int out, int a_emin, int b_emin, int zero_exp, int algo, int ftz, int a_man, int a_emax, int b_man, "
            "int b_emax) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))


def _op(a, b, sa, sb, block, s_emin, group, frac, out, a_emin, b_emin, zero_exp, algo, ftz, a_man, a_emax, b_man,
        b_emax):
    """a (..., M, K) @ b (..., K, N) under the fused-dot model (devices other than CPU and CUDA)."""
    p = _fused_dot_ref.Params(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz)
    return _run(a, b, sa, sb, block, s_emin, p, (a_man, a_emax, b_man, b_emax), _torch_body)


_LIB.impl("fused_dot_matmul", _op, "CompositeExplicitAutograd")


def _cpu_body(a3, b3, sa, sb, block, s_emin, p, fields):
    if _cpu.extension() is None:  # loading the extension registers torch.ops.cpd_fused_dot
        return _torch_body(a3, b3, sa, sb, block, s_emin, p, fields)
    return torch.ops.cpd_fused_dot.matmul(a3, b3, sa, sb, block, s_emin, *p, *fields, 0)


def _cuda_body(a3, b3, sa, sb, block, s_emin, p, fields):
    if isinstance(_impl.cuda_engine(a3.device), _impl.Fallback):  # no NVRTC / driver for this device
        return _torch_body(a3, b3, sa, sb, block, s_emin, p, fields)
    return _cuda_matmul(a3, b3, sa, sb, block, s_emin, p, fields)


def _params(args):
    group, frac, out, a_emin, b_emin, zero_exp, algo, ftz = args[:8]
    return _fused_dot_ref.Params(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz), tuple(args[8:])


def _cpu_kernel(a, b, sa, sb, block, s_emin, *args):
    p, fields = _params(args)
    return _run(a, b, sa, sb, block, s_emin, p, fields, _cpu_body)


def _cuda_kernel(a, b, sa, sb, block, s_emin, *args):
    p, fields = _params(args)
    return _run(a, b, sa, sb, block, s_emin, p, fields, _cuda_body)


# The CUDA kernel in Python on a library of its own: once the extension is loaded and the device's
# kernels are usable, _install_cuda() destroys it and the extension registers the C++ launch
# (cuda/cpu/launch.cpp cpd_launch::fused_dot; CPD_CUDA_LAUNCH=python keeps this one).
_CUDA = torch.library.Library("cpd", "IMPL")
_CUDA.impl("fused_dot_matmul", _cuda_kernel, "CUDA")
# The CPU kernel and autograd in Python, on a library of their own: once the extension is loaded,
# _install() destroys it and the extension registers both from C++ (cuda/cpu/fused_dot.cpp).
_PY = torch.library.Library("cpd", "IMPL")
_PY.impl("fused_dot_matmul", _cpu_kernel, "CPU")


@torch.library.register_fake("cpd::fused_dot_matmul", lib=_LIB)
def _(a, b, sa, sb, *args):
    return a.new_empty((*_batch_shape(a.shape, b.shape), a.shape[-2], b.shape[-1]))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])


def _backward(ctx, grad):
    """Straight-through: the gradients of the exact float32 product (as :func:`cpd.matmul`)."""
    a, b = ctx.saved_tensors
    ga = _sum_to(torch.matmul(grad, b.transpose(-1, -2)), a.shape) if ctx.needs_input_grad[0] else None
    gb = _sum_to(torch.matmul(a.transpose(-1, -2), grad), b.shape) if ctx.needs_input_grad[1] else None
    return (ga, gb) + (None,) * 16


torch.library.register_autograd("cpd::fused_dot_matmul", _backward, setup_context=_setup, lib=_PY)
_installed = False


def _install() -> None:
    """The C++ CPU and autograd kernels, once the extension is loaded (never builds it): a call
    then has no Python below :func:`fused_dot_matmul` (the Python ones cost ~60 us a call)."""
    global _PY, _installed
    state = _cpu.loaded()
    if state is None:
        return
    ext = state[0]
    install = getattr(torch.ops.cpd_fused_dot, "install", None) if ext is not None else None
    if install is not None:
        _PY._destroy()
        _PY = None
        install()
    _installed = True


_cuda_done = False


def _install_cuda(device: torch.device) -> None:
    """The C++ CUDA kernel (cpd_launch::fused_dot), on the first CUDA call whose device can run the
    kernels (building the extension once); the Python launch stays for CPD_CUDA_LAUNCH=python, a
    device the kernels cannot serve (the pure-torch fallback) or an extension without it."""
    global _CUDA, _cuda_done
    _cuda_done = True
    if os.environ.get("CPD_CUDA_LAUNCH", "cpp") == "python":
        return
    if isinstance(_impl.cuda_engine(device), _impl.Fallback):
        return
    ext = _cpu.extension()
    install = getattr(torch.ops.cpd_fused_dot, "install_cuda", None) if ext is not None else None
    if install is None or not hasattr(ext, "set_launch_sources"):
        return
    ext.set_launch_sources(_cuda.image_for, _shim.entry)  # as cpd._impl.CoreOps.install (idempotent)
    _CUDA._destroy()
    _CUDA = None
    install()


def launch_of(a3, b3, y, sa, sb, block, s_emin, p: _fused_dot_ref.Params, blocks: int):
    """The :class:`cpd._kernels.Launch` of cuda/kernels/fused_dot.cu (one thread per output,
    grid-stride) for contiguous a3 (B, M, K), b3 (B, K, N) into y (B, M, N): what the CUDA path
    hands to the driver and the tests to the host shim (``cpd._shim.launch``)."""
    B, M, K = a3.shape
    N = b3.shape[2]
    i, ll, ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
    scaled = sa.numel() > 0
    nb = sa.shape[-1] if scaled else 0
    args = [(ptr, a3.data_ptr()), (ptr, b3.data_ptr()), (ptr, y.data_ptr()), (ptr, sa.data_ptr() if scaled else 0),
            (ptr, sb.data_ptr() if scaled else 0), (ll, B), (ll, M), (ll, K), (ll, N), (ll, nb), (i, block),
            (i, s_emin), (i, p.group), (i, p.frac), (i, p.out), (i, p.a_emin), (i, p.b_emin), (i, p.zero_exp),
            (i, p.algo), (i, p.ftz)]
    return _kernels.Launch("fused_dot.cu", "cpd_fused_dot_matmul", (blocks, 1, 1), (256, 1, 1), tuple(args))


def tiled_kernel(p: _fused_dot_ref.Params, fields, block: int = 0) -> str | None:
    """The tiled kernel family of cuda/kernels/fused_dot.cu for a spec (its name without the tile
    shape's suffix), or None (the per-output kernel): ``cpd::fd_tiled_applies`` and
    ``cpd::fd_tiled_wide`` of cuda/include/cpd/fused_dot_tiled.h (mirrored here;
    tests/test_fused_dot_tiled.py checks both choices on the host shim). ``block``: 0 without block
    scales, else the elements per scale along K. Blackwell's kind::mxf4 / mxf4nvf4
    (``nvidia_chunk16``: e2m1 elements, groups of a multiple of 16 up to 256, F <= 40, float32
    out, with scales) take ``cpd_fused_dot_tiled_c16`` (``cpd::fd_c16_applies``); AMD's CDNA1 /
    CDNA2 (``amd_pairwise``, groups of 2 or 4) ``cpd_fused_dot_tiled_amdp`` (``amdpz`` with
    CDNA2's flushes: ``cpd::fd_amdp_applies``); CDNA3's fp16 / bf16 / xf32 (``amd_cdna3``, groups
    of 8 or 4) ``cpd_fused_dot_tiled_l8a`` / ``l4a`` (``cpd::fd_amdrd_applies``) and its fp8 / bf8
    (``amd_cdna3_fp8``, groups of 16) ``cpd_fused_dot_tiled_l16a`` (``cpd::fd_amdrd8_applies``)."""
    a_man, b_man = fields[0], fields[2]
    g = p.group
    if p.algo == CHUNK16:
        applies = (16 <= g <= 256 and g % 16 == 0 and 0 <= p.frac <= 40 and p.out == 0 and a_man == b_man == 1
                   and block >= 16)
        return "cpd_fused_dot_tiled_c16" if applies else None
    if p.algo == AMD_PAIRWISE:  # cpd::fd_amdp_applies: CDNA1 / CDNA2, groups of 2 or 4, no scales
        return f"cpd_fused_dot_tiled_amdp{'z' if p.ftz else ''}" if g in (2, 4) and block == 0 else None
    if p.algo in (AMD_RD, AMD_RD_FP8):  # cpd::fd_amdrd_applies: CDNA3 fp16 / bf16 (L 8), xf32 (L 4);
        # cpd::fd_amdrd8_applies: fp8 / bf8 (L 16); no scales
        applies = (g in ((4, 8) if p.algo == AMD_RD else (16,)) and 0 <= a_man <= 23 and 0 <= b_man <= 23
                   and a_man + b_man <= 24 and p.zero_exp >= -255 and p.out == 0)
        return f"cpd_fused_dot_tiled_l{g}a" if applies and block == 0 else None
    wide = p.frac + 2 + (g + 1 - 1).bit_length() > 30
    if not (p.algo == 0 and g in (4, 8, 16, 32) and p.frac >= a_man + b_man and p.frac <= 26
            and p.zero_exp >= -255 and a_man <= 23 and b_man <= 23 and (g > 4 or not wide)
            and (block == 0 or (block > 0 and g == 32 and wide and block % g == 0))):
        return None
    return f"cpd_fused_dot_tiled_l{g}{'w' if wide else ''}{'s' if block else ''}"


#: fused_dot.h's FD_NV_CHUNK16 (Blackwell's kind::mxf4 / mxf4nvf4) and FD_AMD_PAIRWISE (CDNA1 /
#: CDNA2): tiled families of their own, on raw elements (:func:`raw_layout`).
CHUNK16 = _fused_dot_ref.ALGORITHMS["nvidia_chunk16"]
AMD_PAIRWISE = _fused_dot_ref.ALGORITHMS["amd_pairwise"]
#: FD_AMD_RD (CDNA3 fp16 / bf16 / xf32): the NVIDIA kernels' words and passes (cpd_fused_dot_tiled_l8a / l4a).
AMD_RD = _fused_dot_ref.ALGORITHMS["amd_cdna3"]
#: FD_AMD_RD_FP8 (CDNA3 fp8 / bf8): the same with even / odd halves (cpd_fused_dot_tiled_l16a).
AMD_RD_FP8 = _fused_dot_ref.ALGORITHMS["amd_cdna3_fp8"]


def raw_layout(algo: int) -> bool:
    """Whether an algorithm's tiled kernels stage raw elements (fused_dot.cu FdC16Shape: the chunk16
    and AMD pairwise families) rather than decomposed words (FdShape)."""
    return algo in (CHUNK16, AMD_PAIRWISE)


#: The tiled kernels' shapes (fused_dot.cu FdShape and CPD_FD_TILED_SHAPES; the comment there says
#: why): suffix -> (stages, K slice depth in groups of 16 or more elements: slice_groups). Which
#: of them a compile builds depends on the GPU (:func:`shapes_of`).
TILE_SHAPES = {"s1": (1, 1), "s2": (2, 1), "s2g2": (2, 2)}


def shapes_of(group: int, block: int = 0, major: int | None = None, raw: bool = False) -> tuple[str, ...]:
    """The tile shapes built for the family of ``group`` (and block scales, ``block`` > 0;
    ``raw``: the chunk16 and AMD pairwise families, :func:`raw_layout`) by a compile for a GPU
    of compute capability ``major`` (fused_dot.cu CPD_FD_ONE_STAGE / CPD_FD_TWO_STAGES), or by
    the host shim (None: every shape, for the tests). s2 is built only where s2g2 may not fit
    beside it (L 32 without scales: 130 KiB against 99 KiB GPUs); before sm_80 (no cp.async)
    only s1; from sm_80 no s1 but the scaled L 32 family's (its s2g2 needs 130 KiB)."""
    every = ("s1", "s2", "s2g2") if group == 32 and not block and not raw else ("s1", "s2g2")
    if major is None:
        return every
    if major < 8:
        return ("s1",)
    return tuple(s for s in every if s != "s1" or (group == 32 and block and not raw))


def slice_groups(group: int, shape: str) -> int:
    """Groups of ``group`` per K slice of a shape (fused_dot.cu CPD_FD_GROUPS): its depth times
    one group of 16 or 32, or times 16 / L groups of 4 or 8."""
    depth = TILE_SHAPES[shape][1]
    return depth if group >= 16 else depth * (16 // group)


def tile_smem(group: int, shape: str, raw: bool = False) -> int:
    """Bytes of dynamic shared memory of a tiled kernel (fused_dot.cu FdShape<L, S, G>::BYTES): rows
    of 64 words, 4 L G of exponents and words, 4 G of sign and flag words, and 2 S L G of raw stages
    when S > 1 (one stage is decomposed in place). ``raw`` (:func:`raw_layout`: FdC16Shape): per
    stage, K slices of 32 elements per depth, A's rows of 68 words, B's of 64, and two flag rows."""
    stages = TILE_SHAPES[shape][0]
    if raw:
        ks = 32 * TILE_SHAPES[shape][1]
        return stages * (ks * (68 + 64) + 2 * 64) * 4
    groups = slice_groups(group, shape)
    ks = group * groups
    return (4 * ks + 4 * groups + (2 * stages * ks if stages > 1 else 0)) * 64 * 4


def tile_shape(capability: tuple[int, int], smem_optin: int, group: int, block: int = 0,
               raw: bool = False) -> str | None:
    """The tile shape for a GPU of compute ``capability`` whose blocks may take ``smem_optin``
    bytes of shared memory, among those built for it (:func:`shapes_of`): two stages where
    cp.async exists (sm_80+), slices of twice the depth where they fit (sm_80, sm_87, sm_90,
    sm_100: 163-227 KiB; L <= 16 on sm_86, sm_89, sm_120: 99 KiB), else one; one stage before
    sm_80 (no cp.async). None where no built shape fits (the per-output kernel runs). Chosen by
    capacity; not yet timed on a GPU."""
    for shape in ("s2g2", "s2", "s1"):
        if shape in shapes_of(group, block, capability[0], raw) and tile_smem(group, shape, raw) <= smem_optin:
            return shape
    return None


def tiled_launch_of(a3, b3, y, p: _fused_dot_ref.Params, fields, kernel: str, blocks: int, shape: str = "s1",
                    sa=None, sb=None, block: int = 1, s_emin: int = -127):
    """The :class:`cpd._kernels.Launch` of a tiled kernel (:func:`tiled_kernel`) in a tile shape
    (:data:`TILE_SHAPES`): 256 threads per block, a 64 x 64 output tile each, grid-stride over the
    tiles, :func:`tile_smem` bytes of dynamic shared memory; block scales ``sa`` (B, M, nb) and
    ``sb`` (B, nb, N), one per ``block`` elements along K, or None."""
    scaled = sa is not None and sa.numel() > 0
    built = shapes_of(p.group, block if scaled else 0, raw=raw_layout(p.algo))
    if shape not in built:
        raise ValueError(f"tiled_launch_of: shape={shape!r}; allowed {list(built)} for {kernel}")
    B, M, K = a3.shape
    N = b3.shape[2]
    i, ll, ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
    args = [(ptr, a3.data_ptr()), (ptr, b3.data_ptr()), (ptr, y.data_ptr()), (ptr, sa.data_ptr() if scaled else 0),
            (ptr, sb.data_ptr() if scaled else 0), (ll, B), (ll, M), (ll, K), (ll, N),
            (ll, sa.shape[-1] if scaled else 0), (i, block if scaled else 1), (i, s_emin if scaled else -127),
            (i, p.group), (i, p.frac), (i, p.out), (i, p.a_emin), (i, p.b_emin), (i, p.zero_exp), (i, p.algo),
            (i, p.ftz), (i, fields[0]), (i, fields[2])]
    return _kernels.Launch("fused_dot.cu", f"{kernel}_{shape}", (blocks, 1, 1), (256, 1, 1), tuple(args),
                           smem=tile_smem(p.group, shape, raw_layout(p.algo)))


#: Per-block shared memory (opt-in) by compute capability, where torch does not report it.
_SMEM_OPTIN = {(7, 0): 96 << 10, (7, 2): 96 << 10, (7, 5): 64 << 10, (8, 0): 163 << 10, (8, 6): 99 << 10,
               (8, 7): 163 << 10, (8, 9): 99 << 10, (9, 0): 227 << 10, (10, 0): 227 << 10, (12, 0): 99 << 10}


def _device_shape(device: torch.device, group: int, block: int = 0, raw: bool = False) -> str | None:
    props = torch.cuda.get_device_properties(device)
    cap = (props.major, props.minor)
    optin = getattr(props, "shared_memory_per_block_optin", None) or _SMEM_OPTIN.get(cap, 48 << 10)
    return tile_shape(cap, optin, group, block, raw)


def _cuda_matmul(a3, b3, sa, sb, block, s_emin, p: _fused_dot_ref.Params, fields=None) -> torch.Tensor:
    """Launch cuda/kernels/fused_dot.cu on the device: the tiled kernel where it applies
    (:func:`tiled_kernel`), else the per-output one (:func:`launch_of`)."""
    B, M, _ = a3.shape
    N = b3.shape[2]
    y = torch.empty((B, M, N), dtype=torch.float32, device=a3.device)
    if y.numel() == 0:
        return y
    sms = torch.cuda.get_device_properties(a3.device).multi_processor_count
    scaled = sa.numel() > 0
    kernel = None if fields is None else tiled_kernel(p, fields, block if scaled else 0)
    shape = None if kernel is None else _device_shape(a3.device, p.group, block if scaled else 0, raw_layout(p.algo))
    if shape is not None:
        tiles = B * ((M + 63) // 64) * ((N + 63) // 64)
        _cuda.launch(tiled_launch_of(a3, b3, y, p, fields, kernel, max(1, min(tiles, sms * 8)), shape, sa, sb, block,
                                     s_emin), a3.device)
        return y
    blocks = max(1, min((y.numel() + 255) // 256, sms * 32))
    _cuda.launch(launch_of(a3, b3, y, sa, sb, block, s_emin, p, blocks), a3.device)
    return y


def fused_dot_matmul(a, b, p: _fused_dot_ref.Params, fields, sa=None, sb=None, block: int = 1,
                     s_emin: int = -127) -> torch.Tensor:
    """Call the op (loading the CPU extension first where ``a`` is on the CPU)."""
    if not _installed:
        if a.is_cpu:
            _cpu.extension()  # loading the library registers torch.ops.cpd_fused_dot
        _install()
    if not _cuda_done and a.is_cuda:  # (not a.device.type: 0.9 us a read)
        _install_cuda(a.device)
    ext = _impl.direct(a, b, *(t for t in (sa, sb) if t is not None))
    if ext is not None:  # plain tensors, eager: "no block scales" is one cached empty tensor per device
        empty = None
        if sa is None or sb is None:
            empty = _EMPTY.get(a.device)
            if empty is None:
                empty = _EMPTY[a.device] = torch.empty((0,), dtype=torch.float32, device=a.device)
        return ext.call_fused_dot_matmul(a, b, empty if sa is None else sa, empty if sb is None else sb, block,
                                         s_emin, *p, *fields)
    empty = a.new_empty((0,))
    return torch.ops.cpd.fused_dot_matmul.default(a, b, empty if sa is None else sa, empty if sb is None else sb,
                                                  block, s_emin, *p, *fields)


_EMPTY: dict = {}  # device -> the empty tensor that stands for "no block scales" (never read or written)
