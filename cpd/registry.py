"""Late-bound entry points of higher layers, so that lower layers never import upward.

A lower module (:mod:`cpd.collectives`, :mod:`cpd.config`) needs two things the compressor
package provides: building a compressor from a name, and the compressed allreduce. Instead of an
upward import (which made the ``collectives -> compressors -> collectives`` cycle),
:mod:`cpd.compressors` registers them here when it is imported (``import cpd`` always imports it),
and the lower module looks them up at call time. See docs/design.md §1.
"""

from __future__ import annotations

__all__ = ["register", "lookup", "COMPRESSOR_FACTORY", "COMPRESSED_ALLREDUCE"]

#: ``factory(spec) -> Compressor``: a compressor from a name, a format or a Compressor.
COMPRESSOR_FACTORY = "compressor_factory"
#: ``compressed_allreduce(tensors, compressor, *, algorithm, states) -> (result, info)``.
COMPRESSED_ALLREDUCE = "compressed_allreduce"

_ENTRIES: dict = {}


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
        raise RuntimeError(f"nothing is registered as {name!r}: import cpd.compressors (import cpd does) "
                           "before using compressors") from None
