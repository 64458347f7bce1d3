"""The bodies of cpd's custom ops, one per op, over an *engine* that fills preallocated outputs.

:mod:`cpd.ops` declares the ops (schemas, fake and autograd) and registers, per dispatch key, the
bodies below bound to the engine of that device type (``torch.library``'s ``register_kernel``):

* ``cpu``: :class:`Extension` (the compiled CPU extension, ``cuda/cpu/*.cpp``), or
  :class:`Fallback` (pure torch, :mod:`cpd._fallback`) when the extension cannot be built;
* ``cuda``: :class:`Kernels` with :mod:`cpd._cuda`'s launcher (NVRTC-compiled kernels), or
  :class:`Fallback` on the device when NVRTC / the driver cannot serve it (a warning says so);
* tests: :class:`Kernels` with :mod:`cpd._shim`'s launcher on CPU tensors
  (:func:`cpd._shim.on_host`), i.e. the CUDA code path with the kernels run on the host.

A format travels through the schemas as one ``int[]``, ``[exp, man, bias, specials,
subnormals]`` (:func:`spec_of` in :mod:`cpd.ops` builds it; an empty list means "no format",
matmul's exact products); :func:`fmt_tuple` decodes it once per call. Every engine method gets
contiguous tensors, the decoded format(s) and the (seed, offset) pair as Python ints.
"""

from __future__ import annotations

import math
import threading
import warnings

import torch

from . import _cpu, _cuda, _fallback, _kernels, _shim
from .formats import FloatFormat
from .rounding import Rounding

__all__ = ["fmt_tuple", "fmt_of", "code_dtype_of", "Extension", "Fallback", "Kernels", "cast", "cast_out", "encode",
           "decode", "arith", "matmul", "batch_shape", "register",
           "register_cpu", "cuda_engine", "host_engine", "route_cpu_to_kernels"]

_warned: set = set()


def fmt_tuple(spec) -> tuple[int, int, int, int, bool] | None:
    """``[exp, man, bias, specials, subnormals]`` -> a tuple (None for the empty list)."""
    if len(spec) == 0:
        return None
    if len(spec) != 5:
        raise ValueError(f"a format argument is [exp, man, bias, specials, subnormals], got {list(spec)}")
    exp, man, bias, specials, subnormals = (int(v) for v in spec)
    return exp, man, bias, specials, bool(subnormals)


def fmt_of(t) -> FloatFormat:
    exp, man, bias, specials, subnormals = t
    return FloatFormat.from_core(exp, man, bias, specials, subnormals)


def code_dtype_of(t) -> torch.dtype:
    bits = 1 + t[0] + t[1]
    return torch.uint8 if bits <= 8 else torch.int16 if bits <= 16 else torch.int32


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _to_code_dtype(c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int64 bit patterns -> the code dtype, keeping the low bits (int16 holds 16-bit patterns)."""
    if dtype == torch.int16:
        c = torch.where(c >= 1 << 15, c - (1 << 16), c)
    elif dtype == torch.int32:
        c = torch.where(c >= 1 << 31, c - (1 << 32), c)
    return c.to(dtype)


# --------------------------------------------------------------------------------------- engines
class Extension:
    """The compiled CPU extension (cuda/cpu/*.cpp)."""

    def __init__(self, ext):
        self.ext = ext

    def cast(self, x, out, f, rounding, saturate, sr_bits, s, o):
        self.ext.cast_out(x, out, *f, rounding, saturate, sr_bits, s, o)

    def encode(self, x, codes, f, rounding, saturate):
        self.ext.encode_out(x, codes, *f, rounding, saturate)

    def decode(self, codes, out, f):
        self.ext.decode_out(codes, out, *f)

    def arith(self, op, a, b, c, out, f, rounding, saturate, sr_bits, s, o):
        self.ext.arith_out(op, a, b, c, out, *f, rounding, saturate, sr_bits, s, o)

    def matmul(self, a, b, out, mf, af, kahan, block, rounding, saturate, sr_bits, s, o):
        self.ext.matmul_out(a, b, out, mf is not None, *(mf or af), *af, kahan, block, rounding, saturate, sr_bits,
                            s, o, 0)


class Fallback:
    """Pure torch (cpd/_fallback.py), on any device."""

    def cast(self, x, out, f, rounding, saturate, sr_bits, s, o):
        out.copy_(_fallback.cast(x, fmt_of(f), Rounding.from_code(rounding), saturate, sr_bits, s, o))

    def encode(self, x, codes, f, rounding, saturate):
        fmt = fmt_of(f)
        v = _fallback.cast(x, fmt, Rounding.from_code(rounding), saturate, 32, 0, 0)
        codes.copy_(_to_code_dtype(_fallback.encode_values(v, fmt), codes.dtype))

    def decode(self, codes, out, f):
        fmt = fmt_of(f)
        out.copy_(_fallback.decode(codes.to(torch.int64) & ((1 << fmt.bits) - 1), fmt))

    def arith(self, op, a, b, c, out, f, rounding, saturate, sr_bits, s, o):
        name = {0: "mul", 1: "add", 2: "fma"}[op]
        out.copy_(_fallback.arith(name, a, b, c if op == 2 else None, fmt_of(f), Rounding.from_code(rounding),
                                  saturate, sr_bits, s, o))

    def matmul(self, a, b, out, mf, af, kahan, block, rounding, saturate, sr_bits, s, o):
        out.copy_(_fallback.matmul(a, b, fmt_of(mf) if mf else None, fmt_of(af), kahan, block,
                                   Rounding.from_code(rounding), saturate, sr_bits, s, o))


class Kernels:
    """The CUDA kernels (cuda/kernels/*.cu), launched by ``launcher`` (cpd/_cuda.py on a GPU,
    cpd/_shim.py on the host) with ``geometry``."""

    def __init__(self, launcher, geometry: _kernels.Geometry):
        self.launcher, self.geometry = launcher, geometry

    def cast(self, x, out, f, rounding, saturate, sr_bits, s, o):
        _kernels.cast(x, out, f, rounding, saturate, sr_bits, s, o, self.launcher, self.geometry)

    def encode(self, x, codes, f, rounding, saturate):
        _kernels.encode(x, codes, f, rounding, saturate, self.launcher, self.geometry)

    def decode(self, codes, out, f):
        _kernels.decode(codes, out, f, self.launcher, self.geometry)

    def arith(self, op, a, b, c, out, f, rounding, saturate, sr_bits, s, o):
        _kernels.arith(op, a, b, c, out, f, rounding, saturate, sr_bits, s, o, self.launcher, self.geometry)

    def matmul(self, a, b, out, mf, af, kahan, block, rounding, saturate, sr_bits, s, o):
        _kernels.matmul(a, b, out, mf, af, kahan, block, rounding, saturate, sr_bits, s, o, self.launcher,
                        self.geometry)


def host_engine():
    """The CPU engine: the extension, or the fallback (with a warning once) when it cannot be built."""
    ext = _cpu.extension()
    if ext is not None:
        return Extension(ext)
    if not _cpu.forced_fallback():
        warn_once("cpu", "cpd: no compiled CPU extension; using the slow pure-torch path")
    return Fallback()


def cuda_engine(device: torch.device):
    """The engine of a CUDA device: the kernels (:mod:`cpd._cuda`), or the fallback on the device
    (with a warning once) when NVRTC / the driver cannot serve it."""
    reason = _cuda.unusable_reason(device)
    if reason is not None:
        warn_once(f"cuda{_cuda._index(device)}", f"cpd: CUDA kernels unavailable on {device} ({reason}); "
                  "using the pure-torch path on the device")
        return Fallback()
    return Kernels(_cuda.launch, _cuda.geometry(device))


# --------------------------------------------------------------------------------------- op bodies
def _seed_pair(seed: torch.Tensor, rounding: int) -> tuple[int, int]:
    """(seed, offset) as Python ints; (0, 0) unless stochastic. seed is a CPU tensor from
    cpd.ops.draw_seed, so this reads host memory (no device synchronisation)."""
    if rounding != Rounding.STOCHASTIC.code:
        return 0, 0
    s, o = seed.tolist()
    return int(s), int(o)


def cast(engine, x, seed, fmt, rounding, saturate, sr_bits):
    xc = x.contiguous()
    out = torch.empty_like(xc)
    engine.cast(xc, out, fmt_tuple(fmt), rounding, saturate, sr_bits, *_seed_pair(seed, rounding))
    return out


def cast_out(engine, x, seed, fmt, rounding, saturate, sr_bits, out):
    xc = x.contiguous()
    target = out if out.is_contiguous() else torch.empty_like(xc)
    engine.cast(xc, target, fmt_tuple(fmt), rounding, saturate, sr_bits, *_seed_pair(seed, rounding))
    if target is not out:
        out.copy_(target)


def encode(engine, x, fmt, rounding, saturate):
    f = fmt_tuple(fmt)
    xc = x.contiguous()
    codes = torch.empty(xc.shape, dtype=code_dtype_of(f), device=xc.device)
    engine.encode(xc, codes, f, rounding, saturate)
    return codes


def decode(engine, codes, fmt):
    cc = codes.contiguous()
    out = torch.empty(cc.shape, dtype=torch.float32, device=cc.device)
    engine.decode(cc, out, fmt_tuple(fmt))
    return out


def arith(engine, op, a, b, c, seed, fmt, rounding, saturate, sr_bits):
    a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
    out = torch.empty_like(a)
    engine.arith(op, a, b, c, out, fmt_tuple(fmt), rounding, saturate, sr_bits, *_seed_pair(seed, rounding))
    return out


def batch_shape(a_shape, b_shape) -> tuple:
    """The broadcast batch dims of matmul operands of shapes (..., M, K) and (..., K, N)
    (torch.matmul's rule); RuntimeError if they do not broadcast."""
    if len(a_shape) == 2 and len(b_shape) == 2:  # the common case, without torch.broadcast_shapes
        return ()
    return tuple(torch.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))


def matmul(engine, a, b, seed, mul, acc, kahan, block, rounding, saturate, sr_bits):
    batch = batch_shape(a.shape, b.shape)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    B = math.prod(batch)
    a3 = a.expand(*batch, M, K).reshape(B, M, K).contiguous()
    b3 = b.expand(*batch, K, N).reshape(B, K, N).contiguous()
    out = torch.empty((B, M, N), dtype=torch.float32, device=a.device)
    engine.matmul(a3, b3, out, fmt_tuple(mul), fmt_tuple(acc), kahan, block, rounding, saturate, sr_bits,
                  *_seed_pair(seed, rounding))
    return out.reshape(*batch, M, N)


# --------------------------------------------------------------------------------------- registration
def _bind(body, engine_of):
    def kernel(*args):
        return body(engine_of(args), *args)

    kernel.__name__ = kernel.__qualname__ = body.__name__
    return kernel


def register_cpu(impls, kernels_on_host: bool = False) -> None:
    """CPU tensors: the extension or fallback (default), or the CUDA kernels run by the host shim
    (cpd._shim.on_host)."""
    if kernels_on_host:
        def engine_of(args):
            return Kernels(_shim.launcher, _shim.geometry())
    else:
        def engine_of(args):
            return host_engine()
    for op, body, _ in impls:
        op.register_kernel("cpu")(_bind(body, engine_of))


_registered: list = []  # every register() call's impls, for route_cpu_to_kernels


def route_cpu_to_kernels(on: bool) -> None:
    """Re-register the CPU implementations of every registered op (cpd.ops and cpd.mx): the CUDA
    kernels through the host shim (on), or the extension / fallback (off)."""
    for impls in _registered:
        register_cpu(impls, kernels_on_host=on)
    _core.route_cpu(on)


def register(impls) -> None:
    """Register each op's body per device type: ``((op, body, index of the tensor whose device
    picks the CUDA engine), ...)``."""
    _registered.append(tuple(impls))
    register_cpu(impls)
    for op, body, i in impls:
        op.register_kernel("cuda")(_bind(body, lambda args, i=i: cuda_engine(args[i].device)))


# --------------------------------------------------------------------------------------- the core ops
class CoreOps:
    """The registrations of the core ops (cpd/ops.py: cast, cast_out, encode, decode, arith,
    matmul), whose schemas are defined in Python so that they exist without a compiler.

    * CUDA: the bodies above over :func:`cuda_engine`, registered once;
    * CPU and autograd, until the extension is loaded: the bodies over :func:`host_engine` and
      torch.library's Python autograd, on a library of their own (``_py_cpu``, ``_py_autograd``);
    * once the extension is loaded (:meth:`install`, from the public functions' first call after
      the first CPU call built or loaded it): those Python libraries are destroyed and the
      extension registers its C++ CPU and autograd kernels (``cuda/cpu/ops.cpp``), so a call has
      no Python below the public function;
    * :func:`cpd._shim.on_host` swaps the CPU kernels for the CUDA bodies run by the shim
      (:meth:`route_cpu`) and back.
    """

    def __init__(self):
        self.bodies: dict = {}     # op name -> (body, index of the tensor whose device picks the engine)
        self.autograd: dict = {}   # op name -> (backward, setup_context)
        self.native = None         # the extension whose C++ kernels are installed
        self.done = False          # nothing more to install (C++ kernels in, or no extension)
        self._py_cpu = self._py_autograd = self._shim = None
        self._lock = threading.Lock()

    def register(self, bodies: dict, autograd: dict) -> None:
        self.bodies, self.autograd = dict(bodies), dict(autograd)
        self._cuda = torch.library.Library("cpd", "IMPL")
        for name, (body, i) in self.bodies.items():
            self._cuda.impl(name, _bind(body, lambda args, i=i: cuda_engine(args[i].device)), "CUDA")
        self._py_cpu = self._cpu_lib(lambda args: host_engine())
        self._py_autograd = torch.library.Library("cpd", "IMPL")
        for name, (backward, setup) in self.autograd.items():
            torch.library.register_autograd(f"cpd::{name}", backward, setup_context=setup, lib=self._py_autograd)

    def _cpu_lib(self, engine_of):
        lib = torch.library.Library("cpd", "IMPL")
        for name, (body, _) in self.bodies.items():
            lib.impl(name, _bind(body, engine_of), "CPU")
        return lib

    def install(self) -> None:
        """Install the C++ kernels if the extension is loaded (never builds it); called by the
        public functions until it has happened (:attr:`done`)."""
        state = _cpu.loaded()
        if state is None:  # not tried yet: the first CPU call builds or loads it
            return
        with self._lock:
            if self.done:
                return
            ext = state[0]
            if ext is not None and hasattr(ext, "install_ops"):
                if self._shim is None:
                    self._py_cpu._destroy()
                    self._py_cpu = None
                self._py_autograd._destroy()
                self._py_autograd = None
                ext.install_ops()
                if self._shim is not None:  # within on_host: the shim keeps the CPU key
                    ext.set_cpu_kernels(False)
                self.native = ext
            self.done = True

    def route_cpu(self, on: bool) -> None:
        with self._lock:
            if on and self._shim is None:
                if self.native is not None:
                    self.native.set_cpu_kernels(False)
                elif self._py_cpu is not None:
                    self._py_cpu._destroy()
                    self._py_cpu = None
                self._shim = self._cpu_lib(lambda args: Kernels(_shim.launcher, _shim.geometry()))
            elif not on and self._shim is not None:
                self._shim._destroy()
                self._shim = None
                if self.native is not None:
                    self.native.set_cpu_kernels(True)
                else:
                    self._py_cpu = self._cpu_lib(lambda args: host_engine())


_core = CoreOps()
_shim.set_router(route_cpu_to_kernels)  # cpd._shim.on_host routes through this module
