#include "sample.h"

#include <stdexcept>

#include <fmt/format.h>

#include "common/corpus.h"

namespace gpt {

std::string generate(GptImpl& model, const UnitRunner& run, const std::string& prompt, const SampleOptions& options,
                     torch::Device device) {
  return generate(
      [&](const torch::Tensor& tokens) {
        return model.forward(tokens, run).select(1, tokens.size(1) - 1).squeeze(0).to(torch::kCPU);
      },
      model.config().context, prompt, options, device);
}

std::string generate(const LastLogitsFn& last_logits, int64_t context, const std::string& prompt,
                     const SampleOptions& options, torch::Device device) {
  if (options.temperature < 0.0) {
    throw std::invalid_argument(fmt::format("temperature {} is negative; use 0 for greedy", options.temperature));
  }
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(options.seed);
  std::string text = prompt.empty() ? std::string("%\n") : prompt;
  const size_t start = text.size();
  for (int64_t i = 0; i < options.length; ++i) {
    const size_t window = std::min(text.size(), static_cast<size_t>(context));
    const torch::Tensor tokens = examples::encode(text.substr(text.size() - window)).to(device);
    // The draw on the host, by the CPU generator, whatever the device.
    const torch::Tensor logits = last_logits(tokens);
    int64_t next = 0;
    if (options.temperature == 0.0) {
      next = logits.argmax().item<int64_t>();
    } else {
      const torch::Tensor p = torch::softmax(logits.to(torch::kFloat) / options.temperature, /*dim=*/0);
      next = torch::multinomial(p, 1, /*replacement=*/false, gen).item<int64_t>();
    }
    // A vocabulary wider than bytes (--vocab 50257) has ids no byte maps to.
    text += static_cast<char>(static_cast<unsigned char>(next < 256 ? next : '?'));
  }
  return text.substr(start);
}

}  // namespace gpt
