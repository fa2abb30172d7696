// How registered parameters lie in memory: each unit (a layer or block) is
// one flat buffer, split into equal shards, one per partition.
//
//   unit "block0": | w (64-aligned) | b | ... | padding |
//                  |<- shard 0 ->|<- shard 1 ->| ... |<- shard P-1 ->|
//
// Within a unit, parameters are placed group by group (in the order the
// groups were declared, stable within a group), so a shard crosses few group
// boundaries and the optimizer runs once per run of one group, not once per
// parameter. Offsets follow layout_constants.h. Alignment gaps and the tail
// padding belong to the run before them; they hold zeros that every
// optimizer keeps at zero (a zero gradient and weight give a zero update).
//
// Frozen units (every parameter registered with trainable = false, like
// torch's requires_grad=False) are laid out and sharded like the others, but
// have no gradients, master weights or optimizer state: owned() counts them
// (their values are saved with checkpoints), trainable_owned() does not.
//
// The layout depends only on the registration and the number of partitions
// (1 for stage 0, the world size for stages 1-3), so every rank computes the
// same one, and a checkpoint can be resharded by recomputing it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace zest {

// How a tensor-parallel rank's slice of a parameter is cut from the whole
// (zest::tp::partition, torch/tensor_parallel.h; Megatron's partition_dim
// and partition_stride): along `dim` the whole is `stride` blocks, each cut
// into tp equal pieces, and tp rank r holds piece r of each block, in block
// order. An export on a mesh (whole_model.h) joins the slices back by it.
struct TpSplit {
  int dim = 0;
  int stride = 1;
  friend bool operator==(const TpSplit&, const TpSplit&) = default;
};

struct ParamSpec {
  std::string name;              // unique in the model, e.g. "block0.fc1.weight"
  std::vector<int64_t> shape;    // empty: a scalar
  std::string group = "default"; // parameter group (weight decay)
  // false: frozen (no gradient, no optimizer state; its value never changes).
  // A unit's parameters are all trainable or all frozen.
  bool trainable = true;
  // With tensor parallelism (Engine::set_model_parallel): this parameter is
  // whole and identical on every tp rank (a layer norm, a row-parallel
  // layer's bias) rather than a tp rank's slice. The global gradient norm
  // counts it once, on tp rank 0, as Megatron counts a parameter that is
  // not tensor_model_parallel. Without tensor parallelism it changes
  // nothing. The engine does not make the copies agree: the program gives
  // them the same initial values and the same gradients (the tp layers
  // all-reduce them over tp), and identical steps keep them identical.
  bool tp_replicated = false;
  // With tensor parallelism, for a parameter that is not tp_replicated:
  // how this rank's slice was cut from the whole (TorchModule fills it from
  // the tp layers). Only an export of the whole model needs it, and refuses
  // a split parameter without it by name.
  std::optional<TpSplit> tp_split{};
};

struct UnitSpec {
  std::string name;
  std::vector<ParamSpec> params;
};

struct ParamGroupSpec {
  std::string name;
  float weight_decay = 0.0f;
};

struct ParamLayout {
  std::string name;
  std::vector<int64_t> shape;
  size_t numel = 0;
  size_t offset = 0;  // in the unit's flat buffer
  int group = 0;      // index into ModelLayout::groups()
  bool tp_replicated = false;         // as registered (ParamSpec)
  std::optional<TpSplit> tp_split{};  // as registered (ParamSpec)
};

// [begin, end) of a flat buffer in which every element belongs to `group`.
struct GroupRun {
  size_t begin = 0;
  size_t end = 0;
  int group = 0;
};

struct UnitLayout {
  std::string name;
  std::vector<ParamLayout> params;  // in flat order
  size_t numel = 0;                 // parameters only, without gaps or padding
  size_t padded = 0;                // the flat buffer's size
  size_t shard = 0;                 // padded / partitions
  std::vector<GroupRun> runs;       // covering [0, padded)
  bool frozen = false;              // every parameter is frozen
};

struct ParamRef {
  int unit = -1;
  int index = -1;  // into UnitLayout::params
};

class ModelLayout {
 public:
  // Checks the registration (names unique and non-empty, dimensions
  // positive, groups declared, no empty unit) and lays it out. `groups[0]`
  // is the default group.
  ModelLayout(std::vector<ParamGroupSpec> groups, std::vector<UnitSpec> units, int partitions);

  int partitions() const { return partitions_; }
  const std::vector<ParamGroupSpec>& groups() const { return groups_; }
  const std::vector<UnitLayout>& units() const { return units_; }
  const UnitLayout& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  int num_units() const { return static_cast<int>(units_.size()); }

  // Throws naming the parameter when there is none of that name.
  ParamRef find(const std::string& param_name) const;
  bool contains(std::string_view param_name) const;
  const ParamLayout& param(ParamRef ref) const;

  size_t numel() const { return numel_; }    // registered parameters
  size_t padded() const { return padded_; }  // sum of the units' flat sizes
  // Elements one partition owns: the sum of the units' shards.
  size_t owned() const { return owned_; }
  // Where unit u's shard starts in a partition's concatenated owned region.
  size_t owned_offset(int u) const { return owned_offsets_.at(static_cast<size_t>(u)); }
  // The same over the trainable units only: the master weights, optimizer
  // state and gradient norm cover these.
  size_t trainable_owned() const { return trainable_owned_; }
  size_t trainable_offset(int u) const { return trainable_offsets_.at(static_cast<size_t>(u)); }

  // The runs of unit u that fall in partition p's shard, relative to the
  // shard's start.
  std::vector<GroupRun> shard_runs(int u, int p) const;

  // The registration as text, one line per group, unit and parameter; equal
  // on two ranks exactly when they registered the same model.
  std::string describe() const;
  // FNV-1a of describe(), compared across ranks before the full text is.
  uint64_t digest() const;

 private:
  int partitions_;
  std::vector<ParamGroupSpec> groups_;
  std::vector<UnitLayout> units_;
  std::vector<size_t> owned_offsets_;
  std::vector<size_t> trainable_offsets_;
  std::unordered_map<std::string, ParamRef> by_name_;
  size_t numel_ = 0;
  size_t padded_ = 0;
  size_t owned_ = 0;
  size_t trainable_owned_ = 0;
};

// The first line where two describe() texts differ, for an error message:
// "rank 0 has 'param block1.w [64, 32] group default' where rank 2 has ...".
std::string first_difference(const std::string& a, const std::string& b);

// What element `at` of unit u's flat layout is, for an error message:
// "parameter 'b.w' element 3", or "padding" between and after parameters.
std::string element_name(const UnitLayout& unit, size_t at);

}  // namespace zest
