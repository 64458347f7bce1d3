// CUDA kernels of cpd.mx (block-scaled formats): cast (fake-quantize), encode, decode.
// Compiled at run time by NVRTC (cpd/_cuda.py); on machines without a GPU the same text runs as
// host C++ through the shim (cuda/shim/cpd_shim.h, cpd/_shim.py) in the tests, which check it
// against the CPU kernels (cuda/cpu/mx.cpp) bit for bit.
//
// Launches (cpd/_mx_engine.py builds the cpd/_kernels.py Launch): x is (rows, n), the block axis
// last, contiguous; one GPU thread per block of `block` elements, grid-stride over the
// rows * nblocks blocks with 64-bit indices (cpd/launch.h). Every value is the numerics core's
// (cpd/block.h): the scale from the block's amax, each element rounded once (the exact product
// for power-of-two scales, cpd::block_elem_pow2), stochastic rounding with element i's word
// random_word(i, seed, offset), i the flat index in the padded (rows, nblocks * block) layout,
// as on the CPU. Codes are written whole bytes per block (4-bit codes two per byte when the
// block is even, 6-bit four per three bytes when it is a multiple of 4; else one per byte and
// the wrapper packs). No arrays: nothing in local memory.
#include "cpd/launch.h"
#include "cpd/numerics.h"

#define CPD_THREADS 256  // the most threads per block any launch of this file uses (__launch_bounds__)

namespace {

struct MxBlock {
  cpd::u32 s;        // the scale's float32 bits (NaN: a NaN/inf block)
  float inv, d;      // 2^-e (power-of-two rules); fl(S * T)
  long long base;    // flat index of the block's first element in the padded layout
  long long m;       // real elements (the rest is padding)
};

__device__ __forceinline__ MxBlock mx_block(const float* __restrict__ x, long long r, long long blk, long long n,
                                            long long block, const cpd::BlockSpec& b) {
  MxBlock k;
  const long long j0 = blk * block;
  k.m = n - j0 < block ? n - j0 : block;
  k.base = r * ((n + block - 1) / block) * block + j0;
  const float* xb = x + r * n + j0;
  cpd::u32 amax = 0u;
  for (long long i = 0; i < k.m; ++i) {
    const cpd::u32 a = cpd::bits_of(xb[i]) & ~cpd::SIGN;
    amax = a > amax ? a : amax;
  }
  k.s = cpd::block_scale_bits(amax, b);
  k.inv = k.s > cpd::INF_BITS ? 1.0f : cpd::block_inverse(k.s);
  k.d = cpd::block_divisor(k.s, b);
  return k;
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

// Element i's P (float32 bits); +0 for padding and in a NaN block.
__device__ __forceinline__ cpd::u32 mx_elem(const float* __restrict__ xb, long long i, const MxBlock& k,
                                            const cpd::BlockSpec& b, int mode, unsigned long long seed,
                                            unsigned long long offset) {
  if (i >= k.m || k.s > cpd::INF_BITS) return 0u;
  const cpd::u32 u = cpd::bits_of(xb[i]);
  const cpd::u32 w = mode == cpd::STOCHASTIC ? mx_word((cpd::u64)(k.base + i), seed, offset) : 0u;
  if (b.rule != cpd::RULE_AMAX) return cpd::block_elem_pow2(u, k.inv, b, mode, w, 32);
  return b.el.fast ? cpd::block_elem_amax<true>(u, k.d, b, mode, w, 32)
                   : cpd::block_elem_amax<false>(u, k.d, b, mode, w, 32);
}

}  // namespace

#define CPD_MX_SPEC                                                                                                  \
  const cpd::BlockSpec b = cpd::make_block_spec(e_exp, e_man, e_bias, e_specials, e_sub, s_exp, s_man, s_bias,      \
                                                s_specials, s_sub, rule, is_int, t);                               \
  const long long nb = (n + block - 1) / block;                                                                      \
  const long long stride = cpd::grid_stride(blockDim.x, gridDim.x)

#define CPD_MX_FORMAT_PARAMS                                                                                         \
  int e_exp, int e_man, int e_bias, int e_specials, int e_sub, int s_exp, int s_man, int s_bias, int s_specials,     \
      int s_sub, int rule, int is_int, float t

extern "C" __global__ void __launch_bounds__(CPD_THREADS)
    cpd_mx_cast(const float* __restrict__ x, float* __restrict__ y, long long rows, long long n, long long block,
                CPD_MX_FORMAT_PARAMS, int mode, unsigned long long seed, unsigned long long offset) {
  CPD_MX_SPEC;
  for (long long k = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); k < rows * nb; k += stride) {
    const long long r = k / nb, blk = k % nb;
    const MxBlock q = mx_block(x, r, blk, n, block, b);
    const float* xb = x + r * n + blk * block;
    float* yb = y + r * n + blk * block;
    for (long long i = 0; i < q.m; ++i)
      yb[i] = q.s > cpd::INF_BITS ? cpd::float_of(cpd::QNAN_BITS)
                                  : cpd::fmul(cpd::float_of(mx_elem(xb, i, q, b, mode, seed, offset)), q.d);
  }
}

extern "C" __global__ void __launch_bounds__(CPD_THREADS)
    cpd_mx_encode(const float* __restrict__ x, unsigned char* __restrict__ codes, unsigned char* __restrict__ scodes,
                  long long rows, long long n, long long block, CPD_MX_FORMAT_PARAMS, int mode,
                  unsigned long long seed, unsigned long long offset, int pack, long long row_bytes) {
  CPD_MX_SPEC;
  for (long long k = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); k < rows * nb; k += stride) {
    const long long r = k / nb, blk = k % nb, j0 = blk * block;
    const MxBlock q = mx_block(x, r, blk, n, block, b);
    const float* xb = x + r * n + j0;
    scodes[k] = (unsigned char)cpd::encode_value_bits(q.s, b.sc);
#define CPD_MX_CODE(i) cpd::block_elem_code<false>(mx_elem(xb, (i), q, b, mode, seed, offset), b)
    if (pack == 4) {
      unsigned char* dst = codes + r * row_bytes + j0 / 2;
      for (long long i = 0; i < block / 2; ++i) {
        cpd::u32 w = 0u;
#pragma unroll 1
        for (int j = 0; j < 2; ++j) w |= CPD_MX_CODE(2 * i + j) << (4 * j);
        dst[i] = (unsigned char)w;
      }
    } else if (pack == 6) {
      unsigned char* dst = codes + r * row_bytes + j0 / 4 * 3;
      for (long long i = 0; i < block / 4; ++i) {
        cpd::u32 w = 0u;
#pragma unroll 1
        for (int j = 0; j < 4; ++j) w |= CPD_MX_CODE(4 * i + j) << (6 * j);
        dst[3 * i] = (unsigned char)w;
        dst[3 * i + 1] = (unsigned char)(w >> 8);
        dst[3 * i + 2] = (unsigned char)(w >> 16);
      }
    } else {
      unsigned char* dst = codes + r * row_bytes + j0;
      for (long long i = 0; i < block; ++i) dst[i] = (unsigned char)CPD_MX_CODE(i);
    }
#undef CPD_MX_CODE
  }
}

extern "C" __global__ void __launch_bounds__(CPD_THREADS)
    cpd_mx_decode(const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scodes,
                  float* __restrict__ y, long long rows, long long n, long long block, CPD_MX_FORMAT_PARAMS, int pack,
                  long long row_bytes) {
  CPD_MX_SPEC;
  for (long long k = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); k < rows * nb; k += stride) {
    const long long r = k / nb, j0 = (k % nb) * block, m = n - j0 < block ? n - j0 : block;
    const float d = cpd::block_divisor(cpd::decode_bits(scodes[k], b.sc), b);
    const unsigned char* row = codes + r * row_bytes;
    float* yb = y + r * n + j0;
    for (long long i = 0; i < m; ++i) {
      const long long j = j0 + i;
      cpd::u32 c;
      if (pack == 4) {
        c = (row[j >> 1] >> (4 * (j & 1))) & 15u;
      } else if (pack == 6) {
        const long long g = 3 * (j >> 2);
        c = ((row[g] | (row[g + 1] << 8) | ((cpd::u32)row[g + 2] << 16)) >> (6 * (j & 3))) & 63u;
      } else {
        c = row[j];
      }
      yb[i] = cpd::fmul(cpd::float_of(cpd::block_elem_value(c, b)), d);
    }
  }
}
