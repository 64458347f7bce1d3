// CPU loops over the numerics core: cast, encode, decode. Built lazily by cpd/_cpu.py.
//
// Every function takes contiguous tensors prepared by cpd/ops.py (which checks dtypes, shapes and
// devices) and the five FloatFormat fields as plain ints. Work is split with at::parallel_for
// (OpenMP underneath, honouring torch.set_num_threads); the inner loops are straight-line code
// over numerics.h that the compiler vectorizes. Element i's random word depends only on
// (seed, offset, i), so results do not depend on the thread count.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>

#include "cpd/numerics.h"

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task: big enough to amortize the fork

cpd::Format format_of(int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals,
                      bool saturate = false) {
  return cpd::make_format((int)exp, (int)man, (int)bias, (int)specials, subnormals ? 1 : 0, saturate ? 1 : 0);
}

// Deterministic modes: one straight loop, MODE a compile-time constant so the branches of
// round_mag fold away.
template <int MODE>
void cast_det(const float* x, float* y, int64_t n, const cpd::Format f) {
  at::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;  // a local copy the vectorizer can keep in registers
    for (int64_t i = lo; i < hi; ++i) {
      y[i] = cpd::float_of(cpd::cast_bits(cpd::bits_of(x[i]), g, MODE, 0u, 32));
    }
  });
}

// Stochastic rounding: one Philox call serves four consecutive elements (block i >> 2).
void cast_sr(const float* x, float* y, int64_t n, const cpd::Format f, int sr_bits,
             uint64_t seed, uint64_t offset) {
  const int64_t nblocks = (n + 3) / 4;
  at::parallel_for(0, nblocks, kGrain / 4, [&](int64_t blo, int64_t bhi) {
    const cpd::Format g = f;
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const uint32_t c2 = (uint32_t)offset, c3 = (uint32_t)(offset >> 32);
    int64_t full_hi = std::min(bhi, n / 4);
    for (int64_t b = blo; b < full_hi; ++b) {
      cpd::U32x4 w = cpd::philox4x32_10((uint32_t)b, (uint32_t)((uint64_t)b >> 32), c2, c3, k0, k1);
      for (int j = 0; j < 4; ++j) {
        int64_t i = 4 * b + j;
        y[i] = cpd::float_of(cpd::cast_bits(cpd::bits_of(x[i]), g, cpd::STOCHASTIC, w.v[j], sr_bits));
      }
    }
    for (int64_t i = std::max(4 * full_hi, 4 * blo); i < std::min(4 * bhi, n); ++i) {  // the tail block
      uint32_t r = cpd::random_word((uint64_t)i, seed, offset);
      y[i] = cpd::float_of(cpd::cast_bits(cpd::bits_of(x[i]), g, cpd::STOCHASTIC, r, sr_bits));
    }
  });
}

}  // namespace

void cast_out(const torch::Tensor& x, torch::Tensor& out, int64_t exp, int64_t man, int64_t bias,
              int64_t specials, bool subnormals, int64_t mode, bool saturate, int64_t sr_bits, int64_t seed,
              int64_t offset) {
  const cpd::Format f = format_of(exp, man, bias, specials, subnormals, saturate);
  const float* xp = x.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  const int64_t n = x.numel();
  switch (mode) {
    case cpd::NEAREST: cast_det<cpd::NEAREST>(xp, yp, n, f); break;
    case cpd::TOWARD_ZERO: cast_det<cpd::TOWARD_ZERO>(xp, yp, n, f); break;
    case cpd::UP: cast_det<cpd::UP>(xp, yp, n, f); break;
    case cpd::DOWN: cast_det<cpd::DOWN>(xp, yp, n, f); break;
    case cpd::STOCHASTIC: cast_sr(xp, yp, n, f, (int)sr_bits, (uint64_t)seed, (uint64_t)offset); break;
    default: TORCH_CHECK(false, "cpd: unknown rounding mode ", mode);
  }
}

namespace {
template <typename Code, int MODE>
void encode_loop(const float* x, Code* c, int64_t n, const cpd::Format f) {
  at::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;
    for (int64_t i = lo; i < hi; ++i) {
      uint32_t v = cpd::cast_bits(cpd::bits_of(x[i]), g, MODE, 0u, 32);
      c[i] = (Code)cpd::encode_value_bits(v, g);
    }
  });
}

template <typename Code>
void encode_mode(const float* x, Code* c, int64_t n, const cpd::Format f, int64_t mode) {
  switch (mode) {
    case cpd::NEAREST: encode_loop<Code, cpd::NEAREST>(x, c, n, f); break;
    case cpd::TOWARD_ZERO: encode_loop<Code, cpd::TOWARD_ZERO>(x, c, n, f); break;
    case cpd::UP: encode_loop<Code, cpd::UP>(x, c, n, f); break;
    case cpd::DOWN: encode_loop<Code, cpd::DOWN>(x, c, n, f); break;
    default: TORCH_CHECK(false, "cpd: encode takes a deterministic rounding mode, got ", mode);
  }
}

template <typename Code>
void decode_loop(const Code* c, float* y, int64_t n, const cpd::Format f) {
  at::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;
    for (int64_t i = lo; i < hi; ++i) y[i] = cpd::float_of(cpd::decode_bits((uint32_t)(std::make_unsigned_t<Code>)c[i], g));
  });
}
}  // namespace

// x: float32 values (already stochastically rounded by the caller when rounding is stochastic);
// out: uint8 / int16 / int32 codes.
void encode_out(const torch::Tensor& x, torch::Tensor& out, int64_t exp, int64_t man, int64_t bias,
                int64_t specials, bool subnormals, int64_t mode, bool saturate) {
  const cpd::Format f = format_of(exp, man, bias, specials, subnormals, saturate);
  const float* xp = x.data_ptr<float>();
  const int64_t n = x.numel();
  switch (out.scalar_type()) {
    case at::kByte: encode_mode(xp, out.data_ptr<uint8_t>(), n, f, mode); break;
    case at::kShort: encode_mode(xp, out.data_ptr<int16_t>(), n, f, mode); break;
    case at::kInt: encode_mode(xp, out.data_ptr<int32_t>(), n, f, mode); break;
    default: TORCH_CHECK(false, "cpd: code tensor must be uint8, int16 or int32");
  }
}

void decode_out(const torch::Tensor& codes, torch::Tensor& out, int64_t exp, int64_t man, int64_t bias,
                int64_t specials, bool subnormals) {
  const cpd::Format f = format_of(exp, man, bias, specials, subnormals);
  float* yp = out.data_ptr<float>();
  const int64_t n = codes.numel();
  switch (codes.scalar_type()) {
    case at::kByte: decode_loop(codes.data_ptr<uint8_t>(), yp, n, f); break;
    case at::kShort: decode_loop(codes.data_ptr<int16_t>(), yp, n, f); break;
    case at::kInt: decode_loop(codes.data_ptr<int32_t>(), yp, n, f); break;
    default: TORCH_CHECK(false, "cpd: code tensor must be uint8, int16 or int32");
  }
}

// Random words of elements [start, start + n) for (seed, offset): exposes the generator so that
// tests can check stochastic decisions exactly.
void random_words(torch::Tensor& out, int64_t start, int64_t seed, int64_t offset) {
  int32_t* p = out.data_ptr<int32_t>();
  for (int64_t i = 0; i < out.numel(); ++i)
    p[i] = (int32_t)cpd::random_word((uint64_t)(start + i), (uint64_t)seed, (uint64_t)offset);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cast_out", &cast_out);
  m.def("encode_out", &encode_out);
  m.def("decode_out", &decode_out);
  m.def("random_words", &random_words);
}
