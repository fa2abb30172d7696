// The GPT under ZEST: the model wrapped by a zest::TorchModule (one unit per
// block; the embeddings, the final LayerNorm and an untied head in the
// module's own unit, "<root>"), a training micro-step, and the validation
// loss. Used by the example, bench/torch_step_bench and the tests.
#pragma once

#include <cstdint>
#include <memory>

#include "common/corpus.h"
#include "common/lm_training.h"
#include "model.h"
#include "zest/torch/torch_module.h"

namespace gpt {

using examples::Batch;
using examples::Corpus;

// Declares the "no_decay" group on the engine (biases and LayerNorm weights,
// the 1-D parameters, as GPT-2 and nanoGPT train them) and wraps the model.
// Collective (it finalizes the engine).
std::unique_ptr<zest::TorchModule> wrap(zest::Engine& engine, const Gpt& model);

// run(unit, piece) as zt.call(unit, piece): gathers at stage 3.
UnitRunner runner(zest::TorchModule& zt);

using examples::MicroStep;

// Forward on this rank's rows, backward into the engine, zt.step().
MicroStep train_micro_step(zest::TorchModule& zt, GptImpl& model, const Batch& batch);

// examples::validation_loss of the model's logits: the mean loss per token
// over the first `windows` validation windows, the same bits at every stage
// for a given world size. Collective.
double validation_loss(zest::TorchModule& zt, GptImpl& model, const Corpus& corpus, int64_t windows);

}  // namespace gpt
