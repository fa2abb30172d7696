// Helpers of the checkpoint safety tests: temp roots, a small engine that
// saves and loads, manifests edited and re-sealed as an attacker would, and
// running a step in a child process under a time limit (so a hang fails the
// test in seconds instead of blocking ctest).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "checkpoint/temp_dir.h"
#include "engine/engine_harness.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/checkpoint/checkpoint_reader.h"
#include "zest/core/check.h"
#include "zest/core/crc32.h"
#include "zest/core/file_io.h"

namespace zest::test {
namespace fs = std::filesystem;

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  std::string text(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)), '\0');
  in.seekg(0);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  return text;
}

inline CheckpointOptions with_tag(const std::string& tag) {
  CheckpointOptions o;
  o.tag = tag;
  return o;
}

inline void spit(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// Every regular file under `dir` (recursively) with its bytes: a snapshot to
// compare before and after an operation that must not touch it.
inline std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_symlink()) {
      out[e.path().string()] = "link -> " + fs::read_symlink(e.path()).string();
    } else if (e.is_regular_file()) {
      out[e.path().string()] = slurp(e.path());
    } else if (e.is_directory()) {
      out[e.path().string()] = "<dir>";
    }
  }
  return out;
}

// The manifest of a checkpoint directory, as JSON, and written back with a
// matching checksum, as someone editing it on purpose (or a bug in another
// writer) would: the checks below the checksum must still hold.
inline nlohmann::json read_manifest_json(const fs::path& ckpt_dir) {
  return nlohmann::json::parse(slurp(ckpt_dir / "manifest.json"));
}
inline void write_manifest_resealed(const fs::path& ckpt_dir, nlohmann::json doc) {
  doc.erase("manifest_crc32");
  const std::string canonical = doc.dump();
  doc["manifest_crc32"] = fmt::format("{:08x}", crc32(canonical.data(), canonical.size()));
  spit(ckpt_dir / "manifest.json", doc.dump(1) + "\n");
}

// A small stage-1 engine on one in-process rank: `steps` steps, then fn.
inline void with_engine(int steps, const std::function<void(Engine&, Communicator&)>& fn, int stage = 1,
                        int accumulation = 1) {
  auto comm = std::move(make_inprocess_group(1)[0]);
  CachingAllocator alloc(make_host_allocator());
  EngineConfig config = base_config(stage);
  config.gradient_accumulation_steps = accumulation;
  Engine engine(config, *comm, alloc, Stream::default_for(Device::host()));
  register_model(engine);
  engine.finalize(init_values);
  RankResult r;
  run_steps(engine, *comm, runs(1, steps), 0, steps, r);
  fn(engine, *comm);
}

// On `world` in-process ranks: a finalized engine of `config` (the small
// model, unless `model` registers another), then fn on every rank.
inline void on_each_rank(int world, const EngineConfig& config, const std::function<void(Engine&, Communicator&)>& fn,
                         const std::function<void(Engine&)>& model = register_model) {
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    model(engine);
    engine.finalize(init_values);
    fn(engine, comm);
  });
}

// Saves a checkpoint of the small model after `steps` steps.
inline std::string save_small(const std::string& root, int steps, const std::string& tag = "") {
  std::string dir;
  with_engine(steps, [&](Engine& e, Communicator&) { dir = save_checkpoint(e, root, with_tag(tag)); });
  return dir;
}

// Loads `root` into a fresh small engine (which checks every size and
// CRC-32) and returns the applied steps it resumed at.
inline int64_t load_small(const std::string& root, const std::string& tag = "") {
  int64_t applied = -1;
  with_engine(0, [&](Engine& e, Communicator&) {
    load_checkpoint(e, root, with_tag(tag));
    applied = e.progress().applied_steps;
  });
  return applied;
}

// The message of the zest::Error fn throws ("" if it returns).
inline std::string error_text(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct ChildOutcome {
  bool finished = false;  // exited on its own within the limit
  int exit_code = -1;
  std::string text;  // what the child wrote to its pipe
};

struct Child {
  pid_t pid = -1;
  int fd = -1;  // the read end of the child's report pipe
};

// Forks a child that runs fn and writes what it returns (or the exception's
// text, exiting 1) to its report pipe, then exits.
inline Child start_child(const std::function<std::string()>& fn) {
  int fds[2];
  ZEST_CHECK(::pipe(fds) == 0, "pipe failed");
  const pid_t pid = ::fork();
  ZEST_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    ::close(fds[0]);
    int code = 0;
    std::string text;
    try {
      text = fn();
    } catch (const std::exception& e) {
      text = std::string("exception: ") + e.what();
      code = 1;
    }
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fds[1], text.data() + done, text.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  return {pid, fds[0]};
}

// Waits for the child; one still running after `limit` is killed and
// reported as not finished (a hang fails in seconds, not at ctest's limit).
inline ChildOutcome wait_child(Child& child, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  ChildOutcome out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const auto drain = [&] {
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::read(child.fd, buf, sizeof(buf))) > 0) out.text.append(buf, static_cast<size_t>(n));
  };
  int status = 0;
  while (true) {
    drain();
    if (::waitpid(child.pid, &status, WNOHANG) == child.pid) {
      drain();
      out.finished = WIFEXITED(status);
      out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child.pid, SIGKILL);
      ::waitpid(child.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::close(child.fd);
  child = {};
  return out;
}

inline ChildOutcome run_in_child(const std::function<std::string()>& fn,
                                 std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  Child c = start_child(fn);
  return wait_child(c, limit);
}

}  // namespace zest::test
