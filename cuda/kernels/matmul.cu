// CUDA matmul over the core's accumulation steps (cpd/accumulate.h). Compiled at run time by
// NVRTC (cpd/_cuda.py); run on the host by the shim in the tests (cuda/shim/cpd_shim.h).
//
// Every output o = (batch, i, j) accumulates k = 0, 1, ..., K-1 in order with dot_step and the
// step's words from dot_words (keyed by (seed, offset, o, K, k)), so its bits are the CPU's
// whatever the tiling, the launch geometry or the device.
#include "cpd/launch.h"
#include "cpd/numerics.h"

#define CPD_THREADS 256  // threads per block of every launch of this file (__launch_bounds__)

// One thread per output element, grid-stride over the B*M*N outputs (64-bit indices), A and B
// read from global memory. a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous.
extern "C" __global__ void __launch_bounds__(CPD_THREADS)
    cpd_matmul_simple(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, long long B,
                      long long M, long long K, long long N, int has_mul, int mexp, int mman, int mbias,
                      int mspecials, int msubnormals, int aexp, int aman, int abias, int aspecials, int asubnormals,
                      int kahan, int block, int mode, int saturate, int sr_bits, unsigned long long seed,
                      unsigned long long offset) {
  const cpd::Format mf = cpd::make_format(mexp, mman, mbias, mspecials, msubnormals, saturate);
  const cpd::Format af = cpd::make_format(aexp, aman, abias, aspecials, asubnormals, saturate);
  const cpd::DotSpec d = cpd::make_dot_spec(mf, has_mul, af, kahan, block, mode, sr_bits);
  const long long n = B * M * N, stride = cpd::grid_stride(blockDim.x, gridDim.x);
  cpd::u32 w[cpd::DOT_WORDS];
  for (long long o = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); o < n; o += stride) {
    const long long row = o / N, j = o - row * N, bi = row / M;
    const float* ar = a + row * K;
    const float* bc = b + bi * K * N + j;
    cpd::u32 s = 0u, c = 0u, bs = 0u;
    for (long long k = 0; k < K; ++k) {
      cpd::dot_words((unsigned long long)o, (unsigned long long)K, (unsigned long long)k, seed, offset, mode,
                     cpd::dot_needs_high(d, (unsigned long long)k, (unsigned long long)K), w);
      cpd::dot_step(d, cpd::bits_of(ar[k]), cpd::bits_of(bc[k * N]), (unsigned long long)k, (unsigned long long)K, s,
                    c, bs, w);
    }
    y[o] = cpd::float_of(s);
  }
}

// ------------------------------------------------------------------------------------------
// The tiled kernel. A block of 256 threads (16 x 16) owns a tile of (16 RM) x (16 RN) outputs of
// one batch element; thread (tx, ty) owns the RM x RN outputs (ty + 16 i, tx + 16 j), whose sums
// (s, Kahan's c, the block sum bs) live in registers. K is walked in slices of 16: the block loads
// the TM x 16 slice of A and the 16 x TN slice of B into shared memory (zeros outside the
// matrices, never used), waits, and every thread applies step k of each of its outputs for
// k = k0, k0 + 1, ... in order. An output's steps, operands and random words (dot_words, keyed
// by its flat index o) are those of the simple kernel and of the CPU: tiling across outputs
// changes no bit. The block grid-strides over the B * ceil(M/TM) * ceil(N/TN) tiles (the loop
// bound is uniform in a block, so every thread reaches every barrier).
//
// Round to nearest with f32_lanes (the CPU matmul's float32 lanes, cpd/arith.h mul_f/add_f: the
// products rounded to mul are values of an accumulator of at most 11 bits) runs each step as a
// few float32 operations, on a 4 x 4 register tile; everything else runs dot_step on float32 bits,
// on a 2 x 2 tile: dot_step is long, and inlining it 16 times made ptxas take two minutes per
// architecture (and 219 registers) for no gain in a loop bound by integer work. Both give the
// bits of the generic steps (checked on the host by tests/test_shim.py against the CPU extension).
// __launch_bounds__(256, 1): without the minimum of one block per SM, ptxas aims at 128
// registers and spills the 4 x 4 float32-lane tile.
#define CPD_TM 64
#define CPD_TN 64
#define CPD_TK 16
#define CPD_RM 4  // outputs per thread along M (rows ty + 16 i)
#define CPD_RN 4  // outputs per thread along N (cols tx + 16 j)
#define CPD_GM 2  // the generic steps' register tile: 2 x 2 outputs per thread (32 x 32 per block)
#define CPD_GN 2

namespace {

// The CPU extension's float32-lane condition (cuda/cpu/matmul.cpp f32_applies).
__device__ __forceinline__ bool f32_lanes(const cpd::DotSpec& d) {
  return d.has_mul && cpd::nearest_f_applies(d.mf, d.mode) && cpd::nearest_f_applies(d.af, d.mode) &&
         cpd::add_fast_applies(d.af, d.mode) && cpd::values_within(d.mf, d.af);
}

// Kahan's step with the incoming value p on float32 lanes: y = p - c, t = s + y, c = (t - s) - y, s = t.
__device__ __forceinline__ void kahan_f(float& s, float& c, float p, const cpd::FormatF& g) {
  const float y = cpd::float_of(cpd::add_f(p, -c, g));
  const float t = cpd::float_of(cpd::add_f(s, y, g));
  c = cpd::float_of(cpd::add_f(cpd::float_of(cpd::add_f(t, -s, g)), -y, g));
  s = t;
}

// As[kk][m]: A's slice, transposed (+1: no bank conflicts on the transposing store); Bs[kk][n].
template <bool F32, int RM, int RN>
__device__ __forceinline__ void tiled(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                                      long long B, long long M, long long K, long long N, const cpd::DotSpec& d,
                                      unsigned long long seed, unsigned long long offset, float (*As)[CPD_TM + 1],
                                      float (*Bs)[CPD_TN]) {
  constexpr int TM = 16 * RM, TN = 16 * RN;
  const int tx = (int)(threadIdx.x % 16u), ty = (int)(threadIdx.x / 16u);
  const long long tiles_m = (M + TM - 1) / TM, tiles_n = (N + TN - 1) / TN;
  const long long tiles = B * tiles_m * tiles_n;
  const cpd::FormatF mg = cpd::make_format_f(d.mf), ag = cpd::make_format_f(d.af);
  cpd::u32 w[cpd::DOT_WORDS];
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const long long bi = t / (tiles_m * tiles_n), rest = t - bi * tiles_m * tiles_n;
    const long long m0 = (rest / tiles_n) * TM, n0 = (rest % tiles_n) * TN;
    const float* ab = a + bi * M * K;
    const float* bb = b + bi * K * N;
    cpd::u32 s[RM][RN], c[RM][RN], bs[RM][RN];
    float fs[RM][RN], fc[RM][RN], fb[RM][RN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < RN; ++j) {
        s[i][j] = c[i][j] = bs[i][j] = 0u;
        fs[i][j] = fc[i][j] = fb[i][j] = 0.0f;
      }
    for (long long k0 = 0; k0 < K; k0 += CPD_TK) {
      // TM x 16 elements of A and 16 x TN of B: RM (RN) of each per thread, coalesced along K (A) and N (B).
      for (int e = (int)threadIdx.x; e < TM * CPD_TK; e += CPD_THREADS) {
        const int m = e / CPD_TK, kk = e % CPD_TK;
        const long long gm = m0 + m, gk = k0 + kk;
        As[kk][m] = (gm < M && gk < K) ? ab[gm * K + gk] : 0.0f;
      }
      for (int e = (int)threadIdx.x; e < CPD_TK * TN; e += CPD_THREADS) {
        const int kk = e / TN, n = e % TN;
        const long long gk = k0 + kk, gn = n0 + n;
        Bs[kk][n] = (gk < K && gn < N) ? bb[gk * N + gn] : 0.0f;
      }
      __syncthreads();
      const int kn = K - k0 < CPD_TK ? (int)(K - k0) : CPD_TK;
      for (int kk = 0; kk < kn; ++kk) {
        const unsigned long long k = (unsigned long long)(k0 + kk);
        float av[RM], bv[RN];
#pragma unroll
        for (int i = 0; i < RM; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < RN; ++j) bv[j] = Bs[kk][tx + 16 * j];
        if (F32) {
          const bool run_end = d.block && ((k + 1) % (unsigned long long)d.block == 0 || k + 1 == (unsigned long long)K);
#pragma unroll
          for (int i = 0; i < RM; ++i)
#pragma unroll
            for (int j = 0; j < RN; ++j) {
              const float p = cpd::float_of(cpd::mul_f(av[i], bv[j], mg));
              if (d.block) {
                fb[i][j] = cpd::float_of(cpd::add_f(fb[i][j], p, ag));
                if (run_end) {
                  if (d.kahan) kahan_f(fs[i][j], fc[i][j], fb[i][j], ag);
                  else fs[i][j] = cpd::float_of(cpd::add_f(fs[i][j], fb[i][j], ag));
                  fb[i][j] = 0.0f;
                }
              } else if (d.kahan) {
                kahan_f(fs[i][j], fc[i][j], p, ag);
              } else {
                fs[i][j] = cpd::float_of(cpd::add_f(fs[i][j], p, ag));
              }
            }
        } else {
          const int high = cpd::dot_needs_high(d, k, (unsigned long long)K);
#pragma unroll
          for (int i = 0; i < RM; ++i)
#pragma unroll
            for (int j = 0; j < RN; ++j) {
              const unsigned long long o = (unsigned long long)((bi * M + m0 + ty + 16 * i) * N + n0 + tx + 16 * j);
              cpd::dot_words(o, (unsigned long long)K, k, seed, offset, d.mode, high, w);
              cpd::dot_step(d, cpd::bits_of(av[i]), cpd::bits_of(bv[j]), k, (unsigned long long)K, s[i][j], c[i][j],
                            bs[i][j], w);
            }
        }
      }
      __syncthreads();  // the slice is read by all before the next one overwrites it
    }
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < RN; ++j) {
        const long long gm = m0 + ty + 16 * i, gn = n0 + tx + 16 * j;
        if (gm < M && gn < N) y[(bi * M + gm) * N + gn] = F32 ? fs[i][j] : cpd::float_of(s[i][j]);
      }
  }
}

}  // namespace

// a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous; launched with 256 threads per block and
// any number of blocks (cpd/_kernels.py matmul).
extern "C" __global__ void __launch_bounds__(CPD_THREADS, 1)
    cpd_matmul_tiled(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, long long B,
                     long long M, long long K, long long N, int has_mul, int mexp, int mman, int mbias, int mspecials,
                     int msubnormals, int aexp, int aman, int abias, int aspecials, int asubnormals, int kahan,
                     int block, int mode, int saturate, int sr_bits, unsigned long long seed,
                     unsigned long long offset) {
  const cpd::Format mf = cpd::make_format(mexp, mman, mbias, mspecials, msubnormals, saturate);
  const cpd::Format af = cpd::make_format(aexp, aman, abias, aspecials, asubnormals, saturate);
  const cpd::DotSpec d = cpd::make_dot_spec(mf, has_mul, af, kahan, block, mode, sr_bits);
  __shared__ float As[CPD_TK][CPD_TM + 1];
  __shared__ float Bs[CPD_TK][CPD_TN];
  if (f32_lanes(d))
    tiled<true, CPD_RM, CPD_RN>(a, b, y, B, M, K, N, d, seed, offset, As, Bs);
  else
    tiled<false, CPD_GM, CPD_GN>(a, b, y, B, M, K, N, d, seed, offset, As, Bs);
}
