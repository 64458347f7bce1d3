"""Optimizer wrappers: :class:`QuantizedOptimizer` (the mixed-precision recipe) and
:class:`APSOptimizer` (emulated data-parallel training with a low-precision gradient allreduce).
"""

from __future__ import annotations

import torch

from ._wrapped import WrappedOptimizer as _WrappedOptimizer
from .aps_optimizer import APSOptimizer
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
