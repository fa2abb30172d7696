// zest-ckpt against what load_checkpoint checks: verify checks the user
// state files as a load does (ten mutations, each refused by both), inspect
// lists them and the frozen units and shows a loss scale only for fp16, an
// in-place reshard succeeds right after an interrupted re-save, and --help
// exits 0.
#include <doctest/doctest.h>

#ifdef ZEST_CKPT_TOOL
#include <cstdio>

#include "checkpoint/checkpoint_test_util.h"

using namespace zest;
using namespace zest::test;

namespace {

struct ToolRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs zest-ckpt with `args` (paths without quotes in them).
ToolRun tool(const std::vector<std::string>& args) {
  std::string command = fmt::format("'{}'", ZEST_CKPT_TOOL);
  for (const std::string& a : args) command += fmt::format(" '{}'", a);
  command += " 2>&1";
  ToolRun out;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.output.append(buf, n);
  const int status = ::pclose(pipe);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// A checkpoint of 2 ranks with global and per-rank user state, in `root`.
void save_with_user_state(const std::string& root) {
  on_each_rank(2, base_config(1), [&](Engine& engine, Communicator& comm) {
    RankResult r;
    run_steps(engine, comm, runs(2, 0), 0, 1, r);
    UserState state;
    state.global["data.position"] = to_bytes(int64_t{4096});
    state.global["note"] = to_bytes(std::string("epoch 0"));
    state.per_rank["rng"] = to_bytes(uint64_t{1000} + static_cast<uint64_t>(comm.rank()));
    CheckpointOptions options;
    options.user_state = &state;
    save_checkpoint(engine, root, options);
  });
}

// A load of `root` with its user state on 2 ranks: the error, or "".
std::string load_with_user_state(const std::string& root) {
  return error_text([&] {
    on_each_rank(2, base_config(1), [&](Engine& engine, Communicator&) {
      UserState state;
      CheckpointOptions options;
      options.user_state = &state;
      load_checkpoint(engine, root, options);
    });
  });
}

void flip_byte(const fs::path& file, size_t at) {
  std::string bytes = slurp(file);
  REQUIRE(at < bytes.size());
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  spit(file, bytes);
}

}  // namespace

TEST_CASE("zest-ckpt --help and -h print the usage and exit 0") {
  for (const char* flag : {"--help", "-h"}) {
    CAPTURE(flag);
    const ToolRun run = tool({flag});
    CHECK(run.exit_code == 0);
    CHECK(run.output.find("usage: zest-ckpt inspect CKPT") != std::string::npos);
  }
  CHECK(tool({"bogus"}).exit_code == 2);
}

TEST_CASE("zest-ckpt verify checks the user state files as a load does: ten mutations, each refused by both") {
  TempDir pristine;
  save_with_user_state(pristine.str());
  const ToolRun good = tool({"verify", pristine.str()});
  CHECK(good.exit_code == 0);
  CHECK(good.output.find("2 shard files and 3 user state files: sizes, checksums and values OK") != std::string::npos);
  CHECK(load_with_user_state(pristine.str()).empty());

  const std::string global = "user_global.bin";
  const std::string rank0 = "user_rank_00000.bin";
  const std::string rank1 = "user_rank_00001.bin";
  // Each mutation of a copy of the checkpoint directory, and the file the
  // refusal must name.
  struct Mutation {
    const char* what;
    std::string file;
    std::function<void(const fs::path& dir)> apply;
  };
  const auto truncate = [](const std::string& name, size_t keep) {
    return [=](const fs::path& dir) { fs::resize_file(dir / name, keep); };
  };
  const auto append = [](const std::string& name) {
    return [=](const fs::path& dir) { spit(dir / name, slurp(dir / name) + "x"); };
  };
  const auto reseal = [](const std::function<void(nlohmann::json&)>& edit) {
    return [=](const fs::path& dir) {
      nlohmann::json doc = read_manifest_json(dir);
      edit(doc["user_state"]);
      write_manifest_resealed(dir, doc);
    };
  };
  const std::vector<Mutation> mutations = {
      {"global truncated by a byte", global, [&](const fs::path& d) { fs::resize_file(d / global, fs::file_size(d / global) - 1); }},
      {"global with a byte flipped", global, [&](const fs::path& d) { flip_byte(d / global, 20); }},
      {"global with a byte appended", global, append(global)},
      {"global missing", global, [&](const fs::path& d) { fs::remove(d / global); }},
      {"rank 1's file emptied", rank1, truncate(rank1, 0)},
      {"rank 0's file with a byte flipped", rank0, [&](const fs::path& d) { flip_byte(d / rank0, 9); }},
      {"rank 1's file with a byte appended", rank1, append(rank1)},
      {"rank 0's file missing", rank0, [&](const fs::path& d) { fs::remove(d / rank0); }},
      {"rank 0's file in place of rank 1's", rank1,
       [&](const fs::path& d) { fs::copy_file(d / rank0, d / rank1, fs::copy_options::overwrite_existing); }},
      {"the manifest's blob count of global off by one (resealed)", global,
       reseal([](nlohmann::json& us) { us["global"]["blobs"] = us["global"]["blobs"].get<int>() + 1; })},
      {"a damaged global whose size and CRC-32 the manifest matches (resealed)", global,
       [&](const fs::path& d) {
         std::string bytes = slurp(d / global);
         bytes[8] = 9;  // the blob count: past the end of the file
         spit(d / global, bytes);
         nlohmann::json doc = read_manifest_json(d);
         doc["user_state"]["global"]["crc32"] = crc32(bytes.data(), bytes.size());
         write_manifest_resealed(d, doc);
       }},
  };
  CHECK(mutations.size() >= 10);
  for (const Mutation& m : mutations) {
    CAPTURE(m.what);
    TempDir copy;
    fs::copy(pristine.path, copy.path, fs::copy_options::recursive);
    const fs::path dir = copy.path / "step_000001";
    m.apply(dir);
    const ToolRun run = tool({"verify", copy.str()});
    CHECK(run.exit_code == 1);
    CHECK(run.output.find((dir / m.file).string()) != std::string::npos);
    const std::string load = load_with_user_state(copy.str());
    CHECK(load.find((dir / m.file).string()) != std::string::npos);
  }
}

TEST_CASE("zest-ckpt inspect lists the user state files and the frozen units, and a loss scale for fp16 only") {
  TempDir user;
  save_with_user_state(user.str());
  const ToolRun run = tool({"inspect", user.str()});
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("progress    1 steps applied, 0 skipped\n") != std::string::npos);  // fp32: no scale
  CHECK(run.output.find("user state  the program's own (global, and per rank: 2 files)") != std::string::npos);
  CHECK(run.output.find("user_global.bin ") != std::string::npos);
  CHECK(run.output.find("  2 blobs") != std::string::npos);
  CHECK(run.output.find("user_rank_00001.bin ") != std::string::npos);
  CHECK(run.output.find("frozen") == std::string::npos);
  fs::remove(user.path / "step_000001" / "user_rank_00001.bin");
  const ToolRun missing = tool({"inspect", user.str()});
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.find("user_rank_00001.bin ") != std::string::npos);
  CHECK(missing.output.find("MISSING") != std::string::npos);
  CHECK(missing.output.find("1 of 5 shard and user state files") != std::string::npos);

  // An fp16 run with a frozen unit.
  TempDir frozen;
  EngineConfig config = base_config(1);
  config.fp16.enabled = true;
  auto comm = std::move(make_inprocess_group(1)[0]);
  CachingAllocator alloc(make_host_allocator());
  Engine engine(config, *comm, alloc, Stream::default_for(Device::host()));
  engine.add_unit("a", {{"a.w", {7, 13}}});
  engine.add_unit("emb", {{"emb.w", {4, 5}, "default", false}});
  engine.finalize(init_values);
  save_checkpoint(engine, frozen.str());
  const ToolRun fp16 = tool({"inspect", frozen.str()});
  CHECK(fp16.exit_code == 0);
  CHECK(fp16.output.find(fmt::format("progress    0 steps applied, 0 skipped, loss scale {}\n",
                                     engine.progress().loss_scaler.scale)) != std::string::npos);
  CHECK(fp16.output.find("frozen      1 of 2 units, values only: emb (20 parameters)\n") != std::string::npos);
  CHECK(fp16.output.find("user state") == std::string::npos);
}

TEST_CASE("an in-place zest-ckpt reshard right after an interrupted re-save succeeds at the first attempt") {
  TempDir root;
  // A model large enough for 2 ranks (zest-ckpt refuses more padding than values).
  const auto model = [](Engine& e) { e.add_unit("a", {{"a.w", {40, 40}}}); };
  on_each_rank(
      1, base_config(1),
      [&](Engine& e, Communicator& comm) {
        RankResult r;
        run_steps(e, comm, runs(1, 0), 0, 2, r);
        save_checkpoint(e, root.str());
      },
      model);
  // What a re-save killed between its two renames leaves (file systems
  // without RENAME_EXCHANGE): the tag moved aside, the new copy partial.
  fs::rename(root.path / "step_000002", root.path / ".step_000002.old");
  fs::create_directory(root.path / ".step_000002.partial.00000000deadbeef");
  spit(root.path / ".step_000002.partial.00000000deadbeef" / "rank_00000.bin", "half");
  const ToolRun run = tool({"reshard", root.str(), root.str(), "--world", "2"});
  CAPTURE(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("2 ranks, stage 1") != std::string::npos);
  CHECK(tool({"verify", root.str()}).exit_code == 0);
  CHECK(tool({"inspect", root.str()}).output.find("saved by    2 ranks at stage 1") != std::string::npos);
  CHECK(!fs::exists(root.path / ".step_000002.old"));
  CHECK(!fs::exists(root.path / ".step_000002.partial.00000000deadbeef"));
  on_each_rank(
      2, base_config(1),
      [&](Engine& e, Communicator&) {
        load_checkpoint(e, root.str());
        CHECK(e.progress().applied_steps == 2);
      },
      model);
}
#endif
