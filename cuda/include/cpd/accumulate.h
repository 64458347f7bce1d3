// cpd numerics core, accumulate.h: Accumulation: the steps of one dot product, and their float64-lane forms.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
#ifndef CPD_ACCUMULATE_H
#define CPD_ACCUMULATE_H

#include "cpd/arith.h"
#include "cpd/philox.h"

namespace cpd {

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
  u64 uz, no_zero, uns; // the conventions (Format::uz, no_zero, !is_signed), for convention_d
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
  g.uz = f.uz;
  g.no_zero = f.no_zero;
  g.uns = f.is_signed ^ 1u;
  return g;
}

// convention_bits on double bits: sign | mag with the format's conventions applied (a = |x|).
CPD_FN u64 convention_d(u64 sign, u64 mag, u64 a, const FormatD& g) {
  u64 s = sel64(g.uz & (u64)(mag == 0ull), 0ull, sign);
  mag = sel64(g.no_zero & (u64)(mag < g.min_normal), g.min_normal, mag);
  u64 nan = (g.no_zero & (u64)(a == 0ull)) | (g.uns & (u64)(sign != 0ull) & (u64)(a != 0ull));
  return sel64(nan, 0x7ff8000000000000ull, s | mag);
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
  return double_of(sel64((u64)(a > INF64), u, convention_d(sign, mag, a, g)));  // NaN stays
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
  // (double)(r + up), exactly: r < 2^(53 - d) <= 2^20 (d >= 52 - man >= 33 for man <= 19). x86-64
  // before AVX-512 DQ has no 64-bit integer -> double vector conversion, so there a double whose
  // bits are 2^52's with n in the low mantissa bits, 2^52 + n (n < 2^52), less 2^52 (exact) gives
  // n, and the loop vectorizes; elsewhere the conversion itself (one instruction).
#if !CPD_DEVICE && (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX512DQ__)
  const double n = double_of(0x4330000000000000ull | (r + up)) - 4503599627370496.0;
#else
  const double n = (double)(long long)(r + up);
#endif
  u64 mag = dbits_of(n * p2);
  mag = sel64((u64)(a == 0ull), 0ull, mag);                                 // zeros keep their sign
  mag = sel64((u64)(mag > g.max_mag), g.outward, mag);                     // overflow, x = inf
  mag = sel64((u64)((g.subnormals == 0) & (mag < g.min_normal)), 0ull, mag);
  return double_of(sel64((u64)(a > INF64), u, convention_d(sign, mag, a, g)));  // NaN stays
}

CPD_FN double add_d_sr(double x, double y, const FormatD& g, u32 rand) { return round_d_sr(add_odd(x, y), g, rand); }

// ------------------------------------------------------------------------------------------
// Kahan's step, one helper for every lane type: the incoming value p, the sum s and the
// compensation c of one output; `add(x, y, j)` is the j-th rounded addition of the step
// (j = 0: y = p - c, 1: t = s + y, 2: t - s, 3: (t - s) - y), T's negation exact.
//   y = p - c,  t = s + y,  c = (t - s) - y,  s = t
// kahan_finish is the last three, y already formed (a fused step rounds y = -c + a*b at once).
// The u32 form of the generic path is kahan_add above; the float64 lanes use kahan_d /
// kahan_d_sr below; the CPU matmul's float32 and binary16 lanes call these templates with their
// own rounded additions.
template <class T, class Add>
CPD_FN void kahan_finish(T& s, T& c, T y, const Add& add) {
  const T t = add(s, y, 1);
  c = add(add(t, -s, 2), -y, 3);
  s = t;
}

template <class T, class Add>
CPD_FN void kahan_step(T& s, T& c, T p, const Add& add) {
  kahan_finish(s, c, add(p, -c, 0), add);
}

CPD_FN void kahan_d(double& s, double& c, double p, const FormatD& g) {
  kahan_step(s, c, p, [&g](double x, double y, int) { return add_d(x, y, g); });
}

// Stochastic rounding: w[j] is the word of addition j.
CPD_FN void kahan_d_sr(double& s, double& c, double p, const FormatD& g, const u32* w) {
  kahan_step(s, c, p, [&g, w](double x, double y, int j) { return add_d_sr(x, y, g, w[j]); });
}

// ------------------------------------------------------------------------------------------
// Stochastic rounding on float32 lanes (the CPU matmul, cuda/cpu/matmul_sr.h), for a format f
// with sr_lane_applies(f): the fast cast (f.fast: emin >= -126, so every quantum of f is at least
// 2^(emin - man) >= 2^-136), at most 11 significant bits, a signed classic convention (IEEE, FN,
// FINITE; subnormals on or flushed, saturating or not).
//
// Every rounding of a step rounds an exact real v (x + y, a * b or x + a * b of float32 values:
// add_bits, mul_bits, fma_bits). The lane computes hi = fl32(v) to nearest (one float32 add,
// multiply or FMA) and returns SR(hi), the stochastic cast of the float32 value hi (cast_bits_fast
// with the step's word), with `redo` set where SR(v) may differ; the caller redoes those lanes with
// add_bits / mul_bits / fma_bits. Why SR(v) = SR(hi) elsewhere:
//   The rule (round_wide, round_mag): with U the quantum at |v| (2^(max(E, emin) - man)),
//   r = floor(|v| / U) and F = floor(frac(|v| / U) * 2^32), v rounds to (r + up) * U, with up iff
//   (F & m) + (rand & m) >= 2^32 (m: the top sr_bits bits; sr_carry), i.e. iff F >= T with
//   T = 2^32 - (rand & m), a multiple of 2^(32 - sr_bits) (so F & m >= T iff F >= T); then the
//   overflow, flush and sign rules (finish_cast) act on that magnitude and v's sign alone. For a
//   float32 value hi the cast applies the same rule: F_hi = (a & qmask) << sr_shift in region N
//   (a = |hi|'s bits >= 2^emin), round_sub_fast's frac below (both floor(F_hi') for hi's exact
//   fraction F_hi', truncated below 2^-32 of a quantum).
//   hi and v have the same sign (hi = ±0 for a tiny v keeps v's; for v = 0 exactly hi has IEEE
//   754's sign of an exact zero sum, which is zero_sum_sign's to nearest and stochastic), and
//   |v - hi| <= ulp32(hi) / 2 (|v - hi| <= 2^-150 below 2^-126). In units of 2^-32 quanta of U
//   that is e' <= 2^(man + 8) = 2^(sr_shift - 1): 2^(E - 24) / 2^(E - man) * 2^32 in region N;
//   smaller below 2^emin, where U = 2^(emin - man) is fixed and ulp32 <= 2^(emin - 24), also on
//   float32 subnormals (2^-150 / 2^(emin - man) * 2^32 <= 2^(man + 8) for emin >= -126).
//   Cases, with A = F_hi (in [0, 2^32)) and X = (A + (rand & m)) mod 2^32 = (A - T) mod 2^32:
//   * |v| in hi's cell [r U, (r + 1) U): F = floor(F_hi' + e'), so up(v) = [F_hi' + e' >= T] and
//     up(hi) = [F_hi' >= T] (T an integer); they differ only if |T - F_hi'| <= |e'|, so
//     |A - T| <= 2^(sr_shift - 1) + 1: X within 2^(sr_shift - 1) + 1 of 0 (mod 2^32).
//   * |v| below hi's cell (hi on the grid, A = 0, v just under it): v's cell is the one below,
//     with F >= 2^32 - 2^(sr_shift - 1) - 1 in its own quantum's units (the same U, or U / 2 when
//     hi = 2^E with E > emin: then |hi - v| <= 2^(E - 25) = 2^(man - 24) * (U / 2), the same
//     bound). v rounds to hi unless F < T, which needs rand & m < 2^(sr_shift - 1) + 1: X = rand & m.
//   (|v| above hi's cell is impossible: (r + 1) U is a float32 value, and hi = fl32(v) <= it.)
//   So SR(v) = SR(hi) unless X is within W = 2^(sr_shift + 1) of 0 mod 2^32 (twice the bound, and
//   then some): redo iff (X + W) mod 2^32 < 2 W, about 2^(man - 20) of the lanes for sr_bits = 32.
//   Also redone: |hi| >= max (a >= f.max_bits: overflow and saturation, inf, NaN, whose payloads
//   and signs are the exact functions' own). Below max, |v| < max too (max is a float32 value:
//   |v| >= max would give |hi| >= max), and both round to at most max (max is on the grid:
//   r U < max gives (r + 1) U <= max), so no overflow rule is left to apply.
// The lanes' float32 operations need float32 subnormals (no FTZ/DAZ), as the fast cast does.
CPD_FN int sr_lane_applies(const Format& f) {
  return (int)(f.fast && f.man <= 10 && plain_convention(f));
}

// For f with sr_lane_applies: the stochastic cast of hi (float32 bits) to f with word rand, and in
// `redo` 1 where an exact value v with hi = fl32(v) may round otherwise (see above; the result is
// garbage there). SUB = 0 leaves region S out (as cast_bits_fast_normal), for callers that checked
// that |hi| >= 2^emin.
template <int SUB>
CPD_FN u32 sr_lane(u32 hi, const Format& f, u32 rand, int sr_bits, u32& redo) {
  u32 sign = hi & SIGN, a = hi ^ sign;
  u32 mag = round_normal_fast(a, sign, f, STOCHASTIC, rand, sr_bits);
  u32 frac = a << f.sr_shift;  // F_hi: region N's dropped bits at the top of a word
  if (SUB) {                   // region S: round_sub_fast, and its frac as that function forms it
    u32 small = (u32)(a < f.min_normal_bits);
    mag = sel(small, round_sub_fast(a, sign, f, STOCHASTIC, rand, sr_bits), mag);
    float ax = float_of(a), v = fsub(fadd(ax, f.sub_c), f.sub_c);
    u32 tz = sel((u32)(v > ax), bits_of(fsub(v, f.sub_q)), bits_of(v));
    u32 rem = sel(small, bits_of(fsub(ax, float_of(tz))), 0u);
    frac = sel(small, (u32)fmul(fmul(float_of(rem), f.sr_scale1), f.sr_scale2), frac);
  }
  u32 x = frac + (rand & (~0u << (32 - sr_bits)));
  u32 w = 2u << f.sr_shift;
  redo = (u32)(x + w < w + w) | (u32)(a >= f.max_bits);
  // finish_cast where no redo is due: a < max_bits, so no NaN, inf or overflow (steps 1, 2, 3a);
  // the flush (3b); and the plain convention's sign (4)
  return sign | sel((u32)(f.subnormals == 0) & (u32)(mag < f.min_normal_bits), 0u, mag);
}

// ------------------------------------------------------------------------------------------
// Directed lanes (the CPU matmul's rounding toward zero, up and down: cuda/cpu/matmul_directed.h).
// For a format f all of whose values are float32 values (f.fast: its largest is finite and below
// float32's, its quantum 2^(emin - man) >= 2^-149, man <= 23) and a directed mode, rounding any
// real v to f is rounding it to float32 in the same direction first, then to f:
//     cast(v, f, mode) == cast_bits_fast(R32(v), f, mode)        R32: v rounded to float32 in mode
// Rounding up to a set G of values picks the least member of G at or above v (down: the greatest
// at or below; toward zero: one or the other by v's sign). Every value of f at or above v is a
// float32 value at or above v, hence at or above R32(v) = the least such float32 value; so the
// values of f at or above v and at or above R32(v) are the same, and so is their least (down and
// toward zero alike). The rest of the cast acts on that rounded magnitude and the sign (finish_cast:
// overflow against f's largest value, itself a float32 value; the flush of a format without
// subnormals; the plain convention's signed zeros), and R32(v) keeps v's sign (a tiny v rounds to a
// zero of its own sign). So a step's rounding (add_bits, mul_bits, fma_bits of float32 operands:
// v = x + y, a * b or x + a * b) is the processor's float32 add, multiply or FMA with its rounding
// direction set to mode (IEEE 754 rounds each operation once, in the direction set: fp_env.h
// DirectedRounding; subnormals kept), then directed_lane; an exact zero sum gets the standard's
// sign in that direction, which is zero_sum_sign's. Nothing is redone but NaN results (their
// payloads: the callers run the generic steps there). No bound on man is needed, and binary32
// itself (man = 23) is the float32 result as it is.
// directed_lane runs while the processor rounds in mode: region N of the cast is integer work, and
// region S's float operations (round_sub_fast) give the same bits in every direction: (a + C) - C
// is then a neighbour of a on the grid of q, the one below or the one above, and the truncation
// step keeps the one below (v > a ? v - q : v), its zero made +0 (rounding down, an exact zero
// difference is -0); t + q, the compares and the rest are exact.
CPD_FN int directed_lane_applies(const Format& f, int mode) {
  return (int)((mode == TOWARD_ZERO || mode == UP || mode == DOWN) && f.fast && plain_convention(f));
}

template <int MODE>
CPD_FN u32 directed_lane(u32 hi, const Format& f) {
  static_assert(MODE == TOWARD_ZERO || MODE == UP || MODE == DOWN, "a directed mode");
  return cast_bits_fast(hi, f, MODE, 0u, 32);
}

// directed_lane on the bits alone, for the formats of the CPU's fused narrow chains (float32's
// exponent range, emin = -126 so that region N's rounding holds on float32's subnormals too
// (lane_normal_only), a signed zero of each sign, subnormals, overflow to infinity, largest value
// float32's own binade: TF32, BF16) and hi finite or infinite: region N's directed rounding
// t + ((dropped != 0) & away) << d0 is (a + (away ? qmask : 0)) & ~qmask (a carry exactly when a
// dropped bit is set), on the signed bits alike (a + qmask never reaches the sign bit for
// a <= INF_BITS), and its carry past f's largest value lands on INF_BITS, the overflow; an
// infinity has no dropped bits. No NaN reaches it (the chains take finite operands).
template <int MODE>
CPD_FN u32 directed_lane_bits(u32 hi, const Format& f) {
  static_assert(MODE == TOWARD_ZERO || MODE == UP || MODE == DOWN, "a directed mode");
  u32 neg = 0u - (hi >> 31);  // all ones for a negative hi
  u32 away = MODE == UP ? ~neg : MODE == DOWN ? neg : 0u;
  return (hi + (away & f.qmask)) & ~f.qmask;
}

}  // namespace cpd

#endif  // CPD_ACCUMULATE_H
