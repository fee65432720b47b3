// Matrix multiply in CUDA C++: C (m, n) = A (m, k) @ B (k, n), all row-major with leading dimensions
// lda / ldb / ldc (elements), fp32 accumulation, C written in the operands' dtype.
//
// The ladder, each rung one idea, and the number that idea moves. FLOP model 2*m*n*k. At 4096^3
// the minimum traffic is A + B + C once: 3 * 4096^2 * 2 B = 100 MB (bf16) for 137 GFLOP, ~1,370
// FLOP per byte, far past the ~200-300 FLOP/B where an H100/H200 turns compute-bound. So the
// ladder is a story about re-use: how many FMAs each byte fetched from DRAM/L2 (global), from
// shared memory, and from registers feeds, until the bottleneck is the math units themselves.
//
//   rung       global B / FMA           smem B / FMA           math            4096^3 bf16, H100/H200
//   naive      8      (fp32, no re-use) -                      FP32 FFMA       (measured: see benchmarks/results)
//   tiled      0.25   (fp32, 32x32)     8 (2 LDS.32 per FFMA)  FP32 FFMA       (measured: see benchmarks/results)
//   regblock   0.0625 (fp32, 128x128)   1 (64 B per 64 FFMA)   FP32 FFMA       (measured: see benchmarks/results)
//   mma        0.0234 (bf16, 128x256)   0.0625 (ldmatrix)      tensor cores    (measured: see benchmarks/results)
//   mma_tma    0.0156 (bf16, 128x128)   0.0625 (ldmatrix)      tensor cores    (mma_tma.cu: TMA + mbarriers)
//
// ("global bytes / FMA" counts what one block requests from L2/DRAM; the L1/L2 caches turn the
// naive rung's requests into far fewer DRAM bytes, but not into fewer load instructions.)
//
// Every variant is exact on any m, n, k >= 1 (bounds-checked loads that zero-fill the tile edges,
// guarded stores): odd shapes like 1 x 7 x 4097 take the same kernels as 4096^3. Tile indices are
// one flattened 64-bit index per block, walked by blockIdx.x with a grid-stride loop, so there is
// no 65,535 limit (grid.y/z are never used) and no m, n bound short of memory. Every row offset
// (row * ld) is computed in 64 bits.
//
// CUDA headers only (see launch.h): compiles standalone with
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Xptxas -v -c matmul.cu
#include <atomic>
#include <climits>
#include <cstdint>

#include "common.cuh"
#include "mma_sync.cuh"

namespace wf {
namespace {

// Blocks to launch for `tiles` tiles: one per tile, capped at the grid.x limit (the kernels loop).
inline unsigned grid_for(int64_t tiles) {
  return static_cast<unsigned>(tiles < INT_MAX ? tiles : INT_MAX);
}

// =================================================================================================
// Rung 1: naive. One thread per C element, the dot product of a row of A and a column of B read
// straight from global memory.
//
// Per FMA: two global loads (A[row, kk] and B[kk, col]), 8 bytes in fp32, for 2 FLOPs: 0.25
// FLOP/B of load instructions. A warp is 32 consecutive columns of one row, so the B loads are one
// coalesced 128-byte line and the A load is one broadcast address; the L1 catches much of the
// re-use (the same A row for the whole warp, the same B rows for every row of blocks), but every
// FMA still costs two load instructions and their latency: the kernel is bound by the load/store
// units and L1 bandwidth, not by the FFMA pipes. (measured: see benchmarks/results)
// Block: 32 x 8 threads = an 8-row x 32-column tile of C.
// =================================================================================================
constexpr int kNaiveBX = 32, kNaiveBY = 8;

template <typename T>
__global__ void __launch_bounds__(kNaiveBX * kNaiveBY)
matmul_naive_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t m,
                    int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t n_tiles,
                    int64_t tiles) {
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row = (t / n_tiles) * kNaiveBY + threadIdx.y;
    const int64_t col = (t % n_tiles) * kNaiveBX + threadIdx.x;  // the fast index: coalesced B, C
    if (row >= m || col >= n) continue;
    const T* ar = a + row * lda;
    const T* bc = b + col;
    float acc = 0.f;
    for (int64_t kk = 0; kk < k; ++kk) acc = fmaf(to_f32(ar[kk]), to_f32(bc[kk * ldb]), acc);
    c[row * ldc + col] = from_f32<T>(acc);
  }
}

// =================================================================================================
// Rung 2: tiled. The block (32 x 32 threads, one C element each) stages a 32 x 32 tile of A and a
// 32 x 32 tile of B in shared memory per 32-deep slice of K; each element fetched from global is
// then used 32 times from shared memory.
//
// Global traffic per slice: 2 * 32 * 32 elements (8 KB fp32) for 32^3 = 32,768 FMAs: 0.25 B per
// FMA, 32x fewer global bytes per FMA than the naive rung's 8 (arithmetic intensity of the tile:
// 2 * 32^3 FLOP / 8 KB = 8 FLOP/B). But the inner loop still issues two shared loads (As[ty][kk],
// a broadcast, and Bs[kk][tx], a conflict-free row) per FFMA: 8 smem bytes per FMA, so the
// ceiling is now the shared-memory pipe: about one shared-memory access per FFMA instruction
// (the broadcasts of As can merge into LDS.128), where an SM could issue four FFMA warp-
// instructions per clock. (measured: see benchmarks/results)
// =================================================================================================
constexpr int kTile = 32;

template <typename T>
__global__ void __launch_bounds__(kTile * kTile)
matmul_tiled_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t m,
                    int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t n_tiles,
                    int64_t tiles) {
  __shared__ float As[kTile][kTile];  // [row][k]: read As[ty][kk], one address per warp (broadcast)
  __shared__ float Bs[kTile][kTile];  // [k][col]: read Bs[kk][tx], 32 consecutive words (no conflict)
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform per block: the syncs are safe
    const int64_t row = (t / n_tiles) * kTile + ty;
    const int64_t col = (t % n_tiles) * kTile + tx;
    const bool row_ok = row < m, col_ok = col < n;
    const T* ar = a + (row_ok ? row : 0) * lda;
    float acc = 0.f;
    for (int64_t k0 = 0; k0 < k; k0 += kTile) {
      // Coalesced loads: a warp (fixed ty) reads 32 consecutive elements of a row of A and of B.
      As[ty][tx] = (row_ok && k0 + tx < k) ? to_f32(ar[k0 + tx]) : 0.f;
      Bs[ty][tx] = (col_ok && k0 + ty < k) ? to_f32(b[(k0 + ty) * ldb + col]) : 0.f;
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTile; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
      __syncthreads();
    }
    if (row_ok && col_ok) c[row * ldc + col] = from_f32<T>(acc);
  }
}

// =================================================================================================
// Rung 3: regblock. Register blocking: a 128 x 128 block tile, 256 threads, each computing an
// 8 x 8 micro-tile of C as a sum of outer products: per k it reads 8 values of A and 8 of B from
// shared memory into registers (four LDS.128) and does 64 FFMAs with them.
//
//   * shared memory per FMA: 16 floats = 64 B feed 64 FMAs: 1 B/FMA, 8x less than the tiled rung's
//     8 B/FMA: the FFMA pipes, not the shared-memory pipe, become the limit.
//   * global per FMA: a BK-deep slice loads (128 + 128) * BK elements for 128 * 128 * BK FMAs:
//     64 FMAs per element loaded (fp32: 0.0625 B/FMA, 4x less than the 32 x 32 tile's 16 FMAs
//     per element); tile arithmetic intensity 2 * 128 * 128 / (256 * 4 B) = 32 FLOP/B in fp32.
//   * each thread loads one 16-byte vector of A and one of B per slice (LDG.128 where the row is
//     16-byte aligned and in bounds; element by element at the edges), BK = 8 for fp32 and 16 for
//     fp16/bf16 so that the vector is always 16 bytes. Elements are converted to fp32 on the way
//     into shared memory (fp32 FMA on every dtype).
//   * double buffering: the next slice's global loads are issued into registers before the
//     current slice's math and stored to the other shared buffer after it: one __syncthreads per
//     slice and the global latency hidden behind 64 * BK FFMAs per thread.
//   * the micro-tile is split 4+4 rows (ty*4, 64 + ty*4) and 4+4 columns (tx*4, 64 + tx*4), so a
//     quarter-warp's LDS.128 of B covers 128 contiguous bytes (no bank conflict), and A is stored
//     transposed (As[k][m]) so its 8 values are two LDS.128 too.
// Registers: 64 accumulators + 16 operands + the prefetch vectors. (measured: see benchmarks/results)
// =================================================================================================
namespace rb {
constexpr int BM = 128, BN = 128, THREADS = 256;
constexpr int APAD = 4;  // As rows of BM + 4 floats: the transposed stores of the two threads sharing
                         // a row land in different banks (fp32); LDS.128 alignment is kept (528 B)
}  // namespace rb

// Four consecutive outputs of a row of C from fp32: one 16-byte (fp32) or 8-byte (16-bit) store
// when allowed, element by element at the right edge.
template <typename T>
__device__ __forceinline__ void store4(T* crow, int64_t col, int64_t n, bool vec_ok, float4 v) {
  if (vec_ok && col + 4 <= n) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(crow + col) = v;
    } else {
      union { T h[4]; uint2 u; } p;
      p.h[0] = from_f32<T>(v.x); p.h[1] = from_f32<T>(v.y);
      p.h[2] = from_f32<T>(v.z); p.h[3] = from_f32<T>(v.w);
      *reinterpret_cast<uint2*>(crow + col) = p.u;
    }
    return;
  }
  const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < n) crow[col + j] = from_f32<T>(f[j]);
}

// Elements i0 .. i0+N-1 of a row of `len` (N = one 16-byte vector), zero past the end or when the
// row itself is out of range; one LDG.128 when `vec_ok` (aligned rows) and fully in bounds.
template <typename T>
__device__ __forceinline__ Vec<T> load_row_vec(const T* row, bool row_ok, int64_t i0, int64_t len,
                                               bool vec_ok) {
  constexpr int N = Vec<T>::N;
  Vec<T> v;
  if (row_ok && vec_ok && i0 + N <= len) {
    v.raw = __ldg(reinterpret_cast<const uint4*>(row + i0));
    return v;
  }
#pragma unroll
  for (int e = 0; e < N; ++e) v.set(e, (row_ok && i0 + e < len) ? to_f32(row[i0 + e]) : 0.f);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(rb::THREADS)
matmul_regblock_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t m,
                       int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t n_tiles,
                       int64_t tiles) {
  using namespace rb;
  constexpr int N = Vec<T>::N;   // elements per 16-byte vector: 4 (fp32) or 8 (fp16/bf16)
  constexpr int BK = 2 * N;      // 8 or 16: BM * BK / THREADS = N, one vector of A per thread
  constexpr int A_TPR = BK / N;  // threads per row of the A slice (2)
  constexpr int B_TPR = BN / N;  // threads per row of the B slice (32 or 16)
  static_assert(BM * BK / THREADS == N && BK * BN / THREADS == N, "one vector of A and B per thread");

  __shared__ __align__(16) float As[2][BK][BM + APAD];  // transposed: As[k][m]
  __shared__ __align__(16) float Bs[2][BK][BN];         // Bs[k][n]

  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;  // the 16 x 16 grid of 8 x 8 micro-tiles
  // Loader mapping: A slice element (a_r, a_k .. a_k+N-1), B slice element (b_r, b_c .. b_c+N-1).
  const int a_r = tid / A_TPR, a_k = (tid % A_TPR) * N;
  const int b_r = tid / B_TPR, b_c = (tid % B_TPR) * N;
  const bool a_vec = lda % N == 0 && aligned16(a);
  const bool b_vec = ldb % N == 0 && aligned16(b);
  const bool c_vec = ldc % 4 == 0 && (reinterpret_cast<uintptr_t>(c) % (4 * sizeof(T))) == 0;

  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t m0 = (t / n_tiles) * BM, n0 = (t % n_tiles) * BN;
    const int64_t arow = m0 + a_r;
    const bool arow_ok = arow < m;
    const T* ap = a + (arow_ok ? arow : 0) * lda;
    const int64_t bcol = n0 + b_c;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    auto load = [&](int64_t k0, Vec<T>& va, Vec<T>& vb) {
      va = load_row_vec(ap, arow_ok, k0 + a_k, k, a_vec);
      const int64_t krow = k0 + b_r;
      const bool krow_ok = krow < k;
      vb = load_row_vec(b + (krow_ok ? krow : 0) * ldb, krow_ok, bcol, n, b_vec);
    };
    auto store = [&](int buf, const Vec<T>& va, const Vec<T>& vb) {
#pragma unroll
      for (int e = 0; e < N; ++e) As[buf][a_k + e][a_r] = va.get(e);
#pragma unroll
      for (int e = 0; e < N; e += 4)
        *reinterpret_cast<float4*>(&Bs[buf][b_r][b_c + e]) =
            make_float4(vb.get(e), vb.get(e + 1), vb.get(e + 2), vb.get(e + 3));
    };

    const int64_t ktiles = (k + BK - 1) / BK;
    Vec<T> va, vb;
    load(0, va, vb);
    store(0, va, vb);
    __syncthreads();
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      const int buf = static_cast<int>(kt & 1);
      const bool more = kt + 1 < ktiles;
      if (more) load((kt + 1) * BK, va, vb);  // in flight during the math below
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4]);
        const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][kk][64 + ty * 4]);
        const float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4]);
        const float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][kk][64 + tx * 4]);
        const float ra[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float rb_[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(ra[i], rb_[j], acc[i][j]);
      }
      // The other buffer was last read in iteration kt - 1, before its closing __syncthreads.
      if (more) store(buf ^ 1, va, vb);
      __syncthreads();
    }

    // Epilogue: micro-tile row i -> tile row (i < 4 ? ty*4 + i : 64 + ty*4 + i-4), columns likewise.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
      if (row >= m) continue;
      T* crow = c + row * ldc;
      store4(crow, n0 + tx * 4, n, c_vec, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
      store4(crow, n0 + 64 + tx * 4, n, c_vec, make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]));
    }
  }
}

// =================================================================================================
// Rung 4: mma. Tensor cores through mma.sync.m16n8k16 (fp16/bf16 in, fp32 accumulate), operands
// fed by ldmatrix from shared memory, shared memory fed by a 4-stage cp.async pipeline.
//
// Why it is faster than regblock, in numbers:
//   * math: one mma.sync.m16n8k16 is 16*8*16 = 2,048 FMAs for one warp instruction, against 32 for
//     an FFMA: the H100's tensor cores do ~15x the dense FLOPs of its fp32 pipes (989 vs 67
//     TFLOP/s dense, SXM datasheet). Everything else exists to keep them fed.
//   * registers: each warp owns a 64 x 64 tile of C = 4 x 8 m16n8 accumulator tiles = 128 fp32
//     registers per thread. Per 16-deep k step it loads 4 A fragments (16 x 16, one ldmatrix.x4
//     each) and 8 B fragments (16 x 8; ldmatrix.x4.trans loads two) = 8 ldmatrix.x4 = 4 KB of
//     shared memory, and issues 32 mma = 65,536 FMAs: 0.0625 smem bytes per FMA (16x less than
//     regblock's 1 B/FMA). The fragments are double-buffered in registers: the ldmatrix for the
//     next k step is issued before the 32 mma of the current one.
//   * shared memory: block tile 128 x 256 x 32 (8 warps as 2 (M) x 4 (N), 64 x 64 each): a stage
//     is (128 + 256) * 32 * 2 B = 24 KB for 128 * 256 * 32 = 1 Mi FMAs: 0.0234 global bytes per
//     FMA, arithmetic intensity 85 FLOP/B per tile (regblock fp32: 32 FLOP/B).
//   * latency: cp.async (16-byte, .cg: L2 -> shared memory, bypassing registers and L1) with
//     STAGES = 4 buffers: three 32-deep slices are in flight while the fourth is multiplied, one
//     __syncthreads per slice. 4 * 24 KB = 96 KB of dynamic shared memory; ~250 registers x 256
//     threads (ptxas, CUDA 13.0, no spills) make it one block (8 warps) per SM, so the ILP of 32
//     independent mma per warp and the deep pipeline, not occupancy, hide the latencies.
//   * bank conflicts: ldmatrix reads eight 16-byte rows per phase, which must sit in 8 different
//     16-byte bank groups. Rows of A are 64 B (32 bf16) and rows of B 512 B (256 bf16; 256 B at
//     BN = 128), so eight consecutive rows would collide 4-way (A) and 8-way (B) unswizzled. The
//     16-byte chunk index is XORed with the row: A chunk c of row r at c ^ ((r >> 1) & 3)
//     (c ^ (r & 7) for 128-byte rows, BK = 64), B chunk c at c ^ (r & 7) -- a permutation inside
//     each 128-byte line, so cp.async's writes stay whole lines too.
//   * L2: blocks walk tiles grouped kGroupM = 8 tile-rows down a column of tiles, so a wave of
//     ~132 blocks reads ~8 A tile-rows and its B columns instead of ~1 A row and all of B.
//   * epilogue: fp32 -> fp16/bf16 pairs straight from the accumulators, 32-bit stores.
// The tile shape, pipeline depth, blocks per SM and fragment buffering are template parameters
// (mma::Cfg); "mma" runs mma::kDefault (128 x 128 x 32, 4 stages, 2 blocks an SM: measured the
// fastest of the six, see kDefault), and a
// few other configurations are exposed by name, mma_<BM>x<BN>x<BK>_s<STAGES>[_sb], so that they can
// be timed side by side: the list, with the rationale of each and its ptxas numbers, is at the
// configurations in namespace mma below.
// Target for bf16 4096^3 on an H100: >= 55% of cuBLAS. (measured: see benchmarks/results)
//
// Edges (exact for any m, n, k): cp.async's src-size operand copies that many bytes and zero-fills
// the rest of the 16-byte chunk: rows past m (A) or k (B) copy 0 bytes; a chunk that straddles k
// (A) or n (B) copies only the elements before it (lda, ldb multiples of 8 keep every chunk start
// 16-byte aligned). Zeros in both operands make the padded products exactly 0. Stores are guarded
// per element pair. Requirements (matmul_unsupported): fp16/bf16, lda, ldb, ldc % 8 == 0 and
// 16-byte aligned pointers.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16/.f16; g = lane >> 2, t = lane & 3):
//   A (16 x 16, row): a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]
//                     a[2] = A[g][2t+8, +9]   a[3] = A[g+8][2t+8, +9]       (low half = lower k)
//   B (16 x 8, col):  b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]        (B as k x n)
//   C (16 x 8, f32):  c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// ldmatrix.x4: lanes 8i .. 8i+7 give the addresses of rows 0..7 of matrix i; register i of lane l
// receives matrix i's row l >> 2, elements 2(l & 3), 2(l & 3)+1 (so register i = fragment reg i
// when matrix i is the right 8 x 8 block). With .trans, register i receives matrix i's elements
// (row 2(l & 3), column l >> 2) and (row 2(l & 3)+1, column l >> 2).
//   A, m-tile at rows R, k step at K: matrix 0 = rows R..R+7, k K..K+7; 1 = rows R+8..R+15, k K..;
//     2 = rows R..R+7, k K+8..; 3 = rows R+8.., k K+8.. => lane l addresses row R + (l & 15),
//     k chunk K/8 + (l >> 4). Register i then is exactly a[i] above.
//   B stored k-major (Bs[k][n], as in global), n-tiles N and N+8 at k step K, with .trans:
//     matrix 0 = k K..K+7, n N..N+7 -> b[0] of n-tile N; 1 = k K+8..K+15, n N.. -> b[1] of N;
//     2 = k K..K+7, n N+8.. -> b[0] of N+8; 3 = k K+8.., n N+8.. -> b[1] of N+8
//     => lane l addresses k row K + (l & 15), n chunk N/8 + (l >> 4). With .trans, lane l's
//     register 0 = (k K+2t, n N+g), (k K+2t+1, n N+g) = b[0] above.
// =================================================================================================
namespace mma {

// One tile configuration of the kernel: block tile BM x BN x BK (BK = one pipeline slice), a
// WARPS_M x WARPS_N grid of warps each owning a (BM / WARPS_M) x (BN / WARPS_N) tile of C, STAGES
// shared-memory buffers, MIN_BLOCKS the blocks per SM promised to ptxas (__launch_bounds__: it caps
// the registers at 65536 / (MIN_BLOCKS * THREADS), 255 at most), FRAG_DB whether the ldmatrix
// fragments are double-buffered in registers (the next k step's loads issued before the current
// step's mma; without it a step's fragments are loaded just before its mma, 2 * (MT * 4 + NT * 2)
// registers fewer).
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_, bool FRAG_DB_>
struct Cfg {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr bool FRAG_DB = FRAG_DB_;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;       // warp tile (64 x 64 in all shipped)
  static constexpr int MT = WM / 16, NT = WN / 8;                  // m16n8 accumulator tiles per warp
  static constexpr int A_ROW_BYTES = BK * 2;                       // 64 | 128
  static constexpr int A_CPR = BK / 8;                             // 16-byte chunks per A row: 4 | 8
  static constexpr int A_ROWS_PER_PASS = THREADS / A_CPR;          // A rows one pass of the block copies
  static constexpr int A_CHUNKS = BM / A_ROWS_PER_PASS;            // A chunks per thread per slice
  static constexpr int B_ROW_BYTES = BN * 2;                       // 256 | 512
  static constexpr int B_CPR = BN / 8;                             // 16-byte chunks per B row: 16 | 32
  static constexpr int B_ROWS_PER_PASS = THREADS / B_CPR;          // B rows (k) one pass copies
  static constexpr int B_CHUNKS = BK / B_ROWS_PER_PASS;            // B chunks per thread per slice
  static constexpr int A_STAGE_BYTES = BM * A_ROW_BYTES;
  static constexpr int B_STAGE_BYTES = BK * B_ROW_BYTES;
  static constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;
  static constexpr int KSTEPS = BK / 16;                           // mma k steps per slice

  static_assert(BK == 32 || BK == 64, "A rows of 64 or 128 bytes (the A swizzle below)");
  static_assert(BM % WARPS_M == 0 && BN % WARPS_N == 0 && WM % 16 == 0 && WN % 16 == 0,
                "warp tiles of whole m16 tiles and pairs of n8 tiles (one ldmatrix.x4.trans each)");
  static_assert(STAGES >= 2 && MIN_BLOCKS >= 1, "a pipeline");
  // Loader: pass p, thread tid copies A row tid / A_CPR + p * A_ROWS_PER_PASS, chunk tid % A_CPR,
  // and B row tid / B_CPR + p * B_ROWS_PER_PASS, chunk tid % B_CPR. Both swizzles depend on the row
  // mod 8 only, so rows-per-pass multiples of 8 give every pass of a thread the same swizzled chunk.
  static_assert(THREADS % A_CPR == 0 && A_ROWS_PER_PASS % 8 == 0 && BM % A_ROWS_PER_PASS == 0 && A_CHUNKS <= 32,
                "A slice: whole passes, swizzle invariant across passes, a validity bit per chunk");
  static_assert(B_CPR % 8 == 0 && THREADS % B_CPR == 0 && B_ROWS_PER_PASS % 8 == 0 && BK % B_ROWS_PER_PASS == 0,
                "B slice: rows of whole 128-byte lines (the swizzle), whole passes, swizzle invariant across passes");
  static_assert(SMEM_BYTES <= 227 * 1024 && (SMEM_BYTES + 1024) * MIN_BLOCKS <= 228 * 1024,
                "shared memory (sm_90: 227 KB a block, 228 KB an SM, 1 KB of it reserved per block)");

  // Swizzled 16-byte chunk of A row r: a permutation of the chunks inside each 128-byte line such
  // that 8 consecutive rows put the same logical chunk in 8 different bank groups. 64-byte rows
  // (two rows a line): c ^ ((r >> 1) & 3). 128-byte rows: c ^ (r & 7).
  __device__ static __forceinline__ int a_swz(int r, int c) { return A_CPR == 4 ? c ^ ((r >> 1) & 3) : c ^ (r & 7); }
};

// The configurations, by name ("mma_<BM>x<BN>x<BK>_s<STAGES>[_sb]"; "mma" runs kDefault). All warp
// tiles are 64 x 64 (128 fp32 accumulators a thread, 8 ldmatrix.x4 per 32 mma). ptxas (CUDA 13.0,
// sm_90, fp16 and bf16 alike): registers, 0 spills in all.
//   mma_128x256x32_s4     8 warps 2 x 4, 96 KB, 1 block/SM, 252 regs. The first baseline:
//                         the biggest tile 8 warps of 64 x 64 make (fewest L2 bytes per FMA, 0.0234);
//                         one __syncthreads per 2 k steps stalls the whole SM.
//   mma_128x256x64_s3     8 warps 2 x 4, 144 KB, 1 block/SM, single-buffered fragments (double-
//                         buffered spills), 221 regs: half the barriers per FLOP.
//   mma_256x128x32_s4     8 warps 4 x 2, 96 KB, 1 block/SM, 254 regs: the transposed tile (256-byte
//                         B rows, twice the A bytes of B); same traffic, other L2 / smem pattern.
//   mma_128x128x32_s4     4 warps 2 x 2, 64 KB, 2 blocks/SM, 254 regs: the same 8 warps an SM, but
//                         one block's barriers, prologue and epilogue are covered by the other
//                         block's mma (0.031 B/FMA from L2, a third more than 128 x 256).
//   mma_128x128x64_s3     4 warps 2 x 2, 96 KB, 2 blocks/SM, 255 regs: the above with half the
//                         barriers.
//   mma_128x256x32_s4_sb  the baseline with single-buffered fragments, 216 regs: against the
//                         baseline, what the register double buffer buys; against
//                         mma_128x256x64_s3 (also single-buffered), what halving the barriers buys.
using C128x256x32s4 = Cfg<128, 256, 32, 2, 4, 4, 1, true>;
using C128x256x64s3 = Cfg<128, 256, 64, 2, 4, 3, 1, false>;
using C256x128x32s4 = Cfg<256, 128, 32, 4, 2, 4, 1, true>;
using C128x128x32s4 = Cfg<128, 128, 32, 2, 2, 4, 2, true>;
using C128x128x64s3 = Cfg<128, 128, 64, 2, 2, 3, 2, true>;
using C128x256x32s4sb = Cfg<128, 256, 32, 2, 4, 4, 1, false>;
// Tried and dropped (H100, 4096^3 bf16, 2026-11-22): ncu showed mma_128x128x32_s4 issuing on only
// 42% of cycles with 2 warps a scheduler, its top stall a fixed-latency dependency, so 16-warp
// configurations of 32 x 64 warp tiles (126-128 registers, single-buffered fragments) were timed:
// 128 x 128 x 32 s4 at 2 blocks/SM 338 TFLOP/s, 256 x 128 x 32 s3 300, 128 x 256 x 32 s3 304 --
// all slower than the 64 x 64 warp tiles (376-395): the extra ldmatrix per mma and the lost
// fragment double buffer cost more than the occupancy bought.
// what "mma" runs: the fastest measured (H100, 4096^3 bf16, 2026-11-22, one run: 376 TFLOP/s against
// 351 for 128 x 256 x 32 s4, 355 for 128 x 256 x 64 s3, 374 for 256 x 128 x 32 s4, 370 for
// 128 x 128 x 64 s3, 321 for 128 x 256 x 32 s4 sb; cuBLAS 773)
using kDefault = C128x128x32s4;
}  // namespace mma

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <typename T, typename C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
matmul_mma_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t m,
                  int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t m_tiles,
                  int64_t n_tiles) {
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, STAGES = C::STAGES;
  constexpr int WM = C::WM, WN = C::WN, MT = C::MT, NT = C::NT, WARPS_N = C::WARPS_N;
  constexpr int B_ROW_BYTES = C::B_ROW_BYTES;
  constexpr int FB = C::FRAG_DB ? 2 : 1;  // fragment buffers
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;

  // ---- loader mapping (16-byte chunks = 8 elements) -----------------------------------------
  // A slice: BM rows x A_CPR chunks; thread chunk i: row tid / A_CPR + A_ROWS_PER_PASS i, chunk
  // tid % A_CPR. B slice: BK rows x B_CPR chunks; thread chunk i: row tid / B_CPR +
  // B_ROWS_PER_PASS i, chunk tid % B_CPR (consecutive threads copy consecutive 16 bytes of a row;
  // A_CPR and B_CPR are powers of two).
  // Swizzled destinations (byte offsets in a stage); the swizzle of the rows r + A_ROWS_PER_PASS i
  // (A, 64-byte rows: (r >> 1) & 3; 128-byte rows: r & 7) and r + B_ROWS_PER_PASS i (B: r & 7)
  // does not depend on i (rows per pass are multiples of 8): one swizzled chunk each.
  const int a_c = tid & (C::A_CPR - 1), a_r0 = tid / C::A_CPR;  // (& rather than %: ptxas saves registers)
  const int b_c = tid & (C::B_CPR - 1), b_r0 = tid / C::B_CPR;
  const uint32_t a_dst = a_r0 * C::A_ROW_BYTES + (C::a_swz(a_r0, a_c) << 4);
  const uint32_t b_dst = C::A_STAGE_BYTES + b_r0 * B_ROW_BYTES + ((b_c ^ (b_r0 & 7)) << 4);

  // ---- ldmatrix addressing (byte offsets inside a stage; see the layout notes above) ---------
  // A, m-tile i, k step s: row warp_m*WM + 16 i + (lane & 15), chunk 2 s + (lane >> 4); the row's
  // swizzle depends on (lane & 15) only, since WM warp_m + 16 i is a multiple of 16. Step s
  // differs from step 0 by the chunk bits 1.. of 2 s, which the swizzle (an XOR of the chunk)
  // passes through: offset(s) = a_ld ^ (s << 5).
  const uint32_t a_ld = (warp_m * WM + (lane & 15)) * C::A_ROW_BYTES + (C::a_swz(lane & 15, lane >> 4) << 4);
  // B, n-tile pair j (n-tiles 2j, 2j+1), k step s: k row 16 s + (lane & 15), chunk
  // warp_n*(WN/8) + 2 j + (lane >> 4), swizzled with (k row & 7) = (lane & 7); the k step's
  // 16 rows (s * 16 * B_ROW_BYTES) leave the swizzle unchanged. warp_n*(WN/8) is a multiple of the
  // power of two WN/8 > 2 j + 1, so the chunk is warp_n*(WN/8) ^ (lane >> 4) ^ (lane & 7) ^ 2 j:
  // offset(j) = b_ld ^ (j << 5). (One register each instead of KSTEPS + NT/2: the 2-block
  // configurations sit at ptxas's 255.)
  static_assert(WN >= 64 && ((WN / 8) & (WN / 8 - 1)) == 0, "b_ld ^ (j << 5): WN / 8 a power of two >= 8");
  const uint32_t b_ld = C::A_STAGE_BYTES + (lane & 15) * B_ROW_BYTES +
                        ((warp_n * (WN / 8) + ((lane >> 4) ^ (lane & 7))) << 4);

  const int64_t tiles = m_tiles * n_tiles;
  const int ktiles = static_cast<int>((k + BK - 1) / BK);

  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    // Grouped order (mma_sync.cuh): kGroupM tile-rows down a column of tiles before moving right.
    int64_t mi, ni;
    grouped_tile(t, m_tiles, n_tiles, mi, ni);
    const int64_t m0 = mi * BM, n0 = ni * BN;

    // Loader state for this tile, advanced by one slice per load_slice call (slices are loaded
    // in order 0, 1, 2, ...): source pointers of the thread's first A and B chunk at the current
    // slice, and the k elements left from the slice's start. A: row validity is fixed (a bit per
    // chunk), the bytes of the chunk (partial at k) vary with the slice. B: the bytes of the
    // chunk (partial at n) are fixed, the validity of its k rows varies. Out-of-range rows are
    // clamped to row 0 so that no pointer runs wild; a chunk of 0 bytes reads nothing and is
    // given the matrix's base pointer.
    const int64_t a_row = m0 + a_r0;
    unsigned a_ok = 0;
#pragma unroll
    for (int i = 0; i < C::A_CHUNKS; ++i) a_ok |= (a_row + C::A_ROWS_PER_PASS * i < m ? 1u : 0u) << i;
    const T* a_ptr = a + (a_ok & 1u ? a_row : 0) * lda + a_c * 8;
    const int64_t a_next = C::A_ROWS_PER_PASS * lda;  // to chunk i + 1
    const int64_t b_col = n0 + b_c * 8;
    const int64_t b_left = n - b_col;
    const int b_bytes = b_left >= 8 ? 16 : (b_left > 0 ? static_cast<int>(b_left) * 2 : 0);
    const T* b_ptr = b + (b_bytes ? b_col : 0) + b_r0 * ldb;
    const int64_t b_next = C::B_ROWS_PER_PASS * ldb;  // to chunk i + 1
    int64_t k_rem = k;

    auto load_slice = [&](int stage) {
      const uint32_t base = smem0 + stage * C::STAGE_BYTES;
      const int kl = static_cast<int>(k_rem < BK ? k_rem : BK);  // valid k of this slice, 1..BK
      const int a_left = kl - a_c * 8;                            // of this thread's A chunk
      const int a_kbytes = a_left >= 8 ? 16 : (a_left > 0 ? a_left * 2 : 0);
#pragma unroll
      for (int i = 0; i < C::A_CHUNKS; ++i) {
        const int bytes = (a_ok >> i) & 1u ? a_kbytes : 0;
        cp_async16(base + a_dst + i * C::A_ROWS_PER_PASS * C::A_ROW_BYTES, bytes ? a_ptr + i * a_next : a, bytes);
      }
#pragma unroll
      for (int i = 0; i < C::B_CHUNKS; ++i) {
        const int bytes = b_r0 + C::B_ROWS_PER_PASS * i < kl ? b_bytes : 0;
        cp_async16(base + b_dst + i * C::B_ROWS_PER_PASS * B_ROW_BYTES, bytes ? b_ptr + i * b_next : b, bytes);
      }
      a_ptr += BK;
      b_ptr += BK * ldb;
      k_rem -= BK;
    };

    float acc[MT][NT][4];
    zero_acc(acc);

    uint32_t af[FB][MT][4];  // FRAG_DB: fragments of k step s live in af[s & 1]; else in af[0]
    uint32_t bf[FB][NT][2];
    auto load_frags = [&](int buf, int stage, int s) {
      const uint32_t base = smem0 + stage * C::STAGE_BYTES;
#pragma unroll
      for (int i = 0; i < MT; ++i)
        ldmatrix_x4(af[buf][i], base + (a_ld ^ (s << 5)) + i * 16 * C::A_ROW_BYTES);
#pragma unroll
      for (int j = 0; j < NT / 2; ++j)
        ldmatrix_x4_trans(bf[buf][2 * j][0], bf[buf][2 * j][1], bf[buf][2 * j + 1][0],
                          bf[buf][2 * j + 1][1], base + (b_ld ^ (j << 5)) + s * 16 * B_ROW_BYTES);
    };
    auto mma_step = [&](int buf) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_16816<T>(acc[i][j], af[buf][i], bf[buf][j]);
    };

    // Prologue: slices 0 .. STAGES-2 in flight (one commit group each, empty past the end so the
    // group count stays uniform), then wait for slice 0.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < ktiles) load_slice(s);
      cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();

    int read_stage = 0, write_stage = STAGES - 1;
    if constexpr (C::FRAG_DB) {
      load_frags(0, 0, 0);
      for (int kt = 0; kt < ktiles; ++kt) {
#pragma unroll
        for (int s = 0; s < C::KSTEPS; ++s) {  // the 16-deep k steps of the slice
          if (s == C::KSTEPS - 1) {
            // The next fragments come from slice kt + 1. Groups committed so far: (STAGES - 1) +
            // (kt + 1); leaving STAGES - 2 pending means slices 0 .. kt + 1 have landed (this
            // thread's copies), and the barrier makes every thread's copies visible. It also tells
            // the refill at the next step 0 that every warp is done reading slice kt's stage.
            cp_async_wait<STAGES - 2>();
            __syncthreads();
            read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
          }
          load_frags((s + 1) & 1, read_stage, (s + 1) % C::KSTEPS);
          if (s == 0) {
            // Refill the stage of slice kt - 1 (== (kt + STAGES - 1) % STAGES) with slice
            // kt + STAGES - 1: its last ldmatrix was at slice kt - 1, step KSTEPS - 2, before the
            // barrier of slice kt - 1, step KSTEPS - 1, which every warp has passed.
            if (kt + STAGES - 1 < ktiles) load_slice(write_stage);
            cp_async_commit();
            write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
          }
          mma_step(s & 1);
        }
      }
    } else {
      for (int kt = 0; kt < ktiles; ++kt) {
#pragma unroll
        for (int s = 0; s < C::KSTEPS; ++s) {
          load_frags(0, read_stage, s);
          if (s == 0) {
            // Refill the stage of slice kt - 1 with slice kt + STAGES - 1: every warp finished
            // reading it before the barrier that closed slice kt - 1.
            if (kt + STAGES - 1 < ktiles) load_slice(write_stage);
            cp_async_commit();
            write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
          }
          mma_step(0);
        }
        // Slices 0 .. kt + 1 landed (groups committed: STAGES - 1 + kt + 1) and visible to all;
        // every warp is done reading slice kt's stage.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
      }
    }

    store_acc<T>(acc, c, m, n, ldc, m0 + warp_m * WM, n0 + warp_n * WN, lane);

    // Before another tile's prologue overwrites the stages: no copies pending, no warp still
    // reading (the last load_frags read a stage that the next prologue may refill).
    cp_async_wait<0>();
    __syncthreads();
  }
}

template <typename T, typename C>
cudaError_t launch_mma(const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k, int64_t lda,
                       int64_t ldb, int64_t ldc, cudaStream_t stream) {
  constexpr auto kernel = matmul_mma_kernel<T, C>;
  static std::atomic<uint64_t> smem_set{0};  // one per (T, C) instantiation
  cudaError_t err = allow_smem(kernel, C::SMEM_BYTES, smem_set);
  if (err != cudaSuccess) return err;
  const int64_t m_tiles = ceil_div(m, C::BM), n_tiles = ceil_div(n, C::BN);
  kernel<<<grid_for(m_tiles * n_tiles), C::THREADS, C::SMEM_BYTES, stream>>>(
      a, b, c, m, n, k, lda, ldb, ldc, m_tiles, n_tiles);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_mma_variant(MatmulVariant v, const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k,
                               int64_t lda, int64_t ldb, int64_t ldc, cudaStream_t stream) {
  switch (v) {
    case MatmulVariant::mma: return launch_mma<T, mma::kDefault>(a, b, c, m, n, k, lda, ldb, ldc, stream);
    case MatmulVariant::mma_128x256x32_s4:
      return launch_mma<T, mma::C128x256x32s4>(a, b, c, m, n, k, lda, ldb, ldc, stream);
    case MatmulVariant::mma_128x256x64_s3:
      return launch_mma<T, mma::C128x256x64s3>(a, b, c, m, n, k, lda, ldb, ldc, stream);
    case MatmulVariant::mma_256x128x32_s4:
      return launch_mma<T, mma::C256x128x32s4>(a, b, c, m, n, k, lda, ldb, ldc, stream);
    case MatmulVariant::mma_128x128x32_s4:
      return launch_mma<T, mma::C128x128x32s4>(a, b, c, m, n, k, lda, ldb, ldc, stream);
    case MatmulVariant::mma_128x128x64_s3:
      return launch_mma<T, mma::C128x128x64s3>(a, b, c, m, n, k, lda, ldb, ldc, stream);
    case MatmulVariant::mma_128x256x32_s4_sb:
      return launch_mma<T, mma::C128x256x32s4sb>(a, b, c, m, n, k, lda, ldb, ldc, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

const char* matmul_unsupported(MatmulVariant v, DType dt, const void* a, const void* b, const void* c,
                               int64_t lda, int64_t ldb, int64_t ldc) {
  switch (v) {
    case MatmulVariant::naive:
    case MatmulVariant::tiled:
    case MatmulVariant::regblock:
      return nullptr;  // any dtype, any leading dimensions and alignment
    case MatmulVariant::mma:
    case MatmulVariant::mma_128x256x32_s4:
    case MatmulVariant::mma_128x256x64_s3:
    case MatmulVariant::mma_256x128x32_s4:
    case MatmulVariant::mma_128x128x32_s4:
    case MatmulVariant::mma_128x128x64_s3:
    case MatmulVariant::mma_128x256x32_s4_sb:
    case MatmulVariant::mma_tma:
    case MatmulVariant::mma_tma_128x128x32_s4:
    case MatmulVariant::mma_tma_128x256x64_s3:
      if (dt != DType::f16 && dt != DType::bf16) return "the mma variants need float16 or bfloat16";
      if (lda % 8 != 0 || ldb % 8 != 0 || ldc % 8 != 0 || !aligned16(a) || !aligned16(b) || !aligned16(c))
        return "the mma variants need 16-byte aligned rows: lda, ldb, ldc multiples of 8 and 16-byte "
               "aligned pointers";
      if (is_mma_tma(v) && !mma_tma_available())
        return "the mma_tma variants need the driver's cuTensorMapEncodeTiled (CUDA 12 driver or newer)";
      return nullptr;
  }
  return "unknown matmul variant";
}

cudaError_t matmul(MatmulVariant v, DType dt, const void* a, const void* b, void* c, int64_t m, int64_t n,
                   int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int sms, cudaStream_t stream) {
  if (matmul_unsupported(v, dt, a, b, c, lda, ldb, ldc) != nullptr) return cudaErrorInvalidValue;
  if (is_mma_tma(v)) return matmul_mma_tma(v, dt, a, b, c, m, n, k, lda, ldb, ldc, sms, stream);  // rung 5
  return dispatch(dt, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    const T* A = static_cast<const T*>(a);
    const T* B = static_cast<const T*>(b);
    T* C = static_cast<T*>(c);
    switch (v) {
      case MatmulVariant::naive: {
        const int64_t n_tiles = ceil_div(n, kNaiveBX), tiles = n_tiles * ceil_div(m, kNaiveBY);
        matmul_naive_kernel<T><<<grid_for(tiles), dim3(kNaiveBX, kNaiveBY), 0, stream>>>(
            A, B, C, m, n, k, lda, ldb, ldc, n_tiles, tiles);
        return cudaGetLastError();
      }
      case MatmulVariant::tiled: {
        const int64_t n_tiles = ceil_div(n, kTile), tiles = n_tiles * ceil_div(m, kTile);
        matmul_tiled_kernel<T><<<grid_for(tiles), dim3(kTile, kTile), 0, stream>>>(
            A, B, C, m, n, k, lda, ldb, ldc, n_tiles, tiles);
        return cudaGetLastError();
      }
      case MatmulVariant::regblock: {
        const int64_t n_tiles = ceil_div(n, rb::BN), tiles = n_tiles * ceil_div(m, rb::BM);
        matmul_regblock_kernel<T><<<grid_for(tiles), rb::THREADS, 0, stream>>>(
            A, B, C, m, n, k, lda, ldb, ldc, n_tiles, tiles);
        return cudaGetLastError();
      }
      default:  // the mma configurations (matmul_unsupported let only those through, in fp16/bf16)
        if constexpr (sizeof(T) == 2) {
          return launch_mma_variant<T>(v, A, B, C, m, n, k, lda, ldb, ldc, stream);
        } else {
          return cudaErrorInvalidValue;  // unreachable: matmul_unsupported rejects fp32
        }
    }
  });
}

}  // namespace wf
