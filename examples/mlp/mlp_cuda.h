// The MLP's device path: forward and backward on a CUDA engine with cuBLAS
// GEMMs and a few small kernels (mlp_cuda.cu), chosen by forward_backward and
// evaluate (mlp.h) when the engine's stream is on a GPU.
//
//   zest::Engine engine(config, comm, allocator, stream);
//   mlp::DeviceContext device(allocator, stream);   // one per rank, after the engine
//   loss = mlp::forward_backward(engine, shape, batch, &device);
//
// In a build without CUDA, mlp_cuda_stub.cpp stands in: a context on a host
// stream holds nothing, and anything on a GPU throws, saying how to build
// with CUDA.
#pragma once

#include "mlp.h"
#include "zest/memory/caching_allocator.h"

struct cublasContext;  // cublasHandle_t is cublasContext*; no CUDA headers here

namespace mlp {

// What the device path keeps between micro-steps: a cuBLAS handle bound to
// the engine's compute stream, with a workspace of its own from `allocator`,
// and the allocator the scratch memory (activations, deltas, the batch) comes
// from. Engine does not hand out its allocator, so the context is given the
// same one: the scratch then shows in engine.memory_report() as kWorkspace.
// On a host stream it holds nothing. Neither copied nor moved: the handle
// belongs to one rank's thread.
class DeviceContext {
 public:
  DeviceContext(zest::CachingAllocator& allocator, zest::Stream stream);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  zest::CachingAllocator& allocator() const { return allocator_; }
  zest::Stream stream() const { return stream_; }
  // Bound to stream(); null on the host.
  cublasContext* cublas() const { return cublas_; }

 private:
  zest::CachingAllocator& allocator_;
  zest::Stream stream_;
  cublasContext* cublas_ = nullptr;
  zest::Buffer cublas_workspace_;  // freed after the handle is destroyed
};

// Forward, MSE loss and (when `backward` is set) backward on the device,
// handing the gradients to the engine as mlp.cpp's host loops do. T is the
// engine's compute dtype: float, zest::fp16 or zest::bf16 (instantiated for
// those three). Returns the loss, brought to the host once.
template <typename T>
float run_on_device(DeviceContext& device, zest::Engine& engine, const Shape& shape, const Batch& batch,
                    bool backward);

}  // namespace mlp
