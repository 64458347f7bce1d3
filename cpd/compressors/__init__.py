"""The literature's gradient compressors behind one interface.

Every compressor is a :class:`Compressor`: ``encode(tensor, state=None) -> Payload`` (the uint8
bytes that would go on the wire; ``payload.nbytes`` is their size) and ``decode(payload) ->
tensor``, with optional error feedback kept in a per-parameter, per-worker
:class:`CompressorState`. :func:`get` builds one from a name:

=================== ===================================================== ===========================
name                method                                                module
=================== ===================================================== ===========================
``dynamic_tree``    Dettmers (2016) 8-bit dynamic tree (absmax-normalized) :mod:`.dettmers`
``static_tree``     Dettmers (2016) 8-bit static tree (``static_tree:2``: exponent offset 10^2)
``linear``          Dettmers (2016) 8-bit linear quantization (absmax)
``mantissa8``       Dettmers (2016) 8-bit mantissa type (``mantissa8:2``)
``onebit``          Seide et al. (2014) 1-bit SGD, per column, error feedback :mod:`.quantization`
``threshold``       Strom (2015) threshold τ (``threshold:0.01``; default τ = 0.001, Dryden's MNIST value)
``adaptive``        Dryden et al. (2016) adaptive, π = 64 (``adaptive:16``; ``adaptive:64:sample=256``)
``bitpack8/16/24``  Bitpack truncation to the leading bytes (paper 004)     :mod:`.awp`
a format name       APS-style cast to a :class:`cpd.FloatFormat` (``"e5m2"``, ``"e2m1"``, ...) :mod:`.floatformat`
=================== ===================================================== ===========================

:class:`AWP` (adaptive weight precision) is a stateful helper for weights, not a gradient
compressor (see :mod:`cpd.compressors.awp`). :func:`compressed_allreduce` (also
``cpd.allreduce(..., compressor=...)``) sums W workers' tensors with a compressor on every link.

Reductions use the public protocol of :class:`Compressor` (``encode_raw`` / ``decode_raw`` on
chunks and partial sums, :class:`ErrorFeedback` for the residuals); :func:`get` lives in
:mod:`.names`. Importing this package registers :func:`get` and :func:`compressed_allreduce` in
:mod:`cpd.registry`, through which the lower layers reach them (docs/design.md §1).
"""

from __future__ import annotations

from .. import registry as _registry
from .awp import AWP, Bitpack, bitpack, bitunpack
from .base import Compressor, CompressorState, ErrorFeedback, Payload, pack_bits, unpack_bits
from .dettmers import DETTMERS_TYPES, Dettmers8bit, dynamic_tree_table, linear_table, mantissa_table, static_tree_table
from .floatformat import FormatCompressor
from .quantization import Adaptive, OneBit, Threshold, matrix_view
from .reduce import ALGORITHMS, CompressionReport, LayerCompression, compressed_allreduce, reduce_layers
from .names import NAMES, get

__all__ = [
    "Compressor", "CompressorState", "ErrorFeedback", "Payload", "get", "NAMES",
    "Dettmers8bit", "OneBit", "Threshold", "Adaptive", "FormatCompressor", "Bitpack", "AWP",
    "bitpack", "bitunpack", "pack_bits", "unpack_bits", "matrix_view",
    "linear_table", "static_tree_table", "dynamic_tree_table", "mantissa_table", "DETTMERS_TYPES",
    "compressed_allreduce", "reduce_layers", "CompressionReport", "LayerCompression", "ALGORITHMS",
]

# The lower layers (cpd.collectives, cpd.config) reach the compressors through cpd.registry.
_registry.register(_registry.COMPRESSOR_FACTORY, get)
_registry.register(_registry.COMPRESSED_ALLREDUCE, compressed_allreduce)
