// cpd numerics core, codes.h: Codes: values of a format to their 1+exp+man-bit integer codes and back.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
#ifndef CPD_CODES_H
#define CPD_CODES_H

#include "cpd/cast.h"
#include "cpd/format.h"

namespace cpd {

// ------------------------------------------------------------------------------------------
// Codes. A code is  s | field (exp bits) | frac (man bits)  in the low exp+man (+1 if signed) bits.
// For a value v of the format (what cast_bits returns), split() gives r = v / 2^qexp exactly
// (d low bits are zero), and
//   code magnitude = r + ((ee - emin) << man) - code_sub
// because a normal r carries the implicit 2^man, which lands exactly in the exponent field:
//   subnormal: ee = emin, r = frac                      -> field 0
//   normal:    r = 2^man + frac, ee - emin + 1 = field  -> field, frac
// (FNU has no subnormals and its field 0 is the binade emin = -bias: the implicit bit is taken
// off again, code_sub = 2^man.) NaN is sign_code | nan_code, or nan_code alone where the format
// has one NaN code (nan_fixed: FNUZ, P3109, unsigned); callers reject NaN for formats with none.
CPD_FN u32 encode_value_bits(u32 v, const Format& f) {
  u32 sign_code = (v & SIGN) ? f.sign_code : 0u;
  u32 a = v & ~SIGN;
  if (a > INF_BITS) return f.nan_fixed ? f.nan_code : sign_code | f.nan_code;
  if (a == INF_BITS) return sign_code | f.inf_code;
  Split s = split(a, f);
  u32 r = s.M >> imin(s.d, 25);
  return sign_code | (r + ((u32)(s.ee - f.emin) << f.man) - f.code_sub);
}

// The same on the fast path (f.fast = 1), branch-free:
//   v >= 2^emin:  v = 0 | field32 (8) | kept (man) | 0 (d0)  and the format's field is
//                 field32 - 127 + bias, so   code = (v >> d0) - ((127 - bias) << man);
//   v <  2^emin:  v = k * q with k < 2^man, and C + k*q (C = 2^(emin-man+23), ulp q) is exact
//                 with bits C_bits + k, so   code = bits(v + C) - bits(C).
//                 (FNU has no values below 2^emin.)
CPD_FN u32 encode_value_bits_fast(u32 v, const Format& f) {
  u32 sign_code = sel(v >> 31, f.sign_code, 0u);
  u32 a = v & ~SIGN;
  u32 normal = (a >> (23 - f.man)) - f.code_adj;
  u32 sub = bits_of(fadd(float_of(a), f.sub_c)) - bits_of(f.sub_c);
  u32 code = sign_code | sel((u32)(a >= f.min_normal_bits), normal, sub);
  code = sel((u32)(a == INF_BITS), sign_code | f.inf_code, code);
  return sel((u32)(a > INF_BITS), sel(f.nan_fixed, f.nan_code, sign_code | f.nan_code), code);
}

// The inverse: code -> float32 bits (bits above the format's width are ignored).
CPD_FN u32 decode_bits(u32 code, const Format& f) {
  code &= f.sign_code | f.code_mag_mask;
  u32 sign = (code & f.sign_code) ? SIGN : 0u;
  u32 mag = code & f.code_mag_mask;
  u32 field = mag >> f.man, frac = mag & ((1u << f.man) - 1u);
  if (f.nan_fixed && f.nan_code && code == f.nan_code) return QNAN_BITS;
  if (f.specials == SPECIALS_IEEE && field == (1u << f.exp) - 1u) return sign | (frac ? QNAN_BITS : INF_BITS);
  if ((f.specials == SPECIALS_FN || f.specials == SPECIALS_FNU) && mag == f.code_mag_mask) return sign | QNAN_BITS;
  if (f.specials == SPECIALS_P3109 && mag == f.inf_code) return sign | INF_BITS;
  u32 normal = (u32)(field != 0) | f.no_zero;
  int e = (f.no_zero ? (int)field : imax((int)field, 1)) - f.bias - f.man;
  return sign | compose(normal ? frac | (1u << f.man) : frac, e);
}

// ------------------------------------------------------------------------------------------
// Cast and encode in one step, for the wire's hot loops (cuda/cpu/hop.cpp) and cpd.encode's spans
// of finite values (cuda/cpu/cast.cpp): for finite u (float32 bits) and a format with
// cast_code_applies(f),
//     cast_code_fast(u, f, mode) == encode_value_bits_fast(cast_bits_fast(u, f, mode, 0, 32), f)
// without composing the rounded value: the code is read off the rounding itself.
//   region N (|u| >= 2^emin): round_normal_fast's rounded magnitude t has d0 = 23 - man zero low
//            bits, and its code is (t >> d0) - code_adj (encode_value_bits_fast); a carry into the
//            next binade is the next code, so the rounded value overflows exactly when this code
//            passes the largest finite code, and then becomes the code of finish_cast's
//            overflow value (the largest finite value rounding inward, else outward_bits:
//            inf, NaN or, saturating, the largest finite value);
//   region S (|u| < 2^emin):  the code of round_sub_fast's value v is bits(v + C) - bits(C)
//            (encode_value_bits_fast); to nearest, v + C is fl32(|u| + C) itself.
// The sign code goes on top. Infinite and NaN u are the caller's (its loop checks
// |u| >= INF_BITS and takes cast_bits / encode_value_bits for them).
// (Signed classic conventions only: IEEE, FN, FINITE, as arith.h's plain_convention; and a
// largest finite value that is normal, max_bits >= min_normal_bits, so that its code is region N's
// (max_bits >> d0) - code_adj: IEEE with exp = 1, e.g. e1m6, has no normal value, its field 1
// being inf/NaN, and its largest finite value is a subnormal whose code that formula misreads.)
CPD_FN int cast_code_applies(const Format& f) {
  return (int)(f.fast && f.subnormals && f.is_signed && !f.uz && !f.no_zero && f.specials <= SPECIALS_FINITE &&
               f.max_bits >= f.min_normal_bits);
}

// cast_code_fast's last steps: a magnitude's code past the largest finite one becomes the
// overflow code, and the sign code goes on top.
CPD_FN u32 finish_code_fast(u32 sign, u32 code, const Format& f, int mode) {
  u32 max_code = (f.max_bits >> (23u - (u32)f.man)) - f.code_adj;
  u32 out_code = sel((u32)(f.outward_bits == INF_BITS), f.inf_code,
                     sel((u32)(f.outward_bits > INF_BITS), f.nan_code, max_code));
  code = sel((u32)(code > max_code), sel(rounds_inward(mode, sign), max_code, out_code), code);
  return sel(sign >> 31, f.sign_code, 0u) | code;
}

CPD_FN u32 cast_code_fast(u32 u, const Format& f, int mode) {
  u32 sign = u & SIGN;
  u32 a = u ^ sign;
  u32 d0 = 23u - (u32)f.man;
  u32 n_code = (round_normal_fast(a, sign, f, mode, 0u, 32) >> d0) - f.code_adj;
  float v = mode == NEAREST ? float_of(a) : float_of(round_sub_fast(a, sign, f, mode, 0u, 32));
  u32 s_code = bits_of(fadd(v, f.sub_c)) - bits_of(f.sub_c);
  return finish_code_fast(sign, sel((u32)(a < f.min_normal_bits), s_code, n_code), f, mode);
}

// cast_code_fast restricted to region N (finite u with |u| >= 2^emin): region S's steps left
// out, as cast_bits_fast_normal is cast_bits_fast's; for loops that check a whole span for
// |x| < 2^emin (and for inf/NaN) first (cuda/cpu/cast.cpp's encode).
CPD_FN u32 cast_code_fast_normal(u32 u, const Format& f, int mode) {
  u32 sign = u & SIGN;
  u32 a = u ^ sign;
  return finish_code_fast(sign, (round_normal_fast(a, sign, f, mode, 0u, 32) >> (23u - (u32)f.man)) - f.code_adj,
                          f, mode);
}

// The code a value v of the format travels as in cpd.distributed: cpd.encode after the wire's
// NaN rule (a format without a NaN code sends NaN as +inf: only after an overflow, a step every
// rank skips). fe is the format without saturate (what cpd.encode sees). The one definition of
// cuda/cpu/hop.cpp and cuda/kernels/hop.cu.
CPD_FN u32 wire_code_bits(u32 v, const Format& fe) {
  if ((v & ~SIGN) > INF_BITS && fe.nan_code == 0u) v = INF_BITS;
  return encode_value_bits(cast_bits(v, fe, NEAREST, 0u, 32), fe);
}

// ------------------------------------------------------------------------------------------
// The binary16 view of a code, for the wire's vector hop (cuda/cpu/hop_avx2.h, which decodes codes
// 8 per F16C conversion instead of a table gather per code). For a signed
// 8-bit format whose exponent field fits binary16's (exp <= 5, 2 <= man <= 10), put the code's
// magnitude bits where binary16 keeps its exponent field (bits 10..14) and the top of its fraction:
//     h = sign << 15 | mag << (10 - man).
// For the conventions with a zero of each sign and subnormals (IEEE, FN, finite: FNUZ's -0 code
// is its NaN, and without subnormals field 0 is not 0.f 2^emin) and every code of field F < 31
// (binary16's inf/NaN field) that decodes to a finite v, h is the binary16 value v * 2^(bias - 15),
// exactly:
//     F >= 1, fraction f:  v = 2^(F - bias) (1 + f 2^-man)   h = 2^(F - 15) (1 + f 2^-man)
//     F = 0:               v = 2^(1 - bias) f 2^-man          h = binary16 subnormal 2^-14 f 2^-man
// (the FN/finite conventions' largest binade is an ordinary field here: their NaN code is excluded
// by being non-finite). The conversion of binary16 to float32 is exact, and scaling by a power of
// two commutes with float32 rounding away from float32's subnormals and overflow: the views lie in
// {0} and [2^-24, 2^16), their float32 sum in {0} and [2^-24, 2^17], and a sum of two values of
// the format is 0 or a multiple of 2^(emin - man) = 2^(1 - bias - man) >= 2^(-9 - bias), so for
// -95 <= bias <= 117 every quantity stays a float32 normal (or zero) and
//     fl32(x + y) = fl32(view(x) + view(y)) * 2^(15 - bias)     exactly.
// The hop thus adds exactly the float32 sums it would add from decoded values.
CPD_FN int half_view_applies(const Format& f) {
  return (int)(f.is_signed && !f.uz && !f.no_zero && f.subnormals && f.specials <= SPECIALS_FINITE &&
               f.exp + f.man == 7 && f.exp <= 5 && f.man >= 2 && f.man <= 10 && f.bias >= -95 && f.bias <= 117);
}

CPD_FN u32 half_bits_of_code(u32 code, const Format& f) {
  return ((code & f.sign_code) << (15 - f.exp - f.man)) | ((code & f.code_mag_mask) << (10 - f.man));
}

// The smallest code magnitude the view does not serve: the first that decodes to inf or NaN or,
// for exp = 5, lies in field 31; 1 << (exp + man) when there is none. In every convention of
// cast_code_applies (IEEE, FN, finite) those magnitudes are the top ones, so a magnitude below the
// limit is a finite value the view gives exactly.
CPD_FN u32 half_view_limit(const Format& f) {
  for (u32 m = 0; m <= f.code_mag_mask; ++m)
    if ((decode_bits(m, f) & ~SIGN) >= INF_BITS || (m >> f.man) >= 31u) return m;
  return f.code_mag_mask + 1u;
}

}  // namespace cpd

#endif  // CPD_CODES_H
