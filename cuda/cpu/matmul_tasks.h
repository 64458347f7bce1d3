// The CPU matmul's register chains (matmul_chain.h, matmul_h16.h, matmul_fchain.h): how their
// work is split over the threads (included by matmul.cpp; the chains' headers themselves need no
// torch, so that tests/test_isa_compile.py's probe compiles them alone).
#ifndef CPD_CPU_MATMUL_TASKS_H
#define CPD_CPU_MATMUL_TASKS_H

#include <algorithm>
#include <cstdint>
#include <vector>

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

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_TASKS_H
