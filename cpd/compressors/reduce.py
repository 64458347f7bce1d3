"""Allreduce of compressed gradients (the reduce step decodes, sums in float32 and re-encodes),
and the per-layer reduction :class:`cpd.APSOptimizer` runs with ``compressor=``.

Order (W workers, flat tensor or, for the column-wise methods, the columns of the matrix view split
into W chunks like ``numpy.array_split``; chunk c is owned by the reduce-scatter as in
:func:`cpd.allreduce`):

0. **Each worker quantizes its whole contribution once** (Dryden et al. 2016, Section 3.4:
   "gradient updates are quantized and then split up and scattered"): with error feedback,
   ``v_w = g_w + residual_w`` and ``q_w = decode(encode(v_w chunk by chunk))``, the new residual
   being ``v_w - q_w``. Without states, ``v_w = g_w``.
1. ``ring`` (reduce-scatter along the ring, re-encoding at every hop): chunk c starts at worker c,
   which sends ``P = encode(v_c[c])``. At hop h = 1..W-1 worker ``w = (c+h) % W`` decodes the
   partial and adds its own quantized contribution in float32, ``s = decode(P) + q_w[c]``, and,
   unless it is the last hop, sends ``P = encode(s)`` on (no error feedback on partial sums: their
   quantization error is lost, as in the papers).
   ``pairwise`` (Dryden et al.'s pairwise-exchange reduce-scatter): every worker w sends
   ``encode(v_w[c])`` to worker c, which sums ``q_0[c] + q_1[c] + ... + q_{W-1}[c]`` in float32 in
   worker order.
2. Allgather: the owner encodes the reduced chunk once more, ``P = encode(s)``; the payload
   travels the ring to the W-1 other workers and every worker (the owner too) holds
   ``decode(P)``: all workers end with identical bits.

Bytes counted: every payload that crosses a link (W-1 per chunk in step 1, W-1 copies of the final
payload in step 2); the float32 reference counts the same pattern with 4 bytes per element,
``2 (W-1) * 4n`` for the whole tensor.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..collectives import allreduce
from ..config import COMPRESSED_ALGORITHMS, CompressedReduceConfig
from ..formats import FP32
from ..primitives import all_finite, chunk_bounds, stack_workers
from .base import Compressor, CompressorState, ErrorFeedback, check_tensor
from .quantization import matrix_view

__all__ = ["compressed_allreduce", "ALGORITHMS", "CompressionReport", "LayerCompression", "reduce_layers",
           "split_chunks", "quantize_chunks"]

#: Orders of the compressed allreduce.
ALGORITHMS = COMPRESSED_ALGORITHMS


def split_chunks(compressor: Compressor, v: torch.Tensor, w: int):
    """The W chunks of one worker's tensor (views: of the flat tensor, or of the columns of the
    matrix view for the column-wise methods; ``numpy.array_split`` sizes) and a function putting
    W chunks back into ``v``'s shape."""
    if compressor.columnwise:
        m = matrix_view(v)
        bounds = chunk_bounds(m.shape[1], w)
        return [m[:, a:b] for a, b in bounds], lambda parts: torch.cat(parts, 1).reshape(v.shape)
    flat = v.reshape(-1)
    bounds = chunk_bounds(flat.numel(), w)
    return [flat[a:b] for a, b in bounds], lambda parts: torch.cat(parts).reshape(v.shape)


_chunks = split_chunks  # the name cpd.distributed imports


def quantize_chunks(compressor: Compressor, ef: ErrorFeedback, w: int):
    """Step 0 of the module docstring for one worker: encode ``ef.value`` chunk by chunk, commit
    the error feedback with the decoded whole, and return ``(payloads, decoded chunks, join)``
    (payload None for an empty chunk)."""
    chunks, join = split_chunks(compressor, ef.value, w)
    pays = [compressor.encode_raw(c) if c.numel() else None for c in chunks]
    q = join([compressor.decode_raw(p) if p is not None else c.clone() for p, c in zip(pays, chunks)])
    ef.commit(q)
    return pays, split_chunks(compressor, q, w)[0], join


def compressed_allreduce(tensors, compressor, *, algorithm: str = "ring", states=None):
    """Allreduce (sum) of W workers' tensors with a compressor on every link; returns
    ``(result, info)``, ``info`` a dict with ``bytes`` (all payloads sent), ``fp32_bytes`` (the same
    transfers in float32), ``ratio`` and ``encodes``. See the module docstring for the order.

    Args:
        tensors: a list of W same-shape float tensors, or one tensor with a leading worker dimension.
        compressor: a :class:`Compressor` or a registry name (``"onebit"``, ``"dynamic_tree"``, ...).
        algorithm: ``"ring"`` or ``"pairwise"``.
        states: None, or a list of W :class:`CompressorState` (error feedback of each worker for this
            tensor; only for compressors with ``error_feedback=True``). Updated in place.
    """
    cfg = CompressedReduceConfig(compressor, algorithm)   # validates both
    comp, algorithm = cfg.compressor, cfg.algorithm
    x, shape = stack_workers(tensors)
    w = x.shape[0]
    if states is not None:
        if not comp.error_feedback:
            raise ValueError(f"states: the {comp.name} compressor was built without error feedback "
                             "(error_feedback=False); pass states=None")
        if not isinstance(states, (list, tuple)) or len(states) != w \
                or not all(isinstance(s, CompressorState) for s in states):
            raise TypeError(f"states must be a list of {w} cpd.compressors.CompressorState (one per worker)")
    with torch.no_grad():
        return _reduce(comp, x, shape, w, algorithm, states)


def _reduce(comp, x, shape, w, algorithm, states):
    n = x.shape[1]
    fp32 = 2 * (w - 1) * 4 * n
    info = {"bytes": 0, "fp32_bytes": fp32, "encodes": 0}
    vs, qs = [], []
    for i in range(w):
        ef = ErrorFeedback(x[i].reshape(shape), states[i] if states is not None else None)
        if not all_finite(ef.value):
            raise ValueError(f"tensors[{i}] contains inf or NaN, which the {comp.name} compressor cannot encode")
        pays, q_chunks, join = quantize_chunks(comp, ef, w)
        info["encodes"] += sum(p is not None for p in pays)
        vs.append(pays)
        qs.append(q_chunks)
    if w == 1:
        info["ratio"] = math.inf
        return join(qs[0]).reshape(shape).clone(), info
    out = []
    for c in range(w):
        if qs[c][c].numel() == 0:
            out.append(qs[c][c])
            continue
        if algorithm == "ring":
            p = vs[c][c]
            for h in range(1, w):
                info["bytes"] += p.nbytes
                s = comp.decode_raw(p) + qs[(c + h) % w][c]
                p = comp.encode_raw(s)
                info["encodes"] += 1
        else:  # pairwise
            s = qs[0][c].clone()
            for i in range(1, w):
                s = s + qs[i][c]
            info["bytes"] += sum(vs[i][c].nbytes for i in range(w) if i != c)
            p = comp.encode_raw(s)
            info["encodes"] += 1
        info["bytes"] += (w - 1) * p.nbytes
        out.append(comp.decode_raw(p))
    _, join = split_chunks(comp, x[0].reshape(shape), w)
    info["ratio"] = info["fp32_bytes"] / info["bytes"] if info["bytes"] else math.inf
    return join(out), info


@dataclasses.dataclass
class LayerCompression:
    """One layer of a compressed gradient reduction."""

    #: Layer name.
    name: str
    #: ``"compressed"``, ``"fp32"`` (sent uncompressed), ``"skipped"`` (no gradient) or
    #: ``"nonfinite"`` (inf/NaN in a gradient: float32 sum, the step is skipped).
    status: str
    #: Elements per worker.
    numel: int = 0
    #: Bytes of every payload sent (all links, both phases).
    bytes: int = 0
    #: The same transfers in float32.
    fp32_bytes: int = 0
    #: ||h - r||_2 / ||h||_2 with h the float64 sum of the raw gradients and r the result.
    rel_l2_error: float = math.nan

    @property
    def ratio(self) -> float:
        return self.fp32_bytes / self.bytes if self.bytes else math.inf


@dataclasses.dataclass
class CompressionReport:
    """Per-layer bytes and errors of one compressed reduction (``print`` shows a table)."""

    method: str
    layers: list
    found_inf: bool = False

    @property
    def bytes(self) -> int:
        return sum(lr.bytes for lr in self.layers)

    @property
    def fp32_bytes(self) -> int:
        return sum(lr.fp32_bytes for lr in self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __str__(self) -> str:
        head = f"{'layer':<16} {'status':<11} {'numel':>8} {'bytes':>10} {'fp32 bytes':>11} {'ratio':>7} {'rel L2':>9}"
        rows = [head, "-" * len(head)]
        for lr in self.layers:
            rows.append(f"{lr.name:<16} {lr.status:<11} {lr.numel:>8} {lr.bytes:>10} {lr.fp32_bytes:>11} "
                        f"{lr.ratio:>7.2f} {lr.rel_l2_error:>9.2e}")
        total = self.fp32_bytes / self.bytes if self.bytes else math.inf
        rows.append(f"{self.method}: {self.bytes} bytes sent, {self.fp32_bytes} in float32 (ratio {total:.2f})")
        return "\n".join(rows)


def reduce_layers(layers: dict, compressor: Compressor, states: dict, *, algorithm: str = "ring",
                  fp32_layers=()) -> tuple[dict, CompressionReport]:
    """Reduce ``{name: list of W gradients or None}`` with the compressor (``fp32_layers`` in
    float32 through :func:`cpd.allreduce`). ``states`` maps a layer name to its W
    :class:`CompressorState` and is filled on first use (for error-feedback compressors). If any
    gradient is inf/NaN nothing is compressed and no state changes: every layer is summed in
    float32 and ``report.found_inf`` is set."""
    out, rows = {}, []
    found_inf = any(g is not None and not all_finite(g)
                    for grads in layers.values() if grads is not None for g in grads)
    fp32_alg = "ring" if algorithm == "ring" else "sequential"
    for name, grads in layers.items():
        if grads is None:
            out[name] = None
            rows.append(LayerCompression(name, "skipped"))
            continue
        ref = next(g for g in grads if g is not None)
        gs = [check_tensor(g if g is not None else torch.zeros_like(ref)) for g in grads]
        w, n = len(gs), ref.numel()
        exact = torch.stack([g.double() for g in gs]).sum(0)
        if found_inf or name in fp32_layers:
            r = allreduce(gs, FP32, algorithm=fp32_alg)
            status, nbytes, fb = ("nonfinite" if found_inf else "fp32"), 2 * (w - 1) * 4 * n, 2 * (w - 1) * 4 * n
        else:
            st = None
            if compressor.error_feedback:
                st = states.setdefault(name, [CompressorState() for _ in range(w)])
            r, info = compressed_allreduce(gs, compressor, algorithm=algorithm, states=st)
            status, nbytes, fb = "compressed", info["bytes"], info["fp32_bytes"]
        hn = float(torch.linalg.vector_norm(exact))
        err = float(torch.linalg.vector_norm(exact - r.double()))
        rel = err / hn if hn > 0 else (0.0 if err == 0 else math.inf)
        out[name] = r
        rows.append(LayerCompression(name, status, n, nbytes, fb, rel))
    return out, CompressionReport(compressor.name, rows, found_inf)
