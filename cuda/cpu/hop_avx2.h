// cpd_hop_avx2: the AVX2 + F16C path of the 8-bit ring hop (cuda/cpu/hop.cpp, fast_hop): for a
// signed 8-bit format of cpd::half_view_applies and cpd::cast_code_applies (e4m3, e5m2, e4m3fn,
// their finite variants, ...), 32 elements per step, written with intrinsics:
//
//   decode: the 32 received and the 32 own codes are widened to 16-bit lanes as their binary16
//     views (cpd::half_bits_of_code: an unpack puts the code in the high byte, an arithmetic shift
//     by man - 2 and a mask leave sign << 15 | mag << (10 - man)) and converted to float32 by
//     vcvtph2ps, exactly: 8 codes per conversion, where the scalar loop gathers one float from
//     a table per code (two loads and an insert: 184 of the 309 instructions per 32 elements of
//     GCC's vectorization of that loop);
//   add: the two views added in float32 and multiplied by 2^(15 - bias): exactly the float32 sum
//     of the decoded values (the identity is proved at cpd::half_view_applies), so what follows
//     sees the values the scalar loop sees;
//   round and encode, round to nearest: cpd::cast_code_fast's steps on 8 lanes (region N: add
//     half - 1 + the even bit and shift, with code_adj << d0 taken off the added constant, which
//     is exact above 2^emin; region S: bits(a + C) - bits(C); the select on a < 2^emin; a code
//     past the largest finite one becomes the overflow code, which for nearest and these
//     conventions is the largest finite code or the one after it (inf, the FN NaN), so an
//     unsigned min); the sign bits come from the sums themselves by signed saturating packs, in
//     the same lane order as the codes' unsigned packs, and go on top of the bytes;
//   directed modes: the float32 sums (with DOWN's -0 for x + (-x)) go through a block buffer to
//     cpd::cast_code_fast in a plain loop (GCC vectorizes it), one pass each.
// A code whose magnitude is at least cpd::half_view_limit (inf, NaN, or binary16's field 31) is
// not decoded by the view: the block reports it (an unsigned byte max of the magnitudes) and the
// caller redoes the block through the pair table, as the scalar loop does for an inf/NaN sum.
// Elements past the last multiple of 32 are the caller's (its scalar loop). The bucket encode
// (round to nearest) and the wire decode of the same formats use the same steps (encode_nearest,
// decode_block); cpd.encode's 8-bit codes to nearest take encode_nearest too (cuda/cpu/cast.cpp).
// tests/test_wire_kernels.py compares every pair of codes of the 8-bit formats with cpd.add, in
// whole blocks, in tails and next to specials.
#ifndef CPD_CPU_HOP_AVX2_H
#define CPD_CPU_HOP_AVX2_H

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpd/numerics.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define CPD_HOP_AVX2 1
#else
#define CPD_HOP_AVX2 0
#endif

namespace cpd_hop_avx2 {

using cpd::u32;

// The code a magnitude past f's largest finite value rounds to to nearest (cast_code_fast's
// overflow: inf, the FN NaN, or the largest finite code when saturating or finite).
inline u32 overflow_code(const cpd::Format& f) {
  const u32 max_code = (f.max_bits >> (23 - f.man)) - f.code_adj;
  return f.outward_bits == cpd::INF_BITS ? f.inf_code : f.outward_bits > cpd::INF_BITS ? f.nan_code : max_code;
}

// Whether this path takes a hop of format f (with the caller's saturate flag) in mode `mode`
// (the caller has checked cpd::cast_code_applies and the fast hop's exactness conditions).
inline bool applies(const cpd::Format& f, int mode) {
#if CPD_HOP_AVX2
  if (!cpd::half_view_applies(f) || !cpd::cast_code_applies(f)) return false;
  if (mode == cpd::TOWARD_ZERO || mode == cpd::UP || mode == cpd::DOWN) return true;
  if (mode != cpd::NEAREST) return false;
  const u32 max_code = (f.max_bits >> (23 - f.man)) - f.code_adj, out = overflow_code(f);
  return out == max_code || out == max_code + 1u;  // the overflow select is a min
#else
  (void)f;
  (void)mode;
  return false;
#endif
}

#if CPD_HOP_AVX2

// Per-call constants, broadcast.
struct Consts {
  __m256i abs_mask, half_adj, one, min_normal, out_code, subc_bits, keep, mag7, limit_m1, sign80;
  __m256 subc, scale;
  __m128i d0, view_shift;
  explicit Consts(const cpd::Format& f) {
    const int d0i = 23 - f.man;
    abs_mask = _mm256_set1_epi32(0x7fffffff);
    half_adj = _mm256_set1_epi32((int)(f.half_m1 - (f.code_adj << d0i)));  // mod 2^32
    one = _mm256_set1_epi32(1);
    min_normal = _mm256_set1_epi32((int)f.min_normal_bits);
    out_code = _mm256_set1_epi32((int)overflow_code(f));
    subc_bits = _mm256_set1_epi32((int)cpd::bits_of(f.sub_c));
    subc = _mm256_set1_ps(f.sub_c);
    scale = _mm256_set1_ps(std::ldexp(1.0f, 15 - f.bias));
    d0 = _mm_cvtsi32_si128(d0i);
    view_shift = _mm_cvtsi32_si128(f.man - 2);
    keep = _mm256_set1_epi16((short)(0x8000u | (f.code_mag_mask << (10 - f.man))));
    mag7 = _mm256_set1_epi8(0x7f);
    limit_m1 = _mm256_set1_epi8((char)(cpd::half_view_limit(f) - 1u));
    sign80 = _mm256_set1_epi8((char)0x80);
  }
};

// 16 binary16 views from 16 codes sitting in the high bytes of 16-bit lanes.
inline __m256i views16(__m256i hi_codes, const Consts& c) {
  return _mm256_and_si256(_mm256_sra_epi16(hi_codes, c.view_shift), c.keep);
}

// The float32 sums of 32 code pairs at r, a, as four vectors of 8 lanes holding elements 0-7,
// 8-15, 16-23 and 24-31 (s[0..3]); folds the codes' magnitudes into mx (unsigned byte max).
inline void sums32(const uint8_t* r, const uint8_t* a, const Consts& c, __m256i& mx, __m256 s[4], __m256 x[4],
                   __m256 y[4]) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i cr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r));
  const __m256i ca = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  mx = _mm256_max_epu8(mx, _mm256_max_epu8(_mm256_and_si256(cr, c.mag7), _mm256_and_si256(ca, c.mag7)));
  // unpacklo: bytes 0-7 (low 128 bits) and 16-23 (high); unpackhi: 8-15 and 24-31
  const __m256i rl = views16(_mm256_unpacklo_epi8(zero, cr), c), rh = views16(_mm256_unpackhi_epi8(zero, cr), c);
  const __m256i al = views16(_mm256_unpacklo_epi8(zero, ca), c), ah = views16(_mm256_unpackhi_epi8(zero, ca), c);
  x[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(rl));
  x[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(rh));
  x[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(rl, 1));
  x[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(rh, 1));
  y[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(al));
  y[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(ah));
  y[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(al, 1));
  y[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(ah, 1));
  for (int k = 0; k < 4; ++k) s[k] = _mm256_mul_ps(_mm256_add_ps(x[k], y[k]), c.scale);
}

// cast_code_fast(u, f, NEAREST) without the sign code, for 8 finite float32 sums.
inline __m256i code8_nearest(__m256 s, const Consts& c) {
  const __m256i a = _mm256_and_si256(_mm256_castps_si256(s), c.abs_mask);
  const __m256i even = _mm256_and_si256(_mm256_srl_epi32(a, c.d0), c.one);
  const __m256i n_code = _mm256_srl_epi32(_mm256_add_epi32(_mm256_add_epi32(a, c.half_adj), even), c.d0);
  const __m256i s_code =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), c.subc)), c.subc_bits);
  const __m256i is_sub = _mm256_cmpgt_epi32(c.min_normal, a);  // a <= 0x7fffffff: signed compare is unsigned
  return _mm256_min_epu32(_mm256_blendv_epi8(n_code, s_code, is_sub), c.out_code);
}

// out[0 .. 32) = the codes of the 32 finite float32 values s[0..3] (elements 0-7, 8-15, 16-23,
// 24-31), rounded to nearest: the magnitudes' codes packed to bytes, the sign bits from the
// values themselves by signed saturating packs (the same lane order), then the 128-bit lanes'
// dwords back in order.
inline void store_codes32(const __m256 s[4], uint8_t* __restrict out, const Consts& c) {
  const __m256i codes = _mm256_packus_epi16(_mm256_packus_epi32(code8_nearest(s[0], c), code8_nearest(s[1], c)),
                                            _mm256_packus_epi32(code8_nearest(s[2], c), code8_nearest(s[3], c)));
  const __m256i signs = _mm256_packs_epi16(
      _mm256_packs_epi32(_mm256_castps_si256(s[0]), _mm256_castps_si256(s[1])),
      _mm256_packs_epi32(_mm256_castps_si256(s[2]), _mm256_castps_si256(s[3])));  // negative stays negative
  const __m256i bytes = _mm256_or_si256(codes, _mm256_and_si256(signs, c.sign80));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(bytes, order));
}

// Whether a code magnitude folded into mx (unsigned byte max) is at or past half_view_limit.
inline bool past_limit(__m256i mx, const Consts& c) {
  const __m256i over = _mm256_subs_epu8(mx, c.limit_m1);  // nonzero where a magnitude >= limit
  return !_mm256_testz_si256(over, over);
}

// One block of m elements, round to nearest: out[i] = the code of the sum of r[i] and a[i], for the
// first m - m % 32; returns nonzero when a code of the block is at or past half_view_limit (the
// caller then redoes the whole block).
inline u32 hop_nearest(const uint8_t* __restrict r, const uint8_t* __restrict a, uint8_t* __restrict out, int64_t m,
                       const Consts& c) {
  __m256i mx = _mm256_setzero_si256();
  __m256 s[4], x[4], y[4];
  for (int64_t i = 0; i + 32 <= m; i += 32) {
    sums32(r + i, a + i, c, mx, s, x, y);
    store_codes32(s, out + i, c);
  }
  return (u32)past_limit(mx, c);
}

// The same for a directed mode: the float32 sums through buf (m floats) to cast_code_fast.
template <int MODE>
inline u32 hop_directed(const uint8_t* __restrict r, const uint8_t* __restrict a, uint8_t* __restrict out, int64_t m,
                        const Consts& c, const cpd::Format g, float* __restrict buf) {
  __m256i mx = _mm256_setzero_si256();
  __m256 s[4], x[4], y[4];
  const int64_t mv = m - m % 32;
  for (int64_t i = 0; i < mv; i += 32) {
    sums32(r + i, a + i, c, mx, s, x, y);
    for (int k = 0; k < 4; ++k) {
      __m256 v = s[k];
      if (MODE == cpd::DOWN) {  // x + (-x) rounding down is -0 (add_bits' zero_sum_sign)
        const __m256 zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_castps_si256(v), _mm256_setzero_si256()));
        const __m256 neg = _mm256_and_ps(_mm256_or_ps(x[k], y[k]), _mm256_castsi256_ps(_mm256_set1_epi32((int)cpd::SIGN)));
        v = _mm256_or_ps(v, _mm256_and_ps(zero, neg));
      }
      _mm256_storeu_ps(buf + i + 8 * k, v);
    }
  }
  for (int64_t i = 0; i < mv; ++i) out[i] = (uint8_t)cpd::cast_code_fast(cpd::bits_of(buf[i]), g, MODE);
  return (u32)past_limit(mx, c);
}

// The wire decode's first step (cuda/cpu/hop.cpp, wire_decode) for the same formats: the float32
// values of m codes (8 bits each) at `in`, vals[i] = decode_bits(in[i]) through the binary16 view
// times 2^(15 - bias) (exact, cpd::half_view_applies), 16 per step, the last m % 16 through the
// caller's table `dec`. Returns false, having written nothing useful, when a code's magnitude is
// at or past half_view_limit (the caller then takes the table for the block).
inline bool decode_block(const uint8_t* __restrict in, int64_t m, float* __restrict vals, const Consts& c,
                         const float* __restrict dec) {
  __m256i mx = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    mx = _mm256_max_epu8(mx, _mm256_castsi128_si256(_mm_and_si128(b, _mm256_castsi256_si128(c.mag7))));
    const __m256i v = views16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8), c);
    _mm256_storeu_ps(vals + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(v)), c.scale));
    _mm256_storeu_ps(vals + i + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(v, 1)), c.scale));
  }
  for (; i < m; ++i) vals[i] = dec[in[i]];
  return !past_limit(mx, c);
}

// The bucket encode's hot case (cuda/cpu/hop.cpp, wire_encode), round to nearest: out[i] = the
// code of x[i] * p (p a float32 power of two, or 1 with scale false: the same single rounding of
// the exact product as the scalar loop's) for m values, 32 per step as in hop_nearest, the last
// m % 32 by cast_code_fast. Returns false when a scaled value is inf or NaN (out is then partly
// written; the caller encodes the run again through the exact loop).
inline bool encode_nearest(const float* __restrict x, int64_t m, float p, bool scale, uint8_t* __restrict out,
                           const Consts& c, const cpd::Format g) {
  const __m256 vp = _mm256_set1_ps(p);
  const __m256i max_finite = _mm256_set1_epi32(0x7f7fffff);
  __m256i bad = _mm256_setzero_si256();  // lanes that met an inf/NaN (as wide_sums)
  int64_t i = 0;
  for (; i + 32 <= m; i += 32) {
    __m256 s[4];
    for (int k = 0; k < 4; ++k) {
      s[k] = _mm256_loadu_ps(x + i + 8 * k);
      if (scale) s[k] = _mm256_mul_ps(s[k], vp);
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(s[k]), c.abs_mask),
                                                    max_finite));
    }
    store_codes32(s, out + i, c);
  }
  u32 special = (u32)!_mm256_testz_si256(bad, bad);
  for (; i < m; ++i) {
    const u32 u = cpd::bits_of(scale ? x[i] * p : x[i]);
    special |= (u32)((u & ~cpd::SIGN) >= cpd::INF_BITS);
    out[i] = (uint8_t)cpd::cast_code_fast(u, g, cpd::NEAREST);
  }
  return !special;
}

// ---- the wide hop (16-bit codes, cuda/cpu/hop.cpp wide_hop): the float32 sums of m pairs of int16
// codes at r, a (byte pointers, any alignment) into sum (32-byte aligned), 8 per step, the tail one
// by one; returns nonzero when a sum is inf or NaN (an inf/NaN operand, or an overflow past
// float32's range: the caller redoes the block with add_bits). The codes' values, exactly:
//   WIDE_BF16 (exp 8, man 7, bias 127, IEEE): code << 16 is the value's float32 bits;
//   WIDE_F16 (exp 5, man 10, bias 15, IEEE): binary16 itself, converted by vcvtph2ps (F16C).
enum { WIDE_BF16 = 1, WIDE_F16 = 2 };

template <int VIEW>
inline float wide_value(uint16_t c) {
  return VIEW == WIDE_BF16 ? cpd::float_of((u32)c << 16) : _cvtsh_ss(c);
}

template <int VIEW>
inline __m256 wide_values8(const uint8_t* p) {
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return VIEW == WIDE_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(c), 16))
                           : _mm256_cvtph_ps(c);
}

template <int VIEW>
inline u32 wide_sums(const uint8_t* __restrict r, const uint8_t* __restrict a, int64_t m, u32* __restrict sum) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), max_finite = _mm256_set1_epi32(0x7f7fffff);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256i s = _mm256_castps_si256(_mm256_add_ps(wide_values8<VIEW>(r + 2 * i), wide_values8<VIEW>(a + 2 * i)));
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_and_si256(s, abs_mask), max_finite));
    _mm256_store_si256(reinterpret_cast<__m256i*>(sum + i), s);
  }
  u32 special = (u32)!_mm256_testz_si256(bad, bad);
  for (; i < m; ++i) {
    uint16_t cr, ca;
    std::memcpy(&cr, r + 2 * i, 2);
    std::memcpy(&ca, a + 2 * i, 2);
    sum[i] = cpd::bits_of(cpd::fadd(wide_value<VIEW>(cr), wide_value<VIEW>(ca)));
    special |= (u32)((sum[i] & ~cpd::SIGN) >= cpd::INF_BITS);
  }
  return special;
}

// The float32 values of m int16 codes at p (byte pointer) into v, 8 per step (the directed wide
// hop: cpd::sum_f32_directed then needs both operands).
template <int VIEW>
inline void wide_decode(const uint8_t* __restrict p, int64_t m, float* __restrict v) {
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) _mm256_storeu_ps(v + i, wide_values8<VIEW>(p + 2 * i));
  for (; i < m; ++i) {
    uint16_t c;
    std::memcpy(&c, p + 2 * i, 2);
    v[i] = wide_value<VIEW>(c);
  }
}

#endif  // CPD_HOP_AVX2

}  // namespace cpd_hop_avx2

#endif  // CPD_CPU_HOP_AVX2_H
