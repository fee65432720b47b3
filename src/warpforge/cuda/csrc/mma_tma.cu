// Rung 5 of the matmul ladder: mma_tma. The mma rung's math unchanged (mma.sync.m16n8k16, bf16/fp16
// in, fp32 accumulate; ldmatrix fragments, double-buffered in registers; 64 x 64 of C a warp), fed
// by the Hopper tensor memory accelerator (TMA) through a pipeline of mbarriers instead of
// per-thread cp.async and a block barrier per slice.
//
// Why, in numbers (H100, benchmarks/mma_peak.cu and NOTES.md):
//   * the mma rung's k-loop alone -- ldmatrix + 32 mma a 16-deep k step, 8 warps an SM, a barrier
//     every 2 steps, no global loads -- runs at ~620 TFLOP/s; the whole rung at ~395. What is
//     left is the feed: per slice every thread computes and issues its cp.async chunks (edge
//     checks, 64-bit addresses: ncu counted ~1.4 integer instructions per mma), and the block
//     barrier after each slice lines all 4 warps up behind the slowest (17% of stalls).
//   * TMA: one thread issues a slice as 1 + BN/64 bulk tensor copies (A box BK x BM, B boxes
//     64 x BK); the copy engine computes the addresses, swizzles the rows into shared memory and
//     zero-fills whatever lies past m, n or k (no edge code at all). Completion is counted in
//     bytes on the stage's "full" mbarrier.
//   * mbarriers instead of __syncthreads: a warp waits only for the data it is about to read
//     (full[stage]), and the producer waits only until every warp has released the stage it
//     refills (empty[stage], one arrival a warp) -- STAGES - 2 slices of slack, not lockstep.
//   * persistent blocks: a block walks its tiles in the grouped order and its slices are numbered
//     across tiles, so the producer fetches the next tile's first slices while the warps are in
//     the current tile's last ones and its epilogue.
//   * the L2 feed: a 128 x 128 slice is 64 FLOP a byte of L2 traffic: 2 blocks an SM at 620
//     TFLOP/s would pull 9.6 TB/s from L2, whose measured feed into shared memory is ~8 TB/s
//     (mma_peak's l2_feed); 128 x 256 tiles (85 FLOP a byte) need 7.3 TB/s. So the ceiling of
//     this tile is ~510 TFLOP/s, not 620.
//   * measured (H100, bench runs/cuda_mm, 4096^3 bf16): 459 TFLOP/s, 59% of cuBLAS (775) in the
//     same run, against 399 (51%) for the cp.async rung.
//
// Shared-memory layout of a stage (what TMA writes and ldmatrix reads):
//   A: BM rows of BK * 2 bytes (64 or 128), the box's swizzle: 16-byte chunk c of row r at
//      c ^ ((r >> 1) & 3) (64-byte rows, SWIZZLE_64B) or c ^ (r & 7) (128-byte rows,
//      SWIZZLE_128B) -- the permutations matmul.cu's mma rung applies by hand, so the ldmatrix
//      addressing is the same.
//   B: BN / 64 boxes of [BK rows (k)][64 columns = 128 bytes], SWIZZLE_128B: chunk c of k row r
//      at c ^ (r & 7). A warp's 64 columns are exactly one box (WN = 64).
// Stages start 1,024-byte aligned (the 128-byte swizzle's period).
//
// Requirements (matmul_unsupported): fp16/bf16; lda, ldb multiples of 8 and 16-byte aligned A, B
// (a tensor map's strides and base), ldc % 8 == 0 and an aligned C (the pair stores), and m, n, k
// below 2^31 (TMA coordinates are 32-bit).
//
// CUDA headers only; the driver's cuTensorMapEncodeTiled is reached through the runtime's
// cudaGetDriverEntryPointByVersion (no -lcuda).
#include <cuda.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "mma_sync.cuh"

namespace wf {
namespace {
namespace tma {

template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_>
struct Cfg {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int WARPS = WARPS_M * WARPS_N, THREADS = 32 * WARPS;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MT = WM / 16, NT = WN / 8;
  static constexpr int A_ROW_BYTES = BK * 2;
  static constexpr int A_STAGE_BYTES = BM * A_ROW_BYTES;
  static constexpr int B_BOX_BYTES = BK * 128;          // [BK][64 columns]
  static constexpr int B_STAGE_BYTES = (BN / 64) * B_BOX_BYTES;
  static constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
  static constexpr int BAR_BYTES = 2 * STAGES * 8;      // full[STAGES], empty[STAGES]
  static constexpr int SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + BAR_BYTES;  // + alignment slack
  static constexpr int KSTEPS = BK / 16;
  static_assert(BK == 32 || BK == 64, "A rows of 64 or 128 bytes: the 64- and 128-byte swizzles");
  static_assert(WN == 64 && WM % 16 == 0 && BN % 64 == 0, "a warp's columns are one 64-column B box");
  static_assert(BM <= 256 && BK <= 256, "TMA box dimensions are at most 256");
  static_assert(KSTEPS % 2 == 0, "fragment buffers alternate by k step within a slice");
  static_assert(A_STAGE_BYTES % 1024 == 0 && B_BOX_BYTES % 1024 == 0, "swizzle atoms stay 1,024-byte aligned");
  static_assert(SMEM_BYTES <= 227 * 1024 && (SMEM_BYTES + 1024) * MIN_BLOCKS <= 228 * 1024, "shared memory");
  __device__ static __forceinline__ int a_swz(int r, int c) { return BK == 32 ? c ^ ((r >> 1) & 3) : c ^ (r & 7); }
};

// The configurations, by name ("mma_tma" runs kDefault; matmul_variant in ops.cpp). H100, 4096^3
// bf16, 2026-11-22 (benchmarks/NOTES.md, CUDA item 16), with the cp.async rung at 397-403 and cuBLAS
// at 766-783 in the same runs:
//   mma_tma_128x128x32_s4  4 warps, 2 blocks an SM, 64 KB each: 364-370 TFLOP/s. A slice is 2 k
//                          steps: the producer's refill and the waits come every 2 steps.
//   mma_tma (128x128x64_s3) 4 warps, 2 blocks an SM, 96 KB each: 435-455 TFLOP/s. Half the
//                          slices per FLOP of BK = 32 (the cp.async rung measured the reverse,
//                          370 against 376-397: there the per-slice cost was every thread's
//                          copies, here it is thread 0's refill and the warps' waits).
//   mma_tma_128x256x64_s3  8 warps, 1 block an SM, 144 KB: 439. A third fewer L2 bytes per FLOP,
//                          but no second block to cover one block's waits and epilogue.
// Also measured and dropped: 6 stages at BK = 32 (374; 1 block: 349), 256 x 128 x 32 (366), and
// a producer polling the empty barriers at every k step without waiting (170-207: the branch in
// every step broke up the mma stream).
using T128x128x32s4 = Cfg<128, 128, 32, 2, 2, 4, 2>;
using T128x128x64s3 = Cfg<128, 128, 64, 2, 2, 3, 2>;
using T128x256x64s3 = Cfg<128, 256, 64, 2, 4, 3, 1>;
using kDefault = T128x128x64s3;
}  // namespace tma

// ---- mbarrier and TMA wrappers (PTX ISA 8.x, sm_90) ----------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {  // the producer's arrival
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the phase of parity `parity` has completed (phases 0, 1, 2, ... of a barrier have
// parities 0, 1, 0, ...; a waiter is never more than one phase behind).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

template <typename T, typename C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
matmul_mma_tma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                      T* __restrict__ c, int64_t m, int64_t n, int64_t k, int64_t ldc, int64_t m_tiles,
                      int64_t n_tiles) {
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, STAGES = C::STAGES;
  constexpr int WM = C::WM, WN = C::WN, MT = C::MT, NT = C::NT, WARPS_N = C::WARPS_N;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t smem0 = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t bars = smem0 + STAGES * C::STAGE_BYTES;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (STAGES + s); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full(s), 1);            // the producer's expect_tx arrival (+ the copies' bytes)
      mbar_init(empty(s), C::WARPS);    // one arrival a warp once it has read the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // ldmatrix addressing, as in the mma rung (matmul.cu): A m-tile i, k step s at
  // (a_ld ^ (s << 5)) + i * 16 rows; B n-tile pair j, k step s at (b_ld ^ (j << 5)) + s * 16 rows,
  // in this warp's box (warp_n), k rows of 128 bytes.
  const uint32_t a_ld = (warp_m * WM + (lane & 15)) * C::A_ROW_BYTES + (C::a_swz(lane & 15, lane >> 4) << 4);
  const uint32_t b_ld = C::A_STAGE_BYTES + warp_n * C::B_BOX_BYTES + (lane & 15) * 128 +
                        (((lane >> 4) ^ (lane & 7)) << 4);

  const int64_t tiles = m_tiles * n_tiles;
  const int ktiles = static_cast<int>((k + BK - 1) / BK);
  const int64_t my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int64_t total = my_tiles * ktiles;   // this block's slices, numbered across its tiles

  // Producer (thread 0): slice `issued` of this block into stage p_stage, once every warp has
  // released that stage's previous slice. All of its state advances incrementally (no 64-bit
  // division a slice: the first version divided slice numbers by ktiles and STAGES and re-derived
  // the tile each slice, and ran at 280 TFLOP/s against 397 for the cp.async rung).
  int64_t issued = 0, p_tile = blockIdx.x;
  int p_stage = 0, p_round = 0, p_kk = 0, p_m0 = 0, p_n0 = 0;
  auto p_origin = [&]() {
    int64_t mi, ni;
    grouped_tile(p_tile, m_tiles, n_tiles, mi, ni);
    p_m0 = static_cast<int>(mi * BM);
    p_n0 = static_cast<int>(ni * BN);
  };
  auto issue_next = [&]() {
    if (p_round > 0) mbar_wait(empty(p_stage), static_cast<uint32_t>((p_round - 1) & 1));
    const uint32_t dst = smem0 + p_stage * C::STAGE_BYTES;
    mbar_expect_tx(full(p_stage), C::STAGE_BYTES);   // out-of-range box elements are zero-filled and counted
    tma_load_2d(dst, &map_a, p_kk * BK, p_m0, full(p_stage));
#pragma unroll
    for (int h = 0; h < BN / 64; ++h)
      tma_load_2d(dst + C::A_STAGE_BYTES + h * C::B_BOX_BYTES, &map_b, p_n0 + 64 * h, p_kk * BK, full(p_stage));
    ++issued;
    if (++p_stage == STAGES) {
      p_stage = 0;
      ++p_round;
    }
    if (++p_kk == ktiles) {
      p_kk = 0;
      p_tile += gridDim.x;
      if (issued < total) p_origin();
    }
  };
  if (tid == 0) {   // the first STAGES - 1 slices
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_b)) : "memory");
    if (total > 0) p_origin();
    while (issued < total && issued < STAGES - 1) issue_next();
  }
  __syncwarp();

  uint32_t af[2][MT][4];
  uint32_t bf[2][NT][2];
  auto load_frags = [&](int buf, int stage, int s) {
    const uint32_t base = smem0 + stage * C::STAGE_BYTES;
#pragma unroll
    for (int i = 0; i < MT; ++i) ldmatrix_x4(af[buf][i], base + (a_ld ^ (s << 5)) + i * 16 * C::A_ROW_BYTES);
#pragma unroll
    for (int j = 0; j < NT / 2; ++j)
      ldmatrix_x4_trans(bf[buf][2 * j][0], bf[buf][2 * j][1], bf[buf][2 * j + 1][0], bf[buf][2 * j + 1][1],
                        base + (b_ld ^ (j << 5)) + s * 16 * 128);
  };

  int stage = 0, round = 0;   // the slice being multiplied: its stage, and how often the stages wrapped
  for (int64_t i = 0; i < my_tiles; ++i) {
    int64_t mi, ni;
    grouped_tile(blockIdx.x + i * gridDim.x, m_tiles, n_tiles, mi, ni);
    const int64_t m0 = mi * BM, n0 = ni * BN;

    float acc[MT][NT][4];
    zero_acc(acc);

    mbar_wait(full(stage), static_cast<uint32_t>(round & 1));
    load_frags(0, stage, 0);
    for (int kk = 0; kk < ktiles; ++kk) {
#pragma unroll
      for (int s = 0; s < C::KSTEPS; ++s) {
        if (s == 0) {
          // Thread 0 refills the stage slice g - 1 used, with slice g + STAGES - 1, once every
          // warp has released it (a refill at every k step, polled without waiting, measured 207
          // TFLOP/s against 455 for this: the branch in every step broke up the mma stream).
          if (tid == 0 && issued < total) issue_next();
          __syncwarp();   // warp 0 whole again before its ldmatrix (.aligned)
        }
        if (s + 1 < C::KSTEPS) {
          load_frags((s + 1) & 1, stage, s + 1);
        } else {
          // This warp has issued its last ldmatrix of the slice (at step KSTEPS - 2): release the
          // stage, then fetch the next slice's first fragments (same tile only).
          __syncwarp();
          if (lane == 0) mbar_arrive(empty(stage));
          if (++stage == STAGES) {
            stage = 0;
            ++round;
          }
          if (kk + 1 < ktiles) {
            mbar_wait(full(stage), static_cast<uint32_t>(round & 1));
            load_frags(0, stage, 0);
          }
        }
#pragma unroll
        for (int a = 0; a < MT; ++a)
#pragma unroll
          for (int b = 0; b < NT; ++b) mma_16816<T>(acc[a][b], af[s & 1][a], bf[s & 1][b]);
      }
    }

    store_acc<T>(acc, c, m, n, ldc, m0 + warp_m * WM, n0 + warp_n * WN, lane);
  }
}

// ---- host: tensor maps and launch ----------------------------------------------------------------
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encoder() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<EncodeTiled>(nullptr);
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A row-major (rows, cols) matrix with leading dimension ld (elements), boxes of box_rows x
// box_cols, rows of box_cols * 2 bytes swizzled by `swizzle`; zero fill past the edges.
template <typename T>
bool make_map(CUtensorMap* map, const T* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols,
              CUtensorMapSwizzle swizzle) {
  const EncodeTiled enc = encoder();
  if (enc == nullptr) return false;
  const CUtensorMapDataType dt =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(T)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return enc(map, dt, 2, const_cast<T*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, typename C>
cudaError_t launch_tma(const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                       int64_t ldc, int sms, cudaStream_t stream) {
  constexpr auto kernel = matmul_mma_tma_kernel<T, C>;
  static std::atomic<uint64_t> smem_set{0};
  cudaError_t err = allow_smem(kernel, C::SMEM_BYTES, smem_set);
  if (err != cudaSuccess) return err;
  if (m <= 0 || n <= 0 || k <= 0) return cudaErrorInvalidValue;   // (the operator returns early for these)
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return cudaErrorNotSupported;   // 32-bit TMA coordinates
  CUtensorMap map_a, map_b;
  if (!make_map(&map_a, a, m, k, lda, C::BM, C::BK, C::BK == 32 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B) ||
      !make_map(&map_b, b, k, n, ldb, C::BK, 64, CU_TENSOR_MAP_SWIZZLE_128B))
    return cudaErrorNotSupported;
  const int64_t m_tiles = ceil_div(m, C::BM), n_tiles = ceil_div(n, C::BN);
  const int64_t tiles = m_tiles * n_tiles;
  if (sms <= 0) return cudaErrorInvalidValue;
  const int64_t resident = static_cast<int64_t>(sms) * C::MIN_BLOCKS;
  const unsigned grid = static_cast<unsigned>(tiles < resident ? tiles : resident);
  kernel<<<grid, C::THREADS, C::SMEM_BYTES, stream>>>(map_a, map_b, c, m, n, k, ldc, m_tiles, n_tiles);
  return cudaGetLastError();
}

}  // namespace

bool mma_tma_available() { return encoder() != nullptr; }

cudaError_t matmul_mma_tma(MatmulVariant v, DType dt, const void* a, const void* b, void* c, int64_t m, int64_t n,
                           int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int sms, cudaStream_t stream) {
  return dispatch(dt, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (sizeof(T) != 2) {
      return cudaErrorInvalidValue;
    } else {
      const T* A = static_cast<const T*>(a);
      const T* B = static_cast<const T*>(b);
      T* C = static_cast<T*>(c);
      switch (v) {
        case MatmulVariant::mma_tma: return launch_tma<T, tma::kDefault>(A, B, C, m, n, k, lda, ldb, ldc, sms, stream);
        case MatmulVariant::mma_tma_128x128x32_s4:
          return launch_tma<T, tma::T128x128x32s4>(A, B, C, m, n, k, lda, ldb, ldc, sms, stream);
        case MatmulVariant::mma_tma_128x256x64_s3:
          return launch_tma<T, tma::T128x256x64s3>(A, B, C, m, n, k, lda, ldb, ldc, sms, stream);
        default: return cudaErrorInvalidValue;
      }
    }
  });
}

}  // namespace wf
