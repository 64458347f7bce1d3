"""One training step of tutorial 7's transformer (2 layers, d = 64, batch 64 x 16 tokens) under
emulated Hopper FP8 (``convert(..., acc=tensor_core("hopper", a="e4m3"), scaling="delayed")``
plus ``emulate`` for the attention GEMMs) versus float32, side by side in one process.

    python benchmarks/bench_emulate_step.py [--threads 1] [--repeat 5]

Goal (issue 15): <= 30x float32. One thread by default: on a shared machine, two-thread timings
of millisecond-sized float32 steps measure the scheduler, not the code.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpd  # noqa: E402
from _timing import median_time  # noqa: E402
from bench_tensor_core import cpu_name  # noqa: E402

V, T, D, H = 16, 16, 64, 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.ff1, self.ff2 = torch.nn.Linear(D, 2 * D), torch.nn.Linear(2 * D, D)
        self.n1, self.n2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)

    def forward(self, x):
        n, t, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).reshape(n, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(n, t, D))
        return x + self.ff2(F.gelu(self.ff1(self.n2(x))))


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(V, D), torch.nn.Parameter(torch.zeros(T, D))
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.head = torch.nn.Linear(D, V)

    def forward(self, tokens):
        return self.head(self.blocks(self.emb(tokens) + self.pos))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = Tiny()
    x = torch.randint(0, V, (args.batch, T))
    y = torch.randint(0, V, (args.batch, T))
    acc = cpd.tensor_core("hopper", a="e4m3")
    fp8 = cpd.nn.convert(base, acc=acc, backward_mul=None, backward_acc=None, scaling="delayed", skip=("head",))
    f32 = copy.deepcopy(base)

    def step(model, emulated):
        if emulated:
            with cpd.nn.emulate(acc=acc, backward_mul=None, backward_acc=None, scaling="tensorwise"):
                out = model(x)
        else:
            out = model(x)
        F.cross_entropy(out.reshape(-1, V), y.reshape(-1)).backward()

    print(f"{cpu_name()}; {torch.get_num_threads()} threads; batch {args.batch} x {T} tokens, d={D}, 2 layers")
    t32 = median_time(lambda: step(f32, False), max(args.repeat, 20))
    t8 = median_time(lambda: step(fp8, True), args.repeat)
    t32 = min(t32, median_time(lambda: step(f32, False), max(args.repeat, 20)))
    print(f"float32 step {t32 * 1e3:8.2f} ms   hopper fp8 (emulated) step {t8 * 1e3:8.2f} ms   ratio {t8 / t32:6.1f}x")


if __name__ == "__main__":
    main()
