// Fused CPU kernels of cpd.mx (block-scaled formats): one pass per block.
//
//   mx_cast     x (rows, n) float32 -> the fake-quantized values (rows, n): per block of
//               `block` elements along a row, amax, the shared scale (cpd::block_scale_bits) and
//               every element rounded against it and multiplied back;
//   mx_encode   the same pass writing element codes (rows, L) or packed (4-bit: two per byte;
//               6-bit: four per three bytes, low bits first; L = nblocks * block, the ragged last
//               block padded with the code of +0) and scale codes (rows, nblocks);
//   mx_decode   codes + scale codes -> float32 (rows, n).
//
// The op bodies (cuda/cpu/mx_ops.cpp; cpd/_mx_engine.py before they are registered) move the
// block axis last and make x contiguous; the tensor scale T of two-level formats (NVFP4) comes
// computed (a float, 1 without one). Every
// value is the numerics core's (cpd/block.h over cast.h, arith.h, codes.h), so the results are
// those of cpd/mx.py's pure-torch path bit for bit (tests/test_mx_kernels.py).
//
// Speed: blocks are split over threads with cpd_cpu::parallel_for; a block's element loop is
// straight-line core code (fast cast path, branch-free selects) that GCC vectorizes. The rare
// block whose fl32(x * 2^-e) falls below float32's normals (an element 2^126 below the block's
// largest) is redone with the exact product (cpd::block_elem_pow2). Stochastic rounding draws
// element i's word as cpd.cast / cpd.mul do: random_word(flat index in the padded (rows, L)
// layout, seed, offset), drawn for 1024 elements at a time with the vector Philox.
//
// The round-to-nearest hot case (full blocks of 16 or 32, the MX/NVFP4 float elements) takes the
// AVX2 path of mx_avx2.h where the build has AVX2; large float32 results are streamed and fresh
// outputs get huge pages (stream_store.h).
// Light torch headers (torch/extension.h takes about 30 s of CPU to parse per source file).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "cpd/numerics.h"
#include "mx_avx2.h"
#include "parallel.h"
#include "philox_simd.h"

namespace {

using cpd::u32;
using cpd::u64;

struct Job {
  cpd::BlockSpec b;
  int64_t rows, n, block, nb, L;  // L = nb * block: the padded row
  int mode;
  u64 seed, offset;
  int pack;          // 0: one code per byte; 4 or 6: packed (block-aligned bytes)
  int64_t row_bytes; // bytes per row of codes
};

cpd::BlockSpec spec_of(at::IntArrayRef el, at::IntArrayRef sc, int64_t rule, bool is_int, double t) {
  TORCH_CHECK(el.size() == 5 && sc.size() == 5, "cpd_mx: a format is [exp, man, bias, specials, subnormals]");
  TORCH_CHECK(rule >= 0 && rule <= 3, "cpd_mx: rule must be 0..3, got ", rule);
  return cpd::make_block_spec((int)el[0], (int)el[1], (int)el[2], (int)el[3], (int)el[4], (int)sc[0], (int)sc[1],
                              (int)sc[2], (int)sc[3], (int)sc[4], (int)rule, is_int ? 1 : 0, (float)t);
}

int64_t row_bytes_of(int64_t L, int pack) {
  return pack == 4 ? (L + 1) / 2 : pack == 6 ? (L + 3) / 4 * 3 : L;
}

// The words of elements [start, start + m) of a stochastic launch: word j of Philox block g is
// element 4 g + j's (cpd::random_word), computed by cpd_cpu::philox_blocks (philox_simd.h: the
// vector Philox of this build, bit for bit cpd::philox4x32_10) a few blocks at a time; a start
// that is not a multiple of 4 drops the first words of its first block.
void fill_words(u64 start, int64_t m, u64 seed, u64 offset, u32* w) {
  constexpr int64_t kBlocks = 24;  // words of 24 Philox blocks (a multiple of the AVX2 path's 12)
  alignas(64) u32 buf[4 * kBlocks];
  const u32 k0 = (u32)seed, k1 = (u32)(seed >> 32), c2 = (u32)offset, c3 = (u32)(offset >> 32);
  int64_t i = 0;
  while (i < m) {
    const u64 e = start + (u64)i, g = e >> 2;
    const int64_t skip = (int64_t)(e & 3u);
    const int64_t nb = std::min<int64_t>(kBlocks, (m - i + skip + 3) / 4);
    cpd_cpu::philox_blocks(g, nb, c2, c3, k0, k1, buf);
    const int64_t take = std::min<int64_t>(4 * nb - skip, m - i);
    std::memcpy(w + i, buf + skip, (size_t)take * sizeof(u32));
    i += take;
  }
}

// Codes of one block (bs of them) into its bytes.
inline void put_codes(const uint8_t* __restrict c, int64_t bs, int pack, uint8_t* __restrict dst) {
  if (pack == 4) {
    for (int64_t k = 0; k < bs / 2; ++k) dst[k] = (uint8_t)(c[2 * k] | (c[2 * k + 1] << 4));
  } else if (pack == 6) {
    for (int64_t k = 0; k < bs / 4; ++k) {
      u32 w = c[4 * k] | (c[4 * k + 1] << 6) | (c[4 * k + 2] << 12) | ((u32)c[4 * k + 3] << 18);
      dst[3 * k] = (uint8_t)w;
      dst[3 * k + 1] = (uint8_t)(w >> 8);
      dst[3 * k + 2] = (uint8_t)(w >> 16);
    }
  } else {
    std::memcpy(dst, c, (size_t)bs);
  }
}

// The element loop of one block (the hot loop): P of each x against the block's inv (2^-e, or
// the amax rule's divisor), then y = fl(P * d) or the code. Straight-line core code over a local
// copy of the element format and restrict pointers, so GCC vectorizes it (8 lanes with AVX2).
// Returns whether a power-of-two product fell below float32's normals (the caller redoes the
// block exactly).
template <int MODE, bool FAST, bool POW2, bool ENC, int BS>
__attribute__((noinline)) u32 elements(const u32* __restrict xu, int64_t m_, float inv, float d, const cpd::Format el,
                                       u32 is_int, int mode_, const u32* __restrict words, float* __restrict yb,
                                       uint8_t* __restrict cbuf) {
  const int mode = FAST ? MODE : mode_;
  const int64_t m = BS ? BS : m_;
  const bool stochastic = mode == cpd::STOCHASTIC;
  u32 inexact = 0;
  for (int64_t i = 0; i < m; ++i) {
    const u32 w = stochastic ? words[i] : 0u;
    u32 p;
    if (POW2) {
      p = cpd::elem_pow2_cast<FAST>(xu[i], inv, el, is_int, mode, w, 32);
      inexact |= cpd::pow2_inexact(xu[i], inv);
    } else {
      p = cpd::elem_amax<FAST>(xu[i], inv, el, is_int, mode, w, 32);
    }
    if (ENC) cbuf[i] = (uint8_t)cpd::elem_code<FAST>(p, el, is_int);
    else yb[i] = cpd::fmul(cpd::float_of(p), d);
  }
  return inexact;
}

// One block: m real elements at xb (m <= bs); y (cast) or codes (encode) out.
//   FAST: the element format takes the fast cast path (else the generic one, any mode at run time).
//   BS: the block size as a compile-time constant (full blocks of 16 or 32: loops of known trip
//       count, vectorized without a remainder), or 0 (any block, the ragged last one).
//   B: the caller's local copy of J.b (no store of the loop can alias it).
template <int MODE, bool FAST, bool POW2, bool ENC, int BS>
__attribute__((always_inline)) inline void one_block(
    const Job& J, const cpd::BlockSpec& B, int64_t r, int64_t blk, const float* __restrict x, float* __restrict y,
    uint8_t* __restrict codes, uint8_t* __restrict scodes, uint8_t* __restrict cbuf, u32* __restrict words,
    uint8_t zero_code) {
  const int mode = FAST ? MODE : J.mode;
  const int64_t bs = BS ? BS : J.block, j0 = blk * bs, m = BS ? BS : std::min(bs, J.n - j0);
  const float* __restrict xb = x + r * J.n + j0;
  float* __restrict yb = ENC ? nullptr : y + r * J.n + j0;
  const u32* __restrict xu = reinterpret_cast<const u32*>(xb);
  u32 amax = 0;
  for (int64_t i = 0; i < m; ++i) amax = std::max(amax, xu[i] & ~cpd::SIGN);
  const u32 s = cpd::block_scale_bits(amax, B);
  const bool stochastic = mode == cpd::STOCHASTIC;
  if (s > cpd::INF_BITS) {  // NaN or inf in the block: elements +0, values NaN
    if (ENC) {
      for (int64_t i = 0; i < bs; ++i) cbuf[i] = zero_code;
    } else {
      for (int64_t i = 0; i < m; ++i) yb[i] = cpd::float_of(cpd::QNAN_BITS);
    }
  } else {
    const float d = cpd::block_divisor(s, B);  // fl(S * T); S when T = 1
    const float inv = POW2 ? cpd::block_inverse(s) : d;
    const u32 inexact = elements<MODE, FAST, POW2, ENC, BS>(xu, m, inv, d, B.el, B.is_int, mode, words, yb, cbuf);
    if (POW2 && inexact) {  // rare: redo with the exact product
      for (int64_t i = 0; i < m; ++i) {
        const u32 p = cpd::block_elem_pow2(xu[i], inv, B, mode, stochastic ? words[i] : 0u, 32);
        if (ENC) cbuf[i] = (uint8_t)cpd::block_elem_code<FAST>(p, B);
        else yb[i] = cpd::fmul(cpd::float_of(p), d);
      }
    }
    if (ENC) for (int64_t i = m; i < bs; ++i) cbuf[i] = zero_code;
  }
  if (ENC) {
    scodes[r * J.nb + blk] = (uint8_t)cpd::encode_value_bits(s, B.sc);
    const int64_t off = J.pack == 4 ? j0 / 2 : J.pack == 6 ? j0 / 4 * 3 : j0;
    put_codes(cbuf, bs, J.pack, codes + r * J.row_bytes + off);
  }
}

// The span path (deterministic fast modes with a compile-time block BS, rows without a ragged
// block, so that kn consecutive blocks are kn * BS consecutive elements): pass 1 takes every
// block's scale (amax, block_scale_bits) into small arrays, pass 2 (this function) rounds the
// span's elements in one vectorized loop nest, with no per-block call. Returns whether any
// power-of-two product fell below float32's normals (the caller redoes those blocks exactly).
template <int MODE, bool POW2, bool ENC, int BS>
__attribute__((noinline)) u32 span_elements(const u32* __restrict xu, int64_t kn, const float* __restrict invs,
                                            const float* __restrict ds, const cpd::Format el, u32 is_int,
                                            float* __restrict y, uint8_t* __restrict cbuf) {
  u32 inexact = 0;
  for (int64_t k = 0; k < kn; ++k) {
    const float inv = invs[k], d = ds[k];
    const u32* __restrict xb = xu + k * BS;
    for (int64_t i = 0; i < BS; ++i) {
      u32 p;
      if (POW2) {
        p = cpd::elem_pow2_cast<true>(xb[i], inv, el, is_int, MODE, 0u, 32);
        inexact |= cpd::pow2_inexact(xb[i], inv);
      } else {
        p = cpd::elem_amax<true>(xb[i], inv, el, is_int, MODE, 0u, 32);
      }
      if (ENC) cbuf[k * BS + i] = (uint8_t)cpd::elem_code<true>(p, el, is_int);
      else y[k * BS + i] = cpd::fmul(cpd::float_of(p), d);
    }
  }
  return inexact;
}

constexpr int64_t kSpanBlocks = 64;  // blocks per span: 2048 float32 (8 KiB) for MX's 32, stays in L1

template <int MODE, bool POW2, bool ENC, int BS>
void run_spans(const Job& J, const float* x, float* y, uint8_t* codes, uint8_t* scodes, uint8_t zero_code) {
  const int64_t total = J.rows * J.nb;
  cpd_cpu::parallel_for(0, total, std::max<int64_t>(kSpanBlocks, 32768 / BS), [&](int64_t lo, int64_t hi) {
    const cpd::BlockSpec B = J.b;
    const cpd::Format el = B.el;
    u32 sb[kSpanBlocks];
    float invs[kSpanBlocks], ds[kSpanBlocks];
    uint8_t cbuf[ENC ? kSpanBlocks * BS : 1];
    const u32* xu = reinterpret_cast<const u32*>(x);
    for (int64_t k0 = lo; k0 < hi; k0 += kSpanBlocks) {
      const int64_t kn = std::min(kSpanBlocks, hi - k0);
      const u32* xs = xu + k0 * BS;
      u32 bad = 0;
      for (int64_t k = 0; k < kn; ++k) {  // pass 1: the scales
        u32 amax = 0;
        for (int64_t i = 0; i < BS; ++i) amax = std::max(amax, xs[k * BS + i] & ~cpd::SIGN);
        const u32 s = cpd::block_scale_bits(amax, B);
        const u32 nan = (u32)(s > cpd::INF_BITS);
        bad |= nan;
        sb[k] = s;
        ds[k] = cpd::block_divisor(s, B);
        invs[k] = POW2 ? (nan ? 1.0f : cpd::block_inverse(s)) : ds[k];
        if (ENC) scodes[k0 + k] = (uint8_t)cpd::encode_value_bits(s, B.sc);
      }
      float* ys = ENC ? nullptr : y + k0 * BS;
      const u32 inexact = span_elements<MODE, POW2, ENC, BS>(xs, kn, invs, ds, el, B.is_int, ys, cbuf);
      if (bad | inexact) {  // rare: NaN/inf blocks, and blocks with products below float32's normals
        for (int64_t k = 0; k < kn; ++k) {
          for (int64_t i = 0; i < BS; ++i) {
            u32 p = 0u;
            if (sb[k] > cpd::INF_BITS) p = 0u;
            else if (POW2) p = cpd::block_elem_pow2(xs[k * BS + i], invs[k], B, MODE, 0u, 32);
            else continue;
            if (ENC) cbuf[k * BS + i] = sb[k] > cpd::INF_BITS ? zero_code : (uint8_t)cpd::block_elem_code<true>(p, B);
            else ys[k * BS + i] = sb[k] > cpd::INF_BITS ? cpd::float_of(cpd::QNAN_BITS) : cpd::fmul(cpd::float_of(p), ds[k]);
          }
        }
      }
      if (ENC) {  // the span's codes are consecutive: whole rows, block-aligned bytes
        const int64_t e0 = k0 * BS;
        const int64_t off = J.pack == 4 ? e0 / 2 : J.pack == 6 ? e0 / 4 * 3 : e0;
        put_codes(cbuf, kn * BS, J.pack, codes + off);
      }
    }
  });
}

template <int MODE, bool FAST, bool POW2, bool ENC, int BS>
void run(const Job& J, const float* x, float* y, uint8_t* codes, uint8_t* scodes, uint8_t zero_code) {
  if constexpr (BS != 0 && FAST && MODE != cpd::STOCHASTIC) {
#if defined(__AVX2__)
    if (MODE == cpd::NEAREST && J.n % BS == 0 && cpd_mx_avx2::applies(J.b)) {
      const cpd_mx_avx2::Span S{x, y, codes, scodes, J.rows * J.nb, J.pack, zero_code, J.b};
      return cpd_mx_avx2::run<POW2, ENC, BS>(S);
    }
#endif
    if (J.n % BS == 0) return run_spans<MODE, POW2, ENC, BS>(J, x, y, codes, scodes, zero_code);
  }
  const int64_t total = J.rows * J.nb;
  const int64_t grain = std::max<int64_t>(1, 32768 / J.block);
  cpd_cpu::parallel_for(0, total, grain, [&](int64_t lo, int64_t hi) {
    const cpd::BlockSpec B = J.b;
    std::vector<uint8_t> cbuf(ENC ? J.block : 1);
    // Stochastic: the words of `chunk` blocks at a time (block k's are those of elements
    // [k * block, (k + 1) * block) of the padded layout: consecutive blocks, consecutive words).
    const bool sto = (FAST ? MODE : J.mode) == cpd::STOCHASTIC;
    const int64_t chunk = std::max<int64_t>(1, 1024 / J.block);
    std::vector<u32> words(sto ? chunk * J.block : 1);
    int64_t wk = lo;
    const bool ragged = J.n % J.block != 0;
    int64_t r = lo / J.nb, blk = lo % J.nb;
    for (int64_t k = lo; k < hi; ++k) {
      if (sto && (k == lo || k == wk + chunk)) {
        wk = k;
        fill_words((u64)k * (u64)J.block, std::min(chunk, hi - k) * J.block, J.seed, J.offset, words.data());
      }
      u32* wb = words.data() + (sto ? (k - wk) * J.block : 0);
      if (BS && !(ragged && blk == J.nb - 1))
        one_block<MODE, FAST, POW2, ENC, BS>(J, B, r, blk, x, y, codes, scodes, cbuf.data(), wb, zero_code);
      else
        one_block<MODE, FAST, POW2, ENC, 0>(J, B, r, blk, x, y, codes, scodes, cbuf.data(), wb, zero_code);
      if (++blk == J.nb) blk = 0, ++r;
    }
  });
}

template <bool FAST, bool POW2, bool ENC>
void run_mode(const Job& J, const float* x, float* y, uint8_t* codes, uint8_t* scodes, uint8_t zc) {
  if (!FAST) return run<0, false, POW2, ENC, 0>(J, x, y, codes, scodes, zc);  // run-time mode
  switch (J.mode) {
    case cpd::NEAREST:  // the hot case: MX's 32 and NVFP4's 16 as compile-time block sizes
      if (J.block == 32) return run<cpd::NEAREST, FAST, POW2, ENC, 32>(J, x, y, codes, scodes, zc);
      if (J.block == 16) return run<cpd::NEAREST, FAST, POW2, ENC, 16>(J, x, y, codes, scodes, zc);
      return run<cpd::NEAREST, FAST, POW2, ENC, 0>(J, x, y, codes, scodes, zc);
    case cpd::STOCHASTIC: return run<cpd::STOCHASTIC, FAST, POW2, ENC, 0>(J, x, y, codes, scodes, zc);
    case cpd::TOWARD_ZERO: return run<cpd::TOWARD_ZERO, FAST, POW2, ENC, 0>(J, x, y, codes, scodes, zc);
    case cpd::UP: return run<cpd::UP, FAST, POW2, ENC, 0>(J, x, y, codes, scodes, zc);
    case cpd::DOWN: return run<cpd::DOWN, FAST, POW2, ENC, 0>(J, x, y, codes, scodes, zc);
    case cpd::NEAREST_AWAY: return run<cpd::NEAREST_AWAY, FAST, POW2, ENC, 0>(J, x, y, codes, scodes, zc);
    case cpd::ODD: return run<cpd::ODD, FAST, POW2, ENC, 0>(J, x, y, codes, scodes, zc);
    default: TORCH_CHECK(false, "cpd_mx: unknown rounding mode ", J.mode);
  }
}

template <bool ENC>
void dispatch(const Job& J, const float* x, float* y, uint8_t* codes, uint8_t* scodes) {
  // The code of an element +0 (padding, and the elements of a NaN block).
  const uint8_t zc = (uint8_t)cpd::block_elem_code<false>(cpd::block_elem_amax<false>(0u, 1.0f, J.b, 0, 0u, 32), J.b);
  const bool pow2 = J.b.rule != cpd::RULE_AMAX;
  if (J.b.el.fast) {
    if (pow2) run_mode<true, true, ENC>(J, x, y, codes, scodes, zc);
    else run_mode<true, false, ENC>(J, x, y, codes, scodes, zc);
  } else {
    if (pow2) run_mode<false, true, ENC>(J, x, y, codes, scodes, zc);
    else run_mode<false, false, ENC>(J, x, y, codes, scodes, zc);
  }
}

Job job_of(const at::Tensor& x, at::IntArrayRef el, at::IntArrayRef sc, int64_t rule, bool is_int, int64_t block,
           double t, int64_t mode, int64_t seed, int64_t offset, int64_t pack) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(),
              "cpd_mx: x must be a contiguous 2-d float32 CPU tensor");
  TORCH_CHECK(block >= 1, "cpd_mx: block must be >= 1, got ", block);
  TORCH_CHECK(mode >= 0 && mode <= 6, "cpd_mx: unknown rounding mode ", mode);
  TORCH_CHECK(pack == 0 || (pack == 4 && block % 2 == 0) || (pack == 6 && block % 4 == 0),
              "cpd_mx: pack must be 0, 4 (even block) or 6 (block a multiple of 4), got ", pack);
  Job J;
  J.b = spec_of(el, sc, rule, is_int, t);
  J.rows = x.size(0);
  J.n = x.size(1);
  J.block = block;
  J.nb = (J.n + block - 1) / block;
  J.L = J.nb * block;
  J.mode = (int)mode;
  J.seed = (u64)seed;
  J.offset = (u64)offset;
  J.pack = (int)pack;
  J.row_bytes = row_bytes_of(J.L, J.pack);
  return J;
}

}  // namespace

// The fake-quantized x (rows, n): decode(encode(x)) in one pass.
// out: a contiguous float32 tensor of x's numel to write into, or an undefined tensor (None).
at::Tensor mx_cast(const at::Tensor& x, at::IntArrayRef el, at::IntArrayRef sc, int64_t rule, bool is_int,
                      int64_t block, double t, int64_t mode, int64_t seed, int64_t offset,
                      const std::optional<at::Tensor>& out) {
  const Job J = job_of(x, el, sc, rule, is_int, block, t, mode, seed, offset, 0);
  at::Tensor y;
  if (out.has_value() && out->defined()) {
    TORCH_CHECK(out->scalar_type() == at::kFloat && out->is_contiguous() && out->numel() == x.numel() &&
                out->device().is_cpu(), "cpd_mx: out must be a contiguous float32 CPU tensor of x's size");
    y = out->view({J.rows, J.n});
  } else {
    y = at::empty_like(x);
    cpd_cpu::advise_huge(y.data_ptr(), y.numel() * (int64_t)sizeof(float));
  }
  if (J.rows * J.n) dispatch<false>(J, x.data_ptr<float>(), y.data_ptr<float>(), nullptr, nullptr);
  return y;
}

// (codes (rows, row bytes) uint8, scale codes (rows, nblocks) uint8).
std::tuple<at::Tensor, at::Tensor> mx_encode(const at::Tensor& x, at::IntArrayRef el, at::IntArrayRef sc,
                                                   int64_t rule, bool is_int, int64_t block, double t, int64_t mode,
                                                   int64_t seed, int64_t offset, int64_t pack) {
  const Job J = job_of(x, el, sc, rule, is_int, block, t, mode, seed, offset, pack);
  auto opts = at::TensorOptions().dtype(at::kByte);
  auto codes = at::empty({J.rows, J.n ? J.row_bytes : 0}, opts);
  auto scodes = at::empty({J.rows, J.nb}, opts);
  cpd_cpu::advise_huge(codes.data_ptr(), codes.numel());
  if (J.rows * J.n)
    dispatch<true>(J, x.data_ptr<float>(), nullptr, codes.data_ptr<uint8_t>(), scodes.data_ptr<uint8_t>());
  return {codes, scodes};
}

// codes (rows, row bytes) + scale codes (rows, nblocks) -> float32 (rows, n).
at::Tensor mx_decode(const at::Tensor& codes, const at::Tensor& scodes, at::IntArrayRef el,
                        at::IntArrayRef sc, bool is_int, int64_t block, double t, int64_t n, int64_t pack) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && scodes.scalar_type() == at::kByte && codes.dim() == 2 &&
              scodes.dim() == 2 && codes.is_contiguous() && scodes.is_contiguous(),
              "cpd_mx: codes and scales must be contiguous 2-d uint8 tensors");
  TORCH_CHECK(block >= 1 && n >= 0 && (pack == 0 || pack == 4 || pack == 6), "cpd_mx: bad block, n or pack");
  const cpd::BlockSpec B = spec_of(el, sc, 0, is_int, t);
  const int64_t rows = codes.size(0), nb = (n + block - 1) / block, L = nb * block;
  TORCH_CHECK(scodes.size(0) == rows && scodes.size(1) == nb && codes.size(1) >= (n ? row_bytes_of(L, (int)pack) : 0),
              "cpd_mx: codes / scales do not match n = ", n, " and block = ", block);
  auto y = at::empty({rows, n}, at::TensorOptions().dtype(at::kFloat));
  if (rows * n == 0) return y;
  cpd_cpu::advise_huge(y.data_ptr(), y.numel() * (int64_t)sizeof(float));
  float table[256];
  for (u32 c = 0; c < 256; ++c) table[c] = cpd::float_of(cpd::block_elem_value(c, B));
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const uint8_t* sp = scodes.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t rb = codes.size(1);
  cpd_cpu::parallel_for(0, rows * nb, std::max<int64_t>(1, 32768 / block), [&](int64_t lo, int64_t hi) {
    const float* __restrict tab = table;
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t r = k / nb, blk = k % nb, j0 = blk * block, m = std::min(block, n - j0);
      const float d = cpd::block_divisor(cpd::decode_bits(sp[k], B.sc), B);
      const uint8_t* __restrict row = cp + r * rb;
      float* __restrict yb = yp + r * n + j0;
      if (pack == 4) {
        for (int64_t i = 0; i < m; ++i) {
          const int64_t j = j0 + i;
          yb[i] = cpd::fmul(tab[(row[j >> 1] >> (4 * (j & 1))) & 15u], d);
        }
      } else if (pack == 6) {
        for (int64_t i = 0; i < m; ++i) {
          const int64_t j = j0 + i, g = 3 * (j >> 2);
          const u32 w = row[g] | (row[g + 1] << 8) | ((u32)row[g + 2] << 16);
          yb[i] = cpd::fmul(tab[(w >> (6 * (j & 3))) & 63u], d);
        }
      } else {
        for (int64_t i = 0; i < m; ++i) yb[i] = cpd::fmul(tab[row[j0 + i]], d);
      }
    }
  });
  return y;
}

// The library's name (a development build may load a second copy under another name).
#ifndef CPD_MX_LIBRARY
#define CPD_MX_LIBRARY cpd_mx_cpu
#endif
#define CPD_MX_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
CPD_MX_TORCH_LIBRARY(CPD_MX_LIBRARY, m) {
  m.def("mx_cast", &mx_cast);
  m.def("mx_encode", &mx_encode);
  m.def("mx_decode", &mx_decode);
}
