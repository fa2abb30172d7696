#include "zest/hf/hf_import.h"

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/checkpoint/detail/on_every_rank.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/comm/gather_scalars.h"
#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/hf/detail/hf_progress.h"
#include "zest/memory/raw_allocator.h"

namespace zest {
namespace {

bool importable_dtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16" || dtype == "F64";
}

// The shape of parameter p's tensor in the checkpoint: the whole
// parameter's, where this rank holds a tensor-parallel slice of it.
std::vector<int64_t> whole_shape(const ParamLayout& p, const ModelParallel& mp) {
  std::vector<int64_t> shape = p.shape;
  if (p.tp_split && mp.tp_size > 1) shape.at(static_cast<size_t>(p.tp_split->dim)) *= mp.tp_size;
  return shape;
}

// engine name -> checkpoint name of every registered parameter the
// checkpoint has; every mismatch between the two goes to `problems`, except
// tensors no parameter takes: `registered` marks, in ckpt.names()'s order,
// those this rank registers, and extra_problems() decides the others (on a
// mesh a tensor this rank does not register may be another stage's).
std::map<std::string, std::string> match(const ModelLayout& layout, const HfCheckpoint& ckpt,
                                         const HfImportOptions& options, const ModelParallel& mp,
                                         std::vector<std::string>& problems, std::vector<bool>& registered) {
  std::map<std::string, std::string> source;
  registered.assign(ckpt.names().size(), false);
  size_t index = 0;
  for (const std::string& name : ckpt.names()) {
    const std::string e = options.names.engine_name(name);
    const bool here = layout.contains(e);
    registered[index++] = here;
    if (!here) continue;
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
      if (const std::vector<int64_t> want = whole_shape(p, mp); t.shape != want) {
        problems.push_back(fmt::format("shape: tensor '{}' is [{}] in '{}'; parameter '{}' is registered as [{}]{}",
                                       t.name, fmt::join(t.shape, ", "), ckpt.file_of(t.name).path(), p.name,
                                       fmt::join(p.shape, ", "),
                                       want == p.shape ? std::string()
                                                       : fmt::format(", tp rank {}'s slice of [{}]", mp.tp_rank,
                                                                     fmt::join(want, ", "))));
      } else if (!importable_dtype(t.dtype)) {
        problems.push_back(fmt::format("dtype: tensor '{}' is {} in '{}'; only F32, BF16, F16 and F64 convert to "
                                       "fp32 master weights",
                                       t.name, t.dtype, ckpt.file_of(t.name).path()));
      }
    }
  }
  return source;
}

// Every rank of the model-parallel group's words, in group order.
std::vector<int64_t> gather_over(Communicator& group, std::span<const int64_t> mine) {
  CachingAllocator alloc(group.device().is_cuda() ? make_cuda_allocator(group.device().index())
                                                  : make_host_allocator());
  return all_gather_int64(group, alloc, Stream::default_for(group.device()), mine);
}

// An "extra" problem for each of the checkpoint's tensors that no rank of
// the model-parallel group registers (`registered`: this rank's, as match()
// marks them), the same list on every rank. Collective over the group on a
// mesh; alone on one rank.
void extra_problems(const HfCheckpoint& ckpt, const HfImportOptions& options, const ModelParallel& mp,
                    const std::vector<bool>& registered, std::vector<std::string>& problems) {
  const std::vector<std::string> names = ckpt.names();
  const size_t words = (registered.size() + 63) / 64;
  std::vector<int64_t> mine(words, 0);
  for (size_t i = 0; i < registered.size(); ++i) {
    if (registered[i]) mine[i / 64] |= int64_t{1} << (i % 64);
  }
  const std::vector<int64_t> all = mp.size() == 1 ? mine : gather_over(*mp.group, mine);
  for (size_t i = 0; i < registered.size(); ++i) {
    bool anywhere = false;
    for (size_t r = 0; r < all.size() / std::max<size_t>(words, 1); ++r) {
      anywhere = anywhere || ((all[r * words + i / 64] >> (i % 64)) & 1) != 0;
    }
    if (anywhere) continue;
    const std::string e = options.names.engine_name(names[i]);
    problems.push_back(fmt::format("extra: tensor '{}'{} is not a registered parameter{} (set ignore_extra to "
                                   "skip such tensors)",
                                   names[i], e == names[i] ? "" : fmt::format(" (mapped to '{}')", e),
                                   mp.size() == 1 ? "" : " of any rank of the mesh's tp x pp"));
  }
}

// Note [adapters beside the checkpoint]: engine name -> adapter tensor of
// every tensor of `file`, added to `source`; mismatches go to `problems`.
std::map<std::string, std::string> match_adapters(const ModelLayout& layout, const SafetensorsFile& file,
                                                  const HfImportOptions& options, const ModelParallel& mp,
                                                  std::vector<std::string>& problems) {
  std::map<std::string, std::string> adapters;
  if (mp.size() > 1) {
    problems.push_back(fmt::format("'{}' holds PEFT adapters, which are not yet read on a device mesh: set "
                                   "HfImportOptions::ignore_adapters and load them on one rank first",
                                   file.path()));
    return adapters;
  }
  for (const SafetensorsTensor& t : file.tensors()) {
    if (!t.name.starts_with(kPeftNamePrefix)) {
      problems.push_back(fmt::format("adapter tensor '{}' in '{}' lacks PEFT's prefix '{}'", t.name, file.path(),
                                     kPeftNamePrefix));
      continue;
    }
    const std::string e = options.names.engine_name(t.name.substr(kPeftNamePrefix.size()));
    if (!layout.contains(e)) {
      problems.push_back(fmt::format("adapter tensor '{}' in '{}' is no parameter of the model (it has no '{}'): "
                                     "enable LoRA as the directory's adapter_config.json describes it, or set "
                                     "HfImportOptions::ignore_adapters",
                                     t.name, file.path(), e));
      continue;
    }
    const ParamLayout& p = layout.param(layout.find(e));
    if (t.shape != p.shape) {
      problems.push_back(fmt::format("adapter tensor '{}' in '{}' has shape [{}], parameter '{}' [{}]: another "
                                     "rank r or target",
                                     t.name, file.path(), fmt::join(t.shape, ", "), e, fmt::join(p.shape, ", ")));
      continue;
    }
    if (!importable_dtype(t.dtype)) {
      problems.push_back(fmt::format("adapter tensor '{}' in '{}' is {}: F32, F16, BF16 or F64 are read", t.name,
                                     file.path(), t.dtype));
      continue;
    }
    adapters.emplace(e, t.name);
  }
  return adapters;
}

}  // namespace

// Note [ranks read one checkpoint]
// Ranks on several hosts read a directory each host sees under the same
// path, which may be node-local copies: copies that differ (another
// fine-tune, one being replaced while the job starts) would give each rank
// its shards of a different model, a mix of both that trains without a
// word. So once every rank has opened the files, the ranks compare their
// fingerprints (HfCheckpoint::fingerprint: the headers and sampled bytes)
// over the data-parallel group and the model-parallel group, and a
// difference stops every rank alike, naming the ranks that differ.
void agree_on_files(Engine& engine, uint32_t fingerprint, const std::string& dir) {
  const int64_t mine[1] = {static_cast<int64_t>(fingerprint)};
  const auto check = [&](const std::vector<int64_t>& all, const char* group) {
    for (size_t r = 1; r < all.size(); ++r) {
      ZEST_CHECK(all[r] == all[0],
                 "ranks read different copies of Hugging Face checkpoint '{}': rank {} of the {} group sees files "
                 "of fingerprint {:08x}, rank 0 of it {:08x} (their headers or bytes differ: node-local copies "
                 "that are not the same, or a copy replaced while the job started). Give every rank the same files",
                 dir, r, group, static_cast<uint32_t>(all[r]), static_cast<uint32_t>(all[0]));
    }
  };
  check(engine.all_gather_scalars(mine), "data-parallel");
  const ModelParallel& mp = engine.model_parallel();
  if (mp.size() > 1) check(gather_over(*mp.group, mine), "model-parallel");
}

HfImportReport import_hf(Engine& engine, const std::string& dir, const HfImportOptions& options) {
  const ModelLayout& layout = engine.layout();
  const ModelParallel& mp = engine.model_parallel();
  detail::HfProgress progress(fmt::format("import of '{}'", dir), options.progress, engine.comm().rank() == 0);
  std::optional<HfCheckpoint> ckpt;
  std::map<std::string, std::string> source;
  std::vector<bool> registered;
  const std::string misfit = fmt::format("Hugging Face checkpoint '{}' does not fit the model", dir);
  const char* fixes =
      "Fix the checkpoint, or map its names (HfImportOptions::names), allow parameters to be missing "
      "(allow_missing) or ignore extra tensors (ignore_extra).";
  // Every rank sees the same headers and so the same problems: each throws
  // the whole list.
  std::optional<SafetensorsFile> adapter_file;
  std::map<std::string, std::string> adapters;  // engine name -> tensor of adapter_file
  const std::string adapter_path = (std::filesystem::path(dir) / kHfAdapterWeightsFileName).string();
  // The parameters the adapter file gives are not missing from the shards.
  HfImportOptions effective = options;
  effective.allow_missing = [&](const std::string& name) {
    return adapters.count(name) != 0 || (options.allow_missing && options.allow_missing(name));
  };
  uint32_t fingerprint = 0;
  const auto open = [&] {
    std::vector<std::string> problems;
    if (!options.ignore_adapters && std::filesystem::exists(adapter_path)) {
      adapter_file.emplace(SafetensorsFile::open(adapter_path));
      adapters = match_adapters(layout, *adapter_file, options, mp, problems);
    }
    ckpt.emplace(HfCheckpoint::open(dir));
    fingerprint = ckpt->fingerprint();
    source = match(layout, *ckpt, effective, mp, problems, registered);
    // One rank decides alone what is extra, listed with the rest; a mesh
    // decides once every rank's match is agreed (below).
    if (mp.size() == 1 && !options.ignore_extra) extra_problems(*ckpt, options, mp, registered, problems);
    if (!problems.empty()) detail::fail_with_problems(misfit, problems, fixes);
  };
  const char* opening = "opening the Hugging Face checkpoint";
  if (mp.size() == 1) {
    on_every_rank(engine, opening, open);
  } else {
    // Agreed over the data-parallel group, then over the model-parallel
    // group (each rank holds a tp slice of some stage's parameters), so
    // that a problem at any coordinate of the mesh stops every rank before
    // the extra tensors are counted over the group.
    agree_on_outcome([&](std::span<const int64_t> mine) { return gather_over(*mp.group, mine); },
                     [&](int m) { return fmt::format("at tp rank {}, pp rank {}", m % mp.tp_size, m / mp.tp_size); },
                     opening, [&] { on_every_rank(engine, opening, open); });
    if (!options.ignore_extra) {
      std::vector<std::string> problems;
      extra_problems(*ckpt, options, mp, registered, problems);
      if (!problems.empty()) detail::fail_with_problems(misfit, problems, fixes);
    }
  }
  // Every rank opened the files: they must be the same files (Note [ranks
  // read one checkpoint]).
  agree_on_files(engine, fingerprint, dir);
  // Each unit's shard becomes master weights as soon as it is read, so the
  // rank holds two units' shards besides the engine's own memory; the
  // parameters follow once every rank is done.
  uint64_t total = 0;
  const NonFiniteValues non_finite = load_weights_on_every_rank(
      engine, "reading the Hugging Face checkpoint",
      [&](const ParamLayout& p) {
        if (const auto a = adapters.find(p.name); a != adapters.end()) return OwnedWeightSource{&*adapter_file, a->second};
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
    if (const auto a = adapters.find(param); a != adapters.end()) {
      problems.push_back(fmt::format("non-finite: adapter tensor '{}' in '{}' holds a NaN or Inf (element {} is one)",
                                     a->second, adapter_file->path(), first));
      continue;
    }
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
  report.tensors_loaded = static_cast<int>(source.size() + adapters.size());
  report.adapters_loaded = static_cast<int>(adapters.size());
  report.read_seconds = read_seconds;
  report.seconds = progress.seconds();
  return report;
}

}  // namespace zest
