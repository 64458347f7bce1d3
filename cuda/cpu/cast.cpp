// CPU loops over the numerics core: cast, encode, decode. Built lazily by cpd/_cpu.py.
//
// Every function takes contiguous tensors prepared by cpd/ops.py (which checks dtypes, shapes and
// devices) and the five FloatFormat fields as plain ints. Work is split with at::parallel_for
// (OpenMP underneath, honouring torch.set_num_threads); the inner loops are straight-line code
// over numerics.h that the compiler vectorizes. Element i's random word depends only on
// (seed, offset, i), so results do not depend on the thread count. The cast's per-thread loops
// live in cast_loops.h (constant-folded loops for the common conventions, streaming stores for
// large outputs, the fused Philox + cast pass).
// Light torch headers: torch/extension.h (the whole C++ frontend) takes about 30 s of CPU to
// parse per source file, these about 6.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>  // PYBIND11_MODULE, and at::Tensor arguments from Python

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cpd/numerics.h"
#include "parallel.h"
#include "cast_loops.h"
#include "hop_avx2.h"  // encode_nearest: 8-bit codes to nearest, 32 per step
#include "philox_simd.h"

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task: big enough to amortize the fork

cpd::Format format_of(int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals,
                      bool saturate = false) {
  return cpd::make_format((int)exp, (int)man, (int)bias, (int)specials, subnormals ? 1 : 0, saturate ? 1 : 0);
}

using cpd_cpu::cast_one;

// The loops themselves are cast_loops.h's (PLAIN, STREAM: see there); here the split.
template <int MODE, bool FAST, bool PLAIN, bool STREAM>
void cast_det(const float* x, float* y, int64_t n, const cpd::Format f) {
  cpd_cpu::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    cpd_cpu::cast_det_range<MODE, FAST, PLAIN, STREAM>(x, y, lo, hi, f);
  });
}

template <bool FAST, bool PLAIN, bool STREAM>
void cast_sr(const float* x, float* y, int64_t n, const cpd::Format f, int sr_bits, uint64_t seed,
             uint64_t offset) {
  cpd_cpu::parallel_for(0, (n + 3) / 4, kGrain / 4, [&](int64_t blo, int64_t bhi) {
    cpd_cpu::cast_sr_range<FAST, PLAIN, STREAM>(x, y, n, blo, bhi, f, sr_bits, seed, offset);
  });
}

template <bool FAST, bool PLAIN, bool STREAM>
void cast_mode(const float* x, float* y, int64_t n, const cpd::Format f, int64_t mode, int sr_bits,
               uint64_t seed, uint64_t offset) {
  switch (mode) {
    case cpd::NEAREST: cast_det<cpd::NEAREST, FAST, PLAIN, STREAM>(x, y, n, f); break;
    case cpd::TOWARD_ZERO: cast_det<cpd::TOWARD_ZERO, FAST, PLAIN, STREAM>(x, y, n, f); break;
    case cpd::UP: cast_det<cpd::UP, FAST, PLAIN, STREAM>(x, y, n, f); break;
    case cpd::DOWN: cast_det<cpd::DOWN, FAST, PLAIN, STREAM>(x, y, n, f); break;
    case cpd::NEAREST_AWAY: cast_det<cpd::NEAREST_AWAY, FAST, PLAIN, STREAM>(x, y, n, f); break;
    case cpd::ODD: cast_det<cpd::ODD, FAST, PLAIN, STREAM>(x, y, n, f); break;
    case cpd::STOCHASTIC: cast_sr<FAST, PLAIN, STREAM>(x, y, n, f, sr_bits, seed, offset); break;
    default: TORCH_CHECK(false, "cpd: unknown rounding mode ", mode);
  }
}

}  // namespace

void cast_out(const at::Tensor& x, at::Tensor& out, int64_t exp, int64_t man, int64_t bias,
              int64_t specials, bool subnormals, int64_t mode, bool saturate, int64_t sr_bits, int64_t seed,
              int64_t offset) {
  const cpd::Format f = format_of(exp, man, bias, specials, subnormals, saturate);
  const float* xp = x.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  const int64_t n = x.numel();
  const bool stream = cpd_cpu::use_stream(yp, n * (int64_t)sizeof(float));
  const uint64_t s = (uint64_t)seed, o = (uint64_t)offset;
  if (!f.fast) cast_mode<false, false, false>(xp, yp, n, f, mode, (int)sr_bits, s, o);
  else if (!cpd_cpu::plain_format_applies(f) && !stream) cast_mode<true, false, false>(xp, yp, n, f, mode, (int)sr_bits, s, o);
  else if (!cpd_cpu::plain_format_applies(f)) cast_mode<true, false, true>(xp, yp, n, f, mode, (int)sr_bits, s, o);
  else if (!stream) cast_mode<true, true, false>(xp, yp, n, f, mode, (int)sr_bits, s, o);
  else cast_mode<true, true, true>(xp, yp, n, f, mode, (int)sr_bits, s, o);
}

namespace {
#if CPD_HOP_AVX2
// 8-bit codes of a format of cpd_hop_avx2::applies, to nearest: the wire encode's 32-per-step
// steps (cast_code_fast on 8 lanes, packed to bytes), span by span; a span holding an inf or NaN
// is encoded again by encode_loop's exact steps. GCC's vectorization of that loop took 2.1x a
// float32 copy on AVX2 (Intel Xeon, x86-64-v3 build).
void encode_nearest_u8(const float* x, uint8_t* c, int64_t n, const cpd::Format f) {
  const cpd_hop_avx2::Consts k(f);
  cpd_cpu::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; s += cpd_cpu::kSpan) {
      const int64_t m = std::min(cpd_cpu::kSpan, hi - s);
      if (cpd_hop_avx2::encode_nearest(x + s, m, 1.0f, false, c + s, k, f)) continue;
      for (int64_t i = s; i < s + m; ++i)
        c[i] = (uint8_t)cpd::encode_value_bits_fast(cast_one<true>(cpd::bits_of(x[i]), f, cpd::NEAREST, 0u, 32), f);
    }
  });
}
#endif

// PLAIN: the format's conventions as constants (cast_loops.h plain_format: the same numerics
// functions on the same values, with the convention selects folded away).
template <typename Code, int MODE, bool FAST, bool PLAIN>
void encode_loop(const float* x, Code* c, int64_t n, const cpd::Format f) {
#if CPD_HOP_AVX2
  if constexpr (std::is_same_v<Code, uint8_t> && MODE == cpd::NEAREST && FAST) {
    if (cpd_hop_avx2::applies(f, cpd::NEAREST)) return encode_nearest_u8(x, c, n, f);
  }
#endif
  cpd_cpu::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = cpd_cpu::loop_format<PLAIN>(f);
    // Local restrict pointers: a store through a uint8_t pointer may alias anything, including
    // the lambda's captures, which would otherwise be reloaded every element (no vectorization).
    const float* __restrict xr = x;
    Code* __restrict cr = c;
    if (!FAST) {
      for (int64_t i = lo; i < hi; ++i)
        cr[i] = (Code)cpd::encode_value_bits(cast_one<false>(cpd::bits_of(xr[i]), g, MODE, 0u, 32), g);
      return;
    }
    // Spans as cast_span_fast: region S's work only in a span that has an element there. A span
    // of finite values of a format of cast_code_applies reads each code off the rounding
    // (cast_code_fast: no value composed, then taken apart); one with an inf or NaN casts, then
    // encodes. (The four modes of the wire, whose hop tests cast_code_fast on every code pair.)
    constexpr bool kWireMode = MODE == cpd::NEAREST || MODE == cpd::TOWARD_ZERO || MODE == cpd::UP || MODE == cpd::DOWN;
    const bool by_code = kWireMode && cpd::cast_code_applies(g);
    for (int64_t s = lo; s < hi; s += cpd_cpu::kSpan) {
      const int64_t m = std::min(cpd_cpu::kSpan, hi - s);
      const float* __restrict xs = xr + s;
      Code* __restrict cs = cr + s;
      const bool sub = cpd_cpu::span_has_sub(xs, m, g);
      if (by_code && !cpd_cpu::span_has_special(xs, m)) {
        if (sub) {
          for (int64_t i = 0; i < m; ++i) cs[i] = (Code)cpd::cast_code_fast(cpd::bits_of(xs[i]), g, MODE);
        } else {
          for (int64_t i = 0; i < m; ++i) cs[i] = (Code)cpd::cast_code_fast_normal(cpd::bits_of(xs[i]), g, MODE);
        }
      } else if (sub) {
        for (int64_t i = 0; i < m; ++i)
          cs[i] = (Code)cpd::encode_value_bits_fast(cpd::cast_bits_fast(cpd::bits_of(xs[i]), g, MODE, 0u, 32), g);
      } else {
        for (int64_t i = 0; i < m; ++i)
          cs[i] = (Code)cpd::encode_value_bits_fast(cpd::cast_bits_fast_normal(cpd::bits_of(xs[i]), g, MODE, 0u, 32), g);
      }
    }
  });
}

template <typename Code, bool FAST, bool PLAIN>
void encode_path(const float* x, Code* c, int64_t n, const cpd::Format f, int64_t mode) {
  switch (mode) {
    case cpd::NEAREST: encode_loop<Code, cpd::NEAREST, FAST, PLAIN>(x, c, n, f); break;
    case cpd::TOWARD_ZERO: encode_loop<Code, cpd::TOWARD_ZERO, FAST, PLAIN>(x, c, n, f); break;
    case cpd::UP: encode_loop<Code, cpd::UP, FAST, PLAIN>(x, c, n, f); break;
    case cpd::DOWN: encode_loop<Code, cpd::DOWN, FAST, PLAIN>(x, c, n, f); break;
    case cpd::NEAREST_AWAY: encode_loop<Code, cpd::NEAREST_AWAY, FAST, PLAIN>(x, c, n, f); break;
    case cpd::ODD: encode_loop<Code, cpd::ODD, FAST, PLAIN>(x, c, n, f); break;
    default: TORCH_CHECK(false, "cpd: encode takes a deterministic rounding mode, got ", mode);
  }
}

template <typename Code>
void encode_mode(const float* x, Code* c, int64_t n, const cpd::Format f, int64_t mode) {
  if (cpd_cpu::plain_format_applies(f))
    encode_path<Code, true, true>(x, c, n, f, mode);
  else if (f.fast)
    encode_path<Code, true, false>(x, c, n, f, mode);
  else
    encode_path<Code, false, false>(x, c, n, f, mode);
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
void encode_out(const at::Tensor& x, at::Tensor& out, int64_t exp, int64_t man, int64_t bias,
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

void decode_out(const at::Tensor& codes, at::Tensor& out, int64_t exp, int64_t man, int64_t bias,
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
void random_words(at::Tensor& out, int64_t start, int64_t seed, int64_t offset) {
  int32_t* p = out.data_ptr<int32_t>();
  for (int64_t i = 0; i < out.numel(); ++i)
    p[i] = (int32_t)cpd::random_word((uint64_t)(start + i), (uint64_t)seed, (uint64_t)offset);
}

// The vector Philox of this build (philox_simd.h), for the tests: out (int32, 4 * n) gets the
// words of blocks b0 + i * stride, i < n, keyed by (seed, offset): in element order
// (philox_blocks, stride 1 only) or one run of n words per word index (philox_strided).
void philox_simd_out(at::Tensor& out, int64_t b0, int64_t stride, int64_t n, int64_t seed, int64_t offset,
                     bool by_word) {
  TORCH_CHECK(out.numel() == 4 * n && out.is_contiguous(), "cpd: philox_simd_out wants 4 * n contiguous words");
  TORCH_CHECK(by_word || stride == 1, "cpd: element order is for stride 1");
  uint32_t* w = (uint32_t*)out.data_ptr<int32_t>();
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32), c2 = (uint32_t)offset,
                 c3 = (uint32_t)((uint64_t)offset >> 32);
  if (by_word) cpd_cpu::philox_strided((uint64_t)b0, (uint64_t)stride, n, c2, c3, k0, k1, w, n);
  else cpd_cpu::philox_blocks((uint64_t)b0, n, c2, c3, k0, k1, w);
}

// The output size (bytes) from which casts stream their stores (cast_loops.h); a value >= 0
// sets it (the tests move it to reach the streaming path with small tensors). Returns the
// previous value.
int64_t stream_min_bytes(int64_t bytes) {
  return bytes >= 0 ? cpd_cpu::stream_min_bytes().exchange(bytes) : cpd_cpu::stream_min_bytes().load();
}

// The ISA the vector paths were compiled for, and whether OpenMP threads the loops.
std::string isa() { return std::string(cpd_cpu::isa_name()) + (cpd_cpu::kOpenMP ? "" : ", no OpenMP"); }

// cuda/cpu/arith.cpp
void arith_out(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
               at::Tensor& out, int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals,
               int64_t mode, bool saturate, int64_t sr_bits, int64_t seed, int64_t offset, int64_t path);

// cuda/cpu/matmul.cpp
void matmul_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool has_mul, int64_t mexp,
                int64_t mman, int64_t mbias, int64_t mspecials, bool msubnormals, int64_t aexp, int64_t aman,
                int64_t abias, int64_t aspecials, bool asubnormals, bool kahan, int64_t block, int64_t mode,
                bool saturate, int64_t sr_bits, int64_t seed, int64_t offset, int64_t path);
int64_t matmul_lanes(bool has_mul, int64_t mexp, int64_t mman, int64_t mbias, int64_t mspecials, bool msubnormals,
                     int64_t aexp, int64_t aman, int64_t abias, int64_t aspecials, bool asubnormals, int64_t mode,
                     bool saturate);

// cuda/cpu/ops.cpp sets these when it is linked in (not in the ISA-level tests' core builds,
// whose ops run on the Python kernels): the C++ kernels of the core ops.
void (*cpd_bind_ops)(pybind11::module_&) = nullptr;  // ops.cpp's functions, when it is linked in

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  if (cpd_bind_ops) cpd_bind_ops(m);  // static initializers have run: the module's init function runs at import
  m.def("arith_out", &arith_out);
  m.def("matmul_out", &matmul_out);
  m.def("matmul_lanes", &matmul_lanes);
  m.def("cast_out", &cast_out);
  m.def("encode_out", &encode_out);
  m.def("decode_out", &decode_out);
  m.def("random_words", &random_words);
  m.def("philox_simd_out", &philox_simd_out);
  m.def("isa", &isa);
  m.def("stream_min_bytes", &stream_min_bytes);
}
