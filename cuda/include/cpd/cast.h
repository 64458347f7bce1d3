// cpd numerics core, cast.h: Rounding one float32 value to a format: every mode, the generic and the fast path.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
#ifndef CPD_CAST_H
#define CPD_CAST_H

#include "cpd/format.h"

namespace cpd {

// ------------------------------------------------------------------------------------------
// Stochastic rounding (round_mag step 2, and the fast path): the dropped bits rem = M mod 2^d
// as a 32-bit fraction of a quantum, F = floor(rem * 2^32 / 2^d) (exact for d <= 32; for d > 32
// the bits below 2^-32 of a quantum are dropped) ...
CPD_FN u32 sr_fraction(const Split& s) {
  int dc = imin(s.d, 25);
  u32 rem = s.M & ((1u << dc) - 1u);
  u32 left = rem << imin(imax(32 - s.d, 0), 31);  // d = 0: rem = 0, so shifting by 31 is harmless
  return sel((u32)(s.d <= 32), left, rem >> imin(imax(s.d - 32, 0), 31));
}

// ... then truncate F and the random word to their top sr_bits bits, add, and round up on the
// carry out of bit 31: probability trunc(F) / 2^32 exactly.
CPD_FN u32 sr_carry(u32 frac, u32 rand, int sr_bits) {
  u32 mask = ~0u << (32 - sr_bits);  // sr_bits in 1..32
  u32 sum = (frac & mask) + (rand & mask);
  return (u32)(sum < (frac & mask));  // carry out of bit 31
}

// Round a finite magnitude to the format's grid, ignoring the range limit (overflow is the
// caller's). Returns r with result = r * 2^qexp; r may be 2^(man+1) after a carry into the next
// binade, which compose() and the code formula both handle.
//
// Steps:
//   1. Drop the d low bits of M:   M = [ r | rem ],  rem has d bits (d clamped to 25: for d >= 25
//      r = 0 and rem = M < 2^24 < 2^(d-1) whatever d is, so nearest and directed modes decide
//      the same; stochastic rounding uses the true d).
//   2. Decide whether to add one quantum:
//      nearest:     rem > half, or rem == half and the result's encoding is odd. The encoding's
//                   last bit is r's last bit, except with man = 0 where it is the last bit of the
//                   exponent field ee + bias (r = 1) or 0 (r = 0, the code of zero).
//      nearest_away: rem >= half.
//      odd:         rem != 0 and r's encoding is even (the same last bit as nearest's).
//      directed:    any rem != 0, in the mode's direction for this sign.
//      stochastic:  rem / 2^d scaled to a 32-bit fraction F (exact for d <= 32; for d > 32 the
//                   bits below 2^-32 of a quantum are dropped), truncated to sr_bits; add as many
//                   random bits and round up on the carry out of bit 31, i.e. with probability
//                   trunc(F) / 2^32 exactly.
CPD_FN u32 round_mag(const Split& s, const Format& f, int mode, u32 sign, u32 rand, int sr_bits) {
  int dc = imin(s.d, 25);
  u32 r = s.M >> dc;
  u32 rem = s.M & ((1u << dc) - 1u);
  u32 twice = rem << 1, quantum = 1u << dc;
  u32 lsb = r & sel((u32)(f.man != 0), 1u, (u32)(s.ee + f.bias)) & 1u;
  u32 up;
  if (mode == NEAREST) {
    up = (twice > quantum) | ((twice == quantum) & lsb);
  } else if (mode == NEAREST_AWAY) {
    up = (u32)(twice >= quantum) & (u32)(rem != 0);
  } else if (mode == ODD) {
    up = (u32)(rem != 0) & (lsb ^ 1u);
  } else if (mode == STOCHASTIC) {
    up = sr_carry(sr_fraction(s), rand, sr_bits);
  } else if (mode == TOWARD_ZERO) {
    up = 0;
  } else {
    u32 away = mode == UP ? (sign == 0) : (sign != 0);
    up = (rem != 0) & away;
  }
  return r + up;
}

// True when rounding |x| in this mode moves toward zero for this sign, so that an overflow gives
// the largest finite value and never infinity (IEEE 754 §7.4). Round to odd counts as inward: it
// is truncation with a sticky last bit, and ±max stands for everything beyond it.
CPD_FN u32 rounds_inward(int mode, u32 sign) {
  u32 neg = sign >> 31;
  return (u32)(mode == TOWARD_ZERO || mode == ODD) | ((u32)(mode == UP) & neg) | ((u32)(mode == DOWN) & (neg ^ 1u));
}

// The conventions' last word on a result: sign | mag, mag already rounded, range-checked and
// flushed; a = |input| (0 for an exact zero). In this order:
//   no -0 (FNUZ, P3109, unsigned):  a zero magnitude gets the + sign;
//   no zero (FNU):                  a magnitude below 2^emin (0 included) becomes 2^emin;
//   NaN:                            FNU's zero input, and an unsigned format's negative input.
// Plain IEEE/FN/FINITE formats pass through unchanged (uz = no_zero = 0, is_signed = 1).
CPD_FN u32 convention_bits(u32 sign, u32 mag, u32 a, const Format& f) {
  u32 s = sel(f.uz & (u32)(mag == 0u), 0u, sign);
  mag = sel(f.no_zero & (u32)(mag < f.min_normal_bits), f.min_normal_bits, mag);
  u32 nan = (f.no_zero & (u32)(a == 0u)) | ((f.is_signed ^ 1u) & (u32)(sign != 0u) & (u32)(a != 0u));
  return sel(nan, QNAN_BITS, s | mag);
}

// ------------------------------------------------------------------------------------------
// The cast: float32 bits in, float32 bits of a value of the format out.
// Cases, in order:
//   1. NaN in   -> the same NaN.
//   2. ±inf in  -> saturate: ±max; ieee: ±inf; fn: NaN; finite: ±max.
//   3. finite   -> round the magnitude (round_mag), then
//      a. overflow (result > max): saturate, finite formats and inward rounding give ±max;
//         otherwise ieee gives ±inf and fn gives NaN;
//      b. subnormals off and 0 < result < 2^emin: signed zero;
//   4. the sign is put back (zeros keep theirs), and the convention has its say (convention_bits:
//      no -0, no zero, unsigned).
//
// `outward` (f.outward_bits) is ±max with saturate or for finite formats, else inf (ieee) or
// NaN (fn). Written as two-way selects, not early returns, so that the host loop vectorizes.
// Steps 1, 2, 3a, 3b and 4 are shared by both paths (finish_cast); only step 3's rounding of
// the magnitude differs.
//
// `inf_by_3a`: the caller's rounded magnitude of a = INF_BITS is at least INF_BITS, and mode
// never rounds inward; then step 3a already gives an infinite x its step-2 result (INF_BITS >
// max_bits, so mag > max_bits and ovf = outward_bits), and step 2's select is left out. The fast
// path's region N in the modes that round to nearest, and in stochastic rounding, is such a
// caller (cast_bits_fast, inf_by_3a_mode): it rounds a by (a + half - 1 + even) & ~qmask, or
// (a + r) & ~qmask with r <= qmask, and INF_BITS's dropped bits are 0, so no carry reaches the
// kept bits and nothing is lost above them. One select fewer per element.
//
// The compares of steps 3a and 1 are signed: a = |x| is below 2^31, and so are max_bits (a
// composed positive float, at most INF_BITS) and mag wherever a <= INF_BITS (a positive float
// composed or selected, or a + r with a <= INF_BITS and r <= 2^23 on the fast path); a NaN's mag
// may wrap past 2^31, but step 1 replaces it. Signed, the vector loops take one compare per step
// (AVX2 vpcmpgtd) instead of an unsigned one's two (vpminud, vpcmpeqd).
CPD_FN u32 finish_cast(u32 u, u32 a, u32 sign, u32 mag, const Format& f, int mode, int inf_by_3a = 0) {
  u32 ovf = sel(rounds_inward(mode, sign), f.max_bits, f.outward_bits);
  mag = sel((u32)((int)mag > (int)f.max_bits), ovf, mag);                 // 3a.
  if (!inf_by_3a) mag = sel((u32)(a == INF_BITS), f.outward_bits, mag);     // 2.
  u32 flush = (u32)(f.subnormals == 0) & (u32)(mag < f.min_normal_bits);
  mag = sel(flush, 0u, mag);                                                // 3b.
  u32 res = convention_bits(sign, mag, a, f);  // a NaN from an fn overflow keeps the sign  // 4.
  return sel((u32)((int)a > (int)INF_BITS), u, res);                        // 1.
}

// The generic path: any format FloatFormat accepts. This is the specification; the fast path
// below must (and is checked exhaustively to, tests/cpp/exhaustive_fast_vs_generic.cpp) give the
// same bits wherever it applies.
CPD_FN u32 cast_bits_generic(u32 u, const Format& f, int mode, u32 rand, int sr_bits) {
  u32 sign = u & SIGN;
  u32 a = u ^ sign;
  Split s = split(a, f);
  u32 mag = compose(round_mag(s, f, mode, sign, rand, sr_bits), s.qexp);    // 3.
  return finish_cast(u, a, sign, mag, f, mode);
}

// The fast path, for formats with fast_path_applies(f) (f.fast = 1): no split(), no compose().
// The magnitude a = |x| is rounded in one of two regions, both computed and one selected:
//
//   N. a >= 2^emin (a >= min_normal_bits; also inf/NaN, fixed up by finish_cast): the quantum is
//      2^(E - man), i.e. the d0 = 23 - man low bits of the float32 mantissa:
//        a = 0 | field (8) | kept (man) | dropped (d0)         dropped = a & qmask
//      1. truncate:   t = a & ~qmask
//      2. nearest:    (a + half - 1 + even) & ~qmask  with half = 2^(d0-1), even = the result's
//                     encoding's last bit = ((a >> d0) + parity_add) & 1: the last kept bit; with
//                     man = 0 the last bit of the format's exponent field, which is the float32
//                     field + bias - 127, of the same parity as field + bias + 1. A tie rounds up
//                     exactly when that bit is 1 (odd -> even); above half always rounds up.
//         nearest_away: (a + half) & ~qmask (half = half_m1 + lsb_bit; d0 = 0 drops nothing).
//         odd:        t + 2^d0 when dropped != 0 and t's encoding is even (its last bit is the
//                     even bit above): from an even encoding one quantum up is the odd one.
//         directed:   t + 2^d0 when dropped != 0 and the mode goes away from zero.
//         stochastic: frac = dropped << (32 - d0), round up on the carry as in round_mag.
//      A carry out of the mantissa lands in the float32 exponent field, which is the next binade
//      (or +inf bits past float32's max): exactly the value the generic path composes, and any
//      overflow is caught by finish_cast comparing against max_bits.
//
//   S. a < 2^emin: the quantum is the constant q = 2^(emin - man). With C = 2^(emin - man + 23),
//      C has ulp q and a + C lies in [C, 2C], so the float32 add rounds a to the nearest multiple
//      of q, ties to even (the parity of the sum's last mantissa bit is that of a / q rounded: the
//      same even bit the generic path uses: r & 1, also for man = 0, where it is
//      r & (emin + bias) & 1 and emin + bias = 1). Then
//        v = (a + C) - C                      exact (Sterbenz)
//        t = v > a ? v - q : v                truncation toward zero (exact: a multiple of q < 2^emin)
//        away = t < a ? t + q : t             one quantum up when anything was dropped
//        stochastic: rem = a - t (exact), frac = floor(rem * 2^32 / q): rem * 2^(32-emin+man) as two
//                    exact power-of-two scalings, converted by truncation; identical to round_mag's
//                    frac, also when it shifts right (d > 32: bits below 2^-32 of a quantum dropped).
//      These are float32 operations on float32 subnormals: no FTZ/DAZ may be in effect (as for
//      compose()).

// Region N: the rounded magnitude for a >= min_normal_bits (garbage below).
CPD_FN u32 round_normal_fast(u32 a, u32 sign, const Format& f, int mode, u32 rand, int sr_bits) {
  u32 away = mode == UP ? (u32)(sign == 0) : mode == DOWN ? (u32)(sign != 0) : 0u;  // directed: go up?
  u32 dropped = a & f.qmask;
  u32 t = a & ~f.qmask;                                                      // N1.
  if (mode == NEAREST) {
    u32 even = ((a >> (23 - f.man)) + f.parity_add) & f.lsb_bit;
    return (a + f.half_m1 + even) & ~f.qmask;                                // N2. nearest
  } else if (mode == NEAREST_AWAY) {
    return (a + f.half_m1 + f.lsb_bit) & ~f.qmask;
  } else if (mode == ODD) {
    u32 odd = ((a >> (23 - f.man)) + f.parity_add) & 1u;
    return t + (((u32)(dropped != 0) & (odd ^ 1u)) << (23 - f.man));
  } else if (mode == STOCHASTIC) {
    // t + (sr_carry(dropped << sr_shift, rand, sr_bits) << d0) in three integer steps. Let
    // R = rand's top sr_bits bits (sr_carry's mask) and r = R >> sr_shift, R's part at or above
    // bit sr_shift moved down to dropped's position (0 when d0 = 0, where qmask = 0). Then
    // dropped + r >= 2^d0 exactly when sr_carry carries: with sr_bits >= d0 the mask leaves
    // dropped << sr_shift whole and R's bits below sr_shift cannot reach the next multiple of
    // 2^sr_shift; with sr_bits < d0 both sides compare the top sr_bits bits of dropped, and
    // dropped's lower bits cannot reach the next multiple of 2^(d0 - sr_bits). So a + r carries
    // into the kept bits exactly when round_mag rounds up, and & ~qmask truncates.
    // (R >> sr_shift) & qmask as (rand >> sr_shift) & (qmask & (mask >> sr_shift)): the same bits
    // (a logical shift commutes with the and), one operation fewer per element in a loop.
#if defined(__CUDA_ARCH__)  // the form below made ptxas spill cpd_reduce_rows at sm_90 (stack 16)
    u32 r = ((rand & (~0u << (32 - sr_bits))) >> f.sr_shift) & f.qmask;
#else
    u32 r = (rand >> f.sr_shift) & (f.qmask & ((~0u << (32 - sr_bits)) >> f.sr_shift));
#endif
    return (a + r) & ~f.qmask;
  } else {
    return t + (((u32)(dropped != 0) & away) << (23 - f.man));               // N2. directed
  }
}

// Region S: the rounded magnitude for a < min_normal_bits (garbage, but no undefined behaviour,
// elsewhere). Float arithmetic against the fixed quantum q. Every float operation is done on every
// lane and the results are picked with sel() on their bits: no conditional float code, which GCC
// would not if-convert (it could raise FP flags), so the loop vectorizes.
CPD_FN u32 round_sub_fast(u32 a, u32 sign, const Format& f, int mode, u32 rand, int sr_bits) {
  u32 away = mode == UP ? (u32)(sign == 0) : mode == DOWN ? (u32)(sign != 0) : 0u;
  float ax = float_of(a);
  float v = fsub(fadd(ax, f.sub_c), f.sub_c);                                // nearest, ties even
  if (mode == NEAREST) return bits_of(v);
  u32 tz = sel((u32)(v > ax), bits_of(fsub(v, f.sub_q)), bits_of(v));        // toward zero
  // The directed modes' zero as +0: where the processor itself rounds down (the CPU matmul's
  // directed lanes, accumulate.h), an exact zero difference above is -0. To nearest it is +0 already.
  if (mode == UP || mode == DOWN || mode == TOWARD_ZERO) tz &= ~SIGN;
  u32 tz_up = bits_of(fadd(float_of(tz), f.sub_q));                          // one quantum further
  u32 grow;
  if (mode == NEAREST_AWAY) {  // rem = a - t exact (< q); 2 rem >= q is a tie or more
    float rem = fsub(ax, float_of(tz));
    grow = (u32)(fadd(rem, rem) >= f.sub_q) & (u32)(a < f.min_normal_bits);
  } else if (mode == ODD) {  // t's code is bits(t + C) - bits(C) (see encode_value_bits_fast)
    u32 code = bits_of(fadd(float_of(tz), f.sub_c)) - bits_of(f.sub_c);
    grow = (u32)(float_of(tz) < ax) & ((code & 1u) ^ 1u);
  } else if (mode == STOCHASTIC) {
    // rem < q below 2^emin; elsewhere (huge, inf, NaN) it is replaced by 0 before the
    // conversion, which must stay in range (a float -> u32 conversion out of range is undefined).
    u32 rem = sel((u32)(a < f.min_normal_bits), bits_of(fsub(ax, float_of(tz))), 0u);
    u32 frac = (u32)fmul(fmul(float_of(rem), f.sr_scale1), f.sr_scale2);
    grow = sr_carry(frac, rand, sr_bits);
  } else {
    grow = (u32)(float_of(tz) < ax) & away;
  }
  return sel(grow, tz_up, tz);
}

// The modes whose region N rounds INF_BITS to at least itself and that never round inward, so that
// finish_cast's step 3a already gives an infinite x its result (inf_by_3a): round to nearest, ties
// to even or away (INF_BITS's dropped bits are 0: (a + half - 1 + even) carries nothing into the
// kept bits), and stochastic rounding ((a + r) & ~qmask with r <= qmask is INF_BITS again).
CPD_FN int inf_by_3a_mode(int mode) { return (int)(mode == NEAREST || mode == NEAREST_AWAY || mode == STOCHASTIC); }

CPD_FN u32 cast_bits_fast(u32 u, const Format& f, int mode, u32 rand, int sr_bits) {
  u32 sign = u & SIGN;
  u32 a = u ^ sign;
  u32 n_mag = round_normal_fast(a, sign, f, mode, rand, sr_bits);
  u32 s_mag = round_sub_fast(a, sign, f, mode, rand, sr_bits);
  u32 mag = sel((u32)(a < f.min_normal_bits), s_mag, n_mag);                // 3.
  return finish_cast(u, a, sign, mag, f, mode, inf_by_3a_mode(mode));
}

// cast_bits_fast restricted to region N: the same expression with region S left out, so it
// equals cast_bits_fast wherever |x| >= 2^emin, infinities and NaNs included. For loops that
// check a whole chunk for |x| < 2^emin first (cuda/cpu/cast.cpp) and skip region S's float work
// when there is none.
CPD_FN u32 cast_bits_fast_normal(u32 u, const Format& f, int mode, u32 rand, int sr_bits) {
  u32 sign = u & SIGN;
  u32 a = u ^ sign;
  return finish_cast(u, a, sign, round_normal_fast(a, sign, f, mode, rand, sr_bits), f, mode, inf_by_3a_mode(mode));
}

// The cast, on whichever path applies. Loops should test f.fast once per launch and call
// cast_bits_fast / cast_bits_generic directly (cuda/cpu/cast.cpp does).
CPD_FN u32 cast_bits(u32 u, const Format& f, int mode, u32 rand, int sr_bits) {
  return f.fast ? cast_bits_fast(u, f, mode, rand, sr_bits) : cast_bits_generic(u, f, mode, rand, sr_bits);
}

}  // namespace cpd

#endif  // CPD_CAST_H
