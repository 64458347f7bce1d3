"""The real-process harness: a group of spawned ranks whose hang deadline covers the exchange only.

Used by tests/test_distributed.py (``spawn``) and tested by tests/test_ranks.py. A deadline that
started when the ranks were spawned once measured a build: three ranks sat behind another
process's build of the CPU extension (its folder's flock) and a 120 s deadline ran out with
nothing hung (issue 32). So the time of a group is cut in three:

1. **Before spawning** (no deadline): :func:`ensure_extension` makes sure the CPU extension the
   ranks will load, for the environment they inherit (``CPD_CPU_ARCH``, ``TORCH_EXTENSIONS_DIR``,
   ...), is built: a build, or a wait for another process's build, happens here.
2. **Set-up** (``setup_limit``, generous: it may wait for a build another process holds): each
   rank imports, loads the extension and warms up (:func:`warm_up`), reports ``ready`` on its
   pipe and waits for the parent's ``go``. ``go`` is sent when every rank is ready, so no rank
   enters the exchange (whose own timeouts are seconds) while another still loads.
3. **The exchange** (``deadline``): ``init_process_group`` and the job. After the deadline the
   parent kills the group and fails naming every rank still running and the step it was in
   (ranks report steps with :func:`step`; the harness names its own: set-up, init_process_group,
   job, saving the result).

A rank's result (or ``{"harness_error": traceback}``) comes back through a file; the rank ends
with ``os._exit`` (no teardown: a failed group must not hang at exit).

Ranks are forks of a ``forkserver`` that has imported torch and cpd once (:data:`PRELOAD`), with
the spawning process's environment, stdout and stderr as they are at the spawn: a fresh
interpreter per rank (``spawn``) took about 5 s of CPU for those imports, three quarters of the
distributed tests' time (380 s of CPU against 97 s for tests/test_distributed.py and
tests/test_ranks.py on a 2-core EPYC).
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import wait
from pathlib import Path

import torch

#: Deadline of the exchange of one spawned group (the whole group is killed after it).
DEADLINE = 120.0
#: Limit of a group's set-up (imports, the extension's load, maybe a wait for a build another
#: process holds: minutes on a loaded 2-core machine); a rank stuck there still fails, later.
SETUP_LIMIT = 1200.0

_conn = None  # in a rank: its end of the pipe to the parent


def step(text: str) -> None:
    """In a rank: tell the parent which step this rank is in (named if the deadline runs out)."""
    if _conn is not None:
        _conn.send(("step", str(text)))


def ensure_extension() -> None:
    """Build the CPU extension this process's environment asks for (the ranks inherit it) unless
    it is built: in a subprocess, since this process's ``_cpu.extension()`` is cached and the
    environment may have changed since it loaded; with the cpd this process imports. A build
    another process holds is waited for here. Nothing to do under ``CPD_NO_EXTENSION=1``."""
    from cpd import _cpu

    if _cpu.forced_fallback():
        return
    flags = _cpu.current_flags()
    names = [_cpu._module_name(flags)]
    if flags.openmp:  # a compiler without OpenMP builds the no-OpenMP library instead
        names.append(_cpu._module_name(_cpu.build_flags(flags.machine, flags.compiler, flags.arch, openmp=False)))
    if any(_cpu._built(n) for n in names):
        return
    here = str(Path(_cpu.__file__).resolve().parent.parent)  # the cpd this process (and the ranks) import
    subprocess.run([sys.executable, "-c", "import cpd._cpu as c; c.extension()"], cwd=here, check=False,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join([here, *filter(None, [
                       os.environ.get("PYTHONPATH")])])})


def warm_up() -> None:
    """What every rank needs before the exchange: the modules the jobs import, the CPU extension
    loaded (its op libraries registered) and one cast (the first call of a custom op imports
    torch._dynamo: seconds), so that no first import or load falls inside the deadline or makes
    one rank late to an exchange whose timeouts are seconds."""
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    import cpd
    import cpd.compressors  # noqa: F401
    from cpd import _cpu
    from cpd.distributed import kernels

    _cpu.extension()
    kernels.compiled()
    cpd.cast(torch.zeros(2), "e4m3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: What the ranks' fork server imports once (each rank is a fork of it: a spawned interpreter took
#: about 5 s of CPU per rank for these imports, most of the distributed tests' time): modules only,
#: no extension load and no op call (no threads, no OpenMP pool before the fork); warm_up does those
#: in each rank.
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "cpd", "cpd.compressors",
           "cpd.distributed.kernels"]


def _context():
    """The ranks' start method: ``forkserver`` with :data:`PRELOAD` imported in the server (one
    per process that spawns groups, started at its first group). A rank is a fresh fork of that
    server, not of this process (no state of the test process, no threads), and takes this
    process's environment as it is at the spawn (:func:`_entry`), not the server's."""
    import torch.multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():  # Windows: a fresh interpreter per rank
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class _ParentFd:
    """A file descriptor of the spawning process (its stdout or stderr, pytest's capture of the
    test at hand), which the rank writes to: a fork server's ranks would inherit the server's, from
    its start (an earlier test's capture)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _detach, (reduction.DupFd(self.fd),)  # pickled as the process starts: sent with it


def _detach(dup) -> int:
    return dup.detach()  # in the rank: its descriptor of the spawning process's file


def _entry(rank: int, world: int, port: int, fn, out: str, args, conn, env: dict, fds) -> None:
    global _conn
    _conn = conn
    os.environ.clear()
    os.environ.update(env)  # the spawning process's, now (the fork server has its own from its start)
    for fd, std in zip(fds, (1, 2)):
        os.dup2(fd, std)
        os.close(fd)
    torch.set_num_threads(1)
    backend = os.environ.get("CPD_TEST_BACKEND", "gloo")
    try:
        step("set-up: imports and the CPU extension's load")
        warm_up()
        if backend == "nccl":
            torch.cuda.set_device(rank)
        conn.send(("ready", None))
        if conn.recv() != "go":
            os._exit(0)
        import torch.distributed as dist

        step("init_process_group")
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        step("job")
        res = fn(rank, world, *args)
    except BaseException:  # noqa: BLE001 - reported to the parent
        res = {"harness_error": traceback.format_exc()}
    step("saving the result")
    torch.save(res, os.path.join(out, f"{rank}.pt"))
    os._exit(0)  # no teardown: a failed group must not hang at exit


class _Group:
    """The parent's view of the ranks: their pipes, the last step each reported, who is ready."""

    def __init__(self, procs, conns, watch=None):
        self.procs, self.conns, self.watch = procs, dict(conns), watch  # conns: conn -> rank
        self.steps = ["starting"] * len(procs)
        self.ready: set[int] = set()

    def alive(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if p.is_alive()]

    def pump(self, until: float, done) -> bool:
        """Read what the ranks say until ``done()`` or the time ``until``; whether done."""
        while not done():
            left = until - time.monotonic()
            if left <= 0:
                return False
            live = [p.sentinel for p in self.procs if p.exitcode is None]
            for obj in wait([*self.conns, *live], min(left, 1.0)):
                r = self.conns.get(obj)
                if r is None:
                    continue  # a rank exited: done() sees it
                try:
                    while obj.poll():
                        kind, text = obj.recv()
                        if self.watch is not None:
                            self.watch(r, kind, text)
                        if kind == "ready":
                            self.ready.add(r)
                        else:
                            self.steps[r] = text
                except (EOFError, OSError):  # the rank closed its end (it exited)
                    del self.conns[obj]
                    obj.close()
        return True

    def where(self, ranks) -> str:
        return ", ".join(f"rank {r} (in step {self.steps[r]!r})" for r in ranks)


def spawn(fn, world: int, out: Path, *args, name: str | None = None, deadline: float = DEADLINE,
          setup_limit: float = SETUP_LIMIT, watch=None) -> list:
    """Run ``fn(rank, world, *args)`` in ``world`` gloo processes (forks of the fork server: ``fn``
    importable by name, a module-level function); their results, in rank order. ``out``: a new folder for them.
    ``watch(rank, kind, text)``, if given, sees every message of a rank (``kind``: 'step' or
    'ready') as it arrives."""
    name = name or fn.__name__
    ensure_extension()
    ctx = _context()
    out.mkdir()
    port = _free_port()
    pipes = [ctx.Pipe() for _ in range(world)]
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, str(out), args, pipes[r][1], dict(os.environ),
                                                 (_ParentFd(1), _ParentFd(2))), daemon=True)
             for r in range(world)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for _, child_end in pipes:
        child_end.close()
    g = _Group(procs, {parent_end: r for r, (parent_end, _) in enumerate(pipes)}, watch)
    ended = []  # ranks that ended during the set-up
    try:
        # set-up: every rank ready, or one gone (its error is reported below)
        ok = g.pump(t0 + setup_limit, lambda: len(g.ready) == world or len(g.alive()) < world)
        assert ok, (f"{name} (W={world}): not every rank was ready after {setup_limit} s of set-up (imports, the CPU "
                    f"extension's load): {g.where(r for r in range(world) if r not in g.ready)}")
        setup = time.monotonic() - t0
        ended = [r for r in range(world) if not procs[r].is_alive()]
        if not ended:
            for conn in g.conns:
                try:
                    conn.send("go")
                except OSError:  # a rank gone since it was ready: reported below
                    pass
            g.pump(time.monotonic() + deadline, lambda: not g.alive())
            alive = g.alive()
            assert not alive, (f"{name} (W={world}) did not finish within {deadline} s of the exchange (set-up took "
                               f"{setup:.0f} s, not counted): a hang; still running: {g.where(alive)}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(10)
        for conn in g.conns:
            conn.close()
    res = [torch.load(out / f"{r}.pt", weights_only=False) if (out / f"{r}.pt").is_file() else None
           for r in range(world)]
    errors = [f"rank {r}:\n{x['harness_error']}" for r, x in enumerate(res)
              if isinstance(x, dict) and "harness_error" in x]  # first: a rank's error ends the others early
    assert not errors, "\n".join(errors)
    assert not ended, f"{name} (W={world}): " + ", ".join(
        f"rank {r} ended during its set-up (exit code {procs[r].exitcode}, in step {g.steps[r]!r})" for r in ended)
    for r, x in enumerate(res):
        assert x is not None, f"rank {r} of {name} wrote no result (exit code {procs[r].exitcode})"
    return res
