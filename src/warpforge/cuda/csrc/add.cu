// Vector add, out = x + alpha * y: the first CUDA kernel, in two versions whose gap is the lesson.
//
// Byte model: read 2, write 1 element per FMA -- 6 bytes per FLOP in bf16, so the only roof is the
// memory system: the measured device-to-device copy bandwidth.
//
// naive       one thread per element, one block of 256 threads per 256 elements: each thread
//             issues one 2-byte load per operand (bf16), waits ~600-800 ns for DRAM, adds, stores
//             and exits. Little's law says an H200 needs ~3.4 MB in flight (4.8 TB/s x ~700 ns),
//             ~25 KB per SM; 2,048 resident threads x 2 loads x 2 B = 8 KB per SM is a third of it,
//             and every byte costs a load instruction.
// vectorized  a grid-stride loop over 16-byte vectors (LDG.128/STG.128: 8 bf16 or 4 fp32 per
//             access) with UNROLL independent vectors per thread per trip, so each thread has
//             UNROLL x 2 x 16 B in flight: 2,048 threads x 64 B = 128 KB per SM, five times what
//             Little's law asks, with one instruction per 16 bytes. The grid is a few blocks per SM
//             (not one block per element): launch and block-scheduling cost nothing per byte, and
//             the loop's trip count does the rest. Loads are streaming (__ldcs, evict-first):
//             nothing is reused. A scalar tail handles n % 8 and unaligned pointers.
#include "common.cuh"

namespace wf {
namespace {

constexpr int kNaiveThreads = 256;
constexpr int kVecThreads = 256;
constexpr int kUnroll = 2;          // vectors per thread per trip of the grid-stride loop
constexpr int kBlocksPerSm = 8;     // 8 x 256 threads = 2,048: a full Hopper SM

template <typename T>
__global__ void add_naive_kernel(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out,
                                 int64_t n, float alpha) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_f32<T>(to_f32(x[i]) + alpha * to_f32(y[i]));
}

template <typename T>
__device__ __forceinline__ Vec<T> axpy(const Vec<T>& a, const Vec<T>& b, float alpha) {
  Vec<T> r;
#pragma unroll
  for (int e = 0; e < Vec<T>::N; ++e) r.set(e, a.get(e) + alpha * b.get(e));
  return r;
}

// nvec full 16-byte vectors from the start, then the scalar tail [nvec * N, n).
// __launch_bounds__(256, 8) caps registers at 32 so all 8 blocks of the grid's per-SM share are
// resident at once: a grid-stride loop must never leave blocks waiting for a second wave.
template <typename T>
__global__ void __launch_bounds__(kVecThreads, kBlocksPerSm) add_vectorized_kernel(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out,
                                      int64_t n, int64_t nvec, float alpha) {
  constexpr int N = Vec<T>::N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // main loop: kUnroll vectors per thread, all loads issued before the first add
  for (; v + (kUnroll - 1) * stride < nvec; v += kUnroll * stride) {
    Vec<T> a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      a[u] = load_vec_stream(x + (v + u * stride) * N);
      b[u] = load_vec_stream(y + (v + u * stride) * N);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) store_vec(out + (v + u * stride) * N, axpy(a[u], b[u], alpha));
  }
  for (; v < nvec; v += stride) store_vec(out + v * N, axpy(load_vec_stream(x + v * N), load_vec_stream(y + v * N), alpha));
  // scalar tail: fewer than N elements, taken by the first threads of the grid
  const int64_t t = nvec * N + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n) out[t] = from_f32<T>(to_f32(x[t]) + alpha * to_f32(y[t]));
}

}  // namespace

cudaError_t add_naive(DType dt, const void* x, const void* y, void* out, int64_t n, float alpha,
                      cudaStream_t stream) {
  return dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    const int64_t blocks = ceil_div(n, kNaiveThreads);
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    add_naive_kernel<T><<<static_cast<unsigned>(blocks), kNaiveThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(y), static_cast<T*>(out), n, alpha);
    return cudaGetLastError();
  });
}

cudaError_t add_vectorized(DType dt, const void* x, const void* y, void* out, int64_t n, float alpha,
                           int sms, cudaStream_t stream) {
  return dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int N = Vec<T>::N;
    // all three pointers 16-byte aligned, else every access is scalar (nvec = 0: the "tail" is all)
    const bool vec_ok = aligned16(x) && aligned16(y) && aligned16(out);
    const int64_t nvec = vec_ok ? n / N : 0;
    const int64_t work = nvec > 0 ? nvec : n;
    int64_t blocks = ceil_div(work, static_cast<int64_t>(kVecThreads) * kUnroll);
    blocks = blocks < 1 ? 1 : blocks;
    const int64_t cap = static_cast<int64_t>(sms) * kBlocksPerSm;
    if (blocks > cap) blocks = cap;
    if (nvec == 0) {
      // no vector part: the tail covers [0, n) one element per thread, so the grid must cover n
      const int64_t need = ceil_div(n, kVecThreads);
      if (need > 0x7fffffff) return cudaErrorInvalidValue;
      blocks = need;
    }
    add_vectorized_kernel<T><<<static_cast<unsigned>(blocks), kVecThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(y), static_cast<T*>(out), n, nvec, alpha);
    return cudaGetLastError();
  });
}

}  // namespace wf
