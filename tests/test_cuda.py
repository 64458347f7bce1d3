"""The CUDA kernels compile through NVRTC for every supported architecture, and, on a GPU, give
the same bits as the CPU for every format, mode and input (the numerics core is shared).

Compilation needs no GPU, so a kernel that does not compile fails here on any machine.
"""

import pytest
import torch

import cpd
from cpd import _cuda

pytestmark = pytest.mark.skipif(not _cuda.available(), reason="cuda-bindings NVRTC not installed")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("arch", ["sm_70", "sm_80", "sm_90"])
def test_kernels_compile(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    cubin = _cuda.compile_source("cast.cu", arch, use_cache=False)
    assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF image


def test_compile_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    first = _cuda.compile_source("cast.cu", "sm_80")
    files = list((tmp_path / "nvrtc").glob("*.cubin"))
    assert len(files) == 1
    assert _cuda.compile_source("cast.cu", "sm_80") == first


def test_compile_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="invalid value|gpu-architecture|NVRTC"):
        _cuda.compile_source("cast.cu", "sm_1", use_cache=False)


def _inputs():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 16,), dtype=torch.int32, generator=g)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65000.0, 2**-17 * (1 + 2**-23),
                            1e-45, -3e38, 448.0, 464.0, 240.0, 248.0])
    return torch.cat([bits.view(torch.float32), torch.randn(1 << 16, generator=g) * 100, special])


FORMATS = [cpd.E5M2, cpd.E4M3, cpd.E4M3FN, cpd.E2M1, cpd.FP16, cpd.BF16, cpd.FloatFormat(3, 0),
           cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(8, 10, bias=140)]


@pytest.mark.cuda
@gpu
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero", "up", "down"])
@pytest.mark.parametrize("saturate", [False, True])
def test_gpu_matches_cpu(fmt, rounding, saturate):
    x = _inputs()
    kw = {}
    if rounding == "stochastic":
        kw = {"generator": torch.Generator().manual_seed(7)}
        seed = cpd.ops.draw_seed(torch.Generator().manual_seed(7))
        cpu = torch.ops.cpd.cast(x, seed, *cpd.ops._fmt_args(fmt), cpd.Rounding.STOCHASTIC.code, saturate, 32)
        gpu = torch.ops.cpd.cast(x.cuda(), seed.cuda(), *cpd.ops._fmt_args(fmt), cpd.Rounding.STOCHASTIC.code,
                                 saturate, 32).cpu()
    else:
        cpu = cpd.cast(x, fmt, rounding, saturate=saturate, **kw)
        gpu = cpd.cast(x.cuda(), fmt, rounding, saturate=saturate, **kw).cpu()
    assert torch.equal(cpu.view(torch.int32), gpu.view(torch.int32)) or torch.equal(
        torch.nan_to_num(cpu, nan=1.5), torch.nan_to_num(gpu, nan=1.5))


@pytest.mark.cuda
@gpu
@pytest.mark.parametrize("fmt", [cpd.E5M2, cpd.E4M3FN, cpd.FP16, cpd.TF32], ids=lambda f: f.name)
def test_gpu_encode_decode_match_cpu(fmt):
    x = torch.nan_to_num(_inputs(), nan=0.0)
    c_cpu = cpd.encode(x, fmt, saturate=True)
    c_gpu = cpd.encode(x.cuda(), fmt, saturate=True).cpu()
    assert torch.equal(c_cpu, c_gpu)
    assert torch.equal(cpd.decode(c_cpu, fmt), cpd.decode(c_cpu.cuda(), fmt).cpu())
