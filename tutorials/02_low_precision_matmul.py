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
# # Tutorial 2: low-precision accumulation, Kahan summation and a quantized MLP
#
# **What you will learn**
#
# 1. Why the *accumulator* format matters more than the storage format for long dot products,
#    measured as the error of `cpd.sum` against an exact (float64) sum as K grows.
# 2. How Kahan-compensated accumulation (`kahan=True`, every operation still rounded to the
#    accumulator format) recovers most of the lost accuracy.
# 3. How `cpd.matmul` emulates a GEMM with separate multiply and accumulate formats, checked
#    against `torch.mm`, and what a truncating (round-toward-zero) accumulator does to it.
# 4. How to train a small MLP whose forward and backward GEMMs run in 8-bit products and a
#    16-bit accumulator, with `cpd.nn.convert` and `cpd.optim.QuantizedOptimizer`, on
#    scikit-learn's 8x8 digits (shipped with the package, no download).
#
# `CPD_TUTORIAL_SMALL=1` shrinks every size so the script runs in seconds; figures go to
# `$CPD_TUTORIAL_OUT` (default: a new temporary folder).

# %%
import os
import tempfile
import time
from pathlib import Path

import matplotlib

if "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

import cpd

SMALL = os.environ.get("CPD_TUTORIAL_SMALL") == "1"
OUT = Path(os.environ.get("CPD_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="cpd_tutorial_"))
OUT.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)

# %% [markdown]
# ## 1. Accumulation error versus K
#
# We sum K positive numbers (uniform in [0, 1)) sequentially in several accumulator formats.
# Once the running sum is large, each new term is smaller than half an ulp of the sum and is
# lost entirely: the classic stagnation of low-precision accumulators.

# %%
Ks = [2**k for k in range(4, 10 if SMALL else 14, 2)]
accs = {"fp16": cpd.FP16, "bf16": cpd.BF16, "e5m2": cpd.E5M2, "fp32": cpd.FP32}
rows = 4 if SMALL else 32
errors = {name: [] for name in accs}
errors_kahan = {name: [] for name in accs}
for K in Ks:
    x = torch.rand(rows, K)
    exact = x.double().sum(1)
    for name, fmt in accs.items():
        for kahan, table in ((False, errors), (True, errors_kahan)):
            s = cpd.sum(x, dim=1, acc=fmt, kahan=kahan).double()
            table[name].append(((s - exact).abs() / exact).mean().item())

print(f"{'K':>6} " + " ".join(f"{n:>10} {n + '+K':>10}" for n in accs))
for i, K in enumerate(Ks):
    print(f"{K:>6} " + " ".join(f"{errors[n][i]:10.2e} {errors_kahan[n][i]:10.2e}" for n in accs))

fig, ax = plt.subplots(figsize=(6, 4))
for name in accs:
    ax.loglog(Ks, errors[name], "o-", label=f"{name}")
    ax.loglog(Ks, errors_kahan[name], "x--", label=f"{name} + Kahan")
ax.set_xlabel("K (number of terms)")
ax.set_ylabel("mean relative error of the sum")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "accumulation_error.png")
print("figure:", OUT / "accumulation_error.png")

# %% [markdown]
# Kahan summation keeps one compensation term per output and rounds each of its four
# operations to the accumulator format, so it costs four roundings per term instead of one;
# the error above shows what it buys in fp16 and bf16.

# %%
K = Ks[-1]
fp16_plain, fp16_kahan = errors["fp16"][-1], errors_kahan["fp16"][-1]
assert fp16_kahan < fp16_plain, "Kahan should help a long fp16 sum"
print(f"at K={K}: fp16 plain {fp16_plain:.2e}, with Kahan {fp16_kahan:.2e}")

# %% [markdown]
# ## 2. A GEMM with chosen multiply and accumulate formats
#
# `cpd.matmul(a, b, mul=..., acc=...)` rounds every product to `mul` and every addition to
# `acc`, sequentially over k from +0 for each output. With `mul=None` and `acc=FP32` it is a
# chain of correctly rounded float32 fused multiply-adds, close to `torch.mm`.

# %%
n = 32 if SMALL else 128
a, b = torch.randn(n, n), torch.randn(n, n)
ref = a.double() @ b.double()
for mul, acc in [(None, cpd.FP32), (None, cpd.BF16), (cpd.E5M2, cpd.FP16), (cpd.E4M3, cpd.BF16)]:
    t0 = time.perf_counter()
    c = cpd.matmul(a, b, mul=mul, acc=acc)
    dt = time.perf_counter() - t0
    rel = ((c.double() - ref).norm() / ref.norm()).item()
    print(f"mul={mul.name if mul else None!s:6} acc={acc.name:6}  relative error {rel:.2e}  ({dt * 1e3:.1f} ms)")
assert torch.allclose(cpd.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)

# %% [markdown]
# ### Directed rounding: a truncating accumulator
#
# Hardware that truncates its sums (rounds toward zero) biases a long sum of positive terms
# downward, where round-to-nearest errors largely cancel. `rounding="toward_zero"` (or `"up"`,
# `"down"`) rounds every product and addition that way. On the CPU these run in float32 lanes
# with the processor's own rounding direction set to the mode, about as fast as
# round-to-nearest into FP32 (the same bits as the exact reference, like every path).

# %%
x = torch.rand(n, 16 * n)  # positive terms
w = torch.rand(16 * n, n)
exact = x.double() @ w.double()
print(f"{'acc':6} {'rounding':12} {'mean signed rel. error':>23} {'ms':>7}")
for acc in (cpd.FP32, cpd.BF16):
    for mode in ("nearest", "toward_zero"):
        t0 = time.perf_counter()
        s = cpd.matmul(x, w, acc=acc, rounding=mode)
        dt = time.perf_counter() - t0
        bias = ((s.double() - exact) / exact).mean().item()
        print(f"{acc.name:6} {mode:12} {bias:23.2e} {dt * 1e3:7.1f}")
trunc = cpd.matmul(x, w, acc=cpd.BF16, rounding="toward_zero").double()
assert (trunc <= exact).all(), "a truncated sum of positive terms never overshoots"

# %% [markdown]
# ## 3. Training a quantized MLP on the digits data set
#
# `cpd.nn.convert` returns a copy of a model whose `Linear` layers run their forward GEMM and
# both backward GEMMs emulated. Here products are E4M3 and the accumulator FP16; the optimizer
# keeps a float32 master copy and stores weights in BF16.

# %%
from sklearn.datasets import load_digits  # noqa: E402

digits = load_digits()
X = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))
X, y = X[perm], y[perm]
n_train = 700 if SMALL else 1400
Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def train(model, opt, epochs):
    for _ in range(epochs):
        for i in range(0, len(Xtr), 64):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(Xtr[i:i + 64]), ytr[i:i + 64])
            loss.backward()
            opt.step()
    with torch.no_grad():
        return (model(Xte).argmax(1) == yte).float().mean().item()


epochs = 4 if SMALL else 8
torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
fp32_model = cpd.nn.convert(base)  # exact formats: a plain copy
q_model = cpd.nn.convert(base, mul=cpd.E4M3, acc=cpd.FP16)
acc_fp32 = train(fp32_model, torch.optim.SGD(fp32_model.parameters(), lr=0.2, momentum=0.9), epochs)
q_opt = cpd.optim.QuantizedOptimizer(torch.optim.SGD(q_model.parameters(), lr=0.2, momentum=0.9), weight=cpd.BF16)
acc_q = train(q_model, q_opt, epochs)
print(f"test accuracy after {epochs} epochs: float32 {acc_fp32:.3f}, E4M3 products + FP16 accumulation {acc_q:.3f}")
assert acc_q > 0.5, "the quantized MLP should learn"
