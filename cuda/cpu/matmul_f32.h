// The CPU matmul's float32 lanes (included by matmul.cpp): round to nearest, a tile of up to
// kTile outputs of one row kept in arrays of kTile floats (s, c, bs), every step a loop over the
// tile's lanes that the compiler vectorizes (or, for binary16 rounding, intrinsics).
//
// Products, one per lane and step k:
//   mul given:  p = mul_f(a, b)              a*b + C rounded once by an FMA: a*b rounded to mul
//               (nearest_f_applies(mul)); p is a value of acc (values_within)
//   fused:      r = fl32(x + a*b) by one FMA, x the addend (s, -c or bs), then rounded to acc;
//               r rounds as x + a*b does unless r is a midpoint of acc's grid
//               (cpd::is_midpoint_bits), and those lanes are redone with cpd::fma_bits.
// Sums of two values of acc (at most 11 bits): fl32(x + y) rounded to acc (Figueroa; see
// cpd::add_fast_applies and cpd::add_lane_applies), by one of the rounding policies:
//   AccF  round_f: fl32(v + C) - C on float32 lanes (cpd::nearest_f_applies, add_fast_applies);
//   AccI  the fast cast on integer lanes (cpd::round_lane_i), for exponent ranges round_f's C
//         cannot reach (BF16); region S skipped when emin = -126 (cpd::lane_normal_only);
//   AccH  IEEE binary16 itself (exp 5, man 10, bias 15, infinities, subnormals, no
//         saturation): the processor's float32 -> binary16 conversion, which rounds to nearest
//         even once (IEEE 754), F16C on x86 and FCVT on Arm, 8 or 4 lanes per instruction.
//         Calls with a NaN operand take AccF instead, so that NaN results keep their payload.
// Kahan (y = p - c, t = s + y, c = (t - s) - y, s = t) is kahan_lanes, the helper of these
// lanes (whole-tile passes of the policy's additions); each of its additions is a sum of two
// values of acc as above.
#ifndef CPD_CPU_MATMUL_F32_H
#define CPD_CPU_MATMUL_F32_H

#include <cstdint>
#include <utility>

#include "cpd/numerics.h"
#include "plain_format.h"  // plain_lane_format, plain_lanes

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define CPD_CPU_F16_LANES 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define CPD_CPU_F16_LANES 1
#else
#define CPD_CPU_F16_LANES 0
#endif

// A fused multiply-add instruction (cpd::ffma is one instruction, not a libm call): the binary32
// accumulator's lanes (AccB32) need it.
#if defined(__FMA__) || defined(__aarch64__)
#define CPD_CPU_HW_FMA 1
#else
#define CPD_CPU_HW_FMA 0
#endif

#if defined(__clang__)
#define CPD_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define CPD_IVDEP _Pragma("GCC ivdep")
#else
#define CPD_IVDEP
#endif

namespace cpd_cpu {

// Outputs per tile (a multiple of 8): 8 vectors per lane array, whose independent chains of
// roundings the core overlaps (a step's four Kahan roundings depend on each other): 8 AVX2
// vectors of 8 floats, or 8 AVX-512 vectors of 16 (with 64 lanes, AVX-512 had only 4 chains: every
// row of bench_matmul ran 5-20% slower). A column block of b is K x kLanes floats (256 KiB at
// K = 512 on AVX-512: still in L2).
#if defined(__AVX512F__)
constexpr int64_t kLanes = 128;
#else
constexpr int64_t kLanes = 64;
#endif

// The compiler folds a format field that holds a compile-time constant: the policies below run
// their loops on a local copy of the format whose flush (FormatF::flush_below = 0: subnormals
// on) or conventions (Format: signed, a zero of each sign, subnormals on; plain_format.h)
// are set to the constants they hold for the common formats, when they do (a branch per pass),
// so that those selects drop out of the loop. The same numerics functions on the same values.
inline cpd::FormatF no_flush(const cpd::FormatF& g) {
  cpd::FormatF h = g;
  h.flush_below = 0u;
  return h;
}


// out[i] = R(x[i] + y[i]) (NEG: R(x[i] - y[i])) for the kLanes lanes; out may be x or y (each lane
// reads its own index only, hence CPD_IVDEP). round(x): x[i] = R(x[i]), x a float32 result.
struct AccF {
  static constexpr bool kExact = false;
  cpd::FormatF g;
  template <bool NEG>
  static void add_v(float* out, const float* x, const float* y, const cpd::FormatF h) {
    CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i) out[i] = cpd::float_of(cpd::add_f(x[i], NEG ? -y[i] : y[i], h));
  }
  static void round_v(float* x, const cpd::FormatF h) {
    CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i) x[i] = cpd::float_of(cpd::round_f(cpd::bits_of(x[i]), h));
  }
  template <bool NEG>
  void add(float* out, const float* x, const float* y) const {
    if (g.flush_below == 0u) add_v<NEG>(out, x, y, no_flush(g));
    else add_v<NEG>(out, x, y, g);
  }
  void round(float* x) const {
    if (g.flush_below == 0u) round_v(x, no_flush(g));
    else round_v(x, g);
  }
  // out[i] = R(R(x[i] - y[i]) - z[i]): two of the additions above in one pass
  static void sub_sub_v(float* out, const float* x, const float* y, const float* z, const cpd::FormatF h) {
    CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i) {
      const float d = cpd::float_of(cpd::add_f(x[i], -y[i], h));
      out[i] = cpd::float_of(cpd::add_f(d, -z[i], h));
    }
  }
  void sub_sub(float* out, const float* x, const float* y, const float* z) const {
    if (g.flush_below == 0u) sub_sub_v(out, x, y, z, no_flush(g));
    else sub_sub_v(out, x, y, z, g);
  }
};

// acc is IEEE binary32 itself (exp 8, man 23, bias 127, infinities, subnormals, no saturation):
// to nearest, add_bits of two float32 values is the processor's float32 sum (IEEE 754 rounds it
// once; overflow to inf, the exact zero's sign and inf - inf are the standard's too), and
// fma_bits(x, a, b) is the processor's fused multiply-add (cpd::ffma) of the exact product: the
// fused lanes' r is the step's result, with nothing left to round (kExact: no midpoint test).
// NaN results are redone by the caller with the generic steps (matmul.cpp b32_tile), so that
// they keep add_bits's payload whatever order the instructions took their operands in; so is a
// tile run on a thread whose float32 unit flushes subnormals (fp_env.h).
struct AccB32 {
  static constexpr bool kExact = true;
  template <bool NEG>
  void add(float* out, const float* x, const float* y) const {
    CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i) out[i] = NEG ? cpd::fsub(x[i], y[i]) : cpd::fadd(x[i], y[i]);
  }
  void round(float*) const {}
  void sub_sub(float* out, const float* x, const float* y, const float* z) const {
    CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i) out[i] = cpd::fsub(cpd::fsub(x[i], y[i]), z[i]);
  }
};

template <int NORMAL_ONLY>
struct AccI {
  static constexpr bool kExact = false;
  cpd::Format f;
  template <bool NEG>
  static void add_v(float* out, const float* x, const float* y, const cpd::Format h) {
    CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i)
      out[i] = cpd::float_of(cpd::round_lane_i<NORMAL_ONLY>(cpd::bits_of(cpd::fadd(x[i], NEG ? -y[i] : y[i])), h));
  }
  static void round_v(float* x, const cpd::Format h) {
    CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i) x[i] = cpd::float_of(cpd::round_lane_i<NORMAL_ONLY>(cpd::bits_of(x[i]), h));
  }
  template <bool NEG>
  void add(float* out, const float* x, const float* y) const {
    if (plain_lane_format(f)) add_v<NEG>(out, x, y, plain_lanes(f));
    else add_v<NEG>(out, x, y, f);
  }
  void round(float* x) const {
    if (plain_lane_format(f)) round_v(x, plain_lanes(f));
    else round_v(x, f);
  }
  static void sub_sub_v(float* out, const float* x, const float* y, const float* z, const cpd::Format h) {
    CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i) {
      const float d = cpd::float_of(cpd::round_lane_i<NORMAL_ONLY>(cpd::bits_of(cpd::fadd(x[i], -y[i])), h));
      out[i] = cpd::float_of(cpd::round_lane_i<NORMAL_ONLY>(cpd::bits_of(cpd::fadd(d, -z[i])), h));
    }
  }
  void sub_sub(float* out, const float* x, const float* y, const float* z) const {
    if (plain_lane_format(f)) sub_sub_v(out, x, y, z, plain_lanes(f));
    else sub_sub_v(out, x, y, z, f);
  }
};

#if CPD_CPU_F16_LANES
// The processor's float32 vectors with their binary16 round trip (convert to binary16, rounding
// to nearest even, and back): 16 lanes per VCVTPS2PH / VCVTPH2PS on AVX-512 (zmm), 8 per F16C
// conversion (ymm), 4 per NEON FCVT.
struct H16Vec {
#if defined(__AVX512F__)
  using V = __m512;
  static constexpr int64_t kWidth = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V rnd(V v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
  // in the processor's current rounding direction (MXCSR RC: matmul_directed.h)
  static V rnd_cur(V v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC)); }
#elif defined(__F16C__)
  using V = __m256;
  static constexpr int64_t kWidth = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V rnd(V v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
  static V rnd_cur(V v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC)); }
#else
  using V = float32x4_t;
  static constexpr int64_t kWidth = 4;
  static V load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, V v) { vst1q_f32(p, v); }
  static V add(V a, V b) { return vaddq_f32(a, b); }
  static V sub(V a, V b) { return vsubq_f32(a, b); }
  static V rnd(V v) { return vcvt_f32_f16(vcvt_f16_f32(v)); }      // FCVT rounds in FPCR's direction:
  static V rnd_cur(V v) { return vcvt_f32_f16(vcvt_f16_f32(v)); }  // nearest, or matmul_directed.h's
#endif
};

struct AccH {
  static constexpr bool kExact = false;
  using H = H16Vec;
  template <bool NEG>
  void add(float* out, const float* x, const float* y) const {
    for (int64_t i = 0; i < kLanes; i += H::kWidth) {
      const H::V a = H::load(x + i), b = H::load(y + i);
      H::store(out + i, H::rnd(NEG ? H::sub(a, b) : H::add(a, b)));
    }
  }
  void round(float* x) const {
    for (int64_t i = 0; i < kLanes; i += H::kWidth) H::store(x + i, H::rnd(H::load(x + i)));
  }
  void sub_sub(float* out, const float* x, const float* y, const float* z) const {
    for (int64_t i = 0; i < kLanes; i += H::kWidth) {
      const H::V d = H::rnd(H::sub(H::load(x + i), H::load(y + i)));
      H::store(out + i, H::rnd(H::sub(d, H::load(z + i))));
    }
  }
};
#endif

// Kahan's step on a tile's lanes with acc's additions, as three passes of whole-tile additions:
// y = p - c (unless Y_FORMED: p holds y), t = s + y, c = (t - s) - y (its two roundings in one
// pass, sub_sub), then s = t by swapping the s and t arrays. y, t: scratch lanes. (One pass per
// lane, the four roundings in one loop body, measured about twice as slow with AVX2: the
// roundings' constants and live values spill out of the 16 vector registers.)
template <bool Y_FORMED, class Acc>
inline void kahan_lanes(float*& s, float* c, const float* p, float* y, float*& t, const Acc& acc) {
  const float* yy = p;
  if (!Y_FORMED) {
    acc.template add<true>(y, p, c);
    yy = y;
  }
  acc.template add<false>(t, s, yy);
  acc.sub_sub(c, t, s, yy);
  std::swap(s, t);
}

// Kahan's step on guarded lanes (cpd::round_lane_guarded, for cpd::add_lane_guard_applies(af)):
// the four roundings in one pass over the tile, each a handful of integer operations with no
// constant but the format's; top[i] keeps the largest |s| (float32 bits) lane i has held, for the
// guard (cpd::lane_guard_bits), which the caller checks once per tile.
template <bool Y_FORMED>
inline void kahan_guarded_v(float* s, float* c, const float* p, uint32_t* top, const cpd::Format h) {
  const auto add = [&h](float x, float y, int) {
    return cpd::float_of(cpd::round_lane_guarded(cpd::bits_of(cpd::fadd(x, y)), h));
  };
  CPD_IVDEP for (int64_t i = 0; i < kLanes; ++i) {
    float si = s[i], ci = c[i];
    if (Y_FORMED) cpd::kahan_finish(si, ci, p[i], add);
    else cpd::kahan_step(si, ci, p[i], add);
    s[i] = si;
    c[i] = ci;
    const uint32_t a = cpd::bits_of(si) & ~cpd::SIGN;
    top[i] = top[i] > a ? top[i] : a;
  }
}

// With man >= 1 the rounding's even bit is the last kept mantissa bit: parity_add = 0 and
// lsb_bit = 1 as constants (plain_format.h), so that their operations drop out of the loop.
template <bool Y_FORMED>
inline void kahan_guarded_lanes(float* s, float* c, const float* p, uint32_t* top, const cpd::Format& f) {
  if (f.man >= 1) kahan_guarded_v<Y_FORMED>(s, c, p, top, mantissa_lanes(f));
  else kahan_guarded_v<Y_FORMED>(s, c, p, top, f);
}

struct Tile {
  int64_t K, L, jt;     // steps, block length (0: none), live lanes
  bool finite = false;  // every operand finite (AccB32's products by mul_f_finite)
};

// One tile: outputs out[0 .. jt) of a row (arow: its K values of a; b: row k of b at b + k * ldb).
// FUSED: no mul format, each step rounds x + a*b once (af: acc, for the midpoint redo).
// GUARD (with KAHAN, for cpd::add_lane_guard_applies(af), finite operands only): Kahan's steps on
// guarded lanes (kahan_guarded_lanes) and the products by mul_f_finite; returns false, with out
// untouched, when the guard saw a sum out of its range (the caller then runs the tile unguarded).
template <class Acc, bool FUSED, bool KAHAN, bool BLOCK, bool GUARD = false>
bool f32_tile(const float* __restrict arow, const float* __restrict b, int64_t ldb, float* __restrict out,
              const Tile& d, const cpd::FormatF& mf0, const Acc& acc, const cpd::Format& af) {
  static_assert(!GUARD || KAHAN, "guarded lanes are Kahan's");
  const cpd::FormatF mf = mf0;
  const cpd::Format ag = af;
  alignas(64) float s0[kLanes], c[kLanes], bs[kLanes], p[kLanes], y[kLanes], t0[kLanes];
  alignas(64) uint32_t tie[kLanes], top[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) s0[i] = c[i] = bs[i] = p[i] = y[i] = t0[i] = 0.0f;
  for (int64_t i = 0; i < kLanes; ++i) top[i] = 0u;
  float* s = s0;  // the running sums; Kahan's steps swap s and t (kahan_lanes)
  float* t = t0;
  const int64_t jt = d.jt;
  for (int64_t k = 0; k < d.K; ++k) {
    const float av = arow[k];
    const float* __restrict br = b + k * ldb;
    if (FUSED) {
      // r = fl32(x + a*b) for the addend x of this step's fused rounding, then rounded to acc, into
      // q: p, or for plain steps the spare lanes t, which then become s (no copy)
      const float* x = BLOCK ? bs : KAHAN ? c : s;
      float* __restrict q = BLOCK || KAHAN ? p : t;
      uint32_t any = 0;
      if (Acc::kExact) {  // r is the step's result (AccB32)
        for (int64_t i = 0; i < jt; ++i) q[i] = cpd::ffma(av, br[i], KAHAN && !BLOCK ? -x[i] : x[i]);
      } else {
        for (int64_t i = 0; i < jt; ++i) {
          const float r = cpd::ffma(av, br[i], KAHAN && !BLOCK ? -x[i] : x[i]);
          tie[i] = cpd::is_midpoint_bits(cpd::bits_of(r) & ~cpd::SIGN, af);
          any |= tie[i];
          q[i] = r;
        }
        acc.round(q);
      }
      if (any) {
        for (int64_t i = 0; i < jt; ++i)
          if (tie[i]) {
            const float xi = KAHAN && !BLOCK ? -x[i] : x[i];
            q[i] = cpd::float_of(cpd::fma_bits(cpd::bits_of(xi), cpd::bits_of(av), cpd::bits_of(br[i]), af,
                                               cpd::NEAREST, 0u, 32));
          }
      }
      if (BLOCK) {
        for (int64_t i = 0; i < kLanes; ++i) bs[i] = p[i];
      } else if (GUARD) {
        kahan_guarded_lanes<true>(s, c, p, top, ag);  // p is y = -c + a*b
      } else if (KAHAN) {
        kahan_lanes<true>(s, c, p, y, t, acc);  // p is y = -c + a*b
      } else {
        std::swap(s, t);
      }
    } else if (Acc::kExact && !KAHAN && !BLOCK) {  // binary32: s = fl32(s + p) in the products' pass
      if (mf.flush_below == 0u && d.finite) {
        const cpd::FormatF mh = no_flush(mf);
        for (int64_t i = 0; i < jt; ++i) s[i] = cpd::fadd(s[i], cpd::float_of(cpd::mul_f_finite(av, br[i], mh)));
      } else if (mf.flush_below == 0u) {
        const cpd::FormatF mh = no_flush(mf);
        for (int64_t i = 0; i < jt; ++i) s[i] = cpd::fadd(s[i], cpd::float_of(cpd::mul_f(av, br[i], mh)));
      } else {
        for (int64_t i = 0; i < jt; ++i) s[i] = cpd::fadd(s[i], cpd::float_of(cpd::mul_f(av, br[i], mf)));
      }
    } else {
      if (GUARD && mf.flush_below == 0u) {
        const cpd::FormatF mh = no_flush(mf);
        for (int64_t i = 0; i < jt; ++i) p[i] = cpd::float_of(cpd::mul_f_finite(av, br[i], mh));
      } else if (GUARD) {
        for (int64_t i = 0; i < jt; ++i) p[i] = cpd::float_of(cpd::mul_f_finite(av, br[i], mf));
      } else if (mf.flush_below == 0u) {
        const cpd::FormatF mh = no_flush(mf);
        for (int64_t i = 0; i < jt; ++i) p[i] = cpd::float_of(cpd::mul_f(av, br[i], mh));
      } else {
        for (int64_t i = 0; i < jt; ++i) p[i] = cpd::float_of(cpd::mul_f(av, br[i], mf));
      }
      if (BLOCK) acc.template add<false>(bs, bs, p);
      else if (GUARD) kahan_guarded_lanes<false>(s, c, p, top, ag);
      else if (KAHAN) kahan_lanes<false>(s, c, p, y, t, acc);
      else acc.template add<false>(s, s, p);
    }
    if (BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K)) {
      if (GUARD) kahan_guarded_lanes<false>(s, c, bs, top, ag);
      else if (KAHAN) kahan_lanes<false>(s, c, bs, y, t, acc);
      else acc.template add<false>(s, s, bs);
      for (int64_t i = 0; i < kLanes; ++i) bs[i] = 0.0f;
    }
  }
  if (GUARD) {
    uint32_t m = 0u;
    for (int64_t i = 0; i < kLanes; ++i) m = m > top[i] ? m : top[i];
    if (m >= cpd::lane_guard_bits(ag)) return false;
  }
  for (int64_t i = 0; i < jt; ++i) out[i] = s[i];  // values of acc: exact
  return true;
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_F32_H
