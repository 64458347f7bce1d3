// cpd numerics core, fused_dot.h: the fused dot product of matrix units (tensor cores): products
// exact, aligned to the largest exponent of the group (accumulator included), truncated to F
// fractional bits, summed exactly, the sum rounded once to the output by the architecture's rule.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
//
// The model (MMA-Sim, Xie et al., arXiv 2511.10909, whose simulator was checked bit for bit against
// Volta..Blackwell hardware; the same features in Khattak & Mikaitis, arXiv 2512.07004, and Fasi et
// al., "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021). One instruction step computes
//     d = round_out(c + a_1 b_1 + ... + a_L b_L)
// as follows, every term t (c and each product) carrying an exponent e(t):
//   1. e(x) of an operand: floor(log2 |x|), raised to the exponent floor of x's format (subnormals
//      sit at emin); a zero operand has e = zero_exp (-126). e(a b) = e(a) + e(b); e(c) uses the
//      accumulator's floor (-126 for float32, -14 for binary16).
//   2. emax = max over the L products and c.
//   3. Each term is cut to F fractional bits below 2^emax, toward zero (sign-magnitude truncation):
//          T = trunc(|t| * 2^(F - emax))  (an integer < 2^(F+2)),  with t's sign.
//   4. S = sum of the signed T: exact (integers). The step's value is S * 2^(emax - F).
//   5. round_out: RZ to float32 (23 fraction bits, subnormals), RZ to E8M13 (13 fraction bits, the
//      float32 exponent range: Hopper and Ada FP8 into FP32) or RNE to binary16; a magnitude
//      >= 2^128 (float32 outputs) or beyond binary16's range after rounding is infinite.
//      An exact zero is +0.
//   Non-finite operands: if c + sum a_k b_k evaluated in float64 is NaN, d is the canonical NaN of
//   the output (float32 0x7fffffff; binary16 0x7fff, i.e. float32 0x7fffe000); if it is +-inf, d
//   is +-inf.
// A GEMM of depth K chains steps over k-groups of L in k order from c = +0 (the last group may be
// shorter: a zero product has e <= 2 zero_exp < e(c), so padding never changes emax).
//
// Three forms, the same bits (tests/test_tensor_core.py compares them):
//   fused_dot_step   the specification on integers (float32 bits in), used by the CUDA kernel and
//                    the CPU's generic loop;
//   FdCarrier<T>     the CPU's vectorized form on float64 (any input format) or float32 carriers
//                    (fd_float_applies: narrow inputs and small F), where products, scalings by
//                    powers of two, truncations and the sums are all exact.
#ifndef CPD_FUSED_DOT_H
#define CPD_FUSED_DOT_H

#include "cpd/arith.h"
#include "cpd/accumulate.h"

namespace cpd {

enum { FD_OUT_F32 = 0, FD_OUT_E8M13 = 1, FD_OUT_F16 = 2 };

// The step algorithms (FusedDotSpec::algo); the first is the model above, the others are written
// out before their step functions below.
//   FD_NV           NVIDIA tensor cores (Volta..Blackwell), with optional block scales (mxf8f6f4)
//   FD_AMD_PAIRWISE AMD CDNA1/CDNA2 fp16/bf16 MFMA: float32 products, pairwise float32 sums
//   FD_AMD_RD       AMD CDNA3 fp16/bf16/xf32 MFMA: fused sum, then round-down alignment with c
//   FD_AMD_RD_FP8   AMD CDNA3 fp8/bf8 MFMA: the same with even/odd halves and a cut-off c
//   FD_NV_CHUNK16   NVIDIA Blackwell mxf4nvf4: exact 16-element chunk sums aligned by their scales
enum { FD_NV = 0, FD_AMD_PAIRWISE = 1, FD_AMD_RD = 2, FD_AMD_RD_FP8 = 3, FD_NV_CHUNK16 = 4 };

struct FusedDotSpec {
  int group;     // L >= 1: products per step
  int frac;      // F, 0..40: fractional bits kept below 2^emax
  int out;       // FD_OUT_*
  int a_emin;    // exponent floors of a's and b's formats (>= -126)
  int b_emin;
  int c_emin;    // exponent floor of the accumulator: -126 (float32, E8M13) or -14 (binary16)
  int zero_exp;  // e of a zero operand
  int algo;      // FD_NV, FD_AMD_*, FD_NV_CHUNK16
  int ftz;       // FD_AMD_PAIRWISE: flush subnormal inputs, products and sums (CDNA2)
  Format of;     // the output format (float32, E8M13 or binary16 on float32 bits)
};

// Block scales of one output's operands (block-scaled MMA): a's scale of element k is
// a[((k0 + k) / block) * as], b's likewise; a == 0: no scales. A scale S (a positive float32:
// E8M0's 2^-127 is a float32 subnormal) contributes e(S) = max(floor(log2 S), emin) to a term's
// exponent, with emin the scale format's (-127 for E8M0, -6 for UE4M3), and its significand
// S 2^-e(S) to the term's value (1 for E8M0).
struct FdScales {
  const float* a;
  long long as;
  const float* b;
  long long bs;
  int block;
  int emin;
};

CPD_FN FdScales fd_no_scales() {
  FdScales x;
  x.a = 0;
  x.b = 0;
  x.as = x.bs = 0;
  x.block = 1;
  x.emin = -127;
  return x;
}

CPD_FN FusedDotSpec make_fused_dot_spec(int group, int frac, int out, int a_emin, int b_emin, int zero_exp, int algo,
                                        int ftz) {
  FusedDotSpec s;
  s.group = group;
  s.frac = frac;
  s.out = out;
  s.a_emin = a_emin;
  s.b_emin = b_emin;
  s.c_emin = out == FD_OUT_F16 ? -14 : -126;
  s.zero_exp = zero_exp;
  s.algo = algo;
  s.ftz = ftz;
  s.of = out == FD_OUT_F16 ? make_format(5, 10, 15, SPECIALS_IEEE, 1, 0)
       : out == FD_OUT_E8M13 ? make_format(8, 13, 127, SPECIALS_IEEE, 1, 0)
                             : make_format(8, 23, 127, SPECIALS_IEEE, 1, 0);
  return s;
}

// e(x) of step 1 for a finite float32 (bits u): floor(log2|x|) raised to emin; zero_exp for zero.
// Every floor here is >= -126, so a float32 subnormal (field 0, |x| < 2^-126) sits at emin, and
// e = max(field - 127, emin) needs no leading-zero count (branch-free: the CPU loops vectorize).
CPD_FN int fd_exp(u32 u, int emin, int zero_exp) {
  u32 a = u & ~SIGN;
  return seli((u32)(a == 0u), zero_exp, imax((int)(a >> 23) - 127, emin));
}

// T of step 3 for the exact value P * 2^q (P < 2^49): trunc(P * 2^(q + F - emax)).
CPD_FN u64 fd_cut(u64 P, int q, int frac, int emax) {
  int sh = emax - frac - q;
  if (sh >= 64) return 0ull;
  return sh >= 0 ? P >> sh : P << (-sh);  // -sh small: the result is < 2^(F+2) <= 2^42
}

CPD_FN u32 fd_canonical_nan(int out) { return out == FD_OUT_F16 ? 0x7fffe000u : 0x7fffffffu; }

// S * 2^e (S signed, nonzero, exact) as a Wide for round_wide.
CPD_FN Wide fd_wide(long long S, int e) {
  Wide w;
  w.sign = S < 0 ? SIGN : 0u;
  w.S = (u64)(S < 0 ? -S : S);
  w.e = e;
  w.sticky = 0u;
  return w;
}

// Step 5: round S * 2^e (S signed, exact) to the output; float32 bits out.
CPD_FN u32 fd_round_out(long long S, int e, const FusedDotSpec& s) {
  if (S == 0) return 0u;
  Wide w = fd_wide(S, e);
  if (s.out != FD_OUT_F16 && top_bit64(w.S) + e >= 128) return w.sign | INF_BITS;  // past float32's range
  u32 r = round_wide(w, s.of, s.out == FD_OUT_F16 ? NEAREST : TOWARD_ZERO, 0u, 32);
  return (r & ~SIGN) == 0u ? 0u : r;  // a result that rounds to zero is +0
}

// The scales of element k of a step starting at k0 (FdScales); 1 where there are none.
CPD_FN float fd_scale_a(const FdScales& x, long long k0, int k) { return x.a ? x.a[((k0 + k) / x.block) * x.as] : 1.0f; }
CPD_FN float fd_scale_b(const FdScales& x, long long k0, int k) { return x.b ? x.b[((k0 + k) / x.block) * x.bs] : 1.0f; }
CPD_FN int fd_scale_exp(float S, const FdScales& x) { return fd_exp(bits_of(S), x.emin, x.emin); }

// Non-finite operands (elements, scales or c): float64 tells NaN from +-inf (every product of
// float32 values, times two scales, is exact there). Returns 1 and sets *r when they occur.
CPD_FN int fd_special(const float* a, long long as, const float* b, long long bs, int n, u32 c, const FdScales& x,
                      long long k0, u32 nan_bits, u32* r) {
  u32 finite = is_finite_bits(c);
  for (int k = 0; k < n; ++k)
    finite &= is_finite_bits(bits_of(a[k * as])) & is_finite_bits(bits_of(b[k * bs])) &
              is_finite_bits(bits_of(fd_scale_a(x, k0, k))) & is_finite_bits(bits_of(fd_scale_b(x, k0, k)));
  if (finite) return 0;
  double raw = (double)float_of(c);
  for (int k = 0; k < n; ++k)
    raw = raw + (double)a[k * as] * (double)b[k * bs] * (double)fd_scale_a(x, k0, k) * (double)fd_scale_b(x, k0, k);
  *r = raw != raw ? nan_bits : ((raw < 0.0 ? SIGN : 0u) | INF_BITS);
  return 1;
}

// One step: c (float32 bits, a value of the output) + sum of a[k * as] * b[k * bs], k < n <= L.
// With block scales (mxf8f6f4, MMA-Sim's nv_fused_dot_add with scale_a/scale_b): each product's
// exponent gains e(S_a) + e(S_b) and its value the factor 2^(e(S_a) + e(S_b)) (E8M0 scales).
CPD_FN u32 fused_dot_step_scaled(const FusedDotSpec& s, const float* a, long long as, const float* b, long long bs,
                                 int n, u32 c, const FdScales& x, long long k0) {
  u32 special;
  if (fd_special(a, as, b, bs, n, c, x, k0, fd_canonical_nan(s.out), &special)) return special;
  int emax = fd_exp(c, s.c_emin, s.zero_exp);  // 1-2.
  for (int k = 0; k < n; ++k) {
    int e = fd_exp(bits_of(a[k * as]), s.a_emin, s.zero_exp) + fd_exp(bits_of(b[k * bs]), s.b_emin, s.zero_exp);
    if (x.a) e += fd_scale_exp(fd_scale_a(x, k0, k), x) + fd_scale_exp(fd_scale_b(x, k0, k), x);
    emax = imax(emax, e);
  }
  Wide wc = wide_of(c);  // 3-4.
  long long S = (long long)fd_cut(wc.S, wc.e, s.frac, emax);
  if (wc.sign) S = -S;
  for (int k = 0; k < n; ++k) {
    Wide p = wide_mul(bits_of(a[k * as]), bits_of(b[k * bs]));
    if (x.a) p.e += fd_scale_exp(fd_scale_a(x, k0, k), x) + fd_scale_exp(fd_scale_b(x, k0, k), x);
    long long T = (long long)fd_cut(p.S, p.e, s.frac, emax);
    S += p.sign ? -T : T;
  }
  return fd_round_out(S, emax - s.frac, s);  // 5.
}

CPD_FN u32 fused_dot_step(const FusedDotSpec& s, const float* a, long long as, const float* b, long long bs, int n,
                          u32 c) {
  return fused_dot_step_scaled(s, a, as, b, bs, n, c, fd_no_scales(), 0);
}

// ------------------------------------------------------------------------------------------
// FD_NV_CHUNK16: Blackwell's kind::mxf4nvf4 (k = 64, e2m1 elements, UE8M0 scales per 32 or 16
// or UE4M3 scales per 16), after MMA-Sim's nv_fused_dot_add_with_block_scale: the products of
// each chunk of 16 consecutive elements are summed exactly; the chunk's term is that sum times
// both scales' significands, with exponent e(S_a) + e(S_b) (the scales' alone: the chunk sum
// is not normalized); c and the chunk terms are then cut to F (35) fractional bits below their
// largest exponent, summed, and the sum cut toward zero to float32 (step 5, FD_OUT_F32).
// Elements must be e2m1 values (2x is an integer of at most 12), so a chunk sum times 4 is an
// integer below 2^12 and every term's integer below 2^(F + 12).
CPD_FN u32 fd_chunk16_step(const FusedDotSpec& s, const float* a, long long as, const float* b, long long bs, int n,
                           u32 c, const FdScales& x, long long k0) {
  u32 special;
  if (fd_special(a, as, b, bs, n, c, x, k0, fd_canonical_nan(s.out), &special)) return special;
  int emax = fd_exp(c, s.c_emin, s.zero_exp);
  for (int k = 0; k < n; k += 16)
    emax = imax(emax, fd_scale_exp(fd_scale_a(x, k0, k), x) + fd_scale_exp(fd_scale_b(x, k0, k), x));
  Wide wc = wide_of(c);
  long long S = (long long)fd_cut(wc.S, wc.e, s.frac, emax);
  if (wc.sign) S = -S;
  for (int k = 0; k < n; k += 16) {
    long long q = 0;  // 4 x the chunk's sum, exact
    for (int j = k; j < imin(n, k + 16); ++j)
      q += (long long)fmul(a[j * as], 2.0f) * (long long)fmul(b[j * bs], 2.0f);
    Wide wa = wide_of(bits_of(fd_scale_a(x, k0, k))), wb = wide_of(bits_of(fd_scale_b(x, k0, k)));
    u64 P = (u64)(q < 0 ? -q : q) * wa.S * wb.S;  // < 2^12 * 2^24 * 2^24
    long long T = (long long)fd_cut(P, wa.e + wb.e - 2, s.frac, emax);
    S += q < 0 ? -T : T;
  }
  return fd_round_out(S, emax - s.frac, s);
}

// ------------------------------------------------------------------------------------------
// AMD matrix cores (MMA-Sim, arXiv 2511.10909, simulator mmasim/simulator/amd.py).
// Their NaN is float32's default quiet NaN 0x7fc00000 (sign and payload are not modelled).
const u32 FD_AMD_NAN = 0x7fc00000u;

// floor(v * 2^sh) for a signed v (|v| < 2^40, sh <= 20 when positive): a right shift of a
// negative v is arithmetic on every compiler cpd builds with (GCC, Clang, MSVC, NVRTC; C++20
// defines it so), i.e. the floor (a 64-bit division here cost a GPU a subroutine call).
CPD_FN long long fd_floor_shift(long long v, int sh) {
  if (sh >= 0) return v * (1ll << sh);
  if (sh <= -63) return v < 0 ? -1ll : 0ll;
  return v >> -sh;
}

// FD_AMD_PAIRWISE (CDNA1/CDNA2 fp16 and bf16 MFMA): each product rounded to float32 (an fma with
// +0: an exact zero product is +0), the L = 2 or 4 products of a group summed pairwise in float32
// ((p0 + p1) + (p2 + p3)), round to nearest even, then c + that sum, rounded once more. A short
// last group is zero-padded (as a kernel pads K). ftz (CDNA2; AMD's MIOpen documentation: "MI200
// MFMA_F16, MFMA_BF16 and MFMA_BF16_1K flush subnormal input/output data to zero"): inputs below
// the input format's smallest normal become +0, products and sums below 2^-126 become zero of
// their sign, and c at the start of a step becomes +0 if it is subnormal or zero.
CPD_FN float fd_flush_keep(float v, int ftz) {
  return (ftz && (bits_of(v) & ~SIGN) < 0x00800000u) ? float_of(bits_of(v) & SIGN) : v;
}

// The step's parts (the tiled kernels of cuda/kernels/fused_dot.cu run them too): an input x
// flushed to +0 below its format's smallest normal (min_bits: that normal's float32 bits); a
// product of two inputs; a pairwise sum; and c + the group's sum (c flushed to +0 when subnormal
// or zero), flushed, a NaN made FD_AMD_NAN.
CPD_FN float fd_amd_input(float x, u32 min_bits, int ftz) {
  return (ftz && (bits_of(x) & ~SIGN) < min_bits) ? 0.0f : x;
}
CPD_FN float fd_amd_product(float x, float y, int ftz) { return fd_flush_keep(ffma(x, y, 0.0f), ftz); }
CPD_FN float fd_amd_pair(float p, float q, int ftz) { return fd_flush_keep(fadd(p, q), ftz); }
CPD_FN u32 fd_amd_pairwise_finish(u32 c, float sum, int ftz) {
  float cf = float_of(c);
  if (ftz && (c & ~SIGN) < 0x00800000u) cf = 0.0f;
  u32 r = bits_of(fd_flush_keep(fadd(cf, sum), ftz));
  return (r & ~SIGN) > INF_BITS ? FD_AMD_NAN : r;
}

CPD_FN u32 fd_amd_pairwise_step(const FusedDotSpec& s, const float* a, long long as, const float* b, long long bs,
                                int n, u32 c) {
  // Loops of constant bounds, unrolled: p stays in registers on a GPU (no local memory).
  float p[16];
  const int L = imin(s.group, 16);
  const u32 amin = (u32)(s.a_emin + 127) << 23, bmin = (u32)(s.b_emin + 127) << 23;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    if (k >= L) break;
    const float x = k < n ? a[k * as] : 0.0f, y = k < n ? b[k * bs] : 0.0f;
    p[k] = fd_amd_product(fd_amd_input(x, amin, s.ftz), fd_amd_input(y, bmin, s.ftz), s.ftz);
  }
#pragma unroll
  for (int w = 1; w < 16; w *= 2)
#pragma unroll
    for (int k = 0; k + w < 16; k += 2 * w)
      if (k + w < L) p[k] = fd_amd_pair(p[k], p[k + w], s.ftz);
  return fd_amd_pairwise_finish(c, p[0], s.ftz);
}

// FD_AMD_RD / FD_AMD_RD_FP8 (CDNA3 fp16, bf16, xf32 and fp8/bf8 MFMA; MMA-Sim's
// amd_fused_dot_rd_add):
//   1. a product of magnitude >= 2^128 makes the step +-inf (NaN if both signs occur);
//   2. the products (not c) are aligned to their largest exponent e and cut toward zero to 24
//      fractional bits, and summed exactly: S (FP8: the even- and odd-indexed products
//      separately, each half's sum then aligned to the larger of the two exponents rounding
//      DOWN -- toward -inf -- to 24 fractional bits, and added);
//   3. with m = max(e, e(c)): S rounded down to 31 fractional bits below 2^m, c rounded down to
//      24 fractional bits below 2^m (FP8: c is dropped when e(c) < m - 25), added exactly;
//   4. the sum rounded to nearest even float32 (subnormals kept, overflow to +-inf); zero is +0.
// Rounding down (not toward zero) makes a small negative c cost one unit 2^(m - 24): the
// "asymmetric rounding" MMA-Sim reports for CDNA3.
CPD_FN u32 fd_amd_round(long long T, int e, const FusedDotSpec& s) {
  if (T == 0) return 0u;
  return round_wide(fd_wide(T, e), s.of, NEAREST, 0u, 32);
}

// Step 3 on the products' exact sum S in units 2^(e - 24) (FP8: the halves' sum, aligned to e =
// the larger of their exponents), c finite: the step's value is the result times 2^*k, k = m - 31
// (|result| < 2^39 for |S| < 2^30: S 2^7 and c's 25 bits times 2^7).
CPD_FN long long fd_amd_rd_align(const FusedDotSpec& s, long long S, int e, u32 c, int fp8, int* k) {
  const int ec = fd_exp(c, -126, s.zero_exp), m = imax(e, ec);
  long long sp = fd_floor_shift(S, 7 + e - m);  // units 2^(m - 31)
  Wide wc = wide_of(c);
  long long C = wc.sign ? -(long long)wc.S : (long long)wc.S;
  long long cp = (fp8 && ec < m - 25) ? 0ll : fd_floor_shift(C, wc.e + 24 - m);  // units 2^(m - 24)
  *k = m - 31;
  return sp + cp * 128;
}

// Steps 3 and 4 (fd_amd_rd_step; the tiled kernels round fd_amd_rd_align's sum themselves).
CPD_FN u32 fd_amd_rd_finish(const FusedDotSpec& s, long long S, int e, u32 c, int fp8) {
  int k;
  const long long v = fd_amd_rd_align(s, S, e, c, fp8, &k);  // 3.
  return fd_amd_round(v, k, s);                               // 4.
}

CPD_FN u32 fd_amd_rd_step(const FusedDotSpec& s, const float* a, long long as, const float* b, long long bs, int n,
                          u32 c) {
  u32 special;
  FdScales none = fd_no_scales();
  if (fd_special(a, as, b, bs, n, c, none, 0, FD_AMD_NAN, &special)) return special;
  const int fp8 = s.algo == FD_AMD_RD_FP8;
  u32 pinf = 0u, ninf = 0u;
  int e0 = 2 * s.zero_exp, e1 = 2 * s.zero_exp;  // the halves' exponents (a zero-padded half: 0 * 0)
  for (int k = 0; k < n; ++k) {
    Wide p = wide_mul(bits_of(a[k * as]), bits_of(b[k * bs]));
    if (p.S != 0ull && top_bit64(p.S) + p.e >= 128) {  // 1.
      if (p.sign) ninf = 1u;
      else pinf = 1u;
    }
    int e = fd_exp(bits_of(a[k * as]), s.a_emin, s.zero_exp) + fd_exp(bits_of(b[k * bs]), s.b_emin, s.zero_exp);
    if (fp8 && (k & 1)) e1 = imax(e1, e);
    else e0 = imax(e0, e);
  }
  if (pinf | ninf) return (pinf & ninf) ? FD_AMD_NAN : ((ninf ? SIGN : 0u) | INF_BITS);
  long long S0 = 0, S1 = 0;  // scalars, not an array indexed by the half: no local memory on a GPU
  for (int k = 0; k < n; ++k) {  // 2.
    Wide p = wide_mul(bits_of(a[k * as]), bits_of(b[k * bs]));
    const int odd = fp8 && (k & 1);
    long long T = (long long)fd_cut(p.S, p.e, 24, odd ? e1 : e0);
    if (odd) S1 += p.sign ? -T : T;
    else S0 += p.sign ? -T : T;
  }
  int e = e0;
  long long S = S0;
  if (fp8) {
    e = imax(e0, e1);
    S = fd_floor_shift(S0, e0 - e) + fd_floor_shift(S1, e1 - e);
  }
  return fd_amd_rd_finish(s, S, e, c, fp8);
}

// One step of any algorithm (the CPU's generic loop and the CUDA kernel call this).
CPD_FN u32 fd_step(const FusedDotSpec& s, const float* a, long long as, const float* b, long long bs, int n, u32 c,
                   const FdScales& x, long long k0) {
  if (s.algo == FD_AMD_PAIRWISE) return fd_amd_pairwise_step(s, a, as, b, bs, n, c);
  if (s.algo == FD_AMD_RD || s.algo == FD_AMD_RD_FP8) return fd_amd_rd_step(s, a, as, b, bs, n, c);
  if (s.algo == FD_NV_CHUNK16) return fd_chunk16_step(s, a, as, b, bs, n, c, x, k0);
  return fused_dot_step_scaled(s, a, as, b, bs, n, c, x, k0);
}

#if !CPD_DEVICE
// ------------------------------------------------------------------------------------------
// The vectorized form (host only). Carrier T (double, or float where fd_float_applies) holds every product
// a_k b_k exactly; with scale = 2^(F - emax) (built from bits),
//     trunc(t * scale)   is T of step 3 (a power-of-two scaling is exact in the carrier's normal
//                        range, and trunc rounds toward zero),
//     the sum of the T   is exact (integers below 2^(F + 2 + log2(L + 1)) <= 2^53, or 2^24),
//     S * 2^(emax - F)   is the step's value, exact; round_out then works on it directly.
// Exponents e(x) are integers computed once per operand (fd_exp on float32 bits).
//
// float32 carriers (fd_float_applies) need: products exact (a.man + b.man + 2 <= 24 significant
// bits), (L + 1) * 2^(F + 2) <= 2^24, and formats of small range (|e| <= 15: FP8, binary16) so
// that emax stays within [-60, 100] whenever a term is nonzero (every nonzero c of a chain is a
// multiple of 2^(e_min_product - F) and at most K * 2^32), which keeps scale and every scaled term
// a float32 normal. When every term is zero, emax may be as low as zero_exp, and scale's exponent
// is clamped to a float32 normal: the zeros stay zeros.
CPD_FN int fd_float_applies(const FusedDotSpec& s, int a_man, int a_emax, int b_man, int b_emax) {
  int bits = 0;
  while ((1 << bits) < s.group + 1) ++bits;
  return (int)(a_man + b_man + 2 <= 24 && s.frac + 2 + bits <= 24 && s.a_emin >= -15 && s.b_emin >= -15 &&
               a_emax <= 15 && b_emax <= 15);
}

#define CPD_FD_MEMBER static inline __attribute__((always_inline))

template <class T>
struct FdCarrier;

template <>
struct FdCarrier<double> {
  // 2^k as a double, k clamped to the normal range
  CPD_FD_MEMBER double pow2(int k) {
    return double_of((u64)(imin(imax(k, -1022), 1023) + 1023) << 52);
  }
  // trunc for |x| < 2^52 (every carrier term is below 2^(F + 2) <= 2^42): |x| + 2^52 - 2^52 is |x|
  // rounded to an integer (exact adds), one less when that went up; then x's sign. Plain adds,
  // compares and bit selects, so the loops vectorize (GCC vectorizes __builtin_trunc only with
  // -fno-trapping-math, which the numerics contract does not allow). inf and NaN pass through.
  CPD_FD_MEMBER double trunc(double x) {
    u64 sign = dbits_of(x) & SIGN64;
    double ax = double_of(dbits_of(x) ^ sign);
    double r = (ax + 4503599627370496.0) - 4503599627370496.0;
    u64 t = sel64((u64)(r > ax), dbits_of(r - 1.0), dbits_of(r));
    return double_of(t | sign);
  }
  // e(c) of a carrier value (a float32 value of the output, or a non-finite that is selected away)
  CPD_FD_MEMBER int exp_of(double c, int emin, int zero_exp) {
    return fd_exp(bits_of((float)c), emin, zero_exp);
  }
  CPD_FD_MEMBER int finite(double x) { return (int)((dbits_of(x) & ~SIGN64) < INF64); }
  // floor for |x| < 2^52 (the AMD steps' round-down alignments): trunc, one lower where that went up
  CPD_FD_MEMBER double floor(double x) {
    double t = trunc(x);
    return double_of(sel64((u64)(t > x), dbits_of(t - 1.0), dbits_of(t)));
  }
};

template <>
struct FdCarrier<float> {
  CPD_FD_MEMBER float pow2(int k) {
    return float_of((u32)(imin(imax(k, -126), 127) + 127) << 23);
  }
  // as FdCarrier<double>::trunc, for |x| < 2^23 (fd_float_applies keeps the terms below 2^22)
  CPD_FD_MEMBER float trunc(float x) {
    u32 sign = bits_of(x) & SIGN;
    float ax = float_of(bits_of(x) ^ sign);
    float r = (ax + 8388608.0f) - 8388608.0f;
    u32 t = sel((u32)(r > ax), bits_of(r - 1.0f), bits_of(r));
    return float_of(t | sign);
  }
  CPD_FD_MEMBER int exp_of(float c, int emin, int zero_exp) {
    return fd_exp(bits_of(c), emin, zero_exp);
  }
  CPD_FD_MEMBER int finite(float x) { return (int)((bits_of(x) & ~SIGN) < INF_BITS); }
};

// Step 5 on an exact carrier value v (finite) of a step; float32 bits out.
//   RZ to float32 / E8M13: |v| >= 2^-126: clear the significand bits below the format's last
//   (float64: 52 - man of them; float32 carriers hold <= 24 bits, so only E8M13 clears 10);
//   |v| < 2^-126: trunc(v * 2^(126 + man)) * 2^-(126 + man), exact. |v| >= 2^128: +-inf.
//   RNE to binary16: round_d (float64) or the fast cast (float32), both round-to-nearest of v.
CPD_FN u32 fd_round_out_d(double v, const FusedDotSpec& s, const FormatD& g16) {
  if (s.out == FD_OUT_F16) {
    u32 r = bits_of((float)round_d(v, g16));
    return sel((u32)((r & ~SIGN) == 0u), 0u, r);
  }
  int man = s.out == FD_OUT_E8M13 ? 13 : 23;
  u64 u = dbits_of(v), sign = u & SIGN64, a = u ^ sign;
  u64 n = a & ~((1ull << (52 - man)) - 1ull);
  double q = double_of((u64)(1023 - 126 - man) << 52), iq = double_of((u64)(1023 + 126 + man) << 52);
  u64 sub = dbits_of(__builtin_trunc(double_of(a) * iq) * q);
  u64 mag = sel64((u64)(a < 0x3810000000000000ull), sub, n);  // 2^-126
  mag = sel64((u64)(a >= 0x47f0000000000000ull), INF64, mag);  // 2^128
  u32 r = bits_of((float)double_of(sign | mag));
  return sel((u32)((r & ~SIGN) == 0u), 0u, r);  // zero: +0
}

// Step 4 of FD_AMD_RD on the exact float64 value v of a step (a value below 2^300 with at most
// 40 significant bits): round to nearest even float32 -- the float64 -> float32 conversion,
// subnormals kept, overflow to +-inf (IEEE default rounding; the host build has no FTZ) -- and a
// zero is +0.
CPD_FN u32 fd_amd_round_d(double v) {
  u32 r = bits_of((float)v);
  return sel((u32)((r & ~SIGN) == 0u), 0u, r);
}

CPD_FN u32 fd_round_out_f(float v, const FusedDotSpec& s) {
  u32 u = bits_of(v);
  u32 r = u;
  if (s.out == FD_OUT_F16) r = cast_bits_fast(u, s.of, NEAREST, 0u, 32);
  else if (s.out == FD_OUT_E8M13) r = u & ~0x3ffu;  // v is a float32 normal or zero here
  return sel((u32)((r & ~SIGN) == 0u), 0u, r);
}
#endif  // !CPD_DEVICE

}  // namespace cpd

#endif  // CPD_FUSED_DOT_H
