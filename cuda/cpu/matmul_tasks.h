// The CPU matmul's parallel helpers (included by matmul.cpp): how the register chains
// (matmul_chain.h, matmul_h16.h, matmul_fchain.h) split their work over the threads, and the scans
// of the operands that pick a loop. (The chains' headers themselves need no torch, so that
// tests/test_isa_compile.py's probe compiles them alone.)
#ifndef CPD_CPU_MATMUL_TASKS_H
#define CPD_CPU_MATMUL_TASKS_H

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "cpd/numerics.h"
#include "parallel.h"

namespace cpd_cpu {

// The register chains' tasks: (batch element, column panel of nr columns, up to rows rows), split
// over the threads; task(bi, m0, m1, j0, nc, pack) runs rows m0 .. m1 of element bi on columns
// j0 .. j0 + nc (nc <= nr), pack: the thread's panel buffer (a task packs its panel). A panel's
// row blocks are consecutive tasks.
template <class F>
inline void chain_tasks(int64_t B, int64_t M, int64_t N, int64_t nr, int64_t rows, const F& task) {
  const int64_t panels = (N + nr - 1) / nr, rblocks = (M + rows - 1) / rows;
  parallel_for(0, B * panels * rblocks, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> pack;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t bi = t / (panels * rblocks), p = (t / rblocks) % panels, rb = t % rblocks;
      const int64_t j0 = p * nr, m0 = rb * rows;
      task(bi, m0, std::min(M, m0 + rows), j0, std::min(nr, N - j0), pack);
    }
  });
}

// Whether x[0 .. n) holds a magnitude whose float32 bits are at least lo: a NaN for
// lo = INF_BITS + 1, an infinity or NaN for lo = INF_BITS (one vectorized pass per span, in
// parallel).
inline bool any_at_least(const float* x, int64_t n, uint32_t lo) {
  std::atomic<bool> found{false};
  parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
    uint32_t hit = 0;
    for (int64_t i = i0; i < i1; ++i) hit |= (uint32_t)((cpd::bits_of(x[i]) & ~cpd::SIGN) >= lo);
    if (hit) found = true;
  });
  return found;
}

// The largest magnitude's float32 bits in x[0 .. n) (above INF_BITS: a NaN; one vectorized pass per
// span, in parallel).
inline uint32_t max_magnitude_bits(const float* x, int64_t n) {
  std::atomic<uint32_t> top{0u};
  parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
    uint32_t m = 0u;
    for (int64_t i = i0; i < i1; ++i) {
      const uint32_t u = cpd::bits_of(x[i]) & ~cpd::SIGN;
      m = m > u ? m : u;
    }
    uint32_t cur = top.load();
    while (m > cur && !top.compare_exchange_weak(cur, m)) {
    }
  });
  return top.load();
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_TASKS_H
