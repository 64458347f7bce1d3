# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Tutorial 8: the number formats of 2026 hardware -- FNUZ, P3109, E8M0, MX and NVFP4
#
# **What you will learn**
#
# 1. How cpd names the formats of ml_dtypes, torch and IEEE P3109 (`"e4m3fnuz"`, `"e8m0fnu"`,
#    `"p3109_k8p3se"`), and what their special values are (no -0, one NaN, no zero at all).
# 2. The two new rounding modes, `"nearest_away"` and `"odd"`, and why round-to-odd makes a
#    chain of casts free of double rounding.
# 3. Block-scaled formats with `cpd.mx`: one shared power-of-two scale per 32 elements (OCP MX)
#    or an E4M3 scale per 16 plus a tensor scale (NVFP4); encode to packed codes and back.
# 4. How much error each block format makes on data with outliers, against a per-tensor scale,
#    as a table and a plot.
#
# Run it as a script (`python tutorials/08_block_formats.py`) or as a notebook (`jupytext --to
# notebook`). `CPD_TUTORIAL_SMALL=1` uses small tensors; figures go to `$CPD_TUTORIAL_OUT`.

# %%
import math
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import cpd  # noqa: E402
from cpd import mx  # noqa: E402

SMALL = os.environ.get("CPD_TUTORIAL_SMALL") == "1"
OUT = Path(os.environ.get("CPD_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="cpd_tutorial08_"))
OUT.mkdir(parents=True, exist_ok=True)
print("figures go to", OUT)

# %% [markdown]
# ## 1. Special-value conventions
#
# AMD's MI300 and Graphcore use *FNUZ* fp8: no infinities, no negative zero, and the code of -0
# (0x80) is the one NaN. The MX scale E8M0 is unsigned and has no zero at all. IEEE P3109 puts
# ±inf at the top codes and the NaN at 0x80. cpd parses ml_dtypes' and gfloat's names:

# %%
for name in ("e4m3fn", "e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz", "e8m0fnu", "e2m1fn", "p3109_k8p3se"):
    f = cpd.FloatFormat.parse(name)
    print(f"{name:>14}: {f.name:<13} bits {f.bits}  bias {f.bias:>3}  max {f.max:<10.6g} "
          f"NaN code {f.nan_code}  inf code {f.inf_code}  -0: {f.has_negative_zero}")

x = torch.tensor([-1e-9, -0.0, 250.0, math.inf, -3.0])
print("\ncast to e4m3fnuz:", cpd.cast(x, cpd.E4M3FNUZ).tolist())  # -tiny -> +0, 250 -> NaN (overflow)
print("cast to e8m0fnu: ", cpd.cast(torch.tensor([0.0, 2.0 ** -140, 3.0, 5.0]), cpd.E8M0).tolist())

# %% [markdown]
# `"e2m1"` on its own is an error: it used to mean the MX preset when written `"E2M1"` and the
# IEEE-like format when written `"e2m1"`. The message says which to write instead.

# %%
try:
    cpd.FloatFormat.parse("E2M1")
except ValueError as e:
    print(e)

# %% [markdown]
# ## 2. Ties away from zero, and round to odd
#
# `"nearest_away"` breaks ties away from zero (ml_dtypes and torch do that for E8M0).
# `"odd"` keeps exact values and sends every other one to the neighbour with an odd encoding.
# Rounding to odd in a format with at least two more bits, then to nearest, equals rounding to
# nearest once; rounding to nearest twice does not. Below: float32 values rounded to e5m2 via
# fp16 both ways, compared with the direct cast.

# %%
n = 2_000 if SMALL else 200_000
g = torch.Generator().manual_seed(0)
v = torch.randn(n, generator=g)
direct = cpd.cast(v, cpd.E5M2)
via_nearest = cpd.cast(cpd.cast(v, cpd.FP16), cpd.E5M2)
via_odd = cpd.cast(cpd.cast(v, cpd.FP16, "odd"), cpd.E5M2)
print(f"double rounding through fp16: {int((via_nearest != direct).sum())} of {n} differ from the direct cast")
print(f"round to odd through fp16:    {int((via_odd != direct).sum())} of {n} differ")
ties = torch.tensor([0.28125, -0.28125, 1.125])  # halfway between neighbours of e5m2
print("ties, nearest:", cpd.cast(ties, cpd.E5M2).tolist(), " nearest_away:",
      cpd.cast(ties, cpd.E5M2, "nearest_away").tolist())

# %% [markdown]
# ## 3. Block formats with `cpd.mx`
#
# Each block of 32 shares a power-of-two scale `2^(floor(log2 amax) - emax_elem)`; elements are
# rounded and saturated. `encode` gives packed codes and scale codes; `decode` gives back exactly
# what `cast` gives.

# %%
x = torch.randn(4, 64, generator=g)
x[0, 5] = 40.0  # an outlier in the first block of row 0
enc = mx.encode(x, mx.MXFP4)
codes, scales = enc
print(mx.MXFP4)
print("codes", tuple(codes.shape), codes.dtype, " scales", tuple(scales.shape), "E8M0 codes, row 0:", scales[0].tolist())
print("decode == cast:", torch.equal(mx.decode(enc), mx.cast(x, mx.MXFP4)))
print("first block of row 0:", mx.cast(x, mx.MXFP4)[0, :8].tolist())

# %% [markdown]
# ## 4. Error on data with outliers
#
# Weights and activations of large models have rare large values. A per-tensor scale (one scale
# for the whole tensor, as plain fp8 training does) must cover the outliers, so small values lose
# their bits; a block scale only spends range where the outlier is. The table gives the relative
# RMS error of each format on Gaussian data with 0.1% outliers 100x larger: over all values
# (dominated by the outliers) and over the bulk (the values that are not outliers).

# %%
rows = 64 if SMALL else 1024
data = torch.randn(rows, 1024, generator=g)
mask = torch.rand(rows, 1024, generator=g) < 1e-3
data = torch.where(mask, data * 100, data)


def rel_rms(y, sel=None):
    d, r = (data, y) if sel is None else (data[sel], y[sel])
    return float(((r - d).pow(2).mean() / d.pow(2).mean()).sqrt())


def per_tensor(fmt):
    s = 2.0 ** (math.floor(math.log2(float(data.abs().max()))) - math.floor(math.log2(fmt.max)))
    return cpd.cast(data / s, fmt, saturate=True) * s


bulk = ~mask
results = []
for name, y, bits in [("e4m3fn, one scale per tensor", per_tensor(cpd.E4M3FN), 8.0),
                      ("e2m1fn, one scale per tensor", per_tensor(cpd.E2M1), 4.0)] + \
        [(f.name, mx.cast(data, f), f.bits_per_element) for f in (mx.MXFP8_E4M3, mx.MXFP8_E5M2, mx.MXFP6_E3M2,
                                                                  mx.MXFP6_E2M3, mx.MXFP4, mx.MXINT8, mx.NVFP4)]:
    results.append((name, bits, rel_rms(y), rel_rms(y, bulk)))
print(f"{'format':<32}{'bits/elem':>10}{'rel. RMS, all':>15}{'rel. RMS, bulk':>16}")
for name, bits, err, err_bulk in results:
    print(f"{name:<32}{bits:>10.4g}{err:>15.3e}{err_bulk:>16.3e}")

fig, ax = plt.subplots(figsize=(7, 3.5))
ax.barh([r[0] for r in results], [r[3] for r in results], color=["gray", "gray"] + ["C0"] * 7)
ax.set_xscale("log")
ax.set_xlabel("relative RMS error of the bulk (log scale)")
ax.set_title("Per-tensor vs per-block scaling, Gaussian data with 0.1% outliers")
fig.tight_layout()
fig.savefig(OUT / "block_formats_error.png", dpi=100)
print("saved", OUT / "block_formats_error.png")

# %% [markdown]
# Reading the table: with 4-bit elements one scale per tensor leaves nothing for the bulk (every
# ordinary value rounds to zero, relative error 1); a scale per block of 32 (MXFP4) or 16 with an
# E4M3 scale (NVFP4) keeps it. E4M3's own exponent range is wide enough that a per-tensor scale
# is competitive at 8 bits; the integer elements of MXINT8 are the most precise near each block's
# maximum but lose the small values of a block.
#
# ## What next
#
# * docs/formats.md: every convention, name and preset; docs/mx.md: the shared-scale rules
#   (`"floor"`, `"ceil"`, `"even"`, `"amax"`), packing, NVFP4's two levels.
# * `cpd.testing.formats(specials=(..., "fnuz", "p3109", "fnu"), signed=(True, False))` and
#   `cpd.testing.block_formats()` give hypothesis strategies for your own tests.
