// The rank arithmetic of a dp x tp x pp device mesh, as pure functions: which
// world rank holds which coordinates, and which ranks form each group. The
// order is Megatron-LM's (megatron/core/parallel_state.py,
// initialize_model_parallel, order "tp-cp-ep-dp-pp" with cp = ep = 1):
// tensor-parallel rank fastest, then data-parallel, then pipeline stage,
//
//   world rank = tp_rank + tp * (dp_rank + dp * pp_rank)
//
// so the tp ranks of a layer are neighbours (on one host: NVLink), the dp
// replicas of a stage are tp apart, and the stages world / pp apart. For
// dp = tp = pp = 2 (8 ranks):
//
//   rank  0  1  2  3  4  5  6  7
//   tp    0  1  0  1  0  1  0  1
//   dp    0  0  1  1  0  0  1  1
//   pp    0  0  0  0  1  1  1  1
//
//   tp groups              [0,1] [2,3] [4,5] [6,7]
//   dp groups              [0,2] [1,3] [4,6] [5,7]
//   pp groups              [0,4] [1,5] [2,6] [3,7]
//   model-parallel groups  [0,1,4,5] [2,3,6,7]     (tp x pp, one dp index)
//   embedding groups       [0,4] [1,5] [2,6] [3,7] (first and last stage)
//
// Every group lists its ranks in ascending order, which is also the order of
// their ranks in the group's communicator (DeviceMesh splits with the world
// rank as key), as Megatron's range()s produce them.
//
//   // zest-example
//   zest::MeshShape shape{.dp = 2, .tp = 2, .pp = 2};
//   zest::MeshCoord c = zest::mesh_coord(shape, 5);         // {dp 0, tp 1, pp 1}
//   std::vector<int> dp = zest::dp_group_ranks(shape, 5);   // {5, 7}
#pragma once

#include <string>
#include <vector>

namespace zest {

struct MeshShape {
  int dp = 1;  // data-parallel replicas (the ZeRO engine shards over these)
  int tp = 1;  // tensor-parallel ranks a layer is split over
  int pp = 1;  // pipeline stages the layers are split into
  int world() const { return dp * tp * pp; }
  std::string str() const;  // "dp 2 x tp 2 x pp 2"
};

struct MeshCoord {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  friend bool operator==(const MeshCoord&, const MeshCoord&) = default;
};

// Throws a zest::Error naming the sizes unless each is at least 1 and, when
// `world_size` >= 0, their product is world_size.
void check_mesh_shape(const MeshShape& shape, int world_size = -1);

MeshCoord mesh_coord(const MeshShape& shape, int world_rank);
int mesh_rank(const MeshShape& shape, const MeshCoord& coord);

// The world ranks of `world_rank`'s groups, ascending.
std::vector<int> tp_group_ranks(const MeshShape& shape, int world_rank);
std::vector<int> dp_group_ranks(const MeshShape& shape, int world_rank);
std::vector<int> pp_group_ranks(const MeshShape& shape, int world_rank);
std::vector<int> model_parallel_group_ranks(const MeshShape& shape, int world_rank);
// The first and the last stage of world_rank's pipeline (Megatron's
// embedding group, over which tied input and output embeddings sum their
// gradients); the one stage when pp = 1; empty for a middle stage.
std::vector<int> embedding_group_ranks(const MeshShape& shape, int world_rank);

}  // namespace zest
