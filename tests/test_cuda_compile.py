"""Every CUDA kernel file compiles through NVRTC, afresh (no cache), at both ends of the installed
NVRTC's range. A file of its own: these compiles are the suite's longest (about a minute each for
matmul.cu and fused_dot.cu), so that pytest-xdist's --dist loadfile may run them on the other worker
than tests/test_cuda.py's spill checks (on a 2-core host this did not shorten the suite measurably).
"""

import pytest

from cpd import _cuda
from kernel_limits import check_family_kernels

nvrtc = pytest.mark.skipif(not _cuda.available(), reason="cuda-bindings NVRTC not installed")
#: Every kernel source of the package (a new .cu file is checked without a line here).
KERNEL_FILES = sorted(p.name for p in (_cuda.source_dir() / "kernels").glob("*.cu"))


def _archs():
    """The ends of the installed NVRTC's range: the oldest it has from sm_70 on and the newest
    (NVRTC 13 has no sm_70: it is tested only where NVRTC supports it); test_compile_is_cached
    adds sm_80. Each compile takes seconds, so the middle is left out."""
    have = _cuda.supported_archs() if _cuda.available() else []
    pick = {min((a for a in have if a >= 70), default=None), max(have, default=None)}
    return [f"sm_{a}" for a in sorted(a for a in pick if a in have)]  # oldest first (by number: "sm_121" < "sm_75")


@nvrtc
@pytest.mark.parametrize("kernel_file", KERNEL_FILES)
def test_kernels_compile(kernel_file, tmp_path, monkeypatch):
    """Every kernel file compiles at both ends of NVRTC's range. matmul.cu's oldest end (sm_70 or
    sm_75: no cp.async) is compiled with ptxas's report, which shows that the GEMM family kernels'
    register-staged copies (matmul.cu family_gemm, cpd/launch.h CPD_COPY_ASYNC) fit in their 128
    registers (SR: 255, one block per SM) within tests/kernel_limits.py's local memory at sm_75
    (sm_80 / sm_90: tests/test_cuda.py test_gemm_family_kernels_do_not_spill). At sm_70 (NVRTC 12
    only) several families spill (60 bytes for LANES, 228 for the chain): not checked, open."""
    monkeypatch.setenv("CPD_CACHE_DIR", str(tmp_path))
    for i, arch in enumerate(_archs()):
        if kernel_file == "matmul.cu" and i == 0:
            usage = _cuda.resource_usage(kernel_file, arch)  # compiles (fresh cache), keeps the cubin
            # Volta (sm_70, NVRTC 12 only) spills in several families: open
            check_family_kernels(usage, arch, local=int(arch[3:]) >= 75)
            cubin = _cuda.compile_source(kernel_file, arch)
        else:
            cubin = _cuda.compile_source(kernel_file, arch, use_cache=False)
        assert cubin[:4] == b"\x7fELF", arch  # a cubin is an ELF image
