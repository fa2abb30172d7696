// RoPE's inverse frequencies and scaling as transformers 5's
// modeling_rope_utils computes them, each step the torch op it uses on fp32
// tensors (so bit for bit what PyTorch computes on the same CPU): default,
// linear, llama3, yarn and dynamic (config.h's RopeScaling).
//
//   std::vector<float> inv = llama::rope_inv_freq(config);   // head_dim / 2 values
#pragma once

#include <cstdint>
#include <vector>

#include "config.h"

namespace llama {

// _compute_{default,linear_scaling,llama3,yarn,dynamic_ntk}_parameters's
// inv_freq. seq_len: dynamic scaling's length (rope_dynamic_length); at
// most max_position_embeddings, the default frequencies.
std::vector<float> rope_inv_freq(const Config& c, int64_t seq_len = 0);

// What cos and sin are multiplied by: yarn's attention factor (given, or
// from factor, mscale and mscale_all_dim), else 1.
double rope_attention_scaling(const Config& c);

// dynamic scaling's length for a batch whose positions reach seq_len - 1,
// as transformers' dynamic_rope_update keeps it in `cached`
// (max_position_embeddings at first): the longest batch so far, reset to
// max_position_embeddings by a batch shorter than that. 0 for other kinds.
int64_t rope_dynamic_length(const Config& c, int64_t seq_len, int64_t& cached);

}  // namespace llama
