// Pipeline schedules: the order in which one pipeline stage runs the
// forward and backward passes of a batch's micro-batches, and the transfers
// each pass needs. Pure bookkeeping, the same on every backend; an executor
// (torch/pipeline_stage.h for libtorch) runs the actions.
//
//   // zest-example: run
//   #include <zest/pipeline/schedule.h>
//   // Stage 1 of 4 with 8 micro-batches, 1F1B: two warm-up forwards, then
//   // forward/backward pairs, then the two cool-down backwards.
//   std::vector<zest::PipelineAction> a = zest::pipeline_schedule(zest::PipelineKind::k1F1B, 4, 1, 8);
//   ZEST_CHECK(a.size() == 16 && a[2].pass == zest::PipelinePass::kForward && a[3].micro_batch == 0, "1F1B");
//
// 1F1B (PipeDream-Flush; Megatron-LM's forward_backward_pipelining_without_
// interleaving): stage s of p runs min(p - s - 1, m) warm-up forwards, then
// alternates one forward and one backward, then runs the remaining
// backwards, so it holds at most p - s micro-batches' activations where
// GPipe (all forwards, then all backwards) holds m. Both run backwards in
// micro-batch order 0, 1, ..., m - 1, so a stage adds the micro-batches'
// gradients in the same order under either schedule: the two give the same
// bits. Either way the idle fraction of a stage is (p - 1) / (m + p - 1)
// when every pass takes the same time (GPipe's bubble): pipeline_bubble().
//
// Transfers: a forward receives its input from stage s - 1 (unless s is the
// first) and sends its output to s + 1 (unless s is the last); a backward
// receives the output's gradient from s + 1 and sends the input's gradient
// to s - 1. Where 1F1B's steady state sends one way and receives the other
// back to back, the two are one group (`paired`): started together, so that
// neighbours that each send before they receive do not wait on each other.
#pragma once

#include <string>
#include <vector>

namespace zest {

enum class PipelineKind { kGPipe, k1F1B };
enum class PipelinePass { kForward, kBackward };

struct PipelineAction {
  PipelinePass pass;
  int micro_batch;
  // The pass's outgoing transfer is started together with the next action's
  // incoming one (1F1B's send_forward_recv_backward and
  // send_backward_recv_forward).
  bool paired = false;
};

// The actions of `stage` (0-based, of `stages`) for `micro_batches` >= 1.
// Throws a zest::Error naming the bad argument.
std::vector<PipelineAction> pipeline_schedule(PipelineKind kind, int stages, int stage, int micro_batches);

// (p - 1) / (m + p - 1): the share of a step a stage waits, for passes of
// equal length (forward and backward each the same on every stage).
double pipeline_bubble(int stages, int micro_batches);

// "1f1b" or "gpipe" (any case); throws a zest::Error listing them otherwise.
PipelineKind parse_pipeline_kind(const std::string& name);
const char* pipeline_kind_name(PipelineKind kind);

}  // namespace zest
