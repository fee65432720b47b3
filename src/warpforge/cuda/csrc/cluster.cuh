// Thread-block clusters, mbarriers and the bulk copy engine on Hopper (sm_90): the PTX the row
// kernels that span a cluster share (softmax.cu, norm.cu). CUDA headers only (see launch.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

namespace wf {

// The 32-bit shared-window address of a generic pointer into this block's shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The same shared-memory location in block `rank` of the cluster (distributed shared memory).
__device__ __forceinline__ uint32_t map_rank(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// After the initialising thread's mbar_init calls: makes them visible to the cluster's async
// proxy (st.async, bulk copies); a cluster (or block) barrier must follow before first use.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also raises the phase's expected transaction count by `bytes`.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// Spin until the phase with parity `phase` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t phase) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done) : "r"(bar), "r"(phase) : "memory");
  }
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory into this
// block's shared memory by the bulk copy engine, completing on mbarrier `bar` (complete_tx).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Orders this thread's earlier generic-proxy accesses to shared memory before later async-proxy
// ones (a bulk copy overwriting a stage that threads just read).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Two floats into block `rank`'s shared memory at `dst` (this block's address of the slot),
// completing 8 bytes on that block's mbarrier at `bar` (this block's address of it).
__device__ __forceinline__ void st_async_f2(uint32_t dst, uint32_t bar, uint32_t rank, float a, float b) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
               ::"r"(map_rank(dst, rank)), "f"(a), "f"(b), "r"(map_rank(bar, rank)) : "memory");
}

// How many clusters of `kernel` (cluster shape from lc.gridDim.x, threads and dynamic shared
// memory from `lc`) the current device holds at once; 0 when none fits. Cluster launches use
// that many and loop over rows (a persistent grid). Cached per (device, kernel, threads, cluster,
// shared memory): the occupancy call costs microseconds.
inline int resident_clusters(const void* kernel, const cudaLaunchConfig_t& lc) {
  struct Entry { int device; const void* kernel; unsigned threads, cluster; size_t smem; int value; };
  static Entry cache[256];
  static int used = 0;
  static std::mutex lock;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const unsigned threads = lc.blockDim.x, cluster = lc.gridDim.x;
  std::lock_guard<std::mutex> guard(lock);
  for (int i = 0; i < used; ++i)
    if (cache[i].device == device && cache[i].kernel == kernel && cache[i].threads == threads &&
        cache[i].cluster == cluster && cache[i].smem == lc.dynamicSmemBytes)
      return cache[i].value;
  int value = 0;
  if (cudaOccupancyMaxActiveClusters(&value, kernel, &lc) != cudaSuccess) value = 0;
  (void)cudaGetLastError();   // a failed query must not poison the next launch check
  if (used < 256) cache[used++] = {device, kernel, threads, cluster, lc.dynamicSmemBytes, value};
  return value;
}

// Sets up `lc` (with `attr`, which must outlive it) for a launch of `kernel` in clusters of
// `cluster` blocks (1: a plain launch) of `threads` threads with `smem` bytes of dynamic shared
// memory; the grid is one cluster until the caller sizes it. Sets the kernel's dynamic shared-memory
// limit and allows Hopper's non-portable 16-block clusters where asked.
template <typename Kernel>
inline cudaError_t cluster_launch_config(Kernel kernel, unsigned cluster, unsigned threads, size_t smem,
                                         cudaStream_t stream, cudaLaunchConfig_t& lc, cudaLaunchAttribute& attr) {
  lc = {};
  lc.gridDim = dim3(cluster, 1, 1);
  lc.blockDim = dim3(threads, 1, 1);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  if (smem > 0) {   // static shared memory counts against the default 48 KB too: always say how much
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  if (cluster > 8) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
  }
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  lc.attrs = &attr;
  lc.numAttrs = cluster > 1 ? 1 : 0;
  return cudaSuccess;
}

}  // namespace wf
