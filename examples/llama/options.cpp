#include "options.h"

#include <cctype>

#include <fmt/format.h>

#include "common/default_config.h"

namespace llama {

std::string usage() {
  return "usage: llama [--ranks N | --launch] [--stage S] [--dtype fp32|bf16] [--offload]\n"
         "             [--config config.json] [--steps N] [--batch ROWS] [--context N] [--lr X] [--seed N]\n"
         "             [--threads N] [--tied] [--lora R] [--lora-alpha A]\n"
         "             [--data FORTUNE_FILE_OR_DIR] [--eval-every N] [--val-windows N] [--print-every N]\n"
         "             [--format megatron|jsonl|text --data PATH [--tokenizer DIR] [--val-data PATH] [--max-seq-len N]\n"
         "              [--packing] [--epochs N]]\n"
         "             [--save CKPT_ROOT [--save-total-limit N]] [--load CKPT_ROOT]\n"
         "             [--hf HF_DIR] [--export-hf DIR] [--max-shard-size BYTES] [--export-dtype fp32|bf16|fp16]\n"
         "             [--export-adapters] [--export-replace] [--recompute] [--timeout SECONDS] [--accum N]\n"
         "             [--save-every N] [--loss-chunk TOKENS] [--warmup STEPS] [--lr-decay none|linear|cosine]\n"
         "             [--attention-tile TOKENS] [--mlp-tile TOKENS]\n"
         "             [--tp N] [--pp N] [--pipeline-schedule 1f1b|gpipe]\n"
         "Without --config or --hf: 4 layers, hidden 128, 4 heads (2 kv), intermediate 352, vocab 256.\n"
         "config.json's model_type: llama, mistral, qwen2 or qwen3 (docs/FINE_TUNING.md).\n"
         "--tp and --pp: ranks = dp x tp x pp (Megatron's order); tp divides the heads, the key-value heads,\n"
         "intermediate_size and the vocabulary, pp is at most the layers, and --accum sets the pipeline's\n"
         "micro-batches.\n"
         "Stage 3 prefetches up to 0.9 x hidden_size^2 elements ahead and keeps a released unit gathered for a\n"
         "reuse within as many (stage3_prefetch_bucket_size, stage3_max_reuse_distance).\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::App app("llama");
  bool tied = false;
  std::string shard_size;
  examples::add_lm_run_flags(app, o);
  app.add_flag("--tied", tied);
  app.add_flag("--recompute", o.recompute);
  app.add_option("--stage", o.stage)->check(cli::Range(0, 3));
  app.add_option("--dtype", o.dtype)->check(cli::IsMember({"fp32", "bf16"}));
  app.add_option("--config", o.config_path);
  app.add_option("--context", o.context)->check(cli::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--accum", o.accum)->check(cli::Range(1, 1 << 20));
  app.add_option("--save-every", o.save_every)->check(cli::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--loss-chunk", o.loss_chunk)->check(cli::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--attention-tile", o.attention_tile)->check(cli::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--mlp-tile", o.mlp_tile)->check(cli::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--warmup", o.warmup)->check(cli::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--lr-decay", o.lr_decay)->check(cli::IsMember({"none", "linear", "cosine"}));
  cli::Option* hf = examples::add_pretrained_flags(app, o, shard_size);
  app.get_option("--config")->excludes(hf);
  std::string schedule;
  examples::add_mesh_flags(app, o, schedule);
  examples::add_token_data_flags(app, o);
  cli::parse(app, argc, argv);
  examples::check_token_data_flags(o, o.hf_dir);
  if (o.loss_chunk > 0 && o.tp > 1) cli::usage_error("--loss-chunk needs --tp 1: a tp head is split by vocabulary");
  if (o.save_every > 0 && o.save_dir.empty()) cli::usage_error("--save-every needs --save: the checkpoint root");
  if (o.save_total_limit > 0 && o.save_dir.empty()) {
    cli::usage_error("--save-total-limit needs --save: the checkpoint root whose last N checkpoints to keep");
  }
  // Tokenized rows are the context: --max-seq-len, or --context's length.
  if (o.tokenized()) {
    if (o.max_seq_len > 0) o.context = o.max_seq_len;
    o.max_seq_len = o.context;
    if (o.data == examples::LmRunOptions().data) cli::usage_error("--format {} needs --data: the dataset to train on", o.format);
  }
  examples::finish_pretrained_flags(o, shard_size);
  examples::finish_mesh_flags(o, schedule);
  if (!o.config_path.empty() || !o.hf_dir.empty()) {
    const std::string path = !o.config_path.empty() ? o.config_path : o.hf_dir + "/config.json";
    try {
      o.model = Config::from_json_file(path);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("{}: {}", !o.config_path.empty() ? "--config" : "--hf", e.what()));
    }
  }
  if (tied) o.model.tie_word_embeddings = true;
  if (o.context > o.model.max_position_embeddings) {
    cli::usage_error("--context {} is longer than the model's max_position_embeddings {}", o.context,
                     o.model.max_position_embeddings);
  }
  if (o.mesh()) {
    const Config& m = o.model;
    if (m.num_attention_heads % o.tp != 0 || m.num_key_value_heads % o.tp != 0 || m.intermediate_size % o.tp != 0 ||
        m.vocab_size % o.tp != 0) {
      cli::usage_error("--tp {} must divide the {} heads, the {} key-value heads, intermediate_size {} and the "
                       "vocabulary of {}: each rank takes whole heads and equal slices",
                       o.tp, m.num_attention_heads, m.num_key_value_heads, m.intermediate_size, m.vocab_size);
    }
    if (o.pp > m.num_hidden_layers) {
      cli::usage_error("--pp {} is more stages than the model's {} layers: each stage needs a layer", o.pp,
                       m.num_hidden_layers);
    }
    // Everything else knows the mesh: --hf reads each rank's tp slices
    // (hf/hf_import.h), --lora puts the adapters on the split layers
    // (torch/tensor_parallel.h), --save and --load keep a part per tp x pp
    // rank (checkpoint/model_parallel_parts.h), --export-hf writes the whole
    // model (checkpoint/whole_model.h).
  }
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int world) {
  zest::EngineConfig c = examples::default_engine_config(opt.lr);
  examples::set_stage3_windows(c, opt.model.hidden_size);  // it says why
  c.zero.stage = opt.stage;
  examples::set_compute_dtype(c, opt.dtype);
  if (opt.offload) {
    if (opt.stage == 0) throw UsageError("--offload needs --stage 1, 2 or 3: stage 0 shards no optimizer state to offload");
    c.offload_optimizer.device = zest::OffloadDevice::kCpu;
  }
  c.gradient_accumulation_steps = opt.accum;
  if (opt.batch % (world * opt.accum) != 0) {
    throw UsageError(fmt::format("--batch {} does not divide into {} data-parallel ranks x {} micro-batches (--accum)",
                                 opt.batch, world, opt.accum));
  }
  return c;
}

}  // namespace llama
