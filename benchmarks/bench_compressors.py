"""Encode and decode throughput of every compressor as a ratio to a copy of the same tensor,
measured side by side in one process (docs/design.md §6): ``encode / out.copy_(x)`` and
``decode / out.copy_(x)`` (a ratio of 10 means ten times the time of the copy).

Run: ``python benchmarks/bench_compressors.py [--rows 4096] [--cols 256] [--repeat 5]``.
"""

from __future__ import annotations

import argparse

import torch
from _figures import Table
from _timing import median_time

import cpd
from cpd import _cpu
from cpd.compressors import Adaptive, CompressorState, get


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    x = torch.randn(a.rows, a.cols, generator=torch.Generator().manual_seed(0))
    out = torch.empty_like(x)
    copy = median_time(lambda: out.copy_(x), a.repeat)
    n = x.numel()
    print(f"x: {a.rows} x {a.cols} float32 ({n} elements), {torch.get_num_threads()} threads; "
          f"copy {copy * 1e3:.3f} ms ({n / copy / 1e9:.2f} G elements/s)\n")
    names = ["dynamic_tree", "static_tree", "linear", "mantissa8", "onebit", "threshold:1.5", "adaptive",
             "bitpack16", "e5m2", "e2m1fn"]
    comps = [(nm, get(nm)) for nm in names]
    comps.append(("adaptive sample=256",
                  Adaptive(64, sample=256, generator=torch.Generator().manual_seed(0))))
    tab = Table("bench_compressors", ["compressor", "bytes", "ratio", "encode x copy", "decode x copy",
                                      "encode+EF x copy"], machine=_cpu.machine_line(),
                setup=f"x: {a.rows} x {a.cols} float32, {torch.get_num_threads()} threads, medians of {a.repeat}")
    for nm, c in comps:
        p = c.encode(x)
        te = median_time(lambda: c.encode(x), a.repeat)
        td = median_time(lambda: c.decode(p), a.repeat)
        st = CompressorState()
        tf = median_time(lambda: c.encode(x, st), a.repeat) if c.error_feedback else float("nan")
        tab.row(nm, p.nbytes, f"{p.ratio:.2f}", f"{te / copy:.1f}", f"{td / copy:.1f}", f"{tf / copy:.1f}")
    tab.save(notes="encode+EF adds the float64 residual update (error feedback).")
    print(f"\ncpd {cpd.__version__}; encode+EF adds the float64 residual update (error feedback)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
