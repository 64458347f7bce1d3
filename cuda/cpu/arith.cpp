// CPU loops over the core's exact arithmetic: elementwise mul/add/fma rounded once to a format,
// and sequential sums. Bound into the extension module by cast.cpp.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "cpd/numerics.h"
#include "parallel.h"

namespace {

constexpr int64_t kArithGrain = 1 << 14;

enum { OP_MUL = 0, OP_ADD = 1, OP_FMA = 2 };

template <int OP>
void arith_loop(const float* a, const float* b, const float* c, float* y, int64_t n, const cpd::Format f, int mode,
                int sr_bits, uint64_t seed, uint64_t offset) {
  cpd_cpu::parallel_for(0, n, kArithGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;
    for (int64_t i = lo; i < hi; ++i) {
      uint32_t r = mode == cpd::STOCHASTIC ? cpd::random_word((uint64_t)i, seed, offset) : 0u;
      uint32_t ua = cpd::bits_of(a[i]), ub = cpd::bits_of(b[i]), v;
      if (OP == OP_MUL) v = cpd::mul_bits(ua, ub, g, mode, r, sr_bits);
      else if (OP == OP_ADD) v = cpd::add_bits(ua, ub, g, mode, r, sr_bits);
      else v = cpd::fma_bits(cpd::bits_of(c[i]), ua, ub, g, mode, r, sr_bits);
      y[i] = cpd::float_of(v);
    }
  });
}

// add_bits on spans: when every element of a span has both operands in the format, the fast
// identity of add_bits_fast holds and the span takes the vectorized loop; otherwise the exact
// loop. The operands are checked before anything is written (out may alias a or b).
void add_nearest_fast(const float* a, const float* b, float* y, int64_t n, const cpd::Format f) {
  constexpr int64_t kSpan = 1024;
  cpd_cpu::parallel_for(0, n, kArithGrain, [&](int64_t lo, int64_t hi) {
    const cpd::Format g = f;
    for (int64_t s0 = lo; s0 < hi; s0 += kSpan) {
      const int64_t s1 = std::min(hi, s0 + kSpan);
      uint32_t all = 1;
      for (int64_t i = s0; i < s1; ++i) all &= cpd::add_fast_operands(cpd::bits_of(a[i]), cpd::bits_of(b[i]), g);
      if (all) {
        for (int64_t i = s0; i < s1; ++i) y[i] = cpd::float_of(cpd::add_bits_fast(cpd::bits_of(a[i]), cpd::bits_of(b[i]), g));
      } else {
        for (int64_t i = s0; i < s1; ++i)
          y[i] = cpd::float_of(cpd::add_bits(cpd::bits_of(a[i]), cpd::bits_of(b[i]), g, cpd::NEAREST, 0u, 32));
      }
    }
  });
}

}  // namespace

// out = round(a * b), round(a + b) or round(c + a * b); contiguous float32 tensors of one shape.
void arith_out(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
               at::Tensor& out, int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals,
               int64_t mode, bool saturate, int64_t sr_bits, int64_t seed, int64_t offset) {
  const cpd::Format f = cpd::make_format((int)exp, (int)man, (int)bias, (int)specials, subnormals ? 1 : 0,
                                         saturate ? 1 : 0);
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  const float* cp = op == OP_FMA ? c.data_ptr<float>() : nullptr;
  float* yp = out.data_ptr<float>();
  const int64_t n = out.numel();
  const uint64_t s = (uint64_t)seed, o = (uint64_t)offset;
  switch (op) {
    case OP_MUL: arith_loop<OP_MUL>(ap, bp, cp, yp, n, f, (int)mode, (int)sr_bits, s, o); break;
    case OP_ADD:
      if (cpd::add_fast_applies(f, (int)mode)) add_nearest_fast(ap, bp, yp, n, f);
      else arith_loop<OP_ADD>(ap, bp, cp, yp, n, f, (int)mode, (int)sr_bits, s, o);
      break;
    case OP_FMA: arith_loop<OP_FMA>(ap, bp, cp, yp, n, f, (int)mode, (int)sr_bits, s, o); break;
    default: TORCH_CHECK(false, "cpd: unknown arithmetic op ", op);
  }
}
