// Fused wire kernels of cpd.distributed (CPU): one compiled pass per step of the gradient exchange.
//
//   wire_encode    bucket -> wire bytes: scale by 2^s (in double, as cpd.scaling does), cast to the
//                  format, encode, pack (sub-byte codes), for a list of segments (chunk c of
//                  every layer), in one pass;
//   wire_hop       one ring hop: decode the received codes, add exactly in the format into my
//                  accumulator chunk (in place, optionally Kahan-compensated), leave the codes I
//                  send next; no float32 temporaries;
//   wire_decode    wire bytes -> float32: decode, unscale (/ 2^s in double), optionally * (1/W),
//                  scattered back to the layers' positions;
//   wire_absmax    per-layer max |x| (NaN wins) for the APS exponent exchange.
//
// Every value is computed by the numerics core (cpd/numerics.h: cast_bits, add_bits,
// encode_value_bits, decode_bits); the hop of a format of <= 8 bits is a float32 add rounded once
// to the format (fast_hop: codes decoded through a table, or through their binary16 views in
// hop_avx2.h's AVX2 + F16C path) or reads a table of add_bits over every pair of codes (built
// once per format, rounding mode and saturate flag, by those same functions), a byte gather; the
// hop of a 9..31-bit format (bf16, fp16, TF32, ...) is the same float32 add rounded once (wide_hop, exact
// by cpd::add_f32_applies to nearest, by cpd::sum_f32_directed's correction in the directed
// modes), blocks with an inf/NaN sum through add_bits; the Kahan hop of those formats and modes
// runs in float32 lanes (kahan_lanes). The result equals cpd.add / cpd.encode / cpd.decode bit
// for bit (tests/test_wire_kernels.py checks every pair of 8-bit codes on every path).
//
// Wire layout (that of cpd.distributed.pack_codes): 8-bit codes one per byte; 1..7-bit codes as
// a bit stream (low bits first, or high bits first with msb=true); 9..16-bit codes as int16,
// wider codes as int32, FP32 ("raw32") as the float32 bits. A call's first element starts at
// byte 0, and the kernels split work at multiples of 8 elements, so every thread owns whole bytes.
//
// Registered as torch.ops.cpd_wire.* (cpd/distributed/kernels.py wraps them). The ops release
// the GIL (the communication thread runs them while backward goes on).
// Python.h first (the GIL is released around the wire loops), then light torch headers
// (torch/extension.h takes about 30 s of CPU to parse per source file).
#include <Python.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "cpd/numerics.h"
#include "fp_env.h"
#include "hop_avx2.h"  // the AVX2 + F16C path of the 8-bit hop
#include "parallel.h"  // cpd_cpu::parallel_for: threaded with or without OpenMP

namespace {

using cpd::u32;
constexpr int64_t kBlock = 2048;  // elements per unit of work: a multiple of 8 (whole bytes)

// How one format travels.
struct Wire {
  cpd::Format f;   // the format with the caller's saturate flag (casts and sums)
  cpd::Format fe;  // the same without saturate: what cpd.encode does on the wire
  int mode;
  int bits;        // code width (32 for raw32)
  bool msb;        // sub-byte codes: high bits first
  bool raw32;      // float32 bits on the wire (cpd.FP32)
  u32 has_nan;
  int saturate;
};

// Releases the GIL for the duration of a kernel when the caller holds it (torch.ops may already
// have released it).
struct NoGil {
  PyThreadState* st = nullptr;
  NoGil() {
    if (PyGILState_Check()) st = PyEval_SaveThread();
  }
  ~NoGil() {
    if (st) PyEval_RestoreThread(st);
  }
};

Wire make_wire(int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals, int64_t mode, bool saturate,
               int64_t bits, bool msb, bool raw32) {
  TORCH_CHECK(bits >= 1 && bits <= 32, "cpd_wire: bits must be in 1..32, got ", bits);
  TORCH_CHECK(mode != cpd::STOCHASTIC, "cpd_wire: stochastic rounding cannot be reproduced across processes");
  Wire w;
  w.f = cpd::make_format((int)exp, (int)man, (int)bias, (int)specials, subnormals ? 1 : 0, saturate ? 1 : 0);
  w.fe = cpd::make_format((int)exp, (int)man, (int)bias, (int)specials, subnormals ? 1 : 0, 0);
  w.mode = (int)mode;
  w.bits = raw32 ? 32 : (int)bits;
  w.msb = msb;
  w.raw32 = raw32;
  w.has_nan = (u32)(w.fe.nan_code != 0);
  w.saturate = saturate ? 1 : 0;
  return w;
}

// The code that travels for a value v of the format (float32 bits): cpd::wire_code_bits.
inline u32 code_of_value(u32 v, const Wire& w) { return w.raw32 ? v : cpd::wire_code_bits(v, w.fe); }

inline u32 value_of_code(u32 c, const Wire& w) { return w.raw32 ? c : cpd::decode_bits(c, w.fe); }

// Bytes of n codes as stored (WireFormat.nbytes, hop.cu's nbytes_of): a packed bit stream up to 8
// bits, int16 up to 16, int32 beyond.
inline int64_t nbytes_of(int64_t n, int bits) { return bits <= 8 ? (n * bits + 7) / 8 : n * (bits <= 16 ? 2 : 4); }

// Formats that share float32's exponent field (exp 8, bias 127, IEEE specials, subnormals:
// bfloat16, TF32 = (8, 10), ...): a code's value is the code shifted into float32's bits,
//     value bits = code << (23 - man)     (sign, exponent field and fraction land in place;
// a field-0 code is float32's subnormal of the same fraction, field 255 its inf or a NaN), so the
// wider codes (no table of 2^bits values) decode with one shift each.
inline bool shift_view(const cpd::Format& f) {
  return f.is_signed && !f.uz && !f.no_zero && f.subnormals && f.specials == cpd::SPECIALS_IEEE && f.exp == 8 &&
         f.bias == 127;
}

// The float32 values of m codes (u32, any width) into v: by the shift view where it applies, else
// decode_bits per code.
inline void values_of_codes(const u32* __restrict c, int64_t m, const Wire& w, bool shift, float* __restrict v) {
  if (shift) {
    const u32 sh = 23u - (u32)w.fe.man;
    for (int64_t i = 0; i < m; ++i) v[i] = cpd::float_of(c[i] << sh);
  } else {
    for (int64_t i = 0; i < m; ++i) v[i] = cpd::float_of(value_of_code(c[i], w));
  }
}

// ---- code I/O: m codes starting at element e0 (a multiple of 8) of a byte stream
void load_codes(const uint8_t* in, int64_t e0, int64_t m, const Wire& w, u32* __restrict codes) {
  const int b = w.bits;
  if (b == 8) {
    for (int64_t i = 0; i < m; ++i) codes[i] = in[e0 + i];
  } else if (b == 4 && !w.msb) {  // two codes per byte, low nibble first
    const uint8_t* __restrict p = in + e0 / 2;
    for (int64_t k = 0; k < m / 2; ++k) {
      codes[2 * k] = p[k] & 15u;
      codes[2 * k + 1] = p[k] >> 4;
    }
    if (m & 1) codes[m - 1] = p[m / 2] & 15u;
  } else if (b > 8) {
    const int sz = b <= 16 ? 2 : 4;
    const uint8_t* p = in + e0 * sz;
    if (sz == 2) {
      for (int64_t i = 0; i < m; ++i) { uint16_t t; std::memcpy(&t, p + 2 * i, 2); codes[i] = t; }
    } else {
      for (int64_t i = 0; i < m; ++i) { uint32_t t; std::memcpy(&t, p + 4 * i, 4); codes[i] = t; }
    }
  } else {
    const uint8_t* p = in + e0 * b / 8;
    const u32 mask = (1u << b) - 1u;
    uint64_t acc = 0;
    int have = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (have < b) {
        acc = w.msb ? (acc << 8) | *p++ : acc | ((uint64_t)*p++ << have);
        have += 8;
      }
      if (w.msb) {
        codes[i] = (u32)(acc >> (have - b)) & mask;
      } else {
        codes[i] = (u32)acc & mask;
        acc >>= b;
      }
      have -= b;
    }
  }
}

void store_codes(uint8_t* out, int64_t e0, int64_t m, const Wire& w, const u32* __restrict codes) {
  const int b = w.bits;
  if (b == 8) {
    for (int64_t i = 0; i < m; ++i) out[e0 + i] = (uint8_t)codes[i];
  } else if (b == 4 && !w.msb) {  // two codes per byte, low nibble first; an odd tail pads with 0
    uint8_t* __restrict p = out + e0 / 2;
    for (int64_t k = 0; k < m / 2; ++k) p[k] = (uint8_t)(codes[2 * k] | (codes[2 * k + 1] << 4));
    if (m & 1) p[m / 2] = (uint8_t)codes[m - 1];
  } else if (b > 8) {
    const int sz = b <= 16 ? 2 : 4;
    uint8_t* p = out + e0 * sz;
    if (sz == 2) {
      for (int64_t i = 0; i < m; ++i) { uint16_t t = (uint16_t)codes[i]; std::memcpy(p + 2 * i, &t, 2); }
    } else {
      for (int64_t i = 0; i < m; ++i) std::memcpy(p + 4 * i, &codes[i], 4);
    }
  } else {
    uint8_t* p = out + e0 * b / 8;
    uint64_t acc = 0;
    int have = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (w.msb) acc = (acc << b) | codes[i];
      else acc |= (uint64_t)codes[i] << have;
      have += b;
      while (have >= 8) {
        if (w.msb) { *p++ = (uint8_t)(acc >> (have - 8)); }
        else { *p++ = (uint8_t)acc; acc >>= 8; }
        have -= 8;
      }
    }
    if (have) *p = w.msb ? (uint8_t)(acc << (8 - have)) : (uint8_t)acc;  // zero padding
  }
}

// ---- tables of the <= 8-bit formats, built once from the numerics core
struct Tables {
  std::vector<uint8_t> add;   // add[(a << bits) | b] = code of add_bits(decode a, decode b)
  std::vector<uint8_t> bytes; // bits in {1, 2, 4, 8}: the same on whole bytes, [(x << 8) | y]
};

std::mutex g_tables_lock;
std::map<std::tuple<int, int, int, int, int, int, int, int>, std::shared_ptr<const Tables>> g_tables;

std::shared_ptr<const Tables> tables_of(const Wire& w) {
  auto key = std::make_tuple(w.fe.exp, w.fe.man, w.fe.bias, w.fe.specials, w.fe.subnormals, w.saturate,
                             w.mode, w.bits);
  std::lock_guard<std::mutex> g(g_tables_lock);
  auto it = g_tables.find(key);
  if (it != g_tables.end()) return it->second;
  cpd_cpu::KeepSubnormals keep;  // a table built on a flushing thread would be cached wrong (fp_env.h)
  auto t = std::make_shared<Tables>();
  const int b = w.bits, k = 1 << b;
  t->add.resize((size_t)k * k);
  for (int a = 0; a < k; ++a) {
    const u32 va = value_of_code((u32)a, w);
    for (int c = 0; c < k; ++c)
      t->add[((size_t)a << b) | c] = (uint8_t)code_of_value(cpd::add_bits(va, value_of_code((u32)c, w), w.f, w.mode, 0u, 32), w);
  }
  if (8 % b == 0) {
    t->bytes.resize(65536);
    const u32 mask = (u32)k - 1u;
    for (u32 x = 0; x < 256; ++x)
      for (u32 y = 0; y < 256; ++y) {
        u32 o = 0;
        for (int s = 0; s < 8; s += b) o |= (u32)t->add[(((x >> s) & mask) << b) | ((y >> s) & mask)] << s;
        t->bytes[(x << 8) | y] = (uint8_t)o;
      }
  }
  g_tables[key] = t;
  return t;
}

// ---- the fast hop of an 8-bit format: decode, add in float32, round once and encode
// The pair table above is 64 KiB, which misses L1 when the codes are spread. Instead: decode each
// code through a 256-entry float32 table (1 KiB, built by decode_bits), add in float32, and round
// that sum once to the format, reading its code off the rounding (cpd::cast_code_fast): every
// step a vector lane. The float32 sum is the exact sum rounded once to 24 bits, or exact:
//   nearest:  rounding the sum of two values of a format of q <= 11 significant bits first to
//             float32 (24 >= 2q + 2 bits) and then to the format equals rounding it once
//             (Figueroa, "When is double rounding innocuous?", 1995; cpd::add_fast_applies);
//   directed: the float32 sum is exact when every sum of two values fits 24 bits: values are
//             multiples of 2^(emin - man) below 2^(emax + 1), so sums are multiples of it below
//             2^(emax + 2): emax + 2 - (emin - man) <= 24 (e4m3: 19 bits; e5m2 does not qualify).
//             Then the one rounding is the cast of the exact sum. Only the sign of an exact zero
//             differs from float32's: rounding down, x + (-x) is -0 (add_bits' zero_sum_sign).
// A block with an infinite or NaN sum (an operand was inf or NaN) is redone through the pair
// table (add_bits and wire_code_bits of every pair, built on first need). Narrower codes keep the
// tables: 1, 2 and 4 bits gather whole bytes, the others' pair tables are at most 16 KiB.
// tests/test_wire_kernels.py checks every pair of codes against cpd.add.
// Where AVX2 and F16C are compiled in, the formats of cpd::half_view_applies (8-bit, exp <= 5:
// e4m3, e5m2, e4m3fn, ...) decode codes 8 per F16C conversion and round 8 lanes per step instead
// (cuda/cpu/hop_avx2.h); the loop below takes the elements past the last multiple of 32.
// CPD_WIRE_HOP=table forces the pair tables, CPD_WIRE_HOP=scalar this loop without the AVX2 path
// (for side-by-side timing in benchmarks/bench_wire.py, and for the tests of both paths).
enum { HOP_AUTO = 0, HOP_TABLE = 1, HOP_SCALAR = 2 };
int hop_env() {
  const char* e = std::getenv("CPD_WIRE_HOP");
  if (!e) return HOP_AUTO;
  return std::strcmp(e, "table") == 0 ? HOP_TABLE : std::strcmp(e, "scalar") == 0 ? HOP_SCALAR : HOP_AUTO;
}

int fast_hop_applies(const Wire& w) {
  if (w.raw32 || w.bits != 8 || !cpd::cast_code_applies(w.f) || w.f.man > 10) return 0;
  if (w.mode == cpd::NEAREST) return cpd::add_fast_applies(w.f, w.mode);
  const int emax = (int)(w.f.max_bits >> 23) - 127;
  return (int)((w.mode == cpd::TOWARD_ZERO || w.mode == cpd::UP || w.mode == cpd::DOWN) &&
               emax + 2 - (w.f.emin - w.f.man) <= 24);
}

template <int MODE>
CPD_FN u32 fast_hop_code(float x, float y, const cpd::Format& g, u32& special) {
  u32 s = cpd::bits_of(cpd::fadd(x, y));
  if (MODE == cpd::DOWN) s = cpd::sel((u32)(s == 0u), (cpd::bits_of(x) | cpd::bits_of(y)) & cpd::SIGN, s);
  special |= (u32)((s & ~cpd::SIGN) >= cpd::INF_BITS);
  return cpd::cast_code_fast(s, g, MODE);
}

// m codes of 8 bits (r, a) -> out; returns nonzero when a sum is infinite or NaN.
template <int MODE>
u32 fast_hop_bytes(const uint8_t* __restrict r, const uint8_t* __restrict a, uint8_t* __restrict out, int64_t m,
                   const float* __restrict dec, const cpd::Format g) {
  u32 special = 0;
  for (int64_t i = 0; i < m; ++i) out[i] = (uint8_t)fast_hop_code<MODE>(dec[r[i]], dec[a[i]], g, special);
  return special;
}

// Prefetch the bytes of a block of codes (RW 1: to be written): the received bytes of a
// hop or a decode were just written by gloo's socket thread, often on another core, and the
// hardware prefetchers do not run ahead of that transfer. The loops below ask for the block kAhead
// blocks ahead of the one they work on. Measured on the 2-core Intel machine (a hop of 590K e4m3
// codes, the size of the benchmark MLP's sub-chunks, medians of 41): written on the other core
// 0.36-0.39 -> 0.29-0.32 ms, on the same core 0.25 -> 0.25-0.26 ms; the benchmark's step at
// 10 Gbit/s moved less than its run-to-run spread. Only a hint: no result depends on it. The empty
// asm statement keeps the loop: GCC 12 takes a loop of nothing but prefetches for one without
// effects and deletes it (tests/test_cpu_build.py checks that the library has prefetches).
// prefetch_block<RW>(p, k, b1, bits): block k + kAhead of p, when the range of blocks [.., b1)
// working on block k holds it.
constexpr int64_t kAhead = 4;
template <int RW>
inline void prefetch_block(const uint8_t* p, int64_t k, int64_t b1, int64_t bits) {
  if (k + kAhead >= b1) return;
  const int64_t e = (k + kAhead) * kBlock, hi = nbytes_of(e + kBlock, (int)bits);
  for (int64_t i = nbytes_of(e, (int)bits); i < hi; i += 64) {
    __builtin_prefetch(p + i, RW, 3);
    asm volatile("" : : "r"(p + i));
  }
}

// A hop's two operands: the received bytes r and the accumulator a (written).
inline void prefetch_ahead(const uint8_t* r, const uint8_t* a, int64_t k, int64_t b1, int64_t bits) {
  prefetch_block<0>(r, k, b1, bits);
  prefetch_block<1>(a, k, b1, bits);
}

template <int MODE>
void fast_hop_mode(const uint8_t* rp, uint8_t* ap, int64_t n, const Wire& w, const float* dec, bool vec) {
#if CPD_HOP_AVX2
  const std::unique_ptr<cpd_hop_avx2::Consts> vc(vec ? new cpd_hop_avx2::Consts(w.f) : nullptr);
#else
  (void)vec;
#endif
  cpd_cpu::parallel_for(0, (n + kBlock - 1) / kBlock, 4, [&](int64_t b0, int64_t b1) {
    std::shared_ptr<const Tables> tab;
    alignas(32) uint8_t out[kBlock];
    std::unique_ptr<float[]> buf;  // directed modes' float32 sums (cpd_hop_avx2::hop_directed)
    for (int64_t k = b0; k < b1; ++k) {
      const int64_t e0 = k * kBlock, m = std::min(n, e0 + kBlock) - e0;
      prefetch_ahead(rp, ap, k, b1, 8);
      u32 special = 0;
      int64_t done = 0;
#if CPD_HOP_AVX2
      if (vc) {
        if (MODE == cpd::NEAREST) {
          special = cpd_hop_avx2::hop_nearest(rp + e0, ap + e0, out, m, *vc);
        } else {
          if (!buf) buf.reset(new float[kBlock]);
          special = cpd_hop_avx2::hop_directed<MODE>(rp + e0, ap + e0, out, m, *vc, w.f, buf.get());
        }
        done = m - m % 32;
      }
#endif
      if (!special && done < m) special = fast_hop_bytes<MODE>(rp + e0 + done, ap + e0 + done, out + done, m - done, dec, w.f);
      if (!special) {
        std::memcpy(ap + e0, out, m);
        continue;
      }
      if (!tab) tab = tables_of(w);  // an inf or NaN operand (or field 31) in this block: the pair table
      const uint8_t* __restrict t = tab->add.data();
      for (int64_t i = 0; i < m; ++i) ap[e0 + i] = t[((u32)rp[e0 + i] << 8) | ap[e0 + i]];
    }
  });
}

// vec: the AVX2 + F16C path (cpd_hop_avx2::applies(w.f, w.mode) holds).
void fast_hop(const uint8_t* rp, uint8_t* ap, int64_t n, const Wire& w, bool vec) {
  float dec[256];
  for (u32 c = 0; c < 256; ++c) dec[c] = cpd::float_of(value_of_code(c, w));
  switch (w.mode) {
    case cpd::NEAREST: fast_hop_mode<cpd::NEAREST>(rp, ap, n, w, dec, vec); break;
    case cpd::TOWARD_ZERO: fast_hop_mode<cpd::TOWARD_ZERO>(rp, ap, n, w, dec, vec); break;
    case cpd::UP: fast_hop_mode<cpd::UP>(rp, ap, n, w, dec, vec); break;
    default: fast_hop_mode<cpd::DOWN>(rp, ap, n, w, dec, vec); break;
  }
}

// ---- the hop of an exact per-element block (the Kahan-free add_bits path): m elements from e0
// (cr, ca: scratch of m codes each)
void exact_hop_block(const uint8_t* rp, uint8_t* ap, int64_t e0, int64_t m, const Wire& w, u32* cr, u32* ca) {
  load_codes(rp, e0, m, w, cr);
  load_codes(ap, e0, m, w, ca);
  for (int64_t i = 0; i < m; ++i)
    ca[i] = code_of_value(cpd::add_bits(value_of_code(cr[i], w), value_of_code(ca[i], w), w.f, w.mode, 0u, 32), w);
  store_codes(ap, e0, m, w, ca);
}

// ---- the wide hop: 9..31-bit codes (int16 / int32 on the wire: bf16, fp16, TF32, ...), deterministic modes
// As fast_hop: decode, add in float32, round the float32 sum once to the format and read its code
// off the rounding (cpd::cast_code_fast). Exact by cpd::add_f32_applies (arith.h): to nearest,
// the float32 sum of two values of <= 11 significant bits rounded once to the format equals their
// exact sum rounded once (Figueroa 1995: 24 >= 2 * 11 + 2); a sum below the format's 2^(emin + 1)
// is exact in float32, bfloat16's float32 subnormals included; an overflow the float32 sum still
// holds is the cast's overflow (inf, NaN or saturation, as add_bits). What that identity leaves
// out goes through add_bits (exact_hop_block), a block at a time:
//   a block with an inf or NaN float32 sum (an inf/NaN operand, or a finite sum past float32's
//   range: bfloat16's max + max), so the wire's NaN rule and saturation are add_bits' own;
//   every block, for formats whose values or sums reach float32 subnormals (bfloat16:
//   cpd::add_f32_needs_subnormals), while this thread's float32 unit flushes them (FTZ/DAZ, e.g.
//   torch.set_flush_denormal(True)), checked per block.
// Directed modes (the float32 sum of two fp16 values may need up to 41 bits, so it is not the
// exact sum): the same loop on the float32 bits of cpd::sum_f32_directed (arith.h: TwoSum's error
// term moves the float32 sum one step the way the mode rounds when the exact sum lies that way;
// rounding those bits once is rounding the exact sum once). Both operands are decoded whole
// first, then summed (cpd::sum_f32_bits), except to nearest through a vector view (wide_sums:
// decode and add in one pass).
// Decode: bfloat16 and IEEE binary16 through their float32 and binary16 views 8 codes per step
// where AVX2 + F16C are compiled in (cpd_hop_avx2::wide_sums, wide_decode), other formats
// (and CPD_WIRE_HOP=scalar) through a table of the 2^16 codes' values (decode_bits, built once per
// format); the encode is a plain loop of cast_code_fast (GCC vectorizes it). Blocks are
// independent: the result does not depend on the thread count.
// 17..31-bit codes (int32 on the wire: TF32 = (8, 10) is 19 bits) take the same loop without a
// table (wide32_hop_mode): their values by the shift view (float32's exponent field: one shift per
// code), else decode_bits. So does float32 itself (cpd.FP32: the fp32_layers and the hybrid
// phase), whose add_bits is float32's own sum in the mode: to nearest the float32 sum, in the
// directed modes sum_f32_directed's bits (TwoSum moves the sum one float32 step the way the mode
// rounds; nothing to cast after), non-finite sums through add_bits (saturate, the NaN rule).
int wide_hop_applies(const Wire& w) {
  if (w.raw32)  // float32 on the wire (cpd.FP32: fp32_layers, the hybrid phase): the sums' bits themselves
    return cpd::wire_lanes_apply(w.f, w.mode, 1);
  return (int)(w.bits > 8 && cpd::cast_code_applies(w.f) && cpd::wire_lanes_apply(w.f, w.mode, 0));
}

// Which view of hop_avx2.h decodes w's codes (0: none, the table).
int wide_view(const Wire& w) {
  const cpd::Format& f = w.fe;
  if (!(f.is_signed && !f.uz && !f.no_zero && f.subnormals && f.specials == cpd::SPECIALS_IEEE)) return 0;
#if CPD_HOP_AVX2
  if (f.exp == 8 && f.man == 7 && f.bias == 127) return cpd_hop_avx2::WIDE_BF16;
  if (f.exp == 5 && f.man == 10 && f.bias == 15) return cpd_hop_avx2::WIDE_F16;
#endif
  return 0;
}

std::mutex g_decode_lock;
std::map<std::tuple<int, int, int, int, int>, std::shared_ptr<const std::vector<float>>> g_decode;

// The values of the 2^16 int16 codes of w's format (decode_bits masks the unused high bits).
std::shared_ptr<const std::vector<float>> decode_table16(const Wire& w) {
  auto key = std::make_tuple(w.fe.exp, w.fe.man, w.fe.bias, w.fe.specials, w.fe.subnormals);
  std::lock_guard<std::mutex> g(g_decode_lock);
  auto it = g_decode.find(key);
  if (it != g_decode.end()) return it->second;
  cpd_cpu::KeepSubnormals keep;  // as tables_of
  auto t = std::make_shared<std::vector<float>>(65536);
  for (u32 c = 0; c < 65536; ++c) (*t)[c] = cpd::float_of(value_of_code(c, w));
  g_decode[key] = t;
  return t;
}

using cpd_cpu::float32_subnormals_kept;

// The values of m int16 codes at p (byte pointer) into v: through the view, else the table.
inline void wide_values(const uint8_t* __restrict p, int64_t m, int view, const float* __restrict t,
                        float* __restrict v) {
#if CPD_HOP_AVX2
  if (view == cpd_hop_avx2::WIDE_BF16) return cpd_hop_avx2::wide_decode<cpd_hop_avx2::WIDE_BF16>(p, m, v);
  if (view == cpd_hop_avx2::WIDE_F16) return cpd_hop_avx2::wide_decode<cpd_hop_avx2::WIDE_F16>(p, m, v);
#endif
  for (int64_t i = 0; i < m; ++i) {
    uint16_t c;
    std::memcpy(&c, p + 2 * i, 2);
    v[i] = t[c];
  }
}

// The float32 sums of m pairs of int16 codes through the view's vector decode (to nearest); view
// is nonzero only where the AVX2 path is compiled in (wide_view).
inline u32 wide_view_sums(const uint8_t* __restrict r, const uint8_t* __restrict a, int64_t m, int view, u32* sum) {
#if CPD_HOP_AVX2
  if (view == cpd_hop_avx2::WIDE_BF16) return cpd_hop_avx2::wide_sums<cpd_hop_avx2::WIDE_BF16>(r, a, m, sum);
  if (view == cpd_hop_avx2::WIDE_F16) return cpd_hop_avx2::wide_sums<cpd_hop_avx2::WIDE_F16>(r, a, m, sum);
#endif
  (void)r, (void)a, (void)m, (void)view, (void)sum;
  return 1;  // not reached
}

// sum[i] = the bits of cpd::sum_f32_bits(x[i], y[i]) (the wide loops' one float32 sum per pair);
// nonzero when one of them is inf or NaN.
template <int MODE>
inline u32 f32_sums(const float* __restrict x, const float* __restrict y, int64_t m, u32* __restrict sum) {
  u32 special = 0;
  for (int64_t i = 0; i < m; ++i) {
    sum[i] = cpd::sum_f32_bits(x[i], y[i], MODE);
    special |= (u32)((sum[i] & ~cpd::SIGN) >= cpd::INF_BITS);
  }
  return special;
}

template <int MODE>
void wide_hop_mode(const uint8_t* rp, uint8_t* ap, int64_t n, const Wire& w, int view) {
  const auto dec = view ? nullptr : decode_table16(w);
  const float* table = dec ? dec->data() : nullptr;
  const bool need_sub = cpd::add_f32_needs_subnormals(w.f);
  const cpd::Format f = w.f;
  cpd_cpu::parallel_for(0, (n + kBlock - 1) / kBlock, 4, [&](int64_t b0, int64_t b1) {
    alignas(32) u32 sum[kBlock];
    alignas(32) uint16_t out[kBlock];
    alignas(32) float xv[kBlock], yv[kBlock];
    std::unique_ptr<u32[]> scratch;  // exact_hop_block's codes
    const bool view_sums = MODE == cpd::NEAREST && view;  // decode and add in one vector pass
    for (int64_t k = b0; k < b1; ++k) {
      const int64_t e0 = k * kBlock, m = std::min(n, e0 + kBlock) - e0;
      prefetch_ahead(rp, ap, k, b1, w.bits);
      const uint8_t* __restrict r = rp + 2 * e0;
      uint8_t* a = ap + 2 * e0;
      u32 special = (u32)(need_sub && !float32_subnormals_kept());
      if (!special && view_sums) {
        special = wide_view_sums(r, a, m, view, sum);
      } else if (!special) {  // both operands' values, then the bits of cpd::sum_f32_bits
        wide_values(r, m, view, table, xv);
        wide_values(a, m, view, table, yv);
        special = f32_sums<MODE>(xv, yv, m, sum);
      }
      if (!special) {
        for (int64_t i = 0; i < m; ++i) out[i] = (uint16_t)cpd::cast_code_fast(sum[i], f, MODE);
        std::memcpy(a, out, 2 * m);
        continue;
      }
      if (!scratch) scratch.reset(new u32[2 * kBlock]);
      exact_hop_block(rp, ap, e0, m, w, scratch.get(), scratch.get() + kBlock);
    }
  });
}

template <int MODE>
void wide32_hop_mode(const uint8_t* rp, uint8_t* ap, int64_t n, const Wire& w) {
  const bool shift = shift_view(w.fe);
  const bool need_sub = w.raw32 || cpd::add_f32_needs_subnormals(w.f);
  const cpd::Format f = w.f;
  cpd_cpu::parallel_for(0, (n + kBlock - 1) / kBlock, 4, [&](int64_t b0, int64_t b1) {
    std::vector<u32> buf(3 * kBlock);
    u32 *cr = buf.data(), *ca = cr + kBlock, *sum = ca + kBlock;
    std::vector<float> vals(2 * kBlock);
    float *xv = vals.data(), *yv = xv + kBlock;
    for (int64_t k = b0; k < b1; ++k) {
      const int64_t e0 = k * kBlock, m = std::min(n, e0 + kBlock) - e0;
      prefetch_ahead(rp, ap, k, b1, w.bits);
      u32 special = (u32)(need_sub && !float32_subnormals_kept());
      if (!special) {
        load_codes(rp, e0, m, w, cr);
        load_codes(ap, e0, m, w, ca);
        values_of_codes(cr, m, w, shift, xv);
        values_of_codes(ca, m, w, shift, yv);
        special = f32_sums<MODE>(xv, yv, m, sum);
      }
      if (!special) {
        if (w.raw32) std::memcpy(ap + 4 * e0, sum, 4 * m);  // float32: the sums' bits are the codes
        else {
          for (int64_t i = 0; i < m; ++i) ca[i] = cpd::cast_code_fast(sum[i], f, MODE);
          store_codes(ap, e0, m, w, ca);
        }
        continue;
      }
      exact_hop_block(rp, ap, e0, m, w, cr, ca);
    }
  });
}

void wide_hop(const uint8_t* rp, uint8_t* ap, int64_t n, const Wire& w, bool vec) {
  if (w.bits > 16) {
    switch (w.mode) {
      case cpd::NEAREST: return wide32_hop_mode<cpd::NEAREST>(rp, ap, n, w);
      case cpd::TOWARD_ZERO: return wide32_hop_mode<cpd::TOWARD_ZERO>(rp, ap, n, w);
      case cpd::UP: return wide32_hop_mode<cpd::UP>(rp, ap, n, w);
      default: return wide32_hop_mode<cpd::DOWN>(rp, ap, n, w);
    }
  }
  const int view = vec ? wide_view(w) : 0;
  switch (w.mode) {
    case cpd::NEAREST: return wide_hop_mode<cpd::NEAREST>(rp, ap, n, w, view);
    case cpd::TOWARD_ZERO: return wide_hop_mode<cpd::TOWARD_ZERO>(rp, ap, n, w, view);
    case cpd::UP: return wide_hop_mode<cpd::UP>(rp, ap, n, w, view);
    default: return wide_hop_mode<cpd::DOWN>(rp, ap, n, w, view);
  }
}

// Whether a Kahan hop of w runs in float32 lanes (kahan_lanes, below wire_encode).
int kahan_fast_applies(const Wire& w) {
  return (int)(!w.raw32 && cpd::cast_code_applies(w.f) && cpd::wire_lanes_apply(w.f, w.mode, 0));
}

// ---- segments: [k, 3] int64 rows (offset in the float32 tensor, length, scale exponent)
// The loop a hop of w takes under the current CPD_WIRE_HOP (wire_hop runs it, wire_hop_path
// reports it). Plain hops: add_bits per element, the pair tables, the fused scalar loop, the
// fused loop with the AVX2 + F16C path, or the wide loop of 9..31-bit codes (with or without its
// vector decode). Formats of 9..31 bits (deterministic modes): the wide loop (wide_hop), with its
// AVX2 + F16C decode for bfloat16 and binary16 (CPD_WIRE_HOP=scalar: the table decode;
// CPD_WIRE_HOP=table: add_bits, as these formats have no pair table). Kahan hops: the float32
// lanes, or add_bits per element (CPD_WIRE_HOP=table, and the formats the lanes leave).
enum HopLoop {
  LOOP_ADD = 0, LOOP_TABLE = 1, LOOP_FUSED = 2, LOOP_FUSED_AVX2 = 3, LOOP_WIDE = 4, LOOP_WIDE_AVX2 = 5,
  LOOP_KAHAN_LANES = 6
};
int hop_loop(const Wire& w, bool kahan) {
  const int env = hop_env();
  if (kahan) return kahan_fast_applies(w) && env != HOP_TABLE ? LOOP_KAHAN_LANES : LOOP_ADD;
  if (wide_hop_applies(w)) {
    if (env == HOP_TABLE) return LOOP_ADD;
    return env == HOP_AUTO && wide_view(w) ? LOOP_WIDE_AVX2 : LOOP_WIDE;
  }
  if (fast_hop_applies(w) && env != HOP_TABLE)
    return env == HOP_AUTO && cpd_hop_avx2::applies(w.f, w.mode) ? LOOP_FUSED_AVX2 : LOOP_FUSED;
  return w.bits <= 8 && !w.raw32 ? LOOP_TABLE : LOOP_ADD;
}

struct Segs {
  const int64_t* rows;
  int64_t k;
  std::vector<int64_t> start;  // start[j]: first element of segment j in the call's element space
  int64_t total;
};

Segs segs_of(const at::Tensor& segs) {
  TORCH_CHECK(segs.scalar_type() == at::kLong && segs.dim() == 2 && segs.size(1) == 3 && segs.is_contiguous(),
              "cpd_wire: segments must be a contiguous int64 tensor of shape (k, 3)");
  Segs s;
  s.rows = segs.data_ptr<int64_t>();
  s.k = segs.size(0);
  s.start.resize(s.k + 1);
  s.start[0] = 0;
  for (int64_t j = 0; j < s.k; ++j) {
    TORCH_CHECK(s.rows[3 * j + 1] >= 0, "cpd_wire: negative segment length");
    s.start[j + 1] = s.start[j] + s.rows[3 * j + 1];
  }
  s.total = s.start[s.k];
  return s;
}

// Calls fn(segment j, element index inside the segment, call element index e, run length) for the
// runs of [e0, e1) that lie inside one segment.
template <typename F>
void for_runs(const Segs& s, int64_t e0, int64_t e1, F&& fn) {
  int64_t j = std::upper_bound(s.start.begin(), s.start.end(), e0) - s.start.begin() - 1;
  int64_t e = e0;
  while (e < e1) {
    while (s.start[j + 1] <= e) ++j;
    const int64_t run = std::min(e1, s.start[j + 1]) - e;
    fn(j, e - s.start[j], e, run);
    e += run;
  }
}

void check_bytes(const at::Tensor& t, const char* name, int64_t need) {
  TORCH_CHECK(t.scalar_type() == at::kByte && t.is_contiguous() && t.device().is_cpu(), "cpd_wire: ", name,
              " must be a contiguous uint8 CPU tensor");
  TORCH_CHECK(t.numel() >= need, "cpd_wire: ", name, " has ", t.numel(), " bytes, need ", need);
}

// x * 2^s rounded to float32, as (x.double() * 2.0 ** s).to(torch.float32) (s = 0: x itself). For
// -126 <= s <= 127, 2^s is a normal float32 number and the float32 product is the same single
// rounding of the same exact product, so the loop stays in float32 lanes (a subnormal 2^s, s < -126,
// would be exact too, but x86 takes a microcode assist for every multiplication by it: see finish).

// 127 < s <= 254 (bfloat16's APS scales are about 2^130): 2^s is no float32 number, but x * 2^(s -
// 127) * 2^127 in float32 is the same single rounding: scaling up by a power of two is exact
// (a subnormal x included) until it overflows, and an overflow of either product is one of the
// exact product too, to the same infinity. SCALE 3, about 1.5x faster than float64's SCALE 2.
constexpr float kTwo127 = 0x1p127f;

// x * 2^s in float32 lanes (SCALE 0: s = 0; 1: -126 <= s <= 127, pf = 2^s; 3: 127 < s <= 254,
// pf = 2^(s - 127)) or through float64 (2: any s, pd = 2^s).
template <int SCALE>
inline float scaled(float x, float pf, double pd) {
  return SCALE == 0 ? x : SCALE == 1 ? x * pf : SCALE == 3 ? (x * pf) * kTwo127 : (float)((double)x * pd);
}

// Which SCALE serves 2^s.
inline int scale_kind(int64_t s) { return s == 0 ? 0 : s >= -126 && s <= 127 ? 1 : s > 127 && s <= 254 ? 3 : 2; }

// The float32 factor pf of scaled<scale_kind(s)>: 2^s (SCALE 1), 2^(s - 127) (SCALE 3); unused otherwise.
inline float scale_f32(int64_t s) {
  return scale_kind(s) == 3 ? std::ldexp(1.0f, (int)s - 127) : (float)std::ldexp(1.0, (int)s);
}

template <int MODE, bool FAST, int SCALE>  // SCALE: see scaled
void encode_loop(const float* __restrict x, int64_t m, float pf, double pd, const cpd::Format g,
                 u32* __restrict codes, u32& odd) {
  u32 o = 0;
  for (int64_t i = 0; i < m; ++i) {
    const float xs = scaled<SCALE>(x[i], pf, pd);
    const u32 v = FAST ? cpd::cast_bits_fast(cpd::bits_of(xs), g, MODE, 0u, 32)
                       : cpd::cast_bits_generic(cpd::bits_of(xs), g, MODE, 0u, 32);
    o |= (u32)((v & ~cpd::SIGN) > cpd::INF_BITS);  // NaN: encodable unless the format has no NaN code
    codes[i] = FAST ? cpd::encode_value_bits_fast(v, g) : cpd::encode_value_bits(v, g);
  }
  odd |= o;
}

// The same with the code read off the rounding (cpd::cast_code_fast, finite values only): returns
// nonzero when a scaled value is infinite or NaN (the caller then takes encode_loop).
template <int MODE, int SCALE>
u32 code_loop(const float* __restrict x, int64_t m, float pf, double pd, const cpd::Format g, u32* __restrict codes) {
  u32 special = 0;
  for (int64_t i = 0; i < m; ++i) {
    const u32 u = cpd::bits_of(scaled<SCALE>(x[i], pf, pd));
    special |= (u32)((u & ~cpd::SIGN) >= cpd::INF_BITS);
    codes[i] = cpd::cast_code_fast(u, g, MODE);
  }
  return special;
}

// cpd.FP32's codes: x * 2^s's float32 bits (the cast of a finite float32 to float32 is itself; an
// inf or NaN, from x or from an overflow of the scaling, goes through cast_bits: saturate).
template <int SCALE>
void raw32_run(const float* __restrict x, int64_t m, int64_t s, const Wire& w, u32* __restrict codes) {
  const double pd = std::ldexp(1.0, (int)s);
  const float pf = scale_f32(s);
  u32 special = 0;
  for (int64_t i = 0; i < m; ++i) {
    codes[i] = cpd::bits_of(scaled<SCALE>(x[i], pf, pd));
    special |= (u32)((codes[i] & ~cpd::SIGN) >= cpd::INF_BITS);
  }
  if (special)
    for (int64_t i = 0; i < m; ++i)
      if ((codes[i] & ~cpd::SIGN) >= cpd::INF_BITS) codes[i] = cpd::cast_bits(codes[i], w.f, w.mode, 0u, 32);
}

template <int MODE, bool FAST>
void encode_run(const float* __restrict x, int64_t m, int64_t s, const Wire& w, u32* __restrict codes) {
  const cpd::Format g = w.f;
  const double pd = std::ldexp(1.0, (int)s);
  const int kind = scale_kind(s);
  const float pf = scale_f32(s);
  if (FAST && cpd::cast_code_applies(g)) {
    const u32 special = kind == 0 ? code_loop<MODE, 0>(x, m, pf, pd, g, codes)
                      : kind == 1 ? code_loop<MODE, 1>(x, m, pf, pd, g, codes)
                      : kind == 3 ? code_loop<MODE, 3>(x, m, pf, pd, g, codes)
                                  : code_loop<MODE, 2>(x, m, pf, pd, g, codes);
    if (!special) return;
  }
  u32 odd = 0;  // the encoders give inf its code (only IEEE formats, which have one, overflow to inf)
  if (kind == 0) encode_loop<MODE, FAST, 0>(x, m, pf, pd, g, codes, odd);
  else if (kind == 1) encode_loop<MODE, FAST, 1>(x, m, pf, pd, g, codes, odd);
  else if (kind == 3) encode_loop<MODE, FAST, 3>(x, m, pf, pd, g, codes, odd);
  else encode_loop<MODE, FAST, 2>(x, m, pf, pd, g, codes, odd);
  if (odd && !w.has_nan) {  // NaN in a format without a NaN code: the wire's rule, element by element
    for (int64_t i = 0; i < m; ++i) {
      const float xs = s ? (float)((double)x[i] * pd) : x[i];
      codes[i] = code_of_value(cpd::cast_bits(cpd::bits_of(xs), g, MODE, 0u, 32), w);
    }
  }
}

template <bool FAST>
void encode_run_mode(const float* x, int64_t m, int64_t s, const Wire& w, u32* codes) {
  switch (w.mode) {
    case cpd::NEAREST: encode_run<cpd::NEAREST, FAST>(x, m, s, w, codes); break;
    case cpd::TOWARD_ZERO: encode_run<cpd::TOWARD_ZERO, FAST>(x, m, s, w, codes); break;
    case cpd::UP: encode_run<cpd::UP, FAST>(x, m, s, w, codes); break;
    default: encode_run<cpd::DOWN, FAST>(x, m, s, w, codes); break;
  }
}

// The largest magnitude bits of x[0, m) (sign cleared: NaN bits are above inf's, so NaN wins).
inline u32 magnitude_max(const float* __restrict x, int64_t m) {
  const u32* __restrict p = reinterpret_cast<const u32*>(x);
  u32 r = 0;
  for (int64_t i = 0; i < m; ++i) r = std::max(r, p[i] & ~cpd::SIGN);
  return r;
}

inline void atomic_max(std::atomic<u32>& a, u32 v) {
  u32 cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

// out[bytes] <- the wire codes of x[segments] (scaled by 2^s and cast, or raw float32 bits). With a
// non-empty `amax` (float32, one entry per segment) the same pass also writes each segment's
// max |x| of the unscaled values (NaN if any NaN, as wire_absmax): the run is read for its maximum
// just before it is encoded, while it sits in L1, so the bucket is read from memory once for both
// (the exchange's encoding ahead, cpd/distributed/reduce_format.py).
void wire_encode(const at::Tensor& x, const at::Tensor& segs, at::Tensor out, int64_t exp, int64_t man,
                 int64_t bias, int64_t specials, bool subnormals, int64_t mode, bool saturate, int64_t bits, bool msb,
                 bool raw32, at::Tensor amax) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "cpd_wire: x must be a contiguous float32 CPU tensor");
  const Wire w = make_wire(exp, man, bias, specials, subnormals, mode, saturate, bits, msb, raw32);
  const Segs s = segs_of(segs);
  for (int64_t j = 0; j < s.k; ++j)
    TORCH_CHECK(s.rows[3 * j] >= 0 && s.rows[3 * j] + s.rows[3 * j + 1] <= x.numel(), "cpd_wire: segment out of x");
  check_bytes(out, "out", nbytes_of(s.total, w.bits));
  const bool want_max = amax.numel() > 0;
  TORCH_CHECK(!want_max || (amax.scalar_type() == at::kFloat && amax.is_contiguous() && amax.device().is_cpu() &&
                            amax.numel() == s.k),
              "cpd_wire: amax must be empty or a contiguous float32 CPU tensor with one entry per segment");
  std::vector<std::atomic<u32>> maxima(want_max ? s.k : 0);
  for (auto& a : maxima) a.store(0, std::memory_order_relaxed);
  const float* xp = x.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  const int64_t nblocks = (s.total + kBlock - 1) / kBlock;
  // Round to nearest into 8-bit codes of the vector hop's formats: 32 values per step, bytes
  // written directly (hop_avx2.h); a run with an inf/NaN scaled value, or whose scale is not a
  // float32 power of two, takes the loops below and stores its own codes.
#if CPD_HOP_AVX2
  const std::unique_ptr<cpd_hop_avx2::Consts> vc(
      w.bits == 8 && !w.raw32 && w.mode == cpd::NEAREST && cpd_hop_avx2::applies(w.f, cpd::NEAREST) &&
              hop_env() == HOP_AUTO ? new cpd_hop_avx2::Consts(w.f) : nullptr);
  const bool direct = vc != nullptr;
#else
  const bool direct = false;
#endif
  NoGil nogil;
  cpd_cpu::parallel_for(0, nblocks, 8, [&](int64_t b0, int64_t b1) {
    u32 codes[kBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t e0 = b * kBlock, e1 = std::min(s.total, e0 + kBlock);
      for_runs(s, e0, e1, [&](int64_t j, int64_t i0, int64_t e, int64_t run) {
        const float* src = xp + s.rows[3 * j] + i0;
        u32* dst = codes + (e - e0);
        if (want_max) atomic_max(maxima[j], magnitude_max(src, run));
#if CPD_HOP_AVX2
        if (direct) {
          const int64_t sc = s.rows[3 * j + 2];
          if (scale_kind(sc) <= 1 &&  // 2^sc a normal float32 (or 1)
              cpd_hop_avx2::encode_nearest(src, run, std::ldexp(1.0f, (int)sc), sc != 0, op + e, *vc, w.f))
            return;
          encode_run_mode<true>(src, run, sc, w, dst);
          store_codes(op, e, run, w, dst);
          return;
        }
#endif
        if (w.raw32) {  // cpd.FP32: scaled and cast like any format (the cast of a finite float32 is itself)
          const int64_t sc = s.rows[3 * j + 2];
          switch (scale_kind(sc)) {
            case 0: raw32_run<0>(src, run, sc, w, dst); break;
            case 1: raw32_run<1>(src, run, sc, w, dst); break;
            case 3: raw32_run<3>(src, run, sc, w, dst); break;
            default: raw32_run<2>(src, run, sc, w, dst); break;
          }
        } else if (w.f.fast) {
          encode_run_mode<true>(src, run, s.rows[3 * j + 2], w, dst);
        } else {
          encode_run_mode<false>(src, run, s.rows[3 * j + 2], w, dst);
        }
      });
      if (!direct) store_codes(op, e0, e1 - e0, w, codes);
    }
  });
  if (want_max) {
    u32* mp = reinterpret_cast<u32*>(amax.data_ptr<float>());
    for (int64_t j = 0; j < s.k; ++j) mp[j] = maxima[j].load(std::memory_order_relaxed);
  }
}

// ---- the Kahan hop on float32 arithmetic
// Each of the merge's adds (below) is add_bits, an exact sum rounded once. Where one of arith.h's
// identities holds for the format and mode (cpd::add_f32_any_applies: to nearest with <= 11
// significant bits, Figueroa; the directed modes through cpd::sum_f32_directed), add_bits(a, b)
// is the rounding of cpd::sum_f32_bits(a, b) whenever those bits are finite; every operand is a
// value of the format (decoded, a rounded result, or one negated), as the identities ask. So a
// block runs as float32 lanes (GCC vectorizes the loop): the codes decoded through a table of
// their values, each add's bits rounded before the next (cast_bits_fast; to nearest, for the
// formats of cpd::nearest_f_applies, by cpd::round_f's float32 arithmetic), the two results'
// codes read off their last rounding (cast_code_fast). A block in which any of those bits is inf
// or NaN (an inf/NaN code, a float32 overflow; also an inf the cast made, at the next add), or
// of a format leaning on float32 subnormals (bfloat16) on a thread that flushes them, is redone
// through add_bits. CPD_WIRE_HOP=table takes add_bits for every block.
// S, C, X (and CX with CARRY): the values of one block (the partial sum, its compensation, the
// merged value and its own compensation); T, CC: the codes of the new sum and compensation.
// Returns nonzero when a sum's float32 bits were inf or NaN (the caller redoes the block).
template <int MODE, bool CARRY, bool FL>
u32 kahan_lanes(const float* __restrict S, const float* __restrict C, const float* __restrict X,
                const float* __restrict CX, int64_t m, const cpd::Format f, const cpd::FormatF g, u32* __restrict T,
                u32* __restrict CC) {
  u32 special = 0;
  auto bad = [](u32 u) { return (u32)((u & ~cpd::SIGN) >= cpd::INF_BITS); };
  // FL: to nearest on float32 arithmetic alone (cpd::round_f, for cpd::nearest_f_applies formats)
  auto rounded = [&](u32 u) { return cpd::float_of(FL ? cpd::round_f(u, g) : cpd::cast_bits_fast(u, f, MODE, 0u, 32)); };
  for (int64_t i = 0; i < m; ++i) {
    float c = C[i];
    if (CARRY) {
      const u32 uc = cpd::sum_f32_bits(c, CX[i], MODE);
      special |= bad(uc);
      c = rounded(uc);
    }
    const float s = S[i];
    const u32 uy = cpd::sum_f32_bits(X[i], -c, MODE);
    const float y = rounded(uy);
    const u32 ut = cpd::sum_f32_bits(s, y, MODE);
    const float t = rounded(ut);
    const u32 ud = cpd::sum_f32_bits(t, -s, MODE);
    const u32 un = cpd::sum_f32_bits(rounded(ud), -y, MODE);
    special |= bad(uy) | bad(ut) | bad(ud) | bad(un);
    T[i] = cpd::cast_code_fast(ut, f, MODE);
    CC[i] = cpd::cast_code_fast(un, f, MODE);
  }
  return special;
}

template <int MODE, bool FL>
u32 kahan_lanes_mode(bool carry, const float* S, const float* C, const float* X, const float* CX, int64_t m,
                     const cpd::Format& f, const cpd::FormatF& g, u32* T, u32* CC) {
  return carry ? kahan_lanes<MODE, true, FL>(S, C, X, CX, m, f, g, T, CC)
               : kahan_lanes<MODE, false, FL>(S, C, X, CX, m, f, g, T, CC);
}

u32 kahan_block_fast(int mode, bool carry, const float* S, const float* C, const float* X, const float* CX,
                     int64_t m, const cpd::Format& f, u32* T, u32* CC) {
  if (mode == cpd::NEAREST && cpd::nearest_f_applies(f, mode))
    return kahan_lanes_mode<cpd::NEAREST, true>(carry, S, C, X, CX, m, f, cpd::make_format_f(f), T, CC);
  const cpd::FormatF g{};  // unused
  switch (mode) {
    case cpd::NEAREST: return kahan_lanes_mode<cpd::NEAREST, false>(carry, S, C, X, CX, m, f, g, T, CC);
    case cpd::TOWARD_ZERO: return kahan_lanes_mode<cpd::TOWARD_ZERO, false>(carry, S, C, X, CX, m, f, g, T, CC);
    case cpd::UP: return kahan_lanes_mode<cpd::UP, false>(carry, S, C, X, CX, m, f, g, T, CC);
    default: return kahan_lanes_mode<cpd::DOWN, false>(carry, S, C, X, CX, m, f, g, T, CC);
  }
}

// One hop over n elements, in place on the accumulator:
//   role 0 (ring):        acc holds my values x (and, with carry, their compensations cx); the
//                         received partial sum s (and compensation c, or +0) is merged:
//                         plain  acc = add(s, x)
//                         Kahan  c = add(c, cx) (carry only); y = add(x, -c); t = add(s, y);
//                                c = add(add(t, -s), -y); acc = t, acc_c = c
//   role 1 (sequential):  acc holds the running sum s and its compensation c; the received value
//                         x is merged the same way (the leader's sum of a hierarchical group).
// Each add is add_bits (exact sum rounded once to the format, the caller's mode and saturate);
// the results are stored as wire codes. cpd.collectives._Acc.merge is the specification.
void wire_hop(const at::Tensor& recv, const at::Tensor& recv_c, at::Tensor acc, at::Tensor acc_c,
              int64_t n, int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals, int64_t mode,
              bool saturate, int64_t bits, bool msb, bool raw32, bool kahan, bool has_recv_c, bool carry,
              int64_t role) {
  const Wire w = make_wire(exp, man, bias, specials, subnormals, mode, saturate, bits, msb, raw32);
  const int64_t nb = nbytes_of(n, w.bits);
  check_bytes(recv, "recv", nb);
  check_bytes(acc, "acc", nb);
  if (kahan) {
    check_bytes(acc_c, "acc_c", nb);
    if (has_recv_c) check_bytes(recv_c, "recv_c", nb);
  }
  TORCH_CHECK(role == 0 || role == 1, "cpd_wire: role must be 0 (ring) or 1 (sequential)");
  TORCH_CHECK(!(carry && role == 1), "cpd_wire: carry applies to the ring role");
  const uint8_t* rp = recv.data_ptr<uint8_t>();
  uint8_t* ap = acc.data_ptr<uint8_t>();
  if (n == 0) return;
  const int loop = hop_loop(w, kahan);
  if (loop == LOOP_FUSED || loop == LOOP_FUSED_AVX2) {
    NoGil nogil;
    fast_hop(rp, ap, n, w, loop == LOOP_FUSED_AVX2);
    return;
  }
  if (loop == LOOP_WIDE || loop == LOOP_WIDE_AVX2) {
    NoGil nogil;
    wide_hop(rp, ap, n, w, loop == LOOP_WIDE_AVX2);
    return;
  }
  if (loop == LOOP_TABLE) {
    const auto tab = tables_of(w);
    NoGil nogil;
    if (!tab->bytes.empty()) {  // whole bytes: one gather per byte (padding bits stay codes of +0 + +0)
      const uint8_t* __restrict t = tab->bytes.data();
      cpd_cpu::parallel_for(0, nb, 1 << 16, [&](int64_t lo, int64_t hi) {
        const uint8_t* __restrict r = rp;
        uint8_t* __restrict a = ap;
        for (int64_t i = lo; i < hi; ++i) a[i] = t[((u32)r[i] << 8) | a[i]];
      });
      return;
    }
    const uint8_t* t = tab->add.data();
    const int b = w.bits;
    cpd_cpu::parallel_for(0, (n + kBlock - 1) / kBlock, 4, [&](int64_t b0, int64_t b1) {
      u32 cr[kBlock], ca[kBlock];
      for (int64_t k = b0; k < b1; ++k) {
        const int64_t e0 = k * kBlock, m = std::min(n, e0 + kBlock) - e0;
        load_codes(rp, e0, m, w, cr);
        load_codes(ap, e0, m, w, ca);
        for (int64_t i = 0; i < m; ++i) ca[i] = t[(cr[i] << b) | ca[i]];
        store_codes(ap, e0, m, w, ca);
      }
    });
    return;
  }
  const uint8_t* rcp = kahan && has_recv_c ? recv_c.data_ptr<uint8_t>() : nullptr;
  uint8_t* acp = kahan ? acc_c.data_ptr<uint8_t>() : nullptr;
  const bool fast = loop == LOOP_KAHAN_LANES;
  // the codes' values: a table up to 16 bits, the shift view or decode_bits beyond
  const auto table = fast && w.bits <= 16 ? decode_table16(w) : nullptr;
  const bool shift = shift_view(w.fe);
  const bool need_sub = cpd::add_f32_needs_subnormals(w.f);
#if CPD_HOP_AVX2
  // The lanes' operands straight from the wire bytes, 8 or 16 per step (hop_avx2.h), where the
  // fused hop and the decode have a vector decode: the binary16 view of 8-bit formats
  // (decode_block; a block with a code past the view's limit takes the table), bfloat16's and
  // binary16's own bits (wide_values). CPD_WIRE_HOP=scalar: the table for every block.
  const bool vec = fast && hop_env() == HOP_AUTO;
  const std::unique_ptr<cpd_hop_avx2::Consts> vc8(
      vec && w.bits == 8 && cpd_hop_avx2::applies(w.fe, cpd::NEAREST) ? new cpd_hop_avx2::Consts(w.fe) : nullptr);
  const int view16 = vec && w.bits == 16 ? wide_view(w) : 0;
#endif
  NoGil nogil;
  cpd_cpu::parallel_for(0, (n + kBlock - 1) / kBlock, 4, [&](int64_t b0, int64_t b1) {
    std::vector<u32> buf((fast ? 10 : 4) * kBlock);
    u32 *cr = buf.data(), *ca = cr + kBlock, *crc = ca + kBlock, *cac = crc + kBlock;
    const cpd::Format& f = w.f;
    const int md = w.mode;
    auto add = [&](u32 a, u32 b) { return cpd::add_bits(a, b, f, md, 0u, 32); };
    for (int64_t k = b0; k < b1; ++k) {
      const int64_t e0 = k * kBlock, m = std::min(n, e0 + kBlock) - e0;
      if (!kahan) {
        exact_hop_block(rp, ap, e0, m, w, cr, ca);
        continue;
      }
      prefetch_ahead(rp, ap, k, b1, w.bits);
      if (rcp) prefetch_block<0>(rcp, k, b1, w.bits);
      prefetch_block<1>(acp, k, b1, w.bits);
      if (fast && (!need_sub || float32_subnormals_kept())) {
        const float* __restrict t = table ? table->data() : nullptr;
        float *S = reinterpret_cast<float*>(cac + kBlock), *C = S + kBlock, *X = C + kBlock, *CX = X + kBlock;
        u32 *T = reinterpret_cast<u32*>(CX + kBlock), *CC = T + kBlock;
        // the values of the m codes of bytes p from element e0 (scratch: room for their codes)
        auto values = [&](const uint8_t* p, u32* __restrict scratch, float* __restrict v) {
#if CPD_HOP_AVX2
          if (vc8 && cpd_hop_avx2::decode_block(p + e0, m, v, *vc8, t)) return;
          if (view16) return wide_values(p + 2 * e0, m, view16, t, v);
#endif
          load_codes(p, e0, m, w, scratch);
          if (!t) return values_of_codes(scratch, m, w, shift, v);
          for (int64_t i = 0; i < m; ++i) v[i] = t[scratch[i]];
        };
        values(role == 0 ? rp : ap, cr, S);  // the partial sum: received (ring) or held (sequential)
        values(role == 0 ? ap : rp, ca, X);
        if (role == 1 || rcp) values(role == 1 ? acp : rcp, crc, C);
        else std::fill(C, C + m, 0.0f);  // no compensation yet: +0
        if (carry) values(acp, cac, CX);
        if (!kahan_block_fast(md, carry, S, C, X, CX, m, f, T, CC)) {
          store_codes(ap, e0, m, w, T);
          store_codes(acp, e0, m, w, CC);
          continue;
        }
      }
      load_codes(rp, e0, m, w, cr);  // add_bits per element (or the lanes met an inf or NaN)
      load_codes(ap, e0, m, w, ca);
      if (rcp) load_codes(rcp, e0, m, w, crc);
      if (carry || role == 1) load_codes(acp, e0, m, w, cac);
      for (int64_t i = 0; i < m; ++i) {
        u32 s, c, x;
        if (role == 0) {
          s = value_of_code(cr[i], w);
          c = rcp ? value_of_code(crc[i], w) : 0u;  // no compensation yet: +0
          x = value_of_code(ca[i], w);
          if (carry) c = add(c, value_of_code(cac[i], w));
        } else {
          s = value_of_code(ca[i], w);
          c = value_of_code(cac[i], w);
          x = value_of_code(cr[i], w);
        }
        const u32 y = add(x, c ^ cpd::SIGN);
        const u32 t = add(s, y);
        c = add(add(t, s ^ cpd::SIGN), y ^ cpd::SIGN);
        ca[i] = code_of_value(t, w);
        cac[i] = code_of_value(c, w);
      }
      store_codes(ap, e0, m, w, ca);
      store_codes(acp, e0, m, w, cac);
    }
  });
}

// Which loop wire_hop takes for a format, mode and saturate flag, under the current CPD_WIRE_HOP.
// Plain hops: 0 add_bits per element, 1 the pair tables, 2 the fused scalar loop, 3 the fused
// AVX2 + F16C loop, 4 the wide loop (9..31-bit codes: table, shift or decode_bits), 5 the wide loop with its
// bfloat16 / binary16 vector decode. Kahan hops: 6 the float32 lanes (kahan_lanes), else 0
// (tests and benchmarks/bench_wire.py ask, to know what they measure).
int64_t wire_hop_path(int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals, int64_t mode,
                      bool saturate, int64_t bits, bool raw32, bool kahan) {
  return hop_loop(make_wire(exp, man, bias, specials, subnormals, mode, saturate, bits, false, raw32), kahan);
}

namespace {
// dst = v / 2^s (float64 division, then float32) times inv; returns how many results are inf/NaN.
// The quotient is the exact v * 2^-s, so for -126 <= -s <= 127 (2^-s a normal float32 number) the
// float32 product is the same single rounding (SCALE 1); otherwise float64 (SCALE 2). 2^-s is also
// a float32 number for -149 <= -s < -126, but a subnormal one, and x86 takes a microcode assist for
// every multiplication by it (bf16 with APS scales of about 2^130: 2.97 ns per element instead of
// 0.62); the float64 product is the same value without it.
template <int SCALE, bool INV>
int64_t finish_run(const float* __restrict v, float* __restrict dst, int64_t m, float pf, double pd, float inv) {
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    float x = v[i];
    if (SCALE == 1) x = x * pf;
    if (SCALE == 2) x = (float)((double)x * pd);
    if (INV) x = x * inv;
    dst[i] = x;
    bad += (int64_t)((cpd::bits_of(x) & ~cpd::SIGN) >= cpd::INF_BITS);
  }
  return bad;
}

template <bool INV>
int64_t finish(const float* v, float* dst, int64_t m, int64_t s, float inv) {
  const double pd = std::ldexp(1.0, (int)-s);
  const int kind = scale_kind(-s);  // 3 (two float32 products) is the encode's; here float64
  if (kind == 0) return finish_run<0, INV>(v, dst, m, 1.0f, pd, inv);
  if (kind == 1) return finish_run<1, INV>(v, dst, m, (float)pd, pd, inv);
  return finish_run<2, INV>(v, dst, m, 1.0f, pd, inv);
}
}  // namespace

// out[segment offsets] <- decode(codes) / 2^s (in double, then float32), times `inv` when inv != 1.
// Returns the number of inf/NaN results (a 0-d int64 tensor): the overflow check, fused.
at::Tensor wire_decode(const at::Tensor& in, const at::Tensor& segs, at::Tensor out, int64_t exp,
                          int64_t man, int64_t bias, int64_t specials, bool subnormals, int64_t bits, bool msb,
                          bool raw32, double inv) {
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.device().is_cpu(),
              "cpd_wire: out must be a contiguous float32 CPU tensor");
  const Wire w = make_wire(exp, man, bias, specials, subnormals, cpd::NEAREST, false, bits, msb, raw32);
  const Segs s = segs_of(segs);
  for (int64_t j = 0; j < s.k; ++j)
    TORCH_CHECK(s.rows[3 * j] >= 0 && s.rows[3 * j] + s.rows[3 * j + 1] <= out.numel(), "cpd_wire: segment out of out");
  check_bytes(in, "in", nbytes_of(s.total, w.bits));
  // codes of up to 16 bits: the (cached) table of the codes' values, as the hops'
  const auto table = w.bits <= 16 && !w.raw32 ? decode_table16(w) : nullptr;
  // 8-bit formats of the binary16 view: the codes' values 16 per step (hop_avx2.h)
#if CPD_HOP_AVX2
  const std::unique_ptr<cpd_hop_avx2::Consts> vc(
      w.bits == 8 && !w.raw32 && cpd_hop_avx2::applies(w.fe, cpd::NEAREST) && hop_env() == HOP_AUTO
          ? new cpd_hop_avx2::Consts(w.fe) : nullptr);
#endif
  const uint8_t* ip = in.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  const float finv = (float)inv;
  const int64_t nblocks = (s.total + kBlock - 1) / kBlock;
  std::atomic<int64_t> bad{0};
  {
    NoGil nogil;
    cpd_cpu::parallel_for(0, nblocks, 8, [&](int64_t b0, int64_t b1) {
      u32 codes[kBlock];
      float vals[kBlock];
      int64_t mine = 0;
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t e0 = b * kBlock, m = std::min(s.total, e0 + kBlock) - e0;
        prefetch_block<0>(ip, b, b1, w.bits);  // the received codes
        bool done = false;
#if CPD_HOP_AVX2
        done = vc && cpd_hop_avx2::decode_block(ip + e0, m, vals, *vc, table->data());
#endif
        if (!done) {
          load_codes(ip, e0, m, w, codes);
          if (table) {
            const float* __restrict t = table->data();
            for (int64_t i = 0; i < m; ++i) vals[i] = t[codes[i]];
          } else {  // wider codes (and raw float32): the shift view, else decode_bits
            values_of_codes(codes, m, w, !w.raw32 && shift_view(w.fe), vals);
          }
        }
        for_runs(s, e0, e0 + m, [&](int64_t j, int64_t i0, int64_t e, int64_t run) {
          float* dst = op + s.rows[3 * j] + i0;
          const int64_t sc = s.rows[3 * j + 2];
          mine += inv != 1.0 ? finish<true>(vals + (e - e0), dst, run, sc, finv)
                             : finish<false>(vals + (e - e0), dst, run, sc, finv);
        });
      }
      bad += mine;
    });
  }
  return at::full({}, bad.load(), at::kLong);
}

// Per segment (rows: offset, length, unused): max |x| as float32 (NaN if any NaN, inf if any inf).
at::Tensor wire_absmax(const at::Tensor& x, const at::Tensor& segs) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "cpd_wire: x must be a contiguous float32 CPU tensor");
  const Segs s = segs_of(segs);
  auto out = at::zeros({s.k}, at::kFloat);
  const float* xp = x.data_ptr<float>();
  u32* op = reinterpret_cast<u32*>(out.data_ptr<float>());
  NoGil nogil;
  for (int64_t j = 0; j < s.k; ++j) {
    const int64_t off = s.rows[3 * j], len = s.rows[3 * j + 1];
    TORCH_CHECK(off >= 0 && off + len <= x.numel(), "cpd_wire: segment out of x");
    op[j] = at::parallel_reduce(0, len, 1 << 16, (u32)0, [&](int64_t lo, int64_t hi, u32 m) {
      return std::max(m, magnitude_max(xp + off + lo, hi - lo));
    }, [](u32 a, u32 b) { return std::max(a, b); });
  }
  return out;
}

TORCH_LIBRARY(cpd_wire, m) {
  m.def("wire_encode", &wire_encode);
  m.def("wire_hop", &wire_hop);
  m.def("wire_hop_path", &wire_hop_path);
  m.def("wire_decode", &wire_decode);
  m.def("wire_absmax", &wire_absmax);
}
