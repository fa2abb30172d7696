// Deferred construction's initial values (Note [deferred construction] in
// module_construction.cpp), for TorchModule's constructor.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>

#include "zest/core/trim_heap.h"
#include "zest/torch/detail/unit_discovery.h"
#include "zest/torch/torch_module.h"

namespace zest {

// Note [deferred construction]
// A placeholder parameter has its shape and no memory (module_construction.h),
// so a model whose units are placeholders costs nothing until the engine
// initializes it. Engine::finalize asks for initial values unit by unit, in
// layout order, on the initializing rank(s): the unit's module is built by
// build_unit when the first of its parameters is asked for, its values
// copied, and the module dropped when the next unit's turn comes. A rank so
// holds at most one unit's values twice over (the engine's fp32 staging of
// the unit and the built module) besides its shards; the heap is trimmed
// after each unit (core/trim_heap.h).
class DeferredValues {
 public:
  DeferredValues(const std::vector<FoundUnit>& found, const TorchModuleOptions& options) : options_(options) {
    size_t params = 0;
    for (const FoundUnit& f : found) {
      for (const auto& [name, t] : f.params) {
        ++params;
        if (is_placeholder(t)) path_of_[name] = f.path;
      }
    }
    all_zero_ = path_of_.size() == params && !options.build_unit;
    ZEST_CHECK(path_of_.empty() || options.build_unit || options.placeholders_loaded_later,
               "{} parameter(s) are placeholders (the first '{}') but TorchModuleOptions::build_unit is unset: "
               "set build_unit to give their initial values, or placeholders_loaded_later when a weights "
               "import follows",
               path_of_.size(), path_of_.empty() ? "" : path_of_.begin()->first);
  }
  bool owns(const std::string& name) const { return path_of_.count(name) > 0; }
  // Every parameter a placeholder loaded later: the engine starts them at
  // zero itself, with no unit staged on the host or broadcast.
  InitFrom init_from() const { return all_zero_ ? InitFrom::kZeros : options_.init_from; }

  void fill(const ParamLayout& p, std::span<float> values) {
    if (!options_.build_unit) return;  // zeros: the engine's staging starts so
    const std::string& path = path_of_.at(p.name);
    if (!built_ || path != built_path_) {
      release();  // the previous unit's values go first
      built_ = options_.build_unit(path);
      ZEST_CHECK(built_ != nullptr, "build_unit('{}') returned a null module", path);
      built_path_ = path;
      params_.clear();
      for (const auto& item : built_->named_parameters(true)) params_.emplace(item.key(), item.value());
    }
    const std::string relative = path.empty() ? p.name : p.name.substr(path.size() + 1);
    const auto it = params_.find(relative);
    ZEST_CHECK(it != params_.end(), "build_unit('{}') built a module without parameter '{}' (it has {} parameters)",
               path, relative, params_.size());
    ZEST_CHECK(it->second.sizes().vec() == p.shape, "build_unit('{}'): parameter '{}' has shape {}, the model's is {}",
               path, relative, c10::str(it->second.sizes()), c10::str(torch::IntArrayRef(p.shape)));
    ZEST_CHECK(!is_placeholder(it->second), "build_unit('{}'): parameter '{}' is itself a placeholder", path, relative);
    const torch::Tensor v = it->second.detach().to(torch::kCPU, torch::kFloat).contiguous();
    std::memcpy(values.data(), v.data_ptr<float>(), values.size() * sizeof(float));
  }
  void release() {
    if (built_ == nullptr) return;
    built_ = nullptr;
    params_.clear();
    trim_heap();
  }

 private:
  const TorchModuleOptions& options_;
  std::map<std::string, std::string> path_of_;  // placeholder parameter -> its unit's path
  std::shared_ptr<torch::nn::Module> built_;
  std::string built_path_;
  std::map<std::string, torch::Tensor> params_;
  bool all_zero_ = false;
};

}  // namespace zest
