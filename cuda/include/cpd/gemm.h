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

// Whether a family's output s must be redone by dot_step (a NaN: see CHAIN and LANES).
CPD_FN int gemm_redo(float s) { return (int)((bits_of(s) & ~SIGN) > INF_BITS); }

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
// (E5M2 or E4M3 into FP16).
CPD_FN int is_binary16_format(const Format& f) {
  return (int)(f.exp == 5 && f.man == 10 && f.bias == 15 && f.specials == SPECIALS_IEEE && f.is_signed &&
               f.subnormals && f.outward_bits == INF_BITS);
}

CPD_FN int gemm_f16_applies(const DotSpec& d) {
  return (int)(gemm_lanes_applies(d) && is_binary16_format(d.af) && d.mf.subnormals);
}

// The steps of LANES16 and KAHAN16: two outputs at a time, their sums (and Kahan's compensations)
// binary16 pairs (half2). Per product and output: FMUL, FMNMX, LOP3, FFMA, FADD; per pair of
// outputs: one conversion of the two products to binary16 (F2FP), one binary16 pair add (HADD2;
// Kahan: four) and one running maximum of the products' magnitudes (HMNMX2); per operand of B, once
// per load, one FMUL (the scale below).
//
// The product. v = a*b exact (float32 a, b: 48 bits), E = max(e(v), emin) (e: the binade), the
// quantum q = 2^(E - man) of the mul format m (man <= 10, values within binary16, subnormals).
// With C = 1.5 * 2^(E + 23 - man) (ulp(C) = q, C / q = 3 * 2^22 even, C a float32 normal), and
// |v| < 2^(E + 1) <= C * 2^(man - 22) / 1.5 < C / 2^12 / 1.5: C + v lies in C's binade, where the
// float32 grid is q's, so fl32(C + v) = C + v rounded to a multiple of q, ties to the even multiple
// (C's multiple is even), and fl32(C + v) - C is exact (Sterbenz): the signed v rounded to nearest
// even on m's grid, one rounding (one FFMA: a*b + C rounded once, IEEE 754 fusedMultiplyAdd),
// i.e. mul_bits(a, b, m, NEAREST) as long as that does not overflow, but for the sign of a zero
// (fl32(C + v) - C is +0; see the sum). E comes from h = fl32(a * b') with b' = b * 2^(23 - man)
// (exact: a scaling up, or inf): e(h) = e(v) + 23 - man, or one more when v rounds up to the next
// power of two, which both quanta then round to; so C's bits are h's exponent field clamped below
// at lo = 2^(emin + 23 - man) (fmaxf(|h|, lo): E >= emin, the subnormal range; h below float32's
// normals clamps there too, emin + 23 - man >= -1 for m within binary16) with the significand
// 0x400000 (the 1.5). No upper clamp is needed: e(h) <= 127 keeps C <= 1.5 * 2^127 and C + v
// finite; an h that is +-inf (v >= 2^(128 - 23 + man): an overflow) makes C a NaN, hence the
// product NaN; a NaN h from 0 * inf (b' = inf, a = 0) leaves C = lo's, and a*b + C = C: the
// product 0 (a NaN a or b, or inf * 0, gives NaN through the FFMA itself).
//
// The sums. The sum s and the product p are binary16 values (p, when |p| <= m's largest value
// max, is a value of m: values_within), so the hardware's binary16 add to nearest (PTX
// add.rn.f16x2: IEEE 754 addition, correctly rounded, gradual underflow, +-inf on overflow, an
// exact zero +0) is add_bits(s, p, binary16, NEAREST) itself: one rounding, where the float32
// lanes take fl32(s + p) and cast it (Figueroa's 24 >= 2 * 11 + 2 makes the two equal). The sum
// starts at +0, and an exact zero sum to nearest is -0 only when both terms are, so s is never -0,
// and s + p does not depend on the sign of a zero p: our +0 for mul_bits' -0 changes nothing.
// Kahan (kahan_step: y = p - c, t = s + y, c = (t - s) - y, s = t; each a sum of two binary16
// values rounded once, add.rn / sub.rn.f16x2, x - y being x + (-y) in IEEE 754): s, t are never
// -0 (as above), so t - s is +0 when zero and c never -0; y is -0 only for p = -0 (our +0), and a
// zero y changes neither t = s + y (s != -0) nor c = (t - s) - y = +0 - y = +0. Infinite and NaN
// sums and compensations follow IEEE 754 on both paths alike; a NaN c reaches s at the next step.
//
// What is left to the generic steps: every product whose magnitude exceeds max (an overflow, to
// inf or NaN in m, and inf products), seen in the running maximum of |p| (in binary16, a
// monotonic conversion: |p| > max exactly when the binary16 |p| is, p being on m's grid), and
// every NaN sum (a NaN product or inf - inf), as in CHAIN: gemm_f16_redo. Every other output takes
// the generic steps' products (finite, |p| <= max) and sums, bit for bit.
//
// The binary16 pair helpers: PTX on the device (cvt.rn.f16x2.f32 from sm_80, two cvt.rn.f16.f32
// before); on the host (the shim), where there are no such instructions, the same functions by
// round_f (cast_bits to nearest binary16) and exact re-encodings (binary16 code <-> float32 bits).
struct GemmF16 {
  float scale;   // 2^(23 - man): B's operands are scaled once per load (b' above)
  float lo;      // 2^(emin + 23 - man): the least |h| whose binade C takes
  u32 max_code;  // binary16 code of m's largest value (the overflow check)
  FormatF ag;    // binary16's round_f (the host's conversions)
};

CPD_FN u32 half_code(u32 v) {  // float32 bits of a binary16 value, +-inf or NaN -> binary16 code
  const u32 sgn = (v >> 16) & 0x8000u, a = v & ~SIGN;
  if (a > INF_BITS) return sgn | 0x7e00u;
  if (a == INF_BITS) return sgn | 0x7c00u;
  if (a >= 0x38800000u) return sgn | ((a >> 13) - (112u << 10));  // 2^-14 and above: field - 127 + 15
  return sgn | (u32)fmul(float_of(a), 16777216.0f);               // k * 2^-24, k < 1024
}

CPD_FN u32 half_bits(u32 code) {  // binary16 code -> float32 bits (exact)
  const u32 sgn = (code & 0x8000u) << 16, field = (code >> 10) & 31u, frac = code & 1023u;
  if (field == 31u) return sgn | (frac ? QNAN_BITS : INF_BITS);
  if (field == 0u) return sgn | bits_of(fmul((float)frac, float_of(0x33800000u)));  // frac * 2^-24
  return sgn | (((code & 0x7fffu) << 13) + (112u << 23));
}

// (binary16(hi) << 16) | binary16(lo), each rounded to nearest even (cvt.rn.f16x2.f32).
CPD_FN u32 h2_pack(float lo, float hi, const FormatF& ag) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  (void)ag;
  return d;
#elif defined(__CUDA_ARCH__)
  unsigned short l, h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(l) : "f"(lo));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(hi));
  (void)ag;
  return (u32)l | ((u32)h << 16);
#else
  return half_code(round_f(bits_of(lo), ag)) | (half_code(round_f(bits_of(hi), ag)) << 16);
#endif
}

// The binary16 sums of the two pairs, each rounded once to nearest even (add.rn.f16x2).
CPD_FN u32 h2_add(u32 x, u32 y, const FormatF& ag) {
#if defined(__CUDA_ARCH__)
  u32 d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(y));
  (void)ag;
  return d;
#else
  const u32 lo = round_f(bits_of(fadd(float_of(half_bits(x & 0xffffu)), float_of(half_bits(y & 0xffffu)))), ag);
  const u32 hi = round_f(bits_of(fadd(float_of(half_bits(x >> 16)), float_of(half_bits(y >> 16)))), ag);
  return half_code(lo) | (half_code(hi) << 16);  // Figueroa: fl32 then binary16 is one rounding
#endif
}

// x - y per half, rounded once (sub.rn.f16x2: x + (-y)).
CPD_FN u32 h2_sub(u32 x, u32 y, const FormatF& ag) {
#if defined(__CUDA_ARCH__)
  u32 d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(y));
  (void)ag;
  return d;
#else
  return h2_add(x, y ^ 0x80008000u, ag);
#endif
}

// Per half, a binary16 whose magnitude is max(|m|, |p|) (its sign is not used); a NaN p may be
// skipped (the device's max does), as its sum is NaN too.
CPD_FN u32 h2_maxabs(u32 m, u32 p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
  u32 d;
  asm("max.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(m), "r"(p));
  return d;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 d;
  asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(m & 0x7fff7fffu), "r"(p & 0x7fff7fffu));
  return d;
#else
  const u32 ml = m & 0x7fffu, pl = p & 0x7fffu, mh = (m >> 16) & 0x7fffu, ph = (p >> 16) & 0x7fffu;
  return (ml > pl ? ml : pl) | ((mh > ph ? mh : ph) << 16);
#endif
}

// Half i (0: low, 1: high) of a pair as a float32 (exact).
CPD_FN float h2_half(u32 x, int i) {
  const u32 code = i ? x >> 16 : x & 0xffffu;
#if defined(__CUDA_ARCH__)
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"((unsigned short)code));
  return r;
#else
  return float_of(half_bits(code));
#endif
}

CPD_FN float fmax_abs(float x, float lo) {  // max(|x|, lo), lo when x is NaN (IEEE maxNum)
#if CPD_DEVICE
  return fmaxf(fabsf(x), lo);
#else
  return __builtin_fmaxf(__builtin_fabsf(x), lo);
#endif
}

CPD_FN GemmF16 make_gemm_f16(const Format& m, const Format& acc) {
  GemmF16 g;
  g.scale = float_of((u32)(150 - m.man) << 23);
  g.lo = float_of((u32)(m.emin + 150 - m.man) << 23);
  g.ag = make_format_f(acc);
  g.max_code = h2_pack(float_of(m.max_bits), 0.0f, g.ag) & 0x7fffu;
  return g;
}

CPD_FN float gemm_f16_scale(float b, const GemmF16& g) { return fmul(b, g.scale); }

// mul_bits(a, b, m, NEAREST) while |v| <= max, up to the sign of a zero (above); bs = b * scale.
// (x & INF_BITS) | 0x400000 as one LOP3 (ptxas splits the two immediates into two otherwise).
CPD_FN u32 exponent_and_half(u32 x) {
#if defined(__CUDA_ARCH__)
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(x), "r"(INF_BITS), "r"(0x00400000u));
  return d;
#else
  return (x & INF_BITS) | 0x00400000u;
#endif
}

CPD_FN float gemm_f16_product(float a, float b, float bs, const GemmF16& g) {
  const float h = fmul(a, bs);
  const float c = float_of(exponent_and_half(bits_of(fmax_abs(h, g.lo))));
  return fsub(ffma(a, b, c), c);
}

// Step k of the pair of outputs (s: their sums, mx: their largest |product| so far) with operands
// a (A's) and b0, b1 (B's; bs0, bs1 scaled).
CPD_FN void gemm_f16_pair_step(u32& s, u32& mx, float a, float b0, float bs0, float b1, float bs1, const GemmF16& g) {
  const u32 p = h2_pack(gemm_f16_product(a, b0, bs0, g), gemm_f16_product(a, b1, bs1, g), g.ag);
  s = h2_add(s, p, g.ag);
  mx = h2_maxabs(mx, p);
}

// Kahan's step of the pair (s, c: sums and compensations; cpd/accumulate.h kahan_step's order).
CPD_FN void gemm_kahan16_pair_step(u32& s, u32& c, u32& mx, float a, float b0, float bs0, float b1, float bs1,
                                   const GemmF16& g) {
  const u32 p = h2_pack(gemm_f16_product(a, b0, bs0, g), gemm_f16_product(a, b1, bs1, g), g.ag);
  const u32 y = h2_sub(p, c, g.ag);
  const u32 t = h2_add(s, y, g.ag);
  c = h2_sub(h2_sub(t, s, g.ag), y, g.ag);
  s = t;
  mx = h2_maxabs(mx, p);
}

// Whether output i of a pair must be redone by dot_step: a NaN sum, or a product past max.
CPD_FN int gemm_f16_redo(u32 s, u32 mx, int i, const GemmF16& g) {
  const u32 sc = (i ? s >> 16 : s) & 0x7fffu, mc = (i ? mx >> 16 : mx) & 0x7fffu;
  return (int)((sc > 0x7c00u) | (mc > g.max_code));
}

// LANESBF / KAHANBF (gemm_bf16_applies): round to nearest, products rounded to a mul format with
// subnormals whose values are accumulator values and with nearest_f_applies (E5M2, E4M3, FP16
// into TF32, ...; mul=None is FUSEDBF / FKAHANBF below), the accumulator a format of float32's
// exponent range with at most 11 significant bits (is_f32_range_format: IEEE bfloat16 (8, 7),
// TF32 (8, 10), ...: bias 127, subnormals, no saturation), no blocks: float32 lanes, one integer
// rounding per sum. Below, "bfloat16" stands for any such format and 16 for its cut 23 - man.
//   * the product: gemm_f16_product (LANES16's proof above holds for any such mul format: E, C
//     and the clamp lo only ask nearest_f_applies, and lo is a float32 normal, emin - man >= -133
//     by values_within), watched against max (fmax_abs_nan: NaN too) and redone past it;
//   * the sum of two bfloat16 values, fl32(x + y) then rounded once to bfloat16, is
//     add_bits(x, y, BF16, NEAREST) (add_lane_applies: Figueroa's 24 >= 2 * 11 + 2 above 2^-126,
//     exact float32 subnormals below, no flush-to-zero on the GPU or in the shim);
//   * the rounding of finite float32 bits u to bfloat16 (whose values are the float32 values with
//     16 low zero bits, subnormals included: the same exponent field and emin) is
//     (u + 0x7fff + bit 16 of u) & 0xffff0000 (round_bf16_bits; for the cut k = 23 - man,
//     (u + 2^(k-1) - 1 + bit k of u) & ~(2^k - 1): GemmBF16's half and mask): to nearest on the
//     magnitude bits (the sign bit untouched: RN is symmetric), ties to the even code, a carry out of the
//     mantissa the next binade, past 0x7f7f8000 (the overflow threshold, a tie to the even "code"
//     0x7f80) +-inf, and +-inf itself unchanged; cast_bits(u, BF16, NEAREST) for finite and
//     infinite u (round_lane_guarded's step N2 for BF16). A NaN u is not rounded right (its
//     payload can carry into the sign), so no NaN may reach it unnoticed:
//   * LANESBF: with every product finite and within max, s is finite or +-inf, and s + p never
//     NaN; the product watch sees every other case;
//   * KAHANBF: y = p - c, t = s + y, c = (t - s) - y each rounded as above, with the guard of the
//     CPU's Kahan lanes (arith.h add_lane_guard_applies: every t below G = 2^(emax - 2) = 2^125
//     keeps every sum inside the range, by induction), watched by a running maximum of |t| that
//     keeps NaN (max.NaN); an output whose |t| reached G, or NaN, is redone, as is one whose product
//     watch fired.
// Signs of zeros as in LANES16 / KAHAN16 (the sums start at +0; the product's zero is +0).
CPD_FN int is_f32_range_format(const Format& f) {
  return (int)(f.exp == 8 && f.man >= 1 && f.man <= 10 && f.bias == 127 && f.specials == SPECIALS_IEEE &&
               f.is_signed && f.subnormals && f.outward_bits == INF_BITS);
}

CPD_FN int gemm_bf16_applies(const DotSpec& d) {
  return (int)(d.has_mul && d.mode == NEAREST && !d.block && is_f32_range_format(d.af) &&
               nearest_f_applies(d.mf, d.mode) && d.mf.subnormals && values_within(d.mf, d.af));
}

// max(w, |x|), NaN when either is (PTX max.NaN.f32, sm_80 and later).
CPD_FN float fmax_abs_nan(float w, float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(w), "f"(fabsf(x)));
  return d;
#else
  const float ax = float_of(bits_of(x) & ~SIGN);
  return (w != w || ax != ax) ? float_of(QNAN_BITS) : (ax > w ? ax : w);
#endif
}

struct GemmBF16 {
  GemmF16 m;    // the product's constants (m.scale, m.lo; m.ag unused)
  float max;    // the mul format's largest value
  float guard;  // G = 2^(emax - 2) = 2^125 (KAHANBF)
  u32 cut, half, mask;  // the accumulator's rounding: k = 23 - man, 2^(k-1) - 1, ~(2^k - 1)
};

CPD_FN u32 round_bf16_bits(u32 u, const GemmBF16& g) { return (u + g.half + ((u >> g.cut) & 1u)) & g.mask; }

CPD_FN float bf16_add(float x, float y, const GemmBF16& g) {
  return float_of(round_bf16_bits(bits_of(fadd(x, y)), g));
}

// The accumulator's rounding constants (acc.man <= 22; float32 itself, the F32 families', none).
CPD_FN void gemm_bf16_cut(GemmBF16& g, const Format& acc) {
  g.cut = acc.man < 23 ? (u32)(23 - acc.man) : 0u;
  g.half = g.cut ? (1u << (g.cut - 1u)) - 1u : 0u;
  g.mask = ~((1u << g.cut) - 1u);
}

CPD_FN GemmBF16 make_gemm_bf16(const Format& m, const Format& acc) {
  GemmBF16 g;
  g.m.scale = float_of((u32)(150 - m.man) << 23);
  g.m.lo = float_of((u32)(m.emin + 150 - m.man) << 23);
  g.m.ag = make_format_f(acc);
  g.m.max_code = 0u;
  g.max = float_of(m.max_bits);
  g.guard = float_of(lane_guard_bits(acc));
  gemm_bf16_cut(g, acc);
  return g;
}

// Step k of one output: s the sum, w the largest |product| so far.
CPD_FN void gemm_bf16_step(float& s, float& w, float a, float b, float bs, const GemmBF16& g) {
  const float p = gemm_f16_product(a, b, bs, g.m);
  w = fmax_abs_nan(w, p);
  s = bf16_add(s, p, g);
}

// Kahan's step (kahan_step's order); top: the largest |t| so far.
CPD_FN void gemm_kahanbf_step(float& s, float& c, float& w, float& top, float a, float b, float bs,
                              const GemmBF16& g) {
  const float p = gemm_f16_product(a, b, bs, g.m);
  w = fmax_abs_nan(w, p);
  const float y = bf16_add(p, -c, g);
  const float t = bf16_add(s, y, g);
  top = fmax_abs_nan(top, t);
  c = bf16_add(bf16_add(t, -s, g), -y, g);
  s = t;
}

// Whether an output must be redone by dot_step: a product past max or NaN; Kahan: |t| >= G or NaN.
CPD_FN int gemm_bf16_redo(float w, float top, const GemmBF16& g) {
  return (int)(!(w <= g.max) | !(top < g.guard));
}

// FUSEDBF / FKAHANBF (gemm_fbf16_applies): LANESBF / KAHANBF without a mul format: the product a*b
// exact and fused into the step's first sum, as dot_step does (fma_bits(x, a, b, BF16, NEAREST)
// with x = s, or x = -c for Kahan's y = P - c); the other Kahan sums are KAHANBF's.
//   * The fused sum is rounded once through float32 by rounding to odd (Boldo & Melquiond,
//     "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
//     IEEE TC 2008: a value rounded to odd with p + 2 or more bits, then to nearest with p bits, is
//     rounded to nearest once; float32's 24 >= 11 + 2, and bfloat16 shares float32's exponent range
//     and subnormal grid, 16 (TF32: 13) bits coarser). lo, hi: the exact sum rounded down and up
//     (one FFMA each, .rm / .rp); it is exact when lo == hi; its rounding toward zero is lo when hi > 0 (a
//     positive sum), else hi; the rounding to odd is that with its last bit set when inexact.
//     Past float32's range (|sum| > FLT_MAX) the odd value is +-FLT_MAX, which rounds to +-inf as
//     the exact sum does; an exact zero sum takes hi's sign, which is round to nearest's (+0 but
//     for two zeros of sign -: roundTowardPositive and roundTiesToEven agree there).
//   * A NaN (a NaN operand, inf * 0, inf - inf) is not rounded right by round_bf16_bits (the GPU's
//     canonical NaN 0x7fffffff carries into the sign), so the watch w keeps the largest |hi| with
//     NaN (fmax_abs_nan): a NaN w redoes the output. Infinities and finite overflows are rounded
//     right; Kahan's guard on |t| (KAHANBF) stands as it is: y is a bfloat16 value or +-inf.
// With no mul format the constants are make_gemm_fbf16's: max = +inf (only a NaN w redoes).
CPD_FN int gemm_fbf16_applies(const DotSpec& d) {
  return (int)(!d.has_mul && d.mode == NEAREST && !d.block && is_f32_range_format(d.af));
}

// a*b + x rounded toward -inf / +inf (IEEE 754 fusedMultiplyAdd, roundTowardNegative/Positive).
// Device: FFMA.RM / FFMA.RP. Host (the shim and the CPU extension, which never steps a GEMM family
// but compiles this header): from the nearest float32 r = fma(a, b, x) and the sign of the exact
// error (a*b + x) - r in double arithmetic: a*b is exact in double (48 bits), p + x = u + e exactly
// (Knuth's TwoSum), u - r is exact (both within 2^-23 |r| of the sum, or r = 0), and the rounded
// (u - r) + e keeps the sign of the error.
CPD_FN float fma_directed(float a, float b, float x, int up) {
#if defined(__CUDA_ARCH__)
  return up ? __fmaf_ru(a, b, x) : __fmaf_rd(a, b, x);
#else
  const float r = __builtin_fmaf(a, b, x);
  if (!__builtin_isfinite(a) || !__builtin_isfinite(b) || !__builtin_isfinite(x) || r != r) return r;
  const double p = (double)a * (double)b, u = p + (double)x, v = u - p;
  const double e = (p - (u - v)) + ((double)x - v);
  if (__builtin_isinf(r)) {  // a finite sum past float32's range: toward zero it is +-FLT_MAX
    const float big = __builtin_copysignf(3.4028234663852886e38f, r);
    return (r > 0.0f) == (up != 0) ? r : big;
  }
  const double d = (u - (double)r) + e;
  if (d == 0.0) {
    if (r != 0.0f) return r;  // exact
    // an exact zero: of two zeros, -0 in a direction's mode unless both are +0 (down) / unless
    // both are -0 (up); of a cancellation, -0 down, +0 up
    const int zp = p == 0.0, np = __builtin_signbit(p) != 0, nx = __builtin_signbit(x) != 0;
    const int neg = zp && x == 0.0f ? (up ? (np && nx) : (np || nx)) : !up;
    return neg ? -0.0f : 0.0f;
  }
  if ((d > 0.0) == (up != 0)) return __builtin_nextafterf(r, up ? __builtin_inff() : -__builtin_inff());
  return r;
#endif
}

// a*b + x rounded to odd on float32's grid (the bits), and hi, the sum rounded up (the watch's).
CPD_FN u32 fused_odd(float a, float b, float x, float& hi) {
  const float lo = fma_directed(a, b, x, 0);
  hi = fma_directed(a, b, x, 1);
  return bits_of(hi > 0.0f ? lo : hi) | (u32)(lo != hi);
}

// round(a*b + x) to nearest bfloat16 (finite or infinite; see NaN above) and the watch's hi.
CPD_FN float fbf16_fused(float a, float b, float x, float& hi, const GemmBF16& g) {
  return float_of(round_bf16_bits(fused_odd(a, b, x, hi), g));
}

CPD_FN GemmBF16 make_gemm_fbf16(const Format& acc) {
  GemmBF16 g;
  g.m.scale = 1.0f;
  g.m.lo = 0.0f;
  g.m.ag = make_format_f(acc);
  g.m.max_code = 0u;
  g.max = float_of(INF_BITS);
  g.guard = float_of(lane_guard_bits(acc));
  gemm_bf16_cut(g, acc);
  return g;
}

// Step k of one output (FUSEDBF): s = round(s + a*b), w the largest |hi| so far.
CPD_FN void gemm_fbf16_step(float& s, float& w, float a, float b, const GemmBF16& g) {
  float hi;
  s = fbf16_fused(a, b, s, hi, g);
  w = fmax_abs_nan(w, hi);
}

// Kahan's step (FKAHANBF): y = round(a*b - c), then KAHANBF's t, c and s; top the largest |t|.
CPD_FN void gemm_fkahanbf_step(float& s, float& c, float& w, float& top, float a, float b, const GemmBF16& g) {
  float hi;
  const float y = fbf16_fused(a, b, -c, hi, g);
  w = fmax_abs_nan(w, hi);
  const float t = bf16_add(s, y, g);
  top = fmax_abs_nan(top, t);
  c = bf16_add(bf16_add(t, -s, g), -y, g);
  s = t;
}

// FUSED16 / FKAHAN16 (gemm_fh16_applies): FUSEDBF / FKAHANBF for the accumulator IEEE binary16
// itself ((5, 10), bias 15, subnormals, no saturation): round to nearest, mul=None (exact products,
// `acc=FP16` or `fma=True`), no blocks.
//   * The fused sum a*b + x (x = s, or -c for Kahan's y) rounded to odd through float32 (fused_odd:
//     Boldo & Melquiond as above; 24 >= 11 + 2 bits, and in binary16's subnormal range float32's
//     quantum is at most 2^-37, far below binary16's 2^-24), then rounded once to binary16 by the
//     conversion to nearest (cvt.rn.f16.f32: IEEE 754 convertFormat, gradual underflow, +-inf
//     from 65520 on) and back (exact): fma_bits(x, a, b, FP16, NEAREST). Past float32's range the
//     odd value is +-FLT_MAX, which rounds to +-inf as the exact sum does; an exact zero sum takes
//     hi's sign, round to nearest's (FUSEDBF's argument), which the conversion keeps.
//   * Kahan's other sums: two binary16 values added in float32 and converted, add_bits(x, y, FP16,
//     NEAREST) (Figueroa's 24 >= 2 * 11 + 2; LANES16's h2_add, one half).
//   * The conversion rounds infinities and overflows right (unlike the integer rounding of the BF16
//     families, it needs no guard on |t|); a NaN is the unit's, so the watch w keeps the largest
//     |hi| with NaN and a NaN w or a NaN s redoes the output (gemm_fh16_redo).
// On the host (the shim) the conversion is round_f to binary16 (LANES16's h2_pack).
CPD_FN int gemm_fh16_applies(const DotSpec& d) {
  return (int)(!d.has_mul && d.mode == NEAREST && !d.block && is_binary16_format(d.af));
}

// x rounded to nearest binary16, as a float32 (cvt.rn.f16.f32, cvt.f32.f16); ag: binary16's.
CPD_FN float round_half_f(float x, const FormatF& ag) {
#if defined(__CUDA_ARCH__)
  unsigned short h;
  float r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
  (void)ag;
  return r;
#else
  return float_of(round_f(bits_of(x), ag));
#endif
}

// Step k of one output (FUSED16): s = round(s + a*b), w the largest |hi| so far.
CPD_FN void gemm_fh16_step(float& s, float& w, float a, float b, const FormatF& ag) {
  float hi;
  s = round_half_f(float_of(fused_odd(a, b, s, hi)), ag);
  w = fmax_abs_nan(w, hi);
}

// Kahan's step (FKAHAN16): y = round(a*b - c), then t = s + y, c = (t - s) - y, s = t in binary16.
CPD_FN void gemm_fkahan16_step(float& s, float& c, float& w, float a, float b, const FormatF& ag) {
  float hi;
  const float y = round_half_f(float_of(fused_odd(a, b, -c, hi)), ag);
  w = fmax_abs_nan(w, hi);
  kahan_finish(s, c, y, [&ag](float x, float z, int) { return round_half_f(fadd(x, z), ag); });
}

CPD_FN int gemm_fh16_redo(float s, float w) { return (int)(w != w) | gemm_redo(s); }

// F32 / KAHAN32 / FKAHAN32 (gemm_f32_applies): the accumulator float32 itself (is_float32_format:
// no saturation), round to nearest, without blocks (with them: F32B / FF32B below), and what CHAIN
// leaves of it: products rounded to a mul format with subnormals whose values are float32 values
// and with nearest_f_applies (E4M3, E5M2, E4M3FN, FP16, ...; not BF16 or TF32, whose emax leaves no
// room for the product's constant), summed plainly (F32) or with Kahan (KAHAN32), and exact
// products with Kahan (FKAHAN32; exact products summed plainly are CHAIN).
//   * The product is LANESBF's: gemm_f16_product (LANES16's proof: nearest_f_applies, and its
//     clamp lo = 2^(emin + 23 - man) a float32 normal since emin - man >= -149 by values_within),
//     watched against the mul format's max (fmax_abs_nan: NaN too) and redone past it; so every
//     product that is not redone is mul_bits(a, b, m, NEAREST), finite, but for the sign of a
//     zero (its +0 for mul_bits' -0).
//   * Every sum is the float32 unit's addition to nearest, FADD, which is add_bits(x, y, FP32,
//     NEAREST) for finite and infinite x, y: IEEE 754 addition rounded once to nearest even, with
//     gradual underflow (no FTZ: NVRTC's default, the shim's IEEE definitions), +-inf on overflow
//     (outward_bits is inf without saturation) and an exact zero sum +0 unless both terms are -0
//     (IEEE 754 §6.3: zero_sum_sign's rule to nearest). FKAHAN32's y = a*b - c, rounded once as
//     dot_step rounds it (fma_bits(-c, a, b)), is one FFMA (CHAIN's argument). Kahan's order is
//     kahan_step's.
//   * Signs of zeros: s starts at +0 and an exact zero sum is -0 only when both terms are, so s is
//     never -0 and s + p does not depend on the sign of a zero p. Kahan: y = p - c is -0 only for
//     p = -0 and c = +0 (our +0 gives +0 there); t = s + y is the same for either zero y (s is never
//     -0), and c = (t - s) - y = +0 - y is +0 for either (t - s is +0: x - x to nearest), so c is
//     never -0 and nothing after y depends on the zero's sign.
//   * With every product within max, the sums stay finite (|s| <= K max < 2^128 for any K a GPU
//     holds); a NaN or infinite product is seen by the watch, and a NaN sum redoes the output too
//     (gemm_redo, as in CHAIN: a NaN's bits are the unit's). FKAHAN32 has no watch: until a step
//     gives NaN both paths hold the same values and s depends on nothing else (a NaN c reaches s
//     at the next step or never shows), so a NaN s alone redoes.
// Every other output is bit for bit the generic path's.
CPD_FN int gemm_f32_applies(const DotSpec& d) {
  return (int)(is_float32_format(d.af) && d.mode == NEAREST &&
               (d.has_mul ? nearest_f_applies(d.mf, d.mode) && d.mf.subnormals && values_within(d.mf, d.af)
                          : d.kahan || d.block));
}

CPD_FN float f32_add(float x, float y, int) { return fadd(x, y); }  // kahan_step's additions

// Step k of one output (F32): s the sum, w the largest |product| so far; bs = b * scale.
CPD_FN void gemm_f32_step(float& s, float& w, float a, float b, float bs, const GemmBF16& g) {
  const float p = gemm_f16_product(a, b, bs, g.m);
  w = fmax_abs_nan(w, p);
  s = fadd(s, p);
}

// Kahan's step (KAHAN32).
CPD_FN void gemm_kahan32_step(float& s, float& c, float& w, float a, float b, float bs, const GemmBF16& g) {
  const float p = gemm_f16_product(a, b, bs, g.m);
  w = fmax_abs_nan(w, p);
  kahan_step(s, c, p, f32_add);
}

// Kahan's step with the exact product (FKAHAN32): y = a*b - c rounded once, then t, c and s.
CPD_FN void gemm_fkahan32_step(float& s, float& c, float a, float b) { kahan_finish(s, c, ffma(a, b, -c), f32_add); }

// F32B / FF32B: the same with blocks (block = L; Kahan or not, a run-time choice: it only touches a
// run's end), products rounded (F32B) or exact (FF32B). dot_step's order: step k adds its term to
// the block sum bs (FADD of the watched product, or bs = fma(a, b, bs): fma_bits(bs, a, b), one
// FFMA); at a run's end (k + 1 a multiple of L, or K) bs is added to s, plainly (FADD) or as
// Kahan's incoming value (y = bs - c, then t, c, s), and restarts at +0. The arguments above hold
// for bs as for s (it starts at +0, so it is never -0, and a zero product's sign never shows),
// and a NaN bs reaches s at its run's end (the last run ends at k = K - 1).
CPD_FN void gemm_f32b_term(float& bs, float& w, float a, float b, float bsc, const GemmBF16& g) {
  gemm_f32_step(bs, w, a, b, bsc, g);
}

CPD_FN void gemm_ff32b_term(float& bs, float a, float b) { bs = ffma(a, b, bs); }

CPD_FN void gemm_f32b_fold(float& s, float& c, float& bs, int kahan) {
  if (kahan) kahan_step(s, c, bs, f32_add);
  else s = fadd(s, bs);
  bs = 0.0f;
}

// Whether an output must be redone by dot_step: a product past max or NaN (w), or a NaN sum.
CPD_FN int gemm_f32_redo(float s, float w, const GemmBF16& g) { return (int)(!(w <= g.max)) | gemm_redo(s); }

// SR (gemm_sr_applies): stochastic rounding, the formats within sr_lane's reach (accumulate.h
// sr_lane_applies: at most 11 significant bits, the fast cast, a plain signed convention), plain,
// Kahan or blocked. Each rounding of dot_step (the same order, operands and words: dot_term_add,
// kahan_add, the blocks' ends) is hi = the float32 operation to nearest (FMUL, FADD or FFMA) and
// sr_lane(hi), the stochastic cast of hi, which is the exact value's stochastic rounding except on
// the lanes sr_lane flags (about 2^(man - 20) of them, and every |hi| >= the format's max, inf
// and NaN); those are rounded by the exact function (mul_bits, add_bits, fma_bits) on the same
// operands and word, in the step, so an output needs no redo afterwards. The random words are
// the step's dot_words (one Philox4x32-10 block, two with Kahan or at a block's end), in registers.
CPD_FN int gemm_sr_applies(const DotSpec& d) {
  return (int)(d.mode == STOCHASTIC && sr_lane_applies(d.af) && (!d.has_mul || sr_lane_applies(d.mf)));
}

// The exact redo of a flagged lane, out of line on the device: the kernel's code holds one copy of
// each exact function instead of one per output and step of its unrolled loop (the cold path must
// not crowd the hot one out of the instruction cache).
#if CPD_DEVICE
#define CPD_COLD_FN __device__ __noinline__
#else
#define CPD_COLD_FN static inline
#endif
CPD_COLD_FN u32 sr_redo_add(const Format& f, u32 x, u32 y, u32 w, int sr_bits) {
  return add_bits(x, y, f, STOCHASTIC, w, sr_bits);
}
CPD_COLD_FN u32 sr_redo_mul(const Format& f, u32 a, u32 b, u32 w, int sr_bits) {
  return mul_bits(a, b, f, STOCHASTIC, w, sr_bits);
}
CPD_COLD_FN u32 sr_redo_fma(const Format& f, u32 x, u32 a, u32 b, u32 w, int sr_bits) {
  return fma_bits(x, a, b, f, STOCHASTIC, w, sr_bits);
}

CPD_FN u32 sr_add(const Format& f, u32 x, u32 y, u32 w, int sr_bits) {
  u32 redo;
  const u32 v = sr_lane<1>(bits_of(fadd(float_of(x), float_of(y))), f, w, sr_bits, redo);
  return redo ? sr_redo_add(f, x, y, w, sr_bits) : v;
}

CPD_FN u32 sr_term_add(const DotSpec& d, u32 x, u32 ua, u32 ub, const u32* w) {  // dot_term_add
  u32 redo;
  if (d.has_mul) {
    u32 p = sr_lane<1>(bits_of(fmul(float_of(ua), float_of(ub))), d.mf, w[0], d.sr_bits, redo);
    if (redo) p = sr_redo_mul(d.mf, ua, ub, w[0], d.sr_bits);
    return sr_add(d.af, x, p, w[1], d.sr_bits);
  }
  const u32 v = sr_lane<1>(bits_of(ffma(float_of(ua), float_of(ub), float_of(x))), d.af, w[1], d.sr_bits, redo);
  return redo ? sr_redo_fma(d.af, x, ua, ub, w[1], d.sr_bits) : v;
}

CPD_FN void sr_kahan_add(const DotSpec& d, u32& s, u32& c, u32 y, const u32* w) {  // kahan_add
  const u32 t = sr_add(d.af, s, y, w[0], d.sr_bits);
  const u32 ts = sr_add(d.af, t, s ^ SIGN, w[1], d.sr_bits);
  c = sr_add(d.af, ts, y ^ SIGN, w[2], d.sr_bits);
  s = t;
}

// Step k of one output (SR): dot_step's, every rounding as above. run_end: dot_needs_high's block
// end (k + 1 a multiple of the block length, or K), computed once per k by the caller. Written so
// that each rounding appears once (the term's, the block end's, Kahan's three), not once per
// branch of dot_step: the kernel inlines this step for every output of its register tile, and
// NVRTC's time grows with that code (about a minute per architecture for the SR kernel alone when
// each branch had its own copies).
//   term t = round(x + P) with x = bs (blocks), -c (Kahan's y = P - c) or s;
//   blocks, mid-run: bs = t;
//   blocks, run end: y = round(s + t) (plain: that is s), or round(t - c) (Kahan), words 4, ...;
//   Kahan: kahan_add(s, c, y) with words 2.. (no blocks) or 5.. (run end).
CPD_FN void gemm_sr_step(const DotSpec& d, u32 ua, u32 ub, int run_end, u32& s, u32& c, u32& bs, const u32* w) {
  const u32 t = sr_term_add(d, d.block ? bs : (d.kahan ? c ^ SIGN : s), ua, ub, w);
  if (d.block && !run_end) {
    bs = t;
    return;
  }
  u32 y = t;
  if (d.block) {
    bs = 0u;  // the operands' order is dot_step's: (s, bs), (bs, -c)
    y = sr_add(d.af, d.kahan ? t : s, d.kahan ? c ^ SIGN : t, w[4], d.sr_bits);
  }
  if (d.kahan) {  // the words picked by value: an offset chosen at run time would put w in local memory
    const u32 wk[3] = {d.block ? w[5] : w[2], d.block ? w[6] : w[3], d.block ? w[7] : w[4]};
    sr_kahan_add(d, s, c, y, wk);
  } else {
    s = y;
  }
}

// The family of a spec: which kernel of matmul.cu runs it (GEMM_GENERIC: cpd_matmul_tiled).
enum {
  GEMM_GENERIC = 0, GEMM_CHAIN = 1, GEMM_LANES = 2, GEMM_KAHAN = 3, GEMM_LANES16 = 4, GEMM_KAHAN16 = 5,
  GEMM_LANESBF = 6, GEMM_KAHANBF = 7, GEMM_FUSEDBF = 8, GEMM_FKAHANBF = 9, GEMM_SR = 10, GEMM_F32 = 11,
  GEMM_KAHAN32 = 12, GEMM_FKAHAN32 = 13, GEMM_FUSED16 = 14, GEMM_FKAHAN16 = 15, GEMM_F32B = 16, GEMM_FF32B = 17
};

CPD_FN int gemm_family(const DotSpec& d) {
  if (gemm_chain_applies(d)) return GEMM_CHAIN;
  if (gemm_f32_applies(d)) {
    if (d.block) return d.has_mul ? GEMM_F32B : GEMM_FF32B;
    return d.has_mul ? (d.kahan ? GEMM_KAHAN32 : GEMM_F32) : GEMM_FKAHAN32;
  }
  if (gemm_f16_applies(d)) return d.kahan ? GEMM_KAHAN16 : GEMM_LANES16;
  if (gemm_lanes_applies(d)) return d.kahan ? GEMM_KAHAN : GEMM_LANES;
  if (gemm_bf16_applies(d)) return d.kahan ? GEMM_KAHANBF : GEMM_LANESBF;
  if (gemm_fbf16_applies(d)) return d.kahan ? GEMM_FKAHANBF : GEMM_FUSEDBF;
  if (gemm_fh16_applies(d)) return d.kahan ? GEMM_FKAHAN16 : GEMM_FUSED16;
  if (gemm_sr_applies(d)) return GEMM_SR;
  return GEMM_GENERIC;
}

}  // namespace cpd

#endif  // CPD_GEMM_H
