"""What a rank reports: :class:`StepReport` (bytes, decisions) and :class:`CommunicationError`."""

from __future__ import annotations

import dataclasses
import math

__all__ = ["StepReport", "CommunicationError"]


class CommunicationError(RuntimeError):
    """A peer raised, died or timed out during a cpd.distributed exchange."""


@dataclasses.dataclass
class StepReport:
    """What one rank sent and decided in one step (all buckets of a DDP step, or one optimizer step)."""

    #: Step index (0-based: steps seen by the state before this one).
    step: int = 0
    #: World size W and this rank's index in the process group.
    world: int = 1
    rank: int = 0
    algorithm: str = "ring"
    fmt: str = ""
    #: Bytes this rank sent / received, everything included (codes, Kahan compensations, float32
    #: layers, the exponent exchange); the exponent exchange is counted as a ring allreduce of its
    #: int32 values.
    bytes_sent: int = 0
    bytes_received: int = 0
    #: Part of ``bytes_sent`` spent on the exponent exchange (with a compressor: the exchange of
    #: the per-layer "present / inf-NaN" flags, one int32 per layer, the same size).
    exponent_bytes: int = 0
    #: Part of ``bytes_sent`` spent on the lengths (int32) of data-dependent compressor payload
    #: parts, sent before the payloads (threshold and adaptive index lists); 0 without a compressor.
    length_bytes: int = 0
    #: What this rank would send in a float32 ring allreduce of the same layers.
    float32_bytes: int = 0
    #: Buckets (DDP) or 1 (optimizer).
    buckets: int = 0
    #: Whether any layer had inf/NaN gradients on any rank or a non-finite sum (same on every rank).
    found_inf: bool = False
    #: Per layer: ``"lowp"``, ``"fp32"``, ``"zero"``, ``"nonfinite"`` or ``"skipped"``.
    status: dict = dataclasses.field(default_factory=dict)
    #: Per layer: the power-of-two scale exponent s (None: no scaling applied).
    scale_exp: dict = dataclasses.field(default_factory=dict)
    #: With ``roundoff=True``: the per-layer round-off :class:`cpd.RoundoffReport` of the step (the
    #: emulator's report, computed from an extra float32 all_gather of the gradients; its bytes are
    #: in :attr:`diagnostic_bytes`, not in :attr:`bytes_sent`). None otherwise.
    roundoff: object = None
    #: Bytes this rank sent for the optional round-off report.
    diagnostic_bytes: int = 0
    #: Elements encoded ahead of the exponent exchange, in the same pass that found their
    #: layers' max |g|, with the scales the previous step agreed (APS) or the known scale
    #: (loss scaling, none): see docs/distributed.md, "Encoding ahead".
    encoded_ahead: int = 0
    #: Of those, elements encoded again after the exchange because their layer's agreed scale
    #: differed from the guess (or the layers on the wire did).
    reencoded: int = 0

    @property
    def payload_bytes(self) -> int:
        """``bytes_sent`` without the exponent (flag) exchange and the payload lengths: with a
        compressor, summed over the ranks, the emulator's ``CompressionReport.bytes``."""
        return self.bytes_sent - self.exponent_bytes - self.length_bytes

    @property
    def ratio(self) -> float:
        """``bytes_sent / float32_bytes`` (nan when there is no float32 baseline, W = 1)."""
        return self.bytes_sent / self.float32_bytes if self.float32_bytes else math.nan

    def __str__(self) -> str:
        return (f"step {self.step}: rank {self.rank}/{self.world} {self.algorithm} {self.fmt}: sent "
                f"{self.bytes_sent} B (exponents {self.exponent_bytes} B"
                + (f", payload lengths {self.length_bytes} B" if self.length_bytes else "")
                + f"), received {self.bytes_received} B, "
                f"float32 ring would send {self.float32_bytes} B, ratio {self.ratio:.4f}; "
                f"{len(self.status)} layers in {self.buckets} bucket(s)" + (", inf/NaN found" if self.found_inf else ""))


    def add(self, other: "StepReport") -> None:
        """Fold the report of another bucket of the same step into this one."""
        for f in ("bytes_sent", "bytes_received", "exponent_bytes", "length_bytes", "float32_bytes", "buckets",
                  "diagnostic_bytes", "encoded_ahead", "reencoded"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        if other.roundoff is not None:
            self.roundoff.layers.update(other.roundoff.layers)
        self.found_inf = self.found_inf or other.found_inf
        self.status.update(other.status)
        self.scale_exp.update(other.scale_exp)
