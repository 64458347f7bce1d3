"""The host shim: cpd's CUDA kernels compiled as host C++ and launched on CPU tensors.

Without a GPU, the tests still execute the real kernel text of ``cuda/kernels/*.cu`` and its
launch code: :func:`launch` takes the :class:`cpd._kernels.Launch` that :mod:`cpd._cuda` would
hand to ``cuLaunchKernel`` (same kernel name, grid, block and ``void*`` parameter array) and runs
it through ``cuda/shim/cpd_shim.h`` (GPU threads as fibers, ``__syncthreads`` honoured,
``__shared__`` per block; see that header). Pointers are host pointers, so the tensors are CPU
tensors.

Build: one shared library per kernel file, compiled on first use with the host C++ compiler
(``$CXX``, default ``c++``; a few seconds per file) into ``$CPD_CACHE_DIR`` (default
``~/.cache/cpd``)/shim/<file>-<sha256 of the sources, flags and compiler>.so. The kernels of a
file are found by preprocessing it once with ``__global__`` kept as a marker (macro-generated
kernels included), then a generated translation unit includes the kernel file and lists them.

:func:`on_host` routes cpd's custom ops for CPU tensors through the CUDA implementations and
this launcher, so any code above :mod:`cpd.ops` (allreduce, compressors, optimizers) can run on
the GPU code path in a test. The routing is :mod:`cpd._impl`'s (it imports this module, so this
one imports nothing above it): ``_impl`` hands it over with :func:`set_router` when imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from . import _kernels
from ._cpu import source_dir

__all__ = ["available", "library", "launch", "launcher", "on_host", "set_router", "CXXFLAGS"]

#: IEEE float semantics as NVRTC's --fmad=false: no contraction, no fast-math, no FTZ.
CXXFLAGS = ["-std=c++17", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing",
            "-fvisibility=hidden", "-w"]

_lock = threading.Lock()
_libs: dict = {}
_ERR = 512


def _cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++"))


def available() -> bool:
    """True when a host C++ compiler is available to build the shim."""
    return _cxx() is not None


def _shim_dir() -> Path:
    packaged = source_dir() / "shim"
    return packaged


def _cache_dir() -> Path:
    d = Path(os.environ.get("CPD_CACHE_DIR", Path.home() / ".cache" / "cpd")) / "shim"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _kernel_path(kernel_file: str | os.PathLike) -> Path:
    p = Path(kernel_file)
    return p if p.is_absolute() else source_dir() / "kernels" / p


def _includes() -> list[str]:
    return [f"-I{source_dir() / 'include'}", f"-I{_shim_dir()}"]


def _kernel_names(cxx: str, src: Path) -> list[str]:
    """Every kernel of ``src``: preprocess with __global__ as a marker, find ``marker void name(``."""
    res = subprocess.run([cxx, "-x", "c++", "-E", "-P", "-std=c++17", "-DCPD_SHIM_SCAN", *_includes(), "-include", "cpd_shim.h",
                          str(src)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"cpd shim: preprocessing {src.name} failed:\n{res.stderr[-4000:]}")
    names = re.findall(r"__cpd_shim_kernel__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(", res.stdout)
    if not names:
        raise RuntimeError(f"cpd shim: no __global__ kernel found in {src}")
    return list(dict.fromkeys(names))


def library(kernel_file: str | os.PathLike = "cast.cu") -> ctypes.CDLL:
    """The host build of one kernel file (a file of cuda/kernels/, or any path), built on first use."""
    src = _kernel_path(kernel_file)
    with _lock:
        if src in _libs:
            return _libs[src]
        cxx = _cxx()
        if cxx is None:
            raise RuntimeError("cpd shim: no C++ compiler (set $CXX) to build the host shim")
        h = hashlib.sha256()
        for p in [src, *sorted((source_dir() / "include" / "cpd").glob("*.h")), *sorted(_shim_dir().glob("*.h"))]:
            h.update(p.name.encode() + p.read_bytes())
        h.update(" ".join(CXXFLAGS).encode())
        h.update(subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.encode())
        out = _cache_dir() / f"{src.stem}-{h.hexdigest()[:20]}.so"
        if not out.exists():
            names = _kernel_names(cxx, src)
            with tempfile.TemporaryDirectory() as tmp:
                tu = Path(tmp) / f"{src.stem}_shim.cpp"
                tu.write_text('#include "cpd_shim.h"\n'
                              f'#include "{src}"\n'
                              "CPD_SHIM_TABLE_BEGIN\n" + "".join(f"CPD_SHIM_KERNEL({n})\n" for n in names)
                              + "CPD_SHIM_TABLE_END\n")
                tmp_out = Path(tmp) / out.name
                res = subprocess.run([cxx, *CXXFLAGS, *_includes(), str(tu), "-o", str(tmp_out)], capture_output=True,
                                     text=True)
                if res.returncode != 0:
                    raise RuntimeError(f"cpd shim: compiling {src.name} as host C++ failed:\n{res.stderr[-4000:]}")
                tmp_dest = out.with_suffix(f".tmp{os.getpid()}")
                shutil.copyfile(tmp_out, tmp_dest)
                tmp_dest.replace(out)  # atomic: concurrent processes never load a half-written library
        lib = ctypes.CDLL(str(out))
        lib.cpd_shim_launch.restype = ctypes.c_int
        lib.cpd_shim_launch.argtypes = [ctypes.c_char_p, *([ctypes.c_uint] * 6), ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        _libs[src] = lib
        return lib


def launch(call: _kernels.Launch, device=None) -> None:
    """Run one launch on the host; the same parameter array as cuLaunchKernel. Raises RuntimeError
    naming the kernel for an invalid launch or a parameter that does not match the signature."""
    lib = library(call.kernel_file)
    holders, params, sizes = _kernels.pack(call.args)
    err = ctypes.create_string_buffer(_ERR)
    rc = lib.cpd_shim_launch(call.name.encode(), *call.grid, *call.block, ctypes.addressof(params),
                             ctypes.addressof(sizes), len(holders), err, _ERR)
    if rc != 0:
        raise RuntimeError(f"cpd shim: launch of {call.name} (grid {call.grid}, block {call.block}) failed: "
                           f"{err.value.decode(errors='replace')}")


_geometry = threading.local()


def geometry() -> _kernels.Geometry:
    """The geometry :func:`on_host` launches use (small grids by default: every block runs in turn)."""
    return getattr(_geometry, "value", _kernels.Geometry(threads=64, max_blocks=4))


def launcher(call: _kernels.Launch, device=None) -> None:
    """The launcher the CUDA implementations use for CPU tensors under :func:`on_host`."""
    launch(call, device)


_router: list = []  # [route(on: bool)]: cpd._impl.route_cpu_to_kernels, from set_router


def set_router(route) -> None:
    """Called by cpd._impl when it is imported (``import cpd`` does): ``route(True)`` sends the CPU
    kernels of every op it registered through this launcher, ``route(False)`` back."""
    _router[:] = [route]


@contextlib.contextmanager
def on_host(threads: int = 64, max_blocks: int | None = 4):
    """Within this block, cpd's custom ops on CPU tensors run the CUDA implementations (the
    NVRTC-free part of cpd/_cuda.py's path: the same marshalling and kernels) through the shim,
    with ``threads`` per block and at most ``max_blocks`` blocks."""
    if not _router:
        raise RuntimeError("cpd shim: on_host needs cpd's ops registered: import cpd first")
    route = _router[0]
    old = getattr(_geometry, "value", None)
    _geometry.value = _kernels.Geometry(threads=threads, max_blocks=max_blocks)
    route(True)
    try:
        yield
    finally:
        route(False)
        if old is None:
            del _geometry.value
        else:
            _geometry.value = old
