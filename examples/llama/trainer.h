// The Llama under ZEST: the model wrapped by a zest::TorchModule (one unit
// per decoder layer, the final norm, and the embeddings and head: one unit
// each when untied, the root's unit "<root>" when tied), a training
// micro-step and the validation loss. Used by the example and the tests.
#pragma once

#include <cstdint>
#include <memory>

#include "common/corpus.h"
#include "common/lm_training.h"
#include "model.h"
#include "zest/torch/lora.h"
#include "zest/torch/torch_module.h"

namespace llama {

// Declares the "no_decay" group on the engine (the norms' weights and the
// biases: the 1-D parameters) and wraps the model; parameters whose
// requires_grad is false (a LoRA base) are registered frozen. Collective (it
// finalizes the engine).
std::unique_ptr<zest::TorchModule> wrap(zest::Engine& engine, const LlamaForCausalLM& model);

// Adapters on every projection (zest::llama_lora_targets: PEFT's usual
// Llama targets), every other parameter frozen; before wrap().
void enable_lora(LlamaForCausalLMImpl& model, const zest::LoraOptions& lora, uint64_t seed);

// run(unit, piece) as zt.call(unit, piece): gathers at stage 3.
UnitRunner runner(zest::TorchModule& zt);

using examples::MicroStep;

// Each decoder layer through zt.checkpoint_call (--recompute): only its
// input kept for backward, which runs the layer again.
LayerRunner checkpointing(zest::TorchModule& zt);

// Forward on this rank's rows, backward into the engine, zt.step().
MicroStep train_micro_step(zest::TorchModule& zt, LlamaForCausalLMImpl& model, const examples::Batch& batch,
                           const LayerRunner& run_layer = {});

// examples::validation_loss of the model's logits (in fp32, as HF's loss
// upcasts them). Collective.
double validation_loss(zest::TorchModule& zt, LlamaForCausalLMImpl& model, const examples::Corpus& corpus,
                       int64_t windows, int64_t context);

}  // namespace llama
