"""Dettmers' (2016) four 8-bit data types (cpd/compressors/dettmers.py).

Invariant: each table equals the paper's definition re-derived here with exact rational
arithmetic from the bit anatomy (as the module docstring reads it); encode picks the nearest table
value (ties to the smaller magnitude), found here by brute force over all 128 entries; the bytes on
the wire are one per element (+4 for the absmax of the normalized types); and the orderings of the
paper's Table 2 that do not depend on the sample (the dynamic tree has the lowest mean relative
error; on normal data the normalized types have far lower absolute error than the static ones)
hold at a small sample size.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import pytest
import torch

import cpd
from cpd.compressors import Dettmers8bit, dynamic_tree_table, linear_table, mantissa_table, static_tree_table

KINDS = ("linear", "static_tree", "dynamic_tree", "mantissa8")


def _leaf(route: str) -> Fraction:
    """Bisect (1/10, 1) along the route bits ('1' = upper half); the leaf is the final midpoint."""
    lo, hi = Fraction(1, 10), Fraction(1)
    for b in route:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if b == "1" else (lo, mid)
    return (lo + hi) / 2


def oracle_table(kind: str, offset: int = 1) -> list[Fraction]:
    out = []
    for c in range(128):
        bits = format(c, "07b")
        if kind == "linear":
            out.append(Fraction(c, 127))
        elif kind == "dynamic_tree":
            n = bits.find("1")
            out.append(Fraction(0) if n < 0 else Fraction(1, 10 ** n) * _leaf(bits[n + 1:]))
        elif kind == "static_tree":
            e = int(bits[:3], 2)
            v = Fraction(10) ** (offset - e) * _leaf(bits[3:])
            out.append(Fraction(0) if (e, bits[3:]) == (7, "0000") else v)
        else:
            e, m = int(bits[:3], 2), int(bits[3:], 2)
            out.append(Fraction(10) ** (offset - e) * Fraction(m, 10))
    return out


def f32(v) -> float:
    return struct.unpack("f", struct.pack("f", float(v)))[0]


@pytest.mark.parametrize("kind,offset", [("linear", None), ("dynamic_tree", None), ("static_tree", 1),
                                         ("static_tree", 2), ("mantissa8", 1), ("mantissa8", 2)])
def test_table_matches_definition(kind, offset):
    c = Dettmers8bit(kind, offset=offset)
    want = oracle_table(kind, offset or 1)
    got64 = c.table64.tolist()
    for code, (g, w) in enumerate(zip(got64, want)):
        assert abs(Fraction(g) - w) <= abs(w) * Fraction(1, 2 ** 50), (kind, code, g, w)
        assert c.table[code].item() == f32(w), (kind, code)


def test_table_shapes_by_hand():
    dyn = dynamic_tree_table()
    assert dyn[0] == 0.0 and len(set(dyn)) == 128
    assert dyn[0b1000000] == pytest.approx(0.1 + 0.9 * 0.5 / 64)       # n=0, route 000000
    assert dyn[0b1111111] == pytest.approx(1 - 0.9 * 0.5 / 64)          # largest: below 1
    assert dyn[0b0000001] == pytest.approx(0.55e-6)                     # n=6, no tree bits: 10^-6 * 0.55
    assert dyn[0b0000011] == pytest.approx(1e-5 * (0.1 + 0.9 * 0.75))   # n=5, route '1'
    lin = linear_table()
    assert lin[0] == 0 and lin[127] == 1 and lin[1] == pytest.approx(1 / 127)
    st = static_tree_table(1)
    assert st[0] == pytest.approx(10 * (0.1 + 0.9 / 32)) and st[7 << 4] == 0
    ma = mantissa_table(1)
    assert ma[15] == pytest.approx(15.0) and ma[(1 << 4) | 3] == pytest.approx(0.3) and ma[5 << 4] == 0


def _brute_force(kind, x, offset=None):
    """Nearest table value of |x| (normalized as the definition says) by comparing all 128."""
    c = Dettmers8bit(kind, offset=offset)
    table = c.table.double()
    a = x.abs()
    absmax = a.max()
    y = (a / absmax if c.normalized else a).double()
    d = (y.unsqueeze(1) - table.unsqueeze(0)).abs()
    best = d.min(1, keepdim=True).values
    cand = torch.where(d == best, table.unsqueeze(0), math.inf)
    mag = cand.min(1).values.float()                                    # ties: the smaller magnitude
    if c.normalized:
        mag = mag * absmax
    return torch.where(torch.signbit(x), -mag, mag)


@pytest.mark.parametrize("kind", KINDS)
def test_encode_is_nearest(kind):
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(3000, generator=g) * 3, torch.rand(1000, generator=g) * 1e-4,
                   torch.tensor([0.0, -0.0, 5.0, -5.0])])
    c = Dettmers8bit(kind)
    got = c.decode(c.encode(x))
    want = _brute_force(kind, x)
    assert torch.equal(got, want)
    assert torch.equal(torch.signbit(got), torch.signbit(x))


@pytest.mark.parametrize("kind", KINDS)
def test_midpoints_and_neighbours(kind):
    """Inputs at every midpoint between table values (rounded to float32) and one float32 ulp
    either side go to the nearest value (exact ties: the smaller one)."""
    c = Dettmers8bit(kind)
    vals = torch.unique(c.table).double()
    mids = ((vals[1:] + vals[:-1]) / 2).float()
    y = torch.cat([mids, torch.nextafter(mids, torch.tensor(math.inf)), torch.nextafter(mids, torch.tensor(0.0)),
                   c.table])
    if c.normalized:  # the absmax 1.0 keeps y unchanged by the normalization
        y = torch.cat([y, torch.tensor([1.0])])
    got = c.decode(c.encode(y))
    assert torch.equal(got, _brute_force(kind, y))


def test_linear_payload_by_hand():
    x = torch.tensor([-4.0, 1.0, 0.5, 0.0])
    c = cpd.compressors.get("linear")
    p = c.encode(x)
    # y = |x| / 4 = 1, 0.25, 0.125, 0 -> k = round(127 y) = 127, 32 (31.75), 16 (15.875), 0
    assert p.parts["codes"].tolist() == [0x80 | 127, 32, 16, 0]
    assert p.parts["absmax"].tolist() == list(struct.pack("<f", 4.0))
    assert p.nbytes == 4 + 4
    assert c.decode(p).tolist() == [-4.0, f32(f32(32 / 127) * 4), f32(f32(16 / 127) * 4), 0.0]
    assert x.tolist() == [-4.0, 1.0, 0.5, 0.0]  # not modified


def test_dynamic_tree_payload_by_hand():
    x = torch.tensor([1.0, -0.5, 0.0])
    p = Dettmers8bit("dynamic_tree").encode(x)
    # 1 -> the largest code 0b1111111; 0.5 -> n=0, (0.5-0.1)/0.9*64 = 28.44 -> leaf 28 (0.49375..
    # 0.5078: midpoint 0.50078); 0 -> 0.
    assert p.parts["codes"].tolist() == [127, 0x80 | 0b1000000 | 28, 0]


def test_static_types_have_no_absmax_and_use_offset():
    x = torch.tensor([30.0, -0.3])
    p1, p2 = Dettmers8bit("mantissa8").encode(x), Dettmers8bit("mantissa8", offset=2).encode(x)
    assert p1.nbytes == 2 and set(p1.parts) == {"codes"}
    # offset 1: 30 saturates at the largest value 15; offset 2: 30 = 10^(2-1) * 3 exactly
    assert Dettmers8bit("mantissa8").decode(p1).tolist()[0] == 15.0
    assert Dettmers8bit("mantissa8", offset=2).decode(p2).tolist() == [30.0, f32(-0.3)]


@pytest.mark.parametrize("kind", KINDS)
def test_bytes_and_ratio(kind):
    x = torch.randn(100, 10)
    p = Dettmers8bit(kind).encode(x)
    extra = 4 if kind in ("linear", "dynamic_tree") else 0
    assert p.nbytes == 1000 + extra and all(t.dtype == torch.uint8 for t in p.parts.values())
    assert p.ratio == pytest.approx(4000 / (1000 + extra))


def _errors(kind, x, offset):
    c = Dettmers8bit(kind, offset=offset if kind in ("static_tree", "mantissa8") else None)
    e = (c.decode(c.encode(x)).double() - x.double()).abs()
    nz = x != 0
    return e.mean().item(), (e[nz] / x[nz].double().abs()).mean().item()


def test_table2_robust_orderings():
    g = torch.Generator().manual_seed(0)
    n = 200_000
    dists = {"U(0,1)": (torch.rand(n, generator=g), 1), "N(0,1)": (torch.randn(n, generator=g), 1),
             "N(0,10^2)": (10 * torch.randn(n, generator=g), 2), "N(0,0.2^2)": (0.2 * torch.randn(n, generator=g), 1)}
    for name, (x, off) in dists.items():
        err = {k: _errors(k, x, off) for k in KINDS}
        rel = {k: v[1] for k, v in err.items()}
        assert min(rel, key=rel.get) == "dynamic_tree", (name, rel)       # Dettmers: best overall
        assert rel["dynamic_tree"] < 0.03, (name, rel)
        if name != "U(0,1)":
            ab = {k: v[0] for k, v in err.items()}
            assert max(ab["linear"], ab["dynamic_tree"]) * 2 < min(ab["static_tree"], ab["mantissa8"]), (name, ab)


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind='tree'"):
        Dettmers8bit("tree")
    with pytest.raises(ValueError, match="offset"):
        Dettmers8bit("dynamic_tree", offset=2)
    with pytest.raises(ValueError, match="offset must be an int"):
        Dettmers8bit("static_tree", offset=1.5)
    with pytest.raises(ValueError, match="inf or NaN"):
        Dettmers8bit("linear").encode(torch.tensor([1.0, math.inf]))
    with pytest.raises(TypeError, match="dtype torch.int64"):
        Dettmers8bit("linear").encode(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="encoded by 'linear'"):
        Dettmers8bit("dynamic_tree").decode(Dettmers8bit("linear").encode(torch.ones(3)))


def test_all_zero_and_empty():
    c = Dettmers8bit("dynamic_tree")
    assert torch.equal(c.decode(c.encode(torch.zeros(5))), torch.zeros(5))
    e = c.decode(c.encode(torch.zeros(0, 3)))
    assert e.shape == (0, 3)


@pytest.mark.parametrize("kind,offset", [("linear", None), ("dynamic_tree", None), ("static_tree", 1),
                                         ("static_tree", -3), ("mantissa8", 2)])
def test_nearest_is_the_count_of_midpoints_below(kind, offset):
    """_nearest (a table over 16-bit prefixes of the float32 bits, then a compare per midpoint
    sharing y's prefix) against numpy.searchsorted (side="left": midpoints strictly below y) on
    every midpoint and its two float32 neighbours, zero, the largest float32 and random
    non-negative floats of every binade."""
    import numpy as np

    c = Dettmers8bit(kind, offset=offset) if offset is not None else Dettmers8bit(kind)
    mids = c._mids
    g = torch.Generator().manual_seed(1)
    rnd = torch.randint(0, 0x7F800000, (20000,), dtype=torch.int32, generator=g).view(torch.float32)
    y = torch.cat([mids, torch.nextafter(mids, torch.zeros_like(mids)),
                   torch.nextafter(mids, torch.full_like(mids, math.inf)), torch.tensor([0.0, 1.0, 3.4028235e38]), rnd])
    want = torch.from_numpy(np.searchsorted(mids.numpy(), y.numpy(), side="left"))
    assert torch.equal(c._nearest(y), want)
    assert torch.equal(c._nearest(y.reshape(2, -1)), want.reshape(2, -1))
