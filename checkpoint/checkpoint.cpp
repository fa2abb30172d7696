#include "zest/checkpoint/checkpoint.h"

#include <algorithm>
#include <bit>
#include <filesystem>
#include <functional>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/core/check.h"
#include "zest/core/crc32.h"
#include "zest/core/logging.h"
#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/checkpoint/checkpoint_publish.h"
#include "zest/checkpoint/checkpoint_reader.h"
#include "zest/checkpoint/checkpoint_retention.h"
#include "zest/checkpoint/model_parallel_parts.h"
#include "zest/checkpoint/detail/on_every_rank.h"
#include "zest/checkpoint/optimizer_state_map.h"
#include "zest/checkpoint/user_state_files.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/core/crc32.h"
#include "zest/core/file_io.h"

namespace zest {
namespace fs = std::filesystem;
namespace {

// Registration lines (units and parameters) of a layout; group weight decay
// may change between runs (fine-tuning), the model may not.
std::string model_lines(const ModelLayout& layout) {
  std::string out;
  const std::string all = layout.describe();
  size_t start = 0;
  while (start < all.size()) {
    const size_t end = all.find('\n', start);
    std::string line = all.substr(start, end - start);
    if (line.rfind("group ", 0) != 0) out += line + "\n";
    start = end == std::string::npos ? all.size() : end + 1;
  }
  return out;
}

// A weights-only load's master values for this rank's shards, parameter by
// parameter, as DeepSpeed's load_module_only loads a state dict by name: the
// checkpoint's units, parameter groups and frozen units may differ from this
// engine's; its parameters (names and shapes) may not.
std::vector<std::vector<float>> read_weights_by_name(CheckpointReader& reader, const ModelLayout& layout, int part) {
  const ModelLayout& saved = reader.layout();
  const std::string& dir = reader.dir();
  for (const UnitLayout& u : layout.units()) {
    for (const ParamLayout& p : u.params) {
      ZEST_CHECK(saved.contains(p.name),
                 "checkpoint '{}' is of another model: it has no parameter '{}' (registered in unit '{}' with shape "
                 "[{}]). Register the same parameters to load it",
                 dir, p.name, u.name, fmt::join(p.shape, ", "));
      const ParamRef ref = saved.find(p.name);
      const std::vector<int64_t>& shape = saved.unit(ref.unit).params[static_cast<size_t>(ref.index)].shape;
      ZEST_CHECK(shape == p.shape, "checkpoint '{}' is of another model: parameter '{}' has shape [{}] there, [{}] here",
                 dir, p.name, fmt::join(shape, ", "), fmt::join(p.shape, ", "));
    }
  }
  for (const UnitLayout& u : saved.units()) {
    for (const ParamLayout& p : u.params) {
      ZEST_CHECK(layout.contains(p.name),
                 "checkpoint '{}' is of another model: it holds parameter '{}' (unit '{}'), which this model does not "
                 "register",
                 dir, p.name, u.name);
    }
  }
  std::vector<std::vector<float>> masters;
  for (const UnitLayout& U : layout.units()) {
    const size_t begin = U.shard * static_cast<size_t>(part);
    std::vector<float>& shard = masters.emplace_back(U.shard, 0.0f);
    for (const ParamLayout& p : U.params) {
      const size_t b = std::max(begin, p.offset);
      const size_t e = std::min(begin + U.shard, p.offset + p.numel);
      if (b >= e) continue;
      const ParamRef ref = saved.find(p.name);
      const size_t there = saved.unit(ref.unit).params[static_cast<size_t>(ref.index)].offset;
      reader.read(0, ref.unit, there + (b - p.offset), std::span(shard).subspan(b - begin, e - b));
    }
  }
  return masters;
}

// Note [the fingerprint of a frozen unit]
// A checkpoint saved without its frozen units' values names the base they
// held by a fingerprint: the sum, modulo 2^64, of a 64-bit mix of each
// element's index in the unit and its value's bits. A sum does not care in
// which order or in which shards the elements are visited, so every rank
// adds its own shard's real elements (not the padding), and the ranks'
// sums added are the unit's at any world size, stage or MiCS group (only
// the ranks of the first group, which own the partitions, add theirs). Any
// changed element changes it but with odds of 2^-64; it is an identity
// check against loading onto another base, not a defence against forgery.
uint64_t element_mix(uint64_t index, float value) {
  uint64_t x = index * 0x9E3779B97F4A7C15ull + std::bit_cast<uint32_t>(value);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finalizer
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Every unit's fingerprint (0 for a trainable one). Collective.
std::vector<uint64_t> frozen_fingerprints(Engine& engine) {
  const ModelLayout& layout = engine.layout();
  const bool owner = engine.comm().rank() < layout.partitions();
  std::vector<int64_t> mine(static_cast<size_t>(layout.num_units()), 0);
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& U = layout.unit(u);
    if (!U.frozen || !owner) continue;
    const std::vector<float> values = engine.read_shard(u, 0);
    const size_t first = U.shard * static_cast<size_t>(engine.partition());
    uint64_t sum = 0;
    for (size_t i = 0; i < values.size() && first + i < U.numel; ++i) sum += element_mix(first + i, values[i]);
    mine[static_cast<size_t>(u)] = static_cast<int64_t>(sum);
  }
  const std::vector<int64_t> all = engine.all_gather_scalars(mine);
  std::vector<uint64_t> out(mine.size(), 0);
  for (size_t i = 0; i < all.size(); ++i) out[i % mine.size()] += static_cast<uint64_t>(all[i]);
  return out;
}

// Note [a diverged run is not saved]
// A load refuses a NaN or Inf (checkpoint_value_ok) as corruption, so saving
// a run whose master weights or optimizer state diverged would publish a
// checkpoint that nothing can load, and move `latest` off the last one that
// can. The save refuses instead, inside the collective step that writes the
// shards: every rank learns of any rank's bad value there (on_every_rank),
// so all fail together before anything is published, and the partial
// directory goes with the publisher. fp16 runs skip the steps whose
// gradients overflow, so their values stay finite and they save as usual.
void check_savable(const UnitLayout& unit, int buffer, int partition, std::span<const float> values,
                   const std::string& root, const std::string& tag) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (checkpoint_value_ok(buffer, values[i])) continue;
    ZEST_FAIL("save_checkpoint('{}'): the {} of unit '{}' hold {} at {} (shard element {}): the training has "
              "diverged (a learning rate too high?). Checkpoint '{}' was not saved and `latest` was not moved, "
              "so the last checkpoint saved stays the one to resume from",
              root, shard_buffer_name(buffer), unit.name, values[i],
              element_name(unit, unit.shard * static_cast<size_t>(partition) + i), i, tag);
  }
}

}  // namespace

std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

void write_manifest(const std::string& dir, const CheckpointManifest& manifest) {
  AtomicFile file((fs::path(dir) / kManifestFileName).string());
  file.write(manifest_to_json(manifest));
  file.commit();
}

namespace {

// The checkpoint of one data-parallel group: the whole model's, or with
// tensor or pipeline parallelism one part's (model_parallel_parts.h), which
// runs `before_publish` on every rank once the files are written.
std::string save_part(Engine& engine, const std::string& root, const CheckpointOptions& options,
                      const std::function<void()>& before_publish) {
  const Engine::Progress progress = engine.progress();
  const std::string tag = options.tag.empty() ? fmt::format("step_{:06d}", progress.applied_steps) : options.tag;
  check_tag(tag);
  ZEST_CHECK(options.keep_last >= 0, "save_checkpoint('{}'): keep_last {}: 0 keeps every checkpoint, N > 0 the last N",
             root, options.keep_last);
  const ModelLayout& layout = engine.layout();
  const int rank = engine.comm().rank();
  const int world = engine.comm().size();
  const bool rank0 = rank == 0;
  ZEST_CHECK(engine.micro_steps_pending() == 0,
             "save_checkpoint('{}') after {} of the {} micro-steps of a gradient accumulation: the partial "
             "gradients are not saved, so save at an accumulation boundary (after the step() that applies the "
             "optimizer step)",
             root, engine.micro_steps_pending(), engine.config().accumulation_steps());
  const fs::path dir = fs::path(root) / tag;
  // Without a callback, large saves (the shards at 1 GiB or more) log their
  // progress, so a long save is not mistaken for a hang.
  const bool large = static_cast<uint64_t>(engine.shard_buffers()) * layout.owned() * sizeof(float) >= (uint64_t{1} << 30);
  const auto say = [&](const std::string& line) {
    if (!rank0) return;
    if (options.progress) {
      options.progress(line);
    } else if (large) {
      ZEST_LOG_INFO("{}", line);
    }
  };

  // The program's state, serialized on every rank: the global set too, so
  // that every rank can check it is the same everywhere.
  const UserState* user = options.user_state;
  std::string user_global, user_mine;
  // Rank 0 locks the root and makes the partial directory, whose unique name
  // the others learn from its nonce.
  std::optional<CheckpointPublisher> publisher;
  on_every_rank(engine, "preparing the checkpoint directory", [&] {
    if (user != nullptr) {
      user_global = detail::serialize_user_blobs(user->global, "user state 'global'");
      user_mine = detail::serialize_user_blobs(user->per_rank, fmt::format("user state 'per_rank' of rank {}", rank));
    }
    if (rank0) publisher.emplace(root, tag);
  });
  const int64_t nonce[1] = {rank0 ? static_cast<int64_t>(publisher->nonce()) : 0};
  const fs::path partial =
      partial_checkpoint_dir(root, tag, static_cast<uint64_t>(engine.all_gather_scalars(nonce)[0]));

  // What the files hold: the frozen units' values, or their fingerprints.
  CheckpointManifest stored;
  stored.shard_buffers = engine.shard_buffers();
  if (options.exclude_frozen_parameters) {
    stored.frozen_excluded = true;
    stored.frozen_fingerprints = frozen_fingerprints(engine);
  }

  // Every rank that owns a shard writes it: the master weights of every unit
  // in order, then each optimizer state buffer the same way. With MiCS the
  // first group's ranks, 0 to partitions - 1, whose partition is their rank;
  // the other groups hold replicas of the same shards.
  int64_t bytes = 0, crc = 0, user_bytes = 0, user_crc = 0;
  const bool writes = rank < layout.partitions();
  ZEST_INTERNAL_ASSERT(!writes || engine.partition() == rank, "rank {} writes shard file {} but owns partition {}",
                       rank, rank, engine.partition());
  on_every_rank(engine, "writing the shard files", [&] {
    if (user != nullptr) {
      AtomicFile mine((partial / user_rank_file_name(rank)).string());
      mine.write(user_mine);
      mine.commit();
      user_bytes = static_cast<int64_t>(mine.bytes_written());
      user_crc = mine.crc32();
      if (rank0) {
        AtomicFile global((partial / kUserGlobalFile).string());
        global.write(user_global);
        global.commit();
      }
    }
    if (!writes) return;
    AtomicFile file((partial / shard_file_name(rank)).string());
    // A frozen unit has its values in buffer 0 (unless excluded) and nothing after.
    for (int b = 0; b < engine.shard_buffers(); ++b) {
      for (int u = 0; u < layout.num_units(); ++u) {
        if (!stored.stores(layout.unit(u), b)) continue;
        const std::vector<float> values = engine.read_shard(u, b);
        check_savable(layout.unit(u), b, engine.partition(), values, root, tag);
        file.write(std::as_bytes(std::span(values)));
      }
      say(fmt::format("checkpoint {}: {} written", tag, shard_buffer_name(b)));
    }
    file.commit();
    bytes = static_cast<int64_t>(file.bytes_written());
    crc = file.crc32();
  });
  // Per rank: its shard file, whether it gave user state, its per-rank
  // file, and its global set's size and CRC-32.
  constexpr size_t kFields = 8;
  const int64_t mine[kFields] = {bytes,
                                 crc,
                                 user != nullptr ? 1 : 0,
                                 user_bytes,
                                 user_crc,
                                 user != nullptr ? static_cast<int64_t>(user->per_rank.size()) : 0,
                                 static_cast<int64_t>(user_global.size()),
                                 crc32(user_global.data(), user_global.size())};
  const std::vector<int64_t> files = engine.all_gather_scalars(mine);
  const auto field = [&](int r, size_t f) { return files[static_cast<size_t>(r) * kFields + f]; };
  // Every rank sees every rank's values, so every rank fails alike.
  for (int r = 1; r < world; ++r) {
    ZEST_CHECK(field(r, 2) == field(0, 2),
               "save_checkpoint: CheckpointOptions::user_state is {} on rank 0 and {} on rank {}: set it on every "
               "rank or on none",
               field(0, 2) ? "set" : "unset", field(r, 2) ? "set" : "unset", r);
    ZEST_CHECK(field(r, 6) == field(0, 6) && field(r, 7) == field(0, 7),
               "save_checkpoint: the user state 'global' differs between rank 0 and rank {} ({} and {} bytes, "
               "CRC-32 {:08x} and {:08x}); it must be the same on every rank: put what differs into per_rank",
               r, field(0, 6), field(r, 6), field(0, 7), field(r, 7));
  }

  if (before_publish) before_publish();
  on_every_rank(engine, "publishing the checkpoint", [&] {
    if (!rank0) return;
    CheckpointManifest m;
    m.format_version = stored.frozen_excluded ? kCheckpointFormatVersion : 2;
    m.world_size = world;
    m.stage = engine.stage();
    m.partitions = layout.partitions();
    m.compute_dtype = std::string(dtype_name(engine.compute_dtype()));
    m.optimizer = std::string(optimizer_name(engine.config().optimizer.kind));
    m.shard_buffers = engine.shard_buffers();
    m.frozen_excluded = stored.frozen_excluded;
    m.frozen_fingerprints = stored.frozen_fingerprints;
    m.progress = progress;
    m.groups = layout.groups();
    for (const UnitLayout& u : layout.units()) {
      UnitSpec spec{u.name, {}};
      for (const ParamLayout& p : u.params) {
        spec.params.push_back({p.name, p.shape, layout.groups()[static_cast<size_t>(p.group)].name, !u.frozen});
      }
      m.units.push_back(std::move(spec));
    }
    for (int r = 0; r < m.partitions; ++r) {
      m.files.push_back({shard_file_name(r), static_cast<uint64_t>(field(r, 0)), static_cast<uint32_t>(field(r, 1))});
    }
    if (user != nullptr) {
      m.user_global = UserStateFile{kUserGlobalFile, static_cast<uint64_t>(field(0, 6)),
                                    static_cast<uint32_t>(field(0, 7)), user->global.size()};
      for (int r = 0; r < world; ++r) {
        m.user_per_rank.push_back({user_rank_file_name(r), static_cast<uint64_t>(field(r, 3)),
                                   static_cast<uint32_t>(field(r, 4)), static_cast<uint64_t>(field(r, 5))});
      }
    }
    write_manifest(partial.string(), m);
    publisher->publish();
    // Still under the root's lock. Published: a failure here is a warning.
    if (options.keep_last > 0) {
      try {
        for (const std::string& old : prune_checkpoints(root, options.keep_last, tag)) {
          ZEST_LOG_INFO("checkpoint {} removed from '{}' (keeping the last {})", old, root, options.keep_last);
        }
      } catch (const std::exception& e) {
        ZEST_LOG_WARN("checkpoint {} saved; removing older ones (keep_last {}) failed: {}", dir.string(),
                      options.keep_last, e.what());
      }
    }
    // Published: a failing progress callback must not turn it into an error.
    try {
      say(fmt::format("checkpoint {} saved: {} shard files, {} bytes", dir.string(), m.partitions,
                      m.partitions * field(0, 0)));
    } catch (const std::exception& e) {
      ZEST_LOG_WARN("checkpoint {} saved; its progress callback failed: {}", dir.string(), e.what());
    }
  });
  return dir.string();
}

// The load of one group's checkpoint; `before_apply` runs on every rank once
// everything is read and checked, before the engine changes.
std::string load_part(Engine& engine, const std::string& root, const CheckpointOptions& options,
                      const std::function<void(const std::string& tag, int64_t steps)>& before_apply) {
  if (!options.tag.empty()) check_tag(options.tag);
  std::string dir = options.tag.empty() ? std::string() : (fs::path(root) / options.tag).string();
  const ModelLayout& layout = engine.layout();
  const int part = engine.partition();
  const int buffers = engine.shard_buffers();

  // Everything is read and checked into host memory first, so a bad file
  // leaves the engine as it was.
  std::vector<std::vector<std::vector<float>>> shards(static_cast<size_t>(layout.num_units()));
  std::vector<std::vector<float>> masters;  // weights_only
  Engine::Progress progress;
  UserState user;
  std::string note;
  bool excluded = false;  // the frozen units' values are not in the checkpoint
  uint32_t manifest_crc = 0;
  std::vector<uint64_t> saved_fingerprints;
  on_every_rank(engine, "loading the checkpoint", [&] {
    if (dir.empty()) dir = latest_checkpoint_dir(root);
    CheckpointReader reader(dir);
    const CheckpointManifest& m = reader.manifest();
    const std::string canonical = manifest_to_json(m);
    manifest_crc = crc32(canonical.data(), canonical.size());
    progress = m.progress;
    if (options.user_state != nullptr) {
      user = read_user_state(dir, m, engine.comm().rank(), engine.comm().size(), options.per_rank_user_state);
    }
    if (options.weights_only) {
      masters = read_weights_by_name(reader, layout, part);
      return;
    }
    const std::string mine = model_lines(layout);
    const std::string theirs = model_lines(reader.layout());
    ZEST_CHECK(mine == theirs,
               "checkpoint '{}' is of another model: {} (the checkpoint's first). Register the same units and "
               "parameters to load it, or load its weights alone (CheckpointOptions::weights_only)",
               dir, first_difference(theirs, mine));
    const ShardBufferMap map = map_shard_buffers(m, engine.config().optimizer, dir);
    note = map.note;
    excluded = m.frozen_excluded;
    saved_fingerprints = m.frozen_fingerprints;
    for (int u = 0; u < layout.num_units(); ++u) {
      const UnitLayout& U = layout.unit(u);
      for (int b = 0; b < buffers; ++b) {
        if (!m.stores(U, b)) continue;
        std::vector<float> values(U.shard);
        reader.read(map.from[static_cast<size_t>(b)], u, U.shard * static_cast<size_t>(part), values);
        shards[static_cast<size_t>(u)].push_back(std::move(values));
      }
    }
  });
  // Each rank resolved `latest` itself: a save moving it meanwhile (another
  // job on the same root) would have ranks load different checkpoints.
  // The tag, not the path: nodes may mount the root at different paths.
  const std::string tag = fs::path(dir).filename().string();
  const int64_t resolved[3] = {static_cast<int64_t>(crc32(tag.data(), tag.size())), progress.applied_steps,
                               static_cast<int64_t>(manifest_crc)};
  const std::vector<int64_t> all = engine.all_gather_scalars(resolved);
  for (size_t r = 1; 3 * r < all.size(); ++r) {
    ZEST_CHECK(all[3 * r] == all[0] && all[3 * r + 1] == all[1],
               "ranks loaded different checkpoints from '{}' (rank 0 one at step {}, rank {} one at step {}; this "
               "rank read '{}'): `latest` moved while they read it. Is another job saving to this root? Load again when "
               "it has finished, or name the checkpoint with a tag",
               root, all[1], r, all[3 * r + 1], dir);
    // The same tag and step, other contents: node-local copies that differ
    // (Note [ranks read one checkpoint], hf_import.cpp).
    ZEST_CHECK(all[3 * r + 2] == all[2],
               "ranks read different copies of checkpoint '{}': rank {}'s manifest (CRC-32 {:08x}) differs from rank "
               "0's ({:08x}) under the same tag and step: node-local copies that are not the same, or one replaced "
               "while the job started. Give every rank the same checkpoint",
               dir, r, static_cast<uint32_t>(all[3 * r + 2]), static_cast<uint32_t>(all[2]));
  }
  if (excluded) {
    // The base must be the one the checkpoint was trained on (Note [the
    // fingerprint of a frozen unit]); every rank computes the same sums.
    const std::vector<uint64_t> here = frozen_fingerprints(engine);
    for (int u = 0; u < layout.num_units(); ++u) {
      const size_t i = static_cast<size_t>(u);
      ZEST_CHECK(!layout.unit(u).frozen || here[i] == saved_fingerprints[i],
                 "checkpoint '{}' was saved without the values of its frozen units (exclude_frozen_parameters), to "
                 "be loaded onto the base it was trained on; frozen unit '{}' here holds other values (fingerprint "
                 "{:016x}, the checkpoint's {:016x}). Load that base first (the same Hugging Face checkpoint and "
                 "dtype, as the run that saved it did), then the checkpoint",
                 dir, layout.unit(u).name, here[i], saved_fingerprints[i]);
    }
  }
  if (before_apply) before_apply(tag, progress.applied_steps);
  if (options.user_state != nullptr) *options.user_state = std::move(user);
  if (options.weights_only) {
    start_from_weights(engine, masters);
    return dir;
  }
  if (!note.empty() && engine.comm().rank() == 0) ZEST_LOG_WARN("{}", note);
  for (int u = 0; u < layout.num_units(); ++u) {
    const int saved = static_cast<int>(shards[static_cast<size_t>(u)].size());
    for (int b = 0; b < saved; ++b) engine.write_shard(u, b, shards[static_cast<size_t>(u)][static_cast<size_t>(b)]);
  }
  engine.restore(progress);
  return dir;
}

}  // namespace

std::string save_checkpoint(Engine& engine, const std::string& root, const CheckpointOptions& options) {
  const ModelParallel& mp = engine.model_parallel();
  if (mp.size() == 1) return save_part(engine, root, options, nullptr);
  // A part that fails before the agreement says so there, then throws its
  // own error; the others throw naming it (model_parallel_parts.h).
  bool agreed = false;
  try {
    return save_part(engine, model_parallel_part_root(root, mp), options, [&] {
      agreed = true;
      agree_over_model_parallel(engine, "save_checkpoint", root, true);
    });
  } catch (...) {
    if (!agreed) agree_over_model_parallel(engine, "save_checkpoint", root, false);
    throw;
  }
}

std::string load_checkpoint(Engine& engine, const std::string& root, const CheckpointOptions& options) {
  const ModelParallel& mp = engine.model_parallel();
  if (mp.size() == 1) return load_part(engine, root, options, nullptr);
  bool agreed = false;
  try {
    check_model_parallel_parts(root, mp);
    return load_part(engine, model_parallel_part_root(root, mp), options,
                     [&](const std::string& tag, int64_t steps) {
                       agreed = true;
                       agree_over_model_parallel(engine, "load_checkpoint", root, true, tag, steps);
                     });
  } catch (...) {
    if (!agreed) agree_over_model_parallel(engine, "load_checkpoint", root, false);
    throw;
  }
}

}  // namespace zest
