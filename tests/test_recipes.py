"""Scaling recipes (cpd.nn.recipes) in QuantLinear, convert and emulate.

Invariants defended: the scale is fmt.max / amax / 2^margin (rounded down to a power of two when
asked; 1 for an all-zero operand), delayed scaling uses the largest amax of the previous calls
(so a jump overflows once and is then absorbed), rowwise scales rows along the reduction dim;
a scaled layer computes round(x sx) round(W sw)^T / (sx sw) with the counts of overflow and
underflow reported per layer; the block recipe fake-quantizes both operands with cpd.mx along k
(or leaves it to a block-scaled tensor core) and counts saturated and flushed elements; gradient
recipes scale and round the output gradient of both backward GEMMs and divide their results;
bad recipes raise clear errors.
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
    with pytest.raises(ValueError, match="per block"):
        ScalingRecipe("block").scale_from_amax(torch.tensor(1.0))
    with pytest.raises(ValueError, match="block"):
        ScalingRecipe("block", fmt="e9m9")
    with pytest.raises(ValueError, match="rowwise"):
        QuantLinear(2, 2, grad_scaling="rowwise")
    with pytest.raises(TypeError, match="grad_scaling"):
        QuantLinear(2, 2, grad_scaling=1.0)
    with pytest.raises(ValueError, match="allowed"):
        ScalingRecipe("amax")
    with pytest.raises(ValueError, match="history"):
        ScalingRecipe("delayed", history=0)
    with pytest.raises(ValueError, match="per-call-site"):
        emulate(acc=cpd.FP32, scaling="delayed")
    with pytest.raises(TypeError, match="scaling"):
        QuantLinear(2, 2, scaling=3)


def _mx(fmt, axis):
    import dataclasses

    return dataclasses.replace(cpd.mx.PRESETS[fmt] if isinstance(fmt, str) else fmt, axis=axis)


def test_block_recipe_fake_quantizes_along_k():
    torch.manual_seed(3)
    lin = QuantLinear(64, 8, scaling="block")  # default element E4M3: MXFP8-E4M3 blocks of 32
    assert lin.scaling.fmt == cpd.mx.MXFP8_E4M3
    x = torch.randn(5, 64)
    y = lin(x)
    want = cpd.mx.cast(x, cpd.mx.MXFP8_E4M3) @ cpd.mx.cast(lin.weight.detach(), cpd.mx.MXFP8_E4M3).t() + lin.bias
    assert torch.equal(y, want)
    st = lin.scale_activation.stats()
    s = cpd.mx.scales(x, cpd.mx.MXFP8_E4M3)
    assert st["recipe"] == "block" and st["scale"] == (s.min().item(), s.max().item())
    assert "block" in scaling_report(torch.nn.Sequential(lin))


def test_block_recipe_counts_saturation_and_flushes():
    s = Scaler(ScalingRecipe("block", fmt="mxfp8_e4m3"))
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2] = 480.0, 1e-6, 1.0  # scale 2^0 (floor rule): 480 saturates to 448, 1e-6 flushes
    q, one = s(x)
    assert one.item() == 1.0 and q[0, 0].item() == 448.0 and q[0, 1].item() == 0.0
    assert s.overflow == 1 and s.underflow == 1 and s.elements == 32


def test_block_recipe_leaves_quantization_to_a_block_scaled_gemm():
    torch.manual_seed(4)
    acc = cpd.tensor_core("blackwell", a="mxfp8_e4m3")
    lin = QuantLinear(64, 4, acc=acc, scaling="block")
    x = torch.randn(3, 64)
    y = lin(x)
    want = cpd.add(cpd.matmul(x, lin.weight.detach().t(), acc=acc), lin.bias, cpd.FP32)
    assert torch.equal(y, want)
    assert lin.scale_weight.stats()["scale"] is not None


def test_grad_scaling_tensorwise_e5m2():
    """TransformerEngine-style E5M2 gradients: g s rounded to E5M2, both backward GEMMs on it, / s."""
    torch.manual_seed(5)
    lin = QuantLinear(16, 8, bias=False, grad_scaling="tensorwise")
    x = (torch.randn(4, 16) * 1e-2).requires_grad_()
    g = torch.randn(4, 8) * 1e-6  # tiny gradients: E5M2 alone would flush many
    lin(x).backward(g)
    s = ScalingRecipe("tensorwise", fmt=cpd.E5M2).scale_from_amax(g.abs().amax())
    q = cpd.cast(g * s, cpd.E5M2, saturate=True)
    assert torch.equal(x.grad, (q @ lin.weight.detach()) / s)
    assert torch.equal(lin.weight.grad, ((x.detach().t() @ q) / s).t())  # the GEMM as the layer runs it
    st = lin.scale_grad.stats()
    assert st["scale"] == s.item() and st["recipe"] == "tensorwise"
    assert "scale_grad" in scaling_report(torch.nn.Sequential(lin))


def test_grad_scaling_block_rowwise_and_columnwise_copies():
    torch.manual_seed(6)
    lin = QuantLinear(32, 32, bias=False, grad_scaling="block")
    x = torch.randn(32, 32, requires_grad=True)
    g = torch.randn(32, 32)
    lin(x).backward(g)
    g_row, g_col = cpd.mx.cast(g, _mx("mxfp8_e5m2", -1)), cpd.mx.cast(g, _mx("mxfp8_e5m2", -2))
    assert torch.equal(x.grad, g_row @ lin.weight.detach())
    assert torch.equal(lin.weight.grad, (x.detach().t() @ g_col).t())


def test_convert_and_emulate_block():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(32, 4))
    q = convert(model, scaling="block", grad_scaling="delayed")
    assert q[0].scaling.kind == "block" and q[0].grad_scaling.kind == "delayed"
    a, b = torch.randn(3, 32), torch.randn(32, 2)
    with emulate(acc=cpd.FP32, scaling="block"):
        y = a @ b
    want = cpd.matmul(cpd.mx.cast(a, _mx("mxfp8_e4m3", -1)), cpd.mx.cast(b, _mx("mxfp8_e4m3", -2)), acc=cpd.FP32)
    assert torch.equal(y, want)
