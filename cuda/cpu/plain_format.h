// cpd_cpu: a format whose convention fields hold compile-time constants, for the CPU loops.
//
// The compiler folds a format field that holds a compile-time constant. The float32 matmul lanes
// (matmul_f32.h) and the cast loops (cast_loops.h) run on a local copy of the format whose
// conventions are set to the constants they hold for the common formats (signed, a zero of each
// sign, subnormals on), when they do (one branch per call or pass), so that those selects drop
// out of the loop: the same numerics functions on the same values.
#ifndef CPD_CPU_PLAIN_FORMAT_H
#define CPD_CPU_PLAIN_FORMAT_H

#include "cpd/numerics.h"

namespace cpd_cpu {

inline bool plain_lane_format(const cpd::Format& f) {
  return f.is_signed == 1u && f.uz == 0u && f.no_zero == 0u && f.subnormals == 1;
}

inline cpd::Format plain_lanes(const cpd::Format& f) {
  cpd::Format h = f;
  h.is_signed = 1u;
  h.uz = 0u;
  h.no_zero = 0u;
  h.subnormals = 1;
  return h;
}

// For fast formats with 1 <= man <= 22: the nearest rounding's even bit is the last kept
// mantissa bit (cast.h round_normal_fast: parity_add = 0, lsb_bit = 1).
inline cpd::Format mantissa_lanes(const cpd::Format& f) {
  cpd::Format h = f;
  h.parity_add = 0u;
  h.lsb_bit = 1u;
  return h;
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_PLAIN_FORMAT_H
