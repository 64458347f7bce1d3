// cpd numerics core, gemm.h: The GPU GEMM's families: which accumulation specs run a specialised
// step, and the step itself. Part of the numerics core; see cpd/numerics.h for the rules every
// part follows.
#ifndef CPD_GEMM_H
#define CPD_GEMM_H

#include "cpd/accumulate.h"

namespace cpd {

// ------------------------------------------------------------------------------------------
// The GPU GEMM (cuda/kernels/matmul.cu) runs one kernel per family, each with its step known at
// compile time, so that the inner loop is a few float32 instructions with no run-time branch on
// the mode, Kahan or block. Every family's step is dot_step's step, bit for bit, for the specs its
// predicate admits (cpd/_kernels.py routes by the same conditions: matmul_family); each output
// still takes k = 0, 1, ..., K-1 in order from s = +0.
//
// CHAIN (gemm_chain_applies): no mul format, accumulator float32 itself (8, 23, bias 127, IEEE,
// subnormals), round to nearest, no saturation, no Kahan, no blocks. Step k is
//     fma_bits(s, a, b, FP32, NEAREST) = s + a*b rounded once = fmaf(a, b, s)        (IEEE 754 fma)
// for every finite s, a, b: the exact sum rounded once to nearest-even on float32's grid, with
// gradual underflow (no FTZ: NVRTC's default, the shim's IEEE definitions), an overflow to
// +-inf (outward_bits is inf without saturation), and an exact zero sum signed by IEEE 754
// §6.3, which is zero_sum_sign's rule in round to nearest (the product a*b is exactly zero only
// when a or b is). Infinite operands and sums agree too (fma_bits casts float32's own
// fadd(s, fmul(a, b)) then: inf stays inf, inf - inf and 0 * inf are NaN). Only a NaN's bits can
// differ: a GPU returns its canonical NaN from every float32 operation, a CPU propagates
// payloads, and fma and fadd(fmul) may pick different operands' payloads. So a chain output that
// ends as NaN (and only then: until a step gives NaN both sides have the same finite or infinite
// value, and a NaN stays NaN) is recomputed with dot_step (gemm_redo): its bits are then
// exactly the generic path's on the same device.
CPD_FN int is_float32_format(const Format& f) {
  return (int)(f.exp == 8 && f.man == 23 && f.bias == 127 && f.specials == SPECIALS_IEEE && f.is_signed &&
               f.subnormals && f.outward_bits == INF_BITS);
}

CPD_FN int gemm_chain_applies(const DotSpec& d) {
  return (int)(!d.has_mul && is_float32_format(d.af) && d.mode == NEAREST && !d.kahan && !d.block);
}

CPD_FN void gemm_chain_step(float& s, float a, float b) { s = ffma(a, b, s); }

// LANES (gemm_lanes_applies): round to nearest, products rounded to a mul format whose values are
// values of an accumulator of at most 11 significant bits whose quanta are float32 normals (E5M2 or
// E4M3 into (5, 10), FP16, (6, 9), ...; not BF16, whose finest quantum is 2^-133), no blocks: the CPU matmul's float32-lane steps, mul_f then add_f (cpd/arith.h:
// the product rounded once by one fused multiply-add against C = 2^(E + 23 - man); the sum of two
// values of the accumulator rounded to float32 then to the accumulator, which is one rounding by
// Figueroa's 24 >= 2 * 11 + 2). NaN, infinities, overflow and flushing are mul_f's and add_f's,
// which give mul_bits' and add_bits' values; a NaN's bits are the float32 unit's (a host's NaN
// from inf - inf is negative on x86, where add_bits' cast of fadd's NaN need not be), so these
// outputs too are redone by dot_step when they end as NaN (gemm_redo). With Kahan
// (gemm_kahan_step) the four additions of Kahan's step are add_f too (kahan_step's order).
CPD_FN int gemm_lanes_applies(const DotSpec& d) {
  return (int)(d.has_mul && nearest_f_applies(d.mf, d.mode) && nearest_f_applies(d.af, d.mode) &&
               add_fast_applies(d.af, d.mode) && values_within(d.mf, d.af) && !d.block);
}

CPD_FN float gemm_lanes_product(float a, float b, const FormatF& mg) { return float_of(mul_f(a, b, mg)); }

CPD_FN void gemm_lanes_step(float& s, float a, float b, const FormatF& mg, const FormatF& ag) {
  s = float_of(add_f(s, gemm_lanes_product(a, b, mg), ag));
}

CPD_FN void gemm_kahan_step(float& s, float& c, float a, float b, const FormatF& mg, const FormatF& ag) {
  kahan_step(s, c, gemm_lanes_product(a, b, mg), [&ag](float x, float y, int) { return float_of(add_f(x, y, ag)); });
}

// LANES16 / KAHAN16 (gemm_f16_applies): LANES with the accumulator IEEE binary16 itself ((5, 10),
// bias 15, subnormals, no saturation) and a mul format with subnormals, the common case
// (E5M2 or E4M3 into FP16). The steps are LANES' with three instructions fewer per rounding:
//   * the sum's rounding, cast_bits(fl32(s + p), binary16, NEAREST) (add_f: Figueroa as above),
//     is the hardware's float32 -> binary16 conversion to nearest even and back (PTX cvt.rn.f16.f32,
//     IEEE 754's convertFormat: gradual underflow, +-inf on overflow), exact back to float32
//     (round_binary16; on the host, where there is no such instruction, round_f: the same function);
//   * the product's rounding is mul_f_round with no flush (flush_below is 0 for a format with
//     subnormals, so the select it drops never fires) and without mul_f's NaN select.
// Both differ from LANES only in a NaN's bits (the conversion's NaN is the hardware's canonical
// one), and a NaN sum stays NaN to the end (a NaN compensation reaches s at the next step: y, then
// t, are NaN), so an output that ends as NaN is redone by dot_step, as in CHAIN (gemm_redo).
CPD_FN int is_binary16_format(const Format& f) {
  return (int)(f.exp == 5 && f.man == 10 && f.bias == 15 && f.specials == SPECIALS_IEEE && f.is_signed &&
               f.subnormals && f.outward_bits == INF_BITS);
}

CPD_FN int gemm_f16_applies(const DotSpec& d) {
  return (int)(gemm_lanes_applies(d) && is_binary16_format(d.af) && d.mf.subnormals);
}

CPD_FN float round_binary16(float x, const FormatF& g) {
#if defined(__CUDA_ARCH__)
  unsigned short h;
  float r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
  (void)g;
  return r;
#else
  return float_of(round_f(bits_of(x), g));
#endif
}

// mul_f(x, y, g) for a format with subnormals, up to a NaN's bits (see above).
CPD_FN float gemm_product_sub(float x, float y, const FormatF& g) {
  const u32 h = bits_of(fmul(x, y));
  const float c = float_of(round_f_c(h & ~SIGN, g));
  const float ax = float_of(bits_of(x) & ~SIGN), ay = float_of(bits_of(y) & ~SIGN);
  u32 r = bits_of(fsub(ffma(ax, ay, c), c));
  r = float_of(r) > g.max ? g.outward_bits : r;  // overflow, infinities (round_f_finish)
  return float_of((h & SIGN) | r);
}

CPD_FN void gemm_f16_step(float& s, float a, float b, const FormatF& mg, const FormatF& ag) {
  s = round_binary16(fadd(s, gemm_product_sub(a, b, mg)), ag);
}

CPD_FN void gemm_kahan16_step(float& s, float& c, float a, float b, const FormatF& mg, const FormatF& ag) {
  kahan_step(s, c, gemm_product_sub(a, b, mg), [&ag](float x, float y, int) { return round_binary16(fadd(x, y), ag); });
}

// Whether a family's output s must be redone by dot_step (a NaN: see CHAIN, LANES and LANES16).
CPD_FN int gemm_redo(float s) { return (int)((bits_of(s) & ~SIGN) > INF_BITS); }

// The family of a spec: which kernel of matmul.cu runs it (GEMM_GENERIC: cpd_matmul_tiled).
enum { GEMM_GENERIC = 0, GEMM_CHAIN = 1, GEMM_LANES = 2, GEMM_KAHAN = 3, GEMM_LANES16 = 4, GEMM_KAHAN16 = 5 };

CPD_FN int gemm_family(const DotSpec& d) {
  if (gemm_chain_applies(d)) return GEMM_CHAIN;
  if (gemm_f16_applies(d)) return d.kahan ? GEMM_KAHAN16 : GEMM_LANES16;
  if (gemm_lanes_applies(d)) return d.kahan ? GEMM_KAHAN : GEMM_LANES;
  return GEMM_GENERIC;
}

}  // namespace cpd

#endif  // CPD_GEMM_H
