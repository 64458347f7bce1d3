"""The engine: one reducer over a process group, shared by the hook and ``APSOptimizer``.

It composes the :class:`~.transport.Transport` (groups, messages, faults, the thread) with the
reducer the configuration asks for (:class:`~.reduce_format.FormatReducer` or
:class:`~.reduce_compressed.CompressedReducer`), checks once that every rank holds the same
configuration and, at the first exchange, the same layers (an ``all_gather_object``: every rank
raises a ValueError naming the fields and each rank's value), and turns any failure into
:class:`CommunicationError`. It validates nothing of the configuration itself.
"""

from __future__ import annotations

import datetime
import enum

import torch

from .reduce_compressed import CompressedReducer
from .reduce_format import FormatReducer
from .report import CommunicationError, StepReport
from ..formats import FloatFormat
from .transport import Transport

__all__ = ["_Engine"]


def _timedelta(timeout) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or a timedelta, got {timeout!r}")
    return datetime.timedelta(seconds=float(timeout))


def _describe(comp) -> str | None:
    """A compressor's class and scalar settings: what must agree across ranks."""
    if comp is None:
        return None
    attrs = []
    for k, v in sorted(vars(comp).items()):
        if isinstance(v, enum.Enum):
            v = v.value
        elif isinstance(v, FloatFormat):
            v = v.name
        if v is None or isinstance(v, (bool, int, float, str)):
            attrs.append(f"{k}={v!r}")
    return f"{type(comp).__name__}({', '.join(attrs)})"


class _Engine:
    """One low-precision reducer over a process group; used by the hook state and APSOptimizer."""

    def __init__(self, cfg, process_group=None, timeout=120.0):
        cfg = cfg.for_processes()  # the config validated itself; only the transport's orders remain
        self.cfg = cfg
        self.tp = tp = Transport(process_group, _timedelta(timeout))
        cfg.check_workers(tp.world)
        self.checked = False
        self.check({})  # before any group that depends on the configuration is created
        sub = None
        if cfg.algorithm == "hierarchical" and cfg.group_size > 1:
            k = cfg.group_size
            sub = tp.subgroups([tp.ranks[g * k:(g + 1) * k] for g in range(tp.world // k)])
        self.compressed = CompressedReducer(cfg, tp) if cfg.compressor is not None else None
        self.format = FormatReducer(cfg, tp, sub) if cfg.compressor is None else None

    # ---- what the front ends read
    @property
    def world(self) -> int:
        return self.tp.world

    @property
    def pos(self) -> int:
        return self.tp.pos

    @property
    def error(self):
        return self.tp.error

    @property
    def states(self) -> dict:
        """Compressor mode: {layer name: this rank's CompressorState}; empty otherwise."""
        if self.compressed is None:
            self.__dict__.setdefault("_no_states", {})
            return self.__dict__["_no_states"]
        return self.compressed.states

    def submit(self, fn) -> torch.futures.Future:
        return self.tp.submit(fn)

    def close(self) -> None:
        self.tp.close()

    def begin_step(self) -> None:
        if self.compressed is not None:
            self.compressed.begin_step()

    def rollback(self) -> None:
        if self.compressed is not None:
            self.compressed.rollback()

    # ---- configuration agreement
    def check(self, extra: dict) -> None:
        cfg = self.cfg
        mine = {"fmt": cfg.fmt.name, "algorithm": cfg.algorithm, "group_size": cfg.group_size,
                "kahan": cfg.kahan, "rounding": cfg.rounding.value, "saturate": cfg.saturate,
                "scaling": cfg.scaling, "margin": cfg.margin, "fp32_layers": cfg.fp32_layers,
                "hybrid_steps": cfg.hybrid_steps, "compressor": _describe(cfg.compressor),
                "world": self.tp.world, **extra}
        every = self.tp.all_gather_object(mine)
        bad = [(r, k) for r, o in enumerate(every) for k in mine if o.get(k) != every[0].get(k)]
        if bad:
            fields = sorted({k for _, k in bad})
            desc = "; ".join(f"{k}: " + ", ".join(f"rank {self.tp.ranks[r]}={o.get(k)!r}" for r, o in enumerate(every))
                             for k in fields)
            raise ValueError(f"cpd.distributed: the ranks' configurations differ ({desc}); every rank must use "
                             "the same format (or compressor), algorithm, group_size, kahan, rounding, scaling "
                             "and layers")
        if extra:
            self.checked = True

    def _guard(self, fn, names, shapes):
        self.tp.check_alive()
        try:
            if not self.checked:  # the first exchange also checks that the ranks reduce the same layers
                self.check({"layers": [(n, tuple(sh)) for n, sh in zip(names, shapes)]})
            return fn()
        except Exception as exc:
            raise self.tp.fail(exc, "the gradient exchange") from (None if exc is self.tp.error else exc)

    # ---- the exchange
    def reduce(self, grads: list, names: list[str], shapes: list, *, step: int, scale_exp: int | None = None,
               roundoff: bool = False) -> tuple[list, StepReport]:
        """Sum the W ranks' ``grads`` (one tensor or None per layer, of ``shapes``) as the emulator
        would (a None gradient counts as zeros; a layer None on every rank is skipped).

        Returns ``(sums, report)``: one float32 tensor (or None) per layer and a :class:`StepReport`.
        Raises :class:`CommunicationError` when a peer fails (and for every later call), ValueError
        when the ranks' layers differ.
        """
        if self.compressed is not None:
            return self._guard(lambda: self.compressed.reduce(grads, names, shapes, step), names, shapes)
        sizes = [int(torch.Size(sh).numel()) for sh in shapes]
        dev = self.tp.device
        flat = torch.cat([g.detach().reshape(-1).to(device=dev, dtype=torch.float32) if g is not None
                          else torch.zeros(n, dtype=torch.float32, device=dev) for g, n in zip(grads, sizes)]
                         ) if grads else torch.zeros(0, device=dev)
        out, rep = self.reduce_flat(flat, [g is not None for g in grads], names, sizes, shapes, step=step,
                                    scale_exp=scale_exp, roundoff=roundoff)
        sums, off = [], 0
        for n, sh, name in zip(sizes, shapes, names):
            sums.append(None if rep.status[name] == "skipped" else out[off:off + n].reshape(tuple(sh)))
            off += n
        return sums, rep

    def reduce_flat(self, flat: torch.Tensor, present: list[bool], names: list[str], sizes: list[int], shapes, *,
                    step: int, scale_exp: int | None = None, roundoff: bool = False, inv: float = 1.0,
                    out: torch.Tensor | None = None):
        """The format path on a flat float32 bucket (layers back to back): ``(sums * inv, report)``,
        written to ``out`` when given (``flat`` itself allowed, see FormatReducer.reduce)."""
        return self._guard(lambda: self.format.reduce(flat.contiguous(), present, names, sizes, step=step,
                                                      scale_exp=scale_exp, roundoff=roundoff, inv=inv, out=out),
                           names, shapes)


__all__ += ["CommunicationError"]
