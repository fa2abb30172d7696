// Checkpoints of a model split over a tensor- and pipeline-parallel mesh
// (mesh/model_parallel.h): each tp x pp coordinate's part of the model is a
// checkpoint of its own, saved by the part's data-parallel group into
//
//   root/mp_rank_TT_PPP/        (Megatron's names: tp rank, pp rank)
//     latest, step_000100/manifest.json, rank_00000.bin, ...
//
// so a load on another data-parallel size reshards each part as any
// checkpoint. The parts move together: before any part publishes, every part
// says over the model-parallel group whether it got that far, and a part
// that failed makes the others discard theirs; a load checks that every
// part read the same tag at the same step before anything is written into
// an engine. A mesh of another tp or pp size is refused by name: its parts
// are split otherwise (only dp reshards).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zest/engine/engine.h"

namespace zest {

// root/mp_rank_TT_PPP for this engine's coordinates.
std::string model_parallel_part_root(const std::string& root, const ModelParallel& mp);

// Throws a zest::Error naming both meshes unless `root` holds exactly the
// parts of a tp_size x pp_size mesh (or naming the missing part).
void check_model_parallel_parts(const std::string& root, const ModelParallel& mp);

// Collective over the model-parallel group: every part says whether it got
// here (`ok`) and, for a load, which checkpoint it read (tag and step).
// Returns on every rank when all are ok and agree; throws a zest::Error
// naming the first part that failed or differs otherwise. A rank with
// ok = false returns (it rethrows its own error).
void agree_over_model_parallel(Engine& engine, std::string_view what, const std::string& root, bool ok,
                               const std::string& tag = {}, int64_t steps = 0);

}  // namespace zest
