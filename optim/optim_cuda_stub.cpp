// Builds without CUDA: a CUDA stream cannot be created (the device check
// refuses it first), so these are never reached; they say what would help.
#include "zest/core/check.h"
#include "zest/optim/detail/optim_cuda.h"

namespace zest::detail {
namespace {

[[noreturn]] void no_cuda(const char* what, const Stream& stream) {
  ZEST_FAIL("{} on {}: this build of ZEST has no CUDA backend; reconfigure with -DZEST_CUDA=ON",
            what, stream.device().str());
}

}  // namespace

void optimizer_step_cuda(const Stream& stream, const OptimizerConfig&, const ShardBuffers&,
                         const StepScalars&) {
  no_cuda("optimizer_step", stream);
}

void lamb_moments_cuda(const Stream& stream, const LambStep&, const StepDecision*, const ShardBuffers&,
                       const LambPiece*, size_t, double*) {
  no_cuda("lamb_moments", stream);
}

void lamb_accumulate_cuda(const Stream& stream, const LambPiece*, const double*, size_t, size_t, int64_t*) {
  no_cuda("lamb_accumulate", stream);
}

void lamb_trust_ratios_cuda(const Stream& stream, const int64_t*, size_t, float, float, float*) {
  no_cuda("lamb_trust_ratios", stream);
}

void lamb_apply_cuda(const Stream& stream, const LambStep&, const StepDecision*, const ShardBuffers&,
                     const LambPiece*, size_t, const float*) {
  no_cuda("lamb_apply", stream);
}

void chunk_sums_of_squares_cuda(const Stream& stream, const void*, DType, size_t, size_t, float,
                                double*) {
  no_cuda("chunk_sums_of_squares", stream);
}

void accumulate_exact_cuda(const Stream& stream, const double*, size_t, int64_t*) {
  no_cuda("accumulate_exact", stream);
}

void decide_step_cuda(const Stream& stream, int64_t*, double, double) {
  no_cuda("decide_step", stream);
}

void accumulate_cuda(const Stream& stream, void*, DType, const void*, DType, size_t) {
  no_cuda("accumulate", stream);
}

void scale_cuda(const Stream& stream, void*, DType, float, size_t) { no_cuda("scale", stream); }

void convert_cuda(const Stream& stream, const void*, DType, void*, DType, size_t) {
  no_cuda("convert", stream);
}

}  // namespace zest::detail
