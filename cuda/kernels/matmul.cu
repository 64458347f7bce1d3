// CUDA matmul over the core's accumulation steps (cpd/accumulate.h). Compiled at run time by
// NVRTC (cpd/_cuda.py); run on the host by the shim in the tests (cuda/shim/cpd_shim.h).
//
// Every output o = (batch, i, j) accumulates k = 0, 1, ..., K-1 in order with dot_step and the
// step's words from dot_words (keyed by (seed, offset, o, K, k)), so its bits are the CPU's
// whatever the tiling, the launch geometry or the device.
#include "cpd/launch.h"
#include "cpd/numerics.h"
#include "cpd/gemm.h"

#define CPD_THREADS 256  // threads per block of every launch of this file (__launch_bounds__)

// One thread per output element, grid-stride over the B*M*N outputs (64-bit indices), A and B
// read from global memory. a: (B, M, K), b: (B, K, N), y: (B, M, N), contiguous. One block per SM
// at least (__launch_bounds__'s minimum): without it ptxas held the kernel to 64 registers and it
// spilled 4-28 bytes at sm_70 and sm_121.
extern "C" __global__ void __launch_bounds__(CPD_THREADS, 1)
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
    const cpd::TileOrigin o = cpd::tile_origin(t, tiles_m, tiles_n, TM, TN);
    const long long bi = o.bi, m0 = o.m0, n0 = o.n0;
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

// ------------------------------------------------------------------------------------------
// The family kernels: one per family of cpd/gemm.h (CHAIN, LANES, KAHAN, F32, KAHAN32, FKAHAN32,
// LANES16, KAHAN16, LANESBF, KAHANBF, FUSEDBF, FKAHANBF, FUSED16, FKAHAN16, F32B, FF32B, SR), each
// with its step fixed at compile time, so that the inner loop is the step's instructions and two
// shared-memory loads per four outputs. A block of 256 threads (16 x 16)
// owns T x T outputs, T = 16 R; thread (tx, ty) owns the R x R outputs in rows own(ty, i) and columns own(tx, j)
// (groups of four neighbours, 64 apart: each float4 load from shared memory is conflict-free).
// K is walked in slices of CPD_FK staged in shared memory, double-buffered: while the block
// computes slice s from one buffer, the copies of slice s + 1 fill the other (cp.async on sm_80
// and later; elsewhere and in the host shim staged in registers: loaded before the compute,
// stored after it).
//   As[buf][kk][m] (A's slice transposed), Bs[buf][kk][n]; rows of T + 4 floats: 16-byte aligned,
//   and the transposing store (kk = e % 8 fastest, 4 rows per warp) hits 32 distinct banks.
// Full slices run with kk unrolled; the last partial slice (K % CPD_FK steps) runs after them, so
// each output takes exactly its K steps in order (no padding step: adding a +0 product would
// change a -0 sum). Positions outside the matrices are never copied and never reach an output.
// Outputs that end as NaN (cpd/gemm.h gemm_redo: a NaN's bits are the float32 unit's, which may
// differ from the generic steps'), those the binary16 and BF16 families' watches flag
// (gemm_f16_redo, gemm_bf16_redo: a product past the mul format's range, a Kahan sum past its
// guard), and every output when the spec is not the kernel's family
// (cpd/_kernels.py routes by the same predicates; this is a safety net), are recomputed by
// dot_output, the generic steps of cpd_matmul_simple.
#define CPD_FK 8

namespace {

// The generic steps of one output o (row ar of A, column bc of B with stride N): dot_step in order.
__device__ __noinline__ float dot_output(const float* __restrict__ ar, const float* __restrict__ bc, long long N,
                                         long long K, unsigned long long o, const cpd::DotSpec& d,
                                         unsigned long long seed, unsigned long long offset) {
  cpd::u32 w[cpd::DOT_WORDS];
  cpd::u32 s = 0u, c = 0u, bs = 0u;
  for (long long k = 0; k < K; ++k) {
    cpd::dot_words(o, (unsigned long long)K, (unsigned long long)k, seed, offset, d.mode,
                   cpd::dot_needs_high(d, (unsigned long long)k, (unsigned long long)K), w);
    cpd::dot_step(d, cpd::bits_of(ar[k]), cpd::bits_of(bc[k * N]), (unsigned long long)k, (unsigned long long)K, s, c,
                  bs, w);
  }
  return cpd::float_of(s);
}

struct ChainStep {
  static constexpr int FAMILY = cpd::GEMM_CHAIN;
  struct Acc {
    float s;
  };
  __device__ __forceinline__ void init(Acc& x) const { x.s = 0.0f; }
  __device__ __forceinline__ void step(Acc& x, float a, float b) const { cpd::gemm_chain_step(x.s, a, b); }
  static constexpr bool REDO = true;
  __device__ __forceinline__ bool redo(float s) const { return cpd::gemm_redo(s); }
};

struct LanesStep {
  static constexpr int FAMILY = cpd::GEMM_LANES;
  cpd::FormatF mg, ag;
  struct Acc {
    float s;
  };
  __device__ __forceinline__ void init(Acc& x) const { x.s = 0.0f; }
  __device__ __forceinline__ void step(Acc& x, float a, float b) const { cpd::gemm_lanes_step(x.s, a, b, mg, ag); }
  static constexpr bool REDO = true;
  __device__ __forceinline__ bool redo(float s) const { return cpd::gemm_redo(s); }
};

struct KahanStep {
  static constexpr int FAMILY = cpd::GEMM_KAHAN;
  cpd::FormatF mg, ag;
  struct Acc {
    float s, c;
  };
  __device__ __forceinline__ void init(Acc& x) const { x.s = x.c = 0.0f; }
  __device__ __forceinline__ void step(Acc& x, float a, float b) const {
    cpd::gemm_kahan_step(x.s, x.c, a, b, mg, ag);
  }
  static constexpr bool REDO = true;
  __device__ __forceinline__ bool redo(float s) const { return cpd::gemm_redo(s); }
};

// What family_gemm asks of a row step besides Row, init, step and value, and its defaults (each
// step derives from StepTraits and sets what differs): FROM_VALUE, whether an output's redo is
// judged from its stored value (redo_value: Rows) rather than from its accumulators (redo); KEYED,
// whether it steps by step_keyed (SrStep: the words of output and k); BLOCKED, whether by step_run
// (F32BlockStep: a run's end).
struct StepTraits {
  static constexpr bool FROM_VALUE = false;
  static constexpr bool KEYED = false;
  static constexpr bool BLOCKED = false;
  __device__ __forceinline__ bool redo_value(float) const { return false; }
};

// A row of R outputs of one thread (R per-output accumulators); the steps above are per output.
template <class S>
struct Rows : S, StepTraits {
  template <int R>
  struct Row {
    typename S::Acc x[R];
  };
  __device__ __forceinline__ float prep(float b) const { return b; }
  template <int R>
  __device__ __forceinline__ void init(Row<R>& r) const {
#pragma unroll
    for (int j = 0; j < R; ++j) S::init(r.x[j]);
  }
  template <int R>
  __device__ __forceinline__ void step(Row<R>& r, float a, const float (&b)[R], const float (&)[R]) const {
#pragma unroll
    for (int j = 0; j < R; ++j) S::step(r.x[j], a, b[j]);
  }
  template <int R>
  __device__ __forceinline__ float value(const Row<R>& r, int j) const { return r.x[j].s; }
  static constexpr bool FROM_VALUE = true;
  __device__ __forceinline__ bool redo_value(float s) const { return S::REDO && S::redo(s); }
};

// LANES16 and KAHAN16: a row of R outputs as R / 2 binary16 pairs (cpd/gemm.h gemm_f16_pair_step,
// gemm_kahan16_pair_step): sums s, Kahan's compensations c, the largest |product| mx.
template <bool KAHAN>
struct Binary16Step : StepTraits {
  static constexpr int FAMILY = KAHAN ? cpd::GEMM_KAHAN16 : cpd::GEMM_LANES16;
  cpd::GemmF16 g;
  template <int R>
  struct Row {
    cpd::u32 s[R / 2], c[KAHAN ? R / 2 : 1], mx[R / 2];
  };
  __device__ __forceinline__ float prep(float b) const { return cpd::gemm_f16_scale(b, g); }
  template <int R>
  __device__ __forceinline__ void init(Row<R>& r) const {
#pragma unroll
    for (int q = 0; q < R / 2; ++q) r.s[q] = r.mx[q] = r.c[KAHAN ? q : 0] = 0u;  // +0, +0
  }
  template <int R>
  __device__ __forceinline__ void step(Row<R>& r, float a, const float (&b)[R], const float (&bs)[R]) const {
#pragma unroll
    for (int q = 0; q < R / 2; ++q) {
      if (KAHAN)
        cpd::gemm_kahan16_pair_step(r.s[q], r.c[q], r.mx[q], a, b[2 * q], bs[2 * q], b[2 * q + 1], bs[2 * q + 1], g);
      else
        cpd::gemm_f16_pair_step(r.s[q], r.mx[q], a, b[2 * q], bs[2 * q], b[2 * q + 1], bs[2 * q + 1], g);
    }
  }
  template <int R>
  __device__ __forceinline__ float value(const Row<R>& r, int j) const { return cpd::h2_half(r.s[j / 2], j & 1); }
  template <int R>
  __device__ __forceinline__ bool redo(const Row<R>& r, int j) const {
    return cpd::gemm_f16_redo(r.s[j / 2], r.mx[j / 2], j & 1, g);
  }
};

// LANESBF and KAHANBF: float32 lanes, one per output (cpd/gemm.h gemm_bf16_step, gemm_kahanbf_step):
// sums s, Kahan's compensations c, the largest |product| w and (Kahan) the largest |t| top. FUSED:
// FUSEDBF and FKAHANBF, no mul format (gemm_fbf16_step, gemm_fkahanbf_step: w the largest |hi|).
template <bool KAHAN, bool FUSED = false>
struct BF16Step : StepTraits {
  static constexpr int FAMILY = FUSED ? (KAHAN ? cpd::GEMM_FKAHANBF : cpd::GEMM_FUSEDBF)
                                      : (KAHAN ? cpd::GEMM_KAHANBF : cpd::GEMM_LANESBF);
  cpd::GemmBF16 g;
  template <int R>
  struct Row {
    float s[R], w[R], c[KAHAN ? R : 1], top[KAHAN ? R : 1];
  };
  __device__ __forceinline__ float prep(float b) const { return FUSED ? b : cpd::gemm_f16_scale(b, g.m); }
  template <int R>
  __device__ __forceinline__ void init(Row<R>& r) const {
#pragma unroll
    for (int j = 0; j < R; ++j) r.s[j] = r.w[j] = r.c[KAHAN ? j : 0] = r.top[KAHAN ? j : 0] = 0.0f;
  }
  template <int R>
  __device__ __forceinline__ void step(Row<R>& r, float a, const float (&b)[R], const float (&bs)[R]) const {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (FUSED && KAHAN) cpd::gemm_fkahanbf_step(r.s[j], r.c[j], r.w[j], r.top[j], a, b[j], g);
      else if (FUSED) cpd::gemm_fbf16_step(r.s[j], r.w[j], a, b[j], g);
      else if (KAHAN) cpd::gemm_kahanbf_step(r.s[j], r.c[j], r.w[j], r.top[j], a, b[j], bs[j], g);
      else cpd::gemm_bf16_step(r.s[j], r.w[j], a, b[j], bs[j], g);
    }
  }
  template <int R>
  __device__ __forceinline__ float value(const Row<R>& r, int j) const { return r.s[j]; }
  template <int R>
  __device__ __forceinline__ bool redo(const Row<R>& r, int j) const {
    return cpd::gemm_bf16_redo(r.w[j], r.top[KAHAN ? j : 0], g);
  }
};

using FusedBF16Step = BF16Step<false, true>;  // (one macro argument each)
using FusedKahanBF16Step = BF16Step<true, true>;

// FUSED16 and FKAHAN16 (cpd/gemm.h gemm_fh16_step, gemm_fkahan16_step): float32 lanes, one per
// output: binary16 sums s, Kahan's compensations c, the largest |hi| w.
template <bool KAHAN>
struct FusedH16Step : StepTraits {
  static constexpr int FAMILY = KAHAN ? cpd::GEMM_FKAHAN16 : cpd::GEMM_FUSED16;
  cpd::FormatF ag;  // binary16's (the host's conversion)
  template <int R>
  struct Row {
    float s[R], w[R], c[KAHAN ? R : 1];
  };
  __device__ __forceinline__ float prep(float b) const { return b; }
  template <int R>
  __device__ __forceinline__ void init(Row<R>& r) const {
#pragma unroll
    for (int j = 0; j < R; ++j) r.s[j] = r.w[j] = r.c[KAHAN ? j : 0] = 0.0f;
  }
  template <int R>
  __device__ __forceinline__ void step(Row<R>& r, float a, const float (&b)[R], const float (&)[R]) const {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (KAHAN) cpd::gemm_fkahan16_step(r.s[j], r.c[j], r.w[j], a, b[j], ag);
      else cpd::gemm_fh16_step(r.s[j], r.w[j], a, b[j], ag);
    }
  }
  template <int R>
  __device__ __forceinline__ float value(const Row<R>& r, int j) const { return r.s[j]; }
  template <int R>
  __device__ __forceinline__ bool redo(const Row<R>& r, int j) const { return cpd::gemm_fh16_redo(r.s[j], r.w[j]); }
};

// The float32 families' shared part (F32, KAHAN32, FKAHAN32, F32B, FF32B): the product's constants,
// B's scaling, the value s of an output and its redo (a product past max or NaN, or a NaN sum;
// FUSED, exact products: a NaN sum). Each Row holds s and w (w unused when FUSED).
template <bool FUSED>
struct F32Lanes : StepTraits {
  cpd::GemmBF16 g;  // the product's constants and the mul format's max (FUSED: unused)
  __device__ __forceinline__ float prep(float b) const { return FUSED ? b : cpd::gemm_f16_scale(b, g.m); }
  template <class Row>
  __device__ __forceinline__ float value(const Row& r, int j) const { return r.s[j]; }
  template <class Row>
  __device__ __forceinline__ bool redo(const Row& r, int j) const {
    return FUSED ? cpd::gemm_redo(r.s[j]) : cpd::gemm_f32_redo(r.s[j], r.w[FUSED ? 0 : j], g);
  }
};

// F32, KAHAN32 and FKAHAN32 (cpd/gemm.h gemm_f32_step, gemm_kahan32_step, gemm_fkahan32_step):
// float32 lanes, one per output: sums s, Kahan's compensations c and (with a mul format) the largest
// |product| w.
template <bool KAHAN, bool FUSED>
struct F32Step : F32Lanes<FUSED> {
  using F32Lanes<FUSED>::g;
  static constexpr int FAMILY = FUSED ? cpd::GEMM_FKAHAN32 : (KAHAN ? cpd::GEMM_KAHAN32 : cpd::GEMM_F32);
  template <int R>
  struct Row {
    float s[R], w[FUSED ? 1 : R], c[KAHAN ? R : 1];
  };
  template <int R>
  __device__ __forceinline__ void init(Row<R>& r) const {
#pragma unroll
    for (int j = 0; j < R; ++j) r.s[j] = r.w[FUSED ? 0 : j] = r.c[KAHAN ? j : 0] = 0.0f;
  }
  template <int R>
  __device__ __forceinline__ void step(Row<R>& r, float a, const float (&b)[R], const float (&bs)[R]) const {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (FUSED) cpd::gemm_fkahan32_step(r.s[j], r.c[j], a, b[j]);
      else if (KAHAN) cpd::gemm_kahan32_step(r.s[j], r.c[j], r.w[j], a, b[j], bs[j], g);
      else cpd::gemm_f32_step(r.s[j], r.w[j], a, b[j], bs[j], g);
    }
  }
};

// F32B and FF32B (cpd/gemm.h gemm_f32b_term, gemm_ff32b_term, gemm_f32b_fold): F32 with blocks,
// products rounded or exact (FUSED); sums s, Kahan's compensations c, block sums bs, the largest
// |product| w. Step k adds each output's term to bs; at a run's end (run_end, the same for every
// output: family_gemm counts the run down) bs is folded into s. Kahan is the spec's, read at run
// ends only.
template <bool FUSED>
struct F32BlockStep : F32Lanes<FUSED> {
  using F32Lanes<FUSED>::g;
  static constexpr int FAMILY = FUSED ? cpd::GEMM_FF32B : cpd::GEMM_F32B;
  static constexpr bool BLOCKED = true;
  int kahan;
  template <int R>
  struct Row {
    float s[R], c[R], bs[R], w[FUSED ? 1 : R];
  };
  template <int R>
  __device__ __forceinline__ void init(Row<R>& r) const {
#pragma unroll
    for (int j = 0; j < R; ++j) r.s[j] = r.c[j] = r.bs[j] = r.w[FUSED ? 0 : j] = 0.0f;
  }
  template <int R>
  __device__ __forceinline__ void step_run(Row<R>& r, float a, const float (&b)[R], const float (&bs)[R],
                                           bool run_end) const {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (FUSED) cpd::gemm_ff32b_term(r.bs[j], a, b[j]);
      else cpd::gemm_f32b_term(r.bs[j], r.w[j], a, b[j], bs[j], g);
    }
    if (run_end) {
#pragma unroll
      for (int j = 0; j < R; ++j) cpd::gemm_f32b_fold(r.s[j], r.c[j], r.bs[j], kahan);
    }
  }
};

using F32PlainStep = F32Step<false, false>;  // (one macro argument each)
using F32KahanStep = F32Step<true, false>;
using F32FusedKahanStep = F32Step<true, true>;

// Row (column) of the i-th output of thread t along M (N) in a tile of R x R per thread: groups of
// 4, 64 apart (R a multiple of 4: float4 loads), or R neighbours (R = 2: float2 loads).
template <int R>
__device__ __forceinline__ int own(int t, int i) {
  return R % 4 == 0 ? (i >> 2) * 64 + t * 4 + (i & 3) : t * R + i;
}

// SR: stochastic rounding (cpd/gemm.h gemm_sr_step), a row of R outputs as float32 bits: sums s,
// Kahan's compensations c, block sums bs. The step is keyed: output o's step k draws dot_words(o, K,
// k) (one Philox4x32-10 block, or two), computed in registers for each output and step.
struct SrStep : StepTraits {
  static constexpr int FAMILY = cpd::GEMM_SR;
  static constexpr bool KEYED = true;
  cpd::DotSpec d;
  unsigned long long seed, offset, K;
  template <int R>
  struct Row {
    cpd::u32 s[R], c[R], bs[R];
  };
  __device__ __forceinline__ float prep(float b) const { return b; }
  template <int R>
  __device__ __forceinline__ void init(Row<R>& r) const {
#pragma unroll
    for (int j = 0; j < R; ++j) r.s[j] = r.c[j] = r.bs[j] = 0u;
  }
  // Step k of the row's outputs o_row + own(tx, j).
  template <int R>
  __device__ __forceinline__ void step_keyed(Row<R>& r, float a, const float (&b)[R], unsigned long long k,
                                             unsigned long long o_row, int tx) const {
    const int high = cpd::dot_needs_high(d, k, K), run_end = d.block && high;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      cpd::u32 w[cpd::DOT_WORDS];
      cpd::dot_words(o_row + (unsigned long long)own<R>(tx, j), K, k, seed, offset, cpd::STOCHASTIC, high, w);
      cpd::gemm_sr_step(d, cpd::bits_of(a), cpd::bits_of(b[j]), run_end, r.s[j], r.c[j], r.bs[j], w);
    }
  }
  template <int R>
  __device__ __forceinline__ float value(const Row<R>& r, int j) const { return cpd::float_of(r.s[j]); }
  template <int R>
  __device__ __forceinline__ bool redo(const Row<R>&, int) const { return false; }  // exact in the step
};

template <int R>
struct alignas(16) Tiles {  // 16-byte rows: float4 (float2) loads
  static constexpr int T = 16 * R;
  float a[2][CPD_FK][T + 4];
  float b[2][CPD_FK][T + 4];
};

template <class Step, int R>
__device__ __forceinline__ void family_gemm(const float* __restrict__ a, const float* __restrict__ b,
                                            float* __restrict__ y, long long B, long long M, long long K, long long N,
                                            const cpd::DotSpec& d, const cpd::DotSpec& spec, const Step& st,
                                            unsigned long long seed,
                                            unsigned long long offset, Tiles<R>& sh) {
  constexpr int T = 16 * R, PER = T * CPD_FK / CPD_THREADS;  // copies per thread and operand
  const int tx = (int)(threadIdx.x % 16u), ty = (int)(threadIdx.x / 16u);
  const bool mine = cpd::gemm_family(d) == Step::FAMILY;
  const long long tiles_m = (M + T - 1) / T, tiles_n = (N + T - 1) / T, tiles = B * tiles_m * tiles_n;
  const long long full = K / CPD_FK;
  const int tail = (int)(K - full * CPD_FK);
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const cpd::TileOrigin o = cpd::tile_origin(t, tiles_m, tiles_n, T, T);
    const long long bi = o.bi, m0 = o.m0, n0 = o.n0;
    const float* ab = a + bi * M * K;
    const float* bb = b + bi * K * N;
    // Stage the next slice into buffer buf: A coalesced along K (8 floats per row), B along N.
    // Each thread copies fixed rows (columns) of the tile: their pointers, advanced by one slice per
    // stage, and row/column checks are set once per tile; `left` = K - the slice's first k.
    const float* ap[PER];
    const float* bp[PER];
    int akk[PER], bkk[PER];
#pragma unroll
    for (int r = 0; r < PER; ++r) {
      const int e = (int)threadIdx.x + r * CPD_THREADS;
      akk[r] = m0 + e / CPD_FK < M ? e % CPD_FK : CPD_FK;  // CPD_FK: the row is outside A, never copied
      bkk[r] = n0 + e % T < N ? e / T : CPD_FK;
      ap[r] = ab + (akk[r] < CPD_FK ? (m0 + e / CPD_FK) * K + akk[r] : 0);
      bp[r] = bb + (bkk[r] < CPD_FK ? bkk[r] * N + n0 + e % T : 0);
    }
    // Where cp.async is missing (before sm_80, and the host shim: cpd/launch.h CPD_COPY_ASYNC) the
    // next slice is staged in registers: loaded by stage() before the compute of this slice, stored
    // to its buffer by publish() after it, so the loads' latency overlaps the compute as cp.async's
    // does. `staged` is the staged slice's lim (kk < staged were loaded; 0: nothing staged).
#if !CPD_COPY_ASYNC
    float ra[PER], rb[PER];
#endif
    int staged = 0;
    auto stage = [&](int buf, long long left) {
      const int lim = left < CPD_FK ? (int)left : CPD_FK;  // kk < lim are inside A and B
#pragma unroll
      for (int r = 0; r < PER; ++r) {
        const int e = (int)threadIdx.x + r * CPD_THREADS;
#if CPD_COPY_ASYNC
        if (akk[r] < lim) cpd::copy_async4(&sh.a[buf][e % CPD_FK][e / CPD_FK], ap[r]);
        if (bkk[r] < lim) cpd::copy_async4(&sh.b[buf][e / T][e % T], bp[r]);
#else
        (void)buf, (void)e;
        ra[r] = akk[r] < lim ? *ap[r] : 0.0f;
        rb[r] = bkk[r] < lim ? *bp[r] : 0.0f;
#endif
        ap[r] += CPD_FK;
        bp[r] += CPD_FK * N;
      }
      staged = lim;
      cpd::copy_commit();
    };
    auto publish = [&](int buf) {  // the staged slice in buffer buf, once every thread waits at a barrier
#if !CPD_COPY_ASYNC
#pragma unroll
      for (int r = 0; r < PER; ++r) {
        const int e = (int)threadIdx.x + r * CPD_THREADS;
        if (akk[r] < staged) sh.a[buf][e % CPD_FK][e / CPD_FK] = ra[r];
        if (bkk[r] < staged) sh.b[buf][e / T][e % T] = rb[r];
      }
#else
      (void)buf;
#endif
      staged = 0;
      cpd::copy_wait_all();
    };
    typename Step::template Row<R> acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) st.init(acc[i]);
    int left = d.block;  // BLOCKED: the steps left in the current run (k runs 0, 1, ..., K - 1 here)
    auto compute = [&](int buf, int kk, long long k) {
      float av[R], bv[R], bp[R];
      if constexpr (R % 4 == 0) {
#pragma unroll
        for (int q = 0; q < R / 4; ++q) {
          const float4 va = *reinterpret_cast<const float4*>(&sh.a[buf][kk][q * 64 + ty * 4]);
          const float4 vb = *reinterpret_cast<const float4*>(&sh.b[buf][kk][q * 64 + tx * 4]);
          av[4 * q] = va.x, av[4 * q + 1] = va.y, av[4 * q + 2] = va.z, av[4 * q + 3] = va.w;
          bv[4 * q] = vb.x, bv[4 * q + 1] = vb.y, bv[4 * q + 2] = vb.z, bv[4 * q + 3] = vb.w;
        }
      } else {
        static_assert(R == 2, "register tiles of 2 x 2 or a multiple of 4");
        const float2 va = *reinterpret_cast<const float2*>(&sh.a[buf][kk][ty * 2]);
        const float2 vb = *reinterpret_cast<const float2*>(&sh.b[buf][kk][tx * 2]);
        av[0] = va.x, av[1] = va.y, bv[0] = vb.x, bv[1] = vb.y;
      }
#pragma unroll
      for (int j = 0; j < R; ++j) bp[j] = st.prep(bv[j]);  // per operand of B, once per load
      bool run_end = false;
      if constexpr (Step::BLOCKED) {  // dot_step's run end: k + 1 a multiple of the block, or K
        run_end = --left == 0 || k + 1 == K;
        if (left == 0) left = d.block;
      }
      (void)run_end;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if constexpr (Step::BLOCKED)
          st.step_run(acc[i], av[i], bv, bp, run_end);
        else if constexpr (Step::KEYED)
          st.step_keyed(acc[i], av[i], bv, (unsigned long long)k,
                        (unsigned long long)((bi * M + m0 + own<R>(ty, i)) * N + n0), tx);
        else
          st.step(acc[i], av[i], bv, bp);
      }
    };
    stage(0, K);
    publish(0);
    __syncthreads();
    if constexpr (Step::KEYED) {
      // SR: every slice, the partial last one too, in one loop with kk not unrolled, so that the
      // kernel holds one copy of its long step per output of the tile (not one per kk and another
      // for the tail: NVRTC's time grows with that code), at a loop overhead small beside a
      // Philox block per output and step.
      const long long slices = full + (tail > 0);
      for (long long s = 0; s < slices; ++s) {
        const int cb = (int)(s & 1), lim = s < full ? CPD_FK : tail;
        if ((s + 1) * CPD_FK < K) stage(cb ^ 1, K - (s + 1) * CPD_FK);
#pragma unroll 1
        for (int kk = 0; kk < lim; ++kk) compute(cb, kk, s * CPD_FK + kk);
        publish(cb ^ 1);
        __syncthreads();  // also the barrier before the next tile's first stage
      }
    } else {
      for (long long s = 0; s < full; ++s) {
        const int cb = (int)(s & 1);
        if ((s + 1) * CPD_FK < K) stage(cb ^ 1, K - (s + 1) * CPD_FK);  // the next slice, full or partial
#pragma unroll
        for (int kk = 0; kk < CPD_FK; ++kk) compute(cb, kk, s * CPD_FK + kk);
        publish(cb ^ 1);  // (buffer cb ^ 1 was last read before the previous barrier)
        __syncthreads();  // the next slice is in; this one is read by all before it is overwritten
      }
      for (int kk = 0; kk < tail; ++kk) compute((int)(full & 1), kk, full * CPD_FK + kk);
      __syncthreads();  // the next tile's first stage overwrites buffer 0
    }
    // The outputs to redo: from the accumulators (a bit each, before the stores), or from the stored
    // values (Rows: y holds this thread's own stores); no accumulator lives across dot_output.
    unsigned long long redo = 0ull;
    if constexpr (!Step::FROM_VALUE) {
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (st.redo(acc[i], j)) redo |= 1ull << (i * R + j);
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const long long gm = m0 + own<R>(ty, i), gn = n0 + own<R>(tx, j);
        if (gm < M && gn < N) y[(bi * M + gm) * N + gn] = st.value(acc[i], j);
      }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < R; ++j) {
        const long long gm = m0 + own<R>(ty, i), gn = n0 + own<R>(tx, j), o = (bi * M + gm) * N + gn;
        if (gm < M && gn < N &&
            (!mine || (Step::FROM_VALUE ? st.redo_value(y[o]) : (bool)((redo >> (i * R + j)) & 1ull))))
          y[o] = dot_output(ab + gm * K, bb + gn, N, K, (unsigned long long)o, spec, seed, offset);
      }
  }
}

}  // namespace

// The family kernels' parameters are cpd_matmul_tiled's; R: the register tile (R x R outputs per
// thread) and MINB: the blocks of 256 per SM that __launch_bounds__ asks for, sized per family and
// architecture so that nothing spills (tests/test_cuda.py: ptxas at sm_75, sm_80 and sm_90):
// * the 4 x 4 tiles: 2 blocks (at most 128 registers a thread); on Volta (sm_70, NVRTC 12 only) 1,
//   where ptxas's code needs more (at 2 blocks every family spilled 36-164 bytes);
// * the chain's 8 x 8 tile (64 sums): 1 block (186-197 registers from sm_80 on, 245 at sm_75; at 2
//   blocks it spilled 56-328 bytes of staging values, 3 LDL per 512 FFMA in its K loop at sm_90);
// * SR: 2 x 2 outputs per thread, 1 block (three words per output and the Philox state).
// * KAHANBF before sm_80, and the blocked float32 families (F32B, FF32B): 1 block (below).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
#define CPD_FAMILY_MINB 1
#else
#define CPD_FAMILY_MINB 2
#endif
#define CPD_FAMILY_KERNEL(NAME, STEP, R, MINB, MAKE)                                                             \
  extern "C" __global__ void __launch_bounds__(CPD_THREADS, MINB)                                              \
      NAME(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, long long B,         \
           long long M, long long K, long long N, int has_mul, int mexp, int mman, int mbias, int mspecials,     \
           int msubnormals, int aexp, int aman, int abias, int aspecials, int asubnormals, int kahan, int block, \
           int mode, int saturate, int sr_bits, unsigned long long seed, unsigned long long offset) {            \
    const cpd::Format mf = cpd::make_format(mexp, mman, mbias, mspecials, msubnormals, saturate);               \
    const cpd::Format af = cpd::make_format(aexp, aman, abias, aspecials, asubnormals, saturate);               \
    const cpd::DotSpec d = cpd::make_dot_spec(mf, has_mul, af, kahan, block, mode, sr_bits);                    \
    __shared__ Tiles<R> sh;                                                                                     \
    __shared__ cpd::DotSpec spec; /* dot_output's by reference: shared, not a stack copy per thread */        \
    if (threadIdx.x == 0) spec = d;                                                                             \
    __syncthreads();                                                                                            \
    STEP st;                                                                                                    \
    MAKE;                                                                                                       \
    family_gemm<STEP, R>(a, b, y, B, M, K, N, d, spec, st, seed, offset, sh);                                   \
  }

CPD_FAMILY_KERNEL(cpd_matmul_chain, Rows<ChainStep>, 8, 1, (void)0)
CPD_FAMILY_KERNEL(cpd_matmul_lanes, Rows<LanesStep>, 4, CPD_FAMILY_MINB, (st.mg = cpd::make_format_f(mf), st.ag = cpd::make_format_f(af)))
CPD_FAMILY_KERNEL(cpd_matmul_kahan, Rows<KahanStep>, 4, CPD_FAMILY_MINB, (st.mg = cpd::make_format_f(mf), st.ag = cpd::make_format_f(af)))
CPD_FAMILY_KERNEL(cpd_matmul_f32, F32PlainStep, 4, CPD_FAMILY_MINB, (st.g = cpd::make_gemm_bf16(mf, af)))
CPD_FAMILY_KERNEL(cpd_matmul_kahan32, F32KahanStep, 4, CPD_FAMILY_MINB, (st.g = cpd::make_gemm_bf16(mf, af)))
CPD_FAMILY_KERNEL(cpd_matmul_fkahan32, F32FusedKahanStep, 4, CPD_FAMILY_MINB, (void)0)
// The blocked float32 families keep four values per output (s, c, bs, w): one block per SM.
CPD_FAMILY_KERNEL(cpd_matmul_f32b, F32BlockStep<false>, 4, 1, (st.g = cpd::make_gemm_bf16(mf, af), st.kahan = d.kahan))
CPD_FAMILY_KERNEL(cpd_matmul_ff32b, F32BlockStep<true>, 4, 1, (st.kahan = d.kahan))
CPD_FAMILY_KERNEL(cpd_matmul_lanes16, Binary16Step<false>, 4, CPD_FAMILY_MINB, (st.g = cpd::make_gemm_f16(mf, af)))
CPD_FAMILY_KERNEL(cpd_matmul_kahan16, Binary16Step<true>, 4, CPD_FAMILY_MINB, (st.g = cpd::make_gemm_f16(mf, af)))
CPD_FAMILY_KERNEL(cpd_matmul_lanesbf, BF16Step<false>, 4, CPD_FAMILY_MINB, (st.g = cpd::make_gemm_bf16(mf, af)))
// KAHANBF on Turing: one block per SM (at two, with the rounding's cut in registers for TF32, ptxas
// at sm_75 spilled 16 bytes at 128 registers).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define CPD_KAHANBF_MINB 1
#else
#define CPD_KAHANBF_MINB CPD_FAMILY_MINB
#endif
CPD_FAMILY_KERNEL(cpd_matmul_kahanbf, BF16Step<true>, 4, CPD_KAHANBF_MINB, (st.g = cpd::make_gemm_bf16(mf, af)))
CPD_FAMILY_KERNEL(cpd_matmul_fusedbf, FusedBF16Step, 4, CPD_FAMILY_MINB, (st.g = cpd::make_gemm_fbf16(af)))
CPD_FAMILY_KERNEL(cpd_matmul_fkahanbf, FusedKahanBF16Step, 4, CPD_FAMILY_MINB, (st.g = cpd::make_gemm_fbf16(af)))
CPD_FAMILY_KERNEL(cpd_matmul_fused16, FusedH16Step<false>, 4, CPD_FAMILY_MINB, (st.ag = cpd::make_format_f(af)))
CPD_FAMILY_KERNEL(cpd_matmul_fkahan16, FusedH16Step<true>, 4, CPD_FAMILY_MINB, (st.ag = cpd::make_format_f(af)))
// SR keeps three words per output (s, c, bs: Kahan and blocks are run-time choices) and the Philox
// state: a 2 x 2 tile per thread (32 x 32 per block), one block of 256 per SM: 177-218 registers
// from sm_70 to sm_121 (its 4 x 4 tile took 255 and spilled 1.5 KiB at sm_100 / sm_121; 2 x 2 at
// 128 registers spilled 48 bytes at sm_90). The Philox block per output and step dominates its
// cost, so the smaller tile's extra shared loads (0.5 per MAC) cost little.
CPD_FAMILY_KERNEL(cpd_matmul_sr, SrStep, 2, 1, (st.d = d, st.seed = seed, st.offset = offset, st.K = (unsigned long long)K))
