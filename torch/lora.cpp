#include "zest/torch/lora.h"

#include <cmath>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "zest/core/check.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/hf/hf_export.h"
#include "zest/torch/tensor_parallel.h"

namespace zest {
namespace {

// torch.nn.init.kaiming_uniform_(w, a) for a [fan_out, fan_in] weight, from
// `gen` (torch's C++ init functions take no generator): the bound is
// gain * sqrt(3 / fan_in) with gain sqrt(2 / (1 + a^2)), 1 / sqrt(fan_in)
// for PEFT's and Linear's a = sqrt(5).
void kaiming_uniform(torch::Tensor& w, double a, at::Generator gen) {
  const double fan_in = static_cast<double>(w.size(1));
  const double bound = std::sqrt(2.0 / (1.0 + a * a)) * std::sqrt(3.0 / fan_in);
  w.uniform_(-bound, bound, gen);
}

// FNV-1a over the name, mixed with the seed: an adapter's own generator.
uint64_t adapter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 14695981039346656037ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (const unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// PEFT's check_target_module_exists for a list: the key itself, or a key
// ending in "." + target.
bool matches(const std::string& name, const std::vector<std::string>& targets) {
  for (const std::string& t : targets) {
    if (name == t || (name.size() > t.size() && name.ends_with(t) && name[name.size() - t.size() - 1] == '.')) {
      return true;
    }
  }
  return false;
}

std::string strip_suffix(const std::string& s, const std::string& suffix) {
  return s.substr(0, s.size() - suffix.size());
}

}  // namespace

void LoraOptions::validate() const {
  ZEST_CHECK(r >= 1, "LoRA rank r is {}: it must be at least 1", r);
  ZEST_CHECK(std::isfinite(alpha), "lora_alpha is {}: it must be a finite number", alpha);
  ZEST_CHECK(dropout >= 0.0 && dropout < 1.0, "lora_dropout is {}: it must be in [0, 1)", dropout);
}

LoraLinearImpl::LoraLinearImpl(const LoraLinearOptions& options_) : options(options_) { reset(); }

void LoraLinearImpl::reset() {
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", torch::empty(options.out_features()));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  reset_parameters();
  if (lora_enabled()) make_adapters();
}

void LoraLinearImpl::reset_parameters() {
  // torch::nn::LinearImpl::reset_parameters, from torch's global generator.
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features()));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LoraLinearImpl::make_adapters() {
  lora_A = register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(options.in_features(), lora_.r).bias(false)));
  lora_B = register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(lora_.r, options.out_features()).bias(false)));
  torch::NoGradGuard no_grad;
  lora_B->weight.zero_();
}

void LoraLinearImpl::enable_lora(const LoraOptions& lora, at::Generator generator) {
  lora.validate();
  ZEST_CHECK(!lora_enabled(), "this LoraLinear's adapters are enabled already (r = {}): enable them once", lora_.r);
  lora_ = lora;
  make_adapters();
  torch::NoGradGuard no_grad;
  lora_A->weight.copy_(lora_A_initial(lora_.r, options.in_features(), std::move(generator)));
}

torch::Tensor lora_A_initial(int64_t r, int64_t in_features, at::Generator generator) {
  torch::Tensor a = torch::empty({r, in_features});
  kaiming_uniform(a, std::sqrt(5.0), std::move(generator));
  return a;
}

void LoraLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "zest::LoraLinear(in_features=" << options.in_features() << ", out_features=" << options.out_features()
         << ", bias=" << (options.bias() ? "true" : "false");
  if (lora_enabled()) stream << ", r=" << lora_.r << ", alpha=" << lora_.alpha << ", dropout=" << lora_.dropout;
  stream << ")";
}

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& input) {
  // at::linear, as Python's F.linear calls it: a contiguous 3-D input's bias
  // goes into the product (addmm), where libtorch 1.13's
  // torch::nn::functional::linear does that for 2-D input only and otherwise
  // multiplies into a zeroed output and adds the bias in a second pass.
  torch::Tensor out = torch::linear(input, weight, bias);
  if (!lora_enabled()) return out;
  // peft.tuners.lora.Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling.
  const torch::Tensor x = lora_.dropout > 0.0 ? torch::dropout(input, lora_.dropout, is_training()) : input;
  return out + lora_B->forward(lora_A->forward(x)) * lora_.scale();
}

std::vector<std::string> llama_lora_targets() {
  return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
}

std::vector<std::string> enable_lora(torch::nn::Module& root, const std::vector<std::string>& targets,
                                     const LoraOptions& lora, uint64_t seed, const std::string& prefix) {
  lora.validate();
  ZEST_CHECK(!targets.empty(), "no LoRA target modules given: name the Linear modules to adapt (e.g. q_proj)");
  std::vector<std::string> adapted;
  // named_modules lists the root as "" (a LoraLinear root is adapted by
  // its prefix's name, without the trailing '.').
  for (const auto& item : root.named_modules()) {
    auto* linear = item.value()->as<LoraLinearImpl>();
    auto* column = item.value()->as<tp::ColumnParallelLinearImpl>();
    auto* row = item.value()->as<tp::RowParallelLinearImpl>();
    if (linear == nullptr && column == nullptr && row == nullptr) continue;
    std::string name = prefix + item.key();
    if (item.key().empty() && name.ends_with('.')) name.pop_back();
    if (!matches(name, targets)) continue;
    at::Generator generator = at::detail::createCPUGenerator(adapter_seed(seed, name));
    if (linear != nullptr) linear->enable_lora(lora, std::move(generator));
    if (column != nullptr) column->enable_lora(lora, std::move(generator));
    if (row != nullptr) row->enable_lora(lora, std::move(generator));
    adapted.push_back(std::move(name));
  }
  ZEST_CHECK(!adapted.empty(),
             "none of the LoRA target modules [{}] is a zest::LoraLinear or a tensor-parallel linear layer of this "
             "module: name such modules (their last name components, e.g. q_proj)",
             fmt::join(targets, ", "));
  for (const auto& item : root.named_parameters()) item.value().set_requires_grad(is_lora_adapter(item.key()));
  return adapted;
}

bool is_lora_adapter(const std::string& name) {
  return name.ends_with("lora_A.weight") || name.ends_with("lora_B.weight");
}

int merge_lora(std::map<std::string, HostTensor>& tensors, double scale) {
  static const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";
  std::set<std::string> modules;
  for (const auto& [name, t] : tensors) {
    if (name.ends_with(kA)) modules.insert(strip_suffix(name, kA));
    if (name.ends_with(kB)) modules.insert(strip_suffix(name, kB));
  }
  const auto shape = [](const HostTensor& t) { return fmt::format("[{}]", fmt::join(t.shape, ", ")); };
  const auto tensor_of = [&](const HostTensor& t) {
    const int64_t n = static_cast<int64_t>(t.values.size());
    ZEST_CHECK(t.shape.size() == 2 && t.shape[0] * t.shape[1] == n,
               "a LoRA merge needs 2-D tensors whose shape matches their {} values; got shape {}", n, shape(t));
    // from_blob does not copy: the values stay in `tensors`.
    return torch::from_blob(const_cast<float*>(t.values.data()), {t.shape[0], t.shape[1]}, torch::kFloat);
  };
  for (const std::string& m : modules) {
    const auto a = tensors.find(m + kA), b = tensors.find(m + kB), w = tensors.find(m + ".weight");
    ZEST_CHECK(a != tensors.end() && b != tensors.end(), "{} has {} but not {}: export both adapters of a module", m,
               a != tensors.end() ? "lora_A" : "lora_B", a != tensors.end() ? "lora_B" : "lora_A");
    ZEST_CHECK(w != tensors.end(), "{}'s adapters have no base weight {}.weight in the same unit", m, m);
    const torch::Tensor A = tensor_of(a->second), B = tensor_of(b->second);
    torch::Tensor W = tensor_of(w->second);
    ZEST_CHECK(B.size(1) == A.size(0) && W.size(0) == B.size(0) && W.size(1) == A.size(1),
               "{}: lora_B {} @ lora_A {} does not give the weight's shape {}", m, shape(b->second),
               shape(a->second), shape(w->second));
    W.add_(torch::matmul(B, A) * scale);
    tensors.erase(a);
    tensors.erase(b);
  }
  return static_cast<int>(modules.size());
}

std::string adapter_config_json(const LoraOptions& lora, const std::vector<std::string>& targets,
                                const std::string& base_model) {
  lora.validate();
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  if (!base_model.empty()) j["base_model_name_or_path"] = base_model;
  j["r"] = lora.r;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  j["target_modules"] = targets;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  return j.dump(2);
}

namespace {

// The merge as an export transform: adapters wait in `pending` until the
// unit of the weight they adapt is written.
using Pending = std::map<std::string, HostTensor>;

void merge_pending(Pending& pending, double scale, std::vector<HfTensor>& tensors, HfExportPass pass) {
  std::vector<HfTensor> out;
  for (HfTensor& t : tensors) {
    if (is_lora_adapter(t.name)) {
      pending[t.name] = {t.shape, std::move(t.values)};
    } else {
      out.push_back(std::move(t));
    }
  }
  const std::string suffix = ".weight";
  for (HfTensor& t : out) {
    if (!t.name.ends_with(suffix)) continue;
    const std::string module = t.name.substr(0, t.name.size() - suffix.size());
    const auto a = pending.find(module + ".lora_A.weight");
    const auto b = pending.find(module + ".lora_B.weight");
    if (a == pending.end() || b == pending.end()) continue;
    if (pass == HfExportPass::kWrite) {
      Pending group{{t.name, {t.shape, std::move(t.values)}}, *a, *b};
      merge_lora(group, scale);
      t.values = std::move(group.at(t.name).values);
    }
    pending.erase(a);
    pending.erase(b);
  }
  tensors = std::move(out);
}

}  // namespace

HfExportReport export_hf_lora_merged(Engine& engine, const std::string& dir, const HfExportOptions& options,
                                     const LoraOptions& lora) {
  ZEST_CHECK(!options.transform, "export_hf_lora_merged: HfExportOptions::transform is set; it sets its own");
  HfExportOptions o = options;
  auto pending = std::make_shared<Pending>();
  o.transform = [pending, scale = lora.scale()](int, std::vector<HfTensor>& tensors, HfExportPass pass) {
    merge_pending(*pending, scale, tensors, pass);
  };
  HfExportReport report = export_hf(engine, dir, o);
  // Every rank planned the same units, so every rank knows what is left.
  ZEST_CHECK(pending->empty(), "export_hf_lora_merged: {} adapter tensor(s) found no weight to merge into, the first "
             "'{}'", pending->size(), pending->empty() ? "" : pending->begin()->first);
  return report;
}

HfExportReport export_hf_lora_apart(Engine& engine, const std::string& dir, const HfExportOptions& options,
                                    const LoraOptions& lora, const std::vector<std::string>& targets,
                                    const std::string& base_model) {
  ZEST_CHECK(!options.transform && !options.adapter,
             "export_hf_lora_apart: HfExportOptions::transform or adapter is set; it sets its own");
  HfExportOptions o = options;
  // PEFT saves the adapters under the wrapped model's names.
  o.transform = [](int, std::vector<HfTensor>& tensors, HfExportPass) {
    for (HfTensor& t : tensors) {
      if (is_lora_adapter(t.name)) t.name = std::string(kPeftNamePrefix) + t.name;
    }
  };
  o.adapter = [](const std::string& name) { return name.starts_with(kPeftNamePrefix); };
  o.adapter_config_json = adapter_config_json(lora, targets, base_model);
  return export_hf(engine, dir, o);
}

}  // namespace zest
