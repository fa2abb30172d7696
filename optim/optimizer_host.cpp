// Host implementation of the optimizer updates: one templated loop per
// optimizer over (gradient type, parameter output type), computing in float
// with the element updates of optimizer_impl.h that the CUDA kernel shares.
//
// The shard is walked in blocks of kHostBlock elements, each pass over a
// block one of the loops of host_kernels.h, compiled for the widest
// instruction set the CPU has: widen the gradient into a float buffer on the
// stack, update the block, narrow the new weights into the parameter copy.
// With OptimizerConfig::host_threads > 1 the shard is split in contiguous
// parts of whole blocks, one per thread.
// Vector and scalar float operations round alike (every one is an IEEE
// operation; no FMA, no reassociation, as optim/CMakeLists.txt sets), so the
// bits are those of one element at a time, and of the GPU.
#include <algorithm>
#include <exception>
#include <thread>
#include <type_traits>
#include <vector>

#include "zest/optim/host_convert.h"
#include "zest/optim/host_kernels.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/optimizer_impl.h"

namespace zest::detail {
namespace {

// Calls body(g, base, len) for each block, g the block's gradient as float:
// the shard's own memory when it is fp32, else widened into `scratch`.
template <typename TG, typename Body>
void for_each_block(const ShardBuffers& s, Body&& body) {
  const TG* grad = static_cast<const TG*>(s.grad);
  float scratch[kHostBlock];
  for (size_t base = 0; base < s.numel; base += kHostBlock) {
    const size_t len = std::min(kHostBlock, s.numel - base);
    const float* g = nullptr;
    if constexpr (std::is_same_v<TG, float>) {
      g = grad + base;
    } else {
      widen(grad + base, scratch, len);
      g = scratch;
    }
    body(g, base, len);
  }
}

template <typename TP>
void store_params(const ShardBuffers& s, size_t base, size_t len) {
  if constexpr (!std::is_void_v<TP>) narrow(s.master + base, static_cast<TP*>(s.param_out) + base, len);
}

template <typename TG, typename TP>
void adam_loop(const HostKernels& kern, const OptimizerConfig& c, const ShardBuffers& s,
               const StepScalars& k) {
  const AdamStep a = adam_step(c, k);
  const auto update = a.decoupled ? kern.adamw : kern.adam_l2;
  for_each_block<TG>(s, [&](const float* g, size_t base, size_t len) {
    update(a, g, s.master + base, s.state[0] + base, s.state[1] + base, len);
    store_params<TP>(s, base, len);
  });
}

template <typename TG, typename TP>
void sgd_loop(const HostKernels& kern, const OptimizerConfig& c, const ShardBuffers& s,
              const StepScalars& k) {
  const SgdStep st = sgd_step(c, k);
  for_each_block<TG>(s, [&](const float* g, size_t base, size_t len) {
    kern.sgd(st, g, s.master + base, s.state[0] == nullptr ? nullptr : s.state[0] + base, len);
    store_params<TP>(s, base, len);
  });
}

void step_part(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const HostKernels& kern = host_kernels();
  visit_shard_types(c, s, [&](auto grad_type, auto param_type) {
    using TG = typename decltype(grad_type)::type;
    using TP = typename decltype(param_type)::type;
    if (c.kind == OptimizerKind::kSgd) {
      sgd_loop<TG, TP>(kern, c, s, k);
    } else {
      adam_loop<TG, TP>(kern, c, s, k);
    }
  });
}

// Elements per thread below which starting a thread costs more than it saves.
constexpr size_t kMinPerThread = size_t{1} << 16;

}  // namespace

// Threads take contiguous parts in whole blocks; each element's update reads
// and writes that element only, so the split changes no bit.
void optimizer_step_host(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const size_t threads =
      std::min(static_cast<size_t>(std::max(c.host_threads, 1)), std::max<size_t>(1, s.numel / kMinPerThread));
  if (threads <= 1) return step_part(c, s, k);
  const size_t per = (s.numel + threads - 1) / threads;
  const size_t part = (per + kHostBlock - 1) / kHostBlock * kHostBlock;
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  const auto run = [&](size_t t) {
    try {
      const size_t begin = std::min(s.numel, t * part);
      const size_t n = std::min(part, s.numel - begin);
      if (n > 0) step_part(c, s.part(begin, n), k);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  for (size_t t = 1; t < threads; ++t) workers.emplace_back(run, t);
  run(0);
  for (std::thread& w : workers) w.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace zest::detail
