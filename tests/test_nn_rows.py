"""cpd.nn.quant_matmul of an N-d activation and a 2-D weight runs as one GEMM over the
activation's rows (cpd/nn/layers.py _rows_times), with the bits of the batched GEMM it replaces.

Invariants defended:
* forward and input gradient equal ``cpd.matmul`` of the operands as given (the weight broadcast
  over the batch), bit for bit, to nearest and stochastically (the same random words: each output
  keeps its flat index); the weight gradient is still the batched GEMM reduced over the batch;
* exact configs and FusedDot configs are left to their own GEMMs;
* a Quantizer with no formats returns its input itself (no autograd node), gradients unchanged.
"""

import pytest
import torch

import cpd
from cpd.nn.layers import GemmConfig, _rows_times


def bits(x):
    return x.contiguous().view(torch.int32)


CONFIGS = [GemmConfig(cpd.E4M3, cpd.FP16), GemmConfig(cpd.E5M2, cpd.BF16, kahan=True),
           GemmConfig(None, cpd.FP16, fma=True, rounding="stochastic"), GemmConfig(cpd.E4M3, cpd.FP32, block=5)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.mul and c.mul.name}-{c.acc.name}-{c.rounding.value}")
def test_rows_equal_the_batched_gemm(cfg):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 17, generator=g)
    w = torch.randn(17, 11, generator=g) * 0.3
    gy = torch.randn(3, 5, 11, generator=g)

    def batched(a, b):  # what quant_matmul ran before: cpd.matmul of the operands as given
        return cpd.matmul(a, b, mul=cfg.mul, acc=cfg.acc, fma=cfg.fma, kahan=cfg.kahan, block=cfg.block,
                          rounding=cfg.rounding)

    torch.manual_seed(7)
    want = batched(x, w)
    want_gx = batched(gy, w.t())
    want_gw = batched(x.transpose(-1, -2), gy).sum(0)
    torch.manual_seed(7)
    assert torch.equal(bits(_rows_times(cfg, x, w)), bits(want))
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.manual_seed(7)
    y = cpd.nn.quant_matmul(xr, wr, cfg)
    y.backward(gy)
    assert torch.equal(bits(y), bits(want))
    assert torch.equal(bits(xr.grad), bits(want_gx))
    assert torch.equal(bits(wr.grad), bits(want_gw))


def test_exact_and_fused_configs_keep_their_gemm():
    x, w = torch.randn(2, 3, 32), torch.randn(32, 8)
    assert torch.equal(_rows_times(GemmConfig(), x, w), torch.matmul(x, w))
    tc = GemmConfig(acc=cpd.tensor_core("hopper", a="e4m3"))
    assert torch.equal(bits(_rows_times(tc, x, w)), bits(cpd.matmul(x, w, acc=tc.acc)))


def test_quantizer_without_formats_is_the_identity():
    x = torch.randn(4, requires_grad=True)
    q = cpd.Quantizer()
    y = q(x)
    assert y is x
    (y * 3).sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 3.0))
