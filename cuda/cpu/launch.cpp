// The CUDA kernels' launches in C++ (issue 28): one code path builds each launch's parameter
// block and grid (the twin of cpd/_kernels.py, which serves when this extension is absent); two
// calls run it:
//   * a CUDA tensor: cuLaunchKernel through the driver API, looked up at run time in libcuda
//     (no CUDA toolkit is needed to build this file), on torch's current stream of the device
//     (c10's stream native handle), with the device's primary context pushed for the call; the
//     NVRTC image comes from Python once per (device, kernel file) (cpd._cuda.image_for: compiled
//     and cached on disk as before), loaded into a CUfunction table; no host sync, no allocation;
//   * a CPU tensor (only under cpd._shim.on_host): the host shim's cpd_shim_launch for the kernel
//     file, with the same parameter array, whose sizes it checks against the kernel's signature.
// The matmul kernel is picked by cpd/gemm.h's gemm_family, the function the kernels' own
// predicates come from, so the choice cannot drift from the headers.
#include "launch.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cpd/numerics.h"
#include "cpd/gemm.h"
#include "cpd/fused_dot_tiled.h"

namespace cpd_launch {
namespace {

// ---------------------------------------------------------------------------- one launch
constexpr int kMaxThreads = 256;     // __launch_bounds__ of every kernel (CPD_THREADS)
constexpr int kMatmulThreads = 256;  // cpd/_kernels.py MATMUL_THREADS
constexpr int kGenericTile = 32;     // cpd/_kernels.py GENERIC_TILE: outputs per side of a tiled block

// The kernel's parameters in order, each in 8 bytes of its own (cuLaunchKernel's kernelParams
// holds one pointer per parameter, to its value; the shim also gets each value's size).
struct Args {
  static constexpr int kMax = 40;
  alignas(8) unsigned char value[kMax][8];
  void* ptr[kMax];
  size_t size[kMax];
  int n = 0;
  template <typename T>
  Args& add(T v) {
    static_assert(sizeof(T) <= 8, "a kernel parameter of at most 8 bytes");
    TORCH_CHECK(n < kMax, "cpd: too many kernel parameters");
    std::memcpy(value[n], &v, sizeof(T));
    ptr[n] = value[n];
    size[n] = sizeof(T);
    ++n;
    return *this;
  }
  Args& tensor(const at::Tensor& t) { return add<const void*>(t.data_ptr()); }
  Args& fmt(const F5& f) { return add<int>(f.exp).add<int>(f.man).add<int>(f.bias).add<int>(f.specials).add<int>(f.subnormals); }
  Args& seed(uint64_t s, uint64_t o) { return add<unsigned long long>(s).add<unsigned long long>(o); }
};

struct Geometry {
  int threads = kMaxThreads;
  int64_t max_blocks = 0;  // <= 0: no limit but the work
  unsigned blocks(int64_t items, int per_block) const {
    int64_t need = items <= 0 ? 1 : (items + per_block - 1) / per_block;
    if (max_blocks > 0 && need > max_blocks) need = max_blocks;
    TORCH_CHECK(need <= 0x7fffffff, "cpd: a launch of ", need, " blocks");
    return static_cast<unsigned>(need);
  }
};

// ---------------------------------------------------------------------------- the driver
// The few driver entry points used, with the driver API's ABI (cuda.h): CUresult is an int,
// CUdevice an int, the handles opaque pointers.
using CUresult = int;
struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get)(int*, int) = nullptr;
  CUresult (*attribute)(int*, int, int) = nullptr;
  CUresult (*primary_retain)(void**, int) = nullptr;
  CUresult (*push)(void*) = nullptr;
  CUresult (*pop)(void**) = nullptr;
  CUresult (*load)(void**, const void*) = nullptr;
  CUresult (*function)(void**, void*, const char*) = nullptr;
  CUresult (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                     void**) = nullptr;
  CUresult (*error_name)(CUresult, const char**) = nullptr;
  CUresult (*func_attribute)(void*, int, int) = nullptr;  // cuFuncSetAttribute
};
constexpr int kAttrMultiprocessors = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kAttrSmemOptin = 97;        // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr int kFuncMaxDynamicSmem = 8;    // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr unsigned kSmemDefault = 48 << 10;  // dynamic shared memory a kernel gets without opting in

template <typename F>
void bind(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  TORCH_CHECK(f, "cpd: the CUDA driver (libcuda.so.1) lacks ", name);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib, "cpd: cannot load the CUDA driver (libcuda.so.1): ", dlerror());
    bind(lib, r.init, "cuInit");
    bind(lib, r.device_get, "cuDeviceGet");
    bind(lib, r.attribute, "cuDeviceGetAttribute");
    bind(lib, r.primary_retain, "cuDevicePrimaryCtxRetain");
    bind(lib, r.push, "cuCtxPushCurrent_v2");
    bind(lib, r.pop, "cuCtxPopCurrent_v2");
    bind(lib, r.load, "cuModuleLoadData");
    bind(lib, r.function, "cuModuleGetFunction");
    bind(lib, r.launch, "cuLaunchKernel");
    bind(lib, r.error_name, "cuGetErrorName");
    bind(lib, r.func_attribute, "cuFuncSetAttribute");
    return r;
  }();
  return d;
}

void check(CUresult rc, const char* what, const std::string& detail = "") {
  if (rc == 0) return;
  const char* name = nullptr;
  driver().error_name(rc, &name);
  TORCH_CHECK(false, "cpd: ", what, detail.empty() ? "" : " ", detail, " failed: ", name ? name : "unknown error",
              " (", rc, ")");
}

struct DeviceState {
  void* context = nullptr;
  Geometry geometry;
  int sms = 0, major = 0, minor = 0, smem_optin = 0;  // multiprocessors, compute capability, opt-in smem per block
};

std::mutex g_mutex;
std::unordered_map<int, DeviceState> g_devices;
std::unordered_map<std::string, void*> g_modules;    // "<device>/<file>" -> CUmodule
std::unordered_map<std::string, void*> g_functions;  // "<device>/<file>/<name>" -> CUfunction
std::unordered_map<void*, unsigned> g_smem_allowed;   // CUfunction -> dynamic smem allowed so far (> 48 KiB)
pybind11::object* g_image = nullptr;                 // Python: image(file, device) -> bytes
pybind11::object* g_shim = nullptr;                  // Python: shim(file) -> address of cpd_shim_launch
Geometry g_host;                                     // the shim's launches

const DeviceState& device_state(int idx) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_devices.find(idx);
    if (it != g_devices.end()) return it->second;
  }
  const Driver& d = driver();
  check(d.init(0), "cuInit");
  int dev = 0;
  check(d.device_get(&dev, idx), "cuDeviceGet", std::to_string(idx));
  DeviceState s;
  check(d.primary_retain(&s.context, dev), "cuDevicePrimaryCtxRetain", std::to_string(idx));
  check(d.attribute(&s.sms, kAttrMultiprocessors, dev), "cuDeviceGetAttribute");
  check(d.attribute(&s.major, kAttrCapabilityMajor, dev), "cuDeviceGetAttribute");
  check(d.attribute(&s.minor, kAttrCapabilityMinor, dev), "cuDeviceGetAttribute");
  check(d.attribute(&s.smem_optin, kAttrSmemOptin, dev), "cuDeviceGetAttribute");
  s.geometry.threads = kMaxThreads;
  s.geometry.max_blocks = int64_t(s.sms) * 32;  // cpd/_cuda.py geometry: up to 32 blocks per SM
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_devices.emplace(idx, s).first->second;  // a racing thread's entry is kept (retained twice: harmless)
}

// fn(file, args...) from Python, converted to R, with the GIL taken (the dispatcher may have
// released it); a Python error becomes a c10::Error naming what failed.
template <typename R, typename... A>
R call_python(pybind11::object* fn, const char* what, const char* file, A... args) {
  pybind11::gil_scoped_acquire gil;
  TORCH_CHECK(fn && *fn, "cpd: ", what, " is not set (cpd._impl installs it with the C++ kernels)");
  try {
    return (*fn)(file, args...).template cast<R>();
  } catch (pybind11::error_already_set& e) {
    TORCH_CHECK(false, "cpd: ", what, " of ", file, " failed: ", e.what());
  }
}

// The CUfunction `name` of `file` on device idx: loaded on first use, then a table look-up.
void* function(int idx, const char* file, const char* name, const DeviceState& s) {
  const std::string mkey = std::to_string(idx) + "/" + file, fkey = mkey + "/" + name;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_functions.find(fkey);
    if (it != g_functions.end()) return it->second;
  }
  const Driver& d = driver();
  void* module = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_modules.find(mkey);
    if (it != g_modules.end()) module = it->second;
  }
  if (!module) {  // compile (Python, NVRTC, disk cache) outside the lock: it takes the GIL
    const std::string image = call_python<std::string>(g_image, "the NVRTC image", file, idx);  // bytes
    check(d.push(s.context), "cuCtxPushCurrent");
    void* loaded = nullptr;
    const CUresult rc = d.load(&loaded, image.data());
    void* popped = nullptr;
    d.pop(&popped);
    check(rc, "cuModuleLoadData", file);
    std::lock_guard<std::mutex> lock(g_mutex);
    module = g_modules.emplace(mkey, loaded).first->second;  // a racing load is left loaded (rare, small)
  }
  void* f = nullptr;
  check(d.function(&f, module, name), "cuModuleGetFunction", std::string(name) + " in " + file);
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_functions.emplace(fkey, f).first->second;
}

using ShimFn = int (*)(const char*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void*, int,
                       char*, size_t);

ShimFn shim_entry(const char* file) {
  static std::unordered_map<std::string, ShimFn> entries;  // guarded by g_mutex
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = entries.find(file);
    if (it != entries.end()) return it->second;
  }
  const uintptr_t address = call_python<uintptr_t>(g_shim, "the host shim", file);
  TORCH_CHECK(address != 0, "cpd shim: no entry point for ", file);
  std::lock_guard<std::mutex> lock(g_mutex);
  return entries.emplace(file, reinterpret_cast<ShimFn>(address)).first->second;
}

const Geometry& geometry_of(const at::Tensor& t) {
  if (t.is_cuda()) return device_state(t.device().index()).geometry;
  TORCH_CHECK(t.is_cpu(), "cpd: the kernels run on CUDA tensors (or CPU tensors through the host shim), got ",
              t.device());
  return g_host;
}

// Run one launch on the device of `t`, with `smem` bytes of dynamic shared memory (a kernel is
// allowed more than 48 KiB once per function, by cuFuncSetAttribute; the shim gives every
// launch cpd/launch.h's DYNAMIC_SMEM_MAX).
void run(const at::Tensor& t, const char* file, const char* name, unsigned blocks, unsigned threads, Args& args,
         unsigned smem = 0) {
  if (t.is_cuda()) {
    const int idx = t.device().index();
    const DeviceState& s = device_state(idx);
    void* f = function(idx, file, name, s);
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device());
    const Driver& d = driver();
    check(d.push(s.context), "cuCtxPushCurrent");
    CUresult rc = 0;
    if (smem > kSmemDefault) {
      std::lock_guard<std::mutex> lock(g_mutex);
      unsigned& allowed = g_smem_allowed[f];
      if (allowed < smem) {
        rc = d.func_attribute(f, kFuncMaxDynamicSmem, int(smem));
        if (rc == 0) allowed = smem;
      }
    }
    if (rc == 0) rc = d.launch(f, blocks, 1, 1, threads, 1, 1, smem, stream.native_handle(), args.ptr, nullptr);
    void* popped = nullptr;
    d.pop(&popped);
    if (rc != 0)
      check(rc, "launch of", std::string(name) + " (grid (" + std::to_string(blocks) + ", 1, 1), block (" +
                                 std::to_string(threads) + ", 1, 1), " + std::to_string(smem) +
                                 " bytes of shared memory)");
    return;
  }
  char err[512] = {0};
  const int rc = shim_entry(file)(name, blocks, 1, 1, threads, 1, 1, args.ptr, args.size, args.n, err, sizeof err);
  TORCH_CHECK(rc == 0, "cpd shim: launch of ", name, " (grid (", blocks, ", 1, 1), block (", threads,
              ", 1, 1)) failed: ", err);
}

const char* cast_kernel(int mode) {  // Rounding.code -> cpd/_kernels.py CAST_KERNELS
  static const char* const names[] = {"cpd_cast_nearest", "cpd_cast_stochastic", "cpd_cast_toward_zero",
                                      "cpd_cast_up",      "cpd_cast_down",       "cpd_cast_nearest_away",
                                      "cpd_cast_odd"};
  TORCH_CHECK(mode >= 0 && mode < 7, "cpd: rounding code ", mode, " is not in 0..6");
  return names[mode];
}

const char* code_suffix(const at::Tensor& codes) {
  switch (codes.scalar_type()) {
    case at::kByte: return "u8";
    case at::kShort: return "i16";
    case at::kInt: return "i32";
    default: TORCH_CHECK(false, "cpd: codes must be uint8, int16 or int32, got ", codes.scalar_type());
  }
}

// The family kernels of matmul.cu by cpd/gemm.h's enum, with the side of their square output tile
// (16 R: an R x R register tile per thread of 256); nullptr: the generic tiled kernel.
struct Family {
  const char* name;
  int side;
};
Family family_kernel(int family) {
  switch (family) {
    case cpd::GEMM_CHAIN: return {"cpd_matmul_chain", 128};
    case cpd::GEMM_LANES: return {"cpd_matmul_lanes", 64};
    case cpd::GEMM_KAHAN: return {"cpd_matmul_kahan", 64};
    case cpd::GEMM_F32: return {"cpd_matmul_f32", 64};
    case cpd::GEMM_KAHAN32: return {"cpd_matmul_kahan32", 64};
    case cpd::GEMM_FKAHAN32: return {"cpd_matmul_fkahan32", 64};
    case cpd::GEMM_LANES16: return {"cpd_matmul_lanes16", 64};
    case cpd::GEMM_KAHAN16: return {"cpd_matmul_kahan16", 64};
    case cpd::GEMM_LANESBF: return {"cpd_matmul_lanesbf", 64};
    case cpd::GEMM_KAHANBF: return {"cpd_matmul_kahanbf", 64};
    case cpd::GEMM_FUSEDBF: return {"cpd_matmul_fusedbf", 64};
    case cpd::GEMM_FKAHANBF: return {"cpd_matmul_fkahanbf", 64};
    case cpd::GEMM_FUSED16: return {"cpd_matmul_fused16", 64};
    case cpd::GEMM_FKAHAN16: return {"cpd_matmul_fkahan16", 64};
    case cpd::GEMM_F32B: return {"cpd_matmul_f32b", 64};
    case cpd::GEMM_FF32B: return {"cpd_matmul_ff32b", 64};
    case cpd::GEMM_SR: return {"cpd_matmul_sr", 32};
    default: return {nullptr, 0};
  }
}

Family matmul_family(bool has_mul, const F5& m, const F5& acc, bool kahan, int block, int mode, bool saturate,
                     int sr_bits) {
  if (mode != cpd::NEAREST && mode != cpd::STOCHASTIC) return {nullptr, 0};  // directed modes: the generic steps
  const cpd::Format mf = cpd::make_format(m.exp, m.man, m.bias, m.specials, m.subnormals, saturate);
  const cpd::Format af = cpd::make_format(acc.exp, acc.man, acc.bias, acc.specials, acc.subnormals, saturate);
  return family_kernel(cpd::gemm_family(cpd::make_dot_spec(mf, has_mul, af, kahan, block, mode, sr_bits)));
}

}  // namespace

std::string matmul_kernel(bool has_mul, const F5& mul, const F5& acc, bool kahan, int block, int mode, bool saturate) {
  const Family fam = matmul_family(has_mul, has_mul ? mul : acc, acc, kahan, block, mode, saturate, 32);
  return fam.name ? fam.name : "cpd_matmul_tiled";
}

// ---------------------------------------------------------------------------- the launches
void cast(const at::Tensor& x, const at::Tensor& out, const F5& f, int mode, bool saturate, int sr_bits,
          uint64_t seed, uint64_t offset) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const Geometry& g = geometry_of(x);
  Args a;
  a.tensor(x).tensor(out).add<long long>(n).fmt(f).add<int>(saturate).add<int>(sr_bits).seed(seed, offset);
  run(x, "cast.cu", cast_kernel(mode), g.blocks((n + 3) / 4, g.threads), g.threads, a);  // 4 elements a thread
}

void encode(const at::Tensor& x, const at::Tensor& codes, const F5& f, int mode, bool saturate) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const Geometry& g = geometry_of(x);
  const std::string name = std::string("cpd_encode_") + code_suffix(codes);
  Args a;
  a.tensor(x).tensor(codes).add<long long>(n).fmt(f).add<int>(mode).add<int>(saturate);
  run(x, "cast.cu", name.c_str(), g.blocks(n, g.threads), g.threads, a);
}

void decode(const at::Tensor& codes, const at::Tensor& out, const F5& f) {
  const int64_t n = codes.numel();
  if (n == 0) return;
  const Geometry& g = geometry_of(codes);
  const std::string name = std::string("cpd_decode_") + code_suffix(codes);
  Args a;
  a.tensor(codes).tensor(out).add<long long>(n).fmt(f);
  run(codes, "cast.cu", name.c_str(), g.blocks(n, g.threads), g.threads, a);
}

void arith(int op, const at::Tensor& x, const at::Tensor& y, const at::Tensor& z, const at::Tensor& out, const F5& f,
           int mode, bool saturate, int sr_bits, uint64_t seed, uint64_t offset) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Geometry& g = geometry_of(x);
  Args a;
  a.add<int>(op).tensor(x).tensor(y).tensor(z).tensor(out).add<long long>(n).fmt(f).add<int>(mode);
  a.add<int>(saturate).add<int>(sr_bits).seed(seed, offset);
  run(x, "cast.cu", "cpd_arith", g.blocks(n, g.threads), g.threads, a);
}

void matmul(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out, bool has_mul, const F5& mul,
            const F5& acc, bool kahan, int block, int mode, bool saturate, int sr_bits, uint64_t seed,
            uint64_t offset) {
  if (out.numel() == 0) return;
  const int64_t B = x.size(0), M = x.size(1), K = x.size(2), N = y.size(2);
  const Geometry& g = geometry_of(x);
  const F5& m = has_mul ? mul : acc;
  const Family fam = matmul_family(has_mul, m, acc, kahan, block, mode, saturate, sr_bits);
  const int side = fam.name ? fam.side : kGenericTile;
  const int64_t tiles = B * ((M + side - 1) / side) * ((N + side - 1) / side);
  Args a;
  a.tensor(x).tensor(y).tensor(out).add<long long>(B).add<long long>(M).add<long long>(K).add<long long>(N);
  a.add<int>(has_mul).fmt(m).fmt(acc).add<int>(kahan).add<int>(block).add<int>(mode).add<int>(saturate);
  a.add<int>(sr_bits).seed(seed, offset);
  run(x, "matmul.cu", fam.name ? fam.name : "cpd_matmul_tiled", g.blocks(tiles, 1), kMatmulThreads, a);
}

// ---------------------------------------------------------------------------- cpd.mx (mx.cu)
namespace {
constexpr int64_t kMxBatch = 4;  // cuda/kernels/mx.cu CPD_MX_BATCH: consecutive blocks per group and step

// The lanes of the group that works one block (mx.cu's mx_lanes): the block size rounded up to
// a power of two, at most 32.
int mx_lanes(int64_t block) {
  int g = 1;
  while (g < block && g < 32) g <<= 1;
  return g;
}

// rows * nblocks blocks in batches of kMxBatch per group: the geometry's threads per block, but at
// least one whole group.
struct MxShape {
  unsigned grid, threads;
};
MxShape mx_shape(const Geometry& g, int64_t blocks, int64_t block) {
  const int lanes = mx_lanes(block);
  const int threads = std::max(g.threads, lanes);
  return {g.blocks((blocks + kMxBatch - 1) / kMxBatch, threads / lanes), unsigned(threads)};
}

void mx_format_args(Args& a, const MxFormat& f) {
  a.fmt(f.el).fmt(f.sc).add<int>(f.rule).add<int>(f.is_int).add<float>(f.t);
}
}  // namespace

std::vector<int64_t> mx_launch_shape(int64_t blocks, int64_t block_size, int64_t threads, int64_t max_blocks) {
  TORCH_CHECK(block_size >= 1 && threads >= 1 && threads <= kMaxThreads, "cpd: bad mx launch shape arguments");
  Geometry g;
  g.threads = int(threads);
  g.max_blocks = max_blocks;
  const MxShape s = mx_shape(g, blocks, block_size);
  return {int64_t(s.grid), int64_t(s.threads), mx_lanes(block_size)};
}

void mx_cast(const at::Tensor& x, const at::Tensor& y, const MxFormat& f, int mode, uint64_t seed, uint64_t offset) {
  const int64_t rows = x.size(0), n = x.size(1);
  if (rows * n == 0) return;
  const MxShape s = mx_shape(geometry_of(x), rows * ((n + f.block - 1) / f.block), f.block);
  Args a;
  a.tensor(x).tensor(y).add<long long>(rows).add<long long>(n).add<long long>(f.block);
  mx_format_args(a, f);
  a.add<int>(mode).seed(seed, offset);
  run(x, "mx.cu", "cpd_mx_cast", s.grid, s.threads, a);
}

void mx_encode(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scodes, const MxFormat& f, int mode,
               uint64_t seed, uint64_t offset, int pack) {
  const int64_t rows = x.size(0), n = x.size(1);
  if (rows * n == 0) return;
  const MxShape s = mx_shape(geometry_of(x), rows * ((n + f.block - 1) / f.block), f.block);
  Args a;
  a.tensor(x).tensor(codes).tensor(scodes).add<long long>(rows).add<long long>(n).add<long long>(f.block);
  mx_format_args(a, f);
  a.add<int>(mode).seed(seed, offset).add<int>(pack).add<long long>(codes.size(1));
  run(x, "mx.cu", "cpd_mx_encode", s.grid, s.threads, a);
}

void mx_decode(const at::Tensor& codes, const at::Tensor& scodes, const at::Tensor& y, const MxFormat& f, int pack) {
  const int64_t rows = y.size(0), n = y.size(1);
  if (rows * n == 0) return;
  const MxShape s = mx_shape(geometry_of(codes), rows * scodes.size(1), f.block);
  Args a;
  a.tensor(codes).tensor(scodes).tensor(y).add<long long>(rows).add<long long>(n).add<long long>(f.block);
  mx_format_args(a, f);
  a.add<int>(pack).add<long long>(codes.size(1));
  run(codes, "mx.cu", "cpd_mx_decode", s.grid, s.threads, a);
}

// ---------------------------------------------------------------------------- the wire (hop.cu)
namespace {
constexpr int kWireThreads = 256;  // one thread per group of 8 elements; the kernels' loops are grid-stride

unsigned wire_blocks(int64_t elements) {
  const int64_t groups = (elements + 7) / 8, need = std::max<int64_t>(1, (groups + kWireThreads - 1) / kWireThreads);
  TORCH_CHECK(need <= 0x7fffffff, "cpd: a launch of ", need, " blocks");
  return static_cast<unsigned>(need);
}

// segments (k, 3) int64 rows (offset, length, scale exponent) -> the rows and the prefix sums of
// the lengths (k + 1) on `device` (a small copy up per call, no sync), k and the total length.
struct WireSegs {
  at::Tensor rows, starts;
  int64_t k = 0, total = 0;
};
WireSegs wire_segs(const at::Tensor& segs, const c10::Device& device) {
  const at::Tensor r = segs.to(at::kCPU).to(at::kLong).reshape({-1, 3}).contiguous();
  WireSegs w;
  w.k = r.size(0);
  at::Tensor starts = at::empty({w.k + 1}, r.options());
  int64_t* sp = starts.data_ptr<int64_t>();
  const int64_t* rp = r.data_ptr<int64_t>();
  sp[0] = 0;
  for (int64_t i = 0; i < w.k; ++i) sp[i + 1] = sp[i] + rp[3 * i + 1];
  w.total = sp[w.k];
  w.rows = r.to(device);
  w.starts = starts.to(device);
  return w;
}
}  // namespace

void wire_encode(const at::Tensor& x, const at::Tensor& segs, const at::Tensor& out, const F5& f, int mode,
                 bool saturate, int bits, bool raw32) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && out.scalar_type() == at::kByte &&
              out.is_contiguous() && out.device() == x.device(),
              "cpd_wire: x must be contiguous float32 and out contiguous uint8 on x's device");
  const WireSegs w = wire_segs(segs, x.device());
  Args a;
  a.tensor(x).tensor(w.rows).tensor(w.starts).add<int>(int(w.k)).add<long long>(w.total).tensor(out).fmt(f);
  a.add<int>(mode).add<int>(saturate).add<int>(bits).add<int>(raw32);
  run(x, "hop.cu", "cpd_wire_encode", wire_blocks(w.total), kWireThreads, a);
}

void wire_hop(const at::Tensor& recv, const at::Tensor& recv_c, const at::Tensor& acc, const at::Tensor& acc_c,
              int64_t n, const F5& f, int mode, bool saturate, int bits, bool raw32, bool kahan, bool carry,
              bool sequential) {
  TORCH_CHECK(recv.scalar_type() == at::kByte && acc.scalar_type() == at::kByte && recv.device() == acc.device(),
              "cpd_wire: recv and acc must be uint8 tensors on one device");
  const bool has_recv_c = recv_c.defined() && recv_c.numel() > 0;
  const bool has_acc_c = acc_c.defined() && acc_c.numel() > 0;
  Args a;  // an absent operand: acc's pointer, which the kernel never reads when its flag is off
  a.tensor(recv).tensor(has_recv_c ? recv_c : acc).tensor(acc).tensor(has_acc_c ? acc_c : acc);
  a.add<long long>(n).fmt(f).add<int>(mode).add<int>(saturate).add<int>(bits).add<int>(raw32).add<int>(kahan);
  a.add<int>(has_recv_c).add<int>(carry).add<int>(sequential ? 1 : 0);
  run(acc, "hop.cu", "cpd_wire_hop", wire_blocks(n), kWireThreads, a);
}

void wire_decode(const at::Tensor& data, const at::Tensor& segs, const at::Tensor& out, const F5& f, int bits,
                 bool raw32, float inv) {
  TORCH_CHECK(data.scalar_type() == at::kByte && out.scalar_type() == at::kFloat && out.is_contiguous() &&
              data.device() == out.device(), "cpd_wire: data must be uint8 and out contiguous float32 on one device");
  const WireSegs w = wire_segs(segs, out.device());
  Args a;
  a.tensor(data).tensor(w.rows).tensor(w.starts).add<int>(int(w.k)).add<long long>(w.total).tensor(out).fmt(f);
  a.add<int>(bits).add<int>(raw32).add<float>(inv);
  run(out, "hop.cu", "cpd_wire_decode", wire_blocks(w.total), kWireThreads, a);
}

// ---------------------------------------------------------------------------- the fused dot (fused_dot.cu)
namespace {
constexpr int kFdThreads = 256;  // fused_dot.cu CPD_FD_THREADS: the per-output kernel and the tiled ones
constexpr int kFdTile = 64;      // the tiled kernels' output tile side
// The tiled kernels' shapes (fused_dot.cu FdShape, CPD_FD_TILED_SHAPES; cpd/_tensor_core_op.py
// TILE_SHAPES): suffix, stages, K slice depth (groups of 16 or 32; 16 / L times as many of 4 or 8).
struct FdShape {
  const char* suffix;
  int stages, depth;
};
constexpr FdShape kFdShapes[] = {{"s1", 1, 1}, {"s2", 2, 1}, {"s2g2", 2, 2}};
int g_fd_host_shape = 0;  // the shim's tile shape (an index of kFdShapes; guarded by g_mutex)

int fd_shape_index(const std::string& shape) {
  for (int i = 0; i < 3; ++i)
    if (shape == kFdShapes[i].suffix) return i;
  TORCH_CHECK(false, "cpd: shape=", shape, "; allowed s1, s2, s2g2");
}

// Whether an algorithm's tiled kernels stage raw elements (the chunk16 and AMD pairwise families;
// _tensor_core_op.raw_layout).
bool fd_raw_layout(int algo) { return algo == cpd::FD_NV_CHUNK16 || algo == cpd::FD_AMD_PAIRWISE; }

// fused_dot.cu FdShape<L, S, G>::BYTES, or FdC16Shape<S, KS>::BYTES for the raw-element families
// (_tensor_core_op.tile_smem).
unsigned fd_tile_smem(int group, const FdShape& sh, bool raw) {
  if (raw) return unsigned(sh.stages * (32 * sh.depth * (68 + 64) + 2 * 64) * 4);
  const int groups = group >= 16 ? sh.depth : sh.depth * (16 / group), ks = group * groups;
  return unsigned(4 * ks + 4 * groups + (sh.stages > 1 ? 2 * sh.stages * ks : 0)) * 64 * 4;
}

// Whether shape i is built for the family of `group` (block: 0 without block scales; raw:
// fd_raw_layout) by a compile for a GPU of compute capability `major` (fused_dot.cu
// CPD_FD_ONE_STAGE / CPD_FD_TWO_STAGES), or by the host shim (major < 0): s1 and s2g2, s2 for L 32
// without scales only; before sm_80 s1 only, from sm_80 no s1 but the scaled L 32 family's
// (_tensor_core_op.shapes_of).
bool fd_shape_built(int i, int group, int64_t block, bool raw, int major = -1) {
  const bool l32 = group == 32 && !raw;
  if (i == 1 && !(l32 && block == 0)) return false;
  if (major < 0) return true;
  if (major < 8) return i == 0;
  return i != 0 || (l32 && block > 0);
}

// _tensor_core_op.tile_shape: among the shapes built for the GPU, two stages where cp.async exists
// (sm_80+), slices of twice the depth where they fit in the opt-in shared memory, else one; one
// stage before sm_80; -1 where none fits (the per-output kernel).
int fd_tile_shape(int major, int smem_optin, int group, int64_t block, bool raw) {
  for (int i : {2, 1, 0})
    if (fd_shape_built(i, group, block, raw, major) && fd_tile_smem(group, kFdShapes[i], raw) <= unsigned(smem_optin))
      return i;
  return -1;
}

// The tiled family (name without the shape suffix) by fused_dot_tiled.h's own predicates, or "";
// block: 0 without block scales, else the elements per scale.
std::string fd_tiled_family(const FdParams& p, int64_t block) {
  const cpd::FusedDotSpec s = cpd::make_fused_dot_spec(p.group, p.frac, p.out, p.a_emin, p.b_emin, p.zero_exp,
                                                       p.algo, p.ftz);
  if (block < 0 || block > 0x7fffffff) return "";
  if (s.algo == cpd::FD_NV_CHUNK16) return cpd::fd_c16_applies(s, p.a_man, p.b_man, int(block)) ? "cpd_fused_dot_tiled_c16" : "";
  if (s.algo == cpd::FD_AMD_PAIRWISE)
    return cpd::fd_amdp_applies(s, int(block)) ? (s.ftz ? "cpd_fused_dot_tiled_amdpz" : "cpd_fused_dot_tiled_amdp") : "";
  if (s.algo == cpd::FD_AMD_RD || s.algo == cpd::FD_AMD_RD_FP8)
    return cpd::fd_amdrd_applies(s, p.a_man, p.b_man, int(block)) || cpd::fd_amdrd8_applies(s, p.a_man, p.b_man, int(block))
               ? "cpd_fused_dot_tiled_l" + std::to_string(p.group) + "a"
               : "";
  if (!cpd::fd_tiled_applies(s, p.a_man, p.b_man, int(block))) return "";
  return "cpd_fused_dot_tiled_l" + std::to_string(p.group) + (cpd::fd_tiled_wide(s) ? "w" : "") + (block ? "s" : "");
}

// The shape a request for shape i runs for a family on the shim: i where built, else s2g2 (the
// shim's host shape s2 on a family built without it).
int fd_built_shape(int i, int group, int64_t block, bool raw) { return fd_shape_built(i, group, block, raw) ? i : 2; }
}  // namespace

std::string fused_dot_kernel(const FdParams& p, int64_t block, const std::string& shape) {
  const std::string family = fd_tiled_family(p, block);
  const int i = fd_built_shape(fd_shape_index(shape), p.group, block, fd_raw_layout(p.algo));
  return family.empty() ? "cpd_fused_dot_matmul" : family + "_" + kFdShapes[i].suffix;
}

std::string fused_dot_tile_shape(int64_t major, int64_t smem_optin, int64_t group, int64_t block, int64_t algo) {
  const int i = fd_tile_shape(int(major), int(smem_optin), int(group), block, fd_raw_layout(int(algo)));
  return i < 0 ? "" : kFdShapes[i].suffix;
}

void set_fused_dot_host_shape(const std::string& shape) {
  const int i = fd_shape_index(shape);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_fd_host_shape = i;
}

void fused_dot(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
               const at::Tensor& y, int64_t block, int64_t s_emin, const FdParams& p) {
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  if (y.numel() == 0) return;
  const bool scaled = sa.numel() > 0;
  const Geometry& g = geometry_of(a);
  const std::string family = fd_tiled_family(p, scaled ? block : 0);
  const bool raw = fd_raw_layout(p.algo);
  int shape = -1;               // the tiled kernel's shape (-1: the per-output kernel)
  int64_t most = g.max_blocks;  // the shim's (<= 0: none)
  if (!family.empty() && a.is_cuda()) {
    const DeviceState& d = device_state(a.device().index());
    shape = fd_tile_shape(d.major, d.smem_optin, p.group, scaled ? block : 0, raw);
    most = int64_t(d.sms) * 8;  // _tensor_core_op._cuda_matmul: up to 8 tiled blocks per SM
  } else if (!family.empty()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    shape = fd_built_shape(g_fd_host_shape, p.group, scaled ? block : 0, raw);
  }
  if (shape >= 0) {
    const FdShape& sh = kFdShapes[shape];
    int64_t tiles = B * ((M + kFdTile - 1) / kFdTile) * ((N + kFdTile - 1) / kFdTile);
    if (most > 0 && tiles > most) tiles = most;
    TORCH_CHECK(tiles <= 0x7fffffff, "cpd: a launch of ", tiles, " blocks");
    const std::string name = family + "_" + sh.suffix;
    Args x;
    x.tensor(a).tensor(b).tensor(y).add<const void*>(scaled ? sa.data_ptr() : nullptr);
    x.add<const void*>(scaled ? sb.data_ptr() : nullptr).add<long long>(B).add<long long>(M).add<long long>(K);
    x.add<long long>(N).add<long long>(scaled ? sa.size(-1) : 0).add<int>(scaled ? int(block) : 1);
    x.add<int>(scaled ? int(s_emin) : -127).add<int>(p.group).add<int>(p.frac).add<int>(p.out).add<int>(p.a_emin).add<int>(p.b_emin).add<int>(p.zero_exp);
    x.add<int>(p.algo).add<int>(p.ftz).add<int>(p.a_man).add<int>(p.b_man);
    run(a, "fused_dot.cu", name.c_str(), unsigned(std::max<int64_t>(tiles, 1)), kFdThreads, x,
        fd_tile_smem(p.group, sh, raw));
    return;
  }
  Args x;  // the per-output kernel: one thread per output, grid-stride
  x.tensor(a).tensor(b).tensor(y).add<const void*>(scaled ? sa.data_ptr() : nullptr);
  x.add<const void*>(scaled ? sb.data_ptr() : nullptr).add<long long>(B).add<long long>(M).add<long long>(K);
  x.add<long long>(N).add<long long>(scaled ? sa.size(-1) : 0).add<int>(int(block)).add<int>(int(s_emin));
  x.add<int>(p.group).add<int>(p.frac).add<int>(p.out).add<int>(p.a_emin).add<int>(p.b_emin).add<int>(p.zero_exp);
  x.add<int>(p.algo).add<int>(p.ftz);
  run(a, "fused_dot.cu", "cpd_fused_dot_matmul", g.blocks(y.numel(), kFdThreads), kFdThreads, x);
}

namespace {
std::atomic<bool> g_host_kernels{false};
}  // namespace

void set_host_kernels(bool on) { g_host_kernels.store(on); }
bool host_kernels() { return g_host_kernels.load(std::memory_order_relaxed); }

void set_sources(pybind11::object image, pybind11::object shim) {
  // Never destroyed: the interpreter may be gone when static destructors run.
  if (!g_image) g_image = new pybind11::object();
  if (!g_shim) g_shim = new pybind11::object();
  *g_image = std::move(image);
  *g_shim = std::move(shim);
}

void set_host_geometry(int64_t threads, int64_t max_blocks) {
  TORCH_CHECK(threads >= 1 && threads <= kMaxThreads, "cpd: threads must be in 1..", kMaxThreads, ", got ", threads);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_host.threads = static_cast<int>(threads);
  g_host.max_blocks = max_blocks;
}

}  // namespace cpd_launch
