"""Speed of cpd.mx (block-scaled formats) as ratios to a plain float32 copy.

Run from the repository root:

    PYTHONPATH=. python benchmarks/bench_mx.py [--n 67108864] [--reps 5] [--device cpu]

Method: x = torch.randn(n) (float32), out a preallocated float32 tensor. Each operation is timed
side by side with out.copy_(x) in the same process, interleaved, `reps` times; the ratio of the
medians is printed, with the machine (CPU model and ISA flags, or the GPU name). The issue's
goals: cpd.mx.cast of 2^26 floats to MXFP8 (nearest) <= 2x copy; MXFP4 encode to packed codes
and scales <= 2x copy.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from cpd import mx


def machine(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    model, flags = platform.processor() or platform.machine(), ""
    try:
        text = open("/proc/cpuinfo").read()
        model = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name"))
        have = set(next(ln for ln in text.splitlines() if ln.startswith("flags")).split())
        flags = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_fp16") if f in have)
    except (OSError, StopIteration):
        pass
    return f"{model} [{flags}], {torch.get_num_threads()} threads"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def ratio(fn, copy, reps: int, device: str) -> tuple[float, float]:
    """(median(fn) / median(copy), median(fn) in seconds), the two interleaved."""
    fn(), copy()
    tf, tc = [], []
    for _ in range(reps):
        for f, ts in ((fn, tf), (copy, tc)):
            sync(device)
            t = time.perf_counter()
            f()
            sync(device)
            ts.append(time.perf_counter() - t)
    return statistics.median(tf) / statistics.median(tc), statistics.median(tf)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 26)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    x = torch.randn(args.n, device=args.device)
    out = torch.empty_like(x)
    copy = lambda: out.copy_(x)  # noqa: E731
    print(f"machine: {machine(args.device)}; n = {args.n}, reps = {args.reps}")
    cases = [("cast MXFP8_E4M3 nearest", lambda: mx.cast(x, mx.MXFP8_E4M3)),
             ("cast MXFP4 nearest", lambda: mx.cast(x, mx.MXFP4)),
             ("cast NVFP4 nearest", lambda: mx.cast(x, mx.NVFP4)),
             ("encode MXFP4 -> packed codes + scales", lambda: mx.encode(x, mx.MXFP4)),
             ("encode MXFP8_E4M3 -> codes + scales", lambda: mx.encode(x, mx.MXFP8_E4M3))]
    for name, fn in cases:
        r, t = ratio(fn, copy, args.reps, args.device)
        print(f"{name:40s} {r:7.2f}x copy  {args.n / t / 1e9:6.3f} Gelem/s")


if __name__ == "__main__":
    main()
