// zest-ckpt: sharded checkpoints offline, in bounded memory.
//
//   zest-ckpt inspect CKPT                     manifest summary, frozen units, every file
//   zest-ckpt verify CKPT                      sizes, CRC-32s and values of every file
//   zest-ckpt --help                           the usage, exit 0
//   zest-ckpt export CKPT OUT.safetensors [--dtype fp32|bf16|fp16]
//   zest-ckpt reshard CKPT OUT_ROOT --world N [--stage S]
//
// CKPT is a checkpoint directory (root/step_000100) or a root with a
// `latest` pointer. Memory stays bounded: values move in pieces of at most
// kPiece elements, never a whole unit.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/cli.h"
#include "zest/core/check.h"
#include "zest/core/units.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/checkpoint/checkpoint_publish.h"
#include "zest/checkpoint/checkpoint_reader.h"
#include "zest/checkpoint/user_state_files.h"
#include "zest/core/file_io.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/engine/layout_constants.h"

namespace fs = std::filesystem;
using namespace zest;
using cli::usage_error;

namespace {

constexpr size_t kPiece = size_t{1} << 20;

const char* kUsage =
    "usage: zest-ckpt inspect CKPT\n"
    "       zest-ckpt verify CKPT\n"
    "       zest-ckpt export CKPT OUT.safetensors [--dtype fp32|bf16|fp16]\n"
    "       zest-ckpt reshard CKPT OUT_ROOT --world N [--stage 0-3]\n"
    "CKPT: a checkpoint directory, or a root holding a `latest` pointer\n";

std::string resolve(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(fs::path(path) / kManifestFileName, ec))) return path;
  return latest_checkpoint_dir(path);
}

// Calls fn(begin, count) over [begin, end) in pieces of at most kPiece.
template <typename Fn>
void for_each_piece(size_t begin, size_t end, Fn&& fn) {
  for (size_t i = begin; i < end; i += kPiece) fn(i, std::min(kPiece, end - i));
}

// One file of the manifest and what is on disk: a missing one shows as
// such. Returns whether it is there as a regular file.
bool print_file(const std::string& dir, const std::string& name, uint64_t bytes, uint32_t crc,
                const std::string& extra) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(fs::path(dir) / name, ec);
  const char* state = !fs::exists(st) ? "MISSING" : !fs::is_regular_file(st) ? "NOT A REGULAR FILE" : "";
  fmt::print("  {}  {:>12} bytes ({})  crc32 {:08x}{}{}{}\n", name, bytes, format_bytes(static_cast<int64_t>(bytes)),
             crc, extra, *state ? "  " : "", state);
  return *state == '\0';
}

int inspect(const std::string& path) {
  CheckpointReader r(resolve(path));
  const CheckpointManifest& m = r.manifest();
  const ModelLayout& L = r.layout();
  fmt::print("checkpoint  {}\n", r.dir());
  fmt::print("format      {}\n", m.format_version);
  fmt::print("saved by    {} ranks at stage {} ({} shard files)\n", m.world_size, m.stage, m.partitions);
  fmt::print("training    {}, {} (master weights + {} state buffers, fp32)\n", m.compute_dtype, m.optimizer,
             m.shard_buffers - 1);
  // Only fp16 runs scale the loss: the others' scaler never moved.
  const std::string scale =
      m.compute_dtype == dtype_name(DType::kFloat16) ? fmt::format(", loss scale {}", m.progress.loss_scaler.scale) : "";
  fmt::print("progress    {} steps applied, {} skipped{}\n", m.progress.applied_steps, m.progress.skipped_steps, scale);
  fmt::print("model       {} parameters in {} units ({} with padding)\n", L.numel(), L.num_units(), L.padded());
  std::vector<std::string> frozen;
  for (const UnitLayout& u : L.units()) {
    if (u.frozen) frozen.push_back(fmt::format("{} ({} parameters)", u.name, u.numel));
  }
  if (!frozen.empty()) {
    fmt::print("frozen      {} of {} units, {}: {}\n", frozen.size(), L.num_units(),
               m.frozen_excluded ? "values excluded (fingerprints only: loads onto its base)" : "values only",
               fmt::join(frozen, ", "));
  }
  int missing = 0, files = 0;
  for (const ShardFile& f : m.files) missing += !print_file(r.dir(), f.name, f.bytes, f.crc32, "");
  files += static_cast<int>(m.files.size());
  if (m.user_global) {
    fmt::print("user state  the program's own (global, and per rank: {})\n",
               m.user_per_rank.empty() ? "none" : fmt::format("{} files", m.user_per_rank.size()));
    std::vector<UserStateFile> user = m.user_per_rank;
    user.insert(user.begin(), *m.user_global);
    for (const UserStateFile& f : user) {
      missing += !print_file(r.dir(), f.name, f.bytes, f.crc32, fmt::format("  {} blobs", f.blobs));
    }
    files += static_cast<int>(user.size());
  }
  if (missing > 0) {
    fmt::print(stderr, "zest-ckpt: {} of {} {} files of '{}' are missing or not regular files; the checkpoint "
                       "cannot be loaded\n", missing, files, m.user_global ? "shard and user state" : "shard", r.dir());
    return 1;
  }
  return 0;
}

int verify(const std::string& path) {
  CheckpointReader r(resolve(path));
  r.verify_all();
  // Values too: every element of every buffer is finite.
  std::vector<float> piece;
  for (int b = 0; b < r.manifest().shard_buffers; ++b) {
    for (int u = 0; u < r.layout().num_units(); ++u) {
      if (!r.manifest().stores(r.layout().unit(u), b)) continue;  // frozen: values only, or none
      for_each_piece(0, r.layout().unit(u).padded, [&](size_t i, size_t n) {
        piece.resize(n);
        r.read(b, u, i, piece);
      });
    }
  }
  // The program's user state, checked as a load checks it.
  verify_user_state(r.dir(), r.manifest());
  const size_t user = r.manifest().user_global ? 1 + r.manifest().user_per_rank.size() : 0;
  fmt::print("{}: {} shard files and {} user state files: sizes, checksums and values OK\n", r.dir(),
             r.manifest().partitions, user);
  return 0;
}

int export_safetensors(const std::string& path, const std::string& out, DType dtype) {
  CheckpointReader r(resolve(path));
  check_output_apart(out, r.dir(), "zest-ckpt export: the output");
  const ModelLayout& L = r.layout();
  const std::vector<SafetensorsEntry> entries = weights_entries(L, dtype);
  uint64_t last_report = 0;
  SafetensorsWriter writer(out, entries, {{"format", "pt"}}, [&](uint64_t done, uint64_t total) {
    if (done - last_report >= (uint64_t{256} << 20) || done == total) {
      fmt::print("export: {} of {}\n", format_bytes(static_cast<int64_t>(done)), format_bytes(static_cast<int64_t>(total)));
      last_report = done;
    }
  });
  std::vector<float> values;
  for (int u = 0; u < L.num_units(); ++u) {
    for (const ParamLayout& p : L.unit(u).params) {
      writer.begin_tensor(p.name);
      for_each_piece(p.offset, p.offset + p.numel, [&](size_t i, size_t n) {
        values.resize(n);
        r.read(0, u, i, values);
        writer.write(encode_weights(values, dtype));
      });
    }
  }
  writer.finish();
  fmt::print("{}: {} tensors, {}\n", out, entries.size(), dtype_name(dtype));
  return 0;
}

int reshard(const std::string& path, const std::string& out_root, int world, int stage) {
  std::optional<CheckpointReader> input(std::in_place, resolve(path));
  const CheckpointManifest saved = input->manifest();
  CheckpointManifest m = saved;
  m.world_size = world;
  if (stage < 0) stage = m.stage;  // keep the checkpoint's
  m.stage = stage;
  m.partitions = zest::partitions_for(stage, world);
  m.files.clear();
  const ModelLayout L = m.layout();
  // Beyond one rank per parameter every added rank holds only padding, and
  // each is a file: a --world that large is a typo.
  ZEST_CHECK(static_cast<size_t>(world) <= L.numel(),
             "reshard --world {}: the checkpoint holds {} parameters, so at most {} ranks can each own one; give "
             "a world size no larger than that",
             world, L.numel(), L.numel());
  // Each unit is padded to a multiple of the world size: past the point
  // where the files would hold more padding than parameters, the world size
  // is a typo, not a plan.
  ZEST_CHECK(L.padded() <= 2 * L.numel(),
             "reshard --world {}: the checkpoint's {} parameters would be padded to {} (each of its {} units to a "
             "multiple of the world size), more padding than parameters in {} files; give a smaller world size",
             world, L.numel(), L.padded(), L.num_units(), m.partitions);
  std::string tag = fs::path(input->dir()).filename().string();
  if (tag.starts_with('.') && tag.ends_with(".old")) tag = tag.substr(1, tag.size() - 5);  // latest_checkpoint_dir
  const fs::path out_dir = fs::path(out_root) / tag;
  // In place (`reshard ck ck`) every byte is read before publish() swaps the
  // new directory with the old one; anything else that overlaps the input
  // is refused before a byte is written.
  std::error_code ec;
  if (!fs::equivalent(out_dir, input->dir(), ec)) {
    check_output_apart(out_dir.string(), input->dir(), "zest-ckpt reshard: the output checkpoint");
  }
  CheckpointPublisher publisher(out_root, tag);
  // The input is opened again under the lock: in place, the publisher has
  // just put back a .TAG.old that an interrupted re-save left (the input
  // itself, until then), and no other save to that root can move it now.
  input.emplace(resolve(path));
  ZEST_CHECK(manifest_to_json(input->manifest()) == manifest_to_json(saved),
             "checkpoint '{}' changed while zest-ckpt reshard opened it (another save to its root?); run it again",
             input->dir());
  CheckpointReader& r = *input;
  std::vector<float> piece;
  for (int q = 0; q < m.partitions; ++q) {
    const std::string name = shard_file_name(q);
    AtomicFile file((fs::path(publisher.partial_dir()) / name).string());
    for (int b = 0; b < m.shard_buffers; ++b) {
      for (int u = 0; u < L.num_units(); ++u) {
        if (!m.stores(L.unit(u), b)) continue;  // frozen: values only, or none
        const size_t begin = L.unit(u).shard * static_cast<size_t>(q);
        for_each_piece(begin, begin + L.unit(u).shard, [&](size_t i, size_t n) {
          piece.resize(n);
          r.read(b, u, i, piece);
          file.write(std::as_bytes(std::span(piece)));
        });
      }
    }
    file.commit();
    m.files.push_back({name, file.bytes_written(), file.crc32()});
    fmt::print("reshard: {} written\n", name);
  }
  // The program's user state: the global set travels; per-rank sets only to
  // the same world size, since a rank's state has no owner at another.
  const auto copy_checked = [&](const UserStateFile& f) {
    const ReadOnlyFile from((fs::path(r.dir()) / f.name).string());
    ZEST_CHECK(from.size() == f.bytes && from.crc32() == f.crc32,
               "checkpoint file '{}' does not match the manifest (size or CRC-32): the checkpoint is damaged",
               from.path());
    std::vector<std::byte> bytes(static_cast<size_t>(from.size()));
    from.read_at(0, bytes);
    AtomicFile to((fs::path(publisher.partial_dir()) / f.name).string());
    to.write(bytes);
    to.commit();
  };
  if (m.user_global) {
    copy_checked(*m.user_global);
    if (world == r.manifest().world_size) {
      for (const UserStateFile& f : m.user_per_rank) copy_checked(f);
    } else if (!m.user_per_rank.empty()) {
      fmt::print("reshard: the per-rank user state of {} ranks is dropped (a rank's state has no owner at {} "
                 "ranks); the global user state is kept\n",
                 r.manifest().world_size, world);
      m.user_per_rank.clear();
    }
  }
  write_manifest(publisher.partial_dir(), m);
  publisher.publish();
  fmt::print("{}: {} ranks, stage {}\n", (fs::path(out_root) / tag).string(), world, stage);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cli::App app("zest-ckpt");
    std::vector<std::string> args;  // the command, then its paths
    std::string dtype_name = "fp32";
    int world = 0, stage = -1;
    app.add_option("args", args);
    app.add_option("--dtype", dtype_name)->check(cli::IsMember({"fp32", "bf16", "fp16"}));
    app.add_option("--world", world)->check(cli::Range(1, 1 << 20));
    app.add_option("--stage", stage)->check(cli::Range(0, 3));
    cli::parse(app, argc, argv);
    if (args.empty()) usage_error("a command is needed");
    const std::string cmd = args[0];
    const std::vector<std::string> pos(args.begin() + 1, args.end());
    const DType dtype = parse_dtype(dtype_name);
    const auto need = [&](size_t n) {
      if (pos.size() != n) usage_error("{} takes {} path(s), got {}", cmd, n, pos.size());
    };
    if (cmd == "inspect") { need(1); return inspect(pos[0]); }
    if (cmd == "verify") { need(1); return verify(pos[0]); }
    if (cmd == "export") { need(2); return export_safetensors(pos[0], pos[1], dtype); }
    if (cmd == "reshard") {
      need(2);
      if (world == 0) usage_error("reshard needs --world N");
      return reshard(pos[0], pos[1], world, stage);
    }
    usage_error("unknown command '{}': inspect, verify, export or reshard", cmd);
  } catch (const cli::UsageError& e) {
    if (std::string_view(e.what()) == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "zest-ckpt: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zest-ckpt: %s\n", e.what());
    return 1;
  }
}
