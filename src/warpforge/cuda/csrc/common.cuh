// Small device helpers shared by the kernels: dtype dispatch, 16-byte vectors of any element
// type, fp32 conversion, warp shuffles. CUDA headers only (see launch.h for why).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "launch.h"

namespace wf {

// Run `body` with the C++ element type of `dt` as the template argument of a generic lambda:
//   return dispatch(dt, [&](auto tag) { using T = decltype(tag); ... });
template <typename F>
inline cudaError_t dispatch(DType dt, F&& body) {
  switch (dt) {
    case DType::f32: return body(float{});
    case DType::f16: return body(__half{});
    case DType::bf16: return body(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The two 16-bit values packed in `p` as floats. bf16: a shift and a mask, one instruction each
// (the generic conversion spends a byte permute and a multiply on the high half).
__device__ __forceinline__ float2 pair_f32(uint32_t p, __nv_bfloat16) {
  return make_float2(__uint_as_float(p << 16), __uint_as_float(p & 0xffff0000u));
}
__device__ __forceinline__ float2 pair_f32(uint32_t p, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(&p));
}
// Values e and e + 1 (e even) of a 16-byte vector of 16-bit values as floats.
template <typename T>
__device__ __forceinline__ float2 pair_at(const uint4& raw, int e) {
  return pair_f32(reinterpret_cast<const uint32_t*>(&raw)[e / 2], T{});
}

// 16 bytes: the widest load or store one thread can issue (LDG.128 / STG.128).
template <typename T>
struct Vec {
  static constexpr int N = 16 / sizeof(T);
  uint4 raw;
  // bf16 through pair_at: one shift or mask an element (NOTES item 115)
  __device__ __forceinline__ float get(int i) const {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const float2 p = pair_at<T>(raw, i);
      return (i & 1) ? p.y : p.x;
    } else {
      return to_f32(reinterpret_cast<const T*>(&raw)[i]);
    }
  }
  __device__ __forceinline__ void set(int i, float v) { reinterpret_cast<T*>(&raw)[i] = from_f32<T>(v); }
  // elements i and i + 1 (i even) at once: a 16-bit pair is one packing conversion, where two set()
  // calls convert and then merge each half
  __device__ __forceinline__ void set2(int i, float a, float b) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      reinterpret_cast<__nv_bfloat162*>(&raw)[i >> 1] = __floats2bfloat162_rn(a, b);
    } else if constexpr (std::is_same_v<T, __half>) {
      reinterpret_cast<__half2*>(&raw)[i >> 1] = __floats2half2_rn(a, b);
    } else {
      set(i, a);
      set(i + 1, b);
    }
  }
};

template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
  Vec<T> v;
  v.raw = *reinterpret_cast<const uint4*>(p);
  return v;
}

// Streaming load (read once: don't keep it in L1).
template <typename T>
__device__ __forceinline__ Vec<T> load_vec_stream(const T* p) {
  Vec<T> v;
  v.raw = __ldcs(reinterpret_cast<const uint4*>(p));
  return v;
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T>& v) {
  *reinterpret_cast<uint4*>(p) = v.raw;
}

// Elements i0 .. i0+N-1 of a row of n, as one vector: a single 16-byte load when the whole vector
// is in bounds and the row is 16-byte aligned, else element by element (the row's tail, or rows
// whose start is not aligned), `fill` past the end.
template <typename T>
__device__ __forceinline__ Vec<T> load_vec_guarded(const T* row, int64_t i0, int64_t n, bool aligned, float fill) {
  constexpr int N = Vec<T>::N;
  if (aligned && i0 + N <= n) return load_vec_stream(row + i0);
  Vec<T> v;
#pragma unroll
  for (int e = 0; e < N; ++e) v.set(e, i0 + e < n ? to_f32(row[i0 + e]) : fill);
  return v;
}

template <typename T>
__device__ __forceinline__ void store_vec_guarded(T* row, int64_t i0, int64_t n, bool aligned, const Vec<T>& v) {
  constexpr int N = Vec<T>::N;
  if (aligned && i0 + N <= n) {
    store_vec(row + i0, v);
    return;
  }
#pragma unroll
  for (int e = 0; e < N; ++e)
    if (i0 + e < n) row[i0 + e] = reinterpret_cast<const T*>(&v.raw)[e];
}

__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// max that returns NaN when either operand is NaN (torch.amax semantics; fmaxf drops NaN).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}

constexpr float kLog2e = 1.4426950408889634f;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace wf
