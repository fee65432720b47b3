// Pieces shared by the tensor-core rungs of the matmul ladder (matmul.cu's mma, mma_tma.cu's
// mma_tma): the ldmatrix / mma.sync wrappers, the fp32 -> 16-bit pair packing of the epilogue,
// the grouped tile order, and the dynamic shared-memory opt-in. CUDA headers only.
#pragma once

#include <atomic>
#include <cstdint>

#include "common.cuh"

namespace wf {

// Grouped order: GROUP_M tile-rows walked down a column of tiles before moving right, so that a
// wave of blocks reads ~GROUP_M A tile-rows and their B columns from L2 instead of ~1 A row and all
// of B. The last group has gm = m_tiles - first_m <= GROUP_M tile-rows, and t < m_tiles * n_tiles
// keeps its local index below gm * n_tiles: every (m tile, n tile) exactly once.
constexpr int kGroupM = 8;
__device__ __forceinline__ void grouped_tile(int64_t t, int64_t m_tiles, int64_t n_tiles, int64_t& mi, int64_t& ni) {
  const int64_t group_size = kGroupM * n_tiles;
  const int64_t group = t / group_size;
  const int64_t first_m = group * kGroupM;
  const int64_t gm = (m_tiles - first_m) < kGroupM ? (m_tiles - first_m) : kGroupM;
  const int64_t local = t - group * group_size;
  mi = first_m + local % gm;
  ni = local / gm;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                  uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack2(__nv_bfloat16, float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo at the lower address
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(__half, float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The fp32 accumulators of a warp's MT x NT m16n8 tiles: zeroed before a tile's k loop, stored
// after it. Fragment layout (PTX ISA, m16n8 f32 C): lane l holds rows g = l >> 2 and g + 8,
// columns 2 tq and 2 tq + 1 (tq = l & 3) of each tile, acc[i][j][2 h], [2 h + 1] for row g + 8 h.
template <int MT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// Store the warp's tiles to C at (row0, col0) (the warp tile's corner), pairs as one 32-bit store:
// col is even (col0 and 8 j + 2 tq are) and ldc % 8 == 0 with a 16-byte aligned c
// (matmul_unsupported), so the pair store is 4-byte aligned; col + 1 < n keeps both in range.
template <typename T, int MT, int NT>
__device__ __forceinline__ void store_acc(const float (&acc)[MT][NT][4], T* c, int64_t m, int64_t n, int64_t ldc,
                                          int64_t row0, int64_t col0, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + i * 16 + g + 8 * h;
      if (row >= m) continue;
      T* crow = c + row * ldc;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int64_t col = col0 + j * 8 + 2 * tq;
        const float lo = acc[i][j][2 * h], hi = acc[i][j][2 * h + 1];
        if (col + 1 < n) {
          *reinterpret_cast<uint32_t*>(crow + col) = pack2(T{}, lo, hi);
        } else if (col < n) {
          crow[col] = from_f32<T>(lo);
        }
      }
    }
  }
}


// Dynamic shared memory above 48 KB must be opted into, per kernel and per device. The carveout
// asks for the largest shared-memory share of the unified L1 (the kernel reads global memory only
// through cp.async.cg, which bypasses L1), so that MIN_BLOCKS blocks fit next to each other.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const uint64_t bit = dev < 64 ? (uint64_t{1} << dev) : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_release);
  return err;
}

}  // namespace wf
