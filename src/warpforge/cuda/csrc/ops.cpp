// The operator layer of the CUDA backend: schemas (TORCH_LIBRARY), tensor contracts (TORCH_CHECK
// messages that name the argument), the device guard, PyTorch's current stream, and a check of
// every launch. The kernels live in the .cu files behind launch.h; this is the only translation
// unit that sees PyTorch's headers, and it includes the narrow ones (no torch/extension.h, no
// pybind11: the library is loaded with torch.ops.load_library).
//
// Fake (meta) implementations and autograd formulas are registered from Python
// (warpforge/cuda/_register.py) when the library is loaded.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>
#include <utility>

#include "launch.h"

namespace {

using at::Tensor;

// Error messages are built from strings only. Numbers and shapes are formatted here with
// std::to_string: streaming an integer into an ostream inside this library (TORCH_CHECK's
// c10::str) crashed in std::num_put on the GPU image -- the extension and the process resolved
// different libstdc++ locale facets (seen 2026-11-22, H100 image, torch 2.11: SIGSEGV in
// basic_ostream::_M_insert<long>).
std::string num(int64_t v) { return std::to_string(v); }

std::string dims(c10::IntArrayRef a) {
  std::string s = "(";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + (a.size() == 1 ? ",)" : ")");
}

std::string dev(const Tensor& t) { return t.device().str(); }
const char* dtype_name(c10::ScalarType st) { return c10::toString(st); }

void check_cuda(const Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.defined(), "warpforge_cuda::", op, ": '", arg, "' is undefined");
  TORCH_CHECK(t.is_cuda(), "warpforge_cuda::", op, ": '", arg, "' must be a CUDA tensor; got one on ", dev(t));
}

void check_same_device(const Tensor& t, const Tensor& ref, const char* op, const char* arg, const char* ref_arg) {
  TORCH_CHECK(t.device() == ref.device(), "warpforge_cuda::", op, ": '", arg, "' is on ", dev(t), " but '",
              ref_arg, "' is on ", dev(ref), "; expected the same device");
}

wf::DType dtype_of(c10::ScalarType st, const char* op, const char* arg) {
  switch (st) {
    case at::kFloat: return wf::DType::f32;
    case at::kHalf: return wf::DType::f16;
    case at::kBFloat16: return wf::DType::bf16;
    default:
      TORCH_CHECK(false, "warpforge_cuda::", op, ": '", arg, "' has dtype ", dtype_name(st),
                  "; expected float32, float16 or bfloat16");
  }
}

// (M, N) rows with unit column stride; any row stride.
void check_rows(const Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.dim() == 2, "warpforge_cuda::", op, ": '", arg, "' must be 2-D (rows, columns); got shape ",
              dims(t.sizes()));
  TORCH_CHECK(t.size(1) <= 1 || t.stride(1) == 1, "warpforge_cuda::", op, ": '", arg,
              "' must have unit stride along its last dim; got strides ", dims(t.strides()),
              " (the Python wrapper copies such inputs: call warpforge's public function)");
}

int sm_count(c10::DeviceIndex device) {
  static int cache[64] = {0};
  if (device < 0 || device >= 64) return 132;
  if (cache[device] == 0) {
    int v = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device));
    cache[device] = v;
  }
  return cache[device];
}

// ---- add ------------------------------------------------------------------------------------
Tensor add(const Tensor& input, const Tensor& other, double alpha, c10::string_view variant) {
  check_cuda(input, "add", "input");
  check_cuda(other, "add", "other");
  check_same_device(other, input, "add", "other", "input");
  const wf::DType dt = dtype_of(input.scalar_type(), "add", "input");
  TORCH_CHECK(other.scalar_type() == input.scalar_type(), "warpforge_cuda::add: 'other' has dtype ",
              dtype_name(other.scalar_type()), " but 'input' has ", dtype_name(input.scalar_type()),
              "; expected the same dtype");
  TORCH_CHECK(other.sizes() == input.sizes(), "warpforge_cuda::add: 'other' has shape ", dims(other.sizes()),
              " but 'input' has shape ", dims(input.sizes()), "; expected the same shape");
  TORCH_CHECK(input.is_contiguous() && other.is_contiguous(),
              "warpforge_cuda::add: 'input' and 'other' must be contiguous (warpforge.add copies them first)");
  TORCH_CHECK(variant == "naive" || variant == "vectorized", "warpforge_cuda::add: 'variant' is '",
              std::string(variant), "'; expected 'naive' or 'vectorized'");
  const c10::cuda::CUDAGuard guard(input.device());
  Tensor out = at::empty(input.sizes(), input.options());
  const int64_t n = input.numel();
  if (n == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const cudaError_t err = variant == "naive"
      ? wf::add_naive(dt, input.data_ptr(), other.data_ptr(), out.data_ptr(), n, static_cast<float>(alpha), stream)
      : wf::add_vectorized(dt, input.data_ptr(), other.data_ptr(), out.data_ptr(), n, static_cast<float>(alpha),
                           sm_count(input.device().index()), stream);
  C10_CUDA_CHECK(err);
  return out;
}

// ---- row reductions ---------------------------------------------------------------------------
Tensor reduce(const Tensor& input, c10::ScalarType out_dtype, bool is_max, const char* op) {
  check_cuda(input, op, "input");
  check_rows(input, op, "input");
  const wf::DType in_dt = dtype_of(input.scalar_type(), op, "input");
  const wf::DType out_dt = dtype_of(out_dtype, op, "dtype");
  const int64_t m = input.size(0), n = input.size(1);
  TORCH_CHECK(n > 0 || m == 0, "warpforge_cuda::", op, ": 'input' has 0 columns; expected at least 1 to reduce");
  const c10::cuda::CUDAGuard guard(input.device());
  Tensor out = at::empty({m}, input.options().dtype(out_dtype));
  if (m == 0) return out;
  const int sms = sm_count(input.device().index());
  const int64_t work_n = wf::reduce_workspace_floats(in_dt, m, n, sms);
  Tensor work = work_n > 0 ? at::empty({work_n}, input.options().dtype(at::kFloat)) : Tensor();
  C10_CUDA_CHECK(wf::reduce_rows(in_dt, out_dt, input.data_ptr(), out.data_ptr(),
                                 work_n > 0 ? work.data_ptr<float>() : nullptr, m, n, input.stride(0), is_max, sms,
                                 c10::cuda::getCurrentCUDAStream()));
  return out;
}

Tensor sum(const Tensor& input, c10::ScalarType dtype) { return reduce(input, dtype, false, "sum"); }
Tensor amax(const Tensor& input) { return reduce(input, input.scalar_type(), true, "amax"); }

// Probe-only: the reductions' launch knobs (launch.h), [deep, chunks, threads, warp_row_max, persistent].
void reduce_tuning(c10::IntArrayRef config) {
  TORCH_CHECK(config.size() == 5, "warpforge_cuda::reduce_tuning: 'config' must be [deep, chunks, threads, "
              "warp_row_max, persistent]; got ", num(config.size()), " values");
  TORCH_CHECK(config[0] >= 0 && config[0] <= 2 && config[1] >= 0 && config[2] >= 0 && config[2] <= 512 &&
              config[2] % 32 == 0 && config[3] >= 0 && config[4] >= 0 && config[4] <= 1,
              "warpforge_cuda::reduce_tuning: 'config' out of range");
  wf::set_reduce_tuning({static_cast<int>(config[0]), static_cast<int>(config[1]), static_cast<int>(config[2]),
                         static_cast<int>(config[3]), static_cast<int>(config[4])});
}

// ---- softmax -----------------------------------------------------------------------------------
wf::RowConfig row_config(c10::IntArrayRef cfg, const char* op) {
  TORCH_CHECK(cfg.size() == 4, "warpforge_cuda::", op,
              ": 'config' must be [threads, vectors per thread, cluster, rows per block]; got ", num(cfg.size()),
              " values");
  return {static_cast<int>(cfg[0]), static_cast<int>(cfg[1]), static_cast<int>(cfg[2]), static_cast<int>(cfg[3])};
}

void check_config(wf::DType dt, int64_t n, const wf::RowConfig& cfg, bool backward, const char* op) {
  const char* why = wf::softmax_config_error(dt, n, cfg, backward);
  TORCH_CHECK(why == nullptr, "warpforge_cuda::", op, ": launch shape 'config' [", num(cfg.threads), ", ", num(cfg.vpt),
              ", ", num(cfg.cluster), ", ", num(cfg.rows_per_block), "] cannot run rows of ", num(n), " elements: ",
              why ? why : "");
}

Tensor softmax(const Tensor& input, bool log, c10::IntArrayRef config) {
  check_cuda(input, "softmax", "input");
  check_rows(input, "softmax", "input");
  const wf::DType dt = dtype_of(input.scalar_type(), "softmax", "input");
  const wf::RowConfig cfg = row_config(config, "softmax");
  const c10::cuda::CUDAGuard guard(input.device());
  Tensor out = at::empty(input.sizes(), input.options());
  const int64_t m = input.size(0), n = input.size(1);
  if (m == 0 || n == 0) return out;
  check_config(dt, n, cfg, false, "softmax");
  C10_CUDA_CHECK(wf::softmax_fwd(dt, input.data_ptr(), out.data_ptr(), m, n, input.stride(0), out.stride(0), log, cfg,
                                 c10::cuda::getCurrentCUDAStream()));
  return out;
}

Tensor softmax_backward(const Tensor& output, const Tensor& grad_output, bool log, c10::IntArrayRef config) {
  const char* op = "softmax_backward";
  check_cuda(output, op, "output");
  check_cuda(grad_output, op, "grad_output");
  check_same_device(grad_output, output, op, "grad_output", "output");
  check_rows(output, op, "output");
  check_rows(grad_output, op, "grad_output");
  const wf::DType dt = dtype_of(output.scalar_type(), op, "output");
  TORCH_CHECK(grad_output.scalar_type() == output.scalar_type(), "warpforge_cuda::", op, ": 'grad_output' has dtype ",
              dtype_name(grad_output.scalar_type()), " but 'output' has ", dtype_name(output.scalar_type()),
              "; expected the same dtype");
  TORCH_CHECK(grad_output.sizes() == output.sizes(), "warpforge_cuda::", op, ": 'grad_output' has shape ",
              dims(grad_output.sizes()), " but 'output' has shape ", dims(output.sizes()), "; expected the same shape");
  const wf::RowConfig cfg = row_config(config, op);
  const c10::cuda::CUDAGuard guard(output.device());
  Tensor dx = at::empty(output.sizes(), output.options());
  const int64_t m = output.size(0), n = output.size(1);
  if (m == 0 || n == 0) return dx;
  check_config(dt, n, cfg, true, op);
  C10_CUDA_CHECK(wf::softmax_bwd(dt, output.data_ptr(), grad_output.data_ptr(), dx.data_ptr(), m, n, output.stride(0),
                                 grad_output.stride(0), dx.stride(0), log, cfg, c10::cuda::getCurrentCUDAStream()));
  return dx;
}

// ---- matmul ------------------------------------------------------------------------------------
wf::MatmulVariant matmul_variant(c10::string_view v) {
  using V = wf::MatmulVariant;
  // The rungs, then the tile configurations of the tensor-core rungs, timed side by side ("mma" and
  // "mma_tma" run the default one of each).
  static constexpr std::pair<const char*, V> kNames[] = {
      {"naive", V::naive},
      {"tiled", V::tiled},
      {"regblock", V::regblock},
      {"mma", V::mma},
      {"mma_128x256x32_s4", V::mma_128x256x32_s4},
      {"mma_128x256x64_s3", V::mma_128x256x64_s3},
      {"mma_256x128x32_s4", V::mma_256x128x32_s4},
      {"mma_128x128x32_s4", V::mma_128x128x32_s4},
      {"mma_128x128x64_s3", V::mma_128x128x64_s3},
      {"mma_128x256x32_s4_sb", V::mma_128x256x32_s4_sb},
      {"mma_tma", V::mma_tma},
      {"mma_tma_128x128x32_s4", V::mma_tma_128x128x32_s4},
      {"mma_tma_128x256x64_s3", V::mma_tma_128x256x64_s3},
  };
  for (const auto& [name, variant] : kNames)
    if (v == name) return variant;
  TORCH_CHECK(false, "warpforge_cuda::matmul: 'variant' is '", std::string(v),
              "'; expected 'naive', 'tiled', 'regblock', 'mma', 'mma_tma' or 'mma_<config>' / 'mma_tma_<config>' (see matmul.cu, mma_tma.cu)");
}

Tensor matmul(const Tensor& a, const Tensor& b, c10::string_view variant) {
  check_cuda(a, "matmul", "a");
  check_cuda(b, "matmul", "b");
  check_same_device(b, a, "matmul", "b", "a");
  const wf::MatmulVariant v = matmul_variant(variant);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "warpforge_cuda::matmul: 'a' and 'b' must be 2-D; got shapes ",
              dims(a.sizes()), " and ", dims(b.sizes()));
  TORCH_CHECK(a.size(1) == b.size(0), "warpforge_cuda::matmul: 'a' is ", dims(a.sizes()), " and 'b' is ", dims(b.sizes()),
              "; expected a (M, K) and b (K, N)");
  const wf::DType dt = dtype_of(a.scalar_type(), "matmul", "a");
  TORCH_CHECK(b.scalar_type() == a.scalar_type(), "warpforge_cuda::matmul: 'b' has dtype ",
              dtype_name(b.scalar_type()), " but 'a' has ", dtype_name(a.scalar_type()), "; expected the same dtype");
  TORCH_CHECK((a.size(1) <= 1 || a.stride(1) == 1) && (b.size(1) <= 1 || b.stride(1) == 1),
              "warpforge_cuda::matmul: 'a' and 'b' must be row-major (unit stride along the last dim); got strides ",
              dims(a.strides()), " and ", dims(b.strides()), " (warpforge.matmul copies such operands)");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const c10::cuda::CUDAGuard guard(a.device());
  Tensor c = at::empty({m, n}, a.options());
  if (m == 0 || n == 0) return c;
  if (k == 0) return c.zero_();
  const int64_t lda = a.size(0) > 1 ? a.stride(0) : k, ldb = b.size(0) > 1 ? b.stride(0) : n;
  const char* why = wf::matmul_unsupported(v, dt, a.data_ptr(), b.data_ptr(), c.data_ptr(), lda, ldb, n);
  TORCH_CHECK(why == nullptr, "warpforge_cuda::matmul: variant '", std::string(variant), "' cannot run this problem: ",
              why ? why : "");
  C10_CUDA_CHECK(wf::matmul(v, dt, a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, lda, ldb, n,
                            sm_count(a.device().index()), c10::cuda::getCurrentCUDAStream()));
  return c;
}

// The cluster norm kernels' shared argument rules (csrc/norm.cu): saved statistics are contiguous
// fp32 vectors of m; config is [cluster, threads, vectors a thread, rows a group, stages];
// rows start on 16-byte boundaries.
void check_row_stats(const Tensor& t, const Tensor& input, int64_t m, const char* op, const char* name) {
  check_cuda(t, op, name);
  check_same_device(t, input, op, name, "input");
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == m && t.is_contiguous(),
              "warpforge_cuda::", op, ": '", name, "' must be a contiguous float32 vector of ", num(m),
              " elements; got ", dtype_name(t.scalar_type()), " ", dims(t.sizes()));
}

wf::NormClusterConfig norm_cluster_config(c10::IntArrayRef config, const char* op) {
  TORCH_CHECK(config.size() == 5 || config.size() == 6, "warpforge_cuda::", op,
              ": 'config' must be [cluster, threads, vectors per thread, rows a group, stages] and optionally "
              "blocks an SM; got ", num(config.size()), " values");
  return {static_cast<int>(config[0]), static_cast<int>(config[1]), static_cast<int>(config[2]),
          static_cast<int>(config[3]), static_cast<int>(config[4]), config.size() == 6 ? static_cast<int>(config[5]) : 1};
}

void check_launch_shape(const char* why, const wf::NormClusterConfig& cfg, int64_t n, const char* op) {
  TORCH_CHECK(why == nullptr, "warpforge_cuda::", op, ": launch shape 'config' [", num(cfg.cluster), ", ",
              num(cfg.threads), ", ", num(cfg.vpt), ", ", num(cfg.rows), ", ", num(cfg.stages),
              cfg.per_sm != 1 ? ", " + num(cfg.per_sm) : std::string(), "] cannot run rows of ", num(n),
              " elements: ", why ? why : "");
}

// A 2-D tensor of the input's dtype and shape (out, grad_output, dx) on its device, rows dense.
void check_like_input(const Tensor& t, const Tensor& input, const char* op, const char* name) {
  check_cuda(t, op, name);
  check_same_device(t, input, op, name, "input");
  check_rows(t, op, name);
  TORCH_CHECK(t.scalar_type() == input.scalar_type() && t.size(0) == input.size(0) && t.size(1) == input.size(1),
              "warpforge_cuda::", op, ": '", name, "' must have the input's dtype and shape ", dims(input.sizes()),
              "; got ", dtype_name(t.scalar_type()), " ", dims(t.sizes()));
}

// A parameter vector (weight, bias): the input's dtype and device, contiguous, n elements.
void check_param(const Tensor& p, const Tensor& input, int64_t n, const char* op, const char* name) {
  check_cuda(p, op, name);
  check_same_device(p, input, op, name, "input");
  TORCH_CHECK(p.scalar_type() == input.scalar_type(), "warpforge_cuda::", op, ": '", name, "' has dtype ",
              dtype_name(p.scalar_type()), " but 'input' has ", dtype_name(input.scalar_type()),
              "; expected the same dtype");
  TORCH_CHECK(p.dim() == 1 && p.size(0) == n && p.is_contiguous(), "warpforge_cuda::", op, ": '", name,
              "' must be a contiguous vector of ", num(n), " elements; got shape ", dims(p.sizes()));
}

// An optional tensor argument as a pointer: null when it is absent or undefined.
const Tensor* present(const c10::optional<Tensor>& t) { return t && t->defined() ? &*t : nullptr; }

// t's base (and, with a row stride, each row) on a 16-byte boundary
bool rows_aligned(const Tensor& t, int64_t stride) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && (stride * t.element_size()) % 16 == 0;
}

// 'input' and 'out' of a cluster-rows kernel (bulk copies in, 16-byte stores out): base and rows
// on 16-byte boundaries
void check_rows_aligned(const Tensor& input, const Tensor& out, const char* op) {
  TORCH_CHECK(rows_aligned(input, input.stride(0)) && rows_aligned(out, out.stride(0)), "warpforge_cuda::", op,
              ": 'input' and 'out' rows must start on 16-byte boundaries (aligned base, row stride a multiple "
              "of 16 bytes)");
}

// ---- LayerNorm forward over long rows -----------------------------------------------------------
// Writes out (the normalised rows), mean and rstd, which the caller allocates (warpforge.ops.norms:
// its allocations follow WARPFORGE_POISON); config [cluster, threads, vectors a thread, rows a
// group, stages] (csrc/norm.cu).
void layer_norm_fwd(const Tensor& input, const c10::optional<Tensor>& weight, const c10::optional<Tensor>& bias,
                    double eps, c10::IntArrayRef config, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layer_norm_fwd";
  check_cuda(input, op, "input");
  check_rows(input, op, "input");
  const wf::DType dt = dtype_of(input.scalar_type(), op, "input");
  const int64_t m = input.size(0), n = input.size(1);
  const Tensor* params[2] = {present(weight), present(bias)};
  const char* names[2] = {"weight", "bias"};
  for (int i = 0; i < 2; ++i)
    if (params[i]) check_param(*params[i], input, n, op, names[i]);
  check_like_input(out, input, op, "out");
  check_row_stats(mean, input, m, op, "mean");
  check_row_stats(rstd, input, m, op, "rstd");
  const wf::NormClusterConfig cfg = norm_cluster_config(config, op);
  if (m == 0) return;
  check_launch_shape(wf::layer_norm_cluster_config_error(dt, n, cfg), cfg, n, op);
  check_rows_aligned(input, out, op);
  for (int i = 0; i < 2; ++i)
    TORCH_CHECK(!params[i] || rows_aligned(*params[i], 0), "warpforge_cuda::", op, ": '", names[i],
                "' must start on a 16-byte boundary");
  const c10::cuda::CUDAGuard guard(input.device());
  C10_CUDA_CHECK(wf::layer_norm_fwd_cluster(dt, input.data_ptr(), out.data_ptr(),
                                            params[0] ? params[0]->data_ptr() : nullptr,
                                            params[1] ? params[1]->data_ptr() : nullptr, mean.data_ptr<float>(),
                                            rstd.data_ptr<float>(), m, n, input.stride(0), out.stride(0),
                                            static_cast<float>(eps), cfg, c10::cuda::getCurrentCUDAStream()));
}
// ---- softmax forward over long rows, a row over a cluster with staged groups ----------------------
// Writes out, which the caller allocates (warpforge.ops.softmax: its allocations follow
// WARPFORGE_POISON); config [cluster, threads, vectors a thread, rows a group, stages] and optionally
// blocks an SM (csrc/softmax.cu).
void softmax_fwd_cluster(const Tensor& input, bool log, c10::IntArrayRef config, const Tensor& out) {
  const char* op = "softmax_fwd_cluster";
  check_cuda(input, op, "input");
  check_rows(input, op, "input");
  const wf::DType dt = dtype_of(input.scalar_type(), op, "input");
  const int64_t m = input.size(0), n = input.size(1);
  check_like_input(out, input, op, "out");
  const wf::NormClusterConfig cfg = norm_cluster_config(config, op);
  if (m == 0) return;
  check_launch_shape(wf::softmax_cluster_config_error(dt, n, cfg), cfg, n, op);
  check_rows_aligned(input, out, op);
  const c10::cuda::CUDAGuard guard(input.device());
  C10_CUDA_CHECK(wf::softmax_fwd_cluster(dt, input.data_ptr(), out.data_ptr(), m, n, input.stride(0), out.stride(0),
                                         log, cfg, c10::cuda::getCurrentCUDAStream()));
}

// ---- LayerNorm / RMSNorm backward over long rows ---------------------------------------------------
// Writes dx and the (parts, N) fp32 partial sums of dw and db (either may be absent), all allocated
// by the caller (warpforge.ops.norms, which sums the partial rows); mean is read for LayerNorm only.
// grad_sum (optional, RMSNorm only): add+RMSNorm's gradient of the residual sum, added to dx.
void norm_bwd(const Tensor& input, const Tensor& grad_output, const c10::optional<Tensor>& weight,
              const c10::optional<Tensor>& mean, const Tensor& rstd, double offset, bool rms, c10::IntArrayRef config,
              const Tensor& dx, const c10::optional<Tensor>& dw_part, const c10::optional<Tensor>& db_part,
              const c10::optional<Tensor>& grad_sum) {
  const char* op = "norm_bwd";
  check_cuda(input, op, "input");
  check_rows(input, op, "input");
  const wf::DType dt = dtype_of(input.scalar_type(), op, "input");
  const int64_t m = input.size(0), n = input.size(1);
  check_like_input(grad_output, input, op, "grad_output");
  check_like_input(dx, input, op, "dx");
  const Tensor* ds = present(grad_sum);
  if (ds) check_like_input(*ds, input, op, "grad_sum");
  const Tensor* w = present(weight);
  if (w) check_param(*w, input, n, op, "weight");
  const Tensor* mu = present(mean);
  TORCH_CHECK(rms || mu, "warpforge_cuda::", op, ": LayerNorm's backward (rms=False) needs 'mean'");
  if (mu) check_row_stats(*mu, input, m, op, "mean");
  check_row_stats(rstd, input, m, op, "rstd");
  const Tensor* parts_t[2] = {present(dw_part), present(db_part)};
  const char* part_names[2] = {"dw_part", "db_part"};
  int64_t parts = 0;
  for (int i = 0; i < 2; ++i) {
    if (!parts_t[i]) continue;
    const Tensor& p = *parts_t[i];
    check_cuda(p, op, part_names[i]);
    check_same_device(p, input, op, part_names[i], "input");
    TORCH_CHECK(p.scalar_type() == at::kFloat && p.dim() == 2 && p.size(1) == n && p.size(0) >= 1 &&
                p.is_contiguous() && (parts == 0 || p.size(0) == parts), "warpforge_cuda::", op, ": '",
                part_names[i], "' must be a contiguous float32 (parts, ", num(n),
                ") buffer (both buffers the same parts); got ", dtype_name(p.scalar_type()), " ", dims(p.sizes()));
    parts = p.size(0);
  }
  const wf::NormClusterConfig cfg = norm_cluster_config(config, op);
  if (m == 0) return;
  check_launch_shape(wf::norm_bwd_cluster_config_error(dt, n, cfg, rms, ds != nullptr), cfg, n, op);
  TORCH_CHECK(rows_aligned(input, input.stride(0)) && rows_aligned(grad_output, grad_output.stride(0)) &&
              rows_aligned(dx, dx.stride(0)) && (!w || rows_aligned(*w, 0)) && (!ds || rows_aligned(*ds, ds->stride(0))),
              "warpforge_cuda::", op, ": 'input', 'grad_output', 'dx', 'weight' and 'grad_sum' rows must start on "
              "16-byte boundaries (aligned base, row stride a multiple of 16 bytes)");
  const c10::cuda::CUDAGuard guard(input.device());
  C10_CUDA_CHECK(wf::norm_bwd_cluster(
      dt, rms, input.data_ptr(), grad_output.data_ptr(), ds ? ds->data_ptr() : nullptr, dx.data_ptr(),
      w ? w->data_ptr() : nullptr, mu ? mu->data_ptr<float>() : nullptr, rstd.data_ptr<float>(),
      parts_t[0] ? parts_t[0]->data_ptr<float>() : nullptr, parts_t[1] ? parts_t[1]->data_ptr<float>() : nullptr,
      parts, m, n, input.stride(0), grad_output.stride(0), ds ? ds->stride(0) : 0, dx.stride(0),
      static_cast<float>(offset), cfg, c10::cuda::getCurrentCUDAStream()));
}

}  // namespace

TORCH_LIBRARY(warpforge_cuda, m) {
  m.def("add(Tensor input, Tensor other, float alpha, str variant) -> Tensor");
  m.def("sum(Tensor input, ScalarType dtype) -> Tensor");
  m.def("amax(Tensor input) -> Tensor");
  m.def("softmax(Tensor input, bool log, int[] config) -> Tensor");
  m.def("softmax_backward(Tensor output, Tensor grad_output, bool log, int[] config) -> Tensor");
  m.def("matmul(Tensor a, Tensor b, str variant) -> Tensor");
  m.def("layer_norm_fwd(Tensor input, Tensor? weight, Tensor? bias, float eps, int[] config, Tensor(a!) out, "
        "Tensor(b!) mean, Tensor(c!) rstd) -> ()");
  m.def("norm_bwd(Tensor input, Tensor grad_output, Tensor? weight, Tensor? mean, Tensor rstd, float offset, "
        "bool rms, int[] config, Tensor(a!) dx, Tensor(b!)? dw_part, Tensor(c!)? db_part, Tensor? grad_sum=None) -> ()");
  m.def("softmax_fwd_cluster(Tensor input, bool log, int[] config, Tensor(a!) out) -> ()");
  m.def("reduce_tuning(int[] config) -> ()", &reduce_tuning);
}

namespace {
void register_impls(torch::Library& m) {
  m.impl("add", &add);
  m.impl("sum", &sum);
  m.impl("amax", &amax);
  m.impl("softmax", &softmax);
  m.impl("softmax_backward", &softmax_backward);
  m.impl("matmul", &matmul);
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("norm_bwd", &norm_bwd);
  m.impl("softmax_fwd_cluster", &softmax_fwd_cluster);
}
}  // namespace

TORCH_LIBRARY_IMPL(warpforge_cuda, CUDA, m) { register_impls(m); }

// The same functions for CPU tensors: their first check says the argument must be a CUDA tensor
// (without this, the dispatcher answers first with a generic "could not run ... CPU backend").
TORCH_LIBRARY_IMPL(warpforge_cuda, CPU, m) { register_impls(m); }
