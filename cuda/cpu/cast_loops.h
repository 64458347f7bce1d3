// The per-thread loops of the CPU cast (cuda/cpu/cast.cpp splits a call into ranges with
// cpd_cpu::parallel_for and runs one of these on each). Torch-free, so that tests/cpp and a
// benchmark harness can include them directly.
//
// Three choices per call, none of which changes a bit of the result:
//   * PLAIN: the format's conventions are the common ones (signed, a zero of each sign, no
//     "no zero", subnormals on, 1 <= man <= 22): the loops run on a local copy of the format
//     whose convention fields hold those values as compile-time constants (plain_format), so
//     that convention_bits' and finish_cast's selects for them fold away (the loop of E5M2
//     nearest goes from 55 to 24 AVX2 instructions per 8 elements). The same numerics
//     functions on the same values.
//   * STREAM: outputs of at least stream_min_bytes() are written with non-temporal (streaming)
//     stores (stream_store.h): each span of results is formed in an L1 buffer, then stored by
//     stream_out; each range ends with stream_fence(), so the results are globally visible
//     before parallel_for returns.
//   * Stochastic rounding: the Philox words of one vector Philox call (kPhiloxCallBlocks blocks)
//     go to a small buffer and the cast of their elements reads them at once: the Philox work
//     overlaps the loads and stores (cast_sr_range).
#ifndef CPD_CPU_CAST_LOOPS_H
#define CPD_CPU_CAST_LOOPS_H

#include <algorithm>
#include <cstdint>

#include "cpd/numerics.h"
#include "philox_simd.h"
#include "plain_format.h"  // plain_lane_format, plain_lanes, mantissa_lanes
#include "stream_store.h"  // use_stream, stream_out, stream_fence

namespace cpd_cpu {

// ------------------------------------------------------------------------------------------
// The format's conventions as constants (PLAIN).
inline bool plain_format_applies(const cpd::Format& f) {
  return f.fast && plain_lane_format(f) && f.man >= 1 && f.man <= 22;
}

// f with the fields plain_format_applies checked set to those constants (plain_lanes, and the two
// that follow from 1 <= man <= 22: mantissa_lanes), so that the compiler folds them.
inline cpd::Format plain_format(const cpd::Format& f) { return mantissa_lanes(plain_lanes(f)); }

template <bool PLAIN>
inline cpd::Format loop_format(const cpd::Format& f) {
  return PLAIN ? plain_format(f) : f;
}

// ------------------------------------------------------------------------------------------
// The cast.
constexpr int64_t kSpan = 1024;  // elements of a span (4 KiB of results: stays in L1)

// Always inlined: out of line (GCC's choice in the OpenMP build's encode loop) it took `mode` as a
// run-time argument, held every mode's code, and ran one call per element: 16 ns per element
// instead of 0.9 (encode e5m2 nearest, AVX2, 28 Nov 2026).
template <bool FAST>
inline __attribute__((always_inline)) uint32_t cast_one(uint32_t u, const cpd::Format& f, int mode, uint32_t rand,
                                                        int sr_bits) {
  return FAST ? cpd::cast_bits_fast(u, f, mode, rand, sr_bits) : cpd::cast_bits_generic(u, f, mode, rand, sr_bits);
}

// Whether any of xb[0, m) lies in region S (|x| < 2^emin: a = bits & ~SIGN below min_normal_bits).
// Both are below 2^31, so a - min_normal_bits (mod 2^32) has its top bit set exactly when
// a < min_normal_bits: an and, a subtract and an or per element (the unsigned compare took five
// AVX2 instructions per 8 elements).
inline bool span_has_sub(const float* xb, int64_t m, const cpd::Format& g) {
  uint32_t any = 0;
  for (int64_t i = 0; i < m; ++i) any |= (cpd::bits_of(xb[i]) & ~cpd::SIGN) - g.min_normal_bits;
  return (any >> 31) != 0;
}

// Whether any of xb[0, m) is an inf or NaN (a = bits & ~SIGN at least INF_BITS): INF_BITS - 1 - a
// (mod 2^32) has its top bit set exactly then, as in span_has_sub.
inline bool span_has_special(const float* xb, int64_t m) {
  uint32_t any = 0;
  for (int64_t i = 0; i < m; ++i) any |= (cpd::INF_BITS - 1u) - (cpd::bits_of(xb[i]) & ~cpd::SIGN);
  return (any >> 31) != 0;
}

// A span of at most a few thousand elements (it stays in L1) on the fast path, for the modes
// whose region S (|x| < 2^emin, cpd::round_sub_fast) costs a dozen float operations per element:
// first a scan of the span for any element in region S, then either the cheap region-N cast of
// every element (none there) or the full fast cast. Data that rarely comes near the format's
// subnormals (most of it for bf16 and fp16, much of it for fp8) skips region S's work; a span
// with a region-S element costs the full cast plus the scan. The scan comes first, and each
// element is read before it is written, so that an in-place cast (xb == yb) stays correct.
// words: the random words of the span's elements (STOCHASTIC), else unused.
template <int MODE>
inline void cast_span_fast(const float* xb, float* yb, int64_t m, const cpd::Format& g,
                           const uint32_t* __restrict words, int sr_bits) {
  if (span_has_sub(xb, m, g)) {
    for (int64_t i = 0; i < m; ++i) {
      uint32_t w = MODE == cpd::STOCHASTIC ? words[i] : 0u;
      yb[i] = cpd::float_of(cpd::cast_bits_fast(cpd::bits_of(xb[i]), g, MODE, w, sr_bits));
    }
  } else {
    for (int64_t i = 0; i < m; ++i) {
      uint32_t w = MODE == cpd::STOCHASTIC ? words[i] : 0u;
      yb[i] = cpd::float_of(cpd::cast_bits_fast_normal(cpd::bits_of(xb[i]), g, MODE, w, sr_bits));
    }
  }
}

// The elements [lo, hi) of a deterministic cast. Nearest, and every mode on the generic path:
// one straight loop; directed modes on the fast path: spans (cast_span_fast). STREAM: each span
// formed in buf, then stream_out.
template <int MODE, bool FAST, bool PLAIN, bool STREAM>
void cast_det_range(const float* x, float* y, int64_t lo, int64_t hi, const cpd::Format& f) {
  const cpd::Format g = loop_format<PLAIN>(f);  // a local copy the vectorizer keeps in registers
  if (!STREAM && !(FAST && MODE != cpd::NEAREST)) {
    for (int64_t i = lo; i < hi; ++i) y[i] = cpd::float_of(cast_one<FAST>(cpd::bits_of(x[i]), g, MODE, 0u, 32));
    return;
  }
  alignas(64) float buf[STREAM ? kSpan : 1];
  for (int64_t s = lo; s < hi; s += kSpan) {
    const int64_t m = std::min(kSpan, hi - s);
    float* dst = STREAM ? buf : y + s;
    if (FAST && MODE != cpd::NEAREST) {
      cast_span_fast<MODE>(x + s, dst, m, g, nullptr, 32);
    } else {
      const float* __restrict xs = x + s;
      float* __restrict ds = dst;
      for (int64_t i = 0; i < m; ++i) ds[i] = cpd::float_of(cast_one<FAST>(cpd::bits_of(xs[i]), g, MODE, 0u, 32));
    }
    if (STREAM) stream_out(y + s, buf, m);
  }
  if (STREAM) stream_fence();
}

// ------------------------------------------------------------------------------------------
// Stochastic rounding: one Philox call serves four consecutive elements (block i >> 2).
// cpd_cpu::philox_blocks (philox_simd.h: AVX-512, AVX2, SSE4.1 or NEON lanes, else scalar) writes
// the words of nb blocks in element order, words[4k + j] = random_word(4 (b0 + k) + j): the
// words of cpd::philox4x32_10, bit for bit.
//
// Fused: the words are drawn one vector Philox call at a time (kPhiloxCallBlocks blocks: 32 on
// AVX-512, 8 on AVX2, 6 on SSE4.1, 16 on NEON) into a buffer of a few hundred bytes, and the
// elements of those blocks are cast at once, reading them back from the store buffer / L1. Each
// step's integer Philox work (multiplies, shifts, xors) is then a few hundred instructions from
// the loads, casts and stores of its elements, inside the out-of-order window, so that the two
// overlap; words drawn for a whole span first and cast after (the loop before this one) ran the
// Philox work with no memory traffic in flight, and the two costs added up.
//
// With this much integer work per cache line of x (some 130 vector instructions per 16 elements
// on AVX2), the out-of-order window reaches only a line or two ahead, so a load that misses
// waits out the whole memory latency; the hardware prefetchers cover most of a stream but stop
// at each 4 KiB page. Each call therefore prefetches the lines of x kSrPrefetch elements ahead
// (measured at 2^24 floats on Zen 3: 0.87-0.95x the time without it).
constexpr int64_t kSrBlocks = 96;  // blocks per span: 384 elements (a multiple of every kPhiloxCallBlocks)
static_assert(kSrBlocks % kPhiloxCallBlocks == 0, "a span is whole Philox calls");
constexpr int64_t kSrPrefetch = 1024;  // elements (4 KiB) between the lines cast and those prefetched

// dst[i] = the stochastic cast of xb[i] with words[i], i < m (FAST: SUB says whether the span
// has an element in region S, cast_span_fast; else the generic cast). xb and dst may be the same
// array (an in-place cast): no __restrict on them.
template <bool FAST, bool SUB>
inline void cast_sr_words(const float* xb, float* dst, int64_t m, const cpd::Format& g,
                          const uint32_t* __restrict words, int sr_bits) {
  for (int64_t i = 0; i < m; ++i) {
    const uint32_t u = cpd::bits_of(xb[i]);
    dst[i] = cpd::float_of(!FAST ? cpd::cast_bits_generic(u, g, cpd::STOCHASTIC, words[i], sr_bits)
                           : SUB ? cpd::cast_bits_fast(u, g, cpd::STOCHASTIC, words[i], sr_bits)
                                 : cpd::cast_bits_fast_normal(u, g, cpd::STOCHASTIC, words[i], sr_bits));
  }
}

// The blocks [b0, b0 + nb) of a span, a Philox call's blocks at a time, software-pipelined: the
// words of the next call are drawn before the cast of this one's elements, so that the cast (whose
// words are ready) runs beside the next call's chain of dependent rounds instead of waiting for
// its own (2-3% fewer cycles per element in cache on Zen 3, AVX2). pf: where the span's
// prefetches start (pf[0, 4 nb) lies inside x). A whole call (the span's body) casts a constant
// count (no remainder loop). The loop format is
// made here, from f (PLAIN: loop_format), so that its constants fold whether or not the compiler
// inlines this function into cast_sr_range (a shared out-of-line copy taking the format by
// reference ran every convention select: measured 3.0-3.5x a copy instead of 2.0x).
template <bool FAST, bool PLAIN, bool SUB>
inline void cast_sr_span(const float* xb, float* dst, const float* pf, uint64_t b0, int64_t nb, const cpd::Format& f,
                         int sr_bits, uint32_t c2, uint32_t c3, const PhiloxKey& key) {
  const cpd::Format g = loop_format<PLAIN>(f);
  constexpr int64_t C = kPhiloxCallBlocks;
  alignas(64) uint32_t words[2][4 * C];
  const int64_t calls = nb / C;  // whole calls, then a partial one
  if (calls > 0) philox_blocks(b0, C, c2, c3, key, words[0]);
  for (int64_t c = 0; c < calls; ++c) {
    const int64_t k = c * C;
    for (int64_t i = 0; i < 4 * C; i += 16) __builtin_prefetch(pf + 4 * k + i, 0, 3);  // a line each
    if (c + 1 < calls) philox_blocks(b0 + (uint64_t)(k + C), C, c2, c3, key, words[(c + 1) & 1]);
    cast_sr_words<FAST, SUB>(xb + 4 * k, dst + 4 * k, 4 * C, g, words[c & 1], sr_bits);
  }
  const int64_t k = calls * C;
  if (k < nb) {
    philox_blocks(b0 + (uint64_t)k, nb - k, c2, c3, key, words[0]);
    cast_sr_words<FAST, SUB>(xb + 4 * k, dst + 4 * k, 4 * (nb - k), g, words[0], sr_bits);
  }
}

// The blocks [blo, bhi) of a stochastic cast of n elements, kSrBlocks blocks (a span) at a time:
// on the fast path a scan of the span for region S first (cast_span_fast's choice), then
// cast_sr_span; the last, partial block (n % 4 elements) one element at a time. The scan reads
// the span before any of it is written (an in-place cast stays correct: each element is read
// before it is written in the cast too).
template <bool FAST, bool PLAIN, bool STREAM>
void cast_sr_range(const float* x, float* y, int64_t n, int64_t blo, int64_t bhi, const cpd::Format& f, int sr_bits,
                   uint64_t seed, uint64_t offset) {
  const cpd::Format g = loop_format<PLAIN>(f);
  const PhiloxKey key = philox_key((uint32_t)seed, (uint32_t)(seed >> 32));
  const uint32_t c2 = (uint32_t)offset, c3 = (uint32_t)(offset >> 32);
  const int64_t full_hi = std::min(bhi, n / 4);
  alignas(64) float buf[STREAM ? 4 * kSrBlocks : 1];
  for (int64_t b0 = blo; b0 < full_hi; b0 += kSrBlocks) {
    const int64_t nb = std::min(kSrBlocks, full_hi - b0);
    const float* xb = x + 4 * b0;
    float* dst = STREAM ? buf : y + 4 * b0;
    const bool any_sub = FAST && span_has_sub(xb, 4 * nb, g);
    const float* pf = 4 * (b0 + nb) + kSrPrefetch <= 4 * full_hi ? xb + kSrPrefetch : xb;  // at the end: the span
    if (FAST && !any_sub) cast_sr_span<FAST, PLAIN, false>(xb, dst, pf, (uint64_t)b0, nb, f, sr_bits, c2, c3, key);
    else cast_sr_span<FAST, PLAIN, true>(xb, dst, pf, (uint64_t)b0, nb, f, sr_bits, c2, c3, key);
    if (STREAM) stream_out(y + 4 * b0, buf, 4 * nb);
  }
  if (STREAM) stream_fence();
  for (int64_t i = std::max(4 * full_hi, 4 * blo); i < std::min(4 * bhi, n); ++i) {  // the tail block
    uint32_t r = cpd::random_word((uint64_t)i, seed, offset);
    y[i] = cpd::float_of(cast_one<FAST>(cpd::bits_of(x[i]), g, cpd::STOCHASTIC, r, sr_bits));
  }
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_CAST_LOOPS_H
