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
# # Tutorial 4: training with APS — the `python -m cpd demo` job step by step
#
# **What you will learn**
#
# 1. How `cpd.APSOptimizer` emulates W data-parallel workers: split the batch, `collect()` each
#    worker's gradients, `step()` sums them with a low-precision allreduce and averages.
# 2. Why unscaled (3, 0) communication cannot train a CNN (almost every gradient underflows) and
#    how APS's per-layer power-of-two scaling rescues it.
# 3. How to read the per-layer round-off report and compare gradient ranges with a format's range.
# 4. The APS paper's hybrid tricks: a float32 classifier (`fp32_layers`) and float32 warm-up
#    (`hybrid_steps`).
#
# `CPD_TUTORIAL_SMALL=1` trains for a few epochs on part of the data (seconds); figures go to
# `$CPD_TUTORIAL_OUT`.

# %%
import os
import tempfile
from pathlib import Path

import matplotlib

if "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")  # write files; never open a window
import matplotlib.pyplot as plt
import torch

import cpd
from cpd.demo import DigitsCNN, load_digits_tensors, run_config

SMALL = os.environ.get("CPD_TUTORIAL_SMALL") == "1"
EPOCHS = 3 if SMALL else 20
OUT = Path(os.environ.get("CPD_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="cpd_tutorial_"))
OUT.mkdir(parents=True, exist_ok=True)
data = load_digits_tensors(seed=0)
if SMALL:
    data = (data[0][:768], data[1][:768], data[2], data[3])
print(f"cpd {cpd.__version__}: {len(data[0])} training and {len(data[2])} test digits, {EPOCHS} epochs")

# %% [markdown]
# ## 1. One step by hand
#
# The batch of 128 is split across 8 workers (16 each). Each worker's backward fills `.grad`;
# `collect()` keeps a copy and clears `.grad`. `step()` reduces every parameter's 8 gradients in
# (3, 0) with APS, divides by 8 and runs SGD.

# %%
torch.manual_seed(0)
model = DigitsCNN()
opt = cpd.APSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), fmt=cpd.FloatFormat(3, 0),
                       workers=8, scaling="aps", model=model)
x, y = data[0][:128], data[1][:128]
opt.zero_grad()
for wx, wy in opt.split(x, y):
    torch.nn.functional.cross_entropy(model(wx), wy).backward()
    opt.collect()
opt.step()
print(opt.last_report)

# %% [markdown]
# `scale_exp` is the power of two APS multiplied each layer by so that the 8-worker sum just fits
# below (3, 0)'s top binade; `underflow` is the fraction of gradient elements still flushed to
# zero. (3, 0) spans only a few binades, so even with APS many small elements are lost — but the
# largest ones, which carry most of the update, survive. Without scaling they all vanish:

# %%
opt_none = cpd.APSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), fmt=cpd.FloatFormat(3, 0), workers=8,
                            scaling=None, model=model)
opt_none.zero_grad()
for wx, wy in opt_none.split(x, y):
    torch.nn.functional.cross_entropy(model(wx), wy).backward()
    opt_none.collect()
opt_none.step()
print({r.name: f"{100 * r.underflow_frac:.0f}% underflow" for r in opt_none.last_report})

# %% [markdown]
# ## 2. Training curves: fp32 vs APS vs unscaled (the paper's Table 4 at small scale)

# %%
runs = [run_config("fp32", cpd.FP32, None, data, epochs=EPOCHS)]
for f in (cpd.E4M3, cpd.FloatFormat(3, 0)):
    runs += [run_config(f"{f.name} aps", f, "aps", data, epochs=EPOCHS),
             run_config(f"{f.name} none", f, None, data, epochs=EPOCHS)]
for r in runs:
    print(f"{r['name']:10s} test accuracy {100 * r['test_acc']:6.2f}%  test loss {r['test_loss']:.3f}")
fig, ax = plt.subplots(figsize=(6, 4))
for r in runs:
    ax.plot(r["hist"]["epoch"], [100 * a for a in r["hist"]["test_acc"]], label=r["name"])
ax.set(xlabel="epoch", ylabel="test accuracy (%)")
ax.legend()
fig.savefig(OUT / "aps_training_curves.png", dpi=80)
plt.close(fig)

# %% [markdown]
# ## 3. Gradient ranges against the format's range
#
# `RoundoffReport.plot` draws each layer's gradient exponents (grey) and the APS-scaled ones
# (blue) against the (3, 0) range (green).

# %%
aps_e3m0 = next(r for r in runs if r["name"] == "e3m0 aps")
aps_e3m0["report"].plot(OUT / "aps_e3m0_ranges.png")
print("figures:", sorted(p.name for p in OUT.glob("*.png")))

# %% [markdown]
# ## 4. Hybrid precision: a float32 classifier and a float32 warm-up
#
# `fp32_layers=["fc"]` reduces the classifier's gradients in float32 (the APS paper does this for
# ResNet-50's last layer); `hybrid_steps=N` uses float32 for every layer during the first N steps.

# %%
torch.manual_seed(0)
model = DigitsCNN()
opt = cpd.APSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), fmt=cpd.FloatFormat(3, 0),
                       workers=8, model=model, fp32_layers=["fc"], hybrid_steps=1)
for step in range(2):
    opt.zero_grad()
    for wx, wy in opt.split(x, y):
        torch.nn.functional.cross_entropy(model(wx), wy).backward()
        opt.collect()
    opt.step()
    print(f"step {step}:", {r.name: r.status for r in opt.last_report})
