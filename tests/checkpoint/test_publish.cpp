// Publishing a checkpoint (issue 12, findings 1, 2, 4, 7 and "a save reports
// failure only before publishing"): one saver per root, no planted link
// followed, a re-saved tag complete at every instant, saves at accumulation
// boundaries only, finite shards only, no lock file shared through a link.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include "checkpoint/checkpoint_test_util.h"
#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/checkpoint/checkpoint_publish.h"
#include "zest/checkpoint/safetensors.h"

using namespace zest;
using namespace zest::test;

namespace {

// Names in `root` that a save leaves only while running or when killed.
std::vector<std::string> leftovers(const fs::path& root) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.find(".partial") != std::string::npos || name.ends_with(".old") || name.find(".tmp") != std::string::npos)
      out.push_back(name);
  }
  return out;
}

// Resets the publish hooks when a test ends, whatever happens.
struct HooksGuard {
  ~HooksGuard() { detail::publish_test_hooks() = {}; }
};

}  // namespace

TEST_CASE("finding 1: a second saver on a locked root fails at once naming the root and the holder") {
  TempDir root;
  save_small(root.str(), 1);
  const auto before = snapshot(root.path);
  {
    CheckpointPublisher holder(root.str(), "step_000002");  // another save, in progress
    const std::string err = error_text([&] { save_small(root.str(), 2); });
    CAPTURE(err);
    CHECK(err.find(fmt::format("checkpoint root '{}' is locked by another save (pid {} on host", root.str(),
                               ::getpid())) != std::string::npos);
    CHECK(err.find("wait for that one to end, or save to another root") != std::string::npos);
    // The other save's partial directory is untouched by the refused one.
    CHECK(fs::is_directory(holder.partial_dir()));
  }
  // The holder ended without publishing: the root is as before, and loads.
  auto after = snapshot(root.path);
  after.erase((root.path / ".zest-lock").string());
  auto expected = before;
  expected.erase((root.path / ".zest-lock").string());
  CHECK(after == expected);
  CHECK(load_small(root.str()) == 1);
}

TEST_CASE("finding 1: two processes saving to one root over and over never publish a corrupt checkpoint") {
  TempDir root;
  save_small(root.str(), 1);
  // Each child saves 8 times; a save either publishes or fails on the lock.
  const auto saver = [&](int salt) {
    return [&root, salt] {
      int ok = 0, locked = 0;
      for (int i = 0; i < 8; ++i) {
        const std::string err = error_text([&] { save_small(root.str(), 1 + (i + salt) % 3, "shared"); });
        if (err.empty()) {
          ++ok;
        } else if (err.find("is locked by another save") != std::string::npos) {
          ++locked;
        } else {
          return "unexpected: " + err;
        }
      }
      return fmt::format("ok {} locked {}", ok, locked);
    };
  };
  Child a = start_child(saver(0));
  Child b = start_child(saver(1));
  for (const ChildOutcome& o : {wait_child(a, std::chrono::seconds(60)), wait_child(b, std::chrono::seconds(60))}) {
    CAPTURE(o.text);
    CHECK(o.finished);
    CHECK(o.exit_code == 0);
    CHECK(o.text.starts_with("ok "));
  }
  // Whatever interleaving happened, what `latest` names loads (sizes and
  // CRC-32s checked) and nothing half-done is left.
  CHECK(slurp(root.path / "latest") == "shared\n");
  const int64_t applied = load_small(root.str());
  CHECK((applied >= 1 && applied <= 3));
  CheckpointReader(root / "shared").verify_all();
  CHECK(leftovers(root.path).empty());
}

TEST_CASE("finding 2: links planted under a save's names are never followed, and nothing outside the root changes") {
  TempDir root, outside;
  save_small(root.str(), 1);
  spit(outside.path / "victim", "precious");
  fs::create_directory(outside.path / "victim_dir");
  spit(outside.path / "victim_dir" / "keep", "keep");
  const auto outside_before = snapshot(outside.path);

  SUBCASE("at the old fixed temp names: removed as leftovers, the save succeeds") {
    // The names earlier versions wrote through, and the patterns of today's.
    for (const char* name : {"latest.tmp", "latest.tmp.1.abc", ".step_000002.partial", ".step_000002.partial.00ff",
                             ".step_000002.old"}) {
      fs::create_symlink(std::string(name).ends_with("tmp") || std::string(name).find("tmp.") != std::string::npos
                             ? outside.path / "victim"
                             : outside.path / "victim_dir",
                         root.path / name);
    }
    save_small(root.str(), 2);
    CHECK(load_small(root.str()) == 2);
    CHECK(fs::is_regular_file(fs::symlink_status(root.path / "latest")));
    CHECK(fs::is_directory(fs::symlink_status(root.path / "step_000002")));
    CHECK(leftovers(root.path).empty());
  }
  SUBCASE("at `latest`: refused, naming it") {
    fs::remove(root.path / "latest");
    fs::create_symlink(outside.path / "victim", root.path / "latest");
    const std::string err = error_text([&] { save_small(root.str(), 2); });
    CHECK(err.find(fmt::format("'{}' exists but is not a regular file (it is a symbolic link)", root / "latest")) !=
          std::string::npos);
  }
  SUBCASE("at the tag's directory: refused, naming it") {
    fs::create_directory_symlink(outside.path / "victim_dir", root.path / "step_000002");
    const std::string err = error_text([&] { save_small(root.str(), 2); });
    CHECK(err.find(fmt::format("'{}' exists but is not a directory (it is a symbolic link)", root / "step_000002")) !=
          std::string::npos);
    CHECK(load_small(root.str()) == 1);
  }
  SUBCASE("at the lock file: refused, naming it") {
    fs::remove(root.path / ".zest-lock");
    fs::create_symlink(outside.path / "victim", root.path / ".zest-lock");
    const std::string err = error_text([&] { save_small(root.str(), 2); });
    CHECK(err.find(fmt::format("cannot open the lock file '{}'", root / ".zest-lock")) != std::string::npos);
    CHECK(err.find("it is a symbolic link: remove it") != std::string::npos);
  }
  SUBCASE("a hard link at the lock file: refused, naming it, and the linked file keeps its bytes") {
    fs::remove(root.path / ".zest-lock");
    fs::create_hard_link(outside.path / "victim", root.path / ".zest-lock");
    const std::string err = error_text([&] { save_small(root.str(), 2); });
    CHECK(err.find(fmt::format("the lock file '{}' of checkpoint root '{}' has 2 hard links", root / ".zest-lock",
                               root.str())) != std::string::npos);
    CHECK(load_small(root.str()) == 1);
    fs::remove(root.path / ".zest-lock");  // the victim's link count back to 1 for the snapshot
    save_small(root.str(), 2);             // and the save goes through once it is gone
    CHECK(load_small(root.str()) == 2);
  }
  SUBCASE("at a file's temp names and at the file itself (AtomicFile, the safetensors writer)") {
    const std::string out = outside / "model.safetensors";  // the victim is in the same directory
    fs::create_symlink(outside.path / "victim", out + ".tmp");
    {
      SafetensorsWriter w(out, {{"a", "U8", {4}}});
      const std::string four = "abcd";
      w.write_tensor("a", std::as_bytes(std::span(four)));
      w.finish();
    }
    CHECK(SafetensorsFile::open(out).tensors().size() == 1);
    fs::remove(out);
    fs::remove(out + ".tmp");
    fs::create_symlink(outside.path / "victim", out);
    const std::string err = error_text([&] { SafetensorsWriter w(out, {{"a", "U8", {4}}}); });
    CHECK(err.find(fmt::format("'{}' exists and is a symbolic link", out)) != std::string::npos);
    fs::remove(out);
  }
  CHECK(snapshot(outside.path) == outside_before);
  CHECK(slurp(outside.path / "victim") == "precious");
}

TEST_CASE("finding 4: a re-saved tag is a complete checkpoint at every step of the replace, even when killed") {
  // For each step of publish(), a child re-saves tag "fixed" (step 1 -> step
  // 2) and is killed there by SIGKILL; the root must then load (sizes and
  // CRC-32s checked), and the next save must clean up and publish.
  struct Kill {
    const char* step;
    bool no_exchange;
    int64_t expect;  // the step `latest` then resumes at
  };
  for (const Kill k : {Kill{"partial written", false, 1}, Kill{"tag exchanged", false, 2},
                       Kill{"tag in place", false, 2}, Kill{"latest moved", false, 2},
                       Kill{"partial written", true, 1}, Kill{"old moved aside", true, 1},
                       Kill{"tag in place", true, 2}}) {
    CAPTURE(k.step);
    CAPTURE(k.no_exchange);
    TempDir root;
    save_small(root.str(), 1, "fixed");
    const ChildOutcome o = run_in_child([&] {
      detail::publish_test_hooks().no_rename_exchange = k.no_exchange;
      detail::publish_test_hooks().at_step = [&](std::string_view s) {
        if (s == k.step) ::raise(SIGKILL);
      };
      save_small(root.str(), 2, "fixed");
      return std::string("not killed");
    });
    CHECK_FALSE(o.finished);  // killed at the step
    CHECK(load_small(root.str()) == k.expect);
    if (std::string_view(k.step) == "old moved aside") {
      // The tag's directory is missing; the reader used .fixed.old.
      CHECK_FALSE(fs::exists(root.path / "fixed"));
      CHECK(fs::is_directory(root.path / ".fixed.old"));
    }
    // The next save restores what a killed one left and publishes.
    save_small(root.str(), 3, "fixed");
    CHECK(load_small(root.str()) == 3);
    CHECK(leftovers(root.path).empty());
  }
}

TEST_CASE("finding 4: reading a tag whose re-save was interrupted names .TAG.old when even that is gone") {
  TempDir root;
  save_small(root.str(), 1, "fixed");
  fs::remove_all(root.path / "fixed");
  const std::string err = error_text([&] { load_small(root.str()); });
  CHECK(err.find(fmt::format("'{}' names '{}', which does not exist", root / "latest", root / "fixed")) !=
        std::string::npos);
}

TEST_CASE("a save reports a failure only before it publishes, and then leaves the previous checkpoint current") {
  HooksGuard guard;
  TempDir root;
  save_small(root.str(), 1);
  SUBCASE("a failure before `latest` moves: an error, and `latest` still names the previous checkpoint") {
    detail::publish_test_hooks().at_step = [](std::string_view s) {
      if (s == "tag in place") ZEST_FAIL("injected failure at '{}'", s);
    };
    CHECK(error_text([&] { save_small(root.str(), 2); }).find("injected failure at 'tag in place'") !=
          std::string::npos);
    detail::publish_test_hooks() = {};
    CHECK(slurp(root.path / "latest") == "step_000001\n");
    CHECK(load_small(root.str()) == 1);
  }
  SUBCASE("a failure after `latest` moved: not an error (a warning), the new checkpoint is current") {
    detail::publish_test_hooks().at_step = [](std::string_view s) {
      if (s == "latest moved") ZEST_FAIL("injected failure at '{}'", s);
    };
    std::string dir;
    CHECK(error_text([&] { dir = save_small(root.str(), 2); }).empty());
    detail::publish_test_hooks() = {};
    CHECK(dir == root / "step_000002");
    CHECK(load_small(root.str()) == 2);
  }
  SUBCASE("a progress callback that throws after publishing does not fail the save") {
    std::string dir;
    with_engine(2, [&](Engine& e, Communicator&) {
      CheckpointOptions options;
      options.progress = [](const std::string& line) {
        if (line.find("saved") != std::string::npos) throw std::runtime_error("x");
      };
      dir = save_checkpoint(e, root.str(), options);
    });
    CHECK(load_small(root.str()) == 2);
  }
  CHECK(leftovers(root.path).empty());
}

TEST_CASE("finding 1: ranks that resolve their root to different checkpoints fail, naming both steps") {
  // A save moving `latest` while ranks read it has the same effect as ranks
  // given different roots; the roots' paths may differ (mounts), the
  // checkpoint may not.
  TempDir a, b;
  save_small(a.str(), 1);
  save_small(b.str(), 2);
  std::vector<std::string> errors(2);
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(1), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    errors[static_cast<size_t>(comm.rank())] =
        error_text([&] { load_checkpoint(engine, comm.rank() == 0 ? a.str() : b.str()); });
  });
  for (const std::string& err : errors) {
    CAPTURE(err);
    CHECK(err.find("ranks loaded different checkpoints from '") != std::string::npos);
    CHECK(err.find("(rank 0 one at step 1, rank 1 one at step 2;") != std::string::npos);
    CHECK(err.find("Is another job saving to this root?") != std::string::npos);
  }
  // The same checkpoint under two paths is fine.
  fs::create_directory_symlink(a.path, b.path / "alias");
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(1), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    load_checkpoint(engine, comm.rank() == 0 ? a.str() : b / "alias");
    CHECK(engine.progress().applied_steps == 1);
  });
}

TEST_CASE("finding 7: a save in the middle of gradient accumulation is refused, writing nothing") {
  TempDir root;
  with_engine(
      1,
      [&](Engine& engine, Communicator& comm) {
        Backward bw;
        for (int u = engine.layout().num_units() - 1; u >= 0; --u) write_grads<float>(engine, u, comm.rank(), 1, 0, bw);
        CHECK_FALSE(engine.step().boundary);  // 1 of 2 micro-steps
        CHECK(engine.micro_steps_pending() == 1);
        const std::string err = error_text([&] { save_checkpoint(engine, root.str()); });
        CHECK(err.find(fmt::format("save_checkpoint('{}') after 1 of the 2 micro-steps of a gradient accumulation",
                                   root.str())) != std::string::npos);
        CHECK(fs::is_empty(root.path));
        // At the boundary it saves.
        for (int u = engine.layout().num_units() - 1; u >= 0; --u) write_grads<float>(engine, u, comm.rank(), 1, 1, bw);
        CHECK(engine.step().boundary);
        CHECK(engine.micro_steps_pending() == 0);
        save_checkpoint(engine, root.str());
      },
      1, /*accumulation=*/2);
  CHECK(fs::exists(root.path / "step_000002" / "manifest.json"));
}

TEST_CASE("finding 7: write_shard refuses NaN and Inf, naming the unit, the parameter and the element") {
  with_engine(0, [&](Engine& engine, Communicator&) {
    const std::vector<float> before = engine.read_shard(1, 0);
    std::vector<float> bad = before;
    bad[3] = std::nanf("");
    const std::string err = error_text([&] { engine.write_shard(1, 0, bad); });
    CHECK(err.find("write_shard of unit 'b', shard buffer 0: value nan at shard element 3 (parameter 'b.w' element "
                   "3) is not finite") != std::string::npos);
    bad[3] = before[3];
    const ParamLayout& bias = engine.layout().unit(1).params[1];
    REQUIRE(bias.name == "b.b");
    bad[bias.offset + 2] = -INFINITY;
    CHECK(error_text([&] { engine.write_shard(1, 1, bad); }).find("value -inf at shard element") != std::string::npos);
    CHECK(error_text([&] { engine.write_shard(1, 1, bad); }).find("(parameter 'b.b' element 2)") != std::string::npos);
    CHECK(same_bits(engine.read_shard(1, 0), before));
  });
}

TEST_CASE("keep_last: the last N checkpoints by their steps stay, the one just saved always, and nothing else goes") {
  TempDir root;
  fs::create_directories(root.path / "notes");
  spit(root.path / "notes" / "manifest.json", "not a manifest");  // not a ZEST checkpoint: left alone
  spit(root.path / "README", "the user's");
  const auto tags = [&] {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(root.path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  with_engine(0, [&](Engine& e, Communicator& c) {
    CheckpointOptions keep;
    keep.keep_last = 2;
    RankResult r;
    for (int64_t s = 0; s < 4; ++s) {
      run_steps(e, c, runs(1, 0), s, s + 1, r);
      save_checkpoint(e, root.str(), keep);
    }
    CHECK(tags() == std::vector<std::string>{".zest-lock", "README", "latest", "notes", "step_000003", "step_000004"});
    // Another tag counts by its steps, as the others.
    run_steps(e, c, runs(1, 0), 4, 5, r);
    save_checkpoint(e, root.str(), with_tag("extra"));  // keep_last 0: nothing removed
    CHECK(tags().size() == 7);
    run_steps(e, c, runs(1, 0), 5, 6, r);
    save_checkpoint(e, root.str(), keep);
    CHECK(tags() == std::vector<std::string>{".zest-lock", "README", "extra", "latest", "notes", "step_000006"});
    // A removal killed midway leaves a .deleting directory: the next save clears it.
    fs::create_directories(root.path / ".step_000001.deleting.0123456789abcdef" / "x");
    run_steps(e, c, runs(1, 0), 6, 7, r);
    save_checkpoint(e, root.str(), keep);
    CHECK(tags() == std::vector<std::string>{".zest-lock", "README", "latest", "notes", "step_000006", "step_000007"});
    // keep_last 1 after a re-save of the newest tag keeps it alone.
    save_checkpoint(e, root.str(), [] {
      CheckpointOptions o;
      o.keep_last = 1;
      return o;
    }());
    CHECK(tags() == std::vector<std::string>{".zest-lock", "README", "latest", "notes", "step_000007"});
    keep.keep_last = -1;
    CHECK_THROWS_WITH_AS(save_checkpoint(e, root.str(), keep), doctest::Contains("keep_last -1"), Error);
  });
  CHECK(load_small(root.str()) == 7);
}
