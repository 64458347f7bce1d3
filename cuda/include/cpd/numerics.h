// cpd numerics core: every rounding decision of cpd lives in this file and nowhere else.
//
// It is compiled three ways from the same text:
//   * by the host C++ compiler for the CPU extension (cuda/cpu/*.cpp, OpenMP loops);
//   * by NVRTC for the CUDA kernels (cuda/kernels/*.cu), which has no system headers;
//   * never by anything that would enable fast-math: the CPU build uses -ffp-contract=off and
//     NVRTC gets --fmad=false, because the float multiply in cpd_compose must be exact.
// Hence: no #include, plain types only, and a macro that marks functions for host and device.
//
// Vocabulary used throughout (all exponents unbiased):
//   a      |x| as float32 bits (sign cleared)          x = (-1)^s * M * 2^eq
//   M      24-bit integer significand of a (implicit bit included for normals)
//   eq     exponent of M's last bit: max(field,1) - 150
//   E      floor(log2 |x|)
//   ee     max(E, emin): the binade the result lives in (emin for the format's subnormals)
//   qexp   ee - man: exponent of the format's quantum (ulp) in that binade
//   d      qexp - eq >= 0: how many low bits of M fall below the quantum
//   r      M >> d, the result significand counted in quanta: result = r * 2^qexp
#ifndef CPD_NUMERICS_H
#define CPD_NUMERICS_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CPD_FN __host__ __device__ __forceinline__
#define CPD_DEVICE 1
#else
#define CPD_FN static inline __attribute__((always_inline))
#define CPD_DEVICE 0
#endif

namespace cpd {

typedef unsigned int u32;
typedef unsigned long long u64;

// Rounding modes and special-value conventions: the integers of cpd/rounding.py and
// cpd/formats.py (Rounding.code, Specials.code).
enum { NEAREST = 0, STOCHASTIC = 1, TOWARD_ZERO = 2, UP = 3, DOWN = 4 };
enum { SPECIALS_IEEE = 0, SPECIALS_FN = 1, SPECIALS_FINITE = 2 };

const u32 SIGN = 0x80000000u;
const u32 INF_BITS = 0x7f800000u;
const u32 QNAN_BITS = 0x7fc00000u;

CPD_FN u32 bits_of(float f) {
#if CPD_DEVICE
  return __float_as_uint(f);
#else
  u32 u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

CPD_FN float float_of(u32 u) {
#if CPD_DEVICE
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

CPD_FN int imax(int a, int b) { return a > b ? a : b; }
CPD_FN int imin(int a, int b) { return a < b ? a : b; }

// Branch-free selects: c ? a : b with c in {0, 1}, written as bit arithmetic so that compilers
// keep the hot loops straight-line (GCC's if-conversion gives up on long chains of ?:).
//   mask = -c = 111...1 (c = 1) or 000...0 (c = 0);  b ^ ((a ^ b) & mask)
CPD_FN u32 sel(u32 c, u32 a, u32 b) { return b ^ ((a ^ b) & (0u - c)); }
CPD_FN int seli(u32 c, int a, int b) { return (int)sel(c, (u32)a, (u32)b); }

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
//      directed:    any rem != 0, in the mode's direction for this sign.
//      stochastic:  rem / 2^d scaled to a 32-bit fraction F (exact for d <= 32; for d > 32 the
//                   bits below 2^-32 of a quantum are dropped), truncated to sr_bits; add as many
//                   random bits and round up on the carry out of bit 31, i.e. with probability
//                   trunc(F) / 2^32 exactly.
CPD_FN u32 round_mag(const Split& s, const Format& f, int mode, u32 sign, u32 rand, int sr_bits) {
  int dc = imin(s.d, 25);
  u32 r = s.M >> dc;
  u32 rem = s.M & ((1u << dc) - 1u);
  u32 up;
  if (mode == NEAREST) {
    u32 twice = rem << 1, quantum = 1u << dc;
    u32 lsb = r & sel((u32)(f.man != 0), 1u, (u32)(s.ee + f.bias)) & 1u;
    up = (twice > quantum) | ((twice == quantum) & lsb);
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
// the largest finite value and never infinity (IEEE 754 §7.4).
CPD_FN u32 rounds_inward(int mode, u32 sign) {
  u32 neg = sign >> 31;
  return (u32)(mode == TOWARD_ZERO) | ((u32)(mode == UP) & neg) | ((u32)(mode == DOWN) & (neg ^ 1u));
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
//   4. the sign is put back (zeros keep theirs).
//
// `outward` (f.outward_bits) is ±max with saturate or for finite formats, else inf (ieee) or
// NaN (fn). Written as two-way selects, not early returns, so that the host loop vectorizes.
// Steps 1, 2, 3a, 3b and 4 are shared by both paths (finish_cast); only step 3's rounding of
// the magnitude differs.
CPD_FN u32 finish_cast(u32 u, u32 a, u32 sign, u32 mag, const Format& f, int mode) {
  u32 ovf = sel(rounds_inward(mode, sign), f.max_bits, f.outward_bits);
  mag = sel((u32)(mag > f.max_bits), ovf, mag);                             // 3a.
  mag = sel((u32)(a == INF_BITS), f.outward_bits, mag);                     // 2.
  u32 flush = (u32)(f.subnormals == 0) & (u32)(mag < f.min_normal_bits);
  mag = sel(flush, 0u, mag);                                                // 3b.
  u32 res = sign | mag;  // a NaN from an fn overflow keeps the sign too      // 4.
  return sel((u32)(a > INF_BITS), u, res);                                  // 1.
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

// Float adds that must round to nearest even as written (no contraction, no FTZ): the host
// build has -ffp-contract=off and no fast-math; on the device the intrinsic says so.
CPD_FN float fadd(float x, float y) {
#if CPD_DEVICE
  return __fadd_rn(x, y);
#else
  return x + y;
#endif
}
CPD_FN float fsub(float x, float y) {
#if CPD_DEVICE
  return __fsub_rn(x, y);
#else
  return x - y;
#endif
}
CPD_FN float fmul(float x, float y) {
#if CPD_DEVICE
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
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
  } else if (mode == STOCHASTIC) {
    return t + (sr_carry(dropped << f.sr_shift, rand, sr_bits) << (23 - f.man));
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
  u32 tz_up = bits_of(fadd(float_of(tz), f.sub_q));                          // one quantum further
  u32 grow;
  if (mode == STOCHASTIC) {
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

CPD_FN u32 cast_bits_fast(u32 u, const Format& f, int mode, u32 rand, int sr_bits) {
  u32 sign = u & SIGN;
  u32 a = u ^ sign;
  u32 n_mag = round_normal_fast(a, sign, f, mode, rand, sr_bits);
  u32 s_mag = round_sub_fast(a, sign, f, mode, rand, sr_bits);
  u32 mag = sel((u32)(a < f.min_normal_bits), s_mag, n_mag);                // 3.
  return finish_cast(u, a, sign, mag, f, mode);
}

// cast_bits_fast restricted to region N: the same expression with region S left out, so it
// equals cast_bits_fast wherever |x| >= 2^emin, infinities and NaNs included. For loops that
// check a whole chunk for |x| < 2^emin first (cuda/cpu/cast.cpp) and skip region S's float work
// when there is none.
CPD_FN u32 cast_bits_fast_normal(u32 u, const Format& f, int mode, u32 rand, int sr_bits) {
  u32 sign = u & SIGN;
  u32 a = u ^ sign;
  return finish_cast(u, a, sign, round_normal_fast(a, sign, f, mode, rand, sr_bits), f, mode);
}

// The cast, on whichever path applies. Loops should test f.fast once per launch and call
// cast_bits_fast / cast_bits_generic directly (cuda/cpu/cast.cpp does).
CPD_FN u32 cast_bits(u32 u, const Format& f, int mode, u32 rand, int sr_bits) {
  return f.fast ? cast_bits_fast(u, f, mode, rand, sr_bits) : cast_bits_generic(u, f, mode, rand, sr_bits);
}

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
    if (mode == NEAREST) {
      u32 lsb = (u32)r & (f.man ? 1u : (u32)(ee + f.bias)) & 1u;
      u32 tie = (u32)(rem == half);
      up = (u32)(rem > half) | (tie & w.sticky) | (tie & (w.sticky ^ 1u) & lsb);
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
  return w.sign | mag;                                                                     // 4.
}

// The sign of an exact zero sum x + y (IEEE 754 §6.3): the common sign if both addends have
// it, otherwise +0, except -0 when rounding down.
CPD_FN u32 zero_sum_sign(u32 sx, u32 sy, int mode) { return sx == sy ? sx : (mode == DOWN ? SIGN : 0u); }

// The three fused operations. Non-finite operands take float32 arithmetic, whose IEEE special
// results (inf - inf = NaN, 0 * inf = NaN, inf + x = inf) the cast then maps to the format.
CPD_FN u32 mul_bits(u32 ua, u32 ub, const Format& f, int mode, u32 rand, int sr_bits) {
  if (!(is_finite_bits(ua) & is_finite_bits(ub)))
    return cast_bits_generic(bits_of(fmul(float_of(ua), float_of(ub))), f, mode, rand, sr_bits);
  Wide p = wide_mul(ua, ub);
  return p.S == 0 ? p.sign : round_wide(p, f, mode, rand, sr_bits);
}

CPD_FN u32 add_bits(u32 ua, u32 ub, const Format& f, int mode, u32 rand, int sr_bits) {
  if (!(is_finite_bits(ua) & is_finite_bits(ub)))
    return cast_bits_generic(bits_of(fadd(float_of(ua), float_of(ub))), f, mode, rand, sr_bits);
  Wide s = wide_add(wide_of(ua), wide_of(ub));
  return s.S == 0 ? zero_sum_sign(ua & SIGN, ub & SIGN, mode) : round_wide(s, f, mode, rand, sr_bits);
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
  return (int)(mode == NEAREST && f.fast && f.man <= 10 && f.emin - f.man >= -126);
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
  return (int)(mode == NEAREST && f.fast && f.man >= 1 && f.man <= 21 && emax + 24 - f.man <= 127);
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
CPD_FN u32 mul_f(float x, float y, const FormatF& g) {
  u32 h = bits_of(fmul(x, y));
  float c = float_of(round_f_c(h & ~SIGN, g));
  float ax = float_of(bits_of(x) & ~SIGN), ay = float_of(bits_of(y) & ~SIGN);
  u32 r = round_f_finish(h, bits_of(fsub(ffma(ax, ay, c), c)), g);
  return (h & ~SIGN) > INF_BITS ? h : r;  // the very NaN mul_bits gives, whatever the FMA propagated
}

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
  return s.S == 0 ? zero_sum_sign(uc & SIGN, p.sign, mode) : round_wide(s, f, mode, rand, sr_bits);
}

// ------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., SC'11): a counter-based generator. Element i of a cast draws
// word (i & 3) of philox(counter = {i >> 2 (64 bits), offset (64 bits)}, key = seed), so its
// random bits depend only on (seed, offset, i): the same on any thread count and on CPU or GPU.
// The CPU extension runs the same rounds 8 blocks per AVX-512 vector (cuda/cpu/cast.cpp,
// philox32); its words are those of philox4x32_10 bit for bit (random_words() exposes this one).
enum { PHILOX_ROUNDS = 10 };  // cpd/_fallback.py PHILOX_ROUNDS must match

struct U32x4 {
  u32 v[4];
};

CPD_FN void mulhilo(u32 a, u32 b, u32& hi, u32& lo) {
  u64 p = (u64)a * (u64)b;
  hi = (u32)(p >> 32);
  lo = (u32)p;
}

CPD_FN U32x4 philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
  for (int i = 0; i < PHILOX_ROUNDS; ++i) {
    if (i) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    u32 hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  U32x4 out;
  out.v[0] = c0;
  out.v[1] = c1;
  out.v[2] = c2;
  out.v[3] = c3;
  return out;
}

// The random word of element i for a launch keyed by (seed, offset).
CPD_FN u32 random_word(u64 i, u64 seed, u64 offset) {
  u64 block = i >> 2;
  U32x4 w = philox4x32_10((u32)block, (u32)(block >> 32), (u32)offset, (u32)(offset >> 32), (u32)seed,
                          (u32)(seed >> 32));
  return w.v[i & 3];
}


// ------------------------------------------------------------------------------------------
// Accumulation (cpd.matmul, cpd.sum): the steps of one output element, every one an exact
// operation rounded once (mul_bits, add_bits, fma_bits above).
//
// An output accumulates sequentially over k from s = +0 (and, with Kahan, c = +0). Step k, with
// p = a_k * b_k:
//   plain:      s = round_acc(s + round_mul(p))          (mul_bits, then add_bits)
//   no mul fmt: s = round_acc(s + p)                     (fma_bits: the exact p, rounded once)
//   Kahan:      y = round_acc(P - c)   with P = round_mul(p) (add_bits) or the exact p (fma_bits)
//               t = round_acc(s + y);  c = round_acc(round_acc(t - s) - y);  s = t
// Block mode (block = L): the products of each run of L consecutive k (the last run may be
// shorter) are summed plainly into a block sum bs from +0; at the end of the run bs is added to s
// (plainly, or as Kahan's y = round_acc(bs - c), ...), and bs restarts at +0.
// Sign flips (-s, -y, -c) are exact: an XOR with the sign bit.
//
// Random words (stochastic rounding): the rounding j of step k of output o uses word
// (o * K + k) * 8 + j of (seed, offset) (random_word), with
//   j = 0 the product, 1 the add (or Kahan's y), 2 Kahan's t, 3 t - s, 4 the final - y;
//   block mode: j = 1 the add into bs, and at the end of a run 4 the add of bs into s (plain) or
//   4, 5, 6, 7 Kahan's y, t, t - s, - y.
// So a result depends only on (seed, offset, o, K) and the operands: not on threads or tiling.
enum { DOT_WORDS = 8 };

struct DotSpec {
  Format mf;    // multiply format (used when has_mul)
  Format af;    // accumulate format
  int has_mul;  // 0: products exact (fma_bits)
  int kahan;
  int block;    // 0: no blocks; else the run length L >= 1
  int mode;
  int sr_bits;
};

CPD_FN DotSpec make_dot_spec(const Format& mf, int has_mul, const Format& af, int kahan, int block, int mode,
                             int sr_bits) {
  DotSpec d;
  d.mf = mf;
  d.af = af;
  d.has_mul = has_mul;
  d.kahan = kahan;
  d.block = block;
  d.mode = mode;
  d.sr_bits = sr_bits;
  return d;
}

// The 8 random words of step (o, k) (all zero unless stochastic). Words 0-3 and 4-7 are one
// Philox block each; `need_high` = 0 skips the second block when no rounding uses words 4-7.
CPD_FN void dot_words(u64 o, u64 K, u64 k, u64 seed, u64 offset, int mode, int need_high, u32* w) {
  for (int j = 0; j < DOT_WORDS; ++j) w[j] = 0u;
  if (mode != STOCHASTIC) return;
  u64 base = (o * K + k) * DOT_WORDS, block = base >> 2;
  U32x4 lo = philox4x32_10((u32)block, (u32)(block >> 32), (u32)offset, (u32)(offset >> 32), (u32)seed,
                           (u32)(seed >> 32));
  for (int j = 0; j < 4; ++j) w[j] = lo.v[j];
  if (need_high) {
    block += 1;
    U32x4 hi = philox4x32_10((u32)block, (u32)(block >> 32), (u32)offset, (u32)(offset >> 32), (u32)seed,
                             (u32)(seed >> 32));
    for (int j = 0; j < 4; ++j) w[4 + j] = hi.v[j];
  }
}

// Kahan's last three operations, y already formed: t = s + y; c = (t - s) - y; s = t.
// w: the words of t, t - s and - y.
CPD_FN void kahan_add(u32& s, u32& c, u32 y, const Format& f, int mode, const u32* w, int sr_bits) {
  u32 t = add_bits(s, y, f, mode, w[0], sr_bits);
  u32 ts = add_bits(t, s ^ SIGN, f, mode, w[1], sr_bits);
  c = add_bits(ts, y ^ SIGN, f, mode, w[2], sr_bits);
  s = t;
}

// round_acc(x + a*b) with the product rounded to mul first (has_mul) or kept exact.
CPD_FN u32 dot_term_add(const DotSpec& d, u32 x, u32 ua, u32 ub, const u32* w) {
  if (d.has_mul) {
    u32 p = mul_bits(ua, ub, d.mf, d.mode, w[0], d.sr_bits);
    return add_bits(x, p, d.af, d.mode, w[1], d.sr_bits);
  }
  return fma_bits(x, ua, ub, d.af, d.mode, w[1], d.sr_bits);
}

// Whether step k needs words 4-7 (see dot_words).
CPD_FN int dot_needs_high(const DotSpec& d, u64 k, u64 K) {
  if (d.block) return (int)((k + 1) % (u64)d.block == 0 || k + 1 == K);
  return d.kahan;
}

// Step k (of K) of one output: (s, c, bs) the sum, Kahan compensation and block sum; w the
// step's 8 words.
CPD_FN void dot_step(const DotSpec& d, u32 ua, u32 ub, u64 k, u64 K, u32& s, u32& c, u32& bs, const u32* w) {
  if (d.block) {
    bs = dot_term_add(d, bs, ua, ub, w);
    if ((k + 1) % (u64)d.block == 0 || k + 1 == K) {  // end of a run: add bs into s
      if (d.kahan) {
        u32 y = add_bits(bs, c ^ SIGN, d.af, d.mode, w[4], d.sr_bits);
        kahan_add(s, c, y, d.af, d.mode, w + 5, d.sr_bits);
      } else {
        s = add_bits(s, bs, d.af, d.mode, w[4], d.sr_bits);
      }
      bs = 0u;
    }
  } else if (d.kahan) {
    u32 y = dot_term_add(d, c ^ SIGN, ua, ub, w);  // y = P - c = (-c) + P
    kahan_add(s, c, y, d.af, d.mode, w + 2, d.sr_bits);
  } else {
    s = dot_term_add(d, s, ua, ub, w);
  }
}

// ------------------------------------------------------------------------------------------
// The same steps for round-to-nearest on float64 carriers, for loops that vectorize (the CPU
// matmul). Every value of a format is a double, so is every exact product of two float32 values
// (48 significant bits, exponents within -298..256), and an exact sum x + y of doubles is
// s + e exactly (Knuth's TwoSum, no overflow at these magnitudes). Rounding s + e once to a
// format of at most 24 significant bits is done by rounding it first to 53 bits *to odd*
// (s, moved one unit of its last place toward e when e != 0 and s's last bit is even) and then
// to the format to nearest: round-to-odd at p + 2 or more bits followed by round-to-nearest at p
// bits is round-to-nearest of the exact value (Boldo & Melquiond, 2008). The result is the same
// value, bit for bit, as round_wide(..., NEAREST): tests/test_matmul.py checks both against an
// exact oracle, and the fast and generic CPU paths against each other.
struct FormatD {
  u64 qmask;       // (1 << d0) - 1, d0 = 52 - man: double mantissa bits below the quantum
  u64 half_m1;     // 2^(d0-1) - 1
  u64 parity_add;  // man == 0 ? bias + 1 : 0 (the even encoding is the even exponent field)
  u64 min_normal;  // double bits of 2^emin
  u64 max_mag;     // double bits of max
  u64 outward;     // double bits of what an overflow becomes (inf, NaN or max)
  double c_sub;    // 2^(emin - man + 52): adding it rounds a magnitude < 2^emin to the grid
  int d0;
  int subnormals;
  long long emin, man;  // for round_d_sr
  u64 sr_mask;          // the top sr_bits bits of a 32-bit word (round_d_sr)
};

CPD_FN u64 dbits_of(double x) {
#if CPD_DEVICE
  return (u64)__double_as_longlong(x);
#else
  u64 u;
  __builtin_memcpy(&u, &x, 8);
  return u;
#endif
}

CPD_FN double double_of(u64 u) {
#if CPD_DEVICE
  return __longlong_as_double((long long)u);
#else
  double x;
  __builtin_memcpy(&x, &u, 8);
  return x;
#endif
}

CPD_FN u64 sel64(u64 c, u64 a, u64 b) { return b ^ ((a ^ b) & (0ull - c)); }

const u64 SIGN64 = 0x8000000000000000ull;
const u64 INF64 = 0x7ff0000000000000ull;

CPD_FN FormatD make_format_d(const Format& f) {
  FormatD g;
  g.d0 = 52 - f.man;
  g.qmask = (1ull << g.d0) - 1ull;
  g.half_m1 = (1ull << (g.d0 - 1)) - 1ull;
  g.parity_add = f.man == 0 ? (u64)(f.bias + 1) : 0ull;
  g.min_normal = dbits_of((double)float_of(f.min_normal_bits));
  g.max_mag = dbits_of((double)float_of(f.max_bits));
  g.outward = dbits_of((double)float_of(f.outward_bits)) & ~SIGN64;
  g.c_sub = double_of((u64)(f.emin - f.man + 52 + 1023) << 52);
  g.subnormals = f.subnormals;
  g.emin = f.emin;
  g.man = f.man;
  g.sr_mask = 0xffffffffull;
  return g;
}

// Round x to the format to nearest, ties to even (x exact, or rounded to odd at 53 bits); the
// steps of cast_bits_fast on double bits: region N (|x| >= 2^emin) by integer rounding of the
// bits, region S by adding and subtracting c_sub, then overflow, flush, infinities and NaN.
CPD_FN double round_d(double x, const FormatD& g) {
  u64 u = dbits_of(x), sign = u & SIGN64, a = u ^ sign;
  u64 even = ((a >> g.d0) + g.parity_add) & 1ull;
  u64 n = (a + g.half_m1 + even) & ~g.qmask;                               // region N
  u64 s = dbits_of((double_of(a) + g.c_sub) - g.c_sub);                    // region S
  u64 mag = sel64((u64)(a < g.min_normal), s, n);
  mag = sel64((u64)(mag > g.max_mag), g.outward, mag);                     // overflow, x = inf
  mag = sel64((u64)((g.subnormals == 0) & (mag < g.min_normal)), 0ull, mag);
  return double_of(sel64((u64)(a > INF64), u, sign | mag));                // NaN stays
}

// x + y exact, rounded to odd at 53 bits (see FormatD); non-finite sums pass through.
CPD_FN double add_odd(double x, double y) {
  double s = x + y;
  double bp = s - x;
  double e = (x - (s - bp)) + (y - bp);
  u64 sb = dbits_of(s);
  u64 fin = (u64)((sb & ~SIGN64) < INF64);
  u64 same = (u64)((dbits_of(e) & SIGN64) == (sb & SIGN64));  // e pushes |s| up
  u64 step = sel64(fin & (u64)(e != 0.0), sel64(same, 1ull, ~0ull), 0ull);
  return double_of(sb + (step & ((sb & 1ull) - 1ull)));  // only when s's last bit is even
}

CPD_FN double add_d(double x, double y, const FormatD& g) { return round_d(add_odd(x, y), g); }

// Stochastic rounding on float64 carriers, for formats with man <= 19. x is exact or rounded to
// odd at 53 bits, and x = M * 2^(E-52) with M the 53-bit significand (every nonzero finite x
// here is a normal double). As in round_wide: ee = max(E, emin), quantum 2^(ee - man), and
// d = ee - man - (E - 52) >= 52 - man >= 33 dropped bits; r = M >> d, and the 32-bit fraction
// F = rem >> (d - 32). Since d - 32 >= 1, the last bit of x (the odd bit standing for a tail
// below it) never reaches F, so F, r and the decision are those of the exact value.
// sr_bits: g.sr_mask keeps the top sr_bits bits of F and of the word (sr_carry).
CPD_FN double round_d_sr(double x, const FormatD& g, u32 rand) {
  u64 u = dbits_of(x), sign = u & SIGN64, a = u ^ sign;
  long long E = (long long)(a >> 52) - 1023;
  u64 M = (a & 0xfffffffffffffull) | (1ull << 52);
  long long ee = E > g.emin ? E : g.emin;
  long long d = ee - g.man - (E - 52);
  u64 dc = (u64)(d < 63 ? d : 63);
  u64 r = M >> dc;
  u64 rem = M - (r << dc);  // M mod 2^dc (written so that GCC vectorizes it)
  u64 f32 = rem >> (u64)(d - 32 < 63 ? d - 32 : 63);
  u64 up = ((f32 & g.sr_mask) + ((u64)rand & g.sr_mask)) >> 32;  // carry out of bit 31
  double p2 = double_of((u64)(ee - g.man + 1023) << 52);
  u64 mag = dbits_of((double)(long long)(r + up) * p2);
  mag = sel64((u64)(a == 0ull), 0ull, mag);                                 // zeros keep their sign
  mag = sel64((u64)(mag > g.max_mag), g.outward, mag);                     // overflow, x = inf
  mag = sel64((u64)((g.subnormals == 0) & (mag < g.min_normal)), 0ull, mag);
  return double_of(sel64((u64)(a > INF64), u, sign | mag));                // NaN stays
}

CPD_FN double add_d_sr(double x, double y, const FormatD& g, u32 rand) { return round_d_sr(add_odd(x, y), g, rand); }

}  // namespace cpd

#endif  // CPD_NUMERICS_H
