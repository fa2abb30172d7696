// A language model that can be cut over a device mesh (mesh/device_mesh.h):
// which part of it a rank builds (Placement), and what a trainer needs from
// that part to run the mesh's pipeline and tensor-parallel arithmetic
// (StagedLm). The GPT and the Llama example implement both;
// common/mesh_trainer.h trains either.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <utility>

#include <torch/torch.h>

#include "common/lm_training.h"
#include "zest/comm/communicator.h"
#include "zest/mesh/device_mesh.h"

namespace examples {

// The group a model's layers are split over: `tp`, or null when they are
// whole (no group, or a group of one).
inline zest::Communicator* split_group(zest::Communicator* tp) {
  return tp != nullptr && tp->size() > 1 ? tp : nullptr;
}

// Which part of the model a rank builds: each layer split over the
// tensor-parallel group `tp` (whole layers without one), and the blocks of
// pipeline stage `stage` of `stages`, the embeddings on the first and the
// final norm and head on the last.
struct Placement {
  zest::Communicator* tp = nullptr;
  int stage = 0;
  int stages = 1;

  int tp_size() const { return tp != nullptr ? tp->size() : 1; }
  int tp_rank() const { return tp != nullptr ? tp->rank() : 0; }
  zest::Communicator* split_group() const;  // examples::split_group(tp)
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  // This stage's blocks of `layers`, [begin, end): layers / stages each, the
  // first layers % stages stages one more (Megatron's even split).
  std::pair<int64_t, int64_t> blocks(int64_t layers) const;
  // Throws std::invalid_argument naming the sizes when there are more
  // stages than layers or the stage is not one of them.
  void validate_stages(int64_t layers) const;
};

inline zest::Communicator* Placement::split_group() const { return examples::split_group(tp); }

// The part of the model this rank of `mesh` builds; the whole model without
// a mesh.
Placement placement_of(const zest::DeviceMesh* mesh);

// One rank's part of a decoder-only language model, as the mesh trainer
// drives it. The first stage takes tokens [B, T] int64, the others the
// previous stage's output [B, T, hidden]; the last returns logits
// [B, T, vocab / tp] (this rank's slice of the vocabulary), the others
// [B, T, hidden].
class StagedLm {
 public:
  virtual ~StagedLm() = default;

  virtual const Placement& placement() const = 0;
  virtual int64_t hidden_size() const = 0;
  virtual int64_t vocab_size() const = 0;  // the whole vocabulary
  virtual bool tied_head() const = 0;      // the head's weight is the embedding's
  virtual torch::ScalarType activation_dtype() const = 0;

  // This stage's part of forward, each piece that uses a unit's parameters
  // run as run(unit, piece).
  virtual torch::Tensor forward_stage(const torch::Tensor& input, const UnitRunner& run) = 0;
  // The rows of the next forwards are packed (data/packed_rows.h):
  // positions and document ids [B, T], so that positions restart and
  // attention stays within each document; undefined tensors: unpacked rows
  // again. A model that cannot attend within documents refuses packed rows.
  virtual void set_packing(torch::Tensor positions, torch::Tensor documents) {
    (void)documents;
    if (positions.defined()) throw std::invalid_argument("this model takes no packed rows (--packing)");
  }
  // The mean (loss) or the sum (loss_sum) of the token losses of the last
  // stage's logits against targets [B, T], in fp32: vocabulary-parallel
  // cross-entropy under tensor parallelism, the same on every tp rank.
  virtual torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) = 0;
  virtual torch::Tensor loss_sum(const torch::Tensor& logits, const torch::Tensor& targets) = 0;
  // The whole vocabulary's logits from this rank's slice (tp ranks gather).
  virtual torch::Tensor whole_logits(const torch::Tensor& logits) = 0;

  // A head tied to the embedding across pipeline stages
  // (torch/pipeline_stage.h): the first stage's embedding weight (this tp
  // rank's rows) and the unit that holds it; the first stage passes the
  // embedding's output through `tie` (PipelineStage::tied); the last
  // stage's head uses `weight`, the copy (PipelineStage::tie_last).
  virtual const torch::Tensor& embedding_weight() const = 0;
  virtual const torch::nn::Module& embedding_unit() const = 0;
  virtual void set_embedding_tie(std::function<torch::Tensor(const torch::Tensor&)> tie) = 0;
  virtual void set_head_weight(torch::Tensor weight) = 0;
};

}  // namespace examples
