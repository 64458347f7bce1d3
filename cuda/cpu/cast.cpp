// CPU loops over the numerics core: cast, encode, decode. Built lazily by cpd/_cpu.py.
//
// Every function takes contiguous tensors prepared by cpd/ops.py (which checks dtypes, shapes and
// devices) and the five FloatFormat fields as plain ints. Work is split with at::parallel_for
// (OpenMP underneath, honouring torch.set_num_threads); the inner loops are straight-line code
// over numerics.h that the compiler vectorizes. Element i's random word depends only on
// (seed, offset, i), so results do not depend on the thread count.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpd/numerics.h"
#include "parallel.h"
#include "philox_simd.h"

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task: big enough to amortize the fork

cpd::Format format_of(int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals,
                      bool saturate = false) {
  return cpd::make_format((int)exp, (int)man, (int)bias, (int)specials, subnormals ? 1 : 0, saturate ? 1 : 0);
}

// One element of the cast on the path chosen at compile time (FAST: cast_bits_fast).
template <bool FAST>
inline uint32_t cast_one(uint32_t u, const cpd::Format& f, int mode, uint32_t rand, int sr_bits) {
  return FAST ? cpd::cast_bits_fast(u, f, mode, rand, sr_bits) : cpd::cast_bits_generic(u, f, mode, rand, sr_bits);
}

// A span of at most a few thousand elements (it stays in L1) on the fast path, for the modes
// whose region S (|x| < 2^emin, cpd::round_sub_fast) costs a dozen float operations per element:
// first a scan of the span for any element in region S, then either the cheap region-N cast of
// every element (none there) or the full fast cast. Data that rarely comes near the format's
// subnormals (most of it for bf16 and fp16, much of it for fp8) skips region S's work; a span
// with a region-S element costs the full cast plus the scan. The scan comes first, and each
// element is read before it is written, so that an in-place cast (xb == yb) stays correct.
// words: the random words of the span's elements (STOCHASTIC), else unused.
template <int MODE>
inline void cast_span_fast(const float* xb, float* yb, int64_t m, const cpd::Format& g,
                           const uint32_t* __restrict words, int sr_bits) {
  uint32_t any_sub = 0;
  for (int64_t i = 0; i < m; ++i) any_sub |= (uint32_t)((cpd::bits_of(xb[i]) & ~cpd::SIGN) < g.min_normal_bits);
  if (any_sub) {
    for (int64_t i = 0; i < m; ++i) {
      uint32_t w = MODE == cpd::STOCHASTIC ? words[i] : 0u;
      yb[i] = cpd::float_of(cpd::cast_bits_fast(cpd::bits_of(xb[i]), g, MODE, w, sr_bits));
    }
  } else {
    for (int64_t i = 0; i < m; ++i) {
      uint32_t w = MODE == cpd::STOCHASTIC ? words[i] : 0u;
      yb[i] = cpd::float_of(cpd::cast_bits_fast_normal(cpd::bits_of(xb[i]), g, MODE, w, sr_bits));
    }
  }
}

// Deterministic modes: MODE and the path compile-time constants so the branches of the core
// fold away (the path is chosen once per launch, from f.fast). Nearest on the fast path and the
// generic path: one straight loop; directed modes on the fast path: spans (cast_span_fast).
constexpr int64_t kSpan = 1024;

template <int MODE, bool FAST>
void cast_det(const float* x, float* y, int64_t n, const cpd::Format f) {
  cpd_cpu::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;  // a local copy the vectorizer can keep in registers
    if (FAST && MODE != cpd::NEAREST) {
      for (int64_t s = lo; s < hi; s += kSpan) cast_span_fast<MODE>(x + s, y + s, std::min(kSpan, hi - s), g, nullptr, 32);
      return;
    }
    for (int64_t i = lo; i < hi; ++i) {
      y[i] = cpd::float_of(cast_one<FAST>(cpd::bits_of(x[i]), g, MODE, 0u, 32));
    }
  });
}

// ------------------------------------------------------------------------------------------
// Stochastic rounding: one Philox call serves four consecutive elements (block i >> 2).
// cpd_cpu::philox_blocks (philox_simd.h: AVX-512, AVX2, SSE4.1 or NEON lanes, else scalar) writes the
// words of kSrBlocks blocks in element order, words[4k + j] = random_word(4 (b0 + k) + j): the
// words of cpd::philox4x32_10, bit for bit.
constexpr int64_t kSrBlocks = 96;  // blocks per buffer: 384 words, 1.5 KiB, stays in L1 (a multiple of
                                   // the vector Philox's 6 (SSE4.1), 12 (AVX2), 16 (NEON) and 32
                                   // (AVX-512) blocks)

// The cast: the words of kSrBlocks blocks into a buffer, then the cast of their 4 * kSrBlocks
// elements (a span on the fast path, a straight loop on the generic one).
template <bool FAST>
void cast_sr(const float* x, float* y, int64_t n, const cpd::Format f, int sr_bits,
             uint64_t seed, uint64_t offset) {
  const int64_t nblocks = (n + 3) / 4;
  cpd_cpu::parallel_for(0, nblocks, kGrain / 4, [&](int64_t blo, int64_t bhi) {
    const cpd::Format g = f;
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const uint32_t c2 = (uint32_t)offset, c3 = (uint32_t)(offset >> 32);
    const int64_t full_hi = std::min(bhi, n / 4);
    alignas(64) uint32_t words[4 * kSrBlocks];
    for (int64_t b0 = blo; b0 < full_hi; b0 += kSrBlocks) {
      const int64_t nb = std::min(kSrBlocks, full_hi - b0);
      cpd_cpu::philox_blocks((uint64_t)b0, nb, c2, c3, k0, k1, words);
      const float* xb = x + 4 * b0;
      float* yb = y + 4 * b0;
      if (FAST) {
        cast_span_fast<cpd::STOCHASTIC>(xb, yb, 4 * nb, g, words, sr_bits);
      } else {
        for (int64_t i = 0; i < 4 * nb; ++i)
          yb[i] = cpd::float_of(cpd::cast_bits_generic(cpd::bits_of(xb[i]), g, cpd::STOCHASTIC, words[i], sr_bits));
      }
    }
    for (int64_t i = std::max(4 * full_hi, 4 * blo); i < std::min(4 * bhi, n); ++i) {  // the tail block
      uint32_t r = cpd::random_word((uint64_t)i, seed, offset);
      y[i] = cpd::float_of(cast_one<FAST>(cpd::bits_of(x[i]), g, cpd::STOCHASTIC, r, sr_bits));
    }
  });
}

template <bool FAST>
void cast_mode(const float* x, float* y, int64_t n, const cpd::Format f, int64_t mode, int sr_bits,
               uint64_t seed, uint64_t offset) {
  switch (mode) {
    case cpd::NEAREST: cast_det<cpd::NEAREST, FAST>(x, y, n, f); break;
    case cpd::TOWARD_ZERO: cast_det<cpd::TOWARD_ZERO, FAST>(x, y, n, f); break;
    case cpd::UP: cast_det<cpd::UP, FAST>(x, y, n, f); break;
    case cpd::DOWN: cast_det<cpd::DOWN, FAST>(x, y, n, f); break;
    case cpd::NEAREST_AWAY: cast_det<cpd::NEAREST_AWAY, FAST>(x, y, n, f); break;
    case cpd::ODD: cast_det<cpd::ODD, FAST>(x, y, n, f); break;
    case cpd::STOCHASTIC: cast_sr<FAST>(x, y, n, f, sr_bits, seed, offset); break;
    default: TORCH_CHECK(false, "cpd: unknown rounding mode ", mode);
  }
}

}  // namespace

void cast_out(const torch::Tensor& x, torch::Tensor& out, int64_t exp, int64_t man, int64_t bias,
              int64_t specials, bool subnormals, int64_t mode, bool saturate, int64_t sr_bits, int64_t seed,
              int64_t offset) {
  const cpd::Format f = format_of(exp, man, bias, specials, subnormals, saturate);
  const float* xp = x.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  const int64_t n = x.numel();
  if (f.fast)
    cast_mode<true>(xp, yp, n, f, mode, (int)sr_bits, (uint64_t)seed, (uint64_t)offset);
  else
    cast_mode<false>(xp, yp, n, f, mode, (int)sr_bits, (uint64_t)seed, (uint64_t)offset);
}

namespace {
template <typename Code, int MODE, bool FAST>
void encode_loop(const float* x, Code* c, int64_t n, const cpd::Format f) {
  cpd_cpu::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;
    // Local restrict pointers: a store through a uint8_t pointer may alias anything, including
    // the lambda's captures, which would otherwise be reloaded every element (no vectorization).
    const float* __restrict xr = x;
    Code* __restrict cr = c;
    for (int64_t i = lo; i < hi; ++i) {
      uint32_t v = cast_one<FAST>(cpd::bits_of(xr[i]), g, MODE, 0u, 32);
      cr[i] = (Code)(FAST ? cpd::encode_value_bits_fast(v, g) : cpd::encode_value_bits(v, g));
    }
  });
}

template <typename Code, bool FAST>
void encode_path(const float* x, Code* c, int64_t n, const cpd::Format f, int64_t mode) {
  switch (mode) {
    case cpd::NEAREST: encode_loop<Code, cpd::NEAREST, FAST>(x, c, n, f); break;
    case cpd::TOWARD_ZERO: encode_loop<Code, cpd::TOWARD_ZERO, FAST>(x, c, n, f); break;
    case cpd::UP: encode_loop<Code, cpd::UP, FAST>(x, c, n, f); break;
    case cpd::DOWN: encode_loop<Code, cpd::DOWN, FAST>(x, c, n, f); break;
    case cpd::NEAREST_AWAY: encode_loop<Code, cpd::NEAREST_AWAY, FAST>(x, c, n, f); break;
    case cpd::ODD: encode_loop<Code, cpd::ODD, FAST>(x, c, n, f); break;
    default: TORCH_CHECK(false, "cpd: encode takes a deterministic rounding mode, got ", mode);
  }
}

template <typename Code>
void encode_mode(const float* x, Code* c, int64_t n, const cpd::Format f, int64_t mode) {
  if (f.fast)
    encode_path<Code, true>(x, c, n, f, mode);
  else
    encode_path<Code, false>(x, c, n, f, mode);
}

template <typename Code>
void decode_loop(const Code* c, float* y, int64_t n, const cpd::Format f) {
  using UCode = std::make_unsigned_t<Code>;
  // A table of decode_bits over every value of the code type (bit-exact by construction), when
  // it pays: always for 8-bit codes (256 entries), for 16-bit codes on large inputs.
  constexpr int64_t kTable = sizeof(Code) <= 2 ? int64_t(1) << (8 * sizeof(Code)) : 0;
  if (kTable && (kTable <= 256 || n >= 16 * kTable)) {
    std::vector<float> table(kTable);
    cpd_cpu::parallel_for(0, kTable, 4096, [&](int64_t lo, int64_t hi) {
      for (int64_t k = lo; k < hi; ++k) table[k] = cpd::float_of(cpd::decode_bits((uint32_t)k, f));
    });
    const float* __restrict t = table.data();
    float* __restrict yr = y;
    cpd_cpu::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) yr[i] = t[(UCode)c[i]];  // a gather
    });
    return;
  }
  cpd_cpu::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;
    for (int64_t i = lo; i < hi; ++i) y[i] = cpd::float_of(cpd::decode_bits((uint32_t)(UCode)c[i], g));
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

// The vector Philox of this build (philox_simd.h), for the tests: out (int32, 4 * n) gets the
// words of blocks b0 + i * stride, i < n, keyed by (seed, offset): in element order
// (philox_blocks, stride 1 only) or one run of n words per word index (philox_strided).
void philox_simd_out(torch::Tensor& out, int64_t b0, int64_t stride, int64_t n, int64_t seed, int64_t offset,
                     bool by_word) {
  TORCH_CHECK(out.numel() == 4 * n && out.is_contiguous(), "cpd: philox_simd_out wants 4 * n contiguous words");
  TORCH_CHECK(by_word || stride == 1, "cpd: element order is for stride 1");
  uint32_t* w = (uint32_t*)out.data_ptr<int32_t>();
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32), c2 = (uint32_t)offset,
                 c3 = (uint32_t)((uint64_t)offset >> 32);
  if (by_word) cpd_cpu::philox_strided((uint64_t)b0, (uint64_t)stride, n, c2, c3, k0, k1, w, n);
  else cpd_cpu::philox_blocks((uint64_t)b0, n, c2, c3, k0, k1, w);
}

// The ISA the vector paths were compiled for, and whether OpenMP threads the loops.
std::string isa() { return std::string(cpd_cpu::isa_name()) + (cpd_cpu::kOpenMP ? "" : ", no OpenMP"); }

// cuda/cpu/arith.cpp
void arith_out(int64_t op, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
               torch::Tensor& out, int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals,
               int64_t mode, bool saturate, int64_t sr_bits, int64_t seed, int64_t offset);

// cuda/cpu/matmul.cpp
void matmul_out(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& out, bool has_mul, int64_t mexp,
                int64_t mman, int64_t mbias, int64_t mspecials, bool msubnormals, int64_t aexp, int64_t aman,
                int64_t abias, int64_t aspecials, bool asubnormals, bool kahan, int64_t block, int64_t mode,
                bool saturate, int64_t sr_bits, int64_t seed, int64_t offset, int64_t path);
int64_t matmul_lanes(bool has_mul, int64_t mexp, int64_t mman, int64_t mbias, int64_t mspecials, bool msubnormals,
                     int64_t aexp, int64_t aman, int64_t abias, int64_t aspecials, bool asubnormals, int64_t mode,
                     bool saturate);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("arith_out", &arith_out);
  m.def("matmul_out", &matmul_out);
  m.def("matmul_lanes", &matmul_lanes);
  m.def("cast_out", &cast_out);
  m.def("encode_out", &encode_out);
  m.def("decode_out", &decode_out);
  m.def("random_words", &random_words);
  m.def("philox_simd_out", &philox_simd_out);
  m.def("isa", &isa);
}
