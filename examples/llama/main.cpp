// Trains a Llama-family decoder (model.h: LlamaForCausalLM's modules and
// parameter names) byte by byte on Debian's fortune cookies
// (common/corpus.h) through the ZeRO engine, wrapped around the libtorch
// module by zest::TorchModule: prints loss, validation loss, tokens/s and
// each rank's memory by category, the parameters split into frozen and
// trainable, against the memory estimator.
//
//   llama --ranks 2 --stage 3                    the example's small model, from scratch
//   llama --config config.json --lora 8          a config.json's sizes; rank-8 adapters on
//                                                the projections, the base frozen
//   mpirun -np 4 llama --launch --stage 3        one process per rank (MPI)
//   llama --hf DIR --steps 0 --export-hf OUT     load a Hugging Face checkpoint, write it back
//   llama --ranks 8 --tp 2 --pp 2 --accum 4      a device mesh, dp x tp x pp = 2 x 2 x 2: each layer
//                                                split over 2 ranks, the layers over 2 pipeline
//                                                stages running 4 micro-batches 1F1B
//                                                (common/mesh_trainer.h)
//   llama --hf DIR --format jsonl --data train.jsonl --val-data val.jsonl --max-seq-len 2048 --packing
//         --epochs 3 --save-every 100 --save CKPT   fine-tuning on tokenized data (common/token_data.h):
//                                                the loss the mean over the global batch's trained
//                                                tokens, validation loss and perplexity
//
// On the fortune corpus, a checkpoint with a vocabulary larger than 256
// trains on byte ids.
// Threads: one torch intra-op thread per rank by default, as in
// examples/gpt/main.cpp (which says why).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/corpus.h"
#include "common/describe_model.h"
#include "common/lm_pretrained.h"
#include "common/lm_training.h"
#include "common/mesh_trainer.h"
#include "common/report.h"
#include "model.h"
#include "options.h"
#include "trainer.h"
#include "zest/comm/mpi_comm.h"
#include "zest/core/check.h"
#include "zest/hf/hf_checkpoint.h"
#include "zest/launch/bootstrap.h"
#include "zest/memory/raw_allocator.h"
#include "zest/torch/host_tensor_allocator.h"
#include "zest/torch/lora.h"
#include "zest/torch/module_construction.h"
#include "zest/torch/torch_module_io.h"

namespace {

using Clock = std::chrono::steady_clock;

// Note [loading without the whole model]: with --hf every block is built,
// given its adapters (--lora), and has its pretrained parameters made
// placeholders before the next block is built; the embeddings and head
// likewise (model.h). TorchModule then registers shapes only
// (placeholders_loaded_later) and import_hf reads each rank's own shard of
// the checkpoint, unit by unit: no rank ever holds more than one unit
// whole. The adapters are not in the checkpoint and keep their initial
// values (allow_missing). On a mesh each rank builds its stage's part and
// reads its tp slice of each tensor.
std::unique_ptr<zest::TorchModule> load_hf(const llama::Options& opt, zest::Engine& engine,
                                           llama::LlamaForCausalLM& model, const examples::Placement& placement) {
  const zest::LoraOptions lora = opt.lora();
  // The sizes against the checkpoint's shapes before a layer is built (a
  // config.json of another model would build it at that model's sizes).
  opt.model.check_shapes(zest::HfCheckpoint::open(opt.hf_dir), opt.hf_dir);
  model = llama::LlamaForCausalLM(
      opt.model, opt.seed,
      [&](int64_t i) {
        // On a mesh, this rank's part of the layer (its values come from
        // the checkpoint's tensors as tp slices: checkpoint/weights_load.cpp).
        llama::LlamaDecoderLayer block = placement.tp_size() > 1 ? llama::LlamaDecoderLayer(opt.model, placement.tp)
                                                                 : llama::make_block(opt.model, i, opt.seed);
        if (opt.lora_r > 0) {
          zest::enable_lora(*block, zest::llama_lora_targets(), lora, opt.seed, fmt::format("model.layers.{}.", i));
        }
        zest::make_placeholders(*block, [](const std::string& name) { return !zest::is_lora_adapter(name); });
        return block;
      },
      /*placeholders=*/true, placement);
  // --steps 0 loads, reports and exports: nothing trains, so every
  // parameter is registered frozen and no rank holds gradients or optimizer
  // state (at stage 3 a rank then grows by its shard of the weights alone).
  for (const auto& p : model->named_parameters()) {
    if (opt.steps == 0 || (opt.lora_r > 0 && !zest::is_lora_adapter(p.key()))) p.value().set_requires_grad(false);
  }
  zest::TorchModuleOptions options;
  options.placeholders_loaded_later = true;
  std::unique_ptr<zest::TorchModule> zt = examples::wrap(engine, model.ptr(), model->units(), options);
  examples::load_pretrained(*zt, opt.hf_dir);
  return zt;
}


void finish(const llama::Options& opt, const zest::EngineConfig& config, zest::Engine& engine, zest::TorchModule& zt,
            int world, bool printer, zest::UserState* saved = nullptr);

// --warmup and --lr-decay over a run of `total` steps, as transformers'
// get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup (and
// torchtune's) compute them: the optimizer step after `applied` steps runs at
// lr x lambda(applied), lambda rising linearly from 0 over the warmup, then
// 1, or falling linearly or by half a cosine to 0 at `total`. A function of
// the applied steps, which a checkpoint restores: a resume continues it.
void set_schedule(zest::Engine& engine, const llama::Options& opt, int64_t total) {
  if (opt.warmup == 0 && opt.lr_decay == "none") return;
  engine.set_lr_schedule([lr = static_cast<double>(opt.lr), warmup = opt.warmup, total, decay = opt.lr_decay](int64_t step) {
    if (step < warmup) return lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
    if (decay == "none") return lr;
    const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
    if (decay == "linear") return lr * std::max(0.0, static_cast<double>(total - step) / span);
    const double progress = static_cast<double>(step - warmup) / span;
    return lr * std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
  });
}

// Note [a step of tokenized data]: every rank reads its own rows of the
// step's global batch (its share, then its micro-batches), the ranks add up
// the batch's trained tokens (one collective of one integer), and each
// micro-batch's loss is its token losses' sum over that count
// (MeshTrainer::train_step): the update is the global batch's mean over
// its trained tokens, the same whatever the world size or --accum split
// it into.
// Note [the data position in a checkpoint]: a tokenized run's checkpoint
// carries what it read (format, file, size, rows, packing, seed, global
// batch: "data.identity") and the step the data resumes at ("data.step");
// a resume checks both against this run, since the rows of step s are a
// function of all of them (zest/data/global_batch.h) and a change would
// continue from another position without a word.
std::string data_identity(const llama::Options& opt, examples::TokenData& data) {
  return fmt::format("format {}, data {} ({} documents, {} tokens), rows of {}{}, seed {}, global batch {}", opt.format,
                     opt.data, data.dataset().size(), data.plan(0).tokens(), opt.max_seq_len,
                     opt.packing ? " packed" : "", opt.seed, opt.batch);
}

zest::UserState data_state(const std::string& identity, int64_t step) {
  zest::UserState s;
  s.global["data.identity"] = zest::to_bytes(identity);
  s.global["data.step"] = zest::to_bytes(step);
  return s;
}

void train_tokenized(const llama::Options& opt, const zest::EngineConfig& config, zest::Engine& engine,
                     examples::MeshTrainer& trainer, zest::TorchModule& zt, int64_t first, bool printer,
                     const zest::UserState& loaded, int world_size) {
  const int world = engine.comm().size(), rank = engine.comm().rank();
  const int64_t accum = opt.accum, rows = opt.batch / world, rows_per_micro = rows / accum;
  examples::TokenData data(opt, opt.data, opt.model.vocab_size, opt.max_seq_len, opt.batch, opt.seed);
  std::unique_ptr<zest::TokenDataset> held_out;
  if (!opt.val_data.empty()) held_out = examples::open_dataset(opt, opt.val_data, opt.model.vocab_size);
  const zest::RowPlanOptions row_options{.max_seq_len = opt.max_seq_len, .packing = opt.packing};
  const std::string identity = data_identity(opt, data);
  if (!opt.load_dir.empty()) {
    const auto saved = loaded.global.find("data.identity");
    ZEST_CHECK(saved != loaded.global.end(),
               "--load {}: the checkpoint records no tokenized data (a run on the fortune corpus, or a pretraining "
               "save): its data position cannot continue; fine-tune from its weights with --hf, or give the "
               "checkpoint of this data",
               opt.load_dir);
    const std::string was(reinterpret_cast<const char*>(saved->second.data()), saved->second.size());
    ZEST_CHECK(was == identity,
               "--load {}: the checkpoint read {}; this run reads {}: the rows of each step would differ, so "
               "the data position would not continue. Give the same data, --max-seq-len, --packing, --seed and "
               "--batch",
               opt.load_dir, was, identity);
    const int64_t step = zest::from_bytes<int64_t>(loaded.global.at("data.step"));
    ZEST_CHECK(step == first, "--load {}: the data position is step {}, the engine's {}", opt.load_dir, step, first);
  }
  const int64_t last = opt.epochs > 0 ? data.steps(opt.epochs) : first + opt.steps;
  set_schedule(engine, opt, last);
  if (printer) {
    const zest::RowPlan& plan = data.plan(0);
    fmt::print("data {} ({}): {} documents, epoch 0 {} rows of {} tokens{} ({} tokens, {} documents truncated), {} "
               "steps an epoch of {} rows; training steps {} to {}\n",
               opt.data, opt.format, data.dataset().size(), plan.rows(), opt.max_seq_len,
               opt.packing ? " packed" : "", plan.tokens(), plan.truncated_documents(), plan.rows() / opt.batch,
               opt.batch, first, last);
    std::fflush(stdout);
  }
  double val_loss = 0.0;
  const auto validate = [&](int64_t step) {
    if (!held_out) return;
    const examples::HeldOutLoss v = examples::held_out_loss(engine, trainer, *held_out, row_options, rows_per_micro);
    val_loss = v.loss;
    if (printer) {
      fmt::print("step {:5d}  validation loss {:.4f}  perplexity {:.3f}  ({} rows, {} trained tokens)\n", step, v.loss,
                 v.perplexity, v.rows, v.tokens);
    }
  };
  if (last > first) validate(first);
  double seconds = 0.0;
  int64_t trained_total = 0;
  for (int64_t step = first; step < last; ++step) {
    const auto start = Clock::now();
    std::vector<examples::Batch> micro_batches;
    for (int64_t m = 0; m < accum; ++m) micro_batches.push_back(data.rows(step, rank * rows + m * rows_per_micro, rows_per_micro));
    const int64_t trained = examples::global_trained_tokens(engine, micro_batches);
    const examples::MeshTrainer::Step s = trainer.train_step(micro_batches, trained);
    const double dt = std::chrono::duration<double>(Clock::now() - start).count();
    seconds += dt;
    trained_total += trained;
    const bool end = step == last - 1;
    if ((step - first) % opt.print_every == 0 || end) {
      const float mean = examples::mean_over_ranks(engine, s.loss);
      if (printer) {
        const auto [epoch, batch] = data.position(step);
        const double eta = seconds / static_cast<double>(step + 1 - first) * static_cast<double>(last - step - 1);
        fmt::print("step {:5d}  epoch {} batch {:4d}  loss {:.4f}  lr {:.2e}  |g| {:7.4f}{}  {:7.1f} ms  {:8.0f} "
                   "tokens/s  {:8.0f} trained tokens/s  eta {:.0f} s\n",
                   step, epoch, batch, mean, s.result.lr, s.result.grad_norm,
                   s.result.applied ? "" : "  (" + s.result.skip_reason + ")", dt * 1e3,
                   static_cast<double>(opt.batch * opt.max_seq_len) / dt, static_cast<double>(trained) / dt, eta);
        std::fflush(stdout);
      }
    }
    if ((step + 1 - first) % opt.eval_every == 0 || end) validate(step + 1);
    if (opt.save_every > 0 && (step + 1) % opt.save_every == 0 && !end) {
      zest::UserState state = data_state(identity, step + 1);
      zest::CheckpointOptions co;
      co.user_state = &state;
      co.exclude_frozen_parameters = opt.lora_r > 0;  // the adapters and their state, not the base
      co.keep_last = opt.save_total_limit;
      const std::string dir = zt.save(opt.save_dir, co);
      if (printer) fmt::print("saved {}\n", dir);
    }
  }
  if (printer && seconds > 0) {
    fmt::print("mean {:.0f} tokens/s, {:.0f} trained tokens/s\n",
               static_cast<double>((last - first) * opt.batch * opt.max_seq_len) / seconds,
               static_cast<double>(trained_total) / seconds);
  }
  if (printer && held_out && last > first) fmt::print("final validation loss, stage {}: {:.17g}\n", opt.stage, val_loss);
  zest::UserState state = data_state(identity, std::max(last, first));
  finish(opt, config, engine, zt, world_size, printer, &state);
}

void train(const llama::Options& opt, const examples::Corpus* corpus_or_null, const zest::EngineConfig& config,
           zest::Communicator& comm) {
  torch::set_num_threads(opt.threads);
  const bool printer = comm.rank() == 0;
  examples::NamedOptions shared = examples::shared_run_options(opt, opt, opt);
  shared.insert(shared.end(), {{"the model (--config, --tied)", opt.model.to_json()},
                               {"--stage", fmt::format("{}", opt.stage)},
                               {"--dtype", opt.dtype},
                               {"--context", fmt::format("{}", opt.context)},
                               {"--accum", fmt::format("{}", opt.accum)},
                               {"--recompute", fmt::format("{}", opt.recompute)},
                               {"--save-every", fmt::format("{}", opt.save_every)},
                               {"--loss-chunk", fmt::format("{}", opt.loss_chunk)},
                               {"--attention-tile", fmt::format("{}", opt.attention_tile)},
                               {"--mlp-tile", fmt::format("{}", opt.mlp_tile)},
                               {"--warmup", fmt::format("{}", opt.warmup)},
                               {"--lr-decay", opt.lr_decay},
                               {"--format", opt.format},
                               {"--val-data", opt.val_data},
                               {"--max-seq-len", fmt::format("{}", opt.max_seq_len)},
                               {"--packing", fmt::format("{}", opt.packing)},
                               {"--epochs", fmt::format("{}", opt.epochs)}});
  examples::check_ranks_agree(comm, shared);
  // With --tp or --pp each rank holds a part of the model and the engine
  // shards it over the data-parallel group; the batch's rows are split over
  // that group.
  std::optional<zest::DeviceMesh> mesh;
  if (opt.mesh()) mesh.emplace(comm, zest::MeshShape{.dp = opt.data_parallel(comm.size()), .tp = opt.tp, .pp = opt.pp});
  zest::Communicator& group = mesh ? mesh->dp() : comm;
  const int world = group.size(), rank = group.rank();
  zest::CachingAllocator allocator(zest::make_host_allocator());
  zest::Engine engine(config, group, allocator, zest::Stream::default_for(comm.device()));
  if (mesh) engine.set_model_parallel(mesh->engine_model_parallel());
  llama::LlamaForCausalLM model{nullptr};
  std::unique_ptr<zest::TorchModule> zt;
  if (!opt.hf_dir.empty()) {
    zt = load_hf(opt, engine, model, examples::placement_of(mesh ? &*mesh : nullptr));
  } else {
    model = llama::LlamaForCausalLM(opt.model, opt.seed, examples::placement_of(mesh ? &*mesh : nullptr));
    if (opt.lora_r > 0) llama::enable_lora(*model, opt.lora(), opt.seed);
    zt = llama::wrap(engine, model);
  }
  if (opt.recompute) model->set_layer_runner(llama::checkpointing(*zt));
  model->set_loss_chunk(opt.loss_chunk);
  model->set_tiles(opt.attention_tile, opt.mlp_tile);

  int64_t first = 0;
  zest::UserState loaded;
  if (!opt.load_dir.empty()) {
    zest::CheckpointOptions co;
    co.user_state = &loaded;
    zt->load(opt.load_dir, co);
    first = engine.progress().applied_steps + engine.progress().skipped_steps;
    if (printer) fmt::print("resumed from {} at step {}\n", opt.load_dir, first);
  }
  const int64_t accum = opt.accum, rows = opt.batch / world, rows_per_micro = rows / accum, context = opt.context;
  examples::MeshTrainer trainer(mesh ? &*mesh : nullptr, *zt, *model, rows_per_micro, context, opt.pipeline_schedule);
  if (corpus_or_null == nullptr) {
    train_tokenized(opt, config, engine, trainer, *zt, first, printer, loaded, world);
    return;
  }
  const examples::Corpus& corpus = *corpus_or_null;
  set_schedule(engine, opt, first + opt.steps);
  const int64_t windows = examples::validation_windows(corpus, opt.val_windows, context, world);
  double val_loss = 0.0;
  const auto validate = [&](int64_t step) {
    val_loss = trainer.validation_loss(corpus, windows);
    if (printer) {
      fmt::print("step {:5d}  validation loss {:.4f}  ({} windows of {} bytes)\n", step, val_loss, windows, context);
    }
  };
  if (opt.steps > 0) validate(first);
  double seconds = 0.0;
  for (int64_t step = first; step < first + opt.steps; ++step) {
    const auto start = Clock::now();
    std::vector<examples::Batch> micro_batches;
    for (int64_t m = 0; m < accum; ++m) {
      micro_batches.push_back(
          corpus.train_batch(step, rank * rows + m * rows_per_micro, rows_per_micro, context, opt.seed));
    }
    const examples::MeshTrainer::Step s = trainer.train_step(micro_batches);
    const double dt = std::chrono::duration<double>(Clock::now() - start).count();
    seconds += dt;
    const bool last = step == first + opt.steps - 1;
    // The same decisions on every rank: what follows is collective.
    if ((step - first) % opt.print_every == 0 || last) {
      const float mean = examples::mean_over_ranks(engine, s.loss);
      if (printer) examples::print_step(step, mean, s.result, dt * 1e3, static_cast<double>(opt.batch * context) / dt);
    }
    if ((step + 1 - first) % opt.eval_every == 0 || last) validate(step + 1);
    if (opt.save_every > 0 && (step + 1) % opt.save_every == 0 && !last) {
      zest::CheckpointOptions co;
      co.exclude_frozen_parameters = opt.lora_r > 0;  // the adapters and their state, not the base
      co.keep_last = opt.save_total_limit;
      const std::string dir = zt->save(opt.save_dir, co);
      if (printer) fmt::print("saved {}\n", dir);
    }
  }
  if (printer) {
    if (seconds > 0) fmt::print("mean {:.0f} tokens/s\n", static_cast<double>(opt.steps * opt.batch * context) / seconds);
    // Every digit, for scripts (scripts/mesh_check.sh), as the gpt example.
    if (opt.steps > 0) fmt::print("final validation loss, stage {}: {:.17g}\n", opt.stage, val_loss);
  }
  finish(opt, config, engine, *zt, world, printer);
}

// The memory report, and the checkpoint and export after the last step.
void finish(const llama::Options& opt, const zest::EngineConfig& config, zest::Engine& engine, zest::TorchModule& zt,
            int world, bool printer, zest::UserState* saved) {
  const std::vector<zest::MemoryReport> memory = examples::gather_memory(engine);
  const zest::MemoryEstimate estimate = zest::estimate_memory(examples::describe_model(engine.layout()),
                                                              zest::EstimateOptions::from_config(config, world));
  if (printer) {
    fmt::print("\nmemory per rank by category (the engine's allocator; torch's activations are not in it):\n{}",
               examples::format_memory(memory, estimate));
    fmt::print("\nparameters on the device, frozen and trainable:\n{}", examples::format_parameter_split(memory, estimate));
  }
  if (!opt.save_dir.empty()) {
    zest::CheckpointOptions co;
    co.user_state = saved;
    co.exclude_frozen_parameters = opt.lora_r > 0;  // the adapters and their state, not the base
    co.keep_last = opt.save_total_limit;
    const std::string dir = zt.save(opt.save_dir, co);
    if (printer) fmt::print("saved {}\n", dir);
  }
  if (!opt.export_hf_dir.empty()) {
    // config.json: the loaded checkpoint's, or the sizes trained from scratch.
    examples::export_pretrained(engine, opt, opt.hf_dir.empty() ? opt.model.to_json() : std::string(),
                                opt.hf_dir.empty() ? std::string("bfloat16") : opt.model.torch_dtype,
                                zest::llama_lora_targets(),
                                {opt.save_dir, opt.load_dir, opt.config_path, opt.data, opt.val_data});
  }
  if (printer) std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const llama::Options opt = llama::parse_options(argc, argv);
    // Before any rank's thread uses libtorch: its allocator switch is not
    // synchronized.
    zest::use_huge_page_host_tensors();
    std::unique_ptr<zest::Communicator> launched;
    if (opt.launch) launched = zest::init_distributed(zest::Device::host(), opt.comm);
    const bool printer = !launched || launched->rank() == 0;
    const int world = launched ? launched->size() : opt.ranks;
    const zest::EngineConfig config = llama::engine_config(opt, opt.data_parallel(world));
    std::optional<examples::Corpus> corpus;
    if (!opt.tokenized()) corpus = examples::Corpus::load(opt.data);
    if (printer) {
      if (corpus) {
        fmt::print("corpus {}: {} fortune cookies, {} training bytes, {} validation bytes\n", opt.data,
                   corpus->cookies(), corpus->train().size(), corpus->validation().size());
      }
      const std::string shape =
          opt.mesh() ? fmt::format(" (dp {} x tp {} x pp {})", opt.data_parallel(world), opt.tp, opt.pp) : "";
      fmt::print("stage {}: {} ranks{}, Llama of {} parameters ({}), {}, {}{}\n", opt.stage, world, shape,
                 opt.model.parameters(), opt.model.str(), zest::dtype_name(config.compute_dtype()),
                 zest::optimizer_name(config.optimizer.kind),
                 opt.lora_r > 0 ? fmt::format(", LoRA r {} alpha {:g} on {}", opt.lora_r, opt.lora_alpha,
                                              fmt::join(zest::llama_lora_targets(), ", "))
                                : std::string());
      std::fflush(stdout);
    }
    examples::run_on_ranks(
        launched.get(), opt.ranks, [&](zest::Communicator& comm) { train(opt, corpus ? &*corpus : nullptr, config, comm); }, opt.comm);
    return 0;
  } catch (const llama::UsageError& e) {
    return cli::usage_exit("llama", e, llama::usage());
  } catch (const std::exception& e) {
    // Under mpirun the other ranks would wait for this one in their next
    // collective: end the job.
    zest::MpiEnvironment::abort_job(fmt::format("llama: {}", e.what()));
  }
}
