"""benchmarks/bench_wire.py's helpers: the cores ``--pin`` gives each rank, and the pin itself."""

import importlib.util
import os
import threading
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("bench_wire", Path(__file__).resolve().parent.parent / "benchmarks" / "bench_wire.py")
bench_wire = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench_wire)


@pytest.mark.parametrize("ncores", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_rank_cores_share_or_wrap(ncores, world):
    cores = [10 + 3 * i for i in range(ncores)]  # any core ids, not 0..n-1
    every = [bench_wire.rank_cores(r, world, cores) for r in range(world)]
    assert all(every) and all(set(c) <= set(cores) for c in every)
    if ncores >= world:  # disjoint equal shares, in rank order
        k = ncores // world
        assert all(len(c) == k for c in every)
        assert [x for c in every for x in c] == cores[:k * world]
    else:  # more ranks than cores: one core each, round robin
        assert every == [[cores[r % ncores]] for r in range(world)]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity calls")
def test_pin_confines_every_thread_and_later_ones():
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("needs two cores")
    seen = {}
    ready, done = threading.Event(), threading.Event()

    def before():  # a thread that exists before the pin
        ready.set()
        done.wait(10)
        seen["before"] = os.sched_getaffinity(0)

    t = threading.Thread(target=before)
    t.start()
    ready.wait(10)
    try:
        bench_wire._pin(1, 2)
        want = set(bench_wire.rank_cores(1, 2, mine))
        done.set()
        t.join(10)
        later = threading.Thread(target=lambda: seen.__setitem__("after", os.sched_getaffinity(0)))
        later.start()
        later.join(10)
        assert os.sched_getaffinity(0) == want and seen == {"before": want, "after": want}
    finally:
        done.set()
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), mine)
            except ProcessLookupError:  # a thread that ended after the listing (a joined thread may linger)
                pass
