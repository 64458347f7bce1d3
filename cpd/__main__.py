"""Command line: ``python -m cpd <command>`` (also installed as the ``cpd`` script).

Commands:
    demo      the main job: emulated data-parallel training of a small CNN on scikit-learn's
              digits with float32 vs low-precision gradient communication, with and without APS
              (cpd/demo.py).
    launch-demo
              the demo for real: N local gloo processes (or torchrun's), gradients sent as
              low-precision codes (cpd/distributed.py); the demo's table plus bytes saved.
    cast-demo the casting demo (format table, worked examples, bit views, stochastic rounding).
    report    the per-layer round-off table of an emulated (APS) allreduce of synthetic gradients
              or of a torch.save'd dict of per-worker gradients (--grads FILE).
    formats   the table of preset formats only.
    bench     cast speed as a ratio to a plain copy (benchmarks/bench_cast.py when present).

Adding a command: write ``_setup_<name>(parser)`` (optional) and ``_run_<name>(args) -> int``,
and add one :class:`_Command` line to :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

import cpd

from . import __version__, _launch, demo
from .formats import PRESETS

__all__ = ["main", "COMMANDS", "format_table"]

#: Inputs of the worked example: a plain value, one past e5m2's overflow threshold (61440), one
#: below half the smallest e5m2 subnormal, the double-rounding trap just above that half, an
#: infinity and a NaN.
DEMO_VALUES = (0.3, 65000.0, 1e-6, 2.0**-17 * (1 + 2.0**-23), -math.inf, math.nan)
DEMO_LABELS = ("0.3", "65000", "1e-6", "2^-17(1+2^-23)", "-inf", "nan")
DEMO_FORMATS = ("E5M2", "E4M3", "E4M3FN", "E2M1")


# ------------------------------------------------------------------------------------ formatting
def _num(v: float) -> str:
    """Short exact-enough text for a float32 value: integers plainly, powers of two as 2^k."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    m, e = math.frexp(abs(v))
    sign = "-" if v < 0 else ""
    if m == 0.5 and not (-4 <= e - 1 <= 16):
        return f"{sign}2^{e - 1}"
    if v == int(v) and abs(v) < 1e9:
        return f"{int(v)}"
    return f"{v:.6g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def format_table() -> str:
    """The preset formats as a text table: bits, bias, max, smallest normal/subnormal, eps, specials."""
    header = ["preset", "name", "bits", "exp", "man", "bias", "max", "smallest normal",
              "smallest subnormal", "eps", "specials"]
    rows = []
    for key, f in PRESETS.items():
        rows.append([key, f.name, str(f.bits), str(f.exp), str(f.man), str(f.bias), f"{f.max:.9g}",
                     _num(f.smallest_normal), _num(f.smallest_subnormal), _num(f.eps), f.specials.value])
    return _table(header, rows)


# ------------------------------------------------------------------------------------ commands
def _setup_formats(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", "-v", action="store_true", help="also print each format's full description")


def _run_formats(args: argparse.Namespace) -> int:
    print(format_table())
    if args.verbose:
        for f in PRESETS.values():
            print()
            print(f)
    return 0


def _setup_cast_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, default=100_000,
                   help="number of stochastic casts of 0.3 averaged in the last part (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the torch generator for stochastic rounding")


def _run_cast_demo(args: argparse.Namespace) -> int:
    if args.samples < 1:
        raise SystemExit(f"cpd cast-demo: --samples={args.samples} must be >= 1")
    print("cpd cast-demo: casting float32 tensors to custom floating-point formats")
    print("=" * 78)
    print("\n1. Preset formats (python -m cpd formats prints this table alone)\n")
    print(format_table())

    x = torch.tensor(DEMO_VALUES, dtype=torch.float32)
    modes = list(cpd.Rounding)
    print("\n2. Worked example: cpd.cast(x, fmt, rounding)  (stochastic: seeded generator, one draw)\n")
    print("   x = " + ", ".join(DEMO_LABELS) + "   (as float32)")
    for key in DEMO_FORMATS:
        fmt = cpd.PRESETS[key]
        print(f"\n   {key} ({fmt.name}: max {fmt.max:g}, smallest subnormal {_num(fmt.smallest_subnormal)},"
              f" specials {fmt.specials.value})")
        cols = {}
        for m in modes:
            gen = torch.Generator().manual_seed(args.seed) if m is cpd.Rounding.STOCHASTIC else None
            cols[m] = cpd.cast(x, fmt, m, generator=gen).tolist()
        sat = cpd.cast(x, fmt, saturate=True).tolist()
        header = ["x", *(m.value for m in modes), "nearest+saturate"]
        rows = [[DEMO_LABELS[i], *(_num(cols[m][i]) for m in modes), _num(sat[i])] for i in range(len(DEMO_VALUES))]
        print("   " + _table(header, rows).replace("\n", "\n   "))
        if key == "E5M2":
            ulp = 2.0 ** (fmt.emax - fmt.man)
            print(f"   -> 65000 overflows: nearest gives inf from max + ulp/2 = {fmt.max + ulp / 2:g} upward.")
            print("   -> 2^-17(1+2^-23) is just above half the smallest subnormal 2^-16, so nearest gives")
            print("      2^-16 (rounding twice, through float16's 2^-17, would wrongly give 0).")

    print("\n3. Bit views: cpd.bits(x, fmt) prints sign | exponent | mantissa of the rounded value\n")
    for key in ("E5M2", "E4M3FN"):
        print(f"   {key}:")
        for ln in cpd.bits(x, cpd.PRESETS[key]).splitlines():
            print("     " + ln)

    print("\n4. Stochastic rounding is unbiased\n")
    n = args.samples
    v = torch.full((n,), 0.3)
    near = cpd.cast(v[:1], cpd.E5M2).item()
    gen = torch.Generator().manual_seed(args.seed)
    sr = cpd.cast(v, cpd.E5M2, "stochastic", generator=gen)
    lo, hi = cpd.cast(v[:1], cpd.E5M2, "down").item(), cpd.cast(v[:1], cpd.E5M2, "up").item()
    p_up = (float(torch.tensor(0.3).item()) - lo) / (hi - lo)
    frac_up = (sr == hi).double().mean().item()
    mean = sr.double().mean().item()
    se = (hi - lo) * math.sqrt(p_up * (1 - p_up) / n)
    print(f"   0.3 in e5m2 lies between {lo:g} and {hi:g}; nearest always gives {near:g} "
          f"(error {near - 0.3:+.4f})")
    print(f"   {n} stochastic casts (generator seed {args.seed}): {frac_up:.4f} rounded up "
          f"(exact probability {p_up:.4f})")
    print(f"   mean of the stochastic casts = {mean:.6f}  ({abs(mean - 0.3) / se:.2f} standard errors from 0.3)")
    gen = torch.Generator().manual_seed(args.seed)
    again = cpd.cast(v, cpd.E5M2, "stochastic", generator=gen)
    print(f"   same seed again gives the same bits: {torch.equal(sr, again)}")
    k = 2
    gen = torch.Generator().manual_seed(args.seed)
    srk = cpd.cast(v, cpd.E5M2, "stochastic", sr_bits=k, generator=gen)
    print(f"   with sr_bits={k} the probability is truncated to a multiple of 2^-{k}: "
          f"up-fraction {(srk == hi).double().mean().item():.4f}, mean {srk.double().mean().item():.6f} (biased)")
    return 0


def _setup_demo(p: argparse.ArgumentParser) -> None:
    demo.setup_parser(p)


def _run_demo(args: argparse.Namespace) -> int:
    return demo.main(args)


def _setup_launch_demo(p: argparse.ArgumentParser) -> None:
    _launch.setup_parser(p)


def _run_launch_demo(args: argparse.Namespace) -> int:
    return _launch.main(args)


def _setup_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="e5m2", help="communication format (default e5m2)")
    p.add_argument("--workers", type=int, default=8, help="workers of the synthetic gradients (default 8)")
    p.add_argument("--algorithm", default="ring", choices=["ring", "hierarchical", "tree", "sequential"])
    p.add_argument("--group-size", type=int, default=None, help="workers per group (hierarchical)")
    p.add_argument("--scaling", default="aps", choices=["aps", "none"], help="APS or unscaled (default aps)")
    p.add_argument("--grads", default=None, help="torch.save'd dict {layer name: list of per-worker tensors "
                   "or a (W, ...) tensor}; default: synthetic gradients")
    p.add_argument("--numel", type=int, default=4096, help="elements per synthetic layer (default 4096)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic gradients")


def _run_report(args: argparse.Namespace) -> int:
    try:
        fmt = cpd.FloatFormat.parse(args.format)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"cpd report: --format: {exc}") from None
    if args.grads is not None:
        layers = torch.load(args.grads, map_location="cpu", weights_only=True)
        if not isinstance(layers, dict):
            raise SystemExit(f"cpd report: {args.grads} holds a {type(layers).__name__}, not a dict of layers")
        source = args.grads
    else:
        if args.workers < 1 or args.numel < 1:
            raise SystemExit("cpd report: --workers and --numel must be >= 1")
        g = torch.Generator().manual_seed(args.seed)
        layers = {}
        # Synthetic data-parallel gradients: a shared signal plus per-worker noise, at the
        # magnitudes of a CNN's layers (small early convolutions, larger classifier).
        for name, scale in (("conv1.weight", 2.0 ** -10), ("conv2.weight", 2.0 ** -8), ("fc.weight", 2.0 ** -5),
                            ("fc.bias", 2.0 ** -3)):
            signal = torch.randn(args.numel, generator=g)
            layers[name] = [(signal + torch.randn(args.numel, generator=g)) * scale for _ in range(args.workers)]
        source = f"synthetic gradients (seed {args.seed}, {args.numel} elements per layer)"
    kw = dict(algorithm=args.algorithm, group_size=args.group_size)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if args.scaling == "aps":
                _, report = cpd.aps_allreduce(layers, fmt, **kw)
            else:
                _, report = cpd.scaled_allreduce(layers, fmt, 0, **kw)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"cpd report: {exc}") from None
    print(f"cpd report: {source}")
    print(report)
    return 0


def _setup_bench(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Other arguments go to benchmarks/bench_cast.py (see its --help), e.g. "
                "python -m cpd bench --n 16777216 --reps 5")


def _bench_script() -> Path | None:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_cast.py"
    return path if path.is_file() else None


def _run_bench(args: argparse.Namespace) -> int:
    rest = [a for a in args.extra if a != "--"]
    script = _bench_script()
    if script is not None:
        spec = importlib.util.spec_from_file_location("_cpd_bench_cast", script)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if inspect.signature(mod.main).parameters:
            return mod.main(rest) or 0
        saved = sys.argv
        sys.argv = [str(script), *rest]
        try:
            return mod.main() or 0
        finally:
            sys.argv = saved
    return _inline_bench(rest)


def _inline_bench(argv: list[str]) -> int:
    """Used when benchmarks/ is not shipped (installed wheel): cast / copy ratios, medians of reps."""
    p = argparse.ArgumentParser(prog="python -m cpd bench")
    p.add_argument("--n", type=int, default=2**24)
    p.add_argument("--reps", type=int, default=7)
    opts = p.parse_args(argv)
    x = torch.randn(opts.n) * 100
    out = torch.empty_like(x)
    gen = torch.Generator().manual_seed(0)

    def ratio(fn, copy) -> tuple[float, float]:
        """(median(fn) / median(copy), median(fn) seconds), the two timed interleaved."""
        fn(), copy()  # warm-up (the first cast also loads the extension)
        a, b = [], []
        for _ in range(opts.reps):
            for f, ts in ((fn, a), (copy, b)):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
        return statistics.median(a) / statistics.median(b), statistics.median(a)

    print(f"n = {opts.n}, threads = {torch.get_num_threads()}, reps = {opts.reps} (inline benchmark)")
    copy = lambda: out.copy_(x)  # noqa: E731
    for mode in ("nearest", "stochastic"):
        g = gen if mode == "stochastic" else None
        r, t = ratio(lambda: cpd.cast(x, cpd.E5M2, mode, generator=g, out=out), copy)
        print(f"cast e5m2 {mode:10s} {r:6.2f}x copy  {opts.n / t / 1e9:6.2f} Gelem/s")
    return 0


@dataclasses.dataclass(frozen=True)
class _Command:
    #: Sub-command name typed on the command line.
    name: str
    #: One-line help.
    help: str
    #: Runs the command; returns the exit status.
    run: Callable[[argparse.Namespace], int]
    #: Adds the command's own arguments to its sub-parser.
    setup: Callable[[argparse.ArgumentParser], None] | None = None
    #: Whether arguments the sub-parser does not know are passed on (as ``args.extra``) instead
    #: of being an error.
    passthrough: bool = False


#: Every sub-command, in the order ``--help`` lists them.
COMMANDS: list[_Command] = [
    _Command("demo", "the main job: emulated data-parallel training with low-precision gradient allreduce, "
             "with and without APS", _run_demo, _setup_demo),
    _Command("launch-demo", "the demo across real local processes (gloo; or under torchrun): low-precision "
             "codes on the wire, the same table plus bytes saved", _run_launch_demo, _setup_launch_demo),
    _Command("cast-demo", "casting demo (formats, rounding modes, bit views, stochastic rounding)",
             _run_cast_demo, _setup_cast_demo),
    _Command("report", "per-layer round-off table of an emulated allreduce of synthetic or saved gradients",
             _run_report, _setup_report),
    _Command("formats", "print the table of preset formats", _run_formats, _setup_formats),
    _Command("bench", "cast speed as a ratio to out.copy_(x) (runs benchmarks/bench_cast.py if present)",
             _run_bench, _setup_bench, passthrough=True),
]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cpd", description="cpd: customized-precision floating point for PyTorch")
    p.add_argument("--version", action="version", version=f"cpd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for c in COMMANDS:
        sp = sub.add_parser(c.name, help=c.help, description=c.help)
        if c.setup is not None:
            c.setup(sp)
        sp.set_defaults(_command=c)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cpd`` and the ``cpd`` script; returns the exit status."""
    p = _parser()
    args, extra = p.parse_known_args(argv)
    command = getattr(args, "_command", None)
    if command is None:
        if extra:
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        p.print_help()
        return 2
    if extra and not command.passthrough:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    return int(command.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
