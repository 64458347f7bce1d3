// cpd numerics core, philox.h: Philox4x32-10, the counter-based generator behind stochastic rounding.
// Part of the numerics core; see cpd/numerics.h for the rules every part follows.
#ifndef CPD_PHILOX_H
#define CPD_PHILOX_H

#include "cpd/base.h"

namespace cpd {

// ------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., SC'11): a counter-based generator. Element i of a cast draws
// word (i & 3) of philox(counter = {i >> 2 (64 bits), offset (64 bits)}, key = seed), so its
// random bits depend only on (seed, offset, i): the same on any thread count and on CPU or GPU.
// The CPU extension runs the same rounds on vectors of blocks (cuda/cpu/philox_simd.h: AVX-512,
// AVX2, SSE4.1, NEON); its words are those of philox4x32_10 bit for bit (random_words() exposes
// this one).
enum { PHILOX_ROUNDS = 10 };  // cpd/_fallback.py PHILOX_ROUNDS must match

struct U32x4 {
  u32 v[4];
};

CPD_FN void mulhilo(u32 a, u32 b, u32& hi, u32& lo) {
  u64 p = (u64)a * (u64)b;
  hi = (u32)(p >> 32);
  lo = (u32)p;
}

CPD_FN U32x4 philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
  for (int i = 0; i < PHILOX_ROUNDS; ++i) {
    if (i) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    u32 hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  U32x4 out;
  out.v[0] = c0;
  out.v[1] = c1;
  out.v[2] = c2;
  out.v[3] = c3;
  return out;
}

// The random word of element i for a launch keyed by (seed, offset).
CPD_FN u32 random_word(u64 i, u64 seed, u64 offset) {
  u64 block = i >> 2;
  U32x4 w = philox4x32_10((u32)block, (u32)(block >> 32), (u32)offset, (u32)(offset >> 32), (u32)seed,
                          (u32)(seed >> 32));
  const u32 j = (u32)i & 3u;  // selects, not w.v[j]: an array indexed at run time lives in local memory
  return j == 0u ? w.v[0] : j == 1u ? w.v[1] : j == 2u ? w.v[2] : w.v[3];
}

}  // namespace cpd

#endif  // CPD_PHILOX_H
