#include "zest/mesh/mesh_layout.h"

#include <fmt/format.h>

#include "zest/core/check.h"

namespace zest {

std::string MeshShape::str() const { return fmt::format("dp {} x tp {} x pp {}", dp, tp, pp); }

void check_mesh_shape(const MeshShape& shape, int world_size) {
  ZEST_CHECK(shape.dp >= 1 && shape.tp >= 1 && shape.pp >= 1,
             "device mesh {}: every size must be at least 1 (1 for a dimension not used)", shape.str());
  ZEST_CHECK(static_cast<long long>(shape.dp) * shape.tp * shape.pp <= (1 << 24),
             "device mesh {}: more than 16777216 ranks", shape.str());
  ZEST_CHECK(world_size < 0 || shape.world() == world_size,
             "device mesh {} needs {} ranks, but the world has {}; choose sizes whose product is {}",
             shape.str(), shape.world(), world_size, world_size);
}

MeshCoord mesh_coord(const MeshShape& shape, int world_rank) {
  check_mesh_shape(shape);
  ZEST_CHECK(world_rank >= 0 && world_rank < shape.world(), "rank {} is not in device mesh {} ({} ranks)",
             world_rank, shape.str(), shape.world());
  return MeshCoord{(world_rank / shape.tp) % shape.dp, world_rank % shape.tp, world_rank / (shape.tp * shape.dp)};
}

int mesh_rank(const MeshShape& shape, const MeshCoord& c) {
  check_mesh_shape(shape);
  ZEST_CHECK(c.dp >= 0 && c.dp < shape.dp && c.tp >= 0 && c.tp < shape.tp && c.pp >= 0 && c.pp < shape.pp,
             "coordinates dp {} tp {} pp {} are outside device mesh {}", c.dp, c.tp, c.pp, shape.str());
  return c.tp + shape.tp * (c.dp + shape.dp * c.pp);
}

namespace {

// The ranks whose coordinates equal `world_rank`'s except those `vary`
// changes, ascending (every rank formula above is increasing in each
// coordinate, and the loops run pp, dp, tp from the outside in).
template <typename Vary>
std::vector<int> group(const MeshShape& s, int world_rank, Vary vary) {
  const MeshCoord me = mesh_coord(s, world_rank);
  std::vector<int> out;
  for (int pp = 0; pp < s.pp; ++pp) {
    for (int dp = 0; dp < s.dp; ++dp) {
      for (int tp = 0; tp < s.tp; ++tp) {
        const MeshCoord c{dp, tp, pp};
        if (vary(me, c)) out.push_back(mesh_rank(s, c));
      }
    }
  }
  return out;
}

}  // namespace

std::vector<int> tp_group_ranks(const MeshShape& s, int r) {
  return group(s, r, [](const MeshCoord& me, const MeshCoord& c) { return c.dp == me.dp && c.pp == me.pp; });
}
std::vector<int> dp_group_ranks(const MeshShape& s, int r) {
  return group(s, r, [](const MeshCoord& me, const MeshCoord& c) { return c.tp == me.tp && c.pp == me.pp; });
}
std::vector<int> pp_group_ranks(const MeshShape& s, int r) {
  return group(s, r, [](const MeshCoord& me, const MeshCoord& c) { return c.dp == me.dp && c.tp == me.tp; });
}
std::vector<int> model_parallel_group_ranks(const MeshShape& s, int r) {
  return group(s, r, [](const MeshCoord& me, const MeshCoord& c) { return c.dp == me.dp; });
}
std::vector<int> embedding_group_ranks(const MeshShape& s, int r) {
  const MeshCoord me = mesh_coord(s, r);
  if (me.pp != 0 && me.pp != s.pp - 1) return {};
  return group(s, r, [&](const MeshCoord& m, const MeshCoord& c) {
    return c.dp == m.dp && c.tp == m.tp && (c.pp == 0 || c.pp == s.pp - 1);
  });
}

}  // namespace zest
