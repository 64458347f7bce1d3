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
# # Tutorial 6: the literature's gradient compressors behind one interface
#
# **What you will learn**
#
# 1. The `cpd.compressors` interface: `encode(tensor, state) -> Payload` (real bytes, `nbytes`),
#    `decode(payload)`, and error feedback kept in a `CompressorState`.
# 2. What each method puts on the wire: Dettmers' four 8-bit types, 1-bit SGD, Strom's threshold,
#    Dryden's adaptive quantization, Bitpack, and APS-style casting to a `FloatFormat`.
# 3. How to train with them: `cpd.APSOptimizer(opt, compressor=...)` on the same emulated
#    data-parallel job as `python -m cpd demo`, accuracy and bytes side by side.
# 4. Adaptive Weight Precision (AWP): per-layer byte widths for the weights.
#
# `CPD_TUTORIAL_SMALL=1` trains for two epochs on part of the data (seconds); figures go to
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
from cpd.compressors import AWP, CompressorState, get
from cpd.demo import DigitsCNN, compression_table, demo_data, results_table, run_config

SMALL = os.environ.get("CPD_TUTORIAL_SMALL") == "1"
EPOCHS = 2 if SMALL else 15
WORKERS = 4 if SMALL else 8
OUT = Path(os.environ.get("CPD_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="cpd_tutorial_"))
OUT.mkdir(parents=True, exist_ok=True)
data = demo_data(seed=0, fast=SMALL)  # the small run: the demo's --fast subset (512 training digits)
print(f"cpd {cpd.__version__}: {len(data[0])} training and {len(data[2])} test digits, {EPOCHS} epochs")

# %% [markdown]
# ## 1. One tensor, every compressor
#
# A 256 x 16 "gradient" (16 columns of 256 rows). `payload.parts` holds the uint8 tensors that would
# be sent; `nbytes` is their size and `ratio` the saving against float32. The column-wise methods
# (one-bit, adaptive) quantize each column `x.reshape(d0, -1)[:, j]` separately.

# %%
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 16, generator=g) * 1e-2
names = ["dynamic_tree", "static_tree:-1", "linear", "mantissa8:-1", "onebit", "threshold:0.015", "adaptive:16",
         "bitpack16", "e5m2", "e2m1fn"]
print(f"{'compressor':<16} {'bytes':>6} {'ratio':>6} {'rel. L2 error':>14}   parts")
for name in names:
    c = get(name)
    y, p = c.roundtrip(x)
    err = float((y - x).norm() / x.norm())
    parts = ", ".join(f"{k}: {v.numel()} B" for k, v in p.parts.items())
    print(f"{name:<16} {p.nbytes:>6} {p.ratio:>6.2f} {err:>14.3e}   {parts}")

# %% [markdown]
# The static types (static tree, 8-bit mantissa) have a fixed decimal exponent range set by the
# exponent offset 10^offset (`static_tree:-1` for gradients of about 1e-2); the dynamic tree and
# linear quantization are normalized by the absolute maximum and need no offset.
#
# ## 2. Error feedback
#
# One-bit, threshold and adaptive quantization send a crude version of the gradient and carry what
# was not sent (the residual) to the next step. Over many steps, the sum of what was sent plus the
# last residual is exactly the sum of the gradients:

# %%
comp = get("onebit")
state = CompressorState()
total, sent = torch.zeros(256, 16, dtype=torch.float64), torch.zeros(256, 16, dtype=torch.float64)
for step in range(20):
    gstep = torch.randn(256, 16, generator=g) * 1e-2
    total += gstep.double()
    sent += comp.decode(comp.encode(gstep, state)).double()
print("max |sum(sent) + residual - sum(gradients)| =", float((sent + state.residual - total).abs().max()))
print("relative error of the sum sent after 20 steps:", float((sent - total).norm() / total.norm()))

# %% [markdown]
# ## 3. Training with each compressor
#
# The same CNN, weights, batches and 8 emulated workers (4 in the small run) as the demo; only the gradient
# communication changes. `APSOptimizer(opt, compressor=...)` runs the compressed ring allreduce
# (each worker quantizes its gradient with error feedback; the reduce step decodes, sums in float32
# and re-encodes) and reports the bytes sent.

# %%
configs = ["dynamic_tree", "linear", "static_tree", "mantissa8:0", "onebit", "threshold:0.001", "adaptive:8"]
results = [run_config("fp32", cpd.FP32, None, data, epochs=EPOCHS, workers=WORKERS)]
results.append(run_config("e5m2 aps", cpd.E5M2, "aps", data, epochs=EPOCHS, workers=WORKERS))
for name in configs:
    results.append(run_config(name, None, None, data, epochs=EPOCHS, workers=WORKERS, compressor=get(name)))
print(results_table(results))
print()
print(compression_table([r for r in results if r.get("bytes")]))

# %% [markdown]
# The per-layer view of the last step shows where the bytes go: small layers are split into chunks
# of a few columns across the workers, and the per-column reconstruction values of one-bit and
# adaptive quantization weigh more there than on large layers.

# %%
print(results[-1]["report"])

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for r in results[2:]:
    ax.scatter(r["fp32_bytes"] / r["bytes"], 100 * r["test_acc"])
    ax.annotate(r["name"], (r["fp32_bytes"] / r["bytes"], 100 * r["test_acc"]), fontsize=8)
ax.axhline(100 * results[0]["test_acc"], color="k", ls="--", label="fp32")
ax.set(xscale="log", xlabel="bytes saved (float32 bytes / bytes sent)", ylabel="test accuracy (%)",
       title="gradient compressors on the digits job")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "compressors.png", dpi=90)
plt.close(fig)
print("figure:", OUT / "compressors.png")

# %% [markdown]
# ## 4. Adaptive Weight Precision
#
# AWP chooses, per layer, how many leading bytes of each float32 weight are sent to the workers
# (Bitpack; the receiver appends zero bytes). Every layer starts at 1 byte and gains one byte each
# time the relative change of its weight norm has been below T for INTERVAL batches. The training
# loop computes on the truncated weights and updates float32 masters:

# %%
torch.manual_seed(0)
model = DigitsCNN()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
awp = AWP(model, threshold=2e-3, interval=5)
x_tr, y_tr = data[0], data[1]
gen = torch.Generator().manual_seed(1)
sent_bytes = 0
for epoch in range(EPOCHS):
    perm = torch.randperm(len(x_tr), generator=gen)
    for i in range(0, len(perm) - 127, 128):
        idx = perm[i:i + 128]
        sent_bytes += awp.bytes_per_step
        with awp.truncated():
            torch.nn.functional.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
        opt.step()
        opt.zero_grad()
        awp.update()
with torch.no_grad():
    acc = (model(data[2]).argmax(1) == data[3]).float().mean().item()
steps = len(awp.history)
print(f"AWP: widths after {steps} batches {awp.widths}; test accuracy {100 * acc:.1f}%")
print(f"weights sent: {sent_bytes} bytes against {steps * awp.fp32_bytes} in float32 "
      f"(ratio {steps * awp.fp32_bytes / sent_bytes:.2f})")
