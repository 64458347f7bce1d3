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
//   * __shared__: `static thread_local` storage, one copy per OS thread, i.e. shared by the
//     fibers of the block being run (as on a GPU, it is not initialized at block start).
//   * Device intrinsics the numerics core uses (__fadd_rn, __fmaf_rn, __float_as_uint, __clzll,
//     ...): their IEEE definitions on the host. The library is compiled with -ffp-contract=off
//     and without fast-math (NVRTC gets --fmad=false), so float operations round as written.
//   * __CUDACC_RTC__ is defined after the system headers, so the numerics core takes its device
//     branches (CPD_DEVICE = 1): the text NVRTC compiles is the text the shim runs.
// Not emulated: warp-level primitives, atomics, dynamic shared memory, streams (a launch runs
// to completion before returning).
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

enum { RUNNING = 0, AT_BARRIER = 1, DONE = 2 };
const size_t kStack = 128 * 1024;  // per GPU thread; kernels keep small local arrays only

struct Fiber {
  ucontext_t ctx;
  int state;
  uint3 idx;
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
        for (;;) {  // one pass: every live thread runs to its next barrier or to its end
          size_t done = 0, waiting = 0;
          for (size_t t = 0; t < nt; ++t) {
            Fiber& f = fibers[t];
            if (f.state == DONE) continue;
            f.state = RUNNING;
            threadIdx = f.idx;
            current = &f;
            swapcontext(&sched_ctx, &f.ctx);
            current = nullptr;
          }
          for (size_t t = 0; t < nt; ++t) (fibers[t].state == DONE ? done : waiting) += 1;
          if (waiting == 0) break;
          if (done != 0) {
            std::snprintf(err, errlen,
                          "block (%u, %u, %u): %zu threads wait at __syncthreads() while %zu have exited",
                          bx, by, bz, waiting, done);
            rc = 3;
            break;
          }
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
