// What the engine must know of the model-parallel dimensions around its
// data-parallel group: where a rank sits in the tensor- and pipeline-
// parallel grid, and the communicator over which what is global to the
// model (the gradient norm, the overflow check) is summed.
//
// DeviceMesh::model_parallel() (device_mesh.h) fills it; Engine::
// set_model_parallel() (engine.h) takes it. A plain struct, so that the
// engine needs nothing else of the mesh.
#pragma once

#include <string_view>

#include "zest/comm/communicator.h"

namespace zest {

struct ModelParallel {
  // The tp x pp ranks that hold this rank's data-parallel index: together
  // they hold one whole copy of the model (Megatron's model-parallel
  // group). nullptr when tp = pp = 1.
  Communicator* group = nullptr;
  int tp_rank = 0;
  int tp_size = 1;
  int pp_rank = 0;
  int pp_size = 1;

  int size() const { return tp_size * pp_size; }
};

// Throws a zest::Error saying that `what` (e.g. "import_weights") does not
// yet support a model split over tp x pp ranks, when mp.size() > 1: each tp
// rank holds slices under the full parameters' names and each stage some of
// the units, which an import of a whole model's file would have to cut.
void refuse_model_parallel(const ModelParallel& mp, std::string_view what);

}  // namespace zest
