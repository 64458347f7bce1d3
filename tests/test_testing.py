"""cpd.testing's helpers do what they promise.

Invariants defended:
* the strategies give valid formats within the requested size (never an invalid fallback), and
  float32 values that sit on a format's rounding boundaries (values, midpoints, ±1 ulp);
* ``reference_sum`` is bit for bit what ``cpd.allreduce`` returns, for every algorithm, Kahan on
  and off, the formats e5m2, e4m3, e3m0 and fp16, round to nearest and a directed mode, W in
  {1, 2, 3, 5, 8} with n not divisible by W (it is built on cpd.reference, which
  tests/test_reference.py checks against the independent oracle);
* ``assert_allreduce_matches`` passes on cpd's result and fails, naming the mismatching index,
  the expected and actual values and their bit patterns and the mismatch count, when one element
  is one ulp off or a zero has the wrong sign; any NaN matches any NaN; wrong shape/dtype fail;
* inputs are never modified; bad arguments are clear errors.
"""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cpd
import cpd.testing as ct


@settings(max_examples=200)
@given(ct.formats(min_bits=4, max_bits=8, custom_bias=True))
def test_formats_are_valid_and_sized(fmt):
    assert isinstance(fmt, cpd.FloatFormat)
    assert 4 <= fmt.bits <= 8 or fmt.specials is cpd.Specials.FINITE


def test_boundary_list_covers_midpoints_and_neighbours():
    fmt = cpd.E5M2
    pts = set(ct.boundary_list(fmt))
    vals = ct.format_values(fmt)
    mid = float((vals[10] + vals[11]) / 2)
    assert {mid, ct._next(mid, True), ct._next(mid, False)} <= pts
    assert {57344.0, 61440.0, ct._next(61440.0, False), float("inf"), 0.0} <= pts
    assert float(vals[1]) in pts  # the smallest subnormal


def test_format_values_match_encode_decode():
    fmt = cpd.E4M3
    codes = torch.arange(fmt.max_code + 1, dtype=torch.uint8)
    assert [float(v) for v in ct.format_values(fmt)] == cpd.decode(codes, fmt).tolist()


@given(st.data())
def test_boundary_values_round_trip_through_cast(data):
    fmt = data.draw(ct.formats(max_bits=8))
    x = data.draw(ct.boundary_values(fmt))
    y = cpd.cast(torch.tensor([x]), fmt)
    assert torch.equal(cpd.cast(y, fmt).view(torch.int32), y.view(torch.int32)) or y.isnan().all()


@settings(max_examples=300)
@given(ct.formats(min_bits=2, max_bits=12, custom_bias=True, specials=("fn",), subnormals=(False,)))
def test_formats_fall_back_to_a_valid_format(fmt):
    """Draws that are invalid as asked (bias out of range, no normals) still give a format of the size."""
    assert 2 <= fmt.bits <= 12


# --------------------------------------------------------------------------------------- reference_sum
def workers(w: int, n: int, fmt, seed: int) -> torch.Tensor:
    """(W, n) values over the format's range: signed zeros, exact cancellations, tiny values that
    underflow, and large ones whose sums overflow."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(w, n, generator=g) * torch.exp2(torch.randint(-4, 3, (w, n), generator=g).float()) * (fmt.max / 6)
    x[torch.rand(w, n, generator=g) < 0.15] = 0.0
    x[torch.rand(w, n, generator=g) < 0.1] = -0.0
    tiny = torch.rand(w, n, generator=g) < 0.1
    x[tiny] = x[tiny] * (fmt.smallest_subnormal / fmt.max)
    if w >= 2:
        x[1, ::3] = -x[0, ::3]  # exact zero sums when the other workers hold zeros there
    return x


FORMATS = [cpd.E5M2, cpd.E4M3, cpd.FloatFormat(3, 0), cpd.FP16]


def hier_sizes(w):
    return [k for k in range(1, w + 1) if w % k == 0]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("rounding", ["nearest", "down"])
@pytest.mark.parametrize("kahan", [False, True], ids=["plain", "kahan"])
def test_reference_sum_is_cpd_allreduce(fmt, rounding, kahan):
    checked = 0
    for w in (1, 2, 3, 5, 8):
        n = 2 * w + 3 if w > 1 else 5  # not divisible by W
        x = workers(w, n, fmt, seed=17 * w)
        for algorithm in cpd.ALLREDUCE_ALGORITHMS:
            for k in (hier_sizes(w) if algorithm == "hierarchical" else [None]):
                kw = dict(algorithm=algorithm, group_size=k, kahan=kahan, rounding=rounding)
                want = ct.reference_sum(x, fmt, **kw)
                got = cpd.allreduce(x, fmt, **kw)
                assert want.dtype == torch.float32 and want.shape == (n,)
                same = (want.view(torch.int32) == got.view(torch.int32)) | (want.isnan() & got.isnan())
                assert bool(same.all()), (fmt.name, rounding, kahan, w, kw, want.tolist(), got.tolist())
                ct.assert_allreduce_matches(got, x, fmt, **kw)
                checked += 1
    assert checked == 4 * 5 + sum(len(hier_sizes(w)) - 1 for w in (1, 2, 3, 5, 8))


def test_reference_sum_sees_the_order_and_the_sign_of_zero():
    """Hand-checked (3, 0) sums: the ring starts chunk c at worker c; x + (-x) is +0 (nearest) or -0 (down)."""
    e3m0 = cpd.FloatFormat(3, 0)
    x = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [4.0, 4.0, 4.0]])
    assert ct.reference_sum(x, e3m0, algorithm="ring").tolist() == [8.0, 4.0, 4.0]
    assert ct.reference_sum(list(x), e3m0, algorithm="sequential").tolist() == [8.0, 8.0, 8.0]
    minus_zeros = torch.full((6, 4), -0.0)  # -0 + -0 is -0 in every order (the tree's waiting worker 4 too)
    for algorithm in cpd.ALLREDUCE_ALGORITHMS:
        for kahan in (False, True):
            kw = dict(algorithm=algorithm, group_size=3 if algorithm == "hierarchical" else None, kahan=kahan)
            assert ct.reference_sum(minus_zeros, e3m0, **kw).view(torch.int32).eq(-2**31).all(), kw
            ct.assert_allreduce_matches(cpd.allreduce(minus_zeros, e3m0, **kw), minus_zeros, e3m0, **kw)
    z = torch.tensor([[0.5], [-0.5]])
    assert math.copysign(1, ct.reference_sum(z, e3m0).item()) > 0
    assert math.copysign(1, ct.reference_sum(z, e3m0, rounding="down").item()) < 0


def test_reference_sum_options_shapes_and_inputs():
    x = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(3)) * 3e4
    before = x.clone()
    for kw in (dict(saturate=True), dict(inputs_in_fmt=True), dict(kahan=True, rounding="up"),
               dict(algorithm="hierarchical", group_size=2, rounding="toward_zero")):
        want = ct.reference_sum(x, cpd.E5M2, **kw)
        assert want.shape == (2, 3)
        got = cpd.allreduce(x, cpd.E5M2, **kw)
        assert bool(((want.view(torch.int32) == got.view(torch.int32)) | (want.isnan() & got.isnan())).all()), kw
    assert torch.equal(x, before)
    assert torch.equal(ct.reference_sum(x.half(), "e5m2"), ct.reference_sum(x.half().float(), cpd.E5M2))
    assert ct.reference_sum(torch.empty(3, 0), cpd.E5M2).shape == (0,)


# --------------------------------------------------------------------------------------- assert_allreduce_matches
def _next_f32(v: float) -> float:
    return torch.tensor([v]).view(torch.int32).add(1).view(torch.float32).item()


def test_assert_passes_on_correct_results_and_nan():
    x = workers(5, 11, cpd.E4M3, seed=1)
    x[2, 4] = math.nan
    x[3, 5] = math.inf
    for algorithm in cpd.ALLREDUCE_ALGORITHMS:
        k = 5 if algorithm == "hierarchical" else None
        out = cpd.allreduce(x, cpd.E4M3, algorithm=algorithm, group_size=k, kahan=True)
        assert out[4].isnan() and out[5].isnan()  # inf in an ieee format, then inf - inf in Kahan: NaN
        other_nan = out.clone()
        other_nan[4] = -math.nan  # a NaN with another sign / payload still matches
        ct.assert_allreduce_matches(other_nan, x, cpd.E4M3, algorithm=algorithm, group_size=k, kahan=True)


def test_assert_reports_a_one_ulp_error():
    x = workers(3, 7, cpd.E5M2, seed=2)
    out = cpd.allreduce(x, cpd.E5M2)
    i = int((out != 0).nonzero()[0])
    bad = out.clone()
    bad[i] = _next_f32(float(out[i]))  # one float32 ulp: not even a value of e5m2
    with pytest.raises(AssertionError) as info:
        ct.assert_allreduce_matches(bad, x, cpd.E5M2)
    msg = str(info.value)
    assert "1 of 7 elements" in msg and f"index ({i},)" in msg, msg
    assert f"expected {float(out[i])!r}" in msg and f"got {float(bad[i])!r}" in msg, msg
    assert re.search(r"expected .* \(0x[0-9a-f]{8}\), got .* \(0x[0-9a-f]{8}\)", msg), msg
    bad[i] = cpd.cast(torch.tensor([float(out[i]) * 1.25]), cpd.E5M2, "up").item()  # one e5m2 ulp or more
    with pytest.raises(AssertionError, match="1 of 7"):
        ct.assert_allreduce_matches(bad, x, cpd.E5M2)


def test_assert_sees_the_sign_of_zero():
    x = torch.tensor([[1.0, 0.5, -2.0], [-1.0, 0.25, 2.0]])
    out = cpd.allreduce(x, cpd.E5M2)
    assert out.tolist() == [0.0, 0.75, 0.0] and math.copysign(1, out[0].item()) > 0
    flipped = out.clone()
    flipped[0] = -0.0
    with pytest.raises(AssertionError) as info:
        ct.assert_allreduce_matches(flipped, x, cpd.E5M2)
    msg = str(info.value)
    assert "1 of 3" in msg and "expected 0.0 (0x00000000), got -0.0 (0x80000000)" in msg, msg
    # ... and rounding down the same sums gives -0, which the helper then expects
    ct.assert_allreduce_matches(cpd.allreduce(x, cpd.E5M2, rounding="down"), x, cpd.E5M2, rounding="down")
    with pytest.raises(AssertionError, match="2 of 3"):
        ct.assert_allreduce_matches(out, x, cpd.E5M2, rounding="down")


def test_assert_lists_the_first_mismatches_of_many():
    x = workers(4, 2 * 3 * 5, cpd.E5M2, seed=4).reshape(4, 2, 3, 5)
    out = cpd.allreduce(x, cpd.E5M2)
    wrong = out + 1.0  # nearly every element changes
    count = int(((wrong.view(torch.int32) != out.view(torch.int32))).sum())
    with pytest.raises(AssertionError) as info:
        ct.assert_allreduce_matches(wrong, x, cpd.E5M2, max_shown=3)
    msg = str(info.value)
    assert f"{count} of 30 elements" in msg and msg.count("  index (") == 3 and "index (0, 0, 0)" in msg, msg


def test_assert_wrong_shape_dtype_and_options():
    x = workers(3, 5, cpd.E5M2, seed=5) * 40
    out = cpd.allreduce(x, cpd.E5M2, saturate=True)
    ct.assert_allreduce_matches(out, x, cpd.E5M2, saturate=True)
    if not torch.equal(out, cpd.allreduce(x, cpd.E5M2)):  # an overflow happened: saturate matters
        with pytest.raises(AssertionError, match="saturate=False"):
            ct.assert_allreduce_matches(out, x, cpd.E5M2)
    with pytest.raises(AssertionError, match="shape"):
        ct.assert_allreduce_matches(out[:4], x, cpd.E5M2, saturate=True)
    with pytest.raises(AssertionError, match="float16"):
        ct.assert_allreduce_matches(out.half(), x, cpd.E5M2, saturate=True)
    with pytest.raises(TypeError, match="actual"):
        ct.assert_allreduce_matches(out.tolist(), x, cpd.E5M2)
    with pytest.raises(ValueError, match="stochastic"):
        ct.assert_allreduce_matches(out, x, cpd.E5M2, rounding="stochastic")
    with pytest.raises(ValueError, match="group_size"):
        ct.assert_allreduce_matches(out, x, cpd.E5M2, algorithm="hierarchical", group_size=2)
    with pytest.raises(ValueError, match="max_shown"):
        ct.assert_allreduce_matches(out, x, cpd.E5M2, max_shown=0)
    with pytest.raises(ValueError, match="stochastic"):
        ct.reference_sum(x, cpd.E5M2, rounding="stochastic")
