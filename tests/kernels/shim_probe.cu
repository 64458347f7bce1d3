// Test kernels for tests/test_shim.py: the index helpers of cpd/launch.h with values past 2^31
// and 2^32, and the shim's __syncthreads / __shared__ emulation. Never compiled into cpd.
#include "cpd/launch.h"

// out[t] = first_item(block, block_dim, t) for t < n; out[n] = grid_stride(block_dim, grid_dim);
// out[n + 1] = items_of(big, 4); out[n + 2] = the number of iterations a grid-stride loop over
// `big` items makes for thread 0 of block `block` (counted, so the loop's index never wraps).
extern "C" __global__ void probe_index(long long* out, int n, unsigned int block, unsigned int block_dim,
                                       unsigned int grid_dim, long long big) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (int t = 0; t < n; ++t) out[t] = cpd::first_item(block, block_dim, (unsigned int)t);
  out[n] = cpd::grid_stride(block_dim, grid_dim);
  out[n + 1] = cpd::items_of(big, 4);
  long long count = 0;
  for (long long i = cpd::first_item(block, block_dim, 0u); i < big; i += cpd::grid_stride(block_dim, grid_dim))
    ++count;
  out[n + 2] = count;
}

// Block-wide reversal through shared memory: correct only if every thread's write lands before
// any thread's read (the barrier), and each block sees its own tile.
extern "C" __global__ void probe_reverse(const float* x, float* y, int n) {
  __shared__ float tile[256];
  const long long base = (long long)blockIdx.x * blockDim.x;
  const unsigned int t = threadIdx.x;
  tile[t] = base + t < n ? x[base + t] : 0.0f;
  __syncthreads();
  const unsigned int r = blockDim.x - 1 - t;
  if (base + t < n) y[base + t] = tile[r];
}

// A barrier only some threads reach (undefined on a GPU): the shim reports it.
extern "C" __global__ void probe_divergent(int* y) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  y[threadIdx.x] = 1;
}

// Warp shuffles (cuda/shim/cpd_shim.h models lanes in lock step): thread t of a block of
// blockDim.x writes the results of a fixed list of shuffles of v = 1000 * t + 7 to
// out[PROBE_SHUFFLES * t ...]; tests/test_shim.py computes them from the CUDA definitions.
#define PROBE_SHUFFLES 14
extern "C" __global__ void probe_shuffles(long long* out) {
  const unsigned t = threadIdx.x;
  const int v = (int)(1000 * t + 7);
  long long* o = out + PROBE_SHUFFLES * (long long)t;
  const unsigned full = 0xffffffffu;
  o[0] = __shfl_xor_sync(full, v, 1);
  o[1] = __shfl_xor_sync(full, v, 16);
  o[2] = __shfl_xor_sync(full, v, 5, 8);
  o[3] = __shfl_xor_sync(full, v, 8, 8);  // into the next segment of 8: the caller's own value
  o[4] = __shfl_xor_sync(full, v, 24, 16);  // lanes 16..31 reach back into 0..15; 0..15 get their own
  o[5] = __shfl_sync(full, v, (int)((t * 7) % 32));
  o[6] = __shfl_sync(full, v, 3, 8);
  o[7] = __shfl_sync(full, v, 19, 16);  // srcLane % width within the segment
  o[8] = __shfl_up_sync(full, v, 3, 16);
  o[9] = __shfl_down_sync(full, v, 3, 16);
  o[10] = __shfl_down_sync(full, v, 1);
  o[11] = __shfl_xor_sync(full, (long long)v * 4000000000LL, 2);  // 8-byte values
  o[12] = (long long)__shfl_xor_sync(full, (float)v + 0.5f, 4);
  __syncwarp();
  o[13] = __shfl_xor_sync(full, (unsigned)v, 31);
}

// Groups of 8 lanes with their own masks and different trip counts (group k of the block loops
// k % 3 + 1 times), each step a butterfly max over the group; a block of 40 threads has a
// partial second warp. out[t] = the group's max of (t * 37) % 101, plus 1000 per step.
extern "C" __global__ void probe_groups(int* out) {
  const unsigned t = threadIdx.x, lane = t & 31u;
  const unsigned mask = 0xffu << (lane & ~7u);
  int v = (int)((t * 37u) % 101u), steps = (int)((t / 8u) % 3u) + 1;
  for (int s = 0; s < steps; ++s) {
    for (int o = 4; o > 0; o >>= 1) {
      const int w = __shfl_xor_sync(mask, v, o, 8);
      v = w > v ? w : v;
    }
    v += 1000;
  }
  out[t] = v;
}

// What a GPU leaves undefined, each reported by the shim as an error of the launch.
extern "C" __global__ void probe_warp_misuse(int kind, int* out) {
  const unsigned t = threadIdx.x;
  int v = (int)t;
  if (kind == 0) {  // a mask without the caller's lane
    v = __shfl_xor_sync(t == 5 ? 0xffffffdfu : 0xffffffffu, v, 1);
  } else if (kind == 1) {  // reading a lane that has exited
    if (t == 1) return;
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else if (kind == 2) {  // half the warp waits at a barrier, half at a shuffle: never completes
    if (t < 16) __syncthreads();
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else if (kind == 3) {  // two operations under one mask
    v = t & 1u ? __shfl_xor_sync(0xffffffffu, v, 2) : __shfl_down_sync(0xffffffffu, v, 2);
  } else if (kind == 4) {  // a width that is not a power of two
    v = __shfl_xor_sync(0xffffffffu, v, 1, 12);
  } else if (kind == 5) {  // reading a lane outside the mask
    v = __shfl_sync(0x0000ffffu << (t & 16u), v, 20, 32);
  }
  out[t] = v;
}
