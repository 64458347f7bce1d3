// Fused wire kernels of cpd.distributed on CUDA tensors (the GPU-resident NCCL path): the same
// four passes as cuda/cpu/hop.cpp, on torch's current stream, compiled by NVRTC (cpd/_cuda.py).
//
// One thread per group of 8 elements: 8 codes of b bits are b whole bytes, so every thread owns
// its bytes (sub-byte codes included) and no atomics are needed. Codes are computed directly by
// the numerics core (no tables): decode_bits, add_bits (or its float32 lanes: add_lanes),
// cast_bits, encode_value_bits.
// Wire layout, segments and the Kahan merge: see hop.cpp (the CPU twin, tested bit for bit).
#include "cpd/numerics.h"

namespace {

typedef unsigned int u32;
typedef unsigned long long u64;

struct Wire {
  cpd::Format f, fe;
  int mode, bits, raw32;
};

__device__ __forceinline__ Wire make_wire(int exp, int man, int bias, int specials, int subnormals, int mode,
                                          int saturate, int bits, int raw32) {
  Wire w;
  w.f = cpd::make_format(exp, man, bias, specials, subnormals, saturate);
  w.fe = cpd::make_format(exp, man, bias, specials, subnormals, 0);
  w.mode = mode;
  w.bits = raw32 ? 32 : bits;
  w.raw32 = raw32;
  return w;
}

// The wire code of a value of the format (cpd::wire_code_bits: cpd.encode after the wire's NaN
// rule, the one definition hop.cpp uses too) and back.
__device__ __forceinline__ u32 wire_code(u32 v, const Wire& w) { return w.raw32 ? v : cpd::wire_code_bits(v, w.fe); }

__device__ __forceinline__ u32 wire_value(u32 c, const Wire& w) { return w.raw32 ? c : cpd::decode_bits(c, w.fe); }

__device__ __forceinline__ long long nbytes_of(long long n, int bits) {
  return bits <= 8 ? (n * bits + 7) / 8 : n * (bits <= 16 ? 2 : 4);
}

// Group g (elements 8g .. 8g+7) of a stream of nb bytes, with no per-thread array (an array
// indexed in a loop that is not unrolled lives in local memory; tests/test_cuda.py forbids it):
// codes of <= 8 bits travel as one 64-bit word of the group's `bits` bytes (load_word, code_of,
// put_code, store_word), wider codes are read and written in memory element by element. Bytes
// past nb read as 0 and are never written.
__device__ __forceinline__ u64 load_word(const unsigned char* __restrict__ p, long long g, long long nb, int bits) {
  u64 word = 0;
  if (bits <= 8) {
    const long long b0 = g * bits;
    for (int k = 0; k < bits; ++k)
      if (b0 + k < nb) word |= (u64)p[b0 + k] << (8 * k);
  }
  return word;
}

__device__ __forceinline__ u32 code_of(const unsigned char* __restrict__ p, long long g, int i, long long nb, int bits,
                                       u64 word) {
  if (bits <= 8) return (u32)(word >> (i * bits)) & ((1u << bits) - 1u);
  const int sz = bits <= 16 ? 2 : 4;
  const long long b = (g * 8 + i) * sz;
  u32 v = 0;
  for (int k = 0; k < sz; ++k)
    if (b + k < nb) v |= (u32)p[b + k] << (8 * k);
  return v;
}

__device__ __forceinline__ void put_code(unsigned char* __restrict__ p, long long g, int i, long long nb, int bits,
                                         u64& word, u32 c) {
  if (bits <= 8) {
    word |= (u64)c << (i * bits);
    return;
  }
  const int sz = bits <= 16 ? 2 : 4;
  const long long b = (g * 8 + i) * sz;
  for (int k = 0; k < sz; ++k)
    if (b + k < nb) p[b + k] = (unsigned char)(c >> (8 * k));
}

__device__ __forceinline__ void store_word(unsigned char* __restrict__ p, long long g, long long nb, int bits, u64 word) {
  if (bits > 8) return;  // written by put_code
  const long long b0 = g * bits;
  for (int k = 0; k < bits; ++k)
    if (b0 + k < nb) p[b0 + k] = (unsigned char)(word >> (8 * k));
}

// The segment holding call element e: rows (offset, length, scale), starts[k + 1] prefix sums.
__device__ __forceinline__ int find_segment(const long long* __restrict__ starts, int k, long long e) {
  int lo = 0, hi = k;  // starts[lo] <= e < starts[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (starts[mid] <= e) lo = mid;
    else hi = mid;
  }
  return lo;
}

// add_bits(a, b) for values a, b of the format, on float32 arithmetic where one of arith.h's
// identities holds (lanes: cpd::wire_lanes_apply, tested once per launch): the rounding of
// cpd::sum_f32_bits(a, b) when those bits are finite (to nearest: the float32 sum, Figueroa; the
// directed modes: TwoSum's corrected sum), add_bits itself otherwise (an inf or NaN operand, a
// float32 overflow). The CPU hops' float32 lanes (cuda/cpu/hop.cpp: fast_hop, wide_hop,
// kahan_lanes) rest on the same identities; NVRTC keeps float32 subnormals (no --ftz), which
// add_f32_needs_subnormals formats (bfloat16) lean on.
__device__ __forceinline__ u32 add_lanes(u32 a, u32 b, const Wire& w, int lanes) {
  if (lanes) {
    const u32 u = cpd::sum_f32_bits(cpd::float_of(a), cpd::float_of(b), w.mode);
    if ((u & ~cpd::SIGN) < cpd::INF_BITS) return cpd::cast_bits(u, w.f, w.mode, 0u, 32);
  }
  return cpd::add_bits(a, b, w.f, w.mode, 0u, 32);
}

__device__ __forceinline__ double pow2(long long s) {
  return __longlong_as_double((long long)(s + 1023) << 52);  // 2^s for -1022 <= s <= 1023
}

}  // namespace

// out <- wire codes of x[segments]: x * 2^s (float64, then float32), cast, encoded, packed.
extern "C" __global__ void cpd_wire_encode(const float* __restrict__ x, const long long* __restrict__ rows,
                                           const long long* __restrict__ starts, int k, long long total,
                                           unsigned char* __restrict__ out, int exp, int man, int bias, int specials,
                                           int subnormals, int mode, int saturate, int bits, int raw32) {
  const Wire w = make_wire(exp, man, bias, specials, subnormals, mode, saturate, bits, raw32);
  const long long groups = (total + 7) / 8, nb = nbytes_of(total, w.bits);
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
    u64 word = 0;
    for (int i = 0; i < 8; ++i) {
      const long long e = g * 8 + i;
      u32 c = 0u;
      if (e < total) {
        const int j = find_segment(starts, k, e);
        const float v = x[rows[3 * j] + (e - starts[j])];
        const long long s = rows[3 * j + 2];
        const float xs = s ? (float)((double)v * pow2(s)) : v;
        c = wire_code(cpd::cast_bits(cpd::bits_of(xs), w.f, w.mode, 0u, 32), w);  // raw32: the cast bits
      }
      put_code(out, g, i, nb, w.bits, word, c);
    }
    store_word(out, g, nb, w.bits, word);
  }
}

// One hop, in place on acc (and acc_c): role 0 ring, role 1 sequential; see hop.cpp wire_hop.
extern "C" __global__ void cpd_wire_hop(const unsigned char* __restrict__ recv, const unsigned char* __restrict__ recv_c,
                                        unsigned char* __restrict__ acc, unsigned char* __restrict__ acc_c,
                                        long long n, int exp, int man, int bias, int specials, int subnormals,
                                        int mode, int saturate, int bits, int raw32, int kahan, int has_recv_c,
                                        int carry, int role) {
  const Wire w = make_wire(exp, man, bias, specials, subnormals, mode, saturate, bits, raw32);
  // add_lanes' float32 path; for cpd.FP32 itself the sum in the mode is float32's own (its cast is
  // the identity on finite bits)
  const int lanes = cpd::wire_lanes_apply(w.f, w.mode, w.raw32);
  const long long groups = (n + 7) / 8, nb = nbytes_of(n, w.bits);
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
    // Element i's codes are read before its results are written (wide codes in place in memory).
    const u64 wr = load_word(recv, g, nb, w.bits), wa = load_word(acc, g, nb, w.bits);
    const u64 wrc = kahan && has_recv_c ? load_word(recv_c, g, nb, w.bits) : 0u;
    const u64 wac = kahan ? load_word(acc_c, g, nb, w.bits) : 0u;
    u64 oa = 0, oac = 0;
    for (int i = 0; i < 8; ++i) {
      const u32 cr = code_of(recv, g, i, nb, w.bits, wr), ca = code_of(acc, g, i, nb, w.bits, wa);
      if (!kahan) {
        put_code(acc, g, i, nb, w.bits, oa, wire_code(add_lanes(wire_value(cr, w), wire_value(ca, w), w, lanes), w));
        continue;
      }
      const u32 crc = has_recv_c ? code_of(recv_c, g, i, nb, w.bits, wrc) : 0u;
      const u32 cac = code_of(acc_c, g, i, nb, w.bits, wac);
      u32 s, c, xv;
      if (role == 0) {
        s = wire_value(cr, w);
        c = has_recv_c ? wire_value(crc, w) : 0u;
        xv = wire_value(ca, w);
        if (carry) c = add_lanes(c, wire_value(cac, w), w, lanes);
      } else {
        s = wire_value(ca, w);
        c = wire_value(cac, w);
        xv = wire_value(cr, w);
      }
      const u32 y = add_lanes(xv, c ^ cpd::SIGN, w, lanes);
      const u32 t = add_lanes(s, y, w, lanes);
      c = add_lanes(add_lanes(t, s ^ cpd::SIGN, w, lanes), y ^ cpd::SIGN, w, lanes);
      put_code(acc, g, i, nb, w.bits, oa, wire_code(t, w));
      put_code(acc_c, g, i, nb, w.bits, oac, wire_code(c, w));
    }
    store_word(acc, g, nb, w.bits, oa);
    if (kahan) store_word(acc_c, g, nb, w.bits, oac);
  }
}

// out[segment offsets] <- decode(codes) / 2^s (float64, then float32), times inv when inv != 1.
extern "C" __global__ void cpd_wire_decode(const unsigned char* __restrict__ in, const long long* __restrict__ rows,
                                           const long long* __restrict__ starts, int k, long long total,
                                           float* __restrict__ out, int exp, int man, int bias, int specials,
                                           int subnormals, int bits, int raw32, float inv) {
  const Wire w = make_wire(exp, man, bias, specials, subnormals, cpd::NEAREST, 0, bits, raw32);
  const long long groups = (total + 7) / 8, nb = nbytes_of(total, w.bits);
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const u64 word = load_word(in, g, nb, w.bits);
    for (int i = 0; i < 8; ++i) {
      const long long e = g * 8 + i;
      if (e >= total) break;
      const int j = find_segment(starts, k, e);
      const long long s = rows[3 * j + 2];
      float v = cpd::float_of(wire_value(code_of(in, g, i, nb, w.bits, word), w));
      if (s) v = (float)((double)v / pow2(s));
      if (inv != 1.0f) v = v * inv;
      out[rows[3 * j] + (e - starts[j])] = v;
    }
  }
}
