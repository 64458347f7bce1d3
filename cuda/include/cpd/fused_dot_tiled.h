// cpd numerics core, fused_dot_tiled.h: the integer form of fused_dot.h's FD_NV step for the
// tiled CUDA kernel (cuda/kernels/fused_dot.cu, cpd_fused_dot_tiled_*). Same bits as fd_step.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
//
// An operand x of a format with `man` fraction bits (a float32 holding one of its values) is
//     x = sigma M 2^(e - man),   e = fd_exp(x) (fused_dot.h step 1),   M < 2^(man + 1) an integer,
// sigma = -1 when its sign bit is set (zeros too), else +1 (a zero: M = 0, e = zero_exp; a
// subnormal of the format: e = emin, M < 2^man). With F the spec's fraction bits, pre = F - ma - mb
// >= 0 and d = emax - ea - eb >= 0, step 3's term of a product is T = trunc(Ma Mb 2^(pre - d)).
// The kernel stores each operand as one signed word,
//     wa = sigma_a (Ma 2^(30 - ma) + 1),   wb = sigma_b (Mb 2^(F + 2 - mb) + 1)     (|w| < 2^31),
// so that wa wb = s (2^(32 + pre) Ma Mb + E) with s = sigma_a sigma_b and 0 < E < 2^32
// (E = Ma 2^(30 - ma) + Mb 2^(F + 2 - mb) + 1; Ma 2^(30 - ma) < 2^31, Mb 2^(F + 2 - mb) < 2^(F + 3)
// <= 2^31 for F <= 28). Then the high word of the 64-bit product shifted right arithmetically by d,
//     floor(wa wb / 2^(32 + d)) = T (s = +1)  or  -T - 1 (s = -1),
// one multiply-high and one shift per product: Ma Mb 2^(pre - d) = T + f with 0 <= f < 1 and f a
// multiple of 2^(pre - d) (f = 0 when d <= pre), and the rest E 2^-(32 + d) lies in (0, 2^(pre - d))
// and in (0, 1), so f plus it stays in (0, 1). A shift count d >= 32 gives 0 or -1, as it should
// (|wa wb| < 2^62). The group's sum is the sum of these terms plus the number of negative
// products, counted once per group by a popcount of the sign words.
// c's term, the sum and step 5 are fused_dot.h's (fd_cut, fd_round_out), once per group; for
// 32-bit sums the kernel rounds with fd_tiled_round (the same rounding on a 32-bit integer) and
// leaves to fd_step the rare cases it does not take (a float32-subnormal result, a non-finite c).
// The kernel stores e + FD_TILED_EOFF (>= 1) next to each word. Operands that are not such values
// (non-finite, more than `man` fraction bits) are flagged, and the outputs they reach take fd_step
// for that group instead (same bits by construction).
#ifndef CPD_FUSED_DOT_TILED_H
#define CPD_FUSED_DOT_TILED_H

#include "cpd/fused_dot.h"

namespace cpd {

const int FD_TILED_EOFF = 256;  // operand exponent offset: zero_exp >= -255 keeps e + 256 >= 1

// Whether a group's sum needs 64 bits: L terms below 2^(F + 2), and the count of negatives.
CPD_FN int fd_tiled_wide(const FusedDotSpec& s) {
  int bits = 0;
  while ((1 << bits) < s.group + 1) ++bits;
  return (int)(s.frac + 2 + bits > 30);
}

// Which specs the tiled kernel takes: the NVIDIA step, groups of 4, 8, 16 or 32 (a K slice holds
// 16 or 32 elements: several groups of 4 or 8), F >= ma + mb (pre >= 0), and F <= 26 (the words
// above need F <= 28; the 64-bit kernels add eight terms in 32 bits first: a term is below
// 2^(F + 2) in magnitude, and 8 2^(F + 2) <= 2^31); groups of 4 with 32-bit sums only (F <= 25: no
// 64-bit kernel is built for them, and no tensor core needs one). No bound on Ma 2^pre beyond
// that (the words carry pre in b's shift, not in a's mantissa): Blackwell's FP8/FP4 model (L 32,
// F 25) is taken, and Volta's, Turing's and Ampere's L 4 / 8 models. block: 0 without block
// scales; with them (Blackwell's kind::mxf8f6f4: L 32, F 25, a scale per 32 elements of a row of
// A and of a column of B), the elements per scale, a multiple of L (each group then has one scale
// per operand: a product's exponent gains e(S_a) + e(S_b), the same for the group), at L 32 with
// 64-bit sums (the one scaled kernel built).
CPD_FN int fd_tiled_applies(const FusedDotSpec& s, int a_man, int b_man, int block) {
  const int g = s.group, wide = fd_tiled_wide(s);
  return (int)(s.algo == FD_NV && (g == 4 || g == 8 || g == 16 || g == 32) && s.frac >= a_man + b_man &&
               s.frac <= 26 && s.zero_exp >= -255 && a_man <= 23 && b_man <= 23 && (g > 4 || !wide) &&
               (block == 0 || (block > 0 && g == 32 && wide && block % g == 0)));
}

// A group's sum: 32 bits (fd_tiled_wide false) or 64.
template <bool W>
struct FdTiledSum {
  typedef int type;
};
template <>
struct FdTiledSum<true> {
  typedef long long type;
};

// x >> d and x << d for d >= 0, 0 when d >= 32; (int)x >> d, the sign when d >= 32 (PTX shr and
// shl clamp the count; C++ does not).
CPD_FN u32 fd_shr(u32 x, u32 d) {
#if defined(__CUDA_ARCH__)
  u32 r;
  asm("shr.b32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(d));
  return r;
#else
  return d >= 32u ? 0u : x >> d;
#endif
}

CPD_FN u32 fd_shl(u32 x, u32 d) {
#if defined(__CUDA_ARCH__)
  u32 r;
  asm("shl.b32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(d));
  return r;
#else
  return d >= 32u ? 0u : x << d;
#endif
}

CPD_FN int fd_sar(int x, u32 d) {
#if defined(__CUDA_ARCH__)
  int r;
  asm("shr.s32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(d));
  return r;
#else
  return x >> (d >= 31u ? 31u : d);
#endif
}

// The high word of the 64-bit product of two ints (one IMAD.HI).
CPD_FN int fd_mulhi(int a, int b) {
#if defined(__CUDA_ARCH__)
  return __mulhi(a, b);
#else
  return (int)(((long long)a * (long long)b) >> 32);
#endif
}

CPD_FN int fd_clz(u32 x) {  // 32 for 0
#if defined(__CUDA_ARCH__)
  return __clz((int)x);
#else
  return x ? __builtin_clz(x) : 32;
#endif
}

CPD_FN int fd_popc(u32 x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// Operand decomposition (the words above): e (e + FD_TILED_EOFF), w, and bad = 1 when x is not
// finite or not exactly M 2^(e - man) (the caller flags it). z = 0 for a's words, 28 - F for b's.
// From the float32 bits: x = sig 2^(eff - 23) (sig < 2^24 with the implicit bit, eff = max(field,
// 1) - 127), e = max(eff, emin) for x != 0 and r = e - eff >= 0; then M = sig >> (23 - man + r),
// exact iff those 23 - man + r low bits of sig are 0, i.e. sig << (9 + man - r) is 0 in 32 bits
// (a count of 8 or less keeps every bit of sig: then only sig = 0 is exact), and
// Ma 2^(30 - ma) = (sig << 7) >> r, Mb 2^(F + 2 - mb) = (sig << 7) >> (r + 28 - F), both even.
// sig << 7 is (a << 7) - (max(field, 1) - 1) 2^30 in 32 bits (the field's low two bits become the
// implicit bit), and w = m ? ~mag : mag | 1 (m = 0 or -1 by the sign bit) is one LOP3.
struct FdTiledOperand {
  u32 e, w, bad;
};

CPD_FN FdTiledOperand fd_tiled_operand(u32 x, int man, int emin, int zero_exp, int z) {
  const u32 a = x & ~SIGN, field = a >> 23, m = (u32)((int)x >> 31);
  const int f1 = imax((int)field, 1), ex = imax((int)field + (FD_TILED_EOFF - 127), emin + FD_TILED_EOFF);
  const int r = ex - FD_TILED_EOFF + 127 - f1;
  const u32 sig7 = (a * 128u + 0x40000000u) - (u32)f1 * 0x40000000u;
  const u32 mag = fd_shr(sig7, (u32)(r + z));
  FdTiledOperand o;
  o.e = a == 0u ? (u32)(zero_exp + FD_TILED_EOFF) : (u32)ex;
  o.w = (m & ~mag) | (~m & (mag | 1u));
  o.bad = (u32)(a >= INF_BITS) | (u32)(fd_shl(sig7, (u32)imax(2 + man - r, 0)) != 0u);
  return o;
}

// One product's term: floor(wa wb / 2^(32 + d)), d = emax2 - ea - eb (the offset exponents).
CPD_FN int fd_tiled_term(u32 wa, u32 wb, u32 d) { return fd_sar(fd_mulhi((int)wa, (int)wb), d); }

// emax of step 2 for c, offset as the products' (2 FD_TILED_EOFF).
CPD_FN u32 fd_tiled_cexp(const FusedDotSpec& s, u32 c) {
  return (u32)(fd_exp(c, s.c_emin, s.zero_exp) + 2 * FD_TILED_EOFF);
}

// Steps 3 (c's term) to 5: S = sum of the group's terms, neg = the number of negative products.
// A non-finite c (an earlier group overflowed, or was NaN) with finite products: c + the sum in
// float64 is c itself (+-inf, or NaN: c is then the output's canonical NaN already), as fd_special.
CPD_FN u32 fd_tiled_finish(const FusedDotSpec& s, long long S, int neg, u32 emax2, u32 c) {
  if (!is_finite_bits(c)) return c;
  const int emax = (int)emax2 - 2 * FD_TILED_EOFF;
  Wide wc = wide_of(c);
  long long T = (long long)fd_cut(wc.S, wc.e, s.frac, emax);
  return fd_round_out(S + neg + (wc.sign ? -T : T), emax - s.frac, s);
}

// Step 5 on a 32-bit sum: fd_round_out(v, k, s) for |v| <= 2^30 (RZ to float32 or E8M13, RNE
// to binary16), as round_wide does it: t the top bit of |v|, E = t + k, the quantum
// 2^(max(E, emin) - man), dr = the bits of |v| below it (capped at 31: |v| <= 2^30 then rounds
// to 0 either way); q = (2 |v| + bias) >> (dr + 1), the bias 0 (RZ) or 2^dr - 1 plus the last
// kept bit (RNE: the rest rounds up above half, and at half when the kept bit is odd; dr = 0
// keeps |v|; |v| <= 2^30 keeps 2 |v| + bias below 2^32); the value q 2^(k + dr) (q <= 2^24) is
// built as a float32 from (float)q and an exponent add. An overflow (2^128 before RZ, 2^16
// after RNE) is infinite, 0 and what rounds to 0 are +0; a nonzero result below 2^-126 (float32
// and E8M13 outputs only: a binary16 result is >= 2^-24 or 0) sets *slow (fd_round_out's
// subnormal float32, left to fd_step).
CPD_FN u32 fd_tiled_round(int v, int k, const FusedDotSpec& s, u32* slow) {
  const u32 f16 = 0u - (u32)(s.out == FD_OUT_F16), mag = (u32)(v < 0 ? -v : v);  // f16: a mask
  const int t = 31 - fd_clz(mag), dr = imin(imax(imax(t + k, s.of.emin) - s.of.man - k, 0), 31);
  const u32 bias = (fd_shl(1u, (u32)dr) - 1u + ((mag >> dr) & 1u)) & f16;
  const u32 q = fd_shr(2u * mag + bias, (u32)dr + 1u);  // (2 |v| + 2^dr - 1 + lsb) >> (dr + 1): RNE
  const int fe = (int)(bits_of((float)(int)q) >> 23) + k + dr;  // the result's float32 exponent field
  const u32 bits = (bits_of((float)(int)q) + ((u32)(k + dr) << 23)) | ((u32)v & SIGN);
  *slow |= (u32)(fe <= 0) & (u32)(q != 0u);
  return (fe <= 0) | (q == 0u) ? 0u : fe >= 255 - (int)(f16 & 112u) ? INF_BITS | ((u32)v & SIGN) : bits;
}

// fd_tiled_finish for 32-bit sums (F <= 25: F + 2 + log2(L + 1) <= 30): c's term is
// Sc 2^(ec - 23) >> (emax - F) = (4 Sc) >> (emax - F - ec + 25), a right shift by at least
// 25 - F >= 0 (emax >= ec; 4 Sc < 2^26); a non-finite c or a result fd_tiled_round leaves sets
// *slow (the caller takes fd_step).
CPD_FN u32 fd_tiled_finish32(const FusedDotSpec& s, int S, int neg, u32 emax2, u32 c, u32* slow) {
  const int emax = (int)emax2 - 2 * FD_TILED_EOFF;
  const u32 ca = c & ~SIGN, field = ca >> 23;
  const int f1 = imax((int)field, 1);
  const int Tc = (int)fd_shr(4u * ca - ((u32)(f1 - 1) << 25), (u32)(emax - s.frac - f1 + 152));
  const int v = S + neg + ((c & SIGN) ? -Tc : Tc);
  *slow |= (u32)(ca >= INF_BITS);
  return fd_tiled_round(v, emax - s.frac, s, slow);
}

// ------------------------------------------------------------------------------------------
// fused_dot.h's FD_AMD_RD (CDNA3 fp16 / bf16 MFMA, L 8, and xf32, L 4) on the tiled kernels
// cpd_fused_dot_tiled_l8a / _l4a: step 2's terms are the NVIDIA step's (the words and passes
// above) with F = 24 and emax over the products alone, c not included: pass 1 starts from
// 2 zero_exp + 2 FD_TILED_EOFF (fd_amd_rd_step's e0: the exponent of 0 * 0, which every product's
// reaches, padding's included) instead of c's exponent. The sum plus the count of negatives is
// then fd_amd_rd_step's S exactly (sum of the signed cut terms; below 2^30 in magnitude: 8 terms
// below 2^26); fd_amd_rd_align adds c's round-down alignment to it, as the step does, and
// fd_amdrd_round rounds the result. Left to fd_step: flagged operands (non-finite, not a value of
// the format), a non-finite c, a float32-subnormal result, and a group whose emax is 126 or
// more (a product may reach 2^128: step 1's infinities; below that |product| < 2^(emax + 2) <=
// 2^127). F + 2 + log2(L + 1) <= 30: 32-bit sums; pre = 24 - ma - mb >= 0. No block scales
// (CDNA3's FP8, even / odd halves: fd_amdrd8_applies below). Float32 out (every CDNA3 model's).
CPD_FN int fd_amdrd_applies(const FusedDotSpec& s, int a_man, int b_man, int block) {
  return (int)(s.algo == FD_AMD_RD && (s.group == 4 || s.group == 8) && a_man + b_man <= 24 && a_man >= 0 &&
               b_man >= 0 && a_man <= 23 && b_man <= 23 && s.zero_exp >= -255 && s.out == FD_OUT_F32 &&
               block == 0);
}

CPD_FN int fd_clz64(u64 x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return __clzll((long long)x);
#else
  return __builtin_clzll(x);
#endif
}

// fd_amd_round(v, k, s) (round_wide to nearest even, float32 with subnormals, overflow to inf,
// 0 to +0) for |v| < 2^62 whose result is a float32 normal or 0, as fd_tiled_round does it on 64
// bits: t the top bit of |v|, E = t + k its exponent; when E >= -126 the quantum is 2^(E - 23),
// the dr = max(t - 23, 0) low bits of |v| go, and q = (2 |v| + 2^dr - 1 + lsb) >> (dr + 1) is |v|
// rounded to nearest even at bit dr (fd_tiled_round's proof; q <= 2^24, so (float)q is exact),
// the value q 2^(k + dr) (an exponent add; >= 2^128 is +-inf). E < -126 (a result below 2^-126,
// whose quantum is 2^-149, not 2^(E - 23)) sets *slow: the caller takes the generic step.
CPD_FN u32 fd_amdrd_round(long long v, int k, u32* slow) {
  if (v == 0) return 0u;
  const u64 mag = (u64)(v < 0 ? -v : v);
  const int t = 63 - fd_clz64(mag), dr = imax(t - 23, 0);
  const u64 bias = (1ull << dr) - 1ull + ((mag >> dr) & 1ull);
  const u32 q = (u32)((2ull * mag + bias) >> (dr + 1));
  const u32 qb = bits_of((float)(int)q), sign = v < 0 ? SIGN : 0u;
  const int fe = (int)(qb >> 23) + k + dr;  // the result's float32 exponent field
  *slow |= (u32)(t + k < -126);
  return fe >= 255 ? INF_BITS | sign : (qb + ((u32)(k + dr) << 23)) | sign;
}

// FD_AMD_RD_FP8 (CDNA3 fp8 / bf8 and their mixes, L 16) on cpd_fused_dot_tiled_l16a: the same
// words and passes with the even- and odd-indexed products apart. Pass 1 keeps two exponents
// (each starting at 2 zero_exp, as fd_amd_rd_step's zero-padded halves), pass 2 two 32-bit sums,
// each term cut against its own half's exponent (fd_tiled_term), and each half's negatives
// counted from its own bits of the sign words (a negative product's term is -T - 1: the words'
// proof at the top holds term by term, so half by half). The halves then join as
// fd_amd_rd_step joins them: e = max(e0, e1), each sum floor-shifted to e's units
// (fd_amdrd8_halves), then fd_amd_rd_align with its fp8 cut-off of c and fd_amdrd_round. Sums:
// 8 terms below 2^(F + 2) = 2^26 per half and its 8 corrections, so |S0|, |S1| < 2^29 + 8 and
// their join below 2^30: 32 bits. The fallbacks are fd_amdrd_applies' (flags, c not finite, a
// float32-subnormal result, e >= 126).
CPD_FN int fd_amdrd8_applies(const FusedDotSpec& s, int a_man, int b_man, int block) {
  return (int)(s.algo == FD_AMD_RD_FP8 && s.group == 16 && a_man + b_man <= 24 && a_man >= 0 && b_man >= 0 &&
               a_man <= 23 && b_man <= 23 && s.zero_exp >= -255 && s.out == FD_OUT_F32 && block == 0);
}

// The halves' sums S0, S1 in units 2^(e0 - 24), 2^(e1 - 24) (exact: corrections included) as one
// sum in units 2^(e - 24), e = max(e0, e1) (*e), each rounded down (toward -inf): an arithmetic
// shift by e - eh, the sign past 31 (fd_sar's clamp, as fd_floor_shift past 63).
CPD_FN long long fd_amdrd8_halves(int S0, int e0, int S1, int e1, int* e) {
  *e = imax(e0, e1);
  return (long long)fd_sar(S0, (u32)(*e - e0)) + (long long)fd_sar(S1, (u32)(*e - e1));
}

// ------------------------------------------------------------------------------------------
// fused_dot.h's FD_AMD_PAIRWISE (CDNA1 / CDNA2 fp16 and bf16 MFMA) on the tiled kernels
// cpd_fused_dot_tiled_amdp / _amdpz (CDNA2's flushes): the step is float32 arithmetic throughout
// (products, pairwise sums, c + sum, each rounded to nearest even, fd_amd_input /
// fd_amd_product / fd_amd_pair / fd_amd_pairwise_finish), so the same operations in the same
// order on the same values give its bits, NaN and inf included, with no integer form and no
// fallback. Groups of 2 or 4 (every CDNA1/2 instruction's), no block scales.
CPD_FN int fd_amdp_applies(const FusedDotSpec& s, int block) {
  return (int)(s.algo == FD_AMD_PAIRWISE && (s.group == 2 || s.group == 4) && block == 0);
}

// ------------------------------------------------------------------------------------------
// The tiled form of fused_dot.h's FD_NV_CHUNK16 step (Blackwell's kind::mxf4 / mxf4nvf4: e2m1
// elements, a scale per block of K) for cpd_fused_dot_tiled_c16_* (cuda/kernels/fused_dot.cu).
// Same bits as fd_chunk16_step, for specs fd_c16_applies takes:
//   * the sum of a chunk's 16 products of e2m1 values is a multiple of 1/4 below 2^10, so the
//     float32 FMA chain from 0 over them is exact, and q = 4 x that sum (fd_chunk16_step's q) an
//     integer, |q| <= 16 * 144 < 2^12;
//   * a scale's magnitude (fd_chunk16_step reads wide_of's S and fd_exp, neither of which sees
//     the sign) is m 2^x with m < 16 an integer: E8M0 (m = 1, 2^-127 a float32 subnormal
//     included), E4M3 / UE4M3 (m <= 15), zero (m = 0); any other scale, and a non-finite one,
//     is flagged (fd_c16_scale). The chunk's term |q| Sa Sb / 4 is then the integer |q| ma mb
//     < 2^20 times 2^(xa + xb - 2), and its cut to F bits below 2^emax (fd_cut) that integer
//     shifted by sh = emax - F - xa - xb + 2: right, toward zero, when sh > 0 (rare: the kernel
//     leaves those outputs' groups to fd_chunk16_step), else left by at most F - 2 (xa <=
//     floor(log2 Sa) <= e(Sa), likewise b's, and emax >= e(Sa) + e(Sb)), so every term is below
//     2^(F + 18) and a group of up to 16 chunks plus c's term sums exactly in 64 bits for F <= 40
//     (fd_c16_v, fd_c16_term);
//   * emax (c's exponent and the group's chunks' e(Sa) + e(Sb)) depends on the scales alone, so
//     the kernel forms it before the group's first chunk, and rounds once per group
//     (fd_c16_finish: the terms are signed, no count of negatives).
// Elements that are not e2m1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives: what
// fd_chunk16_step assumes) are flagged too (fd_c16_bad_element); the outputs a flag reaches
// take fd_chunk16_step for that group.
// The spec's output is float32 (RZ: every block-scaled kind's; fd_c16_finish); block >= 16 (the
// kinds' 16 and 32: a chunk's scale is the previous chunk's or the next).
CPD_FN int fd_c16_applies(const FusedDotSpec& s, int a_man, int b_man, int block) {
  return (int)(s.algo == FD_NV_CHUNK16 && s.group >= 16 && s.group <= 256 && s.group % 16 == 0 && s.frac >= 0 &&
               s.frac <= 40 && s.out == FD_OUT_F32 && a_man == 1 && b_man == 1 && block >= 16);
}

// 1 when x (float32 bits) is not an e2m1 value: |x| not 0 and not in {0.5 (0x3f000000), 1, 1.5,
// 2, 3, 4, 6 (0x40c00000)}, i.e. more than one fraction bit, outside [0.5, 6], or 0.75.
CPD_FN u32 fd_c16_bad_element(u32 x) {
  const u32 a = x & ~SIGN;
  return (u32)(a != 0u) &
         ((u32)((a & 0x3fffffu) != 0u) | (u32)(a - 0x3f000000u > 0x01c00000u) | (u32)(a == 0x3f400000u));
}

CPD_FN int fd_ctz(u32 x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return __ffs((int)x) - 1;
#else
  return __builtin_ctz(x);
#endif
}

// A scale (float32 bits u, exponent floor emin) as fd_chunk16_step reads it: e = e(S) (fd_exp with
// zero_exp = emin), and |S| = m 2^x (m < 2^24 odd, or 0); bad when S is not finite or m >= 16.
struct FdC16Scale {
  int e, x;
  u32 m, bad;
};

CPD_FN FdC16Scale fd_c16_scale(u32 u, int emin) {
  const u32 a = u & ~SIGN, field = a >> 23;
  const u32 sig = (a & 0x7fffffu) | ((u32)(field != 0u) << 23);
  const int tz = fd_ctz(sig | 0x1000000u);  // 24 for a zero: m = 0
  FdC16Scale r;
  r.e = fd_exp(a, emin, emin);
  r.m = sig >> tz;
  r.x = imax((int)field, 1) - 150 + tz;
  r.bad = (u32)(a >= INF_BITS) | (u32)(r.m >= 16u);
  return r;
}

// v = q ma mb of a chunk from its exact float32 sum and f = 4 ma mb (a float32 integer <= 900):
// sum f is an integer below 2^20, exact, read from the low bits of sum f + 1.5 2^23 (one FMA and
// a subtraction; garbage for a flagged chunk, whose output fd_chunk16_step takes)
CPD_FN int fd_c16_v(float sum, float f) { return (int)(bits_of(ffma(sum, f, 12582912.0f)) - 0x4b400000u); }

// A chunk's cut term for sh <= 0: v 2^-sh, exact (a left shift in 64 bits; -sh <= F - 2 <= 38).
// A cut that truncates (sh > 0 with v != 0: a chunk some 2^27 or more below the group's largest
// scale product or c) is left to fd_chunk16_step by the caller; the shift is clamped so that such
// a term, and a flagged output's garbage, stay defined.
CPD_FN long long fd_c16_term(int v, int sh) {
  const u32 n = (u32)(-sh) < 63u ? (u32)(-sh) : 63u;
  return (long long)((u64)(long long)v << n);
}

// Steps 3 (c's term) to 5 of a group for float32 outputs: fd_tiled_finish's bits where it
// returns, for S the sum of the chunks' terms (|S| < 2^62) and emax the group's. c's term is
// fd_cut's: Sc 2^(ec - 23) (ec: c's unbiased exponent, 1 - 127 for subnormals) shifted by
// emax - F - ec + 23, right (toward zero) or left; then RZ to float32 of v 2^(emax - F): the top
// 24 bits of |v| at the exponent of its top bit; at or past 2^128, +-inf; 0, +0. A result below
// 2^-126 (a float32 subnormal, or less) sets *slow: fd_chunk16_step takes the output's group. A
// non-finite c is kept (as fd_tiled_finish: c + finite terms is c).
CPD_FN u32 fd_c16_finish(const FusedDotSpec& s, long long S, int emax, u32 c, u32* slow) {
  if (!is_finite_bits(c)) return c;
  const u32 ca = c & ~SIGN, field = ca >> 23;
  const u64 sc = (u64)((ca & 0x7fffffu) | ((u32)(field != 0u) << 23));
  const int sh = emax - s.frac - imax((int)field, 1) + 150;
  const u64 tc = sh <= 0 ? sc << imin(-sh, 63) : (sh >= 64 ? 0ull : sc >> sh);
  const long long v = S + ((c & SIGN) ? -(long long)tc : (long long)tc);
  if (v == 0) return 0u;
  const u64 mag = (u64)(v < 0 ? -v : v);
  const int t = top_bit64(mag), e = t + emax - s.frac;
  const u32 sign = v < 0 ? SIGN : 0u;
  if (e >= 128) return sign | INF_BITS;
  if (e < -126) {
    *slow = 1u;
    return 0u;
  }
  const u32 q = (u32)(t >= 23 ? mag >> (t - 23) : mag << (23 - t));  // 2^23 <= q < 2^24
  return sign | ((u32)(e + 126) << 23) + q;
}

}  // namespace cpd

#endif  // CPD_FUSED_DOT_TILED_H
