// What one call to Engine::step() did.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zest {

// Host wall-clock milliseconds of step()'s phases on this rank, summed over
// the micro-steps of one accumulation: the gradient reductions (bucket
// flushes in done() and at step()), the global norm, the optimizer, and the
// parameter gathers (stage-3 gathers of forward and backward, or the
// all-gather after the update at stages 1-2). On a host stream each phase's
// work runs as it is issued; on a CUDA stream only its queuing is timed.
struct StepTimes {
  double reduce_ms = 0.0;
  double norm_ms = 0.0;
  double optimizer_ms = 0.0;
  double gather_ms = 0.0;
  // offload_optimizer: within optimizer_ms, the host part's pipeline
  // (offload_ms, start to end) and the time each of its three stages was
  // busy: the copy queues copying gradients to the host and parameters back
  // (on CUDA measured by events around each chunk's copies), and the host
  // optimizer updating. Their sum minus offload_ms is the time they ran at
  // once (bench/offload_bench).
  double offload_d2h_ms = 0.0;
  double offload_update_ms = 0.0;
  double offload_h2d_ms = 0.0;
  double offload_ms = 0.0;
  // offload_optimizer device nvme: within offload_ms, the time the host
  // optimizer's thread was blocked on the swap ring's reads and writes, its
  // time per chunk between them (the update and its copies' hand-offs), and
  // of that the part during which the drive was busy throughout, a transfer
  // submitted before the chunk in flight after it (nvme/swap_ring.h:
  // SwapRingTimes::compute_overlapped): the update the I/O hid, at least.
  double offload_read_wait_ms = 0.0;
  double offload_write_wait_ms = 0.0;
  double offload_chunk_ms = 0.0;
  double offload_chunk_overlapped_ms = 0.0;
};

struct StepResult {
  // True on the last micro-step of an accumulation, when an optimizer step
  // was due; false on the others (their gradients were only accumulated).
  bool boundary = false;
  // The optimizer updated the parameters. False on a boundary means the step
  // was skipped: see skip_reason.
  bool applied = false;
  // "fp16 overflow (loss scale 65536 -> 32768)" or "non-finite gradients
  // (bf16): step skipped"; empty when applied or not a boundary.
  std::string skip_reason;
  // L2 norm of the averaged, unscaled gradients before clipping (Inf or NaN
  // when they were not finite).
  double grad_norm = 0.0;
  bool clipped = false;
  // The loss scale for the next backward (1 unless fp16), and the learning
  // rate this step used.
  double loss_scale = 1.0;
  double lr = 0.0;
  int64_t applied_steps = 0;  // optimizer steps applied so far
  int64_t skipped_steps = 0;  // boundaries skipped so far
  // On a boundary, the phases' times since the previous boundary.
  StepTimes times;
  // On a boundary: host wall-clock milliseconds from the optimizer step's
  // first gather() or grads() to the end of this step(), and the
  // throughput over them, all ranks together: train_batch_size samples
  // (unset when the config gives no batch size) and, after
  // Engine::set_tokens_per_micro_batch, tokens.
  double step_ms = 0.0;
  std::optional<double> samples_per_second;
  std::optional<double> tokens_per_second;
};

}  // namespace zest
