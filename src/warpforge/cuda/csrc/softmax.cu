// Softmax and log-softmax over rows, forward and backward: one read and one write of every
// element (the byte floor), at any row length up to 262,144 and beyond.
//
//   forward   y = exp(x - M) / S           (log: y = x - M - log S),  M = max x, S = sum exp(x - M)
//   backward  dx = y * (dy - sum(y * dy))  (log: dx = dy - exp(y) * sum(dy))
//
// Byte model: forward reads x and writes y, 2*M*N*s; backward reads y and dy and writes dx,
// 3*M*N*s. ~5 FLOPs per element: bandwidth-bound by two orders of magnitude, so the roof is the
// measured copy bandwidth and every design choice below is about bytes and latency.
//
// 1. The row lives in registers. A thread loads its VPT 16-byte vectors (8 bf16 each) once, keeps
//    them in registers (packed: 4 registers per vector, 16 per thread at VPT = 4), and both the
//    statistics and the output are computed from there: the textbook three passes over memory
//    (max, sum, normalise) become one read and one write.
// 2. Online (single-pass) statistics. Each thread reduces its own values to a pair (m, s): its max
//    and the sum of exp(x - m). Pairs combine associatively, (m1, s1) + (m2, s2) =
//    (M, s1 e^(m1-M) + s2 e^(m2-M)), M = max(m1, m2), so one reduction of pairs -- not a max
//    reduction followed by a sum reduction -- gives the row's (M, S): one barrier per row, not two.
// 3. The reduction tree: five butterfly shuffles combine a warp's pairs in registers; warp
//    leaders publish to shared memory (double-buffered by row parity, so the next row's writes
//    never race this row's reads without a second barrier); one __syncthreads; each warp reads
//    the (<= 32) warp pairs, one per lane, and shuffles again.
// 4. Short rows (<= 32 x VPT vectors) get one warp each and never touch shared memory or a
//    barrier; several rows share a block.
// 5. Long rows: a block of up to 1,024 threads x 4 vectors holds 32K bf16. Past that a row is
//    spread over a thread-block cluster of 2-16 blocks (16 is Hopper's non-portable maximum):
//    each block reduces its share to one pair and pushes it into every partner's shared memory (DSMEM, st.async signalling an mbarrier: no
//    cluster-wide barrier per row, see ClusterXchg). 8 blocks x 1,024 threads x 4 vectors x 8 =
//    262,144 bf16 in registers, still one read and one write. (Without clusters, a row split
//    over blocks must exchange statistics through global memory and spin-wait, or re-read the
//    row: 1.5x the bytes.) No block may exit while a partner can still write to it, so every
//    block ends with one cluster barrier.
// 6. Rows longer than any register-resident shape take the looped kernel: pass 1 streams the row
//    computing online (m, s), pass 2 re-reads it and writes: 1.5x the bytes, for very long rows
//    only.
// Loads are streaming (evict-first); exp is ex2.approx on x*log2(e) - M*log2(e), one FMA + MUFU.
// Statistics are fp32 for every dtype; each output is rounded once, at its store.
#include <cooperative_groups.h>

#include "cluster.cuh"
#include "cluster_rows.cuh"
#include "common.cuh"

namespace cg = cooperative_groups;

namespace wf {
namespace {

__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// ---- reduction values ----------------------------------------------------------------------
struct MaxSum {   // (max, sum of exp(x - max)), the online-softmax statistic
  float m, s;
  static __device__ __forceinline__ MaxSum identity() { return {-INFINITY, 0.f}; }
  static __device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
    const float M = fmaxf(a.m, b.m);
    // a.m == M covers M = -inf (both empty): no exp(-inf - -inf) = NaN
    const float sa = a.m == M ? a.s : a.s * fast_exp2((a.m - M) * kLog2e);
    const float sb = b.m == M ? b.s : b.s * fast_exp2((b.m - M) * kLog2e);
    return {M, sa + sb};
  }
  __device__ __forceinline__ MaxSum shfl(int o) const { return {shfl_xor(m, o), shfl_xor(s, o)}; }
  __device__ __forceinline__ float2 pack() const { return {m, s}; }
  static __device__ __forceinline__ MaxSum unpack(float2 v) { return {v.x, v.y}; }
};

struct Sum {
  float s;
  static __device__ __forceinline__ Sum identity() { return {0.f}; }
  static __device__ __forceinline__ Sum combine(Sum a, Sum b) { return {a.s + b.s}; }
  __device__ __forceinline__ Sum shfl(int o) const { return {shfl_xor(s, o)}; }
  __device__ __forceinline__ float2 pack() const { return {s, 0.f}; }
  static __device__ __forceinline__ Sum unpack(float2 v) { return {v.x}; }
};

template <typename R>
__device__ __forceinline__ R warp_allreduce(R v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = R::combine(v, v.shfl(o));
  return v;
}

// ---- the cluster exchange ----------------------------------------------------------------------
// Each block of a cluster pushes its row pair into every partner's shared memory with st.async,
// which also signals the partner's mbarrier (complete_tx: 8 bytes each); a block waits only on its
// own mbarrier until all partners' bytes have landed. No cluster-wide barrier per row: that one
// (barrier.cluster.arrive has release semantics at cluster scope) makes every thread wait until its
// earlier global stores -- the previous row's output -- are visible cluster-wide, a round trip to
// L2 per row. Measured on an H100 (benchmarks/NOTES.md): 16384 x 32768 bf16 over 2-8 block
// clusters ran at 74-75% of the copy roof with cluster.sync(), 96% on one 1,024-thread block.
// Slots and barriers are double-buffered by row parity; the k-th use of a barrier waits on phase
// parity k & 1. A partner can only send row i + 2 after it received this block's row i + 1, which
// this block sends after it finished reading row i's slots, so a slot is never overwritten early.
struct ClusterXchg {
  float2 slots[2][16];   // [row parity][source rank]
  uint64_t bar[2];       // [row parity]
};

__device__ __forceinline__ void xchg_init(ClusterXchg& x, const cg::cluster_group& cluster) {
  if (threadIdx.x == 0) {
    mbar_init(smem_u32(&x.bar[0]), 1);
    mbar_init(smem_u32(&x.bar[1]), 1);
    mbar_init_fence();
  }
  cluster.sync();   // once: partners must see initialised barriers before their first st.async
}

// The row's total over every thread of the block, and over the blocks of the cluster when it has
// more than one. `warp_buf`: 2 x 32 slots indexed by row parity; `it`: this block's row count so far.
template <typename R>
__device__ __forceinline__ R row_allreduce(R v, R (*warp_buf)[32], ClusterXchg* x, uint32_t it, unsigned csize,
                                           unsigned crank) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int parity = it & 1;
  v = warp_allreduce(v);
  if (nwarps > 1) {
    if (lane == 0) warp_buf[parity][warp] = v;
    __syncthreads();
    v = warp_allreduce(lane < nwarps ? warp_buf[parity][lane] : R::identity());
  }
  if (csize > 1) {
    const uint32_t bar = smem_u32(&x->bar[parity]);
    if (threadIdx.x == 0) mbar_arrive_expect_tx(bar, csize * 8u);
    if (threadIdx.x < csize) {   // lane r of warp 0 sends to rank r
      const float2 p = v.pack();
      st_async_f2(smem_u32(&x->slots[parity][crank]), bar, threadIdx.x, p.x, p.y);
    }
    mbar_wait(bar, (it >> 1) & 1);
    v = warp_allreduce(lane < static_cast<int>(csize) ? R::unpack(x->slots[parity][lane]) : R::identity());
  }
  return v;
}

// Where this block's share of a row lies when a row spans the `csize` blocks of a cluster (1 for a
// plain launch): its k-th vector is vector k * span + first. Sets up the exchange on construction;
// finish() is the kernel's last step (no block leaves while a partner's st.async may still target it).
struct RowSpan {
  cg::cluster_group cluster;
  unsigned csize, crank;
  int64_t span, first;
  __device__ __forceinline__ explicit RowSpan(ClusterXchg& x)
      : cluster(cg::this_cluster()), csize(cluster.num_blocks()), crank(cluster.block_rank()),
        span(static_cast<int64_t>(csize) * blockDim.x),
        first(static_cast<int64_t>(crank) * blockDim.x + threadIdx.x) {
    if (csize > 1) xchg_init(x, cluster);
  }
  __device__ __forceinline__ void finish() {
    if (csize > 1) cluster.sync();
  }
};

// A tree over CHAINS partial values (op: max or +), and a thread's max over VPT vectors in CHAINS
// running maxima (element e of a vector in chain e % CHAINS).
template <int CHAINS, typename Op>
__device__ __forceinline__ float chain_tree(float (&part)[CHAINS], Op op) {
#pragma unroll
  for (int w = CHAINS / 2; w > 0; w >>= 1)
#pragma unroll
    for (int c = 0; c < w; ++c) part[c] = op(part[c], part[c + w]);
  return part[0];
}

// The max of two packed pairs of 16-bit values (exact; a NaN operand yields the other, as fmaxf).
// (__hmax2: max.bf16x2 / max.f16x2 from sm_80, emulated before.)
template <typename T>
__device__ __forceinline__ uint32_t max_pair(uint32_t a, uint32_t b) {
  using T2 = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
  const T2 r = __hmax2(*reinterpret_cast<const T2*>(&a), *reinterpret_cast<const T2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// A thread's max over VPT vectors. 16-bit types compare packed pairs (one instruction for two
// elements, no conversion: NOTES item 115), one running max for each of a vector's 4 words, and
// convert the last pair; fp32 keeps CHAINS running maxima (element e of a vector in chain e % CHAINS).
template <int CHAINS, typename T, int VPT>
__device__ __forceinline__ float chained_max(const Vec<T> (&v)[VPT]) {
  constexpr int N = Vec<T>::N;
  static_assert(CHAINS >= 1 && CHAINS <= N && N % CHAINS == 0 && (CHAINS & (CHAINS - 1)) == 0, "chains");
  if constexpr (sizeof(T) == 2) {
    uint32_t w[4] = {v[0].raw.x, v[0].raw.y, v[0].raw.z, v[0].raw.w};
#pragma unroll
    for (int k = 1; k < VPT; ++k) {
      w[0] = max_pair<T>(w[0], v[k].raw.x);
      w[1] = max_pair<T>(w[1], v[k].raw.y);
      w[2] = max_pair<T>(w[2], v[k].raw.z);
      w[3] = max_pair<T>(w[3], v[k].raw.w);
    }
    Vec<T> last;
    last.raw.x = max_pair<T>(max_pair<T>(w[0], w[1]), max_pair<T>(w[2], w[3]));
    return fmaxf(last.get(0), last.get(1));
  } else {
    float part[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) part[c] = -INFINITY;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int e = 0; e < N; ++e) part[e % CHAINS] = fmaxf(part[e % CHAINS], v[k].get(e));
    return chain_tree(part, [](float a, float b) { return fmaxf(a, b); });
  }
}

// Thread-local (max, sum exp) of VPT vectors: the max from chained_max (16-bit types: packed pairs,
// whatever CHAINS), the sum in CHAINS independent running sums (element e of a vector goes to chain
// e % CHAINS; a tree merges them at the end): more chains let the exps and adds of different
// positions overlap, where one chain is VPT x N dependent adds (the staged
// cluster kernel takes N chains; the one-row kernels keep one: more registers spill there). LOG
// sums exp2((x - m) log2 e), whose x - m is exact near the max (NOTES item 108); softmax the FMA form.
template <typename T, int VPT, bool LOG = false, int CHAINS = 1>
__device__ __forceinline__ MaxSum local_stats(const Vec<T> (&v)[VPT]) {
  constexpr int N = Vec<T>::N;
  const float mx = chained_max<CHAINS>(v);
  if (mx == -INFINITY) return {mx, 0.f};   // an all -inf thread keeps (-inf, 0)
  const float ml = mx * kLog2e;
  float part[CHAINS];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) part[c] = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < N; ++e)
      part[e % CHAINS] += LOG ? fast_exp2((v[k].get(e) - mx) * kLog2e) : fast_exp2(fmaf(v[k].get(e), kLog2e, -ml));
  return {mx, chain_tree(part, [](float a, float b) { return a + b; })};
}

// Softmax's thread-local statistics that also keep the exps: v becomes e = exp(x - mt) rounded to T
// (mt the thread's max; all zeros where mt = -inf), and the pair is (mt, sum of the unrounded e).
// y = e exp(mt - M) / S then needs no second exp; e's rounding to T adds at most half a unit in the
// last place of T before y's own rounding.
template <typename T, int VPT>
__device__ __forceinline__ MaxSum local_exps(Vec<T> (&v)[VPT]) {
  constexpr int N = Vec<T>::N;
  const float mx = chained_max<N>(v);
  if (mx == -INFINITY) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) v[k].raw = make_uint4(0u, 0u, 0u, 0u);
    return {mx, 0.f};
  }
  const float ml = mx * kLog2e;
  float part[N];
#pragma unroll
  for (int e = 0; e < N; ++e) part[e] = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < N; e += 2) {
      const float e0 = fast_exp2(fmaf(v[k].get(e), kLog2e, -ml)), e1 = fast_exp2(fmaf(v[k].get(e + 1), kLog2e, -ml));
      part[e] += e0;
      part[e + 1] += e1;
      v[k].set2(e, e0, e1);
    }
  return {mx, chain_tree(part, [](float a, float b) { return a + b; })};
}

// y for one vector from the row's (M, S).
template <typename T>
__device__ __forceinline__ Vec<T> fwd_out(const Vec<T>& v, MaxSum st, bool log) {
  Vec<T> o;
  if (log) {
    const float lse = st.m + __logf(st.s);
#pragma unroll
    for (int e = 0; e < Vec<T>::N; ++e) o.set(e, v.get(e) - lse);
  } else {
    const float ml = st.m * kLog2e, inv = 1.f / st.s;
#pragma unroll
    for (int e = 0; e < Vec<T>::N; ++e) o.set(e, fast_exp2(fmaf(v.get(e), kLog2e, -ml)) * inv);
  }
  return o;
}

// ---- forward: register-resident rows ----------------------------------------------------------
// Copies of this thread's next-row vectors land in shared memory while it finishes the current
// row (cp.async, 16 bytes each, L1 bypassed): each thread owns its slots, so only its own
// wait_group orders them -- no barrier.
__device__ __forceinline__ void stage_vec(uint4* slot, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(slot)), "l"(src) : "memory");
}
__device__ __forceinline__ void stage_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void stage_wait() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// Block (or cluster) per row: grid (cluster, rows). The thread's k-th vector is vector
// (k * cluster + rank) * blockDim + tid of the row: each block reads contiguous 16 x blockDim bytes.
// `prefetch` (persistent cluster grids, aligned rows): while a block exchanges statistics and
// writes row i -- a latency-bound stretch in which a 1,024-thread block, alone on its SM, would
// otherwise issue no loads -- the next row's whole vectors are already on their way into a
// blockDim x VPT x 16-byte shared-memory stage (64 KB at 1,024 x 4). Measured on an H100 at
// 512 x 262,144 bf16 over 8-block clusters: 77% of the copy roof without it.
template <typename T, int VPT>
__global__ void __launch_bounds__(1024) softmax_fwd_block_kernel(
    const T* __restrict__ x, T* __restrict__ y, int64_t m, int64_t n, int64_t sx, int64_t sy, bool aligned, bool log,
    bool prefetch) {
  constexpr int N = Vec<T>::N;
  extern __shared__ uint4 stage[];   // [VPT][blockDim.x] when prefetching
  __shared__ MaxSum warp_buf[2][32];
  __shared__ ClusterXchg xchg;
  RowSpan rs(xchg);
  const int64_t span = rs.span, first = rs.first;
  // stage row r's whole vectors (the tail vector, if partial, is read from global later)
  auto issue = [&](int64_t r) {
    const T* xr = x + r * sx;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t i0 = (k * span + first) * N;
      if (i0 + N <= n) stage_vec(&stage[k * blockDim.x + threadIdx.x], xr + i0);
    }
    stage_commit();
  };
  if (prefetch && blockIdx.y < m) issue(blockIdx.y);
  uint32_t it = 0;
  for (int64_t row = blockIdx.y; row < m; row += gridDim.y, ++it) {
    const T* xr = x + row * sx;
    Vec<T> v[VPT];
    if (prefetch) {
      stage_wait();
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int64_t i0 = (k * span + first) * N;
        if (i0 + N <= n) v[k].raw = stage[k * blockDim.x + threadIdx.x];
        else v[k] = load_vec_guarded(xr, i0, n, aligned, -INFINITY);
      }
      if (row + gridDim.y < m) issue(row + gridDim.y);
    } else {
#pragma unroll
      for (int k = 0; k < VPT; ++k) v[k] = load_vec_guarded(xr, (k * span + first) * N, n, aligned, -INFINITY);
    }
    const MaxSum st = row_allreduce(local_stats<T, VPT>(v), warp_buf, &xchg, it, rs.csize, rs.crank);
    T* yr = y + row * sy;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t i0 = (k * span + first) * N;
      if (i0 < n) store_vec_guarded(yr, i0, n, aligned, fwd_out(v[k], st, log));
    }
  }
  rs.finish();
}

// Warp per row, blockDim / 32 rows per block.
template <typename T, int VPT>
__global__ void __launch_bounds__(1024) softmax_fwd_warp_kernel(
    const T* __restrict__ x, T* __restrict__ y, int64_t m, int64_t n, int64_t sx, int64_t sy, bool aligned, bool log) {
  constexpr int N = Vec<T>::N;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= m) return;
  const T* xr = x + row * sx;
  Vec<T> v[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) v[k] = load_vec_guarded(xr, static_cast<int64_t>(k * 32 + lane) * N, n, aligned, -INFINITY);
  const MaxSum st = warp_allreduce(local_stats<T, VPT>(v));
  T* yr = y + row * sy;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t i0 = static_cast<int64_t>(k * 32 + lane) * N;
    if (i0 < n) store_vec_guarded(yr, i0, n, aligned, fwd_out(v[k], st, log));
  }
}

// Looped: block per row, two passes over memory.
template <typename T>
__global__ void __launch_bounds__(1024) softmax_fwd_loop_kernel(
    const T* __restrict__ x, T* __restrict__ y, int64_t m, int64_t n, int64_t sx, int64_t sy, bool aligned, bool log) {
  constexpr int N = Vec<T>::N;
  __shared__ MaxSum warp_buf[2][32];
  uint32_t it = 0;
  for (int64_t row = blockIdx.y; row < m; row += gridDim.y, ++it) {
    const T* xr = x + row * sx;
    MaxSum t = MaxSum::identity();
    for (int64_t i0 = static_cast<int64_t>(threadIdx.x) * N; i0 < n; i0 += static_cast<int64_t>(blockDim.x) * N) {
      Vec<T> v[1] = {load_vec_guarded(xr, i0, n, aligned, -INFINITY)};
      t = MaxSum::combine(t, local_stats<T, 1>(v));
    }
    const MaxSum st = row_allreduce(t, warp_buf, nullptr, it, 1u, 0u);
    T* yr = y + row * sy;
    for (int64_t i0 = static_cast<int64_t>(threadIdx.x) * N; i0 < n; i0 += static_cast<int64_t>(blockDim.x) * N)
      store_vec_guarded(yr, i0, n, aligned, fwd_out(load_vec_guarded(xr, i0, n, aligned, -INFINITY), st, log));
  }
}

// ---- backward ---------------------------------------------------------------------------------
// Thread-local sum(y * dy) (softmax) or sum(dy) (log-softmax).
template <typename T, int VPT>
__device__ __forceinline__ Sum local_dot(const Vec<T> (&yv)[VPT], const Vec<T> (&gv)[VPT], bool log) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < Vec<T>::N; ++e) s += log ? gv[k].get(e) : yv[k].get(e) * gv[k].get(e);
  return {s};
}

template <typename T>
__device__ __forceinline__ Vec<T> bwd_out(const Vec<T>& yv, const Vec<T>& gv, float s, bool log) {
  Vec<T> o;
#pragma unroll
  for (int e = 0; e < Vec<T>::N; ++e) {
    const float yy = yv.get(e), g = gv.get(e);
    o.set(e, log ? g - fast_exp2(yy * kLog2e) * s : yy * (g - s));
  }
  return o;
}

// Two arrays in registers: at VPT = 4 a 16-bit dtype needs ~70 registers, over the 64 that 1,024
// threads allow, so that shape is limited to 512 threads (and rows past 131,072 use 16-block
// clusters).
template <typename T, int VPT>
constexpr int bwd_block_threads() { return VPT == 4 && sizeof(T) == 2 ? 512 : 1024; }

template <typename T, int VPT>
__global__ void __launch_bounds__(bwd_block_threads<T, VPT>()) softmax_bwd_block_kernel(
    const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t m, int64_t n, int64_t sy,
    int64_t sdy, int64_t sdx, bool aligned, bool log) {
  constexpr int N = Vec<T>::N;
  __shared__ Sum warp_buf[2][32];
  __shared__ ClusterXchg xchg;
  RowSpan rs(xchg);
  const int64_t span = rs.span, first = rs.first;
  uint32_t it = 0;
  for (int64_t row = blockIdx.y; row < m; row += gridDim.y, ++it) {
    Vec<T> yv[VPT], gv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t i0 = (k * span + first) * N;
      yv[k] = load_vec_guarded(y + row * sy, i0, n, aligned, 0.f);
      gv[k] = load_vec_guarded(dy + row * sdy, i0, n, aligned, 0.f);
    }
    const float s = row_allreduce(local_dot<T, VPT>(yv, gv, log), warp_buf, &xchg, it, rs.csize, rs.crank).s;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t i0 = (k * span + first) * N;
      if (i0 < n) store_vec_guarded(dx + row * sdx, i0, n, aligned, bwd_out(yv[k], gv[k], s, log));
    }
  }
  rs.finish();
}

template <typename T, int VPT>
__global__ void __launch_bounds__(1024) softmax_bwd_warp_kernel(
    const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t m, int64_t n, int64_t sy,
    int64_t sdy, int64_t sdx, bool aligned, bool log) {
  constexpr int N = Vec<T>::N;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= m) return;
  Vec<T> yv[VPT], gv[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t i0 = static_cast<int64_t>(k * 32 + lane) * N;
    yv[k] = load_vec_guarded(y + row * sy, i0, n, aligned, 0.f);
    gv[k] = load_vec_guarded(dy + row * sdy, i0, n, aligned, 0.f);
  }
  const float s = warp_allreduce(local_dot<T, VPT>(yv, gv, log)).s;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t i0 = static_cast<int64_t>(k * 32 + lane) * N;
    if (i0 < n) store_vec_guarded(dx + row * sdx, i0, n, aligned, bwd_out(yv[k], gv[k], s, log));
  }
}

template <typename T>
__global__ void __launch_bounds__(1024) softmax_bwd_loop_kernel(
    const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t m, int64_t n, int64_t sy,
    int64_t sdy, int64_t sdx, bool aligned, bool log) {
  constexpr int N = Vec<T>::N;
  __shared__ Sum warp_buf[2][32];
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  uint32_t it = 0;
  for (int64_t row = blockIdx.y; row < m; row += gridDim.y, ++it) {
    Sum t = Sum::identity();
    for (int64_t i0 = static_cast<int64_t>(threadIdx.x) * N; i0 < n; i0 += step) {
      Vec<T> yv[1] = {load_vec_guarded(y + row * sy, i0, n, aligned, 0.f)};
      Vec<T> gv[1] = {load_vec_guarded(dy + row * sdy, i0, n, aligned, 0.f)};
      t = Sum::combine(t, local_dot<T, 1>(yv, gv, log));
    }
    const float s = row_allreduce(t, warp_buf, nullptr, it, 1u, 0u).s;
    for (int64_t i0 = static_cast<int64_t>(threadIdx.x) * N; i0 < n; i0 += step)
      store_vec_guarded(dx + row * sdx, i0, n, aligned,
                        bwd_out(load_vec_guarded(y + row * sy, i0, n, aligned, 0.f),
                                load_vec_guarded(dy + row * sdy, i0, n, aligned, 0.f), s, log));
  }
}

// ---- forward over long rows, staged: the norm forward's skeleton (cluster_rows.cuh) ------------------
// Block b of a cluster owns a fixed column slice of every row (THREADS x VPT 16-byte vectors); its
// slice of a group of `rows` rows reaches shared memory by bulk copies `stages` groups ahead, so
// HBM reads stay in flight while the block reduces, exchanges and writes -- what the one-row-at-a-
// time cluster kernel above lacks. Per row a thread loads its vectors from shared memory into
// registers once for its (max, sum of exp) pair; softmax writes its exps e = exp(x - mt) (mt the
// thread's max), rounded to T, back over x in the stage and mt beside it, so y = e exp(mt - M) / S
// costs a multiply, not a second exp (NOTES item 114: 170 -> 160 us at 262K on the H200). The block
// merges the pairs (warp shuffles, one __syncthreads), block b pushes its slice's pair for every
// row of the group to every partner by st.async (warp r sends row r), and once the partners' pairs
// have landed each warp merges the slices of the group's rows and the block writes y from shared
// memory. The loop is pipelined by one group (run_groups). Log-softmax sums exp2((x - m) log2 e):
// x - m is exact near the max, and y = x - M - log S carries the sum's error whole (the FMA form's
// rounding of m log2 e would not cancel, NOTES item 108). Blocks an SM (PER_SM, 1 or 2) bound the
// registers; shared memory decides how many blocks share an SM.
template <typename T, int THREADS, int VPT, bool LOG, int PER_SM>
__global__ void __launch_bounds__(THREADS, PER_SM) softmax_fwd_cluster_kernel(
    const T* __restrict__ x, T* __restrict__ y, int64_t m, int64_t n, int64_t sx, int64_t sy, int rows, int stages) {
  constexpr int N = Vec<T>::N;
  constexpr int WARPS = THREADS / 32;
  // [stages][rows][slice] of T, then [stages][rows][THREADS] floats: each thread's max (softmax)
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ ClusterRowShared sh;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned csize = cluster.num_blocks(), crank = cluster.block_rank();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t slice = static_cast<int64_t>(THREADS) * VPT * N, col0 = static_cast<int64_t>(crank) * slice;
  const uint32_t row_bytes = static_cast<uint32_t>(slice * sizeof(T));
  const Groups groups(m, rows, csize);
  const uint32_t stage_bytes = static_cast<uint32_t>(rows) * row_bytes;
  float* const thread_max = reinterpret_cast<float*>(stage_mem + static_cast<size_t>(stages) * stage_bytes);

  init_barriers(sh, stages, cluster);

  const Stages st{stage_mem, stage_bytes, row_bytes};
  auto issue = [&](int64_t it, int s) { st.load_group(groups, it, s, &sh.full[s], x, sx, col0); };
  auto vec_at = [&](int s, int r, int k) {
    Vec<T> v;
    v.raw = *st.vec(s, r, tid + k * THREADS);
    return v;
  };
  auto stats_and_send = [&](int64_t it) {
    const int s = static_cast<int>(it % stages), slot = static_cast<int>(it % kSlots);
    int64_t row0;
    const int nr = groups.at(it, row0);
    const uint32_t xbar = arm_exchange(sh, it, nr, csize);
    wait_stage(sh, it, stages);
    for (int r = 0; r < nr; ++r) {
      Vec<T> v[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k) v[k] = vec_at(s, r, k);
      MaxSum t;
      if constexpr (!LOG) {   // the exps replace x in the stage (each thread rewrites only its own vectors)
        t = local_exps<T, VPT>(v);
#pragma unroll
        for (int k = 0; k < VPT; ++k)
          *st.vec(s, r, tid + k * THREADS) = v[k].raw;
        thread_max[(s * rows + r) * THREADS + tid] = t.m;
      } else {
        t = local_stats<T, VPT, LOG, N>(v);
      }
      t = warp_allreduce(t);
      if (lane == 0) sh.warp_stats[r][warp] = t.pack();
    }
    __syncthreads();
    if (warp < nr) {
      MaxSum t = lane < WARPS ? MaxSum::unpack(sh.warp_stats[warp][lane]) : MaxSum::identity();
      t = warp_allreduce(t);
      if (lane < static_cast<int>(csize))
        st_async_f2(smem_u32(&sh.slots[slot][crank][warp]), xbar, lane, t.m, t.s);
    }
  };
  // group it, once its partners' pairs have landed: lane l of every warp holds row l / csize, slice
  // l % csize; a butterfly over the csize lanes of a row merges them; then y from shared memory
  auto write = [&](int64_t, int s, int slot, int64_t row0, int nr) {
    const int lr = lane / static_cast<int>(csize), lc = lane % static_cast<int>(csize);
    MaxSum t = lr < nr ? MaxSum::unpack(sh.slots[slot][lc][lr]) : MaxSum::identity();
    for (int o = 1; o < static_cast<int>(csize); o <<= 1) t = MaxSum::combine(t, t.shfl(o));
    // an all -inf row: M = -inf and S = 0 give NaN, as torch does (exp(-inf - -inf))
    for (int r = 0; r < nr; ++r) {
      const float M = __shfl_sync(0xffffffffu, t.m, r * static_cast<int>(csize));
      const float S = __shfl_sync(0xffffffffu, t.s, r * static_cast<int>(csize));
      T* yr = y + (row0 + r) * sy + col0 + tid * N;
      // softmax: y = e exp(mt - M) / S from the stage's exps (an all -inf thread's e are 0, scale 0;
      // an all -inf row NaN); log-softmax: y = x - (M + log S) from the stage's x
      float scale = 0.f, lse = 0.f;
      if constexpr (LOG) lse = M + __logf(S);
      else scale = fast_exp2(fmaf(thread_max[(s * rows + r) * THREADS + tid] - M, kLog2e, -__log2f(S)));
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const Vec<T> v = vec_at(s, r, k);
        Vec<T> o;
#pragma unroll
        for (int e = 0; e < N; e += 2)
          o.set2(e, LOG ? v.get(e) - lse : v.get(e) * scale, LOG ? v.get(e + 1) - lse : v.get(e + 1) * scale);
        store_vec(yr + k * THREADS * N, o);
      }
    }
  };
  run_groups(sh, groups, stages, issue, stats_and_send, write);
  cluster.sync();   // no block leaves while a partner's st.async may still target it
}

// ---- launch -----------------------------------------------------------------------------------

// Grid and launch of a block-per-row (cluster) kernel; cluster > 1 goes through cudaLaunchKernelEx.
template <typename Kernel, typename... Args>
cudaError_t launch_rows(Kernel kernel, int64_t m, const RowConfig& cfg, size_t smem, cudaStream_t stream,
                        Args... args) {
  cudaLaunchConfig_t lc;
  cudaLaunchAttribute attr;
  const cudaError_t set = cluster_launch_config(kernel, static_cast<unsigned>(cfg.cluster),
                                                static_cast<unsigned>(cfg.threads), smem, stream, lc, attr);
  if (set != cudaSuccess) return set;
  // Clusters: a persistent grid (as many clusters as fit, looping over rows), so the mbarrier set-up
  // and the final cluster barrier are paid once per block. Single blocks: one per row (up to the
  // grid's 65,535 limit) -- measured on an H100, a persistent grid of single blocks ran 6-8%
  // slower (16384 x {4096, 8192, 32768} bf16: 87-90% of the copy roof against 93-97%).
  int64_t rows = m < 65535 ? m : 65535;
  if (cfg.cluster > 1) {
    const int fit = resident_clusters(reinterpret_cast<const void*>(kernel), lc);
    if (fit <= 0) return cudaErrorInvalidValue;   // this cluster shape cannot be placed on the device
    if (rows > fit) rows = fit;
  }
  lc.gridDim = dim3(static_cast<unsigned>(cfg.cluster), static_cast<unsigned>(rows), 1);
  cudaError_t err = cudaLaunchKernelEx(&lc, kernel, args...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <typename T>
bool row_aligned(const T* p, int64_t stride) {
  return aligned16(p) && (stride * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

// VPT <= 4: at 4 vectors (32 bf16 held as 32 fp32) a thread already uses the 64 registers that
// __launch_bounds__(1024) allows; 8 spills. Longer rows take more threads or a cluster.
const char* config_error(const RowConfig& c, int64_t n, int vec, bool bwd) {
  if (c.threads < 32 || c.threads > 1024 || c.threads % 32 != 0) return "threads must be a multiple of 32 from 32 to 1024";
  if (c.cluster != 1 && c.cluster != 2 && c.cluster != 4 && c.cluster != 8 && c.cluster != 16)
    return "cluster must be 1, 2, 4, 8 or 16";
  if (c.vpt == 0) return c.cluster == 1 && c.rows_per_block == 1 ? nullptr : "the looped shape (vpt 0) takes cluster 1, 1 row per block";
  if (c.vpt != 1 && c.vpt != 2 && c.vpt != 4) return "vectors per thread must be 0 (looped), 1, 2 or 4";
  if (c.rows_per_block > 1 && (c.threads != 32 || c.cluster != 1 || c.rows_per_block > 32))
    return "several rows per block means one warp per row: threads 32, cluster 1, at most 32 rows";
  if (c.rows_per_block < 1) return "rows per block must be at least 1";
  if (static_cast<int64_t>(c.threads) * c.vpt * c.cluster * vec < n)
    return "threads x vectors per thread x cluster x (16 bytes of elements) is smaller than the row";
  if (bwd && vec == 8 && c.vpt == 4 && c.rows_per_block == 1 && c.threads > 512)
    return "the 16-bit backward at 4 vectors per thread runs at most 512 threads (registers)";
  return nullptr;
}

template <typename T>
bool config_ok(const RowConfig& c, int64_t n, bool bwd) {
  return config_error(c, n, Vec<T>::N, bwd) == nullptr;
}

}  // namespace

const char* softmax_config_error(DType dt, int64_t n, RowConfig cfg, bool backward) {
  return config_error(cfg, n, dt == DType::f32 ? 4 : 8, backward);
}

cudaError_t softmax_fwd(DType dt, const void* x, void* y, int64_t m, int64_t n, int64_t sx, int64_t sy, bool log,
                        RowConfig cfg, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaErrorInvalidValue;
  return dispatch(dt, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if (!config_ok<T>(cfg, n, false)) return cudaErrorInvalidValue;
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    const bool aligned = row_aligned(xp, sx) && row_aligned(yp, sy);
    if (cfg.vpt == 0) return launch_rows(softmax_fwd_loop_kernel<T>, m, cfg, 0, stream, xp, yp, m, n, sx, sy, aligned, log);
    if (cfg.rows_per_block > 1) {
      const int64_t blocks = ceil_div(m, cfg.rows_per_block);
      if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
      const dim3 grid(static_cast<unsigned>(blocks)), block(32 * cfg.rows_per_block);
      switch (cfg.vpt) {
        case 1: softmax_fwd_warp_kernel<T, 1><<<grid, block, 0, stream>>>(xp, yp, m, n, sx, sy, aligned, log); break;
        case 2: softmax_fwd_warp_kernel<T, 2><<<grid, block, 0, stream>>>(xp, yp, m, n, sx, sy, aligned, log); break;
        default: softmax_fwd_warp_kernel<T, 4><<<grid, block, 0, stream>>>(xp, yp, m, n, sx, sy, aligned, log); break;
      }
      return cudaGetLastError();
    }
    // prefetch where a block loops over rows: cluster launches are persistent (launch_rows)
    const bool prefetch = cfg.cluster > 1 && aligned && m > 1;
    const size_t smem = prefetch ? static_cast<size_t>(cfg.threads) * cfg.vpt * 16 : 0;
    switch (cfg.vpt) {
      case 1: return launch_rows(softmax_fwd_block_kernel<T, 1>, m, cfg, smem, stream, xp, yp, m, n, sx, sy, aligned, log, prefetch);
      case 2: return launch_rows(softmax_fwd_block_kernel<T, 2>, m, cfg, smem, stream, xp, yp, m, n, sx, sy, aligned, log, prefetch);
      default: return launch_rows(softmax_fwd_block_kernel<T, 4>, m, cfg, smem, stream, xp, yp, m, n, sx, sy, aligned, log, prefetch);
    }
  });
}

cudaError_t softmax_bwd(DType dt, const void* y, const void* dy, void* dx, int64_t m, int64_t n, int64_t sy,
                        int64_t sdy, int64_t sdx, bool log, RowConfig cfg, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaErrorInvalidValue;
  return dispatch(dt, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if (!config_ok<T>(cfg, n, true)) return cudaErrorInvalidValue;
    const T* yp = static_cast<const T*>(y);
    const T* gp = static_cast<const T*>(dy);
    T* xp = static_cast<T*>(dx);
    const bool aligned = row_aligned(yp, sy) && row_aligned(gp, sdy) && row_aligned(xp, sdx);
    if (cfg.vpt == 0)
      return launch_rows(softmax_bwd_loop_kernel<T>, m, cfg, 0, stream, yp, gp, xp, m, n, sy, sdy, sdx, aligned, log);
    if (cfg.rows_per_block > 1) {
      const int64_t blocks = ceil_div(m, cfg.rows_per_block);
      if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
      const dim3 grid(static_cast<unsigned>(blocks)), block(32 * cfg.rows_per_block);
      switch (cfg.vpt) {
        case 1: softmax_bwd_warp_kernel<T, 1><<<grid, block, 0, stream>>>(yp, gp, xp, m, n, sy, sdy, sdx, aligned, log); break;
        case 2: softmax_bwd_warp_kernel<T, 2><<<grid, block, 0, stream>>>(yp, gp, xp, m, n, sy, sdy, sdx, aligned, log); break;
        default: softmax_bwd_warp_kernel<T, 4><<<grid, block, 0, stream>>>(yp, gp, xp, m, n, sy, sdy, sdx, aligned, log); break;
      }
      return cudaGetLastError();
    }
    switch (cfg.vpt) {
      case 1: return launch_rows(softmax_bwd_block_kernel<T, 1>, m, cfg, 0, stream, yp, gp, xp, m, n, sy, sdy, sdx, aligned, log);
      case 2: return launch_rows(softmax_bwd_block_kernel<T, 2>, m, cfg, 0, stream, yp, gp, xp, m, n, sy, sdy, sdx, aligned, log);
      default: return launch_rows(softmax_bwd_block_kernel<T, 4>, m, cfg, 0, stream, yp, gp, xp, m, n, sy, sdy, sdx, aligned, log);
    }
  });
}

// The registers a thread gets: 65,536 over the SM's threads (per_sm blocks), at most 255. At 1,024
// threads an SM (64 registers a thread) up to 2 vectors a thread fit; 4 spill (4-52 bytes: a row's
// packed vectors, the exps kept in them, the pair reduction around them), and those shapes are not
// instantiated. (2 blocks an SM: at most 512 threads a block, cluster_rows_shape_error.)
constexpr bool softmax_cluster_fits(int threads, int vpt, int per_sm) {
  return !(threads * per_sm == 1024 && vpt >= 4);
}

const char* softmax_cluster_fit_error(const NormClusterConfig& c) {
  return softmax_cluster_fits(c.threads, c.vpt, c.per_sm)
             ? nullptr
             : "1,024 threads an SM (threads x blocks an SM) hold at most 2 vectors a thread here (registers)";
}

const char* softmax_cluster_config_error(DType dt, int64_t n, NormClusterConfig cfg) {
  return cluster_rows_shape_error(dt, n, cfg, 1, softmax_cluster_fit_error, 4 * cfg.threads);
}

cudaError_t softmax_fwd_cluster(DType dt, const void* x, void* y, int64_t m, int64_t n, int64_t sx, int64_t sy,
                                bool log, NormClusterConfig c, cudaStream_t stream) {
  if (m <= 0 || softmax_cluster_config_error(dt, n, c) != nullptr) return cudaErrorInvalidValue;
  return dispatch(dt, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 4) {
      return cudaErrorInvalidValue;
    } else {
      const size_t smem = static_cast<size_t>(c.stages) * c.rows * ((n / c.cluster) * sizeof(T) + c.threads * 4);
      const T* xp = static_cast<const T*>(x);
      T* yp = static_cast<T*>(y);
#define WF_LAUNCH(TH, V, P)                                                                                    \
      if constexpr (TH * P <= 1024 && softmax_cluster_fits(TH, V, P))                                          \
      if (c.threads == TH && c.vpt == V && c.per_sm == P)                                                      \
        return log ? launch_cluster_rows(softmax_fwd_cluster_kernel<T, TH, V, true, P>, c, m, smem, 0, stream,  \
                                         xp, yp, m, n, sx, sy, c.rows, c.stages)                              \
                   : launch_cluster_rows(softmax_fwd_cluster_kernel<T, TH, V, false, P>, c, m, smem, 0, stream, \
                                         xp, yp, m, n, sx, sy, c.rows, c.stages);
#define WF_CASE(TH, V) WF_LAUNCH(TH, V, 1) WF_LAUNCH(TH, V, 2)
      WF_CLUSTER_ROW_SHAPES(WF_CASE)
#undef WF_CASE
#undef WF_LAUNCH
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace wf
