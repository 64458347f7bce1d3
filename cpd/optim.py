"""Optimizer wrappers: :class:`QuantizedOptimizer` (the mixed-precision recipe) and
:class:`APSOptimizer` (emulated data-parallel training with a low-precision gradient allreduce).
"""

from __future__ import annotations

import math
import warnings

import torch

from .formats import FloatFormat
from .ops import add, cast
from .rounding import Rounding

__all__ = ["QuantizedOptimizer", "APSOptimizer"]


def _fmt(v, name):
    if v is None:
        return None
    try:
        return FloatFormat.parse(v)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None


class _WrappedOptimizer(torch.optim.Optimizer):
    """Base of the wrappers: an ``Optimizer`` that shares the inner optimizer ``self.opt``'s
    ``param_groups``, ``state`` and ``defaults`` (no ``super().__init__``: nothing is duplicated,
    and ``load_state_dict``'s replacements show), so LR schedulers and hooks work on it."""

    def _init_wrapper_hooks(self) -> None:
        self._optimizer_step_pre_hooks = {}
        self._optimizer_step_post_hooks = {}
        self._optimizer_state_dict_pre_hooks = {}
        self._optimizer_state_dict_post_hooks = {}
        self._optimizer_load_state_dict_pre_hooks = {}
        self._optimizer_load_state_dict_post_hooks = {}

    @property
    def param_groups(self):
        return self.opt.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.opt.param_groups = value

    @property
    def state(self):
        return self.opt.state

    @state.setter
    def state(self, value):
        self.opt.state = value

    @property
    def defaults(self):
        return self.opt.defaults

    @defaults.setter
    def defaults(self, value):
        self.opt.defaults = value


class QuantizedOptimizer(_WrappedOptimizer):
    """Wrap any ``torch.optim.Optimizer`` so that training runs with low-precision weights,
    gradients and optimizer state.

    Args:
        opt: the inner optimizer (its ``param_groups`` and ``state`` are shared, so LR schedulers
            and ``state_dict`` work on the wrapper).
        weight: format of the model's weights after every step (None: float32).
        grad: format the gradients are rounded to before the step (None: as they are).
        momentum: format every floating tensor of the optimizer state (momentum buffers, Adam's
            moments) is rounded to after the step (None: float32).
        acc: without a master copy, the format of the update's addition ``w + delta`` (delta is
            the inner optimizer's float32 update); None: the addition is float32's.
        master: keep a float32 master copy of the weights (the standard mixed-precision recipe:
            the inner step updates the master, the model gets ``cast(master, weight)``). Without
            it the low-precision weights are updated in place.
        rounding: rounding mode of every cast and of the ``acc`` addition.

    Steps, in order, in :meth:`step`:
        1. If any gradient is NaN or ±inf, the step is skipped (weights, master copies and
           optimizer state untouched) and counted in :attr:`skipped_steps`; ``step`` returns None.
        2. Gradients are rounded to ``grad``.
        3. The inner step runs on the master copies (``master=True``) or on the weights.
        4. Weights become ``cast(master, weight)``, or ``cast(add(w, delta, acc), weight)``.
        5. Optimizer state tensors are rounded to ``momentum``.
    """

    def __init__(self, opt: torch.optim.Optimizer, *, weight=None, grad=None, momentum=None, acc=None,
                 master: bool = True, rounding="nearest"):
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"opt must be a torch.optim.Optimizer, got {type(opt).__name__}")
        if not isinstance(master, bool):
            raise TypeError(f"master must be a bool, got {type(master).__name__}")
        self.opt = opt
        self.weight, self.grad = _fmt(weight, "weight"), _fmt(grad, "grad")
        self.momentum, self.acc = _fmt(momentum, "momentum"), _fmt(acc, "acc")
        if master and self.acc is not None:
            raise ValueError("acc applies to the in-place update (master=False); with a master copy the update is float32")
        self.master = master
        self.rounding = Rounding.parse(rounding)
        self.skipped_steps = 0
        self._init_wrapper_hooks()  # param_groups/state/defaults: shared with opt (_WrappedOptimizer)
        self.masters: dict[torch.Tensor, torch.Tensor] = {}
        with torch.no_grad():
            for p in self._params():
                if master:
                    self.masters[p] = p.detach().clone().float()
                if self.weight is not None:
                    p.copy_(cast(p.detach().float(), self.weight, self.rounding))

    def _params(self):
        for group in self.param_groups:
            yield from group["params"]

    def _cast(self, t: torch.Tensor, fmt) -> torch.Tensor:
        return t if fmt is None else cast(t.float(), fmt, self.rounding).to(t.dtype)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for p in self._params() if p.grad is not None]
        for p in params:  # 1.
            if not bool(torch.isfinite(p.grad).all()):
                self.skipped_steps += 1
                return None
        for p in params:  # 2.
            p.grad.copy_(self._cast(p.grad, self.grad))
        if self.master:  # 3., 4.
            lowp = {}
            for p in params:
                lowp[p] = p.data
                p.data = self.masters[p]
            try:
                self.opt.step()
            finally:
                for p in params:
                    self.masters[p] = p.data
                    p.data = lowp[p]
            for p in params:
                p.copy_(self._cast(self.masters[p], self.weight))
        else:
            old = {p: p.detach().clone() for p in params}
            self.opt.step()
            for p in params:
                new = p.detach()
                if self.acc is not None:
                    new = add(old[p].float(), (new.float() - old[p].float()), self.acc, self.rounding)
                p.copy_(self._cast(new, self.weight))
        if self.momentum is not None:  # 5.
            for p in params:
                for k, v in self.opt.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0:
                        v.copy_(self._cast(v, self.momentum))
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        sd = self.opt.state_dict()
        index = {id(p): i for i, p in enumerate(self._params())}
        sd["cpd_masters"] = {index[id(p)]: m.clone() for p, m in self.masters.items()}
        sd["cpd_skipped_steps"] = self.skipped_steps
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop("cpd_masters", {})
        self.skipped_steps = state_dict.pop("cpd_skipped_steps", 0)
        self.opt.load_state_dict(state_dict)
        params = list(self._params())
        for i, m in masters.items():
            if self.master:
                self.masters[params[i]].copy_(m)

    def __repr__(self) -> str:
        def n(f):
            return None if f is None else f.name
        return (f"QuantizedOptimizer({self.opt.__class__.__name__}, weight={n(self.weight)}, grad={n(self.grad)}, "
                f"momentum={n(self.momentum)}, acc={n(self.acc)}, master={self.master}, "
                f"rounding={self.rounding.value}, skipped_steps={self.skipped_steps})")


_SCALINGS = ("aps", "loss", None)
_AUTO = object()  # scaling's default: "aps" with fmt=, None with compressor=


class APSOptimizer(_WrappedOptimizer):
    """Emulated data-parallel training: W workers' gradients summed by a low-precision allreduce.

    Wraps any ``torch.optim.Optimizer`` (its ``param_groups``, ``state`` and ``defaults`` are shared
    through properties, so LR schedulers and ``zero_grad`` act on the inner optimizer).

    Use::

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

    Args:
        opt: the inner optimizer.
        fmt: the communication format (e.g. ``cpd.E4M3``, ``"e5m2"``, ``cpd.FloatFormat(3, 0)``).
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
    """

    def __init__(self, opt: torch.optim.Optimizer, *, fmt=None, workers: int | None = None, algorithm: str = "ring",
                 group_size: int | None = None, kahan: bool = False, rounding="nearest", scaling=_AUTO,
                 fp32_layers=(), hybrid_steps: int = 0, loss_scaler=None, model: torch.nn.Module | None = None,
                 compressor=None, process_group=None, timeout: float = 120.0):
        from .collectives import ALGORITHMS
        from .scaling import LossScaler

        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"opt must be a torch.optim.Optimizer, got {type(opt).__name__}")
        self.opt = opt
        self.fmt = _fmt(fmt, "fmt")
        #: The gradient compressor (None: fmt-based communication).
        self.compressor = None
        #: {layer name: W error-feedback states} of the compressor.
        self.compressor_states: dict = {}
        if compressor is not None:  # compressed communication: see cpd.compressors
            from .compressors import ALGORITHMS as COMPRESSED, get
            if self.fmt is not None:
                raise ValueError("give fmt= or compressor=, not both")
            if scaling is not _AUTO and scaling is not None:
                raise ValueError(f"scaling={scaling!r} applies to fmt= communication; with compressor= use None")
            if algorithm not in COMPRESSED:
                raise ValueError(f"with compressor=, algorithm must be one of {list(COMPRESSED)}, got {algorithm!r}")
            if kahan is not False or Rounding.parse(rounding) is not Rounding.NEAREST:
                raise ValueError("kahan and rounding apply to fmt= communication, not to compressor=")
            self.compressor, scaling, ALGORITHMS = get(compressor), None, COMPRESSED
        elif self.fmt is None:
            raise TypeError("fmt is required (use cpd.FP32 for float32 communication), or give compressor=")
        if scaling is _AUTO:
            scaling = "aps"
        self._engine = None
        if process_group is not None:  # real mode: W = the group's size
            import torch.distributed as dist

            group_workers = dist.get_world_size(process_group)
            if workers is not None and workers != group_workers:
                raise ValueError(f"workers={workers} differs from the process group's size {group_workers}")
            workers = group_workers
        elif workers is None:
            workers = 8
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if process_group is None and algorithm not in ALGORITHMS:  # real mode: checked by cpd.distributed
            raise ValueError(f"algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
        if algorithm == "hierarchical":
            if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 \
                    or workers % group_size:
                raise ValueError(f"hierarchical allreduce needs a group_size >= 1 dividing workers={workers}, "
                                 f"got {group_size!r}")
        elif group_size is not None:
            raise ValueError(f"group_size applies to algorithm='hierarchical' only, got algorithm={algorithm!r}")
        if not isinstance(kahan, bool):
            raise TypeError(f"kahan must be a bool, got {type(kahan).__name__}")
        if scaling not in _SCALINGS:
            raise ValueError(f"scaling must be 'aps', 'loss' or None, got {scaling!r}")
        if isinstance(hybrid_steps, bool) or not isinstance(hybrid_steps, int) or hybrid_steps < 0:
            raise ValueError(f"hybrid_steps must be an int >= 0, got {hybrid_steps!r}")
        if loss_scaler is not None and scaling != "loss":
            raise ValueError("loss_scaler is only used with scaling='loss'")
        if loss_scaler is not None and not isinstance(loss_scaler, LossScaler):
            raise TypeError(f"loss_scaler must be a cpd.LossScaler, got {type(loss_scaler).__name__}")
        self.workers, self.algorithm, self.group_size, self.kahan = workers, algorithm, group_size, kahan
        self.rounding = Rounding.parse(rounding)
        self.scaling, self.hybrid_steps = scaling, hybrid_steps
        self.loss_scaler = (loss_scaler or LossScaler()) if scaling == "loss" else None
        self._init_wrapper_hooks()
        names = {}
        if model is not None:
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
            names = {id(p): n for n, p in model.named_parameters()}
        self._names: dict[int, str] = {}
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                self._names[id(p)] = names.get(id(p), f"{gi}.{pi}")
        if isinstance(fp32_layers, str):
            fp32_layers = (fp32_layers,)
        self.fp32_layers = tuple(fp32_layers)
        for prefix in self.fp32_layers:
            if not isinstance(prefix, str):
                raise TypeError(f"fp32_layers must be names (str), got {prefix!r}")
            if not any(self._match(n, prefix) for n in self._names.values()):
                raise ValueError(f"fp32_layers prefix {prefix!r} matches no parameter; names are "
                                 f"{sorted(self._names.values())}")
        if process_group is not None:
            from .distributed import _check_compressor_config, _check_config, _Engine

            if self.compressor is not None:
                cfg = _check_compressor_config(self.compressor, algorithm, self.fp32_layers, hybrid_steps, {})
            else:
                cfg = _check_config(self.fmt, algorithm, group_size, kahan, self.rounding, False, scaling, 0,
                                    self.fp32_layers, hybrid_steps)
            self._engine = _Engine(cfg, process_group, timeout)
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

    # The inner optimizer's structures, shared (as in QuantizedOptimizer).
    @staticmethod
    def _match(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

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
        from .formats import FP32
        from .scaling import aps_allreduce, scaled_allreduce

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
        fp32 = [n for n in layers if hybrid or any(self._match(n, pre) for pre in self.fp32_layers)]
        kw = dict(algorithm=self.algorithm, group_size=self.group_size, kahan=self.kahan, rounding=self.rounding,
                  fp32_layers=fp32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # inf/NaN is handled here: the step is skipped
            if self.compressor is not None:
                from .compressors import reduce_layers
                out, report = reduce_layers(layers, self.compressor, self.compressor_states,
                                            algorithm=self.algorithm, fp32_layers=fp32)
            elif self.scaling == "aps":
                out, report = aps_allreduce(layers, self.fmt, **kw)
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
            from .compressors import CompressorState
            real = self._engine is not None  # real mode: one state per layer (this process's), in place
            if not real:
                self.compressor_states = {}
            else:
                self.compressor_states.clear()
            for n, rs in extra["compressor_residuals"].items():
                if real and len(rs) != 1:
                    raise ValueError(f"state_dict holds {len(rs)} workers' residuals for layer {n!r}; a process "
                                     "of real mode loads its own (one per layer)")
                states = [CompressorState() for _ in rs]
                for s, r in zip(states, rs):
                    s.residual = None if r is None else r.clone()
                self.compressor_states[n] = states[0] if real else states
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
