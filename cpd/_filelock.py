"""cpd's one cross-process lock: an ``flock`` held on a file while a block runs (the CPU
extension's builds and loads, :mod:`cpd._cpu`; NVRTC compiles, :mod:`cpd._cuda`). The kernel
releases it when its holder dies, so a killed process never leaves others waiting. Where ``fcntl``
is missing (not POSIX) nothing is locked."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def held(path: Path, *, shared: bool = False, waiting: str | None = None):
    """Hold an exclusive (or ``shared``) flock on ``path`` (created if missing) for the block; yields
    whether a lock is held (False where there is no ``fcntl``). ``waiting``: a line printed to
    stderr when another process holds the lock, before waiting for it."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield False
        return
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except OSError:
            if waiting:
                print(waiting, file=sys.stderr, flush=True)
            fcntl.flock(fd, mode)
        yield True
    finally:
        os.close(fd)  # releases the flock
