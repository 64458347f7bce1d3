// cpd_cpu helpers for large outputs: streaming (non-temporal) stores of float32 results, and huge
// pages for fresh outputs (Linux). Used by the CPU cast (cast_loops.h) and the MX block casts
// (mx_avx2.h).
//
// A plain store of a line that is not in cache first reads it (read for ownership): an
// out-of-cache cast that stores normally moves 3 units of memory traffic per unit of output
// (read x, read y, write y) where glibc's memcpy of a large buffer moves 2 (its non-temporal
// stores skip the read). Streaming stores skip it too; they pay off only when the output is far
// larger than the caches (a small result would be read back from memory by the next op instead
// of from cache), hence the thresholds. The values stored are the same either way: only the cache
// traffic differs.
//
// Two ways to stream, one fence:
//   * spans (the cast): decide once per call with use_stream(y, bytes) (threshold
//     stream_min_bytes(), 8 MiB, movable by the tests); form each span of results in an L1
//     buffer and store it with stream_out, which streams the whole 64-byte lines of y and stores
//     the partial lines at either end normally (any float alignment);
//   * vectors (the MX casts, AVX2 builds): decide with stream_ok(y, bytes) (threshold
//     kStreamMinBytes, 16 MiB, and a 32-byte aligned y); store 8-float vectors with store8<true>;
//   * either way, end each thread's range with stream_fence(): streamed stores are weakly ordered,
//     and the fence makes them visible before the thread reports its range done.
#ifndef CPD_CPU_STREAM_STORE_H
#define CPD_CPU_STREAM_STORE_H

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#define CPD_CPU_STREAM 1
#else
#define CPD_CPU_STREAM 0  // no streaming stores on this target: use_stream and stream_ok say no
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cpd_cpu {

constexpr bool kStreams = CPD_CPU_STREAM != 0;

// ------------------------------------------------------------------------------------------
// Spans (the cast).

// Outputs of at least this many bytes are streamed (default 8 MiB: well past the L2 caches and a
// fair share of an L3). A variable so that the tests can move it (cast.cpp: stream_min_bytes).
inline std::atomic<int64_t>& stream_min_bytes() {
  static std::atomic<int64_t> bytes{int64_t(8) << 20};
  return bytes;
}

// Whether a call writing `bytes` bytes at y streams its stores (y must hold whole floats: it
// always does for a float32 tensor).
inline bool use_stream(const void* y, int64_t bytes) {
  return kStreams && bytes >= stream_min_bytes().load(std::memory_order_relaxed) && ((uintptr_t)y & 3u) == 0;
}

// y[0 .. m) = buf[0 .. m): the 64-byte lines of y wholly inside the span with streaming
// stores, the partial lines at either end with ordinary stores.
inline void stream_out(float* __restrict y, const float* __restrict buf, int64_t m) {
  int64_t i = std::min<int64_t>(m, (int64_t)((64u - ((uintptr_t)y & 63u)) & 63u) / 4);
  for (int64_t k = 0; k < i; ++k) y[k] = buf[k];
#if defined(__AVX__)
  for (; i + 16 <= m; i += 16) {
    _mm256_stream_ps(y + i, _mm256_loadu_ps(buf + i));
    _mm256_stream_ps(y + i + 8, _mm256_loadu_ps(buf + i + 8));
  }
#elif CPD_CPU_STREAM
  for (; i + 16 <= m; i += 16)
    for (int k = 0; k < 16; k += 4) _mm_stream_ps(y + i + k, _mm_loadu_ps(buf + i + k));
#endif
  for (; i < m; ++i) y[i] = buf[i];
}

// ------------------------------------------------------------------------------------------
// 8-float vectors (the MX casts).

// Outputs of at least this many bytes are streamed (several times a large L3 slice; measured for
// the MX casts, whose blocks are written as whole vectors).
constexpr int64_t kStreamMinBytes = int64_t(16) << 20;

// Whether a result of `bytes` bytes at p should be streamed by store8: an AVX2 build, large, and
// 32-byte aligned (every 8-float vector of a block-aligned walk is then aligned too).
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

// ------------------------------------------------------------------------------------------
// After a range's last streaming store: orders them before whatever follows (the join).
inline void stream_fence() {
#if CPD_CPU_STREAM
  _mm_sfence();
#endif
}

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

}  // namespace cpd_cpu

#endif  // CPD_CPU_STREAM_STORE_H
