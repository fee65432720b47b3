// The C interface between the operator layer (ops.cpp: PyTorch headers, argument checks, device
// guard, stream) and the kernel translation units (*.cu: CUDA headers only).
//
// Why the split: <torch/library.h> and ATen pull in ~200k lines of C++; a .cu file that includes
// them spends most of its compile time there, on every edit of a kernel. Here the kernels see only
// raw pointers, sizes, a dtype tag and a stream, so each .cu compiles in seconds and can be built
// (and its register use checked) on a machine with nvcc and no PyTorch at all -- which is what CI
// does. Every launcher returns the launch's cudaError_t; the caller turns it into a TORCH_CHECK.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace wf {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

// ---- vector add (add.cu) ------------------------------------------------------------------
// out = x + alpha * y over n contiguous elements.
cudaError_t add_naive(DType dt, const void* x, const void* y, void* out, int64_t n, float alpha,
                      cudaStream_t stream);
cudaError_t add_vectorized(DType dt, const void* x, const void* y, void* out, int64_t n, float alpha,
                           int sms, cudaStream_t stream);

// ---- row reductions (reduce.cu) -----------------------------------------------------------
// y[r] = sum or max of x[r, 0:n] for r < m; rows have unit column stride and row stride sx
// (elements). y has dtype out_dt. Long rows on few rows are split into chunks whose fp32
// partials go to `work` (reduce_workspace_floats() of them; may be 0).
int64_t reduce_workspace_floats(DType in_dt, int64_t m, int64_t n, int sms);
// Probe knobs for launch-shape sweeps (0 = the heuristic): deep (1 wide: 32 registers, full
// occupancy; 2 deep: 64 registers, every load of a trip in flight), chunks per long row, threads
// per long-row block, the longest row (elements) one warp reduces, persistent (1: a grid of one
// wave, equal items a block). Process-wide; probes only.
struct ReduceTuning {
  int deep, chunks, threads, warp_row_max, persistent;
};
void set_reduce_tuning(const ReduceTuning& t);
cudaError_t reduce_rows(DType in_dt, DType out_dt, const void* x, void* y, float* work, int64_t m,
                        int64_t n, int64_t sx, bool is_max, int sms, cudaStream_t stream);

// ---- softmax (softmax.cu) -----------------------------------------------------------------
// One launch shape for a row length, chosen by the Python heuristics (runtime/heuristics.py):
// threads per block, 16-byte vectors held per thread, blocks per row (a thread-block cluster).
// threads == 32 and cluster == 1 with rows_per_block > 1 is the warp-per-row kernel; vpt == 0
// is the looped kernel for rows longer than any register-resident shape.
struct RowConfig {
  int threads;
  int vpt;
  int cluster;
  int rows_per_block;
};
// nullptr when `cfg` can run rows of n elements of dt (forward or backward), else why not.
const char* softmax_config_error(DType dt, int64_t n, RowConfig cfg, bool backward);
cudaError_t softmax_fwd(DType dt, const void* x, void* y, int64_t m, int64_t n, int64_t sx, int64_t sy,
                        bool log, RowConfig cfg, cudaStream_t stream);
cudaError_t softmax_bwd(DType dt, const void* y, const void* dy, void* dx, int64_t m, int64_t n, int64_t sy,
                        int64_t sdy, int64_t sdx, bool log, RowConfig cfg, cudaStream_t stream);

// ---- matrix multiply (matmul.cu) ----------------------------------------------------------
// C (m, n) = A (m, k) @ B (k, n), all row-major with leading dimensions lda, ldb, ldc
// (elements), fp32 accumulation, C written in dt. The ladder of variants; mma runs the default tile
// configuration, mma_<BM>x<BN>x<BK>_s<STAGES>[_sb] each a named one (matmul.cu, namespace mma);
// mma_tma and mma_tma_<config> the same for rung 5 (mma_tma.cu, namespace tma).
enum class MatmulVariant : int {
  naive = 0,
  tiled = 1,
  regblock = 2,
  mma = 3,
  mma_128x256x32_s4 = 4,
  mma_128x256x64_s3 = 5,
  mma_256x128x32_s4 = 6,
  mma_128x128x32_s4 = 7,
  mma_128x128x64_s3 = 8,
  mma_128x256x32_s4_sb = 9,
  // rung 5 (mma_tma.cu): the same math fed by TMA through an mbarrier pipeline
  mma_tma = 10,
  mma_tma_128x128x32_s4 = 11,
  mma_tma_128x256x64_s3 = 12,
};
inline bool is_mma_tma(MatmulVariant v) {
  return static_cast<int>(v) >= static_cast<int>(MatmulVariant::mma_tma) &&
         static_cast<int>(v) <= static_cast<int>(MatmulVariant::mma_tma_128x256x64_s3);
}
// Whether `v` can run this problem as laid out (dtype, alignment); the operator checks this first
// and reports the reason.
const char* matmul_unsupported(MatmulVariant v, DType dt, const void* a, const void* b, const void* c,
                               int64_t lda, int64_t ldb, int64_t ldc);
// sms: the device's multiprocessor count (the persistent mma_tma grid; the other rungs ignore it).
cudaError_t matmul(MatmulVariant v, DType dt, const void* a, const void* b, void* c, int64_t m, int64_t n,
                   int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int sms, cudaStream_t stream);
// mma_tma.cu (called by matmul for the mma_tma variants); whether the driver gives the tensor-map
// encoder that rung needs.
cudaError_t matmul_mma_tma(MatmulVariant v, DType dt, const void* a, const void* b, void* c, int64_t m, int64_t n,
                           int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int sms, cudaStream_t stream);
bool mma_tma_available();

// ---- LayerNorm forward, LayerNorm / RMSNorm backward over long rows (norm.cu) -----------------
// A row spread over a thread-block cluster: block b of `cluster` owns columns [b n / cluster,
// (b + 1) n / cluster) of every row, exactly threads x vpt 16-byte vectors of them (so n =
// cluster x threads x vpt x 8); groups of `rows` rows reach shared memory `stages` groups ahead by
// the bulk copy engine. 16-bit dtypes; x, y, w and b 16-byte aligned with row strides sx, sy
// (elements) that keep every row so. w and b may be null (weight 1, bias 0); mean may be null.
// mean and rstd: fp32, one a row.
struct NormClusterConfig {
  int cluster, threads, vpt, rows, stages;
  int per_sm = 1;   // blocks resident on an SM (the softmax forward: 1 or 2; the norm kernels: 1)
};
// nullptr when `cfg` can run rows of n elements of dt, else why not.
const char* layer_norm_cluster_config_error(DType dt, int64_t n, NormClusterConfig cfg);
cudaError_t layer_norm_fwd_cluster(DType dt, const void* x, void* y, const void* w, const void* b, float* mean,
                                   float* rstd, int64_t m, int64_t n, int64_t sx, int64_t sy, float eps,
                                   NormClusterConfig cfg, cudaStream_t stream);
// The backward of LayerNorm (rms false: mean read) or RMSNorm (rms true: mean unused; w + offset),
// same layout rules, dx written with row stride sdx; x and dy staged together (2 x the forward's
// shared memory); 128 or 256 threads, or 512 at up to 2 vectors a thread. dw_part / db_part
// (either may be null): (parts, n) fp32 row-major; at most `parts` clusters run (when parts > 0);
// cluster c writes its partial sums into row c and zeros into the rows past the clusters that ran;
// the caller sums the rows. w may be null (weight 1).
// dsum (may be null): add+RMSNorm's gradient reaching the residual sum, added to dx, row stride
// sds (rms only; 256 threads, at most 2 rows a group and 8 vectors a thread over them).
const char* norm_bwd_cluster_config_error(DType dt, int64_t n, NormClusterConfig cfg, bool rms, bool dsum);
cudaError_t norm_bwd_cluster(DType dt, bool rms, const void* x, const void* dy, const void* dsum, void* dx,
                             const void* w, const float* mean, const float* rstd, float* dw_part, float* db_part,
                             int64_t parts, int64_t m, int64_t n, int64_t sx, int64_t sdy, int64_t sds, int64_t sdx,
                             float offset, NormClusterConfig cfg, cudaStream_t stream);
// The softmax (log: log-softmax) forward over long rows in the same layout (softmax.cu): a row over
// a cluster, groups of rows staged in shared memory by bulk copies, the slices' (max, sum of exp)
// pairs exchanged by st.async. 16-bit dtypes; x and y 16-byte aligned with row strides sx, sy.
const char* softmax_cluster_config_error(DType dt, int64_t n, NormClusterConfig cfg);
cudaError_t softmax_fwd_cluster(DType dt, const void* x, void* y, int64_t m, int64_t n, int64_t sx, int64_t sy,
                                bool log, NormClusterConfig cfg, cudaStream_t stream);

}  // namespace wf
