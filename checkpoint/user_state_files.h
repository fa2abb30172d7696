// The user state files of a checkpoint (user_state.h): their names and
// readers, for the save and load of checkpoint.cpp and for zest-ckpt, which
// inspects and reshards them.
#pragma once

#include <string>

#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/checkpoint/user_state.h"

namespace zest {

inline constexpr const char* kUserGlobalFile = "user_global.bin";
// user_rank_00003.bin
std::string user_rank_file_name(int rank);

// The user state of checkpoint `dir` for `rank` of a job of `world` ranks,
// each file checked against the manifest (size, CRC-32, blob count) first.
// Empty when the checkpoint has none; per-rank state saved at another world
// size fails or is dropped by `policy`.
UserState read_user_state(const std::string& dir, const CheckpointManifest& manifest, int rank, int world,
                          PerRankUserState policy);

// Every user state file of checkpoint `dir` (the global one and each rank's),
// with the checks read_user_state applies: for zest-ckpt verify.
void verify_user_state(const std::string& dir, const CheckpointManifest& manifest);

}  // namespace zest
