"""Gradient scaling for low-precision allreduce: APS (per-layer power-of-two scaling) and loss scaling.

:func:`aps_allreduce` is Algorithm 1 of the APS paper (Auto Precision Scaling): per layer, find the
largest exponent of |g| * W over all workers (an allreduce-MAX of one integer per layer), scale the
layer by the largest power of two that keeps the W-worker sum below the format's top, cast,
reduce in the low-precision format, cast back and unscale. :class:`LossScaler` is the baseline it
is compared against: one global power-of-two scale for every layer, static or dynamic (the
contract of ``torch.amp.GradScaler``: skip the step and back off on inf/NaN, grow after
``growth_interval`` clean steps).
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from .collectives import ALGORITHMS, reduce_blocks, reduce_matrix
from .config import ReduceConfig, make_config
from .formats import FP32
from .ops import cast
from .primitives import aps_exponent, match_prefix, stack_workers
from .mx import BlockFormat
from .report import RoundoffReport, ScalingComparison, layer_stats
from .rounding import Rounding

__all__ = ["aps_allreduce", "aps_exponent", "LossScaler", "scaled_allreduce", "loss_scaler_for", "compare_scalings"]


def _reduce_scaled(x: torch.Tensor, cfg: ReduceConfig, s: int, generator):
    """Multiply by 2**s, cast to fmt, reduce in fmt, cast back to float32 and divide by 2**s."""
    f = 2.0 ** s
    scaled = (x.double() * f).to(torch.float32)  # exact unless it under/overflows float32 (see docstring)
    low = cast(scaled, cfg.fmt, cfg.rounding, saturate=cfg.saturate, generator=generator)
    red = reduce_matrix(low, cfg, generator=generator, inputs_in_fmt=True)
    return (red.double() / f).to(torch.float32), scaled, low


def _collect(layers) -> dict:
    if not isinstance(layers, dict):
        raise TypeError(f"layers must be a dict {{name: list of per-worker tensors}}, got {type(layers).__name__}")
    return layers


def _worker_matrix(name: str, grads) -> tuple[torch.Tensor | None, torch.Size | None, int]:
    """(W, n) float32 matrix of a layer (None entries as zeros), its shape, and W; None if skipped."""
    if grads is None:
        return None, None, 0
    if isinstance(grads, torch.Tensor):
        x, shape = stack_workers(grads)
        return x, shape, x.shape[0]
    if not isinstance(grads, (list, tuple)):
        raise TypeError(f"layers[{name!r}] must be a list of per-worker tensors (or None), got {type(grads).__name__}")
    present = [g for g in grads if g is not None]
    if not grads:
        raise ValueError(f"layers[{name!r}] is an empty list; need one tensor per worker")
    if not present:
        return None, None, len(grads)
    filled = [g if g is not None else torch.zeros_like(present[0]) for g in grads]
    try:
        x, shape = stack_workers(filled)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"layers[{name!r}]: {exc}") from None
    return x, shape, len(grads)


def _config(fmt, config, what: str, kw: dict) -> ReduceConfig:
    """The ReduceConfig of a scaled reduction from ``fmt``/``config`` and the keyword options."""
    cfg = make_config(fmt, config=config, what=what, **kw)
    if not isinstance(cfg, ReduceConfig):
        raise TypeError(f"{what} reduces in a format: give fmt= or a cpd.config.ReduceConfig, not "
                        f"{type(cfg).__name__}")
    return cfg.require(ALGORITHMS, f"the emulator ({what})")


@torch.no_grad()
def _run(layers, cfg: ReduceConfig, exponent_of, method, generator, all_fp32=False):
    layers = _collect(layers)
    fmt = cfg.element  # the format values are rounded to (a block format's element format)
    if generator is not None and cfg.rounding is not Rounding.STOCHASTIC:
        raise ValueError(f"generator only applies to rounding='stochastic', got rounding={cfg.rounding.value!r}")
    unknown = [p for p in cfg.fp32_layers if not any(match_prefix(n, p) for n in layers)]
    if unknown:
        raise ValueError(f"fp32_layers names layers that are not in layers: {sorted(unknown)}")
    # float32 layers: the same order in float32 (nearest, no saturation), as allreduce(x, FP32, ...).
    cfg32 = dataclasses.replace(cfg, fmt=FP32, rounding=Rounding.NEAREST, saturate=False)
    out, rows, workers = {}, {}, None
    for name, grads in layers.items():
        x, shape, w = _worker_matrix(name, grads)
        if workers is None and w:
            workers = w
        elif w and w != workers:
            raise ValueError(f"layers[{name!r}] has {w} workers but an earlier layer has {workers}")
        # 1. None gradients: skip.
        if x is None:
            out[name] = None
            rows[name] = layer_stats(name, "skipped", torch.zeros(max(w, 1), 0), torch.zeros(0), fmt)
            continue
        # 2. inf/NaN: never cast or scale; the float32 sum (inf/NaN visible) is returned and flagged.
        if not torch.isfinite(x).all():
            res = x.sum(0)
            warnings.warn(f"{method}_allreduce: layer {name!r} has {int((~torch.isfinite(x)).sum())} inf/NaN "
                          "gradient elements; returned its float32 sum unscaled (see the report)",
                          RuntimeWarning, stacklevel=3)
            out[name] = res.reshape(shape)
            rows[name] = layer_stats(name, "nonfinite", x, res, fmt)
            continue
        # 3. Layers kept in float32 (and every layer during the hybrid FP32 phase).
        if all_fp32 or cfg.is_fp32_layer(name):
            res = reduce_matrix(x, cfg32)
            out[name] = res.reshape(shape)
            rows[name] = layer_stats(name, "fp32", x, res, fmt)
            continue
        # 4'. Block format: one exponent per block (cpd.blockreduce); an all-zero layer stays zero.
        if cfg.is_block:
            res, sb, nz, scaled, low = reduce_blocks(x, cfg, generator=generator)
            out[name] = res.reshape(shape)
            if not bool(nz.any()):
                rows[name] = layer_stats(name, "zero", x, res, fmt, None, x, res.new_zeros(x.shape))
                continue
            rows[name] = layer_stats(name, "lowp", x, res, fmt, int(sb[nz].min()), scaled, low)
            rows[name].block_scale_exps = (int(sb[nz].min()), int(sb[nz].max()))
            continue
        s = exponent_of(x, w)
        # 4. All-zero layer: nothing to scale (no log of 0, no NaN); the result is zero.
        if s is None:
            res = reduce_matrix(x, cfg, generator=generator)
            out[name] = res.reshape(shape)
            rows[name] = layer_stats(name, "zero", x, res, fmt, None, x, res.new_zeros(x.shape))
            continue
        # 5. Everything else (tiny gradients included: s may be large, the scaling is exact).
        res, scaled, low = _reduce_scaled(x, cfg, s, generator)
        out[name] = res.reshape(shape)
        rows[name] = layer_stats(name, "lowp", x, res, fmt, s, scaled, low)
    if cfg.is_block:
        method = f"{method} per block ({cfg.fmt.name})"
    return out, RoundoffReport(rows, fmt, cfg.algorithm, workers or 0, method, cfg.group_size)


def aps_allreduce(layers: dict, fmt=None, *, algorithm: str = "ring", group_size: int | None = None,
                  kahan: bool = False, rounding="nearest", saturate: bool = False,
                  generator: torch.Generator | None = None, margin: int = 0, fp32_layers=(),
                  step: int | None = None, fp32_steps: int = 0, config: ReduceConfig | None = None):
    """APS (the APS paper's Algorithm 1): per-layer power-of-two scaling around a low-precision allreduce.

    For each layer (its W per-worker gradients ``g_w``):

    1. ``max_exp = max_w ceil(log2(max|g_w| * W))`` (FINDMAXEXP of grad * world_size, then
       allreduce-MAX across workers; computed exactly from the float's exponent);
    2. ``s = fmt.emax - max_exp - margin`` (the paper's ``upper_bound - max_exp``; ``fmt.emax`` is
       2**(exp_bits-1) - 1 for IEEE formats with the default bias, see :func:`aps_exponent`);
    3. ``g_w * 2**s``, cast to ``fmt`` (``rounding``), :func:`cpd.allreduce` in ``fmt`` with
       ``algorithm``/``group_size``/``kahan`` (inputs already in fmt), cast back to float32 and
       divide by ``2**s``.

    Edge cases, in the order the code handles them:

    * ``None`` gradients: a layer given as ``None`` or whose workers' tensors are all ``None`` is
      skipped (output ``None``, report status ``"skipped"``); a ``None`` entry among tensors is a
      worker without that gradient and counts as zeros.
    * inf/NaN: a layer with any inf/NaN element is not scaled or cast; its output is the float32
      sum over workers (so the inf/NaN is visible, never hidden or turned into a finite value), a
      ``RuntimeWarning`` is issued and the report marks it ``"nonfinite"`` (``report.found_inf``).
    * float32 layers: layers named in ``fp32_layers`` (the paper keeps the last classifier in
      FP32), and every layer while ``step < fp32_steps`` (the paper's hybrid schedule: FP32 for
      the first steps, then low precision), are reduced with the same algorithm in float32.
    * all-zero layer: max_exp would be -inf; no scaling is applied (``scale_exp`` None) and the
      result is zero, never NaN.
    * tiny gradients: s can exceed float32's exponent range (e.g. 2**150 for gradients near
      2**-140); the scaling is done in float64 and is exact, since the scaled values are at most
      2**emax. Values so small relative to the layer's maximum that they fall below fmt's smallest
      subnormal still underflow to 0 (counted in ``underflow_frac``); large gradients give a
      negative s and scaled values under float32's subnormal range are rounded to float32 before
      the cast (only visible with directed rounding of values far below fmt's range).
    * margin: ``margin`` > 0 scales by 2**-margin less, leaving head room (e.g. for stochastic
      rounding); 0 is the paper's choice. No overflow is possible for margin >= 0.

    **Block formats** (``fmt`` a :class:`cpd.mx.BlockFormat` such as ``cpd.mx.MXFP8_E4M3``): APS at
    block granularity — steps 1-3 per block of ``block_size`` consecutive elements of the flattened
    layer instead of per layer (``s_b = element.emax - ceil(log2(max_w amax_b * W)) - margin``,
    clamped to the scale format's range), as :mod:`cpd.blockreduce` defines; the report's
    ``scale_exp`` is the smallest block exponent (the per-layer APS exponent unless clamped) and
    ``block_scale_exps`` the (min, max) over the nonzero blocks; its ``fmt`` is the element format.

    Args:
        layers: ``{name: [W tensors]}`` (or a (W, ...) tensor, or None) of per-worker gradients.
        fmt: the low-precision format (a :class:`cpd.FloatFormat`, or a :class:`cpd.mx.BlockFormat`).
        algorithm, group_size, kahan: passed to :func:`cpd.allreduce`.
        rounding, saturate, generator: rounding of the cast and of every addition.
        margin: extra power-of-two head room (an int >= 0 recommended; negative allowed).
        fp32_layers: names of layers reduced in float32 (or name prefixes: ``"fc"`` covers
            ``"fc.weight"``); each must match a layer.
        step, fp32_steps: hybrid schedule; with ``step < fp32_steps`` every layer is float32.
        config: a :class:`cpd.config.ReduceConfig` instead of ``fmt`` and the options (its
            ``hybrid_steps`` is ``fp32_steps``); may also be given in place of ``fmt``.

    Returns:
        ``(reduced, report)``: ``{name: summed float32 tensor or None}`` and a
        :class:`~cpd.report.RoundoffReport`.
    """
    if isinstance(fp32_steps, bool) or not isinstance(fp32_steps, int) or fp32_steps < 0:
        raise ValueError(f"fp32_steps must be an int >= 0, got {fp32_steps!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"step must be an int or None, got {type(step).__name__}")
    cfg = _config(fmt, config, "aps_allreduce()", dict(
        algorithm=algorithm, group_size=group_size, kahan=kahan, rounding=rounding, saturate=saturate,
        margin=margin, fp32_layers=fp32_layers, hybrid_steps=fp32_steps))
    all_fp32 = step is not None and step < cfg.hybrid_steps
    return _run(layers, cfg, lambda x, w: aps_exponent(x, cfg.fmt, w, cfg.margin), "aps", generator, all_fp32)


def scaled_allreduce(layers: dict, fmt=None, scale_exp: int = 0, *, algorithm: str = "ring",
                     group_size: int | None = None, kahan: bool = False, rounding="nearest",
                     saturate: bool = False, generator: torch.Generator | None = None, fp32_layers=(),
                     config: ReduceConfig | None = None):
    """Every layer scaled by the same ``2**scale_exp`` (0: no scaling), cast, reduced, unscaled.

    The baseline APS is compared against; edge cases as :func:`aps_allreduce` (None skipped,
    inf/NaN layers returned as their float32 sum and flagged, all-zero layers stay zero). Overflow
    is not prevented: scaled values beyond ``fmt.max`` become inf (or NaN / ±max, as
    :func:`cpd.cast` says) and show in ``report.found_inf`` / ``overflow_count``. ``config``: as
    :func:`aps_allreduce` (its ``margin``, ``scaling`` and ``hybrid_steps`` are not used here).
    """
    if isinstance(scale_exp, bool) or not isinstance(scale_exp, int):
        raise TypeError(f"scale_exp must be an int, got {type(scale_exp).__name__}")
    cfg = _config(fmt, config, "scaled_allreduce()", dict(
        algorithm=algorithm, group_size=group_size, kahan=kahan, rounding=rounding, saturate=saturate,
        fp32_layers=fp32_layers))
    if cfg.is_block:
        raise ValueError(f"fmt={cfg.fmt.name} is a block format, which scales every block itself; a global scale "
                         "(scaled_allreduce, cpd.LossScaler) takes a cpd.FloatFormat such as its element format "
                         f"{cfg.element.name}; for block scaling use cpd.allreduce or cpd.aps_allreduce")
    exp = lambda x, w: scale_exp if bool((x != 0).any()) else None  # noqa: E731
    return _run(layers, cfg, exp, "scaled" if scale_exp else "unscaled", generator)


def _pow2_exponent(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a positive power of two, got {v!r}")
    m, e = math.frexp(v)
    if m != 0.5:
        raise ValueError(f"{name}={v!r} is not a power of two; a power-of-two scale keeps scaling exact")
    return e - 1


def loss_scaler_for(scaling, loss_scaler):
    """The :class:`LossScaler` a front end uses: ``loss_scaler`` (default ``LossScaler()``) with
    ``scaling="loss"``, None otherwise (then ``loss_scaler`` must be None)."""
    if loss_scaler is not None and scaling != "loss":
        raise ValueError("loss_scaler is only used with scaling='loss'")
    if loss_scaler is not None and not isinstance(loss_scaler, LossScaler):
        raise TypeError(f"loss_scaler must be a cpd.LossScaler, got {type(loss_scaler).__name__}")
    return (loss_scaler or LossScaler()) if scaling == "loss" else None


class LossScaler:
    """One global power-of-two gradient scale around the cast and the low-precision allreduce.

    Contract (that of ``torch.amp.GradScaler``):

    * :meth:`allreduce` multiplies every layer by ``scale``, casts, reduces in ``fmt``, casts back
      and divides by ``scale``; it records whether any inf/NaN appeared (in the gradients, or from
      an overflow of the cast or of a partial sum) in :attr:`found_inf`.
    * :meth:`update` returns whether the step should be applied. Dynamic mode: on inf/NaN the step
      is skipped (False), ``scale *= backoff_factor`` and the clean-step counter resets; otherwise
      the counter grows and after ``growth_interval`` consecutive clean steps ``scale *=
      growth_factor`` (counter reset). Static mode (``dynamic=False``): the scale never changes;
      steps with inf/NaN are still reported as skipped (False).

    Scale, growth and backoff factors must be powers of two so that scaling is exact.

    Example:
        >>> scaler = LossScaler(init_scale=2**16)
        >>> out, report = scaler.allreduce(layers, cpd.E5M2)       # doctest: +SKIP
        >>> if scaler.update(): optimizer_step(out)                 # doctest: +SKIP
    """

    def __init__(self, init_scale: float = 2.0 ** 16, dynamic: bool = True, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        self._exp = _pow2_exponent("init_scale", init_scale)
        self._grow = _pow2_exponent("growth_factor", growth_factor)
        self._back = _pow2_exponent("backoff_factor", backoff_factor)
        if self._grow <= 0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if self._back >= 0:
            raise ValueError(f"backoff_factor must be < 1, got {backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be an int >= 1, got {growth_interval!r}")
        if not isinstance(dynamic, bool):
            raise TypeError(f"dynamic must be a bool, got {type(dynamic).__name__}")
        self.dynamic, self.growth_interval = dynamic, growth_interval
        #: Consecutive clean steps since the last change of scale.
        self.growth_tracker = 0
        #: Whether the last :meth:`allreduce` saw inf/NaN (None before the first call).
        self.found_inf: bool | None = None

    @property
    def scale(self) -> float:
        """The current scale, a power of two."""
        return 2.0 ** self._exp

    @property
    def scale_exp(self) -> int:
        """log2 of the current scale."""
        return self._exp

    def allreduce(self, layers: dict, fmt, **kwargs):
        """:func:`scaled_allreduce` with ``2**scale_exp``; records :attr:`found_inf`. Returns
        ``(reduced, report)``."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # inf/NaN is this class's business
            out, report = scaled_allreduce(layers, fmt, self._exp, **kwargs)
        report.method = f"loss-scaled (2^{self._exp})"
        self.found_inf = report.found_inf
        return out, report

    def update(self, found_inf: bool | None = None) -> bool:
        """Adjust the scale after a step; return True if the step should be applied (no inf/NaN).

        ``found_inf`` defaults to what the last :meth:`allreduce` recorded.
        """
        inf = self.found_inf if found_inf is None else bool(found_inf)
        if inf is None:
            raise RuntimeError("LossScaler.update() called before allreduce() and without found_inf")
        self.found_inf = None
        if not self.dynamic:
            return not inf
        if inf:
            self._exp += self._back
            self.growth_tracker = 0
            return False
        self.growth_tracker += 1
        if self.growth_tracker >= self.growth_interval:
            self._exp += self._grow
            self.growth_tracker = 0
        return True

    def state_dict(self) -> dict:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker, "dynamic": self.dynamic,
                "growth_factor": 2.0 ** self._grow, "backoff_factor": 2.0 ** self._back,
                "growth_interval": self.growth_interval}

    def load_state_dict(self, state: dict) -> None:
        self._exp = _pow2_exponent("scale", state["scale"])
        self.growth_tracker = int(state["growth_tracker"])

    def __repr__(self) -> str:
        return (f"LossScaler(scale=2^{self._exp}, dynamic={self.dynamic}, growth_tracker={self.growth_tracker}/"
                f"{self.growth_interval})")


def compare_scalings(layers: dict, fmt, *, loss_scale_exp: int | None = None, algorithm: str = "ring",
                     group_size: int | None = None, kahan: bool = False, rounding="nearest", margin: int = 0,
                     generator: torch.Generator | None = None):
    """Round-off of the same gradients under per-layer APS, per-block (MX-style) APS and loss scaling.

    ``fmt`` is a :class:`cpd.mx.BlockFormat` with power-of-two scales (e.g. ``cpd.mx.MXFP8_E4M3``);
    the three reductions share its element format, the summation order and the rounding:

    * ``"aps per layer"``: :func:`aps_allreduce` in ``fmt.element`` (one power of two per layer);
    * ``"aps per block"``: :func:`aps_allreduce` in ``fmt`` (one per block, :mod:`cpd.blockreduce`);
    * ``"loss scaling"``: :func:`scaled_allreduce` in ``fmt.element`` with one global exponent,
      ``loss_scale_exp`` or by default the largest that cannot overflow any layer (the smallest
      per-layer APS exponent: the best a static loss scale can do on these gradients).

    Returns a :class:`~cpd.report.ScalingComparison` (``print`` it; ``.plot(path)``). Stochastic
    rounding draws from ``generator`` in that order. Inputs are never modified.
    """
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"fmt must be a cpd.mx.BlockFormat (e.g. cpd.mx.MXFP8_E4M3), got {type(fmt).__name__}")
    if loss_scale_exp is not None and (isinstance(loss_scale_exp, bool) or not isinstance(loss_scale_exp, int)):
        raise TypeError(f"loss_scale_exp must be an int or None, got {type(loss_scale_exp).__name__}")
    opts = dict(algorithm=algorithm, group_size=group_size, kahan=kahan, rounding=rounding, generator=generator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf/NaN layers show in every report
        _, layer = aps_allreduce(layers, fmt.element, margin=margin, **opts)
        _, block = aps_allreduce(layers, fmt, margin=margin, **opts)
        if loss_scale_exp is None:
            exps = [r.scale_exp for r in layer if r.status == "lowp"]
            loss_scale_exp = min(exps) if exps else 0
        _, loss = scaled_allreduce(layers, fmt.element, loss_scale_exp, **opts)
    loss.method = f"loss scaling (2^{loss_scale_exp})"
    title = (f"{layer.workers} workers, {algorithm}, {fmt.element.name} elements; per block: {fmt.name} "
             f"(blocks of {fmt.block_size}, {fmt.scale.name} scales)")
    return ScalingComparison({"aps per layer": layer, "aps per block": block,
                              f"loss scaling 2^{loss_scale_exp}": loss}, title)
