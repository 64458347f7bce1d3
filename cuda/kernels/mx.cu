// CUDA kernels of cpd.mx (block-scaled formats): cast (fake-quantize), encode, decode.
// Compiled at run time by NVRTC (cpd/_cuda.py); on machines without a GPU the same text runs as
// host C++ through the shim (cuda/shim/cpd_shim.h, cpd/_shim.py, which models warps in lock
// step, shuffles included) in the tests, which check it against the CPU kernels (cuda/cpu/mx.cpp)
// bit for bit.
//
// Launches (cuda/cpu/launch.cpp mx_cast / mx_encode / mx_decode): x is (rows, n), the block axis
// last, contiguous. A *group* of G lanes of one warp works one block of `block` elements at a
// time, G = `block` rounded up to a power of two, at most 32 (mx_lanes: 32 for MX's blocks of
// 32, 16 for NVFP4's 16, any block size maps); lane l takes elements l, l + G, l + 2G, ... of the
// block, so a warp reads and writes 32 consecutive floats of a row per instruction (coalesced),
// where a thread per block read addresses 4 * block bytes apart. Groups run a grid-stride loop
// over batches of CPD_MX_BATCH consecutive blocks (row-major over the rows * nblocks blocks, 64-bit
// indices as cpd/launch.h's), the batch's first loads issued together; the launch gives every
// thread block at least G threads, and the threads past its last whole group idle. Every block
// size maps to a group, so no thread-per-block path is kept.
//
// __launch_bounds__(256, 2): without the minimum of 2 blocks per SM ptxas aims at 64 registers
// and spills a few bytes (the BlockSpec's fields stay live across the loops); with it no kernel
// here touches local memory at sm_70 .. sm_120 (tests/test_mx_kernels.py checks sm_90).
//
// Per block: each lane takes the largest magnitude bits of its elements, the group's max comes
// from G/2, ..., 1 butterfly shuffles (__shfl_xor_sync, the group's lanes as mask), and every
// value after that is the numerics core's (cpd/block.h): the scale from the block's amax, each
// element rounded once (the exact product for power-of-two scales, cpd::block_elem_pow2),
// stochastic rounding with element i's word random_word(i, seed, offset), i the flat index in the
// padded (rows, nblocks * block) layout, as on the CPU (shared through shuffles where a batch's
// words are whole Philox blocks: mx_shares_words). Encoded codes are written whole bytes by
// the lanes that own them: 4-bit codes two per byte (the pair's codes OR-ed together with one
// shuffle, the even lane stores) when the block is even, 6-bit codes four per three bytes (a
// quad's 24 bits OR-ed with two shuffles, lanes 0..2 of the quad store one byte each) when it is
// a multiple of 4; else one per byte and the wrapper packs. No arrays: nothing in local memory.
#include "cpd/launch.h"
#include "cpd/numerics.h"

#define CPD_THREADS 256  // the most threads per block any launch of this file uses (__launch_bounds__)

namespace {

// The lanes of a group for blocks of `block` elements (cuda/cpu/launch.cpp mx_lanes says the same).
__device__ __forceinline__ int mx_lanes(long long block) {
  int g = 1;
  while (g < block && g < 32) g <<= 1;
  return g;
}

// Consecutive blocks a group works per step of its grid-stride loop: the first element of each is
// loaded before any is used, so that a warp has several coalesced loads in flight (one step
// waits on a load, a shuffle reduction and the rounding, in that order).
#define CPD_MX_BATCH 4  // cuda/cpu/launch.cpp kMxBatch (the grid it launches)
static_assert(CPD_MX_BATCH == 4, "mx_prefetch, mx_pick and the decode's prefetch hold 4 blocks");

// A thread's group: its lane in the group, the group's lanes as a shuffle mask, and the
// grid-stride walk over batches of blocks (row r, block blk of nb per row, row-major) without a
// 64-bit division per step.
struct MxGroup {
  int G;
  int lane;
  unsigned mask;
  long long r, blk;      // the first block of the group's batch
  long long nb, sq, sr;  // blocks per row; the grid's stride (in blocks) divided by nb: quotient, remainder
};

// Whether this thread belongs to a whole group (else it has nothing to do), and the group.
__device__ __forceinline__ bool mx_group(MxGroup& g, long long block, long long nb) {
  g.G = mx_lanes(block);
  const unsigned per = blockDim.x / (unsigned)g.G;  // whole groups of this thread block
  const unsigned gi = threadIdx.x / (unsigned)g.G;
  if (gi >= per) return false;
  g.lane = (int)(threadIdx.x & (unsigned)(g.G - 1));
  const unsigned wl = threadIdx.x & 31u;  // lane in the warp: the group lies in one warp (G divides 32)
  g.mask = g.G == 32 ? 0xffffffffu : ((1u << g.G) - 1u) << (wl & ~(unsigned)(g.G - 1));
  const long long k = cpd::first_item(blockIdx.x, per, gi) * CPD_MX_BATCH;
  const long long stride = cpd::grid_stride(per, gridDim.x) * CPD_MX_BATCH;
  g.nb = nb;
  g.r = k / nb;
  g.blk = k - g.r * nb;
  g.sq = stride / nb;
  g.sr = stride - g.sq * nb;
  return true;
}

// The group's next batch.
__device__ __forceinline__ void mx_next(MxGroup& g) {
  g.r += g.sq;
  g.blk += g.sr;
  if (g.blk >= g.nb) {
    g.blk -= g.nb;
    g.r += 1;
  }
}

// Block (r, blk) -> the next one in row-major order.
__device__ __forceinline__ void mx_step(long long& r, long long& blk, long long nb) {
  if (++blk == nb) {
    blk = 0;
    ++r;
  }
}

// Real elements of a block that starts at element j0 of its row (the rest is padding).
__device__ __forceinline__ long long mx_real(long long n, long long j0, long long block) {
  return n - j0 < block ? n - j0 : block;
}

// The lane's first element's bits of block (r, blk), +0 past the real elements or the rows.
__device__ __forceinline__ cpd::u32 mx_first(const float* __restrict__ x, long long r, long long blk, long long rows,
                                             long long n, long long block, const MxGroup& g) {
  const long long j0 = blk * block;
  return r < rows && g.lane < mx_real(n, j0, block) ? cpd::bits_of(x[r * n + j0 + g.lane]) : 0u;
}

// The batch's first elements: loaded together, picked by index with selects (no array).
__device__ __forceinline__ void mx_prefetch(cpd::u32& p0, cpd::u32& p1, cpd::u32& p2, cpd::u32& p3,
                                            const float* __restrict__ x, const MxGroup& g, long long rows,
                                            long long n, long long block) {
  long long r = g.r, blk = g.blk;
  p0 = mx_first(x, r, blk, rows, n, block, g);
  mx_step(r, blk, g.nb);
  p1 = mx_first(x, r, blk, rows, n, block, g);
  mx_step(r, blk, g.nb);
  p2 = mx_first(x, r, blk, rows, n, block, g);
  mx_step(r, blk, g.nb);
  p3 = mx_first(x, r, blk, rows, n, block, g);
}
__device__ __forceinline__ cpd::u32 mx_pick(int j, cpd::u32 p0, cpd::u32 p1, cpd::u32 p2, cpd::u32 p3) {
  return j == 0 ? p0 : j == 1 ? p1 : j == 2 ? p2 : p3;
}

// The largest of a over a group of W lanes: log2 W butterfly steps, unrolled.
template <int W>
__device__ __forceinline__ cpd::u32 mx_max_over(cpd::u32 a, unsigned mask) {
#pragma unroll
  for (int o = W >> 1; o > 0; o >>= 1) {
    const cpd::u32 v = __shfl_xor_sync(W == 32 ? 0xffffffffu : mask, a, o, W);
    a = v > a ? v : a;
  }
  return a;
}

// The group's largest magnitude bits (cpd/block.h: NaN > inf > finite as integers); the width
// is the same for the whole launch, so the switch does not diverge.
__device__ __forceinline__ cpd::u32 mx_group_max(cpd::u32 a, const MxGroup& g) {
  switch (g.G) {
    case 32: return mx_max_over<32>(a, g.mask);
    case 16: return mx_max_over<16>(a, g.mask);
    case 8: return mx_max_over<8>(a, g.mask);
    case 4: return mx_max_over<4>(a, g.mask);
    case 2: return mx_max_over<2>(a, g.mask);
    default: return a;
  }
}

// The OR of v over the aligned run of `span` lanes (2 or 4) holding it, in every lane of the run.
__device__ __forceinline__ cpd::u32 mx_group_or(cpd::u32 v, const MxGroup& g, int span) {
  for (int o = 1; o < span; o <<= 1) v |= __shfl_xor_sync(g.mask, v, o, g.G);
  return v;
}

struct MxBlock {
  cpd::u32 s;        // the scale's float32 bits (NaN: a NaN/inf block)
  float inv, d;      // 2^-e (power-of-two rules); fl(S * T)
  long long base;    // flat index of the block's first element in the padded layout
  long long m;       // real elements (the rest is padding)
};

// Block (r, blk) at xb, the lane's first element's bits u0 already loaded: every lane of the
// group gets the block's scale (from the group's amax).
__device__ __forceinline__ MxBlock mx_block(const float* __restrict__ xb, const MxGroup& g, long long r,
                                            long long blk, long long n, long long block, const cpd::BlockSpec& b,
                                            cpd::u32 u0) {
  MxBlock k;
  const long long j0 = blk * block;
  k.m = mx_real(n, j0, block);
  k.base = r * g.nb * block + j0;
  cpd::u32 amax = u0 & ~cpd::SIGN;
  for (long long i = g.lane + g.G; i < k.m; i += g.G) {  // blocks of more than 32 elements
    const cpd::u32 a = cpd::bits_of(xb[i]) & ~cpd::SIGN;
    amax = a > amax ? a : amax;
  }
  amax = mx_group_max(amax, g);
  k.s = cpd::block_scale_bits(amax, b);
  k.inv = k.s > cpd::INF_BITS ? 1.0f : cpd::block_inverse(k.s);
  k.d = cpd::block_divisor(k.s, b);
  return k;
}

// Element i's bits: u0 for the lane's first element (already loaded), else a load.
__device__ __forceinline__ cpd::u32 mx_load(const float* __restrict__ xb, long long i, const MxGroup& g,
                                            cpd::u32 u0) {
  return i == g.lane ? u0 : cpd::bits_of(xb[i]);
}

// Element i's random word: word (i & 3) of Philox block i >> 2 (cpd::random_word's), picked
// with selects rather than an index into the 4 words (which would put them in local memory).
__device__ __forceinline__ cpd::u32 mx_word(cpd::u64 i, unsigned long long seed, unsigned long long offset) {
  const cpd::u64 g = i >> 2;
  const cpd::U32x4 w = cpd::philox4x32_10((cpd::u32)g, (cpd::u32)(g >> 32), (cpd::u32)offset,
                                          (cpd::u32)(offset >> 32), (cpd::u32)seed, (cpd::u32)(seed >> 32));
  const cpd::u32 j = (cpd::u32)(i & 3u);
  return j == 0u ? w.v[0] : j == 1u ? w.v[1] : j == 2u ? w.v[2] : w.v[3];
}

// Stochastic rounding with blocks of G = 4, 8, 16 or 32 elements (MX's 32, NVFP4's 16): a batch's
// 4G elements are consecutive in the padded layout and start at a multiple of 4, so its words are
// the 4 words of G Philox blocks. Lane l computes block l of them once per batch (mx_batch_words),
// and the element of lane i in the batch's block j takes word i & 3 of block j * G / 4 + i / 4
// through 4 shuffles (mx_shared_word): one Philox block per lane and batch instead of one per
// element, the same words.
__device__ __forceinline__ bool mx_shares_words(int mode, long long block, const MxGroup& g) {
  return mode == cpd::STOCHASTIC && block == g.G && block >= 4;
}
__device__ __forceinline__ cpd::U32x4 mx_batch_words(const MxGroup& g, long long block, unsigned long long seed,
                                                     unsigned long long offset) {
  const cpd::u64 p = (cpd::u64)((g.r * g.nb + g.blk) * block) / 4u + (cpd::u64)g.lane;
  return cpd::philox4x32_10((cpd::u32)p, (cpd::u32)(p >> 32), (cpd::u32)offset, (cpd::u32)(offset >> 32),
                            (cpd::u32)seed, (cpd::u32)(seed >> 32));
}
__device__ __forceinline__ cpd::u32 mx_shared_word(const cpd::U32x4& w, int j, const MxGroup& g) {
  const int src = j * (g.G >> 2) + (g.lane >> 2);
  const cpd::u32 w0 = __shfl_sync(g.mask, w.v[0], src, g.G), w1 = __shfl_sync(g.mask, w.v[1], src, g.G);
  const cpd::u32 w2 = __shfl_sync(g.mask, w.v[2], src, g.G), w3 = __shfl_sync(g.mask, w.v[3], src, g.G);
  const int k = g.lane & 3;
  return k == 0 ? w0 : k == 1 ? w1 : k == 2 ? w2 : w3;
}

// Element i's P (float32 bits) from its bits u; +0 for padding (i >= m) and in a NaN block.
// shared: the element's random word is `word` (mx_shared_word), else it is drawn here.
__device__ __forceinline__ cpd::u32 mx_elem(cpd::u32 u, long long i, const MxBlock& k, const cpd::BlockSpec& b,
                                            int mode, unsigned long long seed, unsigned long long offset, bool shared,
                                            cpd::u32 word) {
  if (i >= k.m || k.s > cpd::INF_BITS) return 0u;
  const cpd::u32 w = mode != cpd::STOCHASTIC ? 0u : shared ? word : mx_word((cpd::u64)(k.base + i), seed, offset);
  if (b.rule != cpd::RULE_AMAX)
    return b.el.fast ? cpd::block_elem_pow2<true>(u, k.inv, b, mode, w, 32)
                     : cpd::block_elem_pow2<false>(u, k.inv, b, mode, w, 32);
  return b.el.fast ? cpd::block_elem_amax<true>(u, k.d, b, mode, w, 32)
                   : cpd::block_elem_amax<false>(u, k.d, b, mode, w, 32);
}

// Element j's code in a row of codes packed `pack` (4, 6, or 0: one per byte).
__device__ __forceinline__ cpd::u32 mx_code(const unsigned char* __restrict__ row, long long j, int pack) {
  if (pack == 4) return (row[j >> 1] >> (4 * (j & 1))) & 15u;
  if (pack == 6) {
    const long long q = 3 * (j >> 2);
    return ((row[q] | (row[q + 1] << 8) | ((cpd::u32)row[q + 2] << 16)) >> (6 * (j & 3))) & 63u;
  }
  return row[j];
}

// Block (r, blk)'s scale code and the lane's first element's code (0 past the real elements or
// the rows).
__device__ __forceinline__ void mx_code_first(cpd::u32& sc, cpd::u32& c, const unsigned char* __restrict__ codes,
                                              const unsigned char* __restrict__ scodes, long long r, long long blk,
                                              long long rows, long long n, long long block, long long nb, int pack,
                                              long long row_bytes, const MxGroup& g) {
  const long long j0 = blk * block;
  sc = r < rows ? scodes[r * nb + blk] : 0u;
  c = r < rows && g.lane < mx_real(n, j0, block) ? mx_code(codes + r * row_bytes, j0 + g.lane, pack) : 0u;
}

// The walk of the quantizing kernels (cpd_mx_cast, cpd_mx_encode): the group's batches of
// CPD_MX_BATCH consecutive blocks, their first elements loaded together and, where the words are
// shared, the batch's Philox words drawn once; body(r, blk, xb, q, u0, word) for each block, with
// q its scale (mx_block), u0 the lane's first element and word its shared word (0 when not shared).
template <class Body>
__device__ __forceinline__ void mx_quantize_blocks(const float* __restrict__ x, MxGroup& g, long long rows,
                                                   long long n, long long block, long long nb,
                                                   const cpd::BlockSpec& b, bool shared, unsigned long long seed,
                                                   unsigned long long offset, const Body& body) {
  for (; g.r < rows; mx_next(g)) {
    cpd::u32 p0, p1, p2, p3;
    mx_prefetch(p0, p1, p2, p3, x, g, rows, n, block);
    const cpd::U32x4 words = shared ? mx_batch_words(g, block, seed, offset) : cpd::U32x4{{0u, 0u, 0u, 0u}};
    long long r = g.r, blk = g.blk;
#pragma unroll 1
    for (int j = 0; j < CPD_MX_BATCH && r < rows; ++j, mx_step(r, blk, nb)) {
      const float* xb = x + r * n + blk * block;
      const cpd::u32 u0 = mx_pick(j, p0, p1, p2, p3);
      const cpd::u32 word = shared ? mx_shared_word(words, j, g) : 0u;
      body(r, blk, xb, mx_block(xb, g, r, blk, n, block, b, u0), u0, word);
    }
  }
}

}  // namespace

#define CPD_MX_SPEC                                                                                                  \
  const cpd::BlockSpec b = cpd::make_block_spec(e_exp, e_man, e_bias, e_specials, e_sub, s_exp, s_man, s_bias,      \
                                                s_specials, s_sub, rule, is_int, t);                               \
  const long long nb = (n + block - 1) / block;                                                                      \
  MxGroup g;                                                                                                         \
  if (!mx_group(g, block, nb)) return

#define CPD_MX_FORMAT_PARAMS                                                                                         \
  int e_exp, int e_man, int e_bias, int e_specials, int e_sub, int s_exp, int s_man, int s_bias, int s_specials,     \
      int s_sub, int rule, int is_int, float t

extern "C" __global__ void __launch_bounds__(CPD_THREADS, 2)
    cpd_mx_cast(const float* __restrict__ x, float* __restrict__ y, long long rows, long long n, long long block,
                CPD_MX_FORMAT_PARAMS, int mode, unsigned long long seed, unsigned long long offset) {
  CPD_MX_SPEC;
  const bool shared = mx_shares_words(mode, block, g);
  const auto one_block = [&](long long r, long long blk, const float* xb, const MxBlock& q, cpd::u32 u0,
                             cpd::u32 word) {
    float* yb = y + r * n + blk * block;
    for (long long i = g.lane; i < q.m; i += g.G)
      yb[i] = q.s > cpd::INF_BITS ? cpd::float_of(cpd::QNAN_BITS)
                                  : cpd::fmul(cpd::float_of(mx_elem(mx_load(xb, i, g, u0), i, q, b, mode, seed,
                                                                    offset, shared, word)),
                                              q.d);
  };
  mx_quantize_blocks(x, g, rows, n, block, nb, b, shared, seed, offset, one_block);
}

// codes: rows of row_bytes bytes; pack 4 (block even), 6 (block a multiple of 4) or 0 (one
// code per byte): every code of the padded block is written (padding codes are +0's).
extern "C" __global__ void __launch_bounds__(CPD_THREADS, 2)
    cpd_mx_encode(const float* __restrict__ x, unsigned char* __restrict__ codes, unsigned char* __restrict__ scodes,
                  long long rows, long long n, long long block, CPD_MX_FORMAT_PARAMS, int mode,
                  unsigned long long seed, unsigned long long offset, int pack, long long row_bytes) {
  CPD_MX_SPEC;
  const bool shared = mx_shares_words(mode, block, g);
  const auto one_block = [&](long long r, long long blk, const float* xb, const MxBlock& q, cpd::u32 u0,
                             cpd::u32 word) {
    const long long j0 = blk * block;
    unsigned char* row = codes + r * row_bytes;
    if (g.lane == 0) scodes[r * nb + blk] = (unsigned char)cpd::encode_value_bits(q.s, b.sc);
    // The whole group walks the padded block together (the shuffles need every lane of the mask).
    for (long long i0 = 0; i0 < block; i0 += g.G) {
      const long long i = i0 + g.lane;
      const bool mine = i < block;
      const cpd::u32 u = i < q.m ? mx_load(xb, i, g, u0) : 0u;
      const cpd::u32 e = mx_elem(u, i, q, b, mode, seed, offset, shared, word);  // +0 past the block
      const cpd::u32 c = mine ? cpd::block_elem_code<false>(e, b) : 0u;
      if (pack == 4) {  // G >= 2: a pair's lanes are l, l ^ 1, elements i, i ^ 1
        const cpd::u32 w = mx_group_or(c << (4 * (int)(i & 1)), g, 2);
        if (mine && (i & 1) == 0) row[(j0 + i) >> 1] = (unsigned char)w;
      } else if (pack == 6) {  // G >= 4: a quad's lanes hold elements 4q .. 4q + 3
        const int p = (int)(i & 3);
        const cpd::u32 w = mx_group_or(c << (6 * p), g, 4);
        if (mine && p < 3) row[(j0 + i - p) / 4 * 3 + p] = (unsigned char)(w >> (8 * p));
      } else if (mine) {
        row[j0 + i] = (unsigned char)c;
      }
    }
  };
  mx_quantize_blocks(x, g, rows, n, block, nb, b, shared, seed, offset, one_block);
}

extern "C" __global__ void __launch_bounds__(CPD_THREADS, 2)
    cpd_mx_decode(const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scodes,
                  float* __restrict__ y, long long rows, long long n, long long block, CPD_MX_FORMAT_PARAMS, int pack,
                  long long row_bytes) {
  CPD_MX_SPEC;
  for (; g.r < rows; mx_next(g)) {
    // The batch's scale codes and the lane's first codes, loaded before any is used.
    cpd::u32 s0, s1, s2, s3, c0, c1, c2, c3;
    {
      long long r = g.r, blk = g.blk;
      mx_code_first(s0, c0, codes, scodes, r, blk, rows, n, block, nb, pack, row_bytes, g);
      mx_step(r, blk, nb);
      mx_code_first(s1, c1, codes, scodes, r, blk, rows, n, block, nb, pack, row_bytes, g);
      mx_step(r, blk, nb);
      mx_code_first(s2, c2, codes, scodes, r, blk, rows, n, block, nb, pack, row_bytes, g);
      mx_step(r, blk, nb);
      mx_code_first(s3, c3, codes, scodes, r, blk, rows, n, block, nb, pack, row_bytes, g);
    }
    long long r = g.r, blk = g.blk;
#pragma unroll 1
    for (int j = 0; j < CPD_MX_BATCH && r < rows; ++j, mx_step(r, blk, nb)) {
      const long long j0 = blk * block, m = mx_real(n, j0, block);
      const float d = cpd::block_divisor(cpd::decode_bits(mx_pick(j, s0, s1, s2, s3), b.sc), b);
      const unsigned char* row = codes + r * row_bytes;
      float* yb = y + r * n + j0;
      for (long long i = g.lane; i < m; i += g.G) {
        const cpd::u32 c = i == g.lane ? mx_pick(j, c0, c1, c2, c3) : mx_code(row, j0 + i, pack);
        yb[i] = cpd::fmul(cpd::float_of(cpd::block_elem_value(c, b)), d);
      }
    }
  }
}
