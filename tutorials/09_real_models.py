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
# # Tutorial 9: models from the ecosystem — GPT-2 and ResNet-18, converted completely
#
# **What you will learn**
#
# 1. How to take a model you did not write — a Hugging Face GPT-2, a torchvision ResNet-18 —
#    and emulate every GEMM of it: `cpd.nn.convert` for the layers that hold weights (GPT-2's
#    projections are `transformers`' `Conv1D`, a linear layer with its weight stored (in, out)),
#    `cpd.nn.emulate` for the attention GEMMs the model's own code computes with SDPA.
# 2. How to check that nothing was left in float32 by accident: `cpd.nn.conversion_report`
#    lists each module, what it became and with which formats, what was skipped and why, and —
#    given example inputs — the GEMMs that only `emulate` reaches.
# 3. How to add a layer type of your own library in one line: `cpd.nn.register_conversion`.
# 4. Three short trainings of GPT-2 on synthetic sequences: float32, E4M3 products with FP16
#    accumulation, and NVIDIA Hopper's FP8 tensor core (`cpd.tensor_core("hopper", a="e4m3")`),
#    loss curves side by side.
#
# Needs `transformers` (and `torchvision` for the ResNet part): `pip install -e '.[models]'`.
# The models are built from small configs with random weights: nothing is downloaded. It runs on
# the GPU when there is one. `CPD_TUTORIAL_SMALL=1` shrinks every size so the script runs in
# seconds; figures go to `$CPD_TUTORIAL_OUT` (default: a new temporary folder).

# %%
import copy
import importlib.util
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
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HAS_HF = importlib.util.find_spec("transformers") is not None
try:  # torchvision's models are pure Python, but the package needs its compiled ops built for your torch
    import torchvision

    HAS_TV = True
except ImportError:
    HAS_TV = False
except RuntimeError as e:  # e.g. a CUDA build of torchvision beside a CPU build of torch
    HAS_TV = False
    print(f"torchvision is installed but does not load beside this torch ({str(e).splitlines()[0]})")
HOPPER = cpd.tensor_core("hopper", a="e4m3")
torch.manual_seed(0)
print(f"device: {DEVICE}; transformers: {HAS_HF}; torchvision: {HAS_TV}")

# %% [markdown]
# ## GPT-2 from a config
#
# Two layers, width 64 (128 in the full run), a vocabulary of 64 tokens. `GPT2LMHeadModel`
# ties its output layer to the token embedding: the converted model keeps that tie.

# %%
if HAS_HF:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    V, T = 64, (16 if SMALL else 64)
    width = 64 if SMALL else 128
    config = GPT2Config(n_layer=2, n_embd=width, n_head=4, vocab_size=V, n_positions=T, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpt2 = GPT2LMHeadModel(config).to(DEVICE)
    print(gpt2.transformer.h[0])
else:
    print("transformers is not installed: the GPT-2 part is skipped (pip install -e '.[models]')")

# %% [markdown]
# ## Convert, and read the report
#
# `convert` returns a copy (the original is untouched). With `example_inputs` it also runs both
# models once and checks that every replacement returns what its module returned (shapes).
# The report's first table is per module; the second lists the GEMMs that are not inside a
# converted module: here the two SDPA calls (`q @ k^T`, `p @ v`) of each attention layer —
# `emulate` reaches them, `convert` cannot (they have no weight).

# %%
if HAS_HF:
    ids = torch.randint(0, V, (2, T), device=DEVICE)
    fp8 = cpd.nn.convert(gpt2, mul=cpd.E4M3, acc=cpd.FP16, example_inputs={"input_ids": ids})
    report = cpd.nn.conversion_report(fp8, {"input_ids": ids})
    print(report)
    assert report.unconverted == [] and fp8.lm_head.weight is fp8.transformer.wte.weight
    print("\nas data:", report.to_dict()["modules"][0])

# %% [markdown]
# A layer type `convert` does not know is **reported, never skipped silently**: a
# `ConversionWarning` names it, and the report marks it `unsupported`. `register_conversion`
# teaches `convert` the type: the factory gets the module and convert's formats and returns the
# emulated module holding the same parameters. Here a toy type that computes like `Conv1D`:

# %%
import warnings


class MyProjection(torch.nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.nf, self.nx = n_out, n_in
        self.weight = torch.nn.Parameter(torch.randn(n_in, n_out) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, self.nx), self.weight).reshape(*x.shape[:-1], self.nf)


toy = torch.nn.Sequential(MyProjection(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    half = cpd.nn.convert(toy, mul=cpd.E4M3, acc=cpd.FP16)
print("warning:", caught[0].message if caught else None)
print(cpd.nn.conversion_report(half))

cpd.nn.register_conversion(MyProjection, lambda m, mul, acc, **kw: cpd.nn.QuantTransposedLinear(
    m.nf, m.nx, mul=mul, acc=acc))
print(cpd.nn.conversion_report(cpd.nn.convert(toy, mul=cpd.E4M3, acc=cpd.FP16)))
cpd.nn.register_conversion(MyProjection, None)  # unregister

# %% [markdown]
# ## Three trainings of GPT-2
#
# Synthetic sequences with structure to learn: each sequence counts up by its own step,
# `x[t+1] = (x[t] + k) mod V`. The same initial weights, the same batches:
#
# * float32;
# * E4M3 products accumulated in FP16 (`convert` for the projections and the output layer,
#   `emulate` with the same formats for the attention GEMMs), backward GEMMs likewise;
# * Hopper's FP8 tensor core: operands rounded to E4M3, products summed by the modelled fused
#   dot-product unit (13 fraction bits below the largest term of each 32-product step), FP32 out.
#
# `convert`'s converted model under `emulate` computes exactly what the original model under
# `emulate` computes (bit for bit, tested in `tests/test_convert_zoo.py`): converting moves the
# GEMMs into layers you can configure one by one (`skip=`, per-layer formats, scaling recipes).

# %%
def batches(steps, batch, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, V, (batch, 1), generator=g)
        step = torch.randint(1, 4, (batch, 1), generator=g)
        yield ((start + step * torch.arange(T)) % V).to(DEVICE)


def train(model, gemm, steps, batch):
    model = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, t0 = [], time.perf_counter()
    for x in batches(steps, batch):
        opt.zero_grad()
        if gemm is None:
            loss = model(x, labels=x).loss
        else:
            with cpd.nn.emulate(**gemm):
                loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - t0


if HAS_HF:
    steps, batch = (3, 4) if SMALL else (150, 16) if DEVICE == "cuda" else (60, 8)  # CPU: a few minutes
    runs = {
        "float32": (gpt2, None),
        "E4M3 x, FP16 +": (cpd.nn.convert(gpt2, mul=cpd.E4M3, acc=cpd.FP16), dict(mul=cpd.E4M3, acc=cpd.FP16)),
        "Hopper FP8 tensor core": (cpd.nn.convert(gpt2, acc=HOPPER), dict(acc=HOPPER)),
    }
    curves = {}
    for name, (model, gemm) in runs.items():
        curves[name], secs = train(model, gemm, steps, batch)
        print(f"{name:24s} loss {curves[name][0]:.3f} -> {curves[name][-1]:.3f}   {secs:6.1f} s")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, c in curves.items():
        ax.plot(range(1, len(c) + 1), c, label=name)
    ax.set(xlabel="step", ylabel="training loss", title=f"GPT-2 (2 layers, width {width}) on {DEVICE}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "gpt2_losses.png", dpi=90)
    plt.close(fig)
    print("plot:", OUT / "gpt2_losses.png")

# %% [markdown]
# ## ResNet-18 from torchvision
#
# torchvision's ResNet-18 is made of `nn.Conv2d`, `nn.BatchNorm2d` and one `nn.Linear`: every
# GEMM is in a layer `convert` replaces (convolutions become im2col + emulated GEMM), and the
# report's second table is empty — nothing is left for `emulate`.

# %%
if HAS_TV:
    resnet = torchvision.models.resnet18(num_classes=10).to(DEVICE)
    img = torch.randn(4, 3, 32, 32, device=DEVICE)
    labels = torch.randint(0, 10, (4,), device=DEVICE)
    q = cpd.nn.convert(resnet, mul=cpd.E4M3, acc=cpd.FP16, example_inputs=img)
    rep = cpd.nn.conversion_report(q, img)
    print(rep)
    assert rep.unconverted == [] and rep.gemms == []
    for name, model in (("float32", resnet), ("E4M3 x, FP16 +", q)):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(1 if SMALL else 5):
            opt.zero_grad()
            loss = F.cross_entropy(model(img), labels)
            loss.backward()
            opt.step()
        print(f"ResNet-18 {name}: last loss {loss.item():.4f}")
else:
    print("torchvision is not available: the ResNet-18 part is skipped (pip install -e '.[models]' "
          "with a torchvision built for your torch)")

# %% [markdown]
# ## What to take away
#
# * `cpd.nn.convert` handles `nn.Linear`/`nn.Conv*`/`nn.MultiheadAttention`, `transformers`'
#   `Conv1D` and `timm`'s `Linear`; `cpd.nn.register_conversion` adds any other type.
# * `cpd.nn.conversion_report(model, example_inputs)` is the check that the whole model is
#   emulated: `report.unconverted` must be empty, and the GEMMs it lists outside converted
#   modules must run under `cpd.nn.emulate`.
