"""Adaptive Weight Precision (AWP) with Bitpack/Bitunpack truncation, from "Reducing data motion to
accelerate the training of deep neural networks" (paper 004 in /work/shared/papers, Sections II
and III; the paper calls AWP + ADT "DTWP").

**Bitpack** keeps the ``k`` most significant bytes of each float32 weight's 32-bit pattern
(sign, exponent and the top mantissa bits; "rounding to bits means discarding the lowest bits":
truncation toward zero of the magnitude, no rounding), and **Bitunpack** appends ``4 - k`` zero
bytes. k = 1 keeps sign + 7 exponent bits, 2 is bfloat16's layout, 3 keeps 15 mantissa bits.

**AWP** (Algorithm 1) chooses k per layer during training: every layer starts narrow (1 byte,
"AWP initially applies 8-bit precision to all layers"); after each batch the relative change of
the layer's weight L2 norm, ``|‖w_t‖ - ‖w_{t-1}‖| / ‖w_{t-1}‖``, is compared with the threshold T;
each batch where it is below T increments the layer's counter, and when the counter reaches
INTERVAL the layer gains N bits (N = 8: "the smallest granularity of our approach is 1 byte") and
the counter is set to zero. The paper's text does not reset the counter on a batch at or above T
(the counter counts batches below T); ``consecutive=True`` resets it there instead (the reading
"stays below T for INTERVAL consecutive batches"). Biases are not compressed ("we do not apply the
Bitpack procedure to the network biases"): parameters with fewer than 2 dimensions travel as
float32 unless ``include_biases=True``.

How it fits a training loop: the float32 master weights stay where the optimizer updates them
(the paper's CPU); what the workers (the paper's GPUs) compute with is ``bitunpack(bitpack(w))``::

    awp = cpd.compressors.AWP(model, threshold=1e-3, interval=50)
    for x, y in batches:
        with awp.truncated():             # the model's weights are the unpacked k-byte copies
            loss = loss_fn(model(x), y)
            loss.backward()               # gradients at the truncated weights
        opt.step()                        # updates the float32 masters (restored on exit)
        opt.zero_grad()
        awp.update()                      # norms, counters, widths for the next batch
    print(awp.bytes_per_step, awp.widths)
"""

from __future__ import annotations

import contextlib
import math

import torch

from .base import Compressor, Payload, check_tensor

__all__ = ["bitpack", "bitunpack", "Bitpack", "AWP"]


def _check_nbytes(nbytes) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 1 <= nbytes <= 4:
        raise ValueError(f"nbytes must be an int in 1..4 (leading bytes of a float32 kept), got {nbytes!r}")
    return nbytes


def bitpack(x: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The ``nbytes`` most significant bytes of each float32 of ``x`` (flattened), most significant
    first: a uint8 tensor of ``nbytes * x.numel()`` bytes. ``x`` is not modified."""
    x = check_tensor(x)
    k = _check_nbytes(nbytes)
    u = x.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.tensor([24 - 8 * j for j in range(k)], dtype=torch.int64, device=x.device)
    return ((u.unsqueeze(1) >> shifts) & 0xFF).to(torch.uint8).reshape(-1)


def bitunpack(data: torch.Tensor, nbytes: int, shape=None) -> torch.Tensor:
    """float32 values from ``bitpack`` bytes, the missing low bytes filled with zeros."""
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
        raise TypeError(f"data must be a uint8 torch.Tensor, got {getattr(data, 'dtype', type(data).__name__)}")
    k = _check_nbytes(nbytes)
    if data.numel() % k:
        raise ValueError(f"data has {data.numel()} bytes, not a multiple of nbytes={k}")
    shifts = torch.tensor([24 - 8 * j for j in range(k)], dtype=torch.int64, device=data.device)
    u = (data.view(-1, k).to(torch.int64) << shifts).sum(1)
    u = torch.where(u > 0x7FFFFFFF, u - (1 << 32), u).to(torch.int32)
    out = u.view(torch.float32)
    return out if shape is None else out.reshape(shape)


class Bitpack(Compressor):
    """Bitpack truncation to the ``nbytes`` leading bytes as a compressor (ratio ``4 / nbytes``)."""

    def __init__(self, nbytes: int = 2, *, error_feedback: bool = False):
        self.nbytes = _check_nbytes(nbytes)
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback must be a bool, got {type(error_feedback).__name__}")
        self.error_feedback = error_feedback
        self.name = f"bitpack{8 * self.nbytes}"

    def _encode(self, x: torch.Tensor) -> Payload:
        return self._payload(x.shape, bytes=bitpack(x, self.nbytes))

    def wire_layout(self, shape) -> tuple:
        return (("bytes", self.nbytes * math.prod(tuple(shape))),)

    def _decode(self, p: Payload) -> torch.Tensor:
        return bitunpack(p.parts["bytes"], self.nbytes, p.shape)

    def __repr__(self) -> str:
        return f"Bitpack(nbytes={self.nbytes})"


class AWP:
    """Adaptive Weight Precision: a per-layer byte width for the weights a training loop sends.

    Args:
        model: the module whose parameters are sent (or an iterable of ``(name, parameter)``).
        threshold: T > 0, the relative-change threshold of the layer's weight L2 norm.
        interval: INTERVAL >= 1, batches below T before a layer grows.
        start_bytes: initial width (default 1 byte, as the paper).
        step_bytes: bytes added at each growth (N = 8 bits in the paper).
        max_bytes: widest width (4: float32, no compression).
        consecutive: reset a layer's counter on a batch at or above T (see the module docstring).
        include_biases: also truncate parameters of fewer than 2 dimensions.

    Attributes:
        widths: {layer name: bytes per weight}; counters: {name: batches below T since the last growth};
        history: per :meth:`update`, the widths after it.
    """

    def __init__(self, model, *, threshold: float, interval: int, start_bytes: int = 1, step_bytes: int = 1,
                 max_bytes: int = 4, consecutive: bool = False, include_biases: bool = False):
        if isinstance(model, torch.nn.Module):
            named = list(model.named_parameters())
        else:
            try:
                named = list(model)
            except TypeError:
                raise TypeError(f"model must be a torch.nn.Module or an iterable of (name, parameter), "
                                f"got {type(model).__name__}") from None
        if not named or not all(isinstance(n, str) and isinstance(p, torch.Tensor) for n, p in named):
            raise ValueError("model has no (name, parameter) pairs to send")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold > 0 \
                or not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite number > 0 (T), got {threshold!r}")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be an int >= 1 (INTERVAL batches), got {interval!r}")
        for n, v in (("start_bytes", start_bytes), ("step_bytes", step_bytes), ("max_bytes", max_bytes)):
            _check_nbytes(v)
        if start_bytes > max_bytes:
            raise ValueError(f"start_bytes={start_bytes} must be <= max_bytes={max_bytes}")
        for n, v in (("consecutive", consecutive), ("include_biases", include_biases)):
            if not isinstance(v, bool):
                raise TypeError(f"{n} must be a bool, got {type(v).__name__}")
        self.params = dict(named)
        self.threshold, self.interval = float(threshold), interval
        self.start_bytes, self.step_bytes, self.max_bytes = start_bytes, step_bytes, max_bytes
        self.consecutive, self.include_biases = consecutive, include_biases
        self.compressed = [n for n, p in named if include_biases or p.dim() >= 2]
        self.widths = {n: start_bytes for n in self.compressed}
        self.counters = {n: 0 for n in self.compressed}
        self._norms = {n: self._norm(self.params[n]) for n in self.compressed}
        self.history: list[dict] = []

    @staticmethod
    def _norm(p: torch.Tensor) -> float:
        return float(torch.linalg.vector_norm(p.detach().to(torch.float64)))

    def update(self) -> dict:
        """After a batch: per compressed layer, the relative change of ‖w‖₂ against the previous
        batch; below T counts; a layer whose count reaches INTERVAL grows by ``step_bytes`` (up
        to ``max_bytes``) and its count restarts at 0. Returns the new widths."""
        for n in self.compressed:
            new, old = self._norm(self.params[n]), self._norms[n]
            rate = abs(new - old) / old if old > 0 else (0.0 if new == 0 else math.inf)
            self._norms[n] = new
            if rate < self.threshold:
                self.counters[n] += 1
                if self.counters[n] >= self.interval:
                    self.widths[n] = min(self.max_bytes, self.widths[n] + self.step_bytes)
                    self.counters[n] = 0
            elif self.consecutive:
                self.counters[n] = 0
        self.history.append(dict(self.widths))
        return dict(self.widths)

    def pack(self) -> dict[str, torch.Tensor]:
        """Bitpack of every parameter at its width (float32 bytes for the uncompressed ones)."""
        return {n: bitpack(p, self.widths.get(n, 4)) for n, p in self.params.items()}

    def unpack(self, packed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Bitunpack of :meth:`pack`'s bytes, shaped like the parameters."""
        return {n: bitunpack(b, self.widths.get(n, 4), self.params[n].shape) for n, b in packed.items()}

    @property
    def bytes_per_step(self) -> int:
        """Bytes of one transfer of every parameter at the current widths."""
        return sum(p.numel() * self.widths.get(n, 4) for n, p in self.params.items())

    @property
    def fp32_bytes(self) -> int:
        return sum(4 * p.numel() for p in self.params.values())

    @contextlib.contextmanager
    def truncated(self):
        """Inside the block the parameters hold ``bitunpack(bitpack(w))``; on exit the float32
        masters are restored (gradients computed inside stay in ``.grad``)."""
        masters = {n: p.detach().clone() for n, p in self.params.items()}
        unpacked = self.unpack(self.pack())
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(unpacked[n].to(p.dtype))
        try:
            yield unpacked
        finally:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(masters[n])

    def __repr__(self) -> str:
        return (f"AWP(T={self.threshold:g}, INTERVAL={self.interval}, widths={self.widths}, "
                f"bytes_per_step={self.bytes_per_step} of {self.fp32_bytes})")
