// CUDA GEMM of the fused-dot-product model (cpd/fused_dot.h). Compiled at run time by NVRTC
// (cpd/_cuda.py compile_source). cpd_fused_dot_matmul: one thread per output element (grid-stride
// loop), the chain of fd_step over the k-groups in k order from c = +0, on float32 bits: the CPU's
// generic loop, hence the same bits as every CPU path, for every algorithm (NVIDIA, AMD,
// block-scaled). The tiled kernels below give those bits faster for the specs they take
// (cpd/fused_dot_tiled.h): NVIDIA's step (cpd_fused_dot_tiled_l*), Blackwell's 16-product chunks
// (_c16), AMD's pairwise float32 sums (_amdp, _amdpz) and AMD CDNA3's fp16 / bf16 / xf32 step
// (_l8a, _l4a) and fp8 / bf8 step (_l16a: even and odd halves). Every tensor-core model has one.
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
//         plain load and store, so a second buffer would hide nothing), and for the scaled L 32
//         family on the 99 KiB GPUs. A GPU compile builds only the shapes its GPU can take
//         (CPD_FD_ONE_STAGE / CPD_FD_TWO_STAGES below): s1 before sm_80, s2 / s2g2 from sm_80.
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

// The block scales of output (gm, gn) of batch element bi (cpd::FdScales: a's row, b's column).
__device__ __forceinline__ cpd::FdScales fd_output_scales(const float* __restrict__ sa, const float* __restrict__ sb,
                                                          long long bi, long long M, long long N, long long nb,
                                                          long long gm, long long gn, int block, int s_emin) {
  cpd::FdScales x = cpd::fd_no_scales();
  x.a = sa + (bi * M + gm) * nb;
  x.as = 1;
  x.b = sb + bi * nb * N + gn;
  x.bs = N;
  x.block = block;
  x.emin = s_emin;
  return x;
}

// The outputs of a thread's R x R marked in `slow` (bit i R + j): cn[i][j] = step(gm, gn, c[i][j])
// (a generic step from global memory), one output at a time in a loop not unrolled (one inlined
// copy of the step); outputs outside the matrix (gm >= M or gn >= N) are skipped.
template <class Step>
__device__ __forceinline__ void fd_redo(cpd::u32 slow, const cpd::u32 (&c)[CPD_FD_R][CPD_FD_R],
                                        cpd::u32 (&cn)[CPD_FD_R][CPD_FD_R], long long gm0, long long gn0, long long M,
                                        long long N, const Step& step) {
  constexpr int R = CPD_FD_R;
#pragma unroll 1
  for (int q = 0; q < R * R; ++q) {
    const long long gm = gm0 + q / R, gn = gn0 + q % R;
    if (!((slow >> q) & 1u) || gm >= M || gn >= N) continue;
    cpd::u32 cq = 0u;
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) cq = i * R + j == q ? c[i][j] : cq;
    cq = step(gm, gn, cq);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) cn[i][j] = i * R + j == q ? cq : cn[i][j];
  }
}

// A thread's R x R outputs (float32 bits c) into y (B, M, N), rows gm0 + i, columns gn0 + j.
__device__ __forceinline__ void fd_store(float* __restrict__ y, const cpd::u32 (&c)[CPD_FD_R][CPD_FD_R], long long bi,
                                         long long M, long long N, long long gm0, long long gn0) {
#pragma unroll
  for (int i = 0; i < CPD_FD_R; ++i)
#pragma unroll
    for (int j = 0; j < CPD_FD_R; ++j)
      if (gm0 + i < M && gn0 + j < N) y[(bi * M + gm0 + i) * N + gn0 + j] = cpd::float_of(c[i][j]);
}

// SC: block scales (sa (B, M, nb), sb (B, nb, N), one per `block` elements along K, block a
// multiple of L: one scale of a's row and one of b's column per group; see step 3 below).
// AMD 1: fused_dot.h's FD_AMD_RD (CDNA3 fp16 / bf16 / xf32: cpd/fused_dot_tiled.h fd_amdrd_applies):
// F = 24, emax over the products alone, fd_amd_rd_align and fd_amdrd_round; 32-bit sums, no scales.
// AMD 2: FD_AMD_RD_FP8 (CDNA3 fp8 / bf8, L 16: fd_amdrd8_applies): the same with the even- and
// odd-indexed products apart (an emax and a sum each: fd_amdrd8_halves joins them), c cut off.
template <int L, bool WIDE, int S, int G, bool SC, int AMD = 0>
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
  static_assert(!AMD || (!WIDE && !SC), "the CDNA3 kernels: 32-bit sums, no scales");
  static_assert(AMD != 2 || (L == 16 && T * L / CPD_FD_THREADS % 2 == 0),
                "CDNA3 fp8: L 16, and a sign byte's bit r is an operand of r's parity");
  const int zb = 28 - (AMD ? 24 : s.frac);  // b's words: Mb 2^(F + 2 - mb) = (sig << 7) >> (r + 28 - F)
  // staging: A's element r is (row sa_m + (256 / KS) r, k sa_k), B's (k sb_k + 4 r, column sb_n);
  // decomposing: row / column dm, k g L + dq P + r
  const int sa_k = tid % KS, sa_m = tid / KS, sb_n = tid % T, sb_k = tid / T, dm = tid % T, dq = tid / T;
  const long long tiles_m = (M + T - 1) / T, tiles_n = (N + T - 1) / T, tiles = B * tiles_m * tiles_n;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const cpd::TileOrigin o = cpd::tile_origin(t, tiles_m, tiles_n, T, T);
    const long long bi = o.bi, m0 = o.m0, n0 = o.n0;
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
        cpd::u32 emax[R][R], emax1[R][R];  // AMD 2: emax the even products', emax1 the odd ones'
        {
          int so_a[R] = {}, so_b[R] = {};
          cpd::u32 sbad = 0u;
          if (SC) fd_tiled_scales(sa, sb, bi, M, N, nb, block, s_emin, m0 + ty * R, n0 + tx * R, kg, so_a, so_b, &sbad);
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < R; ++j) {
              emax[i][j] = AMD ? (cpd::u32)(2 * s.zero_exp + 2 * cpd::FD_TILED_EOFF)  // products only
                               : cpd::fd_tiled_cexp(s, c[i][j]) - (SC ? (cpd::u32)(so_a[i] + so_b[j]) : 0u);
              emax1[i][j] = emax[i][j];
            }
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
              for (int j = 0; j < R; ++j) {
                cpd::u32& em = AMD == 2 && (kk & 1) ? emax1[i][j] : emax[i][j];
                em = em > av[i] + bv[j] ? em : av[i] + bv[j];
              }
          }
        }
        // 4. pass 2: the exact sums, eight terms at a time in 32 bits (the barrier to the compiler:
        //    reload the exponents rather than keep pass 1's 8 L of them live in registers)
        asm volatile("" ::: "memory");
        typedef typename cpd::FdTiledSum<WIDE>::type Sum;
        Sum Sg[R][R], Sg1[R][R];  // AMD 2: Sg the even products' sum, Sg1 the odd ones'
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) Sg[i][j] = Sg1[i][j] = 0;
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
              for (int j = 0; j < R; ++j) {
                if (AMD == 2 && (kk & 1)) Sg1[i][j] += cpd::fd_tiled_term(aw[i], bw[j], emax1[i][j] - ae[i] - be[j]);
                else S8[i][j] += cpd::fd_tiled_term(aw[i], bw[j], emax[i][j] - ae[i] - be[j]);
              }
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
            if (AMD) {  // c non-finite, or a product that may reach 2^128: fd_step (fd_amdrd_applies)
              int e = (int)em - 2 * cpd::FD_TILED_EOFF;
              long long Sv = (long long)Sg[i][j] + neg;
              if (AMD == 2) {  // the halves: the signs of the even and the odd operands apart
                const cpd::u32 ng = sga.v[i] ^ sgb.v[j];
                Sv = cpd::fd_amdrd8_halves(Sg[i][j] + cpd::fd_popc(ng & 0x05050505u), e,
                                          Sg1[i][j] + cpd::fd_popc(ng & 0x0a0a0a0au),
                                          (int)emax1[i][j] - 2 * cpd::FD_TILED_EOFF, &e);
              }
              sl1 |= (cpd::u32)((c[i][j] & ~cpd::SIGN) >= cpd::INF_BITS) | (cpd::u32)(e >= 126);
              int k;
              const long long v = cpd::fd_amd_rd_align(s, Sv, e, c[i][j], AMD == 2, &k);
              cn[i][j] = cpd::fd_amdrd_round(v, k, &sl1);  // a float32-subnormal result: fd_step
            } else if (WIDE) {
              cn[i][j] = cpd::fd_tiled_finish(s, (long long)Sg[i][j], neg, em, c[i][j]);
            } else {
              cn[i][j] = cpd::fd_tiled_finish32(s, (int)Sg[i][j], neg, em, c[i][j], &sl1);
            }
            slow |= sl1 << (i * R + j);
          }
        // 6. the marked outputs: fd_step on global memory, one output at a time (one inlined copy)
        if (slow) {
          const int len = K - kg < (long long)L ? (int)(K - kg) : L;
          fd_redo(slow, c, cn, m0 + ty * R, n0 + tx * R, M, N, [&](long long gm, long long gn, cpd::u32 cq) {
            const cpd::FdScales x = SC ? fd_output_scales(sa, sb, bi, M, N, nb, gm, gn, block, s_emin) : cpd::fd_no_scales();
            if (AMD) return cpd::fd_amd_rd_step(s, ab + gm * K + kg, 1, bb + kg * N + gn, N, len, cq);
            return cpd::fused_dot_step_scaled(s, ab + gm * K + kg, 1, bb + kg * N + gn, N, len, cq, x, kg);  // FD_NV
          });
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
    fd_store(y, c, bi, M, N, m0 + ty * R, n0 + tx * R);
  }
}

// ------------------------------------------------------------------------------------------
// The chunk16 kernels (cpd/fused_dot_tiled.h fd_c16_applies: Blackwell's kind::mxf4 / mxf4nvf4,
// NVFP4 and MXFP4 x MXFP4: e2m1 elements, a scale per block of K). fd_tiled's tiles, threads and
// outputs (a 64 x 64 tile per block of 256, 4 x 4 outputs per thread, grid-stride over tiles);
// a K slice of KS = 32 (s1: one stage) or 64 raw elements (s2g2: two stages, cp.async double
// buffering), held as they are: no decomposition, the elements enter float32 FMAs.
//   * Per chunk of 16, each thread runs its 16 outputs' FMA chains from 0 over the chunk (two
//     128-bit shared loads per 16 FMAs: A is kept transposed, B as it is), then per output the
//     chunk's term (fd_c16_v with 4 ma mb, fd_c16_term) into a 64-bit group sum.
//   * Before a group's first chunk, each output's emax from c and the group's scale exponents;
//     after its last, one rounding (fd_c16_finish).
//   * The scales come from global memory (4 of A's rows and 4 of B's columns per thread and
//     chunk, L1-resident: 16 or 32 times fewer than the elements, through per-row pointers and
//     a chunk counter, no division), decomposed by fd_c16_scale.
//   * Flags: after a slice lands, each thread checks its quarter of a row of A and of a column of
//     B (fd_c16_bad_element) into a byte of that row's (column's) flag word. An output reached by
//     a flagged element or scale, one whose chunk's cut would truncate, and one whose rounding is
//     float32-subnormal take fd_chunk16_step from global memory for that group.
// A's rows are FD_C16_LD = 68 words: a warp stages 4 rows x 8 k (32-byte runs of global memory)
// into 32 distinct banks, and rows stay 16-byte aligned for the float4 reads.
constexpr int FD_C16_LD = 68;

// Dynamic shared memory of a chunk16 shape (cpd/_tensor_core_op.py tile_smem): per stage, A's KS
// rows of FD_C16_LD words, B's KS rows of 64, and a flag word per row of A and column of B.
template <int S, int KS>
struct FdC16Shape {
  static constexpr int STAGE_WORDS = KS * FD_C16_LD + KS * CPD_FD_T + 2 * CPD_FD_T;
  static constexpr cpd::u32 BYTES = (cpd::u32)(S * STAGE_WORDS) * 4u;
};

// The raw K slice at kst of a 64 x 64 output tile into one stage of an FdC16Shape layout (A
// transposed (k, m) in rows of FD_C16_LD, B as it is (k, n)); zeros outside the matrices. Bounds
// and addresses are taken afresh per slice (fd_opaque): hoisted, they held registers across the
// slice's FMAs, and the double-buffered kernels spilled.
template <int KS>
__device__ __forceinline__ void fd_stage_raw(float* __restrict__ dA, const float* __restrict__ ab,
                                             const float* __restrict__ bb, long long M, long long K, long long N,
                                             long long m0, long long n0, long long kst) {
  constexpr int T = CPD_FD_T, LD = FD_C16_LD, PS = T * KS / CPD_FD_THREADS;
  float* const dB = dA + KS * LD;
  const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, dm = tid % T;
  const long long Ko = fd_opaque(K), No = fd_opaque(N), Mo = fd_opaque(M);
  const int k_left = (int)(Ko - kst < (long long)KS ? Ko - kst : (long long)KS);
#pragma unroll
  for (int r = 0; r < PS; ++r) {
    const int u = warp + 8 * r, k = 8 * (u % (KS / 8)) + lane % 8, m = 4 * (u / (KS / 8)) + lane / 8;
    if (k < k_left && m0 + m < Mo) cpd::copy_async4(&dA[k * LD + m], ab + (m0 + m) * Ko + kst + k);
    else dA[k * LD + m] = 0.0f;
    const int kb = tid / T + 4 * r;
    if (kb < k_left && n0 + dm < No) cpd::copy_async4(&dB[kb * T + dm], bb + (kst + kb) * No + n0 + dm);
    else dB[kb * T + dm] = 0.0f;
  }
}

// The K loop of the raw-element kernels over one output tile: each slice k0's raw elements in its
// stage (S = 1: staged, then used; S > 1: cp.async double buffering, the next slice copied while
// this one runs), slice(k0, stage) called once every thread is past the barrier that publishes it;
// returns once every thread is past the tile's last slice (the next tile may stage over it).
template <int S, int KS, class Slice>
__device__ __forceinline__ void fd_raw_slices(float* __restrict__ smem, const float* __restrict__ ab,
                                              const float* __restrict__ bb, long long M, long long K, long long N,
                                              long long m0, long long n0, const Slice& slice) {
  constexpr int W = FdC16Shape<S, KS>::STAGE_WORDS;
  if (S > 1) {
    fd_stage_raw<KS>(smem, ab, bb, M, K, N, m0, n0, 0);
    cpd::copy_commit();
  }
  for (long long k0 = 0, sl = 0; k0 < K; k0 += KS, ++sl) {
    const int st = S > 1 ? (int)(sl & 1) : 0;
    if (S == 1) fd_stage_raw<KS>(smem, ab, bb, M, K, N, m0, n0, k0);
    cpd::copy_wait_all();
    __syncthreads();  // the slice is in; every thread is past the last reads of the other stage
    if (S > 1 && k0 + KS < K) {
      fd_stage_raw<KS>(smem + (st ^ 1) * W, ab, bb, M, K, N, m0, n0, k0 + KS);
      cpd::copy_commit();
    }
    slice(k0, smem + st * W);
    if (S == 1) __syncthreads();  // every thread is past this slice before the next is staged over it
  }
  if (S > 1) __syncthreads();  // ... and past the tile's last slice before the next tile's first stage
}

template <int S, int KS>
__device__ __forceinline__ void fd_c16_tiled(const float* __restrict__ a, const float* __restrict__ b,
                                             float* __restrict__ y, const float* __restrict__ sa,
                                             const float* __restrict__ sb, long long B, long long M, long long K,
                                             long long N, long long nb, int block, int s_emin,
                                             const cpd::FusedDotSpec& s) {
  constexpr int T = CPD_FD_T, R = CPD_FD_R, LD = FD_C16_LD, NC = KS / 16;
  constexpr int CB = 4 / NC;  // flag bytes per chunk (each byte: a quarter of the slice)
  constexpr cpd::u32 CMASK = (1u << (8 * CB)) - 1u;
  float* const smem = (float*)cpd::dynamic_smem();
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int dm = tid % T, dq = tid / T;  // flags: row (column) dm, elements dq KS / 4 .. + KS / 4
  const long long G = s.group;
  const long long tiles_m = (M + T - 1) / T, tiles_n = (N + T - 1) / T, tiles = B * tiles_m * tiles_n;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const cpd::TileOrigin o = cpd::tile_origin(t, tiles_m, tiles_n, T, T);
    const long long bi = o.bi, m0 = o.m0, n0 = o.n0;
    const float* ab = a + bi * M * K;
    const float* bb = b + bi * K * N;
    // the thread's rows' (columns') scales: pointers to the first of each (row 0 / column 0 stands
    // in for one outside the matrix: its scale reads as 1), so that a chunk's eight loads take
    // one add each
    const float* pa[R];
    const float* pb[R];
    cpd::u32 in_a = 0u, in_b = 0u;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const long long r = m0 + ty * R + i, cn = n0 + tx * R + i;
      in_a |= (cpd::u32)(r < M) << i;
      in_b |= (cpd::u32)(cn < N) << i;
      pa[i] = sa + (bi * M + (r < M ? r : 0)) * nb;
      pb[i] = sb + bi * nb * N + (cn < N ? cn : 0);
    }
    // scale q (of elements q block ..) of row i (column j): float32 bits
    auto scale_a = [&](int i, long long q) { return (in_a >> i) & 1u ? cpd::bits_of(pa[i][q]) : 0x3f800000u; };
    auto scale_b = [&](int j, long long qn) { return (in_b >> j) & 1u ? cpd::bits_of(pb[j][qn]) : 0x3f800000u; };
    // per output: c, the group's emax less F - 2 (the chunks' shifts are emf - xa - xb), its sum;
    // slow: outputs whose group fd_chunk16_step takes (a chunk's cut truncates, the rounding is
    // float32-subnormal); bad_a / bad_b: rows / columns with a flagged element or scale in the group
    cpd::u32 c[R][R], slow = 0u, bad_a = 0u, bad_b = 0u;
    int emf[R][R];
    long long Sg[R][R];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) c[i][j] = 0u, emf[i][j] = 0, Sg[i][j] = 0;
    long long kg = 0;  // the current group's first element
    // chunk counters, no divisions in the loop: the chunk's index in its group (the group has
    // gch = G / 16), and its scale q = kc / block with kq = kc - q block (block >= 16: a chunk
    // moves on by at most one scale)
    const int gch = (int)(G / 16);
    int cig = 0, kq = 0;
    long long qc = 0;
    fd_raw_slices<S, KS>(smem, ab, bb, M, K, N, m0, n0, [&](long long k0, float* stage) {
      const float* const dA = stage;
      const float* const dB = dA + KS * LD;
      cpd::u32* const fA = (cpd::u32*)(stage + KS * (LD + T));
      cpd::u32* const fB = fA + T;
      {
        cpd::u32 ba = 0u, bb2 = 0u;
#pragma unroll
        for (int r = 0; r < KS / 4; ++r) {
          const int k = dq * (KS / 4) + r;
          ba |= cpd::fd_c16_bad_element(cpd::bits_of(dA[k * LD + dm]));
          bb2 |= cpd::fd_c16_bad_element(cpd::bits_of(dB[k * T + dm]));
        }
        ((unsigned char*)fA)[dm * 4 + dq] = (unsigned char)ba;
        ((unsigned char*)fB)[dm * 4 + dq] = (unsigned char)bb2;
      }
      __syncthreads();  // the flags are in
#pragma unroll 1
      for (int ch = 0; ch < NC; ++ch) {
        const long long kc = k0 + 16 * ch;
        if (kc >= K) break;  // (uniform across the block)
        if (cig == 0) {  // a group starts: emax over c and its chunks' scale exponents
          kg = kc;
          const long long ke = K - kc < G ? K : kc + G;
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < R; ++j) {
              emf[i][j] = cpd::fd_exp(c[i][j], s.c_emin, s.zero_exp);
              Sg[i][j] = 0;
            }
          slow = bad_a = bad_b = 0u;
          long long q = qc;
#pragma unroll 1
          for (long long kk = kc, r = kq; kk < ke; kk += 16, r += 16) {
            if (r >= block) r -= block, ++q;
            const long long qn = q * N;
            int ea[R], eb[R];
#pragma unroll
            for (int i = 0; i < R; ++i) {
              ea[i] = cpd::fd_exp(scale_a(i, q), s_emin, s_emin);
              eb[i] = cpd::fd_exp(scale_b(i, qn), s_emin, s_emin);
            }
#pragma unroll
            for (int i = 0; i < R; ++i)
#pragma unroll
              for (int j = 0; j < R; ++j) emf[i][j] = cpd::imax(emf[i][j], ea[i] + eb[j]);
          }
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < R; ++j) emf[i][j] += 2 - s.frac;
        }
        // the chunk's FMA chains
        float q[R][R];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) q[i][j] = 0.0f;
#pragma unroll 4
        for (int kk = 0; kk < 16; ++kk) {
          const float4 va = *(const float4*)&dA[(16 * ch + kk) * LD + ty * R];
          const float4 vb = *(const float4*)&dB[(16 * ch + kk) * T + tx * R];
          const float av[R] = {va.x, va.y, va.z, va.w}, bv[R] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < R; ++j) q[i][j] = cpd::ffma(av[i], bv[j], q[i][j]);
        }
        // the chunk's terms (cpd::fd_c16_v, fd_c16_term): its scales, 4 ma and mb as float32 factors
        float fa[R], fb[R];
        int xa[R], xb[R];
        const long long qcn = qc * N;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const cpd::FdC16Scale ua = cpd::fd_c16_scale(scale_a(i, qc), s_emin);
          const cpd::FdC16Scale ub = cpd::fd_c16_scale(scale_b(i, qcn), s_emin);
          fa[i] = (float)(4u * ua.m), xa[i] = ua.x, fb[i] = (float)ub.m, xb[i] = ub.x;
          bad_a |= (ua.bad | (cpd::u32)(((fA[ty * R + i] >> (8 * CB * ch)) & CMASK) != 0u)) << i;
          bad_b |= (ub.bad | (cpd::u32)(((fB[tx * R + i] >> (8 * CB * ch)) & CMASK) != 0u)) << i;
        }
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) {
            const int v = cpd::fd_c16_v(q[i][j], cpd::fmul(fa[i], fb[j]));
            const int sh = emf[i][j] - xa[i] - xb[j];
            Sg[i][j] += cpd::fd_c16_term(v, sh);
            slow |= (cpd::u32)((sh > 0) & (v != 0)) << (i * R + j);  // a cut that truncates
          }
        kq += 16;  // the next chunk's scale
        if (kq >= block) kq -= block, ++qc;
        if (++cig == gch) cig = 0;
        if (kc + 16 < (K - kg < G ? K : kg + G)) continue;
        // the group's last chunk: one rounding per output, fd_chunk16_step for the marked ones
        cpd::u32 cn[R][R];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) {
            cpd::u32 sl1 = ((bad_a >> i) | (bad_b >> j)) & 1u;
            cn[i][j] = cpd::fd_c16_finish(s, Sg[i][j], emf[i][j] + s.frac - 2, c[i][j], &sl1);
            slow |= sl1 << (i * R + j);
          }
        if (slow) {
          const int len = K - kg < G ? (int)(K - kg) : (int)G;
          fd_redo(slow, c, cn, m0 + ty * R, n0 + tx * R, M, N, [&](long long gm, long long gn, cpd::u32 cq) {
            const cpd::FdScales x = fd_output_scales(sa, sb, bi, M, N, nb, gm, gn, block, s_emin);
            return cpd::fd_chunk16_step(s, ab + gm * K + kg, 1, bb + kg * N + gn, N, len, cq, x, kg);
          });
        }
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) c[i][j] = cn[i][j];
      }
    });
    fd_store(y, c, bi, M, N, m0 + ty * R, n0 + tx * R);
  }
}

// The AMD pairwise kernels (cpd/fused_dot_tiled.h fd_amdp_applies: CDNA1 / CDNA2 fp16 and bf16
// MFMA, groups of 2 or 4; FTZ: CDNA2's flushes). fd_c16_tiled's tiles, threads and raw stages
// (s1: one stage of 32; s2g2: two of 64, cp.async), then per 4 k (one group of 4, or two of 2)
// each thread's 16 outputs' products (an FFMA with +0 each), pairwise sums and c + sum, in float32:
// fd_amd_pairwise_step's operations on the same values in the same order. With FTZ the elements
// below their format's smallest normal are flushed to +0 in the stage, once per slice.
template <int S, int KS, bool FTZ>
__device__ __forceinline__ void fd_amdp_tiled(const float* __restrict__ a, const float* __restrict__ b,
                                              float* __restrict__ y, long long B, long long M, long long K,
                                              long long N, const cpd::FusedDotSpec& s) {
  constexpr int T = CPD_FD_T, R = CPD_FD_R, LD = FD_C16_LD;
  float* const smem = (float*)cpd::dynamic_smem();
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16, dm = tid % T, dq = tid / T;
  const cpd::u32 amin = (cpd::u32)(s.a_emin + 127) << 23, bmin = (cpd::u32)(s.b_emin + 127) << 23;
  const bool pairs = s.group == 2;
  const long long tiles_m = (M + T - 1) / T, tiles_n = (N + T - 1) / T, tiles = B * tiles_m * tiles_n;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const cpd::TileOrigin o = cpd::tile_origin(t, tiles_m, tiles_n, T, T);
    const long long bi = o.bi, m0 = o.m0, n0 = o.n0;
    const float* ab = a + bi * M * K;
    const float* bb = b + bi * K * N;
    cpd::u32 c[R][R];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) c[i][j] = 0u;
    fd_raw_slices<S, KS>(smem, ab, bb, M, K, N, m0, n0, [&](long long k0, float* dA) {
      float* const dB = dA + KS * LD;
      if (FTZ) {  // this thread's quarter of row dm of A and of column dm of B
#pragma unroll
        for (int r = 0; r < KS / 4; ++r) {
          const int k = dq * (KS / 4) + r;
          dA[k * LD + dm] = cpd::fd_amd_input(dA[k * LD + dm], amin, 1);
          dB[k * T + dm] = cpd::fd_amd_input(dB[k * T + dm], bmin, 1);
        }
        __syncthreads();
      }
#pragma unroll 1
      for (int k4 = 0; k4 < KS; k4 += 4) {
        if (k0 + k4 >= K) break;  // (uniform across the block)
        float p[4][R][R];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const float4 va = *(const float4*)&dA[(k4 + kk) * LD + ty * R];
          const float4 vb = *(const float4*)&dB[(k4 + kk) * T + tx * R];
          const float av[R] = {va.x, va.y, va.z, va.w}, bv[R] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < R; ++j) p[kk][i][j] = cpd::fd_amd_product(av[i], bv[j], FTZ);
        }
        const bool second = k0 + k4 + 2 < K;  // groups of 2: whether the second one exists
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < R; ++j) {
            const float s01 = cpd::fd_amd_pair(p[0][i][j], p[1][i][j], FTZ);
            const float s23 = cpd::fd_amd_pair(p[2][i][j], p[3][i][j], FTZ);
            if (!pairs) {
              c[i][j] = cpd::fd_amd_pairwise_finish(c[i][j], cpd::fd_amd_pair(s01, s23, FTZ), FTZ);
            } else {
              c[i][j] = cpd::fd_amd_pairwise_finish(c[i][j], s01, FTZ);
              if (second) c[i][j] = cpd::fd_amd_pairwise_finish(c[i][j], s23, FTZ);
            }
          }
      }
    });
    fd_store(y, c, bi, M, N, m0 + ty * R, n0 + tx * R);
  }
}

}  // namespace

// Every tiled kernel: these parameters, the spec made from them, then RUN where TAKES holds (the
// family's own predicate, group and shared memory; each parenthesized, so that their commas stay
// inside), else every output from fd_outputs (a routing slip: the generic steps' bits, slowly).
#define CPD_FD_KERNEL(NAME, TAKES, RUN)                                                                           \
  extern "C" __global__ void __launch_bounds__(CPD_FD_THREADS, 1)                                                 \
      NAME(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,                       \
           const float* __restrict__ sa, const float* __restrict__ sb, long long B, long long M, long long K,      \
           long long N, long long nb, int block, int s_emin, int group, int frac, int out, int a_emin, int b_emin, \
           int zero_exp, int algo, int ftz, int a_man, int b_man) {                                               \
    const cpd::FusedDotSpec s = cpd::make_fused_dot_spec(group, frac, out, a_emin, b_emin, zero_exp, algo, ftz); \
    if (TAKES)                                                                                                    \
      RUN;                                                                                                        \
    else                                                                                                          \
      fd_outputs(a, b, y, sa, sb, B, M, K, N, nb, block, s_emin, s);                                              \
  }
// a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous float32; sa (B, M, nb) and sb (B, nb, N)
// the block scales (one per `block` elements along K, exponent floor s_emin) or null (nb 0, block
// 1, s_emin -127). For a spec that satisfies cpd::fd_tiled_applies with the kernel's L its group,
// WIDE fd_tiled_wide and scales where SC (the kernel's `s` suffix), launched with at least
// FdShape<L, S, G>::BYTES of dynamic shared memory; any other spec, or a launch with less shared
// memory, gets every output from fd_outputs (the same bits, without the tiles).
#define CPD_FD_TILED(NAME, L, WIDE, S, G, SC)                                                                     \
  CPD_FD_KERNEL(NAME,                                                                                             \
                ((sa != nullptr) == SC && cpd::fd_tiled_applies(s, a_man, b_man, SC ? block : 0) && group == L && \
                 cpd::fd_tiled_wide(s) == WIDE && cpd::dynamic_smem_size() >= FdShape<L, S, G>::BYTES),          \
                (fd_tiled<L, WIDE, S, G, SC>(a, b, y, sa, sb, B, M, K, N, nb, block, s_emin, s, a_man, b_man)))
// G groups of L per K slice: d slices of 16 (at least one group)
#define CPD_FD_GROUPS(L, d) ((L) >= 16 ? (d) : (d) * (16 / (L)))
// Which shapes a compile builds: those its GPU can launch (cpd/_tensor_core_op.py shapes_of,
// cuda/cpu/launch.cpp fd_shape_built; every kernel is NVRTC time on the user's first call):
//   * before sm_80 (no cp.async): s1 only;
//   * sm_80 and later: s2g2; s2 for the L 32 families without scales and s1 for the one with
//     (where s2g2's 130 KiB exceeds a 99 KiB GPU's blocks); no other s1 (s2g2 fits everywhere);
//   * the host shim (no __CUDA_ARCH__: tests run every shape on the CPU): all of them.
#if !defined(__CUDA_ARCH__)
#define CPD_FD_ONE_STAGE(x) x
#define CPD_FD_TWO_STAGES(x) x
#elif __CUDA_ARCH__ < 800
#define CPD_FD_ONE_STAGE(x) x
#define CPD_FD_TWO_STAGES(x)
#else
#define CPD_FD_ONE_STAGE(x)
#define CPD_FD_TWO_STAGES(x) x
#endif
// s1 and s2g2 of a family, each where the compile builds it; s2 too for the L 32 families without
// scales (CPD_FD_TILED_SHAPES3). The L 32 family with scales is written out: its s1 is always built.
#define CPD_FD_TILED_SHAPES(NAME, L, WIDE, SC)                                    \
  CPD_FD_ONE_STAGE(CPD_FD_TILED(NAME##_s1, L, WIDE, 1, CPD_FD_GROUPS(L, 1), SC)) \
  CPD_FD_TWO_STAGES(CPD_FD_TILED(NAME##_s2g2, L, WIDE, 2, CPD_FD_GROUPS(L, 2), SC))
#define CPD_FD_TILED_SHAPES3(NAME, L, WIDE, SC) \
  CPD_FD_TILED_SHAPES(NAME, L, WIDE, SC)        \
  CPD_FD_TWO_STAGES(CPD_FD_TILED(NAME##_s2, L, WIDE, 2, CPD_FD_GROUPS(L, 1), SC))
CPD_FD_TILED_SHAPES3(cpd_fused_dot_tiled_l32, 32, false, false)  // Hopper FP8 (F 13)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l16, 16, false, false)   // Ada FP8 (F 13)
CPD_FD_TILED_SHAPES3(cpd_fused_dot_tiled_l32w, 32, true, false)  // Blackwell FP8 / FP6 / FP4 (F 25)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l16w, 16, true, false)   // Hopper, Blackwell FP16 / BF16 (F 25)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l8, 8, false, false)     // Turing, Ampere, Ada FP16 / BF16 (F 24)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l8w, 8, true, false)     // Hopper, Blackwell TF32 (F 25)
CPD_FD_TILED_SHAPES(cpd_fused_dot_tiled_l4, 4, false, false)     // Volta FP16 (F 23), Ampere, Ada TF32 (F 24)
CPD_FD_TILED(cpd_fused_dot_tiled_l32ws_s1, 32, true, 1, 1, true)  // Blackwell MXFP8 / MXFP6 / MXFP4 (F 25)
CPD_FD_TWO_STAGES(CPD_FD_TILED(cpd_fused_dot_tiled_l32ws_s2g2, 32, true, 2, 2, true))

// The CDNA3 kernels (fd_tiled with AMD 1: fd_amdrd_applies; AMD 2: fd_amdrd8_applies): the same
// parameters and shapes as l8 / l4 / l16.
#define CPD_FD_TILED_AMD(NAME, L, S, G, AMD, APPLIES)                                                   \
  CPD_FD_KERNEL(NAME,                                                                                    \
                (sa == nullptr && cpd::APPLIES(s, a_man, b_man, 0) && group == L &&                      \
                 cpd::dynamic_smem_size() >= FdShape<L, S, G>::BYTES),                                   \
                (fd_tiled<L, false, S, G, false, AMD>(a, b, y, sa, sb, B, M, K, N, nb, block, s_emin, s, \
                                                      a_man, b_man)))
#define CPD_FD_TILED_AMD_SHAPES(NAME, L, AMD, APPLIES)                                            \
  CPD_FD_ONE_STAGE(CPD_FD_TILED_AMD(NAME##_s1, L, 1, CPD_FD_GROUPS(L, 1), AMD, APPLIES)) \
  CPD_FD_TWO_STAGES(CPD_FD_TILED_AMD(NAME##_s2g2, L, 2, CPD_FD_GROUPS(L, 2), AMD, APPLIES))
CPD_FD_TILED_AMD_SHAPES(cpd_fused_dot_tiled_l8a, 8, 1, fd_amdrd_applies)      // CDNA3 fp16, bf16 (F 24)
CPD_FD_TILED_AMD_SHAPES(cpd_fused_dot_tiled_l4a, 4, 1, fd_amdrd_applies)      // CDNA3 xf32 (F 24)
CPD_FD_TILED_AMD_SHAPES(cpd_fused_dot_tiled_l16a, 16, 2, fd_amdrd8_applies)  // CDNA3 fp8, bf8 (F 24, halves)

// The chunk16 kernels (fd_c16_tiled): the same parameters; s1 one stage of 32, s2g2 two of 64.
#define CPD_FD_C16(NAME, S, KS)                                                                 \
  CPD_FD_KERNEL(NAME,                                                                            \
                (sa != nullptr && cpd::fd_c16_applies(s, a_man, b_man, block) &&                 \
                 cpd::dynamic_smem_size() >= FdC16Shape<S, KS>::BYTES),                          \
                (fd_c16_tiled<S, KS>(a, b, y, sa, sb, B, M, K, N, nb, block, s_emin, s)))
CPD_FD_ONE_STAGE(CPD_FD_C16(cpd_fused_dot_tiled_c16_s1, 1, 32))  // Blackwell NVFP4, MXFP4 x MXFP4 (L 64, F 35)
CPD_FD_TWO_STAGES(CPD_FD_C16(cpd_fused_dot_tiled_c16_s2g2, 2, 64))

// The AMD pairwise kernels (fd_amdp_tiled): the same parameters; _amdpz with CDNA2's flushes.
#define CPD_FD_AMDP(NAME, S, KS, FTZ)                                                         \
  CPD_FD_KERNEL(NAME,                                                                          \
                (sa == nullptr && cpd::fd_amdp_applies(s, 0) && (ftz != 0) == FTZ &&           \
                 cpd::dynamic_smem_size() >= FdC16Shape<S, KS>::BYTES),                        \
                (fd_amdp_tiled<S, KS, FTZ>(a, b, y, B, M, K, N, s)))
CPD_FD_ONE_STAGE(CPD_FD_AMDP(cpd_fused_dot_tiled_amdp_s1, 1, 32, false))  // AMD CDNA1 fp16 (L 4), bf16 (L 2)
CPD_FD_TWO_STAGES(CPD_FD_AMDP(cpd_fused_dot_tiled_amdp_s2g2, 2, 64, false))
CPD_FD_ONE_STAGE(CPD_FD_AMDP(cpd_fused_dot_tiled_amdpz_s1, 1, 32, true))  // AMD CDNA2 fp16, bf16 (L 4, flushes)
CPD_FD_TWO_STAGES(CPD_FD_AMDP(cpd_fused_dot_tiled_amdpz_s2g2, 2, 64, true))
