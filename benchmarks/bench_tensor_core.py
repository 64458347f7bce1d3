"""cpd.matmul(acc=cpd.tensor_core(...)) time / torch.mm time on CPU, side by side in one process.

    python benchmarks/bench_tensor_core.py [--size 512] [--repeat 3] [--threads N]

Goal (issue 15): 512^3 with the Hopper FP8 preset <= 40x torch.mm. Inputs are float32 tensors
already holding E4M3 / FP16 / BF16 values (cast once, outside the timing), so the figure is the
fused-dot GEMM itself; the block-scaled Blackwell rows (MXFP8, NVFP4) quantize their float32
inputs with cpd.mx inside the timed call, as cpd.matmul does. Prints the machine (CPU model and
ISA level, load average: the machine may be shared), then one line per preset with the loop it
runs (cuda/cpu/fused_dot.cpp: float32 carriers, float64 carriers, or the generic loop -- the
only one for the AMD algorithms and mxf4nvf4).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpd  # noqa: E402
from _figures import Table  # noqa: E402
from _timing import median_time  # noqa: E402
from cpd import _cpu  # noqa: E402

CASES = [("hopper", "e4m3", "f32"), ("hopper", "e4m3", "f16"), ("ada", "e4m3", "f32"), ("blackwell", "e4m3", "f32"),
         ("blackwell", "mxfp8_e4m3", "f32"), ("blackwell", "nvfp4", "f32"), ("hopper", "fp16", "f32"),
         ("ampere", "bf16", "f32"), ("volta", "fp16", "f32"), ("cdna3", "fp8", "f32"), ("cdna3", "bf16", "f32"),
         ("cdna2", "fp16", "f32")]


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, ISA {torch.backends.cpu.get_cpu_capability()}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.size
    g = torch.Generator().manual_seed(0)
    a0, b0 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "?"
    tab = Table("bench_tensor_core", ["preset", "loop", "cpd ms", "torch.mm ms", "x torch.mm"], machine=_cpu.machine_line(),
                setup=f"{cpu_name()}; {n}x{n}x{n}, {torch.get_num_threads()} threads; load average {load}")
    lanes = {1: "generic", 2: "float64 carriers", 3: "float32 carriers"}
    for arch, kind, out in CASES:
        acc = cpd.tensor_core(arch, a=kind, out=out)
        if acc.block_scaled:
            a, b = a0, b0
        else:
            a, b = cpd.cast(a0, acc.a, acc.a_rounding), cpd.cast(b0, acc.b, acc.b_rounding)
        cpd.matmul(a[:2, :2], b[:2, :2], acc=acc)  # builds / loads the extension (once)
        block = acc.a_block.block_size if acc.block_scaled else 1
        path = lanes[torch.ops.cpd_fused_dot.lanes(*acc.params, acc.a.man, acc.a.emax, acc.b.man, acc.b.emax,
                                                   int(acc.block_scaled), block)]
        t_mm = median_time(lambda: torch.mm(a, b), max(args.repeat, 30))
        t_tc = median_time(lambda: cpd.matmul(a, b, acc=acc), args.repeat)
        t_mm = min(t_mm, median_time(lambda: torch.mm(a, b), max(args.repeat, 30)))
        tab.row(f"{arch} {kind} -> {out} (L={acc.group}, F={acc.frac_bits})", path, f"{t_tc * 1e3:.1f}",
                f"{t_mm * 1e3:.2f}", f"{t_tc / t_mm:.1f}")
    tab.save()


if __name__ == "__main__":
    main()
