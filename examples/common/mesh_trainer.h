// A language model trained over a device mesh (mesh/device_mesh.h): each
// rank builds its part of the model (common/staged_lm.h's Placement:
// tensor-parallel layers over mesh.tp(), this pipeline stage's blocks),
// wrapped by a TorchModule whose engine shards it over mesh.dp(). With one
// pipeline stage a step runs the batch's micro-batches in turn, as on one
// rank; with more, the micro-batches go through the stages 1F1B
// (torch/pipeline_stage.h), a head tied to the embedding across the first
// and last stage kept in step there. Evaluation and generation run the
// stages forward only (zest::pipeline_forward), the last stage's results
// sent to every stage. Without a mesh (dp only) a step is the plain loop:
// forward, backward and the engine's micro-step for each micro-batch.
#pragma once

#include <memory>
#include <vector>

#include "common/corpus.h"
#include "common/lm_training.h"
#include "common/staged_lm.h"
#include "zest/mesh/device_mesh.h"
#include "zest/torch/pipeline_stage.h"
#include "zest/torch/torch_module.h"

namespace examples {

class MeshTrainer {
 public:
  // `zt` wraps `model` (built with placement_of(mesh)) on an engine over
  // mesh->dp() with mesh->engine_model_parallel() set, or over the whole
  // world without a mesh; a micro-batch is `rows` windows of `context`
  // tokens. With pp > 1 the engine's gradient_accumulation_steps are the
  // pipeline's micro-batches. Collective over the mesh (tied weights are
  // exchanged).
  MeshTrainer(const zest::DeviceMesh* mesh, zest::TorchModule& zt, StagedLm& model, int64_t rows, int64_t context,
              zest::PipelineKind schedule = zest::PipelineKind::k1F1B);

  struct Step {
    // The micro-batches' mean loss on this dp rank's rows, on every stage;
    // with global_trained, the rank's token-loss sum x ranks / global_trained,
    // whose mean over the ranks is the global batch's mean.
    float loss = 0.0f;
    zest::StepResult result;
  };
  // One batch: this dp rank's micro-batches (packed rows set on the model,
  // StagedLm::set_packing), forward, backward and the engine's step.
  // global_trained > 0: the trained tokens (targets other than -100) of the
  // whole global batch, every dp rank's micro-batches together. Each
  // micro-batch's loss is then the sum of its token losses over that count
  // (times the micro-batches and ranks the engine averages over), so the
  // update is that of the mean over the global batch's trained tokens, never
  // a mean of micro-batch means, which would weigh the tokens of short
  // micro-batches up. 0: each micro-batch's mean (rows of equal tokens, all
  // trained).
  Step train_step(const std::vector<Batch>& micro_batches, int64_t global_trained = 0);
  // The sum of the token losses of `b` (targets -100 left out), forward
  // only, on every rank of the mesh: this dp rank's rows. Collective over
  // the mesh's pipeline.
  double loss_sum(const Batch& b);

  // lm_training.h's validation_loss: the same value on every rank of the
  // mesh.
  double validation_loss(const Corpus& corpus, int64_t windows);
  // The whole vocabulary's logits [vocab] at the last position of tokens
  // [1, T], on the host, the same on every rank of the mesh (for a sampler).
  // Collective.
  torch::Tensor last_logits(const torch::Tensor& tokens);

 private:
  // The last stage's output of `tokens`, forward only; undefined on the
  // other stages.
  torch::Tensor forward_only(const torch::Tensor& tokens);

  const zest::DeviceMesh* mesh_;
  zest::TorchModule& zt_;
  StagedLm& model_;
  int64_t context_;
  torch::ScalarType dtype_;  // the activations'
  std::unique_ptr<zest::PipelineStage> pipe_;
};

}  // namespace examples
