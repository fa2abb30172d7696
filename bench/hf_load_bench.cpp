// Loading a Hugging Face checkpoint directory (import_hf) into an engine on
// W in-process ranks at stage 3, against a raw read of the same files in the
// same run: pread of every file, start to end, in 8 MiB pieces, on one
// thread, into one reused buffer ("raw", the bytes dropped as cat >
// /dev/null drops them: the baseline) and into memory as large as the
// files ("kept": the least a load must do, its bytes landing in memory
// rather than in a buffer the CPU's cache holds). Two rates of the load,
// each the files' bytes over a wall time:
// "read" is HfImportReport::read_seconds (open, header checks, positioned
// reads of each rank's shard; since the one-pass loader stores each unit
// into the master shard and parameters while the next is read, that is
// nearly all of it), "all" up to the engine's parameters gathered; each with
// its percentages of the raw and the kept read's rates (the target of the
// issue "Fine-tune a pretrained model too large for one rank": at least 80%
// of the raw read). Each for a
// trained model and a frozen one (a LoRA base), the file's bytes mapped or
// read with pread. Both read the bf16 file straight into the bf16
// parameters; the trained model's fp32 master weights are widened from them
// when first read (Note [a master widened when first read] in
// engine/engine_load.cpp), a pass of its own that the first step pays:
// "then widen" times it (Engine::widen_deferred_masters), apart from the load.
//
// Cold runs drop the page cache first (echo 3 > /proc/sys/vm/drop_caches,
// which needs root); where that is refused only warm runs are reported, and
// the output says so.
//
//   hf_load_bench [--mb N] [--ranks W] [--shard-mb S] [--repeat R] [--cache cold|warm|both]
//                 [--read map|pread|both] [--dir PATH]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/core/float16.h"
#include "zest/core/system_error.h"
#include "zest/engine/engine.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/hf/hf_import.h"
#include "zest/memory/raw_allocator.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  size_t mb = 256;       // of bf16 tensor data
  int ranks = 2;         // the largest world; 1 is always run too
  size_t shard_mb = 64;  // max shard size
  int repeat = 3;
  std::string dir;       // empty: a temporary directory, removed at the end
  std::string cache = "both";  // cold, warm or both
  std::string read = "pread";  // pread, map or both (HfImportOptions::map_files)
};

constexpr int64_t kCols = 2048;
constexpr int kTensorsPerUnit = 4;

// The model: units of kTensorsPerUnit [rows, kCols] tensors, rows chosen so
// the whole is about opt.mb MiB of bf16.
struct Model {
  int units = 0;
  int64_t rows = 0;
  std::string name(int u, int t) const { return fmt::format("model.layers.{}.w{}.weight", u, t); }
};

Model model_for(const Options& opt) {
  Model m;
  m.rows = 1024;
  const size_t tensor_bytes = static_cast<size_t>(m.rows * kCols) * 2;
  m.units = static_cast<int>(std::max<size_t>(1, (opt.mb << 20) / (tensor_bytes * kTensorsPerUnit)));
  return m;
}

// The directory as save_pretrained writes it: shards of at most shard_mb,
// the index and a config.
void write_checkpoint(const Options& opt, const Model& m) {
  fs::create_directories(opt.dir);
  const uint64_t tensor_bytes = static_cast<uint64_t>(m.rows * kCols) * 2;
  const uint64_t per_shard = std::max<uint64_t>(1, (opt.shard_mb << 20) / tensor_bytes);
  const int tensors = m.units * kTensorsPerUnit;
  const int shards = static_cast<int>((static_cast<uint64_t>(tensors) + per_shard - 1) / per_shard);
  std::vector<uint16_t> values(static_cast<size_t>(m.rows * kCols));
  std::string weight_map;
  for (int s = 0; s < shards; ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    std::vector<zest::SafetensorsEntry> entries;
    for (int k = s * static_cast<int>(per_shard); k < std::min(tensors, (s + 1) * static_cast<int>(per_shard)); ++k) {
      entries.push_back({m.name(k / kTensorsPerUnit, k % kTensorsPerUnit), "BF16", {m.rows, kCols}});
      weight_map += fmt::format("{}\"{}\": \"{}\"", weight_map.empty() ? "" : ", ", entries.back().name, file);
    }
    zest::SafetensorsWriter w((fs::path(opt.dir) / file).string(), entries, {{"format", "pt"}});
    for (const zest::SafetensorsEntry& e : entries) {
      for (size_t i = 0; i < values.size(); ++i) {
        values[i] = zest::float_to_bf16_bits(static_cast<float>((i * 7 + e.name.size()) % 255) / 128.0f - 1.0f);
      }
      w.write_tensor(e.name, std::as_bytes(std::span(values)));
    }
    w.finish();
  }
  std::ofstream(fs::path(opt.dir) / "model.safetensors.index.json")
      << fmt::format("{{\"metadata\": {{\"total_size\": {}}}, \"weight_map\": {{{}}}}}\n",
                     tensor_bytes * static_cast<uint64_t>(tensors), weight_map);
  std::ofstream(fs::path(opt.dir) / "config.json") << "{\"model_type\": \"llama\"}\n";
}

std::vector<std::string> safetensors_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Drops the page cache; false where that is not allowed.
bool drop_caches() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "3\n", 2) == 2;
  ::close(fd);
  return ok;
}

constexpr size_t kRawPiece = size_t{8} << 20;

// Seconds to pread every file whole, in 8 MiB pieces: into one reused
// buffer (`kept` null), or one after another into `kept` (memory as large as
// the files, from the engine's host allocator and touched before, as the
// engine's is).
double raw_read(const std::vector<std::string>& files, uint64_t& bytes, std::byte* kept) {
  std::vector<std::byte> buf(kRawPiece);
  bytes = 0;
  const auto start = Clock::now();
  for (const std::string& path : files) {
    const zest::ReadOnlyFile f(path);
    for (uint64_t off = 0; off < f.size(); off += kRawPiece) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kRawPiece, f.size() - off));
      f.read_at(off, std::span(kept != nullptr ? kept + bytes : buf.data(), n));
      bytes += n;
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

uint64_t files_bytes(const std::vector<std::string>& files) {
  uint64_t total = 0;
  for (const std::string& path : files) total += fs::file_size(path);
  return total;
}

struct LoadTimes {
  double read = 0;   // open, checks, positioned reads and conversion (HfImportReport::read_seconds)
  double total = 0;  // and the engine taking the values
  double widen = 0;  // after it, the deferred master weights widened
};

// import_hf on `ranks` ranks at stage 3 (the engines built before the clock
// starts); rank 0's times.
LoadTimes load(const Options& opt, const Model& m, int ranks, bool frozen, bool map_files) {
  LoadTimes times;
  zest::run_inprocess(ranks, [&](zest::Communicator& comm) {
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::EngineConfig config;
    config.zero.stage = 3;
    config.bf16 = true;
    config.optimizer.kind = zest::OptimizerKind::kSgd;
    zest::Engine engine(config, comm, alloc, zest::Stream::default_for(zest::Device::host()));
    for (int u = 0; u < m.units; ++u) {
      std::vector<zest::ParamSpec> specs;
      for (int t = 0; t < kTensorsPerUnit; ++t) specs.push_back({m.name(u, t), {m.rows, kCols}, "default", !frozen});
      engine.add_unit(fmt::format("layer{}", u), specs);
    }
    engine.finalize([](const zest::ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.0f); },
                    zest::InitFrom::kEveryRank);
    engine.all_gather_scalars(std::vector<int64_t>{0});  // start together
    const auto start = Clock::now();
    zest::HfImportOptions options;
    options.map_files = map_files;
    const zest::HfImportReport r = zest::import_hf(engine, opt.dir, options);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    const auto widen_start = Clock::now();
    engine.widen_deferred_masters();
    const double widen = std::chrono::duration<double>(Clock::now() - widen_start).count();
    if (comm.rank() == 0) times = {r.read_seconds, s, widen};
  });
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  cli::App app("hf_load_bench: loading a Hugging Face directory into an engine against a raw read of its files");
  app.add_option("--mb", opt.mb, "MiB of bf16 tensor data")->check(cli::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--ranks", opt.ranks, "the largest world (1 is always run too)")->check(cli::Range(1, 64));
  app.add_option("--shard-mb", opt.shard_mb, "MiB per shard at most")->check(cli::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--repeat", opt.repeat, "runs of each measurement")->check(cli::Range(1, 1000));
  app.add_option("--cache", opt.cache, "page cache: cold (dropped before each run), warm, or both")
      ->check(cli::IsMember({"cold", "warm", "both"}));
  app.add_option("--read", opt.read, "how the load reads: pread (the default), map, or both")
      ->check(cli::IsMember({"map", "pread", "both"}));
  app.add_option("--dir", opt.dir, "where to write the checkpoint (default: a temporary directory, removed)");
  try {
    app.parse(argc, argv);
  } catch (const cli::UsageError& e) {
    return cli::usage_exit("hf_load_bench", e, app.help());  // the help, or the error naming the flag
  }
  try {
    const bool temp = opt.dir.empty();
    if (temp) opt.dir = (fs::temp_directory_path() / fmt::format("zest_hf_bench_{}", zest::unique_suffix())).string();
    const Model m = model_for(opt);
    write_checkpoint(opt, m);
    const std::vector<std::string> files = safetensors_files(opt.dir);
    const bool cold = opt.cache != "warm" && drop_caches();
    ZEST_CHECK(cold || opt.cache != "cold", "hf_load_bench --cache cold: the page cache cannot be dropped here (needs "
               "root to write /proc/sys/vm/drop_caches); run as root or use --cache warm");
    // Other work on the host slows the load (CPU-bound when warm) more than
    // the raw read (a copy): said with the figures.
    std::string load_average = "unknown";  // /proc files report size 0: read as a stream
    std::ifstream("/proc/loadavg") >> load_average;
    fmt::print("hf_load_bench: {} files, {:.0f} MiB of bf16 in {} units, stage 3, {} read threads per rank, build "
               "{}; load average {} on {} CPUs; page cache {}\n",
               files.size(), static_cast<double>(zest::HfCheckpoint::open(opt.dir).tensor_bytes()) / (1 << 20),
               m.units, zest::HfImportOptions{}.read_threads, ZEST_BENCH_BUILD_TYPE, load_average,
               std::thread::hardware_concurrency(),
               cold                  ? "dropped before each cold run"
               : opt.cache == "warm" ? "warm (--cache warm)"
                                     : "cannot be dropped here (not root): warm runs only");
    std::vector<bool> maps;
    if (opt.read != "pread") maps.push_back(true);
    if (opt.read != "map") maps.push_back(false);
    std::vector<int> worlds{1};
    if (opt.ranks > 1) worlds.push_back(opt.ranks);
    std::vector<bool> drops;
    if (cold) drops.push_back(true);
    if (opt.cache != "cold") drops.push_back(false);
    const std::unique_ptr<zest::RawAllocator> host = zest::make_host_allocator();
    const uint64_t all_bytes = files_bytes(files);
    const std::unique_ptr<std::byte, std::function<void(std::byte*)>> kept(
        static_cast<std::byte*>(host->allocate(all_bytes)), [&](std::byte* p) { host->deallocate(p, all_bytes); });
    ZEST_CHECK(kept != nullptr, "hf_load_bench: cannot allocate {} bytes for the kept raw read", all_bytes);
    std::memset(kept.get(), 0, all_bytes);  // touched, as the engine's memory is at finalize
    for (const bool drop : drops) {
      if (!drop) {
        uint64_t bytes = 0;
        raw_read(files, bytes, nullptr);  // warm the cache
      }
      for (int r = 0; r < opt.repeat; ++r) {
        // Each load beside the raw and kept reads just before it: the
        // machine's memory bandwidth drifts between rows (a warm raw read
        // ranged 6-17 GiB/s over a minute on the VM of docs/BENCHMARKS.md).
        for (const bool map : maps) {
          for (const bool frozen : {false, true}) {
            for (const int w : worlds) {
              uint64_t bytes = 0;
              if (drop) drop_caches();
              const double raw = raw_read(files, bytes, nullptr);
              if (drop) drop_caches();
              const double raw_kept = raw_read(files, bytes, kept.get());
              const double mib = static_cast<double>(bytes) / (1 << 20);
              if (drop) drop_caches();
              const LoadTimes t = load(opt, m, w, frozen, map);
              std::string line = fmt::format(
                  "{} {} {} W={}: raw {:.0f}, kept {:.0f}; read {:.0f} MiB/s ({:.0f}% / {:.0f}%), all {:.0f} MiB/s "
                  "({:.0f}% / {:.0f}%)",
                  drop ? "cold" : "warm", map ? "map" : "pread", frozen ? "frozen" : "trained", w, mib / raw,
                  mib / raw_kept, mib / t.read, 100.0 * raw / t.read, 100.0 * raw_kept / t.read, mib / t.total,
                  100.0 * raw / t.total, 100.0 * raw_kept / t.total);
              if (!frozen) line += fmt::format(", then widen {:.0f} ms", 1e3 * t.widen);
              fmt::print("{}\n", line);
            }
          }
        }
      }
    }
    if (temp) fs::remove_all(opt.dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_load_bench: %s\n", e.what());
    return 1;
  }
}
