// cpd host shim: compiles the CUDA kernels of cuda/kernels/*.cu as host C++ and runs a launch
// on the CPU, so the test suite executes the real kernel text on machines without a GPU.
//
// Built by cpd/_shim.py, one shared library per kernel file: a generated translation unit
// includes this header, then the .cu file, then the table of its kernels (CPD_SHIM_KERNEL).
// Python launches a kernel through cpd_shim_launch with the *same* parameter array that
// cpd/_cuda.py hands to cuLaunchKernel (void* per parameter, built by cpd/_kernels.py), plus the
// byte size of every parameter, which the shim checks against the kernel's C++ signature (a
// marshalling mistake fails here, where the driver would silently read garbage).
//
// What is emulated:
//   * __global__, __device__, __host__, __forceinline__, __launch_bounds__: host functions.
//   * threadIdx, blockIdx, blockDim, gridDim: per-launch state, set by the scheduler before it
//     resumes each GPU thread.
//   * A block's threads are fibers (ucontext) on the calling OS thread, run in order
//     0, 1, 2, ... until each finishes or reaches __syncthreads(); when every thread of the block
//     waits at the barrier, they all resume (a barrier reached by some threads only is reported
//     as an error, as it is undefined behaviour on a GPU). Blocks run one after another.
//   * Warp-level primitives (__shfl_sync, __shfl_xor_sync, __shfl_up_sync, __shfl_down_sync,
//     __syncwarp): threads t and u are lanes t % 32 and u % 32 of warp t / 32 (x fastest, as on a
//     GPU). A lane that calls one waits (its fiber yields) until every lane its mask names has
//     called it too -- or has exited, as PTX's shfl.sync/bar.warp.sync on sm_70 and later, which
//     wait for the non-exited threads of the mask -- then each gets its source lane's value,
//     computed as the CUDA programming guide defines it (width segments; up/down/xor past the
//     segment return the caller's own value). What a GPU leaves undefined is reported as an error
//     of the launch: a mask without the caller's lane, lanes of one mask meeting at different
//     operations or widths, a width that is not a power of two up to 32, reading a lane outside
//     the mask or one that has exited, and a warp operation that can never complete (a lane of
//     its mask waits at __syncthreads() or at another mask for ever).
//   * __shared__: `static thread_local` storage, one copy per OS thread, i.e. shared by the
//     fibers of the block being run (as on a GPU, it is not initialized at block start).
//   * Device intrinsics the numerics core uses (__fadd_rn, __fmaf_rn, __float_as_uint, __clzll,
//     ...): their IEEE definitions on the host. The library is compiled with -ffp-contract=off
//     and without fast-math (NVRTC gets --fmad=false), so float operations round as written.
//   * __CUDACC_RTC__ is defined after the system headers, so the numerics core takes its device
//     branches (CPD_DEVICE = 1): the text NVRTC compiles is the text the shim runs.
// Not emulated: warp votes and match (__ballot_sync, __any_sync, ...), atomics, dynamic shared
// memory, streams (a launch runs to completion before returning).
#ifndef CPD_SHIM_H
#define CPD_SHIM_H

#include <ucontext.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

// ------------------------------------------------------------------------------ CUDA keywords
#ifdef CPD_SHIM_SCAN
#define __global__ __cpd_shim_kernel__  // survives preprocessing: cpd/_shim.py finds kernels by it
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __CUDACC_RTC__ 1

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

static thread_local uint3 threadIdx;
static thread_local uint3 blockIdx;
static thread_local dim3 blockDim;
static thread_local dim3 gridDim;

// ------------------------------------------------------------------------------ intrinsics
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline long long __double_as_longlong(double x) {
  long long u;
  std::memcpy(&u, &x, 8);
  return u;
}
inline double __longlong_as_double(long long u) {
  double x;
  std::memcpy(&x, &u, 8);
  return x;
}
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline double __dadd_rn(double x, double y) { return x + y; }
inline double __dmul_rn(double x, double y) { return x * y; }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// ------------------------------------------------------------------------------ scheduler
namespace cpd_shim {

enum { RUNNING = 0, AT_BARRIER = 1, DONE = 2, AT_WARP = 3 };
const size_t kStack = 128 * 1024;  // per GPU thread; kernels keep small local arrays only

// The warp operations (Fiber::op).
enum { SHFL_IDX = 0, SHFL_UP = 1, SHFL_DOWN = 2, SHFL_XOR = 3, SYNC_WARP = 4 };
inline const char* op_name(int op) {
  static const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                "__syncwarp"};
  return names[op];
}

struct Fiber {
  ucontext_t ctx;
  int state;
  uint3 idx;
  // At a warp operation (state AT_WARP): what it is, and the value it offers; then its result.
  int op, width, arg;
  unsigned mask;
  unsigned long long value, result;
};

typedef void (*Invoke)(void* fn, void** params);

struct Launch {
  void* fn;
  Invoke invoke;
  void** params;
};

static thread_local ucontext_t sched_ctx;
static thread_local Fiber* current = nullptr;
static thread_local Launch launch_now;
static thread_local char* stacks = nullptr;
static thread_local size_t stacks_n = 0;

inline void fiber_entry() {
  launch_now.invoke(launch_now.fn, launch_now.params);
  current->state = DONE;  // returns to uc_link = sched_ctx
}

inline void barrier() {
  if (current == nullptr) return;  // not inside a launch
  current->state = AT_BARRIER;
  swapcontext(&current->ctx, &sched_ctx);
}

// A warp operation of the calling GPU thread: offers `value`, waits for the lanes of `mask`
// (resolve_warps), returns what it receives.
inline unsigned long long warp_op(int op, unsigned mask, unsigned long long value, int arg, int width) {
  if (current == nullptr) {
    std::fprintf(stderr, "cpd shim: %s called outside a kernel launch\n", op_name(op));
    std::abort();
  }
  Fiber* f = current;
  f->op = op;
  f->mask = mask;
  f->value = value;
  f->arg = arg;
  f->width = width;
  f->state = AT_WARP;
  swapcontext(&f->ctx, &sched_ctx);
  return f->result;
}

// Lane `lane`'s source lane for op (CUDA programming guide, warp shuffle functions): within its
// segment of `width` lanes; up/down past the segment, and xor into a later segment, read the
// caller's own lane.
inline unsigned source_lane(int op, unsigned lane, int arg, int width) {
  const unsigned w = (unsigned)width, seg = lane & ~(w - 1u), pos = lane & (w - 1u);
  switch (op) {
    case SHFL_IDX: return seg + ((unsigned)arg & (w - 1u));
    case SHFL_UP: return pos >= (unsigned)arg ? lane - (unsigned)arg : lane;
    case SHFL_DOWN: return pos + (unsigned)arg < w ? lane + (unsigned)arg : lane;
    case SHFL_XOR: {
      const unsigned src = (lane ^ (unsigned)arg) & 31u;
      return src >= seg + w ? lane : src;
    }
    default: return lane;
  }
}

// Completes every warp operation whose lanes have all arrived (the non-exited lanes of its mask,
// at the same operation with the same mask); returns how many threads it released, or -1 after
// writing an error (undefined behaviour on a GPU).
inline long resolve_warps(Fiber* fibers, size_t nt, char* err, size_t errlen) {
  long released = 0;
  for (size_t t = 0; t < nt; ++t) {
    Fiber& f = fibers[t];
    if (f.state != AT_WARP) continue;
    const size_t base = t / 32 * 32;
    const unsigned lane = (unsigned)(t % 32);
    if (!((f.mask >> lane) & 1u)) {
      std::snprintf(err, errlen, "thread %zu (lane %u) calls %s with mask %#x, which leaves its lane out", t, lane,
                    op_name(f.op), f.mask);
      return -1;
    }
    if (f.op != SYNC_WARP && (f.width < 1 || f.width > 32 || (f.width & (f.width - 1)))) {
      std::snprintf(err, errlen, "thread %zu calls %s with width %d (a power of two up to 32)", t, op_name(f.op),
                    f.width);
      return -1;
    }
    bool ready = true;
    for (unsigned l = 0; l < 32 && ready; ++l) {
      if (!((f.mask >> l) & 1u) || base + l >= nt) continue;  // past the block: no such thread
      const Fiber& g = fibers[base + l];
      if (g.state == DONE) continue;
      if (g.state != AT_WARP || g.mask != f.mask) {
        ready = false;  // elsewhere: it may still come (or never: run() reports that)
      } else if (g.op != f.op || g.width != f.width) {
        std::snprintf(err, errlen, "lanes %u and %u of warp %zu meet with mask %#x at %s (width %d) and %s (width %d)",
                      lane, l, t / 32, f.mask, op_name(f.op), f.width, op_name(g.op), g.width);
        return -1;
      }
    }
    if (!ready) continue;
    for (unsigned l = 0; l < 32; ++l) {
      if (!((f.mask >> l) & 1u) || base + l >= nt || fibers[base + l].state == DONE) continue;
      Fiber& g = fibers[base + l];
      if (g.op == SYNC_WARP) continue;
      const unsigned src = source_lane(g.op, l, g.arg, g.width);
      const bool in_mask = (f.mask >> src) & 1u;
      if (src != l && (!in_mask || base + src >= nt || fibers[base + src].state == DONE)) {
        std::snprintf(err, errlen, "lane %u of warp %zu reads lane %u through %s with mask %#x: %s", l, t / 32, src,
                      op_name(g.op), f.mask, in_mask ? "it has exited or does not exist" : "a lane outside the mask");
        return -1;
      }
      g.result = fibers[base + src].value;
    }
    for (unsigned l = 0; l < 32; ++l) {
      if (!((f.mask >> l) & 1u) || base + l >= nt || fibers[base + l].state == DONE) continue;
      fibers[base + l].state = RUNNING;
      ++released;
    }
  }
  return released;
}

// Names the first thread stuck at a warp operation, and where a lane of its mask is.
inline void describe_stuck_warp(const Fiber* fibers, size_t nt, char* err, size_t errlen) {
  for (size_t t = 0; t < nt; ++t) {
    const Fiber& f = fibers[t];
    if (f.state != AT_WARP) continue;
    const size_t base = t / 32 * 32;
    for (unsigned l = 0; l < 32; ++l) {
      if (!((f.mask >> l) & 1u) || base + l >= nt) continue;
      const Fiber& g = fibers[base + l];
      if (g.state == AT_BARRIER || (g.state == AT_WARP && g.mask != f.mask)) {
        std::snprintf(err, errlen, "thread %zu waits at %s with mask %#x for ever: lane %u of its warp waits at %s",
                      t, op_name(f.op), f.mask, l, g.state == AT_BARRIER ? "__syncthreads()" : op_name(g.op));
        return;
      }
    }
  }
  std::snprintf(err, errlen, "a warp operation never completes");
}

// Calls fn (a kernel, through invoke) once per GPU thread of the grid; 0 on success.
inline int run(void* fn, Invoke invoke, void** params, dim3 grid, dim3 block, char* err, size_t errlen) {
  const size_t nt = (size_t)block.x * block.y * block.z;
  if (nt > stacks_n) {
    std::free(stacks);
    stacks = (char*)std::malloc(nt * kStack);  // untouched pages cost nothing
    if (!stacks) {
      stacks_n = 0;
      std::snprintf(err, errlen, "out of memory for %zu fiber stacks", nt);
      return 2;
    }
    stacks_n = nt;
  }
  Fiber* fibers = new Fiber[nt];
  launch_now = Launch{fn, invoke, params};
  gridDim = grid;
  blockDim = block;
  int rc = 0;
  for (unsigned bz = 0; bz < grid.z && !rc; ++bz)
    for (unsigned by = 0; by < grid.y && !rc; ++by)
      for (unsigned bx = 0; bx < grid.x && !rc; ++bx) {
        blockIdx = uint3{bx, by, bz};
        for (size_t t = 0; t < nt; ++t) {
          Fiber& f = fibers[t];
          f.state = RUNNING;
          f.idx = uint3{(unsigned)(t % block.x), (unsigned)(t / block.x % block.y),
                        (unsigned)(t / ((size_t)block.x * block.y))};
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = stacks + t * kStack;
          f.ctx.uc_stack.ss_size = kStack;
          f.ctx.uc_link = &sched_ctx;
          makecontext(&f.ctx, fiber_entry, 0);
        }
        for (;;) {  // one pass: every runnable thread runs to its next barrier, warp operation or end
          size_t done = 0, waiting = 0, at_warp = 0;
          for (size_t t = 0; t < nt; ++t) {
            Fiber& f = fibers[t];
            if (f.state != RUNNING) continue;
            threadIdx = f.idx;
            current = &f;
            swapcontext(&sched_ctx, &f.ctx);
            current = nullptr;
          }
          const long released = resolve_warps(fibers, nt, err, errlen);
          if (released < 0) {
            rc = 4;
            break;
          }
          if (released > 0) continue;
          for (size_t t = 0; t < nt; ++t) {
            const int st = fibers[t].state;
            (st == DONE ? done : st == AT_WARP ? at_warp : waiting) += 1;
          }
          if (at_warp != 0) {
            describe_stuck_warp(fibers, nt, err, errlen);
            rc = 4;
            break;
          }
          if (waiting == 0) break;
          if (done != 0) {
            std::snprintf(err, errlen,
                          "block (%u, %u, %u): %zu threads wait at __syncthreads() while %zu have exited",
                          bx, by, bz, waiting, done);
            rc = 3;
            break;
          }
          for (size_t t = 0; t < nt; ++t) fibers[t].state = RUNNING;  // all at the barrier: release
        }
      }
  delete[] fibers;
  return rc;
}

// The kernel's C++ signature, recovered from its type: unpacks a cuLaunchKernel-style parameter
// array (params[i] points to parameter i's value) into a call, and knows every parameter's size.
template <class F>
struct Kernel;
template <class... A>
struct Kernel<void (*)(A...)> {
  static constexpr int arity = (int)sizeof...(A);
  static const size_t* sizes() {
    static const size_t s[sizeof...(A) + 1] = {sizeof(A)..., 0};
    return s;
  }
  template <size_t... I>
  static void call(void* fn, void** p, std::index_sequence<I...>) {
    reinterpret_cast<void (*)(A...)>(fn)(*static_cast<A*>(p[I])...);
  }
  static void invoke(void* fn, void** p) { call(fn, p, std::index_sequence_for<A...>{}); }
};

struct Entry {
  const char* name;
  void* fn;
  Invoke invoke;
  int arity;
  const size_t* sizes;
};

}  // namespace cpd_shim

inline void __syncthreads() { cpd_shim::barrier(); }

// Warp shuffles of 4- and 8-byte values (the device's 8-byte forms are two 4-byte shuffles with
// the same source lane: the same result).
namespace cpd_shim {
template <class T>
inline T shuffle(int op, unsigned mask, T var, int arg, int width) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp shuffles move 4- or 8-byte values");
  unsigned long long v = 0;
  std::memcpy(&v, &var, sizeof(T));
  v = warp_op(op, mask, v, arg, width);
  T r;
  std::memcpy(&r, &v, sizeof(T));
  return r;
}
}  // namespace cpd_shim
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return cpd_shim::shuffle(cpd_shim::SHFL_IDX, mask, var, src_lane, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return cpd_shim::shuffle(cpd_shim::SHFL_UP, mask, var, (int)delta, width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return cpd_shim::shuffle(cpd_shim::SHFL_DOWN, mask, var, (int)delta, width);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return cpd_shim::shuffle(cpd_shim::SHFL_XOR, mask, var, lane_mask, width);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { cpd_shim::warp_op(cpd_shim::SYNC_WARP, mask, 0ull, 0, 32); }

#define CPD_SHIM_KERNEL(name) \
  {#name, (void*)&name, &cpd_shim::Kernel<decltype(&name)>::invoke, cpd_shim::Kernel<decltype(&name)>::arity, \
   cpd_shim::Kernel<decltype(&name)>::sizes()},

// The table and the entry point, after the kernel file and CPD_SHIM_KERNEL lines:
//   CPD_SHIM_TABLE_BEGIN CPD_SHIM_KERNEL(k1) CPD_SHIM_KERNEL(k2) CPD_SHIM_TABLE_END
#define CPD_SHIM_TABLE_BEGIN static const cpd_shim::Entry cpd_shim_entries[] = {
#define CPD_SHIM_TABLE_END                                                                                    \
  {nullptr, nullptr, nullptr, 0, nullptr}};                                                                   \
  extern "C" __attribute__((visibility("default"))) int cpd_shim_launch(                                     \
      const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,          \
      void** params, const size_t* sizes, int nparams, char* err, size_t errlen) {                            \
    return cpd_shim::launch_entry(cpd_shim_entries, name, dim3{gx, gy, gz}, dim3{bx, by, bz}, params, sizes,  \
                                  nparams, err, errlen);                                                      \
  }

namespace cpd_shim {
// Checks the launch as the driver would (CUDA_ERROR_INVALID_VALUE), and the parameters against
// the signature (which the driver cannot), then runs it.
inline int launch_entry(const Entry* table, const char* name, dim3 grid, dim3 block, void** params,
                        const size_t* sizes, int nparams, char* err, size_t errlen) {
  const Entry* e = table;
  while (e->name && std::strcmp(e->name, name) != 0) ++e;
  if (!e->name) {
    std::snprintf(err, errlen, "no kernel named %s", name);
    return 1;
  }
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u) {
    std::snprintf(err, errlen, "invalid grid (%u, %u, %u)", grid.x, grid.y, grid.z);
    return 1;
  }
  unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
  if (block.x < 1 || block.y < 1 || block.z < 1 || block.z > 64u || nt > 1024u) {
    std::snprintf(err, errlen, "invalid block (%u, %u, %u)", block.x, block.y, block.z);
    return 1;
  }
  if (nparams != e->arity) {
    std::snprintf(err, errlen, "%d parameters given, the kernel takes %d", nparams, e->arity);
    return 1;
  }
  for (int i = 0; i < nparams; ++i)
    if (sizes[i] != e->sizes[i]) {
      std::snprintf(err, errlen, "parameter %d has %zu bytes, the kernel's has %zu", i, sizes[i], e->sizes[i]);
      return 1;
    }
  return run(e->fn, e->invoke, params, grid, block, err, errlen);
}
}  // namespace cpd_shim

#endif  // CPD_SHIM_H
