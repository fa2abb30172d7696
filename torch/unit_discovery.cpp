// TorchModule's unit discovery: which parameters form which unit.
#include "zest/torch/detail/unit_discovery.h"

#include <algorithm>
#include <map>

#include "zest/core/check.h"

namespace zest {

std::vector<FoundUnit> find_units(torch::nn::Module& root, const TorchModuleOptions& options) {
  // Each tensor once, under its first name.
  std::vector<std::pair<std::string, torch::Tensor>> all;
  std::map<const void*, std::string> first_name;
  for (const auto& item : root.named_parameters(true)) {
    const void* impl = item.value().unsafeGetTensorImpl();
    if (first_name.emplace(impl, item.key()).second) all.emplace_back(item.key(), item.value());
  }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> unit_modules;
  if (options.units.empty()) {
    for (const auto& child : root.named_children()) unit_modules.emplace_back(child.key(), child.value());
  } else {
    std::map<const torch::nn::Module*, std::string> paths;
    for (const auto& m : root.named_modules("", /*include_self=*/false)) paths.emplace(m.value().get(), m.key());
    for (const auto& m : options.units) {
      ZEST_CHECK(m != nullptr, "TorchModuleOptions::units holds a null module");
      const auto it = paths.find(m.get());
      ZEST_CHECK(it != paths.end(),
                 "TorchModuleOptions::units: a module of type {} is not a descendant of the wrapped "
                 "module; list modules of the model itself",
                 m->name());
      unit_modules.emplace_back(it->second, m);
    }
  }
  std::map<const void*, std::string> owner;  // tensor -> unit name
  std::vector<FoundUnit> units;
  units.push_back({kRootUnit, "", &root, {}});
  for (const auto& [path, m] : unit_modules) {
    FoundUnit u{path, path, m.get(), {}};
    for (const auto& item : m->named_parameters(true)) {
      const void* impl = item.value().unsafeGetTensorImpl();
      const auto [it, fresh] = owner.emplace(impl, path);
      if (!fresh) {
        if (it->second == path) continue;  // registered twice within the unit
        ZEST_FAIL(
            "parameter '{}' is in unit '{}' and in unit '{}' (nested unit modules, or one tensor "
            "registered in two units' modules, such as tied weights): list a module that holds both "
            "as the unit instead",
            first_name.at(impl), it->second, path);
      }
      u.params.emplace_back(first_name.at(impl), item.value());
    }
    if (!u.params.empty()) units.push_back(std::move(u));
  }
  for (const auto& [name, t] : all) {
    if (!owner.count(t.unsafeGetTensorImpl())) units[0].params.emplace_back(name, t);
  }
  if (units[0].params.empty()) units.erase(units.begin());
  ZEST_CHECK(!units.empty(), "the module has no parameters: there is nothing to train");
  // Layout order within a unit: the module's own order.
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < all.size(); ++i) order[all[i].first] = i;
  for (FoundUnit& u : units) {
    std::sort(u.params.begin(), u.params.end(),
              [&](const auto& a, const auto& b) { return order.at(a.first) < order.at(b.first); });
  }
  return units;
}

void check_param(const std::string& name, const torch::Tensor& t) {
  ZEST_CHECK(t.defined(), "parameter '{}' is undefined", name);
  ZEST_CHECK(t.is_floating_point(), "parameter '{}' is {}: only floating-point parameters are trained", name,
             c10::toString(t.scalar_type()));
  ZEST_CHECK(t.layout() == torch::kStrided, "parameter '{}' is not a dense tensor", name);
}

std::vector<FoundUnit> split_frozen(std::vector<FoundUnit> found, std::vector<bool>& frozen) {
  std::vector<FoundUnit> out;
  for (FoundUnit& f : found) {
    FoundUnit cold{f.name + ":frozen", f.path, f.module, {}};
    FoundUnit warm{f.name, f.path, f.module, {}};
    for (auto& p : f.params) (p.second.requires_grad() ? warm : cold).params.push_back(std::move(p));
    if (warm.params.empty()) {
      cold.name = f.name;
    } else {
      out.push_back(std::move(warm));
      frozen.push_back(false);
    }
    if (!cold.params.empty()) {
      out.push_back(std::move(cold));
      frozen.push_back(true);
    }
  }
  return out;
}

}  // namespace zest
