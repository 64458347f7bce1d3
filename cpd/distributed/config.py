"""The configuration of the real path, checked once (until cpd.config replaces it).

Temporary home of the checks that lived in cpd/distributed.py; the structure issue's frozen
config types take their place (the engine validates nothing itself).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum

from ..formats import FP32, FloatFormat
from ..rounding import Rounding

__all__ = ["ALGORITHMS"]

#: The reduction algorithms of the real path.
ALGORITHMS = ("ring", "hierarchical", "one_rounding")
_SCALINGS = ("aps", "loss", None)
_AUTO = object()  # APSHookState's scaling default: "aps" with fmt=, None with compressor=


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
    from ..compressors import ALGORITHMS as COMPRESSED, get

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

