// Rows spread over a thread-block cluster (Hopper, sm_90), the skeleton shared by the kernels that
// stage a row group's slices in shared memory by bulk copies and exchange per-slice statistics
// pairs between the cluster's blocks by st.async (norm.cu: LayerNorm forward, LayerNorm / RMSNorm
// backward; softmax.cu: the softmax forward over long rows). Block b of a cluster of csize owns
// columns [b * slice, (b + 1) * slice) of every row; a group is `rows` consecutive rows; cluster c
// of a persistent grid takes groups c, c + clusters, ... The loop (run_groups) is pipelined by one
// group: a group's statistics are reduced and sent while the previous group waits for its
// partners' pairs, then is written. CUDA headers only (see launch.h).
#pragma once

#include <cooperative_groups.h>

#include "cluster.cuh"
#include "common.cuh"

namespace wf {

namespace cg = cooperative_groups;

constexpr int kMaxRows = 8;      // rows a group
constexpr int kMaxStages = 8;
constexpr int kMaxCluster = 16;
constexpr int kSlots = 4;        // exchange buffers (see the kernel's comment on the pipeline)

struct ClusterRowShared {
  uint64_t full[kMaxStages];                     // stage s holds a group's rows
  uint64_t xbar[kSlots];                         // group g's partner statistics landed (slot g % 4)
  float2 slots[kSlots][kMaxCluster][kMaxRows];   // [g % 4][source rank][row]: its slice's statistics pair
  float2 warp_stats[kMaxRows][32];               // [row][warp]: the warp's statistics pair
  float2 row_stats[kSlots][kMaxRows];            // backward: group g's saved (mean, rstd), slot g % 4
};

// The groups of rows cluster `cid` of `clusters` walks: groups cid, cid + clusters, ... of `rows`
// rows each (the last may be partial), `mine` of them.
struct Groups {
  int64_t m, cid, clusters, mine;
  int rows;
  __device__ Groups(int64_t m_, int rows_, unsigned csize) : m(m_), rows(rows_) {
    cid = blockIdx.x / csize;
    clusters = gridDim.x / csize;
    const int64_t groups = (m + rows - 1) / rows;
    mine = cid < groups ? (groups - cid + clusters - 1) / clusters : 0;
  }
  // the it-th group's first row, and how many rows it has
  __device__ int at(int64_t it, int64_t& row0) const {
    row0 = (cid + it * clusters) * rows;
    return static_cast<int>(m - row0 < rows ? m - row0 : rows);
  }
};

// The stages of the one-tensor kernels (the LayerNorm and softmax forwards): stage s holds a group's
// rows, each this block's slice of `row_bytes`, `stage_bytes` a stage, from `base`.
struct Stages {
  unsigned char* base;
  uint32_t stage_bytes, row_bytes;
  // the 16-byte vector at index v of the slice (thread tid's k-th: tid + k x threads) of row r, stage s
  __device__ __forceinline__ uint4* vec(int s, int r, int v) const {
    return reinterpret_cast<uint4*>(base + s * stage_bytes + r * row_bytes + v * 16);
  }
  // the bulk copies of this block's slice (from column col0) of group it's rows of src (row stride
  // ld) into stage s, completing on the barrier `bar` (which expects their bytes)
  template <typename T>
  __device__ __forceinline__ void load_group(const Groups& g, int64_t it, int s, uint64_t* bar, const T* src, int64_t ld,
                                             int64_t col0) const {
    int64_t row0;
    const int nr = g.at(it, row0);
    const uint32_t b = smem_u32(bar);
    mbar_arrive_expect_tx(b, static_cast<uint32_t>(nr) * row_bytes);
    const uint32_t dst = smem_u32(base) + s * stage_bytes;
    for (int r = 0; r < nr; ++r) bulk_load(dst + r * row_bytes, src + (row0 + r) * ld + col0, row_bytes, b);
  }
};

// Thread 0 initialises the stage and exchange barriers; the cluster barrier then makes them
// visible to the partners before the first st.async into them.
__device__ __forceinline__ void init_barriers(ClusterRowShared& sh, int stages, cg::cluster_group& cluster) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(smem_u32(&sh.full[s]), 1);
    for (int s = 0; s < kSlots; ++s) mbar_init(smem_u32(&sh.xbar[s]), 1);
    mbar_init_fence();
  }
  cluster.sync();
}

// The exchange of group it's statistics: partners push an 8-byte pair a row (st_async_f2) into slot
// it % kSlots. arm_exchange (thread 0, in the first half, a group before the wait) raises the slot's
// barrier to expect csize pairs for each of the group's nr rows and returns its address;
// wait_exchange waits for them (the k-th use of a slot completes phase k & 1).
__device__ __forceinline__ uint32_t arm_exchange(ClusterRowShared& sh, int64_t it, int nr, unsigned csize) {
  const uint32_t xbar = smem_u32(&sh.xbar[it % kSlots]);
  if (threadIdx.x == 0) mbar_arrive_expect_tx(xbar, csize * static_cast<uint32_t>(nr) * 8u);
  return xbar;
}
__device__ __forceinline__ void wait_exchange(ClusterRowShared& sh, int64_t it) {
  mbar_wait(smem_u32(&sh.xbar[it % kSlots]), static_cast<uint32_t>((it / kSlots) & 1));
}

// Until stage it % stages holds group it's rows (the k-th fill of a stage completes phase k & 1).
__device__ __forceinline__ void wait_stage(ClusterRowShared& sh, int64_t it, int stages) {
  mbar_wait(smem_u32(&sh.full[it % stages]), static_cast<uint32_t>((it / stages) & 1));
}

// The loop both kernels run, software-pipelined by one group: first(it) -- wait for group it's
// tiles, reduce, send the partial sums to every partner -- runs a group ahead of second(it, stage,
// slot, row0, rows), which starts once the partners' sums for group it have landed. Once every
// thread is done with a stage, thread 0 refills it with group it + stages (issue(group, stage)).
template <typename Issue, typename First, typename Second>
__device__ __forceinline__ void run_groups(ClusterRowShared& sh, const Groups& g, int stages, Issue issue, First first,
                                           Second second) {
  if (threadIdx.x == 0)
    for (int64_t it = 0; it < g.mine && it < stages; ++it) issue(it, static_cast<int>(it));
  if (g.mine > 0) first(0);
  for (int64_t it = 0; it < g.mine; ++it) {
    if (it + 1 < g.mine) first(it + 1);
    const int s = static_cast<int>(it % stages), slot = static_cast<int>(it % kSlots);
    int64_t row0;
    const int nr = g.at(it, row0);
    wait_exchange(sh, it);
    second(it, s, slot, row0, nr);
    __syncthreads();   // every thread is done with stage s
    if (threadIdx.x == 0 && it + stages < g.mine) {
      fence_proxy_async_smem();
      issue(it + stages, s);
    }
  }
}

// Launch `kernel` over clusters of c.cluster blocks: min(groups of rows, clusters resident at once,
// cap if positive) clusters, a persistent grid.
template <typename Kernel, typename... Args>
cudaError_t launch_cluster_rows(Kernel kernel, const NormClusterConfig& c, int64_t m, size_t smem, int64_t cap,
                   cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t lc;
  cudaLaunchAttribute attr;
  cudaError_t err = cluster_launch_config(kernel, static_cast<unsigned>(c.cluster), static_cast<unsigned>(c.threads),
                                          smem, stream, lc, attr);
  if (err != cudaSuccess) return err;
  if (c.per_sm > 1) {   // the carveout that leaves room for two blocks' stages
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
  }
  const int fit = resident_clusters(reinterpret_cast<const void*>(kernel), lc);
  if (fit <= 0) return cudaErrorInvalidConfiguration;   // this cluster shape cannot be placed on the device
  const int64_t groups = (m + c.rows - 1) / c.rows;
  int64_t clusters = groups < fit ? groups : fit;
  if (cap > 0 && clusters > cap) clusters = cap;
  lc.gridDim = dim3(static_cast<unsigned>(clusters * c.cluster), 1, 1);
  err = cudaLaunchKernelEx(&lc, kernel, args...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// The (threads, vectors a thread) the cluster-rows kernels are instantiated for.
#define WF_CLUSTER_ROW_SHAPES(CASE)                                            \
  CASE(128, 1) CASE(128, 2) CASE(128, 4) CASE(128, 8)                          \
  CASE(256, 1) CASE(256, 2) CASE(256, 4) CASE(256, 8)                          \
  CASE(512, 1) CASE(512, 2) CASE(512, 4) CASE(512, 8)                          \
  CASE(1024, 1) CASE(1024, 2) CASE(1024, 4)

// nullptr when `c` can run rows of n elements of dt in a cluster-rows kernel that stages `copies`
// tensors a row (the forwards 1, the norm backward 2: x and dy), else why not.
// `fits` (may be null): the kernel's own rule on (threads, vectors a thread, blocks an SM), checked
// after the generic ones on those and before the rest. `extra`: bytes of shared memory a kernel keeps
// beside each staged row (softmax: a float a thread).
inline const char* cluster_rows_shape_error(DType dt, int64_t n, const NormClusterConfig& c, int copies,
                                            const char* (*fits)(const NormClusterConfig&) = nullptr,
                                            int64_t extra = 0) {
  if (dt == DType::f32) return "16-bit dtypes only (float16, bfloat16)";
  if (c.cluster != 2 && c.cluster != 4 && c.cluster != 8 && c.cluster != 16) return "cluster must be 2, 4, 8 or 16";
  if (c.threads != 128 && c.threads != 256 && c.threads != 512 && c.threads != 1024)
    return "threads must be 128, 256, 512 or 1024";
  if (c.vpt != 1 && c.vpt != 2 && c.vpt != 4 && c.vpt != 8) return "vectors per thread must be 1, 2, 4 or 8";
  if (c.threads == 1024 && c.vpt == 8) return "1024 threads hold at most 4 vectors a thread (registers)";
  if (c.per_sm != 1 && c.per_sm != 2) return "blocks an SM must be 1 or 2";
  if (c.per_sm * c.threads > 1024) return "blocks an SM x threads must be at most 1,024";
  if (fits != nullptr)
    if (const char* why = fits(c)) return why;
  if (c.rows < 1 || c.rows > kMaxRows) return "rows a group must be 1 to 8";
  if (c.rows > c.threads / 32) return "rows a group must not exceed the block's warps";
  if (c.rows * c.cluster > 32) return "rows a group x cluster must be at most 32";
  // the loop reduces group i + 1 while group i still occupies its stage: one stage would wait on itself
  if (c.stages < 2 || c.stages > kMaxStages) return "stages must be 2 to 8";
  const int64_t slice = static_cast<int64_t>(c.threads) * c.vpt * 8;
  if (slice * c.cluster != n) return "the row length must be exactly cluster x threads x vectors per thread x 8";
  // an SM's 228 KB hold per_sm blocks' stages, their static ClusterRowShared and the 1 KB the
  // runtime reserves a block
  const int64_t block_smem = static_cast<int64_t>(c.stages) * c.rows * (slice * 2 * copies + extra) +
                             static_cast<int64_t>(sizeof(ClusterRowShared)) + 1024;
  if (c.per_sm * block_smem > 228 * 1024) return "stages x rows x slice exceeds shared memory (x blocks an SM)";
  return nullptr;
}

}  // namespace wf
