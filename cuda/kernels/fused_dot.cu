// CUDA GEMM of the fused-dot-product model (cpd/fused_dot.h). Compiled at run time by NVRTC
// (cpd/_cuda.py compile_source). One thread per output element (grid-stride loop): the chain of
// fd_step over the k-groups in k order from c = +0, on float32 bits: the CPU's generic loop,
// hence the same bits as every CPU path, for every algorithm (NVIDIA, AMD, block-scaled).
#include "cpd/numerics.h"

// a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous float32. sa (B, M, nb), sb (B, nb, N):
// block scales, one per `block` elements along K (null: none), of exponent floor s_emin.
extern "C" __global__ void cpd_fused_dot_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                                float* __restrict__ y, const float* __restrict__ sa,
                                                const float* __restrict__ sb, long long B, long long M, long long K,
                                                long long N, long long nb, int block, int s_emin, int group,
                                                int frac, int out, int a_emin, int b_emin, int zero_exp, int algo,
                                                int ftz) {
  const cpd::FusedDotSpec s = cpd::make_fused_dot_spec(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz);
  const long long n = B * M * N, stride = (long long)blockDim.x * gridDim.x;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += stride) {
    const long long row = o / N, j = o % N, bi = row / M;
    const float* ar = a + row * K;
    const float* bc = b + bi * K * N + j;
    cpd::FdScales x = cpd::fd_no_scales();
    if (sa) {
      x.a = sa + row * nb;
      x.as = 1;
      x.b = sb + bi * nb * N + j;
      x.bs = N;
      x.block = block;
      x.emin = s_emin;
    }
    unsigned int c = 0u;
    for (long long k0 = 0; k0 < K; k0 += group) {
      const int len = (int)(K - k0 < (long long)group ? K - k0 : (long long)group);
      c = cpd::fd_step(s, ar + k0, 1, bc + k0 * N, N, len, c, x, k0);
    }
    y[o] = cpd::float_of(c);
  }
}
