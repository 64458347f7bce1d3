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
@pytest.mark.parametrize("kernel_file", ["cast.cu", "matmul.cu"])
def test_kernels_compile(arch, kernel_file, tmp_path, monkeypatch):
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    cubin = _cuda.compile_source(kernel_file, arch, use_cache=False)
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


@pytest.mark.cuda
@gpu
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "down"])
@pytest.mark.parametrize("kw", [dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10)), dict(mul=cpd.E4M3, acc=cpd.BF16, kahan=True),
                                dict(acc=cpd.FloatFormat(5, 2), block=4), dict(acc=cpd.FP16, kahan=True, block=3)])
def test_gpu_matmul_matches_cpu(rounding, kw):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 17, 33, generator=g), torch.randn(33, 19, generator=g)
    extra = {"generator": torch.Generator().manual_seed(5)} if rounding == "stochastic" else {}
    cpu = cpd.matmul(a, b, rounding=rounding, **kw, **extra)
    extra = {"generator": torch.Generator().manual_seed(5)} if rounding == "stochastic" else {}
    seed = cpd.ops.draw_seed(extra["generator"]) if extra else None
    if seed is not None:  # the launch's (seed, offset) comes from a CPU generator; pass it explicitly
        mul = kw.get("mul")
        args = cpd.ops._fmt_args(mul or kw["acc"]) + cpd.ops._fmt_args(kw["acc"])
        gpu = torch.ops.cpd.matmul(a.cuda(), b.cuda(), seed.cuda(), mul is not None, *args, kw.get("kahan", False),
                                   kw.get("block", 0), cpd.Rounding.STOCHASTIC.code, False, 32).cpu()
    else:
        gpu = cpd.matmul(a.cuda(), b.cuda(), rounding=rounding, **kw).cpu()
    assert torch.equal(cpu.view(torch.int32), gpu.view(torch.int32))
