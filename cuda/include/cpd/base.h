// cpd numerics core, base.h: Types, the host/device function macro, bit casts, branch-free selects, exact float ops.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
#ifndef CPD_BASE_H
#define CPD_BASE_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CPD_FN __host__ __device__ __forceinline__
#define CPD_DEVICE 1
#else
#define CPD_FN static inline __attribute__((always_inline))
#define CPD_DEVICE 0
#endif

namespace cpd {

typedef unsigned int u32;
typedef unsigned long long u64;

// Rounding modes and special-value conventions: the integers of cpd/rounding.py and
// cpd/formats.py (Rounding.code, Specials.code).
enum { NEAREST = 0, STOCHASTIC = 1, TOWARD_ZERO = 2, UP = 3, DOWN = 4 };
enum { SPECIALS_IEEE = 0, SPECIALS_FN = 1, SPECIALS_FINITE = 2 };

const u32 SIGN = 0x80000000u;
const u32 INF_BITS = 0x7f800000u;
const u32 QNAN_BITS = 0x7fc00000u;

CPD_FN u32 bits_of(float f) {
#if CPD_DEVICE
  return __float_as_uint(f);
#else
  u32 u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

CPD_FN float float_of(u32 u) {
#if CPD_DEVICE
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

CPD_FN int imax(int a, int b) { return a > b ? a : b; }
CPD_FN int imin(int a, int b) { return a < b ? a : b; }

// Branch-free selects: c ? a : b with c in {0, 1}, written as bit arithmetic so that compilers
// keep the hot loops straight-line (GCC's if-conversion gives up on long chains of ?:).
//   mask = -c = 111...1 (c = 1) or 000...0 (c = 0);  b ^ ((a ^ b) & mask)
CPD_FN u32 sel(u32 c, u32 a, u32 b) { return b ^ ((a ^ b) & (0u - c)); }
CPD_FN int seli(u32 c, int a, int b) { return (int)sel(c, (u32)a, (u32)b); }

// Float adds that must round to nearest even as written (no contraction, no FTZ): the host
// build has -ffp-contract=off and no fast-math; on the device the intrinsic says so.
CPD_FN float fadd(float x, float y) {
#if CPD_DEVICE
  return __fadd_rn(x, y);
#else
  return x + y;
#endif
}
CPD_FN float fsub(float x, float y) {
#if CPD_DEVICE
  return __fsub_rn(x, y);
#else
  return x - y;
#endif
}
CPD_FN float fmul(float x, float y) {
#if CPD_DEVICE
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}

}  // namespace cpd

#endif  // CPD_BASE_H
