// The CPU matmul's binary16 register chain (included by matmul.cpp): acc = IEEE binary16 to nearest
// by the processor's conversion (AccH, matmul_f32.h), mul a format of nearest_f_applies whose values
// are values of acc (values_within) and that keeps subnormals, no Kahan, no blocks. Every output
// is the chain
//   s = rnd16(s + p_k),  p_k = mul_f(a[k], b[k])  for k = 0, 1, ..., K - 1 from s = +0
// (rnd16: float32 -> binary16 -> float32, one rounding to nearest even: the sum of two values of
// acc rounded to float32 then to binary16 is the sum rounded once, Figueroa; numerics.h
// "Accumulation"). Outputs are independent and each keeps its own k order, so computing many at
// once in vector registers changes no bit. The steps are those of the float32 lanes (matmul_f32.h
// f32_tile with AccH): the same instructions on the same values, in registers instead of arrays.
//
// A register tile of R rows x NR columns (NR = NV vectors of W floats) keeps its R x NV sums in
// registers for the whole k loop; b's column panel (K x NR) is first copied into a contiguous
// buffer, zero-padded past N (the padded lanes' sums are never stored).
//
// Products, two forms to nearest (cpd/arith.h mul_f, mul_f_round, round_f_finish), and two
// directed forms of the Bounded one (PROD_SIGNED, PROD_MAGNITUDE, below; matmul_directed.h):
//   General: mul_f's steps on vectors: h = fl32(a*b); C = 2^(E + 23 - man) from h's exponent E
//     clamped to [emin, emax + 1]; r = fl32(|a||b| + C) - C; r > max -> outward; sign of h; a NaN
//     h kept as it is. (flush_below = 0: the format keeps subnormals.)
//   Bounded (every operand finite and max|a| * max|b| <= mul's largest value, checked by the caller
//     on the whole operands): no product overflows, E <= emax (h <= max), h is never NaN, so those
//     selects never fire and are left out; and the sign rides along: with C' = 1.5 C,
//       p = fl32(a*b + C') - C'
//     is round(a*b) with its sign: |a*b| < 2^(E+1) <= C / 2 (man <= 21), so a*b + C' lies in C's
//     binade, whose float32 quantum 2^(E - man) is mul's at E; C' is an even multiple of it, so the
//     tie to even is a*b's own; and the difference is exact (a multiple of the quantum below
//     2^(E+1)). One difference from mul_f: a product that rounds to zero is +0, never -0. No sum
//     sees it: s starts at +0 and is never -0 (s + p is a multiple of 2^-24, both being binary16
//     values, so it rounds to -0 only when it is -0 exactly, which x + y is, to nearest, only for
//     x = y = -0), and s + (+-0) = s for every s but -0.
// The sum's rounding is AccH's: H16Vec::rnd(s + p).
//
// The same tile runs Kahan's steps (KAHAN: c beside s in registers, every operation rounded by the
// Sum, y by one FMA with exact products) and serves other accumulators through its sum's rounding
// (SumB32: acc = IEEE binary32, the float32 add itself; SumI: BF16-like accumulators, bounded
// products only; SumF: narrower exponent ranges such as (6, 7), bounded products only, guarded;
// matmul.cpp picks; in a directed mode SumB32 and matmul_directed.h's SumDir).
// The zero-sign argument above holds for them too: s + p is a sum of multiples of mul's finest
// quantum (a power of two >= 2^-149), and a nonzero one never rounds to zero in either, so s is
// never -0; with Kahan's steps t = s + y is -0 only where s is, and a zero's sign in p, y or c
// reaches no nonzero value. (The directed forms keep mul_bits' zero signs instead: with them every
// step is the generic one's, zeros included.)
//
// Builds with F16C, FMA and AVX2 integer lanes (x86-64-v3) or AVX-512F; elsewhere CPD_CPU_H16_CHAIN
// is 0 and the float32 lanes serve (AVX512-FP16 CPUs take h16_tile in matmul.cpp first).
#ifndef CPD_CPU_MATMUL_H16_H
#define CPD_CPU_MATMUL_H16_H

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpd/numerics.h"
#include "matmul_chain.h"  // CPD_UNROLL, pack_panel

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#define CPD_CPU_H16_CHAIN 1
#else
#define CPD_CPU_H16_CHAIN 0
#endif

namespace cpd_cpu {

#if CPD_CPU_H16_CHAIN
struct H16Chain {
#if defined(__AVX512F__)
  using V = __m512;
  using I = __m512i;
  static constexpr int W = 16, NV = 2, MR = 6;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static I ci(uint32_t x) { return _mm512_set1_epi32((int)x); }
  static V cf(float x) { return _mm512_set1_ps(x); }
  static I bits(V v) { return _mm512_castps_si512(v); }
  static V flt(I v) { return _mm512_castsi512_ps(v); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fms(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }  // a*b + (-c) rounded once
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static I andi(I a, I b) { return _mm512_and_si512(a, b); }
  static I ori(I a, I b) { return _mm512_or_si512(a, b); }
  static I addi(I a, I b) { return _mm512_add_epi32(a, b); }
  static I maxu(I a, I b) { return _mm512_max_epu32(a, b); }
  static I minu(I a, I b) { return _mm512_min_epu32(a, b); }
  static I srlv(I a, I n) { return _mm512_srlv_epi32(a, n); }
  // x > y ? t : x (float32 compare, false for NaN)
  static V gt_select(V x, V y, V t) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, y, _CMP_GT_OQ), x, t); }
  // (signed) x > y ? t : u
  static I gti_select(I x, I y, I t, I u) { return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(x, y), u, t); }
  static V rnd16(V v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
  // the same in the current rounding direction (MXCSR RC: matmul_directed.h)
  static V rnd16_cur(V v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC)); }
  // s's sign bits, x's other bits
  static V with_sign(V x, I s) {
    return flt(_mm512_ternarylogic_epi32(ci(cpd::SIGN), s, bits(x), 0xCA));  // SIGN ? s : x, bit by bit
  }
  // whether some lane of x is at least t (unsigned)
  static bool any_ge_u(I x, I t) { return _mm512_cmpge_epu32_mask(x, t) != 0; }
#else
  using V = __m256;
  using I = __m256i;
  static constexpr int W = 8, NV = 2, MR = 4;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static I ci(uint32_t x) { return _mm256_set1_epi32((int)x); }
  static V cf(float x) { return _mm256_set1_ps(x); }
  static I bits(V v) { return _mm256_castps_si256(v); }
  static V flt(I v) { return _mm256_castsi256_ps(v); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fms(V a, V b, V c) { return _mm256_fmsub_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static I andi(I a, I b) { return _mm256_and_si256(a, b); }
  static I ori(I a, I b) { return _mm256_or_si256(a, b); }
  static I addi(I a, I b) { return _mm256_add_epi32(a, b); }
  static I maxu(I a, I b) { return _mm256_max_epu32(a, b); }
  static I minu(I a, I b) { return _mm256_min_epu32(a, b); }
  static I srlv(I a, I n) { return _mm256_srlv_epi32(a, n); }
  static V gt_select(V x, V y, V t) { return _mm256_blendv_ps(x, t, _mm256_cmp_ps(x, y, _CMP_GT_OQ)); }
  static I gti_select(I x, I y, I t, I u) {
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(u), _mm256_castsi256_ps(t),
                                                _mm256_castsi256_ps(_mm256_cmpgt_epi32(x, y))));
  }
  static V rnd16(V v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
  static V rnd16_cur(V v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC)); }
  static V with_sign(V x, I s) {
    const I m = ci(cpd::SIGN);
    return flt(ori(_mm256_andnot_si256(m, bits(x)), andi(m, s)));
  }
  static bool any_ge_u(I x, I t) {
    return _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_max_epu32(x, t), x)) != 0;
  }
#endif
  static constexpr int NR = W * NV;
};

// mul's constants on vectors (cpd::FormatF, flush_below = 0).
struct H16Mul {
  H16Chain::I inf, sign, mag, emin, ecap, shift, shift15, outward;
  H16Chain::V max;
  explicit H16Mul(const cpd::FormatF& g) {
    using C = H16Chain;
    inf = C::ci(cpd::INF_BITS);
    sign = C::ci(cpd::SIGN);
    mag = C::ci(~cpd::SIGN);
    emin = C::ci(g.emin_field);
    ecap = C::ci(g.ecap_field);
    shift = C::ci(g.c_shift);
    shift15 = C::ci(g.c_shift + (1u << 22));  // C' = 1.5 C: C's bits with the top mantissa bit set
    outward = C::ci(g.outward_bits);
    max = C::cf(g.max);
  }
};

// mul_f(a, b) on vectors; am, bm: |a|, |b| (General form, see above).
inline H16Chain::V h16_product(H16Chain::V a, H16Chain::V b, H16Chain::V am, H16Chain::V bm, const H16Mul& m) {
  using C = H16Chain;
  const C::I h = C::bits(C::mul(a, b));
  const C::I e = C::minu(C::maxu(C::andi(h, m.inf), m.emin), m.ecap);
  const C::V c = C::flt(C::addi(e, m.shift));
  const C::V r = C::gt_select(C::sub(C::fma(am, bm, c), c), m.max, C::flt(m.outward));  // overflow
  const C::I p = C::ori(C::andi(h, m.sign), C::bits(r));
  return C::flt(C::gti_select(C::andi(h, m.mag), m.inf, h, p));  // a NaN product: h itself
}

// round(a*b) for bounded operands (Bounded form, see above), h = bits of fl32(a*b).
inline H16Chain::V h16_product_bounded(H16Chain::V a, H16Chain::V b, H16Chain::I h, const H16Mul& m) {
  using C = H16Chain;
  const C::V c = C::flt(C::addi(C::maxu(C::andi(h, m.inf), m.emin), m.shift15));
  return C::sub(C::fma(a, b, c), c);
}

inline H16Chain::V h16_product_bounded(H16Chain::V a, H16Chain::V b, const H16Mul& m) {
  return h16_product_bounded(a, b, H16Chain::bits(H16Chain::mul(a, b)), m);
}

// The directed forms (matmul_directed.h: the caller holds a rounding direction, in which every
// float operation here rounds; bounded operands). Up and down (PROD_SIGNED): the Bounded form
// with its sign riding along, as fl(C' + a*b) rounded up or down is C' + a*b rounded up or down on
// mul's grid at E (C' a multiple of its quantum); then the sign of h = fl(a*b), a*b's own even
// when h is 0, put on the result, whose sign it already is unless the result is 0 (C' - C' is +0
// rounding up, -0 rounding down): round(a*b)'s zero keeps a*b's sign, as mul_bits' does. Toward
// zero (PROD_MAGNITUDE), which is not a shift of C' + a*b's rounding (toward zero, C' + a*b > 0
// rounds down even where a*b < 0), on the magnitudes: fl(|a||b| + C) - C, the truncation of
// |a*b| on mul's grid at E, >= +0, and h's sign bit or-ed in. E comes from h rounded in the
// direction: when h rounds up to 2^(E'+1), |a*b| is within 2^(E'-23) of it and rounds to it on
// either binade's grid.
// PROD_EXACT: no product; Kahan's y = round(a*b - c) is one FMA and Sum's rounding (Sum::kExactFma).
enum ProdForm { PROD_GENERAL = 0, PROD_BOUNDED = 1, PROD_SIGNED = 2, PROD_MAGNITUDE = 3, PROD_EXACT = 4 };

inline H16Chain::V h16_product_signed(H16Chain::V a, H16Chain::V b, const H16Mul& m) {
  const H16Chain::I h = H16Chain::bits(H16Chain::mul(a, b));
  return H16Chain::with_sign(h16_product_bounded(a, b, h, m), h);
}

inline H16Chain::V h16_product_magnitude(H16Chain::V a, H16Chain::V b, H16Chain::V am, H16Chain::V bm,
                                         const H16Mul& m) {
  using C = H16Chain;
  const C::I h = C::bits(C::mul(a, b));
  const C::V c = C::flt(C::addi(C::maxu(C::andi(h, m.inf), m.emin), m.shift));
  return C::flt(C::ori(C::andi(h, m.sign), C::bits(C::sub(C::fma(am, bm, c), c))));
}

// How a chain's sum s + p is rounded: SumH16 to binary16 (AccH's rnd16), SumB32 the float32 add
// itself (AccB32: acc is IEEE binary32, whose sum of two float32 values is the processor's add),
// SumI to an acc of fchain_applies (matmul_fchain.h: BF16, float32's exponent range, at most 10
// mantissa bits) on the float32 bits of fl32(s + p): round_lane_i's integer rounding (region N,
// lane_normal_only; Figueroa, add_lane_applies)
//   (u + half - 1 + ((u >> d0) & 1)) & ~qmask,   d0 = 23 - man
// on the signed bits, for bounded products only: p is finite, so s is never NaN; a carry past max
// lands on INF_BITS (acc's overflow), which the rounding then keeps, as it keeps the sign bit.
// Each has rnd(u), the rounding of u = fl32(x +- y) for x, y values of acc or mul (step: s + p;
// diff: x - y, Kahan's other operations), and kExactFma: whether rnd(fl32(x + a*b)) is the exact
// x + a*b rounded once (binary32 itself, and the directed policies; to nearest a narrower acc
// would need the midpoint test of matmul_fchain.h).
template <class Self>
struct SumOps {
  H16Chain::V step(H16Chain::V s, H16Chain::V p) const {
    return static_cast<const Self*>(this)->rnd(H16Chain::add(s, p));
  }
  H16Chain::V diff(H16Chain::V x, H16Chain::V y) const {
    return static_cast<const Self*>(this)->rnd(H16Chain::sub(x, y));
  }
};
struct SumH16 : SumOps<SumH16> {
  static constexpr bool kGuard = false, kExactFma = false;
  H16Chain::V rnd(H16Chain::V u) const { return H16Chain::rnd16(u); }
};
struct SumB32 : SumOps<SumB32> {
  static constexpr bool kGuard = false, kExactFma = true;
  H16Chain::V rnd(H16Chain::V u) const { return u; }
};
struct SumI : SumOps<SumI> {
  static constexpr bool kGuard = false, kExactFma = false;
  H16Chain::I half_m1, keep, one, d0;
  explicit SumI(const cpd::Format& f) {
    half_m1 = H16Chain::ci(f.half_m1);
    keep = H16Chain::ci(~f.qmask);
    one = H16Chain::ci(1u);
    d0 = H16Chain::ci(23u - (uint32_t)f.man);
  }
  H16Chain::V rnd(H16Chain::V v) const {
    using C = H16Chain;
    const C::I u = C::bits(v);
    return C::flt(C::andi(C::addi(C::addi(u, half_m1), C::andi(C::srlv(u, d0), one)), keep));
  }
};

// SumF: an acc of round_f (cpd::nearest_f_applies and add_fast_applies: at most 10 mantissa bits,
// an exponent range narrower than float32's, such as (6, 7)) with subnormals, bounded products
// only, guarded. u = fl32(s + p) is add_f's sum; its rounding is round_f's
//   r = fl32(u + C') - C',   C' = 1.5 C,  C = 2^(E + 23 - man),  E = max(exponent of u, emin)
// with u's sign riding along, as in h16_product_bounded: |u| < 2^(E+1) <= C / 2 (man <= 21), so
// u + C' lies in C's binade, whose quantum is acc's at E, C' an even multiple of it (ties to even
// as round_f's fl32(|u| + C) - C), and the difference is exact. The selects of round_f_finish drop
// out: no zero sum changes sign (round_f's r = 0 keeps u's sign, this r is +0; but u is never
// -0 and never rounds to 0: s starts at +0, bounded products are never -0, and s + p is a multiple
// of acc's finest quantum, as argued above), there is no flush (subnormals on), and overflow is
// left to the guard: every rounded s of the tile is kept below G = 2^emax in magnitude (guard:
// the running unsigned maximum of its magnitude bits), which also keeps C finite (emax + 24 - man
// <= 127); a tile whose maximum reaches G (an overflow, or a sum merely near the top binade) is run
// again by the caller on the float32 lanes (h16_chain_rows' redo).
struct SumF : SumOps<SumF> {
  static constexpr bool kGuard = true, kExactFma = false;
  H16Chain::I inf, emin, shift15, mag, top;
  explicit SumF(const cpd::Format& f) {
    const cpd::FormatF g = cpd::make_format_f(f);
    inf = H16Chain::ci(cpd::INF_BITS);
    emin = H16Chain::ci(g.emin_field);
    shift15 = H16Chain::ci(g.c_shift + (1u << 22));  // C' = 1.5 C
    mag = H16Chain::ci(~cpd::SIGN);
    top = H16Chain::ci(f.max_bits & cpd::INF_BITS);  // G = 2^emax
  }
  H16Chain::V rnd(H16Chain::V u) const {
    using C = H16Chain;
    const C::V c = C::flt(C::addi(C::maxu(C::andi(C::bits(u), inf), emin), shift15));
    return C::sub(C::add(u, c), c);
  }
  H16Chain::I guard(H16Chain::I g, H16Chain::V s) const {
    return H16Chain::maxu(g, H16Chain::andi(H16Chain::bits(s), mag));
  }
  bool tripped(H16Chain::I g) const { return H16Chain::any_ge_u(g, top); }
};

// p = round(a*b) in the form PROD (not PROD_EXACT); am, bm: |a|, |b| (the forms on magnitudes).
template <int PROD>
inline H16Chain::V h16_chain_product(H16Chain::V a, H16Chain::V b, H16Chain::V am, H16Chain::V bm, const H16Mul& m) {
  if constexpr (PROD == PROD_BOUNDED) return h16_product_bounded(a, b, m);
  else if constexpr (PROD == PROD_SIGNED) return h16_product_signed(a, b, m);
  else if constexpr (PROD == PROD_MAGNITUDE) return h16_product_magnitude(a, b, am, bm, m);
  else return h16_product(a, b, am, bm, m);
}

// Rows r < R of a register tile: y[r][0 .. nc) = the chains of a's rows (a + r * lda, K values)
// against the packed panel bp (K x NR, row k at bp + k * NR), the steps of numerics.h's dot_step
// rounded by Sum. Returns false when a guarded Sum's guard tripped (y then holds garbage for the
// caller to replace), else true. KAHAN: each step (without blocks) or each run's end (with them) is
// Kahan's (kahan_add: y = x - c, t = s + y, c = (t - s) - y, s = t), c kept in registers beside s.
// BLOCK: runs of L steps summed into bs from +0, each run's end adding bs into s. PROD_EXACT (with
// Kahan or blocks, a Sum of kExactFma): the term's step rnd(x + a*b) (or a*b - c) is one FMA.
template <int R, int PROD, bool KAHAN, bool BLOCK, class Sum>
inline bool h16_chain_tile(const float* __restrict a, int64_t lda, const float* __restrict bp, int64_t K, int64_t L,
                           float* __restrict y, int64_t ldy, int64_t nc, const H16Mul& m, const Sum& sum) {
  static_assert(!(KAHAN || BLOCK) || !Sum::kGuard, "Kahan's steps and blocks take no guarded Sum");
  static_assert(PROD != PROD_EXACT || ((KAHAN || BLOCK) && Sum::kExactFma),
                "exact products: Kahan or blocks, and a Sum of kExactFma");
  using C = H16Chain;
  C::V s[R][C::NV], c[KAHAN ? R : 1][C::NV], bs[BLOCK ? R : 1][C::NV];
  C::I g[C::NV];  // Sum::kGuard: the guard, per vector column
  CPD_UNROLL for (int r = 0; r < R; ++r)
    CPD_UNROLL for (int v = 0; v < C::NV; ++v) {
      s[r][v] = C::zero();  // s = +0 (and c, bs)
      if constexpr (KAHAN) c[r][v] = C::zero();
      if constexpr (BLOCK) bs[r][v] = C::zero();
    }
  CPD_UNROLL for (int v = 0; v < C::NV; ++v) g[v] = C::ci(0u);
  const auto kahan = [&sum](C::V& sr, C::V& cr, C::V yk) {
    const C::V t = sum.step(sr, yk);
    cr = sum.diff(sum.diff(t, sr), yk);
    sr = t;
  };
  const int64_t run = BLOCK ? L : K;
  for (int64_t k0 = 0; k0 < K; k0 += run) {
    const int64_t k1 = K - k0 < run ? K : k0 + run;
    for (int64_t k = k0; k < k1; ++k) {
      constexpr bool kMag = PROD == PROD_GENERAL || PROD == PROD_MAGNITUDE;  // the forms on |a|, |b|
      C::V bv[C::NV], bm[C::NV];
      CPD_UNROLL for (int v = 0; v < C::NV; ++v) {
        bv[v] = C::load(bp + k * C::NR + v * C::W);
        if (kMag) bm[v] = C::flt(C::andi(C::bits(bv[v]), m.mag));
      }
      CPD_UNROLL for (int r = 0; r < R; ++r) {
        const C::V av = C::bcast(a + r * lda + k);
        const C::V am = kMag ? C::flt(C::andi(C::bits(av), m.mag)) : av;
        CPD_UNROLL for (int v = 0; v < C::NV; ++v) {
          if constexpr (BLOCK) {
            C::V& x = bs[r][v];
            if constexpr (PROD == PROD_EXACT) x = sum.rnd(C::fma(av, bv[v], x));
            else x = sum.step(x, h16_chain_product<PROD>(av, bv[v], am, bm[v], m));
          } else if constexpr (KAHAN) {
            if constexpr (PROD == PROD_EXACT) kahan(s[r][v], c[r][v], sum.rnd(C::fms(av, bv[v], c[r][v])));
            else kahan(s[r][v], c[r][v], sum.diff(h16_chain_product<PROD>(av, bv[v], am, bm[v], m), c[r][v]));
          } else {
            s[r][v] = sum.step(s[r][v], h16_chain_product<PROD>(av, bv[v], am, bm[v], m));
          }
        }
        if constexpr (Sum::kGuard)
          CPD_UNROLL for (int v = 0; v < C::NV; ++v) g[v] = sum.guard(g[v], s[r][v]);
      }
    }
    if constexpr (BLOCK)
      CPD_UNROLL for (int r = 0; r < R; ++r)
        CPD_UNROLL for (int v = 0; v < C::NV; ++v) {
          if constexpr (KAHAN) kahan(s[r][v], c[r][v], sum.diff(bs[r][v], c[r][v]));
          else s[r][v] = sum.step(s[r][v], bs[r][v]);
          bs[r][v] = C::zero();
        }
  }
  store_tile<C, R>(s, y, ldy, nc);
  if constexpr (Sum::kGuard) {
    CPD_UNROLL for (int v = 1; v < C::NV; ++v) g[0] = C::maxu(g[0], g[v]);
    return !sum.tripped(g[0]);
  }
  return true;
}

// The last rows (n < R of them, R the whole tile's): the tile of n rows.
template <int R, int PROD, bool KAHAN, bool BLOCK, class Sum>
inline bool h16_chain_last(int64_t n, const float* a, int64_t K, int64_t L, const float* bp, float* y, int64_t N,
                           int64_t nc, const H16Mul& m, const Sum& sum) {
  if (n == R) return h16_chain_tile<R, PROD, KAHAN, BLOCK, Sum>(a, K, bp, K, L, y, N, nc, m, sum);
  if constexpr (R > 1) return h16_chain_last<R - 1, PROD, KAHAN, BLOCK, Sum>(n, a, K, L, bp, y, N, nc, m, sum);
  return true;
}

// Rows m0 .. m1 of one batch element's output, columns j0 .. j0 + nc (nc <= NR): a: (M, K) of that
// element, b: (K, N), y: (M, N); L: the block length (BLOCK). The panel of b is packed into pack
// (resized as needed). A guarded Sum's tripped tile, and every tile after it in these rows (they
// would likely trip too), is left to redo(i, n), rows i .. i + n of these columns (kNoRedo: a Sum
// without a guard).
inline constexpr auto kNoRedo = [](int64_t, int64_t) {};

template <int PROD, bool KAHAN, bool BLOCK, class Sum, class Redo>
inline void h16_chain_rows(const float* a, const float* b, float* y, int64_t K, int64_t L, int64_t N, int64_t m0,
                           int64_t m1, int64_t j0, int64_t nc, std::vector<float>& pack, const H16Mul& m,
                           const Sum& sum, const Redo& redo) {
  using C = H16Chain;
  constexpr int MR = C::MR;  // (with Kahan too: fewer rows would leave the chains' latency exposed)
  const float* bp = pack_panel(b, K, N, j0, nc, C::NR, pack);
  int64_t i = m0;
  for (; i + MR <= m1; i += MR)
    if (!h16_chain_tile<MR, PROD, KAHAN, BLOCK, Sum>(a + i * K, K, bp, K, L, y + i * N + j0, N, nc, m, sum)) {
      redo(i, m1 - i);
      return;
    }
  if (i < m1 &&
      !h16_chain_last<MR - 1, PROD, KAHAN, BLOCK, Sum>(m1 - i, a + i * K, K, L, bp, y + i * N + j0, N, nc, m, sum))
    redo(i, m1 - i);
}
#endif

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_H16_H
