// The whole model's weights for an export, one unit at a time, whether the
// engine's data-parallel group holds all of it or each rank of a tensor x
// pipeline mesh (Engine::model_parallel()) holds a part: export_weights and
// export_hf write through it, so a mesh writes what one rank holding the
// whole model writes.
//
//   // zest-example: prelude=engine
//   #include <zest/checkpoint/whole_model.h>
//   zest::WholeModel whole(engine);  // collective over the mesh
//   for (int u = 0; u < whole.layout().num_units(); ++u) {
//     const std::vector<float> values = whole.unit(u);  // the whole unit, on the writer
//     whole.on_every_rank("writing", [&] {
//       if (whole.writer()) ZEST_CHECK(values.size() >= whole.layout().unit(u).numel, "unit {}", u);
//     });
//   }
//
// On a mesh. The whole model is what a one-rank run of the same program
// registers: every stage's units in stage order (stage 0's first), a unit
// of the same name on several stages being one unit (TorchModule's "<root>"
// unit, the parameters outside the listed units: the embeddings on the
// first stage, the final norm on the last), and each tensor-parallel
// parameter whole, its tp slices joined along their split (ParamSpec::
// tp_split); a tp_replicated parameter is taken from tp rank 0. A parameter
// that is neither, with tp > 1, is refused by name: its split is not
// guessed. Only the model-parallel group of data-parallel index 0 moves
// data: its ranks send each unit's master values (Engine::unit_master) to
// the group's rank 0, the writer (world rank 0), which joins them. No rank
// holds more than one unit of the whole model and its slices.
//
// Errors. Every step runs through on_every_rank, which agrees over the data-
// parallel group and then over the model-parallel group, so a failure on any
// rank of the mesh (a full disk on the writer, a bad split) throws on every
// rank, and no rank waits for a transfer that will not come.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "zest/engine/engine.h"
#include "zest/engine/layout.h"

namespace zest {

class WholeModel {
 public:
  // Collective over the mesh (every rank of every data-parallel group, or
  // the engine's group without a mesh). On a mesh the ranks of each
  // model-parallel group exchange their registrations (names, shapes,
  // splits) and build the whole model's layout; a registration that cannot
  // be joined throws on every rank, naming the parameter.
  explicit WholeModel(Engine& engine);
  ~WholeModel();
  WholeModel(const WholeModel&) = delete;
  WholeModel& operator=(const WholeModel&) = delete;

  // The whole model's layout (one partition: offsets as a one-rank engine
  // lays them out), on every rank.
  const ModelLayout& layout() const;
  // Whether this rank writes: rank 0 of the data-parallel group, and on a
  // mesh of the model-parallel group too (world rank 0).
  bool writer() const { return writer_; }

  // Collective over the mesh. Unit u of layout(): its fp32 master values in
  // its flat layout (layout().unit(u), alignment gaps zero) on the writer;
  // on other ranks an unspecified vector. Each unit at most once, in any
  // order the same on every rank.
  std::vector<float> unit(int u);

  // Runs `fn` on every rank and agrees on the outcome over the mesh, as
  // zest::on_every_rank (on_every_rank.h) does over the data-parallel group:
  // if it threw anywhere, every rank throws.
  void on_every_rank(const char* what, const std::function<void()>& fn);

 private:
  struct Mesh;

  Engine& engine_;
  bool writer_ = false;
  std::unique_ptr<Mesh> mesh_;  // null without model parallelism
};

}  // namespace zest
