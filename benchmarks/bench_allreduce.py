"""Emulated allreduce vs ``torch.stack(ws).sum(0)`` in float32, measured side by side (docs/design.md §6).

Issue 4's target: ring over 64 workers x 2^20 elements in E5M2 within 3x of the float32 sum.
Run: ``python benchmarks/bench_allreduce.py [--workers 64] [--log2n 20] [--repeat 5]``.
"""

from __future__ import annotations

import argparse

import torch
from _figures import Table
from _timing import median_time

import cpd
from cpd import _cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--log2n", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--fmt", default="e5m2")
    a = ap.parse_args(argv)
    ws = [torch.randn(1 << a.log2n) for _ in range(a.workers)]
    ref = median_time(lambda: torch.stack(ws).sum(0), a.repeat)
    tab = Table("bench_allreduce", ["algorithm", "ms", "x stack().sum(0)"], machine=_cpu.machine_line(),
                setup=f"{a.fmt}, W={a.workers}, n=2^{a.log2n}, {torch.get_num_threads()} threads, medians of "
                      f"{a.repeat}; torch.stack(ws).sum(0): {ref * 1e3:.1f} ms")
    k = max(d for d in range(1, int(a.workers ** 0.5) + 1) if a.workers % d == 0)
    for alg, gs, kahan in (("ring", None, False), ("ring", None, True), ("hierarchical", k, False),
                           ("tree", None, False), ("sequential", None, False)):
        t = median_time(lambda: cpd.allreduce(ws, a.fmt, algorithm=alg, group_size=gs, kahan=kahan), a.repeat)
        name = f"{alg}{'(k=%d)' % gs if gs else ''}{' kahan' if kahan else ''}"
        tab.row(name, f"{t * 1e3:.1f}", f"{t / ref:.2f}")
    tab.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
