// One number for the trained weights, so that two runs (on one host and
// across hosts, say) are seen to end with the same model to the last bit.
#pragma once

#include <cstdint>
#include <string>

#include "zest/engine/engine.h"

namespace examples {

// FNV-1a (64 bits) over every parameter's fp32 master values, bit by bit, in
// registration order, with no padding: the same for the same trained model
// whatever the stage, the number of ranks or where they ran. Collective.
uint64_t weights_digest(zest::Engine& engine);

// "weights digest, stage 2: 0x0123456789abcdef (152336 values)". Collective.
std::string format_weights_digest(zest::Engine& engine, int stage);

}  // namespace examples
