"""Modules that round what flows through a network: :class:`Quantizer`/:func:`quantizer`, the GEMM
configuration :class:`GemmConfig` with :func:`quant_matmul`, and the layers :class:`QuantLinear`
and :class:`QuantConv2d` (the other convolutions are in :mod:`cpd.nn.conv`)."""

from __future__ import annotations

import dataclasses

import torch

from ..formats import FP16, FP32, FloatFormat
from ..ops import add, cast, matmul
from ..rounding import Rounding
from ..tensor_core import FusedDot
from .recipes import Scaler, ScalingRecipe, grad_recipe

__all__ = ["Quantizer", "quantizer", "GemmConfig", "quant_matmul", "QuantLinear", "QuantConv2d"]


class _Quantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd, bwd, fwd_rounding, bwd_rounding, saturate):
        ctx.bwd, ctx.bwd_rounding, ctx.saturate = bwd, bwd_rounding, saturate
        return x if fwd is None else cast(x, fwd, fwd_rounding, saturate=saturate)

    @staticmethod
    def backward(ctx, grad):
        g = grad if ctx.bwd is None else cast(grad, ctx.bwd, ctx.bwd_rounding, saturate=ctx.saturate)
        return g, None, None, None, None, None


def quantizer(x: torch.Tensor, forward_fmt=None, backward_fmt=None, *, forward_rounding="nearest",
              backward_rounding="nearest", saturate: bool = False) -> torch.Tensor:
    """Round ``x`` to ``forward_fmt`` in the forward pass and its gradient to ``backward_fmt`` in
    the backward pass (either may be None: pass through unchanged).

    Stochastic rounding draws from torch's default generator, so ``torch.manual_seed`` makes a
    training run reproducible.
    """
    fwd = None if forward_fmt is None else FloatFormat.parse(forward_fmt)
    bwd = None if backward_fmt is None else FloatFormat.parse(backward_fmt)
    fr, br = Rounding.parse(forward_rounding, "forward_rounding"), Rounding.parse(backward_rounding, "backward_rounding")
    if not isinstance(saturate, bool):
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    return _Quantize.apply(x, fwd, bwd, fr, br, saturate)


class Quantizer(torch.nn.Module):
    """``nn.Module`` form of :func:`quantizer`: rounds activations forward, gradients backward.

    Example:
        >>> q = Quantizer(forward_fmt="e4m3", backward_fmt="e5m2")
        >>> y = q(torch.randn(4, requires_grad=True))
    """

    def __init__(self, forward_fmt=None, backward_fmt=None, *, forward_rounding="nearest",
                 backward_rounding="nearest", saturate: bool = False):
        super().__init__()
        self.forward_fmt = None if forward_fmt is None else FloatFormat.parse(forward_fmt)
        self.backward_fmt = None if backward_fmt is None else FloatFormat.parse(backward_fmt)
        self.forward_rounding = Rounding.parse(forward_rounding, "forward_rounding")
        self.backward_rounding = Rounding.parse(backward_rounding, "backward_rounding")
        if not isinstance(saturate, bool):
            raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
        self.saturate = saturate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_fmt is None and self.backward_fmt is None:
            return x  # nothing to round either way (no autograd node)
        return _Quantize.apply(x, self.forward_fmt, self.backward_fmt, self.forward_rounding,
                               self.backward_rounding, self.saturate)

    def extra_repr(self) -> str:
        f = self.forward_fmt.name if self.forward_fmt else None
        b = self.backward_fmt.name if self.backward_fmt else None
        return f"forward_fmt={f}, backward_fmt={b}, forward_rounding={self.forward_rounding.value}, " \
               f"backward_rounding={self.backward_rounding.value}, saturate={self.saturate}"


# ----------------------------------------------------------------------------- quantized layers
@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """How one GEMM is emulated: the arguments of :func:`cpd.matmul` but the operands.

    ``mul=None`` and ``acc=None`` together mean a plain float32 ``torch.matmul`` (no emulation).
    """

    #: Format every product is rounded to (None: exact products).
    mul: FloatFormat | None = None
    #: Format of the accumulator (None with ``mul=None``: plain float32 torch.matmul), or a
    #: :class:`cpd.FusedDot` (``cpd.tensor_core(...)``): the GEMM of a matrix unit.
    acc: object = None
    #: Fused multiply-add in ``acc`` (requires ``mul=None``).
    fma: bool = False
    #: Kahan-compensated accumulation, every operation rounded to ``acc``.
    kahan: bool = False
    #: Chunked accumulation: sum blocks of this many products, then the block sums.
    block: int | None = None
    #: Rounding mode of every product and addition.
    rounding: Rounding = Rounding.NEAREST

    def __post_init__(self):
        if isinstance(self.acc, FusedDot):  # a matrix unit's fused dot products (cpd.tensor_core)
            if self.mul is not None or self.fma or self.kahan or self.block is not None:
                raise ValueError("acc=FusedDot rounds the whole dot product itself: mul, fma, kahan and block must "
                                 "keep their defaults")
            object.__setattr__(self, "rounding", Rounding.parse(self.rounding))
            return
        for name in ("mul", "acc"):
            v = getattr(self, name)
            if v is not None:
                try:
                    object.__setattr__(self, name, FloatFormat.parse(v))
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"{name}={v!r}: {exc}") from None
        object.__setattr__(self, "rounding", Rounding.parse(self.rounding))
        if self.fma and self.mul is not None:
            raise ValueError(f"fma=True rounds the exact a*b once into acc; mul must be None, got {self.mul.name}")
        if self.block is not None and (isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1):
            raise ValueError(f"block must be a positive int or None, got {self.block!r}")

    @property
    def exact(self) -> bool:
        """True when no rounding is emulated (plain torch.matmul)."""
        return self.mul is None and self.acc is None

    @property
    def fused(self) -> bool:
        """True when ``acc`` is a :class:`cpd.FusedDot` (a matrix unit's model)."""
        return isinstance(self.acc, FusedDot)

    @property
    def epilogue_format(self) -> FloatFormat | None:
        """Format the bias is added in: ``acc``; for a FusedDot its output (FP16 for ``out="f16"``,
        else FP32, the epilogue of a GPU GEMM); None for an exact config."""
        if self.fused:
            return FP16 if self.acc.out == "f16" else FP32
        return self.acc

    def add_bias(self, y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``y + bias`` rounded once to :attr:`epilogue_format` (plain float32 when exact)."""
        fmt = self.epilogue_format
        if fmt is None:
            return y + bias
        return add(y, bias, fmt, self.rounding)

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.exact:
            return torch.matmul(a, b)
        if self.fused:
            return matmul(a, b, acc=self.acc)
        return matmul(a, b, mul=self.mul, acc=self.acc or FP32, fma=self.fma, kahan=self.kahan, block=self.block,
                      rounding=self.rounding)


class _QuantMatmul(torch.autograd.Function):
    """a @ b with the forward GEMM emulated by ``fwd`` and both backward GEMMs by ``bwd``; the
    output gradient first goes through ``grad_scaler`` (a :class:`cpd.nn.recipes.Scaler`) if any."""

    @staticmethod
    def forward(ctx, a, b, fwd: GemmConfig, bwd: GemmConfig, grad_scaler=None):
        ctx.save_for_backward(a, b)
        ctx.bwd, ctx.grad_scaler = bwd, grad_scaler
        with torch.no_grad():
            return _rows_times(fwd, a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga = gb = None
        g_a = g_b = grad
        s = None
        if ctx.grad_scaler is not None:  # g s rounded to the gradient format; results / s
            g_a, s = ctx.grad_scaler(grad)
            g_b = ctx.grad_scaler.column(grad) if ctx.grad_scaler.recipe.kind == "block" else g_a
        if ctx.needs_input_grad[0]:
            ga = _rows_times(ctx.bwd, g_a, b.transpose(-1, -2))
            ga = ga if s is None else ga / s
        if ctx.needs_input_grad[1]:
            gb = ctx.bwd(a.transpose(-1, -2), g_b)
            gb = gb if s is None else gb / s
        return _reduce_to(ga, a.shape), _reduce_to(gb, b.shape), None, None, None


def _rows_times(gemm: GemmConfig, a, b):
    """``gemm(a, b)``; for a 2-D ``b`` and an ``a`` of more dims, as one GEMM of ``a``'s rows
    flattened (an emulated config that is not a FusedDot): every output is the same dot product
    with the same flat index (its stochastic words), so the same bits, without ``b`` copied once
    per batch element."""
    if b.dim() == 2 and a.dim() > 2 and not gemm.exact and not gemm.fused:
        return gemm(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])
    return gemm(a, b)


def _reduce_to(g, shape):
    """Sum a broadcast gradient back to ``shape`` (batch dims of a batched matmul)."""
    if g is None or g.shape == shape:
        return g
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


def quant_matmul(a: torch.Tensor, b: torch.Tensor, forward: GemmConfig = GemmConfig(),
                 backward: GemmConfig | None = None, grad_scaler=None) -> torch.Tensor:
    """``a @ b`` whose forward GEMM is emulated per ``forward`` and whose two backward GEMMs
    (``grad @ b^T`` and ``a^T @ grad``) per ``backward`` (default: the same as forward).

    ``grad_scaler`` (a :class:`cpd.nn.recipes.Scaler` with ``round_output=True``): the output
    gradient ``g`` is scaled and rounded to its recipe's format, both backward GEMMs run on
    it and are divided by the scale (``"block"``: ``g`` fake-quantized in blocks along its last
    dim for ``g @ b^T`` and along its first-to-last dim for ``a^T @ g``, as TransformerEngine's
    MXFP8 recipe keeps row-wise and column-wise copies).

    With exact configs and float64 inputs it is plain ``torch.matmul``: that is the reference
    path ``torch.autograd.gradcheck`` runs on.
    """
    return _QuantMatmul.apply(a, b, forward, forward if backward is None else backward, grad_scaler)


class _QuantMixin:
    """Formats shared by QuantLinear and QuantConv2d (see QuantLinear's docstring)."""

    def _setup_quant(self, mul, acc, weight, activation, grad, backward_mul, backward_acc, kahan, fma, block,
                     rounding):
        self.gemm = GemmConfig(mul, acc, fma, kahan, block, rounding)
        bmul = mul if backward_mul is _SAME else backward_mul
        bacc = acc if backward_acc is _SAME else backward_acc
        self.backward_gemm = GemmConfig(bmul, bacc, fma and bmul is None, kahan, block, rounding)
        try:
            self.weight_fmt = None if weight is None else FloatFormat.parse(weight)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"weight={weight!r}: {exc}") from None
        self.act = Quantizer(activation, grad)

    def _quant_weight(self, w: torch.Tensor) -> torch.Tensor:
        return w if self.weight_fmt is None else quantizer(w, self.weight_fmt)

    def _quant_repr(self) -> str:
        def n(f):
            return None if f is None else f.name if isinstance(f, FloatFormat) else str(f)
        g, b = self.gemm, self.backward_gemm
        return (f"mul={n(g.mul)}, acc={n(g.acc)}, backward_mul={n(b.mul)}, backward_acc={n(b.acc)}, "
                f"weight={n(self.weight_fmt)}, activation={n(self.act.forward_fmt)}, grad={n(self.act.backward_fmt)}, "
                f"kahan={g.kahan}, fma={g.fma}, block={g.block}, rounding={g.rounding.value}")


class _Same:
    def __repr__(self):
        return "<same as forward>"


_SAME = _Same()


class QuantLinear(torch.nn.Linear, _QuantMixin):
    """``nn.Linear`` with its GEMMs, weights, activations and gradients in chosen formats.

    Forward: ``y = bias + Q_act(x) @ Q_w(W)^T`` where ``Q_act`` rounds the input to
    ``activation`` (its gradient to ``grad`` on the way back), ``Q_w`` rounds the weight to
    ``weight`` (straight-through), the GEMM is :func:`cpd.matmul` with ``mul``/``acc``
    (``kahan``, ``fma``, ``block``, ``rounding``), and the bias is added in ``acc`` (one more
    rounded addition). Backward: ``grad_x = g @ W`` and ``grad_W = g^T @ x`` are emulated with
    ``backward_mul``/``backward_acc`` (default: the forward's). Any format may be None (exact).

    ``scaling`` (a :class:`cpd.nn.recipes.ScalingRecipe` or ``"tensorwise"``/``"delayed"``/
    ``"rowwise"``/``"block"``): the input and the weight are multiplied by their scales before
    they are rounded and multiplied, and the result divided by both afterwards (float32);
    ``"block"`` fake-quantizes both to a :class:`cpd.mx.BlockFormat` along the reduction dim
    (unless ``acc`` is a block-scaled tensor core, which quantizes them itself).
    ``grad_scaling`` (a recipe, or ``"tensorwise"``/``"delayed"``/``"block"`` with E5M2 /
    MXFP8-E5M2 gradients): the output gradient of both backward GEMMs is scaled and rounded by
    its own recipe (see :func:`quant_matmul`). The scales and the overflow/underflow they cause
    are in :func:`cpd.nn.scaling_report` (operands ``scale_activation``, ``scale_weight``,
    ``scale_grad``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, mul=None, acc=None, weight=None,
                 activation=None, grad=None, backward_mul=_SAME, backward_acc=_SAME, kahan: bool = False,
                 fma: bool = False, block: int | None = None, rounding="nearest", scaling=None, grad_scaling=None,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._setup_quant(mul, acc, weight, activation, grad, backward_mul, backward_acc, kahan, fma, block, rounding)
        recipe = ScalingRecipe.parse(scaling)
        self.scaling = recipe
        if recipe is not None:  # one state per operand (cpd.nn.recipes); see scaling_report
            own = not (self.gemm.fused and self.gemm.acc.block_scaled)  # a block-scaled GEMM quantizes itself
            self.scale_activation = Scaler(recipe, quantize=own)
            self.scale_weight = Scaler(recipe, quantize=own)
        grecipe = grad_recipe(grad_scaling)
        if grecipe is not None and grecipe.kind == "rowwise":
            raise ValueError("grad_scaling='rowwise' cannot be divided out of the weight gradient g^T x (its rows "
                             "are that GEMM's reduction dim); use 'tensorwise', 'delayed' or 'block'")
        self.grad_scaling = grecipe
        self.scale_grad = None if grecipe is None else Scaler(grecipe, round_output=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scaling is None:
            y = quant_matmul(self.act(x), self._quant_weight(self.weight).t(), self.gemm, self.backward_gemm,
                             self.scale_grad)
        else:  # scale, round, GEMM, unscale: y = (x sx)(W sw)^T / (sx sw)
            xs, sx = self.scale_activation(x)
            ws, sw = self.scale_weight(self.weight)
            y = quant_matmul(self.act(xs), self._quant_weight(ws).t(), self.gemm, self.backward_gemm,
                             self.scale_grad)
            y = y / sx / sw.reshape(-1)
        if self.bias is None:
            return y
        return self.gemm.add_bias(y, self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", " + self._quant_repr()


class QuantConv2d(torch.nn.Conv2d, _QuantMixin):
    """``nn.Conv2d`` as im2col + :func:`cpd.matmul`, with the formats of :class:`QuantLinear`.

    Stride, padding (numbers, pairs, ``"same"``/``"valid"``), dilation and groups are honoured
    (``padding_mode="zeros"`` only). Each output pixel of each group is one dot product over
    ``in_channels/groups * kh * kw`` in ``unfold``'s order (channel, then kernel row, column).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", *, mul=None, acc=None, weight=None,
                 activation=None, grad=None, backward_mul=_SAME, backward_acc=_SAME, kahan: bool = False,
                 fma: bool = False, block: int | None = None, rounding="nearest", device=None, dtype=None):
        if padding_mode != "zeros":
            raise ValueError(f"QuantConv2d supports padding_mode='zeros' only, got {padding_mode!r}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device=device, dtype=dtype)
        self._setup_quant(mul, acc, weight, activation, grad, backward_mul, backward_acc, kahan, fma, block, rounding)

    def _padding_pairs(self, h: int, w: int):
        if isinstance(self.padding, str):
            if self.padding == "valid":
                return (0, 0, 0, 0)
            pads = []  # "same": total padding dilation*(k-1), the extra one at the end (as torch)
            for k, d in zip(self.kernel_size, self.dilation):
                total = d * (k - 1)
                pads.append((total // 2, total - total // 2))
            (t, b), (left, r) = pads
            return (left, r, t, b)
        ph, pw = self.padding
        return (pw, pw, ph, ph)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"QuantConv2d expects input of shape (N, C, H, W), got {tuple(x.shape)}")
        x = self.act(x)
        x = torch.nn.functional.pad(x, self._padding_pairs(x.shape[-2], x.shape[-1]))
        n, c, h, w = x.shape
        kh, kw = self.kernel_size
        cols = torch.nn.functional.unfold(x, (kh, kw), dilation=self.dilation, stride=self.stride)  # (N, C*kh*kw, L)
        ho = (h - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1
        wo = (w - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1
        g = self.groups
        cols = cols.reshape(n, g, (c // g) * kh * kw, ho * wo)                 # (N, G, Cg*kh*kw, L)
        wq = self._quant_weight(self.weight).reshape(g, self.out_channels // g, -1)  # (G, Og, Cg*kh*kw)
        y = quant_matmul(wq, cols, self.gemm, self.backward_gemm)              # (N, G, Og, L)
        y = y.reshape(n, self.out_channels, ho, wo)
        if self.bias is None:
            return y
        return self.gemm.add_bias(y, self.bias.reshape(1, -1, 1, 1))

    def extra_repr(self) -> str:
        return super().extra_repr() + ", " + self._quant_repr()
