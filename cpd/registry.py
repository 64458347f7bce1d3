"""Late-bound entry points of higher layers, so that lower layers never import upward.

A lower module (:mod:`cpd.collectives`, :mod:`cpd.config`) needs two things the compressor
package provides: building a compressor from a name, and the compressed allreduce. Instead of an
upward import (which made the ``collectives -> compressors -> collectives`` cycle),
:mod:`cpd.compressors` registers them here when it is imported (``import cpd`` always imports it),
and the lower module looks them up at call time. Likewise :func:`cpd.matmul` (:mod:`cpd.ops`)
reaches the fused-dot GEMM that :mod:`cpd.tensor_core` (over :mod:`cpd.ops`) registers. See
docs/design.md §1.
"""

from __future__ import annotations

__all__ = ["register", "lookup", "COMPRESSOR_FACTORY", "COMPRESSED_ALLREDUCE", "FUSED_DOT_MATMUL"]

#: ``factory(spec) -> Compressor``: a compressor from a name, a format or a Compressor.
COMPRESSOR_FACTORY = "compressor_factory"
#: ``compressed_allreduce(tensors, compressor, *, algorithm, states) -> (result, info)``.
COMPRESSED_ALLREDUCE = "compressed_allreduce"
#: ``tensor_core_matmul(a, b, acc, **matmul_kwargs)``: :func:`cpd.matmul` with ``acc=FusedDot``
#: (registered by :mod:`cpd.tensor_core`; :mod:`cpd.ops` is below it).
FUSED_DOT_MATMUL = "fused_dot_matmul"

_ENTRIES: dict = {}
#: Which package registers each entry, and what it serves (for the error of a missing entry).
_OWNERS = {COMPRESSOR_FACTORY: ("cpd.compressors", "compressors"),
           COMPRESSED_ALLREDUCE: ("cpd.compressors", "compressors"),
           FUSED_DOT_MATMUL: ("cpd.tensor_core", "acc=FusedDot")}


def register(name: str, fn) -> None:
    """Register ``fn`` under ``name`` (a later registration replaces an earlier one)."""
    if not isinstance(name, str) or not callable(fn):
        raise TypeError(f"register(name, fn) needs a str and a callable, got {type(name).__name__}, "
                        f"{type(fn).__name__}")
    _ENTRIES[name] = fn


def lookup(name: str):
    """The entry registered under ``name``; RuntimeError naming the package to import if none."""
    try:
        return _ENTRIES[name]
    except KeyError:
        owner, what = _OWNERS.get(name, (None, None))
        hint = f": import {owner} (import cpd does) before using {what}" if owner else ""
        raise RuntimeError(f"nothing is registered as {name!r}{hint}") from None
