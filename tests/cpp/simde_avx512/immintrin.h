// Test-only: <immintrin.h> for tests/cpp/simd_check.cpp built as x86-64-v4 on a host without
// AVX-512 (tests/test_isa_compile.py, test_simd_check_x86_v4_emulated). The build defines
// __AVX512F__ / BW / DQ / VL / CD and SIMDE_NO_NATIVE, and this directory comes first on the include
// path, so that the headers take their AVX-512 paths and every intrinsic is SIMDe's portable C
// (https://github.com/simd-everywhere/simde, MIT; the cmeel-simde wheel of the test extra), which
// follows Intel's definition of each intrinsic (its FMAs excepted: replaced below). The machine
// code is the compiler's x86-64-v3: this checks the AVX-512 paths' logic (lanes, masks, shuffles,
// tails), not the AVX-512 encodings.
#pragma once
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

#include <math.h>

// Fused multiply-adds: SIMDe's portable FMA is a multiply then an add (two roundings); the
// headers' FMAs must round once, so each lane goes through C's fmaf (correctly rounded).
#define CPD_SHIM_FMADD(name, V, n, store, load)                 \
  static inline V name(V a, V b, V c) {                         \
    float x[n], y[n], z[n];                                     \
    store(x, a);                                                \
    store(y, b);                                                \
    store(z, c);                                                \
    for (int i = 0; i < n; ++i) x[i] = fmaf(x[i], y[i], z[i]); \
    return load(x);                                             \
  }
CPD_SHIM_FMADD(cpd_shim_mm512_fmadd_ps, __m512, 16, _mm512_storeu_ps, _mm512_loadu_ps)
CPD_SHIM_FMADD(cpd_shim_mm256_fmadd_ps, __m256, 8, _mm256_storeu_ps, _mm256_loadu_ps)
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps(a, b, c) cpd_shim_mm512_fmadd_ps((a), (b), (c))
#undef _mm256_fmadd_ps
#define _mm256_fmadd_ps(a, b, c) cpd_shim_mm256_fmadd_ps((a), (b), (c))

// What SIMDe 0.8 lacks that the headers use.
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
#ifndef _mm512_cvtps_ph
// VCVTPS2PH zmm: the two halves' F16C conversions (rounding bits 0..2 of r, as the instruction reads them)
#define _mm512_cvtps_ph(a, r)                                                 \
  _mm256_set_m128i(_mm256_cvtps_ph(_mm512_extractf32x8_ps((a), 1), (r) & 7), \
                   _mm256_cvtps_ph(_mm512_castps512_ps256(a), (r) & 7))
#endif
