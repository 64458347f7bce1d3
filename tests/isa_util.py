"""Helpers of the ISA-level tests (tests/test_isa_levels.py, tests/test_isa_compile.py): the
host's level, and subprocesses run at low priority."""

import os
import platform
import subprocess
from pathlib import Path

from cpd import _cpu

ROOT = Path(__file__).resolve().parent.parent
X86 = _cpu.machine_kind(platform.machine()) == "x86_64"
HOST = _cpu.host_level() if X86 else None


def low_priority():
    """Builds and the level runs are CPU-bound background work: at nice 10 they get about a tenth of
    a core against each busy process of the rest of the suite (with pytest-xdist, the other
    worker may be running real processes with timeouts: tests/test_distributed.py), and the idle
    cores otherwise."""
    os.nice(10)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, preexec_fn=low_priority, **kw)


def runs(level):
    return X86 and _cpu.X86_LEVELS.index(level) <= _cpu.X86_LEVELS.index(HOST)
