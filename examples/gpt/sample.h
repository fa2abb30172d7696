// Text from a trained GPT: the prompt's continuation, byte by byte.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model.h"

namespace gpt {

struct SampleOptions {
  int64_t length = 200;      // bytes to generate
  double temperature = 0.8;  // 0: greedy (the likeliest byte each time)
  uint64_t seed = 1;         // the draws' generator (temperature > 0)
};

// Continues `prompt` (which may be empty: generation then starts after a
// "%\n", the end of a fortune cookie) by options.length bytes, each from the
// last `context` bytes, and returns them. With temperature T > 0, each byte
// is drawn from softmax(logits / T) by a generator of its own, so every
// caller with the same arguments gets the same text: under ZEST at stage 3
// every rank calls this (the forward gathers collectively) and all agree.
std::string generate(GptImpl& model, const UnitRunner& run, const std::string& prompt, const SampleOptions& options,
                     torch::Device device = torch::kCPU);
// The same with the logits of the last position of tokens [1, T] from
// `last_logits` ([vocab] on the host, the same on every caller): for a model
// split over ranks (common/mesh_trainer.h's last_logits). `context` bounds T.
using LastLogitsFn = std::function<torch::Tensor(const torch::Tensor& tokens)>;
std::string generate(const LastLogitsFn& last_logits, int64_t context, const std::string& prompt,
                     const SampleOptions& options, torch::Device device = torch::kCPU);

}  // namespace gpt
