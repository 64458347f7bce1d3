"""convert() over the model zoo: bare layers, transformers' Conv1D, register_conversion, the
conversion report and its warning; Hugging Face GPT-2/BERT/ViT and torchvision's ResNet-18 when
those libraries are installed (built from small configs, no download).

Invariants:
* every module that multiplies by a weight matrix is converted, skipped on purpose (``skip=``)
  or reported as unsupported (with a ConversionWarning): never left float32 silently;
* a converted model run under ``emulate`` equals the original run under ``emulate`` bit for bit,
  forward and backward (the converted layers compute what ``emulate`` computes for their module);
* tied weights stay tied, the original model is untouched.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import cpd
from cpd.nn import (ConversionWarning, QuantConv2d, QuantLinear, QuantTransposedLinear, conversion_report, convert,
                    emulate, register_conversion)

HAS_HF = importlib.util.find_spec("transformers") is not None
HAS_TV = importlib.util.find_spec("torchvision") is not None
FMT = dict(mul=cpd.E4M3, acc=cpd.FP16)


class _Silent:
    """Fails if a ConversionWarning is raised inside."""

    def __enter__(self):
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error", ConversionWarning)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def test_bare_layers_come_back_converted():
    torch.manual_seed(0)
    lin, conv = torch.nn.Linear(4, 3), torch.nn.Conv2d(2, 3, 3, padding=1)
    ql, qc = convert(lin, **FMT), convert(conv, **FMT)
    assert isinstance(ql, QuantLinear) and isinstance(qc, QuantConv2d)
    assert type(lin) is torch.nn.Linear and type(conv) is torch.nn.Conv2d  # originals untouched
    assert torch.equal(ql.weight, lin.weight) and ql.weight is not lin.weight
    x = torch.randn(5, 4)
    w, b = lin.weight.detach(), lin.bias.detach()
    assert torch.equal(ql(x).detach(), cpd.add(cpd.matmul(x, w.t(), **FMT), b, cpd.FP16))
    assert torch.allclose(convert(lin)(x), lin(x), atol=1e-6)
    assert conversion_report(ql).modules[0].name == "" and conversion_report(ql).modules[0].status == "converted"
    assert type(convert(lin, skip=("",))) is torch.nn.Linear


class Conv1DLike(torch.nn.Module):
    """transformers.pytorch_utils.Conv1D's computation, written here (weight (in, out), addmm)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = torch.nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], self.nf)


def test_transposed_linear_equals_addmm_under_emulate():
    torch.manual_seed(1)
    m = Conv1DLike(6, 8)
    q = QuantTransposedLinear(6, 8, **FMT)
    q.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 8, requires_grad=True)
    with emulate(**FMT):
        y = m(x)
    y.backward(torch.ones_like(y))
    g = x.grad.clone()
    x.grad = None
    yq = q(x)
    yq.backward(torch.ones_like(yq))
    assert torch.equal(y, yq) and torch.equal(g, x.grad)
    assert torch.equal(m.weight.grad, q.weight.grad) and torch.equal(m.bias.grad, q.bias.grad)
    # the product is cpd.matmul's (independent of the layer): E4M3 products, FP16 sums
    want = cpd.matmul(x.detach().reshape(-1, 8), m.weight.detach(), **FMT) + m.bias.detach()
    assert torch.equal(yq.detach().reshape(-1, 6), want)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.proj = Conv1DLike(8, 8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, ids):
        h = self.norm(self.emb(ids))
        h = self.proj(h)
        att = torch.softmax(h @ h.transpose(-1, -2), -1) @ h
        return self.head(att)


def test_unsupported_is_warned_and_reported_then_registered():
    torch.manual_seed(2)
    net = Net()
    ids = torch.randint(0, 10, (2, 5))
    with pytest.warns(ConversionWarning, match=r"proj \(.*Conv1DLike\)"):
        q = convert(net, **FMT)
    assert q.head.weight is q.emb.weight  # tied weights stay tied
    rep = conversion_report(q, ids)
    by = {e.name: e for e in rep.modules}
    assert set(by) == {"proj", "head"}  # the embedding and the norm are not GEMMs
    assert by["proj"].status == "unsupported" and by["head"].status == "converted"
    assert by["head"].formats["mul"] == "e4m3" and by["head"].formats["acc"] == cpd.FP16.name
    assert rep.unconverted == ["proj"]
    sites = {(g.module, g.op): g for g in rep.gemms}
    assert sites[("proj", "addmm")].weight_operand and sites[("proj", "addmm")].emulated_by_emulate
    assert sites[("", "matmul")].calls == 2 and not sites[("", "matmul")].weight_operand
    text = str(rep)
    assert "1 converted, 0 skipped, 1 unsupported" in text and "no conversion for this type" in text
    d = rep.to_dict()
    assert d["modules"][0]["name"] == "proj" and {g["op"] for g in d["gemms"]} == {"addmm", "matmul"}

    with _Silent():  # skipped on purpose: reported, no warning
        s = convert(net, **FMT, skip=("proj",))
    e = {e.name: e for e in conversion_report(s).modules}["proj"]
    assert e.status == "skipped" and "proj" in e.reason

    register_conversion(Conv1DLike, lambda m, **kw: QuantTransposedLinear(
        m.nf, m.nx, **{k: kw[k] for k in ("mul", "acc", "backward_mul", "backward_acc")}))
    try:
        with _Silent():
            r = convert(net, **FMT, example_inputs=ids)
        assert isinstance(r.proj, QuantTransposedLinear) and r.proj.weight is not net.proj.weight
        rep = conversion_report(r, (ids,))
        assert rep.unconverted == [] and all(not g.weight_operand for g in rep.gemms)
        with emulate(**FMT):  # converted under emulate == original under emulate, forward and backward
            a = net(ids)
            b = r(ids)
        a.square().sum().backward()
        b.square().sum().backward()
        assert torch.equal(a, b)
        for (n, p), (n2, p2) in zip(net.named_parameters(), r.named_parameters()):
            assert n == n2 and torch.equal(p.grad, p2.grad), n
    finally:
        register_conversion(Conv1DLike, None)


def test_register_conversion_errors():
    with pytest.raises(TypeError, match="module_type"):
        register_conversion(int, lambda m, **kw: m)
    with pytest.raises(TypeError, match="module_type"):
        register_conversion(torch.nn.Linear(2, 2), lambda m, **kw: m)
    with pytest.raises(TypeError, match="factory"):
        register_conversion(Conv1DLike, "not callable")
    net = torch.nn.Sequential(Conv1DLike(4, 4))
    x = torch.randn(3, 4)
    try:
        register_conversion(Conv1DLike, lambda m, **kw: "a string")
        with pytest.raises(TypeError, match="not a torch.nn.Module"):
            convert(net)
        register_conversion(Conv1DLike, lambda m, **kw: QuantTransposedLinear(m.nf + 1, m.nx))
        with pytest.raises(ValueError, match="other shapes"):
            convert(net)
        register_conversion(Conv1DLike, lambda m, **kw: torch.nn.Sequential(torch.nn.Linear(4, 4)))  # other names
        with pytest.raises(ValueError, match="missing"):
            convert(net)

        class Wrong(Conv1DLike):  # same parameters, another output shape
            def forward(self, x):
                return super().forward(x)[..., :2]
        register_conversion(Conv1DLike, lambda m, **kw: Wrong(m.nf, m.nx))
        convert(net)  # no inputs: nothing to compare
        with pytest.raises(ValueError, match=r"shapes \(\(3, 2\),\), the module \(\(3, 4\),\)"):
            convert(net, example_inputs=x)
    finally:
        register_conversion(Conv1DLike, None)
    with pytest.raises(TypeError, match="example_inputs"):
        convert(net, example_inputs=[x])
    with pytest.raises(TypeError, match="skip"):
        convert(net, skip="0")
    with pytest.raises(TypeError, match="model"):
        conversion_report("not a model")


def test_declined_configuration_is_reported_whole():
    m = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"),
                            torch.nn.MultiheadAttention(4, 2, add_bias_kv=True))
    with pytest.warns(ConversionWarning, match="configuration not supported"):
        q = convert(m, **FMT)
    assert type(q[0]) is torch.nn.Conv2d and type(q[1]) is torch.nn.MultiheadAttention
    assert type(q[1].out_proj) is type(m[1].out_proj)  # not converted inside a kept attention
    assert [e.name for e in conversion_report(q).modules] == ["0", "1"]


def test_linear_subclass_with_torch_forward_is_converted():
    mha_out = torch.nn.MultiheadAttention(4, 2).out_proj  # NonDynamicallyQuantizableLinear
    assert isinstance(convert(mha_out, **FMT), QuantLinear)

    class Custom(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2
    with pytest.warns(ConversionWarning, match="Custom"):
        assert type(convert(Custom(2, 2))) is Custom


class BasicBlock(torch.nn.Module):
    """A ResNet basic block of plain torch layers (the layers torchvision's ResNet-18 is made of)."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


def test_resnet_like_block_converts_completely():
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU(), BasicBlock(8), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                            torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 3, 8, 8)
    with _Silent():
        q = convert(m, **FMT, example_inputs=x)
    rep = conversion_report(q, x)
    assert [e.status for e in rep.modules] == ["converted"] * 4 and rep.gemms == []
    assert torch.allclose(convert(m)(x), m(x), atol=1e-5)


def _torchvision():
    """torchvision, or a skip. Its models are pure Python (torch.nn layers); its compiled ops
    (``torchvision::nms`` and the like, for detection) are not used here. PyPI's torchvision wheel
    for a given torch is a CUDA build: beside the CPU build of torch its ``_C`` library cannot load,
    and ``import torchvision`` then fails registering fake kernels for two ops that do not exist
    (torchvision 0.28: ``nms``, ``qnms``). For this test only, those two schemas are declared (never
    implemented: a call would fail loudly) so that the model zoo imports; nothing here calls them."""
    try:
        import torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            try:
                lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            except RuntimeError:  # declared already (a torchvision whose ops did load)
                pass
        _TV_LIBS.append(lib)  # kept alive: the schemas live as long as the library object
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        import torchvision
    return torchvision


_TV_LIBS: list = []


# ----------------------------------------------------------------------------- Hugging Face models
def _hf_models():
    if HAS_TV:
        _torchvision()  # transformers imports torchvision when it is installed
    from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, ViTConfig,
                              ViTForImageClassification)
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(4)
    ids = torch.randint(0, 96, (2, 12))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=96, n_positions=32,
                                      bos_token_id=0, eos_token_id=0))
    bert = BertForMaskedLM(BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=96, max_position_embeddings=32))
    vit = ViTForImageClassification(ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                              intermediate_size=128, image_size=16, patch_size=4, num_labels=5))
    img = torch.randn(2, 3, 16, 16)
    return {"gpt2": (gpt2, {"input_ids": ids, "labels": ids}), "bert": (bert, {"input_ids": ids, "labels": ids}),
            "vit": (vit, {"pixel_values": img, "labels": torch.tensor([1, 3])})}


@pytest.mark.skipif(not HAS_HF, reason="transformers is not installed (pip install -e '.[models]')")
@pytest.mark.parametrize("name", ["gpt2", "bert", "vit"])
def test_hf_models_convert_completely_and_match_emulate(name):
    model, inputs = _hf_models()[name]
    model.eval()  # no dropout: the two runs see the same arithmetic
    with _Silent():
        q = convert(model, **FMT, example_inputs=inputs)
    rep = conversion_report(q, inputs)
    assert rep.unconverted == [] and rep.modules and all(e.status == "converted" for e in rep.modules)
    assert not any(g.weight_operand for g in rep.gemms), rep  # only attention is left to emulate
    assert {g.op for g in rep.gemms} <= {"sdpa", "matmul"}
    if name == "gpt2":
        assert q.lm_head.weight is q.transformer.wte.weight
        assert sum(isinstance(m, QuantTransposedLinear) for m in q.modules()) == 8
    with emulate(**FMT):
        a = model(**inputs).loss
    a.backward()
    with emulate(**FMT):
        b = q(**inputs).loss
    b.backward()
    assert torch.equal(a, b), (a.item(), b.item())
    pa, pb = dict(model.named_parameters()), dict(q.named_parameters())
    assert set(pa) == set(pb)
    for k in pa:
        assert (pa[k].grad is None and pb[k].grad is None) or torch.equal(pa[k].grad, pb[k].grad), k




@pytest.mark.skipif(not HAS_TV, reason="torchvision is not installed (pip install -e '.[models]')")
def test_torchvision_resnet18_converts_completely_and_matches_emulate():
    tv = _torchvision()
    torch.manual_seed(7)
    m = tv.models.resnet18(num_classes=10).eval()  # eval: batch norm uses its running statistics
    x = torch.randn(2, 3, 32, 32)
    with _Silent():
        q = convert(m, **FMT)
    rep = conversion_report(q, x)
    assert rep.unconverted == [] and len(rep.modules) == 21 and rep.gemms == []
    assert sum(isinstance(mod, QuantConv2d) for mod in q.modules()) == 20
    assert sum(isinstance(mod, QuantLinear) for mod in q.modules()) == 1
    assert torch.allclose(convert(m)(x), m(x), atol=1e-4)
    # The converted model computes what emulate computes for the original, forward and backward.
    with emulate(**FMT):
        a = m(x)
    a.square().sum().backward()
    b = q(x)
    b.square().sum().backward()
    assert torch.equal(a, b)
    pa, pb = dict(m.named_parameters()), dict(q.named_parameters())
    assert set(pa) == set(pb)
    for k in pa:
        assert torch.equal(pa[k].grad, pb[k].grad), k


@pytest.mark.parametrize("kw", [dict(stride=2, padding=1), dict(padding="same", dilation=2), dict(groups=2),
                                dict(stride=(1, 2), padding=(2, 0), bias=False)])
def test_emulate_routes_conv2d_as_quant_conv2d(kw):
    torch.manual_seed(5)
    conv = torch.nn.Conv2d(4, 6, 3, **kw)
    q = convert(conv, **FMT)
    x = torch.randn(2, 4, 7, 7)
    with emulate(**FMT) as mode:
        y = conv(x)
    y.square().sum().backward()
    yq = q(x)
    yq.square().sum().backward()
    assert mode.calls["conv"] == 1 and torch.equal(y, yq)
    assert torch.equal(conv.weight.grad, q.weight.grad)
    if conv.bias is not None:
        assert torch.equal(conv.bias.grad, q.bias.grad)
    with emulate():  # exact config: plain float32 GEMMs, close to torch's convolution
        assert torch.allclose(conv(x), F.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation,
                                                conv.groups), atol=1e-5)


def test_emulate_routes_conv1d_unbatched():
    torch.manual_seed(6)
    conv = torch.nn.Conv1d(3, 5, 3, padding=1)
    x = torch.randn(3, 9)
    with emulate(**FMT):
        y = conv(x)
    assert torch.equal(y, convert(conv, **FMT)(x.unsqueeze(0)).squeeze(0))


def test_import_cpd_imports_no_model_library():
    import subprocess
    import sys

    code = ("import sys, cpd, cpd.nn; bad = [m for m in ('transformers', 'torchvision', 'timm') if m in sys.modules]; "
            "assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


def test_multiplies_by_weight():
    from cpd.nn.zoo import multiplies_by_weight

    class Tokens(torch.nn.Module):  # ViT-like: a class token and a positional table, no GEMM
        def __init__(self):
            super().__init__()
            self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 4))
            self.position_embeddings = torch.nn.Parameter(torch.zeros(1, 5, 4))

    yes = [torch.nn.Linear(2, 2), torch.nn.Conv2d(1, 1, 1), torch.nn.LSTM(2, 2), torch.nn.Bilinear(2, 2, 2),
           torch.nn.MultiheadAttention(4, 2)]
    no = [torch.nn.Embedding(3, 2), torch.nn.EmbeddingBag(3, 2), torch.nn.LayerNorm(2), torch.nn.BatchNorm2d(2),
          torch.nn.GroupNorm(1, 2), torch.nn.PReLU(), Tokens(), torch.nn.Sequential(torch.nn.Linear(2, 2))]
    assert all(multiplies_by_weight(m) for m in yes) and not any(multiplies_by_weight(m) for m in no)


def test_report_names_gemms_no_route_reaches():
    class Mixer(torch.nn.Module):
        def forward(self, x):
            return torch.einsum("bij,bjk->bik", x, x)

    m = torch.nn.Sequential(torch.nn.Linear(3, 3), Mixer())
    x = torch.randn(2, 3, 3)
    rep = conversion_report(convert(m, **FMT), x)
    (site,) = rep.gemms
    assert (site.module, site.op, site.calls, site.emulated_by_emulate) == ("1", "einsum", 1, False)
    assert "float32 (no cpd route)" in str(rep)
    plain = conversion_report(m)  # a model convert never saw: its Linear is unsupported
    assert plain.unconverted == ["0"] and rep.unconverted == []
    assert "not a model from cpd.nn.convert" in plain.modules[0].reason
