#include "zest/checkpoint/whole_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <map>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/checkpoint/detail/on_every_rank.h"
#include "zest/comm/gather_scalars.h"
#include "zest/core/check.h"
#include "zest/memory/copy.h"
#include "zest/memory/raw_allocator.h"

namespace zest {
namespace {

using nlohmann::json;

// One rank's registration as the writer needs it: what its layout says of
// each unit and parameter, with the group and the tp fields by name.
struct LocalParam {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;
  std::string group;
  bool replicated = false;
  std::optional<TpSplit> split;
};

struct LocalUnit {
  std::string name;
  bool frozen = false;
  size_t padded = 0;  // Engine::unit_master's length
  std::vector<LocalParam> params;
};

std::string registration_text(const ModelLayout& layout) {
  json units = json::array();
  for (const UnitLayout& u : layout.units()) {
    json params = json::array();
    for (const ParamLayout& p : u.params) {
      json split = nullptr;
      if (p.tp_split) split = {p.tp_split->dim, p.tp_split->stride};
      params.push_back({{"name", p.name},
                        {"shape", p.shape},
                        {"offset", p.offset},
                        {"group", layout.groups().at(static_cast<size_t>(p.group)).name},
                        {"replicated", p.tp_replicated},
                        {"split", split}});
    }
    units.push_back({{"name", u.name}, {"frozen", u.frozen}, {"padded", u.padded}, {"params", params}});
  }
  return units.dump();
}

std::vector<LocalUnit> parse_registration(const std::string& text) {
  std::vector<LocalUnit> out;
  for (const json& u : json::parse(text)) {
    LocalUnit unit{u.at("name").get<std::string>(), u.at("frozen").get<bool>(), u.at("padded").get<size_t>(), {}};
    for (const json& p : u.at("params")) {
      LocalParam param{p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>(),
                       p.at("offset").get<size_t>(), p.at("group").get<std::string>(),
                       p.at("replicated").get<bool>(), std::nullopt};
      if (!p.at("split").is_null()) param.split = TpSplit{p.at("split")[0].get<int>(), p.at("split")[1].get<int>()};
      unit.params.push_back(std::move(param));
    }
    out.push_back(std::move(unit));
  }
  return out;
}

// Every rank's `text`, rank by rank: the lengths, then the bytes padded to
// the longest, as int64 words.
std::vector<std::string> all_gather_text(Communicator& comm, CachingAllocator& alloc, const Stream& stream,
                                         const std::string& text) {
  const int64_t length = static_cast<int64_t>(text.size());
  const std::vector<int64_t> lengths = all_gather_int64(comm, alloc, stream, std::span(&length, 1));
  const size_t words = static_cast<size_t>((*std::max_element(lengths.begin(), lengths.end()) + 7) / 8);
  std::vector<int64_t> mine(words, 0);
  std::memcpy(mine.data(), text.data(), text.size());
  const std::vector<int64_t> all = all_gather_int64(comm, alloc, stream, mine);
  std::vector<std::string> out;
  for (size_t r = 0; r < lengths.size(); ++r) {
    out.emplace_back(reinterpret_cast<const char*>(&all[r * words]), static_cast<size_t>(lengths[r]));
  }
  return out;
}

// Where a parameter of the whole model comes from: unit part `part` of the
// whole unit (a stage's unit), at `offset` of its flat values, of
// `slice_shape` on each tp rank; split along `split` over the tp ranks, or
// whole on tp rank 0 (replicated, or tp = 1).
struct Source {
  size_t part = 0;
  size_t offset = 0;
  std::vector<int64_t> slice_shape;
  std::optional<TpSplit> split;
};

// A unit of the whole model: the stages' units it is made of, and where
// each of its parameters comes from.
struct WholeUnitPlan {
  struct Part {
    int stage = 0;
    int local_unit = 0;
    size_t padded = 0;
  };
  std::vector<Part> parts;
  std::map<std::string, Source> sources;
};

struct Joined {
  std::vector<ParamGroupSpec> groups;
  std::vector<UnitSpec> units;
  std::vector<WholeUnitPlan> plans;
};

std::string where(int tp_rank, int pp_rank) { return fmt::format("tp rank {}, pp rank {}", tp_rank, pp_rank); }

// The whole model from the registrations of the model-parallel group's
// ranks (rank t + tp * s: tp rank t of stage s). Throws naming the first
// parameter that cannot be joined.
Joined join_registrations(const std::vector<std::vector<LocalUnit>>& regs, int tp, int pp) {
  Joined out;
  std::map<std::string, size_t> unit_index;
  const auto add_group = [&](const std::string& name) {
    for (const ParamGroupSpec& g : out.groups)
      if (g.name == name) return;
    out.groups.push_back({name, 0.0f});
  };
  add_group("default");
  for (int s = 0; s < pp; ++s) {
    const std::vector<LocalUnit>& base = regs[static_cast<size_t>(tp * s)];
    for (int t = 1; t < tp; ++t) {
      const std::vector<LocalUnit>& other = regs[static_cast<size_t>(t + tp * s)];
      ZEST_CHECK(other.size() == base.size(),
                 "export of a model split over tp {} x pp {}: {} registered {} units and {} registered {}; the tp "
                 "ranks of a stage must register the same units",
                 tp, pp, where(0, s), base.size(), where(t, s), other.size());
      for (size_t u = 0; u < base.size(); ++u) {
        const LocalUnit& a = base[u];
        const LocalUnit& b = other[u];
        const auto names = [](const LocalUnit& x) {
          std::vector<std::string> n;
          for (const LocalParam& p : x.params) n.push_back(p.name);
          return n;
        };
        ZEST_CHECK(a.name == b.name && names(a) == names(b),
                   "export of a model split over tp {} x pp {}: unit {} of {} is '{}' [{}] and of {} '{}' [{}]; the "
                   "tp ranks of a stage must register the same units and parameters",
                   tp, pp, u, where(0, s), a.name, fmt::join(names(a), ", "), where(t, s), b.name,
                   fmt::join(names(b), ", "));
        for (size_t k = 0; k < a.params.size(); ++k) {
          const LocalParam& p = a.params[k];
          const LocalParam& q = b.params[k];
          ZEST_CHECK(p.shape == q.shape && p.replicated == q.replicated && p.split == q.split,
                     "export of a model split over tp {} x pp {}: parameter '{}' is [{}]{} on {} and [{}]{} on {}; "
                     "each tp rank must hold a slice of the same shape, split alike",
                     tp, pp, p.name, fmt::join(p.shape, ", "), p.replicated ? " replicated" : "", where(0, s),
                     fmt::join(q.shape, ", "), q.replicated ? " replicated" : "", where(t, s));
        }
      }
    }
    for (size_t lu = 0; lu < base.size(); ++lu) {
      const LocalUnit& local = base[lu];
      const auto [it, fresh] = unit_index.emplace(local.name, out.units.size());
      if (fresh) {
        out.units.push_back({local.name, {}});
        out.plans.emplace_back();
      }
      UnitSpec& unit = out.units[it->second];
      WholeUnitPlan& plan = out.plans[it->second];
      plan.parts.push_back({s, static_cast<int>(lu), local.padded});
      for (const LocalParam& p : local.params) {
        add_group(p.group);
        Source source{plan.parts.size() - 1, p.offset, p.shape, std::nullopt};
        std::vector<int64_t> shape = p.shape;
        if (tp > 1 && !p.replicated) {
          ZEST_CHECK(p.split.has_value(),
                     "export of a model split over tp {} x pp {}: parameter '{}' (unit '{}', pp rank {}) is split "
                     "over the tp ranks, but how is unknown: register it with ParamSpec::tp_split {{dim, stride}} "
                     "(TorchModule does for the layers of torch/tensor_parallel.h), or with tp_replicated if every "
                     "tp rank holds it whole",
                     tp, pp, p.name, local.name, s);
          const TpSplit split = *p.split;
          const bool fits = split.dim >= 0 && static_cast<size_t>(split.dim) < shape.size() && split.stride >= 1 &&
                            shape[static_cast<size_t>(split.dim)] % split.stride == 0;
          ZEST_CHECK(fits,
                     "export of a model split over tp {} x pp {}: parameter '{}' [{}] is registered as split along "
                     "dim {} with stride {}, which its slice's shape cannot be: the dim must be one of its {}, and "
                     "its size a multiple of the stride",
                     tp, pp, p.name, fmt::join(shape, ", "), split.dim, split.stride, shape.size());
          shape[static_cast<size_t>(split.dim)] *= tp;
          source.split = split;
        }
        unit.params.push_back({p.name, shape, p.group, !local.frozen});
        plan.sources.emplace(p.name, std::move(source));
      }
    }
  }
  return out;
}

int64_t product(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (const int64_t d : dims) n *= d;
  return n;
}

// Whole unit `unit`'s flat values from `slices[part][tp rank]` (each a
// stage's unit's master values): each parameter at its offset, a split one
// joined as zest::tp::partition cut it (stride blocks along dim, each made
// of the tp ranks' pieces in rank order).
std::vector<float> join_unit(const UnitLayout& unit, const WholeUnitPlan& plan,
                             const std::vector<std::vector<std::vector<float>>>& slices, int tp) {
  std::vector<float> out(unit.padded, 0.0f);
  for (const ParamLayout& p : unit.params) {
    const Source& from = plan.sources.at(p.name);
    const std::vector<std::vector<float>>& ranks = slices[from.part];
    if (!from.split) {
      std::copy_n(ranks[0].begin() + static_cast<ptrdiff_t>(from.offset), p.numel,
                  out.begin() + static_cast<ptrdiff_t>(p.offset));
      continue;
    }
    const auto d = static_cast<size_t>(from.split->dim);
    const int64_t stride = from.split->stride;
    const std::vector<int64_t>& s = from.slice_shape;
    const int64_t outer = product(std::span(s).first(d));
    const int64_t inner = product(std::span(s).subspan(d + 1));
    const int64_t piece = s[d] / stride;  // rows of dim d per block and rank
    const auto run = static_cast<size_t>(piece * inner);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t b = 0; b < stride; ++b) {
        for (int t = 0; t < tp; ++t) {
          const auto src = from.offset + static_cast<size_t>((o * s[d] + b * piece) * inner);
          const auto dst = p.offset + static_cast<size_t>((o * s[d] * tp + (b * tp + t) * piece) * inner);
          std::copy_n(ranks[static_cast<size_t>(t)].begin() + static_cast<ptrdiff_t>(src), run,
                      out.begin() + static_cast<ptrdiff_t>(dst));
        }
      }
    }
  }
  return out;
}

}  // namespace

struct WholeModel::Mesh {
  explicit Mesh(const ModelParallel& model_parallel)
      : mp(model_parallel),
        alloc(mp.group->device().is_cuda() ? make_cuda_allocator(mp.group->device().index())
                                           : make_host_allocator()),
        stream(Stream::default_for(mp.group->device())) {}

  // Host values to and from a peer of the model-parallel group, through a
  // device buffer where the group moves device memory only (NCCL).
  void send(const std::vector<float>& values, int peer) {
    Communicator& g = *mp.group;
    if (!g.device().is_cuda()) return g.send(std::span(values), peer, stream);
    Buffer buf = alloc.allocate_buffer(values.size() * sizeof(float), stream, MemoryCategory::kCommBuffers);
    copy_bytes(stream, buf.data(), values.data(), values.size() * sizeof(float));
    g.send(buf.data(), values.size(), DType::kFloat32, peer, stream);
    stream.synchronize();
  }
  std::vector<float> recv(size_t count, int peer) {
    Communicator& g = *mp.group;
    std::vector<float> out(count);
    if (!g.device().is_cuda()) {
      g.recv(std::span(out), peer, stream);
      return out;
    }
    Buffer buf = alloc.allocate_buffer(count * sizeof(float), stream, MemoryCategory::kCommBuffers);
    g.recv(buf.data(), count, DType::kFloat32, peer, stream);
    copy_bytes(stream, out.data(), buf.data(), count * sizeof(float));
    stream.synchronize();
    return out;
  }

  ModelParallel mp;
  CachingAllocator alloc;
  Stream stream;
  std::optional<ModelLayout> layout;
  std::vector<WholeUnitPlan> plans;
};

WholeModel::WholeModel(Engine& engine) : engine_(engine) {
  const ModelParallel& mp = engine.model_parallel();
  writer_ = engine.comm().rank() == 0 && (mp.group == nullptr || mp.group->rank() == 0);
  if (mp.group == nullptr) return;
  mesh_ = std::make_unique<Mesh>(mp);
  std::vector<std::string> texts;
  on_every_rank("exchanging the model's registration", [&] {
    texts = all_gather_text(*mp.group, mesh_->alloc, mesh_->stream, registration_text(engine.layout()));
  });
  on_every_rank("joining the model's registration", [&] {
    std::vector<std::vector<LocalUnit>> regs;
    for (const std::string& t : texts) regs.push_back(parse_registration(t));
    Joined joined = join_registrations(regs, mp.tp_size, mp.pp_size);
    mesh_->layout.emplace(std::move(joined.groups), std::move(joined.units), 1);
    mesh_->plans = std::move(joined.plans);
  });
}

WholeModel::~WholeModel() = default;

const ModelLayout& WholeModel::layout() const { return mesh_ ? *mesh_->layout : engine_.layout(); }

std::vector<float> WholeModel::unit(int u) {
  if (!mesh_) return engine_.unit_master(u);  // collective over the data-parallel group
  const WholeUnitPlan& plan = mesh_->plans.at(static_cast<size_t>(u));
  const ModelParallel& mp = mesh_->mp;
  std::vector<std::vector<float>> mine(plan.parts.size());
  on_every_rank("gathering a unit of the whole model", [&] {
    for (size_t k = 0; k < plan.parts.size(); ++k) {
      if (plan.parts[k].stage == mp.pp_rank) mine[k] = engine_.unit_master(plan.parts[k].local_unit);
    }
  });
  // Every slice reaches the writer before it joins any: an error while
  // joining cannot leave a sender waiting.
  std::vector<float> whole;
  on_every_rank("joining a unit of the whole model", [&] {
    if (engine_.comm().rank() != 0) return;  // the other replicas hold the same values
    if (!writer_) {
      for (size_t k = 0; k < plan.parts.size(); ++k) {
        if (plan.parts[k].stage == mp.pp_rank) mesh_->send(mine[k], 0);
      }
      return;
    }
    std::vector<std::vector<std::vector<float>>> slices(plan.parts.size());
    for (size_t k = 0; k < plan.parts.size(); ++k) {
      const WholeUnitPlan::Part& part = plan.parts[k];
      for (int t = 0; t < mp.tp_size; ++t) {
        const int peer = t + mp.tp_size * part.stage;
        slices[k].push_back(peer == 0 ? std::move(mine[k]) : mesh_->recv(part.padded, peer));
      }
    }
    whole = join_unit(layout().unit(u), plan, slices, mp.tp_size);
  });
  return whole;
}

void WholeModel::on_every_rank(const char* what, const std::function<void()>& fn) {
  if (!mesh_) return zest::on_every_rank(engine_, what, fn);
  // Agreed over the data-parallel group first (every rank of this tp x pp
  // coordinate knows), then over the model-parallel group: each rank then
  // knows of a failure at any coordinate of any replica.
  const ModelParallel& mp = mesh_->mp;
  agree_on_outcome(
      [&](std::span<const int64_t> mine) { return all_gather_int64(*mp.group, mesh_->alloc, mesh_->stream, mine); },
      [&](int m) { return fmt::format("at {} of the mesh", where(m % mp.tp_size, m / mp.tp_size)); }, what,
      [&] { zest::on_every_rank(engine_, what, fn); });
}

}  // namespace zest
