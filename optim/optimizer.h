// Optimizer updates of one flat shard: the master weights and optimizer
// state the rank owns (fp32, or bf16: Note [bf16 master weights and
// optimizer state] below), stepped from that shard's reduced gradient, with the
// updated weights written out in the compute dtype in the same pass.
//
// Semantics follow torch.optim (and DeepSpeed's FusedAdam / CPU Adam):
//   AdamW  w -= lr * wd * w;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//          w -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//   Adam   the same with L2 decay: g += wd * w first, no decoupled decay
//   SGD    g += wd * w; with momentum: buf = g at the first step, else
//          buf = mu buf + (1 - dampening) g; nesterov: g += mu buf, else g = buf;
//          w -= lr g
//   LAMB   DeepSpeed's FusedLamb: m, v as Adam's (no decay in g);
//          u = m / (sqrt(v) + eps) + wd * w   (eps_inside_sqrt: sqrt(v + eps));
//          per parameter tensor, r = ||w|| / ||u|| clamped to
//          [min_coeff, max_coeff] (1 when either norm is 0);
//          w -= (lr sqrt(1 - b2^t) / (1 - b1^t)) * r * u.
//          Its step needs each parameter's norms across shards: optim/lamb.h.
// where g is the stored gradient times StepScalars::grad_scale (the product
// of loss-scale removal, accumulation averaging and clipping, applied here so
// the gradient is read once). Elementwise and in a fixed order of operations,
// so a shard's result does not depend on how the model was sharded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zest/core/dtype.h"
#include "zest/core/stream.h"

namespace zest {

enum class OptimizerKind : uint8_t { kAdamW, kAdam, kSgd, kLamb };

std::string_view optimizer_name(OptimizerKind kind);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float lr = 1e-3f;
  float weight_decay = 0.01f;
  // Adam / AdamW
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  bool bias_correction = true;
  // LAMB (with beta1, beta2, eps, bias_correction above): DeepSpeed's
  // FusedLamb defaults.
  float max_coeff = 10.0f;
  float min_coeff = 0.01f;
  bool eps_inside_sqrt = false;
  // SGD
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  // Threads that update one rank's shard on the host, each a contiguous
  // part of it (the bits do not depend on the count: every element's update
  // is its own). 1, the default, is the rank's own thread: in-process ranks
  // are threads already and MPI usually places a rank per core, so more
  // would oversubscribe the cores; raise it when a rank has cores to
  // itself. Shards under 64K elements per thread use fewer threads. JSON:
  // "optimizer": {"params": {"host_threads": N}} (a key of ZEST's own).
  int host_threads = 1;

  // Checks the values, naming the bad one and its range.
  void validate() const;
  // fp32 state buffers per parameter: 2 for Adam(W) and LAMB (m and v,
  // saved as exp_avg and exp_avg_sq), 1 for SGD with momentum, 0 for plain
  // SGD.
  int state_buffers() const;
};

// One shard's buffers, all of `numel` elements on the stream's device.
//
// Note [bf16 master weights and optimizer state]: the master weights and
// the state are fp32 unless DeepSpeed's bf16.bf16_master_weights_and_grads
// and bf16.bf16_optimizer_states make them bf16 (master_dtype, state_dtype).
// Each element is then widened to fp32, updated by the same float code, and
// rounded to nearest-even on the way back, as torch's bf16 copy_ does: the
// update itself is fp32 arithmetic either way, only what is kept is bf16.
// bf16 master weights are the bf16 parameters themselves (no param_out).
// The pairs both backends run: fp32/fp32, bf16/fp32 (DeepSpeed allows it
// with offload only), bf16/bf16; any other is a zest::Error.
struct ShardBuffers {
  void* master = nullptr;          // master weights, updated in place
  DType master_dtype = DType::kFloat32;
  void* state[2] = {nullptr, nullptr};  // Adam m, v; SGD momentum in state[0]
  DType state_dtype = DType::kFloat32;
  const void* grad = nullptr;      // reduced gradient shard
  DType grad_dtype = DType::kFloat32;
  void* param_out = nullptr;       // compute-dtype copy of the updated weights, or null
  DType param_dtype = DType::kFloat32;
  size_t numel = 0;

  // The elements [begin, begin + n) of this shard.
  ShardBuffers part(size_t begin, size_t n) const;
  // The buffers as fp32, for the code that takes no other (LAMB): a
  // zest::Error naming `op` when they are bf16.
  float* master_fp32(std::string_view op) const;
  float* state_fp32(int i, std::string_view op) const;
};

struct StepDecision;  // step_decision.h

struct StepScalars {
  float lr = 0.0f;            // this step's learning rate (after the schedule)
  float weight_decay = 0.0f;  // this parameter group's decay
  int64_t step = 1;           // 1-based count of applied steps, for bias correction
  float grad_scale = 1.0f;    // multiplies every gradient element
  // Set: a decision in memory of the stream's device (decide_step wrote it,
  // earlier on the same stream). The update then reads it when it runs: it
  // does nothing when decision->finite is 0, and takes decision->grad_scale
  // instead of grad_scale. So a GPU step need not wait for the host to learn
  // the norm first.
  const StepDecision* decision = nullptr;
};

// Refuses a learning rate the update cannot use, naming it and `source`
// (where it came from: "set_lr(1e+39)", "the lr schedule ..."): one that is
// not finite or negative, that is past fp32's range once narrowed to the
// float the update takes, or whose per-step constants overflow in fp32
// (Adam(W)'s lr / (1 - beta1^t), largest at the first step, which covers
// every later one; lr * weight_decay, for the largest decay of the
// parameter groups). Such a rate would turn every weight into an Inf.
void check_learning_rate(const OptimizerConfig& config, double lr, float max_weight_decay,
                         std::string_view source);

// Updates the shard (not LAMB, whose trust ratios need the norms of whole
// parameters: optim/lamb.h steps it). Host streams run it now; CUDA streams queue a fused
// kernel with the host's bits (NaN payloads aside), the buffers then being
// memory of the stream's device. Unsupported dtype pairs are a zest::Error
// naming the pair.
void optimizer_step(const Stream& stream, const OptimizerConfig& config, const ShardBuffers& shard,
                    const StepScalars& scalars);

}  // namespace zest
