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
# # Tutorial 7: what the tensor core computes — training a transformer on emulated Hopper FP8
#
# **What you will learn**
#
# 1. How a matrix unit's fused dot product differs from exact low-precision arithmetic:
#    `cpd.tensor_core("hopper", a="e4m3")` keeps 13 fraction bits below the largest term of
#    each 32-product step, and its error grows with K — DeepSeek-V3's reason to promote partial
#    sums to FP32 every 128 elements.
# 2. How to run a whole transformer on that model: `cpd.nn.convert` for its `Linear` layers
#    (with *delayed scaling*, TransformerEngine's FP8 recipe) and `cpd.nn.emulate` for the
#    attention matmuls written with `@` / `F.scaled_dot_product_attention`.
# 3. Three trainings of one small transformer (2 layers, d = 64) on a synthetic sequence task:
#    float32, "Hopper FP8 with delayed scaling", and "exact E4M3 products with FP32
#    accumulation" — loss curves side by side, and the scales each layer ended with.
# 4. Other matrix units: AMD's CDNA1–3 (`cpd.tensor_core("cdna3", a="fp16")`) and Blackwell's
#    block-scaled MXFP8 / NVFP4 instructions, on the vectors that tell them apart.
# 5. Block scales end to end: the transformer on Blackwell MXFP8 with the `"block"` recipe and
#    MXFP8-E5M2 gradients for the backward GEMMs (`grad_scaling="block"`), and the report of
#    the scales and the saturations/flushes they caused.
#
# `CPD_TUTORIAL_SMALL=1` shrinks every size so the script runs in seconds; figures go to
# `$CPD_TUTORIAL_OUT` (default: a new temporary folder).

# %%
import copy
import os
import tempfile
import time
from pathlib import Path

import matplotlib

if "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import cpd

SMALL = os.environ.get("CPD_TUTORIAL_SMALL") == "1"
OUT = Path(os.environ.get("CPD_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="cpd_tutorial_"))
OUT.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)

HOPPER = cpd.tensor_core("hopper", a="e4m3", b="e4m3", out="f32")
print(HOPPER)
# "Exact E4M3 products, FP32 accumulation": the same inputs, one product per step, nothing cut
# (F = 40 bits), each sum cut toward zero to FP32 -- a scalar FP32 FMA chain.
EXACT_E4M3 = cpd.FusedDot(group=1, frac_bits=40, out="f32", a="e4m3fn", b="e4m3fn", name="exact e4m3, fp32 acc")

# %% [markdown]
# ## 1. One GEMM: the error of the fused dot product versus K
#
# Rows of `a` and columns of `b` are E4M3 values of one sign (the hard case: no cancellation
# hides the bias of truncation toward zero). We compare, against the exact float64 product:
# the Hopper FP8 model, the same with partial sums promoted to FP32 every 128 elements (what
# DeepSeek-V3 does on the GPU), and exact products accumulated in FP32.

# %%
def rel_err(y, ref):
    return ((y.double() - ref).abs() / ref.abs()).max().item()


Ks = [64, 256] if SMALL else [64, 256, 1024, 4096]
rows = {"hopper fp8": [], "hopper fp8, promoted every 128": [], "exact e4m3 products, fp32 acc": []}
for K in Ks:
    a = cpd.cast(torch.rand(8, K) + 0.5, cpd.E4M3FN)
    b = cpd.cast(torch.rand(K, 8) + 0.5, cpd.E4M3FN)
    ref = a.double() @ b.double()
    rows["hopper fp8"].append(rel_err(cpd.matmul(a, b, acc=HOPPER), ref))
    chunks = [cpd.matmul(a[:, k:k + 128], b[k:k + 128], acc=HOPPER) for k in range(0, K, 128)]
    rows["hopper fp8, promoted every 128"].append(rel_err(torch.stack(chunks).sum(0), ref))
    rows["exact e4m3 products, fp32 acc"].append(rel_err(cpd.matmul(a, b, acc=EXACT_E4M3), ref))
print(f"{'K':>6s}  " + "  ".join(f"{k:>32s}" for k in rows))
for i, K in enumerate(Ks):
    print(f"{K:6d}  " + "  ".join(f"{rows[k][i]:32.2e}" for k in rows))

fig, ax = plt.subplots(figsize=(6, 4))
for k, v in rows.items():
    ax.loglog(Ks, v, "o-", label=k)
ax.set_xlabel("K")
ax.set_ylabel("max relative error")
ax.set_title("E4M3 GEMM: tensor-core accumulation vs exact")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "fused_dot_error_vs_k.png")
print("figure:", OUT / "fused_dot_error_vs_k.png")

# %% [markdown]
# The Hopper model's error grows with K: every 32-product step cuts its terms 13 bits below
# the running sum, always toward zero. Promoting to FP32 every 128 products (four steps) caps
# the growth; exact products with FP32 accumulation stay at FP32's rounding.
#
# ## 2. A small transformer and a synthetic task
#
# Tokens are random in `0..V-1`; the target at position `t` is the token at `t - 3` (and 0 for
# the first three): the model must learn to attend three positions back. The attention is
# written with `F.scaled_dot_product_attention`, the projections are `nn.Linear`.

# %%
V, T, D, H, LAYERS = 16, 16, 64, 4, 2
LAG = 3


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.proj = torch.nn.Linear(D, D)
        self.ff1 = torch.nn.Linear(D, 2 * D)
        self.ff2 = torch.nn.Linear(2 * D, D)
        self.n1 = torch.nn.LayerNorm(D)
        self.n2 = torch.nn.LayerNorm(D)

    def forward(self, x):
        n, t, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).reshape(n, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # q @ k^T and p @ v
        x = x + self.proj(att.transpose(1, 2).reshape(n, t, D))
        return x + self.ff2(F.gelu(self.ff1(self.n2(x))))


class TinyTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.pos = torch.nn.Parameter(torch.randn(T, D) * 0.02)
        self.blocks = torch.nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = torch.nn.Linear(D, V)

    def forward(self, tokens):
        return self.head(self.blocks(self.emb(tokens) + self.pos))


def batch(n, gen):
    x = torch.randint(0, V, (n, T), generator=gen)
    y = torch.cat([torch.zeros(n, LAG, dtype=torch.long), x[:, :-LAG]], dim=1)
    return x, y


base = TinyTransformer()
print(sum(p.numel() for p in base.parameters()), "parameters")

# %% [markdown]
# ## 3. Three trainings
#
# * **float32**: the model as is.
# * **Hopper FP8 with delayed scaling**: every `Linear` replaced by `cpd.nn.convert(...,
#   acc=HOPPER, scaling="delayed")` (each keeps an amax history of 16 steps for its input and
#   its weight); the attention GEMMs run under `cpd.nn.emulate(acc=HOPPER, scaling=
#   "tensorwise")`. The backward GEMMs stay in float32 here (`backward_acc=None`), so the
#   comparison isolates the forward tensor-core arithmetic.
# * **Exact E4M3 products, FP32 accumulation**: the same, with `EXACT_E4M3` as the accumulator.
#
# The same initial weights, data and order for all three.

# %%
steps = 4 if SMALL else 300
bs = 8 if SMALL else 64


def train(model, acc=None, n_steps=None):
    n_steps = steps if n_steps is None else n_steps
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    losses, t0 = [], time.perf_counter()
    for step in range(n_steps):
        x, y = batch(bs, gen)
        if acc is None:
            logits = model(x)
        else:
            with cpd.nn.emulate(acc=acc, backward_mul=None, backward_acc=None, scaling="tensorwise"):
                logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, (time.perf_counter() - t0) / n_steps


runs = {}
runs["float32"] = train(copy.deepcopy(base))
for name, acc in (("hopper fp8, delayed scaling", HOPPER), ("exact e4m3 products, fp32 acc", EXACT_E4M3)):
    m = cpd.nn.convert(base, acc=acc, backward_mul=None, backward_acc=None, scaling="delayed", skip=("head",))
    runs[name] = train(m, acc)
    if name.startswith("hopper"):
        hopper_model = m
for name, (losses, per_step) in runs.items():
    tail = sum(losses[-5:]) / len(losses[-5:])
    print(f"{name:32s} final loss {tail:.4f}   {per_step * 1e3:8.1f} ms/step "
          f"({per_step / runs['float32'][1]:.1f}x float32)")

fig, ax = plt.subplots(figsize=(7, 4))
for name, (losses, _) in runs.items():
    ax.plot(losses, label=name)
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy")
ax.set_yscale("log")
ax.set_title(f"{LAYERS}-layer transformer, d={D}: lag-{LAG} copy task")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "tensor_core_training.png")
print("figure:", OUT / "tensor_core_training.png")

# %% [markdown]
# The classifier head is kept in float32 (`skip=("head",)`), as FP8 recipes do. Each scaled
# `Linear` reports the scales delayed scaling chose and how many elements they pushed past
# E4M3's 448 or to zero:

# %%
print(cpd.nn.scaling_report(hopper_model))

# %% [markdown]
# **Where the truncation matters.** On this short task the three curves are close: the GEMMs
# have K = 64 or 128, two to four fused steps, and the 13-bit truncation costs about what FP8
# inputs already cost. Section 1 shows the regime where it does not: long reductions (large
# hidden sizes, the weight gradients' K = batch x tokens) lose accuracy steadily with K on the
# Hopper FP8 model, unless partial sums are promoted to FP32 every few steps.


# %% [markdown]
# ## 4. Other matrix units: AMD CDNA and Blackwell's block-scaled MMA
#
# The same call models other hardware (MMA-Sim, arXiv 2511.10909): AMD's CDNA1/2 round each
# product to FP32 and add them pairwise in FP32 (CDNA2 also flushes subnormals, as AMD documents
# for MI200); CDNA3 fuses 8 products with 24 fractional bits but aligns the accumulator by
# rounding *down*, so a tiny negative accumulator costs a unit where a positive one costs
# nothing. Blackwell's `kind::mxf8f6f4` adds each block's E8M0 scale exponent to its products'
# alignment, and `kind::mxf4nvf4` sums 16 FP4 products exactly before aligning by the scales.
# Below, rows spanning 2^-28..1: one E4M3 scale per tensor flushes the small rows; MXFP8's E8M0
# block scales (2^-127..2^127) keep every row; NVFP4's E4M3 block scales cover only about 2^17
# below its tensor scale, so its smallest rows are flushed too.

# %%
def one(acc, av, bv):
    return cpd.matmul(torch.tensor([av]), torch.tensor([[v] for v in bv]), acc=acc).item()


u, tiny = 2.0**-12, 2.0**-15
vectors = {
    "pairwise order: 1, u^2, u^2, 0": ([1.0, u, u, 0.0], [1.0, u, u, 0.0]),
    "pairwise order: 1, 0, u^2, u^2": ([1.0, 0.0, u, u], [1.0, 0.0, u, u]),
    "fp16 subnormal 2^-15 x 1": ([tiny], [1.0]),
    "c = -2^-30, then 1 x 1": ([-tiny] + [0.0] * 7 + [1.0] + [0.0] * 7, [tiny] + [0.0] * 7 + [1.0] + [0.0] * 7),
}
archs = ["cdna1", "cdna2", "cdna3", "hopper"]
print(f"{'fp16 vector':34s}" + "".join(f"{a:>22s}" for a in archs))
for name, (av, bv) in vectors.items():
    print(f"{name:34s}" + "".join(f"{one(cpd.tensor_core(a, a='fp16'), av, bv):22.17g}" for a in archs))

# block-scaled: rows of a whose magnitudes span 2^-28..1 -- one E4M3 scale per tensor flushes
# the small rows to zero, one E8M0 scale per 32 elements of a row keeps each of them
K = 256
a = torch.randn(8, K) * torch.exp2(-4.0 * torch.arange(8.0))[:, None]
b = torch.randn(K, 8)
ref = a.double() @ b.double()
sa_t, sb_t = 448 / a.abs().max(), 448 / b.abs().max()  # per-tensor scales (tensorwise recipe)
for label, acc, x, y, unscale in (
        ("hopper e4m3, per-tensor scale", HOPPER, a * sa_t, b * sb_t, sa_t * sb_t),
        ("blackwell mxfp8_e4m3 (block 32)", cpd.tensor_core("blackwell", a="mxfp8_e4m3"), a, b, 1.0),
        ("blackwell nvfp4 (block 16)", cpd.tensor_core("blackwell", a="nvfp4"), a, b, 1.0)):
    yv = cpd.matmul(x, y, acc=acc).double() / float(unscale)
    err = ((yv - ref).norm(dim=1) / ref.norm(dim=1)).max().item()  # the worst row
    print(f"{label:34s} worst row's relative error {err:.2e}")

# %% [markdown]
# ## 5. Block scales end to end: MXFP8 forward, MXFP8-E5M2 gradients
#
# `convert(..., acc=cpd.tensor_core("blackwell", a="mxfp8_e4m3"), scaling="block",
# grad_scaling="block")`: the forward GEMMs are Blackwell's `kind::mxf8f6f4` on MXFP8 operands
# (the block-scaled instruction quantizes them; the recipe keeps the statistics), and the output
# gradient of both backward GEMMs is quantized to MXFP8 E5M2 — along its last dim for the input
# gradient, along tokens for the weight gradient — as TransformerEngine's MXFP8 recipe does.

# %%
MXFP8 = cpd.tensor_core("blackwell", a="mxfp8_e4m3")
mx_model = cpd.nn.convert(base, acc=MXFP8, backward_mul=None, backward_acc=None, scaling="block",
                          grad_scaling="block", skip=("head",))
mx_steps = steps if SMALL else 40  # the block-scaled GEMMs are the slowest to emulate: the first 40 steps
mx_losses, mx_per_step = train(mx_model, MXFP8, mx_steps)
n_tail = min(5, mx_steps)
f32_tail = sum(runs["float32"][0][mx_steps - n_tail:mx_steps]) / n_tail
print(f"after {mx_steps} steps: float32 loss {f32_tail:.4f}, blackwell mxfp8 + e5m2 block grads "
      f"{sum(mx_losses[-n_tail:]) / n_tail:.4f} ({mx_per_step * 1e3:.0f} ms/step; float32 "
      f"{runs['float32'][1] * 1e3:.0f} ms/step)")
print(cpd.nn.scaling_report(mx_model))

# %% [markdown]
# The report's `scale_grad` rows are the gradient recipe: the range of its block scales (2^-127
# is the smallest E8M0 scale, which an all-zero block gets), and the fractions of gradient
# elements saturated at E5M2's 57344 or flushed to zero by their block's scale. The "overflow"
# of the weights is OCP MX's floor rule at work: a block whose amax lies in (448, 512) x its
# power-of-two scale saturates its largest elements to 448 (`cpd.mx.BlockFormat(...,
# scale_rule="ceil")` never does). Per-block scales adapt to every 32 elements, so a block of
# small values next to a block of large ones keeps its precision.
