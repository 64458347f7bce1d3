"""APS, loss scaling, the round-off report and the cost model behave as documented.

Invariants defended:
* APS picks s = fmt.emax - ceil(log2(max|g| * W)) - margin (exact, checked by hand), multiplies by
  2**s before the cast and divides after; the W-worker sum never overflows; the result equals
  the documented pipeline (scale, cast, cpd.allreduce in fmt, unscale) bit for bit;
* edge cases from the docstring: all-zero layer stays zero (no NaN), inf/NaN layers are flagged
  and warned about, never hidden; None gradients are skipped; a single worker works; fp32 layers
  and the hybrid schedule reduce in float32;
* APS never does worse than no scaling on a layer whose gradients would underflow (measured);
* LossScaler follows GradScaler's dynamic contract (backoff and skip on inf, growth after
  growth_interval clean steps), static mode never changes the scale;
* the report's Eq. 5 error, underflow fraction and overflow count match hand computations; the
  table, to_dict() and plot() work;
* the cost model's formulas give the documented step counts and times.
"""

from __future__ import annotations

import math

import pytest
import torch

import cpd

E5M2 = cpd.FloatFormat(5, 2)


def workers(w, n, scale, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) * scale for _ in range(w)]


# ------------------------------------------------------------------------------- APS exponent
def test_aps_exponent_by_hand():
    x = torch.tensor([[0.75, -0.1], [0.2, 0.3]])  # max 0.75, W = 2: 1.5 -> ceil(log2) = 1
    assert cpd.aps_exponent(x, E5M2, 2) == 15 - 1
    x = torch.tensor([[1.0], [-0.5]])  # 1.0 * 4 = 4 exactly: ceil(log2 4) = 2
    assert cpd.aps_exponent(x, E5M2, 4) == 13
    assert cpd.aps_exponent(x, E5M2, 4, margin=2) == 11
    assert cpd.aps_exponent(x, cpd.E4M3FN, 4) == 8 - 2  # fn: emax 8 (448 = 1.75 * 2^8)
    assert cpd.aps_exponent(torch.zeros(3, 2), E5M2, 3) is None
    tiny = torch.full((2, 1), 2.0 ** -140)
    assert cpd.aps_exponent(tiny, E5M2, 2) == 15 + 139


@pytest.mark.parametrize("algorithm, k", [("ring", None), ("hierarchical", 4), ("tree", None), ("sequential", None)])
def test_aps_is_the_documented_pipeline(algorithm, k):
    xs = workers(8, 37, 1e-3, 1)
    out, rep = cpd.aps_allreduce({"w": xs}, E5M2, algorithm=algorithm, group_size=k, kahan=True)
    s = cpd.aps_exponent(torch.stack(xs), E5M2, 8)
    low = cpd.cast(torch.stack(xs) * 2.0 ** s, E5M2)
    want = cpd.allreduce(low, E5M2, algorithm=algorithm, group_size=k, kahan=True, inputs_in_fmt=True) / 2.0 ** s
    assert torch.equal(out["w"], want)
    assert rep["w"].scale_exp == s and rep["w"].status == "lowp"
    assert rep["w"].overflow_count == 0 and torch.isfinite(out["w"]).all()


def test_aps_never_overflows_worst_case():
    w = 16
    xs = [torch.full((5,), 3.0e4) for _ in range(w)]  # all the same sign: the sum hits the bound
    out, rep = cpd.aps_allreduce({"w": xs}, E5M2)
    assert torch.isfinite(out["w"]).all() and rep["w"].overflow_count == 0
    unscaled, rep0 = cpd.scaled_allreduce({"w": xs}, E5M2)
    assert not torch.isfinite(unscaled["w"]).all() and rep0.found_inf


def test_edge_cases_zero_none_single_worker():
    layers = {"zero": [torch.zeros(4)] * 3, "none": None, "all_none": [None] * 3,
              "partial": [torch.ones(2), None, torch.ones(2)]}
    out, rep = cpd.aps_allreduce(layers, E5M2)
    assert torch.equal(out["zero"], torch.zeros(4)) and rep["zero"].status == "zero"
    assert out["none"] is None and out["all_none"] is None and rep["none"].status == "skipped"
    assert out["partial"].tolist() == [2.0, 2.0]  # a None worker counts as zeros
    one, rep1 = cpd.aps_allreduce({"a": [torch.tensor([0.3, -5.0])]}, E5M2)
    assert one["a"].tolist() == [0.3125, -5.0] and rep1.workers == 1


def test_inf_nan_layers_are_flagged_not_hidden():
    layers = {"bad": [torch.tensor([1.0, math.inf]), torch.tensor([math.nan, 1.0])], "ok": [torch.ones(2)] * 2}
    with pytest.warns(RuntimeWarning, match="bad"):
        out, rep = cpd.aps_allreduce(layers, E5M2)
    assert math.isnan(out["bad"][0]) and math.isinf(out["bad"][1])
    assert rep["bad"].status == "nonfinite" and rep["bad"].nonfinite_inputs == 2 and rep.found_inf
    assert out["ok"].tolist() == [2.0, 2.0] and rep["ok"].status == "lowp"


def test_fp32_layers_and_hybrid_schedule():
    layers = {"conv": workers(4, 9, 1.0, 2), "fc": workers(4, 9, 1.0, 3)}
    out, rep = cpd.aps_allreduce(layers, E5M2, fp32_layers=["fc"])
    assert rep["fc"].status == "fp32" and torch.equal(out["fc"], cpd.allreduce(layers["fc"], cpd.FP32))
    assert rep["conv"].status == "lowp"
    out, rep = cpd.aps_allreduce(layers, E5M2, step=3, fp32_steps=10)
    assert all(r.status == "fp32" for r in rep)
    _, rep = cpd.aps_allreduce(layers, E5M2, step=10, fp32_steps=10)
    assert all(r.status == "lowp" for r in rep)
    with pytest.raises(ValueError, match="nope"):
        cpd.aps_allreduce(layers, E5M2, fp32_layers=["nope"])


@pytest.mark.parametrize("fmt", [E5M2, cpd.FloatFormat(4, 3), cpd.FloatFormat(3, 0)], ids=lambda f: f.name)
def test_aps_beats_no_scaling_on_underflowing_layer(fmt):
    layers = {"small": workers(16, 2000, 1e-6, 4)}  # far below every one of these formats' ranges
    aps, rep_aps = cpd.aps_allreduce(layers, fmt)
    raw, rep_raw = cpd.scaled_allreduce(layers, fmt)
    assert rep_raw["small"].underflow_frac > 0.9
    assert rep_aps["small"].underflow_frac < rep_raw["small"].underflow_frac
    assert rep_aps["small"].rel_l2_error < rep_raw["small"].rel_l2_error
    # Not Eq. 5: an all-zero (fully underflowed) result scores exactly 100% there, while any
    # nonzero result on an element whose exact sum nearly cancels can score far above 100%.


def test_errors():
    with pytest.raises(TypeError, match="layers"):
        cpd.aps_allreduce([torch.ones(2)], E5M2)
    with pytest.raises(ValueError, match="shape"):
        cpd.aps_allreduce({"a": [torch.ones(2), torch.ones(3)]}, E5M2)
    with pytest.raises(ValueError, match="workers"):
        cpd.aps_allreduce({"a": [torch.ones(2)] * 2, "b": [torch.ones(2)] * 3}, E5M2)
    with pytest.raises(ValueError, match="group_size"):
        cpd.aps_allreduce({"a": [torch.ones(2)] * 6}, E5M2, algorithm="hierarchical", group_size=4)
    with pytest.raises(TypeError, match="margin"):
        cpd.aps_allreduce({"a": [torch.ones(2)] * 2}, E5M2, margin=1.5)


def test_inputs_not_mutated():
    xs = workers(4, 10, 1e-4, 5)
    copies = [x.clone() for x in xs]
    cpd.aps_allreduce({"a": xs}, E5M2, rounding="stochastic")
    assert all(torch.equal(a, b) for a, b in zip(xs, copies))


def test_stochastic_aps_reproducible():
    layers = {"a": workers(4, 100, 1e-3, 6)}
    a, _ = cpd.aps_allreduce(layers, E5M2, rounding="stochastic", generator=torch.Generator().manual_seed(1))
    b, _ = cpd.aps_allreduce(layers, E5M2, rounding="stochastic", generator=torch.Generator().manual_seed(1))
    assert torch.equal(a["a"], b["a"])


# ------------------------------------------------------------------------------- loss scaling
def test_loss_scaler_dynamic_contract():
    s = cpd.LossScaler(init_scale=2.0 ** 10, growth_interval=2)
    ok = {"a": [torch.full((3,), 1.0)] * 4}
    out, rep = s.allreduce(ok, E5M2)
    assert out["a"].tolist() == [4.0] * 3 and s.found_inf is False
    assert s.update() is True and s.scale == 2.0 ** 10 and s.growth_tracker == 1
    s.allreduce(ok, E5M2)
    assert s.update() is True and s.scale == 2.0 ** 11 and s.growth_tracker == 0
    big = {"a": [torch.full((3,), 100.0)] * 4}  # 100 * 2^11 > 57344: overflow -> inf
    _, rep = s.allreduce(big, E5M2)
    assert rep.found_inf and s.update() is False and s.scale == 2.0 ** 10 and s.growth_tracker == 0
    nan = {"a": [torch.tensor([math.nan])]}
    s.allreduce(nan, E5M2)
    assert s.update() is False and s.scale == 2.0 ** 9


def test_loss_scaler_static_and_validation():
    s = cpd.LossScaler(init_scale=4, dynamic=False)
    s.allreduce({"a": [torch.full((1,), 3e4)] * 4}, E5M2)
    assert s.update() is False and s.scale == 4
    assert s.update(found_inf=False) is True and s.scale == 4
    for kw in (dict(init_scale=3), dict(init_scale=0), dict(growth_factor=1), dict(backoff_factor=2),
               dict(growth_interval=0)):
        with pytest.raises(ValueError):
            cpd.LossScaler(**kw)
    with pytest.raises(RuntimeError):
        cpd.LossScaler().update()
    st = s.state_dict()
    t = cpd.LossScaler()
    t.load_state_dict(st)
    assert t.scale == 4


def test_loss_scaling_is_exact_power_of_two_round_trip():
    xs = [cpd.cast(torch.randn(50), E5M2) for _ in range(1)]
    out, _ = cpd.LossScaler(init_scale=2.0 ** 5).allreduce({"a": xs}, E5M2)
    assert torch.equal(out["a"], xs[0])


# ------------------------------------------------------------------------------- report
def test_report_numbers_by_hand(tmp_path):
    xs = [torch.tensor([1.0, 0.3, 1e-9, 0.0]), torch.tensor([1.0, 0.0, 0.0, 0.0])]
    out, rep = cpd.scaled_allreduce({"a": xs}, E5M2)
    r = rep["a"]
    # exact sums 2, 0.3, 1e-9, 0; low precision 2, 0.3125, 0 (underflow), 0
    assert out["a"].tolist() == [2.0, 0.3125, 0.0, 0.0]
    assert r.zero_sum_count == 1
    rel = [0.0, abs(0.3 - 0.3125) / 0.3, 1.0]
    assert r.mean_rel_error == pytest.approx(sum(rel) / 3, rel=1e-6)
    assert r.max_rel_error == pytest.approx(1.0)
    assert r.underflow_frac == pytest.approx(1 / 4)  # 4 nonzero inputs, 1e-9 became 0
    d = rep.to_dict()
    assert d["layers"]["a"]["zero_sum_count"] == 1 and d["fmt"] == "e5m2"
    text = str(rep)
    assert "eq5_mean_rel" in text and "underflow" in text and len({len(ln) for ln in text.splitlines()[1:]}) == 1
    pytest.importorskip("matplotlib")
    rep.plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_report_exponent_histogram(dtype):
    """LayerReport.exp_hist counts floor(log2|g|) of the nonzero finite inputs: against Python's
    math.frexp per value (floats are exact there), on every float32 binade, subnormals, powers of
    two and their neighbours below, with zeros, inf and NaN left out."""
    import collections
    import math

    from cpd.report import layer_stats

    g = torch.Generator().manual_seed(5)
    e = torch.randint(-149, 128, (5000,), generator=g).double()
    v = (torch.rand(5000, generator=g, dtype=torch.float64) + 1.0) * 2.0 ** e
    v = torch.where(torch.rand(5000, generator=g) < 0.5, -v, v).to(torch.float32)
    edges = torch.tensor([2.0 ** k for k in range(-149, 128)], dtype=torch.float32)
    below = torch.nextafter(edges, torch.zeros_like(edges))  # the largest float32 under 2^k
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -3.4e38])
    x = torch.cat([v, edges, -below, special]).to(dtype)
    want = collections.Counter(math.frexp(float(t))[1] - 1 for t in x.tolist() if t != 0 and math.isfinite(t))
    rep = layer_stats("a", "lowp", x.reshape(1, -1), x, None)
    assert rep.exp_hist == dict(want)
    assert layer_stats("z", "zero", torch.zeros(2, 3, dtype=dtype), torch.zeros(3), None).exp_hist == {}


# ------------------------------------------------------------------------------- cost model
def test_cost_model_formulas():
    a, b = 5e-6, 1 / 12.5e9
    r = cpd.cost_model(n_bytes=25e6, workers=256, algorithm="ring", alpha=a, beta=b)
    assert r.steps == 510 and r.time == pytest.approx(510 * a + 2 * 255 / 256 * 25e6 * b)
    h = cpd.cost_model(n_bytes=25e6, workers=256, algorithm="hierarchical", group_size=16, fmt=cpd.E5M2, alpha=a,
                       beta=b)
    n = 25e6 / 4
    assert h.steps == 4 * 15 + 2 * 15 and h.message_bytes == n
    assert h.time == pytest.approx(90 * a + (4 * 15 / 16 + 2 * 15 / 16) * n * b)
    t = cpd.cost_model(1000, 6, "tree", alpha=a, beta=b)
    assert t.steps == 6 and t.time == pytest.approx(6 * (a + 1000 * b))
    rd = cpd.cost_model(1000, 8, "recursive_doubling", alpha=a, beta=b, gamma=1e-10)
    assert rd.steps == 3 and rd.time == pytest.approx(3 * (a + 1000 * b + 1000 * 1e-10))
    aps = cpd.cost_model(1000, 8, "ring", alpha=a, beta=b, aps_layers=10)
    assert aps.aps_time == pytest.approx(14 * a + 14 / 8 * 10 * b) and aps.time > cpd.cost_model(1000, 8).time
    assert cpd.cost_model(1000, 1).time == 0
    with pytest.raises(ValueError, match="group_size"):
        cpd.cost_model(1000, 8, "hierarchical", group_size=3)
    with pytest.raises(ValueError, match="butterfly"):
        cpd.cost_model(1000, 8, "butterfly")


# ------------------------------------------------------------------------------- the paper's Table 9
@pytest.mark.parametrize("seed", [0, 1])
def test_paper_group_size_finding(seed):
    """256 workers, (5, 2), APS: the ring has the largest Eq. 5 error; groups of 16 beat 4 and 64."""
    g = torch.Generator().manual_seed(seed)
    signal = torch.randn(1024, generator=g) * 0.5
    grads = torch.stack([(signal + torch.randn(1024, generator=g)) * 1e-3 for _ in range(256)])
    err = {}
    for alg, k in [("ring", None), ("hierarchical", 4), ("hierarchical", 16), ("hierarchical", 64)]:
        _, rep = cpd.aps_allreduce({"w": grads}, E5M2, algorithm=alg, group_size=k)
        err[k or 256] = rep["w"].mean_rel_error
    assert err[256] == max(err.values()), err
    assert err[16] < min(err[4], err[64]), err
