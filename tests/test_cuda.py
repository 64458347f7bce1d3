"""The CUDA kernels compile through NVRTC for the architectures the installed NVRTC supports (cubin)
and as PTX for newer ones; on a GPU they give the CPU's bits for every format, mode and input.

Compilation needs no GPU, so a kernel that does not compile fails here on any machine; the
kernels' *execution* is checked without a GPU by tests/test_shim.py. Tests marked ``cuda`` run
only with a GPU (conftest.py skips them otherwise).
"""

import functools

import pytest
import torch

import cpd
from cpd import _cuda, _tensor_core_op
from cpd._cuda import cpu_twin as _cpu_twin
from kernel_limits import check_family_kernels, check_local_memory

nvrtc = pytest.mark.skipif(not _cuda.available(), reason="cuda-bindings NVRTC not installed")
#: Every kernel source of the package: each keeps out of local memory (and compiles for the ends of
#: NVRTC's range: tests/test_cuda_compile.py); a new .cu file is checked without a line here.
KERNEL_FILES = sorted(p.name for p in (_cuda.source_dir() / "kernels").glob("*.cu"))


# ------------------------------------------------------------------------------------ targets
def test_target_choice():
    """A cubin for a known architecture, PTX of the highest known one below an unknown one,
    nothing for a device older than every target (then CUDA tensors use the torch fallback)."""
    archs = [75, 80, 86, 89, 90, 100, 120]
    assert _cuda.target_for(9, 0, archs) == "sm_90"
    assert _cuda.target_for(12, 1, archs) == "compute_120"
    assert _cuda.target_for(10, 3, archs) == "compute_100"
    assert _cuda.target_for(11, 0, archs) == "compute_100"
    assert _cuda.target_for(7, 0, archs) is None


@nvrtc
def test_ptx_for_unknown_architectures(tmp_path, monkeypatch):
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    top = max(_cuda.supported_archs())
    ptx = _cuda.compile_source("cast.cu", f"compute_{top}")
    text = ptx.rstrip(b"\0").decode()
    assert ".version" in text and f".target sm_{top}" in text and ".entry cpd_cast_stochastic" in text
    assert ptx.endswith(b"\0")  # cuModuleLoadData reads PTX as a C string
    assert len(list((tmp_path / "nvrtc").glob("*.ptx"))) == 1


@functools.lru_cache(maxsize=None)
def _usage(kernel_file: str, arch: str) -> dict:
    """ptxas's report, once per (file, arch) in this process: matmul.cu at sm_90 serves two tests
    (its compile is the suite's longest, about a minute)."""
    return _cuda.resource_usage(kernel_file, arch)


def test_ptxas_report_reads_each_kernels_own_lines():
    """A kernel's stack and spills are those under its own "Function properties" line, not a called
    function's that ptxas prints after it."""
    log = """ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
ptxas         .     256 bytes stack frame, 40 bytes spill stores, 52 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 256 bytes cumulative stack size, 8704 bytes smem
ptxas info    : Compile time = 3.5 ms
ptxas info    : Function properties for _ZN3cpd10dot_outputE
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 0 barriers
"""
    got = _cuda.parse_ptxas_report(log)
    assert got["k1"] == {"registers": 128, "stack": 256, "spill_stores": 40, "spill_loads": 52, "smem": 8704}
    assert got["k2"] == {"registers": 64, "stack": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0}
    with pytest.raises(AssertionError):
        check_local_memory(got, "synthetic")


@nvrtc
@pytest.mark.parametrize("kernel_file", KERNEL_FILES)
def test_no_local_memory(kernel_file):
    """No kernel spills or keeps arrays in local memory (a register tile indexed at run time, an
    array in a scalar tail loop), but those of LOCAL_ALLOWED: ptxas's report at sm_90 (register
    counts are in docs/gpu.md)."""
    arch = "sm_90" if 90 in _cuda.supported_archs() else f"sm_{max(_cuda.supported_archs())}"
    usage = _usage(kernel_file, arch)
    check_local_memory(usage, (kernel_file, arch))
    assert all(u["registers"] <= 255 for u in usage.values()), usage


@nvrtc
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_gemm_family_kernels_do_not_spill(arch):
    """The GEMM family kernels' register tiles (matmul.cu: R x R outputs per thread, 2 blocks of 256
    per SM, i.e. at most 128 registers; the chain and SR one block, 255) fit without local memory
    on Turing, Ampere and Hopper, but LOCAL_ALLOWED's. sm_75 has no cp.async: its kernels stage the
    next K slice in registers (matmul.cu family_gemm, cpd/launch.h CPD_COPY_ASYNC), which fit too.
    Volta (sm_70, NVRTC 12 only: every family one block per SM there) is compiled by
    tests/test_cuda_compile.py, its registers not checked here."""
    if int(arch[3:]) not in _cuda.supported_archs():
        pytest.skip(f"NVRTC lacks {arch}")
    check_family_kernels(_usage("matmul.cu", arch), arch)



FD_FAMILIES = {"l32": (32, 0), "l16": (16, 0), "l32w": (32, 0), "l16w": (16, 0), "l8": (8, 0), "l8w": (8, 0),
               "l4": (4, 0), "l32ws": (32, 32), "c16": (64, 16), "amdp": (4, 0), "amdpz": (4, 0), "l8a": (8, 0),
               "l4a": (4, 0), "l16a": (16, 0)}  # (L, block)


@nvrtc
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_fused_dot_tiled_kernels_do_not_spill(arch):
    """The tiled fused-dot kernels (fused_dot.cu: 4 x 4 outputs per thread, one block of 256 per
    SM by __launch_bounds__) keep their tiles, exponents and sums in registers on Turing, Ampere and
    Hopper, in every tile shape built there (sm_75: one stage; sm_80+: cp.async double buffering
    with slices of one or two depths, and the scaled L 32 family's one stage), groups of 4 to 32,
    with and without block scales, the chunk16 kernels (NVFP4), AMD's CDNA1 / CDNA2 pairwise
    kernels and CDNA3's (l8a, l4a, l16a). A compile builds exactly the shapes _tensor_core_op.shapes_of says it does (what the
    launch picks from: a shape it lacks would be a launch of a missing kernel)."""
    if int(arch[3:]) not in _cuda.supported_archs():
        pytest.skip(f"NVRTC lacks {arch}")
    usage = _usage("fused_dot.cu", arch)
    major = int(arch[3:-1])
    want = {f"cpd_fused_dot_tiled_{f}_{shape}" for f, (L, block) in FD_FAMILIES.items()
            for shape in _tensor_core_op.shapes_of(L, block, major, raw=f in ("c16", "amdp", "amdpz"))}
    assert {k for k in usage if k.startswith("cpd_fused_dot_tiled_")} == want, arch
    assert "cpd_fused_dot_matmul" in usage
    for name in want:
        u = usage[name]
        assert u["stack"] == 0 and u["spill_stores"] == 0 and u["spill_loads"] == 0, (arch, name, u)


@nvrtc
def test_compile_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    first = _cuda.compile_source("cast.cu", "sm_80")
    files = list((tmp_path / "nvrtc").glob("*.cubin"))
    assert len(files) == 1
    assert _cuda.compile_source("cast.cu", "sm_80") == first


@nvrtc
def test_concurrent_requests_compile_once(tmp_path, monkeypatch):
    """Callers that need the same image at once (ranks of a job on one GPU host, the suite's
    workers) run NVRTC once: the others wait on the image's lock and read the cache. Threads here,
    each with its own lock file description (flock excludes them as it does processes); a
    resource_usage request shares the compile_source one's lock, cubin and ptxas report (no second
    compile of a large file for the suite's register checks, whichever asks first)."""
    import threading
    import time

    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    real, calls = _cuda._nvrtc_compile, []

    def slow(*args):
        calls.append(args[1])
        time.sleep(0.5)  # the others arrive while this compile runs
        return real(*args)

    monkeypatch.setattr(_cuda, "_nvrtc_compile", slow)
    images = []
    threads = [threading.Thread(target=lambda: images.append(_cuda.compile_source("hop.cu", "sm_80")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["sm_80"] and len(images) == 3 and len(set(images)) == 1
    assert _cuda.resource_usage("hop.cu", "sm_80") and calls == ["sm_80"]  # the cubin's compile made the report
    assert _cuda.compile_source("hop.cu", "sm_80") == images[0] and len(calls) == 1


@nvrtc
def test_compile_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="invalid value|gpu-architecture|NVRTC"):
        _cuda.compile_source("cast.cu", "sm_1", use_cache=False)


# ------------------------------------------------------------------------------------ seeds
class FakeCudaGenerator:
    """The three methods draw_seed's CUDA-generator twin uses (a CUDA generator needs a GPU)."""

    def __init__(self, seed):
        self.seed, self.offset = seed, 0

    def initial_seed(self):
        return self.seed

    def get_offset(self):
        return self.offset

    def set_offset(self, offset):
        self.offset = offset


def test_cuda_generator_twin():
    """A just-seeded CUDA generator draws the CPU generator's pairs, advancing its offset by 4;
    a state left by other random ops restarts the twin from (seed, offset), never from the seed."""
    g = FakeCudaGenerator(7)
    cpu = torch.Generator().manual_seed(7)
    for _ in range(3):
        want = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=cpu)
        assert torch.equal(torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=_cpu_twin(g)), want)
    assert g.offset == 12
    first = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=torch.Generator().manual_seed(7))
    g.offset = 40  # some other op drew from g
    other = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=_cpu_twin(g))
    assert not torch.equal(other, first)
    g.offset = 0  # reseeded
    again = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=_cpu_twin(g))
    assert torch.equal(again, first)


def test_draw_seed_is_a_cpu_pair():
    s = cpd.ops.draw_seed(torch.Generator().manual_seed(3))
    assert s.device.type == "cpu" and s.dtype == torch.int64 and s.shape == (2,)


# ------------------------------------------------------------------------------------ on a GPU
def _inputs():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 16,), dtype=torch.int32, generator=g)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65000.0, 2**-17 * (1 + 2**-23),
                            1e-45, -3e38, 448.0, 464.0, 240.0, 248.0])
    return torch.cat([bits.view(torch.float32), torch.randn(1 << 16, generator=g) * 100, special])


FORMATS = [cpd.E5M2, cpd.E4M3, cpd.E4M3FN, cpd.E2M1, cpd.FP16, cpd.BF16, cpd.FloatFormat(3, 0),
           cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(8, 10, bias=140)]


def _same(cpu, gpu):
    return torch.equal(cpu.view(torch.int32), gpu.view(torch.int32)) or torch.equal(
        torch.nan_to_num(cpu, nan=1.5), torch.nan_to_num(gpu, nan=1.5))


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero", "up", "down"])
@pytest.mark.parametrize("saturate", [False, True])
def test_gpu_matches_cpu(fmt, rounding, saturate):
    x = _inputs()
    kw = (lambda: {"generator": torch.Generator().manual_seed(7)}) if rounding == "stochastic" else dict
    cpu = cpd.cast(x, fmt, rounding, saturate=saturate, **kw())
    gpu = cpd.cast(x.cuda(), fmt, rounding, saturate=saturate, **kw())  # a CPU generator: the same pair
    assert gpu.is_cuda and _same(cpu, gpu.cpu())
    y = x.cuda()[1:]  # misaligned: the scalar path
    assert _same(cpd.cast(x[1:], fmt, rounding, saturate=saturate, **kw()),
                 cpd.cast(y, fmt, rounding, saturate=saturate, **kw()).cpu())


@pytest.mark.cuda
def test_cuda_generator_matches_cpu_generator():
    x = _inputs()
    cpu = cpd.cast(x, cpd.E4M3, "stochastic", generator=torch.Generator().manual_seed(11))
    gpu = cpd.cast(x.cuda(), cpd.E4M3, "stochastic", generator=torch.Generator("cuda").manual_seed(11))
    assert _same(cpu, gpu.cpu())
    torch.manual_seed(5)
    cpu = cpd.cast(x, cpd.E4M3, "stochastic")
    torch.manual_seed(5)
    assert _same(cpu, cpd.cast(x.cuda(), cpd.E4M3, "stochastic").cpu())


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", [cpd.E5M2, cpd.E4M3FN, cpd.FP16, cpd.TF32], ids=lambda f: f.name)
def test_gpu_encode_decode_match_cpu(fmt):
    x = torch.nan_to_num(_inputs(), nan=0.0)
    c_cpu = cpd.encode(x, fmt, saturate=True)
    c_gpu = cpd.encode(x.cuda(), fmt, saturate=True).cpu()
    assert torch.equal(c_cpu, c_gpu)
    assert torch.equal(cpd.decode(c_cpu, fmt), cpd.decode(c_cpu.cuda(), fmt).cpu())


@pytest.mark.cuda
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "down"])
@pytest.mark.parametrize("kw", [dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10)), dict(mul=cpd.E4M3, acc=cpd.BF16, kahan=True),
                                dict(acc=cpd.FloatFormat(5, 2), block=4), dict(acc=cpd.FP16, kahan=True, block=3)])
def test_gpu_matmul_matches_cpu(rounding, kw):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 67, 33, generator=g), torch.randn(33, 70, generator=g)
    extra = (lambda: {"generator": torch.Generator().manual_seed(5)}) if rounding == "stochastic" else dict
    cpu = cpd.matmul(a, b, rounding=rounding, **kw, **extra())
    gpu = cpd.matmul(a.cuda(), b.cuda(), rounding=rounding, **kw, **extra())
    assert gpu.is_cuda and _same(cpu, gpu.cpu())


@pytest.mark.cuda
@pytest.mark.parametrize("kw", [dict(acc=cpd.FP32), dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10)),
                                dict(mul=cpd.E4M3, acc=cpd.FP16), dict(mul=cpd.E4M3, acc=cpd.FP16, kahan=True),
                                dict(mul=cpd.E4M3, acc=cpd.FloatFormat(6, 9), kahan=True),
                                dict(mul=cpd.E5M2, acc=cpd.BF16), dict(mul=cpd.E4M3, acc=cpd.BF16, kahan=True),
                                dict(mul=cpd.E4M3), dict(mul=cpd.FP16, kahan=True), dict(acc=cpd.FP32, kahan=True),
                                dict(acc=cpd.FP16), dict(acc=cpd.TF32, kahan=True), dict(mul=cpd.E4M3, block=32),
                                dict(block=4, kahan=True)],
                         ids=lambda k: "-".join(f"{n}={getattr(v, 'name', v)}" for n, v in k.items()))
def test_gpu_gemm_families_match_cpu(kw):
    """The family kernels (cpd/gemm.h) on the hardware: the FFMA chain, the binary16 pair
    instructions (cvt.rn.f16x2.f32, add.rn/sub.rn.f16x2, max.xorsign.abs.f16x2), the BF16 lanes'
    integer rounding and cp.async staging, on ragged tiles, every binade, overflow, subnormal
    sums, signed zeros and inf/NaN operands (tests/test_shim_gemm.py runs the same on the host)."""
    g = torch.Generator().manual_seed(8)
    e = torch.randint(-75, 64, (2, 130, 37), generator=g).float()
    a = torch.randn(2, 130, 37, generator=g) * torch.exp2(e)
    b = torch.randn(37, 129, generator=g) * torch.exp2(torch.randint(-75, 64, (37, 129), generator=g).float())
    a[0, 0] = torch.exp2(torch.arange(-149.0, -149.0 + 37))
    a[0, 1], a[0, 2] = 0.0, -0.0
    a[0, 3, 5], a[0, 4, 6], a[0, 5, 7], a[1, 7] = float("inf"), -float("inf"), float("nan"), 3e38
    for x, y in ((a, b), (cpd.cast(a, cpd.E4M3), cpd.cast(b, cpd.E4M3)), (torch.randn(3, 65, 1000, generator=g),
                                                                         torch.randn(1000, 66, generator=g))):
        cpu = cpd.matmul(x, y, **kw)
        gpu = cpd.matmul(x.cuda(), y.cuda(), **kw)
        assert _same(cpu, gpu.cpu()), kw


@pytest.mark.cuda
def test_tensor_on_another_device():
    """A tensor on a device that is not the current one launches under its own context."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = _inputs()
    y = cpd.cast(x.to("cuda:1"), cpd.E5M2)
    assert y.device == torch.device("cuda:1") and _same(cpd.cast(x, cpd.E5M2), y.cpu())
