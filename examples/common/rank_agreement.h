// The options every rank of a job must be started with alike (the batch,
// the data, the checkpoint to load, the model, the mesh), compared across
// the ranks before anything else runs. A rank started differently would
// otherwise wait in a collective until its timeout (--load on one rank), or
// train another run to the end without a word (--batch on one rank).
//
//   examples::check_ranks_agree(comm, {{"--batch", "16"}, {"--data", "corpus.bin"}});
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "zest/comm/communicator.h"

namespace examples {

using NamedOptions = std::vector<std::pair<std::string, std::string>>;

// Collective over `comm`: throws zest::Error on every rank, naming the
// first option whose value differs and the ranks that differ from rank 0
// (with this rank's value), when any does. The same names in the same order
// on every rank.
void check_ranks_agree(zest::Communicator& comm, const NamedOptions& options);

}  // namespace examples
