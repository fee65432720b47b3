// The ceiling of the CUDA backend's mma rung (matmul.cu): how fast mma.sync.m16n8k16 (bf16 in,
// fp32 accumulate) runs on this GPU when nothing else is in the way, then with each piece of the
// real kernel's k-loop added back. Same warp tile as the rung: 64 x 64 of C a warp (4 x 8 m16n8
// accumulator tiles, 32 independent mma a 16-deep k step).
//
//   regs      32 mma a k step, fragments fixed in registers: the tensor pipe's own ceiling
//   ldsm      + the step's 8 ldmatrix.x4 from shared memory (4 A, 4 B .trans), double-buffered in
//             registers (the next step's loads issued before this step's mma), swizzled addresses
//   ldsm_bar  + a __syncthreads every BAR k steps (the rung's barrier per 32-deep slice: BAR = 2)
//   l2_feed   no math: the cp.async stream of 16 KB slices from an L2-resident buffer into shared
//             memory that feeds 2 blocks an SM (the operand bandwidth the rung needs: 64 FLOP a
//             byte for a 128 x 128 tile, so 6.6 TB/s at 425 TFLOP/s)
//
// Each at 4 or 8 warps an SM (blocks of 4 warps; 255 registers a thread allow 2 blocks an SM).
// Build and run (device):  nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/mma_peak
//                          benchmarks/mma_peak.cu && /tmp/mma_peak   (from the repository root)
// Prints one line a case: TFLOP/s (median of 7 timed launches).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../src/warpforge/cuda/csrc/mma_sync.cuh"   // the rung's ldmatrix / mma.sync wrappers

using namespace wf;

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

constexpr int kWarps = 4;           // a block
constexpr int MT = 4, NT = 8;       // 64 x 64 warp tile
constexpr int kStages = 4;
constexpr int A_ROW = 64;           // bytes: BK = 32 bf16
constexpr int B_ROW = 256;          // bytes: BN = 128 bf16
constexpr int A_STAGE = 128 * A_ROW, B_STAGE = 32 * B_ROW, STAGE = A_STAGE + B_STAGE;

// MODE 0: regs; 1: ldsm; 2: ldsm + barrier every BAR steps.
template <int MODE, int BAR>
__global__ void __launch_bounds__(32 * kWarps, 2) peak_kernel(float* out, int steps) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (MODE > 0) {  // small bf16 values everywhere (1 + tid/1024-ish bit patterns)
    for (int i = tid; i < kStages * STAGE / 4; i += blockDim.x)
      reinterpret_cast<uint32_t*>(smem)[i] = 0x3f803f80u + (i & 0x7f);
    __syncthreads();
  }
  const int warp_m = warp / 2, warp_n = warp % 2;
  const uint32_t a_ld = (warp_m * 64 + (lane & 15)) * A_ROW + ((((lane >> 4)) ^ (((lane & 15) >> 1) & 3)) << 4);
  const uint32_t b_ld = A_STAGE + (lane & 15) * B_ROW + ((warp_n * 8 + ((lane >> 4) ^ (lane & 7))) << 4);

  float acc[MT][NT][4];
  zero_acc(acc);
  uint32_t af[2][MT][4], bf[2][NT][2];
#pragma unroll
  for (int b = 0; b < 2; ++b) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) af[b][i][e] = 0x3f803f80u + tid + i;
#pragma unroll
    for (int j = 0; j < NT; ++j) bf[b][j][0] = bf[b][j][1] = 0x3f803f80u + j;
  }
  auto load = [&](int buf, int stage, int s) {
    const uint32_t base = s0 + stage * STAGE;
#pragma unroll
    for (int i = 0; i < MT; ++i) ldmatrix_x4(af[buf][i], base + (a_ld ^ (s << 5)) + i * 16 * A_ROW);
#pragma unroll
    for (int j = 0; j < NT / 2; ++j)
      ldmatrix_x4_trans(bf[buf][2 * j][0], bf[buf][2 * j][1], bf[buf][2 * j + 1][0], bf[buf][2 * j + 1][1],
             base + (b_ld ^ (j << 5)) + s * 16 * B_ROW);
  };
  int stage = 0;
  for (int kt = 0; kt < steps; kt += 2) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      if (MODE > 0) {
        if (s == 1) stage = stage == kStages - 1 ? 0 : stage + 1;
        load((s + 1) & 1, stage, (s + 1) & 1);
      }
      if (MODE == 2 && ((kt + s) % BAR) == BAR - 1) __syncthreads();
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_16816<__nv_bfloat16>(acc[i][j], af[s & 1][i], bf[s & 1][j]);
    }
  }
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) t += acc[i][j][e];
  out[blockIdx.x * blockDim.x + tid] = t;
}

// Median of 7 timed launches (after one warm-up launch of `warm`), milliseconds; < 0 on error.
template <typename Launch, typename Warm>
float median_ms(Launch launch, Warm warm) {
  cudaEvent_t e0, e1;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) return -1.f;
  warm();
  if (cudaGetLastError() != cudaSuccess) return -1.f;
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(e0);
    launch();
    cudaEventRecord(e1);
    if (cudaEventSynchronize(e1) != cudaSuccess || cudaGetLastError() != cudaSuccess) return -1.f;
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[3];
}

template <int MODE, int BAR>
int run(const char* name, int blocks_per_sm, int sms, float* out) {
  auto k = peak_kernel<MODE, BAR>;
  const int smem = MODE > 0 ? kStages * STAGE : 0;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kStages * STAGE));
  const int steps = 8192;
  const int grid = sms * blocks_per_sm;
  const float ms = median_ms([&] { k<<<grid, 32 * kWarps, smem>>>(out, steps); },
                             [&] { k<<<grid, 32 * kWarps, smem>>>(out, 64); });
  if (ms < 0) return 1;
  const double flops = 2.0 * 16 * 8 * 16 * MT * NT * double(steps) * kWarps * grid;
  std::printf("%-10s warps/SM %2d  %7.1f TFLOP/s  (%.3f ms)\n", name, blocks_per_sm * kWarps,
              flops / (ms * 1e-3) / 1e12, ms);
  return 0;
}

// L2 -> shared memory: each block streams 16 KB slices (the rung's A + B slice of a 128 x 128 x 32
// tile) with cp.async.cg through kStages buffers, slices picked round robin from a buffer that
// fits in L2 (`bytes`), the way the rung's blocks re-read A and B tiles that other blocks pulled
// in. Nothing is computed: the bandwidth ceiling of the operand feed.
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__global__ void __launch_bounds__(128, 2) l2_feed_kernel(const uint4* src, int64_t chunks16, int slices, float* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x;
  constexpr int kPer = 16384 / 16 / 128;  // 16-byte chunks a thread a slice: 8
  int64_t slice = blockIdx.x * 7919LL;
  const int64_t nslices = chunks16 / (16384 / 16);
  for (int it = 0; it < slices; ++it) {
    const uint4* p = src + (slice % nslices) * (16384 / 16);
    const uint32_t dst = s0 + (it % kStages) * 16384;
#pragma unroll
    for (int u = 0; u < kPer; ++u) cp16(dst + (u * 128 + tid) * 16, p + u * 128 + tid);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    slice += gridDim.x;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  out[blockIdx.x * blockDim.x + tid] = reinterpret_cast<const float*>(smem)[tid];
}

int run_l2(int sms, float* out, int64_t bytes) {
  uint4* buf = nullptr;
  CHECK(cudaMalloc(&buf, bytes));
  CHECK(cudaMemset(buf, 0x3c, bytes));
  CHECK(cudaFuncSetAttribute(l2_feed_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kStages * 16384));
  const int grid = sms * 2, slices = 4096;
  const float ms = median_ms([&] { l2_feed_kernel<<<grid, 128, kStages * 16384>>>(buf, bytes / 16, slices, out); },
                             [&] { l2_feed_kernel<<<grid, 128, kStages * 16384>>>(buf, bytes / 16, 64, out); });
  if (ms < 0) return 1;
  const double moved = 16384.0 * slices * grid;
  std::printf("l2_feed    buffer %3lld MB  %7.2f TB/s  (%.3f ms)\n", (long long)(bytes >> 20),
              moved / (ms * 1e-3) / 1e12, ms);
  CHECK(cudaFree(buf));
  return 0;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  std::printf("%s, %d SMs\n", p.name, sms);
  float* out = nullptr;
  CHECK(cudaMalloc(&out, sizeof(float) * sms * 4 * 32 * kWarps));
  int rc = 0;
  for (int bps : {1, 2}) {
    rc |= run<0, 2>("regs", bps, sms, out);
    rc |= run<1, 2>("ldsm", bps, sms, out);
    rc |= run<2, 2>("ldsm_bar2", bps, sms, out);
    rc |= run<2, 4>("ldsm_bar4", bps, sms, out);
  }
  for (int64_t mb : {8, 24, 40}) rc |= run_l2(sms, out, mb << 20);
  CHECK(cudaFree(out));
  return rc;
}
