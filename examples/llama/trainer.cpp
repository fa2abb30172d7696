#include "trainer.h"

#include "common/lm_training.h"

namespace llama {

std::unique_ptr<zest::TorchModule> wrap(zest::Engine& engine, const LlamaForCausalLM& model) {
  return examples::wrap(engine, model.ptr(), model->units());
}

void enable_lora(LlamaForCausalLMImpl& model, const zest::LoraOptions& lora, uint64_t seed) {
  zest::enable_lora(model, zest::llama_lora_targets(), lora, seed);
}

UnitRunner runner(zest::TorchModule& zt) { return examples::runner(zt); }

LayerRunner checkpointing(zest::TorchModule& zt) {
  return [&zt](LlamaDecoderLayer layer, const torch::Tensor& x, const Rotary& rope) {
    return zt.checkpoint_call(*layer, [layer, rope](const torch::Tensor& in) mutable { return layer->forward(in, rope); },
                              x);
  };
}

MicroStep train_micro_step(zest::TorchModule& zt, LlamaForCausalLMImpl& model, const examples::Batch& batch,
                           const LayerRunner& run_layer) {
  return examples::backward_and_step(zt, lm_loss(model.forward(batch.inputs, runner(zt), run_layer), batch.targets));
}

double validation_loss(zest::TorchModule& zt, LlamaForCausalLMImpl& model, const examples::Corpus& corpus,
                       int64_t windows, int64_t context) {
  const UnitRunner run = runner(zt);
  return examples::validation_loss(
      zt.engine(), [&](const torch::Tensor& tokens) { return model.forward(tokens, run).to(torch::kFloat); }, corpus,
      windows, context);
}

}  // namespace llama
