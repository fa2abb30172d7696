// The readers of a DeepSpeed file's sections (config_*.cpp), each taking
// the top-level Section and reading its own keys from it. Internal (not
// installed).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "zest/config/detail/config_reader.h"

namespace zest::config_detail {

// Counts and sizes: large enough for any model, small enough that products
// of two stay far from overflow.
constexpr int64_t kMaxCount = int64_t{1} << 50;

// zero_optimization, in either of DeepSpeed's forms (an object, or the
// deprecated true/false with a top-level allgather_size).
void read_zero(Section& top, FileState& file);
// fp16, bf16 (or bfloat16), amp, communication_data_type, data_types.
void read_precision(Section& top, FileState& file);
void read_optimizer(Section& top, FileState& file);
void read_scheduler(Section& top, FileState& file);
// aio: the NVMe tier's I/O settings; after read_zero (it notes the section
// as ignored without an "nvme" device).
void read_aio(Section& top, FileState& file);
// tensor_parallel and pipeline: the model's split, for the estimator.
void read_model_parallel(Section& top, FileState& file);
// The top-level keys of DeepSpeed's that are about something ZEST does not
// do (ignored, with the reason) or ask for a feature it lacks (refused).
void read_other_features(Section& top, FileState& file);
// An ignored section whose keys DeepSpeed checks (a pydantic model): they
// are checked too, so a misspelt one is still refused.
void ignore_section(Section& top, const char* key, std::initializer_list<const char*> keys, const std::string& reason);

}  // namespace zest::config_detail
