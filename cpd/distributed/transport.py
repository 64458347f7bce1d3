"""Transport: the dedicated process groups, point-to-point messages, timeouts, failures, byte
counters and the communication thread. Knows bytes and ranks, nothing of formats.

* Every exchange runs on a process group created for the state (``dist.new_group``), so it never
  interleaves with DDP's own collectives or the user's.
* Every wait is bounded by ``timeout``; any failure (a peer that raised, died or stalled: a closed
  connection or a timeout) becomes a :class:`CommunicationError` naming the rank, W and the
  timeout, and the transport refuses further work.
* ``sent`` / ``received`` count the bytes of every message this rank posted / expected.
* :meth:`submit` runs work on one FIFO communication thread and returns a
  ``torch.futures.Future`` (gloo's point-to-point operations give no futures); DDP launches the
  hooks in bucket order on every rank, so the buckets are reduced in the same order everywhere.
  :meth:`close` ends that thread; every transport still open is closed at interpreter exit
  (``atexit``), while Python can still run it (see :func:`_close_at_exit`).
* gloo's socket threads of the state's groups run under ``SCHED_BATCH`` on Linux (see
  :func:`_batch_gloo_loops`; ``CPD_GLOO_SCHED=default`` leaves them alone).
"""

from __future__ import annotations

import atexit
import datetime
import os
import queue
import sys
import threading
import weakref

import torch
import torch.distributed as dist

from .report import CommunicationError

__all__ = ["Transport"]


def _gloo_loops() -> set[int]:
    """Thread ids of this process's gloo socket threads (Linux; an empty set elsewhere)."""
    out = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                if f.read().startswith("gloo_tcp_loop"):
                    out.add(int(t))
        except (OSError, ValueError):
            continue
    return out


def _batch_gloo_loops(create):
    """``create()`` (which makes gloo process groups), with the gloo socket threads it started
    moved to ``SCHED_BATCH``; returns (create's result, how many threads were moved).

    Why: gloo's socket thread (one per group's device) handles a pair's events only when it gets
    the pair's lock (``try_lock``), and otherwise goes straight back to ``epoll_wait``, whose
    level-triggered event is still there: it spins. When the communication thread, holding that
    lock while it posts a receive or a send, wakes the socket thread, the scheduler lets the woken
    thread preempt it on its core; on a machine with no idle core the lock holder then waits for the
    next scheduler tick (4 ms at HZ=250) while the socket thread spins. Measured on 2 cores with
    two processes: both ranks' first receive of a bucket stalled 2-5 ms in most steps
    (``perf record -e sched:sched_switch``: the holder preempted in state R, the socket thread
    running in ``epoll_wait`` until the tick). A ``SCHED_BATCH`` thread does not preempt on wakeup
    (it keeps its nice level and its share of the CPU: a policy any process may choose for its
    threads), which removes that inversion: the DDP step of docs/distributed.md at 10 Gbit/s went
    from 32.9-34.1 to 27.9-28.8 ms. Only the threads this call started are moved (cpd's own
    groups); ``CPD_GLOO_SCHED=default`` turns it off, and where the policy cannot be set nothing
    changes."""
    if os.environ.get("CPD_GLOO_SCHED", "batch") == "default" or not sys.platform.startswith("linux") or \
            not hasattr(os, "sched_setscheduler"):
        return create(), 0
    before = _gloo_loops()
    out = create()
    moved = 0
    for tid in sorted(_gloo_loops() - before):
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            moved += 1
        except OSError:  # the thread ended, or a sandbox forbids it: the default policy stays
            continue
    return out, moved


#: Transports whose communication thread runs (closed at exit by _close_at_exit).
_RUNNING: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close every transport whose communication thread still runs, before the interpreter
    finalizes.

    Why: the thread is a daemon (a forgotten state must not keep the process alive), and a daemon
    thread still inside torch's C++ when Python finalizes (e.g. descheduled on its way back from a
    future's ``set_result``, whose DDP callbacks run on it, while the main thread finished) ends
    with ``pthread_exit`` when it takes the GIL back; unwinding that through a ``noexcept`` frame
    aborts the process ("terminate called without an active exception": seen once in CI, on a
    rank of tutorial 5 under load). atexit runs before finalization, so the thread takes its
    sentinel and returns normally. Waits at most 10 s per thread: one still blocked in a peer's
    wait by then stays in C++ (finalization never wakes it) and ends with the process."""
    for tp in list(_RUNNING):
        tp.close(wait=10.0)


class Transport:
    """Point-to-point and collective messages over a process group of its own."""

    def __init__(self, process_group, timeout: datetime.timedelta):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call dist.init_process_group(...) first")
        self.timeout = timeout
        pg = process_group if process_group is not None else dist.group.WORLD
        self.ranks = list(dist.get_process_group_ranks(pg))
        self.rank = dist.get_rank()
        if sorted(self.ranks) != list(range(dist.get_world_size())):
            # Creating the state's own groups is collective over the default group; a strict
            # subgroup would need every non-member to join that call (not supported yet).
            raise ValueError(f"process_group must hold every rank of the default group (ranks 0.."
                             f"{dist.get_world_size() - 1}), got ranks {self.ranks}")
        self.world = len(self.ranks)
        self.pos = self.ranks.index(self.rank)
        self.backend = dist.get_backend(pg)
        gloo = self.backend == "gloo"
        make = lambda: dist.new_group(ranks=self.ranks, timeout=self.timeout, backend=self.backend)  # noqa: E731
        self.pg, moved = _batch_gloo_loops(make) if gloo else (make(), 0)
        #: gloo socket threads of this transport's groups moved to SCHED_BATCH (_batch_gloo_loops).
        self.batch_threads = moved
        # isend/irecv post on the group itself with global ranks: they must be its group ranks
        if any(dist.get_group_rank(self.pg, r) != r for r in self.ranks):
            raise RuntimeError("cpd.distributed: the exchange's group numbers its ranks unlike the default group")
        self.device = (torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl"
                       else torch.device("cpu"))
        #: gloo: sub-chunk messages with tags, completed by gloo's own threads (pipelining);
        #: NCCL: one batched launch per hop, ordered on the device.
        self.tagged = self.backend != "nccl"
        self.error: BaseException | None = None
        #: True after :meth:`close`: no more work is taken.
        self.closed = False
        self.sent = self.received = 0
        self._lock = threading.Lock()
        self._thread = None
        self._queue: queue.Queue | None = None

    # ---- groups
    def subgroups(self, groups: list[list[int]]):
        """This rank's subgroup of ``dist.new_subgroups_by_enumeration(groups)`` (collective)."""
        def make():
            return dist.new_subgroups_by_enumeration(groups, timeout=self.timeout, backend=self.backend)

        if self.backend != "gloo":
            return make()[0]
        (sub, _), moved = _batch_gloo_loops(make)
        self.batch_threads += moved
        return sub

    # ---- faults
    def fail(self, exc: BaseException, what: str) -> BaseException:
        """The error to raise for ``exc``; remembered, so that every later call fails too."""
        if isinstance(exc, (CommunicationError, ValueError)):
            err = exc
        else:
            err = CommunicationError(
                f"cpd.distributed: {what} failed on rank {self.rank} (W={self.world}, timeout "
                f"{self.timeout.total_seconds():g} s): {exc} (a closed connection or a timeout means that a peer "
                "process raised, died or stalled)")
            err.__cause__ = exc
        self.error = err
        return err

    def _refusal(self) -> CommunicationError | None:
        """The error for new work: after a failure, or after :meth:`close`; None while open."""
        if self.error is not None:
            return CommunicationError(f"cpd.distributed: an earlier exchange failed: {self.error}")
        if self.closed:
            return CommunicationError("cpd.distributed: this exchange was closed (close() was called); create "
                                      "a new state to reduce again")
        return None

    def check_alive(self) -> None:
        err = self._refusal()
        if err is not None:
            raise err

    def wait(self, works) -> None:
        for w in works:
            if w is not None:
                w.wait(self.timeout)

    # ---- the communication thread
    def submit(self, fn) -> torch.futures.Future:
        """Run ``fn()`` on the communication thread; a future of its result (or of the error)."""
        fut = torch.futures.Future()
        with self._lock:  # never queued behind close()'s sentinel
            err = self._refusal()
            if err is None:
                if self._thread is None:
                    self._queue = queue.Queue()
                    self._thread = threading.Thread(target=self._loop, name="cpd-comm", daemon=True)
                    self._thread.start()
                    _RUNNING.add(self)
                self._queue.put((fn, fut))
        if err is not None:
            fut.set_exception(err)
        return fut

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:  # close()
                return
            fn, fut = item
            item = None
            if self.error is not None:  # queued before a failure: refused (work queued before close() runs)
                fut.set_exception(self._refusal())
            else:
                try:
                    res = fn()
                except BaseException as exc:  # noqa: BLE001 - delivered through the future
                    fut.set_exception(exc if exc is self.error else self.fail(exc, "the gradient exchange"))
                else:
                    fut.set_result(res)
                    res = None
            # no reference to the bucket's tensors or future outlives its work
            fn = fut = None

    def close(self, wait: float | None = None) -> None:
        """End the communication thread once the work already submitted is done, waiting for it
        at most ``wait`` seconds (default the timeout), and refuse new work with a
        :class:`CommunicationError`. Idempotent, local (no message to the peers); the process
        groups stay registered with torch until ``dist.destroy_process_group()``. Called at exit
        for every transport still open."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            t = self._thread
            if t is None:
                return
            self._queue.put(None)
        if t is not threading.current_thread():
            # after a failure the queued work is refused at once; otherwise it may still be running
            limit = self.timeout.total_seconds() if wait is None else wait
            t.join(min(limit, 1.0) if self.error is not None else limit)
        _RUNNING.discard(self)

    # ---- point to point
    def isend(self, t: torch.Tensor, dst: int, tag: int):
        """Post a send of the uint8 tensor ``t`` (counted); None for an empty message. ``dst`` is a
        global rank: the group holds every rank in order, so it is the group rank too (the
        group's own ``send``, without ``dist.isend``'s checks of every call: a few hops per bucket
        and sub-chunk)."""
        if not t.numel():
            return None
        self.sent += t.numel()
        return self.pg.send([t], dst, tag)

    def irecv(self, t: torch.Tensor, src: int, tag: int):
        """Post a receive into ``t`` (counted); None for an empty message (``src`` as in isend)."""
        if not t.numel():
            return None
        self.received += t.numel()
        return self.pg.recv([t], src, tag)

    def batch(self, sends, recvs) -> None:
        """One ``batch_isend_irecv``: sends [(tensor, dst)], recvs [(tensor, src)] (in place), waited."""
        ops = []
        for t, dst in sends:
            if t.numel():
                ops.append(dist.P2POp(dist.isend, t, dst, group=self.pg))
                self.sent += t.numel()
        for t, src in recvs:
            if t.numel():
                ops.append(dist.P2POp(dist.irecv, t, src, group=self.pg))
                self.received += t.numel()
        if ops:
            self.wait(dist.batch_isend_irecv(ops))

    def exchange(self, sends, recvs) -> list[torch.Tensor]:
        """Messages of known sizes: sends [(uint8 tensor, dst)], recvs [(nbytes, src)]; returns the
        received tensors (on the CPU)."""
        bufs = [torch.empty(n, dtype=torch.uint8, device=self.device) for n, _ in recvs]
        self.batch([(t.to(self.device), dst) for t, dst in sends], [(b, src) for b, (_, src) in zip(bufs, recvs)])
        return [b.cpu() for b in bufs]

    # ---- collectives (on the dedicated group; bytes counted by the callers' models)
    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        d = t.to(self.device)
        dist.all_reduce(d, op=dist.ReduceOp.MAX, group=self.pg, async_op=True).wait(self.timeout)
        return d.cpu()

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        rows = [torch.empty_like(t, device=self.device) for _ in range(self.world)]
        dist.all_gather(rows, t.to(self.device), group=self.pg, async_op=True).wait(self.timeout)
        return rows

    def all_gather_object(self, obj) -> list:
        every = [None] * self.world
        dist.all_gather_object(every, obj, group=self.pg)
        return every

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits) -> None:
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.pg, async_op=True).wait(self.timeout)

    def gather(self, t: torch.Tensor, rows, dst: int, group) -> None:
        dist.gather(t, rows, dst=dst, group=group, async_op=True).wait(self.timeout)

    def broadcast(self, t: torch.Tensor, src: int, group) -> None:
        dist.broadcast(t, src=src, group=group, async_op=True).wait(self.timeout)
