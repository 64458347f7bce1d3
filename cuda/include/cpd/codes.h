// cpd numerics core, codes.h: Codes: values of a format to their 1+exp+man-bit integer codes and back.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
#ifndef CPD_CODES_H
#define CPD_CODES_H

#include "cpd/format.h"

namespace cpd {

// ------------------------------------------------------------------------------------------
// Codes. A code is  s | field (exp bits) | frac (man bits)  in the low 1+exp+man bits.
// For a value v of the format (what cast_bits returns), split() gives r = v / 2^qexp exactly
// (d low bits are zero), and
//   code magnitude = r + ((ee - emin) << man)
// because a normal r carries the implicit 2^man, which lands exactly in the exponent field:
//   subnormal: ee = emin, r = frac                      -> field 0
//   normal:    r = 2^man + frac, ee - emin + 1 = field  -> field, frac
CPD_FN u32 encode_value_bits(u32 v, const Format& f) {
  u32 sign_code = (v & SIGN) ? f.code_mag_mask + 1u : 0u;
  u32 a = v & ~SIGN;
  if (a > INF_BITS) return sign_code | f.nan_code;  // callers reject NaN for formats with no NaN code
  if (a == INF_BITS) return sign_code | f.inf_code;
  Split s = split(a, f);
  u32 r = s.M >> imin(s.d, 25);
  return sign_code | (r + ((u32)(s.ee - f.emin) << f.man));
}

// The same on the fast path (f.fast = 1), branch-free:
//   v >= 2^emin:  v = 0 | field32 (8) | kept (man) | 0 (d0)  and the format's field is
//                 field32 - 127 + bias, so   code = (v >> d0) - ((127 - bias) << man);
//   v <  2^emin:  v = k * q with k < 2^man, and C + k*q (C = 2^(emin-man+23), ulp q) is exact
//                 with bits C_bits + k, so   code = bits(v + C) - bits(C).
CPD_FN u32 encode_value_bits_fast(u32 v, const Format& f) {
  u32 sign_code = sel(v >> 31, f.code_mag_mask + 1u, 0u);
  u32 a = v & ~SIGN;
  u32 normal = (a >> (23 - f.man)) - f.code_adj;
  u32 sub = bits_of(fadd(float_of(a), f.sub_c)) - bits_of(f.sub_c);
  u32 code = sign_code | sel((u32)(a >= f.min_normal_bits), normal, sub);
  code = sel((u32)(a == INF_BITS), sign_code | f.inf_code, code);
  return sel((u32)(a > INF_BITS), sign_code | f.nan_code, code);
}

// The inverse: code -> float32 bits.
CPD_FN u32 decode_bits(u32 code, const Format& f) {
  u32 sign = (code >> (f.exp + f.man)) & 1u ? SIGN : 0u;
  u32 mag = code & f.code_mag_mask;
  u32 field = mag >> f.man, frac = mag & ((1u << f.man) - 1u);
  if (f.specials == SPECIALS_IEEE && field == (1u << f.exp) - 1u) return sign | (frac ? QNAN_BITS : INF_BITS);
  if (f.specials == SPECIALS_FN && mag == f.code_mag_mask) return sign | QNAN_BITS;
  return sign | compose(field ? frac | (1u << f.man) : frac, imax((int)field, 1) - f.bias - f.man);
}

}  // namespace cpd

#endif  // CPD_CODES_H
