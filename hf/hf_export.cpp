#include "zest/hf/hf_export.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/checkpoint/checkpoint_publish.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/checkpoint/whole_model.h"
#include "zest/config/detail/json_parse.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/core/trim_heap.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/hf/detail/hf_progress.h"

namespace zest {
namespace fs = std::filesystem;
namespace {

using nlohmann::json;

// Elements converted and handed to the writer at a time.
constexpr size_t kWritePieceElems = size_t{1} << 20;

struct Planned {
  std::string engine_name;  // as transform gives it
  std::string name;         // in the files
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  uint64_t bytes = 0;
  int unit = 0;
  size_t file = 0;  // into Plan::files
};

struct PlannedFile {
  std::string name;
  std::vector<size_t> tensors;  // into Plan::tensors, in write order
};

struct Plan {
  std::vector<Planned> tensors;  // unit by unit, in transform's order
  std::vector<PlannedFile> files;
  std::vector<int> order;  // of the units
  std::vector<std::pair<size_t, size_t>> unit_tensors;  // unit u's: [first, second) of tensors
  uint64_t model_bytes = 0;
  uint64_t total_bytes = 0;
  bool indexed = false;
  std::optional<size_t> adapter_file;
};

// The unit's registered tensors: names and shapes, and the values from
// `master` (the unit's flat fp32 buffer) when given.
std::vector<HfTensor> unit_tensors(const UnitLayout& unit, const std::vector<float>* master) {
  std::vector<HfTensor> out;
  for (const ParamLayout& p : unit.params) {
    HfTensor t{p.name, p.shape, {}};
    if (master) t.values.assign(master->begin() + static_cast<ptrdiff_t>(p.offset),
                                master->begin() + static_cast<ptrdiff_t>(p.offset + p.numel));
    out.push_back(std::move(t));
  }
  return out;
}

// A JSON object's text, checked; `what` names it in the error.
std::string checked_object(const std::string& text, const std::string& what) {
  const json doc = detail::parse_json(text, what, {.max_depth = 32});
  ZEST_CHECK(doc.is_object(), "{} is a JSON {}; expected an object", what, doc.type_name());
  return text;
}

std::string config_text(const HfExportOptions& options) {
  if (!options.config_json.empty()) return checked_object(options.config_json, "HfExportOptions::config_json");
  ZEST_CHECK(!options.config_from.empty(),
             "a Hugging Face export needs its config.json: set HfExportOptions::config_json (the text) or "
             "config_from (the directory whose config.json to copy)");
  const std::string path = (fs::path(options.config_from) / kHfConfigFileName).string();
  return checked_object(read_text_file(path), fmt::format("'{}'", path));
}

// Hugging Face's split_state_dict_into_shards: in order, a tensor joins the
// current shard unless it would pass the limit, then starts the next; a
// tensor over the limit alone gets a shard of its own, listed before the
// current one.
std::vector<std::vector<size_t>> split_into_shards(const std::vector<Planned>& tensors,
                                                   const std::vector<size_t>& model, uint64_t max_shard_size) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  for (const size_t i : model) {
    const uint64_t size = tensors[i].bytes;
    if (size > max_shard_size) {
      shards.push_back({i});
      continue;
    }
    if (current_size + size > max_shard_size) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += size;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

// options.unit_order, checked, or registration order.
std::vector<int> unit_order(const ModelLayout& layout, const HfExportOptions& options) {
  const int n = layout.num_units();
  std::vector<int> order = options.unit_order;
  if (order.empty()) {
    for (int u = 0; u < n; ++u) order.push_back(u);
    return order;
  }
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  bool permutation = sorted.size() == static_cast<size_t>(n);
  for (int u = 0; permutation && u < n; ++u) permutation = sorted[static_cast<size_t>(u)] == u;
  ZEST_CHECK(permutation, "HfExportOptions::unit_order [{}] is not an order of the model's {} units (each of 0..{} "
             "once)", fmt::join(order, ", "), n, n - 1);
  return order;
}

Plan make_plan(const ModelLayout& layout, const HfExportOptions& options) {
  Plan plan;
  plan.order = unit_order(layout, options);
  plan.unit_tensors.resize(static_cast<size_t>(layout.num_units()));
  std::vector<size_t> model, adapter;
  std::map<std::string, std::string> file_names;  // name in the files -> engine name
  for (const int u : plan.order) {
    std::vector<HfTensor> tensors = unit_tensors(layout.unit(u), nullptr);
    if (options.transform) options.transform(u, tensors, HfExportPass::kPlan);
    plan.unit_tensors[static_cast<size_t>(u)] = {plan.tensors.size(), plan.tensors.size() + tensors.size()};
    for (HfTensor& t : tensors) {
      Planned p;
      p.engine_name = t.name;
      p.name = options.names.checkpoint_name(t.name);
      ZEST_CHECK(options.names.engine_name(p.name) == t.name,
                 "Hugging Face export: the name map takes '{}' to '{}', which maps back to '{}'; give it a table "
                 "entry",
                 t.name, p.name, options.names.engine_name(p.name));
      const auto [it, fresh] = file_names.emplace(p.name, t.name);
      ZEST_CHECK(fresh, "Hugging Face export: '{}' and '{}' are both written as '{}'; each tensor needs a name of "
                 "its own", it->second, t.name, p.name);
      const std::optional<uint64_t> numel = detail::safetensors_numel(t.shape, elem_size(options.dtype));
      ZEST_CHECK(numel.has_value(), "Hugging Face export: tensor '{}' has shape [{}]; dims must be >= 0", t.name,
                 fmt::join(t.shape, ", "));
      p.shape = std::move(t.shape);
      p.numel = *numel;
      p.bytes = *numel * elem_size(options.dtype);
      p.unit = u;
      const bool to_adapter = options.adapter && options.adapter(p.engine_name);
      (to_adapter ? adapter : model).push_back(plan.tensors.size());
      (to_adapter ? plan.total_bytes : plan.model_bytes) += p.bytes;
      plan.tensors.push_back(std::move(p));
    }
  }
  plan.total_bytes += plan.model_bytes;
  const std::vector<std::vector<size_t>> shards = split_into_shards(plan.tensors, model, options.max_shard_size);
  plan.indexed = shards.size() > 1;
  for (size_t s = 0; s < shards.size(); ++s) {
    plan.files.push_back({plan.indexed ? fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size())
                                       : std::string(kHfWeightsFileName),
                          shards[s]});
  }
  if (!adapter.empty()) {
    ZEST_CHECK(!options.adapter_config_json.empty(),
               "Hugging Face export: {} tensors go to {}, so HfExportOptions::adapter_config_json (PEFT's "
               "adapter_config.json) must be given",
               adapter.size(), kHfAdapterWeightsFileName);
    checked_object(options.adapter_config_json, "HfExportOptions::adapter_config_json");
    plan.adapter_file = plan.files.size();
    plan.files.push_back({kHfAdapterWeightsFileName, adapter});
  }
  for (size_t f = 0; f < plan.files.size(); ++f)
    for (const size_t i : plan.files[f].tensors) plan.tensors[i].file = f;
  return plan;
}

// model.safetensors.index.json as transformers writes it (sorted keys,
// two-space indent, a final newline).
std::string index_json(const Plan& plan) {
  json weight_map = json::object();
  for (const PlannedFile& f : plan.files) {
    if (plan.adapter_file && &f == &plan.files[*plan.adapter_file]) continue;
    for (const size_t i : f.tensors) weight_map[plan.tensors[i].name] = f.name;
  }
  const json index = {{"metadata", {{"total_size", plan.model_bytes}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

void write_text(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

// Note [an export never destroys what it did not write]
// An export publishes its directory whole, replacing what was there (one
// rename, CheckpointPublisher). Pointed at the model the run started from,
// at a checkpoint root or at an unrelated directory, that would delete
// what no export wrote: the base model's weights and tokenizer, a
// checkpoint, a user's files. So before anything is written the
// destination, with links resolved, is compared with the run's inputs
// (HfExportOptions::inputs and config_from): neither may lie within the
// other. An existing destination may hold only the files an export writes
// (so a previous export is replaced, atomically). HfExportOptions::replace
// lifts both refusals, and each error names it.
bool written_by_export(const std::string& name) {
  static const std::regex shard(R"(model-[0-9]{5}-of-[0-9]{5}\.safetensors)");
  return name == kHfConfigFileName || name == kHfIndexFileName || name == kHfWeightsFileName ||
         name == kHfAdapterConfigFileName || name == kHfAdapterWeightsFileName || std::regex_match(name, shard);
}

void check_destination(const fs::path& target, const HfExportOptions& options) {
  if (options.replace) return;
  constexpr const char* kHow = "export elsewhere, or set HfExportOptions::replace (--export-replace) to replace it";
  std::error_code ec;
  const fs::path dest = fs::weakly_canonical(fs::absolute(target), ec);
  ZEST_CHECK(!ec, "Hugging Face export: cannot resolve '{}': {}", target.string(), ec.message());
  // a within b: equal, or a lies inside b.
  const auto within = [](const fs::path& a, const fs::path& b) {
    return std::mismatch(b.begin(), b.end(), a.begin(), a.end()).first == b.end();
  };
  std::vector<std::string> inputs = options.inputs;
  inputs.push_back(options.config_from);
  for (const std::string& input : inputs) {
    if (input.empty()) continue;
    const fs::path in = fs::weakly_canonical(fs::absolute(input), ec);
    if (ec) continue;  // what cannot be resolved cannot be overwritten by the rename
    const char* how = dest == in ? "is" : within(dest, in) ? "lies inside" : within(in, dest) ? "contains" : nullptr;
    ZEST_CHECK(how == nullptr,
               "Hugging Face export to '{}': the destination {} '{}', which this run reads or writes, and publishing "
               "the export would replace it; {}",
               target.string(), how, input, kHow);
  }
  if (!fs::exists(fs::symlink_status(target))) return;
  ZEST_CHECK(fs::is_directory(fs::symlink_status(target)),
             "Hugging Face export to '{}': it exists and is not a directory; {}", target.string(), kHow);
  for (const fs::directory_entry& e : fs::directory_iterator(target)) {
    const std::string name = e.path().filename().string();
    ZEST_CHECK(e.is_regular_file(ec) && !e.is_symlink(ec) && written_by_export(name),
               "Hugging Face export to '{}': it holds '{}', which an export does not write, and publishing the export "
               "would delete it; {}",
               target.string(), name, kHow);
  }
}

// Rank 0's side of an export: the plan, the open writers, the publisher.
class ExportWriter {
 public:
  ExportWriter(const std::string& dir, const ModelLayout& layout, const HfExportOptions& options)
      : options_(options), plan_(make_plan(layout, options)), config_(config_text(options)) {
    fs::path target = fs::path(dir).lexically_normal();
    if (target.filename().empty()) target = target.parent_path();
    ZEST_CHECK(!target.empty() && !target.filename().empty(), "Hugging Face export: '{}' is not a directory name",
               dir);
    check_destination(target, options);
    const fs::path root = target.has_parent_path() ? target.parent_path() : fs::path(".");
    publisher_ = std::make_unique<CheckpointPublisher>(root.string(), target.filename().string(), false);
    writers_.resize(plan_.files.size());
  }

  const Plan& plan() const { return plan_; }

  void write_unit(int u, const UnitLayout& unit, const std::vector<float>& master, detail::HfProgress& progress) {
    std::vector<HfTensor> tensors = unit_tensors(unit, &master);
    if (options_.transform) options_.transform(u, tensors, HfExportPass::kWrite);
    const auto [begin, end] = plan_.unit_tensors[static_cast<size_t>(u)];
    ZEST_CHECK(tensors.size() == end - begin,
               "Hugging Face export: transform gave unit {} ('{}') {} tensors in the write pass and {} in the plan "
               "pass; both passes must give the same names and shapes",
               u, unit.name, tensors.size(), end - begin);
    for (size_t k = 0; k < tensors.size(); ++k) {
      const Planned& p = plan_.tensors[begin + k];
      const HfTensor& t = tensors[k];
      ZEST_CHECK(t.name == p.engine_name && t.shape == p.shape && t.values.size() == p.numel,
                 "Hugging Face export: transform gave unit {} ('{}') tensor '{}' [{}] with {} values in the write "
                 "pass where the plan pass gave '{}' [{}]; both passes must give the same names and shapes",
                 u, unit.name, t.name, fmt::join(t.shape, ", "), t.values.size(), p.engine_name,
                 fmt::join(p.shape, ", "));
      write_tensor(p, t.values);
      done_ += p.bytes;
      progress(done_, plan_.total_bytes);
    }
  }

  HfExportReport finish() {
    // Every planned tensor was written (write_unit checks the counts), and
    // each file finished with its last.
    ZEST_INTERNAL_ASSERT(finished_.size() == plan_.files.size());
    const std::string partial = publisher_->partial_dir();
    HfExportReport report;
    for (const PlannedFile& f : plan_.files) report.files.push_back(f.name);
    if (plan_.indexed) {
      write_text((fs::path(partial) / kHfIndexFileName).string(), index_json(plan_));
      report.files.push_back(kHfIndexFileName);
    }
    write_text((fs::path(partial) / kHfConfigFileName).string(), config_);
    report.files.push_back(kHfConfigFileName);
    if (plan_.adapter_file) {
      write_text((fs::path(partial) / kHfAdapterConfigFileName).string(), options_.adapter_config_json);
      report.files.push_back(kHfAdapterConfigFileName);
    }
    report.dir = publisher_->publish();
    report.tensor_bytes = plan_.total_bytes;
    std::sort(report.files.begin(), report.files.end());
    return report;
  }

 private:
  void open(size_t f) {
    std::vector<SafetensorsEntry> entries;
    for (const size_t i : plan_.files[f].tensors) {
      entries.push_back({plan_.tensors[i].name, std::string(safetensors_dtype_name(options_.dtype)),
                         plan_.tensors[i].shape});
    }
    writers_[f] = std::make_unique<SafetensorsWriter>(
        (fs::path(publisher_->partial_dir()) / plan_.files[f].name).string(), std::move(entries),
        std::map<std::string, std::string>{{"format", "pt"}});
  }

  void write_tensor(const Planned& p, const std::vector<float>& values) {
    if (!writers_[p.file]) open(p.file);
    SafetensorsWriter& w = *writers_[p.file];
    w.begin_tensor(p.name);
    for (size_t b = 0; b < values.size(); b += kWritePieceElems) {
      const size_t n = std::min(kWritePieceElems, values.size() - b);
      w.write(encode_weights(std::span(values).subspan(b, n), options_.dtype));
    }
    // The file's last tensor: finished now, so at most two files are open.
    if (&plan_.tensors[plan_.files[p.file].tensors.back()] == &p) {
      w.finish();
      writers_[p.file].reset();
      finished_.insert(p.file);
    }
  }

  const HfExportOptions& options_;
  Plan plan_;
  std::string config_;
  std::unique_ptr<CheckpointPublisher> publisher_;
  std::vector<std::unique_ptr<SafetensorsWriter>> writers_;
  std::set<size_t> finished_;
  uint64_t done_ = 0;
};

}  // namespace

HfExportReport export_hf(Engine& engine, const std::string& dir, const HfExportOptions& options) {
  WholeModel whole(engine);  // on a mesh, the tp x pp ranks' parts joined
  const ModelLayout& layout = whole.layout();
  detail::HfProgress progress(fmt::format("export to '{}'", dir), options.progress, whole.writer());
  std::unique_ptr<ExportWriter> writer;
  std::vector<int> order;
  whole.on_every_rank("planning the Hugging Face export", [&] {
    ZEST_CHECK(is_floating(options.dtype), "a Hugging Face export is written in bf16, fp16 or fp32, not {}",
               dtype_name(options.dtype));
    ZEST_CHECK(options.max_shard_size > 0, "HfExportOptions::max_shard_size is 0; give the most bytes of tensor "
               "data a shard may hold");
    order = unit_order(layout, options);
    if (whole.writer()) writer = std::make_unique<ExportWriter>(dir, layout, options);
  });
  for (const int u : order) {
    const std::vector<float> master = whole.unit(u);  // collective: one unit at a time
    whole.on_every_rank("writing the Hugging Face export", [&] {
      if (writer) writer->write_unit(u, layout.unit(u), master, progress);
    });
    trim_heap();  // the unit's copies go before the next unit's come
  }
  HfExportReport report;
  whole.on_every_rank("publishing the Hugging Face export", [&] {
    if (writer) report = writer->finish();
  });
  if (writer) progress.finish(report.tensor_bytes);
  report.seconds = progress.seconds();
  return report;
}

}  // namespace zest
