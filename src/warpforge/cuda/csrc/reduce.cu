// Row reductions: y[r] = sum(x[r, :]) or max(x[r, :]), accumulated in fp32.
//
// Byte model: read M*N elements once, write M; one add per element. Pure bandwidth: the target is
// the measured copy bandwidth, counted on the bytes read.
//
// How a row is reduced, bottom up:
//   thread  each thread folds 16-byte vectors (8 bf16) of its row into two fp32 accumulators,
//           kUnroll = 8 loads issued before the first add of a trip -- when the kernel is "deep"
//           (64 registers, __launch_bounds__ promising 2 blocks of 512 an SM); "wide" kernels
//           (32 registers, full occupancy) let ptxas interleave loads and adds (2-3 in flight a
//           thread) and win with twice the threads when a thread has under one trip of work.
//           Plain loads: evict-first hints (__ldcs, or an L2 evict-first cache policy) and 256-byte
//           L2 prefetch measured within +-1.5 points of them on an H100;
//   warp    five butterfly shuffles (__shfl_xor_sync) combine the 32 lanes in registers: no
//           shared memory, no barrier;
//   block   warp leaders write one value each to shared memory, one barrier, and warp 0 folds the
//           (at most 16) values with five more shuffles: the block-level tree.
// Rows of up to 256 vectors (2,048 bf16) get one warp each (8 rows per 256-thread block): a block
// per short row would leave most of its warps idle. Longer rows get a block each, two vectors a
// thread up to 512 threads (4,096 bf16: 256 threads). While there are rows enough for a wave of
// blocks, a row is one work item; few long rows are cut into equal chunks whose fp32 partials a
// second, tiny launch reduces in a fixed order -- deterministic, no atomics.
// H100, M*N = 2^27 bf16 (benchmarks/NOTES.md): 131072 x 1024 ... 512 x 262144 at 90-95% of the copy
// roof, against 84-94% for the first version (one warp a row up to 4,096; chunks from ~16 work
// items an SM; 32 registers everywhere).
// max propagates NaN (PTX max.NaN), as torch.amax does.
#include "common.cuh"

namespace wf {
namespace {

constexpr int kWarpRowVectors = 256; // rows up to this many 16-byte vectors: one warp per row
constexpr int kWarpBlock = 256;     // 8 warps, 8 rows per block
constexpr int kRowBlock = 512;      // threads per block for long rows
constexpr int kUnroll = 8;          // independent 16-byte loads in flight per thread
// Blocks per SM promised to ptxas (__launch_bounds__) by the deep kernels, i.e. 64 registers a
// thread: room for the kUnroll vectors. At 32-40 registers (the wide kernels: 4 blocks of 512, 6
// of 256 an SM) ptxas interleaves each load with the previous vector's adds, leaving 2-3 loads in
// flight, not 8 (sm_90 SASS).
constexpr int kWarpBlocksPerSM = 4;
constexpr int kRowBlocksPerSM = 2;
constexpr int kRowWideBlocksPerSM = 4;    // 32 registers
constexpr int kWarpWideBlocksPerSM = 6;   // 40 registers: at 32 the bf16 sum spilled 8 bytes
constexpr int kMinChunk = 16384;    // a chunk gives each of 512 threads at least ~4 vectors (bf16)

// Probe knobs (set_reduce_tuning, benchmarks/probe_cuda.py); zeros mean the heuristics below.
ReduceTuning g_tuning{};

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
  float acc = identity<IS_MAX>(), acc2 = identity<IS_MAX>();
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
      for (int u = 0; u < kUnroll; u += 2) {   // two accumulators: half the dependent chain
        acc = fold<T, IS_MAX>(acc, v[u]);
        acc2 = fold<T, IS_MAX>(acc2, v[u + 1]);
      }
    }
    // then kUnroll / 2 at a time (a 1,024-column bf16 row is 4 vectors a lane: without this step
    // they went one dependent load at a time through the guarded loop below)
    constexpr int kHalf = kUnroll / 2;
    for (; i + (kHalf - 1) * step + N <= end; i += kHalf * step) {
      Vec<T> v[kHalf];
#pragma unroll
      for (int u = 0; u < kHalf; ++u) v[u] = load_vec(row + i + u * step);
#pragma unroll
      for (int u = 0; u < kHalf; ++u) acc = fold<T, IS_MAX>(acc, v[u]);
    }
  }
  acc = combine<IS_MAX>(acc, acc2);
  for (; i < end; i += step) acc = fold<T, IS_MAX>(acc, load_vec_guarded(row, i, end, aligned, fill));
  return acc;
}

// One warp per row, 8 warps per block (warps loop over rows only past the grid's 2^31 blocks).
template <typename T, typename OutT, bool IS_MAX, bool DEEP>
__global__ void __launch_bounds__(kWarpBlock, DEEP ? kWarpBlocksPerSM : kWarpWideBlocksPerSM) reduce_warp_rows_kernel(
    const T* __restrict__ x, OutT* __restrict__ y, int64_t m, int64_t n, int64_t sx, bool aligned) {
  const int lane = threadIdx.x & 31;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5); row < m; row += step) {
    const float acc = warp_reduce<IS_MAX>(fold_range<T, IS_MAX>(x + row * sx, 0, n, aligned, lane, 32));
    if (lane == 0) y[row] = from_f32<OutT>(acc);
  }
}

// Work item w = (row, chunk) = (w / chunks, w % chunks), all items the same size, one block each. chunks == 1 writes y (OutT); else fp32 partials part[row * chunks + chunk].
template <typename T, typename OutT, bool IS_MAX, bool DEEP>
__global__ void __launch_bounds__(kRowBlock, DEEP ? kRowBlocksPerSM : kRowWideBlocksPerSM) reduce_block_rows_kernel(
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

// The longest row (elements) one warp reduces: 256 vectors, 8 a lane (2,048 bf16, 1,024 fp32).
// Longer rows take a block of `row_threads` threads, two vectors a thread (a 4,096-column bf16 row
// over 256 threads measured 93% of the copy roof against 90% for a warp a row), up to 512.
template <typename T>
int64_t warp_row_max() {
  return g_tuning.warp_row_max > 0 ? g_tuning.warp_row_max : kWarpRowVectors * Vec<T>::N;
}

template <typename T>
int row_threads(int64_t n) {
  if (g_tuning.threads > 0) return g_tuning.threads;
  int t = 128;
  while (t < kRowBlock && 2LL * t * Vec<T>::N < n) t *= 2;
  return t;
}

// Chunks per row: one while there are rows enough for a wave of blocks (a second launch for the
// partials cost 3-5 points at 2048 x 65536 and 512 x 262144, H100); few long rows are cut into
// enough work items (~16 per SM) to balance, but no chunk under kMinChunk elements.
int64_t chunks_for(int64_t m, int64_t n, int64_t warp_max, int sms) {
  if (n <= warp_max) return 1;
  if (g_tuning.chunks > 0) return g_tuning.chunks < ceil_div(n, 8) ? g_tuning.chunks : ceil_div(n, 8);
  if (m >= static_cast<int64_t>(kRowBlocksPerSM) * sms) return 1;
  const int64_t want = ceil_div(16LL * sms, m);
  const int64_t most = ceil_div(n, kMinChunk);
  const int64_t c = want < most ? want : most;
  return c < 1 ? 1 : c;
}

// Deep (64 registers, all kUnroll loads in flight) when a thread runs at least one full trip of
// kUnroll vectors and a row is one work item; else wide (32 registers, twice the threads an SM):
// 131072 x 1024 bf16 measured 94% wide against 87% deep, 4096 x 32768 92.4% deep against 91.1%
// wide; rows cut into many chunks (1 x 2^27) 84% wide against 78% deep (more blocks at once).
bool deep_for(int64_t vectors_per_thread, bool one_item_a_row) {
  if (g_tuning.deep > 0) return g_tuning.deep == 2;
  return vectors_per_thread >= kUnroll && one_item_a_row;
}

template <typename T, typename OutT, bool IS_MAX>
cudaError_t launch(const T* x, OutT* y, float* work, int64_t m, int64_t n, int64_t sx, int sms, cudaStream_t stream) {
  constexpr int N = Vec<T>::N;
  const bool aligned = aligned16(x) && (sx * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  const int64_t warp_max = warp_row_max<T>();
  if (n <= warp_max) {
    auto kernel = deep_for(ceil_div(n, 32 * N), true) ? reduce_warp_rows_kernel<T, OutT, IS_MAX, true>
                                                : reduce_warp_rows_kernel<T, OutT, IS_MAX, false>;
    int64_t blocks = ceil_div(m, kWarpBlock / 32);
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;   // warps loop over the rows past that
    kernel<<<static_cast<unsigned>(blocks), kWarpBlock, 0, stream>>>(x, y, m, n, sx, aligned);
    return cudaGetLastError();
  }
  const int64_t chunks = chunks_for(m, n, warp_max, sms);
  const int64_t chunk = ceil_div(ceil_div(n, chunks), N) * N;   // a multiple of the vector width
  const int64_t used = ceil_div(n, chunk);                      // rounding may leave fewer chunks
  const int threads = row_threads<T>(chunk);
  const bool deep = deep_for(ceil_div(chunk, static_cast<int64_t>(threads) * N), used == 1);
  auto kernel = deep ? reduce_block_rows_kernel<T, OutT, IS_MAX, true> : reduce_block_rows_kernel<T, OutT, IS_MAX, false>;
  int64_t blocks = m * used;
  if (g_tuning.persistent > 0) {
    // as many blocks as hold the same number of items each within one wave
    const int64_t slots = static_cast<int64_t>(sms) * (kRowBlock / threads) *
                          (deep ? kRowBlocksPerSM : kRowWideBlocksPerSM);
    blocks = ceil_div(blocks, ceil_div(blocks, slots));
  }
  if (blocks > 0x7fffffff) blocks = 0x7fffffff;   // blocks loop over the items past that
  kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, y, work, m, n, sx, used, chunk, aligned);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || used == 1) return err;
  // the partials: (m, used) fp32, contiguous; a short row each
  return launch<float, OutT, IS_MAX>(work, y, nullptr, m, used, used, sms, stream);
}

}  // namespace

void set_reduce_tuning(const ReduceTuning& t) { g_tuning = t; }

int64_t reduce_workspace_floats(DType in_dt, int64_t m, int64_t n, int sms) {
  int64_t c = 1;
  dispatch(in_dt, [&](auto tag) {
    c = chunks_for(m, n, warp_row_max<decltype(tag)>(), sms);
    return cudaSuccess;
  });
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
