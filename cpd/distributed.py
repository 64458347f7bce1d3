"""Real multi-process low-precision gradient communication on ``torch.distributed``.

The single-process emulator (:func:`cpd.allreduce`, :func:`cpd.aps_allreduce`) answers "would it
converge?"; this module sends the same low-precision sums between real processes (gloo on CPU,
NCCL on GPU; never a home-made transport) and gives the same bits, so a user can prototype in one
process and deploy on many:

* :class:`APSHookState` + :func:`aps_hook`: a DDP communication hook
  (``ddp.register_comm_hook(state, cpd.distributed.aps_hook)``);
* ``cpd.APSOptimizer(opt, fmt=..., process_group=dist.group.WORLD)``: the same inside ``step()``,
  without DDP.

What travels, per DDP bucket (or per optimizer step), on a dedicated process group:

1. **Exponent exchange**: one ``all_reduce(MAX)`` of one int32 per layer: the layer's APS exponent
   ``ceil(log2(max|g| * W))`` (the APS paper's Algorithm 1, FINDMAXEXP; Gong et al.), with
   sentinels for "no gradient", "all zero" and "inf/NaN", so every rank takes the same decision
   for every layer (scale, float32, skip).
2. **Scale and encode**: ``g * 2**s`` cast to the format (as :func:`cpd.aps_allreduce`), sent as
   integer codes (:func:`cpd.encode`): one byte per element for 8-bit formats, sub-byte formats
   packed (:func:`pack_codes`: two 4-bit codes per byte, eight 1-bit codes per byte, 3/5/6/7-bit
   codes as a bit stream).
3. **Reduce**: ``"ring"``: reduce-scatter over point-to-point messages (``batch_isend_irecv``),
   every hop decodes, adds in the format (:func:`cpd.add`, optional Kahan compensation, which
   then travels with the partial sum), re-encodes; then an allgather of the owned chunks.
   ``"hierarchical"``: a gather of codes to each group's first rank (subgroups from
   ``dist.new_subgroups_by_enumeration``), a sequential sum there, the ring across group leaders,
   a broadcast back. ``"one_rounding"``: ``all_to_all_single`` of the codes, each rank sums its
   chunk in float32 (worker order), an allgather of the float32 chunks: one rounding only (the
   cast), for users who want the bandwidth saving of the first half without low-precision sums.
4. Decode, unscale (``/ 2**s``), divide by W (by the caller: the hook or the optimizer).

Integer codes are never summed with ``all_reduce(SUM)`` (uint8 codes would wrap around).

With a gradient compressor (``APSHookState(compressor=...)``, ``APSOptimizer(compressor=...,
process_group=...)``) the exchange is the emulator's ``cpd.compressors.reduce_layers`` instead: one
``all_reduce(MAX)`` of per-layer flags (no gradient / finite / inf-NaN), each rank quantizes its
layers once with its own error-feedback states (rank r keeps the emulator's worker-r state), then
the ``"ring"`` or ``"pairwise"`` order of :mod:`cpd.compressors.reduce` over point-to-point
messages and a ring allgather of the final payloads. A message concatenates the payloads' uint8
parts in :meth:`cpd.compressors.Compressor.wire_layout` order; sizes that follow from the shapes
are not sent, data-dependent ones (threshold/adaptive index words) go first as int32
(:attr:`StepReport.length_bytes`). The sums equal ``cpd.allreduce(..., compressor=...)`` per layer
bit for bit.

Bit-identity contract: with the same format, algorithm, group size, Kahan flag, rounding and
worker order (worker w = the w-th rank of the process group), the sums equal
``cpd.aps_allreduce(...)`` (``scaling="aps"``), ``cpd.scaled_allreduce(..., scale_exp)``
(``"loss"``) or ``cpd.scaled_allreduce(..., 0)`` (None) bit for bit, layer by layer (each layer
is chunked like ``numpy.array_split`` into W chunks, chunk c starts at worker c: the emulator's
order, DESIGN.md §3). ``"one_rounding"`` has no emulator algorithm; its specification is
``cpd.allreduce(cast(g * 2**s, fmt), cpd.FP32, algorithm="sequential") / 2**s``. Only the
deterministic rounding modes are supported (stochastic rounding draws its bits per emulator call,
which W processes cannot reproduce).

Threading: gloo's point-to-point operations give no futures. The hook hands each bucket to one
communication thread per state (a FIFO queue) and returns a ``torch.futures.Future`` the thread
completes, so backward continues while buckets are reduced, and the buckets of every rank are
reduced in the same order (DDP launches hooks in bucket order). All traffic goes through a
process group created for the state, so it never interleaves with DDP's own collectives.

Faults: every wait is bounded by ``timeout`` seconds; a rank that raises or dies makes the
others raise :class:`CommunicationError` (from ``loss.backward()`` or ``step()``) within the
timeout, never hang. After an error the state refuses further work. Mismatched configurations
(format, algorithm, ..., world size) are detected when the state is created, and mismatched
layers (names, shapes) at the first exchange, by an ``all_gather_object`` of the configuration:
every rank raises a ValueError naming the fields and each rank's value.

Reference: Han, Demmel, Si, You, "Auto-Precision Scaling for Distributed Deep Learning" (APS,
and its CPD system, which communicates gradients in arbitrary low-precision formats): Algorithm
1 (per-layer exponent, allreduce-MAX, scale, low-precision allreduce, unscale), the ring and
hierarchical allreduce, Kahan summation and the FP32 last layer. Reading implemented where the
paper is silent: the exponent is exchanged as an int32 allreduce-MAX (the paper's FINDMAXEXP of
``grad * world_size``), the low-precision sum is rounded at every hop as the emulator specifies,
and a Kahan compensation travels with the partial sum it belongs to.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import queue
import threading

import torch
import torch.distributed as dist

from .collectives import _Acc, chunk_bounds
from .formats import FP32, FloatFormat
from .ops import cast, decode, encode
from .rounding import Rounding

__all__ = ["APSHookState", "aps_hook", "CommunicationError", "StepReport", "pack_codes", "unpack_codes",
           "ALGORITHMS", "float32_ring_bytes"]

#: The reduction algorithms of the real path.
ALGORITHMS = ("ring", "hierarchical", "one_rounding")
_SCALINGS = ("aps", "loss", None)
_AUTO = object()  # APSHookState's scaling default: "aps" with fmt=, None with compressor=

# Per-layer int32 codes of the exponent exchange, combined with MAX: inf/NaN anywhere wins, then
# the largest real exponent, then "all zero", then "no gradient on any rank".
_NONE = -(2**31) + 1
_ZERO = -(2**31) + 2
_NONFINITE = 2**31 - 1


class CommunicationError(RuntimeError):
    """A peer raised, died or timed out during a cpd.distributed exchange."""


# --------------------------------------------------------------------------------------- wire codes
def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes of ``bits`` bits (1..8) into a uint8 byte stream, ``ceil(n * bits / 8)`` bytes.

    Code i occupies bits ``[i*bits, (i+1)*bits)`` of the little-endian bit stream (code 0 in the low
    bits of byte 0; for 4-bit codes byte j = ``codes[2j] | codes[2j+1] << 4``). ``bits=8`` returns
    the codes as uint8. Vectorized; the input is not modified.
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")
    if not isinstance(codes, torch.Tensor) or codes.dtype not in (torch.uint8, torch.int16, torch.int32, torch.int64):
        raise TypeError(f"codes must be an integer tensor, got {getattr(codes, 'dtype', type(codes).__name__)}")
    c = codes.reshape(-1)
    if bits == 8:
        return c.to(torch.uint8)
    if bits == 4:  # fast path: two codes per byte
        c = c.to(torch.uint8)
        if c.numel() % 2:
            c = torch.cat([c, c.new_zeros(1)])
        return c[0::2] | (c[1::2] << 4)
    n = c.numel()
    shifts = torch.arange(bits, device=c.device, dtype=torch.int64)
    stream = ((c.to(torch.int64).unsqueeze(1) >> shifts) & 1).reshape(-1)  # bit k of code i at i*bits + k
    pad = (-stream.numel()) % 8
    if pad:
        stream = torch.cat([stream, stream.new_zeros(pad)])
    weights = torch.tensor([1 << k for k in range(8)], device=c.device, dtype=torch.int64)
    return (stream.reshape(-1, 8) * weights).sum(1).to(torch.uint8) if n else c.new_zeros(0, dtype=torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The ``n`` uint8 codes of ``bits`` bits packed by :func:`pack_codes`."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got {getattr(packed, 'dtype', type(packed).__name__)}")
    need = _packed_nbytes(n, bits)
    if packed.numel() != need:
        raise ValueError(f"packed has {packed.numel()} bytes; {n} codes of {bits} bits need {need}")
    if bits == 8:
        return packed.reshape(-1).clone()
    if bits == 4:
        p = packed.reshape(-1)
        return torch.stack([p & 15, p >> 4], 1).reshape(-1)[:n].contiguous()
    shifts = torch.arange(8, device=packed.device, dtype=torch.int64)
    stream = ((packed.to(torch.int64).unsqueeze(1) >> shifts) & 1).reshape(-1)[:n * bits]
    weights = torch.tensor([1 << k for k in range(bits)], device=packed.device, dtype=torch.int64)
    return (stream.reshape(n, bits) * weights).sum(1).to(torch.uint8)


def _packed_nbytes(n: int, bits: int) -> int:
    return (n * bits + 7) // 8


class _Wire:
    """How values of one format travel: encoded codes (packed below 8 bits), raw float32 for FP32."""

    def __init__(self, fmt: FloatFormat):
        self.fmt = fmt
        self.raw32 = fmt == FP32
        self.bits = fmt.bits

    def nbytes(self, n: int) -> int:
        if self.raw32:
            return 4 * n
        if self.bits <= 8:
            return _packed_nbytes(n, self.bits)
        return n * (2 if self.bits <= 16 else 4)

    def to_bytes(self, v: torch.Tensor) -> torch.Tensor:
        """Bytes of values already in the format (exact: decode(encode(v)) == v)."""
        if self.raw32:
            return v.contiguous().view(torch.uint8)
        if not self.fmt.has_nan and bool(torch.isnan(v).any()):
            # Only after an overflow (an already non-finite step, skipped by every rank): the
            # format has no NaN code, so NaN travels as +inf (still non-finite).
            v = torch.where(torch.isnan(v), torch.full_like(v, math.inf), v)
        codes = encode(v, self.fmt)
        if self.bits <= 8:
            return pack_codes(codes, self.bits)
        return codes.contiguous().view(torch.uint8)

    def from_bytes(self, b: torch.Tensor, n: int) -> torch.Tensor:
        if self.raw32:
            return b.clone().view(torch.float32)  # clone: a slice may start at any byte
        if self.bits <= 8:
            return decode(unpack_codes(b, self.bits, n), self.fmt)
        return decode(b.clone().view(torch.int16 if self.bits <= 16 else torch.int32), self.fmt)


def float32_ring_bytes(numels, world: int, rank: int = 0, itemsize: int = 4) -> int:
    """Bytes rank ``rank`` sends in a ring allreduce of layers of ``numels`` elements of
    ``itemsize`` bytes (float32: 4), each layer chunked into ``world`` chunks (numpy.array_split).

    In the reduce-scatter rank r sends every chunk but ``(r+1) % W``, in the allgather every chunk
    but ``(r+2) % W``; summed over the ranks this is ``2 (W-1) n`` values. The baseline of
    :attr:`StepReport.ratio`, and the model of the exponent exchange (int32: same size).
    """
    if world == 1:
        return 0
    total = 0
    for n in numels:
        b = chunk_bounds(n, world)
        size = lambda c: b[c % world][1] - b[c % world][0]  # noqa: E731
        total += 2 * n - size(rank + 1) - size(rank + 2)
    return itemsize * total


# --------------------------------------------------------------------------------------- reports
@dataclasses.dataclass
class StepReport:
    """What one rank sent and decided in one step (all buckets of a DDP step, or one optimizer step)."""

    #: Step index (0-based: steps seen by the state before this one).
    step: int = 0
    #: World size W and this rank's index in the process group.
    world: int = 1
    rank: int = 0
    algorithm: str = "ring"
    fmt: str = ""
    #: Bytes this rank sent / received, everything included (codes, Kahan compensations, float32
    #: layers, the exponent exchange); the exponent exchange is counted as a ring allreduce of its
    #: int32 values.
    bytes_sent: int = 0
    bytes_received: int = 0
    #: Part of ``bytes_sent`` spent on the exponent exchange (with a compressor: the exchange of
    #: the per-layer "present / inf-NaN" flags, one int32 per layer, the same size).
    exponent_bytes: int = 0
    #: Part of ``bytes_sent`` spent on the lengths (int32) of data-dependent compressor payload
    #: parts, sent before the payloads (threshold and adaptive index lists); 0 without a compressor.
    length_bytes: int = 0
    #: What this rank would send in a float32 ring allreduce of the same layers.
    float32_bytes: int = 0
    #: Buckets (DDP) or 1 (optimizer).
    buckets: int = 0
    #: Whether any layer had inf/NaN gradients on any rank or a non-finite sum (same on every rank).
    found_inf: bool = False
    #: Per layer: ``"lowp"``, ``"fp32"``, ``"zero"``, ``"nonfinite"`` or ``"skipped"``.
    status: dict = dataclasses.field(default_factory=dict)
    #: Per layer: the power-of-two scale exponent s (None: no scaling applied).
    scale_exp: dict = dataclasses.field(default_factory=dict)
    #: With ``roundoff=True``: the per-layer round-off :class:`cpd.RoundoffReport` of the step (the
    #: emulator's report, computed from an extra float32 all_gather of the gradients; its bytes are
    #: in :attr:`diagnostic_bytes`, not in :attr:`bytes_sent`). None otherwise.
    roundoff: object = None
    #: Bytes this rank sent for the optional round-off report.
    diagnostic_bytes: int = 0

    @property
    def payload_bytes(self) -> int:
        """``bytes_sent`` without the exponent (flag) exchange and the payload lengths: with a
        compressor, summed over the ranks, the emulator's ``CompressionReport.bytes``."""
        return self.bytes_sent - self.exponent_bytes - self.length_bytes

    @property
    def ratio(self) -> float:
        """``bytes_sent / float32_bytes`` (nan when there is no float32 baseline, W = 1)."""
        return self.bytes_sent / self.float32_bytes if self.float32_bytes else math.nan

    def __str__(self) -> str:
        return (f"step {self.step}: rank {self.rank}/{self.world} {self.algorithm} {self.fmt}: sent "
                f"{self.bytes_sent} B (exponents {self.exponent_bytes} B"
                + (f", payload lengths {self.length_bytes} B" if self.length_bytes else "")
                + f"), received {self.bytes_received} B, "
                f"float32 ring would send {self.float32_bytes} B, ratio {self.ratio:.4f}; "
                f"{len(self.status)} layers in {self.buckets} bucket(s)" + (", inf/NaN found" if self.found_inf else ""))


# --------------------------------------------------------------------------------------- engine
@dataclasses.dataclass(frozen=True)
class _Config:
    fmt: FloatFormat
    algorithm: str
    group_size: int | None
    kahan: bool
    rounding: Rounding
    saturate: bool
    scaling: str | None
    margin: int
    fp32_layers: tuple
    hybrid_steps: int
    #: A :class:`cpd.compressors.Compressor` (then fmt is FP32, for the float32 layers only).
    compressor: object = None


def _check_config(fmt, algorithm, group_size, kahan, rounding, saturate, scaling, margin, fp32_layers,
                  hybrid_steps) -> _Config:
    try:
        fmt = FloatFormat.parse(fmt)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"fmt: {exc}") from None
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is unknown; allowed: {', '.join(map(repr, ALGORITHMS))}")
    if algorithm == "hierarchical":
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"algorithm='hierarchical' needs group_size, an int >= 1, got {group_size!r}")
    elif group_size is not None:
        raise ValueError(f"group_size only applies to algorithm='hierarchical', got algorithm={algorithm!r}")
    for name, v in (("kahan", kahan), ("saturate", saturate)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    if kahan and algorithm == "one_rounding":
        raise ValueError("kahan=True applies to algorithm='ring' or 'hierarchical'; 'one_rounding' sums in float32")
    mode = Rounding.parse(rounding)
    if mode is Rounding.STOCHASTIC:
        raise ValueError("rounding='stochastic' is not supported across processes (its random bits are drawn "
                         "per emulator call); allowed: 'nearest', 'toward_zero', 'up', 'down'")
    if scaling not in _SCALINGS:
        raise ValueError(f"scaling must be 'aps', 'loss' or None, got {scaling!r}")
    if isinstance(margin, bool) or not isinstance(margin, int):
        raise TypeError(f"margin must be an int, got {type(margin).__name__}")
    if isinstance(fp32_layers, str):
        fp32_layers = (fp32_layers,)
    fp32_layers = tuple(fp32_layers)
    for p in fp32_layers:
        if not isinstance(p, str):
            raise TypeError(f"fp32_layers must be parameter-name prefixes (str), got {p!r}")
    if isinstance(hybrid_steps, bool) or not isinstance(hybrid_steps, int) or hybrid_steps < 0:
        raise ValueError(f"hybrid_steps must be an int >= 0, got {hybrid_steps!r}")
    return _Config(fmt, algorithm, group_size, kahan, mode, saturate, scaling, margin, fp32_layers, hybrid_steps)


def _check_compressor_config(compressor, algorithm, fp32_layers, hybrid_steps, fmt_options: dict) -> _Config:
    """The configuration of compressed communication; ``fmt_options`` maps each option of the fmt
    path to ``(value given, its default)``: anything but the default is an error."""
    from .compressors import ALGORITHMS as COMPRESSED, get

    given = [n for n, (v, d) in fmt_options.items() if v != d]
    if given:
        raise ValueError(f"{', '.join(given)}: apply to fmt= communication, not to compressor= (the compressor "
                         "defines the wire format and the sums are float32); leave them at their defaults")
    comp = get(compressor)
    if not isinstance(algorithm, str) or algorithm not in COMPRESSED:
        raise ValueError(f"with compressor=, algorithm must be one of {', '.join(map(repr, COMPRESSED))} (the orders "
                         f"of cpd.compressors.compressed_allreduce), got {algorithm!r}")
    if getattr(comp, "sample", None) is not None or getattr(comp, "rounding", None) is Rounding.STOCHASTIC:
        raise ValueError(f"compressor={comp!r} draws random numbers from one generator shared by the emulated "
                         "workers, which W processes cannot reproduce; across processes use a deterministic "
                         "compressor (sample=None, rounding other than 'stochastic')")
    cfg = _check_config(FP32, "ring", None, False, "nearest", False, None, 0, fp32_layers, hybrid_steps)
    return dataclasses.replace(cfg, algorithm=algorithm, compressor=comp)


def _describe(comp) -> str | None:
    """A compressor's class and scalar settings: what must agree across ranks."""
    if comp is None:
        return None
    import enum

    attrs = []
    for k, v in sorted(vars(comp).items()):
        if isinstance(v, (enum.Enum)):
            v = v.value
        elif isinstance(v, FloatFormat):
            v = v.name
        if v is None or isinstance(v, (bool, int, float, str)):
            attrs.append(f"{k}={v!r}")
    return f"{type(comp).__name__}({', '.join(attrs)})"


def _match(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _timedelta(timeout) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or a timedelta, got {timeout!r}")
    return datetime.timedelta(seconds=float(timeout))


class _Stream:
    """The layers of one wire format in one exchange: flat local values, optional Kahan
    compensations, and each chunk's element indices (layer by layer, numpy.array_split)."""

    def __init__(self, fmt: FloatFormat, sizes: list[int], values: torch.Tensor, parts: int):
        self.wire = _Wire(fmt)
        self.fmt = fmt
        self.n = values.numel()
        self.x = values
        self.c = None
        self.idx = _chunk_indices(tuple(sizes), parts)


@functools.lru_cache(maxsize=256)
def _chunk_indices(sizes: tuple, parts: int) -> list[torch.Tensor]:
    """Element indices of chunk c (0..parts-1) of a flat vector of layers of ``sizes``: chunk c
    of every layer (numpy.array_split), layer after layer. Cached: DDP's buckets repeat."""
    idx = [[] for _ in range(parts)]
    off = 0
    for n in sizes:
        for c, (a, b) in enumerate(chunk_bounds(n, parts)):
            if b > a:
                idx[c].append(torch.arange(off + a, off + b))
        off += n
    empty = torch.zeros(0, dtype=torch.long)
    return [torch.cat(i) if i else empty for i in idx]


class _Engine:
    """One low-precision reducer over a process group; used by the hook state and APSOptimizer."""

    def __init__(self, cfg: _Config, process_group=None, timeout=120.0):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call dist.init_process_group(...) first")
        self.cfg = cfg
        self.timeout = _timedelta(timeout)
        pg = process_group if process_group is not None else dist.group.WORLD
        self.ranks = list(dist.get_process_group_ranks(pg))
        self.rank = dist.get_rank()
        if sorted(self.ranks) != list(range(dist.get_world_size())):
            # Creating the state's own groups is collective over the default group; a strict
            # subgroup would need every non-member to join that call (not supported yet).
            raise ValueError(f"process_group must hold every rank of the default group (ranks 0.."
                             f"{dist.get_world_size() - 1}), got ranks {self.ranks}")
        self.world = len(self.ranks)
        self.pos = self.ranks.index(self.rank)
        if cfg.algorithm == "hierarchical" and self.world % cfg.group_size:
            raise ValueError(f"group_size={cfg.group_size} must divide the process group's size W={self.world}")
        backend = dist.get_backend(pg)
        # Dedicated groups: our collectives never interleave with DDP's or the user's.
        self.pg = dist.new_group(ranks=self.ranks, timeout=self.timeout, backend=backend)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.check({})  # before any group that depends on the configuration is created
        self.sub = None
        if cfg.algorithm == "hierarchical" and 1 < cfg.group_size:
            k = cfg.group_size
            groups = [self.ranks[g * k:(g + 1) * k] for g in range(self.world // k)]
            self.sub, _ = dist.new_subgroups_by_enumeration(groups, timeout=self.timeout, backend=backend)
        self.checked = False
        self.error: BaseException | None = None
        self._thread = None
        self._queue: queue.Queue | None = None
        self._sent = self._recv = self._lens = 0
        #: Compressor mode: {layer name: this rank's CompressorState} (error feedback).
        self.states: dict = {}
        self._undo: dict = {}  # states changed since begin_step(): name -> (residual, steps)
        self._layouts: dict = {}

    # ---- fault handling
    def _fail(self, exc: BaseException, what: str) -> CommunicationError:
        err = exc if isinstance(exc, (CommunicationError, ValueError)) else CommunicationError(
            f"cpd.distributed: {what} failed on rank {self.rank} (W={self.world}, timeout "
            f"{self.timeout.total_seconds():g} s): {exc} (a closed connection or a timeout means that a peer "
            "process raised, died or stalled)")
        if err is not exc:
            err.__cause__ = exc
        self.error = err
        return err

    def _wait(self, works):
        for w in works:
            w.wait(self.timeout)

    # ---- async execution (hook)
    def submit(self, fn) -> torch.futures.Future:
        fut = torch.futures.Future()
        if self.error is not None:
            fut.set_exception(CommunicationError(f"cpd.distributed: an earlier exchange failed: {self.error}"))
            return fut
        if self._thread is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._loop, name="cpd-comm", daemon=True)
            self._thread.start()
        self._queue.put((fn, fut))
        return fut

    def _loop(self):
        while True:
            fn, fut = self._queue.get()
            if self.error is not None:
                fut.set_exception(CommunicationError(f"cpd.distributed: an earlier exchange failed: {self.error}"))
                continue
            try:
                res = fn()
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                fut.set_exception(exc if exc is self.error else self._fail(exc, "the gradient exchange"))
            else:
                fut.set_result(res)

    # ---- p2p helpers (bytes counted)
    def _p2p(self, send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None, src: int | None):
        ops = []
        if send is not None and send.numel():
            ops.append(dist.P2POp(dist.isend, send.to(self.device), dst, group=self.pg))
            self._sent += send.numel()
        rbuf = None
        if recv is not None and recv.numel():
            rbuf = recv.to(self.device)
            ops.append(dist.P2POp(dist.irecv, rbuf, src, group=self.pg))
            self._recv += recv.numel()
        if ops:
            self._wait(dist.batch_isend_irecv(ops))
        return torch.zeros(0, dtype=torch.uint8) if rbuf is None else rbuf.cpu()

    # ---- config check
    def check(self, extra: dict) -> None:
        mine = {"fmt": self.cfg.fmt.name, "algorithm": self.cfg.algorithm, "group_size": self.cfg.group_size,
                "kahan": self.cfg.kahan, "rounding": self.cfg.rounding.value, "saturate": self.cfg.saturate,
                "scaling": self.cfg.scaling, "margin": self.cfg.margin, "fp32_layers": self.cfg.fp32_layers,
                "hybrid_steps": self.cfg.hybrid_steps, "compressor": _describe(self.cfg.compressor),
                "world": self.world, **extra}
        every = [None] * self.world
        dist.all_gather_object(every, mine, group=self.pg)
        bad = [(r, k) for r, o in enumerate(every) for k in mine if o.get(k) != every[0].get(k)]
        if bad:
            fields = sorted({k for _, k in bad})
            desc = "; ".join(f"{k}: " + ", ".join(f"rank {self.ranks[r]}={o.get(k)!r}" for r, o in enumerate(every))
                             for k in fields)
            raise ValueError(f"cpd.distributed: the ranks' configurations differ ({desc}); every rank must use "
                             "the same format (or compressor), algorithm, group_size, kahan, rounding, scaling "
                             "and layers")
        if extra:
            self.checked = True

    # ---- the exchange
    def reduce(self, grads: list, names: list[str], shapes: list, *, step: int, scale_exp: int | None = None,
               roundoff: bool = False):
        """Sum the W ranks' ``grads`` (one tensor or None per layer, of ``shapes``) as the emulator
        would (a None gradient counts as zeros; a layer None on every rank is skipped).

        Returns ``(sums, report)``: one float32 tensor (or None) per layer and a :class:`StepReport`.
        Raises :class:`CommunicationError` when a peer fails (and for every later call), ValueError
        when the ranks' layers differ.
        """
        if self.error is not None:
            raise CommunicationError(f"cpd.distributed: an earlier exchange failed: {self.error}")
        try:
            if self.cfg.compressor is not None:
                return self._reduce_compressed(grads, names, shapes, step)
            return self._reduce(grads, names, shapes, step, scale_exp, roundoff)
        except Exception as exc:
            raise self._fail(exc, "the gradient exchange") from (None if exc is self.error else exc)

    @torch.no_grad()
    def _reduce(self, grads, names, shapes, step, scale_exp, roundoff):
        cfg, w = self.cfg, self.world
        if not self.checked:  # the first exchange also checks that the ranks reduce the same layers
            self.check({"layers": [(n, tuple(sh)) for n, sh in zip(names, shapes)]})
        self._sent = self._recv = 0
        flat = [None if g is None else g.detach().reshape(-1).to(torch.float32).cpu() for g in grads]
        # 1. Local layer codes, then one MAX exchange.
        codes = []
        for g in flat:
            m = float(g.abs().max()) if g is not None and g.numel() else 0.0  # NaN if any NaN, inf if any inf
            if g is None:
                codes.append(_NONE)
            elif not math.isfinite(m):
                codes.append(_NONFINITE)
            else:
                codes.append(_ZERO if m == 0.0 else _ceil_log2(m * w))
        ex = torch.tensor(codes, dtype=torch.int32)
        if w > 1 and len(codes):
            ex_dev = ex.to(self.device)
            dist.all_reduce(ex_dev, op=dist.ReduceOp.MAX, group=self.pg, async_op=True).wait(self.timeout)
            ex = ex_dev.cpu()
            exp_bytes = float32_ring_bytes([len(codes)], w, self.pos)  # int32: same size as float32
        else:
            exp_bytes = 0
        ex = ex.tolist()
        # 2. Per layer decision (the emulator's edge cases, in its order).
        all_fp32 = step < cfg.hybrid_steps
        rep = StepReport(step=step, world=w, rank=self.pos, algorithm=cfg.algorithm, fmt=cfg.fmt.name, buckets=1)
        low_layers, f32_layers, nonfinite = [], [], []
        scales = {}
        for i, (name, e) in enumerate(zip(names, ex)):
            if e == _NONE:
                rep.status[name], rep.scale_exp[name] = "skipped", None
                continue
            if flat[i] is None:
                flat[i] = torch.zeros(math.prod(shapes[i]), dtype=torch.float32)
            if e == _NONFINITE:
                rep.status[name], rep.scale_exp[name] = "nonfinite", None
                nonfinite.append(i)
            elif all_fp32 or any(_match(name, p) for p in cfg.fp32_layers):
                rep.status[name], rep.scale_exp[name] = "fp32", None
                f32_layers.append(i)
            elif e == _ZERO:
                rep.status[name], rep.scale_exp[name] = "zero", None
                low_layers.append(i)
                scales[i] = 0
            else:
                s = (cfg.fmt.emax - e - cfg.margin if cfg.scaling == "aps"
                     else (scale_exp or 0) if cfg.scaling == "loss" else 0)
                rep.status[name], rep.scale_exp[name] = "lowp", s
                low_layers.append(i)
                scales[i] = s
        # 3. Scale and cast (exactly as cpd.scaling._reduce_scaled).
        streams = []
        if low_layers:
            vals = []
            for i in low_layers:
                s = scales[i]
                scaled = (flat[i].double() * 2.0 ** s).to(torch.float32) if s else flat[i]
                vals.append(cast(scaled, cfg.fmt, cfg.rounding, saturate=cfg.saturate))
            streams.append((low_layers, cfg.fmt, vals))
        if f32_layers:
            streams.append((f32_layers, FP32, [flat[i] for i in f32_layers]))
        out = [None] * len(grads)
        overflow = False
        if streams:
            reduced = self._allreduce([(fmt, [v.numel() for v in vals], torch.cat(vals)) for _, fmt, vals in streams])
            for (layers, fmt, vals), red in zip(streams, reduced):
                off = 0
                for i, v in zip(layers, vals):
                    r = red[off:off + v.numel()]
                    off += v.numel()
                    s = scales.get(i, 0)
                    out[i] = (r.double() / 2.0 ** s).to(torch.float32) if s else r.clone()
                    overflow = overflow or not bool(torch.isfinite(out[i]).all())  # possible without APS
        # 4. inf/NaN layers: the float32 sum over workers (the emulator's x.sum(0)), visible, flagged.
        for i in nonfinite:
            rows = [torch.empty_like(flat[i], device=self.device) for _ in range(w)]
            if w > 1:
                dist.all_gather(rows, flat[i].to(self.device), group=self.pg, async_op=True).wait(self.timeout)
                self._sent += (w - 1) * flat[i].numel() * 4
                self._recv += (w - 1) * flat[i].numel() * 4
            else:
                rows = [flat[i]]
            out[i] = torch.stack([r.cpu() for r in rows]).sum(0)
        rep.found_inf = bool(nonfinite) or overflow
        if roundoff:
            rep.roundoff, rep.diagnostic_bytes = self._roundoff(names, flat, out, rep, scales)
        rep.bytes_sent = self._sent + exp_bytes
        rep.bytes_received = self._recv + exp_bytes
        rep.exponent_bytes = exp_bytes
        rep.float32_bytes = float32_ring_bytes([f.numel() for f in flat if f is not None], w, self.pos)
        return [None if o is None else o.reshape(sh) for o, sh in zip(out, shapes)], rep

    def _roundoff(self, names, flat, out, rep, scales):
        """The emulator's per-layer report rows (cpd.report.layer_stats) from every rank's float32
        gradients (one all_gather, off the hot path)."""
        from .report import RoundoffReport, layer_stats

        w, cfg = self.world, self.cfg
        present = [i for i, f in enumerate(flat) if f is not None]
        mine = torch.cat([flat[i] for i in present]) if present else torch.zeros(0)
        rows = [torch.empty_like(mine, device=self.device) for _ in range(w)]
        if w > 1 and mine.numel():
            dist.all_gather(rows, mine.to(self.device), group=self.pg, async_op=True).wait(self.timeout)
        else:
            rows = [mine]
        every = torch.stack([r.cpu() for r in rows])
        layers, off = {}, 0
        for i, name in enumerate(names):
            status = rep.status[name]
            if flat[i] is None:
                layers[name] = layer_stats(name, "skipped", torch.zeros(max(w, 1), 0), torch.zeros(0), cfg.fmt)
                continue
            n = flat[i].numel()
            x, off = every[:, off:off + n], off + n
            res = out[i].reshape(-1)
            if status in ("nonfinite", "fp32"):
                layers[name] = layer_stats(name, status, x, res, cfg.fmt)
            elif status == "zero":
                layers[name] = layer_stats(name, "zero", x, res, cfg.fmt, None, x, res.new_zeros(x.shape))
            else:
                s = scales[i]
                scaled = (x.double() * 2.0 ** s).to(torch.float32)
                low = cast(scaled, cfg.fmt, cfg.rounding, saturate=cfg.saturate)
                layers[name] = layer_stats(name, "lowp", x, res, cfg.fmt, s, scaled, low)
        method = {"aps": "aps", "loss": "loss-scaled"}.get(cfg.scaling, "unscaled")
        report = RoundoffReport(layers, cfg.fmt, cfg.algorithm, w, method, cfg.group_size)
        return report, (w - 1) * mine.numel() * 4

    # ---- compressed communication (cpd.compressors)
    def begin_step(self) -> None:
        """Start a step: forget the error-feedback states saved for :meth:`rollback`."""
        self._undo = {}

    def rollback(self) -> None:
        """Restore the error-feedback states changed since :meth:`begin_step` (a skipped step
        leaves them untouched, as the emulator's ``reduce_layers`` does)."""
        for name, (residual, steps) in self._undo.items():
            st = self.states[name]
            st.residual, st.steps = residual, steps
        self._undo = {}

    @torch.no_grad()
    def _reduce_compressed(self, grads, names, shapes, step):
        """The emulator's ``cpd.compressors.reduce_layers`` across processes (this rank = worker
        ``self.pos``): flags exchange, then every compressed layer in the order of
        :mod:`cpd.compressors.reduce`, all layers of one hop in one message."""
        from .compressors import CompressorState
        from .compressors.reduce import _chunks

        cfg, w, comp = self.cfg, self.world, self.cfg.compressor
        if not self.checked:
            self.check({"layers": [(n, tuple(sh)) for n, sh in zip(names, shapes)]})
        self._sent = self._recv = self._lens = 0
        flat = [None if g is None else g.detach().to(torch.float32).cpu().reshape(tuple(sh))
                for g, sh in zip(grads, shapes)]
        all_fp32 = step < cfg.hybrid_steps
        fp32 = [all_fp32 or any(_match(n, p) for p in cfg.fp32_layers) for n in names]
        # 1. Per layer: error-feedback value v = g + residual (not committed yet), and one MAX
        #    exchange of _NONE (no gradient) < 0 (finite) < 1 (v overflows float32) < _NONFINITE.
        values, codes = {}, []
        for i, (name, g) in enumerate(zip(names, flat)):
            if g is None:
                codes.append(_NONE)
            elif g.numel() and not bool(torch.isfinite(g).all()):
                codes.append(_NONFINITE)
            else:
                codes.append(0)
                if not fp32[i]:
                    values[i] = self._value(name, g)
                    codes[-1] = int(not bool(torch.isfinite(values[i][1]).all()))
        ex = torch.tensor(codes, dtype=torch.int32)
        if w > 1 and len(codes):
            ex_dev = ex.to(self.device)
            dist.all_reduce(ex_dev, op=dist.ReduceOp.MAX, group=self.pg, async_op=True).wait(self.timeout)
            ex = ex_dev.cpu()
            flag_bytes = float32_ring_bytes([len(codes)], w, self.pos)
        else:
            flag_bytes = 0
        ex = ex.tolist()
        # 2. Per layer decision (reduce_layers: any inf/NaN anywhere -> every layer in float32).
        found_inf = _NONFINITE in ex
        rep = StepReport(step=step, world=w, rank=self.pos, algorithm=cfg.algorithm, fmt=comp.name, buckets=1,
                         found_inf=found_inf)
        low, f32, overflow = [], [], []
        for i, (name, e) in enumerate(zip(names, ex)):
            if e == _NONE:
                rep.status[name], rep.scale_exp[name] = "skipped", None
                continue
            rep.scale_exp[name] = None
            if flat[i] is None:  # no gradient here, one elsewhere: zeros (the emulator's zeros_like)
                flat[i] = torch.zeros(tuple(shapes[i]), dtype=torch.float32)
                if not fp32[i]:
                    values[i] = self._value(name, flat[i])
            if found_inf or fp32[i]:
                rep.status[name] = "nonfinite" if found_inf else "fp32"
                f32.append(i)
            else:
                rep.status[name] = "compressed"
                low.append(i)
                if e == 1:
                    overflow.append(name)
        if overflow:
            raise ValueError(f"layers {overflow}: gradient + error-feedback residual is inf on some rank, which the "
                             f"{comp.name} compressor cannot encode (the emulator raises too)")
        out = [None] * len(grads)
        # 3. float32 layers: allreduce(..., FP32, algorithm="ring" | "sequential"), as reduce_layers.
        if f32:
            st = _Stream(FP32, [flat[i].numel() for i in f32], torch.cat([flat[i].reshape(-1) for i in f32]), w)
            red = (self._ring([st], self.ranks, self.pos, carry_c=False) if cfg.algorithm == "ring"
                   else self._one_rounding([st]))[0]
            off = 0
            for i in f32:
                n = flat[i].numel()
                out[i] = red[off:off + n].reshape(tuple(shapes[i])).clone()
                off += n
        # 4. Compressed layers: quantize once (commit the error feedback), then reduce.
        items = []
        for i in low:
            v64, v = values[i]
            chunks, join = _chunks(comp, v, w)
            pays = [comp._encode(c.contiguous()) if c.numel() else None for c in chunks]
            dec = [comp._decode(p) if p is not None else c.clone() for p, c in zip(pays, chunks)]
            q = join(dec)
            if v64 is not None:
                st = self.states.setdefault(names[i], CompressorState())
                self._undo.setdefault(names[i], (st.residual, st.steps))
                st.update(v64, q)
            items.append((i, pays, _chunks(comp, q, w)[0], join))
        if items:
            for (i, _, _, join), chunks in zip(items, self._compressed_allreduce(items)):
                out[i] = join(chunks).reshape(tuple(shapes[i]))
        rep.length_bytes = self._lens
        rep.bytes_sent = self._sent + flag_bytes
        rep.bytes_received = self._recv + flag_bytes
        rep.exponent_bytes = flag_bytes
        rep.float32_bytes = float32_ring_bytes([f.numel() for f in flat if f is not None], w, self.pos)
        return out, rep

    def _value(self, name: str, g: torch.Tensor):
        """(v64, v): ``g + residual`` in float64 (None without error feedback) and as encoded (float32)."""
        comp = self.cfg.compressor
        if not comp.error_feedback:
            return None, g
        st = self.states.get(name)
        v64 = st.accumulate(g) if st is not None else g.to(torch.float64)
        return v64, v64.to(torch.float32)

    def _compressed_allreduce(self, items):
        """items: per layer (index, this rank's W chunk payloads, its W decoded chunks, join).
        Returns per layer the W reduced chunks (identical on every rank)."""
        comp, w, pos = self.cfg.compressor, self.world, self.pos
        if w == 1:
            return [list(qs) for _, _, qs, _ in items]
        nxt, prv = self.ranks[(pos + 1) % w], self.ranks[(pos - 1) % w]

        def live(c):  # layers whose chunk c is not empty (nothing is sent for an empty chunk)
            return [k for k, (_, _, qs, _) in enumerate(items) if qs[c].numel()]

        def shape(k, c):
            return items[k][2][c].shape

        cur = {}  # layer -> the payload this rank holds for the chunk it sends next
        if self.cfg.algorithm == "ring":
            # Reduce-scatter: chunk c starts at worker c; hop h is done by worker (c + h) % W, which
            # decodes the partial sum, adds its own quantized chunk (float32) and re-encodes.
            for k in live(pos):
                cur[k] = items[k][1][pos]
            for h in range(1, w):
                cs, cr = (pos - h + 1) % w, (pos - h) % w
                got = self._exchange([(nxt, [cur[k] for k in live(cs)])], [(prv, [shape(k, cr) for k in live(cr)])])[0]
                cur = {k: comp._encode(comp._decode(p) + items[k][2][cr]) for k, p in zip(live(cr), got)}
            own = (pos + 1) % w
        else:
            # Pairwise exchange: every worker sends its payload of chunk c to worker c, which sums the
            # W decoded chunks in worker order (float32) and encodes the result.
            sends = [(self.ranks[c], [items[k][1][c] for k in live(c)]) for c in range(w) if c != pos]
            srcs = [r for r in range(w) if r != pos]
            got = self._exchange(sends, [(self.ranks[r], [shape(k, pos) for k in live(pos)]) for r in srcs])
            rows = dict(zip(srcs, got))
            for j, k in enumerate(live(pos)):
                terms = [items[k][2][pos] if r == pos else comp._decode(rows[r][j]) for r in range(w)]
                s = terms[0].clone()
                for t in terms[1:]:
                    s = s + t
                cur[k] = comp._encode(s)
            own = pos
        # Allgather along the ring: the owner's final payload reaches the W-1 others; every worker
        # (the owner too) decodes it.
        final = [dict() for _ in items]
        for k, p in cur.items():
            final[k][own] = p
        have = own
        for _ in range(1, w):
            cr = (have - 1) % w
            got = self._exchange([(nxt, [final[k][have] for k in live(have)])],
                                 [(prv, [shape(k, cr) for k in live(cr)])])[0]
            for k, p in zip(live(cr), got):
                final[k][cr] = p
            have = cr
        return [[comp._decode(final[k][c]) if c in final[k] else qs[c] for c in range(w)]
                for k, (_, _, qs, _) in enumerate(items)]

    def _layout(self, shape) -> tuple:
        key = tuple(shape)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layouts[key] = tuple(self.cfg.compressor.wire_layout(torch.Size(key)))
        return lay

    def _exchange(self, sends, recvs):
        """Send payloads and receive payloads of known shapes, point to point, in one batch per phase.

        ``sends``: [(dst rank, [Payload])]; ``recvs``: [(src rank, [chunk shape])]. Each message is
        the concatenation of its payloads' parts in :meth:`Compressor.wire_layout` order; the sizes
        of data-dependent parts travel first, as int32, in a message of their own (counted in
        ``length_bytes``). Returns, per ``recvs`` entry, the list of received Payloads.
        """
        from .compressors import Payload

        comp = self.cfg.compressor
        out_lens, out_bytes = [], []
        for dst, pays in sends:
            lens, parts = [], []
            for p in pays:
                lay = self._layout(p.shape)
                if set(p.parts) != {n for n, _ in lay}:
                    raise RuntimeError(f"compressor {comp.name}: payload parts {sorted(p.parts)} differ from its "
                                       f"wire_layout {[n for n, _ in lay]}")
                for name, size in lay:
                    t = p.parts[name].reshape(-1)
                    if size is None:
                        lens.append(t.numel())
                    elif t.numel() != size:
                        raise RuntimeError(f"compressor {comp.name}: part {name!r} of a {tuple(p.shape)} payload has "
                                           f"{t.numel()} bytes; its wire_layout says {size}")
                    parts.append(t)
            out_lens.append(torch.tensor(lens, dtype=torch.int32).view(torch.uint8))
            out_bytes.append(torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8))
        layouts = [[self._layout(sh) for sh in shapes] for _, shapes in recvs]
        ndyn = [sum(size is None for lay in lays for _, size in lay) for lays in layouts]
        if any(lens.numel() for lens in out_lens) or any(ndyn):
            before = self._sent
            got = self._p2p_many([(t, dst) for t, (dst, _) in zip(out_lens, sends)],
                                 [(4 * n, src) for n, (src, _) in zip(ndyn, recvs)])
            self._lens += self._sent - before
            in_lens = [g.view(torch.int32).tolist() if g.numel() else [] for g in got]
        else:
            in_lens = [[] for _ in recvs]
        sizes = []
        for lays, lens in zip(layouts, in_lens):
            it = iter(lens)
            sizes.append([[size if size is not None else next(it) for _, size in lay] for lay in lays])
        got = self._p2p_many([(t, dst) for t, (dst, _) in zip(out_bytes, sends)],
                             [(sum(map(sum, sz)), src) for sz, (src, _) in zip(sizes, recvs)])
        result = []
        for buf, (_, shapes), lays, sz in zip(got, recvs, layouts, sizes):
            off, pays = 0, []
            for sh, lay, ps in zip(shapes, lays, sz):
                parts = {}
                for (name, _), n in zip(lay, ps):
                    parts[name] = buf[off:off + n].clone()  # clone: a part may start at any byte
                    off += n
                pays.append(Payload(comp.name, torch.Size(sh), parts))
            result.append(pays)
        return result

    def _p2p_many(self, sends, recvs):
        """One ``batch_isend_irecv`` of uint8 messages: sends [(tensor, dst)], recvs [(nbytes, src)];
        returns the received tensors (bytes counted; empty messages are not sent)."""
        ops, bufs = [], []
        for t, dst in sends:
            if t.numel():
                ops.append(dist.P2POp(dist.isend, t.to(self.device), dst, group=self.pg))
                self._sent += t.numel()
        for n, src in recvs:
            buf = torch.empty(n, dtype=torch.uint8, device=self.device)
            bufs.append(buf)
            if n:
                ops.append(dist.P2POp(dist.irecv, buf, src, group=self.pg))
                self._recv += n
        if ops:
            self._wait(dist.batch_isend_irecv(ops))
        return [b.cpu() for b in bufs]

    def _allreduce(self, specs):
        """specs: [(fmt, layer sizes, flat values already in fmt)]; returns the reduced flat vectors."""
        alg = self.cfg.algorithm
        if alg == "hierarchical":
            return self._hierarchical(specs)
        streams = [_Stream(f, sizes, v, self.world) for f, sizes, v in specs]
        if alg == "ring":
            return self._ring(streams, self.ranks, self.pos, carry_c=False)
        return self._one_rounding(streams)

    def _acc(self, fmt: FloatFormat) -> _Acc:
        return _Acc(self.cfg.kahan, fmt, self.cfg.rounding, self.cfg.saturate, None)

    def _encode(self, streams, with_c: bool) -> torch.Tensor:
        """One hop's message: every stream's travelling partial sums (and compensations), as bytes."""
        parts = []
        for st in streams:
            parts.append(st.wire.to_bytes(st.acc_s))
            if with_c:
                parts.append(st.wire.to_bytes(st.acc_c))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)

    def _nbytes(self, streams, chunk: int, with_c: bool) -> int:
        return sum(st.wire.nbytes(st.idx[chunk].numel()) * (2 if with_c else 1) for st in streams)

    def _decode(self, streams, buf: torch.Tensor, chunk: int, with_c: bool):
        off, res = 0, []
        for st in streams:
            k = st.idx[chunk].numel()
            nb = st.wire.nbytes(k)
            s = st.wire.from_bytes(buf[off:off + nb], k)
            off += nb
            c = None
            if with_c:
                c = st.wire.from_bytes(buf[off:off + nb], k)
                off += nb
            res.append((s, c))
        return res

    def _ring(self, streams, members, pos, carry_c):
        """Ring reduce-scatter + allgather among ``members`` (global ranks; this rank at ``pos``),
        every hop one fused merge per stream (the emulator's cpd.collectives._ring, distributed).
        ``carry_c``: the local values come with Kahan compensations (hierarchical leaders)."""
        p = len(members)
        if p == 1:
            return [st.x.clone() for st in streams]
        nxt, prv = members[(pos + 1) % p], members[(pos - 1) % p]
        kahan = self.cfg.kahan
        for st in streams:  # hop 0: this rank's own chunk starts the accumulation of chunk `pos`
            st.acc_s = st.x[st.idx[pos]]
            st.acc_c = (st.c[st.idx[pos]] if carry_c else None) if kahan else None
            st.acc = self._acc(st.fmt)
        for h in range(1, p):
            cr = (pos - h) % p  # receive chunk cr; send the partial sum of chunk (pos - h + 1) % p
            with_c = kahan and (carry_c or h > 1)
            send = self._encode(streams, with_c)
            buf = torch.empty(self._nbytes(streams, cr, with_c), dtype=torch.uint8)
            buf = self._p2p(send, nxt, buf, prv)
            for st, (s_in, c_in) in zip(streams, self._decode(streams, buf, cr, with_c)):
                if kahan and c_in is None:
                    c_in = torch.zeros_like(s_in)
                x = st.x[st.idx[cr]]
                cx = st.c[st.idx[cr]] if (kahan and carry_c) else None
                st.acc_s, st.acc_c = st.acc.merge(s_in, c_in, x, cx)
        return self._allgather(streams, [st.acc_s for st in streams], members, pos, (pos + 1) % p)

    def _allgather(self, streams, owned, members, pos, own):
        """Ring allgather: this rank holds chunk ``own`` (values ``owned`` per stream) and passes the
        most recently completed chunk on, W-1 times; returns every stream's full vector."""
        p = len(members)
        nxt, prv = members[(pos + 1) % p], members[(pos - 1) % p]
        results = []
        for st, v in zip(streams, owned):
            r = torch.empty(st.n, dtype=torch.float32)
            r[st.idx[own]] = v
            results.append(r)
        have = own
        for _ in range(1, p):
            cr = (have - 1) % p
            send = torch.cat([st.wire.to_bytes(r[st.idx[have]]) for st, r in zip(streams, results)])
            buf = self._p2p(send, nxt, torch.empty(self._nbytes(streams, cr, False), dtype=torch.uint8), prv)
            for (s_in, _), st, r in zip(self._decode(streams, buf, cr, False), streams, results):
                r[st.idx[cr]] = s_in
            have = cr
        return results

    def _hierarchical(self, specs):
        k = self.cfg.group_size
        g, j = divmod(self.pos, k)
        leader = self.ranks[g * k]
        wires = [_Wire(f) for f, _, _ in specs]
        # 1. Gather the group's values at its first rank; it sums them in worker order.
        sums = [v for _, _, v in specs]
        comps = [torch.zeros_like(v) if self.cfg.kahan else None for v in sums]  # k = 1: the +0 compensation
        if k > 1:
            msg = torch.cat([wi.to_bytes(v) for wi, (_, _, v) in zip(wires, specs)])
            gl = [torch.empty_like(msg, device=self.device) for _ in range(k)] if j == 0 else None
            dist.gather(msg.to(self.device), gl, dst=leader, group=self.sub, async_op=True).wait(self.timeout)
            if j == 0:
                self._recv += (k - 1) * msg.numel()
                rows = []
                for t in gl:
                    t, off, vals = t.cpu(), 0, []
                    for wi, (_, _, v) in zip(wires, specs):
                        nb = wi.nbytes(v.numel())
                        vals.append(wi.from_bytes(t[off:off + nb], v.numel()))
                        off += nb
                    rows.append(vals)
                sums, comps = [], []
                for si, (f, _, v) in enumerate(specs):
                    acc = self._acc(f)
                    s = v.clone()  # the leader's own values: row 0
                    c = torch.zeros_like(s) if self.cfg.kahan else None
                    for r in range(1, k):
                        s, c = acc.merge(s, c, rows[r][si])
                    sums.append(s)
                    comps.append(c)
            else:
                self._sent += msg.numel()
        # 2. Ring across the group leaders; 3. broadcast to the group.
        if j == 0:
            G = self.world // k
            streams = []
            for (f, sizes, _), s, c in zip(specs, sums, comps):
                st = _Stream(f, sizes, s, G)
                st.c = c
                streams.append(st)
            res = self._ring(streams, self.ranks[::k], g, carry_c=self.cfg.kahan)
        if k > 1:
            total = sum(wi.nbytes(v.numel()) for wi, (_, _, v) in zip(wires, specs))
            msg = (torch.cat([wi.to_bytes(r) for wi, r in zip(wires, res)]) if j == 0
                   else torch.empty(total, dtype=torch.uint8))
            msg = msg.to(self.device)
            dist.broadcast(msg, src=leader, group=self.sub, async_op=True).wait(self.timeout)
            if j == 0:
                self._sent += (k - 1) * total
            else:
                self._recv += total
                msg, off, res = msg.cpu(), 0, []
                for wi, (_, _, v) in zip(wires, specs):
                    nb = wi.nbytes(v.numel())
                    res.append(wi.from_bytes(msg[off:off + nb], v.numel()))
                    off += nb
        return res

    def _one_rounding(self, streams):
        """all_to_all of the codes; each rank sums its chunk in float32 in worker order; the float32
        chunks are allgathered (ring). gloo implements ``all_to_all_single`` (uneven splits)."""
        w, pos = self.world, self.pos
        if w == 1:
            return [st.x.clone() for st in streams]
        send_parts, in_splits, out_splits = [], [], []
        for c in range(w):
            part = torch.cat([st.wire.to_bytes(st.x[st.idx[c]]) for st in streams])
            send_parts.append(part)
            in_splits.append(part.numel())
        my = sum(st.wire.nbytes(st.idx[pos].numel()) for st in streams)
        out_splits = [my] * w
        recv = torch.empty(my * w, dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(recv, torch.cat(send_parts).to(self.device), out_splits, in_splits,
                               group=self.pg, async_op=True).wait(self.timeout)
        self._sent += sum(in_splits) - in_splits[pos]
        self._recv += my * (w - 1)
        recv = recv.cpu()
        rows = [self._decode(streams, recv[r * my:(r + 1) * my], pos, False) for r in range(w)]
        acc = _Acc(False, FP32, Rounding.NEAREST, False, None)
        f32 = []
        for si, st in enumerate(streams):  # float32 sum of chunk `pos` in worker order 0..W-1
            s = rows[0][si][0]
            for r in range(1, w):
                s = acc.add(s, rows[r][si][0])
            f = _Stream(FP32, [], st.x[:0], w)
            f.n, f.idx = st.n, st.idx  # same chunks, float32 on the wire
            f32.append((f, s))
        return self._allgather([f for f, _ in f32], [s for _, s in f32], self.ranks, pos, pos)


def _ceil_log2(v: float) -> int:
    m, e = math.frexp(v)
    return e - 1 if m == 0.5 else e


# --------------------------------------------------------------------------------------- DDP hook
class APSHookState:
    """State of :func:`aps_hook`: the configuration, the communication thread and the reports.

    Construct it on every rank, after ``dist.init_process_group`` and in the same order on every
    rank (it creates process groups, a collective call), then
    ``ddp.register_comm_hook(state, cpd.distributed.aps_hook)``.

    Skipping steps with inf/NaN: a DDP hook cannot skip the optimizer step. When any rank has an
    inf/NaN gradient in a layer (or a low-precision sum overflows, possible with loss scaling),
    that layer's result is the float32 sum (inf/NaN visible, as :func:`cpd.aps_allreduce`) and
    :attr:`found_inf` is True on every rank (decided from the shared exponent exchange and from
    identical results). The training loop skips the step::

        loss.backward()
        if not state.found_inf:
            opt.step()

    With ``scaling="loss"`` the hook multiplies every layer by the state's :class:`cpd.LossScaler`
    scale around the cast (as :meth:`cpd.LossScaler.allreduce`) and updates the scaler after each
    step on every rank (it backs off on inf/NaN, identically everywhere).

    With ``compressor=`` (instead of ``fmt``) the gradients travel as that
    :class:`cpd.compressors.Compressor`'s payloads (see :meth:`_Engine._reduce_compressed` and
    docs/compressors.md): the sums equal ``cpd.compressors.reduce_layers`` / emulated
    ``cpd.APSOptimizer(compressor=...)`` bit for bit, with one error-feedback state per layer on
    each rank (:attr:`compressor_states`; rank r holds the emulator's worker r state). The inf/NaN
    decision is taken per bucket (every layer of the bucket is then summed in float32), and a step
    with :attr:`found_inf` leaves every error-feedback state as it was before the step.

    Args:
        fmt: the communication format (``cpd.E5M2``, ``"e4m3"``, ``cpd.FloatFormat(3, 0)``, ...;
            ``cpd.FP32`` sends float32). Exactly one of ``fmt`` and ``compressor``.
        algorithm: ``"ring"``, ``"hierarchical"`` (with ``group_size``) or ``"one_rounding"``; with
            ``compressor``: ``"ring"`` or ``"pairwise"`` (the orders of
            :func:`cpd.compressors.compressed_allreduce`).
        group_size: hierarchical: ranks per group (consecutive ranks), dividing W.
        kahan: Kahan-compensated low-precision sums (the compensation travels with the sum).
        rounding: ``"nearest"``, ``"toward_zero"``, ``"up"`` or ``"down"``.
        saturate: clamp overflows to ±max (see :func:`cpd.cast`).
        scaling: ``"aps"`` (per-layer power-of-two scaling, the default with ``fmt``), ``"loss"``
            (one global scale from ``loss_scaler``) or None (the only value with ``compressor``).
        margin: APS head room (see :func:`cpd.aps_allreduce`).
        fp32_layers: parameter-name prefixes reduced in float32 (needs ``model``).
        hybrid_steps: float32 communication for the first N steps.
        loss_scaler: the :class:`cpd.LossScaler` of ``scaling="loss"`` (default ``LossScaler()``).
        model: the module (or the DDP wrapper) whose ``named_parameters()`` name the layers.
        process_group: the ranks that reduce together, in worker order (default the world; a group
            of every rank in another order is allowed, a strict subgroup is not yet supported).
        timeout: seconds (or a timedelta) any wait may last before :class:`CommunicationError`.
        roundoff: also compute the emulator's per-layer round-off report of every step
            (``state.report.roundoff``, a :class:`cpd.RoundoffReport`); costs one float32
            all_gather of the gradients per bucket (counted in ``diagnostic_bytes``): a diagnostic,
            off by default (fmt only).
        compressor: a :class:`cpd.compressors.Compressor` or a name (``"onebit"``, ``"threshold:0.01"``,
            ``"adaptive"``, ``"dynamic_tree"``, ``"e5m2"``, ...); then ``group_size``, ``kahan``,
            ``rounding``, ``saturate``, ``scaling``, ``margin``, ``loss_scaler`` and ``roundoff`` keep
            their defaults. Compressors that draw random numbers (``sample=``, stochastic rounding)
            are refused.
    """

    def __init__(self, fmt=None, algorithm: str = "ring", *, group_size: int | None = None, kahan: bool = False,
                 rounding="nearest", saturate: bool = False, scaling=_AUTO, margin: int = 0, fp32_layers=(),
                 hybrid_steps: int = 0, loss_scaler=None, model: torch.nn.Module | None = None,
                 process_group=None, timeout=120.0, roundoff: bool = False, compressor=None):
        from .scaling import LossScaler

        if not isinstance(roundoff, bool):
            raise TypeError(f"roundoff must be a bool, got {type(roundoff).__name__}")
        self.roundoff = roundoff
        if compressor is not None:
            if fmt is not None:
                raise ValueError("give fmt= or compressor=, not both")
            self.config = _check_compressor_config(compressor, algorithm, fp32_layers, hybrid_steps, {
                "group_size": (group_size, None), "kahan": (kahan, False),
                "rounding": (Rounding.parse(rounding), Rounding.NEAREST), "saturate": (saturate, False),
                "scaling": (None if scaling is _AUTO else scaling, None), "margin": (margin, 0),
                "loss_scaler": (loss_scaler, None), "roundoff": (roundoff, False)})
            scaling = None
        else:
            if fmt is None:
                raise TypeError("fmt is required (use cpd.FP32 for float32 communication), or give compressor=")
            scaling = "aps" if scaling is _AUTO else scaling
            self.config = _check_config(fmt, algorithm, group_size, kahan, rounding, saturate, scaling, margin,
                                        fp32_layers, hybrid_steps)
        if loss_scaler is not None and scaling != "loss":
            raise ValueError("loss_scaler is only used with scaling='loss'")
        if loss_scaler is not None and not isinstance(loss_scaler, LossScaler):
            raise TypeError(f"loss_scaler must be a cpd.LossScaler, got {type(loss_scaler).__name__}")
        self.loss_scaler = (loss_scaler or LossScaler()) if scaling == "loss" else None
        self._names: dict[int, str] = {}
        if model is not None:
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
            inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
            self._names = {id(p): n for n, p in inner.named_parameters()}
            for prefix in self.config.fp32_layers:
                if not any(_match(n, prefix) for n in self._names.values()):
                    raise ValueError(f"fp32_layers prefix {prefix!r} matches no parameter; names are "
                                     f"{sorted(self._names.values())}")
        elif self.config.fp32_layers:
            raise ValueError("fp32_layers needs model= (the module whose parameter names the prefixes match)")
        self.engine = _Engine(self.config, process_group, timeout)
        #: Steps seen (one per backward: counted at the last bucket).
        self.steps = 0
        #: Steps whose gradients had inf/NaN (the loop should have skipped them).
        self.skipped_steps = 0
        #: Whether the last completed step found inf/NaN on any rank (the same on every rank).
        self.found_inf = False
        #: :class:`StepReport` of the last completed step (None before the first).
        self.report: StepReport | None = None
        #: Reports of every completed step (bytes per step), newest last.
        self.history: list[StepReport] = []
        self._current: StepReport | None = None

    @property
    def world_size(self) -> int:
        return self.engine.world

    @property
    def compressor(self):
        """The :class:`cpd.compressors.Compressor` (None with ``fmt``)."""
        return self.config.compressor

    @property
    def compressor_states(self) -> dict:
        """{layer name: this rank's :class:`cpd.compressors.CompressorState`} (error feedback; the
        emulator's ``states[name][rank]``). Empty without a compressor or error feedback."""
        return self.engine.states

    def _name(self, p, bucket_index: int, j: int) -> str:
        return self._names.get(id(p)) or f"bucket{bucket_index}.{j}"

    def _run_bucket(self, index: int, last: bool, grads: list, names: list, buffer: torch.Tensor) -> torch.Tensor:
        eng = self.engine
        if index == 0:
            self._current = None
            eng.begin_step()
        exp = self.loss_scaler.scale_exp if self.loss_scaler is not None else None
        sums, rep = eng.reduce(grads, names, [g.shape for g in grads], step=self.steps, scale_exp=exp,
                               roundoff=self.roundoff)
        w = eng.world
        exact = (w & (w - 1)) == 0
        inv = 1.0 / w
        flat = [(s.reshape(-1) * inv if exact else s.reshape(-1) / w) for s in sums]
        out = torch.cat(flat).to(buffer.dtype) if flat else buffer.clone()
        cur = self._current
        if cur is None:
            self._current = cur = rep
        else:
            for f in ("bytes_sent", "bytes_received", "exponent_bytes", "length_bytes", "float32_bytes", "buckets",
                      "diagnostic_bytes"):
                setattr(cur, f, getattr(cur, f) + getattr(rep, f))
            if rep.roundoff is not None:
                cur.roundoff.layers.update(rep.roundoff.layers)
            cur.found_inf = cur.found_inf or rep.found_inf
            cur.status.update(rep.status)
            cur.scale_exp.update(rep.scale_exp)
        if last:
            self.found_inf = cur.found_inf
            if cur.found_inf:
                eng.rollback()  # compressor: error feedback as if the step had not happened
            self.skipped_steps += int(cur.found_inf)
            if self.loss_scaler is not None:
                self.loss_scaler.update(cur.found_inf)
            self.report = cur
            self.history.append(cur)
            self.steps += 1
        return out.reshape(buffer.shape).to(buffer.device)

    def __repr__(self) -> str:
        c = self.config
        if c.compressor is not None:
            return (f"APSHookState(compressor={c.compressor!r}, algorithm={c.algorithm}, world={self.world_size}, "
                    f"steps={self.steps}, skipped_steps={self.skipped_steps})")
        gs = f", group_size={c.group_size}" if c.group_size else ""
        return (f"APSHookState(fmt={c.fmt.name}, algorithm={c.algorithm}{gs}, kahan={c.kahan}, scaling={c.scaling}, "
                f"world={self.world_size}, steps={self.steps}, skipped_steps={self.skipped_steps})")


def aps_hook(state: APSHookState, bucket) -> torch.futures.Future:
    """DDP communication hook: the bucket's gradients summed in low precision, averaged over W.

    Per layer of the bucket (``bucket.gradients()`` / ``bucket.parameters()``) exactly what
    :class:`APSHookState` describes; the returned future holds the flat bucket of averages
    (sum / W, computed as ``sum * (1/W)`` for W a power of two, ``sum / W`` otherwise, as
    :class:`cpd.APSOptimizer`). The work runs on the state's communication thread.
    """
    if not isinstance(state, APSHookState):
        raise TypeError(f"state must be a cpd.distributed.APSHookState, got {type(state).__name__}")
    index, last = bucket.index(), bucket.is_last()
    buffer = bucket.buffer()
    grads = [g.detach().clone() for g in bucket.gradients()]
    if sum(g.numel() for g in grads) != buffer.numel():
        raise RuntimeError(f"cpd.distributed.aps_hook: bucket {index} holds {buffer.numel()} elements but its "
                           f"gradients {sum(g.numel() for g in grads)}; unsupported bucket layout")
    names = [state._name(p, index, j) for j, p in enumerate(bucket.parameters())]
    return state.engine.submit(lambda: state._run_bucket(index, last, grads, names, buffer))


# DDP checks the hook's return annotation by identity; with postponed annotations it is a string.
aps_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
