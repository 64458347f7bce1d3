// cpd numerics core, block.h: Block-scaled formats (cpd.mx): the shared scale of a block and the
// rounding of its elements against it (OCP Microscaling v1.0, NVIDIA NVFP4).
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
//
// A block of values V_i shares one scale S (a value of the scale format); element i is stored as
// P_i = round(V_i / S), rounded and saturated to the element format, and stands for P_i * S.
// Every rounding here is a call of cast.h / arith.h; this part only decides which value gets
// rounded to which format (cpd/mx.py's pure-torch path and tests/mx_oracle.py say the same):
//
//   amax = max |V_i| (float32 bits: NaN bits > inf bits > every finite, so an integer max over
//          the magnitudes' bits finds NaN and inf too). NaN or inf in the block: S = NaN, and
//          every element is +0 (its value P * S is NaN). amax = 0: S = the smallest positive scale.
//   floor (OCP MX §6.3):  e = floor(log2 amax) - emax_elem,   S = 2^clamp(e, emin_s, emax_s)
//   ceil:                 e + 1 where max_elem * 2^e < amax (no element saturates)
//   even:                 amax first rounded to nearest-even at the element's precision (the
//                         format (8, man_elem, bias 127), saturating), then floor
//   amax (NVFP4):         S = cast(fl(fl(amax / max_elem) / T), scale, nearest, saturate),
//                         at least the smallest positive scale; T = 1 without a tensor scale
//   elements, power-of-two S (floor/ceil/even): P = V * 2^-e rounded once (cpd.mul's exact
//          product; fl32(V * 2^-e) is that product whenever it is a float32 normal or zero);
//          amax rule: P = cast(fl(V / fl(S * T))), the float32 quotient (as torchao and
//          TransformerEngine do); value = fl(P * S) or fl(P * fl(S * T)).
//   MXINT8 (is_int): P = -0 becomes +0 (two's-complement codes have no -0).
#ifndef CPD_BLOCK_H
#define CPD_BLOCK_H

#include "cpd/arith.h"
#include "cpd/cast.h"
#include "cpd/codes.h"

namespace cpd {

// The scale rules: the indices of cpd/mx.py SCALE_RULES.
enum { RULE_FLOOR = 0, RULE_CEIL = 1, RULE_EVEN = 2, RULE_AMAX = 3 };

// float32 division rounded to nearest even (the host build has no fast-math; NVRTC's default
// --prec-div=true makes `/` the IEEE division on the device, as __fdiv_rn).
CPD_FN float fdiv(float x, float y) { return x / y; }

// floor(log2 a) of a finite positive float32 magnitude (bits, a != 0); for a subnormal the
// exponent of (float)mant (exact: mant < 2^23), as split() reads it.
CPD_FN int floor_log2_bits(u32 a) {
  u32 field = a >> 23;
  int e_sub = (int)(bits_of((float)(int)(a & 0x7fffffu)) >> 23) - 127 - 149;
  return seli((u32)(field != 0), (int)field - 127, e_sub);
}

// The 23 fraction bits of a finite positive magnitude normalized to [1, 2) (a subnormal's mant
// converted to float exactly has the same significand).
CPD_FN u32 norm_frac_bits(u32 a) {
  u32 sub = bits_of((float)(int)(a & 0x7fffffu)) & 0x7fffffu;
  return sel((u32)((a >> 23) != 0), a & 0x7fffffu, sub);
}

// Everything a launch needs, built once per launch (cpd/mx.py's BlockFormat fields).
struct BlockSpec {
  Format el;           // element format, saturating
  Format sc;           // scale format, saturating (the amax rule's cast)
  Format ev;           // (8, el.man, 127, ieee), saturating: the even rule's rounding of amax
  int rule;            // RULE_*
  u32 is_int;          // MXINT8: no -0 element
  int emax_elem;       // floor(log2 max_elem)
  u32 max_frac;        // norm_frac_bits(max_elem): the ceil rule's comparison
  int s_emin, s_emax;  // the exponents a power-of-two scale is clamped to
  u32 smallest_bits;   // the smallest positive scale
  float max_elem;
  float t;             // NVFP4's tensor scale T (1 without one)
};

// el, sc: (exp, man, bias, specials, subnormals) of the element and scale formats; ev_specials:
// the core's integer for the IEEE convention of the even rule's format.
CPD_FN BlockSpec make_block_spec(int e_exp, int e_man, int e_bias, int e_specials, int e_sub, int s_exp, int s_man,
                                 int s_bias, int s_specials, int s_sub, int rule, int is_int, float t) {
  BlockSpec b;
  b.el = make_format(e_exp, e_man, e_bias, e_specials, e_sub, 1);
  b.sc = make_format(s_exp, s_man, s_bias, s_specials, s_sub, 1);
  b.ev = make_format(8, e_man, 127, SPECIALS_IEEE, 1, 1);
  b.rule = rule;
  b.is_int = (u32)(is_int != 0);
  b.emax_elem = floor_log2_bits(b.el.max_bits);
  b.max_frac = norm_frac_bits(b.el.max_bits);
  b.s_emin = b.sc.emin;
  b.s_emax = floor_log2_bits(b.sc.max_bits);
  // FloatFormat.smallest_subnormal: 2^(emin - man) with subnormals and man > 0, else 2^emin.
  u32 has_sub = (u32)(s_sub != 0) & (u32)(s_man > 0) & (b.sc.no_zero ^ 1u);
  b.smallest_bits = has_sub ? compose(1, b.sc.emin - s_man) : b.sc.min_normal_bits;
  b.max_elem = float_of(b.el.max_bits);
  b.t = t;
  return b;
}

// The shared scale S (float32 bits) of a block whose largest magnitude has bits amax.
CPD_FN u32 block_scale_bits(u32 amax, const BlockSpec& b) {
  if (amax >= INF_BITS) return QNAN_BITS;
  if (amax == 0u) return b.smallest_bits;
  if (b.rule == RULE_AMAX) {
    float q = fdiv(fdiv(float_of(amax), b.max_elem), b.t);
    u32 s = cast_bits(bits_of(q), b.sc, NEAREST, 0u, 32);
    return s > b.smallest_bits ? s : b.smallest_bits;  // positive: bits order as values
  }
  u32 a = b.rule == RULE_EVEN ? cast_bits(amax, b.ev, NEAREST, 0u, 32) : amax;
  int e = floor_log2_bits(a) - b.emax_elem;
  if (b.rule == RULE_CEIL) e += (int)(norm_frac_bits(a) > b.max_frac);  // max_elem * 2^e < a
  return compose(1, imin(imax(e, b.s_emin), b.s_emax));
}

// What the elements of a block with scale S are divided by, and multiplied back with:
//   power-of-two rules: inv = 2^-e (multiplied, exactly), mul = S;
//   amax rule:          d = fl(S * T): P = cast(fl(x / d)), value fl(P * d).
// (Meaningful for a finite S; callers treat a NaN scale's block on their own.)
CPD_FN float block_divisor(u32 s, const BlockSpec& b) { return fmul(float_of(s), b.t); }
CPD_FN float block_inverse(u32 s) { return float_of(compose(1, -floor_log2_bits(s))); }

// The element P (float32 bits) of x in a block with a power-of-two scale, inv = 2^-e, on the
// path the caller's loop picked: cast of fl(x * inv), exact when pow2_inexact is 0. The forms on
// (el, is_int) are for vectorized loops holding a local copy of the element format.
// An integer element format (MXINT8) has no -0: a rounded -0 becomes +0.
CPD_FN u32 elem_no_int_neg_zero(u32 r, u32 is_int) { return sel(is_int & (u32)(r == SIGN), 0u, r); }

// The scaled value q (float32 bits) rounded to the element format: the end of every rule.
template <bool FAST>
CPD_FN u32 elem_round(u32 q, const Format& el, u32 is_int, int mode, u32 rand, int sr_bits) {
  u32 r = FAST ? cast_bits_fast(q, el, mode, rand, sr_bits) : cast_bits_generic(q, el, mode, rand, sr_bits);
  return elem_no_int_neg_zero(r, is_int);
}

template <bool FAST>
CPD_FN u32 elem_pow2_cast(u32 x, float inv, const Format& el, u32 is_int, int mode, u32 rand, int sr_bits) {
  return elem_round<FAST>(bits_of(fmul(float_of(x), inv)), el, is_int, mode, rand, sr_bits);
}
template <bool FAST>
CPD_FN u32 block_elem_pow2_cast(u32 x, float inv, const BlockSpec& b, int mode, u32 rand, int sr_bits) {
  return elem_pow2_cast<FAST>(x, inv, b.el, b.is_int, mode, rand, sr_bits);
}

// Whether fl(x * inv) may differ from the exact product (so that the cast above would round
// another value): only when it lands below float32's normals from a nonzero x.
CPD_FN u32 pow2_inexact(u32 x, float inv) {
  u32 p = bits_of(fmul(float_of(x), inv)) & ~SIGN;
  return (u32)(p < 0x00800000u) & (u32)((x & ~SIGN) != 0u);
}

// The element in every case: the exact product rounded once (cpd.mul's rule). FAST (only where
// b.el.fast) takes the fast cast path for the common case, with the same bits (cast.h cast_bits).
template <bool FAST = false>
CPD_FN u32 block_elem_pow2(u32 x, float inv, const BlockSpec& b, int mode, u32 rand, int sr_bits) {
  if (!pow2_inexact(x, inv)) return block_elem_pow2_cast<FAST>(x, inv, b, mode, rand, sr_bits);
  return elem_no_int_neg_zero(mul_bits(x, bits_of(inv), b.el, mode, rand, sr_bits), b.is_int);
}

// The element of x under the amax rule (d = block_divisor).
template <bool FAST>
CPD_FN u32 elem_amax(u32 x, float d, const Format& el, u32 is_int, int mode, u32 rand, int sr_bits) {
  return elem_round<FAST>(bits_of(fdiv(float_of(x), d)), el, is_int, mode, rand, sr_bits);
}
template <bool FAST>
CPD_FN u32 block_elem_amax(u32 x, float d, const BlockSpec& b, int mode, u32 rand, int sr_bits) {
  return elem_amax<FAST>(x, d, b.el, b.is_int, mode, rand, sr_bits);
}

// An element's code: MXINT8 stores k = 64 P as 8-bit two's complement; the others their codes.
template <bool FAST>
CPD_FN u32 elem_code(u32 p, const Format& el, u32 is_int) {
  u32 k = (u32)(int)fmul(float_of(sel(is_int, p, 0u)), 64.0f) & 0xffu;  // |64 P| <= 127 when is_int
  return sel(is_int, k, FAST ? encode_value_bits_fast(p, el) : encode_value_bits(p, el));
}
template <bool FAST>
CPD_FN u32 block_elem_code(u32 p, const BlockSpec& b) {
  return elem_code<FAST>(p, b.el, b.is_int);
}

// The inverse: an element code's value P (float32 bits).
CPD_FN u32 block_elem_value(u32 code, const BlockSpec& b) {
  if (b.is_int) return bits_of(fdiv((float)(int)(signed char)(unsigned char)code, 64.0f));
  return decode_bits(code, b.el);
}

}  // namespace cpd

#endif  // CPD_BLOCK_H
