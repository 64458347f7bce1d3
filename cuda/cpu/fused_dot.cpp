// CPU GEMM of the fused-dot-product model (cpd/fused_dot.h): out[b, i, j] = the chain of
// fused_dot_step over the k-groups of a[b, i, :] . b[b, :, j], in k order, from c = +0.
//
// Three loops, the same bits (the tests compare each with the generic one):
//   * float32 carriers (fd_float_applies: FP8/binary16 inputs, F <= ~16: the Hopper/Ada FP8
//     presets) and
//   * float64 carriers (any input format): a tile of up to kTile outputs of one row keeps its
//     accumulators in arrays; per group, one pass takes emax per lane from the operands'
//     precomputed exponents, a second adds trunc(a*b * 2^(F - emax)) per lane (straight-line, so
//     GCC vectorizes both), then round_out;
//   * generic: one output at a time, fused_dot_step on float32 bits (the specification).
// Registered as torch.ops.cpd_fused_dot.matmul (a TORCH_LIBRARY of its own: the extension's
// pybind module lives in cast.cpp) and called by cpd/tensor_core.py.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpd/numerics.h"
#include "parallel.h"  // cpd_cpu::parallel_for: threaded with or without OpenMP

namespace {

constexpr int64_t kTile = 64;

struct FdDims {
  int64_t B, M, K, N;
};

template <class T>
void fd_tile(const float* __restrict arow, const int32_t* __restrict earow, const float* __restrict b,
             const int32_t* __restrict eb, float* __restrict out, int64_t j0, int64_t jt, const FdDims& d,
             const cpd::FusedDotSpec& s, const cpd::FormatD& g16) {
  typedef cpd::FdCarrier<T> C;
  T c[kTile], acc[kTile], raw[kTile], sc[kTile];
  int32_t em[kTile];
  for (int64_t jj = 0; jj < kTile; ++jj) c[jj] = (T)0;
  const int L = s.group, F = s.frac;
  for (int64_t k0 = 0; k0 < d.K; k0 += L) {
    const int64_t k1 = std::min<int64_t>(d.K, k0 + L);
    for (int64_t jj = 0; jj < jt; ++jj) em[jj] = C::exp_of(c[jj], s.c_emin, s.zero_exp);
    for (int64_t k = k0; k < k1; ++k) {
      const int32_t ea = earow[k];
      const int32_t* __restrict ebr = eb + k * d.N + j0;
      for (int64_t jj = 0; jj < jt; ++jj) em[jj] = std::max(em[jj], ea + ebr[jj]);
    }
    for (int64_t jj = 0; jj < jt; ++jj) {
      sc[jj] = C::pow2(F - em[jj]);
      acc[jj] = C::trunc(c[jj] * sc[jj]);
      raw[jj] = c[jj];
    }
    for (int64_t k = k0; k < k1; ++k) {
      const T av = (T)arow[k];
      const float* __restrict br = b + k * d.N + j0;
      for (int64_t jj = 0; jj < jt; ++jj) {
        const T p = av * (T)br[jj];  // exact in the carrier
        acc[jj] += C::trunc(p * sc[jj]);
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

std::vector<int32_t> exponents(const float* x, int64_t n, int emin, int zero_exp) {
  std::vector<int32_t> e((size_t)n);
  int32_t* ep = e.data();
  cpd_cpu::parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) ep[i] = cpd::fd_exp(cpd::bits_of(x[i]), emin, zero_exp);
  });
  return e;
}

template <class T>
void fd_lanes(const float* a, const float* b, float* y, const FdDims& d, const cpd::FusedDotSpec& s) {
  const std::vector<int32_t> ea = exponents(a, d.B * d.M * d.K, s.a_emin, s.zero_exp);
  const std::vector<int32_t> eb = exponents(b, d.B * d.K * d.N, s.b_emin, s.zero_exp);
  const cpd::FormatD g16 = cpd::make_format_d(cpd::make_format(5, 10, 15, cpd::SPECIALS_IEEE, 1, 0));
  const int64_t tiles = (d.N + kTile - 1) / kTile, tasks = d.B * d.M * tiles;
  cpd_cpu::parallel_for(0, tasks, 1, [&](int64_t lo, int64_t hi) {
    const cpd::FusedDotSpec sl = s;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t row = t / tiles, j0 = (t % tiles) * kTile, bi = row / d.M;
      fd_tile<T>(a + row * d.K, ea.data() + row * d.K, b + bi * d.K * d.N, eb.data() + bi * d.K * d.N,
                 y + row * d.N, j0, std::min(kTile, d.N - j0), d, sl, g16);
    }
  });
}

void fd_generic(const float* a, const float* b, float* y, const FdDims& d, const cpd::FusedDotSpec& s) {
  cpd_cpu::parallel_for(0, d.B * d.M * d.N, 16, [&](int64_t lo, int64_t hi) {
    const cpd::FusedDotSpec sl = s;
    for (int64_t o = lo; o < hi; ++o) {
      const int64_t row = o / d.N, j = o % d.N, bi = row / d.M;
      const float* ar = a + row * d.K;
      const float* bc = b + bi * d.K * d.N + j;
      uint32_t c = 0u;
      for (int64_t k0 = 0; k0 < d.K; k0 += sl.group) {
        const int n = (int)std::min<int64_t>(sl.group, d.K - k0);
        c = cpd::fused_dot_step(sl, ar + k0, 1, bc + k0 * d.N, d.N, n, c);
      }
      y[o] = cpd::float_of(c);
    }
  });
}

enum { FD_AUTO = 0, FD_GENERIC = 1, FD_DOUBLE = 2 };

// Which loop runs: 1 generic, 2 float64 carriers, 3 float32 carriers.
int64_t fd_lanes_for(const cpd::FusedDotSpec& s, int64_t a_man, int64_t a_emax, int64_t b_man, int64_t b_emax,
                     int64_t path) {
  if (path == FD_GENERIC) return 1;
  if (path == FD_AUTO && cpd::fd_float_applies(s, (int)a_man, (int)a_emax, (int)b_man, (int)b_emax)) return 3;
  return 2;
}

cpd::FusedDotSpec spec_of(int64_t group, int64_t frac, int64_t out, int64_t a_emin, int64_t b_emin, int64_t zero_exp) {
  TORCH_CHECK(group >= 1 && frac >= 0 && frac <= 40 && out >= 0 && out <= 2 && a_emin >= -126 && b_emin >= -126,
              "cpd: fused_dot parameters out of range");
  return cpd::make_fused_dot_spec((int)group, (int)frac, (int)out, (int)a_emin, (int)b_emin, (int)zero_exp);
}

// a: (B, M, K), b: (B, K, N) contiguous float32; returns (B, M, N). a_man/a_emax, b_man/b_emax:
// the input formats' mantissa bits and largest exponent (for the float32-carrier test).
torch::Tensor fused_dot_matmul(const torch::Tensor& a, const torch::Tensor& b, int64_t group, int64_t frac,
                               int64_t out, int64_t a_emin, int64_t b_emin, int64_t zero_exp, int64_t a_man,
                               int64_t a_emax, int64_t b_man, int64_t b_emax, int64_t path) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
              "cpd: fused_dot matmul wants a (B, M, K) and b (B, K, N)");
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.is_contiguous() &&
              b.is_contiguous(), "cpd: fused_dot matmul wants contiguous float32 tensors");
  const cpd::FusedDotSpec s = spec_of(group, frac, out, a_emin, b_emin, zero_exp);
  const FdDims d{a.size(0), a.size(1), a.size(2), b.size(2)};
  torch::Tensor y = torch::empty({d.B, d.M, d.N}, a.options());
  if (y.numel() == 0) return y;
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  switch (fd_lanes_for(s, a_man, a_emax, b_man, b_emax, path)) {
    case 1: fd_generic(ap, bp, yp, d, s); break;
    case 3: fd_lanes<float>(ap, bp, yp, d, s); break;
    default: fd_lanes<double>(ap, bp, yp, d, s); break;
  }
  return y;
}

// The loop fused_dot_matmul(..., path = 0) takes (for the tests).
int64_t fused_dot_lanes(int64_t group, int64_t frac, int64_t out, int64_t a_emin, int64_t b_emin, int64_t zero_exp,
                        int64_t a_man, int64_t a_emax, int64_t b_man, int64_t b_emax) {
  return fd_lanes_for(spec_of(group, frac, out, a_emin, b_emin, zero_exp), a_man, a_emax, b_man, b_emax, FD_AUTO);
}

}  // namespace

TORCH_LIBRARY(cpd_fused_dot, m) {
  m.def("matmul", &fused_dot_matmul);
  m.def("lanes", &fused_dot_lanes);
}
