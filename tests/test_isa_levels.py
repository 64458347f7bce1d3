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
* the vector code of every level compiles: tests/test_isa_compile.py.
"""

import os
import sys

import pytest
import torch

import cpd
from cpd import _cpu
from isa_util import HOST, ROOT, X86, run, runs


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
    "tests/test_cast_fused_sr.py",
    "tests/test_arith_fast.py",
    "tests/test_matmul.py::test_float32_lane_path_equals_generic_path",
    "tests/test_matmul.py::test_fused_lane_path_equals_generic_path",
    "tests/test_matmul.py::test_fast_path_equals_generic_path",
    "tests/test_matmul.py::test_matches_exact_reference",
    "tests/test_matmul.py::test_thread_count_independent",
    "tests/test_matmul_guard.py::test_guarded_kahan_equals_generic_path",
    "tests/test_matmul_b32.py",
    "tests/test_matmul_sr_lanes.py",
    "tests/test_matmul_directed.py::test_equals_generic",  # x86-64-v2: the fused step in float64, no FMA
    "tests/test_matmul_directed.py::test_hypothesis_values",
    "tests/test_arith_lanes.py::test_lanes_equal_generic",
]
LEVELS = [("x86-64-v2", "0"), ("x86-64-v3", "1"), ("x86-64-v4", "1")]  # (CPD_CPU_ARCH, CPD_CPU_OPENMP)
ISA_OF = {"x86-64-v2": "sse4.2", "x86-64-v3": "avx2+fma", "x86-64-v4": "avx512"}


def _same_as_native(level: str) -> bool:
    """Whether the suite's own build (native, with OpenMP) has exactly ``level``'s vector ISA, i.e.
    the same code paths (an AVX2 host's native build is x86-64-v3's; an AVX-512 host with
    AVX512-FP16 builds other binary16 loops than x86-64-v4): then the level's build adds nothing
    the whole suite does not already test, for half of the suite's CPU time (issue 32)."""
    if _cpu.target() != "native" or _cpu.forced_fallback():
        return False
    ext = _cpu.extension()
    return ext is not None and ext.isa() == ISA_OF[level]


@pytest.mark.skipif(not X86, reason="x86-64 levels")
@pytest.mark.parametrize("level,openmp", LEVELS, ids=[lv for lv, _ in LEVELS])
def test_numerics_at_level(level, openmp):
    if not runs(level):
        pytest.skip(f"this CPU runs up to {HOST}")
    if level == HOST and openmp == "1" and _same_as_native(level):
        pytest.skip(f"the host's own build is {level}'s vector ISA ({ISA_OF[level]}, OpenMP): the whole suite tests it")
    env = {**os.environ, "CPD_CPU_ARCH": level, "CPD_CPU_OPENMP": openmp, "PYTHONPATH": str(ROOT),
           "_CPD_CPU_CORE_ONLY": "1"}  # the selection needs cast, arith and matmul, not the op libraries
    env.pop("CPD_NO_EXTENSION", None)
    check = ("import cpd._cpu as c; e = c.extension(); assert e is not None, 'no build'; "
             "print(c.build_info()['target'], '|', e.isa())")
    r = run([sys.executable, "-c", check], env=env, cwd=ROOT, timeout=3600)  # a build at low priority
    assert r.returncode == 0, r.stderr[-3000:]
    target, isa = r.stdout.strip().splitlines()[-1].split(" | ")
    assert target == level
    assert isa.startswith(ISA_OF[level])
    assert ("no OpenMP" in isa) == (openmp == "0")
    r = run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *SELECTION], env=env,
             cwd=ROOT, timeout=3600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
