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

}  // namespace cpd

#endif  // CPD_NUMERICS_H
