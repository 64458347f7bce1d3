"""CUDA driver side: NVRTC compile of ``cuda/kernels/*.cu`` at first use, on-disk cache, module
load and launch under each device's primary context, on torch's current stream.

Compilation needs only ``cuda-bindings`` and an NVRTC wheel (the ``cuda12`` / ``cuda13`` extras;
see docs/gpu.md), no nvcc and no GPU, so the tests compile every kernel for every architecture the
installed NVRTC supports on any machine (and run them on the host through :mod:`cpd._shim`).
The headers under ``cuda/include/cpd/`` are passed to NVRTC in memory: NVRTC from pip has no
system headers, which is why they include nothing but each other.

Target choice (:func:`target_for`): a cubin ``sm_XY`` when NVRTC lists the device's
architecture in ``nvrtcGetSupportedArchs()``; otherwise PTX for the highest listed
``compute_XY`` below it, which the driver compiles for the device (it must be at least as new as
NVRTC); with nothing suitable, or without cuda-bindings / a matching NVRTC, CUDA tensors use the
pure-torch fallback on the device (one warning says why).

Launches (:func:`launch`): the :class:`cpd._kernels.Launch` built by cpd/_kernels.py, the same
parameter array the host shim runs in the tests; the device's primary context (the one torch
uses) is pushed around module load and launch, so a tensor on any device launches correctly from
any thread. Driver errors are raised with the kernel's name and the driver's error name.

Cache: ``$CPD_CACHE_DIR`` (default ``~/.cache/cpd``)/nvrtc/<file>-<target>-<sha256 of source,
headers, options, NVRTC version>.cubin or .ptx. Loaded modules are kept per (device, file).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import threading
from pathlib import Path

import torch

from . import _kernels
from ._cpu import source_dir
from ._filelock import held

__all__ = ["available", "nvrtc_version", "supported_archs", "target_for", "compile_source", "launch",
           "geometry", "unusable_reason", "cpu_twin", "resource_usage", "NVRTC_OPTIONS"]

#: FMA contraction changes results (Kahan, exact emulation); the float multiply in compose()
#: must stay a plain multiply. -default-device is not used: kernels are explicit.
NVRTC_OPTIONS = ("--fmad=false", "-std=c++17")

_lock = threading.RLock()
_modules: dict = {}
_contexts: dict = {}
_reasons: dict = {}


def available() -> bool:
    """True when cuda-bindings' NVRTC can be loaded (a GPU is not required to compile)."""
    try:
        from cuda.bindings import nvrtc

        err, _, _ = nvrtc.nvrtcVersion()
        return int(err) == 0
    except Exception:
        return False


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return int(major), int(minor)


def supported_archs() -> list[int]:
    """The architectures the installed NVRTC compiles for, as ints (75, 80, ..., 120)."""
    from cuda.bindings import nvrtc

    err, n = nvrtc.nvrtcGetNumSupportedArchs()
    _check(err, "nvrtcGetNumSupportedArchs")
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return sorted(int(a) for a in archs)[: int(n)] if n else sorted(int(a) for a in archs)


def target_for(major: int, minor: int, archs: list[int] | None = None) -> str | None:
    """``sm_XY`` if NVRTC knows the device's architecture, else ``compute_XY`` (PTX) for the
    highest known one below it, else None (the device is older than anything NVRTC targets)."""
    cc = 10 * major + minor
    archs = supported_archs() if archs is None else archs
    if cc in archs:
        return f"sm_{cc}"
    lower = [a for a in archs if a < cc]
    return f"compute_{max(lower)}" if lower else None


def _headers() -> list[tuple[bytes, bytes]]:
    """(name, text) of every header the kernels may include ("cpd/<part>.h")."""
    folder = source_dir() / "include" / "cpd"
    return [(f"cpd/{p.name}".encode(), p.read_bytes()) for p in sorted(folder.glob("*.h"))]


def _cache_dir() -> Path:
    d = Path(os.environ.get("CPD_CACHE_DIR", Path.home() / ".cache" / "cpd")) / "nvrtc"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _check(err, what: str, prog=None) -> None:
    from cuda.bindings import nvrtc

    if int(err) != 0:
        log = ""
        if prog is not None:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.decode(errors="replace").rstrip("\x00 ")
        raise RuntimeError(f"cpd: NVRTC {what} failed ({err}){': ' + log if log else ''}")


def _cache_path(kernel_file: str, arch: str, src: bytes, headers, opts) -> Path:
    """Where the image of (source, headers, options, NVRTC version) is cached (content-keyed:
    a changed header or option is a new file, never a stale one)."""
    major, minor = nvrtc_version()
    text = src + b"".join(n + t for n, t in headers) + b"\0".join(opts) + f"{major}.{minor}".encode()
    key = hashlib.sha256(text).hexdigest()[:24]
    return _cache_dir() / f"{Path(kernel_file).stem}-{arch}-{key}.{'ptx' if arch.startswith('compute_') else 'cubin'}"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(f"{path.suffix}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)  # atomic: concurrent processes never read a half-written file


def _nvrtc_compile(kernel_file: str, arch: str, src: bytes, headers, opts) -> tuple[bytes, str]:
    """(image, log) of one NVRTC compile: a cubin for ``sm_XY``, PTX for ``compute_XY``."""
    from cuda.bindings import nvrtc

    ptx = arch.startswith("compute_")
    names, texts = [n for n, _ in headers], [t for _, t in headers]
    err, prog = nvrtc.nvrtcCreateProgram(src, kernel_file.encode(), len(headers), texts, names)
    _check(err, "create")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _check(err, f"compile of {kernel_file} for {arch}", prog)
        get_size, get = (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX) if ptx else (nvrtc.nvrtcGetCUBINSize,
                                                                                nvrtc.nvrtcGetCUBIN)
        err, size = get_size(prog)
        _check(err, "output size")
        image = b" " * size
        (err,) = get(prog, image)
        _check(err, "get output")
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if not image.rstrip(b"\0 "):
        raise RuntimeError(f"cpd: NVRTC produced an empty image for {kernel_file} ({arch})")
    return image, log.decode(errors="replace").replace("\x00", "")


def _program(kernel_file: str, arch: str) -> tuple[bytes, list[tuple[bytes, bytes]], list[bytes]]:
    """(source, headers, options) of one NVRTC compile of ``cuda/kernels/<kernel_file>`` for ``arch``."""
    src = (source_dir() / "kernels" / kernel_file).read_bytes()
    return src, _headers(), [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in NVRTC_OPTIONS)]


def _one_compile(path: Path, what: str):
    """Held while one process compiles the image cached at ``path`` (an exclusive flock on
    ``<path>.lock``: :func:`cpd._filelock.held`), so that processes that need the same image at once
    (the ranks of a job on one GPU host, pytest-xdist workers) compile it once and the others wait
    for it, saying so, and read the cache, instead of each running NVRTC (a minute or more for
    matmul.cu). Without ``fcntl`` (Windows) each process compiles; the atomic writes keep the cache
    whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return held(path.with_name(path.name + ".lock"), waiting=f"cpd: waiting for another process compiling {what}…")


def _cached(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def compile_source(kernel_file: str = "cast.cu", arch: str = "sm_80", *, use_cache: bool = True) -> bytes:
    """Compile one kernel file for ``arch``: a cubin for ``sm_XY``, NUL-terminated PTX for
    ``compute_XY``. Raises RuntimeError with NVRTC's log when the source does not compile.
    ``use_cache=False`` compiles afresh (and refreshes the cached image). A cubin's compile also
    caches ptxas's report (:func:`resource_usage`), so that asking for both compiles once."""
    src, headers, opts = _program(kernel_file, arch)
    path = _cache_path(kernel_file, arch, src, headers, opts)
    if use_cache and _cached(path):
        return path.read_bytes()
    with _one_compile(path, f"{kernel_file} for {arch}"):
        if use_cache and _cached(path):  # another process compiled it while this one waited
            return path.read_bytes()
        if arch.startswith("sm_"):  # a cubin: with ptxas's report for resource_usage (-v only adds the log)
            return _ptxas_report(kernel_file, arch, src, headers, opts, path, path.with_suffix(".ptxas2.json"),
                                 replace=True)[0]
        image, _ = _nvrtc_compile(kernel_file, arch, src, headers, opts)
        _write_atomic(path, image)
    return image


_twins: dict = {}


def cpu_twin(g) -> torch.Generator:
    """The CPU generator standing for CUDA generator ``g`` in cpd.ops.draw_seed (see there): seeded
    with ``g.initial_seed()`` when g's offset is 0, else from (seed, offset); g's offset advances
    by 4 per draw, so a state cpd did not leave behind restarts the twin instead of repeating it."""
    with _lock:
        seed, offset = int(g.initial_seed()), int(g.get_offset())
        entry = _twins.get(id(g))
        if entry is None or entry[0] is not g or entry[2] != (seed, offset):
            start = seed if offset == 0 else (seed * 0x9E3779B97F4A7C15 + offset) % (1 << 64)
            entry = (g, torch.Generator().manual_seed(start), None)
        g.set_offset(offset + 4)
        _twins[id(g)] = (g, entry[1], (seed, offset + 4))
        return entry[1]


def parse_ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """ptxas -v's report per entry function (kernel): ``{kernel: {"registers", "stack",
    "spill_stores", "spill_loads", "smem"}}``. ptxas prints, per kernel, "Compiling entry function
    'K'", then "Function properties for K" with K's stack frame and spills, K's registers, and then
    the properties of each non-inlined device function it calls ("Function properties for f": f's
    own frame). A stack or spill line belongs to the function named by the "Function properties"
    line above it: only a kernel's own are its figures (reading the last one before the next kernel
    took a called function's zeros for the kernel's, and hid the kernels' frames and spills)."""
    import re

    out: dict = {}
    kernel = props = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            kernel, props = m.group(1), None
            out.setdefault(kernel, {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0})
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)
            continue
        if kernel is None:
            continue
        if props == kernel:
            for key, pat in (("stack", r"(\d+) bytes stack frame"), ("spill_stores", r"(\d+) bytes spill stores"),
                             ("spill_loads", r"(\d+) bytes spill loads")):
                m = re.search(pat, line)
                if m:
                    out[kernel][key] = int(m.group(1))
        for key, pat in (("registers", r"Used (\d+) registers"), ("smem", r"(\d+) bytes smem")):
            m = re.search(pat, line)
            if m:
                out[kernel][key] = int(m.group(1))
    return out


def resource_usage(kernel_file: str, arch: str) -> dict[str, dict[str, int]]:
    """ptxas's report for every kernel of ``kernel_file`` compiled for ``arch`` (``sm_XY``):
    ``{kernel: {"registers", "stack", "spill_stores", "spill_loads", "smem"}}``, in bytes but the
    registers. For tests and tuning (tests/test_cuda.py keeps the kernels free of local memory).
    Cached beside the cubin (``.ptxas2.json``); the compile that makes the report also stores the
    cubin for ``compile_source`` (``--ptxas-options=-v`` only adds the report), so a test suite
    compiles a large kernel file once per architecture, not once per question asked of it."""
    import json

    src, headers, opts = _program(kernel_file, arch)
    path = _cache_path(kernel_file, arch, src, headers, opts)
    report = path.with_suffix(".ptxas2.json")  # 2: parse_ptxas_report's reading (a kernel's own lines)
    if _cached(report):
        return json.loads(report.read_text())
    with _one_compile(path, f"{kernel_file} for {arch}"):
        if _cached(report):
            return json.loads(report.read_text())
        return _ptxas_report(kernel_file, arch, src, headers, opts, path, report)[1]


def _ptxas_report(kernel_file, arch, src, headers, opts, path: Path, report: Path,
                  replace: bool = False) -> tuple[bytes, dict]:
    """One compile with ptxas's report, under the compile's lock: (cubin, report), the report
    parsed and cached at ``report``, the cubin at ``path`` (where none is yet, or ``replace``:
    compile_source's fresh image)."""
    import json

    image, log = _nvrtc_compile(kernel_file, arch, src, headers, [*opts, b"--ptxas-options=-v"])
    out = parse_ptxas_report(log)
    if replace or not path.exists():
        _write_atomic(path, image)
    _write_atomic(report, json.dumps(out).encode())
    return image, out


# --------------------------------------------------------------------------------------- driver
def _drv(result, what: str):
    """Unpack a driver call's (err, *values); raise with the driver's error name."""
    from cuda.bindings import driver

    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        _, name = driver.cuGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        raise RuntimeError(f"cpd: {what} failed: {name} ({int(err)})")
    return values[0] if len(values) == 1 else values


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _context(idx: int):
    """The device's primary context (retained once; torch's runtime uses the same one)."""
    from cuda.bindings import driver

    with _lock:
        if idx not in _contexts:
            torch.cuda.init()
            _drv(driver.cuInit(0), "cuInit")
            dev = _drv(driver.cuDeviceGet(idx), f"cuDeviceGet({idx})")
            _contexts[idx] = _drv(driver.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain({idx})")
        return _contexts[idx]


@contextlib.contextmanager
def _current(idx: int):
    """Make device idx's primary context current on this thread for the block."""
    from cuda.bindings import driver

    _drv(driver.cuCtxPushCurrent(_context(idx)), "cuCtxPushCurrent")
    try:
        yield
    finally:
        _drv(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")


def image_for(kernel_file: str, idx: int) -> bytes:
    """The NVRTC image of ``kernel_file`` for CUDA device idx (a cubin for its architecture, or PTX
    of the newest one NVRTC knows below it), compiled on first use and cached on disk. The C++
    launches (cuda/cpu/launch.cpp) ask for it once per (device, kernel file)."""
    return compile_source(kernel_file, target_for(*torch.cuda.get_device_capability(idx)))


def _function(idx: int, kernel_file: str, name: str):
    """The CUfunction ``name`` of ``kernel_file`` on device idx, compiling and loading on first use."""
    from cuda.bindings import driver

    with _lock:
        key = (idx, kernel_file)
        if key not in _modules:
            image = image_for(kernel_file, idx)
            with _current(idx):
                _modules[key] = (_drv(driver.cuModuleLoadData(image), f"cuModuleLoadData({kernel_file})"), {})
        module, funcs = _modules[key]
        if name not in funcs:
            funcs[name] = _drv(driver.cuModuleGetFunction(module, name.encode()), f"kernel {name} in {kernel_file}")
        return funcs[name]


#: Dynamic shared memory a kernel may take without asking (48 KiB on every architecture).
_SMEM_DEFAULT = 48 * 1024
_smem_allowed: dict = {}  # (device, kernel file, kernel) -> the dynamic shared memory allowed so far


def _allow_smem(idx: int, call: _kernels.Launch, fn) -> None:
    """Raise a kernel's dynamic shared memory limit to call.smem (above 48 KiB a kernel must opt
    in, cuFuncSetAttribute; once per device, kernel and size). Called with the context current."""
    from cuda.bindings import driver

    key = (idx, call.kernel_file, call.name)
    with _lock:
        if _smem_allowed.get(key, 0) >= call.smem:
            return
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _drv(driver.cuFuncSetAttribute(fn, attr, call.smem), f"{call.name}: {call.smem} bytes of shared memory")
        _smem_allowed[key] = call.smem


def launch(call: _kernels.Launch, device: torch.device) -> None:
    """cuLaunchKernel of one launch on torch's current stream of ``device``."""
    from cuda.bindings import driver

    idx = _index(device)
    fn = _function(idx, call.kernel_file, call.name)
    holders, params, _ = _kernels.pack(call.args)
    stream = torch.cuda.current_stream(idx).cuda_stream
    with _current(idx):
        if call.smem > _SMEM_DEFAULT:
            _allow_smem(idx, call, fn)
        _drv(driver.cuLaunchKernel(fn, *call.grid, *call.block, call.smem, stream, ctypes.addressof(params), 0),
             f"launch of {call.name} (grid {call.grid}, block {call.block}, {call.smem} bytes of shared memory)")
    del holders  # the driver has copied the parameter values


def geometry(device: torch.device) -> _kernels.Geometry:
    """256 threads per block; up to 32 blocks per SM (grid-stride loops take the rest)."""
    props = torch.cuda.get_device_properties(_index(device))
    return _kernels.Geometry(threads=_kernels.MAX_THREADS, max_blocks=props.multi_processor_count * 32)


def unusable_reason(device: torch.device) -> str | None:
    """Why the kernels cannot serve ``device`` (None when they can)."""
    idx = _index(device)
    if idx in _reasons:
        return _reasons[idx]
    reason = None
    if not available():
        reason = "cuda-bindings with an NVRTC is not installed (pip install 'cpd[cuda]')"
    else:
        try:
            import cuda.bindings

            bind_major = int(str(cuda.bindings.__version__).split(".")[0])
            torch_major = int(str(torch.version.cuda).split(".")[0]) if torch.version.cuda else bind_major
            if bind_major != torch_major:
                reason = (f"cuda-bindings {cuda.bindings.__version__} does not match torch's CUDA {torch.version.cuda} "
                          f"(pip install 'cpd[cuda{torch_major}]')")
            elif target_for(*torch.cuda.get_device_capability(idx)) is None:
                cc = torch.cuda.get_device_capability(idx)
                reason = f"NVRTC {nvrtc_version()} targets no architecture at or below the device's sm_{cc[0]}{cc[1]}"
        except Exception as exc:  # a broken install: say what it was
            reason = f"{type(exc).__name__}: {exc}"
    _reasons[idx] = reason
    return reason
