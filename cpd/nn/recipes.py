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
* ``power_of_two=True`` rounds ``s`` down to a power of two (scaling is then exact).

``"block"`` (MX-style block scales) needs the block-scaled formats of ``cpd.mx`` and is not
available yet. :class:`Scaler` holds one operand's state and statistics; :func:`scaling_report`
gathers them per layer.
"""

from __future__ import annotations

import dataclasses

import torch

from ..formats import E4M3FN, FloatFormat
from ..ops import cast

__all__ = ["ScalingRecipe", "Scaler", "scaling_report", "RECIPES"]

RECIPES = ("tensorwise", "delayed", "rowwise")


@dataclasses.dataclass(frozen=True)
class ScalingRecipe:
    """How an operand's scale is chosen (see the module docstring).

    Args:
        kind: ``"tensorwise"``, ``"delayed"`` or ``"rowwise"``.
        fmt: the format the scaled operand is rounded to (its ``max`` is the target).
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
        if self.kind == "block":
            raise ValueError("ScalingRecipe kind='block' needs cpd.mx block-scaled formats, not available yet; "
                             f"allowed {list(RECIPES)}")
        if self.kind not in RECIPES:
            raise ValueError(f"ScalingRecipe kind={self.kind!r}; allowed {list(RECIPES)}")
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

    def scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """The scale for an amax (a tensor): 1 where amax is 0 or not finite."""
        s = self.fmt.max / amax.double() / 2.0**self.margin
        if self.power_of_two:
            s = torch.exp2(torch.floor(torch.log2(s)))
        ok = (amax > 0) & torch.isfinite(amax)
        return torch.where(ok, s, torch.ones_like(s)).float()


class Scaler(torch.nn.Module):
    """One operand's scaling state: the amax history (delayed), the last scale, and counts of
    the elements the scaled rounding sent past ``fmt.max`` (overflow) or to zero (underflow)."""

    def __init__(self, recipe: ScalingRecipe):
        super().__init__()
        if not isinstance(recipe, ScalingRecipe):
            raise TypeError(f"recipe must be a ScalingRecipe, got {type(recipe).__name__}")
        self.recipe = recipe
        self.register_buffer("amax_history", torch.zeros(recipe.history), persistent=True)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64), persistent=True)
        self.last_scale = None
        self.last_amax = 0.0
        self.overflow = 0
        self.underflow = 0
        self.elements = 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x * s, s): s a scalar tensor, or a column (..., 1) for rowwise."""
        r = self.recipe
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
        return x * s, s

    def stats(self) -> dict:
        s = self.last_scale
        scale = None if s is None else (float(s) if s.numel() == 1 else (float(s.min()), float(s.max())))
        n = max(self.elements, 1)
        return {"recipe": self.recipe.kind, "scale": scale, "amax": self.last_amax,
                "overflow": self.overflow / n, "underflow": self.underflow / n}


def scaling_report(model: torch.nn.Module) -> str:
    """A table of every :class:`Scaler` in ``model``: the layer, the operand, the recipe, the last
    scale (min..max for rowwise), the last amax and the fractions of elements that overflowed
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

