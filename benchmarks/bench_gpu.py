"""Speed of cpd's CUDA kernels as ratios to torch's own device work of the same size.

Run from the repository root on a machine with a CUDA GPU and the ``cuda`` extra:

    PYTHONPATH=. python benchmarks/bench_gpu.py [--reps 20] [--quick]

Measurements (CUDA events on the current stream, median of ``reps`` after one warm-up, each
operation timed side by side with its baseline in the same process, interleaved):

* cast, nearest and stochastic, of 2^26 float32 to E5M2 / E4M3 / BF16, against ``out.copy_(x)``
  on the device, one call between two events and 20 calls back to back (goal: nearest <= 1.15x,
  stochastic <= 1.3x back to back), and one cast of 2^14 floats against ``x.to(torch.bfloat16)``;
* cpd.mx.cast and cpd.mx.encode (packed codes) 2^24 MXFP8 / MXFP4 / NVFP4 back to back against
  ``out.copy_(x)`` (goal <= 1.5x; an encode writes 1 or 1/2 byte per element where the copy
  writes 4);
* cpd.matmul 4096^3 and 2048x512x2048 for each GEMM family (E5M2 into (5, 10), E4M3 x FP16, the
  float32 chain, the Hopper e4m3 model, Kahan into BF16) against float32 ``torch.mm`` with TF32 off
  (goals: chain <= 3x, E5M2/(5,10) and E4M3 x FP16 <= 15x, Hopper <= 15x, Kahan BF16 <= 40x);
* one training step of a 4-layer TransformerEncoder (d=512, seq 256, batch 16) converted with
  ``cpd.nn.convert(mul=E4M3, acc=FP16)`` and with the Hopper e4m3 model, against float32
  (goals <= 10x and <= 12x);
* the emulated allreduce of 64 workers x 2^22 float32 (cpd.allreduce, E5M2 ring, BF16 ring, E5M2 tree)
  against ``torch.stack(ws).sum(0)``;
* the host time per call (benchmarks/bench_dispatch.py's cases on the device: cast, cast with
  ``out=``, stochastic cast and mx.cast at 2^10..2^24, matmul 16^3 forward and forward +
  backward, beside torch's own op; goal: <= 15 us per cast, <= 30 us per matmul forward).

Prints the GPU's name, CUDA/NVRTC versions and a table; without a GPU it says so and exits 0.
``--quick`` uses smaller sizes (2^22 elements, 1024^3 only, a 1-layer transformer, 16 x 2^20).
The static side of the GEMM goals (SASS per multiply-accumulate, no GPU needed) is
benchmarks/sass_counts.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import cpd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the shared table format
from _figures import record  # noqa: E402
import bench_dispatch  # noqa: E402


def event_time(fn, reps: int) -> list[float]:
    """Per-call seconds of ``reps`` calls of fn, timed with CUDA events (one warm-up call first)."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def side_by_side(fn, base, reps: int) -> tuple[float, float]:
    """(median seconds of fn, median seconds of base), the two interleaved call by call."""
    fn()
    base()
    a, b = [], []
    for _ in range(reps):
        a += event_time(fn, 1)
        b += event_time(base, 1)
    return statistics.median(a), statistics.median(b)


def back_to_back(fn, base, reps: int, calls: int = 20) -> tuple[float, float]:
    """(seconds per call of fn, of base) over ``calls`` calls issued back to back between two
    events (the host's per-call cost hidden behind the GPU's work), median of ``reps``."""
    def per_call(f):
        f()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            f()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    a, b = [], []
    for _ in range(reps):
        a.append(per_call(fn))
        b.append(per_call(base))
    return statistics.median(a), statistics.median(b)


#: The GEMM families of cuda/kernels/matmul.cu (and the generic kernel), as cpd.matmul keywords.
#: Built lazily: cpd.tensor_core needs nothing from the GPU, but keeps import cheap.
GEMM_FAMILIES = (
    ("E5M2 -> (5,10)", lambda: dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10))),
    ("E4M3 x FP16", lambda: dict(mul=cpd.E4M3, acc=cpd.FP16)),
    ("float32 chain (mul=None, acc=FP32)", lambda: dict(acc=cpd.FP32)),
    ("E4M3 products, FP32 accumulator (the default acc)", lambda: dict(mul=cpd.E4M3)),
    ("Kahan FP32 (mul=None)", lambda: dict(acc=cpd.FP32, kahan=True)),
    ("E4M3 products, FP32 in blocks of 32", lambda: dict(mul=cpd.E4M3, block=32)),
    ("FP16 fused multiply-add (mul=None, acc=FP16)", lambda: dict(acc=cpd.FP16)),
    ("Hopper e4m3 model", lambda: dict(acc=cpd.tensor_core("hopper", a="e4m3"))),
    ("Ampere bf16 model (L 8)", lambda: dict(acc=cpd.tensor_core("ampere", a="bf16"))),
    ("Hopper tf32 model (L 8, 64-bit sums)", lambda: dict(acc=cpd.tensor_core("hopper", a="tf32"))),
    ("Blackwell MXFP8 e4m3 (E8M0 scales)", lambda: dict(acc=cpd.tensor_core("blackwell", a="mxfp8_e4m3"))),
    ("Blackwell NVFP4 (kind::mxf4nvf4, E4M3 scales)", lambda: dict(acc=cpd.tensor_core("blackwell", a="nvfp4"))),
    ("Kahan BF16", lambda: dict(acc=cpd.BF16, kahan=True)),
    ("E4M3 x BF16 stochastic", lambda: dict(mul=cpd.E4M3, acc=cpd.BF16, rounding="stochastic")),
)


def transformer_step(model, x, opt):
    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    return step


def transformer_rows(dev, args) -> list:
    """One SGD step of a TransformerEncoder (4 layers, d=512, seq 256, batch 16; --quick: 1 layer,
    seq 64, batch 4): float32 against cpd.nn.convert(mul=E4M3, acc=FP16) and the Hopper e4m3 model,
    each a fresh copy of the same model, timed side by side (CUDA events, one step per sample)."""
    import copy

    layers, seq, batch = (1, 64, 4) if args.quick else (4, 256, 16)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
    base = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(dev)
    x = torch.randn(batch, seq, 512, device=dev)
    ref_opt = torch.optim.SGD(base.parameters(), lr=1e-3)
    rows = []
    for label, kw in (("convert E4M3 x FP16", dict(mul=cpd.E4M3, acc=cpd.FP16)),
                      ("convert Hopper e4m3", dict(acc=cpd.tensor_core("hopper", a="e4m3")))):
        m = cpd.nn.convert(copy.deepcopy(base), **kw)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        t, b = side_by_side(transformer_step(m, x, opt), transformer_step(base, x, ref_opt), max(3, args.reps // 4))
        rows.append((f"transformer step, {label}", f"{layers}L d512 S{seq} B{batch}", t, b, "float32 step"))
    return rows


def table(rows) -> str:
    header = ["operation", "size", "cpd", "baseline", "baseline op", "ratio"]
    cells = [header] + [[r[0], r[1], f"{r[2] * 1e3:.3f} ms", f"{r[3] * 1e3:.3f} ms", r[4], f"{r[2] / r[3]:.2f}x"]
                        for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="smaller sizes")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU (torch.cuda.is_available() is False); nothing to measure.")
        return 0
    from cpd import _cuda

    dev = torch.device("cuda")
    reason = _cuda.unusable_reason(dev)
    name = torch.cuda.get_device_name(dev)
    cc = torch.cuda.get_device_capability(dev)
    print(f"GPU: {name} (sm_{cc[0]}{cc[1]}), torch {torch.__version__} (CUDA {torch.version.cuda})")
    if reason is not None:
        print(f"bench_gpu: cpd's kernels cannot run here ({reason}); nothing to measure.")
        return 0
    print(f"NVRTC {'.'.join(map(str, _cuda.nvrtc_version()))}, target {_cuda.target_for(*cc)}\n")
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []

    n = 1 << (22 if args.quick else 26)
    x = torch.randn(n, device=dev, generator=g) * 100
    out = torch.empty_like(x)
    for fmt in (cpd.E5M2, cpd.E4M3, cpd.BF16):
        for mode in ("nearest", "stochastic"):
            fn, base = (lambda: cpd.cast(x, fmt, mode, out=out)), (lambda: out.copy_(x))
            t, b = side_by_side(fn, base, args.reps)
            rows.append((f"cast {fmt.name} {mode}, single call", f"2^{n.bit_length() - 1}", t, b, "out.copy_(x)"))
            t, b = back_to_back(fn, base, args.reps)
            rows.append((f"cast {fmt.name} {mode}, back to back", f"2^{n.bit_length() - 1}", t, b, "out.copy_(x)"))
    small = torch.randn(1 << 14, device=dev, generator=g)
    small_out = torch.empty_like(small)
    t, b = side_by_side(lambda: cpd.cast(small, cpd.E5M2, out=small_out), lambda: small.to(torch.bfloat16),
                        args.reps)
    rows.append(("cast e5m2 nearest, single call", "2^14", t, b, "x.to(bfloat16)"))

    for fmt in (cpd.mx.MXFP8_E4M3, cpd.mx.MXFP4, cpd.mx.NVFP4):
        m = 1 << (20 if args.quick else 24)
        xm = torch.randn(m, device=dev, generator=g)
        om = torch.empty_like(xm)
        t, b = back_to_back(lambda: cpd.mx.cast(xm, fmt, out=om), lambda: om.copy_(xm), args.reps)
        rows.append((f"mx.cast {fmt.name}, back to back", f"2^{m.bit_length() - 1}", t, b, "out.copy_(x)"))
        t, b = back_to_back(lambda: cpd.mx.encode(xm, fmt), lambda: om.copy_(xm), args.reps)
        rows.append((f"mx.encode {fmt.name}, back to back", f"2^{m.bit_length() - 1}", t, b, "out.copy_(x)"))

    for shape in (((1024, 1024, 1024),) if args.quick else ((4096, 4096, 4096), (2048, 512, 2048))):
        M, K, N = shape
        a = torch.randn(M, K, device=dev, generator=g)
        bm = torch.randn(K, N, device=dev, generator=g)
        size = f"{M}x{K}x{N}"
        for label, kw in GEMM_FAMILIES:
            reps = max(3, args.reps // (4 if M * K * N > 2**30 else 1))
            t, b = side_by_side(lambda: cpd.matmul(a, bm, **kw()), lambda: torch.mm(a, bm), reps)
            rows.append((f"matmul {label}", size, t, b, "torch.mm fp32"))

    rows += transformer_rows(dev, args)

    workers, m = (16, 1 << 20) if args.quick else (64, 1 << 22)
    ws = [torch.randn(m, device=dev, generator=g) for _ in range(workers)]
    for algorithm, fmt in (("ring", cpd.E5M2), ("ring", cpd.BF16), ("tree", cpd.E5M2)):
        t, b = side_by_side(lambda: cpd.allreduce(ws, fmt, algorithm=algorithm), lambda: torch.stack(ws).sum(0),
                            max(3, args.reps // 4))
        rows.append((f"allreduce {algorithm} {fmt.name}", f"{workers} x 2^{m.bit_length() - 1}", t, b,
                     "stack().sum(0)"))

    sizes = [1 << 10, 1 << 14] if args.quick else [1 << 10, 1 << 14, 1 << 18, 1 << 24]
    for name, size, base_name, fn, base, scale in bench_dispatch.cases("cuda", sizes):
        tf, tb = bench_dispatch.best_pair(fn, base, max(10, 500 // scale), 5, "cuda", time.perf_counter)
        rows.append((f"host time per call: {name}", "16^3" if size == 16 else f"2^{size.bit_length() - 1}", tf, tb,
                     base_name))

    print(table(rows))
    record("bench_gpu", ["operation", "size", "cpd ms", "baseline ms", "baseline", "ratio"],
           [[r[0], r[1], f"{r[2] * 1e3:.3f}", f"{r[3] * 1e3:.3f}", r[4], f"{r[2] / r[3]:.2f}"] for r in rows],
           machine=f"GPU: {name} (sm_{cc[0]}{cc[1]}), CUDA {torch.version.cuda}", setup=f"reps {args.reps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
