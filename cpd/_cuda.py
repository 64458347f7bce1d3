"""CUDA back end: NVRTC compile of ``cuda/kernels/*.cu`` at first use, on-disk cache, launches on
torch's current stream.

Compilation needs only the pip packages ``cuda-bindings`` and ``nvidia-cuda-nvrtc-cu12`` (the
``cuda`` extra), no nvcc and no GPU, so the test suite compiles every kernel for sm_70, sm_80 and
sm_90 on any machine. The numerics headers are passed to NVRTC as in-memory headers: NVRTC from
pip has no system headers, which is why they include nothing but each other.

Cache: ``$CPD_CACHE_DIR`` (default ``~/.cache/cpd``)/nvrtc/<sha256 of source, header, options,
NVRTC version>.cubin. Loaded modules are kept per (device, kernel file).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from pathlib import Path

import torch

from ._cpu import source_dir

__all__ = ["available", "compile_source", "cast_out", "encode_out", "decode_out", "arith_out", "matmul_out",
           "NVRTC_OPTIONS"]

#: FMA contraction changes results (Kahan, exact emulation); the float multiply in compose()
#: must stay a plain multiply. -default-device is not used: kernels are explicit.
NVRTC_OPTIONS = ("--fmad=false", "-std=c++17")

_lock = threading.Lock()
_modules: dict = {}
_THREADS = 256


def available() -> bool:
    """True when cuda-bindings' NVRTC can be loaded (a GPU is not required to compile)."""
    try:
        from cuda.bindings import nvrtc  # noqa: F401

        err, _, _ = nvrtc.nvrtcVersion()
        return int(err) == 0
    except Exception:
        return False


def _headers() -> list[tuple[bytes, bytes]]:
    """(name, text) of every numerics header, as the kernels include them ("cpd/<part>.h")."""
    folder = source_dir() / "include" / "cpd"
    return [(f"cpd/{p.name}".encode(), p.read_bytes()) for p in sorted(folder.glob("*.h"))]


def _kernel_source(name: str) -> bytes:
    return (source_dir() / "kernels" / name).read_bytes()


def _cache_dir() -> Path:
    d = Path(os.environ.get("CPD_CACHE_DIR", Path.home() / ".cache" / "cpd")) / "nvrtc"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _check(result, what: str, prog=None):
    from cuda.bindings import nvrtc

    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        log = ""
        if prog is not None:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.decode(errors="replace").rstrip("\x00 ")
        raise RuntimeError(f"cpd: NVRTC {what} failed ({err}){': ' + log if log else ''}")
    return result[1:] if isinstance(result, tuple) and len(result) > 1 else None


def compile_source(kernel_file: str = "cast.cu", arch: str = "sm_80", *, use_cache: bool = True) -> bytes:
    """Compile one kernel file to a cubin for ``arch`` (e.g. ``"sm_90"``) and return its bytes.

    Raises RuntimeError with NVRTC's log when the source does not compile.
    """
    from cuda.bindings import nvrtc

    src, headers = _kernel_source(kernel_file), _headers()
    opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in NVRTC_OPTIONS)]
    _, major, minor = nvrtc.nvrtcVersion()
    text = src + b"".join(n + t for n, t in headers) + b"\0".join(opts) + f"{major}.{minor}".encode()
    key = hashlib.sha256(text).hexdigest()[:24]
    path = _cache_dir() / f"{Path(kernel_file).stem}-{arch}-{key}.cubin"
    if use_cache and path.exists():
        return path.read_bytes()
    names, texts = [n for n, _ in headers], [t for _, t in headers]
    (prog,) = _check(nvrtc.nvrtcCreateProgram(src, kernel_file.encode(), len(headers), texts, names), "create")
    try:
        _check(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), f"compile of {kernel_file} for {arch}", prog)
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "get cubin")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(cubin)
    tmp.replace(path)  # atomic: concurrent processes never read a half-written cubin
    return cubin


def _function(device: torch.device, kernel_file: str, name: str):
    """The CUfunction ``name`` of ``kernel_file`` for ``device``, compiling and loading on first use."""
    from cuda.bindings import driver

    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (idx, kernel_file)
    with _lock:
        if key not in _modules:
            major, minor = torch.cuda.get_device_capability(idx)
            cubin = compile_source(kernel_file, f"sm_{major}{minor}")
            torch.cuda.init()
            with torch.cuda.device(idx):
                torch.cuda.current_stream(idx)  # make torch's primary context current
                err, module = driver.cuModuleLoadData(cubin)
                if int(err) != 0:
                    raise RuntimeError(f"cpd: cuModuleLoadData failed ({err})")
            _modules[key] = (module, {})
        module, funcs = _modules[key]
        if name not in funcs:
            err, fn = driver.cuModuleGetFunction(module, name.encode())
            if int(err) != 0:
                raise RuntimeError(f"cpd: kernel {name} not found in {kernel_file} ({err})")
            funcs[name] = fn
        return funcs[name]


def _launch(x: torch.Tensor, kernel_file: str, name: str, n: int, args: list) -> None:
    """Launch ``name`` over n elements on torch's current stream. ``args`` are (ctypes type, value)."""
    from cuda.bindings import driver

    if n == 0:
        return
    fn = _function(x.device, kernel_file, name)
    holders = [ctype(value) for ctype, value in args]
    params = (ctypes.c_void_p * len(holders))(*(ctypes.addressof(h) for h in holders))
    props = torch.cuda.get_device_properties(x.device)
    blocks = max(1, min((n + _THREADS - 1) // _THREADS, props.multi_processor_count * 32))
    stream = torch.cuda.current_stream(x.device).cuda_stream
    (err,) = driver.cuLaunchKernel(fn, blocks, 1, 1, _THREADS, 1, 1, 0, stream, ctypes.addressof(params), 0)
    if int(err) != 0:
        raise RuntimeError(f"cpd: launch of {name} failed ({err})")


def _ptr(t: torch.Tensor):
    return (ctypes.c_void_p, t.data_ptr())


def _fmt(exp, man, bias, specials, subnormals):
    return [(ctypes.c_int, exp), (ctypes.c_int, man), (ctypes.c_int, bias), (ctypes.c_int, specials),
            (ctypes.c_int, int(subnormals))]


def cast_out(x, out, seed, exp, man, bias, specials, subnormals, rounding, saturate, sr_bits) -> None:
    """cast(x) into out on the GPU; ``seed`` is the int64 (seed, offset) pair (moved to the device)."""
    seed = seed.to(device=x.device, dtype=torch.int64)
    n = x.numel()
    _launch(x, "cast.cu", "cpd_cast", n, [_ptr(x), _ptr(out), (ctypes.c_longlong, n),
                                          *_fmt(exp, man, bias, specials, subnormals),
                                          (ctypes.c_int, rounding), (ctypes.c_int, int(saturate)),
                                          (ctypes.c_int, sr_bits), _ptr(seed)])


_SUFFIX = {torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32"}


def encode_out(x, codes, exp, man, bias, specials, subnormals, rounding, saturate) -> None:
    n = x.numel()
    _launch(x, "cast.cu", f"cpd_encode_{_SUFFIX[codes.dtype]}", n,
            [_ptr(x), _ptr(codes), (ctypes.c_longlong, n), *_fmt(exp, man, bias, specials, subnormals),
             (ctypes.c_int, rounding), (ctypes.c_int, int(saturate))])


def decode_out(codes, out, exp, man, bias, specials, subnormals) -> None:
    n = codes.numel()
    _launch(codes, "cast.cu", f"cpd_decode_{_SUFFIX[codes.dtype]}", n,
            [_ptr(codes), _ptr(out), (ctypes.c_longlong, n), *_fmt(exp, man, bias, specials, subnormals)])


def arith_out(op, a, b, c, out, seed, exp, man, bias, specials, subnormals, rounding, saturate, sr_bits) -> None:
    """out = round(a*b) (op 0), round(a+b) (op 1) or round(c + a*b) (op 2) on the GPU."""
    seed = seed.to(device=a.device, dtype=torch.int64)
    n = out.numel()
    _launch(a, "cast.cu", "cpd_arith", n, [(ctypes.c_int, op), _ptr(a), _ptr(b), _ptr(c), _ptr(out),
                                           (ctypes.c_longlong, n), *_fmt(exp, man, bias, specials, subnormals),
                                           (ctypes.c_int, rounding), (ctypes.c_int, int(saturate)),
                                           (ctypes.c_int, sr_bits), _ptr(seed)])


def matmul_out(a, b, out, seed, has_mul, mexp, mman, mbias, mspecials, msubnormals, aexp, aman, abias, aspecials,
               asubnormals, kahan, block, rounding, saturate, sr_bits) -> None:
    """out (B, M, N) = the accumulated a (B, M, K) @ b (B, K, N) on the GPU (numerics.h dot_step)."""
    seed = seed.to(device=a.device, dtype=torch.int64)
    B, M, K = a.shape
    N = b.shape[2]
    i = ctypes.c_int
    _launch(a, "matmul.cu", "cpd_matmul", out.numel(),
            [_ptr(a), _ptr(b), _ptr(out), (ctypes.c_longlong, B), (ctypes.c_longlong, M), (ctypes.c_longlong, K),
             (ctypes.c_longlong, N), (i, int(has_mul)), *_fmt(mexp, mman, mbias, mspecials, msubnormals),
             *_fmt(aexp, aman, abias, aspecials, asubnormals), (i, int(kahan)), (i, block), (i, rounding),
             (i, int(saturate)), (i, sr_bits), _ptr(seed)])
