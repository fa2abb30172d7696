// kill -9 at random moments of every operation that publishes (issue 12):
// save, re-save of a tag, zest-ckpt reshard (to another root and in place)
// and zest-ckpt export. After every kill the previous checkpoint (or file)
// must still load and verify. A fixed seed and a bounded number of rounds
// keep it reproducible and short.
#include <doctest/doctest.h>

#include <spawn.h>

#include "checkpoint/checkpoint_test_util.h"
#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/checkpoint/safetensors.h"

extern char** environ;

using namespace zest;
using namespace zest::test;

namespace {

// 250k parameters: a save writes 3 MB (AdamW: weights and two moments), long
// enough for kills to land inside it, short enough for many rounds.
void register_mid(Engine& engine) {
  engine.add_unit("big", {{"big.w", {500, 500}}});
  engine.add_unit("small", {{"small.w", {3, 5}}});
}

void with_mid_engine(const std::function<void(Engine&)>& fn) {
  auto comm = std::move(make_inprocess_group(1)[0]);
  CachingAllocator alloc(make_host_allocator());
  Engine engine(base_config(1), *comm, alloc, Stream::default_for(Device::host()));
  register_mid(engine);
  engine.finalize(init_values);
  fn(engine);
}

void step(Engine& engine, int64_t s) {
  for (int u = 0; u < 2; ++u) {
    UnitHandle h = engine.gather(u);
    GradHandle g = engine.grads(u);
    for (const ParamLayout& p : engine.layout().unit(u).params) {
      std::span<float> gw = g.grad<float>(p.name);
      for (size_t i = 0; i < gw.size(); ++i) gw[i] = noise(static_cast<uint32_t>(i), 1, static_cast<uint32_t>(s));
    }
    g.done();
  }
  engine.step();
}

// Every file's size and CRC-32, then a load into an engine.
int64_t verify_and_load(const std::string& root) {
  CheckpointReader(latest_checkpoint_dir(root)).verify_all();
  int64_t applied = -1;
  with_mid_engine([&](Engine& e) {
    load_checkpoint(e, root);
    applied = e.progress().applied_steps;
  });
  return applied;
}

// Saves forever (a fixed tag, or one per step) until killed.
[[noreturn]] void save_forever(const std::string& root, const std::string& tag) {
  try {
    with_mid_engine([&](Engine& engine) {
      for (int64_t s = 0;; ++s) {
        step(engine, s);
        save_checkpoint(engine, root, with_tag(tag));
      }
    });
  } catch (...) {
  }
  ::_exit(3);
}

}  // namespace

TEST_CASE("kill -9 during saves and re-saves of a tag: the previous checkpoint always loads and verifies") {
  std::mt19937 rng(12);
  for (const char* tag : {"", "fixed"}) {
    CAPTURE(tag);
    TempDir root;
    for (int round = 0; round < 5; ++round) {
      CAPTURE(round);
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) save_forever(root.str(), tag);
      // Let it publish once, then kill it at a random moment of a later save.
      while (!fs::exists(root.path / "latest")) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 150'000));
      ::kill(child, SIGKILL);
      int status = 0;
      ::waitpid(child, &status, 0);
      CHECK(WIFSIGNALED(status));
      CHECK(verify_and_load(root.str()) >= 1);
    }
  }
}

#ifdef ZEST_CKPT_TOOL
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs zest-ckpt with `args`; with a delay, kills it with SIGKILL after that
// long if it is still running. Returns true if it finished on its own.
bool run_tool(const std::vector<std::string>& args, std::optional<std::chrono::microseconds> kill_after) {
  std::vector<std::string> all = {ZEST_CKPT_TOOL};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (kill_after) {
    std::this_thread::sleep_for(*kill_after);
    ::kill(pid, SIGKILL);
  }
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) {
    CHECK(WEXITSTATUS(status) == 0);
    return true;
  }
  return false;
}

}  // namespace

TEST_CASE("kill -9 during zest-ckpt reshard (to a root, in place) and export: the previous result always verifies") {
  std::mt19937 rng(13);
  TempDir src;
  with_mid_engine([&](Engine& engine) {
    step(engine, 0);
    save_checkpoint(engine, src.str());
  });
  // How long each takes here, so that the kills spread over the whole run.
  auto t0 = std::chrono::steady_clock::now();
  TempDir dst;
  REQUIRE(run_tool({"reshard", src.str(), dst.str(), "--world", "3"}, std::nullopt));
  const double reshard_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const std::string reference = src / "reference.safetensors";
  REQUIRE(run_tool({"export", src.str(), reference}, std::nullopt));
  const double export_s = seconds_since(t0);
  MESSAGE(fmt::format("zest-ckpt reshard {:.3f} s, export {:.3f} s", reshard_s, export_s));
  const auto random_delay = [&](double seconds) {
    return std::chrono::microseconds(rng() % static_cast<uint64_t>(seconds * 2.5e6 + 1));
  };

  int killed = 0;
  for (int round = 0; round < 8; ++round) {
    CAPTURE(round);
    // Re-saves of the tag in another root, at another world size each time.
    killed += !run_tool({"reshard", src.str(), dst.str(), "--world", std::to_string(1 + round % 4)},
                        random_delay(reshard_s));
    CHECK(verify_and_load(dst.str()) == 1);
    CHECK(verify_and_load(src.str()) == 1);
    // In place: the source itself is replaced.
    killed += !run_tool({"reshard", dst.str(), dst.str(), "--world", std::to_string(2 + round % 3)},
                        random_delay(reshard_s));
    CHECK(verify_and_load(dst.str()) == 1);
    // Export over the previous export: it is either the old file or the new.
    const std::string out = dst / "model.safetensors";
    const bool had = fs::exists(out);
    killed += !run_tool({"export", src.str(), out}, random_delay(export_s));
    if (had || fs::exists(out)) CHECK(slurp(out) == slurp(reference));
  }
  MESSAGE(fmt::format("{} of 24 runs killed before they finished", killed));
  CHECK(killed > 0);  // the delays do reach inside the runs
}
#endif
