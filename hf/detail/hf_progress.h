// Progress of a long Hugging Face import or export: the caller's callback
// after every piece, or else (on rank 0) a log line every few seconds with
// the bytes done, the total and the rate, so that a load of many gigabytes
// is not mistaken for a hang. Internal to hf/.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace zest::detail {

class HfProgress {
 public:
  using Callback = std::function<void(uint64_t done, uint64_t total)>;
  // `what` names the operation in log lines ("import of 'dir'"); `log` false
  // keeps this rank quiet (only rank 0 logs).
  HfProgress(std::string what, Callback callback, bool log);

  void operator()(uint64_t done, uint64_t total);
  // A last line when the operation took long enough to have logged.
  void finish(uint64_t total);
  double seconds() const;

 private:
  std::string what_;
  Callback callback_;
  bool log_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point next_log_;
  bool logged_ = false;
};

}  // namespace zest::detail
