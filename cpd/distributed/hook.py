"""The DDP front end: :class:`APSHookState` and :func:`aps_hook`.

Buckets flow through DDP's futures: the hook hands each bucket to the state's communication
thread (FIFO, so every rank reduces its buckets in DDP's order) and returns a future that thread
completes; backward goes on meanwhile. With ``fmt=`` the bucket's flat buffer is read in place by
the fused encode (no copy) and the averaged sums are written back into it by the fused decode.
"""

from __future__ import annotations

import torch

from ..config import AUTO, make_config
from ..primitives import match_prefix
from ..scaling import loss_scaler_for
from .engine import _Engine
from .report import StepReport

__all__ = ["APSHookState", "aps_hook"]


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
    :class:`cpd.compressors.Compressor`'s payloads (see :mod:`cpd.distributed.reduce_compressed` and
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
                 rounding="nearest", saturate: bool = False, scaling=AUTO, margin: int = 0, fp32_layers=(),
                 hybrid_steps: int = 0, loss_scaler=None, model: torch.nn.Module | None = None,
                 process_group=None, timeout=120.0, roundoff: bool = False, compressor=None):
        if not isinstance(roundoff, bool):
            raise TypeError(f"roundoff must be a bool, got {type(roundoff).__name__}")
        self.roundoff = roundoff
        #: The validated configuration (a :class:`cpd.ReduceConfig` or :class:`cpd.CompressedReduceConfig`).
        self.config = make_config(fmt, compressor=compressor, what="APSHookState", algorithm=algorithm,
                                  group_size=group_size, kahan=kahan, rounding=rounding, saturate=saturate,
                                  scaling=scaling, margin=margin, fp32_layers=fp32_layers, hybrid_steps=hybrid_steps,
                                  fmt_only={"loss_scaler": (loss_scaler, None), "roundoff": (roundoff, False)}
                                  ).for_processes()
        self.loss_scaler = loss_scaler_for(self.config.scaling, loss_scaler)
        self._names: dict[int, str] = {}
        if model is not None:
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
            inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
            self._names = {id(p): n for n, p in inner.named_parameters()}
            for prefix in self.config.fp32_layers:
                if not any(match_prefix(n, prefix) for n in self._names.values()):
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

    def _run_bucket(self, index: int, last: bool, grads: list, names: list, shapes: list,
                    buffer: torch.Tensor) -> torch.Tensor:
        eng = self.engine
        if index == 0:
            self._current = None
            eng.begin_step()
        exp = self.loss_scaler.scale_exp if self.loss_scaler is not None else None
        w = eng.world
        exact = (w & (w - 1)) == 0  # 1/W exact: the average is sum * (1/W), else sum / W
        if self.config.compressor is not None:
            sums, rep = eng.reduce(grads, names, shapes, step=self.steps, scale_exp=exp, roundoff=self.roundoff)
            flat = [(s.reshape(-1) * (1.0 / w) if exact else s.reshape(-1) / w) for s in sums]
            out = torch.cat(flat).to(buffer.dtype) if flat else buffer.clone()
        else:
            fuse = exact and not self.roundoff  # the fused decode multiplies by 1/W
            x = buffer.reshape(-1)
            own = x.dtype == torch.float32 and x.device == eng.tp.device and x.is_contiguous()
            if not own:
                x = x.to(device=eng.tp.device, dtype=torch.float32).contiguous()
            sizes = [g.numel() for g in grads]
            # the averages are decoded straight into the bucket's buffer (DDP's own allreduce works
            # in place too); not with the round-off report, which reads the gradients at the end
            out, rep = eng.reduce_flat(x, [True] * len(grads), names, sizes, shapes, step=self.steps, scale_exp=exp,
                                       roundoff=self.roundoff, inv=1.0 / w if fuse else 1.0,
                                       out=x if fuse else None)
            if not fuse:
                out = out * (1.0 / w) if exact else out / w
            out = out.to(buffer.dtype)
        cur = self._current
        if cur is None:
            self._current = cur = rep
        else:
            cur.add(rep)
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

    def close(self) -> None:
        """End this state's communication thread once the buckets already submitted are reduced;
        later hooks fail with :class:`CommunicationError`. Local (no message to the peers) and
        idempotent; a state still open is closed at interpreter exit. The process groups the
        state created are torn down by ``dist.destroy_process_group()``, as the user's."""
        self.engine.close()

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
    state.engine.tp.check_alive()  # after a failure or close(): raised here, its type kept
    index, last = bucket.index(), bucket.is_last()
    buffer = bucket.buffer()
    grads = bucket.gradients()
    if sum(g.numel() for g in grads) != buffer.numel():
        raise RuntimeError(f"cpd.distributed.aps_hook: bucket {index} holds {buffer.numel()} elements but its "
                           f"gradients {sum(g.numel() for g in grads)}; unsupported bucket layout")
    if state.config.compressor is not None:
        grads = [g.detach().clone() for g in grads]
    # fmt=: the bucket's buffer is read in place (DDP leaves it alone until the future completes).
    shapes = [g.shape for g in grads]
    names = [state._name(p, index, j) for j, p in enumerate(bucket.parameters())]
    return state.engine.submit(lambda: state._run_bucket(index, last, grads, names, shapes, buffer))


# DDP checks the hook's return annotation by identity; with postponed annotations it is a string.
aps_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
