"""cpd.testing's strategies produce what they promise: valid formats within the requested size,
and float32 values that sit on a format's rounding boundaries (values, midpoints, ±1 ulp)."""

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
    import torch

    codes = torch.arange(fmt.max_code + 1, dtype=torch.uint8)
    assert [float(v) for v in ct.format_values(fmt)] == cpd.decode(codes, fmt).tolist()


@given(st.data())
def test_boundary_values_round_trip_through_cast(data):
    fmt = data.draw(ct.formats(max_bits=8))
    x = data.draw(ct.boundary_values(fmt))
    import torch

    y = cpd.cast(torch.tensor([x]), fmt)
    assert torch.equal(cpd.cast(y, fmt).view(torch.int32), y.view(torch.int32)) or y.isnan().all()
