// The eager fast path: small calls of the row ops (and add, RoPE) without Python in the loop.
//
// Why. A decode-sized call (1-64 rows) does ~3-5 us of GPU work, and eager PyTorch issues it in
// 7-26 us. Our Python path -- argument checks, allocations, a Triton launch, an
// autograd.Function -- took 32-95 us forward and 130-530 us forward+backward on an H100 host
// (benchmarks/NOTES.md, item 23): the autograd engine alone hands a Python backward node to its
// device thread and back for ~50 us. This file does what eager PyTorch does instead: a pybind11
// function per op checks its arguments, allocates, launches, and records a C++ autograd node.
//
// What it launches. The same Triton kernels as the Python path, compiled by the same JIT. The
// Python launcher (runtime/launch.py) *offers* every launch of the kernels named below: the
// kernel's CUfunction handle, its launch shape, and the arguments it was launched with. This file
// keys the handle by what Triton specialised the kernel on -- each tensor's dtype and 16-byte
// alignment, each row-count argument's (== 1, % 16, 32-bit) class, and the value of every other
// integer and of the op's flags -- and later launches it with cuLaunchKernel when a call produces
// the same key. The tuning (rows a program, warps, block) is whatever Python chose for that key:
// it is a function of the values in the key, so it is not repeated here. A call whose key was
// never offered returns None, and Python runs it (and offers it): the first call of each shape
// class is a Python call, every later one is not.
//
// Triton's kernel ABI (3.6, driver.py's launcher): one parameter per runtime argument in
// signature order, except those specialised to constants (integers equal to 1, None), then two
// scratch pointers (global and profile; null when the kernel needs none -- kernels that need
// scratch are not taken).
//
// Both paths give the same bits: same kernels, same grids (the weight-gradient grid repeats
// heuristics.grad_grid, three lines, with the programs an SM the offered launch named), same
// reductions after them (ops/norms.py's _grad_sums; tests/runtime/test_fastpath.py).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;
using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// ---------------------------------------------------------------------------------------------
// The kernels this file launches, and what each is keyed on
// ---------------------------------------------------------------------------------------------
enum Kid { SOFTMAX_FWD, SOFTMAX_BWD, NORM_FWD, NORM_BWD, GLU_FWD, GLU_BWD, REDUCE_FWD, AMAX_BWD, GRAD_SUM, ADD_FWD,
            ROPE, N_KIDS };

struct KernelInfo {
  const char* name;                 // the @triton.jit function's name
  std::vector<int> free_ints;       // positions keyed by their Triton class (row counts), not value
  std::vector<int> late;            // positions that follow from the tuning (see find_rows)
  std::vector<const char*> flags;   // constexprs that select the op's semantics, in key order
  const char* rows_name = "ROWS";   // the constexpr giving rows (or tokens) a program covers
  int split_arg = -1;               // the argument giving programs along grid y, kept with the tuning
};

const KernelInfo INFO[N_KIDS] = {
    {"_softmax_fwd_block_kernel", {2}, {}, {"LOG"}},                                   // M
    {"_softmax_bwd_block_kernel", {3}, {}, {"LOG"}},                                   // M
    {"_norm_fwd_block_kernel", {8}, {}, {"RMS", "HAS_W", "HAS_B", "HAS_RES", "LLAMA", "HAS_OFFSET"}},  // M
    // M; rows per program group (a multiple of ROWS: the weight-gradient grid). Late: that and the
    // dw/db buffers, whose shape and dtype follow from the grid (one group: the parameters' dtype)
    {"_norm_bwd_kernel", {10, 16}, {8, 9, 16}, {"RMS", "HAS_W", "HAS_B", "HAS_DSUM", "LLAMA", "FULL_ROW"}},
    {"_glu_fwd_flat_kernel", {3}, {}, {"ACT"}},                                      // elements
    {"_glu_bwd_flat_kernel", {5}, {}, {"ACT"}},                                      // elements
    {"_reduce_fwd_block_kernel", {2}, {}, {"MAX"}},                                  // M
    {"_amax_bwd_block_kernel", {4}, {}, {}},                                         // M
    {"_grad_sum_kernel", {4}, {}, {"HAS_W", "HAS_B"}},                               // partial rows G
    {"_add_fwd_vectorized_kernel", {3}, {}, {}},                                     // elements
    // table rows T and the decode offset keyed by class; late: token blocks a sequence and the
    // head split (grid y), both from ops/rope.py's rope_config (BLOCK_S and the split)
    {"_rope_kernel", {10, 11}, {12, 13}, {"INTERLEAVED", "HALF_TABLE", "HAS_POS", "BACKWARD", "HALF"}, "BLOCK_S", 13},
};

// One runtime argument, as the key and the launch see it.
struct Arg {
  char kind = 'n';   // 't' tensor, 'i' integer, 'f' float, 'n' None
  int64_t i = 0;     // the integer, or the tensor's dtype
  double f = 0;
  uint64_t ptr = 0;
};
Arg T(const Tensor& t) {
  Arg a;
  a.kind = 't';
  a.i = static_cast<int64_t>(t.scalar_type());
  a.ptr = reinterpret_cast<uint64_t>(t.data_ptr());
  return a;
}
Arg I(int64_t v) { Arg a; a.kind = 'i'; a.i = v; return a; }
Arg F(double v) { Arg a; a.kind = 'f'; a.f = v; return a; }

using Key = std::vector<int64_t>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;   // FNV-1a over the words
    for (int64_t x : k) { h ^= static_cast<uint64_t>(x); h *= 1099511628211ull; }
    return static_cast<size_t>(h);
  }
};

// What Triton's JIT specialises an integer on: == 1 (it becomes a constant), % 16, 64 bits.
int64_t int_class(int64_t v) {
  return (v == 1 ? 1 : 0) | (v % 16 == 0 ? 2 : 0) | ((v < INT32_MIN || v > INT32_MAX) ? 4 : 0);
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The key of a launch. ``with_late``: false gives the *tuning key*, which leaves out the late
// arguments (they follow from the tuning it looks up).
Key make_key(Kid kid, int device, const std::vector<int64_t>& flags, const std::vector<Arg>& args, bool with_late) {
  Key k;
  k.reserve(4 + flags.size() + 2 * args.size());
  k.push_back(kid);
  k.push_back(device);
  k.push_back(with_late);
  k.insert(k.end(), flags.begin(), flags.end());
  const KernelInfo& info = INFO[kid];
  for (int p = 0; p < static_cast<int>(args.size()); ++p) {
    const Arg& a = args[p];
    if (!with_late && contains(info.late, p)) { k.push_back(6); k.push_back(0); continue; }
    switch (a.kind) {
      case 't': k.push_back(1); k.push_back(a.i * 2 + (a.ptr % 16 == 0 ? 1 : 0)); break;
      case 'i':
        if (contains(info.free_ints, p)) { k.push_back(2); k.push_back(int_class(a.i)); }
        else { k.push_back(3); k.push_back(a.i); }
        break;
      case 'f': k.push_back(4); k.push_back(0); break;
      default: k.push_back(5); k.push_back(0); break;
    }
  }
  return k;
}

// A compiled kernel ready to launch: its handle, launch shape, and each argument's ABI kind
// ('p' pointer, 'i' int32, 'l' int64, 'f' fp32, 'x' a constant the kernel does not take).
struct Entry {
  void* function = nullptr;
  unsigned threads = 0;
  unsigned shared = 0;
  std::string kinds;
  int64_t rows = 1;   // the ROWS constexpr: rows a program covers
  int64_t per_sm = 0; // the GRID_PER_SM constexpr: programs an SM of a weight-gradient grid
  int64_t block = 1;  // the BLOCK constexpr: elements a program covers (flat kernels)
};

std::mutex table_mutex;
std::unordered_map<Key, Entry, KeyHash> table;        // full key -> kernel
std::unordered_map<Key, std::pair<int64_t, int64_t>, KeyHash> tunings;   // tuning key -> (ROWS, GRID_PER_SM)
int64_t sms = 0;             // the device's SM count (heuristics.grad_grid's target is SMs x GRID_PER_SM)
int64_t grad_sum_max = 0;    // ops/norms.py's GRAD_SUM_MAX: most partial rows _grad_sum_kernel reduces
bool poison = false;       // runtime.POISON: outputs start as NaN, so an unwritten element fails a test
int64_t loop_rows = 0;     // heuristics.reduce_config: sum/amax over at least this many rows of
int64_t loop_min_n = 0;    // at least loop_min_n take the loop kernel, which Python launches
int64_t norm_loop_rows = 0;   // heuristics.norm_fwd_config: norm forwards (no residual) over at least
int64_t norm_loop_min_n = 0;  // this many rows of norm_loop_min_n..norm_loop_max_n take the loop
int64_t norm_loop_max_n = 0;  // kernel, which Python launches
int64_t softmax_loop_min_n = 0;   // heuristics.softmax_config: softmax forwards over norm_loop_rows
int64_t softmax_loop_max_n = -1;  // rows or more of these lengths take the loop kernel (Python's)

Tensor poisoned(Tensor t) {
  if (poison) t.fill_(std::numeric_limits<double>::quiet_NaN());
  return t;
}
Tensor out_like(const Tensor& x) { return poisoned(at::empty_like(x)); }
Tensor out_empty(at::IntArrayRef sizes, const at::TensorOptions& o) { return poisoned(at::empty(sizes, o)); }

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         void*, void**, void**);
LaunchFn cu_launch = nullptr;

const Entry* find(const Key& k) {
  std::lock_guard<std::mutex> g(table_mutex);
  auto it = table.find(k);
  return it == table.end() ? nullptr : &it->second;   // never erased, and nodes do not move
}

bool find_rows(const Key& k, int64_t& rows, int64_t& per_sm) {
  std::lock_guard<std::mutex> g(table_mutex);
  auto it = tunings.find(k);
  if (it == tunings.end()) return false;
  rows = it->second.first;
  per_sm = it->second.second;
  return true;
}

void launch(const Entry& e, const std::vector<Arg>& args, int64_t gx, int64_t gy, int device) {
  TORCH_CHECK(args.size() == e.kinds.size() && args.size() <= 40, "warpforge fast path: argument count mismatch");
  if (gx <= 0 || gy <= 0) return;
  uint64_t words[40];
  void* params[42];
  int n = 0;
  for (size_t p = 0; p < args.size(); ++p) {
    const Arg& a = args[p];
    void* slot = &words[p];
    switch (e.kinds[p]) {
      case 'x': continue;
      case 'p': words[p] = a.ptr; break;
      case 'i': { int32_t v = static_cast<int32_t>(a.i); std::memcpy(slot, &v, 4); break; }
      case 'l': { int64_t v = a.i; std::memcpy(slot, &v, 8); break; }
      case 'f': { float v = static_cast<float>(a.f); std::memcpy(slot, &v, 4); break; }
      default: TORCH_CHECK(false, "warpforge fast path: unknown argument kind");
    }
    params[n++] = slot;
  }
  uint64_t scratch[2] = {0, 0};   // global and profile scratch: none (kernels needing them are not offered)
  params[n++] = &scratch[0];
  params[n++] = &scratch[1];
  void* stream = c10::cuda::getCurrentCUDAStream(device).stream();
  int rc = cu_launch(e.function, static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1, e.threads, 1, 1,
                     e.shared, stream, params, nullptr);
  TORCH_CHECK(rc == 0, "warpforge fast path: cuLaunchKernel failed, CUresult ", std::to_string(rc));
}

// Launch ``kid`` over ceil(m / ROWS) programs; false when no kernel was offered for the key.
bool run_rows(Kid kid, int device, const std::vector<int64_t>& flags, const std::vector<Arg>& args, int64_t m) {
  const Entry* e = find(make_key(kid, device, flags, args, true));
  if (!e) return false;
  launch(*e, args, (m + e->rows - 1) / e->rows, 1, device);
  return true;
}

// Launch a flat elementwise ``kid`` over ceil(total / BLOCK) programs; false when not offered.
bool run_flat(Kid kid, int device, const std::vector<int64_t>& flags, const std::vector<Arg>& args, int64_t total) {
  const Entry* e = find(make_key(kid, device, flags, args, true));
  if (!e) return false;
  launch(*e, args, (total + e->block - 1) / e->block, 1, device);
  return true;
}

// Python functions that compute a backward when its kernel was never offered, and under
// create_graph (grad mode on inside a backward) always: they are the registered backward operators
// (set at load), whose outputs then carry a node that raises on a second backward. A kernel's
// output here would be a constant to autograd, and a double backward would silently lose every
// second-order term through the op.
std::unordered_map<std::string, py::object>* fallbacks = new std::unordered_map<std::string, py::object>();

int64_t fallback_calls = 0;   // how often a backward fell back (tests: a warm shape never should)

py::object fallback(const char* name) {
  ++fallback_calls;
  auto it = fallbacks->find(name);
  TORCH_CHECK(it != fallbacks->end(), "warpforge fast path: no fallback registered for ", name);
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// Argument screening: anything unusual returns None, and the Python path runs it (raising the
// clear error where the input is wrong)
// ---------------------------------------------------------------------------------------------
bool usable(const Tensor& t) {
  if (!t.defined() || !t.is_cuda() || t.dim() < 1 || t.numel() == 0 || !t.is_contiguous()) return false;
  auto st = t.scalar_type();
  return st == at::kFloat || st == at::kHalf || st == at::kBFloat16;
}

bool usable_param(const std::optional<Tensor>& w, const Tensor& x, int64_t n) {
  if (!w.has_value()) return true;
  const Tensor& t = *w;
  return usable(t) && t.dim() == 1 && t.size(0) == n && t.device() == x.device();
}

bool wants_grad(std::initializer_list<const Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor* t : ts)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

int64_t rows_of(const Tensor& x) { return x.numel() / x.size(-1); }

// A usable input whose ``dim`` (torch's convention: negative counts from the end) is its last.
bool over_last_dim(const Tensor& x, int64_t dim) {
  if (!usable(x)) return false;
  return (dim < 0 ? dim + x.dim() : dim) == x.dim() - 1;
}

Tensor grad_or_zeros(const Tensor& g, const Tensor& like) { return g.defined() ? g : at::zeros_like(like); }

// An optional tensor argument: None, or a tensor (anything else: not ours to judge).
bool opt_tensor(py::handle o, std::optional<Tensor>& out) {
  if (o.is_none()) { out.reset(); return true; }
  if (!THPVariable_Check(o.ptr())) return false;
  out = THPVariable_Unpack(o.ptr());
  return true;
}

// A number as ``float(v)`` takes it from an int or a float.
bool num_value(py::handle o, double& out) {
  if (!(PyFloat_Check(o.ptr()) || PyLong_Check(o.ptr()))) return false;
  out = o.cast<double>();
  return std::isfinite(out);      // NaN/inf: the Python path, which raises (checks.check_finite)
}

// ``normalized_shape`` as torch takes it (an int or a one-element sequence) equal to n.
bool shape_is(py::handle s, int64_t n) {
  if (py::isinstance<py::int_>(s)) return s.cast<int64_t>() == n;
  if (!py::isinstance<py::sequence>(s) || py::len(s) != 1) return false;
  py::object v = py::reinterpret_borrow<py::sequence>(s)[0];
  return py::isinstance<py::int_>(v) && v.cast<int64_t>() == n;
}

// eps as the Python path accepts it (a non-negative int or float, not a bool); None: the dtype's
// machine epsilon when ``dtype_default``.
bool eps_value(py::handle e, const Tensor& x, bool dtype_default, double& out) {
  if (e.is_none()) {
    if (!dtype_default) return false;
    switch (x.scalar_type()) {
      case at::kFloat: out = 1.1920928955078125e-07; return true;
      case at::kHalf: out = 0.0009765625; return true;
      default: out = 0.0078125; return true;
    }
  }
  if (PyBool_Check(e.ptr()) || !(PyFloat_Check(e.ptr()) || PyLong_Check(e.ptr()))) return false;
  out = e.cast<double>();
  return out >= 0;
}

// ---------------------------------------------------------------------------------------------
// softmax / log_softmax
// ---------------------------------------------------------------------------------------------
Tensor softmax_bwd(const Tensor& y, Tensor dy, bool log) {
  if (!dy.is_contiguous()) dy = dy.contiguous();
  int64_t n = y.size(-1), m = rows_of(y);
  Tensor dx = out_like(y);
  std::vector<Arg> args{T(y), T(dy), T(dx), I(m), I(n), I(n), I(n), I(n)};
  if (!at::GradMode::is_enabled() && run_rows(SOFTMAX_BWD, y.get_device(), {log}, args, m)) return dx;
  py::gil_scoped_acquire gil;
  return fallback("softmax_bwd")(y, dy, log).cast<Tensor>();
}

struct SoftmaxFn : public torch::autograd::Function<SoftmaxFn> {
  // y: the output the kernel already wrote (passed by pointer: an output, not an input)
  static Tensor forward(AutogradContext* ctx, const Tensor& x, Tensor* y, bool log) {
    ctx->save_for_backward({*y});
    ctx->saved_data["log"] = log;
    return *y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Tensor y = ctx->get_saved_variables()[0];
    return {softmax_bwd(y, grad_or_zeros(grads[0], y), ctx->saved_data["log"].toBool()), Tensor(), Tensor()};
  }
};

py::object softmax(const Tensor& x, int64_t dim, bool log) {
  if (!over_last_dim(x, dim)) return py::none();
  int64_t n = x.size(-1), m = rows_of(x);
  // the block kernel's key does not hold M's value: rows enough for the loop kernel are Python's
  if (n >= softmax_loop_min_n && n <= softmax_loop_max_n && m >= norm_loop_rows) return py::none();
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = out_like(x);
  if (!run_rows(SOFTMAX_FWD, x.get_device(), {log}, {T(x), T(y), I(m), I(n), I(n), I(n)}, m)) return py::none();
  if (!wants_grad({&x})) return py::cast(y);
  return py::cast(SoftmaxFn::apply(x, &y, log));
}

// ---------------------------------------------------------------------------------------------
// RMSNorm, LayerNorm, add + RMSNorm
// ---------------------------------------------------------------------------------------------
struct NormFwd { Tensor y, h, mean, rstd; };

// The norm forward (block kernel); false if no kernel was offered for the key.
bool norm_fwd(const Tensor& x, const Tensor* res, const std::optional<Tensor>& w, const std::optional<Tensor>& b,
              double eps, double offset, bool rms, bool llama, NormFwd& out) {
  int64_t n = x.size(-1), m = rows_of(x);
  // the block kernel's key does not hold M's value: rows enough for the loop kernel are Python's
  if (!res && n >= norm_loop_min_n && n <= norm_loop_max_n && m >= norm_loop_rows) return false;
  auto f32 = x.options().dtype(at::kFloat);
  out.y = out_like(x);
  out.rstd = out_empty({m}, f32);
  if (!rms) out.mean = out_empty({m}, f32);
  if (res) out.h = out_like(x);
  const Tensor& r = res ? *res : x;
  const Tensor& h = res ? out.h : out.y;
  std::vector<Arg> args{T(x), T(r), T(out.y), T(h), T(w ? *w : x), T(b ? *b : x),
                        T(rms ? out.rstd : out.mean), T(out.rstd),
                        I(m), I(n), I(n), I(res ? n : 0), I(n), I(res ? n : 0), F(eps), F(offset)};
  std::vector<int64_t> flags{rms, w.has_value(), b.has_value(), res != nullptr, llama, offset != 0.0};
  return run_rows(NORM_FWD, x.get_device(), flags, args, m);
}

// dx and the dw/db sums over rows (dw in the weight's dtype, x's without one; db in `bias`, the
// bias's dtype, nullopt without a bias), from the block-mode backward kernel, with
// heuristics.grad_grid's partial-sum grid and ops/norms.py's choices after it: one row group stores
// the sums itself; up to grad_sum_max partial rows _grad_sum_kernel (both parameters, summed and
// cast in one launch); more rows ATen's sum(0) and a cast.
struct NormBwd { Tensor dx, dw, db; };

bool norm_bwd(Tensor dy, const Tensor& x, const Tensor* dsum, const Tensor& w, const Tensor& mean,
              const Tensor& rstd, double offset, bool rms, bool llama, std::optional<at::ScalarType> bias,
              NormBwd& out) {
  bool has_b = bias.has_value();
  if (!dy.is_contiguous()) dy = dy.contiguous();
  Tensor ds;
  if (dsum) ds = dsum->is_contiguous() ? *dsum : dsum->contiguous();
  int64_t n = x.size(-1), m = rows_of(x);
  int device = x.get_device();
  bool has_w = w.defined();
  out.dx = out_like(x);
  std::vector<int64_t> flags{rms, has_w, has_b, dsum != nullptr, llama, 1};
  // dw/db: placeholders until the grid is known (late arguments, not in the tuning key)
  std::vector<Arg> args{T(dy), T(x), T(dsum ? ds : dy), T(has_w ? w : x), T(rms ? rstd : mean), T(rstd), T(rstd),
                        T(out.dx), T(has_w ? rstd : out.dx), T(has_b ? rstd : out.dx), I(m), I(n), I(n), I(n),
                        I(dsum ? n : 0), I(n), I(0), F(offset)};
  // the grid: ROWS and GRID_PER_SM from the tuning key, then heuristics.grad_grid(m, ROWS, 1, per_sm)
  int64_t rows, per_sm;
  if (!find_rows(make_key(NORM_BWD, device, flags, args, false), rows, per_sm)) return false;
  int64_t groups = std::max<int64_t>(1, std::min((m + rows - 1) / rows, sms * per_sm));
  int64_t per = ((m + groups - 1) / groups + rows - 1) / rows * rows;
  groups = (m + per - 1) / per;
  // as ops/norms.py: one row group stores its sums in each parameter's dtype straight into (N,)
  auto pdtype = has_w ? w.scalar_type() : x.scalar_type();
  bool direct = groups == 1;
  std::vector<int64_t> shape = direct ? std::vector<int64_t>{n} : std::vector<int64_t>{groups, n};
  Tensor dw = has_w ? out_empty(shape, x.options().dtype(direct ? pdtype : at::kFloat)) : Tensor();
  Tensor db = has_b ? out_empty(shape, x.options().dtype(direct ? *bias : at::kFloat)) : Tensor();
  args[8] = T(has_w ? dw : out.dx);
  args[9] = T(has_b ? db : out.dx);
  args[16] = I(per);
  const Entry* e = find(make_key(NORM_BWD, device, flags, args, true));
  if (!e) return false;
  // the sums, as _grad_sums: look their kernel up before launching anything
  bool fused = !direct && groups <= grad_sum_max && (has_w || has_b);
  Tensor dwo, dbo;
  std::vector<Arg> sargs;
  const Entry* se = nullptr;
  if (fused) {
    if (has_w) dwo = out_empty({n}, x.options().dtype(pdtype));
    if (has_b) dbo = out_empty({n}, x.options().dtype(*bias));
    const Tensor& some = has_w ? dw : db;
    const Tensor& other = has_w ? dwo : dbo;
    sargs = {T(has_w ? dw : some), T(has_b ? db : some), T(has_w ? dwo : other), T(has_b ? dbo : other),
             I(groups), I(n)};
    se = find(make_key(GRAD_SUM, device, {has_w, has_b}, sargs, true));
    if (!se) return false;
  }
  launch(*e, args, groups, 1, device);
  if (fused) {
    launch(*se, sargs, (n + se->block - 1) / se->block, 1, device);
    out.dw = dwo;
    out.db = dbo;
  } else if (direct) {
    out.dw = dw;
    out.db = db;
  } else {
    if (has_w) out.dw = dw.sum(0).to(pdtype);
    if (has_b) out.db = db.sum(0).to(*bias);
  }
  return true;
}

// a parameter's gradient in its dtype (norm_bwd gives the weight's; a bias of another dtype casts)
Tensor cast_like(const Tensor& g, const Tensor& p) {
  if (!g.defined() || !p.defined()) return Tensor();
  return g.scalar_type() == p.scalar_type() ? g : g.to(p.scalar_type());
}

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const std::optional<Tensor>& w, NormFwd* out,
                        double offset, bool llama) {
    ctx->save_for_backward({x, w.value_or(Tensor()), out->rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["llama"] = llama;
    return out->y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const Tensor &x = s[0], &w = s[1], &rstd = s[2];
    double offset = ctx->saved_data["offset"].toDouble();
    bool llama = ctx->saved_data["llama"].toBool();
    Tensor dy = grad_or_zeros(grads[0], x);
    NormBwd g;
    if (at::GradMode::is_enabled() ||
        !norm_bwd(dy, x, nullptr, w, Tensor(), rstd, offset, true, llama, std::nullopt, g)) {
      py::gil_scoped_acquire gil;
      auto r = fallback("rms_norm_bwd")(dy, x, w.defined() ? py::cast(w) : py::none(), rstd, offset, llama)
                   .cast<std::tuple<Tensor, Tensor>>();
      g.dx = std::get<0>(r);
      if (w.defined()) g.dw = std::get<1>(r);
    }
    return {g.dx, cast_like(g.dw, w), Tensor(), Tensor(), Tensor()};
  }
};

struct LayerNormFn : public torch::autograd::Function<LayerNormFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const std::optional<Tensor>& w,
                        const std::optional<Tensor>& b, NormFwd* out) {
    ctx->save_for_backward({x, w.value_or(Tensor()), out->mean, out->rstd, b.value_or(Tensor())});
    return out->y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const Tensor &x = s[0], &w = s[1], &mean = s[2], &rstd = s[3], &b = s[4];
    Tensor dy = grad_or_zeros(grads[0], x);
    NormBwd g;
    auto bias = b.defined() ? std::optional<at::ScalarType>(b.scalar_type()) : std::nullopt;
    if (at::GradMode::is_enabled() || !norm_bwd(dy, x, nullptr, w, mean, rstd, 0.0, false, false, bias, g)) {
      py::gil_scoped_acquire gil;
      auto r = fallback("layer_norm_bwd")(dy, x, w.defined() ? py::cast(w) : py::none(), mean, rstd,
                                          b.defined() ? py::cast(b) : py::none())
                   .cast<std::tuple<Tensor, Tensor, Tensor>>();
      g.dx = std::get<0>(r);
      g.dw = std::get<1>(r);
      g.db = std::get<2>(r);
    }
    return {g.dx, cast_like(g.dw, w), cast_like(g.db, b), Tensor()};
  }
};

struct AddRmsNormFn : public torch::autograd::Function<AddRmsNormFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& r, const Tensor& w, NormFwd* out,
                               double offset) {
    ctx->save_for_backward({out->h, w, out->rstd});
    ctx->saved_data["offset"] = offset;
    return {out->y, out->h};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const Tensor &h = s[0], &w = s[1], &rstd = s[2];
    double offset = ctx->saved_data["offset"].toDouble();
    Tensor dn = grad_or_zeros(grads[0], h), dsum = grad_or_zeros(grads[1], h);
    NormBwd g;
    if (at::GradMode::is_enabled() ||
        !norm_bwd(dn, h, &dsum, w, Tensor(), rstd, offset, true, false, std::nullopt, g)) {
      py::gil_scoped_acquire gil;
      auto r = fallback("add_rms_norm_bwd")(dn, dsum, h, w, rstd, offset).cast<std::tuple<Tensor, Tensor>>();
      g.dx = std::get<0>(r);
      g.dw = std::get<1>(r);
    }
    return {g.dx, g.dx, cast_like(g.dw, w), Tensor(), Tensor()};
  }
};

py::object rms_norm(const Tensor& x, py::handle normalized_shape, py::handle w_obj, py::handle eps_obj,
                    py::handle offset_obj, bool llama) {
  if (!usable(x)) return py::none();
  int64_t n = x.size(-1);
  double eps, offset;
  std::optional<Tensor> w;
  if (!shape_is(normalized_shape, n) || !opt_tensor(w_obj, w) || !usable_param(w, x, n) ||
      !eps_value(eps_obj, x, true, eps) || !num_value(offset_obj, offset))
    return py::none();
  c10::cuda::CUDAGuard guard(x.device());
  NormFwd out;
  if (!norm_fwd(x, nullptr, w, std::nullopt, eps, offset, true, llama, out)) return py::none();
  Tensor wt = w ? *w : Tensor();
  if (!wants_grad({&x, &wt})) return py::cast(out.y);
  return py::cast(RmsNormFn::apply(x, w, &out, offset, llama));
}

py::object layer_norm(const Tensor& x, py::handle normalized_shape, py::handle w_obj, py::handle b_obj,
                      py::handle eps_obj) {
  if (!usable(x)) return py::none();
  int64_t n = x.size(-1);
  double eps;
  std::optional<Tensor> w, b;
  if (!shape_is(normalized_shape, n) || !opt_tensor(w_obj, w) || !opt_tensor(b_obj, b) || !usable_param(w, x, n) ||
      !usable_param(b, x, n) || !eps_value(eps_obj, x, false, eps))
    return py::none();
  c10::cuda::CUDAGuard guard(x.device());
  NormFwd out;
  if (!norm_fwd(x, nullptr, w, b, eps, 0.0, false, false, out)) return py::none();
  Tensor wt = w ? *w : Tensor(), bt = b ? *b : Tensor();
  if (!wants_grad({&x, &wt, &bt})) return py::cast(out.y);
  return py::cast(LayerNormFn::apply(x, w, b, &out));
}

py::object add_rms_norm(const Tensor& x, const Tensor& r, py::handle w_obj, py::handle eps_obj, py::handle offset_obj) {
  if (!usable(x) || !usable(r) || r.sizes() != x.sizes() || r.scalar_type() != x.scalar_type() ||
      r.device() != x.device() || !THPVariable_Check(w_obj.ptr()))
    return py::none();
  int64_t n = x.size(-1);
  double eps, offset;
  const Tensor& w = THPVariable_Unpack(w_obj.ptr());
  if (!usable_param(w, x, n) || !eps_value(eps_obj, x, true, eps) || !num_value(offset_obj, offset)) return py::none();
  c10::cuda::CUDAGuard guard(x.device());
  NormFwd out;
  if (!norm_fwd(x, &r, w, std::nullopt, eps, offset, true, false, out)) return py::none();
  if (!wants_grad({&x, &r, &w})) return py::make_tuple(out.y, out.h);
  auto ys = AddRmsNormFn::apply(x, r, w, &out, offset);
  return py::make_tuple(ys[0], ys[1]);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU / GeGLU with separate, contiguous gate and up (the flat kernels)
// ---------------------------------------------------------------------------------------------
Tensor glu_bwd(const Tensor& gate, const Tensor& up, Tensor dy, int64_t act) {
  if (!dy.is_contiguous()) dy = dy.contiguous();
  std::vector<int64_t> shape{2};
  shape.insert(shape.end(), gate.sizes().begin(), gate.sizes().end());
  Tensor grad = out_empty(shape, gate.options());
  Tensor dg = grad[0], du = grad[1];
  int64_t total = gate.numel();
  if (!at::GradMode::is_enabled() &&
      run_flat(GLU_BWD, gate.get_device(), {act}, {T(gate), T(up), T(dy), T(dg), T(du), I(total)}, total))
    return grad;
  py::gil_scoped_acquire gil;
  return fallback("glu_bwd")(gate, up, dy, act).cast<Tensor>();
}

struct GluFn : public torch::autograd::Function<GluFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gate, const Tensor& up, Tensor* y, int64_t act) {
    ctx->save_for_backward({gate, up});
    ctx->saved_data["act"] = act;
    return *y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    Tensor dy = grad_or_zeros(grads[0], s[0]);
    Tensor grad = glu_bwd(s[0], s[1], dy, ctx->saved_data["act"].toInt());
    return {grad[0], grad[1], Tensor(), Tensor()};
  }
};

py::object glu(const Tensor& gate, py::handle up_obj, int64_t act) {
  if (!usable(gate) || !THPVariable_Check(up_obj.ptr())) return py::none();
  const Tensor& up = THPVariable_Unpack(up_obj.ptr());
  if (!usable(up) || up.sizes() != gate.sizes() || up.scalar_type() != gate.scalar_type() ||
      up.device() != gate.device())
    return py::none();
  c10::cuda::CUDAGuard guard(gate.device());
  Tensor y = out_like(gate);
  int64_t total = gate.numel();
  if (!run_flat(GLU_FWD, gate.get_device(), {act}, {T(gate), T(up), T(y), I(total)}, total)) return py::none();
  if (!wants_grad({&gate, &up})) return py::cast(y);
  return py::cast(GluFn::apply(gate, up, &y, act));
}

// ---------------------------------------------------------------------------------------------
// add, the vectorized variant (same shape and dtype, contiguous; ops/add.py)
// ---------------------------------------------------------------------------------------------
struct AddFn : public torch::autograd::Function<AddFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& y, Tensor* out, double alpha) {
    ctx->saved_data["alpha"] = alpha;
    return *out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // as ops/add.py: d_input is dy itself, d_other dy scaled by alpha (when alpha != 1)
    double alpha = ctx->saved_data["alpha"].toDouble();
    const Tensor& dy = grads[0];
    return {dy, (!dy.defined() || alpha == 1.0) ? dy : dy * alpha, Tensor(), Tensor()};
  }
};

py::object add(const Tensor& x, py::handle y_obj, double alpha) {
  if (!usable(x) || !THPVariable_Check(y_obj.ptr())) return py::none();
  const Tensor& y = THPVariable_Unpack(y_obj.ptr());
  if (!usable(y) || y.sizes() != x.sizes() || y.scalar_type() != x.scalar_type() || y.device() != x.device())
    return py::none();
  c10::cuda::CUDAGuard guard(x.device());
  Tensor out = out_like(x);
  int64_t total = x.numel();
  if (!run_flat(ADD_FWD, x.get_device(), {}, {T(x), T(y), T(out), I(total), F(alpha)}, total)) return py::none();
  if (!wants_grad({&x, &y})) return py::cast(out);
  return py::cast(AddFn::apply(x, y, &out, alpha));
}

// ---------------------------------------------------------------------------------------------
// sum / amax over the last dim (output in the input's dtype)
// ---------------------------------------------------------------------------------------------
Tensor amax_bwd(const Tensor& x, const Tensor& y, Tensor dy) {
  if (!dy.is_contiguous()) dy = dy.contiguous();
  int64_t n = x.size(-1), m = rows_of(x);
  Tensor dx = out_like(x);
  std::vector<Arg> args{T(x), T(y), T(dy), T(dx), I(m), I(n), I(n), I(1), I(n)};
  if (!at::GradMode::is_enabled() && run_rows(AMAX_BWD, x.get_device(), {}, args, m)) return dx;
  py::gil_scoped_acquire gil;
  return fallback("amax_bwd")(x, y, dy).cast<Tensor>();
}

struct SumFn : public torch::autograd::Function<SumFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, Tensor* y) {
    ctx->saved_data["shape"] = x.sizes();
    return *y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto shape = ctx->saved_data["shape"].toIntVector();
    return {grads[0].unsqueeze(-1).expand(shape), Tensor()};
  }
};

struct AmaxFn : public torch::autograd::Function<AmaxFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, Tensor* y) {
    ctx->save_for_backward({x, *y});
    return *y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    return {amax_bwd(s[0], s[1], grad_or_zeros(grads[0], s[1])), Tensor()};
  }
};

py::object reduce(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  if (!over_last_dim(x, dim)) return py::none();
  int64_t n = x.size(-1), m = rows_of(x);
  // the block kernel's key does not hold M's value: rows enough for the loop kernel are Python's
  if (n >= loop_min_n && m >= loop_rows) return py::none();
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = out_empty(x.sizes().slice(0, x.dim() - 1), x.options());
  if (!run_rows(REDUCE_FWD, x.get_device(), {is_max}, {T(x), T(y), I(m), I(n), I(n)}, m)) return py::none();
  Tensor out = y;
  if (wants_grad({&x})) out = is_max ? AmaxFn::apply(x, &y) : SumFn::apply(x, &y);
  return py::cast(keepdim ? out.unsqueeze(-1) : out);
}

// ---------------------------------------------------------------------------------------------
// RoPE of q and k in one launch (ops/rope.py): (B, H, S, D) contiguous q and k, cos/sin (T, D or
// D/2), (1, T, .) or (B, T, .), positions None, an int offset, or an int tensor on q's device
// ---------------------------------------------------------------------------------------------
// The launch, as ops/rope.py's _rope_launch; false when no kernel was offered for the key. The
// grid: B x ceil(S / BLOCK_S) token blocks by the head split, both from the tuning key.
bool rope_run(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin, const Tensor& pos,
              int64_t offset, bool interleaved, bool backward, Tensor& qo, Tensor& ko) {
  int64_t bsz = q.size(0), hq = q.size(1), s = q.size(2), d = q.size(3), hk = k.size(1);
  int device = q.get_device();
  qo = out_like(q);
  ko = out_like(k);
  Tensor cos3 = cos.dim() == 3 ? cos : cos.unsqueeze(0), sin3 = sin.dim() == 3 ? sin : sin.unsqueeze(0);
  auto bstride = [](const Tensor& t) -> int64_t { return t.size(0) == 1 ? 0 : t.stride(0); };  // a batch of one is shared
  Tensor pos2 = pos.defined() ? (pos.dim() == 2 ? pos : pos.unsqueeze(0)) : cos3;                 // unused pointer without ids
  int64_t spb = pos.defined() ? bstride(pos2) : 0, sps = pos.defined() ? pos2.stride(1) : 0;
  std::vector<Arg> args{T(q), T(k), T(qo), T(ko), T(cos3), T(sin3), T(pos2),
                        I(s), I(hq), I(hk), I(cos3.size(1)), I(offset), I(0), I(0),
                        I(q.stride(0)), I(q.stride(1)), I(q.stride(2)), I(k.stride(0)), I(k.stride(1)), I(k.stride(2)),
                        I(qo.stride(0)), I(qo.stride(1)), I(qo.stride(2)), I(ko.stride(0)), I(ko.stride(1)), I(ko.stride(2)),
                        I(bstride(cos3)), I(cos3.stride(1)), I(bstride(sin3)), I(sin3.stride(1)), I(spb), I(sps)};
  std::vector<int64_t> flags{interleaved, cos3.size(2) != d, pos.defined(), backward, d / 2};
  int64_t block_s, split;
  if (!find_rows(make_key(ROPE, device, flags, args, false), block_s, split)) return false;
  int64_t n_sblk = (s + block_s - 1) / block_s;
  args[12] = I(n_sblk);
  args[13] = I(split);
  const Entry* e = find(make_key(ROPE, device, flags, args, true));
  if (!e) return false;
  launch(*e, args, bsz * n_sblk, split, device);
  return true;
}

struct RopeFn : public torch::autograd::Function<RopeFn> {
  // the tables and ids by pointer: not autograd inputs (they get no gradient; the ids may be undefined)
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, Tensor* qo, Tensor* ko,
                               const Tensor* cos, const Tensor* sin, const Tensor* pos, int64_t offset, bool interleaved) {
    // saved as variables (not saved_data), so an in-place change between forward and backward
    // raises as in the Python path instead of being read silently
    ctx->save_for_backward({*cos, *sin, *pos});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["q_shape"] = q.sizes();
    ctx->saved_data["k_shape"] = k.sizes();
    return {*qo, *ko};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    Tensor cos = saved[0], sin = saved[1], pos = saved[2];
    int64_t offset = ctx->saved_data["offset"].toInt();
    bool interleaved = ctx->saved_data["interleaved"].toBool();
    Tensor gq = grads[0], gk = grads[1];
    if (!gq.defined() && !gk.defined()) return variable_list(9);
    // an output that got no gradient contributes zeros (as the Python Function's materialised grads)
    if (!gq.defined()) gq = at::zeros(ctx->saved_data["q_shape"].toIntVector(), gk.options());
    if (!gk.defined()) gk = at::zeros(ctx->saved_data["k_shape"].toIntVector(), gq.options());
    // the backward is the same kernel with the sines swapped and negated; under create_graph it
    // must itself be differentiable, which the Python operator is
    bool done = false;
    Tensor dq, dk;
    if (!at::GradMode::is_enabled()) {
      if (!gq.is_contiguous()) gq = gq.contiguous();
      if (!gk.is_contiguous()) gk = gk.contiguous();
      done = rope_run(gq, gk, cos, sin, pos, offset, interleaved, true, dq, dk);
    }
    if (!done) {
      py::gil_scoped_acquire gil;
      auto r = fallback("rope_bwd")(gq, gk, cos, sin, pos.defined() ? py::cast(pos) : py::none(), offset,
                                    interleaved).cast<std::tuple<Tensor, Tensor>>();
      dq = std::get<0>(r);
      dk = std::get<1>(r);
    }
    return {dq, dk, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// A cos/sin table the kernel reads as given: usable, 2-d or 3-d (batch 1 or B), last dim D or D/2.
bool rope_table(py::handle o, const Tensor& q, Tensor& out) {
  if (!THPVariable_Check(o.ptr())) return false;
  out = THPVariable_Unpack(o.ptr());
  if (!usable(out) || out.device() != q.device() || (out.dim() != 2 && out.dim() != 3)) return false;
  if (out.scalar_type() != at::kFloat && out.scalar_type() != q.scalar_type()) return false;
  int64_t d = q.size(3), dt = out.size(-1);
  if (dt != d && dt != d / 2) return false;
  return out.dim() == 2 || out.size(0) == 1 || out.size(0) == q.size(0);
}

py::object rope(const Tensor& q, py::handle k_obj, py::handle cos_obj, py::handle sin_obj, py::handle pos_obj,
                bool interleaved) {
  if (!usable(q) || q.dim() != 4 || !THPVariable_Check(k_obj.ptr())) return py::none();
  const Tensor& k = THPVariable_Unpack(k_obj.ptr());
  int64_t bsz = q.size(0), hq = q.size(1), s = q.size(2), d = q.size(3);
  if (!usable(k) || k.dim() != 4 || k.scalar_type() != q.scalar_type() || k.device() != q.device() ||
      k.size(0) != bsz || k.size(2) != s || k.size(3) != d || d % 2 || hq % k.size(1))
    return py::none();
  Tensor cos, sin;
  if (!rope_table(cos_obj, q, cos) || !rope_table(sin_obj, q, sin) || sin.sizes() != cos.sizes()) return py::none();
  Tensor pos;
  int64_t offset = 0;
  if (THPVariable_Check(pos_obj.ptr())) {
    // ids on the CPU are checked by the Python path (no sync there); on the GPU they are not (NaN tokens)
    pos = THPVariable_Unpack(pos_obj.ptr());
    auto st = pos.scalar_type();
    if (!pos.is_cuda() || pos.device() != q.device() || (st != at::kInt && st != at::kLong)) return py::none();
    bool shaped = (pos.dim() == 1 && pos.size(0) == s) ||
                  (pos.dim() == 2 && (pos.size(0) == 1 || pos.size(0) == bsz) && pos.size(1) == s);
    if (!shaped) return py::none();
  } else if (PyLong_Check(pos_obj.ptr()) && !PyBool_Check(pos_obj.ptr())) {
    offset = pos_obj.cast<int64_t>();
    if (offset < 0 || cos.size(-2) < offset + s) return py::none();
  } else if (!pos_obj.is_none() || cos.size(-2) < s) {
    return py::none();
  }
  if (at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())) return py::none();
  c10::cuda::CUDAGuard guard(q.device());
  Tensor qo, ko;
  if (!rope_run(q, k, cos, sin, pos, offset, interleaved, false, qo, ko)) return py::none();
  if (!wants_grad({&q, &k})) return py::make_tuple(qo, ko);
  auto ys = RopeFn::apply(q, k, &qo, &ko, &cos, &sin, &pos, offset, interleaved);
  return py::make_tuple(ys[0], ys[1]);
}

// ---------------------------------------------------------------------------------------------
// Registration from Python
// ---------------------------------------------------------------------------------------------
// Called by runtime/launch.py after a Python-path launch of one of the kernels above: record the
// compiled kernel under the key these arguments give. ``kinds``: each argument's ABI kind.
void offer(const std::string& name, int device, py::sequence args, py::dict constexprs, int threads, int shared,
           const std::string& kinds, uint64_t function) {
  int kid = -1;
  for (int k = 0; k < N_KIDS; ++k)
    if (name == INFO[k].name) kid = k;
  if (kid < 0 || static_cast<size_t>(py::len(args)) != kinds.size()) return;
  std::vector<Arg> a;
  for (py::handle o : args) {
    if (THPVariable_Check(o.ptr())) a.push_back(T(THPVariable_Unpack(o.ptr())));
    else if (PyBool_Check(o.ptr())) return;   // not a kernel argument we key
    else if (PyLong_Check(o.ptr())) a.push_back(I(o.cast<int64_t>()));
    else if (PyFloat_Check(o.ptr())) a.push_back(F(o.cast<double>()));
    else if (o.is_none()) a.push_back(Arg());
    else return;
  }
  std::vector<int64_t> flags;
  for (const char* f : INFO[kid].flags) {
    if (!constexprs.contains(f)) return;
    flags.push_back(py::int_(constexprs[f]).cast<int64_t>());
  }
  Entry e;
  e.function = reinterpret_cast<void*>(function);
  e.threads = threads;
  e.shared = shared;
  e.kinds = kinds;
  const KernelInfo& info = INFO[kid];
  e.rows = constexprs.contains(info.rows_name) ? py::int_(constexprs[info.rows_name]).cast<int64_t>() : 1;
  e.per_sm = constexprs.contains("GRID_PER_SM") ? py::int_(constexprs["GRID_PER_SM"]).cast<int64_t>() : 0;
  if (info.split_arg >= 0) e.per_sm = a[info.split_arg].i;   // the grid's y extent, kept as the tuning's second value
  e.block = constexprs.contains("BLOCK") ? py::int_(constexprs["BLOCK"]).cast<int64_t>() : 1;
  std::lock_guard<std::mutex> g(table_mutex);
  table.emplace(make_key(static_cast<Kid>(kid), device, flags, a, true), e);
  if (!info.late.empty())
    tunings.emplace(make_key(static_cast<Kid>(kid), device, flags, a, false), std::make_pair(e.rows, e.per_sm));
}

void init(int64_t sm_count, int64_t grad_sum_rows, bool poison_outputs, py::dict fbs, int64_t reduce_loop_rows,
          int64_t reduce_loop_min_n, int64_t norm_rows, int64_t norm_min_n, int64_t norm_max_n,
          int64_t softmax_min_n, int64_t softmax_max_n) {
  sms = sm_count;
  grad_sum_max = grad_sum_rows;
  loop_rows = reduce_loop_rows;
  loop_min_n = reduce_loop_min_n;
  norm_loop_rows = norm_rows;
  norm_loop_min_n = norm_min_n;
  norm_loop_max_n = norm_max_n;
  softmax_loop_min_n = softmax_min_n;
  softmax_loop_max_n = softmax_max_n;
  poison = poison_outputs;
  for (auto item : fbs) (*fallbacks)[item.first.cast<std::string>()] = py::reinterpret_borrow<py::object>(item.second);
  if (!cu_launch) {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_LAZY);
    TORCH_CHECK(lib, "warpforge fast path: cannot open libcuda.so.1");
    cu_launch = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
    TORCH_CHECK(cu_launch, "warpforge fast path: libcuda.so.1 has no cuLaunchKernel");
  }
}

int64_t fallbacks_used() { return fallback_calls; }

py::list kernel_names() {
  py::list out;
  for (const auto& k : INFO) out.append(k.name);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "warpforge's eager fast path (runtime/fastpath.py)";
  m.def("init", &init);
  m.def("offer", &offer);
  m.def("kernel_names", &kernel_names);
  m.def("fallbacks_used", &fallbacks_used);
  m.def("softmax", &softmax);
  m.def("rms_norm", &rms_norm);
  m.def("layer_norm", &layer_norm);
  m.def("add_rms_norm", &add_rms_norm);
  m.def("glu", &glu);
  m.def("reduce", &reduce);
  m.def("add", &add);
  m.def("rope", &rope);
}
