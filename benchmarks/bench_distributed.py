"""Time of a DDP step with cpd.distributed.aps_hook against DDP's own float32 allreduce.

Spawns ``--nproc`` gloo processes on 127.0.0.1 (one CPU thread each); each times, interleaved,
``--reps`` backward passes of an MLP with the default hook and with the APS hook (e4m3 ring,
and (3, 0) packed 4-bit), and rank 0 prints medians as ratios to the default, with the bytes the
APS hook sent relative to a float32 ring allreduce. On one machine the "network" is memory, so
the ratio measures the hook's compute (encode, per-hop low-precision add, decode), not the
bandwidth saving a real network would see.

    python benchmarks/bench_distributed.py --nproc 2 --width 512 --reps 7
"""

from __future__ import annotations

import argparse
import datetime
import socket
import statistics
import time

import torch


def _worker(rank: int, world: int, port: int, opts) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cpd

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    w = opts.width

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                   torch.nn.Linear(w, 10))

    runs = {"float32 allreduce (default)": (DDP(model()), None)}
    for fmt in ("e4m3", cpd.FloatFormat(3, 0)):
        m = model()
        ddp = DDP(m)
        state = cpd.distributed.APSHookState(fmt, "ring", model=m, timeout=300)
        ddp.register_comm_hook(state, cpd.distributed.aps_hook)
        runs[f"aps_hook {cpd.FloatFormat.parse(fmt).name}"] = (ddp, state)
    x = torch.randn(64, w, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(rank))
    times = {k: [] for k in runs}
    for rep in range(opts.reps + 1):
        for name, (ddp, _) in runs.items():
            ddp.zero_grad()
            dist.barrier()
            t0 = time.perf_counter()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            dist.barrier()
            if rep:  # the first round warms up (bucket rebuild, first casts)
                times[name].append(time.perf_counter() - t0)
    if rank == 0:
        base = statistics.median(times["float32 allreduce (default)"])
        n = sum(p.numel() for p in model().parameters())
        print(f"{world} gloo processes, MLP of {n:,} weights, {opts.reps} reps (medians; ratios to the default hook)")
        for name, (_, state) in runs.items():
            t = statistics.median(times[name])
            extra = f"   bytes sent / float32 ring {state.report.ratio:.4f}" if state is not None else ""
            print(f"  {name:30s} {1e3 * t:8.2f} ms  {t / base:6.2f}x{extra}")
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--reps", type=int, default=7)
    opts = p.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(opts.nproc, port, opts), nprocs=opts.nproc, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
