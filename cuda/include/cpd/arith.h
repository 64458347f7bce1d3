// cpd numerics core, arith.h: Exact arithmetic rounded once (a*b, a+b, c+a*b) and its float32-lane forms.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
#ifndef CPD_ARITH_H
#define CPD_ARITH_H

#include "cpd/cast.h"

namespace cpd {

// ------------------------------------------------------------------------------------------
// Exact arithmetic rounded once: a*b, a+b and c + a*b of float32 values, rounded to a format.
// (cpd.mul, cpd.add, cpd.fma, and every step of cpd.sum, cpd.matmul and the collectives.)
//
// The exact result is carried as a Wide value
//     (-1)^sign * (S + t) * 2^e,   S < 2^62 an integer, 0 <= t < 1, and t > 0 iff sticky = 1.
// A product of two float32 significands has at most 48 bits, so S = Ma * Mb is exact. A sum is
// exact unless the smaller operand reaches below the unit 2^e of the larger one shifted to the
// top (bit 60); the bits that fall off then become the sticky flag. That only happens when the
// smaller operand is below 2^48 units, so S >= 2^60 - 2^48 >= 2^59, and the format's quantum
// (at most 24 significant bits below S's top) is >= 2^35 units. Hence every rounding decision is
// the one the exact value gets: nearest compares rem with half (an integer number of units) and
// breaks rem == half with the tail; directed modes see rem != 0 or the tail; stochastic rounding
// takes floor((rem + t) * 2^32 / 2^d) = floor(rem / 2^(d-32)) for integer rem and t < 1.
// This is round_mag's rule on a wider significand; the float32 cast is the special case S = M.
struct Wide {
  u64 S;       // magnitude bits, < 2^62
  int e;       // exponent of S's last bit
  u32 sticky;  // 1: plus a positive tail smaller than one unit 2^e
  u32 sign;    // SIGN or 0
};

CPD_FN int top_bit64(u64 x) {  // position of the highest set bit; x > 0
#if CPD_DEVICE
  return 63 - __clzll((long long)x);
#else
  return 63 - __builtin_clzll(x);
#endif
}

CPD_FN u32 is_finite_bits(u32 u) { return (u32)((u & ~SIGN) < INF_BITS); }

// A finite float32 as a Wide value: S = M (24 bits), e = eq (see split()).
CPD_FN Wide wide_of(u32 u) {
  Wide w;
  u32 a = u & ~SIGN, field = a >> 23;
  w.S = (u64)((a & 0x7fffffu) | ((u32)(field != 0) << 23));
  w.e = imax((int)field, 1) - 150;
  w.sticky = 0;
  w.sign = u & SIGN;
  return w;
}

// a * b exactly: a 24 x 24 -> 48-bit significand; exponents add; signs multiply.
CPD_FN Wide wide_mul(u32 ua, u32 ub) {
  Wide x = wide_of(ua), y = wide_of(ub), p;
  p.S = x.S * y.S;
  p.e = x.e + y.e;
  p.sticky = 0;
  p.sign = (ua ^ ub) & SIGN;
  return p;
}

// x + y, for inputs with sticky = 0 and S < 2^49 (float32 values and exact products).
//   1. A zero operand: the other one. (The sign of an all-zero sum is the caller's.)
//   2. X is the operand whose top bit is higher, shifted so that its top is bit 60:
//        X = 0001xxxxxxxxxxxxxxx000000      exponent ex
//   3. Y is aligned to ex. A right shift by k > 0 drops k bits; if any was set, sticky = 1:
//        Y = 0000000001yyyyyy|yy  ->  00000000000001yyyyyy + sticky
//   4. Same signs: S = X + Y (< 2^62), the dropped bits are the tail.
//      Opposite signs: S = X - Y - sticky, and the tail becomes 1 - (dropped bits) > 0 iff sticky.
//      Y > X is possible only when nothing was dropped; the result then takes y's sign.
CPD_FN Wide wide_add(Wide x, Wide y) {
  if (x.S == 0) return y;  // 1.
  if (y.S == 0) return x;
  if (top_bit64(y.S) + y.e > top_bit64(x.S) + x.e) {  // 2.
    Wide t = x;
    x = y;
    y = t;
  }
  int sh = 60 - top_bit64(x.S);
  u64 X = x.S << sh;
  int ex = x.e - sh;
  int k = ex - y.e;  // 3.
  u64 Y;
  u32 sticky = 0;
  if (k <= 0) {
    Y = y.S << (-k);  // y's top is not above bit 60
  } else {
    int kc = imin(k, 63);
    Y = y.S >> kc;
    sticky = (u32)((y.S & ((1ull << kc) - 1ull)) != 0);
  }
  Wide r;  // 4.
  r.e = ex;
  r.sticky = sticky;
  if (x.sign == y.sign) {
    r.S = X + Y;
    r.sign = x.sign;
  } else if (Y > X) {
    r.S = Y - X;
    r.sign = y.sign;
  } else {
    r.S = X - Y - sticky;
    r.sign = x.sign;
  }
  return r;
}

// Round a Wide value with S > 0 to the format; float32 bits out. The steps of round_mag and
// finish_cast: split against the grid (E, ee, qexp, d as in split()), decide, compose, then the
// overflow (3a), flush (3b) and sign (4) rules of cast_bits.
CPD_FN u32 round_wide(const Wide& w, const Format& f, int mode, u32 rand, int sr_bits) {
  int E = top_bit64(w.S) + w.e;
  int ee = imax(E, f.emin), qexp = ee - f.man, d = qexp - w.e;
  u64 r = d <= 0 ? w.S << (-d) : 0ull;  // d <= 0: exact, S has at most man + 1 bits here
  u32 up = 0;
  if (d > 0) {
    int dc = imin(d, 63);  // S < 2^62, so for d >= 63 r = 0 and rem = S < half still holds
    u64 rem = w.S & ((1ull << dc) - 1ull), half = 1ull << (dc - 1);
    r = w.S >> dc;
    u32 lsb = (u32)r & (f.man ? 1u : (u32)(ee + f.bias)) & 1u;
    u32 tie = (u32)(rem == half);
    if (mode == NEAREST) {
      up = (u32)(rem > half) | (tie & w.sticky) | (tie & (w.sticky ^ 1u) & lsb);
    } else if (mode == NEAREST_AWAY) {
      up = (u32)(rem >= half);
    } else if (mode == ODD) {
      up = ((u32)(rem != 0) | w.sticky) & (lsb ^ 1u);
    } else if (mode == STOCHASTIC) {
      u32 frac = d <= 32 ? (u32)(rem << (32 - d)) : (u32)(rem >> imin(d - 32, 63));
      up = sr_carry(frac, rand, sr_bits);
    } else if (mode == UP || mode == DOWN) {
      u32 away = mode == UP ? (u32)(w.sign == 0) : (u32)(w.sign != 0);
      up = ((u32)(rem != 0) | w.sticky) & away;
    }
  }
  u32 mag = compose((u32)(r + up), qexp);
  if (mag > f.max_bits) mag = rounds_inward(mode, w.sign) ? f.max_bits : f.outward_bits;  // 3a.
  if (!f.subnormals && mag < f.min_normal_bits) mag = 0;                                   // 3b.
  return convention_bits(w.sign, mag, 1u, f);                                              // 4.
}

// An exact zero result of sign `sign` in the format: the signed zero, +0 where there is no -0,
// NaN where there is no zero (FNU).
CPD_FN u32 zero_bits(u32 sign, const Format& f) { return convention_bits(sign, 0u, 0u, f); }

// The sign of an exact zero sum x + y (IEEE 754 §6.3): the common sign if both addends have
// it, otherwise +0, except -0 when rounding down.
CPD_FN u32 zero_sum_sign(u32 sx, u32 sy, int mode) { return sx == sy ? sx : (mode == DOWN ? SIGN : 0u); }

// The three fused operations. Non-finite operands take float32 arithmetic, whose IEEE special
// results (inf - inf = NaN, 0 * inf = NaN, inf + x = inf) the cast then maps to the format.
CPD_FN u32 mul_bits(u32 ua, u32 ub, const Format& f, int mode, u32 rand, int sr_bits) {
  if (!(is_finite_bits(ua) & is_finite_bits(ub)))
    return cast_bits_generic(bits_of(fmul(float_of(ua), float_of(ub))), f, mode, rand, sr_bits);
  Wide p = wide_mul(ua, ub);
  return p.S == 0 ? zero_bits(p.sign, f) : round_wide(p, f, mode, rand, sr_bits);
}

CPD_FN u32 add_bits(u32 ua, u32 ub, const Format& f, int mode, u32 rand, int sr_bits) {
  if (!(is_finite_bits(ua) & is_finite_bits(ub)))
    return cast_bits_generic(bits_of(fadd(float_of(ua), float_of(ub))), f, mode, rand, sr_bits);
  Wide s = wide_add(wide_of(ua), wide_of(ub));
  return s.S == 0 ? zero_bits(zero_sum_sign(ua & SIGN, ub & SIGN, mode), f) : round_wide(s, f, mode, rand, sr_bits);
}

// Whether the format is signed with a classic convention (IEEE, FN, FINITE): the float32- and
// float64-lane shortcuts below (add_fast_applies, nearest_f_applies) assume it; the others
// (FNUZ, P3109, FNU, unsigned) take the exact paths, whose final step is convention_bits.
CPD_FN int plain_convention(const Format& f) {
  return (int)(f.is_signed && !f.uz && !f.no_zero && f.specials <= SPECIALS_FINITE);
}

// A faster add_bits for the common case of a low-precision accumulator: round to nearest, a
// format with at most 11 significant bits (man <= 10) whose smallest subnormal is a float32
// normal (emin - man >= -126), and both operands values of the format. Then
//     add_bits(a, b) == cast(fl32(a + b))
// because rounding the sum of two p-bit numbers first to q bits and then to p bits equals
// rounding it once when q >= 2p + 2 (Figueroa, "When is double rounding innocuous?", 1995):
// q = 24 >= 2*11 + 2. Above the format's subnormal threshold the fl32 sum is a float32 normal or
// exact; zeros, infinities and NaN come out as add_bits gives them. (f.fast holds, so the
// fast cast serves for both the membership test and the rounding.) Callers check
// add_fast_applies once and add_fast_operands per element (tests/test_arith_fast.py checks the
// identity over every pair of codes of the 8-bit formats).
CPD_FN int add_fast_applies(const Format& f, int mode) {
  return (int)(mode == NEAREST && f.fast && f.man <= 10 && f.emin - f.man >= -126 && plain_convention(f));
}

// The same identity for a format whose smallest quantum 2^(emin - man) lies below float32's normal
// range (down to float32's own 2^-149: bfloat16, 2^-133), for callers that run on float32
// subnormals (no flush-to-zero, no denormals-are-zero: a CPU loop checks that at run time, see
// add_f32_needs_subnormals) and send every non-finite float32 sum to add_bits:
//   |exact sum| < 2^(emin + 1): the sum is a multiple of q = 2^(emin - man) >= 2^-149 below
//            2^(emin + 1), at most man + 2 <= 12 bits above q, so float32 holds it exactly (as a
//            normal, or as a subnormal: a multiple of 2^-149 below 2^-126): fl32(a + b) = a + b,
//            and the cast is the one rounding;
//   |exact sum| >= 2^(emin + 1) >= 2^-125 (emin >= -126 by f.fast): both float32 (24 bits) and
//            the format (man + 1 bits) round it in their normal ranges, as with unbounded
//            exponents: Figueroa's 24 >= 2 * 11 + 2 as above;
//   overflow: an exact sum whose float32 rounding is finite is below float32's overflow
//            threshold and rounds once (twice) like any other, the format's overflow included
//            (cast_bits_fast / cast_code_fast); one whose float32 rounding is inf is the
//            caller's (add_bits), as are inf and NaN operands (their sums are inf or NaN).
// add_fast_applies(f, mode) implies add_f32_applies(f, mode).
CPD_FN int add_f32_applies(const Format& f, int mode) {
  return (int)(mode == NEAREST && f.fast && f.man <= 10 && f.emin - f.man >= -149 && plain_convention(f));
}

// Whether add_f32_applies' identity leans on float32 subnormals (values or sums of the format below
// 2^-126): then a caller whose float32 unit flushes them must take add_bits.
CPD_FN int add_f32_needs_subnormals(const Format& f) { return (int)(f.emin - f.man < -126); }

// The directed modes on float32 arithmetic, for any f with add_f32_directed_applies (any
// significand width: no bound like Figueroa's is needed). For values x, y of f,
//     add_bits(x, y, f, mode) == cast(sum_f32_directed(x, y, mode), f, mode)
// when sum_f32_directed's result is finite (callers send the rest, and inf/NaN operands, to
// add_bits). With s = fl32(x + y) to nearest and e = (x + y) - s, exact (TwoSum: Knuth, TAOCP
// vol. 2, 4.2.2; exact for a finite s in round-to-nearest binary arithmetic):
//   e == 0:  x + y = s: one rounding of s. An exact zero takes add_bits' sign (zero_sum_sign:
//            float32's own is the same except rounding down, where x + (-x) is -0);
//   e != 0:  s != 0, and x + y lies strictly inside (s, s') with s' the float32 neighbour of s on
//            e's side (|e| <= ulp(s) / 2, and x + y is not s' itself): an interval holding no
//            float32 value, hence no value of f (f.fast: all of f's values are float32 values,
//            its largest below float32's). Rounding up picks the least value of f >= x + y:
//            with e > 0 the least >= s', with e < 0 the least >= s; rounding down and toward zero
//            alike. So x + y rounds as s' when e points the way the mode rounds (up: e > 0;
//            down: e < 0; toward zero: e against s's sign), else as s; overflow too (f's largest
//            value is a float32 value, so x + y passes it exactly when s' or s does).
// s' is one step of the float32 bits (sign-magnitude): +1 away from zero, -1 toward it.
CPD_FN int add_f32_directed_applies(const Format& f, int mode) {
  return (int)((mode == TOWARD_ZERO || mode == UP || mode == DOWN) && f.fast && plain_convention(f));
}

CPD_FN u32 sum_f32_directed(float x, float y, int mode) {
  const float s = fadd(x, y);
  const float t = fsub(s, x);
  const float e = fadd(fsub(x, fsub(s, t)), fsub(y, t));
  const u32 u = bits_of(s);
  // Integer logic and masks only, no float compare and no branch, so that the callers' loops
  // vectorize. e's sign from its bits; an inf/NaN s (e is then NaN) is left as it is, for the
  // callers' add_bits.
  const u32 eb = bits_of(e), nz = (u32)((eb & ~SIGN) != 0u) & (u32)((u & ~SIGN) < INF_BITS);
  const u32 neg = u >> 31, up = nz & ((eb >> 31) ^ 1u), down = nz & (eb >> 31);
  const u32 toward = mode == UP ? up & neg : mode == DOWN ? down & (neg ^ 1u) : (up & neg) | (down & (neg ^ 1u));
  const u32 away = mode == UP ? up & (neg ^ 1u) : mode == DOWN ? down & neg : 0u;
  // an exact zero: zero_sum_sign(sx, sy, mode), i.e. sx | sy rounding down, else sx & sy
  const u32 sx = bits_of(x) & SIGN, sy = bits_of(y) & SIGN;
  const u32 zero = mode == DOWN ? sx | sy : sx & sy;
  const u32 is_zero = 0u - (u32)((u & ~SIGN) == 0u);
  return (zero & is_zero) | ((u + away - toward) & ~is_zero);
}

// Either identity: the float32 bits whose one rounding to f (cast_bits_fast / cast_code_fast, the
// caller's mode) is add_bits(x, y, f, mode) for values x, y of f, when add_f32_any_applies(f, mode)
// and the bits are finite (the float32 sum to nearest, sum_f32_directed in the directed modes;
// the caller sends the rest to add_bits, and keeps float32 subnormals where
// add_f32_needs_subnormals(f)). Callers with several sums in a row (the CPU Kahan hop) round
// each before the next, as add_bits would.
CPD_FN int add_f32_any_applies(const Format& f, int mode) {
  return (int)(add_f32_applies(f, mode) || add_f32_directed_applies(f, mode));
}

// Whether the adds of a wire hop of f in mode run in float32 lanes (sum_f32_bits, rounded once,
// add_bits for non-finite bits): the CPU hops (cuda/cpu/hop.cpp) and the CUDA hop
// (cuda/kernels/hop.cu) both ask this. raw32: float32 itself on the wire (cpd.FP32), whose add in
// a deterministic mode is float32's own sum in that mode (nothing to cast after); otherwise
// add_f32_any_applies. (The CPU loops also need cast_code_applies(f) for their encode.)
CPD_FN int wire_lanes_apply(const Format& f, int mode, int raw32) {
  if (raw32) return (int)(mode == NEAREST || mode == TOWARD_ZERO || mode == UP || mode == DOWN);
  return add_f32_any_applies(f, mode);
}

CPD_FN u32 sum_f32_bits(float x, float y, int mode) {
  return mode == NEAREST ? bits_of(fadd(x, y)) : sum_f32_directed(x, y, mode);
}

CPD_FN u32 add_fast_operands(u32 ua, u32 ub, const Format& f) {
  return (u32)(cast_bits_fast(ua, f, NEAREST, 0u, 32) == ua) & (u32)(cast_bits_fast(ub, f, NEAREST, 0u, 32) == ub);
}

CPD_FN u32 add_bits_fast(u32 ua, u32 ub, const Format& f) {
  return cast_bits_fast(bits_of(fadd(float_of(ua), float_of(ub))), f, NEAREST, 0u, 32);
}

// Round to nearest on float32 arithmetic alone, for the CPU matmul's float32 lanes (16 per
// AVX-512 operation). For a magnitude v >= 0 of a format with f.fast and 1 <= man <= 21, the
// quantum is q = 2^(E - man) with E = max(exponent of v, emin). With
//     C = 2^(E + 23 - man)      (ulp(C) = q, and v < 2^(E+1) <= C),
// fl32(C + v) is C + v rounded to a multiple of q, ties to the even multiple (C / q = 2^23 is
// even; for man >= 1 an even multiple of q is a value with an even code), so fl32(C + v) - C
// (exact) is v rounded to nearest in the format, in the subnormal range (E = emin) too. C's
// bits come from v's exponent field:
//     v = 0 | e (8) | mmm...m    ->    C = 0 | min(max(e, emin+127), emax+128) + 23 - man | 000...0
// (capped at the overflow threshold's exponent: anything beyond overflows either way, and C stays
// finite when emax + 24 - man <= 127). A product a*b is rounded the same way with one fused
// multiply-add, fl32(a*b + C) being a*b + C rounded once; E is read off h = fl32(a*b), which can
// only be one binade too high when a*b rounds up to 2^(e+1), itself a multiple of both quanta.
// So no double rounding anywhere, and every edge case is one select at the end (round_f_finish):
// overflow (and infinities) to the format's outward value, flush, the sign, NaN unchanged.
CPD_FN float ffma(float x, float y, float z) {
#if CPD_DEVICE
  return __fmaf_rn(x, y, z);
#else
  return __builtin_fmaf(x, y, z);
#endif
}

struct FormatF {
  u32 emin_field;   // (emin + 127) << 23: the smallest E, as float32 exponent bits
  u32 ecap_field;   // (emax + 128) << 23: the largest E used
  u32 c_shift;      // (23 - man) << 23: C's exponent bits = E's + c_shift
  float max;          // the largest finite value
  u32 outward_bits;   // what an overflow becomes (inf, NaN or max)
  u32 flush_below;    // subnormals = False: 2^emin's bits (magnitudes below become 0); else 0
};

CPD_FN int nearest_f_applies(const Format& f, int mode) {
  int emax = (int)(f.max_bits >> 23) - 127;
  return (int)(mode == NEAREST && f.fast && f.man >= 1 && f.man <= 21 && emax + 24 - f.man <= 127 &&
               plain_convention(f));
}

CPD_FN FormatF make_format_f(const Format& f) {
  FormatF g;
  g.emin_field = (u32)(f.emin + 127) << 23;
  g.ecap_field = ((f.max_bits >> 23) + 1u) << 23;
  g.c_shift = (u32)(23 - f.man) << 23;
  g.max = float_of(f.max_bits);
  g.outward_bits = f.outward_bits;
  g.flush_below = f.subnormals ? 0u : f.min_normal_bits;
  return g;
}

// C's bits for a magnitude's bits a (see above).
CPD_FN u32 round_f_c(u32 a, const FormatF& g) {
  u32 e = a & INF_BITS;
  e = e > g.emin_field ? e : g.emin_field;
  e = e < g.ecap_field ? e : g.ecap_field;
  return e + g.c_shift;
}

// r: the rounded magnitude; u: the float32 value rounded (for its sign). A NaN magnitude r passes
// (the ordered comparison is false) with u's sign: u must not be a signaling NaN, which float32
// arithmetic never produces, so it is u itself (round_f and mul_f round arithmetic results only).
// (Plain ?: here, which vectorizes to masked blends.)
CPD_FN u32 round_f_finish(u32 u, u32 r, const FormatF& g) {
  r = float_of(r) > g.max ? g.outward_bits : r;                         // overflow, infinities
  r = r < g.flush_below ? 0u : r;                                       // subnormals = False
  return (u & SIGN) | r;
}

// cast_bits(u, f, NEAREST) for nearest_f_applies(f), u the result of a float32 operation.
CPD_FN u32 round_f(u32 u, const FormatF& g) {
  u32 a = u & ~SIGN;
  float c = float_of(round_f_c(a, g));
  return round_f_finish(u, bits_of(fsub(fadd(float_of(a), c), c)), g);
}

// mul_bits(x, y, f, NEAREST) for nearest_f_applies(f), on magnitudes: h = fl32(x*y) gives E and
// the sign, and is the NaN a non-finite product gives (mul_bits casts fl32(x*y) then).
CPD_FN u32 mul_f_round(float x, float y, u32 h, const FormatF& g) {
  float c = float_of(round_f_c(h & ~SIGN, g));
  float ax = float_of(bits_of(x) & ~SIGN), ay = float_of(bits_of(y) & ~SIGN);
  return round_f_finish(h, bits_of(fsub(ffma(ax, ay, c), c)), g);
}

CPD_FN u32 mul_f(float x, float y, const FormatF& g) {
  u32 h = bits_of(fmul(x, y));
  u32 r = mul_f_round(x, y, h, g);
  return (h & ~SIGN) > INF_BITS ? h : r;  // the very NaN mul_bits gives, whatever the FMA propagated
}

// mul_f for finite x and y: their product is never NaN, so the NaN select drops out (an
// overflow to infinity is round_f_finish's, as in mul_f).
CPD_FN u32 mul_f_finite(float x, float y, const FormatF& g) { return mul_f_round(x, y, bits_of(fmul(x, y)), g); }

// add_bits(x, y, f, NEAREST) for nearest_f_applies(f) and add_fast_applies(f) with x and y values
// of f: fl32(x + y) rounded (add_bits_fast's identity).
CPD_FN u32 add_f(float x, float y, const FormatF& g) { return round_f(bits_of(fadd(x, y)), g); }

// Every value of m is a value of f (so a product rounded to m is an add_bits_fast operand of f):
// m's significands are no longer (m.man <= f.man), its finest quantum 2^(emin - man) is no finer,
// its largest value no larger, and if f has no subnormals m's smallest positive value is a normal
// of f. Infinities and NaN need no check: add_bits and add_bits_fast treat them alike.
CPD_FN int values_within(const Format& m, const Format& f) {
  int m_min_exp = m.subnormals ? m.emin - m.man : m.emin;
  return (int)(m.man <= f.man && m.max_bits <= f.max_bits && m.emin - m.man >= f.emin - f.man &&
               (f.subnormals || m_min_exp >= f.emin));
}

// c + a*b rounded once (a fused multiply-add in the format).
CPD_FN u32 fma_bits(u32 uc, u32 ua, u32 ub, const Format& f, int mode, u32 rand, int sr_bits) {
  if (!(is_finite_bits(ua) & is_finite_bits(ub)))
    return cast_bits_generic(bits_of(fadd(float_of(uc), fmul(float_of(ua), float_of(ub)))), f, mode, rand, sr_bits);
  if (!is_finite_bits(uc)) return cast_bits_generic(uc, f, mode, rand, sr_bits);
  Wide p = wide_mul(ua, ub);
  Wide s = wide_add(wide_of(uc), p);
  return s.S == 0 ? zero_bits(zero_sum_sign(uc & SIGN, p.sign, mode), f) : round_wide(s, f, mode, rand, sr_bits);
}

// ------------------------------------------------------------------------------------------
// Float32 lanes beyond round_f's range (the CPU matmul; additions to the forms above).
//
// add_lane_applies: add_bits(x, y, f, NEAREST) == cast_bits_fast(fl32(x + y), f, NEAREST) for x
// and y values of f, for every format with the fast path and at most 11 significant bits, with
// no condition on the exponent range (so BF16 too, whose C = 2^(E + 23 - man) would overflow
// round_f's trick). Figueroa's identity (add_fast_applies) needs the fl32 sum to be the sum
// rounded once to 24 bits or exact: above 2^-126 it is a float32 normal; below, x + y is a
// multiple of f's finest quantum 2^(emin - man) >= 2^-149 (fast_path_applies) smaller than
// 2^-126, which float32's subnormals hold exactly. The rounding is the fast cast itself,
// region N on integer lanes (the float32 bits, as for any fast cast) and region S on float32
// lanes; when emin = -126, region N's integer rounding is right below 2^emin too (f's quantum
// there, 2^(-126 - man), is a fixed 23 - man bits of float32's subnormal encoding, as it is of
// every binade above), so round_lane_i can skip region S (lane_normal_only).
CPD_FN int add_lane_applies(const Format& f, int mode) {
  return (int)(mode == NEAREST && f.fast && f.man <= 10);
}

CPD_FN int lane_normal_only(const Format& f) { return (int)(f.fast && f.emin == -126); }

// cast_bits(u, f, NEAREST) on the path above: NORMAL_ONLY for lane_normal_only(f) formats.
template <int NORMAL_ONLY>
CPD_FN u32 round_lane_i(u32 u, const Format& f) {
  return NORMAL_ONLY ? cast_bits_fast_normal(u, f, NEAREST, 0u, 32) : cast_bits_fast(u, f, NEAREST, 0u, 32);
}

// Guarded lanes (the CPU matmul's Kahan steps): the same sums rounded by region N's integer
// rounding alone, on the signed bits, with no range handling at all:
//     round_lane_guarded(u) = (u + half - 1 + even) & ~qmask       (cast_bits_fast's step N2)
// which is add_bits(x, y, f, NEAREST) for u = fl32(x + y), x and y values of f, whenever
// |x + y| < f's overflow threshold T (max + half its quantum), for add_lane_guard_applies(f):
//   * |x + y| >= 2^emin: as for add_lane_applies (Figueroa; the carry out of the mantissa is
//     the next binade, and below T it never reaches max's binade + 1); the sign bit, above the
//     exponent field, is left alone, so -0 and the sign of every result come out as add_bits's;
//   * |x + y| < 2^emin: x + y is a multiple of f's finest quantum 2^(emin - man) below 2^emin,
//     i.e. a subnormal of f (subnormals on) held exactly by fl32; its float32 encoding has its
//     d0 = 23 - man low bits clear (a normal float32 has at most man significant bits there; a
//     float32 subnormal is a multiple of 2^(emin - man) >= 2^(-126 - man), i.e. of 2^d0
//     encoding units), so the rounding leaves it alone.
// Nothing else is handled: overflow, infinities and NaN come out wrong or unchanged (a NaN whose
// payload fills the top of the mantissa can even carry into the sign). Callers keep every step
// inside the range by a guard: the CPU's Kahan lanes (cuda/cpu/matmul_f32.h) check that each
// new sum t has |t| < G = 2^(emax - 2) (lane_guard_bits) and take the exact lanes for the whole
// tile when one does not. That suffices, by induction over the steps (s = the previous t, so
// |s| < G; c the previous compensation, exact): the guard also holds for NaN and infinities
// (bits above G's); y = p - c rounded: were |p - c| >= T, y would be >= 2^(emax + 1) and
// |s + y| > G, so t >= G; t = s + y rounded: likewise; then |s + y| < G, so |y| < 2G, and
// t - s (< 2G) and (t - s) - y (< 4G = 2^emax <= max) are inside the range. Products (values of
// f) and the inputs must be free of NaN payloads (the callers check the operands are finite).
CPD_FN int add_lane_guard_applies(const Format& f, int mode) {
  return (int)(add_lane_applies(f, mode) && plain_convention(f) && f.subnormals);
}

CPD_FN u32 lane_guard_bits(const Format& f) { return (f.max_bits & INF_BITS) - (2u << 23); }

CPD_FN u32 round_lane_guarded(u32 u, const Format& f) { return round_normal_fast(u, 0u, f, NEAREST, 0u, 32); }

// 1 when the magnitude a (float32 bits, sign clear, finite) lies exactly halfway between two
// neighbours of f's grid, for fast formats with 1 <= man <= 22 (midpoints are float32 values).
// A float32 result r = fl32(v) of an exact value v rounds to f as v does unless r is such a
// midpoint: every value and midpoint of f is a float32 number, so rounding to float32 (monotone)
// cannot carry v across one, and r lands on one only if it was one or v was next to it. The CPU
// matmul's fused lanes (r = fma(a, b, s)) redo those lanes with fma_bits.
//   region N (a >= 2^emin):  the d0 = 23 - man dropped bits are 100...0
//   region S (a < 2^emin):   |a - v| = q / 2 with v = (a + C) - C, a rounded to a multiple of q
CPD_FN u32 is_midpoint_bits(u32 a, const Format& f) {
  u32 n_tie = (u32)((a & f.qmask) == f.half_m1 + 1u);
  float ax = float_of(a), v = fsub(fadd(ax, f.sub_c), f.sub_c);
  u32 s_tie = (u32)(fsub(ax, v) == fmul(f.sub_q, 0.5f)) | (u32)(fsub(v, ax) == fmul(f.sub_q, 0.5f));
  return sel((u32)(a < f.min_normal_bits), s_tie, n_tie);
}

CPD_FN int midpoint_test_applies(const Format& f) { return (int)(f.fast && f.man >= 1 && f.man <= 22); }

}  // namespace cpd

#endif  // CPD_ARITH_H
