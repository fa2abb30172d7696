#include "zest/engine/layout.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/core/check.h"
#include "zest/engine/layout_constants.h"

namespace zest {
namespace {

size_t checked_numel(const ParamSpec& p, const std::string& unit) {
  size_t n = 1;
  for (int64_t d : p.shape) {
    ZEST_CHECK(d > 0, "parameter '{}' of unit '{}' has shape [{}]: every dimension must be positive",
               p.name, unit, fmt::join(p.shape, ", "));
    ZEST_CHECK(static_cast<uint64_t>(d) <= (uint64_t{1} << 48) / n,
               "parameter '{}' of unit '{}' has shape [{}]: too many elements", p.name, unit,
               fmt::join(p.shape, ", "));
    n *= static_cast<size_t>(d);
  }
  return n;
}

std::vector<size_t> line_starts(const std::string& text) {
  std::vector<size_t> starts{0};
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n') starts.push_back(i + 1);
  return starts;
}

std::string line_at(const std::string& text, size_t start) {
  if (start >= text.size()) return "(nothing: the model ends here)";
  const size_t end = text.find('\n', start);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

ModelLayout::ModelLayout(std::vector<ParamGroupSpec> groups, std::vector<UnitSpec> units,
                         int partitions)
    : partitions_(partitions), groups_(std::move(groups)) {
  ZEST_CHECK(partitions >= 1, "layout: partitions must be at least 1, got {}", partitions);
  ZEST_CHECK(!groups_.empty(), "layout: no parameter group (the first is the default)");
  ZEST_CHECK(!units.empty(), "no unit registered: add_unit() at least once before finalize()");

  std::unordered_map<std::string, int> group_index;
  for (size_t g = 0; g < groups_.size(); ++g) {
    ZEST_CHECK(group_index.emplace(groups_[g].name, static_cast<int>(g)).second,
               "parameter group '{}' declared twice", groups_[g].name);
  }
  std::unordered_set<std::string> unit_names;
  for (const UnitSpec& spec : units) {
    ZEST_CHECK(!spec.name.empty(), "a unit needs a name");
    ZEST_CHECK(unit_names.insert(spec.name).second, "unit '{}' registered twice", spec.name);
    ZEST_CHECK(!spec.params.empty(), "unit '{}' has no parameters", spec.name);

    UnitLayout unit;
    unit.name = spec.name;
    unit.frozen = !spec.params.front().trainable;
    for (const ParamSpec& p : spec.params) {
      ZEST_CHECK(p.trainable != unit.frozen,
                 "unit '{}' mixes trainable and frozen parameters ('{}' is {}, '{}' is {}): a unit's parameters are "
                 "all trainable or all frozen; register the frozen ones in a unit of their own",
                 spec.name, spec.params.front().name, unit.frozen ? "frozen" : "trainable", p.name,
                 p.trainable ? "trainable" : "frozen");
      ZEST_CHECK(!p.name.empty(), "unit '{}' has a parameter without a name", spec.name);
      const auto g = group_index.find(p.group);
      ZEST_CHECK(g != group_index.end(),
                 "parameter '{}' of unit '{}' is in group '{}', which was not declared "
                 "(add_param_group first)",
                 p.name, spec.name, p.group);
      unit.params.push_back({p.name, p.shape, checked_numel(p, spec.name), 0, g->second, p.tp_replicated, p.tp_split});
    }
    std::stable_sort(unit.params.begin(), unit.params.end(),
                     [](const ParamLayout& a, const ParamLayout& b) { return a.group < b.group; });

    size_t end = 0;
    for (ParamLayout& p : unit.params) {
      p.offset = aligned_param_offset(end);
      end = p.offset + p.numel;
      unit.numel += p.numel;
      if (unit.runs.empty() || unit.runs.back().group != p.group) {
        if (!unit.runs.empty()) unit.runs.back().end = p.offset;
        unit.runs.push_back({p.offset, 0, p.group});
      }
    }
    unit.runs.front().begin = 0;
    unit.padded = padded_unit_numel(end, partitions_);
    unit.runs.back().end = unit.padded;
    unit.shard = unit.padded / static_cast<size_t>(partitions_);

    const int u = static_cast<int>(units_.size());
    for (size_t i = 0; i < unit.params.size(); ++i) {
      ZEST_CHECK(by_name_.emplace(unit.params[i].name, ParamRef{u, static_cast<int>(i)}).second,
                 "parameter '{}' registered twice (again in unit '{}')", unit.params[i].name,
                 unit.name);
    }
    owned_offsets_.push_back(owned_);
    trainable_offsets_.push_back(trainable_owned_);
    numel_ += unit.numel;
    padded_ += unit.padded;
    owned_ += unit.shard;
    if (!unit.frozen) trainable_owned_ += unit.shard;
    units_.push_back(std::move(unit));
  }
}

ParamRef ModelLayout::find(const std::string& param_name) const {
  const auto it = by_name_.find(param_name);
  ZEST_CHECK(it != by_name_.end(), "no parameter named '{}' is registered", param_name);
  return it->second;
}

bool ModelLayout::contains(std::string_view param_name) const {
  return by_name_.contains(std::string(param_name));
}

const ParamLayout& ModelLayout::param(ParamRef ref) const {
  return unit(ref.unit).params.at(static_cast<size_t>(ref.index));
}

std::vector<GroupRun> ModelLayout::shard_runs(int u, int p) const {
  const UnitLayout& unit = this->unit(u);
  const size_t begin = unit.shard * static_cast<size_t>(p);
  const size_t end = begin + unit.shard;
  std::vector<GroupRun> out;
  for (const GroupRun& run : unit.runs) {
    const size_t b = std::max(run.begin, begin);
    const size_t e = std::min(run.end, end);
    if (b < e) out.push_back({b - begin, e - begin, run.group});
  }
  return out;
}

std::string ModelLayout::describe() const {
  std::string out;
  for (const ParamGroupSpec& g : groups_)
    out += fmt::format("group {} weight_decay {}\n", g.name, g.weight_decay);
  for (const UnitLayout& unit : units_) {
    out += fmt::format("unit {}{}\n", unit.name, unit.frozen ? " frozen" : "");
    for (const ParamLayout& p : unit.params)
      out += fmt::format("param {} [{}] group {}\n", p.name, fmt::join(p.shape, ", "),
                         groups_[static_cast<size_t>(p.group)].name);
  }
  return out;
}

uint64_t ModelLayout::digest() const {
  uint64_t h = 1469598103934665603ull;
  for (const char c : describe()) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

std::string element_name(const UnitLayout& unit, size_t at) {
  for (const ParamLayout& p : unit.params) {
    if (at >= p.offset && at < p.offset + p.numel) return fmt::format("parameter '{}' element {}", p.name, at - p.offset);
  }
  return "padding";
}

std::string first_difference(const std::string& a, const std::string& b) {
  const std::vector<size_t> sa = line_starts(a);
  const std::vector<size_t> sb = line_starts(b);
  for (size_t i = 0; i < std::max(sa.size(), sb.size()); ++i) {
    const std::string la = i < sa.size() ? line_at(a, sa[i]) : line_at(a, a.size());
    const std::string lb = i < sb.size() ? line_at(b, sb[i]) : line_at(b, b.size());
    if (la != lb) return fmt::format("line {}: '{}' against '{}'", i + 1, la, lb);
  }
  return "no difference";
}

}  // namespace zest
