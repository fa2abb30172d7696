// Latency of the caching allocator's cached alloc+free path against the raw
// allocator it sits on.
//
// The caching allocator exists because the raw path is expensive on a GPU:
// cudaMalloc costs tens of microseconds (more for large sizes) and cudaFree
// synchronizes the whole device, stalling every stream. Once a training loop
// has run a step, every request should be a cache hit, a lookup in a sorted
// set under one lock, which should cost well under a microsecond. This program
// checks that claim and shows how far the two paths are apart.
//
// Part 1 times one allocate followed by one free of a fixed size, each pair
// timed on its own with the host clock, after a warm-up that takes the cache
// miss (and CUDA context creation) out of the numbers. Part 2 replays one
// seeded mixed workload against both paths from a cold cache, so its tail
// includes the misses a real run still takes, and the split and merge work
// that mixed sizes cause.
//
//   allocator_bench [--device host|cuda:N] [--iters N] [--quick]
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/cli.h"
#include "zest/core/check.h"
#include "zest/core/device.h"
#include "zest/core/stream.h"
#include "zest/core/units.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/raw_allocator.h"

namespace {

using zest::kKiB;
using zest::kMiB;
using Clock = std::chrono::steady_clock;

constexpr size_t kDefaultIters = 2000;
constexpr size_t kQuickIters = 500;
// More is a typo: the run would take minutes and the samples gigabytes.
constexpr int64_t kMaxIters = 10'000'000;
constexpr size_t kWarmup = 10;
constexpr size_t kMaxLive = 64;
constexpr size_t kMinMixedSize = 512;
constexpr size_t kMaxMixedSize = 16 * kMiB;

struct Options {
  zest::Device device;
  size_t iters = kDefaultIters;
  bool quick = false;
};

void print_usage(std::FILE* out) {
  fmt::print(out,
             "usage: allocator_bench [--device host|cuda:N] [--iters N] [--quick]\n"
             "  --device  where to allocate (default host)\n"
             "  --iters   alloc+free pairs per size up to 1 MiB; fewer above (default {}, or {}\n"
             "            with --quick); the mixed workload runs 4x this many operations\n"
             "  --quick   leave out 256 MiB and use fewer iterations\n",
             kDefaultIters, kQuickIters);
}

// Returns an exit code when the program should stop here; throws zest::Error
// for a bad value.
std::optional<int> parse_args(int argc, char** argv, Options& opt) {
  cli::App app;
  app.set_help_flag();  // print_usage is the help
  bool help = false;
  std::string device = "host";
  int64_t iters = 0;
  app.add_flag("-h,--help", help);
  app.add_flag("--quick", opt.quick);
  app.add_option("--device", device);
  app.add_option("--iters", iters)->check(cli::Range(int64_t{1}, static_cast<int64_t>(kMaxIters)));
  try {
    app.parse(argc, argv);
  } catch (const cli::UsageError& e) {
    fmt::print(stderr, "allocator_bench: {}\n", e.what());
    print_usage(stderr);
    return 2;
  }
  if (help) {
    print_usage(stdout);
    return 0;
  }
  opt.device = zest::parse_device(device);
  opt.iters = iters > 0 ? static_cast<size_t>(iters) : opt.quick ? kQuickIters : kDefaultIters;
  return std::nullopt;
}

int64_t elapsed_ns(Clock::time_point begin, Clock::time_point end) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count();
}

struct Summary {
  int64_t median = 0;
  int64_t p99 = 0;
};

// Nearest-rank percentiles: always a value that was measured.
Summary summarize(std::vector<int64_t> samples) {
  ZEST_INTERNAL_ASSERT(!samples.empty());
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double q) {
    const auto k = static_cast<size_t>(std::ceil(q * static_cast<double>(samples.size())));
    return samples[std::max<size_t>(k, 1) - 1];
  };
  return {rank(0.50), rank(0.99)};
}

// The floor under every number below: one steady_clock::now() pair.
int64_t clock_overhead_ns() {
  std::vector<int64_t> samples(10000);
  for (int64_t& s : samples) {
    const auto t0 = Clock::now();
    const auto t1 = Clock::now();
    s = elapsed_ns(t0, t1);
  }
  return summarize(std::move(samples)).median;
}

std::unique_ptr<zest::RawAllocator> make_raw(zest::Device device) {
  return device.is_host() ? zest::make_host_allocator() : zest::make_cuda_allocator(device.index());
}

// A raw allocator says "no memory" with nullptr; the caching allocator throws.
void* raw_allocate(zest::RawAllocator& raw, size_t size) {
  void* p = raw.allocate(size);
  ZEST_CHECK(p != nullptr, "the raw allocator ({}) has no memory for {}; try --quick",
             raw.name(), zest::format_bytes(static_cast<int64_t>(size)));
  return p;
}

// Samples for one size: as many bytes in all as `iters` pairs of 1 MiB, so
// that large sizes (slow on every raw path: mmap, or cudaMalloc) do not
// dominate the run; never more than `iters`, and at least 50 so the largest
// sizes still have a stable median (their p99 is then the maximum). Raw CUDA
// gets a quarter of that, still at least 50: cudaMalloc costs tens of
// microseconds, cudaFree synchronizes the device, and a few hundred samples
// already pin its median.
size_t samples_for(size_t size, size_t iters, bool raw_cuda) {
  const size_t floor = std::min<size_t>(50, iters);
  const size_t n = std::clamp(iters * kMiB / size, floor, iters);
  return raw_cuda ? std::max(floor, n / 4) : n;
}

// Times `n` allocate+free pairs, each on its own, after kWarmup untimed ones.
// Nothing touches the memory: neither allocator does, and touching it would
// time page faults instead of the allocator.
template <typename Alloc, typename Free>
std::vector<int64_t> time_pairs(size_t n, Alloc&& alloc, Free&& free) {
  for (size_t i = 0; i < kWarmup; ++i) free(alloc());
  std::vector<int64_t> samples(n);
  for (int64_t& s : samples) {
    const auto t0 = Clock::now();
    void* p = alloc();
    free(p);
    const auto t1 = Clock::now();
    s = elapsed_ns(t0, t1);
  }
  return samples;
}

// One step of the mixed workload: allocate `size` bytes, or (size 0) free the
// live buffer at `victim`, which the last live buffer then replaces.
struct Op {
  size_t size = 0;
  size_t victim = 0;
};

// Drawn from raw mt19937_64 bits, not std distributions, whose output differs
// between standard libraries: the same seed gives the same workload anywhere.
std::vector<Op> make_workload(size_t steps) {
  std::mt19937_64 rng(42);
  const double log_min = std::log(static_cast<double>(kMinMixedSize));
  const double log_max = std::log(static_cast<double>(kMaxMixedSize));
  std::vector<Op> ops;
  ops.reserve(steps);
  size_t live = 0;
  for (size_t i = 0; i < steps; ++i) {
    const bool coin = (rng() >> 63) != 0;
    if (live == 0 || (live < kMaxLive && coin)) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      const auto size = static_cast<size_t>(std::exp(log_min + u * (log_max - log_min)));
      ops.push_back({std::clamp(size, kMinMixedSize, kMaxMixedSize), 0});
      ++live;
    } else {
      ops.push_back({0, static_cast<size_t>(rng() % live)});
      --live;
    }
  }
  return ops;
}

struct MixedTimes {
  std::vector<int64_t> alloc;
  std::vector<int64_t> free;
};

template <typename Alloc, typename Free>
MixedTimes replay(const std::vector<Op>& ops, Alloc&& alloc, Free&& free) {
  MixedTimes t;
  std::vector<std::pair<void*, size_t>> live;
  live.reserve(kMaxLive);
  for (const Op& op : ops) {
    if (op.size != 0) {
      const auto t0 = Clock::now();
      void* p = alloc(op.size);
      const auto t1 = Clock::now();
      t.alloc.push_back(elapsed_ns(t0, t1));
      live.emplace_back(p, op.size);
    } else {
      const auto [p, size] = live[op.victim];
      live[op.victim] = live.back();
      live.pop_back();
      const auto t0 = Clock::now();
      free(p, size);
      const auto t1 = Clock::now();
      t.free.push_back(elapsed_ns(t0, t1));
    }
  }
  for (const auto& [p, size] : live) free(p, size);
  return t;
}

std::string size_label(size_t size) {
  if (size % kMiB == 0) return fmt::format("{} MiB", size / kMiB);
  if (size % kKiB == 0) return fmt::format("{} KiB", size / kKiB);
  return fmt::format("{} B", size);
}

void print_row(std::string_view label, const Summary& raw, const Summary& cached) {
  const double ratio =
      static_cast<double>(raw.median) / static_cast<double>(std::max<int64_t>(cached.median, 1));
  fmt::print("{:>12} {:>14} {:>14} {:>16} {:>16} {:>10.2f}\n", label, raw.median, raw.p99,
             cached.median, cached.p99, ratio);
}

std::string compiler() {
#if defined(__clang__)
  return fmt::format("clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  return fmt::format("gcc {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
  return "an unknown compiler";
#endif
}

void run(const Options& opt) {
  const zest::Device device = opt.device;
  const zest::Stream stream = zest::Stream::default_for(device);
  const std::unique_ptr<zest::RawAllocator> raw = make_raw(device);
  zest::CachingAllocator cached(make_raw(device), zest::AllocatorConfig{});

  const std::string_view build_type = ZEST_BENCH_BUILD_TYPE;
  fmt::print("# allocator_bench: device {}, raw allocator '{}' vs a CachingAllocator on a "
             "second one\n", device.str(), raw->name());
  fmt::print("# zest {}, {} build, {}, CUDA backend {} ({} GPU(s) visible)\n", ZEST_VERSION_STRING,
             build_type.empty() ? "unnamed" : build_type, compiler(),
             ZEST_WITH_CUDA ? "on" : "off", zest::cuda_device_count());
  fmt::print("# clock overhead (steady_clock, empty interval): median {} ns, included below\n",
             clock_overhead_ns());
  fmt::print("# samples per size: min({0}, max(50, {0} * 1 MiB / size)){1}\n", opt.iters,
             device.is_cuda() ? "; raw cudaMalloc a quarter (min 50)" : "");
  fmt::print("#\n# {:>10} {:>14} {:>14} {:>16} {:>16} {:>10}\n", "size", "raw median ns",
             "raw p99 ns", "cached median ns", "cached p99 ns", "ratio");

  // On the host the raw baseline is glibc's aligned_alloc, which caches small
  // blocks itself: small raw sizes are fast, faster than the cache. From the
  // mmap threshold (128 KiB) up each raw pair is an mmap and a munmap: glibc
  // raises that threshold when a large malloc'ed block is freed, but not for
  // the page-aligned blocks the host raw allocator asks for.
  std::vector<size_t> sizes = {512, 4 * kKiB, 64 * kKiB, kMiB, 4 * kMiB, 32 * kMiB, 256 * kMiB};
  if (opt.quick) sizes.pop_back();
  for (const size_t size : sizes) {
    const Summary r = summarize(time_pairs(
        samples_for(size, opt.iters, device.is_cuda()), [&] { return raw_allocate(*raw, size); },
        [&](void* p) { raw->deallocate(p, size); }));
    const Summary c = summarize(time_pairs(
        samples_for(size, opt.iters, false), [&] { return cached.allocate(size, stream); },
        [&](void* p) { cached.free(p); }));
    print_row(size_label(size), r, c);
  }

  // A fresh cache, so its stats describe this workload alone.
  const std::vector<Op> ops = make_workload(4 * opt.iters);
  const MixedTimes mr = replay(
      ops, [&](size_t size) { return raw_allocate(*raw, size); },
      [&](void* p, size_t size) { raw->deallocate(p, size); });
  zest::CachingAllocator mixed_cache(make_raw(device), zest::AllocatorConfig{});
  const MixedTimes mc = replay(
      ops, [&](size_t size) { return mixed_cache.allocate(size, stream); },
      [&](void* p, size_t) { mixed_cache.free(p); });

  auto all = [](const MixedTimes& t) {
    std::vector<int64_t> v = t.alloc;
    v.insert(v.end(), t.free.begin(), t.free.end());
    return v;
  };
  print_row("mixed alloc", summarize(mr.alloc), summarize(mc.alloc));
  print_row("mixed free", summarize(mr.free), summarize(mc.free));
  print_row("mixed all", summarize(all(mr)), summarize(all(mc)));

  const zest::AllocatorStats s = mixed_cache.stats();
  const auto allocs = static_cast<int64_t>(mc.alloc.size());
  const double hit_rate = 1.0 - static_cast<double>(s.num_raw_allocs) / static_cast<double>(allocs);
  const auto bytes = [](int64_t b) { return zest::format_bytes(b); };
  fmt::print("#\n# mixed: {} ops ({} allocs, {} frees), cold cache, seed 42, <= {} live,\n",
             ops.size(), allocs, mc.free.size(), kMaxLive);
  fmt::print("#   sizes log-uniform in [{}, {}]\n", size_label(kMinMixedSize),
             size_label(kMaxMixedSize));
  fmt::print("# cache after mixed: {} raw allocs for {} allocs (hit rate {:.2f}%), reserved {},\n",
             s.num_raw_allocs, allocs, 100.0 * hit_rate,
             bytes(at(s.reserved_bytes, zest::StatPool::kAggregate).current));
  fmt::print("#   peak reserved {}, peak allocated {}\n",
             bytes(at(s.reserved_bytes, zest::StatPool::kAggregate).peak),
             bytes(at(s.allocated_bytes, zest::StatPool::kAggregate).peak));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options opt;
    if (const std::optional<int> exit_code = parse_args(argc, argv, opt)) return *exit_code;
    run(opt);
  } catch (const zest::Error& e) {
    fmt::print(stderr, "allocator_bench: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "allocator_bench: unexpected error: {}\n", e.what());
    return 1;
  }
  return 0;
}
