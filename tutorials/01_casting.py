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
# # Tutorial 1: casting to custom floating-point formats
#
# **What you will learn**
#
# 1. How cpd describes a floating-point format, and how to read its properties
#    (`max`, `smallest_normal`, `smallest_subnormal`, `eps`, specials).
# 2. How to cast a tensor with each rounding mode, and what happens at overflow and underflow.
# 3. How to look at the bits of a rounded value with `cpd.bits`, `cpd.encode` and `cpd.decode`.
# 4. What stochastic rounding does, seen in a histogram, and why it is unbiased.
# 5. How to check cpd against torch's own float16, bfloat16 and float8 casts.
# 6. How fast a cast is compared with a plain memory copy.
#
# Run it as a script (`python tutorials/01_casting.py`) or as a notebook
# (`jupytext --to notebook tutorials/01_casting.py`). `CPD_TUTORIAL_SMALL=1` uses small tensors
# so that it finishes in a few seconds; figures go to `$CPD_TUTORIAL_OUT` (default: a new
# temporary folder).

# %%
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

if "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")  # write files; never open a window
import matplotlib.pyplot as plt
import torch

import cpd

SMALL = os.environ.get("CPD_TUTORIAL_SMALL") == "1"
N = 2**12 if SMALL else 2**20  # samples for the statistics and the torch comparison
N_SPEED = 2**16 if SMALL else 2**24  # elements for the speed check
OUT = Path(os.environ.get("CPD_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="cpd_tutorial_"))
OUT.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
print(f"cpd {cpd.__version__}, torch {torch.__version__}, small={SMALL}, figures in {OUT}")

# %% [markdown]
# ## 1. Formats and their properties
#
# A format is one sign bit, `exp` exponent bits and `man` mantissa bits, with a bias and a
# convention for special values. `FloatFormat(5, 2)` is the IEEE-like 8-bit format E5M2. Its
# properties are named like `torch.finfo`'s.

# %%
fmt = cpd.FloatFormat(5, 2)
print(fmt)
print("equal to the preset:", fmt == cpd.E5M2, "| parsed from a name:", cpd.FloatFormat.parse("e5m2") == fmt)
print("bits", fmt.bits, "| max", fmt.max, "| smallest normal", fmt.smallest_normal,
      "| smallest subnormal", fmt.smallest_subnormal, "| eps", fmt.eps)

# %% [markdown]
# The `specials` argument decides which codes are not numbers: `"ieee"` reserves the top
# exponent for ±inf and NaN, `"fn"` (OCP E4M3FN) keeps only one NaN code and no infinity, and
# `"finite"` (MX FP6/FP4) makes every code a number. Same bits, different ranges:

# %%
for specials in ("ieee", "fn", "finite"):
    f = cpd.FloatFormat(4, 3, specials=specials)
    print(f"{f.name:11s} max {f.max:6g}  inf: {f.has_inf!s:5}  NaN: {f.has_nan}")

print()
print(f"{'preset':8s} {'name':11s} {'bits':>4s} {'max':>14s} {'smallest subnormal':>19s} {'eps':>10s}")
for name, f in cpd.PRESETS.items():
    print(f"{name:8s} {f.name:11s} {f.bits:4d} {f.max:14.6g} {f.smallest_subnormal:19.6g} {f.eps:10.3g}")

# %% [markdown]
# ## 2. Casting with each rounding mode
#
# `cpd.cast(x, fmt, rounding)` returns float32 values that are exactly representable in `fmt`.
# The values below exercise the interesting cases: an ordinary number, an overflow (e5m2's
# largest value is 57344, and round to nearest overflows from 61440 on), a value below half the
# smallest subnormal, a value just above half of it (the classic double-rounding trap), an
# infinity and a NaN.

# %%
values = [0.3, 65000.0, 1e-6, 2.0**-17 * (1 + 2.0**-23), -math.inf, math.nan, -1e-30]
x = torch.tensor(values)
modes = [m.value for m in cpd.Rounding]
print(f"{'x':>14s} " + " ".join(f"{m:>12s}" for m in modes))
results = {m: cpd.cast(x, cpd.E5M2, m, generator=torch.Generator().manual_seed(0) if m == "stochastic" else None)
           for m in modes}
for i, v in enumerate(values):
    print(f"{v:14.6g} " + " ".join(f"{results[m][i].item():12.6g}" for m in modes))

# The double-rounding trap: 2^-17 * (1 + 2^-23) is just above half of 2^-16, so it rounds up.
assert results["nearest"][3].item() == 2.0**-16
# Toward zero never overflows to infinity; round to nearest does.
assert results["toward_zero"][1].item() == cpd.E5M2.max and math.isinf(results["nearest"][1].item())
# Signs of zeros are kept.
assert math.copysign(1, results["nearest"][6].item()) == -1

# %% [markdown]
# Overflow depends on the convention and on `saturate`: `ieee` formats give ±inf, `fn` formats
# NaN and `finite` formats ±max; `saturate=True` gives ±max everywhere (and maps ±inf inputs to
# ±max too). With `saturate=True`, cpd's E4M3FN cast is the same as torch's `float8_e4m3fn`.

# %%
big = torch.tensor([1e6, -1e6, math.inf])
for f in (cpd.E5M2, cpd.E4M3FN, cpd.E2M1):
    print(f"{f.name:11s} nearest {cpd.cast(big, f).tolist()}   saturate {cpd.cast(big, f, saturate=True).tolist()}")

# %% [markdown]
# ## 3. Bit views
#
# `cpd.bits` prints the encoding of each rounded value as `sign | exponent | mantissa`;
# `cpd.encode` gives the integer codes (uint8 for 8-bit formats) and `cpd.decode` turns them
# back into values.

# %%
print(cpd.bits(torch.tensor([0.3, 1.0, -2.5, 57344.0, 2.0**-16]), cpd.E5M2))
print(cpd.bits(torch.tensor([0.3, 448.0, 500.0]), cpd.E4M3FN))

codes = cpd.encode(torch.tensor([0.3, -2.5]), cpd.E5M2)
print("codes", [f"0x{c:02x}" for c in codes.tolist()], "-> values", cpd.decode(codes, cpd.E5M2).tolist())

# Every one of the 256 E4M3FN codes decodes to a value that encodes back to the same code.
all_codes = torch.arange(256, dtype=torch.uint8)
vals = cpd.decode(all_codes, cpd.E4M3FN)
finite = ~torch.isnan(vals)
assert torch.equal(cpd.encode(vals[finite], cpd.E4M3FN), all_codes[finite])
print(f"E4M3FN: {int(finite.sum())} finite codes, {int((~finite).sum())} NaN codes; max {vals[finite].max().item()}")

# %% [markdown]
# ## 4. Stochastic rounding
#
# 0.3 lies between the e5m2 values 0.25 and 0.3125, at 80% of the way up. Round to nearest
# always gives 0.3125, an error of +0.0125 that accumulates in long sums. Stochastic rounding
# gives 0.3125 with probability 0.8 and 0.25 with probability 0.2, so its *mean* is 0.3.
#
# The randomness comes from a counter-based generator keyed by a seed and offset drawn from
# torch's generator, so `torch.manual_seed` (or `generator=`) makes it reproducible, and the
# result does not depend on the number of threads.

# %%
x = torch.full((N,), 0.3)
g = torch.Generator().manual_seed(1)
sr = cpd.cast(x, cpd.E5M2, "stochastic", generator=g)
print("nearest:", cpd.cast(x[:1], cpd.E5M2).item(), "| mean of", N, "stochastic casts:", sr.double().mean().item())
assert abs(sr.double().mean().item() - 0.3) < 5 * 0.0625 * math.sqrt(0.16 / N)

# Reproducible: the same seed gives the same bits, on any number of threads.
threads = torch.get_num_threads()
torch.set_num_threads(1)
a = cpd.cast(x, cpd.E5M2, "stochastic", generator=torch.Generator().manual_seed(7))
torch.set_num_threads(max(threads, 2))
b = cpd.cast(x, cpd.E5M2, "stochastic", generator=torch.Generator().manual_seed(7))
torch.set_num_threads(threads)
assert torch.equal(a, b)
print("same seed, 1 and 2 threads: identical")

# %% [markdown]
# A histogram makes the difference visible. For values spread uniformly over a binade, the
# rounding error measured in units of the spacing (ulp) is uniform on [-1/2, 1/2] under round
# to nearest and triangular on (-1, 1) under stochastic rounding — wider, but centred on zero
# for *every* input, which is what makes it unbiased. With `sr_bits=2` the probabilities are
# truncated to multiples of 1/4, and a bias toward zero appears.

# %%
u = 1 + torch.rand(N)  # uniform in [1, 2): one binade, where e5m2's ulp is 2^-2
ulp = 2.0**-2
err = {
    "nearest": (cpd.cast(u, cpd.E5M2) - u) / ulp,
    "stochastic": (cpd.cast(u, cpd.E5M2, "stochastic") - u) / ulp,
    "stochastic, sr_bits=2": (cpd.cast(u, cpd.E5M2, "stochastic", sr_bits=2) - u) / ulp,
}
for k, e in err.items():
    print(f"{k:22s} mean error {e.double().mean().item():+.4f} ulp, spread {e.double().std().item():.3f} ulp")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for k, e in err.items():
    axes[0].hist(e.numpy(), bins=60, range=(-1, 1), histtype="step", density=True, label=k)
axes[0].set_xlabel("rounding error (ulp)")
axes[0].set_ylabel("density")
axes[0].set_title("e5m2 rounding error, x uniform in [1, 2)")
axes[0].legend(fontsize=8)

fs = torch.linspace(0, 1, 17)
lo, hi = 0.25, 0.3125
xs = lo + fs * (hi - lo)
p_up = [(cpd.cast(torch.full((N,), v.item()), cpd.E5M2, "stochastic") == hi).double().mean().item() for v in xs]
axes[1].plot(fs.numpy(), p_up, "o", label="measured")
axes[1].plot([0, 1], [0, 1], "-", lw=1, label="exact: P(up) = f")
axes[1].set_xlabel("fractional position f of x between 0.25 and 0.3125")
axes[1].set_ylabel("fraction rounded up")
axes[1].set_title(f"stochastic rounding, {N} draws per point")
axes[1].legend(fontsize=8)
fig.tight_layout()
path = OUT / "stochastic_rounding.png"
fig.savefig(path, dpi=100)
plt.close(fig)
print("saved", path)

# %% [markdown]
# ## 5. Checking against torch's casts
#
# torch has its own float16, bfloat16, float8_e5m2 and float8_e4m3fn types. On random float32
# inputs spanning every binade (and some infinities), cpd's round-to-nearest cast gives exactly
# the same values. torch's float8_e4m3fn cast saturates, so cpd is called with `saturate=True`
# for it.

# %%
def spread(n: int) -> torch.Tensor:
    """float32 values with random signs, mantissas and exponents over float32's whole range."""
    bits = torch.randint(0, 2**31 - 1, (n,), dtype=torch.int64) & 0x7F7FFFFF  # finite patterns
    v = bits.to(torch.int32).view(torch.float32)
    v = torch.where(torch.rand(n) < 0.5, -v, v)
    return torch.cat([v, torch.randn(n) * 100, torch.tensor([math.inf, -math.inf, 0.0, -0.0])])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality of values (NaN equals NaN, and zeros must agree in sign)."""
    both_nan = torch.isnan(a) & torch.isnan(b)
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | both_nan).all())


xs = spread(N)
checks = [
    ("float16", torch.float16, cpd.FP16, False),
    ("bfloat16", torch.bfloat16, cpd.BF16, False),
    ("float8_e5m2", torch.float8_e5m2, cpd.E5M2, False),
    ("float8_e4m3fn", torch.float8_e4m3fn, cpd.E4M3FN, True),
]
for name, dtype, f, sat in checks:
    ours = cpd.cast(xs, f, saturate=sat)
    theirs = xs.to(dtype).to(torch.float32)
    ok = same(ours, theirs)
    print(f"{name:14s} {xs.numel()} values: {'identical' if ok else 'DIFFERENT'}")
    assert ok, name

# %% [markdown]
# ## 6. How fast is it?
#
# The cast is one pass over memory with branch-free bit arithmetic, so its natural yardstick is
# a plain copy of the same tensor into a preallocated output. We time both side by side and
# print the ratio of their medians (`benchmarks/bench_cast.py` does this thoroughly, on 2^26
# elements). With small sizes the numbers are dominated by call overhead.

# %%
xb = torch.randn(N_SPEED) * 100
out = torch.empty_like(xb)


def ratio_to_copy(fn, reps: int = 5) -> tuple[float, float]:
    """(median time of fn / median time of a copy, median time of fn), timed interleaved."""
    copy = lambda: out.copy_(xb)  # noqa: E731
    fn(), copy()  # warm-up
    t_fn, t_copy = [], []
    for _ in range(reps):
        for f, ts in ((fn, t_fn), (copy, t_copy)):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return statistics.median(t_fn) / statistics.median(t_copy), statistics.median(t_fn)


for mode in ("nearest", "stochastic"):
    r, t = ratio_to_copy(lambda: cpd.cast(xb, cpd.E5M2, mode, out=out))
    print(f"cast e5m2 {mode:10s}: {r:5.2f}x a copy ({N_SPEED / t / 1e9:.2f} G elements/s)")
r, t = ratio_to_copy(lambda: out.copy_(xb.to(torch.float8_e5m2)))
print(f"torch's float8_e5m2 round trip, for comparison: {r:5.2f}x a copy")

# %% [markdown]
# ## Summary
#
# - `FloatFormat(exp, man, bias=..., specials=..., subnormals=...)` describes any format up to
#   float32; presets such as `cpd.E4M3FN` and names such as `"e5m2"` cover the common ones.
# - `cpd.cast` rounds exactly in five modes, with IEEE overflow rules or saturation.
# - `cpd.bits`, `cpd.encode` and `cpd.decode` show and store the codes.
# - Stochastic rounding is unbiased, reproducible and thread-count independent; `sr_bits`
#   emulates hardware with few random bits.
# - Results match torch's native casts bit for bit; a cast costs about as much as a copy
#   (`benchmarks/bench_cast.py` measures it properly).
