"""The :class:`Compressor` interface, its :class:`Payload` (the bytes on the wire), the
per-parameter :class:`CompressorState` (error feedback) and the byte-level helpers every
compressor shares (bit packing, float32/int32 <-> bytes).

A compressor maps a float32 tensor to a :class:`Payload` whose ``parts`` are uint8 tensors: the
exact bytes a real implementation would send (signs packed 8 per byte, 32-bit index words,
float32 reconstruction values as their 4 little-endian bytes, ...). ``payload.nbytes`` is their
total size. What both ends know in advance (the tensor's shape, the compressor's configuration
such as Strom's tau or the exponent offset of Dettmers' static types) is not sent and not counted.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..primitives import all_finite

__all__ = ["Payload", "Compressor", "CompressorState", "ErrorFeedback", "pack_bits", "unpack_bits", "float_bytes",
           "bytes_float", "int_bytes", "bytes_int"]

_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True, eq=False)
class Payload:
    """What one encode puts on the wire.

    ``parts`` maps a part name to a 1-D uint8 tensor (real bytes); ``nbytes`` is their total.
    ``shape`` and ``method`` are the header both ends agree on (not counted: the receiver knows
    which parameter it receives and how it is compressed).
    """

    #: The compressor's registry name (``"onebit"``, ``"dynamic_tree"``, ``"e5m2"``, ...).
    method: str
    #: Shape of the encoded tensor.
    shape: torch.Size
    #: Part name -> uint8 tensor of the bytes sent.
    parts: dict

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the total size of ``parts``."""
        return sum(int(t.numel()) for t in self.parts.values())

    @property
    def numel(self) -> int:
        """Elements of the encoded tensor."""
        return math.prod(self.shape)

    @property
    def ratio(self) -> float:
        """Compression ratio against float32: ``4 * numel / nbytes`` (inf when nothing is sent)."""
        return 4 * self.numel / self.nbytes if self.nbytes else math.inf

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v.numel()}B" for k, v in self.parts.items())
        return f"Payload({self.method}, shape={tuple(self.shape)}, nbytes={self.nbytes}: {parts})"


class CompressorState:
    """Error-feedback state of one parameter on one worker: the residual (float64).

    Error feedback (Seide et al. 2014): the value encoded is ``v = g + residual``, and the new
    residual is ``v - decode(encode(v))``: what was not sent is added to the next step's gradient.
    The residual is kept in float64 so that ``sent + residual == v`` exactly whenever the float32
    values involved span fewer than 2**29 binades of ulps (always, for gradients of one layer);
    the float32 ``v`` that is encoded is ``v`` rounded to float32.
    """

    def __init__(self):
        #: float64 residual, or None before the first step.
        self.residual: torch.Tensor | None = None
        #: Steps encoded with this state.
        self.steps = 0

    def reset(self) -> None:
        self.residual, self.steps = None, 0

    def accumulate(self, x: torch.Tensor) -> torch.Tensor:
        """``g + residual`` in float64 (a new tensor; x is not modified)."""
        v = x.detach().to(torch.float64)
        if self.residual is not None:
            if self.residual.shape != v.shape:
                raise ValueError(f"state: the residual has shape {tuple(self.residual.shape)}, but the tensor has "
                                 f"shape {tuple(v.shape)}; use one CompressorState per parameter")
            v = v + self.residual
        return v

    def update(self, v64: torch.Tensor, sent: torch.Tensor) -> None:
        """residual = v - sent (float64)."""
        self.residual = v64 - sent.to(torch.float64)
        self.steps += 1

    def __repr__(self) -> str:
        r = None
        if self.residual is not None:
            top = float(self.residual.abs().max()) if self.residual.numel() else 0.0
            r = f"{tuple(self.residual.shape)} |r|max={top:.3g}"
        return f"CompressorState(steps={self.steps}, residual={r})"


class ErrorFeedback:
    """One error-feedback step of one tensor: the value to encode, and the commit of what was sent.

    With a state (or ``enabled=True`` before the state exists): ``v64 = g + residual`` in float64
    (:meth:`CompressorState.accumulate`; ``g`` alone without a state) and :attr:`value` its
    float32 rounding, the tensor that is encoded; :meth:`commit` then sets the state's residual to
    ``v64 - sent``. Without error feedback :attr:`value` is ``g`` (float32) and :meth:`commit`
    does nothing. The one implementation of error feedback: :meth:`Compressor.encode`, the
    emulated compressed allreduce and the real transport all use it.
    """

    def __init__(self, g: torch.Tensor, state: CompressorState | None = None, *, enabled: bool | None = None):
        if state is not None and not isinstance(state, CompressorState):
            raise TypeError(f"state must be a cpd.compressors.CompressorState or None, got {type(state).__name__}")
        enabled = state is not None if enabled is None else enabled
        g32 = g.detach().to(torch.float32)
        self.state = state
        #: ``g + residual`` in float64 (None without error feedback).
        self.v64 = (state.accumulate(g32) if state is not None else g32.to(torch.float64)) if enabled else None
        #: The float32 tensor to encode.
        self.value = self.v64.to(torch.float32) if self.v64 is not None else g32

    @property
    def active(self) -> bool:
        """Whether a residual is kept (error feedback on)."""
        return self.v64 is not None

    def commit(self, sent: torch.Tensor, state: CompressorState | None = None) -> None:
        """After encoding: the residual of ``state`` (default: the one given at construction)
        becomes ``v64 - sent``, ``sent`` being what the receiver decodes."""
        if self.v64 is None:
            return
        st = state if state is not None else self.state
        if st is None:
            raise ValueError("commit: no CompressorState to keep the residual in")
        st.update(self.v64, sent)


def check_tensor(x, name: str = "x") -> torch.Tensor:
    """float32 view of a float tensor (float16/bfloat16 upcast exactly); TypeError otherwise."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_INPUTS:
        raise TypeError(f"{name} has dtype {x.dtype}; allowed: float32 (float16 and bfloat16 are upcast exactly)")
    return x.detach().to(torch.float32)


def check_finite(x: torch.Tensor, method: str) -> None:
    if not all_finite(x):
        raise ValueError(f"x contains inf or NaN, which the {method} compressor cannot encode "
                         "(skip the step, as cpd.APSOptimizer does, or clip the gradient)")


class Compressor:
    """A gradient compressor: ``encode(tensor, state) -> Payload`` and ``decode(payload) -> tensor``.

    Subclasses implement ``_encode(x32) -> Payload`` (x32 a float32 tensor, never modified) and
    ``_decode(payload) -> float32 tensor``; nothing outside this class calls them. Users call
    :meth:`encode` / :meth:`decode` (checked; error feedback when a :class:`CompressorState` is
    passed and the compressor uses it, ``error_feedback=True``); the reductions, which check their
    inputs once and run :class:`ErrorFeedback` themselves, call :meth:`encode_raw` /
    :meth:`decode_raw` on chunks and partial sums.
    """

    #: Registry name.
    name: str = "compressor"
    #: Whether :meth:`encode` applies error feedback when given a state.
    error_feedback: bool = False
    #: Whether the method quantizes per column of the matrix view ``x.reshape(x.shape[0], -1)``.
    columnwise: bool = False

    def encode(self, x: torch.Tensor, state: CompressorState | None = None) -> Payload:
        """Encode ``x`` (never modified). With a ``state`` and ``error_feedback``, encode
        ``x + state.residual`` and keep the new residual in ``state``."""
        x32 = check_tensor(x)
        if state is not None and not isinstance(state, CompressorState):
            raise TypeError(f"state must be a cpd.compressors.CompressorState or None, got {type(state).__name__}")
        ef = ErrorFeedback(x32, state if self.error_feedback else None)
        check_finite(ef.value, self.name)
        payload = self._encode(ef.value)
        if ef.active:
            ef.commit(self._decode(payload))
        return payload

    def decode(self, payload: Payload) -> torch.Tensor:
        """The float32 tensor a receiver reconstructs from ``payload``."""
        if not isinstance(payload, Payload):
            raise TypeError(f"payload must be a cpd.compressors.Payload, got {type(payload).__name__}")
        if payload.method != self.name:
            raise ValueError(f"payload was encoded by {payload.method!r}, not by this {self.name!r} compressor")
        return self._decode(payload)

    def encode_raw(self, x: torch.Tensor) -> Payload:
        """The payload of a float32 tensor as it is: no checks, no error feedback (for reductions
        that validated their inputs once; ``x`` finite float32, never modified)."""
        return self._encode(x.contiguous())

    def decode_raw(self, payload: Payload) -> torch.Tensor:
        """The float32 tensor of a payload of this compressor (no checks)."""
        return self._decode(payload)

    def roundtrip(self, x: torch.Tensor, state: CompressorState | None = None) -> tuple[torch.Tensor, Payload]:
        """``(decode(encode(x, state)), payload)``."""
        p = self.encode(x, state)
        return self._decode(p), p

    def new_state(self) -> CompressorState:
        return CompressorState()

    def wire_layout(self, shape) -> tuple:
        """The parts of the payload of a tensor of ``shape``, in the order a real transport sends
        them (:mod:`cpd.distributed` concatenates them): ``((name, nbytes), ...)``, ``nbytes`` None
        when the size depends on the data (the sender then sends it first, as an int32).

        The default learns the part names from the payload of zeros and declares every size
        data-dependent; the built-in compressors override it with the sizes both ends know from
        the shape (their docstrings' "Wire" paragraphs).
        """
        p = self._encode(torch.zeros(tuple(shape), dtype=torch.float32))
        return tuple((k, None) for k in p.parts)

    def _encode(self, x: torch.Tensor) -> Payload:  # pragma: no cover - abstract
        raise NotImplementedError

    def _decode(self, payload: Payload) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _payload(self, shape, **parts) -> Payload:
        return Payload(self.name, torch.Size(shape), {k: v.contiguous() for k, v in parts.items()})

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# ------------------------------------------------------------------------------------ byte helpers
_BIT_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)
_SHIFTS = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0], dtype=torch.uint8)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack a 1-D tensor of 0/1 values into bytes, most significant bit first (as
    ``numpy.packbits``); the last byte is zero-padded. ``ceil(n / 8)`` bytes."""
    b = bits.reshape(-1).to(torch.uint8)
    pad = (-b.numel()) % 8
    if pad:
        b = torch.cat([b, b.new_zeros(pad)])
    return (b.view(-1, 8) * _BIT_WEIGHTS.to(b.device)).sum(1, dtype=torch.uint8) if b.numel() else b


def unpack_bits(data: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` bits of ``data`` (uint8, MSB first) as a uint8 tensor of 0/1."""
    if n == 0:
        return data.new_zeros(0)
    return ((data.view(-1, 1) >> _SHIFTS.to(data.device)) & 1).reshape(-1)[:n]


def float_bytes(x: torch.Tensor) -> torch.Tensor:
    """The bytes of a float32 tensor (native byte order; little-endian on every supported machine)."""
    return x.to(torch.float32).contiguous().reshape(-1).view(torch.uint8)


def bytes_float(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def int_bytes(x: torch.Tensor) -> torch.Tensor:
    """The bytes of an int32 tensor."""
    return x.to(torch.int32).contiguous().reshape(-1).view(torch.uint8)


def bytes_int(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.int32)
