"""The base of cpd's optimizer wrappers (:class:`cpd.optim.QuantizedOptimizer`,
:class:`cpd.APSOptimizer`): an ``Optimizer`` sharing an inner optimizer's structures."""

from __future__ import annotations

import torch

__all__ = ["WrappedOptimizer"]


class WrappedOptimizer(torch.optim.Optimizer):
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


_WrappedOptimizer = WrappedOptimizer
