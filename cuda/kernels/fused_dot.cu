// CUDA GEMM of the fused-dot-product model (cpd/fused_dot.h). Compiled at run time by NVRTC
// (cpd/_cuda.py compile_source). One thread per output element (grid-stride loop): the chain of
// fd_step over the k-groups in k order from c = +0, on float32 bits: the CPU's generic loop,
// hence the same bits as every CPU path, for every algorithm (NVIDIA, AMD, block-scaled).
#include "cpd/numerics.h"

// Every output of y by the chain of fd_step, one thread per output, grid-stride. a: (B, M, K),
// b: (B, K, N), y: (B, M, N), contiguous float32. sa (B, M, nb), sb (B, nb, N): block scales, one
// per `block` elements along K (null: none), of exponent floor s_emin.
__device__ __forceinline__ void fd_outputs(const float* __restrict__ a, const float* __restrict__ b,
                                           float* __restrict__ y, const float* __restrict__ sa,
                                           const float* __restrict__ sb, long long B, long long M, long long K,
                                           long long N, long long nb, int block, int s_emin,
                                           const cpd::FusedDotSpec& s) {
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
    for (long long k0 = 0; k0 < K; k0 += s.group) {
      const int len = (int)(K - k0 < (long long)s.group ? K - k0 : (long long)s.group);
      c = cpd::fd_step(s, ar + k0, 1, bc + k0 * N, N, len, c, x, k0);
    }
    y[o] = cpd::float_of(c);
  }
}

extern "C" __global__ void cpd_fused_dot_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                                float* __restrict__ y, const float* __restrict__ sa,
                                                const float* __restrict__ sb, long long B, long long M, long long K,
                                                long long N, long long nb, int block, int s_emin, int group,
                                                int frac, int out, int a_emin, int b_emin, int zero_exp, int algo,
                                                int ftz) {
  const cpd::FusedDotSpec s = cpd::make_fused_dot_spec(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz);
  fd_outputs(a, b, y, sa, sb, B, M, K, N, nb, block, s_emin, s);
}

// ------------------------------------------------------------------------------------------
// The tiled kernel (cpd/fused_dot_tiled.h: which specs, and the integer form of the step).
// A block of 256 threads (16 x 16) owns a 64 x 64 tile of outputs of one batch element; thread
// (tx, ty) owns rows ty * 4 + i and columns tx * 4 + j, each output's c, group exponent and group
// sum in registers. K is walked one group (L = 16 or 32 elements) at a time: the block copies the
// 64 x L slice of A and the L x 64 slice of B into shared memory (cp.async on sm_80+; zeros
// outside the matrices: a zero product never raises emax nor adds to the sum), decomposes every
// element once (fd_tiled_operand: exponent and integer significand), then each thread takes its
// outputs' group maximum exponent (pass 1) and exact integer sums (pass 2), and one rounding per
// output (fd_tiled_finish). Outputs reached by a flagged operand (NaN/inf, or not a value of the
// format) take fd_step from global memory for that group instead. Every output's groups run in
// k order from c = +0: the bits of cpd_fused_dot_matmul and of the CPU.
#include "cpd/launch.h"
#include "cpd/fused_dot_tiled.h"

#define CPD_FD_THREADS 256
#define CPD_FD_T 64  // tile rows and columns
#define CPD_FD_R 4   // outputs per thread along each

namespace {

template <bool W>
struct FdSum {
  typedef int type;  // a group's sum in 32 bits (fd_tiled_wide false)
};
template <>
struct FdSum<true> {
  typedef long long type;
};

// Four consecutive words of a shared row (16-byte aligned: one 128-bit load on the GPU).
struct alignas(16) Fd4 {
  cpd::u32 v[4];
};

// One staged operand decomposed in place: e (the raw float32 bits in, exponent + FD_TILED_EOFF out)
// and w (fd_tiled_operand's word); an operand the integer step cannot take (NaN/inf, or not a value
// of its format) is zero here and flags its row or column (bad) and the slice (any_bad).
__device__ __forceinline__ void fd_decompose(cpd::u32& e, cpd::u32& w, cpd::u32& bad, int& any_bad, int man,
                                             int emin, int zero_exp, int pre) {
  cpd::u32 ee, ww;
  if (cpd::fd_tiled_operand(e, man, emin, zero_exp, pre, &ee, &ww)) {
    e = ee;
    w = ww;
  } else {
    e = (cpd::u32)(zero_exp + cpd::FD_TILED_EOFF);
    w = 0u;
    bad = 1u;
    any_bad = 1;
  }
}

template <int L, bool WIDE>
__device__ __forceinline__ void fd_tiled(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                                         long long B, long long M, long long K, long long N, const cpd::FusedDotSpec& s,
                                         int a_man, int b_man) {
  constexpr int T = CPD_FD_T, R = CPD_FD_R;
  alignas(16) __shared__ cpd::u32 Ae[L][T];
  alignas(16) __shared__ cpd::u32 Aw[L][T];
  alignas(16) __shared__ cpd::u32 Be[L][T];
  alignas(16) __shared__ cpd::u32 Bw[L][T];
  __shared__ cpd::u32 badA[T], badB[T], sgnA[T], sgnB[T];
  __shared__ int any_bad;
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int pre = s.frac - a_man - b_man;
  const long long tiles_m = (M + T - 1) / T, tiles_n = (N + T - 1) / T, tiles = B * tiles_m * tiles_n;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const long long bi = t / (tiles_m * tiles_n), rest = t - bi * tiles_m * tiles_n;
    const long long m0 = (rest / tiles_n) * T, n0 = (rest % tiles_n) * T;
    const float* ab = a + bi * M * K;
    const float* bb = b + bi * K * N;
    cpd::u32 c[R][R];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) c[i][j] = 0u;
    for (long long k0 = 0; k0 < K; k0 += L) {
      // 1. stage the raw slices (A transposed: Ae[kk][m]); reset the flags
      {  // element tid + 256 r: A's (row tid / L + (256 / L) r, k tid % L), B's (k tid / T + 4 r, column tid % T)
        const int kk = tid % L, n = tid % T;
        const long long gk = k0 + kk, gn = n0 + n;
#pragma unroll
        for (int r = 0; r < T * L / CPD_FD_THREADS; ++r) {
          const int m = tid / L + (CPD_FD_THREADS / L) * r, kb = tid / T + (CPD_FD_THREADS / T) * r;
          const long long gm = m0 + m, gkb = k0 + kb;
          if (gm < M && gk < K) cpd::copy_async4((float*)&Ae[kk][m], ab + gm * K + gk);
          else Ae[kk][m] = 0u;
          if (gkb < K && gn < N) cpd::copy_async4((float*)&Be[kb][n], bb + gkb * N + gn);
          else Be[kb][n] = 0u;
        }
      }
      if (tid < T) {
        badA[tid] = badB[tid] = 0u;
        sgnA[tid] = sgnB[tid] = 0u;
      }
      if (tid == 0) any_bad = 0;
      cpd::copy_wait_all();
      __syncthreads();
      // 2. decompose every element in place
#pragma unroll
      for (int r = 0; r < T * L / CPD_FD_THREADS; ++r) {  // element tid + 256 r: k tid / T + 4 r, row/column tid % T
        const int kk = tid / T + (CPD_FD_THREADS / T) * r, m = tid % T;
        fd_decompose(Ae[kk][m], Aw[kk][m], badA[m], any_bad, a_man, s.a_emin, s.zero_exp, pre);
        fd_decompose(Be[kk][m], Bw[kk][m], badB[m], any_bad, b_man, s.b_emin, s.zero_exp, 0);
      }
      __syncthreads();
      // 3. the sign words of each row of A and column of B (bit kk: operand kk is negative)
      if (tid < 2 * T) {
        const int m = tid % T;
        cpd::u32 word = 0u;
#pragma unroll
        for (int kk = 0; kk < L; ++kk) word |= ((tid < T ? Aw[kk][m] : Bw[kk][m]) >> 31) << kk;
        if (tid < T) sgnA[m] = word;
        else sgnB[m] = word;
      }
      __syncthreads();
      const int len = K - k0 < (long long)L ? (int)(K - k0) : L;
      // 4. flagged outputs: fd_step on global memory, one output at a time (one inlined copy)
      cpd::u32 cold[R][R];
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < R; ++j) cold[i][j] = c[i][j];
      if (any_bad) {
#pragma unroll 1
        for (int q = 0; q < R * R; ++q) {
          const int i = q / R, j = q % R;
          const long long gm = m0 + ty * R + i, gn = n0 + tx * R + j;
          if (!(badA[ty * R + i] | badB[tx * R + j]) || gm >= M || gn >= N) continue;
          cpd::u32 cq = 0u;
#pragma unroll
          for (int ii = 0; ii < R; ++ii)
#pragma unroll
            for (int jj = 0; jj < R; ++jj) cq = ii * R + jj == q ? c[ii][jj] : cq;
          cq = cpd::fused_dot_step(s, ab + gm * K + k0, 1, bb + k0 * N + gn, N, len, cq);  // FD_NV, no scales
#pragma unroll
          for (int ii = 0; ii < R; ++ii)
#pragma unroll
            for (int jj = 0; jj < R; ++jj) cold[ii][jj] = ii * R + jj == q ? cq : cold[ii][jj];
        }
      }
      // 5. pass 1: each output's emax over c and its L products
      cpd::u32 emax[R][R];
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < R; ++j) emax[i][j] = cpd::fd_tiled_cexp(s, c[i][j]);
#pragma unroll 8  // (a full unroll of L = 32 runs out of registers)
      for (int kk = 0; kk < L; ++kk) {
        const Fd4 ea = *(const Fd4*)&Ae[kk][ty * R], eb = *(const Fd4*)&Be[kk][tx * R];
        const cpd::u32* av = ea.v;
        const cpd::u32* bv = eb.v;
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) emax[i][j] = emax[i][j] > av[i] + bv[j] ? emax[i][j] : av[i] + bv[j];
      }
      // 6. pass 2: the exact sums (the barrier to the compiler: reload the exponents rather than
      //    keep pass 1's 8 L of them live in registers)
      asm volatile("" ::: "memory");
      typedef typename FdSum<WIDE>::type Sum;
      Sum S[R][R];
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < R; ++j) S[i][j] = 0;
#pragma unroll 8  // (a full unroll of L = 32 runs out of registers)
      for (int kk = 0; kk < L; ++kk) {
        const Fd4 ea = *(const Fd4*)&Ae[kk][ty * R], eb = *(const Fd4*)&Be[kk][tx * R];
        const Fd4 wa = *(const Fd4*)&Aw[kk][ty * R], wb = *(const Fd4*)&Bw[kk][tx * R];
        const cpd::u32 *ae = ea.v, *be = eb.v, *aw = wa.v, *bw = wb.v;
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) S[i][j] += (Sum)(int)cpd::fd_tiled_term(aw[i], bw[j], ae[i], be[j], emax[i][j]);
      }
      // 7. one rounding per output; flagged outputs keep step 4's result
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < R; ++j) {
          const int neg = cpd::fd_popc(sgnA[ty * R + i] ^ sgnB[tx * R + j]);
          const cpd::u32 r = cpd::fd_tiled_finish(s, (long long)S[i][j], neg, emax[i][j], c[i][j]);
          c[i][j] = (badA[ty * R + i] | badB[tx * R + j]) ? cold[i][j] : r;
        }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const long long gm = m0 + ty * R + i, gn = n0 + tx * R + j;
        if (gm < M && gn < N) y[(bi * M + gm) * N + gn] = cpd::float_of(c[i][j]);
      }
  }
}

}  // namespace

// a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous float32; for a spec that satisfies
// cpd::fd_tiled_applies (without block scales) with the kernel's L its group and WIDE fd_tiled_wide;
// any other spec gets every output from fd_outputs (the same bits, without the tiles).
#define CPD_FD_TILED(NAME, L, WIDE)                                                                              \
  extern "C" __global__ void __launch_bounds__(CPD_FD_THREADS, 1)                                                 \
      NAME(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, long long B,          \
           long long M, long long K, long long N, int group, int frac, int out, int a_emin, int b_emin,           \
           int zero_exp, int algo, int ftz, int a_man, int b_man) {                                               \
    const cpd::FusedDotSpec s = cpd::make_fused_dot_spec(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz); \
    if (cpd::fd_tiled_applies(s, a_man, b_man, 0) && group == L && cpd::fd_tiled_wide(s) == WIDE)               \
      fd_tiled<L, WIDE>(a, b, y, B, M, K, N, s, a_man, b_man);                                                    \
    else /* a spec outside the kernel's family (a routing slip): the generic steps' bits, slowly */             \
      fd_outputs(a, b, y, nullptr, nullptr, B, M, K, N, 0, 1, -127, s);                                           \
  }
CPD_FD_TILED(cpd_fused_dot_tiled_l32, 32, false)
CPD_FD_TILED(cpd_fused_dot_tiled_l16, 16, false)
CPD_FD_TILED(cpd_fused_dot_tiled_l32w, 32, true)
CPD_FD_TILED(cpd_fused_dot_tiled_l16w, 16, true)
