#include "zest/hf/detail/hf_progress.h"

#include "zest/core/logging.h"

namespace zest::detail {
namespace {

// The first line after this long, then one per interval.
constexpr std::chrono::seconds kLogInterval{3};

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

HfProgress::HfProgress(std::string what, Callback callback, bool log)
    : what_(std::move(what)),
      callback_(std::move(callback)),
      log_(log && !callback_),
      start_(std::chrono::steady_clock::now()),
      next_log_(start_ + kLogInterval) {}

double HfProgress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void HfProgress::operator()(uint64_t done, uint64_t total) {
  if (callback_) {
    callback_(done, total);
    return;
  }
  if (!log_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_log_) return;
  next_log_ = now + kLogInterval;
  logged_ = true;
  const double s = seconds();
  ZEST_LOG_INFO("{}: {:.0f} of {:.0f} MiB ({:.0f}%), {:.0f} MiB/s", what_, mib(done), mib(total),
                total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
                s > 0 ? mib(done) / s : 0.0);
}

void HfProgress::finish(uint64_t total) {
  if (!logged_) return;
  const double s = seconds();
  ZEST_LOG_INFO("{}: done, {:.0f} MiB in {:.1f} s ({:.0f} MiB/s)", what_, mib(total), s, s > 0 ? mib(total) / s : 0.0);
}

}  // namespace zest::detail
