// CPU matmul over the core's accumulation steps (numerics.h, "Accumulation"). Bound into the
// extension module by cast.cpp.
//
// Two paths, the same bits:
//   * round-to-nearest: a tile of up to kTile outputs of one row (i, j0 .. j0 + kTile) keeps its
//     accumulators as doubles in arrays; for each k the loop over j reads row k of b (contiguous)
//     and applies round_d / add_d (branch-free, so GCC vectorizes it: 8 doubles per AVX-512 op).
//   * stochastic rounding with formats of man <= 19: the same tiles, round_d_sr / add_d_sr, each
//     lane computing its step's Philox words;
//   * any mode (directed rounding, wide formats, and the reference for the tests): one output
//     at a time, dot_step on float32 bits, the step's random words from dot_words.
// Work is split over (batch, row, tile) or over outputs with at::parallel_for; an output's bits
// depend only on its operands and (seed, offset, o, K), never on the split.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "cpd/numerics.h"

namespace {

constexpr int64_t kTile = 64;

struct Dims {
  int64_t B, M, K, N, L;  // L: block length (0: none)
};

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
  const int64_t tiles = (d.N + kTile - 1) / kTile, tasks = d.B * d.M * tiles;
  at::parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t row = t / tiles, j0 = (t % tiles) * kTile, bi = row / d.M;
      fast_tile<MUL, KAHAN, BLOCK>(a + row * d.K, b + bi * d.K * d.N, y + row * d.N, j0,
                                   std::min(kTile, d.N - j0), d, mg, ag);
    }
  });
}

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
  const int64_t tiles = (d.N + kTile - 1) / kTile, tasks = d.B * d.M * tiles;
  at::parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t row = t / tiles, j0 = (t % tiles) * kTile, bi = row / d.M;
      sr_tile<MUL, KAHAN, BLOCK>(a + row * d.K, b + bi * d.K * d.N, y + row * d.N, row * d.N + j0, j0,
                                 std::min(kTile, d.N - j0), d, mg, ag, seed, offset);
    }
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

}  // namespace

// out[b, i, j] = the accumulation of a[b, i, :] . b[b, :, j] (numerics.h, "Accumulation").
// a: (B, M, K), b: (B, K, N), out: (B, M, N), contiguous float32. path: 0 automatic, 1 generic.
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
  if (mode == cpd::NEAREST && path == 0) {
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
  if (mode == cpd::STOCHASTIC && path == 0 && af.man <= 19 && (!has_mul || mf.man <= 19)) {
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
