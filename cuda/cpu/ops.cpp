// The core ops' CPU, CUDA and autograd kernels, registered with torch's dispatcher from C++.
//
// cpd/ops.py defines the schemas of cpd::cast, cast_out, encode, decode, arith and matmul (in
// Python, so that they exist on a machine with no compiler, where the pure-torch fallback runs
// them), their fake kernels (torch.compile) and Python CUDA kernels (cpd/_impl.py, for a machine
// with a GPU and no compiler). When this extension loads, cpd/_impl.py calls install_ops(), which
// registers here:
//   * the CPU kernels: each allocates its output and runs the loops of cast.cpp, arith.cpp and
//     matmul.cpp (the same functions the Python bodies called, so the same bits);
//   * the autograd kernels (the Autograd alias key: every device), straight-through as in the
//     Python registrations they replace: cast passes the gradient through, arith and matmul give
//     the gradients of the exact operation (matmul: grad @ b^T and a^T @ grad by at::matmul,
//     reduced over broadcast batch dims, in a graph node of its own), encode, decode and
//     cast_out are not differentiable;
// and, after the first CUDA call found the device's kernels usable, install_cuda_ops() registers
// the CUDA kernels: the same op bodies over launch.cpp's launches (cuLaunchKernel from C++).
// So a call from Python is one dispatcher call with no Python in it (issue 28: the
// torch.library Python layers cost 40-80 us per call). set_cpu_kernels(HOST_KERNELS) gives CPU
// tensors the CUDA op bodies, launched through the host shim (cpd._shim.on_host: the GPU's
// marshalling tested on any machine), set_cpu_kernels(LOOPS) puts the loops back.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randint.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Exceptions.h>  // torch::wrap_pybind_function_no_gil
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "launch.h"
#include "matmul_backward.h"
#include "matmul_batch.h"
#include "mx_ops.h"

// cuda/cpu/cast.cpp, arith.cpp, matmul.cpp
void cast_out(const at::Tensor& x, at::Tensor& out, int64_t exp, int64_t man, int64_t bias, int64_t specials,
              bool subnormals, int64_t mode, bool saturate, int64_t sr_bits, int64_t seed, int64_t offset);
void encode_out(const at::Tensor& x, at::Tensor& out, int64_t exp, int64_t man, int64_t bias, int64_t specials,
                bool subnormals, int64_t mode, bool saturate);
void decode_out(const at::Tensor& codes, at::Tensor& out, int64_t exp, int64_t man, int64_t bias,
                int64_t specials, bool subnormals);
void arith_out(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, at::Tensor& out,
               int64_t exp, int64_t man, int64_t bias, int64_t specials, bool subnormals, int64_t mode,
               bool saturate, int64_t sr_bits, int64_t seed, int64_t offset, int64_t path);
void matmul_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool has_mul, int64_t mexp,
                int64_t mman, int64_t mbias, int64_t mspecials, bool msubnormals, int64_t aexp, int64_t aman,
                int64_t abias, int64_t aspecials, bool asubnormals, bool kahan, int64_t block, int64_t mode,
                bool saturate, int64_t sr_bits, int64_t seed, int64_t offset, int64_t path);

namespace {

using torch::autograd::variable_list;

constexpr int64_t kStochastic = 1;  // cpd::STOCHASTIC (cuda/include/cpd/base.h), Rounding.STOCHASTIC.code

// A format argument: [exp, man, bias, specials, subnormals] (cpd/ops.py _fmt_spec), [] for none.
struct Fmt {
  int64_t exp = 0, man = 0, bias = 0, specials = 0;
  bool subnormals = false, given = false;
};

Fmt fmt_of(c10::IntArrayRef spec, const char* name) {
  Fmt f;
  if (spec.empty()) return f;
  TORCH_CHECK(spec.size() == 5, "cpd: a format argument (", name,
              ") is [exp, man, bias, specials, subnormals], got ", spec.size(), " values");
  f.exp = spec[0], f.man = spec[1], f.bias = spec[2], f.specials = spec[3];
  f.subnormals = spec[4] != 0;
  f.given = true;
  return f;
}

Fmt required_fmt(c10::IntArrayRef spec, const char* name) {
  Fmt f = fmt_of(spec, name);
  TORCH_CHECK(f.given, "cpd: the format argument ", name, " must not be empty");
  return f;
}

// The (seed, offset) pair of a stochastic launch: a CPU int64 tensor of two (cpd.ops.draw_seed);
// (0, 0) for the deterministic modes, which draw no words.
std::pair<int64_t, int64_t> seed_pair(const at::Tensor& seed, int64_t rounding) {
  if (rounding != kStochastic) return {0, 0};
  TORCH_CHECK(seed.device().is_cpu() && seed.scalar_type() == at::kLong && seed.numel() == 2,
              "cpd: seed must be a CPU int64 tensor of 2 elements (cpd.ops.draw_seed), got ", seed.scalar_type(),
              " of ", seed.numel(), " elements on ", seed.device());
  const at::Tensor s = seed.contiguous();
  const int64_t* p = s.data_ptr<int64_t>();
  return {p[0], p[1]};
}

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "cpd: ", name, " must be float32, got ", t.scalar_type());
}

at::ScalarType code_dtype(const Fmt& f) {
  const int64_t bits = 1 + f.exp + f.man;
  return bits <= 8 ? at::kByte : bits <= 16 ? at::kShort : at::kInt;
}

// ------------------------------------------------------------------------------ engines
// What fills a preallocated, contiguous output: the CPU loops, or the CUDA kernels (launch.cpp,
// on the GPU or, for CPU tensors, through the host shim).
struct Loops {
  static void cast(const at::Tensor& x, at::Tensor& out, const Fmt& f, int64_t r, bool sat, int64_t sr, int64_t s,
                   int64_t o) {
    cast_out(x, out, f.exp, f.man, f.bias, f.specials, f.subnormals, r, sat, sr, s, o);
  }
  static void encode(const at::Tensor& x, at::Tensor& codes, const Fmt& f, int64_t r, bool sat) {
    encode_out(x, codes, f.exp, f.man, f.bias, f.specials, f.subnormals, r, sat);
  }
  static void decode(const at::Tensor& codes, at::Tensor& out, const Fmt& f) {
    decode_out(codes, out, f.exp, f.man, f.bias, f.specials, f.subnormals);
  }
  static void arith(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, at::Tensor& out,
                    const Fmt& f, int64_t r, bool sat, int64_t sr, int64_t s, int64_t o) {
    arith_out(op, a, b, c, out, f.exp, f.man, f.bias, f.specials, f.subnormals, r, sat, sr, s, o, 0);
  }
  // a (B, M, K), b (B, K, N), out (B, M, N); m is acc when there is no mul format (has_mul false)
  static void matmul(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool has_mul, const Fmt& m,
                     const Fmt& af, bool kahan, int64_t block, int64_t r, bool sat, int64_t sr, int64_t s, int64_t o) {
    matmul_out(a, b, out, has_mul, m.exp, m.man, m.bias, m.specials, m.subnormals, af.exp, af.man, af.bias,
               af.specials, af.subnormals, kahan, block, r, sat, sr, s, o, 0);
  }
};

struct Kernels {
  static cpd_launch::F5 f5(const Fmt& f) {
    return {int(f.exp), int(f.man), int(f.bias), int(f.specials), int(f.subnormals)};
  }
  static void cast(const at::Tensor& x, at::Tensor& out, const Fmt& f, int64_t r, bool sat, int64_t sr, int64_t s,
                   int64_t o) {
    cpd_launch::cast(x, out, f5(f), int(r), sat, int(sr), uint64_t(s), uint64_t(o));
  }
  static void encode(const at::Tensor& x, at::Tensor& codes, const Fmt& f, int64_t r, bool sat) {
    cpd_launch::encode(x, codes, f5(f), int(r), sat);
  }
  static void decode(const at::Tensor& codes, at::Tensor& out, const Fmt& f) { cpd_launch::decode(codes, out, f5(f)); }
  static void arith(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, at::Tensor& out,
                    const Fmt& f, int64_t r, bool sat, int64_t sr, int64_t s, int64_t o) {
    cpd_launch::arith(int(op), a, b, c, out, f5(f), int(r), sat, int(sr), uint64_t(s), uint64_t(o));
  }
  static void matmul(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool has_mul, const Fmt& m,
                     const Fmt& af, bool kahan, int64_t block, int64_t r, bool sat, int64_t sr, int64_t s, int64_t o) {
    cpd_launch::matmul(a, b, out, has_mul, f5(m), f5(af), kahan, int(block), int(r), sat, int(sr), uint64_t(s),
                       uint64_t(o));
  }
};

// ------------------------------------------------------------------------------ op bodies
template <class E>
at::Tensor cast_k(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef fmt, int64_t rounding, bool saturate,
                  int64_t sr_bits) {
  check_float(x, "x");
  const Fmt f = required_fmt(fmt, "fmt");
  const auto [s, o] = seed_pair(seed, rounding);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  E::cast(xc, out, f, rounding, saturate, sr_bits, s, o);
  return out;
}

template <class E>
void cast_out_k(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef fmt, int64_t rounding, bool saturate,
                int64_t sr_bits, const at::Tensor& out) {
  check_float(x, "x");
  check_float(out, "out");
  TORCH_CHECK(out.sizes() == x.sizes(), "cpd: out has shape ", out.sizes(), ", x ", x.sizes());
  TORCH_CHECK(out.device() == x.device(), "cpd: out is on ", out.device(), ", x on ", x.device());
  const Fmt f = required_fmt(fmt, "fmt");
  const auto [s, o] = seed_pair(seed, rounding);
  const at::Tensor xc = x.contiguous();
  at::Tensor target = out.is_contiguous() ? out : at::empty_like(xc);
  E::cast(xc, target, f, rounding, saturate, sr_bits, s, o);
  if (!target.is_same(out)) out.copy_(target);
}

template <class E>
at::Tensor encode_k(const at::Tensor& x, c10::IntArrayRef fmt, int64_t rounding, bool saturate) {
  check_float(x, "x");
  const Fmt f = required_fmt(fmt, "fmt");
  const at::Tensor xc = x.contiguous();
  at::Tensor codes = at::empty(xc.sizes(), xc.options().dtype(code_dtype(f)));
  E::encode(xc, codes, f, rounding, saturate);
  return codes;
}

template <class E>
at::Tensor decode_k(const at::Tensor& codes, c10::IntArrayRef fmt) {
  const Fmt f = required_fmt(fmt, "fmt");
  const at::Tensor cc = codes.contiguous();
  at::Tensor out = at::empty(cc.sizes(), cc.options().dtype(at::kFloat));
  E::decode(cc, out, f);
  return out;
}

template <class E>
at::Tensor arith_k(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const at::Tensor& seed,
                   c10::IntArrayRef fmt, int64_t rounding, bool saturate, int64_t sr_bits) {
  check_float(a, "a");
  check_float(b, "b");
  check_float(c, "c");
  TORCH_CHECK(op >= 0 && op <= 2, "cpd: arith op is 0 (mul), 1 (add) or 2 (fma), got ", op);
  TORCH_CHECK(a.sizes() == b.sizes() && a.sizes() == c.sizes(), "cpd: arith wants tensors of one shape, got ",
              a.sizes(), ", ", b.sizes(), ", ", c.sizes());
  const Fmt f = required_fmt(fmt, "fmt");
  const auto [s, o] = seed_pair(seed, rounding);
  const at::Tensor ac = a.contiguous(), bc = b.contiguous(), cc = c.contiguous();
  at::Tensor out = at::empty_like(ac);
  E::arith(op, ac, bc, cc, out, f, rounding, saturate, sr_bits, s, o);
  return out;
}

// a (..., M, K) @ b (..., K, N), batch dims broadcast (torch.matmul's rule).
template <class E>
at::Tensor matmul_k(const at::Tensor& a, const at::Tensor& b, const at::Tensor& seed, c10::IntArrayRef mul,
                    c10::IntArrayRef acc, bool kahan, int64_t block, int64_t rounding, bool saturate, int64_t sr_bits) {
  check_float(a, "a");
  check_float(b, "b");
  TORCH_CHECK(a.dim() >= 2 && b.dim() >= 2, "cpd: matmul wants operands of at least 2 dims");
  TORCH_CHECK(a.size(-1) == b.size(-2), "cpd: matmul shapes ", a.sizes(), " and ", b.sizes(), " do not match");
  const Fmt mf = fmt_of(mul, "mul"), af = required_fmt(acc, "acc");
  const auto [s, o] = seed_pair(seed, rounding);
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const Fmt& m = mf.given ? mf : af;  // no format: has_mul = false ignores these
  if (a.dim() == 2 && b.dim() == 2) {  // the common case, without the batch bookkeeping
    at::Tensor out = at::empty({1, M, N}, a.options());
    E::matmul(a.contiguous().view({1, M, K}), b.contiguous().view({1, K, N}), out, mf.given, m, af, kahan, block,
              rounding, saturate, sr_bits, s, o);
    return out.view({M, N});
  }
  const cpd_cpu::MatmulBatch batch(a, b);
  at::Tensor out = at::empty({batch.B, M, N}, a.options());
  E::matmul(batch.as3(a, M, K), batch.as3(b, K, N), out, mf.given, m, af, kahan, block, rounding, saturate, sr_bits,
            s, o);
  return out.view(batch.shape(M, N));
}

// ------------------------------------------------------------------------------ autograd
// Each forward redispatches below autograd, to the kernel of the tensors' device (CPU here, the
// CUDA kernels, or the fallback).
template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using CastSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::IntArrayRef, int64_t, bool, int64_t);
using ArithSig = at::Tensor(int64_t, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            c10::IntArrayRef, int64_t, bool, int64_t);
using CastOutSig = void(const at::Tensor&, const at::Tensor&, c10::IntArrayRef, int64_t, bool, int64_t,
                        const at::Tensor&);
using MatmulSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::IntArrayRef,
                             c10::IntArrayRef, bool, int64_t, int64_t, bool, int64_t);

// Each op below autograd: what the autograd Function's forward and the no-gradient path both call.
at::Tensor cast_below(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef fmt, int64_t rounding,
                      bool saturate, int64_t sr_bits) {
  static const auto op = op_handle<CastSig>("cpd::cast");
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(x, seed, fmt, rounding, saturate, sr_bits);
}

at::Tensor arith_below(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                       const at::Tensor& seed, c10::IntArrayRef fmt, int64_t rounding, bool saturate, int64_t sr_bits) {
  static const auto handle = op_handle<ArithSig>("cpd::arith");
  at::AutoDispatchBelowADInplaceOrView below;
  return handle.call(op, a, b, c, seed, fmt, rounding, saturate, sr_bits);
}

at::Tensor matmul_below(const at::Tensor& a, const at::Tensor& b, const at::Tensor& seed, c10::IntArrayRef mul,
                        c10::IntArrayRef acc, bool kahan, int64_t block, int64_t rounding, bool saturate,
                        int64_t sr_bits) {
  static const auto op = op_handle<MatmulSig>("cpd::matmul");
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(a, b, seed, mul, acc, kahan, block, rounding, saturate, sr_bits);
}

// cpd::arith's graph node: the gradients of the exact operation (the rounding passed straight
// through); a Node, as MatmulBackward, with each operand saved only where the other's gradient
// needs it. Edges: a, b, c (for add and mul c is a, and gets no gradient).
struct ArithBackward : public torch::autograd::Node {
  int64_t op = 0;  // 0 mul, 1 add, 2 fma (c + a*b)
  torch::autograd::SavedVariable a_, b_;
  variable_list apply(variable_list&& grads) override {
    variable_list out(3);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    if (op == 1) {
      if (task_should_compute_output(0)) out[0] = g;
      if (task_should_compute_output(1)) out[1] = g;
      return out;
    }
    if (task_should_compute_output(0)) out[0] = at::mul(g, b_.unpack());
    if (task_should_compute_output(1)) out[1] = at::mul(g, a_.unpack());
    if (op == 2 && task_should_compute_output(2)) out[2] = g;
    return out;
  }
  void release_variables() override {
    a_.reset_data();
    b_.reset_data();
  }
  std::string name() const override { return "cpd::ArithBackward"; }
};

using cpd_cpu::wants_grad;

at::Tensor cast_autograd(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef fmt, int64_t rounding,
                         bool saturate, int64_t sr_bits) {
  at::Tensor out = cast_below(x, seed, fmt, rounding, saturate, sr_bits);
  if (wants_grad(x)) cpd_cpu::record_straight_through(out, x, "cpd::CastBackward");  // straight-through
  return out;
}

at::Tensor arith_autograd(int64_t op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                          const at::Tensor& seed, c10::IntArrayRef fmt, int64_t rounding, bool saturate,
                          int64_t sr_bits) {
  at::Tensor out = arith_below(op, a, b, c, seed, fmt, rounding, saturate, sr_bits);
  if (wants_grad(a, b, c)) {
    auto node = c10::make_intrusive<ArithBackward>();
    node->op = op;
    node->set_next_edges(torch::autograd::collect_next_edges(a, b, c));
    if (op != 1 && a.requires_grad()) node->b_ = torch::autograd::SavedVariable(b, false);
    if (op != 1 && b.requires_grad()) node->a_ = torch::autograd::SavedVariable(a, false);
    torch::autograd::set_history(out, node);
  }
  return out;
}

at::Tensor matmul_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& seed, c10::IntArrayRef mul,
                           c10::IntArrayRef acc, bool kahan, int64_t block, int64_t rounding, bool saturate,
                           int64_t sr_bits) {
  at::Tensor out = matmul_below(a, b, seed, mul, acc, kahan, block, rounding, saturate, sr_bits);
  if (wants_grad(a, b)) cpd_cpu::record_matmul_backward(out, a, b, "cpd::MatmulBackward");
  return out;
}

// cast_out writes into out: not differentiable (the public cast refuses out= under autograd);
// the mutation is counted on out's version counter, as for torch's own in-place ops.
void cast_out_autograd(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef fmt, int64_t rounding,
                       bool saturate, int64_t sr_bits, const at::Tensor& out) {
  static const auto op = op_handle<void(const at::Tensor&, const at::Tensor&, c10::IntArrayRef, int64_t, bool,
                                        int64_t, const at::Tensor&)>("cpd::cast_out");
  TORCH_CHECK(!(at::GradMode::is_enabled() && (x.requires_grad() || out.requires_grad())),
              "cpd: cast_out is not differentiable: x or out requires grad");
  {
    at::AutoDispatchBelowAutograd below;  // ADInplaceOrView and the device's kernel
    op.call(x, seed, fmt, rounding, saturate, sr_bits, out);
  }
  torch::autograd::impl::bump_version(out);
}

// The registrations: created on demand, never destroyed at exit (the dispatcher may be gone by
// then), released only by set_cpu_kernels.
torch::Library* g_cpu = nullptr;
torch::Library* g_cuda = nullptr;
torch::Library* g_autograd = nullptr;
torch::Library* g_mx_cpu = nullptr;  // cpd.mx's (mx_ops.cpp), beside each
torch::Library* g_mx_cuda = nullptr;
torch::Library* g_mx_autograd = nullptr;

template <class E>
torch::Library* kernels_for(c10::DispatchKey key) {
  auto* lib = new torch::Library(torch::Library::IMPL, "cpd", key, __FILE__, __LINE__);
  lib->impl("cast", TORCH_FN(cast_k<E>));
  lib->impl("cast_out", TORCH_FN(cast_out_k<E>));
  lib->impl("encode", TORCH_FN(encode_k<E>));
  lib->impl("decode", TORCH_FN(decode_k<E>));
  lib->impl("arith", TORCH_FN(arith_k<E>));
  lib->impl("matmul", TORCH_FN(matmul_k<E>));
  return lib;
}

// What CPU tensors get (set_cpu_kernels): nothing (Python registers its own), the loops, or the
// CUDA kernels through the host shim.
enum CpuKernels : int64_t { NONE = 0, LOOPS = 1, HOST_KERNELS = 2 };
int64_t g_cpu_kind = NONE;

void set_cpu_kernels(int64_t kind) {
  TORCH_CHECK(kind >= NONE && kind <= HOST_KERNELS, "cpd: set_cpu_kernels takes 0 (none), 1 (loops) or 2 "
              "(the CUDA kernels through the host shim), got ", kind);
  if (kind == g_cpu_kind) return;
  delete g_cpu;
  delete g_mx_cpu;
  g_cpu = kind == LOOPS ? kernels_for<Loops>(c10::DispatchKey::CPU)
        : kind == HOST_KERNELS ? kernels_for<Kernels>(c10::DispatchKey::CPU) : nullptr;
  g_mx_cpu = kind == LOOPS ? cpd_mx_ops::loops(c10::DispatchKey::CPU)
           : kind == HOST_KERNELS ? cpd_mx_ops::kernels(c10::DispatchKey::CPU) : nullptr;
  g_cpu_kind = kind;
  cpd_launch::set_host_kernels(kind == HOST_KERNELS);  // the fused dot's CPU kernel (fused_dot.cpp) reads it
}

// The CPU (loops) and autograd kernels of the core ops and cpd.mx's (once; the schemas must be
// defined: cpd/ops.py, cpd/mx.py).
void install_ops() {
  set_cpu_kernels(LOOPS);
  if (g_autograd) return;
  g_mx_autograd = cpd_mx_ops::autograd();
  g_autograd = new torch::Library(torch::Library::IMPL, "cpd", c10::DispatchKey::Autograd, __FILE__, __LINE__);
  g_autograd->impl("cast", TORCH_FN(cast_autograd));
  g_autograd->impl("arith", TORCH_FN(arith_autograd));
  g_autograd->impl("matmul", TORCH_FN(matmul_autograd));
  g_autograd->impl("cast_out", TORCH_FN(cast_out_autograd));
  // integer codes in or out: torch's fallback, which records that no gradient flows
  g_autograd->impl("encode", torch::autograd::autogradNotImplementedFallback());
  g_autograd->impl("decode", torch::autograd::autogradNotImplementedFallback());
}

// The CUDA kernels (once; cpd/_impl.py first destroys its Python CUDA registrations).
void install_cuda_ops() {
  if (!g_cuda) g_cuda = kernels_for<Kernels>(c10::DispatchKey::CUDA);
  if (!g_mx_cuda) g_mx_cuda = cpd_mx_ops::kernels(c10::DispatchKey::CUDA);
}

cpd_launch::F5 f5_of(const std::vector<int>& f) {
  TORCH_CHECK(f.size() == 5, "cpd: a format is [exp, man, bias, specials, subnormals], got ", f.size(), " values");
  return {f[0], f[1], f[2], f[3], f[4]};
}

// ------------------------------------------------------------------------------ direct calls
// The hot ops called from Python straight into torch's dispatcher (cpd/ops.py, cpd/mx.py and
// cpd/_tensor_core_op.py take these once the extension is loaded, where torch.ops would do nothing
// more: plain tensors, no __torch_function__ mode, not under torch.compile; cpd/_impl.py direct):
// the same op, dispatch keys and kernels as torch.ops.cpd.*, without torch.ops' Python layer (the
// argument stack built from Python objects against the schema, the __torch_function__ scan of
// every argument): 2.7 us less per cpd.cast, 3.8 us less per cpd.matmul forward of a 16^3 GEMM on
// a Zen 3 core. Errors and warnings reach Python as from torch.ops, and the GIL is released while
// the op runs, as torch.ops does (torch::wrap_pybind_function_no_gil). Each handle is looked up on
// first use: the schemas are defined in Python.
using FusedDotSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                               int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                               int64_t, int64_t, int64_t);
using MxCastSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::IntArrayRef, int64_t);
using MxCastOutSig = void(const at::Tensor&, const at::Tensor&, c10::IntArrayRef, int64_t, const at::Tensor&);
using Ints = std::vector<int64_t>;
using EncodeSig = at::Tensor(const at::Tensor&, c10::IntArrayRef, int64_t, bool);
using DecodeSig = at::Tensor(const at::Tensor&, c10::IntArrayRef);

void bind_direct(pybind11::module_& m) {
  // cpd.ops.draw_seed's pair: the same at::randint (one dispatcher call, the same kernel and bits) as
  // torch.randint(-2^63, 2^63 - 1, (2,), dtype=int64, generator=gen), without its Python argument
  // parsing (2 us against 3-4 on a Zen 3 core; the pair was a third of a 2^10-float stochastic
  // cast's host time).
  m.def("draw_seed", torch::wrap_pybind_function([](std::optional<at::Generator> gen) {
          return at::randint(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), {2},
                             std::move(gen), at::TensorOptions().dtype(at::kLong));
        }));
  m.def("call_encode", torch::wrap_pybind_function_no_gil([](const at::Tensor& x, const Ints& fmt, int64_t rounding,
                                                             bool saturate) {
          static const auto op = op_handle<EncodeSig>("cpd::encode");
          return op.call(x, fmt, rounding, saturate);
        }));
  m.def("call_decode", torch::wrap_pybind_function_no_gil([](const at::Tensor& codes, const Ints& fmt) {
          static const auto op = op_handle<DecodeSig>("cpd::decode");
          return op.call(codes, fmt);
        }));
  m.def("call_cast", torch::wrap_pybind_function_no_gil([](const at::Tensor& x, const at::Tensor& seed,
                                                           const Ints& fmt, int64_t rounding, bool saturate,
                                                           int64_t sr_bits) {
          static const auto op = op_handle<CastSig>("cpd::cast");
          return op.call(x, seed, fmt, rounding, saturate, sr_bits);
        }));
  m.def("call_cast_out", torch::wrap_pybind_function_no_gil([](const at::Tensor& x, const at::Tensor& seed,
                                                               const Ints& fmt, int64_t rounding, bool saturate,
                                                               int64_t sr_bits, const at::Tensor& out) {
          static const auto op = op_handle<CastOutSig>("cpd::cast_out");
          op.call(x, seed, fmt, rounding, saturate, sr_bits, out);
        }));
  m.def("call_arith", torch::wrap_pybind_function_no_gil([](int64_t which, const at::Tensor& a, const at::Tensor& b,
                                                            const at::Tensor& c, const at::Tensor& seed,
                                                            const Ints& fmt, int64_t rounding, bool saturate,
                                                            int64_t sr_bits) {
          static const auto op = op_handle<ArithSig>("cpd::arith");
          return op.call(which, a, b, c, seed, fmt, rounding, saturate, sr_bits);
        }));
  m.def("call_matmul", torch::wrap_pybind_function_no_gil([](const at::Tensor& a, const at::Tensor& b,
                                                             const at::Tensor& seed, const Ints& mul, const Ints& acc,
                                                             bool kahan, int64_t block, int64_t rounding,
                                                             bool saturate, int64_t sr_bits) {
          static const auto op = op_handle<MatmulSig>("cpd::matmul");
          return op.call(a, b, seed, mul, acc, kahan, block, rounding, saturate, sr_bits);
        }));
  m.def("call_fused_dot_matmul",
        torch::wrap_pybind_function_no_gil(
            [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb, int64_t block,
               int64_t s_emin, int64_t group, int64_t frac, int64_t out, int64_t a_emin, int64_t b_emin,
               int64_t zero_exp, int64_t algo, int64_t ftz, int64_t a_man, int64_t a_emax, int64_t b_man,
               int64_t b_emax) {
              static const auto op = op_handle<FusedDotSig>("cpd::fused_dot_matmul");
              return op.call(a, b, sa, sb, block, s_emin, group, frac, out, a_emin, b_emin, zero_exp, algo, ftz,
                             a_man, a_emax, b_man, b_emax);
            }));
  m.def("call_mx_cast", torch::wrap_pybind_function_no_gil([](const at::Tensor& x, const at::Tensor& seed,
                                                              const Ints& spec, int64_t rounding) {
          static const auto op = op_handle<MxCastSig>("cpd_mx::cast");
          return op.call(x, seed, spec, rounding);
        }));
  m.def("call_mx_cast_out", torch::wrap_pybind_function_no_gil([](const at::Tensor& x, const at::Tensor& seed,
                                                                  const Ints& spec, int64_t rounding,
                                                                  const at::Tensor& out) {
          static const auto op = op_handle<MxCastOutSig>("cpd_mx::cast_out");
          op.call(x, seed, spec, rounding, out);
        }));
}

void bind(pybind11::module_& m) {
  bind_direct(m);
  m.def("install_ops", &install_ops);
  m.def("install_cuda_ops", &install_cuda_ops);
  m.def("set_cpu_kernels", &set_cpu_kernels);
  m.def("cpu_kernels", [] { return g_cpu_kind; });
  m.def("set_launch_sources", &cpd_launch::set_sources);
  m.def("set_mx_torch_path", &cpd_mx_ops::set_torch_path);
  m.def("mx_launch_shape", &cpd_launch::mx_launch_shape);
  // the wire passes' launches (cpd/distributed/cuda_kernels.py): CUDA tensors, or CPU tensors
  // through the host shim; a format is [exp, man, bias, specials, subnormals]
  m.def("wire_launch_encode", [](const at::Tensor& x, const at::Tensor& segs, const at::Tensor& out,
                                 std::vector<int> f, int mode, bool saturate, int bits, bool raw32) {
    cpd_launch::wire_encode(x, segs, out, f5_of(f), mode, saturate, bits, raw32);
  });
  m.def("wire_launch_hop", [](const at::Tensor& recv, const std::optional<at::Tensor>& recv_c, const at::Tensor& acc,
                              const std::optional<at::Tensor>& acc_c, int64_t n, std::vector<int> f, int mode,
                              bool saturate, int bits, bool raw32, bool kahan, bool carry, bool sequential) {
    cpd_launch::wire_hop(recv, recv_c.value_or(at::Tensor()), acc, acc_c.value_or(at::Tensor()), n, f5_of(f), mode,
                         saturate, bits, raw32, kahan, carry, sequential);
  });
  m.def("wire_launch_decode", [](const at::Tensor& data, const at::Tensor& segs, const at::Tensor& out,
                                 std::vector<int> f, int bits, bool raw32, double inv) {
    cpd_launch::wire_decode(data, segs, out, f5_of(f), bits, raw32, static_cast<float>(inv));
  });
  m.def("set_host_geometry", &cpd_launch::set_host_geometry);
  // the fused dot's launch (for the tests): the kernel for a spec [group, frac, out, a_emin, b_emin,
  // zero_exp, algo, ftz, a_man, b_man] in a tile shape, a GPU's shape, the shim's shape
  m.def("fused_dot_kernel", [](std::vector<int> p, int64_t block, const std::string& shape) {
    TORCH_CHECK(p.size() == 10, "cpd: fused_dot_kernel takes 10 spec values, got ", p.size());
    return cpd_launch::fused_dot_kernel({p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]}, block, shape);
  });
  m.def("fused_dot_tile_shape", &cpd_launch::fused_dot_tile_shape, pybind11::arg("major"), pybind11::arg("smem_optin"),
        pybind11::arg("group"), pybind11::arg("block"), pybind11::arg("algo") = 0);
  m.def("set_fused_dot_host_shape", &cpd_launch::set_fused_dot_host_shape);
  m.def("host_kernels", &cpd_launch::host_kernels);
  m.def("matmul_kernel", [](bool has_mul, std::vector<int> mul, std::vector<int> acc, bool kahan, int block, int mode,
                            bool saturate) {
    TORCH_CHECK(mul.size() == 5 && acc.size() == 5, "cpd: matmul_kernel takes two 5-int formats");
    return cpd_launch::matmul_kernel(has_mul, {mul[0], mul[1], mul[2], mul[3], mul[4]},
                                     {acc[0], acc[1], acc[2], acc[3], acc[4]}, kahan, block, mode, saturate);
  });
}

}  // namespace

// cuda/cpu/cast.cpp calls this from the module's init when it is set (this file is linked in).
extern void (*cpd_bind_ops)(pybind11::module_&);
namespace {
[[maybe_unused]] const bool linked = (cpd_bind_ops = &bind, true);
}  // namespace
