// The CPU matmul's stochastic lanes (included by matmul.cpp): a tile of up to kLanes outputs of one
// row (lane i is output o0 + i), every step drawing the words of all the tile's lanes at once
// (philox_strided: words 0-3 of lane i's step k are Philox block 2 * ((o0 + i) * K + k), words 4-7
// the next block; numerics.h, "Accumulation"), then rounding lane by lane in k order:
//   * sr_tile: float64 lanes, any formats of man <= 19 (round_d_sr / add_d_sr / kahan_d_sr);
//   * sr32_tile: float32 lanes, formats with cpd::sr_lane_applies (at most 11 significant bits):
//     each rounding is hi = fl32 of the exact operation (a float32 add, multiply or FMA) and
//     cpd::sr_lane(hi), the stochastic cast of hi, and the lanes it flags (about 2^(man - 20) of
//     them, and every one at or above the format's max, inf and NaN) are redone by the exact
//     function of the generic step (add_bits, mul_bits, fma_bits) on the same operands and word;
//     accumulate.h gives the proof that the rest are the exact rounding already.
// Either way an output's bits depend only on its operands and (seed, offset, o, K): never on the
// tile or thread split.
#ifndef CPD_CPU_MATMUL_SR_H
#define CPD_CPU_MATMUL_SR_H

#include <cstdint>
#include <utility>

#include "cpd/numerics.h"
#include "matmul_f32.h"  // kLanes
#include "philox_simd.h"

namespace cpd_cpu {

struct SrTile {
  int64_t K, L, jt;    // steps, block length (0: none), live lanes
  uint64_t o0;         // the flat index of lane 0's output
  uint64_t offset;
  const PhiloxKey& key;  // philox_key of the seed (k0 its low word, k1 its high), made once per matmul
};

// The words a tile's steps use (bit j: word j; numerics.h, "Accumulation"): of the step's block,
// the product's rounding (0, MUL), the add (1) and Kahan's last three (2, 3; with blocks Kahan
// rounds only at a run's end); of the next block, the run end's add (0), or Kahan's last rounding
// of the step (0) and, with blocks, the run end's Kahan step (0-3).
template <bool MUL, bool KAHAN, bool BLOCK>
constexpr unsigned kSrLowWords = (MUL ? 1u : 0u) | 2u | (KAHAN && !BLOCK ? 0xCu : 0u);
template <bool KAHAN, bool BLOCK>
constexpr unsigned kSrHighWords = KAHAN && BLOCK ? 0xFu : 1u;

// The step's words: w[j][i] = word j of lane i's block 2 * ((o0 + i) * K + k), and w2 those of the
// next block when `high`; only the words the tile uses (kSrLowWords, kSrHighWords: a step that uses
// word 1 alone takes about 18% fewer vector instructions for its Philox rounds, philox_simd.h).
template <bool MUL, bool KAHAN, bool BLOCK>
inline void sr_words(const SrTile& d, int64_t k, bool high, uint32_t* w, uint32_t* w2) {
  const uint32_t c2 = (uint32_t)d.offset, c3 = (uint32_t)(d.offset >> 32);
  const uint64_t K = (uint64_t)d.K, blk = (d.o0 * K + (uint64_t)k) * 2u;
  philox_strided<kSrLowWords<MUL, KAHAN, BLOCK>>(blk, 2u * K, d.jt, c2, c3, d.key, w, kLanes);
  if (high) philox_strided<kSrHighWords<KAHAN, BLOCK>>(blk + 1u, 2u * K, d.jt, c2, c3, d.key, w2, kLanes);
}

// Float64 lanes: outputs out[0 .. jt) of a row (arow: its K values of a; b: row k of b at b + k * ldb).
template <bool MUL, bool KAHAN, bool BLOCK>
void sr_tile(const float* __restrict arow, const float* __restrict b, int64_t ldb, float* __restrict out,
             const SrTile& d, const cpd::FormatD& mg, const cpd::FormatD& ag) {
  double s[kLanes], c[kLanes], bs[kLanes];
  alignas(64) uint32_t w[4][kLanes], w2[4][kLanes];  // words j of the step's blocks, one run per j
  for (int64_t jj = 0; jj < kLanes; ++jj) s[jj] = c[jj] = bs[jj] = 0.0;
  const int64_t jt = d.jt;
  for (int64_t k = 0; k < d.K; ++k) {
    const double av = (double)arow[k];
    const float* __restrict br = b + k * ldb;
    const bool run_end = BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K);
    sr_words<MUL, KAHAN, BLOCK>(d, k, (KAHAN && !BLOCK) || run_end, &w[0][0], &w2[0][0]);
    for (int64_t jj = 0; jj < jt; ++jj) {
      double p = av * (double)br[jj];
      if (MUL) p = cpd::round_d_sr(p, mg, w[0][jj]);
      if (BLOCK) {
        bs[jj] = cpd::add_d_sr(bs[jj], p, ag, w[1][jj]);
      } else if (KAHAN) {
        const uint32_t wk[4] = {w[1][jj], w[2][jj], w[3][jj], w2[0][jj]};
        cpd::kahan_d_sr(s[jj], c[jj], p, ag, wk);
      } else {
        s[jj] = cpd::add_d_sr(s[jj], p, ag, w[1][jj]);
      }
    }
    if (run_end) {
      for (int64_t jj = 0; jj < jt; ++jj) {
        if (KAHAN) {
          const uint32_t wk[4] = {w2[0][jj], w2[1][jj], w2[2][jj], w2[3][jj]};
          cpd::kahan_d_sr(s[jj], c[jj], bs[jj], ag, wk);
        } else {
          s[jj] = cpd::add_d_sr(s[jj], bs[jj], ag, w2[0][jj]);
        }
        bs[jj] = 0.0;
      }
    }
  }
  for (int64_t jj = 0; jj < jt; ++jj) out[jj] = (float)s[jj];
}

// ------------------------------------------------------------------------------------------
// Float32 lanes. Each rounding of a step is a pass over the tile's lanes: hi = fl32(the exact
// operation) into out, then out = cpd::sr_lane(hi) (region S's float work only when some lane is
// below 2^emin), then the flagged lanes redone by the exact function on the same operands; out is
// never an operand (the redo reads them). The format's conventions are the constants
// sr_lane_applies implies (signed, a zero of each sign: plain_format.h), so that their selects
// drop out of the loops.
inline cpd::Format sr_lane_format(const cpd::Format& f) {
  cpd::Format h = f;
  h.is_signed = 1u;
  h.uz = 0u;
  h.no_zero = 0u;
  return h;
}

// out[i] = sr_lane(out[i]) (out holds hi); returns whether any lane is flagged, flags in redo.
template <int SUB>
inline uint32_t sr32_round_v(float* __restrict out, uint32_t* __restrict redo, const uint32_t* __restrict wd,
                             int64_t jt, const cpd::Format f, int srb) {
  uint32_t any = 0u;
  for (int64_t i = 0; i < jt; ++i) {
    uint32_t r;
    out[i] = cpd::float_of(cpd::sr_lane<SUB>(cpd::bits_of(out[i]), f, wd[i], srb, r));
    redo[i] = r;
    any |= r;
  }
  return any;
}

// small: whether some lane of out is below 2^emin (region S)
inline uint32_t sr32_round(float* __restrict out, uint32_t* __restrict redo, const uint32_t* __restrict wd,
                           int64_t jt, const cpd::Format& f, int srb, uint32_t small) {
  return small ? sr32_round_v<1>(out, redo, wd, jt, f, srb) : sr32_round_v<0>(out, redo, wd, jt, f, srb);
}

inline uint32_t below_emin(float h, const cpd::Format& f) {
  return (uint32_t)((cpd::bits_of(h) & ~cpd::SIGN) < f.min_normal_bits);
}

// out[i] = add_bits(x[i], NEG ? -y[i] : y[i]) with word wd[i]
template <bool NEG>
inline void sr32_add(float* __restrict out, const float* __restrict x, const float* __restrict y,
                     const uint32_t* __restrict wd, int64_t jt, const cpd::Format& f, int srb) {
  alignas(64) uint32_t redo[kLanes];
  uint32_t small = 0u;
  for (int64_t i = 0; i < jt; ++i) {
    out[i] = cpd::fadd(x[i], NEG ? -y[i] : y[i]);
    small |= below_emin(out[i], f);
  }
  if (sr32_round(out, redo, wd, jt, f, srb, small))
    for (int64_t i = 0; i < jt; ++i)
      if (redo[i])
        out[i] = cpd::float_of(cpd::add_bits(cpd::bits_of(x[i]), cpd::bits_of(NEG ? -y[i] : y[i]), f,
                                             cpd::STOCHASTIC, wd[i], srb));
}

// p[i] = mul_bits(a, b[i]) (mf) with word wd[i]
inline void sr32_mul(float* __restrict p, float av, const float* __restrict br, const uint32_t* __restrict wd,
                     int64_t jt, const cpd::Format& f, int srb) {
  alignas(64) uint32_t redo[kLanes];
  uint32_t small = 0u;
  for (int64_t i = 0; i < jt; ++i) {
    p[i] = cpd::fmul(av, br[i]);
    small |= below_emin(p[i], f);
  }
  if (sr32_round(p, redo, wd, jt, f, srb, small))
    for (int64_t i = 0; i < jt; ++i)
      if (redo[i])
        p[i] = cpd::float_of(cpd::mul_bits(cpd::bits_of(av), cpd::bits_of(br[i]), f, cpd::STOCHASTIC, wd[i], srb));
}

// out[i] = fma_bits(NEG ? -x[i] : x[i], a, b[i]) (the exact x + a * b rounded once) with word wd[i]
template <bool NEG>
inline void sr32_fma(float* __restrict out, const float* __restrict x, float av, const float* __restrict br,
                     const uint32_t* __restrict wd, int64_t jt, const cpd::Format& f, int srb) {
  alignas(64) uint32_t redo[kLanes];
  uint32_t small = 0u;
  for (int64_t i = 0; i < jt; ++i) {
    out[i] = cpd::ffma(av, br[i], NEG ? -x[i] : x[i]);
    small |= below_emin(out[i], f);
  }
  if (sr32_round(out, redo, wd, jt, f, srb, small))
    for (int64_t i = 0; i < jt; ++i)
      if (redo[i])
        out[i] = cpd::float_of(cpd::fma_bits(cpd::bits_of(NEG ? -x[i] : x[i]), cpd::bits_of(av), cpd::bits_of(br[i]),
                                             f, cpd::STOCHASTIC, wd[i], srb));
}

// Kahan's last three roundings, y formed (numerics.h kahan_add): t = s + y, c = (t - s) - y, s = t,
// with words wt, wts, wc. u: scratch lanes.
inline void sr32_kahan_finish(float*& s, float* c, const float* y, float*& t, float* u, const uint32_t* wt,
                              const uint32_t* wts, const uint32_t* wc, int64_t jt, const cpd::Format& f, int srb) {
  sr32_add<false>(t, s, y, wt, jt, f, srb);
  sr32_add<true>(u, t, s, wts, jt, f, srb);
  sr32_add<true>(c, u, y, wc, jt, f, srb);
  std::swap(s, t);
}

// One tile on float32 lanes (as sr_tile; mf, af: the formats, both with cpd::sr_lane_applies;
// MUL false: the exact product, each step's add fused). The caller runs it on a thread that keeps
// float32 subnormals (fp_env.h).
template <bool MUL, bool KAHAN, bool BLOCK>
void sr32_tile(const float* __restrict arow, const float* __restrict b, int64_t ldb, float* __restrict out,
               const SrTile& d, const cpd::Format& mf0, const cpd::Format& af0, int srb) {
  const cpd::Format mf = sr_lane_format(mf0), af = sr_lane_format(af0);
  alignas(64) float a0[kLanes], a1[kLanes], c[kLanes], a2[kLanes], p[kLanes], a3[kLanes], u[kLanes];
  alignas(64) uint32_t w[4][kLanes], w2[4][kLanes];
  for (int64_t i = 0; i < kLanes; ++i) a0[i] = a1[i] = c[i] = a2[i] = p[i] = a3[i] = u[i] = 0.0f;
  float* s = a0;   // the running sums
  float* t = a1;   // spare lanes: the next s
  float* bs = a2;  // the block sums
  float* y = a3;   // the term: Kahan's y, or the next block sums
  const int64_t jt = d.jt;
  for (int64_t k = 0; k < d.K; ++k) {
    const float av = arow[k];
    const float* __restrict br = b + k * ldb;
    const bool run_end = BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K);
    sr_words<MUL, KAHAN, BLOCK>(d, k, (KAHAN && !BLOCK) || run_end, &w[0][0], &w2[0][0]);
    // the term: round_acc(x + round_mul(a b)) or round_acc(x + a b), x = bs, -c or s
    float* q = BLOCK || KAHAN ? y : t;
    const float* x = BLOCK ? bs : KAHAN ? c : s;
    if (MUL) {
      sr32_mul(p, av, br, w[0], jt, mf, srb);
      if (KAHAN && !BLOCK) {  // y = add_bits(-c, p): the operands in the generic step's order
        for (int64_t i = 0; i < jt; ++i) u[i] = -c[i];
        sr32_add<false>(q, u, p, w[1], jt, af, srb);
      } else {
        sr32_add<false>(q, x, p, w[1], jt, af, srb);
      }
    } else if (KAHAN && !BLOCK) {
      sr32_fma<true>(q, x, av, br, w[1], jt, af, srb);
    } else {
      sr32_fma<false>(q, x, av, br, w[1], jt, af, srb);
    }
    if (BLOCK) std::swap(bs, y);
    else if (KAHAN) sr32_kahan_finish(s, c, q, t, u, w[2], w[3], w2[0], jt, af, srb);
    else std::swap(s, t);
    if (run_end) {
      if (KAHAN) {
        sr32_add<true>(y, bs, c, w2[0], jt, af, srb);  // y = bs - c
        sr32_kahan_finish(s, c, y, t, u, w2[1], w2[2], w2[3], jt, af, srb);
      } else {
        sr32_add<false>(t, s, bs, w2[0], jt, af, srb);
        std::swap(s, t);
      }
      for (int64_t i = 0; i < kLanes; ++i) bs[i] = 0.0f;
    }
  }
  for (int64_t i = 0; i < jt; ++i) out[i] = s[i];
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_SR_H
