"""Lazy build of the CPU extension (torch.utils.cpp_extension + ninja), cached on disk.

The first call compiles ``cuda/cpu/*.cpp`` against the numerics core ``cuda/include/cpd/*.h``
(about three minutes on two cores, announced by one line on stderr); later calls, in any process,
load the cached library from torch's extension directory (``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``). If no compiler is available, :func:`extension` returns None once
with a warning, and cpd falls back to its pure-torch path.

**Target ISA.** The extension is built for the host (``native``) unless ``CPD_CPU_ARCH`` names a
level: ``x86-64``, ``x86-64-v2`` (SSE4.2), ``x86-64-v3`` (AVX2, FMA, F16C), ``x86-64-v4``
(AVX-512) on x86-64; ``armv8-a``, ``armv8.2-a`` (and other ``armv8.x-a`` / ``armv9.x-a``, with
``+feature`` suffixes) on Arm. :func:`build_flags` gives the flags for any (machine, compiler,
arch, OpenMP) without that machine, so the choice is testable anywhere. The module name hashes the
sources, the flags, the compiler, torch's version and, for ``native``, the host CPU's flags, so an
edit, another level or another machine builds its own library instead of loading a stale one.

**Loading a built library.** Since the name is the build's identity, a library already in its
folder is imported directly (:func:`_import_library`), under a shared ``flock``: loads run side by side
and wait only while a process builds in that folder. torch's ``load`` (and ninja) runs only to
build: ninja would rebuild every object of a finished library whenever its build file names other
paths (a clone elsewhere, another worktree with the same sources) or the sources are newer than
the objects (a fresh clone), holding the folder for minutes.

**OpenMP** is detected by compiling a probe with the compiler's OpenMP flags (``-fopenmp``; Apple
clang needs ``-Xpreprocessor -fopenmp`` and libomp). Without it (or with ``CPD_CPU_OPENMP=0``)
the extension still builds and runs multi-threaded: ``cuda/cpu/parallel.h`` splits the work over
ATen's thread pool instead of OpenMP, with the same bits (every element depends only on its own
operands and random words, never on the split).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from ._filelock import held

__all__ = ["extension", "loaded", "forced_fallback", "source_dir", "build_flags", "BuildFlags", "target", "host_level",
           "X86_LEVELS", "CFLAGS"]

_ROOT = Path(__file__).resolve().parent.parent
_lock = threading.Lock()
_state: dict = {}

#: IEEE semantics are part of the numerics contract: no contraction into FMAs, no fast-math,
#: no flush-to-zero. Every build gets these; build_flags adds the target's.
CFLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math"]

#: x86-64 micro-architecture levels (the psABI's), lowest first, and the /proc/cpuinfo flags
#: each one needs beyond the previous one.
X86_LEVELS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")
_X86_NEEDS = {
    "x86-64": (),
    "x86-64-v2": ("cx16", "popcnt", "sse4_1", "sse4_2", "ssse3"),
    "x86-64-v3": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
_ARM_ARCH = re.compile(r"^armv(8|9)(\.[0-9])?-a(\+[a-z0-9]+)*$")
_X86_MACHINES = ("x86_64", "amd64", "x86-64")
_ARM_MACHINES = ("aarch64", "arm64")
_COMPILERS = ("gcc", "clang", "apple-clang")


def machine_kind(machine: str) -> str:
    """'x86_64', 'aarch64' or the machine name lowercased (platform.machine() spellings)."""
    m = machine.lower()
    return "x86_64" if m in _X86_MACHINES else "aarch64" if m in _ARM_MACHINES else m


@dataclass(frozen=True)
class BuildFlags:
    """The compiler and linker flags of one build of the CPU extension."""

    machine: str   # 'x86_64', 'aarch64', ...
    compiler: str  # 'gcc', 'clang' or 'apple-clang'
    arch: str      # 'native' or the level asked for
    openmp: bool
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]

    def __post_init__(self):
        if self.compiler not in _COMPILERS:
            raise ValueError(f"compiler must be one of {_COMPILERS}, got {self.compiler!r}")


def _arch_flags(machine: str, compiler: str, arch: str) -> list[str]:
    if machine == "x86_64":
        if arch == "native":
            return ["-march=native", "-mprefer-vector-width=512"]
        if arch not in X86_LEVELS:
            raise ValueError(f"CPD_CPU_ARCH={arch!r} is not an x86-64 target; use 'native' or one of {X86_LEVELS}")
        return [f"-march={arch}"] + (["-mprefer-vector-width=512"] if arch == "x86-64-v4" else [])
    if machine == "aarch64":
        if arch == "native":
            # Apple clang targets the Apple cores by default (and -mcpu=native is not in every
            # version); gcc and clang on Linux tune for the host.
            return [] if compiler == "apple-clang" else ["-mcpu=native"]
        if not _ARM_ARCH.match(arch):
            raise ValueError(f"CPD_CPU_ARCH={arch!r} is not an Arm target; use 'native' or an architecture such as "
                             "'armv8-a', 'armv8.2-a', 'armv8.2-a+fp16', 'armv9-a'")
        return [f"-march={arch}"]
    if arch == "native":
        return []  # an unknown machine: the compiler's default target, portable
    raise ValueError(f"CPD_CPU_ARCH={arch!r}: cpd knows no targets for machine {machine!r}; use 'native'")


def build_flags(machine: str, compiler: str, arch: str = "native", openmp: bool = True) -> BuildFlags:
    """The flags cpd compiles its CPU extension with, for a machine (``platform.machine()``:
    ``x86_64``, ``AMD64``, ``aarch64``, ``arm64``, ...), a compiler (``gcc``, ``clang``,
    ``apple-clang``), a target ``arch`` (see the module docstring) and whether OpenMP is used.
    x86 flags are given only for x86 machines; Apple clang's OpenMP is ``-Xpreprocessor
    -fopenmp`` linked with ``-lomp``."""
    if compiler not in _COMPILERS:
        raise ValueError(f"compiler must be one of {_COMPILERS}, got {compiler!r}")
    if not isinstance(arch, str) or not arch:
        raise ValueError(f"arch must be a non-empty string, got {arch!r}")
    kind = machine_kind(machine)
    cflags = list(CFLAGS) + _arch_flags(kind, compiler, arch)
    ldflags: list[str] = []
    if openmp:
        if compiler == "apple-clang":
            cflags += ["-Xpreprocessor", "-fopenmp"]
            ldflags += ["-lomp"]
        else:
            cflags += ["-fopenmp"]
            ldflags += ["-fopenmp"]
    return BuildFlags(kind, compiler, arch, bool(openmp), tuple(cflags), tuple(ldflags))


# ------------------------------------------------------------------------------------ the host
def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return set(line.partition(":")[2].split())


def host_level(machine: str | None = None, cpu_flags: set[str] | None = None) -> str:
    """The highest x86-64 level the CPU flags (``/proc/cpuinfo``) meet, e.g. 'x86-64-v3'; on Arm
    'armv8.2-a' when the CPU has half-precision arithmetic (``fphp``/``asimdhp``), else
    'armv8-a'; otherwise the machine name."""
    kind = machine_kind(machine or platform.machine())
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    if kind == "x86_64":
        best = X86_LEVELS[0]
        for level in X86_LEVELS[1:]:
            if not set(_X86_NEEDS[level]) <= flags:
                break
            best = level
        return best
    if kind == "aarch64":
        return "armv8.2-a" if {"fphp", "asimdhp"} & flags or sys.platform == "darwin" else "armv8-a"
    return kind


def _check_host_runs(machine: str, arch: str) -> None:
    """A clear error instead of an illegal instruction when the host cannot run the level."""
    if machine != "x86_64" or arch not in X86_LEVELS or not _cpu_flags():
        return
    have = X86_LEVELS.index(host_level(machine))
    if X86_LEVELS.index(arch) > have:
        missing = sorted(set().union(*(_X86_NEEDS[lv] for lv in X86_LEVELS[: X86_LEVELS.index(arch) + 1]))
                         - _cpu_flags())
        raise ValueError(f"CPD_CPU_ARCH={arch!r}: this CPU cannot run it (it lacks {', '.join(missing)}); "
                         f"the highest level it runs is {host_level(machine)!r}")


def _compiler() -> tuple[str, str]:
    """(kind, first line of --version) of the compiler torch builds with (CXX, else c++)."""
    if "compiler" not in _state:
        cxx = os.environ.get("CXX", "c++")
        try:
            out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        kind = "apple-clang" if "Apple clang" in out else "clang" if "clang" in out else "gcc"
        _state["compiler"] = (kind, (out.splitlines() or [cxx])[0])
    return _state["compiler"]


def target() -> str:
    """The target asked for: ``CPD_CPU_ARCH`` (stripped), default 'native'."""
    return os.environ.get("CPD_CPU_ARCH", "").strip() or "native"


def _openmp_wanted() -> bool:
    v = os.environ.get("CPD_CPU_OPENMP", "").strip()
    if v not in ("", "0", "1"):
        raise ValueError(f"CPD_CPU_OPENMP must be '0', '1' or unset, got {v!r}")
    return v != "0"


def _openmp_works(flags: BuildFlags) -> bool:
    """Whether the compiler builds and links an OpenMP program with these flags (a probe)."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text("#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
        cmd = [cxx, *[f for f in flags.cflags if not f.startswith("-m")], str(src), "-o", str(Path(tmp) / "probe"),
               *flags.ldflags]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


def current_flags() -> BuildFlags:
    """The flags this process builds with (target(), the compiler, OpenMP as asked; the probe that
    may turn OpenMP off runs only when building)."""
    return build_flags(platform.machine(), _compiler()[0], target(), _openmp_wanted())


# ------------------------------------------------------------------------------------ sources, name
def source_dir() -> Path:
    """Folder holding ``include/cpd/*.h``, ``cpu/`` and ``kernels/``."""
    packaged = Path(__file__).resolve().parent / "_csrc"
    return packaged if packaged.is_dir() else _ROOT / "cuda"


#: The core of the extension: casts, encode/decode, arithmetic and matmul (``cast.cpp`` defines the
#: module and links the other two). The other sources add op libraries of their own
#: (``torch.ops.cpd_fused_dot``, ``cpd_wire``, ``cpd_mx_cpu``) and the C++ kernels of the core ops
#: (``ops.cpp``; without it the core ops run on their Python kernels).
CORE_SOURCES = ("arith.cpp", "cast.cpp", "matmul.cpp")


def _sources() -> list[Path]:
    """The sources to build: all of ``cpu/*.cpp``, or only :data:`CORE_SOURCES` when
    ``_CPD_CPU_CORE_ONLY=1`` (private, for the ISA-level tests, which check the numerics core at
    each level and need not compile the tensor-core, wire and MX libraries three times; such a
    build has its own module name, and the ops of the libraries it lacks are missing)."""
    every = sorted((source_dir() / "cpu").glob("*.cpp"))
    return [p for p in every if p.name in CORE_SOURCES] if _core_only() else every


def _core_only() -> bool:
    return os.environ.get("_CPD_CPU_CORE_ONLY") == "1"


def _module_name(flags: BuildFlags) -> str:
    h = hashlib.sha256()
    import torch

    sources = _sources()
    for p in sources + sorted((source_dir() / "cpu").glob("*.h")) + sorted(
            (source_dir() / "include" / "cpd").glob("*.h")):
        h.update(p.read_bytes())
    h.update(repr(flags).encode())
    h.update(" ".join(p.name for p in sources).encode())
    h.update(_compiler()[1].encode())
    if flags.arch == "native":  # a library for this CPU only
        h.update((platform.machine() + " ".join(sorted(_cpu_flags()))).encode())
    h.update(torch.__version__.encode())
    return "cpd_cpu_" + h.hexdigest()[:16]


def _build_dir(name: str) -> Path:
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / name


#: The suffix torch's ``load`` gives the library it builds.
_LIB_EXT = ".pyd" if sys.platform == "win32" else ".so"


def _built(name: str) -> bool:
    d = _build_dir(name)
    return any(d.glob(f"{name}*.so")) or any(d.glob(f"{name}*.pyd"))


def describe(flags: BuildFlags | None = None) -> str:
    """'native (x86-64-v3)', 'x86-64-v2', ...: the target in words."""
    flags = flags or current_flags()
    return f"native ({host_level()})" if flags.arch == "native" else flags.arch


# ------------------------------------------------------------------------------------ load
def forced_fallback() -> bool:
    """True when CPD_NO_EXTENSION=1 asks for the pure-torch path."""
    return os.environ.get("CPD_NO_EXTENSION") == "1"


def extension():
    """The compiled CPU extension module, building it on first use; None if it cannot be built.

    Set ``CPD_NO_EXTENSION=1`` to force the pure-torch path (used by the tests of that path).
    A ``CPD_CPU_ARCH`` or ``CPD_CPU_OPENMP`` that is not valid here raises ValueError.
    """
    if forced_fallback():
        return None
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            flags = current_flags()  # ValueError for a bad CPD_CPU_ARCH / CPD_CPU_OPENMP
            _check_host_runs(flags.machine, flags.arch)
            _state["module"] = _build(flags)
    return _state["module"]


def loaded():
    """``(module,)`` once :func:`extension` has run in this process (``(None,)`` if it could not
    build), None before that or under ``CPD_NO_EXTENSION=1``: whether the extension is there,
    without building it."""
    if forced_fallback() or "module" not in _state:
        return None
    return (_state["module"],)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else platform.processor())."""
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                return ln.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """One line for benchmark output: CPU model, host level, and what the extension was built for."""
    info = build_info()
    return (f"CPU: {cpu_model()} (host level {host_level()}); extension built for {info['target']}, "
            f"vector ISA {info['isa']}")


def build_info() -> dict:
    """What the loaded extension was built for: target, ISA the code was compiled with, OpenMP."""
    ext = extension()
    flags = _state.get("flags") or current_flags()
    return {"target": describe(flags), "isa": ext.isa() if ext is not None else "none (pure-torch fallback)",
            "openmp": flags.openmp if ext is not None else False, "cflags": " ".join(flags.cflags)}


@contextlib.contextmanager
def _build_lock(build_dir: Path, shared: bool = False):
    """One build per folder at a time, no load during a build, and no hang after a build that was
    killed.

    torch's ``load`` guards a build with a ``lock`` file that only its builder removes: a build
    interrupted by Ctrl-C or a kill leaves it, and every later process waits for it forever. cpd
    builds under an exclusive ``flock`` of its own instead (the kernel releases it when its holder
    dies), so a ``lock`` file found while holding the flock belongs to a dead build and is removed.
    ``shared``: the flock of a load of a finished library: loads do not wait for each other, only
    for a build."""
    with held(build_dir / "cpd.flock", shared=shared,
              waiting="cpd: waiting for another process that is building cpd's CPU extension…") as locked:
        if locked and not shared:
            (build_dir / "lock").unlink(missing_ok=True)  # a dead build's: nobody else holds the flock
        yield


def _import_library(name: str, build_dir: Path):
    """The finished library in ``build_dir``, imported without torch's ``load`` (no ninja run: see
    the module docstring); None when there is none or it does not import (a library cut short by
    a killed link, say: the caller builds it again). The caller holds the folder's flock."""
    path = build_dir / f"{name}{_LIB_EXT}"
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    return module


def _build(flags: BuildFlags):
    try:
        from torch.utils.cpp_extension import load

        name = _module_name(flags)
        if not _built(name) and flags.openmp and not _openmp_works(flags):  # the probe only before a build
            flags = build_flags(flags.machine, flags.compiler, flags.arch, openmp=False)
            name = _module_name(flags)
        build_dir = _build_dir(name)
        build_dir.mkdir(parents=True, exist_ok=True)
        _state["flags"] = flags
        if _built(name):  # the common case: load it beside any other loads
            with _build_lock(build_dir, shared=True):
                module = _import_library(name, build_dir)
            if module is not None:
                return module
        with _build_lock(build_dir):
            module = _import_library(name, build_dir)  # built meanwhile by the process waited for
            if module is not None:
                return module
            (build_dir / f"{name}{_LIB_EXT}").unlink(missing_ok=True)  # one that does not import: link it again
            omp = "" if flags.openmp else ", without OpenMP"
            core = " (core only)" if _core_only() else ""
            print(f"cpd: building cpd's CPU extension{core} for {describe(flags)}{omp} (one time, a few minutes)…",
                  file=sys.stderr, flush=True)
            return load(
                name=name,
                sources=[str(p) for p in _sources()],
                extra_include_paths=[str(source_dir() / "include"), str(source_dir() / "cpu")],
                extra_cflags=list(flags.cflags),
                extra_ldflags=list(flags.ldflags),
                build_directory=str(build_dir),
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
