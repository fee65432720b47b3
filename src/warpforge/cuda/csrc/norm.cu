// LayerNorm forward, and LayerNorm and RMSNorm backward, over long rows, one row spread over a
// thread-block cluster (Hopper, sm_90). The forward is described here; the backward (below) has
// the same structure.
//
//   y = (x - mean) * rstd * w + b,   mean and rstd = 1 / sqrt(var + eps) over each row of n
//
// Byte model: read x, write y (2 * M * N * s; w and b once). Why a cluster kernel: on the H200 the
// Triton kernels hold at most a ~64 KB share of a row in a program, so past 16K columns they
// either re-read x (the two-pass loop and pipe kernels) or exchange partial statistics through
// global memory, and every program re-reads w and b (2 x N x s more L2 traffic a row). At 32K the
// L2, not HBM, was the limit (ncu, NOTES item 66) and the long-row forward read 74-85% of copy.
// Here each block of a cluster owns a fixed column slice of every row:
//
// - its slice of w and b is loaded once into registers and reused for every row it normalises
//   (the grid is persistent: as many clusters as fit, each walking groups of rows);
// - its slice of x arrives in shared memory by the bulk copy engine (cp.async.bulk, one copy a
//   row, completing on a "full" mbarrier), STAGES groups ahead, so HBM reads stay in flight while
//   the block reduces, exchanges and writes;
// - statistics: each thread reduces its values to (mean, M2) in one pass about a pivot (its first
//   value), the block merges those by Chan's formula (warp shuffles, one __syncthreads), and each
//   block pushes its slice's (mean, M2) for every row of the group into every partner's shared
//   memory by st.async, completing on the partner's exchange mbarrier -- no cluster-wide barrier
//   per group (that one waits for the group's global stores to be visible cluster-wide, softmax.cu);
//   the loop is software-pipelined so that exchange overlaps the next group's reduction;
// - y = ((x - mean) * rstd) * w + b from shared memory to global, 16-byte stores.
//
// x is read once from HBM (and twice from shared memory); nothing is re-read from L2. Statistics
// are fp32 for every dtype. Measured on an H200 (NOTES items 86, 90): 32K, 65K and 262K at 88% of
// copy against the Triton kernels' 85%, 82% and 74%; what made the difference after the first
// version was instructions an element (the kernel was issue-bound at ~23, now ~7), so keep the inner
// loops lean.
#include <cooperative_groups.h>

#include "cluster_rows.cuh"
#include "common.cuh"

namespace cg = cooperative_groups;

namespace wf {
namespace {

// Two equal-count groups of c values each, merged (Chan et al.): the mean of the means, and
// M2 = M2a + M2b + (mean_b - mean_a)^2 c / 2.
__device__ __forceinline__ float2 merge_equal(float2 a, float2 b, float c) {
  const float d = b.x - a.x;
  return make_float2(0.5f * (a.x + b.x), a.y + b.y + d * d * (0.5f * c));
}

// The two 16-bit values of `p` as floats, converted where they are used. For w and b held packed
// (4 registers a vector): the volatile asm keeps the compiler from hoisting the conversions out of
// the row loop, which would hold 16 fp32 registers a vector and spill.
__device__ __forceinline__ float2 unpack_pinned(uint32_t p, __nv_bfloat16) {
  uint32_t lo, hi;
  asm volatile("shl.b32 %0, %1, 16;" : "=r"(lo) : "r"(p));
  asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(hi) : "r"(p));
  return make_float2(__uint_as_float(lo), __uint_as_float(hi));
}
__device__ __forceinline__ float2 unpack_pinned(uint32_t p, __half) {
  float lo, hi;
  asm volatile("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
               : "=f"(lo), "=f"(hi) : "r"(p));
  return make_float2(lo, hi);
}

// One parameter vector (w or b) over this thread's VPT vectors: as fp32 where the registers allow
// (no conversion per element), else packed and converted at each use. Absent (null): FILL (0 or
// 1) everywhere; with OFFSET, `add` is added to every present value (RMSNorm's weight offset).
template <typename T, int VPT, bool F32, int FILL, bool OFFSET>
struct Param;

template <typename T, int VPT, int FILL, bool OFFSET>
struct Param<T, VPT, true, FILL, OFFSET> {
  float v[VPT][8];
  __device__ __forceinline__ void load(const T* p, int64_t off, int k, float add) {
    const Vec<T> raw{p ? *reinterpret_cast<const uint4*>(p + off) : uint4{}};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[k][e] = p ? (OFFSET ? raw.get(e) + add : raw.get(e)) : float(FILL);
  }
  __device__ __forceinline__ float2 pair(int k, int e) const { return make_float2(v[k][e], v[k][e + 1]); }
};

template <typename T, int VPT, int FILL, bool OFFSET>
struct Param<T, VPT, false, FILL, OFFSET> {
  uint4 v[VPT];
  bool present;
  float add;
  __device__ __forceinline__ void load(const T* p, int64_t off, int k, float add_) {
    present = p != nullptr;
    add = add_;
    v[k] = present ? *reinterpret_cast<const uint4*>(p + off) : uint4{};
  }
  __device__ __forceinline__ float2 pair(int k, int e) const {
    if (!present) return make_float2(float(FILL), float(FILL));
    const float2 f = unpack_pinned(reinterpret_cast<const uint32_t*>(&v[k])[e / 2], T{});
    return OFFSET ? make_float2(f.x + add, f.y + add) : f;
  }
};

// Block b of a cluster of csize owns columns [b * slice, (b + 1) * slice) of every row, exactly
// THREADS x VPT 16-byte vectors: thread t owns vectors t + k * THREADS. A group is `rows`
// consecutive rows; cluster c takes groups c, c + clusters, ...
//
// The loop is software-pipelined by one group: iteration i computes group i + 1's statistics
// and sends them, then waits for group i's partners and writes group i, so the exchange's round
// trip overlaps the next group's reduction. The exchange therefore keeps 4 slot buffers: a
// partner sends group g + 4 (into g's buffer) only after it has received this block's group g + 2,
// which this block sends after it has read group g's slots.
template <typename T, int THREADS, int VPT>
__global__ void __launch_bounds__(THREADS, 1) layer_norm_fwd_cluster_kernel(
    const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ w, const T* __restrict__ b,
    float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t m, int64_t n, int64_t sx, int64_t sy,
    float eps, int rows, int stages) {
  constexpr int N = Vec<T>::N;
  constexpr int WARPS = THREADS / 32;
  constexpr float kThreadCount = VPT * N;              // values a thread holds of a row
  constexpr bool kF32 = VPT * 16 <= 65536 / THREADS - 48;
  extern __shared__ __align__(128) unsigned char stage_mem[];   // [stages][rows][slice] of T
  __shared__ ClusterRowShared sh;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned csize = cluster.num_blocks(), crank = cluster.block_rank();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t slice = static_cast<int64_t>(THREADS) * VPT * N, col0 = static_cast<int64_t>(crank) * slice;
  const uint32_t row_bytes = static_cast<uint32_t>(slice * sizeof(T));
  const Groups groups(m, rows, csize);
  const uint32_t stage_bytes = static_cast<uint32_t>(rows) * row_bytes;
  const float slice_f = static_cast<float>(slice);

  Param<T, VPT, kF32, 1, false> wp;
  Param<T, VPT, kF32, 0, false> bp;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    wp.load(w, col0 + static_cast<int64_t>(tid + k * THREADS) * N, k, 0.f);
    bp.load(b, col0 + static_cast<int64_t>(tid + k * THREADS) * N, k, 0.f);
  }

  init_barriers(sh, stages, cluster);

  const Stages st{stage_mem, stage_bytes, row_bytes};
  // the bulk copies of this block's slice of the it-th group's rows into stage `s`
  auto issue = [&](int64_t it, int s) { st.load_group(groups, it, s, &sh.full[s], x, sx, col0); };
  // this thread's k-th vector of row r of stage s
  auto vec_at = [&](int s, int r, int k) { return *st.vec(s, r, tid + k * THREADS); };
  // group it's statistics: per thread (pivot: its first value, so the sum of squares about it is at
  // most VPT x 8 times M2 -- bounded cancellation), merged over the block by equal-count Chan
  // steps, then pushed to every partner (warp r sends row r)
  auto stats_and_send = [&](int64_t it) {
    const int s = static_cast<int>(it % stages), slot = static_cast<int>(it % kSlots);
    int64_t row0;
    const int nr = groups.at(it, row0);
    const uint32_t xbar = arm_exchange(sh, it, nr, csize);
    wait_stage(sh, it, stages);
    for (int r = 0; r < nr; ++r) {
      float pivot = 0.f, s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const uint4 v = vec_at(s, r, k);
        if (k == 0) pivot = Vec<T>{v}.get(0);
#pragma unroll
        for (int e = 0; e < N; e += 2) {
          const float2 xp = pair_at<T>(v, e);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float d = (h ? xp.y : xp.x) - pivot;
            s1 += d;
            s2 = fmaf(d, d, s2);
          }
        }
      }
      const float dm = s1 * (1.f / kThreadCount);
      float2 t = make_float2(pivot + dm, fmaxf(fmaf(-s1, dm, s2), 0.f));
      float c = kThreadCount;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1, c *= 2.f)
        t = merge_equal(t, make_float2(shfl_xor(t.x, o), shfl_xor(t.y, o)), c);
      if (lane == 0) sh.warp_stats[r][warp] = t;
    }
    __syncthreads();
    if (warp < nr) {
      float2 t = sh.warp_stats[warp][lane % WARPS];
      float c = 32.f * kThreadCount;
#pragma unroll
      for (int o = 1; o < WARPS; o <<= 1, c *= 2.f)
        t = merge_equal(t, make_float2(shfl_xor(t.x, o), shfl_xor(t.y, o)), c);
      if (lane < static_cast<int>(csize))
        st_async_f2(smem_u32(&sh.slots[slot][crank][warp]), xbar, lane, t.x, t.y);
    }
  };

  // group it, once its partners' statistics have landed: every warp merges the group's slices
  // (lane l holds row l / csize, slice l % csize), then normalises the rows from shared memory
  auto normalise = [&](int64_t, int s, int slot, int64_t row0, int nr) {
    const int lr = lane / static_cast<int>(csize), lc = lane % static_cast<int>(csize);
    const bool live = lr < nr;
    const float2 p = live ? sh.slots[slot][lc][lr] : make_float2(0.f, 0.f);
    float msum = p.x;
    for (int o = 1; o < static_cast<int>(csize); o <<= 1) msum += shfl_xor(msum, o);
    const float mean_l = msum / static_cast<float>(csize);
    const float d = p.x - mean_l;
    float m2sum = fmaf(slice_f * d, d, p.y);
    for (int o = 1; o < static_cast<int>(csize); o <<= 1) m2sum += shfl_xor(m2sum, o);
    const float rstd_l = rsqrtf(fmaxf(m2sum / static_cast<float>(n), 0.f) + eps);
    if (crank == 0 && lc == 0 && live && warp == 0) {
      if (mean_out) mean_out[row0 + lr] = mean_l;
      rstd_out[row0 + lr] = rstd_l;
    }
    for (int r = 0; r < nr; ++r) {
      const float mean = __shfl_sync(0xffffffffu, mean_l, r * static_cast<int>(csize));
      const float rstd = __shfl_sync(0xffffffffu, rstd_l, r * static_cast<int>(csize));
      T* yr = y + (row0 + r) * sy + col0 + tid * N;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const uint4 xv = vec_at(s, r, k);
        Vec<T> o;
#pragma unroll
        for (int e = 0; e < N; e += 2) {
          const float2 wv = wp.pair(k, e), bv = bp.pair(k, e), xp = pair_at<T>(xv, e);
          // (x - mean) * rstd, not x * rstd - mean * rstd: no cancellation when |mean| >> std
          o.set(e, fmaf((xp.x - mean) * rstd, wv.x, bv.x));
          o.set(e + 1, fmaf((xp.y - mean) * rstd, wv.y, bv.y));
        }
        store_vec(yr + k * THREADS * N, o);
      }
    }
  };
  run_groups(sh, groups, stages, issue, stats_and_send, normalise);
  cluster.sync();   // no block leaves while a partner's st.async may still target it
}

// ---- backward ---------------------------------------------------------------------------------
//   x_hat = (x - mean) * rstd (RMSNorm: x * rstd), g = dy * w (RMSNorm: dy * (offset + w)),
//   dx = rstd * (g - x_hat * mean(g * x_hat) - mean(g))   (RMSNorm: no mean(g) term),
//   dw = sum over rows of dy * x_hat, db = sum over rows of dy.
// Byte model: read x and dy (and dsum, below), write dx (3 * M * N * s; 4 with dsum). The same
// cluster structure as the forward:
// block b holds its slice of w in registers and accumulates its slice of dw and db in fp32 registers
// over every row it walks (deterministic: a fixed order a thread); x and dy arrive in shared memory
// by bulk copies, `stages` groups ahead; the slices' sums of g * x_hat and g go to every partner by
// st.async; the loop is pipelined by one group as in the forward (4 exchange slots), and each
// group's saved mean and rstd are loaded during the group before. Measured on an H200 (NOTES items
// 89, 90), backward alone: LayerNorm 32K / 65K / 262K at 85 / 87 / 82% of copy, RMSNorm 91 / 94 /
// 90%, against the Triton kernels' 61-75%. Per group the block pays a fixed cost (barriers, the
// exchange), so a group must be large (64 KB of x and dy a block); at 8 warps an SM the kernel is
// latency- and issue-bound, so instructions an element count (SASS, LayerNorm: ~20 -> ~16 over
// both passes was worth 2-8 points). Holding x and dy in registers to free each stage after the
// first pass (measured as a variant) did not help. At the end cluster c writes its dw/db slice
// into row c of the (parts, N) fp32 partial buffers, and zeros into rows c + clusters,
// c + 2 clusters, ... < parts that no cluster ran; the caller sums the rows.
//
// With DS_ROWS > 0 (add+RMSNorm's backward: rows <= DS_ROWS a group) dx also takes dsum, the
// gradient reaching the residual sum directly: dx = (the above) + dsum. dsum is read once and used
// once, and it does not fit in shared memory beside 3 stages of x and dy, so each thread loads its
// vectors of the next group's dsum rows into registers (4 a vector and row) at the end of this
// group's write. That is not a whole group ahead: thread 0's fence before refilling a stage
// (MEMBAR.ALL.CTA) waits for its outstanding loads, and the block with it, so part of a DRAM trip
// a group stays exposed. Loading them elsewhere measured slower (H200, 2048 x 65536 bf16: 318 us
// here; at the next reduction's start, where st.async's release waits for them, 356; after the
// sends, with an L2 prefetch by the bulk copy engine, 331; NOTES item 117). Routed where it beats
// the Triton backward (335 us): 65K on the H200 (heuristics.NORM_BWD_DSUM); 262K stays Triton.
template <typename T, int THREADS, int VPT, bool RMS, int DS_ROWS>
__global__ void __launch_bounds__(THREADS, 1) norm_bwd_cluster_kernel(
    const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ dsum, T* __restrict__ dx,
    const T* __restrict__ w, const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
    float* __restrict__ dw_part, float* __restrict__ db_part, int64_t parts, int64_t m, int64_t n, int64_t sx,
    int64_t sdy, int64_t sds, int64_t sdx, float offset, int rows, int stages) {
  constexpr int N = Vec<T>::N;
  constexpr int WARPS = THREADS / 32;
  // dw and db accumulators take 16 registers a vector, dsum 4 a vector and row; w goes fp32 only if
  // 8 more a vector fit
  constexpr bool kF32 = VPT * (24 + 4 * DS_ROWS) <= 65536 / THREADS - 40;
  extern __shared__ __align__(128) unsigned char stage_mem[];   // [stages][rows][x, dy][slice] of T
  __shared__ ClusterRowShared sh;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned csize = cluster.num_blocks(), crank = cluster.block_rank();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t slice = static_cast<int64_t>(THREADS) * VPT * N, col0 = static_cast<int64_t>(crank) * slice;
  const uint32_t row_bytes = static_cast<uint32_t>(slice * sizeof(T));
  const Groups groups(m, rows, csize);
  const uint32_t stage_bytes = 2u * static_cast<uint32_t>(rows) * row_bytes;
  const float inv_n = 1.f / static_cast<float>(n);

  Param<T, VPT, kF32, 1, RMS> wp;
#pragma unroll
  for (int k = 0; k < VPT; ++k) wp.load(w, col0 + static_cast<int64_t>(tid + k * THREADS) * N, k, offset);
  float dwa[VPT][8], dba[VPT][8];
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < N; ++e) dwa[k][e] = dba[k][e] = 0.f;

  init_barriers(sh, stages, cluster);

  auto issue = [&](int64_t it, int s) {
    int64_t row0;
    const int nr = groups.at(it, row0);
    const uint32_t bar = smem_u32(&sh.full[s]);
    mbar_arrive_expect_tx(bar, 2u * static_cast<uint32_t>(nr) * row_bytes);
    const uint32_t dst = smem_u32(stage_mem) + s * stage_bytes;
    for (int r = 0; r < nr; ++r) {
      bulk_load(dst + (2 * r) * row_bytes, x + (row0 + r) * sx + col0, row_bytes, bar);
      bulk_load(dst + (2 * r + 1) * row_bytes, dy + (row0 + r) * sdy + col0, row_bytes, bar);
    }
  };
  auto vec_at = [&](int s, int r, int which, int k) {
    return *reinterpret_cast<const uint4*>(stage_mem + s * stage_bytes + (2 * r + which) * row_bytes +
                                           (tid + k * THREADS) * 16);
  };
  // this thread's row (tid < rows) of group it's saved statistics
  auto load_stats = [&](int64_t it) {
    int64_t row0;
    const int nr = groups.at(it, row0);
    return tid < nr ? make_float2(RMS ? 0.f : mean_in[row0 + tid], rstd_in[row0 + tid]) : make_float2(0.f, 0.f);
  };
  float2 pre = make_float2(0.f, 0.f);
  // this thread's vectors of group it's dsum rows (read once: streamed past the caches)
  uint4 ds[DS_ROWS > 0 ? DS_ROWS : 1][VPT];
  auto load_dsum = [&](int64_t it) {
    if constexpr (DS_ROWS > 0) {
      int64_t row0;
      const int nr = groups.at(it, row0);
#pragma unroll
      for (int r = 0; r < DS_ROWS; ++r)
#pragma unroll
        for (int k = 0; k < VPT; ++k)
          if (r < nr)
            ds[r][k] = __ldcs(reinterpret_cast<const uint4*>(dsum + (row0 + r) * sds + col0 +
                                                            static_cast<int64_t>(tid + k * THREADS) * N));
    }
  };
  // group it's slice sums of g * x_hat and g (RMSNorm: the first only), sent to every partner;
  // this thread's dw and db terms of the group's rows added on the way
  auto sums_and_send = [&](int64_t it) {
    const int s = static_cast<int>(it % stages), slot = static_cast<int>(it % kSlots);
    int64_t row0;
    const int nr = groups.at(it, row0);
    const uint32_t xbar = arm_exchange(sh, it, nr, csize);
    // the group's saved statistics (thread r holds row r's) go to shared memory for both passes;
    // the next group's are loaded now, a whole group ahead of their use. Loaded here and used
    // after this group's barrier, their latency (an L2 miss, ~1 us under this load) sat on every
    // group's chain: that cost 10-15 points of copy at 32K-262K (NOTES item 89)
    if (tid < nr) sh.row_stats[slot][tid] = pre;
    if (it + 1 < groups.mine) pre = load_stats(it + 1);
    wait_stage(sh, it, stages);
    __syncthreads();
    for (int r = 0; r < nr; ++r) {
      const float2 st = sh.row_stats[slot][r];
      const float mean = st.x, rstd = st.y;
      float sgx_ = 0.f, sg_ = 0.f, sgx2 = 0.f, sg2 = 0.f;   // two chains: odd vectors add into the second
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        float& sgx = (k & 1) ? sgx2 : sgx_;
        float& sg = (k & 1) ? sg2 : sg_;
        const uint4 xv = vec_at(s, r, 0, k), gv = vec_at(s, r, 1, k);
#pragma unroll
        for (int e = 0; e < N; e += 2) {
          const float2 wv = wp.pair(k, e), xp = pair_at<T>(xv, e), dp = pair_at<T>(gv, e);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float x = h ? xp.y : xp.x, d = h ? dp.y : dp.x;
            const float xh = (RMS ? x : x - mean) * rstd;
            const float g = d * (h ? wv.y : wv.x);
            sgx = fmaf(g, xh, sgx);
            if (!RMS) sg += g;
            dwa[k][e + h] = fmaf(d, xh, dwa[k][e + h]);
            if (!RMS) dba[k][e + h] += d;
          }
        }
      }
      float sgx = sgx_ + sgx2, sg = sg_ + sg2;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        sgx += shfl_xor(sgx, o);
        if (!RMS) sg += shfl_xor(sg, o);
      }
      if (lane == 0) sh.warp_stats[r][warp] = make_float2(sgx, sg);
    }
    __syncthreads();
    if (warp < nr) {
      float2 t = lane < WARPS ? sh.warp_stats[warp][lane] : make_float2(0.f, 0.f);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        t.x += shfl_xor(t.x, o);
        t.y += shfl_xor(t.y, o);
      }
      if (lane < static_cast<int>(csize))
        st_async_f2(smem_u32(&sh.slots[slot][crank][warp]), xbar, lane, t.x, t.y);
    }
  };

  // group it, once its partners' sums have landed (lane l holds row l / csize, slice l % csize; the
  // segment sums are the rows' totals): dx from shared memory
  auto finish = [&](int64_t it, int s, int slot, int64_t row0, int nr) {
    const int lr = lane / static_cast<int>(csize), lc = lane % static_cast<int>(csize);
    float2 p = lr < nr ? sh.slots[slot][lc][lr] : make_float2(0.f, 0.f);
    for (int o = 1; o < static_cast<int>(csize); o <<= 1) {
      p.x += shfl_xor(p.x, o);
      p.y += shfl_xor(p.y, o);
    }
    // row r of the group (dsr: its dsum vectors, with DS_ROWS)
    auto write_row = [&](int r, const uint4* dsr) {
      const float c1 = __shfl_sync(0xffffffffu, p.x, r * static_cast<int>(csize)) * inv_n;
      const float c2 = RMS ? 0.f : __shfl_sync(0xffffffffu, p.y, r * static_cast<int>(csize)) * inv_n;
      const float2 st = sh.row_stats[slot][r];
      const float mean = st.x, rstd = st.y;
      // dx = rstd (g - x_hat c1 - c2) = g rstd + (x - mean) a + b2: two FMAs an element
      const float a = -c1 * rstd * rstd, b2 = -c2 * rstd;
      T* dr = dx + (row0 + r) * sdx + col0 + tid * N;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const uint4 xv = vec_at(s, r, 0, k), gv = vec_at(s, r, 1, k);
        Vec<T> o;
#pragma unroll
        for (int e = 0; e < N; e += 2) {
          const float2 wv = wp.pair(k, e), xp = pair_at<T>(xv, e), dp = pair_at<T>(gv, e);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float x = h ? xp.y : xp.x;
            const float g = (h ? dp.y : dp.x) * (h ? wv.y : wv.x);
            float v = fmaf(g, rstd, RMS ? x * a : fmaf(x - mean, a, b2));
            if constexpr (DS_ROWS > 0) {
              const float2 sp = pair_at<T>(dsr[k], e);
              v += h ? sp.y : sp.x;
            }
            o.set(e + h, v);
          }
        }
        store_vec(dr + k * THREADS * N, o);
      }
    };
    if constexpr (DS_ROWS > 0) {
#pragma unroll
      for (int r = 0; r < DS_ROWS; ++r)
        if (r < nr) write_row(r, ds[r]);
      if (it + 1 < groups.mine) load_dsum(it + 1);
    } else {
      for (int r = 0; r < nr; ++r) write_row(r, nullptr);
    }
  };
  if (groups.mine > 0) {
    pre = load_stats(0);
    load_dsum(0);
  }
  run_groups(sh, groups, stages, issue, sums_and_send, finish);
  // this cluster's dw / db slice into row cid; zeros into the rows no cluster ran
  for (int64_t part = groups.cid; part < parts; part += groups.clusters) {
    const bool mine_row = part == groups.cid;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t col = col0 + static_cast<int64_t>(tid + k * THREADS) * N;
#pragma unroll
      for (int e = 0; e < N; e += 4) {
        if (dw_part)
          *reinterpret_cast<float4*>(dw_part + part * n + col + e) =
              mine_row ? make_float4(dwa[k][e], dwa[k][e + 1], dwa[k][e + 2], dwa[k][e + 3]) : float4{};
        if (db_part)
          *reinterpret_cast<float4*>(db_part + part * n + col + e) =
              mine_row ? make_float4(dba[k][e], dba[k][e + 1], dba[k][e + 2], dba[k][e + 3]) : float4{};
      }
    }
  }
  cluster.sync();
}

// The backward's registers (w, dw and db held a thread) fit these block shapes only; the dispatch
// instantiates no others.
constexpr bool backward_fits(int threads, int vpt) { return threads <= 256 || (threads == 512 && vpt <= 2); }

const char* one_block_an_sm(const NormClusterConfig& c) {
  return c.per_sm == 1 ? nullptr : "the norm kernels run one block an SM (blocks an SM must be 1)";
}

const char* backward_fit_error(const NormClusterConfig& c) {
  if (const char* why = one_block_an_sm(c)) return why;
  return backward_fits(c.threads, c.vpt)
             ? nullptr
             : "the backward runs 128 or 256 threads, or 512 at up to 2 vectors a thread (registers for dw and db)";
}

const char* config_error(DType dt, int64_t n, NormClusterConfig c, bool backward) {
  return cluster_rows_shape_error(dt, n, c, backward ? 2 : 1, backward ? backward_fit_error : one_block_an_sm);
}

// The residual-gradient backward's instantiations: RMSNorm, 256 threads, a group of 1 or 2 rows,
// at most 8 dsum vectors a thread held (rows x vectors a thread; 2 x 8 spills).
constexpr int kDsumThreads = 256, kDsumMaxRows = 2, kDsumMaxVectors = 8;

const char* dsum_config_error(bool rms, NormClusterConfig c) {
  if (!rms) return "a residual gradient (dsum) is RMSNorm's only";
  if (c.threads != kDsumThreads || c.rows > kDsumMaxRows || c.rows * c.vpt > kDsumMaxVectors)
    return "the backward with a residual gradient (dsum) runs 256 threads, at most 2 rows a group and 8 vectors "
           "a thread over the group's rows (rows x vectors a thread)";
  return nullptr;
}


}  // namespace

const char* layer_norm_cluster_config_error(DType dt, int64_t n, NormClusterConfig c) {
  return config_error(dt, n, c, false);
}

const char* norm_bwd_cluster_config_error(DType dt, int64_t n, NormClusterConfig c, bool rms, bool dsum) {
  if (const char* why = config_error(dt, n, c, true)) return why;
  return dsum ? dsum_config_error(rms, c) : nullptr;
}

cudaError_t layer_norm_fwd_cluster(DType dt, const void* x, void* y, const void* w, const void* b, float* mean,
                                   float* rstd, int64_t m, int64_t n, int64_t sx, int64_t sy, float eps,
                                   NormClusterConfig c, cudaStream_t stream) {
  if (m <= 0 || config_error(dt, n, c, false) != nullptr) return cudaErrorInvalidValue;
  return dispatch(dt, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 4) {
      return cudaErrorInvalidValue;
    } else {
      const size_t smem = static_cast<size_t>(c.stages) * c.rows * (n / c.cluster) * sizeof(T);
      const T* xp = static_cast<const T*>(x);
      T* yp = static_cast<T*>(y);
      const T* wp = static_cast<const T*>(w);
      const T* bp = static_cast<const T*>(b);
#define WF_CASE(TH, V)                                                                                   \
      if (c.threads == TH && c.vpt == V)                                                                 \
        return launch_cluster_rows(layer_norm_fwd_cluster_kernel<T, TH, V>, c, m, smem, 0, stream, xp, yp, wp, bp, mean, \
                      rstd, m, n, sx, sy, eps, c.rows, c.stages);
      WF_CLUSTER_ROW_SHAPES(WF_CASE)
#undef WF_CASE
      return cudaErrorInvalidValue;
    }
  });
}

cudaError_t norm_bwd_cluster(DType dt, bool rms, const void* x, const void* dy, const void* dsum, void* dx,
                             const void* w, const float* mean, const float* rstd, float* dw_part, float* db_part,
                             int64_t parts, int64_t m, int64_t n, int64_t sx, int64_t sdy, int64_t sds, int64_t sdx,
                             float offset, NormClusterConfig c, cudaStream_t stream) {
  if (m <= 0 || norm_bwd_cluster_config_error(dt, n, c, rms, dsum != nullptr) != nullptr) return cudaErrorInvalidValue;
  return dispatch(dt, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 4) {
      return cudaErrorInvalidValue;
    } else {
      const size_t smem = 2 * static_cast<size_t>(c.stages) * c.rows * (n / c.cluster) * sizeof(T);
      const T* xp = static_cast<const T*>(x);
      const T* dyp = static_cast<const T*>(dy);
      const T* dsp = static_cast<const T*>(dsum);
      T* dxp = static_cast<T*>(dx);
      const T* wp = static_cast<const T*>(w);
#define WF_LAUNCH(TH, V, RMS_, DS)                                                                      \
  launch_cluster_rows(norm_bwd_cluster_kernel<T, TH, V, RMS_, DS>, c, m, smem, parts, stream, xp, dyp, dsp, dxp, \
                      wp, mean, rstd, dw_part, db_part, parts, m, n, sx, sdy, sds, sdx, offset, c.rows, c.stages)
#define WF_CASE(TH, V)                                                                            \
      if constexpr (backward_fits(TH, V)) {                                                      \
        if (c.threads == TH && c.vpt == V) {                                                     \
          if constexpr (TH == kDsumThreads) {                                                    \
            if constexpr (V * kDsumMaxRows <= kDsumMaxVectors) {                                 \
              if (dsp && c.rows == kDsumMaxRows) return WF_LAUNCH(TH, V, true, kDsumMaxRows);    \
            }                                                                                    \
            if (dsp) return WF_LAUNCH(TH, V, true, 1);                                           \
          }                                                                                      \
          return rms ? WF_LAUNCH(TH, V, true, 0) : WF_LAUNCH(TH, V, false, 0);                   \
        }                                                                                        \
      }
      WF_CLUSTER_ROW_SHAPES(WF_CASE)
#undef WF_CASE
#undef WF_LAUNCH
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace wf
