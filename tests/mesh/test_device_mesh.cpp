// The device mesh: Megatron-LM's rank order, checked against its own
// formulas (written here as parallel_state.py's initialize_model_parallel
// writes them, with ranges), every group's communicator checked by an
// all-reduce of its members' rank bits (integers: exact), and bad shapes and
// host layouts refused with clear messages.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "zest/comm/inprocess_comm.h"
#include "zest/mesh/device_mesh.h"

using namespace zest;

namespace {

using Groups = std::vector<std::vector<int>>;

// Megatron-LM's groups for world = tp x dp x pp (cp = ep = 1), as its
// initialize_model_parallel builds them.
struct Megatron {
  Groups tp, dp, pp, mp, embedding;
};

Megatron megatron_groups(int world, int tp, int pp) {
  Megatron m;
  const int dp = world / (tp * pp);
  const int num_pp_groups = world / pp;
  // Data-parallel groups: for each pipeline stage i, ranks start_i + j
  // stepping by tp.
  for (int i = 0; i < pp; ++i) {
    const int start = i * num_pp_groups, end = (i + 1) * num_pp_groups;
    for (int j = 0; j < tp; ++j) {
      std::vector<int> g;
      for (int r = start + j; r < end; r += tp) g.push_back(r);
      m.dp.push_back(g);
    }
  }
  // Model-parallel groups: the i-th member of every data-parallel group.
  for (int i = 0; i < dp; ++i) {
    std::vector<int> g;
    for (const auto& d : m.dp) g.push_back(d[static_cast<size_t>(i)]);
    std::sort(g.begin(), g.end());
    m.mp.push_back(g);
  }
  // Tensor-parallel groups: consecutive blocks of tp.
  for (int i = 0; i < world / tp; ++i) {
    std::vector<int> g(static_cast<size_t>(tp));
    std::iota(g.begin(), g.end(), i * tp);
    m.tp.push_back(g);
  }
  // Pipeline groups: i, i + world/pp, ...; embedding groups their first and
  // last ranks.
  for (int i = 0; i < num_pp_groups; ++i) {
    std::vector<int> g;
    for (int r = i; r < world; r += num_pp_groups) g.push_back(r);
    m.pp.push_back(g);
    m.embedding.push_back(g.size() > 1 ? std::vector<int>{g.front(), g.back()} : g);
  }
  return m;
}

const std::vector<int>& group_of(const Groups& groups, int rank) {
  for (const auto& g : groups) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  }
  static const std::vector<int> none;
  return none;
}

std::vector<MeshShape> shapes() {
  std::vector<MeshShape> out;
  for (int dp : {1, 2}) for (int tp : {1, 2}) for (int pp : {1, 2}) out.push_back({dp, tp, pp});
  // The 8-rank layouts with a dimension of 4 or 8 too.
  for (int dp : {1, 2, 4, 8}) {
    for (int tp : {1, 2, 4, 8}) {
      for (int pp : {1, 2, 4, 8}) {
        if (dp * tp * pp == 8 && std::max({dp, tp, pp}) > 2) out.push_back({dp, tp, pp});
      }
    }
  }
  return out;
}

// The members' world ranks as bits, summed by the group's communicator.
int64_t members_by_all_reduce(Communicator& group, int world_rank) {
  int64_t bits = int64_t{1} << world_rank;
  group.all_reduce(&bits, &bits, 1, DType::kInt64, ReduceOp::kSum, Stream::default_for(group.device()));
  return bits;
}

int64_t bits_of(const std::vector<int>& ranks) {
  int64_t b = 0;
  for (int r : ranks) b |= int64_t{1} << r;
  return b;
}

}  // namespace

TEST_CASE("mesh ranks and groups follow Megatron-LM's initialize_model_parallel, tp fastest") {
  for (const MeshShape& s : shapes()) {
    CAPTURE(s.str());
    const Megatron m = megatron_groups(s.world(), s.tp, s.pp);
    for (int r = 0; r < s.world(); ++r) {
      CAPTURE(r);
      const MeshCoord c = mesh_coord(s, r);
      CHECK(mesh_rank(s, c) == r);
      CHECK(c.tp == r % s.tp);
      CHECK(c.dp == (r / s.tp) % s.dp);
      CHECK(c.pp == r / (s.tp * s.dp));
      CHECK(tp_group_ranks(s, r) == group_of(m.tp, r));
      CHECK(dp_group_ranks(s, r) == group_of(m.dp, r));
      CHECK(pp_group_ranks(s, r) == group_of(m.pp, r));
      CHECK(model_parallel_group_ranks(s, r) == group_of(m.mp, r));
      const bool end_stage = c.pp == 0 || c.pp == s.pp - 1;
      CHECK(embedding_group_ranks(s, r) == (end_stage ? group_of(m.embedding, r) : std::vector<int>{}));
    }
  }
  // The table of mesh_layout.h.
  const MeshShape s{2, 2, 2};
  CHECK(dp_group_ranks(s, 5) == std::vector<int>{5, 7});
  CHECK(model_parallel_group_ranks(s, 2) == std::vector<int>{2, 3, 6, 7});
  CHECK(pp_group_ranks(s, 1) == std::vector<int>{1, 5});
}

TEST_CASE("every sub-communicator of a DeviceMesh holds exactly its group, in rank order") {
  for (const MeshShape& s : shapes()) {
    CAPTURE(s.str());
    const Megatron m = megatron_groups(s.world(), s.tp, s.pp);
    run_inprocess(s.world(), [&](Communicator& world) {
      DeviceMesh mesh(world, s);
      const int r = world.rank();
      CHECK(mesh.coord() == mesh_coord(s, r));
      const auto check_group = [&](Communicator& c, const std::vector<int>& want) {
        REQUIRE(c.size() == static_cast<int>(want.size()));
        CHECK(want[static_cast<size_t>(c.rank())] == r);
        CHECK(members_by_all_reduce(c, r) == bits_of(want));
      };
      check_group(mesh.tp(), group_of(m.tp, r));
      check_group(mesh.dp(), group_of(m.dp, r));
      check_group(mesh.pp(), group_of(m.pp, r));
      check_group(mesh.model_parallel(), group_of(m.mp, r));
      CHECK(mesh.pp().rank() == mesh.pp_rank());
      CHECK(mesh.tp().rank() == mesh.tp_rank());
      CHECK(mesh.dp().rank() == mesh.dp_rank());
      if (mesh.is_first_stage() || mesh.is_last_stage()) {
        REQUIRE(mesh.embedding() != nullptr);
        check_group(*mesh.embedding(), group_of(m.embedding, r));
      } else {
        CHECK(mesh.embedding() == nullptr);
      }
      const ModelParallel mp = mesh.engine_model_parallel();
      CHECK(mp.tp_rank == mesh.tp_rank());
      CHECK(mp.pp_rank == mesh.pp_rank());
      CHECK(mp.size() == s.tp * s.pp);
      CHECK((mp.group == nullptr) == (s.tp * s.pp == 1));
    });
  }
}

TEST_CASE("bad mesh shapes and tp groups across hosts are refused, naming the sizes") {
  run_inprocess(6, [](Communicator& world) {
    CHECK_THROWS_WITH_AS(DeviceMesh(world, {2, 2, 2}),
                         doctest::Contains("device mesh dp 2 x tp 2 x pp 2 needs 8 ranks, but the world has 6"),
                         Error);
    CHECK_THROWS_WITH_AS(DeviceMesh(world, {0, 6, 1}),
                         doctest::Contains("device mesh dp 0 x tp 6 x pp 1: every size must be at least 1"), Error);
    MeshOptions three_per_host;
    three_per_host.host_of_rank = {0, 0, 0, 1, 1, 1};
    CHECK_THROWS_WITH_AS(DeviceMesh(world, {3, 2, 1}, three_per_host),
                         doctest::Contains("device mesh dp 3 x tp 2 x pp 1: tensor-parallel group [2,3] spans hosts "
                                           "(rank 3 is on another host than rank 2)"),
                         Error);
    // tp 3 fits three ranks per host; and the refusal left the world usable.
    DeviceMesh mesh(world, {2, 3, 1}, three_per_host);
    CHECK(mesh.tp().size() == 3);
    MeshOptions allowed = three_per_host;
    allowed.tp_within_host = false;
    DeviceMesh spanning(world, {3, 2, 1}, allowed);
    CHECK(spanning.tp().size() == 2);
  });
}
