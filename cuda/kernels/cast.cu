// CUDA kernels over the numerics core: cast, encode, decode. Compiled at run time by NVRTC
// (cpd/_cuda.py), which passes numerics.h as an in-memory header; no system headers are used.
// One thread per element in a grid-stride loop; element i's random word depends only on
// (seed, offset, i), exactly as on the CPU, so CPU and GPU results are bit-identical.
#include "cpd/numerics.h"

// seed points to two int64 on the device: the (seed, offset) pair drawn from torch's generator.
extern "C" __global__ void cpd_cast(const float* __restrict__ x, float* __restrict__ y, long long n, int exp,
                                    int man, int bias, int specials, int subnormals, int mode, int saturate,
                                    int sr_bits, const long long* __restrict__ seed) {
  const cpd::Format f = cpd::make_format(exp, man, bias, specials, subnormals, saturate);
  const unsigned long long s = (unsigned long long)seed[0], o = (unsigned long long)seed[1];
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    unsigned int r = mode == cpd::STOCHASTIC ? cpd::random_word((unsigned long long)i, s, o) : 0u;
    y[i] = cpd::float_of(cpd::cast_bits(cpd::bits_of(x[i]), f, mode, r, sr_bits));
  }
}

template <typename Code>
__device__ void encode_impl(const float* __restrict__ x, Code* __restrict__ c, long long n, int exp, int man,
                            int bias, int specials, int subnormals, int mode, int saturate) {
  const cpd::Format f = cpd::make_format(exp, man, bias, specials, subnormals, saturate);
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    unsigned int v = cpd::cast_bits(cpd::bits_of(x[i]), f, mode, 0u, 32);
    c[i] = (Code)cpd::encode_value_bits(v, f);
  }
}

template <typename Code, typename UCode>
__device__ void decode_impl(const Code* __restrict__ c, float* __restrict__ y, long long n, int exp, int man,
                            int bias, int specials, int subnormals) {
  const cpd::Format f = cpd::make_format(exp, man, bias, specials, subnormals, 0);
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = cpd::float_of(cpd::decode_bits((unsigned int)(UCode)c[i], f));
}

#define CPD_CODE_KERNELS(SUFFIX, CODE, UCODE)                                                                  \
  extern "C" __global__ void cpd_encode_##SUFFIX(const float* __restrict__ x, CODE* __restrict__ c, long long n, \
                                                 int exp, int man, int bias, int specials, int subnormals,      \
                                                 int mode, int saturate) {                                      \
    encode_impl<CODE>(x, c, n, exp, man, bias, specials, subnormals, mode, saturate);                          \
  }                                                                                                             \
  extern "C" __global__ void cpd_decode_##SUFFIX(const CODE* __restrict__ c, float* __restrict__ y, long long n, \
                                                 int exp, int man, int bias, int specials, int subnormals) {    \
    decode_impl<CODE, UCODE>(c, y, n, exp, man, bias, specials, subnormals);                                   \
  }

CPD_CODE_KERNELS(u8, unsigned char, unsigned char)
CPD_CODE_KERNELS(i16, short, unsigned short)
CPD_CODE_KERNELS(i32, int, unsigned int)

// out = round(a * b) (op 0), round(a + b) (op 1) or round(c + a * b) (op 2), as arith_out on the CPU.
extern "C" __global__ void cpd_arith(int op, const float* __restrict__ a, const float* __restrict__ b,
                                     const float* __restrict__ c, float* __restrict__ y, long long n, int exp,
                                     int man, int bias, int specials, int subnormals, int mode, int saturate,
                                     int sr_bits, const long long* __restrict__ seed) {
  const cpd::Format f = cpd::make_format(exp, man, bias, specials, subnormals, saturate);
  const unsigned long long s = (unsigned long long)seed[0], o = (unsigned long long)seed[1];
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    unsigned int r = mode == cpd::STOCHASTIC ? cpd::random_word((unsigned long long)i, s, o) : 0u;
    unsigned int ua = cpd::bits_of(a[i]), ub = cpd::bits_of(b[i]), v;
    if (op == 0) v = cpd::mul_bits(ua, ub, f, mode, r, sr_bits);
    else if (op == 1) v = cpd::add_bits(ua, ub, f, mode, r, sr_bits);
    else v = cpd::fma_bits(cpd::bits_of(c[i]), ua, ub, f, mode, r, sr_bits);
    y[i] = cpd::float_of(v);
  }
}
