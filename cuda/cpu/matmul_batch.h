// The batch dims of a matmul a (..., M, K) @ b (..., K, N), broadcast as torch.matmul broadcasts
// them (at::infer_size), and the operands as contiguous (B, rows, cols) tensors: what cpd::matmul
// (ops.cpp) and cpd::fused_dot_matmul (fused_dot.cpp) hand to their loops and kernels.
#ifndef CPD_CPU_MATMUL_BATCH_H
#define CPD_CPU_MATMUL_BATCH_H

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace cpd_cpu {

struct MatmulBatch {
  std::vector<int64_t> dims;  // the broadcast batch dims
  int64_t B = 1;              // their product

  MatmulBatch(const at::Tensor& a, const at::Tensor& b)
      : dims(at::infer_size(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - 2))) {
    for (int64_t n : dims) B *= n;
  }
  // The batch dims followed by (r, c).
  std::vector<int64_t> shape(int64_t r, int64_t c) const {
    std::vector<int64_t> s(dims);
    s.insert(s.end(), {r, c});
    return s;
  }
  // t (..., r, c) broadcast over the batch dims, as a contiguous (B, r, c) tensor.
  at::Tensor as3(const at::Tensor& t, int64_t r, int64_t c) const {
    return t.expand(shape(r, c)).reshape({B, r, c}).contiguous();
  }
};

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_BATCH_H
