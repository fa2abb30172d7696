// Host implementation of the optimizer updates: one templated loop per
// optimizer over (gradient type, parameter output type), computing in float
// with the element updates of optimizer_impl.h that the CUDA kernel shares.
//
// The shard is walked in blocks of kHostBlock elements, each pass over a
// block one of the loops of host_kernels.h, compiled for the widest
// instruction set the CPU has: widen the gradient (and bf16 master weights
// and state) into float buffers on the stack, update the block, narrow the
// new weights into the parameter copy.
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

#include "zest/optim/detail/host_convert.h"
#include "zest/optim/detail/host_kernels.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/detail/optimizer_impl.h"

namespace zest::detail {
namespace {

// A block of T as float: the memory itself when T is float, else widened
// into `scratch`.
template <typename T>
float* as_float(T* p, float* scratch, size_t len) {
  if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
    (void)scratch;
    (void)len;
    return const_cast<float*>(p);
  } else {
    widen(p, scratch, len);
    return scratch;
  }
}

// A block updated in `scratch` back into T (nothing when T is float: the
// update wrote the memory itself).
template <typename T>
void store_back(const float* block, T* p, size_t len) {
  if constexpr (!std::is_same_v<T, float>) narrow(block, p, len);
}

// One block's views: g the gradient, w the master, st the state buffers
// (null where the shard has none), each float, over [base, base + len).
struct Block {
  const float* g;
  float* w;
  float* st[2];
  size_t base;
  size_t len;
};

// Calls body(block) for each block of kHostBlock elements: the buffers
// that are not fp32 are widened into blocks on the stack first and rounded
// back after (Note [bf16 master weights and optimizer state]), then the new
// weights are narrowed into the parameter output.
template <typename TG, typename TP, typename TW, typename TS, typename Body>
void for_each_block(const ShardBuffers& s, Body&& body) {
  const TG* grad = static_cast<const TG*>(s.grad);
  TW* master = static_cast<TW*>(s.master);
  TS* state[2] = {static_cast<TS*>(s.state[0]), static_cast<TS*>(s.state[1])};
  float g_scratch[kHostBlock];
  float w_scratch[kHostBlock];
  float st_scratch[2][kHostBlock];
  for (size_t base = 0; base < s.numel; base += kHostBlock) {
    const size_t len = std::min(kHostBlock, s.numel - base);
    Block b{as_float(grad + base, g_scratch, len), as_float(master + base, w_scratch, len), {nullptr, nullptr},
            base, len};
    for (int i = 0; i < 2; ++i) {
      if (state[i] != nullptr) b.st[i] = as_float(state[i] + base, st_scratch[i], len);
    }
    body(b);
    store_back(b.w, master + base, len);
    for (int i = 0; i < 2; ++i) {
      if (state[i] != nullptr) store_back(b.st[i], state[i] + base, len);
    }
    if constexpr (!std::is_void_v<TP>) narrow(b.w, static_cast<TP*>(s.param_out) + base, len);
  }
}

template <typename TG, typename TP, typename TW, typename TS>
void adam_loop(const HostKernels& kern, const OptimizerConfig& c, const ShardBuffers& s,
               const StepScalars& k) {
  const AdamStep a = adam_step(c, k);
  const auto update = a.decoupled ? kern.adamw : kern.adam_l2;
  for_each_block<TG, TP, TW, TS>(s, [&](const Block& b) { update(a, b.g, b.w, b.st[0], b.st[1], b.len); });
}

template <typename TG, typename TP, typename TW, typename TS>
void sgd_loop(const HostKernels& kern, const OptimizerConfig& c, const ShardBuffers& s,
              const StepScalars& k) {
  const SgdStep st = sgd_step(c, k);
  // Plain SGD keeps no state: state[0] may be anything, and is not touched.
  ShardBuffers t = s;
  if (c.momentum == 0.0f) t.state[0] = nullptr;
  t.state[1] = nullptr;
  for_each_block<TG, TP, TW, TS>(t, [&](const Block& b) { kern.sgd(st, b.g, b.w, b.st[0], b.len); });
}

void step_part(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const HostKernels& kern = host_kernels();
  visit_shard_types(c, s, [&](auto grad_type, auto param_type, auto master_type, auto state_type) {
    using TG = typename decltype(grad_type)::type;
    using TP = typename decltype(param_type)::type;
    using TW = typename decltype(master_type)::type;
    using TS = typename decltype(state_type)::type;
    if (c.kind == OptimizerKind::kSgd) {
      sgd_loop<TG, TP, TW, TS>(kern, c, s, k);
    } else {
      adam_loop<TG, TP, TW, TS>(kern, c, s, k);
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
