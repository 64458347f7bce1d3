// The CPU matmul's fused narrow register chain (included by matmul.cpp): no mul format (exact
// products), acc a format with float32's exponent range rounded to nearest on integer lanes
// (TF32, BF16: fchain_applies), no Kahan, no blocks, finite operands. Every output is the chain
//   s = round_acc(s + a[k]*b[k])  for k = 0, 1, ..., K - 1 from s = +0
// each step rounded once (fma_bits into acc; numerics.h "Accumulation"). The steps are those of
// the float32 lanes' fused form (matmul_f32.h f32_tile, FUSED with AccI<1>), in registers:
//   r = fl32(s + a*b)               one FMA
//   t = bits(r) + half              (half = 2^(d0 - 1), d0 = 23 - man: the dropped bits)
//   s = t & ~qmask                  acc's nearest rounding of r on its float32 bits (region N;
//                                   lane_normal_only: emin = -126, float32's subnormals included)
// r rounds to acc as s + a*b does unless r is a midpoint of acc's grid (cpd::is_midpoint_bits:
// its dropped bits are 100...0, exactly when t's are 0, i.e. when s == t); those lanes are redone
// with cpd::fma_bits (fchain_fix; rare: about 2^-d0 of the steps on random data), whose result is
// a value of acc that the rounding then leaves alone. Off the midpoints the tie-to-even bit of
// round_lane_i (half - 1 + even) and the plain half give the same bits: the dropped bits differ
// from half, so adding half - 1 or half carries into the kept bits alike. The rest of
// cast_bits_fast_normal drops out for the formats of fchain_applies and finite r: a carry past max
// (max_bits = float32's max with the dropped bits clear) lands on INF_BITS, which is their
// overflow (outward_bits = INF_BITS, no saturation); fl32's overflow is +-inf, which the rounding
// leaves alone (its dropped bits are 0); the sign bit is never touched (signed zeros: the sign of
// fl32's result, as round_lane_i keeps it). With finite operands no step is NaN: a*b is finite,
// and an infinite s stays infinite (inf + finite).
//
// The binary16 form (the FChain16 policy: acc = IEEE binary16 itself, is_binary16 in matmul.cpp,
// the rest as above) rounds r by the processor's conversion instead (H16Chain::rnd16: float32 ->
// binary16 -> float32, to nearest even once, subnormals, overflow to infinity), h = rnd16(r), finds
// the midpoints without a per-region test: with E r's exponent (|r| in [2^E, 2^(E+1))), binary16's
// half-quantum at r is hq = 2^(max(E, -14) - 11) (2^-25 in region S), and h, the nearest value of
// acc's grid, lies within hq of r, at exactly hq when r is a midpoint. r - h is exact (h within a
// factor of 2 of r, or 0: Sterbenz), so the lanes with |r - h| >= hq (float32 compare, false for
// NaN) are the midpoints, plus those whose r rounds to infinity (|r - h| = inf: at most one step a
// lane, r >= 65520); fchain_fix redoes the midpoints (cpd::is_midpoint_bits) with fma_bits and
// leaves the others' r to the rounding. Infinite s (after an overflow) stays infinite: r = inf, h =
// inf, r - h NaN, no flag. 9 vector instructions per 8 or 16 products (FMA, two conversions, 6 for
// the test) against 5 on the bits, and 30-40 in the float32 lanes (matmul_f32.h AccH, fused).
//
// A register tile of R rows x NR columns keeps its sums in registers for the whole k loop; b's
// column panel is packed (matmul_chain.h pack_panel), zero past N: a padded lane's r is s, never a
// midpoint (s is a value of acc). Built where the binary16 chain's vectors are (H16Chain: AVX2 +
// FMA + F16C or AVX-512F); elsewhere CPD_CPU_H16_CHAIN is 0 and the float32 lanes serve.
#ifndef CPD_CPU_MATMUL_FCHAIN_H
#define CPD_CPU_MATMUL_FCHAIN_H

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpd/numerics.h"
#include "matmul_chain.h"  // CPD_UNROLL, pack_panel
#include "matmul_h16.h"    // H16Chain, CPD_CPU_H16_CHAIN

namespace cpd_cpu {

// acc's form for the chain: fast, 1 <= man <= 10 (add_lane_applies, midpoint_test_applies),
// emin = -126 (lane_normal_only), signed with a zero of each sign and subnormals (plain_lanes),
// infinities as overflow and float32's largest binade (max_bits = float32's max, dropped bits clear).
inline bool fchain_applies(const cpd::Format& f) {
  return f.fast && f.man >= 1 && f.man <= 10 && f.emin == -126 && f.is_signed == 1u && f.uz == 0u &&
         f.no_zero == 0u && f.subnormals == 1 && f.outward_bits == cpd::INF_BITS &&
         f.max_bits == (0x7f7fffffu & ~f.qmask);
}

#if CPD_CPU_H16_CHAIN
// The midpoint lanes' flags, as a vector of flags (AVX2) or a bit mask (AVX-512).
#if defined(__AVX512F__)
using FChainTies = __mmask16;
inline FChainTies fchain_no_ties() { return 0; }
inline FChainTies fchain_eq(H16Chain::I x, H16Chain::I y) { return _mm512_cmpeq_epi32_mask(x, y); }
inline FChainTies fchain_ge(H16Chain::V x, H16Chain::V y) { return _mm512_cmp_ps_mask(x, y, _CMP_GE_OQ); }
inline FChainTies fchain_or(FChainTies x, FChainTies y) { return (FChainTies)(x | y); }
inline bool fchain_none(FChainTies t) { return t == 0; }
#else
using FChainTies = __m256i;
inline FChainTies fchain_no_ties() { return _mm256_setzero_si256(); }
inline FChainTies fchain_eq(H16Chain::I x, H16Chain::I y) { return _mm256_cmpeq_epi32(x, y); }
inline FChainTies fchain_ge(H16Chain::V x, H16Chain::V y) {
  return _mm256_castps_si256(_mm256_cmp_ps(x, y, _CMP_GE_OQ));
}
inline FChainTies fchain_or(FChainTies x, FChainTies y) { return _mm256_or_si256(x, y); }
inline bool fchain_none(FChainTies t) { return _mm256_testz_si256(t, t) != 0; }
#endif

// The chain's rounding policies (see the top), each with:
//   kTies            whether round flags lanes (to nearest; the directed policies of
//                    matmul_directed.h flag none and have neither of the last two);
//   round(r, tie)    r's rounding to acc, the lanes where r may be a midpoint or into tie;
//   round_fixed(x)   the same rounding of x, a lane left by fchain_fix (no flags);
//   midpoint(r, af)  whether a flagged lane's r is a midpoint of acc (fchain_fix's scalar test).
// FChainAcc (TF32, BF16, ...: fchain_applies): on r's bits, t = bits(r) + half, t & keep; r is a
// midpoint exactly when t's dropped bits are 0 (dropped bits of r equal to half, and only those,
// carry into the kept bits leaving zeros), i.e. when t & keep == t: one compare.
struct FChainAcc {
  static constexpr bool kTies = true;
  H16Chain::I half, keep;
  explicit FChainAcc(const cpd::Format& f) {
    half = H16Chain::ci(f.half_m1 + 1u);
    keep = H16Chain::ci(~f.qmask);
  }
  H16Chain::V round(H16Chain::V r, FChainTies& tie) const {
    using C = H16Chain;
    const C::I t = C::addi(C::bits(r), half), rounded = C::andi(t, keep);
    tie = fchain_or(tie, fchain_eq(rounded, t));
    return C::flt(rounded);
  }
  H16Chain::V round_fixed(H16Chain::V x) const {
    return H16Chain::flt(H16Chain::andi(H16Chain::addi(H16Chain::bits(x), half), keep));
  }
  static bool midpoint(float r, const cpd::Format& af) { return (cpd::bits_of(r) & af.qmask) == af.half_m1 + 1u; }
};

// FChain16 (acc = IEEE binary16): h = rnd16(r), the lanes with |r - h| >= hq flagged (the
// midpoints and the overflows), the midpoints among them found by cpd::is_midpoint_bits.
struct FChain16 {
  static constexpr bool kTies = true;
  H16Chain::I mag, expo, min_e, neg11;
  FChain16() {
    mag = H16Chain::ci(~cpd::SIGN);
    expo = H16Chain::ci(cpd::INF_BITS);      // r's exponent field: 2^E
    min_e = H16Chain::ci(0x38800000u);       // 2^-14, binary16's smallest normal
    neg11 = H16Chain::ci(0u - (11u << 23));  // 2^e -> 2^(e - 11)
  }
  H16Chain::V round(H16Chain::V r, FChainTies& tie) const {
    using C = H16Chain;
    const C::V h = C::rnd16(r);
    const C::V d = C::flt(C::andi(C::bits(C::sub(r, h)), mag));
    const C::V hq = C::flt(C::addi(C::maxu(C::andi(C::bits(r), expo), min_e), neg11));
    tie = fchain_or(tie, fchain_ge(d, hq));
    return h;
  }
  H16Chain::V round_fixed(H16Chain::V x) const { return H16Chain::rnd16(x); }
  static bool midpoint(float r, const cpd::Format& af) {
    return cpd::is_midpoint_bits(cpd::bits_of(r) & ~cpd::SIGN, af) != 0u;
  }
};

// One row's step with flagged lanes, redone: x holds the row's s (NR lanes); on return it holds
// r = fl32(s + a*b) (the FMA of the vector step, scalar), the midpoint lanes' (Acc::midpoint)
// replaced by fma_bits(s, a, b), a value of acc that Acc's rounding leaves alone. (Arrays made only
// on this path, so that the hot loop's registers never go to memory for it.)
template <class Acc>
__attribute__((noinline, cold)) void fchain_fix(float* x, float a, const float* b, const cpd::Format& af) {
  for (int i = 0; i < H16Chain::NR; ++i) {
    const float r = cpd::ffma(a, b[i], x[i]);
    x[i] = Acc::midpoint(r, af) ? cpd::float_of(cpd::fma_bits(cpd::bits_of(x[i]), cpd::bits_of(a), cpd::bits_of(b[i]),
                                                             af, cpd::NEAREST, 0u, 32))
                                : r;
  }
}

// Rows r < R of a register tile: y[r][0 .. nc) = the chains of a's rows (a + r * lda, K values)
// against the packed panel bp (K x NR, row k at bp + k * NR), rounded by Acc.
template <int R, class Acc>
inline void fchain_tile(const float* __restrict a, int64_t lda, const float* __restrict bp, int64_t K,
                        float* __restrict y, int64_t ldy, int64_t nc, const Acc& m, const cpd::Format& af) {
  using C = H16Chain;
  C::V s[R][C::NV];
  CPD_UNROLL for (int r = 0; r < R; ++r)
    CPD_UNROLL for (int v = 0; v < C::NV; ++v) s[r][v] = C::zero();  // s = +0
  for (int64_t k = 0; k < K; ++k) {
    C::V bv[C::NV];
    CPD_UNROLL for (int v = 0; v < C::NV; ++v) bv[v] = C::load(bp + k * C::NR + v * C::W);
    CPD_UNROLL for (int r = 0; r < R; ++r) {
      const C::V av = C::bcast(a + r * lda + k);
      C::V rounded[C::NV];
      FChainTies tie = fchain_no_ties();
      CPD_UNROLL for (int v = 0; v < C::NV; ++v) rounded[v] = m.round(C::fma(av, bv[v], s[r][v]), tie);
      if constexpr (Acc::kTies) {
        if (__builtin_expect(!fchain_none(tie), 0)) {
          alignas(64) float x[C::NR];
          CPD_UNROLL for (int v = 0; v < C::NV; ++v) C::store(x + v * C::W, s[r][v]);
          fchain_fix<Acc>(x, a[r * lda + k], bp + k * C::NR, af);
          CPD_UNROLL for (int v = 0; v < C::NV; ++v) rounded[v] = m.round_fixed(C::load(x + v * C::W));
        }
      }
      CPD_UNROLL for (int v = 0; v < C::NV; ++v) s[r][v] = rounded[v];
    }
  }
  store_tile<C, R>(s, y, ldy, nc);
}

// The last rows (n < MR of them): the tile of n rows.
template <int R, class Acc>
inline void fchain_last(int64_t n, const float* a, int64_t K, const float* bp, float* y, int64_t N, int64_t nc,
                        const Acc& m, const cpd::Format& af) {
  if (n == R) fchain_tile<R>(a, K, bp, K, y, N, nc, m, af);
  else if constexpr (R > 1) fchain_last<R - 1>(n, a, K, bp, y, N, nc, m, af);
}

// Rows m0 .. m1 of one batch element's output, columns j0 .. j0 + nc (nc <= NR): a: (M, K) of that
// element, b: (K, N), y: (M, N). The panel of b is packed into pack (resized as needed).
template <class Acc>
inline void fchain_rows(const float* a, const float* b, float* y, int64_t K, int64_t N, int64_t m0, int64_t m1,
                        int64_t j0, int64_t nc, std::vector<float>& pack, const Acc& m, const cpd::Format& af) {
  using C = H16Chain;
  const float* bp = pack_panel(b, K, N, j0, nc, C::NR, pack);
  int64_t i = m0;
  for (; i + C::MR <= m1; i += C::MR) fchain_tile<C::MR>(a + i * K, K, bp, K, y + i * N + j0, N, nc, m, af);
  if (i < m1) fchain_last<C::MR - 1>(m1 - i, a + i * K, K, bp, y + i * N + j0, N, nc, m, af);
}
#endif

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_FCHAIN_H
