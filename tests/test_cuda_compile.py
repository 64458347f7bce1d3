"""Every CUDA kernel file compiles through NVRTC, afresh (no cache), at both ends of the installed
NVRTC's range, in NVRTC's fast-compile mode (``-Ofc=max``, NVRTC 12.8 on; a full compile before):
the front end, every template and ``__CUDA_ARCH__`` path, and ptxas's check of every instruction for
that architecture, in seconds. The optimized builds users get, and their registers and local
memory, are tests/test_cuda.py's: at sm_75, sm_80 and sm_90 (a minute each for matmul.cu and
fused_dot.cu, so not again at the ends).
"""

import pytest

from cpd import _cuda

nvrtc = pytest.mark.skipif(not _cuda.available(), reason="cuda-bindings NVRTC not installed")
#: Every kernel source of the package (a new .cu file is checked without a line here).
KERNEL_FILES = sorted(p.name for p in (_cuda.source_dir() / "kernels").glob("*.cu"))


def _archs():
    """The ends of the installed NVRTC's range: the oldest it has from sm_70 on and the newest
    (NVRTC 13 has no sm_70: it is tested only where NVRTC supports it)."""
    have = _cuda.supported_archs() if _cuda.available() else []
    pick = {min((a for a in have if a >= 70), default=None), max(have, default=None)}
    return [f"sm_{a}" for a in sorted(a for a in pick if a in have)]  # oldest first (by number: "sm_121" < "sm_75")


def _fast_options() -> list[bytes]:
    """NVRTC's fastest compile where it has one (``-Ofc``: NVRTC 12.8 on)."""
    return [b"-Ofc=max"] if _cuda.nvrtc_version() >= (12, 8) else []


@nvrtc
@pytest.mark.parametrize("kernel_file", KERNEL_FILES)
def test_kernels_compile(kernel_file):
    """Every kernel file compiles at both ends of NVRTC's range into a cubin (Volta's sm_70 where
    NVRTC 12 has it: compiled here only, its registers not checked)."""
    for arch in _archs():
        src, headers, opts = _cuda._program(kernel_file, arch)
        cubin, _ = _cuda._nvrtc_compile(kernel_file, arch, src, headers, [*opts, *_fast_options()])
        assert cubin[:4] == b"\x7fELF", arch  # a cubin is an ELF image
