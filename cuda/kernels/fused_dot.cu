// CUDA GEMM of the fused-dot-product model (cpd/fused_dot.h). Compiled at run time by NVRTC
// (cpd/_cuda.py compile_source). One thread per output element (grid-stride loop): the chain of
// fused_dot_step over the k-groups in k order from c = +0, on float32 bits: the CPU's generic
// loop, hence the same bits as every CPU path.
#include "cpd/numerics.h"

// a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous float32.
extern "C" __global__ void cpd_fused_dot_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                                float* __restrict__ y, long long B, long long M, long long K,
                                                long long N, int group, int frac, int out, int a_emin,
                                                int b_emin, int zero_exp) {
  const cpd::FusedDotSpec s = cpd::make_fused_dot_spec(group, frac, out, a_emin, b_emin, zero_exp);
  const long long n = B * M * N, stride = (long long)blockDim.x * gridDim.x;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += stride) {
    const long long row = o / N, j = o % N, bi = row / M;
    const float* ar = a + row * K;
    const float* bc = b + bi * K * N + j;
    unsigned int c = 0u;
    for (long long k0 = 0; k0 < K; k0 += group) {
      const int len = (int)(K - k0 < (long long)group ? K - k0 : (long long)group);
      c = cpd::fused_dot_step(s, ar + k0, 1, bc + k0 * N, N, len, c);
    }
    y[o] = cpd::float_of(c);
  }
}
