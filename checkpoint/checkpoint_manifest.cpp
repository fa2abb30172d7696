#include "zest/checkpoint/checkpoint_manifest.h"

#include <initializer_list>

#include <nlohmann/json.hpp>

#include "zest/checkpoint/checkpoint.h"
#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/core/check.h"
#include "zest/core/crc32.h"
#include "zest/core/file_io.h"
#include "zest/config/detail/json_parse.h"

namespace zest {
namespace {

using nlohmann::json;

// Strict field access: every error names the manifest and the field's path.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {}

  const json& field(const json& obj, const char* key, const std::string& where) const {
    ZEST_CHECK(obj.is_object(), "checkpoint manifest '{}': {} is not an object", path_, where);
    const auto it = obj.find(key);
    ZEST_CHECK(it != obj.end(), "checkpoint manifest '{}': {}.{} is missing", path_, where, key);
    return *it;
  }
  int64_t integer(const json& obj, const char* key, const std::string& where, int64_t min, int64_t max) const {
    const json& v = field(obj, key, where);
    std::string why;
    const std::optional<int64_t> parsed = detail::json_int64(v, &why);
    ZEST_CHECK(parsed, "checkpoint manifest '{}': {}.{} {}; it must be an integer from {} to {}", path_, where, key,
               why, min, max);
    const int64_t x = *parsed;
    ZEST_CHECK(x >= min && x <= max, "checkpoint manifest '{}': {}.{} is {}, outside {}..{}", path_, where, key, x,
               min, max);
    return x;
  }
  double number(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    ZEST_CHECK(v.is_number(), "checkpoint manifest '{}': {}.{} must be a number", path_, where, key);
    return v.get<double>();
  }
  std::string text(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    ZEST_CHECK(v.is_string(), "checkpoint manifest '{}': {}.{} must be a string", path_, where, key);
    return v.get<std::string>();
  }
  const json& array(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    ZEST_CHECK(v.is_array(), "checkpoint manifest '{}': {}.{} must be an array", path_, where, key);
    return v;
  }

 private:
  const std::string& path_;
};

constexpr int64_t kMaxCount = int64_t{1} << 40;

// The manifest's own checksum: CRC-32 of the document without this field,
// in nlohmann's compact form (keys sorted), which a parse and a dump give
// back unchanged; so the check does not depend on the file's whitespace.
constexpr const char* kChecksumKey = "manifest_crc32";

std::string canonical_crc(const json& doc_without_checksum) {
  const std::string text = doc_without_checksum.dump();
  return fmt::format("{:08x}", crc32(text.data(), text.size()));
}

// The names a save writes (dtype_name, optimizer_name); `allowed` lists them.
void check_known(const std::string& value, std::initializer_list<const char*> allowed, const char* field,
                 const std::string& path) {
  std::string names;
  for (const char* a : allowed) {
    if (value == a) return;
    names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", a);
  }
  ZEST_FAIL("checkpoint manifest '{}': {} is \"{}\", which ZEST does not know; expected one of {}", path, field,
            value, names);
}

}  // namespace

std::string manifest_to_json(const CheckpointManifest& m) {
  json units = json::array();
  for (const UnitSpec& u : m.units) {
    json params = json::array();
    for (const ParamSpec& p : u.params) {
      json param = {{"name", p.name}, {"shape", p.shape}, {"group", p.group}};
      if (!p.trainable) param["trainable"] = false;  // absent: trainable (and before frozen units existed)
      params.push_back(std::move(param));
    }
    units.push_back({{"name", u.name}, {"params", params}});
  }
  // Format 3: the frozen units' values are not in the files, their
  // fingerprints are here.
  json frozen = json::object();
  if (m.frozen_excluded) {
    const ModelLayout layout = m.layout();
    for (int u = 0; u < layout.num_units(); ++u) {
      if (layout.unit(u).frozen) {
        frozen[layout.unit(u).name] = fmt::format("{:016x}", m.frozen_fingerprints.at(static_cast<size_t>(u)));
      }
    }
  }
  json groups = json::array();
  for (const ParamGroupSpec& g : m.groups) groups.push_back({{"name", g.name}, {"weight_decay", g.weight_decay}});
  json files = json::array();
  for (const ShardFile& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc32}});
  const LossScalerState& s = m.progress.loss_scaler;
  json doc = {
      {"format", "zest-checkpoint"},
      {"format_version", m.format_version},
      {"world_size", m.world_size},
      {"stage", m.stage},
      {"partitions", m.partitions},
      {"compute_dtype", m.compute_dtype},
      {"optimizer", m.optimizer},
      {"shard_buffers", m.shard_buffers},
      {"progress",
       {{"applied_steps", m.progress.applied_steps},
        {"skipped_steps", m.progress.skipped_steps},
        {"lr_override", m.progress.lr_override ? json(*m.progress.lr_override) : json(nullptr)},
        {"loss_scaler",
         {{"scale", s.scale},
          {"iteration", s.iteration},
          {"last_overflow_iteration", s.last_overflow_iteration},
          {"hysteresis_left", s.hysteresis_left}}}}},
      {"groups", groups},
      {"units", units},
      {"files", files},
  };
  if (m.frozen_excluded) doc["frozen_parameters"] = {{"excluded", true}, {"fingerprints", frozen}};
  if (m.user_global) {
    const auto entry = [](const UserStateFile& f) {
      return json{{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc32}, {"blobs", f.blobs}};
    };
    json per_rank = json::array();
    for (const UserStateFile& f : m.user_per_rank) per_rank.push_back(entry(f));
    doc["user_state"] = {{"global", entry(*m.user_global)}, {"per_rank", per_rank}};
  }
  // Last: it covers every field, the user state's included.
  doc[kChecksumKey] = canonical_crc(doc);
  return doc.dump(1) + "\n";
}

CheckpointManifest parse_manifest(const std::string& json_text, const std::string& path) {
  // A manifest nests 6 levels (units[].params[].shape[]).
  const json doc = detail::parse_json(json_text, fmt::format("checkpoint manifest '{}'", path), {.max_depth = 8});
  const Reader r(path);
  ZEST_CHECK(doc.is_object() && doc.contains("format") && doc["format"] == "zest-checkpoint",
             "'{}' is not a ZEST checkpoint manifest (no \"format\": \"zest-checkpoint\")", path);
  CheckpointManifest m;
  m.format_version = static_cast<int>(r.integer(doc, "format_version", "manifest", 1, 1'000'000));
  ZEST_CHECK(m.format_version <= kCheckpointFormatVersion,
             "checkpoint manifest '{}' has format version {}, newer than the {} this ZEST reads: load it with a "
             "newer ZEST",
             path, m.format_version, kCheckpointFormatVersion);
  m.world_size = static_cast<int>(r.integer(doc, "world_size", "manifest", 1, 1 << 20));
  m.stage = static_cast<int>(r.integer(doc, "stage", "manifest", 0, 3));
  m.partitions = static_cast<int>(r.integer(doc, "partitions", "manifest", 1, 1 << 20));
  // Stage 0: one; stages 1-2: one per rank; stage 3: one per rank, or with
  // MiCS one per rank of a group, the group's size dividing the world.
  const bool fits = m.stage == 0   ? m.partitions == 1
                    : m.stage == 3 ? m.partitions <= m.world_size && m.world_size % m.partitions == 0
                                   : m.partitions == m.world_size;
  ZEST_CHECK(fits, "checkpoint manifest '{}': {} partitions do not fit stage {} on {} ranks", path, m.partitions,
             m.stage, m.world_size);
  m.compute_dtype = r.text(doc, "compute_dtype", "manifest");
  check_known(m.compute_dtype, {"fp32", "fp16", "bf16"}, "compute_dtype", path);
  m.optimizer = r.text(doc, "optimizer", "manifest");
  check_known(m.optimizer, {"AdamW", "Adam", "SGD", "Lamb"}, "optimizer", path);
  m.shard_buffers = static_cast<int>(r.integer(doc, "shard_buffers", "manifest", 1, 3));

  const json& progress = r.field(doc, "progress", "manifest");
  m.progress.applied_steps = r.integer(progress, "applied_steps", "progress", 0, kMaxCount);
  m.progress.skipped_steps = r.integer(progress, "skipped_steps", "progress", 0, kMaxCount);
  // Absent in checkpoints saved before set_lr() existed.
  if (progress.contains("lr_override") && !progress["lr_override"].is_null()) {
    m.progress.lr_override = r.number(progress, "lr_override", "progress");
    ZEST_CHECK(std::isfinite(*m.progress.lr_override) && *m.progress.lr_override >= 0,
               "checkpoint manifest '{}': progress.lr_override must be a finite number of 0 or more", path);
  }
  const json& ls = r.field(progress, "loss_scaler", "progress");
  m.progress.loss_scaler.scale = r.number(ls, "scale", "progress.loss_scaler");
  ZEST_CHECK(std::isfinite(m.progress.loss_scaler.scale) && m.progress.loss_scaler.scale > 0,
             "checkpoint manifest '{}': progress.loss_scaler.scale must be a positive finite number", path);
  m.progress.loss_scaler.iteration = r.integer(ls, "iteration", "progress.loss_scaler", 0, kMaxCount);
  m.progress.loss_scaler.last_overflow_iteration =
      r.integer(ls, "last_overflow_iteration", "progress.loss_scaler", -1, kMaxCount);
  m.progress.loss_scaler.hysteresis_left =
      static_cast<int>(r.integer(ls, "hysteresis_left", "progress.loss_scaler", 0, 1 << 20));

  for (const json& g : r.array(doc, "groups", "manifest")) {
    m.groups.push_back({r.text(g, "name", "groups[]"), static_cast<float>(r.number(g, "weight_decay", "groups[]"))});
  }
  const json& units = r.array(doc, "units", "manifest");
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string where = fmt::format("units[{}]", u);
    UnitSpec spec{r.text(units[u], "name", where), {}};
    const json& params = r.array(units[u], "params", where);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string pw = fmt::format("{}.params[{}]", where, i);
      ParamSpec p{r.text(params[i], "name", pw), {}, r.text(params[i], "group", pw)};
      if (params[i].contains("trainable")) {
        ZEST_CHECK(params[i]["trainable"].is_boolean(), "checkpoint manifest '{}': {}.trainable must be true or false",
                   path, pw);
        p.trainable = params[i]["trainable"].get<bool>();
      }
      for (const json& d : r.array(params[i], "shape", pw)) {
        ZEST_CHECK(d.is_number_integer() && d.get<int64_t>() > 0 && d.get<int64_t>() <= kMaxCount,
                   "checkpoint manifest '{}': {}.shape has {}, not a positive integer", path, pw, d.dump());
        p.shape.push_back(d.get<int64_t>());
      }
      spec.params.push_back(std::move(p));
    }
    m.units.push_back(std::move(spec));
  }
  const json& files = r.array(doc, "files", "manifest");
  ZEST_CHECK(files.size() == static_cast<size_t>(m.partitions),
             "checkpoint manifest '{}' lists {} shard files for {} partitions", path, files.size(), m.partitions);
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = fmt::format("files[{}]", i);
    ShardFile f{r.text(files[i], "name", where),
                static_cast<uint64_t>(r.integer(files[i], "bytes", where, 0, int64_t{1} << 50)),
                static_cast<uint32_t>(r.integer(files[i], "crc32", where, 0, 0xFFFFFFFFll))};
    ZEST_CHECK(is_plain_name(f.name) && f.name != kManifestFileName,
               "checkpoint manifest '{}': {}.name '{}' must be a plain file name", path, where,
               escape_for_message(f.name));
    m.files.push_back(std::move(f));
  }
  // Absent when the program saved no user state (and before it existed).
  if (doc.contains("user_state")) {
    const json& us = doc["user_state"];
    const auto entry = [&](const json& e, const std::string& where) {
      UserStateFile f{r.text(e, "name", where), static_cast<uint64_t>(r.integer(e, "bytes", where, 0, int64_t{1} << 50)),
                      static_cast<uint32_t>(r.integer(e, "crc32", where, 0, 0xFFFFFFFFll)),
                      static_cast<uint64_t>(r.integer(e, "blobs", where, 0, kMaxCount))};
      ZEST_CHECK(is_plain_name(f.name) && f.name != kManifestFileName,
                 "checkpoint manifest '{}': {}.name '{}' must be a plain file name", path, where,
                 escape_for_message(f.name));
      return f;
    };
    m.user_global = entry(r.field(us, "global", "user_state"), "user_state.global");
    const json& per_rank = r.array(us, "per_rank", "user_state");
    ZEST_CHECK(per_rank.empty() || per_rank.size() == static_cast<size_t>(m.world_size),
               "checkpoint manifest '{}' lists {} per-rank user state files for {} ranks", path, per_rank.size(),
               m.world_size);
    for (size_t i = 0; i < per_rank.size(); ++i) {
      m.user_per_rank.push_back(entry(per_rank[i], fmt::format("user_state.per_rank[{}]", i)));
    }
  }
  // Absent: the frozen units' values are in the shard files (formats 1-2,
  // and 3 saved without exclude_frozen_parameters).
  if (doc.contains("frozen_parameters")) {
    const json& fp = r.field(doc, "frozen_parameters", "manifest");
    ZEST_CHECK(fp.contains("excluded") && fp["excluded"] == true,
               "checkpoint manifest '{}': frozen_parameters.excluded must be true", path);
    const json& prints = r.field(fp, "fingerprints", "frozen_parameters");
    ZEST_CHECK(prints.is_object(), "checkpoint manifest '{}': frozen_parameters.fingerprints must be an object", path);
    m.frozen_excluded = true;
    m.frozen_fingerprints.assign(m.units.size(), 0);
    size_t frozen = 0;
    for (size_t u = 0; u < m.units.size(); ++u) {
      const UnitSpec& spec = m.units[u];
      if (spec.params.empty() || spec.params.front().trainable) continue;
      ++frozen;
      const std::string where = fmt::format("frozen_parameters.fingerprints[\"{}\"]", escape_for_message(spec.name));
      ZEST_CHECK(prints.contains(spec.name) && prints[spec.name].is_string(),
                 "checkpoint manifest '{}': no {} (a hexadecimal string) for frozen unit '{}'", path, where,
                 escape_for_message(spec.name));
      const std::string hex = prints[spec.name].get<std::string>();
      ZEST_CHECK(hex.size() == 16 && hex.find_first_not_of("0123456789abcdef") == std::string::npos,
                 "checkpoint manifest '{}': {} is \"{}\", not 16 hexadecimal digits", path, where,
                 escape_for_message(hex));
      m.frozen_fingerprints[u] = std::stoull(hex, nullptr, 16);
    }
    ZEST_CHECK(prints.size() == frozen, "checkpoint manifest '{}': {} fingerprints for {} frozen units", path,
               prints.size(), frozen);
  }
  // Last, so that the fields' own checks (which name the field) come first;
  // this one catches what they cannot: entries swapped, a value changed
  // within its range. Format 1 predates the checksum.
  if (m.format_version >= 2) {
    ZEST_CHECK(doc.contains(kChecksumKey) && doc[kChecksumKey].is_string(),
               "checkpoint manifest '{}' has no \"{}\"; it was damaged or edited: restore it from a copy", path,
               kChecksumKey);
    json rest = doc;
    const std::string stored = rest[kChecksumKey].get<std::string>();
    rest.erase(kChecksumKey);
    const std::string actual = canonical_crc(rest);
    ZEST_CHECK(stored == actual,
               "checkpoint manifest '{}' is corrupt: its content has CRC-32 {} but it says {}; it was damaged or "
               "edited (a field changed, shard files reordered): restore it from a copy",
               path, actual, escape_for_message(stored));
  }
  // The layout must be constructible: names unique, groups declared...
  try {
    (void)m.layout();
  } catch (const Error& e) {
    ZEST_FAIL("checkpoint manifest '{}' describes an invalid model: {}", path, e.what());
  }
  return m;
}

}  // namespace zest
