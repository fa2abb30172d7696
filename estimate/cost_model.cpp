// The cost model's policies:
//   bytes   per collective call, CommCounters::record's ring formula on the
//           call's group, for the calls the engine issues (the unit sizes of
//           unit_sizes.h; engine_grads.cpp, engine_gather.cpp,
//           engine_step.cpp decide which calls): exact, not modelled
//   time    Note [two link classes] and Note [alpha-beta per collective]
//   memory  estimate_memory, unchanged
// A change to which collectives the engine issues is a change here;
// tests/estimate/test_cost_model.cpp compares the bytes with a run's
// counters on every communicator.
#include "zest/estimate/cost_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/estimate/unit_sizes.h"

namespace zest {
namespace {

bool spans_hosts(int per_host, int group_size) { return per_host < group_size; }

// A group of `n` consecutive ranks (shard or hpZ group): its members on one
// host, refusing groups that straddle a host boundary.
int consecutive_per_host(int n, int ranks_per_host, const char* what) {
  if (n <= ranks_per_host) {
    ZEST_CHECK(ranks_per_host % n == 0,
               "{} {} with {} ranks per host: a group would straddle two hosts; the cost model takes groups "
               "within one host (a divisor of the ranks per host) or of whole hosts",
               what, n, ranks_per_host);
    return n;
  }
  ZEST_CHECK(n % ranks_per_host == 0,
             "{} {} with {} ranks per host: a group would hold part of a host; the cost model takes groups "
             "within one host or of whole hosts (a multiple of the ranks per host)",
             what, n, ranks_per_host);
  return ranks_per_host;
}

// MiCS's replica group: ranks r, r + S, r + 2S, ... (one per shard group).
int replica_per_host(int shard, int ranks_per_host) {
  return shard < ranks_per_host ? ranks_per_host / shard : 1;
}

// CommCounters::record's bytes for one call whose `count` is the call's
// (one rank's part for gathers and reduce-scatters, the buffer for
// all-reduces), computed with the same expression so that a sum of these is
// the counters' sum to the bit whenever each call's bytes are whole.
double call_bytes(CollectiveKind kind, size_t count, int n, size_t elem_bytes) {
  const auto w = static_cast<double>(n);
  const double es = static_cast<double>(elem_bytes);
  if (kind == CollectiveKind::kAllReduce) return 2.0 * (w - 1.0) / w * static_cast<double>(count) * es;
  return (w - 1.0) * static_cast<double>(count) * es;
}

uint64_t call_elements(CollectiveKind kind, size_t count, int n) {
  return kind == CollectiveKind::kAllReduce ? count : count * static_cast<uint64_t>(n);
}

class StepBuilder {
 public:
  StepBuilder(const Topology& t, CostEstimate& out) : topology_(t), out_(out) {}

  // `calls` collectives of `count` elements each (as the engine passes it)
  // over groups of `n` ranks, `per_host` of them on each host they span.
  void add(TrafficKind traffic, CollectiveKind kind, int n, int per_host, uint64_t calls, size_t count,
           size_t elem_bytes) {
    if (n <= 1 || calls == 0) return;  // Note [one rank reduces nothing]: no collective runs
    TrafficCost& t = line(traffic, kind, n, per_host);
    const double bytes = call_bytes(kind, count, n, elem_bytes);
    t.calls += calls;
    t.elements += calls * call_elements(kind, count, n);
    t.bytes_per_rank += static_cast<double>(calls) * bytes;
    t.host_link_bytes += static_cast<double>(calls) * host_link_bytes(bytes, n, per_host);
    t.seconds += static_cast<double>(calls) * collective_seconds(kind, bytes, n, per_host, topology_);
  }

 private:
  TrafficCost& line(TrafficKind traffic, CollectiveKind kind, int n, int per_host) {
    for (TrafficCost& t : out_.traffic) {
      if (t.traffic == traffic && t.group_size == n) return t;
    }
    TrafficCost t;
    t.traffic = traffic;
    t.kind = kind;
    t.group_size = n;
    t.link = spans_hosts(per_host, n) ? LinkClass::kInter : LinkClass::kIntra;
    out_.traffic.push_back(t);
    return out_.traffic.back();
  }

  // Note [two link classes]. What one host's inter link carries per
  // direction while every rank runs the call in its group: a ring crosses
  // each host boundary once per direction, carrying what one rank sends, and
  // the host's R ranks are in R / per_host such rings at once (with NCCL's
  // channels spreading one ring's share over the host's NICs); pairwise,
  // each of the R ranks sends its part to each of the n - per_host members
  // elsewhere.
  double host_link_bytes(double bytes, int n, int per_host) const {
    if (!spans_hosts(per_host, n)) return 0.0;
    const auto R = static_cast<double>(topology_.ranks_per_host);
    if (topology_.algorithm == CollectiveAlgorithm::kRing) return R / per_host * bytes;
    return R * bytes / (n - 1) * (n - per_host);
  }

  const Topology& topology_;
  CostEstimate& out_;
};

}  // namespace

void Topology::validate() const {
  ZEST_CHECK(hosts >= 1 && hosts <= (1 << 20), "hosts is {}: expected 1 to 1048576", hosts);
  ZEST_CHECK(ranks_per_host >= 1 && ranks_per_host <= (1 << 20), "ranks_per_host is {}: expected 1 to 1048576",
             ranks_per_host);
  ZEST_CHECK(static_cast<int64_t>(hosts) * ranks_per_host <= (1 << 20), "{} hosts x {} ranks: at most 1048576 ranks",
             hosts, ranks_per_host);
  for (const auto& [name, link] : {std::pair{"intra", intra}, std::pair{"inter", inter}}) {
    ZEST_CHECK(std::isfinite(link.bytes_per_s) && link.bytes_per_s > 0.0,
               "the {} link's bandwidth is {} bytes/s: expected a positive number", name, link.bytes_per_s);
    ZEST_CHECK(std::isfinite(link.latency_s) && link.latency_s >= 0.0,
               "the {} link's latency is {} s: expected 0 or more", name, link.latency_s);
  }
}

std::string_view traffic_kind_name(TrafficKind kind) {
  switch (kind) {
    case TrafficKind::kGradAllReduce: return "gradient all-reduce";
    case TrafficKind::kGradReduceScatter: return "gradient reduce-scatter";
    case TrafficKind::kReplicaAllReduce: return "all-reduce across replicas";
    case TrafficKind::kParamGather: return "parameter all-gather";
    case TrafficKind::kHpzGather: return "hpZ all-gather";
    case TrafficKind::kUpdatedGather: return "all-gather after the update";
  }
  return "?";
}

// Note [alpha-beta per collective]. A call's time is its latency chain plus
// its bytes over the slowest link it loads:
//   ring      (n-1) hops for a gather or reduce-scatter, 2(n-1) for an
//             all-reduce (reduce-scatter then all-gather), each of the
//             slowest link's latency (the inter link's once the ring spans
//             hosts: every step waits for its slowest edge); bytes: a rank's
//             ring bytes over its own intra bandwidth when its neighbour is
//             on its host, and the host link's load over the inter bandwidth
//   pairwise  one exchange (two for an all-reduce) of one latency; bytes:
//             the part for the (per_host - 1) neighbours on the host over
//             the intra bandwidth, the host link's load over the inter one
// The larger of the two transfer times counts (links run at once).
double collective_seconds(CollectiveKind kind, double bytes_per_rank, int group_size, int per_host,
                          const Topology& t) {
  if (group_size <= 1 || bytes_per_rank <= 0.0) return 0.0;
  const bool across = spans_hosts(per_host, group_size);
  const bool all_reduce = kind == CollectiveKind::kAllReduce;
  const double alpha = across ? t.inter.latency_s : t.intra.latency_s;
  const auto n = static_cast<double>(group_size);
  const auto R = static_cast<double>(t.ranks_per_host);
  if (t.algorithm == CollectiveAlgorithm::kRing) {
    const double hops = (all_reduce ? 2.0 : 1.0) * (n - 1.0);
    if (!across) return hops * alpha + bytes_per_rank / t.intra.bytes_per_s;
    const double intra = per_host > 1 ? bytes_per_rank / t.intra.bytes_per_s : 0.0;
    const double inter = R / per_host * bytes_per_rank / t.inter.bytes_per_s;
    return hops * alpha + std::max(intra, inter);
  }
  const double rounds = all_reduce ? 2.0 : 1.0;
  const double per_peer = bytes_per_rank / (n - 1.0);
  const double intra = (per_host - 1) * per_peer / t.intra.bytes_per_s;
  const double inter = across ? R * (n - per_host) * per_peer / t.inter.bytes_per_s : 0.0;
  return rounds * alpha + std::max(intra, inter);
}

CostEstimate estimate_cost(const ModelDescription& model, const CostOptions& options) {
  const Topology& topo = options.topology;
  topo.validate();
  ZEST_CHECK(options.gathers_per_micro_step >= 1, "gathers_per_micro_step is {}: expected 1 or more",
             options.gathers_per_micro_step);
  EstimateOptions o = options.estimate;
  o.world_size = topo.world();
  CostEstimate out;
  out.memory = estimate_memory(model, o);  // validates the options and the model

  const int W = o.world_size;
  const int R = topo.ranks_per_host;
  const int stage = o.zero.stage;
  const int S = o.zero.shard_group_size(W);  // the shard group: W unless MiCS
  const int H = o.zero.hpz_group_size(W);    // 0 without hpZ
  const int shard_per_host = consecutive_per_host(S, R, "mics_shard_size");
  const int hpz_per_host = H > 0 ? consecutive_per_host(H, R, "zero_hpz_partition_size") : 0;
  const size_t b = elem_size(o.compute_dtype);
  const size_t acc_b = elem_size(o.grad_accum_dtype.value_or(o.compute_dtype));
  const auto A = static_cast<uint64_t>(o.gradient_accumulation_steps);
  // engine_grads.cpp: stages 0-1 under reduce_at_accumulation_boundary
  // reduce once per step, of the micro-steps' sum.
  const bool local = stage <= 1 && A > 1 && o.zero.reduce_at_accumulation_boundary;
  const uint64_t reductions = local ? 1 : A;
  const auto gathers = static_cast<uint64_t>(options.gathers_per_micro_step) * A;

  const std::vector<UnitSize> units = unit_sizes(model, o);
  StepBuilder step(topo, out);
  for (const UnitSize& u : units) {
    const uint64_t n = u.count;
    if (!u.frozen) {
      if (stage == 0) {
        step.add(TrafficKind::kGradAllReduce, CollectiveKind::kAllReduce, W, R, n * reductions, u.padded, b);
      } else {
        step.add(TrafficKind::kGradReduceScatter, CollectiveKind::kReduceScatter, S, shard_per_host,
                 n * reductions, u.shard, b);
      }
    }
    if (stage == 3 && !u.resident) {
      // engine_gather.cpp materialize(): with hpZ the first gather of a step
      // spans the world, the others come from the secondary copy.
      const uint64_t world_gathers = H > 0 ? 1 : gathers;
      step.add(TrafficKind::kParamGather, CollectiveKind::kAllGather, S, shard_per_host, n * world_gathers,
               u.shard, b);
      if (H > 0) {
        step.add(TrafficKind::kHpzGather, CollectiveKind::kAllGather, H, hpz_per_host, n * (gathers - 1),
                 u.padded / static_cast<size_t>(H), b);
      }
    }
  }
  // At the boundary: MiCS's all-reduce across groups (engine_grads.cpp
  // reduce_across_replicas), then the update's gathers (engine_step.cpp
  // gather_updated_params: resident trainable units).
  for (const UnitSize& u : units) {
    if (!u.frozen && S < W) {
      step.add(TrafficKind::kReplicaAllReduce, CollectiveKind::kAllReduce, W / S, replica_per_host(S, R), u.count,
               u.shard, acc_b);
    }
  }
  for (const UnitSize& u : units) {
    if (stage >= 1 && u.resident && !u.frozen) {
      step.add(TrafficKind::kUpdatedGather, CollectiveKind::kAllGather, S, shard_per_host, u.count, u.shard, b);
    }
  }
  for (const TrafficCost& t : out.traffic) {
    (t.link == LinkClass::kInter ? out.inter_bytes_per_rank : out.intra_bytes_per_rank) += t.bytes_per_rank;
    out.host_link_bytes += t.host_link_bytes;
    out.seconds += t.seconds;
  }
  return out;
}

EstimateOptions with_mode(EstimateOptions base, ShardingMode mode, int stage, int group, const Topology& topology) {
  base.world_size = topology.world();
  base.zero.mics_shard_size = -1;
  base.zero.zero_hpz_partition_size = 1;
  base.zero.stage = mode == ShardingMode::kFlat ? stage : 3;
  if (mode == ShardingMode::kMics) base.zero.mics_shard_size = group;
  if (mode == ShardingMode::kHsdp) base.zero.mics_shard_size = topology.ranks_per_host;
  if (mode == ShardingMode::kHpz) base.zero.zero_hpz_partition_size = group;
  return base;
}

}  // namespace zest
