"""Helpers for users' own tests of low-precision code.

- :func:`formats`: a hypothesis strategy of valid :class:`~cpd.FloatFormat` values (any of the
  conventions ``ieee``, ``fn``, ``finite``, ``fnuz``, ``p3109``, ``fnu``; signed or not).
- :func:`block_formats`: a strategy of :class:`cpd.mx.BlockFormat` values (MX-style and NVFP4-style).
- :func:`boundary_values`: a strategy of float32 values where rounding decisions happen for a
  format: its values, the midpoints between neighbours, one float32 ulp either side of those,
  the overflow threshold, subnormals, zeros and infinities.
- :func:`reference_sum`: the exact reference of what :func:`cpd.allreduce` returns, computed by
  :mod:`cpd.reference` (exact rational arithmetic, one Python call per element: small inputs).
- :func:`assert_allreduce_matches`: check a result (from cpd, from your own communication hook,
  from a real process group) bit for bit against :func:`reference_sum`, with a readable report
  of the mismatches.

The strategies need ``hypothesis`` (imported when they are called); the other helpers do not.

Example::

    from hypothesis import given
    import cpd, cpd.testing as ct

    @given(ct.formats(max_bits=8).flatmap(lambda f: ct.boundary_values(f).map(lambda x: (f, x))))
    def test_my_kernel(fx):
        fmt, x = fx
        ...
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import torch

from . import mx, reference
from .collectives import _stack_workers
from .formats import E4M3FN, E8M0, FloatFormat
from .rounding import Rounding

__all__ = ["formats", "block_formats", "boundary_values", "boundary_list", "format_values", "reference_sum",
           "assert_allreduce_matches"]


def _st():
    try:
        from hypothesis import strategies as st
    except ImportError as exc:  # pragma: no cover - hypothesis is a test dependency
        raise ImportError("cpd.testing needs hypothesis: pip install hypothesis") from exc
    return st


def _valid(exp: int, man: int, bias: int | None, specials: str, subnormals: bool, signed: bool = True):
    try:
        return FloatFormat(exp, man, bias=bias, specials=specials, subnormals=subnormals, signed=signed)
    except ValueError:
        return None


def formats(*, min_bits: int = 2, max_bits: int = 32, specials=("ieee", "fn", "finite"), custom_bias: bool = False,
            subnormals=(True, False), signed=(True,)):
    """Strategy of valid formats with ``min_bits <= 1 + exp + man <= max_bits``.

    ``specials`` may also name ``"fnuz"``, ``"p3109"`` and ``"fnu"`` (E8M0-like, always unsigned);
    ``signed=(True, False)`` also draws unsigned formats (where the convention allows one).

    ``custom_bias=True`` also draws biases other than the default (within float32's range).
    A draw that is not a valid format (a bias outside float32's range, no positive finite value,
    ``subnormals=False`` without normal numbers) falls back to the default bias with subnormals,
    then to the ``"ieee"`` and ``"finite"`` conventions, so in those corners the format may lie
    outside ``specials``/``subnormals``; its size always stays within the bounds.
    """
    st = _st()
    if not 2 <= min_bits <= max_bits <= 32:
        raise ValueError(f"need 2 <= min_bits <= max_bits <= 32, got min_bits={min_bits}, max_bits={max_bits}")

    @st.composite
    def draw(d):
        exp = d(st.integers(1, min(8, max_bits - 1)))
        man = d(st.integers(max(0, min_bits - 1 - exp), min(23, max_bits - 1 - exp)))
        spec, sub = d(st.sampled_from(list(specials))), d(st.sampled_from(list(subnormals)))
        sgn = d(st.sampled_from(list(signed))) and spec != "fnu"
        default = (1 << (exp - 1)) - (0 if spec in ("fnuz", "p3109") else 1)
        bias = d(st.integers(default - 20, default + 20)) if custom_bias else default
        if spec == "fnu":
            sub = True
        # An invalid draw (bias out of float32's range, no positive value, no normals to keep)
        # falls back to the first valid of these; (8, man, "finite") with the default bias
        # overflows float32, (1, 0, "ieee") has no positive value, but one of them always holds.
        for args in ((bias, spec, sub, sgn), (None, spec, True, sgn), (None, spec, True, True),
                     (None, "ieee", True, True), (None, "finite", True, True)):
            f = _valid(exp, man, *args)
            if f is not None:
                return f
        return FloatFormat(exp, max(man, 1), specials="finite")  # pragma: no cover - unreachable

    return draw()


def block_formats(*, max_block: int = 64, two_level: bool = True):
    """Strategy of :class:`cpd.mx.BlockFormat` values: an element of at most 8 bits (any
    convention with values), a block size in 1..``max_block``, an E8M0 scale with one of the
    power-of-two rules, or (``two_level``) an E4M3FN scale with the ``"amax"`` rule and
    optionally a tensor scale (NVFP4-like)."""
    st = _st()

    @st.composite
    def draw(d):
        elem = d(formats(min_bits=3, max_bits=8, specials=("ieee", "fn", "finite", "fnuz", "p3109"),
                         subnormals=(True,)))
        size = d(st.integers(1, max_block))
        if two_level and d(st.booleans()):
            return mx.BlockFormat(elem, size, scale=E4M3FN, scale_rule="amax", tensor_scale=d(st.booleans()))
        return mx.BlockFormat(elem, size, scale=E8M0, scale_rule=d(st.sampled_from(["floor", "ceil", "even"])))

    return draw()


def _f32(v) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", float(v)))[0]
    except OverflowError:  # beyond float32's range (a format whose max is float32's)
        return math.copysign(math.inf, float(v))


def _next(v: float, up: bool) -> float:
    """The float32 neighbour of the float32 value v."""
    if v == 0:
        return 1.401298464324817e-45 if up else -1.401298464324817e-45
    b = struct.unpack("<I", struct.pack("<f", v))[0]
    b += 1 if (v > 0) == up else -1
    return struct.unpack("<f", struct.pack("<I", b))[0]


def format_values(fmt: FloatFormat, limit: int = 4096) -> list[Fraction]:
    """The format's non-negative finite values, from the definition (all of them when there are
    at most ``limit``; otherwise a spread: the first and last codes of every binade)."""
    n = fmt.max_code + 1
    if n <= limit:
        codes = range(n)
    else:
        per = 1 << fmt.man
        codes = sorted({c for field in range(n // per + 1) for c in (field * per, field * per + 1,
                                                                     field * per + per - 1) if c < n})
    return [fmt.code_value(c) for c in codes]


def boundary_list(fmt) -> list[float]:
    """The non-negative float32 values (and +inf) :func:`boundary_values` draws from (and their negatives)."""
    fmt = FloatFormat.parse(fmt)
    vals = format_values(fmt)
    pts: set[float] = {0.0, -0.0, math.inf, -math.inf, 3.4028234663852886e38, 1.401298464324817e-45}
    ulp_max = vals[-1] - vals[-2] if len(vals) > 1 else vals[-1]
    for q in vals + [(a + b) / 2 for a, b in zip(vals, vals[1:])] + [vals[-1] + ulp_max / 2]:
        v = _f32(q)
        if math.isfinite(v):
            pts.update({v, _next(v, True), _next(v, False)})
    return sorted(p for p in pts if p >= 0 and math.copysign(1.0, p) > 0)


def boundary_values(fmt):
    """Strategy of float32 values (Python floats) at and around ``fmt``'s rounding boundaries:
    :func:`boundary_list` and the negatives."""
    st = _st()
    return st.sampled_from(boundary_list(fmt)).flatmap(lambda v: st.sampled_from([v, -v]))


# --------------------------------------------------------------------------------------- allreduce
def reference_sum(tensors, fmt, *, algorithm: str = "ring", group_size: int | None = None, kahan: bool = False,
                  rounding="nearest", saturate: bool = False, inputs_in_fmt: bool = False) -> torch.Tensor:
    """The exact reference of :func:`cpd.allreduce`: the bits it must return, from exact arithmetic.

    Every rounded addition is computed with :mod:`cpd.reference` (the exact rational sum rounded
    once, IEEE's rules for signed zeros and special values), in the order
    :func:`cpd.allreduce`'s docstring documents for ``algorithm`` — nothing of cpd's kernels is
    used. One Python call per element and per addition: meant for small tensors in tests (about
    W x n x (1, or 5 with Kahan) additions of ~10 µs each).

    Args:
        tensors: as for :func:`cpd.allreduce`: a list of W same-shape float tensors (float32;
            float16/bfloat16 are upcast exactly) or one tensor with a leading worker dimension W.
            Never modified.
        fmt: the accumulation format (a :class:`~cpd.FloatFormat`, a name or a torch dtype).
        algorithm: ``"ring"``, ``"hierarchical"``, ``"tree"`` or ``"sequential"``.
        group_size: hierarchical only: workers per group (a divisor of W).
        kahan: Kahan-compensated partial sums.
        rounding: ``"nearest"``, ``"toward_zero"``, ``"up"`` or ``"down"``. Stochastic rounding has
            no single exact answer (it depends on random words) and is a ``ValueError``.
        saturate: overflows give ±max.
        inputs_in_fmt: the inputs already hold values of ``fmt`` (skip the initial cast).

    Returns:
        A float32 tensor of the per-worker shape, on the inputs' device.

    Raises:
        ValueError / TypeError: the same argument checks as :func:`cpd.allreduce`; stochastic
            rounding.

    Example:
        >>> import torch, cpd
        >>> from cpd.testing import reference_sum
        >>> x = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [4.0, 4.0, 4.0]])   # 3 workers
        >>> reference_sum(x, cpd.FloatFormat(3, 0), algorithm="ring")      # chunk 0: 1+1=2, 2+4=6 -> 8
        tensor([8., 4., 4.])
        >>> reference_sum(x, cpd.FloatFormat(3, 0), algorithm="sequential")
        tensor([8., 8., 8.])
    """
    rows, shape = _stack_workers(tensors)
    return _reference_sum(rows, shape, fmt, algorithm, group_size, kahan, rounding, saturate, inputs_in_fmt)


def _reference_sum(rows: torch.Tensor, shape, fmt, algorithm, group_size, kahan, rounding, saturate,
                   inputs_in_fmt) -> torch.Tensor:
    values = reference.allreduce(rows.cpu().tolist(), fmt, algorithm=algorithm, group_size=group_size, kahan=kahan,
                                 rounding=rounding, saturate=saturate, inputs_in_fmt=inputs_in_fmt)
    return torch.tensor(values, dtype=torch.float32).reshape(shape).to(rows.device)


def _show(v: float) -> str:
    """A float32 value and its bit pattern: ``-0.25 (0xbe800000)``."""
    return f"{v!r} (0x{struct.unpack('<I', struct.pack('<f', v))[0]:08x})"


def assert_allreduce_matches(actual: torch.Tensor, tensors, fmt, *, algorithm: str = "ring",
                             group_size: int | None = None, kahan: bool = False, rounding="nearest",
                             saturate: bool = False, inputs_in_fmt: bool = False, max_shown: int = 5) -> None:
    """Assert that ``actual`` is, bit for bit, the allreduce of ``tensors`` that cpd specifies.

    The expected result is :func:`reference_sum` with the same arguments. "Bit for bit" means
    equal float32 bit patterns, except that any NaN matches any NaN: ``-0.0`` and ``+0.0`` differ,
    as do values one ulp apart. Use it to test :func:`cpd.allreduce` itself, a communication hook
    that claims to emulate it, or the result of a real low-precision collective.

    Args:
        actual: the result to check: a float32 tensor of the per-worker shape (any device).
        tensors, fmt, algorithm, group_size, kahan, rounding, saturate, inputs_in_fmt: exactly as
            for :func:`cpd.allreduce` (deterministic rounding modes only).
        max_shown: how many mismatching elements the message lists (the first ones, in
            row-major order).

    Raises:
        AssertionError: ``actual`` has the wrong shape or dtype, or differs from the reference;
            the message gives the number of mismatching elements, and for the first
            ``max_shown`` their index, the expected and the actual value with their float32 bit
            patterns.
        TypeError / ValueError: bad arguments (as :func:`cpd.allreduce`; ``actual`` not a tensor;
            stochastic rounding).

    Example:
        >>> import torch, cpd
        >>> from cpd.testing import assert_allreduce_matches
        >>> grads = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))   # 5 workers
        >>> out = cpd.allreduce(grads, cpd.E5M2, algorithm="tree", kahan=True)
        >>> assert_allreduce_matches(out, grads, cpd.E5M2, algorithm="tree", kahan=True)  # passes
        >>> assert_allreduce_matches(out, grads, cpd.E5M2, algorithm="ring")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        AssertionError: allreduce result differs from the exact reference in ... of 7 elements ...
    """
    if not isinstance(actual, torch.Tensor):
        raise TypeError(f"actual must be a torch.Tensor, got {type(actual).__name__}")
    if isinstance(max_shown, bool) or not isinstance(max_shown, int) or max_shown < 1:
        raise ValueError(f"max_shown must be an int >= 1, got {max_shown!r}")
    rows, shape = _stack_workers(tensors)
    expected = _reference_sum(rows, shape, fmt, algorithm, group_size, kahan, rounding, saturate, inputs_in_fmt).cpu()
    if actual.dtype != torch.float32:
        raise AssertionError(f"actual has dtype {actual.dtype}; cpd.allreduce returns float32")
    if actual.shape != expected.shape:
        raise AssertionError(f"actual has shape {tuple(actual.shape)}, but the per-worker shape is "
                             f"{tuple(expected.shape)}")
    got = actual.detach().cpu()
    both_nan = got.isnan() & expected.isnan()
    bad = (got.view(torch.int32) != expected.view(torch.int32)) & ~both_nan
    count = int(bad.sum())
    if count == 0:
        return
    fmt = FloatFormat.parse(fmt)
    where = [tuple(int(i) for i in idx) for idx in bad.nonzero()[:max_shown].tolist()]
    lines = [f"allreduce result differs from the exact reference in {count} of {got.numel()} elements "
             f"(fmt={fmt.name}, algorithm={algorithm!r}, group_size={group_size}, kahan={kahan}, "
             f"rounding={Rounding.parse(rounding).value!r}, saturate={saturate}, W={rows.shape[0]}); "
             f"first {len(where)}:"]
    for idx in where:
        lines.append(f"  index {idx}: expected {_show(float(expected[idx]))}, got {_show(float(got[idx]))}")
    raise AssertionError("\n".join(lines))
