// CPU matmul over the core's accumulation steps (numerics.h, "Accumulation"). Bound into the
// extension module by cast.cpp.
//
// Several loops, the same bits (plan_for picks one; the tests compare each with the generic one,
// on every ISA level the test suite builds):
//   * binary16 lanes (LANES_H16): round to nearest into an IEEE binary16 accumulator: on CPUs
//     with AVX512-FP16 products on float32 lanes (mul_f) and sums in the processor's binary16
//     adds (h16_tile); elsewhere the float32 lanes below with the processor's float32 ->
//     binary16 conversion as the rounding (matmul_f32.h, AccH: F16C on x86, FCVT on Arm); with
//     mul a format with subnormals, no Kahan and no blocks, on x86-64-v3 and up, the same steps
//     in a register tile (matmul_h16.h, h16_chain_matmul);
//   * float32 lanes (LANES_F32, matmul_f32.h): round to nearest into binary32 or an accumulator
//     of at most 11 bits, with products rounded to mul (mul_f, values of acc) or fused (fma, the
//     midpoint lanes redone exactly); sums rounded by round_f, or on integer lanes for wide
//     exponent ranges such as BF16 (8 floats per AVX2 op, 16 per AVX-512 op, 4 per NEON op);
//     without Kahan or blocks, in register tiles: binary32 with exact products (matmul_chain.h)
//     or products rounded to mul (matmul_h16.h: SumB32; SumI, SumF into narrow accumulators),
//     TF32/BF16/binary16 fused (matmul_fchain.h); Kahan's and blocked sums in matmul_h16.h's
//     tiles (KAHAN, BLOCK) into binary32, binary16 or (bounded products) TF32/BF16
//     (nearest_register_chains);
//   * float64 lanes (LANES_F64), round to nearest otherwise: a tile of up to kTile outputs of one
//     row (i, j0 .. j0 + kTile) keeps its accumulators as doubles in arrays; for each k the loop
//     over j reads row k of b (contiguous) and applies round_d / add_d (branch-free, so GCC
//     vectorizes it);
//   * stochastic rounding (matmul_sr.h): the same tiles, the step's Philox words of all the tile's
//     lanes at once (philox_simd.h, philox_strided); float32 lanes for formats of at most 11 bits
//     (cpd::sr_lane_applies: each rounding the stochastic cast of the float32 result, the few lanes
//     near a decision's edge redone exactly), else float64 lanes for man <= 19 (round_d_sr);
//   * directed rounding (toward zero, up, down; matmul_directed.h): float32 lanes computed with the
//     processor's rounding direction set to the mode, each result then cast in that mode, for
//     formats whose values are all float32 values (cpd::directed_lane_applies); with plain sums,
//     register chains under that direction: exact products into binary32 the binary32 chain, into
//     TF32/BF16/binary16 (finite operands) the fused narrow chain's; products rounded to mul
//     (bounded operands) the product chain's (matmul_h16.h) into binary32, TF32/BF16, binary16;
//   * any mode (wide formats, other conventions, and the reference for the tests): one output
//     at a time, dot_step on float32 bits, the step's random words from dot_words.
// Work is split over (batch, row, tile) or over outputs with cpd_cpu::parallel_for; an output's
// bits depend only on its operands and (seed, offset, o, K), never on the split.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#if defined(__AVX512FP16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpd/numerics.h"
#include "fp_env.h"
#include "matmul_chain.h"
#include "matmul_directed.h"
#include "matmul_f32.h"
#include "matmul_fchain.h"
#include "matmul_h16.h"
#include "matmul_sr.h"
#include "matmul_tasks.h"
#include "parallel.h"
#include "philox_simd.h"

namespace {

constexpr int64_t kTile = cpd_cpu::kLanes;

struct Dims {
  int64_t B, M, K, N, L;  // L: block length (0: none)
};

// Calls tile(a_row, b_batch, y_row, o0, j0, jt) for every tile of up to kTile outputs of one row
// (outputs j0 .. j0 + jt of that row; o0 the flat index of the first), split over the threads.
// Column blocks outermost: the rows of one block of kTile columns run one after another, so
// that block of b (K x kTile floats: 128 KiB for K = 512, 256 KiB on AVX-512) stays in the
// core's L2 cache between them instead of all of b streaming through it for every row.
template <class Tile>
void for_each_tile(const float* a, const float* b, float* y, const Dims& d, const Tile& tile) {
  const int64_t rows = d.B * d.M, tasks = rows * ((d.N + kTile - 1) / kTile);
  cpd_cpu::parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t row = t % rows, j0 = (t / rows) * kTile, bi = row / d.M;
      tile(a + row * d.K, b + bi * d.K * d.N, y + row * d.N, row * d.N + j0, j0, std::min(kTile, d.N - j0));
    }
  });
}

// Output o (flat index) by the generic steps: dot_step on float32 bits, one k after another, the
// step's random words from dot_words (numerics.h, "Accumulation"): the reference every loop
// below is compared with.
float dot_output(const float* a, const float* b, const Dims& d, const cpd::DotSpec& g, int64_t o, uint64_t seed,
                 uint64_t offset) {
  uint32_t w[cpd::DOT_WORDS];
  const int64_t row = o / d.N, j = o % d.N, bi = row / d.M;
  const float* ar = a + row * d.K;
  const float* bc = b + bi * d.K * d.N + j;
  uint32_t s = 0u, c = 0u, bs = 0u;
  for (int64_t k = 0; k < d.K; ++k) {
    cpd::dot_words((uint64_t)o, (uint64_t)d.K, (uint64_t)k, seed, offset, g.mode,
                   cpd::dot_needs_high(g, (uint64_t)k, (uint64_t)d.K), w);
    cpd::dot_step(g, cpd::bits_of(ar[k]), cpd::bits_of(bc[k * d.N]), (uint64_t)k, (uint64_t)d.K, s, c, bs, w);
  }
  return cpd::float_of(s);
}

// The binary32 lanes' redo (AccB32, the chain): outputs o0 .. o0 + n of one row, at yrow, by the
// generic steps where all is set (a thread that flushes subnormals), else only where they are NaN.
void redo_generic(const float* a, const float* b, const Dims& d, const cpd::DotSpec& g, float* yrow, int64_t o0,
                  int64_t n, bool all) {
  for (int64_t j = 0; j < n; ++j)
    if (all || yrow[j] != yrow[j]) yrow[j] = dot_output(a, b, d, g, o0 + j, 0u, 0u);
}

template <bool MUL, bool KAHAN, bool BLOCK>
void fast_tile(const float* __restrict arow, const float* __restrict b, float* __restrict out, int64_t j0,
               int64_t jt, const Dims& d, const cpd::FormatD& mg, const cpd::FormatD& ag) {
  double s[kTile], c[kTile], bs[kTile];
  for (int64_t jj = 0; jj < kTile; ++jj) s[jj] = c[jj] = bs[jj] = 0.0;
  for (int64_t k = 0; k < d.K; ++k) {
    const double av = (double)arow[k];
    const float* __restrict br = b + k * d.N + j0;
    for (int64_t jj = 0; jj < jt; ++jj) {
      double p = av * (double)br[jj];  // exact: 48 significant bits, exponent in -298..256
      if (MUL) p = cpd::round_d(p, mg);
      if (BLOCK) {
        bs[jj] = cpd::add_d(bs[jj], p, ag);
      } else if (KAHAN) {
        cpd::kahan_d(s[jj], c[jj], p, ag);
      } else {
        s[jj] = cpd::add_d(s[jj], p, ag);
      }
    }
    if (BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K)) {
      for (int64_t jj = 0; jj < jt; ++jj) {
        if (KAHAN) cpd::kahan_d(s[jj], c[jj], bs[jj], ag);
        else s[jj] = cpd::add_d(s[jj], bs[jj], ag);
        bs[jj] = 0.0;
      }
    }
  }
  for (int64_t jj = 0; jj < jt; ++jj) out[j0 + jj] = (float)s[jj];  // a value of acc: exact
}

template <bool MUL, bool KAHAN, bool BLOCK>
void fast_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::FormatD& mg,
                 const cpd::FormatD& ag) {
  for_each_tile(a, b, y, d, [&](const float* ar, const float* bm, float* yr, int64_t, int64_t j0, int64_t jt) {
    fast_tile<MUL, KAHAN, BLOCK>(ar, bm, yr, j0, jt, d, mg, ag);
  });
}

// The float32-lane variants (matmul_f32.h): which rounding policy rounds acc's sums.
enum AccKind { ACC_NONE = 0, ACC_F, ACC_I, ACC_I_NORMAL, ACC_H, ACC_B32 };

// acc is IEEE binary16 itself, so that the processor's conversion rounds to it.
inline bool is_binary16(const cpd::Format& af) {
  return af.exp == 5 && af.man == 10 && af.bias == 15 && af.specials == cpd::SPECIALS_IEEE && af.subnormals &&
         af.outward_bits == cpd::INF_BITS;
}

// acc is IEEE binary32 itself (AccB32): exp 8, man 23, bias 127, infinities, subnormals, no saturation.
inline bool is_binary32(const cpd::Format& af) {
  return af.exp == 8 && af.man == 23 && af.bias == 127 && af.specials == cpd::SPECIALS_IEEE && af.subnormals &&
         af.outward_bits == cpd::INF_BITS;
}

// Which float32-lane variant applies (ACC_NONE: none). acc binary32 (ACC_B32), on processors with a
// fused multiply-add instruction: products exact (fused) or rounded to mul on float32 lanes
// (nearest_f_applies). Otherwise products: rounded to mul on float32 lanes
// (nearest_f_applies) and values of acc (values_within), or fused with the midpoint test
// (midpoint_test_applies). Sums: acc of at most 11 bits with the fast cast (add_lane_applies).
// allow_h: binary16 rounding by conversion; only_i: integer lanes even where round_f applies.
inline AccKind f32_kind(bool has_mul, const cpd::Format& mf, const cpd::Format& af, int mode, bool allow_h,
                        bool only_i) {
  if (CPD_CPU_HW_FMA && !only_i && mode == cpd::NEAREST && is_binary32(af))
    return !has_mul || cpd::nearest_f_applies(mf, mode) ? ACC_B32 : ACC_NONE;
  if (!cpd::add_lane_applies(af, mode)) return ACC_NONE;
  if (has_mul ? !(cpd::nearest_f_applies(mf, mode) && cpd::values_within(mf, af)) : !cpd::midpoint_test_applies(af))
    return ACC_NONE;
  if (CPD_CPU_F16_LANES && allow_h && is_binary16(af)) return ACC_H;
  if (!only_i && cpd::nearest_f_applies(af, mode) && cpd::add_fast_applies(af, mode)) return ACC_F;
  return cpd::lane_normal_only(af) ? ACC_I_NORMAL : ACC_I;
}

// GUARD: Kahan's steps on guarded lanes, a tile whose guard trips run again on Acc's lanes
// (matmul_f32.h f32_tile; the same bits either way).
// AccB32 (Acc::kExact): a tile on a thread whose float32 unit flushes subnormals runs the generic
// steps (spec); so does every output the lanes left NaN, so that NaN results keep the generic
// steps' payload bits (the processor's choice among NaN operands depends on the instruction's
// operand order, which the compiler may swap).
template <class Acc, bool FUSED, bool KAHAN, bool BLOCK, bool GUARD>
void f32_matmul_v(const float* a, const float* b, float* y, const Dims& d, const cpd::FormatF& mf, const Acc& acc,
                  const cpd::Format& af, const cpd::DotSpec& spec, bool finite) {
  for_each_tile(a, b, y, d, [&](const float* ar, const float* bm, float* yr, int64_t o0, int64_t j0, int64_t jt) {
    const cpd_cpu::Tile t{d.K, d.L, jt, finite};
    const bool lanes = !Acc::kExact || cpd_cpu::float32_subnormals_kept();
    if (lanes && !cpd_cpu::f32_tile<Acc, FUSED, KAHAN, BLOCK, GUARD>(ar, bm + j0, d.N, yr + j0, t, mf, acc, af))
      cpd_cpu::f32_tile<Acc, FUSED, KAHAN, BLOCK>(ar, bm + j0, d.N, yr + j0, t, mf, acc, af);
    if (Acc::kExact) redo_generic(a, b, d, spec, yr + j0, o0, jt, !lanes);
  });
}

template <class Acc>
void f32_matmul(const float* a, const float* b, float* y, const Dims& d, bool fused, bool kahan, bool guard,
                const cpd::FormatF& mf, const Acc& acc, const cpd::Format& af, const cpd::DotSpec& sp, bool finite) {
  switch ((guard && kahan ? 8 : 0) | (fused ? 4 : 0) | (kahan ? 2 : 0) | (d.L ? 1 : 0)) {
    case 0: f32_matmul_v<Acc, false, false, false, false>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 1: f32_matmul_v<Acc, false, false, true, false>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 2: f32_matmul_v<Acc, false, true, false, false>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 3: f32_matmul_v<Acc, false, true, true, false>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 4: f32_matmul_v<Acc, true, false, false, false>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 5: f32_matmul_v<Acc, true, false, true, false>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 6: f32_matmul_v<Acc, true, true, false, false>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 7: f32_matmul_v<Acc, true, true, true, false>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 10: f32_matmul_v<Acc, false, true, false, true>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 11: f32_matmul_v<Acc, false, true, true, true>(a, b, y, d, mf, acc, af, sp, finite); break;
    case 14: f32_matmul_v<Acc, true, true, false, true>(a, b, y, d, mf, acc, af, sp, finite); break;
    default: f32_matmul_v<Acc, true, true, true, true>(a, b, y, d, mf, acc, af, sp, finite); break;
  }
}

#if CPD_CPU_CHAIN
// The binary32 chain (matmul_chain.h): tasks of (batch element, column panel of NR, up to 16 MR
// rows), each packing its panel; a task on a thread that flushes float32 subnormals runs the generic
// steps, and every NaN output is redone by them (as f32_matmul_v).
void chain_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::DotSpec& spec) {
  using C = cpd_cpu::ChainVec;
  cpd_cpu::chain_tasks(d.B, d.M, d.N, C::NR, 16 * C::MR, [&](int64_t bi, int64_t m0, int64_t m1, int64_t j0,
                                                             int64_t nc, std::vector<float>& pack) {
    float* yb = y + bi * d.M * d.N;
    const bool lanes = cpd_cpu::float32_subnormals_kept();
    if (lanes) cpd_cpu::chain_rows(a + bi * d.M * d.K, b + bi * d.K * d.N, yb, d.K, d.N, m0, m1, j0, nc, pack);
    for (int64_t i = m0; i < m1; ++i)
      redo_generic(a, b, d, spec, yb + i * d.N + j0, (bi * d.M + i) * d.N + j0, nc, !lanes);
  });
}
#endif

#if CPD_CPU_H16_CHAIN
// The binary16 register chain (matmul_h16.h), sum = SumH16, and the same chain into binary32
// (SumB32), an acc of fchain_applies (SumI) or of round_f (SumF; both bounded only), products
// rounded to mul (or exact: PROD_EXACT), plain, Kahan's (KAHAN) or blocked (BLOCK, runs of d.L)
// sums: tasks as chain_matmul's. PROD_BOUNDED: the caller checked that every operand is finite and
// max|a| * max|b| <= mul's largest value (h16_bounded). Every NaN output is redone by the generic
// steps, so that it keeps their sign and payload whatever order the vector adds took their two NaN
// operands in; and, except into binary16, a task on a thread that flushes float32 subnormals runs
// the generic steps (as chain_matmul's). A guarded Sum (SumF) takes af, acc's format: the rows of a
// tile whose guard tripped are run again on the float32 lanes (AccF), the loop such calls took
// before the chain.
template <int PROD, bool KAHAN, bool BLOCK, class Sum>
void h16_chain_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::FormatF& mg,
                      const cpd::DotSpec& spec, const Sum& sum, const cpd::Format* af = nullptr) {
  using C = cpd_cpu::H16Chain;
  const cpd_cpu::H16Mul m(mg);
  cpd_cpu::chain_tasks(d.B, d.M, d.N, C::NR, 16 * C::MR, [&](int64_t bi, int64_t m0, int64_t m1, int64_t j0,
                                                             int64_t nc, std::vector<float>& pack) {
    float* yb = y + bi * d.M * d.N;
    const bool lanes = std::is_same<Sum, cpd_cpu::SumH16>::value || cpd_cpu::float32_subnormals_kept();
    const auto redo = [&](int64_t i0, int64_t n) {
      if constexpr (Sum::kGuard) {
        const cpd_cpu::AccF acc{cpd::make_format_f(*af)};
        const cpd_cpu::Tile t{d.K, 0, nc, true};
        for (int64_t i = i0; i < i0 + n; ++i)
          cpd_cpu::f32_tile<cpd_cpu::AccF, false, false, false>(a + (bi * d.M + i) * d.K, b + bi * d.K * d.N + j0,
                                                                 d.N, yb + i * d.N + j0, t, mg, acc, *af);
      }
    };
    if (lanes)
      cpd_cpu::h16_chain_rows<PROD, KAHAN, BLOCK>(a + bi * d.M * d.K, b + bi * d.K * d.N, yb, d.K, d.L, d.N, m0, m1,
                                                     j0, nc, pack, m, sum, redo);
    for (int64_t i = m0; i < m1; ++i)
      redo_generic(a, b, d, spec, yb + i * d.N + j0, (bi * d.M + i) * d.N + j0, nc, !lanes);
  });
}

// run(kahan_steps, blocks) with the call's Kahan and block flags (kahan; L, the block length) as
// std::bool_constant, for the chains' KAHAN and BLOCK template arguments; PROD_EXACT's plain sums
// are other chains' (the binary32 chain, the fused chains), so that case is never instantiated.
template <int PROD, class Run>
void with_steps(bool kahan, int64_t L, const Run& run) {
  if (kahan && L) run(std::true_type{}, std::true_type{});
  else if (kahan) run(std::true_type{}, std::false_type{});
  else if (L) run(std::false_type{}, std::true_type{});
  else if constexpr (PROD != cpd_cpu::PROD_EXACT) run(std::false_type{}, std::false_type{});
}

// h16_chain_matmul with Kahan's steps and blocks as the call asks (kahan; d.L).
template <int PROD, class Sum>
void h16_chain_steps(const float* a, const float* b, float* y, const Dims& d, const cpd::FormatF& mg,
                     const cpd::DotSpec& spec, const Sum& sum, bool kahan) {
  static_assert(!Sum::kGuard, "a guarded Sum takes h16_chain_matmul with its format");
  with_steps<PROD>(kahan, d.L, [&](auto kahan_steps, auto blocks) {
    h16_chain_matmul<PROD, decltype(kahan_steps)::value, decltype(blocks)::value>(a, b, y, d, mg, spec, sum);
  });
}

// The fused narrow register chain (matmul_fchain.h), rounded by Acc (FChainAcc: TF32, BF16, ...;
// FChain16: binary16): finite operands (checked by the caller), tasks as chain_matmul's; a task on
// a thread that flushes float32 subnormals runs the generic steps.
template <class Acc>
void fchain_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::Format& af,
                   const cpd::DotSpec& spec, const Acc& m) {
  using C = cpd_cpu::H16Chain;
  cpd_cpu::chain_tasks(d.B, d.M, d.N, C::NR, 16 * C::MR, [&](int64_t bi, int64_t m0, int64_t m1, int64_t j0,
                                                             int64_t nc, std::vector<float>& pack) {
    float* yb = y + bi * d.M * d.N;
    if (cpd_cpu::float32_subnormals_kept())
      cpd_cpu::fchain_rows(a + bi * d.M * d.K, b + bi * d.K * d.N, yb, d.K, d.N, m0, m1, j0, nc, pack, m, af);
    else
      for (int64_t i = m0; i < m1; ++i)
        redo_generic(a, b, d, spec, yb + i * d.N + j0, (bi * d.M + i) * d.N + j0, nc, true);
  });
}
#endif

// finite: every operand is finite (asked by the caller where a loop uses it: AccB32's products).
void f32_dispatch(AccKind kind, const float* a, const float* b, float* y, const Dims& d, bool has_mul, bool kahan,
                  bool guard, bool finite, const cpd::Format& mf, const cpd::Format& af) {
  const bool fused = !has_mul;
  const cpd::DotSpec sp = cpd::make_dot_spec(mf, has_mul ? 1 : 0, af, kahan ? 1 : 0, (int)d.L, cpd::NEAREST, 32);
  const cpd::FormatF mg = cpd::make_format_f(has_mul ? mf : af);  // unused when fused
#if CPD_CPU_CHAIN
  if (kind == ACC_B32 && fused && !kahan && !d.L) return chain_matmul(a, b, y, d, sp);
#endif
  switch (kind) {
    case ACC_B32: f32_matmul(a, b, y, d, fused, kahan, false, mg, cpd_cpu::AccB32{}, af, sp, finite); break;
#if CPD_CPU_F16_LANES
    case ACC_H: f32_matmul(a, b, y, d, fused, kahan, guard, mg, cpd_cpu::AccH{}, af, sp, finite); break;
#endif
    case ACC_F: f32_matmul(a, b, y, d, fused, kahan, guard, mg, cpd_cpu::AccF{cpd::make_format_f(af)}, af, sp, finite); break;
    case ACC_I_NORMAL: f32_matmul(a, b, y, d, fused, kahan, guard, mg, cpd_cpu::AccI<1>{af}, af, sp, finite); break;
    default: f32_matmul(a, b, y, d, fused, kahan, guard, mg, cpd_cpu::AccI<0>{af}, af, sp, finite); break;
  }
}

#if defined(__AVX512FP16__)
// When acc is IEEE binary16 itself (exp 5, man 10, bias 15, infinities, subnormals, no
// saturation), its round-to-nearest additions are the processor's binary16 additions (IEEE 754
// rounds each once; the exact-zero sign and inf - inf are the standard's too), 32 lanes per
// AVX-512 FP16 op. The products (values of acc, float32 lanes as above) convert exactly:
//   for each run of 16 k:  p[k][jj] = mul_f(a, b) -> ph = binary16(p);  then in k order
//   s = s + ph (or Kahan, or blocked, in binary16)
// NaN operands send the whole call to the float32 lanes (matmul_out), so NaN results keep the
// payload bits of the other paths (binary16 would keep only 10 of them).
bool h16_applies(bool has_mul, const cpd::Format& mf, const cpd::Format& af, int mode) {
  return has_mul && is_binary16(af) && f32_kind(has_mul, mf, af, mode, true, false) != ACC_NONE;
}

inline void kahan_h(_Float16& s, _Float16& c, _Float16 p) {
  cpd::kahan_step(s, c, p, [](_Float16 x, _Float16 y, int) { return (_Float16)(x + y); });
}

template <bool KAHAN, bool BLOCK>
void h16_tile(const float* __restrict arow, const float* __restrict b, float* __restrict out, int64_t j0,
              int64_t jt, const Dims& d, const cpd::FormatF& mf0) {
  constexpr int64_t kRun = 16;  // products of kRun steps are formed, then added (the adds in k order)
  const cpd::FormatF mf = mf0;
  alignas(64) float p[kRun][kTile], o[kTile];
  alignas(64) _Float16 ph[kRun][kTile], s[kTile], c[kTile], bs[kTile];
  for (int64_t jj = 0; jj < kTile; ++jj) s[jj] = c[jj] = bs[jj] = (_Float16)0.0f;
  for (int64_t kk = 0; kk < kRun; ++kk)
    for (int64_t jj = 0; jj < kTile; ++jj) p[kk][jj] = 0.0f;
  for (int64_t k0 = 0; k0 < d.K; k0 += kRun) {
    const int64_t kr = std::min(kRun, d.K - k0);
    for (int64_t kk = 0; kk < kr; ++kk) {
      const float av = arow[k0 + kk];
      const float* __restrict br = b + (k0 + kk) * d.N + j0;
      for (int64_t jj = 0; jj < jt; ++jj) p[kk][jj] = cpd::float_of(cpd::mul_f(av, br[jj], mf));
      for (int64_t jj = 0; jj < kTile; jj += 16)  // exact: every p is a binary16 value (or NaN)
        _mm256_store_si256((__m256i*)&ph[kk][jj], _mm512_cvtps_ph(_mm512_load_ps(&p[kk][jj]),
                                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (int64_t kk = 0; kk < kr; ++kk) {
      for (int64_t jj = 0; jj < kTile; ++jj) {
        if (BLOCK) bs[jj] = bs[jj] + ph[kk][jj];
        else if (KAHAN) kahan_h(s[jj], c[jj], ph[kk][jj]);
        else s[jj] = s[jj] + ph[kk][jj];
      }
      const int64_t k = k0 + kk;
      if (BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K)) {
        for (int64_t jj = 0; jj < kTile; ++jj) {
          if (KAHAN) kahan_h(s[jj], c[jj], bs[jj]);
          else s[jj] = s[jj] + bs[jj];
          bs[jj] = (_Float16)0.0f;
        }
      }
    }
  }
  for (int64_t jj = 0; jj < kTile; jj += 16)
    _mm512_store_ps(o + jj, _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(s + jj))));
  for (int64_t jj = 0; jj < jt; ++jj) out[j0 + jj] = o[jj];
}

template <bool KAHAN, bool BLOCK>
void h16_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::FormatF& mf) {
  for_each_tile(a, b, y, d, [&](const float* ar, const float* bm, float* yr, int64_t, int64_t j0, int64_t jt) {
    h16_tile<KAHAN, BLOCK>(ar, bm, yr, j0, jt, d, mf);
  });
}
#else
bool h16_applies(bool, const cpd::Format&, const cpd::Format&, int) { return false; }
#endif

// Stochastic rounding (matmul_sr.h): float32 lanes for formats of sr_lane_applies (F32), float64
// lanes for man <= 19; a tile on a thread that flushes float32 subnormals takes the float64 lanes.
template <bool F32, bool MUL, bool KAHAN, bool BLOCK>
void sr_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::Format& mf,
               const cpd::Format& af, int sr_bits, uint64_t seed, uint64_t offset) {
  cpd::FormatD mg = cpd::make_format_d(mf), ag = cpd::make_format_d(af);
  mg.sr_mask = ag.sr_mask = (0xffffffffull << (32 - sr_bits)) & 0xffffffffull;
  const cpd_cpu::PhiloxKey key = cpd_cpu::philox_key((uint32_t)seed, (uint32_t)(seed >> 32));
  for_each_tile(a, b, y, d, [&](const float* ar, const float* bm, float* yr, int64_t o0, int64_t j0, int64_t jt) {
    const cpd_cpu::SrTile t{d.K, d.L, jt, (uint64_t)o0, offset, key};
    if (F32 && cpd_cpu::float32_subnormals_kept())
      cpd_cpu::sr32_tile<MUL, KAHAN, BLOCK>(ar, bm + j0, d.N, yr + j0, t, mf, af, sr_bits);
    else
      cpd_cpu::sr_tile<MUL, KAHAN, BLOCK>(ar, bm + j0, d.N, yr + j0, t, mg, ag);
  });
}

template <bool F32>
void sr_dispatch(const float* a, const float* b, float* y, const Dims& d, bool has_mul, bool kahan,
                 const cpd::Format& mf, const cpd::Format& af, int sr_bits, uint64_t s, uint64_t o) {
  switch ((has_mul ? 4 : 0) | (kahan ? 2 : 0) | (d.L ? 1 : 0)) {
    case 0: sr_matmul<F32, false, false, false>(a, b, y, d, mf, af, sr_bits, s, o); break;
    case 1: sr_matmul<F32, false, false, true>(a, b, y, d, mf, af, sr_bits, s, o); break;
    case 2: sr_matmul<F32, false, true, false>(a, b, y, d, mf, af, sr_bits, s, o); break;
    case 3: sr_matmul<F32, false, true, true>(a, b, y, d, mf, af, sr_bits, s, o); break;
    case 4: sr_matmul<F32, true, false, false>(a, b, y, d, mf, af, sr_bits, s, o); break;
    case 5: sr_matmul<F32, true, false, true>(a, b, y, d, mf, af, sr_bits, s, o); break;
    case 6: sr_matmul<F32, true, true, false>(a, b, y, d, mf, af, sr_bits, s, o); break;
    default: sr_matmul<F32, true, true, true>(a, b, y, d, mf, af, sr_bits, s, o); break;
  }
}

void generic_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::DotSpec& spec,
                    uint64_t seed, uint64_t offset) {
  const int64_t n_out = d.B * d.M * d.N;
  cpd_cpu::parallel_for(0, n_out, 16, [&](int64_t lo, int64_t hi) {
    const cpd::DotSpec g = spec;
    for (int64_t o = lo; o < hi; ++o) y[o] = dot_output(a, b, d, g, o, seed, offset);
  });
}

// Directed rounding (matmul_directed.h): each tile under DirectedRounding(MODE) on the thread that
// runs it, then its NaN outputs redone by the generic steps (their payloads), outside the guard.
template <int MODE, bool MUL, bool KAHAN, bool BLOCK>
void dir_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd_cpu::DirFormats& g,
                const cpd::DotSpec& spec) {
  for_each_tile(a, b, y, d, [&](const float* ar, const float* bm, float* yr, int64_t o0, int64_t j0, int64_t jt) {
    {
      cpd_cpu::DirectedRounding dir(MODE);
      cpd_cpu::dir_tile<MODE, MUL, KAHAN, BLOCK>(ar, bm + j0, d.N, yr + j0, cpd_cpu::Tile{d.K, d.L, jt}, g);
    }
    redo_generic(a, b, d, spec, yr + j0, o0, jt, false);
  });
}

template <int MODE>
void dir_dispatch(const float* a, const float* b, float* y, const Dims& d, bool has_mul, bool kahan,
                  const cpd_cpu::DirFormats& g, const cpd::DotSpec& sp) {
  switch ((has_mul ? 4 : 0) | (kahan ? 2 : 0) | (d.L ? 1 : 0)) {
    case 0: dir_matmul<MODE, false, false, false>(a, b, y, d, g, sp); break;
    case 1: dir_matmul<MODE, false, false, true>(a, b, y, d, g, sp); break;
    case 2: dir_matmul<MODE, false, true, false>(a, b, y, d, g, sp); break;
    case 3: dir_matmul<MODE, false, true, true>(a, b, y, d, g, sp); break;
    case 4: dir_matmul<MODE, true, false, false>(a, b, y, d, g, sp); break;
    case 5: dir_matmul<MODE, true, false, true>(a, b, y, d, g, sp); break;
    case 6: dir_matmul<MODE, true, true, false>(a, b, y, d, g, sp); break;
    default: dir_matmul<MODE, true, true, true>(a, b, y, d, g, sp); break;
  }
}

// A register chain's tasks (chain_tasks, panels of C::NR columns) in the mode's rounding
// direction: rows(a, b, y, K, N, m0, m1, j0, nc, pack) runs a task's rows out of line (so that the
// direction holds for exactly its float operations: fp_env.h DirectedRounding), then the task's NaN
// outputs are redone by the generic steps, outside the guard.
template <class C, class Rows>
void dir_chain_tasks(const float* a, const float* b, float* y, const Dims& d, const cpd::DotSpec& spec,
                     const Rows& rows) {
  cpd_cpu::chain_tasks(d.B, d.M, d.N, C::NR, 16 * C::MR, [&](int64_t bi, int64_t m0, int64_t m1, int64_t j0,
                                                             int64_t nc, std::vector<float>& pack) {
    float* yb = y + bi * d.M * d.N;
    {
      cpd_cpu::DirectedRounding dir(spec.mode);
      rows(a + bi * d.M * d.K, b + bi * d.K * d.N, yb, d.K, d.N, m0, m1, j0, nc, pack);
    }
    for (int64_t i = m0; i < m1; ++i)
      redo_generic(a, b, d, spec, yb + i * d.N + j0, (bi * d.M + i) * d.N + j0, nc, false);
  });
}

#if CPD_CPU_CHAIN
// The binary32 chain's rows (matmul_chain.h), out of line: into binary32 with exact products and
// plain sums every output is the FMA chain, each FMA rounded in the caller's direction.
__attribute__((noinline)) void dir_chain_rows(const float* a, const float* b, float* y, int64_t K, int64_t N,
                                              int64_t m0, int64_t m1, int64_t j0, int64_t nc,
                                              std::vector<float>& pack) {
  cpd_cpu::chain_rows(a, b, y, K, N, m0, m1, j0, nc, pack);
}
#endif

#if CPD_CPU_H16_CHAIN
// The binary16 chain's bounded products (matmul_h16.h) apply: every operand finite (top bits below
// INF_BITS) and max|a| * max|b| (exact in double: 24 x 24 bits) at most mul's largest value.
bool h16_bounded(uint32_t top_a, uint32_t top_b, const cpd::FormatF& mg) {
  return top_a < cpd::INF_BITS && top_b < cpd::INF_BITS &&
         (double)cpd::float_of(top_a) * (double)cpd::float_of(top_b) <= (double)mg.max;
}

// The register chains in MODE where they apply (matmul_directed.h), every operand finite, plain,
// Kahan or blocked sums: exact products into an acc of fchain_applies (FChainDir) or binary16
// (FChain16Dir) by the fused narrow chain, or with Kahan or blocks (and into binary32) by the
// product chain's exact form; products rounded to a mul of nearest_f_applies with subnormals,
// bounded (h16_bounded: no product overflows), into binary32, fchain_applies or binary16 by the
// product chain. Returns whether they took the call (else the tiles do).
template <int MODE>
bool dir_register_chains(const float* a, const float* b, float* y, const Dims& d, bool has_mul, bool kahan,
                         const cpd::Format& mf, const cpd::Format& af, const cpd::DotSpec& sp) {
  using C = cpd_cpu::H16Chain;
  const bool b32 = is_binary32(af), h16 = is_binary16(af), narrow = cpd_cpu::fchain_applies(af);
  const bool plain = !kahan && !d.L;
  if (!(b32 || h16 || narrow) || (b32 && !has_mul && plain)) return false;  // (the binary32 chain's)
  if (has_mul && !(mf.subnormals && cpd::nearest_f_applies(mf, cpd::NEAREST))) return false;
  const uint32_t top_a = cpd_cpu::max_magnitude_bits(a, d.B * d.M * d.K);
  const uint32_t top_b = cpd_cpu::max_magnitude_bits(b, d.B * d.K * d.N);
  if (top_a >= cpd::INF_BITS || top_b >= cpd::INF_BITS) return false;
  const auto run = [&](const auto& rows) { dir_chain_tasks<C>(a, b, y, d, sp, rows); };
  if (!has_mul && plain) {
    const auto fused = [&](const auto& acc) {
      run([&](const float* ab, const float* bb, float* yb, int64_t K, int64_t N, int64_t m0, int64_t m1, int64_t j0,
              int64_t nc, std::vector<float>& pack) {
        cpd_cpu::dir_fchain_rows(ab, bb, yb, K, N, m0, m1, j0, nc, pack, acc, af);
      });
    };
    if (narrow) fused(cpd_cpu::FChainDir<MODE>(af));
    else fused(cpd_cpu::FChain16Dir{});
    return true;
  }
  const cpd::FormatF mg = cpd::make_format_f(has_mul ? mf : af);
  if (has_mul && !h16_bounded(top_a, top_b, mg)) return false;
  const cpd_cpu::H16Mul m(mg);
  const auto chain = [&](auto prod, const auto& sum) {
    with_steps<decltype(prod)::value>(kahan, d.L, [&](auto kahan_steps, auto blocks) {
      run([&](const float* ab, const float* bb, float* yb, int64_t K, int64_t N, int64_t m0, int64_t m1, int64_t j0,
              int64_t nc, std::vector<float>& pack) {
        cpd_cpu::dir_h16_rows<decltype(prod)::value, decltype(kahan_steps)::value, decltype(blocks)::value>(
            ab, bb, yb, K, d.L, N, m0, m1, j0, nc, pack, m, sum);
      });
    });
  };
  const auto sums = [&](auto prod) {
    if (b32) chain(prod, cpd_cpu::SumB32{});
    else if (narrow) chain(prod, cpd_cpu::SumDir<cpd_cpu::FChainDir<MODE>>(cpd_cpu::FChainDir<MODE>(af)));
    else chain(prod, cpd_cpu::SumDir<cpd_cpu::FChain16Dir>(cpd_cpu::FChain16Dir{}));
  };
  constexpr int kProd = MODE == cpd::TOWARD_ZERO ? cpd_cpu::PROD_MAGNITUDE : cpd_cpu::PROD_SIGNED;
  if (has_mul) sums(std::integral_constant<int, kProd>{});
  else sums(std::integral_constant<int, cpd_cpu::PROD_EXACT>{});
  return true;
}
#endif

// The directed lanes: the binary32 chain or the other register chains (dir_register_chains) where
// they apply (not for path 6, the tests' tiles only), else the tiles.
void directed_matmul(const float* a, const float* b, float* y, const Dims& d, bool has_mul, bool kahan,
                     const cpd::Format& mf, const cpd::Format& af, int mode, bool chain) {
  const cpd::DotSpec sp = cpd::make_dot_spec(mf, has_mul ? 1 : 0, af, kahan ? 1 : 0, (int)d.L, mode, 32);
#if CPD_CPU_CHAIN
  if (chain && !has_mul && !kahan && !d.L && is_binary32(af))
    return dir_chain_tasks<cpd_cpu::ChainVec>(a, b, y, d, sp, dir_chain_rows);
#else
  (void)chain;
#endif
#if CPD_CPU_H16_CHAIN
  if (chain) {
    if (mode == cpd::UP && dir_register_chains<cpd::UP>(a, b, y, d, has_mul, kahan, mf, af, sp)) return;
    if (mode == cpd::DOWN && dir_register_chains<cpd::DOWN>(a, b, y, d, has_mul, kahan, mf, af, sp)) return;
    if (mode == cpd::TOWARD_ZERO && dir_register_chains<cpd::TOWARD_ZERO>(a, b, y, d, has_mul, kahan, mf, af, sp))
      return;
  }
#endif
  const cpd_cpu::DirFormats g{mf, af, cpd_cpu::dir_kind(mf, is_binary32(mf), is_binary16(mf)),
                              cpd_cpu::dir_kind(af, is_binary32(af), is_binary16(af))};
  if (mode == cpd::UP) dir_dispatch<cpd::UP>(a, b, y, d, has_mul, kahan, g, sp);
  else if (mode == cpd::DOWN) dir_dispatch<cpd::DOWN>(a, b, y, d, has_mul, kahan, g, sp);
  else dir_dispatch<cpd::TOWARD_ZERO>(a, b, y, d, has_mul, kahan, g, sp);
}

enum { LANES_GENERIC = 0, LANES_H16 = 16, LANES_F32 = 32, LANES_SR32 = 33, LANES_DIR32 = 34, LANES_F64 = 64 };

struct Plan {
  int lanes;     // LANES_*
  AccKind acc;   // the float32-lane variant (LANES_F32, and LANES_H16 off AVX512-FP16)
  bool guard;    // Kahan's steps may take the guarded lanes (add_lane_guard_applies; matmul_out
                 // checks Kahan and finite operands)
};

// Which loop runs. path: 0 automatic; 1 generic; 2 float64 lanes (no float32 or binary16 lanes);
// 3 float32 lanes without binary16 rounding (round_f where it applies, else integer lanes);
// 4 float32 lanes on integer-lane rounding only; 5 as 3, Kahan's steps on guarded lanes where
// they apply; 6 the directed lanes' tiles (no binary32 chain); 7 as 3, with the register chains
// of float32 lanes, SumF whatever its sums' reach (for the tests of its guard). Then binary16
// lanes, float32 lanes, stochastic float32 lanes (automatic only), directed float32 lanes,
// float64 lanes (nearest; stochastic with formats of man <= 19), or the generic one, whichever
// applies first (paths 2-7 are for the tests, which compare every loop with the generic one).
// Automatic takes the guarded lanes for Kahan's steps where they apply, except into binary16
// (F16C's conversion is the faster rounding there).
Plan plan_for(bool has_mul, const cpd::Format& mf, const cpd::Format& af, int mode, int64_t path) {
  if (path == 0 && h16_applies(has_mul, mf, af, mode)) return {LANES_H16, ACC_H, false};
  if (path == 0 || path == 3 || path == 4 || path == 5 || path == 7) {
    const AccKind kind = f32_kind(has_mul, mf, af, mode, path == 0, path == 4);
    const bool guard = (path == 5 || (path == 0 && kind != ACC_H)) && cpd::add_lane_guard_applies(af, mode);
    if (kind != ACC_NONE) return {kind == ACC_H ? LANES_H16 : LANES_F32, kind, guard};
  }
  if (path == 0 && mode == cpd::STOCHASTIC && cpd::sr_lane_applies(af) && (!has_mul || cpd::sr_lane_applies(mf)))
    return {LANES_SR32, ACC_NONE, false};
  if ((path == 0 || path == 6) && cpd_cpu::kDirectedRounding && cpd::directed_lane_applies(af, mode) &&
      (!has_mul || cpd::directed_lane_applies(mf, mode)))
    return {LANES_DIR32, ACC_NONE, false};
  if (path != 1 && (mode == cpd::NEAREST || (mode == cpd::STOCHASTIC && af.man <= 19 && (!has_mul || mf.man <= 19))))
    return {LANES_F64, ACC_NONE, false};
  return {LANES_GENERIC, ACC_NONE, false};
}

#if CPD_CPU_H16_CHAIN
// The register chains to nearest where they apply (matmul_h16.h, matmul_fchain.h), for plan's
// accumulator and the operands' largest magnitudes' bits top_a, top_b (found here for the float32
// lanes); returns whether they took the call (else the lanes do):
//   * binary16 (ACC_H: automatic only): products rounded to a format with subnormals, plain, Kahan
//     or blocked sums (SumH16, bounded or general form); exact products, plain sums, finite
//     operands: the fused chain (FChain16);
//   * binary32 (ACC_B32): products rounded to a format with subnormals (SumB32), or exact with
//     Kahan or blocks (PROD_EXACT; plain sums of exact products are the binary32 chain's,
//     f32_dispatch);
//   * fchain_applies (ACC_I_NORMAL: TF32, BF16): bounded products rounded to a format with
//     subnormals (SumI), or exact with plain sums and finite operands (the fused chain, FChainAcc);
//   * round_f's accumulators (ACC_F: (6, 7), ... with subnormals): bounded products, plain sums,
//     where no sum is likely to reach SumF's guard (|s| <= K max|a| max|b| <= 2^(emax - 1) but for
//     the roundings' growth; path 7: always): a tripped tile's rows rerun on float32 lanes of one
//     panel's width, at about twice the cost of the lanes alone (all tiles tripping: 101 against
//     44 ms, 512^3).
bool nearest_register_chains(const float* a, const float* b, float* y, const Dims& d, const Plan& plan, int64_t path,
                             bool has_mul, bool kahan, const cpd::Format& mf, const cpd::Format& af, uint32_t top_a,
                             uint32_t top_b) {
  using cpd_cpu::PROD_BOUNDED, cpd_cpu::PROD_EXACT, cpd_cpu::PROD_GENERAL;
  const bool h16 = plan.lanes == LANES_H16 && plan.acc == ACC_H, plain = !kahan && !d.L;
  if (!h16 && !((path == 0 || path == 7) && plan.lanes == LANES_F32)) return false;
  if (plan.acc == ACC_B32 && !has_mul && plain) return false;  // the binary32 chain's (no scan of a, b)
  const bool narrow = plan.acc == ACC_I_NORMAL && cpd_cpu::fchain_applies(af);
  if (!(h16 || plan.acc == ACC_B32 || narrow || (plan.acc == ACC_F && has_mul && plain))) return false;
  if (!h16) {  // (the binary16 lanes' caller has them)
    top_a = cpd_cpu::max_magnitude_bits(a, d.B * d.M * d.K);
    top_b = cpd_cpu::max_magnitude_bits(b, d.B * d.K * d.N);
  }
  const bool finite = top_a < cpd::INF_BITS && top_b < cpd::INF_BITS;
  const cpd::DotSpec sp = cpd::make_dot_spec(mf, has_mul ? 1 : 0, af, kahan ? 1 : 0, (int)d.L, cpd::NEAREST, 32);
  const cpd::FormatF mg = cpd::make_format_f(has_mul ? mf : af);
  const bool rounded = has_mul && mf.subnormals, bounded = rounded && h16_bounded(top_a, top_b, mg);
  if (h16 || plan.acc == ACC_B32) {
    if (rounded) {
      if (h16 && bounded) h16_chain_steps<PROD_BOUNDED>(a, b, y, d, mg, sp, cpd_cpu::SumH16{}, kahan);
      else if (h16) h16_chain_steps<PROD_GENERAL>(a, b, y, d, mg, sp, cpd_cpu::SumH16{}, kahan);
      else if (bounded) h16_chain_steps<PROD_BOUNDED>(a, b, y, d, mg, sp, cpd_cpu::SumB32{}, kahan);
      else h16_chain_steps<PROD_GENERAL>(a, b, y, d, mg, sp, cpd_cpu::SumB32{}, kahan);
      return true;
    }
    if (has_mul) return false;
    if (h16 && path == 0 && plain && finite) fchain_matmul(a, b, y, d, af, sp, cpd_cpu::FChain16{});
    else if (!h16 && !plain) h16_chain_steps<PROD_EXACT>(a, b, y, d, mg, sp, cpd_cpu::SumB32{}, kahan);
    else return false;
    return true;
  }
  if (narrow) {
    if (bounded) h16_chain_steps<PROD_BOUNDED>(a, b, y, d, mg, sp, cpd_cpu::SumI(af), kahan);
    else if (!has_mul && plain && finite) fchain_matmul(a, b, y, d, af, sp, cpd_cpu::FChainAcc(af));
    else return false;
    return true;
  }
  const double reach = (double)cpd::float_of(top_a) * (double)cpd::float_of(top_b) * (double)d.K;
  if (plan.acc == ACC_F && bounded && af.subnormals && plain &&
      (path == 7 || reach <= 0.5 * (double)cpd::float_of(af.max_bits & cpd::INF_BITS))) {
    h16_chain_matmul<PROD_BOUNDED, false, false>(a, b, y, d, mg, sp, cpd_cpu::SumF(af), &af);
    return true;
  }
  return false;
}
#endif

}  // namespace

// The loop matmul_out(..., path = 0) takes for these formats and mode (for the tests).
int64_t matmul_lanes(bool has_mul, int64_t mexp, int64_t mman, int64_t mbias, int64_t mspecials, bool msubnormals,
                     int64_t aexp, int64_t aman, int64_t abias, int64_t aspecials, bool asubnormals, int64_t mode,
                     bool saturate) {
  const cpd::Format mf = cpd::make_format((int)mexp, (int)mman, (int)mbias, (int)mspecials, msubnormals ? 1 : 0,
                                          saturate ? 1 : 0);
  const cpd::Format af = cpd::make_format((int)aexp, (int)aman, (int)abias, (int)aspecials, asubnormals ? 1 : 0,
                                          saturate ? 1 : 0);
  return plan_for(has_mul, mf, af, (int)mode, 0).lanes;
}

// out[b, i, j] = the accumulation of a[b, i, :] . b[b, :, j] (numerics.h, "Accumulation").
// a: (B, M, K), b: (B, K, N), out: (B, M, N), contiguous float32. path: 0 automatic, 1 generic,
// 2 float64 lanes, 3 float32 lanes without binary16, 4 float32 integer lanes, 5 as 3 with guarded
// Kahan lanes, 6 the directed lanes' tiles, 7 as 3 with the register chains (see plan_for).
void matmul_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool has_mul, int64_t mexp,
                int64_t mman, int64_t mbias, int64_t mspecials, bool msubnormals, int64_t aexp, int64_t aman,
                int64_t abias, int64_t aspecials, bool asubnormals, bool kahan, int64_t block, int64_t mode,
                bool saturate, int64_t sr_bits, int64_t seed, int64_t offset, int64_t path) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && out.dim() == 3, "cpd: matmul_out wants 3-d tensors");
  const Dims d{a.size(0), a.size(1), a.size(2), b.size(2), block};
  const cpd::Format mf = cpd::make_format((int)mexp, (int)mman, (int)mbias, (int)mspecials, msubnormals ? 1 : 0,
                                          saturate ? 1 : 0);
  const cpd::Format af = cpd::make_format((int)aexp, (int)aman, (int)abias, (int)aspecials, asubnormals ? 1 : 0,
                                          saturate ? 1 : 0);
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  if (out.numel() == 0) return;
  Plan plan = plan_for(has_mul, mf, af, (int)mode, path);
  // binary16 arithmetic would keep only 10 payload bits of a NaN operand: such calls take the
  // float32 lanes, whose NaN results are the other paths' bit for bit
  uint32_t top_a = 0u, top_b = 0u;  // the largest magnitudes' bits (binary16 lanes)
  if (plan.lanes == LANES_H16) {
    top_a = cpd_cpu::max_magnitude_bits(ap, a.numel());
    top_b = cpd_cpu::max_magnitude_bits(bp, b.numel());
    if (top_a > cpd::INF_BITS || top_b > cpd::INF_BITS) plan = plan_for(has_mul, mf, af, (int)mode, 3);
  }
  const int lanes = plan.lanes;
#if defined(__AVX512FP16__)
  if (lanes == LANES_H16 && has_mul) {
    const cpd::FormatF mg = cpd::make_format_f(mf);
    switch ((kahan ? 2 : 0) | (block ? 1 : 0)) {
      case 0: h16_matmul<false, false>(ap, bp, yp, d, mg); break;
      case 1: h16_matmul<false, true>(ap, bp, yp, d, mg); break;
      case 2: h16_matmul<true, false>(ap, bp, yp, d, mg); break;
      default: h16_matmul<true, true>(ap, bp, yp, d, mg); break;
    }
    return;
  }
#endif
#if CPD_CPU_H16_CHAIN
  if ((lanes == LANES_H16 || lanes == LANES_F32) &&
      nearest_register_chains(ap, bp, yp, d, plan, path, has_mul, kahan, mf, af, top_a, top_b))
    return;
#endif
  if (lanes == LANES_H16 || lanes == LANES_F32) {
    // guarded lanes: finite operands only (no NaN payload reaches their rounding)
    const bool ask = (plan.guard && kahan) || (plan.acc == ACC_B32 && has_mul);
    const bool finite = ask && !cpd_cpu::any_at_least(ap, a.numel(), cpd::INF_BITS) &&
                        !cpd_cpu::any_at_least(bp, b.numel(), cpd::INF_BITS);
    const bool guard = plan.guard && kahan && finite;
    f32_dispatch(plan.acc, ap, bp, yp, d, has_mul, kahan, guard, finite, mf, af);
    return;
  }
  if (lanes == LANES_DIR32) return directed_matmul(ap, bp, yp, d, has_mul, kahan, mf, af, (int)mode, path == 0);
  if (lanes == LANES_F64 && mode == cpd::NEAREST) {
    const cpd::FormatD mg = cpd::make_format_d(mf), ag = cpd::make_format_d(af);
    const int key = (has_mul ? 4 : 0) | (kahan ? 2 : 0) | (block ? 1 : 0);
    switch (key) {
      case 0: fast_matmul<false, false, false>(ap, bp, yp, d, mg, ag); break;
      case 1: fast_matmul<false, false, true>(ap, bp, yp, d, mg, ag); break;
      case 2: fast_matmul<false, true, false>(ap, bp, yp, d, mg, ag); break;
      case 3: fast_matmul<false, true, true>(ap, bp, yp, d, mg, ag); break;
      case 4: fast_matmul<true, false, false>(ap, bp, yp, d, mg, ag); break;
      case 5: fast_matmul<true, false, true>(ap, bp, yp, d, mg, ag); break;
      case 6: fast_matmul<true, true, false>(ap, bp, yp, d, mg, ag); break;
      default: fast_matmul<true, true, true>(ap, bp, yp, d, mg, ag); break;
    }
    return;
  }
  if (lanes == LANES_SR32 || lanes == LANES_F64) {  // stochastic
    if (lanes == LANES_SR32) sr_dispatch<true>(ap, bp, yp, d, has_mul, kahan, mf, af, (int)sr_bits, seed, offset);
    else sr_dispatch<false>(ap, bp, yp, d, has_mul, kahan, mf, af, (int)sr_bits, seed, offset);
    return;
  }
  const cpd::DotSpec spec =
      cpd::make_dot_spec(mf, has_mul ? 1 : 0, af, kahan ? 1 : 0, (int)block, (int)mode, (int)sr_bits);
  generic_matmul(ap, bp, yp, d, spec, (uint64_t)seed, (uint64_t)offset);
}
