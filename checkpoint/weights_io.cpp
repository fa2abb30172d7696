#include "zest/checkpoint/weights_io.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <bit>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/checkpoint/detail/on_every_rank.h"
#include "zest/checkpoint/detail/owned_pieces.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/checkpoint/whole_model.h"
#include "zest/optim/grad_ops.h"

namespace zest {
namespace {

// The default progress of an export: a log line at each tenth of a file of
// 1 GiB or more, so a long export is not mistaken for a hang.
SafetensorsProgress log_every_tenth(const std::string& path) {
  return [path, next = uint64_t{0}](uint64_t done, uint64_t total) mutable {
    if (total < (uint64_t{1} << 30) || done < next) return;
    ZEST_LOG_INFO("export {}: {}%", path, done * 100 / total);
    next = done + total / 10;
  };
}

// export_weights calls it on every rank before anything is written, so every
// rank refuses a bad dtype alike.
void check_export_dtype(DType dtype) {
  ZEST_CHECK(is_floating(dtype), "weights can be exported as fp32, bf16 or fp16, not {}", dtype_name(dtype));
}

}  // namespace

std::vector<SafetensorsEntry> weights_entries(const ModelLayout& layout, DType dtype) {
  std::vector<SafetensorsEntry> out;
  for (const UnitLayout& u : layout.units())
    for (const ParamLayout& p : u.params)
      out.push_back({p.name, std::string(safetensors_dtype_name(dtype)), p.shape});
  return out;
}

std::vector<std::byte> encode_weights(std::span<const float> values, DType dtype) {
  check_export_dtype(dtype);
  std::vector<std::byte> out(values.size() * elem_size(dtype));
  convert(Stream::default_for(Device::host()), values.data(), DType::kFloat32, out.data(), dtype, values.size());
  return out;
}

void export_weights(Engine& engine, const std::string& path, const WeightsExportOptions& options) {
  WholeModel whole(engine);  // on a mesh, the tp x pp ranks' parts joined
  const ModelLayout& layout = whole.layout();
  std::unique_ptr<SafetensorsWriter> writer;
  whole.on_every_rank("opening the weights file", [&] {
    check_export_dtype(options.dtype);
    if (whole.writer()) {
      writer = std::make_unique<SafetensorsWriter>(
          path, weights_entries(layout, options.dtype), std::map<std::string, std::string>{{"format", "pt"}},
          options.progress ? SafetensorsProgress(options.progress) : log_every_tenth(path));
    }
  });
  for (int u = 0; u < layout.num_units(); ++u) {
    const std::vector<float> unit = whole.unit(u);  // collective: one unit at a time
    whole.on_every_rank("writing the weights file", [&] {
      if (!writer) return;
      for (const ParamLayout& p : layout.unit(u).params) {
        writer->write_tensor(p.name, encode_weights(std::span(unit).subspan(p.offset, p.numel), options.dtype));
      }
    });
  }
  whole.on_every_rank("finishing the weights file", [&] {
    if (writer) writer->finish();
  });
}

void import_weights(Engine& engine, const std::string& path, const WeightsImportOptions& options) {
  refuse_model_parallel(engine.model_parallel(), "import_weights");
  const ModelLayout& layout = engine.layout();
  std::optional<SafetensorsFile> file;
  on_every_rank(engine, "checking the weights file", [&] {
    file.emplace(SafetensorsFile::open(path));
    for (const UnitLayout& u : layout.units()) {
      for (const ParamLayout& p : u.params) {
        const SafetensorsTensor* t = file->find(p.name);
        if (t == nullptr && options.keep_missing && options.keep_missing(p.name)) continue;
        ZEST_CHECK(t != nullptr, "'{}' has no tensor '{}' (registered in unit '{}' with shape [{}])", path, p.name,
                   u.name, fmt::join(p.shape, ", "));
        ZEST_CHECK(t->shape == p.shape, "'{}': tensor '{}' has shape [{}], the model registers [{}]", path, p.name,
                   fmt::join(t->shape, ", "), fmt::join(p.shape, ", "));
        ZEST_CHECK(t->dtype == "F32" || (options.convert_dtypes && (t->dtype == "F16" || t->dtype == "BF16" ||
                                                                    t->dtype == "F64")),
                   "'{}': tensor '{}' is {}; {}", path, p.name, t->dtype,
                   options.convert_dtypes ? "only floating tensors (F64, F32, F16, BF16) can be imported"
                                          : "convert_dtypes is off, so it must be F32");
      }
    }
    if (!options.ignore_unknown) {
      for (const SafetensorsTensor& t : file->tensors()) {
        ZEST_CHECK(layout.contains(t.name),
                   "'{}' has a tensor '{}' that the model does not register (set ignore_unknown to skip it)", path,
                   t.name);
      }
    }
  });
  // One pass from the file into the shards (load_owned_weights); the
  // parameters follow once every rank is done (collective, reached on every
  // path so the engine stays consistent).
  const NonFiniteValues mine = load_weights_on_every_rank(
      engine, "importing weights",
      [&](const ParamLayout& p) {
        return file->find(p.name) != nullptr ? OwnedWeightSource{&*file, p.name} : OwnedWeightSource{};
      },
      {}, kDefaultReadThreads);
  finish_loaded_weights(engine);
  const NonFiniteValues bad = agree_non_finite(engine, mine);
  if (!bad.empty()) {
    ZEST_FAIL("'{}': tensor '{}': element {} is not finite (NaN or Inf){}; the shards of the units holding one kept "
              "their previous values, the others were imported: fix the file and import again",
              path, bad.front().first, bad.front().second,
              bad.size() > 1 ? fmt::format(" (and {} more tensors)", bad.size() - 1) : "");
  }
}

namespace detail {

SourceMap source_map(const ParamLayout& p, int tp_rank, int tp_size) {
  if (!p.tp_split || tp_size == 1) return {};
  const auto d = static_cast<size_t>(p.tp_split->dim), stride = static_cast<size_t>(p.tp_split->stride);
  ZEST_CHECK(d < p.shape.size() && stride >= 1 && static_cast<size_t>(p.shape[d]) % stride == 0,
             "parameter '{}' of shape [{}] is split over tp along dimension {} with stride {}, which does not divide "
             "it",
             p.name, fmt::join(p.shape, ", "), d, stride);
  size_t inner = 1;
  for (size_t i = d + 1; i < p.shape.size(); ++i) inner *= static_cast<size_t>(p.shape[i]);
  const size_t local = static_cast<size_t>(p.shape[d]), block = local / stride;
  const auto tp = static_cast<size_t>(tp_size);
  SourceMap m;
  m.run = block * inner;
  m.stride = stride;
  m.outer_step = local * tp * inner;
  m.block_step = block * tp * inner;
  m.rank_offset = static_cast<size_t>(tp_rank) * block * inner;
  return m;
}

OwnedReads plan_owned_reads(Engine& engine, const std::function<OwnedWeightSource(const ParamLayout&)>& source) {
  const ModelLayout& layout = engine.layout();
  const ModelParallel& mp = engine.model_parallel();
  const auto part = static_cast<size_t>(engine.partition());
  OwnedReads out;
  out.pieces.resize(static_cast<size_t>(layout.num_units()));
  out.keeps_some.assign(out.pieces.size(), false);
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& U = layout.unit(u);
    const size_t begin = U.shard * part;
    out.largest = std::max(out.largest, U.shard);
    for (const ParamLayout& p : U.params) {
      const size_t b = std::max(begin, p.offset);
      const size_t e = std::min(begin + U.shard, p.offset + p.numel);
      if (b >= e) continue;
      OwnedWeightSource from = source(p);
      if (from.file == nullptr) {
        out.keeps_some[static_cast<size_t>(u)] = true;
        continue;
      }
      out.total += (e - b) * from.file->tensor(from.tensor).elem_size;
      out.pieces[static_cast<size_t>(u)].push_back({&p, std::move(from), b, e, source_map(p, mp.tp_rank, mp.tp_size)});
    }
  }
  return out;
}

void run_on_threads(size_t n, const std::function<void(bool reports)>& work, const std::function<void()>& stop) {
  std::vector<std::exception_ptr> errors(std::max<size_t>(n, 1));
  const auto guarded = [&](size_t t) {
    try {
      work(t == 0);
    } catch (...) {
      errors[t] = std::current_exception();
      stop();
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < n; ++t) helpers.emplace_back(guarded, t);
  guarded(0);
  for (std::thread& h : helpers) h.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

Engine::Progress restarted_progress(const Engine& engine) {
  // The loss scaler and a set_lr() value stay this engine's.
  Engine::Progress fresh = engine.progress();
  fresh.applied_steps = 0;
  fresh.skipped_steps = 0;
  return fresh;
}

}  // namespace detail

NonFiniteValues load_weights_on_every_rank(Engine& engine, const char* what,
                                           const std::function<OwnedWeightSource(const ParamLayout&)>& source,
                                           const std::function<void(uint64_t, uint64_t)>& progress, int threads,
                                           bool map_files) {
  NonFiniteValues mine;
  try {
    on_every_rank(engine, what, [&] { mine = load_owned_weights(engine, source, progress, threads, map_files); });
  } catch (...) {
    try {
      finish_start_from_weights(engine);
    } catch (const std::exception& e) {
      ZEST_LOG_ERROR("after a failed import, rebuilding the parameters failed too: {}", e.what());
    }
    throw;
  }
  return mine;
}

NonFiniteValues agree_non_finite(Engine& engine, const NonFiniteValues& mine) {
  const ModelLayout& layout = engine.layout();
  std::vector<const ParamLayout*> params;
  std::map<std::string, size_t> index;
  for (const UnitLayout& u : layout.units()) {
    for (const ParamLayout& p : u.params) {
      index.emplace(p.name, params.size());
      params.push_back(&p);
    }
  }
  std::vector<int64_t> firsts(params.size(), -1);
  for (const auto& [name, element] : mine) firsts[index.at(name)] = static_cast<int64_t>(element);
  const std::vector<int64_t> all = engine.all_gather_scalars(firsts);
  NonFiniteValues out;
  for (size_t k = 0; k < params.size(); ++k) {
    int64_t first = -1;
    for (size_t r = 0; r * params.size() < all.size(); ++r) {
      const int64_t e = all[r * params.size() + k];
      if (e >= 0 && (first < 0 || e < first)) first = e;
    }
    if (first >= 0) out.emplace_back(params[k]->name, static_cast<uint64_t>(first));
  }
  return out;
}

void start_from_weights(Engine& engine, const std::vector<std::vector<float>>& masters) {
  const ModelLayout& layout = engine.layout();
  ZEST_INTERNAL_ASSERT(masters.size() == static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) start_unit_from_weights(engine, u, masters[static_cast<size_t>(u)]);
  finish_start_from_weights(engine);
}

void start_unit_from_weights(Engine& engine, int unit, std::span<const float> master) {
  engine.write_shard(unit, 0, master);
  if (engine.layout().unit(unit).frozen) return;  // no optimizer state
  const std::vector<float> zeros(engine.layout().unit(unit).shard, 0.0f);
  for (int b = 1; b < engine.shard_buffers(); ++b) engine.write_shard(unit, b, zeros);
}

void finish_start_from_weights(Engine& engine) { engine.restore(detail::restarted_progress(engine)); }

}  // namespace zest
