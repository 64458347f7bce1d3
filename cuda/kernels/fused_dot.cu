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
// The tiled kernels (cpd/fused_dot_tiled.h: which specs, and the integer form of the step).
// A block of 256 threads (16 x 16) owns a 64 x 64 tile of outputs of one batch element; thread
// (tx, ty) owns rows ty * 4 + i and columns tx * 4 + j, each output's c, group exponent and group
// sum in registers. K is walked one slice of D = G L elements at a time (G groups of L = 4, 8, 16
// or 32; D = 16 or 32, so that a group of 4 or 8 shares its slice with others): the block copies
// the 64 x D slice of A and the D x 64 slice of B into shared memory (cp.async on sm_80+; zeros
// outside the matrices: a zero product never raises emax nor adds to the sum), decomposes every
// element once (fd_tiled_operand: exponent and signed word; each thread also packs the sign bits
// and the flags of its L / 4 elements of a group of a row of A and a column of B into one byte of
// that row's / column's sign and flag words), then, group by group, each thread takes its
// outputs' group maximum exponent (pass 1) and exact integer sums (pass 2: a multiply-high and a
// shift per product), and one rounding per output (fd_tiled_finish32 / fd_tiled_finish). Outputs
// reached by a flagged operand (NaN/inf, or not a value of the format), and those whose rounding
// the 32-bit form leaves (a float32-subnormal result, a non-finite c), take fd_step from global
// memory for that group instead. Every output's groups run in k order from c = +0: the bits of
// cpd_fused_dot_matmul and of the CPU, whatever the tile shape.
//
// Tile shapes (the kernel name's suffix; cpd/_tensor_core_op.py TILE_SHAPES mirrors them and picks
// one per device at launch). A slice is D = max(L, 16) elements, 2 max(L, 16) for s2g2; its G =
// D / L groups take D + G KiB of shared memory for their words and flags, and each raw stage D:
//   s1    one stage (stage, decompose in place, compute): D + G KiB (17 / 33 KiB at L 16 / 32,
//         20 / 18 at L 4 / 8). For GPUs without cp.async (sm_70, sm_75: there copy_async4 is a
//         plain load and store, so a second buffer would hide nothing) and as the fallback.
//   s2    two stages, cp.async double buffering: the copy of slice s + 1 is issued once slice s
//         is decomposed, and lands while the block runs slice s's passes (about 85% of a slice's
//         instructions, docs/gpu.md); decomposition reads the raw stage into separate word arrays,
//         so no barrier is needed at the end of a slice (two per slice instead of three).
//         3 D + G KiB (33 / 65 KiB at L 16 / 32): L 32 on sm_86, sm_89, sm_120 (99 KiB per block).
//         Built for the L 32 families without scales only: for the others s2g2 fits (66-72 KiB)
//         wherever cp.async is, so s2 would never run (each kernel is NVRTC time the suite pays
//         at two architectures); the scaled L 32 kernel takes s1 on the 99 KiB GPUs.
//   s2g2  two stages of twice the depth (a K slice of 2 max(L, 16)): half the barriers and slice
//         overheads per group. 3 D + G KiB (66 / 130 KiB at L 16 / 32, 72 / 68 at L 4 / 8): sm_80,
//         sm_87, sm_90, sm_100 (163-227 KiB), and L <= 16 on the 99 KiB GPUs.
// Why the register tile stays 4 x 4 of 256 threads on every architecture: the register file is
// 64 K words per SM from sm_70 to sm_100, and the 4 x 4 tile already takes 177-200 registers
// (c, emax, the sums, the operands of a pass: ptxas, tests/test_cuda.py), so one block of 256 per
// SM (__launch_bounds__(256, 1)); a larger register tile would spill, a smaller block tile would
// decompose more elements per output. Shared memory is then the block's to use, and the
// architectures differ in it (and in cp.async): hence stages and slice depth per architecture.
// The choice is by capacity and instruction counts (benchmarks/sass_counts.py per arch), not yet
// timed on a GPU.
#include "cpd/launch.h"
#include "cpd/fused_dot_tiled.h"

#define CPD_FD_THREADS 256
#define CPD_FD_T 64  // tile rows and columns
#define CPD_FD_R 4   // outputs per thread along each

namespace {

// Four consecutive words of a shared row (16-byte aligned: one 128-bit load on the GPU).
struct alignas(16) Fd4 {
  cpd::u32 v[4];
};

// The dynamic shared memory of a shape (S stages, G groups of L per K slice), in rows of T words:
// Ae, Aw, Be, Bw (KS rows each: exponents and words, A transposed), the sign and flag words
// sgnA, sgnB, badA, badB (G rows each), then S > 1 raw stages of KS rows of A and KS of B (S = 1:
// the raw slice is staged into Ae and Be and decomposed in place).
template <int L, int S, int G>
struct FdShape {
  static constexpr int KS = L * G;
  static constexpr int ROWS = 4 * KS + 4 * G + (S > 1 ? 2 * S * KS : 0);
  static constexpr cpd::u32 BYTES = (cpd::u32)ROWS * CPD_FD_T * 4u;
};

typedef cpd::u32 FdRow[CPD_FD_T];

// x, opaque to the compiler: the staging takes its addresses and bounds afresh from M, K and N per
// slice, where the compiler would otherwise hoist them out of the slice loop and keep one address
// and one bound per staged element alive across the passes: as many registers as the
// double-buffered 64-bit-sum kernels and the scaled ones have left (they took 255 and spilled; now
// 193-211 at sm_90). The others keep the hoisted form (recomputing costs 0.1-0.2 SASS per MAC).
__device__ __forceinline__ long long fd_opaque(long long x) {
#if defined(__CUDA_ARCH__)
  asm volatile("" : "+l"(x));
#endif
  return x;
}

// The scale exponents of a group at kg (fused_dot.h fd_scale_exp) of rows r0 + i of A and columns
// n0 + j of B (R of each; 0 outside the matrices), and in *bad bit i R + j the outputs one of whose
// two scales is not finite (fd_step gives them NaN or inf). 2 R loads from global memory per
// thread and group (the scales are L G times fewer than the elements: cache-resident).
__device__ __forceinline__ void fd_tiled_scales(const float* __restrict__ sa, const float* __restrict__ sb,
                                                long long bi, long long M, long long N, long long nb, int block,
                                                int s_emin, long long r0, long long n0, long long kg, int* ea, int* eb,
                                                cpd::u32* bad) {
  const long long q = kg / block;
  cpd::u32 ba = 0u, bb = 0u;
#pragma unroll
  for (int i = 0; i < CPD_FD_R; ++i) {
    const cpd::u32 ua = r0 + i < M ? cpd::bits_of(sa[(bi * M + r0 + i) * nb + q]) : 0x3f800000u;
    const cpd::u32 ub = n0 + i < N ? cpd::bits_of(sb[(bi * nb + q) * N + n0 + i]) : 0x3f800000u;
    ea[i] = cpd::fd_exp(ua, s_emin, s_emin);
    eb[i] = cpd::fd_exp(ub, s_emin, s_emin);
    ba |= (cpd::u32)!cpd::is_finite_bits(ua) << i;
    bb |= (cpd::u32)!cpd::is_finite_bits(ub) << i;
  }
#pragma unroll
  for (int i = 0; i < CPD_FD_R; ++i)
#pragma unroll
    for (int j = 0; j < CPD_FD_R; ++j) *bad |= (((ba >> i) | (bb >> j)) & 1u) << (i * CPD_FD_R + j);
}

// SC: block scales (sa (B, M, nb), sb (B, nb, N), one per `block` elements along K, block a
// multiple of L: one scale of a's row and one of b's column per group; see step 3 below).
template <int L, bool WIDE, int S, int G, bool SC>
__device__ __forceinline__ void fd_tiled(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                                         const float* __restrict__ sa, const float* __restrict__ sb, long long B,
                                         long long M, long long K, long long N, long long nb, int block, int s_emin,
                                         const cpd::FusedDotSpec& s, int a_man, int b_man) {
  constexpr int T = CPD_FD_T, R = CPD_FD_R, KS = L * G;
  constexpr int P = T * L / CPD_FD_THREADS;    // elements of A (and of B) per thread and group: decomposing
  constexpr int PS = T * KS / CPD_FD_THREADS;  // ... and per slice: staging
  // the passes' unrolled chunk of k: eight, or two trips at L 4 / 8 (with one trip ptxas schedules
  // both passes and the roundings as one block: the 32-bit L 8 kernels took 255 registers and
  // spilled at sm_90; 179-185 with two trips, and 168 instead of 220 at L 4)
  constexpr int C = L <= 8 ? L / 2 : 8;
  FdRow* const Ae = (FdRow*)cpd::dynamic_smem();
  FdRow* const Aw = Ae + KS;
  FdRow* const Be = Aw + KS;
  FdRow* const Bw = Be + KS;
  // per group g, row of A / column of B: bit 8 q + r of the sign word is operand k = q P + r's
  // sign; byte q of the flag word is nonzero when one of those operands is flagged
  FdRow* const sgnA = Bw + KS;
  FdRow* const sgnB = sgnA + G;
  FdRow* const badA = sgnB + G;
  FdRow* const badB = badA + G;
  FdRow* const raw = badB + G;  // S > 1: stage t's A at raw + 2 t KS, its B at raw + (2 t + 1) KS
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int zb = 28 - s.frac;  // b's words: Mb 2^(F + 2 - mb) = (sig << 7) >> (r + 28 - F)
  // staging: A's element r is (row sa_m + (256 / KS) r, k sa_k), B's (k sb_k + 4 r, column sb_n);
  // decomposing: row / column dm, k g L + dq P + r
  const int sa_k = tid % KS, sa_m = tid / KS, sb_n = tid % T, sb_k = tid / T, dm = tid % T, dq = tid / T;
  const long long tiles_m = (M + T - 1) / T, tiles_n = (N + T - 1) / T, tiles = B * tiles_m * tiles_n;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const long long bi = t / (tiles_m * tiles_n), rest = t - bi * tiles_m * tiles_n;
    const long long m0 = (rest / tiles_n) * T, n0 = (rest % tiles_n) * T;
    const float* ab = a + bi * M * K;
    const float* bb = b + bi * K * N;
    // 1. stage the raw slice at kst into rows dA (A transposed: dA[kk][m]) and dB (where the
    //    registers are short, with bounds and addresses taken afresh per slice: fd_opaque)
    auto stage = [&](long long kst, FdRow* dA, FdRow* dB) {
      constexpr bool O = WIDE && (S > 1 || SC);  // where the registers are short (fd_opaque)
      const long long Ko = O ? fd_opaque(K) : K, No = O ? fd_opaque(N) : N, Mo = O ? fd_opaque(M) : M;
      const int rows_a = (int)(Mo - m0 - sa_m < (long long)T ? Mo - m0 - sa_m : (long long)T);  // <= 0: none
      const bool col_b = n0 + sb_n < N;
      const long long stride_a = (long long)(CPD_FD_THREADS / KS) * Ko, stride_b = (long long)(CPD_FD_THREADS / T) * No;
      const float* pa = ab + (m0 + sa_m) * Ko + kst + sa_k;
      const float* pb = bb + (kst + sb_k) * No + n0 + sb_n;
      const int k_left = (int)(K - kst < (long long)KS ? K - kst : (long long)KS);
      const bool k_a = sa_k < k_left;
#pragma unroll
      for (int r = 0; r < PS; ++r) {
        const int m = sa_m + (CPD_FD_THREADS / KS) * r, kb = sb_k + (CPD_FD_THREADS / T) * r;
        if (k_a && (CPD_FD_THREADS / KS) * r < rows_a) cpd::copy_async4((float*)&dA[sa_k][m], pa + r * stride_a);
        else dA[sa_k][m] = 0u;
        if (col_b && kb < k_left) cpd::copy_async4((float*)&dB[kb][sb_n], pb + r * stride_b);
        else dB[kb][sb_n] = 0u;
      }
    };
    cpd::u32 c[R][R];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) c[i][j] = 0u;
    if (S > 1) {
      stage(0, raw, raw + KS);
      cpd::copy_commit();
    }
    for (long long k0 = 0, sl = 0; k0 < K; k0 += KS, ++sl) {
      FdRow* rA = Ae;
      FdRow* rB = Be;
      if (S == 1) {
        stage(k0, Ae, Be);
        cpd::copy_wait_all();
      } else {
        rA = raw + 2 * (int)(sl & 1) * KS;
        rB = rA + KS;
        cpd::copy_wait_all();  // slice sl, the one stage in flight
      }
      __syncthreads();
      // 2. decompose every element (S = 1: in place); this thread's sign bits and flags, one byte each
#pragma unroll
      for (int g = 0; g < G; ++g) {
        cpd::u32 sg_a = 0u, sg_b = 0u, bad_a = 0u, bad_b = 0u;
#pragma unroll
        for (int r = 0; r < P; ++r) {
          const int kk = g * L + dq * P + r;
          const cpd::u32 xa = rA[kk][dm], xb = rB[kk][dm];
          const cpd::FdTiledOperand oa = cpd::fd_tiled_operand(xa, a_man, s.a_emin, s.zero_exp, 0);
          const cpd::FdTiledOperand ob = cpd::fd_tiled_operand(xb, b_man, s.b_emin, s.zero_exp, zb);
          Ae[kk][dm] = oa.e;
          Aw[kk][dm] = oa.w;
          Be[kk][dm] = ob.e;
          Bw[kk][dm] = ob.w;
          sg_a |= (cpd::u32)((int)xa >> 31) & (1u << r);
          sg_b |= (cpd::u32)((int)xb >> 31) & (1u << r);
          bad_a |= oa.bad;
          bad_b |= ob.bad;
        }
        ((unsigned char*)sgnA[g])[dm * 4 + dq] = (unsigned char)sg_a;
        ((unsigned char*)sgnB[g])[dm * 4 + dq] = (unsigned char)sg_b;
        ((unsigned char*)badA[g])[dm * 4 + dq] = (unsigned char)bad_a;
        ((unsigned char*)badB[g])[dm * 4 + dq] = (unsigned char)bad_b;
      }
      __syncthreads();
      // S > 1: the next slice's stage, copied while the block runs this slice's passes (its
      // buffer was last read by the decomposition of slice sl - 1, before the barrier above)
      if (S > 1 && k0 + KS < K) {
        stage(k0 + KS, rA + (sl & 1 ? -2 * KS : 2 * KS), rB + (sl & 1 ? -2 * KS : 2 * KS));
        cpd::copy_commit();
      }
#pragma unroll 1
      for (int g = 0; g < G; ++g) {
        const long long kg = k0 + g * L;
        if (kg >= K) break;  // past the end of K: no group (the block agrees: K and k0 are uniform)
        const FdRow* const Aeg = Ae + g * L;
        const FdRow* const Awg = Aw + g * L;
        const FdRow* const Beg = Be + g * L;
        const FdRow* const Bwg = Bw + g * L;
        // 3. pass 1: each output's emax over c and its L products. With block scales, a product's
        //    exponent gains o = e(S_a) + e(S_b), the same for the group's L products of an output:
        //    the passes run on emax - o (c's exponent less o, then the unscaled products), and the
        //    rounding takes emax (scale exponents in the same offset-free units as products')
        //    (the scales are read here and again for the rounding, after pass 2's barrier to the
        //    compiler: kept across the passes, their exponents took the registers the sums need)
        cpd::u32 emax[R][R];
        {
          int so_a[R] = {}, so_b[R] = {};
          cpd::u32 sbad = 0u;
          if (SC) fd_tiled_scales(sa, sb, bi, M, N, nb, block, s_emin, m0 + ty * R, n0 + tx * R, kg, so_a, so_b, &sbad);
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < R; ++j)
              emax[i][j] = cpd::fd_tiled_cexp(s, c[i][j]) - (SC ? (cpd::u32)(so_a[i] + so_b[j]) : 0u);
        }
#pragma unroll 1
        for (int k8 = 0; k8 < L; k8 += C) {
#pragma unroll
          for (int kk = k8; kk < k8 + C; ++kk) {
            const Fd4 ea = *(const Fd4*)&Aeg[kk][ty * R], eb = *(const Fd4*)&Beg[kk][tx * R];
            const cpd::u32* av = ea.v;
            const cpd::u32* bv = eb.v;
#pragma unroll
            for (int i = 0; i < R; ++i)
#pragma unroll
              for (int j = 0; j < R; ++j) emax[i][j] = emax[i][j] > av[i] + bv[j] ? emax[i][j] : av[i] + bv[j];
          }
        }
        // 4. pass 2: the exact sums, eight terms at a time in 32 bits (the barrier to the compiler:
        //    reload the exponents rather than keep pass 1's 8 L of them live in registers)
        asm volatile("" ::: "memory");
        typedef typename cpd::FdTiledSum<WIDE>::type Sum;
        Sum Sg[R][R];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) Sg[i][j] = 0;
#pragma unroll 1
        for (int k8 = 0; k8 < L; k8 += C) {
          int S8[R][R];
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < R; ++j) S8[i][j] = 0;
#pragma unroll
          for (int kk = k8; kk < k8 + C; ++kk) {
            const Fd4 ea = *(const Fd4*)&Aeg[kk][ty * R], eb = *(const Fd4*)&Beg[kk][tx * R];
            const Fd4 wa = *(const Fd4*)&Awg[kk][ty * R], wb = *(const Fd4*)&Bwg[kk][tx * R];
            const cpd::u32 *ae = ea.v, *be = eb.v, *aw = wa.v, *bw = wb.v;
#pragma unroll
            for (int i = 0; i < R; ++i)
#pragma unroll
              for (int j = 0; j < R; ++j) S8[i][j] += cpd::fd_tiled_term(aw[i], bw[j], emax[i][j] - ae[i] - be[j]);
          }
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < R; ++j) Sg[i][j] += (Sum)S8[i][j];
        }
        // 5. one rounding per output; flagged outputs and those the 32-bit rounding leaves are marked
        const Fd4 sga = *(const Fd4*)&sgnA[g][ty * R], sgb = *(const Fd4*)&sgnB[g][tx * R];
        const Fd4 bda = *(const Fd4*)&badA[g][ty * R], bdb = *(const Fd4*)&badB[g][tx * R];
        cpd::u32 cn[R][R], slow = 0u;
        int so_a[R] = {}, so_b[R] = {};
        cpd::u32 sbad = 0u;  // SC: outputs one of whose scales is not finite (fd_step takes them)
        if (SC) fd_tiled_scales(sa, sb, bi, M, N, nb, block, s_emin, m0 + ty * R, n0 + tx * R, kg, so_a, so_b, &sbad);
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) {
            const int neg = cpd::fd_popc(sga.v[i] ^ sgb.v[j]);
            cpd::u32 sl1 = (cpd::u32)((bda.v[i] | bdb.v[j]) != 0u) | (SC ? (sbad >> (i * R + j)) & 1u : 0u);
            const cpd::u32 em = emax[i][j] + (SC ? (cpd::u32)(so_a[i] + so_b[j]) : 0u);
            if (WIDE) cn[i][j] = cpd::fd_tiled_finish(s, (long long)Sg[i][j], neg, em, c[i][j]);
            else cn[i][j] = cpd::fd_tiled_finish32(s, (int)Sg[i][j], neg, em, c[i][j], &sl1);
            slow |= sl1 << (i * R + j);
          }
        // 6. the marked outputs: fd_step on global memory, one output at a time (one inlined copy)
        if (slow) {
          const int len = K - kg < (long long)L ? (int)(K - kg) : L;
#pragma unroll 1
          for (int q = 0; q < R * R; ++q) {
            const int i = q / R, j = q % R;
            const long long gm = m0 + ty * R + i, gn = n0 + tx * R + j;
            if (!((slow >> q) & 1u) || gm >= M || gn >= N) continue;
            cpd::u32 cq = 0u;
#pragma unroll
            for (int ii = 0; ii < R; ++ii)
#pragma unroll
              for (int jj = 0; jj < R; ++jj) cq = ii * R + jj == q ? c[ii][jj] : cq;
            cpd::FdScales x = cpd::fd_no_scales();
            if (SC) {
              x.a = sa + (bi * M + gm) * nb;
              x.as = 1;
              x.b = sb + bi * nb * N + gn;
              x.bs = N;
              x.block = block;
              x.emin = s_emin;
            }
            cq = cpd::fused_dot_step_scaled(s, ab + gm * K + kg, 1, bb + kg * N + gn, N, len, cq, x, kg);  // FD_NV
#pragma unroll
            for (int ii = 0; ii < R; ++ii)
#pragma unroll
              for (int jj = 0; jj < R; ++jj) cn[ii][jj] = ii * R + jj == q ? cq : cn[ii][jj];
          }
        }
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) c[i][j] = cn[i][j];
      }
      // S = 1: the next slice is staged over this one's words. S > 1: the next slice's words are
      // written after the first barrier above (every thread is past these passes by then)
      if (S == 1) __syncthreads();
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

// a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous float32; sa (B, M, nb) and sb (B, nb, N)
// the block scales (one per `block` elements along K, exponent floor s_emin) or null (nb 0, block
// 1, s_emin -127). For a spec that satisfies cpd::fd_tiled_applies with the kernel's L its group,
// WIDE fd_tiled_wide and scales where SC (the kernel's `s` suffix), launched with at least
// FdShape<L, S, G>::BYTES of dynamic shared memory; any other spec, or a launch with less shared
// memory, gets every output from fd_outputs (the same bits, without the tiles).
#define CPD_FD_TILED(NAME, L, WIDE, S, G, SC)                                                                    \
  extern "C" __global__ void __launch_bounds__(CPD_FD_THREADS, 1)                                                 \
      NAME(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,                       \
           const float* __restrict__ sa, const float* __restrict__ sb, long long B, long long M, long long K,      \
           long long N, long long nb, int block, int s_emin, int group, int frac, int out, int a_emin, int b_emin, \
           int zero_exp, int algo, int ftz, int a_man, int b_man) {                                               \
    const cpd::FusedDotSpec s = cpd::make_fused_dot_spec(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz); \
    if ((sa != nullptr) == SC && cpd::fd_tiled_applies(s, a_man, b_man, SC ? block : 0) && group == L &&         \
        cpd::fd_tiled_wide(s) == WIDE && cpd::dynamic_smem_size() >= FdShape<L, S, G>::BYTES)                    \
      fd_tiled<L, WIDE, S, G, SC>(a, b, y, sa, sb, B, M, K, N, nb, block, s_emin, s, a_man, b_man);              \
    else /* a spec outside the kernel's family (a routing slip): the generic steps' bits, slowly */             \
      fd_outputs(a, b, y, sa, sb, B, M, K, N, nb, block, s_emin, s);                                              \
  }
// G groups of L per K slice: d slices of 16 (at least one group)
#define CPD_FD_GROUPS(L, d) ((L) >= 16 ? (d) : (d) * (16 / (L)))
// s1 and s2g2 for every family; s2 for the L 32 families without scales only (see the shapes above)
#define CPD_FD_TILED_SHAPES(NAME, L, WIDE, SC)                 \
  CPD_FD_TILED(NAME##_s1, L, WIDE, 1, CPD_FD_GROUPS(L, 1), SC) \
  CPD_FD_TILED(NAME##_s2g2, L, WIDE, 2, CPD_FD_GROUPS(L, 2), SC)
#define CPD_FD_TILED_SHAPES3(NAME, L, WIDE, SC) \
  CPD_FD_TILED_SHAPES(NAME, L, WIDE, SC)        \
  CPD_FD_TILED(NAME##_s2, L, WIDE, 2, CPD_FD_GROUPS(L, 1), SC)
CPD_FD_TILED_SHAPES3(cpd_fused_dot_tiled_l32, 32, false, false)  // Hopper FP8 (F 13)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l16, 16, false, false)   // Ada FP8 (F 13)
CPD_FD_TILED_SHAPES3(cpd_fused_dot_tiled_l32w, 32, true, false)  // Blackwell FP8 / FP6 / FP4 (F 25)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l16w, 16, true, false)   // Hopper, Blackwell FP16 / BF16 (F 25)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l8, 8, false, false)     // Turing, Ampere, Ada FP16 / BF16 (F 24)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l8w, 8, true, false)     // Hopper, Blackwell TF32 (F 25)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l4, 4, false, false)     // Volta FP16 (F 23), Ampere, Ada TF32 (F 24)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l32ws, 32, true, true)   // Blackwell MXFP8 / MXFP6 / MXFP4 (F 25)
