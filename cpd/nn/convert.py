"""``convert``: a copy of a model with its GEMM layers replaced by emulated ones (the table of
replacements is :mod:`cpd.nn.zoo`; what was replaced, and what was not, is
:func:`cpd.nn.conversion_report`)."""

from __future__ import annotations

import copy
import warnings

import torch

from .layers import _SAME, GemmConfig
from .recipes import ScalingRecipe, grad_recipe
from .zoo import conversion_for, multiplies_by_weight

__all__ = ["convert", "ConversionWarning", "CONVERSION_ATTR"]

#: The attribute of a converted model holding what convert did: {"converted": {name: original
#: type}, "skipped": {name: (type, prefix)}, "unsupported": {name: type}} (read by the report).
CONVERSION_ATTR = "_cpd_conversion"


class ConversionWarning(UserWarning):
    """A module that multiplies by a weight matrix was left in float32 (unsupported type)."""


def _type_name(m) -> str:
    t = type(m)
    return t.__name__ if t.__module__.startswith(("torch.", "cpd.")) else f"{t.__module__}.{t.__qualname__}"


def _call(model, example_inputs):
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    if isinstance(example_inputs, tuple):
        return model(*example_inputs)
    return model(example_inputs)


def _output_shapes(model: torch.nn.Module, names, example_inputs) -> dict:
    """{name: shape(s) of the module's output} for the modules ``names`` in one forward pass."""
    shapes, hooks = {}, []
    for name in names:
        def hook(_m, _a, out, name=name):
            shapes[name] = tuple(tuple(o.shape) for o in (out if isinstance(out, (tuple, list)) else (out,))
                                 if isinstance(o, torch.Tensor))
        hooks.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            _call(model, example_inputs)
    finally:
        for h in hooks:
            h.remove()
    return shapes


def _adopt(name: str, old: torch.nn.Module, new, factory) -> None:
    """Check the replacement ``new`` of ``old`` and give it ``old``'s parameter and buffer objects
    (tied weights stay tied); only state of the scaling recipes (``scale_*``) may be new."""
    who = f"convert: the replacement of {name or 'the model'} ({_type_name(old)}, factory {factory!r})"
    if not isinstance(new, torch.nn.Module):
        raise TypeError(f"{who} is a {type(new).__name__}, not a torch.nn.Module")
    for kind, src, dst in (("parameters", dict(old.named_parameters()), dict(new.named_parameters())),
                           ("buffers", dict(old.named_buffers()), dict(new.named_buffers()))):
        extra = [k for k in dst if k not in src and not k.startswith("scale_")]
        missing = [k for k in src if k not in dst]
        shapes = [k for k in src if k in dst and src[k].shape != dst[k].shape]
        if extra or missing or shapes:
            raise ValueError(f"{who} has other {kind} than the module: missing {missing}, unexpected {extra}, "
                             f"other shapes {[(k, tuple(src[k].shape), tuple(dst[k].shape)) for k in shapes]}")
        for k, v in src.items():
            owner, _, leaf = k.rpartition(".")
            mod = new.get_submodule(owner) if owner else new
            if kind == "parameters":
                mod.register_parameter(leaf, v)
            else:
                mod.register_buffer(leaf, v, persistent=leaf not in mod._non_persistent_buffers_set)
    new.train(old.training)


def convert(model: torch.nn.Module, *, mul=None, acc=None, weight=None, activation=None, grad=None,
            backward_mul=_SAME, backward_acc=_SAME, kahan: bool = False, fma: bool = False,
            block: int | None = None, rounding="nearest", softmax=None, scaling=None, grad_scaling=None,
            skip=(), example_inputs=None) -> torch.nn.Module:
    """A copy of ``model`` whose GEMM layers are emulated (same weights; the original is untouched).

    Replaced (:mod:`cpd.nn.zoo`): ``nn.Linear`` -> :class:`QuantLinear`, ``nn.Conv1d/2d/3d`` ->
    :class:`QuantConv1d`/:class:`QuantConv2d`/:class:`QuantConv3d`, ``nn.ConvTranspose2d`` ->
    :class:`QuantConvTranspose2d` (``padding_mode="zeros"``), ``nn.MultiheadAttention`` ->
    :class:`QuantMultiheadAttention` (projections and both attention GEMMs emulated, softmax in
    float32 rounded to ``softmax``), ``transformers``' ``Conv1D`` (GPT-2) ->
    :class:`cpd.nn.zoo.QuantTransposedLinear`, ``timm``'s ``Linear`` -> :class:`QuantLinear`, and
    the types of :func:`cpd.nn.register_conversion`. ``model`` itself is replaced when it is such a
    layer (``convert(nn.Linear(4, 4))`` is a :class:`QuantLinear`). The converted layers hold the
    copy's parameter objects: weights tied in ``model`` (GPT-2's ``lm_head`` and ``wte``) stay tied.

    ``acc`` may be a :class:`cpd.FusedDot` (``cpd.tensor_core(...)``). Attention written with
    ``@``/``F.scaled_dot_product_attention`` inside a model's own modules is reached with
    :class:`cpd.nn.emulate` instead (:func:`cpd.nn.conversion_report` with example inputs lists
    those GEMMs). ``scaling`` (a :class:`cpd.nn.recipes.ScalingRecipe` or its kind) applies to
    the ``Linear`` layers (each keeps its own state: delayed scaling's amax history), and
    ``grad_scaling`` (a recipe or ``"tensorwise"``/``"delayed"``/``"block"``: E5M2 gradients) to
    their backward GEMMs' output gradient (see :class:`QuantLinear`).

    ``skip``: modules whose qualified name equals or starts with ``prefix + "."`` for a prefix in
    ``skip`` are kept (``""`` skips everything). A module that multiplies by a weight matrix
    (:func:`cpd.nn.zoo.multiplies_by_weight`) of a type with no conversion is kept in float32 and
    named in a :class:`ConversionWarning`. ``example_inputs`` (a tensor, a tuple of positional
    arguments or a dict of keyword arguments of ``model``): both models run once on them (no
    grad; dropout in training mode draws random numbers) and a replacement whose output shape
    differs from its module's raises ValueError.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(skip, str) or not all(isinstance(s, str) for s in skip):
        raise TypeError(f"skip must be a tuple or list of module-name prefixes (str), got {skip!r}")
    if example_inputs is not None and not isinstance(example_inputs, (torch.Tensor, tuple, dict)):
        raise TypeError("example_inputs must be a tensor, a tuple of positional arguments or a dict of keyword "
                        f"arguments, got {type(example_inputs).__name__}")
    formats = dict(mul=mul, acc=acc, weight=weight, activation=activation, grad=grad, backward_mul=backward_mul,
                   backward_acc=backward_acc, kahan=kahan, fma=fma, block=block, rounding=rounding, softmax=softmax,
                   scaling=scaling, grad_scaling=grad_scaling)
    GemmConfig(mul, acc, fma, kahan, block, rounding)  # validate once, before copying anything
    ScalingRecipe.parse(scaling)
    grad_recipe(grad_scaling)
    new = copy.deepcopy(model)
    info = {"converted": {}, "skipped": {}, "unsupported": {}}

    def skipped_by(full: str):
        return next((s for s in skip if s == "" or full == s or full.startswith(s + ".")), None)

    def replace(child: torch.nn.Module, full: str):
        """The converted ``child``, or None (its children are visited then)."""
        s = skipped_by(full)
        if s is not None:
            for n, m in child.named_modules(prefix=full):
                if multiplies_by_weight(m):
                    info["skipped"][n] = (_type_name(m), s)
            return child
        factory = conversion_for(child)
        if factory is None:
            if multiplies_by_weight(child):
                info["unsupported"][full] = _type_name(child)
            return None
        q = factory(child, **formats)
        if q is None:  # a configuration the factory declines (padding_mode="reflect", bias_k): kept whole
            info["unsupported"][full] = _type_name(child) + " (configuration not supported)"
            return child
        _adopt(full, child, q, factory)
        info["converted"][full] = _type_name(child)
        return q

    def swap(parent: torch.nn.Module, prefix: str):
        for name, child in list(parent.named_children()):
            q = replace(child, prefix + name)
            if q is None:
                swap(child, prefix + name + ".")
            elif q is not child:
                setattr(parent, name, q)

    root = replace(new, "")
    if root is None:
        swap(new, "")
        root = new
    if example_inputs is not None and info["converted"]:
        names = list(info["converted"])
        before = _output_shapes(model, names, example_inputs)
        after = _output_shapes(root, names, example_inputs)
        for n in names:
            if n in before and before[n] != after.get(n):
                raise ValueError(f"convert: the replacement of {n or 'the model'} ({info['converted'][n]}) returned "
                                 f"outputs of shapes {after.get(n)}, the module {before[n]}")
    object.__setattr__(root, CONVERSION_ATTR, info)
    if info["unsupported"]:
        listed = ", ".join(f"{n} ({t})" for n, t in info["unsupported"].items())
        warnings.warn(f"convert: {len(info['unsupported'])} module(s) that multiply by a weight matrix have no "
                      f"conversion and stay float32: {listed}. Register one with cpd.nn.register_conversion, or "
                      "name them in skip= to keep them on purpose; cpd.nn.conversion_report(model) lists them.",
                      ConversionWarning, stacklevel=2)
    return root
