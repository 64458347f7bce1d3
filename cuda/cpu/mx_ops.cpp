// cpd.mx's ops (cpd_mx::cast, cast_out, encode, decode) registered with torch's dispatcher from C++.
//
// cpd/mx.py defines the schemas (in Python, so that they exist with no compiler, where the
// pure-torch path cpd/_mx_torch.py runs them) and their fake kernels (torch.compile). A block
// format travels as one int[] of 16 (cpd/_block_format.py BlockFormat._op_spec):
//   [element exp, man, bias, specials, subnormals, scale exp, man, bias, specials, subnormals,
//    rule (cpd::RULE_*), is_int, block_size, axis, tensor_scale, fused]
// and the rounding as its code (Rounding.code). ops.cpp's install_ops() registers here, beside the
// core ops: the CPU kernels (the loops of cuda/cpu/mx.cpp), the autograd kernels (cast:
// straight-through; cast_out, encode and decode: not differentiable), and install_cuda_ops() the
// CUDA kernels, which launch cuda/kernels/mx.cu through launch.cpp (the grid and the lanes per
// block are computed there only); set_cpu_kernels(HOST_KERNELS) gives CPU tensors those same op
// bodies launched through the host shim. The op bodies (below) move the block axis last, view x
// as a contiguous (rows, n) matrix, compute NVFP4's tensor scale T and draw cast's (seed, offset)
// pair, as cpd/_mx_engine.py did in Python (the same torch operations, so the same bits). A
// format whose power-of-two scales leave float32's exponent range (fused = 0) is handed to the
// pure-torch path (cpd/_mx_engine.py torch_body, set by set_torch_path).
#include "mx_ops.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "cpd/numerics.h"
#include "launch.h"
#include "matmul_backward.h"  // record_straight_through, wants_grad

// cuda/cpu/mx.cpp: the fused CPU loops
at::Tensor mx_cast(const at::Tensor& x, at::IntArrayRef el, at::IntArrayRef sc, int64_t rule, bool is_int,
                   int64_t block, double t, int64_t mode, int64_t seed, int64_t offset,
                   const std::optional<at::Tensor>& out);
std::tuple<at::Tensor, at::Tensor> mx_encode(const at::Tensor& x, at::IntArrayRef el, at::IntArrayRef sc,
                                             int64_t rule, bool is_int, int64_t block, double t, int64_t mode,
                                             int64_t seed, int64_t offset, int64_t pack);
at::Tensor mx_decode(const at::Tensor& codes, const at::Tensor& scodes, at::IntArrayRef el, at::IntArrayRef sc,
                     bool is_int, int64_t block, double t, int64_t n, int64_t pack);

namespace cpd_mx_ops {
namespace {

using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

constexpr int64_t kStochastic = 1;  // Rounding.STOCHASTIC.code

// ------------------------------------------------------------------------------ the format
struct MxFmt {
  int64_t el[5], sc[5];
  cpd_launch::MxFormat k;  // the kernels' form (t set per call)
  int64_t axis = -1;
  bool tensor_scale = false, fused = true;
  int bits = 8;            // the element's
  double t_divisor = 1.0;  // max_scale * max_elem (NVFP4's tensor scale)
  c10::IntArrayRef elr() const { return c10::IntArrayRef(el, 5); }
  c10::IntArrayRef scr() const { return c10::IntArrayRef(sc, 5); }
};

float max_of(const int64_t* f) {
  return cpd::float_of(cpd::make_format(int(f[0]), int(f[1]), int(f[2]), int(f[3]), int(f[4]), true).max_bits);
}

MxFmt fmt_of(c10::IntArrayRef s, int64_t rounding) {
  TORCH_CHECK(s.size() == 16, "cpd_mx: a block format is 16 ints (cpd.mx.BlockFormat._op_spec), got ", s.size());
  TORCH_CHECK(rounding >= 0 && rounding <= 6, "cpd_mx: rounding code ", rounding, " is not in 0..6");
  MxFmt f;
  for (int i = 0; i < 5; ++i) f.el[i] = s[i], f.sc[i] = s[5 + i];
  TORCH_CHECK(s[10] >= 0 && s[10] <= 3, "cpd_mx: the scale rule is 0..3, got ", s[10]);
  TORCH_CHECK(s[12] >= 1, "cpd_mx: block_size must be >= 1, got ", s[12]);
  f.k.el = {int(s[0]), int(s[1]), int(s[2]), int(s[3]), int(s[4])};
  f.k.sc = {int(s[5]), int(s[6]), int(s[7]), int(s[8]), int(s[9])};
  f.k.rule = int(s[10]);
  f.k.is_int = int(s[11] != 0);
  f.k.block = s[12];
  f.axis = s[13];
  f.tensor_scale = s[14] != 0;
  f.fused = s[15] != 0;
  f.bits = int(1 + s[0] + s[1]);
  if (f.tensor_scale) f.t_divisor = double(max_of(f.sc)) * double(max_of(f.el));
  return f;
}

// ------------------------------------------------------------------------------ the pure-torch path
pybind11::object* g_torch = nullptr;  // Python: torch_body(op, *args) (cpd/_mx_engine.py)

template <typename R, typename... A>
R torch_path(const char* op, A&&... args) {
  pybind11::gil_scoped_acquire gil;
  TORCH_CHECK(g_torch && *g_torch, "cpd_mx: the pure-torch path is not set (cpd._impl sets it with the C++ kernels)");
  try {
    return (*g_torch)(op, std::forward<A>(args)...).template cast<R>();
  } catch (pybind11::error_already_set& e) {
    TORCH_CHECK(false, "cpd_mx: the pure-torch ", op, " failed: ", e.what());
  }
}

// ------------------------------------------------------------------------------ engines
// What fills the (rows, n) layout: the CPU loops of mx.cpp, or mx.cu's kernels (launch.cpp, on the
// GPU or, for CPU tensors, through the host shim). `out`: a (rows, n) view to write, or undefined.
struct Loops {
  static at::Tensor cast(const at::Tensor& x2, const at::Tensor& out, const MxFmt& f, float t, int64_t mode,
                         int64_t s, int64_t o) {
    return ::mx_cast(x2, f.elr(), f.scr(), f.k.rule, f.k.is_int, f.k.block, t, mode, s, o,
                     out.defined() ? std::optional<at::Tensor>(out) : std::nullopt);
  }
  static std::tuple<at::Tensor, at::Tensor> encode(const at::Tensor& x2, const MxFmt& f, float t, int64_t mode,
                                                   int64_t s, int64_t o, int pack) {
    return ::mx_encode(x2, f.elr(), f.scr(), f.k.rule, f.k.is_int, f.k.block, t, mode, s, o, pack);
  }
  static at::Tensor decode(const at::Tensor& c2, const at::Tensor& s2, const MxFmt& f, float t, int64_t n, int pack) {
    return ::mx_decode(c2, s2, f.elr(), f.scr(), f.k.is_int, f.k.block, t, n, pack);
  }
};

int64_t row_bytes_of(int64_t L, int pack) { return pack == 4 ? (L + 1) / 2 : pack == 6 ? (L + 3) / 4 * 3 : L; }

struct Kernels {
  static cpd_launch::MxFormat with_t(const MxFmt& f, float t) {
    cpd_launch::MxFormat k = f.k;
    k.t = t;
    return k;
  }
  static at::Tensor cast(const at::Tensor& x2, const at::Tensor& out, const MxFmt& f, float t, int64_t mode,
                         int64_t s, int64_t o) {
    at::Tensor y = out.defined() ? out : at::empty_like(x2);
    cpd_launch::mx_cast(x2, y, with_t(f, t), int(mode), uint64_t(s), uint64_t(o));
    return y;
  }
  static std::tuple<at::Tensor, at::Tensor> encode(const at::Tensor& x2, const MxFmt& f, float t, int64_t mode,
                                                   int64_t s, int64_t o, int pack) {
    const int64_t rows = x2.size(0), n = x2.size(1), nb = (n + f.k.block - 1) / f.k.block;
    const auto opts = x2.options().dtype(at::kByte);
    at::Tensor codes = at::empty({rows, n ? row_bytes_of(nb * f.k.block, pack) : 0}, opts);
    at::Tensor scodes = at::empty({rows, nb}, opts);
    cpd_launch::mx_encode(x2, codes, scodes, with_t(f, t), int(mode), uint64_t(s), uint64_t(o), pack);
    return {codes, scodes};
  }
  static at::Tensor decode(const at::Tensor& c2, const at::Tensor& s2, const MxFmt& f, float t, int64_t n, int pack) {
    at::Tensor y = at::empty({c2.size(0), n}, c2.options().dtype(at::kFloat));
    cpd_launch::mx_decode(c2, s2, y, with_t(f, t), pack);
    return y;
  }
};

// ------------------------------------------------------------------------------ shared steps
// x with the block axis moved last as a contiguous (rows, n) matrix, the moved shape's leading
// dims, n and the axis.
struct Rows {
  at::Tensor x2;
  std::vector<int64_t> lead;
  int64_t n = 0, axis = 0;
  std::vector<int64_t> shape(int64_t last) const {
    std::vector<int64_t> s(lead);
    s.push_back(last);
    return s;
  }
};

Rows rows_of(const at::Tensor& x, int64_t axis) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "cpd_mx: x must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, "cpd_mx: x must have at least one dimension to carry blocks");
  Rows r;
  r.axis = c10::maybe_wrap_dim(axis, x.dim());
  const at::Tensor xm = r.axis == x.dim() - 1 ? x : x.movedim(r.axis, -1);
  r.lead = xm.sizes().slice(0, xm.dim() - 1).vec();
  r.n = xm.size(-1);
  int64_t rows = 1;
  for (int64_t v : r.lead) rows *= v;
  r.x2 = xm.reshape({rows, r.n}).contiguous();
  return r;
}

// The (rows, n) result back in x's layout (the block axis where it was).
at::Tensor unrows(const at::Tensor& y2, const Rows& r) {
  const at::Tensor y = y2.reshape(r.shape(r.n));
  return r.axis == int64_t(r.lead.size()) ? y : y.movedim(-1, r.axis);
}

// NVFP4's tensor scale T = amax / (max_scale * max_elem), 1 for an all-zero or non-finite tensor
// (cpd/_mx_torch.py tensor_scale: the same torch operations).
at::Tensor tensor_scale(const at::Tensor& x, const MxFmt& f) {
  at::Tensor amax;
  if (x.numel()) {
    const auto [lo, hi] = at::aminmax(x);
    amax = at::maximum(hi, lo.neg());
  } else {
    amax = at::zeros({}, x.options());
  }
  const at::Tensor t = at::div(amax, at::scalar_tensor(f.t_divisor, x.options()));
  return at::where(at::isfinite(amax).logical_and(amax.gt(0)), t, at::ones_like(t));
}

// encode's (seed, offset): a CPU int64 tensor of two (cpd.ops.draw_seed); (0, 0) unless stochastic.
std::pair<int64_t, int64_t> pair_of(const at::Tensor& seed, int64_t rounding) {
  if (rounding != kStochastic) return {0, 0};
  TORCH_CHECK(seed.device().is_cpu() && seed.scalar_type() == at::kLong && seed.numel() == 2,
              "cpd_mx: seed must be a CPU int64 tensor of 2 elements (cpd.ops.draw_seed)");
  const at::Tensor s = seed.contiguous();
  return {s.data_ptr<int64_t>()[0], s.data_ptr<int64_t>()[1]};
}

// cast's scalar seed -> the pair, as cpd.mx has always drawn it: a CPU generator seeded with it
// (what cpd.ops.draw_seed uses for a fresh generator of any device), then two int64 draws.
std::pair<int64_t, int64_t> cast_pair_of(const at::Tensor& seed, int64_t rounding) {
  if (rounding != kStochastic) return {0, 0};
  TORCH_CHECK(seed.device().is_cpu() && seed.scalar_type() == at::kLong && seed.numel() == 1,
              "cpd_mx: cast's seed must be a CPU int64 scalar tensor");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(seed.item<int64_t>()));
  const at::Tensor p = at::randint(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), {2},
                                   gen, at::TensorOptions().dtype(at::kLong));
  return {p.data_ptr<int64_t>()[0], p.data_ptr<int64_t>()[1]};
}

// What the kernels pack (4, 6) or 0: one code per byte (the codes are packed below when the
// block's codes do not fill whole bytes: an odd block of 4-bit codes, 6-bit blocks not a multiple of 4).
int pack_mode(const MxFmt& f, bool packed) {
  if (packed && f.bits == 4 && f.k.block % 2 == 0) return 4;
  if (packed && f.bits == 6 && f.k.block % 4 == 0) return 6;
  return 0;
}

// cpd/_mx_torch.py pack: the low bits of uint8 codes along the last axis, low bits first (4 bits:
// two per byte; 6 bits: four per three bytes), the axis zero-padded to a whole group.
at::Tensor pack_codes(const at::Tensor& codes, int bits) {
  if (bits != 4 && bits != 6) return codes.contiguous();
  const int64_t group = bits == 4 ? 2 : 4, pad = (group - codes.size(-1) % group) % group;
  std::vector<int64_t> shape = codes.sizes().vec();
  shape.back() = (shape.back() + pad) / group;
  shape.push_back(group);
  const at::Tensor c = at::constant_pad_nd(codes, {0, pad}, 0).to(at::kInt).reshape(shape);
  if (bits == 4) return c.select(-1, 0).bitwise_or(c.select(-1, 1).bitwise_left_shift(4)).to(at::kByte);
  const at::Tensor w = c.select(-1, 0)
                           .bitwise_or(c.select(-1, 1).bitwise_left_shift(6))
                           .bitwise_or(c.select(-1, 2).bitwise_left_shift(12))
                           .bitwise_or(c.select(-1, 3).bitwise_left_shift(18));  // 24 bits
  const at::Tensor out = at::stack({w.bitwise_and(0xFF), w.bitwise_right_shift(8).bitwise_and(0xFF),
                                    w.bitwise_right_shift(16).bitwise_and(0xFF)}, -1);
  shape.pop_back();
  shape.back() *= 3;
  return out.reshape(shape).to(at::kByte);
}

// ------------------------------------------------------------------------------ op bodies
template <class E>
at::Tensor cast_k(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef spec, int64_t rounding) {
  const MxFmt f = fmt_of(spec, rounding);
  if (!f.fused) return torch_path<at::Tensor>("cast", x, seed, spec.vec(), rounding);
  const auto [s, o] = cast_pair_of(seed, rounding);
  const Rows r = rows_of(x, f.axis);
  const float t = f.tensor_scale ? tensor_scale(x, f).item<float>() : 1.0f;
  return unrows(E::cast(r.x2, at::Tensor(), f, t, rounding, s, o), r).contiguous();
}

template <class E>
void cast_out_k(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef spec, int64_t rounding,
                const at::Tensor& out) {
  const MxFmt f = fmt_of(spec, rounding);
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.sizes() == x.sizes() && out.device() == x.device(),
              "cpd_mx: out must be a float32 tensor of x's shape and device");
  if (!f.fused) {
    out.copy_(torch_path<at::Tensor>("cast", x, seed, spec.vec(), rounding));
    return;
  }
  const auto [s, o] = cast_pair_of(seed, rounding);
  const Rows r = rows_of(x, f.axis);
  const float t = f.tensor_scale ? tensor_scale(x, f).item<float>() : 1.0f;
  if (out.is_contiguous() && r.axis == x.dim() - 1) {  // the rows are out's: written in place
    E::cast(r.x2, out.view({r.x2.size(0), r.n}), f, t, rounding, s, o);
  } else {
    out.copy_(unrows(E::cast(r.x2, at::Tensor(), f, t, rounding, s, o), r));
  }
}

template <class E>
Triple encode_k(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef spec, int64_t rounding, bool packed) {
  const MxFmt f = fmt_of(spec, rounding);
  if (!f.fused) return torch_path<Triple>("encode", x, seed, spec.vec(), rounding, packed);
  const auto [s, o] = pair_of(seed, rounding);
  const Rows r = rows_of(x, f.axis);
  const at::Tensor t = f.tensor_scale ? tensor_scale(x, f) : at::ones({}, x.options());
  const int pack = pack_mode(f, packed);
  auto [codes, scodes] = E::encode(r.x2, f, f.tensor_scale ? t.item<float>() : 1.0f, rounding, s, o, pack);
  if (packed && !pack) codes = pack_codes(codes, f.bits);
  return {codes.reshape(r.shape(codes.size(-1))), scodes.reshape(r.shape(scodes.size(-1))), t};
}

template <class E>
at::Tensor decode_k(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& t, c10::IntArrayRef spec,
                    int64_t n, bool packed) {
  const MxFmt f = fmt_of(spec, 0);
  if (!f.fused) return torch_path<at::Tensor>("decode", codes, scales, t, spec.vec(), n, packed);
  TORCH_CHECK(codes.scalar_type() == at::kByte && scales.scalar_type() == at::kByte && codes.dim() >= 1 &&
              scales.dim() == codes.dim() && codes.device() == scales.device(),
              "cpd_mx: codes and scales must be uint8 tensors of as many dims on one device");
  const int pack = packed && (f.bits == 4 || f.bits == 6) ? f.bits : 0;
  std::vector<int64_t> lead = scales.sizes().slice(0, scales.dim() - 1).vec();
  int64_t rows = 1;
  for (int64_t v : lead) rows *= v;
  const at::Tensor c2 = codes.reshape({rows, codes.size(-1)}).contiguous();
  const at::Tensor s2 = scales.reshape({rows, scales.size(-1)}).contiguous();
  const int64_t nb = (n + f.k.block - 1) / f.k.block;
  TORCH_CHECK(n >= 0 && s2.size(1) == nb && c2.size(1) >= (n ? row_bytes_of(nb * f.k.block, pack) : 0),
              "cpd_mx: codes ", codes.sizes(), " and scales ", scales.sizes(), " do not match n = ", n,
              " and block = ", f.k.block);
  const float tf = f.tensor_scale ? t.item<float>() : 1.0f;
  lead.push_back(n);
  return E::decode(c2, s2, f, tf, n, pack).reshape(lead);
}

// ------------------------------------------------------------------------------ autograd
template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

at::Tensor cast_autograd(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef spec, int64_t rounding) {
  static const auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::IntArrayRef, int64_t)>(
      "cpd_mx::cast");
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    out = op.call(x, seed, spec, rounding);
  }
  if (cpd_cpu::wants_grad(x)) cpd_cpu::record_straight_through(out, x, "cpd_mx::CastBackward");  // straight-through
  return out;
}

// cast_out writes into out: not differentiable; the write is counted on out's version counter.
void cast_out_autograd(const at::Tensor& x, const at::Tensor& seed, c10::IntArrayRef spec, int64_t rounding,
                       const at::Tensor& out) {
  static const auto op =
      op_handle<void(const at::Tensor&, const at::Tensor&, c10::IntArrayRef, int64_t, const at::Tensor&)>(
          "cpd_mx::cast_out");
  TORCH_CHECK(!(at::GradMode::is_enabled() && (x.requires_grad() || out.requires_grad())),
              "cpd_mx: cast_out is not differentiable: x or out requires grad");
  {
    at::AutoDispatchBelowAutograd below;
    op.call(x, seed, spec, rounding, out);
  }
  torch::autograd::impl::bump_version(out);
}

template <class E>
torch::Library* kernels_for(c10::DispatchKey key) {
  auto* lib = new torch::Library(torch::Library::IMPL, "cpd_mx", key, __FILE__, __LINE__);
  lib->impl("cast", TORCH_FN(cast_k<E>));
  lib->impl("cast_out", TORCH_FN(cast_out_k<E>));
  lib->impl("encode", TORCH_FN(encode_k<E>));
  lib->impl("decode", TORCH_FN(decode_k<E>));
  return lib;
}

}  // namespace

torch::Library* loops(c10::DispatchKey key) { return kernels_for<Loops>(key); }
torch::Library* kernels(c10::DispatchKey key) { return kernels_for<Kernels>(key); }

torch::Library* autograd() {
  auto* lib = new torch::Library(torch::Library::IMPL, "cpd_mx", c10::DispatchKey::Autograd, __FILE__, __LINE__);
  lib->impl("cast", TORCH_FN(cast_autograd));
  lib->impl("cast_out", TORCH_FN(cast_out_autograd));
  lib->impl("encode", torch::autograd::autogradNotImplementedFallback());
  lib->impl("decode", torch::autograd::autogradNotImplementedFallback());
  return lib;
}

void set_torch_path(pybind11::object fn) {
  if (!g_torch) g_torch = new pybind11::object();  // never destroyed: the interpreter may be gone at exit
  *g_torch = std::move(fn);
}

}  // namespace cpd_mx_ops
