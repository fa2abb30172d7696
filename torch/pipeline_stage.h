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
// Tied weights between the first and the last stage (a word embedding that
// is also the output layer, as GPT-2's): tie_first, tie_last and tied below.
// Evaluation and generation run forward only: pipeline_forward.
//
// Not provided: interleaved (virtual) stages. With fp16 dynamic loss
// scaling, each stage's engine decides overflow for its own gradients: use
// bf16 or fp32.
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
  // The first and the last stage, for tied weights (DeviceMesh::embedding());
  // unused without them.
  Communicator* tied_group = nullptr;
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

  // Tied weights (Note [tied weights] in pipeline_stage.cpp). The first
  // stage owns the weight: a parameter of unit `unit` of its TorchModule,
  // trained and counted in the gradient norm there. The last stage uses a
  // copy that is no parameter of its engine. Each batch the copy's gradient,
  // summed over the micro-batches, goes to the first stage and joins the
  // weight's own in that stage's last backward; after the step the new
  // values come back to the copy. A frozen weight (requires_grad false: a
  // LoRA run's base) gives a copy that requires no gradient, and nothing
  // moves per batch.
  //
  // First stage: collective with tie_last over options.tied_group, which
  // both must have; sends the weight's values.
  void tie_first(const torch::nn::Module& unit, const torch::Tensor& weight);
  // Last stage: the copy (a leaf requiring grad, the weight's shape, dtype
  // and values), for the stage's forward to use in place of the weight.
  // `shape` and `dtype` are checked against the first stage's weight, and a
  // mismatch named on both stages.
  torch::Tensor tie_last(const std::vector<int64_t>& shape, torch::ScalarType dtype);
  // First stage, in forward, inside zt.call of the weight's unit: returns
  // `x`, a tensor computed from the weight (the embedding's output), through
  // a node whose backward, in the batch's last backward on this stage, adds
  // the last stage's gradient to the weight's. Outside run(), `x` itself.
  torch::Tensor tied(const torch::Tensor& x);

  int stage() const { return pp_->rank(); }
  int stages() const { return pp_->size(); }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }

 private:
  torch::Tensor receive_buffer() const;
  void check_activation(const torch::Tensor& t, const char* what) const;
  Communicator& tied_group(const char* caller) const;
  void send_tied_gradient();
  void sync_tied_values();

  Communicator* pp_;
  TorchModule* zt_;
  PipelineOptions options_;
  // Tied weights: the first stage's weight and its unit, the last stage's copy.
  torch::Tensor tied_weight_;
  int tied_unit_ = -1;
  torch::Tensor tied_copy_;
  bool tied_trains_ = false;  // the first stage's weight requires grad (else frozen: no per-batch exchange)
  // In run(): the micro-batch whose forward is running (-1 outside), and the
  // one whose backward comes last on this stage.
  int forward_mb_ = -1;
  int last_backward_mb_ = -1;
};

// `value` as the last stage of `pp` has it, on every stage (a loss only the
// last stage computes). Collective over pp.
double from_last_stage(Communicator& pp, double value);

// One forward pass through the stages, without gradients (evaluation,
// generation): stage s > 0 receives stage s - 1's output, of
// `activation_shape` and `dtype` (the first stage gets an undefined tensor),
// runs forward(input), and sends the result on. Returns the last stage's
// output there, an undefined tensor elsewhere. Collective over pp.
torch::Tensor pipeline_forward(Communicator& pp, const std::vector<int64_t>& activation_shape,
                               torch::ScalarType dtype,
                               const std::function<torch::Tensor(const torch::Tensor& input)>& forward);

}  // namespace zest
