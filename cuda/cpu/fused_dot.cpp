// CPU GEMM of the fused-dot-product model (cpd/fused_dot.h): out[b, i, j] = the chain of
// fused_dot_step over the k-groups of a[b, i, :] . b[b, :, j], in k order, from c = +0.
//
// Three loops, the same bits (the tests compare each with the generic one):
//   * float32 carriers (fd_float_applies: FP8/binary16 inputs, F <= ~16: the Hopper/Ada FP8
//     presets) and
//   * float64 carriers (any input format): a tile of up to kTile outputs of one row keeps its
//     accumulators in arrays; per group, one pass takes emax per lane from the operands'
//     precomputed exponents, a second adds trunc(a*b * 2^(F - emax)) per lane (straight-line, so
//     GCC vectorizes both), then round_out; block scales (mxf8f6f4, every group inside one
//     block) add their exponents per lane and fold into the per-lane power of two;
//   * AMD CDNA3 on float64 carriers (fd_tile_amd), the same tiles;
//   * generic: one output at a time, fd_step on float32 bits (the specification); the only loop
//     for CDNA1/2's pairwise sums and Blackwell's mxf4nvf4 chunks.
// Registered as torch.ops.cpd_fused_dot.matmul (a TORCH_LIBRARY of its own: the extension's
// pybind module lives in cast.cpp); torch.ops.cpd_fused_dot.install() gives the op
// cpd::fused_dot_matmul (schema, fake and CUDA kernels in cpd/_tensor_core_op.py) its CPU and
// autograd kernels from C++, so a call from Python has no Python below cpd.tensor_core_matmul.
// Light torch headers (torch/extension.h takes about 30 s of CPU to parse per source file).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "cpd/numerics.h"
#include "launch.h"  // cpd_launch::fused_dot: the CUDA kernels' launch (a GPU, or the host shim)
#include "matmul_backward.h"
#include "matmul_batch.h"
#include "parallel.h"  // cpd_cpu::parallel_for: threaded with or without OpenMP

namespace {

constexpr int64_t kTile = 64;

struct FdDims {
  int64_t B, M, K, N;
};

template <class T>
void fd_tile(const float* __restrict arow, const int32_t* __restrict earow, const float* __restrict b,
             const int32_t* __restrict eb, float* __restrict out, int64_t j0, int64_t jt, const FdDims& d,
             const cpd::FusedDotSpec& s, const cpd::FormatD& g16, const int32_t* __restrict xarow,
             const int32_t* __restrict xb, int64_t block) {
  typedef cpd::FdCarrier<T> C;
  T c[kTile], acc[kTile], raw[kTile], sc[kTile], scp[kTile];
  int32_t em[kTile], ep[kTile], xs[kTile];
  for (int64_t jj = 0; jj < kTile; ++jj) {
    c[jj] = (T)0;
    xs[jj] = 0;
  }
  const int L = s.group, F = s.frac;
  for (int64_t k0 = 0; k0 < d.K; k0 += L) {
    const int64_t k1 = std::min<int64_t>(d.K, k0 + L);
    if (xarow) {  // the group's block: a's scale exponent plus each column's
      const int64_t g = k0 / block;
      const int32_t* __restrict xbr = xb + g * d.N + j0;
      for (int64_t jj = 0; jj < jt; ++jj) xs[jj] = xarow[g] + xbr[jj];
    }
    for (int64_t jj = 0; jj < jt; ++jj) ep[jj] = INT32_MIN / 2;
    for (int64_t k = k0; k < k1; ++k) {
      const int32_t ea = earow[k];
      const int32_t* __restrict ebr = eb + k * d.N + j0;
      for (int64_t jj = 0; jj < jt; ++jj) ep[jj] = std::max(ep[jj], ea + ebr[jj]);
    }
    for (int64_t jj = 0; jj < jt; ++jj) em[jj] = std::max(C::exp_of(c[jj], s.c_emin, s.zero_exp), ep[jj] + xs[jj]);
    for (int64_t jj = 0; jj < jt; ++jj) {
      sc[jj] = C::pow2(F - em[jj]);
      scp[jj] = C::pow2(F - em[jj] + xs[jj]);  // a product's scaling, its block scales folded in
      acc[jj] = C::trunc(c[jj] * sc[jj]);
      raw[jj] = c[jj];
    }
    for (int64_t k = k0; k < k1; ++k) {
      const T av = (T)arow[k];
      const float* __restrict br = b + k * d.N + j0;
      for (int64_t jj = 0; jj < jt; ++jj) {
        const T p = av * (T)br[jj];  // exact in the carrier
        acc[jj] += C::trunc(p * scp[jj]);
        raw[jj] += p;
      }
    }
    for (int64_t jj = 0; jj < jt; ++jj) {
      const T v = acc[jj] * C::pow2(em[jj] - F);
      uint32_t r;
      if (sizeof(T) == 8) r = cpd::fd_round_out_d((double)v, s, g16);
      else r = cpd::fd_round_out_f((float)v, s);
      const uint32_t rb = cpd::bits_of((float)raw[jj]);
      const uint32_t special = cpd::sel((uint32_t)((rb & ~cpd::SIGN) > cpd::INF_BITS), cpd::fd_canonical_nan(s.out),
                                        (rb & cpd::SIGN) | cpd::INF_BITS);
      r = cpd::sel((uint32_t)C::finite(raw[jj]), r, special);
      c[jj] = (T)cpd::float_of(r);
    }
  }
  for (int64_t jj = 0; jj < jt; ++jj) out[j0 + jj] = (float)c[jj];
}

// AMD CDNA3 (FD_AMD_RD, FD_AMD_RD_FP8) on float64 carriers, the lanes of fd_tile: per group,
// the products' largest exponent per half (FP8: even / odd k; else one), the cut sums
// trunc(p 2^(24 - e_h)) (< 2^30, exact), the halves' round-down alignment (floor), then with
// m = max(e, e(c)): floor(S 2^(7 + e - m)) + 128 floor(c 2^(24 - m)) (FP8: c dropped when
// e(c) < m - 25), times 2^(m - 31), exact, rounded to nearest float32 (fd_amd_round_d).
// Products of magnitude >= 2^128 and non-finite operands take fused_dot.h's rules per lane.
template <bool FP8>
void fd_tile_amd(const float* __restrict arow, const int32_t* __restrict earow, const float* __restrict b,
                 const int32_t* __restrict eb, float* __restrict out, int64_t j0, int64_t jt, const FdDims& d,
                 const cpd::FusedDotSpec& s) {
  typedef cpd::FdCarrier<double> C;
  double c[kTile], S0[kTile], S1[kTile], raw[kTile], hi[kTile], lo[kTile], sc0[kTile], sc1[kTile];
  int32_t e0[kTile], e1[kTile];
  for (int64_t jj = 0; jj < kTile; ++jj) c[jj] = 0.0;
  const int L = s.group;
  const double big = 3.402823669209385e38;  // 2^128
  for (int64_t k0 = 0; k0 < d.K; k0 += L) {
    const int64_t k1 = std::min<int64_t>(d.K, k0 + L);
    for (int64_t jj = 0; jj < jt; ++jj) e0[jj] = e1[jj] = 2 * s.zero_exp;  // zero-padded halves
    for (int64_t k = k0; k < k1; ++k) {
      const int32_t ea = earow[k];
      const int32_t* __restrict ebr = eb + k * d.N + j0;
      int32_t* __restrict e = (FP8 && ((k - k0) & 1)) ? e1 : e0;
      for (int64_t jj = 0; jj < jt; ++jj) e[jj] = std::max(e[jj], ea + ebr[jj]);
    }
    for (int64_t jj = 0; jj < jt; ++jj) {
      sc0[jj] = C::pow2(24 - e0[jj]);
      sc1[jj] = C::pow2(24 - e1[jj]);
      S0[jj] = S1[jj] = 0.0;
      raw[jj] = c[jj];
      hi[jj] = lo[jj] = 0.0;
    }
    for (int64_t k = k0; k < k1; ++k) {
      const double av = (double)arow[k];
      const float* __restrict br = b + k * d.N + j0;
      const bool odd = FP8 && ((k - k0) & 1);
      double* __restrict S = odd ? S1 : S0;
      const double* __restrict sc = odd ? sc1 : sc0;
      for (int64_t jj = 0; jj < jt; ++jj) {
        const double p = av * (double)br[jj];  // exact
        S[jj] += C::trunc(p * sc[jj]);
        raw[jj] += p;
        hi[jj] = p > hi[jj] ? p : hi[jj];
        lo[jj] = p < lo[jj] ? p : lo[jj];
      }
    }
    for (int64_t jj = 0; jj < jt; ++jj) {
      int e = e0[jj];
      double S = S0[jj];
      if (FP8) {
        e = std::max(e0[jj], e1[jj]);
        S = C::floor(S0[jj] * C::pow2(e0[jj] - e)) + C::floor(S1[jj] * C::pow2(e1[jj] - e));
      }
      const int ec = C::exp_of(c[jj], -126, s.zero_exp), m = std::max(e, ec);
      const double sp = C::floor(S * C::pow2(7 + e - m));
      double cp = C::floor(c[jj] * C::pow2(24 - m));
      if (FP8 && ec < m - 25) cp = 0.0;
      uint32_t r = cpd::fd_amd_round_d((sp + cp * 128.0) * C::pow2(m - 31));
      const uint32_t pinf = (uint32_t)(hi[jj] >= big), ninf = (uint32_t)(lo[jj] <= -big);
      r = cpd::sel(pinf | ninf, (pinf & ninf) ? cpd::FD_AMD_NAN : ((ninf ? cpd::SIGN : 0u) | cpd::INF_BITS), r);
      const uint32_t rb = cpd::bits_of((float)raw[jj]);
      const uint32_t special = cpd::sel((uint32_t)((rb & ~cpd::SIGN) > cpd::INF_BITS), cpd::FD_AMD_NAN,
                                        (rb & cpd::SIGN) | cpd::INF_BITS);
      r = cpd::sel((uint32_t)C::finite(raw[jj]), r, special);
      c[jj] = (double)cpd::float_of(r);
    }
  }
  for (int64_t jj = 0; jj < jt; ++jj) out[j0 + jj] = (float)c[jj];
}

std::vector<int32_t> exponents(const float* x, int64_t n, int emin, int zero_exp) {
  std::vector<int32_t> e((size_t)n);
  int32_t* ep = e.data();
  cpd_cpu::parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) ep[i] = cpd::fd_exp(cpd::bits_of(x[i]), emin, zero_exp);
  });
  return e;
}

// Block scales as given to the op: sa (B, M, nb), sb (B, nb, N) float32 values (numel 0: none).
struct FdBlockScales {
  const float* sa;
  const float* sb;
  int64_t nb, block;
  int emin;
};

template <class T>
void fd_lanes(const float* a, const float* b, float* y, const FdDims& d, const cpd::FusedDotSpec& s,
              const FdBlockScales& bs) {
  const std::vector<int32_t> ea = exponents(a, d.B * d.M * d.K, s.a_emin, s.zero_exp);
  const std::vector<int32_t> eb = exponents(b, d.B * d.K * d.N, s.b_emin, s.zero_exp);
  std::vector<int32_t> xa, xb;  // the scales' exponents e(S)
  if (bs.sa) {
    xa = exponents(bs.sa, d.B * d.M * bs.nb, bs.emin, bs.emin);
    xb = exponents(bs.sb, d.B * bs.nb * d.N, bs.emin, bs.emin);
  }
  const cpd::FormatD g16 = cpd::make_format_d(cpd::make_format(5, 10, 15, cpd::SPECIALS_IEEE, 1, 0));
  const int64_t tiles = (d.N + kTile - 1) / kTile, tasks = d.B * d.M * tiles;
  cpd_cpu::parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    const cpd::FusedDotSpec sl = s;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t row = t / tiles, j0 = (t % tiles) * kTile, bi = row / d.M;
      const float* ar = a + row * d.K;
      const int32_t* ear = ea.data() + row * d.K;
      const float* bb = b + bi * d.K * d.N;
      const int32_t* ebb = eb.data() + bi * d.K * d.N;
      const int64_t jt = std::min(kTile, d.N - j0);
      if (sl.algo == cpd::FD_AMD_RD) fd_tile_amd<false>(ar, ear, bb, ebb, y + row * d.N, j0, jt, d, sl);
      else if (sl.algo == cpd::FD_AMD_RD_FP8) fd_tile_amd<true>(ar, ear, bb, ebb, y + row * d.N, j0, jt, d, sl);
      else
        fd_tile<T>(ar, ear, bb, ebb, y + row * d.N, j0, jt, d, sl, g16, bs.sa ? xa.data() + row * bs.nb : nullptr,
                   bs.sa ? xb.data() + bi * bs.nb * d.N : nullptr, bs.block);
    }
  });
}

void fd_generic(const float* a, const float* b, float* y, const FdDims& d, const cpd::FusedDotSpec& s,
                const FdBlockScales& bs) {
  cpd_cpu::parallel_for(0, d.B * d.M * d.N, 16, [&](int64_t lo, int64_t hi) {
    const cpd::FusedDotSpec sl = s;
    for (int64_t o = lo; o < hi; ++o) {
      const int64_t row = o / d.N, j = o % d.N, bi = row / d.M;
      const float* ar = a + row * d.K;
      const float* bc = b + bi * d.K * d.N + j;
      cpd::FdScales x = cpd::fd_no_scales();
      if (bs.sa) {
        x.a = bs.sa + row * bs.nb;
        x.as = 1;
        x.b = bs.sb + bi * bs.nb * d.N + j;
        x.bs = d.N;
        x.block = (int)bs.block;
        x.emin = bs.emin;
      }
      uint32_t c = 0u;
      for (int64_t k0 = 0; k0 < d.K; k0 += sl.group) {
        const int n = (int)std::min<int64_t>(sl.group, d.K - k0);
        c = cpd::fd_step(sl, ar + k0, 1, bc + k0 * d.N, d.N, n, c, x, k0);
      }
      y[o] = cpd::float_of(c);
    }
  });
}

enum { FD_AUTO = 0, FD_GENERIC = 1, FD_DOUBLE = 2 };

// Which loop runs: 1 generic, 2 float64 carriers, 3 float32 carriers. The carriers model FD_NV
// (block scales too when every group lies in one block) and AMD CDNA3 (fd_tile_amd), and need
// their sums exact: in float64, (L + 1) terms below 2^(F + 2) stay below 2^53
// (F + 2 + ceil(log2(L + 1)) <= 53); CDNA3's terms are below 2^26.
int64_t fd_lanes_for(const cpd::FusedDotSpec& s, int64_t a_man, int64_t a_emax, int64_t b_man, int64_t b_emax,
                     int64_t path, int64_t scaled, int64_t block) {
  if (path == FD_GENERIC || s.algo == cpd::FD_AMD_PAIRWISE || s.algo == cpd::FD_NV_CHUNK16) return 1;
  if (s.algo == cpd::FD_AMD_RD || s.algo == cpd::FD_AMD_RD_FP8) return s.group <= 64 ? 2 : 1;  // sums < 2^31
  if (scaled && block % s.group != 0) return 1;
  int bits = 0;
  while ((1 << bits) < s.group + 1) ++bits;
  if (s.frac + 2 + bits > 53) return 1;
  if (path == FD_AUTO && !scaled && cpd::fd_float_applies(s, (int)a_man, (int)a_emax, (int)b_man, (int)b_emax))
    return 3;
  return 2;
}

// Whether every one of p[0, n) is finite (by its bits: the build's math flags cannot drop it).
bool all_finite(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!cpd::is_finite_bits(cpd::bits_of(p[i]))) return false;
  return true;
}

cpd::FusedDotSpec spec_of(int64_t group, int64_t frac, int64_t out, int64_t a_emin, int64_t b_emin, int64_t zero_exp,
                          int64_t algo, int64_t ftz) {
  TORCH_CHECK(group >= 1 && frac >= 0 && frac <= 40 && out >= 0 && out <= 2 && a_emin >= -126 && b_emin >= -126 &&
                  algo >= 0 && algo <= 4 && (algo != cpd::FD_AMD_PAIRWISE || group <= 16),
              "cpd: fused_dot parameters out of range");
  return cpd::make_fused_dot_spec((int)group, (int)frac, (int)out, (int)a_emin, (int)b_emin, (int)zero_exp,
                                  (int)algo, (int)ftz);
}

// a: (B, M, K), b: (B, K, N) contiguous float32; returns (B, M, N). sa (B, M, nb), sb (B, nb, N):
// block scales (float32 values; both empty: none), one per `block` elements along K, whose
// format's exponent floor is s_emin. a_man/a_emax, b_man/b_emax: the input formats' mantissa bits
// and largest exponent (for the float32-carrier test). path: 0 auto, 1 generic, 2 float64.
at::Tensor fused_dot_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                               const at::Tensor& sb, int64_t block, int64_t s_emin, int64_t group, int64_t frac,
                               int64_t out, int64_t a_emin, int64_t b_emin, int64_t zero_exp, int64_t algo,
                               int64_t ftz, int64_t a_man, int64_t a_emax, int64_t b_man, int64_t b_emax,
                               int64_t path) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
              "cpd: fused_dot matmul wants a (B, M, K) and b (B, K, N)");
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.is_contiguous() &&
              b.is_contiguous(), "cpd: fused_dot matmul wants contiguous float32 tensors");
  const cpd::FusedDotSpec s = spec_of(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz);
  const FdDims d{a.size(0), a.size(1), a.size(2), b.size(2)};
  FdBlockScales bs{nullptr, nullptr, 0, block < 1 ? 1 : block, (int)s_emin};
  const bool scaled = sa.numel() > 0;
  if (scaled) {
    TORCH_CHECK(block >= 1 && s_emin >= -127 && s_emin <= 0, "cpd: fused_dot block scales: bad block or s_emin");
    const int64_t nb = (d.K + block - 1) / block;
    TORCH_CHECK(sa.scalar_type() == at::kFloat && sb.scalar_type() == at::kFloat && sa.is_contiguous() &&
                    sb.is_contiguous() && sa.dim() == 3 && sb.dim() == 3 && sa.size(0) == d.B && sa.size(1) == d.M &&
                    sa.size(2) == nb && sb.size(0) == d.B && sb.size(1) == nb && sb.size(2) == d.N,
                "cpd: fused_dot block scales want contiguous float32 sa (B, M, ceil(K/block)) and sb (B, ceil(K/block), N)");
    bs.sa = sa.data_ptr<float>();
    bs.sb = sb.data_ptr<float>();
    bs.nb = nb;
  }
  TORCH_CHECK(s.algo != cpd::FD_NV_CHUNK16 || scaled, "cpd: fused_dot chunk16 (mxf4nvf4) needs block scales");
  at::Tensor y = at::empty({d.B, d.M, d.N}, a.options());
  if (y.numel() == 0) return y;
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // A scale that is not finite (E8M0's NaN; +-inf as a float32) makes its steps special
  // (fused_dot.h fd_special: c + the sum of a b S_a S_b in float64, NaN or +-inf); the carriers
  // watch the elements' specials only, so such a call takes the generic loop.
  if (scaled && path != FD_GENERIC && !(all_finite(bs.sa, sa.numel()) && all_finite(bs.sb, sb.numel())))
    path = FD_GENERIC;
  switch (fd_lanes_for(s, a_man, a_emax, b_man, b_emax, path, scaled, bs.block)) {
    case 1: fd_generic(ap, bp, yp, d, s, bs); break;
    case 3: fd_lanes<float>(ap, bp, yp, d, s, bs); break;
    default: fd_lanes<double>(ap, bp, yp, d, s, bs); break;
  }
  return y;
}

// The loop fused_dot_matmul(..., path = 0) takes (for the tests).
int64_t fused_dot_lanes(int64_t group, int64_t frac, int64_t out, int64_t a_emin, int64_t b_emin, int64_t zero_exp,
                        int64_t algo, int64_t ftz, int64_t a_man, int64_t a_emax, int64_t b_man, int64_t b_emax,
                        int64_t scaled, int64_t block) {
  return fd_lanes_for(spec_of(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz), a_man, a_emax, b_man, b_emax,
                      FD_AUTO, scaled, block);
}

// ------------------------------------------------------------------ cpd::fused_dot_matmul
// The kernels of cpd::fused_dot_matmul(a, b, sa, sb, block, s_emin, group, frac, out, a_emin,
// b_emin, zero_exp, algo, ftz, a_man, a_emax, b_man, b_emax): a (..., M, K) @ b (..., K, N) with the
// batch dims broadcast, block scales sa (..., M, nb) and sb (..., nb, N) broadcast the same way
// (empty: none); on contiguous (B, M, K) / (B, K, N) copies, the loops above or (kernels) the
// CUDA kernels' launch (cpd_launch::fused_dot: the GPU, or the host shim on CPU tensors).
at::Tensor fused_dot_op(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                        int64_t block, int64_t s_emin, int64_t group, int64_t frac, int64_t out, int64_t a_emin,
                        int64_t b_emin, int64_t zero_exp, int64_t algo, int64_t ftz, int64_t a_man, int64_t a_emax,
                        int64_t b_man, int64_t b_emax, bool kernels) {
  TORCH_CHECK(a.dim() >= 2 && b.dim() >= 2 && a.size(-1) == b.size(-2), "cpd: fused_dot_matmul shapes ", a.sizes(),
              " and ", b.sizes(), " do not match");
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const cpd_cpu::MatmulBatch batch(a, b);
  at::Tensor sa3 = sa, sb3 = sb;
  if (sa.numel()) {
    TORCH_CHECK(sa.dim() >= 2 && sb.dim() >= 2, "cpd: fused_dot_matmul block scales want sa (..., M, nb), sb (..., nb, N)");
    const int64_t nb = sa.size(-1);
    sa3 = batch.as3(sa, M, nb);
    sb3 = batch.as3(sb, nb, N);
  }
  const at::Tensor a3 = batch.as3(a, M, K), b3 = batch.as3(b, K, N);
  at::Tensor y;
  if (kernels) {  // the CUDA kernels (cuda/kernels/fused_dot.cu) on the GPU, or through the host shim
    TORCH_CHECK(a3.scalar_type() == at::kFloat && b3.scalar_type() == at::kFloat && a3.device() == b3.device(),
                "cpd: fused_dot_matmul wants float32 a and b on one device");
    TORCH_CHECK(!sa.numel() || (block >= 1 && s_emin >= -127 && s_emin <= 0 && sa3.scalar_type() == at::kFloat &&
                                sb3.scalar_type() == at::kFloat && sa3.size(2) == (K + block - 1) / block),
                "cpd: fused_dot block scales want block >= 1, s_emin in -127..0, float32 sa (..., M, ceil(K/block)) "
                "and sb (..., ceil(K/block), N)");
    spec_of(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz);  // the range checks
    y = at::empty({batch.B, M, N}, a3.options());
    const cpd_launch::FdParams p{int(group), int(frac), int(out), int(a_emin), int(b_emin), int(zero_exp), int(algo),
                                 int(ftz),   int(a_man), int(b_man)};
    cpd_launch::fused_dot(a3, b3, sa3, sb3, y, block, s_emin, p);
  } else {
    y = fused_dot_matmul(a3, b3, sa3, sb3, block, s_emin, group, frac, out, a_emin, b_emin, zero_exp, algo, ftz, a_man,
                         a_emax, b_man, b_emax, 0);
  }
  return y.view(batch.shape(M, N));
}

// The CPU kernel: the loops, or under cpd._shim.on_host (ops.cpp set_cpu_kernels) the CUDA
// kernels through the host shim, marshalled as on a GPU.
at::Tensor fused_dot_op_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                            int64_t block, int64_t s_emin, int64_t group, int64_t frac, int64_t out, int64_t a_emin,
                            int64_t b_emin, int64_t zero_exp, int64_t algo, int64_t ftz, int64_t a_man, int64_t a_emax,
                            int64_t b_man, int64_t b_emax) {
  return fused_dot_op(a, b, sa, sb, block, s_emin, group, frac, out, a_emin, b_emin, zero_exp, algo, ftz, a_man,
                      a_emax, b_man, b_emax, cpd_launch::host_kernels());
}

// The CUDA kernel: cuda/kernels/fused_dot.cu launched from C++ (cpd_launch::fused_dot).
at::Tensor fused_dot_op_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                             int64_t block, int64_t s_emin, int64_t group, int64_t frac, int64_t out, int64_t a_emin,
                             int64_t b_emin, int64_t zero_exp, int64_t algo, int64_t ftz, int64_t a_man,
                             int64_t a_emax, int64_t b_man, int64_t b_emax) {
  return fused_dot_op(a, b, sa, sb, block, s_emin, group, frac, out, a_emin, b_emin, zero_exp, algo, ftz, a_man,
                      a_emax, b_man, b_emax, true);
}

// The autograd kernel (every device): the op below autograd, then the straight-through node of
// cpd::matmul (the gradients of the exact float32 product a @ b; the scales get none).
at::Tensor fused_dot_op_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                                 int64_t block, int64_t s_emin, int64_t group, int64_t frac, int64_t out,
                                 int64_t a_emin, int64_t b_emin, int64_t zero_exp, int64_t algo, int64_t ftz,
                                 int64_t a_man, int64_t a_emax, int64_t b_man, int64_t b_emax) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cpd::fused_dot_matmul", "")
                             .typed<decltype(fused_dot_op_cpu)>();
  at::Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    y = op.call(a, b, sa, sb, block, s_emin, group, frac, out, a_emin, b_emin, zero_exp, algo, ftz, a_man, a_emax,
                b_man, b_emax);
  }
  if (cpd_cpu::wants_grad(a, b)) cpd_cpu::record_matmul_backward(y, a, b, "cpd::FusedDotMatmulBackward");
  return y;
}

// Once; cpd/_tensor_core_op.py first destroys its Python CPU and autograd registrations. Never
// destroyed (the dispatcher may be gone at exit). install_fused_dot_cuda: the CUDA kernel, once
// (cpd/_tensor_core_op.py first destroys its Python CUDA registration).
void install_fused_dot() {
  static torch::Library* cpu = nullptr;
  static torch::Library* autograd = nullptr;
  if (cpu) return;
  cpu = new torch::Library(torch::Library::IMPL, "cpd", c10::DispatchKey::CPU, __FILE__, __LINE__);
  cpu->impl("fused_dot_matmul", TORCH_FN(fused_dot_op_cpu));
  autograd = new torch::Library(torch::Library::IMPL, "cpd", c10::DispatchKey::Autograd, __FILE__, __LINE__);
  autograd->impl("fused_dot_matmul", TORCH_FN(fused_dot_op_autograd));
}

void install_fused_dot_cuda() {
  static torch::Library* cuda = nullptr;
  if (cuda) return;
  cuda = new torch::Library(torch::Library::IMPL, "cpd", c10::DispatchKey::CUDA, __FILE__, __LINE__);
  cuda->impl("fused_dot_matmul", TORCH_FN(fused_dot_op_cuda));
}

}  // namespace

TORCH_LIBRARY(cpd_fused_dot, m) {
  m.def("matmul", &fused_dot_matmul);
  m.def("lanes", &fused_dot_lanes);
  m.def("install", &install_fused_dot);
  m.def("install_cuda", &install_fused_dot_cuda);
}
