// The Llama example's tests' model (test_llama_example.cpp,
// test_llama_mesh.cpp): GQA (4 query heads over 2 key-value heads, so that
// tp 2 keeps one kv head and its two query heads a rank), an explicit
// head_dim, a vocabulary wider than the bytes.
#pragma once

#include "config.h"

inline llama::Config llama_test_config(bool tied) {
  llama::Config c;
  c.vocab_size = 260;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}
