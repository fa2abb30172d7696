#include "trainer.h"

#include "common/lm_training.h"

namespace gpt {

std::unique_ptr<zest::TorchModule> wrap(zest::Engine& engine, const Gpt& model) {
  return examples::wrap(engine, model.ptr(), model->blocks());
}

UnitRunner runner(zest::TorchModule& zt) { return examples::runner(zt); }

MicroStep train_micro_step(zest::TorchModule& zt, GptImpl& model, const Batch& batch) {
  const torch::Device device = zest::torch_device(zt.engine().comm().device());
  return examples::backward_and_step(
      zt, lm_loss(model.forward(batch.inputs.to(device), runner(zt)), batch.targets.to(device)));
}

double validation_loss(zest::TorchModule& zt, GptImpl& model, const Corpus& corpus, int64_t windows) {
  const UnitRunner run = runner(zt);
  return examples::validation_loss(
      zt.engine(), [&](const torch::Tensor& tokens) { return model.forward(tokens, run); }, corpus, windows,
      model.config().context);
}

}  // namespace gpt
