// LoRA (Hu et al. 2021) for libtorch modules, as Hugging Face PEFT does it:
// a frozen base Linear plus a trainable low-rank update,
//   y = base(x) + (alpha / r) * B(A(dropout(x)))
// with A (r x in) drawn like a Linear's weight (kaiming_uniform, a =
// sqrt(5)) and B (out x r) zero, so an adapted model starts out equal to
// its base.
//
//   // zest-example: prelude=torch_training
//   zest::LoraLinear q(zest::LoraLinearOptions(512, 512).bias(false));  // a drop-in for torch::nn::Linear
//   auto model = std::make_shared<torch::nn::Sequential>(q);
//   zest::LoraOptions lora;
//   lora.r = 8;
//   lora.alpha = 16;
//   zest::enable_lora(**model, {"0"}, lora, /*seed=*/1);  // adapters on, everything else frozen
//   zest::Engine engine(config, *comm, alloc, zest::Stream::default_for(comm->device()));
//   zest::TorchModule zt(engine, *model);                 // base frozen: no gradient, no optimizer state
//
// LoraLinear keeps torch::nn::Linear's options and parameter names (weight,
// bias), so a checkpoint's "q_proj.weight" loads into it unchanged. Its
// adapters are off until enabled; enabled, they are the parameters
// "lora_A.weight" and "lora_B.weight" (PEFT's names without its adapter
// name, ".default", as PEFT itself saves them). enable_lora freezes every
// other parameter (requires_grad false) before the TorchModule is made, so
// the engine registers the base frozen: sharded at stage 3 in the compute
// dtype, with no gradient or optimizer state. merge_lora folds the adapters
// into the base weights for an export with the base model's names only;
// export_hf_lora_merged and export_hf_lora_apart export a Hugging Face
// directory as PEFT's merge_and_unload and save_pretrained would.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace zest {

class Engine;
struct HfExportOptions;
struct HfExportReport;

using LoraLinearOptions = torch::nn::LinearOptions;

// PEFT's LoraConfig fields that change the arithmetic.
struct LoraOptions {
  int64_t r = 8;         // the adapters' rank
  double alpha = 8.0;    // lora_alpha: the update is scaled by alpha / r
  double dropout = 0.0;  // lora_dropout, on the adapter's input in training

  double scale() const { return alpha / static_cast<double>(r); }
  // Throws a zest::Error naming the field: r >= 1, alpha finite, dropout in
  // [0, 1).
  void validate() const;
};

class LoraLinearImpl : public torch::nn::Cloneable<LoraLinearImpl> {
 public:
  LoraLinearImpl(int64_t in_features, int64_t out_features)
      : LoraLinearImpl(LoraLinearOptions(in_features, out_features)) {}
  explicit LoraLinearImpl(const LoraLinearOptions& options);

  // (Re)creates weight and bias, initialized as torch::nn::Linear's, and
  // the adapters when enabled. Cloneable's contract.
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  // [*, in] -> [*, out].
  torch::Tensor forward(const torch::Tensor& input);

  // Adds lora_A and lora_B (A drawn from `generator`, B zero) and leaves
  // weight and bias as they are (enable_lora freezes them). Throws a
  // zest::Error when already enabled.
  void enable_lora(const LoraOptions& lora, at::Generator generator);
  bool lora_enabled() const { return !lora_A.is_empty(); }
  const LoraOptions& lora() const { return lora_; }

  LoraLinearOptions options;
  torch::Tensor weight;
  torch::Tensor bias;                    // undefined without options.bias()
  torch::nn::Linear lora_A{nullptr};     // in -> r, no bias
  torch::nn::Linear lora_B{nullptr};     // r -> out, no bias

 private:
  void make_adapters();

  LoraOptions lora_;
};
TORCH_MODULE(LoraLinear);

// Adapter A of a layer with `in_features` inputs, [r, in_features], drawn
// as PEFT draws it (kaiming_uniform, a = sqrt(5)) from `generator`: what
// LoraLinear::enable_lora draws, and what a tensor-parallel layer draws
// whole before keeping its part (tensor_parallel.h).
torch::Tensor lora_A_initial(int64_t r, int64_t in_features, at::Generator generator);

// The PEFT projections of a Llama block.
std::vector<std::string> llama_lora_targets();

// Enables adapters on every LoraLinear (or tensor-parallel linear layer,
// tensor_parallel.h) in `root`'s tree whose name matches
// one of `targets` as PEFT's target_modules list matches (the full name, or
// its last components: "q_proj" matches "model.layers.0.self_attn.q_proj"),
// and sets requires_grad false on every other parameter of the tree.
// Adapter A of the module named prefix + name is drawn from a generator
// seeded by (seed, that name) alone, so the values do not depend on the
// order, or the piece of the tree, in which modules are enabled: a model
// built block by block (prefix "model.layers.3.") gets the values the whole
// model would. Returns the adapted modules' names (with the prefix); throws
// a zest::Error naming the targets when none matches.
std::vector<std::string> enable_lora(torch::nn::Module& root, const std::vector<std::string>& targets,
                                     const LoraOptions& lora, uint64_t seed, const std::string& prefix = "");

// A LoRA adapter's parameter ("<module>.lora_A.weight" or
// "<module>.lora_B.weight"): what enable_lora leaves trainable, and what a
// pretrained checkpoint lacks.
bool is_lora_adapter(const std::string& name);

// A tensor of an export: its shape and fp32 values, row-major.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// For each "<m>.lora_A.weight" [r, in] with "<m>.lora_B.weight" [out, r]
// and "<m>.weight" [out, in] in `tensors` (a unit's, by name): weight +=
// scale * (B @ A) in fp32, as PEFT's merge_and_unload, and both adapters
// removed. Throws a zest::Error naming the tensor when an adapter lacks its
// partner or its base weight, or the shapes disagree. Returns how many
// weights were merged.
int merge_lora(std::map<std::string, HostTensor>& tensors, double scale);

// PEFT's adapter_config.json for these options, as JSON text: r,
// lora_alpha, lora_dropout, target_modules, bias "none", task_type
// "CAUSAL_LM", peft_type "LORA", and base_model_name_or_path when given.
std::string adapter_config_json(const LoraOptions& lora, const std::vector<std::string>& targets,
                                const std::string& base_model = "");

// export_hf (hf/hf_export.h) of a model with adapters, the adapters merged
// into their weights (PEFT's merge_and_unload): the directory holds the base
// model's names only. A unit's adapters are kept until the unit holding the
// weights they adapt is written (adapters are trainable, so they often sit
// in units of their own); an adapter whose weight never comes is an error
// naming it. `options.transform` must be unset (this sets it). Collective.
HfExportReport export_hf_lora_merged(Engine& engine, const std::string& dir, const HfExportOptions& options,
                                     const LoraOptions& lora);

// export_hf with the adapters apart, as PEFT's save_pretrained writes them
// beside the base model: adapter_model.safetensors under PEFT's names
// ("base_model.model." + the module's name + ".lora_A.weight") and
// adapter_config.json (adapter_config_json of lora, targets, base_model);
// the base model's tensors in the shards. import_hf reads such a directory
// back. `options.transform` and `adapter` must be unset. Collective.
HfExportReport export_hf_lora_apart(Engine& engine, const std::string& dir, const HfExportOptions& options,
                                    const LoraOptions& lora, const std::vector<std::string>& targets,
                                    const std::string& base_model = "");

}  // namespace zest
