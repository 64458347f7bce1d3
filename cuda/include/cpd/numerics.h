// cpd numerics core: every rounding decision of cpd lives in the headers this file includes
// (cuda/include/cpd/*.h) and nowhere else.
//
// It is compiled three ways from the same text:
//   * by the host C++ compiler for the CPU extension (cuda/cpu/*.cpp, OpenMP loops);
//   * by NVRTC for the CUDA kernels (cuda/kernels/*.cu), which has no system headers;
//   * never by anything that would enable fast-math: the CPU build uses -ffp-contract=off and
//     NVRTC gets --fmad=false, because the float multiply in cpd_compose must be exact.
// Hence: no system #include, plain types only, and a macro that marks functions for host and device.
//
// Vocabulary used throughout (all exponents unbiased):
//   a      |x| as float32 bits (sign cleared)          x = (-1)^s * M * 2^eq
//   M      24-bit integer significand of a (implicit bit included for normals)
//   eq     exponent of M's last bit: max(field,1) - 150
//   E      floor(log2 |x|)
//   ee     max(E, emin): the binade the result lives in (emin for the format's subnormals)
//   qexp   ee - man: exponent of the format's quantum (ulp) in that binade
//   d      qexp - eq >= 0: how many low bits of M fall below the quantum
//   r      M >> d, the result significand counted in quanta: result = r * 2^qexp
//
// The core is split by concern; this umbrella header includes every part, and is what the CPU
// sources, the CUDA kernels and the C++ tests include:
//   base.h        types, CPD_FN (host/device), bit casts, branch-free selects, exact float ops
//   format.h      Format (the descriptor built from FloatFormat), compose, split
//   cast.h        rounding one value: round_mag, finish_cast, the fast path, cast_bits
//   codes.h       encode_value_bits / decode_bits
//   arith.h       exact a*b, a+b, c+a*b rounded once (Wide), and the float32-lane forms (FormatF)
//   philox.h      Philox4x32-10 and random_word
//   accumulate.h  DotSpec / dot_step (matmul, sum), and the float64-lane forms (FormatD)
//   fused_dot.h   FusedDotSpec / fused_dot_step: the tensor-core fused dot product (cpd.tensor_core)
//   block.h       BlockSpec: block-scaled formats (cpd.mx): shared scales, elements against them
// The parts include each other only through "cpd/<part>.h" (NVRTC receives them all as in-memory
// headers under those names) and never include a system header.
#ifndef CPD_NUMERICS_H
#define CPD_NUMERICS_H

#include "cpd/base.h"
#include "cpd/format.h"
#include "cpd/cast.h"
#include "cpd/codes.h"
#include "cpd/arith.h"
#include "cpd/philox.h"
#include "cpd/accumulate.h"
#include "cpd/fused_dot.h"
#include "cpd/block.h"

#endif  // CPD_NUMERICS_H
