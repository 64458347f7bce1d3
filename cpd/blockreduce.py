"""Block scaling in communication: APS at block granularity (one power of two per block).

A :class:`cpd.mx.BlockFormat` given as the ``fmt`` of a reduction (:func:`cpd.allreduce`,
:func:`cpd.aps_allreduce`, :class:`cpd.config.ReduceConfig`) means, for each layer (a (W, n)
matrix of the W workers' flattened gradients ``x_w``):

1. **Blocks.** The flattened layer is split into blocks of ``fmt.block_size`` consecutive
   elements (the last one may be shorter); block ``b`` is the same index range on every worker.
2. **One exponent per block, shared by all workers** (the per-block analogue of APS's per-layer
   exponent, :func:`cpd.aps_exponent`): ``amax_b = max_w max_{i in b} |x_w[i]|`` (an
   allreduce-MAX of one integer per block), ``E_b = ceil(log2(amax_b * W))`` and
   ``s_b = element.emax - E_b - margin``. Then ``|x_w[i]| * 2**s_b * W <= 2**element.emax``, so
   no partial sum of the block can overflow the element format (for ``margin >= 0``).
3. **The scale must be a value of the scale format**: ``2**-s_b`` is clamped to the positive
   powers of two of ``fmt.scale`` (E8M0: 2**-127 .. 2**127); a block whose ideal scale is out of
   that range keeps the nearest one (more underflow for tiny blocks; overflow — reported — only if
   ``amax_b * W`` exceeds ``2**(127 + element.emax)``). An all-zero block, and a block holding
   an inf or NaN (which then reaches the result as in the unscaled sum), gets ``s_b = 0``.
4. Elements: ``x_w[i] * 2**s_b`` (exact, in float64, then float32: exact unless the scaled value
   leaves float32's range), rounded to ``fmt.element`` (``rounding``, ``saturate``), summed in the
   element format in the configured order exactly as :func:`cpd.allreduce` does for a
   :class:`cpd.FloatFormat` (every partial sum rounded to the element format), then unscaled:
   ``result[i] = sum / 2**s_b`` (exact, float64, then float32).

The block format's ``scale_rule`` is not used (the communication rule above replaces OCP MX's
floor rule, which saturates the block maximum and would overflow sums); the block format must
have power-of-two scales (``scale.man == 0``), no tensor scale and ``axis=-1`` (blocks run along
the flattened layer). References: Rouhani et al., "Microscaling Data Formats for Deep Learning",
2023 (blocks sharing a power-of-two scale); Han et al., "APS: Auto Precision Scaling" (the
per-layer rule applied here per block). See docs/collectives.md.
"""

from __future__ import annotations

import math

import torch

from .mx import BlockFormat

__all__ = ["check_block_format", "block_exponents", "block_factors", "scale_range"]


def check_block_format(fmt: BlockFormat) -> BlockFormat:
    """``fmt``, or ValueError when it cannot carry a block-scaled reduction."""
    if fmt.tensor_scale or fmt.scale.man != 0 or fmt.scale_rule == "amax":
        raise ValueError(f"fmt={fmt.name}: block-scaled communication needs power-of-two block scales (scale format "
                         f"with man=0, no tensor scale, scale_rule other than 'amax'), got scale={fmt.scale.name}, "
                         f"scale_rule={fmt.scale_rule!r}, tensor_scale={fmt.tensor_scale}; e.g. cpd.mx.MXFP8_E4M3")
    if fmt.axis != -1:
        raise ValueError(f"fmt={fmt.name}: block-scaled communication blocks the flattened layer; the block format "
                         f"must have axis=-1, got axis={fmt.axis}")
    return fmt


def scale_range(fmt: BlockFormat) -> tuple[int, int]:
    """(k_min, k_max): the powers of two ``2**k`` the scale format holds."""
    sc = fmt.scale
    tiny = sc.smallest_subnormal if sc.subnormals else sc.smallest_normal
    return math.frexp(tiny)[1] - 1, math.frexp(sc.max)[1] - 1


def block_exponents(x: torch.Tensor, fmt: BlockFormat, workers: int, margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-block exponents ``s_b`` (int64, one per block of the flattened (W, n) ``x``) and the
    mask of the blocks that are scaled (nonzero and finite; module docstring, steps 1-3)."""
    w, n = x.shape
    bs = fmt.block_size
    nb = -(-n // bs)
    a = x.abs().amax(0) if w else x.new_zeros(n)
    a = torch.nn.functional.pad(a, (0, nb * bs - n)).reshape(nb, bs).amax(1).double() * workers  # exact (W < 2**29)
    mant, e = torch.frexp(a)  # a = mant * 2**e, mant in [0.5, 1)
    ceil_log2 = torch.where(mant == 0.5, e - 1, e).to(torch.int64)
    k_min, k_max = scale_range(fmt)
    s = (fmt.element.emax - ceil_log2 - margin).clamp(-k_max, -k_min)
    nonzero = (a > 0) & torch.isfinite(a)
    return torch.where(nonzero, s, torch.zeros_like(s)), nonzero


def block_factors(s: torch.Tensor, n: int, block_size: int) -> torch.Tensor:
    """The (n,) float64 factors ``2**s_b`` of every element (exact: an 8-bit scale format keeps
    |s_b| far inside float64's exponent range)."""
    f = torch.pow(2.0, s.to(torch.float64))
    return f.repeat_interleave(block_size)[:n]
