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
import os
import threading
import warnings

import torch

from . import _cpu, _cuda, _fallback, _kernels, _shim
from .formats import FloatFormat
from .rounding import Rounding

__all__ = ["fmt_tuple", "fmt_of", "code_dtype_of", "Extension", "Fallback", "Kernels", "cast", "cast_out", "encode",
           "decode", "arith", "matmul", "batch_shape",
           "cuda_engine", "host_engine", "shim_engine", "kernels_engine", "route_cpu_to_kernels"]

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
        self.ext.arith_out(op, a, b, c, out, *f, rounding, saturate, sr_bits, s, o, 0)

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

    def reduce_rows(self, x, out, w, k, kahan, leader_comp, cast_inputs, f, rounding, saturate, sr_bits, seeds):
        _kernels.reduce_rows(x, out, w, k, kahan, leader_comp, cast_inputs, f, rounding, saturate, sr_bits, seeds,
                             self.launcher, self.geometry)


def host_engine():
    """The CPU engine: the extension, or the fallback (with a warning once) when it cannot be built."""
    ext = _cpu.extension()
    if ext is not None:
        return Extension(ext)
    if not _cpu.forced_fallback():
        warn_once("cpu", "cpd: no compiled CPU extension; using the slow pure-torch path")
    return Fallback()


def shim_engine() -> Kernels:
    """The CUDA kernels run on the host by the shim, with :func:`cpd._shim.on_host`'s geometry."""
    return Kernels(_shim.launcher, _shim.geometry())


def kernels_engine(device: torch.device):
    """The CUDA kernels' engine for tensors on ``device``, or None: a CUDA device whose kernels
    are usable, or CPU tensors while :func:`cpd._shim.on_host` runs them on the host. For the
    kernels that have no CPU loop of their own (``cpd_reduce_rows``)."""
    if device.type == "cuda":
        engine = cuda_engine(device)
        return engine if isinstance(engine, Kernels) else None
    if device.type == "cpu" and _core._shim is not None:
        return shim_engine()
    return None


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


def route_cpu_to_kernels(on: bool) -> None:
    """CPU tensors of every registered op (cpd.ops and cpd.mx): the CUDA kernels through the host
    shim (on), or the extension / fallback (off) (:meth:`CoreOps.route_cpu`)."""
    _core.route_cpu(on)


# --------------------------------------------------------------------------------------- the core ops
class _Libs:
    """``torch.library`` IMPL libraries, one per op namespace (``cpd``, ``cpd_mx``), destroyed together."""

    def __init__(self):
        self.libs: dict = {}

    def impl(self, qualname: str, fn, key: str) -> None:
        self.lib(qualname).impl(qualname.split("::")[1], fn, key)

    def lib(self, qualname: str):
        ns = qualname.split("::")[0]
        if ns not in self.libs:
            self.libs[ns] = torch.library.Library(ns, "IMPL")
        return self.libs[ns]

    def _destroy(self) -> None:
        for lib in self.libs.values():
            lib._destroy()
        self.libs = {}


class CoreOps:
    """The registrations of the core ops (cpd/ops.py: cast, cast_out, encode, decode, arith,
    matmul) and cpd.mx's (cpd/mx.py: cpd_mx::cast, cast_out, encode, decode), whose schemas are
    defined in Python so that they exist without a compiler; the extension's C++ kernels serve
    both namespaces (cuda/cpu/ops.cpp, cuda/cpu/mx_ops.cpp).

    * CUDA, until the C++ launches take over: the bodies above over :func:`cuda_engine`;
    * CPU and autograd, until the extension is loaded: the bodies over :func:`host_engine` and
      torch.library's Python autograd, on a library of their own (``_py_cpu``, ``_py_autograd``);
    * once the extension is loaded (:meth:`install`, from the public functions' first call after
      the first CPU call built or loaded it): those Python libraries are destroyed and the
      extension registers its C++ CPU and autograd kernels (``cuda/cpu/ops.cpp``), so a call has
      no Python below the public function;
    * CUDA: the first call on a device whose kernels are usable loads the extension (building it
      once, announced); the next public call's :meth:`install` destroys the Python CUDA library
      and the extension registers its CUDA kernels, which launch from C++
      (``cuda/cpu/launch.cpp``). A device the kernels cannot serve keeps the Python bodies (the
      pure-torch fallback on the device, with its warning); so does a machine with no compiler;
    * :func:`cpd._shim.on_host` gives CPU tensors the CUDA kernels run by the shim
      (:meth:`route_cpu`): through the extension's C++ launches when it is installed (the
      GPU's marshalling, tested on any machine), else through the Python launches.
    """

    def __init__(self):
        self.bodies: dict = {}     # "ns::name" -> (body, index of the tensor whose device picks the engine)
        self.autograd: dict = {}   # "ns::name" -> (backward, setup_context)
        self.torch_path = None     # cpd.mx's pure-torch path, which its C++ kernels call for exotic formats
        self.native = None         # the extension whose C++ kernels are installed
        self.native_cuda = False   # its CUDA kernels too
        self.done = False          # nothing more to install
        self._cuda_usable = None   # whether the first CUDA call's device could run the kernels
        self.prefer_native = True  # on_host: launch through the extension when it is installed
        self._cuda, self._py_cpu, self._py_autograd = _Libs(), _Libs(), _Libs()
        self._shim = None
        self._lock = threading.Lock()

    def register(self, bodies: dict, autograd: dict, ns: str = "cpd", torch_path=None) -> None:
        """The Python bodies ``{name: (body, tensor index)}`` and autograd ``{name: (backward,
        setup_context)}`` of namespace ``ns``'s ops (before the first install: at import)."""
        if self.native is not None or self._shim is not None:
            raise RuntimeError(f"cpd: the {ns} ops are registered after the C++ kernels were installed")
        bodies = {f"{ns}::{name}": entry for name, entry in bodies.items()}
        self.bodies.update(bodies)
        if torch_path is not None:
            self.torch_path = torch_path
        for qualname, (body, i) in bodies.items():
            self._cuda.impl(qualname, _bind(body, lambda args, i=i: self._cuda_engine(args[i].device)), "CUDA")
            self._py_cpu.impl(qualname, _bind(body, lambda args: host_engine()), "CPU")
        for name, (backward, setup) in autograd.items():
            self.autograd[f"{ns}::{name}"] = (backward, setup)
            torch.library.register_autograd(f"{ns}::{name}", backward, setup_context=setup,
                                            lib=self._py_autograd.lib(f"{ns}::{name}"))

    def _cuda_engine(self, device):
        engine = cuda_engine(device)
        if self._cuda_usable is None:
            self._cuda_usable = isinstance(engine, Kernels)
            if self._cuda_usable:
                _cpu.extension()  # load (or build, once) the extension whose C++ launches serve the next calls
        return engine

    def _cpu_lib(self, engine_of) -> _Libs:
        libs = _Libs()
        for qualname, (body, _) in self.bodies.items():
            libs.impl(qualname, _bind(body, engine_of), "CPU")
        return libs

    def install(self) -> None:
        """Install the C++ kernels if the extension is loaded (never builds it); called by the
        public functions until nothing is left to install (:attr:`done`)."""
        state = _cpu.loaded()
        if state is None:  # not tried yet: the first CPU (or CUDA) call builds or loads it
            return
        with self._lock:
            if self.done:
                return
            ext = state[0]
            if ext is None or not hasattr(ext, "install_ops"):  # no extension, or a core-only build
                self.done = True
                return
            if self.native is None:
                if self._shim is None:
                    self._py_cpu._destroy()
                    self._py_cpu = None
                self._py_autograd._destroy()
                self._py_autograd = None
                ext.install_ops()
                ext.set_launch_sources(_cuda.image_for, _shim.entry)
                if self.torch_path is not None:
                    ext.set_mx_torch_path(self.torch_path)
                if self._shim is not None:  # within on_host: the shim keeps the CPU key
                    self._shim._destroy()
                    self._shim = None
                    if self.prefer_native:
                        ext.set_host_geometry(*_host_geometry())
                        ext.set_cpu_kernels(2)
                        self._shim = "native"
                    else:
                        ext.set_cpu_kernels(0)
                        self._shim = self._cpu_lib(lambda args: shim_engine())
                self.native = ext
            if self._cuda_usable and os.environ.get("CPD_CUDA_LAUNCH", "cpp") != "python":
                # the first CUDA call found the kernels usable on its device (CPD_CUDA_LAUNCH=python
                # keeps the Python launches: the same kernels and bits, ~70 us more per call)
                self._cuda._destroy()
                self._cuda = None
                ext.install_cuda_ops()
                self.native_cuda = self.done = True
            elif self._cuda_usable is not None or not torch.cuda.is_available():
                self.done = True  # the Python CUDA bodies stay (the fallback, or CPD_CUDA_LAUNCH=python)

    def route_cpu(self, on: bool) -> None:
        """CPU tensors get the CUDA kernels through the host shim (on), launched from C++ when the
        extension is installed and :attr:`prefer_native` (tests set it False to run the Python
        launches), else from Python; or their usual kernels (off)."""
        with self._lock:
            if on and self._shim is None and self.native is not None and self.prefer_native:
                self.native.set_host_geometry(*_host_geometry())
                self.native.set_cpu_kernels(2)
                self._shim = "native"
            elif on and self._shim is None:
                if self.native is not None:
                    self.native.set_cpu_kernels(0)
                elif self._py_cpu is not None:
                    self._py_cpu._destroy()
                    self._py_cpu = None
                self._shim = self._cpu_lib(lambda args: shim_engine())
            elif not on and self._shim is not None:
                if self._shim != "native":
                    self._shim._destroy()
                self._shim = None
                if self.native is not None:
                    self.native.set_cpu_kernels(1)
                else:
                    self._py_cpu = self._cpu_lib(lambda args: host_engine())


def _host_geometry() -> tuple[int, int]:
    """The shim's geometry for the C++ launches: (threads, max_blocks, 0 for no limit)."""
    g = _shim.geometry()
    return g.threads, g.max_blocks or 0


_core = CoreOps()
_shim.set_router(route_cpu_to_kernels)  # cpd._shim.on_host routes through this module

# The tensor types torch.ops would hand no __torch_function__ (nn.Parameter disables its own).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_compiling = torch.compiler.is_compiling
_torch_function_mode = torch._C._is_torch_function_mode_enabled


def direct(*tensors):
    """The extension, when an op call may go straight into torch's dispatcher through its
    ``call_*`` functions (``cuda/cpu/ops.cpp``, "direct calls") rather than through
    ``torch.ops``; else None. Both reach the same op, dispatch keys and kernels (autograd, every
    device, fake tensors and other dispatch modes); ``torch.ops`` adds the __torch_function__
    protocol and is what torch.compile traces. So the direct call is taken once the extension's
    kernels are installed, with plain tensors (``torch.Tensor``, ``nn.Parameter``), no
    __torch_function__ mode active, and not while compiling."""
    if _compiling():  # first: under dynamo this is a constant True, and nothing below is traced
        return None
    ext = _core.native
    if ext is None or _torch_function_mode():
        return None
    for t in tensors:
        if type(t) not in _PLAIN_TENSORS:
            return None
    return ext
