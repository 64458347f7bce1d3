"""The main job, ``python -m cpd demo``: emulated data-parallel training with low-precision
gradient communication, with and without APS.

A small CNN learns scikit-learn's 8x8 handwritten digits (1797 images, shipped inside
scikit-learn: no download). Every configuration starts from the same weights and sees the same
batches; each batch is split across W emulated workers whose gradients are summed by
:class:`cpd.APSOptimizer`'s allreduce in float32 (the reference), or in a low-precision format
with APS (per-layer power-of-two scaling) or without any scaling. The APS paper's Table 4 finding,
at small scale: APS keeps FP32-level accuracy in 8 bits and stays close in (3, 0), while unscaled
(3, 0) loses almost every gradient to underflow and does not learn.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import _cpu, compressors
from .aps_optimizer import APSOptimizer
from .collectives import ALGORITHMS as ALLREDUCE_ALGORITHMS
from .formats import FP32, FloatFormat
from .ops import cast

__all__ = ["DigitsCNN", "load_digits_tensors", "demo_data", "demo_configs", "run_config", "main", "setup_parser",
           "compression_table", "prepare_extension"]

DEFAULT_FORMATS = ("e5m2", "e4m3", "e3m0")


class DigitsCNN(torch.nn.Module):
    """conv(1->8, 3x3) - ReLU - maxpool - conv(8->16, 3x3) - ReLU - maxpool - fc(64->10); 3.3k weights."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def load_digits_tensors(seed: int = 0, test_frac: float = 0.2):
    """(x_train, y_train, x_test, y_test): images in [0, 1] of shape (N, 1, 8, 8), a seeded split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover
        raise SystemExit("cpd demo needs scikit-learn: pip install -e '.[demo]'") from exc
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_frac * len(x)))
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


@torch.no_grad()
def _evaluate(model, x, y):
    out = model(x)
    return (out.argmax(1) == y).float().mean().item(), torch.nn.functional.cross_entropy(out, y).item()


def demo_data(seed: int, fast: bool):
    """The demo's (x_train, y_train, x_test, y_test); ``fast``: the first 512 training images."""
    data = load_digits_tensors(seed)
    return (data[0][:512], data[1][:512], data[2], data[3]) if fast else data


def demo_configs(formats) -> list:
    """(name, fmt, scaling) of the demo's runs: float32, then per format APS and unscaled."""
    configs = [("fp32", FP32, None)]
    for f in formats:
        configs += [(f"{f.name} aps", f, "aps"), (f"{f.name} none", f, None)]
    return configs


def run_config(name, fmt, scaling, data, *, workers=8, algorithm="ring", group_size=None, epochs=40,
               batch_size=128, lr=0.1, seed=0, fp32_layers=(), progress=None, compressor=None, process_group=None):
    """Train one configuration; returns a dict of curves, final metrics and the last report.

    With ``compressor`` (then ``fmt`` and ``scaling`` are None) the gradients travel through
    :class:`cpd.APSOptimizer`'s compressed allreduce; the result also holds ``bytes`` (bytes sent
    over all steps) and ``fp32_bytes`` (the same transfers in float32).

    With ``process_group`` (``python -m cpd launch-demo``) every process is one worker: it trains
    on its ``torch.tensor_split`` share of each batch and the gradients travel between processes
    (:mod:`cpd.distributed`); the curves are the emulated run's, bit for bit. The result then also
    holds ``bytes_sent`` / ``float32_bytes``: this rank's bytes on the wire and what a float32 ring
    allreduce would have sent.
    """
    if process_group is not None:
        workers, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        sent = f32 = 0

    x_tr, y_tr, x_te, y_te = data
    torch.manual_seed(seed)
    model = DigitsCNN()
    comm = dict(compressor=compressor, scaling=None) if compressor is not None else dict(fmt=fmt, scaling=scaling)
    opt = APSOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), workers=workers,
                           algorithm=algorithm, group_size=group_size, model=model, fp32_layers=fp32_layers,
                           process_group=process_group, **comm)
    csent = [0, 0]
    gen = torch.Generator().manual_seed(seed + 1)
    hist = {"epoch": [], "train_loss": [], "test_acc": [], "test_loss": []}
    t0 = time.perf_counter()
    for epoch in range(epochs):
        perm = torch.randperm(len(x_tr), generator=gen)
        losses = []
        for i in range(0, len(perm) - batch_size + 1, batch_size):  # full batches only: equal worker shares
            idx = perm[i:i + batch_size]
            opt.zero_grad()
            wl = []
            if process_group is not None:  # this process is worker `rank`: its share, its backward
                wx, wy = torch.tensor_split(x_tr[idx], workers)[rank], torch.tensor_split(y_tr[idx], workers)[rank]
                loss = torch.nn.functional.cross_entropy(model(wx), wy)
                loss.backward()
                opt.step()
                sent, f32 = sent + opt.last_report.bytes_sent, f32 + opt.last_report.float32_bytes
                losses.append(loss.item())
                continue
            for wx, wy in opt.split(x_tr[idx], y_tr[idx]):
                loss = torch.nn.functional.cross_entropy(model(wx), wy)
                loss.backward()
                opt.collect()
                wl.append(loss.item())
            opt.step()
            if compressor is not None:
                csent[0] += opt.last_report.bytes
                csent[1] += opt.last_report.fp32_bytes
            losses.append(sum(wl) / len(wl))
        if process_group is not None:  # the workers' losses, averaged in worker order as emulated
            every = [None] * workers
            dist.all_gather_object(every, losses, group=process_group)
            losses = [sum(wl) / workers for wl in zip(*every)]
        acc, tl = _evaluate(model, x_te, y_te)
        hist["epoch"].append(epoch + 1)
        hist["train_loss"].append(sum(losses) / max(len(losses), 1))
        hist["test_acc"].append(acc)
        hist["test_loss"].append(tl)
        if progress is not None:
            progress.set_postfix_str(f"{name}: acc {100 * acc:.1f}%")
            progress.update(1)
    out = {"name": name, "fmt": opt.fmt, "scaling": scaling, "hist": hist, "report": opt.last_report,
           "skipped": opt.skipped_steps, "steps": opt.steps, "seconds": time.perf_counter() - t0,
           "test_acc": hist["test_acc"][-1], "test_loss": hist["test_loss"][-1],
           "train_loss": hist["train_loss"][-1], "bytes": csent[0], "fp32_bytes": csent[1],
           "comm": opt.compressor.name if compressor is not None else opt.fmt.name}
    if process_group is not None:
        out.update(bytes_sent=sent, float32_bytes=f32)
    return out


def prepare_extension() -> float:
    """Load cpd's CPU extension (compiled on first use, then cached) and run one cast through it,
    before any configuration is timed; returns the seconds it took."""
    t0 = time.perf_counter()
    _cpu.extension()
    cast(torch.zeros(4), FP32)
    return time.perf_counter() - t0


def results_table(results) -> str:
    header = ["config", "comm", "scaling", "test_acc", "test_loss", "train_loss", "skipped", "seconds"]
    rows = [[r["name"], r.get("comm") or r["fmt"].name, str(r["scaling"]), f"{100 * r['test_acc']:.2f}%",
             f"{r['test_loss']:.4f}", f"{r['train_loss']:.4f}", f"{r['skipped']}/{r['steps']}", f"{r['seconds']:.1f}"] for r in results]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def compression_table(results) -> str:
    """config, test accuracy, bytes sent, float32 bytes and their ratio of compressed runs."""
    header = ["config", "test_acc", "bytes", "fp32_bytes", "ratio"]
    rows = [[r["name"], f"{100 * r['test_acc']:.2f}%", str(r["bytes"]), str(r["fp32_bytes"]),
             f"{r['fp32_bytes'] / r['bytes']:.2f}" if r["bytes"] else "inf"] for r in results]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def plot(results, formats, path):
    """Training curves, and per-layer gradient exponent ranges (float32 run's last step) against
    each format's range [log2(smallest subnormal), emax + 1)."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for r in results:
        style = "-" if r["scaling"] == "aps" or r["name"] == "fp32" else "--"
        axes[0].plot(r["hist"]["epoch"], [100 * a for a in r["hist"]["test_acc"]], style, label=r["name"])
        axes[1].plot(r["hist"]["epoch"], r["hist"]["train_loss"], style, label=r["name"])
    axes[0].set(xlabel="epoch", ylabel="test accuracy (%)", title="test accuracy")
    axes[1].set(xlabel="epoch", ylabel="train loss", title="training loss", yscale="log")
    axes[0].legend(fontsize=7)
    ax = axes[2]
    ref = results[0]["report"]
    names = [lr.name for lr in ref if lr.exp_hist]
    for i, n in enumerate(names):
        h = ref[n].exp_hist
        ax.plot([min(h), max(h) + 1], [i, i], "k-", lw=6, solid_capstyle="butt")
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for j, f in enumerate(formats):
        lo, hi = math.log2(f.smallest_subnormal), f.emax + 1
        ax.axvspan(lo, hi, color=colors[j % len(colors)], alpha=0.12, label=f"{f.name} range (unscaled)")
    ax.set_yticks(range(len(names)), names)
    ax.set(xlabel="binary exponent floor(log2|g|)", title="per-layer gradient ranges (fp32 run, last step)")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _fmt_arg(s):
    try:
        return FloatFormat.parse(s)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def setup_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", dest="formats", type=_fmt_arg, action="append", metavar="FMT",
                   help="communication format, e.g. e3m0 or e5m2 (repeat for several; default e5m2, e4m3, e3m0)")
    p.add_argument("--compressor", dest="compressors", action="append", metavar="NAME",
                   help="gradient compressor instead of formats: dynamic_tree, static_tree, linear, mantissa8, "
                        "onebit, threshold[:tau], adaptive[:pi], bitpack16, or a format name (repeat for several; "
                        "see cpd.compressors)")
    p.add_argument("--workers", type=int, default=8, help="emulated workers (default 8)")
    p.add_argument("--algorithm", default="ring", choices=["ring", "hierarchical", "tree", "sequential", "pairwise"],
                   help="allreduce order (pairwise: compressed runs only)")
    p.add_argument("--group-size", type=int, default=None, help="workers per group (hierarchical)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default 40; 2 with --fast)")
    p.add_argument("--batch-size", type=int, default=128, help="global batch size (default 128)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (momentum 0.9; default 0.1)")
    p.add_argument("--fp32-last", action="store_true", help="keep the classifier (fc) in float32, as the APS paper")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fast", action="store_true", help="tiny run for the test suite (seconds)")
    p.add_argument("--out", type=Path, default=Path("."), help="directory of the plot (default: current directory)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")


def main(args: argparse.Namespace) -> int:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    comps = []
    for c in getattr(args, "compressors", None) or ():
        try:
            comps.append(compressors.get(c))
        except (TypeError, ValueError) as exc:
            raise SystemExit(f"cpd demo: --compressor: {exc}") from None
    if comps and args.algorithm not in compressors.ALGORITHMS:
        raise SystemExit(f"cpd demo: with --compressor, --algorithm must be one of {list(compressors.ALGORITHMS)}")
    if args.algorithm == "pairwise" and not comps:
        raise SystemExit("cpd demo: --algorithm pairwise applies to --compressor runs only")
    formats = args.formats or ([] if comps else [FloatFormat.parse(f) for f in DEFAULT_FORMATS])
    epochs = args.epochs if args.epochs is not None else (2 if args.fast else 40)
    if epochs < 1 or args.workers < 1:
        raise SystemExit("cpd demo: --epochs and --workers must be >= 1")
    if args.algorithm == "hierarchical" and (args.group_size is None or args.workers % args.group_size):
        raise SystemExit(f"cpd demo: --algorithm hierarchical needs --group-size dividing --workers={args.workers}")
    if args.algorithm != "hierarchical" and args.group_size is not None:
        raise SystemExit("cpd demo: --group-size applies to --algorithm hierarchical only")
    if args.batch_size < args.workers:
        raise SystemExit("cpd demo: --batch-size must be >= --workers")
    torch.manual_seed(args.seed)
    data = demo_data(args.seed, args.fast)
    configs = demo_configs(formats) + [(c.name, None, None, c) for c in comps]
    gs = f", group size {args.group_size}" if args.group_size else ""
    print(f"cpd demo: data-parallel training of a small CNN on scikit-learn's 8x8 digits "
          f"({len(data[0])} train / {len(data[2])} test images)")
    print(f"{args.workers} emulated workers, {args.algorithm} allreduce{gs}, batch {args.batch_size} "
          f"({args.batch_size // args.workers} per worker), {epochs} epochs, SGD lr {args.lr} momentum 0.9, "
          f"seed {args.seed}" + (", fc in float32" if args.fp32_last else ""))
    print("gradient communication: fp32 (reference), and per format: APS (per-layer power-of-two scaling) "
          "or none (unscaled)\n", flush=True)
    print("loading cpd's CPU extension (compiled on first use: a few minutes; cached after) ...", flush=True)
    print(f"ready in {prepare_extension():.1f} s (not counted in the table's seconds)\n", flush=True)
    bar = tqdm(total=epochs * len(configs), desc="training", unit="epoch") if tqdm else None
    results = []
    try:
        for name, f, scaling, *comp in configs:
            alg = args.algorithm if comp or args.algorithm in ALLREDUCE_ALGORITHMS else "ring"
            results.append(run_config(name, f, scaling, data, workers=args.workers, algorithm=alg,
                                      group_size=args.group_size, epochs=epochs, batch_size=args.batch_size,
                                      lr=args.lr, seed=args.seed, progress=bar, compressor=comp[0] if comp else None,
                                      fp32_layers=("fc",) if args.fp32_last and f != FP32 else ()))
    finally:
        if bar is not None:
            bar.close()
    print("\nResults (final epoch; test set of held-out digits; skipped = steps skipped for inf/NaN; seconds = "
          "training and evaluation of that configuration only)\n")
    print(results_table(results))
    if comps:
        print("\nBytes on the wire (all steps, all links; fp32 = the same transfers in float32)\n")
        print(compression_table([r for r in results if r.get("bytes")]))
        print(f"\nPer-layer bytes and error of the last step's allreduce, {comps[-1].name}:\n")
        print(results[-1]["report"])
    if formats:
        last = [r for r in results if r["fmt"] == formats[-1]]
        print(f"\nPer-layer round-off of the last step's allreduce, {formats[-1].name} "
              "(eq5 = the APS paper's Eq. 5 mean relative error; underflow = gradients flushed to 0):\n")
        for r in last:
            print(r["report"])
            print()
    if not args.no_plot:
        args.out.mkdir(parents=True, exist_ok=True)
        path = plot(results, formats, args.out / "cpd_demo.png")
        print(f"plot: {path}")
    return 0
