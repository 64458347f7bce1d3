"""The benchmarks' shared timer (imported as ``from _timing import median_time``: the scripts run
as ``python benchmarks/<name>.py``, so this folder is on ``sys.path``)."""

from __future__ import annotations

import statistics
import time


def median_time(fn, repeat: int) -> float:
    """Median wall time of ``repeat`` calls of ``fn`` after one warm-up call, in seconds."""
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)
