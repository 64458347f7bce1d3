// cpd.mx's ops (cpd_mx::cast, cast_out, encode, decode) from C++: their kernels per dispatch key,
// registered by ops.cpp beside the core ops' (defined in mx_ops.cpp).
#pragma once

#include <c10/core/DispatchKey.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

namespace cpd_mx_ops {

// A new registration of the four ops for `key`: mx.cpp's CPU loops, or mx.cu's kernels launched by
// launch.cpp (CUDA tensors, or CPU tensors through the host shim).
torch::Library* loops(c10::DispatchKey key);
torch::Library* kernels(c10::DispatchKey key);
// Their autograd kernels (the Autograd alias key).
torch::Library* autograd();
// The pure-torch path for formats the kernels do not take: fn(op, *args) (cpd/_mx_engine.py torch_body).
void set_torch_path(pybind11::object fn);

}  // namespace cpd_mx_ops
