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
    float loss = 0.0f;  // the micro-batches' mean loss on this dp rank's rows, on every stage
    zest::StepResult result;
  };
  // One batch: this dp rank's micro-batches, forward, backward and the
  // engine's step.
  Step train_step(const std::vector<Batch>& micro_batches);

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
