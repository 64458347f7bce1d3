// Cycles per element of the CPU extension's cast loops (cuda/cpu/cast_loops.h), in cache, by the
// time-stamp counter: the stochastic cast (cast_sr_range: Philox words and cast fused) and the
// round-to-nearest cast (cast_det_range) of float32 data (randn * 100) to E5M2, E4M3, FP16 and
// BF16, the best of many short runs. No torch: one file against the headers, so that two checkouts
// can be compared side by side on a shared machine, where the Python benchmarks' ratios move by
// more than a loop change does (tests/test_isa_compile.py builds and runs it once, briefly).
//
// From the repository root (ROOT: this checkout, or another one for an A/B; run the two binaries
// alternately):
//   g++ -std=c++17 -O3 -march=native -ffp-contract=off -fno-fast-math -I $ROOT/cuda/include \
//       -I $ROOT/cuda/cpu benchmarks/cycles_cast.cpp -o /tmp/cycles_cast && /tmp/cycles_cast [reps]
// x86-64 only (__rdtsc). Prints the ISA of the build and one line of TSC cycles per element.
// The output array starts 1 KiB past a 4 KiB multiple of the input: with x and y a multiple of
// 4 KiB apart, loads and stores alias in the store buffer's address check and the same loop
// measured 30% slower (Zen 3).
#include <x86intrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "cast_loops.h"

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 300;
  constexpr int64_t n = 1 << 14;  // 64 KiB of input and of output: in L2
  float* buf = static_cast<float*>(std::aligned_alloc(4096, 3 * n * sizeof(float) + 8192));
  float* x = buf;
  float* y = buf + n + 256;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = normal(gen);
  const cpd::Format formats[4] = {cpd::make_format(5, 2, 15, cpd::SPECIALS_IEEE, 1, 0),
                                  cpd::make_format(4, 3, 7, cpd::SPECIALS_FN, 1, 0),
                                  cpd::make_format(5, 10, 15, cpd::SPECIALS_IEEE, 1, 0),
                                  cpd::make_format(8, 7, 127, cpd::SPECIALS_IEEE, 1, 0)};
  const char* names[4] = {"e5m2", "e4m3", "fp16", "bf16"};
  std::printf("cycles_cast: %s, %lld floats in cache, best of %d\n", cpd_cpu::isa_name(), (long long)n, reps);
  for (int k = 0; k < 4; ++k) {
    double sr = 1e30, nearest = 1e30;
    for (int r = 0; r < reps; ++r) {
      const uint64_t t0 = __rdtsc();
      cpd_cpu::cast_sr_range<true, true, false>(x, y, n, 0, n / 4, formats[k], 32, 12345u + (uint64_t)r, 0);
      const uint64_t t1 = __rdtsc();
      cpd_cpu::cast_det_range<cpd::NEAREST, true, true, false>(x, y, 0, n, formats[k]);
      const uint64_t t2 = __rdtsc();
      sr = std::min(sr, (double)(t1 - t0) / n);
      nearest = std::min(nearest, (double)(t2 - t1) / n);
    }
    std::printf("%s stochastic %.3f nearest %.3f  ", names[k], sr, nearest);
  }
  std::printf("(TSC cycles per element)\n");
  std::free(buf);
  return 0;
}
