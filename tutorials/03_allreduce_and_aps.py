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
# # Tutorial 3: low-precision gradient allreduce, APS and loss scaling
#
# **What you will learn**
#
# 1. How `cpd.allreduce` emulates W workers summing gradients in an 8-bit format, one rounded
#    addition per network hop, for the ring, hierarchical, tree and sequential orders.
# 2. Why the order matters: the APS paper's finding that a ring over 256 workers has the largest
#    round-off error (its Eq. 5) and that hierarchical allreduce with groups of 16 beats 4 and 64.
# 3. How APS (per-layer power-of-two scaling, the paper's Algorithm 1) compares with one global
#    loss scale and with no scaling at all, for (5, 2), (4, 3) and (3, 0).
# 4. How to read a `RoundoffReport` (table, dict, exponent histograms).
# 5. How the α–β cost model compares the algorithms' communication time.
#
# Run it as a script (`python tutorials/03_allreduce_and_aps.py`) or as a notebook.
# `CPD_TUTORIAL_SMALL=1` uses small tensors so that it finishes in a few seconds; figures go to
# `$CPD_TUTORIAL_OUT`.

# %%
import os
import tempfile
import time
from pathlib import Path

import matplotlib

if "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")  # write files; never open a window
import torch

import cpd

SMALL = os.environ.get("CPD_TUTORIAL_SMALL") == "1"
N = 2**10 if SMALL else 2**16  # gradient elements per worker for the 256-worker experiments
OUT = Path(os.environ.get("CPD_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="cpd_tutorial_"))
OUT.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
print(f"cpd {cpd.__version__}, torch {torch.__version__}, small={SMALL}, figures in {OUT}")

# %% [markdown]
# ## 1. Every hop rounds
#
# Four workers hold one gradient each. In (3, 0) (values 0.25, 0.5, 1, 2, 4, 8) the order of
# the additions decides the answer: the ring starts each chunk at a different worker, the
# sequential scheme always starts at worker 0. Inputs are rounded to the format first (that is
# what goes on the wire); every partial sum is then `cpd.add` — the exact sum rounded once.

# %%
e3m0 = cpd.FloatFormat(3, 0)
x = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [4.0, 4.0, 4.0]])
for algorithm in ("ring", "tree", "sequential"):
    print(f"{algorithm:10s}", cpd.allreduce(x, e3m0, algorithm=algorithm).tolist(), " exact:", x.sum(0).tolist())

# %% [markdown]
# ## 2. Ring versus hierarchical over 256 workers (the paper's Table 9)
#
# Synthetic gradients: a signal shared by all workers plus per-worker noise of the same size, as
# data-parallel gradients are. Every algorithm runs with APS in (5, 2); the error is the paper's
# Eq. 5 (mean relative error against the float64 sum) and the relative L2 error.

# %%
W = 256
e5m2 = cpd.FloatFormat(5, 2)
signal = torch.randn(N) * 0.5
grads = torch.stack([(signal + torch.randn(N)) * 1e-3 for _ in range(W)])
rows = []
for algorithm, k in [("ring", None), ("hierarchical", 4), ("hierarchical", 16), ("hierarchical", 64),
                     ("tree", None), ("sequential", None)]:
    out, rep = cpd.aps_allreduce({"conv1.weight": grads}, e5m2, algorithm=algorithm, group_size=k)
    r = rep["conv1.weight"]
    rows.append((algorithm + (f" k={k}" if k else ""), r.mean_rel_error, r.rel_l2_error))
print(f"{'algorithm':18s} {'Eq.5 error':>10s} {'rel. L2':>8s}")
for name, eq5, l2 in rows:
    print(f"{name:18s} {100 * eq5:9.2f}% {l2:8.3f}")
errors = {name: eq5 for name, eq5, _ in rows}
assert errors["ring"] > max(errors[n] for n in errors if n.startswith("hierarchical")), errors
assert errors["hierarchical k=16"] < min(errors["hierarchical k=4"], errors["hierarchical k=64"]), errors

# %%
import matplotlib.pyplot as plt  # noqa: E402

sizes = [2, 4, 8, 16, 32, 64, 128]
eq5 = [cpd.aps_allreduce({"g": grads}, e5m2, algorithm="hierarchical", group_size=k)[1]["g"].mean_rel_error
       for k in sizes]
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(sizes, [100 * e for e in eq5], "o-", label="hierarchical (group size k)")
ax.axhline(100 * errors["ring"], color="tab:red", ls="--", label="ring (k = 1)")
ax.axhline(100 * errors["tree"], color="tab:green", ls=":", label="tree")
ax.set_xscale("log", base=2)
ax.set_xlabel("group size k")
ax.set_ylabel("Eq. 5 round-off error (%)")
ax.set_title(f"{W} workers, (5, 2), APS")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "group_size.png", dpi=90)
plt.close(fig)
print("saved", OUT / "group_size.png")

# %% [markdown]
# As in the paper, the ring is worst: its last hop adds one worker's gradient to the sum of 255
# others, so small contributions are rounded away; groups of 16 balance the intra-group and the
# leader-ring sums (each at most 15 hops long). The pairwise tree, never used by the paper, has
# only log2(W) levels of rounding and is better still.
#
# ## 3. APS versus loss scaling versus nothing
#
# A toy network whose layers have very different gradient scales. APS picks one power of two per
# layer; loss scaling uses one for all (here 2^10, a typical hand-tuned value); "none" casts the
# raw gradients.

# %%
W2 = 16
scales = {"conv1.weight": 1e-2, "conv2.weight": 1e-4, "fc1.weight": 1e-6, "fc2.weight": 1e-8}
layers = {name: [torch.randn(N // 4) * s for _ in range(W2)] for name, s in scales.items()}
print(f"{'format':8s} {'layer':14s} {'APS s':>6s} {'APS L2':>8s} {'loss-scale L2':>14s} {'none L2':>8s} "
      f"{'none underflow':>15s}")
for fmt in (cpd.FloatFormat(5, 2), cpd.FloatFormat(4, 3), cpd.FloatFormat(3, 0)):
    _, aps = cpd.aps_allreduce(layers, fmt, algorithm="ring")
    _, ls = cpd.LossScaler(init_scale=2**10, dynamic=False).allreduce(layers, fmt, algorithm="ring")
    _, none = cpd.scaled_allreduce(layers, fmt, algorithm="ring")
    for name in layers:
        print(f"{fmt.name:8s} {name:14s} {aps[name].scale_exp:6d} {aps[name].rel_l2_error:8.3f} "
              f"{ls[name].rel_l2_error:14.3f} {none[name].rel_l2_error:8.3f} {100 * none[name].underflow_frac:14.1f}%")
    assert all(aps[n].rel_l2_error <= none[n].rel_l2_error for n in layers)

# %% [markdown]
# Without scaling, the small layers underflow entirely (relative error 1: the result is 0). A
# global loss scale rescues some layers but not all, and would overflow the largest ones if
# chosen larger; APS gets every layer into range. The narrower the exponent range — (3, 0) has
# only 2^-2..2^3 — the more this matters.
#
# ## 4. The round-off report
#
# `aps_allreduce` returns a `RoundoffReport`: print it, turn it into plain data, or plot the
# gradient exponents against the format's range.

# %%
_, report = cpd.aps_allreduce(layers, cpd.E5M2, algorithm="hierarchical", group_size=4, kahan=True,
                              fp32_layers=["fc2.weight"])
print(report)
print(report.to_dict()["layers"]["conv1.weight"]["scale_exp"])
report.plot(OUT / "roundoff.png")
print("saved", OUT / "roundoff.png")

# %% [markdown]
# ## 5. Dynamic loss scaling
#
# `LossScaler` follows `torch.amp.GradScaler`'s contract: an overflow skips the step and halves
# the scale; `growth_interval` clean steps double it.

# %%
scaler = cpd.LossScaler(init_scale=2.0**20, growth_interval=3)
for step in range(8):
    _, rep = scaler.allreduce(layers, cpd.E5M2)
    applied = scaler.update()
    print(f"step {step}: overflow={rep.found_inf!s:5} applied={applied!s:5} next scale=2^{scaler.scale_exp}")

# %% [markdown]
# ## 6. What it costs on a real network: the α–β model
#
# For a 25 MB float32 gradient on 256 workers (α = 5 µs, β = 1/12.5 GB/s), sending E5M2
# quarters the bytes; the hierarchical scheme cuts the latency term (90 steps instead of 510).

# %%
for algorithm, k in [("ring", None), ("hierarchical", 16), ("tree", None), ("recursive_doubling", None)]:
    for fmt in (None, cpd.E5M2):
        c = cpd.cost_model(n_bytes=25e6, workers=256, algorithm=algorithm, group_size=k, fmt=fmt, alpha=5e-6,
                           beta=1 / 12.5e9, aps_layers=160 if fmt else 0)
        print(f"{algorithm + (f' k={k}' if k else ''):20s} {fmt.name if fmt else 'fp32':5s} steps {c.steps:4d} "
              f"time {1e3 * c.time:7.3f} ms")

# %% [markdown]
# ## 7. How fast is the emulation?
#
# Each hop is one fused `cpd.add` over all chunks, so the cost grows like W·n. Compared with
# float32's `torch.stack(ws).sum(0)`:

# %%
ws = list(torch.randn(16 if SMALL else 64, 2**14 if SMALL else 2**20))
for fn, name in ((lambda: torch.stack(ws).sum(0), "torch float32 sum"),
                 (lambda: cpd.allreduce(ws, cpd.E5M2, algorithm="ring"), "cpd ring E5M2")):
    fn()
    t = time.perf_counter()
    fn()
    print(f"{name:18s} {1e3 * (time.perf_counter() - t):8.2f} ms")

# %% [markdown]
# ## 8. APS per block: a block format on the wire
#
# Give `cpd.allreduce` / `cpd.aps_allreduce` a block format (`cpd.mx.MXFP8_E4M3`: E4M3 elements,
# one E8M0 power of two per 32 elements) and APS runs at block granularity: every block of 32
# consecutive elements of the flattened layer gets its own power of two, shared by all workers,
# chosen from the largest |g|·W in that block so the block's sum cannot overflow E4M3; elements
# are rounded to E4M3, summed in E4M3 in the chosen order and unscaled (docs/collectives.md).
# A layer whose gradients span many binades — an embedding with a few hot rows, a conv layer with
# dead channels — keeps its small blocks in range, where one power of two per layer pushes them
# below E4M3's smallest subnormal. `cpd.compare_scalings` runs per-layer APS, per-block APS and
# (the best static) loss scaling on the same gradients:

# %%
g = torch.Generator().manual_seed(8)
n_blk = 256 if SMALL else 4096
wide = {
    "embedding": torch.randn(8, n_blk, generator=g) * torch.logspace(-9, 1, n_blk),  # rows of very different size
    "conv.weight": torch.randn(8, n_blk, generator=g) * 1e-3,                         # one binade range
    "fc.bias": torch.randn(8, 64, generator=g) * 20,
}
cmp = cpd.compare_scalings(wide, cpd.mx.MXFP8_E4M3)
print(cmp)
cmp.plot(OUT / "scaling_comparison.png")
print("saved", OUT / "scaling_comparison.png")

# %% [markdown]
# On the embedding, per-layer APS flushes most of the small rows to zero (underflow column) and
# its Eq. 5 error is large; per block nothing underflows. On a layer whose values sit in a narrow
# range the two coincide, and the global loss scale is only as good as the layer it is tuned for.
# The price of blocks: one 8-bit scale per 32 elements on the wire (8.25 bits per element instead
# of 8) and an allreduce-MAX of one integer per block instead of one per layer.
