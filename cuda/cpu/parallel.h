// cpd_cpu::parallel_for: at::parallel_for where the extension is compiled with OpenMP, and the
// same split over ATen's thread pool (at::launch) where it is not (Apple clang without libomp,
// CPD_CPU_OPENMP=0). ATen's own at::parallel_for is an inline template that is serial in a
// translation unit compiled without OpenMP when torch itself uses OpenMP, so the extension
// carries its own. Every loop of the extension gives the same bits for any split (an element
// depends only on its operands and its random words), so the two are interchangeable.
//
// Without OpenMP: the range is cut into at most at::get_num_threads() chunks of at least `grain`
// elements; chunks are claimed from an atomic counter by the calling thread and by up to
// chunks - 1 tasks queued on ATen's inter-op pool. The caller claims chunks too, so it never
// waits for a task that has not started (no deadlock when the pool is busy or the call is nested:
// then the caller simply runs every chunk); it waits only for chunks other threads are running.
// The first exception thrown by f is rethrown in the caller. Every chunk runs with subnormals kept
// (fp_env.h KeepSubnormals), whatever flush mode its thread was left in.
#ifndef CPD_CPU_PARALLEL_H
#define CPD_CPU_PARALLEL_H

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "fp_env.h"

#if !defined(_OPENMP)
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#endif

namespace cpd_cpu {

#if defined(_OPENMP)
constexpr bool kOpenMP = true;

template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, [&f](int64_t b, int64_t e) {
    KeepSubnormals keep;  // per chunk, on the thread that runs it (fp_env.h)
    f(b, e);
  });
}
#else
constexpr bool kOpenMP = false;

struct ForState {
  std::atomic<int64_t> next{0};
  int64_t done = 0;  // chunks finished, under m
  std::mutex m;
  std::condition_variable cv;
  std::exception_ptr error;
};

inline thread_local bool in_cpd_parallel = false;

template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const int64_t n = end - begin, g = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(std::max(at::get_num_threads(), 1), (n + g - 1) / g);
  if (chunks <= 1 || in_cpd_parallel) {
    KeepSubnormals keep;  // fp_env.h
    f(begin, end);
    return;
  }
  const int64_t size = (n + chunks - 1) / chunks;
  auto st = std::make_shared<ForState>();
  // Runs chunks until none is left; f is touched only for a claimed chunk, and every chunk is
  // claimed before the caller returns, so a task that starts late never sees a dangling f.
  auto work = [st, begin, end, size, chunks, &f]() {
    const bool outer = in_cpd_parallel;
    in_cpd_parallel = true;
    for (int64_t i; (i = st->next.fetch_add(1)) < chunks;) {
      std::exception_ptr err;
      try {
        KeepSubnormals keep;  // fp_env.h
        f(begin + i * size, std::min(end, begin + (i + 1) * size));
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(st->m);
      if (err && !st->error) st->error = err;
      if (++st->done == chunks) st->cv.notify_all();
    }
    in_cpd_parallel = outer;
  };
  for (int64_t t = 1; t < chunks; ++t) at::launch(work);
  work();
  std::unique_lock<std::mutex> lock(st->m);
  st->cv.wait(lock, [&] { return st->done == chunks; });
  if (st->error) std::rethrow_exception(st->error);
}
#endif

}  // namespace cpd_cpu

#endif  // CPD_CPU_PARALLEL_H
