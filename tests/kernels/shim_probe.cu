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
