"""The layers above cpd.ops on the CUDA code path, without a GPU.

Invariants defended:
* under cpd._shim.on_host() (cpd's custom ops on CPU tensors run the CUDA implementations and
  kernels through the host shim), allreduce in its orders, APS, the compressors and QuantLinear
  give the bits of the CPU extension path;
* the helpers that build tensors keep their inputs' device: run on ``meta`` tensors (which carry a
  device but no data), a helper that built a CPU tensor beside them fails with a device mismatch,
  as it would with CUDA tensors. Data-dependent code (``.item()``) cannot run on meta; the
  ``cuda``-marked test covers it on a GPU.
"""

import pytest
import torch

import cpd
from cpd import _shim
from cpd.compressors import awp, base
from cpd.compressors import quantization as q

pytestmark = pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim")


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _workers(n=4, size=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=g) * 3 for _ in range(n)]


@pytest.mark.parametrize("kw", [dict(fmt=cpd.E5M2), dict(fmt=cpd.BF16, algorithm="tree", kahan=True),
                                dict(fmt=cpd.FP16, algorithm="hierarchical", group_size=2),
                                dict(fmt=cpd.E4M3, algorithm="sequential", rounding="stochastic"),
                                dict(compressor="dynamic_tree"), dict(compressor="e5m2")],
                         ids=lambda k: "-".join(f"{n}={getattr(v, 'name', v)}" for n, v in k.items()))
def test_allreduce_on_kernel_path(kw):
    def run():
        extra = {"generator": torch.Generator().manual_seed(3)} if kw.get("rounding") == "stochastic" else {}
        return cpd.allreduce(_workers(), **kw, **extra)

    want = run()
    with _shim.on_host(threads=64, max_blocks=2):
        got = run()
    assert same_bits(got, want)


def test_quantlinear_and_aps_on_kernel_path():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 12, generator=g)

    def run():
        torch.manual_seed(0)
        layer = cpd.nn.QuantLinear(12, 5, mul=cpd.E5M2, acc=cpd.FP16)
        reduced = cpd.aps_allreduce({"w": _workers(3, 20), "b": _workers(3, 4, seed=1)}, cpd.E4M3)
        return [layer(x), *(reduced[k] if isinstance(reduced, dict) else reduced[0][k] for k in ("w", "b"))]

    want = run()
    with _shim.on_host():
        got = run()
    for w, r in zip(want, got):
        assert same_bits(w.detach(), r.detach())


def test_helpers_keep_the_device():
    m = torch.empty(5, 3, device="meta")
    assert awp.bitunpack(awp.bitpack(torch.empty(7, device="meta"), 2), 2).device == m.device
    assert base.unpack_bits(base.pack_bits(torch.empty(13, dtype=torch.uint8, device="meta")), 13).device == m.device
    # a CPU generator serving a tensor elsewhere (audit: randint on the generator's device)
    assert q._sample_columns(m, 4, torch.Generator().manual_seed(0)).device == m.device
    assert cpd.cast(m, cpd.E5M2, "stochastic").device == m.device
    assert cpd.matmul(m, torch.empty(3, 2, device="meta"), mul=cpd.E5M2).device == m.device


@pytest.mark.parametrize("name", ["onebit", "threshold:0.01", "dynamic_tree", "linear"])
def test_decoders_keep_the_device(name):
    c = cpd.compressors.get(name)
    p = c._encode(torch.randn(10, generator=torch.Generator().manual_seed(2)))
    meta = type(p)(p.method, p.shape, {k: v.to("meta") for k, v in p.parts.items()})
    assert c._decode(meta).device.type == "meta"


#: Compressors run on CUDA tensors below. "e2m1fn" (MX FP4): the bare "e2m1" is ambiguous and refused.
CUDA_COMPRESSORS = ["onebit", "threshold:0.01", "adaptive", "dynamic_tree", "e5m2", "e2m1fn"]


def test_cuda_compressor_names_resolve():
    """The names of the cuda-marked test are accepted (that test only runs on a GPU)."""
    for name in CUDA_COMPRESSORS:
        cpd.compressors.get(name)


@pytest.mark.cuda
@pytest.mark.parametrize("name", CUDA_COMPRESSORS)
def test_compressors_on_cuda(name):
    c = cpd.compressors.get(name)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(4))
    want = c._decode(c._encode(x))
    p = c._encode(x.cuda())
    assert all(v.is_cuda for v in p.parts.values())
    got = c._decode(p)
    assert got.is_cuda and torch.equal(torch.nan_to_num(got.cpu(), nan=0.5), torch.nan_to_num(want, nan=0.5))


@pytest.mark.cuda
def test_allreduce_on_cuda():
    ws = _workers(4, 1000)
    want = cpd.allreduce(ws, cpd.E5M2, kahan=True)
    got = cpd.allreduce([w.cuda() for w in ws], cpd.E5M2, kahan=True)
    assert got.is_cuda and same_bits(got.cpu(), want)
