"""Step time of low-bit gradient communication on a throttled network: DDP float32, torch's
fp16_compress_hook, a no-op hook (the floor: no communication at all), cpd E4M3 and cpd packed
4-bit ((3, 0)), as ratios to DDP float32.

Method (rerun it anywhere you are root; traffic stays on a private loopback):

* for each RATE the benchmark re-executes itself inside a private network namespace
  (``unshare --net``), brings its loopback up and, unless RATE is ``unthrottled``, shapes it with
  ``tc qdisc add dev lo root tbf rate RATE burst 256kb latency 100ms``;
* there it spawns N gloo processes (one CPU thread each) on 127.0.0.1; every process builds the same
  MLP (three Linear layers, 4.7M weights, 18.9 MB of float32 gradients) under DDP five times, one
  per variant, and times ``loss.backward()`` (backward + communication: DDP waits for every
  bucket's future at the end of backward) between barriers, variants interleaved rep by rep, on
  a new batch every rep (so the APS scales move from step to step as in training);
* rank 0 prints the medians and their ratios to DDP float32, and the bytes a rank sends per step
  (cpd: counted by the engine's StepReport; DDP/fp16: the ring model 2(W-1)/W n x itemsize);
  the no-op hook's ratio is the floor: backward and DDP's bucketing alone, below which no
  communication hook can go on the same machine.

    python benchmarks/bench_wire.py                      # RATE in 1gbit 10gbit unthrottled, N in 2 4
    python benchmarks/bench_wire.py --rates 1gbit --nproc 2 --reps 9
    python benchmarks/bench_wire.py --kernels            # only the single-thread kernel rates
    python benchmarks/bench_wire.py --model deep         # 194 small tensors instead of the MLP's 6
    python benchmarks/bench_wire.py --bucket-view        # every variant with gradient_as_bucket_view=True
    python benchmarks/bench_wire.py --pin                # each rank's threads on cores of its own

The machine (CPU model, ISA level, cores) is printed first; on a shared machine say so with the
figures. By default the scheduler places every thread of every rank on any core, as ``torchrun``
does; ``--pin`` gives each rank its own cores (an equal share, in rank order; with more ranks than
cores, rank r on core r mod cores), as separate machines would have, so that a rank's data stays
in its cores' caches. Without root or ``unshare`` the throttled rates are skipped with a message.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the shared table format
from _figures import parse_markdown, record  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("ddp float32", "torch fp16 hook", "no-op hook (floor)", "cpd e4m3", "cpd e3m0 (4-bit)")
#: Run only when named in --variants: Kahan sums, a directed mode on 16-bit codes.
EXTRA_VARIANTS = ("cpd e5m2 kahan", "cpd bf16 toward_zero")
CPD_VARIANTS = VARIANTS[3:] + EXTRA_VARIANTS
#: --model deep: DEEP_BLOCKS blocks of Linear(DEEP_WIDTH) + LayerNorm(DEEP_WIDTH) and a Linear head:
#: 194 parameter tensors, 3.2M weights (the MLP: 6 tensors, 4.7M weights).
DEEP_BLOCKS, DEEP_WIDTH = 48, 256


def _noop_hook(state, bucket):
    """The floor of any communication hook: DDP's bucketing and futures with no communication at
    all (the bucket comes back unchanged). Its step is backward plus DDP's own overhead; no hook,
    however little it sends, can be faster on the same machine."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def machine() -> str:
    model = "unknown CPU"
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name"))
        flags = next(ln for ln in text.splitlines() if ln.startswith("flags")).split()
        isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    except (OSError, StopIteration):
        isa = "?"
    return f"{model}, {isa}, {os.cpu_count()} cores, {platform.machine()}, torch {torch.__version__}"


# ------------------------------------------------------------------------------------ the worker
def rank_cores(rank: int, world: int, cores: list[int]) -> list[int]:
    """--pin: the cores of ``rank``: an equal share of ``cores`` in rank order, or (more ranks
    than cores) core ``rank mod len(cores)``."""
    k = len(cores) // world
    return cores[rank * k:(rank + 1) * k] if k else [cores[rank % len(cores)]]


def _pin(rank: int, world: int) -> None:
    """Every thread of this process (and those it starts later) on this rank's cores."""
    cores = rank_cores(rank, world, sorted(os.sched_getaffinity(0)))
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cores)


def _worker(rank: int, world: int, port: int, opts, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cpd

    if opts.pin:
        _pin(rank, world)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    w = opts.width if opts.model == "mlp" else DEEP_WIDTH

    def model():
        torch.manual_seed(0)
        if opts.model == "deep":  # many small tensors: what per-layer costs look like
            blocks = [m for _ in range(DEEP_BLOCKS) for m in (torch.nn.Linear(w, w), torch.nn.LayerNorm(w))]
            return torch.nn.Sequential(*blocks, torch.nn.Linear(w, 10))
        return torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                   torch.nn.Linear(w, 10))

    prof = _Profile() if opts.profile else None
    runs = {}
    if prof is not None:  # backward alone (no DDP, no communication): what overlap could hide
        runs["backward alone"] = (model(), None)
    kw = {} if opts.bucket_cap_mb is None else {"bucket_cap_mb": opts.bucket_cap_mb}  # the same for every variant
    if opts.bucket_view:
        kw["gradient_as_bucket_view"] = True
    ddp = DDP(model(), **kw)
    runs[VARIANTS[0]] = (ddp, None)
    ddp = DDP(model(), **kw)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    runs[VARIANTS[1]] = (ddp, None)
    ddp = DDP(model(), **kw)
    ddp.register_comm_hook(None, _noop_hook)
    runs[VARIANTS[2]] = (ddp, None)
    configs = (("e4m3", {}), (cpd.FloatFormat(3, 0), {}), ("e5m2", {"kahan": True}),
               ("bf16", {"rounding": "toward_zero"}))  # (fmt, APSHookState options) of CPD_VARIANTS
    for name, (fmt, extra) in zip(CPD_VARIANTS, configs):
        if (name not in opts.variants) if opts.variants else name in EXTRA_VARIANTS:
            continue
        m = model()
        ddp = DDP(m, **kw)
        state = cpd.distributed.APSHookState(fmt, "ring", model=m, timeout=600, **extra)
        ddp.register_comm_hook(state, cpd.distributed.aps_hook)
        runs[name] = (ddp, state)
    times = {k: [] for k in runs}
    ahead = {k: [0, 0] for k in runs}  # cpd: elements encoded ahead of the exponent exchange, and again
    for rep in range(opts.reps + 2):
        # a new batch every rep (the same for every variant): the gradients, their maxima and so
        # the APS scales vary from step to step as in training
        gen = torch.Generator().manual_seed(1000 * rep + rank)
        x = torch.randn(opts.batch, w, generator=gen)
        y = torch.randint(0, 10, (opts.batch,), generator=gen)
        for name, (ddp, state) in runs.items():
            ddp.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            dist.barrier()
            if prof is not None:
                prof.start(name, rep >= 2)
            t0 = time.perf_counter()
            loss.backward()
            t = time.perf_counter() - t0
            if prof is not None:
                prof.stop(t0)
            dist.barrier()
            if rep >= 2:  # two warm-up rounds (bucket rebuild, kernel tables, first messages)
                times[name].append(t)
                if state is not None:
                    ahead[name][0] += state.report.encoded_ahead
                    ahead[name][1] += state.report.reencoded
    if rank == 0:
        n = sum(p.numel() for p in model().parameters())
        ring = cpd.distributed.float32_ring_bytes([n], world)
        res = {"world": world, "params": n, "reps": opts.reps, "kernels": cpd.distributed.kernels.compiled(),
               "variants": {}}
        for name, (_, state) in runs.items():
            if name == "backward alone":
                res["backward_alone_s"] = statistics.median(times[name])
                continue
            sent = (state.report.bytes_sent if state is not None else 0 if "no-op" in name
                    else ring // (2 if "fp16" in name else 1))
            res["variants"][name] = {"median_s": statistics.median(times[name]), "times": times[name], "sent": sent,
                                     "counted": state is not None or "no-op" in name, "ahead": ahead[name]}
        if prof is not None:
            res["profile"] = prof.table(opts.reps)
        Path(out).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


class _Profile:
    """``--profile``: where a cpd step's time goes, per variant (rank 0's view). Wraps the fused
    kernels, the transport's waits and collectives, and the hook's bucket function, and sums their
    wall time over the timed reps; "hook -> future done" is the time from the last bucket's hook
    call to its future's completion, "after backward" how long ``loss.backward()`` went on after
    the autograd work proper (measured by the step end minus the last hook call).

    CPU time too, which wall time hides when threads wait for a core: "cpu ..." entries are the
    calling thread's CPU time in the same wrapped calls (the communication thread's, for the
    kernels and the bucket function), "process CPU user / system" the whole process's per step
    (every thread: backward, the communication thread, gloo's socket threads)."""

    def __init__(self):
        import cpd.distributed.hook as hook_mod
        import cpd.distributed.kernels as kernels
        from cpd.distributed.transport import Transport

        self.tot: dict = {}
        self.variant, self.on = None, False
        self.last_hook = 0.0
        self.first_hook = None
        for mod in (kernels,):
            for fn in ("encode", "hop", "decode", "absmax"):
                self._wrap(mod, fn, f"kernel {fn}")
        for fn in ("wait", "all_reduce_max", "batch", "all_gather", "isend", "irecv"):
            self._wrap(Transport, fn, f"transport {fn}")
        import cpd.distributed.reduce_format as rf
        for fn in ("reduce", "exponents", "_encode_ahead", "_stream"):
            self._wrap(rf.FormatReducer, fn, f"reducer {fn}")
        for fn in ("ring", "layout"):
            self._wrap(rf, fn, f"reduce_format.{fn}")
        self._wrap(hook_mod.APSHookState, "_run_bucket", "bucket (comm thread)")
        prof = self
        orig = hook_mod.aps_hook

        def hook(state, bucket):
            t = time.perf_counter()
            if prof.first_hook is None:
                prof.first_hook = t
            prof.last_hook = t
            fut = orig(state, bucket)
            if bucket.is_last():
                def done(f, t=t):
                    prof._add("last bucket: hook -> future done", time.perf_counter() - t)
                    return f.value()
                return fut.then(done)
            return fut
        hook.__annotations__ = orig.__annotations__
        hook_mod.aps_hook = hook
        import cpd.distributed
        cpd.distributed.aps_hook = hook

    def _add(self, key, dt):
        if self.on:
            d = self.tot.setdefault(self.variant, {})
            d[key] = d.get(key, 0.0) + dt

    def _wrap(self, owner, name, key):
        orig = getattr(owner, name)
        prof = self

        def wrapped(*a, **k):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return orig(*a, **k)
            finally:
                prof._add(key, time.perf_counter() - t)
                prof._add("cpu " + key, time.thread_time() - c)
        setattr(owner, name, wrapped)

    def start(self, variant, on):
        self.variant, self.on, self.first_hook = variant, on, None
        self.usage = resource.getrusage(resource.RUSAGE_SELF)

    def stop(self, t0):
        u = resource.getrusage(resource.RUSAGE_SELF)
        self._add("process CPU user", u.ru_utime - self.usage.ru_utime)
        self._add("process CPU system", u.ru_stime - self.usage.ru_stime)
        if self.first_hook is not None:
            self._add("backward start -> first hook", self.first_hook - t0)
            self._add("last hook -> backward returns", time.perf_counter() - self.last_hook)

    def table(self, reps):
        return {v: {k: 1e3 * t / reps for k, t in d.items()} for v, d in self.tot.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inner(opts) -> int:
    """Inside the namespace: loopback up, shaped, then the N processes."""
    import torch.multiprocessing as mp

    if opts.netns:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        if opts.rate != "unthrottled":
            subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", opts.rate, "burst", "256kb",
                            "latency", "100ms"], check=True)
    mp.spawn(_worker, args=(opts.nproc[0], _free_port(), opts, opts.out), nprocs=opts.nproc[0], join=True)
    return 0


# ------------------------------------------------------------------------------------ kernels
def kernel_rates(n: int = 1 << 22, reps: int = 7) -> str:
    """Single-thread throughput of the fused kernels (G elements/s; best of ``reps``, CPU time of the
    calling thread, so that other load on a shared machine counts less), measured side by side.

    The hop is timed for every kind of format it serves: the 8-bit formats of the vector path
    (e4m3, e4m3fn, e5m2: binary16-view decode and 8-lane rounding, ``cuda/cpu/hop_avx2.h``), the same
    formats through the scalar loop (``CPD_WIRE_HOP=scalar``: a float table per code) and through the
    64 KiB pair tables (``CPD_WIRE_HOP=table``), on the codes of a gradient-like bucket (Gaussian
    values, APS scaled) and on uniformly random codes of finite values; e4m3 in the directed modes;
    the packed 4-bit (3, 0) and a 6-bit format (pair tables on whole bytes, on code pairs); bf16 and
    fp16 through the wide loop (float32 add, one rounding: with the AVX2 + F16C decode, and with its
    table decode, ``CPD_WIRE_HOP=scalar``) and through ``add_bits`` per element (``CPD_WIRE_HOP=table``:
    the loop they took before the wide one), on the gradient and on uniformly random finite codes,
    and through the wide loop in the directed modes toward_zero and down (gradient codes); the Kahan
    hop of e4m3, e5m2 and bf16 in float32 lanes and through ``add_bits`` (``CPD_WIRE_HOP=table``)."""
    import cpd
    from cpd.distributed import kernels
    from cpd.distributed.layout import layout
    from cpd.rounding import Rounding

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g) * 2.0 ** -10
    rows = ["| kernel | format | codes | path | ns / element | G elements / s (1 thread) |", "|---|---|---|---|---|---|"]

    def rate(fn, m=n):  # CPU time of this thread (1 torch thread: the kernels run here), robust to other load
        fn()
        best = float("inf")
        for _ in range(reps):
            t0 = time.thread_time()
            fn()
            best = min(best, time.thread_time() - t0)
        return best / m

    def hop_rate(buf, acc0, m, wf, mode, variant):
        acc = acc0.clone()
        old = os.environ.pop("CPD_WIRE_HOP", None)
        if variant:
            os.environ["CPD_WIRE_HOP"] = variant
        try:
            # each call restores the accumulator first (else sums grow to inf); the copy's own
            # time, measured alone, is taken off
            both = rate(lambda: (acc.copy_(acc0), kernels.hop(buf, acc, m, wf, mode, False)), m)
            return max(both - rate(lambda: acc.copy_(acc0), m), 1e-12)
        finally:
            os.environ.pop("CPD_WIRE_HOP", None)
            if old is not None:
                os.environ["CPD_WIRE_HOP"] = old

    def row(kernel, fmt, codes, path, t):
        rows.append(f"| {kernel} | {fmt} | {codes} | {path} | {1e9 * t:.2f} | {1e-9 / t:.2f} |")

    paths8 = (("vector (AVX2 + F16C)", None), ("scalar loop", "scalar"), ("pair tables", "table"))
    paths16 = (("wide, vector decode", None), ("wide, table decode", "scalar"), ("add_bits per element", "table"))
    for name in ("e4m3", "e4m3fn", "e5m2", "e3m0", "e3m2", "bf16", "fp16", "tf32"):
        fmt = cpd.FloatFormat(3, 0) if name == "e3m0" else cpd.FloatFormat(3, 2, specials="finite") \
            if name == "e3m2" else cpd.FloatFormat.parse(name)
        m = n if fmt.bits <= 8 else n // 4
        lay = layout(fmt, (m,), 1)
        segs = lay.segments(0, [0], [fmt.emax + 7])
        xs = x[:m]
        buf = kernels.encode(xs, segs, lay.wf, Rounding.NEAREST, False)
        acc = kernels.encode(torch.roll(xs, 1), segs, lay.wf, Rounding.NEAREST, False)
        out = torch.empty(m)
        if name in ("e4m3", "e3m0", "bf16"):
            t = rate(lambda: kernels.encode(xs, segs, lay.wf, Rounding.NEAREST, False, out=acc.clone()), m)
            row("encode (scale, cast, pack)", fmt.name, "gradient", "", t)
        hops = [("gradient", buf, acc, Rounding.NEAREST, "", None)]
        if fmt.bits == 8:
            fin = torch.nonzero(torch.isfinite(cpd.decode(torch.arange(256), fmt))).flatten()
            ra, rb = (fin[torch.randint(0, fin.numel(), (m,), generator=g)].to(torch.uint8) for _ in range(2))
            hops = [(codes, a, b, Rounding.NEAREST, path, var) for codes, a, b in (("gradient", buf, acc),
                                                                                  ("uniform", ra, rb))
                    for path, var in paths8]
            if name == "e4m3":
                hops += [("gradient", buf, acc, mode, path, var) for mode in (Rounding.TOWARD_ZERO, Rounding.DOWN)
                         for path, var in paths8[:2]]
        if fmt.bits == 16:
            fin = torch.nonzero(torch.isfinite(cpd.decode(torch.arange(1 << 16), fmt))).flatten()
            ra, rb = (kernels.to_bytes(cpd.decode(fin[torch.randint(0, fin.numel(), (m,), generator=g)], fmt), lay.wf)
                      for _ in range(2))
            hops = [(codes, a, b, Rounding.NEAREST, path, var) for codes, a, b in (("gradient", buf, acc),
                                                                                  ("uniform", ra, rb))
                    for path, var in paths16]
            # the directed modes (cpd::sum_f32_directed's corrected sums): gradient codes, both decodes
            hops += [("gradient", buf, acc, mode, path, var) for mode in (Rounding.TOWARD_ZERO, Rounding.DOWN)
                     for path, var in paths16[:2]]
        for codes, a, b, mode, path, variant in hops:
            # add_bits per element is slow: a sixteenth of the elements
            t = hop_rate(a, b, m // 16 if variant == "table" and fmt.bits == 16 else m, lay.wf, mode, variant)
            label = "hop (decode, add, encode)" + ("" if mode == Rounding.NEAREST else f", {mode.name.lower()}")
            row(label, fmt.name, codes, path, t)
        if name in ("e4m3", "e3m0", "bf16", "tf32"):
            t = rate(lambda: kernels.decode(buf, segs, out, lay.wf, 0.5), m)
            row("decode (unscale, 1/W)", fmt.name, "gradient", "", t)
        if name in ("e4m3", "e5m2", "bf16"):  # Kahan (a received compensation), float32 lanes and add_bits
            comp = kernels.encode(torch.roll(xs, 2) * 2.0 ** -6, segs, lay.wf, Rounding.NEAREST, False)
            for path, var in (("float32 lanes", None), ("add_bits per element", "table")):
                k = m // 16 if var else m
                old = os.environ.pop("CPD_WIRE_HOP", None)
                if var:
                    os.environ["CPD_WIRE_HOP"] = var
                try:
                    acc_k, c_k = acc.clone(), comp.clone()
                    both = rate(lambda: (acc_k.copy_(acc), c_k.copy_(comp), kernels.hop(
                        buf, acc_k, k, lay.wf, Rounding.NEAREST, False, kahan=True, recv_c=comp, acc_c=c_k)), k)
                    t = max(both - rate(lambda: (acc_k.copy_(acc), c_k.copy_(comp)), k), 1e-12)
                finally:
                    os.environ.pop("CPD_WIRE_HOP", None)
                    if old is not None:
                        os.environ["CPD_WIRE_HOP"] = old
                row("hop, Kahan (decode, 4 adds, encode)", fmt.name, "gradient", path, t)
    return "\n".join(rows)


# ------------------------------------------------------------------------------------ the driver
def run_one(rate: str, nproc: int, opts) -> dict | None:
    out = Path(tempfile.mkdtemp(prefix="bench_wire_")) / "res.json"
    cmd = [sys.executable, __file__, "--inner", "--rates", rate, "--nproc", str(nproc), "--reps", str(opts.reps),
           "--width", str(opts.width), "--batch", str(opts.batch), "--model", opts.model, "--out", str(out)] + (
           ["--bucket-cap-mb", str(opts.bucket_cap_mb)] if opts.bucket_cap_mb is not None else []) + (
           ["--profile"] if opts.profile else []) + (["--variants", *opts.variants] if opts.variants else []) + (
           ["--bucket-view"] if opts.bucket_view else []) + (["--pin"] if opts.pin else [])
    netns = shutil.which("unshare") is not None and os.geteuid() == 0
    if netns:
        cmd = ["unshare", "--net", "--", *cmd, "--netns"]
    elif rate != "unthrottled":
        print(f"  {rate}: skipped (needs root and unshare for a private, shaped loopback)")
        return None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        print(f"  {rate} N={nproc}: failed\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return None
    res = json.loads(out.read_text())
    res["rate"], res["wall_s"] = rate, time.monotonic() - t0
    return res


def table(results: list[dict]) -> str:
    lines = ["| rate | N | variant | median step (ms) | / DDP float32 | / fp16 hook | bytes sent per rank |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        v = r["variants"]
        base, fp16 = v[VARIANTS[0]]["median_s"], v[VARIANTS[1]]["median_s"]
        for name in VARIANTS + EXTRA_VARIANTS:
            if name not in v:
                continue
            t = v[name]["median_s"]
            sent = f"{v[name]['sent'] / 1e6:.2f} MB" + ("" if v[name]["counted"] else " (ring model)")
            lines.append(f"| {r['rate']} | {r['world']} | {name} | {1e3 * t:.1f} | {t / base:.2f} | {t / fp16:.2f} "
                         f"| {sent} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", nargs="+", default=["1gbit", "10gbit", "unthrottled"])
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--width", type=int, default=1536, help="MLP width (1536: 4.7M weights)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--model", choices=("mlp", "deep"), default="mlp",
                   help=f"mlp: three Linear layers of --width (6 tensors); deep: {DEEP_BLOCKS} blocks of "
                        f"Linear({DEEP_WIDTH}) + LayerNorm (194 tensors, 3.2M weights: per-layer costs)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP's bucket_cap_mb for every variant alike (default: DDP's 25)")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP(gradient_as_bucket_view=True) for every variant alike: the gradients are views of "
                        "DDP's buckets, so DDP copies them neither in nor out (its documented speed option)")
    p.add_argument("--pin", action="store_true",
                   help="each rank's threads on cores of its own (an equal share; with more ranks than cores, "
                        "rank r on core r mod cores), as on separate machines; default: the scheduler's choice")
    p.add_argument("--no-kernels", action="store_true", help="skip the single-thread kernel rates")
    p.add_argument("--kernels", action="store_true", help="only the single-thread kernel rates")
    p.add_argument("--variants", nargs="+", choices=CPD_VARIANTS,
                   help="only these cpd variants (DDP float32, the fp16 hook and the no-op floor always run; "
                        f"{' and '.join(repr(v) for v in EXTRA_VARIANTS)} only when named here)")
    p.add_argument("--profile", action="store_true",
                   help="also time backward alone and break the cpd steps down (kernels, waits, hook)")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--netns", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.pin and not (hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")):
        p.error("--pin needs Linux (os.sched_setaffinity on every thread of /proc/self/task)")
    if opts.inner:
        opts.rate = opts.rates[0]
        return inner(opts)
    print(f"machine: {machine()}")
    if not opts.no_kernels:
        print(kernel_rates(), flush=True)
    if opts.kernels:
        return 0
    cap = "DDP's default" if opts.bucket_cap_mb is None else f"{opts.bucket_cap_mb:g} MB"
    what = (f"MLP width {opts.width}" if opts.model == "mlp" else
            f"deep model ({DEEP_BLOCKS} x Linear({DEEP_WIDTH}) + LayerNorm, 194 tensors)")
    view = (", gradient_as_bucket_view=True" if opts.bucket_view else "") + (
        ", each rank pinned to its own cores" if opts.pin else "")
    print(f"{what}, batch {opts.batch}, bucket_cap_mb {cap}{view} (every variant), {opts.reps} timed reps "
          "per variant (medians of loss.backward(): backward + communication)")
    results = []
    for rate in opts.rates:
        for n in opts.nproc:
            r = run_one(rate, n, opts)
            if r is not None:
                results.append(r)
                print(f"  done: {rate} N={n} ({r['wall_s']:.0f} s, compiled kernels: {r['kernels']})", flush=True)
    print(table(results))
    if results:
        record("bench_wire", *parse_markdown(table(results)), machine=machine(),
               setup=f"{what}, batch {opts.batch}, bucket_cap_mb {cap}{view}, {opts.reps} reps")
    for r in results:
        for name, v in r["variants"].items():
            a, again = v.get("ahead", (0, 0))
            if a:
                print(f"  {r['rate']} N={r['world']} {name}: {a / r['reps']:.0f} elements per step encoded ahead of the "
                      f"exponent exchange, {100 * again / a:.1f}% of them again (their agreed scale was not the "
                      "previous step's)")
    for r in results:
        if "profile" in r:
            print(f"\nprofile, {r['rate']} N={r['world']} (rank 0, ms per step; backward alone "
                  f"{1e3 * r['backward_alone_s']:.1f} ms):")
            for variant, d in r["profile"].items():
                print(f"  {variant}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(d.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
