#include "zest/hf/hf_import.h"

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/checkpoint/on_every_rank.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/hf/hf_progress.h"

namespace zest {
namespace {

bool importable_dtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16" || dtype == "F64";
}

// engine name -> checkpoint name of every registered parameter the
// checkpoint has; every mismatch between the two goes to `problems`.
std::map<std::string, std::string> match(const ModelLayout& layout, const HfCheckpoint& ckpt,
                                         const HfImportOptions& options, std::vector<std::string>& problems) {
  std::map<std::string, std::string> source;
  for (const std::string& name : ckpt.names()) {
    const std::string e = options.names.engine_name(name);
    if (!layout.contains(e)) {
      if (!options.ignore_extra) {
        problems.push_back(fmt::format("extra: tensor '{}'{} is not a registered parameter (set ignore_extra to "
                                       "skip such tensors)",
                                       name, e == name ? "" : fmt::format(" (mapped to '{}')", e)));
      }
      continue;
    }
    // Export maps back: a map that does not is refused here already.
    if (const std::string back = options.names.checkpoint_name(e); back != name) {
      problems.push_back(fmt::format("the name map takes tensor '{}' to '{}', which maps back to '{}'; give it a "
                                     "table entry",
                                     name, e, back));
      continue;
    }
    if (const auto [it, fresh] = source.emplace(e, name); !fresh) {
      problems.push_back(fmt::format("tensors '{}' and '{}' both map to parameter '{}'", it->second, name, e));
    }
  }
  for (const UnitLayout& u : layout.units()) {
    for (const ParamLayout& p : u.params) {
      const auto it = source.find(p.name);
      if (it == source.end()) {
        if (!options.allow_missing || !options.allow_missing(p.name)) {
          problems.push_back(fmt::format("missing: parameter '{}' (unit '{}', shape [{}]) has no tensor '{}' in the "
                                         "checkpoint",
                                         p.name, u.name, fmt::join(p.shape, ", "),
                                         options.names.checkpoint_name(p.name)));
        }
        continue;
      }
      const SafetensorsTensor& t = ckpt.tensor(it->second);
      if (t.shape != p.shape) {
        problems.push_back(fmt::format("shape: tensor '{}' is [{}] in '{}'; parameter '{}' is registered as [{}]",
                                       t.name, fmt::join(t.shape, ", "), ckpt.file_of(t.name).path(), p.name,
                                       fmt::join(p.shape, ", ")));
      } else if (!importable_dtype(t.dtype)) {
        problems.push_back(fmt::format("dtype: tensor '{}' is {} in '{}'; only F32, BF16, F16 and F64 convert to "
                                       "fp32 master weights",
                                       t.name, t.dtype, ckpt.file_of(t.name).path()));
      }
    }
  }
  return source;
}

}  // namespace

HfImportReport import_hf(Engine& engine, const std::string& dir, const HfImportOptions& options) {
  refuse_model_parallel(engine.model_parallel(), "import_hf");
  const ModelLayout& layout = engine.layout();
  detail::HfProgress progress(fmt::format("import of '{}'", dir), options.progress, engine.comm().rank() == 0);
  std::optional<HfCheckpoint> ckpt;
  std::map<std::string, std::string> source;
  // Every rank sees the same headers and so the same problems: each throws
  // the whole list.
  on_every_rank(engine, "opening the Hugging Face checkpoint", [&] {
    ckpt.emplace(HfCheckpoint::open(dir));
    std::vector<std::string> problems;
    source = match(layout, *ckpt, options, problems);
    if (!problems.empty()) {
      detail::fail_with_problems(fmt::format("Hugging Face checkpoint '{}' does not fit the model", dir), problems,
                                 "Fix the checkpoint, or map its names (HfImportOptions::names), allow parameters "
                                 "to be missing (allow_missing) or ignore extra tensors (ignore_extra).");
    }
  });
  // Each unit's shard becomes master weights as soon as it is read, so the
  // rank holds two units' shards besides the engine's own memory; the
  // parameters follow once every rank is done.
  uint64_t total = 0;
  const NonFiniteValues non_finite = load_weights_on_every_rank(
      engine, "reading the Hugging Face checkpoint",
      [&](const ParamLayout& p) {
        const auto it = source.find(p.name);
        if (it == source.end()) return OwnedWeightSource{};
        return OwnedWeightSource{&ckpt->file_of(it->second), it->second};
      },
      [&](uint64_t done, uint64_t all) {
        total = all;
        progress(done, all);
      },
      options.read_threads, options.map_files);
  progress.finish(total);
  const double read_seconds = progress.seconds();
  finish_loaded_weights(engine);

  // Non-finite values, found by whichever rank owns them: the first element
  // of each parameter, the lowest over ranks, so every rank lists the same.
  std::vector<std::string> problems;
  for (const auto& [param, first] : agree_non_finite(engine, non_finite)) {
    const std::string& name = source.at(param);
    problems.push_back(fmt::format("non-finite: tensor '{}' in '{}' holds a NaN or Inf (element {} is one)", name,
                                   ckpt->file_of(name).path(), first));
  }
  if (!problems.empty()) {
    detail::fail_with_problems(fmt::format("Hugging Face checkpoint '{}' holds values that cannot be weights", dir),
                               problems,
                               "Each rank's shards of the units holding them kept their previous weights (a "
                               "frozen unit read in place was zeroed), the others were loaded: fix the "
                               "checkpoint and import again.");
  }
  HfImportReport report;
  report.bytes_read = ckpt->bytes_read();
  report.tensor_bytes = ckpt->tensor_bytes();
  report.tensors_loaded = static_cast<int>(source.size());
  report.read_seconds = read_seconds;
  report.seconds = progress.seconds();
  return report;
}

}  // namespace zest
