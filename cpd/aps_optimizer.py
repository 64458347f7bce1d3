"""Emulated (and real) data-parallel training with a low-precision gradient allreduce:
:class:`APSOptimizer`.

Use::

    opt = cpd.APSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), fmt=cpd.E4M3, workers=8)

    opt.zero_grad()
    for wx, wy in opt.split(x, y):          # the batch split across the W emulated workers
        loss_fn(model(wx), wy).backward()
        opt.collect()                       # keep this worker's gradients, zero .grad
    opt.step()                              # scaling + allreduce in fmt + average + inner step
    print(opt.last_report)

or ``opt.step(closure)`` with ``closure(worker_index)`` doing that worker's forward and
backward and returning its loss (``step`` then returns the mean of the workers' losses).

:meth:`step`, in order:
    1. Per parameter ("layer", named by ``model.named_parameters()`` when ``model`` is given,
       else ``"<group index>.<param index>"``) the W collected gradients are reduced with
       ``scaling="aps"``: :func:`cpd.aps_allreduce`; ``"loss"``: :meth:`cpd.LossScaler.allreduce`
       (one global power-of-two scale, dynamic by default); ``None``: unscaled
       :func:`cpd.scaled_allreduce`. Parameters whose name starts with a ``fp32_layers`` prefix
       (``name == prefix`` or ``name.startswith(prefix + ".")``), and every parameter during the
       first ``hybrid_steps`` steps, are reduced in float32 with the same algorithm.
    2. If any gradient or any reduced value is inf/NaN (``report.found_inf``), the step is
       skipped: weights, ``.grad`` and optimizer state are untouched, :attr:`skipped_steps`
       grows, and with ``scaling="loss"`` the scale backs off. ``step`` returns None.
    3. The sums are divided by W (the average, as data-parallel SGD does; exact for W a power
       of two) and written to ``.grad``; the inner step runs.

With equal-size worker batches and float32 communication this is the full-batch gradient of the
mean loss, up to float32 summation order. Per-worker gradient copies are kept only for the
parameters of ``param_groups`` (the ones communicated), between :meth:`collect` and :meth:`step`.

The configuration is one :class:`cpd.ReduceConfig` (``fmt=``) or :class:`cpd.CompressedReduceConfig`
(``compressor=``), built from the keyword arguments or given as ``config=`` (docs/design.md).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from . import distributed
from ._wrapped import WrappedOptimizer
from .compressors import CompressorState, reduce_layers
from .config import AUTO, EMULATED_ALGORITHMS, CompressedReduceConfig, ReduceConfig, make_config
from .formats import FP32
from .primitives import match_prefix
from .scaling import aps_allreduce, loss_scaler_for, scaled_allreduce

__all__ = ["APSOptimizer"]


def _optimizer_config(fmt, compressor, config, workers, process_group, loss_scaler, options: dict):
    """The optimizer's validated config, with ``workers`` set (the process group's size in real
    mode, else ``workers`` or 8) and, in emulated mode, an emulator order."""
    if config is None and not isinstance(fmt, (ReduceConfig, CompressedReduceConfig)):
        options = dict(options, workers=workers)
    cfg = make_config(fmt, compressor=compressor, config=config, what="APSOptimizer",
                      fmt_only={"loss_scaler": (loss_scaler, None)}, **options)
    if process_group is not None:  # real mode: W = the group's size
        group_workers = dist.get_world_size(process_group)
        for w in (workers, cfg.workers):
            if w is not None and w != group_workers:
                raise ValueError(f"workers={w} differs from the process group's size {group_workers}")
        workers = group_workers
    if cfg.workers is None:
        cfg = cfg.with_workers(workers if workers is not None else 8)
    if process_group is None and isinstance(cfg, ReduceConfig):  # real mode: the transport checks its orders
        cfg.require(EMULATED_ALGORITHMS, "the emulated optimizer (process_group=None)")
    return cfg


def _param_names(param_groups, model) -> dict:
    """{id(parameter): layer name}: ``model.named_parameters()`` names, else ``"<group>.<index>"``."""
    names = {}
    if model is not None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        names = {id(p): n for n, p in model.named_parameters()}
    return {id(p): names.get(id(p), f"{gi}.{pi}")
            for gi, group in enumerate(param_groups) for pi, p in enumerate(group["params"])}


def _load_residuals(states: dict, saved: dict, real: bool) -> None:
    """Fill ``states`` ({layer: W CompressorStates}, or in real mode {layer: this process's state},
    updated in place: the engine holds that dict) from ``{layer: [float64 residual or None]}``."""
    if real:
        states.clear()
    for n, rs in saved.items():
        if real and len(rs) != 1:
            raise ValueError(f"state_dict holds {len(rs)} workers' residuals for layer {n!r}; a process "
                             "of real mode loads its own (one per layer)")
        loaded = [CompressorState() for _ in rs]
        for st, r in zip(loaded, rs):
            st.residual = None if r is None else r.clone()
        states[n] = loaded[0] if real else loaded


class APSOptimizer(WrappedOptimizer):
    """Emulated data-parallel training: W workers' gradients summed by a low-precision allreduce.

    Wraps any ``torch.optim.Optimizer`` (its ``param_groups``, ``state`` and ``defaults`` are shared
    through properties, so LR schedulers and ``zero_grad`` act on the inner optimizer).

    How to use it and what :meth:`step` does, in order: the module docstring
    (:mod:`cpd.aps_optimizer`).

    Args:
        opt: the inner optimizer.
        fmt: the communication format (e.g. ``cpd.E4M3``, ``"e5m2"``, ``cpd.FloatFormat(3, 0)``), or
            in emulated mode a :class:`cpd.mx.BlockFormat` such as ``cpd.mx.MXFP8_E4M3`` (APS per
            block, :mod:`cpd.blockreduce`; ``scaling`` must be ``"aps"``; the real mode refuses it).
        workers: W, the number of emulated workers (default 8; in real mode the group size).
        algorithm, group_size, kahan, rounding: passed to the allreduce (see :func:`cpd.allreduce`).
        scaling: ``"aps"``, ``"loss"`` or None.
        fp32_layers: parameter-name prefixes reduced in float32 (the APS paper keeps the classifier
            in FP32); each must match at least one parameter.
        hybrid_steps: float32 communication for the first N steps (the paper's hybrid precision).
        loss_scaler: the :class:`cpd.LossScaler` of ``scaling="loss"`` (default ``LossScaler()``).
        model: the module, to name parameters by ``named_parameters()``.
        compressor: instead of ``fmt``, a gradient compressor (a :class:`cpd.compressors.Compressor`
            or a name: ``"onebit"``, ``"dynamic_tree"``, ``"adaptive"``, ...): step 1 becomes
            :func:`cpd.compressors.reduce_layers` (compressed allreduce, ``algorithm`` ``"ring"`` or
            ``"pairwise"``, with one error-feedback state per parameter per worker in
            :attr:`compressor_states` when the compressor uses error feedback) and
            :attr:`last_report` a :class:`cpd.compressors.CompressionReport`. ``scaling`` must be
            None (its default then); ``fp32_layers`` and ``hybrid_steps`` send those layers and steps
            uncompressed.
        process_group: real mode: a ``torch.distributed`` process group (e.g. ``dist.group.WORLD``);
            each process is one worker (W = the group's size; ``workers`` may be omitted), its own
            ``.grad`` is its gradient (no :meth:`split`/:meth:`collect`), and :meth:`step` sums
            them across processes in low precision with the same bits as emulated mode
            (:mod:`cpd.distributed`; ``rounding`` must be deterministic and ``algorithm`` one of
            ``"ring"``, ``"hierarchical"``, ``"one_rounding"``). ``last_report`` is then a
            :class:`cpd.distributed.StepReport` (bytes on the wire, per-layer decisions). With
            ``compressor=`` the compressor's payloads travel between the processes (``algorithm``
            ``"ring"`` or ``"pairwise"``) with the emulated mode's bits, and
            :attr:`compressor_states` maps a layer name to this process's one error-feedback state
            (the emulated mode's ``compressor_states[name][rank]``).
        timeout: real mode: seconds any exchange may wait for a peer before
            :class:`cpd.distributed.CommunicationError`.
        config: a :class:`cpd.ReduceConfig` or :class:`cpd.CompressedReduceConfig` instead of
            ``fmt``/``compressor`` and the reduction options (``workers`` from it, or as above).
    """

    def __init__(self, opt: torch.optim.Optimizer, *, fmt=None, workers: int | None = None, algorithm: str = "ring",
                 group_size: int | None = None, kahan: bool = False, rounding="nearest", scaling=AUTO,
                 fp32_layers=(), hybrid_steps: int = 0, loss_scaler=None, model: torch.nn.Module | None = None,
                 compressor=None, process_group=None, timeout: float = 120.0, config=None):
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"opt must be a torch.optim.Optimizer, got {type(opt).__name__}")
        self.opt = opt
        options = dict(algorithm=algorithm, group_size=group_size, kahan=kahan, rounding=rounding, scaling=scaling,
                       fp32_layers=fp32_layers, hybrid_steps=hybrid_steps)
        cfg = _optimizer_config(fmt, compressor, config, workers, process_group, loss_scaler, options)
        #: The validated :class:`cpd.ReduceConfig` / :class:`cpd.CompressedReduceConfig`.
        self.config = cfg
        #: The communication format (None with a compressor) and the gradient compressor (None: fmt-based).
        self.fmt = cfg.fmt if isinstance(cfg, ReduceConfig) else None
        self.compressor = cfg.compressor
        #: {layer name: W error-feedback states} of the compressor.
        self.compressor_states: dict = {}
        self.workers, self.algorithm, self.group_size, self.kahan = cfg.workers, cfg.algorithm, cfg.group_size, cfg.kahan
        self.rounding, self.scaling, self.hybrid_steps = cfg.rounding, cfg.scaling, cfg.hybrid_steps
        self.fp32_layers = cfg.fp32_layers
        self.loss_scaler = loss_scaler_for(cfg.scaling, loss_scaler)
        self._engine = None
        self._init_wrapper_hooks()
        self._names: dict[int, str] = _param_names(self.param_groups, model)
        for prefix in self.fp32_layers:
            if not any(match_prefix(n, prefix) for n in self._names.values()):
                raise ValueError(f"fp32_layers prefix {prefix!r} matches no parameter; names are "
                                 f"{sorted(self._names.values())}")
        if process_group is not None:
            self._engine = distributed._Engine(cfg.for_processes(), process_group, timeout)
            if self.compressor is not None:  # this rank's error-feedback states live in the engine
                self.compressor_states = self._engine.states
        #: Steps taken (applied or skipped); the hybrid schedule counts these.
        self.steps = 0
        #: Steps skipped because of inf/NaN.
        self.skipped_steps = 0
        #: The :class:`cpd.RoundoffReport` of the last step (None before the first).
        self.last_report = None
        self._grads: dict[torch.Tensor, list] = {}
        self._collected = 0

    def _params(self):
        for group in self.param_groups:
            yield from group["params"]

    def name_of(self, p: torch.Tensor) -> str:
        """The layer name of a parameter in the reports."""
        return self._names.get(id(p)) or f"param{len(self._names)}"

    def split(self, *tensors):
        """Split a batch (one or more tensors, along dim 0) across the workers; yields one tuple per
        worker (one tensor if a single tensor is given). Uses ``torch.tensor_split``: sizes differ
        by at most one when W does not divide the batch."""
        self._emulated_only("split")
        if not tensors:
            raise TypeError("split needs at least one tensor")
        n = len(tensors[0])
        if any(len(t) != n for t in tensors):
            raise ValueError(f"split: tensors have different batch sizes {[len(t) for t in tensors]}")
        if n < self.workers:
            raise ValueError(f"split: batch of {n} is smaller than workers={self.workers}")
        parts = [torch.tensor_split(t, self.workers) for t in tensors]
        for w in range(self.workers):
            yield parts[0][w] if len(tensors) == 1 else tuple(p[w] for p in parts)

    @torch.no_grad()
    def collect(self) -> None:
        """Store this worker's gradients (a copy of each communicated parameter's ``.grad``) and
        clear ``.grad`` for the next worker."""
        self._emulated_only("collect")
        if self._collected >= self.workers:
            raise RuntimeError(f"collect() called more than workers={self.workers} times before step()")
        for p in self._params():
            g = p.grad
            self._grads.setdefault(p, []).append(None if g is None else g.detach().float().clone())
            p.grad = None
        self._collected += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the inner optimizer's gradients and drop collected worker gradients."""
        self.opt.zero_grad(set_to_none=set_to_none)
        self._grads, self._collected = {}, 0

    def _layers(self):
        layers, params = {}, {}
        for p in self._params():
            grads = self._grads.get(p)
            name = self.name_of(p)
            params[name] = p
            layers[name] = None if grads is None or all(g is None for g in grads) else grads
        return layers, params

    def _emulated_only(self, what: str) -> None:
        if self._engine is not None:
            raise RuntimeError(f"{what}() is for emulated workers; with process_group each process is one worker "
                               "and step() reduces its own .grad")

    @torch.no_grad()
    def _step_real(self, closure):
        """Real mode: this process's ``.grad`` summed across the process group (cpd.distributed)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = {self.name_of(p): p for p in self._params()}
        grads = [p.grad for p in params.values()]
        exp = self.loss_scaler.scale_exp if self.loss_scaler is not None else None
        sums, report = self._engine.reduce(grads, list(params), [p.shape for p in params.values()],
                                           step=self.steps, scale_exp=exp)
        return self._apply(dict(zip(params, sums)), params, report, loss)

    @torch.no_grad()
    def step(self, closure=None):
        if self._engine is not None:
            return self._step_real(closure)
        loss = None
        if closure is not None:
            if self._collected:
                raise RuntimeError("step(closure): gradients were already collected; call zero_grad() first")
            losses = []
            for w in range(self.workers):
                with torch.enable_grad():
                    lw = closure(w)
                losses.append(lw)
                self.collect()
            if all(isinstance(v, torch.Tensor) for v in losses):
                loss = torch.stack([v.detach().float() for v in losses]).mean()
        if self._collected != self.workers:
            raise RuntimeError(f"step(): {self._collected} workers collected, expected {self.workers} "
                               "(call collect() after each worker's backward)")
        layers, params = self._layers()
        hybrid = self.steps < self.hybrid_steps
        fp32 = [n for n in layers if hybrid or self.config.is_fp32_layer(n)]
        kw = dict(algorithm=self.algorithm, group_size=self.group_size, kahan=self.kahan, rounding=self.rounding,
                  saturate=self.config.saturate, fp32_layers=fp32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # inf/NaN is handled here: the step is skipped
            if self.compressor is not None:
                out, report = reduce_layers(layers, self.compressor, self.compressor_states,
                                            algorithm=self.algorithm, fp32_layers=fp32)
            elif self.scaling == "aps":
                out, report = aps_allreduce(layers, self.fmt, margin=self.config.margin, **kw)
            elif self.scaling == "loss":
                out, report = self.loss_scaler.allreduce(layers, self.fmt, **kw)
            else:
                out, report = scaled_allreduce(layers, self.fmt, 0, **kw)
        if self.compressor is None and (self.fmt == FP32 or hybrid):
            report.method += " (fp32 communication)" if self.fmt == FP32 else " (hybrid fp32 phase)"
        self._grads, self._collected = {}, 0
        return self._apply(out, params, report, loss)

    def _apply(self, out: dict, params: dict, report, loss):
        """Record the report; skip on inf/NaN; write the averages to ``.grad``; run the inner step."""
        self.last_report = report
        self.steps += 1
        ok = not report.found_inf
        if self.loss_scaler is not None:
            ok = self.loss_scaler.update(report.found_inf) and ok
        if not ok:
            self.skipped_steps += 1
            return None
        inv = 1.0 / self.workers
        exact = (self.workers & (self.workers - 1)) == 0
        for name, p in params.items():
            r = out[name]
            if r is None:
                p.grad = None
                continue
            g = r.reshape(p.shape) * inv if exact else r.reshape(p.shape) / self.workers
            p.grad = g.to(p.dtype)
        self.opt.step()
        return loss

    def state_dict(self) -> dict:
        sd = self.opt.state_dict()
        sd["cpd_aps"] = {"steps": self.steps, "skipped_steps": self.skipped_steps,
                         "loss_scaler": None if self.loss_scaler is None else self.loss_scaler.state_dict()}
        if self.compressor_states:  # error-feedback residuals: {layer: [per-worker float64 residual]}
            sd["cpd_aps"]["compressor_residuals"] = {n: [None if s.residual is None else s.residual.clone()
                                                         for s in (v if isinstance(v, list) else [v])]
                                                     for n, v in self.compressor_states.items()}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop("cpd_aps", {})
        self.opt.load_state_dict(state_dict)
        self.steps = int(extra.get("steps", 0))
        self.skipped_steps = int(extra.get("skipped_steps", 0))
        if "compressor_residuals" in extra:
            if self._engine is None:
                self.compressor_states = {}
            _load_residuals(self.compressor_states, extra["compressor_residuals"], real=self._engine is not None)
        ls = extra.get("loss_scaler")
        if ls is not None and self.loss_scaler is not None:
            self.loss_scaler.load_state_dict(ls)
        self._grads, self._collected = {}, 0

    def __repr__(self) -> str:
        gs = f", group_size={self.group_size}" if self.group_size else ""
        comm = f"compressor={self.compressor!r}" if self.compressor is not None else f"fmt={self.fmt.name}"
        return (f"APSOptimizer({self.opt.__class__.__name__}, {comm}, workers={self.workers}, "
                f"algorithm={self.algorithm}{gs}, scaling={self.scaling}, fp32_layers={list(self.fp32_layers)}, "
                f"hybrid_steps={self.hybrid_steps}, steps={self.steps}, skipped_steps={self.skipped_steps})")
