// cpd_cpu: what the calling thread's floating-point unit does, asked at run time by the CPU loops
// that lean on IEEE float32 arithmetic (the wire hops, the matmul's binary32 lanes).
#ifndef CPD_CPU_FP_ENV_H
#define CPD_CPU_FP_ENV_H

#include "cpd/numerics.h"

namespace cpd_cpu {

// Whether this thread's float32 unit keeps subnormals (2^-149 + 2^-149 = 2^-148; under DAZ or
// FTZ, e.g. after torch.set_flush_denormal(True), 0). The control register is per thread, so a
// loop asks on the thread that runs it.
inline bool float32_subnormals_kept() {
  volatile float t = cpd::float_of(1u);
  return cpd::bits_of(t + t) == 2u;
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_FP_ENV_H
