"""Scaling recipes for low-precision GEMM operands: per-tensor scales from amax, as FP8 training
does (TransformerEngine's delayed scaling with an amax history and a margin, its "current"
scaling, torchao's tensorwise and rowwise recipes).

A recipe turns an operand ``x`` into ``x * s`` before it is rounded to ``fmt`` (so that its
largest magnitude lands near ``fmt.max``), and the GEMM's result is multiplied by
``1 / (s_a * s_b)`` afterwards (in float32: exact for power-of-two scales):

* ``"tensorwise"``: ``s = fmt.max / amax(x) / 2**margin`` from the current tensor;
* ``"delayed"``: the same from the largest amax of the last ``history`` calls (the current amax
  is recorded after the scale is chosen, so a sudden growth overflows once, as on the GPU);
  the first call uses the current amax;
* ``"rowwise"``: one scale per row of the operand along the reduction dim (per token of an
  activation, per output feature of a weight);
* ``"block"``: one scale per block of ``fmt.block_size`` elements along the reduction dim, from a
  :class:`cpd.mx.BlockFormat` (OCP MX: E8M0 per 32; NVFP4: E4M3 per 16 and a tensor scale): the
  operand is fake-quantized with :func:`cpd.mx.cast` (``x`` is replaced by its block-format
  values, the scale reported is the range of the block scales), unless the GEMM itself is
  block-scaled (``cpd.tensor_core("blackwell", a="mxfp8_e4m3")``), which quantizes it;
* ``power_of_two=True`` rounds ``s`` down to a power of two (scaling is then exact).

Gradients (``QuantLinear(grad_scaling=...)``, ``convert(..., grad_scaling=...)``): the two
backward GEMMs quantize the output gradient with their own recipe, as TransformerEngine's FP8
recipes do (E5M2 gradients, ``fmt`` defaults to E5M2 there): ``g`` is scaled by ``s_g`` and
rounded to ``fmt`` (saturating), both backward GEMMs run on it and their results are divided by
``s_g``; ``"block"`` quantizes ``g`` in blocks along its last dim.

:class:`Scaler` holds one operand's state and statistics; :func:`scaling_report` gathers them
per layer (scales, amax, and the fractions of elements the scaled rounding overflowed --
saturated at ``fmt.max`` -- or flushed to zero).
"""

from __future__ import annotations

import dataclasses

import torch

from .. import mx
from ..formats import E4M3FN, E5M2, FloatFormat
from ..ops import cast

__all__ = ["ScalingRecipe", "Scaler", "scaling_report", "RECIPES", "grad_recipe"]

RECIPES = ("tensorwise", "delayed", "rowwise", "block")


@dataclasses.dataclass(frozen=True)
class ScalingRecipe:
    """How an operand's scale is chosen (see the module docstring).

    Args:
        kind: ``"tensorwise"``, ``"delayed"``, ``"rowwise"`` or ``"block"``.
        fmt: the format the scaled operand is rounded to (its ``max`` is the target); for
            ``"block"`` a :class:`cpd.mx.BlockFormat` or preset name (``"mxfp8_e4m3"``,
            ``"nvfp4"``, ...; a plain format becomes its MX block format: E8M0 per 32).
        history: delayed only: the amax history length, >= 1.
        margin: the scale is divided by ``2**margin`` (headroom), an int >= 0.
        power_of_two: round the scale down to a power of two.
    """

    kind: str = "tensorwise"
    fmt: FloatFormat = E4M3FN
    history: int = 16
    margin: int = 0
    power_of_two: bool = True

    def __post_init__(self):
        if self.kind not in RECIPES:
            raise ValueError(f"ScalingRecipe kind={self.kind!r}; allowed {list(RECIPES)}")
        if self.kind == "block":
            object.__setattr__(self, "fmt", _block_format(self.fmt))
        else:
            object.__setattr__(self, "fmt", FloatFormat.parse(self.fmt))
        for name, lo in (("history", 1), ("margin", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"ScalingRecipe {name} must be an int >= {lo}, got {v!r}")
        if not isinstance(self.power_of_two, bool):
            raise TypeError(f"ScalingRecipe power_of_two must be a bool, got {type(self.power_of_two).__name__}")

    @classmethod
    def parse(cls, spec) -> "ScalingRecipe | None":
        """A recipe from a ScalingRecipe, a kind name, or None."""
        if spec is None or isinstance(spec, ScalingRecipe):
            return spec
        if isinstance(spec, str):
            return cls(kind=spec)
        raise TypeError(f"scaling must be a ScalingRecipe, one of {list(RECIPES)} or None, got {type(spec).__name__}")

    @property
    def element(self) -> FloatFormat:
        """The format elements are rounded to (``fmt``, or the block format's element)."""
        return self.fmt.element if self.kind == "block" else self.fmt

    def scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """The scale for an amax (a tensor): 1 where amax is 0 or not finite."""
        if self.kind == "block":
            raise ValueError("ScalingRecipe kind='block' takes its scales from cpd.mx (per block), not from an amax")
        s = self.fmt.max / amax.double() / 2.0**self.margin
        if self.power_of_two:
            s = torch.exp2(torch.floor(torch.log2(s)))
        ok = (amax > 0) & torch.isfinite(amax)
        return torch.where(ok, s, torch.ones_like(s)).float()


def _block_format(fmt):
    if isinstance(fmt, mx.BlockFormat):
        return fmt
    if isinstance(fmt, str) and fmt.lower() in mx.PRESETS:
        return mx.PRESETS[fmt.lower()]
    try:
        return mx.BlockFormat(FloatFormat.parse(fmt))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"ScalingRecipe kind='block' fmt={fmt!r}: a cpd.mx.BlockFormat, one of "
                        f"{sorted(mx.PRESETS)} or an element format; {exc}") from None


def grad_recipe(spec) -> "ScalingRecipe | None":
    """A gradient recipe: a ScalingRecipe, or a kind whose format defaults to E5M2 (``"block"``:
    MXFP8 E5M2), or None."""
    if spec is None or isinstance(spec, ScalingRecipe):
        return spec
    if isinstance(spec, str):
        return ScalingRecipe(kind=spec, fmt="mxfp8_e5m2" if spec == "block" else E5M2)
    raise TypeError(f"grad_scaling must be a ScalingRecipe, one of {list(RECIPES)} or None, got "
                    f"{type(spec).__name__}")


class Scaler(torch.nn.Module):
    """One operand's scaling state: the amax history (delayed), the last scale, and counts of
    the elements the scaled rounding sent past ``fmt.max`` (overflow) or to zero (underflow).

    ``quantize``: ``"block"`` only: whether the scaler fake-quantizes the operand (False when the
    GEMM is block-scaled and quantizes it itself; the statistics are kept either way).
    ``round_output``: return ``x * s`` rounded to ``fmt`` (gradients) instead of unrounded.
    """

    def __init__(self, recipe: ScalingRecipe, *, quantize: bool = True, round_output: bool = False):
        super().__init__()
        if not isinstance(recipe, ScalingRecipe):
            raise TypeError(f"recipe must be a ScalingRecipe, got {type(recipe).__name__}")
        self.recipe = recipe
        self.quantize = quantize
        self.round_output = round_output
        self.register_buffer("amax_history", torch.zeros(recipe.history), persistent=True)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64), persistent=True)
        self.last_scale = None
        self.last_amax = 0.0
        self.overflow = 0
        self.underflow = 0
        self.elements = 0

    def _block(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The "block" recipe: statistics from cpd.mx; x fake-quantized (or unchanged)."""
        f = dataclasses.replace(self.recipe.fmt, axis=-1)
        el = f.element
        with torch.no_grad():
            xd = x.detach().float()
            s = mx.scales(xd, f)
            q = mx.cast(xd, f)
            per = s.repeat_interleave(f.block_size, dim=-1)[..., :xd.shape[-1]]
            ratio = xd.abs() / per  # |x| / S: the element before rounding (saturated above el.max)
            if f.tensor_scale and xd.numel():  # NVFP4: over S * T, T = amax / (max_scale * max_elem)
                amax_t = xd.abs().amax()
                if bool(amax_t > 0) and bool(torch.isfinite(amax_t)):
                    ratio = ratio / (amax_t / (f.scale.max * el.max))
            self.overflow += int((ratio > el.max).sum())
            self.underflow += int(((xd != 0) & (q == 0)).sum())
            self.elements += xd.numel()
            self.last_scale = s
            self.last_amax = float(xd.abs().amax()) if xd.numel() else 0.0
            self.calls += 1
        if not self.quantize:
            return x, torch.ones((), device=x.device)
        return mx.cast(x, f), torch.ones((), device=x.device)

    def column(self, x: torch.Tensor) -> torch.Tensor:
        """``"block"``: x fake-quantized in blocks along its second-to-last dim (the column-wise
        copy a weight-gradient GEMM reduces over); statistics are kept by :meth:`forward`."""
        if not self.quantize:
            return x
        return mx.cast(x, dataclasses.replace(self.recipe.fmt, axis=-2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x * s, s): s a scalar tensor, or a column (..., 1) for rowwise; ``"block"``: (the
        block-format values of x, 1). With ``round_output`` x * s is rounded to ``fmt``."""
        r = self.recipe
        if r.kind == "block":
            return self._block(x)
        with torch.no_grad():
            xd = x.detach()
            if r.kind == "rowwise":
                amax = xd.abs().amax(dim=-1, keepdim=True)
                s = r.scale_from_amax(amax)
            else:
                amax = xd.abs().amax() if xd.numel() else torch.zeros((), device=x.device)
                if r.kind == "delayed" and int(self.calls) > 0:
                    s = r.scale_from_amax(self.amax_history.max())
                else:
                    s = r.scale_from_amax(amax)
                self.amax_history.copy_(torch.roll(self.amax_history, 1))
                self.amax_history[0] = amax
            self.calls += 1
            xs = xd * s
            q = cast(xs, r.fmt, saturate=True)
            self.overflow += int((xs.abs() > r.fmt.max).sum())
            self.underflow += int(((xs != 0) & (q == 0)).sum())
            self.elements += xd.numel()
            self.last_scale = s
            self.last_amax = float(amax.max()) if amax.numel() else 0.0
        if self.round_output:
            return q, s
        return x * s, s

    def stats(self) -> dict:
        s = self.last_scale
        if s is not None and s.numel() > 1:
            fin = s[torch.isfinite(s)]
            scale = (float(fin.min()), float(fin.max())) if fin.numel() else (float("nan"), float("nan"))
        else:
            scale = None if s is None else float(s)
        n = max(self.elements, 1)
        return {"recipe": self.recipe.kind, "scale": scale, "amax": self.last_amax,
                "overflow": self.overflow / n, "underflow": self.underflow / n}


def scaling_report(model: torch.nn.Module) -> str:
    """A table of every :class:`Scaler` in ``model``: the layer, the operand (``scale_activation``,
    ``scale_weight``, ``scale_grad`` for the output gradient of the backward GEMMs), the recipe,
    the last scale (min..max for rowwise and block), the last amax and the fractions of elements that overflowed
    ``fmt.max`` or underflowed to zero since the layer was built."""
    rows = [f"{'layer':24s} {'operand':16s} {'recipe':10s} {'scale':>17s} {'amax':>10s} {'overflow':>9s} "
            f"{'underflow':>9s}"]
    for name, m in model.named_modules():
        if isinstance(m, Scaler):
            st = m.stats()
            layer, _, operand = name.rpartition(".")
            sc = st["scale"]
            sc = "-" if sc is None else (f"{sc:.4g}" if isinstance(sc, float) else f"{sc[0]:.3g}..{sc[1]:.3g}")
            rows.append(f"{layer or '.':24s} {operand:16s} {st['recipe']:10s} {sc:>17s} {st['amax']:10.4g} "
                        f"{st['overflow']:9.2%} {st['underflow']:9.2%}")
    return "\n".join(rows)

