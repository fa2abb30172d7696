// Pipeline parallelism for libtorch: this rank runs one stage of a model cut
// into consecutive pieces, over the ranks of a pipeline group `pp` (rank s =
// stage s), with the micro-batches of each batch scheduled 1F1B or GPipe
// (pipeline/schedule.h). Activations go forward and their gradients back
// between neighbouring stages as point-to-point transfers; each stage's
// parameters are a TorchModule whose engine shards them over the
// data-parallel group and steps once per batch.
//
//   // zest-example: prelude=torch_training
//   config.gradient_accumulation_steps = 4;                           // the micro-batches
//   zest::Engine engine(config, *comm, alloc, zest::Stream::default_for(comm->device()));
//   auto stage = std::make_shared<torch::nn::Linear>(512, 512);      // this rank's piece
//   zest::TorchModule zt(engine, *stage);
//   zest::PipelineOptions po;
//   po.micro_batches = 4;
//   po.activation_shape = {8, 512};                                   // one micro-batch's activations
//   zest::PipelineStage pipe(*comm, zt, po);                          // comm: the pipeline group
//   zest::PipelineStage::Result r = pipe.run(
//       [&](int mb, const torch::Tensor& in) {                       // `in` undefined on stage 0
//         return (*stage)(in.defined() ? in : torch::randn({8, 512}));
//       },
//       [&](int mb, const torch::Tensor& out) { return out.pow(2).mean(); });  // last stage only
//
// Per batch, on each stage, every action of the schedule in order:
// - forward(mb, input) with the received input (requires_grad, a leaf of
//   this stage's graph); the first stage gets an undefined tensor and reads
//   its own data. The last stage's output goes to loss(mb, output), the
//   micro-batch's mean loss; other stages send the output to the next.
// - backward of mb: the last stage from its loss (TorchModule::scale), the
//   others from the gradient received for their output; then the
//   TorchModule's micro-step (step()), and the input's gradient goes back.
// The engine averages over micro-steps, so with gradient_accumulation_steps
// equal to micro_batches the update is that of the whole batch's mean loss,
// whatever the schedule; both schedules add the micro-batches' gradients in
// the same order, so GPipe and 1F1B give the same bits.
//
// Every micro-batch's activation has the same shape and dtype
// (activation_shape, activation_dtype: Megatron's fixed tensor_shape), so a
// receiver allocates before the message arrives; a stage whose output
// differs is refused with both shapes named, before anything is sent. Stages
// that would wait on each other (a forward's output leaving as the next
// backward's gradient arrives) start the two transfers together
// (Communicator::send_recv), as Megatron's batched isend/irecv.
//
// Not provided: interleaved (virtual) stages, and tied embeddings between
// the first and the last stage (Megatron's embedding group): untie them, or
// keep both on one stage. With fp16 dynamic loss scaling, each stage's
// engine decides overflow for its own gradients: use bf16 or fp32.
#pragma once

#include <functional>
#include <vector>

#include <torch/torch.h>

#include "zest/comm/communicator.h"
#include "zest/pipeline/schedule.h"
#include "zest/torch/torch_module.h"

namespace zest {

struct PipelineOptions {
  PipelineKind schedule = PipelineKind::k1F1B;
  int micro_batches = 1;
  std::vector<int64_t> activation_shape;  // what one stage sends the next, per micro-batch
  torch::ScalarType activation_dtype = torch::kFloat;
};

class PipelineStage {
 public:
  // Stage pp.rank() of pp.size(). Throws a zest::Error when the engine's
  // gradient_accumulation_steps is not micro_batches, or the activation
  // shape is empty, naming the value to change.
  PipelineStage(Communicator& pp, TorchModule& zt, PipelineOptions options);

  using Forward = std::function<torch::Tensor(int micro_batch, const torch::Tensor& input)>;
  using Loss = std::function<torch::Tensor(int micro_batch, const torch::Tensor& output)>;

  struct Result {
    StepResult step;  // the last micro-step's: the optimizer step
    double loss;      // the micro-batches' mean loss, from the last stage, on every stage
    // Seconds this stage spent in forward and backward (its own work), in
    // the engine's micro-steps (the optimizer step included), and in the
    // whole batch: batch - step - compute is waiting and transfers, the
    // bubble.
    double compute_seconds = 0;
    double step_seconds = 0;
    double batch_seconds = 0;
  };
  // One batch: every micro-batch forward and backward, and the optimizer
  // step. Collective over pp (and the engine's group).
  Result run(const Forward& forward, const Loss& loss);

  int stage() const { return pp_->rank(); }
  int stages() const { return pp_->size(); }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }

 private:
  torch::Tensor receive_buffer() const;
  void check_activation(const torch::Tensor& t, const char* what) const;

  Communicator* pp_;
  TorchModule* zt_;
  PipelineOptions options_;
};

}  // namespace zest
