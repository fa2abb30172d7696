#include "zest/pipeline/schedule.h"

#include <algorithm>
#include <cctype>

#include "zest/core/check.h"

namespace zest {

std::vector<PipelineAction> pipeline_schedule(PipelineKind kind, int stages, int stage, int micro_batches) {
  ZEST_CHECK(stages >= 1, "a pipeline needs at least one stage, not {}", stages);
  ZEST_CHECK(stage >= 0 && stage < stages, "stage {} is not one of the pipeline's {} stages (0 to {})", stage,
             stages, stages - 1);
  ZEST_CHECK(micro_batches >= 1, "a pipeline step needs at least one micro-batch, not {}", micro_batches);
  std::vector<PipelineAction> out;
  out.reserve(2 * static_cast<size_t>(micro_batches));
  const auto forward = [&](int mb) { out.push_back({PipelinePass::kForward, mb}); };
  const auto backward = [&](int mb) { out.push_back({PipelinePass::kBackward, mb}); };
  if (kind == PipelineKind::kGPipe) {
    for (int mb = 0; mb < micro_batches; ++mb) forward(mb);
    for (int mb = 0; mb < micro_batches; ++mb) backward(mb);
    return out;
  }
  const int warmup = std::min(stages - stage - 1, micro_batches);
  const int steady = micro_batches - warmup;
  for (int mb = 0; mb < warmup; ++mb) forward(mb);
  for (int i = 0; i < steady; ++i) {
    forward(warmup + i);
    out.back().paired = true;  // its output leaves as the backward's gradient arrives
    backward(i);
    // Its input's gradient leaves as the next forward's input arrives.
    if (i + 1 < steady) out.back().paired = true;
  }
  for (int mb = steady; mb < micro_batches; ++mb) backward(mb);
  return out;
}

double pipeline_bubble(int stages, int micro_batches) {
  ZEST_CHECK(stages >= 1 && micro_batches >= 1, "pipeline_bubble: {} stages and {} micro-batches must be >= 1",
             stages, micro_batches);
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

PipelineKind parse_pipeline_kind(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (n == "1f1b") return PipelineKind::k1F1B;
  if (n == "gpipe") return PipelineKind::kGPipe;
  ZEST_FAIL("pipeline schedule '{}' is not one of: 1f1b, gpipe", name);
}

const char* pipeline_kind_name(PipelineKind kind) { return kind == PipelineKind::k1F1B ? "1f1b" : "gpipe"; }

}  // namespace zest
