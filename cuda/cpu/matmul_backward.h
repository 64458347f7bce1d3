// The graph nodes of cpd::matmul and cpd::fused_dot_matmul (cuda/cpu/ops.cpp, fused_dot_op.cpp)
// and of the quantizers cpd::cast and cpd_mx::cast (ops.cpp, mx_ops.cpp), written as torch's own
// backward nodes are (Node subclasses, not torch::autograd::Functions: no per-call packing of the
// arguments, about 10 us less a call). Straight-through: the matmul's gradients are those of the
// exact float32 product a @ b, reduced over the broadcast batch dims (at::sum_to: the leading
// dims, then the dims of size 1); a quantizer passes its gradient on as it is.
#ifndef CPD_CPU_MATMUL_BACKWARD_H
#define CPD_CPU_MATMUL_BACKWARD_H

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <string>
#include <vector>

namespace cpd_cpu {

struct MatmulBackward : public torch::autograd::Node {
  torch::autograd::SavedVariable a_, b_;  // each saved only when the other's gradient is wanted
  std::vector<c10::SymInt> a_sizes, b_sizes;
  std::string name_;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list out(2);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    if (task_should_compute_output(0)) out[0] = grad_of(g, b_.unpack().transpose(-1, -2), a_sizes);
    if (task_should_compute_output(1)) out[1] = grad_of(a_.unpack().transpose(-1, -2), g, b_sizes);
    return out;
  }
  // x @ y reduced to `sizes`; two matrices (no batch dims to reduce) take at::mm, as torch's own
  // MmBackward0 does, without at::matmul's reshapes and at::sum_to (a few us a call on a 16^3 GEMM).
  static at::Tensor grad_of(const at::Tensor& x, const at::Tensor& y, const std::vector<c10::SymInt>& sizes) {
    if (x.dim() == 2 && y.dim() == 2 && sizes.size() == 2) return at::mm(x, y);
    return at::sum_to(at::matmul(x, y), sizes);
  }
  void release_variables() override {
    a_.reset_data();
    b_.reset_data();
  }
  std::string name() const override { return name_; }
};

// The graph node of the quantizers (cpd::cast, cpd_mx::cast): straight-through, the gradient passed
// on as it comes (the same object, no copy). A Node, as MatmulBackward, rather than a
// torch::autograd::Function: no per-call packing of the arguments.
struct StraightThroughBackward : public torch::autograd::Node {
  const char* name_;
  explicit StraightThroughBackward(const char* name) : name_(name) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override { return {grads[0]}; }
  std::string name() const override { return name_; }
};

// out's history: a StraightThroughBackward node (named `name`) whose one edge is x's.
inline void record_straight_through(at::Tensor& out, const at::Tensor& x, const char* name) {
  auto node = c10::make_intrusive<StraightThroughBackward>(name);
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(out, node);
}

// Whether autograd records a node for an op of these differentiable inputs.
inline bool wants_grad(const at::Tensor& a, const at::Tensor& b = at::Tensor(), const at::Tensor& c = at::Tensor()) {
  return at::GradMode::is_enabled() && ((a.defined() && a.requires_grad()) || (b.defined() && b.requires_grad()) ||
                                        (c.defined() && c.requires_grad()));
}

// out's history: a MatmulBackward node (named `name`) whose edges are a's and b's.
inline void record_matmul_backward(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const char* name) {
  auto node = c10::make_intrusive<MatmulBackward>();
  node->name_ = name;
  node->set_next_edges(torch::autograd::collect_next_edges(a, b));
  if (b.requires_grad()) node->a_ = torch::autograd::SavedVariable(a, false);
  if (a.requires_grad()) node->b_ = torch::autograd::SavedVariable(b, false);
  node->a_sizes = a.sym_sizes().vec();
  node->b_sizes = b.sym_sizes().vec();
  torch::autograd::set_history(out, node);
}

}  // namespace cpd_cpu

#endif  // CPD_CPU_MATMUL_BACKWARD_H
