// Hostile files in a checkpoint root (issue 12, findings 6, 8, 10, 12, 13,
// 14): every one a clear error naming the file, in bounded time and memory,
// with nothing echoed raw into a message.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include "checkpoint/checkpoint_test_util.h"
#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/checkpoint/safetensors.h"

using namespace zest;
using namespace zest::test;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Loads `root` in a child under a time limit: a reader that blocks (a FIFO
// opened without O_NONBLOCK) fails the test in seconds.
std::string load_error_within_limit(const std::string& root) {
  const ChildOutcome o = run_in_child(
      [&] {
        load_small(root);
        return std::string("loaded");
      },
      std::chrono::seconds(20));
  CHECK(o.finished);  // no hang
  return o.text;
}

}  // namespace

TEST_CASE("finding 10: a FIFO in place of latest, the manifest, a shard or a .safetensors file: an error, no hang") {
  TempDir root;
  save_small(root.str(), 1);
  const fs::path ckpt = root.path / "step_000001";
  const auto fifo_at = [](const fs::path& p) {
    fs::remove(p);
    REQUIRE(::mkfifo(p.c_str(), 0644) == 0);
  };
  SUBCASE("latest") {
    fifo_at(root.path / "latest");
    const std::string text = load_error_within_limit(root.str());
    CHECK(has(text, fmt::format("'{}' is a FIFO (named pipe), not a regular file", root / "latest")));
  }
  SUBCASE("manifest.json") {
    fifo_at(ckpt / "manifest.json");
    const std::string text = load_error_within_limit(root.str());
    CHECK(has(text, fmt::format("'{}' is a FIFO (named pipe), not a regular file", (ckpt / "manifest.json").string())));
  }
  SUBCASE("a shard") {
    fifo_at(ckpt / "rank_00000.bin");
    const std::string text = load_error_within_limit(root.str());
    CHECK(has(text, fmt::format("'{}' is a FIFO (named pipe), not a regular file", (ckpt / "rank_00000.bin").string())));
  }
  SUBCASE("a .safetensors file") {
    const std::string path = root / "model.safetensors";
    REQUIRE(::mkfifo(path.c_str(), 0644) == 0);
    const ChildOutcome o = run_in_child([&] {
      (void)SafetensorsFile::open(path);
      return std::string("opened");
    });
    CHECK(o.finished);
    CHECK(has(o.text, fmt::format("'{}' is a FIFO (named pipe), not a regular file", path)));
  }
}

TEST_CASE("finding 13: a huge `latest` is refused by its size, unread, and binary bytes in it are escaped") {
  TempDir root;
  save_small(root.str(), 1);
  const fs::path latest = root.path / "latest";
  SUBCASE("1 GiB (sparse): refused before a byte is read") {
    fs::resize_file(latest, uint64_t{1} << 30);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string err = error_text([&] { load_small(root.str()); });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(has(err, fmt::format("'{}' has 1073741824 bytes, more than the 4096 a file of its kind may have",
                               latest.string())));
    CHECK(seconds < 5.0);  // reading it took 38 s before; a refusal by size takes microseconds
  }
  SUBCASE("CR, LF, NUL, ESC and high bytes are escaped in the message") {
    spit(latest, std::string("step\r\n\0\x1b[2J\xff", 12));
    const std::string err = error_text([&] { load_small(root.str()); });
    CHECK(has(err, fmt::format("'{}' holds \"step\\r\\n\\x00\\x1b[2J\\xff\", which is not a checkpoint directory name",
                               latest.string())));
    for (const char c : err) CHECK((c >= 0x20 && c < 0x7f));
  }
  SUBCASE("a long line is cut") {
    spit(latest, std::string(4000, 'x') + "\n");
    const std::string err = error_text([&] { load_small(root.str()); });
    CHECK(has(err, "... (4001 bytes)"));
    CHECK(err.size() < 1000);
  }
  SUBCASE("a tag that leaves the root") {
    spit(latest, "../elsewhere\n");
    CHECK(has(error_text([&] { load_small(root.str()); }), "holds \"../elsewhere\\n\", which is not a checkpoint"));
  }
}

TEST_CASE("finding 6: the manifest's checksum catches swapped files[] and a flipped applied_steps") {
  TempDir root;
  // Two shard files (stage 1 on 2 ranks) to swap.
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(1), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    RankResult r;
    run_steps(engine, comm, runs(2, 1), 0, 1, r);
    save_checkpoint(engine, root.str());
  });
  const fs::path ckpt = root.path / "step_000001";
  const std::string manifest = (ckpt / "manifest.json").string();
  const std::string pristine = slurp(manifest);
  const auto corrupt_message = [&] {
    return fmt::format("checkpoint manifest '{}' is corrupt: its content has CRC-32", manifest);
  };
  const auto verify = [&] { CheckpointReader(ckpt.string()).verify_all(); };
  verify();

  SUBCASE("swapped files[] entries (names and CRCs consistent with each other)") {
    nlohmann::json doc = nlohmann::json::parse(pristine);
    std::swap(doc["files"][0], doc["files"][1]);
    spit(manifest, doc.dump(1));
    CHECK(has(error_text(verify), corrupt_message()));
  }
  SUBCASE("applied_steps flipped by one bit") {
    std::string text = pristine;
    const size_t at = text.find("\"applied_steps\": 1");
    REQUIRE(at != std::string::npos);
    text[at + 17] = '3';
    spit(manifest, text);
    CHECK(has(error_text(verify), corrupt_message()));
    CHECK(has(error_text([&] { load_small(root.str()); }), corrupt_message()));
  }
  SUBCASE("the checksum field removed") {
    nlohmann::json doc = nlohmann::json::parse(pristine);
    doc.erase("manifest_crc32");
    spit(manifest, doc.dump(1));
    CHECK(has(error_text(verify), "has no \"manifest_crc32\"; it was damaged or edited"));
  }
  SUBCASE("whitespace changed only: still valid") {
    spit(manifest, nlohmann::json::parse(pristine).dump(4));
    verify();
  }
  SUBCASE("unknown compute_dtype and optimizer, even with a matching checksum") {
    nlohmann::json doc = nlohmann::json::parse(pristine);
    doc["compute_dtype"] = "fp64";
    write_manifest_resealed(ckpt, doc);
    CHECK(has(error_text(verify), "compute_dtype is \"fp64\", which ZEST does not know; expected one of \"fp32\", "
                                  "\"fp16\", \"bf16\""));
    doc = nlohmann::json::parse(pristine);
    doc["optimizer"] = "Lion";
    write_manifest_resealed(ckpt, doc);
    CHECK(has(error_text(verify), "optimizer is \"Lion\", which ZEST does not know; expected one of \"AdamW\", "
                                  "\"Adam\", \"SGD\""));
  }
}

TEST_CASE("finding 8: a manifest nested 100,000 deep is an error naming the file, not a crash") {
  TempDir root;
  save_small(root.str(), 1);
  const fs::path manifest = root.path / "step_000001" / "manifest.json";
  spit(manifest, std::string(100'000, '[') + std::string(100'000, ']'));
  const std::string err = error_text([&] { load_small(root.str()); });
  CHECK(has(err, fmt::format("checkpoint manifest '{}': byte 9", manifest.string())));
  CHECK(has(err, "values nest 9 levels deep here, more than the 8 this file may have"));
}

TEST_CASE("finding 14: numbers out of range in a manifest name the file and say what the range is") {
  TempDir root;
  save_small(root.str(), 1);
  const fs::path ckpt = root.path / "step_000001";
  const std::string manifest = (ckpt / "manifest.json").string();
  nlohmann::json doc = read_manifest_json(ckpt);
  std::string text = doc.dump(1);
  SUBCASE("1e400") {
    const std::string scale = doc["progress"]["loss_scaler"]["scale"].dump();
    text.replace(text.find("\"scale\": " + scale), 9 + scale.size(), "\"scale\": 1e400");
    spit(manifest, text);
    const std::string err = error_text([&] { load_small(root.str()); });
    CHECK(has(err, fmt::format("checkpoint manifest '{}': byte", manifest)));
    CHECK(has(err, "(at progress.loss_scaler.scale): the number 1e400 is beyond a double's range"));
  }
  SUBCASE("2^63 is not negative, it is too large") {
    doc["progress"]["applied_steps"] = uint64_t{1} << 63;
    write_manifest_resealed(ckpt, doc);
    const std::string err = error_text([&] { load_small(root.str()); });
    CHECK(has(err, fmt::format("checkpoint manifest '{}': progress.applied_steps is 9223372036854775808, above the "
                               "largest 64-bit integer",
                               manifest)));
  }
}

TEST_CASE("finding 12: opening a safetensors header grows about linearly with its tensor count") {
  // n one-element F32 tensors. Before, a header of n tensors cost O(n^2)
  // (20k: 3.5 s, 40k: 16 s, 100k > 30 s). The ratio of 100k to 10k is about
  // 10-25 for n log n (caches included) and 100 for n^2: the bound of 50
  // leaves room for a loaded machine without letting quadratic through.
  const auto file_of = [](size_t n) {
    std::string header = "{";
    for (size_t i = 0; i < n; ++i) {
      header += fmt::format("{}\"t{}\":{{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[{},{}]}}", i ? "," : "", i,
                            4 * i, 4 * i + 4);
    }
    header += "}";
    std::string bytes(8, '\0');
    const uint64_t len = header.size();
    std::memcpy(bytes.data(), &len, 8);
    bytes += header;
    bytes.append(4 * n, '\0');
    return bytes;
  };
  const auto open_seconds = [](const std::string& bytes, size_t n) {
    double best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      const SafetensorsFile f = SafetensorsFile::from_source(
          make_safetensors_memory_source(std::as_bytes(std::span(bytes.data(), bytes.size()))), "mem");
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      CHECK(f.tensors().size() == n);
    }
    return best;
  };
  const std::string small = file_of(10'000), large = file_of(100'000);
  const double t_small = open_seconds(small, 10'000);
  const double t_large = open_seconds(large, 100'000);
  MESSAGE(fmt::format("safetensors open: 10k tensors {:.3f} s, 100k {:.3f} s, ratio {:.1f}", t_small, t_large,
                      t_large / t_small));
  CHECK(t_large / t_small < 50.0);
  CHECK(t_large < 20.0);
}

TEST_CASE("a shard file shortened while the loader views its pages: an error naming the file, not SIGBUS") {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  // Three pages and a half of F32 values, as the loader views them
  // (FileView): the file is cut to one page after the view is made.
  const size_t numel = 3584;
  std::vector<float> values(numel);
  for (size_t i = 0; i < numel; ++i) values[i] = static_cast<float>(i);
  {
    SafetensorsWriter w(path, {{"w", "F32", {static_cast<int64_t>(numel)}}});
    w.write_tensor("w", std::as_bytes(std::span(values)));
    w.finish();
  }
  const ChildOutcome o = run_in_child(
      [&] {
        const SafetensorsFile f = SafetensorsFile::open(path);
        std::optional<FileView> v = f.view_range("w", 0, numel * 4);
        ZEST_CHECK(v.has_value(), "a file source shows its bytes in place");
        v->populate(0, 4096);  // before the cut: fine
        ZEST_CHECK(std::memcmp(v->bytes().data(), values.data(), 4096) == 0, "the view shows the file's bytes");
        fs::resize_file(path, 4096);
        v->populate(0, numel * 4);  // past the new end
        return std::string("populated");
      },
      std::chrono::seconds(20));
  CHECK(o.finished);  // a SIGBUS would end the child by a signal
  CHECK(o.exit_code == 1);
  CHECK(has(o.text, "model.safetensors"));
  CHECK(has(o.text, "the file ends early: it was truncated or replaced while open"));
}
