// CPU matmul over the core's accumulation steps (numerics.h, "Accumulation"). Bound into the
// extension module by cast.cpp.
//
// Several loops, the same bits (lanes_for picks one; the tests compare each with the generic one):
//   * binary16 lanes: round to nearest into an IEEE binary16 accumulator on CPUs with
//     AVX512-FP16: products on float32 lanes (mul_f), sums in the processor's binary16 adds;
//   * float32 lanes: round to nearest when products rounded to mul are values of an accumulator
//     of at most 11 bits (mul_f, add_f: 16 floats per AVX-512 op);
//   * float64 lanes, round to nearest otherwise: a tile of up to kTile outputs of one row
//     (i, j0 .. j0 + kTile) keeps its accumulators as doubles in arrays; for each k the loop over
//     j reads row k of b (contiguous) and applies round_d / add_d (branch-free, so GCC vectorizes
//     it: 8 doubles per AVX-512 op);
//   * stochastic rounding with formats of man <= 19: the same tiles, round_d_sr / add_d_sr, each
//     lane computing its step's Philox words;
//   * any mode (directed rounding, wide formats, and the reference for the tests): one output
//     at a time, dot_step on float32 bits, the step's random words from dot_words.
// Work is split over (batch, row, tile) or over outputs with at::parallel_for; an output's bits
// depend only on its operands and (seed, offset, o, K), never on the split.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#if defined(__AVX512FP16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cpd/numerics.h"

namespace {

constexpr int64_t kTile = 64;

struct Dims {
  int64_t B, M, K, N, L;  // L: block length (0: none)
};

// Calls tile(a_row, b_batch, y_row, o0, j0, jt) for every tile of up to kTile outputs of one row
// (outputs j0 .. j0 + jt of that row; o0 the flat index of the first), split over the threads.
template <class Tile>
void for_each_tile(const float* a, const float* b, float* y, const Dims& d, const Tile& tile) {
  const int64_t tiles = (d.N + kTile - 1) / kTile, tasks = d.B * d.M * tiles;
  at::parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t row = t / tiles, j0 = (t % tiles) * kTile, bi = row / d.M;
      tile(a + row * d.K, b + bi * d.K * d.N, y + row * d.N, row * d.N + j0, j0, std::min(kTile, d.N - j0));
    }
  });
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
        double y = cpd::add_d(p, -c[jj], ag);
        double t = cpd::add_d(s[jj], y, ag);
        double ts = cpd::add_d(t, -s[jj], ag);
        c[jj] = cpd::add_d(ts, -y, ag);
        s[jj] = t;
      } else {
        s[jj] = cpd::add_d(s[jj], p, ag);
      }
    }
    if (BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K)) {
      for (int64_t jj = 0; jj < jt; ++jj) {
        if (KAHAN) {
          double y = cpd::add_d(bs[jj], -c[jj], ag);
          double t = cpd::add_d(s[jj], y, ag);
          double ts = cpd::add_d(t, -s[jj], ag);
          c[jj] = cpd::add_d(ts, -y, ag);
          s[jj] = t;
        } else {
          s[jj] = cpd::add_d(s[jj], bs[jj], ag);
        }
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

// Round to nearest on float32 lanes (16 per AVX-512 op), when both formats have numerics.h's
// float32 rounding (nearest_f_applies), a product rounded to mul is a value of acc
// (values_within) and acc's sums are add_bits_fast's (add_fast_applies). Every step is then
//   p = mul_f(a, b)        (a*b + C rounded once by an FMA: the product rounded to mul)
//   s = add_f(s, p)        (fl32(s + p) rounded to acc: Figueroa)
// which numerics.h shows equal to the exact steps; the tests compare this path with the generic
// one bit for bit (products of every pair of values, midpoints and neighbours of 8-bit formats).
inline bool f32_applies(bool has_mul, const cpd::Format& mf, const cpd::Format& af, int mode) {
  return has_mul && cpd::nearest_f_applies(mf, mode) && cpd::nearest_f_applies(af, mode) &&
         cpd::add_fast_applies(af, mode) && cpd::values_within(mf, af);
}

inline float acc_add(float x, float y, const cpd::FormatF& g) { return cpd::float_of(cpd::add_f(x, y, g)); }

// Kahan's step with the incoming value p: y = p - c, t = s + y, c = (t - s) - y, s = t.
inline void kahan_f(float& s, float& c, float p, const cpd::FormatF& g) {
  const float y = acc_add(p, -c, g);
  const float t = acc_add(s, y, g);
  c = acc_add(acc_add(t, -s, g), -y, g);
  s = t;
}

template <bool KAHAN, bool BLOCK>
void f32_tile(const float* __restrict arow, const float* __restrict b, float* __restrict out, int64_t j0,
              int64_t jt, const Dims& d, const cpd::FormatF& mf0, const cpd::FormatF& af0) {
  const cpd::FormatF mf = mf0, af = af0;
  float s[kTile], c[kTile], bs[kTile];
  for (int64_t jj = 0; jj < kTile; ++jj) s[jj] = c[jj] = bs[jj] = 0.0f;
  for (int64_t k = 0; k < d.K; ++k) {
    const float av = arow[k];
    const float* __restrict br = b + k * d.N + j0;
    for (int64_t jj = 0; jj < jt; ++jj) {
      const float p = cpd::float_of(cpd::mul_f(av, br[jj], mf));
      if (BLOCK) bs[jj] = acc_add(bs[jj], p, af);
      else if (KAHAN) kahan_f(s[jj], c[jj], p, af);
      else s[jj] = acc_add(s[jj], p, af);
    }
    if (BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K)) {
      for (int64_t jj = 0; jj < jt; ++jj) {
        if (KAHAN) kahan_f(s[jj], c[jj], bs[jj], af);
        else s[jj] = acc_add(s[jj], bs[jj], af);
        bs[jj] = 0.0f;
      }
    }
  }
  for (int64_t jj = 0; jj < jt; ++jj) out[j0 + jj] = s[jj];
}

template <bool KAHAN, bool BLOCK>
void f32_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::FormatF& mf,
                const cpd::FormatF& af) {
  for_each_tile(a, b, y, d, [&](const float* ar, const float* bm, float* yr, int64_t, int64_t j0, int64_t jt) {
    f32_tile<KAHAN, BLOCK>(ar, bm, yr, j0, jt, d, mf, af);
  });
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
  return f32_applies(has_mul, mf, af, mode) && af.exp == 5 && af.man == 10 && af.bias == 15 &&
         af.specials == cpd::SPECIALS_IEEE && af.subnormals && af.outward_bits == cpd::INF_BITS;
}

inline void kahan_h(_Float16& s, _Float16& c, _Float16 p) {
  const _Float16 y = p - c;
  const _Float16 t = s + y;
  c = (t - s) - y;
  s = t;
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

// Stochastic rounding on float64 carriers (formats with man <= 19, see round_d_sr): the same
// loop as fast_tile; lane jj is output o0 + jj (o0 = the flat index of column j0). The same
// tiles, each lane drawing its step's words (numerics.h dot_words: words 0-3 are
// Philox block 2 * (o * K + k), words 4-7 the next block) with the Philox rounds vectorized
// across lanes.
template <bool MUL, bool KAHAN, bool BLOCK>
void sr_tile(const float* __restrict arow, const float* __restrict b, float* __restrict out, int64_t o0, int64_t j0,
             int64_t jt, const Dims& d, const cpd::FormatD& mg, const cpd::FormatD& ag, uint64_t seed,
             uint64_t offset) {
  double s[kTile], c[kTile], bs[kTile];
  for (int64_t jj = 0; jj < kTile; ++jj) s[jj] = c[jj] = bs[jj] = 0.0;
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32), c2 = (uint32_t)offset,
                 c3 = (uint32_t)(offset >> 32);
  for (int64_t k = 0; k < d.K; ++k) {
    const double av = (double)arow[k];
    const float* __restrict br = b + k * d.N + j0;
    const bool run_end = BLOCK && ((k + 1) % d.L == 0 || k + 1 == d.K);
    for (int64_t jj = 0; jj < jt; ++jj) {
      const uint64_t blk = ((uint64_t)(o0 + jj) * (uint64_t)d.K + (uint64_t)k) * 2u;
      const cpd::U32x4 w = cpd::philox4x32_10((uint32_t)blk, (uint32_t)(blk >> 32), c2, c3, k0, k1);
      double p = av * (double)br[jj];
      if (MUL) p = cpd::round_d_sr(p, mg, w.v[0]);
      if (BLOCK) {
        bs[jj] = cpd::add_d_sr(bs[jj], p, ag, w.v[1]);
      } else if (KAHAN) {
        const cpd::U32x4 w2 = cpd::philox4x32_10((uint32_t)(blk + 1), (uint32_t)((blk + 1) >> 32), c2, c3, k0, k1);
        double y = cpd::add_d_sr(p, -c[jj], ag, w.v[1]);
        double t = cpd::add_d_sr(s[jj], y, ag, w.v[2]);
        double ts = cpd::add_d_sr(t, -s[jj], ag, w.v[3]);
        c[jj] = cpd::add_d_sr(ts, -y, ag, w2.v[0]);
        s[jj] = t;
      } else {
        s[jj] = cpd::add_d_sr(s[jj], p, ag, w.v[1]);
      }
    }
    if (run_end) {
      for (int64_t jj = 0; jj < jt; ++jj) {
        const uint64_t blk = ((uint64_t)(o0 + jj) * (uint64_t)d.K + (uint64_t)k) * 2u + 1u;
        const cpd::U32x4 w = cpd::philox4x32_10((uint32_t)blk, (uint32_t)(blk >> 32), c2, c3, k0, k1);
        if (KAHAN) {
          double y = cpd::add_d_sr(bs[jj], -c[jj], ag, w.v[0]);
          double t = cpd::add_d_sr(s[jj], y, ag, w.v[1]);
          double ts = cpd::add_d_sr(t, -s[jj], ag, w.v[2]);
          c[jj] = cpd::add_d_sr(ts, -y, ag, w.v[3]);
          s[jj] = t;
        } else {
          s[jj] = cpd::add_d_sr(s[jj], bs[jj], ag, w.v[0]);
        }
        bs[jj] = 0.0;
      }
    }
  }
  for (int64_t jj = 0; jj < jt; ++jj) out[j0 + jj] = (float)s[jj];
}

template <bool MUL, bool KAHAN, bool BLOCK>
void sr_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::FormatD& mg,
               const cpd::FormatD& ag, uint64_t seed, uint64_t offset) {
  for_each_tile(a, b, y, d, [&](const float* ar, const float* bm, float* yr, int64_t o0, int64_t j0, int64_t jt) {
    sr_tile<MUL, KAHAN, BLOCK>(ar, bm, yr, o0, j0, jt, d, mg, ag, seed, offset);
  });
}

void generic_matmul(const float* a, const float* b, float* y, const Dims& d, const cpd::DotSpec& spec,
                    uint64_t seed, uint64_t offset) {
  const int64_t n_out = d.B * d.M * d.N;
  at::parallel_for(0, n_out, 16, [&](int64_t lo, int64_t hi) {
    const cpd::DotSpec g = spec;
    uint32_t w[cpd::DOT_WORDS];
    for (int64_t o = lo; o < hi; ++o) {
      const int64_t row = o / d.N, j = o % d.N, bi = row / d.M;
      const float* ar = a + row * d.K;
      const float* bc = b + bi * d.K * d.N + j;
      uint32_t s = 0u, c = 0u, bs = 0u;
      for (int64_t k = 0; k < d.K; ++k) {
        cpd::dot_words((uint64_t)o, (uint64_t)d.K, (uint64_t)k, seed, offset, g.mode,
                       cpd::dot_needs_high(g, (uint64_t)k, (uint64_t)d.K), w);
        cpd::dot_step(g, cpd::bits_of(ar[k]), cpd::bits_of(bc[k * d.N]), (uint64_t)k, (uint64_t)d.K, s, c, bs, w);
      }
      y[o] = cpd::float_of(s);
    }
  });
}

// Whether x[0 .. n) holds a NaN (one vectorized pass per span, in parallel).
bool any_nan(const float* x, int64_t n) {
  std::atomic<bool> found{false};
  at::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    uint32_t nan = 0;
    for (int64_t i = lo; i < hi; ++i) nan |= (uint32_t)((cpd::bits_of(x[i]) & ~cpd::SIGN) > cpd::INF_BITS);
    if (nan) found = true;
  });
  return found;
}

enum { LANES_GENERIC = 0, LANES_H16 = 16, LANES_F32 = 32, LANES_F64 = 64 };

// Which loop runs (path: 0 automatic, 1 generic, 2 no float32 or binary16 lanes, 3 no binary16
// lanes): binary16 lanes, float32 lanes, float64 lanes (nearest; stochastic with formats of
// man <= 19), or the generic one.
int lanes_for(bool has_mul, const cpd::Format& mf, const cpd::Format& af, int mode, int64_t path) {
  if (path == 0 && h16_applies(has_mul, mf, af, mode)) return LANES_H16;
  if ((path == 0 || path == 3) && f32_applies(has_mul, mf, af, mode)) return LANES_F32;
  if (path != 1 && (mode == cpd::NEAREST || (mode == cpd::STOCHASTIC && af.man <= 19 && (!has_mul || mf.man <= 19))))
    return LANES_F64;
  return LANES_GENERIC;
}

}  // namespace

// The loop matmul_out(..., path = 0) takes for these formats and mode (for the tests).
int64_t matmul_lanes(bool has_mul, int64_t mexp, int64_t mman, int64_t mbias, int64_t mspecials, bool msubnormals,
                     int64_t aexp, int64_t aman, int64_t abias, int64_t aspecials, bool asubnormals, int64_t mode,
                     bool saturate) {
  const cpd::Format mf = cpd::make_format((int)mexp, (int)mman, (int)mbias, (int)mspecials, msubnormals ? 1 : 0,
                                          saturate ? 1 : 0);
  const cpd::Format af = cpd::make_format((int)aexp, (int)aman, (int)abias, (int)aspecials, asubnormals ? 1 : 0,
                                          saturate ? 1 : 0);
  return lanes_for(has_mul, mf, af, (int)mode, 0);
}

// out[b, i, j] = the accumulation of a[b, i, :] . b[b, :, j] (numerics.h, "Accumulation").
// a: (B, M, K), b: (B, K, N), out: (B, M, N), contiguous float32. path: 0 automatic, 1 generic,
// 2 no float32 or binary16 lanes, 3 no binary16 lanes (see lanes_for).
void matmul_out(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& out, bool has_mul, int64_t mexp,
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
  int lanes = lanes_for(has_mul, mf, af, (int)mode, path);
  if (lanes == LANES_H16 && (any_nan(ap, a.numel()) || any_nan(bp, b.numel()))) lanes = LANES_F32;
#if defined(__AVX512FP16__)
  if (lanes == LANES_H16) {
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
  if (lanes == LANES_F32) {
    const cpd::FormatF mg = cpd::make_format_f(mf), ag = cpd::make_format_f(af);
    switch ((kahan ? 2 : 0) | (block ? 1 : 0)) {
      case 0: f32_matmul<false, false>(ap, bp, yp, d, mg, ag); break;
      case 1: f32_matmul<false, true>(ap, bp, yp, d, mg, ag); break;
      case 2: f32_matmul<true, false>(ap, bp, yp, d, mg, ag); break;
      default: f32_matmul<true, true>(ap, bp, yp, d, mg, ag); break;
    }
    return;
  }
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
  if (lanes == LANES_F64) {  // stochastic
    cpd::FormatD mg = cpd::make_format_d(mf), ag = cpd::make_format_d(af);
    mg.sr_mask = ag.sr_mask = (0xffffffffull << (32 - sr_bits)) & 0xffffffffull;
    const uint64_t s = (uint64_t)seed, o = (uint64_t)offset;
    const int key = (has_mul ? 4 : 0) | (kahan ? 2 : 0) | (block ? 1 : 0);
    switch (key) {
      case 0: sr_matmul<false, false, false>(ap, bp, yp, d, mg, ag, s, o); break;
      case 1: sr_matmul<false, false, true>(ap, bp, yp, d, mg, ag, s, o); break;
      case 2: sr_matmul<false, true, false>(ap, bp, yp, d, mg, ag, s, o); break;
      case 3: sr_matmul<false, true, true>(ap, bp, yp, d, mg, ag, s, o); break;
      case 4: sr_matmul<true, false, false>(ap, bp, yp, d, mg, ag, s, o); break;
      case 5: sr_matmul<true, false, true>(ap, bp, yp, d, mg, ag, s, o); break;
      case 6: sr_matmul<true, true, false>(ap, bp, yp, d, mg, ag, s, o); break;
      default: sr_matmul<true, true, true>(ap, bp, yp, d, mg, ag, s, o); break;
    }
    return;
  }
  const cpd::DotSpec spec =
      cpd::make_dot_spec(mf, has_mul ? 1 : 0, af, kahan ? 1 : 0, (int)block, (int)mode, (int)sr_bits);
  generic_matmul(ap, bp, yp, d, spec, (uint64_t)seed, (uint64_t)offset);
}
