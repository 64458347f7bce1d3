"""Launches of the fused wire kernels on CUDA tensors (``cuda/kernels/hop.cu``), on torch's
current stream, through :mod:`cpd._cuda`'s NVRTC compile and launch helpers (used as they are).

Everything stays on the device: the segments go up once per call as a small int64 tensor; no
gradient, code or accumulator crosses to the host. One thread per group of 8 elements.
"""

from __future__ import annotations

import ctypes

import torch

from .. import _cuda
from ..rounding import Rounding
from .wire import WireFormat

__all__ = ["encode", "hop", "decode"]

_FILE = "hop.cu"
_I, _LL = ctypes.c_int, ctypes.c_longlong


def _ptr(t: torch.Tensor):
    return (ctypes.c_void_p, t.data_ptr())


def _fmt(wf: WireFormat):
    f = wf.fmt
    return [(_I, f.exp), (_I, f.man), (_I, f.bias), (_I, f.specials.code), (_I, int(f.subnormals))]


def _segments(segs: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    segs = segs.to(torch.int64).reshape(-1, 3)
    starts = torch.zeros(segs.shape[0] + 1, dtype=torch.int64)
    if segs.shape[0]:
        starts[1:] = torch.cumsum(segs[:, 1], 0)
    return segs.to(device).contiguous(), starts.to(device), segs.shape[0], int(starts[-1])


def encode(x: torch.Tensor, segs: torch.Tensor, out: torch.Tensor, wf: WireFormat, rounding: Rounding,
           saturate: bool) -> None:
    rows, starts, k, total = _segments(segs, x.device)
    _cuda._launch(x, _FILE, "cpd_wire_encode", (total + 7) // 8,
                  [_ptr(x), _ptr(rows), _ptr(starts), (_I, k), (_LL, total), _ptr(out), *_fmt(wf),
                   (_I, rounding.code), (_I, int(saturate)), (_I, wf.bits), (_I, int(wf.raw32))])


def hop(recv, acc, n, wf: WireFormat, rounding: Rounding, saturate: bool, kahan: bool, recv_c, acc_c, carry: bool,
        sequential: bool) -> None:
    none = acc  # a valid pointer the kernel never reads when the flag is off
    _cuda._launch(acc, _FILE, "cpd_wire_hop", (n + 7) // 8,
                  [_ptr(recv), _ptr(recv_c if recv_c is not None else none), _ptr(acc),
                   _ptr(acc_c if acc_c is not None else none), (_LL, n), *_fmt(wf), (_I, rounding.code),
                   (_I, int(saturate)), (_I, wf.bits), (_I, int(wf.raw32)), (_I, int(kahan)),
                   (_I, int(recv_c is not None)), (_I, int(carry)), (_I, 1 if sequential else 0)])


def decode(data: torch.Tensor, segs: torch.Tensor, out: torch.Tensor, wf: WireFormat, inv: float) -> None:
    rows, starts, k, total = _segments(segs, out.device)
    _cuda._launch(out, _FILE, "cpd_wire_decode", (total + 7) // 8,
                  [_ptr(data), _ptr(rows), _ptr(starts), (_I, k), (_LL, total), _ptr(out), *_fmt(wf),
                   (_I, wf.bits), (_I, int(wf.raw32)), (ctypes.c_float, float(inv))])
