"""Every ISA level the CPU extension is built for gives the same bits (issue 13).

Invariants defended:
* the vector Philox of the loaded build (AVX-512, AVX2, SSE4.1, NEON or scalar) gives
  philox4x32_10's words bit for bit, in element order and strided, also across 2^32 block numbers
  (x86-64-v2's build runs this test too: the SSE4.1 Philox);
* the extension built for ``x86-64-v2`` (SSE4.2, and without OpenMP: threads through ATen's
  pool), for ``x86-64-v3`` (AVX2 + FMA + F16C) and, on an AVX-512 host, for ``x86-64-v4``, each
  in its own cache, passes the numerics tests
  that compare its cast, arithmetic and every matmul lane with the generic path and with exact
  oracles (one subprocess per level running a focused pytest selection with ``CPD_CPU_ARCH``;
  the host's own build runs the whole suite);
* ``tests/cpp/simd_check.cpp`` (vector Philox and the lane roundings against the numerics core,
  no torch) passes when built for each x86 level the host runs, and for aarch64 where a cross
  compiler is installed (``apt-get install g++-aarch64-linux-gnu``; run under ``qemu-aarch64``
  when ``qemu-user`` is installed, otherwise compiled only);
* levels the host cannot run are compile-checked: the whole extension for ``x86-64-v4`` and for
  ``armv8.2-a`` (cross compiler), with ``static_assert`` on the vector paths their headers pick.
"""

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cpd
from cpd import _cpu

ROOT = Path(__file__).resolve().parent.parent
X86 = _cpu.machine_kind(platform.machine()) == "x86_64"
HOST = _cpu.host_level() if X86 else None


def _low_priority():
    """Builds and the level runs are CPU-bound background work: at nice 10 they get about a tenth of
    a core against each busy process of the rest of the suite (with pytest-xdist, the other
    worker may be running real processes with timeouts: tests/test_distributed.py), and the idle
    cores otherwise."""
    os.nice(10)


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_low_priority, **kw)


def _runs(level):
    return X86 and _cpu.X86_LEVELS.index(level) <= _cpu.X86_LEVELS.index(HOST)


# ------------------------------------------------------------------------------------ the loaded build
@pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")
@pytest.mark.parametrize("start", [0, 3, 2**32 - 5, 2**40 + 7])
@pytest.mark.parametrize("seed,offset", [(0, 0), (0x1234567890ABCDEF, 0x0FEDCBA987654321), (-1, 5)])
def test_vector_philox_words(start, seed, offset):
    ext = _cpu.extension()
    for n in (0, 1, 15, 16, 17, 33, 64, 70):
        got = torch.empty(4 * n, dtype=torch.int32)
        ext.philox_simd_out(got, start, 1, n, seed, offset, False)
        assert torch.equal(got.to(torch.int64) & 0xFFFFFFFF, cpd.ops.random_words(4 * start, 4 * n, seed, offset)), n
        for stride in (1, 2, 194, 2**33 + 1):
            ext.philox_simd_out(got, start, stride, n, seed, offset, True)
            words = (got.to(torch.int64) & 0xFFFFFFFF).reshape(4, n)
            for i in range(n):
                b = (start + i * stride) % 2**64
                want = cpd.ops.random_words(4 * b, 4, seed, offset) if 4 * b < 2**63 else None
                if want is not None:
                    assert torch.equal(words[:, i], want), (n, stride, i)


@pytest.mark.skipif(_cpu.extension() is None, reason="no compiled extension")
def test_build_reports_its_isa():
    isa = _cpu.extension().isa()
    assert isa.split(",")[0] in ("avx512+fp16", "avx512", "avx2+fma", "avx2", "sse4.2", "neon", "scalar")
    info = _cpu.build_info()
    assert info["isa"] == isa and info["target"]


# ------------------------------------------------------------------------------------ other levels
# The numerics tests each level's build must pass: casts against torch's own, stochastic decisions
# against exact ones, exact arithmetic, and every matmul loop against the generic one.
SELECTION = [
    "tests/test_isa_levels.py::test_vector_philox_words",
    "tests/test_isa_levels.py::test_build_reports_its_isa",
    "tests/test_native.py::test_every_16_bit_value",
    "tests/test_stochastic.py",
    "tests/test_cast_stream.py",
    "tests/test_arith_fast.py",
    "tests/test_matmul.py::test_float32_lane_path_equals_generic_path",
    "tests/test_matmul.py::test_fused_lane_path_equals_generic_path",
    "tests/test_matmul.py::test_fast_path_equals_generic_path",
    "tests/test_matmul.py::test_matches_exact_reference",
    "tests/test_matmul.py::test_thread_count_independent",
]
LEVELS = [("x86-64-v2", "0"), ("x86-64-v3", "1"), ("x86-64-v4", "1")]  # (CPD_CPU_ARCH, CPD_CPU_OPENMP)


@pytest.mark.skipif(not X86, reason="x86-64 levels")
@pytest.mark.parametrize("level,openmp", LEVELS, ids=[lv for lv, _ in LEVELS])
def test_numerics_at_level(level, openmp):
    if not _runs(level):
        pytest.skip(f"this CPU runs up to {HOST}")
    env = {**os.environ, "CPD_CPU_ARCH": level, "CPD_CPU_OPENMP": openmp, "PYTHONPATH": str(ROOT),
           "_CPD_CPU_CORE_ONLY": "1"}  # the selection needs cast, arith and matmul, not the op libraries
    env.pop("CPD_NO_EXTENSION", None)
    check = ("import cpd._cpu as c; e = c.extension(); assert e is not None, 'no build'; "
             "print(c.build_info()['target'], '|', e.isa())")
    r = _run([sys.executable, "-c", check], env=env, cwd=ROOT, timeout=3600)  # a build at low priority
    assert r.returncode == 0, r.stderr[-3000:]
    target, isa = r.stdout.strip().splitlines()[-1].split(" | ")
    assert target == level
    assert isa.startswith({"x86-64-v2": "sse4.2", "x86-64-v3": "avx2+fma", "x86-64-v4": "avx512"}[level])
    assert ("no OpenMP" in isa) == (openmp == "0")
    r = _run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *SELECTION], env=env,
             cwd=ROOT, timeout=3600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


# ------------------------------------------------------------------------------------ simd_check
def _simd_check(cxx, flags, tmp_path, runner=()):
    exe = tmp_path / "simd_check"
    cmd = [cxx, "-std=c++17", "-O2", *flags, "-ffp-contract=off", "-fno-fast-math", "-I", str(ROOT / "cuda/include"),
           "-I", str(ROOT / "cuda/cpu"), str(ROOT / "tests/cpp/simd_check.cpp"), "-o", str(exe)]
    r = _run(cmd, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    if runner is None:
        return None
    r = _run([*runner, str(exe)], timeout=600)
    assert r.returncode == 0 and "ok (0 mismatches)" in r.stdout, r.stdout[-3000:]
    return r.stdout.splitlines()[0]


@pytest.mark.skipif(not X86 or shutil.which("g++") is None, reason="x86-64 levels with g++")
@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "x86-64-v4", "native"])
def test_simd_check_x86(level, tmp_path):
    if level != "native" and not _runs(level):
        pytest.skip(f"this CPU runs up to {HOST}")
    first = _simd_check("g++", [f"-march={level}"], tmp_path)
    assert first.startswith("simd_check: ")


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="no aarch64 cross compiler (apt-get install g++-aarch64-linux-gnu)")
@pytest.mark.parametrize("arch", ["armv8-a", "armv8.2-a"])
def test_simd_check_aarch64(arch, tmp_path):
    qemu = shutil.which("qemu-aarch64")
    first = _simd_check("aarch64-linux-gnu-g++", [f"-march={arch}", "-static"], tmp_path,
                        runner=(qemu,) if qemu else None)
    assert first is None or first == "simd_check: neon"


# ------------------------------------------------------------------------------------ compile only
# Targets this host cannot run: the whole extension (cuda/cpu/*.cpp against torch's headers) must
# compile for them, and the headers must pick the vector paths named here (static_assert in a
# probe, no torch): x86-64-v4 (AVX-512 without AVX512-FP16) takes the AVX-512 Philox (the code the
# earlier AVX-512 machine tested, test_vector_philox_words and simd_check there) and the float32
# matmul lanes rounded by F16C (the source tested at x86-64-v3 here), never the AVX512-FP16 loop;
# aarch64 takes the NEON Philox and FCVT lanes (simd_check above runs them under qemu-aarch64).
COMPILE_ONLY = [("x86_64", "x86-64-v4", "g++", "avx512"), ("aarch64", "armv8.2-a", "aarch64-linux-gnu-g++", "neon")]

PROBE = """#include <string_view>
#include "matmul_f32.h"
#include "philox_simd.h"
static_assert(std::string_view(cpd_cpu::isa_name()) == "%s", "vector ISA");
static_assert(CPD_CPU_F16_LANES == 1, "binary16 rounding by conversion");
#if defined(__AVX512FP16__)
#error "the AVX512-FP16 loop is for another level"
#endif
"""


def _compile_only_skip(machine, cxx):
    if shutil.which(cxx) is None:
        pytest.skip(f"no {cxx}" + (" (apt-get install g++-aarch64-linux-gnu)" if machine == "aarch64" else ""))
    if machine == "x86_64" and not X86:
        pytest.skip("x86-64 targets with the host's g++")


@pytest.mark.parametrize("machine,arch,cxx,isa", COMPILE_ONLY, ids=[a for _, a, _, _ in COMPILE_ONLY])
def test_vector_paths_chosen_for(machine, arch, cxx, isa, tmp_path):
    _compile_only_skip(machine, cxx)
    probe = tmp_path / "probe.cpp"
    probe.write_text(PROBE % isa)
    flags = [f for f in _cpu.build_flags(machine, "gcc", arch).cflags if f != "-fopenmp"]
    r = _run([cxx, "-std=c++17", "-fsyntax-only", *flags, "-I", str(ROOT / "cuda/include"), "-I",
              str(ROOT / "cuda/cpu"), str(probe)], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def _vector_sources():
    """The extension's sources with code per ISA (they include the vector headers or intrinsics);
    the others are the same code on every target and compile in the host's build."""
    marks = ("philox_simd.h", "matmul_f32.h", "immintrin.h", "arm_neon.h", "__AVX", "__ARM_NEON")
    return [p for p in sorted((ROOT / "cuda/cpu").glob("*.cpp")) if any(m in p.read_text() for m in marks)]


def test_vector_sources_found():
    assert {p.name for p in _vector_sources()} >= {"cast.cpp", "matmul.cpp"}


@pytest.mark.parametrize("machine,arch,cxx,isa", COMPILE_ONLY, ids=[a for _, a, _, _ in COMPILE_ONLY])
def test_extension_compiles_for(machine, arch, cxx, isa, tmp_path):
    """The extension's sources with code per ISA compile (-O0: the intrinsics and the paths, not
    the code) with the flags cpd would build it with on that machine (a minute or two of CPU, so
    not the ISA-independent sources: docs/performance.md gives the loop over all of them)."""
    _compile_only_skip(machine, cxx)
    import sysconfig
    from concurrent.futures import ThreadPoolExecutor

    from torch.utils.cpp_extension import include_paths

    flags = [f if f != "-O3" else "-O0" for f in _cpu.build_flags(machine, "gcc", arch).cflags]
    inc = ["-I", str(ROOT / "cuda/include"), "-I", str(ROOT / "cuda/cpu")]
    for p in [*include_paths(), sysconfig.get_paths()["include"]]:
        inc += ["-isystem", p]

    def compile_one(src):
        cmd = [cxx, "-std=c++20", "-fPIC", *flags, "-DTORCH_EXTENSION_NAME=cpd_cpu_check",
               "-DTORCH_API_INCLUDE_EXTENSION_H", *inc, "-c", str(src), "-o", str(tmp_path / (src.stem + ".o"))]
        return src.name, _run(cmd, timeout=1200)

    with ThreadPoolExecutor(2) as pool:
        for name, r in pool.map(compile_one, _vector_sources()):
            assert r.returncode == 0, f"{name}: {r.stderr[-3000:]}"
