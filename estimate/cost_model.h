// The communication of one optimizer step, per rank and per host link, and
// the time an alpha-beta model gives it, for a model under ZeRO's stages
// and the hierarchical modes (MiCS / HSDP, hpZ) on a world of hosts x ranks;
// with the memory per rank from the memory estimator. The byte counts are
// the engine's: what CommCounters (comm/comm_counters.h) report on each
// communicator of a run, call for call (docs/MICS.md has them in closed
// form). The times are a model, not a measurement.
//
//   // zest-example: run
//   zest::CostOptions o;
//   o.topology = zest::Topology{2, 8, zest::link_preset("nvlink4").link, zest::link_preset("ib-ndr").link};
//   o.estimate.zero.stage = 3;
//   o.estimate.zero.mics_shard_size = 8;  // HSDP: a replica per host
//   const zest::CostEstimate c =
//       zest::estimate_cost(zest::ModelDescription::from_total(7'000'000'000, 100'000'000), o);
//   // Within a host: the gathers and reduce-scatters; across: 1/8 of the gradients.
//   ZEST_CHECK(c.inter_bytes_per_rank < c.intra_bytes_per_rank / 10, "HSDP keeps traffic in the host");
//
// The model of the links (Note [two link classes] in cost_model.cpp):
//   intra  each rank's bandwidth to the ranks of its own host, per direction
//          (NVLink through an NVSwitch: every GPU has its own)
//   inter  one host's bandwidth to the other hosts, per direction, shared by
//          all its ranks (the sum of its NICs)
// Ranks are numbered host by host (rank r on host r / ranks_per_host), as
// launchers place them, so the groups of MiCS and hpZ (consecutive ranks)
// lie within a host when they are no larger than one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/collective.h"
#include "zest/estimate/link_spec.h"
#include "zest/estimate/memory_estimate.h"

namespace zest {

enum class CollectiveAlgorithm : uint8_t {
  // NCCL's rings (the counters' model): n-1 steps, each rank sending 1/n
  // of the buffer a step to its neighbour; a ring over several hosts
  // crosses each host's link once per direction.
  kRing,
  // ZEST's MPI backend (Note [reductions over MPI], comm/mpi_comm.cpp):
  // every rank sends its part to every other rank at once, so a host's
  // link carries the parts of all its ranks for all ranks elsewhere.
  kPairwise,
};

struct Topology {
  int hosts = 1;
  int ranks_per_host = 1;
  LinkSpec intra;
  LinkSpec inter;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kRing;

  int world() const { return hosts * ranks_per_host; }
  // Throws an Error naming the bad field.
  void validate() const;
};

enum class LinkClass : uint8_t { kIntra, kInter };

// What a step's collective is for.
enum class TrafficKind : uint8_t {
  kGradAllReduce,      // stage 0: each micro-step's gradients
  kGradReduceScatter,  // stages 1-3: each micro-step's gradients, over the shard group
  kForwardGather,      // stage 3: a unit's parameters for its forward, each micro-step
  kBackwardGather,     // stage 3: again for its backward
  kReplicaAllReduce,   // MiCS: the gradient shards across groups, once per step
  kUpdatedGather,      // stages 1-2, and stage 3's persistent units: after the update
};
std::string_view traffic_kind_name(TrafficKind kind);

// The engine's communicator that carries (and counts) a collective.
enum class CommGroup : uint8_t {
  kWorld,    // Engine::comm(): flat sharding, and hpZ's first gather of a step
  kShard,    // MiCS: Engine::shard_comm(), S consecutive ranks
  kReplica,  // MiCS: Engine::replica_comm(), the W / S ranks of one shard index
  kHpz,      // hpZ: Engine::hpz_comm(), H consecutive ranks (the secondary copy's gathers)
};

// One kind of traffic of a step on one communicator: `calls` collectives.
struct TrafficCost {
  TrafficKind traffic = TrafficKind::kForwardGather;
  CollectiveKind kind = CollectiveKind::kAllGather;
  CommGroup group = CommGroup::kWorld;
  int group_size = 1;
  LinkClass link = LinkClass::kIntra;  // kInter when the group spans hosts
  uint64_t calls = 0;                  // per optimizer step
  uint64_t elements = 0;               // as CollectiveCounter::elements counts them
  double bytes_per_rank = 0.0;         // sent (= received) by each rank: CollectiveCounter::bytes_sent
  double host_link_bytes = 0.0;        // through one host's inter link, per direction (0 within a host)
  double seconds = 0.0;                // the alpha-beta time of the calls, one after another
};

struct CostOptions {
  // Stage, MiCS / hpZ sizes and thresholds (zero), dtypes, optimizer and
  // accumulation steps, as for the memory estimate; world_size is the
  // topology's (set by estimate_cost).
  EstimateOptions estimate;
  Topology topology;
  // Stage 3: gathers of each unit a micro-step, its forward's and its
  // backward's, as a training loop that releases units between them
  // issues (a loop keeping units gathered issues fewer). At 2, the units
  // stage3_max_reuse_distance keeps gathered from forward to backward
  // (reuse_kept in unit_sizes.h: the loop gathers forward in the
  // description's order, backward in reverse) are gathered once; at 3 or
  // more the order is unknown and every unit is counted as released. The engine's
  // prefetch (stage3_prefetch_bucket_size) gathers ahead in the order it
  // recorded; where the loop strays from that order a prefetched unit
  // dropped unused costs one more gather, which the model does not count
  // (test_cost_model: 13 gathers against a loop's 9 in one such pattern;
  // forward then backward, as here, matches exactly).
  int gathers_per_micro_step = 2;
};

struct CostEstimate {
  std::vector<TrafficCost> traffic;  // in step order, kinds without calls left out
  // Sums over `traffic`: each rank's bytes on communicators within one host
  // and on communicators spanning hosts (what the counters of shard_comm(),
  // replica_comm(), hpz_comm() or comm() say), and per host per direction on
  // its inter link.
  double intra_bytes_per_rank = 0.0;
  double inter_bytes_per_rank = 0.0;
  double host_link_bytes = 0.0;
  // Predicted communication time of a step with nothing overlapped: every
  // collective after the previous one, none hidden behind compute. With
  // compute C a step takes about C + this without overlap, and no less
  // than max(C, this) with perfect overlap.
  double seconds = 0.0;
  MemoryEstimate memory;  // estimate_memory of the same options
};

// Per optimizer step (gradient_accumulation_steps micro-steps) of `model`.
// Throws an Error naming the option when the topology is invalid, when the
// options' world is not the topology's, or when a MiCS / hpZ group would
// straddle hosts (neither within one host nor whole hosts).
CostEstimate estimate_cost(const ModelDescription& model, const CostOptions& options);

// The alpha-beta time of one collective of `bytes_per_rank` (the counters'
// ring bytes) over `group_size` ranks of which `per_host` share each host
// they span, with every rank of every host in such a group at once.
double collective_seconds(CollectiveKind kind, double bytes_per_rank, int group_size, int per_host,
                          const Topology& topology);

// The modes zest-estimate --hosts compares, as the options that select them.
enum class ShardingMode : uint8_t { kFlat, kMics, kHsdp, kHpz };
// `base` with `mode` set: kFlat at `stage`; the others at stage 3 with
// mics_shard_size (kMics: group; kHsdp: ranks per host) or
// zero_hpz_partition_size (kHpz: group).
EstimateOptions with_mode(EstimateOptions base, ShardingMode mode, int stage, int group, const Topology& topology);

// A row per mode: memory per rank (model states and peak), bytes per rank
// within and across hosts, bytes through a host's link, and the predicted
// seconds of communication per step; with `traffic`, each mode's lines per
// collective kind and communicator; then the links assumed.
struct ModeRow {
  std::string label;
  EstimateOptions options;
};
std::string format_cost_table(const ModelDescription& model, const std::vector<ModeRow>& rows,
                              const Topology& topology, int gathers_per_micro_step = 2, bool traffic = false);

}  // namespace zest
