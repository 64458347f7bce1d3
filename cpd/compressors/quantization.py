"""One-bit (Seide et al. 2014), threshold (Strom 2015) and adaptive (Dryden et al. 2016)
quantization with error feedback, as Dryden, Moon, Jacobs & Van Essen describe them in
"Communication quantization for data-parallel training of deep neural networks" (MLHPC 2016,
paper 002 in /work/shared/papers, Section 3).

**Columns.** One-bit and adaptive quantization work "column-wise over the weight matrix". cpd's
matrix view of a tensor of shape (d0, d1, ...) is ``x.reshape(d0, -1)``: d0 rows and
d1*d2*... columns, column j being ``x.reshape(d0, -1)[:, j]`` (for a Linear weight (out, in), the
weights leaving input j). A 1-D tensor (a bias) is one column, a 0-d tensor a 1x1 matrix.

**Error feedback** (all three): the compressor encodes ``v = g + residual`` and keeps
``residual = v - decode(payload)`` in the :class:`~cpd.compressors.CompressorState` passed to
``encode`` (see :meth:`cpd.compressors.Compressor.encode`); without a state nothing is carried.

**Bytes.** Floats are float32 (4 bytes), sign bits are packed 8 per byte, sparse entries are
32-bit words "one bit of which is the quantized value and 31 bits of which are used to store the
index" (Dryden et al. Section 3.2). Stated ratios against float32: one-bit 32 (plus 8 bytes per
column), threshold 32 bits per entry sent, adaptive 32 bits per entry sent (about 1/π of the
entries, so a ratio near π) plus 12 bytes per column.
"""

from __future__ import annotations

import math

import torch

from .base import Compressor, Payload, bytes_float, bytes_int, float_bytes, int_bytes, pack_bits, unpack_bits

__all__ = ["OneBit", "Threshold", "Adaptive", "matrix_view"]

_MAX_INDEX = (1 << 31) - 1


def matrix_view(x: torch.Tensor) -> torch.Tensor:
    """The (rows, columns) view the column-wise methods quantize: ``x.reshape(d0, -1)``; a 1-D
    tensor is one column, a 0-d tensor a 1x1 matrix."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    if x.dim() == 1:
        return x.reshape(-1, 1)
    return x.reshape(x.shape[0], math.prod(x.shape[1:]))


def _rows_cols(shape) -> tuple[int, int]:
    """(rows, columns) of :func:`matrix_view` for a tensor shape."""
    if len(shape) == 0:
        return 1, 1
    return shape[0], (math.prod(shape[1:]) if len(shape) >= 2 else 1)


def _check_sample(sample, generator):
    if sample is None:
        if generator is not None:
            raise ValueError("generator only applies with sample=<entries per column>, got sample=None")
        return None
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise ValueError(f"sample must be None or an int >= 1 (entries sampled per column), got {sample!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return sample


def _sample_columns(m: torch.Tensor, s: int, generator) -> torch.Tensor:
    """s entries of each column drawn uniformly with replacement: an (s, C) matrix."""
    rows, cols = m.shape
    dev = generator.device if generator is not None else m.device  # a CPU generator may serve a CUDA m
    idx = torch.randint(rows, (s, cols), generator=generator, device=dev).to(m.device)
    return m.gather(0, idx)


def _column_of_words(counts: torch.Tensor) -> torch.Tensor:
    """``repeat_interleave(arange(C), counts)`` by a cumulative sum of column starts (cheaper than
    repeat_interleave on the many small chunks of an emulated allreduce)."""
    total = int(counts.sum())
    starts = counts.cumsum(0) - counts
    marks = torch.zeros(total + 1, dtype=torch.int64, device=counts.device)
    marks.index_add_(0, starts, torch.ones_like(starts))
    return marks[:total].cumsum(0) - 1


def _smallest(key: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Mask of the ``n[j]`` smallest entries of each column j of ``key`` (finite keys; +inf marks
    entries that are never picked, and ``n[j]`` never exceeds a column's finite keys), ties taken
    in row order: what a stable sort of each column would put first. The ``n[j]``-th smallest key
    tau comes from one ``topk`` of the largest n; every key below tau is picked, and of the keys
    equal to tau the first ``n[j] - #below`` rows (a running count, computed only where a column
    holds more ties at tau than it needs: a full stable sort of every column was most of the
    compressor's time)."""
    kmax = int(n.max()) if n.numel() else 0
    if kmax == 0:
        return torch.zeros(key.shape, dtype=torch.bool, device=key.device)
    top = torch.topk(key, kmax, dim=0, largest=False, sorted=True).values
    tau = top.gather(0, (n - 1).clamp(min=0).unsqueeze(0))[0]
    below = key < tau
    at = key == tau
    need = n - below.sum(0)
    if bool((at.sum(0) > need).any()):  # more ties at tau than places left: the first rows
        at &= at.cumsum(0) <= need
    return (below | at) & (n > 0)


def _masked_mean(m: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Per-column float64 mean of the masked entries, rounded to float32 (0 for an empty column)."""
    s = torch.where(mask, m, 0).sum(0, dtype=torch.float64)
    return torch.where(count > 0, s / count.clamp(min=1), 0).to(torch.float32)


class OneBit(Compressor):
    """Seide et al. (2014) 1-bit quantization with error feedback (Dryden et al. 2016, Section 3.1).

    Per column of the matrix view: entries ``>= 0`` are sent as bit 1, entries ``< 0`` as bit 0;
    the two reconstruction values are the means of the column's non-negative and of its negative
    entries (after error feedback), sent as float32 with the column ("in order to minimize the
    quantization error"). A column with no negative (non-negative) entry sends 0 for that mean.

    With ``sample=s``, Dryden et al.'s approximation: the means are those of s entries of the
    column drawn uniformly with replacement (torch ``generator``), not of the whole column.

    Wire: the sign bits of all columns, column after column, packed 8 per byte (MSB first), then
    (mean_nonneg, mean_neg) per column: ``ceil(R*C / 8) + 8*C`` bytes, a ratio near 32.
    """

    name = "onebit"
    columnwise = True

    def __init__(self, *, error_feedback: bool = True, sample: int | None = None,
                 generator: torch.Generator | None = None):
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback must be a bool, got {type(error_feedback).__name__}")
        self.error_feedback = error_feedback
        self.sample, self.generator = _check_sample(sample, generator), generator

    def _encode(self, x: torch.Tensor) -> Payload:
        m = matrix_view(x)
        pos = m >= 0
        if self.sample is None or m.numel() == 0:
            cnt_p = pos.sum(0)
            mp, mn = _masked_mean(m, pos, cnt_p), _masked_mean(m, ~pos, m.shape[0] - cnt_p)
        else:
            s = _sample_columns(m, self.sample, self.generator)
            sp = s >= 0
            cnt_p = sp.sum(0)
            mp, mn = _masked_mean(s, sp, cnt_p), _masked_mean(s, ~sp, s.shape[0] - cnt_p)
        return self._payload(x.shape, signs=pack_bits(pos.t().reshape(-1)),
                             means=float_bytes(torch.stack([mp, mn], 1)))

    def wire_layout(self, shape) -> tuple:
        rows, cols = _rows_cols(tuple(shape))
        return (("signs", (rows * cols + 7) // 8), ("means", 8 * cols))

    def _decode(self, p: Payload) -> torch.Tensor:
        shape = p.shape
        rows, cols = _rows_cols(shape)
        means = bytes_float(p.parts["means"]).view(-1, 2)
        bits = unpack_bits(p.parts["signs"], rows * cols).view(cols, rows).t().bool()
        return torch.where(bits, means[:, 0], means[:, 1]).reshape(shape)

    def __repr__(self) -> str:
        return f"OneBit(error_feedback={self.error_feedback}, sample={self.sample})"


class Threshold(Compressor):
    """Strom (2015) threshold quantization with error feedback (Dryden et al. 2016, Section 3.2).

    With the fixed threshold τ (``tau``, rounded to float32): entries ``v > τ`` are sent as +τ,
    entries ``v < -τ`` as -τ, the others are not sent (they stay in the residual). Each sent entry
    is one 32-bit word: bit 31 the quantized value (1: +τ, 0: -τ), bits 0..30 the index of the
    entry in the flattened tensor (so at most 2**31 elements), in increasing index order. τ is
    configuration, not sent. Wire: ``4 * (entries sent)`` bytes: 32 bits per entry sent.
    """

    name = "threshold"

    def __init__(self, tau: float, *, error_feedback: bool = True):
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau <= 0:
            raise ValueError(f"tau must be a finite number > 0 (the threshold τ), got {tau!r}")
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback must be a bool, got {type(error_feedback).__name__}")
        self.tau32 = torch.tensor(float(tau), dtype=torch.float32)
        if float(self.tau32) == 0 or math.isinf(float(self.tau32)):
            raise ValueError(f"tau={tau!r} is 0 or inf once rounded to float32; allowed: a float32-range number > 0")
        self.tau, self.error_feedback = float(self.tau32), error_feedback

    def _encode(self, x: torch.Tensor) -> Payload:
        flat = x.reshape(-1)
        if flat.numel() > _MAX_INDEX + 1:
            raise ValueError(f"x has {flat.numel()} elements; threshold quantization's 31-bit indices allow 2**31")
        up = flat > self.tau32
        idx = torch.nonzero(up | (flat < -self.tau32)).reshape(-1)
        word = idx | (up[idx].to(torch.int64) << 31)
        word = torch.where(word > _MAX_INDEX, word - (1 << 32), word)   # as a two's-complement int32
        return self._payload(x.shape, words=int_bytes(word))

    def wire_layout(self, shape) -> tuple:
        return (("words", None),)  # one word per entry beyond tau: data-dependent

    def _decode(self, p: Payload) -> torch.Tensor:
        w = bytes_int(p.parts["words"]).to(torch.int64) & 0xFFFFFFFF
        out = torch.zeros(p.numel, dtype=torch.float32, device=w.device)
        out[w & _MAX_INDEX] = torch.where((w >> 31).bool(), self.tau32, -self.tau32)
        return out.reshape(p.shape)

    def __repr__(self) -> str:
        return f"Threshold(tau={self.tau!r}, error_feedback={self.error_feedback})"


class Adaptive(Compressor):
    """Dryden et al. (2016) adaptive quantization with error feedback (Section 3.3).

    Per column of the matrix view, with k+ non-negative and k- negative entries (after error
    feedback): the ``ceil(k+/π)`` largest entries are sent as the positive class and the
    ``ceil(k-/π)`` smallest (most negative) as the negative class ("we want to send the largest
    k/π of them"; the paper's footnote: a proportion 1/π of each class; cpd rounds k/π up so a
    non-empty class always sends something). Ties are broken by row order (the lower row is sent). The
    reconstruction values are the means of the sent entries of each class (float32), sent per
    column.

    With ``sample=s`` (the paper's sampling approximation): s entries per column are drawn
    uniformly with replacement (torch ``generator``); with k+_s, k-_s the class sizes in the sample,
    τ+ is the ``ceil(k+_s/π)``-th largest sampled value and τ- the ``ceil(k-_s/π)``-th smallest;
    every entry ``>= τ+`` (``<= τ-``) of the column is sent, and the reconstruction values are the
    means of the sampled entries beyond the thresholds. The number sent then varies around 1/π.

    Wire: one 32-bit word per sent entry (bit 31: 1 positive class / 0 negative; bits 0..30 the
    row index in the column), columns one after the other; per column a 32-bit count of its words
    (the stand-in for the paper's "special separator", the same size) and the two float32 means:
    ``4 * sent + 12 * C`` bytes, a ratio near π for the exact thresholds.

    Args:
        pi: π >= 1, the inverse proportion of each class sent (the paper used π = 64).
        sample: entries sampled per column for the thresholds (None: exact selection).
        generator: the torch generator of the sampling.
        error_feedback: carry the residual when encode gets a state (default True, as the paper).
    """

    name = "adaptive"
    columnwise = True

    def __init__(self, pi: float = 64, *, sample: int | None = None, generator: torch.Generator | None = None,
                 error_feedback: bool = True):
        if isinstance(pi, bool) or not isinstance(pi, (int, float)) or not math.isfinite(pi) or pi < 1:
            raise ValueError(f"pi must be a finite number >= 1 (send 1/pi of each class per column), got {pi!r}")
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback must be a bool, got {type(error_feedback).__name__}")
        self.pi, self.error_feedback = float(pi), error_feedback
        self.sample, self.generator = _check_sample(sample, generator), generator

    def _counts(self, k: torch.Tensor) -> torch.Tensor:
        return torch.ceil(k.to(torch.float64) / self.pi).to(torch.int64)

    def _encode(self, x: torch.Tensor) -> Payload:
        m = matrix_view(x)
        rows, cols = m.shape
        if rows > _MAX_INDEX + 1:
            raise ValueError(f"x has {rows} rows; adaptive quantization's 31-bit row indices allow 2**31")
        if self.sample is None or m.numel() == 0:
            pos = m >= 0
            k_pos = pos.sum(0)
            n_pos, n_neg = self._counts(k_pos), self._counts(rows - k_pos)
            # Each class in order of decreasing magnitude, ties by row: the n smallest of the key
            # -v (non-negative) / v (negative), the other class's entries keyed +inf (_smallest).
            inf = torch.tensor(math.inf, dtype=m.dtype, device=m.device)
            send_p = _smallest(torch.where(pos, -m, inf), n_pos)
            send_n = _smallest(torch.where(pos, inf, m), n_neg)
            mp, mn = _masked_mean(m, send_p, n_pos), _masked_mean(m, send_n, n_neg)
        else:
            s = _sample_columns(m, self.sample, self.generator)
            ks_pos = (s >= 0).sum(0)
            ns_pos, ns_neg = self._counts(ks_pos), self._counts(self.sample - ks_pos)
            srt = torch.sort(s, dim=0, descending=True).values            # (S, C), largest first
            top = torch.arange(self.sample, device=m.device).unsqueeze(1)
            sp, sn = top < ns_pos, (self.sample - 1 - top) < ns_neg         # sampled entries beyond τ+/τ-
            tau_p = torch.where(ns_pos > 0, srt.gather(0, (ns_pos - 1).clamp(min=0).unsqueeze(0))[0], math.inf)
            tau_n = torch.where(ns_neg > 0, srt.gather(0, (self.sample - ns_neg).clamp(max=self.sample - 1)
                                                       .unsqueeze(0))[0], -math.inf)
            send_p = m >= tau_p
            send_n = (m <= tau_n) & ~send_p
            mp, mn = _masked_mean(srt, sp, ns_pos), _masked_mean(srt, sn, ns_neg)
        send = send_p | send_n
        col_major = send.t()                                                # column after column
        c_idx, r_idx = torch.nonzero(col_major, as_tuple=True)
        word = r_idx | (send_p.t()[c_idx, r_idx].to(torch.int64) << 31)
        word = torch.where(word > _MAX_INDEX, word - (1 << 32), word)
        counts = col_major.sum(1)
        return self._payload(x.shape, words=int_bytes(word), counts=int_bytes(counts),
                             means=float_bytes(torch.stack([mp, mn], 1)))

    def wire_layout(self, shape) -> tuple:
        _, cols = _rows_cols(tuple(shape))
        return (("words", None), ("counts", 4 * cols), ("means", 8 * cols))  # the words: data-dependent

    def _decode(self, p: Payload) -> torch.Tensor:
        shape = p.shape
        rows, cols = _rows_cols(shape)
        w = bytes_int(p.parts["words"]).to(torch.int64) & 0xFFFFFFFF
        counts = bytes_int(p.parts["counts"]).to(torch.int64)
        means = bytes_float(p.parts["means"]).view(-1, 2)
        c_idx = _column_of_words(counts)
        out = torch.zeros(rows, cols, dtype=torch.float32, device=w.device)
        out[w & _MAX_INDEX, c_idx] = torch.where((w >> 31).bool(), means[c_idx, 0], means[c_idx, 1])
        return out.reshape(shape)

    def __repr__(self) -> str:
        return f"Adaptive(pi={self.pi:g}, sample={self.sample}, error_feedback={self.error_feedback})"
