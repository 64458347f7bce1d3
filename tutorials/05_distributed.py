# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Tutorial 5: real multi-process low-precision gradients with `cpd.distributed`
#
# **What you will learn**
#
# 1. How to send DDP's gradients as 8-bit or 4-bit codes: `cpd.distributed.APSHookState` and
#    `ddp.register_comm_hook(state, cpd.distributed.aps_hook)` in an ordinary training script.
# 2. How to launch it on several local processes (the way `torchrun` does) on gloo.
# 3. That the real processes end with exactly the weights of the single-process emulation
#    (`cpd.APSOptimizer(workers=W)`): prototype in one process, deploy on many.
# 4. How many bytes each format puts on the wire, and how to skip a step with inf/NaN gradients.
#
# Two processes train a small MLP on scikit-learn's digits for a few steps (seconds).
# `CPD_TUTORIAL_SMALL=1` trains fewer steps.

# %%
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import cpd

SMALL = os.environ.get("CPD_TUTORIAL_SMALL") == "1"
WORLD = 2
STEPS = 3 if SMALL else 10
OUT = Path(os.environ.get("CPD_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="cpd_tutorial_"))
OUT.mkdir(parents=True, exist_ok=True)
print(f"cpd {cpd.__version__}: {WORLD} processes, {STEPS} steps")

# %% [markdown]
# ## 1. The training script
#
# This is what you would run with `torchrun --standalone --nproc-per-node 2 train.py`: every
# process reads its rank from the environment, wraps the model in DDP and registers the hook.
# The hook sums each DDP bucket's gradients in the chosen format (APS: one power-of-two scale
# per layer, agreed with one small `all_reduce(MAX)`), ring reduce-scatter over point-to-point
# messages, and divides by W. `state.found_inf` is True on every rank when any rank had an
# inf/NaN gradient: the loop skips that step.

# %%
SCRIPT = r'''
import json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import cpd
from cpd.demo import load_digits_tensors

torch.set_num_threads(1)
dist.init_process_group("gloo")                      # RANK, WORLD_SIZE, MASTER_ADDR/PORT from the env
rank, world = dist.get_rank(), dist.get_world_size()
formats, steps, out = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
x, y, _, _ = load_digits_tensors(seed=0)
x = x.flatten(1)

for fmt in formats:                                  # one training run per format
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    ddp = DDP(model)
    state = cpd.distributed.APSHookState(fmt, "ring", model=model, timeout=60)
    ddp.register_comm_hook(state, cpd.distributed.aps_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for step in range(steps):
        xb, yb = x[64 * step:64 * (step + 1)], y[64 * step:64 * (step + 1)]
        wx, wy = torch.tensor_split(xb, world)[rank], torch.tensor_split(yb, world)[rank]   # this rank's share
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(wx), wy).backward()   # the hook runs during backward
        if not state.found_inf:                                      # the same decision on every rank
            opt.step()
    state.close()                                    # its communication thread ends here
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out, f"weights_{fmt}.pt"))
        json.dump([{"sent": r.bytes_sent, "float32": r.float32_bytes, "exponents": r.exponent_bytes,
                    "ahead": r.encoded_ahead, "again": r.reencoded}
                   for r in state.history], open(os.path.join(out, f"bytes_{fmt}.json"), "w"))
        print(state.report)
dist.barrier()                  # every rank done before the groups are torn down
dist.destroy_process_group()
'''
script = OUT / "train_ddp.py"
script.write_text(SCRIPT)

# %% [markdown]
# ## 2. Launch two processes
#
# `torchrun` sets `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` and starts one process
# per rank; here we do the same with `subprocess` so the tutorial runs anywhere (also inside a
# notebook). Each process uses one CPU thread.

# %%
def launch(formats: list[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), ",".join(formats), str(STEPS), str(OUT)], env=env))
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0] * WORLD, f"exit codes {codes}"


FORMATS = ["e4m3", "e3m0", "e8m23"]   # 8-bit, 4-bit (packed two per byte), float32
launch(FORMATS)

# %% [markdown]
# ## 3. The same training, emulated in one process
#
# `cpd.APSOptimizer(workers=2)` splits each batch the same way and sums the two workers'
# gradients with the emulated ring allreduce. The weights agree **bit for bit** with the real
# processes: the hook follows the emulator's chunking, hop order and rounding.

# %%
def emulate(fmt: str) -> dict:
    x, y, _, _ = load_digits()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = cpd.APSOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), fmt=fmt, workers=WORLD,
                           model=model)
    for step in range(STEPS):
        xb, yb = x[64 * step:64 * (step + 1)], y[64 * step:64 * (step + 1)]
        opt.zero_grad()
        for wx, wy in opt.split(xb, yb):
            torch.nn.functional.cross_entropy(model(wx), wy).backward()
            opt.collect()
        opt.step()
    return model.state_dict()


def load_digits():
    from cpd.demo import load_digits_tensors

    x, y, xt, yt = load_digits_tensors(seed=0)
    return x.flatten(1), y, xt, yt


torch.set_num_threads(1)  # the same kernels as the one-thread worker processes
for f in FORMATS:
    real = torch.load(OUT / f"weights_{f}.pt")
    emu = emulate(f)
    same = all(torch.equal(real[k], emu[k]) for k in emu)
    print(f"{f:6s} real processes == emulation, bit for bit: {same}")
    assert same, f

# %% [markdown]
# ## 4. Bytes on the wire
#
# Each `StepReport` counts what a rank sent: the codes of the reduce-scatter and the allgather,
# plus the exponent exchange (one int32 per layer). 8-bit codes cost a quarter of float32,
# packed 4-bit codes an eighth.

# %%
print(f"{'format':8s} {'sent (rank 0, all steps)':>26s} {'float32 ring':>14s} {'ratio':>7s}")
for f in FORMATS:
    rows = json.loads((OUT / f"bytes_{f}.json").read_text())
    sent, f32 = sum(r["sent"] for r in rows), sum(r["float32"] for r in rows)
    print(f"{f:8s} {sent:24,d} B {f32:12,d} B {sent / f32:7.4f}")

# %% [markdown]
# ## 5. More
#
# * `algorithm="hierarchical", group_size=k` sums each group of k consecutive ranks at its first
#   rank, rings across the group leaders and broadcasts back (the emulator's hierarchical order);
#   `algorithm="one_rounding"` exchanges codes with `all_to_all` and sums in float32 (one
#   rounding only).
# * `cpd.APSOptimizer(opt, fmt=..., process_group=dist.group.WORLD)` does the same in `step()`
#   without DDP; `python -m cpd launch-demo --nproc 4` runs the APS demo this way.
# * A rank that raises or dies makes the others raise `cpd.distributed.CommunicationError` after
#   at most `timeout` seconds; mismatched configurations raise a `ValueError` on every rank when
#   the state is created.
# * `DDP(model, gradient_as_bucket_view=True)` works with the hook too, and is faster where the
#   CPU is the bound: the gradients are views of DDP's buckets, the hook decodes the averages into
#   them in place, and DDP copies nothing in or out (`bench_wire.py --bucket-view`).
# * On Linux the gloo socket threads of cpd's own groups run under `SCHED_BATCH` (no preemption on
#   wakeup: gloo's socket thread spins while it cannot take a lock, and preempting the thread that
#   holds it cost a scheduler tick on busy machines); `CPD_GLOO_SCHED=default` turns that off.
# * Several ranks on one machine (tests, a workstation, a CPU node): give each rank cores of its own
#   (`taskset`, `numactl`, or `os.sched_setaffinity` on every thread at the start of the rank, as
#   `bench_wire.py --pin` does). A rank's bucket, codes and received bytes then stay in its cores'
#   caches; on a 2-core machine that took the E4M3 step at 10 Gbit/s from 0.73–0.78 of DDP float32
#   to 0.61–0.73 (2-core Intel Xeon, `bench_wire.py --pin`, 26 Nov 2026). cpd pins nothing itself.

# %% [markdown]
# ## 6. Encoding ahead of the exponent exchange
#
# The APS scales are agreed on in an exponent exchange, yet the hook encodes most of each bucket
# *before* it, with the scales that bucket agreed on in the previous step, in the same pass over
# the gradients that finds their maxima (one read of the bucket instead of two). Layers whose
# agreed scale moved are encoded again; the codes that travel are always those of the agreed
# scales, so the weights above are the emulator's whatever the guess. Each `StepReport` says how
# many elements were encoded ahead and how many again (the first step has no guess):

# %%
print(f"{'format':8s} {'encoded ahead':>14s} {'encoded again':>14s}")
for f in FORMATS:
    rows = json.loads((OUT / f"bytes_{f}.json").read_text())
    ahead, again = sum(r["ahead"] for r in rows), sum(r["again"] for r in rows)
    print(f"{f:8s} {ahead:14,d} {again:14,d}")

# %% [markdown]
# ## 7. Which loop sums your wire
#
# Each ring hop decodes the received codes, adds them to this rank's in the format (exactly:
# one rounding per add, as `cpd.add`) and encodes the result, in one compiled pass. The loop
# depends on the format, the rounding mode and Kahan: `kernels.hop_path` names it. 8-bit
# formats to nearest run 8 lanes at a time; 16-bit codes (bf16, fp16) add in float32 and round
# once, in every deterministic mode; Kahan hops run in float32 lanes too; formats no identity
# covers read a table of every pair of codes (8 bits and narrower: `"tables"`, e.g. FNUZ) or call
# `add_bits` per element (`"exact"`). Below, the time of one Kahan hop of
# 2^16 bf16 codes in its lanes against `add_bits` (`CPD_WIRE_HOP=table` forces it): the same
# bytes.

# %%
import time

from cpd.distributed import kernels
from cpd.distributed.wire import WireFormat
from cpd.rounding import Rounding

print(f"{'format':10s} {'rounding':12s} {'kahan':6s} loop")
for fmt, mode, kahan in [("e4m3", "nearest", False), ("e5m2", "toward_zero", False), ("bf16", "nearest", False),
                         ("bf16", "down", False), ("e5m2", "nearest", True), ("bf16", "up", True),
                         ("e4m3fnuz", "nearest", False)]:
    path = kernels.hop_path(WireFormat(cpd.FloatFormat.parse(fmt)), Rounding(mode), False, kahan=kahan)
    print(f"{fmt:10s} {mode:12s} {str(kahan):6s} {path}")

wf = WireFormat(cpd.BF16)
g = torch.Generator().manual_seed(0)
n = 1 << 16
seg = kernels.segments([(0, n, 0)])
s_codes, x_codes, c_codes = (kernels.encode(torch.randn(n, generator=g) * k, seg, wf, Rounding.NEAREST, False)
                             for k in (1.0, 1.0, 2.0 ** -9))
timing, result = {}, {}
for path in (None, "table"):
    if path:
        os.environ["CPD_WIRE_HOP"] = path
    acc, comp = x_codes.clone(), c_codes.clone()
    t0 = time.perf_counter()
    kernels.hop(s_codes, acc, n, wf, Rounding.NEAREST, False, kahan=True, acc_c=comp, recv_c=c_codes)
    timing[path], result[path] = time.perf_counter() - t0, (acc, comp)
    os.environ.pop("CPD_WIRE_HOP", None)
same = all(torch.equal(a, b) for a, b in zip(result[None], result["table"]))
print(f"Kahan hop of {n} bf16 codes: lanes {1e3 * timing[None]:.2f} ms, add_bits {1e3 * timing['table']:.2f} ms, "
      f"same bytes: {same}")
assert same
