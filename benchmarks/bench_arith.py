"""Speed of the elementwise ``cpd.add`` / ``cpd.mul`` / ``cpd.fma`` on the CPU, as ratios to
torch's own ``torch.add(a, b, out=out)`` measured side by side in one process, beside the exact
scalar loop the vector loops replace (``path=1`` of the extension's ``arith_out``: what every call
ran before the vector loops, cuda/cpu/arith.cpp).

Run: ``python benchmarks/bench_arith.py [--n 4194304] [--repeat 7] [--threads 1]``. Operands are
``torch.randn(n)`` (not values of the format: the general case, e.g. a bias added to a GEMM's
output); the first line names the CPU and the ISA level.
"""

from __future__ import annotations

import argparse

import torch
from _figures import Table
from _timing import median_time

import cpd
from cpd import _cpu

CASES = [("add", cpd.BF16, "nearest"), ("mul", cpd.E4M3, "nearest"), ("fma", cpd.FP16, "nearest"),
         ("add", cpd.BF16, "stochastic"), ("fma", cpd.E4M3, "stochastic"), ("add", cpd.BF16, "toward_zero"),
         ("fma", cpd.FP16, "down")]
OPS = {"mul": 0, "add": 1, "fma": 2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 22)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    ext = _cpu.extension()
    tab = Table("bench_arith", ["op", "format", "rounding", "x torch.add", "scalar loop x torch.add"],
                machine=_cpu.machine_line(), setup=f"{a.threads} thread(s); n = {a.n} float32")
    g = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(a.n, generator=g) for _ in range(3))
    out = torch.empty_like(x)
    for op, fmt, mode in CASES:
        base = median_time(lambda: torch.add(x, y, out=out), a.repeat)
        fast = median_time(lambda: ext.arith_out(OPS[op], x, y, z, out, *cpd.ops._fmt_args(fmt), cpd.Rounding(mode).code,
                                                 False, 32, 1, 2, 0), a.repeat)
        slow = median_time(lambda: ext.arith_out(OPS[op], x, y, z, out, *cpd.ops._fmt_args(fmt), cpd.Rounding(mode).code,
                                                 False, 32, 1, 2, 1), max(1, a.repeat // 3))
        tab.row(op, fmt.name, mode, f"{fast / base:.1f}", f"{slow / base:.1f}")
    tab.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
