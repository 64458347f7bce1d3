"""Launches of the fused wire kernels on CUDA tensors (``cuda/kernels/hop.cu``), on torch's
current stream.

Where the CPU extension is built, the launches are C++'s (``cuda/cpu/launch.cpp``: the parameter
block and the grid, ``cuLaunchKernel``; :func:`native` is the extension); without it (a GPU
machine with no host compiler, or ``CPD_CUDA_LAUNCH=python``) they are built here as
:class:`cpd._kernels.Launch`es for :mod:`cpd._cuda`'s launcher. Either runs through the host shim
:mod:`cpd._shim` in the tests (the C++ launches on CPU tensors; here ``launcher=_shim.launch``),
which runs the same kernel text on the CPU with the same parameter array.

Everything stays on the device: the segments go up once per call as a small int64 tensor; no
gradient, code or accumulator crosses to the host. One thread per group of 8 elements.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from .. import _cpu, _cuda, _kernels, _shim
from ..rounding import Rounding
from .wire import WireFormat

__all__ = ["encode", "hop", "decode", "native"]

_FILE = "hop.cu"
_I, _LL = ctypes.c_int, ctypes.c_longlong
#: Threads per block (the kernels' loops are grid-stride: any grid covers the work).
_THREADS = 256


def _ptr(t: torch.Tensor):
    return (ctypes.c_void_p, t.data_ptr())


def _fmt(wf: WireFormat):
    f = wf.fmt
    return [(_I, f.exp), (_I, f.man), (_I, f.bias), (_I, f.core_specials), (_I, int(f.subnormals))]


def _launch(name: str, groups: int, args: list, device, launcher) -> None:
    """One launch of ``name`` over ``groups`` groups of 8 elements, built as a :class:`cpd._kernels.Launch`
    (the marshalling every cpd kernel uses); ``launcher`` is :func:`cpd._cuda.launch` on a GPU, or
    :func:`cpd._shim.launch` to run the same kernel on the host (tests)."""
    launcher = launcher or _cuda.launch
    blocks = max(1, -(-groups // _THREADS))
    launcher(_kernels.Launch(_FILE, name, (blocks, 1, 1), (_THREADS, 1, 1), tuple(args)), device)


@functools.lru_cache(maxsize=1)
def native():
    """The extension whose C++ launches serve (None: the Python launches): given the NVRTC images
    and the shim's entry points (what cpd's op registration also hands it)."""
    ext = _cpu.extension()
    if ext is None or not hasattr(ext, "wire_launch_hop") or os.environ.get("CPD_CUDA_LAUNCH") == "python":
        return None
    ext.set_launch_sources(_cuda.image_for, _shim.entry)
    return ext


def _segments(segs: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    segs = segs.to(torch.int64).reshape(-1, 3)
    starts = torch.zeros(segs.shape[0] + 1, dtype=torch.int64)
    if segs.shape[0]:
        starts[1:] = torch.cumsum(segs[:, 1], 0)
    return segs.to(device).contiguous(), starts.to(device), segs.shape[0], int(starts[-1])


def encode(x: torch.Tensor, segs: torch.Tensor, out: torch.Tensor, wf: WireFormat, rounding: Rounding,
           saturate: bool, launcher=None) -> None:
    if launcher is None and native() is not None:
        native().wire_launch_encode(x, segs, out, list(wf.fargs), rounding.code, saturate, wf.bits, wf.raw32)
        return
    rows, starts, k, total = _segments(segs, x.device)
    _launch("cpd_wire_encode", (total + 7) // 8,
            [_ptr(x), _ptr(rows), _ptr(starts), (_I, k), (_LL, total), _ptr(out), *_fmt(wf),
             (_I, rounding.code), (_I, int(saturate)), (_I, wf.bits), (_I, int(wf.raw32))], x.device, launcher)


def hop(recv, acc, n, wf: WireFormat, rounding: Rounding, saturate: bool, kahan: bool, recv_c, acc_c, carry: bool,
        sequential: bool, launcher=None) -> None:
    if launcher is None and native() is not None:
        native().wire_launch_hop(recv, recv_c, acc, acc_c, n, list(wf.fargs), rounding.code, saturate, wf.bits,
                                 wf.raw32, kahan, carry, sequential)
        return
    none = acc  # a valid pointer the kernel never reads when the flag is off
    _launch("cpd_wire_hop", (n + 7) // 8,
            [_ptr(recv), _ptr(recv_c if recv_c is not None else none), _ptr(acc),
             _ptr(acc_c if acc_c is not None else none), (_LL, n), *_fmt(wf), (_I, rounding.code),
             (_I, int(saturate)), (_I, wf.bits), (_I, int(wf.raw32)), (_I, int(kahan)),
             (_I, int(recv_c is not None)), (_I, int(carry)), (_I, 1 if sequential else 0)], acc.device, launcher)


def decode(data: torch.Tensor, segs: torch.Tensor, out: torch.Tensor, wf: WireFormat, inv: float,
           launcher=None) -> None:
    if launcher is None and native() is not None:
        native().wire_launch_decode(data, segs, out, list(wf.fargs), wf.bits, wf.raw32, float(inv))
        return
    rows, starts, k, total = _segments(segs, out.device)
    _launch("cpd_wire_decode", (total + 7) // 8,
            [_ptr(data), _ptr(rows), _ptr(starts), (_I, k), (_LL, total), _ptr(out), *_fmt(wf),
             (_I, wf.bits), (_I, int(wf.raw32)), (ctypes.c_float, float(inv))], out.device, launcher)
