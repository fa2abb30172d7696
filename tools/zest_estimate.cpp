// zest-estimate: per-rank memory of a model under every ZeRO stage, before
// running it, and the largest model that fits a device. The numbers are the
// engine's (estimate/memory_estimate.h), so a run's memory_report() measures
// what this prints.
//
//   zest-estimate --params 7.5e9 --world 64
//   zest-estimate --units model.txt --world 8 --dtype bf16 --device-memory 80GiB
//   zest-estimate --params 13e9 --world 1 --device-memory 32GiB --host-memory 256GiB
//   zest-estimate --params 7e9 --unit-numel 2e8 --hosts 16 --ranks-per-host 8 --link nvlink4 --link ib-ndr
//   zest-estimate --layers 96 --hidden-size 12288 --heads 96 --vocab 51200 --seq 2048 --world 12 --tp 8 --pp 16
//   zest-estimate --hf-config Meta-Llama-3-8B --world 8 --device-memory 80GiB
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "zest/core/check.h"
#include "zest/config/config.h"
#include "zest/core/file_io.h"
#include "zest/estimate/cost_model.h"
#include "zest/estimate/memory_estimate.h"
#include "zest/estimate/mesh_estimate.h"

namespace {

constexpr const char* kUsage = R"(usage: zest-estimate (--params N [--unit-numel N] | --units FILE | --layers N ... | --hf-config PATH)
                     --world N [options]

model (one of):
  --hf-config PATH         a Hugging Face config.json, or a checkpoint directory holding one: llama,
                           mistral, qwen2 (biases on q, k and v) and qwen3 (head_dim, q and k norms),
                           described as the transformer of --layers (so --tp and --pp split it); the
                           compute dtype from its torch_dtype unless --dtype; other families refused
  --params N               parameter count, e.g. 7.5e9 (one unit unless --unit-numel)
  --unit-numel N           with --params: units (layers, blocks) of N parameters each
  --units FILE             one unit per line "name numel [numel...]", or a JSON list of
                           [numel, ...] or {"name": ..., "params": [...], "count": n}
  --layers N               a GPT as Megatron-LM builds it (learned positions, LayerNorm and biases,
                           a GELU MLP, the head tied to the word embeddings), one unit a layer, with
                           --hidden-size N, --heads N, --vocab N (padded as Megatron pads it) and
                           optionally --seq N (position embeddings; default 0: none), --ffn-hidden-size
                           N (default 4 x hidden) and --untie-embeddings-and-output-weights. Megatron's
                           names are aliases: --num-layers, --num-attention-heads, --vocab-size,
                           --max-position-embeddings
                           Llama's forms, with Megatron's flags: --swiglu (fc1 the gate and up
                           projections), --normalization RMSNorm (norms without bias),
                           --disable-bias-linear, --group-query-attention --num-query-groups N (key-value
                           heads), --position-embedding-type rope (no position embeddings)
mesh (with --layers):
  --tp N                   tensor-parallel ranks (alias --tensor-model-parallel-size; default 1): attention,
                           MLP and word embeddings split over them, norms and row-parallel biases whole
  --pp N                   pipeline stages (alias --pipeline-model-parallel-size; default 1): layers / N
                           each, the embeddings on the first, the final norm and head on the last. Prints
                           each stage's rank side by side and the busiest one in full
options:
  --world N                data-parallel ranks, the ZeRO shards (required, unless --hosts gives them);
                           the mesh has --world x --tp x --pp ranks
  --stage 0|1|2|3          show this stage only (default: all four side by side)
  --dtype fp16|bf16|fp32   compute dtype (default fp16, the ZeRO paper's)
  --optimizer adamw|adam|lamb|sgd|sgd-momentum   (default adamw)
  --master-dtype fp32|bf16 master weights (bf16: DeepSpeed's bf16_master_weights_and_grads, with
                           --dtype bf16; they are then the parameters themselves)
  --state-dtype fp32|bf16  optimizer state (bf16: bf16_optimizer_states, with --master-dtype bf16)
  --accum N                gradient accumulation steps (default 1)
  --persistence-threshold N  stage 3: units of at most N parameters stay whole (default 100000)
  --live-units N           stage 3: gathered units at once (default: the engine's prefetch window, or
                           the units stage3_max_reuse_distance keeps gathered from forward to
                           backward when more: DeepSpeed's 1e9 unless --config sets it)
  --grad-units N           stages 2-3: full gradient buffers at once (default: from the reduce bucket)
  --device-memory SIZE     e.g. 80GiB, 80GB, 8.5e10: also print the largest model that fits
  --runtime-reserve SIZE   device memory kept for the CUDA context and NCCL's buffers, outside the
                           engine's (default 512MiB, plus 1GiB for NCCL when --world > 1; 0 for none)
  --offload-optimizer none|cpu|nvme  cpu: fp32 master weights and optimizer state in host memory
                           (stages 1-3); nvme: in a swap file per rank (two copies of them, 4096-aligned
                           records), streamed through 4 host buffers; prints the NVMe bytes and
                           ZeRO-Infinity's published count beside them
  --offload-ratio R        with --offload-optimizer cpu or nvme: the fraction offloaded, 0 to 1 (default 1)
  --offload-param none|cpu|nvme  cpu (stage 3, with --offload-optimizer cpu or nvme at ratio 1): the
                           sharded parameters in host memory; nvme (with --offload-optimizer nvme): in a
                           swap file per rank, read through the aio buffers
  --host-memory SIZE       with --device-memory: host memory of one machine; prints the largest model
                           that fits, per stage and offload choice
  --nvme-capacity SIZE     with --host-memory: NVMe capacity of one machine (e.g. 2TB), shared like
                           --host-memory; adds the rows with the optimizer on NVMe, its swap files
                           bounded by it
  --ranks-per-host N       ranks of one machine: they share --host-memory and, with --hosts, its
                           network link (default: --world, one machine)
  --mics-shard-size S      stage 3: MiCS / HSDP, model states sharded over groups of S ranks (a divisor
                           of --world, e.g. the ranks of one host) and replicated across the groups
                           (DeepSpeed's mics_shard_size; -1: off)
  --hpz-partition-size H   stage 3: ZeRO++ hpZ, a secondary copy of the parameters sharded over groups
                           of H ranks for the gathers after the first of each step (1: off)
  --config FILE            a DeepSpeed JSON config: stage, dtype, optimizer, accumulation,
                           thresholds and buckets from it, and with --layers tensor_parallel.autotp_size
                           (or tp.tp_size) and pipeline.stages as --tp and --pp; the flags override it
  --micro-batch N          with --config: what "auto" micro-batch sizes take (train_batch_size
                           "auto" too, with --world and --accum)
  --hidden-size N          with --layers, the transformer's; with --config, also for "auto" bucket sizes
                           (as Hugging Face fills them: hidden^2, 0.9 hidden^2, 10 hidden)
  --total-steps N          with --config: what an "auto" scheduler total_num_steps takes
communication (the cost model, estimate/cost_model.h):
  --hosts N                with --ranks-per-host R: a world of N x R ranks; prints, per mode (flat
                           ZeRO-0..3, HSDP = MiCS with S = R, MiCS with --mics-shard-size, hpZ with
                           --hpz-partition-size or H = R), memory per rank, the bytes each rank sends
                           on groups within a host and spanning hosts, a host's link bytes, and the
                           predicted seconds of communication per optimizer step (alpha-beta, nothing
                           overlapped with compute)
  --link intra=BW[,LAT]    a rank's bandwidth (per direction) and latency to its host's ranks, e.g.
                           intra=450GB/s,3us (default: nvlink4)
  --link inter=BW[,LAT]    one host's bandwidth (per direction, all its NICs, shared by its ranks)
                           and latency to the other hosts, e.g. inter=400GB/s,5us (8 x 400 Gbit/s)
                           or inter=100Gbit/s (default: ib-ndr)
  --link PRESET            a named link (intra or inter as it describes), or intra=PRESET /
                           inter=PRESET: nvlink4, nvlink3 (within a host); ib-ndr, ib-hdr, efa-400,
                           efa-100 (a host's NICs); sim-intra, sim-inter (measured here, on the
                           simulated hosts of tests/multihost). BW: B, kB, MB, GB, TB or bit, kbit,
                           Mbit, Gbit per second (400GB/s, 25Gbit/s, 100Gbps; a bare number is
                           bytes/s). LAT: ns, us, ms, s
  --algorithm ring|pairwise  ring: NCCL's rings (default); pairwise: ZEST's MPI backend, every rank
                           sending its part to every other directly
  --traffic                with --hosts: also each mode's collectives by kind (forward and backward
                           gathers, reduce-scatters, all-reduces across replicas, gathers after the
                           update) and communicator, with calls, bytes and seconds a step
)";

using cli::usage_error;

// A whole number in [lo, hi], written as 12, 7.5e9 or 1e6.
constexpr double kMaxCount = 0x1p48;
constexpr double kMaxInt = 0x1p31 - 1;  // flags kept in an int
size_t count_arg(const std::string& flag, const std::string& text, double lo, double hi = kMaxCount) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi ||
      std::floor(v) != v) {
    usage_error("{} '{}': expected a whole number from {:.0f} to {:.0f} (e.g. 64, 7.5e9)", flag, text, lo,
                hi);
  }
  return static_cast<size_t>(v);
}

// 80GiB, 80 GB, 8.5e10, 512MiB: decimal (kB, MB, GB, TB) and binary (KiB,
// MiB, GiB, TiB) units, bytes when there is none.
int64_t size_arg(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit(end != nullptr ? end : "");
  unit.erase(0, unit.find_first_not_of(' '));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},      {"b", 1},        {"kb", 1e3},      {"mb", 1e6},      {"gb", 1e9},
      {"tb", 1e12}, {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40}};
  const auto it = kUnits.find(unit);
  if (end == text.c_str() || it == kUnits.end() || !std::isfinite(v) || v <= 0 ||
      v * it->second > 0x1p62) {
    usage_error("{} '{}': expected a size such as 80GiB, 80GB or 8.5e10 (units: B, kB, MB, GB, TB, "
                "KiB, MiB, GiB, TiB)", flag, text);
  }
  return static_cast<int64_t>(v * it->second);
}

// --flag value and --flag=value, each flag at most once (CLI11); the values
// are checked as they are used, with the ranges of count_arg and size_arg.
std::map<std::string, std::string> parse_flags(int argc, char** argv) {
  static const char* kFlags[] = {"--params", "--unit-numel", "--units", "--world", "--stage",
                                 "--dtype", "--optimizer", "--master-dtype", "--state-dtype", "--accum", "--persistence-threshold",
                                 "--live-units", "--grad-units", "--device-memory", "--runtime-reserve",
                                 "--offload-optimizer", "--offload-ratio", "--offload-param",
                                 "--host-memory", "--nvme-capacity", "--ranks-per-host", "--config", "--micro-batch",
                                 "--hidden-size", "--total-steps", "--mics-shard-size",
                                 "--hpz-partition-size", "--hosts", "--algorithm", "--ffn-hidden-size",
                                 "--normalization", "--num-query-groups", "--position-embedding-type",
                                 "--hf-config"};
  // Megatron-LM's argument names, as aliases: the value is kept under the first.
  static const std::pair<const char*, const char*> kAliased[] = {
      {"--tp", "--tensor-model-parallel-size"}, {"--pp", "--pipeline-model-parallel-size"},
      {"--layers", "--num-layers"},             {"--heads", "--num-attention-heads"},
      {"--vocab", "--vocab-size"},              {"--seq", "--max-position-embeddings"}};
  cli::App app("zest-estimate");
  std::map<std::string, std::string> values;
  for (const char* f : kFlags) app.add_option(f, values[f]);
  for (const auto& [f, alias] : kAliased) app.add_option(fmt::format("{},{}", f, alias), values[f]);
  // Flags without a value, kept as "" when given: Megatron's switches (an
  // untied head; Llama's forms) and --traffic.
  static const char* kSwitches[] = {"--untie-embeddings-and-output-weights", "--swiglu", "--disable-bias-linear",
                                    "--group-query-attention", "--traffic"};
  std::map<std::string, bool> switches;
  for (const char* f : kSwitches) app.add_flag(f, switches[f]);
  // --link, twice at most (intra and inter): kept as lines in one value.
  std::vector<std::string> links;
  app.add_option("--link", links)->allow_extra_args(false);
  std::map<std::string, std::string> flags;
  try {
    cli::parse(app, argc, argv);
  } catch (const cli::UsageError& e) {
    if (std::string_view(e.what()) != "help") throw;
    flags["--help"] = "";
    return flags;
  }
  for (const char* f : kFlags) {
    if (app.count(f) > 0) flags[f] = values[f];
  }
  for (const auto& [f, alias] : kAliased) {
    if (app.count(f) == 0) continue;
    flags[f] = values[f];
    // The name the command line used, for messages: "as:--tp" -> the alias.
    const std::string_view a = alias;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == a || (arg.starts_with(a) && arg.size() > a.size() && arg[a.size()] == '=')) {
        flags[std::string("as:") + f] = alias;
      }
    }
  }
  for (const char* f : kSwitches) {
    if (switches[f]) flags[f] = "";
  }
  if (!links.empty()) flags["--link"] = fmt::format("{}", fmt::join(links, "\n"));
  return flags;
}

// A fraction in [0, 1].
double ratio_arg(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v >= 0.0 && v <= 1.0)) {
    usage_error("{} '{}': expected a fraction from 0 to 1 (e.g. 0.5)", flag, text);
  }
  return v;
}

zest::OptimizerConfig optimizer_arg(const std::string& text) {
  const std::string name = cli::choice("--optimizer", text, {"adamw", "adam", "lamb", "sgd", "sgd-momentum"});
  zest::OptimizerConfig opt;
  opt.kind = name == "adamw" ? zest::OptimizerKind::kAdamW
             : name == "adam" ? zest::OptimizerKind::kAdam
             : name == "lamb" ? zest::OptimizerKind::kLamb
                              : zest::OptimizerKind::kSgd;
  opt.momentum = name == "sgd-momentum" ? 0.9f : 0.0f;
  return opt;
}

// The model of a --units file; a problem in it names the file.
zest::ModelDescription units_file(const std::string& path) {
  const std::string text = zest::read_text_file(path);
  try {
    return zest::parse_model_description(text);
  } catch (const zest::Error& e) {
    throw zest::Error(fmt::format("--units {}: {}", path, e.message()), e.file(), e.line());
  }
}

// The name a flag with an alias was given by (--tp, or
// --tensor-model-parallel-size), for messages.
std::string shown(std::map<std::string, std::string>& flags, const std::string& flag) {
  const auto it = flags.find("as:" + flag);
  return it == flags.end() ? flag : it->second;
}

// --layers, --hidden-size, --heads, --vocab, --seq, --ffn-hidden-size and
// --untie-embeddings-and-output-weights: the transformer, its split checked
// against --tp and --pp with errors naming the flags as given.
constexpr double kMaxWidth = 0x1p32;  // any real layer count or width, far from overflow
zest::TransformerShape transformer_args(std::map<std::string, std::string>& flags, int tp, int pp) {
  const auto has = [&](const char* f) { return flags.count(f) != 0; };
  for (const char* f : {"--hidden-size", "--heads", "--vocab"}) {
    if (!has(f)) {
      usage_error("{} needs {} too (the transformer's shape: --hidden-size, --heads, --vocab)",
                  shown(flags, "--layers"), f);
    }
  }
  const auto count = [&](const char* f, double lo) { return count_arg(shown(flags, f), flags[f], lo, kMaxWidth); };
  zest::TransformerShape t;
  t.layers = count("--layers", 1);
  t.hidden = count("--hidden-size", 1);
  t.heads = count("--heads", 1);
  t.vocab = count("--vocab", 1);
  if (has("--seq")) t.positions = count("--seq", 0);
  if (has("--ffn-hidden-size")) t.ffn_hidden = count("--ffn-hidden-size", 1);
  t.tied_head = !has("--untie-embeddings-and-output-weights");
  t.swiglu = has("--swiglu");
  t.linear_bias = !has("--disable-bias-linear");
  if (has("--normalization")) {
    t.rms_norm = cli::choice("--normalization", flags["--normalization"], {"LayerNorm", "RMSNorm"}) == "RMSNorm";
  }
  // Rotary positions have no table, whatever --max-position-embeddings says.
  if (has("--position-embedding-type") &&
      cli::choice("--position-embedding-type", flags["--position-embedding-type"], {"learned_absolute", "rope"}) ==
          "rope") {
    t.positions = 0;
  }
  // Megatron reads --num-query-groups only with --group-query-attention.
  if (has("--num-query-groups") != has("--group-query-attention")) {
    usage_error("--num-query-groups and --group-query-attention go together (Megatron reads the groups only with "
                "the switch)");
  }
  if (has("--num-query-groups")) t.query_groups = count("--num-query-groups", 1);
  const std::string names[] = {shown(flags, "--layers"), shown(flags, "--heads"), shown(flags, "--vocab"),
                               shown(flags, "--tp"), shown(flags, "--pp")};
  zest::check_transformer_split(t, tp, pp,
                                {names[0].c_str(), "--hidden-size", names[1].c_str(), names[2].c_str(),
                                 "--ffn-hidden-size", "--num-query-groups", names[3].c_str(), names[4].c_str()});
  return t;
}

// What a --config file's "auto" values take, as a Trainer would fill them:
// the flags given. Memory does not depend on the learning rate or its
// schedule, so a file without an optimizer section is estimated with
// --optimizer (default AdamW) and one without a scheduler with a constant
// rate, where the engine would need the program's own.
zest::AutoValues config_program(std::map<std::string, std::string>& flags, int world) {
  const auto has = [&](const char* f) { return flags.count(f) != 0; };
  zest::AutoValues p;
  p.world_size = world;
  if (has("--micro-batch")) {
    p.micro_batch_size = static_cast<int64_t>(count_arg("--micro-batch", flags["--micro-batch"], 1));
  }
  if (has("--hidden-size")) {
    p.hidden_size = static_cast<int64_t>(count_arg("--hidden-size", flags["--hidden-size"], 1, 0x1p25 - 1));
  }
  if (has("--total-steps")) p.total_steps = static_cast<int64_t>(count_arg("--total-steps", flags["--total-steps"], 1));
  if (has("--accum")) p.gradient_accumulation_steps = static_cast<int64_t>(count_arg("--accum", flags["--accum"], 1));
  if (has("--dtype")) {
    p.compute_dtype = zest::parse_dtype(cli::choice("--dtype", flags["--dtype"], {"fp16", "bf16", "fp32"}));
  }
  p.optimizer = has("--optimizer") ? optimizer_arg(flags["--optimizer"]) : zest::OptimizerConfig{};
  p.scheduler = zest::LrScheduleConfig{};
  return p;
}

// --hosts, --ranks-per-host, --link (twice at most) and --algorithm.
zest::Topology topology_args(std::map<std::string, std::string>& flags) {
  zest::Topology t;
  t.hosts = static_cast<int>(count_arg("--hosts", flags["--hosts"], 1, 1 << 20));
  t.ranks_per_host = static_cast<int>(count_arg("--ranks-per-host", flags["--ranks-per-host"], 1, 1 << 20));
  if (static_cast<int64_t>(t.hosts) * t.ranks_per_host > (1 << 20)) {
    usage_error("--hosts {} x --ranks-per-host {}: at most 1048576 ranks", t.hosts, t.ranks_per_host);
  }
  t.intra = zest::link_preset("nvlink4").link;
  t.inter = zest::link_preset("ib-ndr").link;
  bool seen[2] = {false, false};
  std::string_view rest = flags["--link"];
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string text(rest.substr(0, nl));
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    const size_t eq = text.find('=');
    const std::string cls = eq == std::string::npos ? "" : text.substr(0, eq);
    const std::string spec = eq == std::string::npos ? text : text.substr(eq + 1);
    bool inter = cls == "inter";
    if (cls.empty()) {
      // A bare preset says which link it is.
      const auto& presets = zest::link_presets();
      const auto it = std::find_if(presets.begin(), presets.end(), [&](const zest::LinkPreset& p) { return p.name == spec; });
      if (it == presets.end()) {
        usage_error("--link '{}': expected intra=BANDWIDTH[,LATENCY], inter=BANDWIDTH[,LATENCY] or a preset ({})",
                    text, zest::link_preset_names());
      }
      inter = it->link_class == zest::LinkPresetClass::kInter;
    } else if (cls != "intra" && cls != "inter") {
      usage_error("--link '{}': '{}' is not a link; expected intra= or inter=", text, cls);
    }
    if (seen[inter ? 1 : 0]) usage_error("--link '{}': the {} link is given twice", text, inter ? "inter" : "intra");
    seen[inter ? 1 : 0] = true;
    try {
      (inter ? t.inter : t.intra) = zest::parse_link_spec(spec);
    } catch (const zest::Error& e) {
      usage_error("--link '{}': {}", text, e.message());
    }
  }
  if (flags.count("--algorithm") != 0) {
    const std::string a = cli::choice("--algorithm", flags["--algorithm"], {"ring", "pairwise"});
    t.algorithm = a == "ring" ? zest::CollectiveAlgorithm::kRing : zest::CollectiveAlgorithm::kPairwise;
  }
  return t;
}

// The modes side by side: flat stages 0-3 (or --stage), HSDP, MiCS with
// --mics-shard-size when it is not one host, hpZ with --hpz-partition-size
// (or one host's ranks). The hierarchical rows need more than one host.
std::string cost_table(const zest::ModelDescription& model, const zest::EstimateOptions& base,
                       const zest::Topology& topology, std::map<std::string, std::string>& flags) {
  using zest::ShardingMode;
  std::vector<zest::ModeRow> rows;
  std::vector<int> stages = {0, 1, 2, 3};
  if (flags.count("--stage") != 0) stages = {std::stoi(flags["--stage"])};
  for (int s : stages) rows.push_back({fmt::format("ZeRO-{}", s), zest::with_mode(base, ShardingMode::kFlat, s, 0, topology)});
  const int R = topology.ranks_per_host;
  if (topology.hosts > 1) {
    rows.push_back({fmt::format("HSDP (S={})", R), zest::with_mode(base, ShardingMode::kHsdp, 3, R, topology)});
    const int S = base.zero.mics_shard_size;
    if (S > 0 && S != R && S < topology.world()) {
      rows.push_back({fmt::format("MiCS (S={})", S), zest::with_mode(base, ShardingMode::kMics, 3, S, topology)});
    }
    const int H = base.zero.zero_hpz_partition_size > 1 ? base.zero.zero_hpz_partition_size : R;
    if (H < topology.world()) {
      rows.push_back({fmt::format("hpZ (H={})", H), zest::with_mode(base, ShardingMode::kHpz, 3, H, topology)});
    }
  }
  return zest::format_cost_table(model, rows, topology, 2, flags.count("--traffic") != 0);
}

// --hf-config PATH: the config's transformer as the --layers flags describe
// it (Llama's forms), and the Hugging Face forms the flags have no name for
// under "hf:" keys. Returns the line that says what was read.
std::string apply_hf_config(std::map<std::string, std::string>& flags) {
  for (const char* f : {"--params", "--units", "--layers", "--hidden-size", "--heads", "--vocab", "--seq",
                        "--ffn-hidden-size", "--num-query-groups", "--normalization", "--swiglu",
                        "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--group-query-attention",
                        "--position-embedding-type"}) {
    if (flags.count(f) != 0) usage_error("--hf-config gives the model: drop {}", shown(flags, f));
  }
  std::string path = flags["--hf-config"];
  if (std::filesystem::is_directory(path)) path += "/config.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(zest::read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    usage_error("--hf-config {}: not valid JSON ({})", path, e.what());
  }
  if (!j.is_object()) usage_error("--hf-config {}: not a JSON object of a model's config", path);
  std::string type = j.value("model_type", std::string());
  if (type.empty() && j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    type = j["architectures"][0].get<std::string>();
  }
  static const std::map<std::string, std::string> kFamilies = {
      {"llama", "llama"}, {"LlamaForCausalLM", "llama"}, {"mistral", "mistral"}, {"MistralForCausalLM", "mistral"},
      {"qwen2", "qwen2"}, {"Qwen2ForCausalLM", "qwen2"}, {"qwen3", "qwen3"},    {"Qwen3ForCausalLM", "qwen3"}};
  const auto family = kFamilies.find(type.empty() ? "llama" : type);
  if (family == kFamilies.end()) {
    usage_error("--hf-config {}: model_type '{}' is not described (llama, mistral, qwen2, qwen3); a mixture of "
                "experts or another layout needs --units",
                path, type);
  }
  const auto whole = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) usage_error("--hf-config {}: \"{}\" is missing", path, key);
      return fallback;
    }
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1) {
      usage_error("--hf-config {}: \"{}\" is {}, not a whole number of at least 1", path, key, j[key].dump());
    }
    return j[key].get<int64_t>();
  };
  const auto flag = [&](const char* key, bool fallback) {
    return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
  };
  const int64_t heads = whole("num_attention_heads", true, 0), hidden = whole("hidden_size", true, 0);
  flags["--layers"] = std::to_string(whole("num_hidden_layers", true, 0));
  flags["--hidden-size"] = std::to_string(hidden);
  flags["--heads"] = std::to_string(heads);
  flags["--vocab"] = std::to_string(whole("vocab_size", true, 0));
  flags["--ffn-hidden-size"] = std::to_string(whole("intermediate_size", true, 0));
  flags["--swiglu"] = "";
  flags["--normalization"] = "RMSNorm";
  flags["--position-embedding-type"] = "rope";
  const int64_t groups = whole("num_key_value_heads", false, heads);
  flags["--group-query-attention"] = "";
  flags["--num-query-groups"] = std::to_string(groups);
  // Qwen3Config's head_dim defaults to 128; the others' to hidden / heads.
  const int64_t head_dim = whole("head_dim", false, family->second == "qwen3" ? 128 : 0);
  if (head_dim != 0 && head_dim * heads != hidden) flags["hf:head_dim"] = std::to_string(head_dim);
  const bool attention_bias = flag("attention_bias", false), mlp_bias = flag("mlp_bias", false);
  if (attention_bias != mlp_bias) {
    usage_error("--hf-config {}: attention_bias {} with mlp_bias {} is not described (the transformer has biases on "
                "every linear layer or on none)",
                path, attention_bias, mlp_bias);
  }
  if (!attention_bias) flags["--disable-bias-linear"] = "";
  if (family->second == "qwen2") flags["hf:qkv_bias"] = "";
  if (family->second == "qwen3") flags["hf:qk_norm"] = "";
  if (!flag("tie_word_embeddings", false)) flags["--untie-embeddings-and-output-weights"] = "";
  const std::string dtype = j.value("torch_dtype", j.value("dtype", std::string()));
  if (flags.count("--dtype") == 0 && (dtype == "bfloat16" || dtype == "float16" || dtype == "float32")) {
    flags["--dtype"] = dtype == "bfloat16" ? "bf16" : dtype == "float16" ? "fp16" : "fp32";
  }
  return fmt::format("{} ({}): {} layers, hidden {}, {} heads ({} kv{}), intermediate {}, vocab {}, {} head, {}\n",
                     path, family->second, flags["--layers"], hidden, heads, groups,
                     head_dim != 0 ? fmt::format(", head_dim {}", head_dim) : "", flags["--ffn-hidden-size"],
                     flags["--vocab"], flags.count("--untie-embeddings-and-output-weights") ? "untied" : "tied",
                     flags.count("--dtype") ? flags["--dtype"] : "fp16");
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> flags = parse_flags(argc, argv);
  const auto has = [&](const char* f) { return flags.count(f) != 0; };
  if (has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (has("--hf-config")) std::fputs(apply_hf_config(flags).c_str(), stdout);
  if (int(has("--params")) + int(has("--units")) + int(has("--layers")) != 1) {
    usage_error("give the model as --params N, --units FILE or --layers N (a transformer), one of them");
  }
  if (has("--unit-numel") && !has("--params")) usage_error("--unit-numel goes with --params");
  for (const char* f : {"--tp", "--pp", "--heads", "--vocab", "--seq", "--ffn-hidden-size",
                        "--untie-embeddings-and-output-weights", "--swiglu", "--disable-bias-linear",
                        "--group-query-attention", "--num-query-groups", "--normalization",
                        "--position-embedding-type"}) {
    if (has(f) && !has("--layers")) {
      usage_error("{} goes with a transformer given by --layers, --hidden-size, --heads and --vocab (a parameter "
                  "count or a units file does not say what it splits)", shown(flags, f));
    }
  }
  for (const char* f : {"--link", "--algorithm", "--traffic"}) {
    if (has(f) && !has("--hosts")) usage_error("{} goes with --hosts (the cost model's world)", f);
  }
  if (has("--hosts") && !has("--ranks-per-host")) usage_error("--hosts goes with --ranks-per-host R");
  if (!has("--world") && !has("--hosts")) {
    usage_error("--world N is required (the number of data-parallel ranks), or --hosts N --ranks-per-host R");
  }
  int world = 0;
  zest::Topology topology;
  if (has("--hosts")) {
    topology = topology_args(flags);
    world = topology.world();
    if (has("--world") && count_arg("--world", flags["--world"], 1, 1 << 20) != static_cast<size_t>(world)) {
      usage_error("--world {} is not --hosts {} x --ranks-per-host {} = {}", flags["--world"], topology.hosts,
                  topology.ranks_per_host, world);
    }
  } else {
    world = static_cast<int>(count_arg("--world", flags["--world"], 1, 1 << 20));
  }
  zest::EstimateOptions opt;
  for (const char* f : {"--micro-batch", "--hidden-size", "--total-steps"}) {
    if (has(f) && !has("--config") && !(has("--layers") && std::string_view(f) == "--hidden-size")) {
      usage_error("{} goes with --config (it fills the file's \"auto\" values){}", f,
                  std::string_view(f) == "--hidden-size" ? ", or with --layers (the transformer's width)" : "");
    }
  }
  if (has("--config")) {
    zest::EngineConfig config;
    try {
      config = zest::load_config_file(flags["--config"], config_program(flags, world));
    } catch (const zest::Error& e) {
      if (e.message().find("AutoValues::") == std::string::npos) throw;
      // The flags are this tool's AutoValues: say which fills what.
      throw zest::Error(e.message() + "\n(zest-estimate: --micro-batch, --hidden-size and --total-steps set "
                                      "AutoValues::micro_batch_size, hidden_size and total_steps)",
                        e.file(), e.line());
    }
    opt = zest::EstimateOptions::from_config(config, world);
  }
  opt.world_size = world;
  zest::TableOptions table;
  if (has("--stage")) {
    table.stages = {std::stoi(cli::choice("--stage", flags["--stage"], {"0", "1", "2", "3"}))};
  }
  if (has("--dtype")) opt.compute_dtype = zest::parse_dtype(cli::choice("--dtype", flags["--dtype"], {"fp16", "bf16", "fp32"}));
  if (has("--optimizer")) opt.optimizer = optimizer_arg(flags["--optimizer"]);
  if (has("--master-dtype")) {
    opt.master_dtype = zest::parse_dtype(cli::choice("--master-dtype", flags["--master-dtype"], {"fp32", "bf16"}));
  }
  if (has("--state-dtype")) {
    opt.state_dtype = zest::parse_dtype(cli::choice("--state-dtype", flags["--state-dtype"], {"fp32", "bf16"}));
  }
  if (has("--accum")) opt.gradient_accumulation_steps = static_cast<int64_t>(count_arg("--accum", flags["--accum"], 1));
  if (has("--persistence-threshold")) {
    opt.zero.stage3_param_persistence_threshold =
        static_cast<int64_t>(count_arg("--persistence-threshold", flags["--persistence-threshold"], 0));
  }
  if (has("--live-units")) opt.live_units = static_cast<int>(count_arg("--live-units", flags["--live-units"], 1, kMaxInt));
  if (has("--grad-units")) opt.grad_units_in_flight = static_cast<int>(count_arg("--grad-units", flags["--grad-units"], 1, kMaxInt));
  if (has("--device-memory")) table.device_bytes = size_arg("--device-memory", flags["--device-memory"]);
  if (has("--runtime-reserve")) {
    const std::string& r = flags["--runtime-reserve"];
    opt.runtime_reserve_bytes = r == "0" ? 0 : size_arg("--runtime-reserve", r);
  }
  if (has("--offload-optimizer")) {
    const std::string d = cli::choice("--offload-optimizer", flags["--offload-optimizer"], {"none", "cpu", "nvme"});
    opt.offload_optimizer.device = d == "cpu"    ? zest::OffloadDevice::kCpu
                                   : d == "nvme" ? zest::OffloadDevice::kNvme
                                                 : zest::OffloadDevice::kNone;
  }
  if (has("--offload-ratio")) opt.offload_optimizer.ratio = ratio_arg("--offload-ratio", flags["--offload-ratio"]);
  if (has("--offload-param")) {
    const std::string d = cli::choice("--offload-param", flags["--offload-param"], {"none", "cpu", "nvme"});
    // As the engine: the parameters go to NVMe with the whole optimizer there
    // (docs/NVME.md says why).
    if (d == "nvme" && opt.offload_optimizer.device != zest::OffloadDevice::kNvme) {
      usage_error("--offload-param nvme goes with --offload-optimizer nvme (the parameters on NVMe with the "
                  "whole optimizer there, as the engine runs them); or use --offload-param cpu");
    }
    opt.offload_param.device = d == "cpu"    ? zest::OffloadDevice::kCpu
                               : d == "nvme" ? zest::OffloadDevice::kNvme
                                             : zest::OffloadDevice::kNone;
  }
  if (has("--mics-shard-size")) {
    const std::string& s = flags["--mics-shard-size"];
    opt.zero.mics_shard_size = s == "-1" ? -1 : static_cast<int>(count_arg("--mics-shard-size", s, 1, world));
  }
  if (has("--hpz-partition-size")) {
    opt.zero.zero_hpz_partition_size =
        static_cast<int>(count_arg("--hpz-partition-size", flags["--hpz-partition-size"], 1, world));
  }
  if (has("--ranks-per-host") && !has("--host-memory") && !has("--hosts")) {
    usage_error("--ranks-per-host goes with --host-memory or --hosts");
  }
  if (has("--host-memory") && !has("--device-memory")) {
    usage_error("--host-memory goes with --device-memory (the largest model that fits both)");
  }
  if (has("--nvme-capacity") && !has("--host-memory")) {
    usage_error("--nvme-capacity goes with --device-memory and --host-memory (the largest model that fits all three)");
  }
  const int per_host = has("--ranks-per-host")
                           ? static_cast<int>(count_arg("--ranks-per-host", flags["--ranks-per-host"], 1, world))
                           : world;

  // A --config file's tensor_parallel.autotp_size and pipeline.stages split
  // only a transformer.
  if (!has("--layers") && opt.tp_size * opt.pp_size > 1) {
    usage_error("--config {} splits the model over tp {} x pp {} (tensor_parallel.autotp_size, pipeline.stages): "
                "give it as a transformer (--layers, --hidden-size, --heads, --vocab); a parameter count or a units "
                "file does not say what the split divides", flags["--config"], opt.tp_size, opt.pp_size);
  }
  if (has("--tp")) opt.tp_size = static_cast<int>(count_arg(shown(flags, "--tp"), flags["--tp"], 1, 1 << 20));
  if (has("--pp")) opt.pp_size = static_cast<int>(count_arg(shown(flags, "--pp"), flags["--pp"], 1, 1 << 20));
  if (opt.mesh_size() > (1 << 20)) {
    usage_error("--world {} x --tp {} x --pp {}: at most 1048576 ranks", opt.world_size, opt.tp_size, opt.pp_size);
  }
  std::optional<zest::TransformerShape> transformer;
  if (has("--layers")) transformer = transformer_args(flags, opt.tp_size, opt.pp_size);
  if (transformer && has("--hf-config")) {
    if (has("hf:head_dim")) transformer->head_dim = count_arg("head_dim", flags["hf:head_dim"], 1, kMaxWidth);
    transformer->qkv_bias = has("hf:qkv_bias");
    transformer->qk_norm = has("hf:qk_norm");
    zest::check_transformer_split(*transformer, opt.tp_size, opt.pp_size);
  }
  if (has("--hosts") && opt.tp_size * opt.pp_size > 1) {
    usage_error("--hosts (the cost model) is for data parallelism: not yet with --tp {} and --pp {}", opt.tp_size,
                opt.pp_size);
  }
  if (transformer && opt.tp_size * opt.pp_size > 1) {
    if (has("--host-memory")) usage_error("--host-memory (the largest model that fits) is not yet for a mesh of --tp or --pp > 1");
    std::fputs(zest::format_mesh_table(*transformer, opt, table).c_str(), stdout);
    return 0;
  }
  const zest::ModelDescription model =
      transformer       ? zest::transformer_stage_model(*transformer, 1, 1, 0)
      : has("--params") ? zest::ModelDescription::from_total(
                              count_arg("--params", flags["--params"], 1),
                              has("--unit-numel") ? count_arg("--unit-numel", flags["--unit-numel"], 1) : 0)
                        : units_file(flags["--units"]);
  if (has("--hosts")) {
    std::fputs(cost_table(model, opt, topology, flags).c_str(), stdout);
    return 0;
  }
  std::fputs(zest::format_estimate_table(model, opt, table).c_str(), stdout);
  if (has("--host-memory")) {
    const int64_t host = size_arg("--host-memory", flags["--host-memory"]) / per_host;
    const size_t unit = model.total_only && model.num_units() == 1 ? 0 : model.largest_unit_numel();
    std::optional<int64_t> nvme;
    if (has("--nvme-capacity")) nvme = size_arg("--nvme-capacity", flags["--nvme-capacity"]) / per_host;
    std::fputs(("\n" + zest::format_fit_table(opt, *table.device_bytes, host, unit, table.stages, nvme)).c_str(),
               stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const cli::UsageError& e) {
    std::fprintf(stderr, "zest-estimate: %s (zest-estimate --help lists the arguments)\n", e.what());
    return 2;
  } catch (const zest::Error& e) {
    // Bad input found by the library: a units file, a config, an option.
    std::fprintf(stderr, "zest-estimate: %s\n", e.message().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zest-estimate: %s\n", e.what());
    return 1;
  }
}
