"""APSOptimizer: emulated data-parallel training with a low-precision gradient allreduce.

Invariants: with float32 communication the wrapper is plain full-batch training (up to float32
summation order), param groups keeping their own options; a step with inf/NaN gradients changes
nothing; state_dict round-trips; LR schedulers drive the inner optimizer; fp32_layers and
hybrid_steps show in the report; parameters without gradients get no per-worker copy.
"""

from __future__ import annotations

import copy

import pytest
import torch

import cpd

B, W = 64, 8


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _data(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 6, generator=g), torch.randint(0, 3, (B,), generator=g)


def _aps_step(opt, model, x, y):
    opt.zero_grad()
    for wx, wy in opt.split(x, y):
        torch.nn.functional.cross_entropy(model(wx), wy).backward()
        opt.collect()
    return opt.step()


@pytest.mark.parametrize("algorithm,group_size", [("ring", None), ("hierarchical", 4), ("tree", None)])
def test_fp32_communication_equals_full_batch_training(algorithm, group_size):
    """W equal worker batches of b = B/W: worker w's gradient is (1/b) sum_{i in w} g_i, and
    (1/W) sum_w of it is (1/B) sum_i g_i, the full-batch gradient of the mean loss, exactly in real
    arithmetic (1/W is a power of two, so the division is exact). What differs is only the order
    of float32 additions: the backward sums b samples per worker then W workers, instead of B
    samples at once. Any order of a float32 sum of B terms is within (B-1) u sum|t_i|
    (u = 2**-24) of the exact sum, so the two gradients differ by at most 2 (B-1) u sum_i |g_i| / B
    <= 2 B u max|g| elementwise. Over K SGD steps (lr, no feedback amplification at this tiny size
    beyond a small factor) the weights differ by O(K lr B u max|g|) ~ 5 * 0.1 * 64 * 6e-8 ~ 2e-6;
    we assert 2e-6 (observed: 3e-8, one float32 ulp of the weights, on 3 of the 4 tensors)."""
    m1, m2 = _model(), _model()
    o1 = torch.optim.SGD(m1.parameters(), lr=0.1, momentum=0.9)
    o2 = cpd.APSOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9), fmt=cpd.FP32, workers=W,
                          algorithm=algorithm, group_size=group_size, model=m2)
    x, y = _data()
    for _ in range(5):
        o1.zero_grad()
        torch.nn.functional.cross_entropy(m1(x), y).backward()
        o1.step()
        _aps_step(o2, m2, x, y)
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        d = (a - b).abs().max().item()
        assert d <= 2e-6, (n, d)
    assert o2.steps == 5 and o2.skipped_steps == 0
    assert all(r.status == "lowp" for r in o2.last_report)  # fp32 is the communication format here
    assert o2.last_report.fmt == cpd.FP32


def test_closure_gives_same_result_as_collect():
    x, y = _data()
    m1, m2 = _model(), _model()
    o1 = cpd.APSOptimizer(torch.optim.SGD(m1.parameters(), lr=0.1), fmt=cpd.E5M2, workers=W)
    o2 = cpd.APSOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1), fmt=cpd.E5M2, workers=W)
    _aps_step(o1, m1, x, y)
    xs, ys = torch.tensor_split(x, W), torch.tensor_split(y, W)

    def closure(w):
        loss = torch.nn.functional.cross_entropy(m2(xs[w]), ys[w])
        loss.backward()
        return loss

    o2.zero_grad()
    loss = o2.step(closure)
    assert loss is not None and torch.isfinite(loss)
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
@pytest.mark.parametrize("scaling", ["aps", "loss", None])
def test_nonfinite_gradient_skips_step(bad, scaling):
    m = _model()
    opt = cpd.APSOptimizer(torch.optim.Adam(m.parameters(), lr=0.01), fmt=cpd.E4M3, workers=W, scaling=scaling,
                           model=m, loss_scaler=cpd.LossScaler(1.0) if scaling == "loss" else None)
    x, y = _data()
    _aps_step(opt, m, x, y)  # populate Adam's state
    before = copy.deepcopy(m.state_dict())
    state = copy.deepcopy(opt.state_dict())
    scale = opt.loss_scaler.scale if scaling == "loss" else None
    opt.zero_grad()
    for w, (wx, wy) in enumerate(opt.split(x, y)):
        torch.nn.functional.cross_entropy(m(wx), wy).backward()
        if w == 3:
            m[0].weight.grad[1, 2] = bad
        opt.collect()
    assert opt.step() is None
    assert opt.skipped_steps == 1 and opt.steps == 2
    assert opt.last_report.found_inf and opt.last_report["0.weight"].status == "nonfinite"
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    after = opt.state_dict()
    for i, s in state["state"].items():
        for k, v in s.items():
            assert torch.equal(after["state"][i][k], v), (i, k)
    if scaling == "loss":
        assert opt.loss_scaler.scale == scale / 2
    _aps_step(opt, m, x, y)  # training continues
    assert opt.skipped_steps == 1 and all(torch.isfinite(p).all() for p in m.parameters())


def test_state_dict_round_trip_mid_training():
    x, y = _data()
    m1 = _model()
    o1 = cpd.APSOptimizer(torch.optim.SGD(m1.parameters(), lr=0.1, momentum=0.9), fmt=cpd.E4M3, workers=W,
                          scaling="loss", loss_scaler=cpd.LossScaler(2.0**10, growth_interval=2), hybrid_steps=3)
    for _ in range(2):
        _aps_step(o1, m1, x, y)
    m2 = copy.deepcopy(m1)
    o2 = cpd.APSOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9), fmt=cpd.E4M3, workers=W,
                          scaling="loss", loss_scaler=cpd.LossScaler(2.0**3, growth_interval=2), hybrid_steps=3)
    o2.load_state_dict(copy.deepcopy(o1.state_dict()))
    assert o2.steps == 2 and o2.loss_scaler.scale == o1.loss_scaler.scale
    for _ in range(3):  # crosses the hybrid boundary and a loss-scale growth
        _aps_step(o1, m1, x, y)
        _aps_step(o2, m2, x, y)
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    assert o1.loss_scaler.scale == o2.loss_scaler.scale and o1.skipped_steps == o2.skipped_steps


def test_lr_scheduler_and_param_groups():
    m = _model()
    opt = cpd.APSOptimizer(torch.optim.SGD(m.parameters(), lr=0.4), fmt=cpd.E5M2, workers=4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = _data()
    lrs = []
    for _ in range(3):
        _aps_step(opt, m, x, y)
        sched.step()
        lrs.append(opt.opt.param_groups[0]["lr"])
    assert lrs == [0.2, 0.1, 0.05]
    assert opt.param_groups is opt.opt.param_groups and opt.state is opt.opt.state


def test_param_groups_keep_their_own_options():
    """Two groups with different learning rates and momentum: with fp32 communication the wrapper
    steps them like the plain optimizer (within the full-batch bound above)."""
    def groups(m):
        return [{"params": m[0].parameters(), "lr": 0.02, "momentum": 0.5}, {"params": m[2].parameters()}]

    m1, m2 = _model(), _model()
    o1 = torch.optim.SGD(groups(m1), lr=0.1, momentum=0.9)
    o2 = cpd.APSOptimizer(torch.optim.SGD(groups(m2), lr=0.1, momentum=0.9), fmt=cpd.FP32, workers=W, model=m2)
    x, y = _data()
    for _ in range(3):
        o1.zero_grad()
        torch.nn.functional.cross_entropy(m1(x), y).backward()
        o1.step()
        _aps_step(o2, m2, x, y)
    assert [g["lr"] for g in o2.param_groups] == [0.02, 0.1] and o2.param_groups[0]["momentum"] == 0.5
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert (a - b).abs().max().item() <= 2e-6
    moved = [(a - b).abs().max().item() for a, b in zip(m1.parameters(), _model().parameters())]
    assert min(moved) > 1e-4  # both groups did train


def test_frozen_parameter_is_not_copied_or_communicated():
    """A parameter without a gradient gets no per-worker copy, is reported as skipped, keeps its
    value and ends the step with grad None; the copies are dropped after the step."""
    m = _model()
    m[0].weight.requires_grad_(False)
    frozen = m[0].weight.clone()
    opt = cpd.APSOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), fmt=cpd.E4M3, workers=W, model=m)
    x, y = _data()
    opt.zero_grad()
    for wx, wy in opt.split(x, y):
        torch.nn.functional.cross_entropy(m(wx), wy).backward()
        opt.collect()
    assert all(g is None for g in opt._grads[m[0].weight]) and all(g is not None for g in opt._grads[m[0].bias])
    opt.step()
    assert opt.last_report["0.weight"].status == "skipped" and opt.last_report["0.bias"].status == "lowp"
    assert torch.equal(m[0].weight, frozen) and m[0].weight.grad is None and not opt._grads


def test_fp32_layers_and_hybrid_steps_show_in_report():
    m = _model()
    opt = cpd.APSOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), fmt=cpd.FloatFormat(3, 0), workers=W,
                           model=m, fp32_layers=["2"], hybrid_steps=2)
    x, y = _data()
    statuses = []
    for _ in range(3):
        _aps_step(opt, m, x, y)
        statuses.append({r.name: r.status for r in opt.last_report})
    assert statuses[0] == statuses[1] == {n: "fp32" for n, _ in m.named_parameters()}
    assert statuses[2] == {"0.weight": "lowp", "0.bias": "lowp", "2.weight": "fp32", "2.bias": "fp32"}
    # Without a model, names are "<group>.<index>".
    opt = cpd.APSOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), fmt=cpd.E5M2, workers=W, fp32_layers="0.3")
    _aps_step(opt, m, x, y)
    assert {r.name: r.status for r in opt.last_report}["0.3"] == "fp32"


def test_unscaled_e3m0_loses_small_gradients_aps_does_not():
    m = _model()
    x, y = _data()
    reps = {}
    for scaling in ("aps", None):
        mm = copy.deepcopy(m)
        opt = cpd.APSOptimizer(torch.optim.SGD(mm.parameters(), lr=0.1), fmt=cpd.FloatFormat(3, 0),
                               workers=W, scaling=scaling)
        _aps_step(opt, mm, x, y)
        reps[scaling] = opt.last_report
    assert reps[None]["0.0"].underflow_frac > 0.5 > reps["aps"]["0.0"].underflow_frac


def test_bad_arguments():
    m = _model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(TypeError):
        cpd.APSOptimizer(object(), fmt=cpd.E4M3)
    with pytest.raises(ValueError):
        cpd.APSOptimizer(sgd, fmt=cpd.E4M3, workers=0)
    with pytest.raises(ValueError):
        cpd.APSOptimizer(sgd, fmt=cpd.E4M3, algorithm="butterfly")
    with pytest.raises(ValueError):
        cpd.APSOptimizer(sgd, fmt=cpd.E4M3, algorithm="hierarchical", group_size=3)
    with pytest.raises(ValueError):
        cpd.APSOptimizer(sgd, fmt=cpd.E4M3, group_size=2)
    with pytest.raises(ValueError):
        cpd.APSOptimizer(sgd, fmt=cpd.E4M3, scaling="global")
    with pytest.raises(ValueError):
        cpd.APSOptimizer(sgd, fmt=cpd.E4M3, hybrid_steps=-1)
    with pytest.raises(ValueError):
        cpd.APSOptimizer(sgd, fmt=cpd.E4M3, model=m, fp32_layers=["fc"])
    with pytest.raises(ValueError):
        cpd.APSOptimizer(sgd, fmt=cpd.E4M3, loss_scaler=cpd.LossScaler())
    with pytest.raises((TypeError, ValueError)):
        cpd.APSOptimizer(sgd, fmt="e9m99")
    opt = cpd.APSOptimizer(sgd, fmt=cpd.E4M3, workers=W)
    x, y = _data()
    with pytest.raises(ValueError):
        list(opt.split(x[:4], y[:4]))
    with pytest.raises(RuntimeError):
        opt.step()  # nothing collected
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.collect()
    with pytest.raises(RuntimeError):
        opt.step()  # 1 of 8 workers


def test_config_margin_and_saturate_reach_the_reduction():
    """A config's margin lowers every layer's APS exponent by exactly that many binades (APS: s =
    emax - ceil(log2(W * amax)) - margin), and its saturate flag is the one the reduction uses."""
    x, y = _data()
    reps = {}
    for margin, saturate in ((0, False), (2, True)):
        m = _model()
        cfg = cpd.ReduceConfig(cpd.E5M2, workers=W, margin=margin, saturate=saturate)
        opt = cpd.APSOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), config=cfg)
        assert opt.config.margin == margin and opt.config.saturate is saturate
        _aps_step(opt, m, x, y)
        reps[margin] = {r.name: r.scale_exp for r in opt.last_report}
    assert reps[0].keys() == reps[2].keys() and len(reps[0]) == 4
    assert all(reps[2][n] == reps[0][n] - 2 for n in reps[0]), reps
