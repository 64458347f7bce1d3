// Exhaustive check of the fast cast path of cuda/include/cpd/numerics.h against the generic one
// (the specification): every one of the 2^32 float32 bit patterns, for each format below, each
// deterministic mode, saturate off and on. Also checks, on the same inputs:
//   * stochastic rounding, per element with the same random word: a hashed word, and the two
//     words on either side of the generic path's rounding threshold 2^32 - trunc(F) (F from
//     sr_fraction), so that the fast path's fraction must match bit for bit; sr_bits (1..32)
//     varies with the input;
//   * encode_value_bits_fast == encode_value_bits on every value a cast can return (the decoded
//     value of every code, and NaNs).
// cast_bits_fast_normal (region N only) is checked against the generic cast wherever
// |x| >= 2^emin, where cast.cpp may use it. NaN outputs compare equal when both are NaN.
// The "fast" side is cast_bits_fast when f.fast = 1 (as cuda/cpu/cast.cpp calls it), else
// cast_bits, which must then take the generic path; each format's f.fast is checked too
// (e8m10 with bias 140 has emin < -126 and must not take the fast path).
//
// Build and run from the repository root (about 15-25 minutes on 2 cores; the last case, on the
// generic path, does not vectorize):
//   g++ -O3 -march=native -ffp-contract=off -fno-fast-math -fopenmp -std=c++17 -I cuda/include
//       tests/cpp/exhaustive_fast_vs_generic.cpp -o /tmp/exhaustive && /tmp/exhaustive
// Exit status 0 when everything matches. SR_ONLY=1 in the environment runs only the stochastic
// check (and the encode check).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <omp.h>

#include "cpd/numerics.h"

using cpd::u32;
using cpd::u64;

struct Case {
  const char* name;
  int exp, man, bias, specials, subnormals;
  int expect_fast;
};

static const Case kCases[] = {
    {"e5m2 ieee", 5, 2, 15, cpd::SPECIALS_IEEE, 1, 1},
    {"e4m3 ieee", 4, 3, 7, cpd::SPECIALS_IEEE, 1, 1},
    {"e4m3 fn", 4, 3, 7, cpd::SPECIALS_FN, 1, 1},
    {"fp16 ieee", 5, 10, 15, cpd::SPECIALS_IEEE, 1, 1},
    {"bf16 ieee", 8, 7, 127, cpd::SPECIALS_IEEE, 1, 1},
    {"e3m0 ieee", 3, 0, 3, cpd::SPECIALS_IEEE, 1, 1},
    {"e2m1 b1 finite", 2, 1, 1, cpd::SPECIALS_FINITE, 1, 1},
    {"fp32 ieee", 8, 23, 127, cpd::SPECIALS_IEEE, 1, 1},
    {"e4m3 ieee nosub", 4, 3, 7, cpd::SPECIALS_IEEE, 0, 1},
    {"e3m2 b5 finite", 3, 2, 5, cpd::SPECIALS_FINITE, 1, 1},
    {"e8m10 b140 ieee", 8, 10, 140, cpd::SPECIALS_IEEE, 1, 0},
};

static inline u32 same(u32 a, u32 b) {
  u32 nan_a = (u32)((a & 0x7fffffffu) > cpd::INF_BITS), nan_b = (u32)((b & 0x7fffffffu) > cpd::INF_BITS);
  return (u32)(a == b) | (nan_a & nan_b);
}

static inline u32 hash32(u32 x) {  // a fixed mixer (lowbias32-style constants), only to vary words
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// sr_bits of input u: 1..32, from a hash of u, so that every truncation is exercised.
static inline int sr_bits_of(u32 h) { return (int)(h >> 27) + 1; }

constexpr u32 kChunk = 4096;  // inputs per task: the loops over a chunk vectorize

static void report(const char* what, const char* mode, u32 u, u32 g, u32 q) {
#pragma omp critical
  std::printf("  MISMATCH %s %s: x = 0x%08x (%g): generic 0x%08x (%g), fast 0x%08x (%g)\n", what, mode, u,
              cpd::float_of(u), g, cpd::float_of(g), q, cpd::float_of(q));
}

// Mismatches of a deterministic mode over all 2^32 inputs (the first of each chunk is printed).
template <int MODE, bool FAST>
static u64 check_det(const cpd::Format f, const char* what) {
  u64 bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t c = 0; c < (int64_t)((1ull << 32) / kChunk); ++c) {
    alignas(64) u32 g[kChunk], q[kChunk];
    const u32 base = (u32)c * kChunk;
    for (u32 k = 0; k < kChunk; ++k) g[k] = cpd::cast_bits_generic(base + k, f, MODE, 0u, 32);
    for (u32 k = 0; k < kChunk; ++k)
      q[k] = FAST ? cpd::cast_bits_fast(base + k, f, MODE, 0u, 32) : cpd::cast_bits(base + k, f, MODE, 0u, 32);
    u32 nb = 0;
    for (u32 k = 0; k < kChunk; ++k) nb += same(g[k], q[k]) ^ 1u;
    if (FAST) {  // cast_bits_fast_normal, wherever |x| >= 2^emin
      for (u32 k = 0; k < kChunk; ++k) q[k] = cpd::cast_bits_fast_normal(base + k, f, MODE, 0u, 32);
      for (u32 k = 0; k < kChunk; ++k) nb += (same(g[k], q[k]) ^ 1u) & (u32)(((base + k) & 0x7fffffffu) >= f.min_normal_bits);
    }
    if (nb) {
      for (u32 k = 0; k < kChunk; ++k)
        if (!same(g[k], q[k])) {
          report(what, MODE == cpd::NEAREST ? "nearest" : MODE == cpd::TOWARD_ZERO ? "toward_zero"
                       : MODE == cpd::UP ? "up" : "down", base + k, g[k], q[k]);
          break;
        }
    }
    bad += nb;
  }
  return bad;
}

// Stochastic rounding: three words per input (a hashed one and the two either side of the
// generic threshold), sr_bits from the input's hash.
template <bool FAST>
static u64 check_sr(const cpd::Format f, const char* what) {
  u64 bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t c = 0; c < (int64_t)((1ull << 32) / kChunk); ++c) {
    alignas(64) u32 w[3][kChunk], g[kChunk], q[kChunk];
    alignas(64) int bits[kChunk];
    const u32 base = (u32)c * kChunk;
    for (u32 k = 0; k < kChunk; ++k) {
      u32 u = base + k, h = hash32(u);
      int sb = sr_bits_of(h);
      cpd::Split s = cpd::split(u & 0x7fffffffu, f);
      u32 fm = cpd::sr_fraction(s) & (~0u << (32 - sb));
      u32 thr = 0u - fm;  // the smallest masked word that rounds up (0 when fm = 0: never)
      bits[k] = sb;
      w[0][k] = hash32(h ^ 0x9e3779b9u);
      w[1][k] = thr;
      w[2][k] = thr - (1u << (32 - sb));
    }
    u32 nb = 0;
    for (int j = 0; j < 3; ++j) {
      for (u32 k = 0; k < kChunk; ++k) g[k] = cpd::cast_bits_generic(base + k, f, cpd::STOCHASTIC, w[j][k], bits[k]);
      for (u32 k = 0; k < kChunk; ++k)
        q[k] = FAST ? cpd::cast_bits_fast(base + k, f, cpd::STOCHASTIC, w[j][k], bits[k])
                    : cpd::cast_bits(base + k, f, cpd::STOCHASTIC, w[j][k], bits[k]);
      u32 nj = 0;
      for (u32 k = 0; k < kChunk; ++k) nj += same(g[k], q[k]) ^ 1u;
      if (FAST) {
        for (u32 k = 0; k < kChunk; ++k) q[k] = cpd::cast_bits_fast_normal(base + k, f, cpd::STOCHASTIC, w[j][k], bits[k]);
        for (u32 k = 0; k < kChunk; ++k)
          nj += (same(g[k], q[k]) ^ 1u) & (u32)(((base + k) & 0x7fffffffu) >= f.min_normal_bits);
      }
      if (nj)
        for (u32 k = 0; k < kChunk; ++k)
          if (!same(g[k], q[k])) {
            report(what, "stochastic", base + k, g[k], q[k]);
            break;
          }
      nb += nj;
    }
    bad += nb;
  }
  return bad;
}

// encode_value_bits_fast against encode_value_bits on every value a cast can return: the decoded
// value of every code (±0, subnormals, normals, ±max, ±inf, NaN) and NaNs with other payloads.
static u64 check_encode(const cpd::Format f, const char* what) {
  const int nbits = 1 + f.exp + f.man;
  const u64 ncodes = 1ull << nbits;
  u64 bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t c = 0; c < (int64_t)ncodes; ++c) {
    u32 v = cpd::decode_bits((u32)c, f);
    u32 g = cpd::encode_value_bits(v, f), q = cpd::encode_value_bits_fast(v, f);
    if (g != q) {
      if (bad == 0) report(what, "encode", v, g, q);
      ++bad;
    }
  }
  const u32 nans[4] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu};
  for (u32 v : nans) bad += cpd::encode_value_bits(v, f) != cpd::encode_value_bits_fast(v, f);
  return bad;
}

template <bool FAST>
static u64 check_all(const cpd::Format f, const char* what, u64* sr_bad) {
  const bool sr_only = getenv("SR_ONLY") != nullptr;  // only the stochastic check (a third of the time)
  double t0 = omp_get_wtime();
  u64 bad = sr_only ? 0 : check_det<cpd::NEAREST, FAST>(f, what);
  double t1 = omp_get_wtime();
  if (!sr_only)
    bad += check_det<cpd::TOWARD_ZERO, FAST>(f, what) + check_det<cpd::UP, FAST>(f, what) +
           check_det<cpd::DOWN, FAST>(f, what);
  double t2 = omp_get_wtime();
  *sr_bad = check_sr<FAST>(f, what);
  if (getenv("TIMING")) printf("nearest %.1fs, 3 directed %.1fs, sr %.1fs\n", t1 - t0, t2 - t1, omp_get_wtime() - t2);
  return bad;
}

int main() {
  u64 total_bad = 0;
  double t0 = omp_get_wtime();
  for (const Case& c : kCases) {
    for (int sat = 0; sat <= 1; ++sat) {
      cpd::Format f = cpd::make_format(c.exp, c.man, c.bias, c.specials, c.subnormals, sat);
      char what[96];
      std::snprintf(what, sizeof what, "%s sat=%d", c.name, sat);
      if (f.fast != c.expect_fast) {
        std::printf("  %s: fast = %d, expected %d\n", what, f.fast, c.expect_fast);
        ++total_bad;
      }
      // The "fast" side: cast_bits_fast when f.fast (as cast.cpp calls it), else cast_bits, which
      // must then take the generic path.
      u64 sr = 0, bad = f.fast ? check_all<true>(f, what, &sr) : check_all<false>(f, what, &sr);
      u64 enc = (f.fast && sat == 0) ? check_encode(f, what) : 0;  // encode ignores saturate
      std::printf("%-22s fast=%d  cast mismatches: %llu  stochastic: %llu  encode: %llu  (%.0f s)\n", what,
                  f.fast, (unsigned long long)bad, (unsigned long long)sr, (unsigned long long)enc,
                  omp_get_wtime() - t0);
      std::fflush(stdout);
      total_bad += bad + sr + enc;
    }
  }
  std::printf("%s: %llu mismatches (2^32 inputs x 4 deterministic modes + 3 stochastic words, %d cases)\n",
              total_bad ? "FAIL" : "PASS", (unsigned long long)total_bad,
              (int)(sizeof kCases / sizeof kCases[0]) * 2);
  return total_bad ? 1 : 0;
}
