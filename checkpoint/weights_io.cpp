#include "zest/checkpoint/weights_io.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/checkpoint/on_every_rank.h"
#include "zest/checkpoint/safetensors.h"
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
  const ModelLayout& layout = engine.layout();
  const bool writer_rank = engine.comm().rank() == 0;
  std::unique_ptr<SafetensorsWriter> writer;
  on_every_rank(engine, "opening the weights file", [&] {
    check_export_dtype(options.dtype);
    if (writer_rank) {
      writer = std::make_unique<SafetensorsWriter>(
          path, weights_entries(layout, options.dtype), std::map<std::string, std::string>{{"format", "pt"}},
          options.progress ? SafetensorsProgress(options.progress) : log_every_tenth(path));
    }
  });
  for (int u = 0; u < layout.num_units(); ++u) {
    const std::vector<float> unit = engine.unit_master(u);  // collective: one unit at a time
    on_every_rank(engine, "writing the weights file", [&] {
      if (!writer_rank) return;
      for (const ParamLayout& p : layout.unit(u).params) {
        writer->write_tensor(p.name, encode_weights(std::span(unit).subspan(p.offset, p.numel), options.dtype));
      }
    });
  }
  on_every_rank(engine, "finishing the weights file", [&] {
    if (writer_rank) writer->finish();
  });
}

void import_weights(Engine& engine, const std::string& path, const WeightsImportOptions& options) {
  const ModelLayout& layout = engine.layout();
  std::optional<SafetensorsFile> file;
  on_every_rank(engine, "checking the weights file", [&] {
    file.emplace(SafetensorsFile::open(path));
    for (const UnitLayout& u : layout.units()) {
      for (const ParamLayout& p : u.params) {
        const SafetensorsTensor* t = file->find(p.name);
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
  OwnedWeights owned;
  on_every_rank(engine, "importing weights", [&] {
    owned = read_owned_weights(engine, [&](const ParamLayout& p) { return OwnedWeightSource{&*file, p.name}; });
    if (!owned.non_finite.empty()) {
      const auto& [name, element] = owned.non_finite.front();
      ZEST_FAIL("'{}': tensor '{}': element {} is not finite (NaN or Inf); fix the file", path, name, element);
    }
  });
  start_from_weights(engine, owned.masters);
}

OwnedWeights read_owned_weights(Engine& engine, const std::function<OwnedWeightSource(const ParamLayout&)>& source,
                                const std::function<void(uint64_t, uint64_t)>& progress) {
  const ModelLayout& layout = engine.layout();
  const auto part = static_cast<size_t>(engine.partition());
  // Each parameter's elements inside this rank's shard of its unit.
  struct Piece {
    int unit;
    const ParamLayout* param;
    OwnedWeightSource from;
    size_t begin, end;  // in the unit's flat buffer
  };
  std::vector<Piece> pieces;
  uint64_t total = 0;
  OwnedWeights out;
  out.masters.resize(static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& U = layout.unit(u);
    const size_t begin = U.shard * part;
    bool keeps_some = false;
    for (const ParamLayout& p : U.params) {
      const size_t b = std::max(begin, p.offset);
      const size_t e = std::min(begin + U.shard, p.offset + p.numel);
      if (b >= e) continue;
      OwnedWeightSource from = source(p);
      if (from.file == nullptr) {
        keeps_some = true;
        continue;
      }
      total += (e - b) * from.file->tensor(from.tensor).elem_size;
      pieces.push_back({u, &p, std::move(from), b, e});
    }
    // The values of parameters without a source (and zeros in the padding).
    out.masters[static_cast<size_t>(u)] = keeps_some ? engine.read_shard(u, 0) : std::vector<float>(U.shard, 0.0f);
  }
  // Bounded pieces, so that progress moves through a large tensor.
  constexpr size_t kPieceElems = size_t{1} << 22;
  uint64_t done = 0;
  for (const Piece& piece : pieces) {
    const size_t shard_begin = layout.unit(piece.unit).shard * part;
    float* shard = out.masters[static_cast<size_t>(piece.unit)].data();
    const size_t elem = piece.from.file->tensor(piece.from.tensor).elem_size;
    bool reported = false;
    for (size_t b = piece.begin; b < piece.end; b += kPieceElems) {
      const std::span<float> values(shard + (b - shard_begin), std::min(kPieceElems, piece.end - b));
      piece.from.file->read_range_as(piece.from.tensor, DType::kFloat32, b - piece.param->offset,
                                     std::as_writable_bytes(values));
      // fp32, fp16 and bf16 convert exactly (F64 beyond fp32 becomes Inf),
      // so a non-finite value read is one in the file.
      const auto bad = std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
      if (bad != values.end() && !reported) {
        out.non_finite.emplace_back(piece.param->name, b - piece.param->offset + static_cast<size_t>(bad - values.begin()));
        reported = true;
      }
      done += values.size() * elem;
      if (progress) progress(done, total);
    }
  }
  return out;
}

void start_from_weights(Engine& engine, const std::vector<std::vector<float>>& masters) {
  const ModelLayout& layout = engine.layout();
  ZEST_INTERNAL_ASSERT(masters.size() == static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    const std::vector<float> zeros(layout.unit(u).shard, 0.0f);
    engine.write_shard(u, 0, masters[static_cast<size_t>(u)]);
    if (layout.unit(u).frozen) continue;  // no optimizer state
    for (int b = 1; b < engine.shard_buffers(); ++b) engine.write_shard(u, b, zeros);
  }
  // The loss scaler and a set_lr() value stay this engine's.
  Engine::Progress fresh = engine.progress();
  fresh.applied_steps = 0;
  fresh.skipped_steps = 0;
  engine.restore(fresh);
}

}  // namespace zest
