// The CPU matmul's directed lanes (included by matmul.cpp): rounding toward zero, up or down, for
// formats with cpd::directed_lane_applies (every value a float32 value, the plain convention).
// Each rounding of a step is the processor's float32 operation (add, multiply, or FMA for the
// exact product) with its rounding direction set to the mode (fp_env.h DirectedRounding, held by
// the caller around the tile), then cpd::directed_lane, the fast cast in the same mode: rounding
// in one direction to float32 and then to the format is rounding to the format once
// (accumulate.h, "Directed lanes"), so nothing is redone but NaN results (their payloads: the
// caller runs the generic steps there, outside the guard). binary32 itself (an accumulator or
// product format whose values are all of float32's: kind B32) takes the float32 result as it is.
// Without an FMA instruction the fused step is (float)((double)a * b + x) (fp_env.h fma_current).
//
// A tile of up to kLanes outputs of one row keeps s, c and bs in arrays, every rounding a pass
// over the lanes that the compiler vectorizes, as matmul_f32.h's lanes do; its function is never
// inlined (dir_tile): the rounding direction holds for exactly the float operations inside.
// With finite operands the steps run in register tiles instead, nothing to redo: plain sums of
// exact products into an accumulator of matmul_fchain.h's fchain_applies (TF32, BF16) or binary16,
// the fused narrow chain with a directed policy (one FMA and cpd::directed_lane_bits, or the
// conversion, per step); products rounded to mul (bounded operands: max|a| max|b| <= mul's max)
// into binary32, those or binary16, and Kahan's or blocked sums of exact products, matmul_h16.h's
// product chain (PROD_SIGNED, PROD_MAGNITUDE, PROD_EXACT) with SumB32 or SumDir.
#ifndef CPD_CPU_MATMUL_DIRECTED_H
#define CPD_CPU_MATMUL_DIRECTED_H

#include <cstdint>
#include <utility>
#include <vector>

#include "cpd/numerics.h"
#include "fp_env.h"         // fma_current
#include "matmul_f32.h"     // kLanes, Tile, CPD_IVDEP
#include "matmul_fchain.h"  // fchain_rows, FChainTies, H16Chain
#include "matmul_h16.h"     // h16_chain_rows, H16Mul
#include "plain_format.h"   // plain_lane_format, plain_lanes

namespace cpd_cpu {

// How a pass rounds its float32 results to a format: B32 keeps them (the format is binary32),
// H16 by the processor's float32 -> binary16 conversion in its current rounding direction (the
// format is IEEE binary16 itself; F16C, FCVT: IEEE 754 rounds once, overflow to infinity in the
// directions that overflow, binary16 subnormals), PLAIN through the fast cast with the plain
// convention's fields as constants (plain_lanes), GENERAL through the fast cast on the format as
// it is (e.g. no subnormals).
enum DirKind { DIR_B32 = 0, DIR_PLAIN = 1, DIR_GENERAL = 2, DIR_H16 = 3 };

inline DirKind dir_kind(const cpd::Format& f, bool binary32, bool binary16) {
  if (binary32) return DIR_B32;
  if (CPD_CPU_F16_LANES && binary16) return DIR_H16;
  return plain_lane_format(f) ? DIR_PLAIN : DIR_GENERAL;
}

// out[i] = the rounding of op(i) (a float32 result computed in MODE's direction), i < n; out may be
// an operand of op (each lane reads its own index only).
template <int MODE, class Op>
inline void dir_pass(float* out, int64_t n, const cpd::Format& f, DirKind kind, const Op& op) {
  if (kind == DIR_B32) {
    CPD_IVDEP for (int64_t i = 0; i < n; ++i) out[i] = op(i);
#if CPD_CPU_F16_LANES
  } else if (kind == DIR_H16) {  // out has kLanes lanes; those past n are rounded too, and unused
    CPD_IVDEP for (int64_t i = 0; i < n; ++i) out[i] = op(i);
    for (int64_t i = 0; i < kLanes; i += H16Vec::kWidth) H16Vec::store(out + i, H16Vec::rnd_cur(H16Vec::load(out + i)));
#endif
  } else if (kind == DIR_PLAIN) {
    const cpd::Format h = plain_lanes(f);
    CPD_IVDEP for (int64_t i = 0; i < n; ++i) out[i] = cpd::float_of(cpd::directed_lane<MODE>(cpd::bits_of(op(i)), h));
  } else {
    const cpd::Format h = f;
    CPD_IVDEP for (int64_t i = 0; i < n; ++i) out[i] = cpd::float_of(cpd::directed_lane<MODE>(cpd::bits_of(op(i)), h));
  }
}

struct DirFormats {
  cpd::Format mf, af;  // product and accumulator formats
  DirKind mk, ak;      // how each rounds
};

// Kahan's last three roundings, y formed: t = s + y, c = (t - s) - y, s = t (u: scratch lanes).
template <int MODE>
inline void dir_kahan_finish(float*& s, float* c, const float* y, float*& t, float* u, int64_t n,
                             const DirFormats& g) {
  float* ss = s;
  float* tt = t;
  dir_pass<MODE>(tt, n, g.af, g.ak, [&](int64_t i) { return cpd::fadd(ss[i], y[i]); });
  dir_pass<MODE>(u, n, g.af, g.ak, [&](int64_t i) { return cpd::fsub(tt[i], ss[i]); });
  dir_pass<MODE>(c, n, g.af, g.ak, [&](int64_t i) { return cpd::fsub(u[i], y[i]); });
  std::swap(s, t);
}

// One tile: outputs out[0 .. jt) of a row (arow: its K values of a; b: row k of b at b + k * ldb),
// the steps of numerics.h's "Accumulation" in k order. The caller holds DirectedRounding(MODE).
template <int MODE, bool MUL, bool KAHAN, bool BLOCK>
__attribute__((noinline)) void dir_tile(const float* __restrict arow, const float* __restrict b, int64_t ldb,
                                        float* __restrict out, const Tile& d, const DirFormats& g) {
  alignas(64) float s0[kLanes], c[kLanes], bs[kLanes], p[kLanes], y[kLanes], t0[kLanes], u[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) s0[i] = c[i] = bs[i] = p[i] = y[i] = t0[i] = u[i] = 0.0f;
  float* s = s0;  // the running sums; plain and Kahan steps swap s and t
  float* t = t0;
  const int64_t jt = d.jt;
  for (int64_t k = 0; k < d.K; ++k) {
    const float av = arow[k];
    const float* __restrict br = b + k * ldb;
    if (MUL) dir_pass<MODE>(p, jt, g.mf, g.mk, [&](int64_t i) { return cpd::fmul(av, br[i]); });
    // the term: round(x + P) or round(x + a b), x = bs (block), -c (Kahan's y) or s, into
    // bs, y or the spare lanes t (which then become s)
    float* q = BLOCK ? bs : KAHAN ? y : t;
    const float* x = BLOCK ? bs : s;
    if (MUL && KAHAN && !BLOCK) {
      dir_pass<MODE>(q, jt, g.af, g.ak, [&](int64_t i) { return cpd::fsub(p[i], c[i]); });
    } else if (MUL) {
      dir_pass<MODE>(q, jt, g.af, g.ak, [&](int64_t i) { return cpd::fadd(x[i], p[i]); });
    } else if (KAHAN && !BLOCK) {
      dir_pass<MODE>(q, jt, g.af, g.ak, [&](int64_t i) { return fma_current(av, br[i], -c[i]); });
    } else {
      dir_pass<MODE>(q, jt, g.af, g.ak, [&](int64_t i) { return fma_current(av, br[i], x[i]); });
    }
    if (!BLOCK && KAHAN) dir_kahan_finish<MODE>(s, c, y, t, u, jt, g);
    else if (!BLOCK) std::swap(s, t);
    if (BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K)) {
      if (KAHAN) {
        dir_pass<MODE>(y, jt, g.af, g.ak, [&](int64_t i) { return cpd::fsub(bs[i], c[i]); });
        dir_kahan_finish<MODE>(s, c, y, t, u, jt, g);
      } else {
        const float* ss = s;
        dir_pass<MODE>(t, jt, g.af, g.ak, [&](int64_t i) { return cpd::fadd(ss[i], bs[i]); });
        std::swap(s, t);
      }
      for (int64_t i = 0; i < kLanes; ++i) bs[i] = 0.0f;
    }
  }
  for (int64_t i = 0; i < jt; ++i) out[i] = s[i];
}

#if CPD_CPU_H16_CHAIN
// The register chains' directed rounding policies. For the fused narrow chain (matmul_fchain.h
// fchain_tile; kTies false: a directed rounding has no midpoints, so nothing is redone), r the FMA
// fl(s + a*b) in the direction: FChainDir, an acc of fchain_applies (TF32, BF16), is
// cpd::directed_lane_bits on vectors of float32 bits, (r + (away ? qmask : 0)) & ~qmask, away for
// the lanes the mode rounds away from zero (up: sign clear; down: sign set; toward zero: none);
// FChain16Dir, acc = IEEE binary16, the processor's conversion in the current direction. A padded
// lane (b's panel is zero past N) rounds s, a value of acc, to itself.
template <int MODE>
struct FChainDir {
  static constexpr bool kTies = false;
  using C = H16Chain;
  C::I qmask, keep;
  explicit FChainDir(const cpd::Format& f) : qmask(C::ci(f.qmask)), keep(C::ci(~f.qmask)) {}
  C::V round(C::V r, FChainTies&) const {
    const C::I h = C::bits(r);
    if (MODE == cpd::TOWARD_ZERO) return C::flt(C::andi(h, keep));
#if defined(__AVX512F__)
    const C::I neg = _mm512_srai_epi32(h, 31);
    const C::I away = MODE == cpd::UP ? _mm512_andnot_si512(neg, qmask) : C::andi(neg, qmask);
#else
    const C::I neg = _mm256_srai_epi32(h, 31);
    const C::I away = MODE == cpd::UP ? _mm256_andnot_si256(neg, qmask) : C::andi(neg, qmask);
#endif
    return C::flt(C::andi(C::addi(h, away), keep));
  }
};

struct FChain16Dir {
  static constexpr bool kTies = false;
  H16Chain::V round(H16Chain::V r, FChainTies&) const { return H16Chain::rnd16_cur(r); }
};

// The product chain's Sum (matmul_h16.h h16_chain_tile, products in PROD_SIGNED or PROD_MAGNITUDE
// form, or exact with Kahan or blocks) into such an acc: fl(x +- y) in the direction, then Acc's
// rounding, the same direction twice being the one rounding of x +- y (accumulate.h, "Directed
// lanes"), and so for fl(x + a*b) (kExactFma). Into binary32 SumB32 serves.
template <class Acc>
struct SumDir : SumOps<SumDir<Acc>> {
  static constexpr bool kGuard = false, kExactFma = true;
  Acc acc;
  explicit SumDir(const Acc& a) : acc(a) {}
  H16Chain::V rnd(H16Chain::V u) const {
    FChainTies none = fchain_no_ties();
    return acc.round(u, none);
  }
};

// The chains' rows (fchain_rows, h16_chain_rows) out of line: the caller holds
// DirectedRounding(MODE), so that the direction holds for exactly their float operations.
template <class Acc>
__attribute__((noinline)) void dir_fchain_rows(const float* a, const float* b, float* y, int64_t K, int64_t N,
                                               int64_t m0, int64_t m1, int64_t j0, int64_t nc,
                                               std::vector<float>& pack, const Acc& acc, const cpd::Format& af) {
  fchain_rows(a, b, y, K, N, m0, m1, j0, nc, pack, acc, af);
}

template <int PROD, bool KAHAN, bool BLOCK, class Sum>
__attribute__((noinline)) void dir_h16_rows(const float* a, const float* b, float* y, int64_t K, int64_t L, int64_t N,
                                            int64_t m0, int64_t m1, int64_t j0, int64_t nc, std::vector<float>& pack,
                                            const H16Mul& m, const Sum& sum) {
  h16_chain_rows<PROD, KAHAN, BLOCK>(a, b, y, K, L, N, m0, m1, j0, nc, pack, m, sum, kNoRedo);
}
#endif

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_DIRECTED_H
