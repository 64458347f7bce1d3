"""Emulated low-precision allreduce: ring, hierarchical, tree and sequential summation orders.

W emulated workers each hold a gradient; :func:`allreduce` returns what every worker ends up
with when the sum is accumulated in a low-precision format ``fmt``, one rounded addition per
network hop, in the exact order of the named algorithm (docs/design.md §3). Every hop is one fused
:func:`cpd.add` (exact sum, rounded once) over all chunks of that step at once, so the cost is
O(W) calls on n elements, not O(W^2) small calls.
"""

from __future__ import annotations

import dataclasses

import torch

from ._fused_reduce import reduce_rows
from .blockreduce import block_exponents, block_factors
from .config import EMULATED_ALGORITHMS, CompressedReduceConfig, ReduceConfig, make_config
from .formats import FloatFormat
from .ops import cast
from .primitives import Accumulator, ceil_log2, chunk_bounds, stack_workers
from .registry import COMPRESSED_ALLREDUCE, lookup
from .rounding import Rounding

__all__ = ["allreduce", "ALGORITHMS", "chunk_bounds", "reduce_matrix", "reduce_blocks", "cost_model", "CostEstimate"]

#: The summation orders :func:`allreduce` emulates.
ALGORITHMS = EMULATED_ALGORITHMS

# Former private names, still imported by cpd.distributed (engineer "wire" moves to cpd.primitives).
_stack_workers = stack_workers
_Acc = Accumulator


def _ring(acc: Accumulator, s: torch.Tensor, c: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ring reduce-scatter over the rows of ``s`` (P, n) (with compensations ``c``); returns the
    reduced (n,) vector (and its compensation), i.e. the state after the allgather."""
    p, n = s.shape
    if p == 1:
        return s[0].clone(), None
    bounds = chunk_bounds(n, p)
    q, r = divmod(n, p)
    # Chunks of equal size whose source row does not wrap past worker p-1 sit at a constant stride
    # (n + size) in the row-major (p, n) matrix, so each hop's operand is at most four strided
    # views copied side by side: no index arithmetic, no gather.
    s = s.contiguous()
    c = None if c is None else c.contiguous()

    def operand(m: torch.Tensor, h: int, out: torch.Tensor) -> torch.Tensor:
        """out[j] = m[(chunk(j) + h) % p, j]: chunk c's incoming value at hop h."""
        for c0, c1, size in ((0, r, q + 1), (r, p, q)):
            if size == 0 or c0 == c1:
                continue
            for lo, hi, wrap in ((c0, min(c1, p - h), 0), (max(c0, p - h), c1, p)):
                if lo >= hi:
                    continue
                a = bounds[lo][0]
                view = m.as_strided((hi - lo, size), (n + size, 1), m.storage_offset() + (lo + h - wrap) * n + a)
                out[a:a + (hi - lo) * size].view(hi - lo, size).copy_(view)
        return out

    buf_s = torch.empty(n, dtype=s.dtype, device=s.device)
    buf_c = None if c is None else torch.empty_like(buf_s)
    r_s = operand(s, 0, torch.empty_like(buf_s))
    if c is not None:
        r_c = operand(c, 0, torch.empty_like(buf_s))
    else:
        r_c = torch.zeros_like(r_s) if acc.kahan else None
    for h in range(1, p):
        r_s, r_c = acc.merge(r_s, r_c, operand(s, h, buf_s), None if c is None else operand(c, h, buf_c))
    return r_s, r_c


def _sequential_rows(acc: Accumulator, x: torch.Tensor):
    """Sum the rows of ``x`` (P, m, n) along dim 1 sequentially: one fused add per step over dim 0."""
    s = x[:, 0].clone()
    c = torch.zeros_like(s) if acc.kahan else None
    for j in range(1, x.shape[1]):
        s, c = acc.merge(s, c, x[:, j])
    return s, c


def allreduce(tensors, fmt=None, *, algorithm: str = "ring", group_size: int | None = None, kahan: bool = False,
              rounding="nearest", saturate: bool = False, generator: torch.Generator | None = None,
              inputs_in_fmt: bool = False, compressor=None, states=None, config=None) -> torch.Tensor:
    """Emulate a low-precision allreduce (sum) of W workers' tensors; return what every worker gets.

    With ``compressor=`` (a :class:`cpd.compressors.Compressor` or a name such as ``"onebit"``,
    ``"dynamic_tree"``) instead of ``fmt``, every link carries that compressor's payloads: each
    worker quantizes its tensor once (with error feedback when ``states``, a list of W
    :class:`cpd.compressors.CompressorState`, is given), and the reduce step decodes, sums in float32
    and re-encodes; ``algorithm`` is then ``"ring"`` or ``"pairwise"`` and the other options do not
    apply. The order is in :mod:`cpd.compressors.reduce`; to get the bytes sent as well, call
    :func:`cpd.compressors.compressed_allreduce`.

    Args:
        tensors: a list of W same-shape float32 tensors (float16/bfloat16 are upcast exactly), one
            per worker, or one tensor whose leading dimension is W. Never modified.
        fmt: the accumulation / wire format (a :class:`FloatFormat`, a name or a torch dtype), or a
            :class:`cpd.mx.BlockFormat` (e.g. ``cpd.mx.MXFP8_E4M3``): block-scaled communication, APS
            at block granularity — each block of ``block_size`` consecutive elements of the
            flattened tensor is scaled by one power of two shared by all workers, chosen so the
            block's sum cannot overflow the element format; the elements are rounded to the
            element format, summed in it in the order below, and unscaled (exact definition in
            :mod:`cpd.blockreduce`; ``inputs_in_fmt`` does not apply; a block holding inf/NaN is
            not scaled, so the inf/NaN reaches the result as with a float format).
        algorithm: ``"ring"``, ``"hierarchical"``, ``"tree"`` or ``"sequential"`` (orders below).
        group_size: hierarchical only: k, the number of consecutive workers per group; must divide W.
        kahan: carry a Kahan compensation with every partial sum (every Kahan operation is itself
            one rounded :func:`cpd.add` in ``fmt``).
        rounding: rounding mode of every cast and addition (``"nearest"``, ``"stochastic"``,
            ``"toward_zero"``, ``"up"``, ``"down"``).
        saturate: clamp overflows to ±max (see :func:`cpd.cast`).
        generator: stochastic rounding only: the torch generator every rounding draws its seed
            from (default generator otherwise, so ``torch.manual_seed`` makes it reproducible).
        inputs_in_fmt: the inputs already hold values of ``fmt``; skip the initial cast.
        config: instead of ``fmt``/``compressor`` and the options, a :class:`cpd.config.ReduceConfig`
            or :class:`cpd.config.CompressedReduceConfig` (may also be given in place of ``fmt``);
            the keyword options then keep their defaults.

    Returns:
        A float32 tensor of the per-worker shape: the sum (not the average), as every worker holds
        it after the allreduce (every algorithm ends with all workers holding identical bits).

    Summation order (``x_w`` is worker w's tensor, flattened; "add" is one exact addition rounded
    once to ``fmt`` — :func:`cpd.add` — never a float32 addition followed by a cast):

    0. **Inputs are rounded to fmt first** (``x_w = cast(x_w, fmt)``: what is sent on the wire is
       in ``fmt``), unless ``inputs_in_fmt=True``.
    * ``ring``: the flat tensor is split into W chunks like ``numpy.array_split`` (the first
      ``n % W`` chunks one element longer). Reduce-scatter: chunk c starts at worker c,
      ``acc = x_c[c]``, and travels the ring, ``acc = add(acc, x_{(c+1)%W}[c])``, ...,
      ``acc = add(acc, x_{(c+W-1)%W}[c])`` (W-1 rounded hops). Allgather: the reduced chunks are
      copied to every worker (no further rounding).
    * ``hierarchical`` (group size k, W/k groups of consecutive workers): (1) the first worker of
      group g (worker g*k) sums its group in worker order, ``s_g = x_{gk}``, ``s_g = add(s_g,
      x_{gk+1})``, ..., ``add(s_g, x_{gk+k-1})``; (2) ring (as above) across the W/k group leaders
      with their sums ``s_g`` as inputs; (3) each leader broadcasts the result to its group (no
      rounding). ``k = W`` is the sequential sum; ``k = 1`` is the ring (without Kahan; with Kahan
      the leaders' +0 compensations are added in, which can change the sign of a zero).
    * ``tree`` (recursive halving to worker 0): partials ``p_i = x_i``; at level l = 0, 1, ...,
      while 2^l < W, every worker i with ``i % 2^(l+1) == 0`` and ``i + 2^l < W`` does
      ``p_i = add(p_i, p_{i+2^l})``; workers whose partner ``i + 2^l`` does not exist (W not a
      power of two) keep their partial unchanged for that level. After ceil(log2 W) levels worker
      0 holds the sum and broadcasts it (no rounding). E.g. W = 6: level 0 pairs (0,1) (2,3) (4,5),
      level 1 pairs (0,2) and 4 waits, level 2 pairs (0,4).
    * ``sequential``: all-gather, then every worker sums in rank order from worker 0:
      ``s = x_0``, ``s = add(s, x_1)``, ..., ``add(s, x_{W-1})`` (the scheme earlier tools use).

    With ``kahan=True`` each partial sum s carries a compensation c (starting at +0 for a single
    input) and every add above becomes, with x the incoming value, ``y = add(x, -c)``,
    ``t = add(s, y)``, ``c = add(add(t, -s), -y)``, ``s = t``. When the incoming value is itself a
    partial sum with compensation cx (the leaders' sums in the hierarchical ring, the partner's
    partial in the tree), ``c = add(c, cx)`` first. The result is the final s (c is dropped).

    The result is a new tensor that does not track gradients (the emulation runs under
    ``torch.no_grad()``). Stochastic rounding draws one seed per fused add call (and one for the initial cast) from
    ``generator``, so the same generator state gives the same bits.

    Raises:
        ValueError: empty list, shape or device mismatch, unknown algorithm, bad group_size.
        TypeError: non-tensor or non-float inputs, bad argument types.
    """
    if not isinstance(inputs_in_fmt, bool):
        raise TypeError(f"inputs_in_fmt must be a bool, got {type(inputs_in_fmt).__name__}")
    cfg = make_config(fmt, compressor=compressor, config=config, what="allreduce()",
                      fmt_only={"generator": (generator, None), "inputs_in_fmt": (inputs_in_fmt, False)},
                      algorithm=algorithm, group_size=group_size, kahan=kahan, rounding=rounding, saturate=saturate)
    if isinstance(cfg, CompressedReduceConfig):  # ------------- compressed path (cpd.compressors.reduce)
        return lookup(COMPRESSED_ALLREDUCE)(tensors, cfg.compressor, algorithm=cfg.algorithm, states=states)[0]
    if states is not None:
        raise ValueError("states (error-feedback states) only apply with compressor=, got compressor=None")
    cfg.require(ALGORITHMS, "the emulator (cpd.allreduce; 'one_rounding' runs across processes only)")
    if generator is not None and cfg.rounding is not Rounding.STOCHASTIC:
        raise ValueError(f"generator only applies to rounding='stochastic', got rounding={cfg.rounding.value!r}")
    x, shape = stack_workers(tensors)
    return reduce_matrix(x, cfg, generator=generator, inputs_in_fmt=inputs_in_fmt).reshape(shape)


@torch.no_grad()
def reduce_matrix(x: torch.Tensor, config: ReduceConfig, *, generator: torch.Generator | None = None,
                  inputs_in_fmt: bool = False) -> torch.Tensor:
    """:func:`allreduce` of the rows of a (W, n) float32 matrix under a validated ``config``
    (an emulator order); returns the (n,) result. For the layers above (:mod:`cpd.scaling`),
    which check their inputs once."""
    w, n = x.shape
    cfg = config
    if cfg.workers is not None and cfg.workers != w:
        raise ValueError(f"the config has workers={cfg.workers}, but the tensors come from W={w} workers")
    cfg.check_workers(w)
    if cfg.is_block:
        if inputs_in_fmt:
            raise ValueError(f"inputs_in_fmt=True does not apply to a block format (fmt={cfg.fmt.name}): the block "
                             "scales are chosen from the inputs")
        return reduce_blocks(x, cfg, generator=generator)[0]
    fmt, mode, saturate, kahan, algorithm = cfg.fmt, cfg.rounding, cfg.saturate, cfg.kahan, cfg.algorithm
    if n:  # one launch where the CUDA kernels serve x's device (cpd._fused_reduce), the same bits
        fused = reduce_rows(x, fmt, mode, saturate, kahan, algorithm, cfg.group_size, generator, not inputs_in_fmt)
        if fused is not None:
            return fused
    if not inputs_in_fmt:
        x = cast(x, fmt, mode, saturate=saturate, generator=generator)
    if n == 0:
        return x[0].clone()
    acc = Accumulator(kahan, fmt, mode, saturate, generator)
    if algorithm == "ring":
        s, _ = _ring(acc, x, None)
    elif algorithm == "sequential":
        s, _ = _sequential_rows(acc, x.unsqueeze(0))
        s = s[0]
    elif algorithm == "hierarchical":
        k = cfg.group_size
        g_s, g_c = _sequential_rows(acc, x.reshape(w // k, k, n))
        s, _ = _ring(acc, g_s, g_c)
    else:  # tree
        p = x.clone()
        c = torch.zeros_like(p) if kahan else None
        step = 1
        while step < w:
            recv = torch.arange(0, w - step, 2 * step, device=x.device)
            send = recv + step
            ns, nc = acc.merge(p[recv], None if c is None else c[recv], p[send], None if c is None else c[send])
            p[recv] = ns
            if c is not None:
                c[recv] = nc
            step *= 2
        s = p[0]
    return s.clone()


@torch.no_grad()
def reduce_blocks(x: torch.Tensor, config: ReduceConfig, *, generator: torch.Generator | None = None):
    """Block-scaled reduction of the finite (W, n) float32 ``x`` under a block-format ``config``
    (:mod:`cpd.blockreduce`): returns ``(result, s, nonzero, scaled, low)``: the (n,) float32 sum,
    the per-block exponents and nonzero mask, and the (W, n) scaled values before and after the
    cast to the element format."""
    w, n = x.shape
    s, nonzero = block_exponents(x, config.fmt, w, config.margin)
    f = block_factors(s, n, config.fmt.block_size)
    scaled = (x.double() * f).to(torch.float32)
    elem = dataclasses.replace(config, fmt=config.element)
    low = cast(scaled, elem.fmt, elem.rounding, saturate=elem.saturate, generator=generator)
    red = reduce_matrix(low, elem, generator=generator, inputs_in_fmt=True)
    return (red.double() / f).to(torch.float32), s, nonzero, scaled, low


# --------------------------------------------------------------------------------------- cost model
@dataclasses.dataclass(frozen=True)
class CostEstimate:
    """The cost model's answer (seconds and bytes of one allreduce).

    Attribute access (``est.time``); for code written when it was a dict, ``est["time"]``,
    ``est.keys()``, ``dict(est)`` and ``est.to_dict()`` work too.
    """

    #: Total time: ``latency + bandwidth + compute + aps_time``.
    time: float
    #: Communication steps on the critical path.
    steps: int
    #: The bandwidth term divided by β: bytes on the critical path.
    bytes_per_worker: float
    #: ``steps * alpha``.
    latency: float
    #: ``bytes_per_worker * beta``.
    bandwidth: float
    #: The reduction term (γ).
    compute: float
    #: APS's exponent allreduce (0 without ``aps_layers``).
    aps_time: float
    #: n, the message size on the wire (bytes).
    message_bytes: float

    def keys(self):
        return [f.name for f in dataclasses.fields(self)]

    def __getitem__(self, key: str):
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cost_model(n_bytes: float, workers: int, algorithm: str = "ring", group_size: int | None = None, fmt=None, *,
               alpha: float = 5e-6, beta: float = 1 / 12.5e9, gamma: float = 0.0, aps_layers: int = 0) -> CostEstimate:
    """α–β(–γ) time of one allreduce (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009).

    A step costs ``α + m·β`` to move m bytes (α latency in s, β s/byte) plus ``m·γ`` to reduce
    them (γ s/byte, default 0). ``n`` is the message size on the wire: ``n_bytes`` (the float32
    gradient size) times ``fmt.bits / 32`` when ``fmt`` is given. W = ``workers``, k = ``group_size``.

    ==================== ================================ ================================================
    algorithm            steps                            time
    ==================== ================================ ================================================
    ring                 2(W-1)                           2(W-1)α + 2(W-1)/W·nβ + (W-1)/W·nγ
    hierarchical (k)     4(k-1) + 2(W/k-1)  (APS paper)   steps·α + [4(k-1)/k + 2(W/k-1)/(W/k)]·nβ
                                                          + [(k-1)/k + (W/k-1)/(W/k)]·nγ
    tree                 2⌈log2 W⌉                        2⌈log2 W⌉(α + nβ) + ⌈log2 W⌉·nγ
    recursive_doubling   ⌈log2 W⌉                         ⌈log2 W⌉(α + nβ + nγ)
    sequential           W-1 (ring allgather)             (W-1)(α + nβ) + (W-1)·nγ
    ==================== ================================ ================================================

    Hierarchical: within each group a ring reduce-scatter plus gather to the master (2(k-1) steps
    of n/k), the ring allreduce across the W/k masters (2(W/k-1) steps of n/(W/k)), and the
    broadcast back as scatter plus allgather (2(k-1) steps of n/k): the paper's 4(k-1)+2(W/k-1)
    steps (90 instead of the ring's 510 for W=256, k=16; the paper's text quotes 74, which its own
    formula does not give). Tree: binomial reduce then broadcast of the whole
    message. ``bytes_per_worker`` is the bandwidth term divided by β (bytes on the critical path).

    ``aps_layers`` > 0 adds APS's exponent allreduce: one byte per layer, allreduce-MAX with the
    same algorithm (``aps_time`` in the result; included in ``time``).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if not (isinstance(n_bytes, (int, float)) and n_bytes >= 0):
        raise ValueError(f"n_bytes must be a number >= 0, got {n_bytes!r}")
    algos = ("ring", "hierarchical", "tree", "recursive_doubling", "sequential")
    if algorithm not in algos:
        raise ValueError(f"algorithm={algorithm!r} is unknown; allowed: {', '.join(map(repr, algos))}")
    w = workers
    if algorithm == "hierarchical":
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or w % group_size:
            raise ValueError(f"group_size={group_size!r} must be a positive divisor of workers={w}")
    elif group_size is not None:
        raise ValueError(f"group_size only applies to algorithm='hierarchical', got algorithm={algorithm!r}")
    n = float(n_bytes) * (FloatFormat.parse(fmt).bits / 32 if fmt is not None else 1.0)

    def model(nb: float):
        if w == 1:
            return 0, 0.0, 0.0
        if algorithm == "ring":
            return 2 * (w - 1), 2 * (w - 1) / w * nb, (w - 1) / w * nb
        if algorithm == "hierarchical":
            k, g = group_size, w // group_size
            bw = (4 * (k - 1) / k + 2 * (g - 1) / g) * nb
            return 4 * (k - 1) + 2 * (g - 1), bw, ((k - 1) / k + (g - 1) / g) * nb
        lg = ceil_log2(w)
        if algorithm == "tree":
            return 2 * lg, 2 * lg * nb, lg * nb
        if algorithm == "recursive_doubling":
            return lg, lg * nb, lg * nb
        return w - 1, (w - 1) * nb, (w - 1) * nb  # sequential

    steps, bw, comp = model(n)
    main = steps * alpha + bw * beta + comp * gamma
    aps_time = 0.0
    if aps_layers:
        s2, b2, c2 = model(float(aps_layers))
        aps_time = s2 * alpha + b2 * beta + c2 * gamma
    return CostEstimate(time=main + aps_time, steps=steps, bytes_per_worker=bw, latency=steps * alpha,
                        bandwidth=bw * beta, compute=comp * gamma, aps_time=aps_time, message_bytes=n)
