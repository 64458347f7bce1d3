// CUDA matmul over the core's accumulation steps (numerics.h, "Accumulation"). Compiled at run
// time by NVRTC (cpd/_cuda.py). One thread per output element (grid-stride loop), the steps of
// dot_step on float32 bits with the step's random words from dot_words: the same bits as the CPU
// (whose round-to-nearest path computes the same values on float64 carriers).
#include "cpd/numerics.h"

// a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous. seed: the int64 (seed, offset) pair.
extern "C" __global__ void cpd_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ y, long long B, long long M, long long K, long long N,
                                      int has_mul, int mexp, int mman, int mbias, int mspecials, int msubnormals,
                                      int aexp, int aman, int abias, int aspecials, int asubnormals, int kahan,
                                      int block, int mode, int saturate, int sr_bits,
                                      const long long* __restrict__ seed) {
  const cpd::Format mf = cpd::make_format(mexp, mman, mbias, mspecials, msubnormals, saturate);
  const cpd::Format af = cpd::make_format(aexp, aman, abias, aspecials, asubnormals, saturate);
  const cpd::DotSpec d = cpd::make_dot_spec(mf, has_mul, af, kahan, block, mode, sr_bits);
  const unsigned long long s0 = (unsigned long long)seed[0], o0 = (unsigned long long)seed[1];
  const long long n = B * M * N, stride = (long long)blockDim.x * gridDim.x;
  unsigned int w[cpd::DOT_WORDS];
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += stride) {
    const long long row = o / N, j = o % N, bi = row / M;
    const float* ar = a + row * K;
    const float* bc = b + bi * K * N + j;
    unsigned int s = 0u, c = 0u, bs = 0u;
    for (long long k = 0; k < K; ++k) {
      cpd::dot_words((unsigned long long)o, (unsigned long long)K, (unsigned long long)k, s0, o0, mode,
                     cpd::dot_needs_high(d, (unsigned long long)k, (unsigned long long)K), w);
      cpd::dot_step(d, cpd::bits_of(ar[k]), cpd::bits_of(bc[k * N]), (unsigned long long)k,
                    (unsigned long long)K, s, c, bs, w);
    }
    y[o] = cpd::float_of(s);
  }
}
