// CPU loops over the core's exact arithmetic: elementwise mul/add/fma rounded once to a format.
// Bound into the extension module by cast.cpp. Every loop gives the generic loop's bits (mul_bits,
// add_bits, fma_bits element by element; `path` 1 forces it, for the tests):
//   * round to nearest, adds whose operands are all values of the format (add_fast_applies): the
//     float32 sum, cast (add_nearest_fast);
//   * round to nearest otherwise, and stochastic rounding to formats of man <= 19: float64 lanes
//     (accumulate.h's FormatD forms, as the matmul's float64 lanes): the exact product of two
//     float32 values is a double, a sum is rounded to odd at 53 bits (add_odd), then round_d /
//     round_d_sr; the stochastic words drawn for a span at once (philox_blocks);
//   * toward zero, up and down for formats of cpd::directed_lane_applies: the float32 operation in
//     the processor's own rounding direction (fp_env.h DirectedRounding), then cpd::directed_lane
//     (accumulate.h, "Directed lanes");
//   * the generic loop for the rest (nearest_away, odd; stochastic to man > 19; FNUZ, P3109 ...).
// The fast loops form a span's results in a buffer, redo its NaN results by the generic functions
// (their payloads), then write it out, so that out may alias an operand.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "cpd/numerics.h"
#include "fp_env.h"
#include "parallel.h"
#include "philox_simd.h"
#include "plain_format.h"

namespace {

constexpr int64_t kArithGrain = 1 << 14;
constexpr int64_t kArithSpan = 1024;  // elements per buffer (a multiple of 4: whole Philox blocks)

enum { OP_MUL = 0, OP_ADD = 1, OP_FMA = 2 };

// Element i by the generic functions (word: its stochastic word).
template <int OP>
inline float arith_one(const float* a, const float* b, const float* c, int64_t i, const cpd::Format& f, int mode,
                       uint32_t word, int sr_bits) {
  const uint32_t ua = cpd::bits_of(a[i]), ub = cpd::bits_of(b[i]);
  if (OP == OP_MUL) return cpd::float_of(cpd::mul_bits(ua, ub, f, mode, word, sr_bits));
  if (OP == OP_ADD) return cpd::float_of(cpd::add_bits(ua, ub, f, mode, word, sr_bits));
  return cpd::float_of(cpd::fma_bits(cpd::bits_of(c[i]), ua, ub, f, mode, word, sr_bits));
}

// The exact operation on doubles, rounded to odd at 53 bits where it is a sum (accumulate.h).
template <int OP>
inline double arith_odd(float a, float b, float c) {
  const double p = (double)a * (double)b;  // exact: 48 significant bits
  if (OP == OP_MUL) return p;
  if (OP == OP_ADD) return cpd::add_odd((double)a, (double)b);
  return cpd::add_odd(p, (double)c);
}

// The span [s0, s1) from buf (its results), NaN results redone by the generic functions first.
template <int OP>
inline void arith_finish(const float* a, const float* b, const float* c, float* y, float* buf, int64_t s0, int64_t s1,
                         const cpd::Format& f, int mode, const uint32_t* words, int64_t w0, int sr_bits) {
  uint32_t nan = 0u;
  for (int64_t i = s0; i < s1; ++i) nan |= (uint32_t)(buf[i - s0] != buf[i - s0]);
  if (nan)
    for (int64_t i = s0; i < s1; ++i)
      if (buf[i - s0] != buf[i - s0]) buf[i - s0] = arith_one<OP>(a, b, c, i, f, mode, words ? words[i - w0] : 0u, sr_bits);
  std::memcpy(y + s0, buf, sizeof(float) * (size_t)(s1 - s0));
}

// The span [s0, s0 + m) (m <= kArithSpan) to nearest on float64 lanes (g = make_format_d(f)).
template <int OP>
inline void nearest_d_span(const float* a, const float* b, const float* c, float* y, int64_t s0, int64_t m,
                           const cpd::FormatD& g, const cpd::Format& f) {
  alignas(64) float buf[kArithSpan];
  for (int64_t i = 0; i < m; ++i)
    buf[i] = (float)cpd::round_d(arith_odd<OP>(a[s0 + i], b[s0 + i], OP == OP_FMA ? c[s0 + i] : 0.0f), g);
  arith_finish<OP>(a, b, c, y, buf, s0, s0 + m, f, cpd::NEAREST, nullptr, 0, 32);
}

// Round to nearest, any format: float64 lanes.
template <int OP>
void arith_nearest_d(const float* a, const float* b, const float* c, float* y, int64_t n, const cpd::Format f) {
  cpd_cpu::parallel_for(0, n, kArithGrain, [&](int64_t lo, int64_t hi) {
    const cpd::FormatD g = cpd::make_format_d(f);
    for (int64_t s0 = lo; s0 < hi; s0 += kArithSpan) nearest_d_span<OP>(a, b, c, y, s0, std::min(hi - s0, kArithSpan), g, f);
  });
}

// Stochastic rounding to a format of man <= 19: float64 lanes, element i's word random_word(i).
template <int OP>
void arith_sr_d(const float* a, const float* b, const float* c, float* y, int64_t n, const cpd::Format f,
                int sr_bits, uint64_t seed, uint64_t offset) {
  const cpd_cpu::PhiloxKey key = cpd_cpu::philox_key((uint32_t)seed, (uint32_t)(seed >> 32));
  cpd_cpu::parallel_for(0, n, kArithGrain, [&](int64_t lo, int64_t hi) {
    cpd::FormatD g = cpd::make_format_d(f);
    g.sr_mask = (0xffffffffull << (32 - sr_bits)) & 0xffffffffull;
    alignas(64) float buf[kArithSpan];
    alignas(64) uint32_t words[kArithSpan + 4 * cpd_cpu::kPhiloxCallBlocks];
    for (int64_t s0 = lo; s0 < hi; s0 += kArithSpan) {
      const int64_t m = std::min(hi - s0, kArithSpan);
      const int64_t b0 = s0 >> 2, w0 = 4 * b0;  // the blocks holding elements s0 .. s0 + m
      cpd_cpu::philox_blocks((uint64_t)b0, ((s0 + m + 3) >> 2) - b0, (uint32_t)offset, (uint32_t)(offset >> 32), key,
                             words);
      const uint32_t* w = words + (s0 - w0);
      for (int64_t i = 0; i < m; ++i)
        buf[i] = (float)cpd::round_d_sr(arith_odd<OP>(a[s0 + i], b[s0 + i], OP == OP_FMA ? c[s0 + i] : 0.0f), g, w[i]);
      arith_finish<OP>(a, b, c, y, buf, s0, s0 + m, f, cpd::STOCHASTIC, words, w0, sr_bits);
    }
  });
}

// Toward zero, up or down (cpd::directed_lane_applies): the span's float32 operations in the
// processor's rounding direction, out of line (fp_env.h), then directed_lane.
template <int OP, int MODE>
__attribute__((noinline)) void arith_dir_span(const float* __restrict a, const float* __restrict b,
                                              const float* __restrict c, float* __restrict buf, int64_t m,
                                              const cpd::Format f) {
  for (int64_t i = 0; i < m; ++i) {
    const float r = OP == OP_MUL ? cpd::fmul(a[i], b[i]) : OP == OP_ADD ? cpd::fadd(a[i], b[i])
                                                                         : cpd_cpu::fma_current(a[i], b[i], c[i]);
    buf[i] = cpd::float_of(cpd::directed_lane<MODE>(cpd::bits_of(r), f));
  }
}

template <int OP, int MODE>
void arith_dir(const float* a, const float* b, const float* c, float* y, int64_t n, const cpd::Format f) {
  cpd_cpu::parallel_for(0, n, kArithGrain, [&](int64_t lo, int64_t hi) {
    const bool plain = cpd_cpu::plain_lane_format(f);
    const cpd::Format h = plain ? cpd_cpu::plain_lanes(f) : f;
    alignas(64) float buf[kArithSpan];
    for (int64_t s0 = lo; s0 < hi; s0 += kArithSpan) {
      const int64_t m = std::min(hi - s0, kArithSpan);
      {
        cpd_cpu::DirectedRounding dir(MODE);
        arith_dir_span<OP, MODE>(a + s0, b + s0, OP == OP_FMA ? c + s0 : a + s0, buf, m, h);
      }
      arith_finish<OP>(a, b, c, y, buf, s0, s0 + m, f, MODE, nullptr, 0, 32);
    }
  });
}

template <int OP>
void arith_dir_mode(const float* a, const float* b, const float* c, float* y, int64_t n, const cpd::Format f,
                    int mode) {
  if (mode == cpd::UP) arith_dir<OP, cpd::UP>(a, b, c, y, n, f);
  else if (mode == cpd::DOWN) arith_dir<OP, cpd::DOWN>(a, b, c, y, n, f);
  else arith_dir<OP, cpd::TOWARD_ZERO>(a, b, c, y, n, f);
}

// The generic loop: element by element (out may alias an operand: each element is read first).
template <int OP>
void arith_loop(const float* a, const float* b, const float* c, float* y, int64_t n, const cpd::Format f, int mode,
                int sr_bits, uint64_t seed, uint64_t offset) {
  cpd_cpu::parallel_for(0, n, kArithGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;
    for (int64_t i = lo; i < hi; ++i) {
      uint32_t r = mode == cpd::STOCHASTIC ? cpd::random_word((uint64_t)i, seed, offset) : 0u;
      y[i] = arith_one<OP>(a, b, c, i, g, mode, r, sr_bits);
    }
  });
}

// Which loop (see the top of this file); path 1: the generic loop.
template <int OP>
void arith_dispatch(const float* a, const float* b, const float* c, float* y, int64_t n, const cpd::Format& f,
                    int mode, int sr_bits, uint64_t seed, uint64_t offset, int64_t path) {
  if (path != 1 && mode == cpd::NEAREST) return arith_nearest_d<OP>(a, b, c, y, n, f);
  if (path != 1 && mode == cpd::STOCHASTIC && f.man <= 19) return arith_sr_d<OP>(a, b, c, y, n, f, sr_bits, seed, offset);
  if (path != 1 && cpd_cpu::kDirectedRounding && cpd::directed_lane_applies(f, mode))
    return arith_dir_mode<OP>(a, b, c, y, n, f, mode);
  arith_loop<OP>(a, b, c, y, n, f, mode, sr_bits, seed, offset);
}

// add_bits on spans: when every element of a span has both operands in the format, the fast
// identity of add_bits_fast holds and the span takes the float32 loop; otherwise the float64
// lanes. The operands are checked before anything is written (out may alias a or b).
void add_nearest_fast(const float* a, const float* b, float* y, int64_t n, const cpd::Format f) {
  cpd_cpu::parallel_for(0, n, kArithGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;
    const cpd::FormatD gd = cpd::make_format_d(f);
    for (int64_t s0 = lo; s0 < hi; s0 += kArithSpan) {
      const int64_t s1 = std::min(hi, s0 + kArithSpan);
      // (a few elements first: operands that are not values of the format, the general case, skip
      // the span's scan; either loop gives the same bits)
      const int64_t probe = std::min<int64_t>(s1 - s0, 8);
      uint32_t all = 1;
      for (int64_t i = s0; i < s0 + probe; ++i) all &= cpd::add_fast_operands(cpd::bits_of(a[i]), cpd::bits_of(b[i]), g);
      if (all)
        for (int64_t i = s0 + probe; i < s1; ++i) all &= cpd::add_fast_operands(cpd::bits_of(a[i]), cpd::bits_of(b[i]), g);
      if (all) {
        for (int64_t i = s0; i < s1; ++i) y[i] = cpd::float_of(cpd::add_bits_fast(cpd::bits_of(a[i]), cpd::bits_of(b[i]), g));
      } else {
        nearest_d_span<OP_ADD>(a, b, nullptr, y, s0, s1 - s0, gd, g);
      }
    }
  });
}

}  // namespace

// out = round(a * b), round(a + b) or round(c + a * b); contiguous float32 tensors of one shape.
// path: 0 the fastest loop that applies, 1 the generic loop (for the tests).
void arith_out(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
               at::Tensor& out, int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals,
               int64_t mode, bool saturate, int64_t sr_bits, int64_t seed, int64_t offset, int64_t path) {
  const cpd::Format f = cpd::make_format((int)exp, (int)man, (int)bias, (int)specials, subnormals ? 1 : 0,
                                         saturate ? 1 : 0);
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  const float* cp = op == OP_FMA ? c.data_ptr<float>() : nullptr;
  float* yp = out.data_ptr<float>();
  const int64_t n = out.numel();
  const uint64_t s = (uint64_t)seed, o = (uint64_t)offset;
  switch (op) {
    case OP_MUL: arith_dispatch<OP_MUL>(ap, bp, cp, yp, n, f, (int)mode, (int)sr_bits, s, o, path); break;
    case OP_ADD:
      if (path != 1 && cpd::add_fast_applies(f, (int)mode)) add_nearest_fast(ap, bp, yp, n, f);
      else arith_dispatch<OP_ADD>(ap, bp, cp, yp, n, f, (int)mode, (int)sr_bits, s, o, path);
      break;
    case OP_FMA: arith_dispatch<OP_FMA>(ap, bp, cp, yp, n, f, (int)mode, (int)sr_bits, s, o, path); break;
    default: TORCH_CHECK(false, "cpd: unknown arithmetic op ", op);
  }
}
