// Launches of the CUDA kernels (cuda/kernels/*.cu) from C++: the parameter block, the grid, and
// the call (cuLaunchKernel on a GPU, the host shim's entry point on CPU tensors). Defined in
// launch.cpp; used by ops.cpp's CUDA kernels and by its host-shim CPU kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cpd_launch {

// A format as the kernels take it: [exp, man, bias, specials, subnormals].
struct F5 {
  int exp = 0, man = 0, bias = 0, specials = 0, subnormals = 0;
};

// out = cast(x): x, out float32, contiguous, same numel (out may be x).
void cast(const at::Tensor& x, const at::Tensor& out, const F5& f, int mode, bool saturate, int sr_bits,
          uint64_t seed, uint64_t offset);
// codes = encode(round(x)); codes uint8 / int16 / int32, contiguous.
void encode(const at::Tensor& x, const at::Tensor& codes, const F5& f, int mode, bool saturate);
void decode(const at::Tensor& codes, const at::Tensor& out, const F5& f);
// out = round(a*b) (op 0), round(a+b) (1), round(c + a*b) (2); all contiguous, one shape.
void arith(int op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const at::Tensor& out, const F5& f,
           int mode, bool saturate, int sr_bits, uint64_t seed, uint64_t offset);
// out (B, M, N) = a (B, M, K) @ b (B, K, N) accumulated in `acc`, products rounded to `mul`
// when has_mul; the kernel is the family of cpd/gemm.h gemm_family, else cpd_matmul_tiled.
void matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, bool has_mul, const F5& mul,
            const F5& acc, bool kahan, int block, int mode, bool saturate, int sr_bits, uint64_t seed,
            uint64_t offset);

// A block format as cuda/kernels/mx.cu takes it (CPD_MX_FORMAT_PARAMS): the element and scale
// formats, the scale rule (cpd::RULE_*), MXINT8's integer elements, the block size, and NVFP4's
// tensor scale T (1 without one).
struct MxFormat {
  F5 el, sc;
  int rule = 0, is_int = 0;
  int64_t block = 1;
  float t = 1.0f;
};
// x (rows, n) float32 contiguous -> y (rows, n): decode(encode(x)) per block along the rows.
void mx_cast(const at::Tensor& x, const at::Tensor& y, const MxFormat& f, int mode, uint64_t seed, uint64_t offset);
// codes (rows, row_bytes) uint8 (pack 0: one code per byte; 4, 6: packed) and scale codes (rows, nblocks).
void mx_encode(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scodes, const MxFormat& f, int mode,
               uint64_t seed, uint64_t offset, int pack);
// codes (rows, row bytes) + scale codes (rows, nblocks) -> y (rows, n).
void mx_decode(const at::Tensor& codes, const at::Tensor& scodes, const at::Tensor& y, const MxFormat& f, int pack);
// The launch of `blocks` blocks of `block_size` elements (mx.cu: batches of CPD_MX_BATCH blocks per
// group of mx_lanes(block_size) lanes): {grid, threads per block, lanes}, for a geometry of
// `threads` per block and at most `max_blocks` blocks (<= 0: no limit). For the tests.
std::vector<int64_t> mx_launch_shape(int64_t blocks, int64_t block_size, int64_t threads, int64_t max_blocks);

// The wire passes of hop.cu (cpd/distributed: encode + scale, the per-hop merge, decode + unscale;
// their CPU loops are cuda/cpu/hop.cpp's); segs: the (k, 3) int64 segments (offset, length, scale
// exponent) on the CPU; data: contiguous; one thread per group of 8 elements.
void wire_encode(const at::Tensor& x, const at::Tensor& segs, const at::Tensor& out, const F5& f, int mode,
                 bool saturate, int bits, bool raw32);
// recv_c / acc_c: undefined or empty when absent.
void wire_hop(const at::Tensor& recv, const at::Tensor& recv_c, const at::Tensor& acc, const at::Tensor& acc_c,
              int64_t n, const F5& f, int mode, bool saturate, int bits, bool raw32, bool kahan, bool carry,
              bool sequential);
void wire_decode(const at::Tensor& data, const at::Tensor& segs, const at::Tensor& out, const F5& f, int bits,
                 bool raw32, float inv);

// The kernel of matmul.cu that matmul() launches for a spec (for the tests: the same choice as
// cpd/_kernels.py matmul_family).
std::string matmul_kernel(bool has_mul, const F5& mul, const F5& acc, bool kahan, int block, int mode, bool saturate);

// The fused dot of cuda/kernels/fused_dot.cu (cpd::fused_dot_matmul): the spec's parameters
// (cpd/fused_dot.h make_fused_dot_spec) and the input formats' mantissa bits.
struct FdParams {
  int group = 16, frac = 0, out = 0, a_emin = -126, b_emin = -126, zero_exp = 0, algo = 0, ftz = 0;
  int a_man = 0, b_man = 0;
};
// y (B, M, N) = a (B, M, K) @ b (B, K, N), all contiguous float32 (block scales sa (B, M, nb), sb
// (B, nb, N), or empty): the tiled kernel where cpd/fused_dot_tiled.h's fd_tiled_applies takes
// the spec (in the device's tile shape: fused_dot_tile_shape, among those built for its
// architecture; on the shim the one set by set_fused_dot_host_shape, s1 by default; s2g2 where the
// family has no s2), else the per-output kernel.
void fused_dot(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
               const at::Tensor& y, int64_t block, int64_t s_emin, const FdParams& p);
// For the tests: the kernel fused_dot() launches in tile shape `shape` (block: 0 without block
// scales, else the elements per scale), the shape a GPU of compute
// capability `major` with `smem_optin` bytes per block gets (algo: the spec's, which picks the
// raw-element families' shared memory; "" where no shape built for the GPU fits: the per-output
// kernel), and the shim's shape.
std::string fused_dot_kernel(const FdParams& p, int64_t block, const std::string& shape);
std::string fused_dot_tile_shape(int64_t major, int64_t smem_optin, int64_t group, int64_t block, int64_t algo = 0);
void set_fused_dot_host_shape(const std::string& shape);
// Whether CPU tensors get the CUDA kernels through the host shim (ops.cpp set_cpu_kernels: under
// cpd._shim.on_host); the fused dot's CPU kernel reads it.
void set_host_kernels(bool on);
bool host_kernels();

// Python hands over, once: image(kernel_file, device_index) -> bytes (cpd._cuda.image_for: the
// NVRTC cubin/PTX for the device, compiled and cached on disk), and shim(kernel_file) -> int (the
// address of the host shim library's cpd_shim_launch, cpd._shim.entry).
void set_sources(pybind11::object image, pybind11::object shim);
// The geometry of launches on CPU tensors (the shim): threads per block, most blocks (<= 0: none).
void set_host_geometry(int64_t threads, int64_t max_blocks);

}  // namespace cpd_launch
