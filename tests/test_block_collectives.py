"""Block-scaled communication (cpd.blockreduce): cpd.allreduce / cpd.aps_allreduce with a BlockFormat.

The oracle below is written from the definition in cpd/blockreduce.py with exact rationals:
per block, amax over every worker, the smallest E with 2**E >= amax * W, s = emax_elem - E - margin
clamped to the scale format's powers of two, every element x * 2**s rounded once to the element
format (tests/oracle.py), the sums rounded once per addition in the stated order, then / 2**s.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings, strategies as st

import cpd
from cpd.mx import MXFP4, MXFP8_E4M3, MXFP8_E5M2, MXINT8, NVFP4, BlockFormat

from oracle import max_value, oracle_round

ELEMENTS = [cpd.E4M3FN, cpd.E5M2, cpd.E2M1, cpd.mx.MXINT8_ELEMENT]


def _floor_log2(v: Fraction) -> int:
    e = 0
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    return e


def _ceil_log2(v: Fraction) -> int:
    e = _floor_log2(v)
    return e if Fraction(2) ** e == v else e + 1


def _round(v: Fraction, fmt, mode: str) -> Fraction:
    return Fraction(oracle_round(v, fmt, mode, False, zero_negative=v < 0))


def _ring_chunk(i: int, n: int, w: int) -> int:
    q, r = divmod(n, w)  # numpy.array_split: the first r chunks have q + 1 elements
    return i // (q + 1) if i < r * (q + 1) else r + (i - r * (q + 1)) // q


def _sum(vals: list, order: str, fmt, mode: str, chunk: int = 0) -> Fraction:
    if order == "ring":  # chunk c starts at worker c and travels c+1, ..., c+W-1 (mod W)
        vals = vals[chunk:] + vals[:chunk]
        order = "sequential"
    if order == "sequential":
        acc = vals[0]
        for v in vals[1:]:
            acc = _round(acc + v, fmt, mode)
        return acc
    p = list(vals)  # tree: recursive halving to worker 0
    step = 1
    while step < len(p):
        for i in range(0, len(p) - step, 2 * step):
            p[i] = _round(p[i] + p[i + step], fmt, mode)
        step *= 2
    return p[0]


def oracle_block_allreduce(x: list, fmt: BlockFormat, order: str, mode: str = "nearest", margin: int = 0,
                           k_range=(-127, 127)):
    """x: W lists of n floats. Returns (results as floats, the per-block exponents (None: zero block))."""
    w, n = len(x), len(x[0])
    emax = _floor_log2(max_value(fmt.element))
    out, exps = [], []
    for b0 in range(0, n, fmt.block_size):
        idx = range(b0, min(n, b0 + fmt.block_size))
        amax = max(abs(Fraction(x[j][i])) for j in range(w) for i in idx)
        if amax == 0:
            s = 0
            exps.append(None)
        else:
            s = emax - _ceil_log2(amax * w) - margin
            s = min(max(s, -k_range[1]), -k_range[0])
            exps.append(s)
        f = Fraction(2) ** s
        for i in idx:
            vals = [_round(Fraction(x[j][i]) * f, fmt.element, mode) for j in range(w)]
            out.append(float(_sum(vals, order, fmt.element, mode, _ring_chunk(i, n, w)) / f))
    return out, exps


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


_vals = st.builds(lambda m, e: _f32(m * 2.0 ** e), st.floats(-1, 1, allow_nan=False), st.integers(-30, 20))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), elem=st.sampled_from(ELEMENTS), order=st.sampled_from(["sequential", "tree", "ring"]),
       mode=st.sampled_from(["nearest", "toward_zero", "up"]), bs=st.sampled_from([1, 3, 4, 32]),
       w=st.integers(1, 5), n=st.integers(1, 13), margin=st.integers(0, 2))
def test_block_allreduce_matches_oracle(data, elem, order, mode, bs, w, n, margin):
    x = [[data.draw(_vals) for _ in range(n)] for _ in range(w)]
    fmt = BlockFormat(elem, block_size=bs)
    want, exps = oracle_block_allreduce(x, fmt, order, mode, margin)
    t = torch.tensor(x, dtype=torch.float32)
    got = cpd.allreduce(t, config=cpd.ReduceConfig(fmt, algorithm=order, rounding=mode, margin=margin))
    assert got.tolist() == want
    # aps_allreduce gives the same bits and reports the block exponents
    out, rep = cpd.aps_allreduce({"g": t}, fmt, algorithm=order, rounding=mode, margin=margin)
    assert torch.equal(out["g"], got)
    nz = [e for e in exps if e is not None]
    if nz:
        assert rep["g"].block_scale_exps == (min(nz), max(nz))
        assert rep["g"].scale_exp == min(nz)
    else:
        assert rep["g"].status == "zero"


def test_block_exponent_is_aps_per_block_and_clamped():
    # One block of 2**-140 (below E8M0's 2**-127 scale after the E4M3 shift) and one of 2**100.
    x = torch.tensor([[2.0 ** -140, 2.0 ** -141, 2.0 ** 100, 3.0 * 2 ** 99]], dtype=torch.float32).repeat(2, 1)
    fmt = BlockFormat(cpd.E4M3FN, block_size=2)
    want, exps = oracle_block_allreduce(x.tolist(), fmt, "sequential")
    assert exps == [127, -94]  # 8 + 139 = 147 clamped to 127; 8 - ceil(log2(1.5 * 2**101)) = 8 - 102
    s, nz = cpd.blockreduce.block_exponents(x, fmt, 2)
    assert s.tolist() == exps and nz.tolist() == [True, True]
    got = cpd.allreduce(x, fmt, algorithm="sequential")
    assert got.tolist() == want


@pytest.mark.parametrize("algorithm,group_size", [("ring", None), ("hierarchical", 2), ("tree", None)])
@pytest.mark.parametrize("kahan", [False, True])
def test_block_allreduce_equals_composition(algorithm, group_size, kahan):
    """Second check: scale per block (exact), cast, allreduce in the element format, unscale."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 70, generator=g) * torch.logspace(-8, 3, 70)
    fmt = MXFP8_E5M2
    got = cpd.allreduce(x, fmt, algorithm=algorithm, group_size=group_size, kahan=kahan)
    amax = torch.nn.functional.pad(x.abs().amax(0), (0, 26)).reshape(3, 32).amax(1).double() * 4
    s = torch.tensor([15 - math.ceil(math.log2(a)) for a in amax.tolist()])
    f = (2.0 ** s.double()).repeat_interleave(32)[:70]
    low = cpd.cast((x.double() * f).float(), cpd.E5M2)
    ref = cpd.allreduce(low, cpd.E5M2, algorithm=algorithm, group_size=group_size, kahan=kahan, inputs_in_fmt=True)
    assert torch.equal(got, (ref.double() / f).float())


def test_block_allreduce_keeps_range_layer_aps_loses():
    """A layer spanning many binades: per-block scaling underflows nothing, per-layer APS does."""
    x = (torch.ones(4, 64) * torch.logspace(-12, 0, 64, base=2.0) ** 2).float()
    _, rb = cpd.aps_allreduce({"g": x}, MXFP8_E4M3)
    _, rl = cpd.aps_allreduce({"g": x}, cpd.E4M3FN)
    assert rb["g"].underflow_frac == 0 and rl["g"].underflow_frac > 0
    assert rb["g"].mean_rel_error < rl["g"].mean_rel_error


def test_block_nonfinite_and_inputs_unchanged():
    x = torch.tensor([[1.0, float("inf"), 2.0, 3.0], [1.0, 1.0, 2.0, 3.0]])
    before = x.clone()
    got = cpd.allreduce(x, BlockFormat(cpd.E5M2, block_size=2))
    assert torch.equal(x, before)
    assert math.isinf(got[1]) and got[2:].tolist() == [4.0, 6.0]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out, rep = cpd.aps_allreduce({"g": x}, MXFP8_E5M2)
    assert rep["g"].status == "nonfinite" and rec


def test_block_config_errors():
    with pytest.raises(ValueError, match="power-of-two block scales"):
        cpd.ReduceConfig(NVFP4)
    with pytest.raises(ValueError, match="axis=-1"):
        cpd.ReduceConfig(BlockFormat(cpd.E4M3FN, axis=0))
    with pytest.raises(ValueError, match="scaling must be 'aps'"):
        cpd.ReduceConfig(MXFP4, scaling="loss")
    with pytest.raises(ValueError, match="emulated path only"):
        cpd.ReduceConfig(MXINT8).for_processes()
    with pytest.raises(ValueError, match="inputs_in_fmt"):
        cpd.allreduce(torch.ones(2, 3), MXFP4, inputs_in_fmt=True)
    with pytest.raises(ValueError, match="block format"):
        cpd.scaled_allreduce({"g": torch.ones(2, 3)}, MXFP4, 3)
    with pytest.raises(ValueError, match="block format"):
        cpd.LossScaler().allreduce({"g": torch.ones(2, 3)}, MXFP4)
    cfg = cpd.ReduceConfig(MXFP8_E4M3)
    assert cfg.is_block and cfg.element == cpd.E4M3FN and cfg.scaling == "aps"
    assert not cpd.ReduceConfig(cpd.E5M2).is_block and cpd.ReduceConfig(cpd.E5M2).element == cpd.E5M2


def _layers():
    g = torch.Generator().manual_seed(3)
    return {"conv": torch.randn(4, 96, generator=g) * torch.logspace(-7, 1, 96),
            "fc": torch.randn(4, 40, generator=g) * 1e-4, "bias": torch.randn(4, 5, generator=g) * 30}


def test_compare_scalings_table_and_default_loss_scale(tmp_path):
    layers = _layers()
    before = {k: v.clone() for k, v in layers.items()}
    cmp = cpd.compare_scalings(layers, MXFP8_E4M3)
    assert all(torch.equal(layers[k], before[k]) for k in layers)
    # default loss scale: the largest global 2**k with k <= 8 - ceil(log2(amax * W)) for every layer
    k = min(8 - _ceil_log2(Fraction(float(v.abs().max())) * 4) for v in layers.values())
    assert cmp.methods == ["aps per layer", "aps per block", f"loss scaling 2^{k}"]
    # each report is the public function's report on the same gradients
    out_l, rl = cpd.aps_allreduce(layers, cpd.E4M3FN)
    out_b, rb = cpd.aps_allreduce(layers, MXFP8_E4M3)
    _, rs = cpd.scaled_allreduce(layers, cpd.E4M3FN, k)
    for got, want in zip(cmp.reports.values(), (rl, rb, rs)):
        assert [r.to_dict() for r in got] == [r.to_dict() for r in want]
    # the per-block results are the oracle's (sum order: ring is checked above; here sequential)
    cmp_seq = cpd.compare_scalings(layers, MXFP8_E4M3, algorithm="sequential")
    for name, x in layers.items():
        want, _ = oracle_block_allreduce(x.tolist(), MXFP8_E4M3, "sequential")
        exact = x.double().sum(0)
        res = torch.tensor(want, dtype=torch.float64)
        l2 = float(torch.linalg.vector_norm(exact - res) / torch.linalg.vector_norm(exact))
        assert cmp_seq["aps per block"][name].rel_l2_error == pytest.approx(l2, rel=1e-12)
    # per block never underflows more than per layer, and wins on the wide layer
    for name in layers:
        assert cmp["aps per block"][name].underflow_frac <= cmp["aps per layer"][name].underflow_frac
    assert cmp["aps per block"]["conv"].rel_l2_error < cmp["aps per layer"]["conv"].rel_l2_error
    text = str(cmp)
    assert text.count("aps per block") == 3 and "loss scaling" in text  # one row per layer
    assert set(cmp.to_dict()["reports"]) == set(cmp.methods)
    pytest.importorskip("matplotlib")
    cmp.plot(tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 0


def test_compare_scalings_errors():
    with pytest.raises(TypeError, match="BlockFormat"):
        cpd.compare_scalings(_layers(), cpd.E4M3FN)
    with pytest.raises(TypeError, match="loss_scale_exp"):
        cpd.compare_scalings(_layers(), MXFP4, loss_scale_exp=1.5)
    with pytest.raises(ValueError, match="power-of-two block scales"):
        cpd.compare_scalings(_layers(), NVFP4)


def test_aps_optimizer_emulated_block_format():
    """APSOptimizer(fmt=BlockFormat): the step applies the oracle's block-scaled sum / W."""
    torch.manual_seed(0)
    m = torch.nn.Linear(5, 3)
    w = 4
    before = [p.detach().clone() for p in m.parameters()]
    opt = cpd.APSOptimizer(torch.optim.SGD(m.parameters(), lr=1.0), fmt=MXFP8_E5M2, workers=w,
                           algorithm="sequential", model=m)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(16, 5, generator=g), torch.randint(0, 3, (16,), generator=g)
    grads = {"weight": [], "bias": []}
    ref = torch.nn.Linear(5, 3)
    opt.zero_grad()
    for wx, wy in opt.split(x, y):
        torch.nn.functional.cross_entropy(m(wx), wy).backward()
        with torch.no_grad():
            for p, q in zip(ref.parameters(), before):
                p.copy_(q)
        ref.zero_grad()
        torch.nn.functional.cross_entropy(ref(wx), wy).backward()
        grads["weight"].append(ref.weight.grad.flatten().tolist())
        grads["bias"].append(ref.bias.grad.tolist())
        opt.collect()
    opt.step()
    assert opt.last_report.method.startswith("aps per block")
    for (name, p), p0 in zip(m.named_parameters(), before):
        s, _ = oracle_block_allreduce(grads[name], MXFP8_E5M2, "sequential")
        want = (p0.flatten() - torch.tensor(s, dtype=torch.float32) * 0.25).reshape(p.shape)
        assert torch.equal(p.detach(), want), name
    with pytest.raises(ValueError, match="scaling must be 'aps'"):
        cpd.APSOptimizer(torch.optim.SGD(m.parameters(), lr=1.0), fmt=MXFP8_E5M2, scaling="loss")


def test_block_stochastic_rounding_reproducible_and_composed():
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(4))
    run = lambda seed: cpd.allreduce(x, MXFP4, rounding="stochastic",  # noqa: E731
                                     generator=torch.Generator().manual_seed(seed))
    a = run(5)
    assert torch.equal(a, run(5)) and not torch.equal(a, run(6))
    s, _ = cpd.blockreduce.block_exponents(x, MXFP4, 4)
    f = cpd.blockreduce.block_factors(s, 50, 32)
    g = torch.Generator().manual_seed(5)
    low = cpd.cast((x.double() * f).float(), cpd.E2M1, "stochastic", generator=g)
    ref = cpd.allreduce(low, cpd.E2M1, rounding="stochastic", generator=g, inputs_in_fmt=True)
    assert torch.equal(a, (ref.double() / f).float())
    assert cpd.allreduce(torch.zeros(3, 0), MXFP4).shape == (0,)


def test_ddp_hook_refuses_block_format_naming_the_emulated_path():
    from cpd.distributed import APSHookState

    with pytest.raises(ValueError, match=r"emulated path only \(cpd.allreduce, cpd.aps_allreduce\)"):
        APSHookState(cpd.mx.MXFP8_E4M3)
