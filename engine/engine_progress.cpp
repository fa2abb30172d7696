// Throughput and progress lines at the end of an optimizer step: DeepSpeed's
// steps_per_print and wall_clock_breakdown.
//
// Note [progress lines]. DeepSpeed's engine counts every optimizer step,
// applied or skipped, and on rank 0 reports the n-th when n is a multiple of
// steps_per_print (runtime/engine.py _take_model_step: step, skipped, lr),
// its throughput timer printing samples/s at the same cadence; with
// wall_clock_breakdown it also prints the timers of forward, backward and
// step after every optimizer step. ZEST logs one line through core/logging
// (info) on rank 0 at that cadence:
//   step 10 (skipped 1): loss scale 32768, lr 0.001, grad norm 1.25,
//   samples/s 512.3, tokens/s 262298.6
// and, with wall_clock_breakdown, the phase times it measures appended:
//   | time (ms): step 31.2, reduce 4.1, norm 0.3, optimizer 2.2, gather 3.9
// (offload's pipeline too, when offloading). Forward and backward are the
// program's own, which ZEST does not see; "step" is the whole optimizer step
// from its first gather() or grads(). With wall_clock_breakdown and no
// steps_per_print, every step's line is logged, as DeepSpeed prints its
// timers every step. The samples and tokens count every rank's.
#include <chrono>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/engine/engine.h"
#include "zest/engine/detail/engine_state.h"

namespace zest {

void Engine::Impl::set_tokens_per_micro_batch(int64_t tokens) {
  ZEST_CHECK(tokens >= 0, "set_tokens_per_micro_batch({}): the tokens of a micro-batch must be 0 or more", tokens);
  tokens_per_micro_ = tokens;
}

void Engine::Impl::start_step_clock() {
  if (!step_start_) step_start_ = std::chrono::steady_clock::now();
}

void Engine::Impl::report_progress(StepResult& r, double lr) {
  Impl& im = *this;
  const auto now = std::chrono::steady_clock::now();
  r.step_ms = std::chrono::duration<double, std::milli>(now - im.step_start_.value_or(now)).count();
  im.step_start_.reset();
  const double seconds = r.step_ms / 1000.0;
  const int64_t micro_batches = config_.accumulation_steps() * comm_.size();
  if (seconds > 0.0) {
    if (config_.train_batch_size) r.samples_per_second = static_cast<double>(*config_.train_batch_size) / seconds;
    if (im.tokens_per_micro_ > 0) {
      r.tokens_per_second = static_cast<double>(im.tokens_per_micro_) * static_cast<double>(micro_batches) / seconds;
    }
  }

  const int64_t n = r.applied_steps + r.skipped_steps;
  const bool due = config_.steps_per_print ? n % *config_.steps_per_print == 0 : config_.wall_clock_breakdown;
  if (comm_.rank() != 0 || !due || !log_enabled(LogLevel::kInfo)) return;
  std::string line = fmt::format("step {} (skipped {}): loss scale {}, lr {}, grad norm {}", n, r.skipped_steps,
                                 r.loss_scale, lr, r.grad_norm);
  if (r.samples_per_second) line += fmt::format(", samples/s {:.1f}", *r.samples_per_second);
  if (r.tokens_per_second) line += fmt::format(", tokens/s {:.1f}", *r.tokens_per_second);
  if (config_.wall_clock_breakdown) {
    const StepTimes& t = r.times;
    line += fmt::format(" | time (ms): step {:.2f}, reduce {:.2f}, norm {:.2f}, optimizer {:.2f}, gather {:.2f}",
                        r.step_ms, t.reduce_ms, t.norm_ms, t.optimizer_ms, t.gather_ms);
    if (im.offload_) {
      line += fmt::format(", offload {:.2f} (d2h {:.2f}, update {:.2f}, h2d {:.2f})", t.offload_ms, t.offload_d2h_ms,
                          t.offload_update_ms, t.offload_h2d_ms);
    }
  }
  ZEST_LOG_INFO("{}", line);
}

}  // namespace zest
