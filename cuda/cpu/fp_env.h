// cpd_cpu: the calling thread's floating-point unit: whether it keeps subnormals (asked at run time
// by the CPU loops that lean on IEEE float32 arithmetic: the wire hops, the matmul's binary32
// lanes), a guard that makes it keep them (KeepSubnormals, around every parallel_for chunk), and
// one that also sets its rounding direction (DirectedRounding, the matmul's directed lanes).
#ifndef CPD_CPU_FP_ENV_H
#define CPD_CPU_FP_ENV_H

#include <cstdint>

#include "cpd/numerics.h"

#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace cpd_cpu {

// Whether this thread's float32 unit keeps subnormals (2^-149 + 2^-149 = 2^-148; under DAZ or
// FTZ, e.g. after torch.set_flush_denormal(True), 0). The control register is per thread, so a
// loop asks on the thread that runs it.
inline bool float32_subnormals_kept() {
  volatile float t = cpd::float_of(1u);
  return cpd::bits_of(t + t) == 2u;
}

// The control register's flush bits, and its type (both guards below).
#if defined(__SSE__) || defined(_M_X64)
using FpControl = unsigned;
constexpr FpControl kFlushBits = 0x8040u;  // MXCSR bit 15 FTZ, bit 6 DAZ
#elif defined(__aarch64__)
using FpControl = uint64_t;
constexpr FpControl kFlushBits = (1ull << 24) | (1ull << 19);  // FPCR FZ, FZ16
#endif

// Keeps subnormals on this thread for its lifetime: clears the flush-to-zero and
// denormals-are-zero modes (x86 MXCSR FTZ and DAZ; Arm FPCR FZ and FZ16) if they are set, and
// restores the register when it ends. Every chunk of cpd_cpu::parallel_for runs under one, so a
// thread that flushes subnormals (torch.set_flush_denormal(True), or a library that set MXCSR)
// computes cpd's exact results all the same: under DAZ a vector load of a float32 subnormal
// operand reads 0, and under FTZ a subnormal float32 sum or product is written as 0, which no
// rounding decision of the core may see. A read of the control register and a compare when
// nothing is set; other architectures: nothing.
class KeepSubnormals {
 public:
  KeepSubnormals() {
#if defined(__SSE__) || defined(_M_X64)
    saved_ = _mm_getcsr();
    if (saved_ & kFlushBits) _mm_setcsr(saved_ & ~kFlushBits);
#elif defined(__aarch64__)
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    if (saved_ & kFlushBits) __asm__ __volatile__("msr fpcr, %0" ::"r"(saved_ & ~kFlushBits));
#endif
  }
  ~KeepSubnormals() {
#if defined(__SSE__) || defined(_M_X64)
    if (saved_ & kFlushBits) _mm_setcsr(saved_);
#elif defined(__aarch64__)
    if (saved_ & kFlushBits) __asm__ __volatile__("msr fpcr, %0" ::"r"(saved_));
#endif
  }
  KeepSubnormals(const KeepSubnormals&) = delete;
  KeepSubnormals& operator=(const KeepSubnormals&) = delete;

 private:
#if defined(__SSE__) || defined(_M_X64) || defined(__aarch64__)
  FpControl saved_ = 0;
#endif
};

// Sets this thread's rounding direction for float32 and float64 arithmetic to one of cpd's
// directed modes (cpd::TOWARD_ZERO, UP, DOWN) and keeps subnormals (as KeepSubnormals) for its
// lifetime, then restores the register it found: x86 MXCSR RC (bits 13-14: 01 down, 10 up,
// 11 toward zero), Arm FPCR RMode (bits 22-23: 01 up, 10 down, 11 toward zero). The vector and
// scalar float instructions (and FMA) round in that direction. kDirectedRounding: whether this
// build can set it (elsewhere the callers keep the generic steps).
// The arithmetic meant to round in the direction must run in a function the guard's holder calls
// and the compiler cannot inline (matmul_directed.h): the compiler assumes round-to-nearest and
// does not order float operations against the register's write, but it cannot move them out of
// a call. Nothing that assumes round-to-nearest may run inside (cpd::directed_lane does not).
#if defined(__SSE__) || defined(_M_X64) || defined(__aarch64__)
constexpr bool kDirectedRounding = true;
#else
constexpr bool kDirectedRounding = false;
#endif

// c + a*b rounded once in this thread's current rounding direction: the FMA instruction, or without
// one (x86-64-v2) (double)a * b + c in float64 and then float32, each rounded in that direction:
// the product is exact in float64, and a directed rounding to float64 then to float32 is the one
// directed rounding to float32 (float32's values are float64 values: accumulate.h, "Directed lanes").
inline float fma_current(float a, float b, float c) {
#if defined(__FMA__) || defined(__aarch64__)
  return __builtin_fmaf(a, b, c);
#else
  return (float)((double)a * (double)b + (double)c);
#endif
}

class DirectedRounding {
 public:
  explicit DirectedRounding(int mode) {
#if defined(__SSE__) || defined(_M_X64)
    saved_ = _mm_getcsr();
    const unsigned rc = mode == cpd::UP ? 0x4000u : mode == cpd::DOWN ? 0x2000u : 0x6000u;
    _mm_setcsr((saved_ & ~(kFlushBits | 0x6000u)) | rc);
#elif defined(__aarch64__)
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t rm = mode == cpd::UP ? 1u : mode == cpd::DOWN ? 2u : 3u;
    const uint64_t set = (saved_ & ~(kFlushBits | (3ull << 22))) | (rm << 22);
    __asm__ __volatile__("msr fpcr, %0" ::"r"(set));
#else
    (void)mode;
#endif
  }
  ~DirectedRounding() {
#if defined(__SSE__) || defined(_M_X64)
    _mm_setcsr(saved_);
#elif defined(__aarch64__)
    __asm__ __volatile__("msr fpcr, %0" ::"r"(saved_));
#endif
  }
  DirectedRounding(const DirectedRounding&) = delete;
  DirectedRounding& operator=(const DirectedRounding&) = delete;

 private:
#if defined(__SSE__) || defined(_M_X64) || defined(__aarch64__)
  FpControl saved_ = 0;
#endif
};

}  // namespace cpd_cpu

#endif  // CPD_CPU_FP_ENV_H
