// CUDA kernels over the numerics core: cast, encode, decode, element-wise arithmetic.
// Compiled at run time by NVRTC (cpd/_cuda.py), which passes the headers under
// cuda/include/cpd/ in memory; no system headers. On machines without a GPU the same text is
// compiled as host C++ by the shim (cuda/shim/cpd_shim.h, cpd/_shim.py) and run by the tests.
//
// Launches (cpd/_kernels.py builds every parameter array): a 1-D grid of at most 256 threads per
// block, grid-stride loops with 64-bit indices (cpd/launch.h), any grid size. Element i's random
// word is word (i & 3) of Philox block i >> 2 keyed by (seed, offset), exactly as on the CPU, so
// CPU and GPU results are bit-identical. The (seed, offset) pair is passed by value: no device
// copy and no host synchronisation per launch.
//
// Casts: one kernel per rounding mode (cpd_cast_<mode>), the mode a compile-time constant and
// the fast path chosen once per launch, so the hot loop carries no mode branches. Each thread
// takes groups of 4 consecutive elements: one float4 load and store when both pointers are
// 16-byte aligned (else 4 scalar ones; the last group may be partial), and, for stochastic
// rounding, one Philox block for the 4 elements (the 4 words the 4 elements use anyway).
#include "cpd/launch.h"
#include "cpd/numerics.h"

#define CPD_THREADS 256  // the most threads per block any launch of this file uses (__launch_bounds__)

namespace {

template <int MODE, bool FAST>
__device__ __forceinline__ float cast1(float v, const cpd::Format& f, cpd::u32 r, int sr_bits) {
  const cpd::u32 u = cpd::bits_of(v);
  return cpd::float_of(FAST ? cpd::cast_bits_fast(u, f, MODE, r, sr_bits)
                            : cpd::cast_bits_generic(u, f, MODE, r, sr_bits));
}

// x and y may be the same array (cast(x, out=x)): each group is read whole before it is written,
// and no __restrict__ promises otherwise.
template <int MODE, bool FAST>
__device__ __forceinline__ void cast_groups(const float* x, float* y, long long n, const cpd::Format& f, int sr_bits,
                                            unsigned long long seed, unsigned long long offset) {
  const long long groups = cpd::items_of(n, 4);
  const long long stride = cpd::grid_stride(blockDim.x, gridDim.x);
  const bool vec = (((unsigned long long)x | (unsigned long long)y) & 15ull) == 0ull;
  for (long long g = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); g < groups; g += stride) {
    cpd::U32x4 w = {{0u, 0u, 0u, 0u}};
    if (MODE == cpd::STOCHASTIC)
      w = cpd::philox4x32_10((cpd::u32)g, (cpd::u32)((unsigned long long)g >> 32), (cpd::u32)offset,
                             (cpd::u32)(offset >> 32), (cpd::u32)seed, (cpd::u32)(seed >> 32));
    const long long e = 4 * g;
    if (vec && e + 4 <= n) {
      float4 v = reinterpret_cast<const float4*>(x)[g];
      v.x = cast1<MODE, FAST>(v.x, f, w.v[0], sr_bits);
      v.y = cast1<MODE, FAST>(v.y, f, w.v[1], sr_bits);
      v.z = cast1<MODE, FAST>(v.z, f, w.v[2], sr_bits);
      v.w = cast1<MODE, FAST>(v.w, f, w.v[3], sr_bits);
      reinterpret_cast<float4*>(y)[g] = v;
    } else {  // misaligned pointers or the last, partial group: element by element (each read before its write)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (e + j < n) y[e + j] = cast1<MODE, FAST>(x[e + j], f, w.v[j], sr_bits);
    }
  }
}

}  // namespace

#define CPD_CAST_KERNEL(NAME, MODE)                                                                             \
  extern "C" __global__ void __launch_bounds__(CPD_THREADS)                                                    \
      cpd_cast_##NAME(const float* x, float* y, long long n, int exp, int man, int bias, int specials,        \
                      int subnormals, int saturate, int sr_bits, unsigned long long seed,                      \
                      unsigned long long offset) {                                                             \
    const cpd::Format f = cpd::make_format(exp, man, bias, specials, subnormals, saturate);                    \
    if (f.fast)                                                                                                \
      cast_groups<MODE, true>(x, y, n, f, sr_bits, seed, offset);                                              \
    else                                                                                                       \
      cast_groups<MODE, false>(x, y, n, f, sr_bits, seed, offset);                                             \
  }

CPD_CAST_KERNEL(nearest, cpd::NEAREST)
CPD_CAST_KERNEL(stochastic, cpd::STOCHASTIC)
CPD_CAST_KERNEL(toward_zero, cpd::TOWARD_ZERO)
CPD_CAST_KERNEL(up, cpd::UP)
CPD_CAST_KERNEL(down, cpd::DOWN)
CPD_CAST_KERNEL(nearest_away, cpd::NEAREST_AWAY)
CPD_CAST_KERNEL(odd, cpd::ODD)

namespace {

template <typename Code>
__device__ __forceinline__ void encode_impl(const float* __restrict__ x, Code* __restrict__ c, long long n,
                                            const cpd::Format& f, int mode) {
  const long long stride = cpd::grid_stride(blockDim.x, gridDim.x);
  for (long long i = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); i < n; i += stride) {
    const cpd::u32 v = cpd::cast_bits(cpd::bits_of(x[i]), f, mode, 0u, 32);
    c[i] = (Code)cpd::encode_value_bits(v, f);
  }
}

template <typename Code, typename UCode>
__device__ __forceinline__ void decode_impl(const Code* __restrict__ c, float* __restrict__ y, long long n,
                                            const cpd::Format& f) {
  const long long stride = cpd::grid_stride(blockDim.x, gridDim.x);
  for (long long i = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); i < n; i += stride)
    y[i] = cpd::float_of(cpd::decode_bits((cpd::u32)(UCode)c[i], f));
}

}  // namespace

#define CPD_CODE_KERNELS(SUFFIX, CODE, UCODE)                                                                    \
  extern "C" __global__ void __launch_bounds__(CPD_THREADS)                                                     \
      cpd_encode_##SUFFIX(const float* __restrict__ x, CODE* __restrict__ c, long long n, int exp, int man,    \
                          int bias, int specials, int subnormals, int mode, int saturate) {                    \
    encode_impl<CODE>(x, c, n, cpd::make_format(exp, man, bias, specials, subnormals, saturate), mode);        \
  }                                                                                                             \
  extern "C" __global__ void __launch_bounds__(CPD_THREADS)                                                     \
      cpd_decode_##SUFFIX(const CODE* __restrict__ c, float* __restrict__ y, long long n, int exp, int man,    \
                          int bias, int specials, int subnormals) {                                             \
    decode_impl<CODE, UCODE>(c, y, n, cpd::make_format(exp, man, bias, specials, subnormals, 0));               \
  }

CPD_CODE_KERNELS(u8, unsigned char, unsigned char)
CPD_CODE_KERNELS(i16, short, unsigned short)
CPD_CODE_KERNELS(i32, int, unsigned int)

// out = round(a * b) (op 0), round(a + b) (op 1) or round(c + a * b) (op 2), as arith_out on the CPU;
// element i's random word is random_word(i, seed, offset).
extern "C" __global__ void __launch_bounds__(CPD_THREADS)
    cpd_arith(int op, const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
              float* __restrict__ y, long long n, int exp, int man, int bias, int specials, int subnormals, int mode,
              int saturate, int sr_bits, unsigned long long seed, unsigned long long offset) {
  const cpd::Format f = cpd::make_format(exp, man, bias, specials, subnormals, saturate);
  const long long stride = cpd::grid_stride(blockDim.x, gridDim.x);
  for (long long i = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); i < n; i += stride) {
    const cpd::u32 r = mode == cpd::STOCHASTIC ? cpd::random_word((unsigned long long)i, seed, offset) : 0u;
    const cpd::u32 ua = cpd::bits_of(a[i]), ub = cpd::bits_of(b[i]);
    cpd::u32 v;
    if (op == 0) v = cpd::mul_bits(ua, ub, f, mode, r, sr_bits);
    else if (op == 1) v = cpd::add_bits(ua, ub, f, mode, r, sr_bits);
    else v = cpd::fma_bits(cpd::bits_of(c[i]), ua, ub, f, mode, r, sr_bits);
    y[i] = cpd::float_of(v);
  }
}

// The emulated allreduce of the rows of x (w, n) (cpd/collectives.py reduce_matrix: ring,
// sequential and hierarchical orders), one element per thread with every rounded add of that
// element in registers: each input is read once and the sum written once, where the op-by-op
// path reads and writes every partial sum once per hop. The orders, the adds (cpd::add_bits, as
// cpd_arith) and the random words are those of the op-by-op path, so the bits are too:
//
// * the inputs are first rounded to f unless cast_inputs is 0 (word w * n + e of seed pair 0,
//   as cpd.cast of the (w, n) matrix);
// * group g of the k consecutive rows g k .. g k + k - 1 is summed in row order (stage 1; the
//   words of element (g, e) of a (w / k, n) add, g n + e, one seed pair per add in draw order);
// * the w / k group sums go round the ring (stage 2): element e's chunk c (numpy.array_split of n
//   into w / k chunks) starts from group c's sum and adds groups c + 1, c + 2, ... (mod w / k),
//   one add per hop (word e).
// With kahan each merge is Kahan's (cpd.primitives.Accumulator.merge: y = x - c, t = s + y,
// c = (t - s) - y, s = t, four adds, preceded by c = c + cx when leader_comp passes the incoming
// group's compensation, as the hierarchical order does). seeds holds the (seed, offset) pairs
// of every add in the order the op-by-op path draws them (cast, stage 1, stage 2); it is read
// only in stochastic mode. The ring is k = 1, the sequential sum k = w.
namespace {

struct Reducer {
  cpd::Format f;
  int mode, sr_bits, kahan;
  const unsigned long long* seeds;

  // round(a + b) with seed pair i's word `word` (stochastic mode)
  __device__ __forceinline__ cpd::u32 add(cpd::u32 a, cpd::u32 b, int i, unsigned long long word) const {
    const cpd::u32 r = mode == cpd::STOCHASTIC ? cpd::random_word(word, seeds[2 * i], seeds[2 * i + 1]) : 0u;
    return cpd::add_bits(a, b, f, mode, r, sr_bits);
  }
  // (sum, c) += (v, cv), cv only with has_cv; i: the seed pair of the merge's first add.
  __device__ __forceinline__ void merge(cpd::u32& sum, cpd::u32& c, cpd::u32 v, cpd::u32 cv, bool has_cv, int i,
                                        unsigned long long word) const {
    if (!kahan) {
      sum = add(sum, v, i, word);
      return;
    }
    if (has_cv) c = add(c, cv, i++, word);
    const cpd::u32 y = add(v, c ^ cpd::SIGN, i, word);
    const cpd::u32 t = add(sum, y, i + 1, word);
    c = add(add(t, sum ^ cpd::SIGN, i + 2, word), y ^ cpd::SIGN, i + 3, word);
    sum = t;
  }
};

}  // namespace

extern "C" __global__ void __launch_bounds__(CPD_THREADS)
    cpd_reduce_rows(const float* __restrict__ x, float* __restrict__ y, long long n, int w, int k, int kahan,
                    int leader_comp, int cast_inputs, int exp, int man, int bias, int specials, int subnormals,
                    int mode, int saturate, int sr_bits, const unsigned long long* __restrict__ seeds) {
  const Reducer red = {cpd::make_format(exp, man, bias, specials, subnormals, saturate), mode, sr_bits, kahan, seeds};
  const int p = w / k;                                    // groups (ring participants)
  const int adds1 = kahan ? 4 : 1, adds2 = kahan ? (leader_comp ? 5 : 4) : 1;
  const int base1 = cast_inputs ? 1 : 0, base2 = base1 + (k - 1) * adds1;  // first seed pair of each stage
  const long long q = n / p, r = n % p, long_part = r * (q + 1);
  const long long stride = cpd::grid_stride(blockDim.x, gridDim.x);
  for (long long e = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); e < n; e += stride) {
    const int chunk = (int)(e < long_part ? e / (q + 1) : r + (e - long_part) / q);
    cpd::u32 sum = 0u, c = 0u;
    for (int h = 0; h < p; ++h) {
      const int g = chunk + h < p ? chunk + h : chunk + h - p;
      cpd::u32 gs = 0u, gc = 0u;  // group g's sum and compensation (stage 1)
      for (int j = 0; j < k; ++j) {
        const long long i = (long long)(g * k + j) * n + e;
        cpd::u32 v = cpd::bits_of(x[i]);
        if (cast_inputs) {
          const cpd::u32 rw = mode == cpd::STOCHASTIC ? cpd::random_word((unsigned long long)i, seeds[0], seeds[1]) : 0u;
          v = cpd::cast_bits(v, red.f, mode, rw, sr_bits);
        }
        if (j == 0) gs = v;
        else red.merge(gs, gc, v, 0u, false, base1 + (j - 1) * adds1, (unsigned long long)g * n + e);
      }
      if (h == 0) {
        sum = gs;
        c = gc;
      } else {
        red.merge(sum, c, gs, gc, leader_comp != 0, base2 + (h - 1) * adds2, (unsigned long long)e);
      }
    }
    y[e] = cpd::float_of(sum);
  }
}

// The tree order of the same allreduce (reduce_matrix's recursive halving to row 0: at level l,
// step = 2^l, row i = 0, 2 step, 4 step, ... < w - step merges row i + step into itself), one
// element per thread as cpd_reduce_rows. The thread walks the rows in order and keeps the nodes
// still waiting for their right neighbour on a stack, one per level (a binary counter: after row
// j, the stack holds the complete nodes at the levels of j + 1's set bits); a node of 2^l rows
// meets its neighbour of 2^l rows as level l's merge, and at the end the partial nodes of the
// last rows merge into their left neighbours, smallest first, as the tree's last levels do. The
// merge of receiver i at level l uses seed pair base + l * adds and word (i >> (l + 1)) n + e, its
// index in level l's (receivers, n) add: the same adds, operands and words as the level-by-level
// path, so the same bits. Every merge carries the sender's compensation (kahan: five adds). The
// stack lives in shared memory, a column per thread (no local memory, no bank conflicts), so w
// is at most 2^CPD_TREE_LEVELS (cpd/_fused_reduce.py plan).
#define CPD_TREE_LEVELS 15
extern "C" __global__ void __launch_bounds__(CPD_THREADS)
    cpd_reduce_tree(const float* __restrict__ x, float* __restrict__ y, long long n, int w, int kahan, int cast_inputs,
                    int exp, int man, int bias, int specials, int subnormals, int mode, int saturate, int sr_bits,
                    const unsigned long long* __restrict__ seeds) {
  __shared__ cpd::u32 stack_s[CPD_TREE_LEVELS][CPD_THREADS], stack_c[CPD_TREE_LEVELS][CPD_THREADS];
  const Reducer red = {cpd::make_format(exp, man, bias, specials, subnormals, saturate), mode, sr_bits, kahan, seeds};
  const int adds = kahan ? 5 : 1, base = cast_inputs ? 1 : 0;
  const int t = threadIdx.x;
  const long long stride = cpd::grid_stride(blockDim.x, gridDim.x);
  for (long long e = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); e < n; e += stride) {
    cpd::u32 s = 0u, c = 0u;  // the node being carried up
    for (int j = 0; j < w; ++j) {
      const long long i = (long long)j * n + e;
      s = cpd::bits_of(x[i]);
      c = 0u;
      if (cast_inputs) {
        const cpd::u32 rw = mode == cpd::STOCHASTIC ? cpd::random_word((unsigned long long)i, seeds[0], seeds[1]) : 0u;
        s = cpd::cast_bits(s, red.f, mode, rw, sr_bits);
      }
      int l = 0;
      for (; (j >> l) & 1; ++l) {  // the left neighbour of 2^l rows waits at level l: level l's merge
        cpd::u32 ls = stack_s[l][t], lc = stack_c[l][t];
        const long long recv = (long long)(j + 1) - (2ll << l);
        red.merge(ls, lc, s, c, true, base + l * adds, (unsigned long long)(recv >> (l + 1)) * n + e);
        s = ls;
        c = lc;
      }
      if (j + 1 < w) {
        stack_s[l][t] = s;
        stack_c[l][t] = c;
      }
    }
    // j + 1 = w: the last node is carried; the waiting nodes at w's other set bits take it in
    // from the smallest (the tree's last levels, receiver (w >> (l + 1)) << (l + 1)).
    if (w & (w - 1)) {
      int l = 0;
      while (!((w >> l) & 1)) ++l;  // the carried node is the one at w's lowest set bit
      bool first = true;
      for (; l < CPD_TREE_LEVELS; ++l) {
        if (!((w >> l) & 1)) continue;
        if (first) {  // it was carried up from row w - 1, not stored
          first = false;
          continue;
        }
        cpd::u32 ls = stack_s[l][t], lc = stack_c[l][t];
        red.merge(ls, lc, s, c, true, base + l * adds, (unsigned long long)(w >> (l + 1)) * n + e);
        s = ls;
        c = lc;
      }
    }
    y[e] = cpd::float_of(s);
  }
}
