"""Shared-memory bank conflicts of cpd's GPU kernels, read by Nsight Compute (issue 27: "no bank
conflicts"). Two parts:

    ncu --clock-control none --csv --metrics <METRICS> python benchmarks/gpu_banks.py > banks.csv
    python benchmarks/gpu_banks.py --report banks.csv

The first runs each GEMM family of ``cuda/kernels/matmul.cu`` (and the tiled fused-dot kernels of
the Hopper and Blackwell models), the MX cast, the stochastic cast and the one-launch allreduce
orders once, at small sizes, under ``ncu``; the second prints, per kernel, the shared-memory
wavefronts of its loads and stores and how many of them were bank conflicts (extra wavefronts).
A kernel without shared memory shows none. ``benchmarks/gpu_session.sh`` runs both. Without a
GPU the first part prints why and exits.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict

#: Nsight Compute's shared-memory counters (l1tex: the L1/shared pipe; a conflict is an extra
#: wavefront of one instruction).
METRICS = ",".join([
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
])


def workload() -> int:
    import torch

    import cpd
    if not torch.cuda.is_available():
        print("gpu_banks: no CUDA GPU; nothing to profile.")
        return 0
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(512, 512, device=dev, generator=g)
    b = torch.randn(512, 512, device=dev, generator=g)
    for kw in (dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10)), dict(mul=cpd.E4M3, acc=cpd.FP16), dict(acc=cpd.FP32),
               dict(acc=cpd.BF16, kahan=True), dict(acc=cpd.FP16, rounding="stochastic"),
               dict(acc=cpd.tensor_core("hopper", a="e4m3")), dict(acc=cpd.tensor_core("blackwell", a="e4m3")),
               dict(acc=cpd.tensor_core("hopper", a="fp16"))):
        cpd.matmul(a, b, **kw)
    x = torch.randn(1 << 20, device=dev, generator=g)
    cpd.cast(x, cpd.E5M2, "stochastic")
    for fmt in (cpd.mx.MXFP8_E4M3, cpd.mx.MXFP4, cpd.mx.NVFP4):
        cpd.mx.cast(x, fmt)
        cpd.mx.encode(x, fmt)
    ws = torch.randn(16, 1 << 16, device=dev, generator=g)
    for algorithm in ("ring", "tree"):
        cpd.allreduce(ws, cpd.E5M2, algorithm=algorithm, kahan=True)
    torch.cuda.synchronize()
    return 0


def report(path: str) -> int:
    """Per kernel name: shared-memory wavefronts and bank conflicts (loads, stores), summed over launches."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages start with ==PROF==
    for row in csv.DictReader(lines):
        name, metric, value = row.get("Kernel Name", ""), row.get("Metric Name", ""), row.get("Metric Value", "")
        if not name.startswith("cpd_") or metric not in METRICS.split(","):
            continue
        sums[name][metric] += float(value.replace(",", "") or 0)
    if not sums:
        print(f"gpu_banks: no cpd kernel in {path}")
        return 1
    print(f"{'kernel':<34} {'ld wavefronts':>14} {'ld conflicts':>13} {'st wavefronts':>14} {'st conflicts':>13}")
    worst = 0.0
    for name in sorted(sums):
        m = sums[name]
        ld, st = (m[f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{o}.sum"] for o in ("ld", "st"))
        cld, cst = (m[f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{o}.sum"] for o in ("ld", "st"))
        worst = max(worst, (cld + cst) / max(ld + st, 1.0))
        print(f"{name:<34} {ld:>14.0f} {cld:>13.0f} {st:>14.0f} {cst:>13.0f}")
    print(f"\nlargest share of conflict wavefronts: {worst:.1%}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", metavar="CSV", help="summarize ncu's --csv output instead of running the workload")
    p.add_argument("--metrics", action="store_true", help="print the metrics list for ncu --metrics and exit")
    args = p.parse_args(argv)
    if args.metrics:
        print(METRICS)
        return 0
    return report(args.report) if args.report else workload()


if __name__ == "__main__":
    sys.exit(main())
