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
