"""``python -m cpd launch-demo``: the APS demo (cpd/demo.py) across real local processes.

``--nproc N`` spawns N gloo processes on 127.0.0.1 (``torch.multiprocessing``, one CPU thread
each); under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) the command is one of torchrun's processes:

    torchrun --standalone --nproc-per-node 4 -m cpd launch-demo --fast

Every process is one data-parallel worker; the gradients travel as low-precision codes
(:mod:`cpd.distributed`). Rank 0 prints the emulated demo's table (the same numbers as
``python -m cpd demo --workers N``: the real path gives the emulator's bits) and the bytes every
configuration sent, against a float32 ring allreduce.

``--compressor NAME`` (repeatable: ``onebit``, ``threshold:0.01``, ``adaptive``, ``dynamic_tree``,
``e5m2``, ...) trains with that gradient compressor instead of the formats
(``cpd.APSOptimizer(compressor=..., process_group=...)``; ``--algorithm ring`` or ``pairwise``):
the compressor's payloads travel between the processes, with the emulated demo's bits.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cpd

from . import _cpu
from .demo import DEFAULT_FORMATS, demo_configs, demo_data, results_table, run_config
from .demo import setup_parser as demo_parser

__all__ = ["setup_parser", "main"]


def setup_parser(p: argparse.ArgumentParser) -> None:
    demo_parser(p)
    for action in p._actions:  # the real path's algorithms; W is --nproc
        if action.dest == "algorithm":
            action.choices = ("ring", "hierarchical", "one_rounding", "pairwise")
        if action.dest == "workers":
            action.help = "ignored: every process is one worker (see --nproc)"
    p.add_argument("--nproc", type=int, default=4, help="local processes (workers) to spawn (default 4)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a rank waits for a peer (default 120)")
    p.set_defaults(no_plot=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bytes_table(results, world: int) -> str:
    """Bytes on the wire per configuration, summed over the ranks and steps."""
    header = ["config", "comm", "sent (all ranks)", "float32 ring", "ratio", "saved"]
    rows = []
    for r in results:
        sent, f32 = r["bytes_sent"], r["float32_bytes"]
        ratio = sent / f32 if f32 else float("nan")
        rows.append([r["name"], r["comm"], f"{sent:,} B", f"{f32:,} B", f"{ratio:.4f}", f"{100 * (1 - ratio):.1f}%"])
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(x) for x in rows)])


def _rank_main(rank: int, world: int, args: argparse.Namespace) -> None:
    """One worker: run every configuration of the demo with real communication."""
    torch.set_num_threads(1)
    compressors = [cpd.compressors.get(c) for c in getattr(args, "compressors", None) or ()]
    formats = args.formats or ([] if compressors else [cpd.FloatFormat.parse(f) for f in DEFAULT_FORMATS])
    epochs = args.epochs if args.epochs is not None else (2 if args.fast else 40)
    data = demo_data(args.seed, args.fast)
    configs = demo_configs(formats) + [(c.name, None, None, c) for c in compressors]
    if rank == 0:
        gs = f", group size {args.group_size}" if args.group_size else ""
        print(f"cpd launch-demo: {world} gloo processes on 127.0.0.1, {args.algorithm} allreduce{gs}; data-parallel "
              f"training of a small CNN on scikit-learn's 8x8 digits ({len(data[0])} train / {len(data[2])} test)")
        print(f"batch {args.batch_size} ({args.batch_size // world} per process), {epochs} epochs, SGD lr {args.lr} "
              f"momentum 0.9, seed {args.seed}; gradients travel as low-precision codes (cpd.distributed)\n", flush=True)
    results = []
    for name, f, scaling, *comp in configs:
        alg = "ring" if args.algorithm == "pairwise" and not comp else args.algorithm  # fp32: the ring
        r = run_config(name, f, scaling, data, algorithm=alg, group_size=args.group_size, epochs=epochs,
                       batch_size=args.batch_size, lr=args.lr, seed=args.seed, process_group=dist.group.WORLD,
                       fp32_layers=("fc",) if args.fp32_last and f != cpd.FP32 else (),
                       compressor=comp[0] if comp else None)
        every = [None] * world
        dist.all_gather_object(every, (r["bytes_sent"], r["float32_bytes"]))
        r["bytes_sent"], r["float32_bytes"] = sum(e[0] for e in every), sum(e[1] for e in every)
        results.append(r)
        if rank == 0:
            print(f"  {name}: test accuracy {100 * r['test_acc']:.2f}%", flush=True)
    if rank == 0:
        print("\nResults (final epoch; the same numbers as `python -m cpd demo --workers "
              f"{world}` with the same options)\n")
        print(results_table(results))
        print(f"\nBytes on the wire ({world} processes, every step, exponent exchange included; float32 ring = "
              "what a float32 ring allreduce sends)\n")
        print(bytes_table(results, world))
        print(f"\nlast step, rank 0: {results[-1]['report']}", flush=True)


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    _cpu.extension()  # loaded before the rendezvous, so that no rank waits for a peer's load
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    _rank_main(rank, world, args)
    dist.barrier()  # every rank done before the groups are torn down
    dist.destroy_process_group()


def main(args: argparse.Namespace) -> int:
    try:
        compressors = [cpd.compressors.get(c) for c in getattr(args, "compressors", None) or ()]
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"cpd launch-demo: --compressor: {exc}") from None
    if compressors and args.algorithm not in cpd.compressors.ALGORITHMS:
        raise SystemExit(f"cpd launch-demo: with --compressor, --algorithm must be one of "
                         f"{list(cpd.compressors.ALGORITHMS)}")
    if args.algorithm == "pairwise" and not compressors:
        raise SystemExit("cpd launch-demo: --algorithm pairwise applies to --compressor runs only")
    if args.algorithm not in ("ring", "hierarchical", "one_rounding", "pairwise"):
        raise SystemExit(f"cpd launch-demo: --algorithm {args.algorithm} has no real implementation; "
                         "use ring or hierarchical")
    _cpu.extension()  # built (or waited for) here, before any rank's --timeout runs
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
        _rank_main(dist.get_rank(), dist.get_world_size(), args)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    if args.nproc < 1:
        raise SystemExit(f"cpd launch-demo: --nproc={args.nproc} must be >= 1")
    if args.batch_size < args.nproc:
        raise SystemExit("cpd launch-demo: --batch-size must be >= --nproc")
    if args.algorithm == "hierarchical" and (args.group_size is None or args.nproc % args.group_size):
        raise SystemExit(f"cpd launch-demo: --algorithm hierarchical needs --group-size dividing --nproc={args.nproc}")
    clean = argparse.Namespace(**{k: v for k, v in vars(args).items() if not k.startswith("_")})  # picklable
    mp.spawn(_spawned, args=(args.nproc, _free_port(), clean), nprocs=args.nproc, join=True)
    return 0
