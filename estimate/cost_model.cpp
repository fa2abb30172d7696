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

// A communicator of the step: `size` ranks, `per_host` of them on each host
// it spans.
struct Group {
  CommGroup id = CommGroup::kWorld;
  int size = 1;
  int per_host = 1;
};

class StepBuilder {
 public:
  StepBuilder(const Topology& t, CostEstimate& out) : topology_(t), out_(out) {}

  // `calls` collectives of `count` elements each (as the engine passes it)
  // over `g`.
  void add(TrafficKind traffic, CollectiveKind kind, const Group& g, uint64_t calls, size_t count,
           size_t elem_bytes) {
    const int n = g.size;
    const int per_host = g.per_host;
    if (n <= 1 || calls == 0) return;  // Note [one rank reduces nothing]: no collective runs
    TrafficCost& t = line(traffic, kind, g);
    const double bytes = call_bytes(kind, count, n, elem_bytes);
    t.calls += calls;
    t.elements += calls * call_elements(kind, count, n);
    t.bytes_per_rank += static_cast<double>(calls) * bytes;
    t.host_link_bytes += static_cast<double>(calls) * host_link_bytes(bytes, n, per_host);
    t.seconds += static_cast<double>(calls) * collective_seconds(kind, bytes, n, per_host, topology_);
  }

 private:
  TrafficCost& line(TrafficKind traffic, CollectiveKind kind, const Group& g) {
    for (TrafficCost& t : out_.traffic) {
      if (t.traffic == traffic && t.group == g.id) return t;
    }
    TrafficCost t;
    t.traffic = traffic;
    t.kind = kind;
    t.group = g.id;
    t.group_size = g.size;
    t.link = spans_hosts(g.per_host, g.size) ? LinkClass::kInter : LinkClass::kIntra;
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
    case TrafficKind::kForwardGather: return "forward all-gather";
    case TrafficKind::kBackwardGather: return "backward all-gather";
    case TrafficKind::kReplicaAllReduce: return "all-reduce across replicas";
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
  const Group world{CommGroup::kWorld, W, R};
  const Group shard = S < W ? Group{CommGroup::kShard, S, consecutive_per_host(S, R, "mics_shard_size")} : world;
  const Group replica{CommGroup::kReplica, W / S, replica_per_host(S, R)};
  const Group hpz{CommGroup::kHpz, H, H > 0 ? consecutive_per_host(H, R, "zero_hpz_partition_size") : 0};
  const size_t b = elem_size(o.compute_dtype);
  const size_t acc_b = elem_size(o.grad_accum_dtype.value_or(o.compute_dtype));
  const auto A = static_cast<uint64_t>(o.gradient_accumulation_steps);
  // engine_grads.cpp: stages 0-1 under reduce_at_accumulation_boundary
  // reduce once per step, of the micro-steps' sum.
  const bool local = stage <= 1 && A > 1 && o.zero.reduce_at_accumulation_boundary;
  const uint64_t reductions = local ? 1 : A;
  const auto backward_gathers = static_cast<uint64_t>(options.gathers_per_micro_step - 1) * A;

  const std::vector<UnitSize> units = unit_sizes(model, o);
  // Note [stage-3 reuse distance]: in a forward-then-backward loop the
  // repeats kept gathered from forward to backward are not gathered again.
  const std::vector<size_t> kept =
      options.gathers_per_micro_step == 2 ? reuse_kept(units, o) : std::vector<size_t>(units.size(), 0);
  StepBuilder step(topo, out);
  for (size_t e = 0; e < units.size(); ++e) {
    const UnitSize& u = units[e];
    const uint64_t n = u.count;
    const uint64_t regathered = (n - kept[e]) * backward_gathers;
    if (!u.frozen) {
      if (stage == 0) {
        step.add(TrafficKind::kGradAllReduce, CollectiveKind::kAllReduce, world, n * reductions, u.padded, b);
      } else {
        step.add(TrafficKind::kGradReduceScatter, CollectiveKind::kReduceScatter, shard, n * reductions, u.shard,
                 b);
      }
    }
    if (stage == 3 && !u.resident) {
      // engine_gather.cpp materialize(): with hpZ the first gather of a step
      // (the first micro-step's forward) spans the world and leaves the
      // secondary copy, from which every later one gathers within the group.
      if (H > 0) {
        const size_t part = u.padded / static_cast<size_t>(H);
        step.add(TrafficKind::kForwardGather, CollectiveKind::kAllGather, world, n, u.shard, b);
        step.add(TrafficKind::kForwardGather, CollectiveKind::kAllGather, hpz, n * (A - 1), part, b);
        step.add(TrafficKind::kBackwardGather, CollectiveKind::kAllGather, hpz, regathered, part, b);
      } else {
        step.add(TrafficKind::kForwardGather, CollectiveKind::kAllGather, shard, n * A, u.shard, b);
        step.add(TrafficKind::kBackwardGather, CollectiveKind::kAllGather, shard, regathered, u.shard, b);
      }
    }
  }
  // At the boundary: MiCS's all-reduce across groups (engine_grads.cpp
  // reduce_across_replicas), then the update's gathers (engine_step.cpp
  // gather_updated_params: resident trainable units).
  for (const UnitSize& u : units) {
    if (!u.frozen && S < W) {
      step.add(TrafficKind::kReplicaAllReduce, CollectiveKind::kAllReduce, replica, u.count, u.shard, acc_b);
    }
  }
  for (const UnitSize& u : units) {
    if (stage >= 1 && u.resident && !u.frozen) {
      step.add(TrafficKind::kUpdatedGather, CollectiveKind::kAllGather, shard, u.count, u.shard, b);
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
