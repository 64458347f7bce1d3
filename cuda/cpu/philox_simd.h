// Philox4x32-10 (cpd/philox.h) on vector lanes, for the CPU loops: the same words as
// cpd::philox4x32_10, bit for bit, many blocks at a time. CPU-only (intrinsics), so it lives
// beside the loops rather than in the numerics core, which NVRTC also compiles.
//
//   philox_blocks(b0, nb, ...)   words[4k + j] = word j of block b0 + k       (element order: casts)
//   philox_strided(b0, st, n, ...) w[j][i]   = word j of block b0 + i * st    (one array per word:
//                                                                              the matmul's lanes)
// A block is philox4x32_10(counter = {b (64 bits), c2, c3}, key = {k0, k1}).
//
// Per ISA (chosen at compile time; the scalar loop serves the rest and the tails):
//   * AVX-512: 8 blocks per vector, one block per 64-bit lane [garbage (32) | word (32)]:
//     _mm512_mul_epu32 multiplies the low halves into full 64-bit products, so one instruction
//     gives mulhilo's (hi, lo) for 8 blocks: hi = p >> 32, lo = the low half of p as it stands
//     (its high half is garbage that the next multiply ignores and the xors only move around in
//     high halves). Only low halves are meaningful, and only they are stored. 32 blocks per
//     call, both forms (the strided form packs the low halves with VPMOVQD).
//   * AVX2: the same on 4 blocks per __m256i with _mm256_mul_epu32 (8 products of 32-bit lanes
//     per pair of multiplies), 2 vectors interleaved: 8 blocks per call, element order through
//     philox256_elements, the strided form through philox256_strided8 (round keys made once:
//     PhiloxKey; each round's key xor kept off the multiply's path: opaque_xor).
//   * SSE4.1 (x86-64-v2): the same on 2 blocks per __m128i with _mm_mul_epu32, 3 vectors
//     interleaved: 6 blocks per call (2 vectors, 4 blocks, for the strided form).
//   * NEON: 4 blocks per uint32x4_t, one block per 32-bit lane: lo = vmulq_u32, hi = the odd
//     halves of vmull_u32 / vmull_high_u32 (vuzp2q_u32); vst4q_u32 stores element order.
// A round, as in cpd::philox4x32_10:
//   p0 = c0 * 0xD2511F53, p1 = c2 * 0xCD9E8D57
//   c0' = hi(p1) ^ c1 ^ k0,  c1' = lo(p1),  c2' = hi(p0) ^ c3 ^ k1,  c3' = lo(p0)
#ifndef CPD_CPU_PHILOX_SIMD_H
#define CPD_CPU_PHILOX_SIMD_H

#include <cstdint>

#include "cpd/numerics.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__SSE4_1__)
#include <smmintrin.h>
#endif
#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#define CPD_CPU_NEON 1
#endif

namespace cpd_cpu {

// The ISA the vector paths of this build use (for the benchmarks and the tests; constexpr so that
// a compile-only check for another machine can assert it, tests/test_isa_levels.py).
constexpr const char* isa_name() {
#if defined(__AVX512F__) && defined(__AVX512FP16__)
  return "avx512+fp16";
#elif defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2+fma";
#elif defined(__AVX2__)
  return "avx2";
#elif defined(__SSE4_2__)
  return "sse4.2";
#elif defined(CPD_CPU_NEON)
  return "neon";
#else
  return "scalar";
#endif
}

// Blocks of one vector Philox call of philox_blocks on this build (its vector body runs whole
// multiples of it; the fused stochastic cast, cast_loops.h, takes its words one call at a time).
#if defined(__AVX512F__)
constexpr int64_t kPhiloxCallBlocks = 32;  // 4 vectors of 8 blocks
#elif defined(__AVX2__)
constexpr int64_t kPhiloxCallBlocks = 8;   // 2 vectors of 4
#elif defined(__SSE4_1__)
constexpr int64_t kPhiloxCallBlocks = 6;   // 3 vectors of 2
#elif defined(CPD_CPU_NEON)
constexpr int64_t kPhiloxCallBlocks = 16;  // 4 vectors of 4
#else
constexpr int64_t kPhiloxCallBlocks = 4;   // scalar: 16 words
#endif

inline void philox_one(uint64_t b, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1, uint32_t* w4) {
  const cpd::U32x4 w = cpd::philox4x32_10((uint32_t)b, (uint32_t)(b >> 32), c2, c3, k0, k1);
  for (int j = 0; j < 4; ++j) w4[j] = w.v[j];
}

// The key of a launch, and on AVX2 builds its round keys broadcast once: round r xors
// k0 + r * 0x9E3779B9 and k1 + r * 0xBB67AE85 (cpd::philox4x32_10). A loop that draws many calls'
// words (the fused stochastic cast) makes one and passes it to each call, whose rounds then read
// the keys as memory operands instead of forming and broadcasting two per round and call.
struct PhiloxKey {
  uint32_t k0, k1;
#if defined(__AVX2__)
  __m256i r0[cpd::PHILOX_ROUNDS], r1[cpd::PHILOX_ROUNDS];  // 64-bit lanes (their low halves count)
#endif
};

inline PhiloxKey philox_key(uint32_t k0, uint32_t k1) {
  PhiloxKey key;
  key.k0 = k0;
  key.k1 = k1;
#if defined(__AVX2__)
  for (int r = 0; r < cpd::PHILOX_ROUNDS; ++r) {
    key.r0[r] = _mm256_set1_epi64x(k0 + (uint32_t)r * 0x9E3779B9u);
    key.r1[r] = _mm256_set1_epi64x(k1 + (uint32_t)r * 0xBB67AE85u);
  }
#endif
  return key;
}

// The shared head. When the blocks of a vector call share their high word c1 = b >> 32 (every
// call but those that cross a multiple of 2^32 blocks), the counter words c1, c2, c3 are the same
// in every lane, and so is half of the work of rounds 0 and 1, done once per call on scalars.
// Round 0: mulhilo(M1, c2) is a constant, hence so are x0' = hi ^ c1 ^ k0 and x1' = lo; only
// p0 = c0 * M0 is a vector product: x2' = hi(p0) ^ c3 ^ k1, x3' = lo(p0). Round 1: mulhilo(M0, x0')
// is a constant (h, l): x2'' = x3' ^ h ^ k1', x3'' = l; only p1 = x2' * M1 is a vector product:
// x0'' = hi(p1) ^ x1' ^ k0', x1'' = lo(p1). (Measured on Zen 3, AVX2, a micro-benchmark of whole
// calls: 6% fewer cycles per block; the calls that cross take the rounds as they are.)
//
// Whether the blocks b0 + i * st, i < n <= 64, share their high word (b >> 32): with st < 2^32 the
// products do not wrap, and a last block at or above b0 means the sums did not either.
inline bool philox_same_high(uint64_t b0, uint64_t st, int64_t n) {
  const uint64_t last = b0 + (uint64_t)(n - 1) * st;
  return st <= 0xFFFFFFFFu && last >= b0 && (b0 >> 32) == (last >> 32);
}

// The shared head's constants for counter words c1, c2, c3 and key (k0, k1), each xored into or
// standing for a word in every lane (the vector forms broadcast them): k2a = c3 ^ k1 (round 0's
// x2'), k0b = x1' ^ k0' (round 1's x0''), k2b = h ^ k1' (round 1's x2''), x3 = l (round 1's x3''),
// y3 = l ^ k1'' (round 2's key xor of x3'').
struct PhiloxHeadWords {
  uint32_t k2a, k0b, k2b, x3, y3;
};

inline PhiloxHeadWords philox_head_words(uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  const uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
  const uint32_t x0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, x1 = (uint32_t)p1;
  const uint64_t q = (uint64_t)0xD2511F53u * x0;
  return {c3 ^ k1, x1 ^ (k0 + 0x9E3779B9u), (uint32_t)(q >> 32) ^ (k1 + 0xBB67AE85u), (uint32_t)q,
          (uint32_t)q ^ (k1 + 2u * 0xBB67AE85u)};
}

#if defined(__AVX512F__)
constexpr int kGroups512 = 4;

// Rounds R0 .. 9 of kGroups512 vectors of blocks, the keys (k0, k1) those of round R0; unrolled, so
// that a caller's words left unused take none of the last rounds' work (dead code: philox512's WORDS).
template <int R0>
inline __attribute__((always_inline)) void philox512_rounds(__m512i* x0, __m512i* x1, __m512i* x2, __m512i* x3,
                                                            uint32_t k0, uint32_t k1) {
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53u), m1 = _mm512_set1_epi64(0xCD9E8D57u);
#pragma GCC unroll 10
  for (int r = R0; r < cpd::PHILOX_ROUNDS; ++r) {
    if (r > R0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const __m512i kk0 = _mm512_set1_epi64(k0), kk1 = _mm512_set1_epi64(k1);
#pragma GCC unroll 4
    for (int g = 0; g < kGroups512; ++g) {
      __m512i p0 = _mm512_mul_epu32(x0[g], m0), p1 = _mm512_mul_epu32(x2[g], m1);
      x0[g] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), x1[g], kk0, 0x96);  // a ^ b ^ c
      x1[g] = p1;
      x2[g] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), x3[g], kk1, 0x96);
      x3[g] = p0;
    }
  }
}

// Blocks b0 + i * st for i < 32 (8 per vector, 4 vectors); x0..x3 hold the words in low halves.
// Only the words j in the mask WORDS (bit j) are written, and the rounds' work that only the others
// need is not done (the stochastic matmul's steps use one to four words of a block: matmul_sr.h).
template <unsigned WORDS = 0xFu>
inline void philox512(uint64_t b0, uint64_t st, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                      __m512i* x0, __m512i* x1, __m512i* x2, __m512i* x3) {
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53u), m1 = _mm512_set1_epi64(0xCD9E8D57u);
  const long long s = (long long)st;
  const __m512i iota = _mm512_set_epi64(7 * s, 6 * s, 5 * s, 4 * s, 3 * s, 2 * s, s, 0);
  __m512i y0[kGroups512], y1[kGroups512], y2[kGroups512], y3[kGroups512];
  if (philox_same_high(b0, st, 8 * kGroups512)) {  // the shared head
    const PhiloxHeadWords h = philox_head_words((uint32_t)(b0 >> 32), c2, c3, k0, k1);
    const __m512i k2a = _mm512_set1_epi64(h.k2a), k0b = _mm512_set1_epi64(h.k0b);
    const __m512i k2b = _mm512_set1_epi64(h.k2b), x3c = _mm512_set1_epi64(h.x3);
    for (int g = 0; g < kGroups512; ++g) {
      const __m512i b = _mm512_add_epi64(_mm512_set1_epi64((long long)(b0 + 8 * g * st)), iota);
      const __m512i p0 = _mm512_mul_epu32(b, m0);
      const __m512i p1 = _mm512_mul_epu32(_mm512_xor_si512(_mm512_srli_epi64(p0, 32), k2a), m1);
      y0[g] = _mm512_xor_si512(_mm512_srli_epi64(p1, 32), k0b);
      y1[g] = p1;
      y2[g] = _mm512_xor_si512(p0, k2b);
      y3[g] = x3c;
    }
    philox512_rounds<2>(y0, y1, y2, y3, k0 + 2u * 0x9E3779B9u, k1 + 2u * 0xBB67AE85u);
  } else {
    for (int g = 0; g < kGroups512; ++g) {
      __m512i b = _mm512_add_epi64(_mm512_set1_epi64((long long)(b0 + 8 * g * st)), iota);
      y0[g] = b;
      y1[g] = _mm512_srli_epi64(b, 32);
      y2[g] = _mm512_set1_epi64(c2);
      y3[g] = _mm512_set1_epi64(c3);
    }
    philox512_rounds<0>(y0, y1, y2, y3, k0, k1);
  }
  for (int g = 0; g < kGroups512; ++g) {
    if (WORDS & 1u) x0[g] = y0[g];
    if (WORDS & 2u) x1[g] = y1[g];
    if (WORDS & 4u) x2[g] = y2[g];
    if (WORDS & 8u) x3[g] = y3[g];
  }
}
#endif

#if defined(__AVX2__)
// Groups of vectors interleaved in philox256_elements: 2 (8 blocks per call). With the round
// key xored into x1 / x3 ahead of the multiply's result (opaque_xor below), 2 groups took 7.6
// cycles per block on Zen 3 against 8.0-8.6 for 3 (which spill) and 10+ for 4 (a micro-benchmark
// of whole calls, best of 7); without it 3 groups were best.
constexpr int kGroups256 = 2;

// Each 64-bit lane's high half moved to its low half (the high half then holds the old low half,
// which no caller reads: the multiplies read low halves, the stores pick them). A dword shuffle,
// not a 64-bit shift: on Intel's cores AVX2 shifts share ports 0 and 1 with the multiplies, where
// the shuffle also issues on port 5 (x86-64-v3 build on an Intel Xeon, cycles_cast.cpp: 2% fewer
// cycles per stochastic element, 6.26 -> 6.11 cycles per Philox block); on Zen 3 both are one
// cycle on the same two pipes.
inline __m256i hi_to_low256(__m256i p) { return _mm256_shuffle_epi32(p, 0xB1); }

// y = x ^ k, held as a value of its own: GCC would otherwise reassociate a round's
// hi(p) ^ (x ^ k) into (hi(p) ^ x) ^ k, putting both xors (one with a memory operand) after the
// multiply on the round's critical path (multiply, shift, xor: 5 cycles instead of 6 or more).
inline __m256i opaque_xor(__m256i x, __m256i k) {
  __m256i y = _mm256_xor_si256(x, k);
  __asm__("" : "+x"(y));
  return y;
}

// Round r (the header's round) on a vector of 4 blocks, one per 64-bit lane with its words in the
// low halves; m0, m1: the multipliers broadcast, the round keys key's.
inline void philox256_round(__m256i& x0, __m256i& x1, __m256i& x2, __m256i& x3, __m256i m0, __m256i m1,
                            const PhiloxKey& key, int r) {
  const __m256i p0 = _mm256_mul_epu32(x0, m0), p1 = _mm256_mul_epu32(x2, m1);
  const __m256i y1 = opaque_xor(x1, key.r0[r]), y3 = opaque_xor(x3, key.r1[r]);
  x0 = _mm256_xor_si256(hi_to_low256(p1), y1);
  x1 = p1;
  x2 = _mm256_xor_si256(hi_to_low256(p0), y3);
  x3 = p0;
}

// The AVX2 form of the shared head (philox_same_high): the constants of one call, broadcast.
// Per vector the two rounds take 2 multiplies, 2 shifts and 3 xors, against 4, 4 and 8, and
// round 2 one xor less (x3'' is a constant: its key xor is one too).
struct PhiloxHead {
  __m256i k2a, k0b, k2b, x3, y3;  // philox_head_words' words in 64-bit lanes
};

inline PhiloxHead philox_head256(uint32_t c1, uint32_t c2, uint32_t c3, const PhiloxKey& key) {
  const PhiloxHeadWords w = philox_head_words(c1, c2, c3, key.k0, key.k1);
  return {_mm256_set1_epi64x(w.k2a), _mm256_set1_epi64x(w.k0b), _mm256_set1_epi64x(w.k2b), _mm256_set1_epi64x(w.x3),
          _mm256_set1_epi64x(w.y3)};
}

// Rounds 0-2 of a vector of blocks b (64-bit lanes, sharing h's c1), by philox_head256's scheme.
inline void philox256_rounds012(__m256i b, __m256i& x0, __m256i& x1, __m256i& x2, __m256i& x3, __m256i m0,
                                __m256i m1, const PhiloxHead& h, const PhiloxKey& key) {
  const __m256i p0 = _mm256_mul_epu32(b, m0);
  const __m256i x2a = _mm256_xor_si256(hi_to_low256(p0), h.k2a);
  const __m256i p1 = _mm256_mul_epu32(x2a, m1);
  x0 = _mm256_xor_si256(hi_to_low256(p1), h.k0b);
  x1 = p1;
  x2 = _mm256_xor_si256(p0, h.k2b);  // round 1's x2'' (its low half)
  // round 2: x3'' = h.x3 is a constant, its key xor h.y3
  const __m256i q0 = _mm256_mul_epu32(x0, m0), q1 = _mm256_mul_epu32(x2, m1);
  const __m256i y1 = opaque_xor(x1, key.r0[2]);
  x0 = _mm256_xor_si256(hi_to_low256(q1), y1);
  x1 = q1;
  x2 = _mm256_xor_si256(hi_to_low256(q0), h.y3);
  x3 = q0;
}


// Rounds R0 .. 9 of G vectors of blocks (philox256_round), unrolled: a caller's words left unused take
// none of the last rounds' work (dead code: philox256_strided8's WORDS).
template <int R0, int G>
inline __attribute__((always_inline)) void philox256_rounds(__m256i* x0, __m256i* x1, __m256i* x2, __m256i* x3,
                                                            __m256i m0, __m256i m1, const PhiloxKey& key) {
#pragma GCC unroll 10
  for (int r = R0; r < cpd::PHILOX_ROUNDS; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) philox256_round(x0[g], x1[g], x2[g], x3[g], m0, m1, key, r);
}

// Blocks b0 + i * st for i < 8, word j of block i stored at w[j * ld + i] (philox_strided's vector
// body on AVX2, the matmul's lanes): two vectors of four blocks, a = {0, 1, 4, 5} and
// b = {2, 3, 6, 7}, so that one in-lane vshufps of their low halves gives the 8 words of an index
// in order (one 256-bit store, no cross-lane permute); the round keys are key's (memory operands).
// On Zen 3 this took 7.4-7.8 cycles per block against 8.9-9.9 for four-block vectors in order,
// keys broadcast per round and a permute per 4 words (a micro-benchmark of 64 lanes, stride 512).
// Only the words j in WORDS (bit j) are stored, and the work of the last rounds that only the
// others need is left out (unrolled rounds, dead code): word 1 alone takes 66 of the 80 vector
// instructions per vector of the ten rounds, words 0 and 1 73.
template <unsigned WORDS = 0xFu>
inline void philox256_strided8(uint64_t b0, uint64_t st, uint32_t c2, uint32_t c3, const PhiloxKey& key,
                               uint32_t* __restrict w, int64_t ld) {
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  const long long s = (long long)st;
  const __m256i base = _mm256_set1_epi64x((long long)b0);
  __m256i x0[2], x1[2], x2[2], x3[2];
  x0[0] = _mm256_add_epi64(base, _mm256_set_epi64x(5 * s, 4 * s, s, 0));
  x0[1] = _mm256_add_epi64(base, _mm256_set_epi64x(7 * s, 6 * s, 3 * s, 2 * s));
  if (philox_same_high(b0, st, 8)) {
    const PhiloxHead h = philox_head256((uint32_t)(b0 >> 32), c2, c3, key);
    for (int g = 0; g < 2; ++g) philox256_rounds012(x0[g], x0[g], x1[g], x2[g], x3[g], m0, m1, h, key);
    philox256_rounds<3, 2>(x0, x1, x2, x3, m0, m1, key);
  } else {
    for (int g = 0; g < 2; ++g) {
      x1[g] = _mm256_srli_epi64(x0[g], 32);
      x2[g] = _mm256_set1_epi64x(c2);
      x3[g] = _mm256_set1_epi64x(c3);
    }
    philox256_rounds<0, 2>(x0, x1, x2, x3, m0, m1, key);
  }
  const __m256i* x[4] = {x0, x1, x2, x3};
  for (int j = 0; j < 4; ++j)
    if (WORDS >> j & 1u)
      _mm256_storeu_ps((float*)(w + j * ld), _mm256_shuffle_ps(_mm256_castsi256_ps(x[j][0]),
                                                               _mm256_castsi256_ps(x[j][1]), _MM_SHUFFLE(2, 0, 2, 0)));
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
// The words of blocks b0 .. b0 + 4G - 1 in element order, w[4k + j] = word j of block b0 + k
// (philox_blocks' vector body on AVX2), with fewer instructions than blocks in order and a transpose:
//   * the round keys are key's (memory operands, no broadcasts in the loop);
//   * the lanes of a vector hold blocks b0 + {0, 2, 1, 3} (+ 4g), so that one in-lane shuffle
//     per 8 words puts them in element order (no cross-lane permute);
//   * the last round forms each pair of words in place: p1 ^ ((x1 ^ k0) << 32) is the 64-bit lane
//     [lo(p1) | hi(p1) ^ x1 ^ k0] = [w1 | w0] (x1's garbage high half is shifted out), likewise
//     [w3 | w2] from p0, and vshufps picks [w0 w1 w2 w3] of one block from each 128-bit half.
// Per vector of 4 blocks: 9 rounds of 2 multiplies, 2 shifts and 4 xors, then 10 instructions for
// the last round and the transpose (blocks in order and a transpose: 10 rounds and 10, with two
// key broadcasts per round and call).
template <int G>
inline void philox256_elements(uint64_t b0, uint32_t c2, uint32_t c3, const PhiloxKey& key, uint32_t* w) {
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  const __m256i iota = _mm256_set_epi64x(3, 1, 2, 0);  // lane l: block b0 + {0, 2, 1, 3}[l]
  __m256i x0[G], x1[G], x2[G], x3[G];
  int r0 = 0;
  if (philox_same_high(b0, 1, 4 * G)) {
    const PhiloxHead h = philox_head256((uint32_t)(b0 >> 32), c2, c3, key);
    for (int g = 0; g < G; ++g) {
      const __m256i b = _mm256_add_epi64(_mm256_set1_epi64x((long long)(b0 + 4 * (uint64_t)g)), iota);
      philox256_rounds012(b, x0[g], x1[g], x2[g], x3[g], m0, m1, h, key);
    }
    r0 = 3;
  } else {
    for (int g = 0; g < G; ++g) {
      const __m256i b = _mm256_add_epi64(_mm256_set1_epi64x((long long)(b0 + 4 * (uint64_t)g)), iota);
      x0[g] = b;
      x1[g] = _mm256_srli_epi64(b, 32);
      x2[g] = _mm256_set1_epi64x(c2);
      x3[g] = _mm256_set1_epi64x(c3);
    }
  }
  for (int r = r0; r + 1 < cpd::PHILOX_ROUNDS; ++r)
    for (int g = 0; g < G; ++g) philox256_round(x0[g], x1[g], x2[g], x3[g], m0, m1, key, r);
  constexpr int R = cpd::PHILOX_ROUNDS - 1;
  for (int g = 0; g < G; ++g) {
    const __m256i p0 = _mm256_mul_epu32(x0[g], m0), p1 = _mm256_mul_epu32(x2[g], m1);
    const __m256i y1 = _mm256_xor_si256(x1[g], key.r0[R]), y3 = _mm256_xor_si256(x3[g], key.r1[R]);
    const __m256 w10 = _mm256_castsi256_ps(_mm256_xor_si256(p1, _mm256_slli_epi64(y1, 32)));
    const __m256 w32 = _mm256_castsi256_ps(_mm256_xor_si256(p0, _mm256_slli_epi64(y3, 32)));
    // 128-bit half h of w10: [w1 w0 | w1 w0] of the blocks in lanes 2h and 2h + 1; w32: w3 w2.
    _mm256_storeu_ps((float*)(w + 16 * g), _mm256_shuffle_ps(w10, w32, _MM_SHUFFLE(0, 1, 0, 1)));      // +0 | +1
    _mm256_storeu_ps((float*)(w + 16 * g + 8), _mm256_shuffle_ps(w10, w32, _MM_SHUFFLE(2, 3, 2, 3)));  // +2 | +3
  }
}
#endif

#if defined(__SSE4_1__) && !defined(__AVX2__)
// 3 vectors of state per word (12) and 2 multipliers fit the 16 xmm registers.
constexpr int kGroups128 = 3, kGroups128Strided = 2;
static_assert(kGroups128Strided == 2, "philox_strided stores the low halves of two vectors at a time");

// Blocks b0 + i * st for i < 2 * G (2 per vector); x0..x3 hold the words in low halves.
template <int G>
inline void philox128(uint64_t b0, uint64_t st, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                      __m128i* x0, __m128i* x1, __m128i* x2, __m128i* x3) {
  const __m128i m0 = _mm_set1_epi64x(0xD2511F53u), m1 = _mm_set1_epi64x(0xCD9E8D57u);
  const __m128i iota = _mm_set_epi64x((long long)st, 0);
  for (int g = 0; g < G; ++g) {
    __m128i b = _mm_add_epi64(_mm_set1_epi64x((long long)(b0 + 2 * g * st)), iota);
    x0[g] = b;
    x1[g] = _mm_srli_epi64(b, 32);
    x2[g] = _mm_set1_epi64x(c2);
    x3[g] = _mm_set1_epi64x(c3);
  }
  for (int r = 0; r < cpd::PHILOX_ROUNDS; ++r) {
    if (r) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const __m128i kk0 = _mm_set1_epi64x(k0), kk1 = _mm_set1_epi64x(k1);
    for (int g = 0; g < G; ++g) {
      __m128i p0 = _mm_mul_epu32(x0[g], m0), p1 = _mm_mul_epu32(x2[g], m1);
      x0[g] = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi64(p1, 32), x1[g]), kk0);
      x1[g] = p1;
      x2[g] = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi64(p0, 32), x3[g]), kk1);
      x3[g] = p0;
    }
  }
}

// The low halves of a's and b's two 64-bit lanes: [a0, a1, b0, b1] as four u32.
inline __m128i low_halves(__m128i a, __m128i b) {
  return _mm_castps_si128(_mm_shuffle_ps(_mm_castsi128_ps(a), _mm_castsi128_ps(b), _MM_SHUFFLE(2, 0, 2, 0)));
}
#endif

#if defined(CPD_CPU_NEON)
// Blocks b0 + i * st for i < 4 * G; word j of group g in x[j][g] (one block per 32-bit lane).
template <int G>
inline void philox_neon(uint64_t b0, uint64_t st, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                        uint32x4_t (*x)[G]) {
  const uint32x4_t m0 = vdupq_n_u32(0xD2511F53u), m1 = vdupq_n_u32(0xCD9E8D57u);
  const uint32x2_t m0h = vdup_n_u32(0xD2511F53u), m1h = vdup_n_u32(0xCD9E8D57u);
  for (int g = 0; g < G; ++g) {
    uint32_t lo[4], hi[4];
    for (int i = 0; i < 4; ++i) {
      const uint64_t b = b0 + (uint64_t)(4 * g + i) * st;
      lo[i] = (uint32_t)b;
      hi[i] = (uint32_t)(b >> 32);
    }
    x[0][g] = vld1q_u32(lo);
    x[1][g] = vld1q_u32(hi);
    x[2][g] = vdupq_n_u32(c2);
    x[3][g] = vdupq_n_u32(c3);
  }
  for (int r = 0; r < cpd::PHILOX_ROUNDS; ++r) {
    if (r) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32x4_t kk0 = vdupq_n_u32(k0), kk1 = vdupq_n_u32(k1);
    for (int g = 0; g < G; ++g) {
      const uint32x4_t a = x[0][g], c = x[2][g];
      const uint32x4_t hi0 = vuzp2q_u32(vreinterpretq_u32_u64(vmull_u32(vget_low_u32(a), m0h)),
                                        vreinterpretq_u32_u64(vmull_high_u32(a, m0)));
      const uint32x4_t hi1 = vuzp2q_u32(vreinterpretq_u32_u64(vmull_u32(vget_low_u32(c), m1h)),
                                        vreinterpretq_u32_u64(vmull_high_u32(c, m1)));
      x[0][g] = veorq_u32(veorq_u32(hi1, x[1][g]), kk0);
      x[1][g] = vmulq_u32(c, m1);
      x[2][g] = veorq_u32(veorq_u32(hi0, x[3][g]), kk1);
      x[3][g] = vmulq_u32(a, m0);
    }
  }
}
#endif

// words[4k + j] = word j of block b0 + k, for k < nb (element order: random_word(4 (b0 + k) + j)).
// key: philox_key(k0, k1), made once for many calls.
inline void philox_blocks(uint64_t b0, int64_t nb, uint32_t c2, uint32_t c3, const PhiloxKey& key,
                          uint32_t* __restrict words) {
  const uint32_t k0 = key.k0, k1 = key.k1;
  int64_t k = 0;
#if defined(__AVX512F__)
  static_assert(kPhiloxCallBlocks == 8 * kGroups512, "one call of the vector body");
  // v01 lane k = [w1 | w0] of block k, v23 = [w3 | w2]; block k's four words are then 64-bit
  // lanes k of v01 and v23, interleaved by two permutes into 2 x 16 words.
  const __m512i lo4 = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), hi4 = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
  for (; k + 8 * kGroups512 <= nb; k += 8 * kGroups512) {
    __m512i x0[kGroups512], x1[kGroups512], x2[kGroups512], x3[kGroups512];
    philox512(b0 + (uint64_t)k, 1, c2, c3, k0, k1, x0, x1, x2, x3);
    uint32_t* w = words + 4 * k;
    for (int g = 0; g < kGroups512; ++g) {
      __m512i v01 = _mm512_mask_blend_epi32(0xAAAA, x0[g], _mm512_slli_epi64(x1[g], 32));
      __m512i v23 = _mm512_mask_blend_epi32(0xAAAA, x2[g], _mm512_slli_epi64(x3[g], 32));
      _mm512_storeu_si512(w + 32 * g, _mm512_permutex2var_epi64(v01, lo4, v23));
      _mm512_storeu_si512(w + 32 * g + 16, _mm512_permutex2var_epi64(v01, hi4, v23));
    }
  }
#elif defined(__AVX2__)
  static_assert(kPhiloxCallBlocks == 4 * kGroups256, "one call of the vector body");
  for (; k + 4 * kGroups256 <= nb; k += 4 * kGroups256)
    philox256_elements<kGroups256>(b0 + (uint64_t)k, c2, c3, key, words + 4 * k);
#elif defined(__SSE4_1__)
  static_assert(kPhiloxCallBlocks == 2 * kGroups128, "one call of the vector body");
  // v01 = [b0: w0 w1 | b1: w0 w1], v23 the same for w2 w3; unpacking their 64-bit halves gives
  // the blocks in element order.
  for (; k + 2 * kGroups128 <= nb; k += 2 * kGroups128) {
    __m128i x0[kGroups128], x1[kGroups128], x2[kGroups128], x3[kGroups128];
    philox128<kGroups128>(b0 + (uint64_t)k, 1, c2, c3, k0, k1, x0, x1, x2, x3);
    uint32_t* w = words + 4 * k;
    for (int g = 0; g < kGroups128; ++g) {
      __m128i v01 = _mm_blend_epi16(x0[g], _mm_slli_epi64(x1[g], 32), 0xCC);
      __m128i v23 = _mm_blend_epi16(x2[g], _mm_slli_epi64(x3[g], 32), 0xCC);
      _mm_storeu_si128((__m128i*)(w + 8 * g), _mm_unpacklo_epi64(v01, v23));
      _mm_storeu_si128((__m128i*)(w + 8 * g + 4), _mm_unpackhi_epi64(v01, v23));
    }
  }
#elif defined(CPD_CPU_NEON)
  constexpr int G = 4;
  static_assert(kPhiloxCallBlocks == 4 * G, "one call of the vector body");
  for (; k + 4 * G <= nb; k += 4 * G) {
    uint32x4_t x[4][G];
    philox_neon<G>(b0 + (uint64_t)k, 1, c2, c3, k0, k1, x);
    for (int g = 0; g < G; ++g) {
      uint32x4x4_t v = {{x[0][g], x[1][g], x[2][g], x[3][g]}};
      vst4q_u32(words + 4 * k + 16 * g, v);  // interleaves: element order
    }
  }
#endif
  for (; k < nb; ++k) philox_one(b0 + (uint64_t)k, c2, c3, k0, k1, words + 4 * k);
  (void)k0, (void)k1;
}

inline void philox_blocks(uint64_t b0, int64_t nb, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                          uint32_t* __restrict words) {
  philox_blocks(b0, nb, c2, c3, philox_key(k0, k1), words);
}

// w[j * ld + i] = word j of block b0 + i * st, for i < n (one array per word), for the words j in
// the mask WORDS (bit j; the others' arrays are not written, and on AVX2 and AVX-512 the rounds'
// work only they need is not done). key: philox_key(k0, k1), made once for many calls (the
// matmul's tiles).
template <unsigned WORDS = 0xFu>
inline void philox_strided(uint64_t b0, uint64_t st, int64_t n, uint32_t c2, uint32_t c3, const PhiloxKey& key,
                           uint32_t* __restrict w, int64_t ld) {
  const uint32_t k0 = key.k0, k1 = key.k1;
  int64_t i = 0;
#if defined(__AVX512F__)
  // 32 blocks per call (the 64-bit lanes' low halves packed by VPMOVQD), then AVX2's 8 for the rest
  for (; i + 8 * kGroups512 <= n; i += 8 * kGroups512) {
    __m512i x[4][kGroups512];
    philox512<WORDS>(b0 + (uint64_t)i * st, st, c2, c3, k0, k1, x[0], x[1], x[2], x[3]);
    for (int j = 0; j < 4; ++j)
      for (int g = 0; g < kGroups512; ++g)
        if (WORDS >> j & 1u)
        _mm256_storeu_si256((__m256i*)(w + j * ld + i + 8 * g), _mm512_cvtepi64_epi32(x[j][g]));
  }
#endif
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) philox256_strided8<WORDS>(b0 + (uint64_t)i * st, st, c2, c3, key, w + i, ld);
#elif defined(__SSE4_1__)
  constexpr int G = kGroups128Strided;  // 2 vectors: 4 blocks, one 128-bit store per word
  for (; i + 2 * G <= n; i += 2 * G) {
    __m128i x[4][G];
    philox128<G>(b0 + (uint64_t)i * st, st, c2, c3, k0, k1, x[0], x[1], x[2], x[3]);
    for (int j = 0; j < 4; ++j)
      if (WORDS >> j & 1u) _mm_storeu_si128((__m128i*)(w + j * ld + i), low_halves(x[j][0], x[j][1]));
  }
#elif defined(CPD_CPU_NEON)
  constexpr int G = 4;
  for (; i + 4 * G <= n; i += 4 * G) {
    uint32x4_t x[4][G];
    philox_neon<G>(b0 + (uint64_t)i * st, st, c2, c3, k0, k1, x);
    for (int j = 0; j < 4; ++j)
      if (WORDS >> j & 1u)
        for (int g = 0; g < G; ++g) vst1q_u32(w + j * ld + i + 4 * g, x[j][g]);
  }
#endif
  for (; i < n; ++i) {
    uint32_t w4[4];
    philox_one(b0 + (uint64_t)i * st, c2, c3, k0, k1, w4);
    for (int j = 0; j < 4; ++j)
      if (WORDS >> j & 1u) w[j * ld + i] = w4[j];
  }
}

inline void philox_strided(uint64_t b0, uint64_t st, int64_t n, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                           uint32_t* __restrict w, int64_t ld) {
  philox_strided(b0, st, n, c2, c3, philox_key(k0, k1), w, ld);
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_PHILOX_SIMD_H
