"""The configuration of a gradient reduction: one frozen dataclass per kind, validated once.

* :class:`ReduceConfig`: the format-based reduction (a :class:`cpd.FloatFormat` on the wire and
  in every partial sum; the algorithm, Kahan, rounding, APS / loss / no scaling, float32 layers,
  the hybrid schedule), taken by :func:`cpd.allreduce`, :func:`cpd.aps_allreduce`,
  :class:`cpd.APSOptimizer` and :mod:`cpd.distributed`.
* :class:`CompressedReduceConfig`: the compressor-based reduction (a
  :class:`cpd.compressors.Compressor` on every link, float32 sums).

Every check happens in ``__post_init__``; the front ends' keyword arguments build a config through
:func:`make_config`, which also refuses options of the format path given with ``compressor=``.
The algorithms a config accepts are the union of the emulator's and the process transport's; each
executor narrows them (:meth:`ReduceConfig.require`, :meth:`ReduceConfig.for_processes`).
"""

from __future__ import annotations

import dataclasses

from .formats import FP32, FloatFormat
from .blockreduce import check_block_format
from .mx import BlockFormat
from .primitives import match_prefix
from .registry import COMPRESSOR_FACTORY, lookup
from .rounding import Rounding

__all__ = ["ReduceConfig", "CompressedReduceConfig", "make_config", "AUTO", "SCALINGS", "EMULATED_ALGORITHMS",
           "PROCESS_ALGORITHMS", "REDUCE_ALGORITHMS", "COMPRESSED_ALGORITHMS"]


class _Auto:
    """The default of ``scaling``: ``"aps"`` with ``fmt=``, None with ``compressor=``."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "AUTO"

    def __reduce__(self):
        return (_Auto, ())


#: The one default sentinel of ``scaling`` (every front end uses this object).
AUTO = _Auto()
#: The values of ``scaling``.
SCALINGS = ("aps", "loss", None)
#: The summation orders of the single-process emulator (:func:`cpd.allreduce`).
EMULATED_ALGORITHMS = ("ring", "hierarchical", "tree", "sequential")
#: The orders of the real multi-process transport (:mod:`cpd.distributed`).
PROCESS_ALGORITHMS = ("ring", "hierarchical", "one_rounding")
#: Every order a :class:`ReduceConfig` accepts (each executor accepts its own subset).
REDUCE_ALGORITHMS = ("ring", "hierarchical", "tree", "sequential", "one_rounding")
#: The orders of the compressed allreduce (:func:`cpd.compressors.compressed_allreduce`).
COMPRESSED_ALGORITHMS = ("ring", "pairwise")


def _allowed(values) -> str:
    return ", ".join(map(repr, values))


def _check_bool(name: str, v) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _layers(fp32_layers) -> tuple:
    if isinstance(fp32_layers, str):
        fp32_layers = (fp32_layers,)
    try:
        out = tuple(fp32_layers)
    except TypeError:
        raise TypeError(f"fp32_layers must be a name or a list of names, got {type(fp32_layers).__name__}") from None
    for p in out:
        if not isinstance(p, str):
            raise TypeError(f"fp32_layers must be layer names or parameter-name prefixes (str), got {p!r}")
    return out


def _common(cfg) -> None:
    """The fields both kinds share: fp32_layers, hybrid_steps, workers."""
    object.__setattr__(cfg, "fp32_layers", _layers(cfg.fp32_layers))
    if not _is_int(cfg.hybrid_steps) or cfg.hybrid_steps < 0:
        raise ValueError(f"hybrid_steps must be an int >= 0, got {cfg.hybrid_steps!r}")
    if cfg.workers is not None and (not _is_int(cfg.workers) or cfg.workers < 1):
        raise ValueError(f"workers must be an int >= 1, got {cfg.workers!r}")


class _Shared:
    """Methods of both configuration kinds."""

    def is_fp32_layer(self, name: str) -> bool:
        """Whether layer ``name`` is reduced in float32: it equals a ``fp32_layers`` entry or starts
        with one followed by ``"."``."""
        return any(match_prefix(name, p) for p in self.fp32_layers)

    def with_workers(self, workers: int):
        """A copy with ``workers`` set (validated again, e.g. that ``group_size`` divides it)."""
        return dataclasses.replace(self, workers=workers)


@dataclasses.dataclass(frozen=True)
class ReduceConfig(_Shared):
    """A format-based reduction: every link carries ``fmt`` and every partial sum is rounded to it.

    Args:
        fmt: the accumulation / wire format (a :class:`cpd.FloatFormat`, a name or a torch dtype), or
            a :class:`cpd.mx.BlockFormat` with power-of-two scales: block-scaled communication (APS at
            block granularity, :mod:`cpd.blockreduce`; emulator only, ``scaling`` must be ``"aps"``).
        algorithm: the summation order: ``"ring"``, ``"hierarchical"``, ``"tree"``, ``"sequential"``
            (emulator) or ``"one_rounding"`` (processes only); see :func:`cpd.allreduce`.
        group_size: hierarchical only: workers per group (must divide ``workers``).
        kahan: carry a Kahan compensation with every partial sum (not with ``"one_rounding"``).
        rounding: rounding of every cast and addition (a :class:`cpd.Rounding` or its name).
        saturate: clamp overflows to ±max (see :func:`cpd.cast`).
        scaling: ``"aps"`` (per-layer power-of-two scaling; the default), ``"loss"`` (one global
            power-of-two scale) or None; applies to the front ends that scale
            (:class:`cpd.APSOptimizer`, the distributed hook), not to :func:`cpd.allreduce`.
        margin: APS head room: scale by ``2**-margin`` less (see :func:`cpd.aps_allreduce`).
        fp32_layers: layer names or parameter-name prefixes reduced in float32 (a layer matches
            ``p`` when its name is ``p`` or starts with ``p + "."``).
        hybrid_steps: float32 communication for the first N steps (the APS paper's hybrid schedule).
        workers: W, when known in advance (the emulator takes it from the data).
    """

    fmt: FloatFormat
    algorithm: str = "ring"
    group_size: int | None = None
    kahan: bool = False
    rounding: Rounding = Rounding.NEAREST
    saturate: bool = False
    scaling: str | None = AUTO
    margin: int = 0
    fp32_layers: tuple = ()
    hybrid_steps: int = 0
    workers: int | None = None

    def __post_init__(self):
        if isinstance(self.fmt, BlockFormat):
            check_block_format(self.fmt)
        else:
            try:
                fmt = FloatFormat.parse(self.fmt)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"fmt: {exc}") from None
            object.__setattr__(self, "fmt", fmt)
        a = self.algorithm
        if not isinstance(a, str) or a not in REDUCE_ALGORITHMS:
            raise ValueError(f"algorithm={a!r} is unknown; allowed: {_allowed(REDUCE_ALGORITHMS)}")
        g = self.group_size
        if a == "hierarchical":
            if g is None:
                raise ValueError("algorithm='hierarchical' needs group_size (workers per group), got None")
            if not _is_int(g):
                raise TypeError(f"group_size must be an int, got {type(g).__name__}")
            if g < 1:
                raise ValueError(f"group_size={g} must be a positive divisor of the number of workers")
        elif g is not None:
            raise ValueError(f"group_size only applies to algorithm='hierarchical', got algorithm={a!r}")
        _check_bool("kahan", self.kahan)
        _check_bool("saturate", self.saturate)
        if self.kahan and a == "one_rounding":
            raise ValueError("kahan=True applies to algorithm='ring' or 'hierarchical'; 'one_rounding' sums in float32")
        object.__setattr__(self, "rounding", Rounding.parse(self.rounding))
        scaling = "aps" if self.scaling is AUTO else self.scaling
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be 'aps', 'loss' or None, got {scaling!r}")
        object.__setattr__(self, "scaling", scaling)
        if self.is_block and scaling != "aps":
            raise ValueError(f"fmt={self.fmt.name} is a block format: it scales every block by its own power of two "
                             f"(APS at block granularity), so scaling must be 'aps' (the default), got {scaling!r}")
        if not _is_int(self.margin):
            raise TypeError(f"margin must be an int, got {type(self.margin).__name__}")
        _common(self)
        if self.workers is not None:
            self.check_workers(self.workers)

    @property
    def is_block(self) -> bool:
        """Whether ``fmt`` is a :class:`cpd.mx.BlockFormat` (block-scaled communication)."""
        return isinstance(self.fmt, BlockFormat)

    @property
    def element(self) -> FloatFormat:
        """The format every value on the wire and every partial sum is rounded to: ``fmt``, or
        the block format's element format."""
        return self.fmt.element if self.is_block else self.fmt

    @property
    def compressor(self):
        """None: a format-based reduction (so code can ask any config for its compressor)."""
        return None

    def check_workers(self, workers: int) -> None:
        """ValueError unless ``group_size`` divides ``workers`` (hierarchical only)."""
        g = self.group_size
        if self.algorithm == "hierarchical" and workers % g:
            raise ValueError(f"group_size={g} must be a positive divisor of the number of workers W={workers}")

    def require(self, algorithms, where: str) -> "ReduceConfig":
        """Self, or ValueError unless ``algorithm`` is one of ``algorithms`` (what ``where`` runs)."""
        if self.algorithm not in algorithms:
            raise ValueError(f"algorithm={self.algorithm!r} is not an order of {where}; allowed: "
                             f"{_allowed(algorithms)}")
        return self

    def for_processes(self) -> "ReduceConfig":
        """Self, checked for the real multi-process transport: an order of
        :data:`PROCESS_ALGORITHMS` and a deterministic rounding (stochastic rounding draws its bits
        per emulator call, which W processes cannot reproduce)."""
        if self.is_block:
            raise ValueError(f"fmt={self.fmt.name}: block-scaled communication (a cpd.mx.BlockFormat) runs on the "
                             "emulated path only (cpd.allreduce, cpd.aps_allreduce); the multi-process transport "
                             "takes a cpd.FloatFormat")
        self.require(PROCESS_ALGORITHMS, "the multi-process transport (cpd.distributed)")
        if self.rounding is Rounding.STOCHASTIC:
            raise ValueError("rounding='stochastic' is not supported across processes (its random bits are drawn "
                             "per emulator call); allowed: 'nearest', 'toward_zero', 'up', 'down'")
        return self


@dataclasses.dataclass(frozen=True)
class CompressedReduceConfig(_Shared):
    """A compressor-based reduction: every link carries the compressor's payloads, sums are float32.

    Args:
        compressor: a :class:`cpd.compressors.Compressor`, a :class:`cpd.FloatFormat` or a name
            (``"onebit"``, ``"threshold:0.01"``, ``"e5m2"``, ...; see :func:`cpd.compressors.get`).
        algorithm: ``"ring"`` or ``"pairwise"`` (:mod:`cpd.compressors.reduce`).
        fp32_layers, hybrid_steps, workers: as :class:`ReduceConfig` (those layers and steps are
            sent uncompressed).

    The format-path attributes read as their neutral values (``fmt`` is :data:`cpd.FP32`, for the
    float32 layers; ``group_size`` None, ``kahan`` False, ``rounding`` nearest, ``saturate``
    False, ``scaling`` None, ``margin`` 0), so an executor can read either kind.
    """

    compressor: object
    algorithm: str = "ring"
    fp32_layers: tuple = ()
    hybrid_steps: int = 0
    workers: int | None = None

    fmt = FP32
    group_size = None
    kahan = False
    rounding = Rounding.NEAREST
    saturate = False
    scaling = None
    margin = 0

    def __post_init__(self):
        object.__setattr__(self, "compressor", lookup(COMPRESSOR_FACTORY)(self.compressor))
        a = self.algorithm
        if not isinstance(a, str) or a not in COMPRESSED_ALGORITHMS:
            raise ValueError(f"with compressor=, algorithm must be one of {_allowed(COMPRESSED_ALGORITHMS)} (the "
                             f"orders of cpd.compressors.compressed_allreduce), got algorithm={a!r}")
        _common(self)

    def check_workers(self, workers: int) -> None:
        """Any W works for the compressed orders."""

    def for_processes(self) -> "CompressedReduceConfig":
        """Self, checked for the real transport: the compressor must not draw random numbers."""
        comp = self.compressor
        if getattr(comp, "sample", None) is not None or getattr(comp, "rounding", None) is Rounding.STOCHASTIC:
            raise ValueError(f"compressor={comp!r} draws random numbers from one generator shared by the emulated "
                             "workers, which W processes cannot reproduce; across processes use a deterministic "
                             "compressor (sample=None, rounding other than 'stochastic')")
        return self


#: The keyword options :func:`make_config` takes, with their defaults.
OPTIONS = {"algorithm": "ring", "group_size": None, "kahan": False, "rounding": "nearest", "saturate": False,
           "scaling": AUTO, "margin": 0, "fp32_layers": (), "hybrid_steps": 0, "workers": None}
_FMT_ONLY = ("group_size", "kahan", "rounding", "saturate", "scaling", "margin")


def _differs(name: str, v, default) -> bool:
    if name == "rounding":
        return Rounding.parse(v) is not Rounding.NEAREST
    if name == "scaling":
        return v is not AUTO and v is not None
    if name == "fp32_layers":
        return _layers(v) != ()
    return v is not default and v != default


def make_config(fmt=None, *, compressor=None, config=None, what: str = "this call", fmt_only: dict | None = None,
                **options):
    """The configuration the keyword arguments of a front end describe.

    Exactly one of ``fmt`` (a :class:`ReduceConfig` is built), ``compressor`` (a
    :class:`CompressedReduceConfig`) and ``config`` (a config, returned as it is; ``fmt`` may be a
    config too). ``options`` are the keys of :data:`OPTIONS`; with ``compressor=`` the options of
    the format path (``group_size``, ``kahan``, ``rounding``, ``saturate``, ``scaling`` other than
    None, ``margin``) and those in ``fmt_only`` (``{name: (value, default)}``, e.g. a generator)
    must keep their defaults; with ``config=`` every option must. ``what`` names the front end in
    the error for a missing ``fmt``.
    """
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"make_config got unknown options {sorted(unknown)}; allowed: {sorted(OPTIONS)}")
    fmt_only = dict(fmt_only or {})
    if isinstance(fmt, (ReduceConfig, CompressedReduceConfig)):
        config, fmt = fmt, None
    if config is not None:
        if not isinstance(config, (ReduceConfig, CompressedReduceConfig)):
            raise TypeError(f"config must be a cpd.ReduceConfig or cpd.CompressedReduceConfig, "
                            f"got {type(config).__name__}")
        given = [f"{n}={v!r}" for n, v in options.items() if _differs(n, v, OPTIONS[n])]
        given += [f"{n}={v!r}" for n, (v, d) in fmt_only.items()
                  if isinstance(config, CompressedReduceConfig) and v is not d and v != d]
        if fmt is not None or compressor is not None:
            given.insert(0, "fmt=" if fmt is not None else "compressor=")
        if given:
            raise ValueError(f"{', '.join(given)}: the config already holds the reduction's options; give config= "
                             "or the keyword options, not both")
        return config
    if compressor is not None:
        if fmt is not None:
            raise ValueError("give fmt= or compressor=, not both")
        given = [f"{n}={v!r}" for n, v in options.items() if n in _FMT_ONLY and _differs(n, v, OPTIONS[n])]
        given += [f"{n}={v!r}" for n, (v, d) in fmt_only.items() if v is not d and v != d]
        if given:
            raise ValueError(f"{', '.join(given)}: not used with compressor= (group_size, kahan and rounding, "
                             "saturate, scaling, margin and the other fmt= options apply to format-based "
                             "communication; the compressor defines the wire format and the sums are float32); "
                             "leave them at their defaults")
        rest = {n: v for n, v in options.items() if n not in _FMT_ONLY}
        return CompressedReduceConfig(compressor, **rest)
    if fmt is None:
        raise TypeError(f"fmt is required ({what} needs fmt, the accumulation / communication format: use cpd.FP32 "
                        "for float32), or give compressor=")
    return ReduceConfig(fmt, **options)
