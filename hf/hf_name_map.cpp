#include "zest/hf/hf_name_map.h"

namespace zest {
namespace {

std::string replace_prefix(const std::string& name, const std::string& from, const std::string& to) {
  if (!name.starts_with(from)) return name;
  return to + name.substr(from.size());
}

}  // namespace

std::string HfNameMap::engine_name(const std::string& checkpoint_name) const {
  if (const auto it = table.find(checkpoint_name); it != table.end()) return it->second;
  return replace_prefix(checkpoint_name, checkpoint_prefix, engine_prefix);
}

std::string HfNameMap::checkpoint_name(const std::string& engine_name) const {
  for (const auto& [from, to] : table) {
    if (to == engine_name) return from;
  }
  return replace_prefix(engine_name, engine_prefix, checkpoint_prefix);
}

}  // namespace zest
