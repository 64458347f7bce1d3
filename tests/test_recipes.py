"""Scaling recipes (cpd.nn.recipes) in QuantLinear, convert and emulate.

Invariants defended: the scale is fmt.max / amax / 2^margin (rounded down to a power of two when
asked; 1 for an all-zero operand), delayed scaling uses the largest amax of the previous calls
(so a jump overflows once and is then absorbed), rowwise scales rows along the reduction dim;
a scaled layer computes round(x sx) round(W sw)^T / (sx sw) with the counts of overflow and
underflow reported per layer; bad recipes raise clear errors.
"""

import pytest
import torch

import cpd
from cpd.nn import QuantLinear, ScalingRecipe, Scaler, convert, emulate, scaling_report


def test_scale_formula():
    r = ScalingRecipe("tensorwise", fmt=cpd.E4M3FN, margin=1, power_of_two=False)
    assert r.scale_from_amax(torch.tensor(7.0)).item() == pytest.approx(448 / 7 / 2)
    p = ScalingRecipe("tensorwise", fmt=cpd.E4M3FN)
    assert p.scale_from_amax(torch.tensor(7.0)).item() == 64.0  # 448/7 = 64 exactly
    assert p.scale_from_amax(torch.tensor(8.0)).item() == 32.0  # 56 -> 32
    assert p.scale_from_amax(torch.tensor(0.0)).item() == 1.0


def test_delayed_uses_history():
    s = Scaler(ScalingRecipe("delayed", history=2))
    _, s1 = s(torch.tensor([1.0, -2.0]))
    assert s1.item() == 128.0  # first call: current amax 2 -> 224 -> 128
    _, s2 = s(torch.tensor([8.0]))  # scale from the history (amax 2): 8 * 128 overflows 448
    assert s2.item() == 128.0 and s.overflow == 1
    _, s3 = s(torch.tensor([1.0]))  # history now holds 8: 56 -> 32
    assert s3.item() == 32.0
    s(torch.tensor([1.0]))
    _, s5 = s(torch.tensor([1.0]))  # the 8 has left the 2-long history
    assert s5.item() == 256.0


def test_rowwise_scales_rows():
    s = Scaler(ScalingRecipe("rowwise"))
    xs, sc = s(torch.tensor([[1.0, 2.0], [0.01, 0.0]]))
    assert sc.shape == (2, 1) and sc[0].item() == 128.0 and sc[1].item() == 32768.0


@pytest.mark.parametrize("kind", ["tensorwise", "delayed", "rowwise"])
def test_scaled_linear_computes_scaled_gemm(kind):
    torch.manual_seed(0)
    acc = cpd.tensor_core("hopper", a="e4m3")
    lin = QuantLinear(16, 8, acc=acc, scaling=kind)
    x = torch.randn(5, 16) * 1e-3  # small: unscaled it would mostly underflow E4M3
    y = lin(x)
    sx, sw = lin.scale_activation.last_scale, lin.scale_weight.last_scale
    want = cpd.matmul(x * sx, (lin.weight * sw).t(), acc=acc) / sx / sw.reshape(-1)
    want = cpd.add(want, lin.bias, cpd.FP32)
    assert torch.equal(y, want)
    ref = x @ lin.weight.t() + lin.bias
    assert (y - ref).abs().max() < 0.02
    unscaled = QuantLinear(16, 8, acc=acc)
    unscaled.load_state_dict(lin.state_dict(), strict=False)
    assert (unscaled(x) - ref).abs().max() > (y - ref).abs().max()
    report = scaling_report(torch.nn.Sequential(lin))
    assert "scale_activation" in report and kind in report and "%" in report
    y.sum().backward()
    assert lin.weight.grad is not None


def test_convert_and_emulate_with_scaling():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    q = convert(model, acc=cpd.tensor_core("hopper", a="e4m3"), scaling="delayed")
    x = torch.randn(4, 8)
    for _ in range(3):
        q(x)
    assert q[0].scaling.kind == "delayed" and int(q[0].scale_activation.calls) == 3
    assert "delayed" in scaling_report(q)
    a, b = torch.randn(3, 8) * 1e-4, torch.randn(8, 2)
    acc = cpd.tensor_core("hopper", a="e4m3")
    with emulate(acc=acc, scaling="tensorwise"):
        y = a @ b
    sa = ScalingRecipe().scale_from_amax(a.abs().amax())
    sb = ScalingRecipe().scale_from_amax(b.abs().amax())
    assert torch.equal(y, cpd.matmul(a * sa, b * sb, acc=acc) / sa / sb)


def test_recipe_errors():
    with pytest.raises(ValueError, match="cpd.mx"):
        ScalingRecipe("block")
    with pytest.raises(ValueError, match="allowed"):
        ScalingRecipe("amax")
    with pytest.raises(ValueError, match="history"):
        ScalingRecipe("delayed", history=0)
    with pytest.raises(ValueError, match="per-call-site"):
        emulate(acc=cpd.FP32, scaling="delayed")
    with pytest.raises(TypeError, match="scaling"):
        QuantLinear(2, 2, scaling=3)
