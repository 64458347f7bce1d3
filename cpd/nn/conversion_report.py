"""What :func:`cpd.nn.convert` did to a model: per module, what it became and with which formats,
what stayed float32 and why, and (with example inputs) the GEMMs of the forward pass that no
converted module computes: those :class:`cpd.nn.emulate` reaches (attention written with ``@`` or
``F.scaled_dot_product_attention`` in a model's own code) and those nothing in cpd reaches
(``F.conv*`` of an unconverted layer, ``einsum``).

``print(report)`` shows aligned tables, ``report.to_dict()`` plain data (as the round-off report,
:mod:`cpd.report`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..formats import FloatFormat
from .convert import CONVERSION_ATTR, _call, _type_name
from .emulate import QuantMultiheadAttention, emulate
from .layers import _QuantMixin
from .zoo import multiplies_by_weight

__all__ = ["ModuleEntry", "GemmSite", "ConversionReport", "conversion_report"]


@dataclasses.dataclass
class ModuleEntry:
    """One module that multiplies by a weight matrix."""

    #: Qualified name ("" for the model itself).
    name: str
    #: ``"converted"``, ``"skipped"`` (by ``skip=``) or ``"unsupported"`` (float32, no conversion).
    status: str
    #: The original type.
    original: str
    #: What it is now (its type).
    became: str
    #: The formats of its GEMMs (converted modules): mul, acc, backward_mul, backward_acc, weight,
    #: activation, grad, scaling, grad_scaling, softmax (those that apply).
    formats: dict = dataclasses.field(default_factory=dict)
    #: Why it stayed float32 (``skip=('prefix',)``, unsupported type), "" when converted.
    reason: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class GemmSite:
    """GEMMs of one kind called in one module's own code (not inside a converted module)."""

    #: The innermost module whose forward made the calls ("" for the model's own forward).
    module: str
    #: The function: ``matmul``, ``addmm``, ``linear``, ``sdpa``, ``conv2d``, ``einsum``, ...
    op: str
    #: Calls in one forward pass.
    calls: int
    #: True when :class:`cpd.nn.emulate` routes this function through cpd; False: float32 always.
    emulated_by_emulate: bool
    #: True when an operand is a parameter (a weight GEMM that convert did not reach).
    weight_operand: bool

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _fmt(f) -> str | None:
    if f is None:
        return None
    return f.name if isinstance(f, FloatFormat) else str(f)


def _formats(m: torch.nn.Module) -> dict:
    if isinstance(m, QuantMultiheadAttention):
        e = emulate(**m._emulate_kw)
        g, b = e.gemm, e.backward_gemm
        out = {"mul": _fmt(g.mul), "acc": _fmt(g.acc), "backward_mul": _fmt(b.mul), "backward_acc": _fmt(b.acc),
               "softmax": _fmt(e.softmax)}
        return out
    if isinstance(m, _QuantMixin):
        g, b = m.gemm, m.backward_gemm
        out = {"mul": _fmt(g.mul), "acc": _fmt(g.acc), "backward_mul": _fmt(b.mul), "backward_acc": _fmt(b.acc),
               "weight": _fmt(m.weight_fmt), "activation": _fmt(m.act.forward_fmt), "grad": _fmt(m.act.backward_fmt)}
        for k in ("scaling", "grad_scaling"):
            r = getattr(m, k, None)
            if r is not None:
                out[k] = r.kind
        return out
    return {}


def _converted(m: torch.nn.Module) -> bool:
    return isinstance(m, (_QuantMixin, QuantMultiheadAttention))


_ROUTED = {"matmul", "mm", "bmm", "baddbmm", "addmm", "linear", "sdpa", "multi_head_attention", "conv1d", "conv2d",
           "conv3d"}
_NAMES = {torch.matmul: "matmul", torch.Tensor.matmul: "matmul", torch.Tensor.__matmul__: "matmul",
          torch.Tensor.__rmatmul__: "matmul", torch.mm: "mm", torch.Tensor.mm: "mm", torch.bmm: "bmm",
          torch.Tensor.bmm: "bmm", torch.baddbmm: "baddbmm", torch.Tensor.baddbmm: "baddbmm", torch.addmm: "addmm",
          torch.Tensor.addmm: "addmm", F.linear: "linear", F.scaled_dot_product_attention: "sdpa",
          F.multi_head_attention_forward: "multi_head_attention", F.conv1d: "conv1d", F.conv2d: "conv2d",
          F.conv3d: "conv3d", F.conv_transpose1d: "conv_transpose1d", F.conv_transpose2d: "conv_transpose2d",
          F.conv_transpose3d: "conv_transpose3d", torch.einsum: "einsum", torch.tensordot: "tensordot",
          F.bilinear: "bilinear", torch.addbmm: "addbmm", torch.Tensor.addbmm: "addbmm", torch.mv: "mv",
          torch.Tensor.mv: "mv", torch.addmv: "addmv", torch.Tensor.addmv: "addmv"}


class _Recorder(TorchFunctionMode):
    """Counts the GEMM calls of a forward pass by the innermost module making them."""

    def __init__(self, stack: list):
        super().__init__()
        self.stack, self.sites = stack, {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _NAMES.get(func)
        if op is not None and not any(c for _, c in self.stack):
            flat = [*args, *kwargs.values()]
            if all(not (isinstance(t, torch.Tensor) and not t.is_floating_point()) for t in flat):
                weight = any(isinstance(t, torch.nn.Parameter) for t in flat)
                key = (self.stack[-1][0] if self.stack else "", op)
                n, w = self.sites.get(key, (0, False))
                self.sites[key] = (n + 1, w or weight)
        return func(*args, **kwargs)


class ConversionReport:
    """Per-module conversion report (``print`` it, ``to_dict()``); see :func:`conversion_report`."""

    def __init__(self, modules: list, gemms: list | None):
        #: One :class:`ModuleEntry` per module that multiplies by a weight matrix, in model order.
        self.modules = modules
        #: One :class:`GemmSite` per (module, function) outside converted modules; None without
        #: example inputs.
        self.gemms = gemms

    @property
    def unconverted(self) -> list:
        """Names of the modules left in float32 that were not skipped on purpose."""
        return [e.name for e in self.modules if e.status == "unsupported"]

    def to_dict(self) -> dict:
        return {"modules": [e.to_dict() for e in self.modules],
                "gemms": None if self.gemms is None else [g.to_dict() for g in self.gemms]}

    def _counts(self) -> str:
        c = {s: sum(e.status == s for e in self.modules) for s in ("converted", "skipped", "unsupported")}
        return f"{c['converted']} converted, {c['skipped']} skipped, {c['unsupported']} unsupported (float32)"

    def __str__(self) -> str:
        keys = ("mul", "acc", "backward_mul", "backward_acc")
        header = ["module", "status", "original", "became", "mul", "acc", "bwd_mul", "bwd_acc", "other / reason"]
        rows = []
        for e in self.modules:
            other = ", ".join(f"{k}={v}" for k, v in e.formats.items() if k not in keys and v is not None)
            rows.append([e.name or "(model)", e.status, e.original, e.became,
                         *[str(e.formats.get(k, "-")) if e.status == "converted" else "-" for k in keys],
                         e.reason if e.reason else other])
        lines = [f"conversion report: {self._counts()}", _table(header, rows)]
        if self.gemms is not None:
            lines += ["", "GEMMs of the forward pass outside converted modules (one pass on the example inputs):"]
            if not self.gemms:
                lines.append("  none: every GEMM runs in a converted module")
            else:
                rows = [[g.module or "(model)", g.op, str(g.calls),
                         "emulate" if g.emulated_by_emulate else "float32 (no cpd route)",
                         "weight" if g.weight_operand else "activations"] for g in self.gemms]
                lines.append(_table(["module", "op", "calls", "reached by", "operands"], rows))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ConversionReport({self._counts()})"


def _table(header, rows) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def conversion_report(model: torch.nn.Module, example_inputs=None) -> ConversionReport:
    """What :func:`cpd.nn.convert` made of ``model`` (a converted model, or any model: then every
    module that multiplies by a weight matrix and is not a cpd layer is "unsupported").

    ``example_inputs`` (a tensor, a tuple of positional or a dict of keyword arguments): ``model``
    runs once on them (no grad, outside any :class:`cpd.nn.emulate`) and the report lists the
    GEMM calls made outside converted modules, by module and function: those that
    :class:`cpd.nn.emulate` routes through cpd and those it does not (convolutions of
    unconverted layers, ``einsum``).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if example_inputs is not None and not isinstance(example_inputs, (torch.Tensor, tuple, dict)):
        raise TypeError("example_inputs must be a tensor, a tuple of positional arguments or a dict of keyword "
                        f"arguments, got {type(example_inputs).__name__}")
    seen = getattr(model, CONVERSION_ATTR, None)
    info = seen or {"converted": {}, "skipped": {}, "unsupported": {}}
    entries = []
    whole = [n for n, t in info["unsupported"].items() if t.endswith("(configuration not supported)")]
    for name, m in model.named_modules():
        if any(name.startswith(w + ".") or (w == "" and name) for w in whole):
            continue  # inside a module kept whole (its own weights are its row)
        if _converted(m):
            entries.append(ModuleEntry(name, "converted", info["converted"].get(name, _type_name(m)), _type_name(m),
                                       _formats(m)))
        elif name in info["skipped"]:
            t, prefix = info["skipped"][name]
            entries.append(ModuleEntry(name, "skipped", t, t, reason=f"skip=({prefix!r},)"))
        elif multiplies_by_weight(m) or name in info["unsupported"]:
            t = info["unsupported"].get(name, _type_name(m))
            if any(name.startswith(c + ".") or c == "" for c, _ in _converted_names(model)):
                continue  # inside a converted module (its own parameters)
            entries.append(ModuleEntry(name, "unsupported", t, _type_name(m),
                                       reason="configuration not supported" if "configuration" in t
                                       else "no conversion for this type" if seen is not None
                                       else "not converted (not a model from cpd.nn.convert)"))
    gemms = None
    if example_inputs is not None:
        gemms = _record(model, example_inputs)
    return ConversionReport(entries, gemms)


def _converted_names(model):
    return [(n, m) for n, m in model.named_modules() if _converted(m)]


def _record(model, example_inputs) -> list:
    stack, hooks = [], []
    for name, m in model.named_modules():
        conv = _converted(m)

        def pre(_m, _a, name=name, conv=conv):
            stack.append((name, conv))

        def post(_m, _a, _o):
            stack.pop()
        hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    rec = _Recorder(stack)
    try:
        with torch.no_grad(), rec:
            _call(model, example_inputs)
    finally:
        for h in hooks:
            h.remove()
    return [GemmSite(mod, op, n, op in _ROUTED, w) for (mod, op), (n, w) in rec.sites.items()]
