// Row reductions: y[r] = sum(x[r, :]) or max(x[r, :]), accumulated in fp32.
//
// Byte model: read M*N elements once, write M; one add per element. Pure bandwidth: the target is
// the measured copy bandwidth, counted on the bytes read.
//
// How a row is reduced, bottom up:
//   thread  each thread folds 16-byte vectors (8 bf16) of its row into one fp32 accumulator,
//           kUnroll = 8 independent loads in flight per trip (Little's law asks ~25 KB in flight
//           per SM of an H200; 2,048 threads x 8 x 16 B is 256 KB). Plain loads: the evict-first
//           hint (__ldcs) measured 1-5 points lower on an H100 (fp32: 93-95% against 96-99%);
//   warp    five butterfly shuffles (__shfl_xor_sync) combine the 32 lanes in registers: no
//           shared memory, no barrier;
//   block   warp leaders write one value each to shared memory, one barrier, and warp 0 folds the
//           (at most 32) values with five more shuffles: the block-level tree.
// Rows of up to kWarpRowMax elements get one warp each (8 rows per 256-thread block): a block per
// short row would leave most of its warps idle. Longer rows get a 512-thread block each. When the
// rows are long and few (fewer than ~16 per SM), each row is cut into equal chunks whose fp32
// partials a second, tiny launch reduces in a fixed order -- deterministic, no atomics. (A
// persistent grid looping over rows measured no better on an H100 than one block per item.)
// max propagates NaN (PTX max.NaN), as torch.amax does.
#include "common.cuh"

namespace wf {
namespace {

constexpr int kWarpRowMax = 4096;   // rows up to this many elements: one warp per row
constexpr int kWarpBlock = 256;     // 8 warps, 8 rows per block
constexpr int kRowBlock = 512;      // threads per block for long rows
constexpr int kUnroll = 8;          // independent 16-byte loads in flight per thread
constexpr int kMinChunk = 16384;    // a chunk gives each of 512 threads at least ~4 vectors (bf16)

template <bool IS_MAX>
__device__ __forceinline__ float combine(float a, float b) {
  return IS_MAX ? max_nan(a, b) : a + b;
}

template <bool IS_MAX>
__device__ __forceinline__ float identity() {
  return IS_MAX ? -INFINITY : 0.f;
}

template <bool IS_MAX>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = combine<IS_MAX>(v, shfl_xor(v, o));
  return v;
}

template <typename T, bool IS_MAX>
__device__ __forceinline__ float fold(float acc, const Vec<T>& v) {
#pragma unroll
  for (int e = 0; e < Vec<T>::N; ++e) acc = combine<IS_MAX>(acc, v.get(e));
  return acc;
}

// Thread `lane` of `lanes` folds the vectors lane, lane + lanes, ... of row[begin, end).
// begin is a multiple of the vector width; `aligned`: the row starts 16-byte aligned.
template <typename T, bool IS_MAX>
__device__ __forceinline__ float fold_range(const T* row, int64_t begin, int64_t end, bool aligned, int lane, int lanes) {
  constexpr int N = Vec<T>::N;
  float acc = identity<IS_MAX>();
  const float fill = identity<IS_MAX>();
  int64_t i = begin + static_cast<int64_t>(lane) * N;
  const int64_t step = static_cast<int64_t>(lanes) * N;
  if (aligned) {
    // whole vectors, kUnroll at a time: all loads issued before the first fold
    for (; i + (kUnroll - 1) * step + N <= end; i += kUnroll * step) {
      Vec<T> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load_vec(row + i + u * step);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc = fold<T, IS_MAX>(acc, v[u]);
    }
  }
  for (; i < end; i += step) acc = fold<T, IS_MAX>(acc, load_vec_guarded(row, i, end, aligned, fill));
  return acc;
}

// One warp per row, 8 warps per block (warps loop over rows only past the grid's 2^31 blocks).
template <typename T, typename OutT, bool IS_MAX>
__global__ void __launch_bounds__(kWarpBlock) reduce_warp_rows_kernel(
    const T* __restrict__ x, OutT* __restrict__ y, int64_t m, int64_t n, int64_t sx, bool aligned) {
  const int lane = threadIdx.x & 31;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5); row < m; row += step) {
    const float acc = warp_reduce<IS_MAX>(fold_range<T, IS_MAX>(x + row * sx, 0, n, aligned, lane, 32));
    if (lane == 0) y[row] = from_f32<OutT>(acc);
  }
}

// Work item w = (row, chunk) = (w / chunks, w % chunks), all items the same size, one block each. chunks == 1 writes y (OutT); else fp32 partials part[row * chunks + chunk].
template <typename T, typename OutT, bool IS_MAX>
__global__ void __launch_bounds__(kRowBlock) reduce_block_rows_kernel(
    const T* __restrict__ x, OutT* __restrict__ y, float* __restrict__ part, int64_t m, int64_t n, int64_t sx,
    int64_t chunks, int64_t chunk, bool aligned) {
  __shared__ float warp_vals[kRowBlock / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t w = blockIdx.x; w < m * chunks; w += gridDim.x) {
    const int64_t row = w / chunks, c = w - row * chunks;
    const int64_t begin = c * chunk;
    const int64_t end = begin + chunk < n ? begin + chunk : n;
    float acc = warp_reduce<IS_MAX>(fold_range<T, IS_MAX>(x + row * sx, begin, end, aligned, threadIdx.x, blockDim.x));
    if (lane == 0) warp_vals[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = lane < static_cast<int>(blockDim.x >> 5) ? warp_vals[lane] : identity<IS_MAX>();
      acc = warp_reduce<IS_MAX>(acc);
      if (lane == 0) {
        if (chunks == 1) y[row] = from_f32<OutT>(acc);
        else part[w] = acc;
      }
    }
    __syncthreads();   // warp_vals is rewritten by the next item
  }
}

// Chunks per row: enough work items (~16 per SM) that a persistent grid is balanced to a few
// percent even for a handful of rows, but no chunk under kMinChunk elements.
int64_t chunks_for(int64_t m, int64_t n, int sms) {
  if (n <= kWarpRowMax) return 1;
  const int64_t want = ceil_div(16LL * sms, m);
  const int64_t most = ceil_div(n, kMinChunk);
  const int64_t c = want < most ? want : most;
  return c < 1 ? 1 : c;
}

template <typename T, typename OutT, bool IS_MAX>
cudaError_t launch(const T* x, OutT* y, float* work, int64_t m, int64_t n, int64_t sx, int sms, cudaStream_t stream) {
  constexpr int N = Vec<T>::N;
  const bool aligned = aligned16(x) && (sx * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  if (n <= kWarpRowMax) {
    auto kernel = reduce_warp_rows_kernel<T, OutT, IS_MAX>;
    int64_t blocks = ceil_div(m, kWarpBlock / 32);
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;   // warps loop over the rows past that
    kernel<<<static_cast<unsigned>(blocks), kWarpBlock, 0, stream>>>(x, y, m, n, sx, aligned);
    return cudaGetLastError();
  }
  const int64_t chunks = chunks_for(m, n, sms);
  const int64_t chunk = ceil_div(ceil_div(n, chunks), N) * N;   // a multiple of the vector width
  const int64_t used = ceil_div(n, chunk);                      // rounding may leave fewer chunks
  auto kernel = reduce_block_rows_kernel<T, OutT, IS_MAX>;
  int64_t blocks = m * used;
  if (blocks > 0x7fffffff) blocks = 0x7fffffff;   // blocks loop over the items past that
  kernel<<<static_cast<unsigned>(blocks), kRowBlock, 0, stream>>>(x, y, work, m, n, sx, used, chunk, aligned);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || used == 1) return err;
  // the partials: (m, used) fp32, contiguous; a short row each
  return launch<float, OutT, IS_MAX>(work, y, nullptr, m, used, used, sms, stream);
}

}  // namespace

int64_t reduce_workspace_floats(int64_t m, int64_t n, int sms) {
  const int64_t c = chunks_for(m, n, sms);
  return c > 1 ? m * c : 0;
}

cudaError_t reduce_rows(DType in_dt, DType out_dt, const void* x, void* y, float* work, int64_t m, int64_t n,
                        int64_t sx, bool is_max, int sms, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaErrorInvalidValue;
  return dispatch(in_dt, [&](auto in_tag) {
    using T = decltype(in_tag);
    return dispatch(out_dt, [&](auto out_tag) {
      using OutT = decltype(out_tag);
      const T* xp = static_cast<const T*>(x);
      OutT* yp = static_cast<OutT*>(y);
      return is_max ? launch<T, OutT, true>(xp, yp, work, m, n, sx, sms, stream)
                    : launch<T, OutT, false>(xp, yp, work, m, n, sx, sms, stream);
    });
  });
}

}  // namespace wf
