"""Lazy build of the CPU extension (torch.utils.cpp_extension + ninja), cached on disk.

The first call compiles ``cuda/cpu/*.cpp`` against ``cuda/include/cpd/numerics.h`` (about a
minute on two cores); later calls, in any process, load the cached library from torch's extension
directory (``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``). The module name
carries a hash of the sources, flags and host CPU, so an edit or another machine rebuilds instead
of loading a stale library. If no compiler is available, :func:`extension` returns None once
with a warning, and cpd falls back to its pure-torch path.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
import warnings
from pathlib import Path

__all__ = ["extension", "forced_fallback", "source_dir", "CFLAGS"]

_ROOT = Path(__file__).resolve().parent.parent
_lock = threading.Lock()
_state: dict = {}

#: IEEE semantics are part of the numerics contract: no contraction into FMAs, no fast-math,
#: no flush-to-zero. -march=native is safe because the module name hashes the CPU flags.
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off", "-fno-fast-math", "-fopenmp"]


def source_dir() -> Path:
    """Folder holding ``include/cpd/numerics.h``, ``cpu/`` and ``kernels/``."""
    packaged = Path(__file__).resolve().parent / "_csrc"
    return packaged if packaged.is_dir() else _ROOT / "cuda"


def _sources() -> list[Path]:
    return sorted((source_dir() / "cpu").glob("*.cpp"))


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return platform.machine() + flags


def _module_name() -> str:
    h = hashlib.sha256()
    import torch

    for p in _sources() + sorted((source_dir() / "include" / "cpd").glob("*.h")):
        h.update(p.read_bytes())
    h.update(" ".join(CFLAGS).encode())
    h.update(_cpu_id().encode())
    h.update(torch.__version__.encode())
    return "cpd_cpu_" + h.hexdigest()[:16]


def forced_fallback() -> bool:
    """True when CPD_NO_EXTENSION=1 asks for the pure-torch path."""
    return os.environ.get("CPD_NO_EXTENSION") == "1"


def extension():
    """The compiled CPU extension module, building it on first use; None if it cannot be built.

    Set ``CPD_NO_EXTENSION=1`` to force the pure-torch path (used by the tests of that path).
    """
    if forced_fallback():
        return None
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            _state["module"] = _build()
    return _state["module"]


def _build():
    try:
        from torch.utils.cpp_extension import load

        return load(
            name=_module_name(),
            sources=[str(p) for p in _sources()],
            extra_include_paths=[str(source_dir() / "include")],
            extra_cflags=CFLAGS,
            extra_ldflags=["-fopenmp"],
            verbose=os.environ.get("CPD_VERBOSE_BUILD") == "1",
        )
    except Exception as exc:  # no compiler, no ninja, a build error: fall back, say so once
        warnings.warn(
            f"cpd: could not build the CPU extension ({type(exc).__name__}: {str(exc)[:500]}); "
            "using the pure-torch path, which is correct but several times slower",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
