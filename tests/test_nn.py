"""Quantized layers compute exactly what their documented composition says: activations and
weights rounded, the GEMMs emulated by cpd.matmul (forward with mul/acc, both backward GEMMs with
backward_mul/backward_acc), the bias added in acc; with exact formats they are nn.Linear/Conv2d,
and their autograd is right (gradcheck in float64 on the exact reference path). convert() swaps
layers in a copy and leaves the original untouched."""

import pytest
import torch
import torch.nn.functional as F

import cpd
from cpd.nn import GemmConfig, QuantConv2d, QuantLinear, convert, quant_matmul


def bits_equal(a, b):
    return torch.equal(a.detach().contiguous().view(torch.int32), b.detach().contiguous().view(torch.int32))


def test_exact_linear_is_nn_linear():
    torch.manual_seed(0)
    q = QuantLinear(7, 5)
    x = torch.randn(4, 7)
    assert torch.allclose(q(x), F.linear(x, q.weight, q.bias), rtol=0, atol=1e-6)


def test_linear_forward_is_its_composition():
    torch.manual_seed(1)
    q = QuantLinear(9, 4, mul="e5m2", acc="fp16", weight="e4m3", activation="e4m3", grad="e5m2")
    x = torch.randn(3, 9)
    want = cpd.matmul(cpd.cast(x, "e4m3"), cpd.cast(q.weight.detach(), "e4m3").t(), mul="e5m2", acc="fp16")
    want = cpd.add(want, q.bias.detach(), "fp16")
    assert bits_equal(q(x), want)
    assert not x.requires_grad and torch.equal(x, x.clone())


def test_linear_backward_uses_backward_formats():
    torch.manual_seed(2)
    q = QuantLinear(6, 3, bias=False, mul="e5m2", acc="fp16", backward_mul=None, backward_acc="bf16", grad="e5m2")
    x = torch.randn(5, 6, requires_grad=True)
    g = torch.randn(5, 3)
    q(x).backward(g)
    w = q.weight.detach()
    gx = cpd.matmul(g, w, acc="bf16")  # grad @ (W^T)^T
    assert bits_equal(x.grad, cpd.cast(gx, "e5m2"))  # then the activation quantizer rounds it to grad
    assert bits_equal(q.weight.grad, cpd.matmul(x.detach().t(), g, acc="bf16").t())


@pytest.mark.parametrize("kw", [
    dict(stride=1, padding=0, dilation=1, groups=1),
    dict(stride=2, padding=1, dilation=1, groups=2),
    dict(stride=(1, 2), padding=(2, 1), dilation=(2, 1), groups=4),
    dict(stride=1, padding="same", dilation=2, groups=1),
    dict(stride=1, padding="valid", dilation=1, groups=1),
])
def test_exact_conv_is_conv2d(kw):
    torch.manual_seed(3)
    q = QuantConv2d(4, 8, (3, 2), **kw)
    x = torch.randn(2, 4, 9, 8)
    ref = F.conv2d(x, q.weight, q.bias, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    assert q(x).shape == ref.shape
    assert torch.allclose(q(x), ref, rtol=0, atol=2e-6)


def test_conv_accumulates_in_acc():
    """With acc=FP32 and exact products each dot product is a chain of correctly rounded float32
    FMAs: close to conv2d; with a narrow acc the result holds acc values and differs."""
    torch.manual_seed(4)
    q = QuantConv2d(3, 4, 3, padding=1, acc="fp32")
    x = torch.randn(1, 3, 6, 6)
    assert torch.allclose(q(x), F.conv2d(x, q.weight, q.bias, padding=1), atol=1e-5)
    q16 = QuantConv2d(3, 4, 3, padding=1, acc="e5m2")
    q16.load_state_dict(q.state_dict())
    y = q16(x)
    assert torch.equal(cpd.cast(y, "e5m2"), y)


def test_gradcheck_exact_reference_path():
    torch.manual_seed(5)
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: quant_matmul(a, b), (a, b))
    conv = QuantConv2d(2, 4, 3, stride=2, padding=1, groups=2, dtype=torch.float64)
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(conv, (x,))
    lin = QuantLinear(3, 2, dtype=torch.float64)
    assert torch.autograd.gradcheck(lin, (torch.randn(2, 3, dtype=torch.float64, requires_grad=True),))


def test_convert_copies_and_swaps():
    torch.manual_seed(6)
    m = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(3 * 4 * 4, 5), torch.nn.Linear(5, 2))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    q = convert(m, acc="bf16", weight="bf16", skip=("4",))
    assert isinstance(q[0], QuantConv2d) and isinstance(q[3], QuantLinear) and type(q[4]) is torch.nn.Linear
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert type(m[0]) is torch.nn.Conv2d
    x = torch.randn(2, 1, 6, 6)
    exact = convert(m)
    assert torch.allclose(exact(x), m(x), atol=1e-5)
    y = q(x)
    assert y.shape == (2, 2)


def test_errors():
    with pytest.raises(ValueError, match="mul must be None"):
        QuantLinear(2, 2, mul="e5m2", acc="fp16", fma=True)
    with pytest.raises(ValueError, match="padding_mode"):
        QuantConv2d(1, 1, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="block"):
        GemmConfig(acc="fp16", block=0)
    with pytest.raises(TypeError, match="model"):
        convert("not a model")
    with pytest.raises(ValueError, match="acc=.e9m9.*exp=9"):
        QuantLinear(2, 2, acc="e9m9")
    with pytest.raises(ValueError, match="input of shape"):
        QuantConv2d(1, 1, 1)(torch.randn(3, 3))
