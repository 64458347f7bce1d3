// cpd_cpu helpers for large outputs: streaming (non-temporal) stores of float32 results (AVX2
// builds only) and huge pages for fresh outputs (Linux).
//
// A plain store of a line that is not in cache first reads it (read for ownership): an
// out-of-cache cast that stores normally moves 3 units of memory traffic per unit of output
// (read x, read y, write y) where glibc's memcpy of a large buffer -- and so out.copy_(x) --
// moves 2 (its non-temporal stores skip the read). Streaming stores skip it too; they pay off
// only when the output is far larger than the caches (a small result would be read back from
// memory by the next op instead of from cache), hence the threshold.
//
// Use: decide once per call with stream_ok(y, bytes); store 32-byte-aligned 8-float vectors
// with store8<true>; end each thread's range with stream_fence() (the streamed stores are
// weakly ordered: the fence makes them visible before the thread reports its range done).
// The values stored are the same either way: only the cache traffic differs.
#ifndef CPD_CPU_STREAM_STORE_H
#define CPD_CPU_STREAM_STORE_H

#include <cstddef>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cpd_cpu {

// Outputs of at least this many bytes are streamed (several times a large L3 slice; smaller
// results are likely to be read again soon, from cache).
constexpr int64_t kStreamMinBytes = int64_t(16) << 20;

// Whether a result of `bytes` bytes at p should be streamed: large, and 32-byte aligned (every
// 8-float vector of a block-aligned walk is then aligned too).
inline bool stream_ok(const void* p, int64_t bytes) {
#if defined(__AVX2__)
  return bytes >= kStreamMinBytes && (reinterpret_cast<uintptr_t>(p) & 31u) == 0;
#else
  (void)p, (void)bytes;
  return false;
#endif
}

#if defined(__AVX2__)
// Eight floats to p: streamed (p 32-byte aligned) or a plain unaligned store.
template <bool STREAM>
inline void store8(float* p, __m256 v) {
  if constexpr (STREAM) _mm256_stream_ps(p, v);
  else _mm256_storeu_ps(p, v);
}
#endif

// A fresh output of `bytes` bytes at p (just allocated, not yet written): ask Linux for
// transparent huge pages over it (where THP is "madvise", the common default), so that its first
// writes take one page fault per 2 MiB instead of one per 4 KiB -- for a 32 MiB result about
// 20 ms of faults become about 5. Only outputs of at least kHugeMinBytes; a hint, its failure is
// ignored; the values written are the same either way.
constexpr int64_t kHugeMinBytes = int64_t(4) << 20;
inline void advise_huge(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kHugeMinBytes) return;
  const uintptr_t page = 4096, b = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = (b + page - 1) / page * page, hi = (b + (uintptr_t)bytes) / page * page;
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

inline void stream_fence() {
#if defined(__AVX2__)
  _mm_sfence();
#endif
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_STREAM_STORE_H
