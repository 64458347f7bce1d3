"""Vector code of every ISA level compiles, including levels this host cannot run (issue 13).

Invariants defended:
* ``tests/cpp/simd_check.cpp`` (vector Philox, the lane roundings and the matmul's register
  chains against the numerics core, no torch) passes when built for each x86 level the host
  runs, and for aarch64 where a cross compiler is installed (``apt-get install
  g++-aarch64-linux-gnu``; run under ``qemu-aarch64`` when ``qemu-user`` is installed, otherwise
  compiled only);
* x86-64-v4's paths run on a host without AVX-512 too: simd_check with SIMDe's portable AVX-512
  intrinsics (test-only headers, the cmeel-simde wheel);
* ``benchmarks/cycles_cast.cpp`` (the cast loops' cycles per element) builds and runs;
* levels the host cannot run are compile-checked: the extension's vector sources for
  ``x86-64-v4`` and for ``armv8.2-a`` (cross compiler), with ``static_assert`` on the vector paths
  their headers pick.

A file of its own (from tests/test_isa_levels.py) so that pytest-xdist runs these compiles on one
worker while the other builds and tests the levels.
"""

import shutil
from pathlib import Path

import pytest

from cpd import _cpu
from isa_util import HOST, ROOT, X86, run, runs


# ------------------------------------------------------------------------------------ simd_check
def _simd_check(cxx, flags, tmp_path, runner=()):
    exe = tmp_path / "simd_check"
    cmd = [cxx, "-std=c++17", "-O2", *flags, "-ffp-contract=off", "-fno-fast-math", "-I", str(ROOT / "cuda/include"),
           "-I", str(ROOT / "cuda/cpu"), str(ROOT / "tests/cpp/simd_check.cpp"), "-o", str(exe)]
    r = run(cmd, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    if runner is None:
        return None
    r = run([*runner, str(exe)], timeout=600)
    assert r.returncode == 0 and "ok (0 mismatches)" in r.stdout, r.stdout[-3000:]
    return r.stdout.splitlines()[0]


@pytest.mark.skipif(not X86 or shutil.which("g++") is None, reason="x86-64 levels with g++")
@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3", "x86-64-v4", "native"])
def test_simd_check_x86(level, tmp_path):
    if level != "native" and not runs(level):
        pytest.skip(f"this CPU runs up to {HOST}")
    if level == "native" and HOST == "x86-64-v3":
        # the headers branch on nothing past x86-64-v3 but AVX-512 (F, FP16): x86-64-v3 runs these paths
        pytest.skip("native takes x86-64-v3's paths here")
    first = _simd_check("g++", [f"-march={level}"], tmp_path)
    assert first.startswith("simd_check: ")


def _simde_include():
    """The directory holding SIMDe's headers (simde/x86/avx512.h): the cmeel-simde wheel of the
    test extra, or a system install (apt-get install libsimde-dev); None when neither is there."""
    import sysconfig

    for d in (Path(sysconfig.get_paths()["purelib"]) / "cmeel.prefix" / "include", Path("/usr/include")):
        if (d / "simde" / "x86" / "avx512.h").is_file():
            return d
    return None


@pytest.mark.skipif(not X86 or shutil.which("g++") is None, reason="x86-64 levels with g++")
def test_simd_check_x86_v4_emulated(tmp_path):
    """x86-64-v4's vector paths (the AVX-512 Philox of both forms, the fused stochastic cast's
    32-block calls, the zmm binary16 lanes, the matmul's zmm register chains) run on a host
    without AVX-512: simd_check built with the AVX-512 macros defined and every intrinsic from
    SIMDe's portable C (tests/cpp/simde_avx512/immintrin.h). Checks the paths' logic, not the
    instructions' encodings; an AVX-512 host runs the real thing in
    test_simd_check_x86[x86-64-v4]."""
    if runs("x86-64-v4"):
        pytest.skip("this CPU runs x86-64-v4 itself (test_simd_check_x86)")
    inc = _simde_include()
    if inc is None:
        pytest.skip("no SIMDe headers (pip install cmeel-simde, in the test extra)")
    avx512 = [f"-D__AVX512{x}__" for x in ("F", "BW", "DQ", "VL", "CD")]
    # -O0 (after _simd_check's -O2): SIMDe's headers take 18 s to optimize, 6 s not to; same bits
    first = _simd_check("g++", ["-O0", "-march=x86-64-v3", *avx512, "-DSIMDE_NO_NATIVE", "-Wno-psabi", "-I",
                                str(ROOT / "tests/cpp/simde_avx512"), "-I", str(inc)], tmp_path)
    assert first == "simd_check: avx512"


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="no aarch64 cross compiler (apt-get install g++-aarch64-linux-gnu)")
@pytest.mark.parametrize("arch", ["armv8-a", "armv8.2-a"])
def test_simd_check_aarch64(arch, tmp_path):
    qemu = shutil.which("qemu-aarch64")
    first = _simd_check("aarch64-linux-gnu-g++", [f"-march={arch}", "-static"], tmp_path,
                        runner=(qemu,) if qemu else None)
    assert first is None or first == "simd_check: neon"


@pytest.mark.skipif(not X86 or shutil.which("g++") is None, reason="x86-64 (rdtsc) with g++")
def test_cycles_cast_benchmark_runs(tmp_path):
    """benchmarks/cycles_cast.cpp (the cast loops' cycles per element, for A/B runs of two
    checkouts) builds against the headers and prints its table (two repetitions: no timing here)."""
    exe = tmp_path / "cycles_cast"
    r = run(["g++", "-std=c++17", "-O1", "-march=x86-64-v3" if runs("x86-64-v3") else "-march=x86-64-v2",
             "-ffp-contract=off", "-fno-fast-math", "-I", str(ROOT / "cuda/include"), "-I", str(ROOT / "cuda/cpu"),
             str(ROOT / "benchmarks/cycles_cast.cpp"), "-o", str(exe)], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run([str(exe), "2"], timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("cycles_cast: "), r.stdout + r.stderr
    for name in ("e5m2", "e4m3", "fp16", "bf16"):
        assert f"{name} stochastic " in r.stdout


# ------------------------------------------------------------------------------------ compile only
# Targets this host cannot run: the whole extension (cuda/cpu/*.cpp against torch's headers) must
# compile for them, and the headers must pick the vector paths named here (static_assert in a
# probe, no torch): x86-64-v4 (AVX-512 without AVX512-FP16) takes the AVX-512 Philox (the code the
# earlier AVX-512 machine tested, test_vector_philox_words and simd_check there) and the float32
# matmul lanes rounded by F16C and the binary16 register chain (the sources tested at x86-64-v3
# here), never the AVX512-FP16 loop;
# aarch64 takes the NEON Philox and FCVT lanes (simd_check above runs them under qemu-aarch64).
COMPILE_ONLY = [("x86_64", "x86-64-v4", "g++", "avx512"), ("aarch64", "armv8.2-a", "aarch64-linux-gnu-g++", "neon")]

PROBE = """#include <string_view>
#include "matmul_chain.h"
#include "matmul_f32.h"
#include "matmul_h16.h"
#include "matmul_fchain.h"
#include "matmul_sr.h"
#include "philox_simd.h"
static_assert(std::string_view(cpd_cpu::isa_name()) == "%s", "vector ISA");
static_assert(CPD_CPU_H16_CHAIN == %d, "the binary16 register chain: x86 (AVX2 + F16C or AVX-512F) only");
static_assert(CPD_CPU_F16_LANES == 1, "binary16 rounding by conversion");
static_assert(CPD_CPU_HW_FMA == 1 && CPD_CPU_CHAIN == 1, "binary32 lanes: FMA instructions, the register chain");
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
    probe.write_text(PROBE % (isa, isa == "avx512"))
    flags = [f for f in _cpu.build_flags(machine, "gcc", arch).cflags if f != "-fopenmp"]
    r = run([cxx, "-std=c++17", "-fsyntax-only", *flags, "-I", str(ROOT / "cuda/include"), "-I",
              str(ROOT / "cuda/cpu"), str(probe)], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def _vector_sources():
    """The extension's sources with code per ISA (they include the vector headers or intrinsics);
    the others are the same code on every target and compile in the host's build."""
    marks = ("philox_simd.h", "matmul_f32.h", "matmul_sr.h", "matmul_chain.h", "matmul_h16.h", "matmul_fchain.h",
             "immintrin.h", "arm_neon.h", "__AVX", "__ARM_NEON")
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
        return src.name, run(cmd, timeout=1200)

    with ThreadPoolExecutor(2) as pool:
        for name, r in pool.map(compile_one, _vector_sources()):
            assert r.returncode == 0, f"{name}: {r.stderr[-3000:]}"
