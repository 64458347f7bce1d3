// cpd_mx_avx2: the AVX2 path of cuda/cpu/mx.cpp's hot case -- round to nearest, full blocks of
// 16 or 32 along contiguous rows, an element format of cast_code_applies (signed IEEE/FN/finite
// with subnormals: every MX and NVFP4 float element), no MXINT8 -- written with intrinsics:
//
//   per block: amax by an integer max of the 32 magnitudes' bits (4 vectors, then across
//     lanes); the scale's exponent e straight from amax's exponent field under the floor rule
//     (a normal amax: floor(log2 amax) = field - 127), else block_scale_bits; S, 2^-e, the
//     divisor and the scale code are read from per-call tables indexed by e (the power-of-two
//     rules), or computed for 8 blocks at a time in vectors (the amax rule of NVFP4:
//     amax_scales8, the core's division, cast and encode of the scale on 8 lanes);
//   per 8 elements: cpd::cast_bits_fast's nearest-even steps (region N: add half - 1 + even bit,
//     mask; region S: (a + C) - C; select on a < 2^emin; saturate to max_bits) on q = x * 2^-e
//     (or x / d); the cast multiplies back (fl(P * d)), the encode computes the code as
//     cpd::cast_code_fast does (region N: rounded bits >> d0 - code_adj; region S:
//     bits(a + C) - bits(C); clamped to the largest finite code; the sign code on top) and packs
//     it (4-bit: two per byte, low nibble first; 8-bit: a byte each) with shuffles;
//   a block with a product fl(x * 2^-e) below float32's normals (see cpd::pow2_inexact; checked
//     on the block's smallest nonzero magnitude, taken with its amax) is redone with the core's
//     exact cpd::block_elem_pow2 before anything of it is stored; a NaN/inf block stores NaN
//     values / +0 codes.
// Every step is the scalar core's expression on 8 lanes, so the bits are those of the scalar
// path (tests/test_mx_kernels.py compares both, element codes exhaustively).
// The cast's float32 result is stored with streaming stores when it is large and 32-byte
// aligned (stream_store.h).
#ifndef CPD_CPU_MX_AVX2_H
#define CPD_CPU_MX_AVX2_H

#include <cstdint>
#include <cstring>

#include "cpd/numerics.h"
#include "parallel.h"
#include "stream_store.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace cpd_mx_avx2 {

using cpd::u32;

// What one call does: x (total_blocks * BS contiguous float32), y (the cast) or codes + scodes.
struct Span {
  const float* x;
  float* y;
  uint8_t* codes;
  uint8_t* scodes;
  int64_t total_blocks;
  int pack;  // 0 (one code per byte), 4 (two per byte) or 6 (four per three bytes)
  uint8_t zero_code;
  cpd::BlockSpec b;
};

// Whether this path takes a launch (the caller has checked the mode is nearest and the block
// is a compile-time 16 or 32 with rows of whole blocks).
inline bool applies(const cpd::BlockSpec& b) {
#if defined(__AVX2__)
  return cpd::cast_code_applies(b.el) && b.el.outward_bits == b.el.max_bits && b.is_int == 0u;
#else
  (void)b;
  return false;
#endif
}

#if defined(__AVX2__)

// Per-call constants of the element format, broadcast.
struct Consts {
  __m256i abs_mask, half_m1, parity_add, lsb_bit, not_qmask, min_normal, max_bits, code_adj, max_code, subc_bits;
  __m256 subc;
  __m128i d0, sign_shift;
  explicit Consts(const cpd::Format& f) {
    const int d0i = 23 - f.man;
    abs_mask = _mm256_set1_epi32(0x7fffffff);
    half_m1 = _mm256_set1_epi32((int)f.half_m1);
    parity_add = _mm256_set1_epi32((int)f.parity_add);
    lsb_bit = _mm256_set1_epi32((int)f.lsb_bit);
    not_qmask = _mm256_set1_epi32((int)~f.qmask);
    min_normal = _mm256_set1_epi32((int)f.min_normal_bits);
    max_bits = _mm256_set1_epi32((int)f.max_bits);
    code_adj = _mm256_set1_epi32((int)f.code_adj);
    max_code = _mm256_set1_epi32((int)((f.max_bits >> d0i) - f.code_adj));
    subc_bits = _mm256_set1_epi32((int)cpd::bits_of(f.sub_c));
    subc = _mm256_set1_ps(f.sub_c);
    d0 = _mm_cvtsi32_si128(d0i);
    sign_shift = _mm_cvtsi32_si128(31 - (f.exp + f.man));  // the sign bit -> sign_code
  }
};

// The scaled values q of 8 elements (bits) rounded to nearest even and saturated, as
// cast_bits_fast(q, el, NEAREST) for finite q: sign | min(mag, max).
inline __m256i round_nearest(__m256i q, const Consts& c, __m256i& sign, __m256i& a, __m256i& is_sub,
                             __m256i& n_mag) {
  a = _mm256_and_si256(q, c.abs_mask);
  sign = _mm256_xor_si256(q, a);
  const __m256i even = _mm256_and_si256(_mm256_add_epi32(_mm256_srl_epi32(a, c.d0), c.parity_add), c.lsb_bit);
  n_mag = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(a, c.half_m1), even), c.not_qmask);
  is_sub = _mm256_cmpgt_epi32(c.min_normal, a);  // a <= 0x7fffffff: the signed compare is the unsigned one
  return n_mag;
}

inline __m256 cast8(__m256i q, const Consts& c) {
  __m256i sign, a, is_sub, n_mag;
  round_nearest(q, c, sign, a, is_sub, n_mag);
  const __m256 af = _mm256_castsi256_ps(a);
  const __m256i s_mag = _mm256_castps_si256(_mm256_sub_ps(_mm256_add_ps(af, c.subc), c.subc));
  __m256i mag = _mm256_blendv_epi8(n_mag, s_mag, is_sub);
  mag = _mm256_min_epu32(mag, c.max_bits);
  return _mm256_castsi256_ps(_mm256_or_si256(mag, sign));
}

// The codes (u32 lanes) of 8 scaled values q: cast_code_fast(q, el, NEAREST), saturating.
inline __m256i code8(__m256i q, const Consts& c) {
  __m256i sign, a, is_sub, n_mag;
  round_nearest(q, c, sign, a, is_sub, n_mag);
  const __m256i n_code = _mm256_sub_epi32(_mm256_srl_epi32(n_mag, c.d0), c.code_adj);
  const __m256i s_code =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), c.subc)), c.subc_bits);
  __m256i code = _mm256_min_epu32(_mm256_blendv_epi8(n_code, s_code, is_sub), c.max_code);
  return _mm256_or_si256(code, _mm256_srl_epi32(sign, c.sign_shift));
}

// The per-block scale quantities.
struct Scale {
  u32 s;      // S (float32 bits; QNAN_BITS for a NaN/inf block)
  float inv;  // 2^-e (power-of-two rules) or d (amax rule)
  float d;    // fl(S * T)
  uint8_t code;
};

// Tables over the exponents e in [s_emin, s_emax] of the power-of-two rules (at most 255).
struct Pow2Tables {
  int emin, emax;
  float inv[256], d[256];
  u32 s[256];
  uint8_t code[256];
  explicit Pow2Tables(const cpd::BlockSpec& b) : emin(b.s_emin), emax(b.s_emax) {
    for (int e = emin; e <= emax && e - emin < 256; ++e) {
      const u32 sb = cpd::compose(1, e);
      s[e - emin] = sb;
      inv[e - emin] = cpd::block_inverse(sb);
      d[e - emin] = cpd::block_divisor(sb, b);
      code[e - emin] = (uint8_t)cpd::encode_value_bits(sb, b.sc);
    }
  }
};

template <bool POW2>
inline Scale scale_of(u32 amax, const cpd::BlockSpec& b, const Pow2Tables& tab) {
  Scale r;
  if (POW2 && b.rule == cpd::RULE_FLOOR && amax >= 0x00800000u && amax < cpd::INF_BITS) {
    int e = (int)(amax >> 23) - 127 - b.emax_elem;  // floor(log2 amax) - emax_elem
    e = e < tab.emin ? tab.emin : e > tab.emax ? tab.emax : e;
    const int k = e - tab.emin;
    r.s = tab.s[k], r.inv = tab.inv[k], r.d = tab.d[k], r.code = tab.code[k];
    return r;
  }
  r.s = cpd::block_scale_bits(amax, b);
  if (r.s > cpd::INF_BITS) {
    r.inv = r.d = 1.0f;
    r.code = (uint8_t)cpd::encode_value_bits(r.s, b.sc);
    return r;
  }
  if (POW2) {
    const int k = cpd::floor_log2_bits(r.s) - tab.emin;
    r.inv = tab.inv[k], r.d = tab.d[k], r.code = tab.code[k];
  } else {
    r.d = cpd::block_divisor(r.s, b);
    r.inv = r.d;
    r.code = (uint8_t)(b.sc.fast ? cpd::encode_value_bits_fast(r.s, b.sc) : cpd::encode_value_bits(r.s, b.sc));
  }
  return r;
}

// The amax rule (NVFP4) for 8 blocks at once: block_scale_bits' S = max(cast(fl(fl(amax /
// max_elem) / T)), smallest), d = fl(S * T) and S's code, the core's scalar expressions on 8
// lanes (IEEE division and multiplication are correctly rounded in vectors too; cast8 / code8
// are cast_bits_fast / cast_code_fast to nearest, saturating). Blocks with an inf/NaN amax, or
// whose fl(amax / max_elem / T) overflows, take the scalar scale_of. Applies where the scale
// format is one cast8 serves (amax_scales_apply).
inline bool amax_scales_apply(const cpd::BlockSpec& b) {
  return b.rule == cpd::RULE_AMAX && cpd::cast_code_applies(b.sc) && b.sc.outward_bits == b.sc.max_bits;
}

struct AmaxScales {
  Consts c;  // of the scale format
  __m256 max_elem, t;
  __m256i smallest, inf_m1;
  explicit AmaxScales(const cpd::BlockSpec& b)
      : c(b.sc), max_elem(_mm256_set1_ps(b.max_elem)), t(_mm256_set1_ps(b.t)),
        smallest(_mm256_set1_epi32((int)b.smallest_bits)), inf_m1(_mm256_set1_epi32((int)cpd::INF_BITS - 1)) {}
};

// out[i] = scale_of<false>(am[i]) for i < 8.
inline void amax_scales8(const u32 am[8], const AmaxScales& v, const cpd::BlockSpec& b, const Pow2Tables& tab,
                         Scale out[8]) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(am));
  const __m256 q = _mm256_div_ps(_mm256_div_ps(_mm256_castsi256_ps(a), v.max_elem), v.t);
  const __m256i qb = _mm256_castps_si256(q);
  const __m256i s = _mm256_max_epu32(_mm256_castps_si256(cast8(qb, v.c)), v.smallest);
  const __m256 d = _mm256_mul_ps(_mm256_castsi256_ps(s), v.t);
  const __m256i code = code8(s, v.c);
  // scalar: an inf/NaN amax (a > inf - 1) or an overflowing quotient (q's bits > inf - 1)
  const int odd = _mm256_movemask_ps(_mm256_castsi256_ps(
      _mm256_or_si256(_mm256_cmpgt_epi32(a, v.inf_m1), _mm256_cmpgt_epi32(_mm256_and_si256(qb, v.c.abs_mask), v.inf_m1))));
  alignas(32) u32 sv[8], cv[8];
  alignas(32) float dv[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sv), s);
  _mm256_store_si256(reinterpret_cast<__m256i*>(cv), code);
  _mm256_store_ps(dv, d);
  for (int i = 0; i < 8; ++i) {
    if (odd >> i & 1) {
      out[i] = scale_of<false>(am[i], b, tab);
    } else {
      out[i].s = sv[i], out[i].inv = dv[i], out[i].d = dv[i], out[i].code = (uint8_t)cv[i];
    }
  }
}

// max of the magnitudes' bits of one block (BS / 8 vectors at xb), and the smallest nonzero
// magnitude's bits (0 when every element is zero) as min(|x| - 1) + 1 in u32 arithmetic.
template <int BS>
inline u32 block_amax(const float* xb, const __m256i abs_mask, u32& min_nz) {
  const __m256i one = _mm256_set1_epi32(1);
  __m256i m = _mm256_setzero_si256(), lo = _mm256_set1_epi32(-1);
  for (int v = 0; v < BS / 8; ++v) {
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 8 * v)), abs_mask);
    m = _mm256_max_epu32(m, a);
    lo = _mm256_min_epu32(lo, _mm256_sub_epi32(a, one));
  }
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  __m128i l = _mm_min_epu32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
  l = _mm_min_epu32(l, _mm_shuffle_epi32(l, 0x4e));
  l = _mm_min_epu32(l, _mm_shuffle_epi32(l, 0xb1));
  min_nz = (u32)_mm_cvtsi128_si32(l) + 1u;
  return (u32)_mm_cvtsi128_si32(h);
}

// q = x * inv (power-of-two rules) or x / d (amax rule).
template <bool POW2>
inline __m256i scaled8(const float* p, __m256 vinv) {
  const __m256 x = _mm256_loadu_ps(p);
  return _mm256_castps_si256(POW2 ? _mm256_mul_ps(x, vinv) : _mm256_div_ps(x, vinv));
}

// 32 (or 16) u32 codes < 256 -> bytes in order, in the low 32 (16) bytes.
inline __m256i bytes_of(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Bytes b (codes < 16) -> nibbles: byte k of the low half = b[2k] | b[2k+1] << 4.
inline __m128i nibbles_of(__m256i b) {
  __m256i t = _mm256_and_si256(_mm256_or_si256(b, _mm256_srli_epi16(b, 4)), _mm256_set1_epi16(0x00ff));
  t = _mm256_packus_epi16(t, t);                                    // per lane: its 8 bytes, twice
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(t, 0x08));  // qwords 0 and 2
}

template <bool POW2, bool ENC, int BS, bool STREAM>
void run_range(const Span& S, int64_t lo, int64_t hi) {
  static_assert(BS == 16 || BS == 32, "the AVX2 path takes blocks of 16 or 32");
  constexpr int NV = BS / 8;
  const cpd::BlockSpec B = S.b;
  const Consts c(B.el);
  const Pow2Tables tab(B);
  float fb[BS];
  uint8_t cb[BS];
  // the amax rule: the scales of 8 blocks at a time (amax_scales8), computed before the first
  const bool vec_scales = !POW2 && amax_scales_apply(B);
  const AmaxScales vs(B);
  Scale next[8];
  for (int64_t k = lo; k < hi; ++k) {
    const float* xb = S.x + k * BS;
    u32 min_nz = 0;
    Scale sc;
    if (vec_scales) {
      const int64_t j = (k - lo) % 8;
      if (j == 0) {
        alignas(32) u32 am[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = 0; i < 8 && k + i < hi; ++i) am[i] = block_amax<BS>(xb + i * BS, c.abs_mask, min_nz);
        amax_scales8(am, vs, B, tab, next);
      }
      sc = next[j];
    } else {
      sc = scale_of<POW2>(block_amax<BS>(xb, c.abs_mask, min_nz), B, tab);
    }
    const bool nan = sc.s > cpd::INF_BITS;
    // fl(|x| * 2^-e) grows with |x|: some element's product is below float32's normals
    // (pow2_inexact) exactly when the smallest nonzero one's is.
    const bool redo = nan || (POW2 && cpd::pow2_inexact(min_nz, sc.inv));
    const __m256 vinv = _mm256_set1_ps(sc.inv);
    __m256i q[NV];
    for (int v = 0; v < NV; ++v) q[v] = scaled8<POW2>(xb + 8 * v, vinv);
    if constexpr (!ENC) {
      float* yb = S.y + k * BS;
      if (!redo) {
        const __m256 vd = _mm256_set1_ps(sc.d);
        for (int v = 0; v < NV; ++v) cpd_cpu::store8<STREAM>(yb + 8 * v, _mm256_mul_ps(cast8(q[v], c), vd));
        continue;
      }
      for (int i = 0; i < BS; ++i)  // rare: the core's scalar steps
        fb[i] = nan ? cpd::float_of(cpd::QNAN_BITS)
                    : cpd::fmul(cpd::float_of(cpd::block_elem_pow2(cpd::bits_of(xb[i]), sc.inv, B, cpd::NEAREST, 0u,
                                                                   32)), sc.d);
      for (int v = 0; v < NV; ++v) cpd_cpu::store8<STREAM>(yb + 8 * v, _mm256_loadu_ps(fb + 8 * v));
    } else {
      S.scodes[k] = sc.code;
      __m256i bytes;
      if (!redo) {
        __m256i cd[4];
        for (int v = 0; v < NV; ++v) cd[v] = code8(q[v], c);
        bytes = NV == 4 ? bytes_of(cd[0], cd[1], cd[2], cd[3]) : bytes_of(cd[0], cd[1], cd[0], cd[1]);
      } else {
        for (int i = 0; i < BS; ++i)
          cb[i] = nan ? S.zero_code
                      : (uint8_t)cpd::block_elem_code<true>(
                            cpd::block_elem_pow2(cpd::bits_of(xb[i]), sc.inv, B, cpd::NEAREST, 0u, 32), B);
        bytes = BS == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb))
                         : _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cb)));
      }
      if (S.pack == 4) {
        uint8_t* dst = S.codes + k * (BS / 2);
        const __m128i nib = nibbles_of(bytes);
        if (BS == 32) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), nib);
        else _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), nib);
      } else if (S.pack == 0) {
        uint8_t* dst = S.codes + k * BS;
        if (BS == 32) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), bytes);
        else _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(bytes));
      } else {  // 6-bit: four codes per three bytes, low bits first
        alignas(32) uint8_t cc[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(cc), bytes);
        uint8_t* dst = S.codes + k * (BS / 4 * 3);
        for (int g = 0; g < BS / 4; ++g) {
          const u32 w = cc[4 * g] | (cc[4 * g + 1] << 6) | (cc[4 * g + 2] << 12) | ((u32)cc[4 * g + 3] << 18);
          dst[3 * g] = (uint8_t)w, dst[3 * g + 1] = (uint8_t)(w >> 8), dst[3 * g + 2] = (uint8_t)(w >> 16);
        }
      }
    }
  }
  if (STREAM) cpd_cpu::stream_fence();
}

template <bool POW2, bool ENC, int BS>
void run(const Span& S) {
  const bool stream = !ENC && cpd_cpu::stream_ok(S.y, S.total_blocks * BS * (int64_t)sizeof(float));
  cpd_cpu::parallel_for(0, S.total_blocks, std::max<int64_t>(64, 32768 / BS), [&](int64_t lo, int64_t hi) {
    if (stream) run_range<POW2, ENC, BS, true>(S, lo, hi);
    else run_range<POW2, ENC, BS, false>(S, lo, hi);
  });
}

#endif  // __AVX2__

}  // namespace cpd_mx_avx2

#endif  // CPD_CPU_MX_AVX2_H
