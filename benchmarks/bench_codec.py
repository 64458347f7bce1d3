"""Pack / unpack throughput of the wire codec (``cpd.codec``) per code width, as a ratio to a copy
of the uint8 codes, measured side by side in one process (docs/design.md §6):
``pack_codes / out.copy_(codes)`` and ``unpack_codes / out.copy_(codes)``.

Run: ``python benchmarks/bench_codec.py [--n 1048576] [--repeat 7] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import platform

import torch
from _figures import Table
from _timing import median_time

import cpd
from cpd.codec import pack_codes, unpack_codes


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    tab = Table("bench_codec", ["bits", "bytes", "pack x copy", "unpack x copy", "pack G codes/s"],
                machine=f"CPU: {_cpu_name()}", setup=f"{a.threads} thread(s); n = {a.n} codes; cpd {cpd.__version__}")
    g = torch.Generator().manual_seed(0)
    for bits in range(1, 9):
        codes = torch.randint(0, 1 << bits, (a.n,), dtype=torch.uint8, generator=g)
        out = torch.empty_like(codes)
        copy = median_time(lambda: out.copy_(codes), a.repeat)
        packed = pack_codes(codes, bits)
        tp = median_time(lambda: pack_codes(codes, bits), a.repeat)
        tu = median_time(lambda: unpack_codes(packed, bits, a.n), a.repeat)
        tab.row(bits, packed.numel(), f"{tp / copy:.1f}", f"{tu / copy:.1f}", f"{a.n / tp / 1e9:.3f}")
    tab.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
