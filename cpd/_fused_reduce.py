"""The emulated allreduce's ring, sequential and hierarchical orders in one kernel launch.

:func:`cpd.collectives.reduce_matrix` runs an order hop by hop: one rounded :func:`cpd.add` over
every chunk of a hop, so each hop reads and writes the partial sums once more (a ring of 64
workers: 63 passes over the data, 8.8x ``torch.stack(ws).sum(0)`` on an H100). Where the CUDA
kernels serve the tensors' device (a GPU, or CPU tensors under :func:`cpd._shim.on_host` in the
tests), :func:`reduce_rows` runs the same order in ``cuda/kernels/cast.cu``'s
``cpd_reduce_rows`` instead: one thread per element does every add of that element in
registers, reading each input once (the initial cast fused into the load) and writing the sum
once. The adds, their order and their random words are those of the hop-by-hop path, and the
(seed, offset) pairs are drawn up front from the generator in the order that path draws them
(one per cpd.cast / cpd.add call), so the bits and the generator's state after the call are the
same. The tree order (and the CPU, which has its own vector add loops) keeps the hop-by-hop path.
"""

from __future__ import annotations

import torch

from . import _impl
from .formats import FloatFormat
from .ops import _fmt_args, draw_seed
from .rounding import Rounding

__all__ = ["plan", "seed_pairs", "reduce_rows", "TREE_MAX_WORKERS"]

#: The most workers cpd_reduce_tree takes: its per-thread stack has CPD_TREE_LEVELS = 15 levels
#: (cuda/kernels/cast.cu); more workers keep the hop-by-hop path.
TREE_MAX_WORKERS = 2**15


def plan(algorithm: str, w: int, group_size: int | None, kahan: bool) -> tuple[int, bool] | None:
    """(rows per group k, whether the merges carry the incoming partial's compensation) of an
    order, or None for an order no kernel runs. The ring is k = 1, the sequential sum k = w; the
    hierarchical order's Kahan merges add the leaders' compensations; the tree (``cpd_reduce_tree``)
    is k = 0, and with Kahan each of its merges carries the sender's compensation."""
    if algorithm == "ring":
        return 1, False
    if algorithm == "sequential":
        return w, False
    if algorithm == "hierarchical":
        return group_size, kahan
    if algorithm == "tree" and w <= TREE_MAX_WORKERS:
        return 0, kahan
    return None


def seed_pairs(w: int, k: int, kahan: bool, leader_comp: bool, cast_inputs: bool) -> int:
    """How many (seed, offset) pairs the hop-by-hop path draws in stochastic mode: the initial
    cast, k - 1 merges of stage 1 and w / k - 1 ring hops, each merge one add (plain) or four
    (Kahan; five with the leader's compensation); for the tree (k = 0) the cast and one merge per
    level, ceil(log2 w) levels."""
    if k == 0:
        return int(cast_inputs) + (w - 1).bit_length() * (5 if kahan else 1)
    adds1 = 4 if kahan else 1
    adds2 = (5 if leader_comp else 4) if kahan else 1
    return int(cast_inputs) + (k - 1) * adds1 + (w // k - 1) * adds2


def reduce_rows(x: torch.Tensor, fmt: FloatFormat, mode: Rounding, saturate: bool, kahan: bool, algorithm: str,
                group_size: int | None, generator, cast_inputs: bool) -> torch.Tensor | None:
    """The (n,) allreduce of the rows of the float32 matrix ``x`` (w, n), n >= 1, in one launch,
    or None where no kernel serves ``x``'s device or the order (the caller then runs it hop by
    hop)."""
    order = plan(algorithm, x.shape[0], group_size, kahan)
    engine = _impl.kernels_engine(x.device) if order is not None else None
    if engine is None:
        return None
    w, n = x.shape
    k, leader_comp = order
    if mode is Rounding.STOCHASTIC:
        count = seed_pairs(w, k, kahan, leader_comp, cast_inputs)
        pairs = [draw_seed(generator, x.device) for _ in range(count)]
        seeds = torch.cat(pairs) if pairs else torch.zeros(2, dtype=torch.int64)
    else:
        seeds = torch.zeros(2, dtype=torch.int64)
    seeds = seeds.to(x.device)
    out = torch.empty(n, dtype=torch.float32, device=x.device)
    engine.reduce_rows(x.contiguous(), out, w, k, kahan, leader_comp, cast_inputs, _fmt_args(fmt), mode.code, saturate,
                       32, seeds)
    return out
