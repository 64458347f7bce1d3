// cpd numerics core, fused_dot_tiled.h: the integer form of fused_dot.h's FD_NV step for the
// tiled CUDA kernel (cuda/kernels/fused_dot.cu, cpd_fused_dot_tiled_*). Same bits as fd_step.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
//
// An operand x of a format with `man` fraction bits (a float32 holding one of its values) is
//     x = (-1)^s M 2^(e - man),   e = fd_exp(x) (fused_dot.h step 1),   M < 2^(man + 1) an integer
// (a zero: M = 0, e = zero_exp; a subnormal of the format: e = emin, M < 2^man). A product is then
// Ma Mb 2^(ea + eb - ma - mb), and step 3's term is, with pre = F - ma - mb >= 0,
//     T = trunc(|p| 2^(F - emax)) = (Ma 2^pre Mb) >> (emax - ea - eb)         (exact, < 2^(F + 2))
// a 32-bit multiply and one shift (shift counts >= 32 give 0). The signed sum of a group is taken
// as the sum of T ^ m (m = 0 or -1 by the product's sign: -T - 1 when negative) plus the number of
// negative products, which the kernel counts once per group with a popcount of the sign words.
// c's term, the sum and step 5 are fused_dot.h's (fd_cut, fd_round_out), once per group.
// The kernel stores e + FD_TILED_EOFF (>= 1) and M ^ m (a negative operand's word has bit 31 set).
// Operands that are not such values (non-finite, more than `man` fraction bits) are flagged, and
// the outputs they reach take fd_step for that group instead (same bits by construction).
#ifndef CPD_FUSED_DOT_TILED_H
#define CPD_FUSED_DOT_TILED_H

#include "cpd/fused_dot.h"

namespace cpd {

const int FD_TILED_EOFF = 256;  // operand exponent offset: zero_exp >= -255 keeps e + 256 >= 1

// Which specs the tiled kernel takes: the NVIDIA step without block scales, groups of 16 or 32
// (one K slice each), F >= ma + mb (pre >= 0), M 2^pre < 2^22 and products < 2^32 (F <= 29: T fits an int).
CPD_FN int fd_tiled_applies(const FusedDotSpec& s, int a_man, int b_man, int scaled) {
  return (int)(s.algo == FD_NV && !scaled && (s.group == 16 || s.group == 32) && s.frac >= a_man + b_man &&
               s.frac + 1 - b_man <= 22 && s.frac <= 29 && s.zero_exp >= -255 && a_man <= 23 && b_man <= 23);
}

// Whether a group's sum needs 64 bits: L terms below 2^(F + 2), and the count of negatives.
CPD_FN int fd_tiled_wide(const FusedDotSpec& s) {
  int bits = 0;
  while ((1 << bits) < s.group + 1) ++bits;
  return (int)(s.frac + 2 + bits > 30);
}

// Operand decomposition: returns 1 and sets *e (e + FD_TILED_EOFF) and *w (M << pre, ^ m) when x is
// finite and exactly M 2^(e - man); 0 otherwise (the caller flags it).
CPD_FN int fd_tiled_operand(u32 x, int man, int emin, int zero_exp, int pre, u32* e, u32* w) {
  const u32 a = x & ~SIGN, field = a >> 23;
  if (a >= INF_BITS) return 0;
  if (a == 0u) {
    *e = (u32)(zero_exp + FD_TILED_EOFF);
    *w = 0u;
    return 1;
  }
  const int ex = imax((int)field - 127, emin), eff = imax((int)field, 1) - 127;
  const u32 sig = field ? ((a & 0x7fffffu) | 0x800000u) : (a & 0x7fffffu);
  const int r = 23 - man + ex - eff;  // >= 0: ex >= eff
  if (r >= 24) return 0;
  const u32 M = sig >> r;
  if ((M << r) != sig) return 0;  // more fraction bits than the format's
  const u32 Mp = M << pre;
  if (Mp >= (1u << 22)) return 0;
  *e = (u32)(ex + FD_TILED_EOFF);
  *w = (x & SIGN) ? ~Mp : Mp;
  return 1;
}

// x >> d for d >= 0, 0 when d >= 32 (PTX shr clamps the count; C++ does not).
CPD_FN u32 fd_shr(u32 x, u32 d) {
#if defined(__CUDA_ARCH__)
  u32 r;
  asm("shr.b32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(d));
  return r;
#else
  return d >= 32u ? 0u : x >> d;
#endif
}

CPD_FN int fd_popc(u32 x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// a ^ b ^ c as one instruction on the GPU (LOP3; written out, ptxas forms b ^ c per product pair
// first and spends two).
CPD_FN u32 fd_xor3(u32 a, u32 b, u32 c) {
#if defined(__CUDA_ARCH__)
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0x96;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
#else
  return a ^ b ^ c;
#endif
}

// One product's contribution to the group sum: T ^ m, with emax2 = emax + 2 FD_TILED_EOFF.
// wa, wb: the operands' words (M 2^pre ^ m); their signs' xor is m.
CPD_FN u32 fd_tiled_term(u32 wa, u32 wb, u32 ea, u32 eb, u32 emax2) {
  const u32 ma = (u32)((int)wa >> 31), mb = (u32)((int)wb >> 31);
  return fd_xor3(fd_shr((wa ^ ma) * (wb ^ mb), emax2 - ea - eb), ma, mb);
}

// emax of step 2 for c, offset as the products' (2 FD_TILED_EOFF).
CPD_FN u32 fd_tiled_cexp(const FusedDotSpec& s, u32 c) {
  return (u32)(fd_exp(c, s.c_emin, s.zero_exp) + 2 * FD_TILED_EOFF);
}

// Steps 3 (c's term) to 5: S = sum of the group's T ^ m, neg = the number of negative products.
// A non-finite c (an earlier group overflowed, or was NaN) with finite products: c + the sum in
// float64 is c itself (+-inf, or NaN: c is then the output's canonical NaN already), as fd_special.
CPD_FN u32 fd_tiled_finish(const FusedDotSpec& s, long long S, int neg, u32 emax2, u32 c) {
  if (!is_finite_bits(c)) return c;
  const int emax = (int)emax2 - 2 * FD_TILED_EOFF;
  Wide wc = wide_of(c);
  long long T = (long long)fd_cut(wc.S, wc.e, s.frac, emax);
  return fd_round_out(S + neg + (wc.sign ? -T : T), emax - s.frac, s);
}

}  // namespace cpd

#endif  // CPD_FUSED_DOT_TILED_H
