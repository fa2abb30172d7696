// The estimator on a dp x tp x pp mesh: a transformer split as Megatron
// splits it, by hand on a small GPT, and GPT-3 175B in Megatron-LM's 3D
// layout against the published bytes per parameter.
#include <doctest/doctest.h>

#include "../error_of.h"
#include "zest/config/config.h"
#include "zest/engine/layout_constants.h"
#include "zest/estimate/mesh_estimate.h"

using namespace zest;

namespace {

// The demo's GPT (scripts/demo.sh): 4 layers, d_model 128, 4 heads,
// vocab 256, context 64, tied head.
constexpr TransformerShape kSmallGpt{.layers = 4, .hidden = 128, .heads = 4, .vocab = 256, .positions = 64};

// Megatron-LM's GPT-3 175B (examples/gpt3/train_gpt3_175b_distributed.sh:
// 96 layers, hidden 12288, 96 heads, 2048 positions, tp 8, pp 16; the
// vocabulary of 51,200 of Narayanan et al.'s models, GPT-2's 50,257 padded).
constexpr TransformerShape kGpt3{.layers = 96, .hidden = 12288, .heads = 96, .vocab = 51200, .positions = 2048};

EstimateOptions mesh_options(int dp, int tp, int pp, int stage, DType dtype) {
  EstimateOptions o;
  o.world_size = dp;
  o.tp_size = tp;
  o.pp_size = pp;
  o.zero.stage = stage;
  o.compute_dtype = dtype;
  return o;
}

}  // namespace

TEST_CASE("a transformer's parameters as Megatron splits them over tp x pp") {
  REQUIRE(kParamAlign == 64);
  // Whole: 4 (12h² + 13h) + Vh + sh + 2h = 4 x 198,272 + 32,768 + 8,192 + 256,
  // the demo GPT's 834,304.
  CHECK(kSmallGpt.numel() == 834'304);
  // tp 2: a layer is 12h²/2 + 7h/2 + 6h = 98,304 + 448 + 768 = 99,520 on each
  // tp rank, in Megatron's order (every size a multiple of 64: no alignment).
  const ModelDescription first = transformer_stage_model(kSmallGpt, 2, 2, 0);
  REQUIRE(first.units.size() == 2);
  CHECK(first.units[0].name == "embedding");
  CHECK(first.units[0].param_numels == std::vector<size_t>{128 * 128, 64 * 128});  // V/2 x h, s x h
  CHECK(first.units[1].param_numels ==
        std::vector<size_t>{128, 128, 24'576, 192, 8'192, 128, 128, 128, 32'768, 256, 32'768, 128});
  CHECK(first.units[1].numel() == 99'520);
  CHECK(first.units[1].count == 2);
  const ModelDescription last = transformer_stage_model(kSmallGpt, 2, 2, 1);
  REQUIRE(last.units.size() == 2);
  CHECK(last.units[1].name == "head");  // final norm, and the tied embeddings' copy for the output layer
  CHECK(last.units[1].param_numels == std::vector<size_t>{128, 128, 128 * 128});
  // pp 1, tied: the embeddings serve as the head; untied, the head is its own.
  CHECK(transformer_stage_model(kSmallGpt, 1, 1, 0).numel() == 834'304);
  TransformerShape untied = kSmallGpt;
  untied.tied_head = false;
  CHECK(transformer_stage_model(untied, 1, 1, 0).numel() == 834'304 + 256 * 128);
  CHECK(untied.numel() == 834'304 + 256 * 128);
}

TEST_CASE("the busiest stage of a small GPT, by hand") {
  // dp 1 x tp 2 x pp 2 at stage 0, fp16 AdamW: 16 bytes a padded element.
  // Units are padded to 256 elements: the layer's 99,520 to 99,584, the
  // embedding (24,576) and the head (16,640) already are.
  //   stage 0: 16 x (24,576 + 2 x 99,584) = 3,579,904
  //   stage 1: 16 x (2 x 99,584 + 16,640) = 3,452,928
  const MeshEstimate e = estimate_mesh_memory(kSmallGpt, mesh_options(1, 2, 2, 0, DType::kFloat16));
  REQUIRE(e.stages.size() == 2);
  CHECK(e.stages[0].numel == 223'616);
  CHECK(e.stages[1].numel == 215'680);
  CHECK(e.stages[0].model_state_bytes == 3'579'904);
  CHECK(e.stages[1].model_state_bytes == 3'452'928);
  CHECK(e.busiest == 0);
  // 4 ranks: NCCL's buffers count though ZeRO has one rank.
  CHECK(e.stages[0].runtime_reserve_bytes == kCudaContextReserveBytes + kNcclReserveBytes);
}

TEST_CASE("GPT-3 175B in Megatron-LM's layout: the published bytes per parameter") {
  // tp 8, pp 16 (6 layers a stage), dp 12: 1536 GPUs. One rank of
  //   a layer        12h²/8 + 7h/8 + 6h = 226,492,416 + 10,752 + 73,728 = 226,576,896
  //   embedding      51,200/8 x 12,288 + 2048 x 12,288 = 78,643,200 + 25,165,824 = 103,809,024
  //   stage 0        6 x 226,576,896 + 103,809,024 = 1,463,270,400 (Ψ below)
  //   stage 15       6 x 226,576,896 + 2 x 12,288 + 78,643,200 = 1,438,129,152
  // The whole model: 96 (12h² + 13h) + (V + s)h + 2h = 174,615,846,912.
  CHECK(kGpt3.numel() == 174'615'846'912);
  const int dp = 12, tp = 8, pp = 16;
  const double psi = 1'463'270'400;

  SUBCASE("mixed-precision Adam without a distributed optimizer: 16 bytes a parameter") {
    // fp16 parameters and gradients, fp32 master, momentum and variance
    // (2 + 2 + 12, ZeRO's K = 12), whole on every dp rank (ZeRO-0):
    // 16 x 1,463,270,400 = 23,412,326,400. Every unit is a multiple of 256
    // elements, so nothing is padded.
    const MeshEstimate e = estimate_mesh_memory(kGpt3, mesh_options(dp, tp, pp, 0, DType::kFloat16));
    REQUIRE(e.stages.size() == 16);
    CHECK(e.busiest == 0);  // the embeddings outweigh the head's copy of the word embeddings
    const MemoryEstimate& first = e.busiest_estimate();
    CHECK(first.numel == 1'463'270'400);
    CHECK(first.model_state_bytes == 23'412'326'400);
    CHECK(first.padding_bytes == 0);
    CHECK(first.paper_bytes == 16 * psi);
    CHECK(e.stages[15].numel == 1'438'129'152);
    CHECK(e.stages[15].model_state_bytes == 16 * int64_t{1'438'129'152});
    for (int p = 1; p < 15; ++p) CHECK(e.stages[static_cast<size_t>(p)].numel == 6 * size_t{226'576'896});
  }

  SUBCASE("Megatron's distributed optimizer, fp32 parameters and gradients: 8 + 8/d bytes") {
    // The distributed optimizer is ZeRO-1: parameters and gradients whole,
    // the optimizer's state sharded over the d = 12 data-parallel ranks. In
    // fp32 the parameters are the master, so (Megatron's table, fp32 row)
    //   (8 + 8/12) x 1,463,270,400 = 11,706,163,200 + 975,513,600 = 12,681,676,800
    // ZEST pads each unit to 12 x 256 = 3072 elements: a layer's 226,576,896
    // to 226,578,432 (1536 more; the embedding's 103,809,024 is a multiple),
    // 6 x 1536 = 9216 elements of 8 bytes whole and 9216/12 = 768 of 8
    // bytes of state: 73,728 + 6,144 = 79,872 bytes.
    const MeshEstimate e = estimate_mesh_memory(kGpt3, mesh_options(dp, tp, pp, 1, DType::kFloat32));
    CHECK(e.busiest == 0);
    const MemoryEstimate& first = e.busiest_estimate();
    CHECK(first.padding_bytes == 79'872);
    CHECK(first.model_state_bytes == 12'681'676'800 + 79'872);
    CHECK(first.paper_bytes == 12'681'676'800.0);
  }

  SUBCASE("bf16 at ZeRO-1 against the distributed optimizer's 6 + 12/d") {
    // Megatron keeps fp32 gradients beside bf16 parameters: 2 + 4 + 12/d,
    // 7 x Ψ = 10,242,892,800 at d = 12. ZEST keeps the gradients in bf16:
    // (2 + 2 + 12/12) x Ψ = 7,316,352,000, 2Ψ less; padded as above,
    // 9216 x 4 + 768 x 12 = 46,080 bytes more.
    const MeshEstimate e = estimate_mesh_memory(kGpt3, mesh_options(dp, tp, pp, 1, DType::kBFloat16));
    const MemoryEstimate& first = e.busiest_estimate();
    CHECK(first.model_state_bytes == 7'316'352'000 + 46'080);
    CHECK(first.model_state_bytes - first.padding_bytes == static_cast<int64_t>((6 + 12.0 / 12) * psi - 2 * psi));
  }
}

TEST_CASE("a DeepSpeed file's tensor_parallel.autotp_size and pipeline.stages are the mesh's tp and pp") {
  AutoValues program;
  program.optimizer = OptimizerConfig{};  // AdamW: the file has no optimizer section
  program.scheduler = LrScheduleConfig{};
  const EngineConfig config = parse_config_json(R"({"fp16": {"enabled": true}, "zero_optimization": {"stage": 0},
      "tensor_parallel": {"autotp_size": 8}, "pipeline": {"stages": 16}})", program);
  const EstimateOptions o = EstimateOptions::from_config(config, 12);
  CHECK(o.world_size == 12);
  CHECK(o.tp_size == 8);
  CHECK(o.pp_size == 16);
  CHECK(o.mesh_size() == 1536);
  CHECK(estimate_mesh_memory(kGpt3, o).busiest_estimate().model_state_bytes == 23'412'326'400);
}

TEST_CASE("a split Megatron would refuse is named") {
  CHECK(test::error_of([] { check_transformer_split(kGpt3, 7, 1); }) ==
        "tp_size 7 does not divide the 96 attention heads (heads): Megatron gives each tensor-parallel rank whole "
        "heads");
  TransformerShape odd_vocab = kGpt3;
  odd_vocab.vocab = 50'257;
  CHECK(test::error_of([&] { check_transformer_split(odd_vocab, 8, 1); })
            .starts_with("tp_size 8 does not divide the vocabulary of 50257 (vocab): pad it to a multiple of 8"));
  CHECK(test::error_of([] { check_transformer_split(kGpt3, 8, 97); }) ==
        "pp_size 97 is more than the 96 layers (layers): every pipeline stage needs a layer");
  CHECK(test::error_of([] { check_transformer_split(kGpt3, 8, 10); }).starts_with("pp_size 10 does not divide the 96 layers"));
  CHECK(test::error_of([] { check_transformer_split(kGpt3, 0, 1); }).starts_with("tp_size is 0: it must be at least 1"));
  // A tool passes its flags' names.
  CHECK(test::error_of([] { check_transformer_split(kGpt3, 5, 1, {.tp = "--tp"}); }).starts_with("--tp 5 does not divide"));
  EstimateOptions bad = mesh_options(1, 1, 1, 0, DType::kFloat16);
  bad.pp_size = 0;
  CHECK(test::error_of([&] { estimate_mesh_memory(kSmallGpt, bad); }).starts_with("tp_size is 1 and pp_size 0"));
}

TEST_CASE("Llama's shape as Megatron's flags give it: SwiGLU, RMSNorm, no biases, grouped-query attention, rope") {
  // Llama-2 70B (Megatron's --swiglu --normalization RMSNorm
  // --disable-bias-linear --group-query-attention --num-query-groups 8
  // --position-embedding-type rope --untie-embeddings-and-output-weights):
  // a layer is 2h (norms) + (h + 2 x 8 x 128) h (QKV) + h² + 3 f h =
  // 16,384 + 83,886,080 + 67,108,864 + 704,643,072 = 855,654,400.
  TransformerShape llama2{.layers = 80, .hidden = 8192, .heads = 64, .vocab = 32000, .ffn_hidden = 28672,
                          .tied_head = false};
  llama2.swiglu = true;
  llama2.rms_norm = true;
  llama2.linear_bias = false;
  llama2.query_groups = 8;
  // The count Hugging Face gives Llama-2-70b-hf: 80 x 855,654,400 + 2 x
  // 32000 x 8192 + 8192.
  CHECK(llama2.numel() == 68'976'648'192);
  // Llama-3 8B: 32 layers, hidden 4096, 32 heads over 8 groups, ffn 14336,
  // vocab 128256, untied: Meta-Llama-3-8B's 8,030,261,248.
  TransformerShape llama3 = llama2;
  llama3.layers = 32;
  llama3.hidden = 4096;
  llama3.heads = 32;
  llama3.vocab = 128256;
  llama3.ffn_hidden = 14336;
  CHECK(llama3.numel() == 8'030'261'248);

  // tp 8 x pp 4: a layer's tp rank holds the norms whole and an eighth of
  // the rest: 8192, 10240 x 8192 / 8, 8192² / 8, 8192, 57344 x 8192 / 8,
  // 8192 x 28672 / 8 = 106,971,136 (no biases).
  const ModelDescription first = transformer_stage_model(llama2, 8, 4, 0);
  REQUIRE(first.units.size() == 2);
  CHECK(first.units[0].param_numels == std::vector<size_t>{4000 * 8192});  // no position embeddings
  CHECK(first.units[1].param_numels ==
        std::vector<size_t>{8192, 10'485'760, 8'388'608, 8192, 58'720'256, 29'360'128});
  CHECK(first.units[1].count == 20);
  CHECK(first.numel() == 2'172'190'720);  // 4000 x 8192 + 20 x 106,971,136
  const ModelDescription last = transformer_stage_model(llama2, 8, 4, 3);
  REQUIRE(last.units.size() == 2);
  CHECK(last.units[1].param_numels == std::vector<size_t>{8192, 4000 * 8192});  // RMSNorm, the untied head's slice
  CHECK(last.numel() == 2'172'198'912);
  // Every rank of the mesh together holds the model once (tp x the stages'
  // ranks, the norms counted tp times).
  size_t all = 0;
  for (int stage = 0; stage < 4; ++stage) all += transformer_stage_model(llama2, 1, 4, stage).numel();
  CHECK(all == llama2.numel());

  // tp must divide the key-value groups: 16 does not divide 8.
  const std::string e = test::error_of([&] { transformer_stage_model(llama2, 16, 4, 0); });
  CHECK(e.find("does not divide the 8 key-value groups") != std::string::npos);
  TransformerShape odd = llama2;
  odd.query_groups = 6;  // 64 heads do not divide into 6 groups
  CHECK(test::error_of([&] { transformer_stage_model(odd, 1, 1, 0); }).find("do not divide into query_groups 6") !=
        std::string::npos);
}
