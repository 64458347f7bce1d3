"""QuantizedOptimizer keeps the mixed-precision recipe's invariants: model weights are values of
the weight format, the float32 master copy carries the update, gradients and optimizer state are
rounded as configured, non-finite gradients never touch weights or state, and the wrapper works
with LR schedulers and state_dict round trips."""

import pytest
import torch

import cpd
from cpd.optim import QuantizedOptimizer


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(5, 3)


def _loss(m):
    torch.manual_seed(1)
    return m(torch.randn(16, 5)).pow(2).mean()


def test_master_copy_recipe():
    m = _model()
    w0 = m.weight.detach().clone()
    opt = QuantizedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01), weight="e4m3", grad="e5m2")
    assert torch.equal(m.weight.detach(), cpd.cast(w0, "e4m3"))
    _loss(m).backward()
    g = cpd.cast(m.weight.grad.clone(), "e5m2")
    opt.step()
    master = opt.masters[m.weight]
    assert torch.equal(master, w0 - 0.01 * g)  # the float32 master got the float32 update
    assert torch.equal(m.weight.detach(), cpd.cast(master, "e4m3"))


def test_in_place_update_in_acc():
    m = _model()
    opt = QuantizedOptimizer(torch.optim.SGD(m.parameters(), lr=0.5), weight="bf16", acc="e5m2", master=False)
    w = m.weight.detach().clone()
    _loss(m).backward()
    delta = (w - 0.5 * m.weight.grad) - w
    opt.step()
    assert torch.equal(m.weight.detach(), cpd.cast(cpd.add(w, delta, "e5m2"), "bf16"))


def test_momentum_state_rounded_and_scheduler():
    m = _model()
    opt = QuantizedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), momentum="e5m2")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        opt.zero_grad()
        _loss(m).backward()
        opt.step()
        sched.step()
    buf = opt.state[m.weight]["momentum_buffer"]
    assert torch.equal(buf, cpd.cast(buf, "e5m2"))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_gradients_skip_the_step(bad):
    m = _model()
    opt = QuantizedOptimizer(torch.optim.Adam(m.parameters(), lr=0.1), weight="bf16")
    _loss(m).backward()
    opt.step()
    snapshot = (m.weight.detach().clone(), opt.masters[m.weight].clone(),
                {k: v.clone() for k, v in opt.state[m.weight].items()})
    opt.zero_grad()
    _loss(m).backward()
    m.bias.grad[0] = bad
    assert opt.step() is None
    assert opt.skipped_steps == 1
    assert torch.equal(m.weight.detach(), snapshot[0]) and torch.equal(opt.masters[m.weight], snapshot[1])
    assert all(torch.equal(v, snapshot[2][k]) for k, v in opt.state[m.weight].items())


def test_state_dict_round_trip():
    m = _model()
    opt = QuantizedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), weight="e4m3")
    _loss(m).backward()
    opt.step()
    sd = opt.state_dict()
    m2 = _model()
    opt2 = QuantizedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9), weight="e4m3")
    opt2.load_state_dict(sd)
    assert torch.equal(opt2.masters[m2.weight], opt.masters[m.weight])
    assert torch.equal(opt2.state[m2.weight]["momentum_buffer"], opt.state[m.weight]["momentum_buffer"])


def test_errors():
    m = _model()
    with pytest.raises(TypeError, match="opt"):
        QuantizedOptimizer(m)
    with pytest.raises(ValueError, match="acc"):
        QuantizedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), acc="fp16")
    with pytest.raises(ValueError, match="weight"):
        QuantizedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), weight="e0m3")
