"""Host time per call of cpd's ops beside torch's own op of the same size (issue 28).

Run from the repository root:

    PYTHONPATH=. python benchmarks/bench_dispatch.py [--device cpu|cuda] [--reps 7] [--calls 2000]
                                                     [--clock wall|cpu] [--only SUBSTRING]

Method: each operation is called back to back ``calls`` times (after a warm-up), ``reps`` times,
interleaved with its baseline; the best (minimum) time per call of each is printed with their
ratio. On the GPU the time is the host's (no synchronisation inside the loop: what the Python
thread spends before the kernel is queued), then one synchronisation. The sizes run 2^10 to 2^24
floats for the casts (at large sizes the CPU figure is the kernel's, not the dispatch's); the
GEMM is 16x16x16, forward (operands that do not require grad) and forward + backward (operands
that do; ``y.backward(g)``), also with a tensor-core accumulator (Hopper's E4M3 fused dot); the
cast of 2^10 floats also forward + backward. Baselines: ``x.to(torch.bfloat16)`` (a cast with a new output),
``out.copy_(x)`` (writing into an existing tensor), ``torch.mm`` and its forward + backward.
The issue's goals (issue 28): on any CPU ``cpd.cast`` of 2^10 floats <= 3x ``x.to(bfloat16)``
with and without ``out=``, ``cpd.matmul`` 16^3 forward <= 30 us, forward + backward <= 80 us;
on a GPU host time <= 15 us per cast, <= 30 us per matmul forward.
``--clock cpu`` counts the calling thread's CPU time (``time.thread_time``), the figure to take
on a shared machine (with one torch thread, set here on the CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import cpd
from cpd import _cpu, mx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the shared table format
from _figures import Table  # noqa: E402


def machine(device: str) -> str:
    if device.startswith("cuda"):
        return f"GPU: {torch.cuda.get_device_name(device)}; host " + _cpu.cpu_model()
    return _cpu.machine_line() + f"; {torch.get_num_threads()} threads"


def per_call(fn, calls: int, device: str, clock) -> float:
    """Seconds per call of ``calls`` calls back to back (host time on a GPU)."""
    t = clock()
    for _ in range(calls):
        fn()
    dt = clock() - t
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return dt / calls


def best_pair(fn, base, calls: int, reps: int, device: str, clock) -> tuple[float, float]:
    for f in (fn, base):  # warm-up (and the one-time builds)
        for _ in range(20):
            f()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    tf = tb = float("inf")
    for _ in range(reps):
        tf = min(tf, per_call(fn, calls, device, clock))
        tb = min(tb, per_call(base, calls, device, clock))
    return tf, tb


def cases(device: str, sizes: list[int]):
    """(operation, size, baseline name, fn, baseline fn)."""
    out = []
    for n in sizes:
        x = torch.randn(n, device=device)
        y = torch.empty_like(x)
        calls_scale = max(1, n >> 14)  # fewer calls on large tensors
        to_bf16 = lambda x=x: x.to(torch.bfloat16)  # noqa: E731
        copy = lambda x=x, y=y: y.copy_(x)  # noqa: E731
        out += [(f"cpd.cast E5M2", n, "x.to(bfloat16)", lambda x=x: cpd.cast(x, cpd.E5M2), to_bf16, calls_scale),
                (f"cpd.cast E5M2, out=", n, "x.to(bfloat16)", lambda x=x, y=y: cpd.cast(x, cpd.E5M2, out=y), to_bf16,
                 calls_scale),
                (f"cpd.cast E5M2, out=", n, "out.copy_(x)", lambda x=x, y=y: cpd.cast(x, cpd.E5M2, out=y), copy,
                 calls_scale),
                (f"cpd.cast E5M2 stochastic", n, "x.to(bfloat16)", lambda x=x: cpd.cast(x, cpd.E5M2, "stochastic"),
                 to_bf16, calls_scale)]
        if n == 1 << 10:  # with autograd: the forward records the graph node, the backward runs it
            xg = x.clone().requires_grad_()
            gx = torch.ones_like(x)
            out.append((f"cpd.cast E5M2, forward + backward", n, "x.to(bfloat16) forward + backward",
                        lambda xg=xg, gx=gx: cpd.cast(xg, cpd.E5M2).backward(gx),
                        lambda xg=xg, gx=gx: xg.to(torch.bfloat16).backward(gx), calls_scale))
        if n >= 1 << 10:
            xm = x.reshape(-1, 32)
            ym = torch.empty_like(xm)
            out.append((f"cpd.mx.cast MXFP8_E4M3", n, "x.to(bfloat16)", lambda xm=xm: mx.cast(xm, mx.MXFP8_E4M3),
                        lambda xm=xm: xm.to(torch.bfloat16), calls_scale))
            out.append((f"cpd.mx.cast MXFP8_E4M3, out=", n, "out.copy_(x)",
                        lambda xm=xm, ym=ym: mx.cast(xm, mx.MXFP8_E4M3, out=ym), lambda xm=xm, ym=ym: ym.copy_(xm),
                        calls_scale))
    a, b = torch.randn(16, 16, device=device), torch.randn(16, 16, device=device)
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    g = torch.ones(16, 16, device=device)
    hopper = cpd.tensor_core("hopper")  # E4M3 operands (their casts included), the wgmma model
    out += [("cpd.matmul E4M3 x FP16, forward", 16, "torch.mm", lambda: cpd.matmul(a, b, mul=cpd.E4M3, acc=cpd.FP16),
             lambda: torch.mm(a, b), 1),
            ("cpd.matmul (default FP32), forward", 16, "torch.mm", lambda: cpd.matmul(a, b), lambda: torch.mm(a, b), 1),
            ("cpd.matmul E4M3 x FP16, forward + backward", 16, "torch.mm forward + backward",
             lambda: cpd.matmul(ag, bg, mul=cpd.E4M3, acc=cpd.FP16).backward(g),
             lambda: torch.mm(ag, bg).backward(g), 1),
            ("cpd.matmul tensor_core('hopper'), forward", 16, "torch.mm", lambda: cpd.matmul(a, b, acc=hopper),
             lambda: torch.mm(a, b), 1),
            ("cpd.matmul tensor_core('hopper'), forward + backward", 16, "torch.mm forward + backward",
             lambda: cpd.matmul(ag, bg, acc=hopper).backward(g), lambda: torch.mm(ag, bg).backward(g), 1)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--calls", type=int, default=2000, help="calls per repetition at 2^10 (fewer at larger sizes)")
    p.add_argument("--sizes", default="10,14,18,24", help="log2 of the cast sizes, comma separated")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--only", default="")
    args = p.parse_args()
    if args.clock == "cpu" and args.device != "cpu":
        p.error("--clock cpu times CPU work; use --clock wall with --device cuda")
    if args.device == "cpu":
        torch.set_num_threads(1)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    sizes = [1 << int(s) for s in args.sizes.split(",")]
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    setup = (f"reps = {args.reps}, {args.calls} calls at 2^10, clock {args.clock}, load average "
             f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    tab = Table("bench_dispatch", ["operation", "size", "cpd us/call", "baseline", "baseline us/call", "ratio"],
                machine=machine(args.device), setup=setup)
    for name, size, base_name, fn, base, scale in cases(args.device, sizes):
        if args.only not in name:
            continue
        tf, tb = best_pair(fn, base, max(10, args.calls // scale), args.reps, args.device, clock)
        size_s = f"2^{size.bit_length() - 1}" if size != 16 else "16^3"
        tab.row(name, size_s, f"{tf * 1e6:.1f}", base_name, f"{tb * 1e6:.1f}", f"{tf / tb:.2f}")
    tab.save()


if __name__ == "__main__":
    main()
