// The CPU matmul's binary32 chain (included by matmul.cpp): acc = IEEE binary32 to nearest, exact
// products, no Kahan, no blocks, i.e. every output is the chain s = fma(a[k], b[k], s) for
// k = 0, 1, ..., K - 1 from s = +0 (cpd::ffma: one rounding of s + a*b, which is fma_bits into
// binary32; numerics.h "Accumulation"). Outputs are independent, each keeps its own k order,
// so computing many at once in vector registers changes no bit.
//
// A register tile of MR rows x NR columns (NR = NV vectors of W floats) keeps its MR x NV sums in
// registers for the whole k loop: per k, NV loads of packed b, MR broadcasts of a, MR x NV FMAs.
// b's column panel (K x NR) is first copied into a contiguous buffer, zero-padded past N (the
// padded lanes' sums are never stored), so that the k loop reads it sequentially.
//   AVX-512: W = 16, MR = 6, NV = 4 (24 sums of the 32 zmm registers);
//   AVX2 + FMA: W = 8, MR = 6, NV = 2 (12 sums of the 16 ymm registers);
//   NEON (aarch64): W = 4, MR = 6, NV = 4 (24 of the 32 q registers).
// Without one of these (e.g. x86-64-v2: no FMA instruction), CPD_CPU_CHAIN is 0 and the float32
// lanes of matmul_f32.h (or the float64 lanes) serve.
#ifndef CPD_CPU_MATMUL_CHAIN_H
#define CPD_CPU_MATMUL_CHAIN_H

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX__) && defined(__FMA__))
#include <immintrin.h>
#define CPD_CPU_CHAIN 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define CPD_CPU_CHAIN 1
#else
#define CPD_CPU_CHAIN 0
#endif

#if defined(__clang__)
#define CPD_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define CPD_UNROLL _Pragma("GCC unroll 16")
#else
#define CPD_UNROLL
#endif

namespace cpd_cpu {

// Columns j0 .. j0 + nc of b (K, N) packed into pack as K rows of nr floats, zero past nc: the
// panel the register chains (this file's and matmul_h16.h's) stream through. Returns its data.
inline float* pack_panel(const float* b, int64_t K, int64_t N, int64_t j0, int64_t nc, int64_t nr,
                         std::vector<float>& pack) {
  pack.resize((size_t)(K * nr));
  float* bp = pack.data();
  for (int64_t k = 0; k < K; ++k) {
    std::memcpy(bp + k * nr, b + k * N + j0, sizeof(float) * (size_t)nc);
    for (int64_t j = nc; j < nr; ++j) bp[k * nr + j] = 0.0f;
  }
  return bp;
}

// The R x NV vector sums of a register chain's tile stored as R rows of y (row stride ldy), nc <= NR
// columns (a partial panel through a buffer): the chains' (this file's, matmul_h16.h's,
// matmul_fchain.h's) common end.
template <class C, int R>
inline void store_tile(const typename C::V (&s)[R][C::NV], float* y, int64_t ldy, int64_t nc) {
  CPD_UNROLL for (int r = 0; r < R; ++r) {
    if (nc == C::NR) {
      for (int v = 0; v < C::NV; ++v) C::store(y + r * ldy + v * C::W, s[r][v]);
    } else {
      alignas(64) float t[C::NR];
      for (int v = 0; v < C::NV; ++v) C::store(t + v * C::W, s[r][v]);
      std::memcpy(y + r * ldy, t, sizeof(float) * (size_t)nc);
    }
  }
}

#if CPD_CPU_CHAIN
struct ChainVec {
#if defined(__AVX512F__)
  using V = __m512;
  static constexpr int W = 16, NV = 4;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c rounded once
#elif defined(__AVX__)
  using V = __m256;
  static constexpr int W = 8, NV = 2;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
#else
  using V = float32x4_t;
  static constexpr int W = 4, NV = 4;
  static V zero() { return vdupq_n_f32(0.0f); }
  static V load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, V v) { vst1q_f32(p, v); }
  static V bcast(const float* p) { return vld1q_dup_f32(p); }
  static V fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
#endif
  static constexpr int MR = 6, NR = W * NV;
};

// Rows r < R of a register tile: y[r][0 .. nc) = the chains of a's rows (a + r * lda, K values)
// against the packed panel bp (K x NR, row k at bp + k * NR).
template <int R>
inline void chain_tile(const float* __restrict a, int64_t lda, const float* __restrict bp, int64_t K,
                       float* __restrict y, int64_t ldy, int64_t nc) {
  using C = ChainVec;
  // (the loops over r and v unrolled early, so that the compiler keeps s in registers instead of
  // storing the array back every step)
  typename C::V s[R][C::NV];
  CPD_UNROLL for (int r = 0; r < R; ++r)
    CPD_UNROLL for (int v = 0; v < C::NV; ++v) s[r][v] = C::zero();  // s = +0
  for (int64_t k = 0; k < K; ++k) {
    typename C::V bv[C::NV];
    CPD_UNROLL for (int v = 0; v < C::NV; ++v) bv[v] = C::load(bp + k * C::NR + v * C::W);
    CPD_UNROLL for (int r = 0; r < R; ++r) {
      const typename C::V av = C::bcast(a + r * lda + k);
      CPD_UNROLL for (int v = 0; v < C::NV; ++v) s[r][v] = C::fma(av, bv[v], s[r][v]);
    }
  }
  store_tile<C, R>(s, y, ldy, nc);
}

// Rows m0 .. m1 of one batch element's output, columns j0 .. j0 + nc (nc <= NR): a: (M, K) of that
// element, b: (K, N), y: (M, N). The panel of b is packed into pack (resized as needed).
inline void chain_rows(const float* a, const float* b, float* y, int64_t K, int64_t N, int64_t m0, int64_t m1,
                       int64_t j0, int64_t nc, std::vector<float>& pack) {
  using C = ChainVec;
  const float* bp = pack_panel(b, K, N, j0, nc, C::NR, pack);
  int64_t i = m0;
  for (; i + C::MR <= m1; i += C::MR) chain_tile<C::MR>(a + i * K, K, bp, K, y + i * N + j0, N, nc);
  switch (m1 - i) {
    case 5: chain_tile<5>(a + i * K, K, bp, K, y + i * N + j0, N, nc); break;
    case 4: chain_tile<4>(a + i * K, K, bp, K, y + i * N + j0, N, nc); break;
    case 3: chain_tile<3>(a + i * K, K, bp, K, y + i * N + j0, N, nc); break;
    case 2: chain_tile<2>(a + i * K, K, bp, K, y + i * N + j0, N, nc); break;
    case 1: chain_tile<1>(a + i * K, K, bp, K, y + i * N + j0, N, nc); break;
    default: break;
  }
}
#endif

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_CHAIN_H
