// A device mesh: the world's ranks arranged as dp x tp x pp, with one
// communicator per group this rank belongs to, split from the world once.
//
//   // zest-example: run
//   #include <zest/comm/inprocess_comm.h>
//
//   zest::run_inprocess(8, [](zest::Communicator& world) {
//     zest::DeviceMesh mesh(world, {.dp = 2, .tp = 2, .pp = 2});
//     // mesh.tp(): this layer's tensor-parallel ranks; mesh.pp(): the stages;
//     // mesh.dp(): the replicas, over which the engine shards:
//     //   zest::Engine engine(config, mesh.dp(), alloc, stream);
//     //   engine.set_model_parallel(mesh.engine_model_parallel());
//     ZEST_CHECK(mesh.dp().size() == 2 && mesh.tp().size() == 2 && mesh.pp().size() == 2, "2 x 2 x 2");
//   });
//
// The rank order is Megatron-LM's, tensor-parallel fastest (mesh_layout.h
// has the formula and a table). Its groups:
//   tp()              the ranks a layer's tensors are split over
//   dp()              the replicas of this rank's part of the model: the
//                     ZeRO engine's communicator
//   pp()              the pipeline: stage s is rank s of it, and activations
//                     go to rank s + 1 (send/recv, p2p.h)
//   model_parallel()  tp x pp: one whole copy of the model, over which the
//                     gradient norm and the overflow check are summed
//   embedding()       the first and last stage, for tied embeddings;
//                     nullptr on the stages between
//
// Hosts. Tensor parallelism all-reduces activations in every layer, so a tp
// group must not span hosts: the constructor learns each rank's host (an
// all-gather of a hash of its host name, or MeshOptions::host_of_rank) and
// refuses, naming the group and the hosts, a tp size whose groups would
// cross a host boundary. Launchers place consecutive ranks on a host
// (torchrun, mpirun's default by-slot mapping, Slurm's block distribution),
// so a tp size dividing the ranks per host fits.
//
// Dependencies: above comm/ and launch/ (it splits communicators), below
// engine/, which takes only the plain ModelParallel (model_parallel.h); the
// tensor-parallel layers and the pipeline schedule sit above both.
#pragma once

#include <memory>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/mesh/mesh_layout.h"
#include "zest/mesh/model_parallel.h"

namespace zest {

struct MeshOptions {
  // Refuse a tp group spanning hosts (above). false: allowed, for a test of
  // the arithmetic on fewer machines than the layout needs.
  bool tp_within_host = true;
  // The host of each world rank (any numbering), instead of the host names
  // the ranks report; for tests and for layouts the names do not tell.
  std::vector<int> host_of_rank;
};

class DeviceMesh {
 public:
  // Collective over `world`, which it borrows (it must outlive the mesh):
  // every rank passes the same shape. Throws a zest::Error naming the sizes
  // when a size is below 1 or their product is not world.size(), and naming
  // the group and hosts when a tp group would span hosts (every rank alike,
  // before any split).
  DeviceMesh(Communicator& world, MeshShape shape, MeshOptions options = {});
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  const MeshShape& shape() const { return shape_; }
  MeshCoord coord() const { return coord_; }
  int dp_rank() const { return coord_.dp; }
  int tp_rank() const { return coord_.tp; }
  int pp_rank() const { return coord_.pp; }
  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == shape_.pp - 1; }

  Communicator& world() const { return world_; }
  Communicator& dp() const { return *dp_; }
  Communicator& tp() const { return *tp_; }
  Communicator& pp() const { return *pp_; }
  Communicator& model_parallel() const { return *mp_; }
  Communicator* embedding() const { return embedding_.get(); }

  // For Engine::set_model_parallel: the model-parallel group (nullptr when
  // tp = pp = 1) and this rank's tp and pp coordinates.
  ModelParallel engine_model_parallel() const;

 private:
  Communicator& world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::unique_ptr<Communicator> dp_, tp_, pp_, mp_, embedding_;
};

}  // namespace zest
