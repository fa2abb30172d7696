// LAMB's step (lamb.h): the entry points' checks, and the host's loops over
// the pieces, one element at a time through lamb_impl.h's functions, which
// the CUDA kernels (lamb_cuda.cu) share. Compiled without FMA contraction
// (optim/CMakeLists.txt), so the bits are the GPU's.
#include "zest/optim/lamb.h"

#include <algorithm>
#include <type_traits>

#include "zest/core/check.h"
#include "zest/optim/chunk_sum_order.h"
#include "zest/optim/detail/dtype_dispatch.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/detail/lamb_impl.h"
#include "zest/optim/detail/optim_cuda.h"
#include "zest/optim/detail/optimizer_impl.h"

namespace zest {
namespace {

void check_shard(const OptimizerConfig& c, const ShardBuffers& s, const LambPiece* pieces, const char* what) {
  ZEST_CHECK(c.kind == OptimizerKind::kLamb, "{}: the optimizer is {}, not Lamb", what, optimizer_name(c.kind));
  ZEST_CHECK(pieces != nullptr && s.master != nullptr && s.grad != nullptr && s.state[0] != nullptr &&
                 s.state[1] != nullptr,
             "{}: pieces, master weights, gradient and both state buffers (m, v) must not be null", what);
  (void)s.master_fp32(what);  // LAMB keeps fp32 master weights and state only
  (void)s.state_fp32(0, what);
}

// The elements of one piece as float, wherever the gradient's type.
template <typename TG>
float grad_at(const void* grad, size_t i) {
  return static_cast<float>(static_cast<const TG*>(grad)[i]);
}

template <typename TG>
void moments_host(const detail::LambStep& l, const ShardBuffers& s, const LambPiece* pieces, size_t count,
                  double* sums) {
  float* master = s.master_fp32("Lamb");
  float* m = s.state_fp32(0, "Lamb");
  float* v = s.state_fp32(1, "Lamb");
  for (size_t p = 0; p < count; ++p) {
    const LambPiece& piece = pieces[p];
    ZEST_CHECK(piece.numel <= kLambPieceMax && piece.begin + piece.numel <= s.numel,
               "lamb_moments: piece {} [{}, +{}) is not within a shard of {} elements in at most {}", p,
               piece.begin, piece.numel, s.numel, kLambPieceMax);
    // Note [a warp per chunk]'s lanes in double (lamb.h): lane l adds
    // elements l, l + 32, ... in order.
    double w_lanes[kNormWarp] = {};
    double u_lanes[kNormWarp] = {};
    for (size_t j = 0; j < piece.numel; ++j) {
      const size_t i = piece.begin + j;
      const float w = master[i];
      const float u = detail::lamb_moments_update(l, grad_at<TG>(s.grad, i), w, m[i], v[i]);
      const auto wd = static_cast<double>(w);
      const auto ud = static_cast<double>(u);
      w_lanes[j % kNormWarp] += wd * wd;
      u_lanes[j % kNormWarp] += ud * ud;
    }
    sums[2 * p] = warp_tree(w_lanes);
    sums[2 * p + 1] = warp_tree(u_lanes);
  }
}

template <typename TP>
void apply_host(const detail::LambStep& l, const ShardBuffers& s, const LambPiece* pieces, size_t count,
                const float* ratios) {
  float* master = s.master_fp32("Lamb");
  float* m = s.state_fp32(0, "Lamb");
  float* v = s.state_fp32(1, "Lamb");
  for (size_t p = 0; p < count; ++p) {
    const LambPiece& piece = pieces[p];
    ZEST_CHECK(piece.numel <= kLambPieceMax && piece.begin + piece.numel <= s.numel,
               "lamb_apply: piece {} [{}, +{}) is not within a shard of {} elements in at most {}", p, piece.begin,
               piece.numel, s.numel, kLambPieceMax);
    const float scale = l.step_size * ratios[piece.param];
    for (size_t i = piece.begin; i < piece.begin + piece.numel; ++i) {
      const float w = detail::lamb_apply_one(l, scale, master[i], m[i], v[i]);
      master[i] = w;
      if constexpr (!std::is_void_v<TP>) static_cast<TP*>(s.param_out)[i] = TP(w);
    }
  }
}

}  // namespace

void lamb_pieces(std::vector<LambPiece>& out, size_t begin, size_t end, size_t base, uint32_t param) {
  ZEST_CHECK(begin >= base && begin <= end, "lamb_pieces: [{}, {}) from base {} is not a range past the base",
             begin, end, base);
  // Cut at the multiples of kLambPieceMax of the shard, whose start is one.
  for (size_t at = begin; at < end;) {
    const size_t next = std::min(end, (at / kLambPieceMax + 1) * kLambPieceMax);
    out.push_back({static_cast<uint64_t>(at - base), static_cast<uint32_t>(next - at), param});
    at = next;
  }
}

void lamb_moments(const Stream& stream, const OptimizerConfig& config, const ShardBuffers& shard,
                  const StepScalars& scalars, const LambPiece* pieces, size_t count, double* sums) {
  if (count == 0) return;
  check_shard(config, shard, pieces, "lamb_moments");
  ZEST_CHECK(sums != nullptr, "lamb_moments: sums must not be null");
  ZEST_CHECK(scalars.step >= 1, "lamb_moments: step must count from 1, got {}", scalars.step);
  if (stream.device().is_cuda()) {
    detail::lamb_moments_cuda(stream, detail::lamb_step(config, scalars), scalars.decision, shard, pieces, count,
                              sums);
    return;
  }
  StepScalars k = scalars;
  if (!detail::take_host_decision(k)) return;
  const detail::LambStep l = detail::lamb_step(config, k);
  detail::visit_float_dtype(shard.grad_dtype, "Lamb", "gradients", [&](auto grad_type) {
    moments_host<typename decltype(grad_type)::type>(l, shard, pieces, count, sums);
  });
}

void lamb_accumulate(const Stream& stream, const LambPiece* pieces, const double* sums, size_t count,
                     size_t params, int64_t* words) {
  if (params == 0) return;
  ZEST_CHECK((count == 0 || (pieces != nullptr && sums != nullptr)) && words != nullptr,
             "lamb_accumulate: null buffer");
  if (stream.device().is_cuda()) {
    detail::lamb_accumulate_cuda(stream, pieces, sums, count, params, words);
    return;
  }
  const auto normalize = [&] {
    for (size_t w = 0; w < 2 * params; ++w) exact_normalize(words + w * kExactWords);
  };
  normalize();
  constexpr size_t kBetweenNormalizations = size_t{1} << 24;  // 2^31 adds fit (exact_sum.h)
  for (size_t i = 0; i < count; ++i) {
    const size_t p = pieces[i].param;
    ZEST_CHECK(p < params, "lamb_accumulate: piece {} names parameter {} of {}", i, p, params);
    for (size_t k = 0; k < 2; ++k) {
      ZEST_INTERNAL_ASSERT(exact_add(words + (2 * p + k) * kExactWords, sums[2 * i + k]),
                           "piece {}'s sum {} is not a sum of squares of floats", i, sums[2 * i + k]);
    }
    if ((i + 1) % kBetweenNormalizations == 0) normalize();
  }
  normalize();
}

void lamb_trust_ratios(const Stream& stream, const OptimizerConfig& config, const int64_t* words, size_t params,
                       float* ratios) {
  if (params == 0) return;
  ZEST_CHECK(words != nullptr && ratios != nullptr, "lamb_trust_ratios: null buffer");
  if (stream.device().is_cuda()) {
    detail::lamb_trust_ratios_cuda(stream, words, params, config.min_coeff, config.max_coeff, ratios);
    return;
  }
  for (size_t p = 0; p < params; ++p) {
    ratios[p] = detail::lamb_trust_ratio(exact_value(words + 2 * p * kExactWords),
                                         exact_value(words + (2 * p + 1) * kExactWords), config.min_coeff,
                                         config.max_coeff);
  }
}

void lamb_apply(const Stream& stream, const OptimizerConfig& config, const ShardBuffers& shard,
                const StepScalars& scalars, const LambPiece* pieces, size_t count, const float* ratios) {
  if (count == 0) return;
  check_shard(config, shard, pieces, "lamb_apply");
  ZEST_CHECK(ratios != nullptr, "lamb_apply: ratios must not be null");
  ZEST_CHECK(scalars.step >= 1, "lamb_apply: step must count from 1, got {}", scalars.step);
  if (stream.device().is_cuda()) {
    detail::lamb_apply_cuda(stream, detail::lamb_step(config, scalars), scalars.decision, shard, pieces, count,
                            ratios);
    return;
  }
  StepScalars k = scalars;
  if (!detail::take_host_decision(k)) return;
  const detail::LambStep l = detail::lamb_step(config, k);
  detail::visit_shard_types(config, shard, [&](auto, auto param_type, auto, auto) {
    apply_host<typename decltype(param_type)::type>(l, shard, pieces, count, ratios);
  });
}

}  // namespace zest
