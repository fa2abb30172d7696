// TorchModule's units as found in the module tree, before the engine
// registers them (torch_module.h's header comment: "Units", "Frozen
// parameters").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "zest/torch/torch_module.h"

namespace zest {

inline constexpr const char* kRootUnit = "<root>";

// A unit as found in the module tree, before registration.
struct FoundUnit {
  std::string name;
  std::string path;  // of the unit's module in the model; "" for the root
  const torch::nn::Module* module = nullptr;
  std::vector<std::pair<std::string, torch::Tensor>> params;
};

// Assigns every parameter to one unit: see torch_module.h's header comment.
std::vector<FoundUnit> find_units(torch::nn::Module& root, const TorchModuleOptions& options);
// Throws for a parameter that is undefined, not floating-point or not dense.
void check_param(const std::string& name, const torch::Tensor& t);
// A unit with trainable and frozen parameters becomes two: the trainable
// ones under the unit's name, then the frozen ones as "<name>:frozen"
// (engine units are all trainable or all frozen). Marks which is which.
std::vector<FoundUnit> split_frozen(std::vector<FoundUnit> found, std::vector<bool>& frozen);

}  // namespace zest
