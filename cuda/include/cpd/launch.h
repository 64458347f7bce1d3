// cpd kernels, launch.h: 64-bit index arithmetic of grid-stride loops (kernels only).
//
// Not part of the numerics core (no rounding decision lives here): the index helpers every
// kernel under cuda/kernels/ uses, so that no product of 32-bit launch quantities is formed in
// 32 bits. blockIdx.x * blockDim.x overflows unsigned int once a launch covers 2^32 threads, and
// an `int` loop index overflows past 2^31 elements; here every product is taken in 64 bits
// first. The helpers are plain functions of integers, so tests/test_shim.py checks them with
// values beyond 2^31 and 2^32 without launching that many threads.
//
// Loop shape (one item = one element, or one group of 4 elements in the vectorized cast):
//   for (long long i = cpd::first_item(blockIdx.x, blockDim.x, threadIdx.x); i < n_items;
//        i += cpd::grid_stride(blockDim.x, gridDim.x))
#ifndef CPD_LAUNCH_H
#define CPD_LAUNCH_H

#include "cpd/base.h"

namespace cpd {

// The first item of thread `thread` of block `block`: block * block_dim + thread, in 64 bits.
CPD_FN long long first_item(u32 block, u32 block_dim, u32 thread) {
  return (long long)block * (long long)block_dim + (long long)thread;
}

// The stride of a grid-stride loop: every thread of the grid, block_dim * grid_dim, in 64 bits.
CPD_FN long long grid_stride(u32 block_dim, u32 grid_dim) { return (long long)block_dim * (long long)grid_dim; }

// Number of items of `per` elements covering n elements (the last item may be partial).
CPD_FN long long items_of(long long n, int per) { return (n + per - 1) / per; }

// The origin of output tile t of the tiled GEMM kernels' grid-stride loop: tiles of tm x tn
// outputs, tiles_m x tiles_n per batch element, row-major, batch outermost.
struct TileOrigin {
  long long bi, m0, n0;
};

CPD_FN TileOrigin tile_origin(long long t, long long tiles_m, long long tiles_n, int tm, int tn) {
  TileOrigin o;
  o.bi = t / (tiles_m * tiles_n);
  const long long rest = t - o.bi * tiles_m * tiles_n;
  o.m0 = (rest / tiles_n) * tm;
  o.n0 = (rest % tiles_n) * tn;
  return o;
}

// Whether copy_async4 is asynchronous (cp.async: sm_80 and later). Where it is not (older GPUs and
// the host shim), double-buffered tiles stage the next slice in registers instead (loaded before
// the compute of the current slice, stored after it), so that the loads' latency still overlaps
// the compute: cuda/kernels/matmul.cu family_gemm.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CPD_COPY_ASYNC 1
#else
#define CPD_COPY_ASYNC 0
#endif

// Staging a 4-byte word of global memory into shared memory, for double-buffered tiles: on
// sm_80 and later an asynchronous copy (cp.async, the copy engine writes shared memory while the
// threads compute on the other buffer), completed by copy_wait_all(); elsewhere (older GPUs, and
// the host shim, which defines no __CUDA_ARCH__) a plain load and store, already complete. Either
// way the caller's __syncthreads() after copy_wait_all() publishes the tile to the block.
CPD_FN void copy_async4(float* smem, const float* gmem) {
#if CPD_COPY_ASYNC
  const u32 s = (u32)__cvta_generic_to_shared(smem);  // folds to the shared address (no generic round trip)
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
#else
  *smem = *gmem;
#endif
}

CPD_FN void copy_wait_all() {
#if CPD_COPY_ASYNC
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
#endif
}

// Issue the copies of a stage (asynchronous ones are grouped and may still be in flight).
CPD_FN void copy_commit() {
#if CPD_COPY_ASYNC
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// The block's dynamic shared memory (the launch's sharedMemBytes; cpd/_cuda.py raises the
// kernel's limit above 48 KiB with cuFuncSetAttribute), 16-byte aligned, and its size in bytes.
// The host shim has no launch-time size: there it is one static buffer per OS thread (shared by
// the fibers of the running block, as __shared__ is) of the largest size a block may ask for on
// the GPUs cpd targets (227 KiB, sm_90).
const u32 DYNAMIC_SMEM_MAX = 227u * 1024u;

#if defined(__CUDA_ARCH__)
extern __shared__ __align__(16) unsigned char cpd_dynamic_smem[];
CPD_FN unsigned char* dynamic_smem() { return cpd_dynamic_smem; }
CPD_FN u32 dynamic_smem_size() {
  u32 r;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
  return r;
}
#else
inline unsigned char* dynamic_smem() {
  alignas(16) static thread_local unsigned char buffer[DYNAMIC_SMEM_MAX];
  return buffer;
}
inline u32 dynamic_smem_size() { return DYNAMIC_SMEM_MAX; }
#endif

}  // namespace cpd

#endif  // CPD_LAUNCH_H
