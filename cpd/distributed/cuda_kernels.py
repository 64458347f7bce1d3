"""Launches of the fused wire kernels on CUDA tensors (``cuda/kernels/hop.cu``), on torch's
current stream, through :mod:`cpd._cuda`'s NVRTC compile and launch (or, in the tests, through the
host shim :mod:`cpd._shim`, which runs the same kernel text on the CPU with the same parameter array).

Everything stays on the device: the segments go up once per call as a small int64 tensor; no
gradient, code or accumulator crosses to the host. One thread per group of 8 elements.
"""

from __future__ import annotations

import ctypes

import torch

from .. import _cuda, _kernels
from ..rounding import Rounding
from .wire import WireFormat

__all__ = ["encode", "hop", "decode"]

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


def _segments(segs: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    segs = segs.to(torch.int64).reshape(-1, 3)
    starts = torch.zeros(segs.shape[0] + 1, dtype=torch.int64)
    if segs.shape[0]:
        starts[1:] = torch.cumsum(segs[:, 1], 0)
    return segs.to(device).contiguous(), starts.to(device), segs.shape[0], int(starts[-1])


def encode(x: torch.Tensor, segs: torch.Tensor, out: torch.Tensor, wf: WireFormat, rounding: Rounding,
           saturate: bool, launcher=None) -> None:
    rows, starts, k, total = _segments(segs, x.device)
    _launch("cpd_wire_encode", (total + 7) // 8,
            [_ptr(x), _ptr(rows), _ptr(starts), (_I, k), (_LL, total), _ptr(out), *_fmt(wf),
             (_I, rounding.code), (_I, int(saturate)), (_I, wf.bits), (_I, int(wf.raw32))], x.device, launcher)


def hop(recv, acc, n, wf: WireFormat, rounding: Rounding, saturate: bool, kahan: bool, recv_c, acc_c, carry: bool,
        sequential: bool, launcher=None) -> None:
    none = acc  # a valid pointer the kernel never reads when the flag is off
    _launch("cpd_wire_hop", (n + 7) // 8,
            [_ptr(recv), _ptr(recv_c if recv_c is not None else none), _ptr(acc),
             _ptr(acc_c if acc_c is not None else none), (_LL, n), *_fmt(wf), (_I, rounding.code),
             (_I, int(saturate)), (_I, wf.bits), (_I, int(wf.raw32)), (_I, int(kahan)),
             (_I, int(recv_c is not None)), (_I, int(carry)), (_I, 1 if sequential else 0)], acc.device, launcher)


def decode(data: torch.Tensor, segs: torch.Tensor, out: torch.Tensor, wf: WireFormat, inv: float,
           launcher=None) -> None:
    rows, starts, k, total = _segments(segs, out.device)
    _launch("cpd_wire_decode", (total + 7) // 8,
            [_ptr(data), _ptr(rows), _ptr(starts), (_I, k), (_LL, total), _ptr(out), *_fmt(wf),
             (_I, wf.bits), (_I, int(wf.raw32)), (ctypes.c_float, float(inv))], out.device, launcher)
