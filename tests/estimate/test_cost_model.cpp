// The cost model (estimate/cost_model.h): its bytes against the comm
// counters of real in-process runs on every communicator, 4 ranks seen as
// 2 hosts x 2, at every stage, with MiCS and with hpZ; its times worked out
// by hand; its refusals.
#include <doctest/doctest.h>

#include <map>

#include "engine/engine_harness.h"
#include "zest/core/check.h"
#include "zest/estimate/cost_model.h"

using namespace zest;

namespace {

// The counters of the communicator a TrafficCost names, over a run's last
// step: the world's (comm()), MiCS's shard and replica groups, hpZ's group.
const CommCounters& counters_of(CommGroup c, const test::RankResult& r) {
  switch (c) {
    case CommGroup::kWorld: return r.last_step_counters;
    case CommGroup::kShard: return r.last_step_shard_counters;
    case CommGroup::kReplica: return r.last_step_replica_counters;
    case CommGroup::kHpz: return r.last_step_hpz_counters;
  }
  return r.last_step_counters;
}

Topology two_by_two() {
  Topology t;
  t.hosts = 2;
  t.ranks_per_host = 2;
  t.intra = {1e9, 1e-6};
  t.inter = {1e8, 1e-5};
  return t;
}

// The model's traffic summed per communicator and collective kind, as a
// CommCounters, for comparison with a rank's.
std::map<CommGroup, CommCounters> predicted(const CostEstimate& c) {
  std::map<CommGroup, CommCounters> out;
  for (const TrafficCost& t : c.traffic) {
    CollectiveCounter& k = out[t.group][t.kind];
    k.calls += t.calls;
    k.elements += t.elements;
    k.bytes_sent += t.bytes_per_rank;
    k.bytes_received += t.bytes_per_rank;
  }
  return out;
}

// `gathers` a unit a micro-step: 2 (forward, then backward) or 1 (the
// harness gathers each unit once for both).
void check_against_run(const EngineConfig& config, int gathers = 2) {
  constexpr int kWorld = 4;
  ModelDescription m;  // engine_harness.h's register_model, in layout order
  m.units = {{"a", {91, 7}, 1}, {"b", {35, 5, 1}, 1}, {"c", {33}, 1}};
  CostOptions o;
  o.estimate = EstimateOptions::from_config(config, kWorld);
  o.topology = two_by_two();
  o.gathers_per_micro_step = gathers;
  const CostEstimate cost = estimate_cost(m, o);
  REQUIRE_FALSE(cost.traffic.empty());
  std::map<CommGroup, CommCounters> want = predicted(cost);
  test::RunOptions opt = test::runs(kWorld, 2);
  opt.forward_then_backward = gathers == 2;
  const std::vector<test::RankResult> runs = test::run_engine(config, opt);
  double across = 0.0, within = 0.0;
  for (const CommGroup c : {CommGroup::kWorld, CommGroup::kShard, CommGroup::kReplica, CommGroup::kHpz}) {
    const bool spans = c == CommGroup::kWorld || c == CommGroup::kReplica;
    (spans ? across : within) += want[c].total_bytes_sent();
  }
  CHECK(cost.inter_bytes_per_rank == across);
  CHECK(cost.intra_bytes_per_rank == within);
  for (size_t r = 0; r < runs.size(); ++r) {
    CAPTURE(r);
    for (const CommGroup c : {CommGroup::kWorld, CommGroup::kShard, CommGroup::kReplica, CommGroup::kHpz}) {
      // Under flat sharding shard_comm() is the world: its counters are the
      // world's, already compared.
      if (c == CommGroup::kShard && config.zero.shard_group_size(kWorld) == kWorld) continue;
      CAPTURE(static_cast<int>(c));
      const CommCounters& got = counters_of(c, runs[r]);
      for (const CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                                     CollectiveKind::kAllGather, CollectiveKind::kBroadcast}) {
        CAPTURE(collective_name(k));
        CHECK(got[k].calls == want[c][k].calls);
        CHECK(got[k].elements == want[c][k].elements);
        CHECK(got[k].bytes_sent == want[c][k].bytes_sent);
        CHECK(got[k].bytes_received == want[c][k].bytes_received);
      }
    }
  }
}

}  // namespace

TEST_CASE("the model's bytes are the comm counters of a run on 4 ranks (2 hosts x 2), call for call") {
  // Two optimizer steps of 2 micro-steps, the last one counted, every
  // communicator of every rank. Stage 3 gathers each unit for forward and
  // again for backward (the harness releases it between), the model's
  // gathers_per_micro_step = 2.
  for (const int precision : {0, 1}) {  // fp32; bf16 with an fp32 accumulator (the replicas' all-reduce in fp32)
    for (const int accumulation : {1, 2}) {
      for (const int stage : {0, 1, 2, 3}) {
        CAPTURE(precision);
        CAPTURE(accumulation);
        CAPTURE(stage);
        EngineConfig config = test::base_config(stage);
        config.gradient_accumulation_steps = accumulation;
        if (precision == 1) {
          config.bf16 = true;
          config.grad_accum_dtype = DType::kFloat32;
        }
        check_against_run(config);
        if (stage != 3) continue;
        EngineConfig mics = config;
        mics.zero.mics_shard_size = 2;
        check_against_run(mics);
        EngineConfig hpz = config;
        hpz.zero.zero_hpz_partition_size = 2;
        check_against_run(hpz);
      }
    }
  }
}

TEST_CASE("stage 3's persistent units are gathered once after the update, as the engine does") {
  // stage3_param_persistence_threshold 100 keeps units b (41 parameters)
  // and c (33) whole on every rank: no gathers in forward or backward, one
  // all-gather of their updated shards a step (engine_step.cpp).
  for (const int mode : {0, 1, 2}) {  // flat, MiCS S=2, hpZ H=2
    CAPTURE(mode);
    EngineConfig config = test::base_config(3);
    config.zero.stage3_param_persistence_threshold = 100;
    if (mode == 1) config.zero.mics_shard_size = 2;
    if (mode == 2) config.zero.zero_hpz_partition_size = 2;
    config.gradient_accumulation_steps = 2;
    check_against_run(config);
  }
}

// The harness then gathers each unit once a micro-step, in backward order.
// Prefetch off: the engine's prefetch follows the order it recorded, and
// here it mispredicts across micro-steps: 13 gathers a step instead of the
// loop's 9 (3 units x 3 micro-steps), each prefetched unit dropped unused
// costing one more. The model counts the loop's gathers (cost_model.h).
TEST_CASE("a loop that gathers each unit once a micro-step: gathers_per_micro_step 1") {
  for (const int mode : {0, 1, 2}) {  // flat, MiCS S=2, hpZ H=2
    CAPTURE(mode);
    EngineConfig config = test::base_config(3);
    config.gradient_accumulation_steps = 3;
    config.zero.stage3_prefetch_bucket_size = 0;
    if (mode == 1) config.zero.mics_shard_size = 2;
    if (mode == 2) config.zero.zero_hpz_partition_size = 2;
    check_against_run(config, 1);
  }
}

TEST_CASE("links: flat groups span the hosts, MiCS's shard groups and hpZ's groups stay within one") {
  ModelDescription m = ModelDescription::from_total(size_t{1} << 20);
  CostOptions o;
  o.topology = two_by_two();
  o.estimate.zero.stage = 3;
  // The unit gathered again for backward, as ZeRO++ counts: at the default
  // reuse distance (1e9) one unit is kept from its forward to its backward.
  o.estimate.zero.stage3_max_reuse_distance = 0;
  const CostEstimate flat = estimate_cost(m, o);
  CHECK(flat.intra_bytes_per_rank == 0.0);
  o.estimate.zero.mics_shard_size = 2;
  const CostEstimate mics = estimate_cost(m, o);
  for (const TrafficCost& t : mics.traffic) {
    CAPTURE(traffic_kind_name(t.traffic));
    CHECK(t.link == (t.group == CommGroup::kReplica ? LinkClass::kInter : LinkClass::kIntra));
  }
  o.estimate.zero.mics_shard_size = -1;
  o.estimate.zero.zero_hpz_partition_size = 2;
  const CostEstimate hpz = estimate_cost(m, o);
  for (const TrafficCost& t : hpz.traffic) {
    CAPTURE(traffic_kind_name(t.traffic));
    CHECK(t.link == (t.group == CommGroup::kHpz ? LinkClass::kIntra : LinkClass::kInter));
  }
  // ZeRO++'s accounting (its blog's table): of flat stage 3's three
  // parameter-sized volumes across nodes, hpZ keeps two (the forward
  // gather and the reduce-scatter); the backward gather moves within.
  CHECK(hpz.inter_bytes_per_rank / flat.inter_bytes_per_rank == doctest::Approx(2.0 / 3.0).epsilon(1e-15));
  CHECK(hpz.memory.peak_bytes > flat.memory.peak_bytes);  // the secondary copy
  CHECK(mics.memory.model_state_bytes == 2 * flat.memory.model_state_bytes);
}

TEST_CASE("times: the alpha-beta arithmetic of a step, worked out by hand") {
  // 2^20 fp16 parameters in one unit (above the persistence threshold, so
  // gathered), 2 hosts x 2 ranks; intra 1 GB/s and 1 us a rank, inter
  // 0.1 GB/s and 10 us a host. Times are sums of quotients: compared to
  // 1e-12 relative, the rounding of a few double operations.
  const ModelDescription m = ModelDescription::from_total(size_t{1} << 20);
  CostOptions o;
  o.topology = two_by_two();
  o.estimate.zero.stage = 3;
  o.estimate.zero.stage3_max_reuse_distance = 0;  // a backward gather too (1e9 keeps the unit)

  // Flat, ring: each collective moves 3 x 2^18 x 2 = 1,572,864 bytes a
  // rank; the ring crosses each host's link once (R / per_host = 1 ring),
  // so the inter link carries the same 1,572,864 bytes: 15.72864 ms, plus 3
  // hops of 10 us. A reduce-scatter, a forward and a backward gather.
  CostEstimate c = estimate_cost(m, o);
  REQUIRE(c.traffic.size() == 3);
  CHECK(c.traffic[0].traffic == TrafficKind::kGradReduceScatter);
  CHECK(c.traffic[1].traffic == TrafficKind::kForwardGather);
  CHECK(c.traffic[2].traffic == TrafficKind::kBackwardGather);
  for (const TrafficCost& t : c.traffic) {
    CHECK(t.calls == 1u);
    CHECK(t.bytes_per_rank == 1'572'864.0);
    CHECK(t.seconds == doctest::Approx(3e-5 + 0.01572864).epsilon(1e-12));
  }
  CHECK(c.host_link_bytes == 3 * 1'572'864.0);
  CHECK(c.seconds == doctest::Approx(3 * (3e-5 + 0.01572864)).epsilon(1e-12));

  // Pairwise (ZEST's MPI): each rank sends 524,288 bytes to each of 3
  // peers; a host's 2 ranks send 2 parts each to the other host: 2,097,152
  // bytes through its link, 20.97152 ms, plus one exchange of 10 us.
  o.topology.algorithm = CollectiveAlgorithm::kPairwise;
  c = estimate_cost(m, o);
  CHECK(c.host_link_bytes == 3 * 2'097'152.0);
  CHECK(c.seconds == doctest::Approx(3 * (1e-5 + 0.02097152)).epsilon(1e-12));

  // HSDP (mics_shard_size 2 = ranks per host), ring: within the host a
  // reduce-scatter and two gathers of 2^19 x 2 bytes a rank, each 1 hop of
  // 1 us + 1,048,576 / 1e9 s; across, 2 rings (one per local rank) through
  // each host's link, each an all-reduce of 2^19 fp16: 2 (2-1)/2 x 2^20 =
  // 1,048,576 bytes a rank, 2 x that over 1e8 B/s, plus 2 hops of 10 us.
  o.topology.algorithm = CollectiveAlgorithm::kRing;
  o.estimate.zero.mics_shard_size = 2;
  c = estimate_cost(m, o);
  CHECK(c.intra_bytes_per_rank == 3 * 1'048'576.0);
  CHECK(c.inter_bytes_per_rank == 1'048'576.0);
  CHECK(c.host_link_bytes == 2 * 1'048'576.0);
  CHECK(c.seconds == doctest::Approx(3 * (1e-6 + 1.048576e-3) + 2e-5 + 0.02097152).epsilon(1e-12));

  // One host: nothing crosses, the intra link alone.
  o.topology.hosts = 1;
  o.topology.ranks_per_host = 4;
  o.estimate.zero.mics_shard_size = -1;
  c = estimate_cost(m, o);
  CHECK(c.inter_bytes_per_rank == 0.0);
  CHECK(c.host_link_bytes == 0.0);
  CHECK(c.seconds == doctest::Approx(3 * (3e-6 + 1.572864e-3)).epsilon(1e-12));

  // Accumulation: 4 micro-steps, 4 reduce-scatters and 8 gathers; MiCS's
  // all-reduce across groups stays one a step.
  o.topology = two_by_two();
  o.estimate.zero.mics_shard_size = 2;
  o.estimate.gradient_accumulation_steps = 4;
  c = estimate_cost(m, o);
  CHECK(c.intra_bytes_per_rank == 12 * 1'048'576.0);
  CHECK(c.inter_bytes_per_rank == 1'048'576.0);
}

TEST_CASE("refusals name what is wrong") {
  const ModelDescription m = ModelDescription::from_total(1'000'000);
  CostOptions o;
  o.topology = two_by_two();
  o.topology.inter.bytes_per_s = 0.0;
  CHECK_THROWS_WITH_AS(estimate_cost(m, o), doctest::Contains("the inter link's bandwidth is 0"), Error);
  o.topology = two_by_two();
  o.topology.hosts = 3;  // 6 ranks: groups of 3 straddle hosts of 2
  o.estimate.zero.stage = 3;
  o.estimate.zero.mics_shard_size = 3;
  CHECK_THROWS_WITH_AS(estimate_cost(m, o), doctest::Contains("mics_shard_size 3 with 2 ranks per host"), Error);
  o.estimate.zero.mics_shard_size = 4;  // not a divisor of 6: the memory estimator's refusal
  CHECK_THROWS_WITH_AS(estimate_cost(m, o), doctest::Contains("mics_shard_size"), Error);
  CHECK_THROWS_WITH_AS(link_preset("nvlink9"), doctest::Contains("the presets are nvlink4"), Error);
  CHECK(link_preset("ib-ndr").link.bytes_per_s == 400e9);
}

TEST_CASE("link specs: bytes or bits a second, latencies with their unit, presets by name") {
  CHECK(parse_link_spec("400GB/s").bytes_per_s == 400e9);
  CHECK(parse_link_spec("400GB/s").latency_s == 0.0);
  CHECK(parse_link_spec("25Gbit/s").bytes_per_s == 3.125e9);
  CHECK(parse_link_spec("100Gbps").bytes_per_s == 12.5e9);
  CHECK(parse_link_spec("20 Mbit/s").bytes_per_s == 2.5e6);
  CHECK(parse_link_spec("4.5e11").bytes_per_s == 4.5e11);
  CHECK(parse_link_spec("1GiB/s").bytes_per_s == 1073741824.0);
  CHECK(parse_link_spec("450GB/s,3us").latency_s == 3e-6);
  CHECK(parse_link_spec("10Gbit/s,1.5ms").latency_s == 1.5e-3);
  CHECK(parse_link_spec("10Gbit/s,5us").latency_s == 5e-6);
  CHECK(parse_link_spec("10Gbit/s,250ns").latency_s == 250e-9);
  CHECK(parse_link_spec("10Gbit/s,0").latency_s == 0.0);
  CHECK(parse_link_spec("ib-hdr").bytes_per_s == 200e9);
  for (const char* bad : {"fast", "0GB/s", "-1GB/s", "5 parsecs/s", ""}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_link_spec(bad), doctest::Contains("is not a bandwidth"), Error);
  }
  for (const char* bad : {"5GB/s,5", "5GB/s,-1us", "5GB/s,soon"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_link_spec(bad), doctest::Contains("is not a latency"), Error);
  }
  for (const LinkPreset& p : link_presets()) {
    CAPTURE(p.name);
    CHECK(p.link.bytes_per_s > 0.0);
    CHECK(parse_link_spec(p.name).bytes_per_s == p.link.bytes_per_s);
  }
}
