"""Whole-transformer emulation: the convolutions, attention, ``convert`` and ``emulate``.

Invariants defended:
* with exact configs the emulated layers compute what torch's do (values and gradients, to
  float32 rounding), for every stride/padding/dilation/groups/output_padding exercised;
* with a low-precision config, each layer's GEMM is exactly cpd.matmul on the im2col operands
  (Conv1d bit-identical to QuantConv2d on a height-1 image);
* ``emulate`` routes matmul/@/mm/bmm/baddbmm/addmm/F.linear/SDPA through cpd with the forward
  config and the backward config for the gradients, bit for bit, and leaves other calls alone;
* ``convert`` replaces Linear, Conv1d/2d/3d, ConvTranspose2d and MultiheadAttention, keeps the
  weights, and an exactly-configured converted transformer matches the original.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cpd
from cpd.nn import (QuantConv1d, QuantConv2d, QuantConv3d, QuantConvTranspose2d, QuantMultiheadAttention, convert,
                    emulate, scaled_dot_product_attention)

HOPPER = cpd.tensor_core("hopper", a="e4m3")


def _same(x, y):
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


@pytest.mark.parametrize("cfg", [dict(stride=1, padding=0), dict(stride=2, padding=1, dilation=2),
                                 dict(stride=1, padding="same", groups=2), dict(stride=3, padding="valid")])
def test_conv1d_exact_and_as_conv2d(cfg):
    torch.manual_seed(0)
    ref = torch.nn.Conv1d(4, 6, 3, **cfg)
    x = torch.randn(2, 4, 17, requires_grad=True)
    q = QuantConv1d(4, 6, 3, **cfg)
    q.load_state_dict(ref.state_dict())
    y, yr = q(x), ref(x)
    assert torch.allclose(y, yr, atol=1e-5)
    y.sum().backward()
    g = x.grad.clone()
    x.grad = None
    yr.sum().backward()
    assert torch.allclose(g, x.grad, atol=1e-5)
    # low precision: the same dot products as QuantConv2d on a (1, L) image
    kw = dict(mul=cpd.E5M2, acc=cpd.FP16)
    q1 = QuantConv1d(4, 6, 3, **cfg, **kw)
    q1.load_state_dict(ref.state_dict())
    pad = cfg.get("padding", 0)
    cfg2 = dict(cfg, padding=pad if isinstance(pad, str) else (0, pad), stride=(1, cfg.get("stride", 1)),
                dilation=(1, cfg.get("dilation", 1)))
    q2 = QuantConv2d(4, 6, (1, 3), **cfg2, **kw)
    q2.weight.data = ref.weight.data[:, :, None, :].clone()
    q2.bias.data = ref.bias.data.clone()
    with torch.no_grad():
        assert _same(q1(x), q2(x[:, :, None, :])[:, :, 0, :])


@pytest.mark.parametrize("cfg", [dict(stride=1, padding=1), dict(stride=(2, 1, 2), padding=(0, 1, 1), dilation=2)])
def test_conv3d_exact(cfg):
    torch.manual_seed(1)
    ref = torch.nn.Conv3d(3, 4, (2, 3, 3), **cfg)
    q = QuantConv3d(3, 4, (2, 3, 3), **cfg)
    q.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 6, 7, 8)
    assert torch.allclose(q(x), ref(x), atol=1e-5)
    qf = QuantConv3d(3, 4, (2, 3, 3), **cfg, acc=HOPPER)
    qf.load_state_dict(ref.state_dict())
    y = qf(x)
    assert y.shape == ref(x).shape and (y - ref(x)).abs().max() < 0.2


@pytest.mark.parametrize("cfg", [dict(stride=1, padding=0), dict(stride=2, padding=1, output_padding=1),
                                 dict(stride=2, padding=2, dilation=2, groups=2), dict(stride=3, padding=0)])
def test_conv_transpose2d_exact(cfg):
    torch.manual_seed(2)
    ref = torch.nn.ConvTranspose2d(4, 6, 3, **cfg)
    q = QuantConvTranspose2d(4, 6, 3, **cfg)
    q.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 5, 6, requires_grad=True)
    y, yr = q(x), ref(x)
    assert y.shape == yr.shape and torch.allclose(y, yr, atol=1e-5)
    (y * y).sum().backward()
    g = x.grad.clone()
    x.grad = None
    (yr * yr).sum().backward()
    assert torch.allclose(g, x.grad, atol=1e-4)


def test_emulate_routes_every_gemm_bit_for_bit():
    torch.manual_seed(3)
    a, b = torch.randn(3, 5, 16), torch.randn(3, 16, 4)
    w, bias = torch.randn(4, 16), torch.randn(4)
    want = cpd.matmul(a, b, acc=HOPPER)
    mode = emulate(acc=HOPPER)
    with mode:
        outs = [a @ b, torch.matmul(a, b), torch.bmm(a, b), a.bmm(b), a.matmul(b)]
        mm = torch.mm(a[0], b[0])
        bad = torch.baddbmm(torch.ones(3, 5, 4), a, b, beta=0.5, alpha=2.0)
        lin = F.linear(a, w)
        linb = F.linear(a, w, bias)
        ints = torch.ones(2, 2, dtype=torch.int64) @ torch.ones(2, 2, dtype=torch.int64)
    for y in outs:
        assert _same(y, want)
    assert _same(mm, want[0])
    assert torch.equal(bad, 2.0 * want + 0.5)
    lw = cpd.matmul(a, w.t(), acc=HOPPER)
    assert _same(lin, lw)
    assert _same(linb, cpd.add(lw, bias, cpd.FP32))
    assert torch.equal(ints, torch.full((2, 2), 2))
    assert mode.calls["matmul"] == 6 and mode.calls["addmm"] == 1 and mode.calls["linear"] == 2


def test_emulate_backward_uses_backward_config():
    torch.manual_seed(4)
    a = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(8, 3, requires_grad=True)
    g = torch.randn(4, 3)
    with emulate(mul=cpd.E4M3, acc=cpd.FP16, backward_mul=None, backward_acc=cpd.BF16):
        y = a @ b
    y.backward(g)
    assert _same(y.detach(), cpd.matmul(a.detach(), b.detach(), mul=cpd.E4M3, acc=cpd.FP16))
    assert _same(a.grad, cpd.matmul(g, b.detach().t(), acc=cpd.BF16))
    assert _same(b.grad, cpd.matmul(a.detach().t(), g, acc=cpd.BF16))


@pytest.mark.parametrize("kw", [dict(), dict(is_causal=True), dict(mask="bool"), dict(mask="float"),
                                dict(gqa=True)])
def test_sdpa_exact_matches_torch(kw):
    torch.manual_seed(5)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    args = {}
    if kw.get("is_causal"):
        k, v = k[:, :, :6], v[:, :, :6]
        args["is_causal"] = True
    if kw.get("mask") == "bool":
        args["attn_mask"] = torch.rand(6, 7) > 0.3
        args["attn_mask"][:, 0] = True
    if kw.get("mask") == "float":
        args["attn_mask"] = torch.randn(6, 7)
    if kw.get("gqa"):
        k, v = k[:, :2], v[:, :2]
        args["enable_gqa"] = True
    want = F.scaled_dot_product_attention(q, k, v, **args)
    assert torch.allclose(scaled_dot_product_attention(q, k, v, **args), want, atol=1e-5)
    with emulate(acc=cpd.FP32, mul=None, fma=True) as mode:
        got = F.scaled_dot_product_attention(q, k, v, **args)
    assert mode.calls["sdpa"] == 1 and torch.allclose(got, want, atol=1e-5)


def test_convert_replaces_and_keeps_weights():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Conv1d(2, 2, 3), torch.nn.Conv3d(1, 1, 1),
                                torch.nn.ConvTranspose2d(2, 2, 2), torch.nn.MultiheadAttention(8, 2), torch.nn.ReLU())
    q = convert(model, acc=HOPPER)
    kinds = [type(m).__name__ for m in q]
    assert kinds == ["QuantLinear", "QuantConv1d", "QuantConv3d", "QuantConvTranspose2d", "QuantMultiheadAttention",
                     "ReLU"]
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), q.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert type(model[0]) is torch.nn.Linear  # the original is untouched


def test_converted_transformer_exact_and_emulated():
    torch.manual_seed(8)
    layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    x = torch.randn(2, 10, 32)
    exact = convert(layer)  # no formats: plain float32 GEMMs in the emulated layers
    assert isinstance(exact.self_attn, QuantMultiheadAttention)
    assert torch.allclose(exact(x), layer(x), atol=1e-5)
    fused = convert(layer, acc=HOPPER)
    with emulate(acc=HOPPER):
        want = layer(x)  # the original layer with every GEMM routed through cpd
    got = fused(x)
    assert _same(got, want)
    assert 0 < (got - layer(x)).abs().max() < 0.5  # FP8 inputs: different, but close
    mha = QuantMultiheadAttention(32, 4, batch_first=True, acc=HOPPER)
    mha.load_state_dict(layer.self_attn.state_dict())
    with emulate(acc=HOPPER) as mode:
        ref = layer.self_attn(x, x, x, need_weights=False)[0]
    assert mode.calls == {"multi_head_attention": 1, "linear": 4}  # 3 projections + output projection
    assert _same(mha(x, x, x, need_weights=False)[0], ref)
    got.sum().backward()
    assert fused.linear1.weight.grad is not None and fused.self_attn.in_proj_weight.grad is not None


@pytest.mark.parametrize("kw", [dict(), dict(mask="bool"), dict(mask="float"), dict(kpm=True), dict(causal=True),
                                dict(average=False), dict(unbatched=True), dict(kdim=True)])
def test_multihead_attention_exact_matches_torch(kw):
    torch.manual_seed(9)
    extra = dict(kdim=6, vdim=5) if kw.get("kdim") else {}
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True, **extra)
    q = QuantMultiheadAttention(16, 4, batch_first=True, **extra)
    q.load_state_dict(ref.state_dict())
    x = torch.randn(2, 7, 16)
    kv = torch.randn(2, 9, 6) if extra else torch.randn(2, 9, 16)
    vv = torch.randn(2, 9, 5) if extra else kv
    args = {"average_attn_weights": kw.get("average", True)}
    if kw.get("mask") == "bool":
        args["attn_mask"] = torch.rand(7, 9) > 0.6
        args["attn_mask"][:, 0] = False
    if kw.get("mask") == "float":
        args["attn_mask"] = torch.randn(2 * 4, 7, 9)
    if kw.get("kpm"):
        args["key_padding_mask"] = torch.zeros(2, 9, dtype=torch.bool)
        args["key_padding_mask"][:, -2:] = True
    if kw.get("causal"):
        kv = vv = torch.randn(2, 7, 16)
        args["attn_mask"] = torch.nn.Transformer.generate_square_subsequent_mask(7)
        args["is_causal"] = True
    if kw.get("unbatched"):
        x, kv, vv = x[0], kv[0], vv[0]
    y, w = q(x, kv, vv, **args)
    yr, wr = ref(x, kv, vv, **args)
    assert torch.allclose(y, yr, atol=1e-5) and torch.allclose(w, wr, atol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="padding_mode"):
        QuantConv1d(2, 2, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="expects input"):
        QuantConv3d(2, 2, 1)(torch.randn(2, 2, 3))
    with pytest.raises(ValueError, match="kahan"):
        emulate(acc=HOPPER, kahan=True)
    with pytest.raises(TypeError, match="model"):
        convert("not a model")
