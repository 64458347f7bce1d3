// cpd numerics core, format.h: The format descriptor and the split of a float32 magnitude against a format's grid.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
#ifndef CPD_FORMAT_H
#define CPD_FORMAT_H

#include "cpd/base.h"

namespace cpd {

// ------------------------------------------------------------------------------------------
// The format descriptor. Built once per launch from the Python FloatFormat's five fields.
struct Format {
  int exp, man, bias, specials, subnormals;
  int emin;            // 1 - bias
  u32 max_bits;        // float32 bits of the largest finite value
  u32 min_normal_bits; // float32 bits of 2^emin
  u32 code_mag_mask;   // (1 << (exp + man)) - 1: every bit of a code but the sign
  u32 nan_code;        // positive code of the canonical NaN (0 if the format has none)
  u32 inf_code;        // positive code of +inf (0 if the format has none)
  u32 outward_bits;    // what an outward overflow or an infinite input becomes (see cast_bits)
  // The fast path (cast_bits_fast, encode_value_bits_fast); meaningful only when fast = 1.
  int fast;            // 1 when the fast path applies (see fast_path_applies)
  u32 qmask;           // (1 << d0) - 1 with d0 = 23 - man: float32 mantissa bits below the quantum
  u32 half_m1;         // d0 ? 2^(d0-1) - 1 : 0 (nearest: add half - 1, plus the even bit)
  u32 lsb_bit;         // d0 ? 1 : 0 (d0 = 0: nothing is dropped, no even bit to add)
  u32 parity_add;      // man == 0 ? bias + 1 : 0 (see cast_bits_fast, step 2)
  u32 sr_shift;        // d0 ? 32 - d0 : 0: moves the d0 dropped bits to the top of a 32-bit fraction
  u32 code_adj;        // (127 - bias) << man: float32 exponent field -> format exponent field
  float sub_c;         // C = 2^(emin - man + 23): adding it rounds a magnitude < 2^emin to the grid
  float sub_q;         // q = 2^(emin - man): the quantum below 2^emin
  float sr_scale1;     // sr_scale1 * sr_scale2 = 2^(32 - emin + man) = 2^32 / q, both powers of two
  float sr_scale2;
};

// r * 2^qexp as float32 bits, for 0 <= r <= 2^24 and -149 <= qexp <= 128.
// The power of two is built from bits (a float32 subnormal below 2^-126):
//   qexp >= -126:  0 | qexp+127 (8 bits) | 000...0      e.g. 2^-3 = 0 01111100 000..0
//   qexp <  -126:  0 | 00000000 | 0..010..0 (bit qexp+149)
// and the product is exact because r * 2^qexp is a float32 value (or >= 2^128, where it is
// +inf, which the caller treats as overflow). No FTZ/DAZ may be in effect.
CPD_FN u32 compose(u32 r, int qexp) {
  u32 normal = (u32)(imin(qexp, 128) + 127) << 23;
  u32 subnormal = 1u << imin(imax(qexp, -149) + 149, 31);  // both computed: shift kept < 32
  u32 p2 = sel((u32)(qexp >= -126), normal, subnormal);
  return bits_of((float)(int)r * float_of(p2));
}

// The fast path (cast_bits_fast) needs the format's whole normal range to sit on float32
// normals with a fixed shift, and its constants to be float32 normals:
//   emin >= -126              2^emin is a float32 normal, so |x| >= 2^emin has quantum 2^(E-man)
//                             = a fixed d0 = 23 - man bits of the float32 mantissa;
//   -149 <= emin - man <= 31  q = 2^(emin-man) and C = 2^(emin-man+23) are float32 numbers, and
//                             2^32 / q is a power of two >= 2 (split into two factors <= 2^127);
//   0 <= man <= 23, max finite (no format value beyond float32's range).
CPD_FN int fast_path_applies(const Format& f) {
  int qsub = f.emin - f.man;
  return (int)(f.man >= 0 && f.man <= 23 && f.emin >= -126 && qsub >= -149 && qsub <= 31 && f.max_bits < INF_BITS);
}

// `saturate` only matters to cast_bits; encode/decode ignore it.
CPD_FN Format make_format(int exp, int man, int bias, int specials, int subnormals, int saturate) {
  Format f;
  f.exp = exp;
  f.man = man;
  f.bias = bias;
  f.specials = specials;
  f.subnormals = subnormals;
  f.emin = 1 - bias;
  f.code_mag_mask = (1u << (exp + man)) - 1u;
  u32 top_field = (1u << exp) - 1u;
  u32 max_code = specials == SPECIALS_IEEE ? (top_field << man) - 1u
               : specials == SPECIALS_FN   ? f.code_mag_mask - 1u
                                           : f.code_mag_mask;
  u32 field = max_code >> man, frac = max_code & ((1u << man) - 1u);
  f.max_bits = compose(field ? frac | (1u << man) : frac, imax((int)field, 1) - bias - man);
  f.min_normal_bits = compose(1, f.emin);
  f.inf_code = specials == SPECIALS_IEEE ? top_field << man : 0u;
  f.nan_code = specials == SPECIALS_FN ? f.code_mag_mask
             : (specials == SPECIALS_IEEE && man > 0) ? (top_field << man) | (1u << (man - 1)) : 0u;
  f.outward_bits = (saturate || specials == SPECIALS_FINITE) ? f.max_bits
                 : specials == SPECIALS_IEEE ? INF_BITS : QNAN_BITS;
  // Fast-path constants (see cast_bits_fast). qsub = emin - man is the exponent of q.
  int d0 = 23 - imin(imax(man, 0), 23), qsub = f.emin - man, k = 32 - qsub;
  f.fast = fast_path_applies(f);
  f.qmask = (1u << d0) - 1u;
  f.half_m1 = d0 ? (1u << (d0 - 1)) - 1u : 0u;
  f.lsb_bit = d0 ? 1u : 0u;
  f.parity_add = man == 0 ? (u32)(bias + 1) : 0u;
  f.sr_shift = d0 ? (u32)(32 - d0) : 0u;
  f.code_adj = (u32)(127 - bias) << imin(imax(man, 0), 23);
  f.sub_c = float_of(compose(1, imin(imax(qsub + 23, -126), 127)));
  f.sub_q = float_of(compose(1, imin(imax(qsub, -149), 127)));
  f.sr_scale1 = float_of(compose(1, imin(imax(k, 0), 127)));
  f.sr_scale2 = float_of(compose(1, imin(imax(k - 127, 0), 127)));
  return f;
}

// ------------------------------------------------------------------------------------------
// Split a finite magnitude a (float32 bits, sign clear) against the format's grid.
//
//   a = 0 | field (8) | mant (23)
//   M  = field ? 1.mant : 0.mant as a 24-bit integer      |x| = M * 2^eq
//   E  = floor(log2 |x|): field - 127 for normals; for a float32 subnormal the position of the
//        top set bit of mant, read off the exponent of (float)mant (exact: mant < 2^23).
struct Split {
  u32 M;     // 24-bit significand
  int eq;    // exponent of M's last bit
  int ee;    // max(E, emin)
  int qexp;  // ee - man
  int d;     // qexp - eq >= 0 (guaranteed by FloatFormat's range check)
};

CPD_FN Split split(u32 a, const Format& f) {
  Split s;
  u32 field = a >> 23, mant = a & 0x7fffffu;
  u32 normal = (u32)(field != 0);
  s.M = mant | (normal << 23);
  s.eq = imax((int)field, 1) - 150;
  int e_sub = (int)(bits_of((float)(int)mant) >> 23) - 127 - 149;  // mant = 0 gives a harmless -276
  int E = seli(normal, (int)field - 127, e_sub);
  s.ee = imax(E, f.emin);
  s.qexp = s.ee - f.man;
  s.d = s.qexp - s.eq;
  return s;
}

}  // namespace cpd

#endif  // CPD_FORMAT_H
