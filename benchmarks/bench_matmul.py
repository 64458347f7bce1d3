"""cpd.matmul time / torch.mm time on CPU, side by side in one process.

    python benchmarks/bench_matmul.py [--size 256] [--repeat 3] [--threads N]

Paths (cuda/cpu/matmul.cpp lanes_for): E5M2 into (5,10) = binary16 runs on binary16 lanes where
the CPU has AVX512-FP16 (float32 lanes otherwise), E5M2 into (6,7) on float32 lanes, E4M3 into
BF16 and the fma cases on float64 lanes.

Prints one line per (mul, acc, options): the best of ``repeat`` runs of cpd.matmul, the best of
many runs of torch.mm (timed before and after, to be robust to a busy machine), and the ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

import cpd

CASES = [
    ("E5M2", "(5,10)", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10))),
    ("E5M2", "(5,10) kahan", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10), kahan=True)),
    ("E5M2", "(6,7)", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(6, 7))),
    ("E5M2", "(6,7) kahan", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(6, 7), kahan=True)),
    ("E4M3", "BF16", dict(mul=cpd.E4M3, acc=cpd.BF16)),
    ("None", "FP16 fma", dict(acc=cpd.FP16, fma=True)),
    ("E5M2", "(5,10) block=32", dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10), block=32)),
    ("None", "FP16 fma stochastic", dict(acc=cpd.FP16, fma=True, rounding="stochastic")),
]


def _time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.size
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    print(f"{n}x{n}x{n} float32, {torch.get_num_threads()} threads")
    for mul, acc, kw in CASES:
        t_mm = _time(lambda: torch.mm(a, b), max(args.repeat, 50))
        t_cpd = _time(lambda: cpd.matmul(a, b, **kw), args.repeat)
        t_mm = min(t_mm, _time(lambda: torch.mm(a, b), max(args.repeat, 50)))
        print(f"mul={mul:5s} acc={acc:22s} cpd {t_cpd * 1e3:9.2f} ms  torch.mm {t_mm * 1e3:7.3f} ms  "
              f"ratio {t_cpd / t_mm:8.1f}x")


if __name__ == "__main__":
    main()
