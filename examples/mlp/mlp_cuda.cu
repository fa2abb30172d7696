// The MLP's forward and backward on a CUDA engine: the arithmetic of
// mlp.cpp's host loops, with cuBLAS GEMMs for the three matrix products of a
// layer and small kernels for the rest, all queued on engine.stream(). The
// host waits twice per call: at the start, where the batch is copied from
// pageable memory (a copy that first waits for the stream's earlier work;
// pinned staging would avoid it), and at the end, for the loss.
//
// Precision. cublasGemmEx takes A and B of one type, so every GEMM operand is
// in the compute dtype T: the weights as the engine holds them, and the
// activations and deltas, which are therefore kept in T (half the memory of
// fp32 in bf16/fp16, as mixed-precision training usually keeps them). cuBLAS
// accumulates in fp32 (CUBLAS_COMPUTE_32F, no TF32: the default math mode).
// A GEMM whose result goes through another step first writes fp32 (the
// pre-activations before bias and ReLU, delta W before ReLU's mask), so that
// step sees the accumulator and rounds to T once; the weight gradients are
// rounded to T by the GEMM itself, straight into the engine's buffer. In fp32
// every buffer is fp32 and the results are the host path's up to the order of
// the sums.
//
// Layout. Everything is row-major as in mlp.cpp; cuBLAS is column-major. A
// row-major M [r, c] is, in the same memory, the column-major M^T [c, r] with
// leading dimension c. For one layer (rows of the batch; in; out), row-major
//   x [rows, in]   W [out, in]   z, delta [rows, out]
// and each product is computed as its transpose, on the same pointers:
//   z  = x W^T      [rows, out]:  z^T [out, rows] = W [out, in] . x^T [in, rows]
//                   gemm(T, N, m=out, n=rows, k=in,  A=W lda=in,  B=x ldb=in,      C=z ldc=out)
//   dW = delta^T x  [out, in]:    dW^T [in, out] = x^T [in, rows] . delta [rows, out]
//                   gemm(N, T, m=in, n=out, k=rows, A=x lda=in,  B=delta ldb=out,  C=dW ldc=in)
//   dx = delta W    [rows, in]:   dx^T [in, rows] = W^T [in, out] . delta^T [out, rows]
//                   gemm(N, N, m=in, n=rows, k=out, A=W lda=in,  B=delta ldb=out,  C=dx ldc=in)
// (W's memory is the column-major W^T [in, out], so op T gives W; delta's is
// delta^T [out, rows], so op T gives delta.)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "mlp_cuda.h"
#include "zest/core/cublas_check.h"
#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#include "zest/core/float16.h"
#include "zest/memory/copy.h"

namespace mlp {
namespace {

// cuBLAS's name for each compute dtype; fp16 and bf16 are layout-compatible
// with __half and __nv_bfloat16 (core/float16.h).
template <typename T>
constexpr cudaDataType_t kCudaType = CUDA_R_32F;
template <>
constexpr cudaDataType_t kCudaType<zest::fp16> = CUDA_R_16F;
template <>
constexpr cudaDataType_t kCudaType<zest::bf16> = CUDA_R_16BF;

// The workspace given to each handle: cuBLAS's own default pool size before
// Hopper. The GEMMs here are a few hundred wide, which no algorithm needs more
// for; cuBLAS picks among those that fit. Must be 256-byte aligned, which
// every block of the caching allocator is.
constexpr size_t kCublasWorkspaceBytes = size_t{4} << 20;

// Elementwise kernels: grid-stride loops, 64-bit indices.
constexpr unsigned kThreads = 256;
unsigned blocks_for(size_t n) {
  constexpr size_t kMaxBlocks = 4096;
  return static_cast<unsigned>(std::clamp<size_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}
__device__ size_t first_index() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ size_t grid_stride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

// ZEST's storage types convert with explicit constructors and casts that
// compile for the device too (core/float16.h); for float they are identities.
template <typename T>
__device__ float widen(T v) {
  return static_cast<float>(v);
}

// out[r, c] = act(z[r, c] + b[c]): the bias, and ReLU on hidden layers.
template <typename TOut, typename T>
__global__ void bias_act_kernel(const float* z, const T* b, size_t rows, size_t cols, bool relu, TOut* out) {
  const size_t n = rows * cols;
  for (size_t i = first_index(); i < n; i += grid_stride()) {
    float v = z[i] + widen(b[i % cols]);
    if (relu && v < 0.0f) v = 0.0f;
    out[i] = TOut(v);
  }
}

// The MSE loss's sum of squares and, when delta is not null, its gradient
// times the loss scale (the host's expression, 2 diff / n x scale). One block:
// each thread sums a strided slice, then a tree in shared memory, so the sum
// is the same bits every run (atomics would not be). n is a micro-batch's
// outputs, a few thousand at most here.
constexpr unsigned kLossThreads = 256;
template <typename T>
__global__ void mse_kernel(const float* pred, const float* y, size_t n, float scale, T* delta, double* sum_sq) {
  __shared__ double partial[kLossThreads];
  double acc = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float diff = pred[i] - y[i];
    acc += static_cast<double>(diff) * diff;
    if (delta != nullptr) delta[i] = T(2.0f * diff / static_cast<float>(n) * scale);
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = kLossThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *sum_sq = partial[0];
}

// db[c] = sum over rows of delta[r, c], in row order as on the host. A
// thread per column: neighbouring threads read neighbouring elements.
template <typename T>
__global__ void column_sum_kernel(const T* delta, size_t rows, size_t cols, T* db) {
  for (size_t c = first_index(); c < cols; c += grid_stride()) {
    float acc = 0.0f;
    for (size_t r = 0; r < rows; ++r) acc += widen(delta[r * cols + c]);
    db[c] = T(acc);
  }
}

// The delta of the layer below: dx through ReLU's mask, which is where the
// layer's input (ReLU's output) is zero, as on the host.
template <typename T>
__global__ void relu_backward_kernel(const float* dx, const T* act, size_t n, T* delta) {
  for (size_t i = first_index(); i < n; i += grid_stride()) {
    delta[i] = widen(act[i]) == 0.0f ? T(0.0f) : T(dx[i]);
  }
}

// C = op(A) op(B), overwriting C (beta 0). m, n, k and the leading
// dimensions are cuBLAS's column-major ones: see the mapping at the top.
void gemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
          const void* a, int lda, const void* b, int ldb, cudaDataType_t ab_type, void* c,
          cudaDataType_t c_type, int ldc) {
  const float one = 1.0f, zero = 0.0f;  // host pointers: the handle's default pointer mode
  ZEST_CUBLAS_CHECK(cublasGemmEx(handle, op_a, op_b, m, n, k, &one, a, ab_type, lda, b, ab_type, ldb, &zero,
                                 c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// A batch's fp32 host values in T on the device. Converted on the host (the
// same rounding as the device's) so half as many bytes cross for fp16/bf16.
template <typename T>
void upload_as(const zest::Stream& stream, void* dst, const std::vector<float>& values) {
  if constexpr (std::is_same_v<T, float>) {
    zest::copy_bytes(stream, dst, values.data(), values.size() * sizeof(float));
  } else {
    std::vector<T> converted(values.size());
    std::transform(values.begin(), values.end(), converted.begin(), [](float v) { return T(v); });
    // Pageable memory: the copy returns once the source is staged, so
    // `converted` may go at scope end.
    zest::copy_bytes(stream, dst, converted.data(), converted.size() * sizeof(T));
  }
}

}  // namespace

DeviceContext::DeviceContext(zest::CachingAllocator& allocator, zest::Stream stream)
    : allocator_(allocator), stream_(stream) {
  if (!stream.device().is_cuda()) return;  // the host loops need nothing
  ZEST_CHECK(allocator.device() == stream.device(),
             "mlp::DeviceContext: the allocator is on {} but the stream on {}; give it the engine's allocator "
             "and stream",
             allocator.device().str(), stream.device().str());
  zest::DeviceGuard guard(stream.device());  // a handle belongs to the device current at cublasCreate
  cublasHandle_t handle = nullptr;
  ZEST_CUBLAS_CHECK(cublasCreate(&handle));
  try {
    // cublasSetStream puts the handle back on cuBLAS's own workspace pool, so
    // the stream first and then the workspace, which is used on that stream.
    ZEST_CUBLAS_CHECK(cublasSetStream(handle, cuda_stream(stream)));
    cublas_workspace_ = allocator.allocate_buffer(kCublasWorkspaceBytes, stream, zest::MemoryCategory::kWorkspace);
    ZEST_CUBLAS_CHECK(cublasSetWorkspace(handle, cublas_workspace_.data(), cublas_workspace_.size_bytes()));
  } catch (...) {
    ZEST_CUBLAS_WARN(cublasDestroy(handle));
    throw;
  }
  cublas_ = handle;
}

DeviceContext::~DeviceContext() {
  if (cublas_ == nullptr) return;
  try {
    zest::DeviceGuard guard(stream_.device());
    // The workspace member is freed after this, back to the allocator on the
    // handle's stream, so it is reused only after the GEMMs queued there.
    ZEST_CUBLAS_WARN(cublasDestroy(cublas_));
  } catch (const zest::Error& e) {
    ZEST_LOG_WARN("mlp::DeviceContext: could not destroy the cuBLAS handle: {}", e.what());
  }
}

template <typename T>
float run_on_device(DeviceContext& device, zest::Engine& engine, const Shape& shape, const Batch& batch,
                    bool backward) {
  const zest::Stream stream = engine.stream();
  ZEST_CHECK(device.stream() == stream && device.cublas() != nullptr,
             "mlp: the DeviceContext is bound to stream {} of {}, but the engine computes on stream {} of {}; "
             "make the context with the engine's allocator and stream",
             device.stream().id(), device.stream().device().str(), stream.id(), stream.device().str());
  const int rows = batch.rows;
  ZEST_CHECK(rows > 0 && batch.x.size() == static_cast<size_t>(rows) * shape.input &&
                 batch.y.size() == static_cast<size_t>(rows) * shape.output,
             "mlp: a batch of {} rows needs {} inputs and {} targets, got {} and {}", rows,
             static_cast<size_t>(rows) * shape.input, static_cast<size_t>(rows) * shape.output, batch.x.size(),
             batch.y.size());
  zest::DeviceGuard guard(stream.device());  // kernels run on the current device
  const auto native = cuda_stream(stream);
  cublasHandle_t handle = device.cublas();
  constexpr cudaDataType_t kT = kCudaType<T>;
  // Scratch for this call, from the engine's allocator on the compute stream.
  // Freed (at scope end, or when replaced) back to the cache for that
  // stream, so a later call reuses it only after the work queued here.
  const auto scratch = [&](size_t numel, size_t elem_size) {
    return device.allocator().allocate_buffer(numel * elem_size, stream, zest::MemoryCategory::kWorkspace);
  };
  const size_t widest = static_cast<size_t>(std::max({shape.input, shape.hidden, shape.output}));

  // acts[l]: layer l's input in T, [rows, in_of(l)], kept for backward: dW
  // needs it, and ReLU's mask is where it is zero.
  std::vector<zest::Buffer> acts(static_cast<size_t>(shape.layers));
  acts[0] = scratch(batch.x.size(), sizeof(T));
  upload_as<T>(stream, acts[0].data(), batch.x);
  // The targets too, now: a pageable copy queued after the forward would
  // wait for it.
  const size_t n = static_cast<size_t>(rows) * shape.output;
  zest::Buffer y = scratch(n, sizeof(float));
  zest::copy_bytes(stream, y.data(), batch.y.data(), n * sizeof(float));
  // fp32 GEMM results: each layer's pre-activations, then in backward each
  // delta W. Reused layer to layer; the stream orders the uses.
  zest::Buffer gemm_out = scratch(static_cast<size_t>(rows) * widest, sizeof(float));
  zest::Buffer pred = scratch(n, sizeof(float));
  for (int l = 0; l < shape.layers; ++l) {
    const int in = shape.in_of(l), out = shape.out_of(l);
    const size_t cells = static_cast<size_t>(rows) * out;
    // Without backward, an evaluation: stage 3 follows its own order.
    zest::UnitHandle unit = engine.gather(l, backward ? zest::Pass::kTraining : zest::Pass::kInference);
    const T* w = unit.param<T>(weight_name(l)).data();
    const T* b = unit.param<T>(bias_name(l)).data();
    gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, w, in, acts[static_cast<size_t>(l)].data(), in, kT,
         gemm_out.data(), CUDA_R_32F, out);
    if (l < shape.layers - 1) {
      zest::Buffer& next = acts[static_cast<size_t>(l) + 1];
      next = scratch(cells, sizeof(T));
      bias_act_kernel<T, T><<<blocks_for(cells), kThreads, 0, native>>>(gemm_out.as<float>(), b, rows, out,
                                                                       true, next.as<T>());
    } else {
      bias_act_kernel<float, T><<<blocks_for(cells), kThreads, 0, native>>>(gemm_out.as<float>(), b, rows, out,
                                                                           false, pred.as<float>());
    }
    ZEST_CUDA_KERNEL_CHECK();
  }  // at stage 3 each unit is released here; its memory is reused in stream order, after these reads
  if (!backward) engine.end_forward();

  zest::Buffer delta = backward ? scratch(n, sizeof(T)) : zest::Buffer();
  zest::Buffer sum_sq = scratch(1, sizeof(double));
  mse_kernel<T><<<1, kLossThreads, 0, native>>>(pred.as<float>(), y.as<float>(), n,
                                                static_cast<float>(engine.loss_scale()), delta.as<T>(),
                                                sum_sq.as<double>());
  ZEST_CUDA_KERNEL_CHECK();

  for (int l = shape.layers - 1; backward && l >= 0; --l) {
    const int in = shape.in_of(l), out = shape.out_of(l);
    zest::UnitHandle unit = engine.gather(l);
    zest::GradHandle grads = engine.grads(l);
    const T* x = acts[static_cast<size_t>(l)].as<T>();
    // Overwritten, not added to: this is the micro-step's only write, and the
    // engine zeroed the buffers at its first grads().
    gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, x, in, delta.data(), out, kT,
         grads.grad<T>(weight_name(l)).data(), kT, in);
    column_sum_kernel<T><<<blocks_for(static_cast<size_t>(out)), kThreads, 0, native>>>(
        delta.as<T>(), rows, out, grads.grad<T>(bias_name(l)).data());
    ZEST_CUDA_KERNEL_CHECK();
    // The engine's reduction waits for the compute stream's work so far,
    // these writes included, and runs on its own stream while backward goes
    // on below.
    grads.done();
    if (l == 0) break;
    const T* w = unit.param<T>(weight_name(l)).data();
    const size_t cells = static_cast<size_t>(rows) * in;
    gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, w, in, delta.data(), out, kT, gemm_out.data(),
         CUDA_R_32F, in);
    zest::Buffer below = scratch(cells, sizeof(T));
    relu_backward_kernel<T><<<blocks_for(cells), kThreads, 0, native>>>(gemm_out.as<float>(), x, cells,
                                                                        below.as<T>());
    ZEST_CUDA_KERNEL_CHECK();
    delta = std::move(below);
  }

  // The loss to the host, after everything above: the call's second wait.
  double host_sum_sq = 0.0;
  zest::copy_bytes(stream, &host_sum_sq, sum_sq.data(), sizeof(double));
  stream.synchronize();
  return static_cast<float>(host_sum_sq / static_cast<double>(n));
}

template float run_on_device<float>(DeviceContext&, zest::Engine&, const Shape&, const Batch&, bool);
template float run_on_device<zest::fp16>(DeviceContext&, zest::Engine&, const Shape&, const Batch&, bool);
template float run_on_device<zest::bf16>(DeviceContext&, zest::Engine&, const Shape&, const Batch&, bool);

}  // namespace mlp
