// The CPU extension's vector helpers against the numerics core, without torch, so that every ISA
// level (and Arm, through a cross compiler and qemu-aarch64 where installed) can be checked in
// seconds (tests/test_isa_levels.py builds and runs it):
//   * cuda/cpu/philox_simd.h: philox_blocks (element order) and philox_strided (one run per
//     word) give cpd::philox4x32_10's words bit for bit: block numbers crossing 2^32, strides
//     1..2^33, every count 0..70 (full vectors and scalar tails), keys and offsets with high bits;
//     philox_strided<WORDS> (the stochastic matmul's) the same for the words in each of the 15
//     masks, and nothing written for the others;
//   * cuda/cpu/matmul_f32.h's binary16 rounding by conversion (AccH: F16C, FCVT) equals
//     cpd::cast_bits_generic to IEEE binary16, round to nearest, on every float32 value whose
//     top 16 bits are anything and low bits are a few patterns (ties, near-ties, subnormals,
//     overflow, infinities; NaN compared as NaN);
//   * the stochastic cast with its Philox words drawn in the cast loop (cast_loops.h
//     cast_sr_range, every PLAIN / STREAM / FAST combination that applies) equals cpd::cast_bits
//     with random_word(i, seed, offset) element by element: lengths 0..67 and a few spans long,
//     inputs and outputs at float offsets 0..3 of an aligned buffer, the blocks split between two
//     ranges as two threads split them, IEEE, FN, FNUZ, unsigned P3109, E8M0, no-subnormal,
//     man = 0 and a generic-path format;
//   * the integer-lane rounding (AccI, round_lane_i) equals cast_bits_generic for BF16 and FP16
//     on the same values;
//   * Kahan's step on guarded lanes (kahan_guarded_lanes, round_lane_guarded) equals Kahan's step
//     with cpd::add_bits (the exact sum, rounded once) on every lane, step after step, for sums
//     inside the guard: random values of the format at spread magnitudes, ties, zeros of both
//     signs and the format's subnormals, for (6,7), BF16, FP16, E4M3 and an FN format;
//   * the matmul's register chains (matmul_chain.h, matmul_h16.h, matmul_fchain.h), output by
//     output, equal the generic steps in k order (fma_bits, or mul_bits then add_bits): binary32
//     FMA chain; E5M2 products into FP16 (general: infinities, NaN, products past E5M2's range;
//     and bounded), E4M3 into FP32 (SumB32), bounded E5M2 into BF16 (SumI); the fused narrow chain
//     into BF16 and TF32, also on 4-bit significands whose sums land on midpoints (fchain_fix).
//     Full register tiles and remainders, a full column panel and a partial one; products planted
//     just above E5M2 midpoints whose float32 product is the midpoint (an unfused product fails).
//   * the directed lanes' roundings (accumulate.h, "Directed lanes"): cpd::directed_lane run with
//     the processor rounding in each direction (fp_env.h DirectedRounding) equals
//     cast_bits_generic in the lane's mode, and directed_lane_bits equals it for BF16 and TF32, on
//     random float32 values, the formats' subnormal ranges densely, their grid points and the
//     values one float32 step either side, zeros and infinities, both signs (not in the SIMDe
//     build, whose intrinsics stand in for the processor's control register).
// On a host without AVX-512, tests/test_isa_compile.py also builds it with the AVX-512 paths and
// SIMDe's portable intrinsics (tests/cpp/simde_avx512/immintrin.h).
// Build and run from the repository root, e.g.
//   g++ -std=c++17 -O2 -march=x86-64-v3 -ffp-contract=off -fno-fast-math -I cuda/include -I cuda/cpu \
//       tests/cpp/simd_check.cpp -o /tmp/simd_check && /tmp/simd_check
// Prints the ISA it was built for; exit status 0 when everything matches.
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <vector>

#include "cpd/numerics.h"
#include <type_traits>
#include <utility>

#include "cast_loops.h"
#include "matmul_chain.h"
#include "matmul_f32.h"
#include "matmul_fchain.h"
#include "matmul_h16.h"
#include "philox_simd.h"
#if !defined(SIMDE_NO_NATIVE)
#include "fp_env.h"
#endif

using cpd::u32;
using cpd::u64;

static int failures = 0;

static void fail(const char* what, u64 a, u64 b, u64 c) {
  if (failures++ < 10) std::printf("MISMATCH %s: %llx %llx %llx\n", what, (unsigned long long)a, (unsigned long long)b,
                                   (unsigned long long)c);
}

// philox_strided<M>: the words j in the mask M (bit j) as cpd::philox4x32_10's, the others' arrays
// not written (the stochastic matmul draws only the words its step uses: cuda/cpu/matmul_sr.h).
template <unsigned M>
static void check_strided_words(u64 b0, u64 st, int n, const u32* kk) {
  static u32 got[4 * 80];
  for (u32& g : got) g = 0x5a5a5a5au;
  cpd_cpu::philox_strided<M>(b0, st, n, kk[2], kk[3], cpd_cpu::philox_key(kk[0], kk[1]), got, 80);
  for (int i = 0; i < 80; ++i) {
    const cpd::U32x4 w = cpd::philox4x32_10((u32)(b0 + i * st), (u32)((b0 + i * st) >> 32), kk[2], kk[3], kk[0], kk[1]);
    for (int j = 0; j < 4; ++j) {
      const u32 want = i < n && (M >> j & 1u) ? w.v[j] : 0x5a5a5a5au;
      if (got[j * 80 + i] != want) fail("philox_strided<WORDS>", b0, st, (u64)(M * 1000 + j * 80 + i));
    }
  }
}

template <unsigned... M>
static void check_strided_masks(u64 b0, u64 st, int n, const u32* kk, std::integer_sequence<unsigned, M...>) {
  (check_strided_words<M + 1>(b0, st, n, kk), ...);
}

static void check_philox() {
  const u64 starts[] = {0, 1, 5, 0xfffffff0ull, 0x1234567890ull, 0xffffffffffffffc0ull};
  const u64 strides[] = {1, 2, 3, 194, 0x100000000ull, 0x200000001ull};
  const u32 keys[][4] = {{0, 0, 0, 0}, {0xdeadbeef, 0x01234567, 0x89abcdef, 0xffffffff}, {7, 0, 0x80000000u, 1}};
  static u32 got[4 * 80], want[4];
  for (const auto& kk : keys) {
    for (u64 b0 : starts) {
      for (int n = 0; n <= 70; ++n) {
        cpd_cpu::philox_blocks(b0, n, kk[2], kk[3], kk[0], kk[1], got);
        for (int k = 0; k < n; ++k) {
          cpd_cpu::philox_one(b0 + (u64)k, kk[2], kk[3], kk[0], kk[1], want);
          for (int j = 0; j < 4; ++j)
            if (got[4 * k + j] != want[j]) fail("philox_blocks", b0, (u64)n, (u64)(4 * k + j));
        }
        for (u64 st : strides) {
          cpd_cpu::philox_strided(b0, st, n, kk[2], kk[3], kk[0], kk[1], got, 80);
          for (int i = 0; i < n; ++i) {
            const cpd::U32x4 w = cpd::philox4x32_10((u32)(b0 + i * st), (u32)((b0 + i * st) >> 32), kk[2], kk[3],
                                                    kk[0], kk[1]);
            for (int j = 0; j < 4; ++j)
              if (got[j * 80 + i] != w.v[j]) fail("philox_strided", b0, st, (u64)(j * 80 + i));
          }
          check_strided_masks(b0, st, n, kk, std::make_integer_sequence<unsigned, 15>());
        }
      }
    }
  }
  // the scalar reference itself: Random123's known answer for counter 0, key 0
  cpd_cpu::philox_one(0, 0, 0, 0, 0, want);
  if (want[0] != 0x6627E8D5u || want[3] != 0x9B00DBD8u) fail("philox known answer", want[0], want[3], 0);
}

// The test data's generator: Knuth's MMIX LCG, the high word of the next state.
static u32 lcg_next(u64& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return (u32)(state >> 32);
}

static bool same(u32 a, u32 b) {
  const bool na = (a & 0x7fffffffu) > cpd::INF_BITS, nb = (b & 0x7fffffffu) > cpd::INF_BITS;
  return a == b || (na && nb);
}

template <class Acc>
static void check_rounding(const char* what, const Acc& acc, const cpd::Format& f) {
  const u32 lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x7fff, 0x8000, 0x8001, 0xffff, 0x2000, 0xe000};
  alignas(64) float x[cpd_cpu::kLanes], zero[cpd_cpu::kLanes] = {};
  int filled = 0;
  u32 in[cpd_cpu::kLanes];
  for (u32 hi = 0; hi < 0x10000u; ++hi) {
    for (u32 lo : lows) {
      in[filled] = (hi << 16) | lo;
      x[filled] = cpd::float_of(in[filled]);
      if (++filled == cpd_cpu::kLanes) {
        float y[cpd_cpu::kLanes];
        for (int i = 0; i < cpd_cpu::kLanes; ++i) y[i] = x[i];
        acc.round(y);
        acc.template add<false>(x, x, zero);  // x + 0 = x for every x but -0 (-0 + 0 = +0)
        for (int i = 0; i < cpd_cpu::kLanes; ++i) {
          const u32 want = cpd::cast_bits_generic(in[i], f, cpd::NEAREST, 0u, 32);
          if (!same(cpd::bits_of(y[i]), want)) fail(what, in[i], cpd::bits_of(y[i]), want);
          const u32 want0 = in[i] == cpd::SIGN ? 0u : want;
          if (!same(cpd::bits_of(x[i]), want0)) fail(what, in[i], cpd::bits_of(x[i]), want0);
        }
        filled = 0;
      }
    }
  }
}

// Kahan's step on guarded lanes against Kahan's step with add_bits, lane by lane, 300 steps.
static void check_kahan_guarded(const char* what, const cpd::Format& f) {
  constexpr int64_t L = cpd_cpu::kLanes;
  alignas(64) float s[L] = {}, c[L] = {}, p[L];
  alignas(64) u32 top[L] = {};
  u32 rs[L] = {}, rc[L] = {};
  u64 state = 0x9E3779B97F4A7C15ull;
  const u32 guard = cpd::lane_guard_bits(f);
  const int emin = f.emin, emax = (int)(f.max_bits >> 23) - 127;
  for (int step = 0; step < 300; ++step) {
    for (int64_t i = 0; i < L; ++i) {
      const u32 r = lcg_next(state);
      // magnitudes from the subnormals up to 2^(emax - 9), so that 300 steps stay inside the guard
      const int span = emax - 9 - (emin - f.man);
      const int e = emin - f.man + (int)((r >> 8) % (u32)(span > 1 ? span : 1));
      u32 x = cpd::compose(1u << 23 | (r & 0x7fffffu) << 0, e - 23) | (r & 1u ? cpd::SIGN : 0u);
      if ((r >> 4) % 16u == 0u) x = (r & 2u) ? cpd::SIGN : 0u;  // zeros of both signs
      x = cpd::cast_bits_generic(x, f, cpd::NEAREST, 0u, 32);
      p[i] = cpd::float_of(x);
      // the reference: y = p - c, t = s + y, c = (t - s) - y, s = t, each add_bits
      const auto add = [&f](u32 a, u32 b) { return cpd::add_bits(a, b, f, cpd::NEAREST, 0u, 32); };
      const u32 y = add(x, rc[i] ^ cpd::SIGN), t = add(rs[i], y);
      rc[i] = add(add(t, rs[i] ^ cpd::SIGN), y ^ cpd::SIGN);
      rs[i] = t;
    }
    cpd_cpu::kahan_guarded_lanes<false>(s, c, p, top, f);
    for (int64_t i = 0; i < L; ++i) {
      if (cpd::bits_of(s[i]) != rs[i]) fail(what, (u64)step, cpd::bits_of(s[i]), rs[i]);
      if (cpd::bits_of(c[i]) != rc[i]) fail(what, (u64)step, cpd::bits_of(c[i]), rc[i]);
      if (top[i] >= guard) fail(what, (u64)step, top[i], guard);
    }
  }
}

// cast_sr_range<FAST, PLAIN, STREAM> over x[0 .. n) against the scalar reference.
template <bool FAST, bool PLAIN, bool STREAM>
static void check_sr_range(const char* what, const cpd::Format& f, const float* x, float* y, int64_t n, int64_t split,
                           int sr_bits, u64 seed, u64 offset) {
  const int64_t nblocks = (n + 3) / 4, mid = std::min(split, nblocks);
  for (int64_t i = 0; i < n; ++i) y[i] = -1.0f;
  cpd_cpu::cast_sr_range<FAST, PLAIN, STREAM>(x, y, n, mid, nblocks, f, sr_bits, seed, offset);  // the second thread
  cpd_cpu::cast_sr_range<FAST, PLAIN, STREAM>(x, y, n, 0, mid, f, sr_bits, seed, offset);
  for (int64_t i = 0; i < n; ++i) {
    const u32 want = cpd::cast_bits(cpd::bits_of(x[i]), f, cpd::STOCHASTIC, cpd::random_word((u64)i, seed, offset), sr_bits);
    if (!same(cpd::bits_of(y[i]), want)) fail(what, (u64)n, (u64)i, cpd::bits_of(x[i]));
  }
}

static void check_fused_cast() {
  const cpd::Format formats[] = {
      cpd::make_format(5, 2, 15, cpd::SPECIALS_IEEE, 1, 0),   cpd::make_format(4, 3, 7, cpd::SPECIALS_FN, 1, 1),
      cpd::make_format(8, 7, 127, cpd::SPECIALS_IEEE, 1, 0),  cpd::make_format(4, 3, 8, cpd::SPECIALS_FNUZ, 1, 0),
      cpd::make_format(5, 2, 16, cpd::SPECIALS_P3109 + cpd::SPECIALS_UNSIGNED, 1, 0),
      cpd::make_format(8, 0, 127, cpd::SPECIALS_FNU + cpd::SPECIALS_UNSIGNED, 1, 0),
      cpd::make_format(4, 3, 7, cpd::SPECIALS_IEEE, 0, 0),    cpd::make_format(5, 0, 15, cpd::SPECIALS_IEEE, 1, 0),
      cpd::make_format(3, 20, 129, cpd::SPECIALS_FN, 1, 0)};
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 67; ++n) lengths.push_back(n);
  for (int64_t n : {383, 385, 4 * 96 * 3 + 5, 4099}) lengths.push_back(n);
  const int64_t cap = 4200 + 16;
  std::vector<float> xbuf(cap + 64), ybuf(cap + 64);
  float* xa = (float*)(((uintptr_t)xbuf.data() + 63) & ~(uintptr_t)63);
  float* ya = (float*)(((uintptr_t)ybuf.data() + 63) & ~(uintptr_t)63);
  u64 r = 0x243F6A8885A308D3ull;
  auto next = [&r] { return lcg_next(r); };
  const u64 seed = 0xA5A5F00D12345678ull, offset = 0x7FFF000100000003ull;
  int k = 0;
  for (const cpd::Format& f : formats) {
    for (int64_t n : lengths) {
      const int kx = k % 4, ky = (k / 4) % 4, sr_bits = (k % 3 == 0) ? 32 : 1 + k % 9;
      const int64_t split = ((n + 3) / 4) / 2 + (k % 5);
      ++k;
      float* x = xa + kx;
      float* y = ya + ky;
      for (int64_t i = 0; i < n; ++i) {  // near the format's binades, random patterns, specials
        const u32 m = next();
        const int elo = std::max(f.emin - f.man - 3, -150), ehi = std::min((int)(f.max_bits >> 23) - 127 + 2, 128);
        const int e = elo + (int)((m >> 8) % (u32)(ehi - elo + 1));
        x[i] = (m & 7) == 0 ? cpd::float_of(next()) : (m & 7) == 1 ? 0.0f : std::ldexp(1.0f + (next() >> 9) * 0x1p-23f, e) * ((m & 8) ? -1.0f : 1.0f);
      }
      if (!f.fast) {
        check_sr_range<false, false, false>("fused sr generic", f, x, y, n, split, sr_bits, seed, offset);
        check_sr_range<false, false, true>("fused sr generic stream", f, x, y, n, split, sr_bits, seed, offset);
      } else if (cpd_cpu::plain_format_applies(f)) {
        check_sr_range<true, true, false>("fused sr plain", f, x, y, n, split, sr_bits, seed, offset);
        check_sr_range<true, true, true>("fused sr plain stream", f, x, y, n, split, sr_bits, seed, offset);
      } else {
        check_sr_range<true, false, false>("fused sr fast", f, x, y, n, split, sr_bits, seed, offset);
        check_sr_range<true, false, true>("fused sr fast stream", f, x, y, n, split, sr_bits, seed, offset);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// The matmul's register chains against the generic steps, output by output (NaN as NaN: the
// matmul redoes NaN outputs by the generic steps). Shapes: M = 2 MR + 3 rows (full tiles and a
// remainder), N = NR + 5 columns (a full panel and a partial one), K = 29.
struct ChainData {
  int64_t M, K, N;
  std::vector<float> a, b, y;
};

// a and b: magnitudes 2^elo .. 2^ehi of random significands, zeros of both signs, and (specials)
// infinities and NaNs.
static ChainData chain_data(int64_t mr, int64_t nr, int elo, int ehi, bool specials, u64 seed) {
  ChainData d{2 * mr + 3, 29, nr + 5, {}, {}, {}};
  u64 r = seed;
  auto next = [&r] { return lcg_next(r); };
  auto value = [&] {
    const u32 m = next();
    if ((m & 31u) == 0u) return (m & 32u) ? -0.0f : 0.0f;
    if (specials && (m & 63u) == 1u) return (m & 64u) ? -INFINITY : INFINITY;
    if (specials && (m & 127u) == 2u) return NAN;
    const int e = elo + (int)((m >> 8) % (u32)(ehi - elo + 1));
    return std::ldexp(1.0f + (next() >> 9) * 0x1p-23f, e) * ((m & 128u) ? -1.0f : 1.0f);
  };
  for (int64_t i = 0; i < d.M * d.K; ++i) d.a.push_back(value());
  for (int64_t i = 0; i < d.K * d.N; ++i) d.b.push_back(value());
  d.y.assign((size_t)(d.M * d.N), -1.0f);
  return d;
}

// Double-rounding traps for products rounded to mf (man <= 3): pairs (a, b) whose exact product
// lies just above a midpoint of mf's grid while fl32(a b) is the midpoint itself, so that a product
// rounded twice (to float32, then to mf: an unfused multiply) ties to even where the exact one
// rounds up. Planted along row 1 of a and column 2 of b (every k), output (1, 2) summing them.
static void plant_ties(ChainData& d, const cpd::Format& mf) {
  const double tie = 1.0 + std::ldexp(1.0, -mf.man - 1);  // between 1 and 1 + 2^-man
  int64_t k = 0;
  for (u32 x = 1; k < d.K && x < (1u << 22); ++x) {
    const float a = 1.0f + std::ldexp((float)x, -23);
    const float b = std::nextafter((float)(tie / a), 2.0f);  // rounded up: a b = tie + a (b - tie / a)
    const double p = (double)a * (double)b;                   // exact (24 + 24 bits)
    if (p > tie && (double)(float)p == tie) {
      d.a[1 * d.K + k] = (k & 1) ? -a : a;
      d.b[k * d.N + 2] = b;
      ++k;
    }
  }
  if (k < d.K) fail("plant_ties", (u64)k, 0, 0);
}

// y (from the chain's rows over column panels of nr) against step(s, a, b) from s = +0 in k order.
template <class Rows, class Step>
static void check_chain(const char* what, ChainData& d, int64_t nr, Rows rows, Step step) {
  std::vector<float> pack;
  for (int64_t j0 = 0; j0 < d.N; j0 += nr) rows(d.a.data(), d.b.data(), d.y.data(), d.K, d.N, 0, d.M, j0,
                                                std::min(nr, d.N - j0), pack);
  for (int64_t i = 0; i < d.M; ++i)
    for (int64_t j = 0; j < d.N; ++j) {
      u32 s = 0u;
      for (int64_t k = 0; k < d.K; ++k) s = step(s, cpd::bits_of(d.a[i * d.K + k]), cpd::bits_of(d.b[k * d.N + j]));
      if (!same(cpd::bits_of(d.y[i * d.N + j]), s)) fail(what, (u64)(i * d.N + j), cpd::bits_of(d.y[i * d.N + j]), s);
    }
}

static void check_chains() {
  const cpd::Format fp32 = cpd::make_format(8, 23, 127, cpd::SPECIALS_IEEE, 1, 0);
  const auto fma_into = [](const cpd::Format& f) {
    return [f](u32 s, u32 a, u32 b) { return cpd::fma_bits(s, a, b, f, cpd::NEAREST, 0u, 32); };
  };
  (void)fp32, (void)fma_into;
#if CPD_CPU_CHAIN
  {  // binary32: s = fma(a, b, s)
    using C = cpd_cpu::ChainVec;
    ChainData d = chain_data(C::MR, C::NR, -70, 60, true, 1);
    check_chain("chain fp32", d, C::NR, cpd_cpu::chain_rows, fma_into(fp32));
  }
#endif
#if CPD_CPU_H16_CHAIN
  using H = cpd_cpu::H16Chain;
  const cpd::Format fp16 = cpd::make_format(5, 10, 15, cpd::SPECIALS_IEEE, 1, 0);
  const cpd::Format bf16 = cpd::make_format(8, 7, 127, cpd::SPECIALS_IEEE, 1, 0);
  const cpd::Format tf32 = cpd::make_format(8, 10, 127, cpd::SPECIALS_IEEE, 1, 0);
  const cpd::Format e5m2 = cpd::make_format(5, 2, 15, cpd::SPECIALS_IEEE, 1, 0);
  const cpd::Format e4m3 = cpd::make_format(4, 3, 7, cpd::SPECIALS_IEEE, 1, 0);
  // s = add(s, mul(a, b)) with products rounded to mf and sums to af
  const auto mul_add = [](const cpd::Format& mf, const cpd::Format& af) {
    return [mf, af](u32 s, u32 a, u32 b) {
      return cpd::add_bits(s, cpd::mul_bits(a, b, mf, cpd::NEAREST, 0u, 32), af, cpd::NEAREST, 0u, 32);
    };
  };
  const auto h16_rows = [](const cpd::Format& mf, auto bounded, auto sum) {
    return [mf, sum](const float* a, const float* b, float* y, int64_t K, int64_t N, int64_t m0, int64_t m1, int64_t j0,
                     int64_t nc, std::vector<float>& pack) {
      const cpd_cpu::H16Mul m(cpd::make_format_f(mf));
      cpd_cpu::h16_chain_rows<decltype(bounded)::value, false, false>(a, b, y, K, 0, N, m0, m1, j0, nc, pack, m, sum,
                                                                      cpd_cpu::kNoRedo);
    };
  };
  using General = std::false_type;
  using Bounded = std::true_type;
  {  // binary16 sums of e5m2 products: general (specials, products past e5m2's range) and bounded
    ChainData d = chain_data(H::MR, H::NR, -20, 9, true, 2);
    plant_ties(d, e5m2);
    check_chain("h16 chain e5m2 -> fp16", d, H::NR, h16_rows(e5m2, General{}, cpd_cpu::SumH16{}), mul_add(e5m2, fp16));
    ChainData e = chain_data(H::MR, H::NR, -12, 6, false, 3);  // |a b| < 2^14 <= e5m2's max
    plant_ties(e, e5m2);
    check_chain("h16 chain e5m2 -> fp16 bounded", e, H::NR, h16_rows(e5m2, Bounded{}, cpd_cpu::SumH16{}),
                mul_add(e5m2, fp16));
  }
  {  // binary32 sums of e4m3 products; bf16 sums (SumI) of bounded e5m2 products
    ChainData d = chain_data(H::MR, H::NR, -12, 5, true, 4);
    check_chain("h16 chain e4m3 -> fp32", d, H::NR, h16_rows(e4m3, General{}, cpd_cpu::SumB32{}), mul_add(e4m3, fp32));
    ChainData e = chain_data(H::MR, H::NR, -12, 6, false, 5);
    plant_ties(e, e5m2);
    check_chain("h16 chain e5m2 -> bf16 bounded", e, H::NR, h16_rows(e5m2, Bounded{}, cpd_cpu::SumI(bf16)),
                mul_add(e5m2, bf16));
  }
  for (const cpd::Format& af : {bf16, tf32}) {  // exact products, one rounding per step into af
    if (!cpd_cpu::fchain_applies(af)) fail("fchain_applies", af.man, 0, 0);
    const auto rows = [af](const float* a, const float* b, float* y, int64_t K, int64_t N, int64_t m0, int64_t m1,
                           int64_t j0, int64_t nc, std::vector<float>& pack) {
      cpd_cpu::fchain_rows(a, b, y, K, N, m0, m1, j0, nc, pack, cpd_cpu::FChainAcc(af), af);
    };
    ChainData d = chain_data(H::MR, H::NR, -70, 60, false, 6 + af.man);
    check_chain(af.man == 7 ? "fchain bf16" : "fchain tf32", d, H::NR, rows, fma_into(af));
    // short significands: many steps land on af's midpoints (fchain_fix)
    for (std::vector<float>* x : {&d.a, &d.b})
      for (float& v : *x) {  // 4 significant bits
        int e = 0;
        const float f = std::frexp(v, &e);
        v = std::ldexp(std::round(std::ldexp(f, 4)), e - 4);
      }
    check_chain(af.man == 7 ? "fchain bf16 midpoints" : "fchain tf32 midpoints", d, H::NR, rows, fma_into(af));
  }
#endif
}

#if !defined(SIMDE_NO_NATIVE)
// ------------------------------------------------------------------------------------------
// The directed lanes' roundings. Out of line, so that the rounding direction the caller set holds
// for exactly this loop's float operations (as in cuda/cpu/matmul_directed.h).
template <int MODE>
__attribute__((noinline)) static void directed_lanes_v(const u32* u, u32* out, int64_t n, const cpd::Format f) {
  for (int64_t i = 0; i < n; ++i) out[i] = cpd::directed_lane<MODE>(u[i], f);
}

// Inputs: random bits, the subnormal range below 2 * 2^emin densely, grid points of the format's
// smallest quantum and their float32 neighbours, zeros and infinities; both signs.
static std::vector<u32> directed_inputs(const cpd::Format& f, u64 seed) {
  std::vector<u32> u = {0u, cpd::INF_BITS, f.min_normal_bits, f.max_bits, f.max_bits + 1u};
  for (int i = 0; i < 20000; ++i) u.push_back(lcg_next(seed));
  for (int i = 0; i < 20000; ++i) u.push_back(lcg_next(seed) % (2u * f.min_normal_bits));
  const float q = f.sub_q;
  for (int k = 0; k < 3000; ++k) {
    const u32 g = cpd::bits_of(q * (float)k);
    for (u32 d : {0u, 1u}) u.push_back(g + d), u.push_back(g - d);
  }
  const size_t n = u.size();
  for (size_t i = 0; i < n; ++i) u.push_back(u[i] ^ cpd::SIGN);
  return u;
}

template <int MODE>
static void check_directed_mode(const char* what, const cpd::Format& f, const std::vector<u32>& u) {
  std::vector<u32> got(u.size());
  for (int dir : {(int)cpd::TOWARD_ZERO, (int)cpd::UP, (int)cpd::DOWN}) {
    {
      cpd_cpu::DirectedRounding r(dir);
      directed_lanes_v<MODE>(u.data(), got.data(), (int64_t)u.size(), f);
    }
    for (size_t i = 0; i < u.size(); ++i)
      if (!same(got[i], cpd::cast_bits_generic(u[i], f, MODE, 0u, 32))) fail(what, (u64)(MODE * 16 + dir), u[i], got[i]);
  }
  if (f.man >= 1 && f.man <= 10 && f.emin == -126 && f.subnormals && f.outward_bits == cpd::INF_BITS)
    for (size_t i = 0; i < u.size(); ++i)  // directed_lane_bits: no NaN input
      if ((u[i] & ~cpd::SIGN) <= cpd::INF_BITS &&
          cpd::directed_lane_bits<MODE>(u[i], f) != cpd::cast_bits_generic(u[i], f, MODE, 0u, 32))
        fail(what, (u64)MODE, u[i], cpd::directed_lane_bits<MODE>(u[i], f));
}

static void check_directed_lanes() {
  const cpd::Format formats[] = {
      cpd::make_format(4, 3, 7, cpd::SPECIALS_IEEE, 1, 0),  cpd::make_format(4, 3, 7, cpd::SPECIALS_FN, 1, 0),
      cpd::make_format(5, 2, 15, cpd::SPECIALS_IEEE, 1, 0), cpd::make_format(5, 10, 15, cpd::SPECIALS_IEEE, 1, 1),
      cpd::make_format(8, 7, 127, cpd::SPECIALS_IEEE, 1, 0), cpd::make_format(8, 10, 127, cpd::SPECIALS_IEEE, 1, 0),
      cpd::make_format(2, 1, 1, cpd::SPECIALS_FINITE, 1, 0), cpd::make_format(4, 3, 7, cpd::SPECIALS_IEEE, 0, 0),
      cpd::make_format(8, 23, 127, cpd::SPECIALS_IEEE, 1, 1)};
  u64 seed = 41;
  for (const cpd::Format& f : formats) {
    for (int mode : {(int)cpd::TOWARD_ZERO, (int)cpd::UP, (int)cpd::DOWN})
      if (!cpd::directed_lane_applies(f, mode)) fail("directed_lane_applies", (u64)f.exp, (u64)f.man, (u64)mode);
    const std::vector<u32> u = directed_inputs(f, seed++);
    check_directed_mode<cpd::TOWARD_ZERO>("directed_lane toward zero", f, u);
    check_directed_mode<cpd::UP>("directed_lane up", f, u);
    check_directed_mode<cpd::DOWN>("directed_lane down", f, u);
  }
}
#endif

int main() {
  std::printf("simd_check: %s\n", cpd_cpu::isa_name());
  check_chains();
  check_philox();
  check_fused_cast();
#if !defined(SIMDE_NO_NATIVE)
  check_directed_lanes();
#endif
  const cpd::Format fp16 = cpd::make_format(5, 10, 15, cpd::SPECIALS_IEEE, 1, 0);
  const cpd::Format bf16 = cpd::make_format(8, 7, 127, cpd::SPECIALS_IEEE, 1, 0);
  const cpd::Format e5m2 = cpd::make_format(5, 2, 15, cpd::SPECIALS_IEEE, 1, 0);
#if CPD_CPU_F16_LANES
  check_rounding("AccH fp16", cpd_cpu::AccH{}, fp16);
#endif
  check_rounding("AccI fp16", cpd_cpu::AccI<0>{fp16}, fp16);
  check_rounding("AccI e5m2", cpd_cpu::AccI<0>{e5m2}, e5m2);
  check_rounding("AccI bf16 normal-only", cpd_cpu::AccI<1>{bf16}, bf16);
  check_rounding("AccI bf16", cpd_cpu::AccI<0>{bf16}, bf16);
  if (!cpd::lane_normal_only(bf16) || cpd::lane_normal_only(fp16)) fail("lane_normal_only", 0, 0, 0);
  check_kahan_guarded("guarded kahan e6m7", cpd::make_format(6, 7, 31, cpd::SPECIALS_IEEE, 1, 0));
  check_kahan_guarded("guarded kahan bf16", bf16);
  check_kahan_guarded("guarded kahan fp16", fp16);
  check_kahan_guarded("guarded kahan e4m3", cpd::make_format(4, 3, 7, cpd::SPECIALS_IEEE, 1, 0));
  check_kahan_guarded("guarded kahan e5m4 fn", cpd::make_format(5, 4, 15, cpd::SPECIALS_FN, 1, 0));
  std::printf("%s (%d mismatches)\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
