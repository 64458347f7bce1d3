"""Real multi-process low-precision gradient communication on ``torch.distributed``.

The single-process emulator (:func:`cpd.allreduce`, :func:`cpd.aps_allreduce`) answers "would it
converge?"; this module sends the same low-precision sums between real processes (gloo on CPU,
NCCL on GPU; never a home-made transport) and gives the same bits, so a user can prototype in one
process and deploy on many:

* :class:`APSHookState` + :func:`aps_hook`: a DDP communication hook
  (``ddp.register_comm_hook(state, cpd.distributed.aps_hook)``);
* ``cpd.APSOptimizer(opt, fmt=..., process_group=dist.group.WORLD)``: the same inside ``step()``,
  without DDP.

What travels, per DDP bucket (or per optimizer step), on a dedicated process group:

1. **Exponent exchange**: one ``all_reduce(MAX)`` of one int32 per layer: the layer's APS exponent
   ``ceil(log2(max|g| * W))`` (the APS paper's Algorithm 1, FINDMAXEXP; Gong et al.), with
   sentinels for "no gradient", "all zero" and "inf/NaN", so every rank takes the same decision
   for every layer (scale, float32, skip).
2. **Scale and encode**: ``g * 2**s`` cast to the format (as :func:`cpd.aps_allreduce`), sent as
   integer codes (:func:`cpd.encode`): one byte per element for 8-bit formats, sub-byte formats
   packed (:func:`pack_codes`: two 4-bit codes per byte, eight 1-bit codes per byte, 3/5/6/7-bit
   codes as a bit stream).
3. **Reduce**: ``"ring"``: reduce-scatter over point-to-point messages (``batch_isend_irecv``),
   every hop decodes, adds in the format (:func:`cpd.add`, optional Kahan compensation, which
   then travels with the partial sum), re-encodes; then an allgather of the owned chunks.
   ``"hierarchical"``: the codes of each group gathered at its first rank, a sequential sum
   there, the ring across group leaders, sent back (gloo: pipelined point-to-point sub-chunks;
   NCCL: gather and broadcast on subgroups from ``dist.new_subgroups_by_enumeration``).
   ``"one_rounding"``: an all-to-all of the codes, each rank sums its chunk in float32 (worker
   order), an allgather of the float32 chunks (gloo: pipelined sub-chunks): one rounding only (the
   cast), for users who want the bandwidth saving of the first half without low-precision sums.
4. Decode, unscale (``/ 2**s``), divide by W (by the caller: the hook or the optimizer).

Integer codes are never summed with ``all_reduce(SUM)`` (uint8 codes would wrap around).

With a gradient compressor (``APSHookState(compressor=...)``, ``APSOptimizer(compressor=...,
process_group=...)``) the exchange is the emulator's ``cpd.compressors.reduce_layers`` instead,
over point-to-point messages (:mod:`cpd.distributed.reduce_compressed` spells out the order and
the message layout); the sums equal ``cpd.allreduce(..., compressor=...)`` per layer bit for bit.

Bit-identity contract: with the same format, algorithm, group size, Kahan flag, rounding and
worker order (worker w = the w-th rank of the process group), the sums equal
``cpd.aps_allreduce(...)`` (``scaling="aps"``), ``cpd.scaled_allreduce(..., scale_exp)``
(``"loss"``) or ``cpd.scaled_allreduce(..., 0)`` (None) bit for bit, layer by layer (each layer
is chunked like ``numpy.array_split`` into W chunks, chunk c starts at worker c: the emulator's
order, docs/design.md §3). ``"one_rounding"`` has no emulator algorithm; its specification is
``cpd.allreduce(cast(g * 2**s, fmt), cpd.FP32, algorithm="sequential") / 2**s``. Only the
deterministic rounding modes are supported (stochastic rounding draws its bits per emulator call,
which W processes cannot reproduce).

Threading: gloo's point-to-point operations give no futures. The hook hands each bucket to one
communication thread per state (a FIFO queue) and returns a ``torch.futures.Future`` the thread
completes, so backward continues while buckets are reduced, and the buckets of every rank are
reduced in the same order (DDP launches hooks in bucket order). All traffic goes through a
process group created for the state, so it never interleaves with DDP's own collectives.

Faults: every wait is bounded by ``timeout`` seconds; a rank that raises or dies makes the
others raise :class:`CommunicationError` (from ``loss.backward()`` or ``step()``) within the
timeout, never hang. After an error the state refuses further work. Mismatched configurations
(format, algorithm, ..., world size) are detected when the state is created, and mismatched
layers (names, shapes) at the first exchange, by an ``all_gather_object`` of the configuration:
every rank raises a ValueError naming the fields and each rank's value.

Reference: Han, Demmel, Si, You, "Auto-Precision Scaling for Distributed Deep Learning" (APS,
and its CPD system, which communicates gradients in arbitrary low-precision formats): Algorithm
1 (per-layer exponent, allreduce-MAX, scale, low-precision allreduce, unscale), the ring and
hierarchical allreduce, Kahan summation and the FP32 last layer. Reading implemented where the
paper is silent: the exponent is exchanged as an int32 allreduce-MAX (the paper's FINDMAXEXP of
``grad * world_size``), the low-precision sum is rounded at every hop as the emulator specifies,
and a Kahan compensation travels with the partial sum it belongs to.

Package layout (the layers import downward only):

* :mod:`.wire`, :mod:`.layout` — wire formats, byte models, chunk-major layouts and sub-chunks;
* :mod:`.kernels` (+ :mod:`.cuda_kernels`) — the fused compiled passes (encode, hop, decode);
* :mod:`.transport` — dedicated groups, point-to-point, timeouts, failures, byte counters, thread;
* :mod:`.orders` — ring (sub-chunk pipelined), hierarchical, one_rounding on wire bytes;
* :mod:`.reduce_format` / :mod:`.reduce_compressed` — the two kinds of reduction of a bucket;
* :mod:`.engine` — the two composed, configuration agreement, errors;
* :mod:`.hook` — the DDP front end (``APSOptimizer(process_group=)`` is the other).
"""

from __future__ import annotations

from . import kernels
from ..config import PROCESS_ALGORITHMS as ALGORITHMS
from .engine import _Engine
from .hook import APSHookState, aps_hook
from .report import CommunicationError, StepReport
from .wire import float32_ring_bytes, pack_codes, unpack_codes

__all__ = ["APSHookState", "aps_hook", "CommunicationError", "StepReport", "pack_codes", "unpack_codes",
           "ALGORITHMS", "float32_ring_bytes", "kernels"]
